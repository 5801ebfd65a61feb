//! With `--types`: the names of the types the kernel counted creations
//! under. The kernel keys each count by the type object's address in the
//! process; its name (`tp_name`) is read from the process's memory once per
//! (process, address), while the process lives.

use std::collections::{BTreeMap, HashMap};

use tracer_common::types::TypeCounts;

use crate::{
    heap::{memory::Memory, names},
    model::TypeCount,
    python::{ObjectOffsets, heap::type_object},
};

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
                let name = type_name(pid, address, self.offsets);
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
/// as `type.__repr__` shows it (Objects/typeobject.c, `type_repr`), read
/// as the heap census reads it ([`crate::heap::names`]): bounded, raw.
fn type_name(pid: u32, address: u64, offsets: ObjectOffsets) -> Result<String, String> {
    let mut memory = Memory::new(pid);
    let head = memory
        .read(address, type_object::READ)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("the type object at {address:#x} is not mapped"))?;
    names::type_name(&mut memory, address, &head, offsets.names).map_err(|e| e.to_string())
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
        // An address that is not mapped, and a process never read.
        let unread = listed.iter().find(|t| t.name == format!("<type at 0x8 in PID {pid}>")).expect("listed");
        assert_eq!(unread.unresolved.as_deref(), Some("the type object at 0x8 is not mapped"), "{unread:?}");
        let exited = listed.iter().find(|t| t.name == format!("<type at {address:#x} in PID 1>")).expect("listed");
        assert_eq!(exited.created, 3);
        std::hint::black_box(&object);
    }
}
