//! Heap growth sampling's configuration: `--growth` and its outputs, which
//! turn it on whatever it costs, `--no-growth`, which keeps the profile's
//! default off, and that default ("auto": on in the production profile,
//! stopped by the run if it costs more than half the budget).

use super::{ConfigError, Mode, StacksConfig, TargetSpec};
use crate::{cli::AttachArgs, report::files::OutputFile};

/// Growth sampling and what is made of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrowthConfig {
    /// The production profile's default, not asked for: where the build
    /// cannot sample growth (or with `--exe`) the run says so and goes on,
    /// and an interval in which growth costs the target more than half the
    /// budget stops it.
    pub auto: bool,
    /// `--growth-folded FILE`.
    pub folded: Option<OutputFile>,
    /// `--growth-flamegraph FILE`.
    pub flamegraph: Option<OutputFile>,
}

/// Growth as `args` ask for it in `mode` on `target`: `--growth` and its
/// outputs turn it on (with `--pid` only; their files must not be
/// `--folded`'s or `--flamegraph`'s), `--no-growth` off, and otherwise the
/// production profile samples it by default.
pub(super) fn growth_config(
    args: &AttachArgs,
    stacks: Option<&StacksConfig>,
    mode: Mode,
    target: &TargetSpec,
) -> Result<Option<GrowthConfig>, ConfigError> {
    let asked = [
        ("--growth", args.growth),
        ("--growth-folded", args.files.growth_folded.is_some()),
        ("--growth-flamegraph", args.files.growth_flamegraph.is_some()),
    ]
    .into_iter()
    .find_map(|(flag, given)| given.then_some(flag));
    match asked {
        Some(flag) if args.no_growth => return Err(ConfigError::NoGrowthWithGrowth { flag }),
        Some(_) => {}
        None if args.no_growth || mode != Mode::Profile => return Ok(None),
        None => return Ok(Some(GrowthConfig { auto: true, folded: None, flamegraph: None })),
    }
    if matches!(target, TargetSpec::Exe(_)) {
        return Err(ConfigError::GrowthWithExe);
    }
    let file =
        |flag, path: Option<&std::path::Path>| path.map(|p| OutputFile::check(flag, p, args.files.force)).transpose();
    let folded = file("--growth-folded", args.files.growth_folded.as_deref())?;
    let flamegraph = file("--growth-flamegraph", args.files.growth_flamegraph.as_deref())?;
    let mine: Vec<&OutputFile> = [&folded, &flamegraph].into_iter().flatten().collect();
    let theirs: Vec<&OutputFile> =
        stacks.into_iter().flat_map(|s| [s.folded.as_ref(), s.flamegraph.as_ref()]).flatten().collect();
    for (i, a) in mine.iter().enumerate() {
        if mine[i + 1..].iter().chain(&theirs).any(|b| b.path == a.path) {
            return Err(ConfigError::SameOutput { path: a.path.clone() });
        }
    }
    Ok(Some(GrowthConfig { auto: false, folded, flamegraph }))
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::config::AttachConfig;

    fn config(flags: &[&str]) -> Result<AttachConfig, ConfigError> {
        let args = AttachArgs::try_parse_from(std::iter::once("attach").chain(flags.iter().copied())).unwrap();
        AttachConfig::try_from(&args)
    }

    fn auto(flags: &[&str]) -> Option<bool> {
        config(flags).unwrap().growth.map(|g| g.auto)
    }

    #[test]
    fn the_profile_samples_growth_unless_told_not_to() {
        assert_eq!(auto(&["--pid", "1"]), Some(true));
        // Unavailable with --exe, which the run says: not an error.
        assert_eq!(auto(&["--exe", "/usr/bin/python3"]), Some(true));
        assert_eq!(auto(&["--pid", "1", "--no-growth"]), None);
        assert_eq!(auto(&["--pid", "1", "--growth"]), Some(false));
        assert_eq!(auto(&["--pid", "1", "--growth-folded", "/tmp/tracer-unit-g.folded", "--force"]), Some(false));
        // Exact tracing only where asked.
        assert_eq!(auto(&["--pid", "1", "--exact"]), None);
        assert_eq!(auto(&["--pid", "1", "--types"]), None);
        assert_eq!(auto(&["--pid", "1", "--exact", "--growth"]), Some(false));
        assert_eq!(auto(&["--pid", "1", "--exact", "--no-growth"]), None);
        for flags in [&["--growth"][..], &["--growth-flamegraph", "/tmp/tracer-unit-g.svg"]] {
            let flag = flags[0];
            assert_eq!(
                config(&[&["--pid", "1", "--no-growth"][..], flags].concat()).unwrap_err(),
                ConfigError::NoGrowthWithGrowth { flag }
            );
        }
        assert_eq!(config(&["--exe", "/usr/bin/python3", "--growth"]).unwrap_err(), ConfigError::GrowthWithExe);
    }
}
