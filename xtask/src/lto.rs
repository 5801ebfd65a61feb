//! `cargo xtask bench --only lto`: Debian's LTO-built interpreters (3.11 on
//! the host, 3.13 and 3.14 in the forky root), whose probed functions were
//! inlined hundreds of times: how many sites tracer probes, how long it takes
//! to make them all live, and what a hit costs where they were placed.
//!
//! pyperf is not in the forky root and its workers cannot run there, so the
//! timing is a small harness (harness.py) in one long-lived process per
//! setup; the setups take turns in rounds of rotated order, as `tracer
//! bench` does.

#![allow(clippy::cast_precision_loss, reason = "loop and hit counts far below 2^52")]

use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader, Lines, Write as _},
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde_json::Value;

const HARNESS: &str = include_str!("harness.py");
/// The harness's path inside each root (host and forky).
const HARNESS_PATH: &str = "/tmp/tracer-bench-harness.py";
const FORKY: &str = "/var/lib/tracer/forky";

/// (name, root, interpreter inside the root).
const BUILDS: [(&str, Option<&str>, &str); 3] = [
    ("Debian 12 python3.11", None, "/usr/bin/python3.11"),
    ("Debian forky python3.13", Some(FORKY), "/usr/bin/python3.13"),
    ("Debian forky python3.14", Some(FORKY), "/usr/bin/python3.14"),
];

/// (name, setup, stmt).
const STATEMENTS: [(&str, &str, &str); 2] = [
    ("JSON round trip", "import json; d = {'a': 1, 'b': [1, 2, 3], 'c': 'text'}", "json.loads(json.dumps(d))"),
    ("empty list", "pass", "[]"),
];

/// The setups, in the order of the tables' rows. `empty` is the program
/// that does nothing at tracer's very sites (`TRACER_BENCH_PROGRAM=empty`):
/// the kernel's floor there.
const SETUPS: [&str; 5] = ["baseline", "tracer", "bpftrace", "tracemalloc25", "empty"];

/// One harness process.
pub(crate) struct Harness {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Harness {
    pub(crate) fn start(
        root: Option<&str>,
        python: &str,
        setup: &str,
        stmt: &str,
        tracemalloc: bool,
    ) -> anyhow::Result<Self> {
        let env: &[(&str, &str)] = if tracemalloc { &[("PYTHONTRACEMALLOC", "25")] } else { &[] };
        Self::start_with(root, python, (setup, stmt), env)
    }

    /// [`Harness::start`] with `env` in the interpreter's environment
    /// (`PYTHONMALLOC=debug`, for one).
    pub(crate) fn start_with(
        root: Option<&str>,
        python: &str,
        (setup, stmt): (&str, &str),
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let mut cmd = match root {
            Some(r) => {
                let mut c = Command::new("/usr/sbin/chroot");
                c.arg(r).arg(python);
                c
            }
            None => Command::new(python),
        };
        cmd.args([HARNESS_PATH, setup, stmt]).stdin(Stdio::piped()).stdout(Stdio::piped());
        cmd.envs(env.iter().copied());
        let mut child = cmd.spawn().with_context(|| format!("starting the harness under {python}"))?;
        let stdin = child.stdin.take().context("stdin")?;
        let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
        let first = lines.next().context("the harness printed nothing")??;
        if first != "ready" {
            bail!("the harness printed {first:?}");
        }
        Ok(Self { child, stdin, lines })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Seconds per loop over `n` loops.
    pub(crate) fn time(&mut self, n: u64) -> anyhow::Result<f64> {
        writeln!(self.stdin, "{n}")?;
        self.stdin.flush()?;
        let line = self.lines.next().context("the harness stopped")??;
        line.trim().parse().with_context(|| format!("harness printed {line:?}"))
    }

    /// Times the statement for about `target` seconds, `values` times after
    /// a calibration; returns (mean seconds per loop of the values, loops
    /// run in all, including the calibration's).
    fn measure(&mut self, target: f64, values: u32) -> anyhow::Result<(f64, u64)> {
        let mut n = 10;
        let mut loops = 0;
        let per_loop = loop {
            let t = self.time(n)?;
            loops += n;
            if t * n as f64 >= 0.02 || n >= 1 << 30 {
                break t;
            }
            n *= 4;
        };
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a positive loop count")]
        let n = ((target / per_loop) as u64).max(1);
        let mut sum = 0.0;
        for _ in 0..values {
            sum += self.time(n)?;
            loops += n;
        }
        Ok((sum / f64::from(values), loops))
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn interrupt(child: &Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill with a valid signal on our own child.
        unsafe { libc::kill(pid, libc::SIGINT) };
    }
}

/// Writes the harness where [`Harness::start`] runs it, on the host and in
/// the forky root.
pub(crate) fn install_harness() -> anyhow::Result<()> {
    std::fs::write(HARNESS_PATH, HARNESS).context("writing the harness")?;
    if Path::new(FORKY).is_dir() {
        std::fs::write(format!("{FORKY}{HARNESS_PATH}"), HARNESS).context("writing the harness into the forky root")?;
    }
    Ok(())
}

/// The host path of an interpreter inside a root.
fn host_path(root: Option<&str>, python: &str) -> String {
    root.map_or_else(|| python.to_owned(), |r| format!("{r}{python}"))
}

fn harness_command(root: Option<&str>, python: &str) -> String {
    match root {
        Some(r) => format!("/usr/sbin/chroot {r} {python} {HARNESS_PATH} \"$SETUP\" \"$STMT\""),
        None => format!("{python} {HARNESS_PATH} \"$SETUP\" \"$STMT\""),
    }
}

/// The bpftrace script counting `symbols` at their entries in `image`, in
/// process `pid` only.
fn bpftrace_script(image: &str, symbols: &[String], pid: &str) -> String {
    let probes: Vec<String> = symbols.iter().map(|s| format!("uprobe:{image}:{s}")).collect();
    format!("{} /pid == {pid}/ {{ @[probe] = count(); }}", probes.join(","))
}

/// What `tracer probes --pid PID --json` plans for a process.
struct Sites {
    probes: Vec<String>,
    /// Out-of-line functions + inlined copies probed + call sites.
    total: u64,
    inline: u64,
    inline_emulated: u64,
    inline_gated: u64,
    entries_emulated: u64,
}

fn sites(tracer: &Path, pid: u32) -> anyhow::Result<Sites> {
    let out = Command::new(tracer)
        .args(["probes", "--pid", &pid.to_string(), "--json"])
        .output()
        .context("running tracer probes")?;
    if !out.status.success() {
        bail!("tracer probes --pid failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let v: Value = serde_json::from_slice(&out.stdout).context("tracer probes --json")?;
    let mut s =
        Sites { probes: Vec::new(), total: 0, inline: 0, inline_emulated: 0, inline_gated: 0, entries_emulated: 0 };
    for p in v["probes"].as_array().into_iter().flatten() {
        s.probes.push(p["symbol"].as_str().unwrap_or("?").to_owned());
        let c = &p["coverage"];
        s.total += 1 + c["inlined_probed"].as_u64().unwrap_or(0) + c["call_sites"].as_u64().unwrap_or(0);
        s.inline += p["inline_sites"].as_array().map_or(0, |a| a.len() as u64);
        s.inline_emulated += p["inline_sites_emulated"].as_u64().unwrap_or(0);
        s.inline_gated += p["inline_sites_gated"].as_u64().unwrap_or(0);
        s.entries_emulated += u64::from(p["emulated"].as_bool() == Some(true));
    }
    Ok(s)
}

/// Starts `tracer attach --pid PID --json --interval 3600` (with `env`) and
/// waits for its `attached` line; returns the child, the time it took and
/// that line.
fn attach(
    tracer: &Path,
    pid: u32,
    env: &[(&str, &str)],
) -> anyhow::Result<(Child, Duration, Lines<BufReader<ChildStdout>>, Value)> {
    let start = Instant::now();
    let mut child = Command::new(tracer)
        .args(["attach", "--exact", "--pid", &pid.to_string(), "--json", "--interval", "3600"])
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting tracer attach")?;
    let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
    let first = lines.next().context("tracer attach printed nothing")??;
    let took = start.elapsed();
    let v: Value = serde_json::from_str(&first).context("tracer attach's first line")?;
    if v["type"] != "attached" {
        bail!("tracer attach printed {first}");
    }
    Ok((child, took, lines, v))
}

/// Stops a `tracer attach` and sums its summary's hits: the calls, and the
/// passes through gates that went elsewhere (`gate_other`), which hit the
/// probe as well.
fn detach(mut child: Child, lines: Lines<BufReader<ChildStdout>>) -> anyhow::Result<u64> {
    interrupt(&child);
    let last = lines.map_while(Result::ok).last().context("tracer attach printed no summary")?;
    child.wait()?;
    let v: Value = serde_json::from_str(&last)?;
    let calls: u64 = v["probes"].as_object().map_or(0, |p| p.values().filter_map(|x| x["calls"].as_u64()).sum());
    Ok(calls + v["stats"]["gate_other"].as_u64().unwrap_or(0))
}

/// Sites probed by an `attached` line: 1 + inlined copies probed + call
/// sites, per probe.
fn attached_sites(v: &Value) -> u64 {
    v["coverage"].as_object().map_or(0, |c| {
        c.values().map(|p| 1 + p["inlined_probed"].as_u64().unwrap_or(0) + p["call_sites"].as_u64().unwrap_or(0)).sum()
    })
}

/// One setup's per-visit means (seconds per loop) and hits per loop.
#[derive(Default)]
struct Series {
    means: Vec<f64>,
    hits: u64,
    loops: u64,
}

impl Series {
    fn mean(&self) -> f64 {
        self.means.iter().sum::<f64>() / self.means.len() as f64
    }

    fn stdev(&self) -> f64 {
        let m = self.mean();
        let n = self.means.len() as f64;
        if n < 2.0 {
            return 0.0;
        }
        (self.means.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    }

    fn hits_per_loop(&self) -> Option<f64> {
        (self.loops > 0).then(|| self.hits as f64 / self.loops as f64)
    }
}

/// bpftrace's counts from its output at exit: `@[uprobe:…]: N` lines.
fn bpftrace_counts(text: &str) -> u64 {
    text.lines().filter(|l| l.starts_with("@[")).filter_map(|l| l.rsplit(": ").next()?.trim().parse::<u64>().ok()).sum()
}

/// One statement on one build, every setup in `rounds` rotated rounds.
fn measure_statement(
    tracer: &Path,
    (root, python): (Option<&str>, &str),
    (setup, stmt): (&str, &str),
    symbols: &[String],
    (rounds, values, target): (usize, u32, f64),
) -> anyhow::Result<Vec<Series>> {
    let mut plain = Harness::start(root, python, setup, stmt, false)?;
    let mut with_tracemalloc = Harness::start(root, python, setup, stmt, true)?;
    let image = host_path(root, python);
    let mut series: Vec<Series> = SETUPS.iter().map(|_| Series::default()).collect();
    for round in 0..rounds {
        for k in 0..SETUPS.len() {
            let i = (round + k) % SETUPS.len();
            eprintln!("xtask: lto {python} `{stmt}` round {}: {}", round + 1, SETUPS[i]);
            match SETUPS[i] {
                "baseline" => series[i].means.push(plain.measure(target, values)?.0),
                "tracemalloc25" => series[i].means.push(with_tracemalloc.measure(target, values)?.0),
                "empty" => {
                    let (child, _, lines, _) = attach(tracer, plain.pid(), &[("TRACER_BENCH_PROGRAM", "empty")])?;
                    let (mean, loops) = plain.measure(target, values)?;
                    detach(child, lines)?;
                    series[i].means.push(mean);
                    series[i].loops += loops;
                }
                "tracer" => {
                    let (child, _, lines, _) = attach(tracer, plain.pid(), &[])?;
                    let (mean, loops) = plain.measure(target, values)?;
                    let hits = detach(child, lines)?;
                    series[i].means.push(mean);
                    series[i].hits += hits;
                    series[i].loops += loops;
                }
                _ => {
                    let script = bpftrace_script(&image, symbols, &plain.pid().to_string());
                    let mut child = Command::new("bpftrace")
                        .args(["-e", &script])
                        .stdout(Stdio::piped())
                        .stderr(Stdio::null())
                        .spawn()
                        .context("starting bpftrace")?;
                    let mut out = BufReader::new(child.stdout.take().context("stdout")?);
                    let mut line = String::new();
                    while !line.starts_with("Attaching") {
                        line.clear();
                        if out.read_line(&mut line)? == 0 {
                            bail!("bpftrace exited before attaching");
                        }
                    }
                    // bpftrace prints "Attaching N probes..." before attaching.
                    std::thread::sleep(Duration::from_secs(2));
                    let (mean, loops) = plain.measure(target, values)?;
                    interrupt(&child);
                    let mut rest = String::new();
                    std::io::Read::read_to_string(&mut out, &mut rest)?;
                    child.wait()?;
                    series[i].means.push(mean);
                    series[i].hits += bpftrace_counts(&rest);
                    series[i].loops += loops;
                }
            }
        }
    }
    Ok(series)
}

fn fmt_s(s: f64) -> String {
    crate::markdown::fmt_ns(s * 1e9)
}

/// Writes the section.
#[allow(clippy::too_many_lines, reason = "one section's text, written in reading order")]
pub fn lto_section(md: &mut String, tracer: &Path, effort: &str) -> anyhow::Result<()> {
    let (rounds, values, target, live_runs) = match effort {
        "rigorous" => (10, 5, 0.2, 10),
        "normal" => (5, 3, 0.2, 5),
        _ => (3, 3, 0.1, 5),
    };
    let load = crate::markdown::Load::now();
    install_harness()?;
    let mut site_table = String::from(
        "| build | probes | sites | inlined copies' sites | emulated | of those at a jump into the copy | single-stepped | out-of-line entries placed on an emulated instruction |\n|---|---|---|---|---|---|---|---|\n",
    );
    let mut live_table =
        String::from("| build | sites live | start to `attached`, each run | median |\n|---|---|---|---|\n");
    let mut cost_tables = String::new();
    for (build, root, python) in BUILDS {
        if !Path::new(&host_path(root, python)).is_file() {
            bail!("{} is missing; run `cargo xtask setup` (it makes the forky root)", host_path(root, python));
        }
        // Sites and time to live, on one idle harness process.
        let idle = Harness::start(root, python, "pass", "pass", false)?;
        let s = sites(tracer, idle.pid())?;
        writeln!(
            site_table,
            "| {build} | {} | {} | {} | {} | {} | {} | {} of {} |",
            s.probes.len(),
            s.total,
            s.inline,
            s.inline_emulated,
            s.inline_gated,
            s.inline - s.inline_emulated,
            s.entries_emulated,
            s.probes.len()
        )?;
        let mut times = Vec::new();
        let mut live = 0;
        for run in 0..live_runs {
            eprintln!("xtask: lto {python}: time to live, run {}", run + 1);
            let (child, took, lines, v) = attach(tracer, idle.pid(), &[])?;
            live = attached_sites(&v);
            detach(child, lines)?;
            times.push(took.as_secs_f64());
        }
        let mut sorted = times.clone();
        sorted.sort_by(f64::total_cmp);
        writeln!(
            live_table,
            "| {build} | {live} | {} | {:.2} s |",
            times.iter().map(|t| format!("{t:.2}")).collect::<Vec<_>>().join(", ") + " s",
            sorted[sorted.len() / 2]
        )?;
        drop(idle);

        // Cost per loop and per hit.
        for (name, setup, stmt) in STATEMENTS {
            let series = measure_statement(tracer, (root, python), (setup, stmt), &s.probes, (rounds, values, target))?;
            let base = series[0].mean();
            writeln!(cost_tables, "#### {build}, {name}: `{stmt}`\n")?;
            writeln!(
                cost_tables,
                "| setup | mean per loop (± stdev over rounds) | vs baseline | hits per loop | cost per hit |\n|---|---|---|---|---|"
            )?;
            let what = [
                "nothing attached",
                "tracer attached (all sites)",
                "bpftrace at the entries (out-of-line copies only)",
                "PYTHONTRACEMALLOC=25 (its own process)",
                "an empty BPF program at tracer's sites (the kernel's floor there)",
            ];
            for (i, ser) in series.iter().enumerate() {
                let m = ser.mean();
                let (vs, hits, per_hit) = if i == 0 {
                    ("1.00x".to_owned(), "—".to_owned(), "—".to_owned())
                } else {
                    // The empty program counts nothing: its hits are
                    // tracer's, at the same sites.
                    let hpl = if SETUPS[i] == "empty" { series[1].hits_per_loop() } else { ser.hits_per_loop() };
                    let per_hit = hpl
                        .filter(|h| *h >= 0.5)
                        .map_or_else(|| "—".to_owned(), |h| format!("{:.0} ns", (m - base) / h * 1e9));
                    (format!("{:.2}x", m / base), hpl.map_or_else(|| "—".to_owned(), |h| format!("{h:.2}")), per_hit)
                };
                writeln!(
                    cost_tables,
                    "| {} | {} ± {} | {vs} | {hits} | {per_hit} |",
                    what[i],
                    fmt_s(m),
                    fmt_s(ser.stdev())
                )?;
            }
            let added = |i: usize| series[i].mean() - base;
            writeln!(
                cost_tables,
                "\ntracer adds {} per loop, bpftrace {} (seeing {} of tracer's hits), tracemalloc {}; the empty program at tracer's sites {}: tracer costs {} times the floor at its sites.\n",
                fmt_s(added(1)),
                fmt_s(added(2)),
                match (series[2].hits_per_loop(), series[1].hits_per_loop()) {
                    (Some(b), Some(t)) if t > 0.0 => format!("{:.0}%", b / t * 100.0),
                    _ => "?".to_owned(),
                },
                fmt_s(added(3)),
                fmt_s(added(4)),
                if added(4) > 0.0 { format!("{:.2}", added(1) / added(4)) } else { "?".to_owned() }
            )?;
        }
    }

    writeln!(md, "## Debian's LTO builds: 3.11, 3.13, 3.14 (inlined copies probed)\n")?;
    writeln!(
        md,
        "Debian builds CPython statically with LTO, which inlines the probed functions into hundreds of \
         callers; tracer probes each inlined copy too (docs/limitations.md), found by DWARF from the \
         -dbg packages. 3.11 is the host's `/usr/bin/python3.11`; 3.13 and 3.14 are Debian forky's, run \
         with `chroot {FORKY}` (made by `cargo xtask setup`; tracer traces them by host PID and reads \
         their debug info through /proc/PID/root). pyperf cannot run its workers there, so the timing \
         is xtask's own harness (`xtask/src/harness.py`, copied to `{HARNESS_PATH}` in each root): it \
         runs the setup, warms the statement up with 100 loops, prints `ready`, then for every number \
         N it reads on stdin times N loops with `timeit` and prints the time per loop.\n"
    )?;
    writeln!(md, "```\ncargo xtask bench --only lto --effort {effort}\n```\n")?;
    writeln!(md, "### Sites\n")?;
    writeln!(md, "```\nsudo tracer probes --pid PID --json\n```\n")?;
    writeln!(
        md,
        "PID is a harness process of the build. Sites = per probe, 1 (the out-of-line function) + \
         `coverage.inlined_probed` + `coverage.call_sites`. Of the inlined copies (`inline_sites`), \
         `inline_sites_emulated` are probed at an instruction the kernel emulates (mostly a conditional \
         jump, or a jump into the copy: `inline_sites_gated`, docs/probes.md); the rest are \
         single-stepped. A copy only jumps lead into has a site at each, so it may count more than \
         once in the sites' columns (not in `sites`). The last column counts the out-of-line functions whose \
         probe is on an emulated instruction (`emulated`).\n"
    )?;
    writeln!(md, "{site_table}")?;
    writeln!(md, "### Start to every probe live\n")?;
    writeln!(md, "```\nsudo tracer attach --pid PID --json --interval 3600\n```\n")?;
    writeln!(
        md,
        "Timed from starting tracer to its `attached` line, which it prints after every link is made \
         (all sites live); then stopped with SIGINT. {live_runs} runs per build on an idle harness \
         process; \"sites live\" sums the `attached` line's coverage the same way.\n"
    )?;
    writeln!(md, "{live_table}")?;
    writeln!(md, "### Cost per loop and per hit, against bpftrace and tracemalloc\n")?;
    writeln!(
        md,
        "Two harness processes per statement: one for nothing attached, tracer and bpftrace, one \
         started with PYTHONTRACEMALLOC=25. {rounds} rounds, each visiting the five setups in a \
         rotated order; a visit calibrates the loop count to about {:.0} ms and takes the mean of \
         {values} timings. tracer and bpftrace are started for a visit and stopped with SIGINT after \
         it; their counts over the visit's loops give the hits per loop (the harness's own few reads \
         and prints included; tracer's count its gates' passes that went elsewhere, `gate_other`). \
         Cost per hit = (mean − baseline mean) / hits per loop; bpftrace sees only the calls of the \
         out-of-line functions, so its hits are fewer. The empty program is tracer's attach with \
         `TRACER_BENCH_PROGRAM=empty` (a bench-only knob): every site tracer probes gets the program \
         that does nothing, so it is hit as often as tracer, and its cost per hit divides by tracer's \
         hits per loop.\n",
        target * 1e3
    )?;
    writeln!(
        md,
        "```\n{}\nPYTHONTRACEMALLOC=25 {}\nsudo tracer attach --pid PID --json --interval 3600\nsudo TRACER_BENCH_PROGRAM=empty tracer attach --pid PID --json --interval 3600\nsudo bpftrace -e 'uprobe:IMAGE:_Py_NewReference,uprobe:IMAGE:_Py_Dealloc,… /pid == PID/ {{ @[probe] = count(); }}'\n```\n",
        harness_command(None, "/usr/bin/python3.11"),
        harness_command(Some(FORKY), "/usr/bin/python3.14")
    )?;
    writeln!(
        md,
        "SETUP and STMT are {} and {} (JSON round trip) or `pass` and `[]`; IMAGE is the interpreter's \
         host path (`/usr/bin/python3.11`, `{FORKY}/usr/bin/python3.1x`) and the probes are every \
         probe tracer attached.\n",
        crate::markdown::shell_quote(STATEMENTS[0].1),
        crate::markdown::shell_quote(STATEMENTS[0].2)
    )?;
    writeln!(md, "{cost_tables}")?;
    writeln!(md, "{}", load.line())?;
    Ok(())
}
