//! `--types`: every new reference is counted under its object's type, on
//! every build: the object read at the function's entry (pyenv's plain
//! builds), where the DWARF puts `op` at each inlined copy (Debian's LTO
//! builds with their debug info), and where the slow path passes it at each
//! read of the guard (the same builds without). A workload creates N
//! `Leaky` and N `Temp` objects; exactly N of each are counted, and 2N for
//! 2N.

use std::path::Path;

use serde_json::Value;
use tracer_tests::{
    Body, Exit, Isolation, TracerRun, Workload, forky_root, require_root, run_tracer, shared_python, static_python,
};

/// Runs the types body `n` times in `workload` under `tracer --types`, and
/// returns the attached line and the summary. The names are read while the
/// workload waits after "done", as they are while a real target runs.
fn traced(mut workload: Workload, n: u64) -> (Value, Value) {
    workload.wait_blocked_on_stdin();
    let (tracer, attached) = TracerRun::attach_json(workload.pid(), &["--types", "--interval", "0.1"]);
    workload.go();
    workload.expect("done");
    // An interval read after "done" holds every creation, and their names.
    let named = |line: &Value| {
        line["types"].as_array().is_some_and(|types| {
            ["Leaky", "Temp"].iter().all(|name| types.iter().any(|t| t["name"] == *name && t["created"] == n))
        })
    };
    for _ in 0..600 {
        let line = tracer.stdout.next_line("an interval").expect("tracer printed an interval");
        let line: Value = serde_json::from_str(&line).expect("JSON");
        // Notes (pyenv 3.13's GC caveat) come between the intervals.
        assert!(line["type"] == "interval" || line["type"] == "note", "{line}");
        if named(&line) {
            break;
        }
    }
    workload.close();
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "tracer failed: {status}: {stderr}");
    let summary = lines.last().expect("a summary").clone();
    assert_eq!(summary["type"], "summary", "{lines:?}");
    for stat in ["type_unread", "types_full", "map_full", "arg_missing"] {
        assert_eq!(summary["stats"][stat], 0, "{stat}: {summary}");
    }
    (attached, summary)
}

/// The summary's creations of `name`.
fn created(summary: &Value, name: &str) -> u64 {
    let types = summary["types"].as_array().unwrap_or_else(|| panic!("no types in {summary}"));
    let t = types.iter().find(|t| t["name"] == name).unwrap_or_else(|| panic!("no {name} in {summary}"));
    assert!(t.get("unresolved").is_none(), "{t}");
    t["created"].as_u64().expect("a count")
}

/// N and 2N runs of the workload `start` makes give exactly N and 2N
/// `Leaky` and `Temp`; `coverage` checks `_Py_NewReference`'s coverage.
fn exact(start: impl Fn(u64) -> Workload, coverage: impl Fn(&Value)) {
    let n = 1000;
    for runs in [n, 2 * n] {
        let (attached, summary) = traced(start(runs), runs);
        coverage(&attached["coverage"]["_Py_NewReference"]);
        assert_eq!((created(&summary, "Leaky"), created(&summary, "Temp")), (runs, runs), "{summary}");
        // The types are sorted, most created first.
        let counts: Vec<u64> =
            summary["types"].as_array().expect("types").iter().map(|t| t["created"].as_u64().unwrap_or(0)).collect();
        assert!(counts.windows(2).all(|w| w[0] >= w[1]), "{counts:?}");
    }
}

fn complete(c: &Value) {
    assert_eq!(c["types"], "complete", "{c}");
}

fn pyenv(version: &str) -> std::path::PathBuf {
    let python = Path::new("/root/.pyenv/versions").join(version).join("bin/python3");
    assert!(python.is_file(), "{} is missing (see ../shared/TOOLCHAIN.md)", python.display());
    python
}

#[test]
fn plain_builds_count_each_type_exactly() {
    require_root();
    for python in [shared_python(), pyenv("3.12.1"), pyenv("3.13.0")] {
        exact(
            |n| Workload::once(&python, n, Body::Types, Exit::Finalize, tracer_tests::Aslr::On),
            |c| {
                complete(c);
                assert_eq!(c["inlined"], 0, "{c}");
            },
        );
    }
}

#[test]
fn debian_311_counts_each_type_at_every_inlined_copy() {
    require_root();
    let python = static_python();
    exact(
        |n| Workload::once(&python, n, Body::Types, Exit::Finalize, tracer_tests::Aslr::On),
        |c| {
            complete(c);
            assert!(c["inlined_probed"].as_u64().unwrap_or(0) > 200, "{c}");
        },
    );
}

#[test]
fn debian_311_without_debug_info_counts_each_type_through_guard_reads() {
    require_root();
    let copy = std::env::temp_dir().join(format!("tracer-types-nodbg-{}-python3.11", std::process::id()));
    let copy = tracer_tests::without_debug_info(&static_python(), &copy);
    exact(
        |n| Workload::once(&copy, n, Body::Types, Exit::Finalize, tracer_tests::Aslr::On),
        |c| {
            assert!(c["source"].as_str().is_some_and(|s| s.contains("reads of its guard")), "{c}");
            assert_eq!(c["calls"], "complete", "{c}");
            // Where the code does not show the object, the count of types says
            // so; the workload's own creations are all seen.
            if c["types"] == "partial" {
                let reason = c["reason"].as_str().expect("a reason");
                assert!(reason.contains("where the object is"), "{c}");
            } else {
                complete(c);
            }
        },
    );
    let _ = std::fs::remove_file(&copy);
}

#[test]
fn forky_lto_builds_count_each_type_with_their_dwarf() {
    require_root();
    let root = forky_root();
    for python in ["python3.13", "python3.14"] {
        exact(
            |n| Workload::once_in_root(&root, python, n, Body::Types, Exit::Finalize, Isolation::Chroot),
            |c| {
                assert!(c["source"].as_str().is_some_and(|s| s.contains("/usr/lib/debug/.build-id/")), "{c}");
                assert_eq!(c["calls"], "complete", "{c}");
            },
        );
    }
}

#[test]
fn forky_314_without_debug_info_counts_each_type_through_guard_reads() {
    require_root();
    let name = format!("tracer-types-nodbg-{}-python3.14", std::process::id());
    let root = forky_root();
    let copy = tracer_tests::without_debug_info(&root.join("usr/bin/python3.14"), &root.join("tmp").join(&name));
    let inside = format!("/tmp/{name}");
    exact(
        |n| Workload::once_in_root(&root, &inside, n, Body::Types, Exit::Finalize, Isolation::Chroot),
        |c| {
            assert!(c["source"].as_str().is_some_and(|s| s.contains("reads of its guard")), "{c}");
            assert_eq!(c["calls"], "complete", "{c}");
        },
    );
    let _ = std::fs::remove_file(&copy);
}

#[test]
fn the_table_lists_the_types_most_created() {
    require_root();
    let mut workload = Workload::once(&shared_python(), 5000, Body::Types, Exit::Finalize, tracer_tests::Aslr::On);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid().to_string();
    let tracer = TracerRun::start(&["attach", "--pid", &pid, "--types", "--interval", "0.1"]);
    let header = tracer.stdout.next_line("the attach header").expect("a header");
    assert!(header.starts_with("tracer: attached to PID"), "{header}");
    workload.go();
    workload.expect("done");
    let mut seen = false;
    for _ in 0..2000 {
        let Some(line) = tracer.stdout.next_line("a table line") else { break };
        if line.trim_start().starts_with("Leaky ") && line.split_whitespace().nth(1) == Some("5,000") {
            seen = true;
            break;
        }
    }
    workload.close();
    let mut tracer = tracer;
    let rest = tracer.stdout.rest("the table");
    let status = tracer.child.wait().expect("wait for tracer");
    assert!(status.success(), "tracer exited with {status}");
    assert!(seen, "no table line shows Leaky created 5,000 times");
    // The summary's table lists them too.
    assert!(rest.iter().any(|l| l.trim_start().starts_with("type (most created)")), "{rest:?}");
}

#[test]
fn types_refuse_what_they_cannot_count() {
    for (args, error) in [
        (
            &["attach", "--pid", "1", "--types", "--budget", "1"][..],
            "tracer: error: --budget cannot be combined with --types: type counts are not estimated from windows; use one or the other\n",
        ),
        (
            &["attach", "--pid", "1", "--types", "--probes", "alloc"][..],
            "tracer: error: --types counts the objects _Py_NewReference creates, which --probes alloc leaves out; use --probes default or refs, or add _Py_NewReference to the list\n",
        ),
        (
            &["attach", "--pid", "1", "--types", "--probes", "PyObject_Malloc"][..],
            "tracer: error: --types counts the objects _Py_NewReference creates, which --probes PyObject_Malloc leaves out; use --probes default or refs, or add _Py_NewReference to the list\n",
        ),
    ] {
        let (code, stdout, stderr) = run_tracer(args);
        assert_eq!((code, stdout.as_str(), stderr.as_str()), (Some(2), "", error), "{args:?}");
    }
}
