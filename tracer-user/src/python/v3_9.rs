//! CPython 3.9.
//!
//! Checked on this project's machines against pyenv's 3.9.18 (shared
//! libpython, its own DWARF). Every probed function is in Objects/object.c
//! and Objects/obmalloc.c at v3.9.18, with the signatures of 3.11: pyenv's
//! libpython3.9.so.1.0 exports all fourteen of [`COMMON`] (`.dynsym`,
//! `readelf -s`). There is neither `Py_Version` (the version is read from
//! `Py_GetVersion`'s `PY_VERSION`, see [`crate::discover::version`]) nor
//! `_Py_DebugOffsets`.
//!
//! Header citations are to the headers pyenv installed for 3.9.18
//! (`include/python3.9`, internal ones included), which are those of the
//! v3.9.18 tag; every offset was compared with the build's DWARF (gdb's
//! `offsetof`, and the unit test `frames::dwarf`).

use super::{COMMON, DebugOffsetsHeader, Guard};
use crate::probe::ProbeSpec;

/// The 3.9 ABI.
#[derive(Debug)]
pub struct Abi39;

/// Where 3.9 keeps a thread's frames. The current thread is found as in
/// 3.11 ([`super::frames::CurrentThread::GilstateCurrent`]); a thread state
/// has no `native_thread_id` yet, so the BPF side checks its `thread_id`
/// (the thread's `pthread_t`) against the event thread's instead.
pub(super) const FRAMES: super::frames::FrameOffsets = super::frames::FrameOffsets {
    // Include/internal/pycore_runtime.h at v3.9.18: `typedef struct
    // pyruntimestate { int preinitializing, preinitialized,
    // core_initialized, initialized; _Py_atomic_address _finalizing (16);
    // struct pyinterpreters { PyThread_type_lock mutex; PyInterpreterState
    // *head (32); *main; int64_t next_id; } interpreters; struct
    // _xidregistry { mutex; head; } xidregistry; unsigned long main_thread
    // (72); ...`.
    runtime: super::frames::RuntimeOffsets { interpreters_head: 32, main_thread: 72 },
    // Include/internal/pycore_interp.h at v3.9.18: `struct _is { struct
    // _is *next (0); struct _ts *tstate_head (8); ...`.
    interpreter: super::frames::InterpreterOffsets { next: 0, threads_head: 8 },
    // Include/cpython/pystate.h at v3.9.18: `struct _ts { prev (0); next
    // (8); interp (16); PyFrameObject *frame (24); ... unsigned long
    // thread_id (176); ...}`, no `native_thread_id`.
    thread: super::frames::ThreadOffsets {
        prev: 0,
        next: 8,
        interp: 16,
        frame: super::frames::FrameLink::FrameObject { frame: 24 },
        thread_id: 176,
        native_thread_id: None,
    },
    // Include/cpython/frameobject.h at v3.9.18: `struct _frame {
    // PyObject_VAR_HEAD; struct _frame *f_back (24); PyCodeObject *f_code
    // (32); f_builtins, f_globals, f_locals, f_valuestack, f_stacktop,
    // f_trace; char f_trace_lines, f_trace_opcodes; PyObject *f_gen (96);
    // int f_lasti (104); int f_lineno; ...}`. `f_lasti` is a byte offset
    // into `co_code` (Objects/frameobject.c at v3.9.18: `PyFrame_GetLineNumber`
    // passes it to `PyCode_Addr2Line` as it is).
    frame: super::frames::InterpreterFrameOffsets {
        code: 32,
        code_ref: super::frames::CodeRef::Pointer,
        previous: 24,
        instr: 104,
        instr_kind: super::frames::InstrKind::LastI { unit: 1 },
        owner: None,
        // No owners: every frame is a Python function's.
        first_non_python_owner: u8::MAX,
    },
    // Include/cpython/code.h at v3.9.18: `struct PyCodeObject {
    // PyObject_HEAD; int co_argcount, co_posonlyargcount,
    // co_kwonlyargcount, co_nlocals, co_stacksize, co_flags, co_firstlineno
    // (40); PyObject *co_code (48), *co_consts, *co_names, *co_varnames,
    // *co_freevars, *co_cellvars; Py_ssize_t *co_cell2arg; PyObject
    // *co_filename (104), *co_name (112), *co_lnotab (120); ...}`: no
    // `co_qualname`, the instructions in the separate `co_code` bytes.
    code: super::frames::CodeOffsets {
        filename: 104,
        name: 112,
        qualname: None,
        linetable: 120,
        lines: super::frames::LineTableFormat::Lnotab,
        firstlineno: 40,
        code_adaptive: None,
        first_traceable: None,
    },
    // Include/cpython/unicodeobject.h at v3.9.18: `PyASCIIObject {
    // PyObject_HEAD; Py_ssize_t length (16); Py_hash_t hash; struct {
    // interned:2; kind:3; compact:1; ascii:1; ready:1; } state (32);
    // wchar_t *wstr; }` is 48 bytes, and `PyCompactUnicodeObject` adds
    // utf8_length, utf8 and wstr_length: 72.
    unicode: super::frames::UnicodeOffsets { length: 16, state: 32, ascii_data: 48, compact_data: 72 },
    // Include/cpython/bytesobject.h at v3.9.18: PyObject_VAR_HEAD (ob_size
    // at 16), Py_hash_t ob_shash, char ob_sval[] (32).
    bytes: super::frames::BytesOffsets { size: 16, data: 32 },
    // Include/object.h at v3.9.18: `struct _object { Py_ssize_t
    // ob_refcnt; PyTypeObject *ob_type; }`.
    ob_type: 8,
    // Include/internal/pycore_runtime.h at v3.9.18: `struct
    // _ceval_runtime_state { _Py_atomic_int signals_pending; struct
    // _gil_runtime_state gil; } ceval` at 344 in `_PyRuntime`, so the GIL
    // is at 352; Include/internal/pycore_gil.h: `{ unsigned long interval;
    // _Py_atomic_address last_holder (+8); _Py_atomic_int locked (+16);
    // ...}`.
    gil: super::frames::GilHolder::Runtime { last_holder: 360, locked: 368 },
    // Include/internal/pycore_runtime.h at v3.9.18: `struct
    // _gilstate_runtime_state { int check_enabled; _Py_atomic_address
    // tstate_current; ...} gilstate` at 560 in `_PyRuntime`, so
    // `tstate_current` is at 568.
    current_thread: super::frames::CurrentThread::GilstateCurrent { tstate_current: 568 },
};

impl super::Abi for Abi39 {
    fn frames(&self) -> super::frames::FrameOffsets {
        FRAMES
    }

    fn ht_qualname(&self) -> u64 {
        // Include/cpython/object.h at v3.9.18: `ht_qualname` follows the
        // type object, its method tables, `ht_name` and `ht_slots` (gdb's
        // offsetof on pyenv's 3.9.18).
        856
    }

    fn heap(&self) -> super::heap::HeapLayout {
        super::heap::before_3_11(GC_STATE.interp_gc, super::heap::Geometry::SMALL)
    }

    fn minor(&self) -> u8 {
        9
    }

    fn probes(&self) -> &'static [ProbeSpec] {
        &COMMON
    }

    fn debug_offsets(&self) -> Option<DebugOffsetsHeader> {
        None
    }

    fn guard(&self, symbol: &str) -> Option<Guard> {
        match symbol {
            // Objects/object.c at v3.9.18: `_Py_NewReference` first tests
            // `_Py_tracemalloc_config.tracing`, at 4 in `struct
            // _PyTraceMalloc_Config { initialized (an enum); int tracing;
            // int max_nframe; }` (Include/internal/pycore_pymem.h); pyenv's
            // build reads `0x4(%rax)` there.
            "_Py_NewReference" => Some(Guard::TracemallocFlag { within: "_Py_tracemalloc_config", offset: Some(4) }),
            // No switch guards `_Py_Dealloc` (Objects/object.c).
            _ => super::allocator_guard(symbol),
        }
    }
}

/// `collect`, for builds without the markers (pyenv's has none):
/// Modules/gcmodule.c at v3.9.18 (line 1172, as the DWARF of pyenv's
/// build has it), `static Py_ssize_t collect(PyThreadState *tstate, int
/// generation, Py_ssize_t *n_collected, Py_ssize_t *n_uncollectable, int
/// nofail)`: 3.10 renamed it `gc_collect_main`, unchanged, and its callers
/// (`collect_with_callback`, `_PyGC_CollectNoFail`) are 3.10's, each call
/// one collection.
pub(super) const GC: super::gc::GcKnowledge = super::gc::markers(
    Some(super::gc::GcFunction { symbol: "collect", generation_register: super::gc::SECOND_ARGUMENT, caveat: None }),
    GC_STATE,
);

/// The collector's statistics: `Include/internal/pycore_interp.h` at v3.9.18
/// puts `struct _gc_runtime_state gc` at 616 in `struct _is`;
/// `Include/internal/pycore_gc.h` lays it out as 3.11 does (`generation0`
/// at 96, `permanent_generation` at 104, `generation_stats[3]` at 128,
/// `collecting` at 200: gdb's `ptype /o` on pyenv's 3.9.18).
pub(super) const GC_STATE: super::gc::GcStateLayout =
    super::gc::GcStateLayout { interp_gc: 616, generation_stats: 128, caveat: None };
