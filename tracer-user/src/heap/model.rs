//! One census as it is reported: `tracer heap --json` prints a [`Census`],
//! the table is drawn from it, and `tracer attach`'s production profile
//! will carry its `types` with [`diff`]'s changes. Fields are only ever
//! added.

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

/// The heap of one process by type.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Census {
    pub pid: u32,
    /// The interpreter's version.
    pub python: String,
    /// Its image, as the process's maps name it.
    pub image: String,
    /// Whether the target was stopped while it was read (`--stop`): its
    /// pools are then read exactly (what lies outside them is partial in
    /// every census, as `partial` says); a census of a running target is
    /// an estimate: objects made and freed while it reads are seen or
    /// missed.
    pub exact: bool,
    /// How long the target was stopped, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_ms: Option<f64>,
    /// Every type with a live object, most bytes first.
    pub types: Vec<TypeRow>,
    #[serde(flatten)]
    pub totals: Totals,
    /// What the census could not cover, and why; empty when it covered
    /// everything it looks at.
    pub partial: Vec<String>,
    pub cost: Cost,
}

/// The census's figures besides its types, which the production
/// profile's heap (`crate::model::heap::Heap`) reports as they are.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    pub pymalloc: Pymalloc,
    pub outside: Outside,
    /// The target's resident set size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss: Option<u64>,
    /// Bytes the census accounts for: pymalloc's pools (used and empty),
    /// objects outside them, and the item arrays, dict tables and buffers
    /// outside them.
    pub accounted: u64,
    /// `rss` minus `accounted`: the interpreter's own structures, code,
    /// the C library's heap outside objects (sets' tables, split dicts'
    /// values), stacks, extension modules' memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unaccounted: Option<i64>,
    /// Candidates refused, by reason (see the docs), with a count.
    pub rejected: IndexMap<String, u64>,
}

/// One type's live objects.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypeRow {
    /// As `repr(type)` shows it, without the quotes: `module.qualname` for
    /// a class defined in Python, `tp_name` for a built-in type.
    pub name: String,
    /// Objects.
    pub count: u64,
    /// Their blocks in pymalloc's pools, their sizes outside them, and
    /// their item arrays, tables and buffers outside the pools (lists,
    /// dicts, bytearrays).
    pub bytes: u64,
    /// Of `count`, the objects outside pymalloc's pools.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub outside: u64,
}

#[allow(clippy::trivially_copy_pass_by_ref, reason = "serde's skip_serializing_if passes a reference")]
const fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// pymalloc's totals, as the scan of the pools found them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pymalloc {
    /// Arenas with at least one pool found.
    pub arenas: u64,
    /// Its pools and blocks, all size classes together.
    #[serde(flatten)]
    pub blocks: Blocks,
    /// Pools that changed while they were read, twice: their blocks were
    /// judged one by one, without the pool's free list, and `blocks` counts
    /// their free ones too.
    pub pools_changed: u64,
    /// Per size class with a pool.
    pub size_classes: Vec<SizeClass>,
    /// pymalloc's own arena table, where tracer found it: a check of the
    /// scan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arena_table: Option<ArenaCheck>,
}

/// One size class.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeClass {
    /// Its block size.
    pub size: u64,
    #[serde(flatten)]
    pub blocks: Blocks,
}

/// Pools and blocks, of one size class (as the scan counts them) or of
/// all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocks {
    /// Pools with at least one block allocated.
    pub pools: u64,
    /// Pools with none, kept in their arena for reuse.
    pub empty_pools: u64,
    /// Blocks allocated: `objects + free_listed + other`.
    pub blocks: u64,
    /// Blocks holding a live object.
    pub objects: u64,
    /// Blocks holding an object kept on one of the interpreter's free lists.
    pub free_listed: u64,
    /// Blocks holding no object: item arrays, dict tables, buffers.
    pub other: u64,
    /// Bytes of the blocks free in the pools in use.
    pub free_bytes: u64,
}

impl std::ops::AddAssign for Blocks {
    fn add_assign(&mut self, other: Self) {
        self.pools += other.pools;
        self.empty_pools += other.empty_pools;
        self.blocks += other.blocks;
        self.objects += other.objects;
        self.free_listed += other.free_listed;
        self.other += other.other;
        self.free_bytes += other.free_bytes;
    }
}

/// The scan against pymalloc's arena table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArenaCheck {
    /// Arenas the table lists.
    pub arenas: u64,
    /// Pools they have carved.
    pub pools: u64,
    /// Of them, pools the scan found, with the same arena index.
    pub found: u64,
    /// Pools the scan found that no arena of the table holds.
    pub not_in_table: u64,
    /// Blocks `PyObject_Malloc` passed to the C library, still allocated
    /// (`raw_allocated_blocks`): `sys.getallocatedblocks()` is this plus
    /// the pools' allocated blocks.
    pub raw_allocated_blocks: i64,
}

/// Objects outside pymalloc's pools.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outside {
    pub objects: u64,
    pub bytes: u64,
    /// Of them, found on the collector's lists.
    pub gc_objects: u64,
    /// Of them, found as items of tuples and lists, and keys and values of
    /// dicts.
    pub referenced: u64,
    /// Lists' item arrays, dicts' tables and bytearrays' buffers outside
    /// the pools (each charged to its owner's type).
    pub buffer_bytes: u64,
    /// Items of item arrays and entries of dict tables read.
    pub items_read: u64,
    /// The census's limits reached, by name (`gc_objects`, `items`,
    /// `referenced`, `rounds`): objects outside the pools past them are
    /// left out, and a note says so. Empty (and absent) when none was.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cut: Vec<String>,
}

/// What the census cost.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    /// From the start of the reading to its end, in milliseconds.
    pub elapsed_ms: f64,
    /// Bytes read from the target.
    pub bytes_read: u64,
    /// System calls that read them.
    pub reads: u64,
    /// Type objects read.
    pub types_read: u64,
    /// Ranges that could not be read (unmapped, or never mapped: a
    /// candidate's guess at an address); what each skip meant is in
    /// `rejected` and `partial`.
    #[serde(default)]
    pub failed_reads: u64,
}

/// A type's objects now and their change since a previous census.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypeChange {
    pub name: String,
    pub count: u64,
    pub bytes: u64,
    pub count_change: i64,
    pub bytes_change: i64,
}

/// What changed per type from `previous` to `current` (two censuses of one
/// process): every type in either, the one that grew most in bytes first.
#[must_use]
pub fn diff(previous: &Census, current: &Census) -> Vec<TypeChange> {
    let before: IndexMap<&str, &TypeRow> = previous.types.iter().map(|t| (t.name.as_str(), t)).collect();
    let change = |now: u64, then: u64| i64::try_from(i128::from(now) - i128::from(then)).unwrap_or(i64::MAX);
    let mut out: Vec<TypeChange> = current
        .types
        .iter()
        .map(|t| {
            let (count, bytes) = before.get(t.name.as_str()).map_or((0, 0), |p| (p.count, p.bytes));
            TypeChange {
                name: t.name.clone(),
                count: t.count,
                bytes: t.bytes,
                count_change: change(t.count, count),
                bytes_change: change(t.bytes, bytes),
            }
        })
        .collect();
    let now: std::collections::HashSet<&str> = current.types.iter().map(|t| t.name.as_str()).collect();
    out.extend(previous.types.iter().filter(|t| !now.contains(t.name.as_str())).map(|t| TypeChange {
        name: t.name.clone(),
        count: 0,
        bytes: 0,
        count_change: change(0, t.count),
        bytes_change: change(0, t.bytes),
    }));
    out.sort_by(|a, b| b.bytes_change.cmp(&a.bytes_change).then_with(|| a.name.cmp(&b.name)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn census(types: &[(&str, u64, u64)]) -> Census {
        Census {
            pid: 1,
            python: "3.11.7".into(),
            image: "python".into(),
            exact: true,
            stopped_ms: None,
            types: types.iter().map(|&(n, c, b)| TypeRow { name: n.into(), count: c, bytes: b, outside: 0 }).collect(),
            totals: Totals::default(),
            partial: Vec::new(),
            cost: Cost::default(),
        }
    }

    #[test]
    fn the_diff_puts_what_grew_first_and_keeps_what_went() {
        let before = census(&[("dict", 10, 1000), ("float", 5, 120), ("gone", 2, 64)]);
        let after = census(&[("float", 50_005, 1_600_120), ("dict", 9, 900), ("new", 1, 32)]);
        let d = diff(&before, &after);
        let rows: Vec<(&str, i64, i64)> = d.iter().map(|c| (c.name.as_str(), c.count_change, c.bytes_change)).collect();
        assert_eq!(rows, [("float", 50_000, 1_600_000), ("new", 1, 32), ("gone", -2, -64), ("dict", -1, -100)]);
        assert_eq!((d[0].count, d[0].bytes), (50_005, 1_600_120));
    }
}
