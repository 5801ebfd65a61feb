//! CPython 3.13.
//!
//! Checked on this project's machines against pyenv's 3.13.0. The probed
//! functions are those of 3.12 (Objects/object.c, Objects/obmalloc.c at
//! v3.13.0). 3.13 is the first version to publish `_Py_DebugOffsets` at the
//! start of `_PyRuntime` (`Include/internal/pycore_runtime.h` at v3.13.0):
//! `char cookie[8]` ("xdebugpy", `_Py_Debug_Cookie`) then `uint64_t version`.

use super::{DebugOffsetsHeader, Guard};
use crate::probe::ProbeSpec;

/// The 3.13 ABI.
#[derive(Debug)]
pub struct Abi313;

/// Where 3.13 keeps a thread's frames; each offset was checked against the
/// DWARF of pyenv's 3.13.0 and the forky root's 3.13.15 (gdb's
/// `offsetof`; `sizeof(PyThreadState)` and `sizeof(_PyRuntimeState)` differ
/// between the two, no offset here does). In a process, the ones
/// `_Py_DebugOffsets` publishes are also checked against what it says.
///
/// The current thread (see [`super::frames::CurrentThread`]): the
/// thread-local `_Py_tss_tstate` (Python/pystate.c at v3.13.0), as in 3.12.
/// Userspace walks `interpreters.head->threads.head` and reads the GIL
/// holder from the interpreter's own GIL.
const FRAMES: super::frames::FrameOffsets = super::frames::FrameOffsets {
    // Include/internal/pycore_runtime.h at v3.13.0: `typedef struct
    // pyruntimestate { _Py_DebugOffsets debug_offsets (0, 584 bytes); five
    // ints; PyThreadState *_finalizing; unsigned long _finalizing_id; struct
    // pyinterpreters { PyMutex mutex; PyInterpreterState *head (632); *main;
    // int64_t next_id; } interpreters; unsigned long main_thread (656);`.
    runtime: super::frames::RuntimeOffsets { interpreters_head: 632, main_thread: 656 },
    // Include/internal/pycore_interp.h at v3.13.0: `struct _is { struct
    // _ceval_state ceval; PyInterpreterState *next (7264); ...; struct
    // pythreads { uint64_t next_unique_id; PyThreadState *head (7344); *main;
    // ...} threads;`.
    interpreter: super::frames::InterpreterOffsets { next: 7264, threads_head: 7344 },
    // Include/cpython/pystate.h at v3.13.0: `struct _ts { prev (0); next
    // (8); interp (16); uintptr_t eval_breaker; struct {...} _status; int
    // _whence, state, py_recursion_remaining, py_recursion_limit,
    // c_recursion_remaining, recursion_headroom, tracing, what_event; struct
    // _PyInterpreterFrame *current_frame (72); ...; unsigned long thread_id
    // (152); unsigned long native_thread_id (160); ...}`.
    thread: super::frames::ThreadOffsets {
        prev: 0,
        next: 8,
        interp: 16,
        frame: super::frames::FrameLink::Direct { current_frame: 72 },
        thread_id: 152,
        native_thread_id: Some(160),
    },
    // Include/internal/pycore_frame.h at v3.13.0: `typedef struct
    // _PyInterpreterFrame { PyObject *f_executable (0, a code object or
    // None); struct _PyInterpreterFrame *previous (8); f_funcobj; f_globals;
    // f_builtins; f_locals; frame_obj; _Py_CODEUNIT *instr_ptr (56); int
    // stacktop; uint16_t return_offset; char owner (70); ...}`; `enum
    // _frameowner`: FRAME_OWNED_BY_CSTACK = 3.
    frame: super::frames::InterpreterFrameOffsets {
        code: 0,
        code_ref: super::frames::CodeRef::Pointer,
        previous: 8,
        instr: 56,
        instr_kind: super::frames::InstrKind::Pointer,
        owner: Some(70),
        first_non_python_owner: 3,
    },
    // Include/cpython/code.h at v3.13.0, `_PyCode_DEF`: as 3.12's up to
    // co_weakreflist, then _PyExecutorArray *co_executors, _co_cached,
    // uintptr_t _co_instrumentation_version, _co_monitoring, int
    // _co_firsttraceable (184), void *co_extra, char co_code_adaptive[]
    // (200); co_firstlineno (68), co_filename (112), co_name (120),
    // co_qualname (128), co_linetable (136).
    code: super::frames::CodeOffsets {
        filename: 112,
        name: 120,
        qualname: Some(128),
        linetable: 136,
        lines: super::frames::LineTableFormat::Locations,
        firstlineno: 68,
        code_adaptive: Some(200),
        first_traceable: Some(184),
    },
    // Include/cpython/unicodeobject.h at v3.13.0: as 3.12 (40 and 56).
    unicode: super::frames::UnicodeOffsets { length: 16, state: 32, ascii_data: 40, compact_data: 56 },
    // Include/cpython/bytesobject.h at v3.13.0: ob_size at 16, ob_sval at 32.
    bytes: super::frames::BytesOffsets { size: 16, data: 32 },
    // Include/object.h at v3.13.0: `ob_type` after the 8-byte refcount union.
    ob_type: 8,
    // Include/internal/pycore_interp.h at v3.13.0: `struct
    // _gil_runtime_state _gil` at 7752 in `struct _is`;
    // Include/internal/pycore_gil.h: `{ unsigned long interval;
    // PyThreadState *last_holder (+8); int locked (+16); ...}`.
    gil: super::frames::GilHolder::Interpreter { last_holder: 7760, locked: 7768 },
    current_thread: super::frames::CurrentThread::ThreadLocal,
};

/// `_Py_DebugOffsets` as declared in `Include/internal/pycore_runtime.h` at
/// v3.13.0 (identical at v3.13.15, Debian's libpython3.13-dev): every
/// field after the cookie, in order.
pub(super) const DEBUG_OFFSETS: super::frames::DebugOffsetsLayout = super::frames::DebugOffsetsLayout {
    fields: &[
        "version",
        "free_threaded",
        "runtime_state.size",
        "runtime_state.finalizing",
        "runtime_state.interpreters_head",
        "interpreter_state.size",
        "interpreter_state.id",
        "interpreter_state.next",
        "interpreter_state.threads_head",
        "interpreter_state.gc",
        "interpreter_state.imports_modules",
        "interpreter_state.sysdict",
        "interpreter_state.builtins",
        "interpreter_state.ceval_gil",
        "interpreter_state.gil_runtime_state",
        "interpreter_state.gil_runtime_state_enabled",
        "interpreter_state.gil_runtime_state_locked",
        "interpreter_state.gil_runtime_state_holder",
        "thread_state.size",
        "thread_state.prev",
        "thread_state.next",
        "thread_state.interp",
        "thread_state.current_frame",
        "thread_state.thread_id",
        "thread_state.native_thread_id",
        "thread_state.datastack_chunk",
        "thread_state.status",
        "interpreter_frame.size",
        "interpreter_frame.previous",
        "interpreter_frame.executable",
        "interpreter_frame.instr_ptr",
        "interpreter_frame.localsplus",
        "interpreter_frame.owner",
        "code_object.size",
        "code_object.filename",
        "code_object.name",
        "code_object.qualname",
        "code_object.linetable",
        "code_object.firstlineno",
        "code_object.argcount",
        "code_object.localsplusnames",
        "code_object.localspluskinds",
        "code_object.co_code_adaptive",
        "pyobject.size",
        "pyobject.ob_type",
        "type_object.size",
        "type_object.tp_name",
        "type_object.tp_repr",
        "type_object.tp_flags",
        "tuple_object.size",
        "tuple_object.ob_item",
        "tuple_object.ob_size",
        "list_object.size",
        "list_object.ob_item",
        "list_object.ob_size",
        "dict_object.size",
        "dict_object.ma_keys",
        "dict_object.ma_values",
        "float_object.size",
        "float_object.ob_fval",
        "long_object.size",
        "long_object.lv_tag",
        "long_object.ob_digit",
        "bytes_object.size",
        "bytes_object.ob_size",
        "bytes_object.ob_sval",
        "unicode_object.size",
        "unicode_object.state",
        "unicode_object.length",
        "unicode_object.asciiobject_size",
        "gc.size",
        "gc.collecting",
    ],
};

impl super::Abi for Abi313 {
    fn frames(&self) -> super::frames::FrameOffsets {
        FRAMES
    }

    fn debug_offsets_layout(&self) -> Option<super::frames::DebugOffsetsLayout> {
        Some(DEBUG_OFFSETS)
    }

    fn ht_qualname(&self) -> u64 {
        // Include/cpython/object.h at v3.13.0, as in v3.12: `ht_qualname`
        // follows the type object, its five method tables, `ht_name` and
        // `ht_slots` (checked by compiling `offsetof` against these headers).
        872
    }

    fn heap(&self) -> super::heap::HeapLayout {
        use super::heap::{HeapLayout, LongSize, Obmalloc, Refcount, tpflags};
        HeapLayout {
            // Include/internal/pycore_interp.h at v3.13.0: `struct
            // _gc_runtime_state gc` at 7400 in `struct _is` (also
            // `_Py_DebugOffsets.interpreter_state.gc`), laid out as in 3.11
            // (Include/internal/pycore_gc.h); `struct _obmalloc_state
            // *obmalloc` at 10800 (DWARF of pyenv's 3.13.0 and the forky
            // root's 3.13.15).
            interp_gc: 7400,
            generation0: 96,
            permanent: 104,
            collecting: 200,
            // Include/cpython/tupleobject.h: `PyObject_VAR_HEAD; PyObject
            // *ob_item[1];`.
            tuple_items: 24,
            obmalloc: Obmalloc::Pointer { offset: 10800 },
            refcount: Refcount::Plain,
            // As in 3.12 (Include/internal/pycore_object.h at v3.13.0).
            preheader_flags: tpflags::MANAGED_DICT | tpflags::MANAGED_WEAKREF,
            long: LongSize::Tag,
            dict_keys: super::heap::DictKeys::Log2,
            geometry: super::heap::Geometry::LARGE,
        }
    }

    fn minor(&self) -> u8 {
        13
    }

    fn probes(&self) -> &'static [ProbeSpec] {
        &super::v3_12::PROBES
    }

    fn debug_offsets(&self) -> Option<DebugOffsetsHeader> {
        Some(DebugOffsetsHeader { cookie: b"xdebugpy", version_offset: 8 })
    }

    fn guard(&self, symbol: &str) -> Option<Guard> {
        match symbol {
            // Objects/object.c at v3.13.0: `new_reference` calls
            // `_PyRuntime.ref_tracer.tracer_func` with `PyRefTracer_CREATE`
            // when it is set; `_Py_Dealloc` and `_Py_DECREF_SPECIALIZED`
            // (Include/internal/pycore_object.h) with `PyRefTracer_DESTROY`.
            "_Py_NewReference" => Some(Guard::RefTracer),
            // The same copies as `_Py_NewReference`'s: without debug info
            // they cannot be told apart, and are counted there.
            "_Py_NewReferenceNoTotal" => None,
            // Its copies read the tracer too, but so do destructions that
            // never call it (`_Py_DECREF_SPECIALIZED`): not a count of it.
            _ => super::allocator_guard(symbol),
        }
    }
}

/// The GC markers, and `gc_collect_main` for builds without them, with a
/// caveat: in Python/gc.c (checked at v3.13.15, Debian's source, and in the
/// code of pyenv's 3.13.0), `static Py_ssize_t
/// gc_collect_main(PyThreadState *tstate, int generation, _PyGC_Reason
/// reason)` returns 0 at once when a collection is already running (its
/// compare-and-swap of `gcstate->collecting`), and the automatic
/// collections pass `GENERATION_AUTO` (-1): it picks the generation itself
/// (`gc_select_generation`), and returns 0 without collecting when none is
/// due. The markers fire after both; the function's entry cannot tell.
pub(super) const GC: super::gc::GcKnowledge = super::gc::markers(
    Some(super::gc::GcFunction {
        symbol: "gc_collect_main",
        generation_register: super::gc::SECOND_ARGUMENT,
        caveat: GC_CAVEAT,
    }),
    GC_STATE,
);

/// The collector's statistics: `Include/internal/pycore_interp.h` at v3.13.0
/// puts `struct _gc_runtime_state gc` at 7400 in `struct _is`
/// (`_Py_DebugOffsets.interpreter_state.gc` says so too), laid out as in
/// 3.11 (`Include/internal/pycore_gc.h` at v3.13.0, l.282): `generation_stats`
/// at 128. Debian's 3.13.15 aligns `PyGC_Head` to 4 bytes
/// (`gchead-alignment.diff`), which moves `generations` to 20, but its
/// DWARF still puts `generation_stats` at 128 (the hole before
/// `generation0` at 96 takes up the difference). Checked against the DWARF
/// of pyenv's 3.13.0 and the forky root's 3.13.15, and live against
/// `gc.get_stats()` on both.
pub(super) const GC_STATE: super::gc::GcStateLayout =
    super::gc::GcStateLayout { interp_gc: 7400, generation_stats: 128, caveat: None };

/// What `gc_collect_main`'s entry and return do not show (3.13, and 3.14
/// where it has the function).
pub(super) const GC_CAVEAT: Option<&str> = Some(
    "gc_collect_main's entry does not show the generation of automatic collections (they pass GENERATION_AUTO, -1, and it picks one inside, or returns without collecting when none is due), nor that a call made while another collection runs returns at once: such calls are counted under generation null, each as one collection",
);
