//! CPython 3.12.
//!
//! Checked on this project's machines against pyenv's 3.12.1. 3.12 adds
//! `_Py_NewReferenceNoTotal` (Objects/object.c at v3.12.0): the same as
//! `_Py_NewReference` without the `Py_REF_DEBUG` total, called by the
//! free-list paths (floats, tuples, frames). It is probed only when named
//! (`--probes _Py_NewReferenceNoTotal`), so that the default table stays the
//! same on every version.

use super::{DebugOffsetsHeader, Guard, spec, with};
use crate::probe::{ProbeSpec, Program};

/// 3.12's probes: the common ones, then `_Py_NewReferenceNoTotal`.
pub(super) static PROBES: [ProbeSpec; 15] =
    with([ProbeSpec { in_default: false, ..spec("_Py_NewReferenceNoTotal", Program::CountCall, false) }]);

/// The 3.12 ABI.
#[derive(Debug)]
pub struct Abi312;

impl super::Abi for Abi312 {
    fn minor(&self) -> u8 {
        12
    }

    fn probes(&self) -> &'static [ProbeSpec] {
        &PROBES
    }

    fn debug_offsets(&self) -> Option<DebugOffsetsHeader> {
        None
    }

    fn guard(&self, symbol: &str) -> Option<Guard> {
        match symbol {
            // Objects/object.c at v3.12.0: `new_reference`, which both
            // `_Py_NewReference` and `_Py_NewReferenceNoTotal` inline, tests
            // `_PyRuntime.tracemalloc.config.tracing` first; its offset in
            // `_PyRuntime` is not tabled here, so the code's address is
            // only checked to lie inside `_PyRuntime`.
            "_Py_NewReference" => Some(Guard::TracemallocFlag { within: "_PyRuntime", offset: None }),
            // The same copies as `_Py_NewReference`'s: without debug info
            // they cannot be told apart, and are counted there.
            "_Py_NewReferenceNoTotal" => None,
            _ => super::allocator_guard(symbol),
        }
    }

    fn objects(&self) -> super::ObjectOffsets {
        // Include/object.h and Include/cpython/object.h at v3.12.0: the
        // layout every version here shares (see DEFAULT_BUILD_OBJECTS).
        super::DEFAULT_BUILD_OBJECTS
    }
}

/// The GC markers, and `gc_collect_main` for builds without them: as in
/// 3.11, Modules/gcmodule.c still has `static Py_ssize_t
/// gc_collect_main(PyThreadState *tstate, int generation, Py_ssize_t
/// *n_collected, Py_ssize_t *n_uncollectable, int nofail)` returning `n +
/// m`, the markers' count (checked in the DWARF of pyenv's 3.12.1, which
/// declares it at Modules/gcmodule.c:1194 with those parameters; no 3.12
/// source is in any Debian suite, so its body was checked by what the
/// integration tests count on that build).
pub(super) const GC: super::gc::GcKnowledge = super::v3_11::GC;
