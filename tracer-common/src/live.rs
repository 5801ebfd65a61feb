//! Live memory (`--live`): the allocations outstanding now, by address.
//!
//! An allocation's domain is known at its API function's entry (or at an
//! inlined copy of it), and its address at the return of the
//! implementation the API calls through its domain's allocator table
//! (`_PyObject.malloc(_PyObject.ctx, size)` in Objects/obmalloc.c). On LTO
//! builds the API is inlined into its callers, where no return exists,
//! but the implementations stay out of line. So each thread keeps a small
//! stack of [`Frame`]s: the API call, then its implementation, whose
//! return puts the block in the live table, address → [`LiveEntry`]; a
//! free's implementation takes it out at its entry. An implementation
//! called inside another (pymalloc handing a large block to the raw
//! allocator, the debug hooks calling pymalloc) is nested, counted once.

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
    /// When it was allocated (`bpf_ktime_get_ns`, `CLOCK_MONOTONIC`).
    pub time_ns: u64,
    /// With `--stacks`, the hash of its Python stack (the key of the
    /// stacks map), or why it has none (a [`crate::stack::why`] value).
    pub stack: u64,
    /// Its [`crate::sizes::Domain`].
    pub domain: u32,
    /// The probe slot of the function that allocated it.
    pub slot: u32,
}

const _: () = assert!(core::mem::size_of::<LiveEntry>() == 32);

/// One call in flight on a thread: an allocator API call (at its entry,
/// or at an inlined copy of it) waiting for the implementation it calls
/// through its domain's allocator table, or a call of an implementation
/// (`_PyObject_Malloc`, `_PyMem_RawMalloc`, the `_PyMem_Debug*` hooks),
/// whose return gives the block.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    /// The requested size: an implementation's own argument, or an API
    /// allocation's where its probe reads it (0: unknown).
    pub size: u64,
    /// For an implementation's realloc, the old block (0: none); for an
    /// API free, the block it already took out of the table (0: none yet);
    /// for an API realloc, the block it reallocates, where its probe reads
    /// it (0: unknown, or none).
    pub old: u64,
    /// For an API allocation served by pymalloc inline (see
    /// [`Pymalloc`]), the block put in the table at its entry as the one
    /// pymalloc hands out; an implementation it then calls replaces it
    /// with the block that implementation returns.
    pub predicted: u64,
    /// With `--stacks`, the call's stack hash, or why it has none (a
    /// [`crate::stack::why`] value).
    pub stack: u64,
    /// `%rsp` at the probe: for an API call at an inlined copy, the
    /// caller's; for an implementation, at its entry.
    pub sp: u64,
    /// The API call's domain ([`crate::sizes::Domain`]).
    pub domain: u32,
    /// The API call's probe slot, or the implementation's.
    pub slot: u32,
    /// A [`kind`].
    pub kind: u32,
    /// The call's [`Role`]: its kind alone ([`Role::kind`]).
    pub role: Role,
}

const _: () = assert!(core::mem::size_of::<Frame>() == 56);

/// What a [`Frame`] is.
pub mod kind {
    /// An API call that has not called an implementation yet. An inlined
    /// copy that runs an inlined allocator (LTO's devirtualised pymalloc)
    /// never does: the next API call on the thread finds it stale.
    pub const API: u32 = 1;
    /// The implementation an API call called: its return gives the block.
    pub const OUTER: u32 = 2;
    /// An implementation called inside another (the debug hooks calling
    /// pymalloc, pymalloc calling the raw allocator for a large block):
    /// counted once, as the outer call.
    pub const NESTED: u32 = 3;
    /// An implementation entered with no API call seen on its thread.
    pub const ORPHAN: u32 = 4;
    /// With `--native`, a call of libc's allocator (not inside another
    /// allocator call): its return gives the block, in the native domain.
    pub const NATIVE: u32 = 5;
    /// A libc allocator call inside another allocator call (glibc's
    /// `realloc` calling `malloc`, `malloc` calling `mmap`, the raw
    /// domain's `_PyMem_RawMalloc` calling `malloc`): counted once, as the
    /// outer call.
    pub const NATIVE_NESTED: u32 = 6;
    /// An API realloc whose implementation allocated a new block (a
    /// moving realloc: pymalloc's `_PyObject_Malloc` and copy, or libc's
    /// `malloc` where that is inlined): it frees its old block next, by an
    /// implementation this frame serves, or inline, unseen, which the
    /// next API call on the thread finds.
    pub const MOVED: u32 = 7;
}

/// An API realloc frame's `old` where its probe does not read its block.
pub const UNKNOWN_BLOCK: u64 = u64::MAX;

/// What a stale API frame (one the thread's next API call finds on top:
/// its call ran an inlined allocator and called no implementation) left
/// unseen, as [`Frame::stale`] judges it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stale {
    /// Nothing: its block was predicted, or its free took its block.
    Seen,
    /// An allocation whose block is not in the table.
    Allocation,
    /// A free whose block is not known: it stays in the table.
    Free,
    /// A realloc that moved, freeing this old block inline: out it goes.
    Take(u64),
}

impl Frame {
    /// What this frame, found stale on top of its thread's stack, left
    /// unseen: the BPF side judges it when the thread's next API call
    /// comes, and userspace, for the frames still on top at the end.
    #[must_use]
    pub const fn stale(&self) -> Stale {
        if self.kind == kind::MOVED {
            if self.old == UNKNOWN_BLOCK { Stale::Free } else { Stale::Take(self.old) }
        } else if self.kind != kind::API {
            Stale::Seen
        } else if self.role.0 == Role::REALLOC.0 && self.predicted != 0 {
            // Predicted: a block that stays, or one that moved, freeing
            // the old one inline.
            if self.predicted != self.old && self.old != 0 { Stale::Take(self.old) } else { Stale::Seen }
        } else if self.role.0 == Role::FREE.0 {
            if self.old == 0 { Stale::Free } else { Stale::Seen }
        } else if self.predicted == 0 {
            Stale::Allocation
        } else {
            Stale::Seen
        }
    }
}

/// How deep [`Frames`] goes. An API call and its implementation, twice
/// (pymalloc calling the raw domain), with the debug hooks' level in each
/// is six; with `PYTHONMALLOC=debug` on Debian's LTO 3.11, six lost about
/// one call in 200 (588 `live_pending_full` in 125,763 allocations of a
/// bytearray loop, and 28 `live_unmatched`), and eight none.
pub const FRAME_DEPTH: usize = 8;

/// The calls in flight on one thread, innermost last.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Frames {
    pub frames: [Frame; FRAME_DEPTH],
    /// How many of `frames` are in use.
    pub depth: u64,
    /// Frames pushed on this thread so far (wrapping): a top frame read
    /// twice with no push between is one call, where a busy loop's next
    /// call may push a frame equal to the last.
    pub pushes: u64,
}

const _: () = assert!(core::mem::size_of::<Frames>() == 56 * FRAME_DEPTH + 16);

impl Frames {
    /// The call a thread's next API call would judge stale (see
    /// [`Frame::stale`]): its top frame, an API call's or a moved
    /// realloc's. Not one above an implementation's frame: that call is
    /// inside the implementation, whose return drops it uncounted.
    #[must_use]
    pub fn left(&self) -> Option<Frame> {
        let depth = usize::try_from(self.depth).unwrap_or(0).min(FRAME_DEPTH);
        let (top, below) = self.frames.get(..depth)?.split_last()?;
        let judged = |f: &Frame| f.kind == kind::API || f.kind == kind::MOVED;
        (judged(top) && below.iter().all(judged)).then_some(*top)
    }
}

/// How far from an API call's stack pointer its implementation's entry
/// may be: below it by the API's own frame (an out-of-line API function's
/// locals, or the caller's at an inlined copy) and the return address, or
/// above it where a caller tail-calls the implementation after popping
/// its own frame. Further, the implementation was called by something
/// else.
pub const API_FRAME_ROOM: u64 = 4096;

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
    /// API allocations that called no implementation whose return is
    /// probed (an inlined copy running an inlined allocator, LTO's
    /// devirtualised pymalloc): not in the table.
    pub unseen_allocs: u64,
    /// API frees that called no probed implementation: a block they free
    /// stays in the table until its address is handed out again.
    pub unseen_frees: u64,
    /// Implementation calls inside another one (pymalloc handing a large
    /// block to the raw allocator, the debug hooks calling pymalloc):
    /// counted once, as the outer call.
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

/// Room in the live-counts array: one per domain (libc's too, with
/// `--native`), with room for domains to come.
pub const DOMAIN_SLOTS: u32 = 8;

/// Default room of the live table in the object file; the loader sets
/// `--live-max`.
pub const DEFAULT_LIVE_ENTRIES: u32 = 1024;

/// Room for threads with calls in flight (an LRU map: a thread that died
/// mid-call is pushed out).
pub const FRAME_THREADS: u32 = 16_384;

/// What a probe slot does in the live table: the slot-live array's value.
///
/// One word: bits 0–3 the kind ([`Role::MALLOC`] … [`Role::POOL`]), bit 4
/// [`Role::implementation`], bit 5 [`Role::native`], and from bit 8 a
/// free's family domain ([`Role::free_of`]; a free's slot has no domain in
/// the slot-domains map, which gives requested sizes). Only this type's
/// methods take the word apart.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Role(u32);

const _: () = assert!(core::mem::size_of::<Role>() == 4);

impl Role {
    /// Nothing.
    pub const NONE: Self = Self(0);
    /// A malloc: the size is argument 0.
    pub const MALLOC: Self = Self(1);
    /// A calloc: the size is argument 0 times argument 1.
    pub const CALLOC: Self = Self(2);
    /// A realloc: argument 0 the old block, argument 1 the size.
    pub const REALLOC: Self = Self(3);
    /// A free: argument 0 the block.
    pub const FREE: Self = Self(4);
    /// `aligned_alloc(alignment, size)`.
    pub const ALIGNED: Self = Self(5);
    /// `posix_memalign(&ptr, alignment, size)`: the block is `*ptr` where
    /// it returns 0.
    pub const MEMALIGN: Self = Self(6);
    /// `mmap(addr, length, ...)`: `MAP_FAILED` (-1) is a failure.
    pub const MMAP: Self = Self(7);
    /// `munmap(addr, length)`: takes out the mapping that starts at
    /// `addr`, whole.
    pub const MUNMAP: Self = Self(8);
    /// pymalloc's `allocate_from_new_pool(size class)` (3.11;
    /// `(state, size class)` from 3.13): the block for an API allocation
    /// that found no used pool of its size class; the requested size is
    /// the API call's.
    pub const POOL: Self = Self(9);

    /// Every kind, which [`Role::KINDS_DIFFER`] checks.
    pub const KINDS: [Self; 10] = [
        Self::NONE,
        Self::MALLOC,
        Self::CALLOC,
        Self::REALLOC,
        Self::FREE,
        Self::ALIGNED,
        Self::MEMALIGN,
        Self::MMAP,
        Self::MUNMAP,
        Self::POOL,
    ];

    /// The bits that hold the kind.
    const KIND_BITS: u32 = 0x0f;
    /// An implementation's slot: its arguments come after the allocator's
    /// context (`_PyObject_Malloc(void *ctx, size_t nbytes)`), one later
    /// than the API's.
    const IMPLEMENTATION_BIT: u32 = 0x10;
    /// A libc function's slot (`--native`): its entry probe pushes the
    /// call's frame itself, with the ABI's arguments.
    const NATIVE_BIT: u32 = 0x20;
    /// Where a free's family domain starts.
    const DOMAIN_SHIFT: u32 = 8;

    /// Whether every kind is its own, fits the kind's bits, and none is
    /// taken for another (`ALIGNED` and `POOL` once shared a value).
    pub const KINDS_DIFFER: bool = {
        let mut ok = true;
        let mut i = 0;
        while i < Self::KINDS.len() {
            ok &= Self::KINDS[i].0 & !Self::KIND_BITS == 0;
            let mut j = i + 1;
            while j < Self::KINDS.len() {
                ok &= Self::KINDS[i].0 != Self::KINDS[j].0;
                j += 1;
            }
            i += 1;
        }
        ok && Self::KIND_BITS & (Self::IMPLEMENTATION_BIT | Self::NATIVE_BIT) == 0
            && (Self::IMPLEMENTATION_BIT | Self::NATIVE_BIT) >> Self::DOMAIN_SHIFT == 0
    };

    /// An API free of the family of `domain` (a [`crate::sizes::Domain`]).
    #[must_use]
    pub const fn free_of(domain: u32) -> Self {
        Self(Self::FREE.0 | domain << Self::DOMAIN_SHIFT)
    }

    /// This role at an allocator implementation's slot.
    #[must_use]
    pub const fn implementation(self) -> Self {
        Self(self.0 | Self::IMPLEMENTATION_BIT)
    }

    /// This role at a libc function's slot (`--native`).
    #[must_use]
    pub const fn native(self) -> Self {
        Self(self.0 | Self::NATIVE_BIT)
    }

    /// The kind alone: no flags, no domain.
    #[must_use]
    pub const fn kind(self) -> Self {
        Self(self.0 & Self::KIND_BITS)
    }

    /// An allocator API function's kind (a free's domain left out), or
    /// [`Role::NONE`] for an implementation's or a libc function's role:
    /// what an API probe does.
    #[must_use]
    pub const fn api(self) -> Self {
        if self.0 & (Self::IMPLEMENTATION_BIT | Self::NATIVE_BIT) == 0 { self.kind() } else { Self::NONE }
    }

    /// Whether it is an allocator implementation's.
    #[must_use]
    pub const fn is_implementation(self) -> bool {
        self.0 & Self::IMPLEMENTATION_BIT != 0
    }

    /// Whether it is a libc function's (`--native`).
    #[must_use]
    pub const fn is_native(self) -> bool {
        self.0 & Self::NATIVE_BIT != 0
    }

    /// A free's family domain (0 for any other role).
    #[must_use]
    pub const fn domain(self) -> u32 {
        self.0 >> Self::DOMAIN_SHIFT
    }

    /// Whether it is [`Role::NONE`]: the slot does nothing in the table.
    #[must_use]
    pub const fn is_none(self) -> bool {
        self.0 == 0
    }
}

const _: () = assert!(Role::KINDS_DIFFER, "two live roles share a value, or a kind overflows its bits");

/// Where the target's pymalloc keeps what decides the block an inlined
/// allocation gets, for `--live` on builds that inline the allocator API
/// (LTO): an allocation of 1 to [`SMALL_REQUEST`] bytes through a table
/// whose function is pymalloc's takes the head of the free list of the
/// first used pool of its size class (`pymalloc_alloc`, Objects/obmalloc.c,
/// v3.11.0 to v3.14.0), which BPF reads at the call's entry. Runtime
/// addresses in the target; 0 where unknown (no prediction).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pymalloc {
    /// `usedpools[0]`: per size class two pointers, the first (as a pool
    /// header) with the class's used pools linked from it.
    pub usedpools: u64,
    /// Per domain (object, mem), the allocator table (`PyMemAllocatorEx`:
    /// ctx, malloc, calloc, realloc, free); 0: the table is not checked
    /// (its address is not known), and pymalloc is assumed.
    pub tables: [u64; 2],
    /// `_PyObject_Malloc`, `_PyObject_Calloc` and `_PyObject_Realloc`,
    /// which the tables hold while pymalloc serves them (0: that call is
    /// not predicted).
    pub malloc: u64,
    pub calloc: u64,
    pub realloc: u64,
}

const _: () = assert!(core::mem::size_of::<Pymalloc>() == 48);

/// pymalloc's largest small request (`SMALL_REQUEST_THRESHOLD`): larger
/// ones go to the raw allocator.
pub const SMALL_REQUEST: u64 = 512;
/// log2 of pymalloc's alignment (`ALIGNMENT_SHIFT`, 16 bytes on 64-bit
/// builds from v3.8.0).
pub const ALIGNMENT_SHIFT: u64 = 4;
/// In a pool header (`struct pool_header`: `ref`, `freeblock`,
/// `nextpool`, ...; `Objects/obmalloc.c` v3.11.0,
/// `Include/internal/pycore_obmalloc.h` v3.12.0 to v3.14.0), the free
/// list's head and the next pool.
pub const POOL_FREEBLOCK: u64 = 8;
pub const POOL_NEXTPOOL: u64 = 16;
/// The pool header's `szidx` (a `uint`, after `ref`, `freeblock`,
/// `nextpool`, `prevpool` and `arenaindex`; same files and tags): a
/// block's size class.
pub const POOL_SZIDX: u64 = 36;
/// A pool's size, to which a block's address is rounded down to find its
/// header (`POOL_ADDR`): `POOL_BITS` 14 where `USE_LARGE_POOLS` is
/// defined, which `WITH_PYMALLOC_RADIX_TREE` (on by default on 64-bit)
/// turns on (`Objects/obmalloc.c` v3.11.0;
/// `Include/internal/pycore_obmalloc.h` v3.12.0 to v3.14.0). BENCHMARKS.md
/// has it checked on the four builds.
pub const POOL_SIZE: u64 = 1 << 14;

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, no padding (asserted above), any bits valid.
unsafe impl aya::Pod for Pymalloc {}
#[cfg(feature = "user")]
// SAFETY: #[repr(transparent)] over a u32 (size asserted above), Copy,
// any bits valid (an unknown kind does nothing in the table).
unsafe impl aya::Pod for Role {}
#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, no padding (asserted above), any bits valid.
unsafe impl aya::Pod for LiveKey {}
#[cfg(feature = "user")]
// SAFETY: as for LiveKey.
unsafe impl aya::Pod for LiveEntry {}
#[cfg(feature = "user")]
// SAFETY: as for LiveKey.
unsafe impl aya::Pod for LiveCounts {}
#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, no padding (asserted above: five u64 and four
// u32), any bits valid (a frame of no kind matches no call).
unsafe impl aya::Pod for Frame {}
#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, no padding (asserted above), any bits valid.
unsafe impl aya::Pod for Frames {}

#[cfg(test)]
mod tests {
    use super::{FRAME_DEPTH, Frame, Frames, Role, Stale, UNKNOWN_BLOCK, kind};

    #[test]
    fn a_stale_frame_says_what_went_unseen() {
        let api = |role, old, predicted| Frame { kind: kind::API, role, old, predicted, ..Frame::default() };
        assert_eq!(api(Role::MALLOC, 0, 0).stale(), Stale::Allocation);
        assert_eq!(api(Role::MALLOC, 0, 0x10).stale(), Stale::Seen);
        assert_eq!(api(Role::FREE, 0, 0).stale(), Stale::Free);
        assert_eq!(api(Role::FREE, 0x20, 0).stale(), Stale::Seen);
        // A realloc predicted to move freed its old block inline; one
        // predicted to stay freed nothing; one not predicted is unseen.
        assert_eq!(api(Role::REALLOC, 0x20, 0x30).stale(), Stale::Take(0x20));
        assert_eq!(api(Role::REALLOC, 0x20, 0x20).stale(), Stale::Seen);
        assert_eq!(api(Role::REALLOC, 0x20, 0).stale(), Stale::Allocation);
        let moved = |old| Frame { kind: kind::MOVED, role: Role::REALLOC, old, ..Frame::default() };
        assert_eq!(moved(0x20).stale(), Stale::Take(0x20));
        assert_eq!(moved(UNKNOWN_BLOCK).stale(), Stale::Free);
        // An implementation's frame is a call in flight, not stale.
        assert_eq!(Frame { kind: kind::OUTER, role: Role::MALLOC, ..Frame::default() }.stale(), Stale::Seen);
    }

    #[test]
    fn the_call_left_is_the_top_api_frame_outside_any_implementation() {
        let frame = |kind, sp| Frame { kind, sp, role: Role::MALLOC, ..Frame::default() };
        let stack = |frames: &[Frame]| {
            let mut s = Frames { frames: [Frame::default(); FRAME_DEPTH], depth: frames.len() as u64, pushes: 0 };
            s.frames[..frames.len()].copy_from_slice(frames);
            s
        };
        let api = frame(kind::API, 0x100);
        assert_eq!(stack(&[api]).left(), Some(api));
        assert_eq!(stack(&[frame(kind::MOVED, 0x100)]).left(), Some(frame(kind::MOVED, 0x100)));
        // Inside an implementation (pymalloc handing a block on to the raw
        // domain): its return drops the inner call.
        assert_eq!(stack(&[api, frame(kind::OUTER, 0xf0), frame(kind::API, 0xe0)]).left(), None);
        // An implementation in flight on top.
        assert_eq!(stack(&[api, frame(kind::OUTER, 0xf0)]).left(), None);
        assert_eq!(stack(&[]).left(), None);
    }

    #[test]
    fn a_role_keeps_its_kind_flags_and_domain_apart() {
        let free = Role::free_of(2);
        assert_eq!((free.kind(), free.api(), free.domain()), (Role::FREE, Role::FREE, 2));
        let implementation = Role::REALLOC.implementation();
        assert_eq!((implementation.kind(), implementation.api()), (Role::REALLOC, Role::NONE));
        assert!(implementation.is_implementation() && !implementation.is_native());
        let native = Role::MUNMAP.native();
        assert_eq!((native.kind(), native.api(), native.domain()), (Role::MUNMAP, Role::NONE, 0));
        assert!(native.is_native() && !native.is_implementation());
        for kind in Role::KINDS {
            assert_eq!(kind.kind(), kind, "{kind:?}");
            assert_eq!(kind.implementation().kind(), kind, "{kind:?}");
            assert_eq!(Role::KINDS.iter().filter(|&&k| k == kind).count(), 1, "{kind:?}");
        }
    }
}
