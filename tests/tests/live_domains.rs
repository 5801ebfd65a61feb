//! Live memory by domain (`--live`): libc's blocks with `--native`,
//! lists grown by appends (their arrays moved by reallocs), and each
//! domain's calls on an LTO build against the plain one. N against 2N,
//! as tests/tests/live.rs does for bytearrays.

use std::path::Path;

use serde_json::Value;
use tracer_tests::{
    Aslr, Workload, forky_root,
    live::{Target, field, never_negative, run_script},
    require_root, shared_python, static_python,
};

fn native(s: &Value, name: &str) -> i64 {
    s["live"]["native"][name].as_i64().unwrap_or_else(|| panic!("no native {name}: {}", s["live"]))
}

/// With `--native --live`, N blocks of libc's `malloc(4096)` kept through
/// ctypes are exactly N more native live blocks and 4096·N more native
/// live bytes than... N vs 2N; `--leaks` lists them, as malloc's, each
/// saying why it has no stack (`--stacks` walks at the interpreter's
/// functions); freeing them brings the native live level back, whatever N.
fn native_blocks(target: Target<'_>) {
    let n = 300;
    let extra = ["--native", "--leaks", "100000", "--stacks"];
    let runs: Vec<Value> = [(n, "keep"), (2 * n, "keep"), (n, "free"), (2 * n, "free")]
        .iter()
        .map(|(k, mode)| run_script(target, "native_live.py", &[&k.to_string(), mode], &extra).0)
        .collect();
    let [one, two, one_freed, two_freed] = &runs[..] else { unreachable!() };
    for s in &runs {
        never_negative(s);
        assert!(native(s, "count") >= 0 && native(s, "bytes") >= 0, "{}", s["live"]);
        // On an LTO build the Python domains are partial (tests/tests/
        // live.rs checks why); libc's never is.
        let partial = s["live"]["partial"].as_str().unwrap_or("");
        assert!(!partial.contains("libc"), "{}", s["live"]);
        for stat in ["live_unmatched", "live_pending_full", "live_full", "live_no_stack", "arg_missing", "nested_full"]
        {
            assert_eq!(s["stats"][stat], 0, "{stat}: {}", s["stats"]);
        }
    }
    let n_i = i64::try_from(n).unwrap();
    assert_eq!(native(two, "count") - native(one, "count"), n_i, "{}\n{}", one["live"], two["live"]);
    assert_eq!(native(two, "bytes") - native(one, "bytes"), 4096 * n_i, "{}\n{}", one["live"], two["live"]);
    assert_eq!(native(two, "allocations") - native(one, "allocations"), n_i);
    let kept = |s: &Value| {
        let listed = s["leaks"]["oldest"].as_array().expect("leaks");
        let here = |l: &&Value| {
            l["domain"] == "native"
                && l["function"] == "malloc"
                && l["size"] == 4096
                && l.get("stack").is_none()
                && l["no_stack"] == "no stack: --stacks walks at the interpreter's functions, not at libc's"
        };
        listed.iter().filter(here).count() as u64
    };
    assert_eq!((kept(one), kept(two)), (n, 2 * n), "{}", two["leaks"]);
    // Freed: back where it was, whatever N, and N more frees.
    assert_eq!(kept(one_freed) + kept(two_freed), 0);
    assert_eq!(native(two_freed, "count"), native(one_freed, "count"), "{}\n{}", one_freed["live"], two_freed["live"]);
    assert_eq!(native(two_freed, "bytes"), native(one_freed, "bytes"));
    assert_eq!(native(two_freed, "frees") - native(one_freed, "frees"), n_i);
}

#[test]
fn native_blocks_are_live_and_listed_on_pyenv_311() {
    require_root();
    let python = shared_python();
    native_blocks(Target { root: None, python: python.to_str().unwrap(), malloc: None });
}

#[test]
fn native_blocks_are_live_and_listed_on_debian_311() {
    require_root();
    let python = static_python();
    native_blocks(Target { root: None, python: python.to_str().unwrap(), malloc: None });
}

#[test]
fn native_blocks_are_live_and_listed_on_forky_314() {
    require_root();
    let root = forky_root();
    native_blocks(Target { root: Some(&root), python: "python3.14", malloc: None });
}

/// With `--native --live`, libc calls that fail put no block in the
/// table: N and 2N iterations of `malloc`, `calloc` and `realloc`
/// returning NULL, `mmap` returning `MAP_FAILED` and `posix_memalign`
/// returning EINVAL leave the native allocations and level where they
/// were, though every call is counted.
fn native_failures(target: Target<'_>) {
    let n = 300;
    let extra = ["--native", "--live"];
    let one = run_script(target, "native_live.py", &[&n.to_string(), "fail"], &extra).0;
    let two = run_script(target, "native_live.py", &[&(2 * n).to_string(), "fail"], &extra).0;
    for s in [&one, &two] {
        never_negative(s);
        for stat in ["live_unmatched", "live_pending_full", "live_full", "arg_missing", "nested_full"] {
            assert_eq!(s["stats"][stat], 0, "{stat}: {}", s["stats"]);
        }
    }
    for what in ["allocations", "count", "bytes"] {
        assert_eq!(native(&two, what), native(&one, what), "{what}: {}\n{}", one["live"], two["live"]);
    }
    let calls = |s: &Value, name: &str| s["probes"][name]["calls"].as_u64().unwrap_or_else(|| panic!("no {name}: {s}"));
    for name in ["malloc", "calloc", "realloc", "posix_memalign"] {
        assert_eq!(calls(&two, name) - calls(&one, name), n, "{name}");
    }
    // glibc's malloc tries a mapping of its own for a huge request (the
    // layer below, counted by design, and nested in the table).
    let mmaps = calls(&two, "mmap") - calls(&one, "mmap");
    assert!(mmaps >= n && mmaps.is_multiple_of(n), "{mmaps} more mmap calls for {n} more iterations");
}

#[test]
fn failed_native_calls_are_never_live_on_pyenv_311() {
    require_root();
    let python = shared_python();
    native_failures(Target { root: None, python: python.to_str().unwrap(), malloc: None });
}

#[test]
fn failed_native_calls_are_never_live_on_debian_311() {
    require_root();
    let python = static_python();
    native_failures(Target { root: None, python: python.to_str().unwrap(), malloc: None });
}

/// The mem domain's live figures: its level, and its unseen calls.
fn mem(s: &Value, name: &str) -> i64 {
    s["live"]["mem"][name].as_i64().unwrap_or_else(|| panic!("no mem {name}: {}", s["live"]))
}

/// N lists grown by 20 appends each and kept (tests/python/grow.py): their
/// item arrays, each made by a realloc of NULL and moved by three more
/// (`list_resize`'s `PyMem_Realloc`), are exactly N more live blocks of
/// the mem domain and N times one array's bytes, and dropping them brings
/// the level back, whatever N. On the LTO builds those reallocs are
/// inlined with pymalloc: the block a realloc moves to is the one its
/// malloc gets (read from pymalloc's state at the call), or the one the
/// out-of-line `_PyObject_Malloc` it calls returns, and the old one goes
/// with the free that follows, inline or not. Nothing in the loop is
/// unseen or unmatched: those counts are the same for N and 2N.
fn grown_lists(target: Target<'_>) {
    let n: u64 = 300;
    let runs: Vec<(Value, u64)> = [(n, "keep"), (2 * n, "keep"), (n, "free"), (2 * n, "free")]
        .iter()
        .map(|(k, mode)| run_script(target, "grow.py", &[&k.to_string(), mode], &["--live"]))
        .collect();
    let [(one, per), (two, _), (one_freed, _), (two_freed, _)] = &runs[..] else { unreachable!() };
    assert!(*per >= 20 * 8, "one list's array: {per} bytes");
    for (s, _) in &runs {
        never_negative(s);
    }
    for (a, b) in [(one, two), (one_freed, two_freed)] {
        for name in ["unseen_allocations", "unseen_frees"] {
            assert_eq!(field(a, name), field(b, name), "{name}: {}\n{}", a["live"], b["live"]);
        }
        assert_eq!(a["stats"]["live_unmatched"], b["stats"]["live_unmatched"], "{}\n{}", a["stats"], b["stats"]);
    }
    let n_i = i64::try_from(n).unwrap();
    assert_eq!(mem(two, "count") - mem(one, "count"), n_i, "{}\n{}", one["live"], two["live"]);
    assert_eq!(mem(two, "bytes") - mem(one, "bytes"), n_i * i64::try_from(*per).unwrap());
    assert_eq!(mem(two_freed, "count"), mem(one_freed, "count"), "{}\n{}", one_freed["live"], two_freed["live"]);
    assert_eq!(mem(two_freed, "bytes"), mem(one_freed, "bytes"));
}

#[test]
fn grown_lists_are_live_on_pyenv_311() {
    require_root();
    let python = shared_python();
    grown_lists(Target { root: None, python: python.to_str().unwrap(), malloc: None });
}

#[test]
fn grown_lists_are_live_on_debian_311() {
    require_root();
    let python = static_python();
    grown_lists(Target { root: None, python: python.to_str().unwrap(), malloc: None });
}

#[test]
fn grown_lists_are_live_on_forky_314() {
    require_root();
    let root = forky_root();
    grown_lists(Target { root: Some(&root), python: "python3.14", malloc: None });
}

/// Per domain, what `--live --native` saw of iterations N to 2N of
/// tests/python/mix.py in `python`: allocations tracked plus those left
/// unseen, and `live_unmatched`.
fn mix_live(python: &Path) -> (std::collections::BTreeMap<&'static str, u64>, u64) {
    const N: u64 = 100;
    let run = |n: u64| {
        let w = Workload::script_with(
            None,
            python.to_str().expect("UTF-8 path"),
            "mix.py",
            &[&n.to_string()],
            &[],
            Aslr::Off,
        );
        tracer_tests::traced_until_done(w, &["--interval", "3600", "--live", "--native"]).1
    };
    let (one, two) = (run(N), run(2 * N));
    let seen = |s: &Value, d: &str| {
        s["live"][d]["allocations"].as_u64().expect("allocations")
            + s["live"][d]["unseen_allocations"].as_u64().expect("unseen")
    };
    let per_domain =
        ["object", "mem", "raw", "native"].into_iter().map(|d| (d, seen(&two, d) - seen(&one, d))).collect();
    let unmatched = |s: &Value| s["stats"]["live_unmatched"].as_u64().expect("live_unmatched");
    (per_domain, unmatched(&two) - unmatched(&one))
}

/// On Debian's LTO 3.11, `--live --native` sees every allocation of a
/// mixed body in the domain pyenv's plain 3.11.7 sees it in, call for
/// call: tracked, or counted unseen (a copy whose size neither the DWARF
/// nor the code shows gets no pymalloc prediction). pymalloc passing a
/// request to the raw allocator inline (a request of 0, or over 512
/// bytes) is the call that passed it, as the plain build's nested call
/// is, and libc's `malloc` it reaches is that call's implementation, not
/// a native block; a moving realloc's free, out of line or inline, ends
/// its call, never an unmatched implementation.
#[test]
fn lto_live_sees_each_allocation_in_its_domain_like_the_plain_build() {
    require_root();
    let (plain, plain_unmatched) = mix_live(&shared_python());
    let (lto, lto_unmatched) = mix_live(&static_python());
    assert!(plain["object"] >= 100 * 50, "{plain:?}");
    assert_eq!(lto, plain);
    assert_eq!((lto_unmatched, plain_unmatched), (0, 0));
}
