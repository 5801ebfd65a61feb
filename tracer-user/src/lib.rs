//! tracer's userspace: the command line ([`cli`], checked by [`config`]),
//! find the CPython image in a live process ([`discover`]), plan where each
//! probe goes ([`plan`]), both once per command ([`prepare`]), load and
//! attach the BPF programs ([`kernel`]), run until the end ([`run`]; with
//! `tracer run`, of a program it starts, [`launch`]), and
//! report what was counted ([`model`], [`report`]); read Python stacks from
//! outside ([`stacks`]).

pub mod bench;
pub mod capabilities;
pub mod cli;
pub mod config;
pub mod discover;
pub mod error;
pub mod fleet;
pub mod hash;
pub mod heap;
pub mod kernel;
pub mod launch;
pub mod model;
pub mod plan;
pub mod prepare;
pub mod privileges;
pub mod probe;
pub mod python;
pub mod report;
pub mod run;
pub mod stacks;
pub mod text;
pub mod unwind;

/// The BPF object built from `tracer-ebpf` by build.rs (empty when built
/// with `TRACER_EMPTY_BPF=1`, for checking and linting without the BPF
/// toolchain; such a tracer refuses to attach).
pub static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer.bpf.o"));

/// The bench object: [`BPF_OBJECT`]'s programs and the bench-only ones
/// (`tracer-ebpf`'s `bench` feature), which a plan that attaches one of
/// those loads instead (see [`probe::Program::bench_only`]); empty as
/// [`BPF_OBJECT`] is.
pub static BENCH_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer-bench.bpf.o"));
