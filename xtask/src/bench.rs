//! `cargo xtask bench`: the benchmark suite behind BENCHMARKS.md.
//!
//! Every figure comes from one command, printed beside it; within a
//! command the setups are measured side by side, interleaved by `tracer
//! bench` (rounds in rotated order), so a ratio never compares runs from
//! different moments.

use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::{
    bench_budget::budget_accuracy,
    bench_measure::{STATEMENTS, added_time, bench, probe_plans, row, statement_head},
    bench_per_hit::{per_hit, static_section},
    bench_returns::returns_section,
};

pub fn run(root: &Path, tracer: &Path, effort: &str, tracer_args: &[String]) -> anyhow::Result<()> {
    let python = crate::setup::pyperf_venv().join("bin").join("python");
    let out_root = root.join("target").join("bench");
    let started = Instant::now();
    let mut md = String::new();
    let date = Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())?;
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned()))
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    writeln!(md, "# Benchmarks\n")?;
    // The summary is kept by hand, each figure copied from a section: a
    // full run keeps it as it was, to be brought up to date from the new
    // sections.
    md.push_str(&kept_summary(&root.join("BENCHMARKS.md")));
    writeln!(
        md,
        "Written by `cargo xtask bench --effort {effort}` on {date}: Linux {}, {cpu}, {cores} cores. \
         Each table comes from the command above it; rerun that command to reproduce its ratios \
         (absolute times vary from machine to machine; on this VM a uprobe hit is far slower than \
         on bare metal). Within a command every setup is measured side by side: `tracer bench` runs \
         pyperf in rounds, each round visiting every setup in a rotated order, so drift of the \
         machine spreads evenly over all of them.\n",
        kernel.trim()
    )?;

    // 1. The cost of one probe hit.
    per_hit(&mut md, tracer, &python, &out_root, effort)?;

    // 2. Statements under tracer, tracemalloc and after detaching.
    let defaults = probe_plans(tracer, &python, "default", "auto")?.len();
    writeln!(md, "## Statements under tracer (default probes), bpftrace, tracemalloc, and after detaching\n")?;
    for (i, (name, setup, stmt)) in STATEMENTS.iter().enumerate() {
        let m = bench(
            tracer,
            &python,
            &out_root.join(format!("stmt-{i}")),
            setup,
            stmt,
            "default",
            "call-sites,bpftrace,tracemalloc=1,tracemalloc=25,budget=1",
            effort,
        )?;
        statement_head(&mut md, &format!("### {name}: `{stmt}`"), &m)?;
        row(&mut md, &m.result, "baseline", "nothing attached")?;
        row(&mut md, &m.result, "attached", &format!("tracer attached, all {defaults} default probes"))?;
        row(&mut md, &m.result, "call-sites", "the same with `--placement call-sites` (`_Py_Dealloc` at its callers)")?;
        row(
            &mut md,
            &m.result,
            "bpftrace",
            &format!("bpftrace counting the same {defaults} functions at their entries"),
        )?;
        row(&mut md, &m.result, "tracemalloc1", "PYTHONTRACEMALLOC=1")?;
        row(&mut md, &m.result, "tracemalloc25", "PYTHONTRACEMALLOC=25")?;
        row(&mut md, &m.result, "budget1", "`tracer attach --exe … --budget 1` (duty-cycled windows)")?;
        row(&mut md, &m.result, "detached", "after tracer attached and detached")?;
        writeln!(md)?;
        added_time(&mut md, &m.result)?;
    }

    // 3. The same on Debian's static, LTO-built interpreter.
    static_section(&mut md, tracer, &out_root, effort)?;

    // 3b. Debian's LTO builds, 3.11, 3.13 and 3.14, with every inlined copy.
    crate::lto::lto_section(&mut md, tracer, effort)?;

    // 3b'. pyenv's frees at their implementations, against the floor.
    crate::bench_frees::frees_section(&mut md, tracer, effort)?;

    // 3c. The cost tracer estimates while it runs, against the slowdown.
    crate::bench_cost::cost_section(&mut md, tracer, &out_root)?;

    // 3d. What recording Python stacks adds per event.
    crate::bench_stacks::stacks_section(&mut md, tracer, effort, &[])?;

    // 3e. What the memory features add per event.
    crate::bench_features::features_section(&mut md, tracer, effort)?;

    // 3f. What live memory adds per allocator call, apart from its returns.
    crate::bench_live::live_section(&mut md, tracer, effort, &[])?;

    // 3g. What tracer, tracemalloc and memray cost pyperformance's benchmarks.
    crate::bench_production::production_section(&mut md, tracer, effort, tracer_args, &out_root)?;
    crate::bench_census::census_section(&mut md, tracer, effort)?;

    // 4. --budget estimates against full counts of the same process.
    budget_accuracy(&mut md, tracer)?;
    // 4b. What the windows cost the target, against their price.
    crate::bench_window_price::window_price_section(&mut md, root, tracer, effort)?;

    // 5. Reading allocators' return values.
    returns_section(&mut md, tracer, &python, &out_root, effort)?;

    // 5b. The soak is `cargo xtask soak`'s (20 minutes): kept as it was.
    md.push_str(&crate::soak::kept(&root.join("BENCHMARKS.md")));

    // 6. tracer's own footprint.
    let (command, own) = footprint(root, tracer)?;
    writeln!(md, "## tracer's own cost while attached\n")?;
    writeln!(md, "```\n{command}\n```\n")?;
    writeln!(
        md,
        "Attached to the demo workload (demo/workload.py, busy) for {:.0} s at a 1 s interval, all default probes.\n",
        own.wall.as_secs_f64()
    )?;
    writeln!(md, "| measure | value |\n|---|---|")?;
    writeln!(md, "| start to all probes live (the `attached` line) | {:.0} ms |", own.to_attached.as_secs_f64() * 1e3)?;
    writeln!(
        md,
        "| tracer CPU time (user + system) | {:.3} s ({:.2}% of one core) |",
        own.cpu.as_secs_f64(),
        own.cpu.as_secs_f64() / own.wall.as_secs_f64() * 100.0
    )?;
    writeln!(md, "| tracer peak resident memory | {} KiB |", own.max_rss_kib)?;
    writeln!(md, "| probe hits counted | {} |", own.hits)?;
    writeln!(md, "\nThe uprobe hits themselves are paid by the target (section 1), not by tracer.\n")?;
    writeln!(md, "The whole suite took {:.0} s.", started.elapsed().as_secs_f64())?;
    std::fs::write(root.join("BENCHMARKS.md"), md).context("writing BENCHMARKS.md")?;
    eprintln!("xtask: wrote BENCHMARKS.md");
    Ok(())
}

/// The `## Summary` section of the BENCHMARKS.md at `path`, up to the
/// next section or the "Written by" paragraph; empty where there is none.
fn kept_summary(path: &Path) -> String {
    crate::markdown::kept_section(path, "## Summary\n", Some("\nWritten by "))
}

struct Footprint {
    wall: Duration,
    to_attached: Duration,
    cpu: Duration,
    max_rss_kib: i64,
    hits: u64,
}

/// Runs `tracer attach` on the demo workload and reads its rusage.
fn footprint(root: &Path, tracer: &Path) -> anyhow::Result<(String, Footprint)> {
    let python = crate::real_python3()?;
    let mut workload = Command::new(&python)
        .arg(root.join("demo").join("workload.py"))
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the demo workload")?;
    let result = (|| {
        let mut line = String::new();
        BufReader::new(workload.stdout.take().context("stdout")?).read_line(&mut line)?;
        let pid = workload.id().to_string();
        let args = ["attach", "--exact", "--pid", &pid, "--interval", "1", "--duration", "10", "--json"];
        let command = format!("sudo tracer {}", args.join(" ").replace(&pid, "$(pgrep -f demo/workload.py)"));
        eprintln!("xtask: $ {command}");
        let start = Instant::now();
        let mut child = Command::new(tracer).args(args).stdout(Stdio::piped()).stderr(Stdio::null()).spawn()?;
        let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
        let first = lines.next().context("tracer printed nothing")??;
        let to_attached = start.elapsed();
        if !first.contains("\"attached\"") {
            bail!("unexpected first line: {first}");
        }
        let last = lines.map_while(Result::ok).last().context("no summary")?;
        let summary: Value = serde_json::from_str(&last)?;
        let hits = summary["probes"].as_object().map_or(0, |p| p.values().filter_map(|v| v["calls"].as_u64()).sum());
        let (cpu, max_rss_kib) = crate::bench_census::wait_rusage(&mut child)?;
        Ok((command, Footprint { wall: start.elapsed(), to_attached, cpu, max_rss_kib, hits }))
    })();
    let _ = workload.kill();
    let _ = workload.wait();
    result
}

#[cfg(test)]
mod tests {
    /// A full run keeps the hand-kept summary, and only it: not the
    /// "Written by" paragraph nor the sections after it.
    #[test]
    fn the_summary_is_kept_and_nothing_else() {
        let dir = std::env::temp_dir().join(format!("xtask-summary-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("BENCHMARKS.md");
        std::fs::write(
            &path,
            "# Benchmarks\n\n## Summary\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nWritten by x.\n\n## Cost\n\nold\n",
        )
        .unwrap();
        assert_eq!(super::kept_summary(&path), "## Summary\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n");
        std::fs::write(&path, "# Benchmarks\n\n## Summary\n\nrow\n## Cost\n").unwrap();
        assert_eq!(super::kept_summary(&path), "## Summary\n\nrow\n\n");
        std::fs::write(&path, "# Benchmarks\n\n## Cost\n").unwrap();
        assert_eq!(super::kept_summary(&path), "");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
