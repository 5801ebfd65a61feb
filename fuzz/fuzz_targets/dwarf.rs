//! The `dwarf` fuzz target: see [`tracer_fuzz::dwarf`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tracer_fuzz::dwarf(data));
