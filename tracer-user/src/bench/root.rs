//! `tracer bench --root DIR`: the interpreter chrooted in a distribution's
//! root. Its commands run under chroot(8), what they read and write is in
//! a work directory of the bench's own inside the root, and paths cross
//! between the host's view and the root's here.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::Command,
    time::{SystemTime, UNIX_EPOCH},
};

use super::BenchError;

/// Where the helper and the pyperf files are written (a host path): the
/// output directory, or one of the bench's own inside the root, removed
/// with it so that nothing is left there.
pub struct WorkDir {
    pub path: PathBuf,
    ours: bool,
}

impl WorkDir {
    /// The output directory itself.
    pub fn output(out_dir: &Path) -> Self {
        Self { path: out_dir.to_owned(), ours: false }
    }

    /// A new directory in `root`'s /tmp, named for this tracer (PID and
    /// start time), after removing those of tracers no longer running (an
    /// interrupted bench's).
    pub fn in_root(root: &Path) -> Result<Self, BenchError> {
        let tmp = root.join("tmp");
        let bad = |cause| BenchError::Root { path: tmp.clone(), cause };
        // A link would name one place on the host and another in the root.
        let meta = tmp.symlink_metadata().map_err(bad)?;
        if !meta.is_dir() {
            return Err(bad(std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory")));
        }
        for entry in std::fs::read_dir(&tmp).map_err(bad)?.flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)?.split('.').next()?.parse::<u32>().ok())
            else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let stamp = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let path = tmp.join(format!("{PREFIX}{}.{stamp}", std::process::id()));
        std::fs::create_dir(&path).map_err(|cause| BenchError::Root { path: path.clone(), cause })?;
        Ok(Self { path, ours: true })
    }
}

/// How a bench's work directory in a root is named: `tracer-bench.PID.NANOS`.
pub const PREFIX: &str = "tracer-bench.";

impl Drop for WorkDir {
    fn drop(&mut self) {
        if self.ours {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// `root` as given (a directory), made absolute.
pub fn resolve(root: &Path) -> Result<PathBuf, BenchError> {
    let dir = root.canonicalize().map_err(|cause| BenchError::Root { path: root.to_owned(), cause })?;
    if !dir.is_dir() {
        let cause = std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory");
        return Err(BenchError::Root { path: root.to_owned(), cause });
    }
    Ok(dir)
}

/// `python`, a path inside `root`, is there (a venv's interpreter is a
/// link that only the root resolves: the link itself is looked at).
pub fn check_python(root: &Path, python: &Path) -> Result<(), BenchError> {
    if python.is_absolute() && host_of(Some(root), python).symlink_metadata().is_ok() {
        return Ok(());
    }
    Err(BenchError::NotInRoot { python: python.to_owned(), root: root.to_owned() })
}

/// A command running `program`, a path inside `root` where there is one,
/// under chroot(8) there, with a /proc of its own mount namespace (pyperf
/// reads it) showing the host's processes; unshare(1) and chroot(8) exec
/// it, so it has the PID the command was given.
pub fn chrooted(root: Option<&Path>, program: &Path) -> Command {
    match root {
        Some(root) => {
            let mut proc = OsString::from("--mount-proc=");
            proc.push(root.join("proc"));
            let mut c = Command::new("/usr/bin/unshare");
            c.arg(proc).arg("/usr/sbin/chroot").arg(root).arg(program);
            c
        }
        None => Command::new(program),
    }
}

/// A host path, inside `root` where there is one, as a process chrooted
/// there sees it.
pub fn seen_in(root: Option<&Path>, host: &Path) -> PathBuf {
    match root {
        Some(root) => {
            debug_assert!(host.starts_with(root), "{} is outside {}", host.display(), root.display());
            Path::new("/").join(host.strip_prefix(root).unwrap_or(host))
        }
        None => host.to_owned(),
    }
}

/// A path a process chrooted in `root` gave, as the host sees it.
pub fn host_of(root: Option<&Path>, seen: &Path) -> PathBuf {
    match root {
        Some(root) => root.join(seen.strip_prefix("/").unwrap_or(seen)),
        None => seen.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_cross_between_the_host_and_the_root() {
        let root = Path::new("/var/lib/r");
        assert_eq!(seen_in(Some(root), Path::new("/var/lib/r/tmp/x.json")), Path::new("/tmp/x.json"));
        assert_eq!(host_of(Some(root), Path::new("/usr/bin/python3.13")), Path::new("/var/lib/r/usr/bin/python3.13"));
        assert_eq!(seen_in(None, Path::new("/a/b")), Path::new("/a/b"));
        assert_eq!(host_of(None, Path::new("/a/b")), Path::new("/a/b"));
    }
}
