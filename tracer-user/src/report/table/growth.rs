//! `--growth` in the table: where it samples (in the header), and each
//! interval's block: the sites whose takers' pools in use grew most, all
//! marked as sampled estimates with their 95% interval, what the probes
//! saw and what they cost.

use std::io::Write;

use super::TableReporter;
use crate::{
    heap::print::bytes,
    model::{Growth, GrowthProbed},
    plan::growth::GrowthPlan,
    report::group,
};

/// Sites a block lists (the JSON has every one).
const TOP: usize = 10;

impl<W: Write, E: Write> TableReporter<W, E> {
    pub(super) fn growth_header(&mut self, plan: &GrowthPlan) -> std::io::Result<()> {
        if let Some(why) = &plan.unavailable {
            return writeln!(self.out, "tracer: growth: unavailable: {}", crate::text::line(why));
        }
        let points: Vec<String> = plan
            .points
            .iter()
            .map(|p| {
                let kind = if p.emulated { "emulated" } else { "SINGLE-STEPPED" };
                format!("{} +{:#x} `{}` ({kind}; {})", p.function, p.offset, p.instruction, p.reads)
            })
            .collect();
        writeln!(
            self.out,
            "tracer: growth: {}; the C library's heap at its mapping syscalls' tracepoints",
            points.join(", ")
        )?;
        if plan.carves() {
            writeln!(
                self.out,
                "tracer: growth: pymalloc's pools by the stack that carved them (the code that grew its footprint), counted while in use; a reused pool is not probed; what holds them is the census's"
            )?;
        }
        if let Some(why) = &plan.fallback {
            writeln!(self.out, "tracer: growth: FALLBACK: {}", crate::text::line(why))?;
        }
        if let Some(caveat) = &plan.caveat {
            writeln!(self.out, "tracer: growth: PARTIAL: {}", crate::text::line(caveat))?;
        }
        Ok(())
    }

    /// Growth's block; `share`, in the profile, its cost as a share of the
    /// target's CPU time (the ledger's), else it is shown as a share of
    /// one CPU's time.
    pub(super) fn growth_block(&mut self, g: &Growth, share: Option<f64>) -> std::io::Result<()> {
        let g = match g {
            Growth::Unavailable { unavailable } => return writeln!(self.out, "  growth: unavailable: {unavailable}"),
            Growth::Sampled(g) => g,
        };
        let cost = g.cost.as_ref().map_or(String::new(), |c| {
            let share = match (share, c.per_s) {
                (Some(f), Some(_)) => format!("cost ≈{:.3}% of the target's CPU time", f * 100.0),
                (_, Some(s)) => format!("cost ≈{:.3}% of a CPU", s * 100.0),
                (_, None) => "cost unknown until calibrated".to_owned(),
            };
            format!("; {share} ({} hits)", group(c.hits))
        });
        let carves = g.takes.probed == GrowthProbed::Carves;
        writeln!(
            self.out,
            "  growth (ESTIMATES: 1 pool {} in {} sampled, {} a sample): net {}, in use by {} since attach {}{} ({} of it the C library's heap){cost}",
            if carves { "carved" } else { "take" },
            g.sample_every,
            bytes(g.sample_bytes),
            signed(g.bytes),
            if carves { "carvers" } else { "takers" },
            bytes(g.in_use_bytes),
            in_use_error(g),
            bytes(g.libc_bytes),
        )?;
        if !g.sites.is_empty() {
            writeln!(self.out, "  {:<28} {:<32} {:>12} {:>26}", "growth site", "file:line", "growth", "in use ±95%")?;
        }
        for s in g.sites.iter().take(TOP) {
            let file = crate::text::display(s.file.rsplit('/').next().unwrap_or(&s.file));
            let at = s.line.map_or_else(|| file.clone(), |l| format!("{file}:{l}"));
            let function = crate::text::display(&s.function);
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a displayed interval")]
            let half = ((s.in_use_ci95[1] - s.in_use_ci95[0]) / 2.0).round() as u64;
            let in_use = format!("{} ±{}", bytes(s.in_use_bytes), bytes(half));
            writeln!(self.out, "  {:<28} {:<32} {:>12} {:>26}", function, at, signed(s.bytes), in_use)?;
        }
        if g.sites.len() > TOP {
            writeln!(self.out, "  ({} more sites in the JSON)", g.sites.len() - TOP)?;
        }
        {
            let t = &g.takes;
            let misses: Vec<String> = [
                ("walk_failed", t.walk_failed),
                ("truncated", t.truncated),
                ("lost", t.lost),
                ("unread", t.unread),
                ("grown_lost", t.grown_lost),
                ("mapped_missed", t.mapped_missed),
            ]
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(name, n)| format!("{name}={n}"))
            .collect();
            let misses = if misses.is_empty() { String::new() } else { format!("; misses: {}", misses.join(" ")) };
            if carves {
                writeln!(
                    self.out,
                    "  pools carved: {} (the first pools of {} new arenas among them); {} sampled, {} samples ended by a carve at their address, {} pruned (found empty or gone twice in a row); reuses of emptied pools are not probed (not counted){misses}",
                    group(t.carved),
                    group(t.new_arenas),
                    group(t.sampled),
                    group(t.ended),
                    group(t.pruned),
                )?;
            } else {
                writeln!(
                    self.out,
                    "  pool takes: {} reused, {} carved, {} new arenas; {} sampled, {} samples ended by a retake, {} pruned{misses}",
                    group(t.reused),
                    group(t.carved),
                    group(t.new_arenas),
                    group(t.sampled),
                    group(t.ended),
                    group(t.pruned),
                )?;
            }
            writeln!(
                self.out,
                "  the C library's heap: {} mapping syscalls, {} growths; {} sampled, {} samples ended by an unmap or a later mapping, {} pruned",
                group(t.syscalls),
                group(t.grown),
                group(t.grown_sampled),
                group(t.unmapped),
                group(t.mapped_pruned),
            )?;
        }
        if let Some(caveat) = &g.caveat {
            writeln!(self.out, "  growth: PARTIAL: {caveat}")?;
        }
        if let Some(stopped) = &g.stopped {
            writeln!(self.out, "  growth: STOPPED (figures up to {:.1} s): {}", stopped.at_s, stopped.reason)?;
        }
        Ok(())
    }
}

/// Bytes with their sign: `+1.5 MiB`, `-16.0 KiB`, `0 B`.
fn signed(n: i64) -> String {
    match n {
        0 => "0 B".to_owned(),
        n if n > 0 => format!("+{}", bytes(n.unsigned_abs())),
        n => format!("-{}", bytes(n.unsigned_abs())),
    }
}

/// The error of growth's `in_use_bytes` as it follows the figure: ` ±X`
/// where samples are in use, ` (≤X at 95%)` where none is (a 0 that no
/// sample holds can hide that much growth), nothing where the report has
/// no interval (a record written before it had one).
#[must_use]
pub fn in_use_error(g: &crate::model::GrowthSampled) -> String {
    match g.in_use_ci95 {
        None => String::new(),
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a displayed bound")]
        Some([_, high]) if g.in_use_bytes == 0 => format!(" (≤{} at 95%)", bytes(high.round() as u64)),
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a displayed interval")]
        Some([low, high]) => format!(" ±{}", bytes(((high - low) / 2.0).round() as u64)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Event, GrowthSampled, GrowthSite, GrowthStopped, GrowthTakes, Snapshot};

    #[test]
    fn a_block_lists_sites_as_estimates() {
        let g = GrowthSampled {
            estimate: true,
            sample_every: 32,
            sample_bytes: 32 * 16384,
            bytes: 3 * 32 * 16384,
            in_use_bytes: 4 * 32 * 16384,
            sites: vec![GrowthSite {
                function: "grow".into(),
                file: "/srv/growth.py".into(),
                line: Some(12),
                bytes: 3 * 32 * 16384,
                samples: 4,
                in_use_bytes: 4 * 32 * 16384,
                libc_bytes: 0,
                libc_samples: 0,
                in_use_ci95: [0.0, 4.0 * 32.0 * 16384.0],
            }],
            takes: GrowthTakes { reused: 7, lost: 2, ..GrowthTakes::default() },
            ..GrowthSampled::default()
        };
        let snapshot =
            Snapshot { growth: Some(Growth::Sampled(Box::new(g))), ..crate::report::examples::snapshot(1000, 1) };
        let text = super::super::tests::render(&[Event::Interval(snapshot)]);
        assert!(text.contains("growth (ESTIMATES: 1 pool take in 32 sampled, 512.0 KiB a sample): net +1.5 MiB, in use by takers since attach 2.0 MiB (0 B of it the C library's heap)"), "{text}");
        let row = text.lines().find(|l| l.trim_start().starts_with("grow ")).unwrap();
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["grow", "growth.py:12", "+1.5", "MiB", "2.0", "MiB", "±1.0", "MiB"]
        );
        assert!(text.contains("pool takes: 7 reused, 0 carved, 0 new arenas; 0 sampled, 0 samples ended by a retake, 0 pruned; misses: lost=2"), "{text}");
        let carves = GrowthSampled {
            sample_every: 32,
            sample_bytes: 32 * 16384,
            takes: GrowthTakes {
                probed: GrowthProbed::Carves,
                carved: 10,
                new_arenas: 1,
                sampled: 1,
                ..GrowthTakes::default()
            },
            ..GrowthSampled::default()
        };
        let snapshot =
            Snapshot { growth: Some(Growth::Sampled(Box::new(carves))), ..crate::report::examples::snapshot(1000, 1) };
        let text = super::super::tests::render(&[Event::Interval(snapshot)]);
        assert!(text.contains("growth (ESTIMATES: 1 pool carved in 32 sampled, 512.0 KiB a sample): net 0 B, in use by carvers since attach"), "{text}");
        assert!(text.contains("\n  pools carved: 10 (the first pools of 1 new arenas among them); 1 sampled, 0 samples ended by a carve at their address, 0 pruned (found empty or gone twice in a row); reuses of emptied pools are not probed (not counted)\n"), "{text}");
        assert!(!text.contains("STOPPED"), "{text}");
        // The total's error follows it; a 0 no sample holds is a bound.
        let with_ci = GrowthSampled {
            in_use_bytes: 4 * 32 * 16384,
            in_use_ci95: Some([0.0, 4.0 * 32.0 * 16384.0]),
            ..GrowthSampled::default()
        };
        assert_eq!(in_use_error(&with_ci), " ±1.0 MiB");
        let none = GrowthSampled {
            sample_bytes: 32 * 16384,
            in_use_ci95: Some([0.0, crate::model::ZERO_SAMPLES_UPPER * 32.0 * 16384.0]),
            ..GrowthSampled::default()
        };
        let snapshot =
            Snapshot { growth: Some(Growth::Sampled(Box::new(none))), ..crate::report::examples::snapshot(1000, 1) };
        let text = super::super::tests::render(&[Event::Interval(snapshot)]);
        assert!(text.contains("net 0 B, in use by takers since attach 0 B (≤1.5 MiB at 95%) (0 B of it"), "{text}");
        let stopped = GrowthSampled {
            stopped: Some(GrowthStopped { at_s: 2.04, reason: "too dear".into() }),
            ..GrowthSampled::default()
        };
        let snapshot =
            Snapshot { growth: Some(Growth::Sampled(Box::new(stopped))), ..crate::report::examples::snapshot(1000, 1) };
        let text = super::super::tests::render(&[Event::Interval(snapshot)]);
        assert!(text.contains("\n  growth: STOPPED (figures up to 2.0 s): too dear\n"), "{text}");
        let unavailable = Growth::Unavailable { unavailable: "no symbols".into() };
        let snapshot = Snapshot { growth: Some(unavailable), ..crate::report::examples::snapshot(1000, 1) };
        let text = super::super::tests::render(&[Event::Interval(snapshot)]);
        assert!(text.contains("\n  growth: unavailable: no symbols\n"), "{text}");
        assert_eq!(signed(-16384), "-16.0 KiB");
    }
}
