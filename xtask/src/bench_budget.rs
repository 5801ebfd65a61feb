//! `cargo xtask bench`: `--budget 1` estimates against full counts of one
//! busy process.

use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Command, Stdio},
};

use anyhow::Context as _;
use serde_json::Value;

/// A process running the JSON round trip forever, for `budget_accuracy`.
const BUSY_JSON: &str = "import json, sys\nd = {'a': 1, 'b': [1, 2, 3], 'c': 'text'}\nprint('ready', flush=True)\nwhile True:\n    json.loads(json.dumps(d))\n";

/// Per probe: name, calls/s, and the 95% interval of an estimate.
type Rates = Vec<(String, f64, Option<(f64, f64)>)>;

/// Per-probe calls/s of one `tracer attach --json` run: (rate, 95% interval)
/// from a `--budget` run's estimates, or calls / elapsed from a full count.
fn attach_rates(tracer: &Path, args: &[&str]) -> anyhow::Result<Rates> {
    let out = Command::new(tracer).args(args).stderr(Stdio::null()).output().context("running tracer attach")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let summary: Value = serde_json::from_str(text.lines().last().context("tracer printed nothing")?)?;
    let elapsed = summary["elapsed_s"].as_f64().context("elapsed_s")?;
    let probes = summary["probes"].as_object().context("probes")?;
    Ok(probes
        .iter()
        .map(|(name, p)| {
            let e = &p["estimate"];
            if e.is_null() {
                #[allow(clippy::cast_precision_loss, reason = "a rate")]
                let rate = p["calls"].as_u64().unwrap_or(0) as f64 / elapsed;
                (name.clone(), rate, None)
            } else {
                let ci =
                    e["calls_per_s_ci95"].as_array().and_then(|a| Some((a.first()?.as_f64()?, a.get(1)?.as_f64()?)));
                (name.clone(), e["calls_per_s"].as_f64().unwrap_or(f64::NAN), ci)
            }
        })
        .collect())
}

/// `--budget 1` estimates next to full counts of one busy process,
/// alternating full, budget, full, budget.
pub fn budget_accuracy(md: &mut String, tracer: &Path) -> anyhow::Result<()> {
    let python = crate::real_python3()?;
    let mut busy = Command::new(&python)
        .args(["-c", BUSY_JSON])
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the busy JSON loop")?;
    let result = (|| -> anyhow::Result<Vec<(&str, Rates)>> {
        let mut line = String::new();
        BufReader::new(busy.stdout.take().context("stdout")?).read_line(&mut line)?;
        let pid = busy.id().to_string();
        let full = ["attach", "--exact", "--pid", &pid, "--json", "--interval", "3600", "--duration", "10"];
        let budget =
            ["attach", "--exact", "--pid", &pid, "--json", "--interval", "3600", "--duration", "60", "--budget", "1"];
        let mut runs = Vec::new();
        for round in 0..2 {
            for (kind, args) in [("full", &full[..]), ("budget", &budget[..])] {
                eprintln!("xtask: budget accuracy, round {}: {kind}", round + 1);
                runs.push((kind, attach_rates(tracer, args)?));
            }
        }
        Ok(runs)
    })();
    let _ = busy.kill();
    let _ = busy.wait();
    let runs = result?;
    writeln!(md, "## `--budget 1` estimates against full counts\n")?;
    writeln!(
        md,
        "One process runs `json.loads(json.dumps(d))` in a loop. Alternately: a full count, then `--budget 1`, twice. PID is that process.\n"
    )?;
    writeln!(
        md,
        "```\nsudo tracer attach --pid PID --json --interval 3600 --duration 10\nsudo tracer attach --pid PID --json --interval 3600 --duration 60 --budget 1\n```\n"
    )?;
    writeln!(
        md,
        "Rates are calls/s while traced (docs/budget.md). Difference = budget estimate vs the mean of the two full counts.\n"
    )?;
    writeln!(
        md,
        "| probe | full 1 | full 2 | budget 1 (±95%) | budget 2 (±95%) | differences |\n|---|---|---|---|---|---|"
    )?;
    let fulls: Vec<&Vec<_>> = runs.iter().filter(|(k, _)| *k == "full").map(|(_, r)| r).collect();
    let budgets: Vec<&Vec<_>> = runs.iter().filter(|(k, _)| *k == "budget").map(|(_, r)| r).collect();
    let mut worst: Option<(f64, String)> = None;
    for (i, (name, _, _)) in fulls[0].iter().enumerate() {
        let mean_full = f64::midpoint(fulls[0][i].1, fulls[1][i].1);
        if mean_full <= 0.0 {
            continue;
        }
        let est = |r: &(String, f64, Option<(f64, f64)>)| match r.2 {
            Some((lo, hi)) => format!("{:.0} ±{:.0}", r.1, (hi - lo) / 2.0),
            None => format!("{:.0} ±?", r.1),
        };
        let diff = |r: &(String, f64, Option<(f64, f64)>)| format!("{:+.1}%", (r.1 / mean_full - 1.0) * 100.0);
        writeln!(
            md,
            "| `{name}` | {:.0} | {:.0} | {} | {} | {}, {} |",
            fulls[0][i].1,
            fulls[1][i].1,
            est(&budgets[0][i]),
            est(&budgets[1][i]),
            diff(&budgets[0][i]),
            diff(&budgets[1][i])
        )?;
        for b in [&budgets[0][i], &budgets[1][i]] {
            let d = (b.1 / mean_full - 1.0) * 100.0;
            if worst.as_ref().is_none_or(|(w, _)| d.abs() > w.abs()) {
                worst = Some((d, name.clone()));
            }
        }
    }
    if let Some((d, name)) = worst {
        writeln!(md, "\nThe largest difference is {d:+.1}% (`{name}`).")?;
    }
    writeln!(md)?;
    Ok(())
}
