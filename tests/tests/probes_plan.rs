//! `tracer probes`: the attach plan, checked against the ELF bytes.

use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};
use serde_json::Value;
use tracer_tests::{TracerRun, Workload, require_root, run_tracer, shared_python, static_python};

/// Runs `tracer probes --exe PYTHON --json` and checks every placement
/// against the image's own bytes: a placed probe sits on an instruction the
/// kernel emulates (a register push, a branch or a nop), an entry probe at
/// offset 0.
fn check(python: &std::path::Path) -> serde_json::Value {
    require_root();
    let (code, stdout, stderr) = run_tracer(&["probes", "--exe", python.to_str().unwrap(), "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    let plan: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let image = plan["image"].as_str().expect("image");
    let data = std::fs::read(image).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    let probes = plan["probes"].as_array().expect("probes");
    assert_eq!(probes.len(), 14, "{plan}");
    for p in probes {
        let name = p["symbol"].as_str().unwrap();
        let sym = elf.symbols().chain(elf.dynamic_symbols()).find(|s| s.name() == Ok(name)).expect("symbol");
        let file_offset = elf
            .segments()
            .find_map(|seg| {
                let d = sym.address().checked_sub(seg.address())?;
                (d < seg.file_range().1).then(|| seg.file_range().0 + d)
            })
            .unwrap();
        assert_eq!(p["file_offset"], file_offset, "{name}");
        let offset = p["offset"].as_u64().unwrap();
        assert!(offset < 32, "{name}: +{offset}");
        let at = usize::try_from(file_offset + offset).unwrap();
        let byte = data[at];
        if p["emulated"] == true {
            // push %reg, push %r8-15 (41 5x), jcc/jmp/call, or a nop.
            let ok = matches!(byte, 0x50..=0x57 | 0x70..=0x7f | 0xe8 | 0xe9 | 0xeb | 0x90)
                || (byte == 0x41 && (0x50..=0x57).contains(&data[at + 1]))
                || (byte == 0x0f && ((0x80..=0x8f).contains(&data[at + 1]) || data[at + 1] == 0x1f));
            assert!(ok, "{name}: +{offset} holds {byte:#x}, not an emulated instruction");
        } else {
            assert_eq!(offset, 0, "{name}: single-stepped probes stay at the entry");
            assert!(p["reason"].as_str().unwrap().starts_with("entry"), "{p}");
        }
        priced_by_its_sites(p, &plan["hit_cost_ns"]);
    }
    plan
}

/// Run as root, the plan prices each probe's hits at the calibrated cost
/// of one: exactly the emulated (or single-stepped) price where its sites
/// (its own placed probe and its inlined copies) are all of that kind, and
/// the range between the two where they are mixed.
fn priced_by_its_sites(p: &serde_json::Value, hit: &serde_json::Value) {
    let ns = |v: &serde_json::Value| v.as_f64().unwrap_or_else(|| panic!("hit_cost_ns: {hit}")).round();
    let (emulated_ns, stepped_ns) = (ns(&hit["emulated"]), ns(&hit["single_stepped"]));
    assert!(emulated_ns > 0.0 && emulated_ns < stepped_ns, "{hit}");
    let count = |k: &str| p[k].as_u64().unwrap_or(0);
    let own_emulated = u64::from(p["emulated"] == true);
    let (e, s) =
        (own_emulated + count("inline_sites_emulated"), 1 - own_emulated + count("inline_sites_single_stepped"));
    let cost = &p["cost_per_hit_ns"];
    #[allow(clippy::cast_precision_loss, reason = "ns")]
    let (low, high) =
        (cost["low_ns"].as_u64().expect("low_ns") as f64, cost["high_ns"].as_u64().expect("high_ns") as f64);
    let want = match (e, s) {
        (_, 0) => (emulated_ns, emulated_ns),
        (0, _) => (stepped_ns, stepped_ns),
        _ => (emulated_ns, stepped_ns),
    };
    assert_eq!((low, high), want, "{}: {e} emulated, {s} single-stepped sites: {cost}", p["symbol"]);
}

#[test]
fn shared_python_plan() {
    let plan = check(&shared_python());
    let new_ref = plan["probes"].as_array().unwrap().iter().find(|p| p["symbol"] == "_Py_NewReference").unwrap();
    // pyenv's 3.11.7: a rip-relative mov, then push %rbx.
    assert_eq!(new_ref["offset"], 7, "{new_ref}");
    assert_eq!(new_ref["instruction"], "push %rbx");
}

#[test]
fn static_python_plan() {
    check(&static_python());
}

/// `--placement call-sites` moves `_Py_Dealloc` (`mov 8(%rdi),%rax; jmp
/// *0x30(%rax)`: nothing emulated inside) to its callers, and every one of
/// them is a direct call or jump in the file named, which the kernel
/// emulates. The frees, whose addresses are stored in type objects and
/// allocator tables, stay at their entries with the reason.
fn check_call_sites(python: &std::path::Path) {
    require_root();
    let args = ["probes", "--exe", python.to_str().unwrap(), "--placement", "call-sites", "--json"];
    let (code, stdout, stderr) = run_tracer(&args);
    assert_eq!(code, Some(0), "{stderr}");
    let plan: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let probes = plan["probes"].as_array().expect("probes");
    let dealloc = probes.iter().find(|p| p["symbol"] == "_Py_Dealloc").expect("_Py_Dealloc");
    let sites = &dealloc["call_sites"];
    assert_eq!(sites["single_stepped"], 0, "{sites}");
    let files = sites["files"].as_array().expect("files");
    assert_eq!(files[0]["path"], plan["image"], "the image's own calls come first");
    let mut total = 0;
    for file in files {
        let data = std::fs::read(file["path"].as_str().unwrap()).unwrap();
        for offset in file["offsets"].as_array().unwrap() {
            let at = usize::try_from(offset.as_u64().unwrap()).unwrap();
            // call/jmp rel32, jmp rel8, jcc, optionally with a bnd prefix.
            let at = if data[at] == 0xf2 { at + 1 } else { at };
            let ok = matches!(data[at], 0xe8 | 0xe9 | 0xeb | 0x70..=0x7f)
                || (data[at] == 0x0f && (0x80..=0x8f).contains(&data[at + 1]));
            assert!(ok, "{}+{at:#x} holds {:#x}, not a direct call or jump", file["path"], data[at]);
            total += 1;
        }
    }
    assert_eq!(sites["emulated"], total);
    assert!(total > 1000, "{total} calls of _Py_Dealloc");
    assert!(files.len() > 10, "extension modules call it too: {} files", files.len());
    for name in ["PyObject_Free", "PyMem_Free"] {
        let p = probes.iter().find(|p| p["symbol"] == name).expect(name);
        if p["emulated"] == false {
            assert!(p["call_sites"].is_null(), "{p}");
            assert!(p["reason"].as_str().unwrap().contains("its address escapes"), "{p}");
        }
    }
}

#[test]
fn shared_python_call_sites() {
    check_call_sites(&shared_python());
}

#[test]
fn static_python_call_sites() {
    check_call_sites(&static_python());
}

/// `auto`, the default, probes pyenv 3.11's `_Py_Dealloc` (nothing emulated
/// inside it) at its call sites where tracer traces every event of one
/// running process, and inside it everywhere else: the production
/// profile, `--budget`, perf links and `--exe`. `tracer probes` shows
/// `attach --exact`'s plan.
#[test]
fn auto_takes_call_sites_only_tracing_one_running_process_exactly() {
    require_root();
    let python = shared_python();
    let mut workload = Workload::serve(&python);
    let pid = workload.pid();
    let sites = |attached: &Value| attached["call_sites"].get("_Py_Dealloc").and_then(Value::as_u64);
    let stop = |tracer: TracerRun| {
        tracer.signal(libc::SIGINT);
        let (status, _, stderr) = tracer.finish();
        assert!(status.success(), "{stderr}");
    };
    let (tracer, attached) = TracerRun::attach_json(pid, &["--interval", "3600"]);
    let exact = sites(&attached);
    // uprobe-multi links since Linux 6.6; CI's machines run 6.18.
    assert!(exact.is_some_and(|n| n > 1000), "{}", attached["call_sites"]);
    stop(tracer);
    let pid_arg = pid.to_string();
    let (code, stdout, stderr) = run_tracer(&["probes", "--pid", &pid_arg, "--probes", "refs", "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    let plan: Value = serde_json::from_str(&stdout).expect("JSON");
    let dealloc = plan["probes"].as_array().expect("probes").iter().find(|p| p["symbol"] == "_Py_Dealloc");
    let planned =
        dealloc.and_then(|p| Some(p["call_sites"]["emulated"].as_u64()? + p["call_sites"]["single_stepped"].as_u64()?));
    assert_eq!(planned, exact, "{plan}");
    for extra in [&["--budget", "1"][..], &["--links", "perf"]] {
        let (tracer, attached) = TracerRun::attach_json(pid, &[extra, &["--interval", "3600"]].concat());
        assert_eq!(sites(&attached), None, "{extra:?}: {}", attached["call_sites"]);
        stop(tracer);
    }
    let (tracer, attached) = TracerRun::profile_json(pid, &["--interval", "3600"]);
    assert_eq!((attached["mode"].as_str(), sites(&attached)), (Some("profile"), None), "{}", attached["call_sites"]);
    stop(tracer);
    let exe = python.to_str().expect("UTF-8 path");
    let (tracer, attached) = TracerRun::attach_json_with(&["--exe", exe, "--interval", "3600"]);
    assert_eq!(sites(&attached), None, "--exe: {}", attached["call_sites"]);
    stop(tracer);
    workload.ping();
}

#[test]
fn probes_bad_input() {
    require_root();
    let (code, _, stderr) = run_tracer(&["probes", "--exe", "/usr/bin/sleep"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.starts_with("tracer: error: /usr/bin/sleep is not a CPython executable"), "{stderr}");
    let (code, _, stderr) = run_tracer(&["probes", "--exe", "/usr/bin/python3.11", "--placement", "middle"]);
    assert_eq!(
        stderr,
        "tracer: error: invalid value 'middle' for '--placement <WHERE>'; possible values: auto, inside, entry, call-sites; see `tracer probes --help`\n"
    );
    assert_eq!(code, Some(2));
}

/// `tracer probes --live` names the allocator implementations the live
/// table probes, where `live_impl` traps in each and how its return is
/// read. A `ret` is single-stepped here (calibrated: dearer than a
/// uretprobe), and the uretprobe shares `live_impl`'s breakpoint: so each
/// return is read by uretprobe. `live_impl` (and the uretprobe) sit on the
/// first emulated instruction before the stack pointer or the arguments
/// change, else at the entry.
#[test]
fn shared_python_live_plan() {
    require_root();
    let python = shared_python();
    let (code, stdout, stderr) =
        run_tracer(&["probes", "--exe", python.to_str().unwrap(), "--probes", "alloc", "--live", "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    let plan: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let costs = &plan["return_costs_ns"];
    let ns = |k: &str| costs[k].as_f64().unwrap_or_else(|| panic!("return_costs_ns.{k}: {plan}"));
    assert!(ns("ret") > ns("uretprobe"), "{costs}");
    let impls = plan["live_impls"].as_array().unwrap_or_else(|| panic!("no live_impls: {plan}"));
    let names: Vec<&str> = impls.iter().map(|i| i["symbol"].as_str().unwrap()).collect();
    for name in ["_PyObject_Malloc", "_PyObject_Calloc", "_PyObject_Realloc", "_PyObject_Free", "_PyMem_RawMalloc"] {
        assert!(names.contains(&name), "{name} not planned: {names:?}");
    }
    for i in impls {
        assert_eq!(i["returns"]["how"], "uretprobe", "{i}");
        let at = &i["placement"];
        assert!(at["emulated"] == true || at["offset"] == 0, "{i}");
    }
    // pyenv's 3.11.7: `_PyObject_Malloc` starts with `lea -1(%rsi),%rax`,
    // which the kernel single-steps, then `push %rbx`, which it emulates;
    // `_PyObject_Free` with `test %rsi,%rsi; je …`.
    let at = |name: &str| impls.iter().find(|i| i["symbol"] == name).unwrap()["placement"].clone();
    let malloc = at("_PyObject_Malloc");
    assert_eq!((&malloc["offset"], &malloc["instruction"]), (&4.into(), &"push %rbx".into()), "{malloc}");
    let free = at("_PyObject_Free");
    assert_eq!(free["offset"], 3, "{free}");
    assert!(free["instruction"].as_str().unwrap().starts_with("je "), "{free}");
}
