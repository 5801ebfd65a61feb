//! tracer's BPF side.
//!
//! The programs ([`programs`]) serve every probed function of CPython (and
//! libc's allocator, with `--native`): the loader attaches the same
//! program to many functions and passes each one's slot (or an inlined
//! copy's operands) as the BPF cookie. Each program decodes its hit into
//! an event, and one pipeline ([`pipeline`]) takes every event through
//! the steps: count ([`count`]: calls and bytes per probe, one map lookup
//! and two atomic adds), sizes ([`sizes`]), types ([`types`], with
//! `--types`), stacks ([`stacks`], [`unwind`], with `--stacks`) and live
//! ([`live`], with `--live`), each switched off as dead code to the
//! verifier. Nothing is sent to userspace per event. Dependencies go one
//! way: programs, then the pipeline, then the steps and their maps. The
//! GC programs ([`gc`]) are a chain of their own, and so are the growth
//! programs ([`growth`], and [`mapped`] for the C library's heap), which
//! walk stacks with the stacks step's walk.
//!
//! With `--bpf-log`, the programs also log each probe's first hit in each
//! process and every miss, through aya-log. Its level global is 0 unless
//! that flag is given, which makes every log statement code the verifier
//! proves dead, so logging costs nothing while off.
//!
//! The `bench` feature adds the bench-only programs ([`experiment`]) to a
//! second object, which only `tracer bench` loads.
#![no_std]
#![no_main]
// Inline asm is how a BPF program gets an atomic add: core has no atomic
// read-modify-write for this target.
#![feature(asm_experimental_arch)]

// Decoding a hit: the cookie, the arguments, an inlined copy's operands.
mod args;
// What every program needs: the target check, misses, the atomic add.
mod common;
// The count step.
mod count;
// Bench-only programs (`meta_insert`, `meta_lookup`, `meta_pool`,
// `meta_chunk`): the allocator-metadata experiment.
#[cfg(feature = "bench")]
mod experiment;
// The GC programs (`gc_start`, `gc_done`): collections per generation, from
// CPython's markers or its collection function.
mod gc;
// The growth programs (`growth_take`, `growth_arena`): pymalloc's pools
// charged to the Python stack that took them, sampled.
mod growth;
// Hits per probed address, for the budget's windows' order.
mod heat;
// The live step (`--live`).
mod live;
// The C library's heap growth (`growth_mmap_enter`, `growth_mmap_exit`,
// `growth_munmap_enter`, `growth_mremap_enter`, `growth_mremap_exit`,
// `growth_brk_exit`): programs on the mapping syscalls' tracepoints.
mod mapped;
// With `--native`, the marks of libc calls made inside another.
mod nested;
// The event pipeline.
mod pipeline;
// Every program but the GC's and the bench's.
mod programs;
// The returns step (`--returns`).
mod returns;
// What the growth programs share: counts, running time, the walk.
mod sampled;
// The sizes step.
mod sizes;
// The stacks step (`--stacks`).
mod stacks;
// The types step (`--types`).
mod types;
// The native half of the stacks step (`--native-stacks`).
mod unwind;

/// [`tracer_common::LICENSE`], as the array the `license` section holds.
const fn license() -> [u8; tracer_common::LICENSE.len()] {
    let mut out = [0u8; tracer_common::LICENSE.len()];
    let mut i = 0;
    while i < out.len() {
        out[i] = tracer_common::LICENSE[i];
        i += 1;
    }
    out
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; tracer_common::LICENSE.len()] = license();

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // No code path here can panic (no unwrap, no indexing); the verifier
    // would reject a program that could reach this loop.
    loop {}
}
