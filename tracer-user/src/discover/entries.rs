//! The other ways into an inlined copy: a copy the DWARF gives an entry
//! (`entry_pc`) may also be entered past it, by a path of its caller that
//! never passes the entry. GCC does this where two paths of the caller end
//! in the same call: the forky root's LTO 3.14 has `PyObject_GC_Del` jump
//! into its copy of `PyObject_Free` past the entry when the young
//! generation's count is 0. A probe at the entry alone misses those calls.
//!
//! The function that holds the copies is decoded, and each place where
//! control comes into a copy's code from outside it (a range start, or an
//! instruction a jump from outside lands on) is sorted by what the control
//! flow allows:
//! - every path from it passes an entry before it leaves the function
//!   (code of the call scheduled before its entry): covered;
//! - the code no call passes (reached from the function's start, or from
//!   any place an indirect jump may land, without passing an entry) leads
//!   to it, and no entry does without first going through such code:
//!   another entry, probed. A call passes one of them, never both: a call
//!   that passed an entry and came back here went through code that runs
//!   outside any call (a loop around the copy), so that call had ended.
//! - an entry leads to it directly too: a probe there could count a call
//!   twice, none misses some; not probed, and said.
//!
//! The indirect jumps of a function (jump tables, computed gotos, as in the
//! interpreter's loop) are not followed: where a function has one, every
//! instruction no direct jump or fall-through reaches is taken as a place
//! it may land, so no path is missed.

use std::{collections::VecDeque, ops::Range};

use iced_x86::{Decoder, DecoderOptions, FlowControl, Mnemonic};

/// One copy of a function: its entry and its code.
#[derive(Clone, Copy, Debug)]
pub struct Copy<'a> {
    pub entry: u64,
    pub ranges: &'a [Range<u64>],
}

/// What the places a copy is entered at are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OtherEntries {
    /// Places only paths that skip every entry reach.
    pub entries: Vec<u64>,
    /// Places paths reach both through an entry and around it.
    pub ambiguous: Vec<u64>,
}

/// A function's instructions and where each one may go next.
pub struct Graph {
    /// Instruction addresses, in order.
    at: Vec<u64>,
    /// Successors of each instruction, as indices into `at`.
    next: Vec<Vec<usize>>,
    /// Whether a path may leave the function from each instruction (a
    /// return, an indirect jump, a jump or fall-through out of it).
    leaves: Vec<bool>,
    /// Where paths start: the function's start, and, where it has an
    /// indirect jump, every instruction nothing else leads to.
    roots: Vec<usize>,
    /// What leads to each instruction, as indices into `at`.
    from: Vec<Vec<usize>>,
}

impl Graph {
    /// Decodes the function at `function` whose code is `code`.
    #[must_use]
    pub fn decode(function: u64, code: &[u8]) -> Self {
        Self::decode_parts(&[(function, code)])
    }

    /// Decodes a function in parts: its own code first, where paths start,
    /// then the parts GCC split off it (`.cold`), which it jumps to and
    /// back from within the same call.
    #[must_use]
    pub fn decode_parts(parts: &[(u64, &[u8])]) -> Self {
        let bounds: Vec<Range<u64>> =
            parts.iter().map(|&(at, code)| at..at.saturating_add(code.len() as u64)).collect();
        let inside = |a: u64| bounds.iter().any(|b| b.contains(&a));
        let mut at = Vec::new();
        let mut targets: Vec<Vec<u64>> = Vec::new();
        let mut leaves = Vec::new();
        let mut indirect = false;
        let mut filler = Vec::new();
        let mut order: Vec<usize> = (0..parts.len()).collect();
        order.sort_by_key(|&i| parts[i].0);
        let first = order.iter().position(|&i| i == 0).unwrap_or(0);
        let mut starts = Vec::new();
        for &part in &order {
            let (function, code) = parts[part];
            starts.push(at.len());
            let mut decoder = Decoder::with_ip(64, code, function, DecoderOptions::NONE);
            while decoder.can_decode() {
                let insn = decoder.decode();
                let next = insn.next_ip();
                let (successors, leave): (Vec<u64>, bool) = match insn.flow_control() {
                    FlowControl::IndirectBranch => {
                        indirect = true;
                        (vec![], true)
                    }
                    FlowControl::Return | FlowControl::Exception | FlowControl::Interrupt => (vec![], true),
                    FlowControl::UnconditionalBranch => {
                        let t = insn.near_branch_target();
                        if inside(t) { (vec![t], false) } else { (vec![], true) }
                    }
                    FlowControl::ConditionalBranch => {
                        let all = [next, insn.near_branch_target()];
                        (all.iter().copied().filter(|&a| inside(a)).collect(), !all.iter().all(|&a| inside(a)))
                    }
                    // A call comes back (one that never does, to abort, only
                    // adds a path that is not taken).
                    _ => (vec![next].into_iter().filter(|&t| inside(t)).collect(), !inside(next)),
                };
                at.push(insn.ip());
                filler.push(matches!(insn.mnemonic(), Mnemonic::Nop | Mnemonic::Int3));
                targets.push(successors);
                leaves.push(leave);
            }
        }
        let start = starts.get(first).copied().filter(|&i| i < at.len());
        let index = |a: u64| at.binary_search(&a).ok();
        let next: Vec<Vec<usize>> = targets.iter().map(|t| t.iter().filter_map(|&a| index(a)).collect()).collect();
        // A jump into the middle of an instruction (not decoded as one)
        // lands on code this graph does not have: that instruction may
        // leave it.
        let leaves: Vec<bool> =
            leaves.iter().zip(targets.iter().zip(&next)).map(|(&l, (t, n))| l || t.len() != n.len()).collect();
        let mut roots: Vec<usize> = start.into_iter().collect();
        let mut from: Vec<Vec<usize>> = vec![Vec::new(); at.len()];
        for (i, n) in next.iter().enumerate() {
            for &n in n {
                from[n].push(i);
            }
        }
        if indirect {
            // The padding between blocks (nops, int3) is not jumped to: it
            // only falls through into the next block, which is not a
            // place paths start for that.
            let mut padding = vec![false; at.len()];
            for _ in 0..2 {
                for i in 0..at.len() {
                    padding[i] = filler[i] && from[i].iter().all(|&p| padding[p]);
                }
            }
            roots.extend(
                (0..at.len()).filter(|&i| Some(i) != start && !padding[i] && from[i].iter().all(|&p| padding[p])),
            );
        }
        Self { at, next, leaves, roots, from }
    }

    fn index(&self, address: u64) -> Option<usize> {
        self.at.binary_search(&address).ok()
    }

    /// The instructions reached from `from`, never going on from one of
    /// `stops`, and whether a path leaves the function.
    fn reach(&self, from: &[usize], stops: &[bool]) -> (Vec<bool>, bool) {
        let mut seen = vec![false; self.at.len()];
        let mut exits = false;
        let mut todo: Vec<usize> = from.to_vec();
        while let Some(i) = todo.pop() {
            if std::mem::replace(&mut seen[i], true) || stops[i] {
                continue;
            }
            exits |= self.leaves[i];
            todo.extend(self.next[i].iter().copied());
        }
        (seen, exits)
    }

    /// How many instructions from the nearest place paths start each
    /// instruction is, never going on from one of `stops`; `usize::MAX`
    /// where none leads.
    fn distances(&self, stops: &[bool]) -> Vec<usize> {
        let mut distance = vec![usize::MAX; self.at.len()];
        let mut todo: VecDeque<usize> = VecDeque::new();
        for &r in &self.roots {
            if distance[r] == usize::MAX {
                distance[r] = 0;
                todo.push_back(r);
            }
        }
        while let Some(i) = todo.pop_front() {
            if stops[i] {
                continue;
            }
            for &n in &self.next[i] {
                if distance[n] == usize::MAX {
                    distance[n] = distance[i] + 1;
                    todo.push_back(n);
                }
            }
        }
        distance
    }

    /// The instructions of `around` an entry leads to through code outside
    /// `around` only: the code of the calls, which no path around the
    /// entries runs.
    fn within(&self, entries: &[usize], around: &[bool]) -> Vec<bool> {
        let mut hit = vec![false; self.at.len()];
        let mut seen = vec![false; self.at.len()];
        let mut todo: VecDeque<usize> = entries.iter().copied().collect();
        while let Some(i) = todo.pop_front() {
            for &n in &self.next[i] {
                if around[n] {
                    hit[n] = true;
                } else if !seen[n] {
                    seen[n] = true;
                    todo.push_back(n);
                }
            }
        }
        hit
    }
}

/// The other entries of each of `copies` (in their order), all in the
/// function `graph` is, where `probed` are the places every copy of the
/// same function is probed at in it (their entries, or the reads of the
/// switch that stand for them): a path through one of those is that
/// copy's call, counted there.
#[must_use]
pub fn other_entries(graph: &Graph, probed: &[u64], copies: &[Copy<'_>]) -> Vec<OtherEntries> {
    let len = graph.at.len();
    let mut out = vec![OtherEntries::default(); copies.len()];
    // Where control comes into each copy's code from outside it.
    let mut starts: Vec<(usize, usize)> = Vec::new();
    for (c, copy) in copies.iter().enumerate() {
        let inside = |a: u64| copy.ranges.iter().any(|r| r.contains(&a));
        let mut own: Vec<usize> = (0..len)
            .filter(|&i| !inside(graph.at[i]))
            .flat_map(|i| graph.next[i].iter().copied())
            .chain(graph.roots.iter().copied())
            .filter(|&i| inside(graph.at[i]) && graph.at[i] != copy.entry)
            .collect();
        own.sort_unstable();
        own.dedup();
        starts.extend(own.into_iter().map(|i| (c, i)));
    }
    if starts.is_empty() {
        return out;
    }
    let mut stops = vec![false; len];
    let mut entries: Vec<usize> = Vec::new();
    for i in probed.iter().chain(copies.iter().map(|c| &c.entry)).filter_map(|&a| graph.index(a)) {
        if !stops[i] {
            stops[i] = true;
            entries.push(i);
        }
    }
    loop {
        let distance = graph.distances(&stops);
        let around: Vec<bool> = distance.iter().map(|d| *d != usize::MAX).collect();
        let within = graph.within(&entries, &around);
        // The places around the entries that lead out of the function
        // without passing one, with what each leads to.
        let mut candidates: Vec<Candidate> = starts
            .iter()
            .filter(|&&(_, i)| !stops[i] && around[i])
            .filter_map(|&(c, i)| {
                let (reached, exits) = graph.reach(&[i], &stops);
                exits.then_some(Candidate { copy: c, at: i, unsure: within[i], reached })
            })
            .collect();
        // Taken one at a time, nearest the function's start first, and
        // never one an unsure place leads to: what a place leads to is its
        // calls', not another entry (GCC lists a second call merged into a
        // copy's code in the same DIE, and both calls go on into the
        // copy's later ranges).
        candidates.sort_by_key(|k| distance[k.at]);
        let clear = candidates
            .iter()
            .find(|k| !k.unsure && !candidates.iter().any(|u| u.unsure && u.at != k.at && u.reached[k.at]));
        if let Some(k) = clear {
            stops[k.at] = true;
            entries.push(k.at);
            out[k.copy].entries.push(graph.at[k.at]);
            continue;
        }
        // Where an entry leads too, the paths around every entry may each
        // come in through an instruction that goes nowhere else (a jump,
        // or one that falls through into it), which no call passes: each
        // time one runs, a call enters here that no entry counted. Those
        // are probed instead (GCC merges a second call into a copy's code
        // with a jump past the first call's size check).
        let resolved = candidates.iter().filter(|k| !graph.roots.contains(&k.at)).find_map(|k| {
            let around_from: Vec<usize> =
                graph.from[k.at].iter().copied().filter(|&j| around[j] && !stops[j]).collect();
            let only_here = |j: usize| graph.next[j] == [k.at] && !within[j] && !graph.leaves[j];
            (!around_from.is_empty() && around_from.iter().all(|&j| only_here(j))).then_some((k.copy, around_from))
        });
        let Some((c, jumps)) = resolved else {
            for k in candidates {
                out[k.copy].ambiguous.push(graph.at[k.at]);
            }
            return out;
        };
        for j in jumps {
            stops[j] = true;
            entries.push(j);
            out[c].entries.push(graph.at[j]);
        }
    }
}

/// A place where control comes into a copy from outside it.
struct Candidate {
    copy: usize,
    at: usize,
    /// An entry leads to it too.
    unsure: bool,
    /// What it leads to, not going on from a probed place.
    reached: Vec<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(entry: u64, ranges: &[Range<u64>], code: &[u8]) -> OtherEntries {
        let graph = Graph::decode(0x1000, code);
        other_entries(&graph, &[], &[Copy { entry, ranges }]).remove(0)
    }

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
        let found = one(0x1007, &[0x1007..0x100a, 0x100a..0x100b], &code);
        assert_eq!(found, OtherEntries { entries: vec![0x100a], ambiguous: vec![] });
    }

    /// The same, where the entry's path runs into the second range: a
    /// probe there would count the entry's calls twice.
    #[test]
    fn a_range_the_entry_leads_to_is_ambiguous() {
        // 0x1008 is a two-byte nop instead of the jmp: the entry falls
        // through into 0x100a.
        let code = [0x85, 0xd2, 0x7e, 0x06, 0x83, 0xea, 0x01, 0x90, 0x66, 0x90, 0x90, 0xc3];
        let found = one(0x1007, &[0x1007..0x100a, 0x100a..0x100b], &code);
        assert_eq!(found, OtherEntries { entries: vec![], ambiguous: vec![0x100a] });
    }

    /// Code of the call scheduled before its entry: every path from there
    /// passes the entry, so it is not another.
    #[test]
    fn a_range_before_the_entry_that_leads_to_it_is_part_of_the_call() {
        // 0x1000 nop (the copy's first range), 0x1001 nop (its entry),
        // 0x1002 ret.
        let code = [0x90, 0x90, 0xc3];
        let found = one(0x1001, &[0x1001..0x1003, 0x1000..0x1001], &code);
        assert_eq!(found, OtherEntries::default());
    }

    /// A range reached only through the entry is not another entry.
    #[test]
    fn a_range_behind_the_entry_is_not_an_entry() {
        // 0x1002 is a two-byte nop instead of the jle: every path passes
        // the entry.
        let code = [0x85, 0xd2, 0x66, 0x90, 0x83, 0xea, 0x01, 0x90, 0x66, 0x90, 0x90, 0xc3];
        let found = one(0x1007, &[0x1007..0x100a, 0x100a..0x100b], &code);
        assert_eq!(found, OtherEntries::default());
    }

    /// A loop around the copy: the entry's call ends in the loop's head,
    /// which the path around the entry also runs, so the second range is
    /// another entry (a call passes it or the entry, never both).
    /// ```text
    /// 0x1000 test %edx,%edx        85 d2      ; the loop's head
    /// 0x1002 jle 0x100a            7e 06
    /// 0x1004 sub $1,%edx           83 ea 01
    /// 0x1007 nop                   90         ; the copy's entry
    /// 0x1008 jmp 0x1000            eb f6      ; back to the head
    /// 0x100a nop                   90         ; the copy's second range
    /// 0x100b ret                   c3
    /// ```
    #[test]
    fn a_loop_around_the_copy_is_not_ambiguous() {
        let code = [0x85, 0xd2, 0x7e, 0x06, 0x83, 0xea, 0x01, 0x90, 0xeb, 0xf6, 0x90, 0xc3];
        let found = one(0x1007, &[0x1007..0x100a, 0x100a..0x100b], &code);
        assert_eq!(found, OtherEntries { entries: vec![0x100a], ambiguous: vec![] });
    }

    /// Code only an indirect jump reaches (a computed goto's label) is a
    /// place paths start: a range there is another entry. Padding is not.
    /// ```text
    /// 0x1000 jmp *%rax             ff e0
    /// 0x1002 xor %eax,%eax         31 c0      ; the copy's entry
    /// 0x1004 ret                   c3
    /// 0x1005 xor %eax,%eax         31 c0      ; the copy's second range,
    /// 0x1007 ret                   c3         ; a label no jump names
    /// 0x1008 nop                   90         ; padding, into the third
    /// 0x1009 xor %eax,%eax         31 c0      ; range, which only the
    /// 0x100b ret                   c3         ; padding leads to
    /// ```
    #[test]
    fn a_range_an_indirect_jump_may_reach_is_an_entry() {
        let code = [0xff, 0xe0, 0x31, 0xc0, 0xc3, 0x31, 0xc0, 0xc3, 0x90, 0x31, 0xc0, 0xc3];
        let found = one(0x1002, &[0x1002..0x1005, 0x1005..0x1008, 0x1009..0x100c], &code);
        assert_eq!(found, OtherEntries { entries: vec![0x1005, 0x1009], ambiguous: vec![] });
    }

    /// A second call merged into the copy: a jump from outside lands where
    /// the entry's path also goes. The jump is probed instead, as only
    /// that second call passes it.
    /// ```text
    /// 0x1000 test %edx,%edx        85 d2
    /// 0x1002 jle 0x100b            7e 07
    /// 0x1004 nop                   90         ; the copy's entry
    /// 0x1005 xor %eax,%eax         31 c0      ; the shared code
    /// 0x1007 ret                   c3
    /// 0x1008 xor %ecx,%ecx         31 c9      ; (caller code)
    /// 0x100a ret                   c3
    /// 0x100b xor %ecx,%ecx         31 c9      ; the second call's own
    /// 0x100d jmp 0x1005            eb f6      ; code, then into the copy
    /// ```
    #[test]
    fn a_merged_call_is_counted_at_its_jump() {
        let code = [0x85, 0xd2, 0x7e, 0x07, 0x90, 0x31, 0xc0, 0xc3, 0x31, 0xc9, 0xc3, 0x31, 0xc9, 0xeb, 0xf6];
        let found = one(0x1004, std::slice::from_ref(&(0x1004..0x1008)), &code);
        assert_eq!(found, OtherEntries { entries: vec![0x100d], ambiguous: vec![] });
    }

    /// A function's `.cold` part is decoded with it: a path around the
    /// entry that runs the copy's code there is another entry.
    /// ```text
    /// 0x1000 test %edx,%edx        85 d2
    /// 0x1002 je 0x2000             0f 84 f8 0f 00 00
    /// 0x1008 nop                   90         ; the copy's entry
    /// 0x1009 ret                   c3
    /// 0x2000 xor %eax,%eax         31 c0      ; the copy's cold part
    /// 0x2002 jmp 0x1009            e9 02 f0 ff ff
    /// ```
    #[test]
    fn a_cold_part_is_decoded_with_its_function() {
        let hot = [0x85, 0xd2, 0x0f, 0x84, 0xf8, 0x0f, 0x00, 0x00, 0x90, 0xc3];
        let cold = [0x31, 0xc0, 0xe9, 0x02, 0xf0, 0xff, 0xff];
        let graph = Graph::decode_parts(&[(0x1000, &hot), (0x2000, &cold)]);
        let ranges = [0x1008..0x1009, 0x2000..0x2002];
        let found = other_entries(&graph, &[], &[Copy { entry: 0x1008, ranges: &ranges }]);
        assert_eq!(found, vec![OtherEntries { entries: vec![0x2000], ambiguous: vec![] }]);
        // Alone, the hot part jumps out of the function there.
        let alone = other_entries(&Graph::decode(0x1000, &hot), &[], &[Copy { entry: 0x1008, ranges: &ranges }]);
        assert_eq!(alone, vec![OtherEntries::default()]);
    }

    /// A path through a sibling copy's entry is that sibling's call.
    #[test]
    fn a_range_a_sibling_leads_to_is_not_an_entry() {
        // As the first test, with the jle's target (0x100a) now a second
        // copy's entry, probed.
        let code = [0x85, 0xd2, 0x7e, 0x06, 0x83, 0xea, 0x01, 0x90, 0xeb, 0x01, 0x90, 0xc3];
        let graph = Graph::decode(0x1000, &code);
        let ranges = [0x1007..0x100a, 0x100a..0x100b];
        let found = other_entries(&graph, &[0x100a], &[Copy { entry: 0x1007, ranges: &ranges }]);
        assert_eq!(found, vec![OtherEntries::default()]);
    }
}
