//! The output files a run's summary is written to, which `attach` (and
//! `run` and `top`) write at the end of a run and `tracer report` from a
//! record's summary: one declaration, flattened into both, so that the two
//! take the same flags with the same meaning. `report` words some helps its
//! own way (`mut_arg` in cli/mod.rs): it writes from a record, turns
//! nothing on, and has no `--record`.
#![allow(clippy::doc_markdown, reason = "doc comments here are --help text, where backticks would show")]

use std::path::PathBuf;

use clap::Args;

use super::Weight;

/// `--folded`, `--flamegraph`, `--weight`, `--growth-folded`,
/// `--growth-flamegraph`, `--pprof` and `--force`.
#[derive(Clone, Debug, Default, Args)]
pub struct OutputFiles {
    /// At the end, write the stacks in folded form (the input of flamegraph.pl and inferno) to FILE,
    /// weighted as --weight says (turns on --stacks). FILE must not exist unless --force.
    #[arg(long, value_name = "FILE")]
    pub folded: Option<PathBuf>,
    /// At the end, write a flame graph of the stacks as an SVG to FILE (turns on --stacks). FILE
    /// must not exist unless --force.
    #[arg(long, value_name = "FILE")]
    pub flamegraph: Option<PathBuf>,
    /// What --folded and --flamegraph weigh: calls or bytes (default calls).
    #[arg(long, value_name = "WHAT", value_enum, hide_possible_values = true)]
    pub weight: Option<Weight>,
    /// At the end, write the growth stacks in folded form (weighted by the bytes of the pools they
    /// hold) to FILE (turns on --growth). FILE must not exist unless --force.
    #[arg(long, value_name = "FILE")]
    pub growth_folded: Option<PathBuf>,
    /// At the end, write a flame graph of the growth stacks as an SVG to FILE (turns on --growth).
    /// FILE must not exist unless --force.
    #[arg(long, value_name = "FILE")]
    pub growth_flamegraph: Option<PathBuf>,
    /// At the end, write a pprof profile (gzipped profile.proto) to FILE, for go tool pprof,
    /// speedscope or Pyroscope: --stacks' events as alloc_objects and alloc_space (exact), growth's
    /// stacks as inuse_objects and inuse_space (a sampled estimate). Needs --stacks (exact) or
    /// growth (the profile's default with --pid, or --growth). FILE must not exist unless --force.
    #[arg(long, value_name = "FILE")]
    pub pprof: Option<PathBuf>,
    /// Let the output files (--folded, --flamegraph, --growth-folded, --growth-flamegraph, --pprof,
    /// --record, and run's --output) overwrite an existing file (never through a symlink).
    #[arg(long)]
    pub force: bool,
}

impl OutputFiles {
    /// The folded stacks' and the flame graph's weight: calls unless told.
    #[must_use]
    pub fn weight(&self) -> Weight {
        self.weight.unwrap_or(Weight::Calls)
    }
}
