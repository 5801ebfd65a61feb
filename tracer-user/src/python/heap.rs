//! What a heap census ([`crate::heap`]) needs to know of CPython's memory:
//! pymalloc's pools and arenas, the objects' headers and pre-headers, the
//! collector's generation lists and the shapes of the few built-in types
//! whose size depends on their contents. What is the same in every
//! supported version is here, with the CPython source it comes from; what
//! differs is a [`HeapLayout`] in each version module ([`super::Abi::heap`]).
//!
//! Every offset was checked against the DWARF of pyenv's 3.11.7, 3.12.1 and
//! 3.13.0, Debian's 3.11.2 (python3.11-dbg) and the forky root's 3.13.15 and
//! 3.14.8 (gdb's `ptype/o`; the unit test `heap_dwarf` repeats it with
//! gimli on every build of the machine).

/// pymalloc's block alignment and size-class step: `ALIGNMENT 16` on 64-bit
/// (Objects/obmalloc.c at v3.11.2; `Include/internal/pycore_obmalloc.h` at
/// v3.12.1, v3.13.0 and v3.14.8). Block size of class `i` is `(i + 1) * 16`.
pub const ALIGNMENT: u64 = 16;
/// `NB_SMALL_SIZE_CLASSES`: `SMALL_REQUEST_THRESHOLD` (512) / `ALIGNMENT`.
/// Larger requests go to `PyMem_RawMalloc` (the C library).
pub const SIZE_CLASSES: usize = 32;
/// The largest block pymalloc hands out (`SMALL_REQUEST_THRESHOLD`).
pub const SMALL_REQUEST_THRESHOLD: u64 = 512;
/// `POOL_SIZE`: `1 << POOL_BITS`, 14 with `USE_LARGE_POOLS`, which the
/// default `WITH_PYMALLOC_RADIX_TREE` turns on for 64-bit builds from
/// v3.10 to v3.14 (same files). Pools are aligned to it.
pub const POOL_SIZE: u64 = 1 << 14;
/// `ARENA_SIZE`: `1 << ARENA_BITS`, 20 with `USE_LARGE_ARENAS` (as
/// [`POOL_SIZE`]). An arena is one `mmap` of this size, aligned to a page
/// only, so its first pool starts at the next multiple of [`POOL_SIZE`]
/// and it holds 63 or 64 pools.
pub const ARENA_SIZE: u64 = 1 << 20;
/// pymalloc's pool and arena sizes, which a census scans and reads by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// `POOL_SIZE`: pools are aligned to it.
    pub pool: u64,
    /// `ARENA_SIZE`: an arena is one `mmap` of it.
    pub arena: u64,
}

impl Geometry {
    /// 3.10 to 3.14 on 64-bit: [`POOL_SIZE`] and [`ARENA_SIZE`].
    pub const LARGE: Self = Self { pool: POOL_SIZE, arena: ARENA_SIZE };
    /// 3.9: `POOL_SIZE` is `SYSTEM_PAGE_SIZE` (`1 << 12`) and `ARENA_SIZE`
    /// `256 << 10` (Objects/obmalloc.c at v3.9.18, which has neither
    /// `USE_LARGE_POOLS` nor `USE_LARGE_ARENAS`; `sys._debugmallocstats()`
    /// of pyenv's 3.9.18 says 4096-byte pools in 262144-byte arenas). An
    /// arena is page-aligned, so it holds exactly 64 pools.
    pub const SMALL: Self = Self { pool: 1 << 12, arena: 256 << 10 };
}

/// `POOL_OVERHEAD`: `sizeof(struct pool_header)` rounded up to
/// [`ALIGNMENT`], 48: the first block of a pool starts there.
pub const POOL_OVERHEAD: u64 = 48;

/// `struct pool_header` (Objects/obmalloc.c at v3.11.2;
/// `Include/internal/pycore_obmalloc.h` at v3.12.1, v3.13.0, v3.14.8):
/// `union { block *_padding; uint count; } ref` (0: blocks allocated),
/// `block *freeblock` (8: the pool's free list), `nextpool` (16),
/// `prevpool` (24), `uint arenaindex` (32), `uint szidx` (36: the size
/// class), `uint nextoffset` (40: the first block never handed out),
/// `uint maxnextoffset` (44: `POOL_SIZE - block size`).
pub mod pool_header {
    pub const COUNT: usize = 0;
    pub const FREEBLOCK: usize = 8;
    pub const ARENAINDEX: usize = 32;
    pub const SZIDX: usize = 36;
    pub const NEXTOFFSET: usize = 40;
    pub const MAXNEXTOFFSET: usize = 44;
}

/// `struct arena_object` (same files as [`pool_header`]), 48 bytes:
/// `uintptr_t address` (0: the slot has no arena), `block *pool_address`
/// (8: the next pool to carve; the pools below it have been used).
pub mod arena_object {
    pub const SIZE: u64 = 48;
    pub const ADDRESS: usize = 0;
    pub const POOL_ADDRESS: usize = 8;
    /// `struct pool_header *freepools` (24): the arena's emptied pools,
    /// which `allocate_from_new_pool` takes before carving a new one.
    pub const FREEPOOLS: usize = 24;
}

/// `sizeof(PyGC_Head)`: two `uintptr_t`, `_gc_next` then `_gc_prev`
/// (`Include/internal/pycore_gc.h`, v3.11 to v3.14). `_gc_prev` keeps flags in
/// its two low bits, and `_gc_next` one during a collection
/// (`NEXT_MASK_UNREACHABLE`), so those are masked off before following
/// either. Only two: Debian's 3.13 aligns a `PyGC_Head` to 4 bytes, and
/// the generation lists' heads there are at 4-byte boundaries.
pub const GC_HEAD_SIZE: u64 = 16;
/// [`GC_HEAD_SIZE`], to index a copy.
pub const GC_HEAD: usize = 16;
/// The bits of a GC link that are flags, not address.
pub const GC_LINK_FLAGS: u64 = 3;

/// `PyObject` (Include/object.h, v3.11 to v3.14): the reference count (8
/// bytes) then `ob_type`; a variable-size object's `ob_size` follows (16).
pub const OB_TYPE: usize = 8;
pub const OB_SIZE: usize = 16;

/// `PyTypeObject` (Include/cpython/object.h, v3.11 to v3.14, the same on
/// every build here): `tp_name` (24), `tp_basicsize` (32), `tp_itemsize`
/// (40), `tp_flags` (168), `tp_base` (256).
pub mod type_object {
    pub const TP_NAME: usize = 24;
    pub const TP_BASICSIZE: usize = 32;
    pub const TP_ITEMSIZE: usize = 40;
    pub const TP_FLAGS: usize = 168;
    pub const TP_BASE: usize = 256;
    /// The bytes read of a type object: through `tp_base`.
    pub const READ: usize = 264;
}

/// `Py_TPFLAGS_*` (Include/object.h at v3.11.7 and v3.14.8).
pub mod tpflags {
    /// 3.12+: the object has a managed weak reference list in its
    /// pre-header (`1 << 3`).
    pub const MANAGED_WEAKREF: u64 = 1 << 3;
    /// The object has a managed dict in its pre-header (`1 << 4`, from 3.11).
    pub const MANAGED_DICT: u64 = 1 << 4;
    pub const HEAPTYPE: u64 = 1 << 9;
    pub const READY: u64 = 1 << 12;
    pub const HAVE_GC: u64 = 1 << 14;
    pub const LONG_SUBCLASS: u64 = 1 << 24;
    pub const LIST_SUBCLASS: u64 = 1 << 25;
    pub const TUPLE_SUBCLASS: u64 = 1 << 26;
    pub const BYTES_SUBCLASS: u64 = 1 << 27;
    pub const UNICODE_SUBCLASS: u64 = 1 << 28;
    pub const DICT_SUBCLASS: u64 = 1 << 29;
    pub const TYPE_SUBCLASS: u64 = 1 << 31;
}

/// `PyListObject` (Include/cpython/listobject.h, v3.11 to v3.14): after
/// `PyObject_VAR_HEAD` (`ob_size` at 16), `PyObject **ob_item` (24) and
/// `Py_ssize_t allocated` (32).
pub const LIST_OB_ITEM: usize = 24;
/// `PyBytesObject` and `PyLongObject` put their data at 24
/// (`ob_shash` then `ob_sval` at 32 for bytes; `ob_digit` at 24 for int:
/// Include/cpython/bytesobject.h, Include/cpython/longintrepr.h, v3.11 to
/// v3.14). An int's digits are 4 bytes (`PYLONG_BITS_IN_DIGIT` 30).
pub const LONG_DIGITS: u64 = 24;
pub const LONG_DIGIT_SIZE: u64 = 4;
/// `PyLong_SHIFT`: the bits of a digit that are used.
pub const LONG_DIGIT_BITS: u32 = 30;
/// `offsetof(PyBytesObject, ob_sval)`, whose `ob_size` bytes end in a NUL.
pub const BYTES_OB_SVAL: usize = 32;
/// `PyByteArrayObject` (Include/cpython/bytearrayobject.h, v3.11 to
/// v3.14): `Py_ssize_t ob_alloc` (24), the buffer `ob_bytes` (32, from
/// `PyObject_Malloc`).
pub const BYTEARRAY_OB_ALLOC: usize = 24;

/// Where an interpreter keeps pymalloc's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Obmalloc {
    /// 3.11: file-static variables of Objects/obmalloc.c, in `.symtab`
    /// only (`arenas.lto_priv.0` on LTO builds), found where the image or
    /// its debug file has a symbol table.
    Statics { arenas: &'static str, maxarenas: &'static str, raw_allocated_blocks: &'static str },
    /// 3.12: `struct _obmalloc_state` embedded at this offset in
    /// `PyInterpreterState`.
    Embedded { offset: u64 },
    /// 3.13+: a pointer to it at this offset in `PyInterpreterState` (the
    /// main interpreter's points to the static `obmalloc_state_main`).
    Pointer { offset: u64 },
}

/// `struct _obmalloc_state` (`Include/internal/pycore_obmalloc.h` at
/// v3.12.1, v3.13.0, v3.14.8): `pools.used[64]`, then `mgmt` at 512 with
/// `arenas` (512), `maxarenas` (520) and `raw_allocated_blocks` (1088).
pub mod obmalloc_state {
    pub const ARENAS: u64 = 512;
    pub const MAXARENAS: u64 = 520;
    /// `mgmt.usable_arenas` (536): the arenas with a free pool, the one
    /// `allocate_from_new_pool` takes a pool from first.
    pub const USABLE_ARENAS: u64 = 536;
    pub const RAW_ALLOCATED_BLOCKS: u64 = 1088;
}

/// What a live object's first word (`ob_refcnt`) may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refcount {
    /// 3.11 to 3.13: a `Py_ssize_t` count; 3.12 and 3.13 saturate the low
    /// 32 bits at `UINT_MAX` for immortal objects and never carry into the
    /// high ones (Include/object.h at v3.12.1 and v3.13.0, `Py_INCREF`).
    /// Anything at or above 2^32 is no count.
    Plain,
    /// 3.14: `uint32_t ob_refcnt`, `uint16_t ob_overflow`, `uint16_t
    /// ob_flags` (Include/object.h at v3.14.8), the count saturating at
    /// `_Py_IMMORTAL_INITIAL_REFCNT` (3 << 30, Include/refcount.h); the
    /// flags are `_Py_IMMORTAL_FLAGS` (1) and
    /// `_Py_STATICALLY_ALLOCATED_FLAG` (4). The free lists
    /// (`_PyFreeList_Push`, `Include/internal/pycore_freelist.h` at v3.14.8)
    /// link a freed object through this word, so there it holds a pointer.
    Split,
}

impl Refcount {
    /// Whether `word` is the reference count of a live object.
    #[must_use]
    pub const fn is_live(self, word: u64) -> bool {
        match self {
            Self::Plain => word != 0 && word >> 32 == 0,
            Self::Split => word & 0xFFFF_FFFF != 0 && (word >> 32).trailing_zeros() >= 16 && word >> 48 <= 7,
        }
    }
}

/// How an `int` says how many digits it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LongSize {
    /// 3.11: `ob_size`, negative for a negative number (Include/cpython/
    /// longintrepr.h at v3.11.7).
    SignedSize,
    /// 3.12+: `uintptr_t lv_tag` at 16, the digit count above its three
    /// low bits (`_PyLong_NON_SIZE_BITS`, Include/cpython/longintrepr.h at
    /// v3.12.1, v3.13.0 and v3.14.8).
    Tag,
}

/// What differs between versions for a heap census.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapLayout {
    /// `offsetof(PyInterpreterState, gc)`.
    pub interp_gc: u64,
    /// `offsetof(struct _gc_runtime_state, generation0)`: a pointer to
    /// `generations[0].head`, the first of three `struct gc_generation {
    /// PyGC_Head head; int threshold; int count; }` (24 bytes each). The
    /// census follows it rather than take `generations` at a fixed offset:
    /// upstream puts them at 24, but Debian's 3.13 gives `PyGC_Head` a
    /// 4-byte alignment (its patch `gchead-alignment.diff`, a backport of
    /// gh-127545), which moves them to 20 (DWARF of the forky root's
    /// 3.13.15); `generation0` and what follows stay where they are.
    pub generation0: u64,
    /// `offsetof(struct _gc_runtime_state, permanent_generation)`.
    pub permanent: u64,
    /// `offsetof(struct _gc_runtime_state, collecting)`: set while a
    /// collection rewrites the lists.
    pub collecting: u64,
    /// `offsetof(PyTupleObject, ob_item)`.
    pub tuple_items: u64,
    pub obmalloc: Obmalloc,
    pub refcount: Refcount,
    /// The `tp_flags` that put two words of managed dict or weak references
    /// before the object (`_PyType_PreHeaderSize`,
    /// `Include/internal/pycore_object.h`).
    pub preheader_flags: u64,
    pub long: LongSize,
    /// How a dict's keys object is laid out.
    pub dict_keys: DictKeys,
    pub geometry: Geometry,
}

/// How a dict's keys object (`PyDictKeysObject`) is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DictKeys {
    /// 3.11+: the sizes as logarithms and a kind (`struct _dictkeysobject`
    /// in `Include/internal/pycore_dict.h`, see
    /// [`super::DK_KIND_OFFSET`] and its neighbours).
    Log2,
    /// 3.9, 3.10: `Py_ssize_t dk_refcnt` (0), `Py_ssize_t dk_size` (8),
    /// `dict_lookup_func dk_lookup` (16), `dk_usable` (24), `dk_nentries`
    /// (32), `char dk_indices[]` (40) of `DK_IXSIZE` bytes each (1 for up
    /// to 0xff slots, 2 to 0xffff, 4 to 0xffffffff, else 8), then the
    /// entries, always `PyDictKeyEntry` (`me_hash`, `me_key`, `me_value`):
    /// Objects/dict-common.h at v3.9.18 and v3.10.13 (gdb's `ptype /o` on
    /// pyenv's builds). `new_keys_object` (Objects/dictobject.c) allocates
    /// `sizeof(PyDictKeysObject) + es * size + sizeof(PyDictKeyEntry) *
    /// usable`.
    Sized,
}

/// A keys object's shape, read from its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeysShape {
    /// `dk_refcnt`: 1 where only its dict uses it.
    pub refcnt: u64,
    /// Where the entries start, from the keys object's start.
    pub entries: u64,
    pub nentries: u64,
    /// 24 (`(hash, key, value)`) or 16 (3.11+'s `(key, value)` of a
    /// `str`-keyed table).
    pub entry_size: u64,
    /// Where an entry's key is in it (its value follows).
    pub key_at: u64,
    /// The bytes of the whole keys object.
    pub size: u64,
}

/// `PyDict_MINSIZE` is 8: a table has at least 2^3 slots.
const DICT_MIN_LOG2_SIZE: u32 = 3;
/// A table of more than 2^40 slots is no table.
const DICT_MAX_LOG2_SIZE: u32 = 40;

impl DictKeys {
    /// The bytes of a keys object's header: what [`Self::parse`] reads.
    #[must_use]
    pub const fn header(self) -> usize {
        match self {
            Self::Log2 => 32,
            Self::Sized => 40,
        }
    }

    /// The shape of the keys object whose header is `head`, if the header
    /// is one of a combined dict: a size from 8 slots, a power of two up
    /// to 2^40; 3.11+: index bytes for it (`dk_log2_index_bytes` is
    /// `dk_log2_size` plus 0 to 3, `new_keys_object` in
    /// Objects/dictobject.c) and a kind that is not split; no more entries
    /// than `USABLE_FRACTION` (2/3) of the slots.
    #[must_use]
    pub fn parse(self, head: &[u8]) -> Option<KeysShape> {
        let byte = |at: u64| head.get(usize::try_from(at).ok()?).copied().map(u32::from);
        let word = |at: u64| {
            let at = usize::try_from(at).ok()?;
            head.get(at..at.checked_add(8)?).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes)
        };
        let (log2_size, index_bytes, entry_size, key_at, nentries) = match self {
            Self::Log2 => {
                let (log2_size, log2_index_bytes, kind) =
                    (byte(8)?, byte(super::DK_LOG2_INDEX_BYTES_OFFSET)?, byte(super::DK_KIND_OFFSET)?);
                if !(log2_size..=log2_size + 3).contains(&log2_index_bytes) || kind > 1 || log2_index_bytes > 63 {
                    return None;
                }
                let (entry_size, key_at) = if kind == 0 { (24, 8) } else { (16, 0) };
                (log2_size, 1u64 << log2_index_bytes, entry_size, key_at, word(super::DK_NENTRIES_OFFSET)?)
            }
            Self::Sized => {
                let size = word(8)?;
                if !size.is_power_of_two() {
                    return None;
                }
                let ixsize = match size {
                    0..=0xff => 1,
                    0x100..=0xffff => 2,
                    0x1_0000..=0xffff_ffff => 4,
                    _ => 8,
                };
                (size.trailing_zeros(), size.checked_mul(ixsize)?, 24, 8, word(32)?)
            }
        };
        if !(DICT_MIN_LOG2_SIZE..=DICT_MAX_LOG2_SIZE).contains(&log2_size) {
            return None;
        }
        let usable = (2u64 << log2_size) / 3;
        if nentries > usable {
            return None;
        }
        let start = self.header() as u64 + index_bytes;
        Some(KeysShape {
            refcnt: word(0)?,
            entries: start,
            nentries,
            entry_size,
            key_at,
            size: start + usable * entry_size,
        })
    }
}

/// `sizeof(struct gc_generation)`.
pub const GC_GENERATION_SIZE: u64 = 24;
/// `NUM_GENERATIONS` (`Include/internal/pycore_gc.h`, v3.11 to v3.14.8).
pub const GENERATIONS: u64 = 3;

impl HeapLayout {
    /// `_PyType_PreHeaderSize`: what comes before an object of a type with
    /// `flags` in its block: the GC head for a GC type, then two words
    /// where the type has a managed dict or weak references.
    #[must_use]
    pub const fn preheader(&self, flags: u64) -> u64 {
        let gc = if flags & tpflags::HAVE_GC != 0 { GC_HEAD_SIZE } else { 0 };
        let managed = if flags & self.preheader_flags != 0 { 16 } else { 0 };
        gc + managed
    }
}

/// What [`HeapLayout`] and the constants here say each offset is, as
/// (type, member path or "sizeof", value), for the comparison with every
/// build's DWARF in `frames::dwarf`.
#[cfg(test)]
#[must_use]
pub fn dwarf_expectations(abi: &dyn super::Abi) -> Vec<(&'static str, String, u64)> {
    let h = abi.heap();
    let m = |ty, path: &str, value: u64| (ty, path.to_owned(), value);
    let u = |v: usize| v as u64;
    let mut all = vec![
        m("PyInterpreterState", "gc", h.interp_gc),
        m("_gc_runtime_state", "generation0", h.generation0),
        m("_gc_runtime_state", "permanent_generation", h.permanent),
        m("_gc_runtime_state", "collecting", h.collecting),
        m("gc_generation", "sizeof", GC_GENERATION_SIZE),
        m("gc_generation", "head", 0),
        m("PyGC_Head", "sizeof", GC_HEAD_SIZE),
        m("pool_header", "sizeof", POOL_OVERHEAD),
        m("pool_header", "ref", u(pool_header::COUNT)),
        m("pool_header", "freeblock", u(pool_header::FREEBLOCK)),
        m("pool_header", "arenaindex", u(pool_header::ARENAINDEX)),
        m("pool_header", "szidx", u(pool_header::SZIDX)),
        m("pool_header", "nextoffset", u(pool_header::NEXTOFFSET)),
        m("pool_header", "maxnextoffset", u(pool_header::MAXNEXTOFFSET)),
        m("arena_object", "sizeof", arena_object::SIZE),
        m("arena_object", "address", u(arena_object::ADDRESS)),
        m("arena_object", "pool_address", u(arena_object::POOL_ADDRESS)),
        m("arena_object", "freepools", u(arena_object::FREEPOOLS)),
        m("PyTypeObject", "tp_name", u(type_object::TP_NAME)),
        m("PyTypeObject", "tp_basicsize", u(type_object::TP_BASICSIZE)),
        m("PyTypeObject", "tp_itemsize", u(type_object::TP_ITEMSIZE)),
        m("PyTypeObject", "tp_flags", u(type_object::TP_FLAGS)),
        m("PyTypeObject", "tp_base", u(type_object::TP_BASE)),
        m("PyObject", "ob_type", u(OB_TYPE)),
        m("PyVarObject", "ob_size", u(OB_SIZE)),
        m("PyListObject", "ob_item", u(LIST_OB_ITEM)),
        m("PyListObject", "allocated", u(LIST_OB_ITEM) + 8),
        m("PyTupleObject", "ob_item", h.tuple_items),
        m("PyByteArrayObject", "ob_alloc", u(BYTEARRAY_OB_ALLOC)),
        m("PyByteArrayObject", "ob_bytes", u(BYTEARRAY_OB_ALLOC) + 8),
    ];
    match h.long {
        LongSize::SignedSize => all.push(m("PyLongObject", "ob_digit", LONG_DIGITS)),
        LongSize::Tag => {
            all.push(m("PyLongObject", "long_value.lv_tag", u(OB_SIZE)));
            all.push(m("PyLongObject", "long_value.ob_digit", LONG_DIGITS));
        }
    }
    if h.dict_keys == DictKeys::Sized {
        all.push(m("PyDictKeysObject", "dk_size", 8));
        all.push(m("PyDictKeysObject", "dk_nentries", 32));
        all.push(m("PyDictKeysObject", "dk_indices", u(DictKeys::Sized.header())));
        all.push(m("PyDictKeyEntry", "sizeof", 24));
        all.push(m("PyDictKeyEntry", "me_key", 8));
    }
    match h.obmalloc {
        Obmalloc::Statics { .. } => {}
        Obmalloc::Embedded { offset } | Obmalloc::Pointer { offset } => {
            all.push(m("PyInterpreterState", "obmalloc", offset));
            all.push(m("_obmalloc_state", "mgmt.arenas", obmalloc_state::ARENAS));
            all.push(m("_obmalloc_state", "mgmt.maxarenas", obmalloc_state::MAXARENAS));
            all.push(m("_obmalloc_state", "mgmt.usable_arenas", obmalloc_state::USABLE_ARENAS));
            all.push(m("_obmalloc_state", "mgmt.raw_allocated_blocks", obmalloc_state::RAW_ALLOCATED_BLOCKS));
        }
    }
    all
}

/// The [`HeapLayout`] of 3.9 and 3.10, as far as it is 3.11's: the
/// collector's state at `interp_gc` in the interpreter
/// (`Include/internal/pycore_interp.h` at v3.9.18 and v3.10.13: 616) and
/// laid out as 3.11's
/// (`Include/internal/pycore_gc.h`, checked with gdb's `ptype /o` on pyenv's
/// builds), pymalloc's state in file statics (Objects/obmalloc.c), no
/// pre-header but the GC head (no managed dicts before 3.11), and `int`'s
/// digit count in a signed `ob_size`, dict keys [`DictKeys::Sized`]; 3.9's
/// pools and arenas are [`Geometry::SMALL`], 3.10's [`Geometry::LARGE`].
#[must_use]
pub const fn before_3_11(interp_gc: u64, geometry: Geometry) -> HeapLayout {
    HeapLayout {
        interp_gc,
        generation0: 96,
        permanent: 104,
        collecting: 200,
        tuple_items: 24,
        obmalloc: Obmalloc::Statics {
            arenas: "arenas",
            maxarenas: "maxarenas",
            raw_allocated_blocks: "raw_allocated_blocks",
        },
        refcount: Refcount::Plain,
        preheader_flags: 0,
        long: LongSize::SignedSize,
        dict_keys: DictKeys::Sized,
        geometry,
    }
}
