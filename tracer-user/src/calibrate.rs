//! Measures what one probe hit costs on this machine, for `--budget`.
//!
//! tracer re-runs itself as a child that calls [`tracer_calibration_point`]
//! in a loop and times batches of calls. The parent attaches tracer's own
//! counting program to that function, once at its first instruction (a
//! `mov`, which the kernel single-steps) and once at its second (a `push`,
//! which the kernel emulates), and takes the difference from unprobed
//! batches. The hit counts are checked against the calls made, so a probe
//! that did not fire cannot pass for a cheap one.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::PathBuf,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
};

use thiserror::Error;

use crate::{
    budget::HitCosts,
    elf::{ElfError, ElfImage},
    probes::{ProbeKind, ProbeSpec, Program},
    session::{AttachError, ImageRef, PlacementMode, Session, SessionOptions},
};

/// The hidden subcommand that runs the child side.
pub const CHILD_COMMAND: &str = "__calibration-child";

const SYMBOL: &str = "tracer_calibration_point";
/// Calls per timed batch: about 50 ms single-stepped, 15 ms emulated.
const SINGLE_STEPPED_CALLS: u64 = 3_000;
const EMULATED_CALLS: u64 = 30_000;
const ROUNDS: usize = 3;

/// The probed function: `mov %rdi,%rax` (single-stepped), then `push %rbx`
/// (emulated), so one function offers both kinds of probe point. Written in
/// assembly because only then are its instructions known.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub extern "C" fn tracer_calibration_point(x: u64) -> u64 {
    core::arch::naked_asm!("mov rax, rdi", "push rbx", "pop rbx", "ret")
}

/// Why calibration failed.
#[derive(Debug, Error)]
pub enum CalibrationError {
    #[error("calibrating the cost of a probe hit: cannot find tracer's own executable: {0}")]
    OwnExe(std::io::Error),
    #[error("calibrating the cost of a probe hit: {0}")]
    Elf(#[from] ElfError),
    #[error(
        "calibrating the cost of a probe hit: {path} has no symbol {SYMBOL} (a stripped build?); rebuild tracer without stripping its symbol table"
    )]
    NoSymbol { path: PathBuf },
    #[error("calibrating the cost of a probe hit: {0}")]
    Attach(#[from] AttachError),
    #[error("calibrating the cost of a probe hit: the calibration child failed: {0}")]
    Child(std::io::Error),
    #[error(
        "calibrating the cost of a probe hit: the probe at {SYMBOL}{where_} counted {counted} hits for {calls} calls"
    )]
    Miscounted { where_: &'static str, counted: u64, calls: u64 },
    #[error("calibrating the cost of a probe hit: {SYMBOL} was placed {got}, expected {expected}")]
    Placement { got: String, expected: &'static str },
}

/// Runs the child side: reads a number of calls per line on stdin, makes
/// them, and answers with the nanoseconds they took.
///
/// # Errors
/// When stdin or stdout fail.
pub fn child_main() -> std::io::Result<()> {
    let stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    for line in stdin.lines() {
        let calls: u64 = line?.trim().parse().map_err(std::io::Error::other)?;
        let start = std::time::Instant::now();
        let mut x = 0u64;
        for _ in 0..calls {
            // black_box keeps the call: the point is to hit the probe.
            x = std::hint::black_box(tracer_calibration_point)(x);
        }
        let elapsed = start.elapsed().as_nanos();
        writeln!(stdout, "{elapsed} {x}")?;
        stdout.flush()?;
    }
    Ok(())
}

struct ChildProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl ChildProcess {
    fn start(exe: &std::path::Path) -> Result<Self, CalibrationError> {
        let mut child = Command::new(exe)
            .arg(CHILD_COMMAND)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(CalibrationError::Child)?;
        let missing = || CalibrationError::Child(std::io::Error::other("no pipe"));
        let stdin = child.stdin.take().ok_or_else(missing)?;
        let stdout = BufReader::new(child.stdout.take().ok_or_else(missing)?);
        Ok(Self { child, stdin, stdout })
    }

    /// Nanoseconds `calls` calls took.
    #[allow(clippy::cast_precision_loss, reason = "nanoseconds of a short batch")]
    fn time(&mut self, calls: u64) -> Result<f64, CalibrationError> {
        writeln!(self.stdin, "{calls}").map_err(CalibrationError::Child)?;
        let mut line = String::new();
        self.stdout.read_line(&mut line).map_err(CalibrationError::Child)?;
        let ns: u64 = line
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| CalibrationError::Child(std::io::Error::other(format!("unexpected answer {line:?}"))))?;
        Ok(ns as f64)
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Measures [`HitCosts`] on this machine (about half a second).
///
/// # Errors
/// When tracer's own image cannot be probed or the probes miscount.
pub fn calibrate() -> Result<HitCosts, CalibrationError> {
    let exe = std::env::current_exe().map_err(CalibrationError::OwnExe)?;
    let elf = ElfImage::open(&exe)?;
    if elf.function(SYMBOL).is_none() {
        return Err(CalibrationError::NoSymbol { path: exe });
    }
    let image = ImageRef { elf: &elf, display_path: &exe, attach_path: &exe };
    let spec = [ProbeSpec { symbol: SYMBOL, program: Program::CountCall, kind: ProbeKind::Entry, required: true }];
    let mut child = ChildProcess::start(&exe)?;
    let pid = child.child.id();
    let session =
        |placement| Session::load(image, &spec, pid, SessionOptions { placement, ..SessionOptions::default() });
    let mut stepped = session(PlacementMode::Entry)?;
    let mut emulated = session(PlacementMode::Auto)?;
    for (s, want, expected) in [(&stepped, false, "single-stepped"), (&emulated, true, "emulated")] {
        let p = &s.attached[0].placement;
        if p.emulated != want {
            return Err(CalibrationError::Placement { got: format!("at +{} ({})", p.offset, p.instruction), expected });
        }
    }
    // Fault in the code and settle the CPU's frequency before timing.
    child.time(EMULATED_CALLS)?;
    let mut costs = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        for (session, calls, out) in
            [(&mut stepped, SINGLE_STEPPED_CALLS, &mut costs.0), (&mut emulated, EMULATED_CALLS, &mut costs.1)]
        {
            let base = child.time(calls)?;
            session.attach_process(pid)?;
            let probed = child.time(calls);
            session.detach_process(pid);
            #[allow(clippy::cast_precision_loss, reason = "a batch size")]
            out.push(((probed? - base) / calls as f64).max(0.0));
        }
    }
    for (session, calls, where_) in
        [(&stepped, SINGLE_STEPPED_CALLS, " (entry)"), (&emulated, EMULATED_CALLS, " (placed)")]
    {
        let counted = session.read()?.totals[0].calls;
        let calls = calls * ROUNDS as u64;
        if counted != calls {
            return Err(CalibrationError::Miscounted { where_, counted, calls });
        }
    }
    Ok(HitCosts { single_stepped_ns: median(&mut costs.0), emulated_ns: median(&mut costs.1) })
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}
