//! `tracer bench`: pyperf timeit of one statement with nothing attached,
//! with tracer attached, and after tracer detached, interleaved so that
//! machine drift cancels, plus the exact number of probe hits per loop.
//!
//! The states are run in rounds, each round in a rotated order (A B C,
//! B C A, C A B, ...), every chunk appending to that state's pyperf JSON
//! file with the same number of processes and values, so pyperf's own
//! `compare_to` (and its significance test) reads them directly.

mod child;
mod frees;
mod interpreter;
pub mod report;
mod root;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use serde::Deserialize;
use thiserror::Error;

use self::{
    child::{KillOnDrop, start_tool, stderr_line, wait_blocked_on_stdin},
    frees::HeldFrees,
    root::{WorkDir, chrooted, host_of, seen_in},
};
use crate::{
    discover::{Resolved, TargetSpec},
    error::Classify,
    kernel::{AttachError, LoadOptions, Session},
    plan::{ImageRef, PlacementMode, Plan as ProbePlan},
    prepare::{self, Planning, PrepareError, Prepared},
    probe::{ProbeSelection, Program},
    python::SUPPORTED,
};

const HELPER: &str = include_str!("helper.py");

/// A benchmark that cannot run.
#[derive(Debug, Error)]
pub enum BenchError {
    #[error("cannot run {python}: {cause}; pass --python PATH of a CPython {SUPPORTED} interpreter")]
    Python { python: PathBuf, cause: std::io::Error },
    #[error(
        "--python {python} is not a CPython 3 interpreter: {why}; pass --python PATH of a CPython {SUPPORTED} interpreter"
    )]
    NotCPython { python: PathBuf, why: String },
    #[error(
        "--python {python} is CPython {version}, which tracer does not support; pass --python PATH of a CPython {SUPPORTED} interpreter"
    )]
    Unsupported { python: PathBuf, version: String },
    #[error(
        "pyperf is not installed for {python}; run `cargo xtask setup` (it installs pyperf in {venv}) or `{python} -m pip install pyperf`, or pass --python of an interpreter that has it"
    )]
    NoPyperf { python: PathBuf, venv: String },
    #[error("{what} failed: {detail}")]
    Step { what: String, detail: String },
    #[error("--root {path}: {cause}; pass the directory the interpreter runs chrooted in")]
    Root { path: PathBuf, cause: std::io::Error },
    #[error("--python {python} is not in --root {root}; pass its absolute path as seen inside the root")]
    NotInRoot { python: PathBuf, root: PathBuf },
    #[error(
        "pyperf is not installed for {python} in {root}; pass --python of a venv there that has it (`cargo xtask setup` makes {FORKY_PYPERF} in Debian forky's root)"
    )]
    NoPyperfInRoot { python: PathBuf, root: PathBuf },
    #[error(
        "--root {root}: the interpreter's image resolved outside the root, to {image} (its libpython, found as the host finds it); --root takes statically linked interpreters, such as Debian's"
    )]
    ImageOutsideRoot { root: PathBuf, image: PathBuf },
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    #[error(transparent)]
    Attach(#[from] AttachError),
    #[error("cannot write {path}: {cause}")]
    Output { path: PathBuf, cause: std::io::Error },
}

impl Classify for BenchError {
    /// The interpreter given, and what it has; a step that fails on the
    /// way is tracer's or the system's.
    fn is_bad_input(&self) -> bool {
        match self {
            Self::Python { .. }
            | Self::NotCPython { .. }
            | Self::Unsupported { .. }
            | Self::NoPyperf { .. }
            | Self::Root { .. }
            | Self::NotInRoot { .. }
            | Self::NoPyperfInRoot { .. }
            | Self::ImageOutsideRoot { .. } => true,
            Self::Prepare(e) => e.is_bad_input(),
            Self::Attach(e) => e.is_bad_input(),
            Self::Step { .. } | Self::Output { .. } => false,
        }
    }
}

/// forky's python3.13 with pyperf, which `cargo xtask setup` makes in its
/// root (xtask's `FORKY_PYPERF_3_13`).
const FORKY_PYPERF: &str = "/opt/tracer/pyperf-venv-3.13/bin/python";

fn step(what: impl Into<String>, detail: impl std::fmt::Display) -> BenchError {
    BenchError::Step { what: what.into(), detail: detail.to_string() }
}

/// Where `cargo xtask setup` puts the venv with pyperf.
#[must_use]
pub fn default_venv() -> PathBuf {
    let base = std::env::var_os("XDG_DATA_HOME").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".local/share"),
        PathBuf::from,
    );
    base.join("tracer").join("pyperf-venv")
}

/// The interpreter `tracer bench` uses without `--python`: the setup venv
/// if it exists, else `python3` on PATH.
#[must_use]
pub fn default_python() -> PathBuf {
    let venv = default_venv().join("bin").join("python");
    if venv.exists() { venv } else { PathBuf::from("python3") }
}

/// How much pyperf work a run does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effort {
    Fast,
    Normal,
    Rigorous,
}

/// Rounds of interleaving and pyperf's options per chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub rounds: u32,
    pub processes: u32,
    pub values: u32,
    pub warmups: u32,
}

impl Effort {
    #[must_use]
    pub const fn plan(self) -> Plan {
        match self {
            // Worker startup dominates an attached chunk (every object the
            // interpreter makes while importing pyperf is a probe hit), so
            // plans favour values per process over processes.
            Self::Fast => Plan { rounds: 3, processes: 1, values: 6, warmups: 1 },
            Self::Normal => Plan { rounds: 5, processes: 1, values: 8, warmups: 1 },
            Self::Rigorous => Plan { rounds: 10, processes: 2, values: 8, warmups: 2 },
        }
    }
}

/// One setup the statement is timed under.
#[derive(Clone, Debug)]
pub enum State {
    /// Nothing attached.
    Baseline,
    /// tracer attached to every process of the interpreter, probing
    /// `--probes`.
    Attached {
        name: String,
        program: Option<Program>,
        placement: PlacementMode,
        /// With return probes too (`--returns`), planned by costs the bench
        /// calibrates when it first needs them.
        returns: bool,
    },
    /// Attached (as `attached`, with the probes placed as by default) and
    /// detached again just before the chunk.
    Detached,
    /// Environment variables for pyperf's workers (e.g. PYTHONTRACEMALLOC).
    Env { name: String, vars: Vec<(String, String)> },
    /// Another tool running during the chunk: started, waited for until it
    /// prints `ready` (then `settle`), stopped with SIGINT afterwards.
    Command { name: String, argv: Vec<String>, ready: String, settle: Duration },
}

impl State {
    /// The state's name: its pyperf file is NAME.json.
    #[must_use]
    pub fn name(&self) -> &str {
        match self {
            Self::Baseline => "baseline",
            Self::Detached { .. } => "detached",
            Self::Attached { name, .. } | Self::Env { name, .. } | Self::Command { name, .. } => name,
        }
    }
}

/// Statistics of one state's pyperf file.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct StateStats {
    pub file: PathBuf,
    /// Seconds per loop.
    pub mean: f64,
    pub stdev: f64,
    pub values: usize,
    /// pyperf's own "17.7 ns +- 0.4 ns".
    pub formatted: String,
}

/// One state against the baseline, as pyperf's `compare_to` judges it.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// mean(other) / mean(baseline).
    pub ratio: f64,
    /// pyperf's significance test.
    pub significant: bool,
}

/// Exact probe hits per loop of the statement.
#[derive(Clone, Debug, PartialEq)]
pub struct HitsPerLoop {
    pub total: f64,
    pub per_probe: Vec<(&'static str, f64)>,
    /// Loops of the shorter of the two measured runs.
    pub loops: u64,
}

/// What a benchmark needs: the interpreter, its image and a work directory.
pub struct Bench {
    /// The interpreter, as a path inside `root` where there is one.
    pub python: PathBuf,
    /// `--root`: the directory the interpreter runs chrooted in (a
    /// distribution's root, as `cargo xtask setup` makes Debian forky's).
    /// Its commands run under chroot(8), and what they read and write is in
    /// `work`, inside it; the pyperf files are copied to `out_dir` after.
    pub root: Option<PathBuf>,
    /// The interpreter, prepared as `--exe` prepares it (with the modules
    /// that may call into it, for `--placement call-sites`), with the
    /// plan of `--probes` placed as by default, which counts the hits per
    /// loop and is attached for `detached`. Its notes are reported with
    /// the result.
    pub prepared: Prepared,
    pub stmt: String,
    pub setup: String,
    pub plan: Plan,
    pub out_dir: PathBuf,
    /// Where the helper and the pyperf files are written (host path):
    /// `out_dir`, or a directory of its own inside `root`.
    work: WorkDir,
    helper: PathBuf,
    return_costs: std::cell::RefCell<Option<crate::plan::returns::ReturnCosts>>,
    /// What a fresh process's free pointers hold, for every plan's frees.
    frees: Option<HeldFrees>,
}

impl Bench {
    /// Checks the interpreter and pyperf, prepares the image for
    /// `probes`, prepares `out_dir` (removing results of an earlier run
    /// there); with `root`, the interpreter is the one at `python` inside
    /// it, run chrooted.
    pub fn new(
        (python, root): (&Path, Option<&Path>),
        stmt: &str,
        setup: &str,
        probes: &ProbeSelection,
        plan: Plan,
        out_dir: &Path,
    ) -> Result<Self, BenchError> {
        std::fs::create_dir_all(out_dir).map_err(|cause| BenchError::Output { path: out_dir.to_owned(), cause })?;
        let root = match root {
            Some(r) => {
                let dir = root::resolve(r)?;
                root::check_python(&dir, python)?;
                Some(dir)
            }
            None => None,
        };
        let root = root.as_deref();
        let work = match root {
            Some(root) => WorkDir::in_root(root)?,
            None => WorkDir::output(out_dir),
        };
        let helper = work.path.join("helper.py");
        std::fs::write(&helper, HELPER).map_err(|cause| BenchError::Output { path: helper.clone(), cause })?;
        let info = interpreter::check(python, root, &helper)?;
        if info.pyperf.is_none() {
            return Err(match root {
                Some(root) => BenchError::NoPyperfInRoot { python: python.to_owned(), root: root.to_owned() },
                None => BenchError::NoPyperf { python: python.to_owned(), venv: default_venv().display().to_string() },
            });
        }
        // Inside a root, the debug packages' files are there too.
        let debug_dir = root.map(|r| r.join("usr/lib/debug")).filter(|d| d.is_dir());
        let options = prepare::Options {
            probes,
            planning: Planning::default(),
            native: false,
            gc: crate::plan::gc::GcMode::Off,
            debug_dir: debug_dir.as_deref(),
            hit_costs: false,
            callers: true,
            growth: false,
            growth_auto: false,
            frees_at_implementations: false,
        };
        let mut prepared = prepare::prepare(&TargetSpec::Exe(host_of(root, &info.real)), &options)?;
        if let Some(root) = root
            && !prepared.target.attach_path.starts_with(root)
        {
            // A libpython the host's loader paths found: not the root's.
            return Err(BenchError::ImageOutsideRoot {
                root: root.to_owned(),
                image: prepared.target.attach_path.clone(),
            });
        }
        let frees = HeldFrees::read(chrooted(root, python), &prepared.target)?;
        if let Some(note) =
            frees.as_ref().and_then(|f| f.apply(&mut prepared.plan, options.planning.placement, &prepared.target))
        {
            prepared.notes.push(note);
        }
        Ok(Self {
            prepared,
            frees,
            python: python.to_owned(),
            root: root.map(Path::to_owned),
            stmt: stmt.to_owned(),
            setup: setup.to_owned(),
            plan,
            out_dir: out_dir.to_owned(),
            work,
            helper,
            return_costs: std::cell::RefCell::new(None),
        })
    }

    /// A command running the interpreter: under chroot(8) with a root.
    fn interpreter(&self) -> Command {
        chrooted(self.root.as_deref(), &self.python)
    }

    /// A host path as the interpreter sees it (inside the root).
    fn seen(&self, host: &Path) -> PathBuf {
        seen_in(self.root.as_deref(), host)
    }

    /// What reading a return value costs here, calibrated once.
    fn return_costs(&self) -> Result<crate::plan::returns::ReturnCosts, BenchError> {
        if let Some(costs) = *self.return_costs.borrow() {
            return Ok(costs);
        }
        let calibration = prepare::calibrate::calibrate(true).map_err(|e| step("calibrating return probes", e))?;
        let costs = calibration.returns.map(|r| r.0).ok_or_else(|| step("calibrating return probes", "no result"))?;
        *self.return_costs.borrow_mut() = Some(costs);
        Ok(costs)
    }

    /// The interpreter, resolved.
    #[must_use]
    pub const fn target(&self) -> &Resolved {
        &self.prepared.target
    }

    /// Loads `plan`, counting the process `pid`, or every process (0).
    fn load(plan: ProbePlan, pid: u32) -> Result<Session, BenchError> {
        Ok(Session::load(plan, pid, &LoadOptions::default())?)
    }

    /// Plans `--probes` as `planning` says.
    fn plan(&self, planning: Planning) -> Result<ProbePlan, BenchError> {
        let costs = if planning.returns { Some(self.return_costs()?) } else { None };
        let mut plan =
            planning.plan(ImageRef::from(self.target()), &self.prepared.specs, costs).map_err(PrepareError::from)?;
        if let Some(frees) = &self.frees {
            frees.apply(&mut plan, planning.placement, self.target());
        }
        Ok(plan)
    }

    /// Counts hits of `--probes` over N and 2N loops of the statement (the
    /// way timeit runs it) in a fresh process each, and returns the
    /// difference per loop: exact, with process startup cancelled out.
    pub fn hits_per_loop(&self, loops: u64) -> Result<HitsPerLoop, BenchError> {
        let one = self.count_loops(loops)?;
        let two = self.count_loops(2 * loops)?;
        #[allow(clippy::cast_precision_loss)] // counts far below 2^52
        let per_probe: Vec<(&'static str, f64)> = one
            .iter()
            .zip(&two)
            .map(|((name, a), (_, b))| (*name, b.saturating_sub(*a) as f64 / loops as f64))
            .collect();
        let total = per_probe.iter().map(|(_, v)| v).sum();
        Ok(HitsPerLoop { total, per_probe, loops })
    }

    fn count_loops(&self, loops: u64) -> Result<Vec<(&'static str, u64)>, BenchError> {
        let mut child = KillOnDrop(
            self.interpreter()
                .arg(self.seen(&self.helper))
                .args(["loop", &loops.to_string(), &self.stmt, &self.setup])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|cause| BenchError::Python { python: self.python.clone(), cause })?,
        );
        let pid = child.0.id();
        let mut stdout = BufReader::new(child.0.stdout.take().ok_or_else(|| step("the loop helper", "no stdout"))?);
        let mut line = String::new();
        stdout.read_line(&mut line).map_err(|e| step("the loop helper", e))?;
        if line.trim() != "ready" {
            let mut err = String::new();
            if let Some(mut e) = child.0.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return Err(step(
                format!("timing {:?} with setup {:?}", self.stmt, self.setup),
                stderr_line(err.as_bytes()),
            ));
        }
        wait_blocked_on_stdin(pid, "the loop helper")?;
        let mut session = Self::load(self.prepared.plan.clone(), pid)?;
        if session.plan().has_many_sites() {
            // As `attached` does: perf-event links would take minutes to
            // make and remove one by one for an LTO build's copies.
            session.attach_multi(pid)?;
            // A point the kernel refused leaves its calls uncounted: the
            // count would not be exact.
            if let Some((symbol, offset)) = session.refused().iter().next() {
                return Err(step(
                    "counting hits",
                    format!(
                        "the kernel refused {symbol}'s probe at file offset {offset:#x}, so the count is not exact"
                    ),
                ));
            }
        } else {
            session.attach_process(pid)?;
        }
        let mut stdin = child.0.stdin.take().ok_or_else(|| step("the loop helper", "no stdin"))?;
        stdin.write_all(b"go\n").map_err(|e| step("starting the loop", e))?;
        line.clear();
        stdout.read_line(&mut line).map_err(|e| step("the loop helper", e))?;
        let status = child.0.wait().map_err(|e| step("the loop helper", e))?;
        if line.trim() != "done" || !status.success() {
            return Err(step("the loop helper", format!("ended with {status}")));
        }
        let readings = session.read()?;
        let lost: Vec<String> = tracer_common::stats::Stat::ALL
            .iter()
            .zip(&readings.stats)
            .filter(|(s, v)| s.is_loss() && **v > 0)
            .map(|(s, v)| format!("{}={v}", s.name()))
            .chain((readings.kernel_misses > 0).then(|| format!("kernel_recursion_misses={}", readings.kernel_misses)))
            .collect();
        if !lost.is_empty() {
            return Err(step(
                "counting hits",
                format!("events were lost ({}), so the count is not exact", lost.join(" ")),
            ));
        }
        Ok(session.plan().probes.iter().zip(&readings.probes).map(|(p, c)| (p.symbol, c.calls)).collect())
    }

    /// Runs every state for `plan.rounds` rounds, rotating the order each
    /// round, and returns each state's statistics in `states` order.
    pub fn run(&self, states: &[State], mut progress: impl FnMut(&str)) -> Result<Vec<StateStats>, BenchError> {
        // An earlier run's, and with a root the copies of one, which a run
        // that fails midway would otherwise leave looking current.
        for state in states {
            for file in [self.file(state), self.out_dir.join(format!("{}.json", state.name()))] {
                if file.exists() {
                    std::fs::remove_file(&file).map_err(|cause| BenchError::Output { path: file.clone(), cause })?;
                }
            }
        }
        let n = states.len();
        // pyperf calibrates loops per value in each state's first chunk (in
        // an extra process); later chunks reuse that number.
        let mut loops: Vec<Option<u64>> = vec![None; n];
        for round in 0..self.plan.rounds as usize {
            for k in 0..n {
                let i = (round + k) % n;
                let state = &states[i];
                progress(&format!("round {}/{}: {}", round + 1, self.plan.rounds, state.name()));
                self.chunk(state, loops[i])?;
                if loops[i].is_none() {
                    loops[i] = Some(self.calibrated_loops(state)?);
                }
            }
        }
        let files: Vec<PathBuf> = states.iter().map(|s| self.seen(&self.file(s))).collect();
        let out = self
            .interpreter()
            .arg(self.seen(&self.helper))
            .arg("stats")
            .args(&files)
            .output()
            .map_err(|cause| BenchError::Python { python: self.python.clone(), cause })?;
        if !out.status.success() {
            return Err(step("reading pyperf results", stderr_line(&out.stderr)));
        }
        let mut results: Vec<StateStats> =
            serde_json::from_slice(&out.stdout).map_err(|e| step("reading pyperf results", e))?;
        if self.root.is_some() {
            // Kept where the user asked for them, and named so.
            for (state, s) in states.iter().zip(&mut results) {
                let to = self.out_dir.join(format!("{}.json", state.name()));
                std::fs::copy(self.file(state), &to).map_err(|cause| BenchError::Output { path: to.clone(), cause })?;
                s.file = to;
            }
        }
        Ok(results)
    }

    fn calibrated_loops(&self, state: &State) -> Result<u64, BenchError> {
        let out = self
            .interpreter()
            .arg(self.seen(&self.helper))
            .arg("loops")
            .arg(self.seen(&self.file(state)))
            .output()
            .map_err(|cause| BenchError::Python { python: self.python.clone(), cause })?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|_| step("reading pyperf's calibrated loops", stderr_line(&out.stderr)))
    }

    /// The pyperf JSON file of a state, where the run writes it (host
    /// path).
    #[must_use]
    pub fn file(&self, state: &State) -> PathBuf {
        self.work.path.join(format!("{}.json", state.name()))
    }

    /// `plan` loaded and attached to every process of the image.
    fn attached(plan: ProbePlan) -> Result<Session, BenchError> {
        let mut session = Self::load(plan, 0)?;
        if session.plan().has_many_sites() {
            // Hundreds of uprobes (inlined copies, call sites): perf-event
            // links take about a minute to attach and detach them one by
            // one, a multi link a moment.
            session.attach_multi(crate::kernel::ALL_PROCESSES)?;
        } else {
            session.attach_all_processes()?;
        }
        Ok(session)
    }

    fn chunk(&self, state: &State, loops: Option<u64>) -> Result<(), BenchError> {
        let mut cmd = self.interpreter();
        cmd.args(["-m", "pyperf", "timeit", "--quiet", "--append"])
            .arg(self.seen(&self.file(state)))
            .args(["--processes", &self.plan.processes.to_string()])
            .args(["--values", &self.plan.values.to_string()])
            .args(["--warmups", &self.plan.warmups.to_string()])
            .args(loops.map(|l| format!("--loops={l}")))
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut guard = Guard::default();
        match state {
            State::Baseline => {}
            State::Attached { program, placement, returns, .. } => {
                // Placed as `attach --exact --exe` places them: the
                // workers are many processes.
                let placement = placement.resolved(false);
                let planning = Planning { placement, program: *program, returns: *returns, ..Planning::default() };
                guard.session = Some(Self::attached(self.plan(planning)?)?);
            }
            State::Detached => drop(Self::attached(self.prepared.plan.clone())?),
            State::Env { vars, .. } => {
                let names: Vec<&str> = vars.iter().map(|(k, _)| k.as_str()).collect();
                // pyperf gives workers a clean environment unless told.
                cmd.args(["--inherit-environ", &names.join(",")]);
                cmd.envs(vars.iter().map(|(k, v)| (k, v)));
            }
            State::Command { argv, ready, settle, name } => {
                guard.tool = Some(start_tool(name, argv, ready, *settle)?);
            }
        }
        cmd.args(["--setup", &self.setup]).arg("--").arg(&self.stmt);
        let out = cmd.output().map_err(|cause| BenchError::Python { python: self.python.clone(), cause })?;
        // Detach and stop the tool before the next state starts.
        drop(guard.session.take());
        drop(guard.tool.take());
        if out.status.success() {
            Ok(())
        } else {
            Err(step(format!("pyperf timeit ({})", state.name()), stderr_line(&out.stderr)))
        }
    }

    /// pyperf's `compare_to` on two states: the ratio of means and whether
    /// pyperf finds the difference significant.
    pub fn compare(&self, base: &StateStats, other: &StateStats) -> Result<Comparison, BenchError> {
        // With a root, the files the run wrote there (the copies are
        // outside it).
        let inside = |s: &StateStats| match &self.root {
            Some(_) => self.seen(&self.work.path.join(s.file.file_name().unwrap_or_default())),
            None => s.file.clone(),
        };
        let out = self
            .interpreter()
            .args(["-m", "pyperf", "compare_to"])
            .arg(inside(base))
            .arg(inside(other))
            .output()
            .map_err(|cause| BenchError::Python { python: self.python.clone(), cause })?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || text.contains("ERROR") {
            return Err(step("pyperf compare_to", format!("{}{}", text.trim(), stderr_line(&out.stderr))));
        }
        Ok(Comparison { ratio: other.mean / base.mean, significant: !text.contains("not significant") })
    }
}

/// pyperf's comparison wording: "1.09x slower (+9%)", "1.02x faster (-2%)".
#[must_use]
pub fn describe_ratio(ratio: f64) -> String {
    let percent = (ratio - 1.0) * 100.0;
    if ratio >= 1.0 {
        format!("{ratio:.2}x slower (+{percent:.0}%)")
    } else {
        format!("{:.2}x faster ({percent:.0}%)", 1.0 / ratio)
    }
}

/// "Mean +- std dev: [baseline] 20.6 ns +- 0.1 ns -> [attached] 22.4 ns +-
/// 0.1 ns: 1.09x slower (+9%)", or "...: not significant".
#[must_use]
pub fn compare_line(base_name: &str, base: &StateStats, name: &str, other: &StateStats, cmp: &Comparison) -> String {
    let verdict = if cmp.significant { describe_ratio(cmp.ratio) } else { "not significant".to_owned() };
    format!("Mean +- std dev: [{base_name}] {} -> [{name}] {}: {verdict}", base.formatted, other.formatted)
}

/// What must stay alive during a chunk and be undone after it (dropping
/// detaches the session and stops the tool).
#[derive(Default)]
struct Guard {
    session: Option<Session>,
    tool: Option<KillOnDrop>,
}

#[cfg(test)]
mod tests;
