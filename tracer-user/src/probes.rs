//! The one table of what tracer probes and with which BPF program.

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
    /// Records rax where it holds the result (a `ret` instruction).
    RetValue,
    /// Records the return value through a uretprobe.
    RetValueUret,
}

impl Program {
    /// Every program, for loading.
    pub const ALL: [Self; 7] = [
        Self::CountCall,
        Self::SizeArg0,
        Self::SizeArg1,
        Self::Calloc,
        Self::Empty,
        Self::RetValue,
        Self::RetValueUret,
    ];

    /// The function name in tracer-ebpf/src/main.rs.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::CountCall => "count_call",
            Self::SizeArg0 => "count_size_arg0",
            Self::SizeArg1 => "count_size_arg1",
            Self::Calloc => "count_calloc",
            Self::Empty => "empty",
            Self::RetValue => "ret_value",
            Self::RetValueUret => "ret_value_uret",
        }
    }

    /// Whether the program reports bytes (the table shows "-" otherwise).
    #[must_use]
    pub const fn counts_bytes(self) -> bool {
        self.allocates()
    }

    /// Whether the function returns a new pointer (so `--returns` probes
    /// its return).
    #[must_use]
    pub const fn allocates(self) -> bool {
        matches!(self, Self::SizeArg0 | Self::SizeArg1 | Self::Calloc)
    }
}

/// What kind of probe a table row is. Only functions so far; USDT markers
/// (GC) and libc's allocator are planned as further kinds, and the
/// exhaustive matches on this enum mark where each needs handling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeKind {
    /// A uprobe in the function's code, where `--placement` puts it (the
    /// entry, a later emulated instruction, or its call sites).
    Function,
}

/// One row of the probe table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeSpec {
    pub symbol: &'static str,
    pub program: Program,
    pub kind: ProbeKind,
    /// A required probe that is missing fails the attach; an optional one is
    /// reported as missing.
    pub required: bool,
}

const fn spec(symbol: &'static str, program: Program, required: bool) -> ProbeSpec {
    ProbeSpec { symbol, program, kind: ProbeKind::Function, required }
}

/// The reference and allocator functions, in report order. Only
/// `PyObject_Malloc` is required: every CPython has it, so its absence means
/// the image is not what it seems. The rest may be inlined away (LTO builds)
/// and are reported as missing.
pub const DEFAULT_PROBES: &[ProbeSpec] = &[
    spec("_Py_NewReference", Program::CountCall, false),
    spec("_Py_Dealloc", Program::CountCall, false),
    spec("PyObject_Malloc", Program::SizeArg0, true),
    spec("PyObject_Calloc", Program::Calloc, false),
    spec("PyObject_Realloc", Program::SizeArg1, false),
    spec("PyObject_Free", Program::CountCall, false),
    spec("PyMem_Malloc", Program::SizeArg0, false),
    spec("PyMem_Calloc", Program::Calloc, false),
    spec("PyMem_Realloc", Program::SizeArg1, false),
    spec("PyMem_Free", Program::CountCall, false),
    spec("PyMem_RawMalloc", Program::SizeArg0, false),
    spec("PyMem_RawCalloc", Program::Calloc, false),
    spec("PyMem_RawRealloc", Program::SizeArg1, false),
    spec("PyMem_RawFree", Program::CountCall, false),
];

/// Which probes to attach: `--probes`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeSelection {
    /// Every probe in the version's table.
    Default,
    /// `_Py_NewReference` and `_Py_Dealloc`.
    Refs,
    /// The twelve allocator functions.
    Alloc,
    /// These symbols from the table, each required.
    Names(Vec<String>),
}

/// A `--probes` value that names no known probe set or symbol.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelectionError {
    #[error("--probes is empty; use default, refs, alloc or a comma-separated list of function names")]
    Empty,
    #[error("--probes names {name}, which tracer does not probe; choose from default, refs, alloc or: {known}")]
    Unknown { name: String, known: String },
}

impl ProbeSelection {
    /// Parses a `--probes` value.
    pub fn parse(value: &str) -> Result<Self, SelectionError> {
        match value.trim() {
            "" => Err(SelectionError::Empty),
            "default" | "all" => Ok(Self::Default),
            "refs" => Ok(Self::Refs),
            "alloc" => Ok(Self::Alloc),
            list => {
                let names: Vec<String> =
                    list.split(',').map(str::trim).filter(|n| !n.is_empty()).map(str::to_owned).collect();
                if names.is_empty() {
                    return Err(SelectionError::Empty);
                }
                for name in &names {
                    if !DEFAULT_PROBES.iter().any(|p| p.symbol == name) {
                        let known = DEFAULT_PROBES.iter().map(|p| p.symbol).collect::<Vec<_>>().join(", ");
                        return Err(SelectionError::Unknown { name: name.clone(), known });
                    }
                }
                Ok(Self::Names(names))
            }
        }
    }

    /// The rows of `table` this selection picks, in table order.
    #[must_use]
    pub fn select(&self, table: &[ProbeSpec]) -> Vec<ProbeSpec> {
        let is_ref = |p: &ProbeSpec| matches!(p.symbol, "_Py_NewReference" | "_Py_Dealloc");
        match self {
            Self::Default => table.to_vec(),
            Self::Refs => table.iter().copied().filter(is_ref).collect(),
            Self::Alloc => table.iter().copied().filter(|p| !is_ref(p)).collect(),
            Self::Names(names) => table
                .iter()
                .filter(|p| names.iter().any(|n| n == p.symbol))
                .map(|p| ProbeSpec { required: true, ..*p })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selections() {
        assert_eq!(ProbeSelection::parse("default").unwrap().select(DEFAULT_PROBES).len(), 14);
        let refs = ProbeSelection::parse("refs").unwrap().select(DEFAULT_PROBES);
        assert_eq!(refs.iter().map(|p| p.symbol).collect::<Vec<_>>(), ["_Py_NewReference", "_Py_Dealloc"]);
        assert_eq!(ProbeSelection::parse("alloc").unwrap().select(DEFAULT_PROBES).len(), 12);
        let named = ProbeSelection::parse("PyMem_Free, _Py_NewReference").unwrap().select(DEFAULT_PROBES);
        // Table order, and named probes are required.
        assert_eq!(named.iter().map(|p| p.symbol).collect::<Vec<_>>(), ["_Py_NewReference", "PyMem_Free"]);
        assert!(named.iter().all(|p| p.required));
        assert_eq!(ProbeSelection::parse(" , ").unwrap_err(), SelectionError::Empty);
        let err = ProbeSelection::parse("malloc").unwrap_err();
        assert!(err.to_string().starts_with("--probes names malloc, which tracer does not probe;"), "{err}");
    }

    #[test]
    fn table_is_unique_and_shapes_match_names() {
        let mut names: Vec<_> = DEFAULT_PROBES.iter().map(|p| p.symbol).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), DEFAULT_PROBES.len());
        for p in DEFAULT_PROBES {
            let expected = if p.symbol.ends_with("Calloc") {
                Program::Calloc
            } else if p.symbol.ends_with("Realloc") {
                Program::SizeArg1
            } else if p.symbol.ends_with("Malloc") {
                Program::SizeArg0
            } else {
                Program::CountCall
            };
            assert_eq!(p.program, expected, "{}", p.symbol);
        }
    }
}
