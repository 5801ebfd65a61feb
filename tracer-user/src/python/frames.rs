//! Where a thread's Python stack is in a CPython process: the offsets a
//! frame walker needs, one table per minor version ([`super::Abi::frames`]),
//! and for 3.13+ the layout of `_Py_DebugOffsets`, against which the table
//! is checked in each process (see [`crate::stacks`]).
//!
//! The path a walker takes is the same in every supported version:
//! `_PyRuntime` (an exported symbol) → `interpreters.head` → the
//! interpreter's `threads.head` (`tstate_head` before 3.11) → each thread
//! state's innermost frame → `previous` (`f_back` before 3.11) until NULL; each frame names its code object and the
//! instruction it is at, and the code object its qualified name, file,
//! first line and line table. What differs is where the fields are, how the
//! thread state reaches its frame, how the frame refers to its code, and
//! how the *current* thread's state is found (see [`CurrentThread`]).
//!
//! Every table here was written from the headers and then compared with
//! the DWARF of each build on the project's machines (gdb's `offsetof` on
//! pyenv's 3.11.7, 3.12.1 and 3.13.0, Debian's 3.11.2, and the forky root's
//! 3.13.15 and 3.14.8 with their -dbg packages).

/// How a thread state reaches its innermost frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameLink {
    /// 3.11, 3.12: `tstate->cframe->current_frame`, through the `_PyCFrame`
    /// of the innermost running `_PyEval_EvalFrameDefault`.
    ViaCFrame { cframe: u64, current_frame: u64 },
    /// 3.13+: `tstate->current_frame`.
    Direct { current_frame: u64 },
    /// 3.9, 3.10: `tstate->frame`, the innermost `PyFrameObject *` (there
    /// is no `_PyInterpreterFrame` before 3.11: every frame is a frame
    /// object, linked to its caller by `f_back`).
    FrameObject { frame: u64 },
}

/// How a frame says which instruction it is at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstrKind {
    /// 3.11+: a pointer into the code object's own `co_code_adaptive`
    /// ([`CodeOffsets::code_adaptive`]).
    Pointer,
    /// 3.9, 3.10: `int f_lasti`, the index of the last instruction started
    /// (-1 before the first), in units of `unit` bytes: 1 in 3.9 (a byte
    /// offset into `co_code`), 2 in 3.10 (code units: Objects/frameobject.c
    /// at v3.10.13, `frame_getlasti` returns `f_lasti * sizeof(_Py_CODEUNIT)`,
    /// and `PyFrame_GetLineNumber` passes `f_lasti*sizeof(_Py_CODEUNIT)` to
    /// `PyCode_Addr2Line`).
    LastI { unit: u8 },
}

impl InstrKind {
    /// The byte offset of the instruction a frame is at, from the raw
    /// 8 bytes at its instruction field and its code object's address
    /// (and, for [`Self::Pointer`], where the code's instructions start in
    /// it): what `PyCode_Addr2Line` is given.
    #[must_use]
    pub fn offset(self, raw: u64, code: u64, code_adaptive: u64) -> i64 {
        match self {
            Self::Pointer => raw.wrapping_sub(code.wrapping_add(code_adaptive)).cast_signed(),
            Self::LastI { unit } => {
                #[allow(clippy::cast_possible_truncation, reason = "f_lasti is the C int in the low 4 bytes")]
                let lasti = (raw as u32).cast_signed();
                i64::from(lasti) * i64::from(unit)
            }
        }
    }
}

/// The format of a code object's line table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineTableFormat {
    /// 3.9's `co_lnotab`: (bytecode increment, signed line increment)
    /// byte pairs (`Objects/lnotab_notes.txt` at v3.9.18).
    Lnotab,
    /// 3.10's `co_linetable` (PEP 626): (bytecode delta, signed line delta)
    /// byte pairs, a line delta of -128 meaning no line
    /// (`Objects/lnotab_notes.txt` at v3.10.13).
    Pep626,
    /// 3.11+'s location table (see [`crate::stacks::linetable`]).
    Locations,
}

/// How an interpreter frame holds its code object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeRef {
    /// A plain `PyCodeObject *` / `PyObject *` (3.11 and 3.12 `f_code`,
    /// 3.13 `f_executable`).
    Pointer,
    /// A `_PyStackRef` (3.14 `f_executable`): the object's address with tag
    /// bits in `mask`, cleared to get the pointer. Bits that are all set
    /// are a tagged integer, not an object.
    Tagged { mask: u64 },
}

impl CodeRef {
    /// The object address in `raw`, or `None` where it holds no object
    /// (NULL, 3.14's `PyStackRef_NULL`, a tagged integer).
    #[must_use]
    pub const fn object(self, raw: u64) -> Option<u64> {
        let address = match self {
            Self::Pointer => raw,
            Self::Tagged { mask } if raw & mask == mask => return None,
            Self::Tagged { mask } => raw & !mask,
        };
        if address == 0 { None } else { Some(address) }
    }

    /// Whether `raw` is NULL (3.14: `PyStackRef_NULL`), which a frame that
    /// is being set up or torn down can hold for a moment: seen in 3.14
    /// on a running thread, where a frame still linked from the thread
    /// state had `PyStackRef_NULL` for its executable.
    #[must_use]
    pub const fn is_null(self, raw: u64) -> bool {
        match self {
            Self::Pointer => raw == 0,
            Self::Tagged { mask } => raw & !mask == 0 && raw & mask != mask,
        }
    }
}

/// Which thread holds the GIL: the GIL's `last_holder`, the thread state
/// that took it last, meaningful while its `locked` (an int) is set
/// (`Include/internal/pycore_gil.h`: `struct _gil_runtime_state { unsigned
/// long interval; last_holder; locked; ...}` in every supported version).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GilHolder {
    /// 3.11: the runtime's one GIL, `_PyRuntime.ceval.gil`; offsets in
    /// `_PyRuntime`.
    Runtime { last_holder: u64, locked: u64 },
    /// 3.12+: the interpreter's own GIL, `interp->_gil` (which
    /// `interp->ceval.gil` points to for the main interpreter, and for every
    /// interpreter with its own GIL); offsets in `PyInterpreterState`.
    Interpreter { last_holder: u64, locked: u64 },
}

/// How the state of the thread that is running *now* is found, which the
/// BPF side needs at an event (it cannot walk the thread list and compare
/// thread ids at every allocation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CurrentThread {
    /// 3.11 has no thread-local thread state: `_PyRuntime` +
    /// `tstate_current` (`gilstate.tstate_current`, set by
    /// `_PyThreadState_Swap` to the thread that holds the GIL, NULL while
    /// none does) is the current thread's state while it holds the GIL,
    /// which every object allocation and `_Py_NewReference` does.
    /// `PyMem_RawMalloc` may run without the GIL, and then that pointer is
    /// another thread's or NULL: the BPF side has to compare the state's
    /// `native_thread_id` with the event's TID.
    GilstateCurrent { tstate_current: u64 },
    /// 3.12+: the thread-local `_Py_tss_tstate` (Python/pystate.c),
    /// a local symbol that only `.symtab` names, which LTO builds strip. The
    /// exported `_PyThreadState_GetCurrent` returns it in every build and
    /// shows where it is: `mov %fs:OFFSET,%rax` in an executable (the
    /// thread's fsbase plus a constant), `__tls_get_addr` through a
    /// `tls_index` in a shared libpython (the module's block from the
    /// thread's DTV, plus the offset). See [`crate::stacks::tls`].
    ThreadLocal,
}

/// Offsets inside `_PyRuntimeState` (the `_PyRuntime` symbol).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuntimeOffsets {
    /// `interpreters.head`: the first `PyInterpreterState *`.
    pub interpreters_head: u64,
    /// `main_thread`: the `pthread_t` (`unsigned long`) of the thread that
    /// initialised Python, compared with each state's `thread_id`.
    pub main_thread: u64,
}

/// Offsets inside `PyInterpreterState` (`struct _is`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InterpreterOffsets {
    /// `next`: the next interpreter.
    pub next: u64,
    /// `threads.head`: its first `PyThreadState *`.
    pub threads_head: u64,
}

/// Offsets inside `PyThreadState` (`struct _ts`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadOffsets {
    pub prev: u64,
    pub next: u64,
    pub interp: u64,
    /// The way to the innermost frame.
    pub frame: FrameLink,
    /// `thread_id`: the creating thread's `pthread_t`.
    pub thread_id: u64,
    /// `native_thread_id`: its TID (`gettid()`, in the process's own PID
    /// namespace), from 3.11; before it a thread state holds only its
    /// `pthread_t` ([`Self::thread_id`]).
    pub native_thread_id: Option<u64>,
}

/// Offsets inside `_PyInterpreterFrame` (3.11+) or `PyFrameObject` (3.9,
/// 3.10).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InterpreterFrameOffsets {
    /// `f_code` (3.9 to 3.12) or `f_executable` (3.13+).
    pub code: u64,
    /// How [`Self::code`] holds the code object.
    pub code_ref: CodeRef,
    /// `previous` (`f_back` before 3.11): the calling frame, NULL at the
    /// bottom.
    pub previous: u64,
    /// `prev_instr` (3.11, 3.12: the code unit before the next
    /// instruction, which for a calling frame is inside its call
    /// instruction) or `instr_ptr` (3.13+: the instruction running). Either
    /// way its byte offset from the code's first instruction is what
    /// `PyCode_Addr2Line` is given. Before 3.11, `f_lasti` (see
    /// [`Self::instr_kind`]).
    pub instr: u64,
    /// What [`Self::instr`] holds.
    pub instr_kind: InstrKind,
    /// `owner`, a `char` (`enum _frameowner`); `None` before 3.11, where
    /// every frame is a Python function's.
    pub owner: Option<u64>,
    /// The first `owner` value that is not a Python function's frame: the
    /// C stack's entry frames (`FRAME_OWNED_BY_CSTACK`, 3 in 3.12 and 3.13,
    /// 4 in 3.14) and 3.14's interpreter-owned base frame
    /// (`FRAME_OWNED_BY_INTERPRETER`, 3). 3.11 has no such owner, and its
    /// values stop at 2. `_PyFrame_IsIncomplete` skips them.
    pub first_non_python_owner: u8,
}

/// `FRAME_OWNED_BY_GENERATOR`, 1 in every supported version: such a frame
/// is never incomplete.
pub const OWNED_BY_GENERATOR: u8 = 1;

/// Offsets inside `PyCodeObject`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeOffsets {
    pub filename: u64,
    pub name: u64,
    /// `co_qualname`, from 3.11; before it a frame is named by `co_name`
    /// (`Class.method` shows as `method`).
    pub qualname: Option<u64>,
    /// `co_linetable` (3.10+) or `co_lnotab` (3.9), a bytes object in the
    /// format [`Self::lines`] says.
    pub linetable: u64,
    /// The format of [`Self::linetable`].
    pub lines: LineTableFormat,
    /// `co_firstlineno`, an `int`: where the line deltas start.
    pub firstlineno: u64,
    /// `co_code_adaptive`: the first instruction (the code units are in the
    /// code object itself since 3.11); `None` before 3.11, where frames
    /// count instructions by index ([`InstrKind::LastI`]).
    pub code_adaptive: Option<u64>,
    /// `_co_firsttraceable`, an `int`: a frame whose instruction is before
    /// this code unit is still setting up (`_PyFrame_IsIncomplete`), and
    /// tracebacks leave it out; `None` before 3.11, which has no such
    /// frames (a frame object is linked only once it runs).
    pub first_traceable: Option<u64>,
}

/// The compact `str` layout (`Include/cpython/unicodeobject.h`): `length` (a
/// `Py_ssize_t`, in code points) and the `state` bit field, `interned:2`
/// `kind:3` `compact:1` `ascii:1` from bit 0 in every supported version
/// (3.11 adds `ready:1` after them), in a non-free-threaded build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnicodeOffsets {
    pub length: u64,
    pub state: u64,
    /// `sizeof(PyASCIIObject)`: where a compact ASCII string's bytes are.
    pub ascii_data: u64,
    /// `sizeof(PyCompactUnicodeObject)`: where a compact non-ASCII
    /// string's code units (of `kind` bytes) are.
    pub compact_data: u64,
}

/// `bytes` (`Include/cpython/bytesobject.h`): `ob_base.ob_size` and
/// `ob_sval`, the same in every supported version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BytesOffsets {
    pub size: u64,
    pub data: u64,
}

/// Everything a frame walker needs for one minor version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameOffsets {
    pub runtime: RuntimeOffsets,
    pub interpreter: InterpreterOffsets,
    pub thread: ThreadOffsets,
    pub frame: InterpreterFrameOffsets,
    pub code: CodeOffsets,
    pub unicode: UnicodeOffsets,
    pub bytes: BytesOffsets,
    /// `PyObject.ob_type`, by which a code object is told from anything
    /// else (its type is the exported `PyCode_Type`).
    pub ob_type: u64,
    /// Where the GIL's holder is recorded.
    pub gil: GilHolder,
    /// How the running thread's state is found.
    pub current_thread: CurrentThread,
}

/// The fields of the table that `_Py_DebugOffsets` also publishes, by their
/// names there (`group.field`, as in its C declaration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    pub field: &'static str,
    pub value: u64,
}

impl FrameOffsets {
    /// Each offset of this table that `_Py_DebugOffsets` (3.13+) publishes
    /// too, by its name there, for the cross-check. Offsets it has no field
    /// for (`_PyCFrame`, `main_thread`, `_co_firsttraceable`, the size of
    /// `PyCompactUnicodeObject`) are checked by the tests' DWARF and by
    /// walking real processes instead.
    #[must_use]
    pub fn published(&self) -> Vec<Published> {
        let p = |field, value| Published { field, value };
        let mut out = vec![
            p("runtime_state.interpreters_head", self.runtime.interpreters_head),
            p("interpreter_state.next", self.interpreter.next),
            p("interpreter_state.threads_head", self.interpreter.threads_head),
            p("thread_state.prev", self.thread.prev),
            p("thread_state.next", self.thread.next),
            p("thread_state.interp", self.thread.interp),
            p("thread_state.thread_id", self.thread.thread_id),
            p("interpreter_frame.previous", self.frame.previous),
            p("interpreter_frame.executable", self.frame.code),
            p("interpreter_frame.instr_ptr", self.frame.instr),
            p("code_object.filename", self.code.filename),
            p("code_object.name", self.code.name),
            p("code_object.linetable", self.code.linetable),
            p("code_object.firstlineno", self.code.firstlineno),
            p("pyobject.ob_type", self.ob_type),
            p("bytes_object.ob_size", self.bytes.size),
            p("bytes_object.ob_sval", self.bytes.data),
            p("unicode_object.state", self.unicode.state),
            p("unicode_object.length", self.unicode.length),
            p("unicode_object.asciiobject_size", self.unicode.ascii_data),
        ];
        // Every version that publishes `_Py_DebugOffsets` (3.13+) has these.
        let optional = [
            ("thread_state.native_thread_id", self.thread.native_thread_id),
            ("interpreter_frame.owner", self.frame.owner),
            ("code_object.qualname", self.code.qualname),
            ("code_object.co_code_adaptive", self.code.code_adaptive),
        ];
        out.extend(optional.into_iter().filter_map(|(field, value)| Some(p(field, value?))));
        if let FrameLink::Direct { current_frame } = self.thread.frame {
            out.push(p("thread_state.current_frame", current_frame));
        }
        if let GilHolder::Interpreter { last_holder, locked } = self.gil {
            out.push(p("interpreter_state.gil_runtime_state_holder", last_holder));
            out.push(p("interpreter_state.gil_runtime_state_locked", locked));
        }
        out
    }
}

/// The layout of `_Py_DebugOffsets` for one version: after `char
/// cookie[8]`, every field is a `uint64_t`, so field `i` of [`Self::fields`]
/// is at `8 + 8 * i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DebugOffsetsLayout {
    /// The fields in declaration order, `group.field` for those in a
    /// nested struct.
    pub fields: &'static [&'static str],
}

impl DebugOffsetsLayout {
    /// The struct's size.
    #[must_use]
    pub const fn size(&self) -> usize {
        8 + 8 * self.fields.len()
    }

    /// Where `field` is, from the start of the struct.
    #[must_use]
    pub fn offset_of(&self, field: &str) -> Option<usize> {
        self.fields.iter().position(|f| *f == field).map(|i| 8 + 8 * i)
    }

    /// The value of `field` in `bytes` (the struct as read from the
    /// target), if the layout has that field and `bytes` holds it.
    #[must_use]
    pub fn read(&self, bytes: &[u8], field: &str) -> Option<u64> {
        let at = self.offset_of(field)?;
        let word: [u8; 8] = bytes.get(at..at + 8)?.try_into().ok()?;
        Some(u64::from_le_bytes(word))
    }
}

#[cfg(test)]
mod dwarf;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::{PythonVersion, abi_for};

    fn abi(minor: u8) -> &'static dyn crate::python::Abi {
        abi_for(1, PythonVersion { major: 3, minor, micro: 0, level: 0xF, serial: 0 }).expect("supported")
    }

    /// The layouts' sizes are `sizeof(_Py_DebugOffsets)` from the DWARF of
    /// pyenv's 3.13.0 and the forky root's 3.14.8; each field's place there
    /// was compared too when the layouts were written. Every offset the
    /// cross-check reads is in the layout, and the header tracer already
    /// reads agrees with it.
    #[test]
    fn debug_offsets_layouts_hold_every_published_field() {
        for (minor, size) in [(13, 584), (14, 760)] {
            let abi = abi(minor);
            let layout = abi.debug_offsets_layout().expect("3.13+ publish _Py_DebugOffsets");
            assert_eq!(layout.size(), size, "3.{minor}");
            let header = abi.debug_offsets().expect("a header");
            assert_eq!(layout.offset_of("version").map(|o| o as u64), Some(header.version_offset), "3.{minor}");
            for p in abi.frames().published() {
                assert!(layout.offset_of(p.field).is_some(), "3.{minor} has no {}", p.field);
            }
            let mut names = layout.fields.to_vec();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), layout.fields.len(), "3.{minor} names a field twice");
        }
        for minor in [11, 12] {
            assert!(abi(minor).debug_offsets_layout().is_none(), "3.{minor}");
        }
    }

    /// What differs between versions is where the walker's path differs:
    /// the `_PyCFrame` hop before 3.13, the tagged reference in 3.14, the
    /// thread-local current thread from 3.12.
    #[test]
    fn each_version_takes_its_own_path() {
        for minor in [9, 10] {
            let t = abi(minor).frames();
            assert_eq!(t.thread.frame, FrameLink::FrameObject { frame: 24 }, "3.{minor}");
            assert_eq!(t.frame.instr_kind, InstrKind::LastI { unit: if minor == 9 { 1 } else { 2 } }, "3.{minor}");
            assert_eq!((t.frame.owner, t.code.qualname, t.code.code_adaptive), (None, None, None), "3.{minor}");
            assert_eq!(t.thread.native_thread_id, None, "3.{minor}");
            assert!(matches!(t.current_thread, CurrentThread::GilstateCurrent { .. }), "3.{minor}");
            assert!(matches!(t.gil, GilHolder::Runtime { .. }), "3.{minor}");
            let lines = if minor == 9 { LineTableFormat::Lnotab } else { LineTableFormat::Pep626 };
            assert_eq!(t.code.lines, lines, "3.{minor}");
        }
        for minor in [11, 12, 13, 14] {
            let t = abi(minor).frames();
            assert_eq!(t.frame.instr_kind, InstrKind::Pointer, "3.{minor}");
            assert_eq!(t.code.lines, LineTableFormat::Locations, "3.{minor}");
            assert_eq!(matches!(t.thread.frame, FrameLink::ViaCFrame { .. }), minor < 13, "3.{minor}");
            assert_eq!(matches!(t.frame.code_ref, CodeRef::Tagged { mask: 3 }), minor == 14, "3.{minor}");
            assert_eq!(matches!(t.current_thread, CurrentThread::ThreadLocal), minor >= 12, "3.{minor}");
            assert_eq!(matches!(t.gil, GilHolder::Interpreter { .. }), minor >= 12, "3.{minor}");
            // The code units follow the fixed fields.
            assert!(t.code.code_adaptive > t.code.first_traceable, "3.{minor}");
            assert!(t.code.first_traceable.is_some() && t.frame.owner.is_some(), "3.{minor}");
            assert_eq!(t.frame.first_non_python_owner, 3, "3.{minor}");
        }
    }

    /// The BPF walk reads each frame's fields in one read of its first
    /// bytes; every version's fields must fit it.
    #[test]
    fn every_version_s_frame_fields_fit_one_read() {
        for minor in [9, 10, 11, 12, 13, 14] {
            let f = abi(minor).frames().frame;
            let config = tracer_common::stack::WalkConfig {
                frame_code: f.code,
                frame_previous: f.previous,
                frame_instr: f.instr,
                frame_owner: f.owner.unwrap_or(0),
                frame_kind: match f.instr_kind {
                    InstrKind::Pointer => tracer_common::stack::frame_kind::INTERPRETER,
                    InstrKind::LastI { .. } => tracer_common::stack::frame_kind::LASTI,
                },
                ..Default::default()
            };
            let head = config.frame_head().unwrap_or_else(|| panic!("3.{minor}: {f:?} do not fit one read"));
            // 3.9 and 3.10's frame objects reach `f_lasti` at 104 and 96.
            let most = if minor < 11 { 112 } else { 80 };
            assert!(head.bytes <= most, "3.{minor} reads {} bytes of each frame", head.bytes);
        }
    }

    #[test]
    fn instruction_offsets_are_bytes_in_every_version() {
        assert_eq!(InstrKind::Pointer.offset(0x1000 + 184 + 10, 0x1000, 184), 10);
        assert_eq!(InstrKind::Pointer.offset(0x1000 + 184 - 2, 0x1000, 184), -2);
        // f_lasti 7 in 3.10 is the code unit at byte 14; -1 is "not
        // started"; the high 4 bytes (the next field) are ignored.
        assert_eq!(InstrKind::LastI { unit: 2 }.offset(0xdead_0000_0007, 0x1000, 0), 14);
        assert_eq!(InstrKind::LastI { unit: 2 }.offset(0x0000_0001_ffff_ffff, 0x1000, 0), -2);
        assert_eq!(InstrKind::LastI { unit: 1 }.offset(0xffff_ffff, 0, 0), -1);
        assert_eq!(InstrKind::LastI { unit: 1 }.offset(30, 0, 0), 30);
    }

    #[test]
    fn tagged_code_refs_drop_their_tag_bits() {
        let tagged = CodeRef::Tagged { mask: 3 };
        assert_eq!(tagged.object(0x7f00_1230), Some(0x7f00_1230));
        assert_eq!(tagged.object(0x7f00_1231), Some(0x7f00_1230));
        // A tagged integer (Py_INT_TAG) is no object.
        assert_eq!(tagged.object(0x7f00_1233), None);
        assert_eq!(CodeRef::Pointer.object(0x7f00_1231), Some(0x7f00_1231));
        // NULL, and PyStackRef_NULL (Py_TAG_REFCNT alone).
        assert_eq!(CodeRef::Pointer.object(0), None);
        assert_eq!(tagged.object(1), None);
        assert!(CodeRef::Pointer.is_null(0) && tagged.is_null(1) && tagged.is_null(0));
        assert!(!tagged.is_null(3) && !tagged.is_null(0x7f00_1231) && !CodeRef::Pointer.is_null(8));
    }

    #[test]
    fn layout_offsets_count_words_after_the_cookie() {
        let layout = DebugOffsetsLayout { fields: &["version", "free_threaded", "runtime_state.size"] };
        assert_eq!(layout.offset_of("version"), Some(8));
        assert_eq!(layout.offset_of("runtime_state.size"), Some(24));
        assert_eq!(layout.offset_of("nope"), None);
        assert_eq!(layout.size(), 32);
        let mut bytes = vec![0u8; 32];
        bytes[24] = 0x2a;
        assert_eq!(layout.read(&bytes, "runtime_state.size"), Some(0x2a));
        assert_eq!(layout.read(&bytes[..30], "runtime_state.size"), None);
    }
}
