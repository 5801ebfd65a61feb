//! `cargo xtask bench`: tracer's own estimate of what it costs the target
//! (`cost.overhead_fraction`, shown while it runs) against the slowdown
//! pyperf measures, side by side in one run.
//!
//! pyperf times a statement in worker processes it starts, so tracer traces
//! them with `--exe`, and its estimate covers each whole worker: starting
//! the interpreter and importing pyperf (around a million probe hits) as
//! well as the timed loops, which are all pyperf measures. A third kind of
//! chunk, traced with the same options but few loops, measures that fixed
//! part, so the estimate for the timed loops alone is the difference.

#![allow(clippy::cast_precision_loss, reason = "loop and hit counts far below 2^52")]

use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::markdown::{fmt_ns, shell_quote};

/// Rounds per case, each visiting the four chunks in a rotated order.
const ROUNDS: usize = 3;
/// pyperf's values and warmups per worker, one worker per chunk: few
/// workers with many values, so that each worker's fixed start is paid few
/// times.
const VALUES: u32 = 4;
const WARMUPS: u32 = 1;
/// About how long one traced value takes: long enough that a traced worker
/// spends most of its time in the timed loops.
const TRACED_VALUE_S: f64 = 2.5;
/// About how long one value of the few-loops chunk takes untraced.
const FEW_LOOPS_VALUE_S: f64 = 0.0005;
/// The niceness pyperf runs at (workers inherit it).
const NICE: &str = "-20";
/// tracer's interval: a process's hits after its last reading, which are
/// left unpriced, are at most this long.
const INTERVAL: &str = "0.25";

/// One case: an interpreter, a statement, tracer's flags.
struct Case<'a> {
    what: &'a str,
    python: &'a Private,
    setup: &'a str,
    stmt: &'a str,
    flags: &'a [&'a str],
}

/// A venv's interpreter with a private copy of its image: `--exe` traces
/// every process that maps the image's file, and on a shared machine other
/// processes run the same interpreter, which would be traced and priced
/// with pyperf's. A copy is a file of its own, mapped by pyperf's processes
/// alone.
struct Private {
    /// What pyperf runs.
    python: PathBuf,
    /// What tracer attaches to: the copy.
    exe: PathBuf,
    /// What makes the interpreter load the copy, given to pyperf's runner
    /// and passed on to its workers.
    env: Option<(&'static str, PathBuf)>,
}

impl Private {
    /// For `venv`, in `dir`: a shared libpython is copied into `dir/lib`,
    /// which `LD_LIBRARY_PATH` puts before the interpreter's RUNPATH; a
    /// static interpreter is copied into a venv of its own, `dir/venv`,
    /// whose `lib` is the original venv's (pyperf is there).
    fn new(venv: &Path, dir: &Path) -> anyhow::Result<Self> {
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
struct Summary {
    fraction: f64,
    /// The share with every hit of a probe with sites of both kinds priced
    /// emulated; `fraction` where there is no such range.
    fraction_low: f64,
    tracer_cpu_s: f64,
    target_cpu_s: f64,
    hits: u64,
    unpriced: u64,
    processes: usize,
    /// The calibrated cost of a hit.
    emulated_ns: f64,
    single_stepped_ns: f64,
    /// Each probe's calls and its sites: (emulated, single-stepped).
    probes: Vec<(u64, (u64, u64))>,
}

impl Summary {
    /// The (high, low) probe time in seconds of this chunk's priced hits
    /// at `calibration`'s costs of a hit, as tracer prices a probe's hits (without
    /// `--returns`): by the kind of its sites, a probe with both kinds high
    /// as single-stepped and low as emulated.
    fn priced_at(&self, calibration: &Self) -> (f64, f64) {
        let (e, s) = (calibration.emulated_ns, calibration.single_stepped_ns);
        let (mut high, mut low) = (0.0, 0.0);
        for &(calls, kinds) in &self.probes {
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
struct Stats {
    mean: f64,
    formatted: String,
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

pub fn cost_section(md: &mut String, tracer: &Path, out_root: &Path) -> anyhow::Result<()> {
    let dir = out_root.join("cost");
    let pyenv = Private::new(&crate::setup::pyperf_venv(), &dir.join("pyenv"))?;
    let debian = Private::new(&crate::setup::static_pyperf_venv(), &dir.join("debian"))?;
    let json = ("import json; d = {'a': 1, 'b': [1, 2, 3], 'c': 'text'}", "json.loads(json.dumps(d))");
    // Sorting 2,000 ints allocates a few blocks in tens of µs: a low cost,
    // where the estimate is not near its cap.
    let sort = ("t = tuple(range(2000, 0, -1))", "sorted(t)");
    let cases = [
        Case { what: "pyenv 3.11, `sorted(t)` of 2,000 ints", python: &pyenv, setup: sort.0, stmt: sort.1, flags: &[] },
        Case {
            what: "Debian 3.11 (LTO, every copy), `sorted(t)` of 2,000 ints",
            python: &debian,
            setup: sort.0,
            stmt: sort.1,
            flags: &[],
        },
        Case { what: "pyenv 3.11, `[]`", python: &pyenv, setup: "pass", stmt: "[]", flags: &[] },
        Case { what: "pyenv 3.11, JSON round trip", python: &pyenv, setup: json.0, stmt: json.1, flags: &[] },
        Case {
            what: "pyenv 3.11, JSON round trip, `--placement entry`",
            python: &pyenv,
            setup: json.0,
            stmt: json.1,
            flags: &["--placement", "entry"],
        },
        Case { what: "Debian 3.11 (LTO, every copy), `[]`", python: &debian, setup: "pass", stmt: "[]", flags: &[] },
        Case {
            what: "Debian 3.11 (LTO, every copy), JSON round trip",
            python: &debian,
            setup: json.0,
            stmt: json.1,
            flags: &[],
        },
    ];
    let load = crate::markdown::Load::now();
    let (mut shares, mut per_loop) = (String::new(), String::new());
    let mut loops_used = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        eprintln!("xtask: cost: {}", case.what);
        let m = measure(tracer, case, &dir.join(i.to_string()))?;
        loops_used.push(format!("{} loops ({} in the few-loops chunk)", m.loops, m.few_loops));
        let (s, p) = m.rows(case.what);
        shares.push_str(&s);
        per_loop.push_str(&p);
    }
    heading(md)?;
    md.push_str(&shares);
    writeln!(md)?;
    writeln!(
        md,
        "Per loop of the statement, over the loops that differ between each full chunk and its few-loops \
         one: the hits (exact counts, so a whole number where every loop does the same); the CPU time \
         untraced and traced, as the kernel accounts it to pyperf's runner and the worker it reaps \
         (wait4), and traced as tracer read it; the time tracing added, in pyperf's wall time (its traced \
         mean less its untraced mean) and in CPU time; tracer's estimated probe time; and the calibrated \
         cost of a hit the estimate priced them at (mean of the traced chunks' calibrations):\n"
    )?;
    writeln!(
        md,
        "| case | hits per loop | untraced CPU | traced CPU: kernel, tracer | added: wall (pyperf), CPU | estimated probe time | hit cost: emulated, single-stepped |"
    )?;
    writeln!(md, "|---|---|---|---|---|---|---|")?;
    md.push_str(&per_loop);
    writeln!(md)?;
    commands(md, tracer, [&pyenv, &debian], &cases, &loops_used)?;
    writeln!(md, "{}", load.line())?;
    Ok(())
}

fn heading(md: &mut String) -> anyhow::Result<()> {
    writeln!(md, "## The cost tracer shows while it runs, against the slowdown pyperf measures\n")?;
    writeln!(
        md,
        "Every interval and the summary carry `cost.overhead_fraction`: hits times the calibrated CPU cost of \
         a hit where each sits, as a share f of the target's CPU time (docs/cost.md). A share f \
         of a CPU-bound loop's time spent in probes predicts it to run 1/(1 − f) times slower. Here \
         `pyperf timeit` runs each statement untraced and under `tracer attach --exe PYTHON --json`, \
         which traces pyperf's runner and its worker from their start, and tracer's summaries are set \
         against pyperf's means. Each case has {ROUNDS} rounds of four chunks in a rotated order: \
         untraced and traced, each also with few loops; every chunk is one pyperf worker with {VALUES} \
         values after {WARMUPS} warmup, at a fixed `--loops` (a traced value takes about {TRACED_VALUE_S} s). \
         pyperf times in wall time, which on a loaded machine holds the time its worker waited for a CPU \
         (pyperf's nice -20 below does not keep other sessions' work, in cgroups of their own, from \
         taking a share of it), while tracer estimates in CPU time; so the tables give the CPU time the \
         kernel accounted to pyperf's processes beside pyperf's figures.\n"
    )?;
    writeln!(
        md,
        "tracer's estimate covers whole processes: pyperf's runner, and each worker's start (the \
         interpreter's own and pyperf's imports, about a million probe hits) and exit as well as the timed \
         loops, which are all pyperf times. So the table gives two shares: the whole run's, which is what \
         a user of `tracer attach` reads, and the timed loops', which is the traced chunk's estimated \
         probe time and CPU time less the few-loops chunk's (same workers, values and warmups), the \
         per-loop difference over the loops that differ. Every attach calibrates the cost of a hit anew, \
         and two calibrations differ by up to about 15% here, so the few-loops chunk's hits (by probe, \
         priced by the kind of its sites as tracer prices them) are priced at the traced chunk's \
         calibration, as the traced chunk priced its own start; the traced chunk's hits priced so \
         come to its summary's `tracer_cpu_s`, which the benchmark checks. That second share is the one to set against \
         pyperf. Where a probe's sites are of both kinds the estimate is a range (`overhead_fraction_low` \
         prices every such hit emulated). The measured share in parentheses, 1 − 1/slowdown, is the share of the traced \
         loop's time that tracing added, to set against f where 1/(1 − f) is ill-conditioned (near a \
         share of 1, where a few percent of f make a factor of several in the prediction). \"Unpriced\" is the share of \
         the traced chunks' hits that tracer could not pair with a CPU time (`cost.unpriced_hits`); a \
         process started after the attach is priced to its end from the kernel's exit records (docs/cost.md), \
         so pyperf's runner and worker leave none unless those records were lost. The whole-run share is \
         capped at 1; the timed loops' is a difference of two estimates, and can pass 1 where the \
         estimate's probe time passes the CPU time it ran on.\n"
    )?;
    writeln!(
        md,
        "| case | untraced (pyperf) | traced (pyperf) | measured slowdown (share) | in CPU time (share) | \
         f, whole run | f, timed loops | predicted 1/(1 − f) | unpriced |"
    )?;
    writeln!(md, "|---|---|---|---|---|---|---|---|---|")?;
    Ok(())
}

fn commands(
    md: &mut String,
    tracer: &Path,
    [pyenv, debian]: [&Private; 2],
    cases: &[Case<'_>],
    loops_used: &[String],
) -> anyhow::Result<()> {
    writeln!(
        md,
        "Other processes on this machine run the same interpreters, and `--exe` would trace them too, so \
         each build runs from a private copy of its image, mapped by pyperf's processes alone: pyenv's \
         libpython copied to `{}`, which `LD_LIBRARY_PATH` (passed on to pyperf's workers with \
         `--inherit-environ`) puts before the interpreter's RUNPATH, and Debian's static `python3.11` \
         copied into a venv of its own, `{}`, that shares the setup venv's `lib` (pyperf). pyperf's workers \
         show `/proc/PID/exe` as the real interpreter behind the venv's symlink; `--exe` takes the venv's \
         `bin/python`, the interpreter, or a libpython itself. Untraced chunks run the same copies. \
         Commands, with PYTHON the venv's interpreter (`{}`, or the private venv's for Debian's 3.11), EXE \
         the copy (`{}` or `{}`), and FILE each chunk kind's own pyperf file (`--append`). pyperf runs at \
         nice {NICE}, so that other load on the machine seldom keeps its worker waiting for a CPU, which \
         its wall-clock timings would count and tracer's CPU-time estimate not:\n",
        pyenv.env.as_ref().map_or_else(String::new, |(_, dir)| dir.display().to_string()),
        debian.python.parent().and_then(Path::parent).map_or_else(String::new, |d| d.display().to_string()),
        pyenv.python.display(),
        pyenv.exe.display(),
        debian.exe.display(),
    )?;
    writeln!(md, "```")?;
    writeln!(md, "sudo {} attach --exe EXE --json --interval {INTERVAL} [FLAGS]", tracer.display())?;
    writeln!(
        md,
        "[LD_LIBRARY_PATH=DIR] nice -n {NICE} PYTHON -m pyperf timeit --quiet --append FILE --processes 1 --values {VALUES} --warmups {WARMUPS} --loops LOOPS [--inherit-environ LD_LIBRARY_PATH] --setup SETUP -- STMT"
    )?;
    writeln!(md, "```\n")?;
    writeln!(md, "| case | SETUP | STMT | FLAGS | LOOPS |\n|---|---|---|---|---|")?;
    for (case, loops) in cases.iter().zip(loops_used) {
        writeln!(
            md,
            "| {} | `{}` | `{}` | {} | {loops} |",
            case.what,
            shell_quote(case.setup),
            shell_quote(case.stmt),
            if case.flags.is_empty() { "—".to_owned() } else { format!("`{}`", case.flags.join(" ")) }
        )?;
    }
    writeln!(md)?;
    Ok(())
}

/// One case, measured.
struct Measured {
    loops: u64,
    few_loops: u64,
    untraced: Stats,
    traced: Stats,
    /// Per round.
    full: Vec<Summary>,
    few: Vec<Summary>,
    cpu: Cpu,
}

/// The CPU time pyperf's processes used, by chunk kind over all rounds, as
/// the kernel accounts it to pyperf's runner for itself and the processes it
/// reaped (wait4).
#[derive(Clone, Copy, Debug, Default)]
struct Cpu {
    untraced: f64,
    untraced_few: f64,
    traced: f64,
    few: f64,
}

impl Measured {
    /// This case's row in the table of shares and in the table per loop.
    fn rows(&self, what: &str) -> (String, String) {
        let slowdown = self.traced.mean / self.untraced.mean;
        let sum = |v: &[Summary], f: fn(&Summary) -> f64| v.iter().map(f).sum::<f64>();
        let mean = |v: &[Summary], f: fn(&Summary) -> f64| sum(v, f) / v.len().max(1) as f64;
        let loops_differing =
            (self.loops - self.few_loops) as f64 * f64::from(VALUES + WARMUPS) * self.full.len() as f64;
        let all_hits = |s: &Summary| (s.hits + s.unpriced) as f64;
        let hits_per_loop = (sum(&self.full, all_hits) - sum(&self.few, all_hits)) / loops_differing;
        let whole = range(mean(&self.full, |s| s.fraction_low), mean(&self.full, |s| s.fraction));
        let cpu = sum(&self.full, |s| s.target_cpu_s) - sum(&self.few, |s| s.target_cpu_s);
        // Each round's two traced chunks calibrate anew, and differ by up
        // to about 15% here: the few-loops chunk's hits, mostly the
        // workers' start, are priced at the traced chunk's calibration, as
        // the traced chunk priced its own start.
        let (probes_high, probes_low) = self.full.iter().zip(&self.few).fold((0.0, 0.0), |(high, low), (full, few)| {
            let ((fh, fl), (sh, sl)) = (full.priced_at(full), few.priced_at(full));
            (high + fh - sh, low + fl - sl)
        });
        let (f_high, f_low) = (probes_high / cpu, probes_low / cpu);
        let loops_f = range(f_low, f_high);
        let predicted = if (f_high - f_low).abs() < 5e-4 {
            predicted(f_high)
        } else {
            format!("{}–{}", predicted(f_low), predicted(f_high))
        };
        let unpriced = sum(&self.full, |s| s.unpriced as f64) / sum(&self.full, all_hits);
        let most = self.full.iter().chain(&self.few).map(|s| s.processes).max().unwrap_or(0);
        // pyperf's runner and its one worker; more would be processes they
        // started, counted too.
        let others = if most > 2 { format!(" ({most} processes traced)") } else { String::new() };
        let cpu_untraced = (self.cpu.untraced - self.cpu.untraced_few) / loops_differing;
        let cpu_traced = (self.cpu.traced - self.cpu.few) / loops_differing;
        let cpu_slowdown = cpu_traced / cpu_untraced;
        let shares = format!(
            "| {what} | {} | {} | {slowdown:.2}x ({:.1}%) | {cpu_slowdown:.2}x ({:.1}%) | {whole} | {loops_f} | {predicted} | {:.1}%{others} |\n",
            self.untraced.formatted.replace("+-", "±"),
            self.traced.formatted.replace("+-", "±"),
            (1.0 - 1.0 / slowdown) * 100.0,
            (1.0 - 1.0 / cpu_slowdown) * 100.0,
            unpriced * 100.0,
        );
        let per_loop = |seconds: f64| fmt_ns(seconds / loops_differing * 1e9);
        let estimated = if (probes_high - probes_low) / loops_differing * 1e9 < 0.5 {
            per_loop(probes_high)
        } else {
            format!("{}–{}", per_loop(probes_low), per_loop(probes_high))
        };
        let per_loop = format!(
            "| {what} | {hits_per_loop:.1} | {} | {}, {} | {}, {} | {estimated} | {:.0} ns, {:.0} ns |\n",
            fmt_ns(cpu_untraced * 1e9),
            fmt_ns(cpu_traced * 1e9),
            per_loop(cpu),
            fmt_ns((self.traced.mean - self.untraced.mean) * 1e9),
            fmt_ns((cpu_traced - cpu_untraced) * 1e9),
            mean(&self.full, |s| s.emulated_ns),
            mean(&self.full, |s| s.single_stepped_ns),
        );
        (shares, per_loop)
    }
}

/// A share or a range of shares, in percent.
fn range(low: f64, high: f64) -> String {
    if (high - low).abs() < 5e-4 {
        format!("{:.1}%", high * 100.0)
    } else {
        format!("{:.1}%–{:.1}%", low * 100.0, high * 100.0)
    }
}

/// The slowdown predicted for a share `f` of the target's CPU in probes.
fn predicted(f: f64) -> String {
    if f >= 1.0 {
        "none (f ≥ 100%)".to_owned()
    } else if f >= 0.999 {
        "over 1000x".to_owned()
    } else {
        format!("{:.2}x", 1.0 / (1.0 - f))
    }
}

fn measure(tracer: &Path, case: &Case<'_>, dir: &Path) -> anyhow::Result<Measured> {
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
            .map(|(name, counts)| (counts["calls"].as_u64().unwrap_or(0), kinds(name)))
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
