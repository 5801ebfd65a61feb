//! The maps keyed by thread that hold a call in flight (LRU maps): with
//! room for one (`TRACER_TEST_FULL_MAPS`), two threads inside calls at
//! once push each other's entry out, and what that loses is counted and
//! said. The GIL keeps one allocator call in flight per process, so
//! `tests/python/gil_free.py` makes its calls through `ctypes.CDLL`, which
//! lets go of the GIL. Each map is also run with its full room, where the
//! same workload loses nothing. (`GC_RUNNING`'s test is in capacity.rs.)

use serde_json::Value;
use tracer_tests::{TracerRun, Workload, require_root, shared_python};

/// `tests/python/gil_free.py` `mode` for two seconds under `tracer
/// attach --json --interval 3600 ARGS` with `env`: the summary, and the
/// calls its threads made.
fn gil_free(mode: &str, env: &[(&str, &str)], args: &[&str]) -> (Value, u64) {
    let python = shared_python();
    let mut workload = Workload::script(None, python.to_str().expect("a path"), "gil_free.py", &[mode, "2"]);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid().to_string();
    let mut all = vec!["attach", "--json", "--pid", &pid, "--interval", "3600"];
    all.extend_from_slice(args);
    let tracer = TracerRun::start_env(&all, env);
    assert!(tracer.stdout.next_line("the attached line").is_some(), "{:?}", tracer.finish().2);
    workload.go();
    let done = workload.next_line("done CALLS").expect("gil_free.py's done line");
    let calls = done.strip_prefix("done ").and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{done}"));
    assert!(calls > 0, "{done}");
    workload.wait_blocked_reading(Some(5));
    tracer.signal(libc::SIGINT);
    let summary = tracer.summary();
    workload.close();
    (summary, calls)
}

fn stat(summary: &Value, name: &str) -> u64 {
    summary["stats"][name].as_u64().unwrap_or_else(|| panic!("no {name} in {}", summary["stats"]))
}

fn raw(summary: &Value, field: &str) -> u64 {
    summary["live"]["raw"][field].as_u64().unwrap_or_else(|| panic!("no live.raw.{field}: {}", summary["live"]))
}

/// `FRAMES`, each thread's allocator calls in flight (`--live`): with room
/// for one, a thread's frames pushed out while its call runs leave the
/// call's return unpaired, which is counted in `live_unmatched`, and the
/// live figures say they are partial, and why. With its room, every raw
/// call of both threads is paired.
#[test]
fn calls_pushed_out_of_the_map_of_threads_in_flight_are_counted_in_live_unmatched() {
    require_root();
    let (full, _) = gil_free("raw", &[("TRACER_TEST_FULL_MAPS", "FRAMES")], &["--live"]);
    assert!(stat(&full, "live_unmatched") >= 1, "{}", full["stats"]);
    let partial = full["live"]["partial"].as_str().unwrap_or_else(|| panic!("not partial: {}", full["live"]));
    assert!(
        partial.contains(" allocator calls or returns were not paired (live_unmatched): ")
            && partial.contains("pushed out of the map of threads with calls in flight"),
        "{partial}"
    );
    let (roomy, calls) = gil_free("raw", &[], &["--live"]);
    assert_eq!((stat(&roomy, "live_unmatched"), stat(&roomy, "live_pending_full")), (0, 0), "{}", roomy["stats"]);
    assert!(roomy["live"].get("partial").is_none(), "{}", roomy["live"]);
    // Each call a PyMem_RawMalloc and a PyMem_RawFree of its block; the
    // interpreter's own raw calls (the threads' states) come on top.
    assert!(raw(&roomy, "allocations") >= calls && raw(&roomy, "frees") >= calls, "{calls} calls: {}", roomy["live"]);
}

/// `GROWTH_CALLS`, each thread's mapping syscall in flight (`--growth`):
/// with room for one, an mmap or munmap whose entry was pushed out cannot
/// be judged at its exit, which is counted in `takes.mapped_missed` with a
/// caveat. With its room, every call is judged: each mmap is a growth of
/// the C library's heap, and with its munmap two syscalls.
#[test]
fn mapping_calls_pushed_out_of_the_map_in_flight_are_counted_in_mapped_missed() {
    require_root();
    let (full, _) = gil_free("mmap", &[("TRACER_TEST_FULL_MAPS", "GROWTH_CALLS")], &["--growth"]);
    let growth = &full["growth"];
    assert!(growth["takes"]["mapped_missed"].as_u64() >= Some(1), "{}", growth["takes"]);
    let caveat = growth["caveat"].as_str().unwrap_or_else(|| panic!("no caveat: {growth}"));
    assert!(caveat.contains(" of the target's mapping calls could not be judged"), "{caveat}");
    assert!(caveat.contains("(takes.mapped_missed)"), "{caveat}");
    let (roomy, calls) = gil_free("mmap", &[], &["--growth"]);
    let takes = &roomy["growth"]["takes"];
    assert_eq!(takes["mapped_missed"], 0, "{takes}");
    assert!(
        takes["grown"].as_u64() >= Some(calls) && takes["syscalls"].as_u64() >= Some(2 * calls),
        "{calls}: {takes}"
    );
}
