//! Helpers for tracer's integration tests: real `tracer` binaries attached
//! to real CPython children, every child killed when its guard drops.
//!
//! Nothing here skips: a missing binary, interpreter or privilege panics
//! with what to do, so a test that cannot run fails.

#![allow(clippy::missing_panics_doc, reason = "test helpers panic to fail the test, with the reason")]

pub mod live;
mod run;
mod sites;
mod workload;

pub use self::{
    run::{TracerRun, profiled_until_done, stopped, traced_to_the_end, traced_until_done},
    sites::{ProbeSite, SITE_BYTES, probe_sites, read_sites, sites_in_file},
    workload::{API_SIZES, Aslr, Body, Exit, GC_CYCLES, Isolation, Workload, api_calls},
};

use std::{
    collections::HashMap,
    io::{BufRead as _, BufReader},
    ops::{Deref, DerefMut},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc::{Receiver, RecvTimeoutError, channel},
    thread::JoinHandle,
    time::Duration,
};

use serde_json::Value;

/// How long any single expected line may take before the test fails.
pub const LINE_TIMEOUT: Duration = Duration::from_mins(1);

/// Debian's static, LTO-built interpreter (installed by `cargo xtask setup`).
pub const STATIC_PYTHON: &str = "/usr/bin/python3.11";

/// Panics unless running as root: every integration test loads BPF.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "integration tests load BPF programs and need root: run `cargo xtask test` as root");
}

/// The `tracer` binary under test: `$TRACER_BIN` (set by `cargo xtask
/// test`) or the workspace's debug build.
#[must_use]
pub fn tracer_bin() -> PathBuf {
    let path =
        std::env::var_os("TRACER_BIN").map_or_else(|| workspace_root().join("target/debug/tracer"), PathBuf::from);
    assert!(
        path.is_file(),
        "{} does not exist: run the tests with `cargo xtask test`, which builds it",
        path.display()
    );
    path
}

/// The repository's root.
#[must_use]
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ is in the workspace").to_path_buf()
}

/// pyenv's shared-libpython CPython: `$TRACER_TEST_PYTHON`, or the real
/// executable behind `python3` on PATH.
#[must_use]
pub fn shared_python() -> PathBuf {
    if let Some(p) = std::env::var_os("TRACER_TEST_PYTHON") {
        return PathBuf::from(p);
    }
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 must be on PATH (or set TRACER_TEST_PYTHON)");
    assert!(out.status.success(), "python3 failed: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).expect("utf-8 path").trim())
}

/// The Debian testing (forky) root that `cargo xtask setup` makes, with
/// Debian's LTO python3.13 and python3.14 and their debug info; must match
/// xtask's `FORKY_ROOT`.
pub const FORKY_ROOT: &str = "/var/lib/tracer/forky";

/// [`FORKY_ROOT`], which must have been made.
#[must_use]
pub fn forky_root() -> PathBuf {
    let root = PathBuf::from(FORKY_ROOT);
    assert!(
        root.join(".tracer-setup-complete").is_file() && root.join("usr/bin/python3.14").is_file(),
        "{FORKY_ROOT} is missing or incomplete: run `cargo xtask setup`"
    );
    root
}

/// Debian's static python3.11, which must be installed.
#[must_use]
pub fn static_python() -> PathBuf {
    let p = PathBuf::from(STATIC_PYTHON);
    assert!(p.is_file(), "{STATIC_PYTHON} is missing: run `cargo xtask setup`");
    p
}

/// A copy of the interpreter `image` at `copy`, without its build-id note
/// and debug link: no debug info can be found for it, as for a stripped
/// container image's Python. The copy is made anew each time (objcopy, from
/// binutils, which `cargo xtask setup` installs).
#[must_use = "the path of the copy"]
pub fn without_debug_info(image: &Path, copy: &Path) -> PathBuf {
    let status = Command::new("objcopy")
        .args(["--remove-section", ".note.gnu.build-id", "--remove-section", ".gnu_debuglink"])
        .arg(image)
        .arg(copy)
        .status()
        .unwrap_or_else(|e| panic!("cannot run objcopy (binutils; run `cargo xtask setup`): {e}"));
    assert!(status.success(), "objcopy {} {}: {status}", image.display(), copy.display());
    copy.to_owned()
}

/// A child process that is killed and reaped when dropped.
pub struct KillOnDrop(pub Child);

impl Deref for KillOnDrop {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads lines on a thread so a test can wait with a timeout.
pub struct Lines {
    rx: Receiver<String>,
    _reader: JoinHandle<()>,
}

impl Lines {
    pub fn new(stream: impl std::io::Read + Send + 'static) -> Self {
        let (tx, rx) = channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { rx, _reader: reader }
    }

    /// The next line, or `None` at end of stream; panics after
    /// [`LINE_TIMEOUT`].
    #[must_use]
    pub fn next_line(&self, what: &str) -> Option<String> {
        self.next_line_within(what, LINE_TIMEOUT)
    }

    /// [`Self::next_line`], waiting up to `timeout` (an attach that reads
    /// every module's unwind tables, slow in a debug build beside other
    /// tests).
    #[must_use]
    pub fn next_line_within(&self, what: &str, timeout: Duration) -> Option<String> {
        match self.rx.recv_timeout(timeout) {
            Ok(line) => Some(line),
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => panic!("timed out waiting for {what}"),
        }
    }

    /// The lines already read, without waiting for more.
    #[must_use]
    pub fn queued(&self) -> Vec<String> {
        std::iter::from_fn(|| self.rx.try_recv().ok()).collect()
    }

    /// Every remaining line until end of stream.
    #[must_use]
    pub fn rest(&self, what: &str) -> Vec<String> {
        std::iter::from_fn(|| self.next_line(what)).collect()
    }
}

/// `stderr` without the warning of a high estimated cost, which any
/// exact run on a busy target may give once its hit cost is calibrated
/// (see tests/tests/cost.rs), or the profile's over its budget.
#[must_use]
pub fn without_cost_warning(stderr: &str) -> String {
    stderr
        .lines()
        .filter(|l| {
            !l.starts_with("tracer: warning: tracing costs the target")
                && !l.starts_with("tracer: warning: the profile cost ")
                && !l.starts_with("tracer: warning: the profile has cost ")
        })
        .flat_map(|l| [l, "\n"])
        .collect()
}

/// Runs tracer to completion with ARGS and returns (exit code, stdout, stderr).
#[must_use]
pub fn run_tracer(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(tracer_bin()).args(args).stdin(Stdio::null()).output().expect("run tracer");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// pyenv's interpreter of `version` (../shared/TOOLCHAIN.md lists them).
///
/// # Panics
/// Where it is not installed: a test that needs it fails loudly.
#[must_use]
pub fn pyenv(version: &str) -> PathBuf {
    let python = PathBuf::from("/root/.pyenv/versions").join(version).join("bin/python3");
    assert!(
        python.is_file(),
        "{} is missing: pyenv's {version} must be installed (../shared/TOOLCHAIN.md)",
        python.display()
    );
    python
}

/// The stats of a summary or interval line that are misses: all but
/// `gate_other` (hits at a jump probed for the inlined copy it leads
/// into, where the jump went elsewhere, are the probes' cost, not a miss),
/// the map reads made a key at a time (`map_batch_*`: the map is read
/// whole all the same) and the readings of the collector's statistics
/// that the GC probes covered (`gc_memory_failed_covered`).
///
/// # Panics
/// Where the line has no stats.
pub fn misses(line: &Value) -> impl Iterator<Item = (&String, &Value)> {
    const NOT_MISSES: [&str; 4] = ["gate_other", "map_batch_unsupported", "map_batch_busy", "gc_memory_failed_covered"];
    line["stats"].as_object().expect("stats").iter().filter(|(name, _)| !NOT_MISSES.contains(&name.as_str()))
}

/// Calls and bytes per probe from a summary or interval line.
#[must_use]
pub fn counts(line: &Value) -> HashMap<String, (u64, u64)> {
    line["probes"]
        .as_object()
        .expect("probes object")
        .iter()
        .map(|(k, v)| (k.clone(), (v["calls"].as_u64().expect("calls"), v["bytes"].as_u64().expect("bytes"))))
        .collect()
}

/// The venv `cargo xtask setup` creates with pyperf (and psutil).
#[must_use]
pub fn pyperf_venv() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    std::env::var_os("XDG_DATA_HOME")
        .map_or_else(|| home.join(".local/share"), PathBuf::from)
        .join("tracer/pyperf-venv")
}

/// The x86 breakpoint a uprobe writes at its address.
pub const INT3: u8 = 0xCC;

/// The probed symbols listed in an attached line.
#[must_use]
pub fn attached_probes(attached: &Value) -> Vec<String> {
    attached["probes"].as_array().expect("probes list").iter().map(|v| v.as_str().expect("name").to_owned()).collect()
}

/// Each process's counts in an interval or summary line's `pids`, by PID.
#[must_use]
pub fn per_pid(line: &Value) -> HashMap<u32, HashMap<String, (u64, u64)>> {
    line["pids"]
        .as_object()
        .expect("pids object")
        .iter()
        .map(|(pid, probes)| (pid.parse().expect("pid"), counts(&serde_json::json!({ "probes": probes }))))
        .collect()
}
