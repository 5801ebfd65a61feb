//! Notes: what the user should know (a fallback, a module mapped late, a
//! BPF log line), as an event of their own or carried by a plan or bench
//! report.

use serde::{Deserialize, Serialize};

/// How much a note matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Worth knowing; the counts are whole.
    Note,
    /// Some events may not be counted, or something is not as expected.
    Warning,
}

/// What a note is about, for a consumer that acts on some.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoteCode {
    /// `--name` passed over a match tracer may not inspect.
    Target,
    /// `--links auto` fell back to perf-event uprobes.
    LinkFallback,
    /// The kernel's uprobe-multi links filter by thread, so they were
    /// made for every process and the programs keep the target's hits.
    PidFilter,
    /// A module mapped after the attach is probed from now on.
    LateModule,
    /// A late module lets a probed function's address escape.
    LateModuleEscape,
    /// A late module could not be probed.
    LateModuleFailed,
    /// A line a BPF program logged (`--bpf-log`).
    BpfLog,
    /// `_Py_DebugOffsets` disagrees with what tracer expected.
    DebugOffsets,
    /// A traced process cannot be watched for its exit.
    ProcessUnwatched,
    /// tracer's estimated cost to the target passed [`Cost::HIGH`](super::Cost::HIGH) (told
    /// once).
    HighCost,
    /// The cost of a hit could not be calibrated, so no cost is estimated.
    CostUnknown,
    /// With `--stacks`: a traced process's frames cannot be found, so its
    /// events have no stacks.
    NoStacks,
    /// With `--stacks`: a process the kernel's table of walks had no room
    /// for has its stacks from now on (another traced process exited).
    StacksLate,
    /// With `--native-stacks`: a module whose native frames cannot be
    /// unwound (no usable `.eh_frame`), or a process whose cannot.
    NoNativeStacks,
    /// With `--folded` or `--flamegraph`: the file written.
    Written,
    /// Garbage collections cannot be seen in this build (no markers, no
    /// collection function tracer knows), or the function's counts hold
    /// calls the markers would not count.
    Gc,
    /// The production profile's heap census: none can be taken (and
    /// why), one failed, or they are spaced out.
    Heap,
    /// With `--growth`: heap growth cannot be sampled in this target (no
    /// symbol table with pymalloc's slow path, `--exe`), or what its
    /// samples miss.
    Growth,
    /// With `--listen`: where the Prometheus metrics are served.
    Metrics,
    /// `--all`: an interpreter added, or a process or interpreter not
    /// traced.
    Interpreter,
    /// A free probed at the implementation its pointer held (see
    /// `plan::slots`) whose pointer no longer holds it: its counts from
    /// then on are not exact. In `tracer bench`, the frees it probes so.
    FreePointer,
    /// Reads of tracer's maps fell back to a key at a time: the kernel has
    /// no batch lookup for them, or a bucket was busy (told once each).
    MapBatch,
    /// A `--pid` target is stopped (state T or t): its figures are zero
    /// because it runs nothing; or it runs again; or, at the end, for how
    /// long it was.
    Stopped,
}

/// A diagnostic, as an event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Note {
    pub level: Level,
    pub code: NoteCode,
    /// One line for a person.
    pub message: String,
}

impl Note {
    #[must_use]
    pub fn new(level: Level, code: NoteCode, message: impl Into<String>) -> Self {
        Self { level, code, message: message.into() }
    }
}
