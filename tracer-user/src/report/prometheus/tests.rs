//! The page read back by a strict reader of the text format (version
//! 0.0.4): every family's HELP and TYPE once, before its samples, which
//! are together; names and label names as the format allows; label values
//! with only the format's three escapes; no series twice; every value a
//! number of the format's.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::model::{Growth, GrowthSampled, GrowthSite};

/// One sample: its family, labels (unescaped) and value.
type Sample = (String, BTreeMap<String, String>, f64);

fn metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn label_name(name: &str) -> bool {
    let mut chars = name.chars();
    !name.starts_with("__")
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `{a="x",b="y"}` read as the format says, or why not.
fn read_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    let mut rest = text.strip_prefix('{').ok_or("no {")?;
    while !rest.starts_with('}') {
        let (name, after) = rest.split_once("=\"").ok_or(format!("no =\" in {rest}"))?;
        if !label_name(name) {
            return Err(format!("label name {name:?}"));
        }
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next().ok_or("an unterminated value")? {
                (_, '\\') => match chars.next().ok_or("a trailing backslash")?.1 {
                    '\\' => value.push('\\'),
                    '"' => value.push('"'),
                    'n' => value.push('\n'),
                    other => return Err(format!("an escape \\{other}")),
                },
                (i, '"') => break i,
                (_, c) if c.is_control() => return Err(format!("a raw control character {c:?}")),
                (_, c) => value.push(c),
            }
        };
        if out.insert(name.to_owned(), value).is_some() {
            return Err(format!("label {name} twice"));
        }
        rest = &after[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
    if rest != "}" {
        return Err(format!("{rest:?} after the labels"));
    }
    Ok(out)
}

/// The page's samples, once it has passed every check; panics naming the
/// line that fails one.
fn strict(page: &str) -> Vec<Sample> {
    assert!(page.ends_with('\n'), "the page ends with a newline");
    let (mut helped, mut typed, mut done) = (BTreeSet::new(), BTreeMap::new(), BTreeSet::new());
    let mut current: Option<String> = None;
    let mut series = BTreeSet::new();
    let mut samples = Vec::new();
    for line in page.lines() {
        if let Some(help) = line.strip_prefix("# HELP ") {
            let (name, text) = help.split_once(' ').unwrap_or_else(|| panic!("{line}"));
            assert!(metric_name(name) && helped.insert(name.to_owned()), "{line}");
            // HELP escapes only `\\` and `\n`.
            assert!(!text.replace("\\\\", "").replace("\\n", "").contains('\\'), "{line}");
            assert!(!done.contains(name), "a family after its samples: {line}");
            continue;
        }
        if let Some(kind) = line.strip_prefix("# TYPE ") {
            let (name, kind) = kind.split_once(' ').unwrap_or_else(|| panic!("{line}"));
            assert!(["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind), "{line}");
            assert!(helped.contains(name), "TYPE before HELP: {line}");
            assert!(typed.insert(name.to_owned(), kind.to_owned()).is_none(), "{line}");
            if let Some(previous) = current.replace(name.to_owned()) {
                done.insert(previous);
            }
            continue;
        }
        assert!(!line.starts_with('#') && !line.is_empty(), "{line:?}");
        let (head, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line}"));
        let (name, labels) = head.split_at(head.find('{').unwrap_or(head.len()));
        assert_eq!(current.as_deref(), Some(name), "a sample outside its family: {line}");
        if typed[name] == "counter" {
            assert!(name.ends_with("_total"), "a counter not named _total: {line}");
        }
        let labels = if labels.is_empty() { BTreeMap::new() } else { read_labels(labels).expect(line) };
        let value = match value {
            "NaN" => f64::NAN,
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("not a number: {line}")),
        };
        assert!(series.insert((name.to_owned(), labels.clone())), "a series twice: {line}");
        samples.push((name.to_owned(), labels, value));
    }
    samples
}

/// The value of `name` with labels whose pairs include `having`.
fn value(samples: &[Sample], name: &str, having: &[(&str, &str)]) -> Vec<f64> {
    samples
        .iter()
        .filter(|(n, l, _)| n == name && having.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
        .map(|s| s.2)
        .collect()
}

const HOSTILE: &str = "evil\"name\\with\nnewline\x1b[31m";

/// A profile's interval: estimated rates with their intervals (one with
/// no upper end), the heap, and growth with a hostile site.
fn interval() -> (Attached, Snapshot) {
    let mut attached = crate::report::examples::attached(Some(42));
    attached.mode = Some("profile".into());
    let mut snapshot = crate::report::examples::budget_snapshot(10, 0.005, (1000.0, Some([900.0, 1100.0])));
    if let Some(e) = snapshot.probes["PyObject_Malloc"].estimate.as_mut() {
        (e.calls_per_s_ci95, e.bytes_per_s_ci95, e.lower_bound) =
            (Some([40.0, f64::INFINITY]), Some([40_000.0, f64::INFINITY]), true);
    }
    let site = |function: &str, file: &str, in_use: u64| GrowthSite {
        function: function.to_owned(),
        file: file.to_owned(),
        line: Some(7),
        bytes: 0,
        samples: in_use / (512 << 10),
        in_use_bytes: in_use,
        libc_bytes: 0,
        libc_samples: 0,
        #[allow(clippy::cast_precision_loss, reason = "small test values")]
        in_use_ci95: [in_use as f64 / 2.0, in_use as f64 * 2.0],
    };
    snapshot.growth = Some(Growth::Sampled(Box::new(GrowthSampled {
        estimate: true,
        sample_every: 32,
        sample_bytes: 512 << 10,
        in_use_bytes: 3 << 20,
        in_use_ci95: Some([1_000_000.0, 6_000_000.0]),
        sites: vec![site(HOSTILE, HOSTILE, 2 << 20), site("handle", "/srv/app.py", 1 << 20)],
        ..GrowthSampled::default()
    })));
    (attached, snapshot)
}

#[test]
fn label_values_are_escaped_and_bounded() {
    assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    assert_eq!(escape("\x1b[31mred\x07"), "?[31mred?");
    let long = "x".repeat(10_000);
    let cut = escape(&long);
    assert_eq!(cut.chars().count(), MAX_LABEL + 1);
    assert!(cut.ends_with('…'));
}

#[test]
fn numbers_are_the_format_s() {
    assert_eq!(number(3.0), "3");
    assert_eq!(number(0.25), "0.25");
    assert_eq!(number(f64::NAN), "NaN");
    assert_eq!(number(f64::INFINITY), "+Inf");
}

/// Each estimate's 95% interval is served beside it, as a family of its
/// own with `bound` lower and upper; an interval with no upper end has
/// `+Inf` there.
#[test]
fn estimates_come_with_their_intervals() {
    let (attached, snapshot) = interval();
    let page = render(&attached, &snapshot, true, &|_| "/".to_owned());
    let samples = strict(&page);
    let rate = |name, function, bound| value(&samples, name, &[("function", function), ("bound", bound)]);
    assert_eq!(rate("tracer_estimated_calls_per_second_ci95", "_Py_NewReference", "lower"), [900.0]);
    assert_eq!(rate("tracer_estimated_calls_per_second_ci95", "_Py_NewReference", "upper"), [1100.0]);
    assert_eq!(rate("tracer_estimated_calls_per_second_ci95", "PyObject_Malloc", "upper"), [f64::INFINITY]);
    assert_eq!(rate("tracer_estimated_bytes_per_second_ci95", "PyObject_Malloc", "lower"), [40_000.0]);
    // No interval yet: no series, never a made-up one.
    assert_eq!(rate("tracer_estimated_bytes_per_second_ci95", "_Py_NewReference", "lower"), [0.0; 0]);
    // Growth's total, and each site's, with theirs.
    assert_eq!(value(&samples, "tracer_growth_total_in_use_bytes", &[]), [f64::from(3 << 20)]);
    let total = |bound| value(&samples, "tracer_growth_total_in_use_bytes_ci95", &[("bound", bound)]);
    assert_eq!((total("lower"), total("upper")), (vec![1_000_000.0], vec![6_000_000.0]));
    let site = |name, bound: &'static str| {
        let mut having = vec![("function", "handle"), ("file", "/srv/app.py"), ("line", "7")];
        having.extend((!bound.is_empty()).then_some(("bound", bound)));
        value(&samples, name, &having)
    };
    assert_eq!(site("tracer_growth_in_use_bytes", ""), [f64::from(1 << 20)]);
    assert_eq!(site("tracer_growth_in_use_bytes_ci95", "lower"), [f64::from(1 << 19)]);
    assert_eq!(site("tracer_growth_in_use_bytes_ci95", "upper"), [f64::from(1 << 21)]);
    assert_eq!(value(&samples, "tracer_attached", &[("pid", "42")]), [1.0]);
}

/// A hostile name read from the target (a quote, a backslash, a newline, a
/// terminal escape) comes back from a strict reader as itself, the escape
/// replaced: in the growth site's function and file, and its interval's.
#[test]
fn a_hostile_site_reads_back_as_its_name() {
    let (attached, snapshot) = interval();
    let page = render(&attached, &snapshot, true, &|_| "/".to_owned());
    assert!(!page.contains('\x1b'));
    let samples = strict(&page);
    let shown = "evil\"name\\with\nnewline?[31m";
    let hostile = [("function", shown), ("file", shown)];
    assert_eq!(value(&samples, "tracer_growth_in_use_bytes", &hostile), [f64::from(2 << 20)]);
    assert_eq!(value(&samples, "tracer_growth_in_use_bytes_ci95", &hostile).len(), 2);
}

/// Before the attach the page says only that tracer attaches; after the
/// summary, that it is detached; every page passes the strict reader.
#[test]
fn the_page_says_whether_tracer_is_attached() {
    let before = strict(&attaching(Some(std::process::id())));
    assert_eq!(before.len(), 1, "{before:?}");
    assert_eq!((before[0].0.as_str(), before[0].2), ("tracer_attached", 0.0));
    assert_eq!(before[0].1["pid"], std::process::id().to_string());
    assert_eq!(strict(&attaching(None))[0].1["pid"], "");
    let (attached, snapshot) = interval();
    let after = strict(&render(&attached, &snapshot, false, &|_| String::new()));
    assert_eq!(value(&after, "tracer_attached", &[]), [0.0]);
    // An exact run's page too.
    let exact = crate::report::examples::attached(Some(42));
    strict(&render(&exact, &crate::report::examples::snapshot(1000, 1), true, &|_| String::new()));
}

/// The reader itself refuses what the format does not allow.
#[test]
fn the_strict_reader_refuses_what_the_format_does_not_allow() {
    for bad in [r#"{a="x\t"}"#, r#"{a="x"#, r#"{__a="x"}"#, r#"{a="x",a="y"}"#, r#"{1a="x"}"#] {
        assert!(read_labels(bad).is_err(), "{bad}");
    }
    assert_eq!(read_labels(r#"{a="q\"b\\n\n",b=""}"#).unwrap()["a"], "q\"b\\n\n");
    let refused = |page: &'static str| std::panic::catch_unwind(|| strict(page)).is_err();
    assert!(refused("x 1\n"), "no HELP");
    assert!(refused("# HELP x h\n# TYPE x gauge\nx 1\nx 2\n"), "twice");
    assert!(refused("# HELP x h\n# TYPE x counter\nx 1\n"), "a counter without _total");
    assert!(refused("# HELP x h\n# TYPE x gauge\nx one\n"), "not a number");
    assert!(!refused("# HELP x h\n# TYPE x gauge\nx{a=\"1\"} +Inf\nx NaN\n"));
}
