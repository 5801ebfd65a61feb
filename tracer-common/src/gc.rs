//! Garbage collections: seen at CPython's SystemTap markers `gc__start`
//! (its argument: the generation) and `gc__done` (the objects found
//! unreachable), attached as USDT probes, or, in a build without them, at
//! the collection function's entry (the generation, an argument) and its
//! return (the same count, its return value).
//!
//! At a start the thread's collection in flight is recorded (by thread id);
//! at its done, the collection, its duration and its count are added to
//! its (process, generation). A start while the thread has one in flight,
//! and a done without one, are counted as misses.
//!
//! Where each argument is comes in the attach cookie, with the operands of
//! [`crate::site`] (a register, a constant, or memory at a register plus an
//! offset): the first operand is the argument, the second byte its width
//! ([`arg_width`]).

use crate::site;

/// Key of the totals map: a generation of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GcKey {
    /// Thread-group id (the process id) that collected.
    pub tgid: u32,
    /// The generation collected, as the start's argument said;
    /// [`UNKNOWN_GENERATION`] where it could not be read.
    pub generation: i32,
}

const _: () = assert!(core::mem::size_of::<GcKey>() == 8);

/// Collections of one generation in one process, one value per CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcTotals {
    /// Collections that ended (a done matched with its start).
    pub collections: u64,
    /// Their summed durations, start to done, in nanoseconds.
    pub duration_ns: u64,
    /// The objects they found unreachable, as the done's argument says.
    pub collected: u64,
}

const _: () = assert!(core::mem::size_of::<GcTotals>() == 24);

impl GcTotals {
    /// Adds another CPU's (or process's) values, saturating.
    #[must_use]
    pub const fn merged(self, other: Self) -> Self {
        Self {
            collections: self.collections.saturating_add(other.collections),
            duration_ns: self.duration_ns.saturating_add(other.duration_ns),
            collected: self.collected.saturating_add(other.collected),
        }
    }
}

/// The collection a thread has in flight, from its start.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcRunning {
    /// `bpf_ktime_get_ns` at the start.
    pub start_ns: u64,
    /// The process of the thread: a thread id another process had before
    /// (whose thread died mid-collection) is not its collection.
    pub tgid: u32,
    /// The generation the start said.
    pub generation: i32,
    /// Always 0: spells out the padding, so that the map holds no
    /// uninitialised bytes.
    pub reserved: u64,
}

const _: () = assert!(core::mem::size_of::<GcRunning>() == 24);

/// The generation of a collection whose start's argument could not be read
/// (or does not say: 3.13's automatic collections pass `GENERATION_AUTO`,
/// -1, to the collection function, which picks one itself).
pub const UNKNOWN_GENERATION: i32 = -1;

/// Default size of the totals map: 1024 processes with the three
/// generations and the unknown one.
pub const DEFAULT_GC_ENTRIES: u32 = 4 * 1024;

/// Size of the in-flight map, by thread: least recently used entries go
/// first, so that threads that died mid-collection cannot fill it (a done
/// whose start was pushed out is counted as unmatched).
pub const DEFAULT_GC_THREADS: u32 = 4096;

/// The width byte's flag for a signed argument (the `-` of `-4@%eax`).
pub const SIGNED: u8 = 0x80;

/// The cookie of a GC probe whose argument is operand `first` (as in
/// [`crate::site`]) with `constant`, `size` bytes wide (1, 2, 4 or 8),
/// signed or not.
#[must_use]
pub const fn arg_cookie(first: u8, size: u8, signed: bool, constant: u16) -> u64 {
    let width = (size & 0x0f) | if signed { SIGNED } else { 0 };
    site::encode(0, first, width, constant)
}

/// The argument's width in `cookie`: its size in bytes (1, 2, 4 or 8; any
/// other reads 8) and whether it is signed.
#[must_use]
pub const fn arg_width(cookie: u64) -> (u8, bool) {
    let width = site::second(cookie);
    (width & 0x0f, width & SIGNED != 0)
}

/// `raw`, the 8 bytes of a register or memory, cut to an argument of
/// `size` bytes, sign-extended if it is signed.
#[must_use]
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    reason = "cutting to the argument's width is the point"
)]
pub const fn narrow(raw: u64, size: u8, signed: bool) -> i64 {
    match (size, signed) {
        (1, true) => raw as i8 as i64,
        (1, false) => raw as u8 as i64,
        (2, true) => raw as i16 as i64,
        (2, false) => raw as u16 as i64,
        (4, true) => raw as i32 as i64,
        (4, false) => raw as u32 as i64,
        _ => raw as i64,
    }
}

#[cfg(feature = "user")]
// SAFETY: GcKey is #[repr(C)], Copy, has no padding (asserted above) and
// every bit pattern is a valid pair of 32-bit integers.
unsafe impl aya::Pod for GcKey {}

#[cfg(feature = "user")]
// SAFETY: GcTotals is #[repr(C)], Copy, has no padding (asserted above) and
// every bit pattern is a valid triple of u64.
unsafe impl aya::Pod for GcTotals {}

#[cfg(feature = "user")]
// SAFETY: GcRunning is #[repr(C)], Copy, has no padding (the padding is the
// named `reserved` field, asserted by the size above) and every bit
// pattern is valid.
unsafe impl aya::Pod for GcRunning {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_round_trip_and_narrow() {
        let c = arg_cookie(site::register(0).unwrap_or(site::NONE), 4, true, 0);
        assert_eq!((site::first(c), arg_width(c)), (1, (4, true)));
        let (first, offset) = site::memory(7, 112).unwrap_or_default();
        let c = arg_cookie(first, 8, false, offset);
        assert_eq!((site::first(c), arg_width(c), site::offset(site::constant(c))), (first, (8, false), 112));
        assert_eq!(narrow(0xffff_ffff, 4, true), -1);
        assert_eq!(narrow(0x1_0000_0002, 4, true), 2);
        assert_eq!(narrow(0xffff_ffff, 4, false), 0xffff_ffff);
        assert_eq!(narrow(u64::MAX, 8, true), -1);
        assert_eq!(narrow(0x180, 1, true), -128);
        assert_eq!(narrow(0x1_8000, 2, false), 0x8000);
    }
}
