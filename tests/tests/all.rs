//! `tracer attach --all`: every CPython process on the host, grouped by
//! interpreter, in their own namespaces too, those started after the
//! attach included, each shown by host PID, namespace PID, root and
//! command line, and counted exactly.

use std::{collections::HashMap, path::Path};

use serde_json::Value;
use tracer_tests::{
    Aslr, Body, Exit, Isolation, TracerRun, Workload, forky_root, per_pid, require_root, run_tracer, shared_python,
};

type Counts = HashMap<String, (u64, u64)>;

const N: u64 = 500;

/// pyenv's 3.13, a second host interpreter (another image, found only by
/// the scan after the attach).
const PYENV_313: &str = "/root/.pyenv/versions/3.13.0/bin/python3.13";

/// What `b` (2N iterations) counted more than `a` (N), per probe.
fn more(a: &Counts, b: &Counts) -> Counts {
    b.iter().map(|(name, c)| (name.clone(), (c.0 - a[name].0, c.1 - a[name].1))).collect()
}

/// N more iterations of `[]` + `bytearray(1000)` are N more of everything
/// the body does, and exactly one `PyMem_RawMalloc(1001)` each (the
/// bytearray's buffer, over pymalloc's 512 bytes, which reaches it through
/// `PyObject_Realloc` up to 3.12 and `PyMem_Realloc` from 3.13; `exact_counts`
/// pins the rest on each build).
fn check_more(what: &str, d: &Counts) {
    assert_eq!(d["PyMem_RawMalloc"], (N, 1001 * N), "{what}: {d:?}");
    for (name, (calls, bytes)) in d {
        assert_eq!((calls % N, bytes % N), (0, 0), "{what}: {name} {calls} calls, {bytes} bytes for {N} iterations");
    }
}

/// The JSON lines' notes, joined.
fn notes(lines: &[Value]) -> String {
    lines.iter().filter(|l| l["type"] == "note").map(|l| l["message"].to_string() + "\n").collect()
}

/// One `--all` at a time: each traces every Python of the host, the other
/// test's too.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn every_python_on_the_host_in_its_namespaces_and_later_ones_counted_exactly() {
    require_root();
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let host = shared_python();
    let root = forky_root();
    assert!(Path::new(PYENV_313).is_file(), "{PYENV_313} is missing: run `cargo xtask setup`");
    // Two of the host's interpreter and two of the forky root's, in a
    // chroot with their own mount and PID namespaces, all waiting to go.
    let objects = |python: &Path, n| Workload::once(python, n, Body::Objects, Exit::Immediate, Aslr::Off);
    let in_root = |n| {
        Workload::once_in_root(&root, "/usr/bin/python3.14", n, Body::Objects, Exit::Immediate, Isolation::Namespaces)
    };
    let mut before = vec![objects(&host, N), objects(&host, 2 * N), in_root(N), in_root(2 * N)];
    for w in &before {
        w.wait_blocked_on_stdin();
    }
    let (tracer, attached) = TracerRun::attach_json_with(&["--all", "--interval", "0.3"]);
    assert!(attached["pid"].is_null() && attached["exe"].is_null(), "{attached}");
    let images: Vec<&str> = attached["interpreters"]
        .as_array()
        .expect("interpreters")
        .iter()
        .map(|i| i["image"].as_str().expect("image"))
        .collect();
    assert!(images.iter().any(|i| i.starts_with(&format!("{}/", root.display()))), "{images:?}");
    // Two started after the attach, of an interpreter no process ran
    // before: found by the next scan, traced once its tracer attached
    // (both wait before their loop until then).
    let mut after = vec![objects(Path::new(PYENV_313), N), objects(Path::new(PYENV_313), 2 * N)];
    for w in &after {
        w.wait_blocked_on_stdin();
    }
    let mut seen = Vec::new();
    let added = loop {
        let line = tracer.stdout.next_line("the note that 3.13 is traced").expect("tracer ended early");
        let v: Value = serde_json::from_str(&line).expect("JSON");
        if v["type"] == "note" && v["message"].as_str().is_some_and(|m| m.contains("now also tracing")) {
            break v;
        }
        seen.push(line);
    };
    assert!(added["message"].as_str().unwrap().contains("Python 3.13.0"), "{added}");
    let pids: Vec<u32> = before.iter().chain(&after).map(Workload::pid).collect();
    for w in before.iter_mut().chain(after.iter_mut()) {
        w.go();
    }
    for w in before.into_iter().chain(after) {
        w.finish();
    }
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "{stderr}");
    let summary = lines.last().expect("summary");
    assert_eq!(summary["type"], "summary", "{lines:?}");
    assert_eq!(summary["end"], "signal");
    assert!(!notes(&lines).contains("ended ("), "a tracer died: {}", notes(&lines));
    let by_pid = per_pid(summary);
    let c = |i: usize| by_pid.get(&pids[i]).unwrap_or_else(|| panic!("PID {} missing: {:?}", pids[i], by_pid.keys()));
    check_more("pyenv 3.11 on the host", &more(c(0), c(1)));
    check_more("forky 3.14 in its own namespaces", &more(c(2), c(3)));
    check_more("pyenv 3.13 started after the attach", &more(c(4), c(5)));
    // Totals are the sum over every process (others on the host too).
    let totals = tracer_tests::counts(summary);
    for (name, (calls, bytes)) in &totals {
        let sum = by_pid
            .values()
            .fold((0, 0), |acc, c| (acc.0 + c.get(name).map_or(0, |x| x.0), acc.1 + c.get(name).map_or(0, |x| x.1)));
        assert_eq!((*calls, *bytes), sum, "{name}: totals are not the sum of the PIDs");
    }
    // Each process as a user knows it.
    let processes = &summary["processes"];
    for (i, pid) in pids.iter().enumerate() {
        let p = &processes[pid.to_string()];
        assert!(p["command"].as_str().is_some_and(|c| c.contains("workload") && c.contains(" once ")), "{pid}: {p}");
        assert!(p["container"].as_str().is_some_and(|c| c.starts_with('/')), "{pid}: {p}");
        if (2..4).contains(&i) {
            // The interpreter is PID 1 of its own namespace, in the root.
            assert_eq!(p["pid_in_namespace"], 1, "{pid}: {p}");
            assert_eq!(p["root"].as_str(), root.to_str(), "{pid}: {p}");
            assert!(p["image"].as_str().unwrap().ends_with("/usr/bin/python3.14"), "{p}");
        } else {
            assert!(p["pid_in_namespace"].is_null() && p["root"].is_null(), "{pid}: {p}");
        }
    }
    assert!(stderr.contains("tracer: detached from every interpreter (signal)"), "{stderr}");
}

/// Containers as a runtime makes them (`pivot_root` into the forky root,
/// own mount and PID namespaces), whose interpreter tracer reaches only
/// through `/proc/PID/root` of one of them: that image is held open, so
/// its tracer goes on when the process it was found through ends. A (N
/// iterations) is found first and exits; B, busy, is still traced by the
/// production profile's windows after that, each re-attached.
#[test]
fn containers_are_traced_past_the_end_of_the_process_they_were_found_through() {
    require_root();
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let root = forky_root();
    let container = |n| {
        Workload::once_in_root(&root, "/usr/bin/python3.13", n, Body::Objects, Exit::Immediate, Isolation::Container)
    };
    let mut a = container(N);
    a.wait_blocked_on_stdin();
    // Busy past the test's end, however slowly it runs.
    let mut b = container(5_000_000_000);
    b.wait_blocked_on_stdin();
    let (first, busy) = (a.pid(), b.pid());
    let (tracer, attached) = TracerRun::attach_json_with(&["--all", "--interval", "0.3", "--budget", "20"]);
    let images: Vec<&str> =
        attached["interpreters"].as_array().expect("interpreters").iter().filter_map(|i| i["image"].as_str()).collect();
    assert!(images.contains(&format!("/proc/{first}/root/usr/bin/python3.13").as_str()), "{images:?}");
    b.go();
    a.go();
    a.finish();
    // Windows after A's end: each attaches through the held image.
    let windows = |line: &Value| line["budget"]["windows"].as_u64().unwrap_or(0);
    // The intervals already printed are from before A's end.
    // Every line read here is kept for the notes checked at the end.
    let mut read: Vec<Value> = tracer.stdout.queued().iter().map(|l| serde_json::from_str(l).expect("JSON")).collect();
    let mut seen = vec![format!("{} lines before A ended", read.len())];
    let mut next_interval = || loop {
        let line = tracer.stdout.next_line("an interval").expect("tracer ended early");
        let v: Value = serde_json::from_str(&line).expect("JSON");
        read.push(v.clone());
        if v["type"] == "interval" {
            let b = &v["budget"];
            seen.push(format!(
                "{} windows, cost {} of {}s",
                b["windows"], b["estimated_overhead_fraction"], b["target_cpu_s"]
            ));
            break v;
        }
    };
    let at_a_end = windows(&next_interval());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while windows(&next_interval()) < at_a_end + 3 {
        assert!(std::time::Instant::now() < deadline, "no windows after A ended: {at_a_end}, then {seen:?}");
    }
    eprintln!("windows after A ended: {at_a_end}, then {seen:?}");
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "{stderr}");
    assert!(!notes(&lines).contains("ended ("), "a tracer died: {}", notes(&lines));
    assert!(!notes(&read).contains("ended ("), "a tracer died: {}", notes(&read));
    let summary = lines.last().expect("summary");
    let by_pid = per_pid(summary);
    let calls = |pid: u32| by_pid.get(&pid).and_then(|c| c.get("PyMem_RawMalloc")).map_or(0, |c| c.0);
    assert!(calls(busy) > 0, "B ({busy}) not counted: {:?}", by_pid.keys());
    for pid in [first, busy] {
        let p = &summary["processes"][pid.to_string()];
        assert_eq!(p["pid_in_namespace"], 1, "{pid}: {p}");
        assert!(p["skipped"].is_null(), "{pid}: {p}");
    }
    drop(b);
}

/// Each interpreter's tracer reports from its own attach, an interval
/// later: with --interval 5, every child attaches before --all's first
/// tick and reports after it. That tick has nothing to add up, and prints
/// nothing, not an interval with no function in it as if nothing ran.
#[test]
fn an_interval_comes_only_once_an_interpreter_has_reported() {
    require_root();
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut workload = Workload::serve(&shared_python());
    let (code, stdout, stderr) =
        run_tracer(&["attach", "--all", "--exact", "--json", "--interval", "5", "--duration", "11"]);
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).expect("JSON")).collect();
    assert_eq!(lines.last().map(|l| l["type"].clone()), Some(Value::from("summary")), "{stdout}");
    let intervals: Vec<&Value> = lines.iter().filter(|l| l["type"] == "interval").collect();
    // The tick at 10 s has every interpreter's first report to add up.
    assert!(!intervals.is_empty(), "no interval in 11 s: {stdout}");
    for line in intervals {
        assert!(!tracer_tests::counts(line).is_empty(), "an interval with no function: {line}");
    }
    workload.ping();
}

#[test]
fn all_bad_input() {
    require_root();
    for (args, error) in [
        (
            &["attach", "--all", "--types"][..],
            "tracer: error: --all does not take --types: it traces every interpreter's counts, costs and collections; for --types, trace one interpreter with --exe PATH or one process with --pid PID\n",
        ),
        (
            // --exe refuses --growth too: the error sends the user to --pid only.
            &["attach", "--all", "--growth"][..],
            "tracer: error: --all does not take --growth: it traces every interpreter's counts, costs and collections; for --growth, trace one process with --pid PID\n",
        ),
        (
            &["attach", "--all", "--exact", "--budget", "1", "--placement", "call-sites"][..],
            "tracer: error: --budget cannot be combined with --placement call-sites: adding and removing thousands of call-site probes takes far longer than a budget window; use one or the other\n",
        ),
        (
            &["attach", "--all", "--pid", "1"][..],
            "tracer: error: the argument '--all' cannot be used with '--pid <PID>'; see `tracer attach --help`\n",
        ),
    ] {
        let (code, stdout, stderr) = run_tracer(args);
        assert_eq!((code, stdout.as_str(), stderr.as_str()), (Some(2), "", error), "{args:?}");
    }
}
