//! `--returns`: every allocating function's return value is read, once per
//! call, and read right: the wrapping sum of the pointers tracer saw equals
//! the sum of the pointers the workload got back.

use std::path::Path;

use tracer_tests::{
    API_SIZES, Aslr, Body, Exit, TracerRun, Workload, attached_probes, require_root, shared_python, static_python,
};

const N: u64 = 200;

/// Runs the pointer-recording ctypes body under `tracer --returns` and
/// checks it. `exclusive` names the functions nothing but the body calls in
/// this build (each must count exactly N calls).
fn check(python: &Path, extra: &[&str], exclusive: &[&str]) {
    require_root();
    let mut workload = Workload::once(python, N, Body::ApiPointers, Exit::Immediate, Aslr::On);
    workload.wait_blocked_on_stdin();
    let mut args = vec!["--interval", "3600", "--returns"];
    args.extend_from_slice(extra);
    let (tracer, attached) = TracerRun::attach_json(workload.pid(), &args);
    let allocating: Vec<String> = API_SIZES
        .iter()
        .flat_map(|(family, ..)| ["Malloc", "Calloc", "Realloc"].map(|k| format!("{family}{k}")))
        .collect();
    let probes = attached_probes(&attached);
    for name in &allocating {
        assert!(probes.contains(name), "{name} not attached: {attached}");
        let how = attached["returns"][name]["how"].as_str().unwrap_or_else(|| panic!("no return plan for {name}"));
        assert!(how == "uretprobe" || how == "sites", "{name}: {how}");
    }
    // The three ways were timed at start, each checked against the values
    // it read (calibration fails loudly otherwise). A ret is single-stepped;
    // a jmp into the epilogue is emulated.
    let costs = &attached["return_costs_ns"];
    let ns = |k: &str| costs[k].as_f64().unwrap_or_else(|| panic!("return_costs_ns.{k}: {costs}"));
    assert!(ns("uretprobe") > 0.0 && ns("placed") > 0.0 && ns("ret") > ns("placed"), "{costs}");
    // Functions that return no pointer get no return probe.
    assert!(attached["returns"].get("_Py_NewReference").is_none());
    workload.go();
    // Stop tracing once the loop is done and the workload waits again (a
    // read of 4 bytes, where the first wait read 3), before it sums its
    // pointers (which allocates).
    workload.wait_blocked_reading(Some(4));
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "{status}: {stderr}");
    workload.go();
    let sums = workload.finish_with_sums();
    let summary = lines.last().expect("summary");
    for (name, value) in tracer_tests::misses(summary) {
        assert_eq!(value, 0, "BPF stat {name} is non-zero: {summary}");
    }
    let mut compared = 0;
    for name in &allocating {
        let p = &summary["probes"][name];
        let calls = p["calls"].as_u64().expect("calls");
        let returned = &p["returned"];
        assert_eq!(returned["returns"].as_u64(), Some(calls), "{name}: one return per call: {p}");
        assert_eq!(returned["null"], 0, "{name}: no allocation failed: {p}");
        if exclusive.contains(&name.as_str()) {
            assert_eq!(calls, N, "{name}: only the body calls it: {p}");
        }
        // Where the body made every call in the window, tracer saw exactly
        // the pointers the workload got.
        if calls == N {
            assert_eq!(returned["pointer_sum"].as_u64(), Some(sums[name]), "{name}: pointers read wrong: {p}");
            compared += 1;
        }
    }
    assert!(compared >= exclusive.len(), "compared {compared} functions");
    // A probe without return probes reports no `returned`.
    assert!(summary["probes"]["_Py_NewReference"].get("returned").is_none());
}

/// In pyenv's libpython the interpreter also calls `PyObject_Malloc`,
/// `PyObject_Realloc`, `PyMem_RawMalloc` and `PyMem_RawRealloc` itself
/// (ctypes' argument objects, the readline around the loop).
const SHARED_EXCLUSIVE: &[&str] =
    &["PyObject_Calloc", "PyMem_Malloc", "PyMem_Calloc", "PyMem_Realloc", "PyMem_RawCalloc"];

#[test]
fn shared_returns_read_every_pointer() {
    check(&shared_python(), &[], SHARED_EXCLUSIVE);
}

#[test]
fn shared_returns_through_perf_uprobes() {
    check(&shared_python(), &["--links", "perf"], SHARED_EXCLUSIVE);
}

/// In the LTO build the interpreter calls its allocators through inlined
/// copies, whose returns no probe reads; with `--no-inlined`, only the
/// body goes through the exported functions, whose every return is read.
#[test]
fn static_returns_read_every_pointer() {
    let all: Vec<String> = API_SIZES
        .iter()
        .flat_map(|(family, ..)| ["Malloc", "Calloc", "Realloc"].map(|k| format!("{family}{k}")))
        .collect();
    check(&static_python(), &["--no-inlined"], &all.iter().map(String::as_str).collect::<Vec<_>>());
}
