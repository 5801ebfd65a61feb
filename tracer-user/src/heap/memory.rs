//! Reading another process's memory in bulk: `process_vm_readv`, up to
//! `IOV_MAX` ranges a call, each range read whole or reported missing, so
//! that one unmapped page costs one range, not the batch. Every byte and
//! call is counted: the census reports what it read.
//!
//! The same reads can be served from a memory image instead (a few
//! segments of bytes at their addresses, see [`super::image`]), so that
//! the census's decoding runs, fuzzed and tested, on memory no process
//! holds; and the reads from a process can be recorded, to make such an
//! image.

use std::io;

use super::HeapError;

/// The most ranges one `process_vm_readv` takes (`IOV_MAX`, `UIO_MAXIOV`
/// in the kernel).
pub const MAX_RANGES: usize = 1024;

/// The memory of one process, and what has been read of it.
#[derive(Debug)]
pub struct Memory {
    pid: u32,
    /// Where the bytes come from instead of the process, for an image.
    image: Option<Segments>,
    /// Every range read whole, in the order read, when recording.
    recorded: Option<Vec<(u64, Vec<u8>)>>,
    /// Bytes read whole.
    pub bytes_read: u64,
    /// System calls made.
    pub calls: u64,
    /// Ranges that could not be read (unmapped since, or never mapped).
    pub failed_ranges: u64,
}

impl Memory {
    #[must_use]
    pub const fn new(pid: u32) -> Self {
        Self { pid, image: None, recorded: None, bytes_read: 0, calls: 0, failed_ranges: 0 }
    }

    /// Memory that holds `segments` (each its address and bytes) and
    /// nothing else: a range is read whole where one segment holds all of
    /// it, and is missing otherwise, as an unmapped one is. Its PID is 0.
    #[must_use]
    pub fn of_image(segments: Vec<(u64, Vec<u8>)>) -> Self {
        Self { image: Some(Segments::new(segments)), ..Self::new(0) }
    }

    /// Records every range read whole from now on (see [`Self::recorded`]).
    #[must_use]
    pub fn recording(mut self) -> Self {
        self.recorded = Some(Vec::new());
        self
    }

    /// The ranges read whole since [`Self::recording`], each its address
    /// and bytes, in the order read (repeats included).
    #[must_use]
    pub fn recorded(&self) -> &[(u64, Vec<u8>)] {
        self.recorded.as_deref().unwrap_or(&[])
    }

    #[must_use]
    pub const fn pid(&self) -> u32 {
        self.pid
    }

    /// Reads each `(address, len)` of `ranges` into `out`, one after the
    /// other from its start; `ok[i]` says whether range `i` was read whole
    /// (a range that was not holds whatever `out` held).
    ///
    /// # Panics
    /// Where `out` is shorter than the sum of the lengths.
    pub fn read_ranges(
        &mut self,
        ranges: &[(u64, usize)],
        out: &mut [u8],
        ok: &mut Vec<bool>,
    ) -> Result<(), HeapError> {
        ok.clear();
        ok.resize(ranges.len(), false);
        let total: usize = ranges.iter().map(|r| r.1).sum();
        assert!(out.len() >= total, "the buffer holds the ranges");
        if let Some(image) = &self.image {
            image.read_ranges(ranges, out, ok);
            self.calls += 1;
            let (done, failed) = ranges.iter().zip(ok.iter()).fold((0, 0), |(done, failed), (r, &ok)| {
                if ok { (done + r.1 as u64, failed) } else { (done, failed + 1) }
            });
            self.bytes_read += done;
            self.failed_ranges += failed;
        } else {
            self.read_process(ranges, out, ok)?;
        }
        if let Some(recorded) = &mut self.recorded {
            let mut at = 0;
            for (&(address, len), &whole) in ranges.iter().zip(ok.iter()) {
                if whole {
                    recorded.push((address, out[at..at + len].to_vec()));
                }
                at += len;
            }
        }
        Ok(())
    }

    /// [`Self::read_ranges`] from the process.
    fn read_process(&mut self, ranges: &[(u64, usize)], out: &mut [u8], ok: &mut [bool]) -> Result<(), HeapError> {
        let mut first = 0;
        let mut at = 0;
        while first < ranges.len() {
            let batch = &ranges[first..ranges.len().min(first + MAX_RANGES)];
            let mut local = Vec::with_capacity(batch.len());
            let mut remote = Vec::with_capacity(batch.len());
            let mut offset = at;
            for &(address, len) in batch {
                local.push(libc::iovec { iov_base: out[offset..].as_mut_ptr().cast(), iov_len: len });
                remote.push(libc::iovec { iov_base: address as *mut libc::c_void, iov_len: len });
                offset += len;
            }
            let read = self.readv(&local, &remote)?;
            // Ranges up to `read` bytes are whole; the one it ends in
            // failed (the kernel stops at the first page it cannot read),
            // and the next call starts after it.
            let mut done = 0;
            let mut consumed = 0;
            for (i, &(_, len)) in batch.iter().enumerate() {
                if done + len <= read {
                    ok[first + i] = true;
                    done += len;
                    consumed = i + 1;
                } else {
                    consumed = i + 1;
                    self.failed_ranges += 1;
                    break;
                }
            }
            self.bytes_read += done as u64;
            at += batch[..consumed].iter().map(|r| r.1).sum::<usize>();
            first += consumed;
        }
        Ok(())
    }

    /// One `process_vm_readv`: the bytes read (0 where the first range
    /// fails).
    fn readv(&mut self, local: &[libc::iovec], remote: &[libc::iovec]) -> Result<usize, HeapError> {
        let pid = libc::pid_t::try_from(self.pid).map_err(|_| HeapError::Exited { pid: self.pid })?;
        self.calls += 1;
        // SAFETY: every local iovec points into `out` of `read_ranges`,
        // which holds them all (asserted there), and lives across the call;
        // the remote ones are only addresses in the other process, which
        // the kernel checks.
        let n = unsafe {
            libc::process_vm_readv(
                pid,
                local.as_ptr(),
                libc::c_ulong::try_from(local.len()).unwrap_or(0),
                remote.as_ptr(),
                libc::c_ulong::try_from(remote.len()).unwrap_or(0),
                0,
            )
        };
        if n >= 0 {
            return Ok(usize::try_from(n).unwrap_or(0));
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            // The first range is not mapped: nothing read.
            Some(libc::EFAULT) => Ok(0),
            Some(libc::ESRCH) => Err(HeapError::Exited { pid: self.pid }),
            _ => Err(HeapError::Read { pid: self.pid, cause: err }),
        }
    }

    /// `len` bytes at `address`, or `None` where they are not all mapped.
    pub fn read(&mut self, address: u64, len: usize) -> Result<Option<Vec<u8>>, HeapError> {
        let mut out = vec![0; len];
        let mut ok = Vec::with_capacity(1);
        self.read_ranges(&[(address, len)], &mut out, &mut ok)?;
        Ok(ok[0].then_some(out))
    }

    /// The 8-byte word at `address`, or `None` where it is not mapped.
    pub fn word(&mut self, address: u64) -> Result<Option<u64>, HeapError> {
        Ok(self.read(address, 8)?.map(|b| word(&b, 0)))
    }
}

/// The segments of a memory image, sorted by address.
#[derive(Debug)]
struct Segments(Vec<(u64, Vec<u8>)>);

impl Segments {
    fn new(mut segments: Vec<(u64, Vec<u8>)>) -> Self {
        segments.sort_by_key(|s| s.0);
        Self(segments)
    }

    /// The `len` bytes at `address`, where one segment holds them all.
    /// Segments may overlap (an image is input like any other): the last
    /// one that starts at or below `address` is asked.
    fn get(&self, address: u64, len: usize) -> Option<&[u8]> {
        let i = self.0.partition_point(|s| s.0 <= address).checked_sub(1)?;
        let (start, bytes) = &self.0[i];
        let offset = usize::try_from(address - start).ok()?;
        bytes.get(offset..offset.checked_add(len)?)
    }

    /// As [`Memory::read_ranges`], from the segments.
    fn read_ranges(&self, ranges: &[(u64, usize)], out: &mut [u8], ok: &mut [bool]) {
        let mut at = 0;
        for (i, &(address, len)) in ranges.iter().enumerate() {
            if let Some(bytes) = self.get(address, len) {
                out[at..at + len].copy_from_slice(bytes);
                ok[i] = true;
            }
            at += len;
        }
    }
}

/// The little-endian 8-byte word at `at` in `bytes`, 0 past its end.
#[must_use]
pub fn word(bytes: &[u8], at: usize) -> u64 {
    bytes.get(at..at.wrapping_add(8)).and_then(|w| w.try_into().ok()).map_or(0, u64::from_le_bytes)
}

/// The little-endian 4-byte word at `at` in `bytes`, 0 past its end.
#[must_use]
pub fn word32(bytes: &[u8], at: usize) -> u32 {
    bytes.get(at..at.wrapping_add(4)).and_then(|w| w.try_into().ok()).map_or(0, u32::from_le_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_read_whole_or_reported_missing() {
        let data: Vec<u8> = (0..=255).collect();
        let base = data.as_ptr() as u64;
        // A page that is surely not mapped: the first one.
        let ranges = [(base, 16), (0x1000, 8), (base + 100, 4), (0x1000, 4), (base + 200, 8)];
        let mut out = vec![0u8; 40];
        let mut ok = Vec::new();
        let mut memory = Memory::new(std::process::id());
        memory.read_ranges(&ranges, &mut out, &mut ok).unwrap();
        assert_eq!(ok, [true, false, true, false, true]);
        assert_eq!(&out[..16], &data[..16]);
        assert_eq!(&out[24..28], &data[100..104]);
        assert_eq!(&out[32..40], &data[200..208]);
        assert_eq!(memory.bytes_read, 28);
        assert_eq!(memory.failed_ranges, 2);
        assert_eq!(memory.word(base + 8).unwrap(), Some(u64::from_le_bytes(data[8..16].try_into().unwrap())));
        assert_eq!(memory.word(0x1000).unwrap(), None);
    }

    #[test]
    fn more_ranges_than_one_call_takes() {
        let data: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        let base = data.as_ptr() as u64;
        let ranges: Vec<(u64, usize)> = (0..3000).map(|i| (base + (i % 4000), 1)).collect();
        let mut out = vec![0u8; 3000];
        let mut ok = Vec::new();
        let mut memory = Memory::new(std::process::id());
        memory.read_ranges(&ranges, &mut out, &mut ok).unwrap();
        assert!(ok.iter().all(|&o| o));
        assert_eq!(memory.calls, 3);
        for (i, b) in out.iter().enumerate() {
            assert_eq!(*b, data[i % 4000]);
        }
    }
}
