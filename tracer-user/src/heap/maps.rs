//! The target's memory map (`/proc/PID/maps`) as the census needs it:
//! which ranges may hold pymalloc's arenas (anonymous, private, readable
//! and writable: where `mmap` puts them), whether an address is mapped at
//! all, and the resident set size it is all weighed against.

use super::HeapError;

/// One mapping.
#[allow(clippy::struct_excessive_bools, reason = "one field per permission and kind, as the maps list them")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    pub start: u64,
    pub end: u64,
    pub readable: bool,
    pub writable: bool,
    pub private: bool,
    /// No file behind it: no path, or a `[anon:NAME]` the process gave it
    /// (not `[heap]`, `[stack]` or the kernel's own).
    pub anonymous: bool,
    /// The C library's `brk` heap.
    pub brk: bool,
}

/// The target's mappings, in address order.
#[derive(Debug, Default)]
pub struct Regions {
    pub regions: Vec<Region>,
}

impl Regions {
    /// Reads `/proc/PID/maps`.
    pub fn read(pid: u32) -> Result<Self, HeapError> {
        let path = format!("/proc/{pid}/maps");
        let text = std::fs::read_to_string(&path).map_err(|cause| proc_error(pid, &path, cause))?;
        if text.is_empty() {
            // A zombie's maps read as empty.
            return Err(HeapError::Exited { pid });
        }
        Ok(Self::parse(&text))
    }

    /// The mappings `text` (the format of `/proc/PID/maps`) lists; lines
    /// that do not parse are left out.
    #[must_use]
    pub fn parse(text: &str) -> Self {
        let mut regions: Vec<Region> = text.lines().filter_map(parse_line).collect();
        regions.sort_by_key(|r| r.start);
        Self { regions }
    }

    /// The mappings where pymalloc's arenas can be.
    pub fn arena_candidates(&self) -> impl Iterator<Item = &Region> {
        self.regions.iter().filter(|r| r.anonymous && r.readable && r.writable && r.private)
    }

    /// Whether `address` is in a readable mapping where the C library's
    /// allocator puts blocks: anonymous, or its `brk` heap (where a large
    /// object can be, unlike a file's data, which holds static objects).
    #[must_use]
    pub fn in_heap(&self, address: u64) -> bool {
        let i = self.regions.partition_point(|r| r.end <= address);
        self.regions
            .get(i)
            .is_some_and(|r| r.readable && r.start <= address && address < r.end && (r.anonymous || r.brk))
    }

    /// The bytes from `address` to the end of the mapping it is in (0
    /// outside every mapping): the most an object there can hold.
    #[must_use]
    pub fn room(&self, address: u64) -> u64 {
        let i = self.regions.partition_point(|r| r.end <= address);
        // Mappings that overlap (in a maps text no kernel wrote) are not
        // ordered by their ends, and the one found may end below `address`.
        self.regions.get(i).filter(|r| r.start <= address).map_or(0, |r| r.end.saturating_sub(address))
    }

    /// Whether `len` bytes at `address` lie in one readable mapping.
    #[must_use]
    pub fn readable(&self, address: u64, len: u64) -> bool {
        let i = self.regions.partition_point(|r| r.end <= address);
        self.regions.get(i).is_some_and(|r| r.readable && r.start <= address && address.saturating_add(len) <= r.end)
    }
}

fn parse_line(line: &str) -> Option<Region> {
    let mut fields = line.split_ascii_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?.as_bytes();
    // offset, device, inode, then the path (which may hold spaces).
    let path = fields.nth(3).unwrap_or("");
    let anonymous = path.is_empty() || path.starts_with("[anon:");
    Some(Region {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        readable: perms.first() == Some(&b'r'),
        writable: perms.get(1) == Some(&b'w'),
        private: perms.get(3) == Some(&b'p'),
        anonymous,
        brk: path == "[heap]",
    })
}

/// The target's resident set size in bytes (`VmRSS` of
/// `/proc/PID/status`), or `None` where it has none (a zombie).
pub fn rss(pid: u32) -> Result<Option<u64>, HeapError> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(|cause| proc_error(pid, &path, cause))?;
    Ok(text.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| {
        let kib: u64 = v.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib * 1024)
    }))
}

/// Why the target's objects may not be in pymalloc's pools as the census
/// expects, from how it was started: `PYTHONMALLOC` other than `pymalloc`
/// (`malloc`, `mimalloc`, or debug hooks, which put 16 bytes before each
/// object), `PYTHONDEVMODE` or `-X dev` (debug hooks too). `None` where
/// nothing says so (an embedder can still choose otherwise).
#[must_use]
pub fn allocator_note(pid: u32) -> Option<String> {
    let read = |what: &str| std::fs::read(format!("/proc/{pid}/{what}")).unwrap_or_default();
    let environ = read("environ");
    let variable = |name: &str| {
        environ.split(|&b| b == 0).find_map(|kv| kv.strip_prefix(name.as_bytes())?.strip_prefix(b"=")).map(|v| {
            let v = String::from_utf8_lossy(v);
            crate::text::display(&v)
        })
    };
    if let Some(value) = variable("PYTHONMALLOC").filter(|v| !v.is_empty() && v != "pymalloc") {
        return Some(format!(
            "PID {pid} was started with PYTHONMALLOC={value}: its objects are not all in pymalloc's pools, or not where the census looks in their blocks"
        ));
    }
    let cmdline = read("cmdline");
    let mut args = cmdline.split(|&b| b == 0);
    let dev_mode = args.any(|a| a == b"-Xdev") || {
        let mut pairs = cmdline.split(|&b| b == 0).zip(cmdline.split(|&b| b == 0).skip(1));
        pairs.any(|(a, b)| a == b"-X" && b == b"dev")
    };
    if dev_mode || variable("PYTHONDEVMODE").is_some_and(|v| !v.is_empty()) {
        return Some(format!(
            "PID {pid} runs in Python's development mode, whose allocator debug hooks put 16 bytes before each object: the census finds few of them"
        ));
    }
    None
}

fn proc_error(pid: u32, path: &str, cause: std::io::Error) -> HeapError {
    if cause.kind() == std::io::ErrorKind::NotFound || cause.raw_os_error() == Some(libc::ESRCH) {
        HeapError::Exited { pid }
    } else {
        HeapError::Proc { pid, path: path.to_owned(), cause }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
00400000-00401000 r--p 00000000 08:01 1234 /usr/bin/python3.11
01000000-01021000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000300000 rw-p 00000000 00:00 0 \n\
7f0000300000-7f0000400000 ---p 00000000 00:00 0 \n\
7f0000400000-7f0000500000 rw-p 00000000 00:00 0 [anon:cpython:pymalloc]
7f0000500000-7f0000600000 rw-s 00000000 00:05 99 /dev/shm/x y
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0 [stack]
";

    #[test]
    fn anonymous_private_read_write_mappings_are_arena_candidates() {
        let regions = Regions::parse(MAPS);
        assert_eq!(regions.regions.len(), 7);
        let candidates: Vec<(u64, u64)> = regions.arena_candidates().map(|r| (r.start, r.end)).collect();
        assert_eq!(candidates, [(0x7f00_0000_0000, 0x7f00_0030_0000), (0x7f00_0040_0000, 0x7f00_0050_0000)]);
    }

    #[test]
    fn readable_ranges_lie_in_one_readable_mapping() {
        let regions = Regions::parse(MAPS);
        assert!(regions.readable(0x40_0000, 8));
        assert!(regions.readable(0x7f00_002f_fff8, 8));
        assert!(!regions.readable(0x7f00_002f_fffc, 8), "runs into the next mapping, which has no read permission");
        assert!(!regions.readable(0x7f00_0030_0000, 8));
        assert!(!regions.readable(0x10, 8));
        assert!(!regions.readable(u64::MAX - 4, 8));
        assert!(regions.in_heap(0x0100_0010) && regions.in_heap(0x7f00_0000_0010));
        assert!(!regions.in_heap(0x40_0010) && !regions.in_heap(0x7ffc_0000_0010), "a file's, the stack");
        assert_eq!(regions.room(0x7f00_002f_fff8), 8);
        assert_eq!(regions.room(0x10), 0);
        assert_eq!(regions.room(u64::MAX - 4), 0);
    }

    #[test]
    fn own_rss_is_read() {
        assert!(rss(std::process::id()).unwrap().is_some_and(|r| r > 0));
    }
}
