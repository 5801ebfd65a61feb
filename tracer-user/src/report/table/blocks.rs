//! The table's blocks under an interval's counts, each there when its
//! feature is on: requested sizes, libc's nested calls, garbage
//! collections, object types and allocation sites.

use std::io::Write;

use super::{TableReporter, round};
use tracer_common::stats::Stat;

use crate::{model::Snapshot, report::group};

impl<W: Write, E: Write> TableReporter<W, E> {
    /// Requested sizes: per domain, the calls in each log2 bucket.
    pub(super) fn sizes_block(&mut self, sizes: &crate::model::Sizes) -> std::io::Result<()> {
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
    pub(super) fn sites_block(
        &mut self,
        sites: &[crate::model::Site],
        coverage: Option<&crate::model::StackCoverage>,
    ) -> std::io::Result<()> {
        let estimated = sites.iter().any(|s| s.estimate);
        let mark = if estimated { " (estimates)" } else { "" };
        writeln!(self.out, "  {:<28} {:<32} {:>12} {:>14}", format!("site{mark}"), "file:line", "calls", "bytes")?;
        for s in sites {
            let file = crate::text::display(s.file.rsplit('/').next().unwrap_or(&s.file));
            let at = s.line.map_or_else(|| file.clone(), |l| format!("{file}:{l}"));
            let function = crate::text::display(&s.function);
            writeln!(self.out, "  {:<28} {:<32} {:>12} {:>14}", function, at, group(s.calls), group(s.bytes))?;
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
    /// objects (see [`crate::report::types`]).
    pub(super) fn types_block(&mut self, types: &[crate::model::TypeCount], full: (u64, u64)) -> std::io::Result<()> {
        crate::report::types::block(&mut self.out, types, TOP_TYPES, (group, round))?;
        crate::report::types::full(&mut self.out, full, group)
    }

    /// The calls one probed function made of another, which the rows above
    /// leave out: with `--native`, glibc's `realloc` relaying to `malloc`
    /// and `free`; a free probed at its implementation (see
    /// `plan::slots`), the implementation's calls by `PyMem_Free` and
    /// pymalloc's realloc.
    pub(super) fn nested_block(&mut self, sample: &Snapshot) -> std::io::Result<()> {
        let parts: Vec<String> = sample
            .probes
            .iter()
            .filter_map(|(name, c)| {
                let n = c.nested?;
                Some(format!("{name}: {} calls, {} B", group(n.calls), group(n.bytes)))
            })
            .collect();
        if !parts.is_empty() {
            writeln!(
                self.out,
                "  nested (calls made inside another probed function, not counted under their own) {}",
                parts.join(" | ")
            )?;
        }
        let full = sample.stats.get(Stat::NestedFull.name()).copied().unwrap_or(0);
        if full > 0 {
            writeln!(
                self.out,
                "  nested PARTIAL: {} nested calls found the map of nested calls full: each is counted again under its function above (nested_full)",
                group(full)
            )?;
        }
        Ok(())
    }

    /// Garbage collections by generation: how many, how long in all, and
    /// the objects found unreachable.
    pub(super) fn gc_block(&mut self, gc: &crate::model::Gc, (full, unmatched): (u64, u64)) -> std::io::Result<()> {
        if full > 0 {
            writeln!(
                self.out,
                "  gc PARTIAL: {} collections found the GC totals map full: they are not counted here (gc_full)",
                group(full)
            )?;
        }
        if unmatched > 0 {
            writeln!(
                self.out,
                "  gc PARTIAL: {} collections ended with no start seen (begun before the attach, or pushed out of the map of collections in flight): they are not counted here (gc_unmatched)",
                group(unmatched)
            )?;
        }
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
                let took = g.duration_s.map_or_else(|| "time unknown".to_owned(), |d| format!("in {}", duration(d)));
                let uncollectable = g.uncollectable.map_or(String::new(), |u| format!(" ({} uncollectable)", group(u)));
                format!(
                    "{which}: {}{rate} {took}, {} unreachable{uncollectable}",
                    group(g.collections),
                    group(g.collected)
                )
            })
            .collect();
        let source = match gc.durations {
            Some(durations) => format!("{}, durations: {}", source_name(gc.source), source_name(durations)),
            None => source_name(gc.source).to_owned(),
        };
        writeln!(self.out, "  gc ({source}) {}", parts.join(" | "))?;
        if let Some(why) = &gc.probes_past_memory {
            writeln!(self.out, "  gc: {why}")?;
        }
        if let Some(why) = &gc.unread {
            writeln!(self.out, "  gc PARTIAL: {why}")?;
        }
        Ok(())
    }
}

/// The GC source as the table names it.
const fn source_name(source: crate::plan::gc::GcSource) -> &'static str {
    match source {
        crate::plan::gc::GcSource::Markers => "markers",
        crate::plan::gc::GcSource::Function => "function",
        crate::plan::gc::GcSource::None => "none",
        crate::plan::gc::GcSource::Memory => "memory",
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::Event,
        report::{
            examples::{attached, snapshot},
            table::tests::render,
        },
    };

    #[test]
    fn gc_is_a_line_per_block_and_said_once_when_not_seen() {
        use crate::{
            model::{Gc, GcGeneration},
            plan::gc::{GcPlan, GcSource},
        };
        let generation = |generation, collections, duration_s, collected| GcGeneration {
            generation,
            collections,
            duration_s: Some(duration_s),
            collected,
            uncollectable: None,
            collections_per_s: Some(2.0),
        };
        let mut info = attached(Some(12));
        info.gc = Some(GcPlan { caveat: Some("entry does not say".into()), ..GcPlan::none("the markers") });
        let mut sample = snapshot(1000, 1);
        sample.gc = Some(Gc {
            source: GcSource::Markers,
            reason: None,
            durations: None,
            generations: vec![
                generation(Some(0), 1234, 0.000_312, 0),
                generation(Some(2), 2, 0.004_21, 6000),
                generation(None, 1, 1.502, 7),
            ],
            pids: indexmap::IndexMap::new(),
            probes_past_memory: None,
            last_read_s: None,
            unread: None,
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
            durations: None,
            generations: vec![],
            pids: indexmap::IndexMap::new(),
            probes_past_memory: None,
            last_read_s: None,
            unread: None,
        });
        assert!(!render(&[Event::Interval(none)]).contains("  gc "));
        let mut memory = snapshot(1000, 1);
        memory.gc = Some(Gc {
            source: GcSource::Memory,
            reason: Some("no markers".into()),
            durations: Some(GcSource::None),
            generations: vec![GcGeneration {
                duration_s: None,
                uncollectable: Some(3),
                ..generation(Some(0), 5, 0.0, 40)
            }],
            pids: indexmap::IndexMap::new(),
            probes_past_memory: None,
            last_read_s: None,
            unread: None,
        });
        let text = render(&[Event::Interval(memory.clone())]);
        let line = text.lines().find(|l| l.starts_with("  gc ")).expect("a gc line");
        assert_eq!(
            line,
            "  gc (memory, durations: none) gen 0: 5 (2.0/s) time unknown, 40 unreachable (3 uncollectable)"
        );
        assert!(!text.contains("PARTIAL"), "{text}");
        // Collections after the last reading, which no probe counted: said.
        if let Some(gc) = memory.gc.as_mut() {
            (gc.last_read_s, gc.unread) = (Some(1.5), Some("collections after … 1.5 s are NOT counted".into()));
        }
        let text = render(&[Event::Interval(memory)]);
        assert!(text.contains("\n  gc PARTIAL: collections after … 1.5 s are NOT counted\n"), "{text}");
        assert_eq!(duration(0.0), "0 s");
    }
}
