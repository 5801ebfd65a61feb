//! `cargo xtask bench`: pyenv's frees at their entries against at the
//! implementation their allocator pointer holds (`plan::slots`), each
//! against an empty BPF program at the same sites.
//!
//! One process per run, alternating the setups round by round: a loop of
//! `bytes(64)` made and dropped (freeloop.py), timed in its own CPU time,
//! with `tracer attach --pid PID --exact --probes PyObject_Free` attached
//! before it starts and detached after it ends. A hit's cost is the loop's
//! time over the untraced one's, divided by the `PyObject_Free` calls per
//! loop tracer counted.

use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};
use serde_json::Value;

const LOOP: &str = include_str!("freeloop.py");

/// The builds measured: pyenv's, whose frees jump through the pointers.
const BUILDS: [&str; 3] = ["3.11.7", "3.12.1", "3.13.0"];

/// The setups, in the first round's order (later rounds rotate it).
const SETUPS: [(&str, &str); 5] = [
    ("none", "nothing attached"),
    ("entry", "`--placement entry`: `PyObject_Free`'s entry, single-stepped"),
    ("implementation", "the default: `_PyObject_Free`'s `je`, emulated"),
    ("entry-empty", "the empty program at the entry"),
    ("implementation-empty", "the empty program at `_PyObject_Free`'s `je`"),
];

/// One run: the loop's CPU ns per iteration, and `PyObject_Free`'s calls
/// and placement (offset, emulated) where tracer counted.
struct Run {
    ns: f64,
    calls: Option<u64>,
    placed: Option<(u64, bool)>,
}

pub fn frees_section(md: &mut String, tracer: &Path, effort: &str) -> anyhow::Result<()> {
    let rounds = match effort {
        "fast" => 3,
        "normal" => 5,
        _ => 9,
    };
    let n: u64 = 200_000;
    let dir = PathBuf::from("/tmp/tracer-bench-frees");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let script = dir.join("freeloop.py");
    std::fs::write(&script, LOOP).with_context(|| format!("writing {}", script.display()))?;
    writeln!(md, "## pyenv's frees: at their entries and at their implementations\n")?;
    writeln!(
        md,
        "pyenv's `PyObject_Free` jumps through the allocator's pointer with nothing the kernel emulates before the jump; with `--pid` (exact) tracer probes `_PyObject_Free`, which the pointer holds, at its `je` instead (docs/probes.md). Each run is one process of `xtask/src/freeloop.py` ({n} iterations of `x = bytes(64)`, timed in its CPU time), with `sudo tracer attach --pid PID --exact --probes PyObject_Free --interval 3600 --json` attached before the loop and stopped after it; the empty program's runs set `TRACER_BENCH_PROGRAM=empty`. {rounds} rounds, each visiting every setup, the order rotated each round; medians. A hit's cost is (the setup's loop − the untraced loop) / `PyObject_Free` calls per loop.\n"
    )?;
    writeln!(
        md,
        "| build | calls per loop | untraced loop | entry: per hit | entry, empty program | implementation: per hit | implementation, empty program | implementation / its floor | entry / implementation |\n|---|---|---|---|---|---|---|---|---|"
    )?;
    for version in BUILDS {
        let minor = version.rsplit_once('.').map_or(version, |(m, _)| m);
        let python = PathBuf::from(format!("/root/.pyenv/versions/{version}/bin/python{minor}"));
        if !python.is_file() {
            bail!("{} is missing: pyenv's {version} is part of this machine kind", python.display());
        }
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); SETUPS.len()];
        let mut calls = Vec::new();
        for round in 0..rounds {
            for k in 0..SETUPS.len() {
                let i = (k + round) % SETUPS.len();
                let run = one_run(tracer, &python, &script, SETUPS[i].0, n)?;
                if SETUPS[i].0 == "implementation" {
                    if run.placed != Some((3, true)) {
                        bail!("{version}: PyObject_Free was not placed at its implementation: {:?}", run.placed);
                    }
                    calls.extend(run.calls);
                }
                times[i].push(run.ns);
            }
        }
        #[allow(clippy::cast_precision_loss, reason = "calls of one run")]
        let per_loop = median(calls.iter().map(|&c| c as f64).collect()) / n as f64;
        let m: Vec<f64> = times.into_iter().map(median).collect();
        let hit = |i: usize| (m[i] - m[0]) / per_loop;
        writeln!(
            md,
            "| pyenv {version} | {per_loop:.2} | {:.0} ns | {:.0} ns | {:.0} ns | {:.0} ns | {:.0} ns | **{:.2}x** | {:.1}x |",
            m[0],
            hit(1),
            hit(3),
            hit(2),
            hit(4),
            hit(2) / hit(4),
            hit(1) / hit(2)
        )?;
    }
    writeln!(md, "\nSetups: {}.\n", SETUPS.iter().map(|(k, d)| format!("`{k}`, {d}")).collect::<Vec<_>>().join("; "))?;
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
}

/// One process of the loop under `setup`.
fn one_run(tracer: &Path, python: &Path, script: &Path, setup: &str, n: u64) -> anyhow::Result<Run> {
    let mut child = Command::new(python)
        .arg(script)
        .arg(n.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", python.display()))?;
    let mut stdin = child.stdin.take().context("the loop's stdin")?;
    let mut out = BufReader::new(child.stdout.take().context("the loop's stdout")?);
    let mut line = String::new();
    out.read_line(&mut line)?;
    if line.trim() != "ready" {
        bail!("the loop did not start: {line:?}");
    }
    let mut attached_tracer = None;
    if setup != "none" {
        let pid = child.id().to_string();
        let mut cmd = Command::new(tracer);
        cmd.args(["attach", "--pid", &pid, "--exact", "--probes", "PyObject_Free", "--interval", "3600", "--json"]);
        if setup.starts_with("entry") {
            cmd.args(["--placement", "entry"]);
        }
        if setup.ends_with("empty") {
            cmd.env("TRACER_BENCH_PROGRAM", "empty");
        }
        let mut t = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().context("starting tracer")?;
        let mut lines = BufReader::new(t.stdout.take().context("tracer's stdout")?).lines();
        let attached: Value = serde_json::from_str(&lines.next().context("tracer printed nothing")??)?;
        let free = &attached["placements"]["PyObject_Free"];
        let placed = free["offset"].as_u64().zip(free["emulated"].as_bool());
        attached_tracer = Some((t, lines, placed));
    }
    stdin.write_all(b"go\n")?;
    line.clear();
    out.read_line(&mut line)?;
    let ns: f64 = line.trim().parse().with_context(|| format!("the loop printed {line:?}"))?;
    let mut run = Run { ns, calls: None, placed: None };
    if let Some((mut t, lines, placed)) = attached_tracer {
        let pid = libc::pid_t::try_from(t.id()).context("tracer's PID")?;
        // SAFETY: a signal to the tracer this function started.
        unsafe { libc::kill(pid, libc::SIGINT) };
        let last = lines.map_while(Result::ok).last().unwrap_or_default();
        t.wait()?;
        let summary: Value = serde_json::from_str(&last).with_context(|| format!("tracer's summary: {last:?}"))?;
        run.calls = summary["probes"]["PyObject_Free"]["calls"].as_u64();
        run.placed = placed;
    }
    stdin.write_all(b"go\n")?;
    child.wait()?;
    Ok(run)
}
