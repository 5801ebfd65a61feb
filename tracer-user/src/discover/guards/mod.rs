//! Finding the copies LTO inlined without any debug info: every inlined copy
//! of a probed function still reads the runtime switch that guards it, so
//! each read of that switch in the code is one copy.
//!
//! - `_Py_NewReference` reads the tracemalloc flag (3.11, 3.12) or the
//!   reference tracer (3.13+), which it calls when set;
//! - every allocator function reads its slot in the allocator table
//!   (`PyMem_SetAllocator` can change it) and calls through it; that read
//!   is also where PGO compares the slot against pymalloc, to run an inlined
//!   pymalloc instead.
//!
//! The switch's address comes from the exported function's own code: the
//! first read of static memory in `_Py_NewReference`, the slot an allocator
//! function calls through. Reads are found by decoding every executable
//! section. A site's *slow path*, where the switch is set, shows what the
//! copy does: the event it passes to the reference tracer (creation or
//! destruction) and the size it passes to the allocator, whose register is
//! then read at the site.
//!
//! Limits, each reported rather than guessed: a copy that reached the switch
//! through a register rather than by address is not found; code whose
//! symbols are stripped may hold reads of the switch that are no call
//! (startup code that installs allocators), which the difference between
//! two readings cancels.
//!
//! The image's code is decoded in `decode`, what its instructions leave in
//! the registers is followed in `registers`, and the reads are told apart
//! in `classify`.

mod classify;
mod decode;
mod registers;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use self::{
    decode::Code,
    registers::{RDI, RSI},
};
use super::{
    InlineEntry,
    elf::ElfError,
    line::{Landings, LineEnd},
};
use crate::python::Guard;

/// What the scan found for one function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The switch, described for `tracer probes` ("the allocator slot at
    /// 0x954f48").
    pub guard: String,
    /// One per inlined copy: where to probe it, with the later instructions
    /// a probe may move to instead.
    pub sites: Vec<GuardSite>,
    /// Reads of the switch where objects are destroyed (3.13+), not counted.
    pub destroy: usize,
    /// Reads that could not be told creation or destruction: not counted,
    /// so the calls are partial.
    pub unclassified: Vec<u64>,
    /// Reads inside the function itself (its entry probe counts those) or
    /// in functions that only manage the switch.
    pub excluded: usize,
    /// Reads in a function whose start (from `.eh_frame`) the linear
    /// decoding did not land on: the decoding there may be out of step with
    /// the code, and a breakpoint inside an instruction would break the
    /// target. Not probed, so the calls are partial.
    pub undecodable: usize,
}

/// One copy found by its read of the switch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardSite {
    /// The read, and where the size is there.
    pub read: InlineEntry,
    /// Later instructions on the same straight line, which every pass
    /// through the read reaches exactly once and no branch enters, each with
    /// where the size is there: a probe may go to one the kernel emulates
    /// (see [`line`](crate::discover::line)).
    pub later: Vec<InlineEntry>,
    /// Why the line ends where it does.
    pub end: LineEnd,
    /// The jumps that alone lead into the read, each with the condition
    /// under which it does (see [`line::gate`](crate::discover::line::gate)).
    pub gate: Vec<(InlineEntry, Option<u8>)>,
}

/// Where the two routes to a function's copies disagree: the DWARF's
/// inlined copies, and the reads of the switch that guards them.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CrossCheck {
    /// The copies each route found.
    pub dwarf: usize,
    pub guard_reads: usize,
    /// Reads of the switch that lie in no copy the DWARF lists (link-time
    /// addresses).
    pub guard_only: Vec<u64>,
    /// Entries of the DWARF's copies that hold no read of the switch.
    pub dwarf_only: Vec<u64>,
}

impl CrossCheck {
    /// Compares the reads `found` with the DWARF's copies of the same
    /// function, each an entry and the ranges of its code.
    #[must_use]
    pub fn of(found: &Found, copies: &[(u64, &[std::ops::Range<u64>])]) -> Self {
        let reads: Vec<u64> = found.sites.iter().map(|s| s.read.address).collect();
        let inside = |read: u64| copies.iter().any(|(_, ranges)| ranges.iter().any(|r| r.contains(&read)));
        let holds_read = |ranges: &[std::ops::Range<u64>]| reads.iter().any(|a| ranges.iter().any(|r| r.contains(a)));
        Self {
            dwarf: copies.len(),
            guard_reads: reads.len(),
            guard_only: reads.iter().copied().filter(|&a| !inside(a)).collect(),
            dwarf_only: copies.iter().filter(|(_, ranges)| !holds_read(ranges)).map(|(entry, _)| *entry).collect(),
        }
    }
}

/// Why a function's copies were not found this way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotFound {
    /// The version module knows no switch that guards it.
    NoGuard,
    /// The image does not define it.
    NoSymbol,
    /// Its code does not show the switch, or shows one that disagrees with
    /// the cross-check.
    Unrecognised(String),
}

/// The result of scanning one image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scan {
    /// The scanned image.
    pub path: PathBuf,
    pub functions: HashMap<String, Result<Found, NotFound>>,
    /// Where control may land in its code other than by falling through.
    pub landings: Landings,
}

/// A probed function and how its copies can be found.
#[derive(Clone, Copy, Debug)]
pub struct Wanted<'a> {
    pub function: &'a str,
    pub guard: Option<Guard>,
    /// Which slow-path registers hold the requested size, for an
    /// allocating function.
    pub size: SizeArgs,
    /// Which of the slow path's arguments is to be read at the site, if
    /// any.
    pub object: Option<ObjectArg>,
}

/// An argument of a guarded call that a probe reads besides the size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectArg {
    /// The first (`%rdi`), the new object: `_PyTraceMalloc_NewReference(op)`
    /// (3.11, 3.12), the reference tracer's `tracer_func(op, event, data)`
    /// (3.13+).
    NewObject,
    /// The second (`%rsi`), a realloc's block, for `--live`: the allocator
    /// table's `realloc(ctx, ptr, new_size)` (Include/cpython/pymem.h,
    /// `PyMemAllocatorEx`, v3.11.0 to v3.14.0).
    Reallocated,
}

impl ObjectArg {
    /// What probe `symbol`'s sites read besides the size.
    #[must_use]
    pub fn of(symbol: &str) -> Option<Self> {
        if crate::python::object_parameter(symbol).is_some() {
            Some(Self::NewObject)
        } else {
            crate::python::reallocated_block_parameter(symbol).map(|_| Self::Reallocated)
        }
    }

    const fn register(self) -> usize {
        match self {
            Self::NewObject => RDI,
            Self::Reallocated => RSI,
        }
    }
}

/// Where the allocator function a slot points to is passed the size: it
/// takes the domain's context first, so each API argument moves one
/// register on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeArgs {
    None,
    /// `malloc(ctx, size)`: `%rsi`.
    Second,
    /// `realloc(ctx, ptr, size)`: `%rdx`.
    Third,
    /// `calloc(ctx, nelem, elsize)`: `%rsi` times `%rdx`.
    SecondTimesThird,
}

impl SizeArgs {
    /// Where the slow path passes the size for a function probed with
    /// `program`.
    #[must_use]
    pub const fn of(program: crate::probe::Program) -> Self {
        use crate::probe::Program;
        match program {
            Program::SizeArg0 => Self::Second,
            Program::SizeArg1 => Self::Third,
            Program::Calloc => Self::SecondTimesThird,
            Program::CountCall
            | Program::CountClaimed
            | Program::Empty
            | Program::MetaInsert
            | Program::MetaLookup
            | Program::MetaPool
            | Program::MetaChunk
            | Program::RetValue
            | Program::RetValueUret
            | Program::LiveAlloc
            | Program::LiveFree
            | Program::LiveImpl
            | Program::LiveRet
            | Program::LiveRetUret
            | Program::CountSite
            | Program::CountObject
            | Program::NativeSizeArg0
            | Program::NativeSizeArg1
            | Program::NativeSizeArg2
            | Program::NativeCalloc
            | Program::NativeCall
            | Program::NativeReleaseArg1
            | Program::NativeNested
            | Program::FreeObject => Self::None,
        }
    }
}

/// Scans the image at `path` for the copies of each of `wanted`; with
/// `symbols`, a debug file's, also names its static functions.
pub fn scan(path: &Path, wanted: &[Wanted<'_>], symbols: Option<(&Path, &[u8])>) -> Result<Scan, ElfError> {
    let data = std::fs::read(path).map_err(|cause| ElfError::Read { path: path.to_owned(), cause })?;
    scan_image(path, &data, wanted, symbols)
}

/// [`scan`] of the image `data`, read from `path`.
pub fn scan_image(
    path: &Path,
    data: &[u8],
    wanted: &[Wanted<'_>],
    symbols: Option<(&Path, &[u8])>,
) -> Result<Scan, ElfError> {
    let mut code = Code::parse(path, data)?;
    if let Some((debug_path, debug)) = symbols {
        let file =
            object::File::parse(debug).map_err(|cause| ElfError::Parse { path: debug_path.to_owned(), cause })?;
        code.add_symbols(&file);
    }
    let functions = wanted.iter().map(|w| (w.function.to_owned(), code.find(w))).collect();
    Ok(Scan { path: path.to_owned(), functions, landings: code.targets.clone() })
}

/// A named function or data symbol: name, address, size.
pub type Named<'a> = (&'a str, u64, u64);

/// The scan of code with no ELF file around it: `sections` (each its
/// address and bytes) decoded, `functions` and `data` its named symbols.
/// What [`scan`] does past the file's sections and symbols, for the fuzz
/// target that feeds it raw x86 code.
#[must_use]
pub fn scan_code(
    sections: Vec<(u64, &[u8])>,
    functions: &[Named<'_>],
    data: &[Named<'_>],
    wanted: &[Wanted<'_>],
) -> HashMap<String, Result<Found, NotFound>> {
    let mut code = Code::decode(sections);
    for &(name, address, size) in functions {
        code.symbols.entry(name.to_owned()).or_insert((address, size));
    }
    for &(name, address, size) in data {
        code.data.entry(name.to_owned()).or_insert((address, size));
    }
    code.index_ranges();
    wanted.iter().map(|w| (w.function.to_owned(), code.find(w))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scan of the machine's LTO builds (Debian's 3.11, the forky
    /// root's 3.13 and 3.14, which `cargo xtask setup` installs) agrees with
    /// what CPython's source says of them: each domain's four slots are
    /// consecutive pointers of one `PyMemAllocatorEx` (Include/cpython/pymem.h
    /// at v3.11.0 to v3.14.0: `ctx`, `malloc`, `calloc`, `realloc`, `free`),
    /// every function a switch guards has copies, and every read of the
    /// reference tracer is told creation or destruction.
    #[test]
    fn the_lto_builds_scan_as_their_source_says() {
        use crate::python::{PythonVersion, abi_for};
        for (path, hex) in [
            ("/usr/bin/python3.11", 0x030B_02F0),
            ("/var/lib/tracer/forky/usr/bin/python3.13", 0x030D_00F0),
            ("/var/lib/tracer/forky/usr/bin/python3.14", 0x030E_00F0),
        ] {
            assert!(Path::new(path).is_file(), "{path} is missing: run `cargo xtask setup`");
            let abi = abi_for(0, PythonVersion::from_hex(hex)).expect("supported");
            let wanted: Vec<Wanted<'_>> = abi
                .probes()
                .iter()
                .map(|p| Wanted {
                    function: p.symbol,
                    guard: abi.guard(p.symbol),
                    size: SizeArgs::of(p.program),
                    object: ObjectArg::of(p.symbol),
                })
                .collect();
            let scan = scan(Path::new(path), &wanted, None).expect("scan");
            let slot = |f: &str| {
                let found = scan.functions[f].as_ref().unwrap_or_else(|e| panic!("{path}: {f}: {e:?}"));
                let at = found
                    .guard
                    .rsplit(' ')
                    .next()
                    .and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok());
                at.unwrap_or_else(|| panic!("{path}: {f}: {}", found.guard))
            };
            for domain in ["PyObject_", "PyMem_", "PyMem_Raw"] {
                let malloc = slot(&format!("{domain}Malloc"));
                for (i, kind) in ["Calloc", "Realloc", "Free"].iter().enumerate() {
                    assert_eq!(slot(&format!("{domain}{kind}")), malloc + 8 * (i as u64 + 1), "{path}: {domain}{kind}");
                }
            }
            for w in &wanted {
                let Some(guard) = w.guard else { continue };
                let found = scan.functions[w.function].as_ref().expect("found");
                assert!(found.undecodable == 0 && found.unclassified.is_empty(), "{path}: {}: {found:?}", w.function);
                if w.function == "_Py_NewReference" {
                    assert!(found.sites.len() > 100, "{path}: {} copies", found.sites.len());
                    assert_eq!(found.destroy > 0, guard == Guard::RefTracer, "{path}: {found:?}");
                }
            }
        }
    }
}
