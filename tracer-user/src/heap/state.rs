//! What the interpreter itself knows of its heap, where tracer can find it:
//! the heads of the collector's generation lists (in each interpreter's
//! state, from `_PyRuntime.interpreters.head`), and pymalloc's arena table
//! and its count of blocks it passed to the C library
//! (`raw_allocated_blocks`). The census needs neither to find the pools;
//! the heads tell a list's end from an object, and the arena table checks
//! the scan.
//!
//! Each version's offsets are checked in the process: the collector's
//! `generation0` must point into its own state, at three generations that
//! end before `generation0` and `permanent_generation`, and from 3.13 the
//! interpreter's `gc` must be where `_Py_DebugOffsets` says.

use std::{collections::HashSet, path::Path};

use super::{
    HeapError,
    memory::{Memory, word, word32},
};
use crate::{
    discover::{debuginfo, process::proc_root, pymalloc},
    hash::BuildIdentity,
    python::{
        Abi,
        heap::{GC_GENERATION_SIZE, GENERATIONS, Obmalloc, arena_object, obmalloc_state},
    },
    stacks::Process,
};

/// Where the first generation can start in the collector's state, at the
/// earliest: after `trash_delete_later`, `trash_delete_nesting`, `enabled`
/// and `debug` (`Include/internal/pycore_gc.h`, v3.11.7 to v3.14.8).
const FIRST_GENERATION: u64 = 20;

/// `_PyRuntime.interpreters.main` is this many bytes after
/// `interpreters.head` (`Include/internal/pycore_runtime.h`, v3.11.7 to
/// v3.14.8, `struct pyinterpreters`).
const INTERPRETERS_MAIN_AFTER_HEAD: u64 = 8;

/// Interpreters followed at most.
const MAX_INTERPRETERS: usize = 256;
/// Arena table slots read at most: 2^20 arenas are 1 TiB.
const MAX_ARENAS: u32 = 1 << 20;

/// pymalloc's arena table, as the interpreter keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaTable {
    /// `(index, address, pool_address)` of each slot that has an arena.
    pub arenas: Vec<(u32, u64, u64)>,
    pub maxarenas: u32,
    /// Blocks `PyObject_Malloc` passed to the C library, still allocated.
    pub raw_allocated_blocks: i64,
}

/// What was found.
#[derive(Debug, Default)]
pub struct State {
    /// The interpreters' states.
    pub interpreters: Vec<u64>,
    /// The generation lists' heads, permanent generation included.
    pub heads: HashSet<u64, BuildIdentity>,
    /// Why the heads are not known, where they are not.
    pub heads_missing: Option<String>,
    /// Whether an interpreter's collector was running when read.
    pub collecting: bool,
    /// Words of the interpreters' states that could not be read.
    pub unreadable: u64,
    /// Interpreters not followed past [`MAX_INTERPRETERS`].
    pub interpreters_cut: u64,
    /// The main interpreter's arena table, or why it was not found.
    pub arenas: Option<Result<ArenaTable, String>>,
}

/// Where the static variables of pymalloc's state are in the target
/// (3.11), found from symbol tables before the target is stopped, since
/// reading a debug file takes a while; `None` for versions that keep the
/// state in the interpreter's.
#[must_use]
pub fn statics_of(process: &Process, abi: &dyn Abi, debug_dir: Option<&Path>) -> Option<Result<[u64; 3], String>> {
    match abi.heap().obmalloc {
        Obmalloc::Statics { arenas, maxarenas, raw_allocated_blocks } => {
            Some(statics(process, [arenas, maxarenas, raw_allocated_blocks], debug_dir))
        }
        Obmalloc::Embedded { .. } | Obmalloc::Pointer { .. } => None,
    }
}

/// Reads what `process` knows of its heap; `statics` from [`statics_of`].
pub fn read(
    process: &Process,
    memory: &mut Memory,
    abi: &dyn Abi,
    statics: Option<&Result<[u64; 3], String>>,
) -> Result<State, HeapError> {
    let layout = abi.heap();
    let pid = process.target.pid;
    check_debug_offsets(process, memory, abi)?;
    let mut state = State::default();
    let offsets = process.offsets();
    let head = process.runtime.wrapping_add(offsets.runtime.interpreters_head);
    let mut interp = memory.word(head)?.unwrap_or_else(|| {
        state.unreadable += 1;
        0
    });
    while interp != 0 && !state.interpreters.contains(&interp) {
        if state.interpreters.len() >= MAX_INTERPRETERS {
            state.interpreters_cut += 1;
            break;
        }
        state.interpreters.push(interp);
        interp = memory.word(interp.wrapping_add(offsets.interpreter.next))?.unwrap_or_else(|| {
            state.unreadable += 1;
            0
        });
    }
    let generations_end = layout.generation0.min(layout.permanent);
    for &interp in &state.interpreters {
        let gc = interp.wrapping_add(layout.interp_gc);
        let span = GENERATIONS * GC_GENERATION_SIZE;
        match memory.word(gc.wrapping_add(layout.generation0))? {
            Some(first)
                if first >= gc.saturating_add(FIRST_GENERATION)
                    && first.saturating_add(span) <= gc.saturating_add(generations_end)
                    && first.is_multiple_of(4) =>
            {
                state.heads.extend((0..GENERATIONS).map(|i| first + i * GC_GENERATION_SIZE));
                state.heads.insert(gc.wrapping_add(layout.permanent));
            }
            found => {
                state.heads_missing = Some(format!(
                    "the collector state of PID {pid}'s interpreter at {interp:#x} does not match tracer's table for Python {} (generation0 is {})",
                    process.version,
                    found.map_or_else(|| "unreadable".to_owned(), |g| format!("{g:#x}"))
                ));
            }
        }
        match memory.read(gc.wrapping_add(layout.collecting), 4)? {
            Some(b) if word32(&b, 0) != 0 => state.collecting = true,
            Some(_) => {}
            None => state.unreadable += 1,
        }
    }
    if state.interpreters.is_empty() {
        state.heads_missing = Some(format!("PID {pid} has no interpreter state (not initialised, or finalised)"));
    }
    // pymalloc's arena table is the main interpreter's (an isolated
    // subinterpreter has its own, 3.12+): `interpreters.main`, the word
    // after `interpreters.head` (`struct pyinterpreters`,
    // Include/internal/pycore_runtime.h, v3.11.7 to v3.14.8: a mutex, then
    // `head`, then `main`). `head` is the newest interpreter, not the main
    // one, once a subinterpreter exists.
    let main = memory.word(head.wrapping_add(INTERPRETERS_MAIN_AFTER_HEAD))?;
    state.arenas = match main {
        Some(main) if main != 0 && state.interpreters.contains(&main) => {
            Some(arena_table(memory, layout.obmalloc, main, statics))
        }
        Some(main) if main != 0 => Some(Err(format!(
            "the main interpreter ({main:#x}) is not on the interpreters' list; the list changed while read?"
        ))),
        Some(_) => None,
        None => {
            state.unreadable += 1;
            Some(Err("the main interpreter's address could not be read".to_owned()))
        }
    };
    Ok(state)
}

/// From 3.13: the interpreter's `gc` where `_Py_DebugOffsets` says it is.
fn check_debug_offsets(process: &Process, memory: &mut Memory, abi: &dyn Abi) -> Result<(), HeapError> {
    let Some(layout) = abi.debug_offsets_layout() else { return Ok(()) };
    let Some(bytes) = memory.read(process.runtime, layout.size())? else { return Ok(()) };
    let field = "interpreter_state.gc";
    let table = abi.heap().interp_gc;
    match layout.read(&bytes, field) {
        Some(published) if published != table => Err(HeapError::OffsetMismatch {
            pid: process.target.pid,
            image: process.target.image_path.display().to_string(),
            version: process.version.to_string(),
            field,
            published,
            table,
        }),
        _ => Ok(()),
    }
}

/// The arena table of the interpreter at `interp`, or why it cannot be
/// read.
fn arena_table(
    memory: &mut Memory,
    obmalloc: Obmalloc,
    interp: u64,
    statics: Option<&Result<[u64; 3], String>>,
) -> Result<ArenaTable, String> {
    let read = |memory: &mut Memory, address: u64| memory.word(address).ok().flatten();
    let (arenas, maxarenas, raw) = match obmalloc {
        Obmalloc::Statics { .. } => {
            let [a, m, r] = statics.ok_or("pymalloc's variables were not looked up")?.clone()?;
            (read(memory, a), read(memory, m), read(memory, r))
        }
        Obmalloc::Embedded { offset } => at_state(memory, interp + offset),
        Obmalloc::Pointer { offset } => match read(memory, interp + offset) {
            Some(state) if state != 0 => at_state(memory, state),
            _ => {
                return Err(format!(
                    "the interpreter's obmalloc pointer (at {:#x}) is unreadable or NULL",
                    interp + offset
                ));
            }
        },
    };
    let (Some(arenas), Some(maxarenas), Some(raw)) = (arenas, maxarenas, raw) else {
        return Err("pymalloc's state cannot be read".to_owned());
    };
    let maxarenas = u32::try_from(maxarenas & 0xFFFF_FFFF).unwrap_or(0);
    if maxarenas > MAX_ARENAS || (maxarenas > 0 && arenas == 0) {
        return Err(format!("pymalloc's state says {maxarenas} arena slots at {arenas:#x}, which is not plausible"));
    }
    let len = usize::try_from(u64::from(maxarenas) * arena_object::SIZE).unwrap_or(0);
    let bytes = if len == 0 {
        Vec::new()
    } else {
        memory
            .read(arenas, len)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("the arena table at {arenas:#x} cannot be read"))?
    };
    let slots = bytes.chunks_exact(usize::try_from(arena_object::SIZE).unwrap_or(48));
    let arenas = slots
        .zip(0u32..)
        .filter_map(|(slot, i)| {
            let address = word(slot, arena_object::ADDRESS);
            (address != 0).then(|| (i, address, word(slot, arena_object::POOL_ADDRESS)))
        })
        .collect();
    Ok(ArenaTable { arenas, maxarenas, raw_allocated_blocks: raw.cast_signed() })
}

/// `(arenas, maxarenas, raw_allocated_blocks)` of a `struct
/// _obmalloc_state` at `state`, as words to be masked by the caller.
fn at_state(memory: &mut Memory, state: u64) -> (Option<u64>, Option<u64>, Option<u64>) {
    let mut read = |offset: u64| memory.word(state + offset).ok().flatten();
    let arenas = read(obmalloc_state::ARENAS);
    let maxarenas = read(obmalloc_state::MAXARENAS).map(|w| u64::from(word32(&w.to_le_bytes(), 0)));
    (arenas, maxarenas, read(obmalloc_state::RAW_ALLOCATED_BLOCKS))
}

/// The addresses in the target of the static variables `names`, from the
/// symbol table of the image or of its debug file.
fn statics(process: &Process, names: [&str; 3], debug_dir: Option<&Path>) -> Result<[u64; 3], String> {
    let target = &process.target;
    // 3.9's `_PyRuntime` is in .bss, with no bytes in the file.
    let runtime = (target.elf.symbol("_PyRuntime").map(|s| s.address))
        .or_else(|| target.elf.zero_filled("_PyRuntime"))
        .ok_or("the image has no _PyRuntime symbol")?;
    let bias = process.runtime.wrapping_sub(runtime);
    let mut files = vec![target.host_path.clone()];
    if let Ok(Some(dwarf)) =
        debuginfo::locate(&target.image_path, &proc_root(target.pid), debug_dir, Some(&target.host_path))
        && dwarf.path != target.host_path
    {
        files.push(dwarf.path);
    }
    for file in &files {
        if let [Some(a), Some(m), Some(r)] = pymalloc::variables(file, &names)[..] {
            return Ok([a, m, r].map(|v| v.wrapping_add(bias)));
        }
    }
    Err(format!(
        "pymalloc's variables ({}) are in no symbol table of {} or a debug file of it (install its debug symbols)",
        names.join(", "),
        target.image_path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_obmalloc_state_is_read_where_the_version_puts_it() {
        let mut fake = vec![0u8; 1200];
        fake[512..520].copy_from_slice(&0x1234_5670u64.to_le_bytes());
        fake[520..524].copy_from_slice(&16u32.to_le_bytes());
        fake[524..528].copy_from_slice(&0xFFFF_FFFFu32.to_le_bytes());
        fake[1088..1096].copy_from_slice(&77u64.to_le_bytes());
        let mut memory = Memory::new(std::process::id());
        let (a, m, r) = at_state(&mut memory, fake.as_ptr() as u64);
        assert_eq!((a, m, r), (Some(0x1234_5670), Some(16), Some(77)));
    }
}
