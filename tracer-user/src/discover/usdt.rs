//! SystemTap (USDT) markers in an ELF image: the `.note.stapsdt` notes a
//! build with `--with-dtrace` carries, one per marker site, and the
//! argument specs they hold (`-4@%eax`, `8@-24(%rbp)`, `-4@$2`): what the
//! sys/sdt.h macros record of each site (see their "ELF note format").
//!
//! A note's descriptor is the site's link-time address, the link-time
//! address of `.stapsdt.base`, the semaphore's address (0 for none), then
//! the provider, the marker's name and its argument specs as C strings. A
//! file whose sections moved after linking (prelink) has its sites moved
//! by as much as `.stapsdt.base` did.

use std::path::{Path, PathBuf};

use object::{
    Endianness,
    elf::FileHeader64,
    read::elf::{FileHeader as _, SectionHeader as _},
};
use thiserror::Error;

/// `NT_STAPSDT`, the note type of a marker (sys/sdt.h).
const NT_STAPSDT: u32 = 3;

/// A failure to read an image's markers.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum UsdtError {
    #[error("{path}: its .note.stapsdt notes cannot be read ({why}); the file may be damaged")]
    Notes { path: PathBuf, why: String },
    #[error(transparent)]
    Argument(Box<BadArgument>),
}

/// A marker whose argument tracer cannot read.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{path}: marker {provider}:{name} at {address:#x} has argument {spec:?}, which tracer cannot read: {why}")]
pub struct BadArgument {
    pub path: PathBuf,
    pub provider: String,
    pub name: String,
    pub address: u64,
    pub spec: String,
    pub why: String,
}

/// One marker site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsdtNote {
    pub provider: String,
    pub name: String,
    /// Its link-time address, moved as `.stapsdt.base` was.
    pub address: u64,
    /// Its semaphore's link-time address; 0 for a marker without one.
    pub semaphore: u64,
    /// The argument specs, space-separated.
    pub args: String,
}

/// Every marker site in the ELF file `data` (read from `path`), in note
/// order; none for a file without `.note.stapsdt` (or not 64-bit ELF).
pub fn notes(path: &Path, data: &[u8]) -> Result<Vec<UsdtNote>, UsdtError> {
    let err = |why: String| UsdtError::Notes { path: path.to_owned(), why };
    let Ok(header) = FileHeader64::<Endianness>::parse(data) else { return Ok(Vec::new()) };
    let endian = header.endian().map_err(|e| err(e.to_string()))?;
    let sections = header.sections(endian, data).map_err(|e| err(e.to_string()))?;
    let named = |name: &[u8]| sections.iter().find(|s| sections.section_name(endian, s).is_ok_and(|n| n == name));
    let Some(section) = named(b".note.stapsdt") else { return Ok(Vec::new()) };
    let base = named(b".stapsdt.base").map(|s| s.sh_addr(endian));
    let mut out = Vec::new();
    let Some(mut iter) = section.notes(endian, data).map_err(|e| err(e.to_string()))? else {
        return Ok(out);
    };
    while let Some(note) = iter.next().map_err(|e| err(e.to_string()))? {
        if note.name() != b"stapsdt" || note.n_type(endian) != NT_STAPSDT {
            continue;
        }
        out.push(parse_desc(note.desc(), base).ok_or_else(|| err("a note is shorter than its fields".to_owned()))?);
    }
    Ok(out)
}

/// A note's descriptor: three addresses, then three C strings.
fn parse_desc(desc: &[u8], actual_base: Option<u64>) -> Option<UsdtNote> {
    let word = |i: usize| Some(u64::from_le_bytes(desc.get(i * 8..i * 8 + 8)?.try_into().ok()?));
    let (pc, base, semaphore) = (word(0)?, word(1)?, word(2)?);
    let mut strings = desc.get(24..)?.split(|&b| b == 0).map(|s| String::from_utf8_lossy(s).into_owned());
    let (provider, name, args) = (strings.next()?, strings.next()?, strings.next().unwrap_or_default());
    let address = match actual_base {
        Some(actual) if base != 0 => pc.wrapping_add(actual.wrapping_sub(base)),
        _ => pc,
    };
    Some(UsdtNote { provider, name, address, semaphore, args })
}

/// Where a marker's argument is, at its site.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgLocation {
    /// A register, by its DWARF x86-64 number (0 = rax … 15 = r15).
    Register(u16),
    /// A constant.
    Constant(i64),
    /// Memory at a register (DWARF number) plus an offset.
    Memory { base: u16, offset: i64 },
}

/// One argument of a marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsdtArg {
    /// Its size in bytes: 1, 2, 4 or 8.
    pub size: u8,
    pub signed: bool,
    pub location: ArgLocation,
}

/// The x86-64 registers an argument may name: the name, its DWARF number
/// and its width in bytes. The high-byte registers (`%ah` …) are left out:
/// no DWARF number names them.
const REGISTERS: [(&str, u16, u8); 64] = {
    const NAMES: [[&str; 4]; 16] = [
        ["rax", "eax", "ax", "al"],
        ["rdx", "edx", "dx", "dl"],
        ["rcx", "ecx", "cx", "cl"],
        ["rbx", "ebx", "bx", "bl"],
        ["rsi", "esi", "si", "sil"],
        ["rdi", "edi", "di", "dil"],
        ["rbp", "ebp", "bp", "bpl"],
        ["rsp", "esp", "sp", "spl"],
        ["r8", "r8d", "r8w", "r8b"],
        ["r9", "r9d", "r9w", "r9b"],
        ["r10", "r10d", "r10w", "r10b"],
        ["r11", "r11d", "r11w", "r11b"],
        ["r12", "r12d", "r12w", "r12b"],
        ["r13", "r13d", "r13w", "r13b"],
        ["r14", "r14d", "r14w", "r14b"],
        ["r15", "r15d", "r15w", "r15b"],
    ];
    const SIZES: [u8; 4] = [8, 4, 2, 1];
    let mut out = [("", 0, 0); 64];
    let mut i = 0;
    while i < 64 {
        #[allow(clippy::cast_possible_truncation, reason = "i / 4 is below 16")]
        let dwarf = (i / 4) as u16;
        out[i] = (NAMES[i / 4][i % 4], dwarf, SIZES[i % 4]);
        i += 1;
    }
    out
};

/// The DWARF number and width of register `%name`.
fn register(name: &str) -> Result<(u16, u8), String> {
    let bare = name.strip_prefix('%').ok_or_else(|| format!("{name:?} is not a register"))?;
    REGISTERS
        .iter()
        .find(|(n, _, _)| *n == bare)
        .map(|&(_, dwarf, size)| (dwarf, size))
        .ok_or_else(|| format!("register %{bare} is not one tracer reads (only the 16 general registers)"))
}

/// A decimal or `0x` hexadecimal integer, possibly negative.
fn integer(text: &str) -> Result<i64, String> {
    let (negative, digits) = text.strip_prefix('-').map_or((false, text), |d| (true, d));
    let magnitude = match digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        Some(hex) => i64::from_str_radix(hex, 16),
        None => digits.parse::<i64>(),
    }
    .map_err(|e| format!("{text:?} is not an integer ({e})"))?;
    // `--9223372036854775808` parses to a magnitude with no negation.
    if negative { magnitude.checked_neg().ok_or_else(|| format!("{text:?} is out of range")) } else { Ok(magnitude) }
}

/// Parses one argument spec, `SIZE@OPERAND`, where a negative size is a
/// signed argument and the operand is in AT&T syntax: `%reg`, `$constant`
/// or `offset(%reg)`. A rip-relative or indexed operand is refused, as is
/// a size other than 1, 2, 4 or 8.
pub fn parse_arg(spec: &str) -> Result<UsdtArg, String> {
    let (size, operand) = spec.split_once('@').ok_or_else(|| "no SIZE@ before the operand".to_owned())?;
    let (signed, magnitude) = size.strip_prefix('-').map_or((false, size), |m| (true, m));
    let size: u8 = match magnitude.parse() {
        Ok(n @ (1 | 2 | 4 | 8)) => n,
        _ => return Err(format!("size {size:?} is not 1, 2, 4 or 8 bytes")),
    };
    let location = if let Some(constant) = operand.strip_prefix('$') {
        ArgLocation::Constant(integer(constant)?)
    } else if operand.starts_with('%') {
        let (dwarf, width) = register(operand)?;
        return Ok(UsdtArg { size: size.min(width), signed, location: ArgLocation::Register(dwarf) });
    } else if let Some((offset, rest)) = operand.split_once('(') {
        let inner = rest.strip_suffix(')').ok_or_else(|| format!("{operand:?} has no closing parenthesis"))?;
        if inner.contains(',') {
            return Err(format!("{operand:?} is an indexed operand"));
        }
        if inner == "%rip" {
            return Err(format!("{operand:?} is rip-relative"));
        }
        let (base, width) = register(inner)?;
        if width != 8 {
            return Err(format!("{operand:?} addresses through a {width}-byte register"));
        }
        let offset = if offset.is_empty() { 0 } else { integer(offset)? };
        ArgLocation::Memory { base, offset }
    } else {
        return Err(format!("{operand:?} is no operand tracer knows"));
    };
    Ok(UsdtArg { size, signed, location })
}

/// The space-separated argument specs of a note, each parsed.
pub fn parse_args(args: &str) -> Result<Vec<UsdtArg>, (String, String)> {
    args.split_whitespace().map(|spec| parse_arg(spec).map_err(|why| (spec.to_owned(), why))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_specs() {
        let reg = |dwarf, size, signed| Ok(UsdtArg { size, signed, location: ArgLocation::Register(dwarf) });
        assert_eq!(parse_arg("-4@%eax"), reg(0, 4, true));
        assert_eq!(parse_arg("-8@%r12"), reg(12, 8, true));
        assert_eq!(parse_arg("8@%rbx"), reg(3, 8, false));
        assert_eq!(parse_arg("4@%r13d"), reg(13, 4, false));
        assert_eq!(parse_arg("1@%sil"), reg(4, 1, false));
        // A register narrower than the argument gives what it holds.
        assert_eq!(parse_arg("-8@%edx"), reg(1, 4, true));
        let mem =
            |base, offset, size, signed| Ok(UsdtArg { size, signed, location: ArgLocation::Memory { base, offset } });
        assert_eq!(parse_arg("-4@112(%rsp)"), mem(7, 112, 4, true));
        assert_eq!(parse_arg("8@-24(%rbp)"), mem(6, -24, 8, false));
        assert_eq!(parse_arg("-4@-228(%rbp)"), mem(6, -228, 4, true));
        assert_eq!(parse_arg("2@(%rdi)"), mem(5, 0, 2, false));
        assert_eq!(parse_arg("4@0x10(%r15)"), mem(15, 16, 4, false));
        let constant = |value, size, signed| Ok(UsdtArg { size, signed, location: ArgLocation::Constant(value) });
        assert_eq!(parse_arg("-4@$2"), constant(2, 4, true));
        assert_eq!(parse_arg("-4@$-1"), constant(-1, 4, true));
        assert_eq!(parse_arg("8@$0x20"), constant(32, 8, false));
        for (bad, why) in [
            ("4@8(%rip)", "rip-relative"),
            ("foo+8(%rip)", "no SIZE@"),
            ("8@8(%rax,%rbx,8)", "indexed"),
            ("3@%eax", "not 1, 2, 4 or 8"),
            ("4@%ah", "not one tracer reads"),
            ("4@%xmm0", "not one tracer reads"),
            ("4@8(%eax)", "4-byte register"),
            ("4@gc_state", "no operand"),
        ] {
            let err = parse_arg(bad).expect_err(bad);
            assert!(err.contains(why), "{bad}: {err}");
        }
        // A spec from a hostile image, whose offset negates to no i64.
        assert!(parse_arg("8@--9223372036854775808(%rax)").unwrap_err().contains("out of range"));
        assert!(parse_arg("8@$--9223372036854775808").unwrap_err().contains("out of range"));
        assert_eq!(parse_args("8@%rbx 8@%r15").map(|a| a.len()), Ok(2));
        assert_eq!(parse_args("8@%rbx 3@%r15").unwrap_err().0, "3@%r15");
    }

    #[test]
    fn descriptors_move_with_the_base() {
        let mut desc = Vec::new();
        for word in [0x42_6fc1u64, 0x8c_99c0, 0xa7_ed4e] {
            desc.extend_from_slice(&word.to_le_bytes());
        }
        desc.extend_from_slice(b"python\0gc__start\0-4@112(%rsp)\0");
        let note = parse_desc(&desc, Some(0x8c_99c0)).expect("a note");
        assert_eq!(
            note,
            UsdtNote {
                provider: "python".into(),
                name: "gc__start".into(),
                address: 0x42_6fc1,
                semaphore: 0xa7_ed4e,
                args: "-4@112(%rsp)".into()
            }
        );
        assert_eq!(parse_desc(&desc, Some(0x8c_a9c0)).expect("a note").address, 0x42_7fc1);
        assert_eq!(parse_desc(&desc[..20], None), None);
    }

    /// Debian's python3.11 (`cargo xtask setup` installs it) carries the
    /// markers, each with its semaphore.
    #[test]
    fn debian_python_has_gc_markers() {
        let path = Path::new("/usr/bin/python3.11");
        let data = std::fs::read(path).expect("Debian's python3.11 (run `cargo xtask setup`)");
        let found = notes(path, &data).expect("its notes read");
        for name in ["gc__start", "gc__done"] {
            let n = found.iter().find(|n| n.provider == "python" && n.name == name).expect(name);
            assert_ne!(n.semaphore, 0, "{n:?}");
            let args = parse_args(&n.args).expect("its arguments parse");
            assert_eq!(args.len(), 1, "{n:?}");
        }
        let exe = std::env::current_exe().expect("the test binary");
        assert_eq!(notes(&exe, &std::fs::read(&exe).expect("read")), Ok(Vec::new()));
    }
}
