//! The human-readable table.
//!
//! The header is written in `header`, the blocks each feature adds under
//! the counts in `blocks`, and the cost in a block's title in `cost`.

mod blocks;
mod cost;
mod functions;
pub(crate) mod growth;
mod header;
pub(crate) mod heap;

use std::io::Write;

use tracer_common::stats::Stat;

use self::cost::cost_text;
use super::{Reporter, group};
use crate::model::{Attached, EndKind, Event, LateCoverage, ProbeCounts, Snapshot, Summary};

/// Prints a block per interval with rates over that interval, and a final
/// block with rates averaged over the whole run; notes go to `err`.
pub struct TableReporter<W: Write, E: Write> {
    out: W,
    err: E,
    /// The attach header, for which probes measure bytes and whether to
    /// list processes even when there is only one (`--exe`).
    attached: Option<Attached>,
    /// The heap census's gaps (`partial`) already printed in full.
    told_partial: Vec<String>,
}

impl<W: Write, E: Write> TableReporter<W, E> {
    pub const fn new(out: W, err: E) -> Self {
        Self { out, err, attached: None, told_partial: Vec::new() }
    }

    fn measures_bytes(&self, probe: &str) -> bool {
        self.attached.as_ref().is_some_and(|a| a.measures_bytes(probe))
    }

    fn block(&mut self, title: &str, sample: &Snapshot) -> std::io::Result<()> {
        // The production profile shows one cost, its ledger's: the hits'
        // estimate (`cost` in the JSON) prices the same windows.
        let cost = if sample.profile.is_some() { None } else { sample.cost.as_ref().map(cost_text) };
        match cost {
            Some(cost) => writeln!(self.out, "{title}  {cost}")?,
            None => writeln!(self.out, "{title}")?,
        }
        // Call sites that `auto` took are no reason to drop them for
        // `--budget`: with it, `auto` stays inside.
        let refuses = crate::model::BudgetRefuses {
            types: sample.types.is_some(),
            stacks: sample.sites.is_some() || sample.stacks.is_some(),
            live: sample.live.is_some(),
            native: self.attached.as_ref().is_some_and(|a| a.native.is_some()),
            returns: self.attached.as_ref().is_some_and(|a| !a.returns.is_empty()),
            call_sites: self.attached.as_ref().is_some_and(|a| a.call_sites_asked),
        }
        .flags();
        let mut cost = sample.cost;
        if let (Some(c), Some(p)) = (cost.as_mut(), &sample.profile) {
            c.overhead_fraction = Some(p.fraction);
            c.overhead_fraction_low = None;
        }
        // The user's budget: in the profile, `budget.percent` is the rates'
        // share of it.
        let budget = sample.profile.as_ref().map(|p| p.budget_percent).or(sample.budget.map(|b| b.percent));
        // In the profile, what took it over its budget: a lower --budget
        // would not lower what the first window, the census or tracer's
        // own work cost.
        let warning = match &sample.profile {
            Some(p) => p.over_budget(),
            None => cost.and_then(|c| c.warning(budget, &refuses)),
        };
        if let Some(warning) = warning {
            writeln!(self.out, "  WARNING: {warning}")?;
        }
        if let Some(p) = &sample.profile {
            writeln!(self.out, "{}", profile_line(p))?;
        }
        if let Some(b) = &sample.budget {
            return self.estimate_block(sample, b);
        }
        self.function_rows(sample)?;
        self.unsized_line(sample)?;
        self.footer(sample)
    }

    /// Under the rows: what a "≥" on bytes means, where some calls'
    /// sizes are unknown.
    fn unsized_line(&mut self, sample: &Snapshot) -> std::io::Result<()> {
        let Some(sizes) = &sample.sizes else { return Ok(()) };
        if sizes.unsized_calls.is_empty() {
            return Ok(());
        }
        let each: Vec<String> =
            sizes.unsized_calls.iter().map(|(domain, n)| format!("{} {domain} calls", group(*n))).collect();
        writeln!(
            self.out,
            "  ≥: bytes of the calls whose size is known only; unknown for {} (inlined copies where neither the DWARF nor the code shows it)",
            each.join(", ")
        )
    }

    fn footer(&mut self, sample: &Snapshot) -> std::io::Result<()> {
        if let Some(sizes) = &sample.sizes {
            self.sizes_block(sizes)?;
        }
        self.nested_block(sample)?;
        if let Some(gc) = &sample.gc {
            let stat = |s: Stat| sample.stats.get(s.name()).copied().unwrap_or(0);
            self.gc_block(gc, (stat(Stat::GcFull), stat(Stat::GcUnmatched)))?;
        }
        if let Some(h) = &sample.heap {
            heap::heap_block(&mut self.out, h, &mut self.told_partial)?;
        }
        if let Some(live) = &sample.live {
            super::live::live(&mut self.out, live)?;
        }
        if let Some(leaks) = &sample.leaks {
            super::live::leaks(&mut self.out, leaks)?;
        }
        if let Some(types) = &sample.types {
            let missed = |name| sample.stats.get(name).copied().unwrap_or(0);
            self.types_block(types, (missed("types_full"), missed("objects_full")))?;
        }
        if let Some(sites) = &sample.sites {
            self.sites_block(sites, sample.stack_coverage.as_ref())?;
        }
        if let Some(growth) = &sample.growth {
            // In the profile, its cost as the ledger has it: a share of the
            // target's CPU time, as every other cost there.
            let share =
                sample.profile.as_ref().and_then(|p| p.sources.get(crate::model::GROWTH_SOURCE)).map(|s| s.fraction);
            self.growth_block(growth, share)?;
        }
        let per_process = self.attached.as_ref().is_some_and(|a| a.pid.is_none());
        // In windows (the profile, --budget) a process's counts are of the
        // windows only, as the function table's "(traced)" says: never a
        // bare "calls" that reads as its total.
        let traced = if sample.budget.is_some() { " (traced)" } else { "" };
        if per_process || sample.pids.len() > 1 {
            for (pid, probes) in &sample.pids {
                let calls: u64 = probes.values().map(|c| c.calls).sum();
                let bytes: u64 = probes.values().map(|c| c.bytes).sum();
                writeln!(
                    self.out,
                    "  PID {pid:<16} {:>14} calls{traced} {:>23} bytes{traced}",
                    group(calls),
                    group(bytes)
                )?;
                if let Some(info) = sample.processes.get(pid) {
                    writeln!(self.out, "      {}", process_line(info))?;
                }
            }
        }
        // Found and traced, but nothing counted: between a budget's
        // windows its calls are not seen; traced in full, it made none.
        let uncounted = if sample.budget.is_some() { "no call seen in a window" } else { "no call counted" };
        for (pid, info) in sample.processes.iter().filter(|(p, i)| i.skipped.is_none() && !sample.pids.contains_key(*p))
        {
            writeln!(self.out, "  PID {pid:<16} {uncounted}")?;
            writeln!(self.out, "      {}", process_line(info))?;
        }
        for (pid, info) in sample.processes.iter().filter(|(_, i)| i.skipped.is_some()) {
            writeln!(self.out, "  PID {pid:<16} NOT traced: {}", info.skipped.as_deref().unwrap_or_default())?;
            writeln!(self.out, "      {}", process_line(info))?;
        }
        for l in &sample.late_modules {
            let since = l.since_s;
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
        // Passes through a jump probed for a copy that went elsewhere are
        // no miss, only cost (in the JSON's stats).
        // What BPF programs and the kernel missed apart from what tracer's
        // own reads did (a reading that failed, a map read a key at a
        // time): each line says whether events are missing.
        let gate = Stat::GateOther.name();
        for (bpf, title) in [(true, "BPF misses"), (false, "tracer's own misses and fallbacks")] {
            let nonzero: Vec<(&String, &u64)> = sample
                .stats
                .iter()
                .filter(|(name, v)| **v > 0 && name.as_str() != gate && Snapshot::is_bpf(name) == bpf)
                .collect();
            if nonzero.is_empty() {
                continue;
            }
            let lossy = nonzero.iter().any(|(name, _)| Snapshot::is_loss(name));
            let note = match (lossy, bpf) {
                (true, _) => " (some events were NOT counted)",
                (false, true) => "",
                (false, false) => " (no event missing)",
            };
            let each: Vec<String> = nonzero.iter().map(|(name, v)| format!("{name}={v}")).collect();
            writeln!(self.out, "  {title}: {}{note}", each.join(" "))?;
        }
        writeln!(self.out)?;
        self.out.flush()
    }

    fn summary(&mut self, s: &Summary) -> std::io::Result<()> {
        let why = match (s.end, &s.signal) {
            (EndKind::Duration, _) => "--duration elapsed".to_owned(),
            (EndKind::Signal, Some(name)) => format!("{name} received"),
            (EndKind::Signal, None) => "a signal received".to_owned(),
            (EndKind::TargetExit, _) => "the target exited".to_owned(),
            (EndKind::TargetExec, _) => "the target called exec: it runs another program".to_owned(),
            (EndKind::OutputClosed, _) => "the report's output was closed (broken pipe)".to_owned(),
        };
        let title = format!("summary after {:.1}s ({why}; probes detached), rates are averages:", s.snapshot.elapsed_s);
        // The summary stands alone (it is what a run with --duration
        // leaves last, and what is kept): every heap gap in full, not "as
        // above" of an interval that may have scrolled away.
        self.told_partial.clear();
        self.block(&title, &s.snapshot)
    }
}

impl<W: Write, E: Write> Reporter for TableReporter<W, E> {
    fn event(&mut self, event: &Event) -> std::io::Result<()> {
        match event {
            Event::Attached(info) => {
                self.header(info)?;
                self.attached = Some(info.clone());
                Ok(())
            }
            Event::Interval(sample) => self.block(&format!("[{:>8.1}s]", sample.elapsed_s), sample),
            Event::Note(note) => super::note_line(&mut self.err, note),
            Event::Summary(s) => self.summary(s),
        }
    }
}

/// The calls of `probe`'s allocator domain whose size is unknown.
fn unsized_calls(sample: &Snapshot, probe: &str) -> u64 {
    let Some(domain) = crate::python::domain(probe) else { return 0 };
    sample.sizes.as_ref().and_then(|s| s.unsized_calls.get(domain.name())).copied().unwrap_or(0)
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a displayed rate")]
fn round(rate: f64) -> u64 {
    rate.round() as u64
}

/// The estimated call and byte rates of a `--budget` probe.
fn estimates(p: &ProbeCounts) -> (String, String) {
    p.estimate.map_or_else(
        || ("?".to_owned(), "?".to_owned()),
        |e| {
            (
                estimate(e.calls_per_s, e.calls_per_s_ci95, e.lower_bound),
                estimate(e.bytes_per_s, e.bytes_per_s_ci95, e.lower_bound),
            )
        },
    )
}

/// "1,234 ±56"; "1,234 (1,100-1,900)" where the interval is lopsided (the
/// windows' slowdown widens it upwards); "1,234 (≥1,100)" where it has no
/// upper end; "1,234 ±?" before there are two windows to compare; "?"
/// for a zero with no upper end (bytes where no call was seen, or a
/// target slowed past knowing by how much).
fn estimate(per_s: f64, ci95: Option<[f64; 2]>, lower_bound: bool) -> String {
    let value = group(round(per_s));
    if !crate::model::rate_told(per_s, ci95) {
        // No call seen, and nothing bounds the rate from above (no
        // interval yet, or windows that slowed the target past knowing by
        // how much): not a zero.
        return "?".to_owned();
    }
    match ci95 {
        Some([lo, hi]) if lower_bound || !hi.is_finite() => format!("{value} (≥{})", group(round(lo))),
        Some([lo, hi]) if (hi - per_s) > 1.1 * (per_s - lo) + 0.5 => {
            format!("{value} ({}-{})", group(round(lo)), group(round(hi)))
        }
        Some([lo, hi]) => format!("{value} ±{}", group(round((hi - lo) / 2.0))),
        None if lower_bound => format!("≥{value} ±?"),
        None => format!("{value} ±?"),
    }
}

/// What the windows' slowdown of the target did to the rates.
fn slowdown(s: crate::model::Slowdown) -> String {
    let likely = s.likely.map_or_else(String::new, |l| format!(", likely {l:.1}x"));
    match s.at_most {
        Some(most) if most < 1.05 => "at the target's pace (the windows did not slow it)".to_owned(),
        Some(most) => {
            format!("taken to the target's pace untraced: the windows slowed it {:.1}x-{most:.1}x{likely}", s.at_least)
        }
        None => format!(
            "taken to the target's pace untraced: the windows slowed it at least {:.1}x{likely}, perhaps far more (their hits took nearly all its CPU time), so the rates are lower bounds; a short --exact look counts every event",
            s.at_least
        ),
    }
}

/// The production profile's cost, by source, against its budget.
fn profile_line(p: &crate::model::ProfileCost) -> String {
    let parts: Vec<String> = p
        .sources
        .iter()
        // The first window's is in the interval it ran in and the run's.
        .filter(|(name, s)| *name != crate::model::FIRST_WINDOW_SOURCE || s.target_s > 0.0)
        .map(|(name, s)| {
            let tracer = if s.tracer_cpu_s > 0.0 || s.bytes_read > 0 {
                format!(
                    " (tracer: {:.2} ms CPU, {} read)",
                    s.tracer_cpu_s * 1e3,
                    crate::heap::print::bytes(s.bytes_read)
                )
            } else {
                String::new()
            };
            let once = if name == crate::model::FIRST_WINDOW_SOURCE {
                format!(" ({:.1} ms, once: the attach's, before the target had paid for any)", s.target_s * 1e3)
            } else {
                String::new()
            };
            format!("{} {:.3}%{once}{tracer}", name.replace('_', " "), s.fraction * 100.0)
        })
        .collect();
    let paid = p.first_window_paid_by_s().map_or_else(String::new, |s| {
        format!("; over the budget by the first window alone, which a run of about {s:.0} s or more pays for (the windows after it wait until it is paid for)")
    });
    // The budget holds over the run: an interval's own figure is over it
    // where a census falls in it.
    let so_far = p.so_far.as_ref().map_or_else(String::new, |run| {
        format!("; the run so far ≈{:.3}% ({:.2} s of CPU time)", run.fraction * 100.0, run.target_cpu_s)
    });
    format!(
        "  profile cost ≈{:.3}% of the target's CPU time ({:.2} s of it; budget {}%): {}{paid}{so_far}",
        p.fraction * 100.0,
        p.target_cpu_s,
        (p.budget_percent * 1e6).round() / 1e6,
        parts.join(", ")
    )
}

/// What `--all` knows of a process, on one line, escaped: its namespace
/// PID, command line, container and root.
fn process_line(info: &crate::model::ProcessInfo) -> String {
    use crate::text::display;
    let mut parts = Vec::new();
    if let Some(inner) = info.pid_in_namespace {
        parts.push(format!("PID {inner} in its namespace"));
    }
    parts.push(if info.command.is_empty() { "(exited before it was read)".to_owned() } else { display(&info.command) });
    if let Some(c) = &info.container {
        parts.push(format!("cgroup {}", display(c)));
    }
    if let Some(r) = &info.root {
        parts.push(format!("root {}", display(r)));
    }
    parts.join(" · ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::{End, LateModule},
        report::examples::{attached, budget_snapshot, snapshot},
    };

    pub(super) fn render(events: &[Event]) -> String {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut r = TableReporter::new(&mut out, &mut err);
        for e in events {
            r.event(e).unwrap();
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn groups_thousands() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(group(1_234_567), "1,234,567");
    }

    #[test]
    fn interval_rates_are_per_interval() {
        // Rates come from the model; the table only prints them.
        let info = attached(Some(12));
        let first = snapshot(1000, 1);
        let mut second = snapshot(2000, 3);
        second.compute_rates(&info, Some(&first));
        let mut last = snapshot(4000, 4);
        last.compute_rates(&info, None);
        let text = render(&[
            Event::Attached(info),
            Event::Interval(first),
            Event::Interval(second),
            Event::Summary(Summary::new(last, End::Duration)),
        ]);
        let blocks: Vec<&str> = text.split("\n\n").skip(1).collect();
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
        let sample = budget_snapshot(4, 0.009, (1234.4, Some([1200.0, 1268.0])));
        let text = render(&[Event::Attached(attached(Some(12))), Event::Interval(sample)]);
        assert!(text.contains("est. calls/s ±95%"), "{text}");
        let row = text.lines().find(|l| l.contains("_Py_NewReference") && !l.contains("attached")).unwrap();
        assert_eq!(row.split_whitespace().collect::<Vec<_>>(), ["_Py_NewReference", "10", "1,234", "±34", "-", "-"]);
        let row = text.lines().find(|l| l.contains("PyObject_Malloc") && !l.contains("attached")).unwrap();
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["PyObject_Malloc", "4", "40", "±?", "4,000", "40,000", "±?"]
        );
        assert!(
            text.contains("ESTIMATES (--budget 1%): rates from 4 windows that traced 0.10s of 10.0s (1.00%), as seen while traced; estimated cost to the target 0.90% of its CPU time (a hit costs"),
            "{text}"
        );
    }

    /// Bytes that leave out calls of unknown size are marked as a lower
    /// bound, and the table says whose.
    #[test]
    fn bytes_missing_unsized_calls_are_at_least() {
        let info = attached(Some(12));
        let mut sample = snapshot(1000, 1);
        sample.compute_rates(&info, None);
        sample.sizes = Some(crate::model::Sizes {
            unsized_calls: [("object".to_owned(), 400)].into_iter().collect(),
            ..crate::model::Sizes::default()
        });
        let text = render(&[Event::Attached(info), Event::Interval(sample)]);
        let row = text.lines().find(|l| l.contains("PyObject_Malloc") && !l.contains("attached")).unwrap();
        assert_eq!(row.split_whitespace().collect::<Vec<_>>(), ["PyObject_Malloc", "4", "4", "≥4,000", "≥4,000"]);
        let row = text.lines().find(|l| l.contains("_Py_NewReference") && !l.contains("attached")).unwrap();
        assert!(!row.contains('≥'), "not an allocator of the object domain: {row}");
        assert!(text.contains("\n  ≥: bytes of the calls whose size is known only; unknown for 400 object calls (inlined copies where neither the DWARF nor the code shows it)\n"), "{text}");
    }

    /// A probe whose rate the windows could not tell from zero shows no
    /// figure, and the table says why; one bounded by windows that saw no
    /// call shows the bound, and its bytes no figure.
    #[test]
    fn a_rate_not_told_from_zero_is_no_zero() {
        let mut sample = budget_snapshot(4, 0.009, (1234.4, Some([1200.0, 1268.0])));
        // As the windows leave it: no call seen, in one window.
        let none = sample.probes.get_mut("PyObject_Malloc").unwrap();
        (none.estimate, none.calls, none.bytes) = (None, 0, 0);
        let text = render(&[Event::Attached(attached(Some(12))), Event::Interval(sample.clone())]);
        let row = text.lines().find(|l| l.contains("PyObject_Malloc") && !l.contains("attached")).unwrap();
        assert_eq!(row.split_whitespace().collect::<Vec<_>>(), ["PyObject_Malloc", "0", "?", "0", "?"]);
        assert!(text.contains("\n  ?: no call (or no size) seen while traced, which does not tell its rate from zero: too little traced (a bound needs two windows; a longer run gets more), or windows that slowed the target past knowing by how much\n"), "{text}");
        sample.probes.get_mut("PyObject_Malloc").unwrap().estimate = Some(crate::model::ProbeEstimate {
            calls_per_s: 0.0,
            calls_per_s_ci95: Some([0.0, 1151.0]),
            bytes_per_s: 0.0,
            bytes_per_s_ci95: None,
            lower_bound: false,
        });
        let text = render(&[Event::Attached(attached(Some(12))), Event::Interval(sample.clone())]);
        let row = text.lines().find(|l| l.contains("PyObject_Malloc") && !l.contains("attached")).unwrap();
        assert_eq!(row.split_whitespace().collect::<Vec<_>>(), ["PyObject_Malloc", "0", "0", "(0-1,151)", "0", "?"]);
        // Its bytes' `?` is explained too.
        assert!(text.contains("?: no call (or no size) seen"), "{text}");
        // Windows that slowed the target past knowing by how much leave a
        // zero no upper end: no figure either.
        let e = sample.probes.get_mut("PyObject_Malloc").unwrap().estimate.as_mut().unwrap();
        (e.calls_per_s_ci95, e.lower_bound) = (Some([0.0, f64::INFINITY]), true);
        let text = render(&[Event::Attached(attached(Some(12))), Event::Interval(sample)]);
        let row = text.lines().find(|l| l.contains("PyObject_Malloc") && !l.contains("attached")).unwrap();
        assert_eq!(row.split_whitespace().collect::<Vec<_>>(), ["PyObject_Malloc", "0", "?", "0", "?"]);
        assert!(text.contains("?: no call (or no size) seen"), "{text}");
    }

    #[test]
    fn slowed_rates_say_how_far_and_whether_bounded() {
        let mut sample = budget_snapshot(4, 0.009, (2000.0, Some([1500.0, 6000.0])));
        let slowed = crate::model::Slowdown { at_least: 2.0, likely: Some(3.0), at_most: Some(8.0) };
        sample.budget.as_mut().unwrap().slowdown = Some(slowed);
        let text = render(&[Event::Interval(sample.clone())]);
        let row = text.lines().find(|l| l.contains("_Py_NewReference")).unwrap();
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["_Py_NewReference", "10", "2,000", "(1,500-6,000)", "-", "-"]
        );
        assert!(
            text.contains("taken to the target's pace untraced: the windows slowed it 2.0x-8.0x, likely 3.0x;"),
            "{text}"
        );
        let budget = sample.budget.as_mut().unwrap();
        budget.slowdown = Some(crate::model::Slowdown { at_most: None, ..slowed });
        let e = sample.probes["_Py_NewReference"].estimate.as_mut().unwrap();
        e.calls_per_s_ci95 = Some([1500.0, f64::INFINITY]);
        e.lower_bound = true;
        let text = render(&[Event::Interval(sample)]);
        let row = text.lines().find(|l| l.contains("_Py_NewReference")).unwrap();
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["_Py_NewReference", "10", "2,000", "(≥1,500)", "-", "-"]
        );
        assert!(text.contains("slowed it at least 2.0x, likely 3.0x, perhaps far more"), "{text}");
        assert!(text.contains("so the rates are lower bounds"), "{text}");
    }

    #[test]
    fn a_process_found_but_not_counted_is_listed_as_such() {
        let info = crate::model::ProcessInfo { command: "python3 w.py".into(), ..Default::default() };
        for (mut sample, says) in [
            (snapshot(1000, 1), "no call counted"),
            (budget_snapshot(4, 0.009, (1234.4, None)), "no call seen in a window"),
        ] {
            sample.processes.insert("4242".into(), info.clone());
            let text = render(&[Event::Attached(attached(None)), Event::Interval(sample)]);
            let at = text.lines().position(|l| l.starts_with("  PID 4242 ")).unwrap_or_else(|| panic!("{text}"));
            let lines: Vec<&str> = text.lines().skip(at).take(2).collect();
            assert_eq!(lines[0].split_whitespace().collect::<Vec<_>>().join(" "), format!("PID 4242 {says}"));
            assert!(lines[1].contains("python3 w.py"), "{text}");
        }
    }

    /// In windows, a process's counts are marked as the windows' only.
    #[test]
    fn per_process_counts_in_windows_say_traced() {
        let mut probes = indexmap::IndexMap::new();
        probes.insert("PyObject_Malloc".to_owned(), crate::model::Counts { calls: 7259, bytes: 84424 });
        for (mut sample, says) in
            [(snapshot(1000, 1), "calls"), (budget_snapshot(4, 0.009, (1234.4, None)), "calls (traced)")]
        {
            sample.pids.insert("9028".into(), probes.clone());
            let text = render(&[Event::Attached(attached(None)), Event::Interval(sample)]);
            let line = text.lines().find(|l| l.starts_with("  PID 9028 ")).unwrap_or_else(|| panic!("{text}"));
            let bytes = if says == "calls" { "bytes" } else { "bytes (traced)" };
            assert_eq!(
                line.split_whitespace().collect::<Vec<_>>().join(" "),
                format!("PID 9028 7,259 {says} 84,424 {bytes}")
            );
        }
    }

    #[test]
    fn late_modules_say_from_when() {
        let mut sample = snapshot(3000, 1);
        sample.late_modules = vec![
            LateModule {
                path: "/venv/_psutil_linux.abi3.so".into(),
                since_s: 2.0,
                coverage: LateCoverage::Sites {
                    symbol: "_Py_Dealloc".into(),
                    sites: 1058,
                    escape: Some("relocation at 0x4010".into()),
                },
            },
            LateModule {
                path: "/venv/gone.so".into(),
                since_s: 2.5,
                coverage: LateCoverage::Failed { error: "cannot read it".into() },
            },
        ];
        let text = render(&[Event::Summary(Summary::new(sample, End::Duration))]);
        let late: Vec<&str> = text.lines().filter(|l| l.starts_with("  late: ")).collect();
        assert_eq!(
            late,
            [
                "  late: /venv/_psutil_linux.abi3.so (mapped after attaching): 1,058 calls to _Py_Dealloc counted from 2.0 s on; not its calls through the address (relocation at 0x4010)",
                "  late: /venv/gone.so (mapped after attaching): its calls are NOT counted (cannot read it)",
            ]
        );
    }

    /// tracer's own misses and fallbacks are not BPF misses: a line of
    /// their own, which says whether events are missing.
    #[test]
    fn tracers_own_misses_are_apart_from_the_bpf_misses() {
        let mut sample = snapshot(1000, 1);
        sample.stats[crate::model::MAP_BATCH_BUSY] = 3;
        let text = render(&[Event::Interval(sample.clone())]);
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("misses")).collect();
        assert_eq!(lines, ["  tracer's own misses and fallbacks: map_batch_busy=3 (no event missing)"], "{text}");
        sample.stats.insert(crate::model::GC_MEMORY_FAILED_COVERED.to_owned(), 1);
        sample.stats.insert("gc_memory_failed".to_owned(), 1);
        sample.stats["types_full"] = 2;
        let text = render(&[Event::Interval(sample)]);
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("misses")).collect();
        assert_eq!(
            lines,
            [
                "  BPF misses: types_full=2 (some events were NOT counted)",
                "  tracer's own misses and fallbacks: map_batch_busy=3 gc_memory_failed_covered=1 gc_memory_failed=1 (some events were NOT counted)",
            ],
            "{text}"
        );
    }
}
