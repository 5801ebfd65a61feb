//! Where the requested size is at a site the compiler inlined, encoded in
//! the attach cookie of `count_site`: an inlined copy has no arguments in
//! the ABI's registers, so its DWARF says, per copy, which register holds
//! the size, or which constant it is.
//!
//! Cookie bits: 0–23 the counter slot; 24–27 and 31 its gate (see
//! [`gated`]); 28 whether the site is single-stepped (see [`stepped`]); 32–39
//! the first operand; 40–47 the second (a multiplier: calloc's elsize),
//! [`NONE`] for none; 48–63 a constant, for an operand that is [`CONSTANT`].
//! A register operand is its DWARF x86-64 register number plus one (1 = rax
//! … 16 = r15).
//!
//! `count_object` reads the same encoding, where the first operand is the
//! new object rather than a size.

/// No operand.
pub const NONE: u8 = 0;
/// `count_call`'s first operand at an inlined copy (it reads no operand):
/// tells the copy from the function's own entry, whose calls `--live`
/// sees the pointers of. `free_object` has it as its second operand at a
/// copy (its first is the pointer freed).
pub const INLINED: u8 = 1;
/// The operand is the cookie's constant.
pub const CONSTANT: u8 = 0xff;
/// A first operand of `MEMORY` plus a register operand (`MEMORY_FIRST` …
/// `MEMORY_LAST`) is the 8 bytes in memory at that register plus the
/// cookie's constant read as a signed 16-bit offset: a stack slot, where
/// the DWARF puts a size relative to the frame base or the CFA.
pub const MEMORY: u8 = 0x20;
pub const MEMORY_FIRST: u8 = MEMORY + 1;
pub const MEMORY_LAST: u8 = MEMORY + 16;

/// Whether operand `kind` takes the cookie's constant (as its value, or
/// as its offset).
#[must_use]
pub const fn uses_constant(kind: u8) -> bool {
    kind == CONSTANT || (kind >= MEMORY_FIRST && kind <= MEMORY_LAST)
}

/// The cookie for `slot` with operands `first` and `second` and
/// `constant`.
#[must_use]
pub const fn encode(slot: u32, first: u8, second: u8, constant: u16) -> u64 {
    slot as u64 | (first as u64) << 32 | (second as u64) << 40 | (constant as u64) << 48
}

/// The bits of a cookie's low word that are the slot; the rest is its
/// gate.
const SLOT_BITS: u32 = 0x00ff_ffff;

/// A gate's mark in the cookie's low word.
const GATED: u32 = 1 << 31;

/// `slot` for a copy probed at the conditional jump that leads into it
/// (where no instruction of the copy's own is one the kernel emulates):
/// the program counts the hit only where x86 condition `condition` (a
/// `jcc` opcode's low nibble: 4 is `e`, 5 `ne`…) holds in the flags, which
/// is when the jump goes on into the copy.
#[must_use]
pub const fn gated(slot: u32, condition: u8) -> u32 {
    (slot & SLOT_BITS) | GATED | ((condition as u32 & 15) << 24)
}

/// A site's mark that the kernel single-steps its instruction, in the
/// cookie's low word: its hits are counted again apart (under the slot
/// with [`crate::counter::STEPPED_SLOT`]), so that a probe with sites of
/// both kinds is priced by what each hit cost.
const STEPPED: u32 = 1 << 28;

/// `cookie` marked as a single-stepped site's.
#[must_use]
pub const fn mark_stepped(cookie: u64) -> u64 {
    cookie | STEPPED as u64
}

/// Whether `cookie` is a single-stepped site's (see [`mark_stepped`]).
#[must_use]
pub const fn stepped(cookie: u64) -> bool {
    cookie & STEPPED as u64 != 0
}

/// The counter slot of `cookie`.
#[must_use]
#[allow(clippy::cast_possible_truncation, reason = "the low 32 bits are the slot and its gate")]
pub const fn slot(cookie: u64) -> u32 {
    cookie as u32 & SLOT_BITS
}

/// The condition `cookie`'s hit counts under (see [`gated`]), if it is a
/// gate's.
#[must_use]
#[allow(clippy::cast_possible_truncation, reason = "four bits of the cookie")]
pub const fn gate(cookie: u64) -> Option<u8> {
    if cookie as u32 & GATED == 0 { None } else { Some((cookie >> 24) as u8 & 15) }
}

/// Whether x86 condition `condition` holds in `flags` (RFLAGS), as a `jcc`
/// with that condition decides whether it jumps. Conditions come in pairs
/// whose low bit negates the pair's test.
#[must_use]
pub const fn holds(condition: u8, flags: u64) -> bool {
    let (cf, pf, zf) = (flags & 1 != 0, flags >> 2 & 1 != 0, flags >> 6 & 1 != 0);
    let (sf, of) = (flags >> 7 & 1 != 0, flags >> 11 & 1 != 0);
    let test = match condition >> 1 & 7 {
        0 => of,
        1 => cf,
        2 => zf,
        3 => cf || zf,
        4 => sf,
        5 => pf,
        6 => sf != of,
        _ => zf || sf != of,
    };
    test != (condition & 1 != 0)
}

/// The first operand of `cookie`.
#[must_use]
#[allow(clippy::cast_possible_truncation, reason = "one byte of the cookie")]
pub const fn first(cookie: u64) -> u8 {
    (cookie >> 32) as u8
}

/// The second operand of `cookie`.
#[must_use]
#[allow(clippy::cast_possible_truncation, reason = "one byte of the cookie")]
pub const fn second(cookie: u64) -> u8 {
    (cookie >> 40) as u8
}

/// The constant of `cookie`.
#[must_use]
pub const fn constant(cookie: u64) -> u64 {
    cookie >> 48
}

/// The constant of `cookie` as the signed offset of a memory operand.
#[must_use]
#[allow(clippy::cast_possible_truncation, reason = "the constant is 16 bits")]
pub const fn offset(constant: u64) -> i64 {
    (constant as u16).cast_signed() as i64
}

/// The memory operand at DWARF x86-64 register `number` plus `offset`, as
/// (first operand, constant); `None` where either does not fit.
#[must_use]
pub const fn memory(number: u16, offset: i64) -> Option<(u8, u16)> {
    match register(number) {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "checked to fit 16 bits")]
        Some(r) if offset >= i16::MIN as i64 && offset <= i16::MAX as i64 => Some((MEMORY + r, offset as i16 as u16)),
        _ => None,
    }
}

/// The operand for DWARF x86-64 register `number` (0 = rax … 15 = r15).
#[must_use]
#[allow(clippy::cast_possible_truncation, reason = "checked to be at most 15")]
pub const fn register(number: u16) -> Option<u8> {
    if number <= 15 { Some(number as u8 + 1) } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stepped_mark_leaves_the_slot_gate_and_operands() {
        let c = encode(gated(7, 5), register(5).unwrap_or(NONE), CONSTANT, 111);
        let m = mark_stepped(c);
        assert!(stepped(m) && !stepped(c));
        assert_eq!((slot(m), gate(m), first(m), second(m), constant(m)), (7, Some(5), 6, CONSTANT, 111));
        assert_eq!(slot(mark_stepped(3)), 3);
    }

    #[test]
    fn round_trips() {
        let c = encode(7, register(5).unwrap_or(NONE), CONSTANT, 111);
        assert_eq!((slot(c), first(c), second(c), constant(c)), (7, 6, CONSTANT, 111));
        assert_eq!(register(16), None);
        let (first, constant) = memory(7, -24).unwrap_or_default();
        let c = encode(3, first, NONE, constant);
        assert_eq!((first, offset(super::constant(c))), (MEMORY + 8, -24));
        assert_eq!(memory(7, 40_000), None);
    }

    #[test]
    fn gates_keep_the_slot_and_their_condition() {
        let c = encode(gated(5, 0xe), INLINED, NONE, 0);
        assert_eq!((slot(c), gate(c), first(c)), (5, Some(0xe), INLINED));
        assert_eq!(gate(encode(5, INLINED, NONE, 0)), None);
    }

    #[test]
    fn conditions_read_the_flags_as_jcc_does() {
        const CF: u64 = 1;
        const ZF: u64 = 1 << 6;
        const SF: u64 = 1 << 7;
        const OF: u64 = 1 << 11;
        // je/jne
        assert!(holds(4, ZF) && !holds(4, 0) && holds(5, 0) && !holds(5, ZF));
        // jb/jae, jbe/ja
        assert!(holds(2, CF) && holds(3, 0) && holds(6, ZF) && holds(6, CF) && holds(7, 0) && !holds(7, CF));
        // js, jl (SF != OF), jge, jle, jg
        assert!(holds(8, SF) && holds(12, SF) && holds(12, OF) && !holds(12, SF | OF) && holds(13, SF | OF));
        assert!(holds(14, ZF) && holds(14, SF) && !holds(14, 0) && holds(15, 0) && !holds(15, ZF));
        // jo, jp
        assert!(holds(0, OF) && holds(10, 1 << 2) && holds(11, 0));
    }
}
