//! Least privilege (issue 26): tracer as an unprivileged user, with the
//! capabilities docs/attach.md lists and nothing more (`setpriv`, the
//! target a root process as usual): `tracer heap` with `CAP_BPF`,
//! `CAP_PERFMON`, `CAP_SYS_PTRACE` and `CAP_DAC_READ_SEARCH`; `tracer
//! attach` with `CAP_SYS_ADMIN` too; with none, the one-line error and exit
//! status 2.

use std::process::{Command, Output};

use tracer_tests::{Workload, require_root, shared_python, tracer_bin};

/// `tracer ARGS` as uid and gid 65534 (nobody) holding `caps` (setpriv's
/// names, e.g. `bpf,perfmon`; empty: none).
fn as_nobody(caps: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"]);
    if caps.is_empty() {
        cmd.arg("--inh-caps=-all");
    } else {
        let list: Vec<String> = caps.split(',').map(|c| format!("+{c}")).collect();
        let list = list.join(",");
        cmd.arg(format!("--inh-caps={list}")).arg(format!("--ambient-caps={list}"));
    }
    cmd.arg(tracer_bin()).args(args).output().expect("setpriv (util-linux) runs tracer")
}

const HEAP_CAPS: &str = "bpf,perfmon,sys_ptrace,dac_read_search";
const ATTACH_CAPS: &str = "bpf,perfmon,sys_ptrace,dac_read_search,sys_admin";

#[test]
fn tracer_runs_with_the_capabilities_the_docs_list() {
    require_root();
    let python = shared_python();
    let mut workload = Workload::serve(&python);
    let pid = workload.pid().to_string();

    let none = as_nobody("", &["attach", "--pid", &pid, "--duration", "1"]);
    let stderr = String::from_utf8_lossy(&none.stderr);
    assert_eq!(none.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr,
        "tracer: error: tracer needs root (or CAP_BPF and CAP_PERFMON) to load BPF programs and attach uprobes, and uid 65534 has neither; run it with sudo\n"
    );

    let heap = as_nobody(HEAP_CAPS, &["heap", "--pid", &pid, "--json"]);
    let stderr = String::from_utf8_lossy(&heap.stderr);
    assert!(heap.status.success(), "tracer heap with {HEAP_CAPS}: {stderr}");
    let census: serde_json::Value = serde_json::from_slice(&heap.stdout).expect("the census as JSON");
    assert!(census["types"].as_array().is_some_and(|t| !t.is_empty()), "{census}");

    let attach = as_nobody(ATTACH_CAPS, &["attach", "--pid", &pid, "--duration", "1", "--json"]);
    let stderr = String::from_utf8_lossy(&attach.stderr);
    assert!(attach.status.success(), "tracer attach with {ATTACH_CAPS}: {stderr}");
    let stdout = String::from_utf8_lossy(&attach.stdout);
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().expect("a summary")).expect("JSON");
    assert_eq!(summary["end"], "duration", "{summary}");
    workload.ping();
}

/// Debian's python3.11 (world-readable, so no `CAP_DAC_READ_SEARCH`; its
/// memory read with `process_vm_readv`, so no `CAP_DAC_OVERRIDE`): `tracer
/// attach` as uid 65534 with `CAP_BPF`, `CAP_PERFMON`, `CAP_SYS_PTRACE`
/// and `CAP_SYS_ADMIN` in both modes; and without either of the last two
/// in turn, a one-line error naming the one missing. (This kernel refuses
/// a uprobe's perf event to `CAP_PERFMON` alone, and `CAP_SYS_ADMIN`
/// implies `CAP_BPF` and `CAP_PERFMON`, so neither of those can be
/// missed alone here.)
#[test]
fn attach_needs_exactly_the_capabilities_the_docs_list() {
    require_root();
    let mut workload = Workload::serve(std::path::Path::new(tracer_tests::STATIC_PYTHON));
    let pid = workload.pid().to_string();
    let all = ["bpf", "perfmon", "sys_ptrace", "sys_admin"];
    for mode in [&[][..], &["--exact"][..]] {
        let mut args = vec!["attach", "--pid", &pid, "--duration", "1", "--json"];
        args.extend_from_slice(mode);
        let attach = as_nobody(&all.join(","), &args);
        let stderr = String::from_utf8_lossy(&attach.stderr);
        assert!(attach.status.success(), "tracer attach {mode:?} with {all:?}: {stderr}");
        let stdout = String::from_utf8_lossy(&attach.stdout);
        let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().expect("a summary")).expect("JSON");
        assert_eq!(summary["end"], "duration", "{summary}");
    }
    for missing in ["sys_ptrace", "sys_admin"] {
        let caps: Vec<&str> = all.iter().copied().filter(|c| *c != missing).collect();
        let out = as_nobody(&caps.join(","), &["attach", "--pid", &pid, "--duration", "1"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "without {missing}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "without {missing}: {stderr}");
        let name = format!("CAP_{}", missing.to_uppercase());
        assert!(stderr.contains(&name), "without {missing}, the error names {name}: {stderr}");
    }
    workload.ping();
}

/// `--name` as uid 65534 with no capability: a pattern matching one CPython
/// process of its own and one of root's, which it may not inspect, plans
/// for its own and says in a warning note what it skipped and why (the
/// other may be the one meant).
#[test]
fn name_says_which_match_it_may_not_inspect() {
    require_root();
    let marker = format!("name-uninspectable-{}", std::process::id());
    let script = format!("import time; print('ready', flush=True); time.sleep(60)  # {marker}");
    let start = |nobody: bool| {
        let mut cmd = Command::new("setpriv");
        if nobody {
            cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"]);
        }
        let mut child = cmd
            .args([tracer_tests::STATIC_PYTHON, "-c", &script])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("setpriv runs python");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().expect("stdout")), &mut line)
            .expect("ready");
        assert_eq!(line, "ready\n");
        child
    };
    let mut own = start(true);
    let mut roots = start(false);
    let out = as_nobody("", &["probes", "--name", &marker, "--json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr, "");
    let (own_pid, root_pid) = (own.id(), roots.id());
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the plan as JSON");
    assert_eq!(plan["image"], tracer_tests::STATIC_PYTHON, "{plan}");
    let warning = serde_json::json!({
        "level": "warning",
        "code": "target",
        "message": format!(
            "--name \"{marker}\" also matches PID {root_pid}, which tracer cannot inspect (cannot read memory map of PID {root_pid}: Permission Denied: /proc/{root_pid}/maps; as another user than root, tracer needs CAP_SYS_PTRACE to inspect another user's process: grant it, or run tracer with sudo): tracing PID {own_pid}, the one CPython process it matches that tracer can; pass --pid to choose"
        ),
    });
    assert_eq!(plan["notes"].as_array().and_then(|n| n.first()), Some(&warning), "{plan}");
    for child in [&mut own, &mut roots] {
        let _ = child.kill();
        let _ = child.wait();
    }
}
