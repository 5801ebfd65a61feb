//! Discovering what is traced: a live process (`--pid`) or an interpreter image and
//! every process that runs it (`--exe`), found from the process and its
//! files alone. Every command resolves its target through [`resolve`].

pub mod copies;
pub mod debuginfo;
pub mod elf;
pub mod entries;
pub mod exe;
pub mod growth;
pub mod guards;
pub mod impls;
pub mod inline;
pub mod landings;
pub mod libc;
pub mod line;
pub mod modules;
pub mod name;
pub mod process;
pub mod pymalloc;
pub mod usdt;
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

impl std::fmt::Display for TargetSpec {
    /// As messages and titles name it: `PID 1234`, or the executable.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pid(pid) => write!(f, "PID {pid}"),
            Self::Exe(exe) => write!(f, "{}", exe.display()),
        }
    }
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
    Elf(#[from] elf::ElfError),
}

impl crate::error::Classify for ResolveError {
    /// The target named is not one tracer can trace, or not as found.
    fn is_bad_input(&self) -> bool {
        true
    }
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
    /// The allocator implementations found (by the image's symbols, or its
    /// debug file's), for `--live`.
    pub implementations: Vec<impls::Implementation>,
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
    Known {
        source: String,
        /// Per function, its copies: those the DWARF lists, then the reads
        /// of its switch in none of them (LTO's DWARF leaves some inlined
        /// copies out).
        entries: std::collections::HashMap<String, Vec<Points>>,
        /// Per function a switch guards: where the DWARF's copies and the
        /// reads of the switch disagree.
        cross_check: std::collections::HashMap<String, guards::CrossCheck>,
        /// Per function, the other entries of its copies found in the
        /// code (see [`entries`]).
        entered: std::collections::HashMap<String, Entered>,
    },
}

/// The places a function's copies are entered past their entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entered {
    /// How many other entries are probed (counted in the function's
    /// entries).
    pub other: usize,
    /// Where control comes in both from an entry and around every entry:
    /// not probed.
    pub ambiguous: Vec<u64>,
    /// The entries of copies probed at their entry that lie in no function
    /// of the symbol table (or with none to read): their code is not
    /// decoded, so other ways into them are not known.
    pub unchecked: Vec<u64>,
}

/// Where one copy of a function may be probed: each point counts every
/// call of the copy once; the first is preferred unless a later one is an
/// instruction the kernel emulates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Points {
    /// The first point (the copy's entry, the read of its switch), then
    /// the later ones on the straight line after it (see [`line`]), then,
    /// for a copy first probed at its read, its entry as a last resort.
    pub at: Vec<InlineEntry>,
    /// Why the line after the first point ends.
    pub end: line::LineEnd,
    /// The jumps that alone lead into the first point, each with the first
    /// point's size and object and the condition under which it goes there
    /// (`None`: always): where no point on the line is emulated, the copy
    /// is probed at them (see [`line::Gate`]).
    pub gate: Vec<(InlineEntry, Option<u8>)>,
}

impl Points {
    /// A copy's one point, its line not yet followed.
    #[must_use]
    pub fn one(point: InlineEntry) -> Self {
        Self { at: vec![point], end: line::LineEnd::NotFollowed, gate: Vec::new() }
    }
}

/// One inlined copy (or out-of-line clone) of a function, or a point in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InlineEntry {
    /// Its entry, a link-time address.
    pub address: u64,
    /// For an allocating function, where the requested size is there, as
    /// `count_site`'s operands (first, second, constant; see
    /// `tracer_common::site`); `None` where the DWARF does not say.
    pub size: Option<(u8, u8, u16)>,
    /// For a function `--types` counts by type (`_Py_NewReference`), where
    /// the new object is there, as `count_object`'s first operand and
    /// constant (a register, or a stack slot and its offset); for a free
    /// or a realloc, where its block is (for `--live`); `None` where
    /// neither the DWARF nor the code says.
    pub object: Option<(u8, u16)>,
    /// A point past an indirect call on the copy's line (see
    /// [`line`]): reached when the callee has returned, so a probe there
    /// comes after what the callee did (an allocator implementation's own
    /// probe, for `--live`).
    pub returned: bool,
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
    // files are reached, and which files already call into it. The rest is
    // filled in below.
    let (mut r, root, callers) = match spec {
        TargetSpec::Pid(pid) => {
            let target = Target::inspect(*pid)?;
            let source = version::Source::Process(&target);
            let version = version::read(source)?;
            let abi = python::abi_for(*pid, version)?;
            let mismatch = version::check_debug_offsets(source, abi, version);
            let Target { elf, image_path, host_path, code_files, ns_pid, .. } = target;
            let r = Resolved::new(*pid, None, elf, (image_path, host_path), (version, abi), mismatch, ns_pid);
            (r, process::Root::Process(*pid), code_files)
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
            let paths = (image.clone(), image);
            (
                Resolved::new(ALL_PROCESSES, Some(exe), elf, paths, (version, abi), mismatch, None),
                process::Root::Own,
                callers,
            )
        }
    };
    // The version module for the image as found (the same in both arms).
    r.abi = python::abi_for_image(&r.display_path, r.version)?;
    let v = (r.version.major, r.version.minor);
    if call_sites {
        r.modules = modules::modules(&r.display_path, root, &callers, v);
    }
    r.known = modules::known_files(&r.attach_path, &r.modules);
    if call_sites && r.scope == ALL_PROCESSES {
        // Every file the interpreter's running processes map executable,
        // such as the third-party extension modules they imported.
        for (pid, files) in process::processes_mapping(&r.attach_path) {
            r.modules.extend(modules::new_modules(pid, &files, &mut r.known));
        }
    }
    if dwarf.enabled {
        r.inlining = copies::find(spec, (&r.display_path, &r.elf), root, r.abi, dwarf)?;
    }
    let debug = match &r.inlining {
        Inlining::Known { source, .. } => Some(PathBuf::from(source)),
        _ => None,
    };
    r.implementations = impls::find(&r.elf, debug.as_deref(), &python::IMPLEMENTATIONS);
    Ok(r)
}

impl Resolved {
    /// A target found, before its modules and inlined copies are looked
    /// for.
    fn new(
        scope: u32,
        exe: Option<PathBuf>,
        elf: ElfImage,
        (display_path, attach_path): (PathBuf, PathBuf),
        (version, abi): (PythonVersion, &'static dyn Abi),
        debug_offsets_mismatch: Option<String>,
        ns_pid: Option<u32>,
    ) -> Self {
        Self {
            scope,
            exe,
            elf,
            display_path,
            attach_path,
            version,
            abi,
            modules: Vec::new(),
            known: HashSet::new(),
            debug_offsets_mismatch,
            ns_pid,
            inlining: Inlining::Skipped,
            implementations: Vec::new(),
        }
    }

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
