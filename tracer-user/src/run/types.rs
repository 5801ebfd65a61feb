//! With `--types`: the names of the types the kernel counted creations
//! under. The kernel keys each count by the type object's address in the
//! process; its name (`tp_name`) is read from the process's memory once per
//! (process, address), while the process lives.

use std::collections::{BTreeMap, HashMap};

use tracer_common::types::TypeCounts;

use crate::{
    discover::process::{TargetError, read_memory},
    model::TypeCount,
    python::{ObjectOffsets, TypeNameOffsets},
};

/// The longest type name read; a longer one is cut there, marked with "…".
const MAX_NAME: usize = 256;

/// Type names by (process, type address), as read or why not.
#[derive(Debug)]
pub struct TypeNames {
    offsets: ObjectOffsets,
    names: HashMap<(u32, u64), Result<String, String>>,
}

impl TypeNames {
    #[must_use]
    pub fn new(offsets: ObjectOffsets) -> Self {
        Self { offsets, names: HashMap::new() }
    }

    /// Reads the name of every type of `counts` not read yet, in processes
    /// that still run (`live`).
    pub fn learn(&mut self, counts: &BTreeMap<u32, BTreeMap<u64, TypeCounts>>, live: &[u32]) {
        for (&pid, types) in counts.iter().filter(|(pid, _)| live.contains(pid)) {
            for &address in types.keys() {
                if let Some(Ok(_)) = self.names.get(&(pid, address)) {
                    continue;
                }
                let name = type_name(pid, address, self.offsets).map_err(|e| e.to_string());
                self.names.insert((pid, address), name);
            }
        }
    }

    /// Creations and deaths by type name over every process, most created
    /// first; a type whose name could not be read is listed by its address,
    /// with why.
    #[must_use]
    pub fn counts(&self, counts: &BTreeMap<u32, BTreeMap<u64, TypeCounts>>) -> Vec<TypeCount> {
        let mut by_name: BTreeMap<String, TypeCount> = BTreeMap::new();
        for (&pid, types) in counts {
            for (&address, &own) in types {
                let (name, unresolved) = match self.names.get(&(pid, address)) {
                    Some(Ok(name)) => (name.clone(), None),
                    Some(Err(why)) => (format!("<type at {address:#x} in PID {pid}>"), Some(why.clone())),
                    None => (
                        format!("<type at {address:#x} in PID {pid}>"),
                        Some("the process exited before tracer read the type's name".to_owned()),
                    ),
                };
                let entry = by_name.entry(name.clone()).or_insert_with(|| TypeCount {
                    name,
                    unresolved,
                    ..TypeCount::default()
                });
                entry.created = entry.created.saturating_add(own.created);
                entry.destroyed = entry.destroyed.saturating_add(own.destroyed);
                entry.reused = entry.reused.saturating_add(own.reused);
                // Each death is of an object seen created, in the same
                // process: never more than its creations (saturating only
                // against a types map that was full at a creation).
                let live = own.created.saturating_sub(own.destroyed.saturating_add(own.reused));
                entry.live = entry.live.saturating_add(live);
            }
        }
        let mut out: Vec<TypeCount> = by_name.into_values().collect();
        out.sort_by(|a, b| b.created.cmp(&a.created).then_with(|| a.name.cmp(&b.name)));
        out
    }
}

/// The qualified name of the type object at `address` in process `pid`,
/// as `type.__repr__` shows it (Objects/typeobject.c, `type_repr`): a heap
/// type's `__module__` and `__qualname__` (a class defined in Python has
/// only its bare name in `tp_name`), a static type's `tp_name`, which holds
/// its module already (`collections.deque`, or none for builtins). A heap
/// type whose module cannot be read (not a `str` in its dict) is named by
/// its qualified name alone.
fn type_name(pid: u32, address: u64, offsets: ObjectOffsets) -> Result<String, TargetError> {
    use crate::python::{TP_FLAGS_OFFSET, TPFLAGS_HEAPTYPE};
    let flags = word(pid, address.wrapping_add(TP_FLAGS_OFFSET))?;
    if flags & TPFLAGS_HEAPTYPE == 0 {
        return c_string(pid, word(pid, address.wrapping_add(offsets.tp_name))?);
    }
    let names = offsets.names;
    let qualname = py_str(pid, word(pid, address.wrapping_add(names.ht_qualname))?, names)?;
    match heap_type_module(pid, address, names) {
        Ok(Some(module)) if module != "builtins" => Ok(format!("{module}.{qualname}")),
        _ => Ok(qualname),
    }
}

/// The `__module__` of the heap type at `address`: the `str` under that
/// key in its `tp_dict`, found by a walk of the dict's entries (a type's
/// dict is never split, and has its keys' objects in its entries).
fn heap_type_module(pid: u32, address: u64, names: TypeNameOffsets) -> Result<Option<String>, TargetError> {
    use crate::python::{
        DK_INDICES_OFFSET, DK_KIND_OFFSET, DK_LOG2_INDEX_BYTES_OFFSET, DK_NENTRIES_OFFSET, MA_KEYS_OFFSET,
        MA_VALUES_OFFSET, TP_DICT_OFFSET,
    };
    /// A class dict with more entries than this is not walked.
    const MAX_ENTRIES: u64 = 4096;
    let dict = word(pid, address.wrapping_add(TP_DICT_OFFSET))?;
    if dict == 0 || word(pid, dict.wrapping_add(MA_VALUES_OFFSET))? != 0 {
        return Ok(None);
    }
    let keys = word(pid, dict.wrapping_add(MA_KEYS_OFFSET))?;
    let head = read_memory(pid, keys, usize::try_from(DK_INDICES_OFFSET).unwrap_or(32))?;
    let byte = |at: u64| head.get(usize::try_from(at).unwrap_or(usize::MAX)).copied().unwrap_or(0);
    let log2_index_bytes = byte(DK_LOG2_INDEX_BYTES_OFFSET);
    let entry_size: u64 = if byte(DK_KIND_OFFSET) == 0 { 24 } else { 16 };
    let key_at: u64 = if entry_size == 24 { 8 } else { 0 };
    let nentries = word_of(&head, DK_NENTRIES_OFFSET).min(MAX_ENTRIES);
    if log2_index_bytes > 32 {
        return Ok(None);
    }
    let entries = keys.wrapping_add(DK_INDICES_OFFSET).wrapping_add(1u64 << log2_index_bytes);
    let bytes = read_memory(pid, entries, usize::try_from(nentries * entry_size).unwrap_or(0))?;
    for i in 0..nentries {
        let key = word_of(&bytes, i * entry_size + key_at);
        // A deleted entry has a NULL key; a key that is not a compact
        // string is not `__module__`.
        if key == 0 || py_str(pid, key, names).ok().as_deref() != Some("__module__") {
            continue;
        }
        let value = word_of(&bytes, i * entry_size + key_at + 8);
        return Ok(py_str(pid, value, names).ok());
    }
    Ok(None)
}

/// The 8 bytes at `at` in `bytes`, or 0 past its end.
fn word_of(bytes: &[u8], at: u64) -> u64 {
    let at = usize::try_from(at).unwrap_or(usize::MAX);
    bytes.get(at..at.saturating_add(8)).and_then(|w| w.try_into().ok()).map_or(0, u64::from_le_bytes)
}

/// The 8 bytes at `address` in process `pid`.
fn word(pid: u32, address: u64) -> Result<u64, TargetError> {
    Ok(word_of(&read_memory(pid, address, 8)?, 0))
}

/// The text of the compact `str` object at `address` (the only kind a
/// type's name and a dict's string keys are since 3.12, and in practice in
/// 3.11): its characters follow the header, one, two or four bytes each.
fn py_str(pid: u32, address: u64, names: TypeNameOffsets) -> Result<String, TargetError> {
    use crate::python::{UNICODE_ASCII_BIT, UNICODE_COMPACT_BIT, UNICODE_KIND_SHIFT};
    let u = names.unicode;
    let head = read_memory(pid, address, usize::try_from(u.state + 4).unwrap_or(36))?;
    let length = word_of(&head, u.length).min(MAX_NAME as u64);
    let state = u32::try_from(word_of(&head, u.state - 4) >> 32).unwrap_or(0);
    let kind = (state >> UNICODE_KIND_SHIFT) & 7;
    if state & UNICODE_COMPACT_BIT == 0 || !matches!(kind, 1 | 2 | 4) {
        return Ok(format!("<str at {address:#x} that is not compact>"));
    }
    let data = if state & UNICODE_ASCII_BIT != 0 { u.ascii_data } else { u.compact_data };
    let width = u64::from(kind);
    let bytes = read_memory(pid, address.wrapping_add(data), usize::try_from(length * width).unwrap_or(0))?;
    let chars = bytes.chunks_exact(usize::try_from(width).unwrap_or(1)).map(|c| {
        let mut unit = [0u8; 4];
        unit[..c.len()].copy_from_slice(c);
        char::from_u32(u32::from_le_bytes(unit)).unwrap_or(char::REPLACEMENT_CHARACTER)
    });
    Ok(chars.collect())
}

/// The NUL-terminated string at `address`, read a page at a time so that
/// a short string near the end of a mapping reads.
fn c_string(pid: u32, address: u64) -> Result<String, TargetError> {
    const PAGE: u64 = 4096;
    let mut bytes = Vec::new();
    let mut at = address;
    while bytes.len() < MAX_NAME {
        let to_page_end = PAGE - at % PAGE;
        let len = usize::try_from(to_page_end).unwrap_or(MAX_NAME).min(MAX_NAME - bytes.len());
        let chunk = read_memory(pid, at, len)?;
        if let Some(end) = chunk.iter().position(|&b| b == 0) {
            bytes.extend_from_slice(&chunk[..end]);
            return Ok(String::from_utf8_lossy(&bytes).into_owned());
        }
        bytes.extend_from_slice(&chunk);
        at = at.wrapping_add(len as u64);
    }
    Ok(format!("{}…", String::from_utf8_lossy(&bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[unsafe(no_mangle)]
    static TRACER_TEST_TYPE_NAME: &[u8] = b"Leaky\0";

    #[test]
    fn names_are_read_from_the_process_and_summed_by_name() {
        // A fake type object in this process: its tp_name points to a C
        // string, as CPython's do.
        // As large as a type object up to `tp_dict`; its `tp_flags` (0)
        // make it a static type.
        let mut object = [0u64; 34];
        object[3] = TRACER_TEST_TYPE_NAME.as_ptr() as u64;
        let address = object.as_ptr() as u64;
        let pid = std::process::id();
        let abi = crate::python::abi_for(pid, crate::python::PythonVersion::from_hex(0x030C_01F0)).expect("3.12");
        let mut names = TypeNames::new(abi.objects());
        let made = |created, destroyed, reused| TypeCounts { created, destroyed, reused };
        let counts: BTreeMap<u32, BTreeMap<u64, TypeCounts>> = [
            (pid, [(address, made(7, 2, 1)), (8, made(1, 0, 0))].into_iter().collect()),
            (1, [(address, made(3, 3, 0))].into_iter().collect()),
        ]
        .into_iter()
        .collect();
        names.learn(&counts, &[pid]);
        let listed = names.counts(&counts);
        assert_eq!(
            listed[0],
            TypeCount { name: "Leaky".into(), created: 7, destroyed: 2, reused: 1, live: 4, ..TypeCount::default() }
        );
        // An address that is not mapped (its tp_flags at 0xb0), and a
        // process never read.
        let unread = listed.iter().find(|t| t.name == format!("<type at 0x8 in PID {pid}>")).expect("listed");
        assert!(unread.unresolved.as_deref().is_some_and(|w| w.contains("at 0xb0")), "{unread:?}");
        let exited = listed.iter().find(|t| t.name == format!("<type at {address:#x} in PID 1>")).expect("listed");
        assert_eq!(exited.created, 3);
        std::hint::black_box(&object);
    }
}
