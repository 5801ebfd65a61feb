//! `tracer top` in a real terminal: tmux runs it in a pane of its own
//! (a private server), the test reads the screen with capture-pane and
//! types with send-keys. It draws the census's exact counts, sorts on a
//! key, and on q detaches and leaves the terminal as it found it.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use tracer_tests::{Workload, require_root, run_tracer, shared_python, tracer_bin};

/// A tmux server of this test's own, killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn new(name: &str) -> Self {
        Self { socket: format!("tracer-test-{name}-{}", std::process::id()) }
    }

    fn run(&self, args: &[&str]) -> String {
        // No configuration file: the test sees tmux's defaults.
        let out = Command::new("tmux")
            .args(["-f", "/dev/null", "-L"])
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux: install it (`cargo xtask setup` does)");
        assert!(out.status.success(), "tmux {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The pane's screen as it shows now.
    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "top"])
    }

    /// Waits until the screen shows what `done` looks for; panics with the
    /// screen after `secs`.
    fn wait_for(&self, what: &str, secs: u64, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let screen = self.screen();
            if done(&screen) {
                return screen;
            }
            assert!(Instant::now() < deadline, "{what} not seen in {secs} s:\n{screen}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").arg("-L").arg(&self.socket).arg("kill-server").output();
    }
}

/// The words of a screen line, the table's borders taken off.
fn cells(line: &str) -> impl Iterator<Item = &str> {
    line.split(|c: char| c.is_whitespace() || c == '│').filter(|w| !w.is_empty())
}

/// The line of `screen` that names `name` as a cell of its own, and its
/// index.
fn row<'s>(screen: &'s str, name: &str) -> Option<(usize, &'s str)> {
    screen.lines().enumerate().find(|(_, l)| cells(l).any(|w| w == name))
}

#[test]
fn top_draws_the_census_sorts_on_a_key_and_quits_on_q_restoring_the_terminal() {
    require_root();
    let python = shared_python();
    let mut workload = Workload::script(None, python.to_str().unwrap(), "top.py", &[]);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid();
    let tmux = Tmux::new("top");
    // After tracer: its status, then the terminal's modes (raw mode off
    // shows as `icanon` and `echo`) on one line written at once, then the
    // pane stays for reading.
    let script = format!(
        "{} top --pid {pid} --interval 0.5; echo EXIT=$?; echo \"MODES: $(stty -a | tr ' ' '\\n' | grep -x -e -icanon -e icanon -e -echo -e echo | tr '\\n' ' ')\"; sleep 600",
        tracer_bin().display()
    );
    tmux.run(&["new-session", "-d", "-s", "top", "-x", "200", "-y", "80", "sh", "-c", &script]);
    let both = |s: &str| row(s, "__main__.Many").is_some() && row(s, "__main__.Big").is_some();
    let screen = tmux.wait_for("both classes in the heap table", 90, both);
    assert!(screen.contains(&format!("tracer top · PID {pid} · CPython 3.11")), "{screen}");
    assert!(screen.contains("heap by type · census "), "{screen}");
    assert!(screen.contains("bytes ▼"), "sorted by bytes first:\n{screen}");
    assert_eq!(tmux.run(&["display", "-p", "-t", "top", "#{alternate_on}"]).trim(), "1", "the alternate screen");
    // The census's exact counts, and by bytes Big (3 MB) above Many (1.6 MB).
    let (big, big_line) = row(&screen, "__main__.Big").unwrap();
    let (many, many_line) = row(&screen, "__main__.Many").unwrap();
    assert!(cells(big_line).any(|w| w == "6,000"), "{big_line}");
    assert!(cells(many_line).any(|w| w == "50,000"), "{many_line}");
    assert!(big < many, "by bytes, Big first:\n{screen}");
    // The class named with a backslash, a newline and a terminal escape,
    // shown escaped (a raw escape would have coloured the pane, and
    // capture-pane would show no "\x1b"), with its count.
    let weird = r"__main__.we\\x\x0a\x1b[31mname";
    let (_, weird_line) = row(&screen, weird).unwrap_or_else(|| panic!("no {weird}:\n{screen}"));
    assert!(cells(weird_line).any(|w| w == "3,000"), "{weird_line}");
    // 2 sorts the heap table by objects: Many (50,000) above Big (6,000).
    tmux.run(&["send-keys", "-t", "top", "2"]);
    let sorted = tmux.wait_for("the table sorted by objects", 10, |s| {
        s.contains("objects ▼")
            && matches!((row(s, "__main__.Many"), row(s, "__main__.Big")), (Some(m), Some(b)) if m.0 < b.0)
    });
    assert!(!sorted.contains("bytes ▼"), "{sorted}");
    // r reverses it.
    tmux.run(&["send-keys", "-t", "top", "r"]);
    tmux.wait_for("the order reversed", 10, |s| s.contains("objects ▲"));
    // q detaches and restores the terminal: the shell's lines after it.
    tmux.run(&["send-keys", "-t", "top", "q"]);
    // The modes line comes after the exit status: wait for it, not the status.
    let after = tmux.wait_for("tracer's exit and the terminal's modes", 30, |s| s.contains("MODES:"));
    assert!(after.contains("EXIT=0"), "{after}");
    assert!(after.contains(&format!("tracer: detached from PID {pid} (signal)")), "{after}");
    let modes = after.lines().find(|l| l.starts_with("MODES:")).unwrap_or_else(|| panic!("no stty line:\n{after}"));
    assert_eq!(
        modes.split_whitespace().collect::<Vec<_>>(),
        ["MODES:", "icanon", "echo"],
        "raw mode left on:\n{after}"
    );
    assert_eq!(
        tmux.run(&["display", "-p", "-t", "top", "#{alternate_on}"]).trim(),
        "0",
        "the alternate screen left on"
    );
    assert_eq!(tmux.run(&["display", "-p", "-t", "top", "#{cursor_flag}"]).trim(), "1", "the cursor left hidden");
    // Nothing left attached: the target goes on and answers.
    workload.ping();
    workload.close();
}

#[test]
fn top_needs_a_terminal_and_writes_no_json() {
    require_root();
    // run_tracer's stdout is a pipe.
    let (code, out, err) = run_tracer(&["top", "--pid", "1"]);
    assert_eq!((code, out.as_str()), (Some(2), ""));
    assert_eq!(
        err,
        "tracer: error: tracer top draws on a terminal, and its stdout is not one; run it in a terminal, or use `tracer attach` (a table, or --json) to save or pipe the report\n"
    );
    // A flag whose report the screen has no table for, unless recorded.
    let (code, _, err) = run_tracer(&["top", "--pid", "1", "--leaks"]);
    assert_eq!(code, Some(2));
    assert_eq!(
        err,
        "tracer: error: tracer top has no table for what --live or --leaks reports; use `tracer attach` with it, or keep it with --record FILE and read it later with `tracer report FILE`\n"
    );
    let (code, _, err) = run_tracer(&["top", "--pid", "1", "--json"]);
    assert_eq!(code, Some(2));
    assert_eq!(
        err,
        "tracer: error: tracer top draws on the terminal and writes no JSON; for JSON Lines use `tracer attach --json` with the same flags\n"
    );
}

#[test]
fn top_all_shows_every_python_and_quits_on_q() {
    require_root();
    let mut workload = Workload::serve(&shared_python());
    let tmux = Tmux::new("top-all");
    let script = format!("{} top --all --exact --interval 0.5; echo EXIT=$?; sleep 600", tracer_bin().display());
    tmux.run(&["new-session", "-d", "-s", "top", "-x", "200", "-y", "80", "sh", "-c", &script]);
    let screen = tmux.wait_for("the title", 120, |s| s.contains("tracer top · every Python on the host ("));
    assert!(screen.contains("exact tracing"), "{screen}");
    // The rates' table: the serving loop's new references, counted.
    tmux.run(&["send-keys", "-t", "top", "3"]);
    tmux.wait_for("_Py_NewReference counted", 30, |s| {
        row(s, "_Py_NewReference")
            .is_some_and(|(_, l)| cells(l).any(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit() && c != '0')))
    });
    tmux.run(&["send-keys", "-t", "top", "q"]);
    let after = tmux.wait_for("tracer's exit", 60, |s| s.contains("EXIT="));
    assert!(after.contains("EXIT=0"), "{after}");
    assert!(after.contains("tracer: detached from every interpreter (signal)"), "{after}");
    workload.ping();
    workload.close();
}

#[test]
fn top_all_needs_a_terminal() {
    require_root();
    let (code, out, err) = run_tracer(&["top", "--all"]);
    assert_eq!((code, out.as_str()), (Some(2), ""));
    assert_eq!(
        err,
        "tracer: error: tracer top draws on a terminal, and its stdout is not one; run it in a terminal, or use `tracer attach` (a table, or --json) to save or pipe the report\n"
    );
}
