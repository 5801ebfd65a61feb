//! `cargo xtask soak`: tracer attached for minutes to a busy 8-thread
//! target, once in each mode, with tracer's resident memory and CPU time
//! and the target's rate read every minute; written into BENCHMARKS.md's
//! "Soak" section. It fails (after writing the section) where tracer's
//! memory grew more than 5% after the first minute, or where `--exact`
//! counted other than the target's own tally.

use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader, Write as _},
    path::Path,
    process::{Child, ChildStdin, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde_json::Value;

/// The threads of the target.
const THREADS: usize = 8;

/// The target: Debian's LTO-built interpreter, the one production runs.
const PYTHON: &str = "/usr/bin/python3.11";

/// How much tracer's resident memory may grow after the first minute.
const RSS_GROWTH: f64 = 0.05;

/// The heading the section starts with; a full `cargo xtask bench` keeps
/// the section as it is.
pub const HEADING: &str = "## Soak: ";

struct Mode {
    name: &'static str,
    args: &'static [&'static str],
    exact: bool,
}

const MODES: [Mode; 2] = [
    Mode { name: "production profile (the default)", args: &[], exact: false },
    Mode { name: "`--exact`", args: &["--exact"], exact: true },
];

/// One minute's reading.
struct Minute {
    rss_kib: u64,
    /// tracer's CPU time over the minute, in seconds.
    cpu_s: f64,
    /// Bytearrays the target made per second over the minute.
    rate: f64,
}

/// What one mode's soak saw.
struct Soaked {
    minutes: Vec<Minute>,
    tally: u64,
    summary: Value,
    command: String,
}

pub fn run(root: &Path, tracer: &Path, minutes: u32) -> anyhow::Result<()> {
    if minutes < 2 {
        bail!("--minutes {minutes}: the soak needs at least 2 minutes (the first is the baseline)");
    }
    let out = root.join("target").join("soak");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let script = out.join("soak.py");
    std::fs::write(&script, include_str!("soak.py")).context("writing the soak's target")?;
    let load = crate::markdown::Load::now();
    let mut md = String::new();
    writeln!(md, "{HEADING}tracer attached for {minutes} minutes to a busy {THREADS}-thread target\n")?;
    writeln!(md, "```\ncargo xtask soak --minutes {minutes}\n```\n")?;
    writeln!(
        md,
        "The target is Debian 12's `{PYTHON}` (LTO) running xtask/src/soak.py: {THREADS} threads each making \
         and dropping `bytearray(1000)` in a loop (exactly one `PyMem_RawMalloc(1001)` each) and counting them \
         itself. tracer attaches (`--json --interval 60`), the threads start, and every minute tracer's \
         resident memory (`VmRSS`), its CPU time over the minute and the target's rate are read; then the \
         threads stop and tracer is stopped with SIGINT. Growth is the last minute's memory against the \
         first's (the goal: under {:.0}%).\n",
        RSS_GROWTH * 100.0
    )?;
    let mut failures = Vec::new();
    for mode in &MODES {
        eprintln!("xtask: soak, {}, {minutes} minutes", mode.name);
        let s = soak(tracer, &script, mode, minutes, &out)?;
        failures.extend(section(&mut md, mode, &s)?);
    }
    md.push_str(&load.line());
    md.push('\n');
    let path = root.join("BENCHMARKS.md");
    let text = std::fs::read_to_string(&path).context("reading BENCHMARKS.md")?;
    std::fs::write(&path, replace_section(&text, &md)).context("writing BENCHMARKS.md")?;
    eprintln!("xtask: wrote the soak section of BENCHMARKS.md");
    print!("{md}");
    if !failures.is_empty() {
        bail!("the soak failed: {}", failures.join("; "));
    }
    Ok(())
}

/// `text` with its soak section replaced by `section`, or with `section`
/// put before "## tracer's own cost while attached" (or at the end).
fn replace_section(text: &str, section: &str) -> String {
    if let Some(start) = text.find(HEADING) {
        let rest = &text[start + HEADING.len()..];
        let end = rest.find("\n## ").map_or(text.len(), |i| start + HEADING.len() + i + 1);
        return format!("{}{section}{}", &text[..start], &text[end..]);
    }
    match text.find("## tracer's own cost while attached") {
        Some(at) => format!("{}{section}{}", &text[..at], &text[at..]),
        None => format!("{}\n\n{section}", text.trim_end()),
    }
}

/// The soak section of the BENCHMARKS.md at `path`, to keep across a full
/// `cargo xtask bench`; empty where there is none.
pub fn kept(path: &Path) -> String {
    crate::markdown::kept_section(path, HEADING, None)
}

/// Writes one mode's table; returns what failed.
fn section(md: &mut String, mode: &Mode, s: &Soaked) -> anyhow::Result<Vec<String>> {
    let mut failures = Vec::new();
    writeln!(md, "### {}\n", mode.name)?;
    writeln!(md, "```\n{}\n```\n", s.command)?;
    writeln!(md, "| minute | tracer RSS | tracer CPU over the minute | target's rate |\n|---|---|---|---|")?;
    for (i, m) in s.minutes.iter().enumerate() {
        #[allow(clippy::cast_precision_loss, reason = "KiB of memory")]
        let mib = m.rss_kib as f64 / 1024.0;
        writeln!(
            md,
            "| {} | {mib:.1} MiB | {:.2} s ({:.1}% of one core) | {:.0} bytearrays/s |",
            i + 1,
            m.cpu_s,
            m.cpu_s / 60.0 * 100.0,
            m.rate
        )?;
    }
    let first = s.minutes.first().context("no minute read")?;
    let last = s.minutes.last().context("no minute read")?;
    #[allow(clippy::cast_precision_loss, reason = "KiB of memory")]
    let growth = last.rss_kib as f64 / first.rss_kib as f64 - 1.0;
    writeln!(md, "\nResident memory after the first minute: {:+.1}%.", growth * 100.0)?;
    if growth > RSS_GROWTH {
        failures.push(format!("{}: tracer's RSS grew {:.1}% after the first minute", mode.name, growth * 100.0));
    }
    let probe = &s.summary["probes"]["PyMem_RawMalloc"];
    let stats = &s.summary["stats"];
    let missing: Vec<String> = stats
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(name, v)| {
            v.as_u64().is_some_and(|n| n > 0)
                // gate_other: passes through a jump probed for the copy it
                // leads into that went elsewhere, a cost, not a miss.
                && !matches!(name.as_str(), "other_process" | "size_overflow" | "gate_other")
                && !name.starts_with("stack_")
        })
        .map(|(name, v)| format!("{name} {v}"))
        .collect();
    if mode.exact {
        let calls = probe["calls"].as_u64().unwrap_or(0);
        let bytes = probe["bytes"].as_u64().unwrap_or(0);
        writeln!(
            md,
            "The target's tally: {} bytearrays; tracer counted {calls} calls of `PyMem_RawMalloc` and {bytes} bytes \
             ({}); BPF misses: {}.",
            s.tally,
            if calls == s.tally && bytes == 1001 * s.tally { "exactly the tally" } else { "NOT the tally" },
            if missing.is_empty() { "none".to_owned() } else { missing.join(", ") }
        )?;
        if calls != s.tally || bytes != 1001 * s.tally {
            failures.push(format!("--exact counted {calls} calls ({bytes} bytes) for a tally of {}", s.tally));
        }
        if !missing.is_empty() {
            failures.push(format!("--exact missed hits: {}", missing.join(", ")));
        }
    } else {
        let estimate = &probe["estimate"];
        let span = s.summary["elapsed_s"].as_f64().unwrap_or(0.0);
        let fraction = s.summary["profile"]["fraction"].as_f64();
        #[allow(clippy::cast_precision_loss, reason = "a count")]
        let tally_rate = if span > 0.0 { s.tally as f64 / span } else { 0.0 };
        let lower_bound = if estimate["lower_bound"] == true { ", a lower bound" } else { "" };
        writeln!(
            md,
            "`PyMem_RawMalloc`, estimated: {} calls/s{lower_bound} (95%: {}; the windows' slowdown of the target: \
             {}); the target's tally over tracer's {span:.0} s: {tally_rate:.0}/s. The profile's own figure for \
             its cost: {}.",
            estimate["calls_per_s"].as_f64().map_or("none".to_owned(), |r| format!("{r:.0}")),
            estimate["calls_per_s_ci95"],
            s.summary["budget"]["slowdown"],
            fraction.map_or("none".to_owned(), |f| format!("{:.2}% of the target's CPU time", f * 100.0)),
        )?;
    }
    writeln!(md)?;
    Ok(failures)
}

/// Soaks one mode: the target started, tracer attached, `minutes` read.
fn soak(tracer: &Path, script: &Path, mode: &Mode, minutes: u32, out: &Path) -> anyhow::Result<Soaked> {
    let mut target = Command::new(PYTHON)
        .arg(script)
        .arg(THREADS.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {PYTHON} (Debian's python3.11; `cargo xtask setup` installs it)"))?;
    let mut tracer_child: Option<Child> = None;
    let result = (|| {
        let mut stdin = target.stdin.take().context("the target's stdin")?;
        let (tally_tx, tally_rx) = mpsc::channel::<(bool, u64)>();
        let mut lines = BufReader::new(target.stdout.take().context("the target's stdout")?).lines();
        let ready = lines.next().context("the target printed nothing")??;
        if ready != "ready" {
            bail!("the target printed {ready:?}, not ready");
        }
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let mut words = line.split_whitespace();
                let done = match words.next() {
                    Some("done") => true,
                    Some("tally") => false,
                    _ => continue,
                };
                if let Some(n) = words.next().and_then(|n| n.parse().ok()) {
                    let _ = tally_tx.send((done, n));
                }
            }
        });
        let pid = target.id().to_string();
        let mut args = vec!["attach", "--pid", &pid, "--json", "--interval", "60"];
        args.extend(mode.args);
        let command = format!("sudo tracer {}", args.join(" ").replace(&pid, "PID"));
        let stderr =
            std::fs::File::create(out.join(format!("tracer-{}.stderr", if mode.exact { "exact" } else { "profile" })))?;
        let child = tracer_child.insert(
            Command::new(tracer)
                .args(&args)
                .stdout(Stdio::piped())
                .stderr(stderr)
                .spawn()
                .context("starting tracer")?,
        );
        let tracer_pid = child.id();
        let (json_tx, json_rx) = mpsc::channel::<String>();
        let mut json = BufReader::new(child.stdout.take().context("tracer's stdout")?).lines();
        let attached = json.next().context("tracer printed nothing (see target/soak/*.stderr)")??;
        if !attached.contains("\"attached\"") {
            bail!("tracer's first line is not `attached`: {attached}");
        }
        std::thread::spawn(move || {
            for line in json.map_while(Result::ok) {
                let _ = json_tx.send(line);
            }
        });
        go(&mut stdin)?;
        let began = Instant::now();
        let mut tally = 0;
        let mut readings = Vec::new();
        let (mut cpu_before, mut tally_before) = (crate::procstat::cpu_s(tracer_pid)?, 0u64);
        for minute in 1..=minutes {
            let at = began + Duration::from_secs(60 * u64::from(minute));
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
            while let Ok((_, n)) = tally_rx.try_recv() {
                tally = n;
            }
            let cpu = crate::procstat::cpu_s(tracer_pid)?;
            #[allow(clippy::cast_precision_loss, reason = "a count")]
            let rate = (tally - tally_before) as f64 / 60.0;
            let reading = Minute { rss_kib: rss_kib(tracer_pid)?, cpu_s: cpu - cpu_before, rate };
            eprintln!("xtask: soak, {}, minute {minute}: {} KiB, tally {tally}", mode.name, reading.rss_kib);
            readings.push(reading);
            (cpu_before, tally_before) = (cpu, tally);
        }
        go(&mut stdin)?;
        let tally = loop {
            match tally_rx.recv_timeout(Duration::from_mins(1)) {
                Ok((true, n)) => break n,
                Ok((false, _)) => {}
                Err(e) => bail!("the target did not stop its threads: {e}"),
            }
        };
        // SAFETY: kill has no memory preconditions; the PID is our child's.
        if unsafe { libc::kill(libc::pid_t::try_from(tracer_pid)?, libc::SIGINT) } != 0 {
            bail!("cannot stop tracer: {}", std::io::Error::last_os_error());
        }
        let status = child.wait()?;
        if !status.success() {
            bail!("tracer ended with {status} (see target/soak/*.stderr)");
        }
        let summary = json_rx
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(&l).ok())
            .filter(|v| v["type"] == "summary")
            .last()
            .context("tracer printed no summary")?;
        Ok(Soaked { minutes: readings, tally, summary, command })
    })();
    if let Some(mut child) = tracer_child {
        let _ = child.kill();
        let _ = child.wait();
    }
    let _ = target.kill();
    let _ = target.wait();
    result
}

/// Tells the target to go on to its next step (one byte).
fn go(stdin: &mut ChildStdin) -> anyhow::Result<()> {
    stdin.write_all(b"\n").and_then(|()| stdin.flush()).context("writing to the target")
}

/// `pid`'s resident memory, in KiB.
fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).context("tracer's status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("no VmRSS in tracer's status")
}

#[cfg(test)]
mod tests {
    /// The section replaces the old one in place, or goes before tracer's
    /// own cost; and a full bench keeps it.
    #[test]
    fn the_section_is_replaced_in_place() {
        let new = "## Soak: new\n\nrows\n\n";
        let with = "# B\n\n## Soak: old\n\nold rows\n\n## tracer's own cost while attached\n\nx\n";
        assert_eq!(
            super::replace_section(with, new),
            "# B\n\n## Soak: new\n\nrows\n\n## tracer's own cost while attached\n\nx\n"
        );
        let without = "# B\n\n## tracer's own cost while attached\n\nx\n";
        assert_eq!(
            super::replace_section(without, new),
            "# B\n\n## Soak: new\n\nrows\n\n## tracer's own cost while attached\n\nx\n"
        );
        assert_eq!(super::replace_section("# B\n", new), "# B\n\n## Soak: new\n\nrows\n\n");
        let dir = std::env::temp_dir().join(format!("xtask-soak-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("BENCHMARKS.md");
        std::fs::write(&path, with).unwrap();
        assert_eq!(super::kept(&path), "## Soak: old\n\nold rows\n\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
