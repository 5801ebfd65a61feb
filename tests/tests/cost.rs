//! What tracing costs, shown while it runs: every interval (once the cost
//! of a hit is calibrated) and the summary carry tracer's estimated cost as
//! a share of the target's CPU time, and a cost past 10% is warned of, in
//! a note and in the table.

use std::process::{Command, Stdio};

use serde_json::Value;
use tracer_tests::{TracerRun, Workload, attached_probes, pyenv, require_root, shared_python, tracer_bin};

/// Intervals to wait for the first estimate at 0.5 s each: calibration
/// takes about half a second, more on a loaded machine.
const INTERVALS: usize = 60;

fn fraction(cost: &Value) -> f64 {
    cost["overhead_fraction"].as_f64().unwrap_or_else(|| panic!("no overhead_fraction: {cost}"))
}

/// Checks a cost object's sanity: a busy target's hits cost it some share
/// of its CPU time, and no more than all of it.
fn check_cost(cost: &Value) {
    assert_eq!(cost["estimate"], true, "{cost}");
    let f = fraction(cost);
    assert!(f > 0.0 && f <= 1.0, "overhead fraction {f}: {cost}");
    assert!(cost["tracer_cpu_s"].as_f64().expect("tracer_cpu_s") > 0.0, "{cost}");
    assert!(cost["target_cpu_s"].as_f64().expect("target_cpu_s") > 0.0, "{cost}");
    assert!(cost["hits"].as_u64().expect("hits") > 0, "{cost}");
    let costs = &cost["hit_cost_ns"];
    let (stepped, emulated) = (costs["single_stepped"].as_f64(), costs["emulated"].as_f64());
    assert!(emulated.is_some_and(|e| e > 0.0) && stepped.is_some_and(|s| s > 0.0), "calibrated costs: {costs}");
}

/// The interval lines up to the first with a cost, checking that those
/// before it have no cost at all (never a zero for one not yet known).
fn until_costed(tracer: &TracerRun) -> Value {
    for _ in 0..INTERVALS {
        let line = tracer.stdout.next_line("an interval line").expect("tracer stopped early");
        let event: Value = serde_json::from_str(&line).expect("JSON");
        assert_ne!(event["type"], "summary", "{line}");
        if event["type"] != "interval" {
            continue;
        }
        if event.get("cost").is_some() {
            return event;
        }
    }
    panic!("no interval carried a cost in {INTERVALS} intervals");
}

#[test]
fn a_busy_target_sees_the_estimated_cost_in_each_interval_and_the_summary() {
    require_root();
    let mut workload = Workload::serve(&shared_python());
    let pid = workload.pid();
    let (tracer, attached) = TracerRun::attach_json(pid, &["--interval", "0.5"]);
    // Every probe's sites, by kind.
    let sites = attached["sites"].as_object().expect("sites");
    for name in attached_probes(&attached) {
        let kinds = &sites[&name];
        let total = kinds["emulated"].as_u64().expect("emulated") + kinds["single_stepped"].as_u64().expect("stepped");
        assert!(total >= 1, "{name}: {kinds}");
    }
    let first = until_costed(&tracer);
    check_cost(&first["cost"]);
    // Each later interval has its own.
    let next = tracer.stdout.next_line("the next interval").expect("an interval");
    let next: Value = serde_json::from_str(&next).expect("JSON");
    if next["type"] == "interval" {
        check_cost(&next["cost"]);
    }
    workload.ping();
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "{status}: {stderr}");
    let summary = lines.last().expect("summary");
    assert_eq!(summary["type"], "summary");
    check_cost(&summary["cost"]);
    // Over the whole run: at least what the first costed interval saw.
    assert!(summary["cost"]["target_cpu_s"].as_f64() >= first["cost"]["target_cpu_s"].as_f64(), "{summary} {first}");
    workload.ping();
}

/// Placed inside the functions (`--placement inside`; by default exact
/// tracing of one process takes call sites), the probes whose entry is
/// single-stepped (pyenv's `_Py_Dealloc` and frees) make the same loop
/// costly, and the warning names `_Py_Dealloc` and the placement that may
/// move it, not the frees, whose addresses escape.
#[test]
fn a_high_cost_at_single_stepped_entries_points_to_call_sites() {
    require_root();
    let mut workload = Workload::serve(&pyenv("3.11.7"));
    let (tracer, _) = TracerRun::attach_json(workload.pid(), &["--placement", "inside", "--interval", "0.5"]);
    let costed = until_costed(&tracer);
    assert!(fraction(&costed["cost"]) > 0.1, "{costed}");
    let note = tracer.stdout.next_line("the high cost note").expect("a note");
    let note: Value = serde_json::from_str(&note).expect("JSON");
    assert_eq!(note["code"], "high_cost", "{note}");
    let message = note["message"].as_str().expect("message");
    assert!(
        message.contains(
            "; or --placement call-sites, which probes each call of _Py_Dealloc instead of the single-stepped entry, where the address never escapes"
        ),
        "{message}"
    );
    assert!(!message.contains("Free"), "{message}");
    workload.ping();
    tracer.signal(libc::SIGINT);
    let (status, _, stderr) = tracer.finish();
    assert!(status.success(), "{status}: {stderr}");
}

#[test]
fn single_stepped_probes_on_a_busy_target_warn_of_a_high_cost() {
    require_root();
    let mut workload = Workload::serve(&shared_python());
    let pid = workload.pid();
    // Every probe on its first instruction, which the kernel single-steps
    // here, on a loop that makes lists and bytearrays as fast as it can.
    let (tracer, _) = TracerRun::attach_json(pid, &["--placement", "entry", "--interval", "0.5"]);
    let costed = until_costed(&tracer);
    assert!(fraction(&costed["cost"]) > 0.1, "{costed}");
    // The warning follows that interval.
    let note = tracer.stdout.next_line("the high cost note").expect("a note");
    let note: Value = serde_json::from_str(&note).expect("JSON");
    assert_eq!(note["type"], "note", "{note}");
    assert_eq!(note["code"], "high_cost", "{note}");
    assert_eq!(note["level"], "warning", "{note}");
    let message = note["message"].as_str().expect("message");
    assert!(message.starts_with("tracing costs the target an estimated "), "{message}");
    assert!(message.contains("--budget PERCENT"), "{message}");
    // Placed at the entries by choice: no other placement to point to.
    assert!(!message.contains("--placement call-sites"), "{message}");
    workload.ping();
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "{status}: {stderr}");
    // Once only.
    assert!(!lines.iter().any(|l| l["code"] == "high_cost"), "told twice: {lines:?}");
    assert_eq!(stderr.matches("tracer: warning: tracing costs the target").count(), 1, "{stderr}");
    assert!(lines.last().expect("summary")["cost"]["overhead_fraction"].as_f64() > Some(0.1));

    // The table says it in every block's title, and warns under it.
    let out = Command::new(tracer_bin())
        .args([
            "attach",
            "--exact",
            "--pid",
            &pid.to_string(),
            "--placement",
            "entry",
            "--interval",
            "0.5",
            "--duration",
            "3",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run tracer");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let summary = stdout.split("\n\n").find(|b| b.starts_with("summary after")).expect("a summary block");
    let mut lines = summary.lines();
    let title = lines.next().expect("title");
    assert!(title.contains("  cost ≈") && title.ends_with(" of target CPU (estimate)"), "{title}");
    let warning = lines.next().expect("a warning line");
    assert!(warning.starts_with("  WARNING: tracing costs the target an estimated "), "{warning}");
    assert!(warning.contains("--budget PERCENT"), "{warning}");
    workload.ping();
}

/// With `--exe`, processes that start and exit between two readings (as
/// pyperf's workers do, reaped at once) are priced from the kernel's exit
/// records: no hit is left unpriced, and their CPU time, every thread's,
/// counts as the kernel charged it. The interpreter is a private copy of
/// Debian's python3.11, so that no other process on the machine is traced.
#[test]
fn processes_that_exit_between_readings_are_priced_from_their_exit_records() {
    require_root();
    let (dir, copy) = private_copy("exits");
    let exe = copy.to_str().expect("UTF-8 path");
    // Readings an hour apart: every process below exits between two.
    let (tracer, _) = TracerRun::attach_json_with(&["--exe", exe, "--interval", "3600"]);
    let work = "def work(n):\n    for _ in range(n): x = [bytearray(100)]\n";
    let bodies = [
        format!("{work}work(20_000)"),
        // Half the work on a second thread, which ends before the main one.
        format!(
            "{work}import threading\nt = threading.Thread(target=work, args=(20_000,))\nt.start(); work(20_000); t.join()"
        ),
        format!("{work}work(60_000)"),
    ];
    let mut children_cpu_s = 0.0;
    for body in &bodies {
        #[allow(clippy::zombie_processes, reason = "reaped by wait4 in wait_cpu_s, for its CPU time")]
        let child = Command::new(&copy).args(["-c", body]).spawn().expect("run the copy");
        children_cpu_s += wait_cpu_s(child.id());
    }
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "{status}: {stderr}");
    let summary = lines.last().expect("summary");
    assert_eq!(summary["pids"].as_object().map(serde_json::Map::len), Some(bodies.len()), "{summary}");
    let cost = every_hit_priced(summary);
    // The kernel's exit records count CPU time in ticks sampled; wait4
    // gives it exactly. A thread left out would take half the second
    // child's.
    let target = cost["target_cpu_s"].as_f64().expect("target_cpu_s");
    assert!(
        (target - children_cpu_s).abs() <= 0.1 * children_cpu_s + 0.05,
        "{target} s against {children_cpu_s} s: {cost}"
    );
}

/// With `--exe`, a process already running the interpreter at the attach
/// has its CPU time read from the attach on, not first at its first
/// reading: its hits before that reading are priced, not left out as if it
/// had exited between readings. Readings an hour apart make the summary
/// the first: without the attach's reading every hit would be unpriced.
#[test]
fn processes_running_before_an_exe_attach_are_priced_from_the_attach() {
    require_root();
    let (dir, copy) = private_copy("before");
    let exe = copy.to_str().expect("UTF-8 path");
    let body = "import sys\nprint('ready', flush=True)\nwhile True: x = [bytearray(100)]";
    let mut child = tracer_tests::KillOnDrop(
        Command::new(&copy).args(["-c", body]).stdout(Stdio::piped()).spawn().expect("run the copy"),
    );
    let ready = tracer_tests::Lines::new(child.stdout.take().expect("piped stdout"));
    assert_eq!(ready.next_line("ready").as_deref(), Some("ready"));
    let (tracer, _) = TracerRun::attach_json_with(&["--exe", exe, "--interval", "3600"]);
    std::thread::sleep(std::time::Duration::from_secs(2));
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "{status}: {stderr}");
    let summary = lines.last().expect("summary");
    every_hit_priced(summary);
}

/// The summary's cost, checked, with every hit priced: every call, and
/// every pass of a gated site that went elsewhere (a hit that counts no
/// call).
fn every_hit_priced(summary: &Value) -> &Value {
    let cost = &summary["cost"];
    check_cost(cost);
    assert_eq!(cost.get("unpriced_hits"), None, "every hit priced: {cost}");
    let all: u64 = tracer_tests::counts(summary).values().map(|(calls, _)| calls).sum();
    let gate_other = summary["stats"]["gate_other"].as_u64().expect("gate_other");
    assert_eq!(cost["hits"].as_u64(), Some(all + gate_other), "{cost}");
    cost
}

/// A private copy of Debian's python3.11 in a directory of its own (the
/// directory, the copy), so that `--exe` of it traces no other process.
fn private_copy(name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("tracer-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let copy = dir.join("python3.11");
    std::fs::copy(tracer_tests::static_python(), &copy).expect("copy the interpreter");
    (dir, copy)
}

/// Reaps child `pid` and returns the CPU time it used, user and system.
fn wait_cpu_s(pid: u32) -> f64 {
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = libc::pid_t::try_from(pid).expect("pid fits");
    // SAFETY: status and usage are valid for writes through the call; the
    // child is ours and not yet reaped.
    assert_eq!(unsafe { libc::wait4(pid, &raw mut status, 0, &raw mut usage) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status}");
    let s = |t: libc::timeval| {
        let whole = u64::try_from(t.tv_sec).expect("seconds");
        std::time::Duration::new(whole, u32::try_from(t.tv_usec * 1000).expect("µs")).as_secs_f64()
    };
    s(usage.ru_utime) + s(usage.ru_stime)
}

/// Seconds since 1970, as `calibrated_unix_s` counts them.
fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_secs_f64()
}

/// Calibrating takes seconds, so its figures are kept for an hour in
/// /run/tracer/calibration.json: a run after one that measured reuses
/// them, and says when they were measured. (Other tests' tracers may
/// measure and keep meanwhile, so the second run is only checked not to
/// have measured itself.)
#[test]
fn a_calibration_is_kept_for_the_next_run_and_dated() {
    require_root();
    let kept = std::path::Path::new("/run/tracer/calibration.json");
    let _ = std::fs::remove_file(kept);
    let mut workload = Workload::serve(&shared_python());
    let pid = workload.pid().to_string();
    let measured_at = || {
        let (code, stdout, stderr) =
            tracer_tests::run_tracer(&["attach", "--pid", &pid, "--budget", "1", "--duration", "1", "--json"]);
        assert_eq!(code, Some(0), "{stderr}");
        let summary: Value = serde_json::from_str(stdout.lines().last().expect("a summary")).expect("JSON");
        let costs = &summary["budget"]["hit_cost_ns"];
        costs["calibrated_unix_s"].as_f64().unwrap_or_else(|| panic!("not dated: {costs}"))
    };
    let start = unix_now();
    let first = measured_at();
    assert!(first > start - 10.0 && first < unix_now(), "measured at {first}, the run began at {start}");
    assert!(kept.is_file(), "{} was not written", kept.display());
    let second_start = unix_now();
    let second = measured_at();
    assert!(second < second_start, "the second run measured again: at {second}, it began at {second_start}");
    workload.ping();
}
