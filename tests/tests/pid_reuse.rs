//! `tracer attach --exe` when a PID comes back: a process that exits is
//! read one last time and leaves the kernel maps, so the next process the
//! kernel gives the same PID starts from zero. In a test binary of its own:
//! it makes the kernel hand out a PID again, which must not happen to
//! another test's processes.

use std::collections::HashMap;

use tracer_tests::{Aslr, Body, Exit, TracerRun, Workload, counts, per_pid, require_root, shared_python};

type Counts = HashMap<String, (u64, u64)>;

/// Reads tracer's JSON lines until an interval lists `count` exited
/// processes with PID `pid`.
fn wait_for_exits(tracer: &TracerRun, pid: u32, count: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "tracer did not report {count} exited processes with PID {pid} within 10 s"
        );
        let line = tracer.stdout.next_line("an interval line").expect("tracer stopped before the process exited");
        let event: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        let exited = event["exited"].as_array().map_or(0, |e| e.iter().filter(|p| p["pid"] == pid).count());
        if event["type"] == "interval" && exited >= count {
            assert_eq!(exited, count, "{line}");
            return;
        }
    }
}

/// A process that exits under `--exe` has its counts read one last time
/// and its entries removed from the kernel maps, so a later process given
/// the same PID starts from zero. A runs N iterations of the ctypes body;
/// once tracer reports it exited, B runs 2N at the same PID, and C 2N at
/// another. Without ASLR and with one hash seed, B and C allocate alike, so
/// B's counts must equal C's exactly, and the PID's total is A's plus B's.
#[test]
fn a_pid_used_again_starts_from_zero() {
    const N: u64 = 100;
    require_root();
    let python = shared_python();
    let exe = python.to_str().expect("utf-8 path");
    let (tracer, _) = TracerRun::attach_json_with(&["--exe", exe, "--interval", "0.1", "--probes", "alloc"]);
    let finish = |mut w: Workload| {
        let pid = w.pid();
        w.go();
        w.finish();
        pid
    };
    let a = finish(Workload::once(&python, N, Body::Api, Exit::Immediate, Aslr::Off));
    wait_for_exits(&tracer, a, 1);
    let b = finish(Workload::once_with_pid(&python, 2 * N, Body::Api, Exit::Immediate, Aslr::Off, a));
    assert_eq!(a, b);
    wait_for_exits(&tracer, a, 2);
    let c = finish(Workload::once(&python, 2 * N, Body::Api, Exit::Immediate, Aslr::Off));
    assert_ne!(c, a);
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "{stderr}");
    let summary = lines.last().expect("summary");
    let exits: Vec<Counts> = summary["exited"]
        .as_array()
        .expect("exited")
        .iter()
        .filter(|e| e["pid"] == a)
        .map(|e| counts(&serde_json::json!({ "probes": e["probes"] })))
        .collect();
    assert_eq!(exits.len(), 2, "{summary}");
    let by_pid = per_pid(summary);
    let c_counts = &by_pid[&c];
    for (name, b_counts) in &exits[1] {
        assert_eq!(b_counts, &c_counts[name], "{name}: the second process at PID {a} did not start from zero");
        let a_counts = exits[0][name];
        assert_eq!(by_pid[&a][name], (a_counts.0 + b_counts.0, a_counts.1 + b_counts.1), "{name}");
    }
    assert_eq!(summary["stats"]["map_full"], 0);
}
