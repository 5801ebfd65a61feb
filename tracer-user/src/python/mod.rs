//! What tracer knows about each CPython minor version.
//!
//! One module per minor version holds what differs between versions: the
//! functions it has to probe (with the CPython source that declares them)
//! and, from 3.13 on, the layout of the `_Py_DebugOffsets` header the
//! interpreter publishes. [`abi_for`] is an exhaustive match that refuses
//! versions nobody has checked, rather than guessing that a new CPython
//! looks like the last one.

pub mod frames;
pub mod gc;
pub mod growth;
pub mod heap;
mod v3_10;
mod v3_11;
mod v3_12;
mod v3_13;
mod v3_14;
mod v3_9;

use std::fmt;

use thiserror::Error;

use crate::probe::{ProbeSpec, Program};

/// A version that tracer does not support.
#[derive(Debug, Error)]
pub enum VersionError {
    #[error("PID {pid} runs Python {version}, which tracer does not support; supported: {SUPPORTED}")]
    Unsupported { pid: u32, version: PythonVersion },
    #[error("{image} is Python {version}, which tracer does not support; supported: {SUPPORTED}")]
    UnsupportedImage { image: String, version: PythonVersion },
}

/// Minor versions with an [`Abi`] module.
pub const SUPPORTED: &str = "3.9, 3.10, 3.11, 3.12, 3.13, 3.14";

/// A CPython version, decoded from `PY_VERSION_HEX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PythonVersion {
    pub major: u8,
    pub minor: u8,
    pub micro: u8,
    /// 0xA alpha, 0xB beta, 0xC release candidate, 0xF final.
    pub level: u8,
    pub serial: u8,
}

impl PythonVersion {
    /// Decodes `PY_VERSION_HEX` (Include/patchlevel.h):
    /// major << 24 | minor << 16 | micro << 8 | level << 4 | serial.
    #[must_use]
    pub const fn from_hex(hex: u32) -> Self {
        let [major, minor, micro, low] = hex.to_be_bytes();
        Self { major, minor, micro, level: low >> 4, serial: low & 0xf }
    }

    /// `PY_VERSION_HEX` again: the inverse of [`Self::from_hex`].
    #[must_use]
    pub const fn hex(self) -> u32 {
        u32::from_be_bytes([self.major, self.minor, self.micro, self.level << 4 | self.serial])
    }
}

impl fmt::Display for PythonVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.micro)?;
        match self.level {
            0xA => write!(f, "a{}", self.serial),
            0xB => write!(f, "b{}", self.serial),
            0xC => write!(f, "rc{}", self.serial),
            _ => Ok(()),
        }
    }
}

/// The start of `_Py_DebugOffsets`, which 3.13+ place at the start of
/// `_PyRuntime` so that out-of-process tools can check what they read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DebugOffsetsHeader {
    /// `_Py_Debug_Cookie`, the first 8 bytes.
    pub cookie: &'static [u8; 8],
    /// Offset of the `version` field (`PY_VERSION_HEX`, a `uint64_t`).
    pub version_offset: u64,
}

/// Per-version knowledge.
pub trait Abi: Sync + fmt::Debug {
    /// Where a thread's Python frames are, for the stack walker
    /// ([`crate::stacks`]); every offset cites its CPython header.
    fn frames(&self) -> frames::FrameOffsets;
    /// The full layout of `_Py_DebugOffsets`, for versions that publish it
    /// (3.13+), by which [`Abi::frames`] is cross-checked in each process.
    fn debug_offsets_layout(&self) -> Option<frames::DebugOffsetsLayout> {
        None
    }
    /// The minor version this module describes.
    fn minor(&self) -> u8;
    /// The functions to probe, in report order; those with
    /// [`ProbeSpec::in_default`] false are probed only when named.
    fn probes(&self) -> &'static [ProbeSpec];
    /// The `_Py_DebugOffsets` header, for versions that publish one.
    fn debug_offsets(&self) -> Option<DebugOffsetsHeader>;
    /// The runtime switch every copy of `symbol` reads, by which its
    /// inlined copies are found without debug info; `None` for a function
    /// no switch guards.
    fn guard(&self, symbol: &str) -> Option<Guard>;
    /// Where an object's type is (the frame table's `ob_type`), and its
    /// type's name.
    fn objects(&self) -> ObjectOffsets {
        ObjectOffsets {
            ob_type: self.frames().ob_type,
            tp_name: TP_NAME_OFFSET,
            pre_headers: PRE_HEADERS,
            names: TypeNameOffsets {
                ht_qualname: self.ht_qualname(),
                unicode: self.frames().unicode,
                dict_keys: self.heap().dict_keys,
            },
        }
    }
    /// `offsetof(PyHeapTypeObject, ht_qualname)`, for `--types`.
    fn ht_qualname(&self) -> u64;
    /// What `tracer heap` needs of this version's memory layout.
    fn heap(&self) -> heap::HeapLayout;
}

/// A runtime switch that a probed function reads on every call, and so
/// does every copy of it the compiler inlined (see
/// [`crate::discover::guards`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guard {
    /// `_Py_NewReference` calls tracemalloc when this flag is set (3.11,
    /// 3.12). The flag lies in the data symbol `within`, at `offset` where
    /// the version module knows it: a cross-check of the address the code
    /// shows.
    TracemallocFlag { within: &'static str, offset: Option<u64> },
    /// `_Py_NewReference` calls the reference tracer when one is set
    /// (3.13+), and so does the code that destroys objects: each read is
    /// told apart by the event the tracer is passed.
    RefTracer,
    /// An allocator function calls through its slot in its domain's
    /// allocator table.
    AllocatorSlot,
}

impl Guard {
    /// What the switch is, for `tracer probes`.
    #[must_use]
    pub const fn describe(self) -> &'static str {
        match self {
            Self::TracemallocFlag { .. } => "the tracemalloc flag",
            Self::RefTracer => "the reference tracer",
            Self::AllocatorSlot => "the allocator slot",
        }
    }

    /// Whether the function `name` reads the switch to manage it rather
    /// than as a call of the guarded function: its reads are not copies.
    /// Static functions have names only where the debug file's symbol
    /// table is at hand (Modules/_tracemalloc.c's `tracemalloc_start`,
    /// Objects/obmalloc.c's `_PyMem_SetupDebugHooksDomain`).
    #[must_use]
    pub fn manages(self, name: &str) -> bool {
        let name = name.to_ascii_lowercase();
        let words: &[&str] = match self {
            Self::TracemallocFlag { .. } => &["tracemalloc", "_pymem_dumptraceback"],
            Self::RefTracer => &["pyreftracer_"],
            Self::AllocatorSlot => &["allocator", "debughooks", "debugenabled", "pymallocenabled", "debugmallocstats"],
        };
        words.iter().any(|w| name.contains(w))
    }
}

/// The slot every allocator function calls through: `_PyObject.malloc` for
/// `PyObject_Malloc` and so on (Objects/obmalloc.c, `PyObject_Malloc` …
/// `PyMem_RawFree`, from v3.11.0 to v3.14.0), whichever version.
#[must_use]
pub fn allocator_guard(symbol: &str) -> Option<Guard> {
    let allocator = ["PyObject_", "PyMem_Raw", "PyMem_"].iter().any(|domain| {
        symbol.strip_prefix(domain).is_some_and(|f| matches!(f, "Malloc" | "Calloc" | "Realloc" | "Free"))
    });
    allocator.then_some(Guard::AllocatorSlot)
}

/// The domain of an allocating function of the allocator API, by its
/// family (Include/pymem.h and Include/objimpl.h, v3.11.0 to v3.14.0);
/// `None` for any other function.
#[must_use]
pub fn domain(symbol: &str) -> Option<tracer_common::sizes::Domain> {
    use tracer_common::sizes::Domain;
    let allocates = |f: &str| matches!(f, "Malloc" | "Calloc" | "Realloc");
    // PyMem_Raw before PyMem_: the longer prefix first.
    [("PyObject_", Domain::Object), ("PyMem_Raw", Domain::Raw), ("PyMem_", Domain::Mem)]
        .into_iter()
        .find_map(|(prefix, domain)| symbol.strip_prefix(prefix).filter(|f| allocates(f)).map(|_| domain))
}

/// The allocator family (domain) of any of its functions, frees included:
/// `PyObject_*`, `PyMem_Raw*` and `PyMem_*`.
#[must_use]
pub fn family(symbol: &str) -> Option<tracer_common::sizes::Domain> {
    use tracer_common::sizes::Domain;
    let ours = |f: &str| matches!(f, "Malloc" | "Calloc" | "Realloc" | "Free");
    [("PyObject_", Domain::Object), ("PyMem_Raw", Domain::Raw), ("PyMem_", Domain::Mem)]
        .into_iter()
        .find_map(|(prefix, domain)| symbol.strip_prefix(prefix).filter(|f| ours(f)).map(|_| domain))
}

/// The allocator implementations the API calls through its domains'
/// tables (`PyObject_Malloc` is `return _PyObject.malloc(_PyObject.ctx,
/// size);`), each with its [`tracer_common::live::Role`]: pymalloc's, the
/// raw (libc) ones, the debug hooks (`PYTHONMALLOC=debug`) and, from 3.13,
/// mimalloc's. All are static functions of Objects/obmalloc.c (v3.11.0 to
/// v3.14.0; the `Mi` ones from v3.13.0), taking the table's context first
/// (`_PyObject_Malloc(void *ctx, size_t nbytes)`); checked against the
/// symbol tables of pyenv's 3.11.7, 3.12.1, 3.13.0, Debian's 3.11 and the
/// forky root's 3.13 and 3.14.
pub const IMPLEMENTATIONS: [(&str, tracer_common::live::Role); 25] = {
    use tracer_common::live::Role;
    [
        // pymalloc's slow path, out of line where the rest is inlined
        // (`static void *allocate_from_new_pool(uint size)`, and
        // `(OMState *state, uint size)` from v3.13.0).
        ("allocate_from_new_pool", Role::POOL),
        ("_PyObject_Malloc", Role::MALLOC),
        ("_PyObject_Calloc", Role::CALLOC),
        ("_PyObject_Realloc", Role::REALLOC),
        ("_PyObject_Free", Role::FREE),
        ("_PyMem_RawMalloc", Role::MALLOC),
        ("_PyMem_RawCalloc", Role::CALLOC),
        ("_PyMem_RawRealloc", Role::REALLOC),
        ("_PyMem_RawFree", Role::FREE),
        ("_PyMem_DebugMalloc", Role::MALLOC),
        ("_PyMem_DebugCalloc", Role::CALLOC),
        ("_PyMem_DebugRealloc", Role::REALLOC),
        ("_PyMem_DebugFree", Role::FREE),
        ("_PyMem_DebugRawMalloc", Role::MALLOC),
        ("_PyMem_DebugRawCalloc", Role::CALLOC),
        ("_PyMem_DebugRawRealloc", Role::REALLOC),
        ("_PyMem_DebugRawFree", Role::FREE),
        ("_PyObject_MiMalloc", Role::MALLOC),
        ("_PyObject_MiCalloc", Role::CALLOC),
        ("_PyObject_MiRealloc", Role::REALLOC),
        ("_PyObject_MiFree", Role::FREE),
        ("_PyMem_MiMalloc", Role::MALLOC),
        ("_PyMem_MiCalloc", Role::CALLOC),
        ("_PyMem_MiRealloc", Role::REALLOC),
        ("_PyMem_MiFree", Role::FREE),
    ]
};

/// The variables that hold pymalloc's state, by their names in the
/// source, for `--live`'s prediction of the blocks an inlined pymalloc
/// hands out ([`tracer_common::live::Pymalloc`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PymallocNames {
    /// The array whose first element is `usedpools[0]`.
    pub usedpools: &'static str,
    /// The object and mem domains' allocator tables, where they are
    /// variables of their own.
    pub tables: [Option<&'static str>; 2],
}

/// Where `abi`'s version keeps pymalloc's state; `None` where tracer
/// cannot find it from symbols.
#[must_use]
pub fn pymalloc_names(abi: &dyn Abi) -> Option<PymallocNames> {
    #[allow(clippy::match_same_arms, reason = "3.12 is checked and has no such symbol; other versions are not checked")]
    match abi.minor() {
        // Objects/obmalloc.c v3.11.0 (and v3.10.13, whose pools and arenas
        // are 3.11's size): `static poolp usedpools[...]`, and the tables
        // `static PyMemAllocatorEx _PyMem, _PyObject` (local symbols of
        // pyenv's 3.10.13 too). 3.9's pools are 4 KiB, which the
        // prediction does not know.
        10 | 11 => Some(PymallocNames { usedpools: "usedpools", tables: [Some("_PyObject"), Some("_PyMem")] }),
        // v3.12.0: the state is in each interpreter
        // (`_PyRuntime._main_interpreter.obmalloc`), which no symbol names.
        12 => None,
        // v3.13.0 and v3.14.0: the main interpreter's state is `static
        // struct _obmalloc_state obmalloc_state_main` (Objects/obmalloc.c),
        // whose first member is `pools.used` (Include/internal/
        // pycore_obmalloc.h); the tables are inside `_PyRuntime`
        // (`_PyRuntime.allocators.standard`), so they are not checked.
        13 | 14 => Some(PymallocNames { usedpools: "obmalloc_state_main", tables: [None, None] }),
        _ => None,
    }
}

/// The [`Abi`] for `version`, or an error for versions nobody has checked.
pub fn abi_for(pid: u32, version: PythonVersion) -> Result<&'static dyn Abi, VersionError> {
    match (version.major, version.minor) {
        (3, 9) => Ok(&v3_9::Abi39),
        (3, 10) => Ok(&v3_10::Abi310),
        (3, 11) => Ok(&v3_11::Abi311),
        (3, 12) => Ok(&v3_12::Abi312),
        (3, 13) => Ok(&v3_13::Abi313),
        (3, 14) => Ok(&v3_14::Abi314),
        _ => Err(VersionError::Unsupported { pid, version }),
    }
}

/// What tracer knows of the garbage collector of `abi`'s version.
#[must_use]
pub fn gc_knowledge(abi: &dyn Abi) -> Option<&'static gc::GcKnowledge> {
    match abi.minor() {
        9 => Some(&v3_9::GC),
        10 => Some(&v3_10::GC),
        11 => Some(&v3_11::GC),
        12 => Some(&v3_12::GC),
        13 => Some(&v3_13::GC),
        14 => Some(&v3_14::GC),
        _ => None,
    }
}

/// [`abi_for`] for an image file rather than a process.
pub fn abi_for_image(image: &std::path::Path, version: PythonVersion) -> Result<&'static dyn Abi, VersionError> {
    abi_for(0, version).map_err(|_| VersionError::UnsupportedImage { image: image.display().to_string(), version })
}

/// Every function some supported version can probe, each once, in the
/// first version's report order: what `--probes` accepts.
#[must_use]
pub fn known_probes() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = Vec::new();
    for abi in
        [&v3_11::Abi311 as &dyn Abi, &v3_12::Abi312, &v3_13::Abi313, &v3_14::Abi314, &v3_10::Abi310, &v3_9::Abi39]
    {
        for p in abi.probes() {
            if !names.contains(&p.symbol) {
                names.push(p.symbol);
            }
        }
    }
    names
}

/// The names of the parameters that give the requested size, for the
/// program of an allocating function: `size` (`PyObject_Malloc(size_t
/// size)`), `new_size` (`PyObject_Realloc(void *ptr, size_t new_size)`) and
/// `nelem`, `elsize` (`PyObject_Calloc(size_t nelem, size_t elsize)`), the
/// same for the `PyMem_` and `PyMem_Raw` families, in Objects/obmalloc.c
/// from v3.11.0 to v3.14.0. What inlined copies' DWARF is searched for.
#[must_use]
pub const fn size_parameters(program: Program) -> &'static [&'static str] {
    match program {
        Program::SizeArg0 => &["size"],
        Program::SizeArg1 => &["new_size"],
        Program::Calloc => &["nelem", "elsize"],
        Program::CountCall
        | Program::CountClaimed
        | Program::Empty
        | Program::MetaInsert
        | Program::MetaLookup
        | Program::MetaPool
        | Program::MetaChunk
        | Program::RetValue
        | Program::RetValueUret
        | Program::LiveAlloc
        | Program::LiveFree
        | Program::LiveImpl
        | Program::LiveRet
        | Program::LiveRetUret
        | Program::CountSite
        | Program::CountObject
        // libc's functions are probed in their own code only, never as
        // inlined copies.
        | Program::NativeSizeArg0
        | Program::NativeSizeArg1
        | Program::NativeSizeArg2
        | Program::NativeCalloc
        | Program::NativeCall
        | Program::NativeReleaseArg1
        | Program::NativeNested
        | Program::FreeObject => &[],
    }
}

/// The name of the parameter that is the new object, for a function that
/// `--types` counts by the object's type: `op`, in `_Py_NewReference(PyObject
/// *op)` and `_Py_NewReferenceNoTotal(PyObject *op)` (Objects/object.c from
/// v3.11.0 to v3.14.0; the latter from v3.12.0).
#[must_use]
pub fn object_parameter(symbol: &str) -> Option<&'static str> {
    matches!(symbol, "_Py_NewReference" | "_Py_NewReferenceNoTotal").then_some("op")
}

/// The name of the parameter that is the freed block, for the object
/// domain's free, where `--types` sees objects destroyed: `ptr`, in
/// `PyObject_Free(void *ptr)` (Objects/obmalloc.c from v3.11.0 to v3.14.0).
/// `PyObject_GC_Del` (Modules/gcmodule.c in 3.11, Python/gc.c from 3.12)
/// and `PyObject_Del` (a macro for it) free objects through it.
#[must_use]
pub fn freed_parameter(symbol: &str) -> Option<&'static str> {
    (symbol == "PyObject_Free").then_some("ptr")
}

/// The name of the parameter that is the block a free frees, where
/// `--live` takes it out of the table at an inlined copy: `ptr`, in
/// `PyObject_Free`, `PyMem_Free` and `PyMem_RawFree(void *ptr)`
/// (Objects/obmalloc.c from v3.11.0 to v3.14.0).
#[must_use]
pub fn freed_block_parameter(symbol: &str) -> Option<&'static str> {
    matches!(symbol, "PyObject_Free" | "PyMem_Free" | "PyMem_RawFree").then_some("ptr")
}

/// The name of the parameter that is the block a realloc reallocates,
/// where `--live` reads it at an inlined copy: `ptr`, in
/// `PyObject_Realloc`, `PyMem_Realloc` and `PyMem_RawRealloc(void *ptr,
/// size_t new_size)` (Objects/obmalloc.c from v3.11.0 to v3.14.0).
#[must_use]
pub fn reallocated_block_parameter(symbol: &str) -> Option<&'static str> {
    matches!(symbol, "PyObject_Realloc" | "PyMem_Realloc" | "PyMem_RawRealloc").then_some("ptr")
}

/// Where an object's type and a type's name are, for `--types`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectOffsets {
    /// `offsetof(PyObject, ob_type)`.
    pub ob_type: u64,
    /// `offsetof(PyTypeObject, tp_name)`.
    pub tp_name: u64,
    /// The sizes a freed object's block may start at before the object
    /// ([`PRE_HEADERS`]).
    pub pre_headers: [u64; tracer_common::types::PRE_HEADERS],
    /// Where a heap type's qualified name and module are.
    pub names: TypeNameOffsets,
}

/// What differs between versions in reading a heap type's name: its
/// `__qualname__` (`PyHeapTypeObject.ht_qualname`) and its `__module__`
/// (the `__module__` key of its `tp_dict`, as `type.__module__` reads it
/// in Objects/typeobject.c, `type_module`), both `str` objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypeNameOffsets {
    /// `offsetof(PyHeapTypeObject, ht_qualname)`.
    pub ht_qualname: u64,
    /// Where a `str`'s length, state and characters are: the frame
    /// table's, which the stack walker reads names with too (and checks
    /// against `_Py_DebugOffsets` on 3.13+).
    pub unicode: frames::UnicodeOffsets,
    /// How the type dict's keys are laid out.
    pub dict_keys: heap::DictKeys,
}

/// `offsetof(PyTypeObject, tp_flags)`: 168 in Include/cpython/object.h
/// from v3.11 to v3.14 (checked by compiling `offsetof` against the
/// headers of 3.11.7, 3.12.1, 3.13.0 and 3.14.8; 3.13 and 3.14 also
/// publish it as `_Py_DebugOffsets.type_object.tp_flags`).
pub const TP_FLAGS_OFFSET: u64 = 168;
/// `offsetof(PyTypeObject, tp_dict)`: 264, checked as [`TP_FLAGS_OFFSET`].
pub const TP_DICT_OFFSET: u64 = 264;
/// `Py_TPFLAGS_HEAPTYPE` (Include/object.h, v3.11 to v3.14).
pub const TPFLAGS_HEAPTYPE: u64 = 1 << 9;
/// `offsetof(PyDictObject, ma_keys)` and `ma_values` (Include/cpython/
/// dictobject.h, v3.11 to v3.14: after the object header, `ma_used` and
/// the 64-bit version or watcher tag; `_Py_DebugOffsets.dict_object` in
/// 3.13+).
pub const MA_KEYS_OFFSET: u64 = 32;
pub const MA_VALUES_OFFSET: u64 = 40;
/// `struct _dictkeysobject` (`Include/internal/pycore_dict.h`, v3.11 to
/// v3.14, default build): `dk_refcnt`, then the bytes `dk_log2_size`,
/// `dk_log2_index_bytes` (9) and `dk_kind` (10), `dk_version`,
/// `dk_usable`, `dk_nentries` (24) and the indices (32), whose
/// `1 << dk_log2_index_bytes` bytes the entries follow (`DK_ENTRIES`).
/// Entries are `PyDictUnicodeEntry` (`me_key`, `me_value`) unless
/// `dk_kind` is `DICT_KEYS_GENERAL` (0): `PyDictKeyEntry` (`me_hash`,
/// `me_key`, `me_value`).
pub const DK_LOG2_INDEX_BYTES_OFFSET: u64 = 9;
pub const DK_KIND_OFFSET: u64 = 10;
pub const DK_NENTRIES_OFFSET: u64 = 24;
pub const DK_INDICES_OFFSET: u64 = 32;
/// The bits of `PyASCIIObject.state` (Include/cpython/unicodeobject.h,
/// v3.11 to v3.14): `interned` (2), `kind` (3: 1, 2 or 4 bytes a
/// character), `compact`, `ascii` (checked by compiling against the four
/// versions' headers).
pub const UNICODE_KIND_SHIFT: u32 = 2;
pub const UNICODE_COMPACT_BIT: u32 = 1 << 5;
pub const UNICODE_ASCII_BIT: u32 = 1 << 6;

/// Where an object's memory block starts, before the object: at
/// `_PyType_PreHeaderSize(tp)` bytes, which is `_PyType_IS_GC(tp) *
/// sizeof(PyGC_Head)` plus, for a type with `Py_TPFLAGS_MANAGED_DICT`
/// (3.11) or `Py_TPFLAGS_PREHEADER` (`MANAGED_DICT | MANAGED_WEAKREF`,
/// 3.12 on), `2 * sizeof(PyObject *)` (`Include/internal/pycore_object.h`,
/// the same in v3.11.7, v3.12.1, v3.13.0 and v3.14.8 as installed here).
/// `PyGC_Head` is two `uintptr_t` (`Include/internal/pycore_gc.h`), 16 bytes;
/// a managed dict needs the GC, so the pre-header is 0, 16 or 32 bytes.
/// `PyObject_GC_Del` frees `op - presize` (Modules/gcmodule.c in 3.11,
/// Python/gc.c from 3.12), and a non-GC type's `tp_free` frees the object
/// itself.
pub const PRE_HEADERS: [u64; tracer_common::types::PRE_HEADERS] = [0, 16, 32];

/// `offsetof(PyTypeObject, tp_name)`: Include/cpython/object.h from v3.11.0
/// to v3.14.0 starts `struct _typeobject` with `PyObject_VAR_HEAD` (the
/// object header and `Py_ssize_t ob_size`: 24 bytes on the 64-bit default
/// builds), then `const char *tp_name`.
pub const TP_NAME_OFFSET: u64 = 24;

const fn spec(symbol: &'static str, program: Program, required: bool) -> ProbeSpec {
    ProbeSpec::function(symbol, program, required, true)
}

/// The functions every supported version has: `_Py_NewReference` and
/// `_Py_Dealloc` (Objects/object.c) and the allocator API
/// (Objects/obmalloc.c, declared in Include/pymem.h and Include/objimpl.h),
/// unchanged in name and signature from v3.11.0 to v3.14.0. Only
/// `PyObject_Malloc` is required: every CPython has it, so its absence means
/// the image is not what it seems. The rest may be inlined away (LTO builds)
/// and are reported as missing.
const COMMON: [ProbeSpec; 14] = [
    spec("_Py_NewReference", Program::CountCall, false),
    spec("_Py_Dealloc", Program::CountCall, false),
    spec("PyObject_Malloc", Program::SizeArg0, true),
    spec("PyObject_Calloc", Program::Calloc, false),
    spec("PyObject_Realloc", Program::SizeArg1, false),
    spec("PyObject_Free", Program::CountCall, false),
    spec("PyMem_Malloc", Program::SizeArg0, false),
    spec("PyMem_Calloc", Program::Calloc, false),
    spec("PyMem_Realloc", Program::SizeArg1, false),
    spec("PyMem_Free", Program::CountCall, false),
    spec("PyMem_RawMalloc", Program::SizeArg0, false),
    spec("PyMem_RawCalloc", Program::Calloc, false),
    spec("PyMem_RawRealloc", Program::SizeArg1, false),
    spec("PyMem_RawFree", Program::CountCall, false),
];

/// [`COMMON`] followed by `extra`.
const fn with<const N: usize, const M: usize>(extra: [ProbeSpec; N]) -> [ProbeSpec; M] {
    let mut out = [COMMON[0]; M];
    let mut i = 0;
    while i < M {
        out[i] = if i < COMMON.len() { COMMON[i] } else { extra[i - COMMON.len()] };
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_version_hex() {
        let v = PythonVersion::from_hex(0x030B_07F0);
        assert_eq!((v.major, v.minor, v.micro), (3, 11, 7));
        assert_eq!(v.to_string(), "3.11.7");
        assert_eq!(PythonVersion::from_hex(0x030E_00A2).to_string(), "3.14.0a2");
        assert_eq!(PythonVersion::from_hex(0x030D_00C1).to_string(), "3.13.0rc1");
    }

    #[test]
    fn dispatch_is_exact() {
        for minor in [9, 10, 11, 12, 13, 14] {
            let v = PythonVersion { major: 3, minor, micro: 0, level: 0xF, serial: 0 };
            assert_eq!(abi_for(1, v).unwrap().minor(), minor);
        }
        for (major, minor) in [(3, 8), (3, 15), (2, 7), (4, 0)] {
            let v = PythonVersion { major, minor, micro: 0, level: 0xF, serial: 0 };
            let err = abi_for(9, v).expect_err("unknown versions are refused");
            assert_eq!(
                err.to_string(),
                format!("PID 9 runs Python {major}.{minor}.0, which tracer does not support; supported: {SUPPORTED}")
            );
        }
    }

    #[test]
    fn every_version_probes_the_common_functions_by_default() {
        for minor in [9, 10, 11, 12, 13, 14] {
            let v = PythonVersion { major: 3, minor, micro: 0, level: 0xF, serial: 0 };
            let abi = abi_for(1, v).unwrap();
            let defaults: Vec<ProbeSpec> = abi.probes().iter().copied().filter(|p| p.in_default).collect();
            assert_eq!(defaults, COMMON, "3.{minor}");
            let mut names: Vec<_> = abi.probes().iter().map(|p| p.symbol).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), abi.probes().len(), "3.{minor} names a function twice");
            assert_eq!(abi.debug_offsets().is_some(), minor >= 13, "3.{minor}");
        }
        assert!(known_probes().contains(&"_Py_NewReferenceNoTotal"));
    }

    #[test]
    fn shapes_match_names() {
        for p in known_probes().iter().filter_map(|n| v3_14::Abi314.probes().iter().find(|p| p.symbol == *n)) {
            let expected = if p.symbol.ends_with("Calloc") {
                Program::Calloc
            } else if p.symbol.ends_with("Realloc") {
                Program::SizeArg1
            } else if p.symbol.ends_with("Malloc") {
                Program::SizeArg0
            } else {
                Program::CountCall
            };
            assert_eq!(p.program, expected, "{}", p.symbol);
        }
    }
}
