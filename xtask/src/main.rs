//! `cargo xtask`: everything a new machine needs, in one place.
//!
//! - `setup`: install the BPF toolchain and the test interpreters
//!   (idempotent; seconds when all is present)
//! - `build`: setup, then build `tracer` (the BPF object is built and
//!   embedded by tracer-user/build.rs)
//! - `demo`: setup, build, then trace the bundled demo workload
//! - `test`: setup, build, lint, then every unit and integration test,
//!   then each fuzz target for a short while
//! - `fuzz`: each fuzz target over its corpus (docs/fuzzing.md)
//! - `soak`: tracer attached for minutes to a busy target, in each mode

mod bench;
mod bench_budget;
mod bench_census;
mod bench_cost;
mod bench_cost_measure;
mod bench_features;
mod bench_frees;
mod bench_live;
mod bench_measure;
mod bench_per_hit;
mod bench_production;
mod bench_returns;
mod bench_stacks;
mod bench_venvs;
mod bench_window_price;
mod fuzz;
mod lto;
mod markdown;
mod procstat;
mod production_procs;
mod setup;
mod soak;

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Set up, build, demo and test tracer")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install and check everything the build and tests need (idempotent).
    Setup,
    /// Set up, then build tracer (release with --release).
    Build {
        #[arg(long)]
        release: bool,
    },
    /// Set up, build, and trace the bundled demo workload for 20 seconds, a report every 5.
    Demo {
        /// How long to trace, in seconds. The attach's first window costs the demo workload
        /// 13-28 ms of CPU time on Debian's 3.11, which a 1% budget pays for in about 15 s.
        #[arg(long, default_value_t = 20)]
        seconds: u32,
    },
    /// Set up, build (release), and run the benchmark suite; writes BENCHMARKS.md (needs root).
    Bench {
        /// fast, normal or rigorous (how many pyperf rounds and values).
        #[arg(long, default_value = "fast", value_parser = ["fast", "normal", "rigorous"])]
        effort: String,
        /// Run only one section and print it, leaving BENCHMARKS.md alone: budget (--budget
        /// estimates against full counts), returns (reading return values), static (Debian's
        /// static python3.11) or lto (Debian's LTO-built 3.11, 3.13 and 3.14: sites, start to live,
        /// cost per hit against bpftrace and tracemalloc) or cost (the cost tracer estimates
        /// while it runs, against the slowdown measured) or stacks (what `--stacks` adds per event)
        /// or features (what `--types`, `--native` and the GC markers add per event) or live (what
        /// `--live` adds per allocator call, apart from its return probes) or production (what tracer,
        /// tracemalloc and memray cost pyperformance's benchmarks, by twins and alternate rounds)
        /// or census (`tracer heap` on a 1 GiB heap of small objects: time and memory) or frees
        /// (pyenv's frees at their entries and at their implementations, against the empty program)
        /// or window-price (what the profile's windows cost the target in kernel time, against
        /// their price).
        #[arg(long, value_parser = ["budget", "returns", "static", "lto", "cost", "stacks", "features", "live", "production", "census", "frees", "window-price"])]
        only: Option<String>,
        /// The tracer command line the production section measures (after `tracer`), with PID for
        /// the target's PID.
        #[arg(long, default_value = bench_production::DEFAULT_TRACER_ARGS)]
        tracer_args: String,
        /// With `--only stacks` or `--only live`: also measure this tracer binary's stack capture
        /// (or `--live`) in the same rounds (a build of an earlier commit, to compare a change);
        /// repeatable.
        #[arg(long, requires = "only")]
        versus: Vec<PathBuf>,
    },
    /// Set up, build, run clippy, then run every test (needs root), then fuzz each target for a
    /// short while (not with a test filter).
    Test {
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Set up, build (release), and attach tracer for MINUTES to a busy 8-thread target in each
    /// mode, reading its memory and CPU time and the target's rate every minute; writes
    /// BENCHMARKS.md's soak section, and fails where tracer's memory grew over 5% after the first
    /// minute or `--exact` lost a count (needs root).
    Soak {
        /// How long each mode is attached, in minutes (at least 2).
        #[arg(long, default_value_t = 10)]
        minutes: u32,
    },
    /// Build the fuzz targets (fuzz/) and run each over its corpus; fails naming the target and
    /// the input when one crashes.
    Fuzz {
        /// How long to run each target, in seconds.
        #[arg(long, default_value_t = 60)]
        time: u64,
        /// Run only these targets (repeatable): elf, maps, version, dwarf, x86, heap, or canary
        /// (which crashes on one input only, to check that a crash fails the run).
        #[arg(long, value_parser = ["elf", "maps", "version", "dwarf", "x86", "heap", "canary"])]
        only: Vec<String>,
    },
}

/// How long `cargo xtask test` fuzzes each target: CI's whole run must
/// stay within its time (docs/fuzzing.md has the figures).
const TEST_FUZZ_SECONDS: u64 = 5;

/// What the tests need: the toolchain, the test targets, and forky's
/// python3.13 with pyperf (a test runs `tracer bench --root` on it).
fn setup_tests() -> anyhow::Result<()> {
    setup::run_for(setup::Needs { tests: true })?;
    bench_venvs::ensure_forky_pyperf(&setup::pyperf_venv().join("bin").join("python"))?;
    eprintln!("xtask: forky's python3.13 has pyperf ({})", bench_venvs::FORKY_PYPERF_3_13);
    Ok(())
}

/// Everything the build, the demo, the tests and the benchmarks need: the
/// toolchain and the test targets, then the production benchmark's venvs
/// (pyperformance and memray on three interpreters).
fn setup_everything() -> anyhow::Result<()> {
    setup_tests()?;
    bench_venvs::ensure_all()?;
    eprintln!("xtask: the production benchmark's venvs are ready");
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let root = workspace_root();
    match cli.command {
        Task::Setup => setup_everything(),
        Task::Build { release } => {
            setup::run_for(setup::Needs { tests: false })?;
            build(&root, release).map(drop)
        }
        Task::Demo { seconds } => {
            // The demo needs no test targets (the forky root).
            setup::run_for(setup::Needs { tests: false })?;
            let tracer = build(&root, true)?;
            demo(&root, &tracer, seconds)
        }
        Task::Bench { effort, only, versus, tracer_args } => {
            if !versus.is_empty() && !matches!(only.as_deref(), Some("stacks" | "live")) {
                bail!("--versus goes with --only stacks or --only live");
            }
            let tracer_args = bench_production::parse_tracer_args(&tracer_args)?;
            setup_everything()?;
            require_root("the benchmarks")?;
            let tracer = build(&root, true)?;
            let mut md = String::new();
            match only.as_deref() {
                Some("budget") => bench_budget::budget_accuracy(&mut md, &tracer)?,
                Some("lto") => lto::lto_section(&mut md, &tracer, &effort)?,
                Some("cost") => bench_cost::cost_section(&mut md, &tracer, &root.join("target").join("bench"))?,
                Some("stacks") => bench_stacks::stacks_section(&mut md, &tracer, &effort, &versus)?,
                Some("features") => bench_features::features_section(&mut md, &tracer, &effort)?,
                Some("live") => bench_live::live_section(&mut md, &tracer, &effort, &versus)?,
                Some("census") => bench_census::census_section(&mut md, &tracer, &effort)?,
                Some("frees") => bench_frees::frees_section(&mut md, &tracer, &effort)?,
                Some("window-price") => bench_window_price::window_price_section(&mut md, &root, &tracer, &effort)?,
                Some("production") => bench_production::production_section(
                    &mut md,
                    &tracer,
                    &effort,
                    &tracer_args,
                    &root.join("target").join("bench"),
                )?,
                Some("static") => {
                    bench_per_hit::static_section(&mut md, &tracer, &root.join("target").join("bench"), &effort)?;
                }
                Some(_) => {
                    let python = setup::pyperf_venv().join("bin").join("python");
                    bench_returns::returns_section(
                        &mut md,
                        &tracer,
                        &python,
                        &root.join("target").join("bench"),
                        &effort,
                    )?;
                }
                None => return bench::run(&root, &tracer, &effort, &tracer_args),
            }
            print!("{md}");
            Ok(())
        }
        Task::Test { args } => {
            // The test targets, not the benchmark's venvs: CI's time.
            setup_tests()?;
            let tracer = build(&root, false)?;
            // A filtered run is for a few tests; the fuzzing is the whole
            // run's. Its targets build meanwhile, at the lowest priority:
            // the tests wait on their Python processes much of the time,
            // and a clean build of the targets takes minutes.
            let building = if args.is_empty() { Some(fuzz::start_build(&root)?) } else { None };
            let totals = test(&root, &tracer, &args);
            let fuzzed = match building {
                Some(build) => {
                    fuzz::finish_build(build).and_then(|()| fuzz::run(&root, TEST_FUZZ_SECONDS, fuzz::TARGETS))
                }
                None => Ok(()),
            };
            let totals = totals?;
            // The plain closing line CI reads, last: "tests: N passed, N failed".
            println!("tests: {} passed, {} failed", totals.passed, totals.failed);
            fuzzed
        }
        Task::Soak { minutes } => {
            setup::run_for(setup::Needs { tests: false })?;
            require_root("the soak")?;
            let tracer = build(&root, true)?;
            soak::run(&root, &tracer, minutes)
        }
        Task::Fuzz { time, only } => {
            let only: Vec<&str> = only.iter().map(String::as_str).collect();
            fuzz::run(&root, time, if only.is_empty() { fuzz::TARGETS } else { only.as_slice() })
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask is inside the workspace").to_path_buf()
}

/// The cargo that runs xtask (rustup's), for the userspace build.
fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

pub(crate) fn run(cmd: &mut Command) -> anyhow::Result<()> {
    eprintln!("xtask: $ {}", shown(cmd));
    let status = cmd.status().with_context(|| format!("cannot start {}", shown(cmd)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", shown(cmd));
    }
    Ok(())
}

fn shown(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// tracer-user/build.rs's switch that embeds an empty BPF object.
const EMPTY_BPF_SWITCH: &str = "TRACER_EMPTY_BPF";

fn build(root: &Path, release: bool) -> anyhow::Result<PathBuf> {
    if std::env::var_os(EMPTY_BPF_SWITCH).is_some_and(|v| !v.is_empty() && v != "0") {
        bail!(
            "{EMPTY_BPF_SWITCH} is set, which would build a tracer without its BPF object; unset it (it is for `cargo check`, `cargo clippy` and rust-analyzer only)"
        );
    }
    let mut cmd = cargo();
    cmd.current_dir(root).args(["build", "--locked", "-p", "tracer-user"]);
    if release {
        cmd.arg("--release");
    }
    run(&mut cmd)?;
    // Where cargo put it: CARGO_TARGET_DIR when set (a worktree's own target).
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let tracer = target.join(if release { "release" } else { "debug" }).join("tracer");
    if !tracer.is_file() {
        bail!("the build succeeded but {} is missing", tracer.display());
    }
    Ok(tracer)
}

/// The real interpreter behind `python3` on PATH (pyenv's is a shim script,
/// whose PID would be a shell until it execs).
pub(crate) fn real_python3() -> anyhow::Result<PathBuf> {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .context("python3 is not on PATH; install CPython 3.11+ (this machine kind ships pyenv's 3.11.7)")?;
    if !out.status.success() {
        bail!("python3 failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

fn demo(root: &Path, tracer: &Path, seconds: u32) -> anyhow::Result<()> {
    require_root("the demo")?;
    let python = real_python3()?;
    let script = root.join("demo").join("workload.py");
    eprintln!("xtask: starting the demo workload: {} {}", python.display(), script.display());
    let mut child = Command::new(&python)
        .arg(&script)
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {}", python.display()))?;
    let pid = child.id();
    let result = (|| {
        let stdout = child.stdout.take().context("workload stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        if line.trim() != "ready" {
            bail!("the demo workload did not start (it printed {line:?})");
        }
        let (pid, seconds) = (pid.to_string(), seconds.to_string());
        run(Command::new(tracer).args(["attach", "--pid", &pid, "--duration", &seconds, "--interval", "5"]))
    })();
    // The workload runs forever; stop it whatever happened.
    let _ = child.kill();
    let _ = child.wait();
    result
}

const CLIPPY: [&str; 7] = ["clippy", "--locked", "--workspace", "--all-targets", "--", "-D", "warnings"];

/// Runs clippy as a machine without Debian's BPF toolchain would: with
/// build.rs's switch, in a target directory of its own, a PATH that holds
/// only rustup's tools and the C linker, and build.rs's BPF cargo and rustc
/// pointed at files that do not exist, so that a build.rs that still
/// reached for the toolchain would fail here.
fn clippy_without_bpf_toolchain(root: &Path) -> anyhow::Result<()> {
    let bin = root.join("target").join("no-bpf-toolchain").join("bin");
    std::fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .context("neither CARGO_HOME nor HOME is set")?;
    let tools = [
        (home.join("bin/cargo"), "cargo"),
        (home.join("bin/rustc"), "rustc"),
        (home.join("bin/cargo-clippy"), "cargo-clippy"),
        (home.join("bin/clippy-driver"), "clippy-driver"),
        (PathBuf::from("/usr/bin/cc"), "cc"),
        (PathBuf::from("/usr/bin/ld"), "ld"),
    ];
    for (target, name) in &tools {
        let link = bin.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(target, &link).with_context(|| format!("linking {}", link.display()))?;
    }
    for absent in ["bpf-linker", "rustc-web"] {
        if bin.join(absent).exists() {
            bail!("{absent} is in {}", bin.display());
        }
    }
    let mut cmd = Command::new(bin.join("cargo"));
    cmd.current_dir(root)
        .args(CLIPPY)
        .env("PATH", &bin)
        .env(EMPTY_BPF_SWITCH, "1")
        .env("TRACER_BPF_CARGO", bin.join("no-bpf-cargo"))
        .env("TRACER_BPF_RUSTC", bin.join("no-bpf-rustc"))
        .env("CARGO_TARGET_DIR", root.join("target").join("no-bpf-toolchain"))
        .env_remove("RUSTC")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("CARGO");
    eprintln!("xtask: clippy with {EMPTY_BPF_SWITCH}=1 and no BPF toolchain on PATH");
    run(&mut cmd)
}

/// Lints, then runs every test; their totals, when all passed.
fn test(root: &Path, tracer: &Path, args: &[String]) -> anyhow::Result<Totals> {
    require_root("the integration tests (they load BPF programs and attach uprobes)")?;
    run(cargo().current_dir(root).args(CLIPPY))?;
    clippy_without_bpf_toolchain(root)?;
    let mut cmd = cargo();
    cmd.current_dir(root)
        .args(["test", "--locked", "--workspace", "--no-fail-fast"])
        .args(args)
        .env("TRACER_BIN", tracer)
        .env("TRACER_TEST_PYTHON", real_python3()?)
        .stdout(Stdio::piped());
    eprintln!("xtask: $ {}", shown(&cmd));
    let mut child = cmd.spawn().context("cannot start cargo test")?;
    // Echo cargo's output while adding up its per-binary results, so the
    // run ends with one total instead of the last binary's (often empty)
    // result line.
    let mut totals = Totals::default();
    for line in BufReader::new(child.stdout.take().context("cargo test stdout")?).lines() {
        let line = line?;
        println!("{line}");
        totals.add(&line);
    }
    let status = child.wait()?;
    let failed = !status.success() || totals.failed > 0 || totals.passed == 0 || totals.ignored > 0;
    if failed {
        // The plain closing line CI reads: "tests: N passed, N failed".
        println!("tests: {} passed, {} failed", totals.passed, totals.failed);
    }
    if !status.success() || totals.failed > 0 {
        bail!("tests failed ({status})");
    }
    if totals.passed == 0 {
        bail!("no test ran");
    }
    if totals.ignored > 0 {
        bail!("{} tests were ignored; every test must run", totals.ignored);
    }
    Ok(totals)
}

#[derive(Default)]
struct Totals {
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl Totals {
    /// Adds a libtest line such as
    /// `test result: ok. 5 passed; 0 failed; 0 ignored; 0 measured; ...`.
    fn add(&mut self, line: &str) {
        let Some(rest) = line.strip_prefix("test result: ") else { return };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(kind), Some(n)) = (words.next(), words.next()) else { continue };
            let Ok(n) = n.parse::<u64>() else { continue };
            match kind {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

fn require_root(what: &str) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("{what} need root: run `sudo -E cargo xtask ...` (or as root)");
    }
    Ok(())
}
