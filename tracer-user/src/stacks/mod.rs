//! Python stacks read from outside a live process, with
//! `process_vm_readv`: every thread's frames resolved to (qualified name, file,
//! line). The ground truth for the BPF walker to come: it proves the
//! per-version tables ([`crate::python::frames`]) on real processes, and
//! says per process how the BPF side will find the current thread's state
//! ([`CurrentThreadState`]).
//!
//! The walk needs no debug info and no symbol beyond the exported
//! `_PyRuntime`, `PyCode_Type`, `PyUnicode_Type` and `PyBytes_Type`, so it
//! works on LTO builds whose `.symtab` is gone. The target is not stopped:
//! a thread that runs while it is read can show a frame that just
//! returned, or a frame list that changed under the reader, which is then
//! an error for that thread, never a panic.
//!
//! For the BPF step, [`Process`] gives what a walker at events needs: the
//! current thread's state by [`Process::current_thread_state`] (an address
//! for 3.9 to 3.11, fsbase plus an offset, or a DTV module and offset;
//! `NULL` on a thread without the GIL, and 3.9 to 3.11's is the GIL
//! holder's, so check the state's `native_thread_id` against the event's
//! TID in the target's PID namespace, or before 3.11, which records no TID,
//! its `thread_id` against the event thread's fsbase); from [`Process::offsets`] the way to the innermost frame
//! (`thread.frame`: the `_PyCFrame` hop before 3.13), the frame's `code`,
//! `previous`, `instr` and `owner`, the tag mask of 3.14's `_PyStackRef`,
//! and `code.code_adaptive`, from which an instruction's offset counts;
//! and [`Process::resolve`] for each recorded (code, offset, owner), which
//! leaves out frames that are not Python functions' or are being set up or
//! torn down, so a walker can record every frame as it finds it. An offset
//! is negative for a frame that has not started (3.11's `prev_instr` is
//! one code unit before the code), so one stored in 32 bits must be
//! sign-extended again.

pub mod fsbase;
pub mod linetable;
mod offsets;
pub mod print;
pub mod remote;
pub mod tls;
mod walk;

use std::{path::PathBuf, rc::Rc};

use thiserror::Error;

pub use self::walk::{Frame, Frames, ThreadStack};
use self::{remote::Remote, tls::TlsSlot};
use crate::{
    discover::{
        process::{Target, TargetError},
        version::{self, VersionReadError},
    },
    python::{
        self, PythonVersion, VersionError,
        frames::{CurrentThread, FrameOffsets},
    },
};

/// The most frames read per thread unless asked otherwise; a deeper stack
/// is cut there and marked truncated.
pub const DEFAULT_MAX_DEPTH: usize = 1024;

/// Why a stack could not be read.
#[derive(Debug, Error)]
pub enum StackError {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    VersionRead(#[from] VersionReadError),
    #[error(transparent)]
    Version(#[from] VersionError),
    #[error("cannot read {what} of PID {pid} at {address:#x}: {cause}")]
    Memory { pid: u32, address: u64, what: &'static str, cause: std::io::Error },
    #[error("cannot read {what} of PID {pid}: the process has exited")]
    Exited { pid: u32, what: &'static str },
    #[error(
        "{image} (PID {pid}) defines no {symbol}, which every supported CPython exports; is it really the interpreter?"
    )]
    NoSymbol { pid: u32, image: String, symbol: &'static str },
    #[error("{what} of PID {pid} (link-time address {address:#x}) is not mapped in its memory")]
    NotMapped { pid: u32, what: &'static str, address: u64 },
    #[error("_Py_DebugOffsets of PID {pid} ({image}) {reason}")]
    DebugOffsets { pid: u32, image: String, reason: String },
    #[error(
        "_Py_DebugOffsets of PID {pid} ({image}) says {field} is {published}, but tracer's table for Python {version} says {table}"
    )]
    OffsetMismatch { pid: u32, image: String, version: PythonVersion, field: &'static str, published: u64, table: u64 },
    #[error(
        "PID {pid} ({image}) runs a free-threaded CPython, whose frames and strings tracer does not read yet; use a build with the GIL"
    )]
    FreeThreaded { pid: u32, image: String },
    #[error(
        "PID {pid} has no Python interpreter (_PyRuntime.interpreters.head is NULL): it has not initialised Python yet, or has finalised it"
    )]
    NoInterpreter { pid: u32 },
    #[error(
        "the {what} of PID {pid} loop back to {address:#x}; it changed while being read, or is not what tracer takes it for"
    )]
    Cycle { pid: u32, what: &'static str, address: u64 },
    #[error("the {what} at {address:#x} in PID {pid} is not a {expected} (its type is at {found:#x})")]
    WrongType { pid: u32, what: &'static str, address: u64, expected: &'static str, found: u64 },
    #[error("the frame at {frame:#x} in PID {pid} holds no code object (its f_executable is {raw:#x})")]
    NoCode { pid: u32, frame: u64, raw: u64 },
    #[error("the {what} at {address:#x} in PID {pid} cannot be read as a string: {reason}")]
    BadString { pid: u32, what: &'static str, address: u64, reason: String },
    #[error("the line table of the code object at {code:#x} in PID {pid}: {cause}")]
    LineTable { pid: u32, code: u64, cause: linetable::LineTableError },
    #[error("the frames of {failed} of {threads} threads could not be read (see above)")]
    Unread { failed: usize, threads: usize },
}

impl crate::error::Classify for StackError {
    /// A PID that is not a supported CPython; what is read from one that
    /// is can fail for tracer's reasons or the process's.
    fn is_bad_input(&self) -> bool {
        match self {
            Self::Target(_) | Self::VersionRead(_) | Self::Version(_) | Self::NoSymbol { .. } => true,
            Self::Memory { .. }
            | Self::Exited { .. }
            | Self::NotMapped { .. }
            | Self::DebugOffsets { .. }
            | Self::OffsetMismatch { .. }
            | Self::FreeThreaded { .. }
            | Self::NoInterpreter { .. }
            | Self::Cycle { .. }
            | Self::WrongType { .. }
            | Self::NoCode { .. }
            | Self::BadString { .. }
            | Self::LineTable { .. }
            | Self::Unread { .. } => false,
        }
    }
}

/// How the BPF side will find the state of the thread an event is on, in
/// this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CurrentThreadState {
    /// 3.11: the pointer at `address` (in `_PyRuntime`), while the thread
    /// holds the GIL; `now` is what it held when read.
    Gilstate { address: u64, now: u64 },
    /// 3.12+: the thread-local `_Py_tss_tstate`, at fsbase +
    /// `offset`.
    FsRelative { offset: i64 },
    /// 3.12+ in a shared libpython: the thread-local through the thread's
    /// DTV, at entry `module`, `offset` into the block.
    Dynamic { module: u64, offset: u64 },
}

/// Every thread's stack in one process.
#[derive(Debug)]
pub struct Stacks {
    pub pid: u32,
    /// Its PID in its own PID namespace, where that differs.
    pub pid_in_namespace: Option<u32>,
    pub version: PythonVersion,
    /// The interpreter image, as the process's maps name it.
    pub image: PathBuf,
    /// The process's threads with a Python thread state, newest first (the
    /// order of the interpreter's list).
    pub threads: Vec<ThreadStack>,
    /// Why the list stops before its end, where it does (past the most
    /// interpreters or thread states read).
    pub cut: Option<String>,
    /// How the current thread's state is found, or why it is not.
    pub current: Result<CurrentThreadState, String>,
    /// With [`Options::check_tls`], each task's `_Py_tss_tstate` read
    /// through its fsbase, or why it could not be.
    pub tls_check: Option<Result<Vec<TaskTls>, String>>,
}

/// One task's thread-local thread state, as the BPF walker will read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskTls {
    /// The task's TID, as tracer sees it.
    pub tid: u32,
    pub fsbase: u64,
    /// What `_Py_tss_tstate` holds (0 for a thread without a thread
    /// state), or `None` where its TLS block is not allocated.
    pub thread_state: Option<u64>,
}

/// What [`read`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// At most this many frames per thread.
    pub max_depth: usize,
    /// Also read each task's `_Py_tss_tstate` through its fsbase (3.12+),
    /// stopping each task for a moment with ptrace.
    pub check_tls: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self { max_depth: DEFAULT_MAX_DEPTH, check_tls: false }
    }
}

/// Reads the stacks of every thread of `pid`.
pub fn read(pid: u32, options: Options) -> Result<Stacks, StackError> {
    let mut process = Process::open(pid)?;
    let (threads, cut) = process.threads(options.max_depth)?;
    let current = process.current_thread_state();
    let tls_check = options.check_tls.then(|| process.check_tls());
    let Process { target, version, .. } = process;
    Ok(Stacks {
        pid,
        pid_in_namespace: target.ns_pid,
        version,
        image: target.image_path,
        threads,
        cut,
        current,
        tls_check,
    })
}

/// A live CPython process whose frames can be read: its image, version and
/// `_PyRuntime` found, its version's table checked against what it
/// publishes. What the BPF step needs from userspace: the table to load
/// into the walker ([`Process::offsets`], [`Process::current_thread_state`])
/// and the resolution of the (code, offset, owner) frames it records
/// ([`Process::resolve`]), each code object read once.
#[derive(Debug)]
pub struct Process {
    pub target: Target,
    pub version: PythonVersion,
    /// The target's `_PyRuntime`.
    pub runtime: u64,
    remote: Rc<Remote>,
    walker: walk::Walker,
}

impl Process {
    /// Inspects `pid` and checks its version's table in it.
    pub fn open(pid: u32) -> Result<Self, StackError> {
        let target = Target::inspect(pid)?;
        let version = version::read(version::Source::Process(&target))?;
        let abi = python::abi_for(pid, version)?;
        let remote = Rc::new(Remote::open(pid));
        let runtime = symbol_address(&target, "_PyRuntime")?;
        let table = offsets::checked(&target, &remote, abi, version, runtime)?;
        let types = walk::Types {
            code: symbol_address(&target, "PyCode_Type")?,
            unicode: symbol_address(&target, "PyUnicode_Type")?,
            bytes: symbol_address(&target, "PyBytes_Type")?,
        };
        let walker = walk::Walker::new(Rc::clone(&remote), &table, types);
        Ok(Self { target, version, runtime, remote, walker })
    }

    /// The version's table, as checked in this process.
    #[must_use]
    pub const fn offsets(&self) -> &FrameOffsets {
        self.walker.table()
    }

    /// Every thread state with its stack, at most `max_depth` frames each.
    pub fn threads(&mut self, max_depth: usize) -> Result<(Vec<ThreadStack>, Option<String>), StackError> {
        self.walker.threads(self.runtime, max_depth)
    }

    /// One frame as the BPF walker records it, resolved: `code` the code
    /// object's address (tag bits cleared), `offset` the instruction's byte
    /// offset from `co_code_adaptive`, `owner` the frame's owner. `None`
    /// for a frame that is not a Python function's (the C stack's entry
    /// frames, 3.14's base frame) or is being set up or torn down (a NULL
    /// code, or an instruction before `_co_firsttraceable`), which
    /// tracebacks leave out too.
    pub fn resolve(&mut self, code: u64, offset: i64, owner: u8) -> Result<Option<Frame>, StackError> {
        self.walker.resolve(code, offset, owner)
    }

    /// How the state of the thread an event is on is found in this
    /// process, or why it cannot be.
    pub fn current_thread_state(&self) -> Result<CurrentThreadState, String> {
        let image = self.target.image_path.display().to_string();
        match self.offsets().current_thread {
            CurrentThread::GilstateCurrent { tstate_current } => {
                let address = self.runtime.wrapping_add(tstate_current);
                self.remote
                    .u64(address, "_PyRuntime.gilstate.tstate_current")
                    .map(|now| CurrentThreadState::Gilstate { address, now })
                    .map_err(|e| e.to_string())
            }
            CurrentThread::ThreadLocal => thread_local(&self.target, &self.remote, &image),
        }
    }

    /// Each task's `_Py_tss_tstate`, read through its fsbase (3.12+),
    /// stopping each task for a moment with ptrace.
    pub fn check_tls(&self) -> Result<Vec<TaskTls>, String> {
        match self.offsets().current_thread {
            CurrentThread::GilstateCurrent { .. } => {
                Err(format!("Python {} keeps no thread state in thread-local storage", self.version))
            }
            CurrentThread::ThreadLocal => {
                check_tls(&self.target, &self.remote, &self.target.image_path.display().to_string())
            }
        }
    }
}

/// Where this process's `_Py_tss_tstate` is, as far as that is the same
/// for every thread.
fn thread_local(target: &Target, remote: &Remote, image: &str) -> Result<CurrentThreadState, String> {
    let slot = TlsSlot::find(&target.elf, image).map_err(|e| e.to_string())?;
    match slot {
        TlsSlot::FsRelative { offset } => Ok(CurrentThreadState::FsRelative { offset }),
        TlsSlot::TlsIndex { .. } => match slot.dynamic(remote, |a| runtime_address(target, a)) {
            Ok(Some(d)) => Ok(CurrentThreadState::Dynamic { module: d.module, offset: d.offset }),
            Ok(None) => Err("no tls_index".to_owned()),
            Err(e) => Err(e.to_string()),
        },
    }
}

/// Each task's `_Py_tss_tstate`, read through its fsbase.
fn check_tls(target: &Target, remote: &Remote, image: &str) -> Result<Vec<TaskTls>, String> {
    let slot = TlsSlot::find(&target.elf, image).map_err(|e| e.to_string())?;
    let dir = format!("/proc/{}/task", target.pid);
    let mut tids: Vec<u32> = std::fs::read_dir(&dir)
        .map_err(|e| format!("cannot list {dir}: {e}"))?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    tids.iter()
        .map(|&tid| {
            let fsbase = fsbase::of_task(tid).map_err(|e| format!("cannot read the fsbase of task {tid}: {e}"))?;
            let at = slot.resolve(remote, fsbase, |a| runtime_address(target, a)).map_err(|e| e.to_string())?;
            let thread_state = match at {
                Some(at) => Some(remote.u64(at, "_Py_tss_tstate").map_err(|e| e.to_string())?),
                None => None,
            };
            Ok(TaskTls { tid, fsbase, thread_state })
        })
        .collect()
}

/// Where the image's link-time address `address` is in the target, where
/// the file maps it.
fn runtime_address(target: &Target, address: u64) -> Option<u64> {
    target.address_of_file_offset(target.elf.file_offset(address)?)
}

/// The target's address of the image's exported `symbol`.
fn symbol_address(target: &Target, symbol: &'static str) -> Result<u64, StackError> {
    let image = || target.image_path.display().to_string();
    if let Some(address) = target.elf.zero_filled(symbol) {
        // In .bss (3.9's `_PyRuntime`): where the file's first segment is
        // mapped gives the load bias.
        let bias = target
            .elf
            .anchor()
            .and_then(|(vaddr, offset)| Some(target.address_of_file_offset(offset)?.wrapping_sub(vaddr)));
        return bias.map(|b| address.wrapping_add(b)).ok_or(StackError::NotMapped {
            pid: target.pid,
            what: symbol,
            address,
        });
    }
    let sym =
        target.elf.symbol(symbol).ok_or_else(|| StackError::NoSymbol { pid: target.pid, image: image(), symbol })?;
    target.address_of_file_offset(sym.file_offset).ok_or(StackError::NotMapped {
        pid: target.pid,
        what: symbol,
        address: sym.address,
    })
}
