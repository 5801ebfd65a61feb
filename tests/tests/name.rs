//! `--name PATTERN`: selects as `pgrep -f` does, and reaches the
//! interpreter below a wrapper that matches; no match and several matches
//! are one-line errors.

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use tracer_tests::{TracerRun, counts, require_root, run_tracer, shared_python, workspace_root};

/// `sh -c 'PYTHON top.py MARKER; true'`: a shell that stays the parent
/// (the `; true` keeps it from exec'ing), its command line matching
/// `MARKER` as its child's does; and the child's PID once it is ready.
fn wrapped(marker: &str) -> (Child, u32) {
    let python = shared_python();
    let script = workspace_root().join("tests/python/top.py");
    let mut shell = Command::new("sh")
        .arg("-c")
        .arg(format!("{} {} {marker}; true", python.display(), script.display()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sh");
    let mut out = BufReader::new(shell.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("ready");
    assert_eq!(line.trim(), "ready");
    std::mem::forget(out);
    let deadline = Instant::now() + Duration::from_secs(10);
    let child = loop {
        let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", shell.id())).unwrap_or_default();
        if let Some(pid) = children.split_whitespace().next() {
            break pid.parse().expect("a PID");
        }
        assert!(Instant::now() < deadline, "the shell started no child");
        std::thread::sleep(Duration::from_millis(20));
    };
    (shell, child)
}

fn stop(mut shell: Child) {
    drop(shell.stdin.take());
    let _ = shell.wait();
}

#[test]
fn name_reaches_the_interpreter_below_a_matching_wrapper() {
    require_root();
    let marker = format!("name-marker-{}", std::process::id());
    let (shell, python) = wrapped(&marker);
    // Only the shell's command line matches (the interpreter's has no
    // "; true"): the interpreter it started is the one selected, and
    // counted.
    let (tracer, attached) = TracerRun::attach_json_as(&[
        "--name",
        &format!("{marker}; true"),
        "--exact",
        "--probes",
        "_Py_NewReference",
        "--duration",
        "0.5",
    ]);
    assert_eq!(attached["pid"], python, "{attached}");
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains(&format!("detached from PID {python} (duration)")), "{stderr}");
    assert!(counts(lines.last().expect("a summary")).contains_key("_Py_NewReference"));
    stop(shell);
}

#[test]
fn name_matching_none_or_several_is_refused() {
    require_root();
    let marker = format!("name-several-{}", std::process::id());
    let (one, first) = wrapped(&format!("{marker}-a"));
    let (two, second) = wrapped(&format!("{marker}-b"));
    let (code, out, err) = run_tracer(&["attach", "--name", &marker]);
    assert_eq!((code, out.as_str()), (Some(2), ""));
    // Each command line as the error shows it: cut at 80 characters.
    let shown = |suffix: &str| {
        let command = format!(
            "{} {} {marker}-{suffix}",
            shared_python().display(),
            workspace_root().join("tests/python/top.py").display()
        );
        if command.chars().count() > 80 { command.chars().take(80).chain(['…']).collect() } else { command }
    };
    // Listed by PID.
    let mut listed = [(first, shown("a")), (second, shown("b"))];
    listed.sort();
    assert_eq!(
        err,
        format!(
            "tracer: error: --name \"{marker}\" matches 2 CPython processes: {} ({}), {} ({}); pass one with --pid, narrow the pattern, or use --exe PATH to trace every process of one interpreter\n",
            listed[0].0, listed[0].1, listed[1].0, listed[1].1
        )
    );
    // A pattern that matches every process, PID 1 too (which tracer may
    // not inspect in a container): the CPython processes it selects are
    // counted and named (the two above at least).
    let (code, _, err) = run_tracer(&["attach", "--name", "."]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.starts_with("tracer: error: --name \".\" matches "), "{err}");
    assert!(err.contains(" CPython processes: "), "{err}");
    stop(one);
    stop(two);
    let (code, _, err) = run_tracer(&["attach", "--name", &format!("^{marker}-none$")]);
    assert_eq!(code, Some(2));
    assert_eq!(
        err,
        format!(
            "tracer: error: no CPython process matches --name \"^{marker}-none$\"; check the pattern with `pgrep -af \"^{marker}-none$\"`\n"
        )
    );
    let (code, _, err) = run_tracer(&["attach", "--name", "(x"]);
    assert_eq!(code, Some(2));
    assert_eq!(
        err,
        "tracer: error: --name \"(x\" is not a regular expression: unclosed group; e.g. --name 'manage.py runserver'\n"
    );
}
