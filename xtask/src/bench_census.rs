//! `cargo xtask bench`: issue 23's census speed, `tracer heap` on a heap of
//! about 1 GiB of small objects in each production interpreter: its wall
//! time, its CPU time and its peak resident memory (from `wait4`), against
//! the goals of under 2 s and under 64 MB (the census streams the arenas,
//! it does not copy the heap).

use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use serde_json::Value;

use crate::bench_venvs::{BenchPython, pythons};

/// Pairs of an int and a float in a list: a 64-byte tuple block, two
/// 32-byte blocks and a list slot each, 1.15 GiB of pymalloc's blocks for
/// 9 million.
const PAIRS: u64 = 9_000_000;

/// The target: builds the heap, says so, and waits on stdin.
fn target_script(pairs: u64) -> String {
    format!(
        "import sys\ndata = [(i, float(i)) for i in range({pairs})]\nprint('ready', flush=True)\nsys.stdin.read()\n"
    )
}

/// The goals, from the issue.
const GOAL_WALL: Duration = Duration::from_secs(2);
const GOAL_RSS_MIB: f64 = 64.0;

/// One `tracer heap` run.
struct Census {
    wall: Duration,
    cpu: Duration,
    rss_kib: i64,
    json: Value,
}

/// Runs `tracer heap --pid PID --json` once.
fn census(tracer: &std::path::Path, pid: u32) -> anyhow::Result<Census> {
    let started = Instant::now();
    let mut child = std::process::Command::new(tracer)
        .args(["heap", "--pid", &pid.to_string(), "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting tracer heap")?;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().context("stdout")?, &mut out)?;
    let (cpu, rss_kib) = crate::bench::wait_rusage(&mut child)?;
    let wall = started.elapsed();
    let json: Value = serde_json::from_str(&out).with_context(|| format!("tracer heap printed no JSON: {out}"))?;
    Ok(Census { wall, cpu, rss_kib, json })
}

/// The censuses of one interpreter's 1 GiB heap: `runs` of them.
fn measure(tracer: &std::path::Path, p: &BenchPython, runs: usize) -> anyhow::Result<Vec<Census>> {
    let mut target = p
        .command(&p.base)
        .args(["-c", &target_script(PAIRS)])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", p.name))?;
    let result = (|| {
        let mut line = String::new();
        BufReader::new(target.stdout.take().context("stdout")?).read_line(&mut line)?;
        anyhow::ensure!(line.trim() == "ready", "{} did not build its heap: {line:?}", p.name);
        (0..runs).map(|_| census(tracer, target.id())).collect::<anyhow::Result<Vec<_>>>()
    })();
    let _ = target.kill();
    let _ = target.wait();
    result
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The section, for every production interpreter.
pub fn census_section(md: &mut String, tracer: &std::path::Path, effort: &str) -> anyhow::Result<()> {
    let runs = match effort {
        "fast" => 1,
        "rigorous" => 5,
        _ => 3,
    };
    writeln!(md, "## Census speed: `tracer heap` on a 1 GiB heap of small objects\n")?;
    writeln!(
        md,
        "Each interpreter builds `[(i, float(i)) for i in range({PAIRS})]` (a tuple, an int and a float each: about 1.15 GiB of pymalloc's blocks) and waits; then `tracer heap --pid PID --json` runs {runs} time(s) against it, alone on the machine, its wall time, CPU time and peak resident memory taken by `wait4`. The goal (issue 23): under {} s and under {GOAL_RSS_MIB} MB. The median of the runs is shown; the census's own figures (bytes read, objects) are the last run's.\n",
        GOAL_WALL.as_secs()
    )?;
    writeln!(md, "```\ncargo xtask bench --only census --effort {effort}\n```\n")?;
    writeln!(
        md,
        "| interpreter | pools read | objects classified | wall | tracer CPU | peak RSS | goal met |\n|---|---|---|---|---|---|---|"
    )?;
    for p in pythons() {
        eprintln!("xtask: census speed on {}", p.name);
        let runs = measure(tracer, &p, runs)?;
        let last = &runs.last().context("no run")?.json;
        let pools = last["pymalloc"]["pools"].as_u64().context("pymalloc.pools")?;
        let objects = last["pymalloc"]["objects"].as_u64().context("pymalloc.objects")?;
        let wall = median(runs.iter().map(|c| c.wall.as_secs_f64()).collect());
        let cpu = median(runs.iter().map(|c| c.cpu.as_secs_f64()).collect());
        #[allow(clippy::cast_precision_loss, reason = "KiB as MiB")]
        let rss = median(runs.iter().map(|c| c.rss_kib as f64 / 1024.0).collect());
        let met = wall < GOAL_WALL.as_secs_f64() && rss < GOAL_RSS_MIB;
        #[allow(clippy::cast_precision_loss, reason = "GiB shown")]
        let gib = (pools * 16384) as f64 / f64::from(1u32 << 30);
        writeln!(
            md,
            "| {} | {pools} ({gib:.2} GiB) | {objects} | {wall:.2} s | {cpu:.2} s | {rss:.1} MiB | {} |",
            p.name,
            if met { "yes" } else { "**no**" }
        )?;
    }
    writeln!(md)?;
    Ok(())
}
