//! Types shared by the BPF programs (`tracer-ebpf`) and the loader
//! (`tracer-user`). Everything here is `#[repr(C)]`, `Copy` and free of
//! implicit padding, because both sides read the same bytes out of BPF maps.
#![no_std]

pub mod counter;
pub mod returns;
pub mod stats;

/// Names of the maps and globals, so the loader and the BPF object cannot
/// drift apart silently.
pub mod names {
    /// Per-CPU hash of [`crate::counter::Counter`] by
    /// [`crate::counter::CounterKey`] (process and probe slot).
    pub const COUNTERS_MAP: &str = "COUNTERS";
    /// Per-CPU hash of [`crate::returns::Returned`] by
    /// [`crate::counter::CounterKey`].
    pub const RETURNS_MAP: &str = "RETURNS";
    /// Per-CPU array of `u64`, indexed by [`crate::stats::Stat`].
    pub const STATS_MAP: &str = "STATS";
    /// BPF global: thread-group id the probes count for (0 = any process).
    pub const TARGET_TGID_GLOBAL: &str = "TARGET_TGID";
}
