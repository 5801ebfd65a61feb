//! `cargo xtask bench`: reading allocators' return values (`--returns`):
//! the three ways timed at start, each build's plan, and what reading
//! returns adds per allocating call.

use std::{fmt::Write as _, path::Path, process::Command};

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::{
    bench_measure::{API_SETUP, bench, probe_plans, row},
    markdown::shell_quote,
};

/// `--returns`: the three ways to read a return value timed on tracer's own
/// function, each build's plan, and what reading returns adds per call.
pub fn returns_section(
    md: &mut String,
    tracer: &Path,
    python: &Path,
    out_root: &Path,
    effort: &str,
) -> anyhow::Result<()> {
    writeln!(md, "## Reading allocators' return values (`--returns`)\n")?;
    writeln!(
        md,
        "At start, `--returns` times three ways of reading a return value on `tracer_return_point`, a small assembly function in tracer itself (`push %rbx; mov %rdi,%rax; jmp 1f; int3; 1: pop %rbx; ret`), and checks that each one read every returned value right: a uretprobe (its entry is an emulated `push`), a uprobe on the `ret` (single-stepped), and a uprobe on the `jmp` into the epilogue, where rax already holds the result (emulated). Each function then gets the cheapest way that sees all its returns. Any function that can leave through a tail call or a jump to a split-off `.cold` part gets a uretprobe.\n"
    )?;
    return_plans(md, tracer)?;
    let m = bench(tracer, python, &out_root.join("returns"), API_SETUP, "body()", "alloc", "returns", effort)?;
    let r = &m.result;
    let allocating: f64 = r["hits_per_loop_by_probe"].as_object().map_or(f64::NAN, |o| {
        o.iter().filter(|(k, _)| k.ends_with("alloc") || k.ends_with("Malloc")).filter_map(|(_, v)| v.as_f64()).sum()
    });
    let mean = |k: &str| r[k]["mean_ns"].as_f64().unwrap_or(f64::NAN);
    writeln!(
        md,
        "\nWhat reading returns adds per allocating call, with the default venv's interpreter under pyperf (`body()` as in the five-ways table; the command names it):\n"
    )?;
    writeln!(md, "```\n{}\n```\n", m.command.replace(&shell_quote(API_SETUP), "\"$API_SETUP\""))?;
    writeln!(md, "| setup | mean per loop | vs baseline | cost per probe hit |\n|---|---|---|---|")?;
    row(md, r, "baseline", "nothing attached")?;
    let allocators = probe_plans(tracer, python, "alloc", "auto")?;
    row(md, r, "attached", &format!("tracer, the {} allocator probes", allocators.len()))?;
    row(md, r, "returns", "the same with `--returns`")?;
    writeln!(
        md,
        "\n{allocating:.0} allocating calls per loop; reading their returns added {:.2} µs per call ((returns − attached) / calls).\n",
        (mean("returns") - mean("attached")) / allocating / 1e3
    )?;
    // Why it costs what it does, said only when this build's plans show it.
    let plans = allocating_plans(tracer, python)?;
    let at_entry = probe_plans(tracer, python, "alloc", "entry")?;
    let all_uretprobes = plans.iter().all(|p| p["returns"]["how"] == "uretprobe");
    let counted_after_entry = plans.iter().all(|p| p["offset"].as_u64().is_some_and(|o| o > 0));
    let entries_stepped =
        plans.iter().all(|p| at_entry.iter().any(|e| e["symbol"] == p["symbol"] && e["emulated"] == false));
    if !plans.is_empty() && all_uretprobes && counted_after_entry && entries_stepped {
        writeln!(
            md,
            "Every allocator function here needs a uretprobe, and in this build the counting probe sits after the entry, on an emulated instruction. So the uretprobe adds a second breakpoint at the entry, which is single-stepped, and that trap, not the uretprobe's return, is most of the cost. The cheap way for this build would be to probe the functions behind the allocator table (`_PyObject_Malloc` and the others, which `ret`) and pair each return with its caller's entry per thread; that is left for live-memory tracking.\n"
        )?;
    }
    Ok(())
}

/// The plans `tracer probes --returns` makes for the functions of
/// `python` that return a pointer (the frees return nothing).
fn allocating_plans(tracer: &Path, python: &Path) -> anyhow::Result<Vec<Value>> {
    let out = Command::new(tracer)
        .args(["probes", "--exe"])
        .arg(python)
        .args(["--probes", "alloc", "--returns", "--json"])
        .output()
        .context("running tracer probes --returns")?;
    if !out.status.success() {
        bail!("tracer probes --returns failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let v: Value = serde_json::from_slice(&out.stdout)?;
    Ok(v["probes"].as_array().into_iter().flatten().filter(|p| !p["returns"].is_null()).cloned().collect())
}

/// The calibrated costs of the three ways, three runs per build, and what
/// each allocating function got.
fn return_plans(md: &mut String, tracer: &Path) -> anyhow::Result<()> {
    let mut table =
        String::from("| build | calibration run | uretprobe | ret | jmp into epilogue |\n|---|---|---|---|---|\n");
    let mut plans = String::new();
    let real = crate::real_python3()?;
    for (build, exe) in [
        ("pyenv 3.11 (shared libpython)", real.as_path()),
        ("Debian 3.11 (static, LTO)", Path::new("/usr/bin/python3.11")),
    ] {
        let args = ["probes", "--exe", &exe.display().to_string(), "--probes", "alloc", "--returns", "--json"]
            .map(String::from);
        writeln!(md, "```\nsudo tracer {}\n```\n", args.join(" "))?;
        for run in 1..=3 {
            let out = Command::new(tracer).args(&args).output().context("running tracer probes --returns")?;
            if !out.status.success() {
                bail!("tracer probes --returns failed: {}", String::from_utf8_lossy(&out.stderr));
            }
            let v: Value = serde_json::from_slice(&out.stdout)?;
            let c = &v["return_costs_ns"];
            let ns = |k: &str| c[k].as_f64().map_or_else(|| "—".to_owned(), |n| format!("{n:.0} ns"));
            writeln!(table, "| {build} | {run} | {} | {} | {} |", ns("uretprobe"), ns("ret"), ns("placed"))?;
            if run == 1 {
                writeln!(plans, "\n{build}:\n")?;
                for p in v["probes"].as_array().into_iter().flatten().filter(|p| !p["returns"].is_null()) {
                    let r = &p["returns"];
                    writeln!(
                        plans,
                        "- `{}`: {} ({})",
                        p["symbol"].as_str().unwrap_or("?"),
                        r["how"].as_str().unwrap_or("?"),
                        r["reason"].as_str().unwrap_or("")
                    )?;
                }
            }
        }
    }
    writeln!(md, "{table}")?;
    writeln!(md, "What each allocating function got:{plans}")?;
    Ok(())
}
