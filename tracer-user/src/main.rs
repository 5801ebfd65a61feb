//! The `tracer` command line: the flags are [`tracer_user::cli`]'s, the
//! work the library's.

use std::process::ExitCode;

use std::io::Write as _;

use clap::Parser as _;
use tracer_user::{
    capabilities,
    cli::{
        AttachArgs, BenchArgs, Cli, Command, HeapArgs, ProbesArgs, ReportArgs, RunArgs, StackArgs, TopArgs, ValueError,
        usage_error,
    },
    config::{AttachConfig, ConfigError, TargetSpec},
    error::{EXIT_BAD_INPUT, EXIT_OUTPUT_CLOSED, Failure},
    launch::signals::Signals,
    model::{End, Level},
    prepare, privileges,
    run::RunError,
};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help, --version, and bare `tracer` (which prints the help).
        Err(e) if !e.use_stderr() || e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            e.exit()
        }
        Err(e) => {
            // A value tracer's own parser refused says all there is to say.
            match std::error::Error::source(&e).and_then(|s| s.downcast_ref::<ValueError>()) {
                Some(refused) => eprintln!("tracer: error: {refused}"),
                None => eprintln!("tracer: error: {}", usage_error(&e, std::env::args().nth(1).as_deref())),
            }
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    // First, while this is the only thread (parsing starts none): every
    // thread and child made later inherits the narrowed sets, and a thread
    // cannot narrow another's. `tracer run`'s bounding set is left alone:
    // the program it starts runs as it would without tracer.
    let chroot = match &cli.command {
        Command::Bench(b) if b.root.is_some() => capabilities::set_of(&[capabilities::SYS_CHROOT]),
        _ => 0,
    };
    if let Err(e) = capabilities::narrow_at_start(!matches!(cli.command, Command::Run(_)), chroot) {
        eprintln!("tracer: error: {e}");
        return ExitCode::from(Failure::from(e).exit_status());
    }
    let result = match cli.command {
        Command::Attach(args) => attach(&args),
        Command::Run(args) => run(&args),
        Command::Top(args) => top(&args).map(|()| ExitCode::SUCCESS),
        Command::Bench(args) => bench(&args).map(|()| ExitCode::SUCCESS),
        Command::Probes(args) => probes(&args).map(|()| ExitCode::SUCCESS),
        Command::Stack(args) => stack(&args).map(|()| ExitCode::SUCCESS),
        Command::Heap(args) => heap(&args).map(|()| ExitCode::SUCCESS),
        Command::Report(args) => report(&args).map(|()| ExitCode::SUCCESS),
        Command::CalibrationChild => prepare::calibrate::child_main().map(|()| ExitCode::SUCCESS).map_err(Into::into),
    };
    match result {
        Ok(code) => code,
        // The reader went away (`tracer report ... | head`): the output was
        // cut short. Said on stderr, which may have gone too.
        Err(failure) if failure.is_broken_pipe() => {
            let _ = writeln!(std::io::stderr(), "tracer: output closed (broken pipe); the output was cut short");
            ExitCode::from(failure.exit_status())
        }
        Err(failure) => {
            // One line: the cause chain joined with ": " (no panic where
            // stderr is a closed pipe).
            // The message may hold the target's text (a path from its
            // maps): escaped, so that it stays one line on a terminal.
            let _ = writeln!(std::io::stderr(), "tracer: error: {}", tracer_user::text::line(&failure.to_string()));
            ExitCode::from(failure.exit_status())
        }
    }
}

/// How a run that ended is told on stderr, and its exit status: a closed
/// output (`| head`) detached early, [`EXIT_OUTPUT_CLOSED`].
fn ended(end: End, what: &str) -> ExitCode {
    if end == End::OutputClosed {
        // stderr may be the pipe that closed.
        let _ = writeln!(std::io::stderr(), "tracer: output closed (broken pipe); detached from {what}");
        return ExitCode::from(EXIT_OUTPUT_CLOSED);
    }
    // stderr may be a pipe that closed too (`tracer run`'s report): no
    // panic for it.
    let _ = writeln!(std::io::stderr(), "tracer: detached from {what} ({})", end.as_str());
    ExitCode::SUCCESS
}

fn attach(args: &AttachArgs) -> Result<ExitCode, Failure> {
    if args.all {
        return attach_all(args);
    }
    let config = AttachConfig::try_from(args)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let _entered = runtime.enter();
    let mut signals = handlers(false)?;
    let out = std::io::stdout().lock();
    let end = runtime.block_on(tracer_user::run::attach(&config, None, &mut signals, out, std::io::stderr()))?;
    Ok(ended(end, &config.target.to_string()))
}

/// `tracer attach --all`: one `attach --exe` per interpreter on the host,
/// summed.
fn attach_all(args: &AttachArgs) -> Result<ExitCode, Failure> {
    let config = tracer_user::fleet::AllConfig::try_from(args)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let _entered = runtime.enter();
    let mut signals = handlers(false)?;
    let out = std::io::stdout().lock();
    let end = runtime.block_on(tracer_user::fleet::attach_all(&config, &mut signals, out, std::io::stderr()))?;
    Ok(ended(end, "every interpreter"))
}

/// `tracer top`: attach, drawn full-screen until q, Ctrl-C or the end.
fn top(args: &TopArgs) -> Result<(), Failure> {
    use std::io::IsTerminal as _;
    if args.attach.all {
        let config = tracer_user::fleet::AllConfig::for_top(&args.attach, std::io::stdout().is_terminal())?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let _entered = runtime.enter();
        let mut signals = handlers(false)?;
        let all = tracer_user::fleet::attach_all(&config, &mut signals, std::io::sink(), std::io::stderr());
        let end = runtime.block_on(all)?;
        eprintln!("tracer: detached from every interpreter ({})", end.as_str());
        return Ok(());
    }
    let config = AttachConfig::for_top(&args.attach, std::io::stdout().is_terminal())?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let _entered = runtime.enter();
    let mut signals = handlers(false)?;
    // The screen's thread writes to the terminal itself: stdout is not
    // locked here.
    let end =
        runtime.block_on(tracer_user::run::attach(&config, None, &mut signals, std::io::sink(), std::io::stderr()))?;
    eprintln!("tracer: detached from {} ({})", config.target, end.as_str());
    Ok(())
}

/// The run's signal handlers, before anything starts.
fn handlers(pass_on: bool) -> Result<Signals, RunError> {
    Signals::new(pass_on).map_err(|source| RunError::Signal { signal: "SIGINT and SIGTERM", source })
}

/// `tracer run`: starts the program held, attaches, lets it go, reports
/// on stderr or `--output` until it exits, and exits with its status.
fn run(args: &RunArgs) -> Result<ExitCode, Failure> {
    use tracer_user::{launch::Child, report::files::OutputFile};
    let mut config = AttachConfig::for_command(&args.attach)?;
    privileges::check()?;
    // Checked and made before the program starts: a bad path starts
    // nothing.
    let check = |p| OutputFile::check("--output", p, args.attach.files.force).map_err(ConfigError::from);
    let file = args.output.as_deref().map(check).transpose()?;
    if let (Some(f), Some(r)) = (&file, &config.record)
        && f.path == r.path
    {
        return Err(ConfigError::SameOutput { path: f.path.clone() }.into());
    }
    // The port is tried before the program starts (and bound again, for
    // good, before the attach): a port in use starts nothing.
    if let Some(addr) = config.listen {
        drop(tracer_user::report::exporter::bind(addr)?);
    }
    let out: Box<dyn std::io::Write> = match &file {
        Some(f) => Box::new(std::io::LineWriter::new(f.create().map_err(ConfigError::from)?)),
        None => Box::new(std::io::stderr()),
    };
    // A report file of a program that never ran is not left behind.
    let remove = || {
        if let Some(f) = &file {
            let _ = std::fs::remove_file(&f.path);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let _entered = runtime.enter();
    let mut signals = handlers(true)?;
    // SAFETY: restores SIGCHLD's default disposition, a plain call: were it
    // inherited as ignored, the kernel would reap the child itself.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) };
    let mut child = Child::start(&args.command).inspect_err(|_| remove())?;
    config.target = TargetSpec::Pid(child.pid());
    let attached = Box::pin(tracer_user::run::attach(&config, Some(&mut child), &mut signals, out, std::io::stderr()));
    let ended = runtime.block_on(attached);
    let (end, failure) = match ended {
        Ok(end) => (Some(end), None),
        // Dropping the child, never let go, kills it.
        Err(e) if !child.released() => {
            remove();
            return Err(e.into());
        }
        // Detached: the program runs on, and is waited for.
        Err(e) => (None, Some(Failure::from(e))),
    };
    // stderr is the report's by default, and its reader may have gone:
    // no panic for it, the program's status is still tracer's.
    if let Some(f) = &failure {
        let _ = writeln!(std::io::stderr(), "tracer: error: {f}");
    }
    runtime.block_on(tracer_user::run::wait_exit(&child, &mut signals))?;
    let status = child.reap()?;
    let ended = end.map(|e| format!("; the run ended: {}", e.as_str())).unwrap_or_default();
    let _ =
        writeln!(std::io::stderr(), "tracer: PID {} ({}) {status}{ended}", child.pid(), child.interpreter.display());
    Ok(ExitCode::from(failure.map_or_else(|| status.code(), |f| f.exit_status())))
}

/// `tracer report`: a record turned into the table, JSON, files or a diff.
fn report(args: &ReportArgs) -> Result<(), Failure> {
    use tracer_user::report::{files::OutputFile, replay::Record, written};
    let asked = &args.files;
    let file = |flag, path: &Option<std::path::PathBuf>| {
        path.as_deref().map(|p| OutputFile::check(flag, p, asked.force).map_err(ConfigError::from)).transpose()
    };
    let (folded, flamegraph) = (file("--folded", &asked.folded)?, file("--flamegraph", &asked.flamegraph)?);
    let (growth_folded, growth_flamegraph) =
        (file("--growth-folded", &asked.growth_folded)?, file("--growth-flamegraph", &asked.growth_flamegraph)?);
    let pprof = file("--pprof", &asked.pprof)?;
    let record = Record::read(args.file.clone())?;
    let mut out = std::io::stdout().lock();
    if let Some([from, to]) = args.diff.as_deref() {
        let diff = record.diff(*from, *to)?;
        if args.json {
            serde_json::to_writer(&mut out, &diff)?;
            writeln!(out)?;
        } else {
            diff.table(&mut out, args.top)?;
        }
        return Ok(());
    }
    let files = [&folded, &flamegraph, &growth_folded, &growth_flamegraph, &pprof];
    if files.iter().all(|f| f.is_none()) {
        record.replay(args.json, out, std::io::stderr())?;
        // A cut record's table ends at an interval, with no summary and no
        // end: said, so that its last interval is not taken for the run's
        // figures. (With --json the record is the events, as they are.)
        if !args.json && record.summary().is_err() {
            let last = record.events.iter().rev().find_map(|e| match e {
                tracer_user::model::Event::Interval(s) => Some(s.elapsed_s),
                _ => None,
            });
            let ends = last.map_or_else(
                || "it holds no interval".to_owned(),
                |s| format!("the table ends at its last interval, {s:.1} s after the attach"),
            );
            eprintln!(
                "tracer: warning: {} has no summary (its run did not end normally, tracer killed or failed, or is still running): {ends}",
                args.file.display()
            );
        }
        return Ok(());
    }
    let first = |files: [&Option<OutputFile>; 2]| files.into_iter().flatten().map(|f| f.flag).next();
    let last =
        &record.summary_for(first([&folded, &flamegraph]), first([&growth_folded, &growth_flamegraph]))?.snapshot;
    let what = record.target();
    let mut notes = written::stacks(
        written::StackFiles { folded: folded.as_ref(), flamegraph: flamegraph.as_ref() },
        (asked.weight(), last.stack_coverage.as_ref().map_or(1, |c| c.sample)),
        &what,
        last,
    )?;
    let growth = written::StackFiles { folded: growth_folded.as_ref(), flamegraph: growth_flamegraph.as_ref() };
    notes.extend(written::growth(growth, &what, last)?);
    // Dated by the record's attach, not by now.
    let started = record.attached().and_then(|a| a.started_unix_s);
    notes.extend(pprof.as_ref().map(|f| written::pprof(f, last, started)).transpose()?);
    for note in notes {
        let level = if note.level == Level::Warning { "warning" } else { "note" };
        eprintln!("tracer: {level}: {}", tracer_user::text::line(&note.message));
    }
    Ok(())
}

fn stack(args: &StackArgs) -> Result<(), Failure> {
    use tracer_user::stacks::{self, StackError};
    tracer_user::config::target_spec(Some(args.pid), None)?;
    let max_depth = usize::try_from(args.max_depth).unwrap_or(usize::MAX);
    let read = stacks::read(args.pid, stacks::Options { max_depth, check_tls: args.check_tls })?;
    if args.json {
        writeln!(std::io::stdout().lock(), "{}", serde_json::to_string(&stacks::print::json(&read))?)?;
    } else {
        write!(std::io::stdout().lock(), "{}", stacks::print::table(&read))?;
    }
    let failed = read.threads.iter().filter(|t| t.frames.is_err()).count();
    if failed > 0 {
        return Err(StackError::Unread { failed, threads: read.threads.len() }.into());
    }
    Ok(())
}

fn heap(args: &HeapArgs) -> Result<(), Failure> {
    use tracer_user::heap;
    tracer_user::config::target_spec(Some(args.pid), None)?;
    let options = heap::Options { stop: args.stop, debug_dir: args.debug_dir.clone(), ..heap::Options::default() };
    let census = heap::census(args.pid, &options)?;
    if args.json {
        writeln!(std::io::stdout().lock(), "{}", serde_json::to_string(&census)?)?;
    } else {
        write!(std::io::stdout().lock(), "{}", heap::print::table(&census, args.top))?;
    }
    Ok(())
}

fn bench(args: &BenchArgs) -> Result<(), Failure> {
    use tracer_user::bench::{self, Bench, Effort, State, report};
    privileges::check()?;
    let effort = if args.fast {
        Effort::Fast
    } else if args.rigorous {
        Effort::Rigorous
    } else {
        Effort::Normal
    };
    let python = args.python.clone().unwrap_or_else(bench::default_python);
    let b =
        Bench::new((&python, args.root.as_deref()), &args.stmt, &args.setup, &args.probes, effort.plan(), &args.out)?;
    let target = b.target();
    let mut states = vec![
        State::Baseline,
        State::Attached { name: "attached".into(), program: None, placement: args.placement, returns: false },
        State::Detached,
    ];
    let exe = target.exe.clone().unwrap_or_else(|| target.display_path.clone());
    states.extend(report::extra_states(&args.also, &b.prepared.specs, (&exe, &target.display_path))?);
    eprintln!(
        "tracer bench: {} (Python {}, {}), stmt {:?}, setup {:?}",
        python.display(),
        target.version,
        target.display_path.display(),
        args.stmt,
        args.setup
    );
    eprintln!("tracer bench: counting probe hits per loop");
    let hits = b.hits_per_loop(1000)?;
    let results = b.run(&states, |msg| eprintln!("tracer bench: {msg}"))?;
    let baseline = &results[0];
    let mut rows = Vec::new();
    for (state, stats) in states.iter().zip(&results).skip(1) {
        rows.push(report::Row { name: state.name(), stats, vs_baseline: b.compare(baseline, stats)? });
    }
    if args.json {
        writeln!(std::io::stdout().lock(), "{}", serde_json::to_string(&report::json(&b, baseline, &rows, &hits))?)?;
    } else {
        for line in report::text(baseline, &rows, &hits, &args.out) {
            writeln!(std::io::stdout().lock(), "{line}")?;
        }
        for note in &b.prepared.notes {
            writeln!(std::io::stdout().lock(), "warning: {}", tracer_user::text::line(&note.message))?;
        }
    }
    Ok(())
}

fn probes(args: &ProbesArgs) -> Result<(), Failure> {
    let (target, target_notes) = tracer_user::config::target_of(&args.target)?;
    let mut prepared = prepare::prepare(&target, &prepare::Options::probes(args))?;
    prepared.notes.splice(0..0, target_notes);
    // What a hit costs, to price each probe's: measured once a boot (kept
    // in /run/tracer), which takes the privileges an attach does; without
    // them the plan is shown unpriced.
    let hit = match &prepared.calibration {
        Some(c) => Ok(c.cpu.hit),
        None if privileges::check().is_ok() => {
            prepare::kept::calibration(false).map(|c| c.cpu.hit).map_err(|e| format!("measuring it failed: {e}"))
        }
        None => Err("measuring it takes root, as attaching does".to_owned()),
    };
    let mut report = prepared.into_report();
    match hit {
        Ok(hit) => report.price(hit),
        Err(why) => report.unpriced = Some(why),
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        tracer_user::report::plan::json(&mut out, &report)?;
    } else {
        tracer_user::report::plan::table(&mut out, &report)?;
    }
    Ok(())
}
