//! What `--python` is, asked of it before anything is measured: tracer's
//! helper script's `info`, and, where that fails, a line any Python runs,
//! so that a crash of tracer's own script on a CPython tracer supports is
//! reported as tracer's (exit status 1), not as the user's bad input.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{
    BenchError,
    child::stderr_line,
    root::{chrooted, seen_in},
};

/// The helper's `info`.
#[derive(Deserialize)]
pub(super) struct Info {
    /// The file `sys.executable` links to, as the interpreter sees it.
    pub real: PathBuf,
    pub pyperf: Option<String>,
    /// `sys.implementation.name`.
    pub implementation: String,
    /// `sys.version_info[:2]`.
    pub version: (u8, u8),
}

/// Runs `helper info` with `python` (chrooted in `root`): its answer, or
/// why `python` is not an interpreter tracer bench takes.
pub(super) fn check(python: &Path, root: Option<&Path>, helper: &Path) -> Result<Info, BenchError> {
    let out = chrooted(root, python)
        .arg(seen_in(root, helper))
        .arg("info")
        .output()
        .map_err(|cause| BenchError::Python { python: python.to_owned(), cause })?;
    let not_cpython = |why: String| BenchError::NotCPython { python: python.to_owned(), why };
    if !out.status.success() {
        let status = out.status.code().map_or_else(|| out.status.to_string(), |c| format!("exit status {c}"));
        let failed = format!("tracer's helper script run with it ended with {status} ({})", stderr_line(&out.stderr));
        return Err(match identify(python, root) {
            // A CPython tracer supports that the script failed on: the
            // script's fault, tracer's to fix.
            Some((implementation, version)) if implementation == "CPython" && supported(version) => {
                BenchError::Step { what: format!("asking {} what it is", python.display()), detail: failed }
            }
            Some((implementation, version)) if implementation == "CPython" => unsupported(python, version),
            Some((implementation, _)) => not_cpython(format!("it is {implementation}")),
            None => not_cpython(failed),
        });
    }
    let info: Info = serde_json::from_slice(&out.stdout)
        .map_err(|e| not_cpython(format!("it did not answer tracer's helper script as Python does ({e})")))?;
    if info.implementation != "cpython" {
        return Err(not_cpython(format!("its sys.implementation.name is {:?}", info.implementation)));
    }
    if !supported(info.version) {
        return Err(unsupported(python, info.version));
    }
    Ok(info)
}

fn unsupported(python: &Path, (major, minor): (u8, u8)) -> BenchError {
    BenchError::Unsupported { python: python.to_owned(), version: format!("{major}.{minor}") }
}

/// Whether tracer has an ABI module for this version.
fn supported((major, minor): (u8, u8)) -> bool {
    let version = crate::python::PythonVersion { major, minor, micro: 0, level: 0xF, serial: 0 };
    crate::python::abi_for(0, version).is_ok()
}

/// `platform.python_implementation()` and the version, by a line that
/// Python 2 runs as well as 3; `None` where `python` does not answer it.
fn identify(python: &Path, root: Option<&Path>) -> Option<(String, (u8, u8))> {
    let line = "import platform, sys; sys.stdout.write('%s %d %d\\n' % \
                (platform.python_implementation(), sys.version_info[0], sys.version_info[1]))";
    let out = chrooted(root, python).args(["-c", line]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let mut words = text.split_whitespace();
    let (name, major, minor) = (words.next()?, words.next()?.parse().ok()?, words.next()?.parse().ok()?);
    words.next().is_none().then(|| (name.to_owned(), (major, minor)))
}
