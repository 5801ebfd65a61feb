//! `cargo xtask fuzz`: builds fuzz/'s targets with cargo-fuzz and runs
//! each for a while over its corpus (fuzz/corpus/TARGET, in the repo),
//! one at a time, on one core. A target that crashes (a panic, an
//! overflow, a timeout, running out of memory) fails the run with one line
//! naming it and the input. Before the targets, the canary target is run
//! on its one crashing input, which must fail it: a run that could not
//! tell a crash would pass whatever the targets do. See docs/fuzzing.md.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, bail};

/// The targets, in the order run: one per parser of hostile input.
pub const TARGETS: &[&str] = &["elf", "maps", "version", "dwarf", "x86", "heap"];
/// The target that crashes on [`CANARY_INPUT`] alone.
const CANARY: &str = "canary";
/// fuzz/src/lib.rs's `CANARY`.
const CANARY_INPUT: &[u8] = b"tracer fuzz canary: this input crashes the canary target";

/// How cargo-fuzz builds the targets, the same for `build` and `run` (a
/// difference would rebuild). No sanitizer: the code is safe Rust, whose
/// bugs here are panics, which need none, and the address sanitizer would halve
/// the executions and need a nightly compiler's flags. Debug assertions
/// (and so overflow checks) on, as in the tests: an overflow on hostile
/// input is a crash. The dev profile with the optimisation fuzz/Cargo.toml
/// gives it: cargo-fuzz's release build compiles every crate as one
/// codegen unit, which took far longer here (docs/fuzzing.md).
const BUILD_FLAGS: &[&str] = &["--sanitizer", "none", "--debug-assertions", "--dev"];

/// libFuzzer's flags for every run: an input that takes 10 s is a hang,
/// and the final statistics say how many inputs ran.
const RUN_FLAGS: &[&str] = &["-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1"];

/// Where CI builds the targets: a directory kept between runs on the same
/// machine, since CI clones afresh and a clean build of the targets takes
/// about 6 minutes on 2 cores, where a build after a change to tracer-user
/// takes under one (docs/fuzzing.md).
const CI_TARGET_DIR: &str = "/var/cache/tracer/fuzz-target";

/// Where the targets are built and run: fuzz/'s own target directory
/// (under the workspace's, which git ignores), or in CI ([`CI_TARGET_DIR`]).
fn fuzz_target_dir(root: &Path) -> PathBuf {
    if std::env::var_os("CI").is_some_and(|v| v == "true") {
        return PathBuf::from(CI_TARGET_DIR);
    }
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from).join("fuzz")
}

/// `cargo fuzz SUBCOMMAND` in fuzz/'s parent, with the build's settings.
fn cargo_fuzz(root: &Path, subcommand: &str) -> Command {
    let mut cmd = crate::cargo();
    cmd.current_dir(root)
        .args(["fuzz", subcommand])
        .args(BUILD_FLAGS)
        .arg("--target-dir")
        .arg(fuzz_target_dir(root))
        // No BPF object: the targets load no programs, and tracer-user's
        // build.rs then needs no BPF toolchain.
        .env(crate::EMPTY_BPF_SWITCH, "1")
        // The lock file is fuzz/'s own; fall back to versions that fit
        // this compiler, as the workspace does.
        .env("CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS", "fallback")
        .env_remove("CARGO_TARGET_DIR");
    cmd
}

/// Starts building every target at the lowest CPU priority, its output
/// to a log, for [`finish_build`] to wait for.
pub fn start_build(root: &Path) -> anyhow::Result<(std::process::Child, PathBuf, Instant)> {
    crate::setup::ensure_cargo_fuzz()?;
    let dir = fuzz_target_dir(root);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let log = dir.join("build.log");
    let file = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = cargo_fuzz(root, "build");
    cmd.stdout(file.try_clone()?).stderr(file);
    // SAFETY: setpriority is async-signal-safe and touches no lock
    // between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt as _;
        cmd.pre_exec(|| {
            if libc::setpriority(libc::PRIO_PROCESS, 0, 19) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    eprintln!("xtask: fuzz: building the targets in the background, at nice 19 (log: {})", log.display());
    let child = cmd.spawn().context("starting cargo fuzz build")?;
    Ok((child, log, Instant::now()))
}

/// Waits for [`start_build`]'s build; fails with its log's last lines.
pub fn finish_build((mut child, log, started): (std::process::Child, PathBuf, Instant)) -> anyhow::Result<()> {
    let status = child.wait().context("waiting for cargo fuzz build")?;
    eprintln!("xtask: fuzz: the background build ended after {:.0} s ({status})", started.elapsed().as_secs_f64());
    if !status.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!("building the fuzz targets failed ({status}):\n{}", tail.join("\n"));
    }
    Ok(())
}

/// Builds every target, then runs the canary and each of `targets` for
/// `seconds`.
pub fn run(root: &Path, seconds: u64, targets: &[&str]) -> anyhow::Result<()> {
    crate::setup::ensure_cargo_fuzz()?;
    let started = Instant::now();
    crate::run(&mut cargo_fuzz(root, "build"))?;
    eprintln!("xtask: fuzz: the targets built in {:.0} s", started.elapsed().as_secs_f64());
    let scratch = fuzz_target_dir(root).join("runs");
    canary_check(root, &scratch)?;
    for target in targets {
        if *target == CANARY {
            continue;
        }
        let seeds = root.join("fuzz").join("corpus").join(target);
        let run = fuzz_one(root, &scratch, target, &seeds, seconds)?;
        if let Some(crash) = &run.crash {
            bail!("{}", crash.line(target, &seeds));
        }
        eprintln!(
            "xtask: fuzz {target}: {} inputs run in {:.0} s from {} seeds, no crash ({} inputs in the corpus after)",
            run.executed.map_or_else(|| "?".to_owned(), |n| n.to_string()),
            run.seconds,
            count_files(&seeds),
            count_files(&run.corpus),
        );
    }
    if targets.contains(&CANARY) {
        let seeds = root.join("fuzz").join("corpus").join(CANARY);
        if let Some(crash) = fuzz_one(root, &scratch, CANARY, &seeds, seconds)?.crash {
            bail!("{}", crash.line(CANARY, &seeds));
        }
    }
    eprintln!(
        "xtask: fuzz: {} targets, {seconds} s each, no crash ({:.0} s in all)",
        targets.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Runs the canary target on its crashing input, which must fail the run
/// and be named.
fn canary_check(root: &Path, scratch: &Path) -> anyhow::Result<()> {
    let seeds = scratch.join("canary-seeds");
    reset_dir(&seeds)?;
    std::fs::write(seeds.join("crash"), CANARY_INPUT).with_context(|| format!("writing into {}", seeds.display()))?;
    // Its log and corpus apart from a run of the canary among the targets.
    let run = fuzz_one(root, &scratch.join("check"), CANARY, &seeds, 10)?;
    match run.crash {
        Some(Crash { input: Some(input), .. }) if input == seeds.join("crash") => {
            eprintln!("xtask: fuzz canary: its crashing input failed the run and was named, as it must");
            Ok(())
        }
        Some(crash) => bail!(
            "the canary crashed, but the crash was not traced to its input ({}); the crash report is broken",
            crash.line(CANARY, &seeds)
        ),
        None => bail!(
            "the canary target did not crash on its crashing input (log: {}); a crash would not fail `cargo xtask fuzz`",
            run.log.display()
        ),
    }
}

/// What one target's run found.
struct Run {
    executed: Option<u64>,
    seconds: f64,
    corpus: PathBuf,
    log: PathBuf,
    crash: Option<Crash>,
}

/// A crash, as libFuzzer reported it.
struct Crash {
    /// What it was: libFuzzer's summary ("deadly signal", "timeout").
    kind: String,
    /// The panic's message, where it was one.
    panic: Option<String>,
    /// Where libFuzzer saved the input.
    artifact: Option<PathBuf>,
    /// The corpus file that holds the same bytes, where one does.
    input: Option<PathBuf>,
    log: PathBuf,
}

impl Crash {
    /// The one line the run fails with.
    fn line(&self, target: &str, seeds: &Path) -> String {
        let input = match (&self.input, &self.artifact) {
            (Some(input), _) => format!("the corpus input {}", input.display()),
            (None, Some(artifact)) => format!("a new input saved as {}", artifact.display()),
            (None, None) => format!("an input libFuzzer did not save (corpus {})", seeds.display()),
        };
        let panic = self.panic.as_ref().map_or_else(String::new, |p| format!(": {p}"));
        let again = self.artifact.as_ref().map_or_else(String::new, |a| {
            format!("; reproduce with `cargo fuzz run {} {target} {}`", BUILD_FLAGS.join(" "), a.display())
        });
        format!("fuzz target {target} crashed ({}) on {input}{panic}{again}; log: {}", self.kind, self.log.display())
    }
}

/// Runs `target` for `seconds` over a fresh copy of its corpus `seeds`
/// (new inputs go to the copy, the repo's corpus stays as it is).
fn fuzz_one(root: &Path, scratch: &Path, target: &str, seeds: &Path, seconds: u64) -> anyhow::Result<Run> {
    if !seeds.is_dir() {
        bail!("{} is missing: every fuzz target needs its corpus in the repo", seeds.display());
    }
    let corpus = scratch.join("corpus").join(target);
    reset_dir(&corpus)?;
    let log = scratch.join(format!("{target}.log"));
    let file = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = cargo_fuzz(root, "run");
    cmd.arg(target)
        .arg(&corpus)
        .arg(seeds)
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .args(RUN_FLAGS)
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file);
    eprintln!("xtask: fuzz {target}: {seconds} s (log: {})", log.display());
    let started = Instant::now();
    let status = cmd.status().with_context(|| format!("cannot start {}", crate::shown(&cmd)))?;
    let seconds = started.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(&log).with_context(|| format!("reading {}", log.display()))?;
    let executed = text
        .lines()
        .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
        .and_then(|n| n.trim().parse().ok());
    let crash = (!status.success()).then(|| {
        let artifact =
            text.lines().find_map(|l| l.split_once("Test unit written to ").map(|(_, p)| root.join(p.trim())));
        let input = artifact.as_deref().and_then(|a| same_bytes(a, &[seeds, &corpus]));
        let kind = text
            .lines()
            .find_map(|l| l.strip_prefix("SUMMARY: libFuzzer: "))
            .map_or_else(|| format!("exit {status}"), str::to_owned);
        // "thread '<unnamed>' panicked at FILE:LINE:COL:", then the message.
        let mut after = text.lines().skip_while(|l| !l.contains("panicked at "));
        let panic = after.next().and_then(|l| l.split_once("panicked at ")).map(|(_, at)| {
            let message = after.next().unwrap_or_default().trim();
            format!("panicked at {} {message}", at.trim())
        });
        Crash { kind, panic, artifact, input, log: log.clone() }
    });
    Ok(Run { executed, seconds, corpus, log, crash })
}

/// The file in `dirs` whose bytes are those of `artifact`.
fn same_bytes(artifact: &Path, dirs: &[&Path]) -> Option<PathBuf> {
    let bytes = std::fs::read(artifact).ok()?;
    dirs.iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| std::fs::read(p).is_ok_and(|b| b == bytes))
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.filter(|e| e.as_ref().is_ok_and(|e| e.path().is_file())).count())
}

fn reset_dir(dir: &Path) -> anyhow::Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}
