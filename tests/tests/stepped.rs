//! A probe with sites of both kinds (an entry the kernel single-steps and
//! inlined copies it emulates, or the other way round) counts its hits at
//! the single-stepped ones apart (`stepped_hits`), so that its cost is
//! priced hit by hit: exactly the hits its single-stepped sites took.

use std::path::Path;

use serde_json::Value;

use tracer_tests::{Aslr, Body, Exit, TracerRun, Workload, require_root, static_python};

const N: u64 = 200;

/// The summary of `workload.py once n` with the api body on Debian's 3.11,
/// traced exactly with `extra`, inside the functions (by default exact
/// tracing takes `_Py_Dealloc`'s call sites, all emulated).
fn summary(python: &Path, n: u64, extra: &[&str]) -> Value {
    let mut workload = Workload::once(python, n, Body::Api, Exit::Immediate, Aslr::Off);
    workload.wait_blocked_on_stdin();
    let mut args = vec!["--interval", "3600", "--placement", "inside"];
    args.extend_from_slice(extra);
    let (tracer, _) = TracerRun::attach_json(workload.pid(), &args);
    workload.go();
    workload.finish();
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "{stderr}");
    let summary = lines.last().expect("a summary").clone();
    assert_eq!(summary["end"], "target-exit", "{summary}");
    summary
}

fn field(summary: &Value, probe: &str, name: &str) -> u64 {
    summary["probes"][probe][name].as_u64().unwrap_or(0)
}

/// `_Py_Dealloc`'s entry is single-stepped (a `mov`) and most of its
/// copies are emulated; `PyMem_Malloc`'s entry is emulated (its `js`) and
/// one copy is not. The api body calls each allocator function through
/// ctypes, at its entry: N more iterations are N more `PyMem_Malloc` hits
/// at its emulated entry and none at a single-stepped site, and as many
/// more single-stepped `_Py_Dealloc` hits as `--no-inlined` (its entry
/// alone) counts calls more.
#[test]
fn hits_at_single_stepped_sites_are_counted_apart_exactly() {
    require_root();
    let python = static_python();
    let (one, two) = (summary(&python, N, &[]), summary(&python, 2 * N, &[]));
    let more = |probe: &str, name: &str| field(&two, probe, name).checked_sub(field(&one, probe, name));
    // Probes of one kind have none; a probe of both never more than its
    // hits.
    for (name, p) in two["probes"].as_object().expect("probes") {
        let stepped = p["stepped_hits"].as_u64().unwrap_or(0);
        let hits = p["calls"].as_u64().unwrap_or(0) + p["gate_other"].as_u64().unwrap_or(0);
        assert!(stepped <= hits, "{name}: {p}");
        if ["PyObject_Free", "PyObject_Malloc", "_Py_NewReference"].contains(&name.as_str()) {
            assert!(p["stepped_hits"].is_null(), "{name}: every site emulated: {p}");
        }
    }
    assert_eq!(more("PyMem_Malloc", "stepped_hits"), Some(0), "at its emulated entry: {one}\n{two}");
    assert!(more("PyMem_Malloc", "calls").is_some_and(|c| c >= N), "{one}\n{two}");
    let entry_one = summary(&python, N, &["--no-inlined"]);
    let entry_two = summary(&python, 2 * N, &["--no-inlined"]);
    let at_entry = field(&entry_two, "_Py_Dealloc", "calls").checked_sub(field(&entry_one, "_Py_Dealloc", "calls"));
    assert!(at_entry.is_some_and(|c| c >= N), "the body deallocates at the entry: {entry_one}\n{entry_two}");
    assert!(entry_two["probes"]["_Py_Dealloc"]["stepped_hits"].is_null(), "its entry alone: one kind");
    assert_eq!(more("_Py_Dealloc", "stepped_hits"), at_entry, "{one}\n{two}");
    // The cost's hits (those priced, and those of a process that ended
    // before its CPU time was read again) are the calls and gates' other
    // passes of every probe.
    let hits: u64 = two["probes"]
        .as_object()
        .expect("probes")
        .values()
        .map(|p| p["calls"].as_u64().unwrap_or(0) + p["gate_other"].as_u64().unwrap_or(0))
        .sum();
    let cost = &two["cost"];
    // (`unpriced_hits` is left out where 0.)
    let unpriced = cost["unpriced_hits"].as_u64().unwrap_or(0);
    assert_eq!(cost["hits"].as_u64().map(|h| h + unpriced), Some(hits), "{cost}");
}
