//! `cargo xtask bench`: the cost of one probe hit: on `_Py_NewReference`
//! in every setup, each default probe five ways, and the same on Debian's
//! static, LTO-built python3.11.

use std::{fmt::Write as _, path::Path};

use anyhow::bail;

use crate::bench_measure::{
    API_SETUP, DEFAULT_PROBES, STATEMENTS, added_time, api_commands, bench, per_hit_cell, placed_at, probe_plan, row,
    statement_head,
};

/// Section 1 of a full run: one hit on `_Py_NewReference`, then each
/// default probe five ways, on `python` (the default pyperf venv's, made
/// from the first `python3` on PATH: pyenv's in a shell with its shims,
/// Debian's under `env -i`).
pub fn per_hit(md: &mut String, tracer: &Path, python: &Path, out_root: &Path, effort: &str) -> anyhow::Result<()> {
    per_hit_section(md, tracer, python, out_root, effort)?;
    per_probe(md, tracer, python, out_root, effort)
}

/// The cost of one hit on `_Py_NewReference`, in every setup.
fn per_hit_section(md: &mut String, tracer: &Path, python: &Path, out_root: &Path, effort: &str) -> anyhow::Result<()> {
    let m =
        bench(tracer, python, &out_root.join("per-hit"), "pass", "[]", "_Py_NewReference", "empty,bpftrace", effort)?;
    writeln!(md, "## Cost of one probe hit on `_Py_NewReference`\n")?;
    writeln!(md, "```\n{}\n```\n", m.command)?;
    writeln!(
        md,
        "`[]` calls `_Py_NewReference` exactly {} time(s) per loop (counted, not assumed). \
         Cost per hit = (mean − baseline mean) / hits per loop.\n",
        m.result["hits_per_loop"]
    )?;
    writeln!(md, "| setup | mean per loop | vs baseline | cost per hit |\n|---|---|---|---|")?;
    row(md, &m.result, "baseline", "nothing attached")?;
    let placed = placed_at(&probe_plan(tracer, python, "_Py_NewReference", "auto")?);
    row(md, &m.result, "attached", &format!("tracer, placed ({placed})"))?;
    row(md, &m.result, "entry", "tracer at the entry")?;
    row(md, &m.result, "empty", "an empty BPF program, placed (the floor there)")?;
    row(md, &m.result, "empty-entry", "an empty BPF program at the entry (the floor there)")?;
    row(md, &m.result, "bpftrace", "`bpftrace -e 'uprobe:LIB:_Py_NewReference { @[probe] = count(); }'`")?;
    row(md, &m.result, "detached", "after tracer attached and detached")?;
    writeln!(md)?;
    Ok(())
}

/// Every default probe: placed, at the entry, an empty program at both
/// places, bpftrace at the entry; and at its call sites, for a probe that
/// `--placement call-sites` moves there.
fn per_probe(md: &mut String, tracer: &Path, python: &Path, out_root: &Path, effort: &str) -> anyhow::Result<()> {
    writeln!(md, "## Cost per hit of each default probe, five ways (six with call sites)\n")?;
    writeln!(
        md,
        "One command per probe, with only that probe attached, timing `body()`: one call of each \
         allocator function through ctypes, and a list (setup below). Columns: tracer with its \
         placement (`tracer probes` shows where), tracer at the function entry, an empty BPF program \
         at the entry and at tracer's placement (the kernel's floor for each place), and bpftrace \
         counting at the entry; for a function `--placement call-sites` moves to its callers, tracer \
         and an empty program at its call sites. Each cell is (mean − baseline mean) / exact hits \
         per loop.\n"
    )?;
    writeln!(md, "```python\n{API_SETUP}\n```\n")?;
    let mut table = String::from(
        "| probe | placed at | hits/loop | tracer placed | tracer entry | empty entry | empty placed | bpftrace entry | tracer call sites | empty call sites |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut commands = Vec::new();
    for probe in DEFAULT_PROBES {
        let at_callers = !probe_plan(tracer, python, probe, "call-sites")?["call_sites"].is_null();
        let also = if at_callers {
            "entry,empty-entry,empty,bpftrace,call-sites,empty-call-sites"
        } else {
            "entry,empty-entry,empty,bpftrace"
        };
        let m =
            bench(tracer, python, &out_root.join(format!("probe-{probe}")), API_SETUP, "body()", probe, also, effort)?;
        let p = probe_plan(tracer, python, probe, "auto")?;
        let placed = format!("+{} `{}`", p["offset"], p["instruction"].as_str().unwrap_or("?"));
        let cell = |k: &str| per_hit_cell(&m.result, k);
        writeln!(
            table,
            "| `{probe}` | {placed} | {} | {} | {} | {} | {} | {} | {} | {} |",
            m.result["hits_per_loop"],
            cell("attached"),
            cell("entry"),
            cell("empty-entry"),
            cell("empty"),
            cell("bpftrace"),
            cell("call-sites"),
            cell("empty-call-sites")
        )?;
        commands.push(m.command);
    }
    writeln!(md, "{table}")?;
    api_commands(md, "the setup above", &commands)
}

/// Debian's static, LTO-built python3.11: each default probe's cost per
/// hit (placed, at call sites where tracer moves it there, and bpftrace at
/// the entry), then the JSON round trip.
pub fn static_section(md: &mut String, tracer: &Path, out_root: &Path, effort: &str) -> anyhow::Result<()> {
    let base = Path::new(STATIC_PYTHON);
    if !base.is_file() {
        bail!("{STATIC_PYTHON} is missing; install Debian's python3.11 (apt-get install python3.11)");
    }
    let venv = crate::setup::static_pyperf_venv();
    crate::setup::ensure_pyperf_venv(base, &venv)?;
    let python = venv.join("bin").join("python");
    writeln!(md, "## Debian's static, LTO-built python3.11\n")?;
    writeln!(
        md,
        "The same measurements on `{STATIC_PYTHON}` (pyperf in a venv of it). LTO inlined the probed \
         functions into their callers, hundreds of times for `_Py_NewReference` and `_Py_Dealloc`; \
         tracer probes every inlined copy too (docs/limitations.md; how many, and where, in the next \
         section), and the hits per loop are tracer's count, copies included. bpftrace at the entry \
         sees only the calls of the out-of-line function, yet its cell divides by the same count, so \
         it understates bpftrace's cost per hit wherever the statement runs inlined copies. A cell is \
         \"—\" where the statement hits the probe too rarely to measure. Columns: tracer with its \
         placement (of the out-of-line function), tracer with `--placement call-sites` (only \
         `_Py_Dealloc` moves), bpftrace at the entry.\n"
    )?;
    let mut table = String::from(
        "| probe | placed at | hits/loop | tracer placed | tracer call sites | bpftrace entry |\n|---|---|---|---|---|---|\n",
    );
    let mut commands = Vec::new();
    for probe in DEFAULT_PROBES {
        let p = probe_plan(tracer, &python, probe, "call-sites")?;
        if p.is_null() {
            writeln!(table, "| `{probe}` | not in this build | | | | |")?;
            continue;
        }
        let at_callers = !p["call_sites"].is_null();
        let also = if at_callers { "bpftrace,call-sites" } else { "bpftrace" };
        let out = out_root.join(format!("static-probe-{probe}"));
        let m = bench(tracer, &python, &out, API_SETUP, "body()", probe, also, effort)?;
        let placed = if at_callers {
            format!("{} call sites", p["call_sites"]["emulated"])
        } else {
            format!("+{} `{}`", p["offset"], p["instruction"].as_str().unwrap_or("?"))
        };
        let cell = |k: &str| per_hit_cell(&m.result, k);
        writeln!(
            table,
            "| `{probe}` | {placed} | {} | {} | {} | {} |",
            m.result["hits_per_loop"],
            cell("attached"),
            cell("call-sites"),
            cell("bpftrace")
        )?;
        commands.push(m.command);
    }
    writeln!(md, "{table}")?;
    api_commands(md, "the setup of the five-ways table", &commands)?;
    let (name, setup, stmt) = STATEMENTS[1];
    let m = bench(
        tracer,
        &python,
        &out_root.join("static-stmt-1"),
        setup,
        stmt,
        "default",
        "call-sites,bpftrace,tracemalloc=25",
        effort,
    )?;
    statement_head(md, &format!("### {name} on Debian's python3.11: `{stmt}`"), &m)?;
    row(md, &m.result, "baseline", "nothing attached")?;
    row(md, &m.result, "attached", "tracer attached, all default probes")?;
    row(md, &m.result, "call-sites", "the same with `--placement call-sites`")?;
    row(md, &m.result, "bpftrace", "bpftrace counting the same functions at their entries")?;
    row(md, &m.result, "tracemalloc25", "PYTHONTRACEMALLOC=25")?;
    row(md, &m.result, "detached", "after tracer attached and detached")?;
    writeln!(md)?;
    added_time(md, &m.result)?;
    Ok(())
}

const STATIC_PYTHON: &str = "/usr/bin/python3.11";
