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
