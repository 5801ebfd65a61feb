//! Where the GC probes go (`--gc`): at CPython's `gc__start` and
//! `gc__done` SystemTap markers, each with its semaphore, which the kernel
//! raises while the probe exists (the uprobe's reference counter); or, in
//! a build without them, at the collection function's entry and return,
//! where the version module says they show the same; or nowhere, and the
//! plan says why. Planning reads files only.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;
use tracer_common::{gc, site};

use crate::{
    discover::{
        elf::ElfImage,
        usdt::{self, ArgLocation, UsdtArg, UsdtError},
    },
    python::gc::{GcKnowledge, RETURN_REGISTER},
};

/// `--gc`: how collections are seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum GcMode {
    /// The markers where the build has them, else the collection function
    /// where the version module knows one, else nothing (said so).
    #[default]
    Auto,
    /// The markers, or an error.
    Markers,
    /// The collection function, even where the markers exist, or an error.
    Function,
    /// Not at all.
    Off,
}

/// Where collections are seen from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GcSource {
    /// The `gc__start` and `gc__done` markers, as USDT probes.
    Markers,
    /// The collection function's entry and return.
    Function,
    /// Nowhere: the build has neither, or `--gc off`.
    None,
    /// The interpreter's own statistics, read from its memory (the
    /// production profile; never a plan's source).
    Memory,
}

/// Which end of a collection a probe sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GcRole {
    /// Its start, with the generation.
    Start,
    /// Its end, with the objects found unreachable.
    Done,
}

/// One GC probe.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcPoint {
    pub role: GcRole,
    /// The marker's name, or the function's.
    pub name: String,
    /// The probed instruction's link-time address.
    pub address: u64,
    /// Its offset in the image file: where the uprobe goes.
    pub file_offset: u64,
    /// The file offset of the marker's semaphore, which the kernel raises
    /// by one in each traced process for as long as the probe exists;
    /// `None` where there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub semaphore: Option<u64>,
    /// A return probe of the function (its return value is the count).
    #[serde(default, rename = "return", skip_serializing_if = "std::ops::Not::not")]
    pub ret: bool,
    /// Where its argument is: the marker's spec (`-4@112(%rsp)`), or the
    /// function's register.
    pub argument: String,
    /// Whether the kernel emulates the probed instruction (else it
    /// single-steps it).
    pub emulated: bool,
    /// The BPF cookie: where the program reads the argument.
    #[serde(skip)]
    pub cookie: u64,
}

/// The GC part of a plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcPlan {
    pub source: GcSource,
    /// What is probed, in words, or why nothing is.
    pub detail: String,
    /// Where a call of the function is not always one collection as the
    /// markers would see it: what the counts then hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caveat: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub points: Vec<GcPoint>,
}

impl GcPlan {
    /// No GC probes, for `why`.
    #[must_use]
    pub fn none(why: impl Into<String>) -> Self {
        Self { source: GcSource::None, detail: why.into(), caveat: None, points: Vec::new() }
    }
}

/// A GC plan that cannot work for this image: the user's input (`--gc`),
/// or an image whose markers tracer cannot read.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum GcPlanError {
    #[error(
        "--gc markers: {path} has no python:gc__start and python:gc__done markers (CPython built without --with-dtrace); use --gc auto, which falls back to the collection function where tracer knows one"
    )]
    NoMarkers { path: PathBuf },
    #[error("--gc function: {why}; use --gc auto")]
    NoFunction { why: String },
    #[error(transparent)]
    Notes(#[from] UsdtError),
    #[error("{path}: {what} at {address:#x} is in no file-backed segment, so it cannot be probed")]
    NotInFile { path: PathBuf, what: String, address: u64 },
}

impl crate::error::Classify for GcPlanError {
    /// What the user asked for (`--gc markers` or `function` on a build
    /// that lacks it), as opposed to an image tracer cannot read.
    fn is_bad_input(&self) -> bool {
        match self {
            Self::NoMarkers { .. } | Self::NoFunction { .. } => true,
            Self::Notes(_) | Self::NotInFile { .. } => false,
        }
    }
}

/// The image to plan GC probes for.
#[derive(Clone, Copy, Debug)]
pub struct GcImage<'a> {
    pub elf: &'a ElfImage,
    /// The image as the target sees it, for messages.
    pub display_path: &'a Path,
    /// Its bytes are read from here.
    pub attach_path: &'a Path,
    /// `Python X.Y.Z`, for messages.
    pub version: &'a str,
    /// Its debug info, where found: the collection function of a stripped
    /// image is looked for in its DWARF.
    pub debug: Option<&'a Path>,
}

/// Plans the GC probes of `image` as `mode` says, with what tracer knows of
/// its version's collector (`None`: nothing).
pub fn plan(image: GcImage<'_>, knowledge: Option<&GcKnowledge>, mode: GcMode) -> Result<GcPlan, GcPlanError> {
    if mode == GcMode::Off {
        return Ok(GcPlan::none("--gc off: garbage collections are not traced"));
    }
    let Some(k) = knowledge else {
        return Ok(GcPlan::none(format!("tracer knows nothing of the collector of Python {}", image.version)));
    };
    let data = std::fs::read(image.attach_path).map_err(|e| UsdtError::Notes {
        path: image.display_path.to_owned(),
        why: format!("the file cannot be read: {e}"),
    })?;
    let notes = usdt::notes(image.display_path, &data)?;
    let of = |name: &str| notes.iter().filter(|n| n.provider == k.provider && n.name == name).collect::<Vec<_>>();
    let (starts, dones) = (of(k.start), of(k.done));
    let has_markers = !starts.is_empty() && !dones.is_empty();
    let path = image.display_path.display();
    if has_markers && mode != GcMode::Function {
        let mut points = Vec::new();
        for (role, notes) in [(GcRole::Start, &starts), (GcRole::Done, &dones)] {
            for note in notes {
                match marker_point(image, role, note) {
                    Ok(point) => points.push(point),
                    // Asked for by name, the markers must work; otherwise
                    // the run goes on without GC, saying why.
                    Err(e) if mode == GcMode::Markers => return Err(e),
                    Err(e) => return Ok(GcPlan::none(format!("{e}: garbage collections are not reported"))),
                }
            }
        }
        let detail = format!(
            "the {p}:{s} and {p}:{d} markers in {path} ({} and {} sites), as USDT probes; the kernel raises their semaphores while they are attached",
            starts.len(),
            dones.len(),
            p = k.provider,
            s = k.start,
            d = k.done,
        );
        return Ok(GcPlan { source: GcSource::Markers, detail, caveat: None, points });
    }
    if mode == GcMode::Markers {
        return Err(GcPlanError::NoMarkers { path: image.display_path.to_owned() });
    }
    let no_markers = format!(
        "{path} has no {}:{} and {}:{} markers (built without --with-dtrace)",
        k.provider, k.start, k.provider, k.done
    );
    let unavailable = |reason: String| {
        if mode == GcMode::Function {
            return Err(GcPlanError::NoFunction { why: format!("{path}: {reason}") });
        }
        Ok(GcPlan::none(format!("{no_markers}, and {reason}: garbage collections are not reported")))
    };
    let Some(f) = k.function else {
        return unavailable(format!(
            "tracer knows no collection function of Python {} whose entry and return give the generation and the objects collected",
            image.version
        ));
    };
    let (address, file_offset, found) = match (image.elf.function(f.symbol), image.debug) {
        (Some(sym), _) => (sym.address, sym.file_offset, "by its symbol".to_owned()),
        (None, None) => return unavailable(format!("{} is not in its symbols (stripped?)", f.symbol)),
        (None, Some(debug)) => match in_dwarf(image, debug, &f) {
            Ok((address, offset)) => (address, offset, format!("found by its DWARF in {}", debug.display())),
            Err(why) => return unavailable(format!("{} is not in its symbols (stripped?), and {why}", f.symbol)),
        },
    };
    let code = image.elf.read_at(file_offset, 16).map_err(|e| UsdtError::Notes {
        path: image.display_path.to_owned(),
        why: format!("the code of {} cannot be read: {e}", f.symbol),
    })?;
    if let Err(why) = super::placement::probeable(&code) {
        return unavailable(format!("{}'s entry cannot be probed: {why}", f.symbol));
    }
    let emulated = emulated_at(&code, super::placement::running_kernel());
    let point = |role, ret, argument: &str, cookie| GcPoint {
        role,
        name: f.symbol.to_owned(),
        address,
        file_offset,
        semaphore: None,
        ret,
        argument: argument.to_owned(),
        emulated,
        cookie,
    };
    let register = |n| site::register(n).unwrap_or(site::NONE);
    let start = gc::arg_cookie(register(f.generation_register), 4, true, 0);
    let done = gc::arg_cookie(register(RETURN_REGISTER), 8, true, 0);
    let points = vec![
        point(GcRole::Start, false, "%esi at its entry (int generation)", start),
        point(GcRole::Done, true, "%rax at its return (Py_ssize_t: the objects found unreachable)", done),
    ];
    let how = format!("{}'s entry (the generation) and return (the objects found unreachable), {found}", f.symbol);
    let detail = if has_markers {
        format!("{how} (--gc function; {path} has the markers too)")
    } else {
        format!("{no_markers}: {how}")
    };
    Ok(GcPlan { source: GcSource::Function, detail, caveat: f.caveat.map(str::to_owned), points })
}

/// Where the collection function `f` is, by the DWARF in `debug`, for an
/// image whose symbols lack it (an LTO build names it
/// `gc_collect_main.lto_priv.0` in its debug file): its one out-of-line
/// copy whose `generation` parameter is, at its entry, in the register
/// `f` says (a clone GCC made with other parameters is not). A function
/// the compiler also inlined is refused: probes at the copy would miss the
/// collections run through the inlined code.
fn in_dwarf(image: GcImage<'_>, debug: &Path, f: &crate::python::gc::GcFunction) -> Result<(u64, u64), String> {
    use crate::discover::inline;
    let data = std::fs::read(debug).map_err(|e| format!("its debug info {} cannot be read: {e}", debug.display()))?;
    let wanted = [inline::Wanted { function: f.symbol, parameters: &["generation"] }];
    let found = inline::find(debug, &data, &wanted).map_err(|e| e.to_string())?;
    let sites = found.iter().find(|s| s.function == f.symbol);
    let Some(sites) = sites.filter(|s| !s.out_of_line.is_empty()) else {
        return Err(format!("its DWARF in {} has no code for it", debug.display()));
    };
    if !sites.inlined.is_empty() {
        return Err(format!(
            "its DWARF in {} lists {} copies of it inlined elsewhere, whose collections probes at the function would miss",
            debug.display(),
            sites.inlined.len()
        ));
    }
    let shaped: Vec<&inline::Site> = sites
        .out_of_line
        .iter()
        .filter(|s| {
            s.parameters.iter().any(|p| {
                p.name == "generation"
                    && matches!(p.location, inline::Location::Register(r) if r.dwarf() == f.generation_register)
            })
        })
        .collect();
    let [site] = shaped.as_slice() else {
        return Err(format!(
            "its DWARF in {} has {} copies of it with `generation` in %esi at their entry, not one",
            debug.display(),
            shaped.len()
        ));
    };
    let offset = image
        .elf
        .file_offset(site.entry)
        .ok_or_else(|| format!("its entry {:#x} (by its DWARF) is in no file-backed segment", site.entry))?;
    Ok((site.entry, offset))
}

/// The probe of one marker site.
fn marker_point(image: GcImage<'_>, role: GcRole, note: &usdt::UsdtNote) -> Result<GcPoint, GcPlanError> {
    let arg_err = |spec: &str, why: String| {
        UsdtError::Argument(Box::new(usdt::BadArgument {
            path: image.display_path.to_owned(),
            provider: note.provider.clone(),
            name: note.name.clone(),
            address: note.address,
            spec: spec.to_owned(),
            why,
        }))
    };
    let args = usdt::parse_args(&note.args).map_err(|(spec, why)| arg_err(&spec, why))?;
    let arg = args.first().ok_or_else(|| arg_err("", "the marker has no argument".to_owned()))?;
    let spec = note.args.split_whitespace().next().unwrap_or_default();
    let cookie = cookie(arg).map_err(|why| arg_err(spec, why))?;
    let in_file = |what: String, address| {
        image.elf.file_offset(address).ok_or_else(|| GcPlanError::NotInFile {
            path: image.display_path.to_owned(),
            what,
            address,
        })
    };
    let file_offset = in_file(format!("marker {}", note.name), note.address)?;
    let semaphore = match note.semaphore {
        0 => None,
        address => Some(in_file(format!("the semaphore of marker {}", note.name), address)?),
    };
    let code = image.elf.read_at(file_offset, 16).unwrap_or_default();
    Ok(GcPoint {
        role,
        name: note.name.clone(),
        address: note.address,
        file_offset,
        semaphore,
        ret: false,
        argument: spec.to_owned(),
        emulated: emulated_at(&code, super::placement::running_kernel()),
        cookie,
    })
}

/// The cookie that tells the GC programs where `arg` is.
fn cookie(arg: &UsdtArg) -> Result<u64, String> {
    let (first, constant) = match arg.location {
        ArgLocation::Register(n) => (site::register(n).ok_or(format!("register {n} is out of range"))?, 0),
        ArgLocation::Constant(value) => {
            let fits = i16::try_from(value).map_err(|_| format!("the constant {value} does not fit 16 bits"))?;
            (site::CONSTANT, fits.cast_unsigned())
        }
        ArgLocation::Memory { base, offset } => {
            site::memory(base, offset).ok_or(format!("the offset {offset} does not fit 16 bits"))?
        }
    };
    Ok(gc::arg_cookie(first, arg.size, arg.signed, constant))
}

/// Whether the kernel emulates the instruction that starts `code`.
fn emulated_at(code: &[u8], kernel: super::placement::KernelVersion) -> bool {
    use iced_x86::{Decoder, DecoderOptions};
    let len = Decoder::new(64, code, DecoderOptions::NONE).decode().len();
    code.get(..len).is_some_and(|insn| super::placement::emulated(insn, kernel).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image<'a>(elf: &'a ElfImage, path: &'a Path) -> GcImage<'a> {
        GcImage { elf, display_path: path, attach_path: path, version: "3.11.2", debug: None }
    }

    const V311: GcKnowledge = crate::python::gc::markers(
        Some(crate::python::gc::GcFunction {
            symbol: "gc_collect_main",
            generation_register: crate::python::gc::SECOND_ARGUMENT,
            caveat: None,
        }),
        crate::python::gc::GcStateLayout { interp_gc: 648, generation_stats: 128, caveat: None },
    );

    /// Debian's python3.11: one site of each marker, each with its
    /// semaphore, read where its note says.
    #[test]
    fn debian_python_is_traced_at_its_markers() {
        let path = Path::new("/usr/bin/python3.11");
        let elf = ElfImage::open(path).expect("Debian's python3.11 (run `cargo xtask setup`)");
        let plan = plan(image(&elf, path), Some(&V311), GcMode::Auto).expect("a plan");
        assert_eq!(plan.source, GcSource::Markers, "{plan:?}");
        let roles: Vec<GcRole> = plan.points.iter().map(|p| p.role).collect();
        assert_eq!(roles, [GcRole::Start, GcRole::Done], "{plan:?}");
        for p in &plan.points {
            assert!(p.semaphore.is_some() && p.emulated, "{p:?}");
            let (size, signed) = tracer_common::gc::arg_width(p.cookie);
            assert!((size == 4 || size == 8) && signed, "{p:?}");
        }
        let err = super::plan(image(&elf, path), Some(&V311), GcMode::Function).expect_err("no symbols");
        assert_eq!(
            err.to_string(),
            "--gc function: /usr/bin/python3.11: gc_collect_main is not in its symbols (stripped?); use --gc auto"
        );
        let off = super::plan(image(&elf, path), Some(&V311), GcMode::Off).expect("a plan");
        assert_eq!((off.source, off.points.len()), (GcSource::None, 0));
    }

    /// An image with neither markers nor the function (tracer's own test
    /// binary) says so, and `--gc markers` refuses it.
    #[test]
    fn without_markers_or_function_it_says_so() {
        let exe = std::env::current_exe().expect("the test binary");
        let elf = ElfImage::open(&exe).expect("ELF");
        let plan = plan(image(&elf, &exe), Some(&V311), GcMode::Auto).expect("a plan");
        assert_eq!(
            plan,
            GcPlan::none(format!(
                "{} has no python:gc__start and python:gc__done markers (built without --with-dtrace), and gc_collect_main is not in its symbols (stripped?): garbage collections are not reported",
                exe.display()
            ))
        );
        let err = super::plan(image(&elf, &exe), Some(&V311), GcMode::Markers).expect_err("no markers");
        assert!(matches!(err, GcPlanError::NoMarkers { .. }), "{err}");
        let none = crate::python::gc::markers(None, V311.state);
        let plan = super::plan(image(&elf, &exe), Some(&none), GcMode::Auto).expect("a plan");
        assert!(plan.detail.contains("tracer knows no collection function of Python 3.11.2"), "{plan:?}");
    }

    #[test]
    fn cookies_say_where_the_argument_is() {
        let arg = usdt::parse_arg("-4@112(%rsp)").expect("parses");
        let c = cookie(&arg).expect("fits");
        assert_eq!(
            (site::first(c), site::offset(site::constant(c)), gc::arg_width(c)),
            (site::MEMORY + 8, 112, (4, true))
        );
        let c = cookie(&usdt::parse_arg("-4@$-1").expect("parses")).expect("fits");
        assert_eq!((site::first(c), site::offset(site::constant(c))), (site::CONSTANT, -1));
        assert!(cookie(&usdt::parse_arg("-8@$100000").expect("parses")).is_err());
        assert!(cookie(&usdt::parse_arg("-8@40000(%rbp)").expect("parses")).is_err());
    }
}
