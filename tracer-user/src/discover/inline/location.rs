//! Where a parameter's value is at a copy's entry: the simple DWARF
//! location expressions compilers emit there (a register, a frame or
//! register offset, a constant, an entry value), evaluated, and the
//! general-purpose registers they name.

use gimli::{AttributeValue, EndianSlice, Operation, RunTimeEndian, constants as dw};

pub(super) type Reader<'a> = EndianSlice<'a, RunTimeEndian>;
pub(super) type Attrs<'a> = [gimli::Attribute<Reader<'a>>];

/// Where a parameter's value is at a site's entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    /// In a register.
    Register(Register),
    /// In what the register held when the enclosing out-of-line function
    /// was entered (`DW_OP_entry_value`); for an inlined copy, that is not
    /// the register's value at the copy's entry.
    EntryValue(Register),
    /// In memory at the canonical frame address plus `offset`.
    Cfa { offset: i64 },
    /// In memory at a register plus `offset`.
    Memory { base: Register, offset: i64 },
    /// A constant the compiler propagated.
    Constant(u64),
    /// Optimised out, or an expression this module does not evaluate.
    Unknown,
}

impl Location {
    #[must_use]
    pub const fn is_known(&self) -> bool {
        !matches!(self, Self::Unknown)
    }
}

/// An x86-64 general-purpose register, by its DWARF number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Register(u16);

/// `struct pt_regs` field names in DWARF register order (the x86-64 psABI).
const PT_REGS: [&str; 16] =
    ["ax", "dx", "cx", "bx", "si", "di", "bp", "sp", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"];

impl Register {
    /// A general-purpose register; vector and other registers are not in
    /// `pt_regs`, where a BPF program reads arguments.
    #[must_use]
    pub fn from_dwarf(number: u16) -> Option<Self> {
        (usize::from(number) < PT_REGS.len()).then_some(Self(number))
    }

    #[must_use]
    pub const fn dwarf(self) -> u16 {
        self.0
    }

    /// Its field in `struct pt_regs`.
    #[must_use]
    pub fn pt_regs(self) -> &'static str {
        PT_REGS[usize::from(self.0)]
    }
}

/// What `DW_OP_fbreg` is relative to in the enclosing function.
#[derive(Clone, Copy, Debug)]
pub(super) enum FrameBase {
    Cfa,
    Register(Register, i64),
    Unknown,
}

/// A parameter's location at `pc`, from its `DW_AT_const_value` or its
/// `DW_AT_location` (an expression or a location list).
pub(super) fn location<'a>(
    dwarf: &gimli::Dwarf<Reader<'a>>,
    unit: &gimli::Unit<Reader<'a>>,
    attrs: &Attrs<'a>,
    pc: u64,
    frame: FrameBase,
) -> gimli::Result<Location> {
    if let Some(v) = attr(attrs, dw::DW_AT_const_value) {
        return Ok(v
            .udata_value()
            .or(v.sdata_value().map(i64::cast_unsigned))
            .map_or(Location::Unknown, Location::Constant));
    }
    let Some(value) = attr(attrs, dw::DW_AT_location) else { return Ok(Location::Unknown) };
    if let AttributeValue::Exprloc(expr) = value {
        return Ok(evaluate(expr, unit.encoding(), frame));
    }
    let Some(mut list) = dwarf.attr_locations(unit, value)? else { return Ok(Location::Unknown) };
    while let Some(entry) = list.next()? {
        if (entry.range.begin..entry.range.end).contains(&pc) {
            return Ok(evaluate(entry.data, unit.encoding(), frame));
        }
    }
    Ok(Location::Unknown)
}

pub(super) fn attr<'a>(attrs: &Attrs<'a>, name: gimli::DwAt) -> Option<AttributeValue<Reader<'a>>> {
    attrs.iter().find(|a| a.name() == name).map(gimli::Attribute::value)
}

/// The operations of a short expression; `None` when it is longer than
/// any form [`evaluate`] knows, or malformed.
fn operations(expr: gimli::Expression<Reader<'_>>, encoding: gimli::Encoding) -> Option<Vec<Operation<Reader<'_>>>> {
    let mut ops = Vec::new();
    let mut iter = expr.operations(encoding);
    while let Some(op) = iter.next().ok()? {
        if ops.len() == 3 {
            return None;
        }
        ops.push(op);
    }
    Some(ops)
}

/// The location of the simple expressions compilers emit for a parameter
/// at a function's entry; anything else is [`Location::Unknown`].
fn evaluate(expr: gimli::Expression<Reader<'_>>, encoding: gimli::Encoding, frame: FrameBase) -> Location {
    let reg = |r: gimli::Register| Register::from_dwarf(r.0);
    let Some(ops) = operations(expr, encoding) else { return Location::Unknown };
    let known = match ops.as_slice() {
        [Operation::Register { register }]
        | [Operation::RegisterOffset { register, offset: 0, .. }, Operation::StackValue] => {
            reg(*register).map(Location::Register)
        }
        [Operation::RegisterOffset { register, offset, base_type }] if base_type.0 == 0 => {
            reg(*register).map(|base| Location::Memory { base, offset: *offset })
        }
        [Operation::FrameOffset { offset }] => match frame {
            FrameBase::Cfa => Some(Location::Cfa { offset: *offset }),
            FrameBase::Register(base, off) => off.checked_add(*offset).map(|offset| Location::Memory { base, offset }),
            FrameBase::Unknown => None,
        },
        [Operation::UnsignedConstant { value }, Operation::StackValue] => Some(Location::Constant(*value)),
        [Operation::SignedConstant { value }, Operation::StackValue] => Some(Location::Constant(value.cast_unsigned())),
        [Operation::EntryValue { expression }, Operation::StackValue] => {
            match operations(gimli::Expression(*expression), encoding).as_deref() {
                Some([Operation::Register { register }]) => reg(*register).map(Location::EntryValue),
                _ => None,
            }
        }
        _ => None,
    };
    known.unwrap_or(Location::Unknown)
}

/// A function's `DW_AT_frame_base` expression, as `DW_OP_fbreg` uses it.
pub(super) fn frame_base(expr: gimli::Expression<Reader<'_>>, encoding: gimli::Encoding) -> FrameBase {
    let reg = |r: gimli::Register| Register::from_dwarf(r.0);
    match operations(expr, encoding).as_deref() {
        Some([Operation::CallFrameCFA]) => FrameBase::Cfa,
        Some([Operation::Register { register }]) => {
            reg(*register).map_or(FrameBase::Unknown, |r| FrameBase::Register(r, 0))
        }
        Some([Operation::RegisterOffset { register, offset, .. }]) => {
            reg(*register).map_or(FrameBase::Unknown, |r| FrameBase::Register(r, *offset))
        }
        _ => FrameBase::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENCODING: gimli::Encoding = gimli::Encoding { format: gimli::Format::Dwarf32, version: 5, address_size: 8 };

    fn eval(bytes: &[u8], frame: FrameBase) -> Location {
        evaluate(gimli::Expression(EndianSlice::new(bytes, RunTimeEndian::Little)), ENCODING, frame)
    }

    fn reg(n: u16) -> Register {
        Register::from_dwarf(n).unwrap()
    }

    #[test]
    fn simple_expressions_evaluate_and_the_rest_are_unknown() {
        use Location::{Cfa, Constant, EntryValue, Memory, Unknown};
        let cfa = FrameBase::Cfa;
        assert_eq!(eval(&[0x55], cfa), Location::Register(reg(5))); // DW_OP_reg5
        assert_eq!(eval(&[0x77, 0x08], cfa), Memory { base: reg(7), offset: 8 }); // DW_OP_breg7 8
        assert_eq!(eval(&[0x75, 0x00, 0x9f], cfa), Location::Register(reg(5))); // breg5 0, stack_value
        assert_eq!(eval(&[0x91, 0x70], cfa), Cfa { offset: -16 }); // DW_OP_fbreg -16
        assert_eq!(eval(&[0x91, 0x70], FrameBase::Register(reg(6), 16)), Memory { base: reg(6), offset: 0 });
        assert_eq!(eval(&[0x91, 0x70], FrameBase::Unknown), Unknown);
        assert_eq!(eval(&[0x33, 0x9f], cfa), Constant(3)); // DW_OP_lit3, stack_value
        assert_eq!(eval(&[0x10, 0xac, 0x02, 0x9f], cfa), Constant(300)); // DW_OP_constu 300
        assert_eq!(eval(&[0x11, 0x7f, 0x9f], cfa), Constant(u64::MAX)); // DW_OP_consts -1
        assert_eq!(eval(&[0x08, 0x30, 0x9f], cfa), Constant(0x30)); // DW_OP_const1u 0x30
        assert_eq!(eval(&[0xa3, 0x01, 0x55, 0x9f], cfa), EntryValue(reg(5))); // DW_OP_entry_value(reg5)
        assert_eq!(eval(&[0xf3, 0x01, 0x54, 0x9f], cfa), EntryValue(reg(4))); // DW_OP_GNU_entry_value(reg4)
        assert_eq!(eval(&[0x61], cfa), Unknown); // DW_OP_reg17: xmm0, not in pt_regs
        assert_eq!(eval(&[0x33], cfa), Unknown); // a constant without stack_value is an address
        assert_eq!(eval(&[0x50, 0x93, 0x08], cfa), Unknown); // DW_OP_reg0, DW_OP_piece 8
        assert_eq!(eval(&[0x03, 1, 2, 3, 4, 5, 6, 7, 8], cfa), Unknown); // DW_OP_addr
        assert_eq!(eval(&[0x77], cfa), Unknown); // truncated
        assert_eq!(eval(&[], cfa), Unknown);
    }

    /// A corrupt frame offset that overflows is no location, not a panic.
    #[test]
    fn an_overflowing_frame_offset_is_unknown() {
        let frame = FrameBase::Register(reg(6), i64::MAX);
        assert_eq!(eval(&[0x91, 0x01], frame), Location::Unknown); // DW_OP_fbreg 1
        assert_eq!(eval(&[0x91, 0x7f], frame), Location::Memory { base: reg(6), offset: i64::MAX - 1 });
    }

    #[test]
    fn registers_have_their_pt_regs_names() {
        let names: Vec<&str> = (0..16).map(|n| reg(n).pt_regs()).collect();
        assert_eq!(&names[..8], ["ax", "dx", "cx", "bx", "si", "di", "bp", "sp"]);
        assert_eq!(names[15], "r15");
        assert_eq!(Register::from_dwarf(16), None); // the return address column
    }
}
