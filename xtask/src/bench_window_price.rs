//! `cargo xtask bench`: what the profile's windows cost the target, against
//! what tracer prices them at. A window's hits are traps the kernel
//! handles on the target's threads, so they show in its kernel CPU time;
//! so would writing the breakpoints into its code and out again, which no
//! hit count shows. The target is the demo workload on Debian's LTO 3.11
//! (about 1,400 breakpoints a window); its kernel time with nothing
//! attached and under `tracer attach --budget B`, in alternate spans, is
//! set against tracer's own figures for the same run.

use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use serde_json::Value;

/// Debian 12's interpreter: LTO-built, its allocators inlined into
/// hundreds of copies, each a breakpoint of a window.
const PYTHON: &str = "/usr/bin/python3.11";

/// One span's measure: its wall time and the target's kernel CPU time.
#[derive(Clone, Copy, Debug)]
struct Span {
    wall: f64,
    kernel: f64,
}

/// One traced span, with what tracer said of it.
struct Traced {
    span: Span,
    /// The run's hits priced where each sits (`cost.tracer_cpu_s`).
    hits_priced: f64,
    /// What the budget charged the windows (`budget.estimated_overhead_fraction`
    /// of `budget.target_cpu_s`).
    windows_charged: f64,
    windows: u64,
    hits: u64,
}

/// The target's kernel CPU time so far, in seconds.
fn kernel_s(pid: u32) -> anyhow::Result<f64> {
    Ok(crate::procstat::cpu_times(pid)?.1)
}

fn span(pid: u32, work: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<Span> {
    let (k0, t0) = (kernel_s(pid)?, Instant::now());
    work()?;
    let (k1, t1) = (kernel_s(pid)?, Instant::now());
    Ok(Span { wall: (t1 - t0).as_secs_f64(), kernel: k1 - k0 })
}

fn traced(tracer: &Path, pid: u32, budget: u32, seconds: u32) -> anyhow::Result<Traced> {
    let mut summary = Value::Null;
    let span = span(pid, || {
        let out = Command::new(tracer)
            .args(["attach", "--pid", &pid.to_string(), "--budget", &budget.to_string()])
            .args(["--duration", &seconds.to_string(), "--interval", "3600", "--json"])
            .stderr(Stdio::null())
            .output()
            .context("running tracer attach")?;
        anyhow::ensure!(out.status.success(), "tracer attach failed: {}", out.status);
        let text = String::from_utf8_lossy(&out.stdout);
        summary = serde_json::from_str(text.lines().last().context("tracer printed nothing")?)?;
        Ok(())
    })?;
    let number = |v: &Value, what: &str| v.as_f64().with_context(|| format!("{what} in {summary}"));
    let budget = &summary["budget"];
    Ok(Traced {
        span,
        hits_priced: number(&summary["cost"]["tracer_cpu_s"], "cost.tracer_cpu_s")?,
        windows_charged: number(&budget["estimated_overhead_fraction"], "the budget's fraction")?
            * number(&budget["target_cpu_s"], "the budget's target_cpu_s")?,
        windows: budget["windows"].as_u64().context("budget.windows")?,
        hits: summary["cost"]["hits"].as_u64().context("cost.hits")?,
    })
}

/// What the budget charged a window, on average (the first, the attach's,
/// among them).
#[allow(clippy::cast_precision_loss, reason = "a window count")]
fn per_window(t: &Traced) -> f64 {
    if t.windows == 0 { 0.0 } else { t.windows_charged / t.windows as f64 }
}

/// Per budget: each round's untraced span and traced one, in alternate
/// order.
fn rounds(
    tracer: &Path,
    pid: u32,
    budgets: &[u32],
    (rounds, seconds): (u32, u32),
) -> anyhow::Result<Vec<Vec<(Span, Traced)>>> {
    let mut all = Vec::new();
    for &budget in budgets {
        let mut these = Vec::new();
        for round in 0..rounds {
            eprintln!("xtask: the windows' price, --budget {budget}, round {} of {rounds}", round + 1);
            let untraced = || {
                span(pid, || {
                    std::thread::sleep(Duration::from_secs(u64::from(seconds)));
                    Ok(())
                })
            };
            let pair = if round % 2 == 0 {
                let u = untraced()?;
                (u, traced(tracer, pid, budget, seconds)?)
            } else {
                let t = traced(tracer, pid, budget, seconds)?;
                (untraced()?, t)
            };
            these.push(pair);
        }
        all.push(these);
    }
    Ok(all)
}

/// The windows' price against the target's extra kernel time.
pub fn window_price_section(md: &mut String, root: &Path, tracer: &Path, effort: &str) -> anyhow::Result<()> {
    let (n, seconds) = if effort == "fast" { (2, 20) } else { (4, 30) };
    let budgets = [5, 20];
    let workload = root.join("demo").join("workload.py");
    let mut target = Command::new(PYTHON)
        .arg(&workload)
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {PYTHON} {}", workload.display()))?;
    let measured = (|| {
        let mut out = BufReader::new(target.stdout.take().context("stdout")?);
        let mut line = String::new();
        out.read_line(&mut line)?;
        anyhow::ensure!(line.trim() == "ready", "the demo workload printed {line:?}");
        rounds(tracer, target.id(), &budgets, (n, seconds))
    })();
    let _ = target.kill();
    let _ = target.wait();
    let measured = measured?;
    writeln!(md, "## The windows' price against the target's kernel time\n")?;
    writeln!(
        md,
        "The demo workload (demo/workload.py) on Debian's LTO 3.11, about 1,400 breakpoints a window. Each round is a span of {seconds} s with nothing attached and a run of the command below (its preparation, {seconds} s of windows, its detach), in alternate order. A window's hits are traps the kernel handles on the target's thread, and so is writing its breakpoints in and out: both show in the target's kernel CPU time (`/proc/PID/stat`, clock ticks). Extra kernel = the traced span's less the untraced span's per second times the traced span's length. Hits priced = `cost.tracer_cpu_s`, each hit at what a hit costs where it sits (docs/cost.md); charged = what the budget charged the windows (`budget.estimated_overhead_fraction` of `budget.target_cpu_s`), with each window's breakpoint writes (docs/budget.md), and a window's average of it (the first among them). PID is the workload's.\n"
    )?;
    writeln!(md, "```\nsudo tracer attach --pid PID --budget B --duration {seconds} --interval 3600 --json\n```\n")?;
    writeln!(
        md,
        "| budget | round | windows | hits | kernel untraced (s/s) | extra kernel | hits priced | extra / priced | charged | charged a window | extra / charged |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )?;
    for (budget, these) in budgets.iter().zip(&measured) {
        let (mut extra_sum, mut priced_sum, mut charged_sum) = (0.0, 0.0, 0.0);
        for (i, (u, t)) in these.iter().enumerate() {
            let rate = u.kernel / u.wall;
            let extra = t.span.kernel - rate * t.span.wall;
            extra_sum += extra;
            priced_sum += t.hits_priced;
            charged_sum += t.windows_charged;
            writeln!(
                md,
                "| {budget}% | {} | {} | {} | {rate:.4} | {extra:.3} s | {:.3} s | {:.2} | {:.3} s | {:.1} ms | {:.2} |",
                i + 1,
                t.windows,
                t.hits,
                t.hits_priced,
                extra / t.hits_priced,
                t.windows_charged,
                per_window(t) * 1e3,
                extra / t.windows_charged
            )?;
        }
        writeln!(
            md,
            "| {budget}% | all | | | | {extra_sum:.3} s | {priced_sum:.3} s | **{:.2}** | {charged_sum:.3} s | | **{:.2}** |",
            extra_sum / priced_sum,
            extra_sum / charged_sum
        )?;
    }
    writeln!(
        md,
        "\nextra / priced near 1 says the windows cost the target what their hits are priced at, and nothing the count misses; extra / charged at most 1 says the budget charged the windows at least what they cost the target's kernel time. The clock ticks are 10 ms, so each span's figure is within 0.02 s.\n"
    )?;
    Ok(())
}
