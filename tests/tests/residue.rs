//! Residue: while attached the target's code holds the breakpoint at every
//! probe; after tracer ends, however it ends, the code equals the ELF
//! file's bytes and the target keeps running. Another process running the
//! same interpreter never holds a breakpoint.

use std::{path::Path, thread::sleep, time::Duration};

use tracer_tests::{
    INT3, ProbeSite, TracerRun, Workload, attached_probes, probe_sites, pyperf_venv, read_sites, require_root,
    run_tracer, shared_python, sites_in_file, static_python,
};

#[derive(Clone, Copy, Debug)]
enum Ending {
    Sigint,
    Sigterm,
    Duration,
    Sigkill,
}

/// Ends `tracer` as `ending` says (`--duration` ends it by itself) and
/// checks how it ended: killed, or with a summary saying why.
fn end(tracer: TracerRun, ending: Ending) {
    match ending {
        Ending::Sigint => tracer.signal(libc::SIGINT),
        Ending::Sigterm => tracer.signal(libc::SIGTERM),
        Ending::Sigkill => tracer.signal(libc::SIGKILL),
        Ending::Duration => {}
    }
    let (status, lines, stderr) = tracer.finish();
    if let Ending::Sigkill = ending {
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
        return;
    }
    assert!(status.success(), "{ending:?}: {status}: {stderr}");
    let summary = lines.last().expect("summary");
    assert_eq!(summary["type"], "summary", "{ending:?}");
    let (end, signal) = match ending {
        Ending::Sigint => ("signal", Some("SIGINT")),
        Ending::Sigterm => ("signal", Some("SIGTERM")),
        _ => ("duration", None),
    };
    assert_eq!(summary["end"], end);
    assert_eq!(summary["signal"].as_str(), signal);
}

fn check(python: &Path, ending: Ending) {
    require_root();
    let mut workload = Workload::serve(python);
    let pid = workload.pid();
    // Another process on the same interpreter, which --pid must not touch.
    let mut bystander = Workload::serve(python);
    let extra: &[&str] = match ending {
        Ending::Duration => &["--duration", "1"],
        _ => &[],
    };
    let (tracer, attached) = TracerRun::attach_json(pid, extra);
    let image = attached["python"]["image"].as_str().expect("image");
    let symbols = attached_probes(&attached);
    assert!(!symbols.is_empty());
    // The function each probe is in: its own, or for a free probed at its
    // allocator's implementation (pyenv's, with --pid), that one.
    let functions: Vec<String> =
        symbols.iter().map(|s| attached["placements"][s]["function"].as_str().unwrap_or(s).to_owned()).collect();
    if python == shared_python() {
        assert!(functions.contains(&"_PyObject_Free".to_owned()), "{attached}");
    }
    let sites = probe_sites(pid, image, &functions);

    let live = read_sites(pid, &sites);
    for ((site, bytes), symbol) in sites.iter().zip(&live).zip(&symbols) {
        // The breakpoint sits where tracer placed the probe.
        let offset = attached["placements"][symbol]["offset"].as_u64().expect("placement offset");
        let offset = usize::try_from(offset).unwrap();
        let changed: Vec<usize> = (0..bytes.len()).filter(|&i| bytes[i] != site.file_bytes[i]).collect();
        if attached["call_sites"].get(symbol).is_some() {
            // Probed at its callers (by default where nothing inside it is
            // emulated, tracing one process exactly): its own code is
            // untouched; `check_call_sites` below checks the callers.
            assert!(changed.is_empty(), "{}: bytes changed inside a function probed at its callers", site.symbol);
            continue;
        }
        assert_eq!(changed, [offset], "{} (+{offset}): bytes changed while attached", site.symbol);
        assert_eq!(bytes[offset], INT3, "{} at {:#x}+{offset} holds no breakpoint", site.symbol, site.address);
    }
    let bystander_sites = probe_sites(bystander.pid(), image, &symbols);
    for (site, bytes) in bystander_sites.iter().zip(read_sites(bystander.pid(), &bystander_sites)) {
        assert_eq!(bytes, site.file_bytes, "{}: a breakpoint in a process tracer was not asked to trace", site.symbol);
    }
    bystander.ping();

    end(tracer, ending);

    // The kernel removes a uprobe when its last perf event closes, which for
    // SIGKILL happens during tracer's exit; allow it a moment.
    let mut after = read_sites(pid, &sites);
    for _ in 0..20 {
        if after.iter().zip(&sites).all(|(b, s)| *b == s.file_bytes) {
            break;
        }
        sleep(Duration::from_millis(100));
        after = read_sites(pid, &sites);
    }
    for (site, bytes) in sites.iter().zip(&after) {
        assert_eq!(
            *bytes, site.file_bytes,
            "{ending:?}: {} at {:#x} differs from the ELF file after tracer left",
            site.symbol, site.address
        );
    }
    workload.ping();
}

#[test]
fn sigint_leaves_nothing() {
    check(&shared_python(), Ending::Sigint);
}

#[test]
fn sigterm_leaves_nothing() {
    check(&shared_python(), Ending::Sigterm);
}

#[test]
fn duration_leaves_nothing() {
    check(&shared_python(), Ending::Duration);
}

#[test]
fn sigkill_leaves_nothing() {
    check(&shared_python(), Ending::Sigkill);
}

#[test]
fn static_python_sigint_leaves_nothing() {
    check(&static_python(), Ending::Sigint);
}

#[test]
fn static_python_sigkill_leaves_nothing() {
    check(&static_python(), Ending::Sigkill);
}

/// `--placement call-sites`: a breakpoint on every one of `_Py_Dealloc`'s
/// thousands of call sites the target has mapped, in libpython (or the
/// executable) and the extension modules, and none left after tracer ends.
fn check_call_sites(python: &Path, ending: Ending) {
    require_root();
    let mut workload = Workload::serve(python);
    let pid = workload.pid();
    let args = ["--placement", "call-sites", "--probes", "_Py_Dealloc"];
    // Long enough for the plan's listing and the reads below.
    let duration: &[&str] = if let Ending::Duration = ending { &["--duration", "8"] } else { &[] };
    let (tracer, attached) = TracerRun::attach_json(pid, &[&args[..], duration].concat());
    assert!(attached["placements"]["_Py_Dealloc"]["reason"].as_str().unwrap().starts_with("call sites:"), "{attached}");
    // The plan tracer attached, with every site listed.
    let pid_arg = pid.to_string();
    let (code, stdout, stderr) = run_tracer(&[&["probes", "--pid", &pid_arg, "--json"][..], &args].concat());
    assert_eq!(code, Some(0), "{stderr}");
    let plan: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let mut sites: Vec<ProbeSite> = Vec::new();
    for file in plan["probes"][0]["call_sites"]["files"].as_array().expect("files") {
        let offsets: Vec<u64> = file["offsets"].as_array().unwrap().iter().map(|o| o.as_u64().unwrap()).collect();
        sites.extend(sites_in_file(pid, file["path"].as_str().unwrap(), &offsets));
    }
    assert!(sites.len() > 1000, "{} mapped call sites", sites.len());
    for (site, bytes) in sites.iter().zip(read_sites(pid, &sites)) {
        assert_eq!(bytes, [INT3], "{} holds no breakpoint while attached", site.symbol);
    }
    end(tracer, ending);
    let mut after = read_sites(pid, &sites);
    for _ in 0..100 {
        if after.iter().zip(&sites).all(|(b, s)| *b == s.file_bytes) {
            break;
        }
        sleep(Duration::from_millis(100));
        after = read_sites(pid, &sites);
    }
    for (site, bytes) in sites.iter().zip(&after) {
        assert_eq!(*bytes, site.file_bytes, "{ending:?}: {} differs from the file after tracer left", site.symbol);
    }
    workload.ping();
}

#[test]
fn call_sites_sigint_leaves_nothing() {
    check_call_sites(&shared_python(), Ending::Sigint);
}

#[test]
fn call_sites_sigterm_leaves_nothing() {
    check_call_sites(&shared_python(), Ending::Sigterm);
}

#[test]
fn call_sites_duration_leaves_nothing() {
    check_call_sites(&shared_python(), Ending::Duration);
}

#[test]
fn call_sites_sigkill_leaves_nothing() {
    check_call_sites(&shared_python(), Ending::Sigkill);
}

#[test]
fn static_python_call_sites_leave_nothing() {
    check_call_sites(&static_python(), Ending::Sigint);
}

/// A module the target maps after tracer attached with call sites (psutil's
/// C extension from the pyperf venv: neither mapped at attach time nor in
/// lib-dynload) gets its calls to `_Py_Dealloc` probed at the next
/// interval, says so on stderr, and holds nothing after tracer ends.
#[test]
fn call_sites_in_a_module_imported_later() {
    require_root();
    let site_packages = pyperf_venv().join("lib/python3.11/site-packages");
    let module = site_packages.join("psutil/_psutil_linux.abi3.so");
    assert!(module.is_file(), "{} is missing: run `cargo xtask setup`", module.display());
    let mut workload = Workload::serve(&shared_python());
    let pid = workload.pid();
    let args = ["--placement", "call-sites", "--probes", "_Py_Dealloc", "--interval", "0.1"];
    let (tracer, _) = TracerRun::attach_json(pid, &args);
    workload.import(&site_packages, "psutil._psutil_linux");
    let pid_arg = pid.to_string();
    let (code, stdout, stderr) = run_tracer(&[&["probes", "--pid", &pid_arg, "--json"][..], &args[..4]].concat());
    assert_eq!(code, Some(0), "{stderr}");
    let plan: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let files = plan["probes"][0]["call_sites"]["files"].as_array().expect("files");
    let file = files.iter().find(|f| f["path"] == module.to_str().unwrap()).expect("psutil's module in the plan");
    let offsets: Vec<u64> = file["offsets"].as_array().unwrap().iter().map(|o| o.as_u64().unwrap()).collect();
    let sites = sites_in_file(pid, module.to_str().unwrap(), &offsets);
    assert!(!sites.is_empty());
    // Probed at the next interval.
    wait_for_breakpoints(pid, &sites, "after the import");
    tracer.signal(libc::SIGINT);
    let (status, stdout, stderr) = tracer.finish();
    assert!(status.success(), "{status}: {stderr}");
    // The JSON says from when the module's calls count, so a consumer can
    // tell its counts before then are short.
    let summary = stdout.last().expect("a summary line");
    assert_eq!(summary["type"], "summary");
    let late = summary["late_modules"].as_array().expect("late_modules");
    assert_eq!(late.len(), 1, "{late:?}");
    assert_eq!(late[0]["path"], module.to_str().unwrap());
    assert_eq!(late[0]["symbol"], "_Py_Dealloc");
    assert_eq!(late[0]["sites"], sites.len());
    assert_eq!(late[0]["escape"], serde_json::Value::Null);
    assert!(late[0]["since_s"].as_f64().is_some_and(|s| s > 0.0), "{late:?}");
    let note = format!(
        "tracer: note: {} was mapped after attaching; its {} calls to _Py_Dealloc are probed from ",
        module.display(),
        sites.len()
    );
    // The cost warning may come first: the calibration starts early.
    assert!(stderr.lines().any(|l| l.starts_with(&note)), "{stderr}");
    for (site, bytes) in sites.iter().zip(read_sites(pid, &sites)) {
        assert_eq!(bytes, site.file_bytes, "{} differs from the file after tracer left", site.symbol);
    }
    workload.ping();
}

/// Waits up to 5 s for every site to hold a breakpoint, then asserts they do.
fn wait_for_breakpoints(pid: u32, sites: &[ProbeSite], when: &str) {
    let mut live = read_sites(pid, sites);
    for _ in 0..50 {
        if live.iter().all(|b| *b == [INT3]) {
            break;
        }
        sleep(Duration::from_millis(100));
        live = read_sites(pid, sites);
    }
    for (site, bytes) in sites.iter().zip(&live) {
        assert_eq!(*bytes, [INT3], "{} holds no breakpoint {when}", site.symbol);
    }
}

/// The call-site offsets of `_Py_Dealloc` in `module`, from `tracer probes
/// --pid PID --json`.
fn dealloc_sites_in(pid: u32, module: &Path) -> Vec<u64> {
    let pid_arg = pid.to_string();
    let (code, stdout, stderr) =
        run_tracer(&["probes", "--pid", &pid_arg, "--json", "--placement", "call-sites", "--probes", "_Py_Dealloc"]);
    assert_eq!(code, Some(0), "{stderr}");
    let plan: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let files = plan["probes"][0]["call_sites"]["files"].as_array().expect("files");
    let file = files.iter().find(|f| f["path"] == module.to_str().unwrap()).expect("the module in the plan");
    file["offsets"].as_array().unwrap().iter().map(|o| o.as_u64().unwrap()).collect()
}

/// `--exe` with call sites covers every process of the interpreter: a
/// third-party extension module that a process running before the attach
/// had imported is probed from the start (and is not "late"), and one that
/// a process started after the attach imports is probed at the next
/// interval and reported as late. Nothing remains in either afterwards.
#[test]
fn exe_call_sites_cover_running_and_later_processes() {
    require_root();
    let python = shared_python();
    let site_packages = pyperf_venv().join("lib/python3.11/site-packages");
    let module = site_packages.join("psutil/_psutil_linux.abi3.so");
    assert!(module.is_file(), "{} is missing: run `cargo xtask setup`", module.display());
    // A copy is a different file, so the second process maps something no
    // process had mapped at attach time.
    let copy_dir = std::env::temp_dir().join(format!("tracer-late-{}", std::process::id()));
    std::fs::create_dir_all(&copy_dir).expect("temp dir");
    let copy = copy_dir.join("_psutil_linux.abi3.so");
    std::fs::copy(&module, &copy).expect("copy the module");

    let mut before = Workload::serve(&python);
    before.import(&site_packages, "psutil._psutil_linux");
    let offsets = dealloc_sites_in(before.pid(), &module);
    let exe = python.to_str().unwrap();
    let args = ["--exe", exe, "--placement", "call-sites", "--probes", "_Py_Dealloc", "--interval", "0.1"];
    let (tracer, _) = TracerRun::attach_json_with(&args);
    let early = sites_in_file(before.pid(), module.to_str().unwrap(), &offsets);
    assert!(!early.is_empty());
    for (site, bytes) in early.iter().zip(read_sites(before.pid(), &early)) {
        assert_eq!(bytes, [INT3], "{} holds no breakpoint right after the attach", site.symbol);
    }

    let mut after = Workload::serve(&python);
    after.import(&copy_dir, "_psutil_linux");
    let late_sites = sites_in_file(after.pid(), copy.to_str().unwrap(), &offsets);
    assert_eq!(late_sites.len(), offsets.len());
    wait_for_breakpoints(after.pid(), &late_sites, "after a later process imported it");

    tracer.signal(libc::SIGINT);
    let (status, stdout, stderr) = tracer.finish();
    assert!(status.success(), "{status}: {stderr}");
    let summary = stdout.last().expect("a summary line");
    let late = summary["late_modules"].as_array().expect("late_modules");
    assert_eq!(late.len(), 1, "only the copy is late: {late:?}");
    assert_eq!(late[0]["path"], copy.to_str().unwrap());
    assert_eq!(late[0]["sites"], offsets.len());
    assert!(
        stderr.contains(&format!(
            "tracer: note: {} was mapped after attaching; its {} calls",
            copy.display(),
            offsets.len()
        )),
        "{stderr}"
    );
    for (pid, sites) in [(before.pid(), &early), (after.pid(), &late_sites)] {
        for (site, bytes) in sites.iter().zip(read_sites(pid, sites)) {
            assert_eq!(bytes, site.file_bytes, "{} differs from the file after tracer left", site.symbol);
        }
    }
    before.ping();
    after.ping();
    drop((before, after));
    std::fs::remove_dir_all(&copy_dir).expect("remove the copy");
}
