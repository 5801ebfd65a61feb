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
use serde_json::Value;

/// Timing rounds per case, each untraced then traced.
const ROUNDS: usize = 2;

/// The timing loop run in the target: the best of seven repeats, per loop,
/// in ns, of as many loops as fill 0.2 s untraced (`timeit`'s autorange);
/// traced, a twentieth of that, since tracing may slow it a hundredfold.
const TIMER: &str = "import sys, timeit\n\
t = timeit.Timer(sys.argv[2], sys.argv[1])\n\
n = int(sys.argv[3]) if len(sys.argv) > 3 else t.autorange()[0]\n\
print(n, min(t.repeat(7, n)) / n * 1e9)\n";

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
    let cases = [
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
         `timeit` loop (the best of 7 repeats) runs untraced and then under `tracer attach --exe PYTHON \
         --json --interval 1`, {ROUNDS} rounds alternating, and the summary's estimate is set against the \
         slowdown measured. Where a probe's sites are of both kinds the estimate is a range \
         (`overhead_fraction_low` prices every site emulated).\n"
    )?;
    writeln!(md, "| case | untraced | traced | measured slowdown | tracer's estimate f | predicted 1/(1 − f) |")?;
    writeln!(md, "|---|---|---|---|---|---|")?;
    let mut commands = Vec::new();
    for case in &cases {
        let (mut base, mut under) = (Vec::new(), Vec::new());
        let mut loops = None;
        for _ in 0..ROUNDS {
            let (n, ns) = time(case, loops)?;
            loops = Some(n);
            base.push(ns);
            under.push(traced_round(tracer, case, (n / 20).max(1), &mut commands)?);
        }
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
    writeln!(md, "\nCommands (the traced half of each round; the untraced half runs the same loop alone):\n")?;
    writeln!(md, "```")?;
    for c in commands.iter().step_by(ROUNDS) {
        writeln!(md, "{c}")?;
    }
    writeln!(md, "```\n")?;
    Ok(())
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

/// Runs the timing loop; returns its loop count and ns per loop.
fn time(case: &Case<'_>, loops: Option<u64>) -> anyhow::Result<(u64, f64)> {
    let mut cmd = Command::new(case.python);
    cmd.args(["-c", TIMER, case.setup, case.stmt]);
    if let Some(n) = loops {
        cmd.arg(n.to_string());
    }
    let out = cmd.output().with_context(|| format!("running {}", case.python.display()))?;
    if !out.status.success() {
        bail!("the timing loop failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text.split_whitespace();
    let n = parts.next().and_then(|n| n.parse().ok()).context("the timing loop's count")?;
    let ns = parts.next().and_then(|n| n.parse().ok()).context("the timing loop's time")?;
    Ok((n, ns))
}

/// One traced half: tracer attached to every process of the interpreter,
/// the loop run `loops` times, tracer stopped, its summary's estimate read.
fn traced_round(tracer: &Path, case: &Case<'_>, loops: u64, commands: &mut Vec<String>) -> anyhow::Result<Traced> {
    let exe = std::fs::canonicalize(case.python).with_context(|| format!("resolving {}", case.python.display()))?;
    let exe = exe.to_str().context("a UTF-8 path")?;
    let mut args = vec!["attach", "--exe", exe, "--json", "--interval", "1"];
    args.extend_from_slice(case.flags);
    commands.push(format!("sudo {} {}", tracer.display(), args.join(" ")));
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
    let timed = time(case, Some(loops));
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
    let (_, ns) = timed?;
    let summary = summary.context("tracer wrote no summary")?;
    let cost = &summary["cost"];
    let fraction = cost["overhead_fraction"].as_f64().with_context(|| format!("no cost in the summary: {summary}"))?;
    Ok(Traced { ns, fraction, low: cost["overhead_fraction_low"].as_f64() })
}
