//! `--folded` and `--flamegraph`: the summary's stacks as folded lines
//! (outermost frame first, `;`-separated, then the weight), the input of
//! flamegraph.pl and inferno, and as an SVG flame graph drawn by inferno.

use std::io::Write as _;

use crate::{
    config::Weight,
    model::{SiteFrame, StackCount},
    report::files::{OutputError, OutputFile},
};

/// A frame as a flame graph shows it: `function (file:line)`, as py-spy
/// writes them, with `;` (the separator) kept out; the count is after the
/// last space, so spaces inside are fine.
fn label(f: &SiteFrame) -> String {
    let file = f.file.rsplit('/').next().unwrap_or(&f.file);
    let at = f.line.map_or_else(|| file.to_owned(), |l| format!("{file}:{l}"));
    format!("{} ({at})", f.function).replace(';', ":")
}

/// The folded lines of `stacks` weighted by `weight`, sorted (as the
/// folded format expects), equal stacks merged, stacks of weight 0 left
/// out. Native frames are not walked yet: each stack starts at the probed
/// function, the allocator, above its Python frames.
#[must_use]
pub fn folded(stacks: &[StackCount], weight: Weight) -> Vec<String> {
    let mut merged: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for s in stacks {
        let count = match weight {
            Weight::Calls => s.calls,
            Weight::Bytes => s.bytes,
        };
        if count == 0 {
            continue;
        }
        let mut frames: Vec<String> = s.frames.iter().rev().map(label).collect();
        if s.truncated {
            frames.insert(0, "[truncated]".to_owned());
        }
        frames.push(s.probe.clone());
        let total = merged.entry(frames.join(";")).or_default();
        *total = total.saturating_add(count);
    }
    merged.into_iter().map(|(stack, n)| format!("{stack} {n}")).collect()
}

/// Writes `lines` to `file`.
pub fn write_folded(file: &OutputFile, lines: &[String]) -> Result<(), OutputError> {
    let mut out = std::io::BufWriter::new(file.create()?);
    let err =
        |e: std::io::Error| OutputError::Create { flag: file.flag, path: file.path.clone(), cause: e.to_string() };
    for line in lines {
        writeln!(out, "{line}").map_err(err)?;
    }
    out.flush().map_err(err)
}

/// Draws `lines` as a flame graph titled `title` into `file`.
pub fn write_flamegraph(file: &OutputFile, lines: &[String], title: &str, weight: Weight) -> Result<(), OutputError> {
    let out = std::io::BufWriter::new(file.create()?);
    let mut options = inferno::flamegraph::Options::default();
    title.clone_into(&mut options.title);
    weight.name().clone_into(&mut options.count_name);
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
        .map_err(|e| OutputError::Create { flag: file.flag, path: file.path.clone(), cause: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, line: u32) -> SiteFrame {
        SiteFrame { function: function.into(), file: "/srv/app/sites.py".into(), line: Some(line) }
    }

    #[test]
    fn folds_outermost_first_and_merges_equal_stacks() {
        let a = StackCount {
            probe: "PyObject_Malloc".into(),
            frames: vec![frame("make_a", 5), frame("main", 20)],
            truncated: false,
            calls: 3,
            bytes: 300,
        };
        let lines = folded(&[a.clone(), a.clone(), StackCount { truncated: true, ..a }], Weight::Calls);
        assert_eq!(
            lines,
            [
                "[truncated];main (sites.py:20);make_a (sites.py:5);PyObject_Malloc 3",
                "main (sites.py:20);make_a (sites.py:5);PyObject_Malloc 6",
            ]
        );
        let dir = std::env::temp_dir().join(format!("tracer-flame-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let svg = OutputFile::check("--flamegraph", &dir.join("f.svg"), false).unwrap();
        write_flamegraph(&svg, &lines, "PID 1: calls", Weight::Calls).unwrap();
        let text = std::fs::read_to_string(&svg.path).unwrap();
        assert!(text.starts_with("<?xml") && text.contains("make_a") && text.contains("PID 1: calls"), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
