//! `--record FILE` and `tracer report FILE`: the run's events recorded,
//! and turned later, without the target, into exactly what the live run
//! showed and wrote, or into the heap's change between two censuses.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use serde_json::Value;

use tracer_tests::{
    Body, Exit, KillOnDrop, Lines, TracerRun, Workload, require_root, run_tracer, shared_python, tracer_bin,
    without_cost_warning,
};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tracer-report-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `tracer report ARGS`: its status, stdout and stderr.
fn report(args: &[&str]) -> (Option<i32>, String, String) {
    let mut all = vec!["report"];
    all.extend_from_slice(args);
    run_tracer(&all)
}

#[test]
fn a_record_replays_the_live_table_and_files_exactly() {
    require_root();
    let dir = scratch("replay");
    let (record, live_folded, replay_folded) =
        (dir.join("run.jsonl"), dir.join("live.folded"), dir.join("replay.folded"));
    let mut workload = Workload::once(&shared_python(), 3_000, Body::Objects, Exit::Finalize, tracer_tests::Aslr::On);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid().to_string();
    // The table on stdout, as a person runs it.
    let mut child = Command::new(tracer_bin())
        .args(["attach", "--pid", &pid, "--exact", "--stacks", "--interval", "0.3"])
        .args(["--record", record.to_str().unwrap(), "--folded", live_folded.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("tracer");
    let lines = Lines::new(child.stdout.take().expect("stdout"));
    let tracer = KillOnDrop(child);
    // Its first line: the probes are live.
    let first = lines.next_line("the attach").expect("a first line");
    workload.go();
    workload.finish();
    let mut live = vec![first];
    live.extend(lines.rest("the live table"));
    let mut tracer = tracer;
    assert!(tracer.0.wait().expect("wait").success());
    let live = live.join("\n") + "\n";
    assert!(live.contains("summary after"), "{live}");
    // The table, line for line.
    let (code, replayed, err) = report(&[record.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(replayed, live);
    // The live run's note of the file it wrote is said to be the recorded
    // run's: the report wrote nothing.
    let wrote = format!(" stacks by calls to {}\n", live_folded.display());
    let recorded = |err: &str| {
        assert!(err.lines().any(|l| l.starts_with("tracer: note: recorded run: wrote ")), "{err}");
        assert!(err.contains(&wrote), "{err}");
        assert!(!err.lines().any(|l| l.starts_with("tracer: note: wrote ")), "{err}");
    };
    recorded(&err);
    // The JSON, event for event: the record itself, the note as it was
    // recorded; stderr says it is the recorded run's.
    let (code, json, err) = report(&[record.to_str().unwrap(), "--json"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(json.as_bytes(), read(&record));
    assert!(json.contains("\"message\":\"wrote "), "{json}");
    recorded(&err);
    // The summary's files, byte for byte.
    let (code, out, err) = report(&[record.to_str().unwrap(), "--folded", replay_folded.to_str().unwrap()]);
    assert_eq!((code, out.as_str()), (Some(0), ""), "{err}");
    assert!(err.starts_with("tracer: note: wrote "), "{err}");
    let folded = read(&replay_folded);
    assert!(!folded.is_empty());
    assert_eq!(folded, read(&live_folded));
    // Asked again, the file is there: refused unless --force.
    let (code, _, err) = report(&[record.to_str().unwrap(), "--folded", replay_folded.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    let (code, _, err) = report(&[record.to_str().unwrap(), "--folded", replay_folded.to_str().unwrap(), "--force"]);
    assert_eq!(code, Some(0), "{err}");
    // A record cut short (tracer killed): its attach and first interval.
    let cut = dir.join("cut.jsonl");
    let text = String::from_utf8(read(&record)).expect("utf-8");
    let first_two: Vec<&str> = text.lines().take(2).collect();
    std::fs::write(&cut, first_two.join("\n") + "\n").expect("write");
    // Its table is what it holds, and says that the run was cut short.
    let second: Value = serde_json::from_str(first_two[1]).expect("JSON");
    let (code, table, err) = report(&[cut.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!table.contains("summary after"), "{table}");
    let ends = match second["elapsed_s"].as_f64() {
        Some(s) if second["type"] == "interval" => {
            format!("the table ends at its last interval, {s:.1} s after the attach")
        }
        _ => "it holds no interval".to_owned(),
    };
    let warning = format!(
        "tracer: warning: {} has no summary (its run did not end normally, tracer killed or failed, or is still running): {ends}\n",
        cut.display()
    );
    assert!(err.ends_with(&warning), "{err}");
    let (code, _, err) = report(&[cut.to_str().unwrap(), "--flamegraph", dir.join("f.svg").to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(
        err,
        format!(
            "tracer: error: {} has no summary (the run was cut short): its stacks, written only in the summary, are not in the record\n",
            cut.display()
        )
    );
    // Exact tracing takes no census.
    let (code, _, err) = report(&[cut.to_str().unwrap(), "--diff", "0", "5"]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(
        err,
        format!(
            "tracer: error: {} has no heap census to compare at 0 s (its censuses: none); FROM picks the first census at or after it, TO the last at or before it, each time as shown (to 0.1 s) or exact\n",
            cut.display()
        )
    );
}

/// The next interval line of a profile run that has a heap census.
fn next_census(tracer: &TracerRun) -> Value {
    loop {
        let line = tracer.stdout.next_line("an interval with a census").expect("tracer ended");
        let v: Value = serde_json::from_str(&line).expect("JSON");
        if v["type"] == "interval" && v["heap"].is_object() {
            return v;
        }
    }
}

#[test]
fn the_diff_of_two_censuses_counts_the_objects_made_between() {
    require_root();
    let n: u64 = 20_000;
    let dir = scratch("diff");
    let record = dir.join("run.jsonl");
    let python = shared_python();
    let mut workload = Workload::script(None, python.to_str().unwrap(), "census_grow.py", &[&n.to_string()]);
    let pid = workload.pid();
    let (tracer, _) =
        TracerRun::profile_json(pid, &["--interval", "0.5", "--budget", "50", "--record", record.to_str().unwrap()]);
    // A census with N Grown (two censuses after the first growth), then
    // another N, and a census two later.
    let start = next_census(&tracer)["heap"]["census"].as_u64().expect("census");
    workload.tell("grow");
    assert_eq!(workload.next_line("grown"), Some(format!("grown {n}")));
    let census_from = |c: u64| loop {
        let v = next_census(&tracer);
        if v["heap"]["census"].as_u64() >= Some(c) {
            break v;
        }
    };
    let before = census_from(start + 2);
    let first = before["heap"]["census"].as_u64().expect("census");
    let from = before["heap"]["taken_s"].as_f64().expect("taken_s");
    workload.tell("grow");
    assert_eq!(workload.next_line("grown"), Some(format!("grown {}", 2 * n)));
    let after = census_from(first + 2);
    let to = after["heap"]["taken_s"].as_f64().expect("taken_s");
    tracer.signal(libc::SIGINT);
    let _ = tracer.summary();
    drop(workload);
    // A microsecond to spare either way: serde_json reads a float to
    // within an ulp, not exactly, and the censuses are 0.5 s apart (a
    // census missed by an ulp made the diff start one census late).
    let (from, to) = (from - 1e-6, to + 1e-6);
    let (code, out, err) = report(&[record.to_str().unwrap(), "--diff", &from.to_string(), &to.to_string(), "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let diff: Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(diff["from_census"], first);
    let grown = diff["types"]
        .as_array()
        .expect("types")
        .iter()
        .find(|t| t["name"] == "__main__.Grown")
        .unwrap_or_else(|| panic!("no Grown: {diff}"));
    // N at the first census, 2N at the second, the target idle between.
    assert_eq!(grown["from"]["count"], n, "{grown}");
    assert_eq!(grown["to"]["count"], 2 * n, "{grown}");
    let (code, table, err) = report(&[record.to_str().unwrap(), "--diff", &from.to_string(), &to.to_string()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(table.lines().next().is_some_and(|l| l.starts_with("heap change from census ")), "{table}");
    let row = table.lines().find(|l| l.ends_with(" __main__.Grown")).expect("a Grown row");
    assert!(row.contains(" +20,000 "), "{row}");
    // TO before FROM.
    let (code, _, err) = report(&[record.to_str().unwrap(), "--diff", &from.to_string(), &from.to_string()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("FROM must come before TO"), "{err}");
    // Both times on one census: the first at or after FROM is the last at
    // or before TO.
    let (code, _, err) = report(&[record.to_str().unwrap(), "--diff", &from.to_string(), &(from + 0.001).to_string()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(&format!(": both pick census {first} (taken at ")), "{err}");
}

#[test]
fn bad_records_are_one_line_errors() {
    let dir = scratch("bad");
    let missing = dir.join("missing.jsonl");
    let (code, _, err) = report(&[missing.to_str().unwrap()]);
    assert_eq!(code, Some(2));
    assert_eq!(
        err,
        format!(
            "tracer: error: cannot read {}: No such file or directory (os error 2); pass the file `tracer attach --record FILE` wrote\n",
            missing.display()
        )
    );
    let junk = dir.join("junk.jsonl");
    std::fs::write(&junk, "{\"type\":\"attached\"\nnot json\n").expect("write");
    let (code, _, err) = report(&[junk.to_str().unwrap()]);
    assert_eq!(code, Some(2));
    assert!(
        err.starts_with(&format!("tracer: error: {}, line 1, is not an event tracer writes (", junk.display())),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// An idle target (blocked reading stdin) records no stack: `attach
/// --folded --flamegraph` writes neither file, says so in one warning,
/// prints its summary, detaches and exits 0, and `report` of its record
/// does the same. A record of a run without --stacks has none to write:
/// refused, exit 2. No file is left behind either way.
#[test]
fn no_stacks_no_files() {
    require_root();
    let dir = scratch("no-stacks");
    let path = |name: &str| dir.join(name).display().to_string();
    let (record, bare, folded, svg) = (path("run.jsonl"), path("bare.jsonl"), path("a.folded"), path("a.svg"));
    let workload = Workload::once(&shared_python(), 1, Body::Objects, Exit::Finalize, tracer_tests::Aslr::On);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid().to_string();
    let warning = format!("no stacks recorded: --folded {folded} and --flamegraph {svg} not written");
    let (code, stdout, stderr) = run_tracer(&[
        "attach",
        "--pid",
        &pid,
        "--json",
        "--duration",
        "1",
        "--folded",
        &folded,
        "--flamegraph",
        &svg,
        "--record",
        &record,
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    let last = lines.last().expect("lines");
    assert_eq!((&last["type"], &last["end"]), (&"summary".into(), &"duration".into()), "{last}");
    assert_eq!(last["stacks"], serde_json::json!([]), "{last}");
    let note = serde_json::json!({"type": "note", "level": "warning", "code": "written", "message": warning});
    assert_eq!(lines.iter().filter(|l| **l == note).count(), 1, "{stdout}");
    assert_eq!(
        without_cost_warning(&stderr),
        format!("tracer: warning: {warning}\ntracer: detached from PID {pid} (duration)\n")
    );
    assert!(!Path::new(&folded).exists() && !Path::new(&svg).exists());
    // The record, later: the same warning, and no file.
    let (code, out, err) = report(&[&record, "--folded", &folded, "--flamegraph", &svg]);
    assert_eq!((code, out.as_str(), err), (Some(0), "", format!("tracer: warning: {warning}\n")));
    assert!(!Path::new(&folded).exists() && !Path::new(&svg).exists());
    // A run without --stacks.
    let (code, _, stderr) = run_tracer(&["attach", "--pid", &pid, "--exact", "--duration", "0.5", "--record", &bare]);
    assert_eq!(code, Some(0), "{stderr}");
    for flag in ["--folded", "--flamegraph"] {
        let (code, out, err) = report(&[&bare, flag, &svg]);
        let refused = format!(
            "tracer: error: {bare} holds no stacks for {flag}: its run was without --stacks; record one with --stacks (or --top, --folded, --flamegraph)\n"
        );
        assert_eq!((code, out.as_str(), err), (Some(2), "", refused));
        assert!(!Path::new(&svg).exists());
    }
    drop(workload);
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// A record that cannot be written (`/dev/full`: no space left) ends the
/// run with one line naming the flag and the file, exit status 1, and the
/// probes gone from the target, which goes on.
#[test]
fn a_record_that_cannot_be_written_is_an_error_that_names_it() {
    require_root();
    let mut workload = Workload::serve(&shared_python());
    let pid = workload.pid();
    let (code, _, stderr) = run_tracer(&[
        "attach",
        "--pid",
        &pid.to_string(),
        "--exact",
        "--probes",
        "_Py_NewReference",
        "--duration",
        "1",
        "--force",
        "--record",
        "/dev/full",
    ]);
    assert_eq!(
        (code, stderr.as_str()),
        (Some(1), "tracer: error: writing --record /dev/full: No space left on device (os error 28)\n")
    );
    let image = std::fs::read_link(format!("/proc/{pid}/exe")).expect("exe");
    let libpython = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .expect("maps")
        .lines()
        .find_map(|l| l.split_whitespace().nth(5).filter(|p| p.contains("libpython")).map(str::to_owned))
        .unwrap_or_else(|| image.display().to_string());
    let sites = tracer_tests::probe_sites(pid, &libpython, &["_Py_NewReference".to_owned()]);
    for (site, bytes) in sites.iter().zip(tracer_tests::read_sites(pid, &sites)) {
        assert_eq!(bytes, site.file_bytes, "{} changed after tracer left", site.symbol);
    }
    workload.ping();
}
