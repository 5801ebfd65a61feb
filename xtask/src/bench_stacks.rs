//! `cargo xtask bench --only stacks`: what recording the Python stack
//! (`--stacks`) adds to each event, against the counting probe alone, at a
//! shallow stack and at one deeper than the walk goes, with and without
//! `--sample`.
//!
//! The setups of one stack depth take turns on one long-lived harness
//! process, in rounds of rotated order, so that each difference compares
//! timings taken moments apart in the same process, never runs from
//! different moments.

#![allow(clippy::cast_precision_loss, reason = "loop, event and frame counts far below 2^52")]

use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::lto::Harness;

/// The probe whose events get stacks: an allocator whose counting probe
/// sits on an emulated instruction in the pyenv builds, so that the probe
/// hit is the cheap kind (about 0.45 µs) the aim compares with.
const PROBE: &str = "PyObject_Malloc";

/// `at(d, f)` calls `f` under `d` more Python frames; `work()` makes 1,000
/// plain objects, one `PyObject_Malloc` each (`object()` has no free list)
/// and nothing else allocated per iteration.
const SETUP: &str = "from itertools import repeat
def at(d, f):
    return at(d - 1, f) if d else f()
def work():
    for _ in repeat(None, 1000):
        object()";

/// A stack deeper than the deepest walk (`--depth 128`), so that every
/// walk goes to its bound.
const DEEP: u32 = 130;

/// What a walk does, as tracer-ebpf's `try_stack` does it: the reads and
/// lookups whose cost the tables measure.
const WHERE: &str = "After counting the event, the program looks up the process's walk (a hash map), \
finds the current thread's state (3.11: one read at an address; 3.12+ in a shared libpython: the \
task's fsbase, a kernel read, then three reads through the DTV; in an executable: fsbase and one \
read), checks that it is the event's thread (one read of `native_thread_id` and \
`bpf_get_ns_current_pid_tgid`), and reads the current frame (3.11 and 3.12: two reads through \
`cframe`; 3.13+: one). The walk then makes one `bpf_probe_read_user` per page of frames: the page \
of the first frame not read yet, from its start up to the end of that frame's head (at most 4 KB), \
since the frames of Python-to-Python calls lie on the thread's data stack, each caller just below \
its callee; a frame elsewhere (a generator's, the C stack's entry frame) costs a read of its own. \
Per frame there is only arithmetic on what was read: four words picked out, two FNV-1a steps, a \
16-byte store. At the end, one lookup of the stack's count (a per-CPU hash map) and two atomic \
adds; only a stack not seen before is inserted, 2 KB of frames, into the stacks map (which locks a \
bucket), and gets its count. So a walk costs 6 to 8 helper calls whatever its depth, and one more \
per page of frames; it was four reads per frame (`--versus` builds of earlier commits measure \
that). With `--sample N` each event draws a random number (`bpf_get_prandom_u32`) and one in N, \
on average, is walked. With `--native-stacks` the native unwind follows: per native frame one \
lookup of the pc's 4 KiB page (a hash map giving its module's load bias and its few unwind rows), \
a binary search of those rows (at most 13 array lookups), and one `bpf_probe_read_user` of the \
return address (two where the row says rbp was saved); then one lookup of the native stack by its \
hash, and an insert only for a stack not seen before.";

/// `--sample`'s N in the sampled setups.
const SAMPLE: &str = "10";

/// (name, root, interpreter inside the root); the pyenv ones are found
/// under pyenv's root.
fn builds() -> Vec<(String, Option<&'static str>, String)> {
    let pyenv = std::env::var_os("PYENV_ROOT").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".pyenv"),
        PathBuf::from,
    );
    let version = |v: &str| pyenv.join("versions").join(v).join("bin").join("python3").display().to_string();
    vec![
        ("pyenv 3.11.7 (current thread at an address)".to_owned(), None, version("3.11.7")),
        ("pyenv 3.13.0 (current thread through the DTV)".to_owned(), None, version("3.13.0")),
        (
            "Debian forky 3.14, LTO, chrooted (current thread fs-relative)".to_owned(),
            Some(crate::setup::FORKY_ROOT),
            "/usr/bin/python3.14".to_owned(),
        ),
    ]
}

/// How a `--versus` binary is named in the tables: by its file name.
fn label(tracer: &Path) -> String {
    format!(
        "`{}`",
        tracer.file_name().map_or_else(|| tracer.display().to_string(), |n| n.to_string_lossy().into_owned())
    )
}

/// One setup: what it is, which tracer, its flags (None: nothing
/// attached).
struct Setup {
    what: String,
    tracer: PathBuf,
    flags: Option<Vec<&'static str>>,
}

/// One setup's visits.
#[derive(Default)]
pub(crate) struct Series {
    /// Seconds per loop, one per round.
    pub(crate) means: Vec<f64>,
    /// Loops per timing, calibrated at the first visit.
    pub(crate) loops: u64,
    /// Events counted and loops run while tracer was attached.
    pub(crate) events: u64,
    pub(crate) loops_traced: u64,
    /// The last summary's stack coverage, and the frames of its most
    /// counted stack.
    pub(crate) coverage: Value,
    pub(crate) frames: Option<usize>,
    pub(crate) stats: Value,
}

/// Timings per visit; the best counts, as timeit's does: on a shared
/// machine the other timings carry other processes' time.
pub(crate) const TIMINGS: usize = 5;

pub(crate) fn best(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

pub(crate) fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

pub(crate) fn stdev(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let m = mean(v);
    (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
}

/// The loops per timing that take about `target` seconds, and the loops
/// run to find that out.
pub(crate) fn calibrate(h: &mut Harness, target: f64) -> anyhow::Result<(u64, u64)> {
    let mut n = 1u64;
    let mut run = 0;
    loop {
        let t = h.time(n)?;
        run += n;
        if t * n as f64 >= target / 4.0 || n >= 1 << 20 {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a positive loop count")]
            return Ok((((target / t) as u64).max(1), run));
        }
        n *= 4;
    }
}

/// One visit of a traced setup: tracer attached to the harness, the loop
/// timed, tracer stopped; returns (seconds per loop, loops run while
/// attached, the summary).
pub(crate) fn traced_visit(
    h: &mut Harness,
    tracer: &Path,
    flags: &[&str],
    series: &mut Series,
    target: f64,
) -> anyhow::Result<(f64, u64, Value)> {
    let pid = h.pid().to_string();
    let mut child = Command::new(tracer)
        .args(["attach", "--exact", "--pid", &pid, "--json", "--interval", "3600"])
        .args(flags)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting tracer attach")?;
    let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
    let first = lines.next().context("tracer attach printed nothing")??;
    let timed = (|| -> anyhow::Result<(f64, u64)> {
        if !first.contains("\"attached\"") {
            bail!("tracer attach printed {first}");
        }
        let mut loops = 0;
        if series.loops == 0 {
            (series.loops, loops) = calibrate(h, target)?;
        }
        let mut t = Vec::new();
        for _ in 0..TIMINGS {
            t.push(h.time(series.loops)?);
            loops += series.loops;
        }
        Ok((best(&t), loops))
    })();
    if let Ok(id) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill with a valid signal on our own child.
        unsafe { libc::kill(id, libc::SIGINT) };
    }
    let last = lines.map_while(Result::ok).last().unwrap_or_default();
    child.wait()?;
    let (mean, loops) = timed?;
    let summary: Value = serde_json::from_str(&last).with_context(|| format!("tracer's summary: {last}"))?;
    Ok((mean, loops, summary))
}

/// All setups on one harness at stack depth `depth`, in `rounds` rotated
/// rounds.
fn measure(
    (root, python): (Option<&str>, &str),
    depth: u32,
    setups: &[Setup],
    (rounds, target): (usize, f64),
) -> anyhow::Result<Vec<Series>> {
    let mut h = Harness::start(root, python, SETUP, &format!("at({depth}, work)"), false)?;
    let mut series: Vec<Series> = setups.iter().map(|_| Series::default()).collect();
    for round in 0..rounds {
        for k in 0..setups.len() {
            let i = (round + k) % setups.len();
            let s = &setups[i];
            eprintln!("xtask: stacks {python} depth {depth} round {}: {}", round + 1, s.what);
            match &s.flags {
                None => {
                    if series[i].loops == 0 {
                        series[i].loops = calibrate(&mut h, target)?.0;
                    }
                    let t: anyhow::Result<Vec<f64>> = (0..TIMINGS).map(|_| h.time(series[i].loops)).collect();
                    series[i].means.push(best(&t?));
                }
                Some(flags) => {
                    let (m, loops, summary) = traced_visit(&mut h, &s.tracer, flags, &mut series[i], target)?;
                    let events = summary["probes"][PROBE]["calls"].as_u64().unwrap_or(0);
                    let ser = &mut series[i];
                    ser.means.push(m);
                    ser.events += events;
                    ser.loops_traced += loops;
                    ser.stats = summary["stats"].clone();
                    if flags.contains(&"--stacks") {
                        check_stacked(&summary, &s.what)?;
                        ser.coverage = summary["stack_coverage"].clone();
                        ser.frames = summary["stacks"][0]["frames"].as_array().map(Vec::len);
                    }
                }
            }
        }
    }
    Ok(series)
}

/// Fails unless (nearly) every event got a stack: a walk that gave up
/// early would be measured as cheap.
fn check_stacked(summary: &Value, what: &str) -> anyhow::Result<()> {
    let c = &summary["stack_coverage"];
    let events = c["events"].as_u64().unwrap_or(0);
    let stacked = c["stacked"].as_u64().unwrap_or(0);
    if events == 0 || (stacked as f64) < 0.9 * events as f64 {
        bail!("{what}: only {stacked} of {events} events got a stack (misses: {})", summary["stats"]);
    }
    Ok(())
}

/// Writes the section. `versus`: other tracer binaries (builds of earlier
/// commits) whose stack capture is measured beside this one's.
#[allow(clippy::too_many_lines, reason = "one section's text, written in reading order")]
pub fn stacks_section(md: &mut String, tracer: &Path, effort: &str, versus: &[PathBuf]) -> anyhow::Result<()> {
    let (rounds, target) = crate::markdown::rounds(effort);
    let load = crate::markdown::Load::now();
    crate::lto::install_harness()?;
    let this = tracer.to_path_buf();
    let stacks = |extra: &[&'static str]| {
        let mut f = vec!["--probes", PROBE, "--stacks", PROBE];
        f.extend_from_slice(extra);
        Some(f)
    };
    let mut tables = String::new();
    let mut per_frame_rows = String::new();
    let mut commands = Vec::new();
    for (build, root, python) in builds() {
        let host = root.map_or_else(|| python.clone(), |r| format!("{r}{python}"));
        if !Path::new(&host).is_file() {
            bail!("{host} is missing; run `cargo xtask setup` (pyenv's builds ship with this machine kind)");
        }
        writeln!(tables, "### {build}\n")?;
        // Per tracer binary: the added cost of the 64- and 128-frame walks.
        let mut deep_costs: Vec<(PathBuf, Option<f64>, Option<f64>)> = Vec::new();
        // The probe hit itself, at the deep stack.
        let mut deep_hit = f64::NAN;
        for depth in [0, DEEP] {
            let mut setups = vec![
                Setup { what: "nothing attached".into(), tracer: this.clone(), flags: None },
                Setup {
                    what: "the counting probe alone".into(),
                    tracer: this.clone(),
                    flags: Some(vec!["--probes", PROBE]),
                },
                Setup { what: "`--stacks`, default depth (64)".into(), tracer: this.clone(), flags: stacks(&[]) },
                Setup {
                    what: format!("`--stacks --sample {SAMPLE}`, default depth"),
                    tracer: this.clone(),
                    flags: stacks(&["--sample", SAMPLE]),
                },
                Setup {
                    what: "`--stacks --native-stacks` (the Python walk and the native unwind)".into(),
                    tracer: this.clone(),
                    flags: stacks(&["--native-stacks"]),
                },
            ];
            if depth == DEEP {
                setups.push(Setup {
                    what: "`--stacks --depth 128`".into(),
                    tracer: this.clone(),
                    flags: stacks(&["--depth", "128"]),
                });
            }
            for other in versus {
                setups.push(Setup {
                    what: format!("`--stacks`, default depth, {}", label(other)),
                    tracer: other.clone(),
                    flags: stacks(&[]),
                });
                if depth == DEEP {
                    setups.push(Setup {
                        what: format!("`--stacks --depth 128`, {}", label(other)),
                        tracer: other.clone(),
                        flags: stacks(&["--depth", "128"]),
                    });
                }
            }
            for s in &setups {
                if let Some(f) = &s.flags {
                    let c = format!("sudo tracer attach --pid PID --json --interval 3600 {}", f.join(" "));
                    if !commands.contains(&c) {
                        commands.push(c);
                    }
                }
            }
            let series = measure((root, &python), depth, &setups, (rounds, target))?;
            // Events per loop, from every traced visit's count.
            let (events, loops) = series.iter().fold((0, 0), |(e, l), s| (e + s.events, l + s.loops_traced));
            if loops == 0 || events == 0 {
                bail!("{build}: no {PROBE} events counted");
            }
            let per_loop = events as f64 / loops as f64;
            let frames = series[2].frames.map_or_else(|| "?".to_owned(), |f| f.to_string());
            let truncated = series[2].coverage["truncated"].as_u64().unwrap_or(0) > 0;
            writeln!(
                tables,
                "Stack {}: `at({depth}, work)`; the most counted stack has {frames} Python frames{}. \
                 {per_loop:.2} `{PROBE}` events per loop.\n",
                if depth == 0 { "shallow" } else { "deep" },
                if truncated { " (cut at the walk's depth, counted as truncated)" } else { "" }
            )?;
            writeln!(
                tables,
                "| setup | mean per loop (± stdev over rounds) | added per event (± stdev over rounds) |\n|---|---|---|"
            )?;
            // Per round, the difference from the setup it is compared with
            // in the same round: the counting probe from nothing attached,
            // the rest from the counting probe.
            let per_event = |i: usize, against: usize| -> Vec<f64> {
                series[i].means.iter().zip(&series[against].means).map(|(b, a)| (b - a) / per_loop * 1e9).collect()
            };
            for (i, s) in setups.iter().enumerate() {
                let m = &series[i].means;
                let added = match i {
                    0 => "—".to_owned(),
                    1 => {
                        let d = per_event(1, 0);
                        if depth == DEEP {
                            deep_hit = mean(&d);
                        }
                        format!("{:.0} ns ± {:.0} (the probe hit itself)", mean(&d), stdev(&d))
                    }
                    _ => {
                        let d = per_event(i, 1);
                        format!("{:.0} ns ± {:.0}", mean(&d), stdev(&d))
                    }
                };
                writeln!(
                    tables,
                    "| {} | {} ± {} | {added} |",
                    s.what,
                    crate::markdown::fmt_ns(mean(m) * 1e9),
                    crate::markdown::fmt_ns(stdev(m) * 1e9)
                )?;
                if depth == DEEP && i > 1 {
                    let at = if let Some(at) = deep_costs.iter().position(|(t, _, _)| *t == s.tracer) {
                        at
                    } else {
                        deep_costs.push((s.tracer.clone(), None, None));
                        deep_costs.len() - 1
                    };
                    match s.flags.as_deref() {
                        Some(f) if f.len() == 4 => deep_costs[at].1 = Some(mean(&per_event(i, 1))),
                        Some(f) if f.contains(&"--depth") => deep_costs[at].2 = Some(mean(&per_event(i, 1))),
                        _ => {}
                    }
                }
            }
            let misses: Vec<String> = series
                .iter()
                .flat_map(|s| s.stats.as_object().into_iter().flatten())
                .filter(|(k, v)| *k != "stack_truncated" && v.as_u64().unwrap_or(0) > 0)
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            if !misses.is_empty() {
                writeln!(tables, "\nBPF misses in the last visits: {}.", misses.join(", "))?;
            }
            writeln!(tables)?;
        }
        for (t, d64, d128) in &deep_costs {
            let (Some(d64), Some(d128)) = (d64, d128) else { continue };
            let per_frame = (d128 - d64) / 64.0;
            let which = if *t == this { "this build".to_owned() } else { label(t) };
            writeln!(
                per_frame_rows,
                "| {build} | {which} | {deep_hit:.0} ns | {d64:.0} ns | {d128:.0} ns | {per_frame:.1} ns | {:.0} ns | {:.1}x |",
                d64 - 64.0 * per_frame,
                d64 / deep_hit
            )?;
        }
    }

    writeln!(md, "## Cost of recording Python stacks (`--stacks`)\n")?;
    writeln!(
        md,
        "What `--stacks` adds per event, against the counting probe alone, measured side by side. \
         The probe is `{PROBE}` alone; with `--stacks {PROBE}` each of its events also walks the \
         current thread's Python frames in BPF. One harness process per build and stack depth \
         (xtask's harness, as in the LTO section) runs `at(d, work)`, where `work()` makes 1,000 \
         objects (one `{PROBE}` each) under `d` more Python frames:\n"
    )?;
    writeln!(md, "```python\n{SETUP}\n```\n")?;
    writeln!(
        md,
        "{rounds} rounds, each visiting every setup in a rotated order; tracer is started for a visit \
         and stopped with SIGINT after it. A visit times {TIMINGS} runs of a loop count calibrated at \
         the setup's first visit to about {:.0} ms, and keeps the best. Added per event = (setup's \
         time per loop − the counting probe's in the same round) / events per loop, then the mean and \
         standard deviation of that over the rounds; for the counting probe itself the difference is \
         from nothing attached. Events per loop are tracer's counts over the loops it saw. \
         `--sample {SAMPLE}` walks each event with probability 1/{SAMPLE}.\n",
        target * 1e3
    )?;
    let mut also = String::new();
    for v in versus {
        write!(also, " --versus {}", v.display())?;
    }
    writeln!(md, "```\ncargo xtask bench --only stacks --effort {effort}{also}\n```\n")?;
    writeln!(md, "Commands (PID is the harness's):\n\n```")?;
    for c in &commands {
        writeln!(md, "{c}")?;
    }
    writeln!(md, "```\n")?;
    for other in versus {
        writeln!(
            md,
            "{} is {}, given as `--versus`: another build of tracer, measured in the same rounds.\n",
            label(other),
            other.display()
        )?;
    }
    write!(md, "{tables}")?;
    writeln!(md, "### Where the time goes\n")?;
    writeln!(md, "{WHERE}\n")?;
    writeln!(
        md,
        "From the deep stack's rows: per frame = (128-frame walk − 64-frame walk) / 64; the fixed part = \
         64-frame walk − 64 × per frame (what a walk costs whatever its depth); the last column sets the \
         64-frame walk against the probe hit itself, measured in the same rounds.\n"
    )?;
    writeln!(
        md,
        "| build | tracer | probe hit itself | 64-frame walk adds | 128-frame walk adds | per frame | fixed part | 64-frame walk / probe hit |\n|---|---|---|---|---|---|---|---|"
    )?;
    writeln!(md, "{per_frame_rows}")?;
    writeln!(
        md,
        "Issue 11's aim is a 64-frame walk that adds no more than the probe hit itself (a ratio of 1 or \
         less in the last column). For comparison, OpenTelemetry's eBPF profiler measured about 4.7 µs \
         for an allocation probe with unwinding (its own figure, on its own machine).\n"
    )?;
    writeln!(md, "{}", load.line())?;
    Ok(())
}
