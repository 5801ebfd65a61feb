//! Loading the BPF object and attaching it to one target: the only place
//! that touches the kernel. Dropping a [`Session`] detaches every probe.

use std::{
    num::NonZeroU32,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd},
    path::PathBuf,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{MapData, PerCpuArray},
    programs::{
        ProgramFd, UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
    },
};
use thiserror::Error;
use tracer_common::{
    counter::Counter,
    names,
    stats::{STAT_COUNT, Stat},
};

use crate::{
    probes::{ProbeSpec, Program},
    process::Target,
};

/// Failure to load or attach.
#[derive(Debug, Error)]
pub enum AttachError {
    #[error("the kernel refused tracer's BPF object: {0}")]
    Load(Box<aya::EbpfError>),
    #[error("BPF program {name} is missing from tracer's BPF object (a build problem)")]
    ProgramMissing { name: &'static str },
    #[error("BPF program {name} failed to load: {cause}")]
    ProgramLoad { name: &'static str, cause: Box<aya::programs::ProgramError> },
    #[error("BPF map {name} is missing or has the wrong type: {cause}")]
    Map { name: &'static str, cause: Box<aya::maps::MapError> },
    #[error("cannot read the kernel's statistics of BPF program {name}: {cause}")]
    ProgramInfo { name: &'static str, cause: std::io::Error },
    #[error("cannot attach a uprobe to {symbol} in {path} for PID {pid}: {cause}")]
    Attach { symbol: &'static str, path: PathBuf, pid: u32, cause: Box<aya::programs::ProgramError> },
    #[error("required symbol {symbol} is not in {path}; this build of CPython cannot be traced (was it stripped?)")]
    RequiredMissing { symbol: &'static str, path: PathBuf },
    #[error("none of tracer's probe symbols is in {path}; this build of CPython cannot be traced (was it stripped?)")]
    NoProbes { path: PathBuf },
    #[error("process {pid} exited while tracer was attaching; start it again and pass its new PID")]
    TargetExited { pid: u32 },
}

impl AttachError {
    /// Whether the cause is the target rather than tracer.
    #[must_use]
    pub const fn is_bad_input(&self) -> bool {
        matches!(self, Self::RequiredMissing { .. } | Self::NoProbes { .. } | Self::TargetExited { .. })
    }
}

/// One attached probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachedProbe {
    pub symbol: &'static str,
    pub program: Program,
    /// Counter slot, passed to the program as the attach cookie.
    pub slot: u32,
    /// Offset in the image file.
    pub file_offset: u64,
    /// Where that offset is mapped in the target, when it is.
    pub address: Option<u64>,
}

/// Counts read from the kernel, summed over CPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Readings {
    /// One per attached probe, in attach order.
    pub counters: Vec<Counter>,
    /// One per [`Stat`], in [`Stat::ALL`] order.
    pub stats: Vec<u64>,
    /// Hits the kernel did not run a program for because another BPF
    /// program was already running on that CPU (`recursion_misses` in
    /// `bpf_prog_info`), summed over tracer's programs. Such hits are
    /// missing from `counters`.
    pub kernel_misses: u64,
}

/// A loaded BPF object with its probes attached to one process.
pub struct Session {
    // Owns the programs and their links: dropping it detaches everything.
    _ebpf: Ebpf,
    counters: PerCpuArray<MapData, Counter>,
    stats: PerCpuArray<MapData, u64>,
    /// Our programs, to read the kernel's per-program miss counts.
    programs: Vec<(&'static str, ProgramFd)>,
    /// Attached probes, in table order.
    pub attached: Vec<AttachedProbe>,
    /// Optional probes whose symbol the image lacks.
    pub missing: Vec<&'static str>,
}

impl Session {
    /// Loads the BPF object and attaches every probe in `specs` that the
    /// image has to `target` (all its threads, no other process).
    pub fn attach(target: &Target, specs: &[ProbeSpec]) -> Result<Self, AttachError> {
        let mut found = Vec::new();
        let mut missing = Vec::new();
        for spec in specs {
            match target.elf.function(spec.symbol) {
                Some(sym) => found.push((spec, sym.file_offset)),
                None if spec.required => {
                    return Err(AttachError::RequiredMissing { symbol: spec.symbol, path: target.image_path.clone() });
                }
                None => missing.push(spec.symbol),
            }
        }
        if found.is_empty() {
            return Err(AttachError::NoProbes { path: target.image_path.clone() });
        }
        let slots = u32::try_from(found.len()).unwrap_or(u32::MAX);
        let mut ebpf = EbpfLoader::new()
            .override_global(names::TARGET_TGID_GLOBAL, &target.pid, true)
            .map_max_entries(names::COUNTERS_MAP, slots)
            .load(crate::BPF_OBJECT)
            .map_err(|e| AttachError::Load(Box::new(e)))?;

        let mut programs = Vec::with_capacity(Program::ALL.len());
        for program in Program::ALL {
            let name = program.name();
            let uprobe = uprobe_mut(&mut ebpf, program)?;
            let load_err = |cause| AttachError::ProgramLoad { name, cause: Box::new(cause) };
            uprobe.load().map_err(load_err)?;
            let fd = uprobe.fd().map_err(load_err)?.try_clone().map_err(|e| load_err(e.into()))?;
            programs.push((name, fd));
        }

        let pid = NonZeroU32::new(target.pid).ok_or(AttachError::TargetExited { pid: target.pid })?;
        let mut attached = Vec::with_capacity(found.len());
        for (slot, (spec, file_offset)) in (0u32..).zip(found) {
            let point = UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(file_offset),
                cookie: Some(u64::from(slot)),
            };
            uprobe_mut(&mut ebpf, spec.program)?
                .attach(point, &target.host_path, UProbeScope::OneProcess(pid))
                .map_err(|cause| {
                    if std::path::Path::new(&format!("/proc/{}", target.pid)).exists() {
                        AttachError::Attach {
                            symbol: spec.symbol,
                            path: target.image_path.clone(),
                            pid: target.pid,
                            cause: Box::new(cause),
                        }
                    } else {
                        AttachError::TargetExited { pid: target.pid }
                    }
                })?;
            attached.push(AttachedProbe {
                symbol: spec.symbol,
                program: spec.program,
                slot,
                file_offset,
                address: target.address_of_file_offset(file_offset),
            });
        }

        let counters = take_map(&mut ebpf, names::COUNTERS_MAP)?;
        let stats = take_map(&mut ebpf, names::STATS_MAP)?;
        Ok(Self { _ebpf: ebpf, counters, stats, programs, attached, missing })
    }

    /// Reads every counter, summing the per-CPU slots.
    pub fn read(&self) -> Result<Readings, AttachError> {
        let map_err = |name| move |cause| AttachError::Map { name, cause: Box::new(cause) };
        let mut counters = Vec::with_capacity(self.attached.len());
        for probe in &self.attached {
            let per_cpu = self.counters.get(&probe.slot, 0).map_err(map_err(names::COUNTERS_MAP))?;
            counters.push(per_cpu.iter().fold(Counter::default(), |sum, c| sum.merged(*c)));
        }
        let mut stats = Vec::with_capacity(Stat::ALL.len());
        for index in 0..STAT_COUNT {
            let per_cpu = self.stats.get(&index, 0).map_err(map_err(names::STATS_MAP))?;
            stats.push(per_cpu.iter().fold(0u64, |sum, v| sum.saturating_add(*v)));
        }
        let mut kernel_misses = 0u64;
        for (name, fd) in &self.programs {
            let misses = recursion_misses(fd.as_fd()).map_err(|cause| AttachError::ProgramInfo { name, cause })?;
            kernel_misses = kernel_misses.saturating_add(misses);
        }
        Ok(Readings { counters, stats, kernel_misses })
    }
}

/// `recursion_misses` of a loaded program, from `BPF_OBJ_GET_INFO_BY_FD`
/// (aya does not expose this field).
fn recursion_misses(fd: BorrowedFd<'_>) -> std::io::Result<u64> {
    /// The `info` member of `union bpf_attr` (include/uapi/linux/bpf.h).
    #[repr(C)]
    struct InfoByFd {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    // SAFETY: bpf_prog_info is plain integers, for which all-zero is valid.
    let mut info: aya_obj::generated::bpf_prog_info = unsafe { std::mem::zeroed() };
    let mut attr = InfoByFd {
        bpf_fd: u32::try_from(fd.as_raw_fd()).map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?,
        info_len: u32::try_from(size_of_val(&info)).unwrap_or(u32::MAX),
        info: std::ptr::from_mut(&mut info) as u64,
    };
    // SAFETY: attr points to a valid InfoByFd whose `info` points to a
    // writable bpf_prog_info of `info_len` bytes; both outlive the call.
    let rc = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_OBJ_GET_INFO_BY_FD, std::ptr::from_mut(&mut attr), size_of::<InfoByFd>())
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(info.recursion_misses)
}

fn uprobe_mut(ebpf: &mut Ebpf, program: Program) -> Result<&mut UProbe, AttachError> {
    let name = program.name();
    ebpf.program_mut(name)
        .ok_or(AttachError::ProgramMissing { name })?
        .try_into()
        .map_err(|cause| AttachError::ProgramLoad { name, cause: Box::new(cause) })
}

fn take_map<V: aya::Pod>(ebpf: &mut Ebpf, name: &'static str) -> Result<PerCpuArray<MapData, V>, AttachError> {
    let map = ebpf.take_map(name).ok_or(AttachError::Map {
        name,
        cause: Box::new(aya::maps::MapError::InvalidName { name: name.to_owned() }),
    })?;
    PerCpuArray::try_from(map).map_err(|cause| AttachError::Map { name, cause: Box::new(cause) })
}
