//! `cargo xtask bench`: `--budget 1` estimates against the rates of one
//! busy process untraced: its loop's pace with nothing attached, times the
//! calls per iteration a full count gives.

use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader},
    path::Path,
    process::{ChildStdout, Command, Stdio},
    time::Duration,
};

use anyhow::Context as _;
use serde_json::Value;

/// A process running the JSON round trip forever, for `budget_accuracy`;
/// at SIGUSR1 it prints "n N S": N iterations so far at S on the
/// monotonic clock.
const BUSY_JSON: &str = "import json, signal, time\nd = {'a': 1, 'b': [1, 2, 3], 'c': 'text'}\nn = 0\ndef tell(*_):\n    print('n', n, time.monotonic(), flush=True)\nsignal.signal(signal.SIGUSR1, tell)\nprint('ready', flush=True)\nwhile True:\n    json.loads(json.dumps(d))\n    n += 1\n";

/// Per probe: name, calls (a full count's) or calls/s (an estimate's), and
/// the 95% interval of an estimate (its upper end infinite where it has
/// none).
type Rates = Vec<(String, f64, Option<(f64, f64)>)>;

/// One `tracer attach --json` run's per-probe figures and its
/// `budget.slowdown`.
fn attach_rates(tracer: &Path, args: &[&str]) -> anyhow::Result<(Rates, Value)> {
    let out = Command::new(tracer).args(args).stderr(Stdio::null()).output().context("running tracer attach")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let summary: Value = serde_json::from_str(text.lines().last().context("tracer printed nothing")?)?;
    let probes = summary["probes"].as_object().context("probes")?;
    let rates = probes
        .iter()
        .map(|(name, p)| {
            let e = &p["estimate"];
            if e.is_null() {
                #[allow(clippy::cast_precision_loss, reason = "a count of calls")]
                let calls = p["calls"].as_u64().unwrap_or(0) as f64;
                (name.clone(), calls, None)
            } else {
                let ci = e["calls_per_s_ci95"]
                    .as_array()
                    .and_then(|a| Some((a.first()?.as_f64()?, a.get(1)?.as_f64().unwrap_or(f64::INFINITY))));
                (name.clone(), e["calls_per_s"].as_f64().unwrap_or(f64::NAN), ci)
            }
        })
        .collect();
    Ok((rates, summary["budget"]["slowdown"].clone()))
}

/// The busy loop's iterations so far and when, by its SIGUSR1 reply.
fn tally(pid: u32, out: &mut BufReader<ChildStdout>) -> anyhow::Result<(f64, f64)> {
    let status = Command::new("kill").args(["-USR1", &pid.to_string()]).status().context("running kill")?;
    anyhow::ensure!(status.success(), "kill -USR1 {pid} failed");
    let mut line = String::new();
    out.read_line(&mut line)?;
    let fields: Vec<&str> = line.split_whitespace().collect();
    anyhow::ensure!(fields.len() == 3 && fields[0] == "n", "the busy loop replied {line:?}");
    Ok((fields[1].parse()?, fields[2].parse()?))
}

/// What two rounds measured: the loop's untraced pace (iterations/s), the
/// full counts' calls per iteration, and the budget runs' estimates and
/// slowdowns.
struct Rounds {
    paces: Vec<f64>,
    per_iteration: Vec<Rates>,
    budgets: Vec<(Rates, Value)>,
}

fn rounds(tracer: &Path, pid: u32, out: &mut BufReader<ChildStdout>) -> anyhow::Result<Rounds> {
    let pid_s = pid.to_string();
    let full = ["attach", "--exact", "--pid", &pid_s, "--json", "--interval", "3600", "--duration", "10"];
    let budget =
        ["attach", "--exact", "--pid", &pid_s, "--json", "--interval", "3600", "--duration", "60", "--budget", "1"];
    let mut r = Rounds { paces: Vec::new(), per_iteration: Vec::new(), budgets: Vec::new() };
    for round in 1..=2 {
        eprintln!("xtask: budget accuracy, round {round}: the loop's pace untraced");
        let a = tally(pid, out)?;
        std::thread::sleep(Duration::from_secs(5));
        let b = tally(pid, out)?;
        r.paces.push((b.0 - a.0) / (b.1 - a.1));
        eprintln!("xtask: budget accuracy, round {round}: full");
        let a = tally(pid, out)?;
        let (counts, _) = attach_rates(tracer, &full)?;
        let b = tally(pid, out)?;
        let iterations = (b.0 - a.0).max(1.0);
        r.per_iteration.push(counts.into_iter().map(|(name, calls, _)| (name, calls / iterations, None)).collect());
        eprintln!("xtask: budget accuracy, round {round}: budget");
        r.budgets.push(attach_rates(tracer, &budget)?);
    }
    Ok(r)
}

/// `--budget 1` estimates against the untraced rates of one busy process:
/// two rounds of its pace with nothing attached, a full count, and a
/// `--budget 1` run.
pub fn budget_accuracy(md: &mut String, tracer: &Path) -> anyhow::Result<()> {
    let python = crate::real_python3()?;
    let mut busy = Command::new(&python)
        .args(["-c", BUSY_JSON])
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the busy JSON loop")?;
    let result = (|| -> anyhow::Result<Rounds> {
        let mut out = BufReader::new(busy.stdout.take().context("stdout")?);
        let mut line = String::new();
        out.read_line(&mut line)?;
        rounds(tracer, busy.id(), &mut out)
    })();
    let _ = busy.kill();
    let _ = busy.wait();
    let r = result?;
    writeln!(md, "## `--budget 1` estimates against the untraced rates\n")?;
    writeln!(
        md,
        "One process runs `json.loads(json.dumps(d))` in a loop and counts its iterations. Twice: its pace over 5 s with nothing attached, a full count (which gives each probe's calls per iteration), then `--budget 1`. PID is that process.\n"
    )?;
    writeln!(
        md,
        "```\nsudo tracer attach --exact --pid PID --json --interval 3600 --duration 10\nsudo tracer attach --exact --pid PID --json --interval 3600 --duration 60 --budget 1\n```\n"
    )?;
    let pace = r.paces.iter().sum::<f64>() / 2.0;
    writeln!(
        md,
        "Untraced rate = calls per iteration (mean of the full counts) x the loop's untraced pace ({:.0} and {:.0} iterations/s; mean {pace:.0}). The estimates are taken back to the target's pace by `budget.slowdown` ([docs/budget.md](docs/budget.md)); `≥` marks an interval with no upper end (the rates are lower bounds). Difference = estimate vs the untraced rate.\n",
        r.paces[0], r.paces[1]
    )?;
    writeln!(
        md,
        "| probe | calls per iteration | untraced calls/s | budget 1 (95%) | budget 2 (95%) | differences | untraced rate in both intervals |\n|---|---|---|---|---|---|---|"
    )?;
    let mut worst: Option<(f64, String)> = None;
    for (i, (name, _, _)) in r.per_iteration[0].iter().enumerate() {
        let per_iteration = f64::midpoint(r.per_iteration[0][i].1, r.per_iteration[1][i].1);
        let untraced = per_iteration * pace;
        if untraced <= 0.0 {
            continue;
        }
        let runs = [&r.budgets[0].0[i], &r.budgets[1].0[i]];
        let est = |e: &(String, f64, Option<(f64, f64)>)| match e.2 {
            Some((lo, hi)) if hi.is_finite() => format!("{:.0} ({lo:.0}-{hi:.0})", e.1),
            Some((lo, _)) => format!("{:.0} (≥{lo:.0})", e.1),
            None => format!("{:.0} (?)", e.1),
        };
        let diff = |e: &(String, f64, Option<(f64, f64)>)| format!("{:+.1}%", (e.1 / untraced - 1.0) * 100.0);
        let held = runs.iter().all(|e| e.2.is_some_and(|(lo, hi)| lo <= untraced && untraced <= hi));
        writeln!(
            md,
            "| `{name}` | {per_iteration:.3} | {untraced:.0} | {} | {} | {}, {} | {} |",
            est(runs[0]),
            est(runs[1]),
            diff(runs[0]),
            diff(runs[1]),
            if held { "yes" } else { "no" }
        )?;
        for e in runs {
            let d = (e.1 / untraced - 1.0) * 100.0;
            if worst.as_ref().is_none_or(|(w, _)| d.abs() > w.abs()) {
                worst = Some((d, name.clone()));
            }
        }
    }
    writeln!(md)?;
    for (round, (_, slowdown)) in r.budgets.iter().enumerate() {
        writeln!(md, "Budget run {}: `slowdown` {slowdown}.", round + 1)?;
    }
    if let Some((d, name)) = worst {
        writeln!(md, "\nThe largest difference is {d:+.1}% (`{name}`).")?;
    }
    writeln!(md)?;
    Ok(())
}
