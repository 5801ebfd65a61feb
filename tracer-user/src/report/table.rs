//! The human-readable table.

use std::io::Write;

use super::{Reporter, group};
use crate::{
    model::{Attached, Budget, Cost, EndKind, Event, LateCoverage, Links, ProbeCounts, Snapshot, Summary},
    plan::coverage::Completeness,
};

/// Prints a block per interval with rates over that interval, and a final
/// block with rates averaged over the whole run; notes go to `err`.
pub struct TableReporter<W: Write, E: Write> {
    out: W,
    err: E,
    /// The attach header, for which probes measure bytes and whether to
    /// list processes even when there is only one (`--exe`).
    attached: Option<Attached>,
}

impl<W: Write, E: Write> TableReporter<W, E> {
    pub const fn new(out: W, err: E) -> Self {
        Self { out, err, attached: None }
    }

    fn measures_bytes(&self, probe: &str) -> bool {
        self.attached.as_ref().is_some_and(|a| a.measures_bytes(probe))
    }

    fn block(&mut self, title: &str, sample: &Snapshot) -> std::io::Result<()> {
        match sample.cost.as_ref().map(cost_text) {
            Some(cost) => writeln!(self.out, "{title}  {cost}")?,
            None => writeln!(self.out, "{title}")?,
        }
        let (returns, call_sites) =
            self.attached.as_ref().map_or((false, false), |a| (!a.returns.is_empty(), !a.call_sites.is_empty()));
        let warning = sample.cost.and_then(|c| c.warning(sample.budget.map(|b| b.percent), returns, call_sites));
        if let Some(warning) = warning {
            writeln!(self.out, "  WARNING: {warning}")?;
        }
        if let Some(b) = &sample.budget {
            return self.estimate_block(sample, b);
        }
        let with_returns = sample.probes.values().any(|p| p.returned.is_some());
        let extra = if with_returns { format!(" {:>14} {:>8}", "returns", "NULL") } else { String::new() };
        writeln!(
            self.out,
            "  {:<20} {:>14} {:>12} {:>16} {:>14}{extra}",
            "function", "calls", "calls/s", "bytes", "bytes/s"
        )?;
        for (name, p) in &sample.probes {
            let (bytes, bytes_rate) = match p.bytes_per_s {
                Some(r) if self.measures_bytes(name) => (group(p.bytes), group(round(r))),
                _ => ("-".to_owned(), "-".to_owned()),
            };
            let extra = match (with_returns, p.returned) {
                (false, _) => String::new(),
                (true, Some(r)) => format!(" {:>14} {:>8}", group(r.returns), group(r.null)),
                (true, None) => format!(" {:>14} {:>8}", "-", "-"),
            };
            writeln!(
                self.out,
                "  {:<20} {:>14} {:>12} {:>16} {:>14}{extra}",
                name,
                group(p.calls),
                group(round(p.calls_per_s.unwrap_or(0.0))),
                bytes,
                bytes_rate
            )?;
        }
        self.footer(sample)
    }

    /// `--budget`: counts of the traced windows, and rates estimated from
    /// them since attach, marked as estimates.
    fn estimate_block(&mut self, sample: &Snapshot, b: &Budget) -> std::io::Result<()> {
        writeln!(
            self.out,
            "  {:<20} {:>14} {:>24} {:>16} {:>28}",
            "function", "calls (traced)", "est. calls/s ±95%", "bytes (traced)", "est. bytes/s ±95%"
        )?;
        for (name, p) in &sample.probes {
            let (calls_rate, b_rate) = estimates(p);
            let (bytes, b_rate) =
                if self.measures_bytes(name) { (group(p.bytes), b_rate) } else { ("-".to_owned(), "-".to_owned()) };
            writeln!(
                self.out,
                "  {:<20} {:>14} {:>24} {:>16} {:>28}",
                name,
                group(p.calls),
                calls_rate,
                bytes,
                b_rate
            )?;
        }
        writeln!(
            self.out,
            "  ESTIMATES (--budget {}%): rates from {} windows that traced {:.2}s of {:.1}s ({:.2}%), as seen while traced; estimated cost to the target {:.2}% (a hit costs {:.0} ns single-stepped, {:.0} ns emulated here)",
            b.percent,
            b.windows,
            b.traced_s,
            sample.elapsed_s,
            b.traced_fraction * 100.0,
            b.estimated_overhead_fraction * 100.0,
            b.hit_cost_ns.single_stepped_ns,
            b.hit_cost_ns.emulated_ns,
        )?;
        self.footer(sample)
    }

    /// Requested sizes: per domain, the calls in each log2 bucket.
    fn sizes_block(&mut self, sizes: &crate::model::Sizes) -> std::io::Result<()> {
        let native = sizes.native.as_ref().unwrap_or(const { &Vec::new() });
        for (name, buckets) in [("object", &sizes.object), ("mem", &sizes.mem), ("raw", &sizes.raw), ("native", native)]
        {
            if buckets.is_empty() && !sizes.unsized_calls.contains_key(name) {
                continue;
            }
            let mut parts: Vec<String> = buckets
                .iter()
                .map(|&[lo, hi, calls, _]| {
                    let range = if lo == hi { group(lo) } else { format!("{}-{}", group(lo), group(hi)) };
                    format!("{range} B: {}", group(calls))
                })
                .collect();
            if let Some(n) = sizes.unsized_calls.get(name) {
                parts.push(format!("size unknown: {}", group(*n)));
            }
            writeln!(self.out, "  sizes {name:<6} {}", parts.join(" | "))?;
        }
        Ok(())
    }

    /// `--stacks`: the top allocation sites, and how many events have a
    /// stack.
    fn sites_block(
        &mut self,
        sites: &[crate::model::Site],
        coverage: Option<&crate::model::StackCoverage>,
    ) -> std::io::Result<()> {
        let estimated = sites.iter().any(|s| s.estimate);
        let mark = if estimated { " (estimates)" } else { "" };
        writeln!(self.out, "  {:<28} {:<32} {:>12} {:>14}", format!("site{mark}"), "file:line", "calls", "bytes")?;
        for s in sites {
            let file = s.file.rsplit('/').next().unwrap_or(&s.file);
            let at = s.line.map_or_else(|| file.to_owned(), |l| format!("{file}:{l}"));
            writeln!(self.out, "  {:<28} {:<32} {:>12} {:>14}", s.function, at, group(s.calls), group(s.bytes))?;
        }
        if let Some(c) = coverage {
            let about = if c.estimate { format!(", 1 in {} sampled", c.sample) } else { String::new() };
            let truncated =
                if c.truncated > 0 { format!("; {} cut at --depth", group(c.truncated)) } else { String::new() };
            writeln!(
                self.out,
                "  stacks: {} of {} events{about}{truncated} (stack_* in BPF misses say why the others have none)",
                group(c.stacked),
                group(c.events)
            )?;
        }
        Ok(())
    }

    /// `--types`: the types most created, then those with the most live
    /// objects (see [`super::types`]).
    fn types_block(&mut self, types: &[crate::model::TypeCount]) -> std::io::Result<()> {
        super::types::block(&mut self.out, types, TOP_TYPES, (group, round))
    }

    /// With `--native`: the calls one probed libc function made of another
    /// (glibc's `realloc` relaying to `malloc` and `free`), which the rows
    /// above leave out.
    fn nested_block(&mut self, sample: &Snapshot) -> std::io::Result<()> {
        let parts: Vec<String> = sample
            .probes
            .iter()
            .filter_map(|(name, c)| {
                let n = c.nested?;
                Some(format!("{name}: {} calls, {} B", group(n.calls), group(n.bytes)))
            })
            .collect();
        if parts.is_empty() {
            return Ok(());
        }
        writeln!(
            self.out,
            "  nested (made by another libc allocator function, counted once there) {}",
            parts.join(" | ")
        )
    }

    /// Garbage collections by generation: how many, how long in all, and
    /// the objects found unreachable.
    fn gc_block(&mut self, gc: &crate::model::Gc) -> std::io::Result<()> {
        if gc.generations.is_empty() {
            // Said once, in the header.
            return Ok(());
        }
        let parts: Vec<String> = gc
            .generations
            .iter()
            .map(|g| {
                let which = g.generation.map_or_else(|| "gen ?".to_owned(), |n| format!("gen {n}"));
                let rate = g.collections_per_s.map_or(String::new(), |r| format!(" ({r:.1}/s)"));
                format!(
                    "{which}: {}{rate} in {}, {} unreachable",
                    group(g.collections),
                    duration(g.duration_s),
                    group(g.collected)
                )
            })
            .collect();
        writeln!(self.out, "  gc ({}) {}", source_name(gc.source), parts.join(" | "))
    }

    fn footer(&mut self, sample: &Snapshot) -> std::io::Result<()> {
        if let Some(sizes) = &sample.sizes {
            self.sizes_block(sizes)?;
        }
        self.nested_block(sample)?;
        if let Some(gc) = &sample.gc {
            self.gc_block(gc)?;
        }
        if let Some(live) = &sample.live {
            super::live::live(&mut self.out, live)?;
        }
        if let Some(leaks) = &sample.leaks {
            super::live::leaks(&mut self.out, leaks)?;
        }
        if let Some(types) = &sample.types {
            self.types_block(types)?;
        }
        if let Some(sites) = &sample.sites {
            self.sites_block(sites, sample.stack_coverage.as_ref())?;
        }
        let per_process = self.attached.as_ref().is_some_and(|a| a.pid.is_none());
        if per_process || sample.pids.len() > 1 {
            for (pid, probes) in &sample.pids {
                let calls: u64 = probes.values().map(|c| c.calls).sum();
                let bytes: u64 = probes.values().map(|c| c.bytes).sum();
                writeln!(self.out, "  PID {pid:<16} {:>14} calls {:>23} bytes", group(calls), group(bytes))?;
            }
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
        let nonzero: Vec<String> =
            sample.stats.iter().filter(|(_, v)| **v > 0).map(|(name, v)| format!("{name}={v}")).collect();
        if !nonzero.is_empty() {
            let lossy = sample.stats.iter().any(|(name, v)| *v > 0 && Snapshot::is_loss(name));
            let note = if lossy { " (some events were NOT counted)" } else { "" };
            writeln!(self.out, "  BPF misses: {}{note}", nonzero.join(" "))?;
        }
        writeln!(self.out)?;
        self.out.flush()
    }

    fn header(&mut self, info: &Attached) -> std::io::Result<()> {
        let what = match (&info.pid, &info.exe) {
            (Some(pid), _) => match info.pid_in_namespace {
                Some(inner) => format!("PID {pid} (PID {inner} in its namespace)"),
                None => format!("PID {pid}"),
            },
            (None, Some(exe)) => format!("every process running {exe}"),
            (None, None) => "every process".to_owned(),
        };
        writeln!(
            self.out,
            "tracer: attached to {what} (Python {}, {}): {} probes live ({}){}{}",
            info.python.version,
            info.python.image,
            info.probes.len(),
            if info.links == Links::Multi { "uprobe-multi links" } else { "perf-event uprobes" },
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
        for (name, c) in info.coverage.iter().filter(|(_, c)| c.is_partial()) {
            let mut parts = Vec::new();
            if c.calls == Completeness::Partial {
                parts.push("calls");
            }
            if c.bytes == Completeness::Partial {
                parts.push("bytes");
            }
            if c.types == Some(Completeness::Partial) {
                parts.push("types");
            }
            let what = parts.join(" and ");
            let why = c.reason.as_deref().unwrap_or("some copies are not probed");
            let fix = c.fix.as_ref().map_or(String::new(), |f| format!("; fix: {f}"));
            writeln!(self.out, "tracer: coverage: {name}: {what} PARTIAL: {why}{fix}")?;
        }
        if let Some(gc) = &info.gc {
            writeln!(self.out, "tracer: gc: {}", gc.detail)?;
            if let Some(caveat) = &gc.caveat {
                writeln!(self.out, "tracer: gc: PARTIAL: {caveat}")?;
            }
        }
        // By site where the attach says (inlined copies and call sites each
        // have their own instruction), else by each probe's placement.
        let stepped: Vec<String> = if info.sites.is_empty() {
            info.placements.iter().filter(|(_, p)| !p.emulated).map(|(name, _)| name.clone()).collect()
        } else {
            info.sites
                .iter()
                .filter(|(_, k)| k.single_stepped > 0)
                .map(|(name, k)| match k.emulated {
                    0 if k.single_stepped == 1 => name.clone(),
                    0 => format!("{name} (all {} sites)", k.single_stepped),
                    emulated => format!("{name} ({} of its {} sites)", k.single_stepped, emulated + k.single_stepped),
                })
                .collect()
        };
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

    fn summary(&mut self, s: &Summary) -> std::io::Result<()> {
        let why = match (s.end, &s.signal) {
            (EndKind::Duration, _) => "--duration elapsed".to_owned(),
            (EndKind::Signal, Some(name)) => format!("{name} received"),
            (EndKind::Signal, None) => "a signal received".to_owned(),
            (EndKind::TargetExit, _) => "the target exited".to_owned(),
        };
        let title = format!("summary after {:.1}s ({why}; probes detached), rates are averages:", s.snapshot.elapsed_s);
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

/// The GC source as the table names it.
const fn source_name(source: crate::plan::gc::GcSource) -> &'static str {
    match source {
        crate::plan::gc::GcSource::Markers => "markers",
        crate::plan::gc::GcSource::Function => "function",
        crate::plan::gc::GcSource::None => "none",
    }
}

/// A duration to a readable precision: "0 s", "312 µs", "4.21 ms",
/// "1.502 s".
fn duration(seconds: f64) -> String {
    if seconds == 0.0 {
        "0 s".to_owned()
    } else if seconds < 1e-3 {
        format!("{:.0} µs", seconds * 1e6)
    } else if seconds < 1.0 {
        format!("{:.2} ms", seconds * 1e3)
    } else {
        format!("{seconds:.3} s")
    }
}

/// How many types the table lists.
const TOP_TYPES: usize = 10;

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a displayed rate")]
fn round(rate: f64) -> u64 {
    rate.round() as u64
}

/// "cost ≈3.4% of target CPU (estimate)", with a range where some probe's
/// hits could not be told apart by the kind of site.
fn cost_text(c: &Cost) -> String {
    let text = match (c.overhead_fraction, c.overhead_fraction_low) {
        (Some(high), Some(low)) => format!("cost ≈{}–{} of target CPU (estimate)", percent(low), percent(high)),
        (Some(high), None) => format!("cost ≈{} of target CPU (estimate)", percent(high)),
        (None, _) if c.hits == 0 && c.unpriced_hits > 0 => "cost unknown".to_owned(),
        (None, _) => format!(
            "cost ≈{:.1} ms of probe time (estimate; the target used too little CPU time to compare)",
            c.tracer_cpu_s * 1e3
        ),
    };
    if c.unpriced_hits == 0 {
        return text;
    }
    format!("{text}; {} hits of processes that exited between readings are not priced", group(c.unpriced_hits))
}

/// A share as a percentage, to a sensible precision.
fn percent(share: f64) -> String {
    let p = share * 100.0;
    if p > 0.0 && p < 0.1 {
        "<0.1%".to_owned()
    } else if p < 10.0 {
        format!("{p:.1}%")
    } else {
        format!("{p:.0}%")
    }
}

/// The estimated call and byte rates of a `--budget` probe.
fn estimates(p: &ProbeCounts) -> (String, String) {
    p.estimate.map_or_else(
        || ("?".to_owned(), "?".to_owned()),
        |e| (estimate(e.calls_per_s, e.calls_per_s_ci95), estimate(e.bytes_per_s, e.bytes_per_s_ci95)),
    )
}

/// "1,234 ±56", or "1,234 ±?" before there are two windows to compare.
fn estimate(per_s: f64, ci95: Option<[f64; 2]>) -> String {
    let value = group(round(per_s));
    match ci95 {
        Some([lo, hi]) => format!("{value} ±{}", group(round((hi - lo) / 2.0))),
        None => format!("{value} ±?"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::{End, LateModule},
        report::examples::{attached, budget_snapshot, snapshot},
    };

    fn render(events: &[Event]) -> String {
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
    fn header_names_call_sites_and_single_stepped_probes() {
        use crate::plan::placement::Placement;
        let placed = Placement { offset: 7, instruction: "push %rbx".into(), emulated: true, reason: String::new() };
        let mut info = attached(Some(12));
        info.probes = vec!["_Py_NewReference".into(), "_Py_Dealloc".into(), "PyObject_Free".into()];
        info.missing = vec![];
        info.placements = [
            ("_Py_NewReference".to_owned(), placed.clone()),
            ("_Py_Dealloc".to_owned(), Placement { instruction: "10989 calls".into(), ..placed }),
            ("PyObject_Free".to_owned(), Placement::at_entry("entry".into())),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            render(&[Event::Attached(info)]),
            "tracer: attached to PID 12 (Python 3.11.7, /lib/libpython3.11.so.1.0): 3 probes live (uprobe-multi links); \
             _Py_Dealloc at 10989 call sites\n\
             tracer: single-stepped, so each hit costs a debug trap (see `tracer probes`): PyObject_Free\n\n"
        );
    }

    #[test]
    fn gc_is_a_line_per_block_and_said_once_when_not_seen() {
        use crate::{
            model::{Gc, GcGeneration},
            plan::gc::{GcPlan, GcSource},
        };
        let generation = |generation, collections, duration_s, collected| GcGeneration {
            generation,
            collections,
            duration_s,
            collected,
            collections_per_s: Some(2.0),
        };
        let mut info = attached(Some(12));
        info.gc = Some(GcPlan { caveat: Some("entry does not say".into()), ..GcPlan::none("the markers") });
        let mut sample = snapshot(1000, 1);
        sample.gc = Some(Gc {
            source: GcSource::Markers,
            reason: None,
            generations: vec![
                generation(Some(0), 1234, 0.000_312, 0),
                generation(Some(2), 2, 0.004_21, 6000),
                generation(None, 1, 1.502, 7),
            ],
            pids: indexmap::IndexMap::new(),
        });
        let text = render(&[Event::Attached(info), Event::Interval(sample)]);
        assert!(text.contains("tracer: gc: the markers\ntracer: gc: PARTIAL: entry does not say\n"), "{text}");
        let line = text.lines().find(|l| l.starts_with("  gc ")).expect("a gc line");
        assert_eq!(
            line,
            "  gc (markers) gen 0: 1,234 (2.0/s) in 312 µs, 0 unreachable | gen 2: 2 (2.0/s) in 4.21 ms, 6,000 unreachable | gen ?: 1 (2.0/s) in 1.502 s, 7 unreachable"
        );
        let mut none = snapshot(1000, 1);
        none.gc = Some(Gc {
            source: GcSource::None,
            reason: Some("no markers".into()),
            generations: vec![],
            pids: indexmap::IndexMap::new(),
        });
        assert!(!render(&[Event::Interval(none)]).contains("  gc "));
        assert_eq!(duration(0.0), "0 s");
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
            text.contains("ESTIMATES (--budget 1%): rates from 4 windows that traced 0.10s of 10.0s (1.00%), as seen while traced; estimated cost to the target 0.90%"),
            "{text}"
        );
    }

    fn cost(high: f64, low: Option<f64>) -> Cost {
        Cost {
            estimate: true,
            overhead_fraction: Some(high),
            overhead_fraction_low: low,
            tracer_cpu_s: high,
            target_cpu_s: 1.0,
            hits: 1000,
            unpriced_hits: 0,
            hit_cost_ns: crate::plan::HitCosts { single_stepped_ns: 15_000.0, emulated_ns: 500.0 },
        }
    }

    /// Hits no CPU reading goes with are counted, and where no hit is
    /// priced there is no share: never a cost of 0 for hits unseen.
    #[test]
    fn unpriced_hits_are_said_and_never_cost_nothing() {
        let none =
            Cost { overhead_fraction: Some(0.0), hits: 0, tracer_cpu_s: 0.0, ..cost(0.0, None) }.of_all_hits(500);
        assert_eq!((none.overhead_fraction, none.unpriced_hits), (None, 500));
        assert_eq!(cost_text(&none), "cost unknown; 500 hits of processes that exited between readings are not priced");
        let some = cost(0.25, None).of_all_hits(1500);
        assert_eq!((some.overhead_fraction, some.unpriced_hits), (Some(0.25), 500));
        assert!(cost_text(&some).ends_with("; 500 hits of processes that exited between readings are not priced"));
        assert_eq!(cost(0.25, None).of_all_hits(1000).unpriced_hits, 0);
    }

    #[test]
    fn intervals_show_the_estimated_cost_and_warn_when_high() {
        let mut low = snapshot(1000, 1);
        low.cost = Some(cost(0.034, None));
        let mut ranged = snapshot(2000, 2);
        ranged.cost = Some(cost(0.25, Some(0.004)));
        let mut last = snapshot(3000, 3);
        last.cost = Some(cost(0.5, None));
        let unknown = snapshot(500, 1);
        let mut info = attached(Some(12));
        info.call_sites.clear();
        let text = render(&[
            Event::Attached(info),
            Event::Interval(unknown),
            Event::Interval(low),
            Event::Interval(ranged),
            Event::Summary(Summary::new(last, End::Duration)),
        ]);
        let titles: Vec<&str> = text.lines().filter(|l| l.starts_with('[') || l.starts_with("summary")).collect();
        assert_eq!(
            titles,
            [
                // Before the cost of a hit is known: no figure, not a zero.
                "[     0.5s]",
                "[     1.0s]  cost ≈3.4% of target CPU (estimate)",
                "[     2.0s]  cost ≈0.4%–25% of target CPU (estimate)",
                "summary after 3.0s (--duration elapsed; probes detached), rates are averages:  cost ≈50% of target CPU (estimate)",
            ]
        );
        let warnings: Vec<&str> = text.lines().filter(|l| l.starts_with("  WARNING")).collect();
        assert_eq!(warnings.len(), 2, "{text}");
        assert_eq!(
            warnings[0],
            "  WARNING: tracing costs the target an estimated 25% of its CPU time (a CPU-bound target runs about 1.3× slower); --budget PERCENT keeps the cost near PERCENT% by tracing in windows"
        );
    }

    #[test]
    fn the_header_counts_single_stepped_sites() {
        use crate::model::SiteKinds;
        let mut info = attached(Some(12));
        info.call_sites.clear();
        info.sites = [
            ("_Py_NewReference".to_owned(), SiteKinds { emulated: 1, single_stepped: 208 }),
            ("PyObject_Malloc".to_owned(), SiteKinds { emulated: 1, single_stepped: 0 }),
            ("_Py_Dealloc".to_owned(), SiteKinds { emulated: 0, single_stepped: 1 }),
        ]
        .into_iter()
        .collect();
        let text = render(&[Event::Attached(info)]);
        assert!(
            text.contains(
                "tracer: single-stepped, so each hit costs a debug trap (see `tracer probes`): _Py_NewReference (208 of its 209 sites), _Py_Dealloc\n"
            ),
            "{text}"
        );
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
}
