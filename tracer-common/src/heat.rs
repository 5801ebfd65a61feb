//! Where the hits land: hits per probe site, by the low bits of its
//! address, so that the budget's windows can put the hottest sites in last
//! and take them out first (the kernel writes a uprobe-multi link's
//! breakpoints in and out one by one, in the link's order, about 60 µs
//! each here, while the target runs into those still in place).
//!
//! A site's address in the target and its offset in its file agree in
//! their low 12 bits (a file is mapped a page at a time), so the loader
//! finds a site's bucket from its file offset without the load address.
//! Sites that share a bucket share its heat: ordering is all it is for.

/// Buckets: one per address within a 4 KiB page.
pub const BUCKETS: usize = 4096;

/// Hits per bucket on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heat {
    pub hits: [u32; BUCKETS],
}

const _: () = assert!(core::mem::size_of::<Heat>() == BUCKETS * 4);

/// The bucket of a site at `address` (or at that file offset).
#[must_use]
#[inline]
#[allow(clippy::cast_possible_truncation, reason = "masked to 12 bits")]
pub const fn bucket(address: u64) -> usize {
    (address & (BUCKETS as u64 - 1)) as usize
}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, an array of u32 with no padding (size
// asserted), every bit pattern valid.
unsafe impl aya::Pod for Heat {}
