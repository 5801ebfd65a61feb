//! `tracer probes`: the attach plan, checked against the ELF bytes.

use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};
use tracer_tests::{require_root, run_tracer, shared_python, static_python};

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
    }
    plan
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

#[test]
fn probes_bad_input() {
    require_root();
    let (code, _, stderr) = run_tracer(&["probes", "--exe", "/usr/bin/sleep"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.starts_with("tracer: error: /usr/bin/sleep is not a CPython executable"), "{stderr}");
    let (code, _, stderr) = run_tracer(&["probes", "--exe", "/usr/bin/python3.11", "--placement", "middle"]);
    assert_eq!(stderr, "tracer: error: --placement must be auto or entry (got \"middle\")\n");
    assert_eq!(code, Some(2));
}
