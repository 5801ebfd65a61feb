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
    let hex = status.lines().find_map(|line| line.strip_prefix("CapEff:"))?.trim();
    u64::from_str_radix(hex, 16).ok()
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
    fn needs_sys_admin_or_bpf_and_perfmon() {
        assert!(has_needed_caps(1 << CAP_SYS_ADMIN));
        assert!(has_needed_caps((1 << CAP_BPF) | (1 << CAP_PERFMON)));
        assert!(!has_needed_caps(1 << CAP_BPF));
        assert!(!has_needed_caps(1 << CAP_PERFMON));
        assert!(!has_needed_caps(0));
    }
}
