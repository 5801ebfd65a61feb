//! Call sites (`--placement call-sites`, and `auto` tracing one running
//! process exactly): every [`QUICK_CHECK`] with `--pid` and every interval
//! (with `--exe` only then), the files mapped since the attach (by the
//! target, or with `--exe` by any process of the interpreter) are
//! scanned, and their calls to the functions at their call sites are
//! probed from then on.

use std::{
    collections::HashSet,
    path::PathBuf,
    time::{Duration, Instant},
};

use crate::{
    discover::{
        modules::{self, Module},
        process::{self, FileId},
    },
    kernel::{ALL_PROCESSES, Session},
    model::{LateCoverage, LateModule, Level, Note, NoteCode},
};

/// How often one process's mappings are read, between intervals, for
/// files mapped since: a late file's calls before it is probed are not
/// counted, so this bounds that gap (each read one of /proc/PID/maps).
/// With `--exe` every process's would be read: the interval sets the pace.
pub const QUICK_CHECK: Duration = Duration::from_millis(100);

/// Whose mappings [`LateModules`] watches.
pub enum Watch {
    /// `--pid`: one process; its links filter on it.
    Process(u32),
    /// `--exe`: every process that maps this image; links cover them all.
    Interpreter(PathBuf),
}

/// The files mapped after the attach and what became of each.
pub struct LateModules {
    watch: Watch,
    /// Every file already scanned.
    known: HashSet<FileId>,
    /// What each late file contributes, for the report.
    pub records: Vec<LateModule>,
}

impl LateModules {
    #[must_use]
    pub const fn new(watch: Watch, known: HashSet<FileId>) -> Self {
        Self { watch, known, records: Vec::new() }
    }

    /// Whether it is checked every [`QUICK_CHECK`] too: one process's.
    #[must_use]
    pub const fn quick(&self) -> bool {
        matches!(self.watch, Watch::Process(_))
    }

    /// Scans and probes the files mapped since the last check; returns the
    /// notes to tell the user.
    pub fn check(&mut self, session: &mut Session, started: Instant) -> Vec<Note> {
        let (scope, processes) = match &self.watch {
            // An exited target is the exit branch's business.
            Watch::Process(pid) => (*pid, process::code_files(*pid).map(|f| vec![(*pid, f)]).unwrap_or_default()),
            Watch::Interpreter(image) => (ALL_PROCESSES, process::processes_mapping(image)),
        };
        let found: Vec<Module> =
            processes.iter().flat_map(|(pid, files)| modules::new_modules(*pid, files, &mut self.known)).collect();
        let mut notes = Vec::new();
        for module in found {
            let shown = module.display_path.display().to_string();
            let attached =
                std::fs::read(&module.attach_path).map_err(|e| format!("cannot read {shown}: {e}")).and_then(|data| {
                    let sites = crate::plan::late_call_sites(session.plan(), &data);
                    session.attach_late_module(scope, &module, sites).map_err(|e| e.to_string())
                });
            // Counted from once its probes are in, after the scan.
            let at = started.elapsed().as_secs_f64();
            match attached {
                Ok(late) => {
                    for l in late {
                        if l.sites > 0 {
                            notes.push(Note::new(
                                Level::Note,
                                NoteCode::LateModule,
                                format!(
                                    "{shown} was mapped after attaching; its {} calls to {} are probed from {at:.1} s on (earlier calls from it are not counted)",
                                    l.sites, l.symbol
                                ),
                            ));
                        }
                        if let Some(e) = &l.escape {
                            notes.push(Note::new(
                                Level::Warning,
                                NoteCode::LateModuleEscape,
                                format!(
                                    "{shown}, mapped after attaching, lets the address of {} escape ({e}); calls through it are not counted",
                                    l.symbol
                                ),
                            ));
                        }
                        // A file that never calls it (libffi, say) changes
                        // nothing the report says.
                        if l.sites > 0 || l.escape.is_some() {
                            let coverage =
                                LateCoverage::Sites { symbol: l.symbol.to_owned(), sites: l.sites, escape: l.escape };
                            self.records.push(LateModule { path: shown.clone(), since_s: at, coverage });
                        }
                    }
                }
                Err(error) => {
                    notes.push(Note::new(
                        Level::Warning,
                        NoteCode::LateModuleFailed,
                        format!(
                            "{shown} was mapped after attaching, and its calls cannot be probed ({error}); calls from it are not counted"
                        ),
                    ));
                    self.records.push(LateModule {
                        path: shown,
                        since_s: at,
                        coverage: LateCoverage::Failed { error },
                    });
                }
            }
        }
        notes
    }
}
