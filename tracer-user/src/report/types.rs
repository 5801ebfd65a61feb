//! The table's `--types` block: the types most created, with their rates,
//! then those with the most objects live.

use std::io::Write;

use crate::{model::TypeCount, text::display};

/// How the table writes counts and rates.
type Formats = (fn(u64) -> String, fn(f64) -> u64);

/// Writes the `top` types most created and the `top` with the most live
/// objects to `out`.
pub(super) fn block(
    out: &mut dyn Write,
    types: &[TypeCount],
    top: usize,
    (group, round): Formats,
) -> std::io::Result<()> {
    let header = |out: &mut dyn Write, title: &str| {
        writeln!(
            out,
            "  {:<32} {:>14} {:>12} {:>14} {:>12} {:>14}",
            title, "created", "created/s", "destroyed", "reused", "live"
        )
    };
    let line = |out: &mut dyn Write, t: &TypeCount| {
        let rate = t.created_per_s.map_or_else(|| "-".to_owned(), |r| group(round(r)));
        writeln!(
            out,
            "  {:<32} {:>14} {:>12} {:>14} {:>12} {:>14}",
            display(&t.name),
            group(t.created),
            rate,
            group(t.destroyed),
            group(t.reused),
            group(t.live)
        )
    };
    header(out, "type (most created)")?;
    for t in types.iter().take(top) {
        line(out, t)?;
    }
    let mut by_live: Vec<&TypeCount> = types.iter().filter(|t| t.live > 0).collect();
    by_live.sort_by(|a, b| b.live.cmp(&a.live).then_with(|| a.name.cmp(&b.name)));
    if !by_live.is_empty() {
        header(out, "type (most live)")?;
        for t in by_live.iter().take(top) {
            line(out, t)?;
        }
    }
    if types.len() > top {
        let rest: u64 = types[top..].iter().map(|t| t.created).sum();
        writeln!(out, "  ({} more types, {} created; every type is in --json)", types.len() - top, group(rest))?;
    }
    if let Some(t) = types.iter().find(|t| t.unresolved.is_some()) {
        writeln!(out, "  {}: name not read ({})", display(&t.name), t.unresolved.as_deref().unwrap_or_default())?;
    }
    Ok(())
}

/// What the full kernel tables left out of the block: `types_full` new
/// objects not under their type, `objects_full` objects whose destruction
/// cannot be matched to their type.
pub(super) fn full(out: &mut dyn Write, (types, objects): (u64, u64), group: fn(u64) -> String) -> std::io::Result<()> {
    if types > 0 {
        writeln!(
            out,
            "  types PARTIAL: {} new objects found the type table full: they are under no type above (types_full)",
            group(types)
        )?;
    }
    if objects > 0 {
        writeln!(
            out,
            "  types' destroyed, reused and live PARTIAL: {} objects found the object table full: their destruction is not matched to their type, so live counts are too high and reuses unseen (objects_full)",
            group(objects)
        )?;
    }
    Ok(())
}
