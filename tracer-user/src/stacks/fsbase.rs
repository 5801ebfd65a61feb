//! A thread's fsbase, read by stopping it for a moment with ptrace: how
//! `tracer stack --check-tls` proves, from userspace, the thread-local
//! route the BPF walker will take at events (where the kernel gives it the
//! task's fsbase without stopping anything).

use std::io;

/// The fsbase of task `tid` (a host TID), which is stopped with
/// `PTRACE_SEIZE` + `PTRACE_INTERRUPT` while its registers are read and
/// let go at once. Fails where the task is traced already, has exited, or
/// may not be traced.
pub fn of_task(tid: u32) -> io::Result<u64> {
    let tid = libc::pid_t::try_from(tid).map_err(io::Error::other)?;
    // SAFETY: PTRACE_SEIZE takes no pointers (addr and data are 0).
    check(unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) })?;
    let regs = stopped_registers(tid);
    // SAFETY: PTRACE_DETACH on a task seized above takes no pointers; if it
    // fails the task is gone, and the kernel detaches it anyway when this
    // process exits.
    let detached = check(unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0) });
    let regs = regs?;
    detached?;
    Ok(regs.fs_base)
}

/// The registers of the seized task `tid`, once it has stopped.
fn stopped_registers(tid: libc::pid_t) -> io::Result<libc::user_regs_struct> {
    // SAFETY: PTRACE_INTERRUPT on a seized task takes no pointers.
    check(unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) })?;
    let mut status = 0;
    // SAFETY: status is a valid int to write; __WALL waits for a thread of
    // another process, which seizing made this process's tracee.
    if unsafe { libc::waitpid(tid, &raw mut status, libc::__WALL) } < 0 {
        return Err(io::Error::last_os_error());
    }
    if !libc::WIFSTOPPED(status) {
        return Err(io::Error::other(format!("task {tid} did not stop (wait status {status:#x})")));
    }
    // SAFETY: user_regs_struct is plain integers, for which all zeroes is
    // a valid value.
    let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    // SAFETY: PTRACE_GETREGS writes one user_regs_struct at data, which
    // points to one.
    check(unsafe { libc::ptrace(libc::PTRACE_GETREGS, tid, 0, &raw mut regs) })?;
    Ok(regs)
}

fn check(ret: libc::c_long) -> io::Result<()> {
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}
