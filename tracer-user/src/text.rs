//! Text that comes from the target (type names, function and file names,
//! paths, environment values): the target chooses it, so it is bounded in
//! length when read and escaped before it reaches a terminal. A name must
//! not be able to move the cursor, recolour the screen, reorder what
//! follows it (Unicode bidi controls), or fill the screen.
//!
//! Two forms: [`bound`] (the raw text, cut to [`MAX_NAME`] characters and
//! marked, valid UTF-8 since it is a `String`) is what is kept and what the
//! JSON holds (serde escapes its controls); [`display`] is what a table,
//! a folded line or a flame graph shows.

use std::fmt::Write as _;

/// The most characters of a name kept; a longer one is cut there and
/// marked with [`CUT`].
pub const MAX_NAME: usize = 256;

/// What ends a name that was cut.
pub const CUT: char = '…';

/// `text` cut to [`MAX_NAME`] characters, with [`CUT`] after it where it
/// was longer.
///
/// A name cut already (its [`MAX_NAME`] characters then [`CUT`]) is kept
/// as it is, so that bounding twice loses nothing more.
#[must_use]
pub fn bound(text: &str) -> String {
    let Some((end, _)) = text.char_indices().nth(MAX_NAME) else { return text.to_owned() };
    if &text[end..] == CUT.encode_utf8(&mut [0; 4]) {
        return text.to_owned();
    }
    cut(&text[..end])
}

/// `text` (already cut by the reader) marked as cut.
#[must_use]
pub fn cut(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + CUT.len_utf8());
    out.push_str(text);
    out.push(CUT);
    out
}

/// Whether `c` reorders the text around it: the bidi embeddings and
/// overrides (U+202A to U+202E), isolates (U+2066 to U+2069) and marks
/// (U+200E, U+200F, U+061C).
const fn is_bidi(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{061c}')
}

/// `text` bounded as [`bound`] does, then with what could act on a
/// terminal written as escapes: C0 and C1 controls and DEL as `\x1b`,
/// bidi controls and the line and paragraph separators as `\u{202e}`, and
/// a backslash as `\\`, so that an escape in the output is always one.
#[must_use]
pub fn display(text: &str) -> String {
    escaped(&bound(text), true)
}

/// A message of tracer's own that holds the target's text (a path from
/// its maps, a name), as one line on a terminal: what [`display`] escapes
/// but the backslash (the message's own are kept), and not cut. An error,
/// a note or a header line naming an interpreter at
/// `/srv/\x1b[2J/python3` stays one line and moves no cursor.
#[must_use]
pub fn line(message: &str) -> String {
    escaped(message, false)
}

/// `text` with control, bidi and line-separator characters escaped, and
/// with `backslash` its backslashes too (so that an escape it holds cannot
/// pass for one of these).
fn escaped(text: &str, backslash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let code = u32::from(c);
        if backslash && c == '\\' {
            out.push_str("\\\\");
        } else if c.is_control() {
            // C0, DEL and C1: all below U+0100.
            let _ = write!(out, "\\x{code:02x}");
        } else if is_bidi(c) || matches!(c, '\u{2028}' | '\u{2029}') {
            let _ = write!(out, "\\u{{{code:x}}}");
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_bidi_are_escaped() {
        assert_eq!(display("a\x1b[31mb\n"), "a\\x1b[31mb\\x0a");
        assert_eq!(display("x\u{7f}\u{9b}y"), "x\\x7f\\x9by");
        assert_eq!(display("abc\u{202e}def\u{2066}g\u{2069}"), "abc\\u{202e}def\\u{2066}g\\u{2069}");
        assert_eq!(display("a\\x1b"), "a\\\\x1b");
        assert_eq!(display("naïve.Ωμέγα"), "naïve.Ωμέγα");
    }

    #[test]
    fn a_message_stays_one_line() {
        let path = "/srv/\x1b[2J\n\u{202e}/python3";
        let shown = line(&format!("cannot read {path}: C:\\x"));
        assert_eq!(shown, "cannot read /srv/\\x1b[2J\\x0a\\u{202e}/python3: C:\\x");
        assert_eq!(line(&"é".repeat(1000)), "é".repeat(1000), "not cut");
    }

    #[test]
    fn names_are_bounded_and_marked() {
        let long = "é".repeat(10_000);
        let bounded = bound(&long);
        assert_eq!(bounded.chars().count(), MAX_NAME + 1);
        assert!(bounded.ends_with(CUT));
        assert_eq!(bound(&"x".repeat(MAX_NAME)), "x".repeat(MAX_NAME));
        assert_eq!(bound(&bounded), bounded);
        assert_eq!(bound(&format!("{}{CUT}", "x".repeat(MAX_NAME + 1))), format!("{}{CUT}", "x".repeat(MAX_NAME)));
        let shown = display(&format!("{}\x1b", "y".repeat(20_000)));
        assert_eq!(shown, format!("{}{CUT}", "y".repeat(MAX_NAME)));
        // Escaped, a name stays bounded: `\x1b` for each control.
        assert!(display(&"\x1b".repeat(1000)).len() <= 4 * MAX_NAME + CUT.len_utf8());
    }
}
