//! What a probe counts.

/// Calls and requested bytes of one probed function, one slot per CPU.
///
/// The slot index is the probe's BPF cookie, which the loader sets at attach
/// time, so one BPF program serves every function of the same shape.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counter {
    /// Number of hits.
    pub calls: u64,
    /// Sum of requested bytes (0 for functions that do not allocate).
    pub bytes: u64,
}

const _: () = assert!(core::mem::size_of::<Counter>() == 16);

impl Counter {
    /// Adds another CPU's slot, saturating rather than wrapping: a wrapped
    /// total would look like a plausible small number.
    #[must_use]
    pub const fn merged(self, other: Self) -> Self {
        Self { calls: self.calls.saturating_add(other.calls), bytes: self.bytes.saturating_add(other.bytes) }
    }
}

/// Upper bound on probe slots; the loader sizes the map to the probes it
/// actually attaches.
pub const MAX_PROBE_SLOTS: u32 = 1024;

#[cfg(feature = "user")]
// SAFETY: Counter is #[repr(C)], Copy, has no padding (asserted above) and
// every bit pattern is a valid pair of u64.
unsafe impl aya::Pod for Counter {}
