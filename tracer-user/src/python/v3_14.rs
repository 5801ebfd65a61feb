//! CPython 3.14.
//!
//! The probed functions are those of 3.13 (Objects/object.c,
//! Objects/obmalloc.c at v3.14.0); any a build lacks is reported as
//! missing, not guessed. `_Py_DebugOffsets` keeps its 3.13 header
//! (`Include/internal/pycore_debug_offsets.h` at v3.14.0): the cookie, then
//! `uint64_t version`.

use super::{DebugOffsetsHeader, Guard};
use crate::probe::ProbeSpec;

/// The 3.14 ABI.
#[derive(Debug)]
pub struct Abi314;

/// Where 3.14 keeps a thread's frames; each offset was checked against the
/// DWARF of the forky root's 3.14.8 (gdb's `offsetof`). In a process, the
/// ones `_Py_DebugOffsets` publishes are also checked against what it
/// says. The headers read are Debian's libpython3.14-dev 3.14.8-1, which is
/// CPython's v3.14.8.
///
/// The current thread (see [`super::frames::CurrentThread`]): the
/// thread-local `_Py_tss_tstate` (`Include/internal/pycore_pystate.h` at
/// v3.14.8), as in 3.12. Userspace walks `interpreters.head->threads.head`
/// and reads the GIL holder from the interpreter's own GIL.
const FRAMES: super::frames::FrameOffsets = super::frames::FrameOffsets {
    // Include/internal/pycore_runtime_structs.h at v3.14.8: `struct
    // pyruntimestate { _Py_DebugOffsets debug_offsets (0, 760 bytes); five
    // ints; PyThreadState *_finalizing; unsigned long _finalizing_id; struct
    // pyinterpreters { PyMutex mutex; PyInterpreterState *head (808); *main;
    // int64_t next_id; } interpreters; unsigned long main_thread (832);`.
    runtime: super::frames::RuntimeOffsets { interpreters_head: 808, main_thread: 832 },
    // Include/internal/pycore_interp_structs.h at v3.14.8: `struct _is {
    // struct _ceval_state ceval; void *_malloced; PyInterpreterState *next
    // (7272); ...; struct pythreads { uint64_t next_unique_id; PyThreadState
    // *head (7344); _PyThreadStateImpl *preallocated; PyThreadState *main;
    // ...} threads;`.
    interpreter: super::frames::InterpreterOffsets { next: 7272, threads_head: 7344 },
    // Include/cpython/pystate.h at v3.14.8: `struct _ts { prev (0); next
    // (8); interp (16); uintptr_t eval_breaker; struct {...} _status; int
    // holds_gil, _whence, state, py_recursion_remaining, py_recursion_limit,
    // recursion_headroom, tracing, what_event; struct _PyInterpreterFrame
    // *current_frame (72); ...; unsigned long thread_id (152); unsigned long
    // native_thread_id (160); ...}`.
    thread: super::frames::ThreadOffsets {
        prev: 0,
        next: 8,
        interp: 16,
        frame: super::frames::FrameLink::Direct { current_frame: 72 },
        thread_id: 152,
        native_thread_id: Some(160),
    },
    // Include/internal/pycore_interpframe_structs.h at v3.14.8: `struct
    // _PyInterpreterFrame { _PyStackRef f_executable (0); struct
    // _PyInterpreterFrame *previous (8); _PyStackRef f_funcobj; f_globals;
    // f_builtins; f_locals; frame_obj; _Py_CODEUNIT *instr_ptr (56);
    // _PyStackRef *stackpointer; uint16_t return_offset; char owner (74);
    // uint8_t visited; ...}` (`tlbc_index` only with Py_GIL_DISABLED);
    // `enum _frameowner`: FRAME_OWNED_BY_INTERPRETER = 3,
    // FRAME_OWNED_BY_CSTACK = 4. Include/internal/pycore_stackref.h at
    // v3.14.8, with the GIL: `#define Py_TAG_BITS 3`; a reference to an
    // object has bit 0 (Py_TAG_REFCNT) set or not, and both bits set is a
    // tagged int (Py_INT_TAG).
    frame: super::frames::InterpreterFrameOffsets {
        code: 0,
        code_ref: super::frames::CodeRef::Tagged { mask: 3 },
        previous: 8,
        instr: 56,
        instr_kind: super::frames::InstrKind::Pointer,
        owner: Some(74),
        first_non_python_owner: 3,
    },
    // Include/cpython/code.h at v3.14.8, `_PyCode_DEF`: as 3.13's up to
    // _co_monitoring, then Py_ssize_t _co_unique_id, int _co_firsttraceable
    // (192), void *co_extra, char co_code_adaptive[] (208) (co_tlbc only
    // with Py_GIL_DISABLED); co_firstlineno (68), co_filename (112), co_name
    // (120), co_qualname (128), co_linetable (136).
    code: super::frames::CodeOffsets {
        filename: 112,
        name: 120,
        qualname: Some(128),
        linetable: 136,
        lines: super::frames::LineTableFormat::Locations,
        firstlineno: 68,
        code_adaptive: Some(208),
        first_traceable: Some(192),
    },
    // Include/cpython/unicodeobject.h at v3.14.8: `PyASCIIObject {
    // PyObject_HEAD; Py_ssize_t length (16); Py_hash_t hash; state (32,
    // aligned to 4); }` is 40 bytes, PyCompactUnicodeObject 56.
    unicode: super::frames::UnicodeOffsets { length: 16, state: 32, ascii_data: 40, compact_data: 56 },
    // Include/cpython/bytesobject.h at v3.14.8: ob_size at 16, ob_sval at 32.
    bytes: super::frames::BytesOffsets { size: 16, data: 32 },
    // Include/object.h at v3.14.8: `ob_type` after the 8-byte refcount union.
    ob_type: 8,
    // Include/internal/pycore_interp_structs.h at v3.14.8: `struct
    // _gil_runtime_state _gil` at 7784 in `struct _is`;
    // Include/internal/pycore_gil.h: `{ unsigned long interval;
    // PyThreadState *last_holder (+8); int locked (+16); ...}`.
    gil: super::frames::GilHolder::Interpreter { last_holder: 7792, locked: 7800 },
    current_thread: super::frames::CurrentThread::ThreadLocal,
};

/// `_Py_DebugOffsets` as declared in `Include/internal/pycore_debug_offsets.h`
/// at v3.14.8: every field after the cookie, in order. 3.14 adds
/// `interpreter_state.threads_main`, `code_object_generation` and
/// `tlbc_generation`, the frame's `stackpointer` and `tlbc_index`,
/// `code_object.co_tlbc`, `set_object`, `gen_object`, `llist_node` and
/// `debugger_support` to 3.13's, so the fields the walker reads are at other
/// places than in 3.13.
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
        "interpreter_state.threads_main",
        "interpreter_state.gc",
        "interpreter_state.imports_modules",
        "interpreter_state.sysdict",
        "interpreter_state.builtins",
        "interpreter_state.ceval_gil",
        "interpreter_state.gil_runtime_state",
        "interpreter_state.gil_runtime_state_enabled",
        "interpreter_state.gil_runtime_state_locked",
        "interpreter_state.gil_runtime_state_holder",
        "interpreter_state.code_object_generation",
        "interpreter_state.tlbc_generation",
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
        "interpreter_frame.stackpointer",
        "interpreter_frame.tlbc_index",
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
        "code_object.co_tlbc",
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
        "set_object.size",
        "set_object.used",
        "set_object.table",
        "set_object.mask",
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
        "gen_object.size",
        "gen_object.gi_name",
        "gen_object.gi_iframe",
        "gen_object.gi_frame_state",
        "llist_node.next",
        "llist_node.prev",
        "debugger_support.eval_breaker",
        "debugger_support.remote_debugger_support",
        "debugger_support.remote_debugging_enabled",
        "debugger_support.debugger_pending_call",
        "debugger_support.debugger_script_path",
        "debugger_support.debugger_script_path_size",
    ],
};

impl super::Abi for Abi314 {
    fn frames(&self) -> super::frames::FrameOffsets {
        FRAMES
    }

    fn debug_offsets_layout(&self) -> Option<super::frames::DebugOffsetsLayout> {
        Some(DEBUG_OFFSETS)
    }

    fn ht_qualname(&self) -> u64 {
        // Include/cpython/object.h at v3.14.8 (Debian's headers), as in v3.13:
        // `ht_qualname` follows the type object, its five method tables,
        // `ht_name` and `ht_slots` (checked by compiling `offsetof` against
        // these headers).
        872
    }

    fn heap(&self) -> super::heap::HeapLayout {
        use super::heap::{HeapLayout, LongSize, Obmalloc, Refcount, tpflags};
        HeapLayout {
            // Include/internal/pycore_interp_structs.h at v3.14.8: `struct
            // _gc_runtime_state gc` at 7408 in `struct _is`, `{
            // trash_delete_later; int trash_delete_nesting, enabled, debug;
            // struct gc_generation generations[3] (24); struct gc_generation
            // permanent_generation (96); generation_stats[3]; int collecting
            // (192); ...; PyGC_Head *generation0 (256); }`, and `struct
            // _obmalloc_state *obmalloc` at 10904 (DWARF of the forky root's
            // 3.14.8). This is the generational collector 3.14.5 went back
            // to; 3.14.0 to 3.14.4 had an incremental one without
            // `generation0`, whose lists tracer does not know (the census
            // then says the heads are unknown).
            interp_gc: 7408,
            generation0: 256,
            permanent: 96,
            collecting: 192,
            // Include/cpython/tupleobject.h at v3.14.8: `PyObject_VAR_HEAD;
            // Py_hash_t ob_hash; PyObject *ob_item[1];`.
            tuple_items: 32,
            obmalloc: Obmalloc::Pointer { offset: 10904 },
            refcount: Refcount::Split,
            // As in 3.12 (Include/internal/pycore_object.h at v3.14.8).
            preheader_flags: tpflags::MANAGED_DICT | tpflags::MANAGED_WEAKREF,
            long: LongSize::Tag,
            dict_keys: super::heap::DictKeys::Log2,
            geometry: super::heap::Geometry::LARGE,
        }
    }

    fn minor(&self) -> u8 {
        14
    }

    fn probes(&self) -> &'static [ProbeSpec] {
        &super::v3_12::PROBES
    }

    fn debug_offsets(&self) -> Option<DebugOffsetsHeader> {
        Some(DebugOffsetsHeader { cookie: b"xdebugpy", version_offset: 8 })
    }

    fn guard(&self, symbol: &str) -> Option<Guard> {
        // As in 3.13 (Objects/object.c at v3.14.0).
        super::Abi::guard(&super::v3_13::Abi313, symbol)
    }
}

/// The GC markers, and `gc_collect_main` for builds without them, as in
/// 3.13 (see its caveat there). Checked in Debian's 3.14.8, whose DWARF
/// has `static Py_ssize_t gc_collect_main(PyThreadState *tstate, int
/// generation, _PyGC_Reason reason)`, `generation` in `%esi` at its entry
/// and the constant -1 (`GENERATION_AUTO`) where it picks one, and both
/// markers in its code (the notes put `gc__start` and `gc__done` in its
/// `.cold` part; `gc__done`'s argument is the value it returns). In the
/// incremental collector of earlier 3.14 releases (a Python/gc.c read
/// from a source index, not checked against the v3.14.0 tag, whose tree
/// was too large to fetch) the markers are in `_PyGC_Collect`, whose
/// generation 1 is an increment of the old generation, and no
/// `gc_collect_main` was seen: where the symbol is missing, tracer says it
/// knows no collection function.
pub(super) const GC: super::gc::GcKnowledge = super::gc::markers(
    Some(super::gc::GcFunction {
        symbol: "gc_collect_main",
        generation_register: super::gc::SECOND_ARGUMENT,
        caveat: super::v3_13::GC_CAVEAT,
    }),
    GC_STATE,
);

/// The collector's statistics: `Include/internal/pycore_interp_structs.h` at
/// v3.14.8 (l.203-267) puts `struct _gc_runtime_state gc` at 7408 in
/// `struct _is` (`_Py_DebugOffsets.interpreter_state.gc` says so too), `{
/// trash_delete_later; int trash_delete_nesting, enabled, debug; struct
/// gc_generation generations[3] (24); permanent_generation (96); struct
/// gc_generation_stats generation_stats[3] (120); int collecting (192);
/// ...; PyGC_Head *generation0 (256); }`: 3.14.5 went back to the
/// generational collector, keeping the incremental one's offsets (its
/// removed fields are `dummy1..3`). Checked against the DWARF of the forky
/// root's 3.14.8, and live against `gc.get_stats()`. 3.14.0 to 3.14.4 had
/// the incremental collector, `generation_stats` at the same 120 (its
/// `pycore_gc.h`: young, old[2], `permanent_generation`, then the stats; not
/// checked against a build, none is here), whose index 1 counts
/// increments of the old generation and 2 full collections.
pub(super) const GC_STATE: super::gc::GcStateLayout = super::gc::GcStateLayout {
    interp_gc: 7408,
    generation_stats: 120,
    caveat: Some((
        5,
        "this 3.14 release (before 3.14.5) collects incrementally: its statistics count young collections under generation 0, increments of the old generation under 1 and full collections under 2",
    )),
};
