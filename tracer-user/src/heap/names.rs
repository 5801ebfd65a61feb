//! A type's name as `repr(type)` shows it, read from the target: a static
//! type's `tp_name` (which holds its module: `collections.deque`), a heap
//! type's `__module__` and `__qualname__` (a class defined in Python has its
//! bare name in `tp_name`). Names come from an untrusted process: at most
//! [`MAX_NAME`] characters are read and a longer name is marked as cut
//! ([`crate::text`]); they are kept raw, and escaped where they are shown
//! ([`crate::text::display`]). `tracer heap` and `--types` both read names
//! here.

use super::{HeapError, memory::Memory, memory::word};
use crate::python::{
    MA_KEYS_OFFSET, MA_VALUES_OFFSET, TP_DICT_OFFSET, TypeNameOffsets, UNICODE_ASCII_BIT, UNICODE_COMPACT_BIT,
    UNICODE_KIND_SHIFT,
    heap::{tpflags, type_object},
};

use crate::text::{MAX_NAME, cut};

/// A class dict's entries searched for its `__module__`: a class whose
/// key is past them (a hostile target's, or `type()` given a namespace
/// this large, which adds `__module__` last) is named with
/// [`MODULE_UNREAD`] for its module.
const MAX_ENTRIES: u64 = 4096;

/// The module of a class whose `__module__` was not searched for in full.
pub const MODULE_UNREAD: &str = "?";

/// The name of the type whose first [`type_object::READ`] bytes are
/// `head`, at `address`.
pub fn type_name(memory: &mut Memory, address: u64, head: &[u8], names: TypeNameOffsets) -> Result<String, HeapError> {
    let flags = word(head, type_object::TP_FLAGS);
    if flags & tpflags::HEAPTYPE == 0 {
        return c_string(memory, word(head, type_object::TP_NAME));
    }
    let Some(qualname) = memory.word(address.wrapping_add(names.ht_qualname))? else {
        return Ok(format!("<type at {address:#x}>"));
    };
    let qualname = py_str(memory, qualname, names)?.unwrap_or_else(|| format!("<type at {address:#x}>"));
    Ok(match heap_type_module(memory, address, names)? {
        Some(module) if module != "builtins" => crate::text::bound(&format!("{module}.{qualname}")),
        _ => qualname,
    })
}

/// The `__module__` of the heap type at `address`: the `str` under that
/// key in its `tp_dict` (a type's dict is never split and holds its keys'
/// objects in its entries); `None` where it has none or it cannot be read;
/// [`MODULE_UNREAD`] where its dict has more entries than are searched and
/// none of those searched is it.
fn heap_type_module(memory: &mut Memory, address: u64, names: TypeNameOffsets) -> Result<Option<String>, HeapError> {
    let Some(dict) = memory.word(address.wrapping_add(TP_DICT_OFFSET))? else { return Ok(None) };
    if dict == 0 || memory.word(dict.wrapping_add(MA_VALUES_OFFSET))? != Some(0) {
        return Ok(None);
    }
    let Some(keys) = memory.word(dict.wrapping_add(MA_KEYS_OFFSET))? else { return Ok(None) };
    let Some(head) = memory.read(keys, names.dict_keys.header())? else { return Ok(None) };
    let Some(shape) = names.dict_keys.parse(&head) else { return Ok(None) };
    let (entry_size, key_at) = (shape.entry_size, shape.key_at);
    let nentries = shape.nentries.min(MAX_ENTRIES);
    let entries = keys.wrapping_add(shape.entries);
    let Some(bytes) = memory.read(entries, usize::try_from(nentries * entry_size).unwrap_or(0))? else {
        return Ok(None);
    };
    for i in 0..nentries {
        let at = usize::try_from(i * entry_size + key_at).unwrap_or(usize::MAX);
        let key = word(&bytes, at);
        if key == 0 || py_str(memory, key, names)?.as_deref() != Some("__module__") {
            continue;
        }
        return py_str(memory, word(&bytes, at + 8), names);
    }
    Ok((shape.nentries > nentries).then(|| MODULE_UNREAD.to_owned()))
}

/// The text of the compact `str` at `address`, escaped; `None` where it is
/// not one.
fn py_str(memory: &mut Memory, address: u64, names: TypeNameOffsets) -> Result<Option<String>, HeapError> {
    let u = names.unicode;
    let Some(head) = memory.read(address, usize::try_from(u.state + 4).unwrap_or(36))? else { return Ok(None) };
    let length = word(&head, usize::try_from(u.length).unwrap_or(16));
    let state = super::memory::word32(&head, usize::try_from(u.state).unwrap_or(32));
    let kind = (state >> UNICODE_KIND_SHIFT) & 7;
    if state & UNICODE_COMPACT_BIT == 0 || !matches!(kind, 1 | 2 | 4) {
        return Ok(None);
    }
    let data = if state & UNICODE_ASCII_BIT != 0 { u.ascii_data } else { u.compact_data };
    let width = u64::from(kind);
    let chars = length.min(MAX_NAME as u64);
    let Some(bytes) = memory.read(address.wrapping_add(data), usize::try_from(chars * width).unwrap_or(0))? else {
        return Ok(None);
    };
    let text: String = bytes
        .chunks_exact(usize::try_from(width).unwrap_or(1))
        .map(|c| {
            let mut unit = [0u8; 4];
            unit[..c.len()].copy_from_slice(c);
            char::from_u32(u32::from_le_bytes(unit)).unwrap_or(char::REPLACEMENT_CHARACTER)
        })
        .collect();
    Ok(Some(if length > chars { cut(&text) } else { text }))
}

/// The NUL-terminated string at `address`, escaped: read a piece at a time
/// so that a short name at the end of a mapping reads.
fn c_string(memory: &mut Memory, address: u64) -> Result<String, HeapError> {
    const PIECE: u64 = 64;
    let mut bytes = Vec::new();
    let mut at = address;
    while bytes.len() < MAX_NAME {
        let len = usize::try_from(PIECE - at % PIECE).unwrap_or(64).min(MAX_NAME - bytes.len());
        let Some(chunk) = memory.read(at, len)? else { break };
        if let Some(end) = chunk.iter().position(|&b| b == 0) {
            bytes.extend_from_slice(&chunk[..end]);
            return Ok(String::from_utf8_lossy(&bytes).into_owned());
        }
        bytes.extend_from_slice(&chunk);
        at = at.wrapping_add(len as u64);
    }
    if bytes.is_empty() {
        return Ok(format!("<name at {address:#x} unreadable>"));
    }
    Ok(cut(&String::from_utf8_lossy(&bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_strings_are_bounded() {
        let long = vec![b'x'; 1000];
        let mut memory = Memory::new(std::process::id());
        let name = c_string(&mut memory, long.as_ptr() as u64).unwrap();
        assert_eq!(name, format!("{}…", "x".repeat(MAX_NAME)));
        let short = b"collections.deque\0";
        assert_eq!(c_string(&mut memory, short.as_ptr() as u64).unwrap(), "collections.deque");
        assert_eq!(c_string(&mut memory, 0x10).unwrap(), "<name at 0x10 unreadable>");
    }
}
