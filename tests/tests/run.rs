//! `tracer run`: a program started traced from its interpreter's first
//! instruction, its stdin, stdout, signals and exit status passed through,
//! and the report at its exit.

use std::{
    io::{Read as _, Write as _},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use tracer_tests::{KillOnDrop, Lines, counts, require_root, shared_python, static_python, tracer_bin};

/// A fresh directory for one test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tracer-run-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// `tracer run ARGS`, its stdout and stderr piped, its stdin `stdin`.
fn started(args: &[&str], stdin: Stdio) -> std::process::Child {
    Command::new(tracer_bin())
        .arg("run")
        .args(args)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tracer")
}

/// `tracer run ARGS`, fed `stdin`, to its end.
fn tracer_run(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = started(args, Stdio::piped());
    child.stdin.take().expect("stdin").write_all(stdin).expect("write stdin");
    child.wait_with_output().expect("tracer run")
}

/// The JSON lines of a report file.
fn report(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("the report file")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn stdin_stdout_and_the_exit_status_pass_through() {
    require_root();
    let dir = scratch("through");
    let file = dir.join("report.jsonl");
    let python = shared_python();
    let script = "import sys; data = sys.stdin.read(); print(data.upper(), end=''); sys.exit(7)";
    let out = tracer_run(
        &["--exact", "--json", "--output", file.to_str().unwrap(), "--", python.to_str().unwrap(), "-c", script],
        b"hello from stdin\n",
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "{stderr}");
    // The program's stdout is its own: the report went to the file.
    assert_eq!(text(&out.stdout), "HELLO FROM STDIN\n");
    let lines = report(&file);
    let attached = &lines[0];
    assert_eq!(attached["type"], "attached", "{attached}");
    assert_eq!(attached["mode"], "exact");
    // A program held at its entry point still has the built-in
    // allocator's pointers, which its startup may replace: its frees are
    // not moved to their implementation (docs/probes.md).
    let free = &attached["placements"]["PyObject_Free"];
    assert_eq!((free["offset"].as_u64(), free["emulated"].as_bool()), (Some(0), Some(false)), "{free}");
    let pid = attached["pid"].as_u64().expect("pid");
    let summary = lines.last().expect("summary");
    assert_eq!(summary["type"], "summary");
    assert_eq!(summary["end"], "target-exit");
    let exe = std::fs::canonicalize(&python).expect("python");
    assert_eq!(
        stderr.lines().last(),
        Some(
            format!("tracer: PID {pid} ({}) exited with status 7; the run ended: target-exit", exe.display()).as_str()
        ),
        "{stderr}"
    );
}

/// `python -c` that makes `n` objects one at a time, and ends.
fn objects(n: u64) -> String {
    format!("import itertools\nfor _ in itertools.repeat(None, {n:05}): object()\n")
}

/// The summary's counts of `tracer run --exact` on `objects(n)`.
fn run_objects(python: &Path, n: u64, dir: &Path) -> (std::collections::HashMap<String, (u64, u64)>, String) {
    let file = dir.join(format!("objects-{n}.jsonl"));
    let code = objects(n);
    // Without address randomisation (setarch execs the interpreter, which
    // tracer follows): a few startup allocations' sizes depend on
    // addresses.
    let args = [
        "--exact",
        "--json",
        "--interval",
        "3600",
        "--output",
        file.to_str().unwrap(),
        "--",
        "setarch",
        "x86_64",
        "-R",
        python.to_str().unwrap(),
    ];
    let mut cmd = Command::new(tracer_bin());
    cmd.arg("run").args(args).args(["-c", &code]).env("PYTHONHASHSEED", "0").env("PYTHONDONTWRITEBYTECODE", "1");
    let out = cmd.stdin(Stdio::null()).output().expect("tracer run");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines = report(&file);
    let summary = lines.last().expect("summary");
    for (name, value) in tracer_tests::misses(summary) {
        assert_eq!(value, 0, "BPF stat {name} is non-zero: {summary}");
    }
    (counts(summary), lines[0]["python"]["image"].as_str().expect("image").to_owned())
}

/// Every event from the interpreter's first instruction: the same program
/// with N more objects counts exactly N more of each event an object
/// makes, and its startup (which an attach to a running process never
/// sees) is counted too.
fn counted_from_the_start(python: &Path, name: &str, libpython: bool) {
    require_root();
    let dir = scratch(name);
    let n = 10_000;
    let (one, image) = run_objects(python, n, &dir);
    // The build asked for: held after the loader mapped a libpython, or
    // at the exec of an executable that holds the interpreter.
    assert_eq!(image.contains("/libpython3."), libpython, "{image}");
    let (two, _) = run_objects(python, 2 * n, &dir);
    let (three, _) = run_objects(python, 3 * n, &dir);
    // An object() is one new reference, one PyObject_Malloc of its basic
    // size (16 bytes) and one PyObject_Free. The loop frees it without the
    // exported _Py_Dealloc on 3.11 (pinned by running, as exact_counts.rs
    // does: a probe that counted a call twice would fail here); nothing
    // else differs.
    for (probe, per, bytes) in [
        ("_Py_NewReference", 1, 0),
        ("_Py_Dealloc", 0, 0),
        ("PyObject_Malloc", 1, 16),
        ("PyObject_Free", 1, 0),
        ("PyMem_RawMalloc", 0, 0),
    ] {
        let (c1, b1) = one[probe];
        let (c2, b2) = two[probe];
        let (c3, b3) = three[probe];
        assert_eq!((c2 - c1, c3 - c2), (per * n, per * n), "{probe} calls: {c1}, {c2}, {c3}");
        assert_eq!((b2 - b1, b3 - b2), (bytes * n, bytes * n), "{probe} bytes: {b1}, {b2}, {b3}");
    }
    // The startup: the interpreter's own thousands of objects.
    let (startup, _) = one["PyObject_Malloc"];
    assert!(startup > n + 5_000, "PyObject_Malloc {startup}: the startup was not counted");
}

#[test]
fn counted_from_the_first_instruction_shared_libpython() {
    counted_from_the_start(&shared_python(), "shared", true);
}

#[test]
fn counted_from_the_first_instruction_static_lto() {
    counted_from_the_start(&static_python(), "static", false);
}

#[test]
fn a_wrapper_script_is_followed_to_its_interpreter() {
    require_root();
    let dir = scratch("shim");
    let shim = dir.join("python-shim");
    std::fs::write(&shim, format!("#!/bin/sh\nexec env -u NOTHING {} \"$@\"\n", shared_python().display()))
        .expect("shim");
    Command::new("chmod").arg("+x").arg(&shim).status().expect("chmod");
    let file = dir.join("report.jsonl");
    let out = tracer_run(
        &[
            "--exact",
            "--json",
            "--output",
            file.to_str().unwrap(),
            "--",
            shim.to_str().unwrap(),
            "-c",
            "print('through', 2)",
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "through 2\n");
    let lines = report(&file);
    let version = lines[0]["python"]["version"].as_str().expect("version").to_owned();
    assert!(version.starts_with("3."), "{}", lines[0]);
    assert!(counts(lines.last().expect("summary"))["_Py_NewReference"].0 > 1_000);
}

/// The profile (the default): collections per generation read from the
/// interpreter's memory once it is initialised, every one since its start.
#[test]
fn the_profile_reads_the_collector_of_a_started_interpreter() {
    require_root();
    let dir = scratch("profile");
    let file = dir.join("report.jsonl");
    // os._exit: no collection at finalisation after the statistics.
    let script = "import gc, json, os, sys, time\n\
                  junk = [[] for _ in range(50000)]\n\
                  for _ in range(3): gc.collect()\n\
                  time.sleep(1.5)\n\
                  print(json.dumps([g['collections'] for g in gc.get_stats()]))\n\
                  sys.stdout.flush()\n\
                  time.sleep(0.6)\n\
                  os._exit(0)\n";
    let python = static_python();
    let out = tracer_run(
        &[
            "--json",
            "--interval",
            "0.5",
            "--output",
            file.to_str().unwrap(),
            "--",
            python.to_str().unwrap(),
            "-c",
            script,
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stats: Vec<u64> = serde_json::from_slice(&out.stdout).expect("the program's stats");
    let lines = report(&file);
    assert_eq!(lines[0]["mode"], "profile", "{}", lines[0]);
    let summary = lines.last().expect("summary");
    let gc = &summary["gc"];
    assert_eq!(gc["source"], "memory", "{summary}");
    let seen: Vec<u64> = gc["generations"]
        .as_array()
        .expect("generations")
        .iter()
        .map(|g| g["collections"].as_u64().expect("collections"))
        .collect();
    assert_eq!(seen, stats, "{gc}");
    assert!(stats[2] >= 3, "{stats:?}");
}

/// A child that reports the signals it gets, then exits 0 on SIGTERM. It
/// writes with `os.write`: a handler that prints can run inside the last
/// handler's print (the next signal comes as soon as its line is read)
/// and die of "reentrant call inside `BufferedWriter`", as it once did in
/// CI.
const SIGNALLED: &str = "import os, signal, sys, time\n\
    def show(n, _):\n    os.write(1, b'got %d\\n' % n)\n    if n == signal.SIGTERM: sys.exit(0)\n\
    for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM): signal.signal(s, show)\n\
    print('ready', flush=True)\n\
    while True: time.sleep(0.05)\n";

/// `tracer run ARGS` with its stdout read line by line (with a timeout),
/// killed if the test ends first.
fn spawn_run(args: &[&str]) -> (KillOnDrop, Lines) {
    let mut child = started(args, Stdio::null());
    let lines = Lines::new(child.stdout.take().expect("stdout"));
    (KillOnDrop(child), lines)
}

fn send(tracer: &KillOnDrop, signal: i32) {
    // SAFETY: kill takes two integers; the PID is our unreaped child.
    assert_eq!(unsafe { libc::kill(i32::try_from(tracer.id()).expect("pid"), signal) }, 0);
}

/// The rest of a killed-on-drop tracer: its status and stderr.
fn finish(mut tracer: KillOnDrop) -> (std::process::ExitStatus, String) {
    let mut stderr = String::new();
    tracer.0.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("stderr");
    (tracer.0.wait().expect("wait"), stderr)
}

#[test]
fn signals_sent_to_tracer_reach_the_program() {
    require_root();
    let dir = scratch("signals");
    let file = dir.join("report.txt");
    let python = shared_python();
    let (tracer, lines) =
        spawn_run(&["--output", file.to_str().unwrap(), "--", python.to_str().unwrap(), "-c", SIGNALLED]);
    assert_eq!(lines.next_line("ready").as_deref(), Some("ready"));
    for signal in [libc::SIGUSR1, libc::SIGUSR2, libc::SIGHUP, libc::SIGQUIT] {
        send(&tracer, signal);
        let got = lines.next_line("the signal");
        if got.as_deref() != Some(format!("got {signal}").as_str()) {
            // How tracer ended and what it said: in CI this once showed
            // the program's own handler failing (see SIGNALLED).
            let (status, stderr) = finish(tracer);
            let report = std::fs::read_to_string(&file).unwrap_or_default();
            panic!("after signal {signal} the program printed {got:?}; tracer: {status}: {stderr}\nreport:\n{report}");
        }
    }
    send(&tracer, libc::SIGTERM);
    assert_eq!(lines.next_line("SIGTERM").as_deref(), Some(format!("got {}", libc::SIGTERM).as_str()));
    let (status, stderr) = finish(tracer);
    assert_eq!(status.code(), Some(0), "{stderr}");
    let report = std::fs::read_to_string(&file).expect("report");
    assert!(report.contains("summary after"), "{report}");
    assert!(report.contains("the target exited"), "{report}");
}

#[test]
fn an_interrupt_from_outside_a_terminal_is_passed_on() {
    require_root();
    let python = shared_python();
    let script = "import time\nprint('ready', flush=True)\ntime.sleep(60)";
    let (tracer, lines) = spawn_run(&["--exact", "--", python.to_str().unwrap(), "-c", script]);
    assert_eq!(lines.next_line("ready").as_deref(), Some("ready"));
    let began = Instant::now();
    send(&tracer, libc::SIGINT);
    let (status, stderr) = finish(tracer);
    // KeyboardInterrupt uncaught: Python exits killed by SIGINT, as a
    // shell reports it.
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(began.elapsed() < Duration::from_secs(30));
    assert!(stderr.contains("summary after"), "{stderr}");
    assert!(stderr.lines().last().unwrap_or_default().contains("was killed by signal 2 (SIGINT)"), "{stderr}");
}

/// `--duration` ends the report, not the program: tracer waits for it and
/// exits with its status.
#[test]
fn the_report_ends_at_duration_and_the_program_runs_on() {
    require_root();
    let dir = scratch("duration");
    let file = dir.join("report.jsonl");
    let python = shared_python();
    let script = "import sys, time\ntime.sleep(2.5)\nprint('still here', flush=True)\nsys.exit(5)";
    let (tracer, lines) = spawn_run(&[
        "--exact",
        "--json",
        "--duration",
        "0.5",
        "--output",
        file.to_str().unwrap(),
        "--",
        python.to_str().unwrap(),
        "-c",
        script,
    ]);
    assert_eq!(lines.next_line("its line").as_deref(), Some("still here"));
    let (status, stderr) = finish(tracer);
    assert_eq!(status.code(), Some(5), "{stderr}");
    let summary = report(&file).last().cloned().expect("summary");
    assert_eq!(summary["end"], "duration", "{summary}");
    assert!(stderr.trim_end().ends_with("exited with status 5; the run ended: duration"), "{stderr}");
}

/// An error before the probes are live kills the held program: it never
/// runs untraced.
#[test]
fn a_failure_before_the_probes_are_live_runs_nothing() {
    require_root();
    let dir = scratch("held");
    let marker = dir.join("ran");
    let file = dir.join("report.txt");
    let script = format!("open('{}', 'w')", marker.display());
    // Debian's LTO build has inlined copies, which perf-event links cannot
    // probe: refused once the plan is made, with the program held.
    let python = static_python();
    let out = tracer_run(
        &[
            "--exact",
            "--links",
            "perf",
            "--output",
            file.to_str().unwrap(),
            "--",
            python.to_str().unwrap(),
            "-c",
            &script,
        ],
        b"",
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.starts_with("tracer: error: "), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(!marker.exists(), "the program ran");
    assert!(!file.exists(), "the report file of a program that never ran was left");
    // An interpreter tracer cannot trace (3.8) is refused the same way,
    // not run untraced.
    let old = PathBuf::from("/root/.pyenv/versions/3.8.18/bin/python3.8");
    if old.exists() {
        let out = tracer_run(&["--", old.to_str().unwrap(), "-c", &script], b"");
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("Python 3.8.18, which tracer does not support"), "{stderr}");
        assert!(!marker.exists(), "3.8 ran");
    }
}

#[test]
fn bad_commands_are_one_line_errors() {
    require_root();
    let run = |args: &[&str]| {
        let out = Command::new(tracer_bin()).arg("run").args(args).stdin(Stdio::null()).output().expect("tracer");
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let (code, _, err) = run(&["--", "/nonexistent/program"]);
    assert_eq!(code, Some(2));
    assert_eq!(
        err,
        "tracer: error: cannot run /nonexistent/program: No such file or directory (os error 2); pass a program on PATH or its path, after `--`\n"
    );
    // A program that never runs Python, and a wrapper that forks it.
    for (args, status) in [
        (vec!["--", "/bin/true"], "exited with status 0"),
        (vec!["--", "/bin/sh", "-c", "exit 3"], "exited with status 3"),
    ] {
        let (code, _, err) = run(&args);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.starts_with(&format!("tracer: error: {} (PID ", args[1])), "{err}");
        assert!(
            err.ends_with(&format!(") {status} before it ran a CPython interpreter; tracer run follows the command's own process through exec, not the processes it starts: run the interpreter itself (e.g. `tracer run -- python3 app.py`)\n")),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    let forks = format!("{} -c pass; exit 0", shared_python().display());
    let (code, out, err) = run(&["--", "/bin/sh", "-c", &forks]);
    assert_eq!((code, out.as_str()), (Some(2), ""), "{err}");
    assert!(err.contains("exited with status 0 before it ran a CPython interpreter"), "{err}");
    // Flags: no target of its own, and a command.
    let (code, _, err) = run(&["--pid", "1", "--", "python3"]);
    assert_eq!(code, Some(2));
    assert!(err.starts_with("tracer: error: the argument '--pid <PID>' cannot be used with"), "{err}");
    let (code, _, err) = run(&["--exact"]);
    assert_eq!(code, Some(2));
    assert!(err.starts_with("tracer: error: the following required arguments were not provided: <COMMAND>"), "{err}");
    // A report file that cannot be written starts nothing.
    let marker = scratch("bad").join("started");
    let script = format!("open('{}', 'w')", marker.display());
    let (code, _, err) =
        run(&["--output", "/nonexistent-dir/report", "--", shared_python().to_str().unwrap(), "-c", &script]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.starts_with("tracer: error: "), "{err}");
    assert!(err.contains("--output"), "{err}");
    assert!(!marker.exists(), "the program ran");
}
