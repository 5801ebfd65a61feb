//! The production profile, `tracer attach`'s default: the header's mode
//! and estimated cost, exact-only flags switching to exact tracing, GC
//! from memory against `gc.get_stats()` on every build here, rates by duty
//! cycle against an exact count, and bad input. (`--exact`'s counts are
//! the other suites': they all pass it.)

use std::{path::PathBuf, process::Command, time::Duration};

use serde_json::Value;
use tracer_tests::{
    STATIC_PYTHON, TracerRun, Workload, forky_root, require_root, run_tracer, shared_python, tracer_bin,
};

fn number(v: &Value, what: &str) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{what} is not a number: {v}"))
}

fn pyenv(version: &str) -> PathBuf {
    let python = PathBuf::from("/root/.pyenv/versions").join(version).join("bin/python3");
    assert!(python.is_file(), "{} is missing: pyenv's {version} must be installed", python.display());
    python
}

/// `tracer attach ARGS` (a table) on `pid` for a second; its stdout.
fn table(pid: u32, extra: &[&str]) -> String {
    let pid = pid.to_string();
    let out = Command::new(tracer_bin())
        .args(["attach", "--pid", &pid, "--duration", "1"])
        .args(extra)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run tracer");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn the_profile_is_the_default_and_says_so_first() {
    require_root();
    let mut workload = Workload::serve(&shared_python());
    let pid = workload.pid();
    let (tracer, attached) = TracerRun::profile_json(pid, &["--interval", "0.3"]);
    assert_eq!(attached["mode"], "profile", "{attached}");
    assert!(attached.get("exact_because").is_none(), "{attached}");
    let estimate = &attached["estimated_cost"];
    assert_eq!(estimate["budget_fraction"], 0.01, "{estimate}");
    let fraction = number(&estimate["fraction"], "fraction");
    // The windows aim at 80% of the budget; a quiet target costs less.
    assert!((0.0..=0.008 + 1e-12).contains(&fraction), "{estimate}");
    assert!(number(&estimate["exact_fraction"], "exact") >= fraction, "{estimate}");
    assert!(number(&estimate["window_s"], "window") > 0.0, "{estimate}");
    let interval: Value = serde_json::from_str(&tracer.stdout.next_line("an interval").expect("an interval")).unwrap();
    assert_eq!(interval["type"], "interval");
    let profile = &interval["profile"];
    assert_eq!(profile["budget_percent"], 1.0, "{profile}");
    let mut sources: Vec<&str> = profile["sources"].as_object().expect("sources").keys().map(String::as_str).collect();
    sources.sort_unstable();
    assert_eq!(sources, ["gc_memory", "gc_probes", "rates"], "{profile}");
    // The statistics, 72 bytes a read: once at the attach, once an interval.
    let read = profile["sources"]["gc_memory"]["bytes_read"].as_u64().expect("bytes_read");
    assert!(read > 0 && read.is_multiple_of(72), "{profile}");
    assert_eq!(interval["gc"]["source"], "memory", "{}", interval["gc"]);
    assert_eq!(interval["budget"]["estimates"], true);
    tracer.signal(libc::SIGINT);
    let summary = tracer.summary();
    assert_eq!(summary["stats"]["gc_memory_rejected"], 0, "{}", summary["stats"]);
    workload.ping();

    let text = table(pid, &[]);
    let first = text.lines().next().expect("a first line");
    assert!(first.starts_with("tracer: production profile: estimated cost "), "{first}");
    assert!(first.contains(" of the target's time, budget 1.00%; exact tracing would cost "), "{first}");
    assert!(text.contains("\n  profile cost ≈"), "{text}");
    workload.ping();
}

#[test]
fn exact_only_flags_switch_to_exact_and_say_so() {
    require_root();
    let mut workload = Workload::serve(&shared_python());
    let pid = workload.pid();
    for (flags, because) in [(&["--exact"][..], None), (&["--types"], Some("--types")), (&["--returns"], Some("--returns"))]
    {
        let mut args = flags.to_vec();
        args.extend(["--duration", "0.5"]);
        let (tracer, attached) = TracerRun::profile_json(pid, &args);
        assert_eq!(attached["mode"], "exact", "{flags:?}: {attached}");
        assert_eq!(attached["exact_because"].as_str(), because, "{flags:?}: {attached}");
        assert!(attached["estimated_cost"].get("budget_fraction").is_none(), "{attached}");
        number(&attached["estimated_cost"]["fraction"], "fraction");
        let summary = tracer.summary();
        assert!(summary.get("profile").is_none() && summary.get("budget").is_none(), "{flags:?}");
        assert_ne!(summary["gc"]["source"], "memory", "{flags:?}");
        workload.ping();
    }
    let first = table(pid, &["--exact"]);
    let first = first.lines().next().expect("a line");
    assert!(first.starts_with("tracer: exact tracing (--exact): estimated cost "), "{first}");
    let first = table(pid, &["--types"]);
    let first = first.lines().next().expect("a line");
    assert!(
        first.starts_with("tracer: exact tracing (chosen by --types, which only exact tracing serves): estimated cost "),
        "{first}"
    );
    workload.ping();
}

/// The profile's collections per generation on `python` (inside `root`
/// where given) equal what `gc.get_stats()` changed by in the target.
fn gc_matches_get_stats(root: Option<&std::path::Path>, python: &str) {
    require_root();
    let (a, b, c) = (7, 3, 2);
    let mut workload = Workload::script(root, python, "gc_stats.py", &[&a.to_string(), &b.to_string(), &c.to_string()]);
    let pid = workload.pid();
    let (tracer, attached) = TracerRun::profile_json(pid, &["--interval", "0.2"]);
    assert_eq!(attached["mode"], "profile");
    workload.go();
    let stats = workload.next_line("the stats").expect("stats");
    let stats: Vec<Vec<u64>> = stats
        .strip_prefix("stats ")
        .expect("stats line")
        .split(' ')
        .map(|g| g.split(',').map(|n| n.parse().expect("a count")).collect())
        .collect();
    assert_eq!(stats.iter().map(|g| g[0]).collect::<Vec<_>>(), [a, b, c], "{python}: the workload's own count");
    // Read by an interval after the collections.
    std::thread::sleep(Duration::from_millis(500));
    tracer.signal(libc::SIGINT);
    let summary = tracer.summary();
    let gc = &summary["gc"];
    assert_eq!(gc["source"], "memory", "{python}: {gc}");
    let got: Vec<Vec<u64>> = gc["generations"]
        .as_array()
        .expect("generations")
        .iter()
        .map(|g| {
            let n = |k: &str| g[k].as_u64().unwrap_or_else(|| panic!("{k}: {g}"));
            vec![n("collections"), n("collected") - n("uncollectable"), n("uncollectable")]
        })
        .collect();
    assert_eq!(got, stats, "{python}: GC from memory against gc.get_stats(): {gc}");
    assert_eq!(summary["stats"]["gc_memory_rejected"], 0);
    drop(workload);
}

#[test]
fn gc_from_memory_pyenv_311() {
    gc_matches_get_stats(None, pyenv("3.11.7").to_str().unwrap());
}

#[test]
fn gc_from_memory_pyenv_312() {
    gc_matches_get_stats(None, pyenv("3.12.1").to_str().unwrap());
}

#[test]
fn gc_from_memory_pyenv_313() {
    gc_matches_get_stats(None, pyenv("3.13.0").to_str().unwrap());
}

#[test]
fn gc_from_memory_debian_311_with_marker_durations() {
    gc_matches_get_stats(None, STATIC_PYTHON);
}

#[test]
fn gc_from_memory_forky_313() {
    gc_matches_get_stats(Some(&forky_root()), "/usr/bin/python3.13");
}

#[test]
fn gc_from_memory_forky_314() {
    gc_matches_get_stats(Some(&forky_root()), "/usr/bin/python3.14");
}

/// The rate of new references of a paced loop, estimated by the profile's
/// windows, within 5% of the rate an exact count of the same loop gives.
#[test]
fn rates_within_five_percent_of_an_exact_count() {
    require_root();
    let python = shared_python();
    let workload = Workload::script(None, python.to_str().unwrap(), "paced.py", &["200"]);
    let pid = workload.pid();
    let probes = ["--probes", "_Py_NewReference"];
    let (tracer, _) = TracerRun::attach_json(pid, &[&probes[..], &["--duration", "4", "--interval", "3600"]].concat());
    let exact = tracer.summary();
    #[allow(clippy::cast_precision_loss, reason = "a count of calls")]
    let calls = exact["probes"]["_Py_NewReference"]["calls"].as_u64().expect("calls") as f64;
    let exact_rate = calls / number(&exact["elapsed_s"], "elapsed");
    let (tracer, attached) =
        TracerRun::profile_json(pid, &[&probes[..], &["--duration", "12", "--interval", "3600"]].concat());
    assert_eq!(attached["mode"], "profile");
    let profile = tracer.summary();
    let estimate = &profile["probes"]["_Py_NewReference"]["estimate"];
    let rate = number(&estimate["calls_per_s"], "calls_per_s");
    assert!(profile["budget"]["windows"].as_u64().expect("windows") >= 10, "{}", profile["budget"]);
    assert!((rate - exact_rate).abs() <= 0.05 * exact_rate, "estimated {rate}/s against {exact_rate}/s exactly: {estimate}");
    drop(workload);
}

#[test]
fn bad_input() {
    for (args, error) in [
        (
            &["attach", "--pid", "1", "--exact", "--budget", "0"][..],
            "--budget must be a percentage of the target's CPU time above 0 and at most 100 (got 0); e.g. --budget 1",
        ),
        (
            &["attach", "--pid", "1", "--budget", "101"],
            "--budget must be a percentage of the target's CPU time above 0 and at most 100 (got 101); e.g. --budget 1",
        ),
        (
            &["attach", "--pid", "1", "--types", "--budget", "1"],
            "--budget cannot be combined with --types: type counts are not estimated from windows; use one or the other",
        ),
    ] {
        let (code, stdout, stderr) = run_tracer(args);
        assert_eq!((code, stdout.as_str(), stderr), (Some(2), "", format!("tracer: error: {error}\n")), "{args:?}");
    }
}
