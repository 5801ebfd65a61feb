//! The production profile's heap in the table: a compact block of the
//! types with most bytes and their change, and the ones that grew most
//! besides (what is growing is the point).

use std::io::Write;

use crate::{
    heap::{
        print::{bytes, thousands},
        tally::Reason,
    },
    model::heap::Heap,
};

/// Rows of the heap block: the types with most bytes.
pub const ROWS: usize = 8;
/// Types named on the block's "grew most" line, besides the rows.
const GROWERS: usize = 3;

/// `+1,234`, `-1,234`, `0`.
pub(crate) fn signed_count(n: i64) -> String {
    match n {
        0 => "0".to_owned(),
        n if n > 0 => format!("+{}", thousands(n.unsigned_abs())),
        n => format!("-{}", thousands(n.unsigned_abs())),
    }
}

/// `+4.6 MiB`, `-12 B`, `0`.
pub(crate) fn signed_bytes(n: i64) -> String {
    match n {
        0 => "0".to_owned(),
        n if n > 0 => format!("+{}", bytes(n.unsigned_abs())),
        n => format!("-{}", bytes(n.unsigned_abs())),
    }
}

/// Writes the heap block of `heap`.
/// The heap's block; `told_partial`, the census's gaps printed in full
/// already, which it adds to.
pub fn heap_block(out: &mut impl Write, heap: &Heap, told_partial: &mut Vec<String>) -> std::io::Result<()> {
    let other = heap.other.unwrap_or_default();
    let objects = heap.types.iter().fold(other.count, |n, t| n.saturating_add(t.count));
    let size = heap.types.iter().fold(other.bytes, |n, t| n.saturating_add(t.bytes));
    let types = heap.types.len() as u64 + other.types;
    let since = heap.since_s.map_or_else(|| "the run's first".to_owned(), |s| format!("changes since {s:.1} s"));
    // A forecast: the census waits for the budget's credit, which a target
    // busier or idler than of late earns sooner or later.
    let every = if heap.every > 1 {
        format!(", next in about {} intervals at the recent pace", heap.every)
    } else {
        String::new()
    };
    let memory = match (heap.totals.rss, heap.totals.unaccounted) {
        (Some(rss), Some(u)) => {
            let sign = if u < 0 { "-" } else { "" };
            format!("; RSS {}, {sign}{} not accounted for", bytes(rss), bytes(u.unsigned_abs()))
        }
        _ => String::new(),
    };
    writeln!(
        out,
        "  heap (census {} at {:.1} s, {since}{every}; {:.0} ms, {} read): {} objects, {} in {} types{memory}",
        heap.census,
        heap.taken_s,
        heap.cost.elapsed_ms,
        bytes(heap.cost.bytes_read),
        thousands(objects),
        bytes(size),
        thousands(types),
    )?;
    writeln!(out, "  {:>12} {:>10} {:>11} {:>11}  type", "objects", "change", "bytes", "change")?;
    let dash = || "-".to_owned();
    for t in heap.types.iter().take(ROWS) {
        writeln!(
            out,
            "  {:>12} {:>10} {:>11} {:>11}  {}",
            thousands(t.count),
            t.count_change.map_or_else(dash, signed_count),
            bytes(t.bytes),
            t.bytes_change.map_or_else(dash, signed_bytes),
            crate::text::display(&t.name)
        )?;
    }
    if heap.since_s.is_none() {
        // No bare `-`: the run's first census has nothing to compare with.
        writeln!(
            out,
            "  change -: the run's first census, with none before it to compare with: a change needs a second (a higher --budget takes them more often)"
        )?;
    }
    let mut growing: Vec<_> = heap.types.iter().skip(ROWS).filter(|t| t.bytes_change.is_some_and(|c| c > 0)).collect();
    growing.sort_by_key(|t| std::cmp::Reverse(t.bytes_change));
    if !growing.is_empty() {
        let named: Vec<String> = growing
            .iter()
            .take(GROWERS)
            .map(|t| {
                let count = t.count_change.map_or_else(dash, signed_count);
                format!(
                    "{} {count} ({})",
                    crate::text::display(&t.name),
                    t.bytes_change.map_or_else(dash, signed_bytes)
                )
            })
            .collect();
        writeln!(out, "  grew most besides: {}", named.join(", "))?;
    }
    let p = &heap.totals.pymalloc;
    writeln!(
        out,
        "  pymalloc: {} arenas, {} pools in use and {} empty, {} free in the pools in use",
        thousands(p.arenas),
        thousands(p.blocks.pools),
        thousands(p.blocks.empty_pools),
        bytes(p.blocks.free_bytes)
    )?;
    // Refused candidates are the scan's routine (most blocks are tried at
    // three offsets); the leads not followed are each a gap, shown.
    // Each with what it means, as `tracer heap` says it: a bare key told
    // a reader nothing without the source.
    let skipped: Vec<String> = heap
        .totals
        .rejected
        .iter()
        .filter(|(_, n)| **n > 0)
        .filter_map(|(key, n)| {
            let reason = Reason::ALL.iter().find(|r| r.key() == key.as_str() && !r.is_candidate())?;
            Some(format!("{key}={n} ({})", reason.describe()))
        })
        .collect();
    if !skipped.is_empty() {
        writeln!(out, "  heap leads not followed (what they lead to is not counted): {}", skipped.join("; "))?;
    }
    // Each gap in full once; after that, that it is still there.
    let (new, told): (Vec<&String>, Vec<&String>) = heap.partial.iter().partition(|n| !told_partial.contains(n));
    for note in &new {
        writeln!(out, "  heap partial: {note}")?;
    }
    if !told.is_empty() {
        let n = told.len();
        writeln!(out, "  heap partial: as above ({n} gap{})", if n == 1 { "" } else { "s" })?;
    }
    told_partial.extend(new.into_iter().cloned());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        heap::model::Blocks,
        model::heap::{HeapCost, HeapType, OtherTypes, Pymalloc, Totals},
    };

    fn row(name: &str, count: u64, bytes: u64, change: Option<(i64, i64)>) -> HeapType {
        HeapType {
            name: name.into(),
            count,
            bytes,
            count_change: change.map(|c| c.0),
            bytes_change: change.map(|c| c.1),
        }
    }

    pub(crate) fn heap(types: Vec<HeapType>, since_s: Option<f64>) -> Heap {
        Heap {
            census: 2,
            taken_s: 2.0,
            since_s,
            every: 1,
            types,
            other: None,
            totals: Totals {
                pymalloc: Pymalloc {
                    arenas: 3,
                    blocks: Blocks { pools: 120, free_bytes: 4096, ..Blocks::default() },
                    ..Pymalloc::default()
                },
                rss: Some(30 << 20),
                accounted: 20 << 20,
                unaccounted: Some(10 << 20),
                ..Totals::default()
            },
            partial: Vec::new(),
            cost: HeapCost { elapsed_ms: 12.3, cpu_ms: 11.0, bytes_read: 5 << 20, reads: 40 },
        }
    }

    #[test]
    fn the_block_shows_the_top_types_and_what_grew_besides() {
        let mut types: Vec<HeapType> =
            (0..10).map(|i| row(&format!("t{i}"), 100 - i, (100 - i) * 1024, Some((0, 0)))).collect();
        types[0].count_change = Some(1000);
        types[0].bytes_change = Some(56_000);
        types[9].count_change = Some(7);
        types[9].bytes_change = Some(700);
        types.push(row("gone", 0, 0, Some((-5, -160))));
        let mut h = heap(types, Some(1.0));
        h.totals.rejected =
            [("not_a_type".to_owned(), 40_000), ("dict_table_unreadable".to_owned(), 2)].into_iter().collect();
        h.other = Some(OtherTypes { types: 4, count: 10, bytes: 320, count_change: Some(0), bytes_change: Some(0) });
        let mut out = Vec::new();
        heap_block(&mut out, &h, &mut Vec::new()).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "  heap (census 2 at 2.0 s, changes since 1.0 s; 12 ms, 5.0 MiB read): 965 objects, 955.3 KiB in 15 types; RSS 30.0 MiB, 10.0 MiB not accounted for"
        );
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["100", "+1,000", "100.0", "KiB", "+54.7", "KiB", "t0"]
        );
        assert_eq!(lines.len(), 2 + ROWS + 3, "{text}");
        assert_eq!(lines[2 + ROWS], "  grew most besides: t9 +7 (+700 B)");
        assert_eq!(
            lines[3 + ROWS],
            "  pymalloc: 3 arenas, 120 pools in use and 0 empty, 4.0 KiB free in the pools in use"
        );
        assert_eq!(
            lines[4 + ROWS],
            "  heap leads not followed (what they lead to is not counted): dict_table_unreadable=2 (a dict's table header could not be read)"
        );
    }

    /// A gap of the census's is printed in full once; the next intervals
    /// say it is still there, and a new one is printed in full.
    #[test]
    fn a_gap_is_told_in_full_once() {
        let mut h = heap(vec![row("dict", 3, 700, None)], None);
        h.partial = vec!["sets are not followed".to_owned()];
        let mut told = Vec::new();
        let partial = |h: &Heap, told: &mut Vec<String>| {
            let mut out = Vec::new();
            heap_block(&mut out, h, told).unwrap();
            String::from_utf8(out)
                .unwrap()
                .lines()
                .filter(|l| l.starts_with("  heap partial:"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(partial(&h, &mut told), ["  heap partial: sets are not followed"]);
        assert_eq!(partial(&h, &mut told), ["  heap partial: as above (1 gap)"]);
        h.partial.push("a collection ran".to_owned());
        assert_eq!(partial(&h, &mut told), ["  heap partial: a collection ran", "  heap partial: as above (1 gap)"]);
        assert_eq!(partial(&h, &mut told), ["  heap partial: as above (2 gaps)"]);
    }

    /// The summary stands alone: its gaps are in full, whatever the
    /// intervals before it said.
    #[test]
    fn the_summary_tells_every_gap_in_full() {
        use crate::model::{EndKind, Event, Snapshot, Summary};
        let mut h = heap(vec![row("dict", 3, 700, None)], None);
        h.partial = vec!["sets are not followed".to_owned()];
        let snapshot = Snapshot { heap: Some(h), ..crate::report::examples::snapshot(1000, 1) };
        let summary = Summary { snapshot: snapshot.clone(), end: EndKind::Duration, signal: None };
        let text = super::super::tests::render(&[Event::Interval(snapshot), Event::Summary(summary)]);
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("  heap partial:")).collect();
        assert_eq!(lines, ["  heap partial: sets are not followed", "  heap partial: sets are not followed"], "{text}");
    }

    #[test]
    fn the_first_census_has_no_change() {
        let h = heap(vec![row("dict", 3, 700, None)], None);
        let mut out = Vec::new();
        heap_block(&mut out, &h, &mut Vec::new()).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("  heap (census 2 at 2.0 s, the run's first; "), "{text}");
        let row = text.lines().nth(2).unwrap();
        assert_eq!(row.split_whitespace().collect::<Vec<_>>(), ["3", "-", "700", "B", "-", "dict"]);
        // Its `-` is said, under the rows.
        assert_eq!(
            text.lines().nth(3).unwrap(),
            "  change -: the run's first census, with none before it to compare with: a change needs a second (a higher --budget takes them more often)"
        );
        assert_eq!(text.matches("change -:").count(), 1, "{text}");
    }
}
