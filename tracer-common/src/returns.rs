//! What a return probe records: the value an allocator returned.

/// Returns of one probed function in one process, one value per CPU, keyed
/// by the same [`crate::counter::CounterKey`] as its calls.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Returned {
    /// Number of returns seen.
    pub returns: u64,
    /// How many of them returned NULL (a failed allocation).
    pub null: u64,
    /// Wrapping sum of the returned pointers: lets a caller that knows the
    /// pointers it got check that every one was read right.
    pub pointer_sum: u64,
}

const _: () = assert!(core::mem::size_of::<Returned>() == 24);

impl Returned {
    /// Adds another CPU's slot. Counts saturate; the pointer sum wraps, as
    /// it does on the BPF side.
    #[must_use]
    pub const fn merged(self, other: Self) -> Self {
        Self {
            returns: self.returns.saturating_add(other.returns),
            null: self.null.saturating_add(other.null),
            pointer_sum: self.pointer_sum.wrapping_add(other.pointer_sum),
        }
    }
}

#[cfg(feature = "user")]
// SAFETY: Returned is #[repr(C)], Copy, has no padding (asserted above) and
// every bit pattern is a valid triple of u64.
unsafe impl aya::Pod for Returned {}
