//! The counts a census keeps while it reads: per type, per size class, and
//! every candidate it refused or lead it did not follow, by why.

use super::model::Blocks;
use crate::python::heap::SIZE_CLASSES;

/// Why a candidate object was refused, or a lead not followed (a read
/// that failed, a header that is none, a limit reached): each is counted,
/// so that no skip is silent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// Its `ob_type` is no type object.
    NotAType,
    /// Its type puts its instances at another offset in their block.
    PreHeader,
    /// Its reference count is 0: freed, kept on a free list (3.11 to 3.13)
    /// or being destroyed.
    Freed,
    /// 3.14: its first word links it into a free list.
    FreeListLink,
    /// Its first word is no live object's reference count.
    Refcount,
    /// Its size does not fit its block.
    TooLarge,
    /// Its contents contradict its type: a string's state, a negative
    /// size.
    Contents,
    /// What precedes it is no GC head, which its type says there is.
    GcHead,
    /// A GC link outside the pools leads to no GC object.
    NotGcObject,
    /// A GC object outside the pools whose neighbour does not link back.
    BrokenLink,
    /// An item of a tuple or list outside the pools that is no object.
    NotAnObject,
    /// An item outside the pools in a file's mapping: a static object of
    /// an image (`None`, small ints), not the heap's.
    Static,
    /// A generation's head or a GC link outside the pools that could not
    /// be read.
    GcUnreadable,
    /// A GC link outside the pools that is NULL: a list is circular.
    GcLinkNull,
    /// An item array (of a tuple or list outside the pools, or any list)
    /// that could not be read.
    ItemsUnreadable,
    /// A list whose size exceeds its allocation, or with items and no
    /// array: its items are not read.
    ListBadSize,
    /// A dict's table outside every heap mapping: not read.
    DictNotInHeap,
    /// A dict's table whose header could not be read.
    DictUnreadable,
    /// A dict's table whose header is no table's.
    DictNotATable,
    /// A dict's entries that could not be read.
    DictEntriesUnreadable,
    /// A word of an interpreter's state (its link to the next, its
    /// collector's state) that could not be read.
    StateUnreadable,
    /// Interpreters past the most followed.
    InterpretersCut,
    /// A candidate whose type is past the most tracked (`TypeTable`'s
    /// limit): left out, and counted here.
    TypesCut,
    /// An object outside the pools whose size (from its type and its own
    /// words) runs past its mapping's end: counted at what the mapping
    /// holds.
    SizeBeyondMapping,
}

impl Reason {
    pub const ALL: [Self; 24] = [
        Self::NotAType,
        Self::PreHeader,
        Self::Freed,
        Self::FreeListLink,
        Self::Refcount,
        Self::TooLarge,
        Self::Contents,
        Self::GcHead,
        Self::NotGcObject,
        Self::BrokenLink,
        Self::NotAnObject,
        Self::Static,
        Self::GcUnreadable,
        Self::GcLinkNull,
        Self::ItemsUnreadable,
        Self::ListBadSize,
        Self::DictNotInHeap,
        Self::DictUnreadable,
        Self::DictNotATable,
        Self::DictEntriesUnreadable,
        Self::StateUnreadable,
        Self::InterpretersCut,
        Self::TypesCut,
        Self::SizeBeyondMapping,
    ];

    /// Whether it is a candidate object refused (else a lead not
    /// followed).
    #[must_use]
    pub const fn is_candidate(self) -> bool {
        (self as usize) <= Self::Static as usize || matches!(self, Self::TypesCut)
    }

    /// Its name in the JSON.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Self::NotAType => "not_a_type",
            Self::PreHeader => "pre_header",
            Self::Freed => "refcount_zero",
            Self::FreeListLink => "free_list_link",
            Self::Refcount => "bad_refcount",
            Self::TooLarge => "larger_than_block",
            Self::Contents => "contents",
            Self::GcHead => "gc_head",
            Self::NotGcObject => "gc_link_not_an_object",
            Self::BrokenLink => "gc_link_broken",
            Self::NotAnObject => "item_not_an_object",
            Self::Static => "item_static",
            Self::GcUnreadable => "gc_link_unreadable",
            Self::GcLinkNull => "gc_link_null",
            Self::ItemsUnreadable => "items_unreadable",
            Self::ListBadSize => "list_bad_size",
            Self::DictNotInHeap => "dict_table_not_in_heap",
            Self::DictUnreadable => "dict_table_unreadable",
            Self::DictNotATable => "dict_table_invalid",
            Self::DictEntriesUnreadable => "dict_entries_unreadable",
            Self::StateUnreadable => "interpreter_state_unreadable",
            Self::InterpretersCut => "interpreters_cut",
            Self::TypesCut => "types_cut",
            Self::SizeBeyondMapping => "size_beyond_mapping",
        }
    }

    /// What it means, for the table.
    #[must_use]
    pub const fn describe(self) -> &'static str {
        match self {
            Self::NotAType => "ob_type is no type object",
            Self::PreHeader => "the type's pre-header puts its objects elsewhere in the block",
            Self::Freed => "reference count 0 (on a free list, or freed)",
            Self::FreeListLink => "first word links a free list (3.14)",
            Self::Refcount => "first word is no reference count",
            Self::TooLarge => "larger than its block",
            Self::Contents => "contents contradict the type (a string's end, an int's digits, a negative size)",
            Self::GcHead => "the type has a GC head, but the words before it are none",
            Self::NotGcObject => "a GC link outside the pools leads to no GC object",
            Self::BrokenLink => "a GC object outside the pools is not linked back (changed while read?)",
            Self::NotAnObject => "an item outside the pools is no object",
            Self::Static => "an item is a static object of an image, not the heap's",
            Self::GcUnreadable => "a generation's head or a GC link outside the pools could not be read",
            Self::GcLinkNull => "a GC link outside the pools is NULL (the list changed while read?)",
            Self::ItemsUnreadable => "an item array could not be read; its items were not followed",
            Self::ListBadSize => "a list's size exceeds its allocation; its items were not followed",
            Self::DictNotInHeap => "a dict's table is in no heap mapping; not read",
            Self::DictUnreadable => "a dict's table header could not be read",
            Self::DictNotATable => "a dict's table header is no table's; not followed",
            Self::DictEntriesUnreadable => "a dict's entries could not be read; not followed",
            Self::StateUnreadable => "a word of an interpreter's state could not be read",
            Self::InterpretersCut => "interpreters past the most followed (256)",
            Self::TypesCut => "candidates of types past the most tracked, left out (see partial)",
            Self::SizeBeyondMapping => "an object's size runs past its mapping; counted at what the mapping holds",
        }
    }
}

/// One type's objects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TypeCounts {
    /// Objects in pymalloc's pools, and their blocks' bytes.
    pub pool_objects: u64,
    pub pool_bytes: u64,
    /// Objects outside the pools, and their sizes.
    pub outside_objects: u64,
    pub outside_bytes: u64,
    /// Item arrays, tables and buffers of its objects that are blocks of
    /// their own outside the pools (list, dict, bytearray).
    pub buffer_bytes: u64,
}

/// Everything counted.
#[derive(Clone, Debug)]
pub struct Tally {
    pub classes: [Blocks; SIZE_CLASSES],
    /// By type index ([`super::types::TypeTable::infos`]).
    pub types: Vec<TypeCounts>,
    pub rejected: [u64; Reason::ALL.len()],
    /// Arenas with a pool found.
    pub arenas: u64,
    /// Pools that changed while read, twice.
    pub pools_changed: u64,
    /// The scan against pymalloc's arena table, where it was read.
    pub arena_check: Option<super::model::ArenaCheck>,
}

impl Default for Tally {
    fn default() -> Self {
        Self {
            classes: [Blocks::default(); SIZE_CLASSES],
            types: Vec::new(),
            rejected: [0; Reason::ALL.len()],
            arenas: 0,
            pools_changed: 0,
            arena_check: None,
        }
    }
}

impl Tally {
    pub const fn reject(&mut self, reason: Reason) {
        self.rejected[reason as usize] += 1;
    }

    fn of(&mut self, index: u32) -> &mut TypeCounts {
        let i = index as usize;
        if self.types.len() <= i {
            self.types.resize(i + 1, TypeCounts::default());
        }
        &mut self.types[i]
    }

    /// An object of type `index` in a pool block of `size` bytes.
    pub fn count_in_pool(&mut self, index: u32, size: u64) {
        let t = self.of(index);
        t.pool_objects += 1;
        t.pool_bytes += size;
    }

    /// An object of type `index` outside the pools, of `size` bytes.
    pub fn count_outside(&mut self, index: u32, size: u64) {
        let t = self.of(index);
        t.outside_objects += 1;
        t.outside_bytes = t.outside_bytes.saturating_add(size);
    }

    /// A block of its own outside the pools that an object of type `index`
    /// owns, of `size` bytes as the object says, at most `room` (what its
    /// mapping holds from its start: the size is the target's word).
    pub fn add_buffer_within(&mut self, index: u32, size: u64, room: u64) {
        let size = if size > room {
            self.reject(Reason::SizeBeyondMapping);
            room
        } else {
            size
        };
        self.add_buffer(index, size);
    }

    /// A block of its own outside the pools that an object of type `index`
    /// owns.
    pub fn add_buffer(&mut self, index: u32, size: u64) {
        let t = self.of(index);
        t.buffer_bytes = t.buffer_bytes.saturating_add(size);
    }
}
