//! Capacity (issue 26): a bounded kernel table that fills up says so. A
//! target that makes more types, or keeps more objects alive, than
//! `--types`' tables hold gets its misses counted, exactly the events the
//! full table could not take, and the report marks the figures partial.

use tracer_tests::{TracerRun, Workload, require_root, shared_python, traced_until_done};

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
