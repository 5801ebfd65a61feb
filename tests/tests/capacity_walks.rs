//! `WALKS`, the kernel's table of where each traced process's frames are,
//! has room for 1,024 processes with `--exe`. A process that finds it full
//! has no stacks, and tracer tries it again at every interval: once a
//! traced process exits and frees its entry, the waiting one gets its walk
//! and tracer says so. Forced with room for one
//! (`TRACER_TEST_FULL_MAPS=WALKS=1`, docs/development.md), on a private
//! copy of Debian's python3.11 (`--exe` traces every process of its image,
//! and no other process may take the entry; the copy finds its debug info
//! by its build-id, as the original does).
//!
//! The first process (A) takes the only entry; the second (B) is refused
//! and told; A exits; B is given its walk and told; then B makes N
//! bytearrays at `make_a` and 3N at `make_b` (tests/python/sites.py), every
//! one of them under its stack: N more iterations, a whole number of
//! calls more per iteration, three times as many at `make_b`.

use std::time::{Duration, Instant};

use serde_json::Value;
use tracer_tests::{TracerRun, Workload, require_root, static_python};

const FULL_MAPS: &str = "TRACER_TEST_FULL_MAPS";

/// The line of tests/python/sites.py that ends with `marker`.
fn line_of(marker: &str) -> u64 {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/sites.py");
    let text = std::fs::read_to_string(&script).expect("sites.py");
    let at = text.lines().position(|l| l.ends_with(marker)).unwrap_or_else(|| panic!("no {marker} in sites.py"));
    u64::try_from(at + 1).expect("a line number")
}

/// Calls at `function`'s allocating line in a line's `sites`.
fn calls_at(line: &Value, function: &str) -> Option<u64> {
    let at = line_of(&format!("# {function} allocates"));
    line["sites"].as_array()?.iter().find(|s| s["function"] == function && s["line"] == at)?["calls"].as_u64()
}

/// Reads tracer's lines until one satisfies `found`, and returns it;
/// fails after a minute (its intervals keep coming meanwhile).
fn until(tracer: &TracerRun, what: &str, found: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_mins(1);
    loop {
        assert!(Instant::now() < deadline, "no {what} within a minute");
        let line = tracer.stdout.next_line(what).unwrap_or_else(|| panic!("tracer ended before {what}"));
        let line: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON: {e}: {line}"));
        assert!(
            !(line["type"] == "note" && line["code"] == "no_stacks" && !found(&line)),
            "a note other than the one awaited ({what}): {line}"
        );
        if found(&line) {
            return line;
        }
    }
}

/// Whether `line` is a note of `code` about process `pid`.
fn note_for(line: &Value, code: &str, pid: u32) -> bool {
    let about = |m: &str| m.contains(&format!("PID {pid}:")) || m.contains(&format!("PID {pid} "));
    line["type"] == "note" && line["code"] == code && line["message"].as_str().is_some_and(about)
}

/// A directory removed with what it holds when dropped, the test passed
/// or not.
struct Removed(std::path::PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The sequence above with N = `n`; returns B's calls at `make_a` and at
/// `make_b`.
fn waiting_process_gets_its_stacks(n: u64) -> (u64, u64) {
    let dir = Removed(std::env::temp_dir().join(format!("tracer-walks-{}-{n}", std::process::id())));
    std::fs::create_dir_all(&dir.0).expect("a directory for the copy");
    let python = dir.0.join("python3.11");
    std::fs::copy(static_python(), &python).expect("a copy of the interpreter");
    let exe = python.to_str().expect("a UTF-8 path");
    // Each has printed "ready" once started.
    let script = |n: u64, shape: &str| Workload::script(None, exe, "sites.py", &[&n.to_string(), shape]);
    let mut a = script(1, "deep");
    let tracer = TracerRun::start_env(
        &["attach", "--exact", "--exe", exe, "--stacks", "--top", "30", "--interval", "0.2", "--json"],
        &[(FULL_MAPS, "WALKS=1")],
    );
    until(&tracer, "the attached line", |l| l["type"] == "attached");
    // A allocates (at `deep`, not at B's sites), so that the next reading
    // finds it and gives it the only entry.
    a.go();
    a.expect("done");
    // Until a reading has seen A: it is given its walk at that reading,
    // before B exists.
    let a_pid = a.pid().to_string();
    until(&tracer, "an interval with A", |l| l["type"] == "interval" && l["pids"].get(&a_pid).is_some());
    let mut b = script(n, "flat");
    let refused = until(&tracer, "B's no_stacks note", |l| note_for(l, "no_stacks", b.pid()));
    let message = refused["message"].as_str().expect("a message");
    assert!(message.contains("BPF map WALKS is full"), "{message}");
    assert!(message.ends_with("tried again at every interval, as traced processes exit"), "{message}");
    a.close();
    let admitted = until(&tracer, "B's stacks_late note", |l| note_for(l, "stacks_late", b.pid()));
    assert_eq!(admitted["level"], "note", "{admitted}");
    b.go();
    b.expect("done");
    // Until two intervals in a row name the same counts at both sites:
    // every stack was named while B ran.
    let mut last = None;
    loop {
        let line = until(&tracer, "an interval", |l| l["type"] == "interval");
        let now = calls_at(&line, "make_a").zip(calls_at(&line, "make_b"));
        if now.is_some() && now == last {
            break;
        }
        last = now;
    }
    b.close();
    tracer.signal(libc::SIGINT);
    let summary = tracer.summary();
    // B's events before its walk (its start), and A's before its own.
    let no_config = summary["stats"]["stack_no_config"].as_u64().unwrap_or_else(|| panic!("{}", summary["stats"]));
    assert!(no_config > 0, "{}", summary["stats"]);
    for stat in ["stack_read_failed", "stack_other_thread", "stacks_full", "map_full"] {
        assert_eq!(summary["stats"][stat], 0, "{stat}: {}", summary["stats"]);
    }
    let (at_a, at_b) = (calls_at(&summary, "make_a"), calls_at(&summary, "make_b"));
    at_a.zip(at_b).unwrap_or_else(|| panic!("no make_a or make_b site: {}", summary["sites"]))
}

#[test]
fn a_process_the_walks_map_had_no_room_for_gets_its_stacks_once_another_exits() {
    require_root();
    let n = 300;
    let (a1, b1) = waiting_process_gets_its_stacks(n);
    let (a2, b2) = waiting_process_gets_its_stacks(2 * n);
    // Every bytearray of B's run under its stack: three times as many at
    // make_b, and N more iterations a whole number of calls more each.
    assert_eq!((b1, b2), (3 * a1, 3 * a2), "make_a {a1}, {a2}; make_b {b1}, {b2}");
    let more = a2 - a1;
    assert!(more >= n && more % n == 0, "make_a: {a1} then {a2} for {n} more iterations");
    assert_eq!(a1 % n, 0, "make_a: {a1} calls for {n} iterations");
}
