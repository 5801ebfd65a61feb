//! Loading the BPF object and attaching it to one target: the only place
//! that touches the kernel. Dropping a [`Session`] detaches every probe.

use std::{num::NonZeroU32, path::PathBuf};

use aya::{
    Ebpf, EbpfLoader,
    maps::{MapData, PerCpuArray},
    programs::{
        UProbe,
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
    probes::{Program, ProbeSpec},
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
    ProgramLoad {
        name: &'static str,
        cause: Box<aya::programs::ProgramError>,
    },
    #[error("BPF map {name} is missing or has the wrong type: {cause}")]
    Map {
        name: &'static str,
        cause: Box<aya::maps::MapError>,
    },
    #[error("cannot attach a uprobe to {symbol} in {path} for PID {pid}: {cause}")]
    Attach {
        symbol: &'static str,
        path: PathBuf,
        pid: u32,
        cause: Box<aya::programs::ProgramError>,
    },
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
}

/// A loaded BPF object with its probes attached to one process.
pub struct Session {
    // Owns the programs and their links: dropping it detaches everything.
    _ebpf: Ebpf,
    counters: PerCpuArray<MapData, Counter>,
    stats: PerCpuArray<MapData, u64>,
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

        for program in Program::ALL {
            let name = program.name();
            let uprobe = uprobe_mut(&mut ebpf, program)?;
            uprobe.load().map_err(|cause| AttachError::ProgramLoad { name, cause: Box::new(cause) })?;
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
        Ok(Self { _ebpf: ebpf, counters, stats, attached, missing })
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
        Ok(Readings { counters, stats })
    }
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
