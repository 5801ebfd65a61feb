//! Finding the DWARF of an interpreter image. LTO builds inline the probed
//! functions into their callers, and only DWARF says where those copies
//! are; distributions strip it into a separate file. This module finds that
//! file the way GDB does (own sections, build-id, `.gnu_debuglink`, then a
//! directory the user names) and checks that it belongs to the image, so
//! that a stale, foreign or corrupt debug file is never used: it is passed
//! over for the next place, and it is the error when no place has the
//! image's, rather than wrong probes or a silent partial count.
//!
//! Every path but the user's `--debug-dir` is looked up inside the target's
//! root (`/` or `/proc/PID/root`), where a container keeps its own debug
//! files.

use std::{
    ffi::OsString,
    fmt::Write as _,
    path::{Component, Path, PathBuf},
};

use object::{Object as _, ObjectSection as _};
use thiserror::Error;

/// Where debug files are installed (GDB's `debug-file-directory`).
const SYSTEM_DEBUG_DIR: &str = "/usr/lib/debug";

/// More symbolic links than this on one path is a loop.
const MAX_LINKS: u32 = 40;

/// What to do about a debug file that is not the image's: every message
/// about one ends with it.
pub(crate) const BAD_FILE_FIX: &str =
    "replace it with this build's debug file or remove it, or pass --no-inlined to probe without inlined copies";

/// A debug file that should hold the image's DWARF but cannot be used:
/// always worth telling the user, since probes without it miss calls.
#[derive(Debug, Error)]
pub enum DebugInfoError {
    #[error("--debug-dir {path}: {cause}; give a directory that exists")]
    DebugDir { path: PathBuf, cause: std::io::Error },
    #[error("cannot read {path}: {cause}")]
    Read { path: PathBuf, cause: std::io::Error },
    #[error("{path}, the interpreter image, is not a readable ELF file: {cause}")]
    Image { path: PathBuf, cause: object::Error },
    #[error("cannot read the debug file {path}: {cause}; {BAD_FILE_FIX}")]
    Unreadable { path: PathBuf, cause: std::io::Error },
    #[error("{path} is not a readable ELF file (truncated or corrupt?): {cause}; {BAD_FILE_FIX}")]
    Parse { path: PathBuf, cause: object::Error },
    #[error(
        "{path} has build-id {found}, but {image} has build-id {expected}: the debug file is for another build; {BAD_FILE_FIX}"
    )]
    BuildIdMismatch { path: PathBuf, found: String, image: PathBuf, expected: String },
    #[error(
        "{path} has CRC32 {found:08x}, but {image}'s .gnu_debuglink records {expected:08x}: the debug file is for another build; {BAD_FILE_FIX}"
    )]
    CrcMismatch { path: PathBuf, found: u32, image: PathBuf, expected: u32 },
    #[error(
        "{path} has no usable .debug_info (stripped, or its section data lies past the end of the file); {BAD_FILE_FIX}"
    )]
    NoDwarf { path: PathBuf },
}

/// How the DWARF was found, which also tells how much to trust it: a file
/// found by build-id is the image's by construction, one found by name has
/// only a CRC to show for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The image's own `.debug_info`.
    Own,
    /// `/usr/lib/debug/.build-id/xx/rest.debug` under the target's root.
    BuildId,
    /// A `.gnu_debuglink` name in one of the standard places.
    DebugLink,
    /// The user's `--debug-dir`, by build-id or debuglink name.
    DebugDir,
}

/// The file holding an image's DWARF.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DwarfFile {
    pub origin: Origin,
    /// The file from tracer's mount namespace (the image itself with
    /// [`Origin::Own`]).
    pub path: PathBuf,
}

/// Finds the DWARF of `image` (its path as the target sees it) inside
/// `root`, then in `debug_dir` (a path of tracer's own). `Ok(None)` means
/// that no DWARF is reachable, which is common and not an error; a file
/// that is there but not the image's is the error only when no other place
/// has the image's. `readable`, where given, is where the image's own bytes
/// are read.
pub fn locate(
    image: &Path,
    root: &Path,
    debug_dir: Option<&Path>,
    readable: Option<&Path>,
) -> Result<Option<DwarfFile>, DebugInfoError> {
    // Checked first, so that a mistyped --debug-dir is reported even when
    // the DWARF is found elsewhere.
    if let Some(dir) = debug_dir {
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                let cause = std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory");
                return Err(DebugInfoError::DebugDir { path: dir.to_owned(), cause });
            }
            Err(cause) => return Err(DebugInfoError::DebugDir { path: dir.to_owned(), cause }),
        }
    }
    let (real, host) = in_root(root, image);
    // The image itself may be reachable only another way (a deleted file,
    // through /proc/PID/map_files).
    let host = readable.map_or(host, Path::to_owned);
    let data = std::fs::read(&host).map_err(|cause| DebugInfoError::Read { path: host.clone(), cause })?;
    let file = object::File::parse(&*data).map_err(|cause| DebugInfoError::Image { path: host.clone(), cause })?;
    if has_dwarf(&file) {
        return Ok(Some(DwarfFile { origin: Origin::Own, path: host }));
    }
    let expect = Expected {
        image: host.clone(),
        build_id: file.build_id().ok().flatten().map(<[u8]>::to_vec),
        link: file.gnu_debuglink().ok().flatten().map(|(name, crc)| (PathBuf::from(bytes_to_os(name)), crc)),
    };
    // Every place, in GDB's order: the standard build-id path, the
    // debuglink name beside the image, in .debug/ beside it and under the
    // debug directory at the image's own directory, then --debug-dir by
    // build-id and by name. All but --debug-dir are inside the root.
    let by_id = expect.build_id.as_deref().filter(|id| id.len() >= 2).map(build_id_path);
    let mut candidates: Vec<(PathBuf, Origin, bool)> = Vec::new();
    if let Some(rel) = &by_id {
        candidates.push((in_root(root, &Path::new(SYSTEM_DEBUG_DIR).join(rel)).1, Origin::BuildId, false));
    }
    if let Some((name, _)) = &expect.link {
        let dir = real.parent().unwrap_or(Path::new("/"));
        let mirrored = Path::new(SYSTEM_DEBUG_DIR).join(dir.strip_prefix("/").unwrap_or(dir));
        for candidate in [dir.join(name), dir.join(".debug").join(name), mirrored.join(name)] {
            candidates.push((in_root(root, &candidate).1, Origin::DebugLink, true));
        }
    }
    if let Some(dir) = debug_dir {
        candidates.extend(by_id.map(|rel| (dir.join(rel), Origin::DebugDir, false)));
        candidates.extend(expect.link.as_ref().map(|(name, _)| (dir.join(name), Origin::DebugDir, true)));
    }
    // A file that is there but is not the image's (stale, foreign,
    // truncated) is passed over, as GDB does, so that it cannot hide the
    // right one further on (a stale file in a standard place, the good one
    // in --debug-dir). Only when no place has the image's file is the first
    // such file the error, naming it: probing without DWARF would miss
    // calls, and whether to is the user's choice (--no-inlined).
    let mut rejected = None;
    for (candidate, origin, by_name) in candidates {
        match expect.check(&candidate, by_name) {
            Ok(Some(path)) => return Ok(Some(DwarfFile { origin, path })),
            Ok(None) => {}
            Err(e) => {
                rejected.get_or_insert(e);
            }
        }
    }
    rejected.map_or(Ok(None), Err)
}

/// What a debug file must match to be the image's.
struct Expected {
    image: PathBuf,
    build_id: Option<Vec<u8>>,
    /// The `.gnu_debuglink` name and CRC32.
    link: Option<(PathBuf, u32)>,
}

impl Expected {
    /// `Ok(Some(path))` when `path` is the image's debug file, `Ok(None)`
    /// when there is no file there. With `by_name`, the file was found by
    /// its debuglink name and must also have the recorded CRC32.
    fn check(&self, path: &Path, by_name: bool) -> Result<Option<PathBuf>, DebugInfoError> {
        let data = match std::fs::read(path) {
            Ok(data) => data,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory) => {
                return Ok(None);
            }
            Err(cause) => return Err(DebugInfoError::Unreadable { path: path.to_owned(), cause }),
        };
        let file =
            object::File::parse(&*data).map_err(|cause| DebugInfoError::Parse { path: path.to_owned(), cause })?;
        if let Some(expected) = &self.build_id {
            let found = file.build_id().ok().flatten();
            if found != Some(expected.as_slice()) {
                return Err(DebugInfoError::BuildIdMismatch {
                    path: path.to_owned(),
                    found: found.map_or_else(|| "none".to_owned(), hex),
                    image: self.image.clone(),
                    expected: hex(expected),
                });
            }
        }
        if by_name && let Some((_, expected)) = self.link {
            let found = crc32fast::hash(&data);
            if found != expected {
                return Err(DebugInfoError::CrcMismatch {
                    path: path.to_owned(),
                    found,
                    image: self.image.clone(),
                    expected,
                });
            }
        }
        if !has_dwarf(&file) {
            return Err(DebugInfoError::NoDwarf { path: path.to_owned() });
        }
        Ok(Some(path.to_owned()))
    }
}

/// Whether `file` has a non-empty `.debug_info` whose bytes are all in the
/// file (decompressing it is left to whoever reads it).
fn has_dwarf(file: &object::File<'_>) -> bool {
    file.section_by_name(".debug_info").is_some_and(|s| {
        s.kind() != object::SectionKind::UninitializedData && s.compressed_data().is_ok_and(|d| !d.data.is_empty())
    })
}

/// `.build-id/xx/rest.debug` for a build-id of at least two bytes.
fn build_id_path(id: &[u8]) -> PathBuf {
    Path::new(".build-id").join(hex(&id[..1])).join(format!("{}.debug", hex(&id[1..])))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn bytes_to_os(bytes: &[u8]) -> OsString {
    use std::os::unix::ffi::OsStrExt as _;
    std::ffi::OsStr::from_bytes(bytes).to_owned()
}

/// `path` (absolute, as the target sees it) resolved inside `root`: its
/// symbolic links, absolute ones included, are followed as the target would
/// follow them, not as `/proc/PID/root/...` would (against tracer's root).
/// Returns the resolved path as the target sees it and the host path that
/// reaches it.
fn in_root(root: &Path, path: &Path) -> (PathBuf, PathBuf) {
    let mut done = PathBuf::from("/");
    let mut todo: Vec<OsString> = path.components().rev().map(|c| c.as_os_str().to_owned()).collect();
    let mut links = 0;
    while let Some(part) = todo.pop() {
        match Path::new(&part).components().next() {
            Some(Component::Normal(_)) => {}
            Some(Component::ParentDir) => {
                done.pop();
                continue;
            }
            _ => continue,
        }
        let next = done.join(&part);
        let host = root.join(next.strip_prefix("/").unwrap_or(&next));
        match std::fs::read_link(&host) {
            Ok(target) if links < MAX_LINKS => {
                links += 1;
                if target.is_absolute() {
                    done = PathBuf::from("/");
                }
                todo.extend(target.components().rev().map(|c| c.as_os_str().to_owned()));
            }
            _ => done = next,
        }
    }
    let host = root.join(done.strip_prefix("/").unwrap_or(&done));
    (done, host)
}

/// The package that holds the debug info of `python3.X` on the
/// distribution whose `/etc/os-release` (inside the target's root) is
/// `os_release`.
#[must_use]
pub fn debug_package(os_release: &str, (major, minor): (u8, u8)) -> String {
    let field = |k: &str| {
        os_release.lines().find_map(|l| l.strip_prefix(k)?.strip_prefix('=')).map(|v| v.trim_matches('"').to_owned())
    };
    let (id, like) = (field("ID").unwrap_or_default(), field("ID_LIKE").unwrap_or_default());
    let is = |name: &str| id == name || like.split_whitespace().any(|l| l == name);
    if id == "ubuntu" {
        format!("apt-get install python{major}.{minor}-dbgsym (from the ddebs archive)")
    } else if is("debian") {
        format!("apt-get install python{major}.{minor}-dbg")
    } else if is("fedora") || is("rhel") {
        format!("dnf debuginfo-install python{major}")
    } else {
        format!(
            "install the debug info of this python{major}.{minor} (its build-id's .debug file), or pass --debug-dir"
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #[test]
    fn names_the_package_per_distribution() {
        assert_eq!(debug_package("ID=debian\nVERSION_ID=\"12\"\n", (3, 11)), "apt-get install python3.11-dbg");
        assert_eq!(debug_package("ID=\"debian\"\n", (3, 14)), "apt-get install python3.14-dbg");
        assert!(debug_package("ID=ubuntu\nID_LIKE=debian\n", (3, 12)).starts_with("apt-get install python3.12-dbgsym"));
        assert_eq!(debug_package("ID=fedora\n", (3, 13)), "dnf debuginfo-install python3");
        assert!(debug_package("", (3, 13)).contains("--debug-dir"));
    }

    use super::*;

    pub(crate) const DEBIAN_PYTHON: &str = "/usr/bin/python3.11";

    /// The build-id path of Debian's python3.11 debug file, failing with
    /// what to install when the package is absent.
    pub(crate) fn debian_debug_file() -> PathBuf {
        let data =
            std::fs::read(DEBIAN_PYTHON).expect("Debian's python3.11 is missing: run `apt-get install python3.11`");
        let file = object::File::parse(&*data).unwrap();
        let id = file.build_id().unwrap().expect("python3.11 has a build-id");
        let path = Path::new(SYSTEM_DEBUG_DIR).join(build_id_path(id));
        assert!(path.is_file(), "{} is missing: run `apt-get install python3.11-dbg`", path.display());
        path
    }

    /// A fresh, empty directory for one test, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("tracer-debuginfo-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        /// Writes `data` at `rel`, creating its directories.
        fn put(&self, rel: impl AsRef<Path>, data: &[u8]) {
            let path = self.0.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, data).unwrap();
        }
    }

    impl std::ops::Deref for Scratch {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A directory holding `data` at python3.11's build-id path.
    fn debug_dir_with(name: &str, data: &[u8]) -> Scratch {
        let dir = Scratch::new(name);
        dir.put(debian_debug_file().strip_prefix(SYSTEM_DEBUG_DIR).unwrap(), data);
        dir
    }

    /// Python's image inside an otherwise empty root, so that only the
    /// debug directory can supply its DWARF.
    fn lone_python(name: &str) -> Scratch {
        let root = Scratch::new(name);
        root.put("usr/bin/python3.11", &std::fs::read(DEBIAN_PYTHON).unwrap());
        root
    }

    #[test]
    fn debian_python_dwarf_is_found_by_build_id() {
        let expected = debian_debug_file();
        let found = locate(Path::new(DEBIAN_PYTHON), Path::new("/"), None, None).unwrap();
        assert_eq!(found, Some(DwarfFile { origin: Origin::BuildId, path: expected }));
    }

    /// pyenv's libpython, the python3 on PATH.
    pub(crate) fn pyenv_libpython() -> PathBuf {
        let out = std::process::Command::new("python3").args(["-c", "import sys; print(sys.prefix)"]).output();
        let prefix = String::from_utf8(out.expect("python3 (pyenv's 3.11) runs").stdout).unwrap();
        let lib = Path::new(prefix.trim()).join("lib/libpython3.11.so.1.0");
        assert!(lib.is_file(), "pyenv's {} is missing", lib.display());
        lib
    }

    #[test]
    fn pyenv_libpython_has_its_own_dwarf() {
        let lib = pyenv_libpython();
        let found = locate(&lib, Path::new("/"), None, None).unwrap();
        assert_eq!(found, Some(DwarfFile { origin: Origin::Own, path: std::fs::canonicalize(&lib).unwrap() }));
    }

    #[test]
    fn a_debug_dir_is_searched_by_build_id() {
        let root = lone_python("root-good");
        let dir = debug_dir_with("dir-good", &std::fs::read(debian_debug_file()).unwrap());
        let found = locate(Path::new(DEBIAN_PYTHON), &root, Some(&dir), None).unwrap().unwrap();
        assert_eq!(found.origin, Origin::DebugDir);
        assert!(found.path.starts_with(&*dir));
        // Without it, nothing is reachable in that root, and that is no error.
        assert_eq!(locate(Path::new(DEBIAN_PYTHON), &root, None, None).unwrap(), None);
    }

    #[test]
    fn debuglink_names_are_found_in_the_mirrored_debug_dir_with_their_crc() {
        let root = lone_python("root-link");
        let data = std::fs::read(DEBIAN_PYTHON).unwrap();
        let (name, _) =
            object::File::parse(&*data).unwrap().gnu_debuglink().unwrap().expect("python3.11 has a debuglink");
        let name = bytes_to_os(name);
        root.put(Path::new("usr/lib/debug/usr/bin").join(&name), &std::fs::read(debian_debug_file()).unwrap());
        let found = locate(Path::new(DEBIAN_PYTHON), &root, None, None).unwrap().unwrap();
        assert_eq!(found, DwarfFile { origin: Origin::DebugLink, path: root.join("usr/lib/debug/usr/bin").join(name) });
    }

    #[test]
    fn a_missing_debug_dir_is_an_error_naming_it() {
        let dir = Path::new("/nonexistent/tracer-debug-dir");
        let err = locate(Path::new(DEBIAN_PYTHON), Path::new("/"), Some(dir), None).unwrap_err();
        assert!(matches!(err, DebugInfoError::DebugDir { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/tracer-debug-dir"), "{err}");
    }

    #[test]
    fn another_builds_debug_file_is_an_error_naming_both_ids() {
        let ours = debian_debug_file();
        let other = std::fs::read_dir(Path::new(SYSTEM_DEBUG_DIR).join(".build-id"))
            .unwrap()
            .flatten()
            .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
            .map(|f| f.path())
            .find(|p| p.extension().is_some_and(|e| e == "debug") && *p != ours && p.is_file())
            .expect("another package's debug file under /usr/lib/debug/.build-id");
        let other_data = std::fs::read(&other).unwrap();
        let other_id = hex(object::File::parse(&*other_data).unwrap().build_id().unwrap().unwrap());
        let root = lone_python("root-other");
        let dir = debug_dir_with("dir-other", &other_data);
        let err = locate(Path::new(DEBIAN_PYTHON), &root, Some(&dir), None).unwrap_err();
        let DebugInfoError::BuildIdMismatch { found, expected, .. } = &err else { panic!("{err}") };
        assert_eq!(found, &other_id);
        let msg = err.to_string();
        assert!(msg.contains(&other_id) && msg.contains(expected.as_str()), "{msg}");
        assert!(ours.to_string_lossy().contains(&expected[2..]), "{msg}");
    }

    #[test]
    fn a_truncated_debug_file_is_an_error() {
        let data = std::fs::read(debian_debug_file()).unwrap();
        let root = lone_python("root-cut");
        let dir = debug_dir_with("dir-cut", &data[..data.len() / 2]);
        let err = locate(Path::new(DEBIAN_PYTHON), &root, Some(&dir), None).unwrap_err();
        assert!(matches!(err, DebugInfoError::Parse { .. }), "{err}");
        assert!(err.to_string().contains(&*dir.to_string_lossy()), "{err}");
    }

    /// A stale file in a standard place (here at the build-id path inside
    /// the root) is passed over for the right one in --debug-dir; alone, it
    /// is the error, with what to do.
    #[test]
    fn a_bad_file_in_a_standard_place_does_not_hide_a_good_one() {
        let good = std::fs::read(debian_debug_file()).unwrap();
        let root = lone_python("root-stale");
        root.put(debian_debug_file().strip_prefix("/").unwrap(), &good[..4096]);
        let dir = debug_dir_with("dir-fresh", &good);
        let found = locate(Path::new(DEBIAN_PYTHON), &root, Some(&dir), None).unwrap().unwrap();
        assert_eq!(found.origin, Origin::DebugDir);
        let err = locate(Path::new(DEBIAN_PYTHON), &root, None, None).unwrap_err();
        let DebugInfoError::Parse { path, .. } = &err else { panic!("{err}") };
        assert_eq!(path, &root.join(debian_debug_file().strip_prefix("/").unwrap()));
        assert!(err.to_string().ends_with(&format!("; {BAD_FILE_FIX}")), "{err}");
    }

    #[test]
    fn debuglink_needs_the_recorded_crc() {
        let expect = Expected { image: "/img".into(), build_id: None, link: Some(("x.debug".into(), 0)) };
        let err = expect.check(&debian_debug_file(), true).unwrap_err();
        assert!(matches!(err, DebugInfoError::CrcMismatch { expected: 0, .. }), "{err}");
        assert!(expect.check(Path::new("/nonexistent/x.debug"), true).unwrap().is_none());
    }

    #[test]
    fn absolute_links_resolve_inside_the_root() {
        let root = Scratch::new("links");
        std::fs::create_dir_all(root.join("opt/real")).unwrap();
        std::os::unix::fs::symlink("/opt/real", root.join("opt/link")).unwrap();
        let (inside, host) = in_root(&root, Path::new("/opt/link/../link/file"));
        assert_eq!(inside, Path::new("/opt/real/file"));
        assert_eq!(host, root.join("opt/real/file"));
        assert_eq!(in_root(Path::new("/"), Path::new("/usr/lib/debug")).0, Path::new("/usr/lib/debug"));
    }
}
