//! Python stacks walked in BPF at allocation events (`--stacks`): where the
//! current thread's frames are (a [`WalkConfig`] the loader fills from the
//! version module and the target), what one walk records (a [`Stack`]),
//! and how events are counted per stack ([`StackKey`]).

/// The deepest walk the BPF program can make; `--depth` chooses up to this.
pub const MAX_DEPTH: usize = 128;
/// The default `--depth`.
pub const DEFAULT_DEPTH: u32 = 64;
/// An offset that is not used: 3.13+ have no `_PyCFrame` hop.
pub const NO_OFFSET: u64 = u64::MAX;

/// How the current thread's state is found at an event.
pub mod current {
    /// Read a pointer at a fixed address of the target: 3.11's
    /// `_PyRuntime.gilstate.tstate_current`, or a GIL's `last_holder`.
    pub const AT_ADDRESS: u32 = 0;
    /// Read a pointer at the thread's fsbase plus a (negative) offset: a
    /// thread-local in an executable (local-exec TLS).
    pub const FS_RELATIVE: u32 = 1;
    /// Read the thread's DTV at fsbase + 8, its entry for a module, then
    /// the pointer at that block plus an offset: a thread-local in a shared
    /// library loaded at startup (static TLS through `__tls_get_addr`).
    pub const TLS_MODULE: u32 = 2;
}

/// What kind of frame the walk follows.
pub mod frame_kind {
    /// `_PyInterpreterFrame` (3.11+): the instruction is a pointer into the
    /// code object (from [`super::WalkConfig::code_adaptive`]), and the
    /// owner a byte.
    pub const INTERPRETER: u32 = 0;
    /// `PyFrameObject` (3.9, 3.10): the instruction is `int f_lasti`, an
    /// index in units of [`super::WalkConfig::lasti_unit`] bytes, and there
    /// is no owner (every frame is a Python function's: recorded as 0).
    pub const LASTI: u32 = 1;
}

const _: () = assert!(frame_kind::INTERPRETER == 0 && frame_kind::LASTI == 1, "the BPF walk masks by the kind");

/// How the walk makes sure the thread state it found is the event's
/// thread's.
pub mod thread_check {
    /// Its `native_thread_id` against the event's TID in the target's PID
    /// namespace (3.11+).
    pub const NATIVE_TID: u32 = 0;
    /// Its `thread_id`, the thread's `pthread_t`, against the event
    /// thread's fsbase (3.9, 3.10, whose thread states hold no TID): on
    /// x86-64 a `pthread_t` is the address of the thread's control block,
    /// which the thread pointer (fsbase) points to, in glibc and musl.
    pub const PTHREAD_FSBASE: u32 = 1;
}

/// Where the frames are, for one traced process. All offsets in bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkConfig {
    /// One of [`current`].
    pub current: u32,
    /// How deep to walk, at most [`MAX_DEPTH`].
    pub depth: u32,
    /// [`current::AT_ADDRESS`]: the address; [`current::FS_RELATIVE`]:
    /// the offset from fsbase (two's complement); [`current::TLS_MODULE`]:
    /// the offset in the module's block.
    pub tstate_at: u64,
    /// [`current::TLS_MODULE`]: the module id.
    pub tls_module: u64,
    /// `offsetof(struct task_struct, thread.fsbase)` in the running
    /// kernel, from its BTF.
    pub task_fsbase: u64,
    /// `PyThreadState.native_thread_id` (or, with
    /// [`thread_check::PTHREAD_FSBASE`], `thread_id`): checked against the
    /// event's thread, so that a GIL holder's stack is never taken for
    /// another's.
    pub native_thread_id: u64,
    /// `PyThreadState.cframe` (3.11, 3.12), or [`NO_OFFSET`].
    pub cframe: u64,
    /// `_PyCFrame.current_frame`, or (3.13+) `PyThreadState.current_frame`.
    pub current_frame: u64,
    /// `_PyInterpreterFrame` fields.
    pub frame_code: u64,
    pub frame_previous: u64,
    pub frame_instr: u64,
    pub frame_owner: u64,
    /// Tag bits to clear from the code reference (3.14's `_PyStackRef`: 3).
    pub code_tag_mask: u64,
    /// `PyCodeObject.co_code_adaptive`: instruction offsets are from here.
    pub code_adaptive: u64,
    /// The device and inode of the target's PID namespace, for the event's
    /// thread id as the target sees it (`native_thread_id` is in its
    /// namespace).
    pub pid_ns_dev: u64,
    pub pid_ns_ino: u64,
    /// One of [`frame_kind`].
    pub frame_kind: u32,
    /// [`frame_kind::LASTI`]: the bytes an `f_lasti` of 1 is (1 in 3.9,
    /// 2 in 3.10).
    pub lasti_unit: u32,
    /// One of [`thread_check`].
    pub thread_check: u32,
    /// Unused: the struct has no implicit padding.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<WalkConfig>() == 8 + 16 * 8);

/// The most bytes of a frame the walk reads in one go: every field it
/// needs (code, previous, instruction pointer, owner) is within the first
/// 80 bytes of `_PyInterpreterFrame` in 3.11 to 3.14, and of the first 112
/// of `PyFrameObject` in 3.9 and 3.10.
pub const FRAME_HEAD: u64 = 128;

/// Where the walk finds a frame's fields in the bytes it read from the
/// frame's start, as 64-bit words: [`WalkConfig::frame_head`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHead {
    /// Bytes to read from the frame's start: up to the end of the last
    /// field, at most [`FRAME_HEAD`].
    pub bytes: u64,
    /// Word indices of the code reference, the previous frame and the
    /// instruction pointer (or the word holding `f_lasti`).
    pub code: u64,
    pub previous: u64,
    pub instr: u64,
    /// `f_lasti`'s shift in its word (0 for a pointer).
    pub instr_shift: u64,
    /// The word holding the owner byte, and the owner's shift in it.
    pub owner: u64,
    pub owner_shift: u64,
    /// 0xff, or 0 for a frame object, which has no owner (every owner
    /// then 0).
    pub owner_mask: u64,
}

impl WalkConfig {
    /// How the bytes read from a frame's start give every field the walk
    /// needs, so that one read serves a frame (or, on the data stack,
    /// the frames that share its page), where a read per field would cost
    /// four: the helper call, not the bytes copied, is most of a read's
    /// cost. None when a pointer field is not 8-aligned (`f_lasti`, an
    /// int, 4-aligned) or the fields reach past [`FRAME_HEAD`], which no
    /// supported version does. A frame object has no owner: its
    /// `frame_owner` is any byte of the head (0), masked off.
    ///
    /// The BPF walk computes this from the map's values, which the
    /// verifier does not know: each branch on them would double the paths
    /// it walks through the frame loop after it, so what depends on the
    /// kind is arithmetic, not a branch.
    #[must_use]
    pub const fn frame_head(&self) -> Option<FrameHead> {
        let (code, previous, instr, owner) = (self.frame_code, self.frame_previous, self.frame_instr, self.frame_owner);
        // 1 for a frame object, 0 for an interpreter frame.
        let lasti = (self.frame_kind & 1) as u64;
        if code % 8 != 0 || previous % 8 != 0 || instr % (8 >> lasti) != 0 {
            return None;
        }
        let mut bytes = owner.saturating_add(1);
        // The whole word holding the instruction is read, `f_lasti` too.
        let pointers = [code, previous, instr - instr % 8];
        let mut i = 0;
        while i < pointers.len() {
            let end = pointers[i].saturating_add(8);
            if end > bytes {
                bytes = end;
            }
            i += 1;
        }
        if bytes > FRAME_HEAD {
            return None;
        }
        Some(FrameHead {
            bytes,
            code: code / 8,
            previous: previous / 8,
            instr: instr / 8,
            instr_shift: (instr % 8) * 8,
            owner: owner / 8,
            owner_shift: (owner % 8) * 8,
            owner_mask: 0xff & lasti.wrapping_sub(1),
        })
    }
}

/// One frame of a walk: the code object, the byte offset of the
/// instruction in its code, and the frame's owner (frames whose owner is
/// not a Python function's are the C stack's entry frames, recorded but
/// not shown).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Frame {
    pub code: u64,
    pub offset: u32,
    pub owner: u32,
}

const _: () = assert!(core::mem::size_of::<Frame>() == 16);

/// One walk, innermost frame first.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stack {
    /// Frames recorded.
    pub depth: u32,
    /// 1 when the stack was deeper than the walk went.
    pub truncated: u32,
    pub frames: [Frame; MAX_DEPTH],
}

const _: () = assert!(core::mem::size_of::<Stack>() == 8 + 16 * MAX_DEPTH);

impl Default for Stack {
    fn default() -> Self {
        Self { depth: 0, truncated: 0, frames: [Frame::default(); MAX_DEPTH] }
    }
}

/// Key of the stack counts: which process, which probe, which stack.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StackKey {
    pub tgid: u32,
    pub slot: u32,
    /// The hash of the stack's frames, its key in the stacks map.
    pub stack: u64,
    /// With `--native-stacks`, the hash of its native stack, its key in
    /// the native stacks map; else 0.
    pub native: u64,
}

const _: () = assert!(core::mem::size_of::<StackKey>() == 24);

/// Default sizes of the maps in the object file; the loader sets them.
pub const DEFAULT_STACK_ENTRIES: u32 = 1024;

/// The FNV-1a offset basis and prime, for the stack hash.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
pub const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// One step of the stack hash: mixes in a 64-bit word.
#[must_use]
#[inline]
pub const fn mix(hash: u64, word: u64) -> u64 {
    (hash ^ word).wrapping_mul(FNV_PRIME)
}

/// With `--live` and `--stacks`, what a block's stack field holds
/// ([`crate::live::LiveEntry::stack`]): its stack's hash, or, below
/// [`FIRST_HASH`], why it has none. A walk's hash is moved out of that
/// range (see [`keyed`]), so the two never meet.
pub mod why {
    /// No walk for its call: `--stacks` is off, or its function's events
    /// get no stacks, or the walk's result never reached the call.
    pub const NOT_WALKED: u64 = 0;
    /// `--sample` left its call out.
    pub const SAMPLED_OUT: u64 = 1;
    /// Its walk failed: this plus the [`crate::stats::Stat`] that says why.
    pub const FAILED: u64 = 2;
}

/// The first value a stack hash may take: the ones below say why a block
/// has no stack ([`why`]).
pub const FIRST_HASH: u64 = 256;

/// A walk's hash as the key of its stack: moved out of the range of
/// [`why`]'s values.
#[must_use]
#[inline]
pub const fn keyed(hash: u64) -> u64 {
    if hash < FIRST_HASH { hash.wrapping_add(FIRST_HASH) } else { hash }
}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, no padding (sizes asserted above: all fields are
// u64 after the two u32), every bit pattern valid.
unsafe impl aya::Pod for WalkConfig {}
#[cfg(feature = "user")]
// SAFETY: as above: a u64 and two u32.
unsafe impl aya::Pod for Frame {}
#[cfg(feature = "user")]
// SAFETY: as above: two u32 and an array of Frame.
unsafe impl aya::Pod for Stack {}
#[cfg(feature = "user")]
// SAFETY: as above: two u32 and two u64.
unsafe impl aya::Pod for StackKey {}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(code: u64, previous: u64, instr: u64, owner: u64) -> WalkConfig {
        WalkConfig {
            frame_code: code,
            frame_previous: previous,
            frame_instr: instr,
            frame_owner: owner,
            ..WalkConfig::default()
        }
    }

    #[test]
    fn a_frame_head_ends_at_its_last_field() {
        // 3.11's `_PyInterpreterFrame`: f_code at 32, previous at 48,
        // prev_instr at 56, owner at 69.
        let head = config(32, 48, 56, 69).frame_head().expect("fits");
        assert_eq!(
            head,
            FrameHead {
                bytes: 70,
                code: 4,
                previous: 6,
                instr: 7,
                instr_shift: 0,
                owner: 8,
                owner_shift: 40,
                owner_mask: 0xff
            }
        );
        // A pointer last.
        assert_eq!(config(0, 8, 120, 70).frame_head().map(|h| h.bytes), Some(128));
    }

    #[test]
    fn a_frame_object_s_head_reads_f_lasti_s_word_and_no_owner() {
        // 3.9's `PyFrameObject`: f_back at 24, f_code at 32, f_lasti at 104;
        // 3.10's f_lasti at 96.
        let lasti = |instr| WalkConfig { frame_kind: frame_kind::LASTI, ..config(32, 24, instr, 0) };
        let head = lasti(104).frame_head().expect("fits");
        assert_eq!(
            head,
            FrameHead {
                bytes: 112,
                code: 4,
                previous: 3,
                instr: 13,
                instr_shift: 0,
                owner: 0,
                owner_shift: 0,
                owner_mask: 0
            }
        );
        assert_eq!(lasti(100).frame_head().map(|h| (h.bytes, h.instr, h.instr_shift)), Some((104, 12, 32)));
        assert_eq!(lasti(102).frame_head(), None);
        // An interpreter frame's instruction pointer stays 8-aligned.
        assert_eq!(config(32, 24, 100, 69).frame_head(), None);
    }

    #[test]
    fn a_frame_head_that_cannot_be_read_in_one_go_is_refused() {
        assert_eq!(config(0, 8, 128, 70).frame_head(), None);
        assert_eq!(config(0, 8, 56, 128).frame_head(), None);
        assert_eq!(config(4, 8, 56, 70).frame_head(), None);
        assert_eq!(config(0, u64::MAX - 7, 56, 70).frame_head(), None);
    }
}
