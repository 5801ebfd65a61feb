//! Native (C) stacks unwound in BPF at the events that get Python stacks
//! (`--native-stacks`), without frame pointers: none of the CPython builds
//! tracer targets keeps them (`-O2`/`-O3` without
//! `-fno-omit-frame-pointer`, LTO and PGO), so a frame-pointer walk would
//! give garbage past the probed function. Instead userspace turns each
//! module's `.eh_frame` (the unwind tables the compiler emits for C++
//! exceptions and debuggers, present in every module here) into sorted
//! [`Row`]s: from each pc, how to find the canonical frame address (CFA)
//! from rsp or rbp, and where rbp was saved. BPF finds the module of each
//! pc in the process's [`Mappings`], binary-searches its rows, and steps
//! to the caller: its return address is at CFA − 8 and its rsp is the CFA
//! (x86-64's System V ABI). The design is the OpenTelemetry eBPF
//! profiler's and Parca's.

/// The most native frames recorded per event; a deeper stack is cut there
/// and counted as truncated.
pub const MAX_NATIVE_DEPTH: usize = 64;

/// The unwinder finds a pc's module, and its rows, by the pc's page: each
/// executable page of a traced process has a [`Page`] entry.
pub const PAGE_SHIFT: u32 = 12;

/// Steps of the binary search in a page's rows: a page's code has at most
/// 4097 rows (a row per byte, and the one that covers its start).
pub const ROW_SEARCH_STEPS: u32 = 13;

/// What a [`Row`] says to do at its pcs.
pub mod rule {
    /// No unwind information covers these pcs (a gap between functions):
    /// the unwind stops.
    pub const NONE: u8 = 0;
    /// CFA = rsp + `cfa`.
    pub const RSP: u8 = 1;
    /// CFA = rbp + `cfa`.
    pub const RBP: u8 = 2;
    /// A PLT entry (the expression every linker writes): CFA = rsp + 8,
    /// plus 8 past the entry's push (pc & 15 >= 11).
    pub const PLT: u8 = 3;
    /// The return address is undefined: the outermost frame (`_start`,
    /// `clone3`'s child), where a complete stack ends.
    pub const ROOT: u8 = 4;
    /// A rule the BPF unwinder does not follow (a DWARF expression other
    /// than the PLT's, a CFA register other than rsp and rbp): the unwind
    /// stops and is counted.
    pub const UNSUPPORTED: u8 = 5;
}

/// How rbp is restored at a row's pcs.
pub mod rbp {
    /// Unchanged from the callee's.
    pub const SAME: u8 = 0;
    /// Saved at CFA + `rbp` (a negative offset).
    pub const AT_CFA: u8 = 1;
}

/// One row of a module's unwind table, in the module's link-time
/// addresses. Rows are sorted by `pc`; each holds from its pc to the next
/// row's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Row {
    /// The first pc (link-time address; modules here are below 4 GiB).
    pub pc: u32,
    /// One of [`rule`].
    pub rule: u8,
    /// One of [`rbp`].
    pub rbp_rule: u8,
    /// The offset rbp was saved at, from the CFA.
    pub rbp: i16,
    /// The CFA's offset from its register.
    pub cfa: i32,
}

const _: () = assert!(core::mem::size_of::<Row>() == 12);

/// Key of [`Page`]: a process and a page of its address space.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PageKey {
    pub tgid: u32,
    pub reserved: u32,
    /// The address >> [`PAGE_SHIFT`].
    pub page: u64,
}

const _: () = assert!(core::mem::size_of::<PageKey>() == 16);

/// Where the unwind rows of the code on one page of a process are: one
/// hash lookup finds a pc's module and narrows its rows to the page's
/// few, so the search takes a few steps, which keeps the verifier's
/// paths few.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Page {
    /// The process's address minus the module's link-time address.
    pub bias: u64,
    /// The rows that cover the page: the one that holds its first byte,
    /// then the ones that start in it (0 rows: the module has no unwind
    /// information).
    pub rows: u32,
    pub count: u32,
}

const _: () = assert!(core::mem::size_of::<Page>() == 16);

/// Why a native unwind ended.
pub mod end {
    /// At the outermost frame: the stack is complete.
    pub const ROOT: u32 = 0;
    /// At [`super::MAX_NATIVE_DEPTH`] frames, with more left.
    pub const TRUNCATED: u32 = 1;
    /// At a pc in no mapping tracer knows (JIT code, the vDSO, a module
    /// mapped after tracer read the process's maps).
    pub const NO_MAPPING: u32 = 2;
    /// At a pc that its module's unwind tables do not cover (a module
    /// without `.eh_frame`, or a gap in it).
    pub const NO_INFO: u32 = 3;
    /// At a rule the unwinder does not follow.
    pub const UNSUPPORTED: u32 = 4;
    /// A read of the stack failed (the return address, or a saved rbp).
    pub const READ_FAILED: u32 = 5;
}

/// One native unwind, innermost pc first: the probed instruction, then
/// return addresses.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NativeStack {
    pub depth: u32,
    /// One of [`end`].
    pub end: u32,
    pub pcs: [u64; MAX_NATIVE_DEPTH],
}

const _: () = assert!(core::mem::size_of::<NativeStack>() == 8 + 8 * MAX_NATIVE_DEPTH);

impl Default for NativeStack {
    fn default() -> Self {
        Self { depth: 0, end: end::ROOT, pcs: [0; MAX_NATIVE_DEPTH] }
    }
}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, no padding (size asserted: u32, two u8, i16,
// i32), every bit pattern valid.
unsafe impl aya::Pod for Row {}
#[cfg(feature = "user")]
// SAFETY: as above: two u32 and a u64.
unsafe impl aya::Pod for PageKey {}
#[cfg(feature = "user")]
// SAFETY: as above: a u64 and two u32.
unsafe impl aya::Pod for Page {}
#[cfg(feature = "user")]
// SAFETY: as above: two u32 and an array of u64.
unsafe impl aya::Pod for NativeStack {}
