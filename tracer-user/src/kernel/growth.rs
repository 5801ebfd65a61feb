//! `--growth`'s probes in the kernel (see [`crate::plan::growth`]):
//! attached for the whole run, never in `--budget`'s windows (a take seen
//! only while a window is open would leave its pool's old sample charged
//! to whoever took it before), through uprobe-multi links or perf-event
//! uprobes; and their maps read: the samples, and what the programs saw.

use std::{ffi::CString, os::fd::AsRawFd as _};

use aya::maps::{HashMap, MapData, PerCpuArray};
use aya_obj::generated::{bpf_attach_type, bpf_cmd};
use tracer_common::{
    growth::{GrowthCounts, PoolKey, PoolSample},
    names,
};

use super::{
    AttachError, Session,
    gc::{PerfLinkAttr, UprobePmu, perf_uprobe, scope},
    multi,
};
use crate::plan::growth::{GrowthPlan, GrowthRole};

/// The program of a probe of `role`.
const fn program_of(role: GrowthRole) -> &'static str {
    match role {
        GrowthRole::Take => names::programs::GROWTH_TAKE,
        GrowthRole::Arena => names::programs::GROWTH_ARENA,
    }
}

impl Session {
    /// Attaches the growth probes of `plan` to `pid` (one process: growth
    /// is `--pid`'s), through a uprobe-multi link each or, without
    /// `multi`, perf-event uprobes. On failure nothing of them stays
    /// attached.
    pub fn attach_growth(&mut self, plan: &GrowthPlan, pid: u32, multi: bool) -> Result<(), AttachError> {
        let path = self.plan.attach_path.clone();
        let mut links = Vec::new();
        for p in &plan.points {
            let name = program_of(p.role);
            let err = |cause| AttachError::Growth {
                name,
                offset: p.file_offset,
                path: path.clone(),
                scope: scope(pid),
                cause,
            };
            if multi {
                let program = self.gc_multi_program(name)?;
                let link =
                    multi::attach(&program, name, &path, (&[(p.file_offset, p.cookie)], false), pid).map_err(|e| {
                        if self.gone(pid) { AttachError::TargetExited { pid } } else { AttachError::Multi(e) }
                    })?;
                links.push(link);
            } else {
                let program = self.gc_perf_program(name)?;
                let pmu = UprobePmu::read()?;
                let c_path =
                    CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| err(std::io::Error::other(e)))?;
                let event = perf_uprobe(&pmu, &c_path, (p.file_offset, false, None), pid).map_err(err)?;
                let mut attr = PerfLinkAttr {
                    prog_fd: u32::try_from(program.as_raw_fd()).unwrap_or(u32::MAX),
                    target_fd: u32::try_from(event.as_raw_fd()).unwrap_or(u32::MAX),
                    attach_type: bpf_attach_type::BPF_PERF_EVENT as u32,
                    flags: 0,
                    bpf_cookie: p.cookie,
                    tail: [0; 8],
                };
                let link = multi::bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr).map_err(err)?;
                // The link holds the event; both go when dropped.
                links.extend([link, event]);
            }
        }
        // Kept with the GC's: the programs stay attached for the run, and
        // go with the session.
        self.gc_links.extend(links);
        Ok(())
    }

    /// What the growth programs saw, summed over CPUs.
    pub fn growth_counts(&self) -> Result<GrowthCounts, AttachError> {
        let map_err = |cause| AttachError::Map { name: names::GROWTH_COUNTS_MAP, cause: Box::new(cause) };
        let map = self
            .ebpf
            .map(names::GROWTH_COUNTS_MAP)
            .ok_or_else(|| map_err(aya::maps::MapError::InvalidName { name: names::GROWTH_COUNTS_MAP.to_owned() }))?;
        let counts: PerCpuArray<&MapData, GrowthCounts> = PerCpuArray::try_from(map).map_err(map_err)?;
        let per_cpu = counts.get(&0, 0).map_err(map_err)?;
        Ok(per_cpu.iter().fold(GrowthCounts::default(), |sum, c| sum.merged(*c)))
    }

    /// Every sample the growth programs keep, of every process.
    pub fn growth_samples(&self) -> Result<Vec<(PoolKey, PoolSample)>, AttachError> {
        let map_err = |cause| AttachError::Map { name: names::GROWTH_POOLS_MAP, cause: Box::new(cause) };
        let map = self
            .ebpf
            .map(names::GROWTH_POOLS_MAP)
            .ok_or_else(|| map_err(aya::maps::MapError::InvalidName { name: names::GROWTH_POOLS_MAP.to_owned() }))?;
        let pools: HashMap<&MapData, PoolKey, PoolSample> = HashMap::try_from(map).map_err(map_err)?;
        // A pool taken again while this runs is read as it is now, or
        // skipped by the iterator: a sample is never read half written.
        Ok(pools.iter().filter_map(Result::ok).collect())
    }

    /// Removes the sample of `key` if it is still `sample` (a take since it
    /// was read has replaced it, and stays). Returns whether it removed it.
    ///
    /// Between the check and the removal a take can still replace it: that
    /// new sample is then lost, a window of microseconds against the
    /// seconds a pool stays empty before the sample is removed.
    pub fn remove_growth_sample(&mut self, key: &PoolKey, sample: &PoolSample) -> Result<bool, AttachError> {
        let map_err = |cause| AttachError::Map { name: names::GROWTH_POOLS_MAP, cause: Box::new(cause) };
        let map = self
            .ebpf
            .map_mut(names::GROWTH_POOLS_MAP)
            .ok_or_else(|| map_err(aya::maps::MapError::InvalidName { name: names::GROWTH_POOLS_MAP.to_owned() }))?;
        let mut pools: HashMap<&mut MapData, PoolKey, PoolSample> = HashMap::try_from(map).map_err(map_err)?;
        match pools.get(key, 0) {
            Ok(now) if now == *sample => {
                pools.remove(key).or_else(super::maps::absent).map_err(map_err)?;
                Ok(true)
            }
            Ok(_) | Err(aya::maps::MapError::KeyNotFound) => Ok(false),
            Err(cause) => Err(map_err(cause)),
        }
    }
}
