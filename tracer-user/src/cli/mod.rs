//! The command line, declared once: one clap struct per subcommand, a
//! [`ValueEnum`](clap::ValueEnum) for every closed set of values, and tracer's own parsers
//! for the values that are more than a closed set (`--probes`, `--also`).
//! The rules between flags are the configuration's (config.rs).
#![allow(clippy::doc_markdown, reason = "doc comments here are --help text, where backticks would show")]

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

mod attach;
mod files;
mod values;

pub use attach::{AttachArgs, LinkMode};
pub use files::OutputFiles;

pub use values::{Extra, Setup, Setups, ValueError, Weight};
use values::{count, pid, probe_selection, setups, statement};

use crate::{
    plan::{PlacementMode, gc::GcMode},
    probe::ProbeSelection,
};

/// The hidden subcommand the calibration child runs.
pub const CHILD_COMMAND: &str = "__calibration-child";

/// The default `--interval`, in seconds.
pub const DEFAULT_INTERVAL_S: f64 = 1.0;

/// Count CPython reference and allocation events in a live process, from
/// outside, with eBPF uprobes.
#[derive(Debug, Parser)]
#[command(
    name = "tracer",
    version,
    long_about = "Count CPython reference and allocation events in a live process, from outside, with eBPF uprobes.\n\n\
The traced program needs no flag, hook or restart: tracer attaches uprobes to the interpreter's own \
functions while it runs, counts hits in per-CPU kernel maps, and removes every probe when it leaves. \
While nobody is tracing, the target runs exactly the code it was built with.\n\n\
Needs root (or the capabilities docs/attach.md lists under Privileges); `tracer report` needs none."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant, reason = "parsed once at start-up: the size of the arguments does not matter")]
pub enum Command {
    /// Attach to a running CPython process: its production profile by default, or exact counts (--exact).
    #[command(
        long_about = "Attach to a running CPython process and report on it each --interval.\n\n\
By default tracer runs the production profile, which holds its cost to the target within --budget \
(1% of the target's CPU time unless told): garbage collections per generation read from the \
interpreter's memory, the heap by type from a census as often as the budget pays for it, every \
few seconds (on tracer's CPU, none of the target's), and the rates of new references, allocations and frees estimated from short exact \
windows. The first line says the mode and its estimated cost. With --pid the profile also samples \
heap growth by Python stack where the build allows it (auto): if that costs the target more than \
half the budget in an interval, growth stops for the rest of the run and the output says so; \
--growth keeps it on whatever it costs, --no-growth leaves it off.\n\n\
With --exact (or any flag only exact tracing serves: --types, --live, --leaks, --returns, \
--stacks, --native, --placement call-sites and their companions), tracer counts every call and \
requested byte of _Py_NewReference, _Py_Dealloc and the PyObject_/PyMem_/PyMem_Raw allocator \
functions, at a cost the first line states.\n\n\
With --pid, the interpreter is found from /proc/PID/maps (a mapped libpython3.X.so, else the \
executable), its version is read from the process, and probes count only that process (all its \
threads). With --exe, every process running that interpreter is counted, per PID and in total. \
Every --interval a table (or with --json, a JSON line) of cumulative counts is printed; a summary \
follows when the run ends by Ctrl-C, SIGTERM, --duration or the target's exit.",
        after_help = "Examples:\n  sudo tracer attach --pid 1234\n  sudo tracer attach --pid $(pgrep -n python3) --duration 10 --json\n  sudo tracer attach --pid 1234 --exact --duration 5"
    )]
    Attach(AttachArgs),
    /// Start a program traced from its interpreter's first instruction, and report at its exit.
    #[command(
        long_about = "Start a program and trace the CPython interpreter it runs from its first instruction: \
the probes are live before the interpreter starts. Takes attach's flags (the production profile by \
default, --exact, --json, ...) and reports as attach does, on stderr (or --output FILE), so that the \
program's stdout stays its own.\n\n\
The program gets tracer's stdin, stdout, stderr and environment. tracer follows its process \
through exec (a shell script, env, a pyenv shim) to the first CPython interpreter it runs, holds \
it there with ptrace until the probes are attached, then lets it go. SIGTERM, SIGUSR1 and \
SIGUSR2 sent to tracer are passed on to the program, and SIGINT, SIGQUIT and SIGHUP too unless \
the terminal sent them to both (Ctrl-C, Ctrl-\\, a hangup); the run ends when the program exits, and tracer exits with \
its status (128 + the signal's number if a signal killed it). Processes the program starts are \
not traced. See docs/run.md.",
        after_help = "Examples:\n  sudo tracer run -- python3 app.py --port 8000\n  sudo tracer run --exact --json --output counts.jsonl -- python3 -c 'import json'"
    )]
    Run(RunArgs),
    /// Watch a CPython process live, full-screen: the heap by type, growth by site, rates.
    #[command(
        long_about = "Attach as `tracer attach` does (the production profile by default, or --exact) and \
draw what it reports full-screen in the terminal, redrawn each --interval: the heap by type from the \
latest census, heap growth by Python site, and each probed function's rate, with the cost to the \
target and the collections per generation on top. Estimates are marked ~ with their 95% interval.\n\n\
Keys: Tab moves between the tables, the left and right arrows (or 1-5) pick the column the table \
sorts by, r reverses it, q or Ctrl-C detaches and restores the terminal. stdout must be a \
terminal; for a report to read later or to pipe, use `tracer attach`. See docs/top.md.",
        after_help = "Examples:\n  sudo tracer top --pid 1234\n  sudo tracer top --pid $(pgrep -n python3) --interval 2"
    )]
    Top(TopArgs),
    /// Measure what tracer costs: pyperf timeit with nothing attached, attached, and detached again.
    #[command(
        long_about = "Measure what tracer costs a statement, with pyperf.\n\nRuns `pyperf timeit STMT` in the target interpreter in three states, interleaved in rounds so that \
drift of the machine cancels out: baseline (nothing attached), attached (tracer counting with \
--probes in every process of that interpreter) and detached (after attaching and detaching again). \
Each state's runs go to DIR/STATE.json, which `python -m pyperf compare_to` reads. Then prints \
pyperf's comparison of each state with the baseline, the exact number of probe hits per loop \
(counted over N and 2N loops in a separate process), and the cost of one probe hit.\n\n\
pyperf must be importable by the interpreter: `cargo xtask setup` installs it in a venv, which is \
the default --python.",
        after_help = "Examples:\n  sudo tracer bench --stmt '[]' --fast\n  sudo tracer bench --python /usr/bin/python3.11 --setup 'import json; d={\"a\": [1, 2]}' --stmt 'json.loads(json.dumps(d))' --json"
    )]
    Bench(BenchArgs),
    /// Show where each probe would go in a process or interpreter, and why (nothing is attached).
    #[command(
        long_about = "Show the attach plan: for each probed function, the offset from its entry where the uprobe \
goes, the instruction there, whether the kernel emulates it (cheap) or single-steps it (several \
times dearer), and why that instruction was chosen. Nothing is attached to the target.\n\n\
With --returns it also shows how each allocating function's return value would be read: it \
first times the three ways on a function of tracer's own (in a child process, which needs root), \
as `attach --returns` does.",
        after_help = "Examples:\n  sudo tracer probes --pid 1234\n  tracer probes --exe /usr/bin/python3.11 --json"
    )]
    Probes(ProbesArgs),
    /// Print the Python stack of every thread of a running CPython process (nothing is attached).
    #[command(
        long_about = "Print the Python stack of every thread of a running CPython process, innermost frame \
first: each frame's qualified function name, file and line, read from the process's memory \
(process_vm_readv) without stopping it, attaching anything or running code in it.\n\n\
The interpreter's version is read from the process (3.9 to 3.14); from 3.13 on, tracer's own \
table of the interpreter's structures is checked against the _Py_DebugOffsets the interpreter \
publishes, and a disagreement is an error. A thread that runs while it is read may show a \
frame that has just returned. Needs root (or ptrace access to the process).",
        after_help = "Examples:\n  sudo tracer stack --pid 1234\n  sudo tracer stack --pid $(pgrep -n python3) --json"
    )]
    Stack(StackArgs),
    /// The heap of a running CPython process by type, read from outside (nothing is attached).
    #[command(
        long_about = "The heap of a running CPython process by type, read from outside: the `jmap -histo` of Python. \
For each type, its live objects, their bytes and their share; pymalloc's totals; the objects outside \
pymalloc; and the resident memory the census does not account for.\n\n\
Nothing is attached and no code runs in the target: its memory is read with process_vm_readv. \
pymalloc's pools are found by scanning the process's anonymous mappings for their headers (no debug \
info needed), read in bulk, and each allocated block is classified by its object's type, which must \
lead to `type`; what is refused is counted by reason. Objects larger than 512 bytes are found on the \
collector's lists and as what tuples, lists and dicts hold.\n\n\
By default the target runs while it is read, so the census is an estimate: objects made or freed \
meanwhile may be seen or missed. --stop pauses every thread with ptrace for an exact census and \
says for how long; the target is always let go, also on an error, Ctrl-C or SIGTERM, and by the \
kernel if tracer is killed. Needs root (or ptrace access to the process). See docs/heap.md.",
        after_help = "Examples:\n  sudo tracer heap --pid 1234\n  sudo tracer heap --pid $(pgrep -n python3) --top 20 --stop\n  sudo tracer heap --pid 1234 --json | jq '.types[:5]'"
    )]
    Heap(HeapArgs),
    /// Turn a run's record (`--record FILE`) into the table, JSON, stacks' files or a heap diff.
    #[command(
        long_about = "Turn a run's record into a report, without the target: the record is the file \
`tracer attach --record FILE` (or `tracer run --record FILE`) wrote, or `attach --json`'s output saved, \
one event per line, every name already read.\n\n\
By default the run's table is printed as it was shown live. --json prints the events again. \
--folded, --flamegraph, --growth-folded, --growth-flamegraph and --pprof write the summary's \
stacks as attach does at the end of a run (the record must hold the summary). --diff FROM TO \
prints the heap's change by type between the first census taken at or after FROM seconds and \
the last one at or before TO (both from the attach; a census's time as shown, to 0.1 s, or \
exact). See docs/report.md.",
        after_help = "Examples:\n  tracer report run.jsonl\n  tracer report run.jsonl --flamegraph allocs.svg\n  tracer report run.jsonl --diff 10 60"
    )]
    Report(ReportArgs),
    /// The child `--budget` calibrates probe costs on (internal).
    #[command(name = CHILD_COMMAND, hide = true)]
    CalibrationChild,
}

/// `tracer run`: attach's flags, without a target, and the command.
#[derive(Clone, Debug, Parser)]
#[command(
    mut_group("target", |g| g.required(false)),
    // Signals are passed on to the program: the run ends with it.
    mut_arg("duration", |a| a.help(
        "Detach after this many seconds and print the summary; the program runs on, and tracer exits \
         with its status when it exits (default: report until the program exits)"
    )),
    mut_arg("pid", |a| a.hide(true).conflicts_with("command")),
    mut_arg("exe", |a| a.hide(true).conflicts_with("command")),
    mut_arg("name", |a| a.hide(true).conflicts_with("command")),
    mut_arg("all", |a| a.hide(true).conflicts_with("command"))
)]
pub struct RunArgs {
    #[command(flatten)]
    pub attach: AttachArgs,
    /// Write the report (the table, or with --json its lines) to FILE instead of stderr.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The program to run and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<std::ffi::OsString>,
}

/// `tracer top`: attach's flags; its output is the screen.
#[derive(Clone, Debug, Parser)]
#[command(
    mut_arg("json", |a| a.hide(true)),
    // The screen's q ends a run too.
    mut_arg("exe", |a| a.help(
        "Trace every process that runs this interpreter, those running now and those started later. \
         Runs until q, Ctrl-C, SIGTERM or --duration"
    )),
    mut_arg("duration", |a| a.help("Stop after this many seconds (default: until q, Ctrl-C, SIGTERM or the target exits)"))
)]
pub struct TopArgs {
    #[command(flatten)]
    pub attach: AttachArgs,
}

/// `tracer report`: the files are the summary's as `attach` writes them
/// (one declaration, [`OutputFiles`]), written from the record.
#[derive(Clone, Debug, Parser)]
#[command(
    mut_arg("folded", |a| a.help(
        "Write the summary's stacks in folded form (the input of flamegraph.pl and inferno) to FILE, \
         weighted as --weight says (a record of a run with --stacks). FILE must not exist unless --force"
    )),
    mut_arg("flamegraph", |a| a.help(
        "Write a flame graph of the summary's stacks as an SVG to FILE (a record of a run with --stacks). \
         FILE must not exist unless --force"
    )),
    mut_arg("growth_folded", |a| a.help(
        "Write the summary's growth stacks in folded form (weighted by the bytes of the pools they hold) \
         to FILE (a record of a run that sampled growth). FILE must not exist unless --force"
    )),
    mut_arg("growth_flamegraph", |a| a.help(
        "Write a flame graph of the summary's growth stacks as an SVG to FILE (a record of a run that \
         sampled growth). FILE must not exist unless --force"
    )),
    mut_arg("pprof", |a| a.help(
        "Write a pprof profile (gzipped profile.proto) of the summary to FILE, as `attach --pprof` \
         does: the stacks' events as alloc_objects and alloc_space (exact), growth's stacks as \
         inuse_objects and inuse_space (a sampled estimate). FILE must not exist unless --force"
    )),
    mut_arg("force", |a| a.help(
        "Let the output files (--folded, --flamegraph, --growth-folded, --growth-flamegraph, --pprof) \
         overwrite an existing file (never through a symlink)"
    ))
)]
pub struct ReportArgs {
    /// The record: the file `--record` wrote, or `attach --json`'s lines.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// JSON Lines instead of the table; with --diff, one JSON object.
    #[arg(long, conflicts_with_all = ["folded", "flamegraph", "growth_folded", "growth_flamegraph", "pprof"])]
    pub json: bool,
    /// The heap's change by type from the first census taken at or after FROM seconds (from the
    /// attach) to the last taken at or before TO, a census's time as the table shows it (to 0.1 s)
    /// or exact.
    #[arg(
        long,
        num_args = 2,
        value_names = ["FROM", "TO"],
        allow_negative_numbers = true,
        conflicts_with_all = ["folded", "flamegraph", "growth_folded", "growth_flamegraph", "pprof"]
    )]
    pub diff: Option<Vec<f64>>,
    /// With --diff: the types listed, most bytes gained first (the JSON has every type).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 25,
        requires = "diff",
        allow_negative_numbers = true,
        value_parser = count("--top", "type", 25)
    )]
    pub top: usize,
    #[command(flatten)]
    pub files: OutputFiles,
}

/// `tracer stack`.
#[derive(Clone, Debug, Parser)]
pub struct StackArgs {
    /// PID of the CPython process.
    #[arg(long, short = 'p', value_name = "PID", allow_negative_numbers = true, value_parser = pid)]
    pub pid: u32,
    /// One JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Read at most this many frames per thread; a deeper stack is cut and marked truncated.
    #[arg(
        long,
        value_name = "FRAMES",
        default_value_t = 1024,
        allow_negative_numbers = true,
        value_parser = clap::value_parser!(u32).range(1..=1_000_000)
    )]
    pub max_depth: u32,
    /// Also read each task's thread-local thread state through its fsbase, as the BPF walker will
    /// (3.12+; stops each task for a moment with ptrace; JSON only).
    #[arg(long, hide = true)]
    pub check_tls: bool,
}

/// `tracer heap`.
#[derive(Clone, Debug, Parser)]
pub struct HeapArgs {
    /// PID of the CPython process.
    #[arg(long, short = 'p', value_name = "PID", allow_negative_numbers = true, value_parser = pid)]
    pub pid: u32,
    /// Show the N types with the most bytes (the JSON has every type).
    #[arg(long, value_name = "N", default_value_t = 25, allow_negative_numbers = true, value_parser = count("--top", "type", 25))]
    pub top: usize,
    /// One JSON object instead of a table: `types` ([{name, count, bytes}], most bytes first),
    /// `pymalloc`, `outside`, `rss`, `accounted`, `unaccounted`, `rejected`, `partial`, `cost`.
    #[arg(long)]
    pub json: bool,
    /// Pause the target (every thread, with ptrace) while it is read: an exact census. The
    /// output says how long it was stopped.
    #[arg(long)]
    pub stop: bool,
    /// Also look for the interpreter's debug file here (by build-id or .gnu_debuglink name); on
    /// 3.11, pymalloc's arena table is found through its symbols, to check the scan.
    #[arg(long, value_name = "DIR")]
    pub debug_dir: Option<PathBuf>,
}

/// `tracer probes`: the target's flags, said of a plan (nothing is traced).
#[derive(Clone, Debug, Parser)]
#[command(
    mut_arg("pid", |a| a.help("PID of the CPython process whose plan to show")),
    mut_arg("exe", |a| a.help(
        "Show the plan for this interpreter (its executable or libpython), as `attach --exe` would probe \
         it in every process that runs it"
    )),
    mut_arg("name", |a| a.help(
        "Show the plan for the CPython process whose command line matches PATTERN, a regular expression, \
         as `pgrep -f PATTERN` matches; a matching wrapper (a shell, sudo, a pyenv shim) is followed to \
         the CPython process it started. Exactly one must match"
    )),
    mut_arg("debug_dir", |a| a.help(
        "Also look for the interpreter's debug info (DWARF) here, by build-id \
         (DIR/.build-id/xx/rest.debug) and by .gnu_debuglink name; after the image itself, \
         /usr/lib/debug/.build-id and the debuglink's standard places inside the target's root. \
         With it, the plan shows every copy of a probed function that the compiler inlined"
    )),
    mut_arg("native", |a| a.help(
        "Also plan the C library's allocator probes, as `attach --native` places them: malloc, calloc, \
         realloc, free, posix_memalign, aligned_alloc, mmap and munmap, found in the process's own libc \
         (inside its root: a chroot's or container's). With --pid only"
    )),
    mut_arg("gc", |a| a.help(
        "How garbage collections would be seen, as `attach --gc` takes it: auto (CPython's gc__start and \
         gc__done markers where the build has them, else the collection function's entry and return \
         where tracer knows that they show the same, else not, and the plan says why), markers, \
         function, or off. The plan's gc lines (the JSON's `gc`) list each GC probe"
    ))
)]
#[allow(clippy::struct_excessive_bools, reason = "one field per on/off command-line flag, as clap gives them")]
pub struct ProbesArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Also show how each allocating function's return value would be read (as `attach --returns`).
    #[arg(long)]
    pub returns: bool,
    /// Also show the allocator implementations `attach --live` probes: where each is probed and
    /// how its return is read (calibrates, as --returns).
    #[arg(long)]
    pub live: bool,
    /// Also show where `attach --growth` samples heap growth (pymalloc's slow path), or why it
    /// cannot.
    #[arg(long)]
    pub growth: bool,
    /// One JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `tracer bench`.
#[derive(Clone, Debug, Parser)]
pub struct BenchArgs {
    /// The interpreter to measure (default: the venv `cargo xtask setup` made, else python3 on PATH).
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
    /// Run the interpreter chrooted in DIR (a distribution's root, such as the Debian forky root `cargo
    /// xtask setup` makes); --python is then a path inside DIR, and is required.
    #[arg(long, value_name = "DIR", requires = "python")]
    pub root: Option<PathBuf>,
    /// The statement to time (not empty).
    #[arg(long, default_value = "[]", value_parser = statement)]
    pub stmt: String,
    /// Code run once before timing.
    #[arg(long, default_value = "pass")]
    pub setup: String,
    /// Which functions to probe while attached (as for `attach`).
    #[arg(long, value_name = "SET", default_value = "default", value_parser = probe_selection)]
    pub probes: ProbeSelection,
    /// Fewer rounds and values (3 rounds of 6 values, against 5 of 8 by default): a rough answer in
    /// about a minute.
    #[arg(long, conflicts_with = "rigorous")]
    pub fast: bool,
    /// More rounds and values (10 rounds, each of 2 processes of 8 values): slower, tighter.
    #[arg(long)]
    pub rigorous: bool,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Where tracer's probes go while attached: auto, inside, entry or call-sites (as for `attach
    /// --exact --exe`: the workers are many processes, so auto is inside; --also call-sites adds call
    /// sites beside it).
    #[arg(long, value_name = "WHERE", value_enum, default_value_t = PlacementMode::Auto, hide_possible_values = true)]
    pub placement: PlacementMode,
    /// More setups to measure beside the three, comma-separated: entry (tracer's probes at the function
    /// entries), empty and empty-entry (an empty BPF program at the placed offsets or the entries: the
    /// cost of the uprobe itself), call-sites (tracer's probes with `--placement
    /// call-sites`) and empty-call-sites (an empty BPF program there), bpftrace (bpftrace counting the same functions at their entries),
    /// tracemalloc=FRAMES (PYTHONTRACEMALLOC in the workers), budget=PERCENT (`tracer attach --exact --budget
    /// PERCENT` on the interpreter), returns (tracer's probes plus return-value probes, as `attach
    /// --returns`), meta-insert, meta-lookup, meta-pool and meta-chunk (bench-only programs that
    /// measure reading a block's size from the allocator's metadata against the live table's lookup;
    /// BENCHMARKS.md).
    #[arg(long, value_name = "SETUPS", default_value = "", value_parser = setups)]
    pub also: Setups,
    /// Directory for the pyperf JSON files (baseline.json, attached.json, detached.json).
    #[arg(short = 'o', long = "output", value_name = "DIR", default_value = "tracer-bench")]
    pub out: PathBuf,
}

/// What to trace and where: shared by `attach` and `probes`.
#[derive(Clone, Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["pid", "exe", "name"])))]
pub struct TargetArgs {
    /// PID of the CPython process to trace (all its threads).
    #[arg(long, short = 'p', value_name = "PID", allow_negative_numbers = true, value_parser = pid)]
    pub pid: Option<u32>,
    /// Trace every process that runs this interpreter, those running now and those started later;
    /// reports per PID and in total. Runs until Ctrl-C, SIGTERM or --duration.
    #[arg(long, short = 'e', value_name = "PATH")]
    pub exe: Option<PathBuf>,
    /// Trace the CPython process whose command line matches PATTERN, a regular expression, as
    /// `pgrep -f PATTERN` matches; a matching wrapper (a shell, sudo, a pyenv shim) is followed to
    /// the CPython process it started. Exactly one must match.
    #[arg(long, short = 'n', value_name = "PATTERN")]
    pub name: Option<String>,
    /// Which functions to probe: default (all), refs (_Py_NewReference, _Py_Dealloc), alloc (the
    /// allocator API), or a comma-separated list of function names.
    #[arg(long, value_name = "SET", default_value = "default", value_parser = probe_selection)]
    pub probes: ProbeSelection,
    /// Where in each function to probe: inside (the first instruction the kernel emulates rather than
    /// single-steps, when that counts the same calls; see `tracer probes`), entry, call-sites (as
    /// inside, but a function with no such instruction is probed at every call to it, in the image
    /// and in every module that can call it, when its address never escapes), or auto, the default:
    /// call-sites when tracing every event of one running process (`attach --exact` with --pid or
    /// --name, and `tracer probes` with them) through uprobe-multi links (Linux 6.6+), inside
    /// otherwise (the production profile, --budget, --exe, `tracer run`, --links perf). At
    /// call sites, calls through addresses found at run time (ctypes, dlsym) are not seen, and a
    /// module mapped after the attach (by the target, or with --exe by any of its processes) is
    /// probed from the next interval on (stderr and the JSON say so); --placement inside has neither
    /// gap. call-sites needs uprobe-multi links and is not for --budget.
    #[arg(long, value_name = "WHERE", value_enum, default_value_t = PlacementMode::Auto, hide_possible_values = true)]
    pub placement: PlacementMode,
    /// Also look for the interpreter's debug info (DWARF) here, by build-id
    /// (DIR/.build-id/xx/rest.debug) and by .gnu_debuglink name; after the image itself,
    /// /usr/lib/debug/.build-id and the debuglink's standard places inside the target's root.
    /// With it, every copy of a probed function that the compiler inlined is probed too.
    #[arg(long, value_name = "DIR")]
    pub debug_dir: Option<PathBuf>,
    /// Probe only each function's own code, not the copies the compiler inlined elsewhere (fewer
    /// uprobes; on an LTO build the counts are then partial, and marked so).
    #[arg(long)]
    pub no_inlined: bool,
    /// Also probe the C library's allocator in the target: malloc, calloc, realloc, free,
    /// posix_memalign, aligned_alloc, mmap and munmap, found in the process's own libc (inside its
    /// root: a chroot's or container's). Counts calls and bytes per function and a "native" size
    /// histogram; the interpreter's raw domain is part of what it counts. With --pid only. Costs
    /// each libc call a probe hit (1.4-1.8 µs each where measured: BENCHMARKS.md).
    #[arg(long)]
    pub native: bool,
    /// How garbage collections are seen: auto (CPython's gc__start and gc__done markers where the
    /// build has them, as USDT probes whose semaphores the kernel raises while attached; else the
    /// collection function's entry and return where tracer knows that they show the same; else
    /// not, and the output says why), markers, function, or off. Collections per generation, their
    /// durations and the objects found unreachable are in the table and the JSON's `gc`. A
    /// collection seen by probes costs the target two probe hits (about 3 µs where measured:
    /// BENCHMARKS.md); the production profile reads the counts from memory, at no cost to it.
    #[arg(long, value_name = "HOW", value_enum, default_value_t = GcMode::Auto, hide_possible_values = true)]
    pub gc: GcMode,
}

/// clap's multi-line usage error as one line, pointing at the help of the
/// subcommand it is about (`subcommand`, the first argument, if it names
/// one): the lines before "Usage:", without clap's own "error: " and help
/// hint, the possible values and a tip each joined with "; ".
#[must_use]
pub fn usage_error(err: &clap::Error, subcommand: Option<&str>) -> String {
    let mut parts: Vec<String> = Vec::new();
    for line in err.render().to_string().lines().map(str::trim) {
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if line.is_empty() {
            continue;
        }
        if let Some(first) = line.strip_prefix("error: ") {
            parts.push(first.trim_end_matches(':').to_owned());
        } else if let Some(tip) = line.strip_prefix("tip: ") {
            parts.push(tip.to_owned());
        } else if let Some(values) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            // A closed set's values, as "[possible values: a, b]".
            parts.push(values.to_owned());
        } else if let Some(last) = parts.last_mut() {
            // A continuation line, such as the missing arguments' list.
            last.push_str(": ");
            last.push_str(line);
        } else {
            parts.push(line.to_owned());
        }
    }
    let cli = <Cli as clap::CommandFactory>::command();
    let help = match subcommand.and_then(|name| cli.find_subcommand(name)) {
        Some(sub) if !sub.is_hide_set() => format!("tracer {} --help", sub.get_name()),
        _ => "tracer --help".to_owned(),
    };
    format!("{}; see `{help}`", parts.join("; "))
}

#[cfg(test)]
mod tests;
