//! The other ways into an inlined copy: a copy the DWARF gives an entry
//! (`entry_pc`) may also be entered at the start of another of its
//! ranges, by a path of its caller that never passes the entry. GCC does
//! this where two paths of the caller end in the same copy: the forky
//! root's LTO 3.14 has `PyObject_GC_Del` jump into its copy of
//! `PyObject_Free` past the entry when the young generation's count is 0.
//! A probe at the entry alone misses those calls.
//!
//! Each place where control comes into the copy's code from outside it
//! (a range start, or any instruction a jump from outside lands on) is
//! decoded within the function that holds the copy and sorted by what the
//! control flow allows:
//! - reached only through the entry: part of the same call, not probed;
//! - reached from the function's start without passing the entry, and
//!   never from the entry: another entry, probed (each call passes one
//!   entry or the other, never both);
//! - reached both ways (a loop around the copy): a probe there might count
//!   a call twice, none might miss one; not probed, and said.

use std::{collections::HashSet, ops::Range};

use iced_x86::{Decoder, DecoderOptions, FlowControl};

/// What the range starts of one copy are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OtherEntries {
    /// Range starts only paths that skip the entry reach.
    pub entries: Vec<u64>,
    /// Range starts that paths reach both through and around the entry.
    pub ambiguous: Vec<u64>,
}

/// The other entries of a copy entered at `entry` with code in `ranges`,
/// inside the function at `function` (link-time addresses) whose code is
/// `code`, where `siblings` are the entries of the other copies of the
/// same function (GCC shares code between copies: a path through a
/// sibling's entry is that sibling's call, counted there).
///
/// A range start the function's start reaches without passing an entry
/// is, in turn: covered, when every path from it passes an entry before
/// it leaves the function (code of the call scheduled before its entry);
/// another entry, when no entry reaches it (so no call passes both), which
/// is then an entry for the next range starts too; or else ambiguous.
#[must_use]
pub fn other_entries(entry: u64, ranges: &[Range<u64>], function: u64, code: &[u8], siblings: &[u64]) -> OtherEntries {
    let graph = Graph::decode(function, code);
    // Where control comes into the copy's code from outside it: a range
    // start it falls into, or any instruction of it a jump from outside
    // lands on (GCC may list a second inlined instance in the same DIE,
    // entered in the middle of a range).
    let inside = |a: u64| ranges.iter().any(|r| r.contains(&a));
    let mut starts: Vec<u64> = graph
        .nodes
        .iter()
        .filter(|(at, _, _)| !inside(*at))
        .flat_map(|(_, next, _)| next.iter().copied())
        .filter(|&s| inside(s) && s != entry)
        .collect();
    if inside(function) && function != entry {
        starts.push(function);
    }
    starts.sort_unstable();
    starts.dedup();
    if starts.is_empty() {
        return OtherEntries::default();
    }
    let mut entries: HashSet<u64> = siblings.iter().copied().chain([entry]).collect();
    let mut out = OtherEntries::default();
    loop {
        let (around, _) = graph.reachable(function, &entries);
        let mut ambiguous = Vec::new();
        let mut added = false;
        for &s in starts.iter().filter(|s| !entries.contains(s) && around.contains(s)) {
            let (_, exits) = graph.reachable(s, &entries);
            if !exits {
                continue;
            }
            if entries.iter().any(|&e| graph.reachable(e, &HashSet::new()).0.contains(&s)) {
                if std::env::var_os("TRACER_DEBUG_ENTRIES").is_some() {
                    eprintln!("ambiguous {s:#x}: entry {entry:#x} ranges {ranges:x?} entries {entries:x?} fn {function:#x} path {:x?}", graph.path(function, s, &entries));
                }
                ambiguous.push(s);
            } else {
                entries.insert(s);
                out.entries.push(s);
                added = true;
                break;
            }
        }
        if !added {
            out.ambiguous = ambiguous;
            return out;
        }
    }
}

/// A function's instructions and where each one may go next.
struct Graph {
    /// (address, successors, whether it may leave the function) in
    /// address order.
    nodes: Vec<(u64, Vec<u64>, bool)>,
}

impl Graph {
    fn decode(function: u64, code: &[u8]) -> Self {
        let end = function + code.len() as u64;
        let mut decoder = Decoder::with_ip(64, code, function, DecoderOptions::NONE);
        let mut nodes = Vec::new();
        while decoder.can_decode() {
            let insn = decoder.decode();
            let next = insn.next_ip();
            let inside = |a: u64| (function..end).contains(&a);
            let (successors, leaves): (Vec<u64>, bool) = match insn.flow_control() {
                FlowControl::Return | FlowControl::IndirectBranch | FlowControl::Exception | FlowControl::Interrupt => {
                    (vec![], true)
                }
                FlowControl::UnconditionalBranch => {
                    let t = insn.near_branch_target();
                    if inside(t) { (vec![t], false) } else { (vec![], true) }
                }
                FlowControl::ConditionalBranch => {
                    let t = insn.near_branch_target();
                    let all = [next, t];
                    (all.iter().copied().filter(|&a| inside(a)).collect(), !all.iter().all(|&a| inside(a)))
                }
                // A call comes back (a call that never does, to abort, only
                // adds a path that is not taken).
                _ => (vec![next].into_iter().filter(|&t| inside(t)).collect(), !inside(next)),
            };
            nodes.push((insn.ip(), successors, leaves));
        }
        Self { nodes }
    }

    /// A path from `from` to `to` avoiding `stops` (debugging).
    fn path(&self, from: u64, to: u64, stops: &HashSet<u64>) -> Vec<u64> {
        let mut prev = std::collections::HashMap::new();
        let mut todo = std::collections::VecDeque::from([from]);
        prev.insert(from, from);
        while let Some(at) = todo.pop_front() {
            if at == to { break; }
            if at != from && stops.contains(&at) { continue; }
            if let Ok(i) = self.nodes.binary_search_by_key(&at, |n| n.0) {
                for &n in &self.nodes[i].1 { if !prev.contains_key(&n) { prev.insert(n, at); todo.push_back(n); } }
            }
        }
        let mut out = vec![to];
        let mut at = to;
        while let Some(&p) = prev.get(&at) { if p == at { break; } out.push(p); at = p; }
        out.reverse();
        out
    }

    /// The instructions reached from `from`, never going on from one in
    /// `stops` (`from` itself aside), and whether a path leaves the
    /// function (a return, an indirect jump, a jump out of it).
    fn reachable(&self, from: u64, stops: &HashSet<u64>) -> (HashSet<u64>, bool) {
        let mut seen = HashSet::new();
        let mut exits = false;
        let mut todo = vec![from];
        while let Some(at) = todo.pop() {
            if !seen.insert(at) || (at != from && stops.contains(&at)) {
                continue;
            }
            match self.nodes.binary_search_by_key(&at, |n| n.0) {
                Ok(i) => {
                    let (_, next, leaves) = &self.nodes[i];
                    exits |= *leaves;
                    todo.extend(next.iter().copied());
                }
                Err(_) => exits = true,
            }
        }
        (seen, exits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Assembled by hand, at 0x1000:
    /// ```text
    /// 0x1000 test %edx,%edx        85 d2
    /// 0x1002 jle 0x100a            7e 06
    /// 0x1004 sub $1,%edx           83 ea 01   ; the count > 0 path
    /// 0x1007 nop                   90         ; the copy's entry
    /// 0x1008 jmp 0x100b            eb 01
    /// 0x100a nop                   90         ; the copy's second range:
    /// 0x100b ret                   c3         ; the count <= 0 path
    /// ```
    /// The copy is 0x1007..0x100a and 0x100a..0x100b: its second range
    /// starts where only the jle goes, so it is another entry.
    #[test]
    fn a_range_only_a_path_around_the_entry_reaches_is_an_entry() {
        let code = [0x85, 0xd2, 0x7e, 0x06, 0x83, 0xea, 0x01, 0x90, 0xeb, 0x01, 0x90, 0xc3];
        let found = other_entries(0x1007, &[0x1007..0x100a, 0x100a..0x100b], 0x1000, &code, &[]);
        assert_eq!(found, OtherEntries { entries: vec![0x100a], ambiguous: vec![] });
    }

    /// The same, where the entry's path runs into the second range: that
    /// range is part of the call.
    #[test]
    fn a_range_the_entry_leads_to_is_part_of_the_call() {
        // 0x1008 is a two-byte nop instead of the jmp: the entry falls
        // through into 0x100a.
        let code = [0x85, 0xd2, 0x7e, 0x06, 0x83, 0xea, 0x01, 0x90, 0x66, 0x90, 0x90, 0xc3];
        let found = other_entries(0x1007, &[0x1007..0x100a, 0x100a..0x100b], 0x1000, &code, &[]);
        assert_eq!(found, OtherEntries { entries: vec![], ambiguous: vec![0x100a] });
    }

    /// Code of the call scheduled before its entry: every path from there
    /// passes the entry, so it is not another.
    #[test]
    fn a_range_before_the_entry_that_leads_to_it_is_part_of_the_call() {
        // 0x1000 nop (the copy's first range), 0x1001 nop (its entry),
        // 0x1002 ret.
        let code = [0x90, 0x90, 0xc3];
        let found = other_entries(0x1001, &[0x1001..0x1003, 0x1000..0x1001], 0x1000, &code, &[]);
        assert_eq!(found, OtherEntries::default());
    }

    /// A range reached only through the entry is not another entry.
    #[test]
    fn a_range_behind_the_entry_is_not_an_entry() {
        // 0x1002 is a two-byte nop instead of the jle: every path passes
        // the entry.
        let code = [0x85, 0xd2, 0x66, 0x90, 0x83, 0xea, 0x01, 0x90, 0x66, 0x90, 0x90, 0xc3];
        let found = other_entries(0x1007, &[0x1007..0x100a, 0x100a..0x100b], 0x1000, &code, &[]);
        assert_eq!(found, OtherEntries::default());
    }
}
