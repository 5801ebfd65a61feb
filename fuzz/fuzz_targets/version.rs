//! The `version` fuzz target: see [`tracer_fuzz::version`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tracer_fuzz::version(data));
