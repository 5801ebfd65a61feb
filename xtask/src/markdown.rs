//! What every benchmark section writes into BENCHMARKS.md the same way:
//! times, quoted command arguments, and the machine's load around the run.

/// A time in ns, in the unit that reads best.
pub fn fmt_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.1} ns")
    }
}

/// `s` as one shell word.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=,:".contains(c)) {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The load average when a section started, for the line that ends it: a
/// loaded machine shows in every timing, so each section says how loaded.
pub struct Load {
    before: String,
}

impl Load {
    /// The load average now.
    pub fn now() -> Self {
        Self { before: std::fs::read_to_string("/proc/loadavg").unwrap_or_default() }
    }

    /// "Load average … when the section started: …; when it ended: …".
    pub fn line(&self) -> String {
        let after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let first3 = |l: &str| l.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
        format!(
            "Load average (1, 5, 15 min) when the section started: {}; when it ended: {}, on {} cores ({}, \
             Linux {}).\n",
            first3(&self.before),
            first3(&after),
            std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
            cpu_model(),
            std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim()
        )
    }
}

/// The CPU, as /proc/cpuinfo names it.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned()))
        .unwrap_or_default()
}

/// (rounds, seconds per timing) of a side-by-side section at `effort`.
pub fn rounds(effort: &str) -> (usize, f64) {
    match effort {
        "rigorous" => (20, 0.1),
        "normal" => (10, 0.05),
        _ => (5, 0.05),
    }
}

/// The section of the BENCHMARKS.md at `path` that starts with `heading`,
/// up to the next `## ` heading or `also_ends` (whichever comes first),
/// with one blank line after it; empty where there is none. What a full
/// `cargo xtask bench` keeps of sections it does not write.
pub fn kept_section(path: &std::path::Path, heading: &str, also_ends: Option<&str>) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let Some(start) = text.find(heading) else { return String::new() };
    let rest = &text[start..];
    let end = [rest[1..].find("\n## ").map(|i| i + 2), also_ends.and_then(|e| rest.find(e).map(|i| i + 1))]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(rest.len());
    let mut kept = rest[..end].trim_end().to_owned();
    kept.push_str("\n\n");
    kept
}
