//! With `--types`: the names of the types the kernel counted creations
//! under. The kernel keys each count by the type object's address in the
//! process; its name (`tp_name`) is read from the process's memory once per
//! (process, address), while the process lives.

use std::collections::{BTreeMap, HashMap};

use tracer_common::types::TypeCounts;

use crate::{
    discover::process::{TargetError, read_memory},
    model::TypeCount,
    python::ObjectOffsets,
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

/// The `tp_name` of the type object at `address` in process `pid`.
fn type_name(pid: u32, address: u64, offsets: ObjectOffsets) -> Result<String, TargetError> {
    let pointer = read_memory(pid, address.wrapping_add(offsets.tp_name), 8)?;
    let pointer = u64::from_le_bytes(pointer.try_into().unwrap_or_default());
    c_string(pid, pointer)
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
        let mut object = [0u64; 4];
        object[3] = TRACER_TEST_TYPE_NAME.as_ptr() as u64;
        let address = object.as_ptr() as u64;
        let pid = std::process::id();
        let mut names =
            TypeNames::new(crate::python::ObjectOffsets { ob_type: 8, tp_name: crate::python::TP_NAME_OFFSET, pre_headers: crate::python::PRE_HEADERS });
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
        // An address that is not mapped (its tp_name at 0x20), and a
        // process never read.
        let unread = listed.iter().find(|t| t.name == format!("<type at 0x8 in PID {pid}>")).expect("listed");
        assert!(unread.unresolved.as_deref().is_some_and(|w| w.contains("at 0x20")), "{unread:?}");
        let exited = listed.iter().find(|t| t.name == format!("<type at {address:#x} in PID 1>")).expect("listed");
        assert_eq!(exited.created, 3);
        std::hint::black_box(&object);
    }
}
