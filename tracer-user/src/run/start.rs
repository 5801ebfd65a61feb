//! Everything before the run loop, in the order it must happen: the
//! target prepared, the programs loaded, the probes attached, the header
//! reported.

use std::time::Instant;

use super::{
    Output, Run, RunError,
    cost::{self, Advice, Calibration, CostMeter},
    duty::DutyCycle,
    exit::ProcessExit,
    exits, growth, header,
    late::{LateModules, Watch},
    links::{self, attach_links},
    live, pace,
    profile::{self, Profile},
    readout::Readout,
    stacks,
};
use crate::{
    config::{AttachConfig, ConfigError, LinkMode, Mode},
    discover::{Resolved, TargetSpec, process::TargetError},
    kernel::{LoadOptions, Session},
    launch::Child,
    model::{Event, Links},
    plan::{
        self,
        gc::{GcMode, GcSource},
    },
    prepare::slots::Watch as FreesWatch,
    prepare::{self, Prepared},
    report::Reporter,
};

/// Room for (process, type) pairs with `--types`: a large program has a few
/// thousand types; one past the room is counted (`types_full`).
const TYPE_ENTRIES: u32 = 1 << 15;

/// Room for objects `--types` saw created and not yet destroyed (not
/// preallocated: a few dozen bytes of kernel memory per object held); one
/// past the room is counted (`objects_full`), and its type's live count is
/// then too high.
const OBJECT_ENTRIES: u32 = 1 << 20;

/// Room for distinct stacks, and for (process, probe, stack) counts: a
/// stack is 2 KB in the kernel, allocated as it is first seen.
pub(super) const STACK_ENTRIES: u32 = 1 << 14;

/// The `--types` options, the `--stacks` options, and the probe slots
/// whose events get stacks.
type KernelOptions = (Option<crate::kernel::TypesOptions>, Option<crate::kernel::StacksOptions>, Option<Vec<u32>>);

/// What the kernel side is sized and told for `--types` and `--stacks`,
/// and which probes' events get stacks.
fn kernel_options(config: &AttachConfig, r: &Resolved, plan: &plan::Plan) -> Result<KernelOptions, ConfigError> {
    let types = config.types.then(|| crate::kernel::TypesOptions {
        entries: TYPE_ENTRIES,
        ob_type_offset: r.abi.objects().ob_type,
        objects: OBJECT_ENTRIES,
        pre_headers: r.abi.objects().pre_headers,
    });
    let stack_slots = config.stacks.as_ref().map(|s| stacks::slots(r, plan, s)).transpose()?;
    let stacks = config.stacks.as_ref().zip(stack_slots.clone()).map(|(s, slots)| crate::kernel::StacksOptions {
        slots,
        sample: s.sample,
        entries: STACK_ENTRIES,
        native_rows: s.native.then_some(crate::unwind::ROW_CAPACITY),
    });
    Ok((types, stacks, stack_slots))
}

/// Prepares `config`'s target. The header states the run's cost, which
/// needs a hit's: calibrated on a thread of its own meanwhile, where
/// preparing does not calibrate it anyway.
pub(super) fn prepare_run(config: &AttachConfig, launched: bool) -> Result<(Prepared, Option<Calibration>), RunError> {
    let mut options = prepare::Options::attach(config);
    // A program held at its entry point has the built-in allocator's
    // pointers, which its startup may replace (PYTHONMALLOC, -X dev).
    options.frees_at_implementations &= !launched;
    let early = (!options.hit_costs && !options.planning.reads_returns()).then(Calibration::start);
    Ok((prepare::prepare(&config.target, &options)?, early))
}

/// Watches the end of the target: its pidfd with `--pid`, every process's
/// exit record with `--exe`.
pub(super) fn watch_exits(
    target: &TargetSpec,
) -> Result<(Option<ProcessExit>, Option<exits::ExitListener>), TargetError> {
    Ok(match target {
        // The pidfd pins the process identity: if the PID is reused after
        // this, we still see the original process's exit.
        TargetSpec::Pid(pid) => (Some(ProcessExit::watch(*pid)?), None),
        // Listening from well before the attach, so that a process started
        // after it has every thread's exit record.
        TargetSpec::Exe(_) => (None, exits::ExitListener::start()),
    })
}

/// Loads and attaches the prepared plan as `config` says, and reports the
/// attach: everything before the loop.
#[allow(clippy::too_many_lines, reason = "everything before the loop, in the order it must happen")]
pub(super) fn start<'a>(
    config: &AttachConfig,
    prepared: Prepared,
    (exits, early): (Option<exits::ExitListener>, Option<Calibration>),
    child: Option<&mut Child>,
    reporter: Box<dyn Reporter + 'a>,
) -> Result<(Run, Output<'a>), RunError> {
    let Prepared { target: r, specs: _, plan, gc, growth: growth_plan, calibration, notes } = prepared;
    // In the CPU time of the thread hit: the budget is a share of the
    // target's CPU time.
    let costs = calibration.map(|c| c.cpu.hit);
    let return_costs = calibration.and_then(|c| c.returns);
    let cpu_costs = calibration.map(|c| c.cpu);
    let inline_sites: usize = plan.probes.iter().map(|p| p.inline_sites.len()).sum();
    if config.links == LinkMode::Perf && inline_sites > 0 {
        return Err(ConfigError::InlinedNeedMulti { sites: inline_sites }.into());
    }
    if config.budget.is_some() && config.links == LinkMode::Perf && plan.has_many_sites() {
        let sites = plan.probes.iter().map(|p| p.inline_sites.len() + p.coverage.call_sites).sum();
        return Err(ConfigError::BudgetPerfManySites { sites }.into());
    }
    let (types, stacks, stack_slots) = kernel_options(config, &r, &plan)?;
    let live = config.live.as_ref().map(|l| l.max);
    let growth = growth_plan.as_ref().filter(|g| g.unavailable.is_none()).map(|_| growth::KERNEL);
    let full_maps = crate::kernel::full::wanted();
    // The budget's windows put each link's hottest sites in last and take
    // them out first (see kernel::heat).
    let heat = config.budget.is_some();
    let load =
        LoadOptions { bpf_log: config.bpf_log, types, stacks, live, growth, full_maps, heat, ..LoadOptions::default() };
    let mut session = Session::load(plan, r.scope, &load)?;
    if live.is_some()
        && let Some(pid) = r.pid()
        && let Some(pymalloc) = live::pymalloc(&r, session.plan(), pid)
    {
        session.set_pymalloc(pymalloc)?;
    }
    // The target's frames are located before the probes go live, so that
    // its first events have stacks.
    let mut stack_names = config.stacks.as_ref().zip(stack_slots).map(|(s, slots)| {
        let native = s.native.then(|| crate::unwind::Native::new(config.debug_dir.clone()));
        crate::run::stacks::StackNames::new(slots, s.depth, s.sample, s.top, native, r.pid().is_none())
    });
    if let Some(names) = stack_names.as_mut() {
        // With --exe, the processes already running the interpreter too: a
        // process is otherwise first prepared at the reading that sees its
        // events, and its events up to then have no stack (a burst in the
        // first interval, all of them).
        let pids = match r.pid() {
            Some(pid) => vec![pid],
            None => {
                crate::discover::process::processes_mapping(&r.attach_path).into_iter().map(|(pid, _)| pid).collect()
            }
        };
        for pid in pids {
            names.prepare(&mut session, pid)?;
        }
    }
    let mut growth = growth::setup(config, &mut session, growth_plan, r.pid())?;
    let watch = match r.pid() {
        Some(pid) => Watch::Process(pid),
        None => Watch::Interpreter(r.attach_path.clone()),
    };
    let late = session.plan().has_call_sites().then(|| LateModules::new(watch, r.known.clone()));
    let frees = r.pid().and_then(|pid| FreesWatch::new(pid, &r.elf, &r.display_path, &session.plan().moved_frees));
    // The profile's sources find what they read before anything is live,
    // so that the first window is no longer than it should be.
    let gc = profile::gc_probes(config, gc);
    let (profile, profile_notes) = match (config.mode, config.budget) {
        (Mode::Profile, Some(budget)) => {
            let (p, notes) = Profile::new(config, budget, r.pid(), &gc, cpu_costs);
            (Some(p), notes)
        }
        _ => (None, Vec::new()),
    };

    // Before the attach: this reads the image, which the first window
    // should not wait for.
    let mut cost = cost_meter(config, &session, r.pid(), exits, (cpu_costs, early));
    // The probes that stay attached (the GC's, growth's) go live first:
    // the rates' first window then goes live once, after them, and is no
    // longer than it should be (attaching growth's took tens of
    // milliseconds, which the window's probes would have been live for).
    // Through uprobe-multi links unless told otherwise; where the kernel
    // has none, `--links auto` falls back for these as for the rates.
    let growth_header = links::always_on(config.links, &mut session, r.scope, (&gc, &mut growth))?;
    // What the first window's hits can have cost the traced processes at
    // most is what they run from here.
    let before_attach = config.budget.map(|_| {
        let cpu = cost::TargetCpu::new(r.pid(), Some(&r.attach_path));
        let mark = pace::CpuMark::read(&cpu.covered(&[]));
        (cpu, mark)
    });
    let (links, attach_began, fallback) = attach_links(&mut session, r.scope, config.links)?;
    if let Some(c) = child {
        // Calibrated while it is held, not while its startup runs traced:
        // the header's first window is then as short as it should be.
        cost.wait_calibrated(cost::HEADER_WAIT);
        c.release()?;
    }
    let started = Instant::now();
    // The same moment by the wall clock, for the header: what a report
    // made later dates itself by (live, now less the elapsed time is it).
    let started_unix_s =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_secs_f64());
    // The target's CPU time over the first window, exactly: too short for
    // /proc/PID/stat's clock ticks.
    let cpu_began = r.pid().and_then(cost::process_cpu_ns);
    let mut readout = Readout::new(started, r.pid().is_none(), config.types.then(|| r.abi.objects()));
    readout.stack_names = stack_names;
    readout.live = live;
    if config.gc != GcMode::Off {
        let reason = if gc.source == GcSource::None { Some(gc.detail.clone()) } else { gc.caveat.clone() };
        readout.report_gc(gc.source, reason);
    }
    let mut duty = match (config.budget, costs, before_attach) {
        (Some(budget), Some(costs), Some((target_cpu, cpu_before_attach))) => Some(DutyCycle::new(
            (&mut session, &mut readout),
            budget,
            costs,
            (r.scope, links == Links::Multi),
            // A multi link goes live at once when made; perf-event uprobes
            // one by one during the attach.
            (if links == Links::Multi { started } else { attach_began }, started, cpu_before_attach),
            target_cpu,
        )?),
        _ => None,
    };
    let estimate = profile::first_window(
        config,
        r.pid(),
        (&mut session, &mut readout),
        duty.as_mut(),
        &mut cost,
        (started, cpu_began),
    )?;
    let profile_cpu = profile::target_cpu(duty.as_mut(), &cost);
    let profile = profile.map(|p| p.started(started, profile_cpu));
    let mut info = header::attached_event(&session, &r, links, &cost);
    info.started_unix_s = started_unix_s;
    info.mode = Some(config.mode.name().to_owned());
    if let Mode::Exact { because } = config.mode {
        info.exact_because = because.map(str::to_owned);
    }
    info.estimated_cost = Some(estimate);
    info.return_costs_ns = return_costs.map(|r| r.1);
    info.gc = Some(gc);
    info.growth = growth_header;
    let mut output = Output { reporter, attached: None, previous: None, closed: false };
    output.emit(&Event::Attached(info.clone()))?;
    output.attached = Some(info);
    output.notes(config.notes.iter().cloned().chain(fallback).chain(notes).chain(profile_notes))?;
    Ok((Run { session, readout, duty, late, frees, started, cost, profile, growth }, output))
}

/// The meter of the run's cost, its hit's cost calibrated while preparing
/// (`prices`), or on a thread of its own meanwhile (`early`), or from now.
fn cost_meter(
    config: &AttachConfig,
    session: &Session,
    pid: Option<u32>,
    exits: Option<exits::ExitListener>,
    (prices, early): (Option<cost::Prices>, Option<Calibration>),
) -> CostMeter {
    let calibrating = match (prices, early) {
        (Some(prices), _) => Calibration::Known(prices),
        (None, Some(early)) => early,
        (None, None) => Calibration::start(),
    };
    let advice = Advice::of(config, session.plan());
    CostMeter::new(session.plan(), pid, exits, calibrating, advice)
}
