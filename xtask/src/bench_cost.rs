//! `cargo xtask bench`: tracer's own estimate of what it costs the target
//! (`cost.overhead_fraction`, shown while it runs) against the slowdown
//! pyperf measures, side by side in one run: the section and its tables
//! (the runs themselves: `bench_cost_measure`).
//!
//! pyperf times a statement in worker processes it starts, so tracer traces
//! them with `--exe`, and its estimate covers each whole worker: starting
//! the interpreter and importing pyperf (around a million probe hits) as
//! well as the timed loops, which are all pyperf measures. A third kind of
//! chunk, traced with the same options but few loops, measures that fixed
//! part, so the estimate for the timed loops alone is the difference.

#![allow(clippy::cast_precision_loss, reason = "loop and hit counts far below 2^52")]

use std::{fmt::Write as _, path::Path};

use anyhow::Context as _;

use crate::{
    bench_cost_measure::{
        Case, INTERVAL, Measured, NICE, Private, ROUNDS, Summary, TRACED_VALUE_S, VALUES, WARMUPS, measure,
    },
    markdown::{fmt_ns, shell_quote},
};

pub fn cost_section(md: &mut String, tracer: &Path, out_root: &Path) -> anyhow::Result<()> {
    let dir = out_root.join("cost");
    // pyenv's own venv (made by setup, as the production benchmark's):
    // the default pyperf venv is made from whatever `python3` setup found
    // first, Debian's on a PATH without pyenv's shims, which would measure
    // Debian's build twice under two names.
    let pyenv_venv = crate::bench_venvs::pythons()
        .into_iter()
        .find(|p| p.name == crate::bench_venvs::PYENV_3_11)
        .map(|p| p.venv)
        .context("the production benchmark's pyenv 3.11 venv")?;
    let pyenv = Private::new(&pyenv_venv, &dir.join("pyenv"))?;
    let debian = Private::new(&crate::setup::static_pyperf_venv(), &dir.join("debian"))?;
    let json = ("import json; d = {'a': 1, 'b': [1, 2, 3], 'c': 'text'}", "json.loads(json.dumps(d))");
    // Sorting 2,000 ints allocates a few blocks in tens of µs: a low cost,
    // where the estimate is not near its cap.
    let sort = ("t = tuple(range(2000, 0, -1))", "sorted(t)");
    let cases = [
        Case { what: "pyenv 3.11, `sorted(t)` of 2,000 ints", python: &pyenv, setup: sort.0, stmt: sort.1, flags: &[] },
        Case {
            what: "Debian 3.11 (LTO, every copy), `sorted(t)` of 2,000 ints",
            python: &debian,
            setup: sort.0,
            stmt: sort.1,
            flags: &[],
        },
        Case { what: "pyenv 3.11, `[]`", python: &pyenv, setup: "pass", stmt: "[]", flags: &[] },
        Case { what: "pyenv 3.11, JSON round trip", python: &pyenv, setup: json.0, stmt: json.1, flags: &[] },
        Case {
            what: "pyenv 3.11, JSON round trip, `--placement entry`",
            python: &pyenv,
            setup: json.0,
            stmt: json.1,
            flags: &["--placement", "entry"],
        },
        Case { what: "Debian 3.11 (LTO, every copy), `[]`", python: &debian, setup: "pass", stmt: "[]", flags: &[] },
        Case {
            what: "Debian 3.11 (LTO, every copy), JSON round trip",
            python: &debian,
            setup: json.0,
            stmt: json.1,
            flags: &[],
        },
    ];
    let load = crate::markdown::Load::now();
    let (mut shares, mut per_loop) = (String::new(), String::new());
    let mut loops_used = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        eprintln!("xtask: cost: {}", case.what);
        let m = measure(tracer, case, &dir.join(i.to_string()))?;
        loops_used.push(format!("{} loops ({} in the few-loops chunk)", m.loops, m.few_loops));
        let (s, p) = m.rows(case.what);
        shares.push_str(&s);
        per_loop.push_str(&p);
    }
    heading(md)?;
    md.push_str(&shares);
    writeln!(md)?;
    writeln!(
        md,
        "Per loop of the statement, over the loops that differ between each full chunk and its few-loops \
         one: the hits (exact counts, so a whole number where every loop does the same); the CPU time \
         untraced and traced, as the kernel accounts it to pyperf's runner and the worker it reaps \
         (wait4), and traced as tracer read it; the time tracing added, in pyperf's wall time (its traced \
         mean less its untraced mean) and in CPU time; tracer's estimated probe time; and the calibrated \
         cost of a hit the estimate priced them at (mean of the traced chunks' calibrations):\n"
    )?;
    writeln!(
        md,
        "| case | hits per loop | untraced CPU | traced CPU: kernel, tracer | added: wall (pyperf), CPU | estimated probe time | hit cost: emulated, single-stepped |"
    )?;
    writeln!(md, "|---|---|---|---|---|---|---|")?;
    md.push_str(&per_loop);
    writeln!(md)?;
    commands(md, tracer, [&pyenv, &debian], &cases, &loops_used)?;
    writeln!(md, "{}", load.line())?;
    Ok(())
}

fn heading(md: &mut String) -> anyhow::Result<()> {
    writeln!(md, "## The cost tracer shows while it runs, against the slowdown pyperf measures\n")?;
    writeln!(
        md,
        "Every interval and the summary carry `cost.overhead_fraction`: hits times the calibrated CPU cost of \
         a hit where each sits, as a share f of the target's CPU time (docs/cost.md). A share f \
         of a CPU-bound loop's time spent in probes predicts it to run 1/(1 − f) times slower. Here \
         `pyperf timeit` runs each statement untraced and under `tracer attach --exe PYTHON --json`, \
         which traces pyperf's runner and its worker from their start, and tracer's summaries are set \
         against pyperf's means. Each case has {ROUNDS} rounds of four chunks in a rotated order: \
         untraced and traced, each also with few loops; every chunk is one pyperf worker with {VALUES} \
         values after {WARMUPS} warmup, at a fixed `--loops` (a traced value takes about {TRACED_VALUE_S} s). \
         pyperf times in wall time, which on a loaded machine holds the time its worker waited for a CPU \
         (pyperf's nice -20 below does not keep other sessions' work, in cgroups of their own, from \
         taking a share of it), while tracer estimates in CPU time; so the tables give the CPU time the \
         kernel accounted to pyperf's processes beside pyperf's figures.\n"
    )?;
    writeln!(
        md,
        "tracer's estimate covers whole processes: pyperf's runner, and each worker's start (the \
         interpreter's own and pyperf's imports, about a million probe hits) and exit as well as the timed \
         loops, which are all pyperf times. So the table gives two shares: the whole run's, which is what \
         a user of `tracer attach` reads, and the timed loops', which is the traced chunk's estimated \
         probe time and CPU time less the few-loops chunk's (same workers, values and warmups), the \
         per-loop difference over the loops that differ. Every attach calibrates the cost of a hit anew, \
         and two calibrations differ by up to about 15% here, so the few-loops chunk's hits (by probe, \
         priced by the kind of its sites as tracer prices them) are priced at the traced chunk's \
         calibration, as the traced chunk priced its own start; the traced chunk's hits priced so \
         come to its summary's `tracer_cpu_s`, which the benchmark checks. That second share is the one to set against \
         pyperf. A probe with an entry and inlined copies of both kinds counts its hits at the \
         single-stepped ones apart (`stepped_hits`) and is priced hit by hit; where a probe's sites are \
         of both kinds otherwise the estimate is a range (`overhead_fraction_low` prices every such hit \
         emulated). The measured share in parentheses, 1 − 1/slowdown, is the share of the traced \
         loop's time that tracing added, to set against f where 1/(1 − f) is ill-conditioned (near a \
         share of 1, where a few percent of f make a factor of several in the prediction). \"Unpriced\" is the share of \
         the traced chunks' hits that tracer could not pair with a CPU time (`cost.unpriced_hits`); a \
         process started after the attach is priced to its end from the kernel's exit records (docs/cost.md), \
         so pyperf's runner and worker leave none unless those records were lost. The whole-run share is \
         capped at 1; the timed loops' is a difference of two estimates, and can pass 1 where the \
         estimate's probe time passes the CPU time it ran on.\n"
    )?;
    writeln!(
        md,
        "| case | untraced (pyperf) | traced (pyperf) | measured slowdown (share) | in CPU time (share) | \
         f, whole run | f, timed loops | predicted 1/(1 − f) | unpriced |"
    )?;
    writeln!(md, "|---|---|---|---|---|---|---|---|---|")?;
    Ok(())
}

fn commands(
    md: &mut String,
    tracer: &Path,
    [pyenv, debian]: [&Private; 2],
    cases: &[Case<'_>],
    loops_used: &[String],
) -> anyhow::Result<()> {
    writeln!(
        md,
        "Other processes on this machine run the same interpreters, and `--exe` would trace them too, so \
         each build runs from a private copy of its image, mapped by pyperf's processes alone: pyenv's \
         libpython copied to `{}`, which `LD_LIBRARY_PATH` (passed on to pyperf's workers with \
         `--inherit-environ`) puts before the interpreter's RUNPATH, and Debian's static `python3.11` \
         copied into a venv of its own, `{}`, that shares the setup venv's `lib` (pyperf). pyperf's workers \
         show `/proc/PID/exe` as the real interpreter behind the venv's symlink; `--exe` takes the venv's \
         `bin/python`, the interpreter, or a libpython itself. Untraced chunks run the same copies. \
         Commands, with PYTHON the venv's interpreter (`{}`, or the private venv's for Debian's 3.11), EXE \
         the copy (`{}` or `{}`), and FILE each chunk kind's own pyperf file (`--append`). pyperf runs at \
         nice {NICE}, so that other load on the machine seldom keeps its worker waiting for a CPU, which \
         its wall-clock timings would count and tracer's CPU-time estimate not:\n",
        pyenv.env.as_ref().map_or_else(String::new, |(_, dir)| dir.display().to_string()),
        debian.python.parent().and_then(Path::parent).map_or_else(String::new, |d| d.display().to_string()),
        pyenv.python.display(),
        pyenv.exe.display(),
        debian.exe.display(),
    )?;
    writeln!(md, "```")?;
    writeln!(md, "sudo {} attach --exe EXE --json --interval {INTERVAL} [FLAGS]", tracer.display())?;
    writeln!(
        md,
        "[LD_LIBRARY_PATH=DIR] nice -n {NICE} PYTHON -m pyperf timeit --quiet --append FILE --processes 1 --values {VALUES} --warmups {WARMUPS} --loops LOOPS [--inherit-environ LD_LIBRARY_PATH] --setup SETUP -- STMT"
    )?;
    writeln!(md, "```\n")?;
    writeln!(md, "| case | SETUP | STMT | FLAGS | LOOPS |\n|---|---|---|---|---|")?;
    for (case, loops) in cases.iter().zip(loops_used) {
        writeln!(
            md,
            "| {} | `{}` | `{}` | {} | {loops} |",
            case.what,
            shell_quote(case.setup),
            shell_quote(case.stmt),
            if case.flags.is_empty() { "—".to_owned() } else { format!("`{}`", case.flags.join(" ")) }
        )?;
    }
    writeln!(md)?;
    Ok(())
}

impl Measured {
    /// This case's row in the table of shares and in the table per loop.
    fn rows(&self, what: &str) -> (String, String) {
        let slowdown = self.traced.mean / self.untraced.mean;
        let sum = |v: &[Summary], f: fn(&Summary) -> f64| v.iter().map(f).sum::<f64>();
        let mean = |v: &[Summary], f: fn(&Summary) -> f64| sum(v, f) / v.len().max(1) as f64;
        let loops_differing =
            (self.loops - self.few_loops) as f64 * f64::from(VALUES + WARMUPS) * self.full.len() as f64;
        let all_hits = |s: &Summary| (s.hits + s.unpriced) as f64;
        let hits_per_loop = (sum(&self.full, all_hits) - sum(&self.few, all_hits)) / loops_differing;
        let whole = range(mean(&self.full, |s| s.fraction_low), mean(&self.full, |s| s.fraction));
        let cpu = sum(&self.full, |s| s.target_cpu_s) - sum(&self.few, |s| s.target_cpu_s);
        // Each round's two traced chunks calibrate anew, and differ by up
        // to about 15% here: the few-loops chunk's hits, mostly the
        // workers' start, are priced at the traced chunk's calibration, as
        // the traced chunk priced its own start.
        let (probes_high, probes_low) = self.full.iter().zip(&self.few).fold((0.0, 0.0), |(high, low), (full, few)| {
            let ((fh, fl), (sh, sl)) = (full.priced_at(full), few.priced_at(full));
            (high + fh - sh, low + fl - sl)
        });
        let (f_high, f_low) = (probes_high / cpu, probes_low / cpu);
        let loops_f = range(f_low, f_high);
        let predicted = if (f_high - f_low).abs() < 5e-4 {
            predicted(f_high)
        } else {
            format!("{}–{}", predicted(f_low), predicted(f_high))
        };
        let unpriced = sum(&self.full, |s| s.unpriced as f64) / sum(&self.full, all_hits);
        let most = self.full.iter().chain(&self.few).map(|s| s.processes).max().unwrap_or(0);
        // pyperf's runner and its one worker; more would be processes they
        // started, counted too.
        let others = if most > 2 { format!(" ({most} processes traced)") } else { String::new() };
        let cpu_untraced = (self.cpu.untraced - self.cpu.untraced_few) / loops_differing;
        let cpu_traced = (self.cpu.traced - self.cpu.few) / loops_differing;
        let cpu_slowdown = cpu_traced / cpu_untraced;
        let shares = format!(
            "| {what} | {} | {} | {slowdown:.2}x ({:.1}%) | {cpu_slowdown:.2}x ({:.1}%) | {whole} | {loops_f} | {predicted} | {:.1}%{others} |\n",
            self.untraced.formatted.replace("+-", "±"),
            self.traced.formatted.replace("+-", "±"),
            (1.0 - 1.0 / slowdown) * 100.0,
            (1.0 - 1.0 / cpu_slowdown) * 100.0,
            unpriced * 100.0,
        );
        let per_loop = |seconds: f64| fmt_ns(seconds / loops_differing * 1e9);
        let estimated = if (probes_high - probes_low) / loops_differing * 1e9 < 0.5 {
            per_loop(probes_high)
        } else {
            format!("{}–{}", per_loop(probes_low), per_loop(probes_high))
        };
        let per_loop = format!(
            "| {what} | {hits_per_loop:.1} | {} | {}, {} | {}, {} | {estimated} | {:.0} ns, {:.0} ns |\n",
            fmt_ns(cpu_untraced * 1e9),
            fmt_ns(cpu_traced * 1e9),
            per_loop(cpu),
            fmt_ns((self.traced.mean - self.untraced.mean) * 1e9),
            fmt_ns((cpu_traced - cpu_untraced) * 1e9),
            mean(&self.full, |s| s.emulated_ns),
            mean(&self.full, |s| s.single_stepped_ns),
        );
        (shares, per_loop)
    }
}

/// A share or a range of shares, in percent.
fn range(low: f64, high: f64) -> String {
    if (high - low).abs() < 5e-4 {
        format!("{:.1}%", high * 100.0)
    } else {
        format!("{:.1}%–{:.1}%", low * 100.0, high * 100.0)
    }
}

/// The slowdown predicted for a share `f` of the target's CPU in probes.
fn predicted(f: f64) -> String {
    if f >= 1.0 {
        "none (f ≥ 100%)".to_owned()
    } else if f >= 0.999 {
        "over 1000x".to_owned()
    } else {
        format!("{:.2}x", 1.0 / (1.0 - f))
    }
}
