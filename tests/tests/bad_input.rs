//! Every bad input: one line on stderr naming the problem and the fix,
//! exit status 2, nothing on stdout, nothing attached.

use std::{os::unix::fs::PermissionsExt as _, process::Command};

use tracer_tests::{
    KillOnDrop, Workload, attached_probes, probe_sites, read_sites, require_root, run_tracer, shared_python, tracer_bin,
};

fn assert_bad_input(args: &[&str], expected: &str) {
    let (code, stdout, stderr) = run_tracer(args);
    assert_eq!(stderr, format!("tracer: error: {expected}\n"), "args {args:?}");
    assert_eq!(code, Some(2), "args {args:?}: {stderr}");
    assert_eq!(stdout, "", "args {args:?}");
}

#[test]
fn pid_that_does_not_exist() {
    require_root();
    let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max").unwrap().trim().parse().unwrap();
    // PIDs are always below pid_max.
    let pid = pid_max.to_string();
    assert_bad_input(
        &["attach", "--pid", &pid],
        &format!("no process with PID {pid}; check the PID with `pgrep -a python`"),
    );
}

#[test]
fn process_that_is_not_python() {
    require_root();
    let sleeper = KillOnDrop(Command::new("sleep").arg("60").spawn().unwrap());
    let pid = sleeper.id();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert_bad_input(
        &["attach", "--pid", &pid.to_string()],
        &format!(
            "PID {pid} (sleep, {}) is not a Python process: no libpython is mapped and the executable has no CPython symbols; pass the PID of a CPython process (for a launcher script, its python child)",
            exe.display()
        ),
    );
}

#[test]
fn kernel_thread() {
    require_root();
    // PID 2 is kthreadd on every Linux system.
    assert_bad_input(
        &["attach", "--pid", "2"],
        "PID 2 (kthreadd) is a kernel thread, not a Python process; pass the PID of a CPython process",
    );
}

#[test]
fn tracers_own_pid() {
    require_root();
    // `exec` keeps the shell's PID, so $$ is tracer's own.
    let out = Command::new("sh")
        .args(["-c", &format!("exec '{}' attach --pid $$", tracer_bin().display())])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("tracer: error: PID ")
            && stderr.ends_with(" is tracer itself; pass the PID of the CPython process to trace\n")
            && stderr.lines().count() == 1,
        "{stderr}"
    );
}

#[test]
fn thread_id_instead_of_pid() {
    require_root();
    let workload = Workload::serve(&shared_python());
    let pid = workload.pid();
    let tid = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|&t| t != pid)
        .expect("the serve workload has a second thread");
    // Every subcommand that takes a PID, alike.
    for sub in ["attach", "heap", "stack", "probes"] {
        assert_bad_input(
            &[sub, "--pid", &tid.to_string()],
            &format!("{tid} is a thread of process {pid}, not a process; pass --pid {pid}"),
        );
    }
}

#[test]
fn zero_interval() {
    require_root();
    let workload = Workload::serve(&shared_python());
    assert_bad_input(
        &["attach", "--pid", &workload.pid().to_string(), "--interval", "0"],
        "--interval must be a number of seconds greater than 0 and at most 315360000 (got 0); try --interval 1",
    );
}

#[test]
fn budget_out_of_range() {
    require_root();
    let workload = Workload::serve(&shared_python());
    for (value, shown) in [("0", "0"), ("0.0000001", "0.0000001"), ("-1", "-1"), ("150", "150")] {
        assert_bad_input(
            &["attach", "--pid", &workload.pid().to_string(), &format!("--budget={value}")],
            &format!(
                "--budget must be a percentage of the target's CPU time from 0.01 to 100 (got {shown}); e.g. --budget 1"
            ),
        );
    }
}

#[test]
fn unknown_link_kind() {
    require_root();
    let workload = Workload::serve(&shared_python());
    assert_bad_input(
        &["attach", "--pid", &workload.pid().to_string(), "--links", "bpf"],
        "invalid value 'bpf' for '--links <HOW>'; possible values: auto, multi, perf; a similar value exists: 'perf'; see `tracer attach --help`",
    );
}

#[test]
fn conflicting_options() {
    require_root();
    let workload = Workload::serve(&shared_python());
    let pid = workload.pid().to_string();
    assert_bad_input(
        &["attach", "--pid", &pid, "--placement", "call-sites", "--links", "perf"],
        "--placement call-sites attaches thousands of uprobes, which only uprobe-multi links can detach quickly; drop --links perf",
    );
    assert_bad_input(
        &["attach", "--pid", &pid, "--placement", "call-sites", "--budget", "1"],
        "--budget cannot be combined with --placement call-sites: adding and removing thousands of call-site probes takes far longer than a budget window; use one or the other",
    );
    assert_bad_input(
        &["attach", "--pid", &pid, "--returns", "--budget", "1"],
        "--budget cannot be combined with --returns: the budget prices only the counting probes, and return counts are not estimated from windows; use one or the other",
    );
}

/// Malformed command lines: clap's own errors, folded to one line that
/// points at the right `--help`.
#[test]
fn usage_errors() {
    assert_bad_input(
        &["attach", "--pid", "abc"],
        "--pid abc is not a process ID (a whole number above 0); pass the PID of a running CPython process (e.g. from `pgrep python`)",
    );
    assert_bad_input(
        &["attach"],
        "the following required arguments were not provided: <--pid <PID>|--exe <PATH>|--name <PATTERN>|--all>; see `tracer attach --help`",
    );
    assert_bad_input(
        &["probes", "--pid", "1", "--exe", "/usr/bin/python3"],
        "the argument '--pid <PID>' cannot be used with '--exe <PATH>'; see `tracer probes --help`",
    );
    assert_bad_input(&["xyzzy"], "unrecognized subcommand 'xyzzy'; see `tracer --help`");
    assert_bad_input(
        &["attach", "--pid", "1", "--duration", "1e19"],
        "--duration must be a number of seconds greater than 0 and at most 315360000 (got 10000000000000000000); omit it to run until Ctrl-C",
    );
}

/// A negative number is the flag's value, refused by that flag's check,
/// not an unknown flag: the message names the flag and the fix.
#[test]
fn negative_numbers() {
    require_root();
    let workload = Workload::serve(&shared_python());
    let pid = workload.pid().to_string();
    for (flag, error) in [
        (
            "--duration",
            "--duration must be a number of seconds greater than 0 and at most 315360000 (got -1); omit it to run until Ctrl-C",
        ),
        (
            "--interval",
            "--interval must be a number of seconds greater than 0 and at most 315360000 (got -1); try --interval 1",
        ),
        (
            "--budget",
            "--budget must be a percentage of the target's CPU time from 0.01 to 100 (got -1); e.g. --budget 1",
        ),
        ("--top", "--top must be a whole number above 0 (got -1); e.g. --top 10"),
        ("--leaks", "--leaks must be a whole number above 0 (got -1); e.g. --leaks 20"),
    ] {
        assert_bad_input(&["attach", "--pid", &pid, flag, "-1"], error);
    }
    for sub in ["attach", "probes", "stack", "heap"] {
        assert_bad_input(
            &[sub, "--pid", "-5"],
            "--pid -5 is not a process ID (a whole number above 0); pass the PID of a running CPython process (e.g. from `pgrep python`)",
        );
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    assert!(!maps.contains("[uprobes]"), "a uprobe was left behind: {maps}");
}

/// A count of 0 would list nothing: refused alike by every flag that
/// lists the first N of something.
#[test]
fn zero_counts() {
    require_root();
    let workload = Workload::serve(&shared_python());
    let pid = workload.pid().to_string();
    assert_bad_input(
        &["attach", "--pid", &pid, "--top", "0"],
        "--top 0 would list no site; pass the number of sites to list, e.g. --top 10",
    );
    assert_bad_input(
        &["attach", "--pid", &pid, "--leaks", "0"],
        "--leaks 0 would list no block; pass the number of blocks to list, e.g. --leaks 20",
    );
    assert_bad_input(
        &["heap", "--pid", &pid, "--top", "0"],
        "--top 0 would list no type; pass the number of types to list, e.g. --top 25",
    );
    assert_bad_input(
        &["report", "/nonexistent/record.jsonl", "--diff", "1", "2", "--top", "0"],
        "--top 0 would list no type; pass the number of types to list, e.g. --top 25",
    );
}

#[test]
fn zero_duration() {
    require_root();
    let workload = Workload::serve(&shared_python());
    assert_bad_input(
        &["attach", "--pid", &workload.pid().to_string(), "--duration", "0"],
        "--duration must be a number of seconds greater than 0 and at most 315360000 (got 0); omit it to run until Ctrl-C",
    );
}

#[test]
fn not_root() {
    require_root();
    let mut workload = Workload::serve(&shared_python());
    let pid = workload.pid();
    // The unprivileged user must be able to reach the binary.
    let dir = std::env::temp_dir().join(format!("tracer-test-nonroot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.join("tracer");
    std::fs::copy(tracer_bin(), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"])
        .arg(&bin)
        .args(["attach", "--pid", &pid.to_string()])
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "tracer: error: tracer needs root (or CAP_BPF and CAP_PERFMON) to load BPF programs and attach uprobes, and uid 65534 has neither; run it with sudo\n"
    );
    assert_eq!(out.status.code(), Some(2));
    // Nothing was attached: the code equals the file.
    let libpython = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5).map(str::to_owned))
        .find(|p| p.contains("libpython"))
        .expect("the shared test python maps libpython");
    let symbols = attached_probes(&serde_json::json!({"probes": ["_Py_NewReference", "PyObject_Malloc"]}));
    let sites = probe_sites(pid, &libpython, &symbols);
    for (site, bytes) in sites.iter().zip(read_sites(pid, &sites)) {
        assert_eq!(bytes, site.file_bytes, "{}", site.symbol);
    }
    workload.ping();
}

/// `--probes` naming no function: the message once, not twice joined by a
/// colon (a wrapper's message and its cause's).
#[test]
fn unknown_probe_name_is_named_once() {
    let python = shared_python();
    let (code, stdout, stderr) = run_tracer(&["probes", "--exe", python.to_str().unwrap(), "--probes", "nonexistent"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stdout, "");
    let known = "_Py_NewReference, _Py_Dealloc, PyObject_Malloc, PyObject_Calloc, PyObject_Realloc, PyObject_Free, \
                 PyMem_Malloc, PyMem_Calloc, PyMem_Realloc, PyMem_Free, PyMem_RawMalloc, PyMem_RawCalloc, \
                 PyMem_RawRealloc, PyMem_RawFree, _Py_NewReferenceNoTotal";
    assert_eq!(
        stderr,
        format!(
            "tracer: error: --probes names nonexistent, which tracer does not probe; choose from default, refs, alloc or: {known}\n"
        )
    );
}

/// A function another version has but this one lacks is refused for this
/// version, by name.
#[test]
fn probe_this_version_lacks() {
    let (code, _, stderr) =
        run_tracer(&["probes", "--exe", "/usr/bin/python3.11", "--probes", "_Py_NewReferenceNoTotal"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.starts_with("tracer: error: --probes names _Py_NewReferenceNoTotal, which Python 3.11.")
            && stderr.ends_with(" does not have; drop it from --probes\n"),
        "{stderr}"
    );
}

/// The capability bits `pid` is permitted that this process lacks.
fn capability_bits_lacking(pid: u32) -> Vec<u32> {
    let field = |path: String, name: &str| -> u64 {
        let status = std::fs::read_to_string(path).unwrap();
        let hex = status.lines().find_map(|l| l.strip_prefix(name)).unwrap().trim().to_owned();
        u64::from_str_radix(&hex, 16).unwrap()
    };
    let mine = field("/proc/self/status".into(), "CapEff:");
    let theirs = field(format!("/proc/{pid}/status"), "CapPrm:");
    (0..64).filter(|b| theirs & !mine & (1 << b) != 0).collect()
}

/// As root, a process the kernel will not let tracer inspect gets the real
/// reason, not "tracer must run as root". Here PID 1 holds capabilities
/// that root in this sandbox lacks; where it holds none that tracer lacks
/// and can be read, it is simply not Python.
#[test]
fn a_process_root_may_not_inspect() {
    require_root();
    for command in ["attach", "probes"] {
        check_pid_1(command);
    }
}

fn check_pid_1(command: &str) {
    let (code, stdout, stderr) = run_tracer(&[command, "--pid", "1"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stdout, "");
    assert!(!stderr.contains("must run as root"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let lacking = capability_bits_lacking(1);
    if lacking.is_empty() {
        assert!(std::fs::read_to_string("/proc/1/maps").is_ok(), "PID 1 is unreadable for another reason: {stderr}");
        assert!(stderr.contains("is not a Python process"), "{stderr}");
    } else {
        let (head, tail) = (
            "tracer: error: the kernel denied tracer access to /proc/1/maps of PID 1 although tracer runs as root: PID 1 holds capabilities that tracer lacks (",
            "), and only a process with all of them may inspect it; trace another process, or run tracer where it has those capabilities (outside this container or sandbox)\n",
        );
        let names = stderr.strip_prefix(head).and_then(|s| s.strip_suffix(tail)).unwrap_or_else(|| panic!("{stderr}"));
        let names: Vec<&str> = names.split(", ").collect();
        assert_eq!(names.len(), lacking.len(), "one name per capability bit {lacking:?}: {names:?}");
        assert!(names.iter().all(|n| n.starts_with("cap_")), "{names:?}");
        // include/uapi/linux/capability.h: CAP_SYS_RESOURCE is 24, the one
        // root lacks in this project's sandbox.
        assert_eq!(lacking.contains(&24), names.contains(&"cap_sys_resource"), "{names:?}");
    }
}

/// A `--debug-dir` that does not exist is named, before anything attaches.
#[test]
fn debug_dir_that_does_not_exist() {
    let (code, stdout, stderr) =
        run_tracer(&["probes", "--exe", "/usr/bin/python3.11", "--debug-dir", "/no/such/debug"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stdout, "");
    assert!(
        stderr.starts_with("tracer: error: --debug-dir /no/such/debug: ")
            && stderr.ends_with("; give a directory that exists\n"),
        "{stderr}"
    );
}

/// Inlined copies need multi links: with `--links perf` tracer says so,
/// and how to go on, rather than take minutes to detach.
#[test]
fn inlined_copies_with_perf_links() {
    require_root();
    let (code, stdout, stderr) =
        run_tracer(&["attach", "--exact", "--exe", "/usr/bin/python3.11", "--links", "perf", "--duration", "1"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stdout, "");
    assert!(
        stderr.starts_with("tracer: error: --links perf cannot attach the ")
            && stderr.ends_with(" uprobes of inlined copies in reasonable time (perf-event uprobes detach about 0.13 s apart); drop --links perf, or pass --no-inlined\n"),
        "{stderr}"
    );
}
