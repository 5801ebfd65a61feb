//! The walk itself: `_PyRuntime` → interpreters → thread states → frames →
//! code objects → names, files and lines.

use std::{
    collections::{HashMap, HashSet},
    rc::Rc,
};

use super::{StackError, linetable, remote::Remote};
use crate::python::frames::{FrameLink, FrameOffsets, GilHolder, LineTableFormat, OWNED_BY_GENERATOR};

/// At most this many interpreters and thread states are followed: more is
/// a list read from the wrong place.
const MAX_INTERPRETERS: usize = 256;
const MAX_THREADS: usize = 1 << 16;
/// The longest line table (in bytes) read: a huge function's is far
/// shorter. (A string is read only as far as it is kept: `text::MAX_NAME`.)
const MAX_LINETABLE: u64 = 1 << 24;
/// How many times a thread's frames are read before its error is
/// reported.
const READ_ATTEMPTS: usize = 3;

/// The runtime addresses of the types objects are checked against.
#[derive(Clone, Copy, Debug)]
pub struct Types {
    /// `PyCode_Type`.
    pub code: u64,
    /// `PyUnicode_Type`.
    pub unicode: u64,
    /// `PyBytes_Type`.
    pub bytes: u64,
}

/// One Python frame, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// `co_qualname`: `leaf`, `Class.method`, `outer.<locals>.inner`,
    /// `<module>`.
    pub function: String,
    /// `co_filename`, as the code was compiled.
    pub file: String,
    /// The line of the frame's instruction; `None` where the line table
    /// gives it no location.
    pub line: Option<u32>,
    /// The code object's address (what the BPF walker will record).
    pub code: u64,
    /// The instruction's byte offset in the code (what it will record
    /// beside it).
    pub offset: i64,
}

/// A thread's frames, innermost first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frames {
    pub frames: Vec<Frame>,
    /// Whether the walk stopped at the depth limit with frames left.
    pub truncated: bool,
}

/// One thread state and its stack.
#[derive(Debug)]
pub struct ThreadStack {
    /// The `PyThreadState *`.
    pub tstate: u64,
    /// `thread_id`: its `pthread_t`.
    pub thread_id: u64,
    /// `native_thread_id`: its TID in the process's PID namespace; `None`
    /// before 3.11, whose thread states do not record it.
    pub native_thread_id: Option<u64>,
    /// Whether it is the thread that initialised Python
    /// (`_PyRuntime.main_thread`).
    pub main: bool,
    /// Whether it holds its interpreter's GIL now.
    pub holds_gil: bool,
    /// Its frames, or why they could not be read.
    pub frames: Result<Frames, StackError>,
}

/// What a code object says of itself, read once per code object.
#[derive(Debug)]
struct Code {
    function: String,
    file: String,
    first_line: i32,
    /// `_co_firsttraceable` in code units; `None` before 3.11, where every
    /// linked frame is shown, one at `f_lasti` -1 (not started) at its
    /// first line, as `PyCode_Addr2Line` gives it.
    first_traceable: Option<i64>,
    linetable: Vec<u8>,
}

/// Reads stacks in one process with one version's table.
#[derive(Debug)]
pub struct Walker {
    remote: Rc<Remote>,
    table: FrameOffsets,
    types: Types,
    codes: HashMap<u64, Code>,
}

impl Walker {
    pub fn new(remote: Rc<Remote>, table: &FrameOffsets, types: Types) -> Self {
        Self { remote, table: *table, types, codes: HashMap::new() }
    }

    fn pid(&self) -> u32 {
        self.remote.pid()
    }

    /// The table it walks with.
    pub const fn table(&self) -> &FrameOffsets {
        &self.table
    }

    /// Every thread state of every interpreter, each with its stack of at
    /// most `max_depth` frames; past [`MAX_INTERPRETERS`] interpreters or
    /// [`MAX_THREADS`] thread states, those read so far and why the rest
    /// are not.
    pub fn threads(
        &mut self,
        runtime: u64,
        max_depth: usize,
    ) -> Result<(Vec<ThreadStack>, Option<String>), StackError> {
        let r = Rc::clone(&self.remote);
        let t = self.table;
        let main_thread = r.u64(runtime.wrapping_add(t.runtime.main_thread), "_PyRuntime.main_thread")?;
        let runtime_holder = match t.gil {
            GilHolder::Runtime { last_holder, locked } => gil_holder(&r, runtime, last_holder, locked)?,
            GilHolder::Interpreter { .. } => None,
        };
        let mut interp = r.u64(runtime.wrapping_add(t.runtime.interpreters_head), "_PyRuntime.interpreters.head")?;
        if interp == 0 {
            return Err(StackError::NoInterpreter { pid: self.pid() });
        }
        let mut interpreters = HashSet::new();
        let mut threads = Vec::new();
        while interp != 0 {
            if !interpreters.insert(interp) {
                return Err(StackError::Cycle { pid: self.pid(), what: "interpreters", address: interp });
            }
            if interpreters.len() > MAX_INTERPRETERS {
                let why = format!("more than {MAX_INTERPRETERS} interpreters: the threads of the rest are not read");
                return Ok((threads, Some(why)));
            }
            let holder = match t.gil {
                GilHolder::Runtime { .. } => runtime_holder,
                GilHolder::Interpreter { last_holder, locked } => gil_holder(&r, interp, last_holder, locked)?,
            };
            let mut tstate =
                r.u64(interp.wrapping_add(t.interpreter.threads_head), "the interpreter's threads.head")?;
            while tstate != 0 {
                if threads.iter().any(|s: &ThreadStack| s.tstate == tstate) {
                    return Err(StackError::Cycle { pid: self.pid(), what: "thread states", address: tstate });
                }
                if threads.len() >= MAX_THREADS {
                    let why = format!("more than {MAX_THREADS} thread states: the rest are not read");
                    return Ok((threads, Some(why)));
                }
                let thread_id = r.u64(tstate.wrapping_add(t.thread.thread_id), "a thread state's thread_id")?;
                threads.push(ThreadStack {
                    tstate,
                    thread_id,
                    native_thread_id: match t.thread.native_thread_id {
                        Some(at) => Some(r.u64(tstate.wrapping_add(at), "a thread state's native_thread_id")?),
                        None => None,
                    },
                    main: thread_id == main_thread,
                    holds_gil: holder == Some(tstate),
                    frames: self.frames_of_a_moment(tstate, max_depth),
                });
                tstate = r.u64(tstate.wrapping_add(t.thread.next), "a thread state's next")?;
            }
            interp = r.u64(interp.wrapping_add(t.interpreter.next), "an interpreter's next")?;
        }
        Ok((threads, None))
    }

    /// [`Self::frames`], read again where a read failed: a thread that
    /// runs while it is read can return from a frame between the reads
    /// of it and of its caller, and a later read then sees a stack that
    /// holds still long enough.
    fn frames_of_a_moment(&mut self, tstate: u64, max_depth: usize) -> Result<Frames, StackError> {
        let mut result = self.frames(tstate, max_depth);
        for _ in 1..READ_ATTEMPTS {
            if result.is_ok() {
                break;
            }
            result = self.frames(tstate, max_depth);
        }
        result
    }

    /// The frames of the thread state at `tstate`, innermost first,
    /// without the frames that are not Python functions' (the C stack's
    /// entry frames) or have not started (`_PyFrame_IsIncomplete`), as
    /// tracebacks show them.
    pub fn frames(&mut self, tstate: u64, max_depth: usize) -> Result<Frames, StackError> {
        let r = Rc::clone(&self.remote);
        let f = self.table.frame;
        let mut frame = match self.table.thread.frame {
            FrameLink::ViaCFrame { cframe, current_frame } => {
                match r.u64(tstate.wrapping_add(cframe), "a thread state's cframe")? {
                    0 => 0,
                    cframe => r.u64(cframe.wrapping_add(current_frame), "a _PyCFrame's current_frame")?,
                }
            }
            FrameLink::Direct { current_frame } => {
                r.u64(tstate.wrapping_add(current_frame), "a thread state's current_frame")?
            }
            FrameLink::FrameObject { frame } => r.u64(tstate.wrapping_add(frame), "a thread state's frame")?,
        };
        // `f_lasti` (3.9, 3.10) is a 4-byte int: reading 8 bytes from it
        // stays inside the frame object, whose `f_lineno` follows it.
        let owner_end = f.owner.map_or(0, |o| o + 1);
        let span = usize_of([f.code + 8, f.previous + 8, f.instr + 8, owner_end].into_iter().max().unwrap_or(0));
        let mut seen = HashSet::new();
        let mut frames = Vec::new();
        while frame != 0 {
            if frames.len() == max_depth {
                return Ok(Frames { frames, truncated: true });
            }
            if !seen.insert(frame) {
                return Err(StackError::Cycle { pid: self.pid(), what: "frames", address: frame });
            }
            // One read for the fields of the frame, as the BPF walker will
            // do: they are then at least of one moment.
            let bytes = r.bytes(frame, span, "a frame")?;
            // Before 3.11 every frame is a Python function's: owner 0.
            let owner = f.owner.map_or(0, |o| bytes.get(usize_of(o)).copied().unwrap_or(u8::MAX));
            let previous = word(&bytes, f.previous);
            if owner < f.first_non_python_owner
                && let Some(found) = self.python_frame(frame, owner, &bytes)?
            {
                frames.push(found);
            }
            frame = previous;
        }
        Ok(Frames { frames, truncated: false })
    }

    /// The Python function's frame at `frame` (owned by `owner`, its
    /// fields in `bytes`), resolved as [`Self::resolve`] does.
    fn python_frame(&mut self, frame: u64, owner: u8, bytes: &[u8]) -> Result<Option<Frame>, StackError> {
        let f = self.table.frame;
        let raw = word(bytes, f.code);
        let code = if f.code_ref.is_null(raw) {
            0
        } else {
            f.code_ref.object(raw).ok_or(StackError::NoCode { pid: self.pid(), frame, raw })?
        };
        let offset = f.instr_kind.offset(word(bytes, f.instr), code, self.table.code.code_adaptive.unwrap_or(0));
        self.resolve(code, offset, owner)
    }

    /// One frame as the BPF walker records it, resolved: `code` the code
    /// object's address (tag bits cleared), `offset` the instruction's byte
    /// offset from `co_code_adaptive` (negative for a frame that has not
    /// started: 3.11's `prev_instr` is then one code unit before the code),
    /// `owner` the frame's owner. `None` for a frame that is not a Python
    /// function's (the C stack's entry frames, 3.14's base frame), or is
    /// being set up or torn down: a NULL code (3.14's `PyStackRef_NULL` for
    /// a moment), or an instruction before `_co_firsttraceable`
    /// (`_PyFrame_IsIncomplete`), which tracebacks leave out too.
    pub fn resolve(&mut self, code: u64, offset: i64, owner: u8) -> Result<Option<Frame>, StackError> {
        if owner >= self.table.frame.first_non_python_owner || code == 0 {
            return Ok(None);
        }
        let pid = self.pid();
        let format = self.table.code.lines;
        let info = self.code(code)?;
        // `_co_firsttraceable` is in code units.
        if owner != OWNED_BY_GENERATOR && info.first_traceable.is_some_and(|first| offset < 2 * first) {
            return Ok(None);
        }
        let line = match format {
            LineTableFormat::Locations => linetable::line_at(&info.linetable, info.first_line, offset),
            LineTableFormat::Pep626 => linetable::line_at_pep626(&info.linetable, info.first_line, offset),
            LineTableFormat::Lnotab => linetable::line_at_lnotab(&info.linetable, info.first_line, offset),
        }
        .map_err(|cause| StackError::LineTable { pid, code, cause })?;
        Ok(Some(Frame { function: info.function.clone(), file: info.file.clone(), line, code, offset }))
    }

    /// The code object at `address`, read the first time it is met.
    fn code(&mut self, address: u64) -> Result<&Code, StackError> {
        let code = match self.codes.remove(&address) {
            Some(code) => code,
            None => self.read_code(address)?,
        };
        Ok(self.codes.entry(address).or_insert(code))
    }

    fn read_code(&self, address: u64) -> Result<Code, StackError> {
        let r = &self.remote;
        let c = self.table.code;
        self.expect_type(address, "code object", self.types.code, "code object")?;
        let first_line = r.u32(address.wrapping_add(c.firstlineno), "a code object's co_firstlineno")?;
        let first_traceable = match c.first_traceable {
            Some(at) => Some(r.u32(address.wrapping_add(at), "a code object's _co_firsttraceable")?),
            None => None,
        };
        // Before 3.11 a code object has no qualified name: its `co_name`.
        let (name_at, name_field, name_what) = match c.qualname {
            Some(at) => (at, "a code object's co_qualname", "co_qualname"),
            None => (c.name, "a code object's co_name", "co_name"),
        };
        Ok(Code {
            function: self.string(r.u64(address.wrapping_add(name_at), name_field)?, name_what)?,
            file: self
                .string(r.u64(address.wrapping_add(c.filename), "a code object's co_filename")?, "co_filename")?,
            // Both are C ints.
            first_line: i32::from_le_bytes(first_line.to_le_bytes()),
            first_traceable: first_traceable.map(|f| i64::from(i32::from_le_bytes(f.to_le_bytes()))),
            linetable: self
                .bytes(r.u64(address.wrapping_add(c.linetable), "a code object's co_linetable")?, "co_linetable")?,
        })
    }

    /// Fails unless the object at `address` has the type at `type_address`.
    fn expect_type(
        &self,
        address: u64,
        what: &'static str,
        type_address: u64,
        expected: &'static str,
    ) -> Result<(), StackError> {
        let field = match expected {
            "code object" => "a code object's ob_type",
            "str" => "a str's ob_type",
            _ => "an object's ob_type",
        };
        let found = self.remote.u64(address.wrapping_add(self.table.ob_type), field)?;
        if found == type_address {
            Ok(())
        } else {
            Err(StackError::WrongType { pid: self.pid(), what, address, expected, found })
        }
    }

    /// The `str` at `address`, in the compact layout every code object's
    /// strings have (`PyUnicode_New` makes no other).
    fn string(&self, address: u64, what: &'static str) -> Result<String, StackError> {
        let r = &self.remote;
        let u = self.table.unicode;
        self.expect_type(address, what, self.types.unicode, "str")?;
        let bad = |reason: String| StackError::BadString { pid: self.pid(), what, address, reason };
        let state = r.u32(address.wrapping_add(u.state), "a str's state")?;
        let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1 == 1, (state >> 6) & 1 == 1);
        if !compact {
            return Err(bad(format!("it is not compact (state {state:#x})")));
        }
        // Only as much as is kept is read: a longer name is cut (by
        // `bound`, below), not refused, whatever length the target claims.
        let length = r.u64(address.wrapping_add(u.length), "a str's length")?.min(crate::text::MAX_NAME as u64 + 1);
        let data = address.wrapping_add(if ascii { u.ascii_data } else { u.compact_data });
        let width = match kind {
            1 | 2 | 4 => u64::from(kind),
            _ => return Err(bad(format!("its kind is {kind}"))),
        };
        let len = usize::try_from(length * width).map_err(|_| bad("too long".to_owned()))?;
        let raw = r.bytes(data, len, "a str's characters")?;
        // A lone surrogate is a valid Python `str` (a file name that is
        // not UTF-8 is decoded with surrogateescape: `/tmp/x\udcff.py`) but
        // no Rust `char`: it is shown as U+FFFD, as the heap census shows
        // it in a type's name, rather than losing the whole stack to it.
        let unit = |u: u32| char::from_u32(u).unwrap_or(char::REPLACEMENT_CHARACTER);
        let text: String = match width {
            1 => raw.iter().map(|&b| char::from(b)).collect(),
            2 => raw.chunks_exact(2).map(|c| unit(u32::from(u16::from_le_bytes([c[0], c[1]])))).collect(),
            _ => raw.chunks_exact(4).map(|c| unit(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
        };
        // Kept bounded: the name is the target's to choose, and every
        // report keeps it ([`crate::text`]).
        Ok(crate::text::bound(&text))
    }

    /// The `bytes` object at `address`'s contents.
    fn bytes(&self, address: u64, what: &'static str) -> Result<Vec<u8>, StackError> {
        let r = &self.remote;
        self.expect_type(address, what, self.types.bytes, "bytes")?;
        let size = r.u64(address.wrapping_add(self.table.bytes.size), "a bytes object's size")?;
        if size > MAX_LINETABLE {
            let reason = format!("its size {size} is beyond {MAX_LINETABLE}");
            return Err(StackError::BadString { pid: self.pid(), what, address, reason });
        }
        let len = usize::try_from(size).unwrap_or(usize::MAX);
        r.bytes(address.wrapping_add(self.table.bytes.data), len, "a bytes object's contents")
    }
}

/// The 8-byte field at `at` of `bytes`, read whole from the target (0
/// where `bytes` is too short, which a whole read is not).
fn word(bytes: &[u8], at: u64) -> u64 {
    let at = usize_of(at);
    bytes.get(at..at.saturating_add(8)).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes)
}

/// A table offset as an index: they are all small.
fn usize_of(offset: u64) -> usize {
    usize::try_from(offset).unwrap_or(usize::MAX)
}

/// The thread state holding the GIL at `base.wrapping_add(last_holder)`, if its
/// `locked` is set.
fn gil_holder(r: &Remote, base: u64, last_holder: u64, locked: u64) -> Result<Option<u64>, StackError> {
    if r.u32(base.wrapping_add(locked), "the GIL's locked")? == 0 {
        return Ok(None);
    }
    Ok(Some(r.u64(base.wrapping_add(last_holder), "the GIL's last_holder")?).filter(|&t| t != 0))
}
