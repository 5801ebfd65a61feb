//! The heap of a live CPython process by type, read from outside: the
//! `jmap -histo` of Python (`tracer heap`), and the census `tracer attach`'s
//! production profile takes each interval ([`census`], [`model::diff`]).
//!
//! Nothing is attached and no code runs in the target; its memory is read
//! with `process_vm_readv`, in bulk, while it runs (an estimate) or while
//! every thread is stopped with ptrace (`--stop`, exact). Only a few pools
//! are held at a time, so tracer's memory stays small whatever the heap's
//! size.
//!
//! 1. [`pools`] finds pymalloc's pools by scanning anonymous mappings for
//!    headers that check out, and [`state`] reads pymalloc's arena table,
//!    where tracer finds it, to check the scan.
//! 2. The pools are read in bulk; [`classify`] sorts each allocated block
//!    into an object of a type ([`types`]), an object on a free list, or no
//!    object.
//! 3. [`outside`] finds the objects outside the pools: GC objects on the
//!    collector's lists, and what tuples, lists and dicts hold.
//! 4. [`model`] is what is reported; [`print`] draws the table.

pub mod bounds;
pub mod classify;
pub mod dicts;
pub mod image;
pub mod maps;
pub mod memory;
pub mod model;
pub mod names;
pub mod outside;
pub mod pools;
pub mod print;
pub mod state;
pub mod stop;
pub mod tally;
pub mod types;

use std::{collections::HashSet, path::PathBuf, time::Instant};

use thiserror::Error;

use self::{
    classify::Leads,
    maps::Regions,
    memory::Memory,
    model::{ArenaCheck, Census, Cost, Outside, Pymalloc, SizeClass, Totals, TypeRow},
    pools::{Header, PoolSet},
    stop::{Interrupts, Stopped},
    tally::{Reason, Tally},
    types::{Builtins, Context, TypeTable},
};
use crate::{
    error::Classify,
    hash::BuildIdentity,
    python::{self, Abi, TypeNameOffsets, VersionError, heap::Geometry},
    stacks::{Process, StackError},
};

/// Why a census could not be taken.
#[derive(Debug, Error)]
pub enum HeapError {
    #[error(transparent)]
    Stack(#[from] StackError),
    #[error(transparent)]
    Version(#[from] VersionError),
    #[error("PID {pid} exited during the heap census; take it again while the process runs")]
    Exited { pid: u32 },
    #[error("PID {pid} called exec during the heap census: it runs another program, whose heap is not this one's")]
    Exec { pid: u32 },
    #[error("cannot read the memory of PID {pid}: {cause}")]
    Read { pid: u32, cause: std::io::Error },
    #[error("cannot read {path} of PID {pid}: {cause}")]
    Proc { pid: u32, path: String, cause: std::io::Error },
    #[error(
        "cannot stop PID {pid} (thread {tid}) with ptrace: {cause}; is it traced already (gdb, strace)? Without --stop the census is an estimate"
    )]
    Stop { pid: u32, tid: u32, cause: std::io::Error },
    #[error(
        "cannot stop PID {pid}: its threads kept multiplying (each of {rounds} rounds of stopping the threads it had found new ones); the threads stopped were let go. Without --stop the census is an estimate, taken while it runs"
    )]
    Multiplying { pid: u32, rounds: u32 },
    #[error("the heap census was interrupted by a signal; the target was let go")]
    Interrupted,
    #[error(
        "_Py_DebugOffsets of PID {pid} ({image}) says {field} is {published}, but tracer's table for Python {version} says {table}"
    )]
    OffsetMismatch { pid: u32, image: String, version: String, field: &'static str, published: u64, table: u64 },
    #[error(
        "{image} (PID {pid}) defines no {symbol}, which every supported CPython exports; is it really the interpreter?"
    )]
    NoSymbol { pid: u32, image: String, symbol: &'static str },
    /// The census thread could not narrow its capabilities.
    #[error(transparent)]
    Capabilities(#[from] crate::capabilities::CapabilityError),
}

impl Classify for HeapError {
    /// A PID that is no supported CPython, or that went away: the user's
    /// to fix.
    fn is_bad_input(&self) -> bool {
        match self {
            Self::Stack(e) => e.is_bad_input(),
            Self::Version(_) | Self::Exited { .. } | Self::Exec { .. } | Self::NoSymbol { .. } => true,
            Self::Read { .. }
            | Self::Proc { .. }
            | Self::Stop { .. }
            | Self::Multiplying { .. }
            | Self::Interrupted
            | Self::OffsetMismatch { .. }
            | Self::Capabilities(_) => false,
        }
    }
}

/// How a census is taken.
#[derive(Clone, Debug)]
pub struct Options {
    /// Stop every thread of the target while it is read.
    pub stop: bool,
    /// Also look for the interpreter's debug file here (for 3.11's arena
    /// table).
    pub debug_dir: Option<PathBuf>,
    pub limits: bounds::Limits,
    /// Catch `SIGINT`, `SIGTERM` and `SIGHUP` while a census reads, and end
    /// it with [`HeapError::Interrupted`] (letting a stopped target go):
    /// for a command of its own. A caller that handles those signals
    /// itself (the attach loop) leaves it off; a stopped target is then
    /// let go when the census ends, or by the kernel if tracer dies.
    pub catch_signals: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self { stop: false, debug_dir: None, limits: bounds::Limits::default(), catch_signals: true }
    }
}

/// What the census cannot follow outside the pools, in every census.
pub const OUTSIDE_PARTIAL: &str = "outside pymalloc's pools, only GC objects and what tuples, lists and combined dicts hold are found: a large object held only by an instance's attributes (its values, a split dict or a slot), a set, a closure cell or a C extension is not counted (in unaccounted)";

/// Pools read in one batch: 4 MiB.
const POOLS_PER_BATCH: usize = 256;

/// A process whose heap can be read, again and again: its interpreter
/// found, its version's tables checked, its symbols looked up once. Each
/// [`Heap::census`] reads the heap anew (types included: a type object
/// freed since may be something else now).
#[derive(Debug)]
pub struct Heap {
    process: Process,
    abi: &'static dyn Abi,
    builtins: Builtins,
    statics: Option<Result<[u64; 3], String>>,
    options: Options,
    /// The program opened: a census of another one exec'd is refused.
    stamp: Option<crate::discover::process::ProgramStamp>,
}

impl Heap {
    /// Finds `pid`'s interpreter and what a census needs of it.
    pub fn open(pid: u32, options: &Options) -> Result<Self, HeapError> {
        let stamp = crate::discover::process::ProgramStamp::of(pid);
        let process = Process::open(pid)?;
        let abi = python::abi_for(pid, process.version)?;
        let symbol = |symbol: &'static str| {
            let target = &process.target;
            let image = || target.image_path.display().to_string();
            let sym = target.elf.symbol(symbol).ok_or_else(|| HeapError::NoSymbol { pid, image: image(), symbol })?;
            target.address_of_file_offset(sym.file_offset).ok_or_else(|| HeapError::NoSymbol {
                pid,
                image: image(),
                symbol,
            })
        };
        let builtins = Builtins {
            type_: symbol("PyType_Type")?,
            str_: symbol("PyUnicode_Type")?,
            bytes: symbol("PyBytes_Type")?,
            bytearray: symbol("PyByteArray_Type")?,
        };
        let statics = state::statics_of(&process, abi, options.debug_dir.as_deref());
        Ok(Self { process, abi, builtins, statics, options: options.clone(), stamp })
    }

    /// Takes a census.
    pub fn census(&self) -> Result<Census, HeapError> {
        let _interrupts = self.options.catch_signals.then(Interrupts::catch);
        let pid = self.process.target.pid;
        let mut memory = Memory::new(pid);
        if self.stamp.is_some_and(|s| s.changed(pid)) {
            return Err(HeapError::Exec { pid });
        }
        let stopped = if self.options.stop { Some(Stopped::stop(pid)?) } else { None };
        let started = Instant::now();
        let read = take(&self.process, self.abi, self.builtins, &mut memory, self.statics.as_ref(), &self.options);
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        let stopped_ms = stopped.map(|s| s.resume().as_secs_f64() * 1000.0);
        // Read from another program's memory, from its start or since.
        if self.stamp.is_some_and(|s| s.changed(pid)) {
            return Err(HeapError::Exec { pid });
        }
        let (tally, types, found, scan_notes, rss) = read?;
        let cost = Cost {
            elapsed_ms,
            bytes_read: memory.bytes_read,
            reads: memory.calls,
            types_read: types.reads,
            failed_reads: memory.failed_ranges,
        };
        let mut census = report(&tally, &types, &found, rss, cost);
        census.pid = pid;
        census.python = self.process.version.to_string();
        census.image = self.process.target.image_path.display().to_string();
        census.exact = stopped_ms.is_some();
        census.stopped_ms = stopped_ms;
        census.partial.extend(scan_notes);
        // Stopped, the pools are read exactly; outside them the census
        // finds only what leads there, which it says, stopped or not.
        census.partial.push(OUTSIDE_PARTIAL.to_owned());
        Ok(census)
    }
}

/// Takes one census of the heap of `pid` ([`Heap::open`] then
/// [`Heap::census`]).
pub fn census(pid: u32, options: &Options) -> Result<Census, HeapError> {
    Heap::open(pid, options)?.census()
}

/// What [`take`] read.
type Read = (Tally, TypeTable, bounds::Found, Vec<String>, Option<u64>);

/// Everything a census reads, while the target is stopped if it is.
fn take(
    process: &Process,
    abi: &dyn Abi,
    builtins: Builtins,
    memory: &mut Memory,
    statics: Option<&Result<[u64; 3], String>>,
    options: &Options,
) -> Result<Read, HeapError> {
    let pid = process.target.pid;
    let interrupted = Interrupts::happened;
    let regions = Regions::read(pid)?;
    let rss = maps::rss(pid)?;
    let state = state::read(process, memory, abi, statics)?;
    let geometry = abi.heap().geometry;
    let scan = pools::scan(memory, &regions, geometry, &interrupted)?;
    let mut notes: Vec<String> = maps::allocator_note(pid).into_iter().collect();
    if scan.unreadable > 0 {
        notes.push(format!(
            "{} places in anonymous mappings could not be read (unmapped while scanned)",
            scan.unreadable
        ));
    }
    let mut cx = Context { memory, regions: &regions, pools: &PoolSet::new(&scan.pools, geometry) };
    let (mut tally, types, found) =
        decode(&scan.pools, abi, builtins, &mut cx, &state.heads, options.limits, &interrupted)?;
    tally.rejected[Reason::StateUnreadable as usize] += state.unreadable;
    tally.rejected[Reason::InterpretersCut as usize] += state.interpreters_cut;
    let changed = tally.pools_changed;
    if changed > 0 {
        notes.push(format!(
            "{changed} pools changed while they were read, twice; their blocks were judged one by one, without the pools' free lists (--stop for an exact census)"
        ));
    }
    tally.arena_check =
        state.arenas.as_ref().and_then(|a| a.as_ref().ok()).map(|table| check(table, &scan.pools, geometry));
    if let Some(Err(why)) = &state.arenas {
        notes.push(format!("pymalloc's arena table was not read, so the scan is unchecked: {why}"));
    }
    if state.collecting {
        notes.push(
            "a garbage collection was running: the collector's lists were being rewritten, and objects outside the pools may be missed"
                .to_owned(),
        );
    }
    if let Some(why) = &state.heads_missing {
        notes.push(format!(
            "the collector's lists' heads are unknown ({why}); GC objects outside the pools may be missed"
        ));
    }
    if found.gc_truncated {
        notes.push(format!(
            "the walk of the collector's lists stopped at {} objects outside the pools",
            found.gc_objects
        ));
    }
    if found.items_truncated {
        notes.push(format!("list and tuple items were read up to {} of them", found.items_read));
    }
    if found.referenced_truncated {
        notes.push(format!("objects held by lists and tuples were read up to {} of them", found.referenced_objects));
    }
    if found.rounds_left > 0 {
        notes.push(format!(
            "containers outside the pools were followed {} deep: {} item arrays and dict tables deeper were left unread",
            options.limits.rounds, found.rounds_left
        ));
    }
    if types.cut_types > 0 {
        notes.push(format!(
            "{} types past the most tracked ({}): their objects are left out of the census (types_cut)",
            types.cut_types,
            types::MAX_TYPES
        ));
    }
    Ok((tally, types, found, notes, rss))
}

/// The census proper, from whatever memory `cx` reads (a process's, or an
/// image's: see [`image`]): the blocks of `pools` classified, and the
/// objects outside them that those blocks and the generation lists' `heads`
/// lead to.
fn decode(
    pools: &[Header],
    abi: &dyn Abi,
    builtins: Builtins,
    cx: &mut Context<'_>,
    heads: &HashSet<u64, BuildIdentity>,
    limits: bounds::Limits,
    interrupted: &dyn Fn() -> bool,
) -> Result<(Tally, TypeTable, bounds::Found), HeapError> {
    let unicode = abi.frames().unicode;
    let names = TypeNameOffsets { ht_qualname: abi.ht_qualname(), unicode, dict_keys: abi.heap().dict_keys };
    let mut types = TypeTable::new(abi.heap(), names, builtins);
    let mut tally = Tally::default();
    let mut leads = Leads::default();
    tally.pools_changed = read_pools(pools, &mut types, cx, &mut tally, &mut leads, unicode)?;
    tally.arenas = pools.iter().map(|p| p.arena_index).collect::<HashSet<u32>>().len() as u64;
    let found = outside::census(&mut types, cx, &mut tally, &mut leads, heads, limits, unicode, interrupted)?;
    tally.rejected[Reason::TypesCut as usize] += types.cut_objects;
    Ok((tally, types, found))
}

/// Reads the pools in batches and classifies their blocks. A pool whose
/// copy fails its checks (the target changed it while it was read) is read
/// once more, alone; if that copy fails too, its blocks are judged one by
/// one without its free list (a free block's first word is a link, which
/// no object's count is, or 0), and it is counted as changed. Returns how
/// many were.
fn read_pools(
    pools: &[Header],
    types: &mut TypeTable,
    cx: &mut Context<'_>,
    tally: &mut Tally,
    leads: &mut Leads,
    unicode: python::frames::UnicodeOffsets,
) -> Result<u64, HeapError> {
    let pool_size = usize::try_from(types.layout().geometry.pool).unwrap_or(16384);
    let mut buf = vec![0u8; POOLS_PER_BATCH * pool_size];
    let mut ok = Vec::new();
    let mut again = Vec::new();
    for batch in pools.chunks(POOLS_PER_BATCH) {
        if Interrupts::happened() {
            return Err(HeapError::Interrupted);
        }
        let ranges: Vec<(u64, usize)> = batch.iter().map(|p| (p.address, pool_size)).collect();
        cx.memory.read_ranges(&ranges, &mut buf, &mut ok)?;
        for (i, scanned) in batch.iter().enumerate() {
            let copy = &buf[i * pool_size..(i + 1) * pool_size];
            if !ok[i] || !one_pool(scanned.address, copy, true, types, cx, tally, leads, unicode)? {
                again.push(scanned.address);
            }
        }
    }
    let mut changed = 0;
    for address in again {
        let Some(copy) = cx.memory.read(address, pool_size)? else {
            changed += 1;
            continue;
        };
        if !one_pool(address, &copy, true, types, cx, tally, leads, unicode)? {
            changed += 1;
            one_pool(address, &copy, false, types, cx, tally, leads, unicode)?;
        }
    }
    Ok(changed)
}

/// Classifies the pool at `address` from its copy, with its free list
/// (`with_list`) or without; false where the copy is no consistent pool.
#[allow(clippy::too_many_arguments, reason = "the census's state, passed apart so that each piece is borrowed once")]
fn one_pool(
    address: u64,
    copy: &[u8],
    with_list: bool,
    types: &mut TypeTable,
    cx: &mut Context<'_>,
    tally: &mut Tally,
    leads: &mut Leads,
    unicode: python::frames::UnicodeOffsets,
) -> Result<bool, HeapError> {
    let Some(header) = Header::parse(address, copy, types.layout().geometry.pool) else { return Ok(false) };
    let free = if with_list {
        let Some(free) = header.free_blocks(copy) else { return Ok(false) };
        free
    } else {
        [0; pools::MAX_BLOCKS.div_ceil(64)]
    };
    classify::pool(&header, copy, &free, types, cx, tally, leads, unicode)?;
    Ok(true)
}

/// The scan's pools against the arena table's.
fn check(table: &state::ArenaTable, pools: &[Header], geometry: Geometry) -> ArenaCheck {
    let found: std::collections::HashMap<u64, u32, BuildIdentity> =
        pools.iter().map(|p| (p.address, p.arena_index)).collect();
    let mut check = ArenaCheck {
        arenas: table.arenas.len() as u64,
        raw_allocated_blocks: table.raw_allocated_blocks,
        ..ArenaCheck::default()
    };
    let mut in_table: HashSet<u64, BuildIdentity> = HashSet::default();
    for &(index, address, pool_address) in &table.arenas {
        let mut pool = address.next_multiple_of(geometry.pool);
        let end = pool_address.min(address.saturating_add(geometry.arena));
        while pool < end {
            check.pools += 1;
            in_table.insert(pool);
            if found.get(&pool) == Some(&index) {
                check.found += 1;
            }
            pool += geometry.pool;
        }
    }
    check.not_in_table = pools.iter().filter(|p| !in_table.contains(&p.address)).count() as u64;
    check
}

/// The census from what was counted.
fn report(tally: &Tally, types: &TypeTable, found: &bounds::Found, rss: Option<u64>, cost: Cost) -> Census {
    let mut rows: indexmap::IndexMap<&str, TypeRow> = indexmap::IndexMap::new();
    let mut outside = Outside {
        gc_objects: found.gc_objects,
        referenced: found.referenced_objects,
        items_read: found.items_read,
        cut: found.cut(),
        ..Outside::default()
    };
    for (i, counts) in tally.types.iter().enumerate() {
        let count = counts.pool_objects + counts.outside_objects;
        if count == 0 {
            continue;
        }
        let name = types.infos[i].name.as_str();
        let row = rows.entry(name).or_insert_with(|| TypeRow { name: name.to_owned(), count: 0, bytes: 0, outside: 0 });
        row.count += count;
        row.bytes = row
            .bytes
            .saturating_add(counts.pool_bytes)
            .saturating_add(counts.outside_bytes)
            .saturating_add(counts.buffer_bytes);
        row.outside += counts.outside_objects;
        outside.objects += counts.outside_objects;
        outside.bytes = outside.bytes.saturating_add(counts.outside_bytes);
        outside.buffer_bytes = outside.buffer_bytes.saturating_add(counts.buffer_bytes);
    }
    let mut types_out: Vec<TypeRow> = rows.into_values().collect();
    types_out
        .sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| b.count.cmp(&a.count)).then_with(|| a.name.cmp(&b.name)));
    let mut pymalloc = Pymalloc {
        arenas: tally.arenas,
        pools_changed: tally.pools_changed,
        arena_table: tally.arena_check.clone(),
        ..Pymalloc::default()
    };
    for (i, c) in tally.classes.iter().enumerate() {
        if c.pools + c.empty_pools == 0 {
            continue;
        }
        pymalloc.blocks += *c;
        pymalloc.size_classes.push(SizeClass { size: (i as u64 + 1) * 16, blocks: *c });
    }
    let accounted = (pymalloc.blocks.pools + pymalloc.blocks.empty_pools)
        .saturating_mul(types.layout().geometry.pool)
        .saturating_add(outside.bytes)
        .saturating_add(outside.buffer_bytes);
    let unaccounted = rss.map(|r| i64::try_from(i128::from(r) - i128::from(accounted)).unwrap_or(i64::MIN));
    let rejected = Reason::ALL
        .iter()
        .filter(|r| tally.rejected[**r as usize] > 0)
        .map(|r| (r.key().to_owned(), tally.rejected[*r as usize]))
        .collect();
    Census {
        pid: 0,
        python: String::new(),
        image: String::new(),
        exact: false,
        stopped_ms: None,
        types: types_out,
        totals: Totals { pymalloc, outside, rss, accounted, unaccounted, rejected },
        partial: Vec::new(),
        cost,
    }
}
