//! `--bpf-log`: what the BPF programs log reaches the user, as notes on
//! stderr and as `note` events in the JSON; without it, nothing is logged.

use tracer_tests::{TracerRun, Workload, require_root, shared_python};

/// The first hit of each probe by the target logs a line, which arrives.
#[test]
fn the_programs_log_arrives_as_notes() {
    require_root();
    let mut workload = Workload::serve(&shared_python());
    let pid = workload.pid();
    let (tracer, _) = TracerRun::attach_json(pid, &["--bpf-log", "--probes", "PyObject_Malloc", "--interval", "0.1"]);
    let expected = format!("first hit of probe slot 0 by PID {pid} on this CPU");
    // The workload allocates all the time; the line comes with an interval.
    loop {
        let line = tracer.stdout.next_line("a note line").expect("tracer stopped before any note");
        let event: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        if event["type"] == "note" {
            assert_eq!(event["code"], "bpf_log", "{line}");
            assert_eq!(event["level"], "note", "{line}");
            assert_eq!(event["message"], expected.as_str(), "{line}");
            break;
        }
    }
    workload.ping();
    tracer.signal(libc::SIGINT);
    let (status, _, stderr) = tracer.finish();
    assert!(status.success(), "{stderr}");
    assert!(stderr.starts_with(&format!("tracer: note: {expected}\n")), "{stderr}");
}

/// Without `--bpf-log`, no program logs anything: stderr holds only the
/// detach line.
#[test]
fn nothing_is_logged_without_the_flag() {
    require_root();
    let mut workload = Workload::serve(&shared_python());
    let pid = workload.pid();
    let (tracer, _) =
        TracerRun::attach_json(pid, &["--probes", "PyObject_Malloc", "--interval", "0.1", "--duration", "0.5"]);
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "{stderr}");
    assert_eq!(tracer_tests::without_cost_warning(&stderr), format!("tracer: detached from PID {pid} (duration)\n"));
    assert!(lines.iter().all(|l| l["type"] != "note" || l["code"] == "high_cost"), "{lines:?}");
    workload.ping();
}
