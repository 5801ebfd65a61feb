//! Reading a whole per-CPU array in one `BPF_MAP_LOOKUP_BATCH` (Linux
//! 5.6 and later) instead of one lookup per index: the sizes' buckets and
//! the statistics are 291 indexes, read at every interval and every 5 ms
//! while a window is live, and one syscall each was most of tracer's own
//! CPU time between censuses (BENCHMARKS.md, "tracer's own cost while
//! attached").

use std::os::fd::{AsFd as _, AsRawFd as _};

use aya::{Pod, maps::MapData};
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

/// Where the kernel has no batch lookup for this map: the caller reads
/// it one index at a time.
fn unsupported(e: &std::io::Error) -> bool {
    // ENOTSUPP (524), the kernel's own, is what a map type without batch
    // operations answers; EINVAL, a kernel without the command.
    matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP | 524))
}

/// Every index of the per-CPU array `map` of `len` entries, each its
/// values on every possible CPU, `cpus` of them; `None` where the kernel
/// has no batch lookup for it.
///
/// # Errors
/// The lookup's, or a kernel that filled fewer entries than asked.
pub fn per_cpu_array<V: Pod + Default>(map: &MapData, len: u32, cpus: usize) -> std::io::Result<Option<Vec<Vec<V>>>> {
    // A per-CPU value is one 8-byte aligned copy per possible CPU.
    let stride = size_of::<V>().next_multiple_of(8);
    let entry = stride.saturating_mul(cpus);
    let count = usize::try_from(len).unwrap_or(usize::MAX);
    let mut keys = vec![0u32; count];
    let mut values = vec![0u8; entry.saturating_mul(count)];
    // The position after the last entry read, which the kernel writes and
    // an array's lookup reads as a key: room for one.
    let mut out_batch = 0u64;
    let mut attr = BatchAttr {
        keys: keys.as_mut_ptr() as u64,
        values: values.as_mut_ptr() as u64,
        out_batch: std::ptr::from_mut(&mut out_batch) as u64,
        count: len,
        map_fd: u32::try_from(map.fd().as_fd().as_raw_fd())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?,
        ..BatchAttr::default()
    };
    let size = libc::c_long::try_from(size_of::<BatchAttr>()).unwrap_or(0);
    // SAFETY: attr is laid out as the kernel's bpf_attr for a batch
    // command, its size passed with it; keys and values point to buffers
    // of `len` keys and `len` per-CPU values, and out_batch to 8 bytes
    // (an array's key is 4), all of which outlive the call.
    let rc =
        unsafe { libc::syscall(libc::SYS_bpf, bpf_cmd::BPF_MAP_LOOKUP_BATCH as libc::c_long, &raw mut attr, size) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        // Reading up to the end answers ENOENT, with the entries read.
        if e.raw_os_error() != Some(libc::ENOENT) {
            return if unsupported(&e) { Ok(None) } else { Err(e) };
        }
    }
    if attr.count != len {
        return Err(std::io::Error::other(format!("the batch lookup read {} of {len} entries", attr.count)));
    }
    let mut out = vec![Vec::new(); count];
    for (i, key) in keys.iter().enumerate() {
        let index = usize::try_from(*key).unwrap_or(usize::MAX);
        let slot = out
            .get_mut(index)
            .ok_or_else(|| std::io::Error::other(format!("the batch lookup gave index {key} of {len}")))?;
        let bytes = &values[i * entry..(i + 1) * entry];
        *slot = bytes
            .chunks_exact(stride)
            // SAFETY: V is Pod, so any bytes are a value of it, and each
            // chunk holds at least size_of::<V>() of them; the read is
            // unaligned because the buffer is of bytes.
            .map(|chunk| unsafe { std::ptr::read_unaligned(chunk.as_ptr().cast::<V>()) })
            .collect();
    }
    Ok(Some(out))
}
