//! Symbol resolution from the interpreter's ELF file, done here rather than
//! by ld.so or aya so that static, stripped-dynsym and container images all
//! resolve the same way, from both `.dynsym` and `.symtab`.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use object::{Object as _, ObjectSegment as _, ObjectSymbol as _, SymbolKind};
use thiserror::Error;

/// A failure to read or understand an ELF file.
#[derive(Debug, Error)]
pub enum ElfError {
    #[error("cannot read {path}: {cause}; check that the file still exists and is readable")]
    Read { path: PathBuf, cause: std::io::Error },
    #[error("{path} is not a readable ELF file: {cause}")]
    Parse { path: PathBuf, cause: object::Error },
}

impl crate::error::Classify for ElfError {
    /// A file that cannot be read or parsed: the error that names the
    /// file's role (the target's image, tracer's own) says whose it is.
    fn is_bad_input(&self) -> bool {
        match self {
            Self::Read { .. } | Self::Parse { .. } => false,
        }
    }
}

/// One defined symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    /// Link-time virtual address.
    pub address: u64,
    /// Size in bytes (0 when the ELF does not say).
    pub size: u64,
    /// Offset of `address` in the file: what a uprobe is attached at.
    pub file_offset: u64,
    /// Whether it is code (as opposed to data such as `Py_Version`).
    pub is_function: bool,
}

/// The symbols of one ELF image.
#[derive(Debug)]
pub struct ElfImage {
    path: PathBuf,
    symbols: HashMap<String, Symbol>,
    /// Defined data symbols with no bytes in the file (.bss), by name: their
    /// link-time addresses (3.9's `_PyRuntime` is one).
    zero_filled: HashMap<String, u64>,
    /// (vaddr, memsz, file offset, filesz) of every `PT_LOAD`.
    segments: Vec<(u64, u64, u64, u64)>,
}

impl ElfImage {
    /// Reads and indexes the file at `path`.
    pub fn open(path: &Path) -> Result<Self, ElfError> {
        let data = std::fs::read(path).map_err(|cause| ElfError::Read { path: path.to_owned(), cause })?;
        Self::parse(path, &data)
    }

    /// Indexes an ELF image already in memory; `path` is for messages.
    pub fn parse(path: &Path, data: &[u8]) -> Result<Self, ElfError> {
        let file = object::File::parse(data).map_err(|cause| ElfError::Parse { path: path.to_owned(), cause })?;
        let segments = load_segments(&file);
        let mut symbols = HashMap::new();
        let mut zero_filled = HashMap::new();
        // .symtab first, then .dynsym: a name in both is the same symbol, and
        // .dynsym is the one that survives `strip`.
        for sym in file.symbols().chain(file.dynamic_symbols()) {
            if sym.is_undefined() || sym.address() == 0 {
                continue;
            }
            let is_function = match sym.kind() {
                SymbolKind::Text => true,
                SymbolKind::Data => false,
                _ => continue,
            };
            let Ok(name) = sym.name() else { continue };
            // Versioned .symtab names look like "name@@VERS".
            let name = name.split('@').next().unwrap_or(name);
            if name.is_empty() || symbols.contains_key(name) {
                continue;
            }
            let address = sym.address();
            // Zero-initialised data (.bss) has no bytes in the file and
            // nothing tracer could probe or read there.
            let Some(file_offset) = file_offset_of(&segments, address) else {
                if !is_function {
                    zero_filled.entry(name.to_owned()).or_insert(address);
                }
                continue;
            };
            symbols.insert(name.to_owned(), Symbol { address, size: sym.size(), file_offset, is_function });
        }
        Ok(Self { path: path.to_owned(), symbols, zero_filled, segments })
    }

    /// The file this image was read from.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads `len` bytes of the file at `offset`.
    pub fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>, ElfError> {
        use std::os::unix::fs::FileExt as _;
        let err = |cause| ElfError::Read { path: self.path.clone(), cause };
        let file = std::fs::File::open(&self.path).map_err(err)?;
        let mut buf = vec![0; len];
        file.read_exact_at(&mut buf, offset).map_err(err)?;
        Ok(buf)
    }

    /// The file offset of the link-time address `address`, if a
    /// file-backed part of a segment holds it.
    #[must_use]
    pub fn file_offset(&self, address: u64) -> Option<u64> {
        file_offset_of(&self.segments, address)
    }

    /// A defined symbol by exact name.
    #[must_use]
    pub fn symbol(&self, name: &str) -> Option<&Symbol> {
        self.symbols.get(name)
    }

    /// The link-time address of a defined data symbol that has no bytes in
    /// the file (.bss): it can be read in a process, not in the file.
    #[must_use]
    pub fn zero_filled(&self, name: &str) -> Option<u64> {
        self.zero_filled.get(name).copied()
    }

    /// A link-time address with bytes in the file, and their file offset:
    /// the start of the first file-backed `PT_LOAD`, by which a process's
    /// mapping of the file gives its load bias.
    #[must_use]
    pub fn anchor(&self) -> Option<(u64, u64)> {
        self.segments.iter().find(|s| s.3 > 0).map(|&(vaddr, _, offset, _)| (vaddr, offset))
    }

    /// A defined function by exact name.
    #[must_use]
    pub fn function(&self, name: &str) -> Option<&Symbol> {
        self.symbol(name).filter(|s| s.is_function)
    }
}

/// Symbols only a CPython interpreter defines (an extension module imports
/// them, leaving them undefined, which `ElfImage` skips).
const CPYTHON_MARKERS: [&str; 3] = ["Py_Initialize", "_PyRuntime", "Py_Version"];

/// Whether `elf` is a CPython interpreter image (an executable or libpython
/// that defines the interpreter, not one that merely links it).
#[must_use]
pub fn defines_cpython(elf: &ElfImage) -> bool {
    CPYTHON_MARKERS.iter().any(|m| elf.symbol(m).is_some())
}

/// (vaddr, memsz, file offset, filesz) of every `PT_LOAD` of `file`: what
/// [`file_offset_of`] maps addresses through.
pub(crate) fn load_segments(file: &object::File<'_>) -> Vec<(u64, u64, u64, u64)> {
    file.segments()
        .map(|s| {
            let (offset, filesz) = s.file_range();
            (s.address(), s.size(), offset, filesz)
        })
        .collect()
}

/// Maps a virtual address to its file offset through the `PT_LOAD` segment
/// that holds it; addresses in .bss (past the file-backed part) have none,
/// and neither has any address of a separate debug file, whose `PT_LOAD`s
/// have no file bytes.
pub(crate) fn file_offset_of(segments: &[(u64, u64, u64, u64)], address: u64) -> Option<u64> {
    segments.iter().find_map(|&(vaddr, memsz, offset, filesz)| {
        let delta = address.checked_sub(vaddr)?;
        // A segment's offset comes from the file: one past the end of
        // the address space maps nothing.
        if delta < memsz && delta < filesz { offset.checked_add(delta) } else { None }
    })
}

/// The most a compressed section may grow when decompressed: deflate's
/// limit is about 1032 to 1, and debug info compresses a few times.
const MAX_RATIO: u64 = 2048;

/// Why a section's bytes could not be had.
#[derive(Debug, Error)]
pub enum SectionError {
    #[error("{0}")]
    Read(#[from] object::Error),
    /// A compressed section says how large it is once decompressed, and
    /// that much would be allocated first.
    #[error(
        "it says it decompresses to {size} bytes from {compressed}, more than any compressor makes of them (corrupt?)"
    )]
    Inflated { size: u64, compressed: usize },
}

/// `section`'s bytes, decompressed where compressed; a section that says
/// it decompresses to more than any compressor makes of its bytes is
/// refused before anything is allocated for it (a file tracer reads may be
/// crafted).
///
/// # Errors
/// When the section cannot be read or decompressed, or says it inflates
/// past belief.
pub fn section_data<'d>(section: &object::Section<'d, '_>) -> Result<std::borrow::Cow<'d, [u8]>, SectionError> {
    use object::ObjectSection as _;
    let compressed = section.compressed_data()?;
    let most = (compressed.data.len() as u64).saturating_mul(MAX_RATIO).saturating_add(1 << 20);
    if compressed.format != object::CompressionFormat::None && compressed.uncompressed_size > most {
        return Err(SectionError::Inflated { size: compressed.uncompressed_size, compressed: compressed.data.len() });
    }
    Ok(compressed.decompress()?)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn file_offset_goes_through_the_holding_segment() {
        let segments = [(0x0, 0x1000, 0x0, 0x1000), (0x2000, 0x3000, 0x1000, 0x2000)];
        assert_eq!(file_offset_of(&segments, 0x10), Some(0x10));
        assert_eq!(file_offset_of(&segments, 0x2010), Some(0x1010));
        // In the segment but past its file-backed part (.bss).
        assert_eq!(file_offset_of(&segments, 0x4800), None);
        assert_eq!(file_offset_of(&segments, 0x1800), None);
    }

    #[test]
    fn resolves_symbols_of_this_test_binary() {
        // The test binary is a real ELF with a .symtab; main must resolve to
        // a function whose file bytes are the bytes at that offset.
        let exe = std::env::current_exe().unwrap();
        let image = ElfImage::open(&exe).unwrap();
        let main = image.function("main").expect("test binary has main");
        assert!(main.file_offset > 0);
        assert!(image.function("no_such_symbol_here").is_none());
    }

    /// The fuzzer's find: a compressed DWARF section that says it inflates
    /// to gigabytes from a few bytes.
    pub const INFLATED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/corpus/dwarf/regression-inflated-section");

    #[test]
    fn a_section_that_inflates_past_belief_is_refused_before_it_is_allocated() {
        use object::{Object as _, ObjectSection as _};
        let data = std::fs::read(INFLATED).expect("the fuzz corpus");
        let file = object::File::parse(&*data).expect("an ELF file");
        let refused: Vec<_> = file
            .sections()
            .filter_map(|s| match section_data(&s) {
                Err(SectionError::Inflated { size, compressed }) => {
                    Some((s.name().unwrap_or("").to_owned(), size, compressed))
                }
                _ => None,
            })
            .collect();
        assert!(!refused.is_empty(), "no section refused");
        for (name, size, compressed) in refused {
            assert!(size > (compressed as u64) * MAX_RATIO, "{name}: {size} from {compressed}");
        }
    }

    #[test]
    fn rejects_non_elf_with_path_in_message() {
        let err = ElfImage::parse(Path::new("/x/notelf"), b"#!/bin/sh\n").unwrap_err();
        assert!(err.to_string().starts_with("/x/notelf is not a readable ELF file"), "{err}");
    }
}
