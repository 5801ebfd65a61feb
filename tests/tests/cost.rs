//! What tracing costs, shown while it runs: every interval (once the cost
//! of a hit is calibrated) and the summary carry tracer's estimated cost as
//! a share of the target's CPU time, and a cost past 10% is warned of, in
//! a note and in the table.

use std::process::{Command, Stdio};

use serde_json::Value;
use tracer_tests::{TracerRun, Workload, attached_probes, require_root, shared_python, tracer_bin};

/// Intervals to wait for the first estimate at 0.5 s each: calibration
/// takes about half a second, more on a loaded machine.
const INTERVALS: usize = 60;

fn fraction(cost: &Value) -> f64 {
    cost["overhead_fraction"].as_f64().unwrap_or_else(|| panic!("no overhead_fraction: {cost}"))
}

/// Checks a cost object's sanity: a busy target's hits cost it some share
/// of its CPU time, and no more than all of it.
fn check_cost(cost: &Value) {
    assert_eq!(cost["estimate"], true, "{cost}");
    let f = fraction(cost);
    assert!(f > 0.0 && f <= 1.0, "overhead fraction {f}: {cost}");
    assert!(cost["tracer_cpu_s"].as_f64().expect("tracer_cpu_s") > 0.0, "{cost}");
    assert!(cost["target_cpu_s"].as_f64().expect("target_cpu_s") > 0.0, "{cost}");
    assert!(cost["hits"].as_u64().expect("hits") > 0, "{cost}");
    let costs = &cost["hit_cost_ns"];
    let (stepped, emulated) = (costs["single_stepped"].as_f64(), costs["emulated"].as_f64());
    assert!(emulated.is_some_and(|e| e > 0.0) && stepped.is_some_and(|s| s > 0.0), "calibrated costs: {costs}");
}

/// The interval lines up to the first with a cost, checking that those
/// before it have no cost at all (never a zero for one not yet known).
fn until_costed(tracer: &TracerRun) -> Value {
    for _ in 0..INTERVALS {
        let line = tracer.stdout.next_line("an interval line").expect("tracer stopped early");
        let event: Value = serde_json::from_str(&line).expect("JSON");
        assert_ne!(event["type"], "summary", "{line}");
        if event["type"] != "interval" {
            continue;
        }
        if event.get("cost").is_some() {
            return event;
        }
    }
    panic!("no interval carried a cost in {INTERVALS} intervals");
}

#[test]
fn a_busy_target_sees_the_estimated_cost_in_each_interval_and_the_summary() {
    require_root();
    let mut workload = Workload::serve(&shared_python());
    let pid = workload.pid();
    let (tracer, attached) = TracerRun::attach_json(pid, &["--interval", "0.5"]);
    // Every probe's sites, by kind.
    let sites = attached["sites"].as_object().expect("sites");
    for name in attached_probes(&attached) {
        let kinds = &sites[&name];
        let total = kinds["emulated"].as_u64().expect("emulated") + kinds["single_stepped"].as_u64().expect("stepped");
        assert!(total >= 1, "{name}: {kinds}");
    }
    let first = until_costed(&tracer);
    check_cost(&first["cost"]);
    // Each later interval has its own.
    let next = tracer.stdout.next_line("the next interval").expect("an interval");
    let next: Value = serde_json::from_str(&next).expect("JSON");
    if next["type"] == "interval" {
        check_cost(&next["cost"]);
    }
    workload.ping();
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "{status}: {stderr}");
    let summary = lines.last().expect("summary");
    assert_eq!(summary["type"], "summary");
    check_cost(&summary["cost"]);
    // Over the whole run: at least what the first costed interval saw.
    assert!(summary["cost"]["target_cpu_s"].as_f64() >= first["cost"]["target_cpu_s"].as_f64(), "{summary} {first}");
    workload.ping();
}

#[test]
fn single_stepped_probes_on_a_busy_target_warn_of_a_high_cost() {
    require_root();
    let mut workload = Workload::serve(&shared_python());
    let pid = workload.pid();
    // Every probe on its first instruction, which the kernel single-steps
    // here, on a loop that makes lists and bytearrays as fast as it can.
    let (tracer, _) = TracerRun::attach_json(pid, &["--placement", "entry", "--interval", "0.5"]);
    let costed = until_costed(&tracer);
    assert!(fraction(&costed["cost"]) > 0.1, "{costed}");
    // The warning follows that interval.
    let note = tracer.stdout.next_line("the high cost note").expect("a note");
    let note: Value = serde_json::from_str(&note).expect("JSON");
    assert_eq!(note["type"], "note", "{note}");
    assert_eq!(note["code"], "high_cost", "{note}");
    assert_eq!(note["level"], "warning", "{note}");
    let message = note["message"].as_str().expect("message");
    assert!(message.starts_with("tracing costs the target an estimated "), "{message}");
    assert!(message.contains("--budget PERCENT"), "{message}");
    workload.ping();
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "{status}: {stderr}");
    // Once only.
    assert!(!lines.iter().any(|l| l["code"] == "high_cost"), "told twice: {lines:?}");
    assert_eq!(stderr.matches("tracer: warning: tracing costs the target").count(), 1, "{stderr}");
    assert!(lines.last().expect("summary")["cost"]["overhead_fraction"].as_f64() > Some(0.1));

    // The table says it in every block's title, and warns under it.
    let out = Command::new(tracer_bin())
        .args(["attach", "--pid", &pid.to_string(), "--placement", "entry", "--interval", "0.5", "--duration", "3"])
        .stdin(Stdio::null())
        .output()
        .expect("run tracer");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let summary = stdout.split("\n\n").find(|b| b.starts_with("summary after")).expect("a summary block");
    let mut lines = summary.lines();
    let title = lines.next().expect("title");
    assert!(title.contains("  cost ≈") && title.ends_with(" of target CPU (estimate)"), "{title}");
    let warning = lines.next().expect("a warning line");
    assert!(warning.starts_with("  WARNING: tracing costs the target an estimated "), "{warning}");
    assert!(warning.contains("--budget PERCENT"), "{warning}");
    workload.ping();
}
