//! What the allocator's free pointers hold in a process (see
//! [`crate::plan::slots`]): read from its memory, as file offsets of the
//! image.

use std::path::{Path, PathBuf};

use procfs::process::{MMapPath, Process};

use crate::{
    discover::{elf::ElfImage, process},
    model::{Level, Note, NoteCode},
    plan::slots::{self, Free, Moved, Pointer},
};

/// What each of `frees`' pointers holds in `pid`, whose image (`elf`) it
/// maps from `image` (the path as it sees it): the file offset of the
/// function in the image, or why it is not known.
#[must_use]
pub fn held(pid: u32, elf: &ElfImage, image: &Path, frees: &[Free]) -> Vec<(&'static str, Result<u64, String>)> {
    held_with(pid, image, frees, |link| elf.file_offset(link))
}

/// As [`held`], with the image's link-time addresses mapped to its file
/// offsets by `file_offset`.
fn held_with(
    pid: u32,
    image: &Path,
    frees: &[Free],
    file_offset: impl Fn(u64) -> Option<u64>,
) -> Vec<(&'static str, Result<u64, String>)> {
    let maps = match mappings(pid, image) {
        Ok(maps) => maps,
        Err(why) => return frees.iter().map(|f| (f.symbol, Err(why.clone()))).collect(),
    };
    let word = |address: u64| {
        let bytes = process::read_memory(pid, address, 8).map_err(|e| e.to_string())?;
        Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| "a short read".to_owned())?))
    };
    // The last mapping first: where a page of the file is mapped twice
    // (the end of the read-only part and the start of the writable one),
    // the writable copy holds the relocated pointers.
    let address_of = |offset: u64| {
        maps.iter().rev().find_map(|&(start, end, at)| {
            let delta = offset.checked_sub(at)?;
            (delta < end - start).then_some(start + delta)
        })
    };
    let offset_of = |address: u64| {
        maps.iter().find_map(|&(start, end, at)| (start..end).contains(&address).then(|| at + (address - start)))
    };
    let read_image = |link: u64| {
        let at = file_offset(link).and_then(address_of).ok_or_else(|| format!("{link:#x} is not mapped"))?;
        word(at)
    };
    frees.iter().map(|f| (f.symbol, slots::holds(f, read_image, word, offset_of))).collect()
}

/// (start, end, file offset) of each of `pid`'s mappings of `image`.
fn mappings(pid: u32, image: &Path) -> Result<Vec<(u64, u64, u64)>, String> {
    let process =
        i32::try_from(pid).ok().and_then(|p| Process::new(p).ok()).ok_or_else(|| format!("PID {pid} is gone"))?;
    let maps = process::maps_of(&process).map_err(|e| format!("cannot read the memory map of PID {pid}: {e}"))?;
    Ok(maps
        .into_iter()
        .filter(|m| matches!(&m.pathname, MMapPath::Path(p) if p == image))
        .map(|m| (m.address.0, m.address.1, m.offset))
        .collect())
}

/// Checks, every interval, that the pointers of the frees probed at their
/// implementation still hold it.
#[derive(Debug)]
pub struct Watch {
    pid: u32,
    image: PathBuf,
    moved: Vec<Moved>,
    /// The link-time addresses the pointers are read at, with their file
    /// offsets.
    offsets: Vec<(u64, u64)>,
    told: bool,
}

impl Watch {
    /// Watches `moved` in `pid`, which maps `elf` from `image`; `None`
    /// where nothing moved.
    #[must_use]
    pub fn new(pid: u32, elf: &ElfImage, image: &Path, moved: &[Moved]) -> Option<Self> {
        if moved.is_empty() {
            return None;
        }
        let offsets = moved
            .iter()
            .filter_map(|m| {
                let link = match m.free.pointer {
                    Pointer::At(at) | Pointer::Through { at, .. } => at,
                };
                Some((link, elf.file_offset(link)?))
            })
            .collect();
        Some(Self { pid, image: image.to_owned(), moved: moved.to_vec(), offsets, told: false })
    }

    /// A warning, once, where a pointer no longer holds what it held at
    /// the attach (`at` seconds in), or cannot be read though the process
    /// runs.
    pub fn check(&mut self, at: f64) -> Option<Note> {
        if self.told {
            return None;
        }
        let frees: Vec<Free> = self.moved.iter().map(|m| m.free.clone()).collect();
        let offsets = &self.offsets;
        let held = held_with(self.pid, &self.image, &frees, |link| {
            offsets.iter().find(|(l, _)| *l == link).map(|&(_, offset)| offset)
        });
        let changed: Vec<(&str, String)> = self
            .moved
            .iter()
            .zip(&held)
            .filter_map(|(m, (_, now))| match now {
                Ok(offset) if *offset == m.file_offset => None,
                Ok(offset) => Some((
                    m.free.symbol,
                    format!("{}'s pointer holds file offset {offset:#x}, not {}", m.free.symbol, m.implementation),
                )),
                Err(why) => Some((m.free.symbol, format!("{}'s pointer cannot be read: {why}", m.free.symbol))),
            })
            .collect();
        // A process on its way out has unmapped its image (every read then
        // fails): nothing to tell.
        if changed.is_empty() || mappings(self.pid, &self.image).map_or(true, |m| m.is_empty()) {
            return None;
        }
        self.told = true;
        let names: Vec<&str> = changed.iter().map(|(name, _)| *name).collect();
        let details: Vec<&str> = changed.iter().map(|(_, detail)| detail.as_str()).collect();
        Some(Note::new(
            Level::Warning,
            NoteCode::FreePointer,
            format!(
                "by {at:.1} s the allocator's pointers no longer held the functions probed for {} (tracemalloc started, PYTHONMALLOC's hooks or PyMem_SetAllocator; {}): their counts from then on may miss calls or hold others; attach with --placement entry to count them at their entries",
                names.join(", "),
                details.join("; ")
            ),
        ))
    }
}
