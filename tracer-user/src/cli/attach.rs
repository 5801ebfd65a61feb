//! `tracer attach`'s flags, which `run` and `top` take too: [`AttachArgs`],
//! and the closed set only it has ([`LinkMode`]).
#![allow(clippy::doc_markdown, reason = "doc comments here are --help text, where backticks would show")]

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use super::{
    DEFAULT_INTERVAL_S, OutputFiles, TargetArgs,
    values::{count, listen_addr, stack_events},
};
use crate::probe::ProbeSelection;

/// `tracer attach`.
#[derive(Clone, Debug, Parser)]
#[allow(clippy::struct_excessive_bools, reason = "one field per on/off command-line flag, as clap gives them")]
pub struct AttachArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Trace every CPython process on the host, those running and those started later, in any
    /// chroot or PID namespace: one `attach --exe` per interpreter image, summed, with each
    /// process's host PID, namespace PID, container (cgroup) and command line. Takes the flags
    /// that count, cost and collect (--exact, --budget, --probes, --placement, --gc, --links,
    /// --no-inlined, --debug-dir, --bpf-log, --no-growth, --interval, --duration, --json; --force
    /// too, with no file to overwrite) and refuses the others; see docs/attach.md.
    #[arg(long, group = "target")]
    pub all: bool,
    /// Stop after this many seconds (default: until Ctrl-C, SIGTERM or the target exits).
    #[arg(long, short = 'd', value_name = "SECONDS", allow_negative_numbers = true)]
    pub duration: Option<f64>,
    /// Seconds between reports.
    #[arg(long, short = 'i', value_name = "SECONDS", default_value_t = DEFAULT_INTERVAL_S, allow_negative_numbers = true)]
    pub interval: f64,
    /// Write JSON Lines (attached, interval, note, summary) instead of a table; see docs/json.md for the schema.
    #[arg(long)]
    pub json: bool,
    /// Trace every event, as tracer did before the production profile: exact counts of every
    /// probed call, at the cost the first line states: allocation-heavy code runs tens to hundreds
    /// of times slower (BENCHMARKS.md). Without it (and without any flag only exact tracing
    /// serves: --types, --live, --live-max, --leaks, --older, --returns, --stacks and its flags,
    /// --native, --placement call-sites), the run is the production
    /// profile: GC from memory, the heap by type and rates by duty cycle within --budget (default 1%).
    #[arg(long)]
    pub exact: bool,
    /// Keep tracer's cost within PERCENT (0.01 to 100) of the target's CPU time. In the production
    /// profile (the default) this bounds all its sources together (default 1), and a run that went
    /// over says by what (a short run pays for its first window and census). With exact tracing: trace in short
    /// windows and detach between them for as long as the budget needs (the cost of a hit is
    /// calibrated at start); counts are then of the traced windows only, and rates are estimates
    /// with a 95% confidence interval, marked as such in the table and the JSON. Not with --types,
    /// --stacks, --live, --native, --returns or --placement call-sites.
    #[arg(long, value_name = "PERCENT", allow_negative_numbers = true)]
    pub budget: Option<f64>,
    /// How probes attach: auto (uprobe-multi links where the kernel has them, Linux 6.6+, else one
    /// perf-event uprobe per probe), multi, or perf. Multi links detach all at once; perf-event
    /// uprobes detach about 0.13 s apart each.
    #[arg(long, value_name = "HOW", value_enum, default_value_t = LinkMode::Auto, hide_possible_values = true)]
    pub links: LinkMode,
    /// Also read what each allocating function returns (the new pointer): counts of returns and of
    /// NULL returns. A probe on every `ret` of a function that always returns through one, else a
    /// uretprobe; `tracer probes --returns` shows which. Costs each allocating call a return probe
    /// (about 15 µs a call on pyenv 3.11 where measured: BENCHMARKS.md).
    #[arg(long)]
    pub returns: bool,
    /// Also count the objects each new reference creates by their type (`tp_name`), read at
    /// `_Py_NewReference` (on 3.12+ also `_Py_NewReferenceNoTotal`, which the free lists call):
    /// top types in the table, every type in the JSON's `types`. Each new reference then costs one
    /// read of the target's memory and one map update more (6.7-7.2 µs each where measured:
    /// BENCHMARKS.md). Not with --budget.
    #[arg(long)]
    pub types: bool,
    /// Track live memory: every block the allocator functions hand out since the attach, by address,
    /// in a kernel table, until it is freed. Each interval gives the blocks outstanding and their
    /// bytes per domain (object, mem, raw), in the table and the JSON's `live`. Reads each returned
    /// pointer at the allocator's implementations (calibrating first, as --returns does, whose
    /// probes on the API functions it does not need). Blocks allocated before the attach are unknown (their
    /// frees are counted as untracked). Adds 0.65-4.5 µs to each allocator call, by build (where
    /// measured: BENCHMARKS.md). Not with --budget or --exe.
    #[arg(long)]
    pub live: bool,
    /// The live table's room, in blocks (default 262144; turns on --live). A block that finds it
    /// full is counted as dropped, never as live, and tracer keeps running.
    #[arg(long, value_name = "BLOCKS", allow_negative_numbers = true)]
    pub live_max: Option<u32>,
    /// At the end, list the N oldest blocks still outstanding, with address, size, domain, function
    /// and age (default 20; turns on --live).
    #[arg(
        long,
        value_name = "N",
        num_args = 0..=1,
        default_missing_value = "20",
        allow_negative_numbers = true,
        value_parser = count("--leaks", "block", 20)
    )]
    pub leaks: Option<usize>,
    /// With --leaks: only blocks at least SECONDS old at the end (turns on --leaks).
    #[arg(long, value_name = "SECONDS", allow_hyphen_values = true)]
    pub older: Option<f64>,
    /// Record the Python stack of each event of EVENTS: `alloc` (the allocating functions; the
    /// default when the flag is given alone), `refs`, `default`, or function names. The kernel
    /// walks the current thread's frames and counts calls and bytes per stack; the table and the
    /// JSON list the top allocation sites (see --top). Each walk adds about 1-2 µs to its event
    /// (where measured: BENCHMARKS.md; --sample N walks one event in N). Not with --budget.
    #[arg(long, value_name = "EVENTS", num_args = 0..=1, default_missing_value = "", value_parser = stack_events)]
    pub stacks: Option<ProbeSelection>,
    /// With stacks: the most Python frames walked per event (1-128, default 64); a deeper stack is
    /// cut there and counted as truncated.
    #[arg(long, value_name = "FRAMES", allow_negative_numbers = true)]
    pub depth: Option<u32>,
    /// With stacks: record each event's stack with probability 1/N (drawn at random) and scale
    /// the counts by N, labelled as estimates; the per-function counts stay exact (default 1: every
    /// event).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub sample: Option<u64>,
    /// List the N allocation sites (innermost Python frame) with the most calls, in the table and
    /// the JSON's `sites` (default 10; turns on --stacks).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = count("--top", "site", 10))]
    pub top: Option<usize>,
    /// With stacks, also unwind each event's native (C) stack in the kernel, from the modules'
    /// .eh_frame unwind tables (no frame pointers needed; at most 64 frames), and name its frames
    /// from ELF symbols and DWARF (inlined functions too). Folded stacks and flame graphs then
    /// show the process's native root at the bottom, the Python frames where the eval loop runs
    /// them, and the native callers of the probe on top (turns on --stacks). Both walks together
    /// cost 5.7-8.9 µs an event (where measured: BENCHMARKS.md).
    #[arg(long)]
    pub native_stacks: bool,
    /// Pass on what the BPF programs log (each probe's first hit per process, and every miss, with its
    /// cause), as notes on stderr and in the JSON: for when a probe seems to misbehave. Off by default,
    /// and then free: the logging code is dead to the kernel's verifier.
    #[arg(long)]
    pub bpf_log: bool,
    /// Sample heap growth by Python stack, and keep sampling whatever it costs: each pool pymalloc
    /// takes from empty (its slow path, allocate_from_new_pool) ends that pool's old sample, and one
    /// take in 32 records the taking Python stack. Each interval gives, per site, the pools still in
    /// use that its stacks took (a sampled estimate, with its 95% interval) and their change: its
    /// growth: a pool counts for the code holding it now. Each take is a probe hit: a churny target
    /// (tens of thousands of takes a second) pays 2 to 19% of its CPU time, shown in the output
    /// (growth's cost, and the profile's `growth` source). The production profile with --pid
    /// samples growth without this flag too, probing only the carves of never used pools (a pool
    /// counts for the code that grew pymalloc's footprint), and stops once it costs more than half
    /// of --budget; in exact mode only this flag turns it on. With
    /// --pid only. Needs pymalloc's slow path in a symbol table: the image's, or its debug file's
    /// (e.g. python3.11-dbg); where there is none, the output says growth is unavailable and why.
    #[arg(long)]
    pub growth: bool,
    /// Leave heap growth sampling off in the production profile, which otherwise samples it with
    /// --pid (and stops it if it costs more than half of --budget): for a target where every
    /// fraction of a percent counts. Cannot be combined with --growth or its outputs.
    #[arg(long)]
    pub no_growth: bool,
    // The files written at the end (--folded, --flamegraph, --weight, --growth-folded,
    // --growth-flamegraph, --pprof, --force), as `tracer report` writes them.
    #[command(flatten)]
    pub files: OutputFiles,
    /// Serve Prometheus metrics at http://[ADDR:]PORT/metrics while attached: calls and bytes
    /// per function (or the profile's estimated rates), the heap by type, collections per
    /// generation, growth sites and tracer's own cost, labelled by pid and container. A bare PORT
    /// listens on 127.0.0.1 only; another address only when given. See docs/prometheus.md.
    #[arg(long, value_name = "[ADDR:]PORT", value_parser = listen_addr)]
    pub listen: Option<std::net::SocketAddr>,
    /// Also write every event (the attach, each interval, the notes, the summary) to FILE as JSON
    /// Lines, whatever stdout shows: `tracer report FILE` turns it later into the table, JSON,
    /// folded stacks, a flame graph, pprof or a heap diff, without the target. See docs/report.md.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
}

/// How probes are attached in the kernel (`--links`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LinkMode {
    /// uprobe-multi links where the kernel has them, else perf-event
    /// uprobes.
    #[default]
    Auto,
    /// uprobe-multi links (Linux 6.6+): one per BPF program, detached at
    /// once (see the kernel module's `multi`).
    Multi,
    /// One perf-event uprobe per probe, as aya attaches them.
    Perf,
}
