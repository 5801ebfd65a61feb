//! Helpers for tracer's integration tests: real `tracer` binaries attached
//! to real CPython children, every child killed when its guard drops.
//!
//! Nothing here skips: a missing binary, interpreter or privilege panics
//! with what to do, so a test that cannot run fails.

#![allow(clippy::missing_panics_doc, reason = "test helpers panic to fail the test, with the reason")]

use std::{
    collections::HashMap,
    ffi::OsStr,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    ops::{Deref, DerefMut},
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, ExitStatus, Stdio},
    sync::mpsc::{Receiver, RecvTimeoutError, channel},
    thread::JoinHandle,
    time::Duration,
};

use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};
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

    /// Every remaining line until end of stream.
    #[must_use]
    pub fn rest(&self, what: &str) -> Vec<String> {
        std::iter::from_fn(|| self.next_line(what)).collect()
    }
}

/// What one iteration of a `once` workload does.
#[derive(Clone, Copy, Debug)]
pub enum Body {
    /// `[]` and `bytearray(1000)`.
    Objects,
    /// One call of each allocator function through ctypes, with the sizes in
    /// [`API_SIZES`].
    Api,
    /// The api body, reporting the wrapping sum of the pointers each
    /// allocating function returned (see [`Workload::finish_with_sums`]).
    ApiPointers,
    /// `json.dumps([1.5, 2.5])`, importing json in the first iteration: no
    /// warm-up, so an extension module is loaded after tracer attached.
    LateImport,
    /// `bytearray(100)`, `bytearray(1000)` and `bytearray(10000)`.
    Sizes,
    /// One `Leaky()` kept and one `Temp()` dropped; after "done" the
    /// workload waits for [`Workload::close`].
    Types,
    /// One float made from float's free list, the old one given back to
    /// it: one new reference and no allocator call; after "done" the
    /// workload waits for [`Workload::close`].
    Floats,
    /// With automatic collection off: `gc.collect(0)` twice,
    /// `gc.collect(1)` once, then [`GC_CYCLES`] reference cycles of two
    /// lists each left behind and `gc.collect(2)` once, which finds them.
    Gc,
    /// With automatic collection on: one new list kept, so that the
    /// collector runs by itself.
    GcAuto,
    /// libc's allocator through ctypes, as tests/python/workload.py's
    /// `NATIVE_CALLS` says.
    Native,
}

/// Reference cycles the gc body leaves for each `gc.collect(2)`, as
/// tests/python/workload.py's `GC_CYCLES`; each is two lists.
pub const GC_CYCLES: u64 = 3;

impl Body {
    const fn arg(self) -> &'static str {
        match self {
            Self::Objects => "objects",
            Self::Api => "api",
            Self::ApiPointers => "api-pointers",
            Self::LateImport => "late-import",
            Self::Types => "types",
            Self::Floats => "floats",
            Self::Sizes => "sizes",
            Self::Gc => "gc",
            Self::GcAuto => "gc-auto",
            Self::Native => "native",
        }
    }
}

/// Per family (prefix): malloc size, calloc (nelem, elsize), realloc size,
/// as in tests/python/workload.py's `API_SIZES`.
pub const API_SIZES: [(&str, u64, (u64, u64), u64); 3] =
    [("PyObject_", 1111, (3, 111), 2222), ("PyMem_", 1333, (4, 111), 2444), ("PyMem_Raw", 1555, (5, 111), 2666)];

/// Each allocating function the api body calls with its requested bytes
/// in one call, from [`API_SIZES`].
#[must_use]
pub fn api_calls() -> Vec<(String, u64)> {
    API_SIZES
        .iter()
        .flat_map(|&(family, malloc, (nelem, elsize), realloc)| {
            [
                (format!("{family}Malloc"), malloc),
                (format!("{family}Calloc"), nelem * elsize),
                (format!("{family}Realloc"), realloc),
            ]
        })
        .collect()
}

/// How a `once` workload exits.
#[derive(Clone, Copy, Debug)]
pub enum Exit {
    /// Normal interpreter finalization.
    Finalize,
    /// `os._exit(0)` right after the loop: no finalization.
    Immediate,
}

impl Exit {
    const fn arg(self) -> &'static str {
        match self {
            Self::Finalize => "finalize",
            Self::Immediate => "_exit",
        }
    }
}

/// Whether the workload runs with address-space randomisation.
#[derive(Clone, Copy, Debug)]
pub enum Aslr {
    On,
    /// `setarch -R`: CPython's finalization frees objects in an order that
    /// depends on their addresses, so only without ASLR is the number of
    /// deallocations at shutdown the same in every run.
    Off,
}

/// A CPython child running tests/python/workload.py.
pub struct Workload {
    pub child: KillOnDrop,
    stdin: Option<ChildStdin>,
    stdout: Lines,
    /// The interpreter's PID when `child` is a wrapper that forks it
    /// (`unshare --fork`).
    python_pid: Option<u32>,
}

/// chroot(8), by its path: a non-login root shell (CI's) may not have
/// /usr/sbin on PATH.
const CHROOT: &str = "/usr/sbin/chroot";

/// A file removed when this is dropped, however the test ends.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// How a workload in another root file system is isolated, as a container
/// would be.
#[derive(Clone, Copy, Debug)]
pub enum Isolation {
    /// `chroot ROOT`: the same mount and PID namespaces as tracer.
    Chroot,
    /// `unshare --mount --pid --fork --mount-proc=ROOT/proc chroot ROOT`:
    /// its own mount and PID namespaces, where the interpreter is PID 1.
    Namespaces,
    /// As a container runtime does it: in its own mount and PID namespaces,
    /// ROOT bind-mounted on itself and made `/` by `pivot_root`, the old
    /// root unmounted. Its memory map then names paths inside ROOT, which
    /// tracer must reach through the process's root.
    Container,
}

/// The shell a [`Isolation::Container`] workload starts in: $1 the root,
/// then the interpreter and its arguments.
const PIVOT_ROOT: &str = r#"set -e
root=$1; shift
mount --make-rprivate /
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
cd "$root"
mkdir -p .tracer-old-root
pivot_root . .tracer-old-root
umount -l /.tracer-old-root
exec "$@""#;

impl Workload {
    /// `workload.py once N EXIT BODY`: waits for [`Workload::go`], runs the
    /// body N times, exits the way `exit` says.
    #[must_use]
    pub fn once(python: &Path, n: u64, body: Body, exit: Exit, aslr: Aslr) -> Self {
        Self::start(python, &["once", &n.to_string(), exit.arg(), body.arg()], aslr)
    }

    /// As [`Workload::once`], started with the PID `pid` (just freed): the
    /// kernel hands out the PID after `/proc/sys/kernel/ns_last_pid`, so
    /// this sets that and starts the workload, again if another process
    /// took the PID first.
    #[must_use]
    pub fn once_with_pid(python: &Path, n: u64, body: Body, exit: Exit, aslr: Aslr, pid: u32) -> Self {
        let args = ["once".to_owned(), n.to_string(), exit.arg().to_owned(), body.arg().to_owned()];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        for _ in 0..200 {
            std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string())
                .expect("write /proc/sys/kernel/ns_last_pid (needs root)");
            let child = Self::command(python, &args, aslr).spawn().expect("start the workload");
            if child.id() == pid {
                return Self::from_child(child);
            }
            drop(KillOnDrop(child));
        }
        panic!("the kernel never handed out PID {pid} again in 200 tries");
    }

    /// Waits until the workload sleeps in `read(0, ...)`: "ready" is printed
    /// just before the read, and whatever Python allocates on the way into
    /// it must not land on one side of the attach in one run and on the
    /// other side in the next.
    pub fn wait_blocked_on_stdin(&self) {
        self.wait_blocked_reading(None);
    }

    /// Waits until the workload sleeps in `read(0, buf, count)` (any count
    /// if `None`).
    pub fn wait_blocked_reading(&self, count: Option<u64>) {
        let pid = self.pid();
        let deadline = std::time::Instant::now() + LINE_TIMEOUT;
        loop {
            // "0 0x0 BUF COUNT ..." is syscall 0 (read) on fd 0 (stdin).
            let syscall = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
            let fields: Vec<&str> = syscall.split_whitespace().collect();
            if fields.get(..2) == Some(&["0", "0x0"][..])
                && count.is_none_or(|c| fields.get(3) == Some(&format!("{c:#x}").as_str()))
            {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "workload {pid} never blocked reading stdin: {syscall}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// `workload.py serve`: runs the body until stdin closes.
    #[must_use]
    pub fn serve(python: &Path) -> Self {
        Self::start(python, &["serve"], Aslr::On)
    }

    /// `tests/python/NAME ARGS` run by `python`: on the host, or with
    /// `root` chrooted into it (`python` then a path inside it). The script
    /// prints "ready" first, as workload.py does.
    #[must_use]
    pub fn script(root: Option<&Path>, python: &str, name: &str, args: &[&str]) -> Self {
        Self::script_env(root, python, name, args, &[])
    }

    /// [`Self::script`] with more environment variables (`PYTHONMALLOC`).
    #[must_use]
    pub fn script_env(root: Option<&Path>, python: &str, name: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::script_with(root, python, name, args, env, Aslr::On)
    }

    /// [`Self::script_env`], with or without address-space randomisation.
    #[must_use]
    pub fn script_with(
        root: Option<&Path>,
        python: &str,
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
        aslr: Aslr,
    ) -> Self {
        static COPIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let source = workspace_root().join("tests/python").join(name);
        // setarch sets the personality and execs the rest in place, so the
        // PID stays the interpreter's.
        let mut cmd = match aslr {
            Aslr::On => None,
            Aslr::Off => {
                let mut c = Command::new("setarch");
                c.arg("-R");
                Some(c)
            }
        };
        let mut program = |first: &OsStr| match cmd.take() {
            Some(mut c) => {
                c.arg(first);
                c
            }
            None => Command::new(first),
        };
        let (mut cmd, copy) = match root {
            None => {
                let mut cmd = program(python.as_ref());
                cmd.arg(&source);
                (cmd, None)
            }
            Some(root) => {
                let copy = COPIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let inside = format!("/tmp/tracer-{}-{copy}-{name}", std::process::id());
                let script = root.join(inside.trim_start_matches('/'));
                std::fs::copy(&source, &script)
                    .unwrap_or_else(|e| panic!("copying {name} into {}: {e}", root.display()));
                let mut cmd = program(CHROOT.as_ref());
                cmd.arg(root).arg(python).arg(&inside);
                (cmd, Some(RemoveOnDrop(script)))
            }
        };
        cmd.args(args)
            .env("PYTHONHASHSEED", "0")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {python} {name}: {e}"));
        let w = Self::from_child(child);
        drop(copy);
        w
    }

    fn start(python: &Path, args: &[&str], aslr: Aslr) -> Self {
        let child = Self::command(python, args, aslr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", python.display()));
        Self::from_child(child)
    }

    fn command(python: &Path, args: &[&str], aslr: Aslr) -> Command {
        let script = workspace_root().join("tests/python/workload.py");
        let mut cmd = match aslr {
            Aslr::On => Command::new(python),
            // setarch sets the personality and execs python in place, so
            // the PID is python's by the time it prints "ready".
            Aslr::Off => {
                let mut c = Command::new("setarch");
                c.arg("-R").arg(python);
                c
            }
        };
        cmd.arg(&script)
            .args(args)
            // Same hash seed in every run, so dict layouts (and so the
            // allocations around the measured loop) are identical.
            .env("PYTHONHASHSEED", "0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        cmd
    }

    fn from_child(mut child: Child) -> Self {
        let stdin = child.stdin.take();
        let stdout = Lines::new(child.stdout.take().expect("piped stdout"));
        let w = Self { child: KillOnDrop(child), stdin, stdout, python_pid: None };
        w.expect("ready");
        w
    }

    /// [`Workload::once`] with `python` from the root file system `root`
    /// (a path inside it), isolated as `isolation` says, without ASLR.
    #[must_use]
    pub fn once_in_root(root: &Path, python: &str, n: u64, body: Body, exit: Exit, isolation: Isolation) -> Self {
        // One copy per workload: tests run in parallel threads and processes.
        static COPIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let copy = COPIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("tracer-workload-{}-{copy}.py", std::process::id());
        let script = root.join("tmp").join(&name);
        std::fs::copy(workspace_root().join("tests/python/workload.py"), &script)
            .unwrap_or_else(|e| panic!("copying the workload into {}: {e}", root.display()));
        let mut cmd = Command::new("setarch");
        cmd.arg("-R");
        match isolation {
            Isolation::Chroot => {
                cmd.arg(CHROOT).arg(root);
            }
            Isolation::Namespaces => {
                cmd.args(["unshare", "--mount", "--pid", "--fork", "--kill-child"])
                    .arg(format!("--mount-proc={}", root.join("proc").display()))
                    .arg(CHROOT)
                    .arg(root);
            }
            Isolation::Container => {
                cmd.args(["unshare", "--mount", "--pid", "--fork", "--kill-child", "/bin/sh", "-c", PIVOT_ROOT, "sh"])
                    .arg(root);
            }
        }
        cmd.args([python, &format!("/tmp/{name}"), "once", &n.to_string(), exit.arg(), body.arg()])
            .env("PYTHONHASHSEED", "0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        // Python has read the whole script by the time it says "ready";
        // the copy goes then, or when this fails.
        let copy = RemoveOnDrop(script);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {python} in {}: {e}", root.display()));
        let mut w = Self::from_child(child);
        drop(copy);
        if let Isolation::Namespaces | Isolation::Container = isolation {
            // unshare's one child is chroot or the shell, which exec'd the
            // interpreter.
            let wrapper = w.child.id();
            let children =
                std::fs::read_to_string(format!("/proc/{wrapper}/task/{wrapper}/children")).expect("children");
            let pid = children.split_whitespace().next().expect("unshare's child").parse().expect("a PID");
            w.python_pid = Some(pid);
        }
        w
    }
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.python_pid.unwrap_or_else(|| self.child.id())
    }

    /// The next line the workload prints, waiting for it as `what`.
    #[must_use]
    pub fn next_line(&self, what: &str) -> Option<String> {
        self.stdout.next_line(what)
    }

    /// Waits for `line` on the workload's stdout.
    pub fn expect(&self, line: &str) {
        let got = self.stdout.next_line(line);
        assert_eq!(got.as_deref(), Some(line), "workload {} printed something else", self.pid());
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        // One write: a line split over two writes makes Python's readline
        // loop once more (and allocate more) depending on timing.
        stdin.write_all(format!("{line}\n").as_bytes()).expect("workload stdin");
    }

    /// Sends `line` to a script of tests/python that reads commands.
    pub fn tell(&mut self, line: &str) {
        self.send(line);
    }

    /// Starts the measured loop of a `once` workload.
    pub fn go(&mut self) {
        self.send("go");
    }

    /// Proves a `serve` workload is still alive and scheduling.
    pub fn ping(&mut self) {
        self.send("ping");
        self.expect("pong");
    }

    /// Makes a `serve` workload import `module` from `directory` now.
    pub fn import(&mut self, directory: &Path, module: &str) {
        self.send(&format!("import {} {module}", directory.display()));
        self.expect("imported");
    }

    /// Closes the workload's stdin, which a `types` workload waits for after
    /// "done", and waits for it to exit successfully.
    pub fn close(mut self) {
        drop(self.stdin.take());
        let status = self.child.wait().expect("wait for workload");
        assert!(status.success(), "workload exited with {status}");
    }

    /// Waits for a `once` workload to finish and exit successfully.
    pub fn finish(self) {
        let _sums = self.finish_with_sums();
    }

    /// Like [`Self::finish`]; returns what an `api-pointers` workload
    /// printed: per allocating function, the wrapping sum of the pointers it
    /// returned in the loop (empty for other bodies).
    #[must_use]
    pub fn finish_with_sums(mut self) -> HashMap<String, u64> {
        let mut sums = HashMap::new();
        let mut line = self.stdout.next_line("done");
        if let Some(rest) = line.as_deref().and_then(|l| l.strip_prefix("sums ")) {
            for pair in rest.split_whitespace() {
                let (name, sum) = pair.split_once('=').expect("NAME=SUM");
                sums.insert(name.to_owned(), sum.parse().expect("a u64 sum"));
            }
            line = self.stdout.next_line("done");
        }
        assert_eq!(line.as_deref(), Some("done"), "workload {} printed something else", self.pid());
        drop(self.stdin.take());
        let status = self.child.wait().expect("wait for workload");
        assert!(status.success(), "workload exited with {status}");
        sums
    }
}

/// A running `tracer` with piped stdout (JSON Lines) and stderr.
pub struct TracerRun {
    pub child: KillOnDrop,
    pub stdout: Lines,
    stderr: JoinHandle<String>,
}

impl TracerRun {
    /// Starts `tracer ARGS`.
    #[must_use]
    pub fn start(args: &[&str]) -> Self {
        Self::start_env(args, &[])
    }

    /// Starts `tracer ARGS` with `env` added to its environment (a test
    /// knob such as `TRACER_TEST_FULL_MAPS`, docs/development.md).
    #[must_use]
    pub fn start_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(tracer_bin())
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tracer");
        let stdout = Lines::new(child.stdout.take().expect("piped stdout"));
        let mut err = child.stderr.take().expect("piped stderr");
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Self { child: KillOnDrop(child), stdout, stderr }
    }

    /// Starts `tracer attach --exact --pid PID --json EXTRA...` and waits
    /// for the "attached" line, which it returns.
    #[must_use]
    pub fn attach_json(pid: u32, extra: &[&str]) -> (Self, Value) {
        let pid = pid.to_string();
        let mut args = vec!["--pid", pid.as_str()];
        args.extend_from_slice(extra);
        Self::attach_json_with(&args)
    }

    /// Starts `tracer attach --exact --json ARGS...` (exact tracing, whose
    /// counts the tests check) and waits for the "attached" line, which it
    /// returns.
    #[must_use]
    pub fn attach_json_with(args: &[&str]) -> (Self, Value) {
        let mut all = vec!["--exact"];
        all.extend_from_slice(args);
        Self::attach_json_as(&all)
    }

    /// Starts `tracer attach --pid PID --json EXTRA...` in the mode the
    /// flags choose (the production profile unless one chooses exact
    /// tracing) and waits for the "attached" line, which it returns.
    #[must_use]
    pub fn profile_json(pid: u32, extra: &[&str]) -> (Self, Value) {
        let pid = pid.to_string();
        let mut args = vec!["--pid", pid.as_str()];
        args.extend_from_slice(extra);
        Self::attach_json_as(&args)
    }

    /// Starts `tracer attach --json ARGS...` as given and waits for the
    /// "attached" line, which it returns.
    #[must_use]
    pub fn attach_json_as(args: &[&str]) -> (Self, Value) {
        let mut all = vec!["attach", "--json"];
        all.extend_from_slice(args);
        let run = Self::start(&all);
        let Some(line) = run.stdout.next_line("the attached line") else {
            let (status, _, stderr) = run.finish();
            panic!("tracer exited ({status}) before attaching: {stderr}");
        };
        let attached: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON: {line}: {e}"));
        assert_eq!(attached["type"], "attached", "{line}");
        (run, attached)
    }

    /// Sends a signal to tracer.
    pub fn signal(&self, sig: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid fits");
        // SAFETY: kill has no memory-safety preconditions; the pid is our
        // own child, not yet reaped.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
    }

    /// Like [`Self::finish`], after checking that tracer succeeded:
    /// tracer's last line, its summary.
    #[must_use]
    pub fn summary(self) -> Value {
        let (status, lines, stderr) = self.finish();
        assert!(status.success(), "tracer failed: {status}: {stderr}");
        let summary = lines.last().expect("a summary").clone();
        assert_eq!(summary["type"], "summary", "{lines:?}");
        summary
    }

    /// Waits for tracer to exit; returns its status, the remaining stdout
    /// lines parsed as JSON, and its stderr.
    #[must_use]
    pub fn finish(mut self) -> (ExitStatus, Vec<Value>, String) {
        let lines = self.stdout.rest("tracer's output");
        let status = self.child.wait().expect("wait for tracer");
        let stderr = self.stderr.join().expect("stderr reader");
        let json = lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}\nstderr: {stderr}")))
            .collect();
        (status, json, stderr)
    }
}

/// Attaches `tracer attach --json ARGS` to `workload` while it waits, runs
/// its loop to the end and returns tracer's attached line and summary,
/// after checking that tracer succeeded.
#[must_use]
pub fn traced_to_the_end(mut workload: Workload, args: &[&str]) -> (Value, Value) {
    workload.wait_blocked_on_stdin();
    let (tracer, attached) = TracerRun::attach_json(workload.pid(), args);
    workload.go();
    workload.finish();
    (attached, tracer.summary())
}

/// Attaches `tracer attach --json ARGS` to a script of tests/python that
/// printed "ready", once it waits in a read of stdin, lets it go, and once it printed "done" and waits in a
/// read(2) of 5 bytes, stops tracer with SIGINT: tracer's attached line
/// and summary, after checking that tracer succeeded.
#[must_use]
pub fn traced_until_done(workload: Workload, args: &[&str]) -> (Value, Value) {
    until_done(workload, args, TracerRun::attach_json)
}

/// [`traced_until_done`] in the mode the flags choose (the production
/// profile unless one chooses exact tracing).
#[must_use]
pub fn profiled_until_done(workload: Workload, args: &[&str]) -> (Value, Value) {
    until_done(workload, args, TracerRun::profile_json)
}

fn until_done(mut workload: Workload, args: &[&str], attach: fn(u32, &[&str]) -> (TracerRun, Value)) -> (Value, Value) {
    workload.wait_blocked_on_stdin();
    let (tracer, attached) = attach(workload.pid(), args);
    workload.go();
    workload.expect("done");
    workload.wait_blocked_reading(Some(5));
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "tracer failed: {status}: {stderr}");
    workload.close();
    let summary = lines.last().expect("a summary").clone();
    assert_eq!(summary["type"], "summary", "{lines:?}");
    (attached, summary)
}

/// `stderr` without the warning of a high estimated cost, which any
/// exact run on a busy target may give once its hit cost is calibrated
/// (see tests/tests/cost.rs).
#[must_use]
pub fn without_cost_warning(stderr: &str) -> String {
    stderr
        .lines()
        .filter(|l| !l.starts_with("tracer: warning: tracing costs the target"))
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

/// The BPF stats of a summary or interval line but `gate_other`: hits at
/// a jump probed for the inlined copy it leads into, where the jump went
/// elsewhere, are the probes' cost, not a miss.
///
/// # Panics
/// Where the line has no stats.
pub fn misses(line: &Value) -> impl Iterator<Item = (&String, &Value)> {
    line["stats"].as_object().expect("stats").iter().filter(|(name, _)| *name != "gate_other")
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

/// Where a probed function lives, found independently of tracer: from
/// /proc/PID/maps and the ELF file read here with `object`.
#[derive(Debug)]
pub struct ProbeSite {
    pub symbol: String,
    /// Address in the target.
    pub address: u64,
    /// The function's first bytes as stored in the ELF file.
    pub file_bytes: Vec<u8>,
}

/// Bytes compared from each probed function's entry (fewer if the function
/// is shorter): covers every offset tracer may place a probe at (it looks 32
/// bytes in) and that instruction.
pub const SITE_BYTES: usize = 48;

/// (start, end, file offset) of every mapping of `path` in `pid`.
fn mappings_of(pid: u32, path: &str) -> Vec<(u64, u64, u64)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("read maps");
    maps.lines()
        .filter(|l| l.split_whitespace().nth(5) == Some(path))
        .map(|l| {
            let mut f = l.split_whitespace();
            let (start, end) = f.next().expect("range").split_once('-').expect("a-b");
            let offset = f.nth(1).expect("offset");
            let hex = |s: &str| u64::from_str_radix(s, 16).expect("hex");
            (hex(start), hex(end), hex(offset))
        })
        .collect()
}

/// Where file offset `offset` is mapped, given [`mappings_of`] the file.
fn address_of(ranges: &[(u64, u64, u64)], offset: u64) -> Option<u64> {
    ranges.iter().find_map(|&(s, e, off)| {
        let delta = offset.checked_sub(off)?;
        (delta < e - s).then_some(s + delta)
    })
}

/// The probe sites of `symbols` in process `pid`, whose interpreter image
/// is `image` (the path tracer reported).
#[must_use]
pub fn probe_sites(pid: u32, image: &str, symbols: &[String]) -> Vec<ProbeSite> {
    let ranges = mappings_of(pid, image);
    assert!(!ranges.is_empty(), "{image} is not mapped in PID {pid}");
    let data = std::fs::read(format!("/proc/{pid}/root{image}")).expect("read image");
    let elf = object::File::parse(&*data).expect("parse image");
    symbols
        .iter()
        .map(|name| {
            let sym = elf
                .symbols()
                .chain(elf.dynamic_symbols())
                .find(|s| s.name() == Ok(name.as_str()) && !s.is_undefined())
                .unwrap_or_else(|| panic!("{name} not in {image}"));
            let vaddr = sym.address();
            let file_offset = elf
                .segments()
                .find_map(|seg| {
                    let delta = vaddr.checked_sub(seg.address())?;
                    (delta < seg.file_range().1).then(|| seg.file_range().0 + delta)
                })
                .expect("symbol in a loaded segment");
            let start = usize::try_from(file_offset).expect("offset fits");
            let address = address_of(&ranges, file_offset).expect("symbol's page is mapped");
            // Only this function's bytes: the next one may hold a probe too.
            let len = usize::try_from(sym.size()).ok().filter(|&l| l > 0).map_or(SITE_BYTES, |l| l.min(SITE_BYTES));
            ProbeSite { symbol: name.clone(), address, file_bytes: data[start..start + len].to_vec() }
        })
        .collect()
}

/// The first byte of each of `offsets` in `path`, at its address in `pid`,
/// for call-site probes; none if `pid` has not mapped `path`.
#[must_use]
pub fn sites_in_file(pid: u32, path: &str, offsets: &[u64]) -> Vec<ProbeSite> {
    let ranges = mappings_of(pid, path);
    if ranges.is_empty() {
        return Vec::new();
    }
    let data = std::fs::read(format!("/proc/{pid}/root{path}")).expect("read module");
    offsets
        .iter()
        .map(|&offset| {
            let address =
                address_of(&ranges, offset).unwrap_or_else(|| panic!("{path}+{offset:#x} is not mapped in PID {pid}"));
            let at = usize::try_from(offset).expect("offset fits");
            ProbeSite { symbol: format!("{path}+{offset:#x}"), address, file_bytes: vec![data[at]] }
        })
        .collect()
}

/// Reads the target's code at each site.
#[must_use]
pub fn read_sites(pid: u32, sites: &[ProbeSite]) -> Vec<Vec<u8>> {
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).expect("open mem");
    sites
        .iter()
        .map(|s| {
            let mut buf = vec![0; s.file_bytes.len()];
            mem.read_exact_at(&mut buf, s.address)
                .unwrap_or_else(|e| panic!("read {} at {:#x}: {e}", s.symbol, s.address));
            buf
        })
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
