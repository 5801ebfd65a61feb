//! The `heap` fuzz target: see [`tracer_fuzz::heap`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tracer_fuzz::heap(data));
