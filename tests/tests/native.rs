//! `--native`: libc's allocator in the target, counted exactly. N more
//! iterations of the native body (tests/python/workload.py, each call made
//! through ctypes into the process's own libc) give exactly N times each
//! function's calls and bytes more, N more nested calls of `malloc` and
//! `free` (glibc's `realloc` relaying `realloc(NULL, n)` and `realloc(p,
//! 0)`, which are not counted twice), and exactly N times the body's
//! requests more in the native histogram's buckets. On pyenv's 3.11 and
//! 3.13 and Debian's 3.11 against Debian 12's glibc 2.36, and on the forky
//! root's 3.14, chrooted, against that root's glibc 2.43.

use std::path::Path;

use serde_json::Value;
use tracer_tests::{
    Aslr, Body, Exit, Isolation, Workload, forky_root, require_root, run_tracer, shared_python, static_python,
};

/// Per iteration: function, calls, bytes (tests/python/workload.py's
/// `NATIVE_CALLS`).
const CALLS: [(&str, u64, u64); 8] = [
    ("malloc", 1, 4096),
    ("calloc", 1, 4 * 1024),
    ("realloc", 3, 4096 + 8192),
    ("free", 4, 0),
    ("posix_memalign", 1, 4096),
    ("aligned_alloc", 1, 4096),
    ("mmap", 1, 4096),
    ("munmap", 1, 4096),
];

/// Per iteration: the nested calls, (calls, bytes), by function.
const NESTED: [(&str, u64, u64); 2] = [("malloc", 1, 4096), ("free", 1, 0)];

/// Per iteration, in the native histogram: (lo, hi) → (calls, bytes). The
/// body's requests: `malloc`, `calloc`, `realloc` from NULL, `posix_memalign` and
/// `aligned_alloc` of 4096 in [4096, 8191]; realloc to 8192 in [8192,
/// 16383]; realloc to 0 in [0, 0]. Nested calls and mmap are in none.
const BUCKETS: [((u64, u64), (u64, u64)); 3] =
    [((4096, 8191), (5, 5 * 4096)), ((8192, 16383), (1, 8192)), ((0, 0), (1, 0))];

/// The attached line and summary of one run of `workload`, with `extra`
/// flags beside `--native`.
fn traced(workload: Workload, extra: &[&str]) -> (Value, Value) {
    let mut args = vec!["--native", "--interval", "3600"];
    args.extend_from_slice(extra);
    tracer_tests::traced_to_the_end(workload, &args)
}

/// Iterations of the shorter run; the longer makes twice as many.
const N: u64 = 1000;

/// Per iteration of the body, in the native live table: the blocks it
/// makes (`malloc`, `calloc`, `realloc` from NULL, `realloc` to 8192,
/// which moves or replaces its block, `posix_memalign`, `aligned_alloc`,
/// `mmap`) and takes out again (four frees, realloc's old block, `realloc`
/// to 0, `munmap`).
const LIVE_BLOCKS: u64 = 7;

fn counts(summary: &Value, name: &str, field: Option<&str>) -> (u64, u64) {
    let record = &summary["probes"][name];
    let record = field.map_or(record, |f| &record[f]);
    let get = |k: &str| record[k].as_u64().unwrap_or_else(|| panic!("no {name} {field:?} {k} in {summary}"));
    (get("calls"), get("bytes"))
}

fn bucket(summary: &Value, range: (u64, u64)) -> (u64, u64) {
    let native = summary["sizes"]["native"].as_array().unwrap_or_else(|| panic!("no native sizes in {summary}"));
    native
        .iter()
        .find_map(|b| {
            let v: Vec<u64> = b.as_array()?.iter().filter_map(Value::as_u64).collect();
            ((v[0], v[1]) == range).then_some((v[2], v[3]))
        })
        .unwrap_or_default()
}

/// Runs N and 2N iterations; `libc` is the C library the target maps, as
/// its memory map shows it.
fn exact(libc: &str, start: impl Fn(u64) -> Workload) {
    exact_with(libc, start, &[]);
}

/// As [`exact`], with `extra` flags; returns the summaries of N and 2N.
fn exact_with(libc: &str, start: impl Fn(u64) -> Workload, extra: &[&str]) -> (Value, Value) {
    let n = N;
    let (attached, one) = traced(start(n), extra);
    let (_, two) = traced(start(2 * n), extra);
    assert_eq!(attached["native"], libc, "{attached}");
    for (name, _, _) in CALLS {
        assert!(attached["placements"].get(name).is_some(), "{name} not probed: {attached}");
        assert_eq!(attached["coverage"][name]["calls"], "complete", "{attached}");
    }
    for (name, calls, bytes) in CALLS {
        let (c1, b1) = counts(&one, name, None);
        let (c2, b2) = counts(&two, name, None);
        assert_eq!((c2 - c1, b2 - b1), (calls * n, bytes * n), "{name}: {one}\n{two}");
    }
    for (name, calls, bytes) in NESTED {
        let (c1, b1) = counts(&one, name, Some("nested"));
        let (c2, b2) = counts(&two, name, Some("nested"));
        assert_eq!((c2 - c1, b2 - b1), (calls * n, bytes * n), "{name} nested: {one}\n{two}");
    }
    for (range, (calls, bytes)) in BUCKETS {
        let ((c1, b1), (c2, b2)) = (bucket(&one, range), bucket(&two, range));
        assert_eq!((c2 - c1, b2 - b1), (calls * n, bytes * n), "{range:?}: {}\n{}", one["sizes"], two["sizes"]);
    }
    // The Python domains' keys stay as they were, beside the native one.
    for domain in ["object", "mem", "raw", "native"] {
        assert!(two["sizes"][domain].is_array(), "{domain}: {}", two["sizes"]);
    }
    for summary in [&one, &two] {
        let lost: Vec<_> = tracer_tests::misses(summary)
            .filter(|(k, v)| v.as_u64() != Some(0) && !matches!(k.as_str(), "other_process" | "size_overflow"))
            .collect();
        assert!(lost.is_empty(), "misses: {lost:?}");
    }
    (one, two)
}

/// `--native --live` together (the live table's probe slots come after
/// libc's): libc's counts stay exact, as [`exact`] checks; the body frees
/// every block it makes, so the native live level is the same for N and
/// 2N, with exactly `LIVE_BLOCKS` more blocks put in and taken out per
/// iteration, none nested twice; and the Python domains' levels are the
/// same for N and 2N too (the body keeps nothing), never below zero.
fn exact_live(libc: &str, start: impl Fn(u64) -> Workload) {
    let n = i64::try_from(N).unwrap();
    let (one, two) = exact_with(libc, start, &["--live"]);
    let get = |s: &Value, domain: &str, what: &str| {
        s["live"][domain][what].as_i64().unwrap_or_else(|| panic!("no live {domain} {what}: {}", s["live"]))
    };
    for what in ["count", "bytes"] {
        assert_eq!(get(&two, "native", what), get(&one, "native", what), "{what}: {}\n{}", one["live"], two["live"]);
    }
    for what in ["allocations", "frees"] {
        let more = get(&two, "native", what) - get(&one, "native", what);
        assert_eq!(more, i64::try_from(LIVE_BLOCKS).unwrap() * n, "{what}: {}\n{}", one["live"], two["live"]);
    }
    for s in [&one, &two] {
        let partial = s["live"]["partial"].as_str().unwrap_or("");
        assert!(!partial.contains("libc"), "{}", s["live"]);
        for domain in ["object", "mem", "raw", "native"] {
            assert!(get(s, domain, "count") >= 0 && get(s, domain, "bytes") >= 0, "{domain}: {}", s["live"]);
        }
    }
    if one["live"].get("partial").is_none() {
        for domain in ["object", "mem", "raw"] {
            assert_eq!(
                get(&two, domain, "bytes"),
                get(&one, domain, "bytes"),
                "{domain}: {}\n{}",
                one["live"],
                two["live"]
            );
        }
    }
}

fn once(python: &Path) -> impl Fn(u64) -> Workload + '_ {
    move |n| Workload::once(python, n, Body::Native, Exit::Immediate, Aslr::Off)
}

const HOST_LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";

#[test]
fn native_counts_are_exact_on_pyenv_311() {
    require_root();
    exact(HOST_LIBC, once(&shared_python()));
}

#[test]
fn native_counts_are_exact_on_pyenv_313() {
    require_root();
    let python = Path::new("/root/.pyenv/versions/3.13.0/bin/python3");
    assert!(python.is_file(), "{} is missing (see ../shared/TOOLCHAIN.md)", python.display());
    exact(HOST_LIBC, once(python));
}

#[test]
fn native_counts_are_exact_on_debian_311() {
    require_root();
    exact(HOST_LIBC, once(&static_python()));
}

#[test]
fn native_and_live_together_are_exact_on_pyenv_311() {
    require_root();
    exact_live(HOST_LIBC, once(&shared_python()));
}

#[test]
fn native_and_live_together_are_exact_on_debian_311() {
    require_root();
    exact_live(HOST_LIBC, once(&static_python()));
}

#[test]
fn native_and_live_together_are_exact_on_forky_314() {
    require_root();
    let root = forky_root();
    let libc = root.join("usr/lib/x86_64-linux-gnu/libc.so.6");
    exact_live(&libc.display().to_string(), |n| {
        Workload::once_in_root(&root, "python3.14", n, Body::Native, Exit::Immediate, Isolation::Chroot)
    });
}

/// The chrooted interpreter's libc is the root's own (glibc 2.43), found
/// through its memory map, not tracer's.
#[test]
fn native_counts_are_exact_on_forky_314_in_its_own_libc() {
    require_root();
    let root = forky_root();
    let libc = root.join("usr/lib/x86_64-linux-gnu/libc.so.6");
    exact(&libc.display().to_string(), |n| {
        Workload::once_in_root(&root, "python3.14", n, Body::Native, Exit::Immediate, Isolation::Chroot)
    });
}

/// `tracer probes --native` lists libc's functions, in libc, with
/// realloc's relays as nested sites of malloc and free.
#[test]
fn probes_lists_the_native_functions() {
    require_root();
    let python = shared_python();
    let workload = Workload::once(&python, 1, Body::Native, Exit::Immediate, Aslr::On);
    let pid = workload.pid().to_string();
    let (code, out, err) = run_tracer(&["probes", "--pid", &pid, "--native", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let plan: Value = serde_json::from_str(&out).expect("JSON");
    let probes = plan["probes"].as_array().expect("probes");
    for (name, _, _) in CALLS {
        let p = probes.iter().find(|p| p["symbol"] == name).unwrap_or_else(|| panic!("no {name} in {out}"));
        assert_eq!(p["file"], HOST_LIBC, "{p}");
    }
    for (name, _, _) in NESTED {
        let p = probes.iter().find(|p| p["symbol"] == name).expect("probed");
        assert!(p["nested_sites"].as_array().is_some_and(|s| !s.is_empty()), "{p}");
    }
}

/// `--native` with `--exe`, or with `--budget`, is refused before anything
/// is attached.
#[test]
fn native_refuses_exe_and_budget() {
    let (code, out, err) = run_tracer(&["attach", "--exe", "/usr/bin/python3.11", "--native"]);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (
            Some(2),
            "",
            "tracer: error: --native needs --pid: with --exe, libc's probes would fire in every process on the machine that uses libc, not only that interpreter's\n"
        )
    );
    let (code, out, err) = run_tracer(&["attach", "--pid", "1", "--native", "--budget", "1"]);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (
            Some(2),
            "",
            "tracer: error: --budget cannot be combined with --native: the marks of libc's nested calls must stay attached with the functions they mark; use one or the other\n"
        )
    );
}
