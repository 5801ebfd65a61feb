//! Reading the interpreter's version from the interpreter itself: one
//! reader for a live process (its memory) and for an image file.

use std::path::Path;

use thiserror::Error;

use super::{
    elf::{ElfError, ElfImage},
    process::{Target, TargetError},
};
use crate::python::{Abi, PythonVersion, SUPPORTED};

/// Why the version could not be read.
#[derive(Debug, Error)]
pub enum VersionReadError {
    #[error(
        "cannot tell the Python version of PID {pid}: {image} has no Py_Version symbol (CPython before 3.11?); supported: {SUPPORTED}"
    )]
    NoSymbolInProcess { pid: u32, image: String },
    #[error(
        "cannot read the Python version from {path}: it has no Py_Version symbol (CPython before 3.11?); supported: {SUPPORTED}"
    )]
    NoSymbolInFile { path: String },
    #[error("Py_Version of PID {pid} is not mapped in its memory; is {image} really its interpreter?")]
    NotMapped { pid: u32, image: String },
    #[error("cannot read Py_Version of PID {pid}: {cause}")]
    Memory { pid: u32, cause: TargetError },
    #[error(transparent)]
    File(#[from] ElfError),
}

/// Where the bytes come from.
#[derive(Clone, Copy)]
pub enum Source<'a> {
    /// The running process: its answer, not a guess from a file name.
    Process(&'a Target),
    /// The image file, for `--exe` (no process to look at).
    File(&'a ElfImage, &'a Path),
}

impl Source<'_> {
    fn elf(&self) -> &ElfImage {
        match self {
            Self::Process(t) => &t.elf,
            Self::File(elf, _) => elf,
        }
    }

    /// `len` bytes at the file offset `offset` of the image.
    fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, VersionReadError> {
        match self {
            Self::Process(t) => {
                let image = t.image_path.display().to_string();
                let address =
                    t.address_of_file_offset(offset).ok_or(VersionReadError::NotMapped { pid: t.pid, image })?;
                t.read_memory(address, len).map_err(|cause| VersionReadError::Memory { pid: t.pid, cause })
            }
            Self::File(elf, _) => Ok(elf.read_at(offset, len)?),
        }
    }
}

/// Reads `Py_Version` (exported since 3.11, `const unsigned long` in
/// Python/pylifecycle.c).
pub fn read(source: Source<'_>) -> Result<PythonVersion, VersionReadError> {
    let sym = source.elf().symbol("Py_Version").ok_or_else(|| match source {
        Source::Process(t) => {
            VersionReadError::NoSymbolInProcess { pid: t.pid, image: t.image_path.display().to_string() }
        }
        Source::File(_, path) => VersionReadError::NoSymbolInFile { path: path.display().to_string() },
    })?;
    // unsigned long on LP64 Linux is 8 bytes; the value fits in the low 4.
    let bytes = source.read(sym.file_offset, 4)?;
    let hex = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    Ok(PythonVersion::from_hex(hex))
}

/// Cross-checks what the interpreter publishes in `_Py_DebugOffsets`
/// (3.13+) against the version module's header and `Py_Version`. Returns
/// why they disagree, or `None` when they agree or the version publishes
/// nothing.
#[must_use]
pub fn check_debug_offsets(source: Source<'_>, abi: &dyn Abi, version: PythonVersion) -> Option<String> {
    let header = abi.debug_offsets()?;
    let Some(runtime) = source.elf().symbol("_PyRuntime") else {
        return Some("it has no _PyRuntime symbol to read _Py_DebugOffsets from".to_owned());
    };
    let len = usize::try_from(header.version_offset).unwrap_or(usize::MAX).saturating_add(8);
    let bytes = match source.read(runtime.file_offset, len) {
        Ok(bytes) => bytes,
        Err(e) => return Some(format!("_Py_DebugOffsets cannot be read ({e})")),
    };
    if bytes.get(..8) != Some(&header.cookie[..]) {
        return Some(format!(
            "_PyRuntime does not start with the _Py_DebugOffsets cookie {:?}",
            String::from_utf8_lossy(header.cookie)
        ));
    }
    let at = usize::try_from(header.version_offset).unwrap_or(usize::MAX);
    let mut word = [0u8; 8];
    word.copy_from_slice(bytes.get(at..at + 8)?);
    let published = u64::from_le_bytes(word);
    let expected = u64::from(version_hex(version));
    (published != expected)
        .then(|| format!("_Py_DebugOffsets says version {published:#x}, but Py_Version says {expected:#x}"))
}

const fn version_hex(v: PythonVersion) -> u32 {
    u32::from_be_bytes([v.major, v.minor, v.micro, v.level << 4 | v.serial])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_hex_inverts_from_hex() {
        for hex in [0x030B_07F0, 0x030E_00A2, 0x030D_00C1] {
            assert_eq!(version_hex(PythonVersion::from_hex(hex)), hex);
        }
    }
}
