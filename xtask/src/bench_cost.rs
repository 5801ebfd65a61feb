//! `cargo xtask bench`: tracer's own estimate of what it costs the target
//! (`cost.overhead_fraction`, shown while it runs) against the slowdown a
//! timing loop in the target really sees, side by side in one run.

use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

use crate::lto::Harness;
use serde_json::Value;

/// Timing rounds per case, each untraced then traced.
const ROUNDS: usize = 2;

/// Seven timings per half round; the best counts, as timeit's does.
const REPEATS: usize = 7;

/// One case: an interpreter, a statement, tracer's flags.
struct Case<'a> {
    what: &'a str,
    python: &'a Path,
    setup: &'a str,
    stmt: &'a str,
    flags: &'a [&'a str],
}

/// What one traced round gave.
struct Traced {
    ns: f64,
    fraction: f64,
    low: Option<f64>,
}

pub fn cost_section(md: &mut String, tracer: &Path) -> anyhow::Result<()> {
    let pyenv = crate::setup::pyperf_venv().join("bin").join("python");
    let debian = crate::setup::static_pyperf_venv().join("bin").join("python");
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
    writeln!(md, "## The cost tracer shows while it runs, against the slowdown measured\n")?;
    writeln!(
        md,
        "Every interval and the summary carry `cost.overhead_fraction`: hits times the calibrated CPU cost of \
         a hit where each sits, as a share of the target's CPU time (README, `tracer attach`). A share f of \
         the target's CPU spent in probes predicts a CPU-bound loop to run 1/(1 − f) times slower. Here a \
         timing loop in one long-lived process (xtask's harness; the best of {REPEATS} timings of \
         about 20 ms each untraced) runs untraced and then under `tracer attach --pid PID --json`, \
         {ROUNDS} rounds alternating, and the summary's estimate is set against the \
         slowdown measured. Where a probe's sites are of both kinds the estimate is a range \
         (`overhead_fraction_low` prices every site emulated). Near a share of 1 the prediction is \
         ill-conditioned (the share is capped at 1): there the estimate says that nearly all of the \
         target's CPU goes to probes, and tracer warns past 10%, pointing to `--budget`.\n"
    )?;
    writeln!(md, "| case | untraced | traced | measured slowdown | tracer's estimate f | predicted 1/(1 − f) |")?;
    writeln!(md, "|---|---|---|---|---|---|")?;
    crate::lto::install_harness()?;
    let mut commands = Vec::new();
    for case in &cases {
        let python = case.python.to_str().context("a UTF-8 path")?;
        let mut target = Harness::start(None, python, case.setup, case.stmt, false)?;
        // As many loops as take about 20 ms untraced.
        let mut loops = 1u64;
        while target.time(loops)? * 1e9 * f64::from(u32::try_from(loops).unwrap_or(u32::MAX)) < 20e6 {
            loops *= 2;
        }
        let (mut base, mut under) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            base.push(best(&mut target, loops)?);
            under.push(traced_round(tracer, case, &mut target, loops, &mut commands)?);
        }
        drop(target);
        let base_ns = mean(&base);
        let traced_ns = mean(&under.iter().map(|t| t.ns).collect::<Vec<_>>());
        let f = mean(&under.iter().map(|t| t.fraction).collect::<Vec<_>>());
        let lows: Vec<f64> = under.iter().filter_map(|t| t.low).collect();
        let (estimate, predicted) = if lows.len() == under.len() {
            let low = mean(&lows);
            (format!("{:.0}%–{:.0}%", low * 100.0, f * 100.0), format!("{}–{}", slowdown(low), slowdown(f)))
        } else {
            (format!("{:.1}%", f * 100.0), slowdown(f))
        };
        writeln!(
            md,
            "| {} | {:.1} ns | {:.1} ns | {:.2}x | {estimate} | {predicted} |",
            case.what,
            base_ns,
            traced_ns,
            traced_ns / base_ns
        )?;
    }
    writeln!(md, "\nCommands (the traced half of each round; PID is the harness's):\n")?;
    writeln!(md, "```")?;
    for c in commands.iter().step_by(ROUNDS) {
        writeln!(md, "{c}")?;
    }
    writeln!(md, "```\n")?;
    Ok(())
}

/// The best of [`REPEATS`] timings of `loops` loops, in ns per loop.
fn best(target: &mut Harness, loops: u64) -> anyhow::Result<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..REPEATS {
        best = best.min(target.time(loops)? * 1e9);
    }
    Ok(best)
}

/// The predicted slowdown for a share `f` of the target's CPU in probes.
fn slowdown(f: f64) -> String {
    if f >= 0.999 { "over 1000x".to_owned() } else { format!("{:.2}x", 1.0 / (1.0 - f)) }
}

fn mean(v: &[f64]) -> f64 {
    #[allow(clippy::cast_precision_loss, reason = "a handful of rounds")]
    let n = v.len().max(1) as f64;
    v.iter().sum::<f64>() / n
}

/// One traced half: tracer attached to the harness, the loop timed,
/// tracer stopped, its summary's estimate read.
fn traced_round(
    tracer: &Path,
    case: &Case<'_>,
    target: &mut Harness,
    loops: u64,
    commands: &mut Vec<String>,
) -> anyhow::Result<Traced> {
    let pid = target.pid().to_string();
    let mut args = vec!["attach", "--pid", &pid, "--json", "--interval", "3600"];
    args.extend_from_slice(case.flags);
    commands.push(format!("sudo {} {}", tracer.display(), args.join(" ").replace(&pid, "PID")));
    let mut child = Command::new(tracer)
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting tracer attach")?;
    let stdout = child.stdout.take().context("tracer's stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let first = lines.next().context("tracer printed nothing")??;
    if !first.contains("\"attached\"") {
        bail!("tracer did not attach: {first}");
    }
    let timed = best(target, loops);
    // SAFETY: kill(2) with the PID of the child just started, still ours.
    unsafe {
        libc::kill(i32::try_from(child.id()).context("a PID")?, libc::SIGINT);
    }
    let mut summary = None;
    for line in lines {
        let line = line?;
        let value: Value = serde_json::from_str(&line).with_context(|| format!("tracer's JSON: {line}"))?;
        if value["type"] == "summary" {
            summary = Some(value);
        }
    }
    child.wait()?;
    let ns = timed?;
    let summary = summary.context("tracer wrote no summary")?;
    let cost = &summary["cost"];
    let fraction =
        cost["overhead_fraction"].as_f64().with_context(|| format!("no share in the summary's cost: {summary}"))?;
    Ok(Traced { ns, fraction, low: cost["overhead_fraction_low"].as_f64() })
}
