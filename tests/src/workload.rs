//! The CPython children the tests drive: tests/python/workload.py and the
//! other scripts of tests/python, each killed when its guard drops.

use std::{
    collections::HashMap,
    ffi::OsStr,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    time::Duration,
};

use crate::{KillOnDrop, LINE_TIMEOUT, Lines, workspace_root};

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
        let child = spawn(&mut cmd).unwrap_or_else(|e| panic!("cannot start {python} {name}: {e}"));
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

/// Spawns `cmd`, again while the kernel says its program is busy
/// (`ETXTBSY`): a copy of an interpreter that a test just wrote is busy
/// while another test's child, forked meanwhile, still holds the copy's
/// write descriptor until it execs.
fn spawn(cmd: &mut Command) -> std::io::Result<std::process::Child> {
    let mut tries = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            spawned => return spawned,
        }
    }
}
