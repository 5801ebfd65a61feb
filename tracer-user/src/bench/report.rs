//! `tracer bench` from options to the printed result: the setups to
//! compare, and the report in pyperf's words or as JSON.

use std::{path::Path, time::Duration};

use clap::ValueEnum as _;
use indexmap::IndexMap;

use super::{Bench, BenchError, Comparison, HitsPerLoop, State, StateStats, compare_line};
use crate::{
    cli::{Extra, Setup, Setups},
    model::{BenchEntry, BenchPython, BenchReport, BenchState},
    plan::PlacementMode,
    probe::{ProbeSpec, Program},
};

/// The states of `--also`, measured beside baseline, attached and
/// detached: `entry` (tracer's counting probes at the function entries),
/// `empty` and `empty-entry` (an empty BPF program at the placed offsets or
/// at the entries: the cost of the uprobe itself), `call-sites` and
/// `empty-call-sites` (the same with `--placement call-sites`), `returns`
/// (with return probes), the `meta-*` experiment's programs,
/// `tracemalloc=N` (PYTHONTRACEMALLOC=N in pyperf's workers), `bpftrace`
/// (bpftrace counting the same functions, `specs`, at their entries in
/// `image`), `budget=PERCENT` (`tracer attach --exact --exe EXE --budget PERCENT`
/// running through the chunk).
pub fn extra_states(
    Setups(list): &Setups,
    specs: &[ProbeSpec],
    (exe, image): (&Path, &Path),
) -> Result<Vec<State>, BenchError> {
    let attached = |setup: Setup, program, placement, returns| State::Attached {
        name: setup.to_possible_value().map(|v| v.get_name().to_owned()).unwrap_or_default(),
        program,
        placement,
        returns,
    };
    let mut states = Vec::new();
    for extra in list {
        let state = match extra {
            Extra::Setup(setup @ Setup::Entry) => attached(*setup, None, PlacementMode::Entry, false),
            Extra::Setup(setup @ Setup::CallSites) => attached(*setup, None, PlacementMode::CallSites, false),
            Extra::Setup(setup @ Setup::Empty) => attached(*setup, Some(Program::Empty), PlacementMode::Auto, false),
            Extra::Setup(setup @ Setup::EmptyEntry) => {
                attached(*setup, Some(Program::Empty), PlacementMode::Entry, false)
            }
            Extra::Setup(setup @ Setup::EmptyCallSites) => {
                attached(*setup, Some(Program::Empty), PlacementMode::CallSites, false)
            }
            Extra::Setup(setup @ Setup::Returns) => attached(*setup, None, PlacementMode::Auto, true),
            // The allocator-metadata experiment (tracer-ebpf/src/experiment.rs).
            Extra::Setup(setup @ Setup::MetaInsert) => {
                attached(*setup, Some(Program::MetaInsert), PlacementMode::Auto, false)
            }
            Extra::Setup(setup @ Setup::MetaLookup) => {
                attached(*setup, Some(Program::MetaLookup), PlacementMode::Auto, false)
            }
            Extra::Setup(setup @ Setup::MetaPool) => {
                attached(*setup, Some(Program::MetaPool), PlacementMode::Auto, false)
            }
            Extra::Setup(setup @ Setup::MetaChunk) => {
                attached(*setup, Some(Program::MetaChunk), PlacementMode::Auto, false)
            }
            Extra::Setup(Setup::Bpftrace) => State::Command {
                name: "bpftrace".into(),
                argv: vec!["bpftrace".into(), "-e".into(), bpftrace_script(specs, image)],
                ready: "Attaching".into(),
                // bpftrace prints "Attaching N probes..." before attaching.
                settle: Duration::from_secs(2),
            },
            Extra::Budget(percent) => {
                let symbols: Vec<&str> = specs.iter().map(|s| s.symbol).collect();
                let tracer = std::env::current_exe().map_err(|e| super::step("finding tracer's own executable", e))?;
                State::Command {
                    name: format!("budget{percent}"),
                    argv: vec![
                        tracer.display().to_string(),
                        "attach".into(),
                        "--exact".into(),
                        "--exe".into(),
                        exe.display().to_string(),
                        "--probes".into(),
                        symbols.join(","),
                        "--budget".into(),
                        percent.clone(),
                        "--json".into(),
                        "--interval".into(),
                        "3600".into(),
                    ],
                    ready: "\"type\":\"attached\"".into(),
                    settle: Duration::ZERO,
                }
            }
            Extra::Tracemalloc(frames) => State::Env {
                name: format!("tracemalloc{frames}"),
                vars: vec![("PYTHONTRACEMALLOC".into(), frames.clone())],
            },
        };
        states.push(state);
    }
    Ok(states)
}

/// `uprobe:LIB:F1,uprobe:LIB:F2 { @[probe] = count(); }`
fn bpftrace_script(specs: &[ProbeSpec], image: &Path) -> String {
    let probes: Vec<String> = specs.iter().map(|s| format!("uprobe:{}:{}", image.display(), s.symbol)).collect();
    format!("{} {{ @[probe] = count(); }}", probes.join(","))
}

/// One measured setup with its comparison against the baseline.
pub struct Row<'a> {
    pub name: &'a str,
    pub stats: &'a StateStats,
    pub vs_baseline: Comparison,
}

/// The result as text lines in pyperf's terms.
#[must_use]
pub fn text(baseline: &StateStats, rows: &[Row<'_>], hits: &HitsPerLoop, out_dir: &Path) -> Vec<String> {
    let mut lines: Vec<String> =
        rows.iter().map(|r| compare_line("baseline", baseline, r.name, r.stats, &r.vs_baseline)).collect();
    let by_probe: Vec<String> =
        hits.per_probe.iter().filter(|(_, v)| *v > 0.0).map(|(n, v)| format!("{n} {v}")).collect();
    lines.push(format!("probe hits per loop: {} ({})", hits.total, by_probe.join(", ")));
    for r in rows.iter().filter(|r| has_cost_per_hit(r.name)) {
        match ns_per_hit(baseline, r.stats, hits) {
            Some(ns) => lines.push(format!("cost per probe hit ({}): {ns:.0} ns", r.name)),
            None => lines.push(format!("cost per probe hit ({}): n/a, the statement hits no probe", r.name)),
        }
    }
    let files: Vec<String> = std::iter::once("baseline")
        .chain(rows.iter().map(|r| r.name))
        .map(|n| out_dir.join(format!("{n}.json")).display().to_string())
        .collect();
    lines.push(format!("pyperf files: {}", files.join(" ")));
    lines
}

/// Whether the setup named `name` pays for every probe hit, so that its
/// added time per hit means something. Not after detaching (no probes), not
/// under a budget (only some hits are traced), not under tracemalloc (no
/// probes: its cost is not per hit).
#[must_use]
pub fn has_cost_per_hit(name: &str) -> bool {
    name != "detached" && !name.starts_with("budget") && !name.starts_with("tracemalloc")
}

/// (mean − baseline mean) / hits per loop, in ns.
#[must_use]
pub fn ns_per_hit(baseline: &StateStats, other: &StateStats, hits: &HitsPerLoop) -> Option<f64> {
    (hits.total > 0.0).then(|| (other.mean - baseline.mean) * 1e9 / hits.total)
}

/// The result as one JSON object: `baseline`, one object per setup, and
/// `NAME_vs_baseline`, `hits_per_loop`, `ns_per_hit` (attached).
#[must_use]
pub fn json(bench: &Bench, baseline: &StateStats, rows: &[Row<'_>], hits: &HitsPerLoop) -> BenchReport {
    let stat = |s: &StateStats| BenchState {
        mean_ns: s.mean * 1e9,
        stdev_ns: s.stdev * 1e9,
        values: s.values,
        file: s.file.clone(),
    };
    let mut setups = IndexMap::new();
    let mut per_hit = IndexMap::new();
    for r in rows {
        setups.insert(r.name.to_owned(), BenchEntry::State(stat(r.stats)));
        let versus = BenchEntry::Versus { ratio: r.vs_baseline.ratio, significant: r.vs_baseline.significant };
        setups.insert(format!("{}_vs_baseline", r.name), versus);
        if has_cost_per_hit(r.name) {
            per_hit.insert(r.name.to_owned(), ns_per_hit(baseline, r.stats, hits));
        }
    }
    BenchReport {
        python: BenchPython {
            executable: bench.python.clone(),
            version: bench.target().version.to_string(),
            image: bench.target().display_path.clone(),
            root: bench.root.clone(),
        },
        stmt: bench.stmt.clone(),
        setup: bench.setup.clone(),
        baseline: stat(baseline),
        setups,
        hits_per_loop: hits.total,
        hits_per_loop_by_probe: hits.per_probe.iter().map(|(n, v)| ((*n).to_owned(), *v)).collect(),
        ns_per_hit: per_hit.get("attached").copied().flatten(),
        ns_per_hit_by_setup: per_hit,
        notes: bench.prepared.notes.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        probe::ProbeSelection,
        python::{PythonVersion, abi_for},
    };

    fn paths() -> (&'static Path, &'static Path) {
        (Path::new("/py"), Path::new("/l.so"))
    }

    #[test]
    fn extra_setups_in_order() {
        let abi = abi_for(1, PythonVersion::from_hex(0x030B_07F0)).unwrap();
        let specs = ProbeSelection::Refs.select(abi.probes(), "3.11.7").unwrap();
        let also = Setups(vec![
            Extra::Setup(Setup::Empty),
            Extra::Tracemalloc("25".into()),
            Extra::Setup(Setup::Bpftrace),
            Extra::Budget("1".into()),
            Extra::Setup(Setup::Returns),
            Extra::Setup(Setup::EmptyCallSites),
        ]);
        let states = extra_states(&also, &specs, paths()).unwrap();
        let names: Vec<&str> = states.iter().map(State::name).collect();
        assert_eq!(names, ["empty", "tracemalloc25", "bpftrace", "budget1", "returns", "empty-call-sites"]);
        assert!(matches!(states[4], State::Attached { returns: true, .. }));
        assert!(matches!(
            states[5],
            State::Attached { program: Some(Program::Empty), placement: PlacementMode::CallSites, .. }
        ));
        let State::Command { argv, .. } = &states[3] else { panic!("budget is a command") };
        assert_eq!(
            argv[1..10],
            [
                "attach",
                "--exact",
                "--exe",
                "/py",
                "--probes",
                "_Py_NewReference,_Py_Dealloc",
                "--budget",
                "1",
                "--json"
            ]
        );
        let State::Command { argv, .. } = &states[2] else { panic!("bpftrace is a command") };
        assert_eq!(argv[2], "uprobe:/l.so:_Py_NewReference,uprobe:/l.so:_Py_Dealloc { @[probe] = count(); }");
    }
}
