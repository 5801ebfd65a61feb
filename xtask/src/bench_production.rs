//! `cargo xtask bench --only production`: what a tool costs pyperformance's
//! benchmark functions, side by side in one run, on Debian's LTO 3.11,
//! pyenv's 3.11.7 and Debian forky's LTO 3.14, measured the ways that show
//! a 1% effect on this noisy machine (shared/TOOLCHAIN.md, section 7):
//!
//! - tracer (whatever command line it is given) by twins: two identical
//!   workers, one per CPU, run each round at the same moment; tracer is
//!   attached to one; the median of the per-round ratios, then the roles
//!   and CPUs swapped, and the geometric mean of the two medians; plus the
//!   traced twin's extra share of CPU time in the kernel;
//! - the same with nothing attached: the noise floor of that measure;
//! - tracemalloc and memray in-process: on and off in alternate rounds of
//!   one process, each on-round against its neighbouring off-rounds.

#![allow(clippy::cast_precision_loss, reason = "round counts and loop counts far below 2^52")]

use std::{fmt::Write as _, path::Path, time::Instant};

use anyhow::{Context as _, bail};

use crate::{
    bench_venvs::BenchPython,
    production_procs::{HARNESS_PATH, Round, Tracer, Worker, install_harness, tracer_words, twin_round, worker_words},
};

/// What `--tracer-args` defaults to: the production profile, as a user
/// runs it (`tracer attach`'s default: every source, 1% of the target's
/// CPU time).
pub const DEFAULT_TRACER_ARGS: &str = "attach --pid PID";

/// (pyperformance benchmark, its own arguments, as the table names it).
/// `xml_etree`'s loop is its `process` part alone: one loop of all four parts
/// takes about 0.7 s of CPU here, longer than a round.
const BENCHMARKS: [(&str, &[&str], &str); 5] = [
    ("json_dumps", &[], "json_dumps"),
    ("deepcopy", &[], "deepcopy"),
    ("float", &[], "float"),
    ("richards", &[], "richards"),
    ("xml_etree", &["process"], "xml_etree (process)"),
];

/// In-process tools: (harness name, column heading).
const TOOLS: [(&str, &str); 3] = [
    ("tracemalloc", "tracemalloc, 1 frame"),
    ("memray", "memray Tracker"),
    ("memray-python", "memray, Python allocators"),
];

struct Plan {
    benchmarks: Vec<(&'static str, &'static [&'static str], &'static str)>,
    /// Which twin is traced in each block of twin rounds, in order (0: the
    /// one on CPU 0): A B B A cancels a drift of the machine that a single
    /// swap would take for a difference between the twins.
    blocks: &'static [usize],
    /// Twin rounds per block.
    twin: usize,
    /// On-rounds per worker per in-process tool.
    in_process: usize,
    /// Target seconds per round.
    seconds: f64,
    /// Rounds run and dropped after tracer attaches.
    settle: usize,
}

fn plan(effort: &str) -> Plan {
    let all = BENCHMARKS.to_vec();
    match effort {
        "rigorous" => {
            Plan { benchmarks: all, blocks: &[0, 1, 1, 0], twin: 60, in_process: 10, seconds: 0.2, settle: 3 }
        }
        // Blocks of 30 rounds (about 7 s): the profile's census and rates
        // windows come every few seconds, as the budget pays for them, so a
        // shorter block would see some of them or none.
        "normal" => Plan { benchmarks: all, blocks: &[0, 1, 1, 0], twin: 30, in_process: 5, seconds: 0.2, settle: 2 },
        _ => Plan {
            benchmarks: vec![BENCHMARKS[0], BENCHMARKS[3]],
            blocks: &[0, 1],
            twin: 10,
            in_process: 2,
            seconds: 0.2,
            settle: 1,
        },
    }
}

/// `--tracer-args`: tracer's arguments, `PID` standing for the target's; a
/// leading `tracer` is dropped.
pub fn parse_tracer_args(text: &str) -> anyhow::Result<Vec<String>> {
    let mut words: Vec<String> = text.split_whitespace().map(str::to_owned).collect();
    if words.first().is_some_and(|w| w == "tracer") {
        words.remove(0);
    }
    if !words.iter().any(|w| w == "PID") {
        bail!(
            "--tracer-args {text:?} has no PID word; write the target's PID as PID, e.g. --tracer-args '{DEFAULT_TRACER_ARGS}'"
        );
    }
    Ok(words)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 { s[n / 2] } else { f64::midpoint(s[n / 2 - 1], s[n / 2]) }
}

fn geomean(v: &[f64]) -> f64 {
    (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp()
}

/// The 95% percentile-bootstrap interval of `stat` over groups of
/// `lens` items, each group's indices resampled with replacement (a fixed
/// seed: the same data gives the same interval).
fn bootstrap(lens: &[usize], stat: impl Fn(&[Vec<usize>]) -> f64) -> (f64, f64) {
    const RESAMPLES: usize = 2000;
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = |n: usize| {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        #[allow(clippy::cast_possible_truncation, reason = "reduced modulo a length")]
        let i = (state.wrapping_mul(0x2545_F491_4F6C_DD1D) % n as u64) as usize;
        i
    };
    let mut resampled: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            let sample: Vec<Vec<usize>> = lens.iter().map(|&n| (0..n).map(|_| next(n)).collect()).collect();
            stat(&sample)
        })
        .collect();
    resampled.sort_by(f64::total_cmp);
    (resampled[RESAMPLES / 40], resampled[RESAMPLES - 1 - RESAMPLES / 40])
}

/// One twin measure: per orientation (the traced twin on CPU 0, then on
/// CPU 1), each round's (traced, untraced) times.
#[derive(Default)]
struct Twins {
    rounds: [Vec<(Round, Round)>; 2],
}

/// One orientation's rounds: (traced, untraced).
type Pairs = [(Round, Round)];

/// The median of per-round ratios of the rounds `idx` of one orientation.
fn median_ratio(rounds: &Pairs, idx: &[usize]) -> f64 {
    median(&idx.iter().map(|&i| rounds[i].0.wall / rounds[i].1.wall).collect::<Vec<_>>())
}

/// Total traced time over total untraced time of the rounds `idx`.
fn total_ratio(rounds: &Pairs, idx: &[usize]) -> f64 {
    let (t, u) = idx.iter().fold((0.0, 0.0), |(t, u), &i| (t + rounds[i].0.wall, u + rounds[i].1.wall));
    t / u
}

impl Twins {
    /// The geometric mean over both orientations of `ratio` on all rounds,
    /// and its bootstrap interval.
    fn estimate(&self, ratio: fn(&Pairs, &[usize]) -> f64) -> (f64, f64, f64) {
        let [a, b] = &self.rounds;
        let all = |r: &Pairs| ratio(r, &(0..r.len()).collect::<Vec<_>>());
        let (lo, hi) = bootstrap(&[a.len(), b.len()], |idx| (ratio(a, &idx[0]) * ratio(b, &idx[1])).sqrt());
        ((all(a) * all(b)).sqrt(), lo, hi)
    }

    /// The median of per-round ratios (robust to a round disturbed by
    /// the machine, blind to a cost paid in fewer than half the rounds).
    fn median(&self) -> (f64, f64, f64) {
        self.estimate(median_ratio)
    }

    /// Total time over total time (sees a duty-cycled cost, and every
    /// disturbance too).
    fn total(&self) -> (f64, f64, f64) {
        self.estimate(total_ratio)
    }

    /// Every round, for the raw file: per orientation, [traced wall,
    /// user, system, untraced wall, user, system].
    fn raw(&self) -> serde_json::Value {
        let row = |(t, u): &(Round, Round)| [t.wall, t.user, t.system, u.wall, u.user, u.system];
        serde_json::json!(self.rounds.iter().map(|o| o.iter().map(row).collect::<Vec<_>>()).collect::<Vec<_>>())
    }

    /// The traced twin's extra kernel share, the mean of both orientations.
    fn kernel(&self) -> f64 {
        let extra = |r: &Pairs| {
            let (t, u): (Vec<Round>, Vec<Round>) = r.iter().copied().unzip();
            kernel_share(&t) - kernel_share(&u)
        };
        f64::midpoint(extra(&self.rounds[0]), extra(&self.rounds[1]))
    }
}

fn twin_cell((x, lo, hi): (f64, f64, f64)) -> String {
    format!("{x:.3}x ({lo:.3}–{hi:.3})")
}

/// Kernel time over CPU time of some rounds.
fn kernel_share(rounds: &[Round]) -> f64 {
    let system: f64 = rounds.iter().map(|r| r.system).sum();
    let cpu: f64 = rounds.iter().map(|r| r.user + r.system).sum();
    if cpu > 0.0 { system / cpu } else { 0.0 }
}

/// `n` twin rounds, the twin on `traced` (0: x, 1: y) taken as traced:
/// each round's (traced, untraced) times.
fn twin_rounds(
    workers: &mut [Worker; 2],
    traced: usize,
    loops: u64,
    rounds: usize,
) -> anyhow::Result<Vec<(Round, Round)>> {
    (0..rounds)
        .map(|_| {
            let [x, y] = workers;
            let (rx, ry) = twin_round(x, y, loops, "none")?;
            Ok(if traced == 0 { (rx, ry) } else { (ry, rx) })
        })
        .collect()
}

/// One benchmark on one interpreter, every setup.
struct Measured {
    label: &'static str,
    loops: u64,
    round_wall: f64,
    nothing: Twins,
    tracer: Twins,
    /// tracer's own CPU over the measured rounds, in cores.
    tracer_cpu: f64,
    /// tracer's own estimate of its cost to the target (the profile's last
    /// `profile cost ≈` line), per block, where it printed one.
    estimates: Vec<f64>,
    /// Per tool: the on/off ratios, or None where the tool is absent.
    tools: Vec<Option<Vec<f64>>>,
}

/// The in-process ratios of one tool in both workers: each on-round
/// against the mean of the off-rounds either side.
fn in_process(w: &mut [Worker; 2], tool: &str, loops: u64, on_rounds: usize) -> anyhow::Result<Vec<f64>> {
    let mut series: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for i in 0..=2 * on_rounds {
        let [x, y] = w;
        let (rx, ry) = twin_round(x, y, loops, if i % 2 == 1 { tool } else { "none" })?;
        series[0].push(rx.wall);
        series[1].push(ry.wall);
    }
    Ok(series.iter().flat_map(|s| alternate_ratios(s)).collect())
}

/// Rounds off, on, off, …, off: each on-round over the mean of the
/// off-rounds either side.
fn alternate_ratios(walls: &[f64]) -> Vec<f64> {
    (1..walls.len().saturating_sub(1))
        .step_by(2)
        .map(|i| walls[i] / f64::midpoint(walls[i - 1], walls[i + 1]))
        .collect()
}

struct Context<'a> {
    tracer: &'a Path,
    tracer_args: &'a [String],
    out: &'a Path,
    plan: &'a Plan,
}

fn measure(
    cx: &Context,
    python: &BenchPython,
    (bench, args, label): (&str, &[&str], &'static str),
) -> anyhow::Result<Measured> {
    let plan = cx.plan;
    let say = |what: &str| eprintln!("xtask: production: {}, {label}: {what}", python.name);
    // Names the files of this benchmark's run in `cx.out`.
    let stem = format!(
        "{}/{}-{bench}",
        cx.out.display(),
        python.venv.file_name().map_or_else(|| "venv".into(), |n| n.to_string_lossy())
    );
    say("starting the twins");
    let mut workers = [Worker::start(python, 0, bench, args)?, Worker::start(python, 1, bench, args)?];
    let loops = workers[0].calibrate(plan.seconds)?;
    // A first round in both, dropped: the first run of each path.
    let [x, y] = &mut workers;
    let (warm, _) = twin_round(x, y, loops, "none")?;
    say(&format!("{loops} loops per round ({:.3} s warm-up); nothing attached", warm.wall));
    let mut nothing = Twins::default();
    for &traced in plan.blocks {
        nothing.rounds[traced].extend(twin_rounds(&mut workers, traced, loops, plan.twin)?);
    }
    let walls: Vec<f64> = nothing.rounds.iter().flatten().flat_map(|(t, u)| [t.wall, u.wall]).collect();
    let mut tracer = Twins::default();
    let (mut tracer_cpu, mut tracer_wall) = (0.0, 0.0);
    let mut estimates = Vec::new();
    for (block, &traced) in plan.blocks.iter().enumerate() {
        let words = tracer_words(cx.tracer, cx.tracer_args, workers[traced].pid(), workers[traced].cpu);
        say(&format!("$ {}", words.join(" ")));
        let t = Tracer::attach(&words, &format!("{stem}-{block}"))?;
        twin_rounds(&mut workers, traced, loops, plan.settle)?;
        let (c0, started) = (t.cpu_seconds()?, Instant::now());
        tracer.rounds[traced].extend(twin_rounds(&mut workers, traced, loops, plan.twin)?);
        tracer_cpu += t.cpu_seconds()? - c0;
        tracer_wall += started.elapsed().as_secs_f64();
        t.detach()?;
        let out = std::fs::read_to_string(format!("{stem}-{block}.out")).unwrap_or_default();
        estimates.extend(own_estimate(&out));
    }
    let no_memray = python.no_memray().is_some();
    let mut tools = Vec::new();
    for (tool, _) in TOOLS {
        if no_memray && tool.starts_with("memray") {
            tools.push(None);
            continue;
        }
        say(&format!("{tool} on and off"));
        tools.push(Some(in_process(&mut workers, tool, loops, plan.in_process)?));
    }
    let raw = serde_json::json!({
        "loops": loops,
        "nothing": nothing.raw(),
        "tracer": tracer.raw(),
        "tracer_args": cx.tracer_args,
        "tools": TOOLS.iter().zip(&tools).map(|((t, _), r)| (t.to_string(), serde_json::json!(r))).collect::<serde_json::Map<_, _>>(),
    });
    let raw_path = format!("{stem}.json");
    std::fs::write(&raw_path, raw.to_string()).with_context(|| format!("writing {raw_path}"))?;
    Ok(Measured {
        label,
        loops,
        round_wall: median(&walls),
        nothing,
        tracer,
        tracer_cpu: tracer_cpu / tracer_wall,
        estimates,
        tools,
    })
}

/// The production profile's own estimate of its cost to the target over
/// the run, as a fraction: the summary's (the last) `profile cost ≈X%`
/// line of its table output.
fn own_estimate(out: &str) -> Option<f64> {
    let line = out.lines().rev().find_map(|l| l.trim_start().strip_prefix("profile cost ≈"))?;
    let percent: f64 = line.split('%').next()?.parse().ok()?;
    Some(percent / 100.0)
}

fn ratio_cell(v: &[f64]) -> String {
    let (lo, hi) = bootstrap(&[v.len()], |idx| median(&idx[0].iter().map(|&i| v[i]).collect::<Vec<_>>()));
    format!("{:.2}x ({lo:.2}–{hi:.2})", median(v))
}

/// The blocks' own estimates, as percentages of the target's CPU time;
/// "—" where tracer printed none (exact tracing, or JSON output).
fn estimate_cell(v: &[f64]) -> String {
    if v.is_empty() {
        return "—".to_owned();
    }
    v.iter().map(|e| format!("{:.2}%", e * 100.0)).collect::<Vec<_>>().join(", ")
}

fn pct(x: f64) -> String {
    format!("{:+.2}%", x * 100.0)
}

/// One interpreter's table.
fn table(md: &mut String, p: &BenchPython, rows: &[Measured]) -> anyhow::Result<()> {
    writeln!(md, "### {}\n", p.name)?;
    writeln!(
        md,
        "| benchmark | loops per round | nothing: median | nothing: total | nothing: kernel | tracer: median | \
         tracer: total | tracer: kernel | tracer's own estimate | tracer's own CPU | {} |",
        TOOLS.map(|t| t.1).join(" | ")
    )?;
    writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")?;
    for m in rows {
        let tools: Vec<String> =
            m.tools.iter().map(|t| t.as_deref().map_or_else(|| "—".to_owned(), ratio_cell)).collect();
        writeln!(
            md,
            "| {} | {} ({:.2} s) | {} | {} | {} | {} | {} | {} | {} | {:.1}% of a core | {} |",
            m.label,
            m.loops,
            m.round_wall,
            twin_cell(m.nothing.median()),
            twin_cell(m.nothing.total()),
            pct(m.nothing.kernel()),
            twin_cell(m.tracer.median()),
            twin_cell(m.tracer.total()),
            pct(m.tracer.kernel()),
            estimate_cell(&m.estimates),
            m.tracer_cpu * 100.0,
            tools.join(" | ")
        )?;
    }
    let gm = |f: &dyn Fn(&Measured) -> f64| geomean(&rows.iter().map(f).collect::<Vec<_>>());
    let mean = |f: &dyn Fn(&Measured) -> f64| rows.iter().map(f).sum::<f64>() / rows.len() as f64;
    let tool_gm = |i: usize| {
        let v: Option<Vec<f64>> = rows.iter().map(|m| m.tools[i].as_deref().map(median)).collect();
        v.map_or_else(|| "—".to_owned(), |v| format!("{:.2}x", geomean(&v)))
    };
    writeln!(
        md,
        "| **geometric mean** (kernel, own CPU: mean) | | {:.3}x | {:.3}x | {} | {:.3}x | {:.3}x | {} | | {:.1}% of a core | {} |\n",
        gm(&|m| m.nothing.median().0),
        gm(&|m| m.nothing.total().0),
        pct(mean(&|m| m.nothing.kernel())),
        gm(&|m| m.tracer.median().0),
        gm(&|m| m.tracer.total().0),
        pct(mean(&|m| m.tracer.kernel())),
        mean(&|m| m.tracer_cpu) * 100.0,
        (0..TOOLS.len()).map(tool_gm).collect::<Vec<_>>().join(" | ")
    )?;
    if let Some(reason) = p.no_memray() {
        writeln!(md, "memray: {reason}.\n")?;
    }
    Ok(())
}

/// Writes the section; `tracer_args` as [`parse_tracer_args`] gives them.
pub fn production_section(
    md: &mut String,
    tracer: &Path,
    effort: &str,
    tracer_args: &[String],
    out_root: &Path,
) -> anyhow::Result<()> {
    let plan = plan(effort);
    let load = crate::markdown::Load::now();
    let pythons = crate::bench_venvs::pythons();
    install_harness(&pythons)?;
    let out = out_root.join("production");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let cx = Context { tracer, tracer_args, out: &out, plan: &plan };
    let mut tables = String::new();
    for p in &pythons {
        if let Some(line) = p.no_memray() {
            eprintln!("xtask: production: {line}");
        }
        let rows = plan.benchmarks.iter().map(|b| measure(&cx, p, *b)).collect::<anyhow::Result<Vec<_>>>()?;
        table(&mut tables, p, &rows)?;
    }
    let shown_args = tracer_args.join(" ");
    writeln!(md, "## Production cost: pyperformance under tracer, tracemalloc and memray\n")?;
    writeln!(
        md,
        "What each tool costs pyperformance 1.14's benchmark functions, run in a loop, measured side by side \
         in one run on three interpreters. This machine is noisy (one round of the same work varies by \
         tens of percent, phases run one after the other by up to 1.8x), so each tool is measured a way \
         that shows a 1% effect (shared/TOOLCHAIN.md, section 7):\n"
    )?;
    writeln!(
        md,
        "- **tracer** (`tracer {shown_args}`) by twins: two identical worker processes, pinned to CPU 0 and \
         CPU 1 with `taskset`, each doing a round of the same fixed work (the loops per round, calibrated \
         to about {:.1} s once, by the wall clock) when xtask writes the same line to both. tracer is \
         attached to one of them and pinned to its CPU too, so that its own work slows the traced twin \
         rather than its reference; {} rounds are dropped after it says it is attached, then {} rounds \
         are measured, and tracer is stopped with SIGINT (detached). The traced twin goes in blocks: {} \
         ({}: the twin on that CPU traced){}. Each cell is the geometric mean of the two orientations' \
         figures (all the rounds with the twin on CPU 0 traced, all with the twin on CPU 1), which \
         cancels the difference between the two CPUs and processes, with its 95% bootstrap interval (rounds \
         resampled):\n\
         \x20 - **median**: the median of the per-round ratios (traced round time / untraced round time), \
         shared/TOOLCHAIN.md's measure: robust to a round the machine disturbed, but blind to a cost paid \
         in fewer than half the rounds (a duty-cycled window, a census once an interval);\n\
         \x20 - **total**: the traced twin's total time over the other's: it sees such a cost, and every \
         disturbance too;\n\
         \x20 - **kernel**: the traced twin's share of its CPU time spent in the kernel (where uprobe traps \
         and BPF programs run) minus the other twin's, from getrusage over the same rounds (the mean of \
         both orientations);\n\
         \x20 - **tracer's own CPU**: tracer's user + system time over the measured rounds' wall time.\n\
         - **nothing**: the same twins, rounds and blocks with nothing attached: the noise floor of each measure.\n\
         - **tracemalloc** (`tracemalloc.start(1)`) and **memray** (`memray.Tracker` to a file, without \
         compression at exit, its defaults otherwise; then with `trace_python_allocators=True`), in \
         process: switched on before a round's clock starts and off after it stops, in alternate rounds \
         (off, on, off, …: {} on-rounds in each twin, both twins alike); each on-round's time over the \
         mean of the off-rounds either side; the cell is the median of these ratios with its 95% \
         bootstrap interval.\n",
        plan.seconds,
        plan.settle,
        plan.twin,
        plan.blocks.len(),
        plan.blocks.iter().map(|b| format!("CPU {b}")).collect::<Vec<_>>().join(", "),
        if plan.blocks.len() > 2 { ", so that a drift of the machine falls on both orientations alike" } else { "" },
        plan.in_process
    )?;
    writeln!(
        md,
        "The workers are `xtask/src/production.py` (copied to `{HARNESS_PATH}` in each root), run by a venv \
         with pyperformance, pyperf and memray (made by `cargo xtask setup`). It runs pyperformance's \
         `bm_NAME/run_benchmark.py` with `pyperf.Runner` replaced by an object that records what \
         `bench_func` and `bench_time_func` are given, then for `round LOOPS TOOL` on stdin runs LOOPS \
         loops (each `bench_func` function LOOPS times; each `bench_time_func` function once as \
         `func(LOOPS, *args)`) and prints the wall time and getrusage's user and system time. \
         xml_etree runs its `process` part only (one loop of all four parts is longer than a round).\n"
    )?;
    writeln!(md, "```\ncargo xtask bench --only production --effort {effort} --tracer-args '{shown_args}'")?;
    let (b, args, _) = plan.benchmarks[0];
    for p in &pythons {
        for cpu in 0..2 {
            writeln!(md, "{}", worker_words(p, cpu, b, args).join(" "))?;
        }
    }
    writeln!(md, "taskset -c CPU {} {shown_args}\n```\n", tracer.display())?;
    writeln!(
        md,
        "One pair of workers per benchmark, with its name in place of {b} (xml_etree: `xml_etree \
         process`); PID and CPU are the traced worker's. A cell \"—\" is a tool that the interpreter \
         has no wheel of. Every round's times are kept in `target/bench/production/VENV-NAME.json`, and \
         tracer's output beside them (`VENV-NAME-B.out` and `.err`, B the block from 0).\n\n\
         Read a tracer figure against the nothing figure in the same row and column: a difference \
         inside the nothing column's spread is not resolved at this load (the load average closes the \
         section). Issue 23's goal for the production profile: 1.01x or below (the geometric mean of \
         the twin figures), within the noise on each benchmark, its extra kernel CPU under its budget, \
         and below every other tool in every row.\n"
    )?;
    write!(md, "{tables}")?;
    writeln!(md, "{}", load.line())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(traced: f64, untraced: f64) -> (Round, Round) {
        (Round { wall: traced, user: traced, system: 0.0 }, Round { wall: untraced, user: untraced, system: 0.0 })
    }

    #[test]
    fn own_estimate_is_the_last_profile_cost_line() {
        let out = "[     1.0s]\n  profile cost ≈3.111% of the target's CPU time (0.96 s of it; budget 1%): rates 3.111%\n\
                   summary\n  profile cost ≈0.703% of the target's CPU time (9.8 s of it; budget 1%): rates 0.703%\n";
        assert_eq!(own_estimate(out), Some(0.007_03));
        assert_eq!(own_estimate("tracer: exact tracing\n"), None);
        assert_eq!(estimate_cell(&[0.007_03, 0.01]), "0.70%, 1.00%");
    }

    #[test]
    fn tracer_args() {
        assert_eq!(parse_tracer_args(DEFAULT_TRACER_ARGS).unwrap(), ["attach", "--pid", "PID"]);
        assert_eq!(
            parse_tracer_args("attach --pid PID --budget 1").unwrap(),
            ["attach", "--pid", "PID", "--budget", "1"]
        );
        assert_eq!(parse_tracer_args("tracer attach --pid PID").unwrap(), ["attach", "--pid", "PID"]);
        assert_eq!(
            parse_tracer_args("attach --pid 12").unwrap_err().to_string(),
            "--tracer-args \"attach --pid 12\" has no PID word; write the target's PID as PID, e.g. \
             --tracer-args 'attach --pid PID'"
        );
        let words = crate::production_procs::tracer_words(
            Path::new("/t"),
            &parse_tracer_args("attach --pid PID").unwrap(),
            42,
            1,
        );
        assert_eq!(words, ["taskset", "-c", "1", "/t", "attach", "--pid", "42"]);
    }

    #[test]
    fn medians() {
        assert!((median(&[3.0, 1.0, 2.0]) - 2.0).abs() < 1e-12);
        assert!((median(&[4.0, 1.0, 3.0, 2.0]) - 2.5).abs() < 1e-12);
    }

    /// The twin figure cancels a constant difference between the CPUs:
    /// orientation 0 reads 1.1 × 1.02, orientation 1 1.02 / 1.1.
    #[test]
    fn twins_cancel_the_cpus() {
        let mut t = Twins::default();
        t.rounds[0] = (0..9).map(|_| pair(1.1 * 1.02, 1.0)).collect();
        t.rounds[1] = (0..9).map(|_| pair(1.02, 1.1)).collect();
        let (m, lo, hi) = t.median();
        assert!((m - 1.02).abs() < 1e-9, "{m}");
        assert!((lo - 1.02).abs() < 1e-9 && (hi - 1.02).abs() < 1e-9);
        assert!((t.total().0 - 1.02).abs() < 1e-9);
    }

    /// A cost paid in 2 rounds of 10 hides from the median and shows in
    /// the total.
    #[test]
    fn duty_cycled_cost() {
        let mut t = Twins::default();
        for o in &mut t.rounds {
            *o = (0..10).map(|i| pair(if i % 5 == 0 { 1.5 } else { 1.0 }, 1.0)).collect();
        }
        assert!((t.median().0 - 1.0).abs() < 1e-9);
        assert!((t.total().0 - 1.1).abs() < 1e-9);
    }

    #[test]
    fn kernel_share_extra() {
        let mut t = Twins::default();
        let traced = Round { wall: 1.0, user: 0.9, system: 0.1 };
        let untraced = Round { wall: 1.0, user: 0.98, system: 0.02 };
        t.rounds = [vec![(traced, untraced)], vec![(traced, untraced)]];
        assert!((t.kernel() - 0.08).abs() < 1e-9);
    }

    #[test]
    fn alternate_rounds() {
        let r = alternate_ratios(&[1.0, 3.0, 2.0, 6.0, 2.0]);
        assert_eq!(r.len(), 2);
        assert!((r[0] - 2.0).abs() < 1e-12 && (r[1] - 3.0).abs() < 1e-12);
        assert!(alternate_ratios(&[1.0]).is_empty());
    }

    #[test]
    fn bootstrap_is_repeatable_and_brackets() {
        let v: Vec<f64> = (0..20).map(|i| 1.0 + f64::from(i) / 100.0).collect();
        let stat = |idx: &[Vec<usize>]| median(&idx[0].iter().map(|&i| v[i]).collect::<Vec<_>>());
        let a = bootstrap(&[v.len()], stat);
        assert_eq!(a, bootstrap(&[v.len()], stat));
        assert!(a.0 <= median(&v) && median(&v) <= a.1 && a.0 < a.1);
    }
}
