//! What heap growth sampling (`--growth`) probes, found in the image: the
//! static functions `allocate_from_new_pool` and `arena_map_mark_used`,
//! and on 3.11 the static `usable_arenas` (see [`crate::python::growth`]).
//! Static symbols are in a symbol table only: the image's own (pyenv's
//! libpython keeps `.symtab`), or its debug file's (Debian's LTO builds,
//! where they are named `allocate_from_new_pool.lto_priv.0`).

use std::path::{Path, PathBuf};

use object::{Object as _, ObjectSymbol as _, SymbolKind};

use super::{Inlining, Resolved, TargetSpec, debuginfo, process};
use crate::python::growth::{GrowthKnowledge, MARK_USED_FUNCTION, TAKE_FUNCTION, Usable};

/// A function found in a symbol table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// Its name in the table (`allocate_from_new_pool.lto_priv.0`).
    pub name: String,
    /// Link-time address and size.
    pub address: u64,
    pub size: u64,
}

/// What growth sampling probes and reads, by link-time address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrowthSymbols {
    pub take: Function,
    /// `arena_map_mark_used`, where a table has it.
    pub mark_used: Option<Function>,
    /// 3.11's `usable_arenas`, where a table has it.
    pub usable_arenas: Option<u64>,
    /// Which table they came from, for the plan's words.
    pub table: String,
}

/// Finds growth's symbols for the resolved target, in the image's symbol
/// table, then in its debug file's (looked for as the inlined copies'
/// DWARF is, also with `--no-inlined`). Err says why there are none and
/// what to install: growth is then unavailable, said so.
pub fn find(r: &Resolved, knowledge: &GrowthKnowledge, debug_dir: Option<&Path>) -> Result<GrowthSymbols, String> {
    let variable = match knowledge.usable {
        Usable::Static(name) => Some(name),
        Usable::InState { .. } => None,
    };
    let own = Table::read(&r.attach_path, variable);
    if let Some(found) = own.into_symbols(format!("the symbol table of {}", r.display_path.display())) {
        return Ok(found);
    }
    let debug = match debug_file(r, debug_dir) {
        Ok(Some(path)) => path,
        Ok(None) => {
            return Err(format!(
                "{} has no symbol table with {TAKE_FUNCTION} (a static function of pymalloc) and no debug file was found for it; {}",
                r.display_path.display(),
                fix(r)
            ));
        }
        Err(why) => {
            return Err(format!("{}'s debug file cannot be read ({why}); {}", r.display_path.display(), fix(r)));
        }
    };
    let table = Table::read(&debug, variable);
    table.into_symbols(format!("the symbol table of its debug file {}", debug.display())).ok_or_else(|| {
        format!(
            "neither {} nor its debug file {} has {TAKE_FUNCTION} (a static function of pymalloc) in a symbol table; {}",
            r.display_path.display(),
            debug.display(),
            fix(r)
        )
    })
}

/// What to install for the image's debug info, as the target's own
/// `/etc/os-release` says.
fn fix(r: &Resolved) -> String {
    let root = r.pid().map_or(process::Root::Own, process::Root::Process);
    super::copies::debug_fix(root, r.abi)
}

/// The image's debug file: the one the inlined copies were found by, or
/// looked for the same way.
fn debug_file(r: &Resolved, debug_dir: Option<&Path>) -> Result<Option<PathBuf>, String> {
    if let Inlining::Known { source, .. } = &r.inlining {
        return Ok(Some(PathBuf::from(source)));
    }
    let spec = r.pid().map_or_else(|| TargetSpec::Exe(r.attach_path.clone()), TargetSpec::Pid);
    let (in_root, root_dir) = super::copies::in_root(&spec, &r.display_path);
    debuginfo::locate(&in_root, &root_dir, debug_dir, Some(&r.attach_path))
        .map(|found| found.map(|f| f.path))
        .map_err(|e| e.to_string())
}

/// The symbols of one file that growth wants.
#[derive(Default)]
struct Table {
    take: Option<Function>,
    mark_used: Option<Function>,
    variable: Option<u64>,
}

impl Table {
    /// Reads `path`'s symbol table (`.symtab`; `.dynsym` has no static
    /// function); nothing where it cannot be read.
    fn read(path: &Path, variable: Option<&str>) -> Self {
        let mut table = Self::default();
        let Ok(data) = std::fs::read(path) else { return table };
        let Ok(file) = object::File::parse(&*data) else { return table };
        for s in file.symbols() {
            if s.address() == 0 || s.is_undefined() {
                continue;
            }
            let Ok(full) = s.name() else { continue };
            let Some(base) = source_name(full) else { continue };
            let function = || Function { name: full.to_owned(), address: s.address(), size: s.size() };
            match s.kind() {
                SymbolKind::Text if base == TAKE_FUNCTION => {
                    table.take.get_or_insert_with(function);
                }
                SymbolKind::Text if base == MARK_USED_FUNCTION => {
                    table.mark_used.get_or_insert_with(function);
                }
                SymbolKind::Data if Some(base) == variable => {
                    table.variable.get_or_insert(s.address());
                }
                _ => {}
            }
        }
        table
    }

    fn into_symbols(self, table: String) -> Option<GrowthSymbols> {
        Some(GrowthSymbols { take: self.take?, mark_used: self.mark_used, usable_arenas: self.variable, table })
    }
}

/// A symbol's source name: LTO's `.lto_priv.N` suffix dropped; `None` for
/// the parts GCC split off a function (`.cold`, `.part.N`) and its clones
/// (`.constprop.N`, `.isra.N`), which are not the function's entry.
fn source_name(name: &str) -> Option<&str> {
    match name.split_once(".lto_priv.") {
        Some((base, n)) if n.bytes().all(|b| b.is_ascii_digit()) => Some(base),
        Some(_) => None,
        None if name.contains('.') => None,
        None => Some(name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_names_drop_lto_suffixes_only() {
        assert_eq!(source_name("allocate_from_new_pool.lto_priv.0"), Some("allocate_from_new_pool"));
        assert_eq!(source_name("allocate_from_new_pool"), Some("allocate_from_new_pool"));
        assert_eq!(source_name("allocate_from_new_pool.lto_priv.0.cold"), None);
        assert_eq!(source_name("arena_map_mark_used.part.0"), None);
    }
}
