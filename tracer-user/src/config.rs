//! The run configuration, separate from the command line so it can be built
//! and validated in tests without clap.

use std::time::Duration;

use thiserror::Error;

pub use crate::discover::TargetSpec;
use crate::{
    plan::{PlacementMode, gc::GcMode},
    probe::{ProbeSelection, SelectionError},
};

/// `--pid` and `--exe`: exactly one of them, and no PID 0.
pub fn target_spec(pid: Option<u32>, exe: Option<&std::path::Path>) -> Result<TargetSpec, ConfigError> {
    match (pid, exe) {
        (Some(0), None) => Err(ConfigError::PidZero),
        (Some(pid), None) => Ok(TargetSpec::Pid(pid)),
        (None, Some(exe)) => Ok(TargetSpec::Exe(exe.to_owned())),
        _ => Err(ConfigError::NoTarget),
    }
}

/// Parses `--probes` against every function a supported version has.
pub fn probe_selection(value: &str) -> Result<ProbeSelection, ConfigError> {
    Ok(ProbeSelection::parse(value, &crate::python::known_probes())?)
}

/// How results are written to stdout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A human-readable table per interval.
    Table,
    /// JSON Lines, one object per event (see README "JSON output").
    Json,
}

/// Everything `tracer attach` needs to run.
#[derive(Clone, Debug, PartialEq)]
#[allow(clippy::struct_excessive_bools, reason = "one field per on/off command-line flag")]
pub struct AttachConfig {
    /// What to trace.
    pub target: TargetSpec,
    /// Which probes.
    pub probes: ProbeSelection,
    /// Where in each function.
    pub placement: PlacementMode,
    /// Stop after this long; `None` runs until a signal or the target exits.
    pub duration: Option<Duration>,
    /// Time between reports.
    pub interval: Duration,
    /// Output format.
    pub format: Format,
    /// `--budget`: the share of the target's time (a fraction, 0.01 for 1%)
    /// tracer may cost it; `None` traces all the time.
    pub budget: Option<f64>,
    /// How probes are attached.
    pub links: LinkMode,
    /// `--returns`: also read what the allocating functions return.
    pub returns: bool,
    /// `--types`: also count new objects by type.
    pub types: bool,
    /// `--native`: also count libc's allocator.
    pub native: bool,
    /// `--stacks` and what goes with it.
    pub stacks: Option<StacksConfig>,
    /// `--bpf-log`: pass what the BPF programs log on as notes.
    pub bpf_log: bool,
    /// `--debug-dir`: one more place to look for the interpreter's DWARF.
    pub debug_dir: Option<std::path::PathBuf>,
    /// Whether to probe inlined copies too (not `--no-inlined`).
    pub inlined: bool,
    /// `--gc`: how garbage collections are seen.
    pub gc: GcMode,
    /// `--live` (or `--leaks`): keep the outstanding blocks.
    pub live: Option<LiveConfig>,
}

/// `--live`, `--live-max` and `--leaks`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LiveConfig {
    /// `--live-max`: the live table's room, in blocks.
    pub max: u32,
    /// `--leaks`: list the oldest blocks at the end.
    pub leaks: Option<LeaksConfig>,
}

/// The default `--live-max`: about 24 MB of kernel memory, preallocated.
pub const DEFAULT_LIVE_MAX: u32 = 262_144;

/// `--leaks`: which blocks the summary lists.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeaksConfig {
    /// At most this many, oldest first.
    pub list: usize,
    /// Only blocks at least this many seconds old.
    pub older_s: f64,
}
/// How many blocks `--leaks` lists when not told.
pub const DEFAULT_LEAKS: usize = 20;

/// Which events get Python stacks, and what is made of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StacksConfig {
    /// The probes whose events get stacks (`--stacks EVENTS`).
    pub events: ProbeSelection,
    /// `--depth`: frames walked at most.
    pub depth: u32,
    /// `--sample N`: one event in N gets a stack (1: all).
    pub sample: u64,
    /// `--top N`: sites listed.
    pub top: usize,
    /// `--folded FILE`.
    pub folded: Option<crate::report::files::OutputFile>,
    /// `--flamegraph FILE`.
    pub flamegraph: Option<crate::report::files::OutputFile>,
    /// `--weight`: what folded stacks and flame graphs weigh.
    pub weight: Weight,
    /// `--native-stacks`: unwind the native stack of each event too.
    pub native: bool,
}

/// What a folded stack's count is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weight {
    Calls,
    Bytes,
}

impl Weight {
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Calls => "calls",
            Self::Bytes => "bytes",
        }
    }
}

/// The deepest `--depth`.
#[allow(clippy::cast_possible_truncation, reason = "128")]
pub const MAX_DEPTH: u32 = tracer_common::stack::MAX_DEPTH as u32;
/// The default `--top`.
pub const DEFAULT_TOP: usize = 10;

/// How probes are attached in the kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LinkMode {
    /// uprobe-multi links where the kernel has them, else perf-event
    /// uprobes.
    #[default]
    Auto,
    /// uprobe-multi links (Linux 6.6+): one per BPF program, detached at
    /// once (see [`crate::kernel::multi`]).
    Multi,
    /// One perf-event uprobe per probe, as aya attaches them.
    Perf,
}

/// A configuration value that cannot work.
#[derive(Debug, Error, PartialEq)]
pub enum ConfigError {
    #[error(
        "--interval must be a number of seconds greater than 0 and at most {MAX_SECONDS} (got {value}); try --interval 1"
    )]
    BadInterval { value: f64 },
    #[error(
        "--duration must be a number of seconds greater than 0 and at most {MAX_SECONDS} (got {value}); omit it to run until Ctrl-C"
    )]
    BadDuration { value: f64 },
    #[error("--pid 0 is not a process; pass the PID of a running CPython process (e.g. from `pgrep python`)")]
    PidZero,
    #[error("pass exactly one of --pid PID or --exe PATH")]
    NoTarget,
    #[error("--older must be a number of seconds, 0 or more and at most {MAX_SECONDS} (got {value}); try --older 10")]
    BadOlder { value: f64 },
    #[error(
        "--live-max 0 leaves no room for any allocation; give the live table's room in blocks (default {DEFAULT_LIVE_MAX})"
    )]
    LiveMaxZero,
    #[error(
        "--budget cannot be combined with --live or --leaks: a block allocated or freed between windows would be missed; use one or the other"
    )]
    BudgetWithLive,
    #[error(
        "--live and --leaks work with --pid only so far: the live table does not yet drop the blocks of processes that exit"
    )]
    LiveWithExe,
    #[error(transparent)]
    Probes(#[from] SelectionError),
    #[error("--placement must be auto, entry or call-sites (got {value:?})")]
    BadPlacement { value: String },
    #[error(
        "--placement call-sites attaches thousands of uprobes, which only uprobe-multi links can detach quickly; drop --links perf"
    )]
    CallSitesNeedMulti,
    #[error(
        "--budget cannot be combined with --placement call-sites: adding and removing thousands of call-site probes takes far longer than a budget window; use one or the other"
    )]
    BudgetWithCallSites,
    #[error(
        "--budget cannot be combined with --returns: the budget prices only the counting probes, and return counts are not estimated from windows; use one or the other"
    )]
    BudgetWithReturns,
    #[error(
        "--budget cannot be combined with --types: type counts are not estimated from windows; use one or the other"
    )]
    BudgetWithTypes,
    #[error(
        "--budget cannot be combined with --stacks (or --top, --folded, --flamegraph, --native-stacks): stack counts are not estimated from windows; use --sample N to make stacks cheaper"
    )]
    BudgetWithStacks,
    #[error(
        "{flag} only matters with --stacks (or --top, --folded, --flamegraph, --native-stacks); add one, or drop {flag}"
    )]
    WithoutStacks { flag: &'static str },
    #[error("--depth must be 1 to {MAX_DEPTH} frames (got {value}); the default is 64")]
    BadDepth { value: u32 },
    #[error("--sample 0 would record no stack; pass 1 for every event, or N for one event in N")]
    SampleZero,
    #[error("--top 0 would list no site; pass the number of sites to list, e.g. --top 10")]
    TopZero,
    #[error("--weight must be calls or bytes (got {value:?})")]
    BadWeight { value: String },
    #[error("--stacks names {name}, which --probes leaves out; add it to --probes, or drop it from --stacks")]
    StacksNotProbed { name: String },
    #[error(
        "--stacks picks no function that --probes probes; use --stacks alloc with the allocators probed, or --stacks refs with _Py_NewReference"
    )]
    StacksNothingProbed,
    #[error("--folded and --flamegraph both name {path}; give each its own file")]
    SameOutput { path: std::path::PathBuf },
    #[error(transparent)]
    Output(#[from] crate::report::files::OutputError),
    #[error(
        "--types counts the objects _Py_NewReference creates, which --probes {probes} leaves out; use --probes default or refs, or add _Py_NewReference to the list"
    )]
    TypesWithoutNewReference { probes: String },
    #[error(
        "--links perf cannot attach the {sites} uprobes of inlined copies in reasonable time (perf-event uprobes detach about 0.13 s apart); drop --links perf, or pass --no-inlined"
    )]
    InlinedNeedMulti { sites: usize },
    #[error(
        "--budget with --links perf cannot detach the {sites} uprobes of inlined copies and call sites in a budget window; drop --links perf"
    )]
    BudgetPerfManySites { sites: usize },
    #[error(
        "--native needs --pid: with --exe, libc's probes would fire in every process on the machine that uses libc, not only that interpreter's"
    )]
    NativeWithExe,
    #[error(
        "--budget cannot be combined with --native: the marks of libc's nested calls must stay attached with the functions they mark; use one or the other"
    )]
    BudgetWithNative,
    #[error("--links must be auto, multi or perf (got {value:?})")]
    BadLinks { value: String },
    #[error("--gc must be auto, markers, function or off (got {value:?})")]
    BadGc { value: String },
    #[error(
        "--budget must be a percentage of the target's time above 0 and at most 100 (got {value}); e.g. --budget 1"
    )]
    BadBudget { value: f64 },
}

/// Raw `attach` options as given on the command line.
#[derive(Clone, Debug, Default)]
#[allow(clippy::struct_excessive_bools, reason = "one field per command-line flag, as clap gives them")]
pub struct AttachArgs<'a> {
    pub pid: Option<u32>,
    pub exe: Option<&'a std::path::Path>,
    pub duration_s: Option<f64>,
    pub interval_s: f64,
    pub json: bool,
    pub probes: &'a str,
    /// `--placement`: "auto", "entry" or "call-sites".
    pub placement: &'a str,
    /// `--budget`, in percent.
    pub budget_percent: Option<f64>,
    /// `--links`: "auto", "multi" or "perf" (empty: auto).
    pub links: &'a str,
    /// `--returns`.
    pub returns: bool,
    /// `--types`.
    pub types: bool,
    /// `--native`.
    pub native: bool,
    /// `--stacks EVENTS` (`Some("")` for the flag alone).
    pub stacks: Option<&'a str>,
    /// `--depth`.
    pub depth: Option<u32>,
    /// `--sample`.
    pub sample: Option<u64>,
    /// `--top`.
    pub top: Option<usize>,
    /// `--folded`.
    pub folded: Option<&'a std::path::Path>,
    /// `--flamegraph`.
    pub flamegraph: Option<&'a std::path::Path>,
    /// `--weight`: "calls" or "bytes" (empty: calls).
    pub weight: &'a str,
    /// `--native-stacks`.
    pub native_stacks: bool,
    /// `--force`.
    pub force: bool,
    /// `--bpf-log`.
    pub bpf_log: bool,
    /// `--debug-dir`.
    pub debug_dir: Option<&'a std::path::Path>,
    /// Not `--no-inlined`.
    pub inlined: bool,
    /// `--gc`: "auto", "markers", "function" or "off" (empty: auto).
    pub gc: &'a str,
    /// `--live`.
    pub live: bool,
    /// `--live-max`.
    pub live_max: Option<u32>,
    /// `--leaks [N]`.
    pub leaks: Option<usize>,
    /// `--older`.
    pub older_s: Option<f64>,
}

/// Parses `--gc`.
pub fn parse_gc(value: &str) -> Result<GcMode, ConfigError> {
    match value {
        "" | "auto" => Ok(GcMode::Auto),
        "markers" => Ok(GcMode::Markers),
        "function" => Ok(GcMode::Function),
        "off" => Ok(GcMode::Off),
        other => Err(ConfigError::BadGc { value: other.to_owned() }),
    }
}

/// Parses `--placement`.
pub fn parse_placement(value: &str) -> Result<PlacementMode, ConfigError> {
    match value {
        "auto" => Ok(PlacementMode::Auto),
        "entry" => Ok(PlacementMode::Entry),
        "call-sites" => Ok(PlacementMode::CallSites),
        other => Err(ConfigError::BadPlacement { value: other.to_owned() }),
    }
}

/// The default `--interval`, in seconds.
pub const DEFAULT_INTERVAL_S: f64 = 1.0;

impl AttachConfig {
    /// Validates raw command-line values.
    pub fn new(args: &AttachArgs<'_>) -> Result<Self, ConfigError> {
        let target = target_spec(args.pid, args.exe)?;
        let interval_s = args.interval_s;
        let interval = seconds(interval_s).ok_or(ConfigError::BadInterval { value: interval_s })?;
        let duration = match args.duration_s {
            None => None,
            Some(value) => Some(seconds(value).ok_or(ConfigError::BadDuration { value })?),
        };
        let budget = match args.budget_percent {
            None => None,
            Some(value) if value.is_finite() && value > 0.0 && value <= 100.0 => Some(value / 100.0),
            Some(value) => return Err(ConfigError::BadBudget { value }),
        };
        let links = match args.links {
            "" | "auto" => LinkMode::Auto,
            "multi" => LinkMode::Multi,
            "perf" => LinkMode::Perf,
            other => return Err(ConfigError::BadLinks { value: other.to_owned() }),
        };
        let placement = parse_placement(args.placement)?;
        if placement == PlacementMode::CallSites && links == LinkMode::Perf {
            return Err(ConfigError::CallSitesNeedMulti);
        }
        if placement == PlacementMode::CallSites && budget.is_some() {
            return Err(ConfigError::BudgetWithCallSites);
        }
        if args.returns && budget.is_some() {
            return Err(ConfigError::BudgetWithReturns);
        }
        if args.types && budget.is_some() {
            return Err(ConfigError::BudgetWithTypes);
        }
        if args.native && matches!(target, TargetSpec::Exe(_)) {
            return Err(ConfigError::NativeWithExe);
        }
        if args.native && budget.is_some() {
            return Err(ConfigError::BudgetWithNative);
        }
        let probes = probe_selection(args.probes)?;
        let creates = match &probes {
            ProbeSelection::Default | ProbeSelection::Refs => true,
            ProbeSelection::Alloc => false,
            ProbeSelection::Names(names) => names.iter().any(|n| n == "_Py_NewReference"),
        };
        if args.types && !creates {
            return Err(ConfigError::TypesWithoutNewReference { probes: args.probes.to_owned() });
        }
        let stacks = stacks_config(args)?;
        if stacks.is_some() && budget.is_some() {
            return Err(ConfigError::BudgetWithStacks);
        }
        let gc = parse_gc(args.gc)?;
        let live = live_config(args)?;
        if live.is_some() && budget.is_some() {
            return Err(ConfigError::BudgetWithLive);
        }
        if live.is_some() && args.exe.is_some() {
            return Err(ConfigError::LiveWithExe);
        }
        Ok(Self {
            gc,
            live,
            // The live table reads the implementations' returns itself
            // (`live_impls`); `--returns`' probes on the API functions
            // would add a breakpoint at each one's entry.
            returns: args.returns,
            types: args.types,
            native: args.native,
            stacks,
            bpf_log: args.bpf_log,
            debug_dir: args.debug_dir.map(std::path::Path::to_owned),
            inlined: args.inlined,
            budget,
            links,
            target,
            probes,
            placement,
            duration,
            interval,
            format: if args.json { Format::Json } else { Format::Table },
        })
    }
}

/// `--stacks` and the flags that go with it; any of `--top`, `--folded`,
/// `--flamegraph` turns stacks on for the allocating functions.
fn stacks_config(args: &AttachArgs<'_>) -> Result<Option<StacksConfig>, ConfigError> {
    let wanted = args.stacks.is_some()
        || args.top.is_some()
        || args.folded.is_some()
        || args.flamegraph.is_some()
        || args.native_stacks;
    if !wanted {
        for (flag, given) in [("--depth", args.depth.is_some()), ("--sample", args.sample.is_some())] {
            if given {
                return Err(ConfigError::WithoutStacks { flag });
            }
        }
        if !args.weight.is_empty() {
            return Err(ConfigError::WithoutStacks { flag: "--weight" });
        }
        return Ok(None);
    }
    let events = match args.stacks.unwrap_or("") {
        "" => ProbeSelection::Alloc,
        value => probe_selection(value)?,
    };
    let depth = args.depth.unwrap_or(tracer_common::stack::DEFAULT_DEPTH);
    if !(1..=MAX_DEPTH).contains(&depth) {
        return Err(ConfigError::BadDepth { value: depth });
    }
    let sample = args.sample.unwrap_or(1);
    if sample == 0 {
        return Err(ConfigError::SampleZero);
    }
    let top = args.top.unwrap_or(DEFAULT_TOP);
    if top == 0 {
        return Err(ConfigError::TopZero);
    }
    let weight = match args.weight {
        "" | "calls" => Weight::Calls,
        "bytes" => Weight::Bytes,
        other => return Err(ConfigError::BadWeight { value: other.to_owned() }),
    };
    let file = |flag, path: Option<&std::path::Path>| {
        path.map(|p| crate::report::files::OutputFile::check(flag, p, args.force)).transpose()
    };
    let folded = file("--folded", args.folded)?;
    let flamegraph = file("--flamegraph", args.flamegraph)?;
    if let (Some(a), Some(b)) = (&folded, &flamegraph)
        && a.path == b.path
    {
        return Err(ConfigError::SameOutput { path: a.path.clone() });
    }
    Ok(Some(StacksConfig { events, depth, sample, top, folded, flamegraph, weight, native: args.native_stacks }))
}

/// `--live`, `--live-max`, `--leaks` and `--older`; `--leaks` and
/// `--older` turn on `--leaks`, and all of them `--live`.
fn live_config(args: &AttachArgs<'_>) -> Result<Option<LiveConfig>, ConfigError> {
    if let Some(value) = args.older_s
        && !(value.is_finite() && (0.0..=f64::from(MAX_SECONDS)).contains(&value))
    {
        return Err(ConfigError::BadOlder { value });
    }
    if args.live_max == Some(0) {
        return Err(ConfigError::LiveMaxZero);
    }
    let leaks = (args.leaks.is_some() || args.older_s.is_some())
        .then(|| LeaksConfig { list: args.leaks.unwrap_or(DEFAULT_LEAKS), older_s: args.older_s.unwrap_or(0.0) });
    let on = args.live || args.live_max.is_some() || leaks.is_some();
    Ok(on.then(|| LiveConfig { max: args.live_max.unwrap_or(DEFAULT_LIVE_MAX), leaks }))
}

/// The longest `--duration` or `--interval`: ten years. Far enough for any
/// run, and near enough that a deadline this far from now is a valid
/// instant (one 1e19 s away is not, and would panic).
pub const MAX_SECONDS: u32 = 315_360_000;

/// A positive number of seconds up to [`MAX_SECONDS`].
fn seconds(value: f64) -> Option<Duration> {
    if value.is_finite() && value > 0.0 && value <= f64::from(MAX_SECONDS) {
        Duration::try_from_secs_f64(value).ok().filter(|d| !d.is_zero())
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(pid: u32, duration_s: Option<f64>, interval_s: f64, json: bool) -> AttachArgs<'static> {
        AttachArgs {
            pid: Some(pid),
            exe: None,
            duration_s,
            interval_s,
            json,
            probes: "default",
            placement: "auto",
            budget_percent: None,
            links: "auto",
            returns: false,
            types: false,
            native: false,
            stacks: None,
            depth: None,
            sample: None,
            top: None,
            folded: None,
            flamegraph: None,
            weight: "",
            native_stacks: false,
            force: false,
            bpf_log: false,
            debug_dir: None,
            inlined: true,
            gc: "auto",
            live: false,
            live_max: None,
            leaks: None,
            older_s: None,
        }
    }

    #[test]
    fn defaults_to_table_and_no_duration() {
        let c = AttachConfig::new(&args(42, None, DEFAULT_INTERVAL_S, false)).unwrap();
        assert_eq!(c.target, TargetSpec::Pid(42));
        assert_eq!(c.probes, ProbeSelection::Default);
        assert_eq!(c.duration, None);
        assert_eq!(c.interval, Duration::from_secs(1));
        assert_eq!(c.format, Format::Table);
    }

    #[test]
    fn accepts_fractional_seconds_and_json() {
        let c = AttachConfig::new(&args(7, Some(2.5), 0.25, true)).unwrap();
        assert_eq!(c.duration, Some(Duration::from_millis(2500)));
        assert_eq!(c.interval, Duration::from_millis(250));
        assert_eq!(c.format, Format::Json);
    }

    #[test]
    fn rejects_zero_negative_and_nan_interval() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e-12, 1e19, 315_360_001.0] {
            let err = AttachConfig::new(&args(1, None, bad, false)).unwrap_err();
            assert!(matches!(err, ConfigError::BadInterval { .. }), "{bad}: {err}");
        }
        assert_eq!(
            AttachConfig::new(&args(1, None, 0.0, false)).unwrap_err().to_string(),
            "--interval must be a number of seconds greater than 0 and at most 315360000 (got 0); try --interval 1"
        );
        assert!(AttachConfig::new(&args(1, None, 315_360_000.0, false)).is_ok());
    }

    #[test]
    fn rejects_bad_duration_and_pid_zero() {
        assert_eq!(
            AttachConfig::new(&args(1, Some(0.0), 1.0, false)).unwrap_err(),
            ConfigError::BadDuration { value: 0.0 }
        );
        assert_eq!(
            AttachConfig::new(&args(1, Some(1e19), 1.0, false)).unwrap_err(),
            ConfigError::BadDuration { value: 1e19 }
        );
        assert_eq!(AttachConfig::new(&args(0, None, 1.0, false)).unwrap_err(), ConfigError::PidZero);
    }

    #[test]
    fn exactly_one_target_and_valid_probes() {
        let exe = std::path::Path::new("/usr/bin/python3.11");
        let both = AttachArgs { exe: Some(exe), ..args(1, None, 1.0, false) };
        assert_eq!(AttachConfig::new(&both).unwrap_err(), ConfigError::NoTarget);
        let exe_only = AttachArgs { pid: None, exe: Some(exe), ..args(1, None, 1.0, false) };
        assert_eq!(AttachConfig::new(&exe_only).unwrap().target, TargetSpec::Exe(exe.to_owned()));
        let bad = AttachArgs { probes: "nope", ..args(1, None, 1.0, false) };
        assert!(matches!(AttachConfig::new(&bad).unwrap_err(), ConfigError::Probes(_)));
        let entry = AttachArgs { placement: "entry", ..args(1, None, 1.0, false) };
        assert_eq!(AttachConfig::new(&entry).unwrap().placement, PlacementMode::Entry);
        let bad = AttachArgs { placement: "middle", ..args(1, None, 1.0, false) };
        assert_eq!(
            AttachConfig::new(&bad).unwrap_err().to_string(),
            "--placement must be auto, entry or call-sites (got \"middle\")"
        );
        let sites = AttachArgs { placement: "call-sites", ..args(1, None, 1.0, false) };
        assert_eq!(AttachConfig::new(&sites).unwrap().placement, PlacementMode::CallSites);
        let budget = AttachArgs { budget_percent: Some(1.0), ..sites.clone() };
        assert_eq!(AttachConfig::new(&budget).unwrap_err(), ConfigError::BudgetWithCallSites);
        let returns = AttachArgs { budget_percent: Some(1.0), returns: true, placement: "auto", ..sites.clone() };
        assert_eq!(AttachConfig::new(&returns).unwrap_err(), ConfigError::BudgetWithReturns);
        let perf = AttachArgs { links: "perf", ..sites };
        assert_eq!(
            AttachConfig::new(&perf).unwrap_err().to_string(),
            "--placement call-sites attaches thousands of uprobes, which only uprobe-multi links can detach quickly; drop --links perf"
        );
    }

    #[test]
    fn link_modes() {
        assert_eq!(AttachConfig::new(&args(1, None, 1.0, false)).unwrap().links, LinkMode::Auto);
        for (value, mode) in [("multi", LinkMode::Multi), ("perf", LinkMode::Perf), ("", LinkMode::Auto)] {
            let a = AttachArgs { links: value, ..args(1, None, 1.0, false) };
            assert_eq!(AttachConfig::new(&a).unwrap().links, mode);
        }
        let bad = AttachArgs { links: "bpf", ..args(1, None, 1.0, false) };
        assert_eq!(
            AttachConfig::new(&bad).unwrap_err().to_string(),
            "--links must be auto, multi or perf (got \"bpf\")"
        );
    }

    #[test]
    fn gc_modes() {
        assert_eq!(AttachConfig::new(&args(1, None, 1.0, false)).unwrap().gc, GcMode::Auto);
        for (value, mode) in
            [("markers", GcMode::Markers), ("function", GcMode::Function), ("off", GcMode::Off), ("", GcMode::Auto)]
        {
            let a = AttachArgs { gc: value, ..args(1, None, 1.0, false) };
            assert_eq!(AttachConfig::new(&a).unwrap().gc, mode);
        }
        let bad = AttachArgs { gc: "on", ..args(1, None, 1.0, false) };
        assert_eq!(
            AttachConfig::new(&bad).unwrap_err().to_string(),
            "--gc must be auto, markers, function or off (got \"on\")"
        );
    }

    #[test]
    fn budget_is_a_percentage() {
        assert_eq!(AttachConfig::new(&args(1, None, 1.0, false)).unwrap().budget, None);
        let one = AttachArgs { budget_percent: Some(1.0), ..args(1, None, 1.0, false) };
        assert_eq!(AttachConfig::new(&one).unwrap().budget, Some(0.01));
        let all = AttachArgs { budget_percent: Some(100.0), ..args(1, None, 1.0, false) };
        assert_eq!(AttachConfig::new(&all).unwrap().budget, Some(1.0));
        for bad in [0.0, -1.0, 100.5, f64::NAN, f64::INFINITY] {
            let a = AttachArgs { budget_percent: Some(bad), ..args(1, None, 1.0, false) };
            assert!(matches!(AttachConfig::new(&a).unwrap_err(), ConfigError::BadBudget { .. }), "{bad}");
        }
        let zero = AttachArgs { budget_percent: Some(0.0), ..args(1, None, 1.0, false) };
        assert_eq!(
            AttachConfig::new(&zero).unwrap_err().to_string(),
            "--budget must be a percentage of the target's time above 0 and at most 100 (got 0); e.g. --budget 1"
        );
    }
}
