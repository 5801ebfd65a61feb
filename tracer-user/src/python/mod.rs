//! What tracer knows about each CPython minor version.
//!
//! One module per minor version implements [`Abi`]; [`abi_for`] is an
//! exhaustive match that refuses versions nobody has checked, rather than
//! guessing that a new CPython looks like the last one.

mod v3_11;
mod v3_12;
mod v3_13;
mod v3_14;

use std::fmt;

use thiserror::Error;

use crate::{
    probes::ProbeSpec,
    process::{Target, TargetError},
};

/// A version that tracer cannot trace, or cannot determine.
#[derive(Debug, Error)]
pub enum VersionError {
    #[error("PID {pid} runs Python {version}, which tracer does not support; supported: {SUPPORTED}")]
    Unsupported { pid: u32, version: PythonVersion },
    #[error("{image} is Python {version}, which tracer does not support; supported: {SUPPORTED}")]
    UnsupportedImage { image: String, version: PythonVersion },
    #[error(
        "cannot tell the Python version of PID {pid}: {image} has no Py_Version symbol (CPython before 3.11?); supported: {SUPPORTED}"
    )]
    NoVersionSymbol { pid: u32, image: String },
    #[error("Py_Version of PID {pid} is not mapped in its memory; is {image} really its interpreter?")]
    NotMapped { pid: u32, image: String },
    #[error("cannot read Py_Version of PID {pid}: {cause}")]
    Read { pid: u32, cause: TargetError },
}

/// Symbols only a CPython interpreter defines (an extension module imports
/// them, leaving them undefined, which `ElfImage` skips).
const CPYTHON_MARKERS: [&str; 3] = ["Py_Initialize", "_PyRuntime", "Py_Version"];

/// Whether `elf` is a CPython interpreter image (an executable or libpython
/// that defines the interpreter, not one that merely links it).
#[must_use]
pub fn defines_cpython(elf: &crate::elf::ElfImage) -> bool {
    CPYTHON_MARKERS.iter().any(|m| elf.symbol(m).is_some())
}

/// Minor versions with an [`Abi`] module.
pub const SUPPORTED: &str = "3.11, 3.12, 3.13, 3.14";

/// A CPython version, decoded from `PY_VERSION_HEX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PythonVersion {
    pub major: u8,
    pub minor: u8,
    pub micro: u8,
    /// 0xA alpha, 0xB beta, 0xC release candidate, 0xF final.
    pub level: u8,
    pub serial: u8,
}

impl PythonVersion {
    /// Decodes `PY_VERSION_HEX` (Include/patchlevel.h):
    /// major << 24 | minor << 16 | micro << 8 | level << 4 | serial.
    #[must_use]
    pub const fn from_hex(hex: u32) -> Self {
        let [major, minor, micro, low] = hex.to_be_bytes();
        Self { major, minor, micro, level: low >> 4, serial: low & 0xf }
    }
}

impl fmt::Display for PythonVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.micro)?;
        match self.level {
            0xA => write!(f, "a{}", self.serial),
            0xB => write!(f, "b{}", self.serial),
            0xC => write!(f, "rc{}", self.serial),
            _ => Ok(()),
        }
    }
}

/// Per-version knowledge.
pub trait Abi: Sync {
    /// The minor version this module describes.
    fn minor(&self) -> u8;
    /// The functions to probe, in report order.
    fn probes(&self) -> &'static [ProbeSpec];
}

/// The [`Abi`] for `version`, or an error for versions nobody has checked.
pub fn abi_for(pid: u32, version: PythonVersion) -> Result<&'static dyn Abi, VersionError> {
    match (version.major, version.minor) {
        (3, 11) => Ok(&v3_11::Abi311),
        (3, 12) => Ok(&v3_12::Abi312),
        (3, 13) => Ok(&v3_13::Abi313),
        (3, 14) => Ok(&v3_14::Abi314),
        _ => Err(VersionError::Unsupported { pid, version }),
    }
}

/// [`abi_for`] for an image file rather than a process.
pub fn abi_for_image(image: &std::path::Path, version: PythonVersion) -> Result<&'static dyn Abi, VersionError> {
    abi_for(0, version).map_err(|_| VersionError::UnsupportedImage { image: image.display().to_string(), version })
}

/// Reads `Py_Version` (exported since 3.11, `const unsigned long` in
/// Python/pylifecycle.c) out of the target's memory, so the answer is the
/// running interpreter's, not a guess from a file name.
pub fn read_version(target: &Target) -> Result<PythonVersion, VersionError> {
    let pid = target.pid;
    let image = || target.image_path.display().to_string();
    let sym = target.elf.symbol("Py_Version").ok_or_else(|| VersionError::NoVersionSymbol { pid, image: image() })?;
    let address = target
        .address_of_file_offset(sym.file_offset)
        .ok_or_else(|| VersionError::NotMapped { pid, image: image() })?;
    // unsigned long on LP64 Linux is 8 bytes; the value fits in the low 4.
    let bytes = target.read_memory(address, 8).map_err(|cause| VersionError::Read { pid, cause })?;
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes);
    let hex = u32::try_from(u64::from_le_bytes(word)).unwrap_or(u32::MAX);
    Ok(PythonVersion::from_hex(hex))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_version_hex() {
        let v = PythonVersion::from_hex(0x030B_07F0);
        assert_eq!((v.major, v.minor, v.micro), (3, 11, 7));
        assert_eq!(v.to_string(), "3.11.7");
        assert_eq!(PythonVersion::from_hex(0x030E_00A2).to_string(), "3.14.0a2");
        assert_eq!(PythonVersion::from_hex(0x030D_00C1).to_string(), "3.13.0rc1");
    }

    #[test]
    fn dispatch_is_exact() {
        for minor in [11, 12, 13, 14] {
            let v = PythonVersion { major: 3, minor, micro: 0, level: 0xF, serial: 0 };
            assert_eq!(abi_for(1, v).unwrap().minor(), minor);
        }
        for (major, minor) in [(3, 10), (3, 15), (2, 7), (4, 0)] {
            let v = PythonVersion { major, minor, micro: 0, level: 0xF, serial: 0 };
            let err = abi_for(9, v).err().expect("unknown versions are refused");
            assert_eq!(
                err.to_string(),
                format!("PID 9 runs Python {major}.{minor}.0, which tracer does not support; supported: {SUPPORTED}")
            );
        }
    }
}
