//! Where LTO put the copies of a function. An LTO build inlines most calls
//! of `_Py_NewReference` or `PyObject_Malloc` into their callers, so a
//! uprobe on the symbol misses them; the DWARF records each copy as a
//! `DW_TAG_inlined_subroutine`. This module lists, per function, its
//! out-of-line definitions and inlined instances with their entry
//! addresses and where the requested parameters live there, so that a probe
//! at each copy can count it and read its arguments.
//!
//! Addresses are link-time virtual addresses; [`FileOffsets`] turns them
//! into the file offsets a uprobe takes, through the image's own `PT_LOAD`s.
//!
//! The DIEs are walked in `walk`, and the parameters' location expressions
//! evaluated in `location`.

mod location;
mod walk;

use std::{borrow::Cow, collections::HashMap, ops::Range, path::Path, path::PathBuf};

use gimli::{EndianSlice, RunTimeEndian};
use object::Object as _;
use thiserror::Error;

pub use self::location::{Location, Register};
use self::walk::Walk;
use crate::discover::{debuginfo::BAD_FILE_FIX, elf};

/// DWARF that cannot be read: a truncated or corrupt debug file.
#[derive(Debug, Error)]
pub enum InlineError {
    #[error("{path} is not a readable ELF file: {cause}")]
    Parse { path: PathBuf, cause: object::Error },
    #[error("{path}: cannot read its {section} section (truncated or corrupt?): {cause}; {BAD_FILE_FIX}")]
    Section { path: PathBuf, section: &'static str, cause: object::Error },
    #[error(
        "{path}: its {section} section says it decompresses to {size} bytes from {compressed}, more than any compressor makes of them (corrupt?); {BAD_FILE_FIX}"
    )]
    Inflated { path: PathBuf, section: &'static str, size: u64, compressed: usize },
    #[error("{path}: malformed DWARF near .debug_info offset {offset:#x}: {cause}; {BAD_FILE_FIX}")]
    Dwarf { path: PathBuf, offset: u64, cause: gimli::Error },
}

/// One function to look for, and the parameters whose locations are wanted
/// (by their names in the source: `size` for `PyObject_Malloc`).
#[derive(Clone, Copy, Debug)]
pub struct Wanted<'a> {
    pub function: &'a str,
    pub parameters: &'a [&'a str],
}

/// Every copy of one function in the image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionSites {
    pub function: String,
    /// `DW_TAG_subprogram`s with code: the symbol, and the clones GCC makes
    /// (`.constprop`, `.isra`, `.part`), whose parameters may differ.
    pub out_of_line: Vec<Site>,
    /// `DW_TAG_inlined_subroutine`s, one per distinct entry address.
    pub inlined: Vec<Site>,
}

/// One copy of a function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    /// Where the copy starts executing.
    pub entry: u64,
    pub entry_from: EntryFrom,
    /// Its code, in the order the DWARF lists it (the hot part first, then
    /// any `.cold` part).
    pub ranges: Vec<Range<u64>>,
    /// Its DIE's `.debug_info` offset, for checking by hand with
    /// `llvm-dwarfdump --debug-info=OFFSET`.
    pub die: u64,
    /// The wanted parameters, in the order asked for, at `entry`.
    pub parameters: Vec<Parameter>,
    /// Their locations at the start of each of `ranges`, where a path that
    /// skips the entry may come in (see discover/entries.rs).
    pub at_ranges: Vec<Vec<Location>>,
}

impl Site {
    /// This copy as entered at `address`, the start of one of its ranges,
    /// with its parameters there (unknown elsewhere).
    #[must_use]
    pub fn entered_at(&self, address: u64) -> Self {
        let at = self.ranges.iter().position(|r| r.start == address).and_then(|i| self.at_ranges.get(i));
        let parameters = (self.parameters.iter().enumerate())
            .map(|(i, p)| Parameter {
                name: p.name.clone(),
                location: at.and_then(|l| l.get(i)).copied().unwrap_or(Location::Unknown),
            })
            .collect();
        Self { entry: address, parameters, ..self.clone() }
    }
}

/// Which attribute gave a [`Site`]'s entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryFrom {
    EntryPc,
    LowPc,
    /// The start of the first listed range. Not the lowest start: GCC puts
    /// `.cold` parts below the hot code, and the listing starts with the
    /// hot part, as GDB also assumes.
    FirstRange,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parameter {
    pub name: String,
    pub location: Location,
}

/// Maps link-time addresses to file offsets through an image's `PT_LOAD`s.
/// It must be built from the image itself: a separate debug file's
/// `PT_LOAD`s have no file bytes, and it maps nothing.
#[derive(Clone, Debug)]
pub struct FileOffsets(Vec<(u64, u64, u64, u64)>);

impl FileOffsets {
    pub fn of_image(path: &Path, data: &[u8]) -> Result<Self, InlineError> {
        let file = object::File::parse(data).map_err(|cause| InlineError::Parse { path: path.to_owned(), cause })?;
        Ok(Self(elf::load_segments(&file)))
    }

    /// The file offset of `address`, if a segment's file bytes hold it.
    #[must_use]
    pub fn file_offset(&self, address: u64) -> Option<u64> {
        elf::file_offset_of(&self.0, address)
    }
}

/// Every copy of each wanted function in the DWARF of `data` (a debug file,
/// or an image with its own DWARF), in the order of `wanted`. `path` is for
/// messages.
pub fn find(path: &Path, data: &[u8], wanted: &[Wanted<'_>]) -> Result<Vec<FunctionSites>, InlineError> {
    let file = object::File::parse(data).map_err(|cause| InlineError::Parse { path: path.to_owned(), cause })?;
    let endian = if file.is_little_endian() { RunTimeEndian::Little } else { RunTimeEndian::Big };
    let sections = gimli::DwarfSections::load(|id| -> Result<Cow<'_, [u8]>, InlineError> {
        file.section_by_name(id.name()).map_or(Ok(Cow::Borrowed(&[][..])), |s| {
            elf::section_data(&s).map_err(|e| match e {
                elf::SectionError::Read(cause) => {
                    InlineError::Section { path: path.to_owned(), section: id.name(), cause }
                }
                elf::SectionError::Inflated { size, compressed } => {
                    InlineError::Inflated { path: path.to_owned(), section: id.name(), size, compressed }
                }
            })
        })
    })?;
    let dwarf = sections.borrow(|s| EndianSlice::new(s, endian));
    let err = |offset: u64| move |cause| InlineError::Dwarf { path: path.to_owned(), offset, cause };
    let mut units = Vec::new();
    let mut headers = dwarf.units();
    while let Some(header) = headers.next().map_err(err(0))? {
        let start = header.debug_info_offset().map_or(0, |o| o.0 as u64);
        units.push((start, dwarf.unit(header).map_err(err(start))?));
    }
    let mut walk = Walk {
        dwarf: &dwarf,
        units: &units,
        wanted,
        names: wanted.iter().enumerate().map(|(i, w)| (w.function.as_bytes(), i)).collect(),
        origins: HashMap::new(),
        found: wanted.iter().map(|w| (w.function.to_owned(), Vec::new(), Vec::new())).collect(),
    };
    for index in 0..units.len() {
        walk.unit(index).map_err(|(offset, cause)| InlineError::Dwarf { path: path.to_owned(), offset, cause })?;
    }
    Ok(walk
        .found
        .into_iter()
        .map(|(function, o, i)| FunctionSites { function, out_of_line: dedup(o), inlined: dedup(i) })
        .collect())
}

/// Sorts sites by entry and merges those at one address (the same copy
/// described twice), keeping any parameter location either knows.
fn dedup(mut sites: Vec<Site>) -> Vec<Site> {
    sites.sort_by_key(|s| (s.entry, s.die));
    let mut out: Vec<Site> = Vec::with_capacity(sites.len());
    for site in sites {
        match out.last_mut() {
            Some(last) if last.entry == site.entry => {
                for (mine, theirs) in last.parameters.iter_mut().zip(site.parameters) {
                    if !mine.location.is_known() {
                        mine.location = theirs.location;
                    }
                }
                if last.ranges == site.ranges {
                    for (mine, theirs) in last.at_ranges.iter_mut().flatten().zip(site.at_ranges.into_iter().flatten())
                    {
                        if !mine.is_known() {
                            *mine = theirs;
                        }
                    }
                }
            }
            _ => out.push(site),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use object::ObjectSection as _;

    use super::*;
    use crate::discover::{
        debuginfo::tests::{DEBIAN_PYTHON, debian_debug_file, pyenv_libpython},
        elf::ElfImage,
    };

    fn reg(n: u16) -> Register {
        Register::from_dwarf(n).unwrap()
    }

    #[test]
    fn duplicate_entries_merge_their_known_locations() {
        let site = |die, location| Site {
            entry: 0x10,
            entry_from: EntryFrom::EntryPc,
            ranges: vec![0x10..0x20, 0x30..0x38],
            die,
            parameters: vec![Parameter { name: "op".into(), location }],
            at_ranges: vec![vec![location]; 2],
        };
        let merged =
            dedup(vec![site(2, Location::Unknown), site(1, Location::Unknown), site(3, Location::Constant(1))]);
        assert_eq!(merged, vec![Site { die: 1, ..site(1, Location::Constant(1)) }]);
    }

    fn debian_python_sites() -> Vec<FunctionSites> {
        let path = debian_debug_file();
        let data = std::fs::read(&path).unwrap();
        let wanted = [
            Wanted { function: "_Py_NewReference", parameters: &["op"] },
            Wanted { function: "PyObject_Malloc", parameters: &["size"] },
            Wanted { function: "PyObject_Calloc", parameters: &["nelem", "elsize"] },
        ];
        find(&path, &data, &wanted).unwrap()
    }

    /// How many of `sites` know each wanted parameter's location.
    fn known(sites: &[Site]) -> Vec<usize> {
        let params = sites.first().map_or(0, |s| s.parameters.len());
        (0..params).map(|i| sites.iter().filter(|s| s.parameters[i].location.is_known()).count()).collect()
    }

    /// The expected numbers were checked independently of gimli, on the
    /// text of `llvm-dwarfdump-22 --debug-info` of the debug file, with a
    /// short script: every `DW_TAG_inlined_subroutine` whose
    /// `DW_AT_abstract_origin` is the function's DIE (one each:
    /// `_Py_NewReference` 0x6c2716, `PyObject_Malloc` 0x6c52fc), counted by
    /// distinct entry (`DW_AT_entry_pc`, else `DW_AT_low_pc`, else the first
    /// range: all distinct), and for each the location list entry of the
    /// parameter's `DW_TAG_formal_parameter` child that covers the entry,
    /// matched against the forms [`evaluate`] knows. `_Py_NewReference`:
    /// 209 instances, `op` known in all (in a register in 207, `DW_OP_fbreg`
    /// in 2). `PyObject_Malloc`: 137, `size` known in 82 (40 constants, 42
    /// registers); of the 55 others, 44 are sums of two registers
    /// (`DW_OP_bregX, DW_OP_bregY, DW_OP_plus`), 3 other arithmetic, and 8
    /// have no location there. `PyObject_Calloc`: 11, both parameters constant in 10.
    #[test]
    fn debian_python_has_209_inlined_new_references() {
        let found = debian_python_sites();
        let image = ElfImage::open(Path::new(DEBIAN_PYTHON)).unwrap();
        let offsets = FileOffsets::of_image(Path::new(DEBIAN_PYTHON), &std::fs::read(DEBIAN_PYTHON).unwrap()).unwrap();
        let [new_ref, malloc, calloc] = &found[..] else { panic!("{found:?}") };
        assert_eq!(new_ref.function, "_Py_NewReference");
        let symbol = image.function("_Py_NewReference").unwrap();
        let out_of_line: Vec<u64> = new_ref.out_of_line.iter().map(|s| s.entry).collect();
        assert_eq!(out_of_line, [symbol.address]);
        assert_eq!(new_ref.out_of_line[0].parameters[0].location, Location::Register(reg(5)));
        assert_eq!(offsets.file_offset(symbol.address), Some(symbol.file_offset));
        assert_eq!((new_ref.inlined.len(), known(&new_ref.inlined)), (209, vec![209]));

        let malloc_symbol = image.function("PyObject_Malloc").unwrap();
        let [out_of_line] = &malloc.out_of_line[..] else { panic!("{:#x?}", malloc.out_of_line) };
        // The symbol's copy: size in rdi, and its hot code listed before
        // the .cold part, which lies lower.
        assert_eq!((out_of_line.entry, out_of_line.entry_from), (malloc_symbol.address, EntryFrom::FirstRange));
        assert_eq!(out_of_line.parameters[0].location, Location::Register(reg(5)));
        assert!(out_of_line.ranges[1].start < out_of_line.entry, "{out_of_line:#x?}");
        assert_eq!((malloc.inlined.len(), known(&malloc.inlined)), (137, vec![82]));
        assert_eq!((calloc.inlined.len(), known(&calloc.inlined)), (11, vec![10, 10]));

        for site in found.iter().flat_map(|f| f.inlined.iter().chain(&f.out_of_line)) {
            assert!(offsets.file_offset(site.entry).is_some(), "{site:#x?}");
        }
        // GCC may put an entry_pc where the inlined body starts in a later
        // location view, in an empty range: twice for PyObject_Malloc.
        let outside = malloc.inlined.iter().filter(|s| !s.ranges.iter().any(|r| r.contains(&s.entry))).count();
        assert_eq!(outside, 2);
        // A debug file's PT_LOADs have no bytes: no offsets from it.
        let debug = FileOffsets::of_image(&debian_debug_file(), &std::fs::read(debian_debug_file()).unwrap()).unwrap();
        assert_eq!(debug.file_offset(symbol.address), None);
    }

    /// pyenv's build is not LTO: `_Py_NewReference` is one out-of-line
    /// function, found in the image's own DWARF by its `DW_AT_name`, and
    /// inlined nowhere (`llvm-dwarfdump-22 --debug-info` lists no
    /// `DW_TAG_inlined_subroutine` of it).
    #[test]
    fn pyenv_libpython_has_one_new_reference_in_its_own_dwarf() {
        let lib = pyenv_libpython();
        let data = std::fs::read(&lib).unwrap();
        let found = find(&lib, &data, &[Wanted { function: "_Py_NewReference", parameters: &["op"] }]).unwrap();
        let symbol = ElfImage::parse(&lib, &data).unwrap().function("_Py_NewReference").unwrap().address;
        let [sites] = &found[..] else { panic!("{found:?}") };
        assert_eq!(
            sites.out_of_line.iter().map(|s| (s.entry, s.entry_from)).collect::<Vec<_>>(),
            [(symbol, EntryFrom::LowPc)]
        );
        assert_eq!(sites.out_of_line[0].parameters[0].location, Location::Register(reg(5)));
        assert!(sites.inlined.is_empty(), "{sites:#x?}");
    }

    /// A C program where GCC 12 -O2 inlines `bump(7)` and splits the
    /// out-of-line `bump` into hot and `.cold` parts, with DWARF 4's
    /// `.debug_ranges` and `.debug_loc` (python3.11's DWARF is version 5).
    const DWARF4_PROGRAM: &str = r"
        volatile long sink;
        __attribute__((cold, noinline)) void complain(long n) { sink = -n; }
        long bump(long n) {
            if (n < 0) complain(n);
            sink += n;
            return sink;
        }
        int main(int argc, char **argv) { (void)argc; bump((long)argv); bump(7); return 0; }
    ";

    #[test]
    fn dwarf4_ranges_and_location_lists() {
        let dir = std::env::temp_dir().join(format!("tracer-inline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("t.c"), DWARF4_PROGRAM).unwrap();
        let status = std::process::Command::new("gcc")
            .args(["-O2", "-gdwarf-4", "-o"])
            .arg(dir.join("t"))
            .arg(dir.join("t.c"))
            .status()
            .expect("gcc runs (apt-get install gcc)");
        assert!(status.success());
        let data = std::fs::read(dir.join("t")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let file = object::File::parse(&*data).unwrap();
        assert!(file.section_by_name(".debug_ranges").is_some() && file.section_by_name(".debug_loc").is_some());
        let image = ElfImage::parse(Path::new("t"), &data).unwrap();
        let bump = image.function("bump").unwrap().address;
        let found = find(Path::new("t"), &data, &[Wanted { function: "bump", parameters: &["n"] }]).unwrap();
        let [sites] = &found[..] else { panic!("{found:?}") };
        let [out_of_line] = &sites.out_of_line[..] else { panic!("{sites:#x?}") };
        assert_eq!((out_of_line.entry, out_of_line.entry_from), (bump, EntryFrom::FirstRange));
        assert_eq!(out_of_line.ranges.len(), 2);
        assert!(out_of_line.ranges[1].start < bump, "the .cold part lies lower: {out_of_line:#x?}");
        assert_eq!(out_of_line.parameters[0].location, Location::Register(reg(5)));
        let [inlined] = &sites.inlined[..] else { panic!("{sites:#x?}") };
        assert_eq!(inlined.parameters[0].location, Location::Constant(7));
        assert_eq!(inlined.entry_from, EntryFrom::EntryPc);
    }

    #[test]
    fn a_truncated_or_corrupt_debug_file_is_an_error() {
        let path = debian_debug_file();
        let mut data = std::fs::read(&path).unwrap();
        let wanted = [Wanted { function: "_Py_NewReference", parameters: &["op"] }];
        let err = find(&path, &data[..data.len() / 2], &wanted).unwrap_err();
        assert!(matches!(err, InlineError::Parse { .. }), "{err}");
        // Garble the middle of the compressed .debug_info.
        let file = object::File::parse(&*data).unwrap();
        let (offset, size) = file
            .section_by_name(".debug_info")
            .unwrap()
            .compressed_file_range()
            .map(|r| (r.offset, r.compressed_size))
            .unwrap();
        let middle = usize::try_from(offset + size / 2).unwrap();
        data[middle..middle + 4096].fill(0xa5);
        let err = find(&path, &data, &wanted).unwrap_err();
        assert!(matches!(err, InlineError::Section { section: ".debug_info", .. }), "{err}");
        assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
    }
}
