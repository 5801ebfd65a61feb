//! `cargo xtask bench --only live`: what `--live` adds per allocator call,
//! apart from the return probes it needs: the counting probes alone, the
//! same with `--returns`, and the same with `--live` (which turns
//! `--returns` on), side by side on one harness process per build, as the
//! features section measures.

#![allow(clippy::cast_precision_loss, reason = "loop and event counts far below 2^52")]

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

use anyhow::bail;
use serde_json::Value;

use crate::{
    bench_stacks::{Series, TIMINGS, best, calibrate, mean, stdev, traced_visit},
    lto::Harness,
    markdown::fmt_ns,
};

/// The object domain's API: `object()` makes one block with the first and
/// its death frees it with the second, and nothing else is allocated per
/// iteration.
const PROBES: &str = "PyObject_Malloc,PyObject_Free";
const ALLOC: &str = "PyObject_Malloc";
const FREE: &str = "PyObject_Free";

const SETUP: &str = "from itertools import repeat
def work():
    for _ in repeat(None, 1000):
        object()";
const STMT: &str = "work()";

/// The traced setups: each of the first three the one before it plus one
/// flag; the fourth `--live` without `--returns`, which it does not need.
const TRACED: [(&str, &[&str]); 4] = [
    ("(a) the probes", &["--probes", PROBES, "--gc", "off"]),
    ("(b) + `--returns`", &["--probes", PROBES, "--gc", "off", "--returns"]),
    ("(c) + `--live`", &["--probes", PROBES, "--gc", "off", "--returns", "--live"]),
    ("(d) `--live` alone", &["--probes", PROBES, "--gc", "off", "--live"]),
];

/// One build: its name, root, interpreter inside the root, environment,
/// and what the live table sees there (docs/live.md).
struct Build {
    name: &'static str,
    root: Option<&'static str>,
    python: String,
    env: &'static [(&'static str, &'static str)],
    sees: &'static str,
}

fn builds() -> Vec<Build> {
    let pyenv = std::env::var_os("PYENV_ROOT").map_or_else(
        || std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".pyenv"),
        std::path::PathBuf::from,
    );
    let debian = "/usr/bin/python3.11".to_owned();
    vec![
        Build {
            name: "pyenv 3.11.7",
            root: None,
            python: pyenv.join("versions/3.11.7/bin/python3").display().to_string(),
            env: &[],
            sees: "exact",
        },
        Build {
            name: "pyenv 3.13.0",
            root: None,
            python: pyenv.join("versions/3.13.0/bin/python3").display().to_string(),
            env: &[],
            sees: "exact",
        },
        Build {
            name: "Debian 12 python3.11 (LTO), `PYTHONMALLOC=debug`",
            root: None,
            python: debian.clone(),
            env: &[("PYTHONMALLOC", "debug")],
            sees: "exact",
        },
        Build {
            name: "Debian 12 python3.11 (LTO), default allocator",
            root: None,
            python: debian,
            env: &[],
            sees: "nearly exact",
        },
        Build {
            name: "Debian forky python3.14 (LTO), chrooted, `PYTHONMALLOC=debug`",
            root: Some(crate::setup::FORKY_ROOT),
            python: "/usr/bin/python3.14".to_owned(),
            env: &[("PYTHONMALLOC", "debug")],
            sees: "exact",
        },
    ]
}

/// What one traced visit counted, summed over the visits of its setup.
#[derive(Default)]
struct Counted {
    allocs: u64,
    frees: u64,
    tracked: u64,
    unseen: u64,
}

fn calls(summary: &Value, probe: &str) -> u64 {
    summary["probes"][probe]["calls"].as_u64().unwrap_or(0)
}

/// The setups on one harness, in `rounds` rotated rounds: nothing
/// attached, then [`TRACED`] with `tracer`, then (d) with each of `versus`.
fn measure(
    build: &Build,
    tracer: &Path,
    versus: &[PathBuf],
    (rounds, target): (usize, f64),
) -> anyhow::Result<(Vec<Series>, Vec<Counted>)> {
    let mut h = Harness::start_with(build.root, &build.python, (SETUP, STMT), build.env)?;
    let n = 1 + TRACED.len() + versus.len();
    let mut series: Vec<Series> = (0..n).map(|_| Series::default()).collect();
    let mut counted: Vec<Counted> = (0..n).map(|_| Counted::default()).collect();
    for round in 0..rounds {
        for k in 0..n {
            let i = (round + k) % n;
            eprintln!("xtask: live {} round {}: setup {i}", build.name, round + 1);
            let visit = &mut series[i];
            if i == 0 {
                if visit.loops == 0 {
                    visit.loops = calibrate(&mut h, target)?.0;
                }
                let times: anyhow::Result<Vec<f64>> = (0..TIMINGS).map(|_| h.time(visit.loops)).collect();
                visit.means.push(best(&times?));
                continue;
            }
            let (binary, flags) = match TRACED.get(i - 1) {
                Some((_, flags)) => (tracer, *flags),
                None => (versus[i - 1 - TRACED.len()].as_path(), TRACED[3].1),
            };
            let (per_loop, loops, summary) = traced_visit(&mut h, binary, flags, visit, target)?;
            visit.means.push(per_loop);
            visit.loops_traced += loops;
            visit.stats = summary["stats"].clone();
            let c = &mut counted[i];
            c.allocs += calls(&summary, ALLOC);
            c.frees += calls(&summary, FREE);
            let object = &summary["live"]["object"];
            c.tracked += object["allocations"].as_u64().unwrap_or(0);
            c.unseen += object["unseen_allocations"].as_u64().unwrap_or(0);
            if i >= 3 && summary["live"].is_null() {
                bail!("{}: tracer's summary has no live counts: {summary}", build.name);
            }
        }
    }
    Ok((series, counted))
}

/// Per round, what `with` added over `without` per event, in ns.
fn added(with: &Series, without: &Series, per_loop: f64) -> Vec<f64> {
    with.means.iter().zip(&without.means).map(|(w, o)| (w - o) * 1e9 / per_loop).collect()
}

/// Per round, `with`'s time over `without`'s.
fn ratios(with: &Series, without: &Series) -> Vec<f64> {
    with.means.iter().zip(&without.means).map(|(w, o)| w / o).collect()
}

fn spread(v: &[f64], unit: &str) -> String {
    if unit == "x" {
        format!("{:.2}x ± {:.2}", mean(v), stdev(v))
    } else {
        format!("{:.0} ns ± {:.0}", mean(v), stdev(v))
    }
}

/// Table cells, each " cell |".
fn cells(cells: impl Iterator<Item = String>) -> String {
    cells.map(|c| format!(" {c} |")).collect::<Vec<_>>().concat()
}

/// How a `--versus` binary is named in the tables: by its file name.
fn label(tracer: &Path) -> String {
    format!(
        "`{}`",
        tracer.file_name().map_or_else(|| tracer.display().to_string(), |n| n.to_string_lossy().into_owned())
    )
}

/// Writes the section. `versus`: other tracer binaries (builds of earlier
/// commits) whose `--live` is measured beside this one's, as (d).
pub fn live_section(md: &mut String, tracer: &Path, effort: &str, versus: &[PathBuf]) -> anyhow::Result<()> {
    let (rounds, target) = crate::markdown::rounds(effort);
    let load = crate::markdown::Load::now();
    crate::lto::install_harness()?;
    writeln!(md, "## What `--live` adds per allocator call\n")?;
    writeln!(
        md,
        "Five setups take turns on one harness process per build, in {rounds} rounds of rotated order: \
         nothing attached; (a) the object domain's probes (`{PROBES}`); (b) the same with `--returns`, the \
         return probes of the allocating API function; (c) the same with `--live`, which adds its \
         programs on the API functions' probes (`live_alloc`, `live_free`), in each allocator implementation \
         (`live_impl`) and at its return (`live_ret` or `live_ret_uret`, whichever tracer picks: \
         `tracer probes --live` shows it); (d) (a) with `--live` alone, which reads the implementations' \
         returns and needs none of `--returns`' probes. A visit times {TIMINGS} runs of a loop count \
         calibrated at the setup's first visit to about {:.0} ms, and keeps the best. Each step's cost per \
         event is (its time per loop − the time of the setup it adds to, in the same round) / its events per \
         loop (tracer's counts over the loops it saw), then the mean and standard deviation over the rounds; \
         a ratio is the same two setups' times in the same round, divided. An allocator call is a `{ALLOC}` \
         or `{FREE}` call (tracer counts inlined copies as calls); the return probes are paid per `{ALLOC}` \
         call.\n",
        target * 1e3
    )?;
    let versus_args = versus.iter().map(|v| format!(" --versus {}", v.display())).collect::<Vec<_>>().concat();
    writeln!(md, "```\ncargo xtask bench --only live --effort {effort}{versus_args}\n```\n")?;
    let names: Vec<String> = versus.iter().map(|v| label(v)).collect();
    if !names.is_empty() {
        writeln!(md, "(d) is also measured, in the same rounds, with {}.\n", names.join(", "))?;
    }
    writeln!(md, "```python\n# setup\n{SETUP}\n# timed\n{STMT}\n```\n")?;
    writeln!(md, "```")?;
    for (_, flags) in TRACED {
        writeln!(md, "sudo tracer attach --pid PID --json --interval 3600 {}", flags.join(" "))?;
    }
    writeln!(md, "```\n")?;
    let with = |f: &dyn Fn(&str) -> String| -> String { names.iter().map(|l| f(l)).collect::<Vec<_>>().concat() };
    let mut per_event = format!(
        "| build | live | (a) per allocator call | (b) − (a) per `{ALLOC}` call | (c) − (b) per allocator call | \
         (d) − (a) per allocator call |{} blocks tracked per `{ALLOC}` call (d) |\n|---|---|---|---|---|---|{}---|\n",
        with(&|l| format!(" (d) with {l} − (a) |")),
        "---|".repeat(names.len())
    );
    writeln!(
        md,
        "| build | nothing attached | (a) the probes | (b) + `--returns` | (c) + `--live` | (d) (a) + `--live` |{} \
         (b) / (a) | (c) / (b) | (d) / (a) |{}\n|---|---|---|---|---|---|{}---|---|---|{}",
        with(&|l| format!(" (d) with {l} |")),
        with(&|l| format!(" (d) with {l} / (d) |")),
        "---|".repeat(names.len()),
        "---|".repeat(names.len())
    )?;
    for build in builds() {
        let host = build.root.map_or_else(|| build.python.clone(), |r| format!("{r}{}", build.python));
        if !Path::new(&host).is_file() {
            bail!("{host} is missing; run `cargo xtask setup`");
        }
        let (s, c) = measure(&build, tracer, versus, (rounds, target))?;
        let per_loop = |i: usize, n: u64| n as f64 / s[i].loops_traced.max(1) as f64;
        let calls = |i: usize| per_loop(i, c[i].allocs + c[i].frees);
        let allocs_b = per_loop(2, c[2].allocs);
        if calls(1) < 0.5 || allocs_b < 0.5 || (3..s.len()).any(|i| calls(i) < 0.5) {
            bail!("{}: tracer counted too few calls in a setup", build.name);
        }
        let t = |x: &Series| format!("{} ± {}", fmt_ns(mean(&x.means) * 1e9), fmt_ns(stdev(&x.means) * 1e9));
        let others = 5..s.len();
        let times = cells(others.clone().map(|i| t(&s[i])));
        let vs = cells(others.clone().map(|i| spread(&ratios(&s[i], &s[4]), "x")));
        writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} |{times} {} | {} | {} |{vs}",
            build.name,
            t(&s[0]),
            t(&s[1]),
            t(&s[2]),
            t(&s[3]),
            t(&s[4]),
            spread(&ratios(&s[2], &s[1]), "x"),
            spread(&ratios(&s[3], &s[2]), "x"),
            spread(&ratios(&s[4], &s[1]), "x"),
        )?;
        let cost = |i: usize, over: usize| {
            format!("{} ({:.1} per loop)", spread(&added(&s[i], &s[over], calls(i)), "ns"), calls(i))
        };
        let versus_cost = cells(others.map(|i| cost(i, 1)));
        let tracked = c[4].tracked as f64 / c[4].allocs.max(1) as f64;
        writeln!(
            per_event,
            "| {} | {} | {} ({:.1} per loop) | {} ({allocs_b:.1} per loop) | {} | {} |{versus_cost} {tracked:.3} ({} unseen) |",
            build.name,
            build.sees,
            spread(&added(&s[1], &s[0], calls(1)), "ns"),
            calls(1),
            spread(&added(&s[2], &s[1], allocs_b), "ns"),
            cost(3, 2),
            cost(4, 1),
            c[4].unseen,
        )?;
    }
    writeln!(md, "\n{per_event}")?;
    writeln!(md, "{}", load.line())?;
    Ok(())
}
