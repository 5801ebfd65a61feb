//! One line of `--json` output, and how the run ended: the event kinds,
//! each carrying its part of the model, and the summary.

use serde::{Deserialize, Serialize};

use super::{attached::Attached, notes::Note, snapshot::Snapshot};

/// One line of `--json` output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Event {
    /// Every probe is live.
    Attached(Attached),
    /// An `--interval` elapsed: cumulative counts since the attach.
    Interval(Snapshot),
    /// Something the user should know: a fallback, a module mapped late, a
    /// BPF log line.
    Note(Note),
    /// The run ended and every probe is detached.
    Summary(Summary),
}

/// Why the run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// `--duration` elapsed.
    Duration,
    /// SIGINT (Ctrl-C) or SIGTERM.
    Signal(&'static str),
    /// The target process exited.
    TargetExit,
    /// The target process called exec: it runs another program.
    TargetExec,
    /// The report's reader went away (a closed pipe: `| head`).
    OutputClosed,
}

impl End {
    /// The JSON `end` value.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Duration => "duration",
            Self::Signal(_) => "signal",
            Self::TargetExit => "target-exit",
            Self::TargetExec => "target-exec",
            Self::OutputClosed => "output-closed",
        }
    }
}

/// Why the run ended, as the JSON `end` says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EndKind {
    Duration,
    Signal,
    TargetExit,
    TargetExec,
    OutputClosed,
}

/// The last counts, once every probe is detached.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    #[serde(flatten)]
    pub snapshot: Snapshot,
    /// `duration`, `signal`, `target-exit`, `target-exec` or
    /// `output-closed`.
    pub end: EndKind,
    /// With `end` `signal`: which.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
}

impl Summary {
    #[must_use]
    pub fn new(snapshot: Snapshot, end: End) -> Self {
        let signal = match end {
            End::Signal(name) => Some(name.to_owned()),
            End::Duration | End::TargetExit | End::TargetExec | End::OutputClosed => None,
        };
        let kind = match end {
            End::Duration => EndKind::Duration,
            End::Signal(_) => EndKind::Signal,
            End::TargetExit => EndKind::TargetExit,
            End::TargetExec => EndKind::TargetExec,
            End::OutputClosed => EndKind::OutputClosed,
        };
        Self { snapshot, end: kind, signal }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        notes::{Level, NoteCode},
        snapshot::ProbeCounts,
    };

    /// Lines the previous tracer (before this model) wrote, for runs with
    /// `--returns`, `--budget`, call sites and `--exe`, then lines of this
    /// one with what it added (notes, `exited`, late modules, rates, hits,
    /// sites by kind, cost): each must read into the model and write back
    /// byte for byte.
    const SAMPLES: &str =
        concat!(include_str!("../../tests/data/events.jsonl"), include_str!("../../tests/data/events-current.jsonl"));

    #[test]
    fn every_event_round_trips() {
        let mut types = std::collections::HashSet::new();
        for line in SAMPLES.lines().filter(|l| !l.is_empty()) {
            let event: Event = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
            types.insert(std::mem::discriminant(&event));
            assert_eq!(serde_json::to_string(&event).unwrap(), line);
        }
        let fields = [
            "exited",
            "hits",
            "calls_per_s",
            "bytes_per_s",
            "measures_bytes",
            "\"code\":\"bpf_log\"",
            "\"sites\":58",
            "\"sites\":{\"_Py_NewReference\":{\"emulated\":2,\"single_stepped\":208}",
            "\"cost\":{\"estimate\":true",
            "overhead_fraction_low",
            "\"code\":\"high_cost\"",
            "\"gc\":{\"source\":\"markers\",\"detail\"",
            "\"gc\":{\"source\":\"markers\",\"generations\"",
            "\"gc\":{\"source\":\"function\",\"detail\"",
            "\"gc\":{\"source\":\"function\",\"reason\"",
            "\"gc\":{\"source\":\"none\",\"detail\"",
            "\"gc\":{\"source\":\"none\",\"reason\"",
            "\"caveat\":",
            "\"semaphore\":",
            "\"return\":true",
            "\"level\":\"warning\",\"code\":\"gc\"",
            "\"level\":\"note\",\"code\":\"gc\"",
            "\"collections_per_s\":",
            "\"pids\":{\"",
            "\"gc_unmatched\":0",
        ];
        for field in fields {
            assert!(SAMPLES.contains(field), "the samples lack {field}");
        }
        let note = Event::Note(Note::new(Level::Warning, NoteCode::LinkFallback, "no multi links"));
        let text = serde_json::to_string(&note).unwrap();
        assert_eq!(text, r#"{"type":"note","level":"warning","code":"link_fallback","message":"no multi links"}"#);
        assert_eq!(serde_json::from_str::<Event>(&text).unwrap(), note);
        types.insert(std::mem::discriminant(&note));
        assert_eq!(types.len(), 4, "the samples hold attached, interval and summary lines");
    }

    #[test]
    fn end_names() {
        assert_eq!(End::Duration.as_str(), "duration");
        assert_eq!(End::TargetExit.as_str(), "target-exit");
        assert_eq!(End::Signal("SIGTERM").as_str(), "signal");
        let s = Summary::new(Snapshot::default(), End::Signal("SIGTERM"));
        assert_eq!((s.end, s.signal.as_deref()), (EndKind::Signal, Some("SIGTERM")));
        assert_eq!(serde_json::to_value(EndKind::TargetExit).unwrap(), "target-exit");
        assert_eq!(Summary::new(Snapshot::default(), End::TargetExit).signal, None);
    }

    #[test]
    fn rates_are_per_interval_and_bytes_only_where_measured() {
        let line = SAMPLES.lines().find(|l| l.starts_with(r#"{"type":"attached""#)).unwrap();
        let Event::Attached(mut attached) = serde_json::from_str(line).unwrap() else { panic!() };
        attached.measures_bytes = vec!["PyObject_Malloc".into()];
        let counts = ProbeCounts::new;
        let snap = |elapsed_s, scale: u64| Snapshot {
            elapsed_s,
            probes: [
                ("_Py_NewReference".to_owned(), counts(10 * scale, 0)),
                ("PyObject_Malloc".to_owned(), counts(4 * scale, 4000 * scale)),
            ]
            .into_iter()
            .collect(),
            ..Snapshot::default()
        };
        let first = snap(1.0, 1);
        let mut second = snap(2.0, 3);
        second.compute_rates(&attached, Some(&first));
        assert_eq!(second.probes["_Py_NewReference"].calls_per_s, Some(20.0));
        assert_eq!(second.probes["_Py_NewReference"].bytes_per_s, None);
        assert_eq!(second.probes["PyObject_Malloc"].bytes_per_s, Some(8000.0));
        let mut whole = snap(4.0, 4);
        whole.compute_rates(&attached, None);
        assert_eq!(whole.probes["PyObject_Malloc"].calls_per_s, Some(4.0));
    }
}
