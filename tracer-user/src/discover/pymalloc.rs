//! Where pymalloc's state is in an image, for `--live` on builds that
//! inline the allocator API (LTO): the link-time addresses of its used
//! pools and of the domains' allocator tables, from the image's symbol
//! table or its debug file's. These are static variables, in `.bss` on
//! Debian's builds, so not among [`super::elf::ElfImage`]'s symbols.

use std::path::Path;

use object::{Object as _, ObjectSymbol as _};

use crate::python::PymallocNames;

/// Link-time addresses of pymalloc's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PymallocSymbols {
    /// `usedpools[0]`.
    pub usedpools: u64,
    /// The object and mem domains' allocator tables (0: not found, or not
    /// a variable of their own in this version).
    pub tables: [u64; 2],
}

/// The addresses of `names` in the symbol tables of `image` or `debug`;
/// `None` without the used pools.
#[must_use]
pub fn find(image: &Path, debug: Option<&Path>, names: &PymallocNames) -> Option<PymallocSymbols> {
    let lookup = |name: &str| [Some(image), debug].into_iter().flatten().find_map(|path| variable(path, name));
    let usedpools = lookup(names.usedpools)?;
    let table = |n: Option<&str>| n.and_then(lookup).unwrap_or(0);
    Some(PymallocSymbols { usedpools, tables: [table(names.tables[0]), table(names.tables[1])] })
}

/// The address of the variable `name` in `path`'s symbol table, by its
/// source name (LTO names a static `usedpools.lto_priv.0`).
fn variable(path: &Path, name: &str) -> Option<u64> {
    variables(path, &[name])[0]
}

/// The link-time addresses of the variables `names` in `path`'s symbol
/// table (`.symtab`, where static variables are), by their source names
/// (LTO names a static `usedpools.lto_priv.0`), the file read once; `None`
/// for a name it lacks, and for all where it cannot be read.
#[must_use]
pub fn variables(path: &Path, names: &[&str]) -> Vec<Option<u64>> {
    let mut out = vec![None; names.len()];
    let Ok(data) = std::fs::read(path) else { return out };
    let Ok(file) = object::File::parse(&*data) else { return out };
    for s in file.symbols().filter(|s| s.kind() == object::SymbolKind::Data && s.address() != 0) {
        let Ok(full) = s.name() else { continue };
        let base = match full.split_once(".lto_priv.") {
            Some((base, n)) if n.bytes().all(|b| b.is_ascii_digit()) => base,
            Some(_) => continue,
            None => full,
        };
        if let Some(i) = names.iter().position(|n| *n == base) {
            out[i].get_or_insert(s.address());
        }
    }
    out
}
