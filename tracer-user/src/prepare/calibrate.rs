//! Measures what one probe hit costs on this machine, for `--budget`.
//!
//! tracer re-runs itself as a child that calls [`tracer_calibration_point`]
//! in a loop and times batches of calls. The parent attaches tracer's own
//! counting program to that function, once at its first instruction (a
//! `mov`, which the kernel single-steps) and once at its second (a `push`,
//! which the kernel emulates), and takes the difference from unprobed
//! batches. The hit counts are checked against the calls made, so a probe
//! that did not fire cannot pass for a cheap one.
//!
//! Each batch is timed twice: in wall time, which `--budget` weighs
//! against the time that passes, and in the child thread's CPU time, which
//! the estimate of tracer's cost weighs against the target's CPU time (the
//! run's cost meter). The two differ where the machine is a VM whose vCPUs
//! the host does not always run: wall time then holds that stolen time as
//! well, and more of it the busier the host.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::PathBuf,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
};

use thiserror::Error;

use super::planning::Planning;
pub use crate::cli::CHILD_COMMAND;
use crate::{
    discover::elf::{ElfError, ElfImage},
    error::Classify,
    kernel::{AttachError, LoadOptions, Session},
    plan::{
        HitCosts, ImageRef, PlacementMode, PlanError,
        returns::{ReturnCosts, ReturnMeasurement},
    },
    probe::{ProbeSpec, Program},
};

const SYMBOL: &str = "tracer_calibration_point";
/// Calls per timed batch: about 50 ms single-stepped, 15 ms emulated.
const SINGLE_STEPPED_CALLS: u64 = 3_000;
const EMULATED_CALLS: u64 = 30_000;
const ROUNDS: usize = 3;

/// The probed function: `mov %rdi,%rax` (single-stepped), then `push %rbx`
/// (emulated), so one function offers both kinds of probe point. Written in
/// assembly because only then are its instructions known.
// SAFETY (naked): the body is the whole function, follows the C ABI
// (argument in rdi, result in rax, rbx saved and restored) and returns.
// SAFETY (no_mangle): the name is tracer's own, so it clashes with no
// other symbol; calibration finds it by this name in tracer's ELF.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub extern "C" fn tracer_calibration_point(x: u64) -> u64 {
    core::arch::naked_asm!("mov rax, rdi", "push rbx", "pop rbx", "ret")
}

/// The function return-value probes are calibrated on: `push %rbx`
/// (emulated, so a uretprobe's entry costs an emulated hit), `mov
/// %rdi,%rax`, a `jmp` that is the only way into the epilogue (emulated,
/// rax final), `int3` (never reached), `pop %rbx` and `ret`
/// (single-stepped). It returns its argument.
// SAFETY: as for `tracer_calibration_point`: a whole C-ABI function that
// returns its argument, under a name only tracer uses.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub extern "C" fn tracer_return_point(x: u64) -> u64 {
    core::arch::naked_asm!("push rbx", "mov rax, rdi", "jmp 2f", "int3", "2:", "pop rbx", "ret")
}

const RETURN_SYMBOL: &str = "tracer_return_point";

/// Why calibration failed.
#[derive(Debug, Error)]
pub enum CalibrationError {
    #[error("calibrating the cost of a probe hit: cannot find tracer's own executable: {0}")]
    OwnExe(std::io::Error),
    #[error("calibrating the cost of a probe hit")]
    Elf(#[from] ElfError),
    #[error(
        "calibrating the cost of a probe hit: {path} has no symbol {SYMBOL} (a stripped build?); rebuild tracer without stripping its symbol table"
    )]
    NoSymbol { path: PathBuf },
    #[error("calibrating the cost of a probe hit")]
    Attach(#[from] AttachError),
    #[error("calibrating the cost of a probe hit")]
    Plan(#[from] PlanError),
    #[error("calibrating the cost of a probe hit: the calibration child failed: {0}")]
    Child(std::io::Error),
    #[error(
        "calibrating the cost of a probe hit: the probe at {SYMBOL}{where_} counted {counted} hits for {calls} calls"
    )]
    Miscounted { where_: &'static str, counted: u64, calls: u64 },
    #[error("calibrating the cost of a probe hit: {SYMBOL} was placed {got}, expected {expected}")]
    Placement { got: String, expected: &'static str },
    #[error(
        "calibrating return probes: {how} saw {returns} returns summing to {sum:#x}; the calls made {calls} summing to {expected:#x}"
    )]
    ReturnsWrong { how: &'static str, returns: u64, sum: u64, calls: u64, expected: u64 },
    #[error("calibrating return probes: {RETURN_SYMBOL} does not have the expected instructions")]
    ReturnShape,
}

impl Classify for CalibrationError {
    /// Tracer's own image and probes, hardly ever the user's input: only
    /// as far as a cause is (a plan or an attach that is).
    fn is_bad_input(&self) -> bool {
        match self {
            Self::Elf(e) => e.is_bad_input(),
            Self::Attach(e) => e.is_bad_input(),
            Self::Plan(e) => e.is_bad_input(),
            Self::OwnExe(_)
            | Self::NoSymbol { .. }
            | Self::Child(_)
            | Self::Miscounted { .. }
            | Self::Placement { .. }
            | Self::ReturnsWrong { .. }
            | Self::ReturnShape => false,
        }
    }
}

/// The CPU time the calling thread has used, in nanoseconds: what a probe
/// hit adds to it is what a hit costs the thread it hits.
fn thread_cpu_ns() -> std::io::Result<u64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec that clock_gettime fills;
    // it outlives the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut ts) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let ns = |v: i64| u64::try_from(v).map_err(std::io::Error::other);
    Ok(ns(ts.tv_sec)?.saturating_mul(1_000_000_000).saturating_add(ns(ts.tv_nsec)?))
}

/// Runs the child side: reads a number of calls per line on stdin, makes
/// them, and answers with the nanoseconds they took, in wall time and in
/// this thread's CPU time.
///
/// # Errors
/// When stdin or stdout fail, or the thread's CPU clock cannot be read.
pub fn child_main() -> std::io::Result<()> {
    let stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    for line in stdin.lines() {
        let line = line?;
        let (returns, count) = match line.trim().strip_prefix("r ") {
            Some(rest) => (true, rest),
            None => (false, line.trim()),
        };
        let calls: u64 = count.parse().map_err(std::io::Error::other)?;
        let cpu_start = thread_cpu_ns()?;
        let start = std::time::Instant::now();
        let mut x = 0u64;
        if returns {
            for i in 0..calls {
                x = x.wrapping_add(std::hint::black_box(tracer_return_point)(i));
            }
        } else {
            for _ in 0..calls {
                // black_box keeps the call: the point is to hit the probe.
                x = std::hint::black_box(tracer_calibration_point)(x);
            }
        }
        let elapsed = start.elapsed().as_nanos();
        let cpu = thread_cpu_ns()?.saturating_sub(cpu_start);
        writeln!(stdout, "{elapsed} {x} {cpu}")?;
        stdout.flush()?;
    }
    Ok(())
}

/// A batch of calls the child makes: of [`tracer_calibration_point`] or
/// of [`tracer_return_point`].
#[derive(Clone, Copy)]
enum Batch {
    Plain(u64),
    Returns(u64),
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

    /// Nanoseconds a batch of calls took: (wall, CPU).
    fn time(&mut self, batch: Batch) -> Result<(f64, f64), CalibrationError> {
        match batch {
            Batch::Plain(calls) => self.ask(&calls.to_string()),
            Batch::Returns(calls) => self.ask(&format!("r {calls}")),
        }
    }

    /// What `session`'s probe adds to each call of `batch`, in wall and in
    /// CPU time: an unprobed batch, then the same batch with the probe
    /// attached to this child.
    fn added_per_call(&mut self, session: &mut Session, batch: Batch) -> Result<(f64, f64), CalibrationError> {
        let pid = self.child.id();
        let base = self.time(batch)?;
        session.attach_process(pid)?;
        let probed = self.time(batch);
        session.detach_process(pid);
        let probed = probed?;
        let (Batch::Plain(calls) | Batch::Returns(calls)) = batch;
        #[allow(clippy::cast_precision_loss, reason = "a batch size")]
        let per_call = |probed: f64, base: f64| ((probed - base) / calls as f64).max(0.0);
        Ok((per_call(probed.0, base.0), per_call(probed.1, base.1)))
    }

    /// Asks for a batch; returns its wall and CPU nanoseconds.
    #[allow(clippy::cast_precision_loss, reason = "nanoseconds of a short batch")]
    fn ask(&mut self, request: &str) -> Result<(f64, f64), CalibrationError> {
        writeln!(self.stdin, "{request}").map_err(CalibrationError::Child)?;
        let mut line = String::new();
        self.stdout.read_line(&mut line).map_err(CalibrationError::Child)?;
        let mut words = line.split_whitespace().map(str::parse::<u64>);
        match (words.next(), words.next(), words.next()) {
            (Some(Ok(ns)), Some(Ok(_)), Some(Ok(cpu))) => Ok((ns as f64, cpu as f64)),
            _ => Err(CalibrationError::Child(std::io::Error::other(format!("unexpected answer {line:?}")))),
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a hit costs here, as calibrated, in the CPU time of the thread
/// hit.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Prices {
    pub hit: HitCosts,
    /// A uretprobe's return on top of its entry breakpoint; calibrated
    /// with `--returns` only, the one time there are uretprobes.
    pub uretprobe_return_ns: Option<f64>,
}

/// What one probe hit costs on this machine, and with `--returns`, what
/// reading a return value costs.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Calibration {
    /// In wall time.
    pub hit: HitCosts,
    pub returns: Option<(ReturnCosts, ReturnMeasurement)>,
    /// The same in the CPU time of the thread hit, which is what the
    /// target is charged for.
    pub cpu: Prices,
}

/// Seconds since 1970, as `calibrated_unix_s` counts them.
#[must_use]
pub fn now_unix_s() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// Measures [`HitCosts`] on this machine (a second or two: each detach
/// waits for a grace period), and with `returns` what each way of reading
/// a return value costs (about as long again).
///
/// # Errors
/// When tracer's own image cannot be probed or the probes miscount.
pub fn calibrate(returns: bool) -> Result<Calibration, CalibrationError> {
    let exe = std::env::current_exe().map_err(CalibrationError::OwnExe)?;
    let elf = ElfImage::open(&exe)?;
    if elf.function(SYMBOL).is_none() || elf.function(RETURN_SYMBOL).is_none() {
        return Err(CalibrationError::NoSymbol { path: exe });
    }
    let image = ImageRef::own(&elf, &exe);
    let mut child = ChildProcess::start(&exe)?;
    let (hit, hit_cpu) = hit_costs(image, &mut child)?;
    let mut cpu = Prices { hit: hit_cpu, uretprobe_return_ns: None };
    let returns = if returns {
        let (costs, measured, uretprobe_cpu_ns) = return_costs(image, &mut child, hit)?;
        // The uretprobe's entry was an emulated push, as in return_costs.
        cpu.uretprobe_return_ns = Some((uretprobe_cpu_ns - hit_cpu.emulated_ns).max(0.0));
        Some((costs, measured))
    } else {
        None
    };
    Ok(Calibration { hit, returns, cpu })
}

/// The cost of a hit single-stepped and emulated, in wall time and in CPU
/// time.
fn hit_costs(image: ImageRef<'_>, child: &mut ChildProcess) -> Result<(HitCosts, HitCosts), CalibrationError> {
    let spec = [ProbeSpec::function(SYMBOL, Program::CountCall, true, true)];
    let pid = child.child.id();
    let session = |placement| {
        let plan = Planning { placement, ..Planning::default() }.plan(image, &spec, None)?;
        Ok::<_, CalibrationError>(Session::load(plan, pid, &LoadOptions::default())?)
    };
    let mut stepped = session(PlacementMode::Entry)?;
    let mut emulated = session(PlacementMode::Inside)?;
    for (s, want, expected) in [(&stepped, false, "single-stepped"), (&emulated, true, "emulated")] {
        let p = &s.plan().probes[0].placement;
        if p.emulated != want {
            return Err(CalibrationError::Placement { got: format!("at +{} ({})", p.offset, p.instruction), expected });
        }
    }
    // Fault in the code and settle the CPU's frequency before timing.
    child.time(Batch::Plain(EMULATED_CALLS))?;
    // Per kind of probe: (wall, CPU) per round.
    let mut costs = (Vec::<(f64, f64)>::new(), Vec::<(f64, f64)>::new());
    for _ in 0..ROUNDS {
        for (session, calls, out) in
            [(&mut stepped, SINGLE_STEPPED_CALLS, &mut costs.0), (&mut emulated, EMULATED_CALLS, &mut costs.1)]
        {
            out.push(child.added_per_call(session, Batch::Plain(calls))?);
        }
    }
    for (session, calls, where_) in
        [(&stepped, SINGLE_STEPPED_CALLS, " (entry)"), (&emulated, EMULATED_CALLS, " (placed)")]
    {
        let counted = session.read()?.probes[0].calls;
        let calls = calls * ROUNDS as u64;
        if counted != calls {
            return Err(CalibrationError::Miscounted { where_, counted, calls });
        }
    }
    let now = Some(now_unix_s());
    let of = |pick: fn(&(f64, f64)) -> f64| HitCosts {
        single_stepped_ns: median(&mut costs.0.iter().map(pick).collect::<Vec<_>>()),
        emulated_ns: median(&mut costs.1.iter().map(pick).collect::<Vec<_>>()),
        calibrated_unix_s: now,
    };
    Ok((of(|c| c.0), of(|c| c.1)))
}

/// Times a uretprobe, a probe on the `ret` and one on the `jmp` into the
/// epilogue of [`tracer_return_point`], each checked to have read every
/// returned value right; returns the costs in wall time, and a uretprobe's
/// in CPU time.
fn return_costs(
    image: ImageRef<'_>,
    child: &mut ChildProcess,
    hit: HitCosts,
) -> Result<(ReturnCosts, ReturnMeasurement, f64), CalibrationError> {
    let sym = image.elf.function(RETURN_SYMBOL).ok_or(CalibrationError::ReturnShape)?;
    let code = image.elf.read_at(sym.file_offset, 9)?;
    // push %rbx; mov %rdi,%rax; jmp +1; int3; pop %rbx; ret
    let (jmp, ret) = match code.as_slice() {
        [0x53, 0x48, 0x89 | 0x8b, _, 0xeb, 0x01, 0xcc, 0x5b, 0xc3] => (4, 8),
        _ => return Err(CalibrationError::ReturnShape),
    };
    let spec = [ProbeSpec::function(RETURN_SYMBOL, Program::CountCall, true, true)];
    let pid = child.child.id();
    let session = |program, offset| {
        let planning = Planning { placement: PlacementMode::Entry, program: Some(program), ..Planning::default() };
        let mut plan = planning.plan(image, &spec, None)?;
        plan.probes[0].placement.offset = offset;
        Ok::<_, CalibrationError>(Session::load(plan, pid, &LoadOptions::default())?)
    };
    let mut ways = [
        ("a uretprobe", session(Program::RetValueUret, 0)?, Vec::new()),
        ("a probe on ret", session(Program::RetValue, ret)?, Vec::new()),
        ("a probe on the jmp into the epilogue", session(Program::RetValue, jmp)?, Vec::new()),
    ];
    // Calls per batch: the single-stepped ret sets the pace (about 50 ms).
    let calls = SINGLE_STEPPED_CALLS;
    child.time(Batch::Returns(calls))?;
    for _ in 0..ROUNDS {
        for (_, session, out) in &mut ways {
            out.push(child.added_per_call(session, Batch::Returns(calls))?);
        }
    }
    let rounds = ROUNDS as u64;
    let expected = (calls * (calls - 1) / 2).wrapping_mul(rounds);
    for (how, session, _) in &ways {
        let r = session.read()?.probes[0].returned;
        if r.returns != calls * rounds || r.pointer_sum != expected {
            return Err(CalibrationError::ReturnsWrong {
                how,
                returns: r.returns,
                sum: r.pointer_sum,
                calls: calls * rounds,
                expected,
            });
        }
    }
    let [(_, _, uret), (_, _, at_ret), (_, _, placed)] = &ways;
    let wall = |v: &[(f64, f64)]| median(&mut v.iter().map(|c| c.0).collect::<Vec<_>>());
    let measured = ReturnMeasurement { uretprobe_ns: wall(uret), ret_ns: wall(at_ret), placed_ns: wall(placed) };
    let uretprobe_cpu_ns = median(&mut uret.iter().map(|c| c.1).collect::<Vec<_>>());
    // The uretprobe's entry was an emulated push.
    let costs = ReturnCosts { hit, uretprobe_return_ns: (measured.uretprobe_ns - hit.emulated_ns).max(0.0) };
    Ok((costs, measured, uretprobe_cpu_ns))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}
