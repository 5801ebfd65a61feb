//! What a probe is: a function, the BPF program that counts it, and which
//! of them `--probes` picks. The per-version tables are in
//! [`crate::python`].

use tracer_common::names::programs;

/// A BPF program in the embedded object; each serves every function whose
/// arguments have its shape, told apart by the attach cookie.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Program {
    /// Counts calls only.
    CountCall,
    /// Counts calls and the size in the first argument.
    SizeArg0,
    /// Counts calls and the size in the second argument (realloc).
    SizeArg1,
    /// Counts calls and nelem × elsize from the first two arguments.
    Calloc,
    /// Does nothing: the bare cost of a uprobe hit, for benchmarks.
    Empty,
    /// Bench-only (in the bench object alone, as the three below): the
    /// first argument put in a table shaped as the live table and taken
    /// out (tracer-ebpf/src/experiment.rs).
    MetaInsert,
    /// Bench-only: the same, looked up 32 times in between.
    MetaLookup,
    /// Bench-only: pymalloc's size class read from the pool header of
    /// the block in the first argument, 32 times.
    MetaPool,
    /// Bench-only: glibc's chunk size word before the block in the first
    /// argument, read 32 times.
    MetaChunk,
    /// Records rax where it holds the result (a `ret` instruction).
    RetValue,
    /// Records the return value through a uretprobe.
    RetValueUret,
    /// With `--live`, at an allocating API function's entry: keeps its
    /// domain for the implementation it calls.
    LiveAlloc,
    /// With `--live`, at a free's entry: the same, for a free.
    LiveFree,
    /// With `--live`, at an allocator implementation's entry.
    LiveImpl,
    /// With `--live`, at an implementation's `ret`s.
    LiveRet,
    /// With `--live`, at an implementation's return, by uretprobe.
    LiveRetUret,
    /// Counts a call at an inlined copy, with the size where its cookie
    /// says (see `tracer_common::site`).
    CountSite,
    /// Counts a new reference and the object's type (`--types`), with the
    /// object where the cookie says: `%rdi` at the function's entry.
    CountObject,
    /// `--native`: libc's `malloc` (size in the first argument).
    NativeSizeArg0,
    /// `--native`: `realloc`, `aligned_alloc`, `mmap` (the second).
    NativeSizeArg1,
    /// `--native`: `posix_memalign` (the third).
    NativeSizeArg2,
    /// `--native`: `calloc` (the first two multiplied).
    NativeCalloc,
    /// `--native`: `free` (calls only).
    NativeCall,
    /// `--native`: `munmap`, whose second argument is the length released.
    NativeReleaseArg1,
    /// `--native`: a call site inside one probed libc function of another,
    /// which marks the call as nested (see `plan::native`).
    NativeNested,
    /// Counts a call of the object domain's free and, with `--types`, the
    /// destruction of the object it frees, with the pointer where the
    /// cookie says: `%rdi` at the function's entry.
    FreeObject,
    /// Counts a free's call at the implementation its function pointer
    /// holds, apart where the thread was marked by [`Self::NativeNested`]
    /// on the way (see `plan::slots`).
    CountClaimed,
}

impl Program {
    /// Every program in the objects.
    pub const ALL: [Self; 27] = [
        Self::CountCall,
        Self::SizeArg0,
        Self::SizeArg1,
        Self::Calloc,
        Self::Empty,
        Self::MetaInsert,
        Self::MetaLookup,
        Self::MetaPool,
        Self::MetaChunk,
        Self::RetValue,
        Self::RetValueUret,
        Self::LiveAlloc,
        Self::LiveFree,
        Self::LiveImpl,
        Self::LiveRet,
        Self::LiveRetUret,
        Self::CountSite,
        Self::CountObject,
        Self::NativeSizeArg0,
        Self::NativeSizeArg1,
        Self::NativeSizeArg2,
        Self::NativeCalloc,
        Self::NativeCall,
        Self::NativeReleaseArg1,
        Self::NativeNested,
        Self::FreeObject,
        Self::CountClaimed,
    ];

    /// The function name in tracer-ebpf/src/programs.rs (or
    /// experiment.rs).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::CountCall => programs::COUNT_CALL,
            Self::SizeArg0 => programs::COUNT_SIZE_ARG0,
            Self::SizeArg1 => programs::COUNT_SIZE_ARG1,
            Self::Calloc => programs::COUNT_CALLOC,
            Self::Empty => programs::EMPTY,
            Self::MetaInsert => programs::META_INSERT,
            Self::MetaLookup => programs::META_LOOKUP,
            Self::MetaPool => programs::META_POOL,
            Self::MetaChunk => programs::META_CHUNK,
            Self::RetValue => programs::RET_VALUE,
            Self::RetValueUret => programs::RET_VALUE_URET,
            Self::LiveAlloc => programs::LIVE_ALLOC,
            Self::LiveFree => programs::LIVE_FREE,
            Self::LiveImpl => programs::LIVE_IMPL,
            Self::LiveRet => programs::LIVE_RET,
            Self::LiveRetUret => programs::LIVE_RET_URET,
            Self::CountSite => programs::COUNT_SITE,
            Self::CountObject => programs::COUNT_OBJECT,
            Self::NativeSizeArg0 => programs::NATIVE_SIZE_ARG0,
            Self::NativeSizeArg1 => programs::NATIVE_SIZE_ARG1,
            Self::NativeSizeArg2 => programs::NATIVE_SIZE_ARG2,
            Self::NativeCalloc => programs::NATIVE_CALLOC,
            Self::NativeCall => programs::NATIVE_CALL,
            Self::NativeReleaseArg1 => programs::NATIVE_RELEASE_ARG1,
            Self::NativeNested => programs::NATIVE_NESTED,
            Self::FreeObject => programs::FREE_OBJECT,
            Self::CountClaimed => programs::COUNT_CLAIMED,
        }
    }

    /// Whether the program reports bytes (the table shows "-" otherwise).
    #[must_use]
    pub const fn counts_bytes(self) -> bool {
        self.allocates() || matches!(self, Self::NativeReleaseArg1)
    }

    /// Whether the function allocates the bytes it is asked for (so they
    /// go in its domain's size histogram).
    #[must_use]
    pub const fn allocates(self) -> bool {
        matches!(
            self,
            Self::SizeArg0
                | Self::SizeArg1
                | Self::Calloc
                | Self::NativeSizeArg0
                | Self::NativeSizeArg1
                | Self::NativeSizeArg2
                | Self::NativeCalloc
        )
    }

    /// Whether the function returns the new pointer in rax (so `--returns`
    /// probes its return): every allocating function but `posix_memalign`,
    /// which returns an error number and writes the pointer through its
    /// first argument.
    #[must_use]
    pub const fn returns_pointer(self) -> bool {
        self.allocates() && !matches!(self, Self::NativeSizeArg2)
    }

    /// Whether it is a benchmarks' program, which counts nothing and
    /// replaces every program of a probe, its inlined copies' too.
    #[must_use]
    pub const fn is_bench(self) -> bool {
        matches!(self, Self::Empty | Self::MetaInsert | Self::MetaLookup | Self::MetaPool | Self::MetaChunk)
    }

    /// Whether it is in the bench object alone (`crate::BENCH_OBJECT`),
    /// not the product's: the allocator-metadata experiment's.
    #[must_use]
    pub const fn bench_only(self) -> bool {
        matches!(self, Self::MetaInsert | Self::MetaLookup | Self::MetaPool | Self::MetaChunk)
    }

    /// The object it is in, which a plan that attaches it loads.
    #[must_use]
    pub fn object(self) -> &'static [u8] {
        if self.bench_only() { crate::BENCH_OBJECT } else { crate::BPF_OBJECT }
    }

    /// Whether it is one of `--native`'s programs.
    #[must_use]
    pub const fn is_native(self) -> bool {
        matches!(
            self,
            Self::NativeSizeArg0
                | Self::NativeSizeArg1
                | Self::NativeSizeArg2
                | Self::NativeCalloc
                | Self::NativeCall
                | Self::NativeReleaseArg1
                | Self::NativeNested
        )
    }
}

/// What kind of probe a table row is. Only functions so far (GC markers
/// have their own plan, and libc's functions are functions too, in another
/// file: see `plan::native`); the exhaustive matches on this enum mark
/// where a new kind needs handling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeKind {
    /// A uprobe in the function's code, where `--placement` puts it (the
    /// entry, a later emulated instruction, or its call sites).
    Function,
}

/// One row of a version's probe table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeSpec {
    pub symbol: &'static str,
    pub program: Program,
    pub kind: ProbeKind,
    /// A required probe that is missing fails the attach; an optional one is
    /// reported as missing.
    pub required: bool,
    /// Whether `--probes default` includes it (otherwise only naming it
    /// does).
    pub in_default: bool,
}

impl ProbeSpec {
    /// A function probe.
    #[must_use]
    pub const fn function(symbol: &'static str, program: Program, required: bool, in_default: bool) -> Self {
        Self { symbol, program, kind: ProbeKind::Function, required, in_default }
    }

    /// Whether it is one of the reference probes (`--probes refs`).
    #[must_use]
    pub fn is_ref(&self) -> bool {
        matches!(self.symbol, "_Py_NewReference" | "_Py_Dealloc")
    }
}

/// Which probes to attach: `--probes`, a named set or function names.
#[derive(Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProbeSelection {
    /// Every default probe in the version's table.
    #[value(alias = "all")]
    Default,
    /// `_Py_NewReference` and `_Py_Dealloc`.
    Refs,
    /// The twelve allocator functions.
    Alloc,
    /// These symbols from the table, each required.
    #[value(skip)]
    Names(Vec<String>),
}

impl std::fmt::Display for ProbeSelection {
    /// As `--probes` takes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use clap::ValueEnum as _;
        match (self, self.to_possible_value()) {
            (Self::Names(names), _) => f.write_str(&names.join(",")),
            (_, Some(set)) => f.write_str(set.get_name()),
            (_, None) => Ok(()),
        }
    }
}

/// A `--probes` value that names no known probe set or symbol.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelectionError {
    #[error("--probes is empty; use default, refs, alloc or a comma-separated list of function names")]
    Empty,
    #[error("--probes names {name}, which tracer does not probe; choose from default, refs, alloc or: {known}")]
    Unknown { name: String, known: String },
    #[error("--probes names {name}, which Python {version} does not have; drop it from --probes")]
    NotInVersion { name: String, version: String },
}

impl crate::error::Classify for SelectionError {
    /// `--probes` (or `--stacks`) naming what cannot be probed.
    fn is_bad_input(&self) -> bool {
        true
    }
}

impl ProbeSelection {
    /// Parses a `--probes` value; `known` are the function names any
    /// supported version has.
    pub fn parse(value: &str, known: &[&str]) -> Result<Self, SelectionError> {
        let value = value.trim();
        // A named set, by clap's parser of the closed set.
        if let Ok(set) = <Self as clap::ValueEnum>::from_str(value, false) {
            return Ok(set);
        }
        let names: Vec<String> = value.split(',').map(str::trim).filter(|n| !n.is_empty()).map(str::to_owned).collect();
        if names.is_empty() {
            return Err(SelectionError::Empty);
        }
        for name in &names {
            if !known.contains(&name.as_str()) {
                return Err(SelectionError::Unknown { name: name.clone(), known: known.join(", ") });
            }
        }
        Ok(Self::Names(names))
    }

    /// The rows of `table` (Python `version`'s) this selection picks, in
    /// table order.
    pub fn select(&self, table: &[ProbeSpec], version: &str) -> Result<Vec<ProbeSpec>, SelectionError> {
        Ok(match self {
            Self::Default => table.iter().copied().filter(|p| p.in_default).collect(),
            Self::Refs => table.iter().copied().filter(|p| p.in_default && p.is_ref()).collect(),
            Self::Alloc => table.iter().copied().filter(|p| p.in_default && !p.is_ref()).collect(),
            Self::Names(names) => {
                if let Some(name) = names.iter().find(|n| !table.iter().any(|p| p.symbol == n.as_str())) {
                    return Err(SelectionError::NotInVersion { name: name.clone(), version: version.to_owned() });
                }
                table
                    .iter()
                    .filter(|p| names.iter().any(|n| n == p.symbol))
                    .map(|p| ProbeSpec { required: true, ..*p })
                    .collect()
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: [ProbeSpec; 4] = [
        ProbeSpec::function("_Py_NewReference", Program::CountCall, false, true),
        ProbeSpec::function("_Py_Dealloc", Program::CountCall, false, true),
        ProbeSpec::function("PyObject_Malloc", Program::SizeArg0, true, true),
        ProbeSpec::function("PyMem_Free", Program::CountCall, false, true),
    ];
    const KNOWN: [&str; 5] = ["_Py_NewReference", "_Py_Dealloc", "PyObject_Malloc", "PyMem_Free", "Extra"];

    #[test]
    fn selections() {
        let pick = |s: &str| ProbeSelection::parse(s, &KNOWN).unwrap().select(&TABLE, "3.11.7").unwrap();
        assert_eq!(pick("default").len(), 4);
        let refs = pick("refs");
        assert_eq!(refs.iter().map(|p| p.symbol).collect::<Vec<_>>(), ["_Py_NewReference", "_Py_Dealloc"]);
        assert_eq!(pick("alloc").len(), 2);
        let named = pick("PyMem_Free, _Py_NewReference");
        // Table order, and named probes are required.
        assert_eq!(named.iter().map(|p| p.symbol).collect::<Vec<_>>(), ["_Py_NewReference", "PyMem_Free"]);
        assert!(named.iter().all(|p| p.required));
        assert_eq!(ProbeSelection::parse(" , ", &KNOWN).unwrap_err(), SelectionError::Empty);
        let err = ProbeSelection::parse("malloc", &KNOWN).unwrap_err();
        assert!(err.to_string().starts_with("--probes names malloc, which tracer does not probe;"), "{err}");
        let err = ProbeSelection::parse("Extra", &KNOWN).unwrap().select(&TABLE, "3.11.7").unwrap_err();
        assert_eq!(err.to_string(), "--probes names Extra, which Python 3.11.7 does not have; drop it from --probes");
    }
}
