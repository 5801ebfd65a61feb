//! Growth of the C library's heap in the kernel (see
//! [`tracer_common::growth::MappedKey`]): the programs on the mapping
//! syscalls' tracepoints, one perf event per CPU each (a syscall
//! tracepoint fires for every process; the programs return at once for
//! any but the target); their samples read, and the target's break.
//!
//! A tracepoint's id is read from tracefs. Where tracefs is not mounted
//! (this machine's default), a child process mounts it in a mount
//! namespace of its own and reads the ids there: nothing is mounted on
//! the host, and nothing stays.

use std::{
    os::fd::{AsFd as _, FromRawFd as _, OwnedFd},
    os::unix::process::CommandExt as _,
    process::Command,
};

use aya::{
    maps::{HashMap, MapData},
    programs::TracePoint,
};
use thiserror::Error;
use tracer_common::{
    growth::{MappedKey, MappedSample},
    names,
};

use super::{AttachError, Session, gc::perf_link};

/// Where tracefs is usually mounted.
const TRACEFS: &str = "/sys/kernel/tracing";

/// Why the C library's heap cannot be watched: its programs could not be
/// loaded or attached.
#[derive(Debug, Error)]
pub enum MappedError {
    #[error("the syscall tracepoints' ids cannot be read from tracefs: {0}")]
    Ids(String),
    #[error("the program {name} on the tracepoint syscalls:{tracepoint} failed to {step}: {cause}")]
    Program { name: &'static str, tracepoint: &'static str, step: &'static str, cause: String },
    #[error("the break of PID {pid} cannot be seeded in the kernel: {cause}")]
    Seed { pid: u32, cause: String },
}

impl Session {
    /// Attaches the programs for `pid` (the session's target), then seeds
    /// its break from `brk` (read after the attach, so that no growth falls
    /// between; a `brk` seen meanwhile keeps its own). On failure nothing
    /// of them stays attached.
    pub fn attach_mapped(&mut self, pid: u32, brk: impl FnOnce() -> Option<u64>) -> Result<(), MappedError> {
        let tracepoints: Vec<&str> = names::programs::GROWTH_MAPPED.iter().map(|(_, t)| *t).collect();
        let ids = tracepoint_ids(&tracepoints)?;
        // A tracepoint runs its programs on every CPU once one perf event
        // of it holds them (the kernel keeps them per tracepoint: a second
        // event with the same program is refused).
        let cpus = aya::util::online_cpus().map_err(|(what, e)| MappedError::Ids(format!("{what}: {e}")))?;
        let cpu = cpus.first().copied().ok_or_else(|| MappedError::Ids("no CPU is online".to_owned()))?;
        let mut links = Vec::new();
        for ((name, tracepoint), id) in names::programs::GROWTH_MAPPED.into_iter().zip(ids) {
            let err = |step, cause: &dyn std::fmt::Display| MappedError::Program {
                name,
                tracepoint,
                step,
                cause: cause.to_string(),
            };
            let program: &mut TracePoint = self
                .ebpf
                .program_mut(name)
                .ok_or_else(|| err("be found", &"not in tracer's BPF object"))?
                .try_into()
                .map_err(|e| err("be found", &e))?;
            if program.fd().is_err() {
                super::multi::retry_interrupted(|| program.load(), super::multi::aya_eagain)
                    .map_err(|e| err("load", &e))?;
            }
            let fd = program.fd().map_err(|e| err("load", &e))?.as_fd().try_clone_to_owned();
            let fd = fd.map_err(|e| err("load", &e))?;
            let event = tracepoint_event(id, cpu).map_err(|e| err("open its perf event", &e))?;
            let link = perf_link(&fd, &event, 0).map_err(|e| err("attach", &e))?;
            links.extend([link, event]);
        }
        let brk = brk().ok_or_else(|| MappedError::Seed { pid, cause: "it is not in /proc".to_owned() })?;
        let map = self
            .ebpf
            .map_mut(names::GROWTH_BRK_MAP)
            .ok_or_else(|| MappedError::Seed { pid, cause: format!("no map {}", names::GROWTH_BRK_MAP) })?;
        let mut tops: HashMap<&mut MapData, u32, u64> =
            HashMap::try_from(map).map_err(|e| MappedError::Seed { pid, cause: e.to_string() })?;
        match tops.insert(pid, brk, u64::from(aya_obj::generated::BPF_NOEXIST)) {
            Ok(()) => {}
            Err(aya::maps::MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(MappedError::Seed { pid, cause: e.to_string() }),
        }
        self.mapped_links = links;
        Ok(())
    }

    /// Detaches them (with the rest of growth's probes, or alone).
    pub fn detach_mapped(&mut self) {
        self.mapped_links.clear();
    }

    /// Every mapped sample the programs keep (and lowering of a break).
    pub fn mapped_samples(&self) -> Result<Vec<(MappedKey, MappedSample)>, AttachError> {
        self.hash_entries(names::GROWTH_MAPPED_MAP)
    }

    /// `pid`'s break as its last `brk` left it.
    pub fn brk_top(&self, pid: u32) -> Result<Option<u64>, AttachError> {
        self.hash_get(names::GROWTH_BRK_MAP, &pid)
    }

    /// Removes the sample of `key` if it is still `sample`. Returns whether
    /// it removed it.
    pub fn remove_mapped_sample(&mut self, key: &MappedKey, sample: &MappedSample) -> Result<bool, AttachError> {
        self.remove_unchanged(names::GROWTH_MAPPED_MAP, key, sample)
    }
}

/// The ids of the `syscalls` group's tracepoints `names`, in order: from
/// tracefs where it is mounted, else from one a child mounts in a mount
/// namespace of its own.
fn tracepoint_ids(names: &[&str]) -> Result<Vec<u64>, MappedError> {
    let path = |root: &str, name: &str| format!("{root}/events/syscalls/{name}/id");
    let parse = |text: &str| -> Result<Vec<u64>, MappedError> {
        let ids: Vec<u64> = text.split_whitespace().filter_map(|w| w.parse().ok()).collect();
        if ids.len() == names.len() {
            Ok(ids)
        } else {
            Err(MappedError::Ids(format!("{} ids for {} tracepoints: {text:?}", ids.len(), names.len())))
        }
    };
    for root in [TRACEFS, "/sys/kernel/debug/tracing"] {
        let read: Result<Vec<String>, _> = names.iter().map(|n| std::fs::read_to_string(path(root, n))).collect();
        if let Ok(texts) = read {
            return parse(&texts.join(" "));
        }
    }
    let mut cat = Command::new("/bin/cat");
    cat.args(names.iter().map(|n| path(TRACEFS, n)));
    // SAFETY: the closure runs in the child between fork and exec and
    // makes only async-signal-safe system calls (unshare, mount) on
    // constant C strings.
    unsafe {
        cat.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWNS) != 0
                || libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
                || libc::mount(
                    c"nodev".as_ptr(),
                    c"/sys/kernel/tracing".as_ptr(),
                    c"tracefs".as_ptr(),
                    0,
                    std::ptr::null(),
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out =
        cat.output().map_err(|e| MappedError::Ids(format!("mounting tracefs in a mount namespace of its own: {e}")))?;
    if !out.status.success() {
        return Err(MappedError::Ids(format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim())));
    }
    parse(&String::from_utf8_lossy(&out.stdout))
}

/// A perf event of the tracepoint `id` on `cpu`, for every process (its
/// programs run on every CPU).
fn tracepoint_event(id: u64, cpu: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: perf_event_attr is plain integers and unions of integers,
    // for which all-zero is valid (and what the kernel wants unused).
    let mut attr: aya_obj::generated::perf_event_attr = unsafe { std::mem::zeroed() };
    attr.type_ = aya_obj::generated::perf_type_id::PERF_TYPE_TRACEPOINT as u32;
    attr.size = u32::try_from(size_of_val(&attr)).unwrap_or(u32::MAX);
    attr.config = id;
    attr.__bindgen_anon_1.sample_period = 1;
    attr.__bindgen_anon_2.wakeup_events = 1;
    let cpu = libc::c_int::try_from(cpu).map_err(std::io::Error::other)?;
    // SAFETY: attr is a valid perf_event_attr of the size it states.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            std::ptr::from_ref(&attr),
            -1 as libc::pid_t,
            cpu,
            -1 as libc::c_int,
            super::gc::PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = std::os::fd::RawFd::try_from(fd).map_err(std::io::Error::other)?;
    // SAFETY: perf_event_open returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
