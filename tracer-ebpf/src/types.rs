//! The types step (`--types`): each new reference counts its object under
//! its type and keeps it in the objects table; the object domain's free
//! finds the object its block holds there and counts it destroyed.

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST},
    helpers::bpf_probe_read_user,
    macros::map,
    maps::{HashMap, PerCpuHashMap},
};
use tracer_common::{
    stats::Stat,
    types::{DEFAULT_OBJECT_ENTRIES, DEFAULT_TYPE_ENTRIES, ObjectKey, PRE_HEADERS, TypeCounts, TypeKey},
};

use crate::common::{atomic_add, bump};

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

/// The type of the object at `object`, as its memory says now.
#[inline(always)]
fn type_of(object: u64) -> Result<u64, ()> {
    // SAFETY: a plain global the loader patches before load.
    let offset = unsafe { core::ptr::read_volatile(&raw const OB_TYPE_OFFSET) };
    // SAFETY: the helper reads the probed thread's memory and fails
    // (counted) rather than fault where it is not mapped.
    unsafe { bpf_probe_read_user((object.wrapping_add(offset)) as *const u64) }.map_err(|_| ())
}

/// A new reference to `object` (the process's `tgid`): counted created
/// under its type, and kept in the objects table. Its call is counted
/// already, so a failed read loses the type, never the call.
#[inline(always)]
pub fn created<C: EbpfContext>(ctx: &C, tgid: u32, object: u64) -> Result<(), Stat> {
    let type_address = type_of(object).map_err(|()| Stat::TypeUnread)?;
    let counts = type_counts(TypeKey { tgid, reserved: 0, type_address })?;
    // SAFETY: a valid pointer to this CPU's value, as in [`crate::count`].
    unsafe { atomic_add(&raw mut (*counts).created, 1) };
    remember(ctx, ObjectKey { tgid, reserved: 0, address: object }, type_address);
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
fn remember<C: EbpfContext>(ctx: &C, key: ObjectKey, type_address: u64) {
    // SAFETY: a lookup whose value is copied out at once.
    if let Some(&old) = unsafe { OBJECTS.get(&key) } {
        match type_counts(TypeKey { tgid: key.tgid, reserved: 0, type_address: old }) {
            // SAFETY: a valid pointer to this CPU's value.
            Ok(counts) => unsafe { atomic_add(&raw mut (*counts).reused, 1) },
            Err(stat) => bump(ctx, stat),
        }
    }
    // BPF_ANY replaces the old entry in place, even in a full table.
    if OBJECTS.insert(&key, &type_address, 0).is_err() {
        bump(ctx, Stat::ObjectsFull);
    }
}

/// A free of `block` in the object domain (the process's `tgid`): the
/// object it holds, if the table has it, counted destroyed.
#[inline(always)]
pub fn destroyed(tgid: u32, block: u64) -> Result<(), Stat> {
    if block == 0 {
        return Ok(());
    }
    // The block's object starts after its pre-header. An entry at a
    // candidate address is the freed object only if that memory still
    // holds its type (nothing has written the block yet at the free's
    // entry): a smaller object in the next block, or a stale entry, does
    // not match, and is left alone.
    for i in 0..PRE_HEADERS {
        // SAFETY: a plain global the loader patches before load; `i` is
        // below the array's length.
        let pre = unsafe { core::ptr::read_volatile((&raw const PRE_HEADERS_AT).cast::<u64>().add(i)) };
        let key = ObjectKey { tgid, reserved: 0, address: block.wrapping_add(pre) };
        // SAFETY: a lookup whose value is copied out at once.
        let Some(&type_address) = (unsafe { OBJECTS.get(&key) }) else { continue };
        if type_of(key.address) != Ok(type_address) {
            continue;
        }
        // Another CPU cannot free the same block at once (the GIL); a
        // failed removal would only leave the entry for a reuse to count.
        let _ = OBJECTS.remove(&key);
        let counts = type_counts(TypeKey { tgid, reserved: 0, type_address })?;
        // SAFETY: a valid pointer to this CPU's value.
        unsafe { atomic_add(&raw mut (*counts).destroyed, 1) };
        return Ok(());
    }
    Ok(())
}
