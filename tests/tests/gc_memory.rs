//! The production profile's GC from memory: collections per generation
//! against `gc.get_stats()` on every build here, and the collections the
//! markers counted after the statistics' last reading (a target that
//! collects and exits).

use std::time::Duration;

use serde_json::Value;
use tracer_tests::{STATIC_PYTHON, TracerRun, Workload, forky_root, pyenv, require_root};

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
    let stats = gc_stats(&mut workload);
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

/// `gc_stats.py`'s line of `gc.get_stats()`: per generation, its
/// collections, collected and uncollectable.
fn gc_stats(workload: &mut Workload) -> Vec<Vec<u64>> {
    let stats = workload.next_line("the stats").expect("stats");
    stats
        .strip_prefix("stats ")
        .expect("stats line")
        .split(' ')
        .map(|g| g.split(',').map(|n| n.parse().expect("a count")).collect())
        .collect()
}

/// A target that collects and exits before tracer reads its statistics
/// again: the markers saw every collection, and the summary counts them.
/// It showed `gen 0: 0 in 101 µs` (no collection, yet their time) for a
/// process that made 50 collections and exited, where the statistics'
/// last reading came before them.
#[test]
fn collections_just_before_the_exit_are_the_markers_count() {
    require_root();
    let (a, b, c) = (7, 3, 2);
    let args = [a.to_string(), b.to_string(), c.to_string(), "exit".to_owned()];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut workload = Workload::script(None, STATIC_PYTHON, "gc_stats.py", &args);
    let pid = workload.pid();
    // No interval before the exit: only the attach's reading and the end's.
    let (tracer, _) = TracerRun::profile_json(pid, &["--interval", "30"]);
    workload.go();
    let stats = gc_stats(&mut workload);
    let summary = tracer.summary();
    assert_eq!(summary["end"], "target-exit", "{}", summary["end"]);
    let gc = &summary["gc"];
    assert_eq!((gc["source"].as_str(), gc["durations"].as_str()), (Some("memory"), Some("markers")), "{gc}");
    let got: Vec<Vec<u64>> = gc["generations"]
        .as_array()
        .expect("generations")
        .iter()
        .map(|g| {
            let n = |k: &str| g[k].as_u64().unwrap_or_else(|| panic!("{k}: {g}"));
            // Which were uncollectable, the markers do not say.
            assert_eq!(g["uncollectable"], Value::Null, "{g}");
            vec![n("collections"), n("collected")]
        })
        .collect();
    let stats: Vec<Vec<u64>> = stats.iter().map(|g| vec![g[0], g[1] + g[2]]).collect();
    assert_eq!(got, stats, "the collections before the exit against gc.get_stats(): {gc}");
    let why = gc["probes_past_memory"].as_str().unwrap_or_else(|| panic!("not said: {gc}"));
    assert!(
        why.starts_with(&format!(
            "the GC probes counted collections after the collector's statistics were last read (gen 0: {a} more, gen 1: {b} more, gen 2: {c} more)"
        )),
        "{why}"
    );
    // The reading at the end failed (the process was gone), and the
    // markers counted what it would have read: no failure, but covered.
    assert_eq!(summary["stats"]["gc_memory_failed"], 0, "{}", summary["stats"]);
    assert_eq!(summary["stats"]["gc_memory_failed_covered"], 1, "{}", summary["stats"]);
    assert_eq!((&gc["last_read_s"], &gc["unread"]), (&Value::Null, &Value::Null), "{gc}");
    // This kernel reads tracer's maps in batches.
    assert_eq!(summary["stats"]["map_batch_unsupported"], 0, "{}", summary["stats"]);
    drop(workload);
}

/// The same on a build without GC markers (pyenv's): no probe counts the
/// collections after the statistics' last reading, so the summary says
/// they are not counted, and from when, rather than a silent zero.
#[test]
fn collections_after_the_last_reading_without_markers_are_said_not_counted() {
    require_root();
    let args = ["7", "3", "2", "exit"];
    let mut workload = Workload::script(None, pyenv("3.11.7").to_str().unwrap(), "gc_stats.py", &args);
    let pid = workload.pid();
    // No interval before the exit: only the attach's reading and the end's.
    let (tracer, _) = TracerRun::profile_json(pid, &["--interval", "30"]);
    workload.go();
    let stats = gc_stats(&mut workload);
    assert_eq!(stats.iter().map(|g| g[0]).collect::<Vec<_>>(), [7, 3, 2], "the workload's own count");
    let summary = tracer.summary();
    assert_eq!(summary["end"], "target-exit", "{}", summary["end"]);
    let gc = &summary["gc"];
    assert_eq!((gc["source"].as_str(), gc["durations"].as_str()), (Some("memory"), Some("none")), "{gc}");
    // The attach's reading came before every collection.
    let collections: Vec<u64> = gc["generations"]
        .as_array()
        .expect("generations")
        .iter()
        .map(|g| g["collections"].as_u64().expect("a count"))
        .collect();
    assert_eq!(collections, [0, 0, 0], "{gc}");
    let at = gc["last_read_s"].as_f64().unwrap_or_else(|| panic!("not said: {gc}"));
    assert!(at < summary["elapsed_s"].as_f64().expect("elapsed"), "{at}: {summary}");
    let why = gc["unread"].as_str().unwrap_or_else(|| panic!("not said: {gc}"));
    assert!(
        why.starts_with(&format!(
            "collections after the statistics' last reading, at {at:.1} s, are NOT counted: the reading since failed"
        )),
        "{why}"
    );
    assert_eq!(summary["stats"]["gc_memory_failed"], 1, "{}", summary["stats"]);
    assert_eq!(summary["stats"]["gc_memory_failed_covered"], 0, "{}", summary["stats"]);
    drop(workload);
}

#[test]
fn gc_from_memory_pyenv_311() {
    gc_matches_get_stats(None, pyenv("3.11.7").to_str().unwrap());
}

#[test]
fn gc_from_memory_pyenv_39() {
    gc_matches_get_stats(None, pyenv("3.9.18").to_str().unwrap());
}

#[test]
fn gc_from_memory_pyenv_310() {
    gc_matches_get_stats(None, pyenv("3.10.13").to_str().unwrap());
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
