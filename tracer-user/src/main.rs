//! The `tracer` command line.
// The doc comments here are --help text, where backticks would show.
#![allow(clippy::doc_markdown)]

use std::{path::PathBuf, process::ExitCode};

use clap::{Args, Parser, Subcommand};
use tracer_user::{
    config::{AttachArgs as ConfigArgs, AttachConfig, DEFAULT_INTERVAL_S, TargetSpec},
    error::exit_status,
    privileges,
};

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
Needs root (or CAP_BPF and CAP_PERFMON)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant, reason = "parsed once at start-up: the size of the arguments does not matter")]
enum Command {
    /// Attach to a running CPython process and count calls and bytes.
    #[command(
        long_about = "Attach to a running CPython process and count calls and requested bytes of _Py_NewReference, \
_Py_Dealloc and the PyObject_/PyMem_/PyMem_Raw allocator functions.\n\n\
With --pid, the interpreter is found from /proc/PID/maps (a mapped libpython3.X.so, else the \
executable), its version is read from the process, and probes count only that process (all its \
threads). With --exe, every process running that interpreter is counted, per PID and in total. \
Every --interval a table (or with --json, a JSON line) of cumulative counts is printed; a summary \
follows when the run ends by Ctrl-C, SIGTERM, --duration or the target's exit.",
        after_help = "Examples:\n  sudo tracer attach --pid 1234\n  sudo tracer attach --pid $(pgrep -n python3) --duration 10 --json"
    )]
    Attach(AttachArgs),
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
(/proc/PID/mem) without stopping it, attaching anything or running code in it.\n\n\
The interpreter's version is read from the process (3.11 to 3.14); from 3.13 on, tracer's own \
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
collector's lists and as items of tuples and lists.\n\n\
By default the target runs while it is read, so the census is an estimate: objects made or freed \
meanwhile may be seen or missed. --stop pauses every thread with ptrace for an exact census and \
says for how long; the target is always let go, also on an error, Ctrl-C or SIGTERM, and by the \
kernel if tracer is killed. Needs root (or ptrace access to the process). See docs/heap.md.",
        after_help = "Examples:\n  sudo tracer heap --pid 1234\n  sudo tracer heap --pid $(pgrep -n python3) --top 20 --stop\n  sudo tracer heap --pid 1234 --json | jq '.types[:5]'"
    )]
    Heap(HeapArgs),
    /// The child `--budget` calibrates probe costs on (internal).
    #[command(name = "__calibration-child", hide = true)]
    CalibrationChild,
}

#[derive(Debug, Args)]
struct StackArgs {
    /// PID of the CPython process.
    #[arg(long, short = 'p', value_name = "PID")]
    pid: u32,
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Read at most this many frames per thread; a deeper stack is cut and marked truncated.
    #[arg(long, value_name = "FRAMES", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_depth: u32,
    /// Also read each task's thread-local thread state through its fsbase, as the BPF walker will
    /// (3.12+; stops each task for a moment with ptrace; JSON only).
    #[arg(long, hide = true)]
    check_tls: bool,
}

#[derive(Debug, Args)]
struct HeapArgs {
    /// PID of the CPython process.
    #[arg(long, short = 'p', value_name = "PID")]
    pid: u32,
    /// Show the N types with the most bytes (the JSON has every type).
    #[arg(long, value_name = "N", default_value_t = 25)]
    top: usize,
    /// One JSON object instead of a table: `types` ([{name, count, bytes}], most bytes first),
    /// `pymalloc`, `outside`, `rss`, `accounted`, `unaccounted`, `rejected`, `partial`, `cost`.
    #[arg(long)]
    json: bool,
    /// Pause the target (every thread, with ptrace) while it is read: an exact census. The
    /// output says how long it was stopped.
    #[arg(long)]
    stop: bool,
    /// Also look for the interpreter's debug file here (by build-id or .gnu_debuglink name); on
    /// 3.11, pymalloc's arena table is found through its symbols, to check the scan.
    #[arg(long, value_name = "DIR")]
    debug_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct ProbesArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Also show how each allocating function's return value would be read (as `attach --returns`).
    #[arg(long)]
    returns: bool,
    /// Also show the allocator implementations `attach --live` probes: where each is probed and
    /// how its return is read (calibrates, as --returns).
    #[arg(long)]
    live: bool,
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// The interpreter to measure (default: the venv `cargo xtask setup` made, else python3 on PATH).
    #[arg(long, value_name = "PATH")]
    python: Option<std::path::PathBuf>,
    /// The statement to time.
    #[arg(long, default_value = "[]")]
    stmt: String,
    /// Code run once before timing.
    #[arg(long, default_value = "pass")]
    setup: String,
    /// Which functions to probe while attached (as for `attach`).
    #[arg(long, value_name = "SET", default_value = "default")]
    probes: String,
    /// Fewer rounds and values: a rough answer in about a minute.
    #[arg(long, conflicts_with = "rigorous")]
    fast: bool,
    /// More rounds and values: slower, tighter.
    #[arg(long)]
    rigorous: bool,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
    /// Where tracer's probes go while attached: auto, entry or call-sites (as for `attach`).
    #[arg(long, value_name = "WHERE", default_value = "auto")]
    placement: String,
    /// More setups to measure beside the three, comma-separated: entry (tracer's probes at the function
    /// entries), empty and empty-entry (an empty BPF program at the placed offsets or the entries: the
    /// cost of the uprobe itself), call-sites (tracer's probes with `--placement
    /// call-sites`) and empty-call-sites (an empty BPF program there), bpftrace (bpftrace counting the same functions at their entries),
    /// tracemalloc=FRAMES (PYTHONTRACEMALLOC in the workers), budget=PERCENT (`tracer attach --budget
    /// PERCENT` on the interpreter), returns (tracer's probes plus return-value probes, as `attach
    /// --returns`), meta-insert, meta-lookup, meta-pool and meta-chunk (bench-only programs that
    /// measure reading a block's size from the allocator's metadata against the live table's lookup;
    /// BENCHMARKS.md).
    #[arg(long, value_name = "SETUPS", default_value = "")]
    also: String,
    /// Directory for the pyperf JSON files (baseline.json, attached.json, detached.json).
    #[arg(short = 'o', long = "output", value_name = "DIR", default_value = "tracer-bench")]
    out: std::path::PathBuf,
}

/// What to trace and where: shared by `attach` and `probes`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["pid", "exe"])))]
struct TargetArgs {
    /// PID of the CPython process to trace (all its threads).
    #[arg(long, short = 'p', value_name = "PID")]
    pid: Option<u32>,
    /// Trace every process that runs this interpreter, those running now and those started later;
    /// reports per PID and in total. Runs until Ctrl-C, SIGTERM or --duration.
    #[arg(long, short = 'e', value_name = "PATH")]
    exe: Option<std::path::PathBuf>,
    /// Which functions to probe: default (all), refs (_Py_NewReference, _Py_Dealloc), alloc (the
    /// allocator API), or a comma-separated list of function names.
    #[arg(long, value_name = "SET", default_value = "default")]
    probes: String,
    /// Where in each function to probe: auto (the first instruction the kernel emulates rather than
    /// single-steps, when that counts the same calls; see `tracer probes`), entry, or call-sites (as
    /// auto, but a function with no such instruction is probed at every call to it, in the image and
    /// in every module that can call it, when its address never escapes). With call-sites, calls
    /// through addresses found at run time (ctypes, dlsym) are not seen, and a module mapped after
    /// the attach (by the target, or with --exe by any of its processes) is probed from the next
    /// interval on (stderr and the JSON say so). Needs uprobe-multi links; not with --budget.
    #[arg(long, value_name = "WHERE", default_value = "auto")]
    placement: String,
    /// Also look for the interpreter's debug info (DWARF) here, by build-id
    /// (DIR/.build-id/xx/rest.debug) and by .gnu_debuglink name; after the image itself,
    /// /usr/lib/debug/.build-id and the debuglink's standard places inside the target's root.
    /// With it, every copy of a probed function that the compiler inlined is probed too.
    #[arg(long, value_name = "DIR")]
    debug_dir: Option<std::path::PathBuf>,
    /// Probe only each function's own code, not the copies the compiler inlined elsewhere (fewer
    /// uprobes; on an LTO build the counts are then partial, and marked so).
    #[arg(long)]
    no_inlined: bool,
    /// Also probe the C library's allocator in the target: malloc, calloc, realloc, free,
    /// posix_memalign, aligned_alloc, mmap and munmap, found in the process's own libc (inside its
    /// root: a chroot's or container's). Counts calls and bytes per function and a "native" size
    /// histogram; the interpreter's raw domain is part of what it counts. With --pid only.
    #[arg(long)]
    native: bool,
    /// How garbage collections are seen: auto (CPython's gc__start and gc__done markers where the
    /// build has them, as USDT probes whose semaphores the kernel raises while attached; else the
    /// collection function's entry and return where tracer knows that they show the same; else
    /// not, and the output says why), markers, function, or off. Collections per generation, their
    /// durations and the objects found unreachable are in the table and the JSON's `gc`.
    #[arg(long, value_name = "HOW", default_value = "auto")]
    gc: String,
}

#[derive(Debug, Args)]
#[allow(clippy::struct_excessive_bools, reason = "one field per on/off command-line flag, as clap gives them")]
struct AttachArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Stop after this many seconds (default: until Ctrl-C, SIGTERM or the target exits).
    #[arg(long, short = 'd', value_name = "SECONDS")]
    duration: Option<f64>,
    /// Seconds between reports.
    #[arg(long, short = 'i', value_name = "SECONDS", default_value_t = DEFAULT_INTERVAL_S)]
    interval: f64,
    /// Write JSON Lines (attached, interval, note, summary) instead of a table; see the README for the schema.
    #[arg(long)]
    json: bool,
    /// Keep tracer's cost under PERCENT of the target's time: trace in short windows and detach
    /// between them for as long as the budget needs (the cost of a hit is calibrated at start).
    /// Counts are then of the traced windows only, and rates are estimates with a 95% confidence
    /// interval, marked as such in the table and the JSON. Not with --returns or
    /// --placement call-sites.
    #[arg(long, value_name = "PERCENT")]
    budget: Option<f64>,
    /// How probes attach: auto (uprobe-multi links where the kernel has them, Linux 6.6+, else one
    /// perf-event uprobe per probe), multi, or perf. Multi links detach all at once; perf-event
    /// uprobes detach about 0.13 s apart each.
    #[arg(long, value_name = "HOW", default_value = "auto")]
    links: String,
    /// Also read what each allocating function returns (the new pointer): counts of returns and of
    /// NULL returns. A probe on every `ret` of a function that always returns through one, else a
    /// uretprobe; `tracer probes --returns` shows which.
    #[arg(long)]
    returns: bool,
    /// Also count the objects each new reference creates by their type (`tp_name`), read at
    /// `_Py_NewReference` (on 3.12+ also `_Py_NewReferenceNoTotal`, which the free lists call):
    /// top types in the table, every type in the JSON's `types`. Each new reference then costs one
    /// read of the target's memory and one map update more. Not with --budget.
    #[arg(long)]
    types: bool,
    /// Track live memory: every block the allocator functions hand out since the attach, by address,
    /// in a kernel table, until it is freed. Each interval gives the blocks outstanding and their
    /// bytes per domain (object, mem, raw), in the table and the JSON's `live`. Reads each returned
    /// pointer at the allocator's implementations (calibrating first, as --returns does, whose
    /// probes on the API functions it does not need). Blocks allocated before the attach are unknown (their
    /// frees are counted as untracked). Not with --budget or --exe.
    #[arg(long)]
    live: bool,
    /// The live table's room, in blocks (turns on --live). A block that finds it full is counted as
    /// dropped, never as live, and tracer keeps running.
    #[arg(long, value_name = "BLOCKS")]
    live_max: Option<u32>,
    /// At the end, list the N oldest blocks still outstanding, with address, size, domain, function
    /// and age (default 20; turns on --live).
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "20")]
    leaks: Option<usize>,
    /// With --leaks: only blocks at least SECONDS old at the end (turns on --leaks).
    #[arg(long, value_name = "SECONDS", allow_hyphen_values = true)]
    older: Option<f64>,
    /// Record the Python stack of each event of EVENTS: `alloc` (the allocating functions; the
    /// default when the flag is given alone), `refs`, `default`, or function names. The kernel
    /// walks the current thread's frames and counts calls and bytes per stack; the table and the
    /// JSON list the top allocation sites (see --top). Not with --budget.
    #[arg(long, value_name = "EVENTS", num_args = 0..=1, default_missing_value = "")]
    stacks: Option<String>,
    /// With stacks: the most Python frames walked per event (1-128); a deeper stack is cut there
    /// and counted as truncated.
    #[arg(long, value_name = "FRAMES")]
    depth: Option<u32>,
    /// With stacks: record the stack of one event in N (per CPU) and scale its counts by N,
    /// labelled as estimates; the per-function counts stay exact.
    #[arg(long, value_name = "N")]
    sample: Option<u64>,
    /// List the N allocation sites (innermost Python frame) with the most calls, in the table and
    /// the JSON's `sites` (default 10; turns on --stacks).
    #[arg(long, value_name = "N")]
    top: Option<usize>,
    /// At the end, write the stacks in folded form (the input of flamegraph.pl and inferno) to FILE,
    /// weighted as --weight says (turns on --stacks). FILE must not exist unless --force.
    #[arg(long, value_name = "FILE")]
    folded: Option<PathBuf>,
    /// At the end, write a flame graph of the stacks as an SVG to FILE (turns on --stacks). FILE
    /// must not exist unless --force.
    #[arg(long, value_name = "FILE")]
    flamegraph: Option<PathBuf>,
    /// What --folded and --flamegraph weigh: calls or bytes.
    #[arg(long, value_name = "WHAT")]
    weight: Option<String>,
    /// Let --folded and --flamegraph overwrite an existing file (never through a symlink).
    #[arg(long)]
    force: bool,
    /// With stacks, also unwind each event's native (C) stack in the kernel, from the modules'
    /// .eh_frame unwind tables (no frame pointers needed; at most 64 frames), and name its frames
    /// from ELF symbols and DWARF (inlined functions too). Folded stacks and flame graphs then
    /// show the process's native root at the bottom, the Python frames where the eval loop runs
    /// them, and the native callers of the probe on top (turns on --stacks).
    #[arg(long)]
    native_stacks: bool,
    /// Pass on what the BPF programs log (each probe's first hit per process, and every miss, with its
    /// cause), as notes on stderr and in the JSON: for when a probe seems to misbehave. Off by default,
    /// and then free: the logging code is dead to the kernel's verifier.
    #[arg(long)]
    bpf_log: bool,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help, --version, and bare `tracer` (which prints the help).
        Err(e) if !e.use_stderr() || e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            e.exit()
        }
        Err(e) => {
            eprintln!("tracer: error: {}", usage_error(&e.render().to_string(), std::env::args().nth(1).as_deref()));
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Attach(args) => attach(&args),
        Command::Bench(args) => bench(&args),
        Command::Probes(args) => probes(&args),
        Command::Stack(args) => stack(&args),
        Command::Heap(args) => heap(&args),
        Command::CalibrationChild => tracer_user::run::calibrate::child_main().map_err(Into::into),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`tracer ... | head`): the probes are already
        // detached by then, and there is nobody left to tell.
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            // One line: the cause chain joined with ": ".
            eprintln!("tracer: error: {err:#}");
            ExitCode::from(u8::try_from(exit_status(&err)).unwrap_or(1))
        }
    }
}

/// clap's multi-line usage error as one line, pointing at the help of the
/// subcommand it is about: the lines before "Usage:" (a tip joined with
/// "; "), without clap's own "error: " and help hint.
fn usage_error(rendered: &str, subcommand: Option<&str>) -> String {
    let mut parts: Vec<String> = Vec::new();
    for line in rendered.lines().map(str::trim) {
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
        } else if let Some(last) = parts.last_mut() {
            // A continuation line, such as the missing arguments' list.
            last.push_str(": ");
            last.push_str(line);
        } else {
            parts.push(line.to_owned());
        }
    }
    let help = match subcommand {
        Some(sub @ ("attach" | "bench" | "probes" | "stack" | "heap")) => format!("tracer {sub} --help"),
        _ => "tracer --help".to_owned(),
    };
    format!("{}; see `{help}`", parts.join("; "))
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe))
}

fn attach(args: &AttachArgs) -> anyhow::Result<()> {
    let config = AttachConfig::new(&ConfigArgs {
        pid: args.target.pid,
        exe: args.target.exe.as_deref(),
        duration_s: args.duration,
        interval_s: args.interval,
        json: args.json,
        probes: &args.target.probes,
        placement: &args.target.placement,
        budget_percent: args.budget,
        links: &args.links,
        returns: args.returns,
        types: args.types,
        native: args.target.native,
        stacks: args.stacks.as_deref(),
        depth: args.depth,
        sample: args.sample,
        top: args.top,
        folded: args.folded.as_deref(),
        flamegraph: args.flamegraph.as_deref(),
        weight: args.weight.as_deref().unwrap_or(""),
        native_stacks: args.native_stacks,
        force: args.force,
        bpf_log: args.bpf_log,
        debug_dir: args.target.debug_dir.as_deref(),
        inlined: !args.target.no_inlined,
        gc: &args.target.gc,
        live: args.live,
        live_max: args.live_max,
        leaks: args.leaks,
        older_s: args.older,
    })?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let end = runtime.block_on(tracer_user::run::attach(&config, std::io::stdout().lock(), std::io::stderr()))?;
    let what = match &config.target {
        TargetSpec::Pid(pid) => format!("PID {pid}"),
        TargetSpec::Exe(exe) => exe.display().to_string(),
    };
    eprintln!("tracer: detached from {what} ({})", end.as_str());
    Ok(())
}

fn stack(args: &StackArgs) -> anyhow::Result<()> {
    use tracer_user::stacks;
    tracer_user::config::target_spec(Some(args.pid), None)?;
    let max_depth = usize::try_from(args.max_depth).unwrap_or(usize::MAX);
    let read = stacks::read(args.pid, stacks::Options { max_depth, check_tls: args.check_tls })?;
    if args.json {
        println!("{}", serde_json::to_string(&stacks::print::json(&read))?);
    } else {
        print!("{}", stacks::print::table(&read));
    }
    let failed = read.threads.iter().filter(|t| t.frames.is_err()).count();
    if failed > 0 {
        anyhow::bail!("the frames of {failed} of {} threads could not be read (see above)", read.threads.len());
    }
    Ok(())
}

fn heap(args: &HeapArgs) -> anyhow::Result<()> {
    use tracer_user::heap;
    tracer_user::config::target_spec(Some(args.pid), None)?;
    let options = heap::Options { stop: args.stop, debug_dir: args.debug_dir.clone(), ..heap::Options::default() };
    let census = heap::census(args.pid, &options)?;
    if args.json {
        println!("{}", serde_json::to_string(&census)?);
    } else {
        print!("{}", heap::print::table(&census, args.top));
    }
    Ok(())
}

fn bench(args: &BenchArgs) -> anyhow::Result<()> {
    use tracer_user::bench::{self, Bench, Effort, State, report};
    privileges::check()?;
    let probes = tracer_user::config::probe_selection(&args.probes)?;
    let placement = tracer_user::config::parse_placement(&args.placement)?;
    let effort = if args.fast {
        Effort::Fast
    } else if args.rigorous {
        Effort::Rigorous
    } else {
        Effort::Normal
    };
    let python = args.python.clone().unwrap_or_else(bench::default_python);
    let b = Bench::new(&python, &args.stmt, &args.setup, effort.plan(), &args.out)?;
    let specs = b.specs(&probes)?;
    let mut states = vec![
        State::Baseline,
        State::Attached { name: "attached".into(), probes: probes.clone(), program: None, placement, returns: false },
        State::Detached { probes: probes.clone() },
    ];
    let exe = b.target.exe.clone().unwrap_or_else(|| b.target.display_path.clone());
    states.extend(report::extra_states(&args.also, &probes, &specs, (&exe, &b.target.display_path))?);
    eprintln!(
        "tracer bench: {} (Python {}, {}), stmt {:?}, setup {:?}",
        python.display(),
        b.target.version,
        b.target.display_path.display(),
        args.stmt,
        args.setup
    );
    eprintln!("tracer bench: counting probe hits per loop");
    let hits = b.hits_per_loop(&probes, 1000)?;
    let results = b.run(&states, |msg| eprintln!("tracer bench: {msg}"))?;
    let baseline = &results[0];
    let mut rows = Vec::new();
    for (state, stats) in states.iter().zip(&results).skip(1) {
        rows.push(report::Row { name: state.name(), stats, vs_baseline: b.compare(baseline, stats)? });
    }
    if args.json {
        println!("{}", serde_json::to_string(&report::json(&b, baseline, &rows, &hits))?);
    } else {
        for line in report::text(baseline, &rows, &hits, &args.out) {
            println!("{line}");
        }
        for note in &b.notes {
            println!("warning: {}", note.message);
        }
    }
    Ok(())
}

fn probes(args: &ProbesArgs) -> anyhow::Result<()> {
    let t = &args.target;
    let target = tracer_user::config::target_spec(t.pid, t.exe.as_deref())?;
    let selection = tracer_user::config::probe_selection(&t.probes)?;
    let placement = tracer_user::config::parse_placement(&t.placement)?;
    let options = tracer_user::run::PlanRequest {
        placement,
        returns: args.returns,
        debug_dir: t.debug_dir.as_deref(),
        inlined: !t.no_inlined,
        gc: tracer_user::config::parse_gc(&t.gc)?,
        native: t.native,
        live: args.live,
    };
    let plan = tracer_user::run::probe_plan(&target, &selection, &options)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        tracer_user::report::plan::json(&mut out, &plan)?;
    } else {
        tracer_user::report::plan::table(&mut out, &plan)?;
    }
    Ok(())
}
