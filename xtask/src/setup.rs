//! `cargo xtask setup`: the verified recipe from shared/TOOLCHAIN.md, made
//! idempotent. Each step checks first and does nothing when its result is
//! already there, so a second run takes seconds.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

/// Debian packages: the rustc-web compiler (matches the prebuilt bpf
/// `core`), LLVM 22 for bpf-linker, and Debian's static, LTO-built
/// python3.11 (a second test target) with its DWARF (python3.11-dbg), where
/// the tests find the copies LTO inlined.
const APT_PACKAGES: &[&str] = &[
    "rustc-web",
    "cargo-web",
    "libstd-rust-web-dev-bpf",
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "clang-22",
    "lld-22",
    "python3.11",
    "python3.11-dbg",
    // Debian splits ensurepip out of the interpreter: without it `python3.11
    // -m venv` makes no venv with pip, which the benchmark venvs need.
    "python3.11-venv",
    // For `cargo xtask bench`: the comparison against bpftrace.
    "bpftrace",
    // For the forky root below.
    "debootstrap",
    // objcopy: the tests make copies of the interpreters that no debug info
    // can be found for.
    "binutils",
    // `tracer top`'s test runs it in a terminal of tmux's.
    "tmux",
    // The exporter's tests read its page with the Prometheus client
    // library's own text-format parser.
    "python3-prometheus-client",
    // `go tool pprof`: the pprof tests read tracer's profiles with pprof
    // itself (Go 1.19's; about 60 s to install here, 330 MB).
    "golang-go",
    // The flame-graph test screenshots tracer's SVG in headless Chromium
    // (about 50 s to install here, 290 MB).
    "chromium",
];

/// A Debian testing (forky) root file system with Debian's LTO python3.13
/// and python3.14 and their debug info, made once per machine: the tests
/// run those interpreters as a container would, chrooted. Its path must
/// match `tracer_tests::FORKY_ROOT`.
pub const FORKY_ROOT: &str = "/var/lib/tracer/forky";

/// The packages the forky root gets, beyond debootstrap's minimal base;
/// the -venv packages (ensurepip, which Debian splits out) for the
/// production benchmark's venv (3.14) and `tracer bench --root`'s pyperf
/// venv (3.13).
const FORKY_PACKAGES: &[&str] = &["python3.13", "python3.14", "python3.13-venv", "python3.14-venv"];
const FORKY_DEBUG_PACKAGES: &[&str] = &["python3.13-dbg", "python3.14-dbg"];

/// Where tracer looks for pyperf by default; must match
/// `tracer_user::bench::default_venv` (xtask cannot depend on tracer-user:
/// building it needs the toolchain this installs).
pub fn pyperf_venv() -> PathBuf {
    let base = std::env::var_os("XDG_DATA_HOME").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".local/share"),
        PathBuf::from,
    );
    base.join("tracer").join("pyperf-venv")
}

/// speedscope, from the npm registry, which a test opens a pprof file in
/// (headless Chromium): the version whose pprof import the test was
/// written against.
const SPEEDSCOPE_VERSION: &str = "1.22.2";

/// Debian's bundle of the CAs the system trusts (ca-certificates).
const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Where setup installs speedscope; must match tests/tests/pprof.rs.
pub fn speedscope_dir() -> PathBuf {
    pyperf_venv().with_file_name("speedscope")
}

/// speedscope in [`speedscope_dir`], unless that version is there.
fn speedscope() -> anyhow::Result<()> {
    let dir = speedscope_dir();
    let package = dir.join("node_modules/speedscope/package.json");
    let installed = std::fs::read_to_string(&package)
        .is_ok_and(|text| text.contains(&format!("\"version\": \"{SPEEDSCOPE_VERSION}\"")));
    if installed {
        return Ok(());
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut npm = Command::new("npm");
    npm.args(["install", "--no-audit", "--no-fund", "--prefix"])
        .arg(&dir)
        .arg(format!("speedscope@{SPEEDSCOPE_VERSION}"));
    // Node trusts only the CAs built into it, where apt, pip (through
    // /etc/pip.conf) and cargo trust the system's: behind a proxy whose CA
    // only the system knows, npm fails where they work, as it did under
    // `env -i` on a machine of this kind.
    if std::env::var_os("NODE_EXTRA_CA_CERTS").is_none() && Path::new(SYSTEM_CA_BUNDLE).is_file() {
        npm.env("NODE_EXTRA_CA_CERTS", SYSTEM_CA_BUNDLE);
    }
    crate::run(&mut npm)?;
    if !dir.join("node_modules/speedscope/dist/release/index.html").is_file() {
        bail!("speedscope {SPEEDSCOPE_VERSION} was installed in {} but has no dist/release/index.html", dir.display());
    }
    Ok(())
}

const BPF_LINKER_VERSION: &str = "0.13.0";
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

/// What a task needs beyond the toolchain.
#[derive(Clone, Copy)]
pub struct Needs {
    /// The test targets: the forky root and its interpreters (which the
    /// production benchmark's venvs need too: main.rs makes those after,
    /// for `bench` and `setup` alone, so that a test run (CI) does not
    /// spend its time on them).
    pub tests: bool,
}

/// The toolchain, and what `needs` asks for.
pub fn run_for(needs: Needs) -> anyhow::Result<()> {
    check_os()?;
    apt_packages()?;
    bpf_linker()?;
    for (path, what) in [
        ("/usr/bin/rustc", "Debian's rustc-web"),
        ("/usr/lib/rustlib/bpfel-unknown-none", "the prebuilt bpf core (libstd-rust-web-dev-bpf)"),
        ("/sys/kernel/btf/vmlinux", "kernel BTF"),
        ("/usr/bin/python3.11", "Debian's python3.11"),
    ] {
        if !Path::new(path).exists() {
            bail!("{what} is missing after setup: {path} does not exist");
        }
    }
    pyperf()?;
    let mut made = Vec::new();
    if needs.tests {
        forky_root()?;
        forky_packages()?;
        made.push(format!("the forky root at {FORKY_ROOT}"));
        // The test run fuzzes too.
        ensure_cargo_fuzz()?;
        made.push(format!("cargo-fuzz {CARGO_FUZZ_VERSION}"));
        speedscope()?;
        made.push(format!("speedscope {SPEEDSCOPE_VERSION}"));
    }
    made.insert(0, "pyperf".to_owned());
    let made = made.join(", ");
    eprintln!("xtask: setup complete (BPF toolchain, bpf-linker {BPF_LINKER_VERSION}, python3.11, {made})");
    Ok(())
}

fn check_os() -> anyhow::Result<()> {
    let release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let field = |k: &str| {
        release.lines().find_map(|l| l.strip_prefix(k)?.strip_prefix('=')).map(|v| v.trim_matches('"').to_owned())
    };
    if field("ID").as_deref() == Some("debian") && field("VERSION_ID").as_deref() == Some("12") {
        return Ok(());
    }
    bail!(
        "xtask setup automates Debian 12 only (this is {}). Install by hand:\n\
         - a rustc with LLVM 22 and a prebuilt `core` for bpfel-unknown-none at /usr/bin/rustc and /usr/bin/cargo\n\
           (Debian: rustc-web cargo-web libstd-rust-web-dev-bpf), or a nightly with rust-src\n\
         - LLVM 22 development files (llvm-22-dev libpolly-22-dev libzstd-dev clang-22 lld-22)\n\
         - bpf-linker {BPF_LINKER_VERSION}: LLVM_SYS_221_PREFIX={LLVM_PREFIX} cargo install bpf-linker --version {BPF_LINKER_VERSION} --locked --no-default-features --features llvm-22\n\
         - CPython 3.11+ as python3, and a kernel with BTF, BPF and uprobes",
        field("PRETTY_NAME").unwrap_or_else(|| "an unknown OS".into())
    );
}

fn is_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

fn apt_packages() -> anyhow::Result<()> {
    let missing: Vec<&str> = APT_PACKAGES.iter().copied().filter(|p| !is_installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("missing Debian packages: {}; run as root: apt-get install -y {}", missing.join(" "), missing.join(" "));
    }
    crate::run(Command::new("apt-get").arg("update").arg("-q"))?;
    crate::run(
        Command::new("apt-get").env("DEBIAN_FRONTEND", "noninteractive").args(["install", "-y", "-q"]).args(&missing),
    )
}

/// cargo-fuzz's version, installed by `cargo xtask setup`.
pub const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// Installs cargo-fuzz unless this version is there.
pub fn ensure_cargo_fuzz() -> anyhow::Result<()> {
    let bin = cargo_bin_dir().join("cargo-fuzz");
    let current = Command::new(&bin).arg("--version").output().ok().filter(|o| o.status.success());
    if current.is_some_and(|o| String::from_utf8_lossy(&o.stdout).contains(CARGO_FUZZ_VERSION)) {
        return Ok(());
    }
    crate::run(crate::cargo().args(["install", "cargo-fuzz", "--version", CARGO_FUZZ_VERSION, "--locked"]))
        .context("installing cargo-fuzz")?;
    if !bin.is_file() {
        bail!("cargo-fuzz was installed but {} does not exist", bin.display());
    }
    Ok(())
}

pub fn cargo_bin_dir() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"))
        .join("bin")
}

fn bpf_linker() -> anyhow::Result<()> {
    let linker = cargo_bin_dir().join("bpf-linker");
    let current = Command::new(&linker)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    if current.as_deref().is_some_and(|v| v.contains(BPF_LINKER_VERSION)) {
        return Ok(());
    }
    // bpf-linker links bitcode from rustc-web, so it must be built against
    // the same LLVM (22).
    let path = format!("{LLVM_PREFIX}/bin:{}", std::env::var("PATH").unwrap_or_default());
    crate::run(
        Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .env("PATH", path)
            .env("LLVM_SYS_221_PREFIX", LLVM_PREFIX)
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--locked",
                "--no-default-features",
                "--features",
                "llvm-22",
            ]),
    )
    .context("installing bpf-linker")?;
    if !linker.is_file() {
        bail!("bpf-linker was installed but {} does not exist", linker.display());
    }
    Ok(())
}

/// A venv of the machine's python3 with pyperf from PyPI, for `tracer bench`.
fn pyperf() -> anyhow::Result<()> {
    ensure_pyperf_venv(&crate::real_python3()?, &pyperf_venv())
}

/// The venv `cargo xtask bench` makes from Debian's static
/// `/usr/bin/python3.11`, to measure tracer on that build too.
pub fn static_pyperf_venv() -> PathBuf {
    pyperf_venv().with_file_name("pyperf-venv-static")
}

/// Makes `venv` from `base` with pyperf in it, unless it has pyperf already.
pub fn ensure_pyperf_venv(base: &std::path::Path, venv: &std::path::Path) -> anyhow::Result<()> {
    let python = venv.join("bin").join("python");
    let has_pyperf = || Command::new(&python).args(["-c", "import pyperf"]).output().is_ok_and(|o| o.status.success());
    if has_pyperf() {
        return Ok(());
    }
    crate::run(Command::new(base).args(["-m", "venv"]).arg(venv))?;
    crate::run(Command::new(&python).args(["-m", "pip", "install", "--quiet", "pyperf"]))?;
    if !has_pyperf() {
        bail!("pyperf was installed in {} but does not import", venv.display());
    }
    Ok(())
}

/// The Debian mirror this machine's apt uses (its first `URIs:`), so that
/// no registry host is written into the project.
fn debian_mirror() -> anyhow::Result<String> {
    let path = "/etc/apt/sources.list.d/debian.sources";
    let sources = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    sources
        .lines()
        .find_map(|l| l.strip_prefix("URIs:"))
        .and_then(|u| u.split_whitespace().next())
        .map(str::to_owned)
        .with_context(|| format!("{path} names no URIs"))
}

/// Makes [`FORKY_ROOT`] with debootstrap (about 3 minutes and 1.1 GB the
/// first time), into a scratch directory renamed into place only when
/// complete, so an interrupted setup starts over rather than leaving half a
/// root that looks done.
fn forky_root() -> anyhow::Result<()> {
    let root = Path::new(FORKY_ROOT);
    let done = root.join(".tracer-setup-complete");
    if done.exists() {
        return Ok(());
    }
    let partial = PathBuf::from(format!("{FORKY_ROOT}.partial"));
    if partial.exists() {
        std::fs::remove_dir_all(&partial).with_context(|| format!("removing {}", partial.display()))?;
    }
    if root.exists() {
        std::fs::remove_dir_all(root).with_context(|| format!("removing the incomplete {}", root.display()))?;
    }
    std::fs::create_dir_all(partial.parent().unwrap_or(Path::new("/"))).context("creating /var/lib/tracer")?;
    let mirror = debian_mirror()?;
    eprintln!("xtask: making the forky root at {FORKY_ROOT} (once per machine; a few minutes)");
    // bookworm's debootstrap has no forky script; sid's works for it.
    crate::run(
        Command::new("/usr/sbin/debootstrap")
            // It runs chroot and friends by name.
            .env("PATH", format!("{}:/usr/sbin:/sbin", std::env::var("PATH").unwrap_or_default()))
            .arg("--variant=minbase")
            .arg(format!("--include={}", FORKY_PACKAGES.join(",")))
            .arg("forky")
            .arg(&partial)
            .arg(&mirror)
            .arg("/usr/share/debootstrap/scripts/sid"),
    )?;
    crate::run(
        Command::new("/usr/sbin/chroot")
            .arg(&partial)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["apt-get", "install", "-y", "-q"])
            .args(FORKY_DEBUG_PACKAGES),
    )?;
    for python in FORKY_PACKAGES.iter().filter(|p| !p.ends_with("-venv")) {
        let exe = partial.join("usr/bin").join(python);
        if !exe.is_file() {
            bail!("{} is missing from the forky root after debootstrap", exe.display());
        }
    }
    std::fs::rename(&partial, root).with_context(|| format!("moving {} into place", partial.display()))?;
    std::fs::write(&done, "").with_context(|| format!("writing {}", done.display()))
}

fn forky_installed(package: &str) -> bool {
    Command::new("/usr/sbin/chroot")
        .args([FORKY_ROOT, "dpkg-query", "-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

/// The version of `package` installed in the forky root.
fn forky_version(package: &str) -> anyhow::Result<String> {
    let out = Command::new("/usr/sbin/chroot")
        .args([FORKY_ROOT, "dpkg-query", "-W", "-f=${Version}", package])
        .output()
        .with_context(|| format!("asking dpkg in {FORKY_ROOT} for {package}"))?;
    if !out.status.success() || out.stdout.is_empty() {
        bail!(
            "{package} is not installed in {FORKY_ROOT}; remove {FORKY_ROOT} and rerun `cargo xtask setup` to remake it"
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Installs a package of [`FORKY_PACKAGES`] that a root made before it was
/// listed lacks. A `pythonX.Y-venv` is pinned to the installed `pythonX.Y`'s
/// version, so that it can never upgrade the interpreter (and orphan the
/// debug info the tests find by build-id); with the root's package lists
/// first, then with fresh ones.
fn forky_packages() -> anyhow::Result<()> {
    let missing: Vec<&str> = FORKY_PACKAGES.iter().copied().filter(|p| !forky_installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let mut pinned = Vec::new();
    for package in &missing {
        match package.strip_suffix("-venv") {
            Some(python) => pinned.push(format!("{package}={}", forky_version(python)?)),
            None => pinned.push((*package).to_owned()),
        }
    }
    let install = || {
        crate::run(
            Command::new("/usr/sbin/chroot")
                .arg(FORKY_ROOT)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .args(["apt-get", "install", "-y", "-q", "--no-upgrade"])
                .args(&pinned),
        )
    };
    if install().is_ok() {
        return Ok(());
    }
    crate::run(Command::new("/usr/sbin/chroot").arg(FORKY_ROOT).args(["apt-get", "update", "-q"]))?;
    install().with_context(|| {
        format!(
            "installing {} in {FORKY_ROOT} (the archive may have moved past its interpreters: remove {FORKY_ROOT} and rerun `cargo xtask setup` to remake it)",
            pinned.join(" ")
        )
    })
}
