//! What a probe counts.

/// Key of the counters map: which process hit which probe.
///
/// The slot is the probe's BPF cookie, which the loader sets at attach
/// time, so one BPF program serves every function of the same shape; the
/// tgid lets one attachment count many processes separately.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CounterKey {
    /// Thread-group id (the process id) that hit the probe.
    pub tgid: u32,
    /// Probe slot (the attach cookie).
    pub slot: u32,
}

const _: () = assert!(core::mem::size_of::<CounterKey>() == 8);

/// The counter slot of a native probe's nested calls (`--native`): its
/// calls made by another probed libc function, such as glibc's `realloc`
/// relaying `realloc(NULL, n)` to `malloc`, are counted under the probe's
/// slot with this bit set, not again under the slot itself.
pub const NESTED_SLOT: u32 = 1 << 31;

/// The counter slot of the passes of a probe's gated sites (a conditional
/// jump probed for the inlined copy it leads into) that went elsewhere:
/// no call, but a hit the target pays for, counted under the probe's slot
/// with this bit set so that the cost is priced with the probe's hits.
pub const GATE_SLOT: u32 = 1 << 30;

/// The counter slot of a probe's hits at its single-stepped sites, where
/// it has sites of both kinds (see [`crate::site::mark_stepped`]): counted
/// again apart, with no bytes, so that its hits are priced by what each
/// cost.
pub const STEPPED_SLOT: u32 = 1 << 29;

/// Default size of the nested-calls map (thread id to the slot of the call
/// in flight): an entry lives from a nested call site to the entry of the
/// function it calls, the next instruction that thread runs.
pub const DEFAULT_NESTED_ENTRIES: u32 = 4096;

/// Calls and requested bytes of one probed function in one process, one
/// value per CPU.
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

/// Default size of the counters map in the object file; the loader sets the
/// real size (processes × probes).
pub const DEFAULT_COUNTER_ENTRIES: u32 = 1024;

#[cfg(feature = "user")]
// SAFETY: CounterKey is #[repr(C)], Copy, has no padding (asserted above) and
// every bit pattern is a valid pair of u32.
unsafe impl aya::Pod for CounterKey {}

#[cfg(feature = "user")]
// SAFETY: Counter is #[repr(C)], Copy, has no padding (asserted above) and
// every bit pattern is a valid pair of u64.
unsafe impl aya::Pod for Counter {}
