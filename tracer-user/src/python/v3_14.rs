//! CPython 3.14.
//!
//! The probed functions are those of 3.13 (Objects/object.c,
//! Objects/obmalloc.c at v3.14.0); any a build lacks is reported as
//! missing, not guessed. `_Py_DebugOffsets` keeps its 3.13 header
//! (`Include/internal/pycore_debug_offsets.h` at v3.14.0): the cookie, then
//! `uint64_t version`.

use super::{DebugOffsetsHeader, Guard};
use crate::probe::ProbeSpec;

/// The 3.14 ABI.
#[derive(Debug)]
pub struct Abi314;

impl super::Abi for Abi314 {
    fn minor(&self) -> u8 {
        14
    }

    fn probes(&self) -> &'static [ProbeSpec] {
        &super::v3_12::PROBES
    }

    fn debug_offsets(&self) -> Option<DebugOffsetsHeader> {
        Some(DebugOffsetsHeader { cookie: b"xdebugpy", version_offset: 8 })
    }

    fn guard(&self, symbol: &str) -> Option<Guard> {
        // As in 3.13 (Objects/object.c at v3.14.0).
        super::Abi::guard(&super::v3_13::Abi313, symbol)
    }

    fn objects(&self) -> super::ObjectOffsets {
        // Include/object.h and Include/cpython/object.h at v3.14.0: the
        // layout every version here shares (see DEFAULT_BUILD_OBJECTS).
        super::DEFAULT_BUILD_OBJECTS
    }
}

/// The GC markers only. Debian's 3.14.8 has them (its notes), in
/// `gc_collect_main` (its DWARF), but no 3.14 source was at hand to check
/// what that function's entry and return mean (Python/gc.c changed for the
/// incremental collector, and main has since moved the markers to
/// `_PyGC_Collect`), so a 3.14 build without markers is reported as such.
pub(super) const GC: super::gc::GcKnowledge = super::gc::markers(None);
