//! The human-readable table.

use std::{io::Write, time::Duration};

use super::{AttachInfo, End, EstimateSample, LateCoverage, Reporter, Sample};
use crate::budget::RateEstimate;

/// Prints a block per interval with rates over that interval, and a final
/// block with rates averaged over the whole run.
pub struct TableReporter<W: Write> {
    out: W,
    previous: Option<Sample>,
    /// Whether to list processes even when there is only one (`--exe`).
    per_process: bool,
}

impl<W: Write> TableReporter<W> {
    pub const fn new(out: W) -> Self {
        Self { out, previous: None, per_process: false }
    }

    fn block(&mut self, title: &str, sample: &Sample, since: Option<&Sample>) -> std::io::Result<()> {
        let base_elapsed = since.map_or(Duration::ZERO, |s| s.elapsed);
        let secs = sample.elapsed.saturating_sub(base_elapsed).as_secs_f64();
        writeln!(self.out, "{title}")?;
        if let Some(e) = &sample.estimate {
            return self.estimate_block(sample, e);
        }
        let with_returns = sample.probes.iter().any(|p| p.returned.is_some());
        let extra = if with_returns { format!(" {:>14} {:>8}", "returns", "NULL") } else { String::new() };
        writeln!(
            self.out,
            "  {:<20} {:>14} {:>12} {:>16} {:>14}{extra}",
            "function", "calls", "calls/s", "bytes", "bytes/s"
        )?;
        for (i, p) in sample.probes.iter().enumerate() {
            let before = since.and_then(|s| s.probes.get(i)).filter(|b| b.name == p.name);
            let dcalls = p.calls - before.map_or(0, |b| b.calls.min(p.calls));
            let dbytes = p.bytes - before.map_or(0, |b| b.bytes.min(p.bytes));
            let (bytes, bytes_rate) = if p.counts_bytes {
                (group(p.bytes), group(rate(dbytes, secs)))
            } else {
                ("-".to_owned(), "-".to_owned())
            };
            let extra = match (with_returns, p.returned) {
                (false, _) => String::new(),
                (true, Some(r)) => format!(" {:>14} {:>8}", group(r.returns), group(r.null)),
                (true, None) => format!(" {:>14} {:>8}", "-", "-"),
            };
            writeln!(
                self.out,
                "  {:<20} {:>14} {:>12} {:>16} {:>14}{extra}",
                p.name,
                group(p.calls),
                group(rate(dcalls, secs)),
                bytes,
                bytes_rate
            )?;
        }
        self.footer(sample)
    }

    /// `--budget`: counts of the traced windows, and rates estimated from
    /// them since attach, marked as estimates.
    fn estimate_block(&mut self, sample: &Sample, e: &EstimateSample) -> std::io::Result<()> {
        writeln!(
            self.out,
            "  {:<20} {:>14} {:>24} {:>16} {:>28}",
            "function", "calls (traced)", "est. calls/s ±95%", "bytes (traced)", "est. bytes/s ±95%"
        )?;
        for (p, (calls, bytes)) in sample.probes.iter().zip(&e.rates) {
            let (b, b_rate) =
                if p.counts_bytes { (group(p.bytes), estimate(bytes)) } else { ("-".to_owned(), "-".to_owned()) };
            writeln!(
                self.out,
                "  {:<20} {:>14} {:>24} {:>16} {:>28}",
                p.name,
                group(p.calls),
                estimate(calls),
                b,
                b_rate
            )?;
        }
        writeln!(
            self.out,
            "  ESTIMATES (--budget {}%): rates from {} windows that traced {:.2}s of {:.1}s ({:.2}%), as seen while traced; estimated cost to the target {:.2}% (a hit costs {:.0} ns single-stepped, {:.0} ns emulated here)",
            e.budget * 100.0,
            e.windows,
            e.traced.as_secs_f64(),
            sample.elapsed.as_secs_f64(),
            e.traced_fraction(sample.elapsed) * 100.0,
            e.overhead_fraction(sample.elapsed) * 100.0,
            e.costs.single_stepped_ns,
            e.costs.emulated_ns,
        )?;
        self.footer(sample)
    }

    fn footer(&mut self, sample: &Sample) -> std::io::Result<()> {
        if self.per_process || sample.processes.len() > 1 {
            for proc in &sample.processes {
                let calls: u64 = proc.counts.iter().map(|c| c.0).sum();
                let bytes: u64 = proc.counts.iter().map(|c| c.1).sum();
                writeln!(self.out, "  PID {:<16} {:>14} calls {:>23} bytes", proc.pid, group(calls), group(bytes))?;
            }
        }
        for l in &sample.late_modules {
            let since = l.since.as_secs_f64();
            match &l.coverage {
                LateCoverage::Sites { symbol, sites, escape } => {
                    let through =
                        escape.as_ref().map_or(String::new(), |e| format!("; not its calls through the address ({e})"));
                    writeln!(
                        self.out,
                        "  late: {} (mapped after attaching): {} calls to {symbol} counted from {since:.1} s on{through}",
                        l.path,
                        group(*sites as u64),
                    )?;
                }
                LateCoverage::Failed { error } => writeln!(
                    self.out,
                    "  late: {} (mapped after attaching): its calls are NOT counted ({error})",
                    l.path
                )?,
            }
        }
        let nonzero: Vec<String> =
            sample.stats.iter().filter(|s| s.value > 0).map(|s| format!("{}={}", s.name, s.value)).collect();
        if !nonzero.is_empty() {
            let lossy = sample.stats.iter().any(|s| s.value > 0 && s.loss);
            let note = if lossy { " (some events were NOT counted)" } else { "" };
            writeln!(self.out, "  BPF misses: {}{note}", nonzero.join(" "))?;
        }
        writeln!(self.out)?;
        self.out.flush()
    }
}

#[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)] // a displayed rate
fn rate(delta: u64, secs: f64) -> u64 {
    if secs > 0.0 { (delta as f64 / secs).round() as u64 } else { 0 }
}

/// "1,234 ±56", or "1,234 ±?" before there are two windows to compare.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // a displayed rate
fn estimate(r: &RateEstimate) -> String {
    let value = group(r.per_s.round() as u64);
    match r.ci95 {
        Some((lo, hi)) => format!("{value} ±{}", group(((hi - lo) / 2.0).round() as u64)),
        None => format!("{value} ±?"),
    }
}

/// 1234567 -> "1,234,567": exact, and readable at a glance.
fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl<W: Write> Reporter for TableReporter<W> {
    fn attached(&mut self, info: &AttachInfo) -> std::io::Result<()> {
        self.per_process = info.pid.is_none();
        let what = match (&info.pid, &info.exe) {
            (Some(pid), _) => format!("PID {pid}"),
            (None, Some(exe)) => format!("every process running {exe}"),
            (None, None) => "every process".to_owned(),
        };
        writeln!(
            self.out,
            "tracer: attached to {what} (Python {}, {}): {} probes live ({}){}{}",
            info.python_version,
            info.image,
            info.probes.len(),
            if info.links == crate::config::LinkMode::Multi { "uprobe-multi links" } else { "perf-event uprobes" },
            if info.call_sites.is_empty() {
                String::new()
            } else {
                let each: Vec<String> = info.call_sites.iter().map(|(f, n)| format!("{f} at {n} call sites")).collect();
                format!("; {}", each.join(", "))
            },
            if info.missing.is_empty() {
                String::new()
            } else {
                format!("; not in this build: {}", info.missing.join(", "))
            }
        )?;
        let stepped: Vec<&str> = info.placements.iter().filter(|(_, p)| !p.emulated).map(|(name, _)| *name).collect();
        if !stepped.is_empty() {
            writeln!(
                self.out,
                "tracer: single-stepped, so each hit costs a debug trap (see `tracer probes`): {}",
                stepped.join(", ")
            )?;
        }
        writeln!(self.out)?;
        self.out.flush()
    }

    fn interval(&mut self, sample: &Sample) -> std::io::Result<()> {
        let title = format!("[{:>8.1}s]", sample.elapsed.as_secs_f64());
        let previous = self.previous.take();
        self.block(&title, sample, previous.as_ref())?;
        self.previous = Some(sample.clone());
        Ok(())
    }

    fn summary(&mut self, sample: &Sample, end: End) -> std::io::Result<()> {
        let why = match end {
            End::Duration => "--duration elapsed".to_owned(),
            End::Signal(name) => format!("{name} received"),
            End::TargetExit => "the target exited".to_owned(),
        };
        let title =
            format!("summary after {:.1}s ({why}; probes detached), rates are averages:", sample.elapsed.as_secs_f64());
        self.block(&title, sample, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::example_sample;

    #[test]
    fn groups_thousands() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(group(1_234_567), "1,234,567");
    }

    #[test]
    fn header_names_call_sites_and_single_stepped_probes() {
        use crate::placement::Placement;
        let placed = Placement { offset: 7, instruction: "push %rbx".into(), emulated: true, reason: String::new() };
        let info = AttachInfo {
            pid: Some(12),
            exe: None,
            python_version: "3.11.7".into(),
            image: "/lib/libpython3.11.so.1.0".into(),
            probes: vec!["_Py_NewReference", "_Py_Dealloc", "PyObject_Free"],
            placements: vec![
                ("_Py_NewReference", placed.clone()),
                ("_Py_Dealloc", Placement { instruction: "10989 calls".into(), ..placed }),
                ("PyObject_Free", Placement::at_entry("entry".into())),
            ],
            missing: vec![],
            links: crate::config::LinkMode::Multi,
            returns: vec![],
            return_costs: None,
            call_sites: vec![("_Py_Dealloc", 10989)],
        };
        let mut buf = Vec::new();
        TableReporter::new(&mut buf).attached(&info).unwrap();
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "tracer: attached to PID 12 (Python 3.11.7, /lib/libpython3.11.so.1.0): 3 probes live (uprobe-multi links); \
             _Py_Dealloc at 10989 call sites\n\
             tracer: single-stepped, so each hit costs a debug trap (see `tracer probes`): PyObject_Free\n\n"
        );
    }

    #[test]
    fn interval_rates_are_per_interval() {
        let mut buf = Vec::new();
        let mut r = TableReporter::new(&mut buf);
        r.interval(&example_sample(1000, 1)).unwrap();
        r.interval(&example_sample(2000, 3)).unwrap();
        r.summary(&example_sample(4000, 4), End::Duration).unwrap();
        let text = String::from_utf8(buf).unwrap();
        let blocks: Vec<&str> = text.split("\n\n").collect();
        // Second interval: 30 - 10 calls over 1 s.
        let row = blocks[1].lines().find(|l| l.contains("_Py_NewReference")).unwrap();
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols, ["_Py_NewReference", "30", "20", "-", "-"]);
        let row = blocks[2].lines().find(|l| l.contains("PyObject_Malloc")).unwrap();
        let cols: Vec<&str> = row.split_whitespace().collect();
        // Summary: 16 calls and 16,000 bytes over 4 s.
        assert_eq!(cols, ["PyObject_Malloc", "16", "4", "16,000", "4,000"]);
        assert!(blocks[2].starts_with("summary after 4.0s (--duration elapsed"));
    }

    #[test]
    fn budget_rates_are_marked_estimates() {
        use crate::budget::HitCosts;
        let mut sample = example_sample(10_000, 1);
        sample.estimate = Some(EstimateSample {
            budget: 0.01,
            windows: 4,
            traced: Duration::from_millis(100),
            overhead: Duration::from_millis(90),
            costs: HitCosts { single_stepped_ns: 16000.0, emulated_ns: 500.0 },
            rates: vec![
                (RateEstimate { per_s: 1234.4, ci95: Some((1200.0, 1268.0)) }, RateEstimate { per_s: 0.0, ci95: None }),
                (RateEstimate { per_s: 40.0, ci95: None }, RateEstimate { per_s: 40000.0, ci95: None }),
            ],
        });
        let mut buf = Vec::new();
        TableReporter::new(&mut buf).interval(&sample).unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert!(text.contains("est. calls/s ±95%"), "{text}");
        let row = text.lines().find(|l| l.contains("_Py_NewReference")).unwrap();
        assert_eq!(row.split_whitespace().collect::<Vec<_>>(), ["_Py_NewReference", "10", "1,234", "±34", "-", "-"]);
        let row = text.lines().find(|l| l.contains("PyObject_Malloc")).unwrap();
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["PyObject_Malloc", "4", "40", "±?", "4,000", "40,000", "±?"]
        );
        assert!(
            text.contains("ESTIMATES (--budget 1%): rates from 4 windows that traced 0.10s of 10.0s (1.00%), as seen while traced; estimated cost to the target 0.90%"),
            "{text}"
        );
    }

    #[test]
    fn late_modules_say_from_when() {
        use crate::output::{LateCoverage, LateModuleSample};
        let mut sample = example_sample(3000, 1);
        sample.late_modules = vec![
            LateModuleSample {
                path: "/venv/_psutil_linux.abi3.so".into(),
                since: Duration::from_secs(2),
                coverage: LateCoverage::Sites {
                    symbol: "_Py_Dealloc",
                    sites: 1058,
                    escape: Some("relocation at 0x4010".into()),
                },
            },
            LateModuleSample {
                path: "/venv/gone.so".into(),
                since: Duration::from_millis(2500),
                coverage: LateCoverage::Failed { error: "cannot read it".into() },
            },
        ];
        let mut buf = Vec::new();
        TableReporter::new(&mut buf).summary(&sample, End::Duration).unwrap();
        let text = String::from_utf8(buf).unwrap();
        let late: Vec<&str> = text.lines().filter(|l| l.starts_with("  late: ")).collect();
        assert_eq!(
            late,
            [
                "  late: /venv/_psutil_linux.abi3.so (mapped after attaching): 1,058 calls to _Py_Dealloc counted from 2.0 s on; not its calls through the address (relocation at 0x4010)",
                "  late: /venv/gone.so (mapped after attaching): its calls are NOT counted (cannot read it)",
            ]
        );
    }
}
