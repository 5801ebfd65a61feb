//! The function table: a row for each probed function, its calls and
//! bytes and their rates, or with windows (`--budget`, the profile) their
//! counts while traced and the rates estimated from them. The names'
//! column is as wide as the longest name, so that no row shifts.

use std::io::Write;

use super::{TableReporter, estimates, round, slowdown, unsized_calls};
use crate::{
    model::{Budget, Snapshot},
    report::group,
};

/// The narrowest the names' column is: the header's `function`, and most
/// names, fit.
const NAME_WIDTH: usize = 20;

/// The names' column's width: the longest probe name's (3.12's
/// `_Py_NewReferenceNoTotal` is 23 characters), at least [`NAME_WIDTH`].
fn name_width(sample: &Snapshot) -> usize {
    sample.probes.keys().map(|n| n.chars().count()).max().unwrap_or(0).max(NAME_WIDTH)
}

impl<W: Write, E: Write> TableReporter<W, E> {
    /// The rows of exact counts: each function's calls and bytes since the
    /// attach and their rates.
    pub(super) fn function_rows(&mut self, sample: &Snapshot) -> std::io::Result<()> {
        let width = name_width(sample);
        let with_returns = sample.probes.values().any(|p| p.returned.is_some());
        let extra = if with_returns { format!(" {:>14} {:>8}", "returns", "NULL") } else { String::new() };
        writeln!(
            self.out,
            "  {:<width$} {:>14} {:>12} {:>16} {:>14}{extra}",
            "function", "calls", "calls/s", "bytes", "bytes/s"
        )?;
        for (name, p) in &sample.probes {
            let at_least = if unsized_calls(sample, name) > 0 { "≥" } else { "" };
            let (bytes, bytes_rate) = match p.bytes_per_s {
                Some(r) if self.measures_bytes(name) => {
                    (format!("{at_least}{}", group(p.bytes)), format!("{at_least}{}", group(round(r))))
                }
                _ => ("-".to_owned(), "-".to_owned()),
            };
            let extra = match (with_returns, p.returned) {
                (false, _) => String::new(),
                (true, Some(r)) => format!(" {:>14} {:>8}", group(r.returns), group(r.null)),
                (true, None) => format!(" {:>14} {:>8}", "-", "-"),
            };
            writeln!(
                self.out,
                "  {:<width$} {:>14} {:>12} {:>16} {:>14}{extra}",
                name,
                group(p.calls),
                p.calls_per_s.map_or_else(|| "?".to_owned(), |r| group(round(r))),
                bytes,
                bytes_rate
            )?;
        }
        Ok(())
    }

    /// `--budget`: counts of the traced windows, and rates estimated from
    /// them since attach, marked as estimates.
    pub(super) fn estimate_block(&mut self, sample: &Snapshot, b: &Budget) -> std::io::Result<()> {
        let width = name_width(sample);
        writeln!(
            self.out,
            "  {:<width$} {:>14} {:>24} {:>16} {:>28}",
            "function", "calls (traced)", "est. calls/s ±95%", "bytes (traced)", "est. bytes/s ±95%"
        )?;
        for (name, p) in &sample.probes {
            let (calls_rate, b_rate) = estimates(p);
            let at_least = if unsized_calls(sample, name) > 0 { "≥" } else { "" };
            let (bytes, b_rate) = if self.measures_bytes(name) {
                let b_rate = if b_rate.starts_with(['≥', '?']) { b_rate } else { format!("{at_least}{b_rate}") };
                (format!("{at_least}{}", group(p.bytes)), b_rate)
            } else {
                ("-".to_owned(), "-".to_owned())
            };
            writeln!(
                self.out,
                "  {:<width$} {:>14} {:>24} {:>16} {:>28}",
                name,
                group(p.calls),
                calls_rate,
                bytes,
                b_rate
            )?;
        }
        // In the profile its cost line above says what the windows cost.
        let cost = if sample.profile.is_some() {
            String::new()
        } else {
            format!("; estimated cost to the target {:.2}% of its CPU time", b.estimated_overhead_fraction * 100.0)
        };
        let budget = match &sample.profile {
            Some(p) => format!("--budget {}%, of which the rates' share {:.2}%", p.budget_percent, b.percent),
            None => format!("--budget {}%", (b.percent * 1e6).round() / 1e6),
        };
        let pace = match b.slowdown {
            None => "as seen while traced".to_owned(),
            Some(s) => slowdown(s),
        };
        writeln!(
            self.out,
            "  ESTIMATES ({budget}): rates from {} {} that traced {:.2}s of {:.1}s ({:.2}%), {pace}{cost} (a hit costs {:.0} ns single-stepped, {:.0} ns emulated here, in CPU time)",
            b.windows,
            if b.windows == 1 { "window" } else { "windows" },
            b.traced_s,
            sample.elapsed_s,
            b.traced_fraction * 100.0,
            b.hit_cost_ns.single_stepped_ns,
            b.hit_cost_ns.emulated_ns,
        )?;
        self.unsized_line(sample)?;
        let unknown = |name: &str, e: Option<crate::model::ProbeEstimate>| {
            e.is_none_or(|e| !e.calls_known() || (self.measures_bytes(name) && !e.bytes_known()))
        };
        if sample.probes.iter().any(|(name, p)| unknown(name, p.estimate)) {
            writeln!(
                self.out,
                "  ?: no call (or no size) seen while traced, which does not tell its rate from zero: too little traced (a bound needs two windows; a longer run gets more), or windows that slowed the target past knowing by how much"
            )?;
        }
        self.footer(sample)
    }
}

#[cfg(test)]
mod tests {
    use crate::{
        model::Event,
        report::{
            examples::{attached, budget_snapshot, counts, snapshot},
            table::tests::render,
        },
    };

    /// The end of each column in `line` (where a run of spaces follows a
    /// character, and the line's end), in characters.
    fn column_ends(line: &str) -> Vec<usize> {
        let chars: Vec<char> = line.chars().collect();
        let mut ends: Vec<usize> =
            (1..chars.len()).filter(|&i| chars[i] == ' ' && chars[i - 1] != ' ' && i > 2).collect();
        ends.push(chars.len());
        ends
    }

    /// 3.12's `_Py_NewReferenceNoTotal` (23 characters) widens the names'
    /// column: every row's columns end where the header's do.
    #[test]
    fn a_long_function_name_widens_its_column() {
        let info = attached(Some(77));
        let mut sample = snapshot(1000, 1);
        sample.probes.insert("_Py_NewReferenceNoTotal".to_owned(), counts(0, 0));
        sample.compute_rates(&info, None);
        let text = render(&[Event::Attached(info), Event::Interval(sample)]);
        let at = text.lines().position(|l| l.starts_with("  function ")).unwrap_or_else(|| panic!("{text}"));
        let rows: Vec<&str> = text.lines().skip(at).take(4).collect();
        assert_eq!(
            rows,
            [
                "  function                         calls      calls/s            bytes        bytes/s",
                "  _Py_NewReference                    10           10                -              -",
                "  PyObject_Malloc                      4            4            4,000          4,000",
                "  _Py_NewReferenceNoTotal              0            0                -              -",
            ],
            "{text}"
        );
        // The header's first column ends at "function"; the numbers' ends
        // line up with the header's.
        let header = column_ends(rows[0]);
        for row in &rows[1..] {
            assert_eq!(column_ends(row)[1..], header[1..], "{row}");
        }
        // A short name keeps the column at its width.
        let text = render(&[Event::Interval(snapshot(1000, 1))]);
        assert!(text.contains("\n  _Py_NewReference                 10 "), "{text}");
    }

    /// The same with the windows' estimates (`--budget`, the profile).
    #[test]
    fn a_long_function_name_widens_the_estimates_column() {
        let mut sample = budget_snapshot(3, 0.01, (100.0, Some([90.0, 110.0])));
        sample.probes.insert("_Py_NewReferenceNoTotal".to_owned(), counts(0, 0));
        let text = render(&[Event::Attached(attached(Some(77))), Event::Interval(sample)]);
        let at = text.lines().position(|l| l.starts_with("  function ")).unwrap_or_else(|| panic!("{text}"));
        let rows: Vec<&str> = text.lines().skip(at).take(4).collect();
        assert!(rows[0].starts_with("  function                calls (traced)"), "{text}");
        assert!(rows[3].starts_with("  _Py_NewReferenceNoTotal              0 "), "{text}");
        // The calls column, right-aligned, ends at one place in every row:
        // after the names' 23 characters, a space and its 14.
        let end = 2 + 23 + 1 + 14;
        for row in &rows {
            let chars: Vec<char> = row.chars().collect();
            assert!(chars[end - 1] != ' ' && chars[end] == ' ', "the calls column ends at {end}: {row:?}");
        }
    }
}
