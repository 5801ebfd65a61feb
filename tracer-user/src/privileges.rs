//! Whether this process may load BPF programs and open uprobe perf events.

use thiserror::Error;

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Missing privileges.
#[derive(Debug, Error)]
pub enum PrivilegeError {
    #[error(
        "tracer needs root (or CAP_BPF and CAP_PERFMON) to load BPF programs and attach uprobes, and uid {uid} has neither; run it with sudo"
    )]
    NotPrivileged { uid: u32 },
    #[error("cannot read this process's capabilities from /proc/self/status: {0}")]
    Status(std::io::Error),
}

impl crate::error::Classify for PrivilegeError {
    /// Who runs tracer, and with what, is the user's to change.
    fn is_bad_input(&self) -> bool {
        match self {
            Self::NotPrivileged { .. } | Self::Status(_) => true,
        }
    }
}

/// Checks the effective capability set (not the uid: a root process can
/// have dropped its capabilities, and a non-root one can hold them).
pub fn check() -> Result<(), PrivilegeError> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(PrivilegeError::Status)?;
    let caps = effective_caps(&status).unwrap_or(0);
    if has_needed_caps(caps) {
        Ok(())
    } else {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        Err(PrivilegeError::NotPrivileged { uid })
    }
}

fn effective_caps(status: &str) -> Option<u64> {
    caps_field(status, "CapEff:")
}

fn caps_field(status: &str, field: &str) -> Option<u64> {
    let hex = status.lines().find_map(|line| line.strip_prefix(field))?.trim();
    u64::from_str_radix(hex, 16).ok()
}

/// Whether this process runs as uid 0.
#[must_use]
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The capabilities `pid` is permitted that this process lacks: the
/// kernel's ptrace access check (which guards `/proc/PID/maps`) passes
/// when the inspector's capabilities include all of the target's. Empty
/// when there are none, or when either set cannot be read. (That check also
/// passes with `CAP_SYS_PTRACE`, which does not help here: in this
/// project's sandbox root holds it and is still refused PID 1, which holds
/// `CAP_SYS_RESOURCE` and root does not.)
#[must_use]
pub fn lacking_capabilities_of(pid: u32) -> Vec<String> {
    let read = |path: String| std::fs::read_to_string(path).ok();
    let (Some(mine), Some(theirs)) = (
        crate::capabilities::given().or_else(|| read("/proc/self/status".to_owned()).and_then(|s| effective_caps(&s))),
        read(format!("/proc/{pid}/status")).and_then(|s| caps_field(&s, "CapPrm:")),
    ) else {
        return Vec::new();
    };
    (0..64u32).filter(|bit| theirs & !mine & (1u64 << bit) != 0).map(capability_name).collect()
}

/// `cap_sys_resource` for 24, from include/uapi/linux/capability.h.
fn capability_name(bit: u32) -> String {
    const NAMES: [&str; 41] = [
        "chown",
        "dac_override",
        "dac_read_search",
        "fowner",
        "fsetid",
        "kill",
        "setgid",
        "setuid",
        "setpcap",
        "linux_immutable",
        "net_bind_service",
        "net_broadcast",
        "net_admin",
        "net_raw",
        "ipc_lock",
        "ipc_owner",
        "sys_module",
        "sys_rawio",
        "sys_chroot",
        "sys_ptrace",
        "sys_pacct",
        "sys_admin",
        "sys_boot",
        "sys_nice",
        "sys_resource",
        "sys_time",
        "sys_tty_config",
        "mknod",
        "lease",
        "audit_write",
        "audit_control",
        "setfcap",
        "mac_override",
        "mac_admin",
        "syslog",
        "wake_alarm",
        "block_suspend",
        "audit_read",
        "perfmon",
        "bpf",
        "checkpoint_restore",
    ];
    usize::try_from(bit)
        .ok()
        .and_then(|b| NAMES.get(b))
        .map_or_else(|| format!("capability {bit}"), |n| format!("cap_{n}"))
}

/// `CAP_SYS_ADMIN` covers both on kernels before 5.8; from 5.8 `CAP_BPF` plus
/// `CAP_PERFMON` suffice.
fn has_needed_caps(caps: u64) -> bool {
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cap_eff() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(effective_caps(status), Some(0x1ff_ffff_ffff));
        assert_eq!(effective_caps("Name: x\n"), None);
    }

    #[test]
    fn names_capabilities() {
        assert_eq!(capability_name(24), "cap_sys_resource");
        assert_eq!(capability_name(40), "cap_checkpoint_restore");
        assert_eq!(capability_name(63), "capability 63");
    }

    #[test]
    fn needs_sys_admin_or_bpf_and_perfmon() {
        assert!(has_needed_caps(1 << CAP_SYS_ADMIN));
        assert!(has_needed_caps((1 << CAP_BPF) | (1 << CAP_PERFMON)));
        assert!(!has_needed_caps(1 << CAP_BPF));
        assert!(!has_needed_caps(1 << CAP_PERFMON));
        assert!(!has_needed_caps(0));
    }
}
