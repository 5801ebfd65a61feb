//! The processes of `cargo xtask bench --only production`: the worker
//! twins (production.py, one per CPU) and the tracer attached to one of
//! them. Each is killed, and tracer stopped (so detached), when the bench
//! ends, fails or is interrupted: by its guard's drop, and by the kernel
//! (a parent-death signal) when xtask itself is killed.

use std::{
    io::{BufRead as _, BufReader, Lines, Write as _},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::bench_venvs::BenchPython;

/// production.py's path inside each root (host and forky).
pub const HARNESS_PATH: &str = "/tmp/tracer-bench-production.py";
const HARNESS: &str = include_str!("production.py");

/// How long tracer may take to attach: DWARF of an LTO build on a loaded
/// machine takes seconds, not minutes.
const ATTACH_TIMEOUT: Duration = Duration::from_mins(5);
/// How long a stopped tracer may take to detach and exit.
const DETACH_TIMEOUT: Duration = Duration::from_secs(30);

/// Writes the harness where the workers run it: on the host and in each root.
pub fn install_harness(pythons: &[BenchPython]) -> anyhow::Result<()> {
    for p in pythons {
        let path = p.host(Path::new(HARNESS_PATH));
        std::fs::write(&path, HARNESS).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Makes the kernel send `signal` to the child when xtask dies, so that no
/// worker or tracer outlives an interrupted bench.
fn die_with_parent(cmd: &mut Command, signal: libc::c_int) -> anyhow::Result<()> {
    let parent = libc::pid_t::try_from(std::process::id()).context("xtask's PID")?;
    // SAFETY: the closure runs between fork and exec; prctl, getppid and
    // raise are async-signal-safe, and it reads only the copied integers.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // xtask died before the prctl took effect.
            if libc::getppid() != parent {
                libc::raise(signal);
            }
            Ok(())
        });
    }
    Ok(())
}

/// The words that start a worker of `p` for `bench` on `cpu`. The forky
/// interpreter runs chrooted with a /proc of its own mount namespace
/// (memray reads /proc/self), so the same host PID: every step execs.
pub fn worker_words(p: &BenchPython, cpu: usize, bench: &str, args: &[&str]) -> Vec<String> {
    let mut words = vec!["taskset".to_owned(), "-c".to_owned(), cpu.to_string()];
    if let Some(root) = p.root {
        words.extend([
            "unshare".to_owned(),
            format!("--mount-proc={root}/proc"),
            "/usr/sbin/chroot".to_owned(),
            root.to_owned(),
        ]);
    }
    words.push(p.python().display().to_string());
    words.push(HARNESS_PATH.to_owned());
    words.push(bench.to_owned());
    words.extend(args.iter().map(|a| (*a).to_owned()));
    words
}

/// One round's times, from the worker's clock and getrusage.
#[derive(Clone, Copy, Debug)]
pub struct Round {
    pub wall: f64,
    pub user: f64,
    pub system: f64,
}

/// One worker process (production.py).
pub struct Worker {
    child: Child,
    /// None once closed, which ends the worker's command loop.
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    pub cpu: usize,
}

impl Worker {
    pub fn start(p: &BenchPython, cpu: usize, bench: &str, args: &[&str]) -> anyhow::Result<Self> {
        let words = worker_words(p, cpu, bench, args);
        let mut cmd = Command::new(&words[0]);
        cmd.args(&words[1..]).stdin(Stdio::piped()).stdout(Stdio::piped());
        die_with_parent(&mut cmd, libc::SIGKILL)?;
        let mut child = cmd.spawn().with_context(|| format!("starting {}", words.join(" ")))?;
        let stdin = child.stdin.take().context("worker stdin")?;
        let lines = BufReader::new(child.stdout.take().context("worker stdout")?).lines();
        let mut w = Self { child, stdin: Some(stdin), lines, cpu };
        let first = w.line().with_context(|| format!("{bench} on {} did not start", p.name))?;
        if first != "ready" {
            bail!("the {bench} worker on {} printed {first:?} instead of ready", p.name);
        }
        Ok(w)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn line(&mut self) -> anyhow::Result<String> {
        match self.lines.next() {
            Some(l) => Ok(l?),
            None => bail!("worker {} (CPU {}) exited; its error is above", self.child.id(), self.cpu),
        }
    }

    pub fn send(&mut self, command: &str) -> anyhow::Result<()> {
        let stdin = self.stdin.as_mut().context("the worker's input is closed")?;
        writeln!(stdin, "{command}")?;
        stdin.flush().context("writing to a worker")
    }

    pub fn reply(&mut self) -> anyhow::Result<Value> {
        let line = self.line()?;
        serde_json::from_str(&line).with_context(|| format!("worker printed {line:?}"))
    }

    pub fn calibrate(&mut self, seconds: f64) -> anyhow::Result<u64> {
        self.send(&format!("calibrate {seconds}"))?;
        self.reply()?["loops"].as_u64().context("calibrate gave no loops")
    }

    pub fn round_reply(&mut self) -> anyhow::Result<Round> {
        let v = self.reply()?;
        let f = |k: &str| v[k].as_f64().with_context(|| format!("round reply {v} has no {k}"));
        Ok(Round { wall: f("wall")?, user: f("user")?, system: f("system")? })
    }
}

impl Drop for Worker {
    /// Closes its input, which ends its loop and lets it remove memray's
    /// scratch directory (killed at once, it left one in /tmp per worker),
    /// then kills it if it has not exited within 5 s.
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs one round in each twin, started by the same signal (one line to
/// each, back to back), and returns (x, y).
pub fn twin_round(x: &mut Worker, y: &mut Worker, loops: u64, tool: &str) -> anyhow::Result<(Round, Round)> {
    let command = format!("round {loops} {tool}");
    x.send(&command)?;
    y.send(&command)?;
    Ok((x.round_reply()?, y.round_reply()?))
}

/// The tracer command line: `words` with `PID` replaced, pinned to `cpu`.
pub fn tracer_words(tracer: &Path, words: &[String], pid: u32, cpu: usize) -> Vec<String> {
    let mut all = vec!["taskset".to_owned(), "-c".to_owned(), cpu.to_string(), tracer.display().to_string()];
    all.extend(words.iter().map(|w| if w == "PID" { pid.to_string() } else { w.clone() }));
    all
}

/// A running tracer, stopped with SIGINT (its clean detach) on drop.
pub struct Tracer {
    child: Option<Child>,
    err: PathBuf,
}

impl Tracer {
    /// Starts the tracer, its output into `log`.out and .err, and waits
    /// until it says it is attached: a JSON `attached` line, or a line
    /// starting `tracer: attached` (on stderr at a terminal, else on stdout).
    pub fn attach(words: &[String], log: &str) -> anyhow::Result<Self> {
        let (out, err) = (PathBuf::from(format!("{log}.out")), PathBuf::from(format!("{log}.err")));
        let mut cmd = Command::new(&words[0]);
        cmd.args(&words[1..])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).with_context(|| format!("creating {}", out.display()))?)
            .stderr(std::fs::File::create(&err).with_context(|| format!("creating {}", err.display()))?);
        die_with_parent(&mut cmd, libc::SIGINT)?;
        let child = cmd.spawn().with_context(|| format!("starting {}", words.join(" ")))?;
        let mut t = Self { child: Some(child), err };
        let start = Instant::now();
        loop {
            let said = |p: &Path| {
                std::fs::read_to_string(p)
                    .unwrap_or_default()
                    .lines()
                    .any(|l| l.starts_with("tracer: attached") || l.contains("\"type\":\"attached\""))
            };
            if said(&out) || said(&t.err) {
                return Ok(t);
            }
            if let Some(status) = t.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                t.child = None;
                bail!("`{}` exited ({status}) before attaching: {}", words.join(" "), t.stderr_tail());
            }
            if start.elapsed() > ATTACH_TIMEOUT {
                bail!(
                    "`{}` did not attach within {} s: {}",
                    words.join(" "),
                    ATTACH_TIMEOUT.as_secs(),
                    t.stderr_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last lines tracer wrote to stderr (or, when none, to stdout,
    /// where it writes its notes when stderr is not a terminal), and where
    /// the rest is.
    fn stderr_tail(&self) -> String {
        let out = self.err.with_extension("out");
        let text = std::fs::read_to_string(&self.err)
            .ok()
            .filter(|t| !t.trim().is_empty())
            .or_else(|| std::fs::read_to_string(&out).ok())
            .unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "{} (all of it in {} and {})",
            lines[lines.len().saturating_sub(5)..].join(" / "),
            self.err.display(),
            out.display()
        )
    }

    /// The tracer's own CPU time so far (user + system), in seconds.
    pub fn cpu_seconds(&self) -> anyhow::Result<f64> {
        let pid = self.child.as_ref().context("tracer has exited")?.id();
        crate::procstat::cpu_s(pid)
    }

    /// Stops the tracer (SIGINT), waits for it and checks that it exited
    /// cleanly.
    pub fn detach(mut self) -> anyhow::Result<()> {
        let mut child = self.child.take().context("tracer already stopped")?;
        // A tracer that ended by itself measured less than the rounds did.
        if let Some(status) = child.try_wait()? {
            bail!("tracer exited ({status}) before the measured rounds ended: {}", self.stderr_tail());
        }
        let status = stop(child)?;
        if !status.success() {
            bail!("tracer exited with {status} when stopped: {}", self.stderr_tail());
        }
        Ok(())
    }
}

/// SIGINT, then SIGKILL if the tracer has not exited in time.
fn stop(mut child: Child) -> anyhow::Result<std::process::ExitStatus> {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill with a valid signal on our own, unreaped child.
        unsafe { libc::kill(pid, libc::SIGINT) };
    }
    let start = Instant::now();
    while start.elapsed() < DETACH_TIMEOUT {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let status = child.wait()?;
    bail!("tracer did not exit within {} s of SIGINT; killed ({status})", DETACH_TIMEOUT.as_secs())
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            let _ = stop(child);
        }
    }
}
