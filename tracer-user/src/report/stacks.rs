//! `--folded` and `--flamegraph`: the summary's stacks as folded lines
//! (outermost frame first, `;`-separated, then the weight), the input of
//! flamegraph.pl and inferno, and as an SVG flame graph drawn by inferno.

use std::io::Write as _;

use crate::{
    config::Weight,
    model::{NativeFrame, SiteFrame, StackCount},
    report::files::{OutputError, OutputFile},
    text::display,
};

/// A frame as a flame graph shows it: `function (file:line)`, as py-spy
/// writes them, the target's names escaped ([`display`]: a folded file is
/// read on a terminal too), with `;` (the separator) kept out; the count is after the
/// last space, so spaces inside are fine.
pub(super) fn label(f: &SiteFrame) -> String {
    let file = display(f.file.rsplit('/').next().unwrap_or(&f.file));
    let at = f.line.map_or_else(|| file.clone(), |l| format!("{file}:{l}"));
    format!("{} ({at})", display(&f.function)).replace(';', ":")
}

/// A native frame as a flame graph shows it: `function [module]`, with
/// `inlined` after the module where the compiler inlined it there; square
/// brackets, where Python frames have parentheses.
fn native_label(f: &NativeFrame) -> String {
    let inlined = if f.inlined { ", inlined" } else { "" };
    format!("{} [{}{inlined}]", display(&f.function), display(&f.module)).replace(';', ":")
}

/// The C function that runs Python frames: where the native stack shows
/// it, the Python frames it runs take its place.
const EVAL: &str = "_PyEval_EvalFrameDefault";

/// Whether `function` is the eval loop, or the part of it the compiler
/// split off (`_PyEval_EvalFrameDefault.cold` in Debian's LTO builds,
/// which runs within the same call).
fn is_eval(function: &str) -> bool {
    function.strip_prefix(EVAL).is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// The frames of `s`, outermost first, as folded lines name them. Without
/// native frames: the Python frames, then the probed function. With them
/// (py-spy's `--native` merge): the native frames from the process's root,
/// each non-inlined `_PyEval_EvalFrameDefault` replaced by the Python
/// frames that call of it runs (where the entry frames show which, 3.12+;
/// else all of them at the innermost call), and the native frames above
/// the innermost Python frame on top, the probed instruction's last.
fn frames_of(s: &StackCount) -> Vec<String> {
    let python: Vec<String> = s.frames.iter().map(label).collect();
    let Some(native) = &s.native else {
        let mut frames: Vec<String> = python.into_iter().rev().collect();
        if s.truncated {
            frames.insert(0, "[truncated]".to_owned());
        }
        frames.push(s.probe.clone());
        return frames;
    };
    // Python frames by eval call, innermost first.
    let groups: Vec<Vec<String>> = match &s.eval_calls {
        Some(calls) => {
            let mut rest = python.as_slice();
            let mut groups = Vec::new();
            for &n in calls {
                let (group, after) = rest.split_at((n as usize).min(rest.len()));
                groups.push(group.to_vec());
                rest = after;
            }
            if !rest.is_empty() {
                groups.push(rest.to_vec());
            }
            groups
        }
        None => vec![python],
    };
    let mut groups = groups.into_iter();
    let mut inner_first: Vec<String> = Vec::new();
    for f in native {
        if is_eval(&f.function)
            && !f.inlined
            && let Some(group) = groups.next()
        {
            inner_first.extend(group);
            continue;
        }
        inner_first.push(native_label(f));
    }
    // Python frames left over (the native unwind stopped first) go below
    // the native ones, outside them.
    let mut left: Vec<String> = groups.flatten().collect();
    if s.truncated {
        left.push("[python frames cut at --depth]".to_owned());
    }
    inner_first.extend(left);
    if let Some(end) = &s.native_end {
        inner_first.push(format!("[native unwind stopped: {end}]").replace(';', ":"));
    }
    inner_first.into_iter().rev().collect()
}

/// The folded lines of `stacks` weighted by `weight`, sorted (as the
/// folded format expects), equal stacks merged, stacks of weight 0 left
/// out.
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
        let frames = frames_of(s);
        let total = merged.entry(frames.join(";")).or_default();
        *total = total.saturating_add(count);
    }
    merged.into_iter().map(|(stack, n)| format!("{stack} {n}")).collect()
}

/// Writes `lines` to `file`.
pub fn write_folded(file: &OutputFile, lines: &[String]) -> Result<(), OutputError> {
    let mut out = std::io::BufWriter::new(file.create()?);
    let written = lines.iter().try_for_each(|line| writeln!(out, "{line}")).and_then(|()| out.flush());
    drop(out);
    removed_unless_whole(file, written)
}

/// Draws `lines` as a flame graph titled `title` into `file`.
pub fn write_flamegraph(file: &OutputFile, lines: &[String], title: &str, weight: Weight) -> Result<(), OutputError> {
    let mut out = std::io::BufWriter::new(file.create()?);
    let mut options = inferno::flamegraph::Options::default();
    title.clone_into(&mut options.title);
    options.count_name = weight.to_string();
    let drawn = inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut out)
        .and_then(|()| out.flush());
    drop(out);
    removed_unless_whole(file, drawn)
}

/// `file` as written, or, where writing it failed, gone: a half-written
/// file would be taken for a result, and refused as existing next time.
fn removed_unless_whole(file: &OutputFile, written: std::io::Result<()>) -> Result<(), OutputError> {
    written.map_err(|e| {
        let _ = std::fs::remove_file(&file.path);
        OutputError::Create { flag: file.flag, path: file.path.clone(), cause: e.to_string() }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, line: u32) -> SiteFrame {
        SiteFrame { function: function.into(), file: "/srv/app/sites.py".into(), line: Some(line) }
    }

    #[test]
    fn a_file_that_fails_is_not_left_behind() {
        let path = std::env::temp_dir().join(format!("tracer-stacks-{}.svg", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let file = OutputFile::check("--flamegraph", &path, false).unwrap();
        // inferno refuses to draw nothing, after the file was made.
        let err = write_flamegraph(&file, &[], "t", Weight::Calls).unwrap_err();
        assert!(err.to_string().starts_with(&format!("cannot create --flamegraph {}: ", path.display())), "{err}");
        assert!(!path.exists());
    }

    #[test]
    fn the_targets_names_are_escaped_in_labels() {
        let frame = SiteFrame {
            function: format!("f\x1b]0;title\x07\u{202e}{}", "g".repeat(5000)),
            file: "/tmp/e\u{2067}vil;.py".into(),
            line: Some(3),
        };
        let shown = label(&frame);
        assert!(shown.starts_with("f\\x1b]0:title\\x07\\u{202e}ggg"), "{shown}");
        assert!(shown.ends_with("g… (e\\u{2067}vil:.py:3)"), "{shown}");
        assert!(!shown.contains(['\x1b', '\x07', '\u{202e}', '\u{2067}']), "{shown}");
        assert!(shown.chars().count() < 300, "{shown}");
    }

    #[test]
    fn folds_outermost_first_and_merges_equal_stacks() {
        let a = StackCount {
            probe: "PyObject_Malloc".into(),
            frames: vec![frame("make_a", 5), frame("main", 20)],
            truncated: false,
            native: None,
            eval_calls: None,
            native_end: None,
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

    fn native(function: &str, inlined: bool) -> NativeFrame {
        NativeFrame { function: function.into(), module: "python3".into(), file: None, line: None, inlined }
    }

    #[test]
    fn python_frames_take_the_place_of_the_eval_calls_that_run_them() {
        let s = StackCount {
            probe: "PyObject_Malloc".into(),
            frames: vec![frame("make_a", 5), frame("main", 20), frame("<module>", 30)],
            truncated: false,
            // Innermost first: the allocator inlined in its caller, the
            // eval loop running make_a, a C call back into Python, the eval
            // loop running main and the module, then the root.
            native: Some(vec![
                native("pymalloc_alloc", true),
                native("PyObject_Malloc", false),
                native(EVAL, false),
                native("PyObject_Call", false),
                native(EVAL, false),
                native("main", false),
            ]),
            eval_calls: Some(vec![1, 2]),
            native_end: None,
            calls: 3,
            bytes: 0,
        };
        assert_eq!(
            folded(std::slice::from_ref(&s), Weight::Calls),
            [
                "main [python3];<module> (sites.py:30);main (sites.py:20);PyObject_Call [python3];make_a (sites.py:5);PyObject_Malloc [python3];pymalloc_alloc [python3, inlined] 3"
            ]
        );
        // Where the entry frames do not say (3.11), every Python frame is
        // at the innermost call, and an unwind cut short says so.
        let s = StackCount { eval_calls: None, native_end: Some("cut at 64 native frames".into()), ..s };
        assert_eq!(
            folded(&[s], Weight::Calls),
            [
                "[native unwind stopped: cut at 64 native frames];main [python3];_PyEval_EvalFrameDefault [python3];PyObject_Call [python3];<module> (sites.py:30);main (sites.py:20);make_a (sites.py:5);PyObject_Malloc [python3];pymalloc_alloc [python3, inlined] 3"
            ]
        );
    }
}
