//! Outputs. Each reads the events of [`crate::model`] and nothing else;
//! the run loop only ever talks to [`Reporter`].

pub mod exporter;
pub mod files;
mod json;
mod live;
pub mod plan;
pub mod pprof;
pub mod prometheus;
pub mod replay;
pub mod stacks;
mod table;
pub mod top;
mod types;
pub mod written;

use std::io::Write;

pub use json::JsonReporter;
pub use table::TableReporter;

use crate::{config::Format, model::Event};

/// An output format.
pub trait Reporter {
    /// Writes one event.
    fn event(&mut self, event: &Event) -> std::io::Result<()>;
}

/// The reporter for `format`, writing to `out`, with notes for a person on
/// `err` as well.
#[must_use]
pub fn reporter<'a>(format: Format, out: Box<dyn Write + 'a>, err: Box<dyn Write + 'a>) -> Box<dyn Reporter + 'a> {
    match format {
        Format::Table => Box::new(TableReporter::new(out, err)),
        Format::Json => Box::new(JsonReporter::new(out, err)),
        Format::Top => Box::new(top::TopReporter::new(err)),
    }
}

/// A note as a person reads it on stderr: `tracer: note: …` or
/// `tracer: warning: …`.
fn note_line(err: &mut dyn Write, note: &crate::model::Note) -> std::io::Result<()> {
    let level = match note.level {
        crate::model::Level::Note => "note",
        crate::model::Level::Warning => "warning",
    };
    writeln!(err, "tracer: {level}: {}", crate::text::line(&note.message))?;
    err.flush()
}

/// 1234567 -> "1,234,567": exact, and readable at a glance.
pub(crate) fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Two reporters fed the same events: the one a person reads and a record
/// (`--record`), the first's error first.
pub struct Tee<'a>(pub Box<dyn Reporter + 'a>, pub Box<dyn Reporter + 'a>);

impl Reporter for Tee<'_> {
    /// Both are fed even when the first fails (`| head` gone): the record
    /// keeps every event. Where both fail, the second's error is the one
    /// returned: the record's (a full disk, say) is data lost, which the
    /// run reports as an error, where the first's closed pipe alone would
    /// end it as `output-closed`.
    fn event(&mut self, event: &Event) -> std::io::Result<()> {
        let first = self.0.event(event);
        let second = self.1.event(event);
        second.and(first)
    }
}

#[cfg(test)]
mod tee_tests {
    use std::io::{Error, ErrorKind};

    use super::{Reporter, Tee};
    use crate::model::{Event, Level, Note, NoteCode};

    /// A reporter that fails every event with `kind`, or never, and counts
    /// the events it was given.
    struct Fails<'a>(Option<ErrorKind>, &'a std::cell::Cell<usize>);

    impl Reporter for Fails<'_> {
        fn event(&mut self, _: &Event) -> std::io::Result<()> {
            self.1.set(self.1.get() + 1);
            self.0.map_or(Ok(()), |kind| Err(Error::from(kind)))
        }
    }

    #[test]
    fn a_tee_feeds_both_and_a_failing_record_outranks_a_closed_pipe() {
        let event = Event::Note(Note::new(Level::Note, NoteCode::Metrics, "x"));
        let kind = |first, second| {
            let (a, b) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
            let result = Tee(Box::new(Fails(first, &a)), Box::new(Fails(second, &b))).event(&event);
            assert_eq!((a.get(), b.get()), (1, 1), "both fed");
            result.err().map(|e| e.kind())
        };
        assert_eq!(kind(None, None), None);
        assert_eq!(kind(Some(ErrorKind::BrokenPipe), None), Some(ErrorKind::BrokenPipe));
        assert_eq!(kind(None, Some(ErrorKind::StorageFull)), Some(ErrorKind::StorageFull));
        assert_eq!(kind(Some(ErrorKind::BrokenPipe), Some(ErrorKind::StorageFull)), Some(ErrorKind::StorageFull));
    }
}

#[cfg(test)]
pub(crate) mod examples {
    use indexmap::IndexMap;

    use crate::model::{Attached, Counts, Links, ProbeCounts, PythonInfo, Snapshot};

    pub fn attached(pid: Option<u32>) -> Attached {
        Attached {
            mode: None,
            exact_because: None,
            estimated_cost: None,
            started_unix_s: None,
            pid,
            exe: None,
            python: PythonInfo { version: "3.11.7".into(), image: "/lib/libpython3.11.so.1.0".into() },
            pid_in_namespace: None,
            interpreters: Vec::new(),
            probes: vec!["_Py_NewReference".into(), "PyObject_Malloc".into()],
            missing: vec!["PyMem_RawCalloc".into()],
            links: Links::Multi,
            returns: IndexMap::new(),
            return_costs_ns: None,
            call_sites: [("_Py_Dealloc".to_owned(), 10989)].into_iter().collect(),
            call_sites_asked: false,
            placements: IndexMap::new(),
            measures_bytes: vec!["PyObject_Malloc".into()],
            coverage: IndexMap::new(),
            sites: IndexMap::new(),
            gc: None,
            growth: None,
            native: None,
        }
    }

    pub fn counts(calls: u64, bytes: u64) -> ProbeCounts {
        ProbeCounts::new(calls, bytes)
    }

    pub fn snapshot(elapsed_ms: u64, scale: u64) -> Snapshot {
        #[allow(clippy::cast_precision_loss, reason = "small test values")]
        let seconds = elapsed_ms as f64 / 1000.0;
        let per_pid: IndexMap<String, Counts> = [
            ("_Py_NewReference".to_owned(), Counts { calls: 10 * scale, bytes: 0 }),
            ("PyObject_Malloc".to_owned(), Counts { calls: 4 * scale, bytes: 4000 * scale }),
        ]
        .into_iter()
        .collect();
        Snapshot {
            elapsed_s: seconds,
            probes: [
                ("_Py_NewReference".to_owned(), counts(10 * scale, 0)),
                ("PyObject_Malloc".to_owned(), counts(4 * scale, 4000 * scale)),
            ]
            .into_iter()
            .collect(),
            pids: [("77".to_owned(), per_pid)].into_iter().collect(),
            stats: Snapshot::stats_from(
                &[0; tracer_common::stats::STAT_COUNT as usize],
                0,
                crate::kernel::batch::Fallbacks::default(),
            ),
            ..Snapshot::default()
        }
    }

    /// A `--budget` snapshot over 10 s: `windows` windows that traced 0.1 s
    /// at an estimated cost of `overhead`, `_Py_NewReference` estimated at
    /// `calls` per second and `PyObject_Malloc` at 40 calls and 40,000
    /// bytes per second.
    pub fn budget_snapshot(windows: u64, overhead: f64, calls: (f64, Option<[f64; 2]>)) -> Snapshot {
        use crate::{
            model::{Budget, ProbeEstimate},
            plan::HitCosts,
        };
        let mut sample = snapshot(10_000, 1);
        sample.budget = Some(Budget {
            estimates: true,
            percent: 1.0,
            windows,
            traced_s: 0.1,
            traced_fraction: 0.01,
            estimated_overhead_fraction: overhead,
            hit_cost_ns: HitCosts { single_stepped_ns: 16000.0, emulated_ns: 500.0, calibrated_unix_s: None },
            switching_s: 0.0,
            target_cpu_s: Some(5.0),
            slowdown: None,
        });
        sample.probes["_Py_NewReference"].estimate = Some(ProbeEstimate {
            calls_per_s: calls.0,
            calls_per_s_ci95: calls.1,
            bytes_per_s: 0.0,
            bytes_per_s_ci95: None,
            lower_bound: false,
        });
        sample.probes["PyObject_Malloc"].estimate = Some(ProbeEstimate {
            calls_per_s: 40.0,
            calls_per_s_ci95: None,
            bytes_per_s: 40000.0,
            bytes_per_s_ci95: None,
            lower_bound: false,
        });
        sample
    }
}
