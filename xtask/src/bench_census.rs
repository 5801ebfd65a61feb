//! `cargo xtask bench`: issue 23's census speed, `tracer heap` on a heap of
//! about 1 GiB of small objects in each production interpreter: its wall
//! time, its CPU time and its peak resident memory (from `wait4`), against
//! the goals of under 2 s and under 64 MB (the census streams the arenas,
//! it does not copy the heap); and what censuses taken back to back cost a
//! busy target's loop (the target on one CPU, tracer on the other,
//! alternating phases with and without).

use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader},
    os::unix::process::CommandExt as _,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
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

/// A busy target over a heap of `pairs` pairs: rounds of 200 JSON round
/// trips, each printed as its end on `CLOCK_MONOTONIC` and its length.
fn busy_script(pairs: u64) -> String {
    format!(
        "import json, time\ndata = [(i, float(i)) for i in range({pairs})]\nd = {{'a': list(range(100)), 'b': 'x' * 100}}\nprint('ready', flush=True)\nwhile True:\n    t0 = time.monotonic()\n    for _ in range(200):\n        json.loads(json.dumps(d))\n    t1 = time.monotonic()\n    print(f'{{t1:.6f}} {{t1 - t0:.6f}}', flush=True)\n"
    )
}

/// The busy target's heap: a quarter of the speed test's, so that a
/// census takes a fraction of a second and a phase holds several.
const BUSY_PAIRS: u64 = PAIRS / 4;

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
    let (cpu, rss_kib) = wait_rusage(&mut child)?;
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

/// Pins the command's process to `cpu`.
fn pinned(cmd: &mut Command, cpu: usize) -> &mut Command {
    // SAFETY: runs in the child between fork and exec; sched_setaffinity
    // is async-signal-safe, and the set is a local of plain integers.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// `CLOCK_MONOTONIC` now, in seconds: Python's `time.monotonic()`.
fn monotonic() -> f64 {
    // SAFETY: timespec is plain integers; the call only writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    #[allow(clippy::cast_precision_loss, reason = "seconds of uptime")]
    let s = ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9;
    s
}

/// The busy target's loop with censuses back to back against without:
/// `pairs` phases of `phase` each way, alternating. The median of the
/// pairs' ratios of median round lengths, the censuses taken, and the
/// rounds measured.
fn loop_cost(
    tracer: &std::path::Path,
    p: &BenchPython,
    pairs: usize,
    phase: Duration,
) -> anyhow::Result<(f64, usize, usize)> {
    let mut cmd = p.command(&p.base);
    cmd.args(["-c", &busy_script(BUSY_PAIRS)]).stdin(Stdio::null()).stdout(Stdio::piped());
    let mut target = pinned(&mut cmd, 0).spawn().with_context(|| format!("starting {}", p.name))?;
    let rounds: Arc<Mutex<Vec<(f64, f64)>>> = Arc::default();
    let result = (|| {
        let mut out = BufReader::new(target.stdout.take().context("stdout")?);
        let mut line = String::new();
        out.read_line(&mut line)?;
        anyhow::ensure!(line.trim() == "ready", "{} did not build its heap: {line:?}", p.name);
        let sink = Arc::clone(&rounds);
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let mut it = line.split(' ').map(str::parse::<f64>);
                if let (Some(Ok(end)), Some(Ok(len))) = (it.next(), it.next()) {
                    sink.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((end, len));
                }
            }
        });
        // Warm-up: the loop's first rounds.
        std::thread::sleep(Duration::from_secs(1));
        let mut phases = Vec::new();
        let mut censuses = 0;
        for i in 0..pairs * 2 {
            // ABBA: with censuses in phases 1 and 2 of each four.
            let with = matches!(i % 4, 1 | 2);
            let start = monotonic();
            let until = Instant::now() + phase;
            if with {
                while Instant::now() < until {
                    let status =
                        pinned(Command::new(tracer).args(["heap", "--pid", &target.id().to_string(), "--json"]), 1)
                            .stdout(Stdio::null())
                            .stderr(Stdio::null())
                            .status()
                            .context("running tracer heap")?;
                    anyhow::ensure!(status.success(), "tracer heap failed: {status}");
                    censuses += 1;
                }
            } else {
                std::thread::sleep(phase);
            }
            phases.push((with, start, monotonic()));
        }
        Ok((phases, censuses))
    })();
    let _ = target.kill();
    let _ = target.wait();
    let (phases, censuses) = result?;
    let rounds = rounds.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
    // A round counts in the phase it ran wholly inside.
    let in_phase = |(start, end): (f64, f64)| {
        median(rounds.iter().filter(|(e, l)| *e - *l >= start && *e <= end).map(|(_, l)| *l).collect())
    };
    let medians: Vec<(bool, f64)> = phases.iter().map(|(with, s, e)| (*with, in_phase((*s, *e)))).collect();
    let ratios: Vec<f64> = medians
        .chunks(2)
        .filter_map(|pair| match pair {
            [(true, w), (false, wo)] | [(false, wo), (true, w)] => Some(w / wo),
            _ => None,
        })
        .collect();
    anyhow::ensure!(
        !ratios.is_empty() && ratios.iter().all(|r| r.is_finite()),
        "no round fell inside a phase: {medians:?}"
    );
    Ok((median(ratios), censuses, rounds.len()))
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
    let (pairs, phase) = match effort {
        "fast" => (4, Duration::from_secs(2)),
        "rigorous" => (20, Duration::from_secs(4)),
        _ => (10, Duration::from_secs(3)),
    };
    writeln!(
        md,
        "What censuses cost a busy target: each interpreter builds a quarter of that heap ({BUSY_PAIRS} pairs) and then runs rounds of 200 `json.loads(json.dumps(d))`, pinned to CPU 0, timing each round; tracer runs `tracer heap` back to back, pinned to CPU 1, in alternate phases of {} s ({pairs} pairs, ordered ABBA), far more often than the profile's budget allows. The figure is the median over the pairs of (median round with censuses / median round without): what reading the heap from outside costs the target through the memory system alone.\n",
        phase.as_secs()
    )?;
    writeln!(md, "| interpreter | loop with censuses back to back / without | censuses | rounds |\n|---|---|---|---|")?;
    for p in pythons() {
        eprintln!("xtask: the census's cost to a busy loop on {}", p.name);
        let (ratio, censuses, rounds) = loop_cost(tracer, &p, pairs, phase)?;
        writeln!(md, "| {} | {ratio:.3}x | {censuses} | {rounds} |", p.name)?;
    }
    writeln!(md)?;
    Ok(())
}

/// Waits for the child and returns its CPU time and peak RSS (KiB), from
/// `wait4`.
pub fn wait_rusage(child: &mut std::process::Child) -> anyhow::Result<(Duration, i64)> {
    let pid = libc::pid_t::try_from(child.id())?;
    let mut status = 0;
    // SAFETY: rusage is plain integers; all-zero is valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our unreaped child; status and usage are valid for writes.
    let rc = unsafe { libc::wait4(pid, &raw mut status, 0, &raw mut usage) };
    if rc != pid {
        anyhow::bail!("wait4 failed: {}", std::io::Error::last_os_error());
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    Ok((tv(usage.ru_utime) + tv(usage.ru_stime), usage.ru_maxrss))
}
