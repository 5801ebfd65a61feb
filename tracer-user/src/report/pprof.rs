//! `--pprof FILE`: the summary's stacks as a gzipped pprof profile
//! (`profile.proto` of github.com/google/pprof, the messages below written
//! field for field from it), which `go tool pprof`, speedscope and
//! Pyroscope read. Heap profilers' sample types: `alloc_objects` and
//! `alloc_space` are `--stacks`' events (each probe's calls and bytes by
//! Python stack, exact; the probe in the label `probe`), `inuse_objects`
//! and `inuse_space` growth's stacks (the samples each holds and the bytes
//! they stand for: a sampled estimate, labelled `source: growth`).

use std::{collections::HashMap, io::Write as _};

use prost::Message;

use super::files::{OutputError, OutputFile};
use crate::model::{SiteFrame, Snapshot};

/// `perftools.profiles.Profile`.
#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

/// `ValueType`: indices into the string table.
#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// `Sample`: its locations leaf first, a value per sample type.
#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// `Label`: a string label (indices into the string table).
#[derive(Clone, PartialEq, Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
}

/// `Location`: one Python frame, one line.
#[derive(Clone, PartialEq, Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

/// `Line`.
#[derive(Clone, PartialEq, Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

/// `Function`: a Python function (its qualified name) in its file.
#[derive(Clone, PartialEq, Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
}

/// The sample types, in order: Go's heap profile's four, then the frees
/// (`--stacks`' events of the functions that free, which are no
/// allocation: counted in `alloc_objects` they would double a view's
/// allocations).
pub const SAMPLE_TYPES: [(&str, &str); 5] = [
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("inuse_objects", "count"),
    ("inuse_space", "bytes"),
    ("free_objects", "count"),
];

/// The probed functions whose calls free (an object, a block, a
/// mapping): their events are `free_objects`, not `alloc_objects`.
const FREES: [&str; 6] = ["_Py_Dealloc", "PyObject_Free", "PyMem_Free", "PyMem_RawFree", "free", "munmap"];

/// A profile being built: strings, functions and locations interned.
#[derive(Default)]
struct Builder {
    profile: Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(String, String), u64>,
    locations: HashMap<(u64, i64), u64>,
}

impl Builder {
    fn new() -> Self {
        let mut b = Self::default();
        b.string("");
        for (kind, unit) in SAMPLE_TYPES {
            let vt = ValueType { r#type: b.string(kind), unit: b.string(unit) };
            b.profile.sample_type.push(vt);
        }
        b
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(i) = self.strings.get(s) {
            return *i;
        }
        let i = i64::try_from(self.profile.string_table.len()).unwrap_or(i64::MAX);
        self.profile.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    fn location(&mut self, frame: &SiteFrame) -> u64 {
        let key = (frame.function.clone(), frame.file.clone());
        let function = if let Some(id) = self.functions.get(&key) {
            *id
        } else {
            let id = self.profile.function.len() as u64 + 1;
            let (name, filename) = (self.string(&frame.function), self.string(&frame.file));
            // No system name (string 0, the empty one): pprof takes a
            // function whose name equals its system name for a symbol not
            // yet demangled, and cuts what lies between < and > as C++
            // template arguments, so that <module> came out as <unknown>
            // and f.<locals>.g as "f.". A name beside an empty system name
            // is kept as it is.
            self.profile.function.push(Function { id, name, system_name: 0, filename });
            self.functions.insert(key, id);
            id
        };
        let line = frame.line.map_or(0, i64::from);
        *self.locations.entry((function, line)).or_insert_with(|| {
            let id = self.profile.location.len() as u64 + 1;
            self.profile.location.push(Location { id, line: vec![Line { function_id: function, line }] });
            id
        })
    }

    fn sample(&mut self, frames: &[SiteFrame], value: [u64; 5], label: (&str, &str)) {
        let location_id = frames.iter().map(|f| self.location(f)).collect();
        let label = vec![Label { key: self.string(label.0), str: self.string(label.1) }];
        let value = value.iter().map(|v| i64::try_from(*v).unwrap_or(i64::MAX)).collect();
        self.profile.sample.push(Sample { location_id, value, label });
    }
}

/// The profile of `last` (the summary): its stacks' events and growth's
/// stacks, over `elapsed_s` from `started_unix_s` (the attach, by the wall
/// clock), or up to now where that is not known (a live run's summary).
#[must_use]
pub fn profile(last: &Snapshot, started_unix_s: Option<f64>) -> Profile {
    let mut b = Builder::new();
    for s in last.stacks.iter().flatten() {
        let value = if FREES.contains(&s.probe.as_str()) { [0, 0, 0, 0, s.calls] } else { [s.calls, s.bytes, 0, 0, 0] };
        b.sample(&s.frames, value, ("probe", &s.probe));
    }
    let growth = last.growth.as_ref().and_then(crate::model::Growth::sampled);
    for s in growth.and_then(|g| g.stacks.as_ref()).into_iter().flatten() {
        b.sample(&s.frames, [0, 0, s.samples, s.in_use_bytes, 0], ("source", "growth"));
    }
    // `--sample N` scales each stack's events by N: estimates, said so.
    let stacks = match last.stack_coverage.as_ref().map_or(1, |c| c.sample) {
        1 => "alloc_* and free_objects exact (--stacks)".to_owned(),
        n => format!(
            "alloc_* and free_objects ESTIMATES (--stacks --sample {n}: 1 event in {n} recorded, scaled by {n})"
        ),
    };
    let comment = match growth {
        Some(g) => format!(
            "tracer: {stacks}; inuse_* are growth's stacks, a sampled estimate (1 {} in {}, by {}; the C library's heap by bytes)",
            g.takes.probed.one(),
            g.sample_every,
            g.takes.probed.holder(),
        ),
        None => format!("tracer: {stacks}"),
    };
    let comment = b.string(&comment);
    b.profile.comment.push(comment);
    // The in-use space where growth gave it, else the allocations'.
    b.profile.default_sample_type =
        if growth.is_some() { b.profile.sample_type[3].r#type } else { b.profile.sample_type[1].r#type };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    #[allow(clippy::cast_possible_truncation, reason = "ns since 1970 fit an i64 until 2262")]
    let duration = (last.elapsed_s * 1e9) as i64;
    #[allow(clippy::cast_possible_truncation, reason = "ns since 1970 fit an i64 until 2262")]
    let started = started_unix_s.filter(|s| s.is_finite() && *s > 0.0).map(|s| (s * 1e9) as i64);
    b.profile.time_nanos =
        started.unwrap_or_else(|| i64::try_from(now.as_nanos()).unwrap_or(i64::MAX).saturating_sub(duration));
    b.profile.duration_nanos = duration;
    b.profile
}

/// Writes `profile` gzipped to `file`; how many samples it holds.
pub fn write(file: &OutputFile, profile: &Profile) -> Result<usize, OutputError> {
    let err =
        |e: std::io::Error| OutputError::Create { flag: file.flag, path: file.path.clone(), cause: e.to_string() };
    let mut gz = flate2::write::GzEncoder::new(file.create()?, flate2::Compression::default());
    gz.write_all(&profile.encode_to_vec()).map_err(err)?;
    gz.finish().map_err(err)?;
    Ok(profile.sample.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{GrowthSampled, GrowthStack, StackCount};

    fn frame(function: &str, line: u32) -> SiteFrame {
        SiteFrame { function: function.to_owned(), file: "/srv/app.py".to_owned(), line: Some(line) }
    }

    /// Stacks and growth stacks become samples, their frames interned
    /// once, every index inside the string table, and the bytes read back
    /// as they were written.
    #[test]
    fn stacks_and_growth_become_samples() {
        let stacks = vec![StackCount {
            probe: "PyObject_Malloc".to_owned(),
            frames: vec![frame("inner", 3), frame("outer", 9)],
            calls: 5,
            bytes: 320,
            ..StackCount::default()
        }];
        let growth = GrowthSampled {
            sample_every: 32,
            stacks: Some(vec![GrowthStack {
                frames: vec![frame("inner", 3), frame("main", 20)],
                truncated: false,
                samples: 2,
                in_use_bytes: 1 << 20,
            }]),
            ..GrowthSampled::default()
        };
        let last = Snapshot {
            stacks: Some(stacks),
            growth: Some(crate::model::Growth::Sampled(Box::new(growth))),
            elapsed_s: 2.0,
            ..Snapshot::default()
        };
        let p = profile(&last, Some(1_700_000_000.5));
        let back = Profile::decode(&p.encode_to_vec()[..]).expect("decodes");
        assert_eq!(back, p);
        assert_eq!(p.sample.len(), 2);
        assert_eq!(p.sample[0].value, [5, 320, 0, 0, 0]);
        assert_eq!(p.sample[1].value, [0, 0, 2, 1 << 20, 0]);
        // "inner" at line 3 is one location, shared.
        assert_eq!(p.sample[0].location_id[0], p.sample[1].location_id[0]);
        assert_eq!(p.location.len(), 3);
        assert_eq!(p.function.len(), 3);
        let s = |i: i64| p.string_table[usize::try_from(i).unwrap()].as_str();
        let types: Vec<&str> = p.sample_type.iter().map(|t| s(t.r#type)).collect();
        assert_eq!(types, ["alloc_objects", "alloc_space", "inuse_objects", "inuse_space", "free_objects"]);
        assert_eq!(s(p.default_sample_type), "inuse_space");
        assert_eq!((s(p.sample[0].label[0].key), s(p.sample[0].label[0].str)), ("probe", "PyObject_Malloc"));
        assert_eq!(p.duration_nanos, 2_000_000_000);
        // Dated by the attach where it is known (a record's replay).
        assert_eq!(p.time_nanos, 1_700_000_000_500_000_000);
        assert_eq!(p.string_table[0], "");
        assert_eq!(
            s(p.comment[0]),
            format!(
                "tracer: alloc_* and free_objects exact (--stacks); inuse_* are growth's stacks, a sampled estimate (1 pool take in 32, by taker; the C library's heap by bytes)"
            )
        );
    }

    /// A free is no allocation: its events are `free_objects`, and
    /// `--sample N`'s scaled counts are said to be estimates.
    #[test]
    fn frees_are_free_objects_and_sampled_stacks_estimates() {
        let stack = |probe: &str, calls| StackCount {
            probe: probe.to_owned(),
            frames: vec![frame("work", 1)],
            calls,
            bytes: if probe.contains("Malloc") { calls * 64 } else { 0 },
            ..StackCount::default()
        };
        let mut last = Snapshot {
            stacks: Some(vec![stack("PyObject_Malloc", 30), stack("PyObject_Free", 20), stack("_Py_Dealloc", 10)]),
            ..Snapshot::default()
        };
        let p = profile(&last, None);
        let values: Vec<&[i64]> = p.sample.iter().map(|s| s.value.as_slice()).collect();
        assert_eq!(values, [&[30, 1920, 0, 0, 0][..], &[0, 0, 0, 0, 20], &[0, 0, 0, 0, 10]]);
        let comment = |p: &Profile| p.string_table[usize::try_from(p.comment[0]).unwrap()].clone();
        assert_eq!(comment(&p), "tracer: alloc_* and free_objects exact (--stacks)");
        last.stack_coverage = Some(crate::model::StackCoverage { sample: 10, estimate: true, ..Default::default() });
        assert_eq!(
            comment(&profile(&last, None)),
            "tracer: alloc_* and free_objects ESTIMATES (--stacks --sample 10: 1 event in 10 recorded, scaled by 10)"
        );
    }
}
