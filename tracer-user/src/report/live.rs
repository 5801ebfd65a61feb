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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Leak;

    fn leak(stack: Option<Vec<SiteFrame>>, no_stack: Option<&str>) -> Leak {
        Leak {
            pid: 7,
            address: 0x1000,
            size: 12_346,
            domain: "object".to_owned(),
            function: "PyObject_Malloc".to_owned(),
            age_s: 1.0,
            stack,
            stack_truncated: false,
            no_stack: no_stack.map(str::to_owned),
        }
    }

    /// With stacks, each listed block ends with its innermost frame, or
    /// why it has none; without, no site column.
    #[test]
    fn leaks_show_their_innermost_frame_or_why_none() {
        let keep = SiteFrame { function: "keep".to_owned(), file: "/t/live.py".to_owned(), line: Some(26) };
        let outer = SiteFrame { function: "<module>".to_owned(), file: "/t/live.py".to_owned(), line: Some(40) };
        let leaks = Leaks {
            older_than_s: 0.0,
            count: 2,
            bytes: 24_692,
            oldest: vec![
                leak(Some(vec![keep, outer]), None),
                leak(None, Some("no stack: --sample 2 left its call out")),
            ],
            sites: "each block's Python stack".to_owned(),
        };
        let mut out = Vec::new();
        super::leaks(&mut out, &leaks).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[1].ends_with("age  site (innermost frame)"), "{text}");
        assert!(lines[2].ends_with("1.0s  keep (live.py:26)"), "{text}");
        assert!(lines[3].ends_with("1.0s  (no stack: --sample 2 left its call out)"), "{text}");
        assert_eq!(lines[4], "  leaks: sites: each block's Python stack");
        let bare = Leaks { oldest: vec![leak(None, None)], ..leaks };
        let mut out = Vec::new();
        super::leaks(&mut out, &bare).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.lines().nth(1).is_some_and(|l| l.ends_with("age")), "{text}");
    }
}
