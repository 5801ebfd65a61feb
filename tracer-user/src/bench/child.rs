//! The processes a bench starts besides pyperf's: the loop helper, killed
//! if a count goes wrong, and another tool beside a chunk (bpftrace,
//! `tracer attach --budget`), stopped after it.

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use super::{BenchError, step};

pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.0.id()) {
            // SAFETY: kill has no memory-safety preconditions; the child is
            // ours and not yet reaped.
            unsafe { libc::kill(pid, libc::SIGINT) };
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn start_tool(name: &str, argv: &[String], ready: &str, settle: Duration) -> Result<KillOnDrop, BenchError> {
    let (program, rest) = argv.split_first().ok_or_else(|| step(name, "empty command"))?;
    let mut child = KillOnDrop(
        Command::new(program)
            .args(rest)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| step(format!("starting {program}"), e))?,
    );
    let stdout = child.0.stdout.take().ok_or_else(|| step(name, "no stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    loop {
        match lines.next() {
            Some(Ok(line)) if line.contains(ready) => break,
            Some(Ok(_)) => {}
            _ => return Err(step(format!("starting {program}"), format!("it exited before printing {ready:?}"))),
        }
    }
    // Keep draining its output so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    std::thread::sleep(settle);
    Ok(child)
}

/// Waits until `pid` sleeps in read(0, ...), so nothing it does on the way
/// into the read lands on one side of the attach in one run and on the
/// other side in the next. `what` names the process in the error.
pub fn wait_blocked_on_stdin(pid: u32, what: &str) -> Result<(), BenchError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let syscall = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
        if syscall.starts_with("0 0x0 ") {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(step(what, "it never waited on stdin"));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

pub fn stderr_line(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("(no output)").trim().to_owned()
}
