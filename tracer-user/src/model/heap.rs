//! The heap by type as the production profile reports it each interval and
//! in the summary: `tracer heap`'s census ([`crate::heap::model::Census`]),
//! each type with its change since an earlier census, bounded.

use serde::{Deserialize, Serialize};

pub use crate::heap::model::{Outside, Pymalloc, Totals};

/// The latest census of the run, and what changed since an earlier one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Heap {
    /// The census's number in the run, from 1. An interval with no new
    /// census (one still running, or spaced out: `every`) repeats the
    /// latest, with the same number.
    pub census: u64,
    /// When it began, in seconds since the attach.
    pub taken_s: f64,
    /// When the census the changes are from began: the one before in an
    /// interval, the run's first in the summary. Left out for the run's
    /// first census, which has no changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_s: Option<f64>,
    /// A census is started every this many intervals: 1, or more where one
    /// took over half an interval (a note says so).
    pub every: u32,
    /// The types with the most bytes (at most [`TOP_TYPES`]), and the
    /// others among the [`TOP_GROWING`] that grew most in bytes; most
    /// bytes first.
    pub types: Vec<HeapType>,
    /// Every other type, summed; left out when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other: Option<OtherTypes>,
    /// pymalloc's and the outside objects' figures, the resident set,
    /// what the census accounts for and the candidates it refused, as
    /// `tracer heap` reports them.
    #[serde(flatten)]
    pub totals: Totals,
    /// What the census could not cover, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partial: Vec<String>,
    pub cost: HeapCost,
}

/// The most types [`Heap::types`] lists by bytes.
pub const TOP_TYPES: usize = 200;
/// The fastest-growing types [`Heap::types`] lists besides.
pub const TOP_GROWING: usize = 20;

/// One type's live objects, and their change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeapType {
    /// As `repr(type)` shows it, without the quotes.
    pub name: String,
    /// Objects.
    pub count: u64,
    /// Their bytes (`tracer heap`'s `bytes`).
    pub bytes: u64,
    /// `count` less the count of the census in `since_s` (a type that went
    /// is listed with a `count` of 0); left out without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count_change: Option<i64>,
    /// The same for `bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_change: Option<i64>,
}

/// The types [`Heap::types`] leaves out, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OtherTypes {
    pub types: u64,
    pub count: u64,
    pub bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count_change: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_change: Option<i64>,
}

/// What the census cost tracer (none of it the target's CPU time).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HeapCost {
    /// From the start of the reading to its end.
    pub elapsed_ms: f64,
    /// tracer's CPU time for it.
    pub cpu_ms: f64,
    /// Bytes of the target's memory read.
    pub bytes_read: u64,
    /// The system calls that read them.
    pub reads: u64,
}
