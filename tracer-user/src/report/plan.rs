//! `tracer probes`: the attach plan as a table or one JSON object, from
//! [`crate::model::PlanReport`].

use std::io::Write;

use crate::{
    model::{Level, PlanReport},
    plan::returns::ReturnPlan,
};

/// Writes `plan` as one JSON object.
pub fn json(out: &mut impl Write, plan: &PlanReport) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, plan)?;
    writeln!(out)
}

/// The names' column's width: the longest probed function's name (3.12's
/// `_Py_NewReferenceNoTotal` is 23 characters), at least 20, so that no
/// row shifts.
fn name_width(plan: &PlanReport) -> usize {
    let impls = plan.live_impls.iter().map(|i| i.symbol.chars().count());
    plan.probes.iter().map(|p| p.symbol.chars().count()).chain(impls).max().unwrap_or(0).max(20)
}

/// Per probe with inlined copies: how many are on an emulated instruction,
/// how many of those were moved there, how many are single-stepped and
/// why.
fn inlined_copies(out: &mut impl Write, plan: &PlanReport) -> std::io::Result<()> {
    let width = name_width(plan);
    for p in plan.probes.iter().filter(|p| !p.inline_sites.is_empty()) {
        // A copy probed at several jumps into it is one copy.
        let sites = p.inline_sites.len();
        let copies = p.coverage.as_ref().map_or(sites, |c| c.inlined_probed);
        let at = if copies == sites { String::new() } else { format!(", at {sites} sites") };
        writeln!(
            out,
            "  {:<width$} also at {copies} inlined copies{at} (counted as calls; {} on an emulated instruction, {} of them moved past the copy's first point; {} single-stepped)",
            p.symbol, p.inline_sites_emulated, p.inline_sites_moved, p.inline_sites_single_stepped,
        )?;
        if p.inline_sites_gated > 0 {
            writeln!(
                out,
                "  {:<width$}   {} of the moved at a jump into a copy none of whose own instructions is emulated: counted where the jump goes into it",
                "", p.inline_sites_gated
            )?;
        }
        for (why, n) in &p.inline_sites_stepped_why {
            writeln!(out, "  {:<width$}   {n} single-stepped: {why}", "")?;
        }
    }
    Ok(())
}

/// What one hit of each probe costs the target, where calibrated.
fn cost_per_hit(out: &mut impl Write, plan: &PlanReport) -> std::io::Result<()> {
    let width = name_width(plan);
    let Some(hit) = plan.hit_cost_ns else {
        let why = plan.unpriced.as_deref().unwrap_or("not measured");
        return writeln!(out, "  cost per hit: not measured ({why})");
    };
    let us = |ns: u64| {
        #[allow(clippy::cast_precision_loss, reason = "ns to µs for display")]
        let us = ns as f64 / 1e3;
        format!("{us:.2} µs")
    };
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a cost in ns, rounded")]
    let (emulated, stepped) = (hit.emulated_ns.round() as u64, hit.single_stepped_ns.round() as u64);
    writeln!(
        out,
        "  cost per hit, of the target's CPU time (calibrated here: {} at an emulated instruction, {} at a single-stepped one{}):",
        us(emulated),
        us(stepped),
        if plan.return_costs_ns.is_some() { "; reading a return adds its own, given below" } else { "" }
    )?;
    for p in &plan.probes {
        let Some(c) = p.cost_per_hit_ns else { continue };
        let (e, s) = p.site_kinds();
        if c.low_ns == c.high_ns {
            let sites = if e + s == 1 { "its one site".to_owned() } else { format!("all {} sites", e + s) };
            let kind = if s == 0 { "emulated" } else { "single-stepped" };
            writeln!(out, "  {:<width$} {} ({sites} {kind})", p.symbol, us(c.low_ns))?;
        } else {
            writeln!(
                out,
                "  {:<width$} {} to {} ({e} sites emulated, {s} single-stepped: where between depends on which the target runs)",
                p.symbol,
                us(c.low_ns),
                us(c.high_ns)
            )?;
        }
    }
    Ok(())
}

/// Writes `plan` as a table.
pub fn table(out: &mut impl Write, plan: &PlanReport) -> std::io::Result<()> {
    writeln!(out, "{} (Python {})", crate::text::display(&plan.image), plan.python)?;
    let width = name_width(plan);
    writeln!(out, "  {:<width$} {:>7}  {:<28} {:<9} why", "function", "offset", "instruction", "emulated")?;
    for p in &plan.probes {
        writeln!(
            out,
            "  {:<width$} {:>7}  {:<28} {:<9} {}",
            p.symbol,
            if p.call_sites.is_some() { "callers".to_owned() } else { format!("+{}", p.offset) },
            p.instruction,
            if p.emulated { "yes" } else { "no" },
            p.reason
        )?;
    }
    inlined_copies(out, plan)?;
    cost_per_hit(out, plan)?;
    for (symbol, c) in plan.probes.iter().filter_map(|p| Some((&p.symbol, p.coverage.as_ref()?))) {
        if c.is_partial() {
            let fix = c.fix.as_ref().map_or(String::new(), |f| format!("; fix: {f}"));
            writeln!(
                out,
                "  coverage: {symbol}: partial: {}{fix}",
                c.reason.as_deref().unwrap_or("some copies are not probed")
            )?;
        }
    }
    for (symbol, c) in plan.probes.iter().filter_map(|p| Some((&p.symbol, p.coverage.as_ref()?.cross_check.as_ref()?)))
    {
        let list = |a: &[u64]| a.iter().map(|a| format!("{a:#x}")).collect::<Vec<_>>().join(" ");
        write!(out, "  cross-check: {symbol}: {} copies in the DWARF, {} reads of its guard", c.dwarf, c.guard_reads)?;
        if !c.guard_only.is_empty() {
            write!(out, "; reads in no DWARF copy: {}", list(&c.guard_only))?;
        }
        if !c.dwarf_only.is_empty() {
            write!(out, "; DWARF copies with no read: {}", list(&c.dwarf_only))?;
        }
        writeln!(out)?;
    }
    if let Some(m) = plan.return_costs_ns {
        writeln!(
            out,
            "  reading a return value costs here: {:.0} ns by uretprobe (its entry emulated), {:.0} ns at a ret, {:.0} ns at a jmp into the epilogue",
            m.uretprobe_ns, m.ret_ns, m.placed_ns
        )?;
    }
    let with_returns: Vec<_> = plan.probes.iter().filter_map(|p| Some((&p.symbol, p.returns.as_ref()?))).collect();
    if !with_returns.is_empty() {
        writeln!(out, "  return values (--returns):")?;
        for (symbol, r) in with_returns {
            match r {
                ReturnPlan::Sites { sites, reason } => {
                    let at: Vec<String> = sites
                        .iter()
                        .map(|s| {
                            let how = if s.emulated { "emulated" } else { "single-stepped" };
                            format!("+{} {} ({how})", s.offset, s.instruction)
                        })
                        .collect();
                    writeln!(out, "  {symbol:<width$} uprobes at {}: {reason}", at.join(", "))?;
                }
                ReturnPlan::Uretprobe { reason } => writeln!(out, "  {symbol:<width$} uretprobe: {reason}")?,
            }
        }
    }
    live_impls(out, plan)?;
    if !plan.missing.is_empty() {
        writeln!(out, "  not in this build: {}", plan.missing.join(", "))?;
    }
    if let Some(gc) = &plan.gc {
        writeln!(out, "  gc: {}", crate::text::line(&gc.detail))?;
        for p in &gc.points {
            let semaphore = p.semaphore.map_or(String::new(), |s| format!(", semaphore at file offset {s:#x}"));
            let kind = if p.ret { "return of " } else { "" };
            let how = if p.emulated { "emulated" } else { "single-stepped" };
            writeln!(
                out,
                "  gc {:<5} {kind}{} at file offset {:#x} ({how}), argument {}{semaphore}",
                match p.role {
                    crate::plan::gc::GcRole::Start => "start",
                    crate::plan::gc::GcRole::Done => "done",
                },
                p.name,
                p.file_offset,
                p.argument
            )?;
        }
    }
    if let Some(growth) = &plan.growth {
        growth_points(out, growth)?;
    }
    for note in &plan.notes {
        writeln!(
            out,
            "  {}: {}",
            if note.level == Level::Warning { "warning" } else { "note" },
            crate::text::line(&note.message)
        )?;
    }
    Ok(())
}

/// With `--growth`: where each growth probe goes and why, or why there is
/// none (the notes say that too).
fn growth_points(out: &mut impl Write, growth: &crate::plan::growth::GrowthPlan) -> std::io::Result<()> {
    if growth.unavailable.is_some() {
        return Ok(());
    }
    writeln!(out, "  growth: {}", crate::text::line(&growth.detail))?;
    for p in &growth.points {
        let role = match p.role {
            crate::plan::growth::GrowthRole::Take => "take",
            crate::plan::growth::GrowthRole::Carve => "carve",
            crate::plan::growth::GrowthRole::Arena => "arena",
        };
        let how = if p.emulated { "emulated" } else { "single-stepped" };
        writeln!(
            out,
            "  growth {role:<5} {} +{} `{}` at file offset {:#x} ({how}), reads {}: {}",
            p.function, p.offset, p.instruction, p.file_offset, p.reads, p.reason
        )?;
    }
    if let Some(why) = &growth.fallback {
        writeln!(out, "  growth: FALLBACK: {}", crate::text::line(why))?;
    }
    if let Some(caveat) = &growth.caveat {
        writeln!(out, "  growth: PARTIAL: {}", crate::text::line(caveat))?;
    }
    Ok(())
}

/// With `--live`: where each allocator implementation is probed and how
/// its return is read.
fn live_impls(out: &mut impl Write, plan: &PlanReport) -> std::io::Result<()> {
    if plan.live_impls.is_empty() {
        return Ok(());
    }
    writeln!(out, "  allocator implementations (--live):")?;
    let width = name_width(plan);
    for i in &plan.live_impls {
        let p = &i.placement;
        let how = if p.emulated { "emulated" } else { "single-stepped" };
        let entry = format!("+{} {} ({how})", p.offset, p.instruction);
        let how = match &i.returns {
            ReturnPlan::Sites { sites, .. } => {
                let at: Vec<String> = sites.iter().map(|s| format!("+{} {}", s.offset, s.instruction)).collect();
                format!("uprobes at {}", at.join(", "))
            }
            ReturnPlan::Uretprobe { .. } => "uretprobe".to_owned(),
        };
        writeln!(out, "  {:<width$} {entry}; return: {how}: {}", i.symbol, i.returns.reason())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 3.12's `_Py_NewReferenceNoTotal` (23 characters) widens the names'
    /// column: the offsets of every row end where the header's does.
    #[test]
    fn a_long_function_name_widens_the_plans_column() {
        let line = include_str!("../../tests/data/plans.jsonl").lines().next().expect("a plan");
        let mut plan: PlanReport = serde_json::from_str(line).expect("a plan report");
        plan.probes[0].symbol = "_Py_NewReferenceNoTotal".to_owned();
        let mut out = Vec::new();
        table(&mut out, &plan).expect("written");
        let text = String::from_utf8(out).expect("UTF-8");
        let rows: Vec<&str> = text.lines().skip(1).take(plan.probes.len() + 1).collect();
        assert!(rows[0].starts_with("  function                 offset  instruction"), "{text}");
        assert!(rows[1].starts_with("  _Py_NewReferenceNoTotal      +7  push %rbx"), "{text}");
        // The offsets, right-aligned, end at one place: after the names'
        // 23 characters, a space and their 7.
        let end = 2 + 23 + 1 + 7;
        for row in &rows {
            let chars: Vec<char> = row.chars().collect();
            assert!(chars[end - 1] != ' ' && chars[end] == ' ', "the offsets end at {end}: {row:?}");
        }
    }
}
