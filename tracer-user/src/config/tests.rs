//! The flags checked against each other: `AttachConfig::try_from`.

use clap::{Parser as _, error::ErrorKind};

use super::*;

/// `tracer attach` with `flags`, as clap parses them.
fn parse(flags: &[&str]) -> Result<AttachArgs, clap::Error> {
    AttachArgs::try_parse_from(std::iter::once("attach").chain(flags.iter().copied()))
}

fn args(pid: u32, duration: Option<f64>, interval: f64, json: bool) -> AttachArgs {
    let mut a = parse(&["--pid", &pid.to_string()]).unwrap();
    (a.duration, a.interval, a.json) = (duration, interval, json);
    a
}

fn config(flags: &[&str]) -> Result<AttachConfig, ConfigError> {
    AttachConfig::try_from(&parse(flags).unwrap())
}

#[test]
fn defaults_to_table_and_no_duration() {
    let c = AttachConfig::try_from(&args(42, None, DEFAULT_INTERVAL_S, false)).unwrap();
    assert_eq!(c.target, TargetSpec::Pid(42));
    assert_eq!(c.probes, ProbeSelection::Default);
    assert_eq!(c.duration, None);
    assert_eq!(c.interval, Duration::from_secs(1));
    assert_eq!(c.format, Format::Table);
    assert_eq!(config(&["--pid", "42"]).unwrap(), c);
}

#[test]
fn accepts_fractional_seconds_and_json() {
    let c = AttachConfig::try_from(&args(7, Some(2.5), 0.25, true)).unwrap();
    assert_eq!(c.duration, Some(Duration::from_millis(2500)));
    assert_eq!(c.interval, Duration::from_millis(250));
    assert_eq!(c.format, Format::Json);
    assert_eq!(config(&["--pid", "7", "-d", "2.5", "--interval", "0.25", "--json"]).unwrap(), c);
}

#[test]
fn rejects_zero_negative_and_nan_interval() {
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e-12, 1e19, 315_360_001.0] {
        let err = AttachConfig::try_from(&args(1, None, bad, false)).unwrap_err();
        assert!(matches!(err, ConfigError::BadInterval { .. }), "{bad}: {err}");
    }
    assert_eq!(
        config(&["--pid", "1", "--interval", "0"]).unwrap_err().to_string(),
        "--interval must be a number of seconds greater than 0 and at most 315360000 (got 0); try --interval 1"
    );
    assert!(AttachConfig::try_from(&args(1, None, 315_360_000.0, false)).is_ok());
}

#[test]
fn rejects_bad_duration_and_pid_zero() {
    assert_eq!(
        AttachConfig::try_from(&args(1, Some(0.0), 1.0, false)).unwrap_err(),
        ConfigError::BadDuration { value: 0.0 }
    );
    assert_eq!(config(&["--pid", "1", "--duration", "1e19"]).unwrap_err(), ConfigError::BadDuration { value: 1e19 });
    assert_eq!(config(&["--pid", "0"]).unwrap_err(), ConfigError::PidZero);
    let failure = crate::error::Failure::from(ConfigError::PidZero);
    assert_eq!(failure.exit_status(), crate::error::EXIT_BAD_INPUT);
}

#[test]
fn exactly_one_target_and_valid_probes() {
    let exe = std::path::Path::new("/usr/bin/python3.11");
    // clap refuses both at once; a struct made by hand is checked too.
    assert_eq!(parse(&["--pid", "1", "--exe", "/usr/bin/python3.11"]).unwrap_err().kind(), ErrorKind::ArgumentConflict);
    let mut both = args(1, None, 1.0, false);
    both.target.exe = Some(exe.to_owned());
    assert_eq!(AttachConfig::try_from(&both).unwrap_err(), ConfigError::NoTarget);
    assert_eq!(config(&["--exe", "/usr/bin/python3.11"]).unwrap().target, TargetSpec::Exe(exe.to_owned()));
    let bad = parse(&["--pid", "1", "--probes", "nope"]).unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::ValueValidation);
    assert!(bad.to_string().contains("--probes names nope, which tracer does not probe;"), "{bad}");
    assert_eq!(config(&["--pid", "1", "--placement", "entry"]).unwrap().placement, PlacementMode::Entry);
    let bad = parse(&["--pid", "1", "--placement", "middle"]).unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::InvalidValue);
    assert!(bad.to_string().contains("invalid value 'middle' for '--placement <WHERE>'"), "{bad}");
    let sites = ["--pid", "1", "--placement", "call-sites"];
    assert_eq!(config(&sites).unwrap().placement, PlacementMode::CallSites);
    assert_eq!(config(&[&sites[..], &["--budget", "1"]].concat()).unwrap_err(), ConfigError::BudgetWithCallSites);
    assert_eq!(config(&["--pid", "1", "--budget", "1", "--returns"]).unwrap_err(), ConfigError::BudgetWithReturns);
    assert_eq!(
        config(&[&sites[..], &["--links", "perf"]].concat()).unwrap_err().to_string(),
        "--placement call-sites attaches thousands of uprobes, which only uprobe-multi links can detach quickly; drop --links perf"
    );
}

#[test]
fn auto_placement_takes_call_sites_only_where_every_event_is_counted_through_multi_links() {
    let placed = |flags: &[&str]| config(&[&["--pid", "1"][..], flags].concat()).unwrap().placement;
    let multi = if crate::kernel::multi::available() { PlacementMode::CallSites } else { PlacementMode::Inside };
    assert_eq!(placed(&["--exact"]), multi);
    assert_eq!(placed(&["--exact", "--links", "multi"]), multi);
    assert_eq!(placed(&["--types"]), multi);
    for flags in [&[][..], &["--exact", "--budget", "1"], &["--exact", "--links", "perf"], &["--placement", "inside"]] {
        assert_eq!(placed(flags), PlacementMode::Inside, "{flags:?}");
    }
    let exe = |flags: &[&str]| config(&[&["--exe", "/usr/bin/python3.11"][..], flags].concat()).unwrap().placement;
    assert_eq!(exe(&["--exact"]), PlacementMode::Inside);
    assert_eq!(exe(&["--exact", "--placement", "call-sites"]), PlacementMode::CallSites);
    assert_eq!(placed(&["--exact", "--placement", "inside"]), PlacementMode::Inside);
    assert_eq!(placed(&["--exact", "--placement", "entry"]), PlacementMode::Entry);
}

#[test]
fn link_modes() {
    assert_eq!(config(&["--pid", "1"]).unwrap().links, LinkMode::Auto);
    for (value, mode) in [("multi", LinkMode::Multi), ("perf", LinkMode::Perf), ("auto", LinkMode::Auto)] {
        assert_eq!(config(&["--pid", "1", "--links", value]).unwrap().links, mode);
    }
    let bad = parse(&["--pid", "1", "--links", "bpf"]).unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::InvalidValue);
    assert!(bad.to_string().contains("invalid value 'bpf' for '--links <HOW>'"), "{bad}");
}

#[test]
fn gc_modes() {
    assert_eq!(config(&["--pid", "1"]).unwrap().gc, GcMode::Auto);
    for (value, mode) in
        [("markers", GcMode::Markers), ("function", GcMode::Function), ("off", GcMode::Off), ("auto", GcMode::Auto)]
    {
        assert_eq!(config(&["--pid", "1", "--gc", value]).unwrap().gc, mode);
    }
    let bad = parse(&["--pid", "1", "--gc", "on"]).unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::InvalidValue);
    assert!(bad.to_string().contains("invalid value 'on' for '--gc <HOW>'"), "{bad}");
}

#[test]
fn modes() {
    let c = config(&["--pid", "1"]).unwrap();
    assert_eq!((c.mode, c.budget), (Mode::Profile, Some(0.01)));
    assert_eq!(config(&["--pid", "1", "--budget", "0.5"]).unwrap().budget, Some(0.005));
    let c = config(&["--pid", "1", "--exact"]).unwrap();
    assert_eq!((c.mode, c.budget), (Mode::Exact { because: None }, None));
    assert_eq!(config(&["--pid", "1", "--exact", "--budget", "2"]).unwrap().budget, Some(0.02));
    // Each exact-only flag alone switches to exact tracing, named.
    for (flags, flag) in [
        (&["--types"][..], "--types"),
        (&["--live"], "--live"),
        (&["--live-max", "10"], "--live-max"),
        (&["--leaks"], "--leaks"),
        (&["--older", "1"], "--older"),
        (&["--returns"], "--returns"),
        (&["--stacks"], "--stacks"),
        (&["--top", "3"], "--top"),
        (&["--native-stacks"], "--native-stacks"),
        (&["--native"], "--native"),
        (&["--placement", "call-sites"], "--placement call-sites"),
    ] {
        let c = config(&[&["--pid", "1"][..], flags].concat()).unwrap();
        assert_eq!((c.mode, c.budget), (Mode::Exact { because: Some(flag) }, None), "{flags:?}");
        let c = config(&[&["--pid", "1", "--exact"][..], flags].concat()).unwrap();
        assert_eq!(c.mode, Mode::Exact { because: Some(flag) }, "{flags:?}");
    }
    // A stack flag without stacks is still refused as before.
    assert_eq!(config(&["--pid", "1", "--depth", "3"]).unwrap_err(), ConfigError::WithoutStacks { flag: "--depth" });
    // Flags both modes serve leave the profile on.
    for flags in [&["--placement", "entry"][..], &["--probes", "alloc"], &["--gc", "off"], &["--no-inlined"]] {
        assert_eq!(config(&[&["--pid", "1"][..], flags].concat()).unwrap().mode, Mode::Profile, "{flags:?}");
    }
    assert_eq!(config(&["--exe", "/usr/bin/python3.11"]).unwrap().mode, Mode::Profile);
    assert_eq!(
        config(&["--pid", "1", "--exact", "--budget", "0"]).unwrap_err().to_string(),
        "--budget must be a percentage of the target's CPU time from 0.01 to 100 (got 0); e.g. --budget 1"
    );
    assert_eq!((Mode::Profile.name(), Mode::Exact { because: None }.name()), ("profile", "exact"));
}

#[test]
fn budget_is_a_percentage() {
    assert_eq!(config(&["--pid", "1", "--exact"]).unwrap().budget, None);
    assert_eq!(config(&["--pid", "1", "--budget", "1"]).unwrap().budget, Some(0.01));
    assert_eq!(config(&["--pid", "1", "--budget", "100"]).unwrap().budget, Some(1.0));
    assert_eq!(config(&["--pid", "1", "--budget", "0.01"]).unwrap().budget, Some(0.0001));
    for bad in [0.0, 0.000_000_1, 0.009, -1.0, 100.5, f64::NAN, f64::INFINITY] {
        let mut a = args(1, None, 1.0, false);
        a.budget = Some(bad);
        assert!(matches!(AttachConfig::try_from(&a).unwrap_err(), ConfigError::BadBudget { .. }), "{bad}");
    }
    assert_eq!(
        config(&["--pid", "1", "--budget=0"]).unwrap_err().to_string(),
        "--budget must be a percentage of the target's CPU time from 0.01 to 100 (got 0); e.g. --budget 1"
    );
}

#[test]
fn stacks_and_their_flags() {
    let c = config(&["--pid", "1", "--stacks"]).unwrap();
    assert_eq!(c.stacks.map(|s| (s.events, s.weight)), Some((ProbeSelection::Alloc, Weight::Calls)));
    let c = config(&["--pid", "1", "--top", "3", "--weight", "bytes"]).unwrap();
    assert_eq!(c.stacks.map(|s| (s.events, s.top, s.weight)), Some((ProbeSelection::Alloc, 3, Weight::Bytes)));
    assert_eq!(
        config(&["--pid", "1", "--weight", "bytes"]).unwrap_err(),
        ConfigError::WithoutStacks { flag: "--weight" }
    );
    assert_eq!(parse(&["--pid", "1", "--stacks", "--weight", "pages"]).unwrap_err().kind(), ErrorKind::InvalidValue);
    assert_eq!(
        config(&["--pid", "1", "--types", "--probes", "alloc"]).unwrap_err().to_string(),
        "--types counts the objects _Py_NewReference creates, which --probes alloc leaves out; use --probes default or refs, or add _Py_NewReference to the list"
    );
}
