//! Everything before anything is attached to the target: what the plan
//! needs calibrated ([`calibrate`]), the target resolved with its debug
//! info, its probes planned ([`planning`]; libc's too with `--native`) and
//! its GC probes. `tracer attach`, `probes` and `bench` prepare here, and
//! the run loop receives what this makes.

pub mod calibrate;
pub mod kept;
pub mod planning;
pub mod slots;

use std::path::{Path, PathBuf};

use thiserror::Error;

use self::calibrate::{Calibration, CalibrationError};
pub use self::planning::Planning;
use crate::{
    cli::ProbesArgs,
    config::{AttachConfig, ConfigError},
    discover::{self, DwarfLookup, Inlining, ResolveError, Resolved, TargetSpec, libc::LibcError},
    error::Classify,
    model::{Level, Note, NoteCode, PlanReport},
    plan::{
        self, ImageRef, PlacementMode, Plan, PlanError,
        gc::{GcImage, GcMode, GcPlan, GcPlanError, GcSource},
        growth::GrowthPlan,
        returns::ReturnCosts,
    },
    privileges::{self, PrivilegeError},
    probe::{ProbeSelection, ProbeSpec, SelectionError},
};

/// What to prepare, beyond the target.
#[derive(Clone, Copy, Debug)]
#[allow(clippy::struct_excessive_bools, reason = "one switch per thing a run may prepare")]
pub struct Options<'a> {
    /// Which functions to probe.
    pub probes: &'a ProbeSelection,
    /// How to plan them.
    pub planning: Planning,
    /// `--native`: also plan libc's allocator (with `--pid` only).
    pub native: bool,
    /// `--gc`: how collections would be seen.
    pub gc: GcMode,
    /// `--debug-dir`: one more place to look for the interpreter's DWARF.
    pub debug_dir: Option<&'a Path>,
    /// Also calibrate what a probe hit costs when no return value is read
    /// (`--budget` prices its windows with it).
    pub hit_costs: bool,
    /// Find the modules that may call the image even when this plan does
    /// not probe at call sites (`tracer bench` plans such setups later).
    pub callers: bool,
    /// `--growth` or the profile's default: also plan heap growth
    /// sampling's probes.
    pub growth: bool,
    /// Growth is the profile's default, not asked for: where it is
    /// unavailable, a note says so rather than a warning.
    pub growth_auto: bool,
    /// With `--pid`, probe the frees that jump through the allocator's
    /// pointers at the implementation each holds (see
    /// [`plan::slots`]): not with `--budget`, whose windows attach the
    /// marks and the probe they mark apart.
    pub frees_at_implementations: bool,
}

impl<'a> Options<'a> {
    /// What `tracer attach` prepares.
    #[must_use]
    pub fn attach(config: &'a AttachConfig) -> Self {
        Self {
            probes: &config.probes,
            planning: Planning {
                placement: config.placement,
                // Checked by `prepare`, which can fail.
                program: planning::bench_program().unwrap_or(None),
                returns: config.returns,
                inlined: config.inlined,
                types: config.types,
                live: config.live.is_some(),
            },
            native: config.native,
            gc: config.gc,
            debug_dir: config.debug_dir.as_deref(),
            hit_costs: config.budget.is_some(),
            callers: false,
            growth: config.growth.is_some(),
            growth_auto: config.growth.as_ref().is_some_and(|g| g.auto),
            frees_at_implementations: config.budget.is_none(),
        }
    }

    /// What `tracer probes` prepares: nothing counts object types.
    #[must_use]
    pub fn probes(args: &'a ProbesArgs) -> Self {
        let t = &args.target;
        Self {
            probes: &t.probes,
            planning: Planning {
                // As `attach --exact` places them: the profile's windows
                // keep `auto`'s probes inside the functions.
                placement: t.placement.resolved(
                    plan::AutoReach {
                        every_event: true,
                        one_running_process: t.exe.is_none(),
                        multi_links: crate::kernel::multi::available(),
                    }
                    .takes_call_sites(),
                ),
                program: None,
                returns: args.returns,
                inlined: !t.no_inlined,
                types: false,
                live: args.live,
            },
            native: t.native,
            gc: t.gc,
            debug_dir: t.debug_dir.as_deref(),
            hit_costs: false,
            callers: false,
            growth: args.growth,
            growth_auto: false,
            frees_at_implementations: true,
        }
    }
}

/// A target ready to be attached to.
#[derive(Debug)]
pub struct Prepared {
    pub target: Resolved,
    /// The rows of the version's probe table that were planned.
    pub specs: Vec<ProbeSpec>,
    pub plan: Plan,
    pub gc: GcPlan,
    /// With `--growth`: where heap growth is sampled, or why it is not.
    pub growth: Option<GrowthPlan>,
    /// What was calibrated, if the plan or `--budget` needed it.
    pub calibration: Option<Calibration>,
    /// What the user should know before anything else: the image's
    /// `_Py_DebugOffsets` disagreeing with tracer, how collections are (not)
    /// seen.
    pub notes: Vec<Note>,
}

/// Why a target cannot be prepared.
#[derive(Debug, Error)]
pub enum PrepareError {
    #[error(transparent)]
    Privileges(#[from] PrivilegeError),
    #[error(transparent)]
    Calibration(#[from] CalibrationError),
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error(transparent)]
    Selection(#[from] SelectionError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Libc(#[from] LibcError),
    #[error(transparent)]
    Gc(#[from] GcPlanError),
    #[error("{0}")]
    BenchKnob(String),
}

impl Classify for PrepareError {
    fn is_bad_input(&self) -> bool {
        match self {
            Self::Privileges(e) => e.is_bad_input(),
            Self::Calibration(e) => e.is_bad_input(),
            Self::Resolve(e) => e.is_bad_input(),
            Self::Selection(e) => e.is_bad_input(),
            Self::Config(e) => e.is_bad_input(),
            Self::Plan(e) => e.is_bad_input(),
            Self::Libc(e) => e.is_bad_input(),
            Self::Gc(e) => e.is_bad_input(),
            Self::BenchKnob(_) => true,
        }
    }
}

/// Calibrates what `options` need, resolves `target`, and plans its probes
/// and GC probes, touching nothing of the target.
pub fn prepare(target: &TargetSpec, options: &Options<'_>) -> Result<Prepared, PrepareError> {
    let planning = options.planning;
    planning::bench_program().map_err(PrepareError::BenchKnob)?;
    // The child calibration times is tracer's own; loading its probes
    // takes the privileges an attach does.
    let calibration = if options.hit_costs || planning.reads_returns() {
        privileges::check()?;
        Some(kept::calibration(planning.reads_returns())?)
    } else {
        None
    };
    let costs = calibration.and_then(|c| c.returns).map(|r| r.0);
    let callers = options.callers || planning.placement == PlacementMode::CallSites;
    let dwarf = DwarfLookup { enabled: planning.inlined, debug_dir: options.debug_dir };
    let resolved = discover::resolve(target, callers, dwarf)?;
    let specs = specs(&resolved, options.probes, planning.types)?;
    let mut plan = planning.plan(ImageRef::from(&resolved), &specs, costs)?;
    if let Some(pid) = resolved.pid().filter(|_| options.frees_at_implementations)
        && planning.placement != PlacementMode::Entry
    {
        let found = plan::slots::find(&resolved.elf, plan::placement::running_kernel());
        let held = slots::held(pid, &resolved.elf, &resolved.display_path, &found.frees);
        let copies = |name: &str| match &resolved.inlining {
            Inlining::Known { entries, .. } => Some(entries.get(name).map_or(0, Vec::len)),
            Inlining::Skipped | Inlining::Guards { .. } => None,
        };
        plan.moved_frees = plan::slots::apply(&mut plan, &found, &held, copies);
    }
    if options.native {
        native(&mut plan, &resolved, planning, costs)?;
    }
    // Before anything is loaded: `--gc markers` on a build without them is
    // the user's to fix.
    let gc = gc_plan(&resolved, options.gc)?;
    let growth = options.growth.then(|| growth_plan(&resolved, options.debug_dir, options.growth_auto));
    let growth_note = growth.as_ref().and_then(|g| g.unavailable.as_ref()).map(|why| {
        if options.growth_auto {
            let text = format!("growth unavailable: {why}; the profile goes on without it");
            Note::new(Level::Note, NoteCode::Growth, text)
        } else {
            Note::new(Level::Warning, NoteCode::Growth, format!("growth unavailable: {why}"))
        }
    });
    // Never silently: where the carves were not found, every take is
    // probed, which a churny target pays for.
    let fallback_note = growth
        .as_ref()
        .and_then(|g| g.fallback.as_ref())
        .map(|why| Note::new(Level::Note, NoteCode::Growth, format!("growth probes every pool take: {why}")));
    let notes = debug_offsets_note(&resolved)
        .into_iter()
        .chain(gc_note(&gc, options.gc))
        .chain(growth_note)
        .chain(fallback_note)
        .collect();
    Ok(Prepared { target: resolved, specs, plan, gc, growth, calibration, notes })
}

impl Prepared {
    /// What `tracer probes` shows.
    #[must_use]
    pub fn into_report(self) -> PlanReport {
        let measured = self.calibration.and_then(|c| c.returns).map(|r| r.1);
        let mut report = PlanReport::new(&self.plan, &self.target.version.to_string(), measured);
        report.notes.extend(self.notes);
        report.gc = Some(self.gc);
        report.growth = self.growth;
        report
    }
}

/// The probe table rows `selection` picks for the resolved target. With
/// `types`, every function that creates objects the version has, since
/// where `_Py_NewReferenceNoTotal` exists (3.12+) the free lists' objects
/// pass it instead of `_Py_NewReference`, and the object domain's free,
/// where objects are seen destroyed.
fn specs(r: &Resolved, selection: &ProbeSelection, types: bool) -> Result<Vec<ProbeSpec>, SelectionError> {
    let mut specs = selection.select(r.abi.probes(), &r.version.to_string())?;
    if types {
        for p in r.abi.probes() {
            let counts_objects = crate::python::object_parameter(p.symbol).is_some()
                || crate::python::freed_parameter(p.symbol).is_some();
            if counts_objects && !specs.iter().any(|s| s.symbol == p.symbol) {
                specs.push(*p);
            }
        }
    }
    Ok(specs)
}

/// With `--native`, adds the C library's allocator functions of the
/// target to `plan` (with `--pid` only: `attach`'s configuration refuses
/// `--exe` before this).
fn native(plan: &mut Plan, r: &Resolved, planning: Planning, costs: Option<ReturnCosts>) -> Result<(), PrepareError> {
    let pid = r.pid().ok_or(ConfigError::NativeWithExe)?;
    let libc = discover::libc::find(pid)?;
    plan::native::extend(plan, &libc, planning.for_libc().options(costs), planning.live)?;
    Ok(())
}

/// The GC probes of the resolved target, as `mode` says.
fn gc_plan(r: &Resolved, mode: GcMode) -> Result<GcPlan, GcPlanError> {
    let version = r.version.to_string();
    let debug = match &r.inlining {
        Inlining::Known { source, .. } => Some(PathBuf::from(source)),
        _ => None,
    };
    let image = GcImage {
        elf: &r.elf,
        display_path: &r.display_path,
        attach_path: &r.attach_path,
        version: &version,
        debug: debug.as_deref(),
    };
    plan::gc::plan(image, crate::python::gc_knowledge(r.abi), mode)
}

/// Heap growth sampling's probes in the resolved target (with `--pid`
/// only: its samples are checked against the process's memory), or why
/// there are none: the carves for the profile's default (`auto`), whose
/// budget a churny target's takes would spend in a fraction of a second;
/// every take for `--growth`, which asks for growth whatever it costs and
/// gets each pool charged to the code that holds it now.
fn growth_plan(r: &Resolved, debug_dir: Option<&Path>, auto: bool) -> GrowthPlan {
    if r.pid().is_none() {
        return GrowthPlan::unavailable(
            "with --exe, no process's memory is read, which growth's samples are checked against; pass --pid",
        );
    }
    if let Some(why) = crate::python::growth::refusal(r.abi) {
        return GrowthPlan::unavailable(why);
    }
    let knowledge = crate::python::growth::knowledge(r.abi);
    match discover::growth::find(r, &knowledge, debug_dir) {
        Ok(symbols) => {
            let probed = if auto { plan::growth::Probed::Carves } else { plan::growth::Probed::Takes };
            plan::growth::plan(&r.elf, &symbols, &knowledge, plan::placement::running_kernel(), probed)
        }
        Err(why) => GrowthPlan::unavailable(why),
    }
}

/// What the user should know of the GC plan: that collections are not
/// seen, and why (not with `--gc off`, which asked for it), or what the
/// function's counts hold that the markers would not count.
fn gc_note(gc: &GcPlan, mode: GcMode) -> Option<Note> {
    match (gc.source, &gc.caveat) {
        (GcSource::None, _) if mode != GcMode::Off => Some(Note::new(Level::Note, NoteCode::Gc, gc.detail.clone())),
        (GcSource::Function, Some(caveat)) => Some(Note::new(Level::Warning, NoteCode::Gc, caveat.clone())),
        _ => None,
    }
}

/// The warning to give when the interpreter's `_Py_DebugOffsets` disagrees
/// with what tracer expects of its version.
fn debug_offsets_note(r: &Resolved) -> Option<Note> {
    r.debug_offsets_mismatch.as_ref().map(|why| {
        Note::new(
            Level::Warning,
            NoteCode::DebugOffsets,
            format!(
                "{}: {why}; tracer's knowledge of Python {} may not fit this build",
                r.display_path.display(),
                r.version
            ),
        )
    })
}
