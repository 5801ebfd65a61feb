//! A `--pid` target that is stopped (SIGSTOP: state T in /proc/PID/stat)
//! runs nothing, so its counts are zero: tracer says so, with the reason
//! and how to resume it, at the attach and every interval it stays so,
//! that it runs again once resumed, and in the summary for how long.

use std::{
    thread::sleep,
    time::{Duration, Instant},
};

use serde_json::Value;
use tracer_tests::{TracerRun, Workload, counts, require_root, shared_python};

fn signal(pid: u32, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(pid).expect("pid fits");
    // SAFETY: kill has no memory-safety preconditions; the pid is the
    // test's own child, not yet reaped.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
}

/// The state letter of `pid` in /proc/PID/stat.
fn state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next()).expect("a state")
}

/// tracer's next JSON line.
fn next(tracer: &TracerRun, what: &str) -> Value {
    let line = tracer.stdout.next_line(what).unwrap_or_else(|| panic!("no {what}"));
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON: {line}: {e}"))
}

/// The "stopped" notes among `lines` until the first of type `until`.
fn stopped_notes_until(tracer: &TracerRun, until: &str) -> (Vec<Value>, Value) {
    let mut notes = Vec::new();
    loop {
        let v = next(tracer, until);
        if v["type"] == until {
            return (notes, v);
        }
        if v["type"] == "note" && v["code"] == "stopped" {
            notes.push(v);
        }
    }
}

#[test]
fn a_stopped_target_is_said_stopped_with_how_to_resume_it() {
    require_root();
    let mut workload = Workload::serve(&shared_python());
    let pid = workload.pid();
    workload.ping();
    signal(pid, libc::SIGSTOP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while state(pid) != 'T' {
        assert!(Instant::now() < deadline, "the target was never stopped: {}", state(pid));
        sleep(Duration::from_millis(10));
    }
    let (tracer, _attached) = TracerRun::profile_json(pid, &["--interval", "0.5"]);

    // At the attach: why its figures are zero, and how to resume it.
    let (notes, interval) = stopped_notes_until(&tracer, "interval");
    let [first, still @ ..] = &notes[..] else { panic!("no stopped note before the first interval") };
    assert_eq!(first["level"], "warning", "{first}");
    let message = first["message"].as_str().expect("a message");
    assert!(message.starts_with(&format!("PID {pid} is stopped (state T in /proc/{pid}/stat")), "{message}");
    assert!(message.contains("zero because it runs nothing"), "{message}");
    assert!(message.ends_with(&format!("`kill -CONT {pid}` resumes it")), "{message}");
    // A stopped target makes no call: every count is zero.
    assert!(!counts(&interval).is_empty(), "no probe in the interval: {interval}");
    for (name, (calls, _)) in counts(&interval) {
        assert_eq!(calls, 0, "{name} counted calls of a stopped target: {interval}");
    }
    assert!(still.iter().all(|n| n["message"].as_str().unwrap().contains("still stopped")), "{notes:?}");

    // Every interval it stays stopped says so again.
    let (notes, _) = stopped_notes_until(&tracer, "interval");
    let [note] = &notes[..] else { panic!("not one stopped note for the second interval: {notes:?}") };
    let message = note["message"].as_str().expect("a message");
    assert!(message.starts_with(&format!("PID {pid} is still stopped (state T), for ")), "{message}");
    assert!(message.ends_with(&format!("`kill -CONT {pid}` resumes it")), "{message}");

    // Resumed: said once, and no more stopped notes.
    signal(pid, libc::SIGCONT);
    let resumed = loop {
        let v = next(&tracer, "the note that it runs again");
        if v["type"] == "note" && v["code"] == "stopped" && v["message"].as_str().unwrap().contains("runs again") {
            break v;
        }
    };
    assert_eq!(resumed["level"], "note", "{resumed}");
    workload.ping();
    let (notes, _) = stopped_notes_until(&tracer, "interval");
    assert_eq!(notes, Vec::<Value>::new(), "stopped notes once it runs");

    // The summary says for how long of the run it was stopped.
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "tracer failed: {status}: {stderr}");
    let summary_note = lines
        .iter()
        .find(|v| v["code"] == "stopped")
        .unwrap_or_else(|| panic!("no stopped note at the end: {lines:?}"));
    let message = summary_note["message"].as_str().expect("a message");
    assert!(message.starts_with(&format!("PID {pid} was stopped for ")), "{message}");
    assert!(
        message
            .ends_with("its rates are averaged over the whole run, the stopped time included (lowered by that share)"),
        "{message}"
    );
    assert!(stderr.contains(&format!("warning: PID {pid} is stopped (state T")), "{stderr}");
    workload.ping();
    workload.close();
}
