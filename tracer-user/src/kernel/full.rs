//! Test-only: `TRACER_TEST_FULL_MAPS=NAME,NAME…` loads each named hash map
//! of the BPF object with room for one entry and fills that entry with a
//! placeholder (an all-zero key and value), so that every event that needs
//! a new entry finds the map full. The capacity tests
//! (tests/tests/capacity.rs) use it where filling the map for real would
//! take thousands of processes or threads at once; docs/development.md
//! says so.
//!
//! No event ever uses the placeholder's key: every key of these maps
//! begins with a process or thread id, and id 0 is the kernel's idle task,
//! which runs no uprobe; the stack maps' keys are hashes, none of them 0
//! in practice. An LRU map gets room for one entry and no placeholder: it
//! evicts rather than refuses, so each new entry pushes out the last one,
//! which is what thousands of threads at once would do to it.
//!
//! `NAME=N` loads a hash map with room for N entries and nothing in it,
//! so that the first N processes or threads to need one take them all and
//! the next finds it full until one of them is removed (a process that
//! exits frees its entries): `WALKS=1` with `--exe`. (An LRU map evicts
//! instead, as with no `=N`.)
//!
//! `UNWIND_ROWS`, the unwinder's rows, is an array: loaded with room for
//! one row, every module with more finds no room for its rows.
//!
//! One array is filled too: `EMPTY_FRAMES`, the stack of calls in flight
//! every thread's starts from with `--live`, whose bound is its depth, not
//! a number of entries. Full, it is [`FRAME_DEPTH`] frames of no kind,
//! which no call or return matches, so that a thread's first calls find
//! its stack full.

use std::os::fd::{AsFd as _, AsRawFd as _};

use aya::maps::{Array, Map, MapData, MapType};
use aya_obj::generated::bpf_cmd;
use tracer_common::live::{FRAME_DEPTH, Frames};

use super::AttachError;

/// The environment variable, read at every load.
pub const VARIABLE: &str = "TRACER_TEST_FULL_MAPS";

/// The maps the variable names, none when it is unset or empty.
#[must_use]
pub fn wanted() -> Vec<String> {
    std::env::var(VARIABLE)
        .map(|v| v.split(',').map(str::trim).filter(|n| !n.is_empty()).map(str::to_owned).collect())
        .unwrap_or_default()
}

/// An entry of the variable: the map's name, and the room `NAME=N` gives
/// it (`None`: room for one, filled).
pub(super) fn parse(entry: &str) -> Result<(&str, Option<u32>), AttachError> {
    match entry.split_once('=') {
        None => Ok((entry, None)),
        Some((name, room)) => match room.parse::<u32>() {
            Ok(n) if n > 0 => Ok((name, Some(n))),
            _ => Err(AttachError::FullMaps(format!("{entry}: the room after = is a number of entries, at least 1"))),
        },
    }
}

/// The `map_elem` part of `union bpf_attr` for `BPF_MAP_UPDATE_ELEM`.
#[repr(C)]
struct UpdateAttr {
    map_fd: u32,
    pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// Puts the placeholder in `map` (`name`), loaded with room for one entry.
pub(super) fn fill(name: &str, map: &MapData) -> Result<(), AttachError> {
    let refuse = |why: String| AttachError::FullMaps(format!("{name}: {why}"));
    let info = map.info().map_err(|e| refuse(e.to_string()))?;
    let per_cpu = match info.map_type().map_err(|e| refuse(e.to_string()))? {
        MapType::Hash => false,
        MapType::PerCpuHash => true,
        // Room for one is as full as an LRU map gets.
        MapType::LruHash | MapType::LruPerCpuHash => return Ok(()),
        other => return Err(refuse(format!("a {other:?} map cannot be filled (only hash maps refuse an entry)"))),
    };
    if info.max_entries() != 1 {
        return Err(refuse(format!("has room for {} entries, not 1", info.max_entries())));
    }
    let value_size = usize::try_from(info.value_size()).unwrap_or(usize::MAX);
    // A per-CPU value is one 8-byte aligned copy per possible CPU.
    let value_len = if per_cpu {
        let cpus = aya::util::nr_cpus().map_err(|(what, e)| refuse(format!("{what}: {e}")))?;
        value_size.next_multiple_of(8).saturating_mul(cpus)
    } else {
        value_size
    };
    let key = vec![0u8; usize::try_from(info.key_size()).unwrap_or(usize::MAX)];
    let value = vec![0u8; value_len];
    let mut attr = UpdateAttr {
        map_fd: u32::try_from(map.fd().as_fd().as_raw_fd()).map_err(|e| refuse(e.to_string()))?,
        pad: 0,
        key: key.as_ptr() as u64,
        value: value.as_ptr() as u64,
        flags: 0,
    };
    let size = libc::c_long::try_from(size_of::<UpdateAttr>()).unwrap_or(0);
    // SAFETY: attr is laid out as the kernel's bpf_attr for a map update,
    // its size is passed with it, and its key and value point to buffers
    // of the map's key and value sizes that outlive the call.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, bpf_cmd::BPF_MAP_UPDATE_ELEM as libc::c_long, &raw mut attr, size) };
    if rc != 0 {
        return Err(refuse(std::io::Error::last_os_error().to_string()));
    }
    Ok(())
}

/// Makes the template of every thread's stack of calls (`EMPTY_FRAMES`,
/// `name`) a full one.
pub(super) fn fill_frames(name: &str, map: &mut Map) -> Result<(), AttachError> {
    let refuse = |why: String| AttachError::FullMaps(format!("{name}: {why}"));
    let mut template: Array<&mut MapData, Frames> = Array::try_from(map).map_err(|e| refuse(e.to_string()))?;
    let full = Frames { depth: FRAME_DEPTH as u64, ..Frames::default() };
    template.set(0, full, 0).map_err(|e| refuse(e.to_string()))
}
