//! The one table of what tracer probes and with which BPF program.

/// A BPF program in the embedded object; each serves every function whose
/// arguments have its shape, told apart by the attach cookie.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Program {
    /// Counts calls only.
    CountCall,
    /// Counts calls and the size in the first argument.
    SizeArg0,
    /// Counts calls and the size in the second argument (realloc).
    SizeArg1,
    /// Counts calls and nelem × elsize from the first two arguments.
    Calloc,
}

impl Program {
    /// Every program, for loading.
    pub const ALL: [Self; 4] = [Self::CountCall, Self::SizeArg0, Self::SizeArg1, Self::Calloc];

    /// The function name in tracer-ebpf/src/main.rs.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::CountCall => "count_call",
            Self::SizeArg0 => "count_size_arg0",
            Self::SizeArg1 => "count_size_arg1",
            Self::Calloc => "count_calloc",
        }
    }

    /// Whether the program reports bytes (the table shows "-" otherwise).
    #[must_use]
    pub const fn counts_bytes(self) -> bool {
        !matches!(self, Self::CountCall)
    }
}

/// Where in the function the probe sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeKind {
    /// A uprobe on the function's first instruction.
    Entry,
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
    ProbeSpec { symbol, program, kind: ProbeKind::Entry, required }
}

/// The reference and allocator functions, in report order. Only
/// `PyObject_Malloc` is required: every `CPython` has it, so its absence means
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

#[cfg(test)]
mod tests {
    use super::*;

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
