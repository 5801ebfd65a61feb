//! `cargo xtask bench`, the cost section's runs: each case's pyperf
//! chunks, untraced and under `tracer attach --exe`, in rotated rounds,
//! with the CPU time the kernel accounted to them and tracer's summaries.

#![allow(clippy::cast_precision_loss, reason = "loop and hit counts far below 2^52")]

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context as _, bail};
use serde_json::Value;

/// Rounds per case, each visiting the four chunks in a rotated order.
pub const ROUNDS: usize = 3;
/// pyperf's values and warmups per worker, one worker per chunk: few
/// workers with many values, so that each worker's fixed start is paid few
/// times.
pub const VALUES: u32 = 4;
pub const WARMUPS: u32 = 1;
/// About how long one traced value takes: long enough that a traced worker
/// spends most of its time in the timed loops.
pub const TRACED_VALUE_S: f64 = 2.5;
/// About how long one value of the few-loops chunk takes untraced.
const FEW_LOOPS_VALUE_S: f64 = 0.0005;
/// The niceness pyperf runs at (workers inherit it).
pub const NICE: &str = "-20";
/// tracer's interval: a process's hits after its last reading, which are
/// left unpriced, are at most this long.
pub const INTERVAL: &str = "0.25";

/// One case: an interpreter, a statement, tracer's flags.
pub struct Case<'a> {
    pub what: &'a str,
    pub python: &'a Private,
    pub setup: &'a str,
    pub stmt: &'a str,
    pub flags: &'a [&'a str],
}

/// A venv's interpreter with a private copy of its image: `--exe` traces
/// every process that maps the image's file, and on a shared machine other
/// processes run the same interpreter, which would be traced and priced
/// with pyperf's. A copy is a file of its own, mapped by pyperf's processes
/// alone.
pub struct Private {
    /// What pyperf runs.
    pub python: PathBuf,
    /// What tracer attaches to: the copy.
    pub exe: PathBuf,
    /// What makes the interpreter load the copy, given to pyperf's runner
    /// and passed on to its workers.
    pub env: Option<(&'static str, PathBuf)>,
}

impl Private {
    /// For `venv`, in `dir`: a shared libpython is copied into `dir/lib`,
    /// which `LD_LIBRARY_PATH` puts before the interpreter's RUNPATH; a
    /// static interpreter is copied into a venv of its own, `dir/venv`,
    /// whose `lib` is the original venv's (pyperf is there).
    pub fn new(venv: &Path, dir: &Path) -> anyhow::Result<Self> {
        let python = venv.join("bin").join("python");
        let maps = Command::new(&python)
            .args(["-c", "print(open('/proc/self/maps').read())"])
            .output()
            .with_context(|| format!("starting {}", python.display()))?;
        let maps = String::from_utf8_lossy(&maps.stdout);
        let libpython = maps.split_whitespace().find(|w| w.starts_with('/') && w.contains("/libpython"));
        if let Some(lib) = libpython {
            let lib = Path::new(lib);
            let into = dir.join("lib");
            std::fs::create_dir_all(&into).with_context(|| format!("creating {}", into.display()))?;
            let exe = into.join(lib.file_name().context("a file name")?);
            copy(lib, &exe)?;
            return Ok(Self { python, exe, env: Some(("LD_LIBRARY_PATH", into)) });
        }
        let real = std::fs::canonicalize(&python).with_context(|| format!("resolving {}", python.display()))?;
        let own = dir.join("venv");
        let bin = own.join("bin");
        std::fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
        let exe = bin.join(real.file_name().context("a file name")?);
        copy(&real, &exe)?;
        std::fs::copy(venv.join("pyvenv.cfg"), own.join("pyvenv.cfg")).context("copying pyvenv.cfg")?;
        for (link, to) in [(bin.join("python"), exe.clone()), (own.join("lib"), venv.join("lib"))] {
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&to, &link).with_context(|| format!("linking {}", link.display()))?;
        }
        Ok(Self { python: bin.join("python"), exe, env: None })
    }
}

/// Copies `from` to `to` anew: a file a process still maps cannot be
/// written, and a new inode is what makes it private anyway.
fn copy(from: &Path, to: &Path) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(to);
    std::fs::copy(from, to).with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

/// The three chunks of a round.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Chunk {
    Untraced,
    /// Untraced, with few loops: the workers' fixed part.
    UntracedFewLoops,
    Traced,
    /// Traced, with few loops.
    FewLoops,
}

/// What tracer's summary said of one traced chunk.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub fraction: f64,
    /// The share with every hit of a probe with sites of both kinds priced
    /// emulated; `fraction` where there is no such range.
    pub fraction_low: f64,
    pub tracer_cpu_s: f64,
    pub target_cpu_s: f64,
    pub hits: u64,
    pub unpriced: u64,
    pub processes: usize,
    /// The calibrated cost of a hit.
    pub emulated_ns: f64,
    pub single_stepped_ns: f64,
    /// Each probe's hits (its calls, its gates' other passes, two per
    /// nested libc call), its sites: (emulated, single-stepped), and its
    /// hits at single-stepped sites where it counts them apart.
    pub probes: Vec<(u64, (u64, u64), Option<u64>)>,
}

impl Summary {
    /// The (high, low) probe time in seconds of this chunk's priced hits
    /// at `calibration`'s costs of a hit, as tracer prices a probe's hits (without
    /// `--returns`): by the kind of its sites, a probe with both kinds each
    /// hit by its own where it counts those apart, else high as
    /// single-stepped and low as emulated.
    pub fn priced_at(&self, calibration: &Self) -> (f64, f64) {
        let (e, s) = (calibration.emulated_ns, calibration.single_stepped_ns);
        let (mut high, mut low) = (0.0, 0.0);
        for &(calls, kinds, stepped) in &self.probes {
            if let Some(stepped) = stepped {
                let stepped = stepped.min(calls);
                let ns = stepped as f64 * s + (calls - stepped) as f64 * e;
                high += ns;
                low += ns;
                continue;
            }
            let (h, l) = match kinds {
                (0, 0) => (0.0, 0.0),
                (_, 0) => (e, e),
                (0, _) => (s, s),
                _ => (s, e),
            };
            high += calls as f64 * h;
            low += calls as f64 * l;
        }
        // Only the priced hits, which are nearly all.
        let priced = self.hits as f64 / (self.hits + self.unpriced).max(1) as f64;
        (high * priced / 1e9, low * priced / 1e9)
    }
}

/// pyperf's statistics of one file.
pub struct Stats {
    pub mean: f64,
    pub formatted: String,
}

/// Reads pyperf files with pyperf itself, so the mean and std dev are
/// pyperf's.
const STATS: &str = "import json, sys, pyperf
out = []
for path in sys.argv[1:]:
    b = pyperf.Benchmark.load(path)
    n = len(b.get_values())
    sd = b.stdev() if n > 1 else 0.0
    out.append({'mean': b.mean(), 'formatted': '%s +- %s' % (b.format_value(b.mean()), b.format_value(sd))})
print(json.dumps(out))
";

/// One case, measured.
pub struct Measured {
    pub loops: u64,
    pub few_loops: u64,
    pub untraced: Stats,
    pub traced: Stats,
    /// Per round.
    pub full: Vec<Summary>,
    pub few: Vec<Summary>,
    pub cpu: Cpu,
}

/// The CPU time pyperf's processes used, by chunk kind over all rounds, as
/// the kernel accounts it to pyperf's runner for itself and the processes it
/// reaped (wait4).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    pub untraced: f64,
    pub untraced_few: f64,
    pub traced: f64,
    pub few: f64,
}

pub fn measure(tracer: &Path, case: &Case<'_>, dir: &Path) -> anyhow::Result<Measured> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let file = |chunk| {
        dir.join(match chunk {
            Chunk::Untraced => "untraced.json",
            Chunk::UntracedFewLoops => "untraced-few-loops.json",
            Chunk::Traced => "traced.json",
            Chunk::FewLoops => "few-loops.json",
        })
    };
    let order = [Chunk::FewLoops, Chunk::UntracedFewLoops, Chunk::Untraced, Chunk::Traced];
    for chunk in order {
        let _ = std::fs::remove_file(file(chunk));
    }
    // pyperf's own calibration, untraced, for the time of one loop.
    let pilot = dir.join("pilot.json");
    let _ = std::fs::remove_file(&pilot);
    let _ = pyperf(case, &pilot, &["--processes", "1", "--values", "1", "--warmups", "0"])?;
    let untraced_s = stats(&case.python.python, &[&pilot])?.remove(0).mean;
    let few_loops = loops_for(FEW_LOOPS_VALUE_S, untraced_s);
    let mut loops = None;
    let (mut full, mut few) = (Vec::new(), Vec::new());
    let mut cpu = Cpu::default();
    for round in 0..ROUNDS {
        for k in 0..order.len() {
            let chunk = order[(round + k) % order.len()];
            // The first round starts with few loops, whose traced time per
            // loop sets the loops of the others.
            let n = if matches!(chunk, Chunk::FewLoops | Chunk::UntracedFewLoops) {
                few_loops
            } else {
                loops.context("loops before the few-loops chunk")?
            };
            let args = chunk_args(n);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let keep = |kind: &str| dir.join(format!("{kind}-{round}.jsonl"));
            match chunk {
                Chunk::Untraced => cpu.untraced += pyperf(case, &file(chunk), &args)?,
                Chunk::UntracedFewLoops => cpu.untraced_few += pyperf(case, &file(chunk), &args)?,
                Chunk::Traced => {
                    let mut used = 0.0;
                    full.push(traced(tracer, case, &keep("traced"), || {
                        used = pyperf(case, &file(chunk), &args)?;
                        Ok(())
                    })?);
                    cpu.traced += used;
                }
                Chunk::FewLoops => {
                    let mut used = 0.0;
                    few.push(traced(tracer, case, &keep("few-loops"), || {
                        used = pyperf(case, &file(chunk), &args)?;
                        Ok(())
                    })?);
                    cpu.few += used;
                    if loops.is_none() {
                        let traced_s = stats(&case.python.python, &[&file(chunk)])?.remove(0).mean;
                        loops = Some(loops_for(TRACED_VALUE_S, traced_s).max(few_loops + 1));
                    }
                }
            }
        }
    }
    let mut s = stats(&case.python.python, &[&file(Chunk::Untraced), &file(Chunk::Traced)])?;
    let traced_stats = s.pop().context("pyperf's statistics")?;
    let untraced = s.pop().context("pyperf's statistics")?;
    Ok(Measured { loops: loops.unwrap_or(few_loops), few_loops, untraced, traced: traced_stats, full, few, cpu })
}

/// The loops that take about `seconds` at `per_loop` seconds each.
fn loops_for(seconds: f64, per_loop: f64) -> u64 {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a positive loop count")]
    let n = (seconds / per_loop).ceil() as u64;
    n.max(1)
}

fn chunk_args(loops: u64) -> Vec<String> {
    ["--processes", "1", "--values", &VALUES.to_string(), "--warmups", &WARMUPS.to_string()]
        .into_iter()
        .map(str::to_owned)
        .chain([format!("--loops={loops}")])
        .collect()
}

/// `pyperf timeit` of the case, appending to `file`; the CPU time its
/// processes used, in seconds.
fn pyperf(case: &Case<'_>, file: &Path, args: &[&str]) -> anyhow::Result<f64> {
    // Other work on a shared machine takes CPU from pyperf's worker, which
    // its wall-clock timings would count, and tracer's CPU-time estimate
    // not; at the highest priority the worker seldom waits for a CPU. Its
    // probe hits run in its own context, at its priority.
    let mut cmd = Command::new("nice");
    cmd.args(["-n", NICE, "--"]).arg(&case.python.python);
    cmd.args(["-m", "pyperf", "timeit", "--quiet", "--append"]).arg(file).args(args);
    if let Some((name, value)) = &case.python.env {
        // pyperf gives its workers a clean environment unless told.
        cmd.env(name, value).args(["--inherit-environ", name]);
    }
    let mut child = cmd
        .args(["--setup", case.setup, "--", case.stmt])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {} -m pyperf", case.python.python.display()))?;
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        std::io::Read::read_to_string(&mut e, &mut stderr).context("reading pyperf's stderr")?;
    }
    let (status, cpu_s) = wait_cpu(child)?;
    if !status.success() {
        bail!("pyperf timeit {:?} failed ({status}): {}", case.stmt, stderr.trim());
    }
    Ok(cpu_s)
}

/// Reaps `child` (here `nice`, which execs pyperf's runner) and returns its
/// status and the CPU time, user and system, that it and every process it
/// reaped used, pyperf's workers included.
fn wait_cpu(child: Child) -> anyhow::Result<(std::process::ExitStatus, f64)> {
    let pid = libc::pid_t::try_from(child.id()).context("a PID")?;
    // The Child is not waited on again; wait4 reaps it.
    drop(child);
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value, which wait4 overwrites.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: status and usage are valid for writes through the call; pid
    // is our child, not yet reaped.
    if unsafe { libc::wait4(pid, &raw mut status, 0, &raw mut usage) } != pid {
        return Err(std::io::Error::last_os_error()).context("waiting for pyperf");
    }
    let seconds = |t: libc::timeval| {
        Duration::new(u64::try_from(t.tv_sec).unwrap_or(0), u32::try_from(t.tv_usec * 1000).unwrap_or(0)).as_secs_f64()
    };
    Ok((std::os::unix::process::ExitStatusExt::from_raw(status), seconds(usage.ru_utime) + seconds(usage.ru_stime)))
}

fn stats(python: &Path, files: &[&PathBuf]) -> anyhow::Result<Vec<Stats>> {
    let out = Command::new(python)
        .args(["-c", STATS])
        .args(files)
        .output()
        .with_context(|| format!("starting {}", python.display()))?;
    if !out.status.success() {
        bail!("reading pyperf's files: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let v: Value = serde_json::from_slice(&out.stdout).context("pyperf's statistics")?;
    v.as_array()
        .context("pyperf's statistics: a list")?
        .iter()
        .map(|s| {
            Ok(Stats {
                mean: s["mean"].as_f64().context("a mean")?,
                formatted: s["formatted"].as_str().context("a formatted mean")?.to_owned(),
            })
        })
        .collect()
}

/// tracer attached with `--exe` while `work` runs; its summary. Its
/// output goes to `keep` as well.
fn traced(
    tracer: &Path,
    case: &Case<'_>,
    keep: &Path,
    work: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<Summary> {
    let mut run = TracerRun::start(tracer, case, keep)?;
    work()?;
    run.stop()
}

/// A `tracer attach --exe` in the background, its output read on a thread
/// of its own (an interval's JSON holds every process's counts; unread, it
/// would fill the pipe and stall tracer).
struct TracerRun {
    child: Child,
    reader: Option<JoinHandle<anyhow::Result<(Value, Value)>>>,
}

impl TracerRun {
    /// Starts tracer and waits until the cost of a hit is calibrated (the
    /// first interval with a cost), so that the calibration's own work
    /// does not overlap pyperf's.
    fn start(tracer: &Path, case: &Case<'_>, keep: &Path) -> anyhow::Result<Self> {
        let python = case.python.exe.to_str().context("a UTF-8 path")?;
        let mut child = Command::new(tracer)
            .args(["attach", "--exact", "--exe", python, "--json", "--interval", INTERVAL])
            .args(case.flags)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting tracer attach")?;
        let stdout = child.stdout.take().context("tracer's stdout")?;
        let mut kept = std::fs::File::create(keep).with_context(|| format!("creating {}", keep.display()))?;
        let (ready, calibrated) = mpsc::channel();
        let reader = std::thread::spawn(move || -> anyhow::Result<(Value, Value)> {
            let (mut attached, mut summary) = (None, None);
            for line in BufReader::new(stdout).lines() {
                let line = line.context("reading tracer's output")?;
                writeln!(kept, "{line}").context("keeping tracer's output")?;
                let value: Value = serde_json::from_str(&line).with_context(|| format!("tracer's JSON: {line}"))?;
                match value["type"].as_str() {
                    Some("attached") => attached = Some(value),
                    Some("interval") if value.get("cost").is_some() => {
                        let _ = ready.send(());
                    }
                    Some("summary") => summary = Some(value),
                    _ => {}
                }
            }
            Ok((attached.context("tracer wrote no attach header")?, summary.context("tracer wrote no summary")?))
        });
        let mut run = Self { child, reader: Some(reader) };
        if calibrated.recv_timeout(Duration::from_mins(2)).is_err() {
            interrupt(&run.child);
            let why = run.reader.take().map(JoinHandle::join);
            let _ = run.child.wait();
            bail!("tracer attach --exe {python} reported no cost within 2 minutes: {why:?}");
        }
        Ok(run)
    }

    fn stop(&mut self) -> anyhow::Result<Summary> {
        interrupt(&self.child);
        let (attached, summary) = self
            .reader
            .take()
            .context("tracer stopped twice")?
            .join()
            .map_err(|_| anyhow::anyhow!("the thread reading tracer's output panicked"))??;
        let status = self.child.wait().context("waiting for tracer")?;
        if !status.success() {
            bail!("tracer attach ended with {status}");
        }
        let cost = &summary["cost"];
        let share = |key: &str| cost[key].as_f64();
        let fraction = share("overhead_fraction").with_context(|| format!("no share in the summary's cost: {cost}"))?;
        let kinds = |name: &str| {
            let k = &attached["sites"][name];
            (k["emulated"].as_u64().unwrap_or(0), k["single_stepped"].as_u64().unwrap_or(0))
        };
        let probes: Vec<_> = summary["probes"]
            .as_object()
            .context("the summary's probes")?
            .iter()
            .map(|(name, counts)| {
                // Every hit tracer prices: its gates' passes that went
                // elsewhere, and two per nested libc call, beside the calls.
                let n = |key: &str| counts[key].as_u64().unwrap_or(0);
                let nested = counts["nested"]["calls"].as_u64().unwrap_or(0);
                (n("calls") + n("gate_other") + 2 * nested, kinds(name), counts["stepped_hits"].as_u64())
            })
            .collect();
        let summary = Summary {
            fraction,
            fraction_low: share("overhead_fraction_low").unwrap_or(fraction),
            tracer_cpu_s: share("tracer_cpu_s").context("tracer_cpu_s")?,
            target_cpu_s: share("target_cpu_s").context("target_cpu_s")?,
            hits: cost["hits"].as_u64().context("hits")?,
            unpriced: cost["unpriced_hits"].as_u64().unwrap_or(0),
            processes: summary["pids"].as_object().map_or(0, serde_json::Map::len),
            emulated_ns: cost["hit_cost_ns"]["emulated"].as_f64().context("the cost of an emulated hit")?,
            single_stepped_ns: cost["hit_cost_ns"]["single_stepped"]
                .as_f64()
                .context("the cost of a single-stepped hit")?,
            probes,
        };
        // The re-pricing of `priced_at` must be tracer's own.
        let (high, _) = summary.priced_at(&summary);
        if (high - summary.tracer_cpu_s).abs() > 0.01 * summary.tracer_cpu_s + 1e-3 {
            bail!("hits priced as tracer does come to {high} s, and tracer's summary says {} s", summary.tracer_cpu_s);
        }
        Ok(summary)
    }
}

impl Drop for TracerRun {
    fn drop(&mut self) {
        if self.reader.is_some() {
            interrupt(&self.child);
            let _ = self.child.wait();
        }
    }
}

fn interrupt(child: &Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill with a valid signal on our own child, not yet reaped.
        unsafe { libc::kill(pid, libc::SIGINT) };
    }
}

#[cfg(test)]
mod tests {
    use super::Summary;

    /// tracer's prices: a probe of one kind at its kind's, one with both
    /// kinds that counts its single-stepped hits apart hit by hit, and
    /// one that does not as a range.
    #[test]
    fn hits_are_repriced_as_tracer_prices_them() {
        let s = Summary {
            hits: 100,
            emulated_ns: 500.0,
            single_stepped_ns: 15_000.0,
            probes: vec![(10, (3, 0), None), (20, (0, 1), None), (30, (5, 1), Some(4)), (40, (1, 2), None)],
            ..Summary::default()
        };
        let apart = 4.0 * 15_000.0 + 26.0 * 500.0;
        let high = (10.0 * 500.0 + 20.0 * 15_000.0 + apart + 40.0 * 15_000.0) / 1e9;
        let low = (10.0 * 500.0 + 20.0 * 15_000.0 + apart + 40.0 * 500.0) / 1e9;
        let (h, l) = s.priced_at(&s);
        assert!((h - high).abs() < 1e-15 && (l - low).abs() < 1e-15, "{h} {l}");
    }
}
