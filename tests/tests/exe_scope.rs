//! `tracer attach --exe`: every process of an interpreter, including ones
//! started after attach, counted per PID and in total, exactly.

use std::{collections::HashMap, path::Path};

use tracer_tests::{
    API_SIZES, Aslr, Body, Exit, TracerRun, Workload, counts, per_pid, require_root, run_tracer, shared_python,
    static_python,
};

type Counts = HashMap<String, (u64, u64)>;

/// Three processes started after attach run N, 2N and 3N iterations of the
/// ctypes body. Each is counted from its first instruction to its
/// `os._exit`, so the second differs from the first exactly as the third
/// differs from the second, by a whole number of calls and bytes per
/// iteration, at least the body's own; and the totals are exactly the
/// per-PID sums. (`exact_counts` pins the per-iteration figures themselves.)
fn check(python: &Path) {
    const N: u64 = 100;
    require_root();
    let exe = python.to_str().expect("utf-8 path");
    let (tracer, attached) = TracerRun::attach_json_with(&["--exe", exe, "--interval", "3600"]);
    assert!(attached["pid"].is_null(), "{attached}");
    assert!(attached["exe"].as_str().is_some(), "{attached}");
    let mut pids = Vec::new();
    for k in 1..=3 {
        // Without ASLR, interpreter startup allocates the same in every run.
        let mut w = Workload::once(python, k * N, Body::Api, Exit::Immediate, Aslr::Off);
        pids.push(w.pid());
        w.go();
        w.finish();
    }
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "{stderr}");
    let summary = lines.last().expect("summary");
    assert_eq!(summary["end"], "signal");
    let by_pid = per_pid(summary);
    let totals = counts(summary);
    // Totals are the sum over every PID (other processes running this
    // interpreter on the machine would appear too, and count in both).
    for (name, (calls, bytes)) in &totals {
        let sum = by_pid.values().fold((0, 0), |acc, c| (acc.0 + c[name].0, acc.1 + c[name].1));
        assert_eq!((*calls, *bytes), sum, "{name}: totals are not the sum of the PIDs");
    }
    for pid in &pids {
        assert!(by_pid.contains_key(pid), "PID {pid} missing; reported: {:?}", by_pid.keys());
    }
    let c: Vec<&Counts> = pids.iter().map(|p| &by_pid[p]).collect();
    for (family, malloc, (nelem, elsize), realloc) in API_SIZES {
        for (name, bytes) in [
            (format!("{family}Calloc"), nelem * elsize),
            (format!("{family}Realloc"), realloc),
            (format!("{family}Malloc"), malloc),
        ] {
            let d1 = (c[1][&name].0 - c[0][&name].0, c[1][&name].1 - c[0][&name].1);
            let d2 = (c[2][&name].0 - c[1][&name].0, c[2][&name].1 - c[1][&name].1);
            assert_eq!(d1, d2, "{name}: N more iterations counted differently");
            assert!(d1.0 >= N && d1.1 >= N * bytes, "{name}: {d1:?} for {N} iterations of {bytes} bytes");
            assert_eq!(d1.0 % N, 0, "{name}");
            assert_eq!(d1.1 % N, 0, "{name}");
        }
    }
}

#[test]
fn shared_python_processes_started_after_attach_are_counted_exactly() {
    check(&shared_python());
}

#[test]
fn static_python_processes_started_after_attach_are_counted_exactly() {
    check(&static_python());
}

#[test]
fn exe_bad_input() {
    require_root();
    let (code, stdout, stderr) = run_tracer(&["attach", "--exe", "/no/such/python"]);
    assert_eq!(
        stderr,
        "tracer: error: /no/such/python does not exist; pass the path of a CPython executable (e.g. $(command -v python3))\n"
    );
    assert_eq!((code, stdout.as_str()), (Some(2), ""));
    let (code, _, stderr) = run_tracer(&["attach", "--exe", "/usr/bin/sleep"]);
    assert_eq!(
        stderr,
        "tracer: error: /usr/bin/sleep is not a CPython executable: it neither defines CPython's symbols nor links a libpython; pass the interpreter itself (e.g. python3.11), not a wrapper script\n"
    );
    assert_eq!(code, Some(2));
}
