//! What tracer knows of each version's garbage collector: the SystemTap
//! markers a build with `--with-dtrace` has, and the function a build
//! without them collects in, where its entry and return say what the
//! markers would. Each version module holds its own [`GcKnowledge`], with
//! the CPython source it was checked against.

/// The markers and the collection function of one minor version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcKnowledge {
    /// The markers' provider (Include/pydtrace.d: `provider python`).
    pub provider: &'static str,
    /// `gc__start(int generation)`: a collection of that generation begins.
    pub start: &'static str,
    /// `gc__done(long collected)`: it ends, having found that many objects
    /// unreachable (collected and uncollectable).
    pub done: &'static str,
    /// For builds without the markers.
    pub function: Option<GcFunction>,
    /// Where the interpreter keeps its collector's statistics, which the
    /// production profile reads instead of probing.
    pub state: GcStateLayout,
}

/// Where an interpreter's collector statistics are: what `gc.get_stats()`
/// returns, read from outside (the production profile's GC source).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcStateLayout {
    /// `offsetof(PyInterpreterState, gc)`: the `struct _gc_runtime_state`
    /// embedded in the interpreter. From 3.13 `_Py_DebugOffsets` publishes
    /// it too (`interpreter_state.gc`), and the two are checked against
    /// each other in the process.
    pub interp_gc: u64,
    /// `offsetof(struct _gc_runtime_state, generation_stats)`: an array of
    /// [`GENERATIONS`] `struct gc_generation_stats`, each
    /// [`STATS_FIELDS`] `Py_ssize_t`.
    pub generation_stats: u64,
    /// Releases of the minor version (micro below `.0`) whose statistics'
    /// indices are not generations 0, 1 and 2, and what they are instead
    /// (`.1`).
    pub caveat: Option<(u8, &'static str)>,
}

impl GcStateLayout {
    /// What the statistics' indices are in release `micro`, where they are
    /// not the generations.
    #[must_use]
    pub fn caveat(&self, micro: u8) -> Option<&'static str> {
        self.caveat.filter(|(below, _)| micro < *below).map(|(_, what)| what)
    }
}

/// The collector's generations (`NUM_GENERATIONS`, `Include/internal/pycore_gc.h`
/// v3.11 to v3.13, `pycore_interp_structs.h` v3.14).
pub const GENERATIONS: usize = 3;

/// `struct gc_generation_stats { Py_ssize_t collections; Py_ssize_t
/// collected; Py_ssize_t uncollectable; }` (the same files), 24 bytes:
/// the fields in that order.
pub const STATS_FIELDS: usize = 3;

/// A collection function whose entry and return give what the markers
/// would: the generation in an argument, the objects found unreachable as
/// its return value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcFunction {
    /// Its symbol (a static function: in `.symtab`, which a stripped image
    /// lacks).
    pub symbol: &'static str,
    /// The DWARF x86-64 number of the register that holds the generation at
    /// its entry (an `int`), by the System V calling convention.
    pub generation_register: u16,
    /// Where a call is not always one collection of the generation its
    /// argument names, why: such calls are counted as the markers would
    /// not count them, and the report says so.
    pub caveat: Option<&'static str>,
}

/// The markers, the same from 3.11 to 3.14 (Include/pydtrace.d at v3.11.2
/// and v3.13.15, Debian's sources; the notes of Debian's 3.11.2, 3.13.15
/// and 3.14.8 name them so).
#[must_use]
pub const fn markers(function: Option<GcFunction>, state: GcStateLayout) -> GcKnowledge {
    GcKnowledge { provider: "python", start: "gc__start", done: "gc__done", function, state }
}

/// The second argument (`int generation`), in `%esi`: DWARF register 4.
pub const SECOND_ARGUMENT: u16 = 4;

/// The return value register, rax: DWARF register 0.
pub const RETURN_REGISTER: u16 = 0;
