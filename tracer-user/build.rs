//! Builds the BPF objects from `tracer-ebpf` with Debian's rustc-web and
//! bpf-linker (installed by `cargo xtask setup`) and hands their paths to
//! the crate, which embeds them: the product's, and the bench object (the
//! crate's `bench` feature: the product's programs and the bench-only
//! ones, which only `tracer bench` loads). A missing toolchain fails the
//! build with the fix.
//!
//! `TRACER_EMPTY_BPF=1` embeds empty objects instead and touches no BPF
//! toolchain, so that `cargo check`, `cargo clippy` and rust-analyzer work
//! on a machine without one. A tracer built so refuses to attach, saying
//! why; `cargo xtask build` and `cargo xtask test` refuse the switch.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

/// Debian's rustc-web: the compiler that matches the prebuilt bpf `core`.
/// `TRACER_BPF_CARGO` and `TRACER_BPF_RUSTC` override them (xtask points
/// them at nothing to prove that `TRACER_EMPTY_BPF` needs neither).
const BPF_CARGO: &str = "/usr/bin/cargo";
const BPF_RUSTC: &str = "/usr/bin/rustc";
const BPF_TARGET: &str = "bpfel-unknown-none";

/// The switch that embeds an empty object.
const EMPTY_SWITCH: &str = "TRACER_EMPTY_BPF";

fn main() {
    for var in [EMPTY_SWITCH, "TRACER_BPF_CARGO", "TRACER_BPF_RUSTC"] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    let bpf_cargo = env::var("TRACER_BPF_CARGO").unwrap_or_else(|_| BPF_CARGO.to_owned());
    let bpf_rustc = env::var("TRACER_BPF_RUSTC").unwrap_or_else(|_| BPF_RUSTC.to_owned());
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let outputs = [(Some("bench"), out_dir.join("tracer-bench.bpf.o")), (None, out_dir.join("tracer.bpf.o"))];
    if env::var_os(EMPTY_SWITCH).is_some_and(|v| !v.is_empty() && v != "0") {
        println!("cargo::warning={EMPTY_SWITCH} is set: embedding an empty BPF object; this tracer cannot attach");
        for (_, out) in &outputs {
            std::fs::write(out, b"").unwrap_or_else(|e| fail(&format!("writing {} failed: {e}", out.display())));
        }
        return;
    }
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest_dir.parent().expect("tracer-user lives in the workspace root").to_path_buf();
    let ebpf = root.join("tracer-ebpf");
    for path in [
        ebpf.join("src"),
        ebpf.join("Cargo.toml"),
        ebpf.join("Cargo.lock"),
        root.join("tracer-common/src"),
        root.join("tracer-common/Cargo.toml"),
    ] {
        println!("cargo::rerun-if-changed={}", path.display());
    }

    for tool in [&bpf_cargo, &bpf_rustc] {
        if !Path::new(tool).exists() {
            fail(&format!("{tool} is missing: run `cargo xtask setup` to install the BPF toolchain"));
        }
    }

    let target_dir = root.join("target").join("bpf");
    // The product's last, so that the object under target/bpf is its.
    for (features, out) in &outputs {
        let bytes = build(&ebpf, &target_dir, (&bpf_cargo, &bpf_rustc), *features);
        std::fs::write(out, &bytes).unwrap_or_else(|e| fail(&format!("writing {} failed: {e}", out.display())));
    }
}

/// Builds tracer-ebpf with `features` into `target_dir`; the object's
/// bytes.
fn build(ebpf: &Path, target_dir: &Path, (bpf_cargo, bpf_rustc): (&str, &str), features: Option<&str>) -> Vec<u8> {
    let mut cmd = Command::new(bpf_cargo);
    // The outer cargo's variables (RUSTC from rustup, RUSTFLAGS, the target
    // dir, profile settings) would point the inner build at the wrong
    // compiler or directory.
    for (key, _) in env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        let outer = (key.starts_with("CARGO") && key != "CARGO_HOME")
            || key.starts_with("RUSTC")
            || key.starts_with("RUSTDOC")
            || matches!(
                key,
                "RUSTFLAGS"
                    | "RUSTUP_TOOLCHAIN"
                    | "TARGET"
                    | "HOST"
                    | "PROFILE"
                    | "OUT_DIR"
                    | "OPT_LEVEL"
                    | "DEBUG"
                    | "NUM_JOBS"
            );
        if outer {
            cmd.env_remove(key);
        }
    }
    // bpf-linker is found on PATH; `cargo install` put it in CARGO_HOME/bin.
    let cargo_bin = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .map(|h| h.join("bin"))
        .unwrap_or_default();
    let path = env::var("PATH").unwrap_or_default();
    cmd.env("PATH", format!("/usr/bin:{}:{path}", cargo_bin.display()))
        .env("RUSTC", bpf_rustc)
        // aya-ebpf needs #![feature(asm_experimental_arch)] on a stable rustc.
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS", "fallback")
        .arg("build")
        .arg("--release")
        .arg("--locked")
        .args(["--target", BPF_TARGET])
        .arg("--manifest-path")
        .arg(ebpf.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir);
    if let Some(features) = features {
        cmd.args(["--features", features]);
    }
    let status =
        cmd.status().unwrap_or_else(|e| fail(&format!("cannot run {bpf_cargo}: {e}; run `cargo xtask setup`")));
    if !status.success() {
        fail(&format!(
            "building tracer-ebpf failed ({status}); if bpf-linker or the bpf core library is missing, run `cargo xtask setup`"
        ));
    }
    let object = target_dir.join(BPF_TARGET).join("release").join("tracer");
    let bytes = std::fs::read(&object).unwrap_or_else(|e| fail(&format!("reading {} failed: {e}", object.display())));
    // An empty or truncated object would only fail when tracer loads it.
    if !bytes.starts_with(b"\x7fELF") {
        fail(&format!(
            "{} is not an ELF object ({} bytes); rebuild with `cargo xtask build`",
            object.display(),
            bytes.len()
        ));
    }
    bytes
}

fn fail(message: &str) -> ! {
    println!("cargo::error={message}");
    std::process::exit(1);
}
