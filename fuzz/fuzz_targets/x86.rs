//! The `x86` fuzz target: see [`tracer_fuzz::x86`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tracer_fuzz::x86(data));
