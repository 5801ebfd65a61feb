//! CPython 3.11.
//!
//! Checked on this project's machines against pyenv's 3.11.7 (shared
//! libpython) and Debian's static LTO 3.11.2. Every probed function is in
//! Objects/object.c and Objects/obmalloc.c at v3.11.0. There is no
//! `_Py_DebugOffsets` before 3.13.

use super::{COMMON, DebugOffsetsHeader};
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
}
