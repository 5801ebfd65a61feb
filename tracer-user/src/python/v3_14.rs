//! CPython 3.14.
//!
//! Not yet run against a 3.14 build here. The probe names are the public
//! allocator API (Include/pymem.h, Include/objimpl.h) plus `_Py_NewReference` and
//! `_Py_Dealloc`; any this build lacks is reported as missing, not guessed.

use crate::probes::{DEFAULT_PROBES, ProbeSpec};

/// The 3.14 ABI.
pub struct Abi314;

impl super::Abi for Abi314 {
    fn minor(&self) -> u8 {
        14
    }

    fn probes(&self) -> &'static [ProbeSpec] {
        DEFAULT_PROBES
    }
}
