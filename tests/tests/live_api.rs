//! Live memory (`--live`) of the allocator API called directly: the api
//! body calls each domain's malloc, calloc and realloc and frees both
//! blocks through ctypes, so N more iterations give the mem and raw
//! domains exactly 3N more blocks allocated and 3N more freed, and none
//! left live; the object domain (where ctypes' own objects also live)
//! as many more freed as allocated. Every free is paired with its call,
//! the raw domain's `PyMem_RawFree` included, and a free the raw domain
//! serves inside pymalloc's (a block over 512 bytes) is counted once.

use serde_json::Value;
use tracer_tests::{Workload, pyenv, require_root, static_python, traced_to_the_end};

/// Iterations of the shorter run; the longer makes twice as many.
const N: u64 = 40;

/// The api body's blocks per domain and iteration: malloc's, calloc's and
/// realloc's (which moves calloc's).
const BLOCKS: i64 = 3;

fn run(python: &str, env: &[(&str, &str)], n: u64) -> Value {
    let n = n.to_string();
    let w = Workload::script_env(None, python, "workload.py", &["once", &n, "_exit", "api"], env);
    let (_, summary) = traced_to_the_end(w, &["--live", "--interval", "3600"]);
    summary
}

fn live(s: &Value, domain: &str, field: &str) -> i64 {
    s["live"][domain][field].as_i64().unwrap_or_else(|| panic!("no live.{domain}.{field}: {}", s["live"]))
}

fn paired(python: &str, env: &[(&str, &str)]) {
    let [one, two] = [N, 2 * N].map(|n| run(python, env, n));
    for s in [&one, &two] {
        assert_eq!(s["stats"]["live_unmatched"], 0, "{}", s["stats"]);
        assert!(s["live"].get("partial").is_none(), "{}", s["live"]);
    }
    let n = i64::try_from(N).expect("N");
    let more = |domain: &str, field: &str| live(&two, domain, field) - live(&one, domain, field);
    for domain in ["mem", "raw"] {
        let got = ["allocations", "frees", "count", "bytes", "untracked_frees"].map(|f| more(domain, f));
        assert_eq!(got, [BLOCKS * n, BLOCKS * n, 0, 0, 0], "{domain}: {} / {}", one["live"], two["live"]);
    }
    let (allocated, freed) = (more("object", "allocations"), more("object", "frees"));
    assert!(allocated >= BLOCKS * n && allocated % n == 0, "object: {allocated} more allocations");
    assert_eq!((freed, more("object", "count")), (allocated, 0), "object: {} / {}", one["live"], two["live"]);
}

#[test]
fn api_calls_are_paired_in_every_domain_on_pyenv_311() {
    require_root();
    paired(pyenv("3.11.7").to_str().expect("a path"), &[]);
}

#[test]
fn api_calls_are_paired_in_every_domain_on_pyenv_313() {
    require_root();
    paired(pyenv("3.13.0").to_str().expect("a path"), &[]);
}

/// With `PYTHONMALLOC=debug` every call of an LTO build goes through the
/// out-of-line debug hooks.
#[test]
fn api_calls_are_paired_in_every_domain_on_debian_311_with_debug_hooks() {
    require_root();
    paired(static_python().to_str().expect("a path"), &[("PYTHONMALLOC", "debug")]);
}
