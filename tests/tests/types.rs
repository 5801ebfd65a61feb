//! `--types`: every new reference is counted under its object's type, on
//! every build: the object read at the function's entry (pyenv's plain
//! builds), where the DWARF puts `op` at each inlined copy (Debian's LTO
//! builds with their debug info), and where the slow path passes it at each
//! read of the guard (the same builds without). A workload creates N
//! `Leaky` and N `Temp` objects, keeps the `Leaky` ones and drops the
//! `Temp` ones; exactly N of each are counted, and 2N for 2N, under their
//! qualified names (`__main__.Leaky`), with N `Leaky` live and N `Temp`
//! destroyed, none live, where the object domain's free sees them.

use std::path::Path;

use serde_json::Value;
use tracer_tests::{
    Body, Exit, Isolation, TracerRun, Workload, forky_root, require_root, run_tracer, shared_python, static_python,
};

/// The script's classes, as tracer names them.
const LEAKY: &str = "__main__.Leaky";
const TEMP: &str = "__main__.Temp";

/// What one run showed: the attached line, the first interval that holds
/// every creation (read while the workload still holds its `Leaky`
/// objects) and the summary (after the workload's exit, whose
/// finalisation frees them).
struct Traced {
    attached: Value,
    interval: Value,
    summary: Value,
}

/// Runs the types body `n` times in `workload` under `tracer --types`. The
/// names are read while the workload waits after "done", as they are while
/// a real target runs.
fn traced(mut workload: Workload, n: u64) -> Traced {
    workload.wait_blocked_on_stdin();
    let (tracer, attached) = TracerRun::attach_json(workload.pid(), &["--types", "--interval", "0.1"]);
    workload.go();
    workload.expect("done");
    // An interval read after "done" holds every creation, and their names.
    let named = |line: &Value| {
        line["types"].as_array().is_some_and(|types| {
            [LEAKY, TEMP].iter().all(|name| types.iter().any(|t| t["name"] == *name && t["created"] == n))
        })
    };
    let mut interval = Value::Null;
    for _ in 0..600 {
        let line = tracer.stdout.next_line("an interval").expect("tracer printed an interval");
        let line: Value = serde_json::from_str(&line).expect("JSON");
        // Notes (pyenv 3.13's GC caveat) come between the intervals.
        assert!(line["type"] == "interval" || line["type"] == "note", "{line}");
        if named(&line) {
            interval = line;
            break;
        }
    }
    assert_eq!(interval["type"], "interval", "no interval holds {n} {LEAKY} and {TEMP}");
    workload.close();
    let summary = tracer.summary();
    no_type_misses(&summary);
    Traced { attached, interval, summary }
}

/// Fails if the summary counts any miss of the types programs.
fn no_type_misses(summary: &Value) {
    for stat in ["type_unread", "types_full", "map_full", "arg_missing", "objects_full", "free_arg_missing"] {
        assert_eq!(summary["stats"][stat], 0, "{stat}: {summary}");
    }
}

/// `name`'s (created, destroyed, reused, live) in a line's types.
fn counts(line: &Value, name: &str) -> (u64, u64, u64, u64) {
    let types = line["types"].as_array().unwrap_or_else(|| panic!("no types in {line}"));
    let t = types.iter().find(|t| t["name"] == name).unwrap_or_else(|| panic!("no {name} in {line}"));
    assert!(t.get("unresolved").is_none(), "{t}");
    let field = |f: &str| t[f].as_u64().unwrap_or_else(|| panic!("no {f} in {t}"));
    (field("created"), field("destroyed"), field("reused"), field("live"))
}

/// N and 2N runs of the workload `start` makes give exactly N and 2N
/// `Leaky` and `Temp`, the `Leaky` ones all live and the `Temp` ones all
/// destroyed; `coverage` checks `_Py_NewReference`'s coverage, and `free`
/// `PyObject_Free`'s.
///
/// With `every_free_seen`, every Temp is destroyed at a probed free.
fn exact(start: impl Fn(u64) -> Workload, coverage: impl Fn(&Value), free: impl Fn(&Value), every_free_seen: bool) {
    let n = 1000;
    for runs in [n, 2 * n] {
        let Traced { attached, interval, summary } = traced(start(runs), runs);
        coverage(&attached["coverage"]["_Py_NewReference"]);
        free(&attached["coverage"]["PyObject_Free"]);
        // While the workload holds them: every Leaky live.
        assert_eq!(counts(&interval, LEAKY), (runs, 0, 0, runs), "{interval}");
        let (created, destroyed, reused, live) = counts(&interval, TEMP);
        assert_eq!(created, runs, "{interval}");
        assert_eq!(destroyed + reused + live, created, "{interval}");
        let free = &attached["coverage"]["PyObject_Free"];
        if all_but_other_entries(free) && every_free_seen {
            // Every Temp destroyed (by its tp_free, PyObject_GC_Del,
            // through PyObject_Free), none reused.
            assert_eq!((destroyed, reused, live), (runs, 0, 0), "{interval}");
            // After the exit, whose finalisation freed the list of Leaky
            // objects and them: every Leaky destroyed too.
            assert_eq!(counts(&summary, LEAKY), (runs, runs, 0, 0), "{summary}");
        } else if free["source"].as_str().is_some_and(|s| s.contains("/usr/lib/debug/")) {
            // The DWARF shows the pointer at (all but one of) the copies,
            // but not at every other entry found in the code (python3.14's
            // PyObject_GC_Del, when the young generation's count is 0,
            // after a collection): a Temp freed there is seen dead when the
            // next one reuses its memory.
            assert_eq!(live, 0, "{interval}");
        } else {
            // Without debug info, the copies inlined in PyObject_GC_Del do
            // not show the pointer: the Temp objects are seen dead only
            // when the next one reuses their memory, which coverage says.
            assert!(reused > destroyed, "{interval}");
        }
        // The types are sorted, most created first.
        let counts: Vec<u64> =
            summary["types"].as_array().expect("types").iter().map(|t| t["created"].as_u64().unwrap_or(0)).collect();
        assert!(counts.windows(2).all(|w| w[0] >= w[1]), "{counts:?}");
    }
}

/// Whether every copy's type is counted, but at the other entries tracer
/// found in the code (discover/entries.rs) where the DWARF gives no
/// location for the object: those calls are counted, their types not, and
/// coverage says how many.
fn all_but_other_entries(c: &Value) -> bool {
    if c["types"] == "complete" {
        return true;
    }
    let unknown: Option<u64> = c["reason"]
        .as_str()
        .and_then(|r| r.split(" shows where the ").nth(1))
        .and_then(|r| r.split(" is at ").nth(1))
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok());
    let other = c["other_entries"].as_u64().unwrap_or(0);
    c["types"] == "partial" && unknown.is_some_and(|n| n > 0 && n <= other)
}

fn complete(c: &Value) {
    assert!(all_but_other_entries(c), "{c}");
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
            |c| {
                complete(c);
                assert_eq!(c["inlined"], 0, "{c}");
            },
            true,
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
        // Every inlined copy of PyObject_Free shows its pointer.
        |c| {
            complete(c);
            assert!(c["inlined_probed"].as_u64().unwrap_or(0) > 0, "{c}");
        },
        true,
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
        // Without DWARF, the copies of PyObject_Free found by their read of
        // the allocator slot do not show the pointer: destructions there
        // are not counted, and coverage says so.
        |c| {
            assert_eq!(c["calls"], "complete", "{c}");
            if c["inlined_probed"].as_u64().unwrap_or(0) > 0 {
                assert_eq!(c["types"], "partial", "{c}");
                assert!(c["reason"].as_str().is_some_and(|r| r.contains("where the freed pointer is")), "{c}");
            }
        },
        false,
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
            |c| {
                assert!(c["source"].as_str().is_some_and(|s| s.contains("/usr/lib/debug/.build-id/")), "{c}");
                assert_eq!(c["calls"], "complete", "{c}");
                // python3.14's DWARF shows the pointer at every copy;
                // python3.13's at all but one, which its coverage says.
                if python == "python3.14" {
                    complete(c);
                } else if c["types"] == "partial" {
                    assert!(c["reason"].as_str().is_some_and(|r| r.contains("where the freed pointer is")), "{c}");
                }
            },
            false,
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
        |c| assert_eq!(c["calls"], "complete", "{c}"),
        false,
    );
    let _ = std::fs::remove_file(&copy);
}

#[test]
fn the_table_lists_the_types_most_created() {
    require_root();
    let mut workload = Workload::once(&shared_python(), 5000, Body::Types, Exit::Finalize, tracer_tests::Aslr::On);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid().to_string();
    let tracer = TracerRun::start(&["attach", "--exact", "--pid", &pid, "--types", "--interval", "0.1"]);
    let mode = tracer.stdout.next_line("the mode line").expect("a mode line");
    assert!(mode.starts_with("tracer: exact tracing (chosen by --types, which only exact tracing serves): "), "{mode}");
    let header = tracer.stdout.next_line("the attach header").expect("a header");
    assert!(header.starts_with("tracer: attached to PID"), "{header}");
    workload.go();
    workload.expect("done");
    let mut seen = false;
    for _ in 0..2000 {
        let Some(line) = tracer.stdout.next_line("a table line") else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        // name, created, created/s, destroyed, reused, live
        if words.first() == Some(&LEAKY) && words.get(1) == Some(&"5,000") && words.get(5) == Some(&"5,000") {
            seen = true;
            break;
        }
    }
    workload.close();
    let mut tracer = tracer;
    let rest = tracer.stdout.rest("the table");
    let status = tracer.child.wait().expect("wait for tracer");
    assert!(status.success(), "tracer exited with {status}");
    assert!(seen, "no table line shows {LEAKY} created 5,000 times and 5,000 live");
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

/// One run of the floats body under `--types`: (floats
/// created, floats reused, object-domain allocator calls), from the summary
/// after the workload's exit.
fn floats(mut workload: Workload) -> (u64, u64, u64) {
    workload.wait_blocked_on_stdin();
    let (tracer, _attached) = TracerRun::attach_json(workload.pid(), &["--types", "--interval", "0.1"]);
    workload.go();
    workload.expect("done");
    // The workload waits until float is named in an interval: a type is
    // named from the target's memory while it runs.
    let mut named = false;
    for _ in 0..600 {
        let line = tracer.stdout.next_line("an interval").expect("tracer printed an interval");
        let line: Value = serde_json::from_str(&line).expect("JSON");
        if line["types"].as_array().is_some_and(|t| t.iter().any(|t| t["name"] == "float")) {
            named = true;
            break;
        }
    }
    assert!(named, "no interval named float");
    workload.close();
    let summary = tracer.summary();
    no_type_misses(&summary);
    let (created, _, reused, _) = counts(&summary, "float");
    let allocations = ["PyObject_Malloc", "PyObject_Calloc", "PyObject_Realloc"]
        .iter()
        .map(|f| summary["probes"][*f]["calls"].as_u64().unwrap_or_else(|| panic!("no {f} in {summary}")))
        .sum();
    (created, reused, allocations)
}

/// Starts a workload of N iterations.
type Start = dyn Fn(u64) -> Workload;

/// Issue 12's free-list check: a loop of float arithmetic makes far more
/// new references than allocator calls, and the reuse reported for float
/// is the difference, exactly, between N and 2N runs; on pyenv's 3.11 and
/// 3.13, Debian's 3.11 and the forky 3.14 with its debug info.
#[test]
fn float_arithmetic_is_served_from_the_free_list() {
    require_root();
    let n = 5000;
    let runs: Vec<(String, Box<Start>)> = vec![
        (
            "pyenv 3.11".into(),
            Box::new(|n| Workload::once(&shared_python(), n, Body::Floats, Exit::Finalize, tracer_tests::Aslr::On)),
        ),
        (
            "pyenv 3.13".into(),
            Box::new(|n| Workload::once(&pyenv("3.13.0"), n, Body::Floats, Exit::Finalize, tracer_tests::Aslr::On)),
        ),
        (
            "Debian 3.11".into(),
            Box::new(|n| Workload::once(&static_python(), n, Body::Floats, Exit::Finalize, tracer_tests::Aslr::On)),
        ),
        (
            "forky 3.14".into(),
            Box::new(|n| {
                Workload::once_in_root(&forky_root(), "python3.14", n, Body::Floats, Exit::Finalize, Isolation::Chroot)
            }),
        ),
    ];
    for (build, start) in &runs {
        let (c1, r1, a1) = floats(start(n));
        let (c2, r2, a2) = floats(start(2 * n));
        let (created, reused, allocations) = (c2 - c1, r2 - r1, a2.saturating_sub(a1));
        // One new float per iteration,
        assert_eq!(created, n, "{build}: floats created, N={n} vs 2N");
        // far more than the allocator calls,
        assert!(allocations * 10 < created, "{build}: {allocations} allocator calls for {created} floats");
        // and the reuse reported is the difference.
        assert_eq!(
            reused,
            created - allocations,
            "{build}: reused {reused}, created {created}, allocator calls {allocations}"
        );
    }
}
