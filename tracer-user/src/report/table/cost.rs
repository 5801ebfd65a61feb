//! The estimated cost to the target as a block's title gives it:
//! a share of its CPU time, a range where the kind of site is not known,
//! and the hits left unpriced.

use crate::{model::Cost, report::group};

/// "cost ≈3.4% of target CPU (estimate)", with a range where some probe's
/// hits could not be told apart by the kind of site.
pub(super) fn cost_text(c: &Cost) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::{End, Event, Summary},
        report::{
            examples::{attached, snapshot},
            table::tests::render,
        },
    };

    fn cost(high: f64, low: Option<f64>) -> Cost {
        Cost {
            estimate: true,
            overhead_fraction: Some(high),
            overhead_fraction_low: low,
            tracer_cpu_s: high,
            target_cpu_s: 1.0,
            hits: 1000,
            unpriced_hits: 0,
            hit_cost_ns: crate::plan::HitCosts {
                single_stepped_ns: 15_000.0,
                emulated_ns: 500.0,
                calibrated_unix_s: None,
            },
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
        // Call sites that `auto` took (the example's) do not keep `--budget`
        // from the run: with it, `auto` stays inside.
        let info = attached(Some(12));
        let mut asked = info.clone();
        asked.call_sites_asked = true;
        // The advice names the flag `--budget` refuses that the run has on.
        let with_asked = render(&[Event::Attached(asked), Event::Interval(ranged.clone())]);
        assert!(
            with_asked
                .contains("by tracing in windows (without --placement call-sites, which it does not combine with)"),
            "{with_asked}"
        );
        let mut typed = ranged.clone();
        typed.types = Some(Vec::new());
        let with_types = render(&[Event::Attached(attached(Some(12))), Event::Interval(typed)]);
        assert!(
            with_types.contains("by tracing in windows (without --types, which it does not combine with)"),
            "{with_types}"
        );
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
}
