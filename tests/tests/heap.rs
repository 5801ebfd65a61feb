//! `tracer heap`: a census of a live CPython heap by type, read from
//! outside, on every build here: pyenv's 3.9.18, 3.10.13, 3.11.7, 3.12.1 and 3.13.0 (shared
//! libpython, their own symbols), Debian's LTO 3.11 with python3.11-dbg and
//! a copy of it without findable debug info, and the forky root's LTO 3.13
//! and 3.14 with and without debug info (chrooted).
//!
//! tests/python/heap.py builds a heap of known contents; the counts are
//! derived from it: a census before and one after the build (both with
//! `--stop`) differ by exactly the objects built. What the target itself
//! says at the same moment is the cross-check: `gc.get_objects()` per type
//! for GC types, and `sys.getallocatedblocks()`, which is pymalloc's
//! allocated pool blocks plus the blocks it passed to the C library
//! (`raw_allocated_blocks`, Objects/obmalloc.c): the census's pool blocks
//! plus that count, where tracer finds pymalloc's state, is exactly the
//! target's figure plus the two blocks allocated after it (its own int,
//! and the buffer of the `os.read` it waits in).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::Value;
use tracer_tests::{LINE_TIMEOUT, Workload, forky_root, require_root, run_tracer, static_python};

/// What every census says it does not follow outside the pools
/// (tracer-user/src/heap/mod.rs).
const OUTSIDE_PARTIAL: &str = "outside pymalloc's pools, only GC objects and what tuples, lists and combined dicts hold are found: a large object held only by an instance's attributes (its values, a split dict or a slot), a set, a closure cell or a C extension is not counted (in unaccounted)";

/// As tests/python/heap.py.
const N_SLOTTED: u64 = 100_000;
const N_FLOATS: u64 = 50_000;
const N_BYTES: u64 = 20_000;
const BYTES_SIZE: u64 = 2_000;
const N_KEYS: u64 = 10_000;
const N_CACHED: u64 = 1_000;
const CACHED_SIZE: u64 = 1_000;
const CHURN_FLOATS: u64 = 100;
const CHURN_KEYS: u64 = 50;

/// An interpreter to run heap.py with.
enum Python {
    /// An executable of this machine.
    Host(PathBuf),
    /// An executable of the forky root (a path inside it), chrooted.
    Forky(String),
}

impl Python {
    fn start(&self) -> Workload {
        match self {
            Self::Host(path) => {
                assert!(path.is_file(), "{} is missing: it is part of this machine kind", path.display());
                Workload::script(None, &path.display().to_string(), "heap.py", &[])
            }
            Self::Forky(inside) => Workload::script(Some(&forky_root()), inside, "heap.py", &[]),
        }
    }
}

fn pyenv(version: &str) -> Python {
    Python::Host(Path::new("/root/.pyenv/versions").join(version).join("bin/python3"))
}

/// A file removed when dropped.
struct Copy(PathBuf);

impl Drop for Copy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `tracer heap --pid PID --json EXTRA...`, which must succeed quietly.
fn census(pid: u32, extra: &[&str]) -> Value {
    let pid = pid.to_string();
    let mut args = vec!["heap", "--pid", &pid, "--json"];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = run_tracer(&args);
    assert_eq!(code, Some(0), "tracer {args:?}: {stderr}");
    assert_eq!(stderr, "", "tracer {args:?}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON: {stdout}: {e}"))
}

/// (count, bytes) by type name.
fn by_type(census: &Value) -> HashMap<String, (u64, u64)> {
    census["types"]
        .as_array()
        .expect("types")
        .iter()
        .map(|t| {
            let name = t["name"].as_str().expect("a name").to_owned();
            (name, (t["count"].as_u64().expect("a count"), t["bytes"].as_u64().expect("bytes")))
        })
        .collect()
}

/// What heap.py says after a command: `gc.get_objects()` per type, and
/// `sys.getallocatedblocks()`.
struct Said {
    gc: HashMap<String, u64>,
    blocks: u64,
}

fn said(workload: &Workload) -> Said {
    let line = workload.next_line("the gc counts").expect("a line");
    let gc = line
        .strip_prefix("gc ")
        .unwrap_or_else(|| panic!("not the gc counts: {line}"))
        .split_whitespace()
        .map(|pair| {
            let (name, n) = pair.split_once('=').expect("NAME=N");
            (name.to_owned(), n.parse().expect("a count"))
        })
        .collect();
    let line = workload.next_line("the allocated blocks").expect("a line");
    let blocks = line.strip_prefix("blocks ").and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{line}"));
    Said { gc, blocks }
}

/// heap.py waits in `os.read(0, 6)` for its next command.
fn at_rest(workload: &Workload) {
    workload.wait_blocked_reading(Some(6));
}

/// The census with every count the workload fixes, on `python`; `table`
/// says whether tracer must find pymalloc's arena table there.
fn exact_counts(python: &Python, table: bool) {
    require_root();
    let mut workload = python.start();
    at_rest(&workload);
    let pid = workload.pid();
    let before = census(pid, &["--stop"]);
    workload.tell("build");
    let said = said(&workload);
    at_rest(&workload);
    let after = census(pid, &["--stop"]);
    for c in [&before, &after] {
        assert_eq!(c["exact"], true, "{c}");
        assert!(c["stopped_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{c}");
        assert_eq!(c["pymalloc"]["pools_changed"], 0, "{c}");
        // Nothing left out but, where it cannot be found, the arena table,
        // and what no census follows outside the pools (said even when
        // stopped: the pools are exact, not what lies outside them).
        let partial: Vec<&str> = c["partial"].as_array().expect("partial").iter().filter_map(Value::as_str).collect();
        let expected = usize::from(!table) + 1;
        assert_eq!(partial.len(), expected, "{partial:?}");
        assert_eq!(partial.last().copied(), Some(OUTSIDE_PARTIAL), "{partial:?}");
        assert!(
            partial[..expected - 1].iter().all(|p| p.starts_with("pymalloc's arena table was not read")),
            "{partial:?}"
        );
        // Every link of the collector's lists that leaves the pools leads to
        // an object or a generation's head.
        assert!(c["rejected"].get("gc_link_not_an_object").is_none(), "{}", c["rejected"]);
        assert!(c["rejected"].get("gc_link_broken").is_none(), "{}", c["rejected"]);
    }
    // pymalloc's own count.
    let blocks = after["pymalloc"]["blocks"].as_u64().expect("blocks");
    if let Some(t) = after["pymalloc"].get("arena_table") {
        assert_eq!(t["found"], t["pools"], "every pool of the arena table was found by the scan: {t}");
        assert_eq!(t["not_in_table"], 0, "{t}");
        let raw = t["raw_allocated_blocks"].as_u64().expect("raw blocks");
        assert_eq!(blocks + raw, said.blocks + 2, "pool blocks {blocks} + raw {raw}: {after}");
    } else {
        assert!(!table, "tracer did not find the arena table: {after}");
        assert!(blocks < said.blocks, "{blocks} pool blocks, {} in all", said.blocks);
    }
    let (was, now) = (by_type(&before), by_type(&after));
    let count = |map: &HashMap<String, (u64, u64)>, name: &str| map.get(name).map_or(0, |c| c.0);
    let grew = |name: &str| count(&now, name) - count(&was, name);
    // The counts the workload fixes, exactly.
    assert_eq!(count(&now, "__main__.Slotted"), N_SLOTTED, "{after}");
    assert_eq!(said.gc["Slotted"], N_SLOTTED);
    let both = format!("before: {before}\nafter: {after}");
    assert_eq!(grew("float"), N_FLOATS, "{both}");
    // The blobs and the cached bytes are outside pymalloc's pools (2,033
    // and 1,033 bytes each), found through the list and the dict that hold
    // them.
    assert_eq!(grew("bytes"), N_BYTES + N_CACHED, "{both}");
    assert_eq!(grew("str"), N_KEYS + N_CACHED, "{both}");
    let blob_bytes = now["bytes"].1 - was["bytes"].1;
    assert!(blob_bytes >= N_BYTES * BYTES_SIZE + N_CACHED * CACHED_SIZE, "{blob_bytes} bytes of bytes: {after}");
    assert!(blob_bytes >= 40_000_000, "{blob_bytes} bytes of bytes: {after}");
    assert!(after["outside"]["referenced"].as_u64().expect("a count") >= N_BYTES + N_CACHED, "{after}");
    // What the target's collector lists, per GC type: every list is
    // tracked, and so are the slotted objects.
    assert_eq!(count(&now, "list"), said.gc["list"], "{after}");
    for name in ["dict", "tuple"] {
        assert!(count(&now, name) >= said.gc[name], "{name}: untracked ones are counted too: {after}");
    }
    // While the target runs and changes its heap, the census is an
    // estimate: the counts of what does not change stay within 0.5%.
    workload.tell("churn");
    workload.expect("churning");
    std::thread::sleep(Duration::from_millis(100));
    let running = census(pid, &[]);
    assert_eq!(running["exact"], false, "{running}");
    assert!(running.get("stopped_ms").is_none(), "{running}");
    let seen = by_type(&running);
    let within = |name: &str, expected: u64, slack: u64| {
        let got = count(&seen, name);
        let tolerance = expected / 200 + slack;
        assert!(got.abs_diff(expected) <= tolerance, "{name}: {got} against {expected} ± {tolerance}: {running}");
    };
    within("__main__.Slotted", N_SLOTTED, 0);
    within("float", count(&now, "float"), CHURN_FLOATS);
    within("bytes", count(&now, "bytes"), 0);
    within("str", count(&now, "str"), CHURN_KEYS);
    // Both threads stopped (one may be stopped inside pymalloc, leaving a
    // pool half updated: judged block by block, its objects still count).
    let stopped = census(pid, &["--stop"]);
    assert_eq!(stopped["exact"], true, "{stopped}");
    assert_eq!(by_type(&stopped)["__main__.Slotted"].0, N_SLOTTED, "{stopped}");
}

#[test]
fn pyenv_311() {
    exact_counts(&pyenv("3.11.7"), true);
}

/// 3.10: dict keys laid out by `dk_size` (before 3.11's logarithms), no
/// managed dicts; pymalloc as 3.11's.
#[test]
fn pyenv_310() {
    exact_counts(&pyenv("3.10.13"), true);
}

/// 3.9: pymalloc's pools are 4 KiB and its arenas 256 KiB (no large
/// pools before 3.10), dict keys and pre-headers as 3.10's.
#[test]
fn pyenv_39() {
    exact_counts(&pyenv("3.9.18"), true);
}

#[test]
fn pyenv_312() {
    exact_counts(&pyenv("3.12.1"), true);
}

#[test]
fn pyenv_313() {
    exact_counts(&pyenv("3.13.0"), true);
}

#[test]
fn debian_311() {
    exact_counts(&Python::Host(static_python()), true);
}

#[test]
fn debian_311_without_debug_info() {
    let copy = std::env::temp_dir().join(format!("tracer-heap-nodbg-{}-python3.11", std::process::id()));
    let copy = Copy(tracer_tests::without_debug_info(&static_python(), &copy));
    // 3.11's arena table is found only through pymalloc's static symbols.
    exact_counts(&Python::Host(copy.0.clone()), false);
}

#[test]
fn forky_313() {
    exact_counts(&Python::Forky("/usr/bin/python3.13".into()), true);
}

#[test]
fn forky_314() {
    exact_counts(&Python::Forky("/usr/bin/python3.14".into()), true);
}

/// A copy of the forky root's `name` without findable debug info, inside
/// the root; its path there.
fn forky_copy(name: &str) -> (Copy, String) {
    let root = forky_root();
    let inside = format!("/tmp/tracer-heap-nodbg-{}-{name}", std::process::id());
    let copy = tracer_tests::without_debug_info(&root.join("usr/bin").join(name), &root.join(&inside[1..]));
    (Copy(copy), inside)
}

#[test]
fn forky_313_without_debug_info() {
    let (_copy, inside) = forky_copy("python3.13");
    // 3.12+ keep pymalloc's state in the interpreter's: no symbol needed.
    exact_counts(&Python::Forky(inside), true);
}

#[test]
fn forky_314_without_debug_info() {
    let (_copy, inside) = forky_copy("python3.14");
    exact_counts(&Python::Forky(inside), true);
}

/// The state letter of `pid` in /proc/PID/stat (`t`: stopped by a tracer).
fn state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next()).unwrap_or('?')
}

/// Starts heap.py on pyenv's `version`, then `tracer heap --stop` on a
/// large heap of it, and waits until tracer has stopped it.
fn stopping(version: &str) -> (Workload, tracer_tests::TracerRun) {
    require_root();
    let mut workload = pyenv(version).start();
    at_rest(&workload);
    workload.tell("big");
    workload.expect("big");
    at_rest(&workload);
    let pid = workload.pid().to_string();
    let tracer = tracer_tests::TracerRun::start(&["heap", "--pid", &pid, "--stop", "--json"]);
    let deadline = Instant::now() + LINE_TIMEOUT;
    while state(workload.pid()) != 't' {
        assert!(Instant::now() < deadline, "tracer never stopped PID {pid}");
        std::thread::sleep(Duration::from_millis(1));
    }
    (workload, tracer)
}

/// The workload runs again: it answers a command.
fn answers(workload: &mut Workload) {
    workload.tell("count");
    let _ = said(workload);
}

#[test]
fn a_signal_during_a_stopped_census_lets_the_target_go() {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let (mut workload, tracer) = stopping("3.12.1");
        tracer.signal(signal);
        let (status, lines, stderr) = tracer.finish();
        assert_eq!(status.code(), Some(1), "{stderr}");
        assert!(lines.is_empty(), "{lines:?}");
        assert_eq!(stderr, "tracer: error: the heap census was interrupted by a signal; the target was let go\n");
        answers(&mut workload);
    }
}

/// `--stop` stops the threads it finds, again until a round finds no new
/// one, in at most 100 rounds: a target whose threads multiply faster ends
/// the census with an error, and every thread stopped is let go. The
/// test-only `TRACER_TEST_STOP_ROUNDS=1` reaches the limit on any target
/// (one round always finds new threads: all of them).
#[test]
fn a_target_whose_threads_keep_multiplying_is_let_go_with_an_error() {
    require_root();
    let mut workload = pyenv("3.12.1").start();
    at_rest(&workload);
    let pid = workload.pid();
    let tracer = tracer_tests::TracerRun::start_env(
        &["heap", "--pid", &pid.to_string(), "--stop", "--json"],
        &[("TRACER_TEST_STOP_ROUNDS", "1")],
    );
    let (status, lines, stderr) = tracer.finish();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(lines.is_empty(), "{lines:?}");
    assert_eq!(
        stderr,
        format!(
            "tracer: error: cannot stop PID {pid}: its threads kept multiplying (each of 1 rounds of stopping the threads it had found new ones); the threads stopped were let go. Without --stop the census is an estimate, taken while it runs\n"
        )
    );
    // (tracer has exited: had it not let its threads go, the kernel would
    // have; what this shows is that the error came and nothing is left
    // stopped.)
    assert_ne!(state(pid), 't', "PID {pid} left stopped");
    answers(&mut workload);
}

#[test]
fn a_killed_tracer_lets_the_target_go() {
    let (mut workload, mut tracer) = stopping("3.13.0");
    tracer.child.kill().expect("kill tracer");
    let _ = tracer.child.wait();
    answers(&mut workload);
}

#[test]
fn a_target_that_exits_during_the_census_is_one_line_and_status_2() {
    let (mut workload, tracer) = stopping("3.11.7");
    let pid = workload.pid();
    workload.child.kill().expect("kill the target");
    let (status, lines, stderr) = tracer.finish();
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(lines.is_empty(), "{lines:?}");
    assert_eq!(
        stderr,
        format!("tracer: error: PID {pid} exited during the heap census; take it again while the process runs\n")
    );
}

#[test]
fn a_process_that_is_not_python_is_one_line_and_status_2() {
    require_root();
    let mut sleeper = tracer_tests::KillOnDrop(std::process::Command::new("sleep").arg("60").spawn().expect("sleep"));
    let pid = sleeper.id();
    std::thread::sleep(Duration::from_millis(50));
    let (code, stdout, stderr) = run_tracer(&["heap", "--pid", &pid.to_string()]);
    assert_eq!(code, Some(2));
    assert_eq!(stdout, "");
    assert_eq!(
        stderr,
        format!(
            "tracer: error: PID {pid} (sleep, /usr/bin/sleep) is not a Python process: no libpython is mapped and the executable has no CPython symbols; pass the PID of a CPython process (for a launcher script, its python child)\n"
        )
    );
    let _ = sleeper.kill();
}

#[test]
fn a_python_of_an_unknown_version_is_one_line_and_status_2() {
    require_root();
    let python = Path::new("/root/.pyenv/versions/3.8.18/bin/python3");
    assert!(python.is_file(), "{} is missing: it is part of this machine kind", python.display());
    let workload = Workload::script(None, &python.display().to_string(), "heap.py", &[]);
    let pid = workload.pid();
    let (code, stdout, stderr) = run_tracer(&["heap", "--pid", &pid.to_string()]);
    assert_eq!(code, Some(2));
    assert_eq!(stdout, "");
    assert_eq!(
        stderr,
        format!(
            "tracer: error: PID {pid} runs Python 3.8.18, which tracer does not support; supported: 3.9, 3.10, 3.11, 3.12, 3.13, 3.14\n"
        )
    );
}

#[test]
fn the_table_shows_the_top_types_and_says_it_is_an_estimate() {
    require_root();
    let mut workload = pyenv("3.11.7").start();
    at_rest(&workload);
    workload.tell("build");
    let _ = said(&workload);
    at_rest(&workload);
    let pid = workload.pid();
    let (code, stdout, stderr) = run_tracer(&["heap", "--pid", &pid.to_string(), "--top", "3"]);
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].contains("heap census, an estimate: the target ran while it was read"), "{stdout}");
    assert_eq!(lines[1].split_whitespace().collect::<Vec<_>>(), ["objects", "bytes", "share", "type"]);
    // The bytes objects hold most of the heap: the first row.
    let first: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(first.last(), Some(&"bytes"), "{stdout}");
    assert!(lines[5].contains("more types"), "{stdout}");
    assert!(stdout.contains("\npymalloc: "), "{stdout}");
    assert!(stdout.contains("\nmemory: RSS "), "{stdout}");
}

/// With `PYTHONMALLOC=malloc` there are no pools: every object is the C
/// library's, and the census finds those it can reach from outside the
/// pools (the collector's lists and what lists and tuples hold), and says
/// why the rest is missing.
#[test]
fn a_heap_without_pymalloc_is_found_through_the_collector_and_said() {
    require_root();
    let python = "/root/.pyenv/versions/3.12.1/bin/python3";
    let mut workload = Workload::script_env(None, python, "heap.py", &[], &[("PYTHONMALLOC", "malloc")]);
    at_rest(&workload);
    let pid = workload.pid();
    let before = census(pid, &["--stop"]);
    workload.tell("build");
    let _ = said(&workload);
    at_rest(&workload);
    let after = census(pid, &["--stop"]);
    assert_eq!(after["pymalloc"]["pools"], 0, "{after}");
    let partial: Vec<&str> = after["partial"].as_array().expect("partial").iter().filter_map(Value::as_str).collect();
    assert!(
        partial.contains(&format!(
            "PID {pid} was started with PYTHONMALLOC=malloc: its objects are not all in pymalloc's pools, or not where the census looks in their blocks"
        )
        .as_str()),
        "{partial:?}"
    );
    let (was, now) = (by_type(&before), by_type(&after));
    let count = |map: &HashMap<String, (u64, u64)>, name: &str| map.get(name).map_or(0, |c| c.0);
    assert_eq!(count(&now, "__main__.Slotted"), N_SLOTTED, "{after}");
    assert_eq!(count(&now, "float") - count(&was, "float"), N_FLOATS, "{after}");
    assert_eq!(count(&now, "bytes") - count(&was, "bytes"), N_BYTES + N_CACHED, "{after}");
}

/// What heap.py's forking thread has seen so far: children that exited
/// with status 0, and those that did not.
fn forks(workload: &mut Workload) -> (u64, u64) {
    workload.tell("forks");
    let line = workload.next_line("the forks").expect("a line");
    let mut n =
        line.strip_prefix("forks ").unwrap_or_else(|| panic!("{line}")).split(' ').map(|n| n.parse().expect("a count"));
    (n.next().expect("ok"), n.next().expect("failed"))
}

/// A target that forks while a census reads it (issue 26): the census of
/// the parent is whole, running and stopped, and every child forked
/// meanwhile runs to its end (status 0), none harmed.
#[test]
fn a_target_forking_mid_census_is_read_whole_and_its_children_unharmed() {
    require_root();
    let mut workload = pyenv("3.11.7").start();
    at_rest(&workload);
    let pid = workload.pid();
    workload.tell("build");
    let _ = said(&workload);
    workload.tell("fork");
    workload.expect("forking");
    for stop in [&[][..], &["--stop"][..]] {
        let (before, _) = forks(&mut workload);
        let c = census(pid, stop);
        let (after, failed) = forks(&mut workload);
        assert!(after > before, "no child forked during the census ({before} before, {after} after)");
        assert_eq!(failed, 0, "{failed} children did not exit with status 0");
        assert_eq!(c["exact"], !stop.is_empty(), "{c}");
        assert_eq!(by_type(&c)["__main__.Slotted"].0, N_SLOTTED, "{stop:?}: {c}");
    }
    workload.tell("quit");
}
