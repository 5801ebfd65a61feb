//! `--stacks` and the flags that go with it.

use super::ConfigError;
use crate::{
    cli::{AttachArgs, Weight},
    probe::ProbeSelection,
};

/// Which events get Python stacks, and what is made of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StacksConfig {
    /// The probes whose events get stacks (`--stacks EVENTS`).
    pub events: ProbeSelection,
    /// `--depth`: frames walked at most.
    pub depth: u32,
    /// `--sample N`: one event in N gets a stack (1: all).
    pub sample: u64,
    /// `--top N`: sites listed.
    pub top: usize,
    /// `--folded FILE`.
    pub folded: Option<crate::report::files::OutputFile>,
    /// `--flamegraph FILE`.
    pub flamegraph: Option<crate::report::files::OutputFile>,
    /// `--weight`: what folded stacks and flame graphs weigh.
    pub weight: Weight,
    /// `--native-stacks`: unwind the native stack of each event too.
    pub native: bool,
}

/// The deepest `--depth`.
#[allow(clippy::cast_possible_truncation, reason = "128")]
pub const MAX_DEPTH: u32 = tracer_common::stack::MAX_DEPTH as u32;
/// The default `--top`.
pub const DEFAULT_TOP: usize = 10;

/// `--stacks` and the flags that go with it; any of `--top`, `--folded`,
/// `--flamegraph` turns stacks on for the allocating functions.
pub(super) fn stacks_config(args: &AttachArgs) -> Result<Option<StacksConfig>, ConfigError> {
    let wanted = args.stacks.is_some()
        || args.top.is_some()
        || args.files.folded.is_some()
        || args.files.flamegraph.is_some()
        || args.native_stacks;
    if !wanted {
        for (flag, given) in [
            ("--depth", args.depth.is_some()),
            ("--sample", args.sample.is_some()),
            ("--weight", args.files.weight.is_some()),
        ] {
            if given {
                return Err(ConfigError::WithoutStacks { flag });
            }
        }
        return Ok(None);
    }
    let events = args.stacks.clone().unwrap_or(ProbeSelection::Alloc);
    let depth = args.depth.unwrap_or(tracer_common::stack::DEFAULT_DEPTH);
    if !(1..=MAX_DEPTH).contains(&depth) {
        return Err(ConfigError::BadDepth { value: depth });
    }
    let sample = args.sample.unwrap_or(1);
    if sample == 0 {
        return Err(ConfigError::SampleZero);
    }
    // 0 is refused as it is parsed (`cli::count`).
    let top = args.top.unwrap_or(DEFAULT_TOP);
    let weight = args.files.weight();
    let file = |flag, path: Option<&std::path::Path>| {
        path.map(|p| crate::report::files::OutputFile::check(flag, p, args.files.force)).transpose()
    };
    let folded = file("--folded", args.files.folded.as_deref())?;
    let flamegraph = file("--flamegraph", args.files.flamegraph.as_deref())?;
    if let (Some(a), Some(b)) = (&folded, &flamegraph)
        && a.path == b.path
    {
        return Err(ConfigError::SameOutput { path: a.path.clone() });
    }
    Ok(Some(StacksConfig { events, depth, sample, top, folded, flamegraph, weight, native: args.native_stacks }))
}
