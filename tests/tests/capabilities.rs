//! Least privilege (issue 26): once attached, tracer holds only the
//! capabilities docs/attach.md ("Privileges") lists, in every thread.
//! tracer runs as root against a real Python, in the production profile
//! and with `--exact`; while it is attached, every thread's
//! `/proc/TRACER/task/TID/status` is read: the bounding set is the one
//! tracer narrowed itself to at its start, the main thread (and any thread
//! not named below) holds the running set, the census thread its own, and
//! the exit records' listener (`--exe`) and the metrics server
//! (`--listen`) none. The counts stay exact after the drop: N more
//! iterations, exactly N times the body's events more.

use std::collections::BTreeMap;

use serde_json::Value;
use tracer_tests::{Aslr, Body, Exit, TracerRun, Workload, require_root, shared_python};

/// Bounding set, from the start (docs/attach.md): `CAP_DAC_OVERRIDE`,
/// `CAP_DAC_READ_SEARCH`, `CAP_NET_BIND_SERVICE`, `CAP_NET_ADMIN`,
/// `CAP_SYS_PTRACE`, `CAP_SYS_ADMIN`, `CAP_PERFMON`, `CAP_BPF`,
/// `CAP_CHECKPOINT_RESTORE`.
const STARTUP: u64 = 0x01c0_0028_1406;
/// The main thread's once attached: less `CAP_NET_ADMIN` and
/// `CAP_NET_BIND_SERVICE`.
const RUNNING: u64 = 0x01c0_0028_0006;
/// The census thread's: `CAP_DAC_OVERRIDE`, `CAP_DAC_READ_SEARCH`,
/// `CAP_SYS_PTRACE`.
const CENSUS: u64 = 0x0008_0006;

/// One thread's name and sets.
#[derive(Debug)]
struct Thread {
    name: String,
    sets: BTreeMap<&'static str, u64>,
}

const FIELDS: [&str; 5] = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"];

/// Every thread of `pid`, read from /proc.
fn threads(pid: u32) -> Vec<Thread> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task")).expect("tracer's threads") {
        let Ok(status) = std::fs::read_to_string(entry.expect("a thread").path().join("status")) else {
            continue; // It ended meanwhile.
        };
        let field = |name: &str| {
            status.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).map(str::trim).map(str::to_owned)
        };
        let name = field("Name").expect("Name");
        let sets = FIELDS
            .into_iter()
            .map(|f| (f, u64::from_str_radix(&field(f).expect(f), 16).unwrap_or_else(|e| panic!("{f}: {e}"))))
            .collect();
        out.push(Thread { name, sets });
    }
    out
}

/// What a thread named `name` holds once narrowed.
fn held(name: &str) -> u64 {
    match name {
        "census" => CENSUS,
        "exits" | "metrics" => 0,
        _ => RUNNING,
    }
}

/// Whether `t`'s sets are exactly the documented ones.
fn conforms(t: &Thread) -> bool {
    let held = held(&t.name);
    let want: BTreeMap<&str, u64> =
        [("CapInh", 0), ("CapPrm", held), ("CapEff", held), ("CapBnd", STARTUP), ("CapAmb", 0)].into();
    t.sets == want
}

/// Waits (up to a minute) until every thread of tracer `pid` holds
/// exactly the documented sets and `names` are among them: a thread that
/// narrows itself does so once its setup is done (the census thread once
/// it has read the target's files), and the cost calibration's thread,
/// which loads BPF of its own, ends some time after the attach.
fn check(pid: u32, names: &[&str]) {
    let mut last = Vec::new();
    for _ in 0..600 {
        last = threads(pid);
        let all_there = names.iter().all(|n| last.iter().any(|t| t.name == *n));
        if all_there && last.iter().all(|t| t.name != "calibrate" && conforms(t)) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let off: Vec<&Thread> = last.iter().filter(|t| !conforms(t)).collect();
    panic!("tracer {pid}'s threads, after a minute (wanted {names:?} among them); not as documented: {off:#x?}");
}

/// `n` iterations of the objects body traced with `args`, the threads
/// checked while attached (`names` among them): the summary.
fn traced(n: u64, args: &[&str], names: &[&str]) -> Value {
    let python = shared_python();
    let mut workload = Workload::once(&python, n, Body::Objects, Exit::Immediate, Aslr::On);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid().to_string();
    let mut all = vec!["--pid", pid.as_str(), "--interval", "1"];
    all.extend_from_slice(args);
    let (tracer, _attached) = TracerRun::attach_json_as(&all);
    let tracer_pid = tracer.child.id();
    check(tracer_pid, names);
    workload.go();
    workload.finish();
    let summary = tracer.summary();
    assert_eq!(summary["end"], "target-exit", "{summary}");
    summary
}

fn calls(summary: &Value, probe: &str) -> u64 {
    summary["probes"][probe]["calls"].as_u64().unwrap_or_else(|| panic!("{probe}: {}", summary["probes"]))
}

/// `--exact`: every thread holds what the docs list, and N against 2N
/// iterations of the objects body count exactly 4N more new references
/// and N more `PyObject_Malloc` calls (`tests/tests/exact_counts.rs` pins
/// the body's).
#[test]
fn exact_tracing_keeps_only_the_documented_capabilities_and_counts_exactly() {
    require_root();
    let n = 1000;
    let one = traced(n, &["--exact"], &[]);
    let two = traced(2 * n, &["--exact"], &[]);
    for s in [&one, &two] {
        for (name, value) in tracer_tests::misses(s) {
            assert_eq!(value, 0, "{name}: {}", s["stats"]);
        }
    }
    assert_eq!(calls(&two, "_Py_NewReference") - calls(&one, "_Py_NewReference"), 4 * n);
    assert_eq!(calls(&two, "PyObject_Malloc") - calls(&one, "PyObject_Malloc"), n);
}

/// The production profile: its windows attach and detach uprobes after
/// the drop, its census thread reads the heap with its own narrower set,
/// and the metrics server (`--listen`) holds nothing; the run ends at
/// `--duration` with no miss. (Against a target that
/// exits, the profile's last reading of the collector's statistics from
/// memory may find it gone, `gc_memory_failed`: not the drop's doing.)
#[test]
fn the_production_profile_keeps_only_the_documented_capabilities() {
    require_root();
    let python = shared_python();
    let mut workload = Workload::serve(&python);
    let args = ["--interval", "1", "--duration", "4", "--listen", "127.0.0.1:0"];
    let (tracer, attached) = TracerRun::profile_json(workload.pid(), &args);
    assert_eq!(attached["mode"], "profile", "{attached}");
    check(tracer.child.id(), &["census", "metrics"]);
    workload.ping();
    let summary = tracer.summary();
    assert_eq!(summary["end"], "duration", "{summary}");
    assert!(tracer_tests::misses(&summary).all(|(_, v)| v == 0), "{}", summary["stats"]);
    workload.ping();
}

/// `--exe`: the exit records' listener, registered before the drop,
/// holds nothing once it listens.
#[test]
fn the_exit_listener_holds_no_capability() {
    require_root();
    let python = shared_python();
    let mut workload = Workload::once(&python, 1000, Body::Objects, Exit::Immediate, Aslr::On);
    workload.wait_blocked_on_stdin();
    let exe = python.to_str().expect("a UTF-8 path");
    let (tracer, _attached) = TracerRun::attach_json_with(&["--exe", exe, "--interval", "3600"]);
    check(tracer.child.id(), &["exits"]);
    workload.go();
    workload.finish();
    tracer.signal(libc::SIGINT);
    let summary = tracer.summary();
    assert_eq!(summary["end"], "signal", "{summary}");
}
