//! The CPU time of processes at their end, from the kernel's taskstats exit
//! records, so that what a traced process did after tracer last read its
//! `/proc/PID/stat` can be priced too (see [`super::cost`]).
//!
//! Once a process is reaped its `/proc/PID` is gone, and a parent such as
//! pyperf's runner reaps its workers at once. The kernel, though, sends a
//! record of each thread's CPU time as it exits to every netlink socket
//! registered for taskstats on that CPU, whoever its parent is. A thread
//! here sums each thread group's records until the one the kernel flags
//! as its last thread (`AGROUP`), and hands that process's end to the cost
//! meter.
//!
//! The sum is the whole process's CPU time only if every one of its
//! threads ended while the socket listened, which holds for a process
//! started after the registration; the cost meter uses it for those alone.
//! Registering takes `CAP_NET_ADMIN`; without it, or on a kernel without
//! taskstats (or older than its version 12, which added the thread group
//! and `AGROUP`), there is no listener and such hits stay unpriced.

use std::{
    collections::HashMap,
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
};

/// A process's end, as its threads' exit records tell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessEnd {
    pub tgid: u32,
    /// When it started, in ns since boot (`CLOCK_BOOTTIME`, the clock of
    /// `/proc/PID/stat`'s start times): when its last record came less the
    /// process's age in it, so never earlier than the truth and later by
    /// however long the record took to be read.
    pub started_ns: u64,
    /// The user and system CPU time of all its threads, in µs.
    pub cpu_us: u64,
}

/// One thread's exit record: the fields tracer reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ThreadExit {
    tgid: u32,
    /// The thread was its process's last.
    last: bool,
    /// The process's age at the thread's exit (`ac_tgetime`), in µs.
    process_age_us: u64,
    cpu_us: u64,
}

/// Listens for exit records while it lives: a thread of its own reads them
/// as they come, so that a burst of exits does not overflow the socket, and
/// [`Self::take`] reads what is left, so that an exit just before it is
/// not missed for want of that thread's turn on a busy machine.
pub struct ExitListener {
    socket: Arc<OwnedFd>,
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// What the records said so far. Every read of the socket is made holding
/// it, so that a thread group's records are summed in the order they came.
#[derive(Default)]
struct Shared {
    ends: Vec<ProcessEnd>,
    /// Each thread group's CPU time in µs so far, until its last thread's
    /// record.
    partial: HashMap<u32, u64>,
    /// Set once a record may have been missed (the socket's buffer
    /// overflowed, or the kernel's records have no thread group): from
    /// then on no sum can be trusted, and none is given.
    lost: bool,
}

impl ExitListener {
    /// Registers for every CPU's exit records and starts listening; `None`
    /// where the kernel refuses (no `CAP_NET_ADMIN`, no taskstats), or
    /// where the listening thread could not drop its capabilities.
    #[must_use]
    pub fn start() -> Option<Self> {
        let socket = Arc::new(register().ok()?);
        let shared = Arc::new(Mutex::new(Shared::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (narrowed, dropped) = std::sync::mpsc::channel();
        let thread = {
            let (socket, shared, stop) = (Arc::clone(&socket), Arc::clone(&shared), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("exits".to_owned())
                .spawn(move || {
                    // Registered: reading the socket needs no capability,
                    // and this thread lives for the whole run, started
                    // before the main thread drops its own.
                    let ok = crate::capabilities::keep_only(0).is_ok();
                    let _ = narrowed.send(ok);
                    if ok {
                        listen(&socket, &shared, &stop);
                    }
                })
                .ok()?
        };
        if dropped.recv() != Ok(true) {
            let _ = thread.join();
            return None;
        }
        Some(Self { socket, shared, stop, thread: Some(thread) })
    }

    /// The processes that ended since the last call, up to now: the records
    /// of every exit so far are in the socket when this is called.
    #[must_use]
    pub fn take(&self) -> Vec<ProcessEnd> {
        let Ok(mut shared) = self.shared.lock() else { return Vec::new() };
        drain(&self.socket, &mut shared);
        if shared.lost {
            shared.ends.clear();
        }
        std::mem::take(&mut shared.ends)
    }
}

impl Drop for ExitListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // The thread wakes within its poll timeout.
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How long the thread waits for records before it looks at its stop flag.
const POLL_TIMEOUT_MS: libc::c_int = 200;
/// Room for a burst of exits between two wakeups (each record is about
/// 500 bytes).
const RECEIVE_BUFFER: libc::c_int = 8 << 20;

fn listen(socket: &OwnedFd, shared: &Mutex<Shared>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let mut poll = libc::pollfd { fd: socket.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, which outlives the call.
        let ready = unsafe { libc::poll(&raw mut poll, 1, POLL_TIMEOUT_MS) };
        if ready <= 0 {
            continue;
        }
        let Ok(mut s) = shared.lock() else { return };
        drain(socket, &mut s);
        if s.lost {
            return;
        }
    }
}

/// Reads every record waiting in the socket, without blocking.
fn drain(socket: &OwnedFd, shared: &mut Shared) {
    let mut buf = vec![0u8; 1 << 16];
    while !shared.lost {
        // SAFETY: recv writes at most buf.len() bytes into buf, which
        // lives through the call; the fd is open.
        let n = unsafe { libc::recv(socket.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        let Ok(n) = usize::try_from(n) else {
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return,
                // ENOBUFS: records were dropped; anything else: the socket
                // is unusable. Either way no sum can be trusted now.
                _ => {
                    shared.lost = true;
                    return;
                }
            }
        };
        let now = boottime_ns();
        for exit in parse_records(&buf[..n.min(buf.len())]) {
            let Ok(exit) = exit else {
                shared.lost = true;
                return;
            };
            let sum = shared.partial.remove(&exit.tgid).unwrap_or(0).saturating_add(exit.cpu_us);
            if exit.last {
                let started_ns = now.saturating_sub(exit.process_age_us.saturating_mul(1000));
                shared.ends.push(ProcessEnd { tgid: exit.tgid, started_ns, cpu_us: sum });
            } else {
                shared.partial.insert(exit.tgid, sum);
            }
        }
    }
}

fn boottime_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec that outlives the call.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &raw mut ts) };
    let ns = |v: i64| u64::try_from(v).unwrap_or(0);
    ns(ts.tv_sec).saturating_mul(1_000_000_000).saturating_add(ns(ts.tv_nsec))
}

// Netlink and taskstats constants (linux/netlink.h, linux/genetlink.h,
// linux/taskstats.h, linux/acct.h).
const NLMSG_HDRLEN: usize = 16;
const GENL_HDRLEN: usize = 4;
const NLA_HDRLEN: usize = 4;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const TASKSTATS_CMD_GET: u8 = 1;
const TASKSTATS_CMD_ATTR_REGISTER_CPUMASK: u16 = 3;
const TASKSTATS_TYPE_STATS: u16 = 3;
const TASKSTATS_TYPE_AGGR_PID: u16 = 4;
/// Nested attributes carry this bit in their type.
const NLA_TYPE_MASK: u16 = 0x3fff;
const AGROUP: u8 = 0x20;

/// Offsets in `struct taskstats`, which only ever grows at its end.
mod taskstats {
    pub const VERSION: usize = 0;
    pub const AC_FLAG: usize = 8;
    pub const AC_UTIME: usize = 152;
    pub const AC_STIME: usize = 160;
    pub const AC_TGID: usize = 368;
    pub const AC_TGETIME: usize = 376;
    /// The first version with `ac_tgid`, `ac_tgetime` and `AGROUP`.
    pub const WITH_GROUP: u16 = 12;
    pub const WITH_GROUP_LEN: usize = 400;
}

/// Opens a generic netlink socket and registers it for every possible
/// CPU's exit records.
fn register() -> io::Result<OwnedFd> {
    // SAFETY: socket has no memory-safety preconditions.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_GENERIC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned by nothing else.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let size = RECEIVE_BUFFER;
    // SAFETY: the option values are valid for their sizes and outlive the
    // calls. Best effort: the force variant needs CAP_NET_ADMIN, which the
    // registration needs anyway.
    unsafe {
        if libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, (&raw const size).cast(), 4) != 0 {
            libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, (&raw const size).cast(), 4);
        }
        // For the kernel's answers while registering; records are read
        // without blocking.
        let timeout = libc::timeval { tv_sec: 1, tv_usec: 0 };
        let len = libc::socklen_t::try_from(size_of::<libc::timeval>()).unwrap_or(16);
        libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, (&raw const timeout).cast(), len);
    }
    let family = family_id(&socket)?;
    let cpus = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let mut mask = cpus.trim().as_bytes().to_vec();
    mask.push(0);
    send(
        &socket,
        &request(family, NLM_F_REQUEST | NLM_F_ACK, TASKSTATS_CMD_GET, TASKSTATS_CMD_ATTR_REGISTER_CPUMASK, &mask),
    )?;
    // The acknowledgement, or the refusal (EPERM without CAP_NET_ADMIN);
    // exit records may come first.
    let mut buf = vec![0u8; 1 << 16];
    for _ in 0..64 {
        let n = receive(&socket, &mut buf)?;
        for (kind, payload) in messages(&buf[..n]) {
            if kind == NLMSG_ERROR {
                return match error_code(payload) {
                    Some(0) => Ok(socket),
                    Some(e) => Err(io::Error::from_raw_os_error(-e)),
                    None => Err(io::Error::other("a short netlink error message")),
                };
            }
        }
    }
    Err(io::Error::other("taskstats never acknowledged the registration"))
}

/// The generic netlink family id of taskstats.
fn family_id(socket: &OwnedFd) -> io::Result<u16> {
    send(socket, &request(GENL_ID_CTRL, NLM_F_REQUEST, CTRL_CMD_GETFAMILY, CTRL_ATTR_FAMILY_NAME, b"TASKSTATS\0"))?;
    let mut buf = vec![0u8; 1 << 16];
    let n = receive(socket, &mut buf)?;
    for (kind, payload) in messages(&buf[..n]) {
        if kind == NLMSG_ERROR {
            let e = error_code(payload).unwrap_or(-libc::EIO);
            return Err(io::Error::from_raw_os_error(-e));
        }
        if kind == GENL_ID_CTRL {
            for (attr, value) in attributes(payload.get(GENL_HDRLEN..).unwrap_or_default()) {
                if attr == CTRL_ATTR_FAMILY_ID && value.len() >= 2 {
                    return Ok(u16::from_ne_bytes([value[0], value[1]]));
                }
            }
        }
    }
    Err(io::Error::other("no taskstats family in the kernel's answer"))
}

/// A generic netlink request with one attribute.
fn request(kind: u16, flags: u16, cmd: u8, attr: u16, value: &[u8]) -> Vec<u8> {
    let attr_len = NLA_HDRLEN + value.len();
    let len = NLMSG_HDRLEN + GENL_HDRLEN + align(attr_len);
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&[0; 8]); // sequence number and port: the kernel's to fill
    m.extend_from_slice(&[cmd, 1, 0, 0]); // command, version 1, reserved
    m.extend_from_slice(&u16::try_from(attr_len).unwrap_or(u16::MAX).to_ne_bytes());
    m.extend_from_slice(&attr.to_ne_bytes());
    m.extend_from_slice(value);
    m.resize(len, 0);
    m
}

fn send(socket: &OwnedFd, message: &[u8]) -> io::Result<()> {
    // SAFETY: the buffer is valid for its length through the call.
    let n = unsafe { libc::send(socket.as_raw_fd(), message.as_ptr().cast(), message.len(), 0) };
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

fn receive(socket: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: recv writes at most buf.len() bytes into buf.
    let n = unsafe { libc::recv(socket.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error()).map(|n| n.min(buf.len()))
}

const fn align(n: usize) -> usize {
    (n + 3) & !3
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The (type, payload) of each netlink message in `buf`.
fn messages(buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    while let (Some(len), Some(kind)) = (u32_at(buf, at), u16_at(buf, at + 4)) {
        let len = usize::try_from(len).unwrap_or(0);
        let Some(payload) = buf.get(at + NLMSG_HDRLEN..at + len).filter(|_| len >= NLMSG_HDRLEN) else { break };
        out.push((kind, payload));
        at += align(len);
    }
    out
}

/// The (type, value) of each netlink attribute in `buf`.
fn attributes(buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    while let (Some(len), Some(kind)) = (u16_at(buf, at), u16_at(buf, at + 2)) {
        let len = usize::from(len);
        let Some(value) = buf.get(at + NLA_HDRLEN..at + len).filter(|_| len >= NLA_HDRLEN) else { break };
        out.push((kind & NLA_TYPE_MASK, value));
        at += align(len);
    }
    out
}

/// The error code of an `NLMSG_ERROR` message (0 for an acknowledgement).
fn error_code(payload: &[u8]) -> Option<i32> {
    Some(i32::from_ne_bytes(payload.get(..4)?.try_into().ok()?))
}

/// Too old a kernel: its records have no thread group.
#[derive(Debug, PartialEq, Eq)]
struct NoThreadGroup;

/// Every thread exit record in the messages of `buf`.
fn parse_records(buf: &[u8]) -> Vec<Result<ThreadExit, NoThreadGroup>> {
    let mut out = Vec::new();
    for (_, payload) in messages(buf) {
        for (kind, nested) in attributes(payload.get(GENL_HDRLEN..).unwrap_or_default()) {
            // A thread group's aggregate, sent with its last thread's
            // record when it had several threads, holds no CPU time.
            if kind != TASKSTATS_TYPE_AGGR_PID {
                continue;
            }
            for (kind, stats) in attributes(nested) {
                if kind == TASKSTATS_TYPE_STATS {
                    out.push(thread_exit(stats));
                }
            }
        }
    }
    out
}

fn thread_exit(stats: &[u8]) -> Result<ThreadExit, NoThreadGroup> {
    use taskstats::{AC_FLAG, AC_STIME, AC_TGETIME, AC_TGID, AC_UTIME, VERSION, WITH_GROUP, WITH_GROUP_LEN};
    if u16_at(stats, VERSION).is_none_or(|v| v < WITH_GROUP) || stats.len() < WITH_GROUP_LEN {
        return Err(NoThreadGroup);
    }
    let field = |at| u64_at(stats, at).unwrap_or(0);
    Ok(ThreadExit {
        tgid: u32_at(stats, AC_TGID).unwrap_or(0),
        last: stats.get(AC_FLAG).is_some_and(|f| f & AGROUP != 0),
        process_age_us: field(AC_TGETIME),
        cpu_us: field(AC_UTIME).saturating_add(field(AC_STIME)),
    })
}

/// Raises the soft limit on open files to the hard one: `--exe` holds a
/// pidfd per traced process, and the default soft limit (1024) is the
/// counter map's room for processes. A failure leaves the limit as it was,
/// and a process that then cannot be watched is reported.
pub fn raise_fd_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit through a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } == 0 && limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: setrlimit reads one valid rlimit.
        let _ = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A taskstats record of version 13 (416 bytes) with the given fields.
    fn stats(tgid: u32, last: bool, age_us: u64, utime: u64, stime: u64) -> Vec<u8> {
        let mut s = vec![0u8; 416];
        s[0..2].copy_from_slice(&13u16.to_ne_bytes());
        s[taskstats::AC_FLAG] = if last { AGROUP } else { 0 };
        s[taskstats::AC_UTIME..][..8].copy_from_slice(&utime.to_ne_bytes());
        s[taskstats::AC_STIME..][..8].copy_from_slice(&stime.to_ne_bytes());
        s[taskstats::AC_TGID..][..4].copy_from_slice(&tgid.to_ne_bytes());
        s[taskstats::AC_TGETIME..][..8].copy_from_slice(&age_us.to_ne_bytes());
        s
    }

    fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&u16::try_from(NLA_HDRLEN + value.len()).unwrap().to_ne_bytes());
        a.extend_from_slice(&kind.to_ne_bytes());
        a.extend_from_slice(value);
        a.resize(align(a.len()), 0);
        a
    }

    /// An exit message as the kernel sends it: the thread's PID and stats
    /// nested in an `AGGR_PID` attribute, and for the last thread of a
    /// multi-threaded group an `AGGR_TGID` one after it.
    fn message(pid: u32, stats: &[u8], group_aggregate: bool) -> Vec<u8> {
        let mut nested = attr(1, &pid.to_ne_bytes());
        nested.extend(attr(TASKSTATS_TYPE_STATS, stats));
        let mut body = vec![2, 1, 0, 0]; // TASKSTATS_CMD_NEW
        body.extend(attr(TASKSTATS_TYPE_AGGR_PID | 0x8000, &nested));
        if group_aggregate {
            let mut tg = attr(2, &pid.to_ne_bytes());
            tg.extend(attr(TASKSTATS_TYPE_STATS, &vec![0u8; stats.len()]));
            body.extend(attr(5 | 0x8000, &tg));
        }
        let mut m = Vec::new();
        m.extend_from_slice(&u32::try_from(NLMSG_HDRLEN + body.len()).unwrap().to_ne_bytes());
        m.extend_from_slice(&0x17u16.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend(body);
        m
    }

    #[test]
    fn thread_records_are_read_and_a_groups_aggregate_is_passed_over() {
        let mut buf = message(101, &stats(100, false, 5_000, 300, 200), false);
        buf.extend(message(100, &stats(100, true, 9_000, 1_000, 40), true));
        let records = parse_records(&buf);
        assert_eq!(
            records,
            vec![
                Ok(ThreadExit { tgid: 100, last: false, process_age_us: 5_000, cpu_us: 500 }),
                Ok(ThreadExit { tgid: 100, last: true, process_age_us: 9_000, cpu_us: 1_040 }),
            ]
        );
    }

    #[test]
    fn a_record_without_thread_group_is_refused() {
        let mut old = stats(100, true, 1, 1, 1);
        old[0..2].copy_from_slice(&11u16.to_ne_bytes());
        assert_eq!(parse_records(&message(100, &old, false)), vec![Err(NoThreadGroup)]);
        assert_eq!(parse_records(&message(100, &old[..300], false)), vec![Err(NoThreadGroup)]);
    }

    #[test]
    fn truncated_messages_end_the_parse_without_a_panic() {
        let buf = message(100, &stats(100, true, 1, 1, 1), false);
        for cut in 0..buf.len() {
            let _ = parse_records(&buf[..cut]);
        }
        // A length that runs past the end, or is smaller than a header.
        let mut bad = buf.clone();
        bad[0..4].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(parse_records(&bad).is_empty());
        bad[0..4].copy_from_slice(&3u32.to_ne_bytes());
        assert!(parse_records(&bad).is_empty());
    }

    #[test]
    fn requests_are_laid_out_as_netlink_wants() {
        let r =
            request(0x17, NLM_F_REQUEST | NLM_F_ACK, TASKSTATS_CMD_GET, TASKSTATS_CMD_ATTR_REGISTER_CPUMASK, b"0-1\0");
        assert_eq!(r.len(), 16 + 4 + 8);
        assert_eq!(u32_at(&r, 0), Some(28));
        assert_eq!(u16_at(&r, 4), Some(0x17));
        assert_eq!(u16_at(&r, 6), Some(5));
        assert_eq!(&r[16..20], &[1, 1, 0, 0]);
        assert_eq!(attributes(&r[20..]), vec![(3, &b"0-1\0"[..])]);
    }
}
