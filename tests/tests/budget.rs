//! `--budget`: tracer traces in windows and detaches between them, so the
//! target's code holds no breakpoint during a gap; rates come out marked as
//! estimates; and nothing is left behind at the end.

use std::{
    thread::sleep,
    time::{Duration, Instant},
};

use serde_json::Value;
use tracer_tests::{TracerRun, Workload, attached_probes, probe_sites, read_sites, require_root, shared_python};

fn as_f64(v: &Value, what: &str) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{what} is not a number: {v}"))
}

fn check(link_kind: &str) {
    require_root();
    let mut workload = Workload::serve(&shared_python());
    let pid = workload.pid();
    let (tracer, attached) = TracerRun::attach_json(pid, &["--budget", "1", "--interval", "0.5", "--links", link_kind]);
    assert_eq!(attached["links"], link_kind);
    let image = attached["python"]["image"].as_str().expect("image");
    let symbols = attached_probes(&attached);
    assert_eq!(symbols.len(), 14);
    let sites = probe_sites(pid, image, &symbols);

    // The serve loop hits the single-stepped probes thousands of times a
    // second, so its first window costs far more than 1% of itself: tracer
    // must detach every probe and then stay detached for a long gap (many
    // seconds, while this test runs).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let code = read_sites(pid, &sites);
        if sites.iter().zip(&code).all(|(site, bytes)| *bytes == site.file_bytes) {
            break;
        }
        assert!(Instant::now() < deadline, "tracer --budget 1 never detached from the busy target");
        sleep(Duration::from_millis(20));
    }
    // Detached, yet still reporting: an interval line arrives in the gap.
    let during_gap = tracer.stdout.next_line("an interval line during the gap").expect("an interval line");
    let during_gap: Value = serde_json::from_str(&during_gap).expect("JSON");
    assert_eq!(during_gap["type"], "interval");
    assert_eq!(during_gap["budget"]["estimates"], true);
    workload.ping();

    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "{status}: {stderr}");
    // An interval may cost the target more than the budget (with perf-event
    // uprobes, the first window lasts while they detach one by one), and
    // tracer's cost estimate says so.
    let rest: Vec<&str> =
        stderr.lines().filter(|l| !l.starts_with("tracer: warning: tracing costs the target")).collect();
    assert_eq!(rest, [format!("tracer: detached from PID {pid} (signal)")], "{stderr}");
    let summary = lines.last().expect("summary");
    assert_eq!(summary["type"], "summary");
    for (name, value) in tracer_tests::misses(summary) {
        assert_eq!(value, 0, "BPF stat {name} is non-zero: {summary}");
    }
    let budget = &summary["budget"];
    assert_eq!(budget["estimates"], true);
    assert_eq!(budget["percent"], 1.0);
    assert!(budget["windows"].as_u64().expect("windows") >= 1, "{budget}");
    let fraction = as_f64(&budget["traced_fraction"], "traced_fraction");
    assert!(fraction > 0.0 && fraction < 1.0, "traced fraction {fraction}");
    let costs = &budget["hit_cost_ns"];
    let (stepped, emulated) = (as_f64(&costs["single_stepped"], "cost"), as_f64(&costs["emulated"], "cost"));
    assert!(emulated > 0.0 && stepped > emulated, "calibrated costs: {costs}");
    // A probe that counted calls has a positive rate: counts over its own
    // live time. One that counted none is no zero: no estimate from the
    // one window it was live in (with one window in all, none), and from
    // two a zero bounded by the time traced.
    let windows = budget["windows"].as_u64().expect("windows");
    for name in &symbols {
        let p = &summary["probes"][name];
        let calls = p["calls"].as_u64().expect("calls");
        if calls > 0 {
            assert!(as_f64(&p["estimate"]["calls_per_s"], "calls_per_s") > 0.0, "{name}: {p}");
        } else if windows < 2 || p.get("estimate").is_none() {
            assert!(p.get("estimate").is_none(), "{name}: {p}");
        } else {
            assert_eq!(p["estimate"]["calls_per_s"], 0.0, "{name}: {p}");
            let ci = &p["estimate"]["calls_per_s_ci95"];
            assert_eq!(ci[0], 0.0, "{name}: {p}");
            assert!(as_f64(&ci[1], "upper end") > 0.0, "{name}: {p}");
        }
    }
    // The windows counted calls (which probe, depends on the order the
    // window's probes went live and came down in: with perf-event uprobes
    // the hottest comes down first, and its live time may be too short
    // for a call).
    let counted: u64 = symbols.iter().map(|name| summary["probes"][name]["calls"].as_u64().expect("calls")).sum();
    assert!(counted > 0, "{summary}");

    // Nothing left behind, and the target runs on.
    let code = read_sites(pid, &sites);
    for (site, bytes) in sites.iter().zip(&code) {
        assert_eq!(*bytes, site.file_bytes, "{} differs from the ELF after tracer exited", site.symbol);
    }
    workload.ping();
}

/// Windows through uprobe-multi links (the default): every breakpoint
/// leaves at once.
#[test]
fn budget_detaches_between_windows_and_reports_estimates() {
    check("multi");
}

/// The fallback for kernels without uprobe-multi links: perf-event uprobes,
/// detached one by one, each with its own live time.
#[test]
fn budget_with_perf_uprobes_detaches_between_windows() {
    check("perf");
}
