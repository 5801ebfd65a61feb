//! tracer's userspace: find the CPython image in a live process, attach the
//! BPF uprobes, read the per-CPU counters and report them.

pub mod bench;
pub mod budget;
pub mod calibrate;
pub mod callsites;
pub mod config;
pub mod elf;
pub mod error;
pub mod interpreter;
pub mod multi;
pub mod output;
pub mod placement;
pub mod privileges;
pub mod probes;
pub mod process;
pub mod python;
pub mod returns;
pub mod run;
pub mod session;

/// The BPF object built from `tracer-ebpf` by build.rs.
pub static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer.bpf.o"));
