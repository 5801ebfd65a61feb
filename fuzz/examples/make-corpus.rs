//! Makes the fuzz corpus (fuzz/corpus/TARGET/) from real inputs, as
//! docs/fuzzing.md describes: fuzz/corpus-src/tiny.c built by gcc in a
//! few ways, and cut short; the maps of live interpreters; code around the
//! inlined copies in the machine's LTO interpreters; memory images of live
//! interpreters' heaps. Files it does not make (the `regression-*` inputs
//! of crashes found and fixed) are left alone.
//!
//! ```sh
//! cargo run --manifest-path fuzz/Cargo.toml --example make-corpus
//! ```
//!
//! (as root, with `TRACER_EMPTY_BPF=1`; pyenv's 3.11.7, 3.12.1 and 3.13.0,
//! Debian's python3.11 and the forky root, which `cargo xtask setup`
//! installs, give the real inputs; those missing are said and skipped.)

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use tracer_fuzz::{X86Input, guarded};
use tracer_user::{
    discover::{elf::ElfImage, guards},
    heap::{bounds::Limits, image},
    python::{self, PythonVersion},
};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> Result<()> {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR"));
    let corpus = fuzz.join("corpus");
    let scratch = std::env::temp_dir().join(format!("tracer-make-corpus-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let result = make(fuzz, &corpus, &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn make(fuzz: &Path, corpus: &Path, scratch: &Path) -> Result<()> {
    let tiny = |name: &str, flags: &[&str]| -> Result<Vec<u8>> {
        let out = scratch.join(name);
        let status = Command::new("gcc")
            .args(["-O2", "-fPIC", "-shared", "-fno-semantic-interposition", "-Wl,-z,noseparate-code"])
            .args(flags)
            .arg("-o")
            .arg(&out)
            .arg(fuzz.join("corpus-src/tiny.c"))
            .status()?;
        if !status.success() {
            return Err(format!("gcc {flags:?} failed").into());
        }
        Ok(std::fs::read(out)?)
    };
    // ELF: symbols, segments, notes.
    let plain = tiny("plain.so", &["-DPY_HEX=0x030B07F0UL"])?;
    put(corpus, "elf", "tiny.so", &plain)?;
    put(corpus, "elf", "tiny-stripped.so", &tiny("stripped.so", &["-s"])?)?;
    for cut in [64, 700, plain.len() / 2, plain.len() - 100] {
        put(corpus, "elf", &format!("tiny-cut-{cut}.so"), &plain[..cut])?;
    }
    // Version: one image per version tracer reads, and one cut before its
    // data.
    for (name, hex) in [("3.11", 0x030B_07F0u32), ("3.12", 0x030C_01F0), ("3.13", 0x030D_00F0), ("3.14", 0x030E_00F0)] {
        let define = format!("-DPY_HEX={hex:#x}UL");
        let image = tiny(&format!("{name}.so"), &[define.as_str(), "-s"])?;
        if name == "3.13" {
            put(corpus, "version", "tiny-3.13-cut.so", &image[..image.len() * 3 / 4])?;
        }
        put(corpus, "version", &format!("tiny-{name}.so"), &image)?;
    }
    // DWARF: inlined copies and their parameters' locations, in the forms
    // GCC writes.
    let dwarf = tiny("dwarf.so", &["-g"])?;
    put(corpus, "dwarf", "tiny-g.so", &dwarf)?;
    put(corpus, "dwarf", "tiny-gdwarf4.so", &tiny("dwarf4.so", &["-gdwarf-4"])?)?;
    put(corpus, "dwarf", "tiny-gz.so", &tiny("gz.so", &["-g", "-gz=zlib"])?)?;
    put(corpus, "dwarf", "tiny-g-cut.so", &dwarf[..dwarf.len() * 2 / 3])?;
    // x86: tiny.so's code, and the machine's LTO interpreters'.
    x86(corpus, "tiny-3.13", &scratch.join("dwarf.so"), 13, "_Py_NewReference", 8)?;
    for (name, path, minor, function) in [
        ("debian-3.11", "/usr/bin/python3.11", 11, "_Py_NewReference"),
        ("forky-3.13", "/var/lib/tracer/forky/usr/bin/python3.13", 13, "_Py_NewReference"),
        ("forky-3.14", "/var/lib/tracer/forky/usr/bin/python3.14", 14, "_Py_NewReference"),
        ("forky-3.14-malloc", "/var/lib/tracer/forky/usr/bin/python3.14", 14, "PyObject_Malloc"),
    ] {
        if Path::new(path).is_file() {
            x86(corpus, name, Path::new(path), minor, function, 16)?;
        } else {
            eprintln!("make-corpus: {path} is missing (`cargo xtask setup`): no x86 input from it");
        }
    }
    // maps and heap images of live interpreters.
    let root = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from).join(".pyenv/versions");
    for (name, python) in [
        ("pyenv-3.11", root.join("3.11.7/bin/python3.11")),
        ("pyenv-3.12", root.join("3.12.1/bin/python3.12")),
        ("pyenv-3.13", root.join("3.13.0/bin/python3.13")),
        ("debian-3.11", PathBuf::from("/usr/bin/python3.11")),
    ] {
        if !python.is_file() {
            eprintln!("make-corpus: {} is missing: no maps or heap image from it", python.display());
            continue;
        }
        live(corpus, name, &python)?;
    }
    Ok(())
}

fn put(corpus: &Path, target: &str, name: &str, bytes: &[u8]) -> Result<()> {
    let dir = corpus.join(target);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(name), bytes)?;
    eprintln!("make-corpus: {target}/{name}: {} bytes", bytes.len());
    Ok(())
}

/// The x86 input for `function` of Python 3.`minor` in the image at
/// `path`: the function, `PyRefTracer_GetTracer`, and the code around its
/// first `sites` inlined copies (each from the start of the function that
/// holds it where that is short, else from the copy's read).
fn x86(corpus: &Path, name: &str, path: &Path, minor: u8, function: &str, sites: usize) -> Result<()> {
    let abi = python::abi_for(0, PythonVersion::from_hex(u32::from_be_bytes([3, minor, 0, 0xf0])))?;
    let wanted = guarded(abi);
    let probe = wanted.iter().position(|w| w.function == function).ok_or("no guarded probe of that name")?;
    let data = std::fs::read(path)?;
    let elf = ElfImage::parse(path, &data)?;
    let code = |address: u64, len: u64| -> Option<(u64, Vec<u8>)> {
        let offset = usize::try_from(elf.file_offset(address)?).ok()?;
        let len = usize::try_from(len.min(4096)).ok()?;
        Some((address, data.get(offset..offset + len)?.to_vec()))
    };
    let symbol = elf.function(function).ok_or("no such function")?;
    let mut input = X86Input {
        minor,
        probe: u8::try_from(probe)?,
        function: 0,
        size: u32::try_from(symbol.size)?,
        getter: None,
        data: (0, 0),
        chunks: vec![code(symbol.address, symbol.size.max(16)).ok_or("the function's code")?],
    };
    if let Some(getter) = elf.function("PyRefTracer_GetTracer") {
        input.getter = Some(i32::try_from(getter.address.wrapping_sub(symbol.address).cast_signed())?);
        input.chunks.extend(code(getter.address, getter.size.max(16)));
    }
    if let Some(python::Guard::TracemallocFlag { within, .. }) = wanted[probe].guard
        && let Some(within) = elf.symbol(within)
    {
        input.data = (within.address, within.size);
    }
    let scan = guards::scan_image(path, &data, &[wanted[probe]], None)?;
    let found = scan.functions.get(function).and_then(|f| f.as_ref().ok()).ok_or("the scan found no copies")?;
    let symbols = tracer_symbols(&data);
    for site in found.sites.iter().take(sites) {
        let at = site.read.address;
        let holder = symbols.iter().find(|(a, s)| *a <= at && at < a + s && *s <= 1024);
        let (start, len) = holder.map_or((at, 256), |&(a, s)| (a, s));
        input.chunks.extend(code(start, len));
    }
    input.chunks.sort_by_key(|c| c.0);
    input.chunks.dedup_by_key(|c| c.0);
    // The function's own chunk first: the offsets count from it.
    let first = input.chunks.iter().position(|c| c.0 == symbol.address).unwrap_or(0);
    input.chunks.swap(0, first);
    put(corpus, "x86", &format!("{name}.x86"), &input.to_bytes())
}

/// Every function symbol of an image: (address, size).
fn tracer_symbols(data: &[u8]) -> Vec<(u64, u64)> {
    use object::{Object as _, ObjectSymbol as _};
    let Ok(file) = object::File::parse(data) else { return Vec::new() };
    file.symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
        .map(|s| (s.address(), s.size()))
        .collect()
}

/// A workload whose heap holds objects of many kinds, inside pymalloc's
/// pools and outside them.
const WORKLOAD: &str = r#"
import sys, time
class Order:
    def __init__(self, i):
        self.i = i
        self.name = "order-%d" % i
        self.items = [i, i * 2.5, str(i), (i, i + 1)]
keep = [Order(i) for i in range(300)]
table = {"k%d" % i: (i, b"x" * i, bytearray(i), frozenset({i})) for i in range(200)}
large = ["y" * 2000 + str(i) for i in range(20)] + [list(range(100)) for _ in range(5)]
numbers = [10 ** 40 + i for i in range(100)]
print("ready", flush=True)
time.sleep(120)
"#;

/// The maps and a heap image of `python` running [`WORKLOAD`].
fn live(corpus: &Path, name: &str, python: &Path) -> Result<()> {
    let mut child = Command::new(python).args(["-c", WORKLOAD]).stdout(Stdio::piped()).spawn()?;
    let result = (|| -> Result<()> {
        let mut line = String::new();
        BufReader::new(child.stdout.take().ok_or("stdout")?).read_line(&mut line)?;
        if line.trim() != "ready" {
            return Err(format!("{} did not start: {line:?}", python.display()).into());
        }
        let maps = std::fs::read(format!("/proc/{}/maps", child.id()))?;
        put(corpus, "maps", &format!("{name}.maps"), &maps)?;
        // Cut inside a line.
        put(corpus, "maps", &format!("{name}-cut.maps"), &maps[..maps.len().min(700)])?;
        if name.starts_with("pyenv") {
            // A few pools and what they lead to, to keep each image near
            // 100 KB.
            let limits = Limits { gc_objects: 100, items: 1000, referenced: 100, rounds: 8 };
            let (image, _) = image::capture(child.id(), 4, limits)?;
            let bytes = image.to_bytes();
            put(corpus, "heap", &format!("{name}.thi"), &bytes)?;
            if name == "pyenv-3.12" {
                // Cut in the header, in the maps, and in the first pool.
                for cut in [30, 600, bytes.len().min(image.maps.len() + 8000)] {
                    put(corpus, "heap", &format!("{name}-cut-{cut}.thi"), &bytes[..cut])?;
                }
            }
        }
        Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}
