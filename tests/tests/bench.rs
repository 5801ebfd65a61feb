//! `tracer bench` end to end with a cheap probe: it runs pyperf in the
//! three states, writes files pyperf reads, and counts hits per loop
//! exactly. No timing is asserted here: speed lives in BENCHMARKS.md.

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
};

use tracer_tests::{forky_root, pyenv, pyperf_venv, require_root, run_tracer, tracer_bin};

/// The venv's python.
fn pyperf_python() -> PathBuf {
    let python = pyperf_venv().join("bin/python");
    assert!(python.exists(), "{} is missing: run `cargo xtask setup`", python.display());
    python
}

/// `tracer bench ARGS --stmt 'bytearray(1000)' --probes PROBES --fast
/// --json -o DIR`, which must succeed: its JSON.
fn bench_json(args: &[&OsStr], probes: &str, dir: &Path) -> serde_json::Value {
    bench_json_env(args, probes, dir, &[])
}

/// The same with `env` set for tracer and the interpreter.
fn bench_json_env(args: &[&OsStr], probes: &str, dir: &Path, env: &[(&str, &OsStr)]) -> serde_json::Value {
    let out = std::process::Command::new(tracer_bin())
        .envs(env.iter().copied())
        .arg("bench")
        .args(args)
        .args(["--stmt", "bytearray(1000)", "--probes", probes, "--fast", "--json", "-o"])
        .arg(dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[test]
fn bench_runs_three_states_and_counts_hits_exactly() {
    require_root();
    let dir = std::env::temp_dir().join(format!("tracer-bench-test-{}", std::process::id()));
    let python = pyperf_python();
    let v = bench_json(&[OsStr::new("--python"), python.as_os_str()], "PyMem_RawMalloc", &dir);
    // bytearray(1000) asks the raw allocator for its 1001-byte buffer once.
    assert_eq!(v["hits_per_loop"], 1.0, "{v}");
    assert_eq!(v["hits_per_loop_by_probe"]["PyMem_RawMalloc"], 1.0);
    let values = v["baseline"]["values"].as_u64().unwrap();
    assert!(values > 1);
    for state in ["baseline", "attached", "detached"] {
        assert!(v[state]["mean_ns"].as_f64().unwrap() > 0.0, "{state}: {v}");
        assert!(v[state]["stdev_ns"].as_f64().unwrap() >= 0.0, "{state}");
        // Equal sample sizes: pyperf's significance test needs them.
        assert_eq!(v[state]["values"].as_u64(), Some(values), "{state}");
        let file = dir.join(format!("{state}.json"));
        assert_eq!(v[state]["file"], file.to_str().unwrap());
    }
    for cmp in ["attached_vs_baseline", "detached_vs_baseline"] {
        assert!(v[cmp]["ratio"].as_f64().unwrap() > 0.0, "{cmp}");
        assert!(v[cmp]["significant"].is_boolean(), "{cmp}");
    }
    assert!(v["ns_per_hit"].is_number(), "{v}");
    // The files are pyperf's own format.
    let cmp = std::process::Command::new(&python)
        .args(["-m", "pyperf", "compare_to"])
        .arg(dir.join("baseline.json"))
        .arg(dir.join("attached.json"))
        .output()
        .unwrap();
    assert!(cmp.status.success(), "{}", String::from_utf8_lossy(&cmp.stderr));
    assert!(String::from_utf8_lossy(&cmp.stdout).starts_with("Mean +- std dev: [baseline]"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// pyenv's 3.11, whose `PyObject_Free` is single-stepped at its entry
/// (`mov %rdi,%rsi`, then a jump through the allocator's pointer): the
/// bench probes it where a fresh process's pointer leads, at
/// `_PyObject_Free`, as `--pid` does, says so, and counts the same frees.
/// pyperf comes from the default venv's site-packages (pure Python, and
/// pyperf hands PYTHONPATH on to its workers).
#[test]
fn bench_probes_pyenvs_frees_at_their_implementations() {
    require_root();
    let dir = std::env::temp_dir().join(format!("tracer-bench-frees-{}", std::process::id()));
    let python = pyenv("3.11.7");
    let site = pyperf_venv().join("lib/python3.11/site-packages");
    assert!(site.join("pyperf").is_dir(), "{} has no pyperf: run `cargo xtask setup`", site.display());
    let args = [OsStr::new("--python"), python.as_os_str()];
    let v = bench_json_env(&args, "PyObject_Malloc,PyObject_Free", &dir, &[("PYTHONPATH", site.as_os_str())]);
    // Each loop makes one bytearray and drops it: PyObject_Malloc makes the
    // object, PyObject_Realloc (from NULL) its buffer, and bytearray_dealloc
    // frees both through PyObject_Free (3.11's Objects/bytearrayobject.c).
    assert_eq!(v["hits_per_loop_by_probe"]["PyObject_Malloc"], 1.0, "{v}");
    assert_eq!(v["hits_per_loop_by_probe"]["PyObject_Free"], 2.0, "{v}");
    let notes = v["notes"].as_array().expect("notes");
    assert!(
        notes.iter().any(|n| n["code"] == "free_pointer"
            && n["message"].as_str().is_some_and(|m| m.starts_with("PyObject_Free at _PyObject_Free"))),
        "{v}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// forky's python3.13 with pyperf, as a path inside the forky root
/// (xtask's `FORKY_PYPERF_3_13`).
const FORKY_PYPERF_3_13: &str = "/opt/tracer/pyperf-venv-3.13/bin/python";

/// Debian forky's LTO python3.13, chrooted: pyperf's workers run in the
/// root, tracer probes its image (copies found by the root's debug files),
/// the files come out where asked, and nothing is left in the root.
#[test]
fn bench_runs_a_chrooted_interpreter() {
    require_root();
    let root = forky_root();
    // The venv's python links to a path only the root resolves.
    let python = root.join(FORKY_PYPERF_3_13.trim_start_matches('/'));
    assert!(python.symlink_metadata().is_ok(), "{} is missing: run `cargo xtask setup`", python.display());
    let dir = std::env::temp_dir().join(format!("tracer-bench-root-{}", std::process::id()));
    // Work directories in the root: any other bench's, before and after.
    let work_dirs = || -> Vec<String> {
        std::fs::read_dir(root.join("tmp"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("tracer-bench."))
            .collect()
    };
    let before = work_dirs();
    let args = [OsStr::new("--root"), root.as_os_str(), OsStr::new("--python"), OsStr::new(FORKY_PYPERF_3_13)];
    let v = bench_json(&args, "PyMem_RawMalloc,PyObject_Malloc", &dir);
    // The object, and its 1001-byte buffer, past pymalloc's largest class,
    // from the raw allocator; counted at their inlined copies too.
    assert_eq!(v["hits_per_loop_by_probe"]["PyObject_Malloc"], 1.0, "{v}");
    assert_eq!(v["hits_per_loop_by_probe"]["PyMem_RawMalloc"], 1.0, "{v}");
    assert_eq!(v["python"]["executable"], FORKY_PYPERF_3_13, "{v}");
    assert_eq!(v["python"]["root"], root.to_str().unwrap(), "{v}");
    // The root's own interpreter, which the venv's links to.
    assert_eq!(v["python"]["image"], root.join("usr/bin/python3.13").to_str().unwrap(), "{v}");
    let values = v["baseline"]["values"].as_u64().unwrap();
    assert!(values > 1, "{v}");
    for state in ["baseline", "attached", "detached"] {
        let file = dir.join(format!("{state}.json"));
        assert_eq!(v[state]["file"], file.to_str().unwrap(), "{state}");
        assert_eq!(v[state]["values"].as_u64(), Some(values), "{state}");
        // The copy is pyperf's file, whole.
        let copied: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert!(copied["benchmarks"].is_array(), "{}", file.display());
    }
    assert!(v["attached_vs_baseline"]["ratio"].as_f64().unwrap() > 0.0, "{v}");
    let after: Vec<String> = work_dirs().into_iter().filter(|d| !before.contains(d)).collect();
    assert_eq!(after, Vec::<String>::new(), "tracer bench left its work directory in the root");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_bad_input() {
    require_root();
    let dir = std::env::temp_dir().join(format!("tracer-bench-bad-{}", std::process::id()));
    let out = dir.to_str().unwrap();
    // Each refused with exactly this line, exit status 2 and no output.
    let refused = |args: &[&str], expected: &str| {
        let mut all = vec!["bench"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", out]);
        let (code, stdout, stderr) = run_tracer(&all);
        assert_eq!(stderr, format!("tracer: error: {expected}\n"), "{args:?}");
        assert_eq!((code, stdout.as_str()), (Some(2), ""), "{args:?}");
    };
    refused(
        &["--python", "/no/such/python"],
        "cannot run /no/such/python: No such file or directory (os error 2); pass --python PATH of a CPython 3.9, 3.10, 3.11, 3.12, 3.13, 3.14 interpreter",
    );
    // Checked before anything is measured.
    refused(
        &["--stmt", "", "--fast"],
        "--stmt is empty, and pyperf times no empty statement; pass the statement to time, e.g. --stmt '[]'",
    );
    refused(
        &["--python", "/usr/bin/sleep", "--fast"],
        "--python /usr/bin/sleep is not a CPython 3 interpreter: tracer's helper script run with it ended with exit status 1 (Try '/usr/bin/sleep --help' for more information.); pass --python PATH of a CPython 3.9, 3.10, 3.11, 3.12, 3.13, 3.14 interpreter",
    );
    refused(
        &["--python", "/bin/true", "--fast"],
        "--python /bin/true is not a CPython 3 interpreter: it did not answer tracer's helper script as Python does (EOF while parsing a value at line 1 column 0); pass --python PATH of a CPython 3.9, 3.10, 3.11, 3.12, 3.13, 3.14 interpreter",
    );
    // A CPython tracer has no ABI module for: named with its version,
    // before pyperf is asked for.
    let old = tracer_tests::pyenv("3.6.15");
    refused(
        &["--python", old.to_str().unwrap(), "--fast"],
        &format!(
            "--python {} is CPython 3.6, which tracer does not support; pass --python PATH of a CPython 3.9, 3.10, 3.11, 3.12, 3.13, 3.14 interpreter",
            old.display()
        ),
    );
    // A CPython it supports on which tracer's own helper script fails (here
    // through a json module of the environment's that raises): tracer's
    // failure to report, exit status 1, not the user's input.
    let broken = dir.join("broken-json");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("json.py"), "raise ImportError('a json that fails on purpose')\n").unwrap();
    let venv = pyperf_venv().join("bin/python");
    let failed = std::process::Command::new(tracer_tests::tracer_bin())
        .args(["bench", "--python", venv.to_str().unwrap(), "--fast", "-o", out])
        .env("PYTHONPATH", &broken)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&failed.stderr),
        format!(
            "tracer: error: asking {} what it is failed: tracer's helper script run with it ended with exit status 1 (ImportError: a json that fails on purpose)\n",
            venv.display()
        )
    );
    assert_eq!((failed.status.code(), failed.stdout.as_slice()), (Some(1), &b""[..]));
    // Debian's python3.11 has no pyperf (setup installs it only in the venv).
    let (code, _, stderr) = run_tracer(&["bench", "--python", "/usr/bin/python3.11", "-o", out]);
    assert!(
        stderr.starts_with("tracer: error: pyperf is not installed for /usr/bin/python3.11; run `cargo xtask setup`"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1);
    assert_eq!(code, Some(2));
    refused(
        &["--also", "perf"],
        "--also names \"perf\", which is not a setup tracer bench knows; use entry, call-sites, empty, empty-entry, empty-call-sites, returns, meta-insert, meta-lookup, meta-pool, meta-chunk, bpftrace, tracemalloc=FRAMES (e.g. tracemalloc=1) or budget=PERCENT (e.g. budget=1)",
    );
    refused(
        &["--root", "/no/such/root", "--python", "/usr/bin/python3"],
        "--root /no/such/root: No such file or directory (os error 2); pass the directory the interpreter runs chrooted in",
    );
    let (code, _, stderr) = run_tracer(&["bench", "--root", "/var/lib/tracer/forky", "-o", out]);
    assert!(stderr.contains("--python <PATH>"), "{stderr}");
    assert_eq!(code, Some(2));
    // A path the root does not have, and a relative one.
    for python in ["/no/such/python", "python3.13"] {
        refused(
            &["--root", "/var/lib/tracer/forky", "--python", python],
            &format!(
                "--python {python} is not in --root /var/lib/tracer/forky; pass its absolute path as seen inside the root"
            ),
        );
    }
    // An interpreter the root has, without pyperf.
    refused(
        &["--root", "/var/lib/tracer/forky", "--python", "/usr/bin/python3.13"],
        "pyperf is not installed for /usr/bin/python3.13 in /var/lib/tracer/forky; pass --python of a venv there that has it (`cargo xtask setup` makes /opt/tracer/pyperf-venv-3.13/bin/python in Debian forky's root)",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
