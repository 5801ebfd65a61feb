//! Output files (`--folded`, `--flamegraph`): checked before anything is
//! attached, and created without following a symlink, never overwriting a
//! file unless `--force` says so.

use std::{
    fs::{File, OpenOptions},
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
};

use thiserror::Error;

/// Why an output file cannot be written.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum OutputError {
    #[error("{flag} {path} is a symbolic link, which tracer does not write through; pass the path of a regular file")]
    Symlink { flag: &'static str, path: PathBuf },
    #[error("{flag} {path} exists; pass --force to overwrite it, or another path")]
    Exists { flag: &'static str, path: PathBuf },
    #[error("{flag} {path} is a directory; pass the path of a file in it")]
    Directory { flag: &'static str, path: PathBuf },
    #[error("{flag} {path}: cannot write in {dir} ({cause}); pass a path in a directory you can write")]
    Unwritable { flag: &'static str, path: PathBuf, dir: PathBuf, cause: String },
    #[error("cannot create {flag} {path}: {cause}")]
    Create { flag: &'static str, path: PathBuf, cause: String },
}

/// A file that could not be written when the output came: the system's
/// (the check before the run is the configuration's, and the user's).
impl crate::error::Classify for OutputError {
    fn is_bad_input(&self) -> bool {
        false
    }
}

/// An output file to write at the end of the run, checked now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputFile {
    pub flag: &'static str,
    pub path: PathBuf,
    pub force: bool,
}

impl OutputFile {
    /// Checks that `path` (the value of `flag`) can be created: not a
    /// symlink, not a directory, not an existing file unless `force`, in a
    /// directory tracer can write.
    pub fn check(flag: &'static str, path: &Path, force: bool) -> Result<Self, OutputError> {
        let path = path.to_owned();
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => return Err(OutputError::Symlink { flag, path }),
            Ok(m) if m.is_dir() => return Err(OutputError::Directory { flag, path }),
            Ok(_) if !force => return Err(OutputError::Exists { flag, path }),
            _ => {}
        }
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        };
        let c_dir = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).map_err(|e| {
            OutputError::Unwritable { flag, path: path.clone(), dir: dir.clone(), cause: e.to_string() }
        })?;
        // SAFETY: c_dir is a valid NUL-terminated string that outlives the
        // call; access reads it and nothing else.
        if unsafe { libc::access(c_dir.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
            let cause = std::io::Error::last_os_error().to_string();
            return Err(OutputError::Unwritable { flag, path, dir, cause });
        }
        Ok(Self { flag, path, force })
    }

    /// Creates the file: never through a symlink (`O_NOFOLLOW`), and with
    /// `O_EXCL` unless `--force`, so that a file made since the check is
    /// not overwritten either.
    pub fn create(&self) -> Result<File, OutputError> {
        let mut options = OpenOptions::new();
        options.write(true).custom_flags(libc::O_NOFOLLOW).mode(0o644);
        if self.force {
            options.create(true).truncate(true);
        } else {
            options.create_new(true);
        }
        options.open(&self.path).map_err(|e| OutputError::Create {
            flag: self.flag,
            path: self.path.clone(),
            cause: e.to_string(),
        })
    }
}

/// A file made at its first write, line-buffered: a record (`--record`)
/// of a run that failed before its first event leaves no file behind.
pub struct LazyFile {
    file: OutputFile,
    open: Option<std::io::LineWriter<File>>,
}

impl LazyFile {
    #[must_use]
    pub const fn new(file: OutputFile) -> Self {
        Self { file, open: None }
    }

    fn writer(&mut self) -> std::io::Result<&mut std::io::LineWriter<File>> {
        if self.open.is_none() {
            let file = self.file.create().map_err(std::io::Error::other)?;
            self.open = Some(std::io::LineWriter::new(file));
        }
        self.open.as_mut().ok_or_else(|| std::io::Error::other("not open"))
    }
}

impl LazyFile {
    /// `cause` with the flag and path it came from: a record that cannot
    /// be written (a full disk) is an error of its own, named.
    fn named(&self, cause: &std::io::Error) -> std::io::Error {
        std::io::Error::new(cause.kind(), format!("writing {} {}: {cause}", self.file.flag, self.file.path.display()))
    }
}

impl std::io::Write for LazyFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.writer()?.write(buf) {
            Err(e) => Err(self.named(&e)),
            ok => ok,
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self.open.as_mut().map_or(Ok(()), std::io::Write::flush) {
            Err(e) => Err(self.named(&e)),
            ok => ok,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_symlinks_existing_files_and_directories() {
        let dir = std::env::temp_dir().join(format!("tracer-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("out.folded");
        let link = dir.join("link.folded");
        std::fs::write(&file, "x").unwrap();
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(
            OutputFile::check("--folded", &file, false),
            Err(OutputError::Exists { flag: "--folded", path: file.clone() })
        );
        assert!(OutputFile::check("--folded", &file, true).is_ok());
        assert_eq!(
            OutputFile::check("--folded", &link, true),
            Err(OutputError::Symlink { flag: "--folded", path: link.clone() })
        );
        assert_eq!(
            OutputFile::check("--folded", &dir, true),
            Err(OutputError::Directory { flag: "--folded", path: dir.clone() })
        );
        let fresh = OutputFile::check("--folded", &dir.join("new.folded"), false).unwrap();
        fresh.create().unwrap();
        // Made since the check: not overwritten without --force.
        assert!(fresh.create().is_err());
        let err = OutputFile::check("--folded", Path::new("/nonexistent-dir/x.folded"), false).unwrap_err();
        assert!(
            err.to_string().starts_with("--folded /nonexistent-dir/x.folded: cannot write in /nonexistent-dir"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
