//! What each probe's counts cover, reported with every attach: which
//! copies of the function are probed, where that knowledge came from, and
//! whether its calls and bytes are complete. A count that covers part of
//! the calls says so, with the reason and the fix; never a silent zero.
//! `coverage()` works it out for one probe, from what was found of its
//! inlined copies and which of them are probed.

use serde::{Deserialize, Serialize};

use super::{ImageRef, InlineSite, Inlining};
use crate::{discover::guards, probe::ProbeSpec};

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

/// What `spec`'s probe covers, with `probed` of its inlined copies probed
/// and `unprobed` saying why the rest are not.
pub(super) fn coverage(
    image: ImageRef<'_>,
    spec: &ProbeSpec,
    sites: &[InlineSite],
    unprobed: &[String],
    returns: bool,
) -> Coverage {
    // One copy probed at several jumps into it is one copy.
    let probed = sites.iter().filter(|s| !s.also).count();
    let sizeless = sites.iter().filter(|s| !s.also && s.size.is_none()).count();
    let measures_bytes = spec.program.counts_bytes();
    let mut c = Coverage {
        source: "symbols".to_owned(),
        out_of_line: 1,
        inlined: None,
        inlined_probed: probed,
        other_entries: None,
        call_sites: 0,
        calls: Completeness::Complete,
        bytes: if measures_bytes { Completeness::Complete } else { Completeness::None },
        types: None,
        live: None,
        reason: None,
        fix: None,
        cross_check: None,
    };
    match image.inlining {
        // tracer's own code: nothing is inlined that it would count.
        None => {}
        Some(Inlining::Skipped) => {
            c.calls = Completeness::Partial;
            if measures_bytes {
                c.bytes = Completeness::Partial;
            }
            c.reason = Some(format!("--no-inlined: copies of {} the compiler inlined are not probed", spec.symbol));
            c.fix = Some("drop --no-inlined".to_owned());
        }
        Some(Inlining::Guards { fix, scan }) => guard_coverage(&mut c, (image, spec), (fix, scan), sites, unprobed),
        Some(Inlining::Known { source, entries, cross_check, entered }) => {
            c.source.clone_from(source);
            c.cross_check = cross_check.get(spec.symbol).cloned();
            let Some(listed) = entries.get(spec.symbol).map(Vec::len) else {
                // The DWARF does not describe it: copies it may have are
                // unknown.
                c.calls = Completeness::Partial;
                if measures_bytes {
                    c.bytes = Completeness::Partial;
                }
                c.reason =
                    Some(format!("{source} does not describe {}, so its inlined copies are unknown", spec.symbol));
                return c;
            };
            c.inlined = Some(listed);
            let entered = entered.get(spec.symbol);
            c.other_entries = entered.map(|e| e.other).filter(|&n| n > 0);
            let mut unprobed = unprobed.to_vec();
            if let Some(starts) = entered.map(|e| &e.ambiguous).filter(|a| !a.is_empty()) {
                unprobed.push(format!(
                    "{} places where control enters a copy's code both from an entry and around every entry ({}): a probe there could count a call twice, and the calls that enter there are not counted",
                    starts.len(),
                    starts.iter().take(3).map(|a| format!("{a:#x}")).collect::<Vec<_>>().join(", ")
                ));
            }
            if let Some(entries) = entered.map(|e| &e.unchecked).filter(|u| !u.is_empty()) {
                unprobed.push(format!(
                    "{} copies lie in no function of the symbol table ({}): their code is not decoded, so places that enter them past their entry, if any, are not counted",
                    entries.len(),
                    entries.iter().take(3).map(|a| format!("{a:#x}")).collect::<Vec<_>>().join(", ")
                ));
            }
            if !unprobed.is_empty() {
                c.calls = Completeness::Partial;
                if measures_bytes {
                    c.bytes = Completeness::Partial;
                }
                c.reason = Some(format!("inlined copies not probed: {}", unprobed.join("; ")));
                if unprobed.iter().any(|u| u.contains("--no-inlined")) {
                    c.fix = Some("drop --no-inlined".to_owned());
                }
            }
            let mut why = Vec::new();
            if measures_bytes && sizeless > 0 {
                c.bytes = Completeness::Partial;
                why.push(format!(
                    "neither the DWARF nor the code shows where the size is at {sizeless} of the {probed} inlined copies (their calls are counted, their bytes are not)"
                ));
            }
            if measures_bytes && returns && probed > 0 {
                why.push(format!(
                    "return values are read at the out-of-line function only, not at its {probed} inlined copies"
                ));
            }
            if !why.is_empty() {
                let why = why.join("; ");
                c.reason = Some(c.reason.map_or(why.clone(), |r| format!("{r}; {why}")));
            }
        }
    }
    c
}

/// With `--live`, whether the live table sees every call's block. A call
/// is seen when it calls an allocator implementation, whose return is
/// probed; without the implementations (no symbols), none is. At an
/// inlined copy that runs the default allocator inlined (LTO's
/// devirtualised pymalloc) no implementation is called: their blocks are
/// predicted from pymalloc's state where it can be, else counted as unseen
/// while tracer runs, so the coverage can only say that copies may be
/// missed.
pub(super) fn live_coverage(c: &mut Coverage, symbol: &str, sites: &[InlineSite], implementations: bool) {
    let partial = c.calls == Completeness::Partial || !sites.is_empty() || !implementations;
    c.live = Some(if partial { Completeness::Partial } else { Completeness::Complete });
    let why = if !implementations {
        Some("live memory: the allocator implementations (_PyObject_Malloc, ...) are not in the image's symbols and no debug file gives them, so no block is tracked".to_owned())
    } else if !sites.is_empty() {
        let copies = sites.iter().filter(|s| !s.also).count();
        // The raw domain's default allocator is the C library's, whose
        // functions only --native probes; pymalloc's state says nothing of
        // its blocks.
        Some(if symbol.starts_with("PyMem_Raw") {
            format!(
                "live memory: its {copies} inlined copies are seen where they call an allocator implementation; where they call the C library's allocator directly (LTO), their blocks are taken from its functions with --native, else they are not tracked and are counted as unseen"
            )
        } else {
            format!(
                "live memory: its {copies} inlined copies are seen where they call an allocator implementation; where they run the default allocator inlined (LTO), their blocks are read from pymalloc's state at the copy where it is found and the copy shows the size (and a realloc's block), else they are not tracked and are counted as unseen"
            )
        })
    } else {
        None
    };
    if let Some(why) = why {
        c.reason = Some(c.reason.take().map_or(why.clone(), |r| format!("{r}; {why}")));
    }
}

/// With `--types`, whether every probed call also counts its object's type
/// (at a new reference: its creation; at the object domain's free: its
/// destruction): not where calls are partial, nor at copies where neither
/// the DWARF nor the code shows where the object (`what`) is.
pub(super) fn types_coverage(c: &mut Coverage, sites: &[InlineSite], what: &str, counted: &str) {
    // A copy probed at several jumps into it is one copy, read alike at
    // each.
    let objectless = sites.iter().filter(|s| !s.also && s.object.is_none()).count();
    c.types = Some(if c.calls == Completeness::Partial || objectless > 0 {
        Completeness::Partial
    } else {
        Completeness::Complete
    });
    if objectless > 0 {
        let why = format!(
            "neither the DWARF nor the code shows where {what} at {objectless} of the {} inlined copies (their calls are counted, their {counted} are not)",
            sites.iter().filter(|s| !s.also).count()
        );
        c.reason = Some(c.reason.take().map_or(why.clone(), |r| format!("{r}; {why}")));
    }
}

/// [`coverage`] of copies found by the reads of their switches, with no
/// DWARF: `c` starts complete.
fn guard_coverage(
    c: &mut Coverage,
    (image, spec): (ImageRef<'_>, &ProbeSpec),
    (fix, scan): (&str, &guards::Scan),
    sites: &[InlineSite],
    unprobed: &[String],
) {
    // One copy probed at several jumps into it is one copy.
    let probed = sites.iter().filter(|s| !s.also).count();
    let measures_bytes = spec.program.counts_bytes();
    c.source = format!("reads of its guard in {} (no debug info)", scan.path.display());
    let mut why = Vec::new();
    match scan.functions.get(spec.symbol) {
        Some(Ok(found)) => {
            c.inlined = Some(found.sites.len());
            if !found.unclassified.is_empty() {
                c.calls = Completeness::Partial;
                why.push(format!(
                    "{} reads of {} could not be told creation or destruction and are not counted",
                    found.unclassified.len(),
                    found.guard
                ));
            }
            if !unprobed.is_empty() {
                c.calls = Completeness::Partial;
                why.push(format!("copies not probed: {}", unprobed.join("; ")));
            }
            if found.undecodable > 0 {
                c.calls = Completeness::Partial;
                why.push(format!(
                    "{} reads of {} are in code tracer could not decode from its start, and are not probed",
                    found.undecodable, found.guard
                ));
            }
            let sizeless = sites.iter().filter(|s| !s.also && s.size.is_none()).count();
            if measures_bytes && (sizeless > 0 || c.calls == Completeness::Partial) {
                c.bytes = Completeness::Partial;
                if sizeless > 0 {
                    why.push(format!(
                        "the code does not show the size at {sizeless} of the {probed} copies found by their reads of {} (their calls are counted, their bytes are not)",
                        found.guard
                    ));
                }
            }
        }
        not_found => {
            c.calls = Completeness::Partial;
            if measures_bytes {
                c.bytes = Completeness::Partial;
            }
            let cause = match not_found {
                Some(Err(guards::NotFound::Unrecognised(how))) => {
                    format!("its code is not what tracer knows: {how}")
                }
                _ => "no runtime switch guards every copy".to_owned(),
            };
            why.push(format!(
                "no debug info found for {}, so the copies of {} that the compiler inlined (an LTO build inlines it widely) cannot be found ({cause}); calls through them are not counted",
                image.display_path.display(),
                spec.symbol
            ));
        }
    }
    if !why.is_empty() {
        c.reason = Some(why.join("; "));
        c.fix = Some(fix.to_owned());
    }
}
