//! The venvs `cargo xtask bench --only production` runs pyperformance's
//! benchmark functions in: pyperformance, pyperf and memray from the package
//! index, on Debian's LTO python3.11, pyenv's 3.11.7 and Debian forky's
//! python3.14 (inside the forky root). Made by `cargo xtask setup`; a venv
//! that already holds the pinned versions is left alone.
//!
//! The forky venv's packages cannot be fetched from inside the chroot: the
//! machine's pip configuration (its certificates, its index) is the host's.
//! So the host's pip downloads wheels for the chroot's interpreter (by its
//! version and glibc) into the root, and the chroot's pip installs them with
//! no index. Nothing is built from source: an interpreter that memray has no
//! wheel for gets no memray, and a marker file in its venv says so.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::setup::FORKY_ROOT;

const PYPERFORMANCE: &str = "pyperformance==1.14.*";
const PYPERF: &str = "pyperf";
const MEMRAY: &str = "memray==1.20.*";
/// What a check of a venv wants to read.
const PYPERFORMANCE_VERSION: &str = "1.14.";
const MEMRAY_VERSION: &str = "1.20.";
/// In a venv (host path) whose interpreter memray 1.20 has no wheel for;
/// holds pip's reason.
const NO_MEMRAY: &str = "tracer-no-memray-wheel";

/// The forky venv and the wheels fetched for it, as paths inside the root.
const FORKY_VENV: &str = "/opt/tracer/production-venv-3.14";
const FORKY_WHEELS: &str = "/opt/tracer/wheels";

/// The name of pyenv's 3.11.7 among [`pythons`], whose venv the cost
/// section uses too.
pub const PYENV_3_11: &str = "pyenv 3.11.7 (--enable-shared)";

/// One interpreter the production benchmark measures.
pub struct BenchPython {
    /// As the tables name it.
    pub name: &'static str,
    /// The chroot it runs in, if any.
    pub root: Option<&'static str>,
    /// The interpreter the venv was made from, as a path inside `root`.
    pub base: PathBuf,
    /// The venv, as a path inside `root`.
    pub venv: PathBuf,
}

impl BenchPython {
    /// The venv's interpreter, as a path inside the root.
    pub fn python(&self) -> PathBuf {
        self.venv.join("bin").join("python")
    }

    /// `path` (inside the root) as the host sees it.
    pub fn host(&self, path: &Path) -> PathBuf {
        match self.root {
            Some(r) => Path::new(r).join(path.strip_prefix("/").unwrap_or(path)),
            None => path.to_path_buf(),
        }
    }

    /// Whether the venv exists (its interpreter is a link to a path inside
    /// the root, which the host cannot follow).
    fn made(&self) -> bool {
        self.host(&self.venv).join("pyvenv.cfg").is_file()
    }

    /// Why this venv has no memray, if it has none.
    pub fn no_memray(&self) -> Option<String> {
        std::fs::read_to_string(self.host(&self.venv).join(NO_MEMRAY)).ok().map(|s| s.trim().to_owned())
    }

    /// A command running `program` inside the root.
    pub fn command(&self, program: &Path) -> Command {
        match self.root {
            Some(r) => {
                let mut c = Command::new("/usr/sbin/chroot");
                c.arg(r).arg(program);
                c
            }
            None => Command::new(program),
        }
    }
}

fn data_dir() -> PathBuf {
    crate::setup::pyperf_venv().parent().map_or_else(|| PathBuf::from("/root/.local/share/tracer"), Path::to_path_buf)
}

/// pyenv's root: `pyenv root`, else `$PYENV_ROOT`, else `~/.pyenv`.
fn pyenv_root() -> PathBuf {
    Command::new("pyenv")
        .arg("root")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .or_else(|| std::env::var_os("PYENV_ROOT").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".pyenv"))
}

/// The three interpreters, in the order the section reports them.
pub fn pythons() -> Vec<BenchPython> {
    vec![
        BenchPython {
            name: "Debian 12 python3.11 (LTO, static)",
            root: None,
            base: PathBuf::from("/usr/bin/python3.11"),
            venv: data_dir().join("production-venv-debian-3.11"),
        },
        BenchPython {
            name: PYENV_3_11,
            root: None,
            base: pyenv_root().join("versions").join("3.11.7").join("bin").join("python3.11"),
            venv: data_dir().join("production-venv-pyenv-3.11.7"),
        },
        BenchPython {
            name: "Debian forky python3.14 (LTO, static, chroot)",
            root: Some(FORKY_ROOT),
            base: PathBuf::from("/usr/bin/python3.14"),
            venv: PathBuf::from(FORKY_VENV),
        },
    ]
}

/// Makes every venv that is missing or lacks a pinned package.
pub fn ensure_all() -> anyhow::Result<()> {
    let pythons = pythons();
    for p in &pythons {
        if !p.host(&p.base).is_file() {
            bail!(
                "{} is missing ({}); the production benchmark needs it{}",
                p.host(&p.base).display(),
                p.name,
                if p.root.is_some() {
                    ""
                } else {
                    " (this machine kind ships it; `cargo xtask setup` installs Debian's)"
                }
            );
        }
        if complete(p) {
            continue;
        }
        eprintln!("xtask: making the production benchmark's venv for {} at {}", p.name, p.host(&p.venv).display());
        if !p.made() {
            crate::run(p.command(&p.base).args(["-m", "venv"]).arg(&p.venv))?;
        }
        if p.root.is_none() {
            install_from_index(p)?;
        } else {
            // The host's pip fetches: the Debian venv's, made just before.
            install_from_host_wheels(p, &pythons[0])?;
        }
        if !complete(p) {
            bail!("{} was installed in {} but does not import", PYPERFORMANCE, p.host(&p.venv).display());
        }
    }
    Ok(())
}

/// Whether the venv holds the pinned pyperformance, pyperf, and memray (or
/// the marker saying it has no wheel).
fn complete(p: &BenchPython) -> bool {
    let check = "import importlib.metadata as m, pyperf, pyperformance\n\
                 def v(n):\n    try:\n        return m.version(n)\n    except m.PackageNotFoundError:\n        return '-'\n\
                 print(v('pyperformance'), v('memray'))";
    if !p.made() {
        return false;
    }
    let Ok(out) = p.command(&p.python()).args(["-c", check]).output() else { return false };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    let (Some(perf), Some(memray)) = (words.next(), words.next()) else { return false };
    out.status.success()
        && perf.starts_with(PYPERFORMANCE_VERSION)
        && (memray.starts_with(MEMRAY_VERSION) || p.no_memray().is_some())
}

/// pip's output when the index has no distribution (no wheel) that fits.
fn no_distribution(stderr: &str) -> bool {
    stderr.contains("No matching distribution") || stderr.contains("Could not find a version")
}

/// Runs a pip command; Ok(false) when pip found no fitting distribution
/// (its reason written to the venv's marker), an error for anything else.
fn pip_maybe(p: &BenchPython, cmd: &mut Command, what: &str) -> anyhow::Result<bool> {
    eprintln!("xtask: $ {}", crate::shown(cmd));
    let out = cmd.output().with_context(|| format!("starting pip for {what}"))?;
    if out.status.success() {
        return Ok(true);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !no_distribution(&stderr) {
        bail!("pip failed for {what}:\n{stderr}");
    }
    let reason = format!(
        "{MEMRAY} has no wheel for {} (pip: {}); the production benchmark leaves its memray columns empty there",
        p.name,
        stderr
            .lines()
            .find(|l| l.contains("No matching distribution"))
            .or_else(|| stderr.lines().find(|l| no_distribution(l)))
            .unwrap_or("no matching distribution")
            .trim()
    );
    eprintln!("xtask: {reason}");
    let marker = p.host(&p.venv).join(NO_MEMRAY);
    std::fs::write(&marker, format!("{reason}\n")).with_context(|| format!("writing {}", marker.display()))?;
    Ok(false)
}

fn install_from_index(p: &BenchPython) -> anyhow::Result<()> {
    let python = p.python();
    crate::run(Command::new(&python).args(["-m", "pip", "install", "--quiet", PYPERFORMANCE, PYPERF]))?;
    // Only a wheel: building memray needs its C++ toolchain, and the
    // benchmark measures the memray users install.
    pip_maybe(
        p,
        Command::new(&python).args(["-m", "pip", "install", "--quiet", "--only-binary", "memray", MEMRAY]),
        "memray",
    )?;
    Ok(())
}

/// (X.Y, glibc minor) of the interpreter inside the root.
fn target_tags(p: &BenchPython) -> anyhow::Result<(String, u32)> {
    let out = p
        .command(&p.base)
        .args(["-c", "import os, sys; print('%d.%d' % sys.version_info[:2], os.confstr('CS_GNU_LIBC_VERSION'))"])
        .output()
        .with_context(|| format!("running {}", p.base.display()))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut words = text.split_whitespace();
    let (Some(version), Some("glibc"), Some(glibc)) = (words.next(), words.next(), words.next()) else {
        bail!("{} printed {text:?} for its version and glibc", p.base.display());
    };
    let minor = glibc
        .strip_prefix("2.")
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("{} runs on glibc {glibc}, not 2.x", p.base.display()))?;
    Ok((version.to_owned(), minor))
}

/// The host's pip downloads wheels for `p`'s interpreter into the root; the
/// chroot's pip installs them with no index.
fn install_from_host_wheels(p: &BenchPython, host: &BenchPython) -> anyhow::Result<()> {
    let tags = target_tags(p)?;
    let wheels = fresh_wheels(p)?;
    crate::run(&mut download(&host.python(), &tags, &wheels, &[PYPERFORMANCE, PYPERF]))
        .context("downloading pyperformance's wheels")?;
    let memray = pip_maybe(p, &mut download(&host.python(), &tags, &wheels, &[MEMRAY]), "memray")?;
    let mut install = from_wheels(p, &[PYPERFORMANCE, PYPERF]);
    if memray {
        install.arg(MEMRAY);
    }
    crate::run(&mut install)?;
    std::fs::remove_dir_all(&wheels).with_context(|| format!("removing {}", wheels.display()))
}

/// [`FORKY_WHEELS`] in `p`'s root, empty.
fn fresh_wheels(p: &BenchPython) -> anyhow::Result<PathBuf> {
    let wheels = p.host(Path::new(FORKY_WHEELS));
    if wheels.exists() {
        std::fs::remove_dir_all(&wheels).with_context(|| format!("removing {}", wheels.display()))?;
    }
    std::fs::create_dir_all(&wheels).with_context(|| format!("creating {}", wheels.display()))?;
    Ok(wheels)
}

/// The host's pip (`host`, a venv's python) downloading `packages`' wheels for an interpreter of
/// `(version, glibc minor)` into `wheels`.
fn download(host: &Path, (version, glibc): &(String, u32), wheels: &Path, packages: &[&str]) -> Command {
    let arch = std::env::consts::ARCH;
    let mut cmd = Command::new(host);
    cmd.args(["-m", "pip", "download", "--quiet", "--only-binary=:all:", "--implementation", "cp"])
        .args(["--python-version", version])
        .args(["--abi", &format!("cp{}", version.replace('.', "")), "--abi", "abi3", "--abi", "none"]);
    // Every manylinux the root's glibc runs, and the legacy aliases.
    for m in 5..=*glibc {
        cmd.args(["--platform", &format!("manylinux_2_{m}_{arch}")]);
    }
    for legacy in ["manylinux1", "manylinux2010", "manylinux2014", "linux"] {
        cmd.args(["--platform", &format!("{legacy}_{arch}")]);
    }
    cmd.arg("--dest").arg(wheels).args(packages);
    cmd
}

/// The chroot's pip installing `packages` into `p`'s venv from
/// [`FORKY_WHEELS`], with no index.
fn from_wheels(p: &BenchPython, packages: &[&str]) -> Command {
    let mut install = p.command(&p.python());
    install
        .args(["-m", "pip", "install", "--quiet", "--no-index", "--find-links", FORKY_WHEELS])
        .args(packages)
        // The host's pip settings name host paths.
        .env_remove("PIP_FIND_LINKS")
        .env_remove("PIP_CERT");
    install
}

/// forky's python3.13 with pyperf, for `tracer bench --root` (issue 24
/// measures both of forky's builds with it; 3.14's is its production venv).
pub const FORKY_PYPERF_3_13: &str = "/opt/tracer/pyperf-venv-3.13";

/// Makes [`FORKY_PYPERF_3_13`] unless it imports pyperf, with `host`'s
/// pip (a venv's python) fetching the wheels. A test needs it
/// (tests/tests/bench.rs), so the tests' setup makes it.
pub fn ensure_forky_pyperf(host: &Path) -> anyhow::Result<()> {
    let p = BenchPython {
        name: "Debian forky python3.13 (pyperf only)",
        root: Some(FORKY_ROOT),
        base: PathBuf::from("/usr/bin/python3.13"),
        venv: PathBuf::from(FORKY_PYPERF_3_13),
    };
    let imports =
        || p.made() && p.command(&p.python()).args(["-c", "import pyperf"]).output().is_ok_and(|o| o.status.success());
    if imports() {
        return Ok(());
    }
    eprintln!("xtask: making a venv with pyperf for {} at {}", p.name, p.host(&p.venv).display());
    if !p.made() {
        crate::run(p.command(&p.base).args(["-m", "venv"]).arg(&p.venv))?;
    }
    let tags = target_tags(&p)?;
    let wheels = fresh_wheels(&p)?;
    crate::run(&mut download(host, &tags, &wheels, &[PYPERF])).context("downloading pyperf's wheels")?;
    crate::run(&mut from_wheels(&p, &[PYPERF]))?;
    std::fs::remove_dir_all(&wheels).with_context(|| format!("removing {}", wheels.display()))?;
    if !imports() {
        bail!("pyperf was installed in {} but does not import", p.host(&p.venv).display());
    }
    Ok(())
}
