//! Finding every CPython process on the host for `--all`, and the
//! interpreter image each runs: processes that run one image are traced
//! together, by one `tracer attach --exe IMAGE` ([`super::child`]), which
//! also sees the processes that start it later. Each process is looked at
//! once (until it calls exec): a process that maps an image already known
//! is that image's without opening anything.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use crate::{
    discover::process::{FileId, Target, TargetError, file_id},
    model::ProcessInfo,
    text,
};

/// The most bytes of a command line or cgroup path read.
const MAX_READ: usize = 4096;

/// What a process turned out to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not a CPython process (or a kernel thread, or tracer itself).
    NotPython,
    /// A CPython process running the image `key`.
    Python { key: FileId },
    /// A CPython process `--all` cannot trace, and why.
    Skipped { reason: String },
    /// A process tracer cannot look into, so cannot tell (the kernel
    /// denies it), and why.
    Unknown { reason: String },
}

/// An interpreter image found: what its `tracer attach --exe` is given.
#[derive(Clone, Debug)]
pub struct Image {
    pub key: FileId,
    /// The image as tracer opens it: a path of tracer's own root, or
    /// through `/proc/PID/root` where only that reaches it.
    pub path: PathBuf,
    /// The image held open where [`Self::path`] goes through a process,
    /// which may end while others still run the image: its tracer is given
    /// this descriptor instead (a container's root made by `pivot_root`).
    pub held: Option<std::sync::Arc<std::fs::File>>,
    /// Where debug files for it are, when its process runs in a root of
    /// its own (a chroot, a container): `ROOT/usr/lib/debug`.
    pub debug_dir: Option<PathBuf>,
}

/// A process's start time and executable: a PID that changes either is
/// another process, or the same one after exec, and is looked at again.
type Stamp = (u64, Option<FileId>);

/// What a scan found that the last one had not.
#[derive(Debug, Default)]
pub struct Found {
    /// Images seen for the first time.
    pub images: Vec<Image>,
    /// Processes seen for the first time (or since they called exec),
    /// with what they are; only CPython ones.
    pub processes: Vec<(u32, ProcessInfo)>,
    /// Processes tracer could not look into, with why.
    pub unknown: Vec<(u32, String)>,
}

/// The host's processes as the last scan left them.
#[derive(Debug, Default)]
pub struct Scanner {
    seen: HashMap<u32, Stamp>,
    images: HashMap<FileId, Image>,
}

impl Scanner {
    /// Looks at every process in /proc not looked at before.
    pub fn scan(&mut self) -> Found {
        let mut found = Found::default();
        let me = std::process::id();
        let Ok(dir) = std::fs::read_dir("/proc") else { return found };
        let mut alive = Vec::new();
        for entry in dir.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            if pid == me {
                continue;
            }
            alive.push(pid);
            let Some(stamp) = stamp(pid) else { continue };
            if self.seen.get(&pid) == Some(&stamp) {
                continue;
            }
            match self.look(pid, &mut found) {
                Verdict::NotPython => {}
                Verdict::Unknown { reason } => found.unknown.push((pid, reason)),
                verdict => found.processes.push((pid, info(pid, &verdict, &self.images))),
            }
            self.seen.insert(pid, stamp);
        }
        // Forget the exited, so that their PIDs' next owners are looked at.
        alive.sort_unstable();
        self.seen.retain(|pid, _| alive.binary_search(pid).is_ok());
        found
    }

    /// Whether `pid` is CPython, and its image; a new image goes to
    /// `found`.
    fn look(&mut self, pid: u32, found: &mut Found) -> Verdict {
        if let Some(key) = mapped_known(pid, &self.images) {
            return Verdict::Python { key };
        }
        let target = match Target::inspect(pid) {
            Ok(t) => t,
            Err(e) if e.is_not_a_target() => return Verdict::NotPython,
            // Its image found, and named as an interpreter's, but not
            // reached.
            Err(e @ TargetError::Unreachable { .. }) if e.to_string().contains("python") => {
                return Verdict::Skipped { reason: e.to_string() };
            }
            Err(e) => return Verdict::Unknown { reason: e.to_string() },
        };
        let Some(key) = file_id(&target.host_path) else {
            return Verdict::Skipped { reason: format!("{} is gone", target.host_path.display()) };
        };
        if self.images.contains_key(&key) {
            return Verdict::Python { key };
        }
        // `--exe` opens the path in tracer's own root, and so do the
        // uprobes it attaches each window: a path through /proc/PID lives
        // only as long as that process, so the image is held open and its
        // tracer given the descriptor. Its debug files are read at its
        // start, through this process's root.
        let (held, root) = if target.host_path.starts_with("/proc") {
            match std::fs::File::open(&target.host_path) {
                Ok(file) => (Some(std::sync::Arc::new(file)), Some(PathBuf::from(format!("/proc/{pid}/root")))),
                Err(e) => {
                    return Verdict::Skipped {
                        reason: format!(
                            "its interpreter {} is in a mount namespace of its own, reached only through /proc/{pid}, and could not be opened there ({e}); trace it with --pid {pid}",
                            text::display(&target.image_path.display().to_string())
                        ),
                    };
                }
            }
        } else {
            (None, root_of(pid))
        };
        let debug_dir = root.map(|root| root.join("usr/lib/debug")).filter(|d| d.is_dir());
        let image = Image { key, path: target.host_path, held, debug_dir };
        self.images.insert(key, image.clone());
        found.images.push(image);
        Verdict::Python { key }
    }
}

/// `pid`'s start time (clock ticks after boot) and executable.
fn stamp(pid: u32) -> Option<Stamp> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which may hold spaces and
    // parentheses: the last ')' ends it; start time is field 22.
    let started = stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()?;
    Some((started, file_id(Path::new(&format!("/proc/{pid}/exe")))))
}

/// The known image `pid` maps, if any.
fn mapped_known(pid: u32, images: &HashMap<FileId, Image>) -> Option<FileId> {
    if images.is_empty() {
        return None;
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    images.values().find(|image| maps_file(&maps, &image.path)).map(|image| image.key)
}

/// Whether a line of `maps` maps `path` (as tracer sees it: a chroot's
/// files show their host paths).
fn maps_file(maps: &str, path: &Path) -> bool {
    let Some(path) = path.to_str() else { return false };
    // The path is the line's last field, and may hold spaces.
    maps.lines().any(|line| line.strip_suffix(path).is_some_and(|rest| rest.ends_with(char::is_whitespace)))
}

/// `pid`'s root where it is not tracer's.
fn root_of(pid: u32) -> Option<PathBuf> {
    let root = std::fs::read_link(format!("/proc/{pid}/root")).ok()?;
    (root != Path::new("/")).then_some(root)
}

/// What a user knows `pid` by.
fn info(pid: u32, verdict: &Verdict, images: &HashMap<FileId, Image>) -> ProcessInfo {
    let image = match verdict {
        Verdict::Python { key } => images.get(key).map(|i| i.path.display().to_string()).unwrap_or_default(),
        Verdict::NotPython | Verdict::Skipped { .. } | Verdict::Unknown { .. } => String::new(),
    };
    let skipped = match verdict {
        Verdict::Skipped { reason } => Some(reason.clone()),
        Verdict::NotPython | Verdict::Python { .. } | Verdict::Unknown { .. } => None,
    };
    ProcessInfo { image, skipped, ..describe(pid) }
}

/// `pid`'s namespace PID, container, root and command line, as far as
/// they can be read (an exited process gives nothing).
#[must_use]
pub fn describe(pid: u32) -> ProcessInfo {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let pid_in_namespace = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|ids| ids.split_whitespace().last()?.parse::<u32>().ok())
        .filter(|&inner| inner != pid);
    // cgroup v2's single line, `0::PATH`.
    let cgroup = read_bounded(&format!("/proc/{pid}/cgroup"));
    let container = cgroup.lines().find_map(|l| l.strip_prefix("0::")).map(|p| text::bound(p.trim()));
    let command = read_bounded(&format!("/proc/{pid}/cmdline"));
    let command = text::bound(command.trim_end_matches('\0').replace('\0', " ").as_str());
    let root = root_of(pid).map(|r| text::bound(&r.display().to_string()));
    ProcessInfo { pid_in_namespace, container, root, command, image: String::new(), skipped: None }
}

/// At most [`MAX_READ`] bytes of a /proc file, as text.
fn read_bounded(path: &str) -> String {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    if let Ok(file) = std::fs::File::open(path) {
        let _ = file.take(MAX_READ as u64).read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_described_by_its_own_files() {
        let me = describe(std::process::id());
        assert!(!me.command.is_empty());
        assert_eq!(me.pid_in_namespace, None);
        assert!(me.container.is_some_and(|c| c.starts_with('/')));
        let gone = describe(u32::MAX);
        assert_eq!(gone, ProcessInfo::default());
    }

    #[test]
    fn maps_lines_are_matched_by_their_path() {
        let maps = "7f00-7f10 r-xp 00000000 08:01 1234   /usr/lib/libpython3.11.so.1.0\n";
        assert!(maps_file(maps, Path::new("/usr/lib/libpython3.11.so.1.0")));
        assert!(!maps_file(maps, Path::new("/usr/lib/libpython3.11.so")));
    }
}
