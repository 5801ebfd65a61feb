//! With `--native --live`, libc's allocator calls in the live step: each
//! pushes its own frame, whose return gives the block, or serves the API
//! call whose inlined allocator called it.

use aya_ebpf::bindings::pt_regs;
use tracer_common::{
    live::{API_FRAME_ROOM, FRAME_DEPTH, Frame, Role, UNKNOWN_BLOCK, kind},
    stats::Stat,
};

use super::{FRAMES, frames_of, ids, push, role_of, take};


/// With `--native`, at the entry of libc's allocator function of slot
/// `slot` (`marked`: a call site inside another one marked it nested):
/// pushes its frame, whose return gives the block (or ends a free's call),
/// and takes a freed block out now. A call inside another allocator call
/// (an enclosing frame, above on the stack, or an interpreter's
/// implementation at the same stack pointer, which jumped to it), or
/// marked, is nested: its
/// block is the outer call's. A marked entry at the stack pointer of the
/// frame on top is a jump into it: the same call, re-entered from its own
/// code (pushes nothing), or a tail call from another function, whose
/// return comes first (a nested frame), then the outer's at the same
/// stack pointer. `stack` is the call's walk (see [`walked`]).
#[inline(always)]
pub fn native(regs: *mut pt_regs, tgid: u32, slot: u32, marked: bool, sp: u64, stack: u64) -> Result<(), Stat> {
    let role = role_of(slot);
    if !role.is_native() {
        return Ok(());
    }
    let r = role.kind();
    // The ABI's first three arguments, which the role picks from, each
    // read at its own constant offset: the verifier refuses a context
    // pointer moved by a computed one, which arguments picked per role
    // become.
    // SAFETY: regs is the context the kernel passed, readable directly.
    let (a0, a1, a2) = unsafe {
        (
            core::ptr::read_volatile(&raw const (*regs).rdi),
            core::ptr::read_volatile(&raw const (*regs).rsi),
            core::ptr::read_volatile(&raw const (*regs).rdx),
        )
    };
    let (_, tid) = ids();
    let mut inside = marked;
    let mut top = Frame::default();
    if let Some(frames) = FRAMES.get_ptr_mut(&tid) {
        // SAFETY: a valid pointer to the value, which only this thread uses.
        let frames = unsafe { &mut *frames };
        let depth = usize::try_from(frames.depth).unwrap_or(0).min(FRAME_DEPTH);
        for f in frames.frames.iter().take(depth) {
            // An interpreter's implementation may jump to libc's function
            // (`_PyMem_RawMalloc` to `malloc`): at its own stack pointer,
            // it encloses the call too.
            let python = matches!(f.kind, kind::OUTER | kind::NESTED) && f.sp >= sp;
            inside |= python || (matches!(f.kind, kind::NATIVE | kind::NATIVE_NESTED) && f.sp > sp);
        }
        top = frames.frames.get(depth.wrapping_sub(1)).copied().unwrap_or_default();
        if matches!(top.kind, kind::NATIVE | kind::NATIVE_NESTED) && top.sp == sp && !marked {
            // A call at the stack pointer of one whose return was lost
            // (an unwind): that one is over.
            frames.depth = depth.wrapping_sub(1) as u64;
            top = Frame::default();
        }
    }
    let jumped = marked && top.sp == sp && matches!(top.kind, kind::NATIVE | kind::NATIVE_NESTED);
    if jumped && top.slot == slot {
        return Ok(());
    }
    inside |= jumped;
    let (size, mut old) = match r {
        Role::MALLOC => (a0, 0),
        // Saturated: its counting probe counts the overflow.
        Role::CALLOC => (crate::args::product(a0, a1).unwrap_or(u64::MAX), 0),
        Role::REALLOC => (a1, a0),
        Role::ALIGNED | Role::MMAP => (a1, 0),
        // `old` is where the block will be written.
        Role::MEMALIGN => (a2, a0),
        Role::FREE | Role::MUNMAP => (0, a0),
        _ => return Ok(()),
    };
    if !inside && top.kind == kind::API && top.sp.abs_diff(sp) <= API_FRAME_ROOM && implements(&top, r, size, old) {
        // The API call's own allocator, inlined into its caller (LTO),
        // calls libc directly: this call is its implementation, and its
        // block is the API call's domain's.
        if r == Role::FREE && top.old == 0 {
            take(tgid, old, top.domain);
        }
        let old = if r == Role::REALLOC { old } else { 0 };
        // The raw allocator asks libc for 1 byte where it was asked for 0.
        let size = if top.size == 0 && size == 1 { 0 } else { size };
        let frame = Frame { size, old, stack: top.stack, sp, domain: top.domain, slot: top.slot, kind: kind::OUTER, role: r, ..Frame::default() };
        let frames = frames_of(tid).ok_or(Stat::LivePendingFull)?;
        // SAFETY: a valid pointer to the value, which only this thread uses.
        return push(unsafe { &mut *frames }, frame);
    }
    let domain = tracer_common::sizes::Domain::Native as u32;
    if !inside && old != 0 && (matches!(r, Role::FREE | Role::MUNMAP) || (r == Role::REALLOC && size == 0)) {
        // glibc's realloc(p, 0) frees p and returns NULL.
        take(tgid, old, domain);
        old = 0;
    }
    let kind = if inside { kind::NATIVE_NESTED } else { kind::NATIVE };
    let frame = Frame { size, old, stack, sp, domain, slot, kind, role: r, ..Frame::default() };
    let frames = frames_of(tid).ok_or(Stat::LivePendingFull)?;
    // SAFETY: a valid pointer to the value, which only this thread uses.
    push(unsafe { &mut *frames }, frame)
}

/// Whether a libc call of role `r` (requesting `size`, or freeing or
/// moving `old`) is what the API call `api`, on top of its thread's stack
/// and unserved, runs: an API call whose allocator is inlined into its
/// caller (LTO) and passes its request on to libc (pymalloc's requests
/// over 512 bytes, the raw domain's every call) calls libc's function of
/// its own role with its own size (a request of 0 the raw allocator makes
/// 1; a call of unknown size is never taken for another's) or block,
/// or a realloc that moves a pymalloc block (or has none) libc's `malloc`.
/// An allocation pymalloc served inline ([`predict`]) calls nothing.
#[inline(always)]
fn implements(api: &Frame, r: Role, size: u64, old: u64) -> bool {
    match r {
        Role::MALLOC | Role::CALLOC => {
            (api.role == r || (api.role == Role::REALLOC && r == Role::MALLOC))
                && api.predicted == 0
                && (api.size == size || (api.size == 0 && size == 1))
        }
        Role::REALLOC => {
            api.role == r
                && (api.size == size || (api.size == 0 && size == 1))
                && (api.old == UNKNOWN_BLOCK || api.old == old)
        }
        Role::FREE => api.role == Role::FREE && old != 0 && (api.old == 0 || api.old == old),
        _ => false,
    }
}

/// A libc call's block from its return value: `mmap`'s `MAP_FAILED` is
/// none, and `posix_memalign`'s is at the pointer its entry saved, where
/// it returned 0.
#[inline(always)]
pub(super) fn native_result(frame: Frame, rax: u64) -> Result<(u64, Frame), Stat> {
    match frame.role {
        Role::MMAP if rax == u64::MAX => Ok((0, frame)),
        // Took its block at its entry.
        Role::FREE | Role::MUNMAP => Ok((0, frame)),
        Role::MEMALIGN => {
            let at = frame.old;
            let frame = Frame { old: 0, ..frame };
            // An int: the upper half of rax is not the result's.
            if rax & 0xffff_ffff != 0 {
                return Ok((0, frame));
            }
            // SAFETY: the helper reads the probed thread's memory and fails
            // (counted) rather than fault.
            let block = unsafe { aya_ebpf::helpers::bpf_probe_read_user(at as *const u64) }
                .map_err(|_| Stat::ArgMissing)?;
            Ok((block, frame))
        }
        _ => Ok((rax, frame)),
    }
}

