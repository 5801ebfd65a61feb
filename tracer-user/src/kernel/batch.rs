//! Reading a whole per-CPU map in `BPF_MAP_LOOKUP_BATCH` calls (Linux 5.6
//! and later) instead of two syscalls a key (the next key, then its
//! value), or one an index: the counts are read at every interval and
//! every 5 ms while a window is live, and the sizes' buckets and the
//! statistics alone are 291 indexes. One syscall a key was most of the
//! run loop's own CPU time on a busy target, and grew with `--exe`'s
//! processes and `--stacks`' stacks (BENCHMARKS.md, "tracer's own cost
//! while attached").

use std::os::fd::{AsFd as _, AsRawFd as _};

use std::{
    borrow::Borrow,
    cell::RefCell,
    sync::atomic::{AtomicI32, AtomicU64, Ordering},
};

use aya::{
    Pod,
    maps::{IterableMap as _, MapData, PerCpuArray, PerCpuHashMap},
};
use aya_obj::generated::bpf_cmd;

/// The kernel's `bpf_attr` for the `BPF_MAP_*_BATCH` commands.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// How many entries of a hash map one call asks for at first; doubled
/// where one bucket holds more.
const CHUNK: u32 = 512;

/// The most entries one call may ask for: a hash bucket never holds so
/// many unless the kernel is wrong.
const MOST: u32 = 1 << 20;

/// Entries of a per-CPU map: each key with its value on every possible CPU.
pub type PerCpuEntries<K, V> = Vec<(K, Vec<V>)>;

thread_local! {
    /// The keys' and values' buffers, kept from one read to the next: a
    /// read every 5 ms would otherwise allocate and zero them each time,
    /// which on a host of many CPUs is a megabyte a map.
    static BUFFERS: RefCell<(Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Why a read fell back to a key at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FallbackReason {
    /// The kernel has no batch lookup for the map (or none at all): every
    /// read of it falls back, and costs tracer a syscall or two a key.
    Unsupported,
    /// A hash bucket's lock was busy, or the call was interrupted: this
    /// read fell back, the next tries a batch again.
    Busy,
}

impl FallbackReason {
    /// The class of the errno `code` a batch lookup failed with, `None`
    /// where it is an error and no reason to read a key at a time.
    #[must_use]
    pub const fn of(code: i32) -> Option<Self> {
        match code {
            // ENOTSUPP (524), the kernel's own, is what a map type without
            // batch operations answers; EINVAL, a kernel without the
            // command.
            libc::EINVAL | libc::EOPNOTSUPP | ENOTSUPP => Some(Self::Unsupported),
            // A hash bucket's lock busy (an NMI's program holds it; since
            // 6.15 a lock that gave up) fails the batch where a lookup of
            // one key, which takes no lock, does not.
            libc::EBUSY | libc::EDEADLK | libc::ETIMEDOUT | libc::EINTR | libc::EAGAIN => Some(Self::Busy),
            _ => None,
        }
    }
}

/// The kernel's own "not supported", which libc does not name.
const ENOTSUPP: i32 = 524;

/// The reads that fell back to a key at a time, by reason, since tracer
/// started, and the errno each reason was first seen with (0 before):
/// nothing is lost by one (the map is read whole all the same), but it
/// costs tracer more CPU, and a fallback is never silent.
static UNSUPPORTED: AtomicU64 = AtomicU64::new(0);
static BUSY: AtomicU64 = AtomicU64::new(0);
static FIRST_UNSUPPORTED: AtomicI32 = AtomicI32::new(0);
static FIRST_BUSY: AtomicI32 = AtomicI32::new(0);

/// The batch reads that fell back to a key at a time so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fallbacks {
    /// For want of the kernel's batch lookup ([`FallbackReason::Unsupported`]).
    pub unsupported: u64,
    /// For a busy bucket or an interrupted call ([`FallbackReason::Busy`]).
    pub busy: u64,
    /// The errno of the first of each, 0 where there was none.
    pub first_unsupported: i32,
    pub first_busy: i32,
}

impl Fallbacks {
    /// The errno `code` as the kernel names it, with its number.
    #[must_use]
    pub fn errno_name(code: i32) -> String {
        let name = match code {
            libc::EINVAL => "EINVAL",
            libc::EOPNOTSUPP => "EOPNOTSUPP",
            ENOTSUPP => "ENOTSUPP",
            libc::EBUSY => "EBUSY",
            libc::EDEADLK => "EDEADLK",
            libc::ETIMEDOUT => "ETIMEDOUT",
            libc::EINTR => "EINTR",
            libc::EAGAIN => "EAGAIN",
            _ => "errno",
        };
        format!("{name} ({code})")
    }
}

/// The batch reads that fell back to a key at a time since tracer started.
#[must_use]
pub fn fallbacks() -> Fallbacks {
    Fallbacks {
        unsupported: UNSUPPORTED.load(Ordering::Relaxed),
        busy: BUSY.load(Ordering::Relaxed),
        first_unsupported: FIRST_UNSUPPORTED.load(Ordering::Relaxed),
        first_busy: FIRST_BUSY.load(Ordering::Relaxed),
    }
}

/// Counts one read that fell back for `reason`, first seen as `code`.
fn count_fallback(reason: FallbackReason, code: i32) {
    let (count, first) = match reason {
        FallbackReason::Unsupported => (&UNSUPPORTED, &FIRST_UNSUPPORTED),
        FallbackReason::Busy => (&BUSY, &FIRST_BUSY),
    };
    count.fetch_add(1, Ordering::Relaxed);
    let _ = first.compare_exchange(0, code, Ordering::Relaxed, Ordering::Relaxed);
}

/// What one call left: the entries it filled and whether the map has more.
enum Batch {
    /// This many filled, and more to read from the position it wrote.
    More(u32),
    /// This many filled, and none after them.
    End(u32),
    /// Not one entry fits in the buffers: a bucket holds more.
    TooSmall,
    /// No batch this time: the kernel has no batch lookup for this map,
    /// or a bucket's lock was busy; the map is read a key at a time, and
    /// the read is counted ([`fallbacks`]).
    KeyByKey,
}

/// One `BPF_MAP_LOOKUP_BATCH` of `map` from `position` (the start where
/// `None`) into `keys` and `values`, of `count` entries each; the position
/// after it is written to `next`.
///
/// # Safety
/// `keys` and `values` hold at least `count` of the map's keys and
/// (per-CPU) values, as the kernel sizes them.
unsafe fn lookup(
    map: &MapData,
    position: Option<&u64>,
    next: &mut u64,
    (keys, values): (&mut [u8], &mut [u8]),
    count: u32,
) -> std::io::Result<Batch> {
    let mut attr = BatchAttr {
        in_batch: position.map_or(0, |p| std::ptr::from_ref(p) as u64),
        out_batch: std::ptr::from_mut(next) as u64,
        keys: keys.as_mut_ptr() as u64,
        values: values.as_mut_ptr() as u64,
        count,
        map_fd: u32::try_from(map.fd().as_fd().as_raw_fd())
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?,
        ..BatchAttr::default()
    };
    let size = libc::c_long::try_from(size_of::<BatchAttr>()).unwrap_or(0);
    // SAFETY: attr is laid out as the kernel's bpf_attr for a batch
    // command, its size passed with it. Its keys and values point to
    // buffers of `count` keys and values of the map's sizes (this
    // function's contract), and in_batch and out_batch to 8 bytes (an
    // array's position is its 4-byte key, a hash map's a 4-byte bucket),
    // all of which outlive the call.
    let rc =
        unsafe { libc::syscall(libc::SYS_bpf, bpf_cmd::BPF_MAP_LOOKUP_BATCH as libc::c_long, &raw mut attr, size) };
    if rc == 0 {
        return Ok(Batch::More(attr.count));
    }
    let e = std::io::Error::last_os_error();
    let code = e.raw_os_error().unwrap_or(0);
    match code {
        // Read up to the end: with the entries read.
        libc::ENOENT => Ok(Batch::End(attr.count)),
        libc::ENOSPC => Ok(Batch::TooSmall),
        _ => match FallbackReason::of(code) {
            Some(reason) => {
                count_fallback(reason, code);
                Ok(Batch::KeyByKey)
            }
            None => Err(e),
        },
    }
}

/// The bytes of one entry's per-CPU value: one 8-byte aligned copy per
/// possible CPU, `cpus` of them.
const fn per_cpu_len<V>(cpus: usize) -> usize {
    size_of::<V>().next_multiple_of(8).saturating_mul(cpus)
}

/// Values of `V` at the start of each `stride` bytes of `bytes`.
fn values_of<V: Pod>(bytes: &[u8], stride: usize) -> Vec<V> {
    bytes
        .chunks_exact(stride)
        // SAFETY: V is Pod, so any bytes are a value of it, and each chunk
        // holds at least size_of::<V>() of them (stride is at least that);
        // the read is unaligned because the buffer is of bytes.
        .map(|chunk| unsafe { std::ptr::read_unaligned(chunk.as_ptr().cast::<V>()) })
        .collect()
}

/// The possible CPUs, as the kernel sizes a per-CPU value by them.
fn possible_cpus() -> std::io::Result<usize> {
    aya::util::nr_cpus().map_err(|(_, e)| e)
}

/// Every entry of the per-CPU hash map `map`, each with its values on
/// every possible CPU; `None` where it is to be read a key at a time.
///
/// # Errors
/// The lookup's.
pub fn hash_entries<T: Borrow<MapData>, K: Pod, V: Pod>(
    map: &PerCpuHashMap<T, K, V>,
) -> std::io::Result<Option<PerCpuEntries<K, V>>> {
    // SAFETY: aya checked the map's key and value sizes against K and V
    // when it made the typed map, and the CPUs are those the kernel sizes
    // a per-CPU value by.
    unsafe { in_chunks(map.map(), possible_cpus()?, CHUNK) }
}

/// Every index of the per-CPU array `map` of `len` entries, each its
/// values on every possible CPU; `None` where it is to be read an index
/// at a time.
///
/// # Errors
/// The lookup's, or one that did not give every index once.
pub fn array_values<T: Borrow<MapData>, V: Pod>(
    map: &PerCpuArray<T, V>,
    len: u32,
) -> std::io::Result<Option<Vec<Vec<V>>>> {
    // SAFETY: as for hash_entries; an array's key is a u32.
    let Some(entries) = (unsafe { in_chunks::<u32, V>(map.map(), possible_cpus()?, len.max(1)) })? else {
        return Ok(None);
    };
    let mut out: Vec<Option<Vec<V>>> = vec![None; usize::try_from(len).unwrap_or(usize::MAX)];
    for (index, values) in entries {
        match usize::try_from(index).ok().and_then(|i| out.get_mut(i)) {
            Some(slot @ None) => *slot = Some(values),
            _ => {
                return Err(std::io::Error::other(format!(
                    "the batch lookup gave index {index} of {len} twice or out of range"
                )));
            }
        }
    }
    out.into_iter()
        .map(|v| v.ok_or_else(|| std::io::Error::other(format!("the batch lookup left out an index of {len}"))))
        .collect::<std::io::Result<Vec<_>>>()
        .map(Some)
}

/// Every entry of the per-CPU map `map` (a hash or an array), asking for
/// `count` entries a call at first; `None` where it is to be read a key at
/// a time.
///
/// # Safety
/// The map's keys are `K` and its values `V` (their sizes), and `cpus` is
/// at least the number of possible CPUs.
pub(super) unsafe fn in_chunks<K: Pod, V: Pod>(
    map: &MapData,
    cpus: usize,
    mut count: u32,
) -> std::io::Result<Option<PerCpuEntries<K, V>>> {
    let (stride, entry, key_len) = (size_of::<V>().next_multiple_of(8), per_cpu_len::<V>(cpus), size_of::<K>());
    BUFFERS.with_borrow_mut(|(keys, values)| {
        let mut out = Vec::new();
        let (mut position, mut next) = (None, 0u64);
        loop {
            let n = usize::try_from(count).unwrap_or(usize::MAX);
            let (key_bytes, value_bytes) = (n.saturating_mul(key_len), n.saturating_mul(entry));
            // Grown, never shrunk: only the entries the kernel fills are read.
            if keys.len() < key_bytes {
                keys.resize(key_bytes, 0);
            }
            if values.len() < value_bytes {
                values.resize(value_bytes, 0);
            }
            let buffers = (&mut keys[..key_bytes], &mut values[..value_bytes]);
            // SAFETY: the buffers hold `count` keys of K's size and values
            // of `entry` bytes, which by this function's contract are the
            // map's.
            let (filled, end) = match unsafe { lookup(map, position.as_ref(), &mut next, buffers, count) }? {
                Batch::KeyByKey => return Ok(None),
                Batch::TooSmall if count < MOST => {
                    count = count.saturating_mul(2);
                    continue;
                }
                Batch::TooSmall => return Err(std::io::Error::other(format!("a bucket holds over {MOST} entries"))),
                Batch::More(filled) => (filled, false),
                Batch::End(filled) => (filled, true),
            };
            let filled = usize::try_from(filled).unwrap_or(usize::MAX).min(n);
            for (key, value) in
                keys[..key_bytes].chunks_exact(key_len).zip(values[..value_bytes].chunks_exact(entry)).take(filled)
            {
                let key = values_of::<K>(key, key_len).pop().ok_or_else(|| std::io::Error::other("an empty key"))?;
                out.push((key, values_of::<V>(value, stride)));
            }
            if end {
                return Ok(Some(out));
            }
            // The kernel fills at least one entry of a call that is not the
            // last, or says the buffers are too small.
            if filled == 0 {
                return Err(std::io::Error::other("the batch lookup read nothing and did not end"));
            }
            position = Some(next);
        }
    })
}
