//! Finding the CPython image behind an executable path, for tracing every
//! process that runs it (`--exe`) without any process to look at.

use std::path::{Path, PathBuf};

use object::read::elf::ElfFile64;
use thiserror::Error;

use super::{
    elf::{ElfError, ElfImage, defines_cpython},
    version::{self, VersionReadError},
};
use crate::python::PythonVersion;

/// An executable that cannot be traced.
#[derive(Debug, Error)]
pub enum ExeError {
    #[error("{path} does not exist; pass the path of a CPython executable (e.g. $(command -v python3))")]
    NotFound { path: PathBuf },
    #[error(
        "{path} is not a CPython executable: it neither defines CPython's symbols nor links a libpython; pass the interpreter itself (e.g. python3.11), not a wrapper script"
    )]
    NotPython { path: PathBuf },
    #[error("{exe} links {lib}, which is in none of {searched}; is the interpreter installed completely?")]
    LibraryNotFound { exe: PathBuf, lib: String, searched: String },
    #[error(transparent)]
    Version(#[from] VersionReadError),
    #[error(transparent)]
    Elf(#[from] ElfError),
}

/// The image that holds an interpreter's code.
#[derive(Debug)]
pub struct Interpreter {
    /// The executable asked for.
    pub exe: PathBuf,
    /// The file with the probed functions: the executable or its libpython.
    pub image: PathBuf,
    pub elf: ElfImage,
    /// Read from the image file's `Py_Version`.
    pub version: PythonVersion,
}

/// Where the loader looks after the executable's RUNPATH/RPATH, without
/// /etc/ld.so.cache (see the design notes: resolve from files, not ld.so).
const DEFAULT_LIB_DIRS: &[&str] = &[
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
    "/usr/local/lib",
];

impl Interpreter {
    /// Resolves `exe` (symlinks followed) to its interpreter image.
    pub fn from_executable(exe: &Path) -> Result<Self, ExeError> {
        let real = resolved(exe).ok_or_else(|| ExeError::NotFound { path: exe.to_owned() })?;
        let data = std::fs::read(&real).map_err(|cause| ExeError::Elf(ElfError::Read { path: real.clone(), cause }))?;
        let elf = ElfImage::parse(&real, &data).map_err(|_| ExeError::NotPython { path: exe.to_owned() })?;
        let image = if defines_cpython(&elf) {
            real.clone()
        } else {
            let lib = needed_libpython(&data).ok_or_else(|| ExeError::NotPython { path: exe.to_owned() })?;
            let dirs = search_dirs(&data, &real);
            let found = dirs.iter().map(|d| d.join(&lib)).find(|p| p.is_file());
            let found = found.ok_or_else(|| ExeError::LibraryNotFound {
                exe: real.clone(),
                lib: lib.clone(),
                searched: dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
            })?;
            std::fs::canonicalize(&found).unwrap_or(found)
        };
        let elf = if image == real { elf } else { ElfImage::open(&image)? };
        let version = version::read(version::Source::File(&elf, &image))?;
        Ok(Self { exe: real, image, elf, version })
    }
}

/// `exe` with its symbolic links resolved, where that names the same file;
/// else `exe` as given. A path through `/proc` (`/proc/PID/root/...` into
/// a container's root, or `/proc/self/fd/N`, an image `--all` holds open)
/// crosses magic links, which the kernel follows to the file itself but
/// whose text names it as seen from another root: resolved as text, such a
/// path would name another file of tracer's own root, or none. `None` where
/// `exe` names no file.
fn resolved(exe: &Path) -> Option<PathBuf> {
    let id = super::process::file_id(exe)?;
    match std::fs::canonicalize(exe) {
        Ok(real) if super::process::file_id(&real) == Some(id) => Some(real),
        _ => Some(exe.to_owned()),
    }
}

/// The `libpython*.so*` among the executable's `DT_NEEDED` entries.
fn needed_libpython(data: &[u8]) -> Option<String> {
    let file = ElfFile64::<object::Endianness>::parse(data).ok()?;
    let libs = dynamic_strings(&file, object::elf::DT_NEEDED);
    libs.into_iter().find(|l| l.starts_with("libpython"))
}

/// RUNPATH (or RPATH) entries with `$ORIGIN` expanded, then the defaults.
fn search_dirs(data: &[u8], exe: &Path) -> Vec<PathBuf> {
    let origin = exe.parent().unwrap_or(Path::new("/"));
    let mut dirs = Vec::new();
    if let Ok(file) = ElfFile64::<object::Endianness>::parse(data) {
        let mut paths = dynamic_strings(&file, object::elf::DT_RUNPATH);
        if paths.is_empty() {
            paths = dynamic_strings(&file, object::elf::DT_RPATH);
        }
        for entry in paths.iter().flat_map(|p| p.split(':')) {
            let expanded = entry.replace("${ORIGIN}", "$ORIGIN").replace("$ORIGIN", &origin.display().to_string());
            dirs.push(PathBuf::from(expanded));
        }
    }
    dirs.extend(DEFAULT_LIB_DIRS.iter().map(PathBuf::from));
    dirs
}

/// The string values of every dynamic entry with tag `tag`.
fn dynamic_strings(file: &ElfFile64<'_, object::Endianness>, tag: u32) -> Vec<String> {
    use object::read::elf::{Dyn as _, FileHeader as _};
    let endian = file.endian();
    let data = file.data();
    let Ok(sections) = file.elf_header().sections(endian, data) else { return Vec::new() };
    let Ok(Some((entries, link))) = sections.dynamic(endian, data) else { return Vec::new() };
    let Ok(strings) = sections.strings(endian, data, link) else { return Vec::new() };
    entries
        .iter()
        .filter(|d| d.d_tag(endian) == u64::from(tag))
        .filter_map(|d| d.string(endian, strings).ok())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_non_python_executables_are_named() {
        let err = Interpreter::from_executable(Path::new("/no/such/python")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/no/such/python does not exist; pass the path of a CPython executable (e.g. $(command -v python3))"
        );
        // The unit-test binary is an ELF that is not Python.
        let me = std::env::current_exe().unwrap();
        let err = Interpreter::from_executable(&me).unwrap_err();
        assert!(matches!(err, ExeError::NotPython { .. }), "{err}");
    }

    /// A file reached through a magic link of /proc whose text does not
    /// name it in this root (here, a file held open and then renamed over:
    /// its link reads `held (deleted)`): the path as given.
    #[test]
    fn a_path_through_a_magic_link_is_kept_where_its_text_names_no_file_here() {
        let dir = std::env::temp_dir().join(format!("tracer-exe-resolved-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (held, other) = (dir.join("held"), dir.join("other"));
        std::fs::write(&held, b"held").unwrap();
        std::fs::write(&other, b"other").unwrap();
        let file = std::fs::File::open(&held).unwrap();
        // The held file's name now names the other one.
        std::fs::rename(&other, &held).unwrap();
        let through = PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file)));
        assert_eq!(resolved(&through), Some(through.clone()));
        assert_eq!(std::fs::read(resolved(&through).unwrap()).unwrap(), b"held");
        // A plain symbolic link resolves.
        let link = dir.join("link");
        std::os::unix::fs::symlink(&held, &link).unwrap();
        assert_eq!(resolved(&link), Some(held.clone()));
        assert_eq!(resolved(&dir.join("none")), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn origin_expands_in_runpath_dirs() {
        // No dynamic section: only the defaults.
        let dirs = search_dirs(b"not elf", Path::new("/opt/py/bin/python3"));
        assert_eq!(dirs.len(), DEFAULT_LIB_DIRS.len());
    }
}
