//! The attach plan: which functions of the image are probed, where in
//! each (placement, or at their call sites), and how return values are read.
//! Planning reads files only; [`crate::kernel`] turns a plan into uprobes.
//!
//! The probes' coverage is worked out in [`coverage`](mod@coverage), the
//! inlined copies probed in `inlined`, `--live`'s part in `live`, and call
//! sites in [`callsites`].

pub mod callsites;
pub mod coverage;
pub mod gc;
pub mod growth;
pub mod inlined;
mod live;
pub mod native;
pub mod placement;
pub mod returns;
pub mod slots;

use std::path::{Path, PathBuf};

use thiserror::Error;

pub use self::callsites::late_call_sites;
pub use self::inlined::Stay;
use self::{
    callsites::{CallSites, place_at_call_sites},
    coverage::{Coverage, coverage, live_coverage, types_coverage},
    inlined::{Reads, inline_sites},
    live::{live_fix, live_impls, live_role, place_with_live},
    placement::Placement,
    returns::{ReturnCosts, ReturnPlan},
};
pub use crate::discover::{InlineEntry, Inlining};
use crate::{
    discover::{elf::ElfImage, modules::Module},
    probe::{ProbeKind, ProbeSpec, Program},
};

/// A plan that cannot work for this image: the user's input.
#[derive(Debug, Error)]
pub enum PlanError {
    #[error("required symbol {symbol} is not in {path}; this build of CPython cannot be traced (was it stripped?)")]
    RequiredMissing { symbol: &'static str, path: PathBuf },
    #[error(
        "none of the requested probe symbols is in {path}; this build of CPython cannot be traced (was it stripped?)"
    )]
    NoProbes { path: PathBuf },
}

impl crate::error::Classify for PlanError {
    fn is_bad_input(&self) -> bool {
        match self {
            Self::RequiredMissing { .. } | Self::NoProbes { .. } => true,
        }
    }
}

/// Where uprobes go in each function (`--placement`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PlacementMode {
    /// `CallSites` where every event is counted, `Inside` otherwise:
    /// [`PlacementMode::resolved`] says which before anything is planned.
    #[default]
    Auto,
    /// At the first instruction the kernel emulates, when that counts the
    /// same calls (see [`placement`]); never at the callers.
    Inside,
    /// At the function's first instruction, and each inlined copy at its
    /// first point (its entry, or the read of its switch).
    Entry,
    /// As `Inside`, except that a function whose probe would be
    /// single-stepped is probed at every call to it, when that sees every
    /// call (see [`callsites`]).
    CallSites,
}

impl PlacementMode {
    /// What `auto` stands for in a run: `CallSites` where
    /// [`AutoReach::takes_call_sites`], `Inside` otherwise; the others as given.
    #[must_use]
    pub const fn resolved(self, call_sites: bool) -> Self {
        match self {
            Self::Auto if call_sites => Self::CallSites,
            Self::Auto => Self::Inside,
            other => other,
        }
    }
}

/// What decides where `auto` puts a function whose own probe would be
/// single-stepped (about ten times an emulated hit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AutoReach {
    /// The run traces every event: no `--budget`, whose every window would
    /// pay the call sites' attach and detach.
    pub every_event: bool,
    /// It traces one process already running (`--pid`, `--name`): links on
    /// a file see every process that maps it, and with `--exe` an
    /// extension module another interpreter shares, an abi3 one, would add
    /// that interpreter's calls; `tracer run`'s program has yet to import
    /// its modules, each of which would be seen only from when it is found.
    pub one_running_process: bool,
    /// Through uprobe-multi links, which attach and detach thousands of
    /// sites at once: not `--links perf`, on a kernel that has them
    /// ([`crate::kernel::multi::available`]).
    pub multi_links: bool,
}

impl AutoReach {
    /// Whether `auto` takes the call sites, where they see every call: all
    /// three hold.
    #[must_use]
    pub const fn takes_call_sites(self) -> bool {
        self.every_event && self.one_running_process && self.multi_links
    }
}

/// The calibrated cost of one probe hit on this machine.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HitCosts {
    /// A probe whose instruction the kernel single-steps out of line.
    #[serde(rename = "single_stepped")]
    pub single_stepped_ns: f64,
    /// A probe whose instruction the kernel emulates.
    #[serde(rename = "emulated")]
    pub emulated_ns: f64,
    /// When they were measured, in seconds since 1970 (UTC): a run may use
    /// figures kept from an earlier one (`prepare::kept`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibrated_unix_s: Option<f64>,
}

impl HitCosts {
    /// The cost of one hit of a probe placed on an emulated instruction or
    /// not.
    #[must_use]
    pub const fn of(&self, emulated: bool) -> f64 {
        if emulated { self.emulated_ns } else { self.single_stepped_ns }
    }

    /// The (high, low) cost in ns of one hit at a probe with `emulated`
    /// and `single_stepped` sites. Its sites share one counter, so where
    /// they are of both kinds its hits cannot be split by site: high
    /// prices them all single-stepped, low all emulated. Where all are of
    /// one kind both are exact.
    #[must_use]
    pub const fn range(&self, emulated: usize, single_stepped: usize) -> (f64, f64) {
        match (emulated, single_stepped) {
            (0, 0) => (0.0, 0.0),
            (_, 0) => (self.emulated_ns, self.emulated_ns),
            (0, _) => (self.single_stepped_ns, self.single_stepped_ns),
            _ => (self.single_stepped_ns, self.emulated_ns),
        }
    }
}

/// One probed inlined copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(clippy::struct_excessive_bools, reason = "four independent facts of one site, each reported on its own")]
pub struct InlineSite {
    /// Its file offset in the image.
    pub offset: u64,
    /// Where its size is, as in [`InlineEntry::size`].
    pub size: Option<(u8, u8, u16)>,
    /// Where its new object is, as in [`InlineEntry::object`].
    pub object: Option<(u8, u16)>,
    /// Whether the kernel emulates the probed instruction (else it
    /// single-steps it).
    pub emulated: bool,
    /// Whether it is probed past its first point, on the straight line
    /// after it (see `discover::line`), to be at an emulated instruction.
    pub moved: bool,
    /// Where single-stepped, why it is not moved to an emulated
    /// instruction.
    pub stay: Option<Stay>,
    /// Where probed at a conditional jump that leads into the copy (see
    /// [`crate::discover::line::Gate`]): the condition under which the
    /// jump goes into it, which the program checks.
    pub gate: Option<u8>,
    /// Whether it is at a jump into the copy (conditional or not) rather
    /// than in the copy's own code.
    pub jump: bool,
    /// Whether it is a further jump into a copy counted at another site
    /// already: the copy's passes are split between its jumps, and it is
    /// one copy.
    pub also: bool,
}

/// The interpreter image to plan for.
#[derive(Clone, Copy, Debug)]
pub struct ImageRef<'a> {
    /// Its symbols.
    pub elf: &'a ElfImage,
    /// The path to show (as the target sees it).
    pub display_path: &'a Path,
    /// The path the kernel resolves (valid in tracer's mount namespace).
    pub attach_path: &'a Path,
    /// Other modules that may call into the image, for
    /// `--placement call-sites` (empty otherwise).
    pub modules: &'a [Module],
    /// What its DWARF says of inlined copies; `None` where nobody looked
    /// (tracer's own code, in calibration).
    pub inlining: Option<&'a Inlining>,
    /// The allocator implementations found, for `--live`.
    pub implementations: &'a [crate::discover::impls::Implementation],
}

impl<'a> ImageRef<'a> {
    /// An image of tracer's own (calibration, tests): at `path`, with no
    /// other modules, no DWARF and no allocator implementations.
    #[must_use]
    pub const fn own(elf: &'a ElfImage, path: &'a Path) -> Self {
        Self { elf, display_path: path, attach_path: path, modules: &[], inlining: None, implementations: &[] }
    }
}

impl<'a> From<&'a crate::discover::Resolved> for ImageRef<'a> {
    fn from(r: &'a crate::discover::Resolved) -> Self {
        Self {
            elf: &r.elf,
            display_path: &r.display_path,
            attach_path: &r.attach_path,
            modules: &r.modules,
            inlining: Some(&r.inlining),
            implementations: &r.implementations,
        }
    }
}

/// A file probes go in other than the plan's image: the target's C
/// library, with `--native`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeFile {
    /// As the target sees it.
    pub display_path: PathBuf,
    /// As tracer reaches it (what the kernel resolves).
    pub attach_path: PathBuf,
}

/// One probe of the plan: everything tracer knows about it before any
/// count, keyed by its slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedProbe {
    pub symbol: &'static str,
    /// The counting program of its shape (whether it reports bytes).
    pub program: Program,
    /// The program attached to it: its own, or a benchmark's override.
    pub attach_program: Program,
    /// Counter slot, passed to the program as the attach cookie.
    pub slot: u32,
    /// Offset in the image file of the function's entry: for a free probed
    /// at its allocator's implementation ([`slots`]), the
    /// implementation's.
    pub file_offset: u64,
    /// Where in the function the uprobe sits, and why.
    pub placement: Placement,
    /// With `--returns`, for an allocating function: how its return value
    /// is read.
    pub returns: Option<ReturnPlan>,
    /// With `--placement call-sites`, for a function probed at its callers
    /// instead of inside it: where they are.
    pub call_sites: Option<CallSites>,
    /// The inlined copies (and out-of-line clones) probed, each counted as
    /// a call, with its size where the DWARF says where it is.
    pub inline_sites: Vec<InlineSite>,
    /// What the counts cover.
    pub coverage: Coverage,
    /// With `--live`, what it does in the live table
    /// (`tracer_common::live::Role`): an allocating function gets
    /// `live_alloc` at its entry beside its return probes, a free
    /// `live_free` at its entry.
    pub live: Option<tracer_common::live::Role>,
    /// The file the function is in, where it is not the plan's image.
    pub file: Option<ProbeFile>,
    /// The size histogram its requests go in; `None` for a function that
    /// requests no size.
    pub domain: Option<tracer_common::sizes::Domain>,
    /// With `--native`: the file offsets, in the same file, of the direct
    /// calls and jumps to this function from another probed function
    /// (see [`native`]), each of which marks its call as nested.
    pub nested_sites: Vec<u64>,
    /// With `--native --live`, for a libc function: where the live table
    /// reads its return (always a `ret` or a uretprobe: the return is
    /// matched with its entry by the stack pointer).
    pub live_returns: Option<ReturnPlan>,
}

impl PlannedProbe {
    /// Whether its hits at single-stepped sites are counted again apart
    /// (`STEPPED_SLOT`), so that they are priced by what each cost: where
    /// it has sites of both kinds, its entry and its inlined copies (call
    /// sites keep no kind per site), through programs that read the mark.
    #[must_use]
    pub fn stepped_apart(&self) -> bool {
        let reads_mark = matches!(
            self.attach_program,
            Program::CountCall
                | Program::SizeArg0
                | Program::SizeArg1
                | Program::Calloc
                | Program::CountObject
                | Program::FreeObject
        );
        if !reads_mark || self.call_sites.is_some() || self.inline_sites.is_empty() {
            return false;
        }
        let stepped = self.inline_sites.iter().filter(|s| !s.emulated).count() + usize::from(!self.placement.emulated);
        stepped > 0 && stepped <= self.inline_sites.len()
    }

    /// The file the probe is in, as tracer reaches it.
    #[must_use]
    pub fn attach_path<'a>(&'a self, plan: &'a Plan) -> &'a Path {
        self.file.as_ref().map_or(&plan.attach_path, |f| &f.attach_path)
    }

    /// The file the probe is in, as the target sees it.
    #[must_use]
    pub fn display_path<'a>(&'a self, plan: &'a Plan) -> &'a Path {
        self.file.as_ref().map_or(&plan.display_path, |f| &f.display_path)
    }

    /// Offset in the image file of the probed instruction.
    #[must_use]
    pub const fn probe_offset(&self) -> u64 {
        self.file_offset + self.placement.offset
    }
}

/// Options of a plan beyond what and where.
#[derive(Clone, Copy, Debug)]
pub struct PlanOptions {
    /// Attach this program to every probe instead of its counting program
    /// (benchmarks use [`Program::Empty`] to measure the bare uprobe).
    pub program_override: Option<Program>,
    /// Where in each function to probe.
    pub placement: PlacementMode,
    /// With `--returns`: what each way of reading a return value costs, so
    /// that allocating functions get the cheapest return probes.
    pub returns: Option<ReturnCosts>,
    /// Whether to probe the inlined copies the DWARF lists (not
    /// `--no-inlined`).
    pub inlined: bool,
    /// `--types`: count new references by the object's type, with
    /// [`Program::CountObject`].
    pub types: bool,
    /// `--live`: keep the outstanding blocks, by address.
    pub live: bool,
    /// With `--live`: what each way of reading a return value costs, so
    /// that each allocator implementation's return is read the cheapest
    /// way (the API functions' returns are `returns`' alone).
    pub live_costs: Option<ReturnCosts>,
}

// Tests' plans: every run's options come from `prepare`'s one function.
#[cfg(test)]
impl Default for PlanOptions {
    fn default() -> Self {
        Self {
            program_override: None,
            placement: PlacementMode::default(),
            returns: None,
            inlined: true,
            types: false,
            live: false,
            live_costs: None,
        }
    }
}

/// The plan for one image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The probes, in slot order.
    pub probes: Vec<PlannedProbe>,
    /// Optional probes whose symbol the image lacks.
    pub missing: Vec<&'static str>,
    /// The image, as the target sees it and as tracer reaches it.
    pub display_path: PathBuf,
    pub attach_path: PathBuf,
    /// With `--live`, the allocator implementations probed, in slots after
    /// the probes'.
    pub live_impls: Vec<LiveImpl>,
    /// With `--live`, what gives the implementations where none was found.
    pub live_fix: String,
    /// The frees probed at the implementation their pointer held at the
    /// attach (see [`slots`]), which the run checks every interval.
    pub moved_frees: Vec<slots::Moved>,
}

/// With `--live`, one allocator implementation: `live_impl` at its entry,
/// and, for an allocation, a return probe as [`ReturnPlan`] says (only at
/// `ret`s, where the stack pointer is the entry's, else a uretprobe).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveImpl {
    pub name: &'static str,
    pub slot: u32,
    pub file_offset: u64,
    /// Its [`tracer_common::live::Role`], with the implementation bit.
    pub role: tracer_common::live::Role,
    pub returns: ReturnPlan,
    /// Where `live_impl` traps, and a uretprobe with it: the first
    /// instruction the kernel emulates before the stack pointer or the
    /// arguments change (see [`placement::place`]), else the entry. There
    /// the return address is still at the stack pointer, which is the
    /// entry's, as the uretprobe and the frame's pairing need.
    pub placement: Placement,
}

impl Plan {
    /// Whether any probe sits at its function's call sites.
    #[must_use]
    pub fn has_call_sites(&self) -> bool {
        self.probes.iter().any(|p| p.call_sites.is_some())
    }

    /// Whether the plan has more uprobes than perf-event links can detach
    /// quickly (call sites, inlined copies): only multi links will do.
    #[must_use]
    pub fn has_many_sites(&self) -> bool {
        self.probes.iter().any(|p| p.call_sites.is_some() || !p.inline_sites.is_empty())
    }
}

/// Where `spec`'s probe goes in its function, whose code starts with
/// `code` at `address`, as `options` ask.
fn place_function(
    spec: &ProbeSpec,
    code: &[u8],
    address: u64,
    program: Program,
    options: &PlanOptions,
    kernel: placement::KernelVersion,
) -> Placement {
    match (spec.kind, options.placement) {
        (ProbeKind::Function, PlacementMode::Entry) => {
            placement::at_entry_of(code, address, kernel, "entry (--placement entry)")
        }
        // The live table's frames and a uretprobe read the stack pointer
        // at the probe: it must not have moved.
        (ProbeKind::Function, PlacementMode::Auto | PlacementMode::Inside | PlacementMode::CallSites)
            if options.live || options.returns.is_some() =>
        {
            place_with_live(code, address, (program, options.live.then(|| live_role(spec)).flatten()), kernel)
        }
        (ProbeKind::Function, PlacementMode::Auto | PlacementMode::Inside | PlacementMode::CallSites) => {
            placement::place_off_stack(code, address, program, kernel)
        }
    }
}

/// The largest function whose `ret` instructions tracer looks for.
const MAX_FUNCTION: u64 = 1 << 16;

/// Resolves `specs` in the image and places each probe, without touching
/// the kernel.
pub fn plan(image: ImageRef<'_>, specs: &[ProbeSpec], options: PlanOptions) -> Result<Plan, PlanError> {
    let (found, missing) = find(image, specs)?;
    let kernel = placement::running_kernel();
    // The new-reference functions' own code, by file offset: a read of the
    // switch found in one is that function's call, which its own probe
    // counts, never a copy of another. (An allocator's code holds genuine
    // copies of another allocator: `PyObject_Malloc` calls
    // `PyMem_RawMalloc` for large sizes.)
    let own_code: Vec<(&str, std::ops::Range<u64>)> = found
        .iter()
        .filter(|(spec, _)| crate::python::object_parameter(spec.symbol).is_some())
        .map(|(spec, sym)| (spec.symbol, sym.file_offset..sym.file_offset + sym.size.max(1)))
        .collect();
    let mut probes = Vec::with_capacity(found.len());
    for (slot, (spec, sym)) in (0u32..).zip(&found) {
        let own = if options.types && crate::python::object_parameter(spec.symbol).is_some() {
            Program::CountObject
        } else if options.types && crate::python::freed_parameter(spec.symbol).is_some() {
            Program::FreeObject
        } else {
            spec.program
        };
        let program = options.program_override.unwrap_or(own);
        let len = if sym.size > 0 { sym.size.min(4096) } else { 64 };
        let code = image.elf.read_at(sym.file_offset, usize::try_from(len).unwrap_or(64));
        let place = match code {
            Ok(code) => place_function(spec, &code, sym.address, program, &options, kernel),
            Err(e) => Placement::at_entry(format!("entry: the code could not be read ({e})")),
        };
        let returns = options.returns.filter(|_| spec.program.returns_pointer()).map(|costs| {
            let len = usize::try_from(sym.size.min(MAX_FUNCTION)).unwrap_or(0);
            match image.elf.read_at(sym.file_offset, len) {
                Ok(code) if sym.size <= MAX_FUNCTION => {
                    returns::plan(&code, sym.address, place.offset, &costs, (kernel, false))
                }
                Ok(_) => ReturnPlan::Uretprobe { reason: format!("the function is over {MAX_FUNCTION} bytes") },
                Err(e) => ReturnPlan::Uretprobe { reason: format!("the code could not be read ({e})") },
            }
        });
        // What the copies' programs read (as `kernel::links` gives them
        // their programs): the size where bytes are counted, the object or
        // block with --types and for --live's frees and reallocs.
        let live = options.live.then(|| live_role(spec)).flatten();
        let reads = Reads {
            size: own.counts_bytes(),
            object: matches!(own, Program::CountObject | Program::FreeObject)
                || live.is_some_and(|r| {
                    matches!(r.api(), tracer_common::live::Role::FREE | tracer_common::live::Role::REALLOC)
                }),
            before_calls: live.is_some(),
        };
        let moving = options.placement != PlacementMode::Entry;
        let (mut inline_sites, mut unprobed) = inline_sites(image, spec.symbol, kernel, (moving, reads));
        // pyenv's 3.13.0 has no DWARF for `_Py_NewReferenceNoTotal`'s
        // code, whose read of the reference tracer is then taken for a copy
        // of `_Py_NewReference`: counted there, unless it is probed itself.
        // Copies, not sites: a copy probed at several jumps is one.
        let copies = |sites: &[InlineSite]| sites.iter().filter(|s| !s.also).count();
        let before = copies(&inline_sites);
        inline_sites
            .retain(|s| !own_code.iter().any(|(other, code)| *other != spec.symbol && code.contains(&s.offset)));
        let others = before.saturating_sub(copies(&inline_sites));
        let inline_sites = if options.inlined {
            inline_sites
        } else {
            if !inline_sites.is_empty() {
                unprobed.push(format!("{} skipped with --no-inlined", copies(&inline_sites)));
            }
            Vec::new()
        };
        let mut coverage = coverage(image, spec, &inline_sites, &unprobed, options.returns.is_some());
        coverage.inlined = coverage.inlined.map(|n| n.saturating_sub(others));
        match own {
            Program::CountObject => types_coverage(&mut coverage, &inline_sites, "the object is", "types"),
            Program::FreeObject => {
                types_coverage(&mut coverage, &inline_sites, "the freed pointer is", "destructions");
            }
            _ => {}
        }
        if live.is_some() {
            live_coverage(&mut coverage, spec.symbol, &inline_sites, !image.implementations.is_empty());
        }
        probes.push(PlannedProbe {
            symbol: spec.symbol,
            program: own,
            attach_program: program,
            slot,
            file_offset: sym.file_offset,
            placement: place,
            returns,
            call_sites: None,
            coverage,
            inline_sites,
            live,
            file: None,
            domain: crate::python::domain(spec.symbol).filter(|_| spec.program.allocates()),
            nested_sites: Vec::new(),
            live_returns: None,
        });
    }
    if options.placement == PlacementMode::CallSites {
        place_at_call_sites(image, &mut probes, kernel);
        for p in &mut probes {
            p.coverage.call_sites = p.call_sites.as_ref().map_or(0, |c| c.emulated + c.stepped);
        }
    }
    let live_impls =
        if options.live { live_impls(image, &probes, options.live_costs.as_ref(), kernel) } else { vec![] };
    let (display_path, attach_path) = (image.display_path.to_owned(), image.attach_path.to_owned());
    let live_fix = live_fix(image.inlining);
    Ok(Plan { probes, missing, display_path, attach_path, live_impls, live_fix, moved_frees: Vec::new() })
}

/// The symbols of `specs` in `image`, and the optional ones it lacks; a
/// required one missing, or none found, is an error.
#[allow(clippy::type_complexity, reason = "a private pair of plan()'s two lists")]
fn find<'s>(
    image: ImageRef<'_>,
    specs: &'s [ProbeSpec],
) -> Result<(Vec<(&'s ProbeSpec, crate::discover::elf::Symbol)>, Vec<&'static str>), PlanError> {
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for spec in specs {
        match image.elf.function(spec.symbol) {
            Some(sym) => found.push((spec, sym.clone())),
            None if spec.required => {
                let path = image.display_path.to_owned();
                return Err(PlanError::RequiredMissing { symbol: spec.symbol, path });
            }
            None => missing.push(spec.symbol),
        }
    }
    if found.is_empty() {
        return Err(PlanError::NoProbes { path: image.display_path.to_owned() });
    }
    Ok((found, missing))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_binary() -> ElfImage {
        ElfImage::open(&std::env::current_exe().unwrap()).unwrap()
    }

    #[test]
    fn a_missing_required_symbol_fails_before_any_bpf_is_loaded() {
        let elf = test_binary();
        let path = std::path::Path::new("/usr/lib/libnotpython.so");
        let image = ImageRef::own(&elf, path);
        let py = crate::python::abi_for(1, crate::python::PythonVersion::from_hex(0x030B_07F0)).unwrap();
        let all = crate::probe::ProbeSelection::Default.select(py.probes(), "3.11.7").unwrap();
        let err = plan(image, &all, PlanOptions::default()).expect_err("no PyObject_Malloc here");
        assert_eq!(
            err.to_string(),
            "required symbol PyObject_Malloc is not in /usr/lib/libnotpython.so; this build of CPython cannot be traced (was it stripped?)"
        );
        let refs = crate::probe::ProbeSelection::Refs.select(py.probes(), "3.11.7").unwrap();
        let err = plan(image, &refs, PlanOptions::default()).expect_err("no probe symbol here");
        assert!(matches!(err, PlanError::NoProbes { .. }), "{err}");
    }
}
