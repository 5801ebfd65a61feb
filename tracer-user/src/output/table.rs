//! The human-readable table.

use std::{io::Write, time::Duration};

use super::{AttachInfo, End, Reporter, Sample};

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
        writeln!(self.out, "  {:<20} {:>14} {:>12} {:>16} {:>14}", "function", "calls", "calls/s", "bytes", "bytes/s")?;
        for (i, p) in sample.probes.iter().enumerate() {
            let before = since.and_then(|s| s.probes.get(i)).filter(|b| b.name == p.name);
            let dcalls = p.calls - before.map_or(0, |b| b.calls.min(p.calls));
            let dbytes = p.bytes - before.map_or(0, |b| b.bytes.min(p.bytes));
            let (bytes, bytes_rate) = if p.counts_bytes {
                (group(p.bytes), group(rate(dbytes, secs)))
            } else {
                ("-".to_owned(), "-".to_owned())
            };
            writeln!(
                self.out,
                "  {:<20} {:>14} {:>12} {:>16} {:>14}",
                p.name,
                group(p.calls),
                group(rate(dcalls, secs)),
                bytes,
                bytes_rate
            )?;
        }
        if self.per_process || sample.processes.len() > 1 {
            for proc in &sample.processes {
                let calls: u64 = proc.counts.iter().map(|c| c.0).sum();
                let bytes: u64 = proc.counts.iter().map(|c| c.1).sum();
                writeln!(self.out, "  PID {:<16} {:>14} calls {:>23} bytes", proc.pid, group(calls), group(bytes))?;
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
            "tracer: attached to {what} (Python {}, {}): {} probes live{}",
            info.python_version,
            info.image,
            info.probes.len(),
            if info.missing.is_empty() {
                String::new()
            } else {
                format!("; not in this build: {}", info.missing.join(", "))
            }
        )?;
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
}
