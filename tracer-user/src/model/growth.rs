//! With `--growth`: heap growth by Python stack, a sampled estimate (see
//! docs/growth.md). Each interval says how the pools held by each stack's
//! takers changed since the previous one; the summary, since the attach.

use serde::{Deserialize, Serialize};

use super::stacks::SiteFrame;

/// Heap growth by Python stack, over an interval or the run, or why it
/// is not sampled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Growth {
    /// Growth cannot be sampled in this target: why, and nothing else.
    Unavailable {
        unavailable: String,
    },
    Sampled(Box<GrowthSampled>),
}

impl Growth {
    /// What it cost, where sampled.
    #[must_use]
    pub fn cost(&self) -> Option<GrowthCost> {
        match self {
            Self::Sampled(g) => g.cost,
            Self::Unavailable { .. } => None,
        }
    }

    /// The report, where sampled.
    #[must_use]
    pub fn sampled(&self) -> Option<&GrowthSampled> {
        match self {
            Self::Sampled(g) => Some(g),
            Self::Unavailable { .. } => None,
        }
    }
}

/// Heap growth by Python stack, sampled.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GrowthSampled {
    /// Always true: every figure is a sampled estimate.
    pub estimate: bool,
    /// One pool taken in this many is sampled.
    pub sample_every: u32,
    /// What a sample of a pool still in use stands for: `sample_every`
    /// pools of 16 KiB.
    pub sample_bytes: u64,
    /// The net growth over every stack: the change of `in_use_bytes` over
    /// the interval (in the summary, since the attach).
    pub bytes: i64,
    /// Pools taken since the attach and in use now, and the C library's
    /// heap grown since and still held, over every stack.
    pub in_use_bytes: u64,
    /// Of `in_use_bytes`, the C library's heap (malloc's mappings and its
    /// break), sampled by bytes.
    #[serde(default)]
    pub libc_bytes: u64,
    /// The 95% confidence interval of `in_use_bytes`, over every site's
    /// samples as [`GrowthSite::in_use_ci95`] gives one site's; where no
    /// sample is in use, `[0, ZERO_SAMPLES_UPPER × sample_bytes]`: a
    /// heap grown by less than that is missed by every sample one time
    /// in 20 or more, so a 0 is no proof of no growth. Absent in records
    /// written before it was reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_use_ci95: Option<[f64; 2]>,
    /// Each site (innermost Python frame of the takers' stacks), most
    /// growth first: every site with a sample in use, or one that had one
    /// at the last reading.
    pub sites: Vec<GrowthSite>,
    /// In the summary: every stack with a sample in use at the end, most
    /// samples first (what `--growth-folded` and `--growth-flamegraph`
    /// draw).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stacks: Option<Vec<GrowthStack>>,
    /// What the probes saw over the interval (in the summary, the run).
    pub takes: GrowthTakes,
    /// What it cost, over the interval (in the summary, the run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<GrowthCost>,
    /// What the samples miss, where they miss something.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caveat: Option<String>,
    /// Where the profile stopped sampling (its default growth cost more
    /// than half the budget): every figure is then up to the stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<GrowthStopped>,
}

/// The upper end of the 95% interval of a heap growth that no sample
/// holds, in samples' bytes: where a growth of B bytes is sampled as
/// B / `sample_bytes` samples on average (a pool take with probability
/// 1/`sample_every`, a growth of the C library's heap by its bytes), none
/// is drawn with probability at most e^(−B / `sample_bytes`), which is 5%
/// at −ln 0.05 ≈ 2.996 samples' bytes.
pub const ZERO_SAMPLES_UPPER: f64 = 2.995_732_273_553_991;

/// When and why growth sampling stopped.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GrowthStopped {
    /// Seconds since the probes went live.
    pub at_s: f64,
    /// Why, with the figures, and how to keep it on.
    pub reason: String,
}

/// The growth of one site.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GrowthSite {
    pub function: String,
    pub file: String,
    pub line: Option<u32>,
    /// The change of `in_use_bytes` over the interval (in the summary,
    /// since the attach): negative where pools it held were let go.
    pub bytes: i64,
    /// Its samples still held: of pools in use, and of the C library's
    /// heap.
    pub samples: u64,
    /// The bytes its samples stand for: a pool sample `sample_bytes`, a
    /// growth of the C library's heap its bytes (at least
    /// `sample_bytes`).
    pub in_use_bytes: u64,
    /// Of `in_use_bytes`, the C library's heap, and of `samples` its
    /// samples.
    #[serde(default)]
    pub libc_bytes: u64,
    #[serde(default)]
    pub libc_samples: u64,
    /// The 95% confidence interval of `in_use_bytes` (each take sampled
    /// with probability 1/`sample_every`: binomial; each growth of the C
    /// library's heap with probability its bytes / `sample_bytes`).
    pub in_use_ci95: [f64; 2],
}

/// One stack with samples in use.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GrowthStack {
    /// Innermost first.
    pub frames: Vec<SiteFrame>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    pub samples: u64,
    pub in_use_bytes: u64,
}

/// Which of pymalloc's pool takes the growth probes see.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GrowthProbed {
    /// Every take: reuses of emptied pools too (the carve blocks were not
    /// found; and every record written before carves were probed).
    #[default]
    Takes,
    /// The carves of never used pools only (new arenas' first pools
    /// among them): a reuse is neither seen nor counted.
    Carves,
}

impl GrowthProbed {
    /// What one sample is one in, in words: "pool carved" or "pool take".
    #[must_use]
    pub const fn one(self) -> &'static str {
        match self {
            Self::Takes => "pool take",
            Self::Carves => "pool carved",
        }
    }

    /// Whom a pool in use counts for: "carver" or "taker".
    #[must_use]
    pub const fn holder(self) -> &'static str {
        match self {
            Self::Takes => "taker",
            Self::Carves => "carver",
        }
    }
}

/// What the growth probes saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrowthTakes {
    /// Which takes the probes see: with `carves`, `reused` and `no_arena`
    /// are not counted (0), `carved` counts every pool carved (new
    /// arenas' first pools among them), and a sample ends only where its
    /// pool is found empty or gone (`pruned`), or a carve at its address
    /// (its arena freed and another mapped there, `ended`).
    #[serde(default)]
    pub probed: GrowthProbed,
    /// Pools taken: reused (emptied before), carved (never used), and the
    /// first pools of new arenas (with `probed` `carves`, new arenas, whose
    /// first pools `carved` counts).
    pub reused: u64,
    pub carved: u64,
    pub new_arenas: u64,
    /// Calls of pymalloc's slow path that found no usable arena, so mapped
    /// a new one (each then marks one used, unless the map failed).
    pub no_arena: u64,
    /// Takes sampled, and samples ended by a take of their pool.
    pub sampled: u64,
    pub ended: u64,
    /// Samples whose pool was found empty, or gone, on two readings in a
    /// row, and dropped.
    pub pruned: u64,
    /// Misses: a sampled take whose stack could not be walked (charged to
    /// no stack), cut at its depth, or with no room to be kept; a take
    /// whose arena could not be read.
    pub walk_failed: u64,
    pub truncated: u64,
    pub lost: u64,
    pub unread: u64,
    /// The C library's heap: the target's mapping syscalls seen (`mmap`,
    /// `munmap`, `mremap`, `brk`), the growths among them, those sampled,
    /// samples ended by an unmap or a later growth at their address,
    /// samples found no longer held and dropped (since the attach), and
    /// sampled growths with no room to be kept.
    #[serde(default)]
    pub syscalls: u64,
    #[serde(default)]
    pub grown: u64,
    #[serde(default)]
    pub grown_sampled: u64,
    #[serde(default)]
    pub unmapped: u64,
    #[serde(default)]
    pub mapped_pruned: u64,
    #[serde(default)]
    pub grown_lost: u64,
    /// Misses: the target's mapping calls that could not be judged (their
    /// arguments or outcome unread, or an exit whose entry was not kept).
    #[serde(default)]
    pub mapped_missed: u64,
}

/// What growth sampling cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GrowthCost {
    /// Probe hits.
    pub hits: u64,
    /// What a hit costs where the probes sit (calibrated), in ns; `None`
    /// until calibrated.
    pub hit_ns: Option<f64>,
    /// The programs' own running time, measured in the kernel, in s.
    pub programs_s: f64,
    /// The target's CPU time it took: hits priced plus the programs'
    /// time beyond what a hit's price holds; `None` until calibrated.
    pub target_s: Option<f64>,
    /// `target_s` per second of the span (the share of one CPU).
    pub per_s: Option<f64>,
    /// tracer's own CPU time reading the samples' pools and naming their
    /// stacks, and the bytes it read of the target.
    pub tracer_cpu_s: f64,
    pub bytes_read: u64,
}
