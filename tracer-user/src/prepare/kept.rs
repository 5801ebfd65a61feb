//! The calibration kept for the rest of the boot, in
//! `/run/tracer/calibration.json`.
//!
//! Measuring what a hit costs takes seconds (each detach of the
//! calibration's probes waits for an RCU grace period), and the figures
//! depend on the CPU, the kernel and tracer's own build, none of which a
//! boot changes. So tracer measures once and every later run of the same
//! build reuses the figures for an hour: the `attach` of a profile or
//! `--exact --live` starts about three seconds sooner. The record carries
//! the boot's ID, the kernel's release and the identity of tracer's
//! executable (device, inode, size, modification time); any difference,
//! a record older than [`MAX_AGE`] or from the future, or a figure that is
//! not a plausible cost, and tracer measures again and replaces it. The
//! costs reported say when they were measured (`calibrated_unix_s`).
//!
//! Reading and writing are best effort: a run that cannot keep the record
//! (no root, so no `/run/tracer`) measures each time, as before. The file
//! is read only when tracer's own user owns it and nobody else may write
//! it, and never through a symbolic link.

use std::{
    fs::{self, DirBuilder, OpenOptions},
    io::{Read as _, Write as _},
    os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _},
    path::Path,
    time::{Duration, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};

use super::calibrate::{self, Calibration, CalibrationError, now_unix_s};

/// Where the record is kept: a tmpfs that a reboot empties.
pub const DIR: &str = "/run/tracer";
const FILE: &str = "calibration.json";
/// How long a record is used: hit costs drift little, but a machine's
/// CPU frequency policy or its host's load may change within hours.
pub const MAX_AGE: Duration = Duration::from_hours(1);
/// Bumped whenever the record's fields change meaning.
const FORMAT: u32 = 1;
/// A record is a few hundred bytes; anything much larger is not one.
const MAX_BYTES: u64 = 16 * 1024;
/// No probe hit costs a millisecond; a figure above is a broken record.
const MAX_NS: f64 = 1e6;

/// What a record must match to be used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Key {
    format: u32,
    boot_id: String,
    kernel: String,
    /// tracer's executable: (device, inode, size, modification time in ns).
    exe: (u64, u64, u64, i128),
}

#[derive(Serialize, Deserialize)]
struct Record {
    key: Key,
    calibration: Calibration,
}

/// The key of this boot, kernel and build; `None` when one of them cannot
/// be read (then nothing is kept).
fn key() -> Option<Key> {
    let short = |path: &str| {
        let text = fs::read_to_string(path).ok()?;
        let text = text.trim();
        (!text.is_empty() && text.len() <= 128).then(|| text.to_owned())
    };
    let exe = fs::metadata("/proc/self/exe").ok()?;
    let modified = exe.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    Some(Key {
        format: FORMAT,
        boot_id: short("/proc/sys/kernel/random/boot_id")?,
        kernel: short("/proc/sys/kernel/osrelease")?,
        exe: (exe.dev(), exe.ino(), exe.size(), i128::try_from(modified.as_nanos()).ok()?),
    })
}

/// [`HitCosts`](crate::plan::HitCosts) on this machine, and with `returns`
/// what each way of reading a return value costs: as kept from an earlier
/// run of this build in this boot, or else measured now
/// ([`calibrate::calibrate`]) and kept.
///
/// # Errors
/// As [`calibrate::calibrate`].
pub fn calibration(returns: bool) -> Result<Calibration, CalibrationError> {
    let dir = Path::new(DIR);
    if let Some(mut kept) = read(dir, returns) {
        // Kept with the returns' costs by a run that read returns: a run
        // that does not has no use for them, and reports none.
        if !returns {
            kept.returns = None;
            kept.cpu.uretprobe_return_ns = None;
        }
        return Ok(kept);
    }
    let measured = calibrate::calibrate(returns)?;
    write(dir, &measured);
    Ok(measured)
}

/// The calibration kept in `dir`, when it fits: same key, `returns`
/// measured if asked for, younger than [`MAX_AGE`], every figure plausible.
#[must_use]
pub fn read(dir: &Path, returns: bool) -> Option<Calibration> {
    let key = key()?;
    let text = read_own_file(&dir.join(FILE))?;
    let record: Record = serde_json::from_str(&text).ok()?;
    let c = record.calibration;
    let age = now_unix_s() - c.hit.calibrated_unix_s?;
    let fits = record.key == key
        && (c.returns.is_some() || !returns)
        && (0.0..MAX_AGE.as_secs_f64()).contains(&age)
        && plausible(&c);
    fits.then_some(c)
}

/// Keeps `calibration` in `dir` for later runs, replacing what is there;
/// best effort (see the module's documentation).
pub fn write(dir: &Path, calibration: &Calibration) {
    let Some(key) = key() else { return };
    let Ok(text) = serde_json::to_string(&Record { key, calibration: *calibration }) else { return };
    if DirBuilder::new().recursive(true).mode(0o700).create(dir).is_err() {
        return;
    }
    // Written aside, then renamed over: a run reading meanwhile sees the
    // old record or the new one, never half of one.
    let aside = dir.join(format!("{FILE}.{}", std::process::id()));
    let written = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&aside)
        .and_then(|mut f| f.write_all(text.as_bytes()));
    if written.is_err() || fs::rename(&aside, dir.join(FILE)).is_err() {
        let _ = fs::remove_file(&aside);
    }
}

/// The text of `path` when it is a regular file of this user's that no one
/// else may write, and small.
fn read_own_file(path: &Path) -> Option<String> {
    let file = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path).ok()?;
    let meta = file.metadata().ok()?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if !meta.is_file() || meta.uid() != euid || meta.mode() & 0o022 != 0 || meta.len() > MAX_BYTES {
        return None;
    }
    let mut text = String::new();
    file.take(MAX_BYTES).read_to_string(&mut text).ok()?;
    Some(text)
}

/// Every figure finite, not negative, and under [`MAX_NS`].
fn plausible(c: &Calibration) -> bool {
    let mut figures =
        vec![c.hit.single_stepped_ns, c.hit.emulated_ns, c.cpu.hit.single_stepped_ns, c.cpu.hit.emulated_ns];
    figures.extend(c.cpu.uretprobe_return_ns);
    if let Some((costs, measured)) = c.returns {
        figures.extend([costs.hit.single_stepped_ns, costs.hit.emulated_ns, costs.uretprobe_return_ns]);
        figures.extend([measured.uretprobe_ns, measured.ret_ns, measured.placed_ns]);
    }
    figures.iter().all(|f| f.is_finite() && (0.0..MAX_NS).contains(f))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::{
        plan::{
            HitCosts,
            returns::{ReturnCosts, ReturnMeasurement},
        },
        prepare::calibrate::Prices,
    };

    fn calibration(returns: bool, at: f64) -> Calibration {
        let hit = HitCosts { single_stepped_ns: 9000.0, emulated_ns: 450.0, calibrated_unix_s: Some(at) };
        let measured = ReturnMeasurement { uretprobe_ns: 1500.0, ret_ns: 9000.0, placed_ns: 450.0 };
        Calibration {
            hit,
            returns: returns.then_some((ReturnCosts { hit, uretprobe_return_ns: 1050.0 }, measured)),
            cpu: Prices { hit, uretprobe_return_ns: returns.then_some(1000.0) },
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tracer-kept-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_kept_calibration_is_read_back_only_where_it_fits() {
        let dir = scratch("fits");
        let now = now_unix_s();
        assert_eq!(read(&dir, false), None, "nothing kept yet");
        write(&dir, &calibration(false, now));
        assert_eq!(read(&dir, false), Some(calibration(false, now)));
        assert_eq!(read(&dir, true), None, "kept without the returns' costs");
        write(&dir, &calibration(true, now));
        assert_eq!(read(&dir, false), Some(calibration(true, now)), "calibrate() leaves out what is not asked for");
        assert_eq!(read(&dir, true), Some(calibration(true, now)));
        let stale = now - MAX_AGE.as_secs_f64() - 1.0;
        write(&dir, &calibration(true, stale));
        assert_eq!(read(&dir, true), None, "older than an hour");
        write(&dir, &calibration(true, now + 60.0));
        assert_eq!(read(&dir, true), None, "from the future");
        let mut wild = calibration(true, now);
        wild.cpu.hit.single_stepped_ns = f64::NAN;
        write(&dir, &wild);
        assert_eq!(read(&dir, true), None, "not a cost");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_record_of_another_build_or_boot_or_anyone_else_is_not_used() {
        let dir = scratch("other");
        let now = now_unix_s();
        write(&dir, &calibration(true, now));
        let path = dir.join(FILE);
        let text = fs::read_to_string(&path).unwrap();
        let boot = key().unwrap().boot_id;
        fs::write(&path, text.replace(&boot, "00000000-0000-0000-0000-000000000000")).unwrap();
        assert_eq!(read(&dir, true), None, "another boot's");
        fs::write(&path, &text).unwrap();
        assert!(read(&dir, true).is_some());
        let mut perms = fs::metadata(&path).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o622);
        fs::set_permissions(&path, perms).unwrap();
        assert_eq!(read(&dir, true), None, "others may write it");
        fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(dir.join("elsewhere"), &path).unwrap();
        fs::write(dir.join("elsewhere"), &text).unwrap();
        assert_eq!(read(&dir, true), None, "a symbolic link");
        fs::write(dir.join("big"), "x".repeat(usize::try_from(MAX_BYTES).unwrap() + 1)).unwrap();
        fs::remove_file(&path).unwrap();
        fs::rename(dir.join("big"), &path).unwrap();
        assert_eq!(read(&dir, true), None, "too big to be one");
        let _ = fs::remove_dir_all(&dir);
    }
}
