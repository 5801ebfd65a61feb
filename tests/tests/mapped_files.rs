//! Files a target maps are reached as the very files it maps, through
//! `/proc/PID/map_files/`: here an interpreter whose file was removed after
//! it started, as a package upgrade replaces it under a running process.
//! No path names that file any more; only its `map_files` entry reaches it.

use std::os::unix::fs::PermissionsExt as _;

use tracer_tests::{Aslr, Body, Exit, TracerRun, Workload, counts, require_root, static_python};

#[test]
fn an_interpreter_deleted_after_it_started_is_traced() {
    const N: u64 = 50;
    require_root();
    let dir = std::env::temp_dir().join(format!("tracer-mapped-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let python = dir.join("python3.11");
    std::fs::copy(static_python(), &python).unwrap();
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut workload = Workload::once(&python, N, Body::Api, Exit::Immediate, Aslr::On);
    std::fs::remove_dir_all(&dir).unwrap();
    let pid = workload.pid();
    let shown = format!("{} (deleted)", python.display());
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(maps.lines().any(|l| l.ends_with(&shown)), "{maps}");

    // The image is read through its map_files entry, for its build-id too:
    // its debug info is found, and every copy is probed.
    workload.wait_blocked_on_stdin();
    let (tracer, attached) = TracerRun::attach_json(pid, &["--probes", "alloc", "--interval", "3600"]);
    for (name, c) in attached["coverage"].as_object().expect("coverage") {
        assert!(c["source"].as_str().is_some_and(|s| s.contains("/usr/lib/debug/.build-id/")), "{name}: {c}");
    }
    assert_eq!(attached["python"]["image"], shown.as_str(), "{attached}");
    workload.go();
    workload.finish();
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "{stderr}");
    let summary = lines.last().expect("a summary line");
    assert_eq!(summary["end"], "target-exit", "{summary}");
    let counted = counts(summary);
    for (name, bytes) in tracer_tests::api_calls() {
        let (calls, total) = counted[&name];
        assert!(
            calls >= N && total >= N * bytes,
            "{name}: {calls} calls and {total} bytes for {N} iterations of {bytes}"
        );
    }
}
