//! What each probe's counts cover, reported with every attach: which
//! copies of the function are probed, where that knowledge came from, and
//! whether its calls and bytes are complete. A count that covers part of
//! the calls says so, with the reason and the fix; never a silent zero.

use serde::{Deserialize, Serialize};

/// Whether a count covers every event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Completeness {
    /// Every call (or every requested byte) is counted.
    Complete,
    /// Some are not; `reason` says which.
    Partial,
    /// Not measured at all (a function that requests no bytes).
    None,
}

/// One probe's coverage, in the `attached` event's `coverage` object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    /// Where the probed sites were found: `symbols` (the ELF symbol table
    /// alone), or the file whose DWARF listed the inlined copies.
    pub source: String,
    /// Out-of-line copies probed (the function's symbol): 0 or 1.
    pub out_of_line: usize,
    /// Inlined copies found: those the DWARF lists and the reads of the
    /// function's switch in none of them, or without DWARF those reads
    /// alone; `null` when nothing can tell (an LTO build may have inlined
    /// the function anywhere).
    pub inlined: Option<usize>,
    /// Of those, how many are probed.
    pub inlined_probed: usize,
    /// Of the inlined copies found, the places where GCC enters a copy
    /// past the entry its DWARF gives, found in the code and probed as
    /// copies of their own (see discover/entries.rs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_entries: Option<usize>,
    /// Call sites probed instead of the entry (`--placement call-sites`).
    pub call_sites: usize,
    pub calls: Completeness,
    pub bytes: Completeness,
    /// With `--types`, for a probe that counts objects by type: whether
    /// every counted call also counted its object's type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub types: Option<Completeness>,
    /// With `--live`, for an allocating function or a free: whether the
    /// live table sees every call's block (not at inlined copies, whose
    /// returned or freed pointer is not read; the live report counts
    /// their calls as `unseen_allocs` and `unseen_frees`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<Completeness>,
    /// Why a count is partial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What makes it complete: a package to install, a flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// With the DWARF (`tracer probes`): where its copies and the reads of
    /// the switch that guards them disagree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_check: Option<crate::discover::guards::CrossCheck>,
}

impl Coverage {
    /// Whether anything is partial.
    #[must_use]
    pub fn is_partial(&self) -> bool {
        self.calls == Completeness::Partial
            || self.bytes == Completeness::Partial
            || self.types == Some(Completeness::Partial)
            || self.live == Some(Completeness::Partial)
    }
}
