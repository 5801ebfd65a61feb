//! An inlined copy probed past its first point reads the same values as at
//! that point: two tracers attached at once to one process, one with the
//! default placement (copies moved along the straight line after their
//! first point, to an instruction the kernel emulates, their size and
//! object followed there) and one with `--placement entry` (every copy at
//! its first point), count the same calls, bytes, size histograms and
//! objects by type over a workload of many sizes, exactly.

use std::{collections::BTreeMap, path::Path};

use serde_json::Value;
use tracer_tests::{Aslr, TracerRun, Workload, counts, forky_root, require_root, run_tracer, static_python};

/// Iterations of varied.py: each makes objects of sizes that change with
/// the iteration's index.
const N: &str = "3000";

/// The plan's moved and single-stepped sites, its sites at jumps into
/// copies, and how many sites more than copies it has (a copy only jumps
/// lead into is probed at each), over every probe (`tracer probes` takes
/// no `--types`, which keeps the object where a copy moves: its plan moves
/// as many or fewer).
fn moved_and_stepped(pid: u32, extra: &[&str]) -> (u64, u64, u64, u64) {
    let pid = pid.to_string();
    let mut args = vec!["probes", "--pid", pid.as_str(), "--json"];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = run_tracer(&args);
    assert_eq!(code, Some(0), "{stderr}");
    let plan: Value = serde_json::from_str(&stdout).expect("JSON");
    let sum = |key: &str| plan["probes"].as_array().expect("probes").iter().filter_map(|p| p[key].as_u64()).sum();
    let probes = plan["probes"].as_array().expect("probes");
    let sites: u64 = probes.iter().map(|p| p["inline_sites"].as_array().map_or(0, |s| s.len() as u64)).sum();
    let copies: u64 = probes.iter().filter_map(|p| p["coverage"]["inlined_probed"].as_u64()).sum();
    (sum("inline_sites_moved"), sum("inline_sites_single_stepped"), sum("inline_sites_gated"), sites - copies)
}

/// Created and destroyed objects by type name.
fn types(summary: &Value) -> BTreeMap<String, (u64, u64)> {
    let types = summary["types"].as_array().unwrap_or_else(|| panic!("no types in {summary}"));
    types
        .iter()
        .map(|t| {
            let field = |f: &str| t[f].as_u64().unwrap_or_else(|| panic!("no {f} in {t}"));
            (t["name"].as_str().expect("name").to_owned(), (field("created"), field("destroyed")))
        })
        .collect()
}

/// Runs varied.py under both placements at once and compares everything
/// they count.
fn moved_copies_read_what_their_first_points_read(root: Option<&Path>, python: &str) {
    require_root();
    let mut workload = Workload::script_with(root, python, "varied.py", &[N], &[], Aslr::Off);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid();
    let (moved, stepped, gated, more) = moved_and_stepped(pid, &[]);
    let (moved_entry, stepped_entry, _, more_entry) = moved_and_stepped(pid, &["--placement", "entry"]);
    assert!(moved > 0, "{python}: no copy is moved, so this compares nothing");
    // The round trips and empty lists run gated copies: counted with the
    // kernel's uprobe_profile on Debian's 3.11, the jumps before its gated
    // `_Py_Dealloc` copies ran 472,488 times over 461,000 round trips, the
    // copies 469,749.
    assert!(gated > 0, "{python}: no copy is probed at the jump into it, so this compares no gate");
    assert_eq!(moved_entry, 0, "{python}: --placement entry moved copies");
    assert_eq!(more_entry, 0, "{python}: --placement entry probes a copy twice");
    assert_eq!(
        stepped + moved - more,
        stepped_entry,
        "{python}: single-stepped and moved copies with the default placement"
    );
    let args = ["--types", "--interval", "3600"];
    let (placed, _) = TracerRun::attach_json(pid, &args);
    let (entry, _) = TracerRun::attach_json(pid, &[&args[..], &["--placement", "entry"]].concat());
    // Nothing runs in the target between the two attaches: it waits for
    // its go, and stays in a read after "done" until both are stopped.
    workload.go();
    workload.expect("done");
    workload.wait_blocked_reading(Some(5));
    placed.signal(libc::SIGINT);
    entry.signal(libc::SIGINT);
    let (placed, entry) = (placed.summary(), entry.summary());
    workload.close();
    for summary in [&placed, &entry] {
        for (name, value) in tracer_tests::misses(summary) {
            assert_eq!(value, 0, "{python}: BPF stat {name} is non-zero: {summary}");
        }
    }
    let (a, b) = (counts(&placed), counts(&entry));
    assert!(a["PyObject_Malloc"].0 > 3000 && a["_Py_NewReference"].0 > 30_000, "{python}: {a:?}");
    assert_eq!(a, b, "{python}: calls and bytes, placed vs entry");
    assert_eq!(placed["sizes"], entry["sizes"], "{python}: size histograms, placed vs entry");
    let (ta, tb) = (types(&placed), types(&entry));
    assert!(ta.get("__main__.Point").is_some_and(|&(created, _)| created >= 3000), "{python}: {ta:?}");
    assert_eq!(ta, tb, "{python}: objects by type, placed vs entry");
}

#[test]
fn debian_311_moved_copies_read_what_their_first_points_read() {
    let python = static_python();
    moved_copies_read_what_their_first_points_read(None, python.to_str().expect("UTF-8 path"));
}

#[test]
fn forky_313_moved_copies_read_what_their_first_points_read() {
    moved_copies_read_what_their_first_points_read(Some(&forky_root()), "/usr/bin/python3.13");
}

#[test]
fn forky_314_moved_copies_read_what_their_first_points_read() {
    moved_copies_read_what_their_first_points_read(Some(&forky_root()), "/usr/bin/python3.14");
}
