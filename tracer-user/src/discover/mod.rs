//! Discovering what is traced: a live process (`--pid`) or an interpreter image and
//! every process that runs it (`--exe`), found from the process and its
//! files alone. Every command resolves its target through [`resolve`].

pub mod debuginfo;
pub mod elf;
pub mod exe;
pub mod guards;
pub mod inline;
pub mod modules;
pub mod process;
pub mod version;

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
};

use thiserror::Error;

use self::{
    elf::ElfImage,
    exe::{ExeError, Interpreter},
    modules::Module,
    process::{FileId, Target, TargetError},
    version::VersionReadError,
};
use crate::python::{self, Abi, PythonVersion, VersionError};

/// The scope of a system-wide attachment (no process has PID 0).
pub const ALL_PROCESSES: u32 = 0;

/// What to trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetSpec {
    /// One process (all its threads).
    Pid(u32),
    /// Every process running this interpreter, now or later.
    Exe(PathBuf),
}

/// A target that cannot be traced: always the user's input.
#[derive(Debug, Error)]
pub enum ResolveError {
    #[error(transparent)]
    Process(#[from] TargetError),
    #[error(transparent)]
    Exe(#[from] ExeError),
    #[error(transparent)]
    Version(#[from] VersionError),
    #[error(transparent)]
    VersionRead(#[from] VersionReadError),
    #[error(transparent)]
    DebugInfo(#[from] debuginfo::DebugInfoError),
    #[error(transparent)]
    Inline(#[from] inline::InlineError),
    #[error(transparent)]
    Guards(#[from] guards::GuardError),
}

/// A target resolved to its interpreter image, its version and the
/// modules that may call into it: what attaching, planning and the
/// benchmarks need.
#[derive(Debug)]
pub struct Resolved {
    /// `--pid`'s process, or [`ALL_PROCESSES`] with `--exe`.
    pub scope: u32,
    /// With `--exe`, the executable asked for (symlinks followed).
    pub exe: Option<PathBuf>,
    pub elf: ElfImage,
    /// The image as the target sees it.
    pub display_path: PathBuf,
    /// The same file from tracer's mount namespace.
    pub attach_path: PathBuf,
    pub version: PythonVersion,
    pub abi: &'static dyn Abi,
    /// With call sites, the modules that may call the image.
    pub modules: Vec<Module>,
    /// The identities of those modules and the image.
    pub known: HashSet<FileId>,
    /// Where `_Py_DebugOffsets` disagrees with the version module, if it
    /// does (3.13+).
    pub debug_offsets_mismatch: Option<String>,
    /// With `--pid`, the process's PID in its own PID namespace, where that
    /// differs.
    pub ns_pid: Option<u32>,
    /// What the image's DWARF says of inlined copies of the probed
    /// functions.
    pub inlining: Inlining,
}

/// What the image's DWARF says of the copies the compiler inlined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inlining {
    /// Not looked for (`--no-inlined`).
    Skipped,
    /// No DWARF was found; the copies were found by their reads of the
    /// switches that guard them (see [`guards`]).
    Guards {
        /// What to install for the DWARF, which gives what the reads do
        /// not (sizes they hide, the functions no switch guards).
        fix: String,
        scan: guards::Scan,
    },
    /// The DWARF in `source` lists, per function, each inlined copy's
    /// entry (a link-time address) and where its size is there.
    Known { source: String, entries: std::collections::HashMap<String, Vec<InlineEntry>> },
}

/// One inlined copy (or out-of-line clone) of a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InlineEntry {
    /// Its entry, a link-time address.
    pub address: u64,
    /// For an allocating function, where the requested size is there, as
    /// `count_site`'s operands (first, second, constant; see
    /// `tracer_common::site`); `None` where the DWARF does not say.
    pub size: Option<(u8, u8, u16)>,
}

/// How [`resolve`] looks for the image's DWARF.
#[derive(Clone, Copy, Debug, Default)]
pub struct DwarfLookup<'a> {
    /// Whether to look at all (not `--no-inlined`).
    pub enabled: bool,
    /// `--debug-dir`.
    pub debug_dir: Option<&'a Path>,
}

/// Resolves `spec`; with `call_sites`, also finds the modules that may call
/// the image; looks for its DWARF as `dwarf` says.
pub fn resolve(spec: &TargetSpec, call_sites: bool, dwarf: DwarfLookup<'_>) -> Result<Resolved, ResolveError> {
    // What differs: how the image and its version are found, from where its
    // files are reached, and which files already call into it.
    let mut ns_pid = None;
    let (scope, exe, elf, display_path, attach_path, root, callers, version, mismatch) = match spec {
        TargetSpec::Pid(pid) => {
            let target = Target::inspect(*pid)?;
            let source = version::Source::Process(&target);
            let version = version::read(source)?;
            let abi = python::abi_for(*pid, version)?;
            let mismatch = version::check_debug_offsets(source, abi, version);
            ns_pid = target.ns_pid;
            let Target { elf, image_path, host_path, code_files, .. } = target;
            (*pid, None, elf, image_path, host_path, process::Root::Process(*pid), code_files, version, mismatch)
        }
        TargetSpec::Exe(path) => {
            let interp = Interpreter::from_executable(path)?;
            let source = version::Source::File(&interp.elf, &interp.image);
            let abi = python::abi_for_image(&interp.image, interp.version)?;
            let mismatch = version::check_debug_offsets(source, abi, interp.version);
            // The executable calls into its libpython.
            let callers = match process::file_id(&interp.exe) {
                Some(id) if interp.exe != interp.image => vec![process::MappedFile { path: interp.exe.clone(), id }],
                _ => Vec::new(),
            };
            let Interpreter { exe, image, elf, version } = interp;
            (ALL_PROCESSES, Some(exe), elf, image.clone(), image, process::Root::Own, callers, version, mismatch)
        }
    };
    let abi = python::abi_for_image(&display_path, version)?;
    let v = (version.major, version.minor);
    let mut modules = if call_sites { modules::modules(&display_path, root, &callers, v) } else { Vec::new() };
    let mut known = modules::known_files(&attach_path, &modules);
    if call_sites && scope == ALL_PROCESSES {
        // Every file the interpreter's running processes map executable,
        // such as the third-party extension modules they imported.
        for (pid, files) in process::processes_mapping(&attach_path) {
            modules.extend(modules::new_modules(pid, &files, &mut known));
        }
    }
    let inlining = if dwarf.enabled {
        inlining(spec, (&display_path, &elf), root, abi, dwarf.debug_dir)?
    } else {
        Inlining::Skipped
    };
    Ok(Resolved {
        scope,
        exe,
        elf,
        display_path,
        attach_path,
        version,
        abi,
        modules,
        known,
        debug_offsets_mismatch: mismatch,
        ns_pid,
        inlining,
    })
}

/// What the image's DWARF says of the probed functions' inlined copies:
/// found inside the target's root, or in `debug_dir`.
fn inlining(
    spec: &TargetSpec,
    (image, elf): (&Path, &ElfImage),
    root: process::Root,
    abi: &dyn Abi,
    debug_dir: Option<&Path>,
) -> Result<Inlining, ResolveError> {
    // The image as the target names it, and its root as tracer reaches it:
    // a chroot's maps show the host path, below the chroot's directory.
    let (in_root, root_dir) = match spec {
        TargetSpec::Pid(pid) => {
            let root_dir = process::proc_root(*pid);
            let host_root = std::fs::read_link(format!("/proc/{pid}/root")).unwrap_or_else(|_| PathBuf::from("/"));
            let inside = image.strip_prefix(&host_root).map_or_else(|_| image.to_owned(), |p| Path::new("/").join(p));
            (inside, root_dir)
        }
        TargetSpec::Exe(_) => (image.to_owned(), PathBuf::from("/")),
    };
    let Some(file) = debuginfo::locate(&in_root, &root_dir, debug_dir)? else {
        let wanted: Vec<guards::Wanted<'_>> = abi
            .probes()
            .iter()
            .map(|p| guards::Wanted {
                function: p.symbol,
                guard: abi.guard(p.symbol),
                size: guards::SizeArgs::of(p.program),
            })
            .collect();
        let scan = guards::scan(elf.path(), &wanted)?;
        return Ok(Inlining::Guards { fix: debug_fix(root, abi), scan });
    };
    let data = std::fs::read(&file.path)
        .map_err(|cause| debuginfo::DebugInfoError::Read { path: file.path.clone(), cause })?;
    let wanted: Vec<inline::Wanted<'_>> = abi
        .probes()
        .iter()
        .map(|p| inline::Wanted { function: p.symbol, parameters: python::size_parameters(p.program) })
        .collect();
    // Out-of-line clones that are whole functions (.constprop, .isra) are
    // entered like inlined copies, and probed beside the symbol; the parts
    // GCC split off a function (.part, .cold) are entered from it, within
    // the same call, and are not.
    let names = function_names(&data);
    let is_clone = |address: u64| {
        names.get(&address).is_some_and(|n| {
            (n.contains(".constprop.") || n.contains(".isra.")) && !n.contains(".part.") && !n.contains(".cold")
        })
    };
    let entries = inline::find(&file.path, &data, &wanted)?
        .into_iter()
        // A function the DWARF has no DIE for is left out: its copies are
        // unknown, which coverage says.
        .filter(|f| !(f.out_of_line.is_empty() && f.inlined.is_empty()))
        .map(|f| {
            let symbol = elf.function(&f.function).map(|s| s.address);
            let clones = f.out_of_line.iter().filter(|s| Some(s.entry) != symbol && is_clone(s.entry));
            let copies = f.inlined.iter().chain(clones);
            let entries = copies.map(|s| InlineEntry { address: s.entry, size: size_operands(s) }).collect();
            (f.function, entries)
        })
        .collect();
    Ok(Inlining::Known { source: file.path.display().to_string(), entries })
}

/// The names of the functions in an ELF file's symbol table, by address.
fn function_names(data: &[u8]) -> std::collections::HashMap<u64, String> {
    use object::{Object as _, ObjectSymbol as _};
    let Ok(file) = object::File::parse(data) else { return std::collections::HashMap::new() };
    file.symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text)
        .filter_map(|s| Some((s.address(), s.name().ok()?.to_owned())))
        .collect()
}

/// Where a copy's requested size is, as `count_site`'s operands: one
/// parameter (a malloc's size, a realloc's new size) or two multiplied (a
/// calloc's), each in a register or a constant. `None` where any is
/// elsewhere (on the stack, an expression, optimised out), or when the
/// function requests no size.
fn size_operands(site: &inline::Site) -> Option<(u8, u8, u16)> {
    use tracer_common::site::{CONSTANT, NONE, register};
    let operand = |l: &inline::Location| match *l {
        inline::Location::Register(r) => register(r.dwarf()).map(|r| (r, None)),
        inline::Location::Constant(c) => u16::try_from(c).ok().map(|c| (CONSTANT, Some(c))),
        _ => None,
    };
    match site.parameters.as_slice() {
        [one] => {
            let (first, constant) = operand(&one.location)?;
            Some((first, NONE, constant.unwrap_or(0)))
        }
        [a, b] => {
            let ((first, ca), (second, cb)) = (operand(&a.location)?, operand(&b.location)?);
            match (ca, cb) {
                (Some(x), Some(y)) => u16::try_from(u32::from(x) * u32::from(y)).ok().map(|c| (CONSTANT, NONE, c)),
                (Some(c), None) => Some((second, CONSTANT, c)),
                (None, Some(c)) => Some((first, CONSTANT, c)),
                (None, None) => Some((first, second, 0)),
            }
        }
        _ => None,
    }
}

/// What to install for the debug info of the interpreter, from the
/// target's own `/etc/os-release`.
fn debug_fix(root: process::Root, abi: &dyn Abi) -> String {
    let release = root.reach(Path::new("/etc/os-release"), None).and_then(|p| std::fs::read_to_string(p).ok());
    debuginfo::debug_package(&release.unwrap_or_default(), (3, abi.minor()))
}

impl Resolved {
    /// The PID with `--pid`.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        (self.scope != ALL_PROCESSES).then_some(self.scope)
    }

    /// The image path as the target sees it.
    #[must_use]
    pub fn image(&self) -> &Path {
        &self.display_path
    }
}
