//! Garbage collections (`--gc`), on every build: at the `gc__start` and
//! `gc__done` markers of Debian's python3.11 and the forky root's 3.13 and
//! 3.14, and at `gc_collect_main`'s entry and return in pyenv's builds,
//! which have no markers. A workload with automatic collection off calls
//! `gc.collect(0)` 2N times, `gc.collect(1)` N times and `gc.collect(2)` N
//! times, each of the last after leaving 3 cycles of two lists: exactly
//! those collections are counted per generation, and exactly 6N objects
//! found unreachable in generation 2, for N and 2N. The markers' semaphores
//! are raised while tracer is attached and back to their value after,
//! however it ends; a build with neither the markers nor a known function
//! says so.

use std::{
    collections::BTreeMap,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    process::Command,
    sync::{PoisonError, RwLock, RwLockReadGuard},
};

use serde_json::Value;
use tracer_tests::{
    Aslr, Body, Exit, GC_CYCLES, INT3, Isolation, TracerRun, Workload, forky_root, pyenv, require_root, run_tracer,
    shared_python, static_python,
};

/// `--exe` traces every process of its image, the other tests' too, and
/// checks that no collection of any was missed: one attaching while
/// another test's process is mid-collection would rightly count that
/// collection's end as unmatched. So it runs alone (write), and the others
/// beside each other (read).
static IMAGE: RwLock<()> = RwLock::new(());

fn beside_others() -> RwLockReadGuard<'static, ()> {
    IMAGE.read().unwrap_or_else(PoisonError::into_inner)
}

/// Per generation (`None`: unknown), collections and objects found
/// unreachable.
type Generations = BTreeMap<Option<u64>, (u64, u64)>;

fn generations(gc: &Value) -> Generations {
    let list = gc["generations"].as_array().unwrap_or_else(|| panic!("no generations in {gc}"));
    list.iter()
        .map(|g| {
            let collections = g["collections"].as_u64().expect("collections");
            let duration = g["duration_s"].as_f64().expect("duration_s");
            // Every collection takes time; none takes none.
            assert_eq!(collections > 0, duration > 0.0, "{g}");
            (g["generation"].as_u64(), (collections, g["collected"].as_u64().expect("collected")))
        })
        .collect()
}

/// What `runs` iterations of the gc body give: 2 collections of generation
/// 0, 1 of generation 1 and 1 of generation 2 each, which finds the cycles.
fn expected(runs: u64) -> Generations {
    [(Some(0), (2 * runs, 0)), (Some(1), (runs, 0)), (Some(2), (runs, 2 * GC_CYCLES * runs))].into_iter().collect()
}

const GC_STATS: [&str; 4] = ["gc_unmatched", "gc_unended", "gc_arg_missing", "gc_full"];

/// The attached line and the summary of the gc body in `workload`, traced
/// with `extra` options.
fn traced(mut workload: Workload, extra: &[&str]) -> (Value, Value) {
    workload.wait_blocked_on_stdin();
    let mut args = vec!["--interval", "3600"];
    args.extend_from_slice(extra);
    let (tracer, attached) = TracerRun::attach_json(workload.pid(), &args);
    workload.go();
    workload.finish();
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "tracer failed: {status}: {stderr}");
    let summary = lines.last().expect("a summary").clone();
    assert_eq!(
        (&summary["type"], &summary["end"]),
        (&Value::from("summary"), &Value::from("target-exit")),
        "{summary}"
    );
    for stat in GC_STATS {
        assert_eq!(summary["stats"][stat], 0, "{stat}: {summary}");
    }
    (attached, summary)
}

/// N and 2N iterations give exactly their collections, per generation, and
/// exactly N and 2N more than none; `source` is how they were seen.
fn exact(source: &str, extra: &[&str], start: impl Fn(u64) -> Workload) -> Value {
    let n = 40;
    let mut seen = Vec::new();
    let mut attached = Value::Null;
    for runs in [n, 2 * n] {
        let (a, summary) = traced(start(runs), extra);
        assert_eq!(a["gc"]["source"], source, "{}", a["gc"]);
        assert_eq!(summary["gc"]["source"], source, "{}", summary["gc"]);
        let got = generations(&summary["gc"]);
        assert_eq!(got, expected(runs), "{runs} iterations: {}", summary["gc"]);
        seen.push(got);
        attached = a;
    }
    // K vs 2K: exactly K more of each.
    let more: Vec<(Option<u64>, u64, u64)> =
        seen[1].iter().map(|(g, (c, o))| (*g, c - seen[0][g].0, o - seen[0][g].1)).collect();
    assert_eq!(more, [(Some(0), 2 * n, 0), (Some(1), n, 0), (Some(2), n, 2 * GC_CYCLES * n)]);
    attached
}

fn once(python: &Path) -> impl Fn(u64) -> Workload + '_ {
    move |n| Workload::once(python, n, Body::Gc, Exit::Immediate, Aslr::On)
}

fn in_forky(python: &'static str) -> impl Fn(u64) -> Workload {
    let root = forky_root();
    move |n| Workload::once_in_root(&root, python, n, Body::Gc, Exit::Immediate, Isolation::Chroot)
}

/// Each of the markers' points has its semaphore.
fn markers(attached: &Value) -> Vec<Value> {
    let points = attached["gc"]["points"].as_array().unwrap_or_else(|| panic!("no points in {attached}")).clone();
    let names: Vec<&str> = points.iter().map(|p| p["name"].as_str().expect("name")).collect();
    assert!(names.contains(&"gc__start") && names.contains(&"gc__done"), "{names:?}");
    assert!(points.iter().all(|p| p["semaphore"].is_u64() && p.get("return").is_none()), "{points:?}");
    points
}

#[test]
fn debian_311_counts_collections_at_its_markers() {
    require_root();
    let _image = beside_others();
    let attached = exact("markers", &[], once(&static_python()));
    markers(&attached);
}

#[test]
fn debian_311_counts_collections_at_its_markers_through_perf_events() {
    require_root();
    let _image = beside_others();
    exact("markers", &["--links", "perf", "--no-inlined"], once(&static_python()));
}

#[test]
fn forky_314_and_313_count_collections_at_their_markers() {
    require_root();
    let _image = beside_others();
    for python in ["python3.14", "python3.13"] {
        let attached = exact("markers", &[], in_forky(python));
        markers(&attached);
        assert!(attached["python"]["version"].as_str().is_some_and(|v| v.starts_with(&python[6..])), "{attached}");
    }
}

/// pyenv's builds have no markers: `gc_collect_main`'s entry gives the
/// generation and its return the objects, exactly as the markers would.
#[test]
fn pyenv_311_counts_collections_at_gc_collect_main() {
    require_root();
    let _image = beside_others();
    let python = shared_python();
    let attached = exact("function", &[], once(&python));
    let image = attached["python"]["image"].as_str().expect("image");
    assert_eq!(
        attached["gc"]["detail"],
        format!(
            "{image} has no python:gc__start and python:gc__done markers (built without --with-dtrace): gc_collect_main's entry (the generation) and return (the objects found unreachable), by its symbol"
        )
    );
    let points = attached["gc"]["points"].as_array().expect("points");
    let shape: Vec<(&str, &str, bool)> = points
        .iter()
        .map(|p| (p["role"].as_str().expect("role"), p["name"].as_str().expect("name"), p.get("return").is_some()))
        .collect();
    assert_eq!(shape, [("start", "gc_collect_main", false), ("done", "gc_collect_main", true)]);
    assert!(attached["gc"].get("caveat").is_none(), "{}", attached["gc"]);
    exact("function", &["--links", "perf"], once(&python));
}

/// 3.9's collection function is `collect` (3.10 renamed it
/// `gc_collect_main`): both count every collection exactly.
#[test]
fn pyenv_39_and_310_count_collections_at_their_collection_function() {
    require_root();
    let _image = beside_others();
    for (version, function) in [("3.9.18", "collect"), ("3.10.13", "gc_collect_main")] {
        let attached = exact("function", &[], once(&pyenv(version)));
        let points = attached["gc"]["points"].as_array().expect("points");
        let names: Vec<&str> = points.iter().map(|p| p["name"].as_str().expect("name")).collect();
        assert_eq!(names, [function, function], "{version}: {}", attached["gc"]);
        assert!(attached["gc"].get("caveat").is_none(), "{version}: {}", attached["gc"]);
    }
}

#[test]
fn pyenv_312_counts_collections_at_gc_collect_main() {
    require_root();
    let _image = beside_others();
    exact("function", &[], once(&pyenv("3.12.1")));
}

/// 3.13's `gc_collect_main` cannot tell automatic collections apart at its
/// entry: the explicit ones are exact, and the report says what the others
/// would count.
#[test]
fn pyenv_313_counts_explicit_collections_and_says_what_it_cannot() {
    require_root();
    let _image = beside_others();
    let attached = exact("function", &[], once(&pyenv("3.13.0")));
    let caveat = attached["gc"]["caveat"].as_str().expect("a caveat");
    assert!(caveat.starts_with("gc_collect_main's entry does not show the generation of automatic collections"));
}

/// A copy of `image` at `copy` without its markers' notes.
fn without_markers(image: &Path, copy: &Path) -> PathBuf {
    let status = Command::new("objcopy")
        .args(["--remove-section", ".note.stapsdt"])
        .arg(image)
        .arg(copy)
        .status()
        .unwrap_or_else(|e| panic!("cannot run objcopy (binutils; run `cargo xtask setup`): {e}"));
    assert!(status.success(), "objcopy {} {}: {status}", image.display(), copy.display());
    copy.to_owned()
}

/// Without markers and without `gc_collect_main` in its symbols (Debian's
/// image is stripped) or debug info, tracer says so in the attach, a note
/// and every report, and counts nothing.
#[test]
fn without_markers_or_function_it_says_so() {
    require_root();
    let _image = beside_others();
    let marked = std::env::temp_dir().join(format!("tracer-gc-nomarkers-{}-python3.11.tmp", std::process::id()));
    let marked = without_markers(&static_python(), &marked);
    let copy = std::env::temp_dir().join(format!("tracer-gc-nomarkers-{}-python3.11", std::process::id()));
    let copy = tracer_tests::without_debug_info(&marked, &copy);
    let _ = std::fs::remove_file(&marked);
    let mut workload = Workload::once(&copy, 5, Body::Gc, Exit::Immediate, Aslr::On);
    workload.wait_blocked_on_stdin();
    let (tracer, attached) = TracerRun::attach_json(workload.pid(), &["--interval", "3600"]);
    workload.go();
    workload.finish();
    let (status, lines, stderr) = tracer.finish();
    let _ = std::fs::remove_file(&copy);
    assert!(status.success(), "tracer failed: {status}: {stderr}");
    let why = format!(
        "{} has no python:gc__start and python:gc__done markers (built without --with-dtrace), and gc_collect_main is not in its symbols (stripped?): garbage collections are not reported",
        copy.display()
    );
    assert_eq!(attached["gc"], serde_json::json!({"source": "none", "detail": why}));
    let note = serde_json::json!({"type": "note", "level": "note", "code": "gc", "message": why});
    assert!(lines.contains(&note), "{lines:?}");
    assert!(stderr.contains(&format!("tracer: note: {why}\n")), "{stderr}");
    let summary = lines.last().expect("a summary");
    assert_eq!(summary["gc"], serde_json::json!({"source": "none", "reason": why, "generations": []}));
}

/// Debian's 3.14 without markers: `gc_collect_main`, found by its DWARF
/// in the root's debug info, counts what the markers would (the gc body
/// runs with automatic collection off), and the report says how.
#[test]
fn forky_314_without_markers_counts_at_gc_collect_main() {
    require_root();
    let _image = beside_others();
    let root = forky_root();
    let name = format!("tracer-gc-nomarkers-{}-python3.14", std::process::id());
    let copy = without_markers(&root.join("usr/bin/python3.14"), &root.join("tmp").join(&name));
    let inside = format!("/tmp/{name}");
    let attached = exact("function", &[], |n| {
        Workload::once_in_root(&root, &inside, n, Body::Gc, Exit::Immediate, Isolation::Chroot)
    });
    let _ = std::fs::remove_file(&copy);
    let detail = attached["gc"]["detail"].as_str().expect("a detail");
    let image = attached["python"]["image"].as_str().expect("image");
    let expected = format!(
        "{image} has no python:gc__start and python:gc__done markers (built without --with-dtrace): gc_collect_main's entry (the generation) and return (the objects found unreachable), found by its DWARF in "
    );
    assert!(detail.starts_with(&expected), "{detail}");
}

/// (start, end, file offset) of each mapping of `path` in `pid`.
fn mappings(pid: u32, path: &str) -> Vec<(u64, u64, u64)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("read maps");
    let hex = |s: &str| u64::from_str_radix(s, 16).expect("hex");
    maps.lines()
        .filter(|l| l.split_whitespace().nth(5) == Some(path))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (start, end) = f[0].split_once('-').expect("a-b");
            (hex(start), hex(end), hex(f[2]))
        })
        .collect()
}

/// Reads `len` bytes of `pid`'s memory where file offset `offset` of the
/// image (mapped as `ranges`) is.
fn read_at(pid: u32, ranges: &[(u64, u64, u64)], offset: u64, len: usize) -> Vec<u8> {
    let address = ranges
        .iter()
        .find_map(|&(s, e, off)| offset.checked_sub(off).filter(|d| *d < e - s).map(|d| s + d))
        .unwrap_or_else(|| panic!("file offset {offset:#x} is not mapped in PID {pid}"));
    let mut buf = vec![0; len];
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).expect("open mem");
    mem.read_exact_at(&mut buf, address).unwrap_or_else(|e| panic!("read PID {pid} at {address:#x}: {e}"));
    buf
}

/// Each marker point's (code byte, semaphore) in the target.
fn state(pid: u32, image: &str, points: &[Value]) -> Vec<(u8, u16)> {
    let ranges = mappings(pid, image);
    points
        .iter()
        .map(|p| {
            let code = read_at(pid, &ranges, p["file_offset"].as_u64().expect("file_offset"), 1)[0];
            let semaphore = read_at(pid, &ranges, p["semaphore"].as_u64().expect("semaphore"), 2);
            (code, u16::from_le_bytes([semaphore[0], semaphore[1]]))
        })
        .collect()
}

/// How tracer is ended.
#[derive(Clone, Copy, Debug)]
enum Ending {
    Signal,
    /// SIGKILL: the kernel detaches when it closes tracer's fds.
    Kill,
}

/// While tracer is attached, each marker site holds a breakpoint and each
/// semaphore is raised (the kernel's doing: tracer never writes the
/// target); once tracer has gone, however it ended, the code is the file's
/// again and each semaphore back to its value before.
fn semaphores_follow_the_probes(mut workload: Workload, extra: &[&str], ending: Ending) {
    workload.wait_blocked_on_stdin();
    let pid = workload.pid();
    let mut args = vec!["--interval", "3600"];
    args.extend_from_slice(extra);
    // Read before attaching: where the plan puts each probe and semaphore.
    let pid_arg = pid.to_string();
    let (code, stdout, stderr) = run_tracer(&["probes", "--pid", &pid_arg, "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    let planned: Value = serde_json::from_str(&stdout).expect("JSON");
    let image = planned["image"].as_str().expect("image").to_owned();
    let points = markers(&planned);
    let file = std::fs::read(&image).expect("read the image");
    let before = state(pid, &image, &points);
    for ((code, _), p) in before.iter().zip(&points) {
        let offset = usize::try_from(p["file_offset"].as_u64().expect("offset")).expect("fits");
        assert_eq!(*code, file[offset], "{p}: the code differs from the file before attaching");
    }
    let (tracer, attached) = TracerRun::attach_json(pid, &args);
    assert_eq!(markers(&attached), points);
    let during = state(pid, &image, &points);
    for ((code, semaphore), (_, was)) in during.iter().zip(&before) {
        assert_eq!(*code, INT3, "{points:?}: no breakpoint while attached");
        assert!(*semaphore > *was, "{points:?}: semaphore {semaphore} while attached, {was} before");
    }
    match ending {
        Ending::Signal => tracer.signal(libc::SIGINT),
        Ending::Kill => tracer.signal(libc::SIGKILL),
    }
    let (status, _, stderr) = tracer.finish();
    match ending {
        Ending::Signal => assert!(status.success(), "{status}: {stderr}"),
        Ending::Kill => assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL)),
    }
    // The kernel may finish a killed tracer's detach after its exit.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while state(pid, &image, &points) != before && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(state(pid, &image, &points), before, "{ending:?}: not as before once tracer has gone");
    // Nothing stays attached: the collections the target makes now are
    // its own business, and it runs them.
    workload.go();
    workload.finish();
}

#[test]
fn semaphores_are_raised_while_attached_and_restored_after() {
    require_root();
    let _image = beside_others();
    let python = static_python();
    let start = || Workload::once(&python, 3, Body::Gc, Exit::Immediate, Aslr::On);
    semaphores_follow_the_probes(start(), &[], Ending::Signal);
    semaphores_follow_the_probes(start(), &[], Ending::Kill);
    semaphores_follow_the_probes(start(), &["--links", "perf", "--no-inlined"], Ending::Signal);
    semaphores_follow_the_probes(start(), &["--links", "perf", "--no-inlined"], Ending::Kill);
}

/// The forky root's 3.14, chrooted: its maps name the host path, from
/// which its semaphores are read.
#[test]
fn semaphores_of_a_chrooted_314_are_raised_and_restored() {
    require_root();
    let _image = beside_others();
    let root = forky_root();
    let start = || Workload::once_in_root(&root, "python3.14", 3, Body::Gc, Exit::Immediate, Isolation::Chroot);
    semaphores_follow_the_probes(start(), &[], Ending::Signal);
    semaphores_follow_the_probes(start(), &["--links", "perf", "--no-inlined"], Ending::Kill);
}

/// With `--exe`, each process's collections are reported under its PID,
/// and kept once it has exited: two processes of N and 2N iterations,
/// started after the attach, differ by exactly N iterations' collections;
/// through multi links and perf events (every process, from CPU 0's
/// event).
#[test]
fn exe_reports_each_process_collections() {
    require_root();
    let _alone = IMAGE.write().unwrap_or_else(PoisonError::into_inner);
    exe_collections(&[]);
    exe_collections(&["--links", "perf", "--no-inlined"]);
}

fn exe_collections(extra: &[&str]) {
    let python = static_python();
    let exe = python.to_str().expect("UTF-8 path");
    let mut args = vec!["--exe", exe, "--interval", "0.2"];
    args.extend_from_slice(extra);
    let (tracer, attached) = TracerRun::attach_json_with(&args);
    assert_eq!(attached["gc"]["source"], "markers", "{attached}");
    let n = 30;
    let mut pids = Vec::new();
    for runs in [n, 2 * n] {
        let mut w = Workload::once(&python, runs, Body::Gc, Exit::Immediate, Aslr::On);
        pids.push(w.pid());
        w.wait_blocked_on_stdin();
        w.go();
        w.finish();
    }
    // Until an interval lists both as exited: their counts are final.
    let exited = |line: &Value| {
        let gone: Vec<u64> =
            line["exited"].as_array().map(|e| e.iter().filter_map(|p| p["pid"].as_u64()).collect()).unwrap_or_default();
        pids.iter().all(|p| gone.contains(&u64::from(*p)))
    };
    loop {
        let line = tracer.stdout.next_line("an interval").expect("tracer printed an interval");
        let line: Value = serde_json::from_str(&line).expect("JSON");
        if line["type"] == "interval" && exited(&line) {
            break;
        }
    }
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "{status}: {stderr}");
    let summary = lines.last().expect("a summary");
    let of = |pid: u32| generations(&serde_json::json!({"generations": summary["gc"]["pids"][pid.to_string()]}));
    let (one, two) = (of(pids[0]), of(pids[1]));
    let more: Generations = two.iter().map(|(g, (c, o))| (*g, (c - one[g].0, o - one[g].1))).collect();
    assert_eq!(more, expected(n), "{}", summary["gc"]);
    for stat in GC_STATS {
        assert_eq!(summary["stats"][stat], 0, "{stat}: {summary}");
    }
}

/// Automatic collections: at the markers and at 3.11's `gc_collect_main`
/// each is counted under the generation it collects; 3.13's
/// `gc_collect_main` does not show it, and they are counted under `null`.
#[test]
fn automatic_collections_are_counted_under_their_generation_where_known() {
    require_root();
    let _image = beside_others();
    let n = 20_000;
    for (python, known) in [(static_python(), true), (shared_python(), true), (pyenv("3.13.0"), false)] {
        let (attached, summary) = traced(
            Workload::once(&python, n, Body::GcAuto, Exit::Immediate, Aslr::Off),
            &["--probes", "PyMem_RawCalloc"],
        );
        let got = generations(&summary["gc"]);
        let (known_gen0, unknown) = (got[&Some(0)].0, got.get(&None).map_or(0, |g| g.0));
        if known {
            // One per ~700 (3.11) new containers, at least.
            assert!(known_gen0 >= n / 1000 && unknown == 0, "{}: {}", python.display(), summary["gc"]);
        } else {
            assert!(known_gen0 == 0 && unknown >= n / 3000, "{}: {}", python.display(), summary["gc"]);
            assert_eq!(summary["gc"]["reason"], attached["gc"]["caveat"]);
        }
    }
}

/// Asking for what a build lacks is bad input: one line, status 2, nothing
/// attached; so is a `--gc` value tracer does not know.
#[test]
fn gc_modes_a_build_lacks_are_refused() {
    require_root();
    let _image = beside_others();
    let mut workload = Workload::once(&shared_python(), 1, Body::Gc, Exit::Immediate, Aslr::On);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid().to_string();
    let image = "/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0";
    for (args, line) in [
        (
            vec!["attach", "--exact", "--pid", &pid, "--gc", "markers"],
            format!(
                "tracer: error: --gc markers: {image} has no python:gc__start and python:gc__done markers (CPython built without --with-dtrace); use --gc auto, which falls back to the collection function where tracer knows one\n"
            ),
        ),
        (
            vec!["attach", "--exact", "--pid", &pid, "--gc", "sometimes"],
            "tracer: error: invalid value 'sometimes' for '--gc <HOW>'; possible values: auto, markers, function, off; see `tracer attach --help`\n".to_owned(),
        ),
        (
            vec!["probes", "--pid", &pid, "--gc", "markers"],
            format!(
                "tracer: error: --gc markers: {image} has no python:gc__start and python:gc__done markers (CPython built without --with-dtrace); use --gc auto, which falls back to the collection function where tracer knows one\n"
            ),
        ),
    ] {
        let (code, stdout, stderr) = run_tracer(&args);
        assert_eq!((code, stdout.as_str(), stderr.as_str()), (Some(2), "", line.as_str()), "{args:?}");
    }
    workload.go();
    workload.finish();
    // Debian's image is stripped; without its debug info (a copy without
    // the build-id and debug link by which it is found) the function is
    // nowhere.
    let copy = std::env::temp_dir().join(format!("tracer-gc-nodbg-{}-python3.11", std::process::id()));
    let copy = tracer_tests::without_debug_info(&static_python(), &copy);
    let mut workload = Workload::once(&copy, 1, Body::Gc, Exit::Immediate, Aslr::On);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid().to_string();
    let (code, stdout, stderr) = run_tracer(&["attach", "--exact", "--pid", &pid, "--gc", "function"]);
    let _ = std::fs::remove_file(&copy);
    assert_eq!(
        (code, stdout.as_str(), stderr.as_str()),
        (
            Some(2),
            "",
            format!(
                "tracer: error: --gc function: {}: gc_collect_main is not in its symbols (stripped?); use --gc auto\n",
                copy.display()
            )
            .as_str()
        )
    );
    workload.go();
    workload.finish();
}

/// Debian's stripped images have `gc_collect_main` in their debug info
/// only (as `gc_collect_main.lto_priv.0`): `--gc function` finds it by its
/// DWARF, on 3.11 and on the forky root's 3.14, and counts what the markers
/// would.
#[test]
fn debian_311_and_forky_314_count_at_gc_collect_main_found_by_its_dwarf() {
    require_root();
    let _image = beside_others();
    let found = |attached: &Value| {
        let detail = attached["gc"]["detail"].as_str().expect("a detail");
        assert!(detail.starts_with("gc_collect_main's entry (the generation) and return (the objects found unreachable), found by its DWARF in "), "{detail}");
        assert!(detail.contains("/usr/lib/debug/.build-id/"), "{detail}");
    };
    found(&exact("function", &["--gc", "function"], once(&static_python())));
    let attached = exact("function", &["--gc", "function"], in_forky("python3.14"));
    found(&attached);
    let caveat = attached["gc"]["caveat"].as_str().expect("a caveat");
    assert!(caveat.starts_with("gc_collect_main's entry does not show the generation of automatic collections"));
}

/// `--gc off` probes no collection and reports none, saying why in the
/// attach only.
#[test]
fn gc_off_reports_none() {
    require_root();
    let _image = beside_others();
    let (attached, summary) =
        traced(Workload::once(&static_python(), 5, Body::Gc, Exit::Immediate, Aslr::On), &["--gc", "off"]);
    assert_eq!(
        attached["gc"],
        serde_json::json!({"source": "none", "detail": "--gc off: garbage collections are not traced"})
    );
    assert!(summary.get("gc").is_none(), "{summary}");
}

/// The table reports each generation on a `gc` line, in every block.
#[test]
fn the_table_has_a_gc_line() {
    require_root();
    let _image = beside_others();
    let runs = 7;
    let mut workload = Workload::once(&shared_python(), runs, Body::Gc, Exit::Immediate, Aslr::On);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid().to_string();
    let tracer = TracerRun::start(&["attach", "--exact", "--pid", &pid, "--interval", "3600"]);
    // The mode and its cost first, then the header, once every probe is
    // live.
    let mode = tracer.stdout.next_line("the mode line").expect("a mode line");
    assert!(mode.starts_with("tracer: exact tracing (--exact): estimated cost "), "{mode}");
    let header = tracer.stdout.next_line("the header").expect("a header");
    assert!(header.starts_with("tracer: attached to PID"), "{header}");
    let gc = tracer.stdout.next_line("the gc header").expect("a gc line");
    assert!(gc.starts_with("tracer: gc: ") && gc.contains("gc_collect_main's entry"), "{gc}");
    workload.go();
    workload.finish();
    let rest = tracer.stdout.rest("the summary");
    let mut child = tracer.child;
    assert!(child.wait().expect("tracer").success(), "{rest:?}");
    let line =
        rest.iter().find(|l| l.starts_with("  gc (function) ")).unwrap_or_else(|| panic!("no gc line: {rest:?}"));
    let parts: Vec<&str> = line["  gc (function) ".len()..].split(" | ").collect();
    let found = 2 * GC_CYCLES * runs;
    let expect = [
        (format!("gen 0: {} (", 2 * runs), ", 0 unreachable".to_owned()),
        (format!("gen 1: {runs} ("), ", 0 unreachable".to_owned()),
        (format!("gen 2: {runs} ("), format!(", {found} unreachable")),
    ];
    assert_eq!(parts.len(), 3, "{line}");
    for (part, (head, tail)) in parts.iter().zip(&expect) {
        assert!(part.starts_with(head.as_str()) && part.ends_with(tail.as_str()), "{part:?} in {line}");
    }
}
