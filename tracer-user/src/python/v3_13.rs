//! CPython 3.13.
//!
//! Checked on this project's machines against pyenv's 3.13.0. The probed
//! functions are those of 3.12 (Objects/object.c, Objects/obmalloc.c at
//! v3.13.0). 3.13 is the first version to publish `_Py_DebugOffsets` at the
//! start of `_PyRuntime` (`Include/internal/pycore_runtime.h` at v3.13.0):
//! `char cookie[8]` ("xdebugpy", `_Py_Debug_Cookie`) then `uint64_t version`.

use super::{DebugOffsetsHeader, Guard};
use crate::probe::ProbeSpec;

/// The 3.13 ABI.
#[derive(Debug)]
pub struct Abi313;

impl super::Abi for Abi313 {
    fn minor(&self) -> u8 {
        13
    }

    fn probes(&self) -> &'static [ProbeSpec] {
        &super::v3_12::PROBES
    }

    fn debug_offsets(&self) -> Option<DebugOffsetsHeader> {
        Some(DebugOffsetsHeader { cookie: b"xdebugpy", version_offset: 8 })
    }

    fn guard(&self, symbol: &str) -> Option<Guard> {
        match symbol {
            // Objects/object.c at v3.13.0: `new_reference` calls
            // `_PyRuntime.ref_tracer.tracer_func` with `PyRefTracer_CREATE`
            // when it is set; `_Py_Dealloc` and `_Py_DECREF_SPECIALIZED`
            // (Include/internal/pycore_object.h) with `PyRefTracer_DESTROY`.
            "_Py_NewReference" => Some(Guard::RefTracer),
            // The same copies as `_Py_NewReference`'s: without debug info
            // they cannot be told apart, and are counted there.
            "_Py_NewReferenceNoTotal" => None,
            // Its copies read the tracer too, but so do destructions that
            // never call it (`_Py_DECREF_SPECIALIZED`): not a count of it.
            _ => super::allocator_guard(symbol),
        }
    }

    fn objects(&self) -> super::ObjectOffsets {
        // Include/object.h and Include/cpython/object.h at v3.13.0: the
        // layout every version here shares (see DEFAULT_BUILD_OBJECTS).
        super::DEFAULT_BUILD_OBJECTS
    }
}

/// The GC markers, and `gc_collect_main` for builds without them, with a
/// caveat: in Python/gc.c (checked at v3.13.15, Debian's source, and in the
/// code of pyenv's 3.13.0), `static Py_ssize_t
/// gc_collect_main(PyThreadState *tstate, int generation, _PyGC_Reason
/// reason)` returns 0 at once when a collection is already running (its
/// compare-and-swap of `gcstate->collecting`), and the automatic
/// collections pass `GENERATION_AUTO` (-1): it picks the generation itself
/// (`gc_select_generation`), and returns 0 without collecting when none is
/// due. The markers fire after both; the function's entry cannot tell.
pub(super) const GC: super::gc::GcKnowledge = super::gc::markers(Some(super::gc::GcFunction {
    symbol: "gc_collect_main",
    generation_register: super::gc::SECOND_ARGUMENT,
    caveat: Some(
        "gc_collect_main's entry does not show the generation of automatic collections (they pass GENERATION_AUTO, -1, and it picks one inside, or returns without collecting when none is due), nor that a call made while another collection runs returns at once: such calls are counted under generation null, each as one collection",
    ),
}));
