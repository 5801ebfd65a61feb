//! Targets in another root file system, as containers run them: Debian's
//! LTO python3.14 from the forky root, under `chroot` and in its own mount
//! and PID namespaces, traced by its host PID with exact counts.

use std::collections::HashMap;

use tracer_tests::{Body, Exit, Isolation, TracerRun, Workload, counts, forky_root, require_root};

type Counts = HashMap<String, (u64, u64)>;

/// Runs the ctypes body N times in the forky root's python3.14 under
/// tracer; returns the attach line and the summary's counts.
fn traced_run(n: u64, isolation: Isolation) -> (serde_json::Value, Counts) {
    let root = forky_root();
    let mut workload = Workload::once_in_root(&root, "/usr/bin/python3.14", n, Body::Api, Exit::Immediate, isolation);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid();
    let (tracer, attached) = TracerRun::attach_json(pid, &["--interval", "3600", "--probes", "alloc"]);
    for (name, c) in attached["coverage"].as_object().expect("coverage") {
        assert!(c["source"].as_str().is_some_and(|s| s.contains("/usr/lib/debug/.build-id/")), "{name}: {c}");
    }
    workload.go();
    workload.finish();
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "tracer failed: {status}: {stderr}");
    let summary = lines.last().expect("a summary line");
    assert_eq!(summary["end"], "target-exit", "{summary}");
    for (name, value) in tracer_tests::misses(summary) {
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
        Isolation::Namespaces | Isolation::Container => {
            assert_eq!(attached["pid_in_namespace"], 1, "{attached}");
        }
    }
    let mut per = HashMap::new();
    for (name, (c1, b1)) in &one {
        let (c2, b2) = two[name];
        let (dc, db) = (c2 - c1, b2 - b1);
        assert_eq!((dc % N, db % N), (0, 0), "{name}: {dc} calls and {db} bytes more for {N} more iterations");
        per.insert(name.clone(), (dc / N, db / N));
    }
    for (name, bytes) in tracer_tests::api_calls() {
        let (calls, total) = per[&name];
        assert!(
            calls >= 1 && total >= bytes,
            "{name}: {calls} calls and {total} bytes per iteration, want at least 1 and {bytes}"
        );
    }
    per
}

/// A chrooted process's image is reached as the file its maps name (a
/// host path), not through its root a second time, in its own mount and
/// PID namespaces as under a plain chroot (there too its maps name the host
/// path); in a container's root made `/` by `pivot_root`, whose maps name
/// paths inside it, through the process's root. Its PID in its namespace
/// is reported. All three count exactly what the same body makes them do,
/// and its debug info is found inside the root each time.
#[test]
fn chroot_namespaces_and_container_count_alike() {
    require_root();
    let chroot = per_iteration(Isolation::Chroot);
    let namespaces = per_iteration(Isolation::Namespaces);
    assert_eq!(chroot, namespaces);
    let container = per_iteration(Isolation::Container);
    assert_eq!(chroot, container);
}

/// Per-iteration counts of the `[]` + `bytearray(1000)` body in the forky
/// root's LTO `python`, under chroot, from N and 2N iterations; its DWARF
/// (the -dbg package, found by build-id inside the root) lists the inlined
/// copies, which are all probed.
fn lto_objects_body(python: &str) -> Counts {
    objects_body_in_root(python, |attached| {
        for (name, c) in attached["coverage"].as_object().expect("coverage") {
            // Complete, but where GCC merged calls into a copy through
            // conditional jumps that land where an entry also leads
            // (python3.13's PyMem_Calloc in PyTuple_GetSlice's unit): no
            // probe there counts each call once, and coverage says so.
            if c["calls"] != "complete" {
                assert_eq!(c["calls"], "partial", "{name}: {c}");
                let reason = c["reason"].as_str().unwrap_or_default();
                assert!(reason.contains("both from an entry and around every entry"), "{name}: {c}");
            }
            assert!(c["source"].as_str().is_some_and(|s| s.contains("/usr/lib/debug/.build-id/")), "{name}: {c}");
        }
    })
}

/// Per-iteration counts of the `[]` + `bytearray(1000)` body in the forky
/// root's `python` (a path inside it), under chroot, from N and 2N
/// iterations, with `check` run on each attach line.
fn objects_body_in_root(python: &str, check: impl Fn(&serde_json::Value)) -> Counts {
    const N: u64 = 200;
    let root = forky_root();
    let run = |n| {
        let mut workload = Workload::once_in_root(&root, python, n, Body::Objects, Exit::Immediate, Isolation::Chroot);
        workload.wait_blocked_on_stdin();
        let (tracer, attached) = TracerRun::attach_json(workload.pid(), &["--interval", "3600"]);
        check(&attached);
        workload.go();
        workload.finish();
        let (status, lines, stderr) = tracer.finish();
        assert!(status.success(), "{stderr}");
        counts(lines.last().expect("summary"))
    };
    let (one, two) = (run(N), run(2 * N));
    one.iter()
        .map(|(name, (c1, b1))| {
            let (c2, b2) = two[name];
            assert_eq!(((c2 - c1) % N, (b2 - b1) % N), (0, 0), "{name}: not a whole number per iteration");
            (name.clone(), ((c2 - c1) / N, (b2 - b1) / N))
        })
        .collect()
}

/// Debian's LTO python3.13 and python3.14 with their debug info see every
/// new reference and allocation of the body; 3.13's new references equal
/// pyenv's plain 3.13.0's.
#[test]
fn lto_313_and_314_count_every_copy() {
    require_root();
    let plain = {
        let python = std::path::Path::new("/root/.pyenv/versions/3.13.0/bin/python3.13");
        assert!(python.is_file(), "{} is missing: this machine kind ships pyenv's 3.13.0", python.display());
        let mut runs = [100, 200].map(|n| {
            let mut w = Workload::once(python, n, Body::Objects, Exit::Immediate, tracer_tests::Aslr::Off);
            w.wait_blocked_on_stdin();
            let (tracer, _) = TracerRun::attach_json(w.pid(), &["--interval", "3600", "--probes", "refs"]);
            w.go();
            w.finish();
            let (status, lines, stderr) = tracer.finish();
            assert!(status.success(), "{stderr}");
            counts(lines.last().expect("summary"))["_Py_NewReference"].0
        });
        runs.sort_unstable();
        (runs[1] - runs[0]) / 100
    };
    for python in ["/usr/bin/python3.13", "/usr/bin/python3.14"] {
        let per = lto_objects_body(python);
        assert!(per["_Py_NewReference"].0 >= 1, "{python}: {per:?}");
        let allocations: u64 = per.iter().filter(|(n, _)| n.contains("alloc")).map(|(_, (c, _))| c).sum();
        assert!(allocations >= 1, "{python}: {per:?}");
        if python.ends_with("3.13") {
            assert_eq!(per["_Py_NewReference"].0, plain, "{python}: {per:?}");
        }
        eprintln!("{python}: {per:?}");
    }
}

/// With its -dbg package's file out of reach, the forky root's python3.14
/// still counts every new reference and allocation of the body through the
/// reads of the switches that guard each inlined copy, telling the
/// reference tracer's creation reads from its destruction reads: the same
/// counts the DWARF gives. `_Py_Dealloc`, which no switch guards, is
/// partial and names the package.
#[test]
fn lto_314_without_debug_info_counts_through_guard_reads() {
    require_root();
    let name = format!("tracer-nodbg-{}-python3.14", std::process::id());
    let root = forky_root();
    let copy = root.join("tmp").join(&name);
    let copy = tracer_tests::without_debug_info(&root.join("usr/bin/python3.14"), &copy);
    let inside = format!("/tmp/{name}");
    let guards = objects_body_in_root(&inside, |attached| {
        for (name, c) in attached["coverage"].as_object().expect("coverage") {
            let source = c["source"].as_str().expect("source");
            assert!(source.contains("reads of its guard") && source.contains(&inside), "{name}: {c}");
            let complete = if name == "_Py_Dealloc" { "partial" } else { "complete" };
            assert_eq!(c["calls"], complete, "{name}: {c}");
            if c.get("reason").is_some() {
                assert_eq!(c["fix"], "apt-get install python3.14-dbg", "{name}: {c}");
            }
        }
    });
    let _ = std::fs::remove_file(&copy);
    let dwarf = lto_objects_body("/usr/bin/python3.14");
    for (name, counts) in &dwarf {
        if name != "_Py_Dealloc" {
            assert_eq!(guards[name], *counts, "{name}: with DWARF {dwarf:?}\nwithout {guards:?}");
        }
    }
}
