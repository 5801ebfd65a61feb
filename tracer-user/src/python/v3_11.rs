//! CPython 3.11.
//!
//! Checked on this project's machines against pyenv's 3.11.7 (shared
//! libpython) and Debian's static LTO 3.11.2. Every probed function is in
//! Objects/object.c and Objects/obmalloc.c at v3.11.0. There is no
//! `_Py_DebugOffsets` before 3.13.

use super::{COMMON, DebugOffsetsHeader, Guard};
use crate::probe::ProbeSpec;

/// The 3.11 ABI.
#[derive(Debug)]
pub struct Abi311;

/// Where 3.11 keeps a thread's frames; each offset was checked against the
/// DWARF of pyenv's 3.11.7 and Debian's 3.11.2 (gdb's `offsetof`).
///
/// The current thread (see [`super::frames::CurrentThread`]): 3.11 keeps
/// no thread state in thread-local storage, so the BPF side reads
/// `_PyRuntime.gilstate.tstate_current`, exported with `_PyRuntime` in
/// every build (LTO ones included), and set to the thread that holds the
/// GIL by `_PyThreadState_Swap`. Userspace, which must see every thread
/// whether it holds the GIL or not, walks `interpreters.head->threads.head`
/// instead.
const FRAMES: super::frames::FrameOffsets = super::frames::FrameOffsets {
    // Include/internal/pycore_runtime.h at v3.11.7: `struct
    // pyruntimestate { five ints; _Py_atomic_address _finalizing (24);
    // struct pyinterpreters { PyThread_type_lock mutex; PyInterpreterState
    // *head (40); *main; int64_t next_id; } interpreters; struct
    // _xidregistry { mutex; head; } xidregistry; unsigned long main_thread
    // (80); ...`.
    runtime: super::frames::RuntimeOffsets { interpreters_head: 40, main_thread: 80 },
    // Include/internal/pycore_interp.h at v3.11.7: `struct _is { PyInterpreterState
    // *next (0); struct pythreads { uint64_t next_unique_id; PyThreadState *head (16);
    // ...} threads;`.
    interpreter: super::frames::InterpreterOffsets { next: 0, threads_head: 16 },
    // Include/cpython/pystate.h at v3.11.7: `struct _ts { prev (0); next (8);
    // interp (16); int _initialized, _static, recursion_remaining,
    // recursion_limit, recursion_headroom, tracing, tracing_what; _PyCFrame
    // *cframe (56); ...; unsigned long thread_id (152); unsigned long
    // native_thread_id (160); ...}` and `typedef struct _PyCFrame { uint8_t
    // use_tracing; struct _PyInterpreterFrame *current_frame (8); struct
    // _PyCFrame *previous; }`.
    thread: super::frames::ThreadOffsets {
        prev: 0,
        next: 8,
        interp: 16,
        frame: super::frames::FrameLink::ViaCFrame { cframe: 56, current_frame: 8 },
        thread_id: 152,
        native_thread_id: Some(160),
    },
    // Include/internal/pycore_frame.h at v3.11.7: `typedef struct
    // _PyInterpreterFrame { PyFunctionObject *f_func; PyObject *f_globals,
    // *f_builtins, *f_locals; PyCodeObject *f_code (32); PyFrameObject
    // *frame_obj; struct _PyInterpreterFrame *previous (48); _Py_CODEUNIT
    // *prev_instr (56); int stacktop; bool is_entry; char owner (69); ...}`;
    // `enum _frameowner` ends at FRAME_OWNED_BY_FRAME_OBJECT = 2.
    frame: super::frames::InterpreterFrameOffsets {
        code: 32,
        code_ref: super::frames::CodeRef::Pointer,
        previous: 48,
        instr: 56,
        instr_kind: super::frames::InstrKind::Pointer,
        owner: Some(69),
        first_non_python_owner: 3,
    },
    // Include/cpython/code.h at v3.11.7, `_PyCode_DEF`: after
    // PyObject_VAR_HEAD (24 bytes), co_consts, co_names, co_exceptiontable,
    // int co_flags, short co_warmup, short _co_linearray_entry_size, int
    // co_argcount, co_posonlyargcount, co_kwonlyargcount, co_stacksize,
    // co_firstlineno (72), ... co_localsplusnames (96), co_localspluskinds,
    // co_filename (112), co_name (120), co_qualname (128), co_linetable
    // (136), co_weakreflist, _co_code, _co_linearray, int _co_firsttraceable
    // (168), void *co_extra, char co_code_adaptive[] (184).
    code: super::frames::CodeOffsets {
        filename: 112,
        name: 120,
        qualname: Some(128),
        linetable: 136,
        lines: super::frames::LineTableFormat::Locations,
        firstlineno: 72,
        code_adaptive: Some(184),
        first_traceable: Some(168),
    },
    // Include/cpython/unicodeobject.h at v3.11.7: `PyASCIIObject {
    // PyObject_HEAD; Py_ssize_t length (16); Py_hash_t hash; struct {...}
    // state (32); wchar_t *wstr; }` is 48 bytes, and PyCompactUnicodeObject
    // adds utf8_length, utf8 and wstr_length: 72.
    unicode: super::frames::UnicodeOffsets { length: 16, state: 32, ascii_data: 48, compact_data: 72 },
    // Include/cpython/bytesobject.h at v3.11.7: PyObject_VAR_HEAD (ob_size
    // at 16), Py_hash_t ob_shash, char ob_sval[] (32).
    bytes: super::frames::BytesOffsets { size: 16, data: 32 },
    // Include/object.h at v3.11.7: `struct _object { Py_ssize_t ob_refcnt;
    // PyTypeObject *ob_type; }`.
    ob_type: 8,
    // Include/internal/pycore_runtime.h at v3.11.7: `struct
    // _ceval_runtime_state { _Py_atomic_int signals_pending; struct
    // _gil_runtime_state gil; } ceval`, at 352 in `_PyRuntime`, so the GIL
    // is at 360; Include/internal/pycore_gil.h: `{ unsigned long interval;
    // _Py_atomic_address last_holder (+8); _Py_atomic_int locked (+16);
    // ...}`.
    gil: super::frames::GilHolder::Runtime { last_holder: 368, locked: 376 },
    // Include/internal/pycore_runtime.h at v3.11.7: `struct
    // _gilstate_runtime_state { int check_enabled; _Py_atomic_address
    // tstate_current; ...} gilstate` follows `ceval`, at 568 in `_PyRuntime`,
    // so `tstate_current` is at 576.
    current_thread: super::frames::CurrentThread::GilstateCurrent { tstate_current: 576 },
};

impl super::Abi for Abi311 {
    fn frames(&self) -> super::frames::FrameOffsets {
        FRAMES
    }

    fn ht_qualname(&self) -> u64 {
        // Include/cpython/object.h at v3.11.7: `ht_qualname` follows the type
        // object, its five method tables, `ht_name` and `ht_slots` (checked by
        // compiling `offsetof` against these headers).
        864
    }

    fn heap(&self) -> super::heap::HeapLayout {
        use super::heap::{HeapLayout, LongSize, Obmalloc, Refcount, tpflags};
        HeapLayout {
            // Include/internal/pycore_interp.h at v3.11.7: `struct
            // _gc_runtime_state gc` at 648 in `struct _is`;
            // Include/internal/pycore_gc.h: `{ trash_delete_later;
            // int trash_delete_nesting, enabled, debug; struct gc_generation
            // generations[3] (24); PyGC_Head *generation0 (96); struct
            // gc_generation permanent_generation (104); struct
            // gc_generation_stats generation_stats[3]; int collecting (200);
            // ...}` (DWARF of pyenv's 3.11.7 and Debian's 3.11.2).
            interp_gc: 648,
            generation0: 96,
            permanent: 104,
            collecting: 200,
            // Include/cpython/tupleobject.h: `PyObject_VAR_HEAD; PyObject
            // *ob_item[1];`.
            tuple_items: 24,
            // Objects/obmalloc.c at v3.11.2: `static struct arena_object*
            // arenas; static uint maxarenas; ... static Py_ssize_t
            // raw_allocated_blocks;`.
            obmalloc: Obmalloc::Statics {
                arenas: "arenas",
                maxarenas: "maxarenas",
                raw_allocated_blocks: "raw_allocated_blocks",
            },
            refcount: Refcount::Plain,
            // Include/internal/pycore_object.h at v3.11.7,
            // `_PyType_PreHeaderSize`: the GC head, and two words for
            // `Py_TPFLAGS_MANAGED_DICT`.
            preheader_flags: tpflags::MANAGED_DICT,
            long: LongSize::SignedSize,
            dict_keys: super::heap::DictKeys::Log2,
            geometry: super::heap::Geometry::LARGE,
        }
    }

    fn minor(&self) -> u8 {
        11
    }

    fn probes(&self) -> &'static [ProbeSpec] {
        &COMMON
    }

    fn debug_offsets(&self) -> Option<DebugOffsetsHeader> {
        None
    }

    fn guard(&self, symbol: &str) -> Option<Guard> {
        match symbol {
            // Objects/object.c at v3.11.0: `_Py_NewReference` first tests
            // `_Py_tracemalloc_config.tracing`; Include/internal/pycore_pymem.h
            // at v3.11.0: `struct _PyTraceMalloc_Config { initialized (an
            // enum); int tracing; int max_nframe; }`, so `tracing` is at 4.
            "_Py_NewReference" => Some(Guard::TracemallocFlag { within: "_Py_tracemalloc_config", offset: Some(4) }),
            // No switch guards `_Py_Dealloc` in 3.11 (Objects/object.c).
            _ => super::allocator_guard(symbol),
        }
    }
}

/// The GC markers, and `gc_collect_main` for builds without them: in
/// Modules/gcmodule.c (checked at v3.11.2, Debian's source, and in the
/// DWARF of pyenv's 3.11.7, declared at the same line 1178),
/// `static Py_ssize_t gc_collect_main(PyThreadState *tstate, int
/// generation, Py_ssize_t *n_collected, Py_ssize_t *n_uncollectable, int
/// nofail)` fires `gc__start(generation)` after its debug output,
/// `gc__done(n + m)` just before `return n + m`, and has no other return.
/// Its callers (`gc_collect_with_callback`, which both `gc.collect()` and
/// the automatic collections reach, and `_PyGC_CollectNoFail`) pass the
/// generation they chose and call it only when no collection is running
/// (`gcstate->collecting`), so each call is one collection, as the markers
/// see it.
pub(super) const GC: super::gc::GcKnowledge = super::gc::markers(
    Some(super::gc::GcFunction {
        symbol: "gc_collect_main",
        generation_register: super::gc::SECOND_ARGUMENT,
        caveat: None,
    }),
    GC_STATE,
);

/// The collector's statistics: `Include/internal/pycore_interp.h` at v3.11.7
/// puts `struct _gc_runtime_state gc` at 648 in `struct _is`;
/// `Include/internal/pycore_gc.h` at v3.11.7 (l.131) lays it out as `{
/// trash_delete_later (0); int trash_delete_nesting (8), enabled (12),
/// debug (16); struct gc_generation generations[3] (24, 24 bytes each);
/// PyGC_Head *generation0 (96); struct gc_generation permanent_generation
/// (104); struct gc_generation_stats generation_stats[3] (128); int
/// collecting (200); ...}`. Checked against the DWARF of pyenv's 3.11.7 and
/// Debian's 3.11.2 (python3.11-dbg), and live: `gc.get_stats()` equals
/// what these offsets read on both.
pub(super) const GC_STATE: super::gc::GcStateLayout =
    super::gc::GcStateLayout { interp_gc: 648, generation_stats: 128, caveat: None };
