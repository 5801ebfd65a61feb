//! The values of tracer's flags that clap's derive does not parse alone:
//! the closed sets' enums, `--also`'s setups, `--probes`, `--listen`.

use clap::ValueEnum;
use thiserror::Error;

use crate::probe::{ProbeSelection, SelectionError};

/// What a folded stack's count is (`--weight`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Weight {
    Calls,
    Bytes,
}

impl std::fmt::Display for Weight {
    /// The flag's own word for it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.to_possible_value() {
            Some(value) => f.write_str(value.get_name()),
            None => Ok(()),
        }
    }
}

/// A setup `tracer bench --also` measures beside its three, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Setup {
    /// tracer's probes at the function entries.
    Entry,
    /// tracer's probes with `--placement call-sites`.
    CallSites,
    /// An empty BPF program at the placed offsets: the uprobe's own cost.
    Empty,
    /// An empty BPF program at the entries.
    EmptyEntry,
    /// An empty BPF program at the call sites.
    EmptyCallSites,
    /// tracer's probes plus return-value probes, as `attach --returns`.
    Returns,
    /// The allocator-metadata experiment (tracer-ebpf/src/experiment.rs).
    MetaInsert,
    MetaLookup,
    MetaPool,
    MetaChunk,
    /// bpftrace counting the same functions at their entries.
    Bpftrace,
}

/// The setups of `--also` that take a value, as `NAME=VALUE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum SetupWithValue {
    /// `tracemalloc=FRAMES`: PYTHONTRACEMALLOC in pyperf's workers.
    Tracemalloc,
    /// `budget=PERCENT`: `tracer attach --budget PERCENT` on the interpreter.
    Budget,
}

/// One item of `--also`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Extra {
    Setup(Setup),
    /// PYTHONTRACEMALLOC=FRAMES, as given (a whole number above 0).
    Tracemalloc(String),
    /// `--budget PERCENT`, as given (above 0, at most 100).
    Budget(String),
}

/// `--also`: the setups in the order given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Setups(pub Vec<Extra>);

/// A value tracer's own parser refuses; `main` prints it as it is,
/// without clap's "invalid value" before it, which would say the same
/// twice. (A closed set's unknown value is clap's to refuse.)
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ValueError {
    #[error(transparent)]
    Probes(#[from] SelectionError),
    #[error(
        "--also names {item:?}, which is not a setup tracer bench knows; use {}, tracemalloc=FRAMES (e.g. tracemalloc=1) or budget=PERCENT (e.g. budget=1)",
        setup_names()
    )]
    UnknownSetup { item: String },
    #[error(
        "--listen {value:?} is neither a port nor an address and port; pass e.g. 9464 (127.0.0.1 only) or 0.0.0.0:9464"
    )]
    Listen { value: String },
    #[error(
        "--pid {value} is not a process ID (a whole number above 0); pass the PID of a running CPython process (e.g. from `pgrep python`)"
    )]
    Pid { value: String },
    #[error("{flag} 0 would list no {what}; pass the number of {what}s to list, e.g. {flag} {example}")]
    CountZero { flag: &'static str, what: &'static str, example: usize },
    #[error("{flag} must be a whole number above 0 (got {value}); e.g. {flag} {example}")]
    Count { flag: &'static str, value: String, example: usize },
    #[error("--stmt is empty, and pyperf times no empty statement; pass the statement to time, e.g. --stmt '[]'")]
    EmptyStatement,
}

/// Every setup `--also` names without a value, comma-separated.
fn setup_names() -> String {
    let names: Vec<String> =
        Setup::value_variants().iter().filter_map(|s| Some(s.to_possible_value()?.get_name().to_owned())).collect();
    names.join(", ")
}

/// `--probes`: a named set, or function names some supported version has.
pub(super) fn probe_selection(value: &str) -> Result<ProbeSelection, ValueError> {
    Ok(ProbeSelection::parse(value, &crate::python::known_probes())?)
}

/// `--listen`: a port on the loopback address, or an address and port.
pub(super) fn listen_addr(value: &str) -> Result<std::net::SocketAddr, ValueError> {
    if let Ok(port) = value.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    value.parse().map_err(|_| ValueError::Listen { value: value.to_owned() })
}

/// `--pid`: a process ID; 0, which parses, is refused with the target
/// (`config::target_spec`), as not a process.
pub(super) fn pid(value: &str) -> Result<u32, ValueError> {
    value.parse().map_err(|_| ValueError::Pid { value: value.to_owned() })
}

/// A flag that lists the first N of something (`--top`, `--leaks`): a
/// whole number above 0, since 0 would list nothing; `flag` lists `what`s,
/// `example` of them by default.
pub(super) fn count(
    flag: &'static str,
    what: &'static str,
    example: usize,
) -> impl Fn(&str) -> Result<usize, ValueError> + Clone + Send + Sync + 'static {
    move |value| match value.parse() {
        Ok(0) => Err(ValueError::CountZero { flag, what, example }),
        Ok(n) => Ok(n),
        Err(_) => Err(ValueError::Count { flag, value: value.to_owned(), example }),
    }
}

/// `bench --stmt`: pyperf refuses an empty (or blank) statement, once it
/// has started measuring; refused here before anything starts.
pub(super) fn statement(value: &str) -> Result<String, ValueError> {
    if value.trim().is_empty() { Err(ValueError::EmptyStatement) } else { Ok(value.to_owned()) }
}

/// `--stacks [EVENTS]`: as `--probes`; alone, the allocating functions.
pub(super) fn stack_events(value: &str) -> Result<ProbeSelection, ValueError> {
    if value.is_empty() { Ok(ProbeSelection::Alloc) } else { probe_selection(value) }
}

/// `--also`: comma-separated setups, each a [`Setup`] or a
/// [`SetupWithValue`] with its value.
pub(super) fn setups(value: &str) -> Result<Setups, ValueError> {
    let mut setups = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let unknown = || ValueError::UnknownSetup { item: item.to_owned() };
        let extra = match item.split_once('=') {
            None => Extra::Setup(Setup::from_str(item, false).map_err(|_| unknown())?),
            Some((name, value)) => match SetupWithValue::from_str(name, false).map_err(|_| unknown())? {
                SetupWithValue::Tracemalloc if value.parse::<u32>().is_ok_and(|f| f > 0) => {
                    Extra::Tracemalloc(value.to_owned())
                }
                SetupWithValue::Budget if value.parse::<f64>().is_ok_and(|p| p > 0.0 && p <= 100.0) => {
                    Extra::Budget(value.to_owned())
                }
                SetupWithValue::Tracemalloc | SetupWithValue::Budget => return Err(unknown()),
            },
        };
        setups.push(extra);
    }
    Ok(Setups(setups))
}
