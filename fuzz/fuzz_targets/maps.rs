//! The `maps` fuzz target: see [`tracer_fuzz::maps`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tracer_fuzz::maps(data));
