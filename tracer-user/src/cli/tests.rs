//! The flags as clap parses them, and its errors as one line.

use super::*;
use crate::probe::SelectionError;

#[test]
fn setups_parse_by_name_and_value() {
    let Setups(got) = setups("empty, tracemalloc=25,bpftrace,budget=1,returns,call-sites").unwrap();
    assert_eq!(
        got,
        [
            Extra::Setup(Setup::Empty),
            Extra::Tracemalloc("25".into()),
            Extra::Setup(Setup::Bpftrace),
            Extra::Budget("1".into()),
            Extra::Setup(Setup::Returns),
            Extra::Setup(Setup::CallSites),
        ]
    );
    assert_eq!(setups("").unwrap(), Setups::default());
    for bad in ["perf", "tracemalloc=0", "tracemalloc=x", "budget=0", "budget=x", "entry=1", "perf=1"] {
        assert_eq!(setups(bad).unwrap_err(), ValueError::UnknownSetup { item: bad.into() }, "{bad}");
    }
    assert_eq!(
        setups("entry,perf").unwrap_err().to_string(),
        "--also names \"perf\", which is not a setup tracer bench knows; use entry, call-sites, empty, empty-entry, empty-call-sites, returns, meta-insert, meta-lookup, meta-pool, meta-chunk, bpftrace, tracemalloc=FRAMES (e.g. tracemalloc=1) or budget=PERCENT (e.g. budget=1)"
    );
}

fn usage(args: &[&str]) -> String {
    let err = Cli::try_parse_from(std::iter::once("tracer").chain(args.iter().copied())).unwrap_err();
    usage_error(&err, args.first().copied())
}

#[test]
fn usage_errors_are_one_line() {
    assert_eq!(
        usage(&["attach", "--pid", "1", "--links", "bpf"]),
        "invalid value 'bpf' for '--links <HOW>'; possible values: auto, multi, perf; a similar value exists: 'perf'; see `tracer attach --help`"
    );
    assert_eq!(
        usage(&["probes"]),
        "the following required arguments were not provided: <--pid <PID>|--exe <PATH>|--name <PATTERN>>; see `tracer probes --help`"
    );
    assert_eq!(usage(&["xyzzy"]), "unrecognized subcommand 'xyzzy'; see `tracer --help`");
    assert_eq!(usage(&["__calibration-child", "x"]), "unexpected argument 'x' found; see `tracer --help`");
}

#[test]
fn closed_sets_are_clap_s() {
    let err = AttachArgs::try_parse_from(["attach", "--pid", "1", "--links", "bpf"]).unwrap_err();
    assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
    let args = AttachArgs::try_parse_from(["attach", "--pid", "1", "--stacks"]).unwrap();
    assert_eq!(args.stacks, Some(ProbeSelection::Alloc));
    let args = AttachArgs::try_parse_from(["attach", "--pid", "1", "--stacks", "refs", "--weight", "bytes"]).unwrap();
    assert_eq!((args.stacks, args.files.weight), (Some(ProbeSelection::Refs), Some(Weight::Bytes)));
    assert_eq!(Weight::Bytes.to_string(), "bytes");
    let err = ProbesArgs::try_parse_from(["probes", "--pid", "1", "--probes", "nope"]).unwrap_err();
    assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
    let cause = std::error::Error::source(&err).and_then(|e| e.downcast_ref::<ValueError>());
    assert!(matches!(cause, Some(ValueError::Probes(SelectionError::Unknown { .. }))), "{err}");
}

/// The help `tracer SUBCOMMAND --help` prints for `flag` (its id).
fn help_of(subcommand: &str, flag: &str) -> String {
    let mut cli = <Cli as clap::CommandFactory>::command();
    cli.build();
    let sub = cli.find_subcommand(subcommand).unwrap();
    let arg = sub.get_arguments().find(|a| a.get_id() == flag).unwrap();
    arg.get_long_help().or_else(|| arg.get_help()).unwrap().to_string()
}

#[test]
fn each_subcommand_s_help_is_true_of_it() {
    // probes traces nothing and has no --duration.
    assert_eq!(
        help_of("probes", "exe"),
        "Show the plan for this interpreter (its executable or libpython), as `attach --exe` would probe it in every process that runs it"
    );
    let mut cli = <Cli as clap::CommandFactory>::command();
    let probes = cli.find_subcommand_mut("probes").unwrap().render_long_help().to_string();
    for untrue in ["--duration", "Ctrl-C", "Trace ", "Counts calls", "are in the table"] {
        assert!(!probes.contains(untrue), "probes --help says {untrue:?}:\n{probes}");
    }
    assert!(help_of("attach", "exe").ends_with("Runs until Ctrl-C, SIGTERM or --duration"));
    // top ends at q too; run's signals go to the program, which ends it.
    assert!(help_of("top", "exe").ends_with("Runs until q, Ctrl-C, SIGTERM or --duration"));
    assert!(help_of("top", "duration").contains("until q, Ctrl-C, SIGTERM or the target exits"));
    assert!(help_of("run", "duration").contains("the program runs on"), "{}", help_of("run", "duration"));
}

#[test]
fn help_states_the_defaults_applied_later() {
    use crate::bench::Effort;
    // These flags have no clap default (None means "not given", which
    // other rules read), so their help must name the default the config
    // applies, and name it right.
    let live_max = format!("default {}", crate::config::DEFAULT_LIVE_MAX);
    let depth = format!("default {}", tracer_common::stack::DEFAULT_DEPTH);
    for (flag, default) in [
        ("live_max", live_max.as_str()),
        ("depth", depth.as_str()),
        ("sample", "default 1"),
        ("weight", "default calls"),
    ] {
        for sub in ["attach", "run", "top"] {
            let help = help_of(sub, flag);
            assert!(help.contains(default), "{sub} --{flag}'s help does not say {default:?}: {help}");
        }
    }
    // bench's efforts, as its plans run them.
    let (fast, normal, rigorous) = (Effort::Fast.plan(), Effort::Normal.plan(), Effort::Rigorous.plan());
    let said = format!(
        "{} rounds of {} values, against {} of {} by default",
        fast.rounds, fast.values, normal.rounds, normal.values
    );
    assert!(help_of("bench", "fast").contains(&said), "{}", help_of("bench", "fast"));
    let said =
        format!("{} rounds, each of {} processes of {} values", rigorous.rounds, rigorous.processes, rigorous.values);
    assert!(help_of("bench", "rigorous").contains(&said), "{}", help_of("bench", "rigorous"));
}

/// The one line `main` prints for `args`: tracer's own parser's refusal as
/// it is, else clap's error folded by [`usage_error`].
fn refused(args: &[&str]) -> String {
    let err = Cli::try_parse_from(std::iter::once("tracer").chain(args.iter().copied())).unwrap_err();
    match std::error::Error::source(&err).and_then(|s| s.downcast_ref::<ValueError>()) {
        Some(refused) => refused.to_string(),
        None => usage_error(&err, args.first().copied()),
    }
}

#[test]
fn negative_numbers_reach_the_flag_s_check() {
    // Parsed as values, not as unknown flags: the configuration's checks
    // (config/tests.rs) then refuse them with their own messages.
    for flag in ["--duration", "--interval", "--budget"] {
        let args = AttachArgs::try_parse_from(["attach", "--pid", "1", flag, "-1"]).unwrap();
        let value = match flag {
            "--duration" => args.duration,
            "--interval" => Some(args.interval),
            _ => args.budget,
        };
        assert_eq!(value, Some(-1.0), "{flag}");
    }
    for sub in ["attach", "probes", "top", "stack", "heap"] {
        assert_eq!(
            refused(&[sub, "--pid", "-5"]),
            "--pid -5 is not a process ID (a whole number above 0); pass the PID of a running CPython process (e.g. from `pgrep python`)",
            "{sub}"
        );
    }
    assert_eq!(
        refused(&["attach", "-p", "1.5"]),
        "--pid 1.5 is not a process ID (a whole number above 0); pass the PID of a running CPython process (e.g. from `pgrep python`)"
    );
    assert_eq!(
        refused(&["attach", "--pid", "1", "--top", "-1"]),
        "--top must be a whole number above 0 (got -1); e.g. --top 10"
    );
    assert_eq!(
        refused(&["attach", "--pid", "1", "--depth", "-1"]),
        "invalid value '-1' for '--depth <FRAMES>': -1 is not in 0..=4294967295; see `tracer attach --help`"
    );
    assert_eq!(
        refused(&["stack", "--pid", "1", "--max-depth", "-1"]),
        "invalid value '-1' for '--max-depth <FRAMES>': -1 is not in 1..=1000000; see `tracer stack --help`"
    );
}

#[test]
fn counts_of_zero_are_refused_alike() {
    for (args, error) in [
        (
            &["attach", "--pid", "1", "--top", "0"][..],
            "--top 0 would list no site; pass the number of sites to list, e.g. --top 10",
        ),
        (
            &["heap", "--pid", "1", "--top", "0"],
            "--top 0 would list no type; pass the number of types to list, e.g. --top 25",
        ),
        (
            &["report", "r.jsonl", "--diff", "1", "2", "--top", "0"],
            "--top 0 would list no type; pass the number of types to list, e.g. --top 25",
        ),
        (
            &["attach", "--pid", "1", "--leaks", "0"],
            "--leaks 0 would list no block; pass the number of blocks to list, e.g. --leaks 20",
        ),
        (
            &["attach", "--pid", "1", "--leaks", "-3"],
            "--leaks must be a whole number above 0 (got -3); e.g. --leaks 20",
        ),
        (&["heap", "--pid", "1", "--top", "x"], "--top must be a whole number above 0 (got x); e.g. --top 25"),
        (
            &["bench", "--stmt", ""],
            "--stmt is empty, and pyperf times no empty statement; pass the statement to time, e.g. --stmt '[]'",
        ),
        (
            &["bench", "--stmt", " \n "],
            "--stmt is empty, and pyperf times no empty statement; pass the statement to time, e.g. --stmt '[]'",
        ),
    ] {
        assert_eq!(refused(args), error, "{args:?}");
    }
    let Command::Attach(args) = Cli::try_parse_from(["tracer", "attach", "--pid", "1", "--leaks"]).unwrap().command
    else {
        panic!("attach");
    };
    assert_eq!(args.leaks, Some(20));
}
