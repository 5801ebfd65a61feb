//! The run configuration: `tracer attach`'s flags ([`AttachArgs`]) checked
//! against each other and turned into what a run needs ([`AttachConfig`]).

use std::time::Duration;

use thiserror::Error;

use crate::report::files::OutputFile;

mod growth;
mod pprof;

pub use growth::GrowthConfig;
mod stacks;

use growth::growth_config;
use pprof::pprof_config;
use stacks::stacks_config;
pub use stacks::{DEFAULT_TOP, MAX_DEPTH, StacksConfig};

use crate::{
    cli::AttachArgs,
    model::{Level, Note, NoteCode},
    plan::{PlacementMode, gc::GcMode},
    probe::{ProbeSelection, SelectionError},
};
pub use crate::{
    cli::{DEFAULT_INTERVAL_S, LinkMode, Weight},
    discover::TargetSpec,
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

/// `--pid`, `--exe` or `--name` (resolved here to the one PID it selects),
/// and what the user should know of how: a match `--name` passed over.
pub fn target_of(t: &crate::cli::TargetArgs) -> Result<(TargetSpec, Vec<Note>), ConfigError> {
    match (&t.name, t.pid, &t.exe) {
        (Some(pattern), None, None) => {
            let (pid, skipped) = crate::discover::name::select(pattern)?;
            let notes = skipped.map(|line| Note::new(Level::Warning, NoteCode::Target, line)).into_iter().collect();
            Ok((TargetSpec::Pid(pid), notes))
        }
        (None, pid, exe) => target_spec(pid, exe.as_deref()).map(|spec| (spec, Vec::new())),
        _ => Err(ConfigError::NoTarget),
    }
}

/// How results are written to stdout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A human-readable table per interval.
    Table,
    /// JSON Lines, one object per event (see docs/json.md).
    Json,
    /// `tracer top`'s full-screen view in the terminal.
    Top,
}

/// Which of its two modes `tracer attach` runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The production profile: GC from memory and rates by duty cycle,
    /// every source's cost held within the budget together.
    Profile,
    /// Every event traced: asked for with `--exact` (`because` is `None`),
    /// or chosen by the first flag given that only exact tracing serves.
    Exact { because: Option<&'static str> },
}

impl Mode {
    /// The word the header and the JSON use.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Profile => "profile",
            Self::Exact { .. } => "exact",
        }
    }
}

/// `--budget` in the production profile when not given, in percent.
pub const DEFAULT_PROFILE_BUDGET: f64 = 1.0;

/// The flags only exact tracing can serve, each with whether it was given,
/// in the order `--help` lists them: the profile samples the events they
/// need every one of (a type, a block, a return, a stack per event; libc's
/// calls; call sites that take longer to attach than a window lasts).
/// `--force` is not among them: alone it changes nothing.
fn exact_only(args: &AttachArgs) -> Option<&'static str> {
    let t = &args.target;
    [
        ("--placement call-sites", t.placement == PlacementMode::CallSites),
        ("--native", t.native),
        ("--returns", args.returns),
        ("--types", args.types),
        ("--live", args.live),
        ("--live-max", args.live_max.is_some()),
        ("--leaks", args.leaks.is_some()),
        ("--older", args.older.is_some()),
        ("--stacks", args.stacks.is_some()),
        ("--depth", args.depth.is_some()),
        ("--sample", args.sample.is_some()),
        ("--top", args.top.is_some()),
        ("--folded", args.files.folded.is_some()),
        ("--flamegraph", args.files.flamegraph.is_some()),
        ("--weight", args.files.weight.is_some()),
        ("--native-stacks", args.native_stacks),
    ]
    .into_iter()
    .find_map(|(flag, given)| given.then_some(flag))
}

/// Everything `tracer attach` needs to run.
#[derive(Clone, Debug, PartialEq)]
#[allow(clippy::struct_excessive_bools, reason = "one field per on/off command-line flag")]
pub struct AttachConfig {
    /// What resolving the target had to say (`--name`'s skipped matches),
    /// given as the run's first notes.
    pub notes: Vec<Note>,
    /// The production profile or exact tracing.
    pub mode: Mode,
    /// What to trace.
    pub target: TargetSpec,
    /// Which probes.
    pub probes: ProbeSelection,
    /// Where in each function: `auto` resolved (never `Auto` here).
    pub placement: PlacementMode,
    /// `--placement call-sites` given, which `--budget` refuses (`auto`'s
    /// call sites give way to a budget by themselves).
    pub call_sites_asked: bool,
    /// Stop after this long; `None` runs until a signal or the target exits.
    pub duration: Option<Duration>,
    /// Time between reports.
    pub interval: Duration,
    /// Output format.
    pub format: Format,
    /// `--budget`: the share of the target's CPU time (a fraction, 0.01 for 1%)
    /// tracer may cost it: in the profile always (every source together),
    /// with exact tracing only when given (its windows); `None` traces all
    /// the time.
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
    /// Growth sampling, asked for (`--growth` and what is made of it) or
    /// the profile's auto default; `None` where off.
    pub growth: Option<GrowthConfig>,
    /// `--pprof FILE`.
    pub pprof: Option<crate::report::files::OutputFile>,
    /// `--listen`: where the Prometheus endpoint listens.
    pub listen: Option<std::net::SocketAddr>,
    /// `--record FILE`: every event as JSON Lines, checked.
    pub record: Option<crate::report::files::OutputFile>,
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

/// The least `--budget`, in percent.
pub const MIN_BUDGET: f64 = 0.01;

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
    #[error("pass exactly one of --pid PID, --exe PATH or --name PATTERN")]
    NoTarget,
    #[error(transparent)]
    Name(#[from] crate::discover::name::NameError),
    #[error(
        "tracer top draws on the terminal and writes no JSON; for JSON Lines use `tracer attach --json` with the same flags"
    )]
    TopJson,
    #[error(
        "tracer top draws on a terminal, and its stdout is not one; run it in a terminal, or use `tracer attach` (a table, or --json) to save or pipe the report"
    )]
    TopNotATerminal,
    #[error(
        "tracer top has no table for what {flag} reports; use `tracer attach` with it, or keep it with --record FILE and read it later with `tracer report FILE`"
    )]
    TopHidden { flag: &'static str },
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
    #[error("--stacks names {name}, which --probes leaves out; add it to --probes, or drop it from --stacks")]
    StacksNotProbed { name: String },
    #[error(
        "--stacks picks no function that --probes probes; use --stacks alloc with the allocators probed, or --stacks refs with _Py_NewReference"
    )]
    StacksNothingProbed,
    #[error(
        "two of --folded, --flamegraph, --growth-folded, --growth-flamegraph and --pprof name {path}; give each its own file"
    )]
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
    #[error("--budget must be a percentage of the target's CPU time from 0.01 to 100 (got {value}); e.g. --budget 1")]
    BadBudget { value: f64 },
    #[error("--growth needs --pid: its samples are checked against the process's memory, which --exe does not read")]
    GrowthWithExe,
    #[error(
        "{flag} turns growth sampling on and --no-growth turns it off; give one: --growth keeps it on whatever it costs, --no-growth leaves it off"
    )]
    NoGrowthWithGrowth { flag: &'static str },
    #[error(
        "--pprof writes stacks, and this run records none: add --stacks (exact), or trace with --pid in the profile (its growth stacks); --no-growth and --exe have none"
    )]
    PprofWithoutStacks,
}

impl crate::error::Classify for ConfigError {
    /// Flags that cannot work, alone or together.
    fn is_bad_input(&self) -> bool {
        true
    }
}

impl TryFrom<&AttachArgs> for AttachConfig {
    type Error = ConfigError;

    /// Checks the flags against each other: what clap cannot see alone.
    fn try_from(args: &AttachArgs) -> Result<Self, ConfigError> {
        let (target, notes) = target_of(&args.target)?;
        Self::build(args, target, false).map(|config| Self { notes, ..config })
    }
}

impl AttachConfig {
    /// `tracer run`'s: the flags checked as for a `--pid` target, whose
    /// PID (`target`) is set once the program has started; it is 0 until
    /// then.
    pub fn for_command(args: &AttachArgs) -> Result<Self, ConfigError> {
        Self::build(args, TargetSpec::Pid(0), true)
    }

    /// `tracer top`'s: attach's, drawn on the terminal, which stdout must
    /// be (`terminal`).
    pub fn for_top(args: &AttachArgs, terminal: bool) -> Result<Self, ConfigError> {
        if args.json {
            return Err(ConfigError::TopJson);
        }
        let mut config = Self::try_from(args)?;
        // What the screen has no table for would be thrown away, unless
        // the run's record keeps it.
        if config.record.is_none() {
            let kept = |s: &StacksConfig| s.folded.is_some() || s.flamegraph.is_some() || config.pprof.is_some();
            let hidden = [
                (config.types, "--types"),
                (config.live.is_some(), "--live or --leaks"),
                (config.stacks.as_ref().is_some_and(|s| !kept(s)), "--stacks"),
            ];
            if let Some((_, flag)) = hidden.into_iter().find(|(on, _)| *on) {
                return Err(ConfigError::TopHidden { flag });
            }
        }
        if !terminal {
            return Err(ConfigError::TopNotATerminal);
        }
        config.format = Format::Top;
        Ok(config)
    }

    /// `starts`: `tracer run`'s, whose program starts under the probes.
    fn build(args: &AttachArgs, target: TargetSpec, starts: bool) -> Result<Self, ConfigError> {
        let t = &args.target;
        let interval = seconds(args.interval).ok_or(ConfigError::BadInterval { value: args.interval })?;
        let duration = match args.duration {
            None => None,
            Some(value) => Some(seconds(value).ok_or(ConfigError::BadDuration { value })?),
        };
        let mode = match exact_only(args) {
            because @ Some(_) => Mode::Exact { because },
            None if args.exact => Mode::Exact { because: None },
            None => Mode::Profile,
        };
        let budget = match (args.budget, mode) {
            (None, Mode::Profile) => Some(DEFAULT_PROFILE_BUDGET / 100.0),
            (None, Mode::Exact { .. }) => None,
            // Below 0.01% the attach's first window alone would take
            // minutes of the target's CPU time to pay for.
            (Some(value), _) if value.is_finite() && (MIN_BUDGET..=100.0).contains(&value) => Some(value / 100.0),
            (Some(value), _) => return Err(ConfigError::BadBudget { value }),
        };
        let links = args.links;
        let placement = placement_of(args, &target, starts, budget)?;
        if args.returns && budget.is_some() {
            return Err(ConfigError::BudgetWithReturns);
        }
        if args.types && budget.is_some() {
            return Err(ConfigError::BudgetWithTypes);
        }
        if t.native && matches!(target, TargetSpec::Exe(_)) {
            return Err(ConfigError::NativeWithExe);
        }
        if t.native && budget.is_some() {
            return Err(ConfigError::BudgetWithNative);
        }
        let probes = t.probes.clone();
        let creates = match &probes {
            ProbeSelection::Default | ProbeSelection::Refs => true,
            ProbeSelection::Alloc => false,
            ProbeSelection::Names(names) => names.iter().any(|n| n == "_Py_NewReference"),
        };
        if args.types && !creates {
            return Err(ConfigError::TypesWithoutNewReference { probes: probes.to_string() });
        }
        let stacks = stacks_config(args)?;
        if stacks.is_some() && budget.is_some() {
            return Err(ConfigError::BudgetWithStacks);
        }
        let live = live_config(args)?;
        if live.is_some() && budget.is_some() {
            return Err(ConfigError::BudgetWithLive);
        }
        if live.is_some() && matches!(target, TargetSpec::Exe(_)) {
            return Err(ConfigError::LiveWithExe);
        }
        let growth = growth_config(args, stacks.as_ref(), mode, &target)?;
        let pprof = pprof_config(args, stacks.as_ref(), growth.as_ref(), &target)?;
        let record = args.record.as_deref().map(|p| OutputFile::check("--record", p, args.files.force)).transpose()?;
        if let Some(r) = &record {
            let files = [
                stacks.as_ref().map(|s| [&s.folded, &s.flamegraph]),
                growth.as_ref().map(|g| [&g.folded, &g.flamegraph]),
            ];
            let mut others = files.into_iter().flatten().flatten().flatten().chain(pprof.as_ref());
            if others.any(|o| o.path == r.path) {
                return Err(ConfigError::SameOutput { path: r.path.clone() });
            }
        }
        Ok(Self {
            notes: Vec::new(),
            listen: args.listen,
            record,
            pprof,
            mode,
            gc: t.gc,
            live,
            growth,
            // The live table reads the implementations' returns itself
            // (`live_impls`); `--returns`' probes on the API functions
            // would add a breakpoint at each one's entry.
            returns: args.returns,
            types: args.types,
            native: t.native,
            stacks,
            bpf_log: args.bpf_log,
            debug_dir: t.debug_dir.clone(),
            inlined: !t.no_inlined,
            budget,
            links,
            target,
            probes,
            placement,
            call_sites_asked: t.placement == PlacementMode::CallSites,
            duration,
            interval,
            format: if args.json { Format::Json } else { Format::Table },
        })
    }
}

/// Where `auto` puts the probes of `args` (at the call sites only tracing
/// every event of one running process, not `tracer run`'s, whose
/// extension modules are mapped after the attach), and what call sites
/// refuse.
fn placement_of(
    args: &AttachArgs,
    target: &TargetSpec,
    starts: bool,
    budget: Option<f64>,
) -> Result<PlacementMode, ConfigError> {
    let (links, placement) = (args.links, args.target.placement);
    if placement == PlacementMode::CallSites && links == LinkMode::Perf {
        return Err(ConfigError::CallSitesNeedMulti);
    }
    if placement == PlacementMode::CallSites && budget.is_some() {
        return Err(ConfigError::BudgetWithCallSites);
    }
    let reach = crate::plan::AutoReach {
        every_event: budget.is_none(),
        one_running_process: matches!(target, TargetSpec::Pid(_)) && !starts,
        multi_links: links != LinkMode::Perf && crate::kernel::multi::available(),
    };
    Ok(placement.resolved(reach.takes_call_sites()))
}

/// `--live`, `--live-max`, `--leaks` and `--older`; `--leaks` and
/// `--older` turn on `--leaks`, and all of them `--live`.
fn live_config(args: &AttachArgs) -> Result<Option<LiveConfig>, ConfigError> {
    if let Some(value) = args.older
        && !(value.is_finite() && (0.0..=f64::from(MAX_SECONDS)).contains(&value))
    {
        return Err(ConfigError::BadOlder { value });
    }
    if args.live_max == Some(0) {
        return Err(ConfigError::LiveMaxZero);
    }
    let leaks = (args.leaks.is_some() || args.older.is_some())
        .then(|| LeaksConfig { list: args.leaks.unwrap_or(DEFAULT_LEAKS), older_s: args.older.unwrap_or(0.0) });
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
mod tests;
