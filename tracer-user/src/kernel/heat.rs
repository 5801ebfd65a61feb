//! The order the budget's windows attach and detach in. The kernel writes
//! a uprobe-multi link's breakpoints in one by one in the link's order, and
//! takes them out in the same order, about 60 µs each here (a link's 62
//! sites out within about 4 ms); a window of Debian 3.11's ~1,400 sites
//! took 60-100 ms to come down, while the target kept running into the
//! breakpoints still in place. On the demo workload those hits were up to
//! half of a window's cost, and the part of it that varied most (1,600 to
//! 12,000 hits). Measured by hand: BENCHMARKS.md, "By hand, 2026-12-06".
//!
//! So where the programs count where their hits land
//! ([`tracer_common::heat`]), each link's hottest sites go into links of
//! their own, in tiers: the hottest attached last and detached first, each
//! tier's detach begun once the tier before it has had time to take its
//! breakpoints out (a link's close then waits for a grace period, 56-104
//! ms here, which the next tier need not wait for). A window's detach then
//! cost 704-6,976 hits on the demo workload.

use aya::maps::{MapData, PerCpuArray};
use tracer_common::{
    heat::{BUCKETS, Heat, bucket},
    names,
};

use super::{AttachError, Session};
use crate::probe::Program;

/// The tiers of a link's hottest sites, hottest first: how many sites
/// each may hold. The hottest tier goes in last and comes out first; its
/// own order is hottest first, so that its few sites come out quickly
/// and go in within a moment of each other.
pub const TIERS: [usize; 2] = [16, 112];

/// The share of a link's hits its tiers may stop at: the rest of its sites
/// stay in the cold link, which comes down last.
const HOT_SHARE: f64 = 0.995;

/// About how long the kernel takes to take one breakpoint out of a busy
/// target (measured on the demo workload: a link's 62 sites within about
/// 4 ms, uncontended), without the grace period that follows a link's:
/// how long the next tier waits to begin, so that it does not contend
/// for the target's memory map with the tier before it.
pub const PER_SITE: std::time::Duration = std::time::Duration::from_micros(60);

impl Session {
    /// Hits per site bucket since the session was loaded, summed over
    /// CPUs; `None` where the programs do not count them or none was
    /// counted yet.
    pub(super) fn heat(&self) -> Result<Option<Vec<u64>>, AttachError> {
        if !self.heat {
            return Ok(None);
        }
        let map_err = |cause| AttachError::Map { name: names::HEAT_MAP, cause: Box::new(cause) };
        let map = self
            .ebpf
            .map(names::HEAT_MAP)
            .ok_or_else(|| map_err(aya::maps::MapError::InvalidName { name: names::HEAT_MAP.to_owned() }))?;
        let heat: PerCpuArray<&MapData, Heat> = PerCpuArray::try_from(map).map_err(map_err)?;
        let per_cpu = heat.get(&0, 0).map_err(map_err)?;
        let mut sum = vec![0u64; BUCKETS];
        for cpu in per_cpu.iter() {
            for (s, &h) in sum.iter_mut().zip(&cpu.hits) {
                *s += u64::from(h);
            }
        }
        Ok(sum.iter().any(|&h| h > 0).then_some(sum))
    }
}

/// Whether `program`'s sites may go into hot and cold links: one that
/// only counts. A mark ([`Program::NativeNested`]) must go live before the
/// calls it marks, and the live table's entries before their returns:
/// their links keep the order of programs, attached before the hot ones.
pub(super) const fn splits(program: Program) -> bool {
    !matches!(
        program,
        Program::NativeNested
            | Program::LiveAlloc
            | Program::LiveFree
            | Program::LiveImpl
            | Program::LiveRet
            | Program::LiveRetUret
            | Program::RetValue
            | Program::RetValueUret
    )
}

/// `points` split by the `heat` of each one's `offset` into those that
/// stay in the cold link, in their order, and the [`TIERS`] of the hot
/// ones, the hottest tier first, each hottest first: the fewest that take
/// [`HOT_SHARE`] of the hits, at most the tiers' room. Sites that share a
/// bucket share its heat; none is hot where the points had no hit.
#[allow(clippy::cast_precision_loss, reason = "hit counts far below 2^52")]
pub(super) fn split<T>(points: Vec<T>, offset: impl Fn(&T) -> u64, heat: &[u64]) -> (Vec<T>, Vec<Vec<T>>) {
    let of = |p: &T| heat.get(bucket(offset(p))).copied().unwrap_or(0);
    let total: u64 = points.iter().map(&of).sum();
    let room: usize = TIERS.iter().sum();
    let mut ranked: Vec<(usize, u64)> = points.iter().enumerate().map(|(i, p)| (i, of(p))).collect();
    // Stable: equal heat keeps the plan's order.
    ranked.sort_by_key(|&(_, h)| std::cmp::Reverse(h));
    let mut rank = vec![usize::MAX; points.len()];
    let mut taken = 0u64;
    for (r, &(i, h)) in ranked.iter().enumerate() {
        if h == 0 || r == room || taken as f64 >= HOT_SHARE * total as f64 {
            break;
        }
        rank[i] = r;
        taken += h;
    }
    let mut hot: Vec<(usize, T)> = Vec::new();
    let mut cold = Vec::new();
    for (i, p) in points.into_iter().enumerate() {
        if rank[i] == usize::MAX { cold.push(p) } else { hot.push((rank[i], p)) }
    }
    hot.sort_by_key(|&(r, _)| r);
    let mut tiers: Vec<Vec<T>> = Vec::new();
    let mut hot = hot.into_iter().map(|(_, p)| p);
    for n in TIERS {
        let tier: Vec<T> = hot.by_ref().take(n).collect();
        if tier.is_empty() {
            break;
        }
        tiers.push(tier);
    }
    (cold, tiers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hottest_sites_go_last_hottest_first_and_the_rest_keep_their_order() {
        let mut heat = vec![0u64; BUCKETS];
        // Offsets 0x1010 and 0x2010 share a bucket (and its 500 hits).
        heat[0x010] = 500;
        heat[0x020] = 9_000;
        heat[0x030] = 1;
        let points = vec![0x1010, 0x1020, 0x1030, 0x1040, 0x2010];
        let (cold, tiers) = split(points.clone(), |&o| o, &heat);
        // 9,000 + 500 + 500 of 10,001 hits: 99.99% with the third.
        assert_eq!(tiers, vec![vec![0x1020, 0x1010, 0x2010]]);
        assert_eq!(cold, vec![0x1030, 0x1040]);
        // No hit at any: nothing is hot.
        let (cold, tiers) = split(points.clone(), |&o| o + 8, &heat);
        assert_eq!((cold, tiers), (points, Vec::<Vec<u64>>::new()));
    }

    #[test]
    fn the_tiers_hold_so_many_sites_at_most() {
        // Heat falling with the offset: the first are the hottest.
        let heat: Vec<u64> = (0..BUCKETS as u64).map(|b| 10_000 - b).collect();
        let points: Vec<u64> = (0..200).collect();
        let (cold, tiers) = split(points, |&o| o, &heat);
        assert_eq!(tiers.len(), 2);
        assert_eq!(tiers[0], (0..16).collect::<Vec<_>>());
        assert_eq!(tiers[1], (16..128).collect::<Vec<_>>());
        assert_eq!(cold, (128..200).collect::<Vec<_>>());
    }

    #[test]
    fn marks_and_the_live_table_keep_their_links_whole() {
        assert!(splits(Program::CountSite) && splits(Program::CountClaimed) && splits(Program::FreeObject));
        assert!(!splits(Program::NativeNested) && !splits(Program::LiveImpl) && !splits(Program::RetValue));
    }
}
