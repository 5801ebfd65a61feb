//! Allocation sites from Python stacks walked in BPF (`--stacks`): a
//! script makes N bytearrays in `make_a` and 3N in `make_b`, both called
//! from `main`. On every build, `--top` lists `make_b` above `make_a` at
//! their files and lines, N more iterations add exactly a whole number of
//! calls per iteration at each site (3 times as many at `make_b`), and the
//! stack under each site is `main`'s. A stack 200 frames deep is cut at
//! `--depth` and counted as truncated.

use std::{collections::HashMap, path::Path};

use serde_json::Value;
use tracer_tests::{
    Aslr, Body, Exit, TracerRun, Workload, forky_root, pyenv, require_root, run_tracer, shared_python, static_python,
};

/// The line of tests/python/sites.py that ends with `marker`.
fn line_of(marker: &str) -> u64 {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/sites.py");
    let text = std::fs::read_to_string(&script).expect("sites.py");
    let at = text.lines().position(|l| l.ends_with(marker)).unwrap_or_else(|| panic!("no {marker} in sites.py"));
    u64::try_from(at + 1).expect("a line number")
}

/// Where a test's workload runs: a host interpreter, or one in the forky
/// root under chroot.
#[derive(Clone, Copy)]
enum Python<'a> {
    Host(&'a Path),
    Forky(&'a str),
}

impl Python<'_> {
    fn start(self, args: &[&str]) -> Workload {
        match self {
            Self::Host(p) => Workload::script(None, &p.display().to_string(), "sites.py", args),
            Self::Forky(p) => Workload::script(Some(&forky_root()), p, "sites.py", args),
        }
    }
}

/// (calls, bytes, file) of each site of sites.py's allocating lines in a
/// sites list, by function: the site at the line its marker names (the
/// loop's own line makes its iterator there, once per call).
fn sites(line: &Value) -> HashMap<String, (u64, u64, String)> {
    let marked: HashMap<&str, u64> =
        ["make_a", "make_b", "deep"].into_iter().map(|f| (f, line_of(&format!("# {f} allocates")))).collect();
    let Some(sites) = line["sites"].as_array() else { return HashMap::new() };
    sites
        .iter()
        .filter(|s| s["function"].as_str().and_then(|f| marked.get(f)).is_some_and(|l| s["line"] == *l))
        .map(|s| {
            let name = s["function"].as_str().unwrap_or_default().to_owned();
            let file = s["file"].as_str().unwrap_or_default().to_owned();
            (name, (s["calls"].as_u64().unwrap_or(0), s["bytes"].as_u64().unwrap_or(0), file))
        })
        .collect()
}

/// Runs `sites.py n shape` under `tracer --stacks EXTRA` and returns the
/// summary. After "done" it waits until two intervals in a row show the
/// same resolved counts at `wait_for`, so that every stack was named while
/// the process ran.
fn traced(python: Python<'_>, n: u64, shape: &str, wait_for: &[&str], extra: &[&str]) -> Value {
    let mut workload = python.start(&[&n.to_string(), shape]);
    let mut args = vec!["--stacks", "--top", "30", "--interval", "0.1"];
    args.extend_from_slice(extra);
    let (tracer, attached) = TracerRun::attach_json(workload.pid(), &args);
    assert_eq!(attached["type"], "attached");
    workload.go();
    workload.expect("done");
    let mut last: Option<Vec<(u64, u64)>> = None;
    for _ in 0..600 {
        let line = tracer.stdout.next_line("an interval").expect("tracer printed an interval");
        let line: Value = serde_json::from_str(&line).expect("JSON");
        if line["type"] != "interval" {
            continue;
        }
        assert!(line.get("stacks").is_none(), "an interval carries no stacks, only sites: {line}");
        // Read while the target runs: never more events under a stack than
        // events counted (sampled, the stacked are an estimate).
        let coverage = &line["stack_coverage"];
        if coverage["sample"] == 1 {
            let (stacked, events) = (coverage["stacked"].as_u64(), coverage["events"].as_u64());
            assert!(stacked.expect("stacked") <= events.expect("events"), "{coverage}");
        }
        let now = sites(&line);
        let seen: Option<Vec<(u64, u64)>> = wait_for.iter().map(|f| now.get(*f).map(|s| (s.0, s.1))).collect();
        if seen.is_some() && seen == last {
            break;
        }
        last = seen;
    }
    workload.close();
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "tracer failed: {status}: {stderr}");
    let summary = lines.last().expect("a summary").clone();
    assert_eq!(summary["type"], "summary", "{lines:?}");
    for stat in ["stack_read_failed", "stack_no_config", "stack_other_thread", "stacks_full", "map_full"] {
        assert_eq!(summary["stats"][stat], 0, "{stat}: {}", summary["stats"]);
    }
    summary
}

/// N against 2N on `python`.
fn known_sites(python: Python<'_>) {
    let n = 500;
    let one = traced(python, n, "flat", &["make_a", "make_b"], &[]);
    let two = traced(python, 2 * n, "flat", &["make_a", "make_b"], &[]);
    let (s1, s2) = (sites(&one), sites(&two));
    // Each site at its marked line (sites() finds it there only).
    let per = |name: &str| {
        let (c1, b1, file) = s1.get(name).cloned().unwrap_or_else(|| panic!("no {name} at its line: {one}"));
        let (c2, b2, _) = s2.get(name).cloned().unwrap_or_else(|| panic!("no {name} at its line: {two}"));
        let (dc, db) = (c2 - c1, b2 - b1);
        assert_eq!((dc % n, db % n), (0, 0), "{name}: {dc} calls, {db} bytes more for {n} more iterations");
        assert!(file.ends_with("sites.py"), "{name}: {file}");
        (dc / n, db / n)
    };
    let (a, b) = (per("make_a"), per("make_b"));
    assert!(a.0 >= 1, "make_a: {a:?}");
    // Three times the bytearrays, each of the same calls.
    assert_eq!(b.0, 3 * a.0, "make_a {a:?}, make_b {b:?}");
    // Sorted by calls: make_b above make_a.
    let order: Vec<(&str, Option<u64>)> = two["sites"]
        .as_array()
        .expect("sites")
        .iter()
        .filter_map(|s| Some((s["function"].as_str()?, s["line"].as_u64())))
        .collect();
    let at = |f: &str| order.iter().position(|s| *s == (f, Some(line_of(&format!("# {f} allocates")))));
    assert!(at("make_b") < at("make_a"), "{order:?}");
    // The stack under each site: main, then the module.
    for s in two["stacks"].as_array().expect("the summary's stacks") {
        let frames: Vec<&str> =
            s["frames"].as_array().expect("frames").iter().filter_map(|f| f["function"].as_str()).collect();
        if matches!(frames.first(), Some(&"make_a" | &"make_b")) {
            assert_eq!(&frames[1..], ["main", "<module>"], "{s}");
        }
    }
    let coverage = &two["stack_coverage"];
    assert_eq!((coverage["sample"].as_u64(), coverage["estimate"].as_bool()), (Some(1), Some(false)), "{coverage}");
}

/// With `--exe`, a process already running the interpreter at the attach
/// has its frames located then, as `--pid`'s has: its first events have
/// stacks, not only those after the first reading that saw it. Readings an
/// hour apart: otherwise every event here would be under no stack. The
/// interpreter is a private copy, so that no other process is traced.
#[test]
fn exe_gives_stacks_to_a_process_running_at_the_attach_from_its_first_event() {
    require_root();
    let dir = std::env::temp_dir().join(format!("tracer-exe-stacks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let copy = dir.join("python3.11");
    std::fs::copy(static_python(), &copy).expect("copy the interpreter");
    let exe = copy.to_str().expect("UTF-8 path");
    let n = 500;
    let mut workload = Python::Host(&copy).start(&[&n.to_string(), "flat"]);
    let (tracer, _) = TracerRun::attach_json_with(&["--exe", exe, "--stacks", "--top", "30", "--interval", "3600"]);
    workload.go();
    workload.expect("done");
    // Signalled while the workload lives, so that its stacks are named.
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    workload.close();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "tracer failed: {status}: {stderr}");
    let summary = lines.last().expect("a summary");
    assert_eq!(summary["type"], "summary", "{lines:?}");
    assert_eq!(summary["stats"]["stack_no_config"], 0, "{}", summary["stats"]);
    let at = sites(summary);
    let calls = |f: &str| at.get(f).map_or(0, |s| s.0);
    assert!(calls("make_a") >= n, "make_a: {at:?}");
    assert_eq!(calls("make_b"), 3 * calls("make_a"), "{at:?}");
}

#[test]
fn known_sites_on_pyenv_311() {
    require_root();
    known_sites(Python::Host(&shared_python()));
}

/// 3.9 and 3.10: no `_PyInterpreterFrame`, the BPF walk follows the frame
/// objects' `f_back` and reads `f_lasti`, and checks the thread by its
/// `pthread_t` against the event thread's fsbase.
#[test]
fn known_sites_on_pyenv_39() {
    require_root();
    known_sites(Python::Host(&pyenv("3.9.18")));
}

#[test]
fn known_sites_on_pyenv_310() {
    require_root();
    known_sites(Python::Host(&pyenv("3.10.13")));
}

#[test]
fn known_sites_on_pyenv_312() {
    require_root();
    known_sites(Python::Host(&pyenv("3.12.1")));
}

#[test]
fn known_sites_on_pyenv_313() {
    require_root();
    known_sites(Python::Host(&pyenv("3.13.0")));
}

#[test]
fn known_sites_on_debian_311() {
    require_root();
    known_sites(Python::Host(&static_python()));
}

#[test]
fn known_sites_on_forky_313() {
    require_root();
    known_sites(Python::Forky("python3.13"));
}

#[test]
fn known_sites_on_forky_314() {
    require_root();
    known_sites(Python::Forky("python3.14"));
}

/// 200 frames deep, the walk stops at the default 64 and the event is
/// counted under the cut stack, which says so.
#[test]
fn deep_stacks_are_cut_at_the_depth_and_counted_as_truncated() {
    require_root();
    let n = 300;
    let summary = traced(Python::Host(&shared_python()), n, "deep", &["deep"], &[]);
    let deep = summary["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .find(|s| s["frames"][0]["function"] == "deep" && s["frames"][0]["line"] == line_of("# deep allocates"))
        .unwrap_or_else(|| panic!("no stack at deep's allocation: {summary}"));
    assert_eq!(deep["truncated"], true, "{deep}");
    assert_eq!(deep["frames"].as_array().map(Vec::len), Some(64), "{deep}");
    let truncated = summary["stack_coverage"]["truncated"].as_u64().expect("truncated");
    assert!(truncated >= deep["calls"].as_u64().expect("calls"), "{summary}");
    assert!(summary["stats"]["stack_truncated"].as_u64() >= Some(truncated), "{}", summary["stats"]);
}

/// --folded writes what inferno reads, and --flamegraph an SVG that names
/// both sites; neither overwrites a file without --force.
#[test]
fn folded_stacks_and_flame_graphs_are_written() {
    require_root();
    let dir = std::env::temp_dir().join(format!("tracer-sites-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let (folded, svg) = (dir.join("sites.folded"), dir.join("sites.svg"));
    let (f, s) = (folded.display().to_string(), svg.display().to_string());
    let summary = traced(
        Python::Host(&shared_python()),
        200,
        "flat",
        &["make_a", "make_b"],
        &["--folded", &f, "--flamegraph", &s, "--weight", "bytes"],
    );
    assert_eq!(summary["type"], "summary");
    let text = std::fs::read_to_string(&folded).expect("the folded file");
    let lines: Vec<&str> = text.lines().collect();
    assert!(!lines.is_empty());
    for line in &lines {
        let (stack, count) = line.rsplit_once(' ').unwrap_or_else(|| panic!("not folded: {line}"));
        assert!(count.parse::<u64>().is_ok_and(|c| c > 0), "{line}");
        assert!(!stack.is_empty(), "{line}");
    }
    assert!(
        lines.iter().any(|l| l.starts_with("<module> (sites.py:")
            && l.contains(";main (sites.py:")
            && l.contains(";make_b (sites.py:")),
        "{text}"
    );
    let svg_text = std::fs::read_to_string(&svg).expect("the SVG");
    assert!(svg_text.starts_with("<?xml") && svg_text.contains("make_a") && svg_text.contains("make_b"), "{svg_text}");
    assert!(svg_text.contains("by bytes"), "the title names the weight");
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn bad_stack_options_leave_nothing_attached_or_written() {
    require_root();
    let dir = std::env::temp_dir().join(format!("tracer-sites-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let existing = dir.join("existing.folded");
    std::fs::write(&existing, "keep me\n").expect("a file");
    let link = dir.join("link.svg");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&existing, &link).expect("a symlink");
    // A read-only file system: even root cannot write there.
    let ro = dir.join("ro");
    std::fs::create_dir_all(&ro).expect("a directory");
    let status = std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "ro", "tmpfs"]).arg(&ro).status();
    assert!(status.is_ok_and(|s| s.success()), "mount a read-only tmpfs");
    let workload = Workload::script(None, &shared_python().display().to_string(), "sites.py", &["1"]);
    let pid = workload.pid().to_string();
    let (e, l, r) =
        (existing.display().to_string(), link.display().to_string(), ro.join("x.folded").display().to_string());
    for (args, error) in [
        (vec!["--top", "0"], "--top 0 would list no site; pass the number of sites to list, e.g. --top 10".to_owned()),
        (
            vec!["--stacks", "--sample", "0"],
            "--sample 0 would record no stack; pass 1 for every event, or N for one event in N".to_owned(),
        ),
        (vec!["--folded", &e], format!("--folded {e} exists; pass --force to overwrite it, or another path")),
        (
            vec!["--native-stacks", "--budget", "5"],
            "--budget cannot be combined with --stacks (or --top, --folded, --flamegraph, --native-stacks): stack counts are not estimated from windows; use --sample N to make stacks cheaper".to_owned(),
        ),
        (
            vec!["--flamegraph", &l, "--force"],
            format!(
                "--flamegraph {l} is a symbolic link, which tracer does not write through; pass the path of a regular file"
            ),
        ),
        (
            vec!["--folded", &r],
            format!(
                "--folded {r}: cannot write in {} (Read-only file system (os error 30)); pass a path in a directory you can write",
                ro.display()
            ),
        ),
    ] {
        let mut all = vec!["attach", "--exact", "--pid", &pid];
        all.extend(args.iter().copied());
        let (code, stdout, stderr) = run_tracer(&all);
        assert_eq!((code, stdout.as_str(), stderr), (Some(2), "", format!("tracer: error: {error}\n")), "{args:?}");
    }
    assert_eq!(std::fs::read_to_string(&existing).expect("the file"), "keep me\n");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    assert!(!maps.contains("[uprobes]"), "a uprobe was left behind: {maps}");
    let _ = std::process::Command::new("umount").arg(&ro).status();
    workload.close();
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// With `--sample 10`, each event's stack is recorded with probability
/// 1/10 and the sites' counts are the sampled ones times 10, marked as
/// estimates with a 95% interval; they lie within 5 standard deviations of
/// the exact counts of an unsampled run (a bound a correct sampler misses
/// about once in 3.5 million runs).
#[test]
fn sampled_sites_are_estimates_within_their_error() {
    require_root();
    let n = 3000;
    let python = Python::Host(&shared_python());
    let exact = sites(&traced(python, n, "flat", &["make_a", "make_b"], &[]));
    let sampled_summary = traced(python, n, "flat", &["make_a", "make_b"], &["--sample", "10"]);
    let sampled = sites(&sampled_summary);
    for name in ["make_a", "make_b"] {
        #[allow(clippy::cast_precision_loss, reason = "counts of a few thousand")]
        let (c, e) = (exact[name].0 as f64, sampled[name].0 as f64);
        let sd = (c * 9.0).sqrt();
        assert!((e - c).abs() <= 5.0 * sd, "{name}: {e} estimated, {c} exact, sd {sd}");
        let site = sampled_summary["sites"]
            .as_array()
            .expect("sites")
            .iter()
            .find(|s| s["function"] == name && s["line"] == line_of(&format!("# {name} allocates")))
            .expect("the site");
        assert_eq!(site["estimate"], true, "{site}");
        let ci: Vec<f64> =
            site["calls_ci95"].as_array().expect("an interval").iter().filter_map(Value::as_f64).collect();
        assert!(ci.len() == 2 && ci[0] <= e && e <= ci[1], "{site}");
    }
    let coverage = &sampled_summary["stack_coverage"];
    assert_eq!((coverage["sample"].as_u64(), coverage["estimate"].as_bool()), (Some(10), Some(true)), "{coverage}");
}

/// The native functions of a stack, innermost first.
fn native_names(stack: &Value) -> Vec<&str> {
    stack["native"].as_array().map(|a| a.iter().filter_map(|f| f["function"].as_str()).collect()).unwrap_or_default()
}

/// (probe, Python functions, native functions) of each stack at `make_a`'s
/// and `make_b`'s marked lines, with its calls.
fn native_stacks_at_sites(summary: &Value) -> HashMap<(String, String, Vec<String>), u64> {
    let mut out = HashMap::new();
    for s in summary["stacks"].as_array().expect("the summary's stacks") {
        let Some(site) = ["make_a", "make_b"].into_iter().find(|f| {
            s["frames"][0]["function"] == *f && s["frames"][0]["line"] == line_of(&format!("# {f} allocates"))
        }) else {
            continue;
        };
        let native: Vec<String> = native_names(s).into_iter().map(str::to_owned).collect();
        let key = (s["probe"].as_str().unwrap_or_default().to_owned(), site.to_owned(), native);
        *out.entry(key).or_default() += s["calls"].as_u64().expect("calls");
    }
    out
}

/// With `--native-stacks`, N against 2N on `python`: each stack at `make_a`'s
/// and `make_b`'s lines has native frames unwound to the process's root
/// (`_start`, through `Py_RunMain`), the probed function (or the copy of
/// it inlined where the probe sits) innermost, below the eval loop (or the
/// part of it LTO split off, `.cold`); each
/// such stack's count grows by an exact multiple of N, `make_b`'s by 3 times
/// `make_a`'s; and the folded file puts the native root at the bottom, the
/// Python frames in the eval loop's place and the probe's native callers on
/// top.
fn native_sites(python: Python<'_>) {
    // One directory per call: the builds' tests run in parallel.
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = 500;
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("tracer-native-{}-{call}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a directory");
    let folded = dir.join("native.folded");
    let f = folded.display().to_string();
    let one = traced(python, n, "flat", &["make_a", "make_b"], &["--native-stacks"]);
    let two = traced(python, 2 * n, "flat", &["make_a", "make_b"], &["--native-stacks", "--folded", &f]);
    for stat in ["native_read_failed", "native_full"] {
        assert_eq!(two["stats"][stat], 0, "{stat}: {}", two["stats"]);
    }
    let mut checked = 0;
    for s in two["stacks"].as_array().expect("stacks") {
        let at_site = ["make_a", "make_b"]
            .into_iter()
            .any(|f| s["frames"][0]["function"] == f && s["frames"][0]["line"] == line_of(&format!("# {f} allocates")));
        if !at_site {
            continue;
        }
        let names = native_names(s);
        assert!(s.get("native_end").is_none(), "the unwind stopped early: {s}");
        assert_eq!(names.last(), Some(&"_start"), "the native root: {s}");
        assert!(names.contains(&"Py_RunMain"), "{s}");
        let eval = names
            .iter()
            .position(|f| f.split('.').next() == Some("_PyEval_EvalFrameDefault"))
            .unwrap_or_else(|| panic!("no eval loop: {s}"));
        let probe = s["probe"].as_str().expect("probe");
        // A free probed at the implementation its allocator pointer holds
        // (pyenv's `PyObject_Free` at `_PyObject_Free`, docs/probes.md)
        // shows the implementation: the free's jump to it left no frame.
        let implementation = format!("_{probe}");
        assert!(
            names[..eval].contains(&probe) || names[..eval].contains(&implementation.as_str()),
            "{probe} is not among the innermost native frames: {s}"
        );
        checked += 1;
    }
    assert!(checked >= 2, "no stack at make_a's and make_b's lines: {two}");
    let (s1, s2) = (native_stacks_at_sites(&one), native_stacks_at_sites(&two));
    let mut growth: HashMap<String, u64> = HashMap::new();
    for (key, c2) in &s2 {
        if *c2 < n {
            continue;
        }
        let c1 = s1.get(key).copied().unwrap_or(0);
        let d = c2 - c1;
        assert_eq!(d % n, 0, "{key:?}: {c1} then {c2} calls, for {n} more iterations");
        *growth.entry(key.1.clone()).or_default() += d / n;
    }
    let (a, b) = (growth.get("make_a").copied().unwrap_or(0), growth.get("make_b").copied().unwrap_or(0));
    assert!(a >= 1 && b == 3 * a, "per iteration: make_a {a}, make_b {b}: {s2:?}");
    let text = std::fs::read_to_string(&folded).expect("the folded file");
    assert!(
        text.lines().any(|l| l.starts_with("_start [")
            && l.contains("Py_RunMain [")
            && l.contains(";<module> (")
            && l.contains(";main (")
            && l.contains(";make_b (")
            && l.contains("sites.py:")
            && !l.contains("_PyEval_EvalFrameDefault")
            && l.rsplit_once(' ')
                .is_some_and(|(stack, _)| stack.rsplit(';').next().is_some_and(|leaf| leaf.contains(" [")))),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn native_sites_on_pyenv_311() {
    require_root();
    native_sites(Python::Host(&shared_python()));
}

#[test]
fn native_sites_on_pyenv_312() {
    require_root();
    native_sites(Python::Host(&pyenv("3.12.1")));
}

#[test]
fn native_sites_on_pyenv_313() {
    require_root();
    native_sites(Python::Host(&pyenv("3.13.0")));
}

#[test]
fn native_sites_on_debian_311() {
    require_root();
    native_sites(Python::Host(&static_python()));
}

#[test]
fn native_sites_on_forky_313() {
    require_root();
    native_sites(Python::Forky("python3.13"));
}

#[test]
fn native_sites_on_forky_314() {
    require_root();
    native_sites(Python::Forky("python3.14"));
}

/// Native frames are named after the target exits: a process traced to
/// its end has its stacks named when it is gone, with the root its debug
/// files were found in. Every frame of Debian's python3.11 in its
/// finalization's stacks has a name, and `finalize_modules` or
/// `finalize_interp_clear`, static functions only the debug file's symbol
/// table names, are among them.
#[test]
fn native_frames_are_named_after_the_target_exits() {
    require_root();
    let workload = Workload::once(&static_python(), 100, Body::Sizes, Exit::Finalize, Aslr::On);
    let args = ["--interval", "3600", "--probes", "PyObject_Malloc", "--native-stacks"];
    let (_, summary) = tracer_tests::traced_to_the_end(workload, &args);
    let python = summary["native_modules"]
        .as_array()
        .expect("native_modules")
        .iter()
        .find(|m| m["path"] == "/usr/bin/python3.11")
        .unwrap_or_else(|| panic!("no python3.11 in {}", summary["native_modules"]));
    assert!(python["dwarf"].as_str().is_some_and(|d| d.contains("/usr/lib/debug/")), "{python}");
    let (mut finalizing, mut statics) = (0, 0);
    for s in summary["stacks"].as_array().expect("stacks") {
        let frames = s["native"].as_array().expect("native frames");
        for f in frames.iter().filter(|f| f["module"] == "python3.11") {
            let name = f["function"].as_str().expect("a name");
            assert!(!name.starts_with("0x") && !name.starts_with("python3.11+"), "unnamed frame {f} in {s}");
        }
        let names = native_names(s);
        if names.contains(&"Py_FinalizeEx") {
            finalizing += 1;
            let only_in_debug =
                |n: &&str| matches!(n.split('.').next(), Some("finalize_modules" | "finalize_interp_clear"));
            statics += usize::from(names.iter().any(only_in_debug));
        }
    }
    assert!(
        finalizing > 0 && statics > 0,
        "{finalizing} stacks in Py_FinalizeEx, {statics} named from the debug file: {}",
        summary["stacks"]
    );
}

/// A module without usable unwind tables (a library built without them,
/// whose `.eh_frame` describes no function, which sites.py loads) is
/// reported: a note, and its entry in the
/// summary's `native_modules` with no rows, the reason and the fix.
#[test]
fn a_module_without_unwind_tables_is_reported() {
    require_root();
    let dir = std::env::temp_dir().join(format!("tracer-noeh-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let (source, lib) = (dir.join("noeh.c"), dir.join("libnoeh.so"));
    std::fs::write(&source, "int tracer_noeh(int x) { return x + 1; }\n").expect("the source");
    // Without unwind tables, and without the C runtime's start files,
    // whose .eh_frame would describe their own code: the .eh_frame left
    // is empty.
    let status = std::process::Command::new("gcc")
        .args(["-shared", "-fPIC", "-O2", "-nostartfiles", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"])
        .arg("-o")
        .arg(&lib)
        .arg(&source)
        .status();
    assert!(status.is_ok_and(|s| s.success()), "gcc builds the library");
    let path = lib.display().to_string();
    let python = shared_python().display().to_string();
    let mut workload = Workload::script(None, &python, "sites.py", &["100", "flat", &path]);
    let (tracer, attached) = TracerRun::attach_json(workload.pid(), &["--native-stacks", "--interval", "0.2"]);
    assert_eq!(attached["type"], "attached");
    workload.go();
    workload.expect("done");
    workload.close();
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "tracer failed: {status}: {stderr}");
    let note = lines
        .iter()
        .find(|l| l["type"] == "note" && l["message"].as_str().is_some_and(|m| m.contains(&path)))
        .unwrap_or_else(|| panic!("no note names {path}: {lines:?}"));
    assert!(note["message"].as_str().is_some_and(|m| m.contains("its .eh_frame describes no function")), "{note}");
    let summary = lines.last().expect("a summary");
    let module = summary["native_modules"]
        .as_array()
        .expect("native_modules")
        .iter()
        .find(|m| m["path"] == path.as_str())
        .unwrap_or_else(|| panic!("{path} is not in native_modules: {summary}"));
    assert_eq!(module["rows"], 0, "{module}");
    assert_eq!(module["reason"], "its .eh_frame describes no function", "{module}");
    assert!(module["fix"].as_str().is_some_and(|f| f.contains("-fasynchronous-unwind-tables")), "{module}");
    std::fs::remove_dir_all(&dir).expect("clean up");
}
