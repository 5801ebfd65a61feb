//! `tracer report FILE`: a run's record (`--record`, or `attach --json`'s
//! lines saved) read back into the model's events, and turned into the
//! table, JSON, the summary's files, or the heap's change between two
//! censuses. Nothing here reads the target: the record holds every name.

use std::{io::Write, path::PathBuf};

use indexmap::IndexMap;
use serde::Serialize;
use thiserror::Error;

use crate::{
    error::Classify,
    heap::print::{bytes, thousands},
    model::{Attached, Event, Snapshot, Summary, heap::Heap},
    report::table::heap::{signed_bytes, signed_count},
};

/// A record that cannot be read, or asked what it does not hold.
#[derive(Debug, Error)]
pub enum ReplayError {
    #[error("cannot read {path}: {cause}; pass the file `tracer attach --record FILE` wrote")]
    Read { path: PathBuf, cause: std::io::Error },
    #[error(
        "{path}, line {line}, is not an event tracer writes ({cause}); pass the file `--record` wrote, or `attach --json`'s output"
    )]
    Line { path: PathBuf, line: usize, cause: serde_json::Error },
    #[error("{path} has no attached event first: it is not a whole record of a run")]
    NoAttach { path: PathBuf },
    #[error(
        "{path} has no summary (the run was cut short): its stacks, written only in the summary, are not in the record"
    )]
    NoSummary { path: PathBuf },
    #[error(
        "{path} holds no stacks for {flag}: its run was without --stacks; record one with --stacks (or --top, --folded, --flamegraph)"
    )]
    NoStacks { path: PathBuf, flag: &'static str },
    #[error(
        "{path} holds no growth for {flag}: its run sampled none; record one that does (the production profile with --pid, or --growth)"
    )]
    NoGrowth { path: PathBuf, flag: &'static str },
    #[error(
        "{path} has no heap census to compare at {at} s (its censuses: {taken}); FROM picks the first census at or after it, TO the last at or before it, each time as shown (to 0.1 s) or exact"
    )]
    NoCensus { path: PathBuf, at: f64, taken: String },
    #[error(
        "--diff {from} {to}: both pick census {census} (taken at {taken_s:.1} s), or TO a census before FROM's; pick times further apart"
    )]
    SameCensus { from: f64, to: f64, census: u64, taken_s: f64 },
    #[error("--diff {from} {to}: FROM must come before TO, both at 0 s or later")]
    BadDiff { from: f64, to: f64 },
}

impl Classify for ReplayError {
    fn is_bad_input(&self) -> bool {
        true
    }
}

/// One line of `inner`, up to its end (consumed, not given out): one
/// event, which `serde_json` parses as it reads, so that a line that is no
/// event is refused at its first byte that cannot be one.
struct OneLine<'a, R> {
    inner: &'a mut R,
    done: bool,
    /// The line's bytes given out so far, at most [`LONGEST_LINE`].
    given: usize,
}

/// The longest line read as an event: far above any tracer writes (a
/// summary with every stack runs to megabytes), and a bound on what a
/// file of one endless line (JSON that is no event, which `serde_json`
/// buffers whole to find its `type`) can take.
const LONGEST_LINE: usize = 256 << 20;

impl<R: std::io::BufRead> std::io::Read for OneLine<'_, R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.done || out.is_empty() {
            return Ok(0);
        }
        let buf = self.inner.fill_buf()?;
        // serde_json reads a byte at a time: only what is asked for is
        // searched.
        let buf = &buf[..buf.len().min(out.len())];
        let end = buf.iter().position(|&b| b == b'\n');
        let take = end.unwrap_or(buf.len());
        self.given += take;
        if self.given > LONGEST_LINE {
            return Err(std::io::Error::other(format!(
                "a line over {} MiB, longer than any event tracer writes",
                LONGEST_LINE >> 20
            )));
        }
        out[..take].copy_from_slice(&buf[..take]);
        self.done = end == Some(take);
        self.inner.consume(take + usize::from(self.done));
        Ok(take)
    }
}

/// What the replayed table puts before each recorded note.
pub const RECORDED: &str = "recorded run: ";

/// A run's events, as recorded.
pub struct Record {
    pub path: PathBuf,
    pub events: Vec<Event>,
}

impl Record {
    /// Reads `path`: one event per line, the first the attach.
    ///
    /// Parsed as it is read, not read whole first: a file that is no
    /// record is refused at its first byte that is no event's, whatever
    /// its size (`tracer report /dev/zero` once read until memory ran
    /// out), and one that does not start with the attach at its first
    /// event.
    pub fn read(path: PathBuf) -> Result<Self, ReplayError> {
        use std::io::BufRead as _;
        let read_err = |cause| ReplayError::Read { path: path.clone(), cause };
        let file = std::fs::File::open(&path).map_err(read_err)?;
        let mut reader = std::io::BufReader::new(file);
        let mut events = Vec::new();
        let mut line = 0;
        // Blank lines and a line's leading blanks are passed over.
        while let Some(&first) = reader.fill_buf().map_err(read_err)?.first() {
            if first.is_ascii_whitespace() {
                line += usize::from(first == b'\n');
                reader.consume(1);
                continue;
            }
            line += 1;
            let event: Event =
                serde_json::from_reader(OneLine { inner: &mut reader, done: false, given: 0 }).map_err(|cause| {
                    if cause.is_io() {
                        read_err(cause.into())
                    } else {
                        ReplayError::Line { path: path.clone(), line, cause }
                    }
                })?;
            if events.is_empty() && !matches!(event, Event::Attached(_)) {
                return Err(ReplayError::NoAttach { path });
            }
            events.push(event);
        }
        if events.is_empty() {
            return Err(ReplayError::NoAttach { path });
        }
        Ok(Self { path, events })
    }

    /// The events again, as the table (`json` false) or as the JSON lines
    /// of the record itself, to `out`. Each recorded note is the recorded
    /// run's, and said to be on `err` ([`RECORDED`] before it), so that
    /// "wrote a pprof profile … to FILE" or "serving Prometheus metrics at
    /// …" is not taken for something `tracer report` did now; what the
    /// report itself writes it says in notes of its own, without the mark.
    pub fn replay(&self, json: bool, out: impl Write, mut err: impl Write) -> std::io::Result<()> {
        let marked = |event: &Event| match event {
            Event::Note(note) => {
                let mut note = note.clone();
                note.message.insert_str(0, RECORDED);
                Some(note)
            }
            _ => None,
        };
        if json {
            // The JSON is the record, its notes as they were.
            let mut reporter = super::JsonReporter::new(out, std::io::sink());
            for event in &self.events {
                super::Reporter::event(&mut reporter, event)?;
                if let Some(note) = marked(event) {
                    super::note_line(&mut err, &note)?;
                }
            }
        } else {
            let mut reporter = super::TableReporter::new(out, err);
            for event in &self.events {
                let note = marked(event).map(Event::Note);
                super::Reporter::event(&mut reporter, note.as_ref().unwrap_or(event))?;
            }
        }
        Ok(())
    }

    /// The attach.
    #[must_use]
    pub fn attached(&self) -> Option<&Attached> {
        self.events.iter().find_map(|e| match e {
            Event::Attached(a) => Some(a),
            _ => None,
        })
    }

    /// The summary, which the files are written from.
    pub fn summary(&self) -> Result<&Summary, ReplayError> {
        self.events
            .iter()
            .find_map(|e| match e {
                Event::Summary(s) => Some(s),
                _ => None,
            })
            .ok_or_else(|| ReplayError::NoSummary { path: self.path.clone() })
    }

    /// The summary, for the files of the stacks (`stacks`, the first
    /// flag given of them) and of growth (`growth`): refused where its run
    /// recorded no stacks, or sampled no growth, which no record of it can
    /// have. A run that did, and found none, gets its summary: the files
    /// are then not written, and a warning says so, as at the end of the
    /// run ([`super::written`]).
    pub fn summary_for(
        &self,
        stacks: Option<&'static str>,
        growth: Option<&'static str>,
    ) -> Result<&Summary, ReplayError> {
        let summary = self.summary()?;
        if let Some(flag) = stacks.filter(|_| summary.snapshot.stacks.is_none()) {
            return Err(ReplayError::NoStacks { path: self.path.clone(), flag });
        }
        if let Some(flag) = growth.filter(|_| summary.snapshot.growth.is_none()) {
            return Err(ReplayError::NoGrowth { path: self.path.clone(), flag });
        }
        Ok(summary)
    }

    /// The target as titles name it: `PID N`, or the executable.
    #[must_use]
    pub fn target(&self) -> String {
        match self.attached() {
            Some(Attached { pid: Some(pid), .. }) => format!("PID {pid}"),
            Some(a) => a.exe.clone().unwrap_or_else(|| a.python.image.clone()),
            None => String::new(),
        }
    }

    /// Every census, in order, with the snapshot it came in.
    fn censuses(&self) -> Vec<&Heap> {
        let snapshots = self.events.iter().filter_map(|e| match e {
            Event::Interval(s) => Some(s),
            Event::Summary(s) => Some(&s.snapshot),
            _ => None,
        });
        let mut out: Vec<&Heap> = Vec::new();
        for heap in snapshots.filter_map(|s: &Snapshot| s.heap.as_ref()) {
            if out.last().is_none_or(|h| h.census != heap.census) {
                out.push(heap);
            }
        }
        out
    }

    /// The heap's change from the first census taken at or after `from`
    /// seconds to the last taken at or before `to`, each census's time
    /// taken as the table shows it (to 0.1 s) or as it is, whichever
    /// matches: "census 2 at 11.0 s" is at or before 11 when it was taken
    /// at 11.003 s, and a time copied from the JSON matches exactly.
    pub fn diff(&self, from: f64, to: f64) -> Result<HeapDiff, ReplayError> {
        if !(from >= 0.0 && to > from) {
            return Err(ReplayError::BadDiff { from, to });
        }
        let censuses = self.censuses();
        let taken = || match (censuses.first(), censuses.last()) {
            (Some(first), Some(last)) => {
                format!("{} from {:.1} s to {:.1} s", censuses.len(), first.taken_s, last.taken_s)
            }
            _ => "none".to_owned(),
        };
        let a = censuses.iter().copied().find(|h| h.taken_s >= from || shown_s(h.taken_s) >= from);
        let a = a.ok_or_else(|| ReplayError::NoCensus { path: self.path.clone(), at: from, taken: taken() })?;
        let b = censuses.iter().copied().rev().find(|h| h.taken_s <= to || shown_s(h.taken_s) <= to);
        let b = b.ok_or_else(|| ReplayError::NoCensus { path: self.path.clone(), at: to, taken: taken() })?;
        if a.census >= b.census {
            return Err(ReplayError::SameCensus { from, to, census: a.census, taken_s: a.taken_s });
        }
        Ok(HeapDiff::between(a, b))
    }
}

/// `seconds` as the tables show a census's time (`{:.1}`), read back: the
/// very rounding the user read.
fn shown_s(seconds: f64) -> f64 {
    format!("{seconds:.1}").parse().unwrap_or(seconds)
}

/// One census's figures of a type, where its listing has the type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Listed {
    pub count: u64,
    pub bytes: u64,
}

/// A type's figures in the two censuses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TypeDiff {
    pub name: String,
    /// `null` where that census did not list the type while it summed
    /// others under `other` (it was not among its top types by bytes or
    /// fastest-growing); 0 where it listed every type but this one.
    pub from: Option<Listed>,
    pub to: Option<Listed>,
}

impl TypeDiff {
    /// The change, where both censuses list the type.
    fn change(&self) -> Option<(i64, i64)> {
        let (a, b) = (self.from?, self.to?);
        Some((signed(b.count) - signed(a.count), signed(b.bytes) - signed(a.bytes)))
    }
}

fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The heap's change between two censuses.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HeapDiff {
    pub from_census: u64,
    pub from_s: f64,
    pub to_census: u64,
    pub to_s: f64,
    /// Objects and bytes the two censuses account for in all.
    pub from_total: Listed,
    pub to_total: Listed,
    /// Every type either lists, most bytes gained first; types that only
    /// one lists last.
    pub types: Vec<TypeDiff>,
}

impl HeapDiff {
    fn between(a: &Heap, b: &Heap) -> Self {
        // A census that lists every type (nothing under `other`) says that
        // a type it does not list had no object then.
        let whole = |h: &Heap| h.other.is_none_or(|o| o.types == 0) && h.partial.is_empty();
        let zero = Listed { count: 0, bytes: 0 };
        let mut types: IndexMap<&str, TypeDiff> = IndexMap::new();
        for (heap, is_to) in [(a, false), (b, true)] {
            for t in &heap.types {
                let entry = types.entry(t.name.as_str()).or_insert_with(|| TypeDiff {
                    name: t.name.clone(),
                    from: None,
                    to: None,
                });
                let listed = Some(Listed { count: t.count, bytes: t.bytes });
                if is_to {
                    entry.to = listed;
                } else {
                    entry.from = listed;
                }
            }
        }
        for t in types.values_mut() {
            if t.from.is_none() && whole(a) {
                t.from = Some(zero);
            }
            if t.to.is_none() && whole(b) {
                t.to = Some(zero);
            }
        }
        let mut types: Vec<TypeDiff> = types.into_values().collect();
        types.sort_by_key(|t| (t.change().is_none(), std::cmp::Reverse(t.change().map_or(0, |c| c.1))));
        let total = |h: &Heap| {
            let other = h.other.unwrap_or_default();
            Listed {
                count: h.types.iter().map(|t| t.count).sum::<u64>() + other.count,
                bytes: h.types.iter().map(|t| t.bytes).sum::<u64>() + other.bytes,
            }
        };
        Self {
            from_census: a.census,
            from_s: a.taken_s,
            to_census: b.census,
            to_s: b.taken_s,
            from_total: total(a),
            to_total: total(b),
            types,
        }
    }

    /// The table: the change in all, then the `top` types that changed
    /// most in bytes, then those only one census lists.
    pub fn table(&self, out: &mut impl Write, top: usize) -> std::io::Result<()> {
        let (a, b) = (self.from_total, self.to_total);
        writeln!(
            out,
            "heap change from census {} ({:.1} s) to census {} ({:.1} s): {} objects, {} ({} objects, {} then)",
            self.from_census,
            self.from_s,
            self.to_census,
            self.to_s,
            signed_count(signed(b.count) - signed(a.count)),
            signed_bytes(signed(b.bytes) - signed(a.bytes)),
            thousands(b.count),
            bytes(b.bytes),
        )?;
        writeln!(out, "{:>12} {:>11} {:>11} {:>11}  type", "objects", "change", "bytes", "change")?;
        let mut unlisted = 0;
        for t in self.types.iter().take(top) {
            let shown = crate::text::display(&t.name);
            match (t.to, t.change()) {
                (Some(to), Some((count, size))) => writeln!(
                    out,
                    "{:>12} {:>11} {:>11} {:>11}  {shown}",
                    thousands(to.count),
                    signed_count(count),
                    bytes(to.bytes),
                    signed_bytes(size)
                )?,
                (to, _) => {
                    unlisted += 1;
                    let (count, size) =
                        to.map_or(("-".to_owned(), "-".to_owned()), |l| (thousands(l.count), bytes(l.bytes)));
                    writeln!(
                        out,
                        "{count:>12} {:>11} {size:>11} {:>11}  {shown} (listed by one census only)",
                        "?", "?"
                    )?;
                }
            }
        }
        if unlisted > 0 {
            writeln!(
                out,
                "  ?: a census lists its types with the most bytes and the fastest-growing; a type it did not list is in its `other`, so its change is not known"
            )?;
        }
        if self.types.len() > top {
            writeln!(out, "  ({} more types in --json)", self.types.len() - top)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::heap::{HeapCost, Totals};

    /// A record whose censuses were taken at `times`, one an interval.
    fn record(times: &[f64]) -> Record {
        let mut events = vec![Event::Attached(crate::report::examples::attached(Some(1)))];
        for (i, &taken_s) in times.iter().enumerate() {
            let heap = Heap {
                census: i as u64 + 1,
                taken_s,
                since_s: None,
                every: 1,
                types: Vec::new(),
                other: None,
                totals: Totals::default(),
                partial: Vec::new(),
                cost: HeapCost::default(),
            };
            events.push(Event::Interval(Snapshot { heap: Some(heap), ..Snapshot::default() }));
        }
        Record { path: PathBuf::from("rec.jsonl"), events }
    }

    /// What is no record is refused at once, by its first bytes: an
    /// endless device, a file of another kind, a directory, a record cut
    /// in its first line.
    #[test]
    fn what_is_no_record_is_refused_without_reading_it_all() {
        let message = |path: &str| Record::read(PathBuf::from(path)).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message("/dev/zero").starts_with("/dev/zero, line 1, is not an event tracer writes"));
        assert!(message("/etc/passwd").starts_with("/etc/passwd, line 1, is not an event tracer writes"));
        assert!(message("/tmp").starts_with("cannot read /tmp: Is a directory"), "{}", message("/tmp"));
        assert_eq!(message("/dev/null"), "/dev/null has no attached event first: it is not a whole record of a run");
        let dir = std::env::temp_dir().join(format!("tracer-replay-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let attached = serde_json::to_string(&Event::Attached(crate::report::examples::attached(Some(1)))).unwrap();
        let cases = [
            ("whole", format!("{attached}\n\n"), None),
            ("cut", format!("{attached}\n{}", &attached[..20]), Some("line 2")),
            ("late", format!("\n\n{{\"type\":\"summary\"}}\n{attached}\n"), Some("line 3")),
            ("open", format!("{attached}\n\n  {{\"type\":\"attached\"\n{attached}\n"), Some("line 3")),
        ];
        for (name, text, error) in cases {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            let read = Record::read(path.clone());
            match error {
                None => assert_eq!(read.map(|r| r.events.len()).ok(), Some(1), "{name}"),
                Some(line) => assert!(
                    message(path.to_str().unwrap()).contains(line),
                    "{name}: {}",
                    message(path.to_str().unwrap())
                ),
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A recorded note is the recorded run's: the table's stderr says so,
    /// and the JSON gives it back as it was recorded.
    #[test]
    fn recorded_notes_are_said_to_be_the_recorded_run_s() {
        use crate::model::{Level, Note, NoteCode};
        let wrote = Note::new(Level::Note, NoteCode::Written, "wrote a pprof profile of 3 samples to /tmp/p.pb.gz");
        let mut r = record(&[]);
        r.events.push(Event::Note(wrote.clone()));
        for json in [false, true] {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            r.replay(json, &mut out, &mut err).unwrap();
            let err = String::from_utf8(err).unwrap();
            assert_eq!(err, "tracer: note: recorded run: wrote a pprof profile of 3 samples to /tmp/p.pb.gz\n");
            let out = String::from_utf8(out).unwrap();
            assert!(!out.contains("recorded run"), "{out}");
            if json {
                let line = out.lines().nth(1).unwrap();
                assert_eq!(serde_json::from_str::<Event>(line).unwrap(), Event::Note(wrote.clone()));
            }
        }
    }

    fn picked(r: &Record, from: f64, to: f64) -> Result<(u64, u64), String> {
        r.diff(from, to).map(|d| (d.from_census, d.to_census)).map_err(|e| e.to_string())
    }

    #[test]
    fn the_times_shown_pick_their_censuses() {
        // As QA's record listed them: census 1 at 8.4 s, census 2 at
        // 11.0 s (11.003 s in the JSON). TO 11 picked census 1 before.
        let r = record(&[8.4, 11.003]);
        assert_eq!(picked(&r, 8.0, 11.0), Ok((1, 2)));
        // Shown as 1.0 s, 6.0 s and 11.0 s.
        let r = record(&[1.002, 6.004, 11.003]);
        assert_eq!(picked(&r, 6.0, 11.0), Ok((2, 3)));
        assert_eq!(picked(&r, 1.0, 6.0), Ok((1, 2)));
        // Times copied from the JSON match exactly.
        assert_eq!(picked(&r, 1.002, 11.003), Ok((1, 3)));
        assert_eq!(picked(&r, 1.0021, 11.0029), Ok((2, 3)));
        // Shown as 10.9 s, 10.949 s is before 11 either way, and after 8.
        let early = record(&[1.0, 6.0, 10.949]);
        assert_eq!(picked(&early, 6.0, 11.0), Ok((2, 3)));
        assert_eq!(
            picked(&early, 8.0, 11.0).unwrap_err(),
            "--diff 8 11: both pick census 3 (taken at 10.9 s), or TO a census before FROM's; pick times further apart"
        );
        // 11.06 s is shown as 11.1 s: after 11 either way.
        let late = record(&[1.0, 6.0, 11.06]);
        assert_eq!(picked(&late, 1.0, 11.0), Ok((1, 2)));
        assert_eq!(picked(&late, 1.0, 11.1), Ok((1, 3)));
        assert_eq!(
            picked(&late, 11.2, 12.0).unwrap_err(),
            "rec.jsonl has no heap census to compare at 11.2 s (its censuses: 3 from 1.0 s to 11.1 s); FROM picks the first census at or after it, TO the last at or before it, each time as shown (to 0.1 s) or exact"
        );
    }
}
