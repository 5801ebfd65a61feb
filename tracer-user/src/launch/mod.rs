//! `tracer run`: starts a program under ptrace, follows its process
//! through its execs (a shell script, `env`, a pyenv shim) to the first
//! CPython interpreter it runs, and holds it at that program's entry point
//! (every library mapped and relocated, none of the program's code run)
//! for the probes to go live; then lets it go ([`Child::release`]), passes
//! signals on to it ([`signals`]) and its exit status back.
//!
//! Only the command's own process is followed: a process it starts is not
//! (a wrapper that forks the interpreter rather than exec'ing it is told
//! so). A program that never runs an interpreter is refused at its exit.

pub mod signals;

use std::{
    ffi::OsString,
    io,
    os::unix::{fs::FileExt as _, process::CommandExt as _},
    path::PathBuf,
    process::Command,
};

use thiserror::Error;

use crate::{
    discover::process::{Target, TargetError},
    error::Classify,
};

/// Why the command could not be started and held.
#[derive(Debug, Error)]
pub enum LaunchError {
    #[error("cannot run {program}: {cause}; pass a program on PATH or its path, after `--`")]
    Spawn { program: String, cause: io::Error },
    #[error(
        "{program} (PID {pid}) {status} before it ran a CPython interpreter; tracer run follows the command's own process through exec, not the processes it starts: run the interpreter itself (e.g. `tracer run -- python3 app.py`)"
    )]
    NoPython { program: String, pid: u32, status: ExitStatus },
    /// The interpreter it runs cannot be traced (its version, its image).
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error("following PID {pid} to its interpreter with ptrace ({what})")]
    Ptrace { pid: u32, what: &'static str, source: io::Error },
}

impl Classify for LaunchError {
    fn is_bad_input(&self) -> bool {
        match self {
            // A program that is not there or not executable; not a
            // refused ptrace or a failed fork.
            Self::Spawn { cause, .. } => {
                matches!(cause.kind(), io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied)
                    || cause.raw_os_error() == Some(libc::ENOEXEC)
            }
            Self::NoPython { .. } => true,
            Self::Target(e) => e.is_bad_input(),
            Self::Ptrace { .. } => false,
        }
    }
}

/// How a process ended, as a shell reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    Code(u8),
    Signal(i32),
}

impl ExitStatus {
    /// From a `waitpid` status of an ended process.
    const fn from_wait(status: i32) -> Self {
        if libc::WIFSIGNALED(status) {
            Self::Signal(libc::WTERMSIG(status))
        } else {
            // WEXITSTATUS is the low 8 bits of exit()'s argument.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "0-255 by definition")]
            Self::Code(libc::WEXITSTATUS(status) as u8)
        }
    }

    /// The exit status `tracer run` ends with: the program's own, or 128
    /// plus the signal that killed it, as a shell gives.
    #[must_use]
    pub fn code(self) -> u8 {
        match self {
            Self::Code(code) => code,
            Self::Signal(signal) => u8::try_from(128 + signal).unwrap_or(u8::MAX),
        }
    }
}

impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Code(code) => write!(f, "exited with status {code}"),
            Self::Signal(signal) => write!(f, "was killed by signal {signal} ({})", signal_name(*signal)),
        }
    }
}

/// The usual name of `signal`.
#[must_use]
pub fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGABRT => "SIGABRT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        _ => "another signal",
    }
}

/// The program `tracer run` started: held at its interpreter until
/// released; killed if dropped before (it runs traced or not at all).
#[derive(Debug)]
pub struct Child {
    pid: u32,
    /// The interpreter it runs.
    pub interpreter: PathBuf,
    released: bool,
    reaped: Option<ExitStatus>,
}

/// What the tracee did to stop.
enum Stop {
    /// It exec'd a program.
    Exec,
    /// A signal is about to be delivered to it.
    Signal(i32),
}

impl Child {
    /// Starts `command` (a program and its arguments) with tracer's stdin,
    /// stdout, stderr and environment, and holds it once it runs a
    /// CPython interpreter whose image is mapped, before the interpreter
    /// has run an instruction.
    pub fn start(command: &[OsString]) -> Result<Self, LaunchError> {
        let program = command.first().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
        let mut cmd = Command::new(command.first().map_or_else(OsString::new, Clone::clone));
        cmd.args(command.iter().skip(1));
        // SAFETY: the closure runs in the child between fork and exec and
        // makes two system calls, which are async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                // The program is the user's: tracer's ambient capabilities
                // (as another user than root) are not passed on to it.
                // Every argument a full register: the kernel refuses stray bits.
                let clear_all = libc::c_ulong::from(libc::PR_CAP_AMBIENT_CLEAR_ALL.unsigned_abs());
                let zero: libc::c_ulong = 0;
                if libc::prctl(libc::PR_CAP_AMBIENT, clear_all, zero, zero, zero) == -1 {
                    return Err(io::Error::last_os_error());
                }
                let none = std::ptr::null_mut::<libc::c_void>();
                if libc::ptrace(libc::PTRACE_TRACEME, 0, none, none) == -1 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        // The exec succeeded when spawn returns: the child then stops at
        // its first instruction with SIGTRAP, as a tracee does after exec.
        let spawned = cmd.spawn().map_err(|cause| LaunchError::Spawn { program: program.clone(), cause })?;
        let pid = spawned.id();
        let mut child = Self { pid, interpreter: PathBuf::new(), released: false, reaped: None };
        child.follow(&program)?;
        Ok(child)
    }

    #[must_use]
    pub const fn pid(&self) -> u32 {
        self.pid
    }

    /// Follows the child from its first exec to an interpreter it runs,
    /// and holds it at that program's entry point: the loader has mapped
    /// and relocated every library it needs (libpython, the C library)
    /// and set up thread-local storage, and no instruction of the program
    /// itself has run.
    fn follow(&mut self, program: &str) -> Result<(), LaunchError> {
        let pid = self.pid;
        let err = |what| move |source| LaunchError::Ptrace { pid, what, source };
        let no_python = |status| LaunchError::NoPython { program: program.to_owned(), pid, status };
        // The first stop is the exec's SIGTRAP, unless a signal came
        // between the fork and the exec: that one is delivered.
        loop {
            match self.wait_stop().map_err(err("waiting for its exec"))? {
                Err(status) => return Err(no_python(status)),
                Ok(Stop::Signal(libc::SIGTRAP)) => break,
                Ok(Stop::Signal(signal)) => self.ptrace(libc::PTRACE_CONT, signal).map_err(err("resuming it"))?,
                Ok(_) => break,
            }
        }
        // EXITKILL: should tracer die while it holds the program, the
        // program dies too rather than run untraced.
        let options = libc::PTRACE_O_TRACEEXEC | libc::PTRACE_O_EXITKILL;
        self.ptrace(libc::PTRACE_SETOPTIONS, options).map_err(err("setting its options"))?;
        loop {
            // At an exec: on to its entry point, unless it execs again or
            // ends first.
            match self.run_to_entry().map_err(err("running it to its entry point"))? {
                Err(status) => return Err(no_python(status)),
                Ok(false) => continue,
                Ok(true) => {}
            }
            match Target::inspect(pid) {
                Ok(_) => {
                    self.interpreter = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
                    return Ok(());
                }
                // A shell, env, a wrapper: on to its next exec.
                Err(TargetError::NotPython { .. }) => {}
                // An interpreter tracer cannot trace runs not at all.
                Err(e) => return Err(e.into()),
            }
            self.ptrace(libc::PTRACE_CONT, 0).map_err(err("resuming it"))?;
            loop {
                match self.wait_stop().map_err(err("waiting for its next exec"))? {
                    Err(status) => return Err(no_python(status)),
                    Ok(Stop::Exec) => break,
                    Ok(Stop::Signal(signal)) => {
                        self.ptrace(libc::PTRACE_CONT, signal).map_err(err("resuming it"))?;
                    }
                }
            }
        }
    }

    /// From an exec stop, runs the child to its program's entry point (a
    /// breakpoint there, removed once hit): `Ok(true)` held there,
    /// `Ok(false)` at another exec first, `Err` ended first.
    fn run_to_entry(&mut self) -> io::Result<Result<bool, ExitStatus>> {
        let entry = auxv_entry(self.pid)?;
        let mem = std::fs::OpenOptions::new().read(true).write(true).open(format!("/proc/{}/mem", self.pid))?;
        let mut original = [0u8; 1];
        mem.read_exact_at(&mut original, entry)?;
        mem.write_all_at(&[0xcc], entry)?;
        self.ptrace(libc::PTRACE_CONT, 0)?;
        loop {
            match self.wait_stop()? {
                Err(status) => return Ok(Err(status)),
                // The breakpoint went with the image it was in.
                Ok(Stop::Exec) => return Ok(Ok(false)),
                Ok(Stop::Signal(libc::SIGTRAP)) => {
                    let mut regs = self.registers()?;
                    if regs.rip == entry + 1 {
                        mem.write_all_at(&original, entry)?;
                        regs.rip = entry;
                        self.set_registers(&regs)?;
                        return Ok(Ok(true));
                    }
                    // The program's own SIGTRAP.
                    self.ptrace(libc::PTRACE_CONT, libc::SIGTRAP)?;
                }
                Ok(Stop::Signal(signal)) => self.ptrace(libc::PTRACE_CONT, signal)?,
            }
        }
    }

    fn registers(&self) -> io::Result<libc::user_regs_struct> {
        // SAFETY: user_regs_struct is plain integers; zeroes are valid.
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        // SAFETY: PTRACE_GETREGS writes one user_regs_struct through the
        // valid pointer; the PID is our stopped tracee.
        let r = unsafe {
            libc::ptrace(libc::PTRACE_GETREGS, self.pid_t(), std::ptr::null_mut::<libc::c_void>(), &raw mut regs)
        };
        if r == -1 { Err(io::Error::last_os_error()) } else { Ok(regs) }
    }

    fn set_registers(&self, regs: &libc::user_regs_struct) -> io::Result<()> {
        // SAFETY: PTRACE_SETREGS reads one user_regs_struct from the valid
        // pointer; the PID is our stopped tracee.
        let r = unsafe {
            libc::ptrace(
                libc::PTRACE_SETREGS,
                self.pid_t(),
                std::ptr::null_mut::<libc::c_void>(),
                std::ptr::from_ref(regs),
            )
        };
        if r == -1 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    /// The child's next stop, or how it ended.
    fn wait_stop(&mut self) -> io::Result<Result<Stop, ExitStatus>> {
        let status = self.waitpid()?;
        if !libc::WIFSTOPPED(status) {
            let ended = ExitStatus::from_wait(status);
            self.reaped = Some(ended);
            return Ok(Err(ended));
        }
        let signal = libc::WSTOPSIG(status);
        Ok(Ok(if status >> 16 == libc::PTRACE_EVENT_EXEC {
            Stop::Exec
        } else if self.group_stop() {
            // Stopped (SIGSTOP, SIGTSTP) while followed: delivering the
            // signal again would stop it again; it is let go instead.
            Stop::Signal(0)
        } else {
            Stop::Signal(signal)
        }))
    }

    /// Whether the current stop is a group-stop, not a signal's delivery:
    /// one that has no signal information.
    fn group_stop(&self) -> bool {
        // SAFETY: siginfo_t is plain data; PTRACE_GETSIGINFO writes one
        // through the valid pointer.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above; the PID is our stopped tracee.
        let r = unsafe {
            libc::ptrace(libc::PTRACE_GETSIGINFO, self.pid_t(), std::ptr::null_mut::<libc::c_void>(), &raw mut info)
        };
        r == -1 && io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL)
    }

    fn waitpid(&self) -> io::Result<i32> {
        let mut status = 0;
        loop {
            // SAFETY: waitpid writes one int through the valid pointer.
            let r = unsafe { libc::waitpid(self.pid_t(), &raw mut status, libc::__WALL) };
            if r != -1 {
                return Ok(status);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    fn ptrace(&self, request: libc::c_uint, data: libc::c_int) -> io::Result<()> {
        // SAFETY: the requests used here take no pointer: `data` is a
        // signal number or an options word passed by value.
        let r = unsafe {
            libc::ptrace(request, self.pid_t(), std::ptr::null_mut::<libc::c_void>(), libc::c_long::from(data))
        };
        if r == -1 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    #[allow(clippy::cast_possible_wrap, reason = "a PID fits in pid_t")]
    const fn pid_t(&self) -> libc::pid_t {
        self.pid as libc::pid_t
    }

    /// Lets the held child run, no longer traced by ptrace: its probes are
    /// live.
    pub fn release(&mut self) -> Result<(), LaunchError> {
        if !self.released {
            self.ptrace(libc::PTRACE_DETACH, 0).map_err(|source| LaunchError::Ptrace {
                pid: self.pid,
                what: "letting it run",
                source,
            })?;
            self.released = true;
        }
        Ok(())
    }

    /// Sends `signal` to the child, if it has not been reaped (until then
    /// its PID cannot be another's).
    pub fn signal(&self, signal: i32) {
        if self.reaped.is_none() {
            // SAFETY: kill takes two integers.
            unsafe { libc::kill(self.pid_t(), signal) };
        }
    }

    /// Passes on a signal tracer got, unless the terminal sent it to the
    /// child too.
    pub fn pass_on(&self, signal: i32) {
        let terminal = matches!(signal, libc::SIGINT | libc::SIGQUIT | libc::SIGHUP);
        if !(terminal && signals::terminal_reached_child()) {
            self.signal(signal);
        }
    }

    /// Whether it was let go.
    #[must_use]
    pub const fn released(&self) -> bool {
        self.released
    }

    /// Waits for the child to end (it has, when its pidfd said so) and
    /// returns how.
    pub fn reap(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.reaped {
            return Ok(status);
        }
        let status = ExitStatus::from_wait(self.waitpid()?);
        self.reaped = Some(status);
        Ok(status)
    }
}

impl Drop for Child {
    /// A child never let go never ran its program: it is killed, so that
    /// an error before the probes went live leaves nothing running.
    fn drop(&mut self) {
        if !self.released && self.reaped.is_none() {
            self.signal(libc::SIGKILL);
            let _ = self.reap();
        }
    }
}

/// The entry point of the program `pid` runs, from its auxiliary vector
/// (`AT_ENTRY`).
fn auxv_entry(pid: u32) -> io::Result<u64> {
    let auxv = std::fs::read(format!("/proc/{pid}/auxv"))?;
    auxv.chunks_exact(16)
        .find_map(|pair| {
            let key = u64::from_ne_bytes(pair[..8].try_into().ok()?);
            let value = u64::from_ne_bytes(pair[8..].try_into().ok()?);
            (key == libc::AT_ENTRY).then_some(value)
        })
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no AT_ENTRY in its auxiliary vector"))
}
