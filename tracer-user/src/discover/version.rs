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
        "cannot tell the Python version of PID {pid}: {image} has neither a Py_Version symbol (3.11+) nor a Py_GetVersion function (before 3.11); is it really CPython? supported: {SUPPORTED}"
    )]
    NoSymbolInProcess { pid: u32, image: String },
    #[error(
        "cannot read the Python version from {path}: it has neither a Py_Version symbol (3.11+) nor a Py_GetVersion function (before 3.11); is it really CPython? supported: {SUPPORTED}"
    )]
    NoSymbolInFile { path: String },
    #[error("{symbol} of PID {pid} is not mapped in its memory; is {image} really its interpreter?")]
    NotMapped { pid: u32, image: String, symbol: &'static str },
    #[error("cannot read {symbol} of PID {pid}: {cause}")]
    Memory { pid: u32, symbol: &'static str, cause: TargetError },
    #[error(
        "cannot tell the Python version of {image}: it has no Py_Version symbol, and {reason}; supported: {SUPPORTED}"
    )]
    NoVersionString { image: String, reason: String },
    #[error(
        "{image} says it is Python {version} (PY_VERSION in Py_GetVersion) but its soname is {soname}; tracer does not guess which is right"
    )]
    SonameMismatch { image: String, version: PythonVersion, soname: String },
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

    /// `len` bytes at the file offset `offset` of the image; `symbol`
    /// names what is read, for errors.
    fn read(&self, offset: u64, len: usize, symbol: &'static str) -> Result<Vec<u8>, VersionReadError> {
        match self {
            Self::Process(t) => {
                let image = t.image_path.display().to_string();
                let address = t.address_of_file_offset(offset).ok_or(VersionReadError::NotMapped {
                    pid: t.pid,
                    image,
                    symbol,
                })?;
                t.read_memory(address, len).map_err(|cause| VersionReadError::Memory { pid: t.pid, symbol, cause })
            }
            Self::File(elf, _) => Ok(elf.read_at(offset, len)?),
        }
    }

    /// The image (and the process), for messages.
    fn image(&self) -> String {
        match self {
            Self::Process(t) => format!("PID {} ({})", t.pid, t.image_path.display()),
            Self::File(_, path) => path.display().to_string(),
        }
    }

    fn missing(&self) -> VersionReadError {
        match self {
            Self::Process(t) => {
                VersionReadError::NoSymbolInProcess { pid: t.pid, image: t.image_path.display().to_string() }
            }
            Self::File(_, path) => VersionReadError::NoSymbolInFile { path: path.display().to_string() },
        }
    }
}

/// Reads `Py_Version` (exported since 3.11, `const unsigned long` in
/// Python/pylifecycle.c), or, in an image without it, the `PY_VERSION`
/// string `Py_GetVersion` formats (see [`read_py_version`]).
pub fn read(source: Source<'_>) -> Result<PythonVersion, VersionReadError> {
    let Some(sym) = source.elf().symbol("Py_Version") else {
        return read_py_version(source);
    };
    // unsigned long on LP64 Linux is 8 bytes; the value fits in the low 4.
    let bytes = source.read(sym.file_offset, 4, "Py_Version")?;
    let word: [u8; 4] = bytes.get(..4).and_then(|b| b.try_into().ok()).ok_or_else(|| source.missing())?;
    Ok(PythonVersion::from_hex(u32::from_le_bytes(word)))
}

/// The most bytes of `Py_GetVersion` decoded: the function is one call of
/// `PyOS_snprintf` (about 60 bytes in pyenv's 3.9.18 and 3.10.13).
const MAX_GET_VERSION: usize = 512;
/// The longest `PY_VERSION` read: `"3.10.13"`, `"3.10.0rc2+"`.
const MAX_PY_VERSION: usize = 24;

/// Before 3.11 there is no `Py_Version`: the version is the `PY_VERSION`
/// string (Include/patchlevel.h, e.g. `"3.10.13"`), which only
/// `Py_GetVersion` uses (Python/getversion.c at v3.9.18 and v3.10.13:
/// `PyOS_snprintf(version, sizeof(version), "%.80s (%.80s) %.80s",
/// PY_VERSION, Py_GetBuildInfo(), Py_GetCompiler())`). Its code loads the
/// string's address with a RIP-relative `lea`; of the strings its `lea`s
/// point to, exactly one must read as a version. It is cross-checked with
/// the image's soname where it has one (`libpython3.10.so.1.0`).
fn read_py_version(source: Source<'_>) -> Result<PythonVersion, VersionReadError> {
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};
    let elf = source.elf();
    let function = elf.function("Py_GetVersion").ok_or_else(|| source.missing())?;
    let image = source.image();
    let no_string = |reason: String| VersionReadError::NoVersionString { image: image.clone(), reason };
    let len = usize::try_from(function.size).unwrap_or(MAX_GET_VERSION).clamp(1, MAX_GET_VERSION);
    let code = source.read(function.file_offset, len, "Py_GetVersion")?;
    let mut decoder = Decoder::with_ip(64, &code, function.address, DecoderOptions::NONE);
    let mut found: Vec<PythonVersion> = Vec::new();
    for instruction in &mut decoder {
        if instruction.mnemonic() == Mnemonic::Ret {
            break;
        }
        if instruction.mnemonic() != Mnemonic::Lea || !instruction.is_ip_rel_memory_operand() {
            continue;
        }
        let Some(offset) = elf.file_offset(instruction.ip_rel_memory_address()) else { continue };
        // A target past the end of the file (`version`'s static buffer,
        // in .bss) reads as nothing.
        let Ok(bytes) = source.read(offset, MAX_PY_VERSION, "PY_VERSION") else { continue };
        if let Some(v) = parse_py_version(&bytes).filter(|v| !found.contains(v)) {
            found.push(v);
        }
    }
    let version = match found.as_slice() {
        [v] => *v,
        [] => return Err(no_string("none of the strings Py_GetVersion loads reads as a version".to_owned())),
        many => {
            let all: Vec<String> = many.iter().map(ToString::to_string).collect();
            return Err(no_string(format!("Py_GetVersion loads several version strings ({})", all.join(", "))));
        }
    };
    if let Some(soname) = soname(elf.path()) {
        let ours = format!("{}.{}", version.major, version.minor);
        if soname_version(&soname).is_some_and(|named| named != ours) {
            return Err(VersionReadError::SonameMismatch { image, version, soname });
        }
    }
    Ok(version)
}

/// The `X.Y` a libpython's soname names (`libpython3.10.so.1.0`,
/// `libpython3.9d.so`): the digits and dots after `libpython`, up to the
/// first character that is neither. `None` for another library's.
fn soname_version(soname: &str) -> Option<&str> {
    let rest = soname.strip_prefix("libpython")?;
    let named = rest.split(|c: char| !c.is_ascii_digit() && c != '.').next()?.trim_end_matches('.');
    (!named.is_empty()).then_some(named)
}

/// `PY_VERSION` in `bytes` (NUL-terminated within them): `M.m.p`, then an
/// optional `a`, `b` or `rc` and its serial, then an optional `+` (a
/// build after that release, Include/patchlevel.h).
fn parse_py_version(bytes: &[u8]) -> Option<PythonVersion> {
    let end = bytes.iter().position(|&b| b == 0)?;
    let text = std::str::from_utf8(bytes.get(..end)?).ok()?;
    let text = text.strip_suffix('+').unwrap_or(text);
    let mut parts = text.splitn(3, '.');
    let number =
        |s: &str| if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) { None } else { s.parse::<u8>().ok() };
    let major = number(parts.next()?)?;
    let minor = number(parts.next()?)?;
    let rest = parts.next()?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let micro = number(rest.get(..digits)?)?;
    let (level, serial) = match rest.get(digits..)? {
        "" => (0xF, 0),
        tail => {
            let (level, serial) = if let Some(s) = tail.strip_prefix("rc") {
                (0xC, s)
            } else if let Some(s) = tail.strip_prefix('a') {
                (0xA, s)
            } else {
                (0xB, tail.strip_prefix('b')?)
            };
            (level, number(serial).filter(|&n| n < 16)?)
        }
    };
    (major == 3).then_some(PythonVersion { major, minor, micro, level, serial })
}

/// The `DT_SONAME` of the ELF file at `path`, if it has one (a shared
/// libpython does, an executable not).
fn soname(path: &Path) -> Option<String> {
    use object::read::elf::{Dyn as _, FileHeader as _};
    let data = std::fs::read(path).ok()?;
    let file = object::read::elf::ElfFile64::<object::Endianness>::parse(&*data).ok()?;
    let endian = file.endian();
    let sections = file.elf_header().sections(endian, &*data).ok()?;
    let (entries, link) = sections.dynamic(endian, &*data).ok()??;
    let strings = sections.strings(endian, &*data, link).ok()?;
    entries
        .iter()
        .find(|d| d.d_tag(endian) == u64::from(object::elf::DT_SONAME))
        .and_then(|d| d.string(endian, strings).ok())
        .map(|s| String::from_utf8_lossy(s).into_owned())
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
    let bytes = match source.read(runtime.file_offset, len, "_Py_DebugOffsets") {
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

    #[test]
    fn sonames_name_their_version() {
        assert_eq!(soname_version("libpython3.10.so.1.0"), Some("3.10"));
        assert_eq!(soname_version("libpython3.9d.so"), Some("3.9"));
        assert_eq!(soname_version("libpython3.so"), Some("3"));
        assert_eq!(soname_version("libc.so.6"), None);
        assert_eq!(soname_version("libpython.so"), None);
    }

    /// pyenv's 3.8.18, 3.9.18 and 3.10.13 have no `Py_Version`: each reads
    /// as the version it is from its `PY_VERSION`; 3.11.7's `Py_Version`
    /// agrees with what its `Py_GetVersion` loads.
    #[test]
    fn pyenv_builds_before_3_11_read_as_their_version() {
        for (version, lib, hex) in [
            ("3.8.18", "libpython3.8.so.1.0", 0x0308_12F0),
            ("3.9.18", "libpython3.9.so.1.0", 0x0309_12F0),
            ("3.10.13", "libpython3.10.so.1.0", 0x030A_0DF0),
            ("3.11.7", "libpython3.11.so.1.0", 0x030B_07F0),
        ] {
            let path = std::path::PathBuf::from(format!("/root/.pyenv/versions/{version}/lib/{lib}"));
            assert!(path.is_file(), "{} is missing: pyenv's {version} is part of this machine kind", path.display());
            let elf = ElfImage::open(&path).expect("an ELF file");
            let source = Source::File(&elf, &path);
            assert_eq!(read(source).expect("a version").hex(), hex, "{version}");
            assert_eq!(read_py_version(source).expect("PY_VERSION").hex(), hex, "{version}");
        }
    }

    #[test]
    fn py_version_strings_parse_as_patchlevel_h_writes_them() {
        let v = |s: &str| parse_py_version(s.as_bytes()).map(PythonVersion::hex);
        assert_eq!(v("3.10.13\0python3.10"), Some(0x030A_0DF0));
        assert_eq!(v("3.9.18\0"), Some(0x0309_12F0));
        assert_eq!(v("3.10.0rc2\0"), Some(0x030A_00C2));
        assert_eq!(v("3.9.0a1+\0"), Some(0x0309_00A1));
        assert_eq!(v("3.9.0b5\0"), Some(0x0309_00B5));
        for bad in
            ["3.10.13", "%.80s (%.80s) %.80s\0", "3.10\0", "3.10.x\0", "3.10.1z\0", "2.7.18\0", "3.10.1rc\0", "\0"]
        {
            assert_eq!(v(bad), None, "{bad:?}");
        }
    }
}
