//! Faults (issue 26): tracer killed with SIGKILL in the production profile
//! leaves no byte of the target's code changed; killed mid-census with the
//! target stopped (`tracer heap --stop`), it lets the target go; 8 threads
//! allocating at once are counted exactly; two tracers on one target both
//! count every event; a closed output (`| head`) detaches cleanly; a target
//! killed mid-census ends `tracer heap` with one line and status 2, and
//! ends an attach as any exit does, the census said cut short.

use std::{
    os::unix::{fs::FileExt as _, process::ExitStatusExt as _},
    thread::sleep,
    time::{Duration, Instant},
};

use tracer_tests::{TracerRun, Workload, counts, require_root, shared_python, tracer_bin};

/// Where `pid`'s code differs from its files: every file-backed executable
/// mapping read from its memory and compared with the file it maps (through
/// `/proc/PID/map_files`, whatever root the process has), as (path,
/// address) of each differing byte, at most 20.
fn code_changes(pid: u32) -> Vec<(String, u64)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("the target's maps");
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).expect("the target's memory");
    let mut changes = Vec::new();
    let mut mappings = 0;
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [range, perms, offset, _, _, path, ..] = fields[..] else { continue };
        if !perms.contains('x') || !path.starts_with('/') {
            continue;
        }
        let (start, end) = range.split_once('-').expect("START-END");
        let (start, end) = (u64::from_str_radix(start, 16).unwrap(), u64::from_str_radix(end, 16).unwrap());
        let offset = u64::from_str_radix(offset, 16).unwrap();
        let file = std::fs::File::open(format!("/proc/{pid}/map_files/{range}")).expect("the mapped file");
        let len = usize::try_from(end - start).unwrap();
        let mut on_disk = vec![0u8; len];
        // The mapping's last page may run past the file's end.
        let mut read = 0;
        while read < len {
            match file.read_at(&mut on_disk[read..], offset + read as u64) {
                Ok(0) => break,
                Ok(n) => read += n,
                Err(e) => panic!("reading {path}: {e}"),
            }
        }
        let mut in_memory = vec![0u8; read];
        mem.read_exact_at(&mut in_memory, start).unwrap_or_else(|e| panic!("reading {path} in memory: {e}"));
        mappings += 1;
        for (i, (a, b)) in in_memory.iter().zip(&on_disk).enumerate() {
            if a != b && changes.len() < 20 {
                changes.push((path.to_owned(), start + i as u64));
            }
        }
    }
    assert!(mappings > 0, "no executable file-backed mapping in PID {pid}:\n{maps}");
    changes
}

/// Waits up to 3 s for `pid`'s code to equal its files (the kernel
/// removes a uprobe as the last reference to it closes, during the
/// killed process's exit); the changes left.
fn settled_code_changes(pid: u32) -> Vec<(String, u64)> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let changes = code_changes(pid);
        if changes.is_empty() || Instant::now() > deadline {
            return changes;
        }
        sleep(Duration::from_millis(50));
    }
}

/// The production profile (rates' windows, the GC's and growth's probes,
/// the census) killed with SIGKILL a second into its run: while it runs
/// the target's code holds its breakpoints; after, not one byte of any
/// executable mapping differs from its file, and the target still
/// answers.
#[test]
fn a_killed_profile_leaves_the_code_as_it_was() {
    require_root();
    let python = shared_python();
    let mut workload = Workload::serve(&python);
    let pid = workload.pid();
    assert_eq!(code_changes(pid), [], "the target's code differs from its files before any attach");
    let (tracer, attached) = TracerRun::profile_json(pid, &["--interval", "0.3"]);
    assert_eq!(attached["mode"], "profile", "{attached}");
    sleep(Duration::from_secs(1));
    // Growth's and the GC's probes stay attached for the whole run.
    assert!(!code_changes(pid).is_empty(), "no breakpoint while the profile runs: {attached}");
    tracer.signal(libc::SIGKILL);
    let status = tracer.killed();
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert_eq!(settled_code_changes(pid), [], "the target's code after tracer was killed");
    workload.ping();
}

/// `tracer attach --json | head -1`: once its reader is gone, tracer
/// detaches at the next interval, leaves the target's code as it was,
/// still writes the summary to `--record` (`"end":"output-closed"`),
/// says so in one line on stderr and exits 141 (128 + SIGPIPE).
#[test]
fn a_closed_output_detaches_and_records_the_summary() {
    use std::io::{BufRead as _, Read as _};
    require_root();
    let mut workload = Workload::serve(&shared_python());
    let pid = workload.pid();
    let record = std::env::temp_dir().join(format!("tracer-faults-closed-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&record);
    let child = std::process::Command::new(tracer_bin())
        .args(["attach", "--pid", &pid.to_string(), "--json", "--interval", "0.2", "--duration", "60"])
        .arg("--record")
        .arg(&record)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("tracer");
    let mut tracer = tracer_tests::KillOnDrop(child);
    let mut stdout = std::io::BufReader::new(tracer.stdout.take().expect("stdout"));
    let mut first = String::new();
    stdout.read_line(&mut first).expect("the first line");
    assert!(first.starts_with(r#"{"type":"attached""#), "{first}");
    // As `head -1` exits.
    drop(stdout);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = tracer.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "tracer did not end once its output closed");
        sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    tracer.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("stderr");
    assert_eq!(status.code(), Some(141), "{stderr}");
    assert_eq!(
        tracer_tests::without_cost_warning(&stderr),
        format!("tracer: output closed (broken pipe); detached from PID {pid}\n")
    );
    let text = std::fs::read_to_string(&record).expect("the record");
    let last: serde_json::Value = serde_json::from_str(text.lines().last().expect("lines")).expect("JSON");
    assert_eq!((&last["type"], &last["end"]), (&"summary".into(), &"output-closed".into()), "{last}");
    assert_eq!(settled_code_changes(pid), [], "the target's code after the output closed");
    workload.ping();
    std::fs::remove_file(&record).expect("clean up");
}

/// The state letter of `pid` in /proc/PID/stat (`t`: stopped by a tracer).
fn state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next()).expect("a state")
}

/// `tracer heap --stop` killed with SIGKILL while the target is stopped for
/// its census: the kernel detaches the target, which goes on (not stopped
/// a moment later, and it answers a ping).
#[test]
fn a_census_killed_while_the_target_is_stopped_lets_it_go() {
    require_root();
    let python = shared_python();
    // About 400 MB of small objects: a census of a few tenths of a second.
    let mut workload = Workload::script(None, python.to_str().unwrap(), "big_heap.py", &["3000000"]);
    let pid = workload.pid();
    let mut heap = std::process::Command::new(tracer_bin())
        .args(["heap", "--pid", &pid.to_string(), "--stop", "--json"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("tracer heap");
    let deadline = Instant::now() + Duration::from_secs(30);
    while state(pid) != 't' {
        assert!(heap.try_wait().expect("wait").is_none(), "tracer heap ended before the target was seen stopped");
        assert!(Instant::now() < deadline, "the target was never stopped");
        sleep(Duration::from_micros(200));
    }
    heap.kill().expect("SIGKILL");
    let status = heap.wait().expect("wait");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "tracer heap finished before it was killed");
    let deadline = Instant::now() + Duration::from_secs(2);
    while matches!(state(pid), 't' | 'T') {
        assert!(Instant::now() < deadline, "the target stayed stopped after tracer was killed: {}", state(pid));
        sleep(Duration::from_millis(10));
    }
    workload.ping();
    workload.close();
}

/// threads.py T N under `tracer attach --exact` ([`TracerRun::attach_json`]; with `second`, a second
/// tracer attached at once): each tracer's counts of the run.
fn threads_run(t: u64, n: u64, second: bool) -> Vec<std::collections::HashMap<String, (u64, u64)>> {
    let python = shared_python();
    let (t, n) = (t.to_string(), n.to_string());
    let mut workload = Workload::script(None, python.to_str().unwrap(), "threads.py", &[&t, &n]);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid();
    // Frees and PyObject_Malloc are left out: when the interpreter frees
    // its own objects and allocates its own buffers (a thread's state, the
    // GIL's hand-offs) depends on scheduling. The difference of two runs
    // moved by a few frees in CI, and twice by one allocation in 320,000
    // (never by a new reference): the objects the threads make are what
    // the workload fixes, and every probe feeds the same BPF pipeline.
    let args = ["--interval", "3600", "--probes", "_Py_NewReference"];
    let tracers: Vec<TracerRun> =
        (0..if second { 2 } else { 1 }).map(|_| TracerRun::attach_json(pid, &args).0).collect();
    workload.go();
    workload.expect("done");
    workload.wait_blocked_reading(Some(5));
    tracers
        .into_iter()
        .map(|tracer| {
            tracer.signal(libc::SIGINT);
            let (status, lines, stderr) = tracer.finish();
            assert!(status.success(), "tracer failed: {status}: {stderr}");
            let summary = lines.last().expect("a summary");
            for (name, value) in tracer_tests::misses(summary) {
                assert_eq!(value, 0, "BPF stat {name} is non-zero: {summary}");
            }
            counts(summary)
        })
        .collect()
}

/// Each probe's calls of `more` beyond `fewer`.
fn extra(
    more: &std::collections::HashMap<String, (u64, u64)>,
    fewer: &std::collections::HashMap<String, (u64, u64)>,
) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> =
        more.iter().map(|(name, (calls, _))| (name.clone(), calls - fewer.get(name).map_or(0, |c| c.0))).collect();
    out.sort();
    out
}

/// 8 threads making and dropping bytearrays at once, counted in --exact:
/// N more each gives exactly 8 times the events N more in one thread
/// gives, in new references (no event lost to a race between CPUs).
#[test]
fn eight_threads_at_once_are_counted_exactly() {
    require_root();
    let n = 20_000;
    let one = extra(&threads_run(1, 2 * n, false)[0], &threads_run(1, n, false)[0]);
    let eight = extra(&threads_run(8, 2 * n, false)[0], &threads_run(8, n, false)[0]);
    assert!(one.iter().all(|(_, calls)| *calls >= n), "{one:?}");
    let times_eight: Vec<(String, u64)> = one.iter().map(|(name, calls)| (name.clone(), calls * 8)).collect();
    assert_eq!(eight, times_eight, "N more in 8 threads against 8 × N more in one");
}

/// Two tracers attached to one target at once, both before the loop and
/// both after it: each counts every event, the same counts.
#[test]
fn two_tracers_on_one_target_both_count_everything() {
    require_root();
    let runs = threads_run(2, 10_000, true);
    assert_eq!(runs.len(), 2);
    assert!(runs[0].values().all(|(calls, _)| *calls >= 10_000), "{:?}", runs[0]);
    assert_eq!(runs[0], runs[1], "two tracers on one target");
}

/// The target exec's another program mid-run: the run ends there
/// (`"end":"target-exec"`, exit status 0, "detached from PID N
/// (target-exec)"), with no census or growth read from the new program's
/// memory (the summary's heap, if any, is from before, and growth says its
/// last reading stands).
#[test]
fn a_target_that_execs_ends_the_run() {
    require_root();
    let python = shared_python();
    let mut workload = Workload::script(None, python.to_str().unwrap(), "execs.py", &[]);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid();
    let (tracer, attached) = TracerRun::profile_json(pid, &["--interval", "0.2"]);
    assert_eq!(attached["mode"], "profile", "{attached}");
    workload.go();
    let started = Instant::now();
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "tracer failed: {status}: {stderr}");
    assert!(started.elapsed() < Duration::from_secs(10), "the run went on after the exec");
    let summary = lines.last().expect("a summary");
    assert_eq!(summary["type"], "summary", "{lines:?}");
    assert_eq!(summary["end"], "target-exec", "{summary}");
    assert!(stderr.contains(&format!("tracer: detached from PID {pid} (target-exec)")), "{stderr}");
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("the target's program");
    assert!(exe.ends_with("sleep"), "{}", exe.display());
    // Nothing read of the new program: growth's summary says its last
    // reading stands, and a census at the end is refused.
    let g = &summary["growth"];
    if g.get("unavailable").is_none() && g.get("stopped").is_none() {
        assert!(g["caveat"].as_str().is_some_and(|c| c.contains("now runs another program")), "{g}");
    }
    for line in stderr.lines().filter(|l| l.contains("heap census") && l.contains("failed")) {
        assert!(line.contains("called exec"), "{line}");
    }
    drop(workload);
}

/// A memory cgroup of its own with a limit of `bytes` (v1's memory
/// controller where mounted, else v2's): removed when dropped.
struct MemoryCgroup(std::path::PathBuf);

impl MemoryCgroup {
    fn new(name: &str, bytes: u64) -> Self {
        let v1 = std::path::Path::new("/sys/fs/cgroup/memory");
        let (dir, limit) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(name), "memory.limit_in_bytes")
        } else {
            (std::path::Path::new("/sys/fs/cgroup").join(name), "memory.max")
        };
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating the cgroup {}: {e}", dir.display()));
        std::fs::write(dir.join(limit), bytes.to_string()).expect("the memory limit");
        Self(dir)
    }

    fn add(&self, pid: u32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).expect("moving the target into the cgroup");
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A target in a memory cgroup of 256 MiB that grows until the kernel's
/// OOM killer ends it, traced by the profile: the run ends with the target
/// (exit status 0, `"end":"target-exit"`), and the summary keeps the last
/// interval's figures and the heap of a census taken before the death.
#[test]
fn a_target_killed_by_oom_keeps_its_last_census() {
    require_root();
    let python = shared_python();
    let cgroup = MemoryCgroup::new("tracer-test-oom", 256 << 20);
    let mut child = std::process::Command::new(&python)
        .arg(tracer_tests::workspace_root().join("tests/python/oom.py"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("oom.py");
    let pid = child.id();
    cgroup.add(pid);
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).expect("ready");
    assert_eq!(line, "ready\n");
    // A census may take half of 50% of the target's time, or of one CPU's.
    let (tracer, attached) = TracerRun::profile_json(pid, &["--interval", "0.3", "--budget", "50"]);
    assert_eq!(attached["mode"], "profile", "{attached}");
    std::io::Write::write_all(child.stdin.as_mut().expect("stdin"), b"go\n").expect("go");
    let status = child.wait().expect("the target's end");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "the target was not killed by the OOM killer: {status}");
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "tracer failed: {status}: {stderr}");
    let summary = lines.last().expect("a summary");
    assert_eq!(summary["end"], "target-exit", "{summary}");
    let intervals: Vec<&serde_json::Value> = lines.iter().filter(|l| l["type"] == "interval").collect();
    assert!(!intervals.is_empty(), "no interval before the OOM kill: {stderr}");
    let heap = &summary["heap"];
    assert!(heap["census"].as_u64().is_some_and(|n| n >= 1), "no census before the OOM kill: {heap}\n{stderr}");
    let bytes: u64 = heap["types"].as_array().expect("types").iter().filter_map(|t| t["bytes"].as_u64()).sum();
    assert!(bytes > 16 << 20, "the census before the kill saw {bytes} bytes: {heap}");
}

/// tracer attached to targets that exit while it attaches, at moments
/// spread over the attach: every run either ends with the target (exit
/// status 0, `"end":"target-exit"`) or is refused with one line naming the
/// PID (exit status 2); none crashes, hangs, or leaves a probe behind (the
/// next target on the same interpreter holds none).
#[test]
fn attaching_while_the_target_exits() {
    require_root();
    let python = shared_python();
    for delay_ms in [0u32, 20, 60, 120, 250, 500] {
        let script = format!("import time; time.sleep({})", f64::from(delay_ms) / 1000.0);
        let mut child = std::process::Command::new(&python).args(["-c", &script]).spawn().expect("python");
        let pid = child.id().to_string();
        let started = Instant::now();
        let out = std::process::Command::new(tracer_bin())
            .args(["attach", "--pid", &pid, "--json", "--interval", "0.2"])
            .output()
            .expect("tracer");
        let _ = child.wait();
        assert!(started.elapsed() < Duration::from_secs(30), "tracer took {:?}", started.elapsed());
        let stderr = String::from_utf8_lossy(&out.stderr);
        match out.status.code() {
            Some(0) => {
                let stdout = String::from_utf8_lossy(&out.stdout);
                let last: serde_json::Value =
                    serde_json::from_str(stdout.lines().last().expect("a summary")).expect("JSON");
                assert_eq!(last["end"], "target-exit", "{delay_ms} ms: {last}");
            }
            Some(2) => {
                let lines: Vec<&str> = stderr.lines().collect();
                assert_eq!(lines.len(), 1, "{delay_ms} ms: not one line: {stderr}");
                assert!(lines[0].starts_with("tracer: error: ") && lines[0].contains(&pid), "{delay_ms} ms: {stderr}");
            }
            other => panic!("{delay_ms} ms: exit status {other:?}: {stderr}"),
        }
    }
    let mut workload = Workload::serve(&python);
    assert_eq!(code_changes(workload.pid()), [], "a probe left behind in the next target");
    workload.ping();
}

/// forks.py M N under `tracer attach --exact` with `args` (`--pid` or
/// `--exe`): the summary, and the child's PID.
fn forked_run(m: u64, n: u64, args: &[&str]) -> (serde_json::Value, u32, u32) {
    let python = shared_python();
    let (m, n) = (m.to_string(), n.to_string());
    let mut workload = Workload::script(None, python.to_str().unwrap(), "forks.py", &[&m, &n]);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid().to_string();
    let mut all: Vec<&str> = args.iter().map(|a| if *a == "PID" { pid.as_str() } else { a }).collect();
    all.extend(["--interval", "3600", "--probes", "_Py_NewReference,PyObject_Malloc"]);
    let (tracer, _) = TracerRun::attach_json_with(&all);
    workload.go();
    let child = workload.next_line("the child's PID").expect("a line");
    let child: u32 = child.strip_prefix("child ").and_then(|c| c.parse().ok()).expect("child PID");
    workload.expect("done");
    workload.wait_blocked_reading(Some(5));
    tracer.signal(libc::SIGINT);
    let summary = tracer.summary();
    let parent = workload.pid();
    workload.close();
    (summary, child, parent)
}

/// A target that forks mid-run: with `--pid` its child is not traced (the
/// counts are the parent's alone: N more objects in the child change
/// nothing, M more in the parent add a whole multiple of M); with `--exe`
/// the child is traced as another process of the interpreter, per PID.
#[test]
fn a_fork_mid_run_is_traced_as_documented() {
    require_root();
    let (m, n) = (20_000, 30_000);
    let count = |s: &serde_json::Value| {
        let c = counts(s);
        (c["_Py_NewReference"].0, c["PyObject_Malloc"].0)
    };
    // The child's objects change nothing with --pid, to the last call.
    let (base, ..) = forked_run(m, n, &["--pid", "PID"]);
    let (more_child, ..) = forked_run(m, 2 * n, &["--pid", "PID"]);
    let (more_parent, ..) = forked_run(2 * m, n, &["--pid", "PID"]);
    assert_eq!(count(&more_child), count(&base), "the child's objects were counted with --pid");
    // New references are whole per object; the allocations also hold
    // the loop's ints past the small ones, and what the interpreter does
    // meanwhile.
    let (before, after) = (count(&base).0, count(&more_parent).0);
    let more = after - before;
    assert!(more >= m && more % m == 0, "_Py_NewReference: {before} then {after} with {m} more objects");
    let exe = shared_python();
    let exe = std::fs::canonicalize(exe).expect("python");
    let (one, child_one, parent_one) = forked_run(m, n, &["--exe", exe.to_str().unwrap()]);
    let (two, child_two, parent_two) = forked_run(m, 2 * n, &["--exe", exe.to_str().unwrap()]);
    let per = |s: &serde_json::Value, pid: u32| {
        let p = tracer_tests::per_pid(s);
        let c = p.get(&pid).unwrap_or_else(|| panic!("no PID {pid} in {s}"));
        (c["_Py_NewReference"].0, c["PyObject_Malloc"].0)
    };
    let (before, after) = (per(&one, child_one).0, per(&two, child_two).0);
    let more = after - before;
    assert!(more >= n && more % n == 0, "_Py_NewReference of the child: {before} then {after} with {n} more objects");
    // The parent, the same in both (other processes of the interpreter on
    // the machine are counted too, each under its own PID).
    assert_eq!(per(&one, parent_one).0, per(&two, parent_two).0);
}

/// The user and system CPU time of `pid`'s thread `tid` (of the whole
/// process where `tid` is `pid`), in clock ticks.
fn cpu_ticks(pid: u32, tid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap_or_default();
    let Some((_, rest)) = stat.rsplit_once(") ") else { return 0 };
    // utime and stime: fields 14 and 15, the 12th and 13th after the name.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields.get(11..13).map_or(0, |f| f.iter().map(|v| v.parse::<u64>().unwrap_or(0)).sum())
}

/// The thread of `pid` named `name`, if any.
fn thread_named(pid: u32, name: &str) -> Option<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten().find_map(|t| {
        let tid: u32 = t.file_name().to_str()?.parse().ok()?;
        (std::fs::read_to_string(t.path().join("comm")).ok()?.trim_end() == name).then_some(tid)
    })
}

/// About 1 GiB of small objects: a census of 2 s (idle machine) to 10 s
/// (a loaded one) here, of which half a second of CPU is well inside.
const BIG: &str = "6000000";
/// Half a second of CPU time, in clock ticks (100 a second).
const INSIDE_TICKS: u64 = 50;

/// `tracer heap` on a target killed mid-census: one line naming the PID
/// and its exit, and exit status 2 (docs/heap.md).
#[test]
fn a_target_killed_mid_census_ends_tracer_heap_with_one_line() {
    require_root();
    let python = shared_python();
    let workload = Workload::script(None, python.to_str().unwrap(), "big_heap.py", &[BIG]);
    let pid = workload.pid();
    let heap = std::process::Command::new(tracer_bin())
        .args(["heap", "--pid", &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("tracer heap");
    let tracer = heap.id();
    let deadline = Instant::now() + Duration::from_mins(1);
    while cpu_ticks(tracer, tracer) < INSIDE_TICKS {
        assert!(Instant::now() < deadline, "tracer heap never spent half a second");
        sleep(Duration::from_millis(10));
    }
    drop(workload);
    let out = heap.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr,
        format!("tracer: error: PID {pid} exited during the heap census; take it again while the process runs\n")
    );
}

/// The production profile on a target killed while its census thread
/// reads it: the run ends as at any exit (status 0, end target-exit), and
/// a warning says the census was cut short and what heap is shown.
#[test]
fn a_target_killed_mid_census_ends_the_attach_as_an_exit_does() {
    require_root();
    let python = shared_python();
    let workload = Workload::script(None, python.to_str().unwrap(), "big_heap.py", &[BIG]);
    let pid = workload.pid();
    // A budget that pays for the first census within seconds.
    let (tracer, _) = TracerRun::profile_json(pid, &["--budget", "100"]);
    let tracer_pid = tracer.child.id();
    let census = thread_named(tracer_pid, "census").expect("tracer's census thread");
    // What it spent finding the heap, before any census.
    let opened = cpu_ticks(tracer_pid, census);
    let deadline = Instant::now() + Duration::from_mins(1);
    loop {
        if cpu_ticks(tracer_pid, census) >= opened + INSIDE_TICKS {
            break;
        }
        assert!(Instant::now() < deadline, "the census never spent half a second");
        sleep(Duration::from_millis(10));
    }
    drop(workload);
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "tracer failed: {status}: {stderr}");
    let summary = lines.last().expect("a summary");
    assert_eq!(summary["end"], "target-exit", "{summary}");
    let cut = format!("the heap census of PID {pid} was cut short by its exit: ");
    let note = lines
        .iter()
        .find(|v| v["code"] == "heap" && v["message"].as_str().is_some_and(|m| m.starts_with(&cut)))
        .unwrap_or_else(|| panic!("no note of the census cut short: {lines:?}"));
    assert_eq!(note["level"], "warning", "{note}");
}
