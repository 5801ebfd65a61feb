//! The GC probes of a [`GcPlan`] in the kernel: attached for the whole run
//! (not in `--budget`'s windows: a collection is rare, and one seen only
//! at one end is a miss), each marker with its semaphore as the uprobe's
//! reference counter, so that the kernel raises it in every traced process
//! while the probe exists and lowers it when the probe goes, whatever ends
//! tracer. tracer never writes the target's memory.
//!
//! uprobe-multi links take the counters in `ref_ctr_offsets`; a perf-event
//! uprobe, in the upper 32 bits of its `config` (the uprobe PMU's
//! `ref_ctr_offset` format). aya 0.14 offers neither, so both are made
//! here.

use std::{
    collections::BTreeMap,
    ffi::CString,
    os::fd::{AsFd as _, AsRawFd, FromRawFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use aya::{
    maps::{MapData, PerCpuHashMap},
    programs::UProbe,
};
use aya_obj::generated::{bpf_attach_type, bpf_cmd};
use thiserror::Error;
use tracer_common::{
    gc::{GcKey, GcTotals},
    names,
};

use super::{ALL_PROCESSES, AttachError, Session, multi};
use crate::plan::gc::{GcPlan, GcPoint, GcRole};

/// Why a GC probe could not be attached.
#[derive(Debug, Error)]
pub enum GcAttachError {
    #[error("cannot load BPF program {name} for the GC probes: {cause}")]
    Load { name: &'static str, cause: Box<aya::programs::ProgramError> },
    #[error("the kernel's uprobe PMU cannot be read ({path}: {cause}); perf-event uprobes need it")]
    Pmu { path: PathBuf, cause: std::io::Error },
    #[error(
        "cannot attach the GC probe {name} at file offset {offset:#x} of {path} (semaphore at {semaphore}) for {scope}: {cause}"
    )]
    Perf { name: String, offset: u64, semaphore: String, path: PathBuf, scope: String, cause: std::io::Error },
}

/// The uprobe PMU's type and where its `config` holds the return flag and
/// the reference counter's offset (`/sys/bus/event_source/devices/uprobe`).
pub(super) struct UprobePmu {
    kind: u32,
    retprobe_bit: u32,
    ref_ctr_shift: u32,
}

impl UprobePmu {
    pub(super) fn read() -> Result<Self, GcAttachError> {
        let dir = Path::new("/sys/bus/event_source/devices/uprobe");
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path).map_err(|cause| GcAttachError::Pmu { path, cause })
        };
        let bad = |name: &str, text: &str| GcAttachError::Pmu {
            path: dir.join(name),
            cause: std::io::Error::other(format!("unexpected contents {text:?}")),
        };
        let kind_text = read("type")?;
        let kind = kind_text.trim().parse().map_err(|_| bad("type", &kind_text))?;
        // "config:0" and "config:32-63": the first bit of the field.
        let first_bit = |name: &str| -> Result<u32, GcAttachError> {
            let text = read(name)?;
            text.trim()
                .strip_prefix("config:")
                .and_then(|bits| bits.split('-').next())
                .and_then(|b| b.parse().ok())
                .filter(|&b: &u32| b < 64)
                .ok_or_else(|| bad(name, &text))
        };
        Ok(Self {
            kind,
            retprobe_bit: first_bit("format/retprobe")?,
            ref_ctr_shift: first_bit("format/ref_ctr_offset")?,
        })
    }
}

/// `PERF_FLAG_FD_CLOEXEC` (`include/uapi/linux/perf_event.h`).
pub(super) const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

/// The `perf_event` part of `link_create` in `union bpf_attr`.
#[repr(C)]
struct PerfLinkAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    bpf_cookie: u64,
    tail: [u64; 8],
}

/// A BPF link of `program` to the perf event `event`, with `cookie`.
pub(super) fn perf_link(program: &impl AsRawFd, event: &impl AsRawFd, cookie: u64) -> std::io::Result<OwnedFd> {
    let mut attr = PerfLinkAttr {
        prog_fd: u32::try_from(program.as_raw_fd()).unwrap_or(u32::MAX),
        target_fd: u32::try_from(event.as_raw_fd()).unwrap_or(u32::MAX),
        attach_type: bpf_attach_type::BPF_PERF_EVENT as u32,
        flags: 0,
        bpf_cookie: cookie,
        tail: [0; 8],
    };
    multi::bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr)
}

impl Session {
    /// Attaches the GC probes of `plan` to `pid` ([`ALL_PROCESSES`]: every
    /// process that maps the image, now or later), through uprobe-multi
    /// links or, without `multi`, perf-event uprobes. On failure nothing
    /// of them stays attached.
    pub fn attach_gc(&mut self, plan: &GcPlan, pid: u32, multi: bool) -> Result<(), AttachError> {
        let path = self.plan.attach_path.clone();
        let links = if multi { self.gc_multi_links(plan, &path, pid)? } else { self.gc_perf_links(plan, &path, pid)? };
        self.gc_links.extend(links);
        Ok(())
    }

    /// Detaches the GC probes: the kernel lowers the semaphores again.
    pub fn detach_gc(&mut self) {
        self.gc_links.clear();
    }

    /// One uprobe-multi link per program and kind of probe (entry or
    /// return), each point with its semaphore.
    fn gc_multi_links(&mut self, plan: &GcPlan, path: &Path, pid: u32) -> Result<Vec<OwnedFd>, AttachError> {
        let mut groups: BTreeMap<(bool, &'static str, bool), Vec<&GcPoint>> = BTreeMap::new();
        for p in done_first(plan) {
            groups.entry((p.role == GcRole::Start, program_of(p.role), p.ret)).or_default().push(p);
        }
        let mut links = Vec::new();
        for ((_, name, ret), points) in groups {
            let program = self.gc_multi_program(name)?;
            let pairs: Vec<(u64, u64)> = points.iter().map(|p| (p.file_offset, p.cookie)).collect();
            let counters: Vec<u64> = points.iter().map(|p| p.semaphore.unwrap_or(0)).collect();
            let link = multi::attach_counted(&program, name, path, (&pairs, ret), &counters, pid)
                .map_err(|e| if self.gone(pid) { AttachError::TargetExited { pid } } else { AttachError::Multi(e) })?;
            links.push(link);
        }
        Ok(links)
    }

    /// `name` loaded for uprobe-multi links, once (the GC's programs and
    /// growth's).
    pub(super) fn gc_multi_program(&mut self, name: &'static str) -> Result<OwnedFd, AttachError> {
        if let Some((_, fd)) = self.gc_programs.iter().find(|(n, _)| *n == name) {
            return fd.try_clone().map_err(|cause| AttachError::MapFd { name: name.to_owned(), cause });
        }
        let fd = multi::load(self.object, name, &self.map_fds)?;
        let copy = fd.try_clone().map_err(|cause| AttachError::MapFd { name: name.to_owned(), cause })?;
        self.gc_programs.push((name, fd));
        Ok(copy)
    }

    /// One perf-event uprobe per point, each with its semaphore in the
    /// event's `config`, and a BPF link to it carrying the cookie.
    fn gc_perf_links(&mut self, plan: &GcPlan, path: &Path, pid: u32) -> Result<Vec<OwnedFd>, AttachError> {
        let pmu = UprobePmu::read()?;
        let c_path = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| GcAttachError::Perf {
            name: "GC".to_owned(),
            offset: 0,
            semaphore: "none".to_owned(),
            path: path.to_owned(),
            scope: scope(pid),
            cause: std::io::Error::other(e),
        })?;
        let mut fds = Vec::new();
        for p in done_first(plan) {
            let program = self.gc_perf_program(program_of(p.role))?;
            let err = |cause| GcAttachError::Perf {
                name: p.name.clone(),
                offset: p.file_offset,
                semaphore: p.semaphore.map_or_else(|| "none".to_owned(), |s| format!("{s:#x}")),
                path: path.to_owned(),
                scope: scope(pid),
                cause,
            };
            let event = perf_uprobe(&pmu, &c_path, (p.file_offset, p.ret, p.semaphore), pid).map_err(err)?;
            let link = perf_link(&program, &event, p.cookie).map_err(err)?;
            // The link holds the event; both go when dropped.
            fds.extend([link, event]);
        }
        Ok(fds)
    }

    /// `name` loaded through aya for perf-event uprobes, once; its fd (the
    /// GC's programs and growth's).
    pub(super) fn gc_perf_program(&mut self, name: &'static str) -> Result<OwnedFd, AttachError> {
        let load_err = |cause| AttachError::Gc(GcAttachError::Load { name, cause: Box::new(cause) });
        let program: &mut UProbe =
            self.ebpf.program_mut(name).ok_or(AttachError::ProgramMissing { name })?.try_into().map_err(load_err)?;
        if program.fd().is_err() {
            multi::retry_interrupted(|| program.load(), multi::aya_eagain).map_err(load_err)?;
            let fd = program.fd().map_err(load_err)?.as_fd().try_clone_to_owned();
            let fd = fd.map_err(|cause| AttachError::MapFd { name: name.to_owned(), cause })?;
            self.gc_programs.push((name, fd));
        }
        let fd = program.fd().map_err(load_err)?.as_fd().try_clone_to_owned();
        fd.map_err(|cause| AttachError::MapFd { name: name.to_owned(), cause })
    }

    /// Per process, its collections by generation, summed over CPUs.
    pub(super) fn read_gc(&self) -> Result<BTreeMap<u32, BTreeMap<i32, GcTotals>>, AttachError> {
        let map_err = |cause| AttachError::Map { name: names::GC_TOTALS_MAP, cause: Box::new(cause) };
        let map = self
            .ebpf
            .map(names::GC_TOTALS_MAP)
            .ok_or_else(|| map_err(aya::maps::MapError::InvalidName { name: names::GC_TOTALS_MAP.to_owned() }))?;
        let totals: PerCpuHashMap<&MapData, GcKey, GcTotals> = PerCpuHashMap::try_from(map).map_err(map_err)?;
        let mut out: BTreeMap<u32, BTreeMap<i32, GcTotals>> = BTreeMap::new();
        for (key, per_cpu) in super::maps::per_cpu_hash(&totals, names::GC_TOTALS_MAP)? {
            if key.tgid == 0 {
                // No process has id 0: the test knob's placeholder (see
                // super::full).
                continue;
            }
            let sum = per_cpu.iter().fold(GcTotals::default(), |sum, t| sum.merged(*t));
            out.entry(key.tgid).or_default().insert(key.generation, sum);
        }
        Ok(out)
    }

    /// Removes process `tgid`'s collections from the kernel map, once its
    /// final counts are read.
    pub(super) fn remove_gc_process(&mut self, tgid: u32) -> Result<(), AttachError> {
        let map_err = |cause| AttachError::Map { name: names::GC_TOTALS_MAP, cause: Box::new(cause) };
        let map = self
            .ebpf
            .map_mut(names::GC_TOTALS_MAP)
            .ok_or_else(|| map_err(aya::maps::MapError::InvalidName { name: names::GC_TOTALS_MAP.to_owned() }))?;
        let mut totals: PerCpuHashMap<&mut MapData, GcKey, GcTotals> = PerCpuHashMap::try_from(map).map_err(map_err)?;
        let keys: Vec<GcKey> = totals.keys().filter_map(Result::ok).filter(|k| k.tgid == tgid).collect();
        for key in keys {
            totals.remove(&key).or_else(super::maps::absent).map_err(map_err)?;
        }
        Ok(())
    }
}

/// The plan's points, the dones before the starts: attached in this order,
/// a start is never seen before its done can be. Were a start attached
/// first, a collection running through the moment between would leave its
/// start in flight with no end (counted `gc_unended` at the thread's next).
fn done_first(plan: &GcPlan) -> impl Iterator<Item = &GcPoint> {
    let of = move |role: GcRole| plan.points.iter().filter(move |p| p.role == role);
    of(GcRole::Done).chain(of(GcRole::Start))
}

/// The program of a probe of `role`.
const fn program_of(role: GcRole) -> &'static str {
    match role {
        GcRole::Start => names::programs::GC_START,
        GcRole::Done => names::programs::GC_DONE,
    }
}

/// "PID N", or every process.
pub(super) fn scope(pid: u32) -> String {
    if pid == ALL_PROCESSES { "every process".to_owned() } else { format!("PID {pid}") }
}

/// A perf-event uprobe at `file_offset` in the file `path` (a return
/// probe with `ret`), for `pid` (every process for [`ALL_PROCESSES`]),
/// with `semaphore` as its reference counter.
pub(super) fn perf_uprobe(
    pmu: &UprobePmu,
    path: &CString,
    (file_offset, ret, semaphore): (u64, bool, Option<u64>),
    pid: u32,
) -> std::io::Result<OwnedFd> {
    // SAFETY: perf_event_attr is plain integers and unions of integers,
    // for which all-zero is valid (and what the kernel wants unused).
    let mut attr: aya_obj::generated::perf_event_attr = unsafe { std::mem::zeroed() };
    attr.type_ = pmu.kind;
    attr.size = u32::try_from(size_of_val(&attr)).unwrap_or(u32::MAX);
    attr.config = (u64::from(ret) << pmu.retprobe_bit) | (semaphore.unwrap_or(0) << pmu.ref_ctr_shift);
    attr.__bindgen_anon_3.uprobe_path = path.as_ptr() as u64;
    attr.__bindgen_anon_4.probe_offset = file_offset;
    // One process on any CPU, or every process: then one CPU must be named,
    // and a uprobe event on CPU 0 fires on every CPU.
    let (target, cpu): (libc::pid_t, libc::c_int) = match pid {
        ALL_PROCESSES => (-1, 0),
        pid => (libc::pid_t::try_from(pid).map_err(std::io::Error::other)?, -1),
    };
    // SAFETY: attr is a valid perf_event_attr of the size it states, and
    // the path it points to outlives the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            std::ptr::from_ref(&attr),
            target,
            cpu,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = std::os::fd::RawFd::try_from(fd).map_err(std::io::Error::other)?;
    // SAFETY: perf_event_open returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU16, Ordering};

    use tracer_common::{gc::arg_cookie, site, stats::Stat};

    use super::*;
    use crate::{discover::elf::ElfImage, kernel::LoadOptions, plan::gc::GcSource};

    /// Semaphores as sys/sdt.h makes them: two bytes in a writable section
    /// of the file (not .bss, which no file backs), which only the kernel
    /// writes here.
    #[unsafe(link_section = ".data.tracer_test_gc_semaphores")]
    #[unsafe(no_mangle)]
    static TRACER_TEST_GC_START_SEMAPHORE: AtomicU16 = AtomicU16::new(0);
    #[unsafe(link_section = ".data.tracer_test_gc_semaphores")]
    #[unsafe(no_mangle)]
    static TRACER_TEST_GC_DONE_SEMAPHORE: AtomicU16 = AtomicU16::new(0);

    /// A `gc__start` stand-in: the generation in `%edi`.
    #[unsafe(no_mangle)]
    #[inline(never)]
    extern "C" fn tracer_test_gc_start(generation: i32) {
        std::hint::black_box(generation);
    }

    /// A `gc__done` stand-in: the objects in `%rdi`.
    #[unsafe(no_mangle)]
    #[inline(never)]
    extern "C" fn tracer_test_gc_done(found: i64) {
        std::hint::black_box(found);
    }

    /// A collection function: the generation in `%esi`, the objects
    /// returned.
    #[unsafe(no_mangle)]
    #[inline(never)]
    extern "C" fn tracer_test_gc_collect(_tstate: u64, generation: i32) -> i64 {
        std::hint::black_box(i64::from(generation) * 10 + 1)
    }

    fn session() -> (Session, ElfImage) {
        let (plan, elf) = crate::kernel::tests::main_plan();
        (Session::load(plan, std::process::id(), &LoadOptions::default()).expect("the object loads"), elf)
    }

    fn point(elf: &ElfImage, role: GcRole, symbol: &str, semaphore: Option<&str>, arg: (u16, u8)) -> GcPoint {
        let f = elf.function(symbol).unwrap_or_else(|| panic!("{symbol} in the test binary"));
        let semaphore = semaphore.map(|s| elf.symbol(s).unwrap_or_else(|| panic!("{s}")).file_offset);
        GcPoint {
            role,
            name: symbol.to_owned(),
            address: f.address,
            file_offset: f.file_offset,
            semaphore,
            ret: false,
            argument: String::new(),
            emulated: false,
            cookie: arg_cookie(site::register(arg.0).unwrap_or(site::NONE), arg.1, true, 0),
        }
    }

    /// Starts and dones at two functions with semaphores, as markers are:
    /// the semaphores are raised while attached and back to 0 after; every
    /// matched collection is counted under its generation with its
    /// objects; a nested start and an unmatched done are misses.
    fn markers_count_and_raise_their_semaphores(multi: bool) {
        // Probes of one test at a time on these functions.
        static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = ONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        std::hint::black_box((&TRACER_TEST_GC_START_SEMAPHORE, &TRACER_TEST_GC_DONE_SEMAPHORE));
        let (mut session, elf) = session();
        let plan = GcPlan {
            source: GcSource::Markers,
            detail: String::new(),
            caveat: None,
            points: vec![
                point(&elf, GcRole::Start, "tracer_test_gc_start", Some("TRACER_TEST_GC_START_SEMAPHORE"), (5, 4)),
                point(&elf, GcRole::Done, "tracer_test_gc_done", Some("TRACER_TEST_GC_DONE_SEMAPHORE"), (5, 8)),
            ],
        };
        let semaphores = || {
            (
                TRACER_TEST_GC_START_SEMAPHORE.load(Ordering::SeqCst),
                TRACER_TEST_GC_DONE_SEMAPHORE.load(Ordering::SeqCst),
            )
        };
        assert_eq!(semaphores(), (0, 0));
        session.attach_gc(&plan, std::process::id(), multi).expect("attached");
        assert_eq!(semaphores(), (1, 1), "the kernel raises each semaphore once, for its one probe");
        for generation in [0, 0, 2] {
            tracer_test_gc_start(generation);
            tracer_test_gc_done(i64::from(generation) * 10 + 1);
        }
        // A start whose done was lost, replaced by the next start, whose
        // collection counts; then a done without a start.
        tracer_test_gc_start(0);
        tracer_test_gc_start(1);
        tracer_test_gc_done(5);
        tracer_test_gc_done(6);
        let readings = session.read().expect("the maps read");
        session.detach_gc();
        assert_eq!(semaphores(), (0, 0), "the kernel lowers the semaphores when the probes go");
        let mine = &readings.gc[&std::process::id()];
        let got: Vec<(i32, u64, u64)> = mine.iter().map(|(g, t)| (*g, t.collections, t.collected)).collect();
        assert_eq!(got, [(0, 2, 2), (1, 1, 5), (2, 1, 21)], "{readings:?}");
        assert!(mine.values().all(|t| t.duration_ns > 0), "{mine:?}");
        let stat = |s: Stat| readings.stats[s as usize];
        assert_eq!((stat(Stat::GcUnended), stat(Stat::GcUnmatched)), (1, 1), "{readings:?}");
        assert_eq!((stat(Stat::GcArgMissing), stat(Stat::GcFull)), (0, 0), "{readings:?}");
        // Nothing counts once detached.
        tracer_test_gc_start(0);
        tracer_test_gc_done(1);
        assert_eq!(session.read().expect("the maps read").gc, readings.gc);
    }

    #[test]
    fn markers_count_and_raise_their_semaphores_through_multi_links() {
        markers_count_and_raise_their_semaphores(true);
    }

    #[test]
    fn markers_count_and_raise_their_semaphores_through_perf_events() {
        markers_count_and_raise_their_semaphores(false);
    }

    /// The function's entry gives the generation and its return (a
    /// uretprobe of the same program) the objects.
    #[test]
    fn a_collection_function_counts_at_its_entry_and_return() {
        for multi in [true, false] {
            let (mut session, elf) = session();
            let start = point(&elf, GcRole::Start, "tracer_test_gc_collect", None, (4, 4));
            let done = GcPoint { role: GcRole::Done, ret: true, cookie: arg_cookie(1, 8, true, 0), ..start.clone() };
            let plan =
                GcPlan { source: GcSource::Function, detail: String::new(), caveat: None, points: vec![start, done] };
            session.attach_gc(&plan, std::process::id(), multi).expect("attached");
            for generation in [0, 1, 1, 2] {
                std::hint::black_box(tracer_test_gc_collect(0, generation));
            }
            let readings = session.read().expect("the maps read");
            session.detach_gc();
            let got: Vec<(i32, u64, u64)> =
                readings.gc[&std::process::id()].iter().map(|(g, t)| (*g, t.collections, t.collected)).collect();
            assert_eq!(got, [(0, 1, 1), (1, 2, 22), (2, 1, 21)], "multi {multi}: {readings:?}");
            assert!(readings.stats.iter().all(|&v| v == 0), "{readings:?}");
        }
    }
}
