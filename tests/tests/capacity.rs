//! Capacity (issue 26): a bounded kernel table that fills up says so. A
//! target that makes more types, or keeps more objects alive, than
//! `--types`' tables hold gets its misses counted, exactly the events the
//! full table could not take, and the report marks the figures partial.
//!
//! The tables that only thousands of processes or threads at once could
//! fill (the counters, the GC's totals, the nested calls in flight, the
//! native stacks) are loaded full instead, with the test-only
//! `TRACER_TEST_FULL_MAPS` (docs/development.md): room for one entry,
//! taken by a placeholder no event uses. Every event that needs an entry
//! then finds none, so each counter must equal exactly the events of the
//! workload that needed one: N more iterations, exactly N times the body's
//! events more.

use std::time::Duration;

use serde_json::Value;
use tracer_tests::{Aslr, Body, Exit, TracerRun, Workload, require_root, shared_python, traced_until_done};

/// Room for (process, type) pairs (tracer-user/src/run/mod.rs,
/// `TYPE_ENTRIES`).
const TYPE_ENTRIES: u64 = 1 << 15;

#[test]
fn more_types_than_the_table_holds_are_counted_as_missed() {
    require_root();
    let k: u64 = 40_000;
    let python = shared_python();
    let workload = Workload::script(None, python.to_str().unwrap(), "many_types.py", &[&k.to_string(), "0"]);
    let (_, summary) = traced_until_done(workload, &["--types", "--interval", "3600"]);
    let stats = &summary["stats"];
    let full = stats["types_full"].as_u64().expect("types_full");
    // Each class past the room is one instance's type that found no
    // place, at least: the table held other types before.
    assert!(full >= k - TYPE_ENTRIES, "types_full {full}: {stats}");
    let types = summary["types"].as_array().expect("types");
    let listed = u64::try_from(types.len()).expect("len");
    assert!(listed <= TYPE_ENTRIES, "{listed} types listed");
}

/// The table says which of its figures the full tables cut.
#[test]
fn the_table_marks_what_a_full_table_cut() {
    require_root();
    let python = shared_python();
    let mut workload = Workload::script(None, python.to_str().unwrap(), "many_types.py", &["40000", "0"]);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid().to_string();
    let tracer = TracerRun::start(&["attach", "--pid", &pid, "--types", "--interval", "3600"]);
    // The table's first line: attached.
    let _ = tracer.stdout.next_line("the header");
    workload.go();
    workload.expect("done");
    workload.wait_blocked_reading(Some(5));
    tracer.signal(libc::SIGINT);
    let table = tracer.stdout.rest("the table").join("\n");
    workload.close();
    let line = table.lines().find(|l| l.starts_with("  types PARTIAL: ")).unwrap_or_else(|| panic!("{table}"));
    assert!(
        line.ends_with(" new objects found the type table full: they are under no type above (types_full)"),
        "{line}"
    );
    assert!(table.contains("BPF misses: types_full="), "{table}");
}

/// Room for objects `--types` saw created and not yet destroyed
/// (tracer-user/src/run/mod.rs, `OBJECT_ENTRIES`).
const OBJECT_ENTRIES: u64 = 1 << 20;

#[test]
fn more_live_objects_than_the_table_holds_are_counted_as_missed() {
    require_root();
    let n: u64 = 1_060_000;
    let python = shared_python();
    let workload = Workload::script(None, python.to_str().unwrap(), "many_types.py", &["0", &n.to_string()]);
    let (_, summary) = traced_until_done(workload, &["--types", "--interval", "3600"]);
    let stats = &summary["stats"];
    let full = stats["objects_full"].as_u64().expect("objects_full");
    // Every object kept past the room, at least, found no place.
    assert!(full >= n - OBJECT_ENTRIES, "objects_full {full}: {stats}");
    // And no more than were made: each object is one insert.
    let made = summary["types"]
        .as_array()
        .expect("types")
        .iter()
        .find(|t| t["name"] == "__main__.Many")
        .and_then(|t| t["created"].as_u64())
        .unwrap_or_else(|| panic!("no Many in {}", summary["types"]));
    assert_eq!(made, n, "every Many counted by type");
    assert!(full <= made + OBJECT_ENTRIES, "{full}");
}

/// Room for distinct Python stacks (tracer-user/src/run/mod.rs,
/// `STACK_ENTRIES`).
const STACK_ENTRIES: u64 = 1 << 14;

/// 20,000 functions each called once: more distinct stacks than the stack
/// table holds. Each call's events past the room keep their counts and
/// lose their stack, counted in `stacks_full` (at least one per stack
/// past the room); no more stacks are listed than there is room for.
#[test]
fn more_stacks_than_the_table_holds_are_counted_as_missed() {
    require_root();
    let k: u64 = 20_000;
    let python = shared_python();
    let workload = Workload::script(None, python.to_str().unwrap(), "many_stacks.py", &[&k.to_string()]);
    let (_, summary) = traced_until_done(workload, &["--stacks", "--interval", "3600"]);
    let stats = &summary["stats"];
    let full = stats["stacks_full"].as_u64().expect("stacks_full");
    assert!(full >= k - STACK_ENTRIES, "stacks_full {full}: {stats}");
    let stacks = summary["stacks"].as_array().expect("stacks");
    let listed = u64::try_from(stacks.len()).expect("len");
    assert!(listed <= STACK_ENTRIES, "{listed} stacks listed");
    // The coverage says so: the events without a stack are those the full
    // table turned away, or missed for another reason the stats count.
    let coverage = &summary["stack_coverage"];
    let (events, stacked) =
        (coverage["events"].as_u64().expect("events"), coverage["stacked"].as_u64().expect("stacked"));
    assert!(events - stacked >= full, "{coverage} against stacks_full {full}");
    let listed_events: u64 = stacks.iter().map(|s| s["calls"].as_u64().expect("calls")).sum();
    assert_eq!(listed_events, stacked, "the stacks listed hold the events counted under a stack");
}

/// How deep a thread's stack of calls in flight goes
/// (tracer-common/src/live.rs, `FRAME_DEPTH`).
const FRAME_DEPTH: u64 = 8;

/// The knob that loads the named maps full.
const FULL_MAPS: &str = "TRACER_TEST_FULL_MAPS";

/// `tracer attach --exact --pid PID ARGS` with `full` loaded full, around
/// `n` iterations of `body` (ended by `os._exit`): tracer, attached, once
/// the workload is gone.
fn full_run(full: &str, n: u64, body: Body, args: &[&str]) -> TracerRun {
    let python = shared_python();
    let mut workload = Workload::once(&python, n, body, Exit::Immediate, Aslr::On);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid().to_string();
    let mut all = vec!["attach", "--exact", "--pid", &pid, "--interval", "3600"];
    all.extend_from_slice(args);
    let tracer = TracerRun::start_env(&all, &[(FULL_MAPS, full)]);
    // --native-stacks reads every module's unwind tables first: about 20 s
    // alone in a debug build, more beside the other tests.
    let first = tracer.stdout.next_line_within("the attached line or the table's header", Duration::from_mins(5));
    assert!(first.is_some(), "tracer ended before attaching with {FULL_MAPS}={full}: {:?}", tracer.finish().2);
    workload.go();
    workload.finish();
    tracer
}

/// [`full_run`]: with `--json`, the summary; else the table, as one
/// string.
fn with_full_maps(full: &str, n: u64, body: Body, args: &[&str]) -> Value {
    let tracer = full_run(full, n, body, args);
    if args.contains(&"--json") {
        return tracer.summary();
    }
    let table = tracer.stdout.rest("the table").join("\n");
    let (status, _, stderr) = tracer.finish();
    assert!(status.success(), "{status}: {stderr}");
    Value::String(table)
}

/// Iterations of the shorter run; the longer makes twice as many.
const N: u64 = 200;

fn stat(summary: &Value, name: &str) -> u64 {
    summary["stats"][name].as_u64().unwrap_or_else(|| panic!("no {name} in {}", summary["stats"]))
}

/// Every other stat is 0: the full table is the only miss.
fn only_miss(summary: &Value, name: &str) {
    for (other, value) in tracer_tests::misses(summary) {
        if other != name && other != "other_process" {
            assert_eq!(value, 0, "{other}: {}", summary["stats"]);
        }
    }
}

/// The counters map full: every hit of every probe is counted in
/// `map_full` instead of its probe, so N more iterations of the objects
/// body give exactly N times its 13 hits more there
/// (`tests/tests/exact_counts.rs` pins them: 4 new references, 3 deallocations, a
/// `PyObject_Malloc`, two `PyObject_Free`, a `PyObject_Realloc`, a
/// `PyMem_RawMalloc` and a `PyMem_RawFree`), and no probe counts a call.
#[test]
fn hits_that_find_the_counters_full_are_counted_in_map_full() {
    require_root();
    let [one, two] = [N, 2 * N].map(|n| with_full_maps("COUNTERS", n, Body::Objects, &["--json"]));
    for summary in [&one, &two] {
        only_miss(summary, "map_full");
        for (name, probe) in summary["probes"].as_object().expect("probes") {
            assert_eq!(probe["calls"], 0, "{name} counted with its counter map full: {probe}");
        }
    }
    assert_eq!(stat(&two, "map_full") - stat(&one, "map_full"), 13 * N, "{}\n{}", one["stats"], two["stats"]);
    let table = with_full_maps("COUNTERS", N, Body::Objects, &[]);
    let table = table.as_str().expect("the table");
    let misses = table.lines().rev().find(|l| l.starts_with("  BPF misses: ")).unwrap_or_else(|| panic!("{table}"));
    assert!(misses.contains("map_full=") && misses.ends_with(" (some events were NOT counted)"), "{misses}");
}

/// The GC's totals map full: every collection is counted in `gc_full`
/// and under no generation. The gc body makes 4 collections an iteration
/// (two of generation 0, one each of 1 and 2) with automatic collection
/// off, and tests/tests/gc.rs pins that exactly those are seen: N and 2N
/// iterations give exactly 4N and 8N.
#[test]
fn collections_that_find_the_gc_totals_full_are_counted_in_gc_full() {
    require_root();
    for n in [N, 2 * N] {
        let summary = with_full_maps("GC_TOTALS", n, Body::Gc, &["--json"]);
        only_miss(&summary, "gc_full");
        assert_eq!(stat(&summary, "gc_full"), 4 * n, "{}", summary["stats"]);
        let generations = summary["gc"]["generations"].as_array().unwrap_or_else(|| panic!("{}", summary["gc"]));
        assert!(generations.iter().all(|g| g["collections"] == 0), "{}", summary["gc"]);
    }
    let table = with_full_maps("GC_TOTALS", N, Body::Gc, &[]);
    let table = table.as_str().expect("the table");
    let misses = table.lines().rev().find(|l| l.starts_with("  BPF misses: ")).unwrap_or_else(|| panic!("{table}"));
    assert_eq!(misses, format!("  BPF misses: gc_full={} (some events were NOT counted)", 4 * N), "{table}");
    let partial = format!(
        "  gc PARTIAL: {} collections found the GC totals map full: they are not counted here (gc_full)",
        4 * N
    );
    assert!(table.lines().any(|l| l == partial), "{table}");
}

/// `--native` with the map of nested calls in flight full: glibc's
/// `realloc` relays `realloc(NULL, n)` to `malloc` and `realloc(p, 0)` to
/// `free` once an iteration each (tests/tests/native.rs), and each such
/// call, finding no room for its mark, is counted in `nested_full` and
/// again under its function: exactly 2N more in `nested_full`, one more
/// `malloc` and one more `free` an iteration than the body's own, and no
/// nested call counted as such.
#[test]
fn nested_calls_that_find_their_map_full_are_counted_in_nested_full() {
    require_root();
    let [one, two] = [N, 2 * N].map(|n| with_full_maps("NESTED", n, Body::Native, &["--json", "--native"]));
    let calls = |s: &Value, name: &str| s["probes"][name]["calls"].as_u64().unwrap_or_else(|| panic!("{name}: {s}"));
    for summary in [&one, &two] {
        only_miss(summary, "nested_full");
        for name in ["malloc", "free"] {
            let nested = summary["probes"][name]["nested"]["calls"].as_u64().unwrap_or(0);
            assert_eq!(nested, 0, "{name}: {}", summary["probes"][name]);
        }
    }
    assert_eq!(stat(&two, "nested_full") - stat(&one, "nested_full"), 2 * N, "{}\n{}", one["stats"], two["stats"]);
    // The body's own: one malloc and four frees an iteration.
    assert_eq!(calls(&two, "malloc") - calls(&one, "malloc"), 2 * N);
    assert_eq!(calls(&two, "free") - calls(&one, "free"), 5 * N);
    let table = with_full_maps("NESTED", N, Body::Native, &["--native"]);
    let table = table.as_str().expect("the table");
    let partial =
        table.lines().rev().find(|l| l.starts_with("  nested PARTIAL: ")).unwrap_or_else(|| panic!("{table}"));
    assert!(
        partial.ends_with(
            " nested calls found the map of nested calls full: each is counted again under its function above (nested_full)"
        ),
        "{partial}"
    );
}

/// `--native-stacks` with the native stacks map full: each event whose
/// Python stack was walked unwinds its native stack, finds no room for
/// it, and is counted in `native_full`, still under its Python stack:
/// `native_full` is exactly the events counted under a stack, and no stack
/// lists native frames.
#[test]
fn native_stacks_that_find_their_map_full_are_counted_in_native_full() {
    require_root();
    let summary = with_full_maps("NATIVE_STACKS", N, Body::Objects, &["--json", "--native-stacks"]);
    let coverage = &summary["stack_coverage"];
    let stacked = coverage["stacked"].as_u64().unwrap_or_else(|| panic!("{coverage}"));
    assert!(stacked >= 4 * N, "{coverage}");
    assert_eq!(stat(&summary, "native_full"), stacked, "{}", summary["stats"]);
    assert_eq!(stat(&summary, "stacks_full"), 0, "{}", summary["stats"]);
    for s in summary["stacks"].as_array().expect("stacks") {
        let native = s["native"].as_array().map_or(0, Vec::len);
        assert_eq!(native, 0, "native frames kept with the native stacks map full: {s}");
    }
}

/// `--live` with every thread's stack of calls in flight loaded full
/// (`EMPTY_FRAMES`, the stack a thread's starts from: eight frames of no
/// kind). A call pushed on a full stack loses the outermost frame and is
/// counted in `live_pending_full`; each such loss is one of the eight
/// placeholders, and calls nest less than eight deep, so the one-thread
/// workload counts between one and eight. The report says its live figures
/// are partial, and why, in the JSON and in the table.
#[test]
fn calls_that_find_their_stack_full_are_counted_in_live_pending_full() {
    require_root();
    let summary = with_full_maps("EMPTY_FRAMES", N, Body::Objects, &["--json", "--live"]);
    let full = stat(&summary, "live_pending_full");
    assert!((1..=FRAME_DEPTH).contains(&full), "live_pending_full {full}: {}", summary["stats"]);
    let partial = summary["live"]["partial"].as_str().unwrap_or_else(|| panic!("{}", summary["live"]));
    let why = format!(
        "{full} allocator calls in flight could not be kept (live_pending_full): a thread's stack of calls in flight ({FRAME_DEPTH} deep) was full"
    );
    assert!(partial.contains(&why), "{partial}");
    let table = with_full_maps("EMPTY_FRAMES", N, Body::Objects, &["--live"]);
    let table = table.as_str().expect("the table");
    let line = table.lines().rev().find(|l| l.starts_with("  live: partial: ")).unwrap_or_else(|| panic!("{table}"));
    assert!(line.contains(" allocator calls in flight could not be kept (live_pending_full)"), "{line}");
}

/// growth.py's one-shape run (300 grow/churn pairs of 1,000 strs each,
/// tests/tests/growth.rs) under `tracer attach --json --growth` with the
/// map `full` loaded full: the summary's growth.
fn growth_with_full(full: &str) -> Value {
    growth_run("300", &[(FULL_MAPS, full)], &[])
}

/// growth.py's one-shape run of `pairs` grow/churn pairs under `tracer
/// attach --json --growth ARGS` with `env`: the summary's growth.
fn growth_run(pairs: &str, env: &[(&str, &str)], args: &[&str]) -> Value {
    let python = shared_python();
    let mut workload = Workload::script(None, python.to_str().unwrap(), "growth.py", &["one", pairs, "1000"]);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid().to_string();
    let mut all = vec!["attach", "--json", "--pid", &pid, "--interval", "3600", "--growth"];
    all.extend_from_slice(args);
    let tracer = TracerRun::start_env(&all, env);
    assert!(tracer.stdout.next_line("the attached line").is_some(), "{:?}", tracer.finish().2);
    workload.go();
    workload.expect("done");
    let _ = workload.next_line("kept");
    workload.wait_blocked_reading(Some(5));
    tracer.signal(libc::SIGINT);
    let summary = tracer.summary();
    workload.close();
    summary["growth"].clone()
}

/// `--growth` with its map of sampled pools full (`GROWTH_POOLS`): every
/// sampled take finds no room and is counted in `takes.lost`, exactly as
/// many as were sampled; no site holds a sampled pool, and the figures
/// say why.
#[test]
fn growth_samples_that_find_their_map_full_are_counted_as_lost() {
    require_root();
    let g = growth_with_full("GROWTH_POOLS");
    let t = &g["takes"];
    let (sampled, lost) = (t["sampled"].as_u64().unwrap_or(0), t["lost"].as_u64().unwrap_or(0));
    assert!(sampled > 0 && lost == sampled, "{t}");
    let sites = g["sites"].as_array().unwrap_or_else(|| panic!("{g}"));
    for s in sites {
        let pools = s["samples"].as_u64().unwrap_or(0) - s["libc_samples"].as_u64().unwrap_or(0);
        assert_eq!(pools, 0, "a site holds a pool sampled into a full map: {s}");
    }
    let caveat = g["caveat"].as_str().unwrap_or_else(|| panic!("no caveat: {g}"));
    let why = format!(
        "{lost} sampled pools found the samples map full (room for 65536) and are not in these figures (takes.lost)"
    );
    assert!(caveat.contains(&why), "{caveat}");
}

/// The same for the C library's heap (`GROWTH_MAPPED` full): every
/// sampled growth of it finds no room and is counted in
/// `takes.grown_lost` (with any lowering of the break, which needs an
/// entry too), no site holds a libc sample, and the figures say why.
#[test]
fn libc_heap_samples_that_find_their_map_full_are_counted_as_lost() {
    require_root();
    let g = growth_with_full("GROWTH_MAPPED");
    let t = &g["takes"];
    let (sampled, lost) = (t["grown_sampled"].as_u64().unwrap_or(0), t["grown_lost"].as_u64().unwrap_or(0));
    assert!(sampled > 0 && lost >= sampled, "{t}");
    let sites = g["sites"].as_array().unwrap_or_else(|| panic!("{g}"));
    assert!(sites.iter().all(|s| s["libc_samples"].as_u64() == Some(0)), "{g}");
    let caveat = g["caveat"].as_str().unwrap_or_else(|| panic!("no caveat: {g}"));
    let why = format!(
        "{lost} samples of the C library's heap found their map full (room for 16384) and are not in these figures (takes.grown_lost)"
    );
    assert!(caveat.contains(&why), "{caveat}");
}

/// A map the knob cannot fill is refused loudly, not ignored: an array
/// (but the two it knows) has no entry to refuse, and a name the object
/// has not is a typo.
#[test]
fn the_full_maps_knob_refuses_what_it_cannot_fill() {
    require_root();
    for (full, why) in [("STATS", "STATS: a PerCpuArray map cannot be filled"), ("NO_SUCH", "NO_SUCH: no such map")] {
        let python = shared_python();
        let mut workload = Workload::once(&python, 1, Body::Objects, Exit::Immediate, Aslr::On);
        workload.wait_blocked_on_stdin();
        let pid = workload.pid().to_string();
        let tracer =
            TracerRun::start_env(&["attach", "--exact", "--pid", &pid, "--duration", "1"], &[(FULL_MAPS, full)]);
        let (status, _, stderr) = tracer.finish();
        assert_eq!(status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(&format!("TRACER_TEST_FULL_MAPS (a test-only knob): {why}")), "{stderr}");
        workload.go();
        workload.finish();
    }
}

/// `--native-stacks` under a native stack deeper than the 64 frames it
/// unwinds (`tests/python/deep_native.py`: 30 calls made by `map`, N objects
/// made at the bottom): every event counted under a stack at that depth is
/// counted in `native_truncated` too. N more objects, exactly as many more
/// truncations as events more under a stack.
#[test]
fn native_stacks_past_their_depth_are_counted_in_native_truncated() {
    require_root();
    let python = shared_python();
    let run = |n: u64| {
        let workload = Workload::script(None, python.to_str().unwrap(), "deep_native.py", &[&n.to_string()]);
        let (_, summary) = traced_until_done(workload, &["--native-stacks", "--interval", "3600"]);
        let stacked = summary["stack_coverage"]["stacked"].as_u64().unwrap_or_else(|| panic!("{summary}"));
        (stat(&summary, "native_truncated"), stacked, summary)
    };
    let (one, stacked_one, _) = run(N);
    let (two, stacked_two, summary) = run(2 * N);
    assert!(stacked_two - stacked_one >= N, "{stacked_one} then {stacked_two} events under a stack");
    assert_eq!(two - one, stacked_two - stacked_one, "native_truncated {one} then {two}: {}", summary["stats"]);
    // The stacks kept are cut at the depth, not dropped, and say so.
    let cut =
        summary["stacks"].as_array().expect("stacks").iter().filter(|s| s["native_end"] == "cut at 64 native frames");
    let cut_calls: u64 = cut.map(|s| s["calls"].as_u64().expect("calls")).sum();
    assert!(cut_calls >= 2 * N, "{}", summary["stacks"]);
}

/// `--returns` with its map of returns full (`RETURNS`): each allocating
/// function's return finds no room and is counted in `map_full`, while
/// every call is still counted (the counters are not full). The objects
/// body's allocators return three times an iteration (a
/// `PyObject_Malloc`, a `PyObject_Realloc`, a `PyMem_RawMalloc`:
/// `tests/tests/exact_counts.rs` pins them): exactly 3N more, and no probe
/// has a return counted.
#[test]
fn returns_that_find_their_map_full_are_counted_in_map_full() {
    require_root();
    let [one, two] = [N, 2 * N].map(|n| with_full_maps("RETURNS", n, Body::Objects, &["--json", "--returns"]));
    let calls = |s: &Value, name: &str| s["probes"][name]["calls"].as_u64().unwrap_or_else(|| panic!("{name}: {s}"));
    for summary in [&one, &two] {
        only_miss(summary, "map_full");
        for (name, probe) in summary["probes"].as_object().expect("probes") {
            let returns = probe["returned"]["returns"].as_u64().unwrap_or(0);
            assert_eq!(returns, 0, "{name} counted a return with its map full: {probe}");
        }
    }
    assert_eq!(stat(&two, "map_full") - stat(&one, "map_full"), 3 * N, "{}\n{}", one["stats"], two["stats"]);
    assert_eq!(calls(&two, "PyObject_Malloc") - calls(&one, "PyObject_Malloc"), N);
}

/// `--stacks` with the map of stacks (`STACKS`), or the map of their
/// counts (`STACK_COUNTS`), full: every event walked is counted, under no
/// stack, and in `stacks_full`; N more iterations, exactly as many more
/// `stacks_full` as events walked more, and none counted under a stack.
#[test]
fn stacks_that_find_either_map_full_are_counted_in_stacks_full() {
    require_root();
    for full in ["STACKS", "STACK_COUNTS"] {
        let [one, two] = [N, 2 * N].map(|n| with_full_maps(full, n, Body::Objects, &["--json", "--stacks"]));
        let events = |s: &Value| s["stack_coverage"]["events"].as_u64().unwrap_or_else(|| panic!("{s}"));
        for summary in [&one, &two] {
            only_miss(summary, "stacks_full");
            assert_eq!(summary["stack_coverage"]["stacked"], 0, "{full}: {}", summary["stack_coverage"]);
            assert_eq!(summary["stacks"].as_array().map_or(0, Vec::len), 0, "{full}: {}", summary["stacks"]);
        }
        assert!(events(&two) - events(&one) >= N, "{full}: {} then {}", events(&one), events(&two));
        assert_eq!(
            stat(&two, "stacks_full") - stat(&one, "stacks_full"),
            events(&two) - events(&one),
            "{full}: {}\n{}",
            one["stats"],
            two["stats"]
        );
    }
}

/// `--native-stacks` with the map of executable pages full
/// (`NATIVE_PAGES`): tracer cannot tell the unwinder where the target's
/// code is, says so in a note, and every event counted under a Python
/// stack stops unwinding at its first pc, in no known mapping
/// (`native_no_mapping`): no stack has a native frame in a known module.
#[test]
fn native_pages_that_find_their_map_full_leave_events_without_native_frames() {
    require_root();
    let (status, lines, stderr) = full_run("NATIVE_PAGES", N, Body::Objects, &["--json", "--native-stacks"]).finish();
    assert!(status.success(), "{status}: {stderr}");
    let note = lines
        .iter()
        .find(|l| l["type"] == "note" && l["code"] == "no_native_stacks")
        .unwrap_or_else(|| panic!("no note: {lines:?}"));
    let message = note["message"].as_str().expect("message");
    assert!(message.contains("BPF map NATIVE_PAGES is full"), "{message}");
    let summary = lines.last().expect("a summary");
    let stacked = summary["stack_coverage"]["stacked"].as_u64().unwrap_or_else(|| panic!("{summary}"));
    assert!(stacked >= 4 * N, "{}", summary["stack_coverage"]);
    assert_eq!(stat(summary, "native_no_mapping"), stacked, "{}", summary["stats"]);
    for s in summary["stacks"].as_array().expect("stacks") {
        let native = s["native"].as_array().map_or(&[][..], Vec::as_slice);
        assert!(native.len() <= 1 && native.iter().all(|f| f["module"] == "?"), "frames with no pages known: {s}");
        let end = s["native_end"].as_str().unwrap_or_default();
        assert!(end.starts_with("at a pc in no file tracer knows"), "{s}");
    }
}

/// `--growth` with the map of stacks full (`STACKS`): every sampled
/// pool's and libc growth's walk finds no room for its stack and is counted
/// in `takes.walk_failed`, exactly as many as were sampled; the samples
/// are kept, under no stack.
#[test]
fn growth_walks_that_find_the_stacks_full_are_counted_as_failed() {
    require_root();
    let g = growth_with_full("STACKS");
    let t = &g["takes"];
    let field = |name: &str| t[name].as_u64().unwrap_or(0);
    let sampled = field("sampled") + field("grown_sampled");
    assert!(sampled > 0 && field("walk_failed") == sampled, "{t}");
    assert_eq!(field("lost") + field("grown_lost"), 0, "{t}");
}

/// `--growth` with its walks cut at one frame (`--stacks --depth 1`;
/// growth.py takes its pools in `grow` and `churn`, called from the
/// module: two frames): every sampled pool's and libc growth's walk is
/// counted in `takes.truncated`, exactly as many as were sampled. 30
/// pairs: `--stacks` traces every event too.
#[test]
fn growth_walks_past_their_depth_are_counted_as_truncated() {
    require_root();
    let g = growth_run("30", &[], &["--stacks", "--depth", "1"]);
    let t = &g["takes"];
    let field = |name: &str| t[name].as_u64().unwrap_or(0);
    let sampled = field("sampled") + field("grown_sampled");
    assert!(sampled > 0 && field("truncated") == sampled, "{t}");
    assert_eq!(field("walk_failed"), 0, "{t}");
}

/// `--stacks` with the map of walk configurations full (`WALKS`; with
/// `--exe`, more processes than it holds): the process gets no stacks,
/// says so in a note, and each of its events walked is counted, under no
/// stack, in `stack_no_config`; the run goes on.
#[test]
fn a_process_the_walks_map_has_no_room_for_is_counted_in_stack_no_config() {
    require_root();
    let lines_of = |n: u64| {
        let (status, lines, stderr) = full_run("WALKS", n, Body::Objects, &["--json", "--stacks"]).finish();
        assert!(status.success(), "{status}: {stderr}");
        lines
    };
    let [one, two] = [N, 2 * N].map(lines_of);
    let note =
        one.iter().find(|l| l["type"] == "note" && l["code"] == "no_stacks").unwrap_or_else(|| panic!("{one:?}"));
    let message = note["message"].as_str().expect("message");
    assert!(message.contains("BPF map WALKS is full"), "{message}");
    let (one, two) = (one.last().expect("a summary"), two.last().expect("a summary"));
    let events = |s: &Value| s["stack_coverage"]["events"].as_u64().unwrap_or_else(|| panic!("{s}"));
    for summary in [one, two] {
        only_miss(summary, "stack_no_config");
        assert_eq!(summary["stack_coverage"]["stacked"], 0, "{}", summary["stack_coverage"]);
        assert_eq!(stat(summary, "stack_no_config"), events(summary), "{}", summary["stats"]);
    }
    assert!(events(two) - events(one) >= N, "{} then {}", events(one), events(two));
}

/// The census follows a type's chain of metatypes four deep: a class
/// whose chain is longer is not taken for a type, so its N instances are
/// in no type's row and counted in `rejected.not_a_type`, N more
/// instances at least N more there. With a chain of three, the class is
/// a row of exactly its N instances.
#[test]
fn a_census_past_the_metatype_depth_counts_the_objects_as_not_a_type() {
    require_root();
    let python = shared_python();
    let census = |depth: u64, n: u64| {
        let args = [depth.to_string(), n.to_string()];
        let workload = Workload::script(None, python.to_str().unwrap(), "deep_meta.py", &[&args[0], &args[1]]);
        let pid = workload.pid().to_string();
        let (code, stdout, stderr) = tracer_tests::run_tracer(&["heap", "--pid", &pid, "--json"]);
        drop(workload);
        assert_eq!(code, Some(0), "{stderr}");
        let census: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON: {e}: {stdout}"));
        let deep = census["types"].as_array().expect("types").iter().find(|t| t["name"] == "__main__.Deep").cloned();
        (census["rejected"]["not_a_type"].as_u64().unwrap_or_else(|| panic!("{}", census["rejected"])), deep)
    };
    let n = 20_000;
    let (one, deep_one) = census(6, n);
    let (two, deep_two) = census(6, 2 * n);
    assert!(deep_one.is_none() && deep_two.is_none(), "{deep_one:?} {deep_two:?}");
    assert!(two - one >= n, "not_a_type {one} then {two}");
    let (_, shallow) = census(3, n);
    assert_eq!(shallow.unwrap_or_else(|| panic!("no row for Deep with three metatypes"))["count"], n);
}

/// `--native-stacks` with the unwinder's rows full (`UNWIND_ROWS`, an
/// array, loaded with room for one row): no module's rows fit, each
/// module says so in a note with the fix for a lack of room (not the one
/// for a module built without unwind tables), and every event counted
/// under a Python stack stops unwinding in its first module
/// (`native_no_info`).
#[test]
fn unwind_rows_that_find_no_room_leave_events_at_their_first_module() {
    require_root();
    let (status, lines, stderr) = full_run("UNWIND_ROWS", N, Body::Objects, &["--json", "--native-stacks"]).finish();
    assert!(status.success(), "{status}: {stderr}");
    let notes: Vec<&str> = lines
        .iter()
        .filter(|l| l["type"] == "note" && l["code"] == "no_native_stacks")
        .filter_map(|l| l["message"].as_str())
        .collect();
    assert!(!notes.is_empty(), "no note: {lines:?}");
    for note in &notes {
        assert!(note.contains(": no room for its unwind rows: "), "{note}");
        assert!(note.ends_with("trace fewer processes at once"), "{note}");
    }
    let summary = lines.last().expect("a summary");
    let stacked = summary["stack_coverage"]["stacked"].as_u64().unwrap_or_else(|| panic!("{summary}"));
    assert!(stacked >= 4 * N, "{}", summary["stack_coverage"]);
    assert_eq!(stat(summary, "native_no_info"), stacked, "{}", summary["stats"]);
}

/// 260 interpreters in one process (tests/python/subinterpreters.py on
/// pyenv's 3.12), more than the 256 tracer reads: `tracer stack` lists the
/// threads of the first 256 and says the list is cut, in the table and the
/// JSON; the census counts the cut in `rejected.interpreters_cut`.
#[test]
fn more_interpreters_than_are_read_are_cut_and_said() {
    require_root();
    let python = tracer_tests::pyenv("3.12.1");
    let workload = Workload::script(None, python.to_str().unwrap(), "subinterpreters.py", &["260"]);
    let pid = workload.pid().to_string();
    let (code, stdout, stderr) = tracer_tests::run_tracer(&["stack", "--pid", &pid, "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    let stacks: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON: {e}: {stdout}"));
    let why = "more than 256 interpreters: the threads of the rest are not read";
    assert_eq!(stacks["cut"], why, "{}", stacks["cut"]);
    assert_eq!(stacks["threads"].as_array().map(Vec::len), Some(256), "one idle thread state per interpreter read");
    let (code, table, stderr) = tracer_tests::run_tracer(&["stack", "--pid", &pid]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(table.lines().last(), Some(format!("(cut: {why})").as_str()), "{table}");
    let (code, stdout, stderr) = tracer_tests::run_tracer(&["heap", "--pid", &pid, "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    let census: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON: {e}: {stdout}"));
    assert!(census["rejected"]["interpreters_cut"].as_u64() >= Some(1), "{}", census["rejected"]);
    drop(workload);
}

/// The map of collections in flight (`GC_RUNNING`, an LRU map keyed by
/// thread) with room for one: two processes of one (private) interpreter
/// collecting at once, each collection held open by a finalizer that
/// sleeps, push each other's start out, and the done whose start was
/// pushed out is counted in `gc_unmatched`, which says the collections
/// counted are partial.
#[test]
fn collections_pushed_out_of_the_map_in_flight_are_counted_in_gc_unmatched() {
    require_root();
    let copy = std::env::temp_dir().join(format!("tracer-gc-lru-{}-python3.11", std::process::id()));
    std::fs::copy(tracer_tests::static_python(), &copy).expect("a private copy of python3.11");
    let exe = copy.to_str().expect("a UTF-8 path").to_owned();
    let mut workloads: Vec<Workload> =
        (0..2).map(|_| Workload::script(None, &exe, "slow_collect.py", &["1"])).collect();
    let tracer = TracerRun::start_env(
        &["attach", "--exact", "--exe", &exe, "--json", "--interval", "3600"],
        &[(FULL_MAPS, "GC_RUNNING")],
    );
    assert!(tracer.stdout.next_line("the attached line").is_some(), "{:?}", tracer.finish().2);
    // Both collect at once: each finalizer holds its collection open a
    // second.
    for w in &mut workloads {
        w.go();
    }
    for w in &mut workloads {
        w.expect("done");
    }
    tracer.signal(libc::SIGINT);
    let summary = tracer.summary();
    drop(workloads);
    let _ = std::fs::remove_file(&copy);
    assert!(stat(&summary, "gc_unmatched") >= 1, "{}", summary["stats"]);
}
