//! Bad debug files (issue #10): a debug file of another build, a truncated
//! one and a corrupt one are each one line on stderr that names the file,
//! says what is wrong and what to do, with exit status 2 (bad input),
//! nothing on stdout and nothing attached; never a panic.
//!
//! The host's `/usr/lib/debug` has the right file for Debian's python3.11,
//! and tracer looks there first. So the target is a copy whose build-id (or
//! whose build-id note) is changed, as a rebuild would: no standard place
//! has a file for it, and the one in `--debug-dir` is consulted. Each test
//! shows that by first tracing with the good file in that place.

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use object::{Object as _, ObjectSection as _};
use serde_json::Value;
use tracer_tests::{Workload, probe_sites, read_sites, require_root, run_tracer, sites_in_file, static_python};

/// What every message about a bad debug file ends with.
const FIX: &str =
    "replace it with this build's debug file or remove it, or pass --no-inlined to probe without inlined copies";

/// Where GDB and tracer look for a build-id's debug file.
const SYSTEM_DEBUG_DIR: &str = "/usr/lib/debug";

/// A fresh directory for one test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("tracer-debug-files-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn put(path: &Path, data: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, data).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// `DIR/.build-id/xx/rest.debug`.
fn by_id(dir: &Path, id: &[u8]) -> PathBuf {
    dir.join(".build-id").join(hex(&id[..1])).join(format!("{}.debug", hex(&id[1..])))
}

/// Where the build-id's bytes are in an ELF file.
fn build_id_range(data: &[u8]) -> std::ops::Range<usize> {
    let file = object::File::parse(data).expect("an ELF file");
    let id = file.build_id().expect("readable notes").expect("a build-id");
    let start = id.as_ptr() as usize - data.as_ptr() as usize;
    start..start + id.len()
}

/// Debian's python3.11 and its debug file (from python3.11-dbg).
fn debian_python_and_debug_file() -> (Vec<u8>, Vec<u8>) {
    let image = std::fs::read(static_python()).unwrap();
    let id = &image[build_id_range(&image)];
    let debug = by_id(Path::new(SYSTEM_DEBUG_DIR), id);
    let debug = std::fs::read(&debug)
        .unwrap_or_else(|e| panic!("{}: {e}; run `cargo xtask setup` (python3.11-dbg)", debug.display()));
    (image, debug)
}

/// Writes an executable copy of an image at `path`.
fn install(path: &Path, image: &[u8]) {
    put(path, image);
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// `tracer probes --exe IMAGE --debug-dir DIR --json`, which must succeed.
fn plan(image: &Path, debug_dir: &Path) -> Value {
    let args = ["probes", "--exe", image.to_str().unwrap(), "--debug-dir", debug_dir.to_str().unwrap(), "--json"];
    let (code, stdout, stderr) = run_tracer(&args);
    assert_eq!(code, Some(0), "{stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON: {e}: {stdout}"))
}

/// Checks that `plan` took its DWARF from `source`, with every inlined
/// copy of `_Py_NewReference` it lists (209 in this build; copies found
/// otherwise may add to them), and returns the file offsets of every
/// inlined copy it would probe.
fn uses_the_dwarf_of(plan: &Value, source: &Path) -> Vec<u64> {
    let probes = plan["probes"].as_array().expect("probes");
    let new_ref = probes.iter().find(|p| p["symbol"] == "_Py_NewReference").expect("_Py_NewReference");
    assert_eq!(new_ref["coverage"]["source"], source.to_str().unwrap(), "{new_ref}");
    assert!(new_ref["coverage"]["inlined"].as_u64().is_some_and(|n| n >= 209), "{new_ref}");
    probes
        .iter()
        .flat_map(|p| p["inline_sites"].as_array().expect("inline_sites"))
        .map(|o| o.as_u64().unwrap())
        .collect()
}

/// `tracer attach --pid PID --debug-dir DIR` fails with exactly `expected`
/// and status 2, before attaching anything (no "attached" line).
fn refused(pid: u32, debug_dir: &Path, expected: &str) {
    let pid = pid.to_string();
    let args =
        ["attach", "--exact", "--pid", &pid, "--debug-dir", debug_dir.to_str().unwrap(), "--duration", "1", "--json"];
    let (code, stdout, stderr) = run_tracer(&args);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(stderr, format!("tracer: error: {expected}\n"));
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stdout, "");
}

/// The target runs on, its code at every function entry and at every
/// inlined copy that the good DWARF lists as the file has it.
fn untouched(workload: &mut Workload, image: &Path, inline_sites: &[u64]) {
    let pid = workload.pid();
    let image = image.to_str().unwrap();
    let symbols: Vec<String> =
        ["_Py_NewReference", "_Py_Dealloc", "PyObject_Malloc", "PyObject_Free"].map(str::to_owned).to_vec();
    let mut sites = probe_sites(pid, image, &symbols);
    sites.extend(sites_in_file(pid, image, inline_sites));
    assert!(sites.len() > 300, "{} sites", sites.len());
    for (site, bytes) in sites.iter().zip(read_sites(pid, &sites)) {
        assert_eq!(bytes, site.file_bytes, "{}", site.symbol);
    }
    workload.ping();
}

/// Found by build-id in `--debug-dir`: the debug file of another build (the
/// real python3.11's, for the rebuilt copy), the first 64 KiB of the right
/// one, the right one with its compressed `.debug_info` garbled, and the
/// right one decompressed with a DIE garbled.
#[test]
fn bad_debug_files_by_build_id() {
    require_root();
    let (mut image, debug) = debian_python_and_debug_file();
    let old_id = image[build_id_range(&image)].to_vec();
    let mut new_id = old_id.clone();
    *new_id.last_mut().unwrap() ^= 0xff;
    assert!(!by_id(Path::new(SYSTEM_DEBUG_DIR), &new_id).exists(), "the host has a debug file for the rebuilt id");
    let at = build_id_range(&image);
    image[at].copy_from_slice(&new_id);
    // The rebuilt copy's own debug file: the same DWARF, its build-id.
    let mut rebuilt = debug.clone();
    let at = build_id_range(&rebuilt);
    rebuilt[at].copy_from_slice(&new_id);

    let scratch = Scratch::new("by-id");
    let python = scratch.0.join("bin/python3.11");
    install(&python, &image);
    let good = scratch.0.join("good");
    put(&by_id(&good, &new_id), &rebuilt);
    let inline_sites = uses_the_dwarf_of(&plan(&python, &good), &by_id(&good, &new_id));

    let mut workload = Workload::serve(&python);
    let pid = workload.pid();
    // The image as tracer reaches it: its own path, the same file.
    let shown_image = python.display().to_string();
    let bad = |name: &str, data: &[u8]| {
        let dir = scratch.0.join(name);
        put(&by_id(&dir, &new_id), data);
        (dir.clone(), by_id(&dir, &new_id).display().to_string())
    };

    let (dir, file) = bad("another-build", &debug);
    let (old, new) = (hex(&old_id), hex(&new_id));
    refused(
        pid,
        &dir,
        &format!(
            "{file} has build-id {old}, but {shown_image} has build-id {new}: the debug file is for another build; {FIX}"
        ),
    );

    let (dir, file) = bad("truncated", &rebuilt[..64 * 1024]);
    refused(
        pid,
        &dir,
        &format!(
            "{file} is not a readable ELF file (truncated or corrupt?): Invalid ELF section header offset/size/alignment; {FIX}"
        ),
    );

    let mut garbled = rebuilt.clone();
    let section = object::File::parse(&*rebuilt).unwrap().section_by_name(".debug_info").map(|s| {
        let r = s.compressed_file_range().unwrap();
        (r.offset, r.compressed_size)
    });
    let (offset, size) = section.expect("a .debug_info section");
    let middle = usize::try_from(offset + size / 2).unwrap();
    garbled[middle..middle + 4096].fill(0xa5);
    let (dir, file) = bad("garbled-zlib", &garbled);
    refused(
        pid,
        &dir,
        &format!(
            "{file}: cannot read its .debug_info section (truncated or corrupt?): Invalid zlib compressed data; {FIX}"
        ),
    );

    // Uncompressed, so that the garbage reaches the DWARF reader: the
    // first unit's first DIE (after its 12-byte DWARF 5 header) gets an
    // abbreviation code its unit does not define (it has fewer than 126).
    let compressed = scratch.0.join("rebuilt.debug");
    put(&compressed, &rebuilt);
    let plain = scratch.0.join("plain.debug");
    let status = Command::new("objcopy")
        .arg("--decompress-debug-sections")
        .args([&compressed, &plain])
        .status()
        .expect("objcopy runs (apt-get install binutils)");
    assert!(status.success());
    let mut plain = std::fs::read(plain).unwrap();
    let info = object::File::parse(&*plain).unwrap().section_by_name(".debug_info").unwrap().file_range().unwrap();
    let first_die = usize::try_from(info.0).unwrap() + 12;
    // A one-byte ULEB128, replaced by one: the DIEs after it stay where
    // they were.
    assert!(plain[first_die] < 0x80, "abbreviation code {:#x}", plain[first_die]);
    plain[first_die] = 0x7e;
    let (dir, file) = bad("bad-die", &plain);
    refused(
        pid,
        &dir,
        &format!("{file}: malformed DWARF near .debug_info offset 0x0: invalid abbreviation code: 126; {FIX}"),
    );

    untouched(&mut workload, &python, &inline_sites);
}

/// Found by `.gnu_debuglink` name in `--debug-dir`, for a copy with no
/// build-id: another build's debug file under that name has another CRC32.
#[test]
fn a_debug_file_of_another_build_by_debuglink_name() {
    require_root();
    let (mut image, debug) = debian_python_and_debug_file();
    // The build-id note's type becomes 0, which is no build-id: the name
    // and its CRC32 are all that identify the debug file.
    let id = build_id_range(&image);
    image[id.start - 8..id.start - 4].copy_from_slice(&0u32.to_le_bytes());
    let file = object::File::parse(&*image).unwrap();
    assert_eq!(file.build_id().unwrap(), None);
    let (name, crc) = file.gnu_debuglink().unwrap().expect("a .gnu_debuglink");
    let name = std::str::from_utf8(name).unwrap().to_owned();
    assert_eq!(crc, crc32fast::hash(&debug), "python3.11's debuglink records its debug file's CRC32");

    let scratch = Scratch::new("by-name");
    let python = scratch.0.join("bin/python3.11");
    install(&python, &image);
    let good = scratch.0.join("good");
    put(&good.join(&name), &debug);
    let inline_sites = uses_the_dwarf_of(&plan(&python, &good), &good.join(&name));

    // Another build's: here the same DWARF with another build-id, which
    // changes the CRC32 as any rebuild does.
    let mut other = debug.clone();
    let at = build_id_range(&other);
    other[at.end - 1] ^= 0xff;
    let bad = scratch.0.join("bad");
    put(&bad.join(&name), &other);
    let mut workload = Workload::serve(&python);
    let pid = workload.pid();
    refused(
        pid,
        &bad,
        &format!(
            "{} has CRC32 {:08x}, but {}'s .gnu_debuglink records {crc:08x}: the debug file is for another build; {FIX}",
            bad.join(&name).display(),
            crc32fast::hash(&other),
            python.display()
        ),
    );
    untouched(&mut workload, &python, &inline_sites);
}
