//! Which addresses are type objects, and what each type says of its
//! instances' size. A census asks this of every candidate object's
//! `ob_type`, most of which are no type at all (the words of list item
//! arrays, dict tables, strings): the answer is cached per address, and an
//! address inside a pymalloc pool is refused without a read, since no type
//! object fits a pool (`sizeof(PyHeapTypeObject)` is over 900 bytes, and
//! static types are in the images' data).
//!
//! A type is accepted when its own `ob_type` is `type` (`PyType_Type`, from
//! the interpreter's dynamic symbols) or a metatype: a type, itself
//! accepted, with `Py_TPFLAGS_TYPE_SUBCLASS`; and when it is ready, with a
//! name and sizes in bounds.

use std::collections::HashMap;

use super::{
    HeapError,
    maps::Regions,
    memory::{Memory, word, word32},
    names,
    pools::PoolSet,
};
use crate::hash::BuildIdentity;
use crate::python::{
    TypeNameOffsets, UNICODE_ASCII_BIT, UNICODE_COMPACT_BIT, UNICODE_KIND_SHIFT,
    frames::UnicodeOffsets,
    heap::{
        BYTES_OB_SVAL, HeapLayout, LONG_DIGIT_BITS, LONG_DIGIT_SIZE, LONG_DIGITS, LongSize, OB_SIZE, tpflags,
        type_object,
    },
};

/// The largest `tp_basicsize` taken for a type's.
const MAX_BASICSIZE: u64 = 1 << 24;
/// The largest `tp_itemsize`.
const MAX_ITEMSIZE: u64 = 1 << 16;
/// Metatypes followed at most, for a type whose type's type... is `type`.
const MAX_META_DEPTH: u32 = 4;

/// How an instance's size follows from its contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `tp_basicsize`.
    Fixed,
    /// `tp_basicsize + |ob_size| * tp_itemsize`, rounded up to a word
    /// (`_PyObject_VAR_SIZE`).
    Var,
    /// A tuple: as [`Shape::Var`], items inline.
    Tuple,
    /// An exact `bytes`: as [`Shape::Var`], NUL-terminated.
    Bytes,
    /// An exact `str`: compact strings hold their characters.
    Str,
    /// An `int` or a subclass: its digit count is in `ob_size` (3.11) or
    /// `lv_tag` (3.12+), at least one digit allocated.
    Long,
    /// A list or subclass: its item array is a block of its own.
    List,
    /// An exact `bytearray`: its buffer is a block of its own.
    ByteArray,
    /// A dict or subclass: its table is a block of its own.
    Dict,
}

/// A type accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeInfo {
    pub address: u64,
    pub name: String,
    pub basicsize: u64,
    pub itemsize: u64,
    pub flags: u64,
    /// What comes before an instance in its block.
    pub preheader: u64,
    pub shape: Shape,
}

/// The exported types whose instances have a shape of their own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Builtins {
    /// `PyType_Type`.
    pub type_: u64,
    pub str_: u64,
    pub bytes: u64,
    pub bytearray: u64,
}

/// What a census needs to judge a type pointer.
pub struct Context<'a> {
    pub memory: &'a mut Memory,
    pub regions: &'a Regions,
    pub pools: &'a PoolSet,
}

/// Entries of the direct-mapped cache in front of the table.
const RECENT: usize = 1024;
/// A cached verdict: no type.
const NOT_A_TYPE: u32 = u32::MAX;
/// A cached verdict: a type past [`MAX_TYPES`], not tracked.
const CUT: u32 = u32::MAX - 1;
/// Types tracked at most: tracer's memory is bounded whatever the target
/// holds (a program has hundreds to a few thousand types); the objects of
/// the types past it are counted as cut ([`TypeTable::cut_objects`]).
pub const MAX_TYPES: usize = 1 << 16;
/// Verdicts kept at most (16 bytes each); past it pointers are judged
/// again each time (only the cost grows).
const MAX_VERDICTS: usize = 1 << 20;

/// Every type pointer judged so far.
#[derive(Debug)]
pub struct TypeTable {
    layout: HeapLayout,
    names: TypeNameOffsets,
    builtins: Builtins,
    verdicts: HashMap<u64, u32, BuildIdentity>,
    recent: Vec<(u64, u32)>,
    pub infos: Vec<TypeInfo>,
    /// Pointers read to be judged.
    pub reads: u64,
    /// Types found past [`MAX_TYPES`], and the candidates that pointed to
    /// one of them.
    pub cut_types: u64,
    pub cut_objects: u64,
    /// [`MAX_TYPES`], but in tests.
    max_types: usize,
}

impl TypeTable {
    #[must_use]
    pub fn new(layout: HeapLayout, names: TypeNameOffsets, builtins: Builtins) -> Self {
        Self {
            layout,
            names,
            builtins,
            verdicts: HashMap::with_hasher(BuildIdentity),
            recent: vec![(0, NOT_A_TYPE); RECENT],
            infos: Vec::new(),
            reads: 0,
            cut_types: 0,
            cut_objects: 0,
            max_types: MAX_TYPES,
        }
    }

    /// The index in [`Self::infos`] of the type at `pointer`, or `None`
    /// where it is no type.
    pub fn lookup(&mut self, pointer: u64, cx: &mut Context<'_>) -> Result<Option<u32>, HeapError> {
        if pointer == 0 || !pointer.is_multiple_of(8) {
            return Ok(None);
        }
        let slot = usize::try_from((pointer >> 3) % RECENT as u64).unwrap_or(0);
        let (key, verdict) = self.recent[slot];
        if key == pointer {
            return Ok(self.verdict(verdict));
        }
        if cx.pools.contains(pointer) {
            return Ok(None);
        }
        let verdict = self.judge(pointer, cx, 0)?;
        self.recent[slot] = (pointer, verdict);
        Ok(self.verdict(verdict))
    }

    /// A cached verdict as [`Self::lookup`] returns it, counting the
    /// candidates of types cut.
    const fn verdict(&mut self, verdict: u32) -> Option<u32> {
        match verdict {
            NOT_A_TYPE => None,
            CUT => {
                self.cut_objects += 1;
                None
            }
            index => Some(index),
        }
    }

    /// [`Self::lookup`] past the direct-mapped cache.
    /// The verdict is an index, [`NOT_A_TYPE`] or [`CUT`].
    fn judge(&mut self, pointer: u64, cx: &mut Context<'_>, depth: u32) -> Result<u32, HeapError> {
        if let Some(&verdict) = self.verdicts.get(&pointer) {
            return Ok(verdict);
        }
        let verdict = match self.read_type(pointer, cx, depth)? {
            Some(info) if self.infos.len() < self.max_types => {
                self.infos.push(info);
                u32::try_from(self.infos.len() - 1).unwrap_or(CUT)
            }
            Some(_) => {
                self.cut_types += 1;
                CUT
            }
            None => NOT_A_TYPE,
        };
        if self.verdicts.len() < MAX_VERDICTS {
            self.verdicts.insert(pointer, verdict);
        }
        Ok(verdict)
    }

    /// Reads the would-be type at `pointer` and judges it.
    fn read_type(&mut self, pointer: u64, cx: &mut Context<'_>, depth: u32) -> Result<Option<TypeInfo>, HeapError> {
        if pointer == 0 || !pointer.is_multiple_of(8) || cx.pools.contains(pointer) {
            return Ok(None);
        }
        if !cx.regions.readable(pointer, type_object::READ as u64) {
            return Ok(None);
        }
        self.reads += 1;
        let Some(head) = cx.memory.read(pointer, type_object::READ)? else { return Ok(None) };
        let meta = word(&head, 8);
        if meta != self.builtins.type_ {
            if depth >= MAX_META_DEPTH || meta == pointer {
                return Ok(None);
            }
            let meta = self.judge(meta, cx, depth + 1)?;
            // A metaclass cut is not known to be one: its instances are
            // not judged types.
            if self.infos.get(meta as usize).is_none_or(|m| m.flags & tpflags::TYPE_SUBCLASS == 0) {
                return Ok(None);
            }
        }
        let at = |offset: usize| word(&head, offset);
        let (basicsize, itemsize, flags) =
            (at(type_object::TP_BASICSIZE), at(type_object::TP_ITEMSIZE), at(type_object::TP_FLAGS));
        if flags & tpflags::READY == 0
            || !(16..=MAX_BASICSIZE).contains(&basicsize)
            || itemsize > MAX_ITEMSIZE
            || at(type_object::TP_NAME) == 0
        {
            return Ok(None);
        }
        let name = names::type_name(cx.memory, pointer, &head, self.names)?;
        let shape = if pointer == self.builtins.str_ {
            Shape::Str
        } else if pointer == self.builtins.bytes {
            Shape::Bytes
        } else if pointer == self.builtins.bytearray {
            Shape::ByteArray
        } else if flags & tpflags::LONG_SUBCLASS != 0 {
            Shape::Long
        } else if flags & tpflags::TUPLE_SUBCLASS != 0 && itemsize == 8 {
            Shape::Tuple
        } else if flags & tpflags::LIST_SUBCLASS != 0 {
            Shape::List
        } else if flags & tpflags::DICT_SUBCLASS != 0 {
            Shape::Dict
        } else if itemsize > 0 {
            Shape::Var
        } else {
            Shape::Fixed
        };
        let preheader = self.layout.preheader(flags);
        Ok(Some(TypeInfo { address: pointer, name, basicsize, itemsize, flags, preheader, shape }))
    }

    /// The bytes an instance of type `index` needs, its pre-header not
    /// included, from `object`: its bytes from its start (at least its
    /// first 40, where its block has them; fewer read as zeroes).
    #[must_use]
    pub fn object_size(&self, index: u32, object: &[u8], unicode: UnicodeOffsets) -> u64 {
        let t = &self.infos[index as usize];
        let ob_size = word(object, OB_SIZE);
        match t.shape {
            Shape::Fixed | Shape::List | Shape::ByteArray | Shape::Dict => t.basicsize,
            Shape::Var | Shape::Tuple | Shape::Bytes => {
                var_size(t.basicsize, ob_size.cast_signed().unsigned_abs(), t.itemsize)
            }
            Shape::Long => {
                let digits = match self.layout.long {
                    LongSize::SignedSize => ob_size.cast_signed().unsigned_abs(),
                    LongSize::Tag => ob_size >> 3,
                };
                var_size(t.basicsize, digits.max(1), LONG_DIGIT_SIZE.max(t.itemsize))
            }
            Shape::Str => {
                let state = word32(object, usize::try_from(unicode.state).unwrap_or(32));
                let length = word(object, usize::try_from(unicode.length).unwrap_or(16));
                let kind = u64::from((state >> UNICODE_KIND_SHIFT) & 7);
                if state & UNICODE_COMPACT_BIT == 0 || !matches!(kind, 1 | 2 | 4) {
                    t.basicsize
                } else if state & UNICODE_ASCII_BIT != 0 {
                    unicode.ascii_data.saturating_add(length.saturating_add(1))
                } else {
                    unicode.compact_data.saturating_add(length.saturating_add(1).saturating_mul(kind))
                }
            }
        }
    }

    /// Whether `object` (as for [`Self::object_size`]; what lies past its
    /// end is not checked) keeps the invariants of an instance of type
    /// `index`: a compact string's kind is 1, 2 or 4 (1 if ASCII), its
    /// characters end in a NUL and ASCII ones are below 128; a `bytes`
    /// ends in a NUL; an int's digits hold 30 bits; a size is not negative.
    /// Blocks that are no object (a dict's values, an item array) pass the
    /// other tests now and then, since a pointer to a type can follow a
    /// word that passes for a count; these catch most of them.
    #[must_use]
    pub fn plausible(&self, index: u32, object: &[u8], unicode: UnicodeOffsets) -> bool {
        let t = &self.infos[index as usize];
        let ob_size = word(object, OB_SIZE).cast_signed();
        match t.shape {
            Shape::Str => str_plausible(object, unicode),
            Shape::Bytes => {
                let end = usize::try_from(ob_size).ok().and_then(|n| n.checked_add(BYTES_OB_SVAL));
                end.is_some_and(|end| object.get(end).is_none_or(|&b| b == 0))
            }
            Shape::Var | Shape::Tuple | Shape::List => ob_size >= 0,
            Shape::Long => {
                let digits = match self.layout.long {
                    LongSize::SignedSize => ob_size.unsigned_abs(),
                    // The sign's two bits are never both set
                    // (`_PyLong_SIGN_MASK`, Include/internal/pycore_long.h).
                    LongSize::Tag if ob_size & 3 == 3 || ob_size < 0 => return false,
                    LongSize::Tag => ob_size.unsigned_abs() >> 3,
                };
                let digits = usize::try_from(digits).unwrap_or(usize::MAX);
                let first = usize::try_from(LONG_DIGITS).unwrap_or(24);
                (0..digits.min(object.len().saturating_sub(first) / 4))
                    .all(|i| word32(object, first + 4 * i) >> LONG_DIGIT_BITS == 0)
            }
            Shape::Fixed | Shape::ByteArray | Shape::Dict => true,
        }
    }

    #[must_use]
    pub fn info(&self, index: u32) -> &TypeInfo {
        &self.infos[index as usize]
    }

    /// The refcount rule of the version.
    #[must_use]
    pub const fn layout(&self) -> &HeapLayout {
        &self.layout
    }
}

/// See [`TypeTable::plausible`].
fn str_plausible(object: &[u8], unicode: UnicodeOffsets) -> bool {
    let state = word32(object, usize::try_from(unicode.state).unwrap_or(32));
    let kind = (state >> UNICODE_KIND_SHIFT) & 7;
    let Ok(length) = usize::try_from(word(object, usize::try_from(unicode.length).unwrap_or(16)).cast_signed()) else {
        return false;
    };
    let ascii = state & UNICODE_ASCII_BIT != 0;
    if state & UNICODE_COMPACT_BIT == 0 {
        // A string whose characters are a block of their own (a `str`
        // subclass's, 3.11's legacy ones): nothing more to check here.
        return !ascii || kind == 1;
    }
    if !matches!(kind, 1 | 2 | 4) || (ascii && kind != 1) {
        return false;
    }
    let kind = kind as usize;
    let data = usize::try_from(if ascii { unicode.ascii_data } else { unicode.compact_data }).unwrap_or(usize::MAX);
    let Some(end) = length.checked_mul(kind).and_then(|n| n.checked_add(data)) else { return false };
    let Some(nul) = end.checked_add(kind).and_then(|e| object.get(end..e)) else { return true };
    nul.iter().all(|&b| b == 0) && (!ascii || object[data..end].iter().all(u8::is_ascii))
}

/// `_PyObject_VAR_SIZE`: `basicsize + items * itemsize` rounded up to 8,
/// saturating (the counts come from the target).
#[must_use]
pub fn var_size(basicsize: u64, items: u64, itemsize: u64) -> u64 {
    basicsize.saturating_add(items.saturating_mul(itemsize)).saturating_add(7) & !7
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_past_the_most_tracked_are_cut_and_counted() {
        use crate::heap::{maps::Regions, pools::PoolSet};
        let name = b"Cut\0";
        // Two static type objects in this process; the metatype's address
        // is only compared.
        let meta = 0x7777_0000u64;
        let mut objects = [[0u64; 34]; 2];
        for o in &mut objects {
            o[1] = meta;
            o[type_object::TP_NAME / 8] = name.as_ptr() as u64;
            o[type_object::TP_BASICSIZE / 8] = 16;
            o[type_object::TP_FLAGS / 8] = tpflags::READY;
        }
        let (a, b) = (objects[0].as_ptr() as u64, objects[1].as_ptr() as u64);
        let pid = std::process::id();
        let abi = crate::python::abi_for(pid, crate::python::PythonVersion::from_hex(0x030C_01F0)).expect("3.12");
        let names = TypeNameOffsets {
            ht_qualname: abi.ht_qualname(),
            unicode: abi.frames().unicode,
            dict_keys: abi.heap().dict_keys,
        };
        let builtins = Builtins { type_: meta, str_: 1, bytes: 1, bytearray: 1 };
        let mut table = TypeTable::new(abi.heap(), names, builtins);
        table.max_types = 1;
        let (low, high) = (a.min(b), a.max(b) + 34 * 8);
        let regions = Regions::parse(&format!("{low:x}-{high:x} rw-p 00000000 00:00 0\n"));
        let pools = PoolSet::new(&[], crate::python::heap::Geometry::LARGE);
        let mut memory = Memory::new(pid);
        let mut cx = Context { memory: &mut memory, regions: &regions, pools: &pools };
        assert_eq!(table.lookup(a, &mut cx).unwrap(), Some(0));
        assert_eq!(table.info(0).name, "Cut");
        assert_eq!(table.lookup(b, &mut cx).unwrap(), None);
        assert_eq!(table.lookup(b, &mut cx).unwrap(), None);
        assert_eq!(table.lookup(a, &mut cx).unwrap(), Some(0));
        assert_eq!((table.infos.len(), table.cut_types, table.cut_objects), (1, 1, 2));
        std::hint::black_box(&objects);
    }

    /// A compact ASCII `str` of 3.12+ (state at 32, characters at 40), as
    /// the bytes of a 64-byte block.
    fn ascii(text: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[0] = 1;
        b[16..24].copy_from_slice(&(text.len() as u64).to_le_bytes());
        // kind 1, compact, ascii
        b[32..36].copy_from_slice(&(1u32 << 2 | 1 << 5 | 1 << 6).to_le_bytes());
        b[40..40 + text.len()].copy_from_slice(text);
        b
    }

    #[test]
    fn strings_keep_their_invariants() {
        let u = UnicodeOffsets { length: 16, state: 32, ascii_data: 40, compact_data: 56 };
        assert!(str_plausible(&ascii(b"key1234"), u));
        let mut unterminated = ascii(b"key1234");
        unterminated[47] = b'!';
        assert!(!str_plausible(&unterminated, u));
        assert!(!str_plausible(&ascii(b"caf\xc3\xa9"), u), "ASCII bytes only");
        let mut kind3 = ascii(b"x");
        kind3[32] = 3 << 2 | 1 << 5;
        assert!(!str_plausible(&kind3, u));
        let mut long = ascii(b"x");
        long[16..24].copy_from_slice(&1000u64.to_le_bytes());
        assert!(str_plausible(&long, u), "what lies past the bytes read is not checked");
        long[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(!str_plausible(&long, u), "a negative length");
    }

    #[test]
    fn variable_sizes_round_up_to_a_word() {
        assert_eq!(var_size(33, 2000, 1), 2040);
        assert_eq!(var_size(24, 3, 8), 48);
        assert_eq!(var_size(24, u64::MAX, 8), !7);
    }
}
