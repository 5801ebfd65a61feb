//! `--types`: each new reference counts its object under its type and
//! keeps it in the objects table; the object domain's free finds the
//! object its block holds there and counts it destroyed.

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST},
    helpers::{bpf_probe_read_user, generated::bpf_get_attach_cookie},
    macros::{map, uprobe},
    maps::{HashMap, PerCpuHashMap},
    programs::ProbeContext,
};
use tracer_common::{
    counter::CounterKey,
    site,
    stats::Stat,
    types::{DEFAULT_OBJECT_ENTRIES, DEFAULT_TYPE_ENTRIES, ObjectKey, PRE_HEADERS, TypeCounts, TypeKey},
};

use crate::{COUNTERS, atomic_add, bump, check_target, operand, slot_of, stacks};

/// The offset of `ob_type` in an object, which the loader sets from the
/// version module.
#[unsafe(no_mangle)]
static OB_TYPE_OFFSET: u64 = 8;

/// With `--types`, creations and destructions per (process, type object).
/// The loader sets the size.
#[map]
static TYPES: PerCpuHashMap<TypeKey, TypeCounts> = PerCpuHashMap::with_max_entries(DEFAULT_TYPE_ENTRIES, 0);

/// With `--types`, every object seen created and not yet seen destroyed:
/// its type, by (process, address). Shared by the CPUs, since an object
/// may be freed on another CPU than it was made on. Not preallocated: the
/// loader makes the room large, and most runs use a fraction of it.
#[map]
static OBJECTS: HashMap<ObjectKey, u64> = HashMap::with_max_entries(DEFAULT_OBJECT_ENTRIES, BPF_F_NO_PREALLOC);

/// The sizes a freed block may start at before its object (the
/// pre-headers of the version: none, the GC header, the GC header and the
/// managed dict and weakref pointers), which the loader sets from the
/// version module; tried in order.
#[unsafe(no_mangle)]
static PRE_HEADERS_AT: [u64; PRE_HEADERS] = [0, 16, 32];

/// Counts a new reference, and the new object under its type: the object
/// is where the cookie's first operand says (`%rdi` at a function's entry,
/// or where an inlined copy's DWARF or code puts it).
#[uprobe]
pub fn count_object(ctx: ProbeContext) -> u32 {
    if let Err(stat) = try_count_object(&ctx) {
        bump(&ctx, stat);
    }
    0
}

#[inline(always)]
fn try_count_object(ctx: &ProbeContext) -> Result<(), Stat> {
    let tgid = check_target()?;
    // SAFETY: as in try_record: the helper reads this run's cookie.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let counter = slot_of(ctx, &COUNTERS, CounterKey { tgid, slot: site::slot(cookie) })?;
    // SAFETY: as in try_record. The call is counted before the type is
    // read, so that a failed read loses the type, never the call.
    unsafe { atomic_add(&raw mut (*counter).calls, 1) };
    let object = operand(ctx.regs, site::first(cookie), site::constant(cookie))?;
    // SAFETY: as for OB_TYPE_OFFSET's sibling TARGET_TGID: a plain global
    // the loader patches before load.
    let offset = unsafe { core::ptr::read_volatile(&raw const OB_TYPE_OFFSET) };
    // SAFETY: the helper reads the probed thread's memory and fails
    // (counted) rather than fault where it is not mapped.
    let type_address = unsafe { bpf_probe_read_user((object.wrapping_add(offset)) as *const u64) }
        .map_err(|_| Stat::TypeUnread)?;
    let counts = type_counts(TypeKey { tgid, reserved: 0, type_address })?;
    // SAFETY: as in try_record, a valid pointer to this CPU's value.
    unsafe { atomic_add(&raw mut (*counts).created, 1) };
    remember(ctx, ObjectKey { tgid, reserved: 0, address: object }, type_address);
    stacks(ctx, tgid, site::slot(cookie), 0);
    Ok(())
}

/// This CPU's counts of a (process, type), inserting zeros on first use.
#[inline(always)]
fn type_counts(key: TypeKey) -> Result<*mut TypeCounts, Stat> {
    match TYPES.get_ptr_mut(&key) {
        Some(counts) => Ok(counts),
        None => {
            // As in slot_of: insert zeros, then add to whatever is there.
            let _ = TYPES.insert(&key, &TypeCounts::default(), u64::from(BPF_NOEXIST));
            TYPES.get_ptr_mut(&key).ok_or(Stat::TypesFull)
        }
    }
}

/// Keeps a new object in the objects table. An object already there at
/// that address died without a free tracer saw (a free list gave its
/// memory out again): that is counted as its type's reuse.
#[inline(always)]
fn remember(ctx: &ProbeContext, key: ObjectKey, type_address: u64) {
    // SAFETY: a lookup whose value is copied out at once.
    if let Some(&old) = unsafe { OBJECTS.get(&key) } {
        match type_counts(TypeKey { tgid: key.tgid, reserved: 0, type_address: old }) {
            // SAFETY: as in try_record, a valid pointer to this CPU's value.
            Ok(counts) => unsafe { atomic_add(&raw mut (*counts).reused, 1) },
            Err(stat) => bump(ctx, stat),
        }
    }
    // BPF_ANY replaces the old entry in place, even in a full table.
    if OBJECTS.insert(&key, &type_address, 0).is_err() {
        bump(ctx, Stat::ObjectsFull);
    }
}

/// Counts a call of the object domain's free (`PyObject_Free`) and, with
/// `--types`, the destruction of the object whose block it frees: the
/// pointer is where the cookie's first operand says (`%rdi` at the entry,
/// or where an inlined copy's DWARF puts `ptr`).
#[uprobe]
pub fn free_object(ctx: ProbeContext) -> u32 {
    if let Err(stat) = try_free_object(&ctx) {
        bump(&ctx, stat);
    }
    0
}

#[inline(always)]
fn try_free_object(ctx: &ProbeContext) -> Result<(), Stat> {
    let tgid = check_target()?;
    // SAFETY: as in try_record: the helper reads this run's cookie.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let counter = slot_of(ctx, &COUNTERS, CounterKey { tgid, slot: site::slot(cookie) })?;
    // SAFETY: as in try_record; the call is counted first, whatever follows.
    unsafe { atomic_add(&raw mut (*counter).calls, 1) };
    // An inlined copy's second operand is `INLINED` (a free reads one):
    // with --live, its call leaves its domain for the implementation it
    // calls, as `count_call` does at the copies of a free without --types.
    // The block as a plain value on every path, and whether it was read:
    // a `Result` kept across the live call spills its payload even where
    // it is undefined, which the verifier refuses.
    let (block, read) = match operand(ctx.regs, site::first(cookie), site::constant(cookie)) {
        Ok(block) => (block, true),
        Err(_) => (crate::live::UNKNOWN_BLOCK, false),
    };
    if site::second(cookie) == site::INLINED
        && crate::live::on()
        && let Err(stat) = crate::live::api(ctx.regs, site::slot(cookie), 0, block)
    {
        bump(ctx, stat);
    }
    if !read {
        return Err(Stat::FreeArgMissing);
    }
    if block == 0 {
        return Ok(());
    }
    // SAFETY: plain globals the loader patches before load.
    let offset = unsafe { core::ptr::read_volatile(&raw const OB_TYPE_OFFSET) };
    // The block's object starts after its pre-header. An entry at a
    // candidate address is the freed object only if that memory still
    // holds its type (nothing has written the block yet at the free's
    // entry): a smaller object in the next block, or a stale entry, does
    // not match, and is left alone.
    for i in 0..PRE_HEADERS {
        // SAFETY: as above; `i` is below the array's length.
        let pre = unsafe { core::ptr::read_volatile((&raw const PRE_HEADERS_AT).cast::<u64>().add(i)) };
        let key = ObjectKey { tgid, reserved: 0, address: block.wrapping_add(pre) };
        // SAFETY: a lookup whose value is copied out at once.
        let Some(&type_address) = (unsafe { OBJECTS.get(&key) }) else { continue };
        // SAFETY: the helper reads the probed thread's memory and fails
        // rather than fault.
        let now = unsafe { bpf_probe_read_user((key.address.wrapping_add(offset)) as *const u64) };
        if now != Ok(type_address) {
            continue;
        }
        // Another CPU cannot free the same block at once (the GIL); a
        // failed removal would only leave the entry for a reuse to count.
        let _ = OBJECTS.remove(&key);
        let counts = type_counts(TypeKey { tgid, reserved: 0, type_address })?;
        // SAFETY: as in try_record, a valid pointer to this CPU's value.
        unsafe { atomic_add(&raw mut (*counts).destroyed, 1) };
        return Ok(());
    }
    Ok(())
}

