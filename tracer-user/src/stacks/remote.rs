//! Reading another process's memory through `/proc/PID/mem`, kept open for
//! the many small reads a stack walk makes.

use std::{fs::File, os::unix::fs::FileExt as _};

use super::StackError;

/// The memory of one process.
#[derive(Debug)]
pub struct Remote {
    pid: u32,
    mem: File,
}

impl Remote {
    /// Opens `pid`'s memory (root, or ptrace access to `pid`).
    pub fn open(pid: u32) -> Result<Self, StackError> {
        let mem = File::open(format!("/proc/{pid}/mem")).map_err(|cause| StackError::OpenMemory { pid, cause })?;
        Ok(Self { pid, mem })
    }

    /// The process this reads.
    #[must_use]
    pub const fn pid(&self) -> u32 {
        self.pid
    }

    /// `len` bytes at `address`; `what` names them for the error.
    pub fn bytes(&self, address: u64, len: usize, what: &'static str) -> Result<Vec<u8>, StackError> {
        let mut buf = vec![0; len];
        self.mem.read_exact_at(&mut buf, address).map_err(|cause| {
            // An exited process's memory reads as empty, which the kernel
            // reports as a short read: name the real reason, not the EOF.
            if cause.kind() == std::io::ErrorKind::UnexpectedEof && !self.alive() {
                StackError::Exited { pid: self.pid, what }
            } else {
                StackError::Memory { pid: self.pid, address, what, cause }
            }
        })?;
        Ok(buf)
    }

    /// The little-endian `N`-byte word at `address`.
    fn word<const N: usize>(&self, address: u64, what: &'static str) -> Result<[u8; N], StackError> {
        let mut buf = [0; N];
        self.mem.read_exact_at(&mut buf, address).map_err(|cause| {
            // An exited process's memory reads as empty, which the kernel
            // reports as a short read: name the real reason, not the EOF.
            if cause.kind() == std::io::ErrorKind::UnexpectedEof && !self.alive() {
                StackError::Exited { pid: self.pid, what }
            } else {
                StackError::Memory { pid: self.pid, address, what, cause }
            }
        })?;
        Ok(buf)
    }

    /// Whether the process still has its memory: a zombie's or a reaped
    /// process's `exe` link cannot be read.
    fn alive(&self) -> bool {
        std::fs::read_link(format!("/proc/{}/exe", self.pid)).is_ok()
    }

    /// A pointer or other 8-byte field.
    pub fn u64(&self, address: u64, what: &'static str) -> Result<u64, StackError> {
        self.word(address, what).map(u64::from_le_bytes)
    }

    /// A 4-byte field (an `int`, a bit field's word).
    pub fn u32(&self, address: u64, what: &'static str) -> Result<u32, StackError> {
        self.word(address, what).map(u32::from_le_bytes)
    }

    /// A one-byte field (a `char`).
    pub fn u8(&self, address: u64, what: &'static str) -> Result<u8, StackError> {
        self.word::<1>(address, what).map(|[b]| b)
    }
}
