//! Reading another process's memory, for the many small reads a stack walk
//! makes: with `process_vm_readv` ([`crate::discover::process::read_exact`]),
//! which `CAP_SYS_PTRACE` suffices for, not through `/proc/PID/mem`.

use super::StackError;

/// The memory of one process.
#[derive(Debug)]
pub struct Remote {
    pid: u32,
}

impl Remote {
    /// `pid`'s memory (root, or ptrace access to `pid`): its first read
    /// says whether it can be read.
    #[must_use]
    pub const fn open(pid: u32) -> Self {
        Self { pid }
    }

    /// The process this reads.
    #[must_use]
    pub const fn pid(&self) -> u32 {
        self.pid
    }

    /// `len` bytes at `address`; `what` names them for the error.
    pub fn bytes(&self, address: u64, len: usize, what: &'static str) -> Result<Vec<u8>, StackError> {
        let mut buf = vec![0; len];
        self.fill(&mut buf, address, what)?;
        Ok(buf)
    }

    /// The little-endian `N`-byte word at `address`.
    fn word<const N: usize>(&self, address: u64, what: &'static str) -> Result<[u8; N], StackError> {
        let mut buf = [0; N];
        self.fill(&mut buf, address, what)?;
        Ok(buf)
    }

    fn fill(&self, buf: &mut [u8], address: u64, what: &'static str) -> Result<(), StackError> {
        crate::discover::process::read_exact(self.pid, address, buf).map_err(|cause| {
            // A process gone, or a zombie without memory: name the real
            // reason, not the read's error.
            if cause.raw_os_error() == Some(libc::ESRCH) || !self.alive() {
                StackError::Exited { pid: self.pid, what }
            } else {
                StackError::Memory { pid: self.pid, address, what, cause }
            }
        })
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
