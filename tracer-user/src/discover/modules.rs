//! Which files may call into the interpreter image: what
//! `--placement call-sites` scans and probes.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
};

use super::process::{FileId, file_id};

/// An ELF file the target runs code from, or may load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    /// As the target sees it.
    pub display_path: PathBuf,
    /// The same file from tracer's mount namespace: what uprobes attach to.
    pub attach_path: PathBuf,
}

/// The modules that can call into the interpreter image: every other ELF
/// file in `mapped` (the target's file mappings, as it sees them) and every
/// extension module in the interpreter's `lib-dynload` directory. `root`
/// turns a target path into one tracer can open (`/proc/PID/root`, or `/`).
#[must_use]
pub fn modules(image: &Path, root: &Path, mapped: &[PathBuf], version: (u8, u8)) -> Vec<Module> {
    let mut paths: Vec<PathBuf> = mapped.iter().filter(|p| p.as_path() != image).cloned().collect();
    if let Some(dir) = lib_dynload(image, root, version) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(root.join(strip_root(&dir)))
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|e| dir.join(e.file_name()))
            .filter(|p| p.extension().is_some_and(|x| x == "so"))
            .collect();
        entries.sort();
        paths.extend(entries);
    }
    let mut seen = std::collections::HashSet::new();
    paths
        .into_iter()
        .filter(|p| seen.insert(p.clone()))
        .map(|p| Module { attach_path: root.join(strip_root(&p)), display_path: p })
        .collect()
}

/// Of `files` (what `pid` maps executable, as it sees them), those not in
/// `known` yet, as modules; records them in `known`. A file is reached
/// through /proc/PID/root unless tracer sees the same file at the same path
/// (the process shares tracer's mount namespace), so that the path stays
/// valid after `pid` exits. A file that vanished meanwhile is skipped:
/// nothing runs it.
pub fn new_modules<S: std::hash::BuildHasher>(
    pid: u32,
    files: &[PathBuf],
    known: &mut HashSet<FileId, S>,
) -> Vec<Module> {
    files
        .iter()
        .filter_map(|path| {
            let through_proc = super::process::through_root(pid, path);
            let id = file_id(&through_proc)?;
            let attach_path = if file_id(path) == Some(id) { path.clone() } else { through_proc };
            known.insert(id).then(|| Module { display_path: path.clone(), attach_path })
        })
        .collect()
}

/// The identities of `modules` and of the `image`, to tell later which
/// files are new.
#[must_use]
pub fn known_files(image: &Path, modules: &[Module]) -> HashSet<FileId> {
    modules.iter().map(|m| m.attach_path.as_path()).chain([image]).filter_map(file_id).collect()
}

fn strip_root(path: &Path) -> &Path {
    path.strip_prefix("/").unwrap_or(path)
}

/// `<prefix>/lib/python3.X/lib-dynload` for an image in `<prefix>/lib` (a
/// libpython) or `<prefix>/bin` (an executable).
fn lib_dynload(image: &Path, root: &Path, (major, minor): (u8, u8)) -> Option<PathBuf> {
    let leaf = format!("python{major}.{minor}/lib-dynload");
    let dir = image.parent()?;
    [dir.join(&leaf), dir.parent()?.join("lib").join(&leaf)].into_iter().find(|d| root.join(strip_root(d)).is_dir())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_lib_dynload_beside_a_libpython_or_an_executable() {
        let root = std::env::temp_dir().join(format!("tracer-callsites-{}", std::process::id()));
        std::fs::create_dir_all(root.join("opt/py/lib/python3.11/lib-dynload")).unwrap();
        std::fs::write(root.join("opt/py/lib/python3.11/lib-dynload/_json.so"), b"").unwrap();
        std::fs::write(root.join("opt/py/lib/python3.11/lib-dynload/README"), b"").unwrap();
        let lib = Path::new("/opt/py/lib/libpython3.11.so.1.0");
        let exe = Path::new("/opt/py/bin/python3.11");
        let mapped = [lib.to_owned(), PathBuf::from("/usr/lib/libc.so.6")];
        for image in [lib, exe] {
            let found = modules(image, &root, &mapped, (3, 11));
            let shown: Vec<_> = found.iter().map(|m| m.display_path.clone()).collect();
            let mut want: Vec<PathBuf> = mapped.iter().filter(|p| p.as_path() != image).cloned().collect();
            want.push(PathBuf::from("/opt/py/lib/python3.11/lib-dynload/_json.so"));
            assert_eq!(shown, want);
            assert_eq!(found.last().unwrap().attach_path, root.join("opt/py/lib/python3.11/lib-dynload/_json.so"));
        }
        std::fs::remove_dir_all(root).unwrap();
    }
}
