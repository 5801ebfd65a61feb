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
    let (Some(header), Some(layout)) = (abi.debug_offsets(), abi.debug_offsets_layout()) else { return Ok(table) };
    let (pid, image) = (target.pid, target.image_path.display().to_string());
    let fail = |reason: String| StackError::DebugOffsets { pid, image: image.clone(), reason };
    let bytes = remote.bytes(runtime, layout.size(), "_Py_DebugOffsets")?;
    if bytes.get(..8) != Some(&header.cookie[..]) {
        return Err(fail(format!(
            "does not start with the cookie {:?} (found {:02x?})",
            String::from_utf8_lossy(header.cookie),
            bytes.get(..8).unwrap_or_default()
        )));
    }
    let field = |name: &'static str| {
        layout.read(&bytes, name).ok_or_else(|| fail(format!("has no field {name} in tracer's layout for {version}")))
    };
    let published_version = field("version")?;
    let expected = u64::from(version.hex());
    if published_version != expected {
        return Err(fail(format!("says version {published_version:#x}, but Py_Version says {expected:#x}")));
    }
    if field("free_threaded")? != 0 {
        return Err(StackError::FreeThreaded { pid, image });
    }
    for p in table.published() {
        let published = field(p.field)?;
        if published != p.value {
            return Err(StackError::OffsetMismatch {
                pid,
                image,
                version,
                field: p.field,
                published,
                table: p.value,
            });
        }
    }
    Ok(table)
}
