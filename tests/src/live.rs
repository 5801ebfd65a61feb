//! What the live-memory tests (tests/tests/live.rs and `live_domains.rs`)
//! share: where a workload runs, one traced run, and the summary's live
//! figures.

use std::path::Path;

use serde_json::Value;

use crate::Workload;

/// Where the workload runs: its root (None: the host), interpreter and
/// `PYTHONMALLOC` (None: the default allocator).
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub root: Option<&'a Path>,
    pub python: &'a str,
    pub malloc: Option<&'a str>,
}

/// One run of tests/python/`script` with `args`, traced with `--interval
/// 3600` and `extra`: the summary, and the bytes one kept block holds (its
/// "per" line).
#[must_use]
pub fn run_script(target: Target<'_>, script: &str, args: &[&str], extra: &[&str]) -> (Value, u64) {
    let env: Vec<(&str, &str)> = target.malloc.map(|m| ("PYTHONMALLOC", m)).into_iter().collect();
    let w = Workload::script_env(target.root, target.python, script, args, &env);
    let per = w.next_line("per").expect("a per line");
    let per: u64 = per.strip_prefix("per ").expect("per N").parse().expect("a number");
    let mut tracer_args = vec!["--interval", "3600"];
    tracer_args.extend_from_slice(extra);
    let (_, summary) = crate::traced_until_done(w, &tracer_args);
    (summary, per)
}

/// The live bytes of the interpreter's three domains.
#[must_use]
pub fn live_bytes(s: &Value) -> i64 {
    ["object", "mem", "raw"].iter().map(|d| s["live"][d]["bytes"].as_i64().expect("live bytes")).sum()
}

/// A live count (`name`) summed over the interpreter's three domains.
#[must_use]
pub fn field(s: &Value, name: &str) -> u64 {
    ["object", "mem", "raw"].iter().map(|d| s["live"][d][name].as_u64().expect("a live count")).sum()
}

/// Every live level is a level: never below zero.
pub fn never_negative(s: &Value) {
    for d in ["object", "mem", "raw"] {
        let live = &s["live"][d];
        assert!(live["count"].as_i64() >= Some(0) && live["bytes"].as_i64() >= Some(0), "{d}: {live}");
    }
    assert!(s["live"]["unknown"].as_str().is_some_and(|u| u.contains("before tracer attached")), "{}", s["live"]);
}
