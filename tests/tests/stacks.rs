//! `tracer stack`: the Python stacks of live processes, read from outside,
//! on every build here: pyenv's 3.9.18, 3.10.13, 3.11.7, 3.12.1 and 3.13.0
//! (shared libpython), Debian's LTO 3.11 and the forky root's LTO 3.13 and 3.14
//! (static, no `.symtab`, run under chroot). Each must read back exactly
//! the stack tests/python/stacks.py sits in, at the lines it marks.

use std::{
    collections::HashMap,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;
use tracer_tests::{KillOnDrop, LINE_TIMEOUT, forky_root, require_root, run_tracer};

/// An interpreter to run the script with.
#[derive(Clone, Copy, Debug)]
enum Python {
    /// An executable of this machine.
    Host(&'static str),
    /// `/usr/bin/NAME` of the forky root, under `chroot`.
    Forky(&'static str),
    /// The same in its own mount and PID namespaces (`unshare`), as a
    /// container runs it.
    ForkyNamespaces(&'static str),
}

/// How the BPF side will find the current thread's state, as `tracer
/// stack` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Current {
    /// 3.9 to 3.11: `_PyRuntime.gilstate.tstate_current`.
    Gilstate,
    /// 3.12+ in a shared libpython: through the DTV.
    Dtv,
    /// 3.12+ in an executable: at fsbase - 24 (`_Py_tss_tstate`, as the
    /// forky builds' `_PyThreadState_GetCurrent` reads it).
    FsMinus24,
}

const PYENV_39: Python = Python::Host("/root/.pyenv/versions/3.9.18/bin/python3");
const PYENV_310: Python = Python::Host("/root/.pyenv/versions/3.10.13/bin/python3");
const PYENV_311: Python = Python::Host("/root/.pyenv/versions/3.11.7/bin/python3");
const PYENV_312: Python = Python::Host("/root/.pyenv/versions/3.12.1/bin/python3");
const PYENV_313: Python = Python::Host("/root/.pyenv/versions/3.13.0/bin/python3");
const DEBIAN_311: Python = Python::Host("/usr/bin/python3.11");
const FORKY_313: Python = Python::Forky("python3.13");
const FORKY_314: Python = Python::Forky("python3.14");

/// chroot(8) by its path (a non-login shell may lack /usr/sbin).
const CHROOT: &str = "/usr/sbin/chroot";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python/stacks.py")
}

/// The line of each `# MARK: name` in the script.
fn marks() -> HashMap<String, u64> {
    let text = std::fs::read_to_string(script()).expect("read tests/python/stacks.py");
    text.lines()
        .zip(1..)
        .filter_map(|(line, n)| line.split_once("# MARK: ").map(|(_, name)| (name.trim().to_owned(), n)))
        .collect()
}

/// The script running in a Python, killed when dropped.
struct Running {
    _child: KillOnDrop,
    /// The interpreter's host PID.
    pid: u32,
    /// The script's path as the interpreter sees it.
    path: String,
    _copy: Option<RemoveOnDrop>,
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl Running {
    /// Starts `stacks.py ARGS` and waits until it printed "ready" and, but
    /// for `spin`, every thread sleeps in a system call.
    fn start(python: Python, args: &[&str]) -> Self {
        static COPIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let (mut cmd, path, copy) = match python {
            Python::Host(exe) => {
                assert!(Path::new(exe).is_file(), "{exe} is missing: it is part of this machine kind");
                let path = script().display().to_string();
                let mut cmd = Command::new(exe);
                cmd.arg(&path);
                (cmd, path, None)
            }
            Python::Forky(name) | Python::ForkyNamespaces(name) => {
                let root = forky_root();
                let n = COPIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let inside = format!("/tmp/tracer-stacks-{}-{n}.py", std::process::id());
                let copy = root.join(inside.trim_start_matches('/'));
                std::fs::copy(script(), &copy).expect("copy the script into the forky root");
                let mut cmd = if let Python::ForkyNamespaces(_) = python {
                    let mut c = Command::new("unshare");
                    c.args(["--mount", "--pid", "--fork", "--kill-child"])
                        .arg(format!("--mount-proc={}", root.join("proc").display()))
                        .arg(CHROOT);
                    c
                } else {
                    Command::new(CHROOT)
                };
                cmd.arg(&root).arg(name).arg(&inside);
                (cmd, inside, Some(RemoveOnDrop(copy)))
            }
        };
        let mut child =
            cmd.args(args).stdout(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("start {python:?}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let child = KillOnDrop(child);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let got = rx.recv_timeout(LINE_TIMEOUT);
        assert_eq!(got.as_deref(), Ok("ready"), "{python:?} {args:?} did not say ready");
        let pid = match python {
            // unshare's child is chroot, which exec'd the interpreter.
            Python::ForkyNamespaces(_) => {
                let wrapper = child.id();
                let children = std::fs::read_to_string(format!("/proc/{wrapper}/task/{wrapper}/children"))
                    .expect("unshare's children");
                children.split_whitespace().next().expect("unshare's child").parse().expect("a PID")
            }
            _ => child.id(),
        };
        let running = Self { _child: child, pid, path, _copy: copy };
        if matches!(args.first(), Some(&("spin" | "churn"))) {
            // Past the print and into the loop.
            std::thread::sleep(Duration::from_millis(200));
        } else {
            running.wait_all_blocked();
        }
        running
    }

    /// Waits until every task of the interpreter is in a system call:
    /// `clock_nanosleep` (`time.sleep` from 3.11), `pselect6` (its
    /// `select()` before 3.11) or `futex` (a thread waiting on a lock).
    fn wait_all_blocked(&self) {
        let deadline = Instant::now() + LINE_TIMEOUT;
        loop {
            let tasks = std::fs::read_dir(format!("/proc/{}/task", self.pid)).expect("tasks");
            let syscalls: Vec<String> = tasks
                .filter_map(Result::ok)
                .map(|t| std::fs::read_to_string(t.path().join("syscall")).unwrap_or_default())
                .collect();
            if syscalls.iter().all(|s| matches!(s.split_whitespace().next(), Some("230" | "270" | "202"))) {
                return;
            }
            assert!(Instant::now() < deadline, "PID {} never settled: {syscalls:?}", self.pid);
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// `tracer stack --pid PID --json EXTRA...`, which must succeed.
fn stack(pid: u32, extra: &[&str]) -> Value {
    let pid = pid.to_string();
    let mut args = vec!["stack", "--pid", &pid, "--json"];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = run_tracer(&args);
    assert_eq!(code, Some(0), "tracer {args:?}: {stderr}");
    assert_eq!(stderr, "", "tracer {args:?}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON: {stdout}: {e}"))
}

/// A thread's frames as (function, file, line).
fn frames(thread: &Value) -> Vec<(String, String, u64)> {
    thread["frames"]
        .as_array()
        .unwrap_or_else(|| panic!("no frames: {thread}"))
        .iter()
        .map(|f| {
            let s = |k: &str| f[k].as_str().unwrap_or_else(|| panic!("{k} in {f}")).to_owned();
            (s("function"), s("file"), f["line"].as_u64().unwrap_or_else(|| panic!("a line in {f}")))
        })
        .collect()
}

/// The one thread marked main.
fn main_thread(read: &Value) -> &Value {
    let mains: Vec<&Value> =
        read["threads"].as_array().expect("threads").iter().filter(|t| t["main"] == true).collect();
    assert_eq!(mains.len(), 1, "one main thread: {read}");
    mains[0]
}

/// The stack the script's main thread is in, innermost first, with `leaf`
/// at the line `leaf_mark` marks.
fn expected(path: &str, leaf_mark: &str) -> Vec<(String, String, u64)> {
    let m = marks();
    [("leaf", leaf_mark), ("middle", "middle"), ("main", "main"), ("<module>", "module")]
        .iter()
        .map(|(f, mark)| ((*f).to_owned(), path.to_owned(), m[*mark]))
        .collect()
}

/// The script sleeping with a helper thread, under functions with
/// non-ASCII names, then spinning: each stack exact, the helper thread's
/// too, the GIL's holder, and the route the BPF
/// walker will take to the current thread's state, proved on the spinning
/// thread (the only moment a thread state is current: a thread that
/// released the GIL has none).
fn check(python: Python, version: &str, current: Current) {
    require_root();
    let sleeping = Running::start(python, &["sleep"]);
    let read = stack(sleeping.pid, &[]);
    assert!(read["python"]["version"].as_str().is_some_and(|v| v.starts_with(version)), "{read}");
    let main = main_thread(&read);
    assert_eq!(frames(main), expected(&sleeping.path, "sleep"), "{read}");
    assert_eq!(main["truncated"], false);
    let threads = read["threads"].as_array().expect("threads");
    assert_eq!(threads.len(), 2, "{read}");
    let helper = threads.iter().find(|t| t["main"] == false).expect("the helper thread");
    let helper_frames = frames(helper);
    assert!(helper_frames.contains(&("helper_wait".to_owned(), sleeping.path.clone(), marks()["helper"])), "{helper}");
    // Before 3.11 a code object has no qualified name: its `co_name`.
    let old = version == "3.9." || version == "3.10.";
    let bootstrap = if old { "_bootstrap" } else { "Thread._bootstrap" };
    assert_eq!(helper_frames.last().map(|f| f.0.as_str()), Some(bootstrap), "{helper}");
    if old {
        // No TID in a thread state before 3.11: the pthread_t only.
        assert!(threads.iter().all(|t| t["tid"].is_null() && t["pthread"].is_string()), "{read}");
    }
    assert!(threads.iter().all(|t| t["holds_gil"] == false), "both threads sleep without the GIL: {read}");
    let via = &read["current_thread_state"];
    match current {
        Current::Gilstate => {
            assert_eq!(via["via"], "_PyRuntime.gilstate.tstate_current", "{read}");
            assert_eq!(via["thread_state"], "0x0", "no thread holds the GIL: {read}");
        }
        Current::Dtv => assert_eq!(via["via"], "dtv", "{read}"),
        Current::FsMinus24 => assert_eq!((&via["via"], &via["offset"]), (&"fsbase".into(), &(-24).into()), "{read}"),
    }
    drop(sleeping);

    // Names stored one (Latin-1), two and four bytes a character, which
    // are laid out after a PyCompactUnicodeObject, not a PyASCIIObject.
    let names = Running::start(python, &["names"]);
    let read = stack(names.pid, &[]);
    let m = marks();
    let mut want = expected(&names.path, "sleep");
    want[1] = ("middle".to_owned(), names.path.clone(), m["middle-names"]);
    for (function, mark) in [("caf\u{e9}", "latin1"), ("\u{51fd}\u{6570}", "ucs2"), ("\u{20000}", "ucs4")] {
        want.insert(1, (function.to_owned(), names.path.clone(), m[mark]));
    }
    assert_eq!(frames(main_thread(&read)), want, "{read}");
    drop(names);

    let spinning = Running::start(python, &["spin"]);
    let read = stack(spinning.pid, &["--check-tls"]);
    let main = main_thread(&read);
    assert_eq!(frames(main), expected(&spinning.path, "spin"), "{read}");
    assert_eq!(main["holds_gil"], true, "{read}");
    let tstate = main["thread_state"].as_str().expect("a thread state");
    if current == Current::Gilstate {
        assert_eq!(read["current_thread_state"]["thread_state"], tstate, "{read}");
        assert!(read["tls_check"]["error"].as_str().is_some_and(|e| e.contains("no thread state in thread-local")));
    } else {
        let tasks = read["tls_check"]["tasks"].as_array().unwrap_or_else(|| panic!("tasks: {read}"));
        let own = tasks.iter().find(|t| t["tid"] == spinning.pid).unwrap_or_else(|| panic!("the main task: {read}"));
        assert_eq!(own["thread_state"], tstate, "_Py_tss_tstate through the fsbase is the main thread's: {read}");
    }
}

#[test]
fn pyenv_3_9() {
    check(PYENV_39, "3.9.", Current::Gilstate);
}

#[test]
fn pyenv_3_10() {
    check(PYENV_310, "3.10.", Current::Gilstate);
}

#[test]
fn pyenv_3_11() {
    check(PYENV_311, "3.11.", Current::Gilstate);
}

#[test]
fn pyenv_3_12() {
    check(PYENV_312, "3.12.", Current::Dtv);
}

#[test]
fn pyenv_3_13() {
    check(PYENV_313, "3.13.", Current::Dtv);
}

#[test]
fn debian_lto_3_11() {
    check(DEBIAN_311, "3.11.", Current::Gilstate);
}

#[test]
fn forky_lto_3_13() {
    check(FORKY_313, "3.13.", Current::FsMinus24);
}

#[test]
fn forky_lto_3_14() {
    check(FORKY_314, "3.14.", Current::FsMinus24);
}

/// In its own PID namespace, as a container runs it, the interpreter is
/// PID 1 there and its thread ids are the namespace's; the main thread is
/// still found (by its pthread id), the stack is the same, and the
/// thread-local is read through the host's view of its task.
#[test]
fn in_its_own_namespaces() {
    require_root();
    let python = Python::ForkyNamespaces("python3.14");
    let sleeping = Running::start(python, &["sleep"]);
    let read = stack(sleeping.pid, &[]);
    assert_eq!(read["pid_in_namespace"], 1, "{read}");
    let main = main_thread(&read);
    assert_eq!(main["tid"], 1, "the namespace's TID: {read}");
    assert_eq!(frames(main), expected(&sleeping.path, "sleep"), "{read}");
    drop(sleeping);
    let spinning = Running::start(python, &["spin"]);
    let read = stack(spinning.pid, &["--check-tls"]);
    let main = main_thread(&read);
    assert_eq!(frames(main), expected(&spinning.path, "spin"), "{read}");
    let tasks = read["tls_check"]["tasks"].as_array().unwrap_or_else(|| panic!("tasks: {read}"));
    let own = tasks.iter().find(|t| t["tid"] == spinning.pid).unwrap_or_else(|| panic!("the host task: {read}"));
    assert_eq!(own["thread_state"], main["thread_state"], "{read}");
}

/// 200 calls deep: every frame is read by default, and `--max-depth` cuts
/// the stack there and says so.
#[test]
fn deep_stacks_are_read_whole_or_truncated_at_the_limit() {
    require_root();
    let m = marks();
    let deep = Running::start(PYENV_313, &["deep", "200"]);
    let read = stack(deep.pid, &[]);
    let all = frames(main_thread(&read));
    let names: Vec<&str> = all.iter().map(|f| f.0.as_str()).collect();
    // leaf, recurse(0) .. recurse(200), middle, main, <module>.
    assert_eq!(names.len(), 205, "{names:?}");
    assert_eq!(names[..2], ["leaf", "recurse"]);
    assert!(names[1..202].iter().all(|n| *n == "recurse"), "{names:?}");
    assert_eq!(names[202..], ["middle", "main", "<module>"]);
    assert_eq!((all[1].2, all[2].2, all[202].2), (m["recurse-leaf"], m["recurse"], m["middle-deep"]));
    assert_eq!(main_thread(&read)["truncated"], false);
    let cut = stack(deep.pid, &["--max-depth", "64"]);
    let main = main_thread(&cut);
    assert_eq!(frames(main), all[..64], "{cut}");
    assert_eq!(main["truncated"], true, "{cut}");
}

/// A line table past the 2^24 bytes tracer reads of one (a function's is
/// far shorter; this one is leaf's own, padded): the thread whose frame
/// needs it gives, in place of its frames, the table's size and the
/// limit, and the exit status is 1; the other thread is read whole.
#[test]
fn a_line_table_past_the_limit_is_refused_and_said() {
    require_root();
    let long = Running::start(PYENV_313, &["long-lines"]);
    let pid = long.pid.to_string();
    let (code, stdout, stderr) = run_tracer(&["stack", "--pid", &pid, "--json"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stderr, "tracer: error: the frames of 1 of 2 threads could not be read (see above)\n");
    let read: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON: {stdout}: {e}"));
    let error = main_thread(&read)["error"].as_str().unwrap_or_else(|| panic!("no error: {read}"));
    let size = 1 << 24;
    assert!(error.contains(" cannot be read as a string: its size "), "{error}");
    assert!(error.starts_with("the co_linetable at 0x") && error.ends_with(&format!(" is beyond {size}")), "{error}");
    let helper = read["threads"].as_array().expect("threads").iter().find(|t| t["main"] == false).expect("the helper");
    let names: Vec<String> = frames(helper).into_iter().map(|f| f.0).collect();
    assert!(names.iter().any(|n| n == "helper_wait"), "{helper}");
    // The table says the same, on the thread's line.
    let (code, table, _) = run_tracer(&["stack", "--pid", &pid]);
    assert_eq!(code, Some(1));
    assert!(table.contains(&format!("    (cannot read its frames: {error})")), "{table}");
}

/// Threads that call and return all the time, read again and again
/// without being stopped: a read can fail for a thread whose frames changed
/// under it (exit status 1, the error in its place), never crash, and what
/// is read is a stack of the script's functions.
#[test]
fn running_threads_are_read_without_crashing() {
    require_root();
    for python in [FORKY_314, DEBIAN_311, PYENV_312] {
        let running = Running::start(python, &["churn"]);
        let pid = running.pid.to_string();
        let mut whole = 0;
        for _ in 0..50 {
            let (code, stdout, stderr) = run_tracer(&["stack", "--pid", &pid, "--json"]);
            assert!(matches!(code, Some(0 | 1)), "{python:?}: exit {code:?}: {stderr}");
            let read: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{python:?}: {stdout}: {e}"));
            let threads = read["threads"].as_array().expect("threads");
            assert_eq!(threads.len(), 4, "{read}");
            for t in threads.iter().filter(|t| t.get("error").is_none()) {
                let names: Vec<String> = frames(t).into_iter().map(|f| f.0).collect();
                assert!(names.iter().any(|n| n == "churning"), "{python:?}: {names:?}");
            }
            whole += usize::from(code == Some(0));
        }
        assert!(whole > 0, "{python:?}: no read of all four threads succeeded in 50");
    }
}

/// Every bad input is one line on stderr with exit status 2, and nothing
/// on stdout.
#[test]
fn bad_input_is_one_line_and_exit_status_2() {
    require_root();
    let bad = |args: &[&str], starts: &str, contains: &str| {
        let (code, stdout, stderr) = run_tracer(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert_eq!(stdout, "", "{args:?}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with(&format!("tracer: error: {starts}")), "{args:?}: {stderr}");
        assert!(stderr.contains(contains), "{args:?}: {stderr}");
    };
    bad(&["stack", "--pid", "0"], "--pid 0 is not a process", "");
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max").expect("pid_max");
    bad(&["stack", "--pid", pid_max.trim()], &format!("no process with PID {}", pid_max.trim()), "");
    bad(&["stack", "--pid", "2"], "PID 2 (kthreadd) is a kernel thread", "");
    let sleeper = KillOnDrop(Command::new("sleep").arg("60").spawn().expect("sleep"));
    bad(
        &["stack", "--pid", &sleeper.id().to_string()],
        &format!("PID {} (sleep, ", sleeper.id()),
        "is not a Python process",
    );
    bad(
        &["stack", "--pid", "1", "--max-depth", "0"],
        "invalid value '0' for '--max-depth <FRAMES>'",
        "tracer stack --help",
    );
    bad(&["stack"], "the following required arguments were not provided", "--pid");
    // A CPython outside the supported range: the error names the range.
    let old = "/root/.pyenv/versions/3.8.18/bin/python3";
    assert!(Path::new(old).is_file(), "{old} is missing: pyenv's 3.8.18 is part of this machine kind");
    let mut child = KillOnDrop(
        Command::new(old)
            .args(["-c", "print('ready', flush=True); import time; time.sleep(3600)"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("python 3.8"),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().expect("stdout")).read_line(&mut line).expect("ready");
    assert_eq!(line, "ready\n");
    let pid = child.id();
    // 3.8 has no Py_Version: its version is read from Py_GetVersion's
    // PY_VERSION, and refused by name.
    bad(
        &["stack", "--pid", &pid.to_string()],
        &format!("PID {pid} runs Python 3.8.18, which tracer does not support"),
        "supported: 3.9, 3.10, 3.11, 3.12, 3.13, 3.14",
    );
}
