//! CPython 3.12.
//!
//! Checked on this project's machines against pyenv's 3.12.1. 3.12 adds
//! `_Py_NewReferenceNoTotal` (Objects/object.c at v3.12.0): the same as
//! `_Py_NewReference` without the `Py_REF_DEBUG` total, called by the
//! free-list paths (floats, tuples, frames). It is probed only when named
//! (`--probes _Py_NewReferenceNoTotal`), so that the default table stays the
//! same on every version.

use super::{DebugOffsetsHeader, Guard, spec, with};
use crate::probe::{ProbeSpec, Program};

/// 3.12's probes: the common ones, then `_Py_NewReferenceNoTotal`.
pub(super) static PROBES: [ProbeSpec; 15] =
    with([ProbeSpec { in_default: false, ..spec("_Py_NewReferenceNoTotal", Program::CountCall, false) }]);

/// The 3.12 ABI.
#[derive(Debug)]
pub struct Abi312;

/// Where 3.12 keeps a thread's frames; each offset was checked against the
/// DWARF of pyenv's 3.12.1 (gdb's `offsetof`).
///
/// The current thread (see [`super::frames::CurrentThread`]): 3.12 moved
/// it into the thread-local `_Py_tss_tstate` (Python/pystate.c at v3.12.1;
/// `_PyRuntime.gilstate.tstate_current` is gone), which BPF reads at the
/// thread's fsbase as [`crate::stacks::tls`] finds it. Userspace walks
/// `interpreters.head->threads.head`, and reads the GIL holder from the
/// interpreter's own GIL.
const FRAMES: super::frames::FrameOffsets = super::frames::FrameOffsets {
    // Include/internal/pycore_runtime.h at v3.12.1: `typedef struct
    // pyruntimestate { five ints; _Py_atomic_address _finalizing (24);
    // struct pyinterpreters { mutex; PyInterpreterState *head (40); *main;
    // int64_t next_id; } interpreters; unsigned long main_thread (64);`,
    // declared "as early as possible to facilitate out-of-process
    // observability tools".
    runtime: super::frames::RuntimeOffsets { interpreters_head: 40, main_thread: 64 },
    // Include/internal/pycore_interp.h at v3.12.1: `struct _is { next (0);
    // int64_t id, id_refcount; int requires_idref; id_mutex; int
    // _initialized, finalizing; uint64_t monitoring_version,
    // last_restart_version; struct pythreads { uint64_t next_unique_id;
    // PyThreadState *head (72); ...} threads;`.
    interpreter: super::frames::InterpreterOffsets { next: 0, threads_head: 72 },
    // Include/cpython/pystate.h at v3.12.1: `struct _ts { prev (0); next
    // (8); interp (16); struct {...} _status; int py_recursion_remaining,
    // py_recursion_limit, c_recursion_remaining, recursion_headroom, tracing,
    // what_event; _PyCFrame *cframe (56); ...; unsigned long thread_id (136);
    // unsigned long native_thread_id (144); ...}` and `typedef struct
    // _PyCFrame { struct _PyInterpreterFrame *current_frame (0); struct
    // _PyCFrame *previous; }`.
    thread: super::frames::ThreadOffsets {
        prev: 0,
        next: 8,
        interp: 16,
        frame: super::frames::FrameLink::ViaCFrame { cframe: 56, current_frame: 0 },
        thread_id: 136,
        native_thread_id: Some(144),
    },
    // Include/internal/pycore_frame.h at v3.12.1: `typedef struct
    // _PyInterpreterFrame { PyCodeObject *f_code (0); struct
    // _PyInterpreterFrame *previous (8); f_funcobj; f_globals; f_builtins;
    // f_locals; frame_obj; _Py_CODEUNIT *prev_instr (56); int stacktop;
    // uint16_t return_offset; char owner (70); ...}`; `enum _frameowner`:
    // FRAME_OWNED_BY_CSTACK = 3, the entry frame `_PyEval_EvalFrameDefault`
    // pushes (Python/ceval.c).
    frame: super::frames::InterpreterFrameOffsets {
        code: 0,
        code_ref: super::frames::CodeRef::Pointer,
        previous: 8,
        instr: 56,
        instr_kind: super::frames::InstrKind::Pointer,
        owner: Some(70),
        first_non_python_owner: 3,
    },
    // Include/cpython/code.h at v3.12.1, `_PyCode_DEF`: after
    // PyObject_VAR_HEAD, co_consts, co_names, co_exceptiontable, int
    // co_flags, co_argcount, co_posonlyargcount, co_kwonlyargcount,
    // co_stacksize, co_firstlineno (68), co_nlocalsplus, co_framesize,
    // co_nlocals, co_ncellvars, co_nfreevars, uint32_t co_version,
    // co_localsplusnames (96), co_localspluskinds, co_filename (112), co_name
    // (120), co_qualname (128), co_linetable (136), co_weakreflist,
    // _co_cached, uint64_t _co_instrumentation_version, _co_monitoring, int
    // _co_firsttraceable (176), void *co_extra, char co_code_adaptive[]
    // (192).
    code: super::frames::CodeOffsets {
        filename: 112,
        name: 120,
        qualname: Some(128),
        linetable: 136,
        lines: super::frames::LineTableFormat::Locations,
        firstlineno: 68,
        code_adaptive: Some(192),
        first_traceable: Some(176),
    },
    // Include/cpython/unicodeobject.h at v3.12.1: `PyASCIIObject {
    // PyObject_HEAD; Py_ssize_t length (16); Py_hash_t hash; struct {...}
    // state (32); }` is 40 bytes (`wstr` is gone), PyCompactUnicodeObject
    // adds utf8_length and utf8: 56.
    unicode: super::frames::UnicodeOffsets { length: 16, state: 32, ascii_data: 40, compact_data: 56 },
    // Include/cpython/bytesobject.h at v3.12.1: ob_size at 16, ob_sval at
    // 32 (after Py_hash_t ob_shash).
    bytes: super::frames::BytesOffsets { size: 16, data: 32 },
    // Include/object.h at v3.12.1: `ob_refcnt` (in a union), `ob_type` (8).
    ob_type: 8,
    // Include/internal/pycore_interp.h at v3.12.1: `struct
    // _gil_runtime_state _gil` at 1040 in `struct _is`;
    // Include/internal/pycore_gil.h: `{ unsigned long interval;
    // _Py_atomic_address last_holder (+8); _Py_atomic_int locked (+16);
    // ...}`.
    gil: super::frames::GilHolder::Interpreter { last_holder: 1048, locked: 1056 },
    current_thread: super::frames::CurrentThread::ThreadLocal,
};

impl super::Abi for Abi312 {
    fn frames(&self) -> super::frames::FrameOffsets {
        FRAMES
    }

    fn ht_qualname(&self) -> u64 {
        // Include/cpython/object.h at v3.12.1: after `tp_watched`, which 3.12
        // added to PyTypeObject: `ht_qualname` follows the type object, its five
        // method tables, `ht_name` and `ht_slots` (checked by compiling
        // `offsetof` against these headers).
        872
    }

    fn heap(&self) -> super::heap::HeapLayout {
        use super::heap::{HeapLayout, LongSize, Obmalloc, Refcount, tpflags};
        HeapLayout {
            // Include/internal/pycore_interp.h at v3.12.1: `struct
            // _gc_runtime_state gc` at 112 in `struct _is`, laid out as in
            // 3.11 (Include/internal/pycore_gc.h); `struct _obmalloc_state
            // obmalloc` at 3960 (DWARF of pyenv's 3.12.1).
            interp_gc: 112,
            generation0: 96,
            permanent: 104,
            collecting: 200,
            // Include/cpython/tupleobject.h: `PyObject_VAR_HEAD; PyObject
            // *ob_item[1];`.
            tuple_items: 24,
            obmalloc: Obmalloc::Embedded { offset: 3960 },
            refcount: Refcount::Plain,
            // Include/internal/pycore_object.h at v3.12.1,
            // `_PyType_PreHeaderSize`: two words for `Py_TPFLAGS_PREHEADER`
            // (`MANAGED_WEAKREF | MANAGED_DICT`).
            preheader_flags: tpflags::MANAGED_DICT | tpflags::MANAGED_WEAKREF,
            long: LongSize::Tag,
            dict_keys: super::heap::DictKeys::Log2,
            geometry: super::heap::Geometry::LARGE,
        }
    }

    fn minor(&self) -> u8 {
        12
    }

    fn probes(&self) -> &'static [ProbeSpec] {
        &PROBES
    }

    fn debug_offsets(&self) -> Option<DebugOffsetsHeader> {
        None
    }

    fn guard(&self, symbol: &str) -> Option<Guard> {
        match symbol {
            // Objects/object.c at v3.12.0: `new_reference`, which both
            // `_Py_NewReference` and `_Py_NewReferenceNoTotal` inline, tests
            // `_PyRuntime.tracemalloc.config.tracing` first; its offset in
            // `_PyRuntime` is not tabled here, so the code's address is
            // only checked to lie inside `_PyRuntime`.
            "_Py_NewReference" => Some(Guard::TracemallocFlag { within: "_PyRuntime", offset: None }),
            // The same copies as `_Py_NewReference`'s: without debug info
            // they cannot be told apart, and are counted there.
            "_Py_NewReferenceNoTotal" => None,
            _ => super::allocator_guard(symbol),
        }
    }
}

/// The GC markers, and `gc_collect_main` for builds without them: as in
/// 3.11, Modules/gcmodule.c still has `static Py_ssize_t
/// gc_collect_main(PyThreadState *tstate, int generation, Py_ssize_t
/// *n_collected, Py_ssize_t *n_uncollectable, int nofail)` returning `n +
/// m`, the markers' count (checked in the DWARF of pyenv's 3.12.1, which
/// declares it at Modules/gcmodule.c:1194 with those parameters; no 3.12
/// source is in any Debian suite, so its body was checked by what the
/// integration tests count on that build).
pub(super) const GC: super::gc::GcKnowledge = super::gc::GcKnowledge { state: GC_STATE, ..super::v3_11::GC };

/// The collector's statistics: `Include/internal/pycore_interp.h` at v3.12.1
/// puts `struct _gc_runtime_state gc` at 112 in `struct _is`, laid out as
/// in 3.11 (`Include/internal/pycore_gc.h` at v3.12.1, l.157):
/// `generation_stats` at 128. Checked against the DWARF of pyenv's 3.12.1,
/// and live against `gc.get_stats()`.
pub(super) const GC_STATE: super::gc::GcStateLayout =
    super::gc::GcStateLayout { interp_gc: 112, generation_stats: 128, caveat: None };
