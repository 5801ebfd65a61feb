//! What each fuzz target runs: tracer's parsers of input it does not
//! control (the target's binaries, its `/proc/PID/maps`, its memory), fed
//! the fuzzer's bytes. Every function here must return whatever the bytes
//! are: a panic (an overflow included, since the targets are built with
//! debug assertions) is a crash, and so is a hang or running out of
//! memory. The targets' inputs and the corpus are described in
//! docs/fuzzing.md.

use std::{
    ops::Range,
    path::{Path, PathBuf},
};

use tracer_user::{
    discover::{
        copies::Cfa,
        debuginfo,
        elf::{ElfImage, defines_cpython},
        entries::{self, Graph},
        guards::{self, ObjectArg, SizeArgs},
        inline::{self, FileOffsets},
        process, usdt,
        version::{self, Source},
    },
    heap::{bounds::Limits, image::Image, maps::Regions},
    python::{self, Abi, PythonVersion},
    unwind,
};

/// The one input that crashes the canary target.
pub const CANARY: &[u8] = b"tracer fuzz canary: this input crashes the canary target";

/// The name the targets give their input in messages.
const INPUT: &str = "fuzz-input";

/// Symbols tracer looks up in an interpreter image.
const SYMBOLS: &[&str] = &[
    "Py_Version",
    "_PyRuntime",
    "Py_Initialize",
    "PyType_Type",
    "PyUnicode_Type",
    "_Py_NewReference",
    "PyObject_Malloc",
    "main",
];

/// The ABIs of every supported version (whichever minor versions
/// `abi_for` knows).
fn abis() -> Vec<&'static dyn Abi> {
    (0..=20u8)
        .filter_map(|minor| python::abi_for(0, PythonVersion::from_hex(u32::from_be_bytes([3, minor, 0, 0xf0]))).ok())
        .collect()
}

/// What the guard scan looks for in each version: every probe, as
/// discover/copies.rs asks.
fn guard_wanted(abi: &dyn Abi) -> Vec<guards::Wanted<'static>> {
    abi.probes()
        .iter()
        .map(|p| guards::Wanted {
            function: p.symbol,
            guard: abi.guard(p.symbol),
            size: SizeArgs::of(p.program),
            object: ObjectArg::of(p.symbol),
        })
        .collect()
}

/// ELF symbol resolution: the symbol tables, the `PT_LOAD`s that map
/// addresses to file offsets, the SystemTap notes and their argument specs,
/// and the guard scan's decoding of every executable section.
pub fn elf(data: &[u8]) {
    let path = Path::new(INPUT);
    if let Ok(image) = ElfImage::parse(path, data) {
        let _ = defines_cpython(&image);
        for name in SYMBOLS {
            if let Some(symbol) = image.symbol(name) {
                let _ = image.file_offset(symbol.address);
                let _ = image.file_offset(symbol.address.wrapping_add(symbol.size));
            }
            let _ = image.function(name);
        }
    }
    if let Ok(offsets) = FileOffsets::of_image(path, data) {
        for address in [0, 0x1000, 0x40_0000, u64::MAX] {
            let _ = offsets.file_offset(address);
        }
    }
    if let Ok(notes) = usdt::notes(path, data) {
        for note in notes {
            let _ = usdt::parse_args(&note.args);
        }
    }
    if let Some(abi) = abis().first() {
        let _ = guards::scan_image(path, data, &guard_wanted(*abi), None);
    }
    // The two readers of `.eh_frame`: the native unwinder's rows, and the
    // CFA that places a size the DWARF gives relative to it.
    let _ = unwind::table::rows(data);
    let mut cfa = Cfa::of(data);
    if let Ok(image) = ElfImage::parse(path, data) {
        for name in SYMBOLS {
            if let Some(symbol) = image.symbol(name) {
                let _ = cfa.at(symbol.address);
                let _ = cfa.at(symbol.address.wrapping_add(symbol.size / 2));
            }
        }
    }
    for address in [0, 0x1000, u64::MAX] {
        let _ = cfa.at(address);
    }
}

/// `/proc/PID/maps`: procfs's parser as discover/process.rs calls it
/// ([`process::parse_maps`]), what it takes of each mapping, and the
/// census's own parser ([`Regions`]) with every question the census asks.
pub fn maps(data: &[u8]) {
    // Lines that start with a capital letter are smaps' `Key: value`
    // fields, which /proc/PID/maps never has (each of its lines starts
    // with an address in lowercase hex, and the kernel escapes a newline
    // in a path): procfs 0.18 multiplies their values by 1024 unchecked, an
    // overflow tracer cannot meet, so they are left out.
    let maps: Vec<u8> = data
        .split_inclusive(|&b| b == b'\n')
        .filter(|line| !line.first().is_some_and(u8::is_ascii_uppercase))
        .flatten()
        .copied()
        .collect();
    if let Ok(maps) = process::parse_maps(&maps) {
        for m in &maps {
            // What Target::inspect takes of each mapping.
            let _ = (m.address.1.checked_sub(m.address.0), m.offset, &m.pathname, m.perms, m.dev, m.inode);
        }
    }
    let text = String::from_utf8_lossy(data);
    let regions = Regions::parse(&text);
    let _ = regions.arena_candidates().count();
    let mut addresses: Vec<u64> =
        regions.regions.iter().flat_map(|r| [r.start, r.end, r.end.wrapping_sub(1)]).collect();
    addresses.extend([0, u64::MAX]);
    for address in addresses {
        let _ = regions.in_heap(address);
        let _ = regions.room(address);
        let _ = regions.readable(address, 8);
        let _ = regions.readable(address, u64::MAX);
    }
}

/// A file holding `data`, for the parsers that read a file by path (the
/// version is read from the image file at the symbol's offset). One per
/// process, in memory where /dev/shm is.
fn input_file(data: &[u8]) -> Option<PathBuf> {
    let dir = Path::new("/dev/shm");
    let dir = if dir.is_dir() { dir.to_owned() } else { std::env::temp_dir() };
    let path = dir.join(format!("tracer-fuzz-{}", std::process::id()));
    std::fs::write(&path, data).ok()?;
    Some(path)
}

/// Version detection from an image file: `Py_Version` found and read, the
/// version's tables chosen, and `_Py_DebugOffsets` checked against them.
pub fn version(data: &[u8]) {
    let Some(path) = input_file(data) else { return };
    if let Ok(elf) = ElfImage::parse(&path, data) {
        let source = Source::File(&elf, &path);
        if let Ok(v) = version::read(source) {
            let _ = v.to_string();
            if let Ok(abi) = python::abi_for_image(&path, v) {
                let _ = version::check_debug_offsets(source, abi, v);
            }
        }
    }
    if let Some(word) = data.get(..4) {
        let hex = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        let _ = python::abi_for(0, PythonVersion::from_hex(hex)).map(|abi| abi.probes().len());
    }
}

/// Every parameter name any probe asks the DWARF for.
const PARAMETERS: &[&str] = &["op", "ptr", "size", "nelem", "elsize", "new_size", "generation"];

/// DWARF: the inlined copies of the probed functions and their parameters'
/// locations, and finding the debug file the image names (its build-id and
/// `.gnu_debuglink`), inside an empty root.
pub fn dwarf(data: &[u8]) {
    let path = Path::new(INPUT);
    let mut functions: Vec<&str> = abis().iter().flat_map(|abi| abi.probes().iter().map(|p| p.symbol)).collect();
    functions.sort_unstable();
    functions.dedup();
    let wanted: Vec<inline::Wanted<'_>> =
        functions.iter().map(|&function| inline::Wanted { function, parameters: PARAMETERS }).collect();
    if let Ok(found) = inline::find(path, data, &wanted) {
        for f in &found {
            for site in f.out_of_line.iter().chain(&f.inlined) {
                for range in &site.ranges {
                    let _ = site.entered_at(range.start);
                }
            }
        }
    }
    let Some(file) = input_file(data) else { return };
    let root = file.with_extension("root");
    if std::fs::create_dir_all(&root).is_ok() {
        let _ = debuginfo::locate(Path::new("/usr/bin/python3"), &root, None, Some(file.as_path()));
    }
}

/// The probes of `abi` whose copies a switch guards, in its order: what
/// an x86 input's probe index counts in.
#[must_use]
pub fn guarded(abi: &dyn Abi) -> Vec<guards::Wanted<'static>> {
    guard_wanted(abi).into_iter().filter(|w| w.guard.is_some()).collect()
}

/// An input of the x86 target: code in chunks, one function of one
/// version to scan it for, and the symbols around it. In bytes
/// (little-endian):
///
/// ```text
/// u8  the minor version (11 for 3.11), u8 the probe (an index into
///     [`guarded`] of that version's ABI)
/// u32 the function's offset in the first chunk, u32 its size
/// i32 PyRefTracer_GetTracer's offset from the first chunk (i32::MIN: none)
/// u64 the address and u64 the size of the data symbol that holds the
///     tracemalloc flag (3.11, 3.12)
/// then chunks to the end: u64 address, u16 length, the code
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct X86Input {
    pub minor: u8,
    pub probe: u8,
    pub function: u32,
    pub size: u32,
    pub getter: Option<i32>,
    pub data: (u64, u64),
    pub chunks: Vec<(u64, Vec<u8>)>,
}

impl X86Input {
    const HEADER: usize = 2 + 4 + 4 + 4 + 8 + 8;

    /// Reads an input; missing header bytes read as zeroes, a last chunk
    /// cut short holds what is left.
    #[must_use]
    pub fn parse(data: &[u8]) -> Self {
        let getter = i32::from_le_bytes(bytes(data, 10));
        let mut input = Self {
            minor: data.first().copied().unwrap_or(0),
            probe: data.get(1).copied().unwrap_or(0),
            function: u32::from_le_bytes(bytes(data, 2)),
            size: u32::from_le_bytes(bytes(data, 6)),
            getter: (getter != i32::MIN).then_some(getter),
            data: (u64::from_le_bytes(bytes(data, 14)), u64::from_le_bytes(bytes(data, 22))),
            chunks: Vec::new(),
        };
        let mut rest = data.get(Self::HEADER..).unwrap_or(&[]);
        while rest.len() >= 10 {
            let address = u64::from_le_bytes(bytes(rest, 0));
            let len = usize::from(u16::from_le_bytes(bytes(rest, 8)));
            let code = &rest[10..];
            let code = &code[..len.min(code.len())];
            input.chunks.push((address, code.to_vec()));
            rest = &rest[10 + code.len()..];
        }
        input
    }

    /// The input in the format [`X86Input::parse`] reads.
    #[must_use]
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![self.minor, self.probe];
        out.extend_from_slice(&self.function.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.getter.unwrap_or(i32::MIN).to_le_bytes());
        out.extend_from_slice(&self.data.0.to_le_bytes());
        out.extend_from_slice(&self.data.1.to_le_bytes());
        for (address, code) in &self.chunks {
            let code = &code[..code.len().min(usize::from(u16::MAX))];
            out.extend_from_slice(&address.to_le_bytes());
            out.extend_from_slice(&u16::try_from(code.len()).unwrap_or(u16::MAX).to_le_bytes());
            out.extend_from_slice(code);
        }
        out
    }
}

/// Reads `N` bytes at `at`, zeroes past the end.
fn bytes<const N: usize>(data: &[u8], at: usize) -> [u8; N] {
    let mut out = [0; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = data.get(at + i).copied().unwrap_or(0);
    }
    out
}

/// x86 site classification (see [`X86Input`]): the code scanned for the
/// reads of the function's switch, as discover/guards does in an image,
/// and decoded into the graph discover/entries.rs finds other entries of a
/// copy in, with the function and each read found as copies.
pub fn x86(data: &[u8]) {
    let input = X86Input::parse(data);
    let abi = python::abi_for(0, PythonVersion::from_hex(u32::from_be_bytes([3, input.minor, 0, 0xf0])))
        .ok()
        .or_else(|| abis().first().copied());
    let Some(abi) = abi else { return };
    let wanted = guarded(abi);
    let Some(wanted) = wanted.get(usize::from(input.probe) % wanted.len().max(1)) else { return };
    let base = input.chunks.first().map_or(0, |c| c.0);
    let entry = base.wrapping_add(u64::from(input.function));
    let mut functions = vec![(wanted.function, entry, u64::from(input.size))];
    if let Some(getter) = input.getter {
        functions.push(("PyRefTracer_GetTracer", base.wrapping_add_signed(i64::from(getter)), 16));
    }
    let within = match wanted.guard {
        Some(python::Guard::TracemallocFlag { within, .. }) => within,
        _ => "_PyRuntime",
    };
    let sections: Vec<(u64, &[u8])> = input.chunks.iter().map(|(a, c)| (*a, c.as_slice())).collect();
    let found = guards::scan_code(sections.clone(), &functions, &[(within, input.data.0, input.data.1)], &[*wanted]);
    let reads: Vec<u64> =
        found.values().filter_map(|f| f.as_ref().ok()).flat_map(|f| f.sites.iter().map(|s| s.read.address)).collect();
    // The function's code as a copy entered at its start, in the graph of
    // all the chunks as the parts of one function.
    let graph = Graph::decode_parts(&sections);
    #[allow(clippy::single_range_in_vec_init, reason = "one range of code, as a copy's ranges are listed")]
    let ranges: [Range<u64>; 1] = [entry..entry.saturating_add(u64::from(input.size))];
    let _ = entries::other_entries(&graph, &reads, &[entries::Copy { entry, ranges: &ranges }]);
}

/// The most bytes of anonymous mappings a heap input may make the census
/// scan for pools: it reads 48 bytes at every 16 KiB of them, as it does in
/// a process, so a map of terabytes is a slow input, not a finding.
const MAX_SCANNED: u64 = 1 << 32;

/// The census's pool and object decoding, from a memory image (the format
/// is heap/image.rs's), within limits small enough for a fuzzer's pace.
pub fn heap(data: &[u8]) {
    let Ok(image) = Image::parse(data) else { return };
    let regions = Regions::parse(&image.maps);
    let scanned = regions.arena_candidates().fold(0u64, |sum, r| sum.saturating_add(r.end.saturating_sub(r.start)));
    if scanned > MAX_SCANNED {
        return;
    }
    let _ = image.census(Limits { gc_objects: 20_000, items: 200_000, referenced: 20_000, rounds: 8 });
}
