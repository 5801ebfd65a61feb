//! uprobe-multi links: every probe of one program in one kernel link. They
//! are how tracer attaches by default, what `--budget` windows and call
//! sites need, and what makes detaching quick.
//!
//! A perf-event uprobe (what aya attaches) waits for a kernel grace period
//! when it is detached, under a kernel-wide mutex: about 0.13 s per probe on
//! the VM BENCHMARKS.md was measured on, one probe after another, so a window
//! of 14 probes could not end in less than about 1.8 s. A uprobe-multi link
//! (`BPF_TRACE_UPROBE_MULTI`, Linux 6.6) removes all of its breakpoints first
//! and then waits once. aya 0.14 cannot load a program for that attach type,
//! so this module loads tracer's own programs again from the embedded object
//! with aya-obj (relocated against the session's maps, so they count into
//! the same counters) and makes the two `bpf()` calls itself.

use std::{
    collections::HashSet,
    ffi::CString,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
    path::Path,
};

use aya_obj::generated::{bpf_attach_type, bpf_cmd, bpf_insn, bpf_prog_type};
use thiserror::Error;

/// `uprobe_multi.flags`: the offsets are uretprobes (include/uapi/linux/bpf.h).
const BPF_F_UPROBE_MULTI_RETURN: u32 = 1;

/// Why a uprobe-multi program or link could not be made.
#[derive(Debug, Error)]
pub enum MultiError {
    #[error("parsing the embedded BPF object: {0}")]
    Parse(String),
    #[error("the embedded BPF object has no program {name}")]
    NoProgram { name: &'static str },
    #[error("relocating {name}: {cause}")]
    Relocate { name: &'static str, cause: String },
    #[error("loading {name} for uprobe-multi links (needs Linux 6.6 or later): {cause}{log}")]
    Load { name: &'static str, cause: std::io::Error, log: String },
    #[error("attaching a uprobe-multi link of {name} to {path}: {cause}")]
    Link { name: &'static str, path: String, cause: std::io::Error },
}

impl MultiError {
    /// Whether the kernel lacks uprobe-multi links (before Linux 6.6, or
    /// built without them), as opposed to tracer failing to use them: only
    /// then may `--links auto` fall back to perf-event uprobes.
    #[must_use]
    pub fn is_unsupported(&self) -> bool {
        /// `ENOTSUPP`, which the kernel returns for some unsupported
        /// operations (include/linux/errno.h, not in libc).
        const ENOTSUPP: i32 = 524;
        match self {
            Self::Load { cause, .. } | Self::Link { cause, .. } => {
                matches!(cause.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS | ENOTSUPP))
            }
            Self::Parse(_) | Self::NoProgram { .. } | Self::Relocate { .. } => false,
        }
    }
}

/// The `prog_load` part of `union bpf_attr`, up to the last field used;
/// the rest is zero, as the kernel requires.
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    tail: [u64; 10],
}

/// The `link_create` part of `union bpf_attr` for `uprobe_multi`.
#[repr(C)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    pad: u32,
    tail: [u64; 8],
}

pub(super) fn bpf<T>(cmd: bpf_cmd, attr: &mut T) -> std::io::Result<OwnedFd> {
    let size = libc::c_long::try_from(size_of::<T>()).map_err(std::io::Error::other)?;
    // SAFETY: attr is a live, fully initialised #[repr(C)] value laid out as
    // the kernel's union bpf_attr for `cmd`, and its size is passed with it;
    // every pointer in it points into memory that outlives the call.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, cmd as libc::c_long, std::ptr::from_mut(attr), size) };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = RawFd::try_from(ret).map_err(|_| std::io::Error::other("fd out of range"))?;
    // SAFETY: on success these commands return a new fd that nothing else
    // owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Loads the program `name` from `object` for uprobe-multi links, with its
/// maps relocated to the fds in `maps` (by map name).
///
/// # Errors
/// When the object does not parse or relocate, or the kernel refuses it.
pub fn load(object: &[u8], name: &'static str, maps: &[(String, OwnedFd)]) -> Result<OwnedFd, MultiError> {
    let mut obj = aya_obj::Object::parse(object).map_err(|e| MultiError::Parse(e.to_string()))?;
    let text_sections: HashSet<usize> = obj.functions.keys().map(|(section, _)| *section).collect();
    let defs: Vec<(&str, RawFd, aya_obj::Map)> = maps
        .iter()
        .filter_map(|(map, fd)| obj.maps.get(map).map(|def| (map.as_str(), fd.as_raw_fd(), def.clone())))
        .collect();
    let relocate_err = |cause: String| MultiError::Relocate { name, cause };
    obj.relocate_maps(defs.iter().map(|(n, fd, def)| (*n, *fd, def)), &text_sections)
        .map_err(|e| relocate_err(e.to_string()))?;
    obj.relocate_calls(&text_sections).map_err(|e| relocate_err(e.to_string()))?;
    let program = obj.programs.get(name).ok_or(MultiError::NoProgram { name })?;
    let insns: &[bpf_insn] =
        &obj.functions.get(&program.function_key()).ok_or(MultiError::NoProgram { name })?.instructions;
    // The object's own license section: one string for both loaders.
    let license = obj.license.clone();
    let mut prog_name = [0u8; 16];
    for (dst, src) in prog_name.iter_mut().zip(name.bytes().take(15)) {
        *dst = src;
    }
    let attr = |log: &mut Vec<u8>, level| ProgLoadAttr {
        prog_type: bpf_prog_type::BPF_PROG_TYPE_KPROBE as u32,
        insn_cnt: u32::try_from(insns.len()).unwrap_or(u32::MAX),
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: level,
        log_size: u32::try_from(log.len()).unwrap_or(0),
        log_buf: if log.is_empty() { 0 } else { log.as_mut_ptr() as u64 },
        kern_version: 0,
        prog_flags: 0,
        prog_name,
        prog_ifindex: 0,
        expected_attach_type: bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32,
        tail: [0; 10],
    };
    match retry_interrupted(|| bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr(&mut Vec::new(), 0)), eagain) {
        Ok(fd) => Ok(fd),
        Err(cause) => {
            // Again with the verifier's log, for the error message.
            let mut log = vec![0u8; 1 << 16];
            let _ = bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr(&mut log, 1));
            let text = String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(0)]).into_owned();
            // The verifier ends with its statistics; the reason is the line
            // before them.
            let last = verifier_reason(&text).map(|l| format!(" ({l})")).unwrap_or_default();
            Err(MultiError::Load { name, cause, log: last })
        }
    }
}

/// The verifier's reason in its log: the last line before its statistics.
pub(super) fn verifier_reason(log: &str) -> Option<&str> {
    log.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("processed ") && !l.starts_with("verification time"))
}

/// How many times a program is loaded while the verifier is interrupted,
/// as libbpf does (`PROG_LOAD_ATTEMPTS`).
const LOAD_ATTEMPTS: usize = 5;

/// `load()` again while `interrupted` says its error is the verifier's
/// `EAGAIN`, at most [`LOAD_ATTEMPTS`] times in all. The verifier gives
/// up with `EAGAIN` when a signal arrives for tracer while it works (a
/// Ctrl-C during the attach: the handler has run by the time `bpf()`
/// returns), which says nothing about the program or the kernel: tried
/// again, the load goes on, and the signal ends the run as it ends any
/// other, with nothing left attached. Without this a Ctrl-C while a
/// large program verified failed the run with "Resource temporarily
/// unavailable" and blamed the kernel's version.
pub(crate) fn retry_interrupted<T, E>(
    mut load: impl FnMut() -> Result<T, E>,
    interrupted: impl Fn(&E) -> bool,
) -> Result<T, E> {
    let mut attempt = 1;
    loop {
        match load() {
            Err(e) if attempt < LOAD_ATTEMPTS && interrupted(&e) => attempt += 1,
            done => return done,
        }
    }
}

/// Whether a `bpf()` call failed with `EAGAIN`.
pub(crate) fn eagain(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::EAGAIN)
}

/// Whether aya's program load failed with the verifier's `EAGAIN`
/// ([`retry_interrupted`]).
pub(crate) fn aya_eagain(e: &aya::programs::ProgramError) -> bool {
    matches!(e, aya::programs::ProgramError::LoadError { io_error, .. } if eagain(io_error))
}

/// Whether this kernel has uprobe-multi links: [`probe_supported`]'s
/// answer (asked once), else whether it is Linux 6.6 or later.
#[must_use]
pub fn available() -> bool {
    use crate::plan::placement::{MULTI_LINKS, running_kernel};
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| probe_supported().unwrap_or_else(|| running_kernel() >= MULTI_LINKS))
}

/// Whether the kernel has uprobe-multi links, asked of it as libbpf does
/// (`probe_uprobe_multi_link`): a two-instruction program loaded for them,
/// then a link on `/`, which a kernel that has them refuses with `EBADF`
/// (not a regular file) and one without with `EINVAL` or `EOPNOTSUPP`.
/// Distributions backport them to older kernels, and a kernel may be built
/// without them, so the version alone does not say. `None` where tracer
/// may not ask (not root, no `CAP_BPF`) or the answer is neither.
#[must_use]
pub fn probe_supported() -> Option<bool> {
    let unsupported = |e: &std::io::Error| matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP));
    let program = match probe_program() {
        Ok(fd) => fd,
        Err(e) if unsupported(&e) => return Some(false),
        Err(_) => return None,
    };
    match link_on_root(&program, 0)? {
        Err(e) if e.raw_os_error() == Some(libc::EBADF) => Some(true),
        Err(e) if unsupported(&e) => Some(false),
        // A link on `/` made: not what any kernel does; it closes here.
        Ok(_) | Err(_) => None,
    }
}

/// Whether a uprobe-multi link's PID filter keeps a whole process, as
/// libbpf asks it: the first kernels with these links (Linux 6.6 to 6.9,
/// before "bpf: fix multi-uprobe PID filtering logic") kept the one thread
/// whose id is the PID, so the probes missed every other thread's calls.
/// The fix also refuses a negative PID with `EINVAL` before the path is
/// looked at; a kernel without it gets to the path, `/`, and says `EBADF`
/// (or `ESRCH`). `None` where it cannot be asked, or answers neither.
#[must_use]
pub fn probe_pid_filter() -> Option<bool> {
    let program = probe_program().ok()?;
    match link_on_root(&program, u32::MAX)? {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Some(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EBADF | libc::ESRCH)) => Some(false),
        Ok(_) | Err(_) => None,
    }
}

/// Whether this kernel's uprobe-multi links filter by process
/// ([`probe_pid_filter`], asked once); where it cannot tell, they are taken
/// to. Where they do not, [`attach`] attaches for every process and the
/// programs, which keep only the target's hits (`check_target`), filter.
#[must_use]
pub fn pid_filter_keeps_process() -> bool {
    static KEEPS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *KEEPS.get_or_init(|| probe_pid_filter().unwrap_or(true))
}

/// `r0 = 0; exit`, loaded for uprobe-multi links: what the feature probes
/// link.
fn probe_program() -> std::io::Result<OwnedFd> {
    // Each instruction's opcode is its first byte, its registers, offset
    // and immediate zero (as bytes, so on any byte order).
    let insns: [[u8; 8]; 2] = [[0xb7, 0, 0, 0, 0, 0, 0, 0], [0x95, 0, 0, 0, 0, 0, 0, 0]];
    let license = c"GPL";
    let mut load = ProgLoadAttr {
        prog_type: bpf_prog_type::BPF_PROG_TYPE_KPROBE as u32,
        insn_cnt: 2,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 0,
        log_size: 0,
        log_buf: 0,
        kern_version: 0,
        prog_flags: 0,
        prog_name: [0; 16],
        prog_ifindex: 0,
        expected_attach_type: bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32,
        tail: [0; 10],
    };
    // Asked once a run: a Ctrl-C while it verifies must not make the answer.
    retry_interrupted(|| bpf(bpf_cmd::BPF_PROG_LOAD, &mut load), eagain)
}

/// A link of `program` on `/` (offset 0) for `pid`: what no kernel makes,
/// and each refuses in its own way. `None` if the program's fd does not fit.
fn link_on_root(program: &OwnedFd, pid: u32) -> Option<std::io::Result<OwnedFd>> {
    let offsets = [0u64];
    let mut link = LinkCreateAttr {
        prog_fd: u32::try_from(program.as_raw_fd()).ok()?,
        target_fd: 0,
        attach_type: bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32,
        flags: 0,
        path: c"/".as_ptr() as u64,
        offsets: offsets.as_ptr() as u64,
        ref_ctr_offsets: 0,
        cookies: 0,
        cnt: 1,
        multi_flags: 0,
        pid,
        pad: 0,
        tail: [0; 8],
    };
    Some(bpf(bpf_cmd::BPF_LINK_CREATE, &mut link))
}

/// Attaches `program` at each `(file offset, cookie)` in `path`, for `pid`
/// only (0: every process); with `ret`, as uretprobes at those offsets.
/// Closing the returned fd detaches them all.
///
/// # Errors
/// When the kernel refuses the link.
pub fn attach(
    program: &OwnedFd,
    name: &'static str,
    path: &Path,
    (points, ret): (&[(u64, u64)], bool),
    pid: u32,
) -> Result<OwnedFd, MultiError> {
    link(program, name, path, (points, ret), None, pid)
}

/// As [`attach`], with a reference counter for each point: the file
/// offset of a USDT marker's semaphore (0 for none), which the kernel
/// raises by one in each process the probe is in for as long as it exists.
///
/// # Errors
/// When the kernel refuses the link.
pub fn attach_counted(
    program: &OwnedFd,
    name: &'static str,
    path: &Path,
    (points, ret): (&[(u64, u64)], bool),
    ref_ctrs: &[u64],
    pid: u32,
) -> Result<OwnedFd, MultiError> {
    link(program, name, path, (points, ret), Some(ref_ctrs), pid)
}

fn link(
    program: &OwnedFd,
    name: &'static str,
    path: &Path,
    (points, ret): (&[(u64, u64)], bool),
    ref_ctrs: Option<&[u64]>,
    pid: u32,
) -> Result<OwnedFd, MultiError> {
    let link_err = |cause| MultiError::Link { name, path: path.display().to_string(), cause };
    if ref_ctrs.is_some_and(|r| r.len() != points.len()) {
        return Err(link_err(std::io::Error::other("one reference counter per point is needed")));
    }
    let c_path = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| link_err(std::io::Error::other(e)))?;
    let offsets: Vec<u64> = points.iter().map(|p| p.0).collect();
    let cookies: Vec<u64> = points.iter().map(|p| p.1).collect();
    // A filter that would keep one thread of the process: none, and the
    // program keeps the process (the session's target; run::links says so).
    let pid = if pid_filter_keeps_process() { pid } else { 0 };
    let mut attr = LinkCreateAttr {
        prog_fd: u32::try_from(program.as_raw_fd()).map_err(|e| link_err(std::io::Error::other(e)))?,
        target_fd: 0,
        attach_type: bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32,
        flags: 0,
        path: c_path.as_ptr() as u64,
        offsets: offsets.as_ptr() as u64,
        ref_ctr_offsets: ref_ctrs.map_or(0, |r| r.as_ptr() as u64),
        cookies: cookies.as_ptr() as u64,
        cnt: u32::try_from(points.len()).unwrap_or(u32::MAX),
        multi_flags: u32::from(ret) * BPF_F_UPROBE_MULTI_RETURN,
        pid,
        pad: 0,
        tail: [0; 8],
    };
    bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr).map_err(link_err)
}

#[cfg(test)]
mod tests {
    use crate::plan::placement::{MULTI_LINKS, running_kernel};

    /// Run as root (as CI runs the unit tests): the kernel answers, a
    /// Linux 6.6 or later one built with uprobes and BPF events yes (an
    /// older one may have them backported), and `available` goes by it.
    #[test]
    fn the_kernel_is_asked_whether_it_has_uprobe_multi_links() {
        let answer = super::probe_supported().expect("an answer: run as root");
        if running_kernel() >= MULTI_LINKS {
            assert!(answer, "Linux 6.6 or later without uprobe-multi links");
        }
        assert_eq!(super::available(), answer);
    }

    /// The fix came with Linux 6.10 (and stable backports to 6.9): any
    /// kernel since filters by process, and says so.
    #[test]
    fn the_kernel_is_asked_whether_its_pid_filter_keeps_a_process() {
        let Some(answer) = super::probe_pid_filter() else {
            // Only a kernel without the links has nothing to say (as root).
            assert!(!super::available(), "a kernel with uprobe-multi links did not answer: run as root");
            return;
        };
        if running_kernel() >= (6, 10) {
            assert!(answer, "Linux 6.10 or later whose uprobe-multi PID filter keeps one thread");
        }
        assert_eq!(super::pid_filter_keeps_process(), answer);
    }

    /// A load the verifier gave up with `EAGAIN` (a signal arrived) is
    /// tried again, at most `LOAD_ATTEMPTS` times in all; any other
    /// error is returned at once.
    #[test]
    fn an_interrupted_load_is_tried_again() {
        use std::io::{Error, ErrorKind};
        let mut tries = 0;
        let eagain = || Error::from_raw_os_error(libc::EAGAIN);
        let loaded = super::retry_interrupted(
            || {
                tries += 1;
                if tries < 3 { Err(eagain()) } else { Ok(tries) }
            },
            super::eagain,
        );
        assert_eq!(loaded.ok(), Some(3));
        tries = 0;
        let always = super::retry_interrupted(
            || {
                tries += 1;
                Err::<(), _>(eagain())
            },
            super::eagain,
        );
        assert_eq!(always.map_err(|e| e.raw_os_error()), Err(Some(libc::EAGAIN)));
        assert_eq!(tries, super::LOAD_ATTEMPTS);
        tries = 0;
        let refused = super::retry_interrupted(
            || {
                tries += 1;
                Err::<(), _>(Error::from(ErrorKind::PermissionDenied))
            },
            super::eagain,
        );
        assert!(refused.is_err());
        assert_eq!(tries, 1);
    }
}
