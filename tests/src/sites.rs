//! Where tracer's probes go, found without tracer: the maps, the ELF
//! files and the target's memory.

use std::os::unix::fs::FileExt as _;

use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};

/// Where a probed function lives, found independently of tracer: from
/// /proc/PID/maps and the ELF file read here with `object`.
#[derive(Debug)]
pub struct ProbeSite {
    pub symbol: String,
    /// Address in the target.
    pub address: u64,
    /// The function's first bytes as stored in the ELF file.
    pub file_bytes: Vec<u8>,
}

/// Bytes compared from each probed function's entry (fewer if the function
/// is shorter): covers every offset tracer may place a probe at (it looks 32
/// bytes in) and that instruction.
pub const SITE_BYTES: usize = 48;

/// (start, end, file offset) of every mapping of `path` in `pid`.
fn mappings_of(pid: u32, path: &str) -> Vec<(u64, u64, u64)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("read maps");
    maps.lines()
        .filter(|l| l.split_whitespace().nth(5) == Some(path))
        .map(|l| {
            let mut f = l.split_whitespace();
            let (start, end) = f.next().expect("range").split_once('-').expect("a-b");
            let offset = f.nth(1).expect("offset");
            let hex = |s: &str| u64::from_str_radix(s, 16).expect("hex");
            (hex(start), hex(end), hex(offset))
        })
        .collect()
}

/// Where file offset `offset` is mapped, given [`mappings_of`] the file.
fn address_of(ranges: &[(u64, u64, u64)], offset: u64) -> Option<u64> {
    ranges.iter().find_map(|&(s, e, off)| {
        let delta = offset.checked_sub(off)?;
        (delta < e - s).then_some(s + delta)
    })
}

/// The probe sites of `symbols` in process `pid`, whose interpreter image
/// is `image` (the path tracer reported).
#[must_use]
pub fn probe_sites(pid: u32, image: &str, symbols: &[String]) -> Vec<ProbeSite> {
    let ranges = mappings_of(pid, image);
    assert!(!ranges.is_empty(), "{image} is not mapped in PID {pid}");
    let data = std::fs::read(format!("/proc/{pid}/root{image}")).expect("read image");
    let elf = object::File::parse(&*data).expect("parse image");
    symbols
        .iter()
        .map(|name| {
            let sym = elf
                .symbols()
                .chain(elf.dynamic_symbols())
                .find(|s| s.name() == Ok(name.as_str()) && !s.is_undefined())
                .unwrap_or_else(|| panic!("{name} not in {image}"));
            let vaddr = sym.address();
            let file_offset = elf
                .segments()
                .find_map(|seg| {
                    let delta = vaddr.checked_sub(seg.address())?;
                    (delta < seg.file_range().1).then(|| seg.file_range().0 + delta)
                })
                .expect("symbol in a loaded segment");
            let start = usize::try_from(file_offset).expect("offset fits");
            let address = address_of(&ranges, file_offset).expect("symbol's page is mapped");
            // Only this function's bytes: the next one may hold a probe too.
            let len = usize::try_from(sym.size()).ok().filter(|&l| l > 0).map_or(SITE_BYTES, |l| l.min(SITE_BYTES));
            ProbeSite { symbol: name.clone(), address, file_bytes: data[start..start + len].to_vec() }
        })
        .collect()
}

/// The first byte of each of `offsets` in `path`, at its address in `pid`,
/// for call-site probes; none if `pid` has not mapped `path`.
#[must_use]
pub fn sites_in_file(pid: u32, path: &str, offsets: &[u64]) -> Vec<ProbeSite> {
    let ranges = mappings_of(pid, path);
    if ranges.is_empty() {
        return Vec::new();
    }
    let data = std::fs::read(format!("/proc/{pid}/root{path}")).expect("read module");
    offsets
        .iter()
        .map(|&offset| {
            let address =
                address_of(&ranges, offset).unwrap_or_else(|| panic!("{path}+{offset:#x} is not mapped in PID {pid}"));
            let at = usize::try_from(offset).expect("offset fits");
            ProbeSite { symbol: format!("{path}+{offset:#x}"), address, file_bytes: vec![data[at]] }
        })
        .collect()
}

/// Reads the target's code at each site.
#[must_use]
pub fn read_sites(pid: u32, sites: &[ProbeSite]) -> Vec<Vec<u8>> {
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).expect("open mem");
    sites
        .iter()
        .map(|s| {
            let mut buf = vec![0; s.file_bytes.len()];
            mem.read_exact_at(&mut buf, s.address)
                .unwrap_or_else(|e| panic!("read {} at {:#x}: {e}", s.symbol, s.address));
            buf
        })
        .collect()
}
