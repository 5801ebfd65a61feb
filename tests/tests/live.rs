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
    Aslr, Body, Exit, Isolation, TracerRun, Workload, forky_root,
    live::{Target, field, live_bytes, never_negative, run_script},
    require_root, run_tracer, shared_python, static_python,
};

const KEEP: u64 = 12_345;
const TEMP: u64 = 7_777;

/// One run: the summary, and the bytes one kept bytearray holds.
fn run(target: Target<'_>, n: u64, free: bool, extra: &[&str]) -> (Value, u64) {
    let args = [n.to_string(), KEEP.to_string(), TEMP.to_string(), (if free { "free" } else { "keep" }).to_owned()];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_script(target, "live.py", &args, extra)
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

/// Every block of the loop tracked: on a build whose allocators the
/// return probes see (not LTO, or `PYTHONMALLOC=debug`), every block; on
/// an LTO build with pymalloc (`inlined`), the loop's, with a few calls
/// outside it unseen, as many in both runs, and said. The workload waits
/// in a `readinto` that allocates nothing: a call after "done" of a size
/// its copy does not show would be tracked in some runs (pymalloc's slow
/// path, probed) and unseen in others (its inline fast path).
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
    for name in ["unseen_allocations", "unseen_frees"] {
        assert_eq!(field(&one, name), field(&two, name), "{name}: {} / {}", one["live"], two["live"]);
    }
    // Kept: N more bytearrays hold exactly N times one's bytes more.
    let more = live_bytes(&two) - live_bytes(&one);
    assert_eq!(more, i64::try_from(n * per).unwrap(), "one holds {per} B: {} / {}", one["live"], two["live"]);
    // Listed: exactly the kept buffers, never the dropped ones.
    assert_eq!((listed(&one, KEEP + 1), listed(&two, KEEP + 1)), (n, 2 * n), "{}", two["leaks"]["count"]);
    assert_eq!((listed(&one, TEMP + 1), listed(&two, TEMP + 1)), (0, 0));
    // Two blocks each: the object and its buffer.
    assert_eq!(
        two["leaks"]["count"].as_u64().unwrap() - one["leaks"]["count"].as_u64().unwrap(),
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
        for s in [&waiting, &reading] {
            never_negative(s);
            assert_eq!(s["stats"]["live_unmatched"], 0, "{}", s["stats"]);
        }
        assert_eq!(field(&waiting, "unseen_frees"), field(&reading, "unseen_frees"));
        assert_eq!(seen(&reading), seen(&waiting) + 1, "{}\n{}", waiting["live"], reading["live"]);
    }
}

/// A call in flight when tracer stops is not taken for a call its
/// allocator left unseen: on pyenv's 3.11, where every allocator call is
/// paired with its implementation, a target attached to while idle and
/// stopped while it allocates without end (tests/python/busy.py), five
/// times, ends with nothing unseen and figures not partial.
#[test]
fn a_busy_target_stopped_mid_call_is_not_partial_on_pyenv_311() {
    require_root();
    let python = shared_python();
    for _ in 0..5 {
        let mut workload = Workload::script(None, python.to_str().expect("UTF-8 path"), "busy.py", &[]);
        workload.wait_blocked_on_stdin();
        let (tracer, _) = TracerRun::attach_json(workload.pid(), &["--live", "--interval", "3600"]);
        workload.go();
        std::thread::sleep(std::time::Duration::from_millis(300));
        // Stopped while the workload still runs (it never exits: its guard
        // kills it).
        tracer.signal(libc::SIGINT);
        let (status, lines, stderr) = tracer.finish();
        assert!(status.success(), "tracer failed: {status}: {stderr}");
        drop(workload);
        let summary = lines.last().expect("a summary");
        assert_eq!(summary["type"], "summary", "{lines:?}");
        let unseen = field(summary, "unseen_allocations") + field(summary, "unseen_frees");
        assert_eq!(unseen, 0, "{}", summary["live"]);
        assert!(summary["live"].get("partial").is_none(), "{}", summary["live"]);
        assert_eq!(summary["stats"]["live_unmatched"], 0, "{}", summary["stats"]);
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
