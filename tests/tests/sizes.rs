//! Size histograms: N more iterations of a body that makes bytearrays of
//! 100, 1000 and 10000 bytes (buffers of 101, 1001 and 10001 bytes) put
//! exactly N more calls, and N times their size more bytes, in each one's
//! log2 bucket of the buffers' domain; every bucket of every domain grows
//! by a whole number of calls per iteration. The buffers come from
//! `PyObject_Malloc` in 3.11 and 3.12, and from `PyMem_Malloc` from 3.13
//! on (as seen on pyenv's 3.13.0 and Debian's 3.14.8). The workload
//! leaves with `os._exit`: finalization's allocations depend on where
//! memory lies. Debian's 3.11 (not PIE) keys `tp_subclasses` by
//! `PyLong_FromVoidPtr(type)` (`remove_subclass`, Objects/typeobject.c,
//! which `_PyStaticType_Dealloc` calls at exit): an int of one digit
//! (28 bytes) for a type below 2^30, two (32) above, so 157 of its ints
//! changed size in one run of about 16 under load. `--native-stacks` on
//! a finalizing run named the stack.

use std::{collections::BTreeMap, path::Path};

use serde_json::Value;
use tracer_tests::{Aslr, Body, Exit, Isolation, Workload, forky_root, require_root, shared_python, static_python};

/// Per domain, (lo, hi) → (calls, bytes).
type Histograms = BTreeMap<String, BTreeMap<(u64, u64), (u64, u64)>>;

fn histograms(summary: &Value) -> Histograms {
    let sizes = summary["sizes"].as_object().unwrap_or_else(|| panic!("no sizes in {summary}"));
    ["object", "mem", "raw"]
        .iter()
        .map(|domain| {
            let buckets = sizes[*domain].as_array().unwrap_or_else(|| panic!("no {domain} in {sizes:?}"));
            let buckets = buckets
                .iter()
                .map(|b| {
                    let v: Vec<u64> =
                        b.as_array().expect("a bucket").iter().map(|x| x.as_u64().expect("u64")).collect();
                    ((v[0], v[1]), (v[2], v[3]))
                })
                .collect();
            ((*domain).to_owned(), buckets)
        })
        .collect()
}

/// The summary of `n` iterations of the sizes body in `workload`.
fn traced(workload: Workload) -> Value {
    tracer_tests::traced_to_the_end(workload, &["--interval", "3600"]).1
}

/// Runs N and 2N iterations and checks the differences; the buffers are
/// in `domain`, and with `all_sized` every call's size is known.
fn exact(domain: &str, all_sized: bool, start: impl Fn(u64) -> Workload) {
    let n = 2000;
    let one = traced(start(n));
    let two = traced(start(2 * n));
    let (h1, h2) = (histograms(&one), histograms(&two));
    for (domain, buckets) in &h2 {
        for (range, &(c2, b2)) in buckets {
            let (c1, b1) = h1[domain].get(range).copied().unwrap_or_default();
            let (dc, db) = (c2.checked_sub(c1).expect("calls grow"), b2.checked_sub(b1).expect("bytes grow"));
            assert_eq!(
                (dc % n, db % n),
                (0, 0),
                "{domain} {range:?}: {dc} calls, {db} bytes more for {n} more iterations\nN: {one}\n2N: {two}"
            );
        }
    }
    let grew = |range: (u64, u64)| {
        let (c1, b1) = h1[domain].get(&range).copied().unwrap_or_default();
        let (c2, b2) = h2[domain][&range];
        (c2 - c1, b2 - b1)
    };
    assert_eq!(grew((64, 127)), (n, 101 * n), "{h2:?}");
    assert_eq!(grew((512, 1023)), (n, 1001 * n), "{h2:?}");
    assert_eq!(grew((8192, 16383)), (n, 10001 * n), "{h2:?}");
    // Every allocator call is in a bucket, or counted as of unknown size
    // (only where some copy's size is unknown: then its coverage says so).
    let unknown = |summary: &Value, domain: &str| summary["sizes"]["unsized_calls"][domain].as_u64().unwrap_or(0);
    for domain in ["object", "mem", "raw"] {
        let more = unknown(&two, domain) - unknown(&one, domain);
        assert_eq!(more % n, 0, "{domain}: {more} more calls of unknown size");
    }
    for summary in [&one, &two] {
        if all_sized {
            assert!(summary["sizes"].get("unsized_calls").is_none(), "sizes not known: {}", summary["sizes"]);
        }
        for (domain, prefix) in [("object", "PyObject_"), ("mem", "PyMem_"), ("raw", "PyMem_Raw")] {
            let calls: u64 = ["Malloc", "Calloc", "Realloc"]
                .iter()
                .filter_map(|f| summary["probes"][format!("{prefix}{f}")]["calls"].as_u64())
                .sum();
            let bucketed: u64 = histograms(summary)[domain].values().map(|c| c.0).sum();
            assert_eq!(bucketed + unknown(summary, domain), calls, "{domain}: {summary}");
        }
    }
}

fn once(python: &Path) -> impl Fn(u64) -> Workload + '_ {
    move |n| Workload::once(python, n, Body::Sizes, Exit::Immediate, Aslr::On)
}

#[test]
fn sizes_land_in_their_buckets_on_the_plain_build() {
    require_root();
    exact("object", true, once(&shared_python()));
}

#[test]
fn sizes_land_in_their_buckets_on_debian_311() {
    require_root();
    exact("object", true, once(&static_python()));
}

#[test]
fn sizes_land_in_their_buckets_on_forky_314() {
    require_root();
    let root = forky_root();
    // 23 of its 138 `PyObject_Malloc` copies have no size location in the
    // DWARF at their entry (see README, Limitations).
    exact("mem", false, |n| {
        Workload::once_in_root(&root, "python3.14", n, Body::Sizes, Exit::Immediate, Isolation::Chroot)
    });
}

#[test]
fn sizes_land_in_their_buckets_on_pyenv_313() {
    require_root();
    let python = Path::new("/root/.pyenv/versions/3.13.0/bin/python3");
    assert!(python.is_file(), "{} is missing (see ../shared/TOOLCHAIN.md)", python.display());
    exact("mem", true, once(python));
}
