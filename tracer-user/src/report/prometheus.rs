//! The Prometheus text exposition format (version 0.0.4) of the latest
//! interval: what `--listen` serves at `/metrics`. Reads the model only.
//!
//! Names are stable: `tracer_` and what is counted. Labels are `pid`,
//! `container` (the process's cgroup), `function`, `file`, `line`, `type`,
//! `generation`, `cause`. Label values come from the target (type and
//! function names): they are cut to [`MAX_LABEL`] characters and escaped.
//! Types and growth sites are capped at [`TOP`] series per process per
//! page, the rest summed in families of their own (`…_other_…`), so that
//! one scrape of a target with many types stays small.

use std::{collections::BTreeMap, fmt::Write as _};

use indexmap::IndexMap;

use crate::model::{Attached, ProbeEstimate, Snapshot};

/// The most types, and growth sites, given a series of their own.
pub const TOP: usize = 30;
/// The longest label value kept, in characters.
pub const MAX_LABEL: usize = 200;

/// A label value as the format requires it: backslash, double quote and
/// newline escaped; other control characters (which a hostile target's
/// names may hold) replaced by `?`; cut to [`MAX_LABEL`] characters.
#[must_use]
pub fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len().min(MAX_LABEL) + 2);
    for (i, c) in value.chars().enumerate() {
        if i == MAX_LABEL {
            out.push('…');
            break;
        }
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

/// `{a="x",b="y"}` from label pairs, escaped.
fn labels(pairs: &[(&str, &str)]) -> String {
    let inner: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
    format!("{{{}}}", inner.join(","))
}

/// The exposition, metric by metric: each family's HELP and TYPE once,
/// then its series, each once: series whose labels came out the same
/// (names that differ only in what escaping replaced or cut) are one,
/// their values summed, as the objects they count are distinct.
#[derive(Default)]
struct Families {
    /// name -> (help, type, labels -> value), in name order.
    families: BTreeMap<&'static str, (&'static str, &'static str, IndexMap<String, f64>)>,
}

impl Families {
    fn add(&mut self, name: &'static str, (kind, help): (&'static str, &'static str), labels: &str, value: f64) {
        let family = self.families.entry(name).or_insert_with(|| (help, kind, IndexMap::new()));
        *family.2.entry(labels.to_owned()).or_insert(0.0) += value;
    }

    fn render(&self) -> String {
        let mut out = String::new();
        for (name, (help, kind, series)) in &self.families {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, value) in series {
                let _ = writeln!(out, "{name}{labels} {}", number(*value));
            }
        }
        out
    }
}

/// A sample value: integers without a fraction, NaN and infinities as the
/// format spells them.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else if v.fract() == 0.0 && v.abs() < 9e15 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

const CALLS: (&str, &str) = ("counter", "Calls of the probed function since the attach, exact (exact tracing).");
const BYTES: (&str, &str) =
    ("counter", "Bytes requested from the probed allocating function since the attach, exact (exact tracing).");
const TRACED_CALLS: (&str, &str) = (
    "counter",
    "Calls of the probed function seen in the production profile's traced windows only: not the process's total; see tracer_estimated_calls_per_second.",
);
const EST_CALLS: (&str, &str) =
    ("gauge", "Calls per second of the probed function, estimated from the traced windows (an ESTIMATE).");
const EST_BYTES: (&str, &str) =
    ("gauge", "Bytes requested per second from the probed function, estimated from the traced windows (an ESTIMATE).");
const EST_CALLS_CI95: (&str, &str) = (
    "gauge",
    "The 95% confidence interval of tracer_estimated_calls_per_second: its lower and upper end (bound); +Inf where the windows bound the rate only from below.",
);
const EST_BYTES_CI95: (&str, &str) = (
    "gauge",
    "The 95% confidence interval of tracer_estimated_bytes_per_second: its lower and upper end (bound); +Inf where the windows bound the rate only from below.",
);
const HEAP_OBJECTS: (&str, &str) = (
    "gauge",
    "Live objects of the type at the latest heap census, read from outside; the 30 types with the most bytes (the rest in tracer_heap_other_objects).",
);
const HEAP_OTHER_OBJECTS: (&str, &str) =
    ("gauge", "Live objects of every type tracer_heap_objects does not list, at the latest heap census.");
const HEAP_OTHER_BYTES: (&str, &str) =
    ("gauge", "Bytes of every type tracer_heap_bytes does not list, at the latest heap census.");
const HEAP_BYTES: (&str, &str) =
    ("gauge", "Bytes of the type's live objects at the latest heap census (as tracer_heap_objects).");
const HEAP_RSS: (&str, &str) = ("gauge", "The process's resident set at the latest heap census.");
const HEAP_ACCOUNTED: (&str, &str) = ("gauge", "Bytes the latest heap census accounts for.");
const HEAP_CENSUS: (&str, &str) = ("gauge", "The number of the latest heap census in the run, from 1.");
const GC_COLLECTIONS: (&str, &str) = ("counter", "Garbage collections of the generation since the attach.");
const GC_COLLECTED: (&str, &str) =
    ("counter", "Objects found unreachable by the generation's collections since the attach.");
const GC_UNCOLLECTABLE: (&str, &str) =
    ("counter", "Of those, uncollectable objects (read from the interpreter's memory only).");
const GROWTH_IN_USE: (&str, &str) = (
    "gauge",
    "Heap grown since the attach and still in use, by the Python frame that carved its pools (the profile's default) or took them last (--growth): a SAMPLED ESTIMATE; the 30 largest sites (the rest in tracer_growth_other_in_use_bytes).",
);
const GROWTH_IN_USE_CI95: (&str, &str) = (
    "gauge",
    "The 95% confidence interval of the site's tracer_growth_in_use_bytes (a SAMPLED ESTIMATE): its lower and upper end (bound).",
);
const GROWTH_TOTAL: (&str, &str) = (
    "gauge",
    "Heap grown since the attach and still in use, over every site (pymalloc's pools and the C library's heap): a SAMPLED ESTIMATE; see tracer_growth_total_in_use_bytes_ci95.",
);
const GROWTH_TOTAL_CI95: (&str, &str) = (
    "gauge",
    "The 95% confidence interval of tracer_growth_total_in_use_bytes: its lower and upper end (bound); where no sample is in use, 0 to the growth every sample would miss one time in 20.",
);
const GROWTH_OTHER: (&str, &str) = (
    "gauge",
    "Heap grown since the attach and still in use by the sites tracer_growth_in_use_bytes does not list (a SAMPLED ESTIMATE).",
);
const COST: (&str, &str) = (
    "gauge",
    "tracer's estimated cost to the target, as a share of its CPU time, over the latest interval (NaN until known).",
);
const BUDGET: (&str, &str) = ("gauge", "The production profile's budget, as a share of the target's CPU time.");
const ELAPSED: (&str, &str) = ("gauge", "Seconds since tracer attached.");
const ATTACHED: (&str, &str) = (
    "gauge",
    "1 while tracer's probes are live and the page holds the latest interval; 0 while it attaches (no figure yet) and once it has detached (the page holds the run's summary).",
);
const INFO: (&str, &str) = ("gauge", "The traced interpreter; always 1.");
const MISSED: (&str, &str) = (
    "counter",
    "Events NOT counted, by cause (full tables, unread arguments): where this grows, the counts are partial.",
);
const STATS: (&str, &str) = (
    "counter",
    "tracer's other counters of what it could not do (stacks not walked, other processes' hits): the counts are whole, what they add is partial.",
);

/// The page served while tracer attaches, before any figure: what it will
/// trace (`pid`, none with `--exe`) and `tracer_attached 0`, so that a
/// scrape then is answered at once and says why it has nothing more.
#[must_use]
pub fn attaching(pid: Option<u32>) -> String {
    let mut f = Families::default();
    let pid = pid.map(|p| p.to_string()).unwrap_or_default();
    let container = pid.parse().map(cgroup_of).unwrap_or_default();
    f.add("tracer_attached", ATTACHED, &labels(&[("pid", &pid), ("container", &container)]), 0.0);
    f.render()
}

/// The exposition of `snapshot`, the latest interval (or the summary) of
/// the run `attached` began, `live` while its probes are (not once
/// detached, at the summary); `container` gives a process's cgroup.
#[must_use]
pub fn render(attached: &Attached, snapshot: &Snapshot, live: bool, container: &dyn Fn(u32) -> String) -> String {
    let mut f = Families::default();
    let mode = attached.mode.as_deref().unwrap_or("exact");
    let pid = attached.pid.map(|p| p.to_string()).unwrap_or_default();
    let container_of = |pid: &str| pid.parse().map(container).unwrap_or_default();
    let own = container_of(&pid);
    let base = [("pid", pid.as_str()), ("container", own.as_str())];
    let info = [
        ("pid", pid.as_str()),
        ("container", own.as_str()),
        ("python", attached.python.version.as_str()),
        ("image", attached.python.image.as_str()),
        ("mode", mode),
    ];
    f.add("tracer_info", INFO, &labels(&info), 1.0);
    f.add("tracer_attached", ATTACHED, &labels(&base), f64::from(u8::from(live)));
    f.add("tracer_elapsed_seconds", ELAPSED, &labels(&base), snapshot.elapsed_s);
    // Exact counts per process (`--exe` has many), or the windows' with
    // their estimated rates.
    let bytes = |function: &str| attached.measures_bytes(function);
    #[allow(clippy::cast_precision_loss, reason = "counts as the format's floats")]
    if mode == "profile" {
        for (function, p) in &snapshot.probes {
            let l = labels(&[base[0], base[1], ("function", function)]);
            f.add("tracer_traced_calls_total", TRACED_CALLS, &l, p.calls as f64);
            // A rate not told from zero is left out, not exported as 0.
            if let Some(e) = p.estimate.filter(ProbeEstimate::calls_known) {
                f.add("tracer_estimated_calls_per_second", EST_CALLS, &l, e.calls_per_s);
                interval(&mut f, ("tracer_estimated_calls_per_second_ci95", EST_CALLS_CI95), &l, e.calls_per_s_ci95);
            }
            if let Some(e) = p.estimate.filter(|e| e.bytes_known() && bytes(function)) {
                f.add("tracer_estimated_bytes_per_second", EST_BYTES, &l, e.bytes_per_s);
                interval(&mut f, ("tracer_estimated_bytes_per_second_ci95", EST_BYTES_CI95), &l, e.bytes_per_s_ci95);
            }
        }
    } else if snapshot.pids.is_empty() || attached.pid.is_some() {
        for (function, p) in &snapshot.probes {
            let l = labels(&[base[0], base[1], ("function", function)]);
            f.add("tracer_calls_total", CALLS, &l, p.calls as f64);
            if bytes(function) {
                f.add("tracer_requested_bytes_total", BYTES, &l, p.bytes as f64);
            }
        }
    } else {
        for (pid, probes) in &snapshot.pids {
            let container = container_of(pid);
            for (function, c) in probes {
                let l = labels(&[("pid", pid), ("container", &container), ("function", function)]);
                f.add("tracer_calls_total", CALLS, &l, c.calls as f64);
                if bytes(function) {
                    f.add("tracer_requested_bytes_total", BYTES, &l, c.bytes as f64);
                }
            }
        }
    }
    heap(&mut f, snapshot, &base);
    gc(&mut f, snapshot, &base);
    growth(&mut f, snapshot, &base);
    let cost =
        snapshot.profile.as_ref().map(|p| p.fraction).or_else(|| snapshot.cost.and_then(|c| c.overhead_fraction));
    f.add("tracer_cost_ratio", COST, &labels(&base), cost.unwrap_or(f64::NAN));
    if let Some(p) = &snapshot.profile {
        f.add("tracer_budget_ratio", BUDGET, &labels(&base), p.budget_percent / 100.0);
    }
    #[allow(clippy::cast_precision_loss, reason = "counts as the format's floats")]
    for (name, value) in &snapshot.stats {
        let l = labels(&[base[0], base[1], ("cause", name)]);
        if Snapshot::is_loss(name) {
            f.add("tracer_missed_total", MISSED, &l, *value as f64);
        } else {
            f.add("tracer_stat_total", STATS, &l, *value as f64);
        }
    }
    f.render()
}

/// An estimate's 95% interval, `ci95`, as two series of the family
/// `name`: `labels` (the estimate's own, `{…}`) and `bound` `lower` and
/// `upper`. None where the estimate has no interval yet.
fn interval(
    f: &mut Families,
    (name, help): (&'static str, (&'static str, &'static str)),
    labels: &str,
    ci95: Option<[f64; 2]>,
) {
    let Some([lower, upper]) = ci95 else { return };
    let inner = labels.strip_prefix('{').and_then(|l| l.strip_suffix('}')).unwrap_or(labels);
    let sep = if inner.is_empty() { "" } else { "," };
    f.add(name, help, &format!("{{{inner}{sep}bound=\"lower\"}}"), lower);
    f.add(name, help, &format!("{{{inner}{sep}bound=\"upper\"}}"), upper);
}

#[allow(clippy::cast_precision_loss, reason = "counts and bytes as the format's floats")]
fn heap(f: &mut Families, snapshot: &Snapshot, base: &[(&str, &str); 2]) {
    let Some(heap) = &snapshot.heap else { return };
    let (mut other_count, mut other_bytes) = heap.other.map_or((0, 0), |o| (o.count, o.bytes));
    for (i, t) in heap.types.iter().enumerate() {
        if i >= TOP {
            other_count += t.count;
            other_bytes += t.bytes;
            continue;
        }
        let l = labels(&[base[0], base[1], ("type", &t.name)]);
        f.add("tracer_heap_objects", HEAP_OBJECTS, &l, t.count as f64);
        f.add("tracer_heap_bytes", HEAP_BYTES, &l, t.bytes as f64);
    }
    let l = labels(base);
    f.add("tracer_heap_other_objects", HEAP_OTHER_OBJECTS, &l, other_count as f64);
    f.add("tracer_heap_other_bytes", HEAP_OTHER_BYTES, &l, other_bytes as f64);
    if let Some(rss) = heap.totals.rss {
        f.add("tracer_heap_resident_bytes", HEAP_RSS, &l, rss as f64);
    }
    f.add("tracer_heap_accounted_bytes", HEAP_ACCOUNTED, &l, heap.totals.accounted as f64);
    f.add("tracer_heap_census", HEAP_CENSUS, &l, heap.census as f64);
}

#[allow(clippy::cast_precision_loss, reason = "counts as the format's floats")]
fn gc(f: &mut Families, snapshot: &Snapshot, base: &[(&str, &str); 2]) {
    let Some(gc) = &snapshot.gc else { return };
    for g in &gc.generations {
        let generation = g.generation.map_or_else(|| "unknown".to_owned(), |n| n.to_string());
        let l = labels(&[base[0], base[1], ("generation", &generation)]);
        f.add("tracer_gc_collections_total", GC_COLLECTIONS, &l, g.collections as f64);
        f.add("tracer_gc_collected_total", GC_COLLECTED, &l, g.collected as f64);
        if let Some(u) = g.uncollectable {
            f.add("tracer_gc_uncollectable_total", GC_UNCOLLECTABLE, &l, u as f64);
        }
    }
}

#[allow(clippy::cast_precision_loss, reason = "bytes as the format's floats")]
fn growth(f: &mut Families, snapshot: &Snapshot, base: &[(&str, &str); 2]) {
    let Some(g) = snapshot.growth.as_ref().and_then(crate::model::Growth::sampled) else { return };
    // The largest in use, not those that moved most this interval: the
    // same sites keep their series from one scrape to the next.
    let mut sites: Vec<&crate::model::GrowthSite> = g.sites.iter().collect();
    sites.sort_by_key(|s| std::cmp::Reverse(s.in_use_bytes));
    let mut other = 0;
    for (i, s) in sites.iter().enumerate() {
        if i >= TOP {
            other += s.in_use_bytes;
            continue;
        }
        let line = s.line.map(|l| l.to_string()).unwrap_or_default();
        let l = labels(&[base[0], base[1], ("function", &s.function), ("file", &s.file), ("line", &line)]);
        f.add("tracer_growth_in_use_bytes", GROWTH_IN_USE, &l, s.in_use_bytes as f64);
        interval(f, ("tracer_growth_in_use_bytes_ci95", GROWTH_IN_USE_CI95), &l, Some(s.in_use_ci95));
    }
    let l = labels(base);
    f.add("tracer_growth_other_in_use_bytes", GROWTH_OTHER, &l, other as f64);
    f.add("tracer_growth_total_in_use_bytes", GROWTH_TOTAL, &l, g.in_use_bytes as f64);
    interval(f, ("tracer_growth_total_in_use_bytes_ci95", GROWTH_TOTAL_CI95), &l, g.in_use_ci95);
}

/// A process's cgroup (the unified hierarchy's path, else the first
/// line's), as `/proc/PID/cgroup` gives it: what a container is.
#[must_use]
pub fn cgroup_of(pid: u32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let line = text.lines().find(|l| l.starts_with("0::")).or_else(|| text.lines().next()).unwrap_or_default();
    line.splitn(3, ':').nth(2).unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests;
