//! Requested sizes in log2 buckets, per allocator domain: bucket 0 holds
//! size 0, bucket b (1–64) the sizes from 2^(b−1) to 2^b − 1.

/// The allocator domains, in the index order of the sizes map.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Domain {
    /// `PyObject_Malloc` and its family.
    Object = 0,
    /// `PyMem_Malloc` and its family.
    Mem = 1,
    /// `PyMem_RawMalloc` and its family.
    Raw = 2,
    /// libc's `malloc` and its family, with `--native`: what the process
    /// asks of libc, the interpreter's raw domain included.
    Native = 3,
}

/// Number of domains.
pub const DOMAINS: u32 = 4;
/// Buckets per domain.
pub const BUCKETS: u32 = 65;
/// The slot-domains map's value for a probe that requests no size.
pub const NO_DOMAIN: u32 = u32::MAX;
/// Default size of the slot-domains map in the object file; the loader sets
/// it to the number of probes.
pub const DEFAULT_SLOTS: u32 = 64;

impl Domain {
    /// Every domain, in map order.
    pub const ALL: [Self; DOMAINS as usize] = [Self::Object, Self::Mem, Self::Raw, Self::Native];

    /// Its name in the JSON output.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Object => "object",
            Self::Mem => "mem",
            Self::Raw => "raw",
            Self::Native => "native",
        }
    }
}

/// The bucket of `size`.
#[must_use]
#[inline]
pub const fn bucket(size: u64) -> u32 {
    64 - size.leading_zeros()
}

/// The smallest and largest size in `bucket`.
#[must_use]
pub const fn bounds(bucket: u32) -> (u64, u64) {
    match bucket {
        0 => (0, 0),
        64.. => (1 << 63, u64::MAX),
        b => (1 << (b - 1), (1 << b) - 1),
    }
}

/// The sizes map's index of `bucket` in `domain` (given as its `u32`).
#[must_use]
#[inline]
pub const fn index(domain: u32, bucket: u32) -> u32 {
    domain * BUCKETS + bucket
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two() {
        assert_eq!([bucket(0), bucket(1), bucket(2), bucket(3), bucket(4)], [0, 1, 2, 2, 3]);
        assert_eq!((bucket(1000), bounds(10)), (10, (512, 1023)));
        assert_eq!((bucket(u64::MAX), bounds(64)), (64, (1 << 63, u64::MAX)));
        for b in 1..BUCKETS {
            let (lo, hi) = bounds(b);
            assert_eq!((bucket(lo), bucket(hi)), (b, b));
        }
        assert_eq!(index(Domain::Native as u32, 64), DOMAINS * BUCKETS - 1);
    }
}
