//! The model of live memory (`--live`) and leak candidates (`--leaks`).

use serde::{Deserialize, Serialize};

/// With `--live`: the blocks outstanding now, per allocator domain, as
/// the live table holds them. Levels, not rates: an interval gives them at
/// its end.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Live {
    pub object: LiveDomain,
    pub mem: LiveDomain,
    pub raw: LiveDomain,
    /// With `--native`: libc's allocator, the blocks the process asks of
    /// libc outside any other allocator call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native: Option<LiveDomain>,
    /// The table's room (`--live-max`).
    pub capacity: u32,
    /// Blocks the table had no room for, over every domain: not counted
    /// live, and their frees are counted as untracked.
    pub dropped: u64,
    /// What the figures cannot know.
    pub unknown: String,
    /// Where the table does not see every block, why (the coverage of each
    /// probe says which); left out when it sees them all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<String>,
}

/// One domain's outstanding blocks and what the table did for it since
/// the attach.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveDomain {
    /// Blocks outstanding now (allocated since the attach).
    pub count: i64,
    /// Their requested bytes.
    pub bytes: i64,
    /// Blocks put in the table.
    pub allocations: u64,
    /// Blocks a free (or a realloc that moved them) took out.
    pub frees: u64,
    /// Frees (and reallocs) of addresses not in the table: allocated
    /// before the attach, or dropped when the table was full.
    pub untracked_frees: u64,
    /// Blocks the table had no room for.
    pub dropped: u64,
    /// Allocations at inlined copies, whose returned pointer is not read:
    /// not in the table.
    pub unseen_allocations: u64,
    /// Frees at inlined copies, whose pointer is not read: a block they
    /// free stays in the table.
    pub unseen_frees: u64,
    /// Inner calls of another family on a block an outer call handed out
    /// or took back (a large `PyObject_Malloc` is a `PyMem_RawMalloc`
    /// block): the block counts once, in the outer call's domain.
    pub nested: u64,
}

/// With `--leaks`, in the summary: the oldest blocks still outstanding at
/// the end.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Leaks {
    /// Only blocks at least this old (`--older`), in seconds.
    pub older_than_s: f64,
    /// How many blocks are that old, and their bytes.
    pub count: u64,
    pub bytes: u64,
    /// The oldest of them, oldest first, `--leaks N` of them.
    pub oldest: Vec<Leak>,
    /// What the blocks' sites are, or why none is given.
    pub sites: String,
}

/// One outstanding block.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Leak {
    pub pid: u32,
    /// Its address in the process.
    pub address: u64,
    /// Its requested size.
    pub size: u64,
    /// `object`, `mem`, `raw` or `native`.
    pub domain: String,
    /// The function that allocated it.
    pub function: String,
    /// Seconds since it was allocated, at the end.
    pub age_s: f64,
    /// With `--stacks`: the Python stack it was allocated on, innermost
    /// frame first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<Vec<super::stacks::SiteFrame>>,
    /// Whether that stack was cut at `--depth`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stack_truncated: bool,
    /// With `--stacks`, where it has no stack: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_stack: Option<String>,
}
