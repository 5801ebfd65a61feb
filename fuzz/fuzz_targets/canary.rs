//! A target that crashes on one input only, [`tracer_fuzz::CANARY`]:
//! `cargo xtask fuzz` runs it on that input first, to show that a crash
//! fails the run and is named (docs/fuzzing.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    assert!(data != tracer_fuzz::CANARY, "the canary input crashes the canary target, as it should");
});
