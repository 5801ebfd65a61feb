//! A hostile target: tests/python/hostile.py names a class with an ANSI
//! colour escape, a right-to-left override and 70,000 more characters (past
//! the 2^16 a string read once stopped at), and
//! holds instances of it. What tracer prints of that name must reach a
//! terminal escaped and bounded; its JSON keeps the name raw but bounded.
//! A class whose dict holds its `__module__` past the entries tracer
//! searches is named with `?` for its module.

use std::path::Path;

use serde_json::Value;
use tracer_tests::{Workload, require_root, run_tracer, shared_python, static_python};

/// As tests/python/hostile.py.
const N: u64 = 20_000;
const LONG: usize = 70_000;
const CROWDED: u64 = 3_000;
fn name() -> String {
    format!("Evil\x1b[31mRED\u{202e}evil\u{2066}{}", "x".repeat(LONG))
}

/// tracer's bound on a name, in characters, and its mark for a cut one
/// (tracer-user/src/text.rs).
const MAX_NAME: usize = 256;
const CUT: char = '…';

fn start(python: &Path) -> Workload {
    assert!(python.is_file(), "{} is missing: it is part of this machine kind", python.display());
    // It has printed "ready" when this returns.
    Workload::script(None, &python.display().to_string(), "hostile.py", &[])
}

fn census_of(python: &Path) {
    require_root();
    let workload = start(python);
    let pid = workload.pid().to_string();

    // The JSON: the raw name, bounded, and marked as cut.
    let (code, stdout, stderr) = run_tracer(&["heap", "--pid", &pid, "--stop", "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    let census: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON: {e}: {stdout}"));
    let full = format!("__main__.{}", name());
    let bounded: String = full.chars().take(MAX_NAME).chain([CUT]).collect();
    let types = census["types"].as_array().expect("types");
    let row = types.iter().find(|t| t["name"] == bounded.as_str()).unwrap_or_else(|| {
        let names: Vec<String> =
            types.iter().map(|t| t["name"].as_str().unwrap_or_default().chars().take(40).collect()).collect();
        panic!("no row named {bounded:?} among {names:?}")
    });
    assert_eq!(row["count"], N, "{row}");
    assert!(
        types.iter().all(|t| t["name"].as_str().is_some_and(|n| n.chars().count() <= MAX_NAME + 1)),
        "every name is bounded"
    );
    // A class dict is searched for `__module__` in its first 4,096
    // entries: past them, the module is shown unread, not left out.
    for name in ["?.Crowded", "__main__.Roomy"] {
        let row = types.iter().find(|t| t["name"] == name).unwrap_or_else(|| panic!("no row named {name}"));
        assert_eq!(row["count"], CROWDED, "{row}");
    }
    assert!(types.iter().all(|t| t["name"] != "Crowded"), "Crowded shown as if a builtin");

    // The table: no escape character, no bidi control, and the escaped
    // form, bounded.
    let (code, table, stderr) = run_tracer(&["heap", "--pid", &pid, "--stop", "--top", "1000"]);
    assert_eq!(code, Some(0), "{stderr}");
    for bad in ['\x1b', '\u{202e}', '\u{2066}', '\u{9b}'] {
        assert!(!table.contains(bad), "the table holds {bad:?} raw:\n{table}");
    }
    let shown: String = bounded
        .replace('\\', "\\\\")
        .replace('\x1b', "\\x1b")
        .replace('\u{202e}', "\\u{202e}")
        .replace('\u{2066}', "\\u{2066}");
    let line = table.lines().find(|l| l.ends_with(&format!("  {shown}"))).unwrap_or_else(|| {
        panic!("no line ends with the escaped name {shown:?}:\n{}", table.chars().take(4000).collect::<String>())
    });
    assert!(line.contains("\\x1b[31mRED\\u{202e}evil\\u{2066}xxx"), "{line}");
    assert!(line.chars().count() < MAX_NAME + 60, "a bounded line: {} characters", line.chars().count());
    assert!(table.lines().all(|l| l.chars().count() < 2 * MAX_NAME), "every line is bounded");
    drop(workload);
}

#[test]
fn a_hostile_type_name_is_escaped_and_bounded_in_the_census() {
    census_of(&shared_python());
}

#[test]
fn a_hostile_type_name_is_escaped_and_bounded_in_the_census_3_13() {
    census_of(Path::new("/root/.pyenv/versions/3.13.0/bin/python3"));
}

/// `tracer attach --types --stacks --folded`: the type's name in the
/// `--types` table, the function's in the sites table and the folded
/// lines, escaped and bounded.
#[test]
fn hostile_names_are_escaped_in_the_types_and_stacks_tables_and_folded_lines() {
    require_root();
    let python = shared_python();
    let workload = Workload::script(None, &python.display().to_string(), "hostile.py", &["loop"]);
    let pid = workload.pid().to_string();
    let folded = std::env::temp_dir().join(format!("tracer-hostile-{}.folded", std::process::id()));
    let folded_arg = folded.display().to_string();
    let args = ["attach", "--exact", "--pid", &pid, "--types", "--stacks", "--duration", "2", "--folded", &folded_arg];
    let (code, table, stderr) = run_tracer(&args);
    let lines = std::fs::read_to_string(&folded);
    let _ = std::fs::remove_file(&folded);
    drop(workload);
    assert_eq!(code, Some(0), "tracer {args:?}: {stderr}");
    let lines = lines.expect("the folded file");
    for (what, text) in [("table", &table), ("folded lines", &lines)] {
        for bad in ['\x1b', '\u{202e}', '\u{2066}'] {
            assert!(!text.contains(bad), "the {what} hold {bad:?} raw");
        }
        assert!(text.lines().all(|l| l.chars().count() < 4 * MAX_NAME), "every line of the {what} is bounded");
    }
    let escaped = "Evil\\x1b[31mRED\\u{202e}evil\\u{2066}xxx";
    // The type, by its qualified name; the function, by its own.
    let type_row = format!("__main__.{escaped}");
    assert!(table.lines().any(|l| l.contains(&type_row)), "no --types row names {type_row}:\n{table}");
    let site = table.lines().find(|l| l.trim_start().starts_with(escaped) && l.contains("hostile.py:"));
    assert!(site.is_some(), "no site row names {escaped}:\n{table}");
    let cut =
        format!("{}{CUT} (hostile.py:", "x".repeat(MAX_NAME - "Evil\x1b[31mRED\u{202e}evil\u{2066}".chars().count()));
    assert!(
        lines.lines().any(|l| l.contains(escaped) && l.contains(&cut)),
        "no folded frame {escaped}…{cut}:\n{lines}"
    );
}

/// Objects forged with ctypes: blocks naming a wild type pointer, and a
/// type object copied with its name pointing at 100,000 bytes with no end
/// and an instance size of 2^40, with blocks naming it. The census reads
/// all of it and stops where it should: it exits 0, every forged block is
/// refused and counted (at least one refusal per block), no listed type
/// holds more bytes than the process has, every name is bounded, and the
/// target goes on, unharmed.
#[test]
fn forged_headers_and_types_are_refused_and_counted() {
    require_root();
    let n: u64 = 1_000;
    let python = shared_python();
    let mut workload = Workload::script(None, &python.display().to_string(), "forged.py", &[&n.to_string()]);
    let pid = workload.pid().to_string();
    for stop in [false, true] {
        let mut args = vec!["heap", "--pid", &pid, "--json"];
        if stop {
            args.push("--stop");
        }
        let (code, stdout, stderr) = run_tracer(&args);
        assert_eq!(code, Some(0), "{stderr}");
        let census: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON: {e}: {stdout}"));
        let rejected: u64 = census["rejected"].as_object().expect("rejected").values().filter_map(Value::as_u64).sum();
        assert!(rejected >= 2 * n, "{} refusals for {} forged blocks: {}", rejected, 2 * n, census["rejected"]);
        assert!(census["rejected"]["not_a_type"].as_u64().is_some_and(|r| r >= n), "{}", census["rejected"]);
        let rss = census["rss"].as_u64().expect("rss");
        let types = census["types"].as_array().expect("types");
        for t in types {
            let name = t["name"].as_str().expect("name");
            assert!(name.chars().count() <= MAX_NAME + 1, "an unbounded name: {} characters", name.chars().count());
            assert!(t["bytes"].as_u64().is_some_and(|b| b <= rss), "{t} holds more than the RSS {rss}");
            assert!(!name.starts_with("AAAAAAAA"), "the forged type counted: {}", &name[..40]);
        }
    }
    workload.ping();
    workload.close();
}

/// `tracer stack`: a thread parked in a function named by NAME, in a file
/// whose name is not UTF-8 (a lone surrogate in `co_filename`, as Python
/// decodes such a path). The table shows the name escaped and bounded and
/// the surrogate as U+FFFD; the JSON keeps the name raw but bounded. Both
/// once failed: the table printed the escapes raw, and the surrogate made
/// the whole thread "cannot read its frames" (exit status 1).
#[test]
fn hostile_names_are_escaped_in_tracer_stack() {
    require_root();
    let python = shared_python();
    let workload = Workload::script(None, &python.display().to_string(), "hostile.py", &["loop"]);
    let pid = workload.pid().to_string();
    let (code, table, stderr) = run_tracer(&["stack", "--pid", &pid]);
    assert_eq!(code, Some(0), "{stderr}\n{table}");
    for bad in ['\x1b', '\u{202e}', '\u{2066}'] {
        assert!(!table.contains(bad), "the table holds {bad:?} raw");
    }
    assert!(table.lines().all(|l| l.chars().count() < 2 * MAX_NAME), "every line is bounded");
    let escaped = "Evil\\x1b[31mRED\\u{202e}evil\\u{2066}";
    let cut = format!("{}{CUT}", "x".repeat(MAX_NAME - "Evil\x1b[31mRED\u{202e}evil\u{2066}".chars().count()));
    let frame = format!("    {escaped}{cut} (/tmp/not-utf8-\u{fffd}.py:");
    assert!(table.lines().any(|l| l.starts_with(&frame)), "no frame {frame}…:\n{table}");

    let (code, stdout, stderr) = run_tracer(&["stack", "--pid", &pid, "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    let stacks: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON: {e}: {stdout}"));
    let frames: Vec<&Value> = stacks["threads"]
        .as_array()
        .expect("threads")
        .iter()
        .flat_map(|t| t["frames"].as_array().unwrap_or_else(|| panic!("a thread with no frames: {t}")))
        .collect();
    let bounded: String = name().chars().take(MAX_NAME).chain([CUT]).collect();
    let parked = frames.iter().find(|f| f["function"] == bounded.as_str()).expect("the parked frame");
    assert_eq!(parked["file"], "/tmp/not-utf8-\u{fffd}.py", "{parked}");
    drop(workload);
}

/// An unlucky target: 200 threads allocating at once, traced with
/// `--stacks`. The stacks are read before the counts, so no interval
/// and not the summary says more events had a stack than were counted
/// (read the other way round, each showed about 0.1% more).
#[test]
fn two_hundred_threads_never_show_more_stacks_than_events() {
    require_root();
    let python = shared_python();
    let mut workload = Workload::script(None, &python.display().to_string(), "churn_threads.py", &["200"]);
    let pid = workload.pid().to_string();
    workload.go();
    let args = ["attach", "--exact", "--pid", &pid, "--stacks", "--json", "--duration", "4"];
    let (code, stdout, stderr) = run_tracer(&args);
    workload.tell("stop");
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).expect("JSON")).collect();
    let snapshots: Vec<&Value> = lines.iter().filter(|l| l["type"] == "interval" || l["type"] == "summary").collect();
    assert!(snapshots.len() >= 3, "{stdout}");
    for s in &snapshots {
        let c = &s["stack_coverage"];
        let (stacked, events) = (c["stacked"].as_u64().expect("stacked"), c["events"].as_u64().expect("events"));
        assert!(events > 0 && stacked <= events, "{stacked} stacks of {events} events: {c}");
    }
    let summary = snapshots.last().expect("summary");
    let mut by_probe = std::collections::BTreeMap::<String, u64>::new();
    for s in summary["stacks"].as_array().expect("stacks") {
        *by_probe.entry(s["probe"].as_str().expect("probe").to_owned()).or_default() += s["calls"].as_u64().unwrap();
    }
    for (probe, stacked) in by_probe {
        let calls = summary["probes"][&probe]["calls"].as_u64().expect("calls");
        assert!(stacked <= calls, "{probe}: {stacked} stacks of {calls} calls");
    }
}

/// An interpreter at a path that holds an escape and a bidi control (the
/// target's to choose: its maps name it). Every header, note and line
/// that names it shows it escaped: `probes`, `attach`'s header and its
/// gc line once printed it raw.
#[test]
fn an_interpreter_at_a_hostile_path_is_named_escaped() {
    require_root();
    let dir = std::env::temp_dir().join(format!("tracer-\x1b[31mhostile\u{202e}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let python = dir.join("python3.11");
    std::fs::copy(static_python(), &python).expect("a copy of the interpreter");
    let workload = Workload::script(None, python.to_str().expect("UTF-8"), "hostile.py", &[]);
    let pid = workload.pid().to_string();
    let runs: [&[&str]; 4] = [
        &["probes", "--pid", &pid],
        &["stack", "--pid", &pid],
        &["heap", "--pid", &pid, "--top", "1"],
        &["attach", "--pid", &pid, "--exact", "--duration", "1"],
    ];
    for args in runs {
        let (code, out, err) = run_tracer(args);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        let all = format!("{out}{err}");
        assert!(!all.contains('\x1b') && !all.contains('\u{202e}'), "{args:?} shows the path raw:\n{all}");
        assert!(all.contains("tracer-\\x1b[31mhostile\\u{202e}-"), "{args:?}: no escaped path:\n{all}");
    }
    drop(workload);
    let _ = std::fs::remove_dir_all(&dir);
}
