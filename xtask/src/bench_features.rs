//! `cargo xtask bench --only features`: what each memory feature adds per
//! event it handles, against the same attach without it, side by side on
//! one harness process: `--types` per new reference, `--native` per libc
//! call, `--live` on top of `--native` per libc call, and the GC markers
//! per collection.
//!
//! As in the stacks section, the setups of one case take turns on one
//! long-lived harness in rounds of rotated order, so each difference
//! compares timings taken moments apart in the same process.

#![allow(clippy::cast_precision_loss, reason = "loop and event counts far below 2^52")]

use std::{fmt::Write as _, path::Path};

use anyhow::bail;
use serde_json::Value;

use crate::{
    bench_stacks::{Series, TIMINGS, best, calibrate, mean, stdev, traced_visit},
    lto::Harness,
};

/// The base probe of the cases that do not instrument a probe of their
/// own: one the workloads do not call, so that the base costs the
/// workload nothing and the feature's difference is the feature's alone.
const IDLE_PROBE: &str = "PyMem_RawCalloc";

/// libc's functions that `--native` probes, as the summary names them.
const NATIVE: [&str; 8] = ["malloc", "calloc", "realloc", "free", "posix_memalign", "aligned_alloc", "mmap", "munmap"];

/// One feature's case: its workload and how its events are counted.
struct Case {
    name: &'static str,
    /// What is counted per event in the table's last column.
    per: &'static str,
    setup: &'static str,
    stmt: &'static str,
    /// The probe every setup attaches (tracer needs one): the one the
    /// feature instruments, or [`IDLE_PROBE`].
    base: &'static str,
    /// Flags the base has too (a feature that builds on another): its
    /// events are then the feature's, not the base probe's calls.
    base_flags: &'static [&'static str],
    /// The flags beside `--probes BASE` that turn it on.
    flags: &'static [&'static str],
    /// The events the feature handles, from a summary.
    events: fn(&Value) -> u64,
}

fn new_references(summary: &Value) -> u64 {
    summary["probes"]["_Py_NewReference"]["calls"].as_u64().unwrap_or(0)
}

fn native_calls(summary: &Value) -> u64 {
    NATIVE.iter().map(|f| summary["probes"][*f]["calls"].as_u64().unwrap_or(0)).sum()
}

fn collections(summary: &Value) -> u64 {
    summary["gc"]["generations"]
        .as_array()
        .map_or(0, |g| g.iter().map(|g| g["collections"].as_u64().unwrap_or(0)).sum())
}

/// The native cases' workload: 1000 libc `malloc(64)` and `free` through
/// ctypes.
const NATIVE_SETUP: &str = "import ctypes
from itertools import repeat
libc = ctypes.CDLL(None)
m, f = libc.malloc, libc.free
m.restype, m.argtypes, f.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
def work():
    for _ in repeat(None, 1000):
        f(m(64))";

const CASES: [Case; 4] = [
    Case {
        name: "`--types`: the new object's type, counted per type in the kernel",
        per: "new reference",
        setup: "from itertools import repeat
def work():
    for _ in repeat(None, 1000):
        object()",
        stmt: "work()",
        base: "_Py_NewReference",
        base_flags: &[],
        flags: &["--types"],
        events: new_references,
    },
    Case {
        name: "`--native`: libc's allocator",
        per: "libc call (malloc, free, ...)",
        setup: NATIVE_SETUP,
        stmt: "work()",
        base: IDLE_PROBE,
        base_flags: &[],
        flags: &["--native"],
        events: native_calls,
    },
    Case {
        name: "`--native --live`: libc's blocks tracked, against `--native` alone",
        per: "libc call (malloc, free, ...)",
        setup: NATIVE_SETUP,
        stmt: "work()",
        base: IDLE_PROBE,
        base_flags: &["--native"],
        flags: &["--live"],
        events: native_calls,
    },
    Case {
        name: "`--gc auto`: the collection markers (their semaphores raised)",
        per: "collection",
        setup: "import gc",
        stmt: "gc.collect(0)",
        base: IDLE_PROBE,
        base_flags: &[],
        flags: &["--gc", "auto"],
        events: collections,
    },
];

/// (name, root, interpreter inside the root).
fn builds() -> Vec<(String, Option<&'static str>, String)> {
    let pyenv = std::env::var_os("PYENV_ROOT").map_or_else(
        || std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".pyenv"),
        std::path::PathBuf::from,
    );
    vec![
        ("pyenv 3.11.7".to_owned(), None, pyenv.join("versions/3.11.7/bin/python3").display().to_string()),
        ("Debian 12 python3.11 (LTO)".to_owned(), None, "/usr/bin/python3.11".to_owned()),
        (
            "Debian forky python3.14 (LTO), chrooted".to_owned(),
            Some(crate::setup::FORKY_ROOT),
            "/usr/bin/python3.14".to_owned(),
        ),
    ]
}

/// Per round, what the setup `with` added to each of its events over the
/// setup `without`, in ns.
fn added(with: &Series, without: &Series, events_per_loop: f64) -> Vec<f64> {
    with.means.iter().zip(&without.means).map(|(w, o)| (w - o) * 1e9 / events_per_loop).collect()
}

/// The base's flags and the feature's: the GC markers are on by default,
/// so every setup but the GC case's feature has them off.
fn setups(case: &Case) -> (Vec<&'static str>, Vec<&'static str>) {
    let mut base = vec!["--probes", case.base];
    base.extend_from_slice(case.base_flags);
    base.extend(["--gc", "off"]);
    let mut featured = vec!["--probes", case.base];
    featured.extend_from_slice(case.base_flags);
    featured.extend_from_slice(case.flags);
    if !case.flags.contains(&"--gc") {
        featured.extend(["--gc", "off"]);
    }
    (base, featured)
}

/// The three setups of one case on one harness: nothing attached, the base
/// probe, the base probe and the feature.
fn measure(
    (root, python): (Option<&str>, &str),
    case: &Case,
    tracer: &Path,
    (rounds, target): (usize, f64),
) -> anyhow::Result<[Series; 3]> {
    let mut harness = Harness::start(root, python, case.setup, case.stmt, false)?;
    let mut series: [Series; 3] = Default::default();
    let (base, featured) = setups(case);
    let flags = [None, Some(base), Some(featured)];
    for round in 0..rounds {
        for k in 0..3 {
            let i = (round + k) % 3;
            eprintln!("xtask: features {python} {} round {}: setup {i}", case.per, round + 1);
            let visit = &mut series[i];
            match &flags[i] {
                None => {
                    if visit.loops == 0 {
                        visit.loops = calibrate(&mut harness, target)?.0;
                    }
                    let times: anyhow::Result<Vec<f64>> = (0..TIMINGS).map(|_| harness.time(visit.loops)).collect();
                    visit.means.push(best(&times?));
                }
                Some(setup) => {
                    let (per_loop, loops, summary) = traced_visit(&mut harness, tracer, setup, visit, target)?;
                    visit.means.push(per_loop);
                    visit.events += if i == 1 && case.base_flags.is_empty() {
                        summary["probes"][case.base]["calls"].as_u64().unwrap_or(0)
                    } else {
                        (case.events)(&summary)
                    };
                    visit.loops_traced += loops;
                    visit.stats = summary["stats"].clone();
                }
            }
        }
    }
    Ok(series)
}

/// Writes the section.
pub fn features_section(md: &mut String, tracer: &Path, effort: &str) -> anyhow::Result<()> {
    let (rounds, target) = crate::markdown::rounds(effort);
    let load = crate::markdown::Load::now();
    crate::lto::install_harness()?;
    writeln!(md, "## What each memory feature adds per event\n")?;
    writeln!(
        md,
        "Each case times one workload under three setups on one harness process, in {rounds} rounds of \
         rotated order: nothing attached, the base (`--probes _Py_NewReference` for `--types`, which \
         instruments that probe; else `--probes {IDLE_PROBE}`, which the workloads do not call, with \
         `--native` for `--native --live`; `--gc off` too, but in the GC case's third setup), and the base \
         with the feature. tracer is started for a visit and \
         stopped with SIGINT after it; a visit times {TIMINGS} runs of a loop count calibrated at the \
         setup's first visit to about {:.0} ms, and keeps the best. Added per event = (the feature's \
         time per loop − the base's in the same round) / the feature's events per loop (tracer's counts \
         over the loops it saw), then the mean and standard deviation over the rounds. The size \
         histograms are not a case: every allocating probe fills them, so they are part of the probe \
         hit the other sections measure.\n",
        target * 1e3
    )?;
    writeln!(md, "```\ncargo xtask bench --only features --effort {effort}\n```\n")?;
    for case in &CASES {
        writeln!(md, "### {}\n", case.name)?;
        writeln!(md, "```python\n# setup\n{}\n# timed\n{}\n```\n", case.setup, case.stmt)?;
        let (base, flags) = setups(case);
        writeln!(
            md,
            "```\nsudo tracer attach --pid PID --json --interval 3600 {}\nsudo tracer attach --pid PID --json --interval 3600 {}\n```\n",
            base.join(" "),
            flags.join(" ")
        )?;
        let base_per = if case.base_flags.is_empty() { format!("`{}` call", case.base) } else { case.per.to_owned() };
        writeln!(
            md,
            "| build | nothing attached | base | base + feature | base per {base_per} | feature per {} |\n|---|---|---|---|---|---|",
            case.per
        )?;
        for (build, root, python) in builds() {
            let host = root.map_or_else(|| python.clone(), |r| format!("{r}{python}"));
            if !Path::new(&host).is_file() {
                bail!("{host} is missing; run `cargo xtask setup`");
            }
            let [none, base, feature] = measure((root, &python), case, tracer, (rounds, target))?;
            if feature.events == 0 {
                bail!("{build}: {}: tracer counted no events (stats {})", case.name, feature.stats);
            }
            let base_epl = base.events as f64 / base.loops_traced.max(1) as f64;
            let feature_epl = feature.events as f64 / feature.loops_traced.max(1) as f64;
            let probe = added(&base, &none, base_epl);
            let cost = added(&feature, &base, feature_epl);
            let t = |s: &Series| {
                format!(
                    "{} ± {}",
                    crate::markdown::fmt_ns(mean(&s.means) * 1e9),
                    crate::markdown::fmt_ns(stdev(&s.means) * 1e9)
                )
            };
            // A base whose probe the workload does not call has no cost
            // per event to show.
            let base_cell = if base_epl >= 0.5 {
                format!("{:.0} ns ± {:.0} ({base_epl:.1} per loop)", mean(&probe), stdev(&probe))
            } else {
                format!("not called ({base_epl:.1} per loop)")
            };
            writeln!(
                md,
                "| {build} | {} | {} | {} | {base_cell} | {:.0} ns ± {:.0} ({feature_epl:.1} per loop) |",
                t(&none),
                t(&base),
                t(&feature),
                mean(&cost),
                stdev(&cost)
            )?;
        }
        writeln!(md)?;
    }
    writeln!(md, "{}", load.line())?;
    Ok(())
}
