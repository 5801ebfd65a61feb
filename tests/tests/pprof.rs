//! `--pprof FILE`: a gzipped profile.proto, read back here by a decoder of
//! the protobuf wire format written from pprof's published
//! `proto/profile.proto` (not tracer's own types): `--stacks`' events are
//! `alloc_objects`/`alloc_space` samples whose frames and values are the
//! summary's stacks exactly; growth's stacks are `inuse_objects`/
//! `inuse_space` samples that add up to the summary's growth stacks. The
//! readers users open it in read it too: `go tool pprof` and speedscope
//! (in headless Chromium).

use std::{
    collections::HashMap,
    io::Read as _,
    path::{Path, PathBuf},
};

use serde_json::Value;
use tracer_tests::{TracerRun, Workload, require_root, shared_python};

/// One field of a protobuf message: its number and its payload (a varint,
/// or the bytes of a length-delimited field).
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn varint(bytes: &[u8], at: &mut usize) -> u64 {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = bytes[*at];
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return v;
        }
    }
    panic!("a varint longer than 10 bytes");
}

/// The fields of `bytes`, in order.
fn fields(bytes: &[u8]) -> Vec<(u64, Field<'_>)> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < bytes.len() {
        let key = varint(bytes, &mut at);
        let field = match key & 7 {
            0 => Field::Varint(varint(bytes, &mut at)),
            2 => {
                let len = usize::try_from(varint(bytes, &mut at)).unwrap();
                at += len;
                Field::Bytes(&bytes[at - len..at])
            }
            wire => panic!("wire type {wire} is in no field profile.proto gives these messages"),
        };
        out.push((key >> 3, field));
    }
    out
}

/// The numbers of field `n` (repeated: packed, or one by one).
fn numbers(msg: &[u8], n: u64) -> Vec<u64> {
    let mut out = Vec::new();
    for (number, f) in fields(msg) {
        match f {
            Field::Varint(v) if number == n => out.push(v),
            Field::Bytes(packed) if number == n => {
                let mut at = 0;
                while at < packed.len() {
                    out.push(varint(packed, &mut at));
                }
            }
            _ => {}
        }
    }
    out
}

/// The embedded messages (or strings) of field `n`.
fn messages(msg: &[u8], n: u64) -> Vec<&[u8]> {
    fields(msg)
        .into_iter()
        .filter_map(|(number, f)| match f {
            Field::Bytes(b) if number == n => Some(b),
            _ => None,
        })
        .collect()
}

fn one(msg: &[u8], n: u64) -> u64 {
    numbers(msg, n).first().copied().unwrap_or(0)
}

/// A decoded profile: the sample types' names, and each sample's frames
/// (leaf first, as `function file:line`) and values.
struct Decoded {
    types: Vec<String>,
    default_type: String,
    samples: Vec<(Vec<String>, Vec<u64>)>,
}

/// `Profile`: `sample_type` 1, `sample` 2, `location` 4, `function` 5,
/// `string_table` 6, `default_sample_type` 14; `ValueType`: `type` 1;
/// `Sample`: `location_id` 1, `value` 2; `Location`: `id` 1, `line` 4;
/// `Line`: `function_id` 1, `line` 2; `Function`: `id` 1, `name` 2,
/// `filename` 4.
fn decode(path: &std::path::Path) -> Decoded {
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).expect("the profile"))
        .read_to_end(&mut bytes)
        .expect("gzipped");
    let strings: Vec<String> =
        messages(&bytes, 6).iter().map(|s| String::from_utf8(s.to_vec()).expect("UTF-8")).collect();
    let s = |i: u64| strings[usize::try_from(i).unwrap()].clone();
    let functions: HashMap<u64, String> =
        messages(&bytes, 5).iter().map(|f| (one(f, 1), format!("{} {}", s(one(f, 2)), s(one(f, 4))))).collect();
    let locations: HashMap<u64, String> = messages(&bytes, 4)
        .iter()
        .map(|l| {
            let line = messages(l, 4)[0];
            (one(l, 1), format!("{}:{}", functions[&one(line, 1)], one(line, 2)))
        })
        .collect();
    let types = messages(&bytes, 1).iter().map(|t| s(one(t, 1))).collect();
    let samples = messages(&bytes, 2)
        .iter()
        .map(|m| (numbers(m, 1).iter().map(|id| locations[id].clone()).collect(), numbers(m, 2)))
        .collect();
    Decoded { types, default_type: s(one(&bytes, 14)), samples }
}

/// A stack of the summary's JSON as the decoder shows frames.
fn frames(stack: &Value) -> Vec<String> {
    stack["frames"]
        .as_array()
        .expect("frames")
        .iter()
        .map(|f| {
            format!(
                "{} {}:{}",
                f["function"].as_str().unwrap(),
                f["file"].as_str().unwrap(),
                f["line"].as_u64().unwrap_or(0)
            )
        })
        .collect()
}

/// `p`'s samples are `stacks`, each with the values `values` gives it, in
/// any order; one has its leaf in the function `leaf` names.
fn same_samples(p: Decoded, stacks: &[Value], values: impl Fn(&Value) -> [u64; 5], leaf: &str) {
    let mut want: Vec<(Vec<String>, Vec<u64>)> = stacks.iter().map(|s| (frames(s), values(s).to_vec())).collect();
    let mut got = p.samples;
    want.sort();
    got.sort();
    assert_eq!(got, want);
    assert!(got.iter().any(|(f, _)| f[0].starts_with(leaf)), "{got:?}");
}

fn path(name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("tracer-test-{name}-{}.pb.gz", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// Exact tracing with `--stacks`: one sample per stack of the summary,
/// with its frames and its calls and bytes as `alloc_objects` and
/// `alloc_space`.
#[test]
fn stacks_are_alloc_samples() {
    require_root();
    let python = shared_python();
    let mut workload = Workload::script(None, python.to_str().unwrap(), "sites.py", &["300", "flat"]);
    let file = path("stacks");
    let (tracer, _) =
        TracerRun::attach_json(workload.pid(), &["--stacks", "--interval", "3600", "--pprof", file.to_str().unwrap()]);
    workload.go();
    workload.expect("done");
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    workload.close();
    assert!(status.success(), "tracer failed: {status}: {stderr}");
    assert!(stderr.contains("wrote a pprof profile of ") && stderr.contains(file.to_str().unwrap()), "{stderr}");
    let summary = lines.last().expect("a summary");
    let stacks = summary["stacks"].as_array().expect("the summary's stacks");
    let p = decode(&file);
    assert_eq!(p.types, ["alloc_objects", "alloc_space", "inuse_objects", "inuse_space", "free_objects"]);
    assert_eq!(p.default_type, "alloc_space");
    assert_eq!(p.samples.len(), stacks.len());
    // A free is no allocation: its calls are free_objects.
    let frees = |s: &Value| s["probe"].as_str().is_some_and(|p| p.ends_with("Free") || p == "_Py_Dealloc");
    assert!(stacks.iter().any(frees), "the default --stacks has the frees: {stacks:?}");
    let values = |s: &Value| {
        let (calls, bytes) = (s["calls"].as_u64().unwrap(), s["bytes"].as_u64().unwrap());
        if frees(s) { [0, 0, 0, 0, calls] } else { [calls, bytes, 0, 0, 0] }
    };
    same_samples(p, stacks, values, "make_b ");
    // pprof itself reads it: its total is the summary's calls of the
    // allocating functions, and its top function (by calls at the leaf)
    // the summary's.
    let top = go_pprof_top(&file, "alloc_objects");
    let allocs: Vec<&Value> = stacks.iter().filter(|s| !frees(s)).collect();
    let calls: u64 = allocs.iter().map(|s| s["calls"].as_u64().unwrap()).sum();
    assert_eq!(top.total, calls.to_string(), "{}", top.text);
    let free_calls: u64 = stacks.iter().filter(|s| frees(s)).map(|s| s["calls"].as_u64().unwrap()).sum();
    assert_eq!(go_pprof_top(&file, "free_objects").total, free_calls.to_string());
    let mut leaves: HashMap<String, u64> = HashMap::new();
    for s in allocs {
        *leaves.entry(s["frames"][0]["function"].as_str().unwrap().to_owned()).or_default() +=
            s["calls"].as_u64().unwrap();
    }
    let most = leaves.iter().max_by_key(|(name, calls)| (**calls, std::cmp::Reverse((*name).clone()))).unwrap();
    assert_eq!(
        (top.first.as_str(), top.first_flat.as_str()),
        (most.0.as_str(), most.1.to_string().as_str()),
        "{}",
        top.text
    );
    let _ = std::fs::remove_file(&file);
}

/// Python's own names in angle brackets (`<module>`, `f.<locals>.g`) are
/// what `go tool pprof` shows, not `<unknown>` and `f.`: it takes a
/// function whose name is its system name for an undemangled C++ symbol
/// and cuts template arguments out of it.
#[test]
fn python_names_in_angle_brackets_survive_go_pprof() {
    use std::io::Write as _;
    require_root();
    let file = path("brackets");
    let program = "import sys\n\
        print('ready', flush=True); sys.stdin.readline()\n\
        for i in range(3000): b = bytearray(100)\n\
        def outer():\n    def inner():\n        for i in range(3000): b = bytearray(100)\n    inner()\n\
        outer()\nprint('done', flush=True); sys.stdin.readline()\n";
    let mut python = tracer_tests::KillOnDrop(
        std::process::Command::new(shared_python())
            .args(["-c", program])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("run python"),
    );
    let out = tracer_tests::Lines::new(python.stdout.take().expect("piped stdout"));
    assert_eq!(out.next_line("ready").as_deref(), Some("ready"));
    let (tracer, _) =
        TracerRun::attach_json(python.id(), &["--stacks", "--interval", "3600", "--pprof", file.to_str().unwrap()]);
    let mut stdin = python.stdin.take().expect("piped stdin");
    writeln!(stdin, "go").expect("go");
    assert_eq!(out.next_line("done").as_deref(), Some("done"));
    tracer.signal(libc::SIGINT);
    let (status, _, stderr) = tracer.finish();
    drop(stdin);
    assert!(status.success(), "tracer failed: {status}: {stderr}");
    let top = go_pprof_top(&file, "alloc_objects");
    let names: Vec<String> = top
        .text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
        .map(|row| row.split_whitespace().skip(5).collect::<Vec<_>>().join(" "))
        .collect();
    assert!(!names.iter().any(|n| n == "<unknown>"), "{}", top.text);
    assert!(names.iter().any(|n| n == "<module>"), "{}", top.text);
    assert!(names.iter().any(|n| n == "outer.<locals>.inner"), "{}", top.text);
    let _ = std::fs::remove_file(&file);
}

/// What `go tool pprof -top -sample_index=INDEX` prints of a profile: the
/// total, and the first row's function and flat value.
struct Top {
    text: String,
    total: String,
    first: String,
    first_flat: String,
}

fn go_pprof_top(file: &std::path::Path, index: &str) -> Top {
    let out = std::process::Command::new("go")
        .args(["tool", "pprof", "-top", &format!("-sample_index={index}")])
        .arg(file)
        .env("HOME", std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
        .output()
        .expect("go: run `cargo xtask setup` (Debian's golang-go)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "go tool pprof: {}{text}", String::from_utf8_lossy(&out.stderr));
    // "Showing nodes accounting for 300, 100% of 300 total"
    let total = text
        .lines()
        .find_map(|l| l.strip_prefix("Showing nodes accounting for ")?.split(" of ").nth(1)?.strip_suffix(" total"))
        .unwrap_or_else(|| panic!("no total: {text}"))
        .to_owned();
    // The rows after the heading: flat flat% sum% cum cum% function.
    let row = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .nth(1)
        .unwrap_or_else(|| panic!("no rows: {text}"));
    let words: Vec<&str> = row.split_whitespace().collect();
    Top { first: words[5..].join(" "), first_flat: words[0].to_owned(), total, text }
}

/// speedscope's page, where `cargo xtask setup` installs it
/// (xtask/src/setup.rs `speedscope_dir`).
fn speedscope_page() -> PathBuf {
    let base = std::env::var_os("XDG_DATA_HOME").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".local/share"),
        PathBuf::from,
    );
    base.join("tracer/speedscope/node_modules/speedscope/dist/release/index.html")
}

/// What speedscope shows of `file` in its sandwich view, loaded as its
/// command line loads one (a script that calls
/// `speedscope.loadFileFromBase64`), in headless Chromium: each row's
/// (total, self, symbol), and what its console said.
fn speedscope_sandwich(file: &Path) -> (Vec<[String; 3]>, String) {
    const CHROMIUM: &str = "/usr/bin/chromium";
    let page = speedscope_page();
    assert!(page.is_file(), "{} is missing: run `cargo xtask setup` (speedscope from npm)", page.display());
    assert!(Path::new(CHROMIUM).is_file(), "{CHROMIUM} is missing: run `cargo xtask setup` (Debian's chromium)");
    let name = file.file_name().unwrap().to_str().unwrap();
    let dir = std::env::temp_dir().join(format!("tracer-speedscope-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("load.js");
    let bytes = std::fs::read(file).unwrap();
    let call = format!("speedscope.loadFileFromBase64({:?}, {:?})", name, base64(&bytes));
    std::fs::write(&script, call).unwrap();
    let out = std::process::Command::new("timeout")
        .arg("120")
        .arg(CHROMIUM)
        // Chromium's sandbox refuses to run as root; the page is a file.
        .args(["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--allow-file-access-from-files"])
        .args(["--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000", "--dump-dom"])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg(format!("file://{}#localProfilePath={}&view=sandwich", page.display(), script.display()))
        .output()
        .expect("run chromium");
    let console = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "chromium: {}", out.status);
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    let _ = std::fs::remove_dir_all(&dir);
    // The page's text nodes, in order; the rows follow the table's heading.
    let texts: Vec<String> = dom
        .split('>')
        .filter_map(|part| part.split('<').next())
        .map(|t| t.trim().replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))
        .filter(|t| !t.is_empty())
        .collect();
    assert!(texts.iter().any(|t| *t == format!("{name} - speedscope")), "not loaded: {texts:?}\n{console}");
    let rows = texts
        .iter()
        .skip_while(|t| *t != "Symbol Name")
        .skip(1)
        .cloned()
        .collect::<Vec<_>>()
        .chunks_exact(3)
        .map(|r| [r[0].clone(), r[1].clone(), r[2].clone()])
        .collect();
    (rows, console)
}

/// Standard base64 of `bytes`.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The production profile with growth: growth's stacks as inuse samples
/// adding up to the summary's growth stacks, and the default type
/// `inuse_space`.
#[test]
fn growth_stacks_are_inuse_samples() {
    require_root();
    let python = shared_python();
    let mut workload = Workload::script(None, python.to_str().unwrap(), "growth.py", &["steady", "300", "1000"]);
    workload.wait_blocked_on_stdin();
    let file = path("growth");
    let pid = workload.pid().to_string();
    let (tracer, _) =
        TracerRun::attach_json_as(&["--pid", &pid, "--growth", "--interval", "1", "--pprof", file.to_str().unwrap()]);
    workload.go();
    workload.expect("done");
    let _kept = workload.next_line("kept");
    workload.wait_blocked_reading(Some(5));
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    workload.close();
    assert!(status.success(), "tracer failed: {status}: {stderr}");
    let summary = lines.last().expect("a summary");
    let stacks = summary["growth"]["stacks"].as_array().expect("growth's stacks");
    assert!(!stacks.is_empty(), "{summary}");
    let p = decode(&file);
    assert_eq!(p.default_type, "inuse_space");
    same_samples(
        p,
        stacks,
        |s| [0, 0, s["samples"].as_u64().unwrap(), s["in_use_bytes"].as_u64().unwrap(), 0],
        "grow ",
    );
    // speedscope reads it as pprof: each stack's leaf is a symbol with
    // bytes of its own, and `grow`, the only one here, holds them all.
    let (rows, console) = speedscope_sandwich(&file);
    assert!(console.contains("Importing as protobuf encoded pprof file"), "{console}");
    for stack in stacks {
        let leaf = stack["frames"][0]["function"].as_str().unwrap();
        let row = rows.iter().find(|r| r[2] == leaf).unwrap_or_else(|| panic!("no {leaf} in {rows:?}"));
        assert!(!row[1].starts_with("0 B"), "{leaf} has no bytes of its own: {rows:?}");
    }
    let grow = rows.iter().find(|r| r[2] == "grow").unwrap_or_else(|| panic!("no grow in {rows:?}"));
    assert!(grow[1].ends_with("(100%)"), "{rows:?}");
    let _ = std::fs::remove_file(&file);
}
