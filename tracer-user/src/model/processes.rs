//! `--all`'s view of the host: each traced process with what a user
//! recognises it by, and each interpreter traced.

use serde::{Deserialize, Serialize};

/// A traced process as `--all` shows it, keyed by its host PID. Every
/// string is the process's own (its command line, its cgroup), bounded
/// when read ([`crate::text::bound`]) and escaped where a table shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// Its PID in its own PID namespace (a container's), where that
    /// differs from the host PID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_in_namespace: Option<u32>,
    /// Its cgroup (v2) path, which names a container for the runtimes that
    /// give each its own (`/system.slice/docker-ID.scope`,
    /// `/kubepods/...`); `null` where it could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// Its root where that is not the host's (a chroot, or a container's
    /// file system), as tracer reaches it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// Its arguments joined by spaces; empty where it exited before tracer
    /// read it.
    pub command: String,
    /// The interpreter image it runs, as tracer opens it.
    pub image: String,
    /// Why a CPython process is not traced (its interpreter is out of
    /// tracer's reach, say), with what to do instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

/// An interpreter `--all` traces: one `tracer attach --exe` of its own.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InterpreterInfo {
    /// The image with the probed functions, as tracer opens it.
    pub image: String,
    pub version: String,
    /// When its probes went live, in seconds since `--all` attached: an
    /// interpreter first seen later is counted from then on.
    pub since_s: f64,
    /// The probed functions.
    pub probes: Vec<String>,
    /// Optional probes this build lacks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
}
