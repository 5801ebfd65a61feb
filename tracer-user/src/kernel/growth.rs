//! `--growth`'s probes in the kernel (see [`crate::plan::growth`]):
//! attached for the whole run, never in `--budget`'s windows (a take seen
//! only while a window is open would leave its pool's old sample charged
//! to whoever took it before), through uprobe-multi links or perf-event
//! uprobes; and their maps read: the samples, and what the programs saw.

use std::ffi::CString;

use aya::maps::{MapData, PerCpuArray};
use tracer_common::{
    growth::{GrowthCounts, PoolKey, PoolSample},
    names,
};

use super::{
    AttachError, Session,
    gc::{UprobePmu, perf_link, perf_uprobe, scope},
    multi,
};
use crate::plan::growth::{GrowthPlan, GrowthRole};

/// The program of a probe of `role`.
const fn program_of(role: GrowthRole) -> &'static str {
    match role {
        GrowthRole::Take => names::programs::GROWTH_TAKE,
        GrowthRole::Carve => names::programs::GROWTH_CARVE,
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
                let link = perf_link(&program, &event, p.cookie).map_err(err)?;
                // The link holds the event; both go when dropped.
                links.extend([link, event]);
            }
        }
        // Attached until the session goes, or until the profile stops
        // growth ([`Self::detach_growth`]).
        self.growth_links.extend(links);
        // The arena's probe ends each new arena's mapped sample: the
        // mapped programs need not leave mappings of an arena's size.
        if plan.points.iter().any(|p| p.role == GrowthRole::Arena) {
            self.arenas_seen(true)?;
        }
        Ok(())
    }

    /// Detaches the growth probes, and only them: their maps (the counts
    /// and the samples taken) stay readable.
    pub fn detach_growth(&mut self) {
        self.growth_links.clear();
        self.detach_mapped();
    }

    /// Detaches pymalloc's growth probes only: the C library's programs
    /// stay (see [`super::mapped`]), and leave arenas' mappings alone again
    /// (no probe ends them now).
    pub fn detach_growth_pools(&mut self) -> Result<(), AttachError> {
        self.growth_links.clear();
        self.arenas_seen(false)
    }

    /// Tells the mapped programs whether the arena probe ends each new
    /// arena's mapped sample.
    fn arenas_seen(&mut self, seen: bool) -> Result<(), AttachError> {
        let map_err = |cause| AttachError::Map { name: names::GROWTH_ARENAS_SEEN_MAP, cause: Box::new(cause) };
        let map = self.ebpf.map_mut(names::GROWTH_ARENAS_SEEN_MAP).ok_or_else(|| {
            map_err(aya::maps::MapError::InvalidName { name: names::GROWTH_ARENAS_SEEN_MAP.to_owned() })
        })?;
        let mut flag: aya::maps::Array<&mut MapData, u32> = aya::maps::Array::try_from(map).map_err(map_err)?;
        flag.set(0, u32::from(seen), 0).map_err(map_err)
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
        self.hash_entries(names::GROWTH_POOLS_MAP)
    }

    /// Removes the sample of `key` if it is still `sample` (a take since it
    /// was read has replaced it, and stays). Returns whether it removed it:
    /// a take between the check and the removal is lost, a window of
    /// microseconds against the seconds a pool stays empty before the
    /// sample is removed.
    pub fn remove_growth_sample(&mut self, key: &PoolKey, sample: &PoolSample) -> Result<bool, AttachError> {
        self.remove_unchanged(names::GROWTH_POOLS_MAP, key, sample)
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::{growth as g, site, stack, stats::Stat};

    use super::*;
    use crate::{
        discover::elf::ElfImage,
        kernel::{GrowthOptions, LoadOptions},
        plan::growth::{GrowthPoint, GrowthRole},
    };

    /// `struct arena_object`'s first five words, as pymalloc lays them out:
    /// `address`, `pool_address`, the pool counts, `freepools`, `nextarena`.
    #[repr(C)]
    struct Arena([u64; 5]);

    /// One test at a time calls the stand-ins (each probes the arena's).
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// An `allocate_from_new_pool` stand-in: `usable_arenas` in `%rdi`.
    #[unsafe(no_mangle)]
    #[inline(never)]
    extern "C" fn tracer_test_growth_take(usable: *const Arena) -> u64 {
        std::hint::black_box(usable as u64)
    }

    /// An `arena_map_mark_used` stand-in: the arena's address in `%rsi`.
    #[unsafe(no_mangle)]
    #[inline(never)]
    extern "C" fn tracer_test_growth_arena(state: u64, base: u64) -> u64 {
        std::hint::black_box(state ^ base)
    }

    /// A carve block stand-in: the pool in `%rdi`.
    #[unsafe(no_mangle)]
    #[inline(never)]
    extern "C" fn tracer_test_growth_carve(pool: u64) -> u64 {
        std::hint::black_box(pool)
    }

    /// A single-stepped carve block's stand-in: the arena in `%rdi`, whose
    /// `pool_address` is the pool.
    #[unsafe(no_mangle)]
    #[inline(never)]
    extern "C" fn tracer_test_growth_carve_load(arena: *const Arena) -> u64 {
        std::hint::black_box(arena as u64)
    }

    fn point(elf: &ElfImage, role: GrowthRole, symbol: &str, register: u16) -> GrowthPoint {
        let p = point_with(elf, role, symbol, register);
        GrowthPoint {
            cookie: if role == GrowthRole::Take {
                p.cookie
            } else {
                g::arena_cookie(site::register(register).unwrap_or(site::NONE), false)
            },
            ..p
        }
    }

    fn point_with(elf: &ElfImage, role: GrowthRole, symbol: &str, register: u16) -> GrowthPoint {
        let f = elf.function(symbol).unwrap_or_else(|| panic!("{symbol} in the test binary"));
        let operand = site::register(register).unwrap_or(site::NONE);
        GrowthPoint {
            role,
            function: symbol.to_owned(),
            address: f.address,
            file_offset: f.file_offset,
            offset: 0,
            instruction: String::new(),
            emulated: false,
            reason: String::new(),
            reads: String::new(),
            cookie: match role {
                GrowthRole::Take => g::take_cookie(operand, 0),
                GrowthRole::Carve => g::carve_cookie(operand, 0, false),
                GrowthRole::Arena => g::arena_cookie(operand, true),
            },
        }
    }

    /// Every take sampled (one in 1): each outcome counted, each pool's
    /// sample kept (charged to no stack: this process has no Python frames
    /// to walk, which is counted), a retake ending the old sample, a new
    /// arena's first pool its address rounded up to a pool, the samples
    /// read back and removed only while unchanged.
    fn takes_are_told_apart_and_sampled(multi: bool) {
        let _one = ONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        std::hint::black_box(tracer_test_growth_take as extern "C" fn(*const Arena) -> u64);
        std::hint::black_box(tracer_test_growth_arena as extern "C" fn(u64, u64) -> u64);
        let (plan, elf) = crate::kernel::tests::main_plan();
        let growth = GrowthOptions { every: 1, pools: 16, stacks: 16 };
        let options = LoadOptions { growth: Some(growth), ..LoadOptions::default() };
        let mut session = Session::load(plan, std::process::id(), &options).expect("the object loads");
        let growth_plan = GrowthPlan {
            points: vec![
                point(&elf, GrowthRole::Take, "tracer_test_growth_take", 5),
                point(&elf, GrowthRole::Arena, "tracer_test_growth_arena", 4),
            ],
            ..GrowthPlan::default()
        };
        session.attach_growth(&growth_plan, std::process::id(), multi).expect("attached");
        let (reused, carved) = (0x7000_0000_4000_u64, 0x7000_0000_8000_u64);
        let with_free = Arena([0x7000_0000_0000, carved, 0, reused, 0]);
        let without = Arena([0x7000_0000_0000, carved, 0, 0, 0]);
        tracer_test_growth_take(&raw const with_free);
        tracer_test_growth_take(&raw const without);
        tracer_test_growth_take(&raw const without);
        tracer_test_growth_take(std::ptr::null());
        tracer_test_growth_arena(1, 0x7100_0000_1000);
        // Memory that cannot be read: not counted as any outcome.
        tracer_test_growth_take(std::ptr::without_provenance(8));
        let counts = session.growth_counts().expect("the counts read");
        let mut samples = session.growth_samples().expect("the samples read");
        samples.retain(|(k, _)| k.tgid == std::process::id());
        samples.sort_by_key(|(k, _)| k.pool);
        let pools: Vec<u64> = samples.iter().map(|(k, _)| k.pool).collect();
        assert_eq!(pools, [reused, carved, 0x7100_0000_4000], "{samples:?}");
        let no_config = stack::why::FAILED + Stat::StackNoConfig as u64;
        assert!(samples.iter().all(|(_, s)| s.stack == no_config), "{samples:?}");
        let want = g::GrowthCounts {
            takes: 5,
            reused: 1,
            carved: 2,
            new_arena: 1,
            arenas: 1,
            sampled: 4,
            ended: 1,
            walk_failed: 4,
            unread: 1,
            run_ns: counts.run_ns,
            ..g::GrowthCounts::default()
        };
        assert_eq!(counts, want);
        assert!(counts.run_ns > 0);
        // Removed while unchanged; a sample replaced since is left.
        let (key, sample) = samples[1];
        let stale = PoolSample { taken_ns: sample.taken_ns.wrapping_sub(1), ..sample };
        assert!(!session.remove_growth_sample(&key, &stale).expect("a lookup"));
        assert!(session.remove_growth_sample(&key, &sample).expect("removed"));
        assert!(!session.remove_growth_sample(&key, &sample).expect("gone"));
        assert_eq!(
            session.growth_samples().expect("read").iter().filter(|(k, _)| k.tgid == std::process::id()).count(),
            2
        );
        // Detached alone: a take after counts nothing, and the samples
        // taken stay to be read.
        session.detach_growth();
        tracer_test_growth_take(&raw const without);
        assert_eq!(session.growth_counts().expect("the counts read"), counts);
        assert_eq!(
            session.growth_samples().expect("read").iter().filter(|(k, _)| k.tgid == std::process::id()).count(),
            2
        );
    }

    /// Only carves probed (one in 1 sampled): each carve's pool sampled,
    /// from a register or read at the arena's `pool_address` (counted as
    /// single-stepped where the cookie says), a carve of the same address
    /// ending the old sample, a null pool unread, and a new arena counted
    /// without a take of its own (the carve took its first pool).
    #[test]
    fn carves_alone_are_sampled() {
        let _one = ONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        std::hint::black_box(tracer_test_growth_carve as extern "C" fn(u64) -> u64);
        std::hint::black_box(tracer_test_growth_carve_load as extern "C" fn(*const Arena) -> u64);
        std::hint::black_box(tracer_test_growth_arena as extern "C" fn(u64, u64) -> u64);
        let (plan, elf) = crate::kernel::tests::main_plan();
        let growth = GrowthOptions { every: 1, pools: 16, stacks: 16 };
        let options = LoadOptions { growth: Some(growth), ..LoadOptions::default() };
        let mut session = Session::load(plan, std::process::id(), &options).expect("the object loads");
        let mut load = point_with(&elf, GrowthRole::Carve, "tracer_test_growth_carve_load", 5);
        let (first, constant) = site::memory(5, 8).unwrap();
        load.cookie = g::carve_cookie(first, constant, true);
        let growth_plan = GrowthPlan {
            points: vec![
                point_with(&elf, GrowthRole::Carve, "tracer_test_growth_carve", 5),
                load,
                point_with(&elf, GrowthRole::Arena, "tracer_test_growth_arena", 4),
            ],
            ..GrowthPlan::default()
        };
        session.attach_growth(&growth_plan, std::process::id(), true).expect("attached");
        let (one, two) = (0x7200_0000_4000_u64, 0x7200_0000_8000_u64);
        tracer_test_growth_carve(one);
        tracer_test_growth_carve(one);
        tracer_test_growth_carve(0);
        let arena = Arena([0x7200_0000_0000, two, 0, 0, 0]);
        tracer_test_growth_carve_load(&raw const arena);
        tracer_test_growth_arena(1, 0x7300_0000_1000);
        let counts = session.growth_counts().expect("the counts read");
        let mut pools: Vec<u64> = session
            .growth_samples()
            .expect("the samples read")
            .iter()
            .filter(|(k, _)| k.tgid == std::process::id())
            .map(|(k, _)| k.pool)
            .collect();
        pools.sort_unstable();
        assert_eq!(pools, [one, two]);
        let want = g::GrowthCounts {
            carved: 3,
            carve_hits: 4,
            carve_stepped: 1,
            arenas: 1,
            sampled: 3,
            ended: 1,
            walk_failed: 3,
            unread: 1,
            run_ns: counts.run_ns,
            ..g::GrowthCounts::default()
        };
        assert_eq!(counts, want);
        session.detach_growth();
    }

    #[test]
    fn takes_are_told_apart_and_sampled_through_multi_links() {
        takes_are_told_apart_and_sampled(true);
    }

    #[test]
    fn takes_are_told_apart_and_sampled_through_perf_events() {
        takes_are_told_apart_and_sampled(false);
    }
}
