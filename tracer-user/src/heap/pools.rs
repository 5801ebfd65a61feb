//! Finding pymalloc's pools without symbols, and telling their allocated
//! blocks from the free ones.
//!
//! Arenas are anonymous mappings of [`Geometry::arena`] bytes (1 MiB; 256
//! KiB on 3.9), which the kernel merges with their neighbours, so every
//! anonymous private read-write mapping is scanned at each
//! [`Geometry::pool`]-aligned address, 48 bytes at a time in batches of
//! [`MAX_RANGES`], and a pool is taken where its header is consistent (see
//! [`Header::parse`]). A census then reads the pools it found in bulk, and
//! [`Header::free_blocks`] walks each one's free list in that copy.

use std::collections::HashSet;

use super::{
    HeapError,
    maps::Regions,
    memory::{MAX_RANGES, Memory, word, word32},
};
use crate::hash::BuildIdentity;
use crate::python::heap::{Geometry, POOL_OVERHEAD, POOL_SIZE, SIZE_CLASSES, pool_header as ph};

/// Blocks in a pool at most: 16-byte blocks in the largest pools,
/// `(16384 - 48) / 16`.
pub const MAX_BLOCKS: usize = ((POOL_SIZE - POOL_OVERHEAD) / 16) as usize;

/// An arena index above this is no pymalloc's: the table doubles from 16
/// slots, and 2^24 arenas would be 16 TiB.
const MAX_ARENA_INDEX: u32 = 1 << 24;

/// A pool header that passed every check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub address: u64,
    /// Blocks allocated (`ref.count`).
    pub count: u32,
    pub freeblock: u64,
    pub arena_index: u32,
    pub size_class: u32,
    pub nextoffset: u32,
}

impl Header {
    /// The header of the pool of `pool_size` bytes at `address` in `bytes`
    /// (its first 48 bytes), if it is one: a size class below 32,
    /// `maxnextoffset` equal to `pool_size` minus the block size, `nextoffset` on a block
    /// boundary at most one block past it, no more blocks allocated than
    /// were ever handed out, a free list that starts NULL or on a handed
    /// out block of the pool, an arena index in range.
    #[must_use]
    pub fn parse(address: u64, bytes: &[u8], pool_size: u64) -> Option<Self> {
        let size_class = word32(bytes, ph::SZIDX);
        if size_class as usize >= SIZE_CLASSES || bytes.len() < 48 {
            return None;
        }
        let size = (u64::from(size_class) + 1) * 16;
        let nextoffset = word32(bytes, ph::NEXTOFFSET);
        let next = u64::from(nextoffset);
        if pool_size > POOL_SIZE
            || u64::from(word32(bytes, ph::MAXNEXTOFFSET)) != pool_size.saturating_sub(size)
            || next < POOL_OVERHEAD + size
            || next > pool_size
            || !(next - POOL_OVERHEAD).is_multiple_of(size)
        {
            return None;
        }
        let count = word32(bytes, ph::COUNT);
        let carved = (next - POOL_OVERHEAD) / size;
        if u64::from(count) > carved {
            return None;
        }
        let freeblock = word(bytes, ph::FREEBLOCK);
        if freeblock != 0 {
            let offset = freeblock.wrapping_sub(address);
            if offset < POOL_OVERHEAD || offset >= next || !(offset - POOL_OVERHEAD).is_multiple_of(size) {
                return None;
            }
        }
        let arena_index = word32(bytes, ph::ARENAINDEX);
        if arena_index >= MAX_ARENA_INDEX {
            return None;
        }
        Some(Self { address, count, freeblock, arena_index, size_class, nextoffset })
    }

    /// The pool's block size.
    #[must_use]
    pub const fn block_size(&self) -> u64 {
        (self.size_class as u64 + 1) * 16
    }

    /// Blocks ever handed out: those below `nextoffset`.
    #[must_use]
    pub const fn carved(&self) -> u64 {
        (self.nextoffset as u64 - POOL_OVERHEAD) / self.block_size()
    }

    /// Which of the handed out blocks are free, from the pool's bytes
    /// (`pool`, all of them): its free list walked, each link
    /// a block of the pool below `nextoffset` seen once. `None` when the
    /// list is not that, or when the blocks it leaves do not number
    /// `ref.count`: a pool that changed while it was read.
    #[must_use]
    pub fn free_blocks(&self, pool: &[u8]) -> Option<[u64; MAX_BLOCKS.div_ceil(64)]> {
        let mut free = [0u64; MAX_BLOCKS.div_ceil(64)];
        let size = self.block_size();
        let carved = self.carved();
        let mut link = self.freeblock;
        let mut on_list = 0u64;
        while link != 0 {
            let offset = link.wrapping_sub(self.address);
            if offset < POOL_OVERHEAD
                || offset >= u64::from(self.nextoffset)
                || !(offset - POOL_OVERHEAD).is_multiple_of(size)
            {
                return None;
            }
            let block = usize::try_from((offset - POOL_OVERHEAD) / size).ok()?;
            let (w, bit) = (block / 64, 1u64 << (block % 64));
            if free[w] & bit != 0 {
                return None;
            }
            free[w] |= bit;
            on_list += 1;
            link = word(pool, usize::try_from(offset).ok()?);
        }
        (carved - on_list == u64::from(self.count)).then_some(free)
    }
}

/// What the scan for pools found.
#[derive(Debug, Default)]
pub struct Scan {
    /// Valid pool headers, in address order.
    pub pools: Vec<Header>,
    /// Pool-aligned places looked at.
    pub places: u64,
    /// Places whose 48 bytes could not be read (unmapped since the maps
    /// were read).
    pub unreadable: u64,
}

/// Scans every mapping of `regions` that may hold arenas for pool headers.
pub fn scan(
    memory: &mut Memory,
    regions: &Regions,
    geometry: Geometry,
    interrupted: &dyn Fn() -> bool,
) -> Result<Scan, HeapError> {
    let mut scan = Scan::default();
    let mut places: Vec<(u64, usize)> = Vec::with_capacity(MAX_RANGES);
    let mut buf = vec![0u8; MAX_RANGES * 48];
    let mut ok = Vec::with_capacity(MAX_RANGES);
    let mut flush = |places: &mut Vec<(u64, usize)>, scan: &mut Scan| -> Result<(), HeapError> {
        if interrupted() {
            return Err(HeapError::Interrupted);
        }
        memory.read_ranges(places, &mut buf, &mut ok)?;
        for (i, &(address, _)) in places.iter().enumerate() {
            if !ok[i] {
                scan.unreadable += 1;
                continue;
            }
            if let Some(header) = Header::parse(address, &buf[i * 48..i * 48 + 48], geometry.pool) {
                scan.pools.push(header);
            }
        }
        scan.places += places.len() as u64;
        places.clear();
        Ok(())
    };
    for region in regions.arena_candidates() {
        // A mapping at the top of the address space (in a maps text no
        // kernel wrote) has no pool-aligned place, or none after its last.
        let Some(mut at) = region.start.checked_next_multiple_of(geometry.pool) else { continue };
        while let Some(end) = at.checked_add(geometry.pool)
            && end <= region.end
        {
            places.push((at, 48));
            if places.len() == MAX_RANGES {
                flush(&mut places, &mut scan)?;
            }
            at = end;
        }
    }
    if !places.is_empty() {
        flush(&mut places, &mut scan)?;
    }
    Ok(scan)
}

/// The pools found, for asking whether an address is in one.
#[derive(Debug, Default)]
pub struct PoolSet {
    starts: HashSet<u64, BuildIdentity>,
    /// The bits of an address above its pool's start.
    mask: u64,
    /// The pool found last: consecutive questions (a tuple's items, a
    /// list's) are mostly about one pool.
    last: std::cell::Cell<u64>,
}

impl PoolSet {
    #[must_use]
    pub fn new(pools: &[Header], geometry: Geometry) -> Self {
        let mut starts = HashSet::with_capacity_and_hasher(pools.len(), BuildIdentity);
        starts.extend(pools.iter().map(|p| p.address));
        Self { starts, mask: !(geometry.pool - 1), last: std::cell::Cell::new(u64::MAX) }
    }

    /// Whether `address` lies in a pool found.
    #[must_use]
    pub fn contains(&self, address: u64) -> bool {
        let start = address & self.mask;
        if start == self.last.get() {
            return true;
        }
        let found = self.starts.contains(&start);
        if found {
            self.last.set(start);
        }
        found
    }

    #[must_use]
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of 32-byte blocks (size class 1) at `address`, as pymalloc
    /// leaves it after handing out `handed` blocks and freeing those of
    /// `freed` (newest first on the list).
    fn pool(address: u64, handed: u64, freed: &[u64]) -> Vec<u8> {
        sized_pool(address, handed, freed, POOL_SIZE)
    }

    /// [`pool`] in a pool of `pool_size` bytes.
    fn sized_pool(address: u64, handed: u64, freed: &[u64], pool_size: u64) -> Vec<u8> {
        let mut bytes = vec![0u8; usize::try_from(pool_size).unwrap()];
        let put32 = |b: &mut Vec<u8>, at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
        let put64 = |b: &mut Vec<u8>, at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        let block = |i: u64| POOL_OVERHEAD + i * 32;
        // allocate_from_new_pool and pymalloc_pool_extend keep the next
        // virgin block on the free list as well, with a NULL link.
        let next = handed + 1;
        let mut head = address + block(handed);
        for &i in freed {
            put64(&mut bytes, usize::try_from(block(i)).unwrap(), head);
            head = address + block(i);
        }
        put32(&mut bytes, ph::COUNT, u32::try_from(handed - freed.len() as u64).unwrap());
        put64(&mut bytes, ph::FREEBLOCK, head);
        put32(&mut bytes, ph::ARENAINDEX, 3);
        put32(&mut bytes, ph::SZIDX, 1);
        put32(&mut bytes, ph::NEXTOFFSET, u32::try_from(block(next)).unwrap());
        put32(&mut bytes, ph::MAXNEXTOFFSET, u32::try_from(pool_size - 32).unwrap());
        bytes
    }

    #[test]
    fn a_pool_s_allocated_blocks_are_those_handed_out_and_not_on_its_free_list() {
        let address = 0x7f00_0000_4000;
        let bytes = pool(address, 10, &[2, 7]);
        let header = Header::parse(address, &bytes, POOL_SIZE).expect("a pool");
        assert_eq!((header.count, header.block_size(), header.carved(), header.arena_index), (8, 32, 11, 3));
        let free = header.free_blocks(&bytes).expect("consistent");
        let free: Vec<usize> = (0..64).filter(|i| free[i / 64] & (1 << (i % 64)) != 0).collect();
        assert_eq!(free, [2, 7, 10]);
    }

    /// 3.9's pools are 4 KiB: a header says so by its `maxnextoffset`, and
    /// is refused as a pool of another size.
    #[test]
    fn a_pool_is_taken_at_its_version_s_size_only() {
        let address = 0x7f00_0000_5000;
        let small = sized_pool(address, 10, &[2], Geometry::SMALL.pool);
        let header = Header::parse(address, &small, Geometry::SMALL.pool).expect("a 4 KiB pool");
        assert_eq!((header.count, header.carved()), (9, 11));
        assert!(Header::parse(address, &small, Geometry::LARGE.pool).is_none(), "as a 16 KiB pool");
        let large = pool(0x7f00_0000_4000, 10, &[2]);
        assert!(Header::parse(0x7f00_0000_4000, &large, Geometry::SMALL.pool).is_none(), "16 KiB as 4 KiB");
        let set = PoolSet::new(&[header], Geometry::SMALL);
        assert!(set.contains(address) && set.contains(address + 0xfff));
        assert!(!set.contains(address + 0x1000) && !set.contains(address - 1));
    }

    #[test]
    fn inconsistent_headers_and_lists_are_refused() {
        let address = 0x7f00_0000_4000;
        let good = pool(address, 10, &[2, 7]);
        let with = |at: usize, v: u32| {
            let mut b = good.clone();
            b[at..at + 4].copy_from_slice(&v.to_le_bytes());
            b
        };
        assert!(Header::parse(address, &with(ph::SZIDX, 32), POOL_SIZE).is_none(), "size class");
        assert!(Header::parse(address, &with(ph::MAXNEXTOFFSET, 16000), POOL_SIZE).is_none(), "maxnextoffset");
        assert!(Header::parse(address, &with(ph::NEXTOFFSET, 48 + 32 * 11 + 8), POOL_SIZE).is_none(), "off a block");
        assert!(Header::parse(address, &with(ph::COUNT, 12), POOL_SIZE).is_none(), "more allocated than carved");
        assert!(Header::parse(address, &[0u8; 48], POOL_SIZE).is_none(), "zeroes");
        // The list's length disagrees with ref.count: changed while read.
        let count = with(ph::COUNT, 9);
        let header = Header::parse(address, &count, POOL_SIZE).expect("a header");
        assert!(header.free_blocks(&count).is_none());
        // A loop in the free list.
        let mut looped = good.clone();
        let at = usize::try_from(POOL_OVERHEAD + 2 * 32).unwrap();
        looped[at..at + 8].copy_from_slice(&(address + POOL_OVERHEAD + 7 * 32).to_le_bytes());
        assert!(Header::parse(address, &looped, POOL_SIZE).unwrap().free_blocks(&looped).is_none());
        // A link out of the pool.
        let mut out = good;
        out[at..at + 8].copy_from_slice(&(address + POOL_SIZE + 48).to_le_bytes());
        assert!(Header::parse(address, &out, POOL_SIZE).unwrap().free_blocks(&out).is_none());
    }

    #[test]
    fn the_set_knows_every_address_of_its_pools() {
        let headers =
            [Header { address: 0x4000, count: 1, freeblock: 0, arena_index: 0, size_class: 0, nextoffset: 80 }];
        let set = PoolSet::new(&headers, Geometry::LARGE);
        assert!(set.contains(0x4000) && set.contains(0x7fff));
        assert!(!set.contains(0x8000) && !set.contains(0x3fff));
    }
}
