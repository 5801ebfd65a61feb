//! CPython 3.11.
//!
//! Checked on this project's machines against pyenv's 3.11.7 (shared
//! libpython) and Debian's static LTO 3.11.2. Every probed function is in
//! Objects/object.c and Objects/obmalloc.c at v3.11.0. There is no
//! `_Py_DebugOffsets` before 3.13.

use super::{COMMON, DebugOffsetsHeader, Guard};
use crate::probe::ProbeSpec;

/// The 3.11 ABI.
#[derive(Debug)]
pub struct Abi311;

impl super::Abi for Abi311 {
    fn minor(&self) -> u8 {
        11
    }

    fn probes(&self) -> &'static [ProbeSpec] {
        &COMMON
    }

    fn debug_offsets(&self) -> Option<DebugOffsetsHeader> {
        None
    }

    fn guard(&self, symbol: &str) -> Option<Guard> {
        match symbol {
            // Objects/object.c at v3.11.0: `_Py_NewReference` first tests
            // `_Py_tracemalloc_config.tracing`; Include/internal/pycore_pymem.h
            // at v3.11.0: `struct _PyTraceMalloc_Config { initialized (an
            // enum); int tracing; int max_nframe; }`, so `tracing` is at 4.
            "_Py_NewReference" => Some(Guard::TracemallocFlag { within: "_Py_tracemalloc_config", offset: Some(4) }),
            // No switch guards `_Py_Dealloc` in 3.11 (Objects/object.c).
            _ => super::allocator_guard(symbol),
        }
    }

    fn objects(&self) -> super::ObjectOffsets {
        // Include/object.h and Include/cpython/object.h at v3.11.0: the
        // layout every version here shares (see DEFAULT_BUILD_OBJECTS).
        super::DEFAULT_BUILD_OBJECTS
    }
}

/// The GC markers, and `gc_collect_main` for builds without them: in
/// Modules/gcmodule.c (checked at v3.11.2, Debian's source, and in the
/// DWARF of pyenv's 3.11.7, declared at the same line 1178),
/// `static Py_ssize_t gc_collect_main(PyThreadState *tstate, int
/// generation, Py_ssize_t *n_collected, Py_ssize_t *n_uncollectable, int
/// nofail)` fires `gc__start(generation)` after its debug output,
/// `gc__done(n + m)` just before `return n + m`, and has no other return.
/// Its callers (`gc_collect_with_callback`, which both `gc.collect()` and
/// the automatic collections reach, and `_PyGC_CollectNoFail`) pass the
/// generation they chose and call it only when no collection is running
/// (`gcstate->collecting`), so each call is one collection, as the markers
/// see it.
pub(super) const GC: super::gc::GcKnowledge = super::gc::markers(Some(super::gc::GcFunction {
    symbol: "gc_collect_main",
    generation_register: super::gc::SECOND_ARGUMENT,
    caveat: None,
}));
