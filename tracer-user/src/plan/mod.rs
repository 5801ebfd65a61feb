//! The attach plan: which functions of the image are probed, where in
//! each (placement, or at their call sites), and how return values are read.
//! Planning reads files only; [`crate::kernel`] turns a plan into uprobes.

pub mod callsites;
pub mod coverage;
pub mod gc;
pub mod native;
pub mod placement;
pub mod returns;

use std::path::{Path, PathBuf};

use thiserror::Error;

use self::{
    callsites::CallSites,
    coverage::{Completeness, Coverage},
    placement::Placement,
    returns::{ReturnCosts, ReturnPlan},
};
pub use crate::discover::{InlineEntry, Inlining};
use crate::discover::{copies, guards};
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

/// Where uprobes go in each function.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PlacementMode {
    /// At the first instruction the kernel emulates, when that counts the
    /// same calls (see [`placement`]).
    #[default]
    Auto,
    /// At the function's first instruction.
    Entry,
    /// As `Auto`, except that a function whose probe would be
    /// single-stepped is probed at every call to it, when that sees every
    /// call (see [`callsites`]).
    CallSites,
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
}

impl HitCosts {
    /// The cost of one hit of a probe placed on an emulated instruction or
    /// not.
    #[must_use]
    pub const fn of(&self, emulated: bool) -> f64 {
        if emulated { self.emulated_ns } else { self.single_stepped_ns }
    }
}

/// One probed inlined copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    /// Offset in the image file of the function's entry.
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
        let place = match (spec.kind, code, options.placement) {
            (ProbeKind::Function, Ok(code), PlacementMode::Entry) => {
                placement::at_entry_of(&code, sym.address, kernel, "entry (--placement entry)")
            }
            (ProbeKind::Function, Ok(code), PlacementMode::Auto | PlacementMode::CallSites) => {
                place_with_live(&code, sym.address, (program, options.live.then(|| live_role(spec)).flatten()), kernel)
            }
            (ProbeKind::Function, Err(e), _) => Placement::at_entry(format!("entry: the code could not be read ({e})")),
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
        let (mut inline_sites, mut unprobed) = inline_sites(image, spec.symbol, kernel);
        // pyenv's 3.13.0 has no DWARF for `_Py_NewReferenceNoTotal`'s
        // code, whose read of the reference tracer is then taken for a copy
        // of `_Py_NewReference`: counted there, unless it is probed itself.
        let before = inline_sites.len();
        inline_sites
            .retain(|s| !own_code.iter().any(|(other, code)| *other != spec.symbol && code.contains(&s.offset)));
        let others = before - inline_sites.len();
        let inline_sites = if options.inlined {
            inline_sites
        } else {
            if !inline_sites.is_empty() {
                unprobed.push(format!("{} skipped with --no-inlined", inline_sites.len()));
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
        let live = options.live.then(|| live_role(spec)).flatten();
        if live.is_some() {
            live_coverage(&mut coverage, &inline_sites, !image.implementations.is_empty());
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
    Ok(Plan { probes, missing, display_path, attach_path, live_impls, live_fix: live_fix(image.inlining) })
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

/// What gives the allocator implementations where none was found.
fn live_fix(inlining: Option<&Inlining>) -> String {
    match inlining {
        Some(Inlining::Guards { fix, .. }) => format!("the interpreter's debug info ({fix})"),
        Some(Inlining::Skipped) => "drop --no-inlined, which also skips the debug file".to_owned(),
        _ => "the interpreter's debug info, or pass its debug file's directory with --debug-dir".to_owned(),
    }
}

/// With `--live`, the allocator implementations to probe, in slots after
/// `probes`'. Every one gets its return probed, frees too: its frame must
/// end for a later call on the thread to be paired right.
fn live_impls(
    image: ImageRef<'_>,
    probes: &[PlannedProbe],
    costs: Option<&ReturnCosts>,
    kernel: placement::KernelVersion,
) -> Vec<LiveImpl> {
    let first = u32::try_from(probes.len()).unwrap_or(u32::MAX);
    (first..)
        .zip(image.implementations)
        .map(|(slot, i)| {
            let len = usize::try_from(i.size.min(MAX_FUNCTION)).unwrap_or(0);
            let code = image.elf.read_at(i.file_offset, len);
            let placement = match &code {
                Ok(code) => placement::place(code, i.address, Program::LiveImpl, kernel),
                Err(e) => Placement::at_entry(format!("entry: the code could not be read ({e})")),
            };
            let returns = match (costs, code) {
                // A uretprobe goes where live_impl traps, so its
                // breakpoint is free: as at offset 0 for a counting probe.
                (Some(costs), Ok(code)) if i.size <= MAX_FUNCTION => {
                    returns::plan(&code, i.address, 0, costs, (kernel, true))
                }
                (None, _) => ReturnPlan::Uretprobe { reason: "no return costs measured".to_owned() },
                (_, Ok(_)) => ReturnPlan::Uretprobe { reason: format!("the function is over {MAX_FUNCTION} bytes") },
                (_, Err(e)) => ReturnPlan::Uretprobe { reason: format!("the code could not be read ({e})") },
            };
            LiveImpl {
                name: i.name,
                slot,
                file_offset: i.file_offset,
                role: i.role.implementation(),
                returns,
                placement,
            }
        })
        .collect()
}

/// The inlined copies of `symbol` that can be probed, and why each of the
/// others cannot.
fn inline_sites(image: ImageRef<'_>, symbol: &str, kernel: placement::KernelVersion) -> (Vec<InlineSite>, Vec<String>) {
    let mut sites: Vec<InlineSite> = Vec::new();
    let mut unprobed = Vec::new();
    // Each copy with the points it may be probed at, the first preferred
    // unless a later one is emulated.
    let copies: Vec<Vec<InlineEntry>> = match image.inlining {
        Some(Inlining::Known { entries, .. }) => entries.get(symbol).cloned().unwrap_or_default(),
        Some(Inlining::Guards { scan, .. }) => match scan.functions.get(symbol) {
            Some(Ok(found)) => found.sites.iter().map(copies::guard_points).collect(),
            _ => Vec::new(),
        },
        _ => Vec::new(),
    };
    for points in copies {
        let code = |entry: &InlineEntry| {
            let offset = image.elf.file_offset(entry.address).ok_or("is in no file-backed segment".to_owned())?;
            let code = image.elf.read_at(offset, 16).map_err(|e| e.to_string())?;
            placement::probeable(&code)?;
            Ok::<_, String>(InlineSite {
                offset,
                size: entry.size,
                object: entry.object,
                emulated: emulated_at(&code, kernel),
            })
        };
        // The first point that can be probed, or a later one the kernel
        // emulates where the size (if the first has one) is still known.
        let mut why = None;
        let mut probeable =
            points.iter().filter_map(|p| code(p).map_err(|e| why = why.take().or(Some((p.address, e)))).ok());
        let Some(first) = probeable.next() else {
            if let Some((address, why)) = why {
                unprobed.push(format!("{address:#x}: {why}"));
            }
            continue;
        };
        let better = if first.emulated {
            None
        } else {
            probeable.find(|p| {
                p.emulated
                    && (first.size.is_none() || p.size.is_some())
                    && (first.object.is_none() || p.object.is_some())
            })
        };
        sites.push(better.unwrap_or(first));
    }
    sites.sort_unstable_by_key(|s| s.offset);
    sites.dedup_by_key(|s| s.offset);
    (sites, unprobed)
}

/// Whether the kernel emulates the instruction that starts `code`.
fn emulated_at(code: &[u8], kernel: placement::KernelVersion) -> bool {
    use iced_x86::{Decoder, DecoderOptions};
    let len = Decoder::new(64, code, DecoderOptions::NONE).decode().len();
    code.get(..len).is_some_and(|insn| placement::emulated(insn, kernel).is_some())
}

/// What `spec`'s probe covers, with `probed` of its inlined copies probed
/// and `unprobed` saying why the rest are not.
fn coverage(
    image: ImageRef<'_>,
    spec: &ProbeSpec,
    sites: &[InlineSite],
    unprobed: &[String],
    returns: bool,
) -> Coverage {
    let probed = sites.len();
    let sizeless = sites.iter().filter(|s| s.size.is_none()).count();
    let measures_bytes = spec.program.counts_bytes();
    let mut c = Coverage {
        source: "symbols".to_owned(),
        out_of_line: 1,
        inlined: None,
        inlined_probed: probed,
        other_entries: None,
        call_sites: 0,
        calls: Completeness::Complete,
        bytes: if measures_bytes { Completeness::Complete } else { Completeness::None },
        types: None,
        live: None,
        reason: None,
        fix: None,
        cross_check: None,
    };
    match image.inlining {
        // tracer's own code: nothing is inlined that it would count.
        None => {}
        Some(Inlining::Skipped) => {
            c.calls = Completeness::Partial;
            if measures_bytes {
                c.bytes = Completeness::Partial;
            }
            c.reason = Some(format!("--no-inlined: copies of {} the compiler inlined are not probed", spec.symbol));
            c.fix = Some("drop --no-inlined".to_owned());
        }
        Some(Inlining::Guards { fix, scan }) => guard_coverage(&mut c, (image, spec), (fix, scan), sites, unprobed),
        Some(Inlining::Known { source, entries, cross_check, entered }) => {
            c.source.clone_from(source);
            c.cross_check = cross_check.get(spec.symbol).cloned();
            let Some(listed) = entries.get(spec.symbol).map(Vec::len) else {
                // The DWARF does not describe it: copies it may have are
                // unknown.
                c.calls = Completeness::Partial;
                if measures_bytes {
                    c.bytes = Completeness::Partial;
                }
                c.reason =
                    Some(format!("{source} does not describe {}, so its inlined copies are unknown", spec.symbol));
                return c;
            };
            c.inlined = Some(listed);
            let entered = entered.get(spec.symbol);
            c.other_entries = entered.map(|e| e.other).filter(|&n| n > 0);
            let mut unprobed = unprobed.to_vec();
            if let Some(starts) = entered.map(|e| &e.ambiguous).filter(|a| !a.is_empty()) {
                unprobed.push(format!(
                    "{} places where control enters a copy's code both from an entry and around every entry ({}): a probe there could count a call twice, and the calls that enter there are not counted",
                    starts.len(),
                    starts.iter().take(3).map(|a| format!("{a:#x}")).collect::<Vec<_>>().join(", ")
                ));
            }
            if let Some(entries) = entered.map(|e| &e.unchecked).filter(|u| !u.is_empty()) {
                unprobed.push(format!(
                    "{} copies lie in no function of the symbol table ({}): their code is not decoded, so places that enter them past their entry, if any, are not counted",
                    entries.len(),
                    entries.iter().take(3).map(|a| format!("{a:#x}")).collect::<Vec<_>>().join(", ")
                ));
            }
            if !unprobed.is_empty() {
                c.calls = Completeness::Partial;
                if measures_bytes {
                    c.bytes = Completeness::Partial;
                }
                c.reason = Some(format!("inlined copies not probed: {}", unprobed.join("; ")));
                if unprobed.iter().any(|u| u.contains("--no-inlined")) {
                    c.fix = Some("drop --no-inlined".to_owned());
                }
            }
            let mut why = Vec::new();
            if measures_bytes && sizeless > 0 {
                c.bytes = Completeness::Partial;
                why.push(format!(
                    "neither the DWARF nor the code shows where the size is at {sizeless} of the {probed} inlined copies (their calls are counted, their bytes are not)"
                ));
            }
            if measures_bytes && returns && probed > 0 {
                why.push(format!(
                    "return values are read at the out-of-line function only, not at its {probed} inlined copies"
                ));
            }
            if !why.is_empty() {
                let why = why.join("; ");
                c.reason = Some(c.reason.map_or(why.clone(), |r| format!("{r}; {why}")));
            }
        }
    }
    c
}

/// Where `program` goes in the function whose code is `code`; with a live
/// role (`--live`), `live_alloc` (`live_free`) shares that breakpoint and
/// reads the call's arguments, so a place where they are gone is the
/// entry's for both. An allocation's counting program reads the same
/// arguments (the role follows from it); a free's reads none, and
/// `live_free` reads the block.
fn place_with_live(
    code: &[u8],
    address: u64,
    (program, live): (Program, Option<tracer_common::live::Role>),
    kernel: placement::KernelVersion,
) -> Placement {
    let place = placement::place(code, address, program, kernel);
    if live.is_none_or(|role| role.api() != tracer_common::live::Role::FREE) {
        return place;
    }
    let theirs = placement::place(code, address, Program::LiveFree, kernel);
    if theirs.offset < place.offset { theirs } else { place }
}

/// With `--live`, what probe `spec` does in the live table
/// (`tracer_common::live::Role`), if anything.
fn live_role(spec: &ProbeSpec) -> Option<tracer_common::live::Role> {
    use tracer_common::live::Role;
    let family = crate::python::family(spec.symbol)?;
    match spec.program {
        Program::SizeArg0 => Some(Role::MALLOC),
        Program::Calloc => Some(Role::CALLOC),
        Program::SizeArg1 => Some(Role::REALLOC),
        Program::CountCall if spec.symbol.ends_with("_Free") => Some(Role::free_of(family as u32)),
        _ => None,
    }
}

/// With `--live`, whether the live table sees every call's block. A call
/// is seen when it calls an allocator implementation, whose return is
/// probed; without the implementations (no symbols), none is. At an
/// inlined copy that runs the default allocator inlined (LTO's
/// devirtualised pymalloc) no implementation is called: their blocks are
/// predicted from pymalloc's state where it can be, else counted as unseen
/// while tracer runs, so the coverage can only say that copies may be
/// missed.
fn live_coverage(c: &mut Coverage, sites: &[InlineSite], implementations: bool) {
    let partial = c.calls == Completeness::Partial || !sites.is_empty() || !implementations;
    c.live = Some(if partial { Completeness::Partial } else { Completeness::Complete });
    let why = if !implementations {
        Some("live memory: the allocator implementations (_PyObject_Malloc, ...) are not in the image's symbols and no debug file gives them, so no block is tracked".to_owned())
    } else if !sites.is_empty() {
        Some(format!(
            "live memory: its {} inlined copies are seen where they call an allocator implementation; where they run the default allocator inlined (LTO), their blocks are read from pymalloc's state at the copy where it is found and the copy shows the size (and a realloc's block), else they are not tracked and are counted as unseen",
            sites.len()
        ))
    } else {
        None
    };
    if let Some(why) = why {
        c.reason = Some(c.reason.take().map_or(why.clone(), |r| format!("{r}; {why}")));
    }
}

/// With `--types`, whether every probed call also counts its object's type
/// (at a new reference: its creation; at the object domain's free: its
/// destruction): not where calls are partial, nor at copies where neither
/// the DWARF nor the code shows where the object (`what`) is.
fn types_coverage(c: &mut Coverage, sites: &[InlineSite], what: &str, counted: &str) {
    let objectless = sites.iter().filter(|s| s.object.is_none()).count();
    c.types = Some(if c.calls == Completeness::Partial || objectless > 0 {
        Completeness::Partial
    } else {
        Completeness::Complete
    });
    if objectless > 0 {
        let why = format!(
            "neither the DWARF nor the code shows where {what} at {objectless} of the {} inlined copies (their calls are counted, their {counted} are not)",
            sites.len()
        );
        c.reason = Some(c.reason.take().map_or(why.clone(), |r| format!("{r}; {why}")));
    }
}

/// [`coverage`] of copies found by the reads of their switches, with no
/// DWARF: `c` starts complete.
fn guard_coverage(
    c: &mut Coverage,
    (image, spec): (ImageRef<'_>, &ProbeSpec),
    (fix, scan): (&str, &guards::Scan),
    sites: &[InlineSite],
    unprobed: &[String],
) {
    let probed = sites.len();
    let measures_bytes = spec.program.counts_bytes();
    c.source = format!("reads of its guard in {} (no debug info)", scan.path.display());
    let mut why = Vec::new();
    match scan.functions.get(spec.symbol) {
        Some(Ok(found)) => {
            c.inlined = Some(found.sites.len());
            if !found.unclassified.is_empty() {
                c.calls = Completeness::Partial;
                why.push(format!(
                    "{} reads of {} could not be told creation or destruction and are not counted",
                    found.unclassified.len(),
                    found.guard
                ));
            }
            if !unprobed.is_empty() {
                c.calls = Completeness::Partial;
                why.push(format!("copies not probed: {}", unprobed.join("; ")));
            }
            if found.undecodable > 0 {
                c.calls = Completeness::Partial;
                why.push(format!(
                    "{} reads of {} are in code tracer could not decode from its start, and are not probed",
                    found.undecodable, found.guard
                ));
            }
            let sizeless = sites.iter().filter(|s| s.size.is_none()).count();
            if measures_bytes && (sizeless > 0 || c.calls == Completeness::Partial) {
                c.bytes = Completeness::Partial;
                if sizeless > 0 {
                    why.push(format!(
                        "the code does not show the size at {sizeless} of the {probed} copies found by their reads of {} (their calls are counted, their bytes are not)",
                        found.guard
                    ));
                }
            }
        }
        not_found => {
            c.calls = Completeness::Partial;
            if measures_bytes {
                c.bytes = Completeness::Partial;
            }
            let cause = match not_found {
                Some(Err(guards::NotFound::Unrecognised(how))) => {
                    format!("its code is not what tracer knows: {how}")
                }
                _ => "no runtime switch guards every copy".to_owned(),
            };
            why.push(format!(
                "no debug info found for {}, so the copies of {} that the compiler inlined (an LTO build inlines it widely) cannot be found ({cause}); calls through them are not counted",
                image.display_path.display(),
                spec.symbol
            ));
        }
    }
    if !why.is_empty() {
        c.reason = Some(why.join("; "));
        c.fix = Some(fix.to_owned());
    }
}

/// Moves each probe that would be single-stepped to its function's call
/// sites, where those see every call; the rest keep their placement, with
/// the reason added.
fn place_at_call_sites(image: ImageRef<'_>, probes: &mut [PlannedProbe], kernel: placement::KernelVersion) {
    let stepped: Vec<usize> = (0..probes.len()).filter(|&i| !probes[i].placement.emulated).collect();
    if stepped.is_empty() {
        return;
    }
    let names: Vec<&str> = stepped.iter().map(|&i| probes[i].symbol).collect();
    let defined: Vec<Option<u64>> = names.iter().map(|n| image.elf.function(n).map(|s| s.address)).collect();
    let own = Module { display_path: image.display_path.to_owned(), attach_path: image.attach_path.to_owned() };
    let plans = callsites::plan(&own, &names, &defined, image.modules, kernel);
    for (&i, plan) in stepped.iter().zip(plans) {
        let probe = &mut probes[i];
        match plan {
            Ok(sites) => {
                probe.placement = Placement {
                    offset: 0,
                    instruction: format!("{} calls", sites.emulated + sites.stepped),
                    emulated: sites.stepped == 0,
                    reason: sites.describe(),
                };
                probe.call_sites = Some(sites);
            }
            Err(why) => probe.placement.reason = format!("{}; not at its call sites: {why}", probe.placement.reason),
        }
    }
}

/// The call sites a module mapped after the attach holds for the probes at
/// their call sites: per such probe's slot, what was found there. A file
/// that is not ELF holds none.
#[must_use]
pub fn late_call_sites(plan: &Plan, data: &[u8]) -> Vec<(u32, callsites::Found)> {
    let moved: Vec<&PlannedProbe> = plan.probes.iter().filter(|p| p.call_sites.is_some()).collect();
    let names: Vec<&str> = moved.iter().map(|p| p.symbol).collect();
    let kernel = placement::running_kernel();
    let Ok(found) = callsites::scan(data, &names, &vec![None; names.len()], kernel) else { return Vec::new() };
    moved
        .iter()
        .zip(found)
        .filter(|(_, f)| !(f.emulated.is_empty() && f.stepped.is_empty() && f.escapes == 0))
        .map(|(p, f)| (p.slot, f))
        .collect()
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
