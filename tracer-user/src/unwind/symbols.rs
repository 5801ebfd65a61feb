//! Naming a module's pcs: the function from its ELF symbols (`.symtab`
//! where kept, else `.dynsym`), and the functions inlined there from its
//! DWARF (the module's own, or the separate debug file found as the
//! coverage work finds the interpreter's), innermost first.

use std::{borrow::Cow, path::Path, rc::Rc};

use gimli::{EndianRcSlice, RunTimeEndian};
use object::{Object as _, ObjectSymbol as _};

use crate::{discover::elf::section_data, model::NativeFrame};

type Reader = EndianRcSlice<RunTimeEndian>;

/// One module's names.
pub struct Symbols {
    /// The module's name as shown in frames (its file name).
    module: String,
    /// (start, end, name) of each function, sorted by start.
    functions: Vec<(u64, u64, String)>,
    dwarf: Option<addr2line::Context<Reader>>,
}

impl std::fmt::Debug for Symbols {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The DWARF context has no Debug of its own.
        f.debug_struct("Symbols")
            .field("module", &self.module)
            .field("functions", &self.functions.len())
            .field("dwarf", &self.dwarf.is_some())
            .finish()
    }
}

impl Symbols {
    /// The names of the module read from `image`, with DWARF from
    /// `debug` where there is any.
    pub fn load(module: String, image: &Path, debug: Option<&Path>) -> Result<Self, String> {
        let data = std::fs::read(image).map_err(|e| format!("cannot read {}: {e}", image.display()))?;
        let file = object::File::parse(&*data).map_err(|e| format!("{} is not readable ELF: {e}", image.display()))?;
        let mut functions = text_symbols(&file);
        // A separate debug file keeps the .symtab a stripped image lost
        // (`_start`, static functions).
        if let Some(data) = debug.filter(|d| *d != image).and_then(|d| std::fs::read(d).ok())
            && let Ok(debug_file) = object::File::parse(&*data)
        {
            functions.extend(text_symbols(&debug_file));
        }
        functions.sort();
        functions.dedup_by_key(|f| f.0);
        let dwarf = debug.and_then(|path| context(path).ok());
        Ok(Self { module, functions, dwarf })
    }

    /// The frames at link-time address `at`, innermost first: the inlined
    /// functions there, then the function that holds them. Never empty: an
    /// address no symbol covers is shown as the module plus the address.
    #[must_use]
    pub fn frames(&self, at: u64) -> Vec<NativeFrame> {
        let symbol = self
            .functions
            .get(self.functions.partition_point(|f| f.0 <= at).wrapping_sub(1))
            .filter(|f| at < f.1)
            .map(|f| f.2.clone());
        let mut out = Vec::new();
        if let Some(ctx) = &self.dwarf
            && let Ok(mut frames) = ctx.find_frames(at).skip_all_loads()
        {
            while let Ok(Some(frame)) = frames.next() {
                let name = frame.function.as_ref().and_then(|f| f.raw_name().ok().map(Cow::into_owned));
                let (file, line) =
                    frame.location.as_ref().map_or((None, None), |l| (l.file.map(str::to_owned), l.line));
                out.push(NativeFrame {
                    function: name.unwrap_or_else(|| format!("{at:#x}")),
                    module: self.module.clone(),
                    file,
                    line,
                    inlined: true,
                });
            }
        }
        if let Some(last) = out.last_mut() {
            // The outermost of a pc's frames is the function itself.
            last.inlined = false;
            if let Some(symbol) = symbol {
                last.function = symbol;
            }
            return out;
        }
        vec![NativeFrame {
            function: symbol.unwrap_or_else(|| format!("{}+{at:#x}", self.module)),
            module: self.module.clone(),
            file: None,
            line: None,
            inlined: false,
        }]
    }
}

/// (start, end, name) of the functions `file`'s symbol tables define.
fn text_symbols(file: &object::File<'_>) -> Vec<(u64, u64, String)> {
    file.symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == object::SymbolKind::Text && s.address() != 0)
        .filter_map(|s| Some((s.address(), s.address() + s.size().max(1), s.name().ok()?.to_owned())))
        .collect()
}

/// An addr2line context on the DWARF of the file at `path`.
fn context(path: &Path) -> Result<addr2line::Context<Reader>, String> {
    let data = std::fs::read(path).map_err(|e| e.to_string())?;
    let file = object::File::parse(&*data).map_err(|e| e.to_string())?;
    let endian = if file.is_little_endian() { RunTimeEndian::Little } else { RunTimeEndian::Big };
    // A section that cannot be had leaves the module without inlined
    // names (its symbols still name its functions); one that says it
    // inflates past belief is refused before it is allocated.
    let load = |id: gimli::SectionId| -> Result<Reader, String> {
        let bytes: Cow<'_, [u8]> = match file.section_by_name(id.name()) {
            Some(s) => section_data(&s).map_err(|e| format!("{}: its {} section: {e}", path.display(), id.name()))?,
            None => Cow::Borrowed(&[]),
        };
        Ok(EndianRcSlice::new(Rc::from(&*bytes), endian))
    };
    let dwarf = gimli::Dwarf::load(load)?;
    addr2line::Context::from_dwarf(dwarf).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crafted debug file whose DWARF section says it inflates to
    /// gigabytes: refused, not allocated; the module keeps its symbols.
    #[test]
    fn an_inflated_dwarf_section_is_refused() {
        let path = Path::new(crate::discover::elf::tests::INFLATED);
        let err = context(path).err().expect("refused");
        assert!(err.contains("decompresses to") && err.contains("more than any compressor"), "{err}");
    }
}
