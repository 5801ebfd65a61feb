//! Finding the CPython image inside a live process, from /proc/PID alone.

use std::{
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use procfs::process::{MMapPath, MemoryMaps, Process};
use thiserror::Error;

use super::elf::{ElfError, ElfImage, defines_cpython};

/// A process that cannot be traced.
#[derive(Debug, Error)]
pub enum TargetError {
    #[error("no process with PID {pid}; check the PID with `pgrep -a python`")]
    NoSuchProcess { pid: u32 },
    #[error("process {pid} exited before tracer could attach; start it again and pass its new PID")]
    Exited { pid: u32 },
    #[error("PID {pid} ({comm}) is a kernel thread, not a Python process; pass the PID of a CPython process")]
    KernelThread { pid: u32, comm: String },
    #[error("PID {pid} is tracer itself; pass the PID of the CPython process to trace")]
    OwnProcess { pid: u32 },
    #[error(
        "PID {pid} ({comm}, {exe}) is not a Python process: no libpython is mapped and the executable has no CPython symbols; pass the PID of a CPython process (for a launcher script, its python child)"
    )]
    NotPython { pid: u32, comm: String, exe: String },
    #[error("cannot read {what} of PID {pid}: {cause}{hint}")]
    Proc { pid: u32, what: &'static str, cause: procfs::ProcError, hint: &'static str },
    #[error(
        "the kernel denied tracer access to {path} of PID {pid} although tracer runs as root: PID {pid} holds capabilities that tracer lacks ({missing}), and only a process with all of them may inspect it; trace another process, or run tracer where it has those capabilities (outside this container or sandbox)"
    )]
    CapabilitiesLacking { pid: u32, path: String, missing: String },
    #[error(
        "the kernel denied tracer access to {path} of PID {pid} although tracer runs as root with every capability PID {pid} holds; a security module (Yama, AppArmor, SELinux) or the process's namespace forbids it, so check `dmesg` and the module's policy"
    )]
    AccessDenied { pid: u32, path: String },
    #[error("{tid} is a thread of process {tgid}, not a process; pass --pid {tgid}")]
    Thread { tid: u32, tgid: u32 },
    #[error("cannot watch PID {pid} for exit: {cause}")]
    Watch { pid: u32, cause: std::io::Error },
    #[error("cannot read memory of PID {pid} at {address:#x}: {cause}")]
    Memory { pid: u32, address: u64, cause: std::io::Error },
    #[error("the Python image of PID {pid} cannot be read: {cause}")]
    Image { pid: u32, cause: ElfError },
    #[error(
        "cannot reach {path}, the Python image of PID {pid}, as the same file from tracer's root or through /proc/{pid}/root; was it replaced after the process started?"
    )]
    Unreachable { pid: u32, path: String },
}

impl TargetError {
    /// Whether the process is no CPython one to trace: not Python, a
    /// kernel thread, tracer itself, a thread, or gone since it was listed
    /// (what `--name` and `--all` pass over without a word).
    #[must_use]
    pub const fn is_not_a_target(&self) -> bool {
        matches!(
            self,
            Self::NotPython { .. }
                | Self::KernelThread { .. }
                | Self::OwnProcess { .. }
                | Self::Exited { .. }
                | Self::NoSuchProcess { .. }
                | Self::Thread { .. }
        )
    }
}

impl crate::error::Classify for TargetError {
    /// The PID given, and the process it names.
    fn is_bad_input(&self) -> bool {
        true
    }
}

/// Where the interpreter's code lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageKind {
    /// A mapped `libpython3.X.so` (a `--enable-shared` build).
    SharedLibrary,
    /// The executable itself (a static build, like Debian's python3.11).
    Executable,
}

/// One file-backed mapping of the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub path: PathBuf,
}

/// A live process with a CPython image.
#[derive(Debug)]
pub struct Target {
    pub pid: u32,
    pub comm: String,
    /// The image path as `/proc/PID/maps` shows it.
    pub image_path: PathBuf,
    /// The same file as tracer opens it (as it is, or through
    /// /proc/PID/root, whichever is that file); this is what uprobes are
    /// attached to.
    pub host_path: PathBuf,
    /// The process's PID in its own PID namespace, where that differs.
    pub ns_pid: Option<u32>,
    /// The image's symbols.
    pub elf: ElfImage,
    /// The file-backed mappings of the image, to turn file offsets into
    /// addresses in the target.
    pub image_maps: Vec<Mapping>,
    /// Every file the target has mapped executable.
    pub code_files: Vec<MappedFile>,
}

/// A file a process maps: its path as `/proc/PID/maps` shows it, and which
/// file it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedFile {
    /// As `/proc/PID/maps` shows it to tracer: relative to tracer's root
    /// where the file is below it (a chroot's files), else to the
    /// process's.
    pub path: PathBuf,
    pub id: FileId,
}

/// The identity `/proc/PID/maps` gives a mapping.
fn mapping_id(m: &procfs::process::MemoryMap) -> FileId {
    let dev = libc::makedev(u32::try_from(m.dev.0).unwrap_or(0), u32::try_from(m.dev.1).unwrap_or(0));
    (dev, m.inode)
}

/// The files mapped executable, each once, in address order.
fn executable_files(maps: &procfs::process::MemoryMaps) -> Vec<MappedFile> {
    let mut files: Vec<MappedFile> = Vec::new();
    for m in maps {
        if let MMapPath::Path(path) = &m.pathname
            && m.perms.contains(procfs::process::MMPermissions::EXECUTE)
            && !files.iter().any(|f| &f.path == path)
        {
            files.push(MappedFile { path: path.clone(), id: mapping_id(m) });
        }
    }
    files
}

/// How tracer opens a file a process names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Root {
    /// Tracer's own view: `--exe`, where no process names the files.
    Own,
    /// A process's: a path it names is tried as it is (what
    /// `/proc/PID/maps` shows for a chroot's files, and any file the
    /// process shares with tracer) and through `/proc/PID/root` (its mount
    /// namespace).
    Process(u32),
}

impl Root {
    /// A path tracer can open for `path` as the process names it.
    ///
    /// With `id` (the identity `/proc/PID/maps` gives the mapping), `path`
    /// is a file the process maps, and the answer is that very file: found
    /// through `/proc/PID/map_files/`, else by that device and inode. A
    /// plain path that is the same file is preferred (it stays valid after
    /// the process exits), else the `map_files` entry itself. Without `id`,
    /// the process's view first. `None` when nothing reaches it.
    #[must_use]
    pub fn reach(self, path: &Path, id: Option<FileId>) -> Option<PathBuf> {
        let plain = path.to_owned();
        let Self::Process(pid) = self else { return plain.exists().then_some(plain) };
        let inside = through_root(pid, path);
        let Some(id) = id else { return [inside, plain].into_iter().find(|c| c.exists()) };
        if let Some((mapped, real)) = map_files_entry(pid, path, id) {
            // Both identities come from stat here, so they agree for the
            // same file on every file system, which the maps' device need
            // not (btrfs shows the file system's, stat the subvolume's).
            // Where no plain path is that file (deleted or replaced since;
            // on overlayfs, a kernel that maps the layer's file), the
            // entry itself is the way, and uprobes attached through it
            // land on the mapped file.
            return [plain, inside].into_iter().find(|c| file_id(c) == Some(real)).or(Some(mapped));
        }
        // No map_files entry to open (no CAP_SYS_ADMIN or
        // CAP_CHECKPOINT_RESTORE, or the mapping is gone): the device and
        // inode the maps show, which on btrfs and overlayfs may differ from
        // what stat says of the same file, so this can miss it.
        [plain, inside].into_iter().find(|c| file_id(c) == Some(id))
    }
}

/// `/proc/PID/map_files/START-END` for a mapping of `path` in `pid`, the
/// one with identity `id` if several are of that path: the mapped file
/// itself, whatever mount namespace or file system it is on, even if the
/// path now names another file or none; with the file's identity as stat
/// gives it. `None` when `pid` maps no `path` or the entry cannot be
/// followed, which needs `CAP_SYS_ADMIN` (or `CAP_CHECKPOINT_RESTORE`) as
/// well as ptrace access.
fn map_files_entry(pid: u32, path: &Path, id: FileId) -> Option<(PathBuf, FileId)> {
    let process = Process::new(i32::try_from(pid).ok()?).ok()?;
    let maps = maps_of(&process).ok()?;
    let of_path: Vec<_> = maps.iter().filter(|m| matches!(&m.pathname, MMapPath::Path(p) if p == path)).collect();
    let mapping = of_path.iter().find(|m| mapping_id(m) == id).or_else(|| of_path.first())?;
    // The kernel names each entry by its range, as `%lx-%lx`.
    let entry = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", mapping.address.0, mapping.address.1));
    // stat, not open: a mapped device file could act on being opened.
    file_id(&entry).map(|real| (entry, real))
}

/// The files `pid` has mapped executable now, as it sees them.
pub fn code_files(pid: u32) -> Result<Vec<MappedFile>, TargetError> {
    let proc_err = |what| move |cause| map_proc_error(pid, what, cause);
    let process = Process::new(i32::try_from(pid).map_err(|_| TargetError::NoSuchProcess { pid })?)
        .map_err(proc_err("the /proc entry"))?;
    Ok(executable_files(&maps_of(&process).map_err(proc_err("memory map"))?))
}

/// `process`'s memory map, as procfs's `Process::maps` reads it, through
/// [`parse_maps`].
pub fn maps_of(process: &Process) -> procfs::ProcResult<MemoryMaps> {
    use std::io::Read as _;
    let mut text = Vec::new();
    process.open_relative("maps")?.read_to_end(&mut text).map_err(|_| {
        // What procfs says of a maps file it cannot read to the end.
        procfs::ProcError::Incomplete(Some(PathBuf::from(format!("/proc/{}/maps", process.pid))))
    })?;
    parse_maps(&text)
}

/// A `/proc/PID/maps` text, parsed by procfs. procfs 0.18 panics on a path
/// that starts with `/SYSV` (how the kernel names System V shared memory:
/// `/SYSV` and 8 hex digits) but is shorter than that, and a process in a
/// container can name a file so: such a line is an error here instead
/// (fuzz/corpus/maps/regression-sysv-short).
pub fn parse_maps(text: &[u8]) -> procfs::ProcResult<MemoryMaps> {
    use procfs::FromBufRead as _;
    for line in text.split(|&b| b == b'\n') {
        let line = String::from_utf8_lossy(line);
        // The path is what follows the fifth space, as procfs splits it.
        let Some(path) = line.splitn(6, ' ').nth(5).map(str::trim) else { continue };
        if path.starts_with("/SYSV") && path.get(5..13).is_none() {
            return Err(procfs::ProcError::Other(format!(
                "a mapping's path, {}, starts as System V shared memory's do (/SYSV and 8 hex digits) but is not one",
                crate::text::display(path)
            )));
        }
    }
    MemoryMaps::from_buf_read(text)
}

/// `path` as `pid` sees it, reached from tracer's mount namespace through
/// /proc/PID/root.
#[must_use]
pub fn through_root(pid: u32, path: &Path) -> PathBuf {
    Path::new("/proc").join(pid.to_string()).join("root").join(path.strip_prefix("/").unwrap_or(path))
}

/// `/proc/PID/root` itself.
#[must_use]
pub fn proc_root(pid: u32) -> PathBuf {
    through_root(pid, Path::new("/"))
}

/// A file's identity whatever path reaches it: (device, inode). Paths
/// differ between mount namespaces; this does not.
pub type FileId = (u64, u64);

/// The identity of the file at `path`, if it exists.
#[must_use]
pub fn file_id(path: &Path) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Every process that has `image` (as tracer sees it) mapped, with the
/// files each has mapped executable. A process that exits
/// or cannot be read while this looks is left out: it has nothing left to
/// probe.
#[must_use]
pub fn processes_mapping(image: &Path) -> Vec<(u32, Vec<MappedFile>)> {
    let Some((dev, ino)) = file_id(image) else { return Vec::new() };
    // /proc/PID/maps prints the device as major:minor.
    let want = (i64::from(libc::major(dev)), i64::from(libc::minor(dev)));
    let Ok(all) = procfs::process::all_processes() else { return Vec::new() };
    let me = std::process::id();
    all.filter_map(Result::ok)
        .filter_map(|process| {
            let pid = u32::try_from(process.pid).ok().filter(|&p| p != me)?;
            let maps = maps_of(&process).ok()?;
            maps.iter()
                .any(|m| {
                    m.inode == ino && (i64::from(m.dev.0), i64::from(m.dev.1)) == want
                        || matches!(&m.pathname, MMapPath::Path(p) if p == image)
                })
                .then(|| (pid, executable_files(&maps)))
        })
        .collect()
}

/// Opens a pidfd for `pid`: `Ok(None)` when no such process exists. A
/// pidfd names one process, so a PID the kernel hands to a new process
/// later does not fool it, as testing whether `/proc/PID` exists would.
pub fn pidfd_open(pid: u32) -> std::io::Result<Option<OwnedFd>> {
    let raw_pid = libc::pid_t::try_from(pid).map_err(std::io::Error::other)?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw_pid, 0) };
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        return if err.raw_os_error() == Some(libc::ESRCH) { Ok(None) } else { Err(err) };
    }
    let fd = i32::try_from(fd).map_err(|_| std::io::Error::other("fd out of range"))?;
    // SAFETY: fd is a fresh descriptor that nothing else owns.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// What tells one program a process runs from the next it may `exec`
/// (same PID, new memory): its executable file (device and inode) and where
/// its code, stack, arguments and heap began (`/proc/PID/stat` fields 26,
/// 28, 48 and 47, placed anew by every exec).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramStamp {
    exe: (u64, u64),
    starts: [u64; 4],
}

impl ProgramStamp {
    /// `pid`'s stamp now, if it can be read (the process exists).
    #[must_use]
    pub fn of(pid: u32) -> Option<Self> {
        use std::os::unix::fs::MetadataExt as _;
        let exe = std::fs::metadata(format!("/proc/{pid}/exe")).ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields from the third on follow the command's closing parenthesis.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        Some(Self { exe: (exe.dev(), exe.ino()), starts: [field(26)?, field(28)?, field(48)?, field(47)?] })
    }

    /// Whether `pid` now runs another program than the one stamped: it
    /// exec'd. A process gone (or unreadable) has not.
    #[must_use]
    pub fn changed(&self, pid: u32) -> bool {
        Self::of(pid).is_some_and(|now| now != *self)
    }
}

/// A process's pidfd, polled without waiting.
#[derive(Debug)]
pub struct Pidfd(OwnedFd);

impl Pidfd {
    /// `Ok(None)` when `pid` has already exited (or never existed); an
    /// error for anything else (a thread id, no fd left), which says
    /// nothing about whether the process lives.
    pub fn open(pid: u32) -> std::io::Result<Option<Self>> {
        Ok(pidfd_open(pid)?.map(Self))
    }

    /// Whether the process has exited: a pidfd turns readable then.
    #[must_use]
    pub fn exited(&self) -> bool {
        let mut poll = libc::pollfd { fd: self.0.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, no waiting.
        let ready = unsafe { libc::poll(&raw mut poll, 1, 0) };
        ready > 0 && poll.revents & (libc::POLLIN | libc::POLLHUP) != 0
    }
}

/// The process thread `tid` belongs to, while it lives.
#[must_use]
pub fn thread_group_of(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Tgid:"))?.trim().parse().ok()
}

/// `PF_KTHREAD` from include/linux/sched.h.
const PF_KTHREAD: u32 = 0x0020_0000;

impl Target {
    /// Inspects `pid` and locates its CPython image.
    pub fn inspect(pid: u32) -> Result<Self, TargetError> {
        if pid == std::process::id() {
            return Err(TargetError::OwnProcess { pid });
        }
        let proc_err = |what| move |cause| map_proc_error(pid, what, cause);
        let process = Process::new(i32::try_from(pid).map_err(|_| TargetError::NoSuchProcess { pid })?)
            .map_err(proc_err("the /proc entry"))?;
        let stat = process.stat().map_err(proc_err("stat"))?;
        if stat.flags & PF_KTHREAD != 0 {
            return Err(TargetError::KernelThread { pid, comm: stat.comm });
        }
        if matches!(stat.state, 'Z' | 'X') {
            return Err(TargetError::Exited { pid });
        }
        // /proc/TID answers for a thread as for its process: every
        // subcommand that takes a PID refuses a thread's id alike.
        if let Some(tgid) = thread_group_of(pid).filter(|&tgid| tgid != pid) {
            return Err(TargetError::Thread { tid: pid, tgid });
        }
        let maps = maps_of(&process).map_err(proc_err("memory map"))?;
        let code_files = executable_files(&maps);
        let ids: Vec<(PathBuf, FileId)> = maps
            .iter()
            .filter_map(|m| match &m.pathname {
                MMapPath::Path(path) => Some((path.clone(), mapping_id(m))),
                _ => None,
            })
            .collect();
        let files: Vec<Mapping> = maps
            .into_iter()
            .filter_map(|m| match m.pathname {
                MMapPath::Path(path) => Some(Mapping { start: m.address.0, end: m.address.1, offset: m.offset, path }),
                _ => None,
            })
            .collect();
        let exe = process.exe().map_err(proc_err("executable"))?;
        let (image_path, kind) = match files.iter().find(|m| is_libpython(&m.path)) {
            Some(lib) => (lib.path.clone(), ImageKind::SharedLibrary),
            None => (exe.clone(), ImageKind::Executable),
        };
        let image_id = ids.iter().find(|(p, _)| *p == image_path).map(|(_, id)| *id);
        let host_path = Root::Process(pid)
            .reach(&image_path, image_id)
            .ok_or_else(|| TargetError::Unreachable { pid, path: image_path.display().to_string() })?;
        let elf = ElfImage::open(&host_path).map_err(|cause| match cause {
            // An executable that is not ELF (or unreadable) is not Python.
            ElfError::Parse { .. } if kind == ImageKind::Executable => {
                TargetError::NotPython { pid, comm: stat.comm.clone(), exe: exe.display().to_string() }
            }
            cause => TargetError::Image { pid, cause },
        })?;
        if kind == ImageKind::Executable && !defines_cpython(&elf) {
            return Err(TargetError::NotPython { pid, comm: stat.comm, exe: exe.display().to_string() });
        }
        let image_maps = files.into_iter().filter(|m| m.path == image_path).collect();
        let ns_pid = process.status().ok().and_then(|s| s.nspid).and_then(|ns| ns.last().copied());
        let ns_pid = ns_pid.and_then(|n| u32::try_from(n).ok()).filter(|&n| n != pid);
        Ok(Self { pid, comm: stat.comm, image_path, host_path, ns_pid, elf, image_maps, code_files })
    }

    /// The address in the target at which file offset `offset` of the image
    /// is mapped, if it is.
    #[must_use]
    pub fn address_of_file_offset(&self, offset: u64) -> Option<u64> {
        self.image_maps.iter().find_map(|m| {
            let delta = offset.checked_sub(m.offset)?;
            (delta < m.end - m.start).then_some(m.start + delta)
        })
    }

    /// Reads `len` bytes of the target's memory.
    pub fn read_memory(&self, address: u64, len: usize) -> Result<Vec<u8>, TargetError> {
        read_memory(self.pid, address, len)
    }
}

/// Reads `len` bytes at `address` of `pid`'s memory.
pub fn read_memory(pid: u32, address: u64, len: usize) -> Result<Vec<u8>, TargetError> {
    let mut buf = vec![0; len];
    read_exact(pid, address, &mut buf).map_err(|cause| TargetError::Memory { pid, address, cause })?;
    Ok(buf)
}

/// Fills `buf` from `address` of `pid`'s memory with `process_vm_readv`,
/// which needs only the ptrace access check (`CAP_SYS_PTRACE` passes it),
/// where opening `/proc/PID/mem`, a file of mode 0600 owned by the
/// target's user, also needs `CAP_DAC_OVERRIDE` for another user's
/// process. A range that runs into an unmapped page is an `EFAULT`; a
/// process gone, or without memory (a zombie), an `ESRCH`.
pub fn read_exact(pid: u32, address: u64, buf: &mut [u8]) -> std::io::Result<()> {
    let target = libc::pid_t::try_from(pid).map_err(|_| std::io::Error::from_raw_os_error(libc::ESRCH))?;
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        let local = libc::iovec { iov_base: rest.as_mut_ptr().cast(), iov_len: rest.len() };
        let remote =
            libc::iovec { iov_base: address.wrapping_add(done as u64) as *mut libc::c_void, iov_len: rest.len() };
        // SAFETY: the local iovec covers the rest of `buf`, which lives
        // across the call; the remote one is only an address in the other
        // process, which the kernel checks.
        let n = unsafe { libc::process_vm_readv(target, &raw const local, 1, &raw const remote, 1, 0) };
        match usize::try_from(n) {
            Err(_) => return Err(std::io::Error::last_os_error()),
            // A short read stops at a page that is not mapped; nothing
            // more can be read there.
            Ok(0) => return Err(std::io::Error::from_raw_os_error(libc::EFAULT)),
            Ok(n) => done += n,
        }
    }
    Ok(())
}

/// `libpython3.11.so.1.0`, `libpython3.13t.so`, `libpython3.12d.so.1.0`...
fn is_libpython(path: &Path) -> bool {
    path.file_name().and_then(|n| n.to_str()).is_some_and(|name| name.starts_with("libpython") && name.contains(".so"))
}

fn map_proc_error(pid: u32, what: &'static str, cause: procfs::ProcError) -> TargetError {
    match cause {
        // Missing from the start: no such process; missing later: it exited
        // while being inspected.
        procfs::ProcError::NotFound(_) if what == "the /proc entry" => TargetError::NoSuchProcess { pid },
        procfs::ProcError::NotFound(_) => TargetError::Exited { pid },
        procfs::ProcError::PermissionDenied(path) if crate::privileges::is_root() => {
            let path = path.map_or_else(|| format!("/proc/{pid}"), |p| p.display().to_string());
            let missing = crate::privileges::lacking_capabilities_of(pid);
            if missing.is_empty() {
                TargetError::AccessDenied { pid, path }
            } else {
                TargetError::CapabilitiesLacking { pid, path, missing: missing.join(", ") }
            }
        }
        // Not running as root is the likely cause of anything else, unless
        // tracer is root.
        cause => {
            let hint = match (&cause, crate::privileges::is_root()) {
                (_, true) => "",
                (procfs::ProcError::PermissionDenied(_), false) => {
                    "; as another user than root, tracer needs CAP_SYS_PTRACE to inspect another user's process: grant it, or run tracer with sudo"
                }
                (_, false) => "; tracer must run as root",
            };
            TargetError::Proc { pid, what, cause, hint }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_libpython_names() {
        for yes in
            ["/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0", "/opt/py/lib/libpython3.13t.so.1.0", "libpython3.12d.so"]
        {
            assert!(is_libpython(Path::new(yes)), "{yes}");
        }
        for no in ["/usr/bin/python3.11", "/usr/lib/libpythonish.a", "/lib/libc.so.6"] {
            assert!(!is_libpython(Path::new(no)), "{no}");
        }
    }

    #[test]
    fn own_pid_is_refused() {
        let err = Target::inspect(std::process::id()).unwrap_err();
        assert!(matches!(err, TargetError::OwnProcess { .. }), "{err}");
    }

    /// Whether this process may follow `/proc/PID/map_files/` entries:
    /// `CAP_SYS_ADMIN` (21) or `CAP_CHECKPOINT_RESTORE` (40) in `CapEff`.
    fn may_follow_map_files() -> bool {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:")).unwrap().trim();
        let caps = u64::from_str_radix(hex, 16).unwrap();
        caps & (1 << 21 | 1 << 40) != 0
    }

    /// The identity the maps give the first mapping of `path` here.
    fn own_mapping_id(path: &Path) -> FileId {
        let maps = Process::myself().unwrap().maps().unwrap();
        let m = maps.iter().find(|m| matches!(&m.pathname, MMapPath::Path(p) if p == path)).expect("mapped");
        mapping_id(m)
    }

    /// On btrfs the device `/proc/PID/maps` shows is the file system's, and
    /// stat's the subvolume's: through `map_files` the right file is reached
    /// all the same, by its plain path. Without the capability `map_files`
    /// needs, only the device and inode are left, and they do not match.
    #[test]
    fn a_mapped_file_is_reached_whatever_device_the_maps_show() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let (dev, ino) = own_mapping_id(&exe);
        assert_eq!(file_id(&exe), Some((dev, ino)), "this file system agrees with itself");
        let me = Root::Process(std::process::id());
        assert_eq!(me.reach(&exe, Some((dev, ino))), Some(exe.clone()));
        let elsewhere = (dev ^ 0x7f, ino);
        let expected = may_follow_map_files().then_some(exe.clone());
        assert_eq!(me.reach(&exe, Some(elsewhere)), expected);
    }

    /// A mapped file deleted since (a package upgrade replaces the
    /// interpreter under a running process) is reachable only through its
    /// `map_files` entry, and that entry is the file as mapped.
    #[test]
    fn a_deleted_mapped_file_is_reached_through_map_files() {
        use std::os::fd::AsRawFd as _;
        let path = std::env::temp_dir().join(format!("tracer-map-files-{}", std::process::id()));
        std::fs::write(&path, b"the mapped bytes").unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: a fresh private read-only mapping of a file we opened;
        // it is unmapped below and nothing else uses it.
        let at =
            unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0) };
        assert_ne!(at, libc::MAP_FAILED);
        drop(file);
        std::fs::remove_file(&path).unwrap();
        let shown = PathBuf::from(format!("{} (deleted)", path.display()));
        let id = own_mapping_id(&shown);
        let reached = Root::Process(std::process::id()).reach(&shown, Some(id));
        let read = reached.as_deref().map(std::fs::read);
        // SAFETY: the mapping made above, of that length.
        let unmapped = unsafe { libc::munmap(at, 4096) };
        if may_follow_map_files() {
            let start = at as usize;
            let entry = format!("/proc/{}/map_files/{start:x}-{:x}", std::process::id(), start + 4096);
            assert_eq!(reached, Some(PathBuf::from(entry)));
            assert_eq!(read.unwrap().unwrap(), b"the mapped bytes");
        } else {
            assert_eq!(reached, None);
        }
        assert_eq!(unmapped, 0);
    }

    #[test]
    fn file_offsets_map_through_the_image_mappings() {
        let target = Target {
            pid: 1,
            comm: String::new(),
            image_path: PathBuf::from("/lib/libpython3.11.so"),
            host_path: PathBuf::from("/proc/1/root/lib/libpython3.11.so"),
            elf: ElfImage::open(&std::env::current_exe().unwrap()).unwrap(),
            image_maps: vec![
                Mapping { start: 0x7f00_0000, end: 0x7f00_1000, offset: 0, path: "/lib/libpython3.11.so".into() },
                Mapping { start: 0x7f00_1000, end: 0x7f00_5000, offset: 0x1000, path: "/lib/libpython3.11.so".into() },
            ],
            code_files: Vec::new(),
            ns_pid: None,
        };
        assert_eq!(target.address_of_file_offset(0x10), Some(0x7f00_0010));
        assert_eq!(target.address_of_file_offset(0x1234), Some(0x7f00_1234));
        assert_eq!(target.address_of_file_offset(0x9000), None);
    }
}
