//! `--growth`: heap growth by Python stack. The check on every
//! build here (pyenv's 3.11.7, Debian's LTO 3.11, the forky root's LTO
//! 3.13 and 3.14): a target whose `grow()` keeps appending str objects to a
//! global list while `churn()` makes and drops ten times as many, one at a
//! time or in lists of 10,000 (tests/python/growth.py), has `grow` carry at
//! least 80% of the growth and `churn` under 10%, and `grow`'s pools in
//! use are what its strs fill, within the sample's error: `--growth`
//! probes every pool take, so a pool counts for the code that took it last.
//! Plus: the probes sit on instructions the kernel emulates on every
//! build, the folded output, growth in exact mode, and bad input; and the
//! profile's default growth, which probes the carves alone
//! (`growth_carve.rs` has the carves counted and a churny service).

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::Value;
use tracer_tests::{
    STATIC_PYTHON, TracerRun, Workload, forky_root, require_root, run_tracer, shared_python, static_python,
    without_debug_info,
};

/// grow/churn pairs, and the strs grow appends in each: 300,000 kept, about
/// 1,500 pools, which a sample of 1 in 32 sees as about 46 samples.
const ITERATIONS: &str = "300";
const K: &str = "1000";

/// pymalloc's pool (`POOL_SIZE`), header (`POOL_OVERHEAD`) and block
/// alignment (Objects/obmalloc.c, v3.11 to v3.14).
const POOL: u64 = 16384;
const POOL_HEADER: u64 = 48;
const ALIGNMENT: u64 = 16;

/// What a run of growth.py under `tracer attach --growth` gave.
struct Run {
    attached: Value,
    intervals: Vec<Value>,
    summary: Value,
    /// The strs grow kept, and the size of each.
    kept: (u64, u64),
    stderr: String,
}

/// growth.py `shape` run by `python` (inside `root` where given) under
/// `tracer attach --pid PID --json --growth EXTRA`, stopped with SIGINT
/// once it is done.
fn traced(root: Option<&Path>, python: &str, shape: &str, extra: &[&str]) -> Run {
    traced_as(root, python, shape, &[&["--growth"][..], extra].concat())
}

/// growth.py `shape` run by `python` (inside `root` where given) under
/// `tracer attach --pid PID --json FLAGS`, stopped with SIGINT once it is
/// done.
fn traced_as(root: Option<&Path>, python: &str, shape: &str, flags: &[&str]) -> Run {
    let mut workload = Workload::script(root, python, "growth.py", &[shape, ITERATIONS, K]);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid().to_string();
    let mut args = vec!["--pid", pid.as_str(), "--interval", "1"];
    args.extend_from_slice(flags);
    let (tracer, attached) = TracerRun::attach_json_as(&args);
    let attached_at = Instant::now();
    workload.go();
    workload.expect("done");
    let kept = workload.next_line("kept").expect("the kept line");
    let kept: Vec<u64> =
        kept.strip_prefix("kept ").expect("kept COUNT SIZE").split(' ').map(|n| n.parse().expect("a number")).collect();
    workload.wait_blocked_reading(Some(5));
    // At least one interval (a second): a fast machine runs the workload
    // in less.
    std::thread::sleep(Duration::from_millis(1300).saturating_sub(attached_at.elapsed()));
    let (lines, summary, stderr) = tracer_tests::stopped(tracer, workload);
    let intervals = lines.iter().filter(|l| l["type"] == "interval").cloned().collect();
    Run { attached, intervals, summary, kept: (kept[0], kept[1]), stderr }
}

fn u(v: &Value, what: &str) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("{what} is not a whole number: {v}"))
}

fn i(v: &Value, what: &str) -> i64 {
    v.as_i64().unwrap_or_else(|| panic!("{what} is not a whole number: {v}"))
}

fn f(v: &Value, what: &str) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{what} is not a number: {v}"))
}

/// The site of `function` in `growth`, if it has one.
fn site<'a>(growth: &'a Value, function: &str) -> Option<&'a Value> {
    growth["sites"].as_array().expect("sites").iter().find(|s| s["function"] == function)
}

/// The check on `run`'s summary: grow carries at least 80% of the
/// net growth, churn under 10%; and grow's pools in use are the pools its
/// kept strs fill, within five times the sample's standard error.
fn grow_carries_the_growth(run: &Run) {
    let g = &run.summary["growth"];
    assert_eq!(g["estimate"], true, "{g}");
    let every = u(&g["sample_every"], "sample_every");
    assert_eq!(u(&g["sample_bytes"], "sample_bytes"), every * POOL, "{g}");
    let total = i(&g["bytes"], "bytes");
    assert!(total > 0, "no growth seen: {g}\n{}", run.stderr);
    let grow = site(g, "grow").unwrap_or_else(|| panic!("no grow site: {g}"));
    let churn = site(g, "churn").map_or(0, |s| i(&s["bytes"], "churn bytes"));
    let grow_bytes = i(&grow["bytes"], "grow bytes");
    #[allow(clippy::cast_precision_loss, reason = "shares")]
    let (grow_share, churn_share) = (grow_bytes as f64 / total as f64, churn as f64 / total as f64);
    assert!(grow_share >= 0.8, "grow carries {:.1}% of the growth: {g}", grow_share * 100.0);
    assert!(churn_share < 0.1, "churn carries {:.1}% of the growth: {g}", churn_share * 100.0);
    // Every grow sample of a pool counts it once, for sample_bytes; the
    // rest are the C library's heap (KEEP's item array, resized).
    let samples = u(&grow["samples"], "samples") - u(&grow["libc_samples"], "libc_samples");
    let libc = u(&grow["libc_bytes"], "libc_bytes");
    assert_eq!(u(&grow["in_use_bytes"], "in_use_bytes"), samples * every * POOL + libc, "{grow}");
    assert!(u(&g["in_use_bytes"], "in_use_bytes") >= samples * every * POOL + libc, "{g}");
    // The total's interval holds the total, and is at least as wide as
    // grow's, whose samples it sums with every other site's.
    let total_ci = g["in_use_ci95"].as_array().expect("the total's in_use_ci95");
    let (low, high) = (f(&total_ci[0], "total ci low"), f(&total_ci[1], "total ci high"));
    #[allow(clippy::cast_precision_loss, reason = "bytes against their interval")]
    let in_use = u(&g["in_use_bytes"], "in_use_bytes") as f64;
    assert!(low <= in_use && in_use <= high, "{g}");
    let grow_ci = grow["in_use_ci95"].as_array().expect("in_use_ci95");
    assert!(high - low >= f(&grow_ci[1], "ci high") - f(&grow_ci[0], "ci low") - 1e-6, "{g}");
    // The pools grow's strs fill: the size of each rounded up to a block.
    let (count, size) = run.kept;
    let block = size.div_ceil(ALIGNMENT) * ALIGNMENT;
    let pools = count.div_ceil((POOL - POOL_HEADER) / block);
    #[allow(clippy::cast_precision_loss, reason = "an estimate against its error")]
    let (expected, estimate) = ((pools * POOL) as f64, (samples * every * POOL) as f64);
    // The interval holds the libc samples' error too (KEEP's item array,
    // sampled by bytes): wider, never narrower, than the pools' alone.
    let ci = grow["in_use_ci95"].as_array().expect("in_use_ci95");
    let half = (f(&ci[1], "ci high") - f(&ci[0], "ci low")) / 2.0;
    assert!(
        (estimate - expected).abs() <= half * 5.0 / 1.96,
        "grow holds {estimate} bytes of pools by its samples, its strs fill {expected}: {g}"
    );
    // What the probes saw adds up: each hit is an outcome, or a miss.
    let t = &g["takes"];
    let cost = &g["cost"];
    let outcomes: u64 = ["reused", "carved", "no_arena", "unread", "new_arenas"].iter().map(|k| u(&t[*k], k)).sum();
    assert_eq!(u(&cost["hits"], "hits"), outcomes, "{g}");
    assert!(u(&t["sampled"], "sampled") > 0 && u(&t["ended"], "ended") <= u(&t["sampled"], "sampled"), "{t}");
    for miss in ["walk_failed", "lost", "unread"] {
        assert_eq!(u(&t[miss], miss), 0, "{t}");
    }
    // Its cost: the hits priced, plus the programs' own time.
    #[allow(clippy::cast_precision_loss, reason = "a cost")]
    let priced =
        u(&cost["hits"], "hits") as f64 * f(&cost["hit_ns"], "hit_ns") / 1e9 + f(&cost["programs_s"], "programs");
    assert!((f(&cost["target_s"], "target_s") - priced).abs() < 1e-9, "{cost}");
    // Each interval's growth is the change of the pools in use since the
    // previous one: they add up to the last interval's.
    let grows: Vec<Option<&Value>> = run.intervals.iter().map(|l| site(&l["growth"], "grow")).collect();
    let by_intervals: i64 = grows.iter().flatten().map(|s| i(&s["bytes"], "bytes")).sum();
    let last = grows.last().copied().flatten().map_or(0, |s| u(&s["in_use_bytes"], "in_use_bytes"));
    assert_eq!(by_intervals, i64::try_from(last).unwrap(), "the intervals' grow growth against its pools in use");
}

fn pyenv_311() -> String {
    shared_python().display().to_string()
}

#[test]
fn grow_carries_the_growth_on_pyenv_311() {
    require_root();
    for shape in ["one", "list"] {
        grow_carries_the_growth(&traced(None, &pyenv_311(), shape, &[]));
    }
}

#[test]
fn grow_carries_the_growth_on_debian_311() {
    require_root();
    for shape in ["one", "list"] {
        grow_carries_the_growth(&traced(None, STATIC_PYTHON, shape, &[]));
    }
}

#[test]
fn grow_carries_the_growth_on_forky_313() {
    require_root();
    let root = forky_root();
    for shape in ["one", "list"] {
        grow_carries_the_growth(&traced(Some(&root), "/usr/bin/python3.13", shape, &[]));
    }
}

#[test]
fn grow_carries_the_growth_on_forky_314() {
    require_root();
    let root = forky_root();
    for shape in ["one", "list"] {
        grow_carries_the_growth(&traced(Some(&root), "/usr/bin/python3.14", shape, &[]));
    }
}

/// Growth in exact mode too (here with one cheap probe), and its stacks
/// folded and drawn: the grow stack's weight is its pools in use.
#[test]
fn growth_in_exact_mode_is_folded_and_drawn() {
    require_root();
    let dir = std::env::temp_dir().join(format!("tracer-growth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (folded, svg) = (dir.join("growth.folded"), dir.join("growth.svg"));
    let run = traced(
        None,
        &pyenv_311(),
        "list",
        &[
            "--exact",
            "--probes",
            "PyMem_RawMalloc",
            "--growth-folded",
            folded.to_str().unwrap(),
            "--growth-flamegraph",
            svg.to_str().unwrap(),
        ],
    );
    assert_eq!(run.attached["mode"], "exact", "{}", run.attached);
    grow_carries_the_growth(&run);
    let g = &run.summary["growth"];
    let text = std::fs::read_to_string(&folded).unwrap();
    let weight = |line: &str| line.rsplit_once(' ').and_then(|(_, n)| n.parse::<u64>().ok()).expect("a weight");
    let grow: u64 = text.lines().filter(|l| l.contains(";grow (growth.py:")).map(weight).sum();
    let stacks = g["stacks"].as_array().expect("the summary's stacks");
    let in_grow: u64 = stacks
        .iter()
        .filter(|s| s["frames"][0]["function"] == "grow")
        .map(|s| u(&s["in_use_bytes"], "in_use_bytes"))
        .sum();
    assert_eq!(grow, in_grow, "{text}");
    assert_eq!(grow, u(&site(g, "grow").unwrap()["in_use_bytes"], "in_use_bytes"), "{text}");
    assert!(text.lines().all(|l| l.ends_with(|c: char| c.is_ascii_digit()) && l.contains("[heap grown]")), "{text}");
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(
        drawn.starts_with("<?xml") && drawn.contains("heap growth of PID") && drawn.contains("grow (growth.py:"),
        "{drawn}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The take's probe is on the instruction each call runs once where
/// `usable_arenas` is in a register (a `je` the kernel emulates, past the
/// prologue's stack-pointer moves), and the arena's on the one call of
/// `arena_map_mark_used`, on every build; `tracer probes` and the attach
/// header say the same.
#[test]
fn the_probes_sit_on_emulated_instructions() {
    require_root();
    let root = forky_root();
    let builds: [(Option<&Path>, String, &str); 4] = [
        (None, pyenv_311(), "rbp"),
        (None, STATIC_PYTHON.to_owned(), "rbx"),
        (Some(&root), "/usr/bin/python3.13".to_owned(), "rcx"),
        (Some(&root), "/usr/bin/python3.14".to_owned(), "rcx"),
    ];
    for (root, python, register) in builds {
        let mut workload = Workload::script(root, &python, "growth.py", &["one", "1", "1"]);
        workload.wait_blocked_on_stdin();
        let pid = workload.pid().to_string();
        let (code, stdout, stderr) = run_tracer(&["probes", "--pid", &pid, "--growth", "--json"]);
        assert_eq!(code, Some(0), "{stderr}");
        let plan: Value = serde_json::from_str(&stdout).expect("JSON");
        let growth = &plan["growth"];
        assert!(growth.get("unavailable").is_none() && growth.get("caveat").is_none(), "{python}: {growth}");
        let points = growth["points"].as_array().expect("points");
        assert_eq!(points.len(), 2, "{python}: {growth}");
        let (take, arena) = (&points[0], &points[1]);
        assert_eq!((&take["role"], &arena["role"]), (&Value::from("take"), &Value::from("arena")), "{growth}");
        for p in points {
            assert_eq!(p["emulated"], true, "{python}: {p}");
            assert!(p["function"].as_str().unwrap().starts_with("allocate_from_new_pool"), "{p}");
        }
        assert!(take["instruction"].as_str().unwrap().starts_with("je "), "{python}: {take}");
        assert_eq!(take["reads"], format!("usable_arenas in %{register}"), "{python}: {take}");
        assert!(arena["instruction"].as_str().unwrap().starts_with("call "), "{python}: {arena}");
        let (tracer, attached) = TracerRun::attach_json_as(&["--pid", &pid, "--growth"]);
        assert_eq!(attached["growth"], *growth, "{python}: the attach header against the plan");
        tracer.signal(libc::SIGINT);
        let _ = tracer.finish();
        workload.go();
        workload.expect("done");
        let _ = workload.next_line("kept");
        workload.close();
    }
}

/// An interpreter whose debug info cannot be found (a copy of Debian's
/// LTO python3.11 without its build-id), which keeps pymalloc's slow path
/// in no symbol table: growth is unavailable, said in a note with the fix
/// and in every report, never a silent zero; the rest of the run goes on.
#[test]
fn growth_without_symbols_is_unavailable_and_says_why() {
    require_root();
    let copy: PathBuf = std::env::temp_dir().join(format!("tracer-growth-nodbg-{}-python3.11", std::process::id()));
    let copy = without_debug_info(&static_python(), &copy);
    let python = copy.display().to_string();
    let mut workload = Workload::script(None, &python, "growth.py", &["one", "1", "1"]);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid().to_string();
    let why = format!(
        "{python} has no symbol table with allocate_from_new_pool (a static function of pymalloc) and no debug file was found for it; apt-get install python3.11-dbg"
    );
    let (tracer, attached) = TracerRun::attach_json_as(&["--pid", &pid, "--growth", "--interval", "0.3"]);
    assert_eq!(attached["growth"], serde_json::json!({ "unavailable": why }), "{attached}");
    let note: Value = serde_json::from_str(&tracer.stdout.next_line("the note").expect("a note")).unwrap();
    assert_eq!(note["type"], "note", "{note}");
    assert_eq!((&note["level"], &note["code"]), (&Value::from("warning"), &Value::from("growth")), "{note}");
    assert_eq!(note["message"], format!("growth unavailable: {why}"), "{note}");
    // Past the note of when the first heap census comes.
    let interval = loop {
        let line: Value = serde_json::from_str(&tracer.stdout.next_line("an interval").expect("an interval")).unwrap();
        if line["type"] == "interval" {
            break line;
        }
        assert_eq!((&line["type"], &line["code"]), (&Value::from("note"), &Value::from("heap")), "{line}");
    };
    assert_eq!(interval["growth"], serde_json::json!({ "unavailable": why }), "{interval}");
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "{stderr}");
    assert_eq!(lines.last().unwrap()["growth"]["unavailable"], why.as_str());
    // The profile's default: the same reason, as a note, and the run goes on.
    let (tracer, attached) = TracerRun::attach_json_as(&["--pid", &pid, "--interval", "0.3"]);
    assert_eq!(
        (&attached["mode"], &attached["growth"]),
        (&Value::from("profile"), &serde_json::json!({ "unavailable": why }))
    );
    let note: Value = serde_json::from_str(&tracer.stdout.next_line("the note").expect("a note")).unwrap();
    assert_eq!((&note["level"], &note["code"]), (&Value::from("note"), &Value::from("growth")), "{note}");
    assert_eq!(note["message"], format!("growth unavailable: {why}; the profile goes on without it"), "{note}");
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "{stderr}");
    assert_eq!(lines.last().unwrap()["growth"]["unavailable"], why.as_str());
    workload.go();
    workload.expect("done");
    let _ = workload.next_line("kept");
    workload.close();
    std::fs::remove_file(&copy).unwrap();
}

/// Flags that cannot work: one line, exit status 2, nothing attached.
#[test]
fn growth_bad_input() {
    require_root();
    let (code, stdout, stderr) = run_tracer(&["attach", "--exe", STATIC_PYTHON, "--growth"]);
    assert_eq!(
        stderr,
        "tracer: error: --growth needs --pid: its samples are checked against the process's memory, which --exe does not read\n"
    );
    assert_eq!((code, stdout.as_str()), (Some(2), ""));
    for flag in ["--growth", "--growth-folded=/tmp/tracer-growth-no.folded"] {
        let (code, stdout, stderr) = run_tracer(&["attach", "--pid", "1", flag, "--no-growth"]);
        let named = flag.split('=').next().unwrap();
        assert_eq!(
            stderr,
            format!(
                "tracer: error: {named} turns growth sampling on and --no-growth turns it off; give one: --growth keeps it on whatever it costs, --no-growth leaves it off\n"
            )
        );
        assert_eq!((code, stdout.as_str()), (Some(2), ""));
    }
    let (code, stdout, stderr) = run_tracer(&[
        "attach",
        "--pid",
        "1",
        "--growth-folded",
        "/tmp/tracer-growth-same.folded",
        "--folded",
        "/tmp/tracer-growth-same.folded",
    ]);
    assert_eq!(
        stderr,
        "tracer: error: two of --folded, --flamegraph, --growth-folded, --growth-flamegraph and --pprof name /tmp/tracer-growth-same.folded; give each its own file\n"
    );
    assert_eq!((code, stdout.as_str()), (Some(2), ""));
}

/// The production profile samples growth without being asked where the
/// build allows it ("auto"), on pyenv's 3.11 with growth.py: grow carries
/// the growth, nothing stops it (steady code, whose pool takes cost well
/// under half the budget: "one"'s churn, which empties and retakes a
/// pool tens of thousands of times a second, is stopped), and the
/// profile's ledger carries its cost.
#[test]
fn the_profile_samples_growth_by_default() {
    require_root();
    let run = traced_as(None, &pyenv_311(), "steady", &[]);
    assert_eq!(run.attached["mode"], "profile", "{}", run.attached);
    let points = run.attached["growth"]["points"].as_array().unwrap_or_else(|| panic!("{}", run.attached));
    // The profile's default probes the carves (one block or two), and the
    // new arenas.
    let roles: Vec<&str> = points.iter().map(|p| p["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["carve", "carve", "arena"], "{}", run.attached);
    let g = &run.summary["growth"];
    assert!(g.get("stopped").is_none(), "{g}");
    grow_carries_the_growth(&run);
    let ledger = &run.summary["profile"]["sources"]["growth"];
    let target = f(&g["cost"]["target_s"], "target_s");
    assert!(target > 0.0 && (f(&ledger["target_s"], "ledger target_s") - target).abs() < 1e-6, "{ledger} {g}");
}

/// `n` with its thousands grouped: 24,000.
fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Auto growth holds the budget: on a target that keeps pymalloc taking
/// pools (`tests/python/growth_churn.py`) under a budget of 0.1%, growth's
/// trial (its first 50 ms, before the first interval) costs more than half
/// of it and stops growth. The note says so with the trial's figures;
/// every report keeps the samples as of the stop and costs nothing more.
#[test]
fn auto_growth_stops_over_half_the_budget() {
    require_root();
    let mut workload = Workload::script(None, &pyenv_311(), "growth_churn.py", &[]);
    workload.wait_blocked_on_stdin();
    workload.go();
    let pid = workload.pid().to_string();
    let (tracer, attached) = TracerRun::attach_json_as(&["--pid", &pid, "--budget", "0.1", "--interval", "0.5"]);
    assert!(attached["growth"]["points"].is_array(), "{attached}");
    let mut lines: Vec<Value> = Vec::new();
    let note = loop {
        let line = tracer.stdout.next_line("a line").expect("tracer goes on");
        let line: Value = serde_json::from_str(&line).expect("JSON");
        assert!(lines.len() < 40, "growth never stopped: {lines:?}");
        if line["type"] == "note" && line["code"] == "growth" {
            break line;
        }
        lines.push(line);
    };
    // Stopped by the trial, before any interval.
    assert!(lines.iter().all(|l| l["type"] != "interval"), "{lines:?}");
    let mut after = Vec::new();
    while after.len() < 2 {
        let line: Value = serde_json::from_str(&tracer.stdout.next_line("an interval").expect("an interval")).unwrap();
        if line["type"] == "interval" {
            after.push(line);
        }
    }
    tracer.signal(libc::SIGINT);
    let (status, rest, stderr) = tracer.finish();
    assert!(status.success(), "{status}: {stderr}");
    workload.close();
    let g = &after[0]["growth"];
    let stopped = g["stopped"].clone();
    let at_s = f(&stopped["at_s"], "at_s");
    // The pools' stop; the C library's part may stop later too (its own
    // clause follows), where it alone costs over half the budget: this
    // target maps and unmaps an arena hundreds of times a second.
    let reason = note["message"]
        .as_str()
        .and_then(|m| m.strip_suffix("; the pools' samples taken stay reported, as of the stop"))
        .unwrap_or_else(|| panic!("{note}"));
    assert!(stopped["reason"].as_str().is_some_and(|r| r.starts_with(reason)), "{stopped} {note}");
    assert!((0.05..0.5).contains(&at_s), "{stopped}");
    let (cost, rest_of) = reason
        .strip_prefix("growth sampling cost ")
        .and_then(|r| r.split_once("% of the target's CPU time ("))
        .unwrap_or_else(|| panic!("{reason}"));
    let cost: f64 = cost.parse().unwrap_or_else(|_| panic!("{reason}"));
    assert!(cost > 0.05, "stopped at {cost}%: {reason}");
    // The profile's default probes the carves; this target frees and maps
    // arenas over and over, whose pools are carved anew each time.
    let (per_s, tail) = rest_of.split_once(" pool carves/s), ").unwrap_or_else(|| panic!("{reason}"));
    let takes: u64 = per_s.replace(',', "").parse().unwrap_or_else(|_| panic!("{reason}"));
    assert!(takes > 0 && per_s == group(takes), "{reason}");
    assert_eq!(
        tail,
        format!(
            "over half the 0.1% budget: stopped at {at_s:.2} s; --growth keeps it on; the C library's heap is still sampled (its syscalls' tracepoints cost no trap)"
        ),
        "{reason}"
    );
    assert_eq!((&note["level"], &note["code"]), (&Value::from("note"), &Value::from("growth")), "{note}");
    // After the stop: the pools' samples as they were then. The first
    // interval holds the trial's hits and those between its reading and
    // the detach, priced in the ledger, and the growth up to the stop; from
    // the next on, no pool hit, and no cost but the C library's programs'
    // own time.
    let summary = rest.last().expect("a summary");
    assert_eq!(summary["type"], "summary", "{rest:?}");
    let pools = |g: &Value| u(&g["in_use_bytes"], "in_use_bytes") - u(&g["libc_bytes"], "libc_bytes");
    let later: Vec<&Value> = after.iter().chain(rest.iter().filter(|l| l["type"] == "interval")).collect();
    for (n, later) in later.iter().enumerate() {
        let lg = &later["growth"];
        assert_eq!((&lg["stopped"]["at_s"], pools(lg)), (&stopped["at_s"], pools(g)), "{lg}");
        assert!(lg["stopped"]["reason"].as_str().is_some_and(|r| r.starts_with(reason)), "{lg}");
        let ledger = &later["profile"]["sources"]["growth"];
        let target = f(&ledger["target_s"], "target_s");
        assert!((target - f(&lg["cost"]["target_s"], "target_s")).abs() < 1e-6, "{ledger} {lg}");
        if n > 0 {
            assert_eq!(u(&lg["cost"]["hits"], "hits"), 0, "{lg}");
            assert!((target - f(&lg["cost"]["programs_s"], "programs_s")).abs() < 1e-9, "{lg}");
        }
    }
    let sg = &summary["growth"];
    assert_eq!((&sg["stopped"]["at_s"], pools(sg)), (&stopped["at_s"], pools(g)), "{sg}");
    // Every hit of the run is in an interval: none after the detach.
    let hits: u64 = later.iter().map(|l| u(&l["growth"]["cost"]["hits"], "hits")).sum();
    assert_eq!(u(&sg["cost"]["hits"], "hits"), hits, "{sg}");
}

/// `--no-growth`: no growth at all, in the header, the intervals, the
/// summary or the ledger.
#[test]
fn no_growth_leaves_growth_off() {
    require_root();
    let run = traced_as(None, &pyenv_311(), "one", &["--no-growth"]);
    assert_eq!(run.attached["mode"], "profile", "{}", run.attached);
    assert!(run.attached.get("growth").is_none(), "{}", run.attached);
    assert!(!run.intervals.is_empty());
    for line in run.intervals.iter().chain([&run.summary]) {
        assert!(line.get("growth").is_none(), "{line}");
        assert!(line["profile"]["sources"].get("growth").is_none(), "{}", line["profile"]);
    }
}

/// What `growth_libc.py` (N grows of a SIZE-byte bytearray, each with ten
/// made and dropped) gave under `tracer attach --growth`, its glibc tuned
/// by `env`: the summary's growth.
fn libc_run(python: &str, n: u64, size: u64, env: &[(&str, &str)]) -> Value {
    let (n, size) = (n.to_string(), size.to_string());
    let workload = Workload::script_env(None, python, "growth_libc.py", &[&n, &size], env);
    let (attached, summary) = tracer_tests::profiled_until_done(workload, &["--interval", "1", "--growth"]);
    assert!(attached["growth"]["points"].is_array(), "{attached}");
    let g = summary["growth"].clone();
    assert!(g.get("caveat").is_none_or(|c| !c.to_string().contains("C library")), "{g}");
    g
}

/// The C library's heap grown by mappings (glibc's mmap threshold pinned
/// below the bytearrays, so that each is a mapping of its own): every one
/// of grow's 50 is sampled (a mapping of 1 MiB is over the sampling
/// distance) and still held, exactly its mapping's bytes (the request
/// and malloc's header rounded up to a page); churn's 500 were each
/// unmapped, so churn holds nothing. Every growth seen is one of the 550.
#[test]
fn the_c_librarys_mappings_are_charged_to_their_holder() {
    require_root();
    let (n, size) = (50, 1 << 20);
    let g = libc_run(&pyenv_311(), n, size, &[("MALLOC_MMAP_THRESHOLD_", "131072")]);
    let grow = site(&g, "grow").unwrap_or_else(|| panic!("no grow site: {g}"));
    assert_eq!(u(&grow["libc_samples"], "libc_samples"), n, "{grow}");
    // bytearray(SIZE) asks for SIZE + 1 bytes; glibc adds its 8-byte
    // header and maps whole pages.
    let mapping = (size + 1 + 8).div_ceil(4096) * 4096;
    assert_eq!(u(&grow["libc_bytes"], "libc_bytes"), n * mapping, "{grow}");
    assert_eq!(u(&g["libc_bytes"], "libc_bytes"), n * mapping, "{g}");
    assert!(site(&g, "churn").is_none_or(|c| u(&c["libc_bytes"], "libc_bytes") == 0), "{g}");
    let t = &g["takes"];
    assert_eq!(u(&t["grown"], "grown"), n * 11, "{t}");
    assert_eq!(u(&t["grown_sampled"], "grown_sampled"), n * 11, "{t}");
    assert_eq!(u(&t["unmapped"], "unmapped"), n * 10, "{t}");
    // Each of the 550 mapped and churn's 500 unmapped, once each (and the
    // list's own resizes, and the interpreter's other calls).
    assert!(u(&t["syscalls"], "syscalls") >= n * 21, "{t}");
    assert_eq!(u(&t["grown_lost"], "grown_lost"), 0, "{t}");
    assert_eq!(u(&t["mapped_missed"], "mapped_missed"), 0, "{t}");
}

/// The C library's heap grown by the break (no mapping: the threshold
/// pinned above the bytearrays; no top pad): grow's 50 each raise it and
/// keep what they raised; churn's raise it and their frees trim it back,
/// so churn holds nothing. grow holds its bytearrays' bytes within a page
/// each (the top chunk's slack).
#[test]
fn the_c_librarys_break_is_charged_to_its_holder() {
    require_root();
    let (n, size) = (50, 1 << 20);
    let env = [("MALLOC_MMAP_THRESHOLD_", "67108864"), ("MALLOC_TOP_PAD_", "0")];
    let g = libc_run(&pyenv_311(), n, size, &env);
    let grow = site(&g, "grow").unwrap_or_else(|| panic!("no grow site: {g}"));
    assert_eq!(u(&grow["libc_samples"], "libc_samples"), n, "{grow}");
    let bytes = u(&grow["libc_bytes"], "libc_bytes");
    assert!(bytes.abs_diff(n * size) <= n * 4096, "grow holds {bytes} bytes of the break for {n} × {size}: {grow}");
    assert!(site(&g, "churn").is_none_or(|c| u(&c["libc_bytes"], "libc_bytes") == 0), "{g}");
    assert_eq!(u(&g["takes"]["grown_lost"], "grown_lost"), 0, "{g}");
    assert_eq!(u(&g["takes"]["mapped_missed"], "mapped_missed"), 0, "{g}");
}

/// A growth no sample holds is not shown as a bare 0: an idle target (no
/// pool taken, nothing mapped while traced) has 0 bytes in use with a 95%
/// interval up to -ln 0.05 samples' bytes, in the JSON and in the table,
/// whose line says it is a bound. An SRE attached to a service leaking
/// about 45 KB/s saw "net 0 B, in use by takers since attach 0 B" while
/// 29 pools and a new arena were carved: nothing said a 0 of 1-in-32
/// samples could hide 1.5 MiB.
#[test]
fn no_sample_in_use_is_a_bound_not_a_zero() {
    require_root();
    let sample_bytes = 32 * POOL;
    #[allow(clippy::cast_precision_loss, reason = "a bound in bytes")]
    let bound = -(0.05f64.ln()) * sample_bytes as f64;
    for python in [pyenv_311(), STATIC_PYTHON.to_owned()] {
        let workload = Workload::script(None, &python, "growth.py", &["one", ITERATIONS, K]);
        workload.wait_blocked_on_stdin();
        let pid = workload.pid().to_string();
        let (tracer, _) = TracerRun::attach_json_as(&["--pid", &pid, "--interval", "1", "--growth"]);
        std::thread::sleep(Duration::from_millis(1300));
        let (_, summary, stderr) = tracer_tests::stopped(tracer, workload);
        let g = &summary["growth"];
        assert_eq!(u(&g["sample_bytes"], "sample_bytes"), sample_bytes, "{g}");
        assert_eq!(u(&g["in_use_bytes"], "in_use_bytes"), 0, "{python}: {g}\n{stderr}");
        assert_eq!(g["sites"].as_array().map(Vec::len), Some(0), "{python}: {g}");
        let ci = g["in_use_ci95"].as_array().expect("in_use_ci95");
        assert!(f(&ci[0], "ci low").abs() < f64::EPSILON, "{g}");
        assert!((f(&ci[1], "ci high") - bound).abs() < 1e-3, "{python}: {g}");

        let workload = Workload::script(None, &python, "growth.py", &["one", ITERATIONS, K]);
        workload.wait_blocked_on_stdin();
        let pid = workload.pid().to_string();
        let (status, out, err) = run_tracer(&["attach", "--pid", &pid, "--growth", "--duration", "1.5"]);
        workload.close();
        assert_eq!(status, Some(0), "{err}");
        let summary = out.split("\nsummary after").nth(1).unwrap_or_else(|| panic!("no summary: {out}"));
        assert!(
            summary.contains(
                "net 0 B, in use by takers since attach 0 B (≤1.5 MiB at 95%) (0 B of it the C library's heap)"
            ),
            "{python}: {summary}"
        );
    }
}
