//! A `tracer` run beside a workload: started, read line by line, stopped.

use std::{
    io::Read as _,
    process::{Command, ExitStatus, Stdio},
    thread::JoinHandle,
};

use serde_json::Value;

use crate::{KillOnDrop, Lines, Workload, tracer_bin};

/// A running `tracer` with piped stdout (JSON Lines) and stderr.
pub struct TracerRun {
    pub child: KillOnDrop,
    pub stdout: Lines,
    stderr: JoinHandle<String>,
}

impl TracerRun {
    /// Starts `tracer ARGS`.
    #[must_use]
    pub fn start(args: &[&str]) -> Self {
        Self::start_env(args, &[])
    }

    /// Starts `tracer ARGS` with `env` added to its environment (a test
    /// knob such as `TRACER_TEST_FULL_MAPS`, docs/development.md).
    #[must_use]
    pub fn start_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(tracer_bin())
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tracer");
        let stdout = Lines::new(child.stdout.take().expect("piped stdout"));
        let mut err = child.stderr.take().expect("piped stderr");
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Self { child: KillOnDrop(child), stdout, stderr }
    }

    /// Starts `tracer attach --exact --pid PID --json EXTRA...` and waits
    /// for the "attached" line, which it returns.
    #[must_use]
    pub fn attach_json(pid: u32, extra: &[&str]) -> (Self, Value) {
        let mut all = vec!["--exact"];
        all.extend_from_slice(extra);
        Self::profile_json(pid, &all)
    }

    /// Starts `tracer attach --exact --json ARGS...` (exact tracing, whose
    /// counts the tests check) and waits for the "attached" line, which it
    /// returns.
    #[must_use]
    pub fn attach_json_with(args: &[&str]) -> (Self, Value) {
        let mut all = vec!["--exact"];
        all.extend_from_slice(args);
        Self::attach_json_as(&all)
    }

    /// Starts `tracer attach --pid PID --json EXTRA...` in the mode the
    /// flags choose (the production profile unless one chooses exact
    /// tracing) and waits for the "attached" line, which it returns.
    #[must_use]
    pub fn profile_json(pid: u32, extra: &[&str]) -> (Self, Value) {
        let pid = pid.to_string();
        let mut args = vec!["--pid", pid.as_str()];
        args.extend_from_slice(extra);
        Self::attach_json_as(&args)
    }

    /// Starts `tracer attach --json ARGS...` as given and waits for the
    /// "attached" line, which it returns.
    #[must_use]
    pub fn attach_json_as(args: &[&str]) -> (Self, Value) {
        let mut all = vec!["attach", "--json"];
        all.extend_from_slice(args);
        let run = Self::start(&all);
        let Some(line) = run.stdout.next_line("the attached line") else {
            let (status, _, stderr) = run.finish();
            panic!("tracer exited ({status}) before attaching: {stderr}");
        };
        let attached: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON: {line}: {e}"));
        assert_eq!(attached["type"], "attached", "{line}");
        (run, attached)
    }

    /// Sends a signal to tracer.
    pub fn signal(&self, sig: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid fits");
        // SAFETY: kill has no memory-safety preconditions; the pid is our
        // own child, not yet reaped.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
    }

    /// Like [`Self::finish`], after checking that tracer succeeded:
    /// tracer's last line, its summary.
    #[must_use]
    pub fn summary(self) -> Value {
        let (status, lines, stderr) = self.finish();
        assert!(status.success(), "tracer failed: {status}: {stderr}");
        let summary = lines.last().expect("a summary").clone();
        assert_eq!(summary["type"], "summary", "{lines:?}");
        summary
    }

    /// Waits for tracer to exit; returns its status, the remaining stdout
    /// lines parsed as JSON, and its stderr.
    #[must_use]
    pub fn finish(self) -> (ExitStatus, Vec<Value>, String) {
        self.finish_lines(false)
    }

    /// Waits for a tracer killed by a signal: its exit status. Its output
    /// is not parsed: the kill may have cut its last line short.
    #[must_use]
    pub fn killed(self) -> ExitStatus {
        self.finish_lines(true).0
    }

    fn finish_lines(mut self, cut: bool) -> (ExitStatus, Vec<Value>, String) {
        let lines = self.stdout.rest("tracer's output");
        let status = self.child.wait().expect("wait for tracer");
        let stderr = self.stderr.join().expect("stderr reader");
        let json = if cut {
            Vec::new()
        } else {
            lines
                .iter()
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}\nstderr: {stderr}")))
                .collect()
        };
        (status, json, stderr)
    }
}

/// Attaches `tracer attach --json ARGS` to `workload` while it waits, runs
/// its loop to the end and returns tracer's attached line and summary,
/// after checking that tracer succeeded.
#[must_use]
pub fn traced_to_the_end(mut workload: Workload, args: &[&str]) -> (Value, Value) {
    workload.wait_blocked_on_stdin();
    let (tracer, attached) = TracerRun::attach_json(workload.pid(), args);
    workload.go();
    workload.finish();
    (attached, tracer.summary())
}

/// Attaches `tracer attach --json ARGS` to a script of tests/python that
/// printed "ready", once it waits in a read of stdin, lets it go, and once it printed "done" and waits in a
/// read(2) of 5 bytes, stops tracer with SIGINT: tracer's attached line
/// and summary, after checking that tracer succeeded.
#[must_use]
pub fn traced_until_done(workload: Workload, args: &[&str]) -> (Value, Value) {
    until_done(workload, args, TracerRun::attach_json)
}

/// [`traced_until_done`] in the mode the flags choose (the production
/// profile unless one chooses exact tracing).
#[must_use]
pub fn profiled_until_done(workload: Workload, args: &[&str]) -> (Value, Value) {
    until_done(workload, args, TracerRun::profile_json)
}

fn until_done(mut workload: Workload, args: &[&str], attach: fn(u32, &[&str]) -> (TracerRun, Value)) -> (Value, Value) {
    workload.wait_blocked_on_stdin();
    let (tracer, attached) = attach(workload.pid(), args);
    workload.go();
    workload.expect("done");
    workload.wait_blocked_reading(Some(5));
    let (_, summary, _) = stopped(tracer, workload);
    (attached, summary)
}

/// Stops `tracer` with SIGINT, checks that it succeeded and closes
/// `workload`: tracer's lines, its summary (the last of them) and its
/// stderr.
#[must_use]
pub fn stopped(tracer: TracerRun, workload: Workload) -> (Vec<Value>, Value, String) {
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "tracer failed: {status}: {stderr}");
    workload.close();
    let summary = lines.last().expect("a summary").clone();
    assert_eq!(summary["type"], "summary", "{lines:?}");
    (lines, summary, stderr)
}
