//! The table's lines for `--live` and `--leaks`.

use std::io::Write;

use super::group;
use crate::model::{Leaks, Live, SiteFrame};

/// One line per domain with blocks or calls, then what the figures do not
/// cover.
pub fn live(out: &mut dyn Write, live: &Live) -> std::io::Result<()> {
    let domains = [("object", Some(&live.object)), ("mem", Some(&live.mem)), ("raw", Some(&live.raw))];
    for (name, d) in domains.into_iter().chain([("native", live.native.as_ref())]) {
        let Some(d) = d else { continue };
        if d.allocations == 0 && d.untracked_frees == 0 && d.unseen_allocations == 0 && d.unseen_frees == 0 {
            continue;
        }
        let signed = |n: i64| if n < 0 { format!("-{}", group(n.unsigned_abs())) } else { group(n.unsigned_abs()) };
        let mut extra = Vec::new();
        for (what, n) in [
            ("untracked frees", d.untracked_frees),
            ("dropped (table full)", d.dropped),
            ("unseen allocations", d.unseen_allocations),
            ("unseen frees", d.unseen_frees),
            ("nested", d.nested),
        ] {
            if n > 0 {
                extra.push(format!("{what} {}", group(n)));
            }
        }
        let extra = if extra.is_empty() { String::new() } else { format!("; {}", extra.join(", ")) };
        writeln!(
            out,
            "  live  {name:<6} {:>12} blocks {:>16} bytes  ({} allocated, {} freed since the attach{extra})",
            signed(d.count),
            signed(d.bytes),
            group(d.allocations),
            group(d.frees),
        )?;
    }
    if live.dropped > 0 {
        writeln!(
            out,
            "  live: the table ({} blocks) was full: {} blocks were not kept (raise --live-max)",
            group(u64::from(live.capacity)),
            group(live.dropped)
        )?;
    }
    if let Some(why) = &live.partial {
        writeln!(out, "  live: partial: {why}")?;
    }
    writeln!(out, "  live: {}", live.unknown)
}

/// The oldest outstanding blocks.
pub fn leaks(out: &mut dyn Write, leaks: &Leaks) -> std::io::Result<()> {
    writeln!(
        out,
        "  leaks: {} blocks, {} bytes, outstanding for at least {} s; the {} oldest:",
        group(leaks.count),
        group(leaks.bytes),
        leaks.older_than_s,
        leaks.oldest.len()
    )?;
    let sites = leaks.oldest.iter().any(|l| l.stack.is_some() || l.no_stack.is_some());
    if !leaks.oldest.is_empty() {
        let site = if sites { "  site (innermost frame)" } else { "" };
        writeln!(
            out,
            "  {:>8} {:>18} {:>12} {:<6} {:<18} {:>9}{site}",
            "PID", "address", "bytes", "domain", "function", "age"
        )?;
    }
    for l in &leaks.oldest {
        let site = match (&l.stack, &l.no_stack) {
            (Some(frames), _) => format!("  {}{}", innermost(frames), if l.stack_truncated { " (cut)" } else { "" }),
            (None, Some(why)) => format!("  ({why})"),
            (None, None) => String::new(),
        };
        writeln!(
            out,
            "  {:>8} {:>#18x} {:>12} {:<6} {:<18} {:>8.1}s{site}",
            l.pid,
            l.address,
            group(l.size),
            l.domain,
            l.function,
            l.age_s
        )?;
    }
    writeln!(out, "  leaks: sites: {}", leaks.sites)
}

/// A stack's innermost Python frame, as the flame graph names it.
fn innermost(frames: &[SiteFrame]) -> String {
    frames.first().map_or_else(|| "<no Python frame>".to_owned(), super::stacks::label)
}
