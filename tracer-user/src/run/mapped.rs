//! Growth of the C library's heap in growth's readings (see
//! [`tracer_common::growth::MappedKey`]): each interval, the samples the
//! kernel keeps are checked against the target's mappings and its break
//! (a mapping's sample must still start inside a mapping; a break's must
//! lie below the break, and is cut to it), and the later of two samples
//! over the same bytes holds them. What a stack holds, pymalloc's pools
//! and the C library's bytes together, is a [`Held`].

use std::collections::{BTreeMap, HashMap};

use tracer_common::growth::{MAPPED_BRK, MAPPED_LOW, MAPPED_MMAP, MappedKey, MappedSample};

use crate::kernel::Session;

/// What a stack (or a site) holds: sampled pools in use, and sampled
/// growths of the C library's heap still mapped.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Held {
    pub pools: u64,
    pub mapped: u64,
    /// The bytes the mapped samples stand for.
    pub mapped_bytes: u64,
    /// Their variance (Horvitz-Thompson: a growth of `len` bytes sampled
    /// with probability `len` / W stands for W, with variance W(W − len)).
    pub mapped_var: f64,
}

impl Held {
    /// Adds `other`'s.
    pub fn add(&mut self, other: &Self) {
        self.pools += other.pools;
        self.mapped += other.mapped;
        self.mapped_bytes = self.mapped_bytes.saturating_add(other.mapped_bytes);
        self.mapped_var += other.mapped_var;
    }

    /// Samples of either kind.
    #[must_use]
    pub const fn samples(&self) -> u64 {
        self.pools.saturating_add(self.mapped)
    }

    /// The bytes held, a pool sample standing for `pool_sample` bytes.
    #[must_use]
    pub const fn bytes(&self, pool_sample: u64) -> u64 {
        self.pools.saturating_mul(pool_sample).saturating_add(self.mapped_bytes)
    }

    /// The 95% confidence interval of [`Self::bytes`]: each pool take
    /// sampled with probability 1/`every` (binomial, normal
    /// approximation, pools of `pool_size` bytes), plus the mapped
    /// samples' variance.
    #[must_use]
    #[allow(clippy::cast_precision_loss, reason = "an interval, not a count")]
    pub fn ci95(&self, every: u32, pool_size: u64) -> [f64; 2] {
        let (pools, n, size) = (self.pools as f64 * f64::from(every), f64::from(every), pool_size as f64);
        let variance = pools * (n - 1.0) * size * size + self.mapped_var;
        let (mid, half) = (pools * size + self.mapped_bytes as f64, 1.96 * variance.sqrt());
        [(mid - half).max(0.0), mid + half]
    }
}

/// The C library's heap, watched or not.
pub struct Mapped {
    pid: u32,
    /// Why it is not watched, where it is not.
    pub unavailable: Option<String>,
    /// Samples ended here (unmapped, below the break, or covered by a
    /// later one) rather than by the programs.
    pub pruned: u64,
    /// What each break sample (by its key and when it was taken) still
    /// holds at most: cuts by lowerings of the break and by later samples
    /// over its top, which outlast the lowerings' records.
    cuts: HashMap<(MappedKey, u64), u64>,
}

impl Mapped {
    /// Attaches the programs for `pid`; where they cannot be, says why in
    /// every report from now on (the pools are still sampled).
    pub fn attach(session: &mut Session, pid: u32) -> Self {
        let unavailable = session.attach_mapped(pid, || brk_now(pid)).err().map(|e| e.to_string());
        Self { pid, unavailable, pruned: 0, cuts: HashMap::new() }
    }

    /// Not attached (growth is not attached yet, or went without).
    #[must_use]
    pub fn off(pid: u32) -> Self {
        Self { pid, unavailable: None, pruned: 0, cuts: HashMap::new() }
    }

    /// What the samples miss, in words, where they miss it.
    #[must_use]
    pub fn caveat(&self) -> Option<String> {
        self.unavailable.as_ref().map(|why| {
            format!("the C library's heap (malloc's mappings and break) is not seen: {why}; only pymalloc's pools are")
        })
    }

    /// The samples still holding bytes, per stack; the rest removed from
    /// the kernel's map, and the break's lowerings applied and removed.
    pub fn read(&mut self, session: &mut Session) -> Result<BTreeMap<u64, Held>, String> {
        if self.unavailable.is_some() {
            return Ok(BTreeMap::new());
        }
        // The samples first: a mapping a sample was taken for is in the
        // maps read after it, unless unmapped since (and then its sample
        // is gone from the kernel's map too, or ends here).
        let all: Vec<(MappedKey, MappedSample)> = session
            .mapped_samples()
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|(k, _)| k.tgid == self.pid)
            .collect();
        if all.is_empty() {
            self.cuts.clear();
            return Ok(BTreeMap::new());
        }
        let (lowerings, samples): (Vec<_>, Vec<_>) = all.into_iter().partition(|(k, _)| k.kind == MAPPED_LOW);
        // The maps only where a mapping's sample is to be judged: reading
        // them is most of what a reading costs tracer.
        let ranges = if samples.iter().any(|(k, _)| k.kind == MAPPED_MMAP) {
            ranges(&std::fs::read_to_string(format!("/proc/{}/maps", self.pid)).map_err(|e| e.to_string())?)
        } else {
            Vec::new()
        };
        let top = session.brk_top(self.pid).map_err(|e| e.to_string())?;
        let lows: Vec<(u64, u64)> = lowerings.iter().map(|(k, s)| (k.address, s.taken_ns)).collect();
        let judged = judge(&samples, &ranges, top, &lows, &mut self.cuts);
        for (key, sample) in judged.dead.iter().chain(&lowerings) {
            let removed = session.remove_mapped_sample(key, sample).map_err(|e| e.to_string())?;
            if removed && key.kind != MAPPED_LOW {
                self.pruned += 1;
            }
        }
        let mut by_stack: BTreeMap<u64, Held> = BTreeMap::new();
        for (sample, bytes, weight) in judged.live {
            #[allow(clippy::cast_precision_loss, reason = "a variance")]
            let var = weight as f64 * weight.saturating_sub(bytes) as f64;
            by_stack.entry(sample.stack).or_default().add(&Held {
                pools: 0,
                mapped: 1,
                mapped_bytes: weight,
                mapped_var: var,
            });
        }
        Ok(by_stack)
    }
}

/// What [`judge`] found.
#[derive(Debug, Default)]
pub struct Judged {
    /// Each sample still holding bytes: the bytes it holds and the bytes
    /// it stands for now.
    pub live: Vec<(MappedSample, u64, u64)>,
    /// The samples that hold nothing.
    pub dead: Vec<(MappedKey, MappedSample)>,
}

/// Judges the samples: a mapping's holds while its address is inside a
/// mapping (`ranges`). A break's holds what lies below the break (`top`)
/// and below every lowering (`lows`: where to, and when) made after it was
/// taken, and what no later sample (of either kind, over the same bytes)
/// holds; those cuts are kept in `cuts`, since a lowering is recorded
/// once. A cut sample stands for its weight in proportion.
pub fn judge(
    samples: &[(MappedKey, MappedSample)],
    ranges: &[(u64, u64)],
    top: Option<u64>,
    lows: &[(u64, u64)],
    cuts: &mut HashMap<(MappedKey, u64), u64>,
) -> Judged {
    let mut sorted: Vec<&(MappedKey, MappedSample)> = samples.iter().collect();
    sorted.sort_by_key(|(k, _)| (k.kind, k.address));
    // The highest end of the samples of the same kind before each (by
    // address): where to stop looking down for one over its start.
    let mut reach_below = Vec::with_capacity(sorted.len());
    let mut highest: (u32, u64) = (0, 0);
    for (k, s) in &sorted {
        reach_below.push(if highest.0 == k.kind { highest.1 } else { 0 });
        let end = k.address.saturating_add(s.len);
        highest = if highest.0 == k.kind { (k.kind, highest.1.max(end)) } else { (k.kind, end) };
    }
    let mut out = Judged::default();
    let mut seen = std::collections::HashSet::new();
    for (i, (key, sample)) in sorted.iter().enumerate() {
        let id = (*key, sample.taken_ns);
        seen.insert(id);
        let (mut start, mut end) = (key.address, key.address.saturating_add(sample.len));
        if let Some(cut) = cuts.get(&id) {
            end = end.min(*cut);
        }
        if key.kind == MAPPED_BRK {
            for (low, when) in lows {
                if *when > sample.taken_ns {
                    end = end.min(*low);
                }
            }
            end = end.min(top.unwrap_or(0));
        }
        // Later samples over its bytes: above its start they cut its top;
        // one over its start moves its start up past them.
        let later = |j: usize| sorted[j].0.kind == key.kind && sorted[j].1.taken_ns > sample.taken_ns;
        for (j, (other, _)) in sorted.iter().enumerate().skip(i + 1) {
            if other.kind != key.kind || other.address >= end {
                break;
            }
            if later(j) {
                end = end.min(other.address.max(start));
            }
        }
        for j in (0..i).rev() {
            if sorted[j].0.kind != key.kind || reach_below[j + 1] <= start {
                break;
            }
            let reach = sorted[j].0.address.saturating_add(sorted[j].1.len);
            if later(j) && reach > start {
                start = start.max(reach);
            }
        }
        if key.kind == MAPPED_BRK && end < key.address.saturating_add(sample.len) {
            cuts.insert(id, end);
        }
        let held = match key.kind {
            MAPPED_MMAP => {
                ranges.iter().any(|(s, e)| (*s..*e).contains(&key.address)).then_some(end.saturating_sub(start))
            }
            MAPPED_BRK => Some(end.saturating_sub(start)),
            _ => None,
        };
        match held {
            Some(bytes) if bytes > 0 => {
                let weight = if bytes == sample.len {
                    sample.weight
                } else {
                    u64::try_from(u128::from(sample.weight) * u128::from(bytes) / u128::from(sample.len.max(1)))
                        .unwrap_or(u64::MAX)
                };
                out.live.push((*sample, bytes, weight));
            }
            _ => out.dead.push((*key, *sample)),
        }
    }
    cuts.retain(|id, _| seen.contains(id));
    out
}

/// Every mapping's address range in a `/proc/PID/maps` text.
#[must_use]
pub fn ranges(maps: &str) -> Vec<(u64, u64)> {
    maps.lines()
        .filter_map(|line| {
            let (start, end) = line.split_whitespace().next()?.split_once('-')?;
            Some((u64::from_str_radix(start, 16).ok()?, u64::from_str_radix(end, 16).ok()?))
        })
        .collect()
}

/// `pid`'s break now: the end of its `[heap]` mapping, or where the heap
/// would start (`start_brk`, field 47 of `/proc/PID/stat`) if it has none.
fn brk_now(pid: u32) -> Option<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    if let Some(end) = maps.lines().find(|l| l.ends_with("[heap]")).and_then(|l| {
        let (_, end) = l.split_whitespace().next()?.split_once('-')?;
        u64::from_str_radix(end, 16).ok()
    }) {
        return Some(end);
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields from the third on follow the command's closing parenthesis.
    stat.rsplit_once(')')?.1.split_whitespace().nth(47 - 3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(kind: u32, address: u64, len: u64, taken_ns: u64) -> (MappedKey, MappedSample) {
        (MappedKey { tgid: 1, kind, address }, MappedSample { stack: 9, taken_ns, len, weight: len.max(512 << 10) })
    }

    /// A mapping's sample holds while mapped; a break's below the break,
    /// below every lowering made after it, and below a later sample over
    /// its top, cut with its weight; the cuts outlast the lowerings.
    #[test]
    fn samples_hold_what_is_still_theirs() {
        let maps = "7f0000000000-7f0000200000 rw-p 00000000 00:00 0 \n55aa00000000-55aa00100000 rw-p 00000000 00:00 0   [heap]\n";
        let ranges = ranges(maps);
        assert_eq!(ranges, [(0x7f00_0000_0000, 0x7f00_0020_0000), (0x55aa_0000_0000, 0x55aa_0010_0000)]);
        let mib = 1u64 << 20;
        let mapped = sample(MAPPED_MMAP, 0x7f00_0000_0000, 2 * mib, 5);
        let unmapped = sample(MAPPED_MMAP, 0x7e00_0000_0000, 2 * mib, 5);
        let base = 0x55aa_0000_0000;
        // Raised by 1 MiB, then (lowered by half and raised again) from
        // half way by `later`: `low` keeps its lower half.
        let low = sample(MAPPED_BRK, base, mib, 1);
        let later = sample(MAPPED_BRK, base + mib / 2, mib, 2);
        let above = sample(MAPPED_BRK, base + 0x100_0000, mib, 3);
        let samples = [mapped, unmapped, low, later, above];
        let mut cuts = HashMap::new();
        let judged = judge(&samples, &ranges, Some(base + mib), &[], &mut cuts);
        assert_eq!(
            judged.live,
            [(mapped.1, 2 * mib, 2 * mib), (low.1, mib / 2, 512 << 10), (later.1, mib / 2, 512 << 10)]
        );
        let mut dead: Vec<u64> = judged.dead.iter().map(|(k, _)| k.address).collect();
        dead.sort_unstable();
        assert_eq!(dead, [base + 0x100_0000, 0x7e00_0000_0000]);
        // The break lowered to a quarter after both were taken (at 4),
        // then raised again past them: the lowering's record cuts both
        // once, and the cut stays after the record is gone.
        let judged = judge(&[low, later], &ranges, Some(base + 2 * mib), &[(base + mib / 4, 4)], &mut cuts);
        assert_eq!(judged.live, [(low.1, mib / 4, 256 << 10)]);
        let judged = judge(&[low, later], &ranges, Some(base + 2 * mib), &[], &mut cuts);
        assert_eq!(judged.live, [(low.1, mib / 4, 256 << 10)]);
        // No break known: every break sample is dead.
        assert!(judge(&[low], &ranges, None, &[], &mut HashMap::new()).live.is_empty());
    }

    #[test]
    fn the_interval_adds_the_mapped_variance() {
        let held = Held { pools: 4, mapped: 1, mapped_bytes: 512 << 10, mapped_var: 512.0 * 1024.0 * 384.0 * 1024.0 };
        let [lo, hi] = held.ci95(32, 16384);
        let mid = 128.0 * 16384.0 + 512.0 * 1024.0;
        let half = 1.96 * (128.0 * 31.0 * 16384.0f64 * 16384.0 + held.mapped_var).sqrt();
        assert!((lo - (mid - half)).abs() < 1e-6 && (hi - (mid + half)).abs() < 1e-6, "{lo} {hi}");
        assert_eq!(held.bytes(512 << 10), 5 * (512 << 10));
        assert_eq!(held.samples(), 5);
    }
}
