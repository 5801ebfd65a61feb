//! Reading the session's maps: counters, returns and misses, summed over
//! CPUs; removing an exited process's entries; and the BPF log.

use std::{
    collections::{BTreeMap, HashMap},
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd},
    sync::{Arc, Mutex},
};

use tracer_common::{
    counter::{Counter, CounterKey, GATE_SLOT, NESTED_SLOT, STEPPED_SLOT},
    live::{LiveEntry, LiveKey},
    names,
    returns::Returned,
    stack::{Stack, StackKey, WalkConfig},
    stats::{STAT_COUNT, Stat},
    types::{ObjectKey, TypeCounts, TypeKey},
};

use super::{AttachError, Session};

/// One probe's counts, summed over CPUs (and in a total, over processes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeReading {
    pub calls: u64,
    pub bytes: u64,
    /// Its returns (zero for a probe without return probes).
    pub returned: Returned,
    /// With `--native`: its calls by another probed libc function (glibc's
    /// `realloc` relaying to `malloc`), not in `calls` and `bytes`.
    pub nested: Counter,
    /// Passes of its gated sites (a jump probed for the inlined copy it
    /// leads into) that went elsewhere: no call, but hits all the same.
    pub gate_other: u64,
    /// Of its hits, those at single-stepped sites, where it has sites of
    /// both kinds ([`crate::plan::PlannedProbe::stepped_apart`]); 0 else.
    pub stepped: u64,
}

/// Counts read from the kernel, summed over CPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Readings {
    /// Per probe, by slot, summed over processes.
    pub probes: Vec<ProbeReading>,
    /// Per process: its counts of each probe, by slot.
    pub per_process: BTreeMap<u32, Vec<ProbeReading>>,
    /// With `--types`: per process, creations and destructions by type
    /// object address.
    pub types: BTreeMap<u32, BTreeMap<u64, TypeCounts>>,
    /// Calls and bytes by [`tracer_common::sizes::index`], over every
    /// process.
    pub sizes: Vec<Counter>,
    /// With `--stacks`: calls and bytes per (process, probe, stack).
    pub stacks: Vec<(StackKey, Counter)>,
    /// One per [`Stat`], in [`Stat::ALL`] order.
    pub stats: Vec<u64>,
    /// Hits the kernel did not run a program for because another BPF
    /// program was already running on that CPU (`recursion_misses` in
    /// `bpf_prog_info`), summed over tracer's programs. Such hits are
    /// missing from the counts.
    pub kernel_misses: u64,
    /// The batch reads of tracer's maps that fell back to a key at a time
    /// since tracer started ([`super::batch::fallbacks`]): nothing
    /// missing, but reported, as every fallback is.
    pub batch_fallbacks: super::batch::Fallbacks,
    /// Per process, its garbage collections by generation (see
    /// [`super::gc`]).
    pub gc: BTreeMap<u32, BTreeMap<i32, tracer_common::gc::GcTotals>>,
    /// With `--live`, per domain in [`tracer_common::sizes::Domain::ALL`]
    /// order, what the live table did, summed over CPUs.
    pub live: Vec<tracer_common::live::LiveCounts>,
}

/// Collects what the BPF programs log (`--bpf-log`) until the run loop
/// drains it.
#[derive(Clone, Debug, Default)]
pub struct LogCollector {
    lines: Arc<Mutex<Vec<(log::Level, String)>>>,
}

impl log::Log for LogCollector {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        if let Ok(mut lines) = self.lines.lock() {
            lines.push((record.level(), format!("{}", record.args())));
        }
    }

    fn flush(&self) {}
}

/// A delete that failed only because the key was not there.
pub(super) fn absent(e: aya::maps::MapError) -> Result<(), aya::maps::MapError> {
    match &e {
        aya::maps::MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        _ => Err(e),
    }
}

impl ProbeReading {
    /// Adds another process's counts; the pointer sum wraps.
    #[must_use]
    pub const fn merged(self, other: Self) -> Self {
        Self {
            calls: self.calls.saturating_add(other.calls),
            bytes: self.bytes.saturating_add(other.bytes),
            returned: self.returned.merged(other.returned),
            nested: self.nested.merged(other.nested),
            gate_other: self.gate_other.saturating_add(other.gate_other),
            stepped: self.stepped.saturating_add(other.stepped),
        }
    }

    /// The hits that priced like its calls: a nested call is two (its
    /// site's mark and its entry), and a gate's pass that went elsewhere
    /// one.
    #[must_use]
    pub const fn priced_calls(&self) -> u64 {
        self.calls.saturating_add(self.nested.calls.saturating_mul(2)).saturating_add(self.gate_other)
    }

    /// Every hit the target paid for: [`Self::priced_calls`] and the
    /// returns read.
    #[must_use]
    pub const fn hits(&self) -> u64 {
        self.priced_calls().saturating_add(self.returned.returns)
    }
}

impl Session {
    /// Reads every counter, summing the per-CPU values.
    pub fn read(&self) -> Result<Readings, AttachError> {
        let map_err = |name| move |cause| AttachError::Map { name, cause: Box::new(cause) };
        let slots = self.plan.probes.len();
        let mut probes = vec![ProbeReading::default(); slots];
        let mut per_process: BTreeMap<u32, Vec<ProbeReading>> = BTreeMap::new();
        // Hits whose slot names no probe: tracer only ever sets cookies to
        // probe slots, so this stays 0 unless tracer itself is wrong.
        let mut stray = 0u64;
        // The stacks and types first (the pipeline counts a call, then its
        // type and stack), then the counts: read while the target runs, they
        // never show more events than the counts (read the other way round,
        // 200 busy threads showed 0.1% more stacks than calls). The sizes
        // after the counts: the calls of unknown size are the counts less
        // the sizes' buckets, which read first would leave every call made
        // between the two reads unknown and mark whole bytes partial.
        let mut types: BTreeMap<u32, BTreeMap<u64, TypeCounts>> = BTreeMap::new();
        for (key, per_cpu) in per_cpu_hash(&self.types, names::TYPES_MAP)? {
            let sum = per_cpu.iter().fold(TypeCounts::default(), |sum, v| sum.merged(*v));
            types.entry(key.tgid).or_default().insert(key.type_address, sum);
        }
        let mut stacks = Vec::new();
        for (key, per_cpu) in per_cpu_hash(&self.stack_counts, names::STACK_COUNTS_MAP)? {
            // Process 0 is the idle task, which no event comes from: only
            // the test knob's placeholder (`kernel::full`) has it.
            if key.tgid != 0 {
                stacks.push((key, per_cpu.iter().fold(Counter::default(), |sum, c| sum.merged(*c))));
            }
        }
        for (key, per_cpu) in per_cpu_hash(&self.counters, names::COUNTERS_MAP)? {
            if key.tgid == 0 {
                // No process has id 0: the test knob's placeholder (full).
                continue;
            }
            let sum = per_cpu.iter().fold(Counter::default(), |sum, c| sum.merged(*c));
            let nested = key.slot & NESTED_SLOT != 0;
            let gate = key.slot & GATE_SLOT != 0;
            let stepped = key.slot & STEPPED_SLOT != 0;
            let Some(slot) =
                usize::try_from(key.slot & !(NESTED_SLOT | GATE_SLOT | STEPPED_SLOT)).ok().filter(|&s| s < slots)
            else {
                stray = stray.saturating_add(sum.calls);
                continue;
            };
            if stepped {
                per_process.entry(key.tgid).or_insert_with(|| vec![ProbeReading::default(); slots])[slot].stepped =
                    sum.calls;
                probes[slot].stepped = probes[slot].stepped.saturating_add(sum.calls);
                continue;
            }
            if gate {
                per_process.entry(key.tgid).or_insert_with(|| vec![ProbeReading::default(); slots])[slot].gate_other =
                    sum.calls;
                probes[slot].gate_other = probes[slot].gate_other.saturating_add(sum.calls);
                continue;
            }
            if nested {
                per_process.entry(key.tgid).or_insert_with(|| vec![ProbeReading::default(); slots])[slot].nested = sum;
                probes[slot].nested = probes[slot].nested.merged(sum);
                continue;
            }
            let own = &mut per_process.entry(key.tgid).or_insert_with(|| vec![ProbeReading::default(); slots])[slot];
            (own.calls, own.bytes) = (sum.calls, sum.bytes);
            let total = &mut probes[slot];
            total.calls = total.calls.saturating_add(sum.calls);
            total.bytes = total.bytes.saturating_add(sum.bytes);
        }
        for (key, per_cpu) in per_cpu_hash(&self.returns, names::RETURNS_MAP)? {
            let sum = per_cpu.iter().fold(Returned::default(), |sum, r| sum.merged(*r));
            let Some(slot) = usize::try_from(key.slot).ok().filter(|&s| s < slots) else {
                stray = stray.saturating_add(sum.returns);
                continue;
            };
            per_process.entry(key.tgid).or_insert_with(|| vec![ProbeReading::default(); slots])[slot].returned = sum;
            probes[slot].returned = probes[slot].returned.merged(sum);
        }
        let sizes = per_cpu_sums(
            &self.sizes,
            names::SIZES_MAP,
            tracer_common::sizes::DOMAINS * tracer_common::sizes::BUCKETS,
            |sum: Counter, c| sum.merged(c),
        )?;
        let mut stats = per_cpu_sums(&self.stats, names::STATS_MAP, STAT_COUNT, |sum: u64, v| sum.saturating_add(v))?;
        stats[Stat::SlotOutOfRange as usize] = stats[Stat::SlotOutOfRange as usize].saturating_add(stray);
        let mut kernel_misses = 0u64;
        let perf = self.programs.iter().map(|(p, fd)| (p.name(), fd.as_fd()));
        let multi = self.multi_programs.iter().map(|(p, fd)| (p.name(), fd.as_fd()));
        let gc = self.gc_programs.iter().map(|(name, fd)| (*name, fd.as_fd()));
        for (name, fd) in perf.chain(multi).chain(gc) {
            let misses = recursion_misses(fd).map_err(|cause| AttachError::ProgramInfo { name, cause })?;
            kernel_misses = kernel_misses.saturating_add(misses);
        }
        let gc = self.read_gc()?;
        let mut live = Vec::new();
        for domain in tracer_common::sizes::Domain::ALL {
            let per_cpu = self.live_counts.get(&(domain as u32), 0).map_err(map_err(names::LIVE_COUNTS_MAP))?;
            live.push(per_cpu.iter().fold(tracer_common::live::LiveCounts::default(), |sum, c| sum.merged(*c)));
        }
        // Last: every read above counted its fallbacks.
        let batch_fallbacks = super::batch::fallbacks();
        Ok(Readings { probes, per_process, types, sizes, stacks, stats, kernel_misses, batch_fallbacks, gc, live })
    }

    /// With `--live`, tells the programs where the target's pymalloc
    /// state is, so that an allocation pymalloc serves inline has its block.
    pub fn set_pymalloc(&mut self, config: tracer_common::live::Pymalloc) -> Result<(), AttachError> {
        let name = names::PYMALLOC_MAP;
        let map = self.ebpf.map_mut(name).ok_or_else(|| AttachError::Map {
            name,
            cause: Box::new(aya::maps::MapError::InvalidName { name: name.to_owned() }),
        })?;
        let mut array: aya::maps::Array<_, tracer_common::live::Pymalloc> =
            aya::maps::Array::try_from(map).map_err(|cause| AttachError::Map { name, cause: Box::new(cause) })?;
        array.set(0, config, 0).map_err(|cause| AttachError::Map { name, cause: Box::new(cause) })
    }

    /// With `--live`, forgets every thread's calls in flight, once every
    /// probe is attached: a call that entered while the attach went on may
    /// have returned before its return probe was attached, and its frame
    /// would stay on its thread's stack, taken for a call in flight (the
    /// thread's later calls nested in it, their blocks untracked). A call in
    /// flight now loses only its own block: its return is counted as
    /// unmatched.
    pub fn forget_frames(&mut self) -> Result<(), AttachError> {
        self.clear::<tracer_common::live::Frames>(names::FRAMES_MAP)?;
        // A walk waiting for its call's frame: a stack hash and a slot.
        self.clear::<[u8; 16]>(names::WALKED_MAP)
    }

    /// Removes every entry of the map `name`, keyed by thread id.
    fn clear<V: aya::Pod>(&mut self, name: &'static str) -> Result<(), AttachError> {
        let map_err = |cause| AttachError::Map { name, cause: Box::new(cause) };
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| map_err(aya::maps::MapError::InvalidName { name: name.to_owned() }))?;
        let mut threads: aya::maps::HashMap<_, u32, V> = aya::maps::HashMap::try_from(map).map_err(map_err)?;
        let keys: Vec<u32> = threads.keys().filter_map(Result::ok).collect();
        for tid in keys {
            threads.remove(&tid).or_else(absent).map_err(map_err)?;
        }
        Ok(())
    }

    /// With `--live`, every block in the live table now. A block freed
    /// while this walks the table may be in it or not.
    pub fn live_blocks(&self) -> Vec<(tracer_common::live::LiveKey, tracer_common::live::LiveEntry)> {
        // An entry removed between the walk's steps ends the walk's view
        // of it, never the walk (aya's iterator skips a key gone by then).
        self.live.iter().filter_map(Result::ok).collect()
    }

    /// With `--live`, per thread, the call its next API call would judge
    /// stale ([`tracer_common::live::Frames::left`]): at the end, that
    /// call never comes.
    pub fn left_calls(&self) -> Result<HashMap<u32, (tracer_common::live::Frame, u64)>, AttachError> {
        let name = names::FRAMES_MAP;
        let map_err = |cause| AttachError::Map { name, cause: Box::new(cause) };
        let map =
            self.ebpf.map(name).ok_or_else(|| map_err(aya::maps::MapError::InvalidName { name: name.to_owned() }))?;
        let threads: aya::maps::HashMap<_, u32, tracer_common::live::Frames> =
            aya::maps::HashMap::try_from(map).map_err(map_err)?;
        // A thread pushed out of the map while this walks it is skipped
        // (aya's iterator goes on past a key gone by then).
        Ok(threads
            .iter()
            .filter_map(Result::ok)
            .filter_map(|(tid, frames)| Some((tid, (frames.left()?, frames.pushes))))
            .collect())
    }

    /// With `--live`, takes the block at `address` of process `tgid` out
    /// of the live table, as a free does: its entry, if it was there.
    pub fn take_block(&mut self, tgid: u32, address: u64) -> Result<Option<LiveEntry>, AttachError> {
        let key = LiveKey { tgid, reserved: 0, address };
        let map_err = |cause| AttachError::Map { name: names::LIVE_MAP, cause: Box::new(cause) };
        let Some(entry) = self.live.get(&key, 0).map(Some).or_else(|e| absent(e).map(|()| None)).map_err(map_err)?
        else {
            return Ok(None);
        };
        self.live.remove(&key).or_else(absent).map_err(map_err)?;
        Ok(Some(entry))
    }

    /// Removes every entry of process `tgid` from the counter and return
    /// maps, once its final counts are read: its room goes back to the
    /// maps, and a later process given the same PID starts from zero.
    pub fn remove_process(&mut self, tgid: u32) -> Result<(), AttachError> {
        let map_err = |name| move |cause| AttachError::Map { name, cause: Box::new(cause) };
        for slot in (0u32..).take(self.plan.probes.len()) {
            let key = CounterKey { tgid, slot };
            // A probe the process never hit has no entry to remove.
            self.counters.remove(&key).or_else(absent).map_err(map_err(names::COUNTERS_MAP))?;
            for marked in [slot | NESTED_SLOT, slot | GATE_SLOT, slot | STEPPED_SLOT] {
                let key = CounterKey { tgid, slot: marked };
                self.counters.remove(&key).or_else(absent).map_err(map_err(names::COUNTERS_MAP))?;
            }
            self.returns.remove(&key).or_else(absent).map_err(map_err(names::RETURNS_MAP))?;
        }
        let keys: Vec<TypeKey> = self.types.keys().filter_map(Result::ok).filter(|k| k.tgid == tgid).collect();
        for key in keys {
            self.types.remove(&key).or_else(absent).map_err(map_err(names::TYPES_MAP))?;
        }
        let keys: Vec<ObjectKey> = self.objects.keys().filter_map(Result::ok).filter(|k| k.tgid == tgid).collect();
        for key in keys {
            self.objects.remove(&key).or_else(absent).map_err(map_err(names::OBJECTS_MAP))?;
        }
        let keys: Vec<StackKey> = self.stack_counts.keys().filter_map(Result::ok).filter(|k| k.tgid == tgid).collect();
        for key in keys {
            self.stack_counts.remove(&key).or_else(absent).map_err(map_err(names::STACK_COUNTS_MAP))?;
        }
        self.walks.remove(&tgid).or_else(absent).map_err(map_err(names::WALKS_MAP))?;
        for key in self.native_page_keys.remove(&tgid).unwrap_or_default() {
            self.native_pages.remove(&key).or_else(absent).map_err(map_err(names::NATIVE_PAGES_MAP))?;
        }
        self.remove_gc_process(tgid)
    }

    /// With `--stacks`, tells the programs where process `tgid`'s frames
    /// are.
    pub fn set_walk(&mut self, tgid: u32, config: WalkConfig) -> Result<(), AttachError> {
        self.walks
            .insert(tgid, config, 0)
            .map_err(|cause| AttachError::Map { name: names::WALKS_MAP, cause: Box::new(cause) })
    }

    /// The frames of the stack whose hash is `hash`, if the kernel kept
    /// them.
    pub fn stack(&self, hash: u64) -> Result<Option<Stack>, AttachError> {
        match self.stacks.get(&hash, 0) {
            Ok(stack) => Ok(Some(stack)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(cause) => Err(AttachError::Map { name: names::STACKS_MAP, cause: Box::new(cause) }),
        }
    }

    /// With `--native-stacks`, writes `rows` into the rows map from index
    /// `first`.
    pub fn set_rows(&mut self, first: u32, rows: &[tracer_common::unwind::Row]) -> Result<(), AttachError> {
        for (i, row) in (first..).zip(rows) {
            self.unwind_rows
                .set(i, *row, 0)
                .map_err(|cause| AttachError::Map { name: names::UNWIND_ROWS_MAP, cause: Box::new(cause) })?;
        }
        Ok(())
    }

    /// With `--native-stacks`, tells the unwinder where the rows of
    /// process `tgid`'s executable pages are.
    pub fn set_pages(&mut self, tgid: u32, pages: &[(u64, tracer_common::unwind::Page)]) -> Result<(), AttachError> {
        let keys = self.native_page_keys.entry(tgid).or_default();
        for &(page, value) in pages {
            let key = tracer_common::unwind::PageKey { tgid, reserved: 0, page };
            self.native_pages
                .insert(key, value, 0)
                .map_err(|cause| AttachError::Map { name: names::NATIVE_PAGES_MAP, cause: Box::new(cause) })?;
            keys.push(key);
        }
        Ok(())
    }

    /// The native stack whose hash is `hash`, if the kernel kept it.
    pub fn native_stack(&self, hash: u64) -> Result<Option<tracer_common::unwind::NativeStack>, AttachError> {
        match self.native_stacks.get(&hash, 0) {
            Ok(stack) => Ok(Some(stack)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(cause) => Err(AttachError::Map { name: names::NATIVE_STACKS_MAP, cause: Box::new(cause) }),
        }
    }

    /// With `--bpf-log`, what the programs logged since the last call, with
    /// each line's level.
    pub fn drain_bpf_log(&mut self) -> Vec<(log::Level, String)> {
        let Some(logger) = self.logger.as_mut() else { return Vec::new() };
        logger.flush();
        self.log_lines.lines.lock().map(|mut l| std::mem::take(&mut *l)).unwrap_or_default()
    }

    /// With `--bpf-log`, an fd that turns readable when the programs have
    /// logged, so that the log is read before its ring buffer fills.
    #[must_use]
    pub fn bpf_log_fd(&self) -> Option<std::io::Result<std::os::fd::OwnedFd>> {
        self.logger.as_ref().map(|l| l.as_fd().try_clone_to_owned())
    }
}

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

impl Session {
    /// Every entry of the hash map `name` (one rewritten while read is read
    /// as it is now, or skipped: never half written).
    pub(super) fn hash_entries<K: aya::Pod, V: aya::Pod>(
        &self,
        name: &'static str,
    ) -> Result<Vec<(K, V)>, AttachError> {
        let map_err = |cause| AttachError::Map { name, cause: Box::new(cause) };
        let map =
            self.ebpf.map(name).ok_or_else(|| map_err(aya::maps::MapError::InvalidName { name: name.to_owned() }))?;
        let entries: aya::maps::HashMap<&aya::maps::MapData, K, V> =
            aya::maps::HashMap::try_from(map).map_err(map_err)?;
        Ok(entries.iter().filter_map(Result::ok).collect())
    }

    /// The value of `key` in the hash map `name`, if it has one.
    pub(super) fn hash_get<K: aya::Pod, V: aya::Pod>(
        &self,
        name: &'static str,
        key: &K,
    ) -> Result<Option<V>, AttachError> {
        let map_err = |cause| AttachError::Map { name, cause: Box::new(cause) };
        let map =
            self.ebpf.map(name).ok_or_else(|| map_err(aya::maps::MapError::InvalidName { name: name.to_owned() }))?;
        let entries: aya::maps::HashMap<&aya::maps::MapData, K, V> =
            aya::maps::HashMap::try_from(map).map_err(map_err)?;
        match entries.get(key, 0) {
            Ok(value) => Ok(Some(value)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(cause) => Err(map_err(cause)),
        }
    }

    /// Removes `key` from the hash map `name` if its value is still
    /// `value` (the programs may have replaced it since it was read, and
    /// the new one stays). Whether it removed it.
    ///
    /// Between the check and the removal the programs can still replace
    /// it: that new value is then lost, a window of microseconds.
    pub(super) fn remove_unchanged<K: aya::Pod, V: aya::Pod + PartialEq>(
        &mut self,
        name: &'static str,
        key: &K,
        value: &V,
    ) -> Result<bool, AttachError> {
        let map_err = |cause| AttachError::Map { name, cause: Box::new(cause) };
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| map_err(aya::maps::MapError::InvalidName { name: name.to_owned() }))?;
        let mut entries: aya::maps::HashMap<&mut aya::maps::MapData, K, V> =
            aya::maps::HashMap::try_from(map).map_err(map_err)?;
        match entries.get(key, 0) {
            Ok(now) if now == *value => {
                entries.remove(key).or_else(absent).map_err(map_err)?;
                Ok(true)
            }
            Ok(_) | Err(aya::maps::MapError::KeyNotFound) => Ok(false),
            Err(cause) => Err(map_err(cause)),
        }
    }
}

/// Each of the first `len` indexes of the per-CPU array `map` (named
/// `name`), its CPUs' values summed by `merge`: in one batch lookup where
/// the kernel gives one, else one lookup an index.
fn per_cpu_sums<V: aya::Pod + Default>(
    map: &aya::maps::PerCpuArray<aya::maps::MapData, V>,
    name: &'static str,
    len: u32,
    merge: impl Fn(V, V) -> V,
) -> Result<Vec<V>, AttachError> {
    let map_err = |cause| AttachError::Map { name, cause: Box::new(cause) };
    let sum = |values: &[V]| values.iter().fold(V::default(), |sum, v| merge(sum, *v));
    if let Some(all) = super::batch::array_values(map, len).map_err(|e| map_err(aya::maps::MapError::IoError(e)))? {
        return Ok(all.iter().map(|v| sum(v)).collect());
    }
    (0..len).map(|index| map.get(&index, 0).map(|per_cpu| sum(&per_cpu)).map_err(map_err)).collect()
}

/// Every entry of the per-CPU hash map `map` (named `name`), each its
/// values on every possible CPU: in batch lookups where the kernel gives
/// them, else two lookups a key.
pub(super) fn per_cpu_hash<T: std::borrow::Borrow<aya::maps::MapData>, K: aya::Pod, V: aya::Pod>(
    map: &aya::maps::PerCpuHashMap<T, K, V>,
    name: &'static str,
) -> Result<super::batch::PerCpuEntries<K, V>, AttachError> {
    let map_err = |cause| AttachError::Map { name, cause: Box::new(cause) };
    if let Some(all) = super::batch::hash_entries(map).map_err(|e| map_err(aya::maps::MapError::IoError(e)))? {
        return Ok(all);
    }
    map.iter().map(|entry| entry.map(|(k, per_cpu)| (k, per_cpu.to_vec())).map_err(map_err)).collect()
}
