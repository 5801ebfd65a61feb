//! CPython 3.11.
//!
//! Checked on this project's machines against pyenv's 3.11.7 (shared libpython) and Debian's
//! static 3.11.2: both define every default probe symbol.

use crate::probes::{DEFAULT_PROBES, ProbeSpec};

/// The 3.11 ABI.
pub struct Abi311;

impl super::Abi for Abi311 {
    fn minor(&self) -> u8 {
        11
    }

    fn probes(&self) -> &'static [ProbeSpec] {
        DEFAULT_PROBES
    }
}
