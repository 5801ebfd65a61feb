//! Live memory (`--live`): the allocations outstanding now, by address.
//!
//! An allocation's size is known at its function's entry and its address
//! at the return, so the entry keeps a [`Pending`] per (thread, stack
//! pointer) until its return takes it: a nested call (`PyObject_Malloc`
//! calling `PyMem_RawMalloc` for a large block) has a lower stack
//! pointer, so the two never mix. The return then puts the block in the
//! live table, address → [`LiveEntry`], and a free takes it out.

/// Key of the live table: one outstanding block of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LiveKey {
    /// Thread-group id (the process id) that allocated it.
    pub tgid: u32,
    pub reserved: u32,
    /// The address the allocator returned.
    pub address: u64,
}

const _: () = assert!(core::mem::size_of::<LiveKey>() == 16);

/// One outstanding block.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveEntry {
    /// The requested size.
    pub size: u64,
    /// When it was allocated (`bpf_ktime_get_ns`, CLOCK_MONOTONIC).
    pub time_ns: u64,
    /// With `--stacks`, the hash of its Python stack (the key of the
    /// stacks map); 0 without one.
    pub stack: u64,
    /// Its [`crate::sizes::Domain`].
    pub domain: u32,
    /// The probe slot of the function that allocated it.
    pub slot: u32,
}

const _: () = assert!(core::mem::size_of::<LiveEntry>() == 32);

/// Key of the pending map: the calls in flight on a thread at one stack
/// pointer at their functions' entry (two where one tail-calls the other:
/// pyenv's `PyMem_Realloc` jumps into pymalloc, which may jump on into
/// `PyMem_RawRealloc`, with the same stack pointer and return address).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PendingKey {
    /// Thread id (the kernel's pid).
    pub tid: u32,
    pub reserved: u32,
    /// `%rsp` at the entry.
    pub sp: u64,
}

const _: () = assert!(core::mem::size_of::<PendingKey>() == 16);

/// An allocation in flight, from its entry to its return.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Call {
    /// The requested size.
    pub size: u64,
    /// For a realloc, the old block (0: none, or not a realloc).
    pub old: u64,
    /// With `--stacks`, the stack hash; else 0.
    pub stack: u64,
    pub domain: u32,
    pub slot: u32,
}

const _: () = assert!(core::mem::size_of::<Call>() == 32);

/// The calls in flight at one (thread, stack pointer), innermost last.
/// A tail-called function's uretprobe fires before its caller's, at the
/// same stack pointer, so a return takes the innermost. A third call
/// pushes out the outermost, which can only be one whose return was never
/// seen (made before the return probes were attached).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    pub calls: [Call; 2],
    /// How many of `calls` are in flight.
    pub depth: u64,
}

const _: () = assert!(core::mem::size_of::<Pending>() == 72);

/// Room for threads in the last-free map: an allocator's free that calls
/// another family's free on the same block (`PyObject_Free` handing a
/// large block to `PyMem_RawFree`) finds the block gone, and is counted
/// as nested rather than untracked when it is the thread's last freed.
pub const LAST_FREE_THREADS: u32 = 4096;

/// Per domain, what the live table did, one value per CPU. `count` and
/// `bytes` are wrapping deltas (a block allocated on one CPU may be freed
/// on another): their sum over the CPUs, read as signed, is the level.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveCounts {
    /// Outstanding blocks (as a wrapping delta).
    pub count: u64,
    /// Their requested bytes (as a wrapping delta).
    pub bytes: u64,
    /// Blocks put in the table.
    pub tracked: u64,
    /// Blocks a free (or a realloc) took out of it.
    pub freed: u64,
    /// Frees of an address not in the table: allocated before the attach,
    /// or dropped because the table was full.
    pub untracked_frees: u64,
    /// Blocks the table had no room for (then never counted live).
    pub dropped: u64,
    /// Allocations at copies whose returned pointer is not read (inlined
    /// copies on LTO builds): not in the table.
    pub unseen_allocs: u64,
    /// Frees at copies whose pointer is not read: a block they free stays
    /// in the table.
    pub unseen_frees: u64,
    /// Inner calls of another family on a block an outer call handed out
    /// or took back (counted once, under the outer call's domain).
    pub nested: u64,
}

const _: () = assert!(core::mem::size_of::<LiveCounts>() == 72);

impl LiveCounts {
    /// Adds another CPU's value, wrapping as the BPF side does.
    #[must_use]
    pub const fn merged(self, o: Self) -> Self {
        Self {
            count: self.count.wrapping_add(o.count),
            bytes: self.bytes.wrapping_add(o.bytes),
            tracked: self.tracked.wrapping_add(o.tracked),
            freed: self.freed.wrapping_add(o.freed),
            untracked_frees: self.untracked_frees.wrapping_add(o.untracked_frees),
            dropped: self.dropped.wrapping_add(o.dropped),
            unseen_allocs: self.unseen_allocs.wrapping_add(o.unseen_allocs),
            unseen_frees: self.unseen_frees.wrapping_add(o.unseen_frees),
            nested: self.nested.wrapping_add(o.nested),
        }
    }
}

/// Room in the live-counts array: one per domain, with room for domains
/// to come (libc's, with `--native`).
pub const DOMAIN_SLOTS: u32 = 8;

/// Default room of the live table in the object file; the loader sets
/// `--live-max`.
pub const DEFAULT_LIVE_ENTRIES: u32 = 1024;

/// Room for calls in flight (an LRU map: a call whose return never comes,
/// a thread that died mid-call, is pushed out).
pub const PENDING_ENTRIES: u32 = 16_384;

/// What a probe slot does in the live table (the slot-live array's value).
pub mod role {
    /// Nothing.
    pub const NONE: u32 = 0;
    /// A malloc: the size is argument 0.
    pub const MALLOC: u32 = 1;
    /// A calloc: the size is argument 0 times argument 1.
    pub const CALLOC: u32 = 2;
    /// A realloc: argument 0 the old block, argument 1 the size.
    pub const REALLOC: u32 = 3;
    /// A free: argument 0 the block. The slot-live value is this plus its
    /// family's domain shifted left by 8 (a free's slot has no domain in
    /// the slot-domains map, which gives requested sizes).
    pub const FREE: u32 = 4;
}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, no padding (asserted above), any bits valid.
unsafe impl aya::Pod for LiveKey {}
#[cfg(feature = "user")]
// SAFETY: as for LiveKey.
unsafe impl aya::Pod for LiveEntry {}
#[cfg(feature = "user")]
// SAFETY: as for LiveKey.
unsafe impl aya::Pod for LiveCounts {}
