//! The census as a table: the top types by bytes, pymalloc's totals, what
//! lies outside it, what the census does not account for, what it refused
//! or could not cover, and what it cost.

use std::fmt::Write as _;

use super::{model::Census, tally::Reason};
use crate::text::display;

/// The table for `census`, with its `top` types.
#[must_use]
pub fn table(census: &Census, top: usize) -> String {
    let mut out = String::new();
    let how = match census.stopped_ms {
        Some(ms) => format!(
            "PID {} was stopped for {}: pymalloc's pools exact, objects outside them partial (see partial)",
            census.pid,
            duration(ms)
        ),
        None => "an estimate: the target ran while it was read (--stop for an exact census)".to_owned(),
    };
    // The path is the target's to choose.
    let image = crate::text::display(&census.image);
    let _ = writeln!(out, "PID {} (Python {}, {image}): heap census, {how}", census.pid, census.python);
    let total: u64 = census.types.iter().map(|t| t.bytes).sum();
    let _ = writeln!(out, "{:>12}  {:>11}  {:>6}  type", "objects", "bytes", "share");
    for t in census.types.iter().take(top) {
        let share = if total == 0 { 0.0 } else { ratio(t.bytes, total) * 100.0 };
        let _ =
            writeln!(out, "{:>12}  {:>11}  {share:>5.1}%  {}", thousands(t.count), bytes(t.bytes), display(&t.name));
    }
    if census.types.len() > top {
        let rest = &census.types[top..];
        let (count, size) = rest.iter().fold((0, 0), |(c, b), t| (c + t.count, b + t.bytes));
        let _ = writeln!(out, "{:>12}  {:>11}          ({} more types)", thousands(count), bytes(size), rest.len());
    }
    let objects: u64 = census.types.iter().map(|t| t.count).sum();
    let _ = writeln!(out, "{:>12}  {:>11}          in all", thousands(objects), bytes(total));
    let p = &census.totals.pymalloc;
    let _ = writeln!(
        out,
        "pymalloc: {} arenas, {} pools in use and {} empty; {} blocks allocated: {} objects, {} on free lists, {} other (item arrays, dict tables, buffers); {} free in the pools in use",
        thousands(p.arenas),
        thousands(p.blocks.pools),
        thousands(p.blocks.empty_pools),
        thousands(p.blocks.blocks),
        thousands(p.blocks.objects),
        thousands(p.blocks.free_listed),
        thousands(p.blocks.other),
        bytes(p.blocks.free_bytes)
    );
    if let Some(t) = &p.arena_table {
        let _ = writeln!(
            out,
            "pymalloc's arena table: {} arenas, {} pools carved, {} of them found by the scan, {} found outside the table; {} blocks passed to the C library",
            thousands(t.arenas),
            thousands(t.pools),
            thousands(t.found),
            thousands(t.not_in_table),
            thousands(t.raw_allocated_blocks.unsigned_abs())
        );
    }
    let o = &census.totals.outside;
    let _ = writeln!(
        out,
        "outside pymalloc: {} objects, {} ({} on the collector's lists, {} held by tuples, lists and dicts); item arrays, dict tables and buffers {}",
        thousands(o.objects),
        bytes(o.bytes),
        thousands(o.gc_objects),
        thousands(o.referenced),
        bytes(o.buffer_bytes)
    );
    if let (Some(rss), Some(unaccounted)) = (census.totals.rss, census.totals.unaccounted) {
        let sign = if unaccounted < 0 { "-" } else { "" };
        let _ = writeln!(
            out,
            "memory: RSS {}, accounted {}, unaccounted {sign}{}",
            bytes(rss),
            bytes(census.totals.accounted),
            bytes(unaccounted.unsigned_abs())
        );
    }
    let reason = |key: &str| Reason::ALL.iter().copied().find(|r| r.key() == key);
    let (refused, skipped): (Vec<_>, Vec<_>) =
        census.totals.rejected.iter().partition(|(key, _)| reason(key).is_none_or(Reason::is_candidate));
    for (title, rows) in
        [("candidates refused (each block is tried at +0, +16 and +32):", refused), ("leads not followed:", skipped)]
    {
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(out, "{title}");
        for (key, n) in rows {
            let what = reason(key).map_or("", Reason::describe);
            let _ = writeln!(out, "{:>12}  {key}: {what}", thousands(*n));
        }
    }
    for note in &census.partial {
        let _ = writeln!(out, "partial: {note}");
    }
    let c = &census.cost;
    let _ = writeln!(
        out,
        "census: {}, {} read in {} system calls, {} type objects read{}",
        duration(c.elapsed_ms),
        bytes(c.bytes_read),
        thousands(c.reads),
        thousands(c.types_read),
        if c.failed_reads > 0 { format!(", {} ranges unreadable", thousands(c.failed_reads)) } else { String::new() }
    );
    out
}

#[allow(clippy::cast_precision_loss, reason = "a share shown to one decimal")]
fn ratio(a: u64, b: u64) -> f64 {
    a as f64 / b as f64
}

/// `1234567` as `1,234,567`.
#[must_use]
pub fn thousands(n: u64) -> String {
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

/// Bytes in binary units, to one decimal.
#[must_use]
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n;
    let mut unit = 0;
    while value >= 1024 * 1024 && unit + 2 < UNITS.len() {
        value /= 1024;
        unit += 1;
    }
    if n < 1024 {
        return format!("{n} B");
    }
    let shown = ratio(value, 1024);
    format!("{shown:.1} {}", UNITS[unit + 1])
}

fn duration(ms: f64) -> String {
    if ms < 1000.0 { format!("{ms:.1} ms") } else { format!("{:.2} s", ms / 1000.0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(bytes(12), "12 B");
        assert_eq!(bytes(2048), "2.0 KiB");
        assert_eq!(bytes(40_660_000), "38.8 MiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
    }
}
