//! Targets in another root file system, as containers run them: Debian's
//! LTO python3.14 from the forky root, under `chroot` and in its own mount
//! and PID namespaces, traced by its host PID with exact counts.

use std::collections::HashMap;

use tracer_tests::{API_SIZES, Body, Exit, Isolation, TracerRun, Workload, counts, forky_root, require_root};

type Counts = HashMap<String, (u64, u64)>;

/// Runs the ctypes body N times in the forky root's python3.14 under
/// tracer; returns the attach line and the summary's counts.
fn traced_run(n: u64, isolation: Isolation) -> (serde_json::Value, Counts) {
    let root = forky_root();
    let mut workload = Workload::once_in_root(&root, "/usr/bin/python3.14", n, Body::Api, Exit::Immediate, isolation);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid();
    let (tracer, attached) = TracerRun::attach_json(pid, &["--interval", "3600", "--probes", "alloc"]);
    workload.go();
    workload.finish();
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "tracer failed: {status}: {stderr}");
    let summary = lines.last().expect("a summary line");
    assert_eq!(summary["end"], "target-exit", "{summary}");
    for (name, value) in summary["stats"].as_object().expect("stats") {
        assert_eq!(value, 0, "BPF stat {name} is non-zero: {summary}");
    }
    (attached, counts(summary))
}

/// Per-iteration counts of every allocator function from runs of N and 2N
/// iterations, checked to be whole and to cover the body's own calls.
fn per_iteration(isolation: Isolation) -> Counts {
    const N: u64 = 100;
    let (attached, one) = traced_run(N, isolation);
    let (_, two) = traced_run(2 * N, isolation);
    let image = attached["python"]["image"].as_str().expect("image");
    assert!(image.ends_with("/usr/bin/python3.14"), "{attached}");
    assert!(attached["python"]["version"].as_str().is_some_and(|v| v.starts_with("3.14.")), "{attached}");
    match isolation {
        Isolation::Chroot => assert!(attached.get("pid_in_namespace").is_none(), "{attached}"),
        Isolation::Namespaces => assert_eq!(attached["pid_in_namespace"], 1, "{attached}"),
    }
    let mut per = HashMap::new();
    for (name, (c1, b1)) in &one {
        let (c2, b2) = two[name];
        let (dc, db) = (c2 - c1, b2 - b1);
        assert_eq!((dc % N, db % N), (0, 0), "{name}: {dc} calls and {db} bytes more for {N} more iterations");
        per.insert(name.clone(), (dc / N, db / N));
    }
    for (family, malloc, (nelem, elsize), realloc) in API_SIZES {
        for (name, bytes) in [
            (format!("{family}Malloc"), malloc),
            (format!("{family}Calloc"), nelem * elsize),
            (format!("{family}Realloc"), realloc),
        ] {
            let (calls, total) = per[&name];
            assert!(
                calls >= 1 && total >= bytes,
                "{name}: {calls} calls and {total} bytes per iteration, want at least 1 and {bytes}"
            );
        }
    }
    per
}

/// A chrooted process's image is reached as the file its maps name (a
/// host path), not through its root a second time; a process in its own
/// namespaces is reached through its root, and its PID there is reported.
/// Both count exactly what the same body makes them do.
#[test]
fn chroot_and_namespaces_count_alike() {
    require_root();
    let chroot = per_iteration(Isolation::Chroot);
    let namespaces = per_iteration(Isolation::Namespaces);
    assert_eq!(chroot, namespaces);
}
