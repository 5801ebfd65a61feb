//! The `tracer` command line.

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use tracer_user::{
    config::{AttachArgs as ConfigArgs, AttachConfig, DEFAULT_INTERVAL_S, TargetSpec},
    error::exit_status,
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
enum Command {
    /// Attach to a running CPython process and count calls and bytes.
    #[command(
        long_about = "Attach to a running CPython process and count calls and requested bytes of _Py_NewReference, \
_Py_Dealloc and the PyObject_/PyMem_/PyMem_Raw allocator functions.\n\n\
The interpreter is found from /proc/PID/maps (a mapped libpython3.X.so, else the executable) and its \
version is read from the process. Probes count only that process (all its threads). Every --interval \
a table (or with --json, a JSON line) of cumulative counts is printed; a summary follows when the \
run ends by Ctrl-C, SIGTERM, --duration or the target's exit.",
        after_help = "Examples:\n  sudo tracer attach --pid 1234\n  sudo tracer attach --pid $(pgrep -n python3) --duration 10 --json"
    )]
    Attach(AttachArgs),
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["pid", "exe"])))]
struct AttachArgs {
    /// PID of the CPython process to trace (all its threads).
    #[arg(long, short = 'p', value_name = "PID")]
    pid: Option<u32>,
    /// Trace every process that runs this interpreter, those running now and those started later;
    /// reports per PID and in total. Runs until Ctrl-C, SIGTERM or --duration.
    #[arg(long, short = 'e', value_name = "PATH")]
    exe: Option<std::path::PathBuf>,
    /// Which functions to probe: default (all), refs (_`Py_NewReference`, _`Py_Dealloc`), alloc (the
    /// allocator API), or a comma-separated list of function names.
    #[arg(long, value_name = "SET", default_value = "default")]
    probes: String,
    /// Stop after this many seconds (default: until Ctrl-C, SIGTERM or the target exits).
    #[arg(long, short = 'd', value_name = "SECONDS")]
    duration: Option<f64>,
    /// Seconds between reports.
    #[arg(long, short = 'i', value_name = "SECONDS", default_value_t = DEFAULT_INTERVAL_S)]
    interval: f64,
    /// Write JSON Lines (attached, interval, summary) instead of a table; see the README for the schema.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Attach(args) => attach(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line: the cause chain joined with ": ".
            eprintln!("tracer: error: {err:#}");
            ExitCode::from(u8::try_from(exit_status(&err)).unwrap_or(1))
        }
    }
}

fn attach(args: &AttachArgs) -> anyhow::Result<()> {
    let config = AttachConfig::new(&ConfigArgs {
        pid: args.pid,
        exe: args.exe.as_deref(),
        duration_s: args.duration,
        interval_s: args.interval,
        json: args.json,
        probes: &args.probes,
    })?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let end = runtime.block_on(tracer_user::run::attach(&config, std::io::stdout().lock()))?;
    let what = match &config.target {
        TargetSpec::Pid(pid) => format!("PID {pid}"),
        TargetSpec::Exe(exe) => exe.display().to_string(),
    };
    eprintln!("tracer: detached from {what} ({})", end.as_str());
    Ok(())
}
