//! `--pprof FILE`: where it is written, and that the run has stacks to
//! write (`--stacks`' or growth's), its file apart from the others'.

use super::{ConfigError, GrowthConfig, StacksConfig, TargetSpec};
use crate::{cli::AttachArgs, report::files::OutputFile};

/// `--pprof`'s file, checked; `None` without it.
pub(super) fn pprof_config(
    args: &AttachArgs,
    stacks: Option<&StacksConfig>,
    growth: Option<&GrowthConfig>,
    target: &TargetSpec,
) -> Result<Option<OutputFile>, ConfigError> {
    let Some(path) = args.files.pprof.as_deref() else { return Ok(None) };
    // The profile's default growth is configured with --exe too, and then
    // says at the attach that it is unavailable there (no process's memory
    // is read): it records no stack, so it cannot feed the file, and a run
    // that could only write an empty one is refused before it attaches.
    let growth = growth.filter(|_| !matches!(target, TargetSpec::Exe(_)));
    if stacks.is_none() && growth.is_none() {
        return Err(ConfigError::PprofWithoutStacks);
    }
    let file = OutputFile::check("--pprof", path, args.files.force)?;
    let others = stacks
        .into_iter()
        .flat_map(|s| [s.folded.as_ref(), s.flamegraph.as_ref()])
        .chain(growth.into_iter().flat_map(|g| [g.folded.as_ref(), g.flamegraph.as_ref()]))
        .flatten();
    for other in others {
        if other.path == file.path {
            return Err(ConfigError::SameOutput { path: file.path });
        }
    }
    Ok(Some(file))
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use crate::{
        cli::AttachArgs,
        config::{AttachConfig, ConfigError},
    };

    fn config(flags: &[&str]) -> Result<AttachConfig, ConfigError> {
        let args = AttachArgs::try_parse_from(std::iter::once("attach").chain(flags.iter().copied())).unwrap();
        AttachConfig::try_from(&args)
    }

    #[test]
    fn pprof_needs_stacks_and_a_file_of_its_own() {
        let path = "/tmp/tracer-unit-pprof.pb.gz";
        assert!(config(&["--pid", "1", "--pprof", path, "--force"]).unwrap().pprof.is_some());
        assert!(config(&["--pid", "1", "--exact", "--stacks", "alloc", "--pprof", path, "--force"]).is_ok());
        assert_eq!(
            config(&["--pid", "1", "--no-growth", "--pprof", path, "--force"]).unwrap_err(),
            ConfigError::PprofWithoutStacks
        );
        // The profile's default growth is unavailable with --exe.
        assert_eq!(
            config(&["--exe", "/usr/bin/python3.11", "--pprof", path, "--force"]).unwrap_err(),
            ConfigError::PprofWithoutStacks
        );
        assert!(
            config(&["--exe", "/usr/bin/python3.11", "--exact", "--stacks", "alloc", "--pprof", path, "--force"])
                .is_ok()
        );
        assert_eq!(
            config(&["--pid", "1", "--growth-folded", path, "--pprof", path, "--force"]).unwrap_err(),
            ConfigError::SameOutput { path: path.into() }
        );
    }
}
