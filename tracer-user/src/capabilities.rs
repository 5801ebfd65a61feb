//! The capabilities tracer keeps: at the start of `main`, before any thread
//! exists, the bounding, permitted, effective and inheritable sets (and with
//! them the ambient set) are narrowed to [`STARTUP`], what some part of
//! tracer needs; once every probe is attached, the threads that live on
//! narrow themselves further ([`RUNNING`], [`CENSUS`], nothing).
//!
//! Linux keeps capabilities per thread, and a thread cannot change
//! another's: a thread inherits its creator's sets when it is made, so
//! each long-lived thread started before the drop narrows itself
//! ([`keep_only`]) once its setup is done, and every thread started after
//! it inherits the narrower sets. docs/attach.md ("Privileges") lists the
//! sets, and `tests/tests/capabilities.rs` reads them from
//! `/proc/PID/task/*/status` while tracer is attached.
//!
//! Only raw `capget`, `capset` and `prctl` are used: each call is one
//! system call on this thread, which a library would only wrap.

use thiserror::Error;

/// `CAP_DAC_OVERRIDE` (include/uapi/linux/capability.h).
pub const DAC_OVERRIDE: u32 = 1;
/// `CAP_DAC_READ_SEARCH`.
pub const DAC_READ_SEARCH: u32 = 2;
/// `CAP_SETPCAP`: needed to drop from the bounding set.
const SETPCAP: u32 = 8;
/// `CAP_NET_BIND_SERVICE`.
pub const NET_BIND_SERVICE: u32 = 10;
/// `CAP_NET_ADMIN`.
pub const NET_ADMIN: u32 = 12;
/// `CAP_SYS_CHROOT`.
pub const SYS_CHROOT: u32 = 18;
/// `CAP_SYS_PTRACE`.
pub const SYS_PTRACE: u32 = 19;
/// `CAP_SYS_ADMIN`.
pub const SYS_ADMIN: u32 = 21;
/// `CAP_PERFMON`.
pub const PERFMON: u32 = 38;
/// `CAP_BPF`.
pub const BPF: u32 = 39;
/// `CAP_CHECKPOINT_RESTORE`.
pub const CHECKPOINT_RESTORE: u32 = 40;

/// The set of `caps`, one bit each.
#[must_use]
pub const fn set_of(caps: &[u32]) -> u64 {
    let mut set = 0u64;
    let mut i = 0;
    while i < caps.len() {
        set |= 1 << caps[i];
        i += 1;
    }
    set
}

/// What some part of tracer needs, each for a reason found in the code:
/// - `CAP_BPF`, `CAP_PERFMON`: loading the programs, making maps, opening
///   uprobe and tracepoint perf events and links (kernel/);
/// - `CAP_SYS_ADMIN`: the uprobe perf events on this project's kernels,
///   growth's tracefs mounted in a mount namespace of its own
///   (kernel/mapped.rs), `/proc/PID/map_files` (discover/process.rs);
/// - `CAP_CHECKPOINT_RESTORE`: `/proc/PID/map_files` without
///   `CAP_SYS_ADMIN` (`tracer heap` and `tracer stack` as another user);
/// - `CAP_SYS_PTRACE`: the target's memory (`process_vm_readv`, never
///   `/proc/PID/mem`), maps and root, `tracer heap --stop`'s ptrace;
/// - `CAP_DAC_READ_SEARCH`: the target's files where only their owner can
///   read them (a pyenv under /root);
/// - `CAP_DAC_OVERRIDE`: output files in a directory of another user;
/// - `CAP_NET_ADMIN`: registering for the kernel's exit records
///   (run/exits.rs) and their receive buffer (`SO_RCVBUFFORCE`);
/// - `CAP_NET_BIND_SERVICE`: `--listen` on a port below 1024.
///
/// `tracer bench --root` keeps `CAP_SYS_CHROOT` in its bounding set too
/// (see [`narrow_at_start`]): the chroot(8) it runs as root gets it from
/// there, and tracer itself never holds it.
///
/// Nothing else: signals go only to tracer's own children (`tracer run`'s
/// program, `--all`'s tracers), the open-file limit is raised only up to
/// its hard limit, and nothing changes user or group.
pub const STARTUP: u64 = set_of(&[
    DAC_OVERRIDE,
    DAC_READ_SEARCH,
    NET_BIND_SERVICE,
    NET_ADMIN,
    SYS_PTRACE,
    SYS_ADMIN,
    PERFMON,
    BPF,
    CHECKPOINT_RESTORE,
]);

/// What the main thread keeps once every probe is attached, and the
/// threads it starts later: [`STARTUP`] less what only the setup used
/// (the exit records' registration, the metrics port's bind). The rest
/// stays: the duty cycle attaches and detaches uprobes every window, a
/// module mapped late is attached when seen, growth's programs are
/// priced and dropped, the target's memory and files are read, and the
/// output files are written at the end.
pub const RUNNING: u64 = STARTUP & !set_of(&[NET_ADMIN, NET_BIND_SERVICE]);

/// What the census thread keeps once it has opened the target's heap: its
/// memory and `/proc` files, of a process of any user.
pub const CENSUS: u64 = set_of(&[DAC_OVERRIDE, DAC_READ_SEARCH, SYS_PTRACE]);

/// Why the capabilities could not be narrowed.
#[derive(Debug, Error)]
pub enum CapabilityError {
    #[error("cannot read this thread's capabilities (capget): {0}")]
    Get(std::io::Error),
    #[error("cannot narrow this thread's capabilities (capset): {0}")]
    Set(std::io::Error),
    #[error("cannot drop capability {cap} from the bounding set: {cause}")]
    Bound { cap: u32, cause: std::io::Error },
}

impl crate::error::Classify for CapabilityError {
    /// Dropping capabilities is always allowed: a refusal is the system's.
    fn is_bad_input(&self) -> bool {
        false
    }
}

/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit sets, in two 32-bit halves.
const VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct Header {
    version: u32,
    /// 0: the calling thread.
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// One thread's sets, 64 bits each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sets {
    pub effective: u64,
    pub permitted: u64,
    pub inheritable: u64,
}

/// The calling thread's sets.
pub fn current() -> Result<Sets, CapabilityError> {
    let mut header = Header { version: VERSION_3, pid: 0 };
    let mut data = [Data::default(); 2];
    // SAFETY: capget writes two `Data` (version 3) through a valid pointer
    // to an array of two, and reads the header, both live for the call.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &raw mut header, data.as_mut_ptr()) };
    if rc != 0 {
        return Err(CapabilityError::Get(std::io::Error::last_os_error()));
    }
    let join = |low: u32, high: u32| u64::from(low) | (u64::from(high) << 32);
    Ok(Sets {
        effective: join(data[0].effective, data[1].effective),
        permitted: join(data[0].permitted, data[1].permitted),
        inheritable: join(data[0].inheritable, data[1].inheritable),
    })
}

/// Narrows the calling thread's effective, permitted and inheritable sets
/// to `keep` (the kernel lowers the ambient set with them). Never raises
/// anything: a capability the thread lacks stays lacking.
pub fn keep_only(keep: u64) -> Result<(), CapabilityError> {
    let now = current()?;
    let wanted =
        Sets { effective: now.effective & keep, permitted: now.permitted & keep, inheritable: now.inheritable & keep };
    if wanted == now {
        return Ok(());
    }
    set(wanted)
}

fn set(sets: Sets) -> Result<(), CapabilityError> {
    let mut header = Header { version: VERSION_3, pid: 0 };
    #[allow(clippy::cast_possible_truncation, reason = "the two 32-bit halves of each set, as capset takes them")]
    let half = |set: u64, high: bool| if high { (set >> 32) as u32 } else { set as u32 };
    let data = [false, true].map(|high| Data {
        effective: half(sets.effective, high),
        permitted: half(sets.permitted, high),
        inheritable: half(sets.inheritable, high),
    });
    // SAFETY: capset reads the header and two `Data` (version 3), which
    // live for the call.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &raw mut header, data.as_ptr()) };
    if rc != 0 {
        return Err(CapabilityError::Set(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// At the start of `main`, before any thread exists: with `bound`, drops
/// from the bounding set everything outside [`STARTUP`] (where this
/// thread may: root holds `CAP_SETPCAP`; another user usually does not,
/// and its bounding set stays as it was given), then narrows this
/// thread's sets, and with them the ambient set, to [`STARTUP`]. Every
/// thread and child made later inherits them: a child tracer (`--all`) or
/// the `cat` that reads tracefs run as root get at most the bounding set,
/// and as another user their ambient capabilities. Without `bound` (`tracer
/// run`), a program started as root gets what root gets. `extra` stays in
/// the bounding set beside [`STARTUP`], for children only (`tracer bench
/// --root`'s chroot(8) needs `CAP_SYS_CHROOT`, and its unshare(1)
/// `CAP_SYS_ADMIN`, which is in [`STARTUP`]).
pub fn narrow_at_start(bound: bool, extra: u64) -> Result<(), CapabilityError> {
    let now = current()?;
    let _ = GIVEN.set(now.effective);
    let kept = STARTUP | extra;
    if bound && now.effective & (1 << SETPCAP) != 0 {
        for cap in 0..64u32 {
            if kept & (1 << cap) != 0 {
                continue;
            }
            // SAFETY: prctl with two integer arguments.
            let held = unsafe { libc::prctl(libc::PR_CAPBSET_READ, libc::c_ulong::from(cap)) };
            if held != 1 {
                // 0: not in the set; -1 (EINVAL): past the kernel's last
                // capability.
                continue;
            }
            // SAFETY: as above.
            if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap)) } != 0 {
                return Err(CapabilityError::Bound { cap, cause: std::io::Error::last_os_error() });
            }
        }
    }
    keep_only(STARTUP)
}

/// The effective set tracer was started with, before
/// [`narrow_at_start`]: what the place it runs in grants it, against
/// which a process tracer is refused is judged
/// ([`crate::privileges::lacking_capabilities_of`]): what tracer gave up
/// itself is no reason to send the user elsewhere.
static GIVEN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// The effective set tracer was started with, if it has narrowed its own.
#[must_use]
pub fn given() -> Option<u64> {
    GIVEN.get().copied()
}

/// The bounding set of the calling thread.
#[must_use]
pub fn bounding() -> u64 {
    (0..64u32)
        // SAFETY: prctl with two integer arguments.
        .filter(|&cap| unsafe { libc::prctl(libc::PR_CAPBSET_READ, libc::c_ulong::from(cap)) } == 1)
        .fold(0, |set, cap| set | (1 << cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sets_nest() {
        assert_eq!(RUNNING & !STARTUP, 0);
        assert_eq!(CENSUS & !RUNNING, 0);
        assert_eq!((STARTUP, RUNNING), (0x01c0_0028_1406, 0x01c0_0028_0006), "{STARTUP:#x} {RUNNING:#x}");
    }

    /// On a thread of its own (the test harness's threads are shared):
    /// narrowing keeps exactly the intersection, and never raises.
    #[test]
    fn keep_only_narrows_this_thread_alone() {
        let before = current().expect("capget");
        let inner = std::thread::spawn(move || {
            keep_only(CENSUS).expect("capset");
            let after = current().expect("capget");
            assert_eq!(after.effective, before.effective & CENSUS);
            assert_eq!(after.permitted, before.permitted & CENSUS);
            keep_only(u64::MAX).expect("capset");
            assert_eq!(current().expect("capget"), after, "nothing raised");
        })
        .join();
        assert!(inner.is_ok());
        assert_eq!(current().expect("capget"), before, "the other thread's sets are its own");
    }
}
