//! CPython 3.13.
//!
//! The 3.13.5 build described in shared/TOOLCHAIN.md exports `_Py_NewReference`,
//! `_Py_Dealloc` and the allocator API.

use crate::probes::{DEFAULT_PROBES, ProbeSpec};

/// The 3.13 ABI.
pub struct Abi313;

impl super::Abi for Abi313 {
    fn minor(&self) -> u8 {
        13
    }

    fn probes(&self) -> &'static [ProbeSpec] {
        DEFAULT_PROBES
    }
}
