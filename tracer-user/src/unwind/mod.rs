//! `--native-stacks`: what the BPF unwinder needs of each traced process
//! (its modules' unwind rows, [`table`], and where each executable page's
//! rows are), and the names of the native stacks it records
//! ([`symbols`]). Each module (a file, by device and inode) is read once,
//! whatever number of processes map it; each native stack is named once
//! per process.

mod symbols;
pub mod table;

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
};

use procfs::process::MMapPath;
use tracer_common::unwind::{self, NativeStack, PAGE_SHIFT, Page};

use self::symbols::Symbols;
use crate::{
    discover::{
        debuginfo,
        process::{self, FileId, Root},
    },
    kernel::{AttachError, Session},
    model::{NativeFrame, NativeModule},
};

/// Room for unwind rows, over every module: 12 MiB of kernel memory;
/// python3.14's executable has about 150,000 rows, libc about 40,000.
pub const ROW_CAPACITY: u32 = 1 << 20;

/// The fix a module without usable unwind rows gets.
const NO_ROWS_FIX: &str = "native frames stop in this module; rebuild it with -fasynchronous-unwind-tables (GCC's and Clang's default on x86-64) and without stripping .eh_frame, or with -fno-omit-frame-pointer";
/// The fix where a module's rows were read but found no room.
const NO_ROOM_FIX: &str = "native frames stop in this module; the unwinder's rows are shared by every module of the run: trace fewer processes at once";
/// How a module's rows failed to reach the unwinder, which starts every
/// such error.
const NO_ROOM: &str = "no room for its unwind rows";

/// What to do about a module's rows that failed as `why` says.
fn fix_for(why: &str) -> &'static str {
    if why.starts_with(NO_ROOM) { NO_ROOM_FIX } else { NO_ROWS_FIX }
}

/// One module, read once.
#[derive(Debug)]
struct Module {
    /// Its path as the first process that mapped it names it.
    path: PathBuf,
    /// Where tracer reads it.
    readable: PathBuf,
    /// Its rows' place in the rows map, or why it has none.
    rows: Result<(u32, u32), String>,
    /// The rows themselves, for each page's range.
    table: Vec<unwind::Row>,
    unsupported: usize,
    /// Its segments: (file offset, size in the file, link-time address).
    segments: Vec<(u64, u64, u64)>,
    /// Its names, read at the first stack that needs them (`None` inside:
    /// they could not be read, `why_no_names` says why).
    symbols: Names,
    why_no_names: Option<String>,
    /// Its DWARF, where found, and the file held open from when it was
    /// found: the names are read at the first stack that needs them,
    /// which may be after the process (and the root it was found in) is
    /// gone.
    dwarf: Option<PathBuf>,
    dwarf_file: Option<std::fs::File>,
    /// Where the DWARF would be found: the path inside the process's
    /// root and that root.
    in_root: PathBuf,
    root: PathBuf,
}

/// A module's names, read at the first stack that needs them.
#[derive(Debug)]
enum Names {
    NotRead,
    Read(Symbols),
    /// They could not be read; `why_no_names` says why.
    Unreadable,
}

/// A process's executable mapping, for naming its pcs.
#[derive(Clone, Copy, Debug)]
struct Mapped {
    start: u64,
    end: u64,
    bias: u64,
    module: FileId,
}

/// A resolved native stack: its frames innermost first (inlined ones
/// included), and why the unwind ended where it did, unless at the root.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub frames: Vec<NativeFrame>,
    pub end: Option<String>,
}

/// The unwinder's view of every traced process.
#[derive(Debug, Default)]
pub struct Native {
    modules: HashMap<FileId, Module>,
    /// The first free row.
    next_row: u32,
    processes: HashMap<u32, Vec<Mapped>>,
    resolved: HashMap<(u32, u64), Resolved>,
    debug_dir: Option<PathBuf>,
    /// Notes not told yet.
    untold: Vec<String>,
}

impl Native {
    #[must_use]
    pub fn new(debug_dir: Option<PathBuf>) -> Self {
        Self { debug_dir, ..Self::default() }
    }

    /// Tells the kernel the rows of `pid`'s modules and where its pages'
    /// rows are. A module without rows is told once, in a note.
    pub fn prepare(&mut self, session: &mut Session, pid: u32) -> Result<(), String> {
        let proc = procfs::process::Process::new(i32::try_from(pid).map_err(|e| e.to_string())?)
            .map_err(|e| format!("cannot read /proc/{pid}: {e}"))?;
        let maps = crate::discover::process::maps_of(&proc)
            .map_err(|e| format!("cannot read the memory map of PID {pid}: {e}"))?;
        let host_root = std::fs::read_link(format!("/proc/{pid}/root")).unwrap_or_else(|_| PathBuf::from("/"));
        let mut mapped = Vec::new();
        let mut pages = Vec::new();
        for m in &maps {
            let MMapPath::Path(path) = &m.pathname else { continue };
            if !m.perms.contains(procfs::process::MMPermissions::EXECUTE) {
                continue;
            }
            let dev = libc::makedev(u32::try_from(m.dev.0).unwrap_or(0), u32::try_from(m.dev.1).unwrap_or(0));
            let id: FileId = (dev, m.inode);
            if !self.modules.contains_key(&id) {
                let module = self.load(session, pid, path, id, &host_root);
                if let Err(why) = &module.rows {
                    self.untold.push(format!(
                        "native stacks of PID {pid} stop in {}: {why}; {}",
                        path.display(),
                        fix_for(why)
                    ));
                }
                self.modules.insert(id, module);
            }
            let Some(module) = self.modules.get(&id) else { continue };
            let (start, end) = m.address;
            // The link-time address of the mapping's start, from the
            // segment that holds its file offset.
            let Some(&(offset, _, vaddr)) =
                module.segments.iter().find(|(o, size, _)| *o <= m.offset && m.offset < o + size.max(&1))
            else {
                continue;
            };
            let bias = start.wrapping_sub(vaddr.wrapping_add(m.offset - offset));
            mapped.push(Mapped { start, end, bias, module: id });
            let (first, count) = module.rows.as_ref().copied().unwrap_or((0, 0));
            let rows = &module.table;
            for page in (start >> PAGE_SHIFT)..end.div_ceil(1 << PAGE_SHIFT) {
                let lo = (page << PAGE_SHIFT).wrapping_sub(bias);
                let (a, b) = if count == 0 { (0, 0) } else { table::covering(rows, lo, lo + (1 << PAGE_SHIFT)) };
                #[allow(clippy::cast_possible_truncation, reason = "indices within a module's rows, which fit u32")]
                let value = Page { bias, rows: first + a as u32, count: (b - a) as u32 };
                pages.push((page, value));
            }
        }
        session.set_pages(pid, &pages).map_err(|e| e.to_string())?;
        mapped.sort_by_key(|m| m.start);
        self.processes.insert(pid, mapped);
        Ok(())
    }

    /// Reads a module's rows into the rows map.
    fn load(&mut self, session: &mut Session, pid: u32, path: &Path, id: FileId, host_root: &Path) -> Module {
        let readable = Root::Process(pid).reach(path, Some(id)).unwrap_or_else(|| path.to_owned());
        let in_root = path.strip_prefix(host_root).map_or_else(|_| path.to_owned(), |p| Path::new("/").join(p));
        let mut module = Module {
            path: path.to_owned(),
            readable: readable.clone(),
            rows: Err(String::new()),
            table: Vec::new(),
            unsupported: 0,
            segments: Vec::new(),
            symbols: Names::NotRead,
            why_no_names: None,
            dwarf: None,
            dwarf_file: None,
            in_root,
            root: process::proc_root(pid),
        };
        locate_dwarf(&mut module, self.debug_dir.as_deref());
        let data = match std::fs::read(&readable) {
            Ok(d) => d,
            Err(e) => {
                module.rows = Err(format!("cannot read {}: {e}", readable.display()));
                return module;
            }
        };
        module.segments = segments(&data);
        module.rows = match table::rows(&data) {
            Ok(t) => {
                module.unsupported = t.unsupported;
                let placed = self.place(session, &t.rows);
                module.table = t.rows;
                placed
            }
            Err(why) => Err(why),
        };
        module
    }

    /// Writes `rows` after the rows placed so far.
    fn place(&mut self, session: &mut Session, rows: &[unwind::Row]) -> Result<(u32, u32), String> {
        let count = u32::try_from(rows.len()).map_err(|_| "too many unwind rows".to_owned())?;
        if self.next_row.saturating_add(count) > ROW_CAPACITY {
            return Err(format!(
                "{NO_ROOM}: its {count} do not fit in the {ROW_CAPACITY} the unwinder has, {} of which are taken",
                self.next_row
            ));
        }
        let first = self.next_row;
        session.set_rows(first, rows).map_err(|e: AttachError| match &e {
            AttachError::Map { cause, .. } if matches!(**cause, aya::maps::MapError::OutOfBounds { .. }) => {
                format!("{NO_ROOM}: {e}")
            }
            _ => e.to_string(),
        })?;
        self.next_row += count;
        Ok((first, count))
    }

    /// Keeps a note to tell.
    pub fn push_untold(&mut self, note: String) {
        self.untold.push(note);
    }

    /// The notes not told yet.
    pub fn take_untold(&mut self) -> Vec<String> {
        std::mem::take(&mut self.untold)
    }

    /// `pid`'s native stack `hash`, named (once).
    pub fn resolve(&mut self, session: &Session, pid: u32, hash: u64) -> Resolved {
        if let Some(r) = self.resolved.get(&(pid, hash)) {
            return r.clone();
        }
        let resolved = match session.native_stack(hash) {
            Ok(Some(raw)) => self.name(pid, &raw),
            Ok(None) => Resolved {
                frames: Vec::new(),
                end: Some("the kernel did not keep its frames (native_full)".to_owned()),
            },
            Err(e) => Resolved { frames: Vec::new(), end: Some(e.to_string()) },
        };
        self.resolved.insert((pid, hash), resolved.clone());
        resolved
    }

    fn name(&mut self, pid: u32, raw: &NativeStack) -> Resolved {
        let depth = usize::try_from(raw.depth).unwrap_or(0).min(unwind::MAX_NATIVE_DEPTH);
        let mapped = self.processes.get(&pid).cloned().unwrap_or_default();
        let mut frames = Vec::new();
        let mut last_module = None;
        for (i, &pc) in raw.pcs[..depth].iter().enumerate() {
            // A return address is named by its call, one byte back.
            let at = if i == 0 { pc } else { pc.wrapping_sub(1) };
            let Some(m) = mapped.iter().find(|m| m.start <= at && at < m.end) else {
                frames.push(NativeFrame {
                    function: format!("{pc:#x}"),
                    module: "?".to_owned(),
                    file: None,
                    line: None,
                    inlined: false,
                });
                continue;
            };
            last_module = Some(m.module);
            let Some(module) = self.modules.get_mut(&m.module) else { continue };
            if matches!(module.symbols, Names::NotRead) {
                module.symbols = names(module).map_or(Names::Unreadable, Names::Read);
            }
            match &module.symbols {
                Names::Read(s) => frames.extend(s.frames(at.wrapping_sub(m.bias))),
                Names::NotRead | Names::Unreadable => frames.push(NativeFrame {
                    function: format!("{:#x}", at.wrapping_sub(m.bias)),
                    module: file_name(&module.path),
                    file: None,
                    line: None,
                    inlined: false,
                }),
            }
        }
        let module_name = |id: Option<FileId>| {
            id.and_then(|id| self.modules.get(&id)).map_or_else(|| "?".to_owned(), |m| m.path.display().to_string())
        };
        let end = match raw.end {
            unwind::end::ROOT => None,
            unwind::end::TRUNCATED => Some(format!("cut at {} native frames", unwind::MAX_NATIVE_DEPTH)),
            unwind::end::NO_MAPPING => {
                Some("at a pc in no file tracer knows (JIT code, the vDSO, or a module mapped later)".to_owned())
            }
            unwind::end::NO_INFO => {
                Some(format!("at a pc the unwind tables of {} do not cover", module_name(last_module)))
            }
            unwind::end::UNSUPPORTED => {
                Some(format!("at an unwind rule of {} the unwinder does not follow", module_name(last_module)))
            }
            _ => Some("a read of the stack failed".to_owned()),
        };
        Resolved { frames, end }
    }

    /// What each module gave the unwinder, by path.
    #[must_use]
    pub fn modules(&self) -> Vec<NativeModule> {
        let mut out: BTreeMap<String, NativeModule> = BTreeMap::new();
        for m in self.modules.values() {
            let path = m.path.display().to_string();
            let (rows, reason) = match &m.rows {
                Ok((_, count)) => (u64::from(*count), None),
                Err(why) => (0, Some(why.clone())),
            };
            out.insert(
                path.clone(),
                NativeModule {
                    path,
                    rows,
                    unsupported_rows: m.unsupported as u64,
                    dwarf: m.dwarf.as_ref().map(|d| d.display().to_string()),
                    reason: reason.clone().or_else(|| m.why_no_names.clone()),
                    fix: reason.as_deref().map(|why| fix_for(why).to_owned()),
                },
            );
        }
        out.into_values().collect()
    }

    /// Forgets an exited process.
    pub fn forget(&mut self, pid: u32) {
        self.processes.remove(&pid);
        self.resolved.retain(|k, _| k.0 != pid);
    }
}

/// Finds a module's DWARF (inside the process's root by build-id or
/// debuglink, or in `--debug-dir`) while the process is alive, and holds
/// it open.
fn locate_dwarf(module: &mut Module, debug_dir: Option<&Path>) {
    match debuginfo::locate(&module.in_root, &module.root, debug_dir, Some(&module.readable)) {
        Ok(Some(file)) => match std::fs::File::open(&file.path) {
            Ok(open) => {
                module.dwarf = Some(file.path);
                module.dwarf_file = Some(open);
            }
            Err(e) => {
                module.why_no_names = Some(format!(
                    "its DWARF {} cannot be opened ({e}): frames are named from ELF symbols only",
                    file.path.display()
                ));
            }
        },
        Ok(None) => {
            module.why_no_names = Some(
                "no DWARF found: frames are named from ELF symbols only, without inlined functions or lines".to_owned(),
            );
        }
        Err(e) => {
            module.why_no_names =
                Some(format!("its DWARF cannot be used ({e}): frames are named from ELF symbols only"));
        }
    }
}

/// A module's names: its symbols, and its DWARF where found, read through
/// the file held open.
fn names(module: &mut Module) -> Option<Symbols> {
    use std::os::fd::AsRawFd as _;
    let dwarf = module.dwarf_file.as_ref().map(|f| PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())));
    match Symbols::load(file_name(&module.path), &module.readable, dwarf.as_deref()) {
        Ok(s) => Some(s),
        Err(why) => {
            module.why_no_names = Some(why);
            None
        }
    }
}

/// (file offset, size in the file, link-time address) of each loadable
/// segment of the ELF file `data`.
fn segments(data: &[u8]) -> Vec<(u64, u64, u64)> {
    use object::{Object as _, ObjectSegment as _};
    let Ok(file) = object::File::parse(data) else { return Vec::new() };
    file.segments().map(|s| (s.file_range().0, s.file_range().1, s.address())).collect()
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
}
