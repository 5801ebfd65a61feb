//! The allocator implementations behind the API's function pointers
//! (`_PyObject_Malloc`, `_PyMem_RawMalloc`, the `_PyMem_Debug*` hooks):
//! static functions, so found in the image's symbol table, or, where the
//! image has none (Debian's LTO builds), in its debug file's, where LTO
//! names them `_PyObject_Malloc.lto_priv.0`.

use std::{collections::HashMap, path::Path};

use object::{Object as _, ObjectSymbol as _};

use super::elf::ElfImage;

/// One implementation found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Implementation {
    /// Its name in the source.
    pub name: &'static str,
    /// Its link-time address and size.
    pub address: u64,
    pub size: u64,
    /// Its entry in the image file.
    pub file_offset: u64,
    /// What it does (`tracer_common::live::Role`, without the
    /// implementation bit).
    pub role: tracer_common::live::Role,
}

/// The implementations of `names` (name, role) in `elf`, or in the symbol
/// table of `debug` (the image's debug file) where the image lacks them.
#[must_use]
pub fn find(
    elf: &ElfImage,
    debug: Option<&Path>,
    names: &[(&'static str, tracer_common::live::Role)],
) -> Vec<Implementation> {
    let debug_symbols = debug.map(debug_functions).unwrap_or_default();
    names
        .iter()
        .filter_map(|&(name, role)| {
            let (address, size) = match elf.function(name) {
                Some(s) => (s.address, s.size),
                None => *debug_symbols.get(name)?,
            };
            let file_offset = elf.file_offset(address)?;
            Some(Implementation { name, address, size, file_offset, role })
        })
        .collect()
}

/// The functions of a debug file's symbol table, by their source name (an
/// LTO suffix `.lto_priv.N` dropped; other clones, `.cold` parts and
/// `.constprop`s, are not the function).
fn debug_functions(path: &Path) -> HashMap<String, (u64, u64)> {
    let Ok(data) = std::fs::read(path) else { return HashMap::new() };
    let Ok(file) = object::File::parse(&*data) else { return HashMap::new() };
    let mut out = HashMap::new();
    for s in file.symbols().filter(|s| s.kind() == object::SymbolKind::Text && s.address() != 0) {
        let Ok(name) = s.name() else { continue };
        let base = match name.split_once(".lto_priv.") {
            Some((base, n)) if n.bytes().all(|b| b.is_ascii_digit()) => base,
            Some(_) => continue,
            None if name.contains('.') => continue,
            None => name,
        };
        out.entry(base.to_owned()).or_insert((s.address(), s.size()));
    }
    out
}
