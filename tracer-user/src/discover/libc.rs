//! Finding a process's C library (`--native`): the file its memory map
//! names libc, reached inside the process's root (a chroot's or a
//! container's libc, not tracer's own), with the allocator's symbols.

use std::path::{Path, PathBuf};

use thiserror::Error;

use super::{
    elf::{ElfError, ElfImage},
    process::{self, MappedFile, Root, TargetError},
};

/// A C library that cannot be probed: the target's doing.
#[derive(Debug, Error)]
pub enum LibcError {
    #[error(transparent)]
    Process(#[from] TargetError),
    #[error(
        "--native: PID {pid} maps no C library (looked in /proc/{pid}/maps for libc.so.6, libc.so or ld-musl among its {files} executable files{names}); a statically linked program's malloc has no file of its own to probe, so drop --native"
    )]
    NotMapped { pid: u32, files: usize, names: String },
    #[error(
        "--native: cannot reach {path}, the C library of PID {pid}, from tracer's root or through /proc/{pid}/root; was it replaced after the process started?"
    )]
    Unreachable { pid: u32, path: PathBuf },
    #[error("--native: the C library of PID {pid} cannot be read: {cause}")]
    Image { pid: u32, cause: ElfError },
    #[error("--native: {path}, the C library of PID {pid}, defines no malloc; tracer knows glibc's and musl's")]
    NoMalloc { pid: u32, path: PathBuf },
}

impl crate::error::Classify for LibcError {
    /// `--native` on a process whose C library tracer cannot probe.
    fn is_bad_input(&self) -> bool {
        true
    }
}

/// A process's C library.
#[derive(Debug)]
pub struct Libc {
    pub elf: ElfImage,
    /// As `/proc/PID/maps` shows it.
    pub display_path: PathBuf,
    /// The same file from tracer's mount namespace.
    pub attach_path: PathBuf,
}

/// Whether `path` names a C library: glibc's `libc.so.6` (or a plain
/// `libc.so`, `libc-2.X.so` of old glibc) or musl's loader, which is its
/// libc.
fn is_libc(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else { return false };
    name == "libc.so.6"
        || name == "libc.so"
        || name.strip_prefix("libc-").is_some_and(|rest| rest.rsplit_once('.').is_some_and(|(_, ext)| ext == "so"))
        || (name.starts_with("ld-musl-") && name.contains(".so"))
}

/// The C library `pid` maps, from its memory map.
pub fn find(pid: u32) -> Result<Libc, LibcError> {
    let files = process::code_files(pid)?;
    pick(pid, &files, Root::Process(pid))
}

/// The C library among `files` (what `pid` maps executable), reached as
/// `root` says.
fn pick(pid: u32, files: &[MappedFile], root: Root) -> Result<Libc, LibcError> {
    let Some(file) = files.iter().find(|f| is_libc(&f.path)) else {
        let names: Vec<String> = files.iter().map(|f| f.path.display().to_string()).collect();
        let names = if names.is_empty() { String::new() } else { format!(": {}", names.join(", ")) };
        return Err(LibcError::NotMapped { pid, files: files.len(), names });
    };
    let attach_path =
        root.reach(&file.path, Some(file.id)).ok_or_else(|| LibcError::Unreachable { pid, path: file.path.clone() })?;
    let elf = ElfImage::open(&attach_path).map_err(|cause| LibcError::Image { pid, cause })?;
    if elf.function("malloc").is_none() {
        return Err(LibcError::NoMalloc { pid, path: file.path.clone() });
    }
    Ok(Libc { elf, display_path: file.path.clone(), attach_path })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for yes in ["/lib/x86_64-linux-gnu/libc.so.6", "/lib/libc-2.31.so", "/lib/ld-musl-x86_64.so.1"] {
            assert!(is_libc(Path::new(yes)), "{yes}");
        }
        for no in ["/usr/lib/libcrypto.so.3", "/lib/libc_malloc_debug.so.0", "/usr/bin/python3.11"] {
            assert!(!is_libc(Path::new(no)), "{no}");
        }
    }

    /// A process without a libc among its files (a static program) is
    /// refused with its PID and the files looked at.
    #[test]
    fn a_static_program_is_refused_by_name() {
        let exe = MappedFile { path: PathBuf::from("/usr/local/bin/static-thing"), id: (1, 2) };
        let err = pick(77, &[exe], Root::Own).expect_err("no libc");
        assert_eq!(
            err.to_string(),
            "--native: PID 77 maps no C library (looked in /proc/77/maps for libc.so.6, libc.so or ld-musl among its 1 executable files: /usr/local/bin/static-thing); a statically linked program's malloc has no file of its own to probe, so drop --native"
        );
    }
}
