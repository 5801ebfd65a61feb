//! Live memory (`--live`, `--leaks`): a workload that keeps N bytearrays
//! of KEEP bytes (and makes and drops N of TEMP bytes) shows, at the end,
//! exactly N times what one kept bytearray holds more live bytes than one
//! that keeps N/2... every figure from runs of N and 2N, whose difference
//! is exact. With `--leaks`, exactly the kept buffers (KEEP + 1 bytes)
//! are listed, never a dropped one (TEMP + 1). Freeing them brings live
//! memory back: runs of N and 2N that free what they kept end with the
//! same live bytes. On Debian's LTO builds the allocators are inlined into
//! their callers, where no returned pointer is read: there tracer takes
//! the block pymalloc's inline fast path hands out from pymalloc's own
//! state at the call's entry, and the loop's blocks are all tracked; the
//! few calls left unseen (outside the loop) are counted, the same in both
//! runs, and the report says it is partial.

use std::path::Path;

use serde_json::Value;
use tracer_tests::{
    Aslr, Body, Exit, Isolation, TracerRun, Workload, forky_root, require_root, run_tracer, shared_python,
    static_python,
};

const KEEP: u64 = 12_345;
const TEMP: u64 = 7_777;

/// Where the workload runs: its root (None: the host), interpreter and
/// `PYTHONMALLOC` (None: the default allocator).
#[derive(Clone, Copy)]
struct Target<'a> {
    root: Option<&'a Path>,
    python: &'a str,
    malloc: Option<&'a str>,
}

/// One run: the summary, and the bytes one kept bytearray holds.
fn run(target: Target<'_>, n: u64, free: bool, extra: &[&str]) -> (Value, u64) {
    let args = [n.to_string(), KEEP.to_string(), TEMP.to_string(), (if free { "free" } else { "keep" }).to_owned()];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_script(target, "live.py", &args, extra)
}

/// One run of tests/python/`script` with `args`: the summary, and the
/// bytes one kept block holds (its "per" line).
fn run_script(target: Target<'_>, script: &str, args: &[&str], extra: &[&str]) -> (Value, u64) {
    let env: Vec<(&str, &str)> = target.malloc.map(|m| ("PYTHONMALLOC", m)).into_iter().collect();
    let w = Workload::script_env(target.root, target.python, script, args, &env);
    let per = w.next_line("per").expect("a per line");
    let per: u64 = per.strip_prefix("per ").expect("per N").parse().expect("a number");
    let mut tracer_args = vec!["--interval", "3600"];
    tracer_args.extend_from_slice(extra);
    let (_, summary) = tracer_tests::traced_until_done(w, &tracer_args);
    (summary, per)
}

fn live_bytes(s: &Value) -> i64 {
    ["object", "mem", "raw"].iter().map(|d| s["live"][d]["bytes"].as_i64().expect("live bytes")).sum()
}

fn field(s: &Value, name: &str) -> u64 {
    ["object", "mem", "raw"].iter().map(|d| s["live"][d][name].as_u64().expect("a live count")).sum()
}

/// How many listed leaks are `size` bytes.
fn listed(s: &Value, size: u64) -> u64 {
    s["leaks"]["oldest"].as_array().expect("leaks").iter().filter(|l| l["size"] == size).count() as u64
}

/// How many listed leaks there are of each size.
fn by_size(s: &Value) -> std::collections::BTreeMap<u64, u64> {
    let mut sizes = std::collections::BTreeMap::new();
    for l in s["leaks"]["oldest"].as_array().expect("leaks") {
        *sizes.entry(l["size"].as_u64().expect("a size")).or_default() += 1;
    }
    sizes
}

/// The listed leaks that are neither a kept buffer nor a bytearray
/// object, in full: what a failure needs to be read.
fn others(s: &Value) -> Vec<&Value> {
    s["leaks"]["oldest"]
        .as_array()
        .expect("leaks")
        .iter()
        .filter(|l| l["size"] != KEEP + 1 && l["size"] != 56)
        .collect()
}

/// Every live level is a level: never below zero.
fn never_negative(s: &Value) {
    for d in ["object", "mem", "raw"] {
        let live = &s["live"][d];
        assert!(live["count"].as_i64() >= Some(0) && live["bytes"].as_i64() >= Some(0), "{d}: {live}");
    }
    assert!(s["live"]["unknown"].as_str().is_some_and(|u| u.contains("before tracer attached")), "{}", s["live"]);
}

/// Every block of the loop tracked: on a build whose allocators the
/// return probes see (not LTO, or `PYTHONMALLOC=debug`), every block; on
/// an LTO build with pymalloc (`inlined`), the loop's, with a few calls
/// outside it in the table or unseen, as many in both runs, and said.
fn exact(target: Target<'_>, inlined: bool) {
    let n = 300;
    let leaks = ["--leaks", "100000"];
    let (one, per) = run(target, n, false, &leaks);
    let (two, _) = run(target, 2 * n, false, &leaks);
    for s in [&one, &two] {
        never_negative(s);
        if inlined {
            let why = s["live"]["partial"].as_str().unwrap_or_else(|| panic!("not partial: {}", s["live"]));
            assert!(why.contains("ran an allocator inlined") && why.contains("PYTHONMALLOC=debug"), "{why}");
        } else {
            assert!(s["live"].get("partial").is_none(), "{}", s["live"]);
        }
        assert_eq!(s["stats"]["live_unmatched"], 0, "{}", s["stats"]);
    }
    assert_eq!(field(&one, "unseen_frees"), field(&two, "unseen_frees"), "{} / {}", one["live"], two["live"]);
    // Kept: N more bytearrays hold exactly N times one's bytes more.
    let more = live_bytes(&two) - live_bytes(&one);
    assert_eq!(more, i64::try_from(n * per).unwrap(), "one holds {per} B: {} / {}", one["live"], two["live"]);
    // Listed: exactly the kept buffers, never the dropped ones.
    assert_eq!((listed(&one, KEEP + 1), listed(&two, KEEP + 1)), (n, 2 * n), "{}", two["leaks"]["count"]);
    assert_eq!((listed(&one, TEMP + 1), listed(&two, TEMP + 1)), (0, 0));
    // Two blocks each: the object and its buffer. Every allocation is in
    // the table or counted unseen; which one, for a call outside the loop
    // whose size its copy does not show (on forky's 3.14, the buffer
    // `os.read` makes after "done"), the heap's layout decides: pymalloc's
    // slow path, probed, gives its block, its inline fast path does not.
    let seen = |s: &Value| s["leaks"]["count"].as_u64().unwrap() + field(s, "unseen_allocations");
    assert_eq!(
        seen(&two) - seen(&one),
        2 * n,
        "listed by size, N: {:?}, 2N: {:?}; the others, N: {:?}, 2N: {:?}; live N: {}, 2N: {}",
        by_size(&one),
        by_size(&two),
        others(&one),
        others(&two),
        one["live"],
        two["live"]
    );
    // Freed: back where it was, whatever N.
    let (one_freed, _) = run(target, n, true, &leaks);
    let (two_freed, _) = run(target, 2 * n, true, &leaks);
    for s in [&one_freed, &two_freed] {
        never_negative(s);
        assert_eq!(listed(s, KEEP + 1), 0, "{}", s["leaks"]);
    }
    assert_eq!(live_bytes(&two_freed), live_bytes(&one_freed), "{} / {}", one_freed["live"], two_freed["live"]);
    // Per iteration at least the kept and the dropped bytearray, each an
    // object and a buffer (and the loop's int, on some builds).
    let frees = field(&two_freed, "frees") - field(&one_freed, "frees");
    assert!(frees >= 4 * n && frees.is_multiple_of(n), "{frees} more frees for {n} more iterations");
}

#[test]
fn kept_bytearrays_are_live_and_listed_on_pyenv_311() {
    require_root();
    let python = shared_python();
    exact(Target { root: None, python: python.to_str().unwrap(), malloc: None }, false);
}

#[test]
fn kept_bytearrays_are_live_and_listed_on_pyenv_313() {
    require_root();
    let python = "/root/.pyenv/versions/3.13.0/bin/python3";
    assert!(Path::new(python).is_file(), "{python} is missing (see ../shared/TOOLCHAIN.md)");
    exact(Target { root: None, python, malloc: None }, false);
}

/// On an LTO build with the default allocator, the copies inlined into
/// bytearray's code run pymalloc inline and call no implementation:
/// their blocks are the heads of pymalloc's free lists, read at their
/// entries.
#[test]
fn kept_bytearrays_are_live_and_listed_on_debian_311() {
    require_root();
    let python = static_python();
    exact(Target { root: None, python: python.to_str().unwrap(), malloc: None }, true);
}

#[test]
fn kept_bytearrays_are_live_and_listed_on_forky_314() {
    require_root();
    let root = forky_root();
    exact(Target { root: Some(&root), python: "python3.14", malloc: None }, true);
}

/// With `PYTHONMALLOC=debug` every call of an LTO build goes through the
/// out-of-line debug hooks, whose returns give every block: exact.
#[test]
fn kept_bytearrays_are_live_and_listed_on_debian_311_with_debug_hooks() {
    require_root();
    let python = static_python();
    exact(Target { root: None, python: python.to_str().unwrap(), malloc: Some("debug") }, false);
}

#[test]
fn kept_bytearrays_are_live_and_listed_on_forky_314_with_debug_hooks() {
    require_root();
    let root = forky_root();
    exact(Target { root: Some(&root), python: "python3.14", malloc: Some("debug") }, false);
}

/// A call still the last of its thread when tracer stops is counted: the
/// 5-byte buffer `os.read` makes before it blocks is in the table (where
/// pymalloc's slow path, probed, serves it) or an unseen allocation (its
/// inline fast path, at a copy that does not show its size), and never
/// neither, which it was (in seven runs of eight) while only the thread's
/// next API call counted a call unseen. Against the same run ending in a
/// `readinto` of a buffer made before the attach: one more, exactly.
#[test]
fn a_call_left_last_at_the_end_is_counted_on_forky_314() {
    require_root();
    let root = forky_root();
    let target = Target { root: Some(&root), python: "python3.14", malloc: None };
    let n = 100;
    let leaks = ["--leaks", "100000"];
    let seen = |s: &Value| s["leaks"]["count"].as_u64().expect("leaks") + field(s, "unseen_allocations");
    let end = |ending: &str| {
        let args = [n.to_string(), KEEP.to_string(), TEMP.to_string(), "keep".to_owned(), ending.to_owned()];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_script(target, "live.py", &args, &leaks).0
    };
    for _ in 0..3 {
        let (waiting, reading) = (end("readinto"), end("os.read"));
        assert_eq!(seen(&reading), seen(&waiting) + 1, "{}\n{}", waiting["live"], reading["live"]);
    }
}

/// The bytes `sys.getsizeof` gives for a `Leaky()` in `target`: its
/// object and its pre-header (the GC header, the managed dict's
/// pointers). Its block holds at least that (3.13 adds the inline values).
fn leaky_size(target: Target<'_>) -> u64 {
    let code = "import sys\nclass Leaky: pass\nprint(sys.getsizeof(Leaky()))";
    let out = match target.root {
        Some(root) => std::process::Command::new("chroot").arg(root).args([target.python, "-c", code]).output(),
        None => std::process::Command::new(target.python).args(["-c", code]).output(),
    }
    .expect("run the interpreter");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("a size")
}

/// `--live --leaks` on the types body (N `Leaky` kept, N `Temp` made and
/// dropped), read while the workload still holds its `Leaky` objects: the
/// listed blocks by size, and `live_unmatched`.
fn leaky_listed(target: Target<'_>, n: u64) -> (std::collections::BTreeMap<u64, u64>, u64) {
    let mut w = match target.root {
        Some(root) => Workload::once_in_root(root, target.python, n, Body::Types, Exit::Finalize, Isolation::Chroot),
        None => Workload::once(Path::new(target.python), n, Body::Types, Exit::Finalize, Aslr::On),
    };
    w.wait_blocked_on_stdin();
    let (tracer, _) = TracerRun::attach_json(w.pid(), &["--live", "--leaks", "1000000", "--interval", "3600"]);
    w.go();
    w.expect("done");
    // It waits in sys.stdin.read() now, holding every Leaky.
    w.wait_blocked_reading(None);
    tracer.signal(libc::SIGINT);
    let summary = tracer.summary();
    w.close();
    never_negative(&summary);
    let mut sizes = std::collections::BTreeMap::new();
    for leak in summary["leaks"]["oldest"].as_array().expect("leaks") {
        *sizes.entry(leak["size"].as_u64().expect("a size")).or_default() += 1;
    }
    assert_eq!(summary["leaks"]["count"], sizes.values().sum::<u64>(), "every leak listed");
    (sizes, summary["stats"]["live_unmatched"].as_u64().expect("live_unmatched"))
}

/// The check: kept `Leaky` objects appear among the leaks with
/// their size, the dropped `Temp` ones do not. `Temp`'s blocks are the
/// same sizes as `Leaky`'s, so N more of each make exactly N more listed
/// blocks of each size a `Leaky` has (its object, and in 3.11 and 3.12
/// its values array), never 2N; the object's is at least what
/// `sys.getsizeof` says.
fn leaky_objects_are_listed(target: Target<'_>) {
    let n = 500;
    let least = leaky_size(target);
    let ((one, unmatched_one), (two, unmatched_two)) = (leaky_listed(target, n), leaky_listed(target, 2 * n));
    // Calls no API call explains (outside the loop) are counted, never
    // the loop's.
    assert_eq!(unmatched_one, unmatched_two, "live_unmatched");
    // Blocks under 1 KiB: the array of the list that keeps them, of a
    // pointer per `Leaky`, is larger, and differs with N.
    let grown: Vec<(u64, u64)> = two
        .range(..1024)
        .map(|(&size, &c)| (size, c - one.get(&size).copied().unwrap_or(0)))
        .filter(|g| g.1 != 0)
        .collect();
    assert!(grown.iter().all(|&(_, g)| g == n), "{n} more Leaky and Temp: {grown:?} more blocks by size");
    assert!(grown.iter().any(|&(size, _)| size >= least), "no block of {least} bytes or more grew: {grown:?}");
}

#[test]
fn leaky_objects_are_listed_on_pyenv_311() {
    require_root();
    let python = shared_python();
    leaky_objects_are_listed(Target { root: None, python: python.to_str().unwrap(), malloc: None });
}

#[test]
fn leaky_objects_are_listed_on_pyenv_313() {
    require_root();
    leaky_objects_are_listed(Target { root: None, python: "/root/.pyenv/versions/3.13.0/bin/python3", malloc: None });
}

#[test]
fn leaky_objects_are_listed_on_debian_311() {
    require_root();
    let python = static_python();
    leaky_objects_are_listed(Target { root: None, python: python.to_str().unwrap(), malloc: None });
}

#[test]
fn leaky_objects_are_listed_on_forky_314() {
    require_root();
    let root = forky_root();
    leaky_objects_are_listed(Target { root: Some(&root), python: "python3.14", malloc: None });
}

/// A table of 50 blocks overflows, says so, and keeps running: every
/// function's calls and bytes are those of a run with room enough.
#[test]
fn a_tiny_table_reports_its_overflow() {
    require_root();
    let python = shared_python();
    a_tiny_table_reports_its_overflow_on(Target { root: None, python: python.to_str().unwrap(), malloc: None });
}

/// The same where tracer predicts the blocks of pymalloc's inlined fast
/// path (Debian's LTO 3.11): a prediction the table has no room for is
/// counted in `live_full` as well as in `dropped`.
#[test]
fn a_tiny_table_reports_its_overflow_on_debian_311() {
    require_root();
    let python = static_python();
    a_tiny_table_reports_its_overflow_on(Target { root: None, python: python.to_str().unwrap(), malloc: None });
}

fn a_tiny_table_reports_its_overflow_on(target: Target<'_>) {
    let n = 300;
    let (roomy, _) = run(target, n, false, &["--live"]);
    let (roomy2, _) = run(target, 2 * n, false, &["--live"]);
    let (tiny, _) = run(target, n, false, &["--live-max", "50"]);
    let (tiny2, _) = run(target, 2 * n, false, &["--live-max", "50"]);
    assert_eq!(tiny["live"]["capacity"], 50);
    let dropped = tiny["live"]["dropped"].as_u64().unwrap();
    assert!(dropped >= n, "{}", tiny["live"]);
    assert_eq!(tiny["stats"]["live_full"].as_u64(), Some(dropped), "{}", tiny["stats"]);
    assert!(field(&tiny, "count") <= 50, "{}", tiny["live"]);
    assert_eq!(roomy["live"]["dropped"], 0);
    // N more iterations add the same calls and bytes with either table
    // (the runs themselves may differ by an allocation around the loop).
    let grew = |a: &Value, b: &Value, name: &str, what: &str| {
        b["probes"][name][what].as_u64().unwrap() - a["probes"][name][what].as_u64().unwrap()
    };
    for name in roomy["probes"].as_object().unwrap().keys() {
        for what in ["calls", "bytes"] {
            assert_eq!(grew(&roomy, &roomy2, name, what), grew(&tiny, &tiny2, name, what), "{name} {what}");
        }
    }
}

#[test]
fn bad_live_input() {
    for (args, expected) in [
        (
            &["attach", "--pid", "1", "--older", "-1"][..],
            "--older must be a number of seconds, 0 or more and at most 315360000 (got -1); try --older 10",
        ),
        (
            &["attach", "--pid", "1", "--older", "abc"][..],
            "invalid value 'abc' for '--older <SECONDS>': invalid float literal; see `tracer attach --help`",
        ),
        (
            &["attach", "--pid", "1", "--live-max", "0"][..],
            "--live-max 0 leaves no room for any allocation; give the live table's room in blocks (default 262144)",
        ),
    ] {
        let (code, stdout, stderr) = run_tracer(args);
        assert_eq!(stderr, format!("tracer: error: {expected}\n"), "args {args:?}");
        assert_eq!((code, stdout.as_str()), (Some(2), ""), "args {args:?}");
    }
}

/// tests/python/live.py's line that keeps each bytearray, in `keep`; the
/// loop's line that calls `keep`; the line in `drop` that drops one.
const KEEP_LINE: u64 = 28;
const CALL_LINE: u64 = 43;
const DROP_LINE: u64 = 32;

/// The listed blocks of `size` bytes (any size: None) whose innermost
/// Python frame is `function` at live.py's `line`.
fn at_site(s: &Value, function: &str, line: u64, size: Option<u64>) -> u64 {
    let listed = s["leaks"]["oldest"].as_array().expect("leaks");
    let here = |l: &&Value| {
        let f = &l["stack"][0];
        f["function"] == function
            // In a chroot the script is a copy, `/tmp/tracer-…-live.py`.
            && f["file"].as_str().is_some_and(|p| p.ends_with("live.py") && !p.ends_with("native_live.py"))
            && f["line"] == line
            && size.is_none_or(|size| l["size"] == size)
    };
    listed.iter().filter(here).count() as u64
}

/// With `--stacks --leaks`, each listed block has the Python stack it was
/// allocated on: every kept buffer is `keep`'s at its line (called from
/// the loop), exactly N of them for N and 2N for 2N, and the bytearray
/// objects with them; no dropped buffer is listed, and no block lacks its
/// stack.
fn sites(target: Target<'_>) {
    let n = 300;
    let args = ["--leaks", "100000", "--stacks"];
    let (one, _) = run(target, n, false, &args);
    let (two, _) = run(target, 2 * n, false, &args);
    for (s, k) in [(&one, n), (&two, 2 * n)] {
        never_negative(s);
        assert_eq!(s["stats"]["live_no_stack"], 0, "{}", s["stats"]);
        assert!(s["leaks"]["sites"].as_str().is_some_and(|t| t.contains("0 of the")), "{}", s["leaks"]["sites"]);
        let listed = s["leaks"]["oldest"].as_array().expect("leaks");
        let kept: Vec<&Value> = listed.iter().filter(|l| l["size"] == KEEP + 1).collect();
        assert_eq!(kept.len() as u64, k);
        for l in kept {
            let stack = l["stack"].as_array().unwrap_or_else(|| panic!("no stack: {l}"));
            assert_eq!((&stack[0]["function"], &stack[0]["line"]), (&"keep".into(), &KEEP_LINE.into()), "{l}");
            assert_eq!((&stack[1]["function"], &stack[1]["line"]), (&"<module>".into(), &CALL_LINE.into()), "{l}");
            assert!(l.get("no_stack").is_none(), "{l}");
        }
        assert_eq!(at_site(s, "keep", KEEP_LINE, Some(KEEP + 1)), k, "{}", s["leaks"]);
        assert_eq!(at_site(s, "drop", DROP_LINE, None), 0, "{}", s["leaks"]);
        for l in listed {
            assert!(l["stack"].is_array(), "a block without its stack: {l}");
        }
    }
    // The kept object and its buffer per iteration, both at `keep`'s line.
    let grew = at_site(&two, "keep", KEEP_LINE, None) - at_site(&one, "keep", KEEP_LINE, None);
    assert_eq!(grew, 2 * n, "{}", two["leaks"]);
}

#[test]
fn leaks_have_their_sites_on_pyenv_311() {
    require_root();
    let python = shared_python();
    sites(Target { root: None, python: python.to_str().unwrap(), malloc: None });
}

#[test]
fn leaks_have_their_sites_on_debian_311_with_debug_hooks() {
    require_root();
    let python = static_python();
    sites(Target { root: None, python: python.to_str().unwrap(), malloc: Some("debug") });
}

#[test]
fn leaks_have_their_sites_on_forky_314_with_debug_hooks() {
    require_root();
    let root = forky_root();
    sites(Target { root: Some(&root), python: "python3.14", malloc: Some("debug") });
}

/// With the default allocator on the LTO builds, where pymalloc's blocks
/// are put in the table at the call's entry, before its walk.
#[test]
fn leaks_have_their_sites_on_debian_311() {
    require_root();
    let python = static_python();
    sites(Target { root: None, python: python.to_str().unwrap(), malloc: None });
}

#[test]
fn leaks_have_their_sites_on_forky_314() {
    require_root();
    let root = forky_root();
    sites(Target { root: Some(&root), python: "python3.14", malloc: None });
}

/// With `--sample 2`, a kept buffer whose call was sampled out says so:
/// each one has its site or that reason, N and 2N of them in all.
#[test]
fn sampled_out_leaks_say_why_on_pyenv_311() {
    require_root();
    let python = shared_python();
    let target = Target { root: None, python: python.to_str().unwrap(), malloc: None };
    let n = 300;
    for k in [n, 2 * n] {
        let (s, _) = run(target, k, false, &["--leaks", "100000", "--stacks", "--sample", "2"]);
        let listed = s["leaks"]["oldest"].as_array().expect("leaks");
        let kept: Vec<&Value> = listed.iter().filter(|l| l["size"] == KEEP + 1).collect();
        assert_eq!(kept.len() as u64, k);
        let sited = at_site(&s, "keep", KEEP_LINE, Some(KEEP + 1));
        let sampled_out = kept
            .iter()
            .filter(|l| l["no_stack"] == "no stack: --sample 2 left its call out" && l["stack"].is_null())
            .count() as u64;
        assert_eq!(sited + sampled_out, k, "{}", s["leaks"]);
        assert!(sited > 0 && sampled_out > 0, "{sited} with a site, {sampled_out} sampled out");
    }
}

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
        // On an LTO build the Python domains are partial (see `partial`
        // above); libc's never is.
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
