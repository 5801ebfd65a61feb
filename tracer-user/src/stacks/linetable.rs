//! The line of an instruction, from a code object's `co_linetable`: the
//! location table of CPython 3.11 and later (and, in [`line_at_pep626`]
//! and [`line_at_lnotab`], the tables of 3.10 and 3.9) (Objects/locations.md at
//! v3.11.0, `InternalDocs/code_objects.md` since 3.13; read by
//! `_PyCode_CheckLineNumber` in Objects/codeobject.c), the same format in
//! every supported version.
//!
//! The table is a run of entries. Each starts with a byte with bit 7 set:
//! bits 3-6 are the entry's code, bits 0-2 the number of code units (2
//! bytes each) it covers, minus one. Bytes after it have bit 7 clear. The
//! start line is a delta from the previous entry's (from `co_firstlineno`
//! for the first):
//!
//! | code  | form           | line delta      | then                          |
//! |-------|----------------|-----------------|-------------------------------|
//! | 0-9   | short          | 0               | one byte of columns           |
//! | 10-12 | one line       | code - 10       | start and end column bytes    |
//! | 13    | no columns     | svarint         |                               |
//! | 14    | long           | svarint         | end line, columns (varints)   |
//! | 15    | no location    | 0 (line `None`) |                               |
//!
//! A varint is 6-bit chunks, least significant first, bit 6 set on every
//! chunk but the last; an svarint is a varint `v` meaning `-(v >> 1)` when
//! bit 0 is set and `v >> 1` otherwise.

use thiserror::Error;

/// A table that does not decode.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum LineTableError {
    #[error("byte {at} of the line table should start an entry (bit 7 set) but is {byte:#04x}")]
    NotAnEntry { at: usize, byte: u8 },
    #[error("the line table ends inside the entry at byte {at}")]
    Truncated { at: usize },
    #[error("the line table covers {covered} bytes of code, not the instruction at byte {offset}")]
    PastEnd { offset: u64, covered: u64 },
    #[error("the line table's line deltas overflow at byte {at}")]
    Overflow { at: usize },
    #[error("the line table gives line {line} at byte {offset}, before the file's first line")]
    BadLine { offset: u64, line: i64 },
}

/// The source line of the instruction at byte `offset` of the code
/// (`co_code_adaptive`), in a code object whose first line is
/// `first_line`; `None` where the table says the instruction has no
/// location. A negative offset (a frame that has not started) is the first
/// line, as `PyCode_Addr2Line` has it.
pub fn line_at(table: &[u8], first_line: i32, offset: i64) -> Result<Option<u32>, LineTableError> {
    let Ok(offset) = u64::try_from(offset) else {
        return u32::try_from(first_line)
            .map(Some)
            .map_err(|_| LineTableError::BadLine { offset: 0, line: first_line.into() });
    };
    let mut bytes = Bytes { table, at: 0 };
    let mut line = i64::from(first_line);
    let mut start = 0u64;
    while let Some(&first) = table.get(bytes.at) {
        let entry = bytes.at;
        if first & 0x80 == 0 {
            return Err(LineTableError::NotAnEntry { at: entry, byte: first });
        }
        bytes.at += 1;
        let code = (first >> 3) & 0x0f;
        let units = u64::from(first & 0x07) + 1;
        let (delta, located) = match code {
            0..=9 => {
                bytes.skip(1, entry)?;
                (0, true)
            }
            10..=12 => {
                bytes.skip(2, entry)?;
                (i64::from(code) - 10, true)
            }
            13 => (bytes.svarint(entry)?, true),
            14 => {
                let delta = bytes.svarint(entry)?;
                // End line, start column, end column: not needed here.
                for _ in 0..3 {
                    bytes.varint(entry)?;
                }
                (delta, true)
            }
            _ => (0, false),
        };
        // Deltas from a table read from the wrong place could overflow.
        line = line.checked_add(delta).ok_or(LineTableError::Overflow { at: entry })?;
        let end = start + 2 * units;
        if offset < end {
            if !located {
                return Ok(None);
            }
            return u32::try_from(line).map(Some).map_err(|_| LineTableError::BadLine { offset, line });
        }
        start = end;
    }
    Err(LineTableError::PastEnd { offset, covered: start })
}

/// The line of the instruction at byte `offset` of `co_code` from 3.10's
/// `co_linetable` (PEP 626; `Objects/lnotab_notes.txt` and
/// Objects/codeobject.c at v3.10.13, `PyCode_Addr2Line`): byte pairs, an
/// unsigned length in bytes of code and a signed line delta, -128 for a
/// range without a line; the delta of every pair counts, a range of
/// length 0 included. A negative offset is the first line, as there.
pub fn line_at_pep626(table: &[u8], first_line: i32, offset: i64) -> Result<Option<u32>, LineTableError> {
    let Ok(offset) = u64::try_from(offset) else { return first(first_line) };
    let (mut line, mut end) = (i64::from(first_line), 0u64);
    for (i, pair) in table.chunks_exact(2).enumerate() {
        let length = u64::from(pair[0]);
        let delta = i8::from_le_bytes([pair[1]]);
        end += length;
        let located = delta != i8::MIN;
        if located {
            line = line.checked_add(i64::from(delta)).ok_or(LineTableError::Overflow { at: 2 * i })?;
        }
        if offset < end {
            if !located {
                return Ok(None);
            }
            return u32::try_from(line).map(Some).map_err(|_| LineTableError::BadLine { offset, line });
        }
    }
    Err(LineTableError::PastEnd { offset, covered: end })
}

/// The line of the instruction at byte `offset` of `co_code` from 3.9's
/// `co_lnotab` (`Objects/lnotab_notes.txt` and Objects/codeobject.c at
/// v3.9.18, `PyCode_Addr2Line`): byte pairs, an unsigned bytecode
/// increment and a signed line increment, the line moving by each pair
/// whose address is at or before the offset. Every offset has a line (past
/// the table, the last one), a negative one the first.
pub fn line_at_lnotab(table: &[u8], first_line: i32, offset: i64) -> Result<Option<u32>, LineTableError> {
    let (mut line, mut address) = (i64::from(first_line), 0i64);
    for (i, pair) in table.chunks_exact(2).enumerate() {
        address += i64::from(pair[0]);
        if address > offset {
            break;
        }
        line =
            line.checked_add(i64::from(i8::from_le_bytes([pair[1]]))).ok_or(LineTableError::Overflow { at: 2 * i })?;
    }
    let at = u64::try_from(offset).unwrap_or(0);
    u32::try_from(line).map(Some).map_err(|_| LineTableError::BadLine { offset: at, line })
}

/// A frame that has not started: its code's first line.
fn first(first_line: i32) -> Result<Option<u32>, LineTableError> {
    u32::try_from(first_line).map(Some).map_err(|_| LineTableError::BadLine { offset: 0, line: first_line.into() })
}

/// A cursor over the table's bytes.
struct Bytes<'a> {
    table: &'a [u8],
    at: usize,
}

impl Bytes<'_> {
    /// The next byte inside the entry that starts at `entry`.
    fn next(&mut self, entry: usize) -> Result<u8, LineTableError> {
        match self.table.get(self.at) {
            Some(&b) if b & 0x80 == 0 => {
                self.at += 1;
                Ok(b)
            }
            _ => Err(LineTableError::Truncated { at: entry }),
        }
    }

    fn skip(&mut self, n: usize, entry: usize) -> Result<(), LineTableError> {
        for _ in 0..n {
            self.next(entry)?;
        }
        Ok(())
    }

    fn varint(&mut self, entry: usize) -> Result<u64, LineTableError> {
        let mut value = 0u64;
        let mut shift = 0u32;
        loop {
            let b = self.next(entry)?;
            // A line delta never needs more than a few chunks; more is a
            // table read from the wrong place.
            if shift > 60 {
                return Err(LineTableError::Truncated { at: entry });
            }
            value |= u64::from(b & 0x3f) << shift;
            if b & 0x40 == 0 {
                return Ok(value);
            }
            shift += 6;
        }
    }

    fn svarint(&mut self, entry: usize) -> Result<i64, LineTableError> {
        let v = self.varint(entry)?;
        // v >> 1 fits in i64 for any u64.
        let magnitude = i64::try_from(v >> 1).unwrap_or(i64::MAX);
        Ok(if v & 1 == 1 { -magnitude } else { magnitude })
    }
}

#[cfg(test)]
mod tests {
    use std::{path::Path, process::Command};

    use super::*;

    #[test]
    fn decodes_each_form() {
        // One-line form, delta 1, two code units; short form, one unit;
        // no-columns form, delta -2 (svarint 5); no location; long form,
        // delta +70 (svarint 140 = 0x0c | 0x40, 0x02), end line, columns.
        let table = [
            0x80 | 11 << 3 | 1,
            4,
            9,
            0x80 | 2 << 3,
            0x12,
            0x80 | 13 << 3,
            5,
            0x80 | 15 << 3,
            0x80 | 14 << 3,
            0x4c,
            2,
            0,
            1,
            3,
        ];
        let line = |offset| line_at(&table, 10, offset);
        assert_eq!(line(0), Ok(Some(11)));
        assert_eq!(line(3), Ok(Some(11)));
        assert_eq!(line(4), Ok(Some(11)));
        assert_eq!(line(6), Ok(Some(9)));
        assert_eq!(line(8), Ok(None));
        assert_eq!(line(10), Ok(Some(79)));
        assert_eq!(line(12), Err(LineTableError::PastEnd { offset: 12, covered: 12 }));
        assert_eq!(line(-2), Ok(Some(10)));
    }

    #[test]
    fn refuses_what_is_not_a_table() {
        assert_eq!(line_at(&[0x12], 1, 0), Err(LineTableError::NotAnEntry { at: 0, byte: 0x12 }));
        assert_eq!(line_at(&[0x80 | 11 << 3, 4], 1, 0), Err(LineTableError::Truncated { at: 0 }));
        assert_eq!(line_at(&[0x80 | 13 << 3, 0x40], 1, 0), Err(LineTableError::Truncated { at: 0 }));
        // Delta -5 from line 3.
        assert_eq!(line_at(&[0x80 | 13 << 3, 11], 3, 0), Err(LineTableError::BadLine { offset: 0, line: -2 }));
        // Two deltas of +2^62 - 1 (eleven chunks of six bits) overflow.
        let mut huge = vec![0x80 | 13 << 3];
        huge.extend([0x7e, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x07]);
        let twice: Vec<u8> = huge.iter().chain(&huge).copied().collect();
        assert_eq!(line_at(&twice, 2, 2), Err(LineTableError::Overflow { at: 12 }));
    }

    #[test]
    fn decodes_the_tables_before_3_11() {
        // 3.10: 4 bytes at +1, 0 bytes at +5 (counted all the same), 2
        // bytes without a line, 6 bytes at -2.
        let table = [4, 1, 0, 5, 2, 0x80, 6, 0xfe];
        let line = |offset| line_at_pep626(&table, 10, offset);
        assert_eq!((line(0), line(3)), (Ok(Some(11)), Ok(Some(11))));
        assert_eq!((line(4), line(5)), (Ok(None), Ok(None)));
        assert_eq!((line(6), line(11)), (Ok(Some(14)), Ok(Some(14))));
        assert_eq!(line(12), Err(LineTableError::PastEnd { offset: 12, covered: 12 }));
        assert_eq!(line(-2), Ok(Some(10)));
        // 3.9: line 10 up to byte 4, then +3 (in two pairs: an increment of
        // 0 bytes carries a line delta), then -1 from byte 10 on.
        let table = [4, 1, 0, 2, 6, 0xff];
        let line = |offset| line_at_lnotab(&table, 10, offset);
        assert_eq!((line(0), line(3), line(4), line(9)), (Ok(Some(10)), Ok(Some(10)), Ok(Some(13)), Ok(Some(13))));
        assert_eq!((line(10), line(500), line(-1)), (Ok(Some(12)), Ok(Some(12)), Ok(Some(10))));
        assert_eq!(line_at_lnotab(&[0, 0x80], 3, 0), Err(LineTableError::BadLine { offset: 0, line: -125 }));
    }

    /// Every instruction of every code object compiled from a large stdlib
    /// module gets the line CPython's own tools give it on pyenv's 3.10.13
    /// (`co_lines()`) and 3.9.18 (`dis.findlinestarts`, which reads
    /// `co_lnotab` as `PyCode_Addr2Line` does).
    #[test]
    fn agrees_with_cpython_before_3_11() {
        const DUMP: &str = r"
import dis, inspect, sys
def walk(c):
    yield c
    for k in c.co_consts:
        if hasattr(k, 'co_code'):
            yield from walk(k)
src = open(inspect.__file__).read()
for co in walk(compile(src, inspect.__file__, 'exec')):
    n = len(co.co_code)
    line = [None] * n
    if sys.version_info >= (3, 10):
        table = co.co_linetable
        for start, end, l in co.co_lines():
            for o in range(start, min(end, n)):
                line[o] = l
    else:
        table = co.co_lnotab
        starts = dict(dis.findlinestarts(co))
        current = co.co_firstlineno
        for o in range(n):
            current = starts.get(o, current)
            line[o] = current
    print(co.co_firstlineno, table.hex() or '-', ' '.join('-' if l is None else str(l) for l in line[::2]))
";
        for (version, format) in [("3.9.18", 9), ("3.10.13", 10)] {
            let python = format!("/root/.pyenv/versions/{version}/bin/python3");
            assert!(Path::new(&python).is_file(), "{python} is missing: it is part of this machine kind");
            let out = Command::new(&python).args(["-c", DUMP]).output().expect("run python");
            assert!(out.status.success(), "{version}: {}", String::from_utf8_lossy(&out.stderr));
            let text = String::from_utf8(out.stdout).expect("utf-8");
            let mut units = 0;
            for row in text.lines() {
                let mut fields = row.split(' ');
                let first: i32 = fields.next().expect("first line").parse().expect("a number");
                let hex = fields.next().expect("table").trim_start_matches('-');
                let table: Vec<u8> =
                    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect();
                for (unit, want) in fields.enumerate() {
                    let want = (want != "-").then(|| want.parse::<u32>().expect("a line"));
                    let offset = i64::try_from(2 * unit).expect("small");
                    let got = if format == 9 {
                        line_at_lnotab(&table, first, offset)
                    } else {
                        line_at_pep626(&table, first, offset)
                    };
                    assert_eq!(got, Ok(want), "{version}: byte {offset} of {row}");
                    units += 1;
                }
            }
            // inspect.py compiles to about 9,400 instructions on 3.9.
            assert!(units > 5_000, "{version}: only {units} instructions compared");
        }
    }

    /// The interpreters of every build here: pyenv's, Debian's LTO 3.11
    /// and the forky root's LTO 3.13 and 3.14 (run in that root), as
    /// (name, command line).
    fn interpreters() -> Vec<(String, Vec<String>)> {
        const FORKY: &str = "/var/lib/tracer/forky";
        let mut all: Vec<(String, Vec<String>)> = ["3.11.7", "3.12.1", "3.13.0"]
            .iter()
            .map(|v| (format!("pyenv {v}"), vec![format!("/root/.pyenv/versions/{v}/bin/python3")]))
            .collect();
        all.push(("Debian 3.11".to_owned(), vec!["/usr/bin/python3.11".to_owned()]));
        for p in ["python3.13", "python3.14"] {
            let inside = Path::new(FORKY).join("usr/bin").join(p);
            assert!(inside.is_file(), "{} is missing: run `cargo xtask setup`", inside.display());
            all.push((format!("forky {p}"), vec!["/usr/sbin/chroot".to_owned(), FORKY.to_owned(), p.to_owned()]));
        }
        for (name, argv) in &all {
            assert!(Path::new(&argv[0]).is_file(), "{name}: {} is missing on this machine", argv[0]);
        }
        all
    }

    /// Every code unit of every code object compiled from a large stdlib
    /// module gets the line CPython's own `co_positions()` gives it, on
    /// each interpreter here.
    #[test]
    fn agrees_with_cpython_on_a_whole_module() {
        const DUMP: &str = r"
import inspect, sys
def walk(c):
    yield c
    for k in c.co_consts:
        if hasattr(k, 'co_code'):
            yield from walk(k)
src = open(inspect.__file__).read()
for co in walk(compile(src, inspect.__file__, 'exec')):
    lines = ' '.join('-' if p[0] is None else str(p[0]) for p in co.co_positions())
    print(co.co_firstlineno, co.co_linetable.hex(), lines)
";
        for (version, argv) in interpreters() {
            let out = Command::new(&argv[0]).args(&argv[1..]).args(["-c", DUMP]).output().expect("run python");
            assert!(out.status.success(), "{version}: {}", String::from_utf8_lossy(&out.stderr));
            let text = String::from_utf8(out.stdout).expect("utf-8");
            let mut units = 0;
            for row in text.lines() {
                let mut fields = row.split(' ');
                let first: i32 = fields.next().expect("first line").parse().expect("a number");
                let hex = fields.next().expect("table");
                let table: Vec<u8> =
                    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect();
                for (unit, want) in fields.enumerate() {
                    let want = (want != "-").then(|| want.parse::<u32>().expect("a line"));
                    let offset = i64::try_from(2 * unit).expect("small");
                    assert_eq!(line_at(&table, first, offset), Ok(want), "{version}: unit {unit} of {row}");
                    units += 1;
                }
            }
            assert!(units > 10_000, "{version}: only {units} code units compared");
        }
    }
}
