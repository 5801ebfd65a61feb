//! What `tracer attach --all` takes: the flags it passes on to each
//! interpreter's `tracer attach --exe`, checked once here; the rest are
//! refused by name.

use std::{ffi::OsString, time::Duration};

use thiserror::Error;

use crate::{
    cli::AttachArgs,
    config::{AttachConfig, ConfigError, Format},
    probe::ProbeSelection,
};

/// `--all` with something it does not do.
#[derive(Debug, Error)]
pub enum AllError {
    #[error(
        "--all does not take {flag}: it traces every interpreter's counts, costs and collections; for {flag}, trace {instead}"
    )]
    Unsupported {
        flag: &'static str,
        /// What takes the flag: one process only, where `--exe` refuses it too.
        instead: &'static str,
    },
    #[error(transparent)]
    Config(#[from] ConfigError),
}

impl crate::error::Classify for AllError {
    fn is_bad_input(&self) -> bool {
        match self {
            Self::Unsupported { .. } => true,
            Self::Config(e) => e.is_bad_input(),
        }
    }
}

/// `tracer attach --all`, checked.
#[derive(Clone, Debug)]
pub struct AllConfig {
    /// The flags each child gets after `attach --exe IMAGE --json`.
    pub passed_on: Vec<OsString>,
    /// Whether the user gave `--debug-dir` (a chroot's own debug files are
    /// then not added).
    pub debug_dir: bool,
    pub interval: Duration,
    pub duration: Option<Duration>,
    pub format: Format,
}

impl TryFrom<&AttachArgs> for AllConfig {
    type Error = AllError;

    fn try_from(a: &AttachArgs) -> Result<Self, AllError> {
        // `--native`, `--live` and `--growth` work with `--pid` only, so
        // the error does not send the user to an `--exe` that refuses them.
        const ONE: &str = "one interpreter with --exe PATH or one process with --pid PID";
        const PID: &str = "one process with --pid PID";
        let refused = [
            (a.target.native, "--native", PID),
            (a.returns, "--returns", ONE),
            (a.types, "--types", ONE),
            (a.live || a.live_max.is_some(), "--live", PID),
            (a.leaks.is_some() || a.older.is_some(), "--leaks", PID),
            (
                a.stacks.is_some()
                    || a.depth.is_some()
                    || a.sample.is_some()
                    || a.top.is_some()
                    || a.files.folded.is_some()
                    || a.files.flamegraph.is_some()
                    || a.files.weight.is_some()
                    || a.native_stacks,
                "--stacks",
                ONE,
            ),
            (a.growth || a.files.growth_folded.is_some() || a.files.growth_flamegraph.is_some(), "--growth", PID),
            (a.files.pprof.is_some(), "--pprof", ONE),
            (a.listen.is_some(), "--listen", ONE),
            (a.record.is_some(), "--record", ONE),
        ];
        if let Some(&(_, flag, instead)) = refused.iter().find(|(given, _, _)| *given) {
            return Err(AllError::Unsupported { flag, instead });
        }
        // The cross-flag rules every child would apply, once here, with a
        // stand-in interpreter.
        let mut one = a.clone();
        one.all = false;
        one.target.exe = Some(std::path::PathBuf::from("/"));
        let checked = AttachConfig::try_from(&one)?;
        let mut passed_on: Vec<OsString> = vec!["--interval".into(), a.interval.to_string().into()];
        if a.exact {
            passed_on.push("--exact".into());
        }
        if let Some(budget) = a.budget {
            passed_on.extend(["--budget".into(), budget.to_string().into()]);
        }
        if a.target.probes != ProbeSelection::Default {
            passed_on.extend(["--probes".into(), a.target.probes.to_string().into()]);
        }
        passed_on.extend(["--placement".into(), value_name(&a.target.placement).into()]);
        passed_on.extend(["--gc".into(), value_name(&a.target.gc).into()]);
        passed_on.extend(["--links".into(), value_name(&a.links).into()]);
        if a.target.no_inlined {
            passed_on.push("--no-inlined".into());
        }
        if let Some(dir) = &a.target.debug_dir {
            passed_on.extend(["--debug-dir".into(), dir.clone().into_os_string()]);
        }
        if a.bpf_log {
            passed_on.push("--bpf-log".into());
        }
        if a.no_growth {
            passed_on.push("--no-growth".into());
        }
        Ok(Self {
            passed_on,
            debug_dir: a.target.debug_dir.is_some(),
            interval: checked.interval,
            duration: checked.duration,
            format: if a.json { Format::Json } else { Format::Table },
        })
    }
}

impl AllConfig {
    /// `tracer top --all`: as `attach --all`, drawn on the terminal.
    pub fn for_top(args: &AttachArgs, terminal: bool) -> Result<Self, AllError> {
        if args.json {
            return Err(ConfigError::TopJson.into());
        }
        let mut config = Self::try_from(args)?;
        if !terminal {
            return Err(ConfigError::TopNotATerminal.into());
        }
        config.format = Format::Top;
        Ok(config)
    }
}

/// A closed set's value as its flag takes it.
fn value_name<V: clap::ValueEnum>(v: &V) -> String {
    v.to_possible_value().map(|p| p.get_name().to_owned()).unwrap_or_default()
}
