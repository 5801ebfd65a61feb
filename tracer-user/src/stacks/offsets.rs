//! The version module's frame table, checked in the process: from 3.13 on,
//! against the `_Py_DebugOffsets` the interpreter publishes at the start of
//! `_PyRuntime`. The table is what is used; a disagreement is an error
//! naming the field, rather than a guess at which side is right.

use super::{StackError, remote::Remote};
use crate::{
    discover::process::Target,
    python::{Abi, PythonVersion, frames::FrameOffsets},
};

/// `abi`'s table, after checking it against `_Py_DebugOffsets` at
/// `runtime` (the target's `_PyRuntime`) where the version has one.
pub fn checked(
    target: &Target,
    remote: &Remote,
    abi: &dyn Abi,
    version: PythonVersion,
    runtime: u64,
) -> Result<FrameOffsets, StackError> {
    let table = abi.frames();
    let Some(layout) = abi.debug_offsets_layout() else { return Ok(table) };
    let bytes = remote.bytes(runtime, layout.size(), "_Py_DebugOffsets")?;
    check(&bytes, abi, version, (target.pid, &target.image_path.display().to_string()))?;
    Ok(table)
}

/// Checks `abi`'s table against `bytes`, the target's `_Py_DebugOffsets`;
/// `(pid, image)` name the target in errors.
fn check(bytes: &[u8], abi: &dyn Abi, version: PythonVersion, (pid, image): (u32, &str)) -> Result<(), StackError> {
    let (Some(header), Some(layout)) = (abi.debug_offsets(), abi.debug_offsets_layout()) else { return Ok(()) };
    let image = image.to_owned();
    let fail = |reason: String| StackError::DebugOffsets { pid, image: image.clone(), reason };
    if bytes.get(..8) != Some(&header.cookie[..]) {
        return Err(fail(format!(
            "does not start with the cookie {:?} (found {:02x?})",
            String::from_utf8_lossy(header.cookie),
            bytes.get(..8).unwrap_or_default()
        )));
    }
    let field = |name: &'static str| {
        layout.read(bytes, name).ok_or_else(|| {
            fail(format!("cannot be read at {name}: tracer's layout for {version} lacks it, or too few bytes"))
        })
    };
    let published_version = field("version")?;
    let expected = u64::from(version.hex());
    if published_version != expected {
        return Err(fail(format!("says version {published_version:#x}, but Py_Version says {expected:#x}")));
    }
    if field("free_threaded")? != 0 {
        return Err(StackError::FreeThreaded { pid, image });
    }
    for p in abi.frames().published() {
        let published = field(p.field)?;
        if published != p.value {
            return Err(StackError::OffsetMismatch { pid, image, version, field: p.field, published, table: p.value });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::abi_for;

    /// `_Py_DebugOffsets` as an interpreter of `abi`'s version whose
    /// structures are those of the table would publish it.
    fn published_by(abi: &dyn Abi, version: PythonVersion) -> Vec<u8> {
        let layout = abi.debug_offsets_layout().expect("3.13+");
        let mut bytes = vec![0u8; layout.size()];
        bytes[..8].copy_from_slice(b"xdebugpy");
        let mut put = |field: &str, value: u64| {
            let at = layout.offset_of(field).expect("a field of the layout");
            bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
        };
        put("version", u64::from(version.hex()));
        for p in abi.frames().published() {
            put(p.field, p.value);
        }
        bytes
    }

    fn version(minor: u8) -> PythonVersion {
        PythonVersion { major: 3, minor, micro: 2, level: 0xF, serial: 0 }
    }

    #[test]
    fn agreeing_offsets_pass() {
        for minor in [13, 14] {
            let abi = abi_for(1, version(minor)).expect("supported");
            let bytes = published_by(abi, version(minor));
            check(&bytes, abi, version(minor), (7, "/usr/bin/python")).expect("the table agrees with itself");
        }
    }

    #[test]
    fn a_mismatch_names_the_field_both_values_the_pid_and_the_image() {
        let abi = abi_for(1, version(14)).expect("supported");
        let mut bytes = published_by(abi, version(14));
        let at = abi.debug_offsets_layout().and_then(|l| l.offset_of("interpreter_frame.owner")).expect("a field");
        bytes[at..at + 8].copy_from_slice(&75u64.to_le_bytes());
        let err = check(&bytes, abi, version(14), (42, "/usr/bin/python3.14")).expect_err("a mismatch");
        assert_eq!(
            err.to_string(),
            "_Py_DebugOffsets of PID 42 (/usr/bin/python3.14) says interpreter_frame.owner is 75, but tracer's table for Python 3.14.2 says 74"
        );
    }

    #[test]
    fn a_wrong_cookie_version_or_build_is_refused() {
        let abi = abi_for(1, version(13)).expect("supported");
        let good = published_by(abi, version(13));
        let mut cookie = good.clone();
        cookie[0] = b'X';
        let err = check(&cookie, abi, version(13), (1, "img")).expect_err("bad cookie");
        assert!(err.to_string().contains("does not start with the cookie \"xdebugpy\""), "{err}");
        let err = check(&good, abi, PythonVersion { micro: 3, ..version(13) }, (1, "img")).expect_err("other version");
        assert!(err.to_string().contains("says version 0x30d02f0, but Py_Version says 0x30d03f0"), "{err}");
        let mut free = good.clone();
        let at = abi.debug_offsets_layout().and_then(|l| l.offset_of("free_threaded")).expect("a field");
        free[at] = 1;
        assert!(matches!(check(&free, abi, version(13), (1, "img")), Err(StackError::FreeThreaded { pid: 1, .. })));
        let err = check(&good[..100], abi, version(13), (1, "img")).expect_err("short");
        assert!(err.to_string().contains("cannot be read at"), "{err}");
    }

    #[test]
    fn versions_without_debug_offsets_are_not_checked() {
        for minor in [11, 12] {
            let abi = abi_for(1, version(minor)).expect("supported");
            check(&[], abi, version(minor), (1, "img")).expect("nothing to check");
        }
    }
}
