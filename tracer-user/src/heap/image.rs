//! A census of a memory image rather than of a process: the segments of
//! memory a census reads, at their addresses, the process's
//! `/proc/PID/maps`, the exported types' addresses and the generation
//! lists' heads.
//! The census's decoding of pools and objects runs on it unchanged
//! ([`super::decode`], through [`Memory::of_image`]), so that it can be
//! fuzzed and tested on memory no process holds: fuzz/'s `heap` target
//! feeds it hostile images, and [`capture`] makes real ones from a live
//! process (the reads one census made of it, nothing else).
//!
//! The format, little-endian:
//!
//! ```text
//! "THI1"                                  magic
//! u32                                     Py_Version (0x030B07F0 for 3.11.7)
//! u64 ×4                                  PyType_Type, PyUnicode_Type, PyBytes_Type, PyByteArray_Type
//! u16 n, u64 ×n                           the generation lists' heads
//! u32 n, n bytes                          the /proc/PID/maps text
//! then segments to the end, each:
//!   u64 start, u32 len, len bytes
//! ```
//!
//! Memory outside the segments reads as unmapped, whatever the maps say
//! (as memory unmapped since the maps were read does). A last segment cut
//! short holds what is left.

use std::collections::HashSet;

use thiserror::Error;

use super::{
    Heap, HeapError, Options,
    bounds::Limits,
    maps::Regions,
    memory::Memory,
    model::{Census, Cost},
    pools::{self, Header, PoolSet},
    state,
    types::{Builtins, Context},
};
use crate::hash::BuildIdentity;
use crate::python::{self, PythonVersion, VersionError};

const MAGIC: &[u8; 4] = b"THI1";
/// The header's length up to the heads.
const HEADER: usize = 4 + 4 + 4 * 8 + 2;
/// A segment's header.
const SEGMENT_HEADER: usize = 8 + 4;
/// Segments taken at most.
const MAX_SEGMENTS: usize = 1 << 16;

/// An image that cannot be read.
#[derive(Debug, Error)]
pub enum ImageError {
    #[error("not a heap image: it does not start with {:?}", String::from_utf8_lossy(MAGIC))]
    Magic,
    #[error("the heap image ends inside its header ({len} bytes)")]
    Truncated { len: usize },
    #[error("the heap image is of a Python tracer does not read: {0}")]
    Version(#[from] VersionError),
    #[error(transparent)]
    Census(#[from] HeapError),
}

/// A memory image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    /// `Py_Version`.
    pub version: u32,
    pub builtins: Builtins,
    pub heads: Vec<u64>,
    /// The `/proc/PID/maps` text.
    pub maps: String,
    /// Each segment's address and bytes.
    pub segments: Vec<(u64, Vec<u8>)>,
}

impl Image {
    /// Reads an image in the format above.
    pub fn parse(data: &[u8]) -> Result<Self, ImageError> {
        let rest = data.strip_prefix(MAGIC).ok_or(ImageError::Magic)?;
        let truncated = ImageError::Truncated { len: data.len() };
        if data.len() < HEADER {
            return Err(truncated);
        }
        let u64_at = |at: usize| rest.get(at..at + 8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes);
        let version = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
        let builtins = Builtins { type_: u64_at(4), str_: u64_at(12), bytes: u64_at(20), bytearray: u64_at(28) };
        let heads_len = usize::from(u16::from_le_bytes([rest[36], rest[37]]));
        let mut at = HEADER - MAGIC.len();
        let heads_end = at + 8 * heads_len;
        if rest.len() < heads_end {
            return Err(truncated);
        }
        let heads = (0..heads_len).map(|i| u64_at(at + 8 * i)).collect();
        at = heads_end;
        let u32_at = |at: usize| rest.get(at..at + 4).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes);
        let maps_len = u32_at(at).ok_or(ImageError::Truncated { len: data.len() })?;
        at += 4;
        let maps_end = at.saturating_add(usize::try_from(maps_len).unwrap_or(usize::MAX)).min(rest.len());
        let maps = String::from_utf8_lossy(&rest[at..maps_end]).into_owned();
        at = maps_end;
        let mut segments = Vec::new();
        while rest.len() - at >= SEGMENT_HEADER && segments.len() < MAX_SEGMENTS {
            let start = u64_at(at);
            let len = u32_at(at + 8).unwrap_or(0);
            at += SEGMENT_HEADER;
            let end = at.saturating_add(usize::try_from(len).unwrap_or(usize::MAX)).min(rest.len());
            segments.push((start, rest[at..end].to_vec()));
            at = end;
        }
        Ok(Self { version, builtins, heads, maps, segments })
    }

    /// The image in the format [`Image::parse`] reads.
    #[must_use]
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&self.version.to_le_bytes());
        let b = self.builtins;
        for word in [b.type_, b.str_, b.bytes, b.bytearray] {
            out.extend_from_slice(&word.to_le_bytes());
        }
        let heads = &self.heads[..self.heads.len().min(usize::from(u16::MAX))];
        out.extend_from_slice(&u16::try_from(heads.len()).unwrap_or(u16::MAX).to_le_bytes());
        for head in heads {
            out.extend_from_slice(&head.to_le_bytes());
        }
        let maps = &self.maps.as_bytes()[..self.maps.len().min(u32::MAX as usize)];
        out.extend_from_slice(&u32::try_from(maps.len()).unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(maps);
        for (start, bytes) in &self.segments {
            let bytes = &bytes[..bytes.len().min(u32::MAX as usize)];
            out.extend_from_slice(&start.to_le_bytes());
            out.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_le_bytes());
            out.extend_from_slice(bytes);
        }
        out
    }

    /// A census of the image, as [`Heap::census`] takes one of a process
    /// (without the arena table and the interpreters' states, which an
    /// image does not hold), within `limits`.
    pub fn census(&self, limits: Limits) -> Result<Census, ImageError> {
        let abi = python::abi_for(0, PythonVersion::from_hex(self.version))?;
        let regions = Regions::parse(&self.maps);
        let mut memory = Memory::of_image(self.segments.clone());
        let interrupted = || false;
        let geometry = abi.heap().geometry;
        let scan = pools::scan(&mut memory, &regions, geometry, &interrupted)?;
        let heads: HashSet<u64, BuildIdentity> = self.heads.iter().copied().collect();
        let pool_set = PoolSet::new(&scan.pools, geometry);
        let mut cx = Context { memory: &mut memory, regions: &regions, pools: &pool_set };
        let (tally, types, found) =
            super::decode(&scan.pools, abi, self.builtins, &mut cx, &heads, limits, &interrupted)?;
        let cost = Cost {
            elapsed_ms: 0.0,
            bytes_read: memory.bytes_read,
            reads: memory.calls,
            types_read: types.reads,
            failed_reads: memory.failed_ranges,
        };
        Ok(super::report(&tally, &types, &found, None, cost))
    }
}

/// An image of `pid`'s heap: up to `max_pools` of its pools (spread over
/// the size classes) and everything a census of those within `limits`
/// reads outside them; with that census. The image's census
/// ([`Image::census`]) is the same census, read again from the image.
pub fn capture(pid: u32, max_pools: usize, limits: Limits) -> Result<(Image, Census), ImageError> {
    let heap = Heap::open(pid, &Options { limits, ..Options::default() })?;
    let path = format!("/proc/{pid}/maps");
    let maps = std::fs::read_to_string(&path).map_err(|cause| HeapError::Proc { pid, path, cause })?;
    let regions = Regions::parse(&maps);
    let mut memory = Memory::new(pid);
    let state = state::read(&heap.process, &mut memory, heap.abi, heap.statics.as_ref())?;
    let geometry = heap.abi.heap().geometry;
    let scan = pools::scan(&mut memory, &regions, geometry, &|| false)?;
    let mut pools = spread(&scan.pools, max_pools);
    // The image's own scan finds the pools whose headers it holds, which
    // may be more than those chosen: another read (an object's, outside
    // the chosen pools) can hold a pool's first bytes. Those pools are
    // taken too, and read whole, until the image holds no other.
    let (census, segments) = loop {
        let mut recording = Memory::new(pid).recording();
        let pool_set = PoolSet::new(&pools, geometry);
        let mut cx = Context { memory: &mut recording, regions: &regions, pools: &pool_set };
        let (tally, types, found) =
            super::decode(&pools, heap.abi, heap.builtins, &mut cx, &state.heads, limits, &|| false)?;
        let cost = Cost { bytes_read: recording.bytes_read, reads: recording.calls, ..Cost::default() };
        let census = super::report(&tally, &types, &found, None, cost);
        let segments = merged(recording.recorded());
        let mut image = Memory::of_image(segments.clone());
        let more: Vec<Header> = (pools::scan(&mut image, &regions, geometry, &|| false)?.pools.into_iter())
            .filter(|p| !pools.iter().any(|q| q.address == p.address))
            .filter_map(|p| scan.pools.iter().find(|q| q.address == p.address).copied())
            .collect();
        // Bounded: a heap whose every pool leads to another is taken with
        // those pools not all whole, whose census then differs.
        if more.is_empty() || pools.len() >= 8 * max_pools.max(1) {
            break (census, segments);
        }
        pools.extend(more);
        pools.sort_by_key(|p| p.address);
    };
    let mut heads: Vec<u64> = state.heads.into_iter().collect();
    heads.sort_unstable();
    let version = heap.process.version.hex();
    Ok((Image { version, builtins: heap.builtins, heads, maps, segments }, census))
}

/// The ranges `reads` (address and bytes) as segments: sorted, each range
/// within or just after the one before joined to it.
fn merged(reads: &[(u64, Vec<u8>)]) -> Vec<(u64, Vec<u8>)> {
    let mut reads: Vec<&(u64, Vec<u8>)> = reads.iter().collect();
    reads.sort_by_key(|r| (r.0, std::cmp::Reverse(r.1.len())));
    let mut segments: Vec<(u64, Vec<u8>)> = Vec::new();
    for (address, bytes) in reads {
        match segments.last_mut() {
            Some((start, last)) if *address <= *start + last.len() as u64 => {
                let skip = usize::try_from(*start + last.len() as u64 - address).unwrap_or(usize::MAX);
                last.extend_from_slice(bytes.get(skip..).unwrap_or(&[]));
            }
            _ => segments.push((*address, bytes.clone())),
        }
    }
    segments
}

/// Up to `max` of `pools`, taking each size class's in turn so that every
/// class present is in.
fn spread(pools: &[Header], max: usize) -> Vec<Header> {
    let mut by_class: Vec<Vec<Header>> = vec![Vec::new(); python::heap::SIZE_CLASSES];
    for p in pools {
        if let Some(class) = by_class.get_mut(p.size_class as usize) {
            class.push(*p);
        }
    }
    let mut out: Vec<Header> = Vec::new();
    for round in 0.. {
        let before = out.len();
        out.extend(by_class.iter().filter_map(|c| c.get(round)).take(max - out.len()));
        if out.len() == before || out.len() >= max {
            break;
        }
    }
    out.sort_by_key(|p| p.address);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_read_back_what_was_written() {
        let image = Image {
            version: 0x030C_01F0,
            builtins: Builtins { type_: 1, str_: 2, bytes: 3, bytearray: 4 },
            heads: vec![0x10, 0x20],
            maps: "7f0000000000-7f0000001000 rw-p 00000000 00:00 0 \n".to_owned(),
            segments: vec![(0x7f00_0000_0000, vec![7; 40]), (0x5500_0000, vec![1, 2, 3])],
        };
        let bytes = image.to_bytes();
        assert_eq!(Image::parse(&bytes).unwrap(), image);
        // Cut short: the last segment holds what is left; inside the
        // header, an error.
        let cut = Image::parse(&bytes[..bytes.len() - 1]).unwrap();
        assert_eq!(cut.segments[1].1, [1, 2]);
        assert!(matches!(Image::parse(&bytes[..20]), Err(ImageError::Truncated { len: 20 })));
        assert!(matches!(Image::parse(b"ELF"), Err(ImageError::Magic)));
    }

    /// A small heap of objects of many kinds, in pools and outside them.
    const WORKLOAD: &str = r#"
import time
class Order:
    def __init__(self, i):
        self.i = i
        self.items = [i, i * 2.5, str(i), (i, i + 1)]
keep = [Order(i) for i in range(200)]
table = {"k%d" % i: (i, b"x" * i, bytearray(i)) for i in range(100)}
large = ["y" * 2000 + str(i) for i in range(10)]
print("ready", flush=True)
time.sleep(60)
"#;

    /// An image captured from a live interpreter (pyenv's 3.11.7 on this
    /// machine kind, `TRACER_TEST_PYTHON`) censuses as those pools did in
    /// the process: the census's decoding runs unchanged on an image.
    #[test]
    fn an_image_censuses_as_the_live_heap_did() {
        use std::io::BufRead as _;
        let python = std::env::var_os("TRACER_TEST_PYTHON").unwrap_or_else(|| "python3".into());
        let mut child = std::process::Command::new(&python)
            .args(["-c", WORKLOAD])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut said = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut said).unwrap();
        assert_eq!(said.trim(), "ready");
        // No limit reached: the walk outside the pools starts from a set's
        // links, in an order that may differ between two censuses, and a
        // limit would cut it at a different place in each.
        let limits = Limits::default();
        let captured = capture(child.id(), 6, limits);
        let _ = child.kill();
        let _ = child.wait();
        let (image, live) = captured.expect("captured");
        let again = Image::parse(&image.to_bytes()).unwrap().census(limits).expect("a census of the image");
        assert_eq!(again.types, live.types);
        assert_eq!(again.totals, live.totals);
        let objects: u64 = live.types.iter().map(|t| t.count).sum();
        assert!(objects > 50 && live.totals.outside.objects > 0, "{live:?}");
    }

    /// The heap images of the fuzz corpus (fuzz/corpus/heap, made by
    /// fuzz/examples/make-corpus.rs from live interpreters) still read as
    /// heaps of objects: a change of the format or the census that left
    /// them behind would leave the fuzzer without real seeds.
    #[test]
    fn the_fuzz_corpus_images_hold_objects() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/heap");
        let mut read = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if !name.starts_with("pyenv-") || name.contains("-cut-") {
                continue;
            }
            let census = Image::parse(&std::fs::read(&path).unwrap()).unwrap().census(Limits::default()).unwrap();
            let objects: u64 = census.types.iter().map(|t| t.count).sum();
            assert!(objects > 50, "{name}: {census:?}");
            read += 1;
        }
        assert!(read >= 3, "{read} images in {}", dir.display());
    }

    /// Each of the census's limits outside the pools, set low on a corpus
    /// image, is reached and said (`outside.cut`), and the figure it bounds
    /// stops at it; with the image's own limits, none is.
    #[test]
    fn every_limit_of_the_walk_outside_the_pools_is_reported() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/heap/pyenv-3.12.thi");
        let image = Image::parse(&std::fs::read(&path).unwrap()).unwrap();
        let whole = image.census(Limits::default()).unwrap();
        assert_eq!(whole.totals.outside.cut, Vec::<String>::new(), "{:?}", whole.totals.outside);
        let low = |limits: Limits, name: &str| {
            let census = image.census(limits).unwrap();
            assert_eq!(census.totals.outside.cut, [name], "{name}: {:?}", census.totals.outside);
            census.totals.outside
        };
        let d = Limits::default();
        assert_eq!(low(Limits { gc_objects: 2, ..d }, "gc_objects").gc_objects, 2);
        assert_eq!(low(Limits { items: 3, ..d }, "items").items_read, 3);
        assert!(whole.totals.outside.referenced > 1, "{:?}", whole.totals.outside);
        assert!(low(Limits { referenced: 1, ..d }, "referenced").referenced <= 1);
        let shallow = low(Limits { rounds: 0, ..d }, "rounds");
        assert_eq!(shallow.referenced, 0, "{shallow:?}");
    }

    #[test]
    fn an_image_of_no_supported_python_is_refused() {
        let image = Image {
            version: 0x0207_12F0,
            builtins: Builtins::default(),
            heads: vec![],
            maps: String::new(),
            segments: vec![],
        };
        assert!(matches!(image.census(Limits::default()), Err(ImageError::Version(_))), "2.7");
    }
}
