//! With `--stacks` and `--native-stacks`: the allocation sites, the stacks
//! seen with their counts, the modules the native unwinder read, and how
//! much of the events the stacks cover.

use serde::{Deserialize, Serialize};

/// One Python frame of a stack, as its code says.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteFrame {
    /// The code's qualified name (`Class.method`), or what could be read.
    pub function: String,
    pub file: String,
    /// `None` where the line table has no line for the instruction.
    pub line: Option<u32>,
}

/// An allocation site: the innermost Python frame of the stacks its
/// events had, with their counts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Site {
    pub function: String,
    pub file: String,
    pub line: Option<u32>,
    pub calls: u64,
    pub bytes: u64,
    /// With `--sample N`: the counts are the sampled ones times N.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimate: bool,
    /// With `--sample N`: the 95% confidence interval of `calls` (each
    /// event sampled with probability 1/N: binomial).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls_ci95: Option<[f64; 2]>,
}

/// One stack and its counts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StackCount {
    /// The probed function the events were of.
    pub probe: String,
    /// Innermost first.
    pub frames: Vec<SiteFrame>,
    /// The walk stopped at `--depth` with frames left.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// With `--native-stacks`: the native frames, innermost first (the
    /// probed instruction's function, with what is inlined there, then
    /// each caller), as unwound in the kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native: Option<Vec<NativeFrame>>,
    /// With `--native-stacks`, where the frames show it (3.12+, whose
    /// C-stack entry frames mark each call of the eval loop): how many of
    /// `frames`, innermost first, each C-level call of the eval loop runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_calls: Option<Vec<u32>>,
    /// With `--native-stacks`: why the native unwind ended before the
    /// process's outermost frame, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native_end: Option<String>,
    pub calls: u64,
    pub bytes: u64,
}

/// A native (C) frame.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeFrame {
    /// The function, from the ELF symbols or the DWARF, or the address.
    pub function: String,
    /// The file name of the module (`python3.14`, `libc.so.6`).
    pub module: String,
    /// The source file and line, where DWARF gives them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// Inlined into the frame after it (its caller at the same pc).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inlined: bool,
}

/// With `--native-stacks`: what one module gave the unwinder.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeModule {
    pub path: String,
    /// Unwind rows from its `.eh_frame` (0: none, and native stacks stop
    /// in it).
    pub rows: u64,
    /// Rows whose rule the unwinder does not follow.
    pub unsupported_rows: u64,
    /// The file its DWARF was read from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dwarf: Option<String>,
    /// Why it has no rows, or no DWARF.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// How many of the events that should have stacks have them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StackCoverage {
    /// `--sample N` (1: every event).
    pub sample: u64,
    /// Events of the probes with stacks (exact).
    pub events: u64,
    /// Events counted under a stack (times `sample`, an estimate when it is
    /// over 1).
    pub stacked: u64,
    /// Events whose stack was cut at `--depth` (counted under the cut
    /// stack; as `stacked`, times `sample`).
    pub truncated: u64,
    /// Whether `stacked` and `truncated` are estimates (`sample` over 1).
    /// Why an event has no stack is in `stats` (`stack_*`).
    pub estimate: bool,
}
