//! The `elf` fuzz target: see [`tracer_fuzz::elf`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tracer_fuzz::elf(data));
