//! Which files may call into the interpreter image: what
//! `--placement call-sites` scans and probes.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
};

use super::process::{FileId, MappedFile, Root, file_id};

/// An ELF file the target runs code from, or may load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    /// As the target sees it.
    pub display_path: PathBuf,
    /// The same file from tracer's mount namespace: what uprobes attach to.
    pub attach_path: PathBuf,
}

/// The modules that can call into the interpreter image: every other ELF
/// file in `mapped` (the target's file mappings) and every extension module
/// in the interpreter's `lib-dynload` directory, each as tracer reaches it
/// from `root`.
#[must_use]
pub fn modules(image: &Path, root: Root, mapped: &[MappedFile], version: (u8, u8)) -> Vec<Module> {
    let mut found: Vec<Module> = mapped
        .iter()
        .filter(|f| f.path.as_path() != image)
        .filter_map(|f| Some(Module { attach_path: root.reach(&f.path, Some(f.id))?, display_path: f.path.clone() }))
        .collect();
    if let Some((dir, reached)) = lib_dynload(image, root, version) {
        let mut entries: Vec<Module> = std::fs::read_dir(&reached)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter(|e| Path::new(&e.file_name()).extension().is_some_and(|x| x == "so"))
            .map(|e| Module { display_path: dir.join(e.file_name()), attach_path: reached.join(e.file_name()) })
            .collect();
        entries.sort_by(|a, b| a.display_path.cmp(&b.display_path));
        found.extend(entries);
    }
    let mut seen = HashSet::new();
    found.retain(|m| seen.insert(m.display_path.clone()));
    found
}

/// Of `files` (what `pid` maps executable), those not in `known` yet, as
/// modules; records them in `known`. Each is reached as [`Root::reach`]
/// says, the plain path first, so that it stays valid after `pid` exits. A
/// file that vanished meanwhile is skipped: nothing runs it.
pub fn new_modules<S: std::hash::BuildHasher>(
    pid: u32,
    files: &[MappedFile],
    known: &mut HashSet<FileId, S>,
) -> Vec<Module> {
    files
        .iter()
        .filter_map(|f| {
            // Known files first: reaching one reads the process's maps, and
            // this runs for every process at every interval.
            if known.contains(&f.id) {
                return None;
            }
            let attach_path = Root::Process(pid).reach(&f.path, Some(f.id))?;
            known.insert(f.id);
            Some(Module { display_path: f.path.clone(), attach_path })
        })
        .collect()
}

/// The identities of `modules` and of the `image`, to tell later which
/// files are new.
#[must_use]
pub fn known_files(image: &Path, modules: &[Module]) -> HashSet<FileId> {
    modules.iter().map(|m| m.attach_path.as_path()).chain([image]).filter_map(file_id).collect()
}

/// `<prefix>/lib/python3.X/lib-dynload` for an image in `<prefix>/lib` (a
/// libpython) or `<prefix>/bin` (an executable): as the target names it,
/// and as tracer reaches it.
fn lib_dynload(image: &Path, root: Root, (major, minor): (u8, u8)) -> Option<(PathBuf, PathBuf)> {
    let leaf = format!("python{major}.{minor}/lib-dynload");
    let dir = image.parent()?;
    [dir.join(&leaf), dir.parent()?.join("lib").join(&leaf)]
        .into_iter()
        .find_map(|d| root.reach(&d, None).filter(|r| r.is_dir()).map(|r| (d, r)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_lib_dynload_beside_a_libpython_or_an_executable() {
        let root = std::env::temp_dir().join(format!("tracer-callsites-{}", std::process::id()));
        let dynload = root.join("opt/py/lib/python3.11/lib-dynload");
        std::fs::create_dir_all(&dynload).unwrap();
        std::fs::write(dynload.join("_json.so"), b"").unwrap();
        std::fs::write(dynload.join("README"), b"").unwrap();
        let lib = root.join("opt/py/lib/libpython3.11.so.1.0");
        let exe = root.join("opt/py/bin/python3.11");
        let libc = PathBuf::from("/proc/self/exe");
        let libc_id = file_id(&libc).unwrap();
        let mapped = [MappedFile { path: lib.clone(), id: (0, 0) }, MappedFile { path: libc.clone(), id: libc_id }];
        for image in [&lib, &exe] {
            let found = modules(image, Root::Own, &mapped, (3, 11));
            let shown: Vec<_> = found.iter().map(|m| m.display_path.clone()).collect();
            let mut want: Vec<PathBuf> =
                mapped.iter().filter(|f| &f.path != image && f.path.exists()).map(|f| f.path.clone()).collect();
            want.push(dynload.join("_json.so"));
            assert_eq!(shown, want);
            assert_eq!(found.last().unwrap().attach_path, dynload.join("_json.so"));
        }
        std::fs::remove_dir_all(root).unwrap();
    }
}
