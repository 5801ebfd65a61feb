//! With `--stacks`: telling the kernel where each traced process's frames
//! are, and naming the stacks it counted. The kernel keys each count by a
//! hash of the stack's (code object, instruction) frames; each stack is
//! resolved once per process, while the process lives, to (function, file,
//! line) frames through [`crate::stacks::Process`].

use std::{
    collections::{BTreeMap, HashMap},
    os::unix::fs::MetadataExt as _,
    time::Instant,
};

use tracer_common::{
    counter::Counter,
    stack::{self, NO_OFFSET, StackKey, WalkConfig},
};

use crate::{
    kernel::{AttachError, Session},
    model::{Level, Note, NoteCode, Site, SiteFrame, StackCount, StackCoverage},
    plan::Plan,
    python::frames::{CodeRef, FrameLink, InstrKind},
    stacks::{CurrentThreadState, Process},
    unwind::Native,
};

/// A resolved stack: its Python frames, innermost first.
#[derive(Clone, Debug)]
struct Resolved {
    frames: Vec<SiteFrame>,
    truncated: bool,
    /// How many frames each C-level call of the eval loop runs, innermost
    /// first, where entry frames show it.
    eval_calls: Option<Vec<u32>>,
}

/// Where each process's frames are, and the names of its stacks.
#[derive(Debug)]
pub struct StackNames {
    /// The probe slots whose events get stacks.
    slots: Vec<u32>,
    depth: u32,
    sample: u64,
    top: usize,
    /// Each process tried, with its reader, or why it has none.
    processes: HashMap<u32, Result<Process, String>>,
    /// Processes that cannot have stacks, not told yet.
    untold: Vec<(u32, String)>,
    /// Whether traced processes exit and free their entries in the
    /// kernel's table of walks (`--exe`), so that one it had no room for
    /// is tried again.
    retry: bool,
    /// Processes the kernel's table of walks had no room for, with their
    /// reader and walk: tried again at every read, with `retry`.
    waiting: HashMap<u32, (Process, WalkConfig)>,
    /// Processes given their walk after waiting for room, and when, not
    /// told yet ([`Self::take_notes`]).
    admitted: Vec<(u32, Instant)>,
    resolved: HashMap<(u32, u64), Result<Resolved, String>>,
    /// With `--native-stacks`: the unwinder's modules and the native
    /// stacks' names.
    native: Option<Native>,
    /// Native stacks resolved, by (process, native hash).
    native_resolved: HashMap<(u32, u64), crate::unwind::Resolved>,
}

impl StackNames {
    #[must_use]
    /// With `retry` (`--exe`, where traced processes exit and free their
    /// entries), a process the kernel's table of walks has no room for is
    /// tried again at every [`Self::prepare`].
    pub fn new(slots: Vec<u32>, depth: u32, sample: u64, top: usize, native: Option<Native>, retry: bool) -> Self {
        Self {
            slots,
            depth,
            sample,
            top,
            processes: HashMap::new(),
            untold: Vec::new(),
            retry,
            waiting: HashMap::new(),
            admitted: Vec::new(),
            resolved: HashMap::new(),
            native,
            native_resolved: HashMap::new(),
        }
    }

    /// With `--native-stacks`, the notes on modules or processes whose
    /// native frames cannot be unwound, since the last call.
    pub fn take_native_untold(&mut self) -> Vec<String> {
        self.native.as_mut().map(Native::take_untold).unwrap_or_default()
    }

    /// With `--native-stacks`, what each module gave the unwinder.
    #[must_use]
    pub fn native_modules(&self) -> Option<Vec<crate::model::NativeModule>> {
        self.native.as_ref().map(Native::modules)
    }

    /// Whether probe `slot`'s events get stacks.
    #[must_use]
    pub fn has_stacks(&self, slot: u32) -> bool {
        self.slots.contains(&slot)
    }

    /// Tells the kernel where `pid`'s frames are, once per process; a
    /// process whose frames cannot be found is told once (see
    /// [`Self::take_untold`]) and its events have no stacks. One the
    /// kernel's table had no room for is tried again at every call, and
    /// told again when it gets its walk ([`Self::take_notes`]).
    pub fn prepare(&mut self, session: &mut Session, pid: u32) -> Result<(), AttachError> {
        if let Some((_, config)) = self.waiting.get(&pid) {
            match session.set_walk(pid, *config) {
                Ok(()) => {
                    if let Some((process, _)) = self.waiting.remove(&pid) {
                        self.processes.insert(pid, Ok(process));
                    }
                    self.admitted.push((pid, Instant::now()));
                }
                Err(e) if e.is_map_full() => {}
                Err(e) => return Err(e),
            }
            return Ok(());
        }
        if self.processes.contains_key(&pid) {
            return Ok(());
        }
        let opened = Process::open(pid).map_err(|e| e.to_string()).and_then(|p| {
            let config = walk_config(&p, pid, self.depth)?;
            Ok((p, config))
        });
        match opened {
            Ok((process, config)) => {
                // The native tables first: the walk's config is what turns
                // the process's stacks on.
                if let Some(native) = self.native.as_mut()
                    && let Err(why) = native.prepare(session, pid)
                {
                    native.push_untold(format!("no native stacks for PID {pid}: {why}"));
                }
                // A walk the kernel has no room for (more processes than
                // the map holds, with --exe) leaves this one without
                // stacks, said and counted (`stack_no_config`), not the run,
                // until a traced process exits and frees an entry.
                match session.set_walk(pid, config) {
                    Ok(()) => {
                        self.processes.insert(pid, Ok(process));
                    }
                    Err(e) if e.is_map_full() => {
                        let why = e.to_string();
                        if self.retry {
                            let again = format!("{why}; tried again at every interval, as traced processes exit");
                            self.untold.push((pid, again));
                            self.waiting.insert(pid, (process, config));
                        } else {
                            self.untold.push((pid, why.clone()));
                        }
                        self.processes.insert(pid, Err(why));
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(why) => {
                self.untold.push((pid, why.clone()));
                self.processes.insert(pid, Err(why));
            }
        }
        Ok(())
    }

    /// What to tell since the last call: processes without stacks and why,
    /// processes given their walk after waiting for room (when, into the
    /// run that began at `started`), modules or processes without native
    /// stacks.
    pub fn take_notes(&mut self, started: Instant) -> Vec<Note> {
        let mut notes: Vec<Note> = self
            .take_untold()
            .into_iter()
            .map(|(pid, why)| {
                Note::new(Level::Warning, NoteCode::NoStacks, format!("no Python stacks for PID {pid}: {why}"))
            })
            .collect();
        notes.extend(std::mem::take(&mut self.admitted).into_iter().map(|(pid, at)| {
            Note::new(
                Level::Note,
                NoteCode::StacksLate,
                format!(
                    "Python stacks for PID {pid} from {:.1} s on: BPF map WALKS has room for it now; its events before then are counted under no stack (stack_no_config)",
                    at.saturating_duration_since(started).as_secs_f64()
                ),
            )
        }));
        notes.extend(
            self.take_native_untold().into_iter().map(|why| Note::new(Level::Warning, NoteCode::NoNativeStacks, why)),
        );
        notes
    }

    /// `pid` has exited: it no longer waits for room, and a later process
    /// given its PID is read anew (the stacks it resolved keep their
    /// names).
    pub fn forget(&mut self, pid: u32) {
        self.waiting.remove(&pid);
        self.processes.remove(&pid);
    }

    /// `pid` cannot be watched for its exit, so it would be tried again
    /// after it, and could take an entry another process freed for good:
    /// it waits no more (tracer warns that it cannot watch it).
    pub fn give_up(&mut self, pid: u32) {
        self.waiting.remove(&pid);
    }

    /// With `--leaks`, the stack of hash `hash` in `pid`, innermost frame
    /// first, and whether it was cut; resolved now where no count named it
    /// yet. Err says why its frames cannot be named.
    pub fn site(&mut self, session: &Session, pid: u32, hash: u64) -> Result<(Vec<SiteFrame>, bool), String> {
        if !self.resolved.contains_key(&(pid, hash)) {
            let resolved = match self.processes.get_mut(&pid) {
                Some(Ok(process)) => match session.stack(hash) {
                    Ok(Some(raw)) => resolve(process, &raw),
                    Ok(None) => Err("the kernel did not keep its frames (stacks_full)".to_owned()),
                    Err(e) => Err(e.to_string()),
                },
                Some(Err(why)) => Err(why.clone()),
                None => Err("tracer did not read its process's frames".to_owned()),
            };
            self.resolved.insert((pid, hash), resolved);
        }
        match self.resolved.get(&(pid, hash)) {
            Some(Ok(r)) => Ok((r.frames.clone(), r.truncated)),
            Some(Err(why)) => Err(why.clone()),
            None => Err("not resolved".to_owned()),
        }
    }

    /// `--sample N`'s N.
    #[must_use]
    pub const fn sample(&self) -> u64 {
        self.sample
    }

    /// The processes that have no stacks, with why, since the last call.
    pub fn take_untold(&mut self) -> Vec<(u32, String)> {
        std::mem::take(&mut self.untold)
    }

    /// Resolves every stack of `counts` not resolved yet, of processes that
    /// still run (`live`).
    pub fn learn(&mut self, session: &Session, counts: &[(StackKey, Counter)], live: &[u32]) {
        for (key, _) in counts {
            if !live.contains(&key.tgid) || self.resolved.contains_key(&(key.tgid, key.stack)) {
                continue;
            }
            let Some(Ok(process)) = self.processes.get_mut(&key.tgid) else { continue };
            let resolved = match session.stack(key.stack) {
                Ok(Some(raw)) => resolve(process, &raw),
                Ok(None) => Err("the kernel did not keep its frames (stacks_full)".to_owned()),
                Err(e) => Err(e.to_string()),
            };
            self.resolved.insert((key.tgid, key.stack), resolved);
        }
        if let Some(native) = self.native.as_mut() {
            for (key, _) in counts {
                if live.contains(&key.tgid) && !self.native_resolved.contains_key(&(key.tgid, key.native)) {
                    let r = native.resolve(session, key.tgid, key.native);
                    self.native_resolved.insert((key.tgid, key.native), r);
                }
            }
        }
    }

    /// Every stack of `counts` with its counts (scaled by `--sample`), most
    /// calls first.
    #[must_use]
    pub fn stacks(&self, plan: &Plan, counts: &[(StackKey, Counter)]) -> Vec<StackCount> {
        let mut out: Vec<StackCount> = counts
            .iter()
            .map(|(key, c)| {
                let probe = plan.probes.get(key.slot as usize).map_or("?", |p| p.symbol).to_owned();
                let (frames, truncated, eval_calls) = match self.resolved.get(&(key.tgid, key.stack)) {
                    Some(Ok(r)) => (r.frames.clone(), r.truncated, r.eval_calls.clone()),
                    Some(Err(why)) => (vec![unresolved(why)], false, None),
                    None => (vec![unresolved("the process exited before tracer read its frames")], false, None),
                };
                let eval_calls = eval_calls.filter(|_| self.native.is_some());
                let native = self.native.as_ref().map(|_| self.native_resolved.get(&(key.tgid, key.native)));
                let (native, native_end) = match native {
                    None => (None, None),
                    Some(Some(r)) => (Some(r.frames.clone()), r.end.clone()),
                    Some(None) => {
                        (Some(Vec::new()), Some("the process exited before tracer read its frames".to_owned()))
                    }
                };
                StackCount {
                    probe,
                    frames,
                    truncated,
                    native,
                    eval_calls,
                    native_end,
                    calls: c.calls.saturating_mul(self.sample),
                    bytes: c.bytes.saturating_mul(self.sample),
                }
            })
            .collect();
        out.sort_by_key(|s| std::cmp::Reverse(s.calls));
        out
    }

    /// The `--top` sites: the innermost Python frames of `stacks`, with
    /// their stacks' counts summed, most calls first.
    #[must_use]
    pub fn sites(&self, stacks: &[StackCount]) -> Vec<Site> {
        let mut by_site: BTreeMap<(String, String, Option<u32>), (u64, u64)> = BTreeMap::new();
        for s in stacks {
            let f = s.frames.first().cloned().unwrap_or_else(|| SiteFrame {
                function: "<no Python frame>".to_owned(),
                file: String::new(),
                line: None,
            });
            let total = by_site.entry((f.function, f.file, f.line)).or_default();
            *total = (total.0.saturating_add(s.calls), total.1.saturating_add(s.bytes));
        }
        let mut sites: Vec<Site> = by_site
            .into_iter()
            .map(|((function, file, line), (calls, bytes))| Site {
                function,
                file,
                line,
                calls,
                bytes,
                estimate: self.sample > 1,
                calls_ci95: (self.sample > 1).then(|| ci95(calls, self.sample)),
            })
            .collect();
        sites.sort_by(|a, b| b.calls.cmp(&a.calls).then_with(|| b.bytes.cmp(&a.bytes)));
        sites.truncate(self.top);
        sites
    }

    /// How many of the events of the probes with stacks were counted under
    /// one.
    #[must_use]
    pub fn coverage(&self, events: u64, stacks: &[StackCount]) -> StackCoverage {
        StackCoverage {
            sample: self.sample,
            events,
            stacked: stacks.iter().map(|s| s.calls).sum(),
            truncated: stacks.iter().filter(|s| s.truncated).map(|s| s.calls).sum(),
            estimate: self.sample > 1,
        }
    }
}

/// The 95% confidence interval of a count estimated as `estimate` (the
/// sampled events times `every`) when each event is sampled with
/// probability 1/`every`: the sampled count is binomial, so the estimate's
/// variance is about `estimate` × (`every` − 1); normal approximation.
#[allow(clippy::cast_precision_loss, reason = "an interval, not a count")]
fn ci95(estimate: u64, every: u64) -> [f64; 2] {
    let (c, n) = (estimate as f64, every as f64);
    let half = 1.96 * (c * (n - 1.0)).sqrt();
    [(c - half).max(0.0), c + half]
}

/// A frame that stands for a stack whose frames could not be named.
fn unresolved(why: &str) -> SiteFrame {
    SiteFrame { function: format!("<unresolved: {why}>"), file: String::new(), line: None }
}

/// The frames of `raw` that are Python functions', named.
fn resolve(process: &mut Process, raw: &stack::Stack) -> Result<Resolved, String> {
    let depth = usize::try_from(raw.depth).unwrap_or(0).min(stack::MAX_DEPTH);
    let mut frames = Vec::with_capacity(depth);
    // 3.12+: each C-level call of the eval loop pushes an entry frame
    // (owned by the C stack; 3.14 also ends the thread's frames with a base
    // frame) below the first frame it runs. 3.11 marks the entry with a flag
    // the walk does not read.
    let first_non_python = process.offsets().frame.first_non_python_owner;
    let marks = process.version.minor >= 12;
    let (mut calls, mut in_call) = (Vec::new(), 0u32);
    for f in &raw.frames[..depth] {
        // The kernel keeps the offset's low 32 bits; a frame that has not
        // started (3.11) is at -2.
        #[allow(clippy::cast_possible_wrap, reason = "sign-extends the offset the kernel cut to 32 bits")]
        let offset = i64::from(f.offset as i32);
        let owner = u8::try_from(f.owner).unwrap_or(u8::MAX);
        if let Some(frame) = process.resolve(f.code, offset, owner).map_err(|e| e.to_string())? {
            frames.push(SiteFrame { function: frame.function, file: frame.file, line: frame.line });
            in_call += 1;
        } else if owner >= first_non_python && in_call > 0 {
            calls.push(std::mem::take(&mut in_call));
        }
    }
    if in_call > 0 {
        calls.push(in_call);
    }
    Ok(Resolved { frames, truncated: raw.truncated != 0, eval_calls: marks.then_some(calls) })
}

/// What the kernel needs to walk `pid`'s frames.
fn walk_config(process: &Process, pid: u32, depth: u32) -> Result<WalkConfig, String> {
    let table = process.offsets();
    let mut config = WalkConfig { depth, ..WalkConfig::default() };
    match process.current_thread_state()? {
        CurrentThreadState::Gilstate { address, .. } => {
            config.current = stack::current::AT_ADDRESS;
            config.tstate_at = address;
        }
        CurrentThreadState::FsRelative { offset } => {
            config.current = stack::current::FS_RELATIVE;
            config.tstate_at = offset.cast_unsigned();
            config.task_fsbase = crate::kernel::btf::task_fsbase().map_err(|e| e.to_string())?;
        }
        CurrentThreadState::Dynamic { module, offset } => {
            config.current = stack::current::TLS_MODULE;
            config.tstate_at = offset;
            config.tls_module = module;
            config.task_fsbase = crate::kernel::btf::task_fsbase().map_err(|e| e.to_string())?;
        }
    }
    if let Some(native) = table.thread.native_thread_id {
        config.native_thread_id = native;
        config.thread_check = stack::thread_check::NATIVE_TID;
    } else {
        // 3.9, 3.10: the state's pthread_t, against the thread's fsbase.
        config.native_thread_id = table.thread.thread_id;
        config.thread_check = stack::thread_check::PTHREAD_FSBASE;
        config.task_fsbase = crate::kernel::btf::task_fsbase().map_err(|e| e.to_string())?;
    }
    (config.cframe, config.current_frame) = match table.thread.frame {
        FrameLink::ViaCFrame { cframe, current_frame } => (cframe, current_frame),
        FrameLink::Direct { current_frame } | FrameLink::FrameObject { frame: current_frame } => {
            (NO_OFFSET, current_frame)
        }
    };
    config.frame_code = table.frame.code;
    config.frame_previous = table.frame.previous;
    config.frame_instr = table.frame.instr;
    // A frame object has no owner: the walk masks off whatever byte it
    // reads (`WalkConfig::frame_head`), so any byte of the head will do.
    config.frame_owner = table.frame.owner.unwrap_or(0);
    (config.frame_kind, config.lasti_unit) = match table.frame.instr_kind {
        InstrKind::Pointer => (stack::frame_kind::INTERPRETER, 0),
        InstrKind::LastI { unit } => (stack::frame_kind::LASTI, u32::from(unit)),
    };
    config.code_tag_mask = match table.frame.code_ref {
        CodeRef::Pointer => 0,
        CodeRef::Tagged { mask } => mask,
    };
    config.code_adaptive = table.code.code_adaptive.unwrap_or(0);
    // The thread ids the target's thread states hold are in its own PID
    // namespace.
    let ns = std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .map_err(|e| format!("cannot read the PID namespace of PID {pid}: {e}"))?;
    config.pid_ns_dev = ns.dev();
    config.pid_ns_ino = ns.ino();
    if config.frame_head().is_none() {
        return Err(format!(
            "this version's frame fields (code at {}, previous at {}, instruction at {}, owner at {:?}) are not within the first {} bytes the BPF walk reads of each frame",
            config.frame_code,
            config.frame_previous,
            config.frame_instr,
            table.frame.owner,
            stack::FRAME_HEAD
        ));
    }
    Ok(config)
}

/// The slots of the probes `--stacks` names, which must be probed.
pub(super) fn slots(
    r: &crate::discover::Resolved,
    plan: &crate::plan::Plan,
    stacks: &crate::config::StacksConfig,
) -> Result<Vec<u32>, crate::config::ConfigError> {
    let wanted = stacks.events.select(r.abi.probes(), &r.version.to_string())?;
    let mut slots = Vec::new();
    for spec in wanted {
        match plan.probes.iter().find(|p| p.symbol == spec.symbol) {
            Some(p) => slots.push(p.slot),
            // Not in this build, or not probed: only a named one is an error.
            None if matches!(stacks.events, crate::probe::ProbeSelection::Names(_)) => {
                return Err(crate::config::ConfigError::StacksNotProbed { name: spec.symbol.to_owned() });
            }
            None => {}
        }
    }
    if slots.is_empty() {
        return Err(crate::config::ConfigError::StacksNothingProbed);
    }
    Ok(slots)
}
