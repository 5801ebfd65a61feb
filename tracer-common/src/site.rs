//! Where the requested size is at a site the compiler inlined, encoded in
//! the attach cookie of `count_site`: an inlined copy has no arguments in
//! the ABI's registers, so its DWARF says, per copy, which register holds
//! the size, or which constant it is.
//!
//! Cookie bits: 0–31 the counter slot; 32–39 the first operand; 40–47 the
//! second (a multiplier: calloc's elsize), [`NONE`] for none; 48–63 a
//! constant, for an operand that is [`CONSTANT`]. A register operand is its
//! DWARF x86-64 register number plus one (1 = rax … 16 = r15).

/// No operand.
pub const NONE: u8 = 0;
/// The operand is the cookie's constant.
pub const CONSTANT: u8 = 0xff;

/// The cookie for `slot` with operands `first` and `second` and
/// `constant`.
#[must_use]
pub const fn encode(slot: u32, first: u8, second: u8, constant: u16) -> u64 {
    slot as u64 | (first as u64) << 32 | (second as u64) << 40 | (constant as u64) << 48
}

/// The counter slot of `cookie`.
#[must_use]
#[allow(clippy::cast_possible_truncation, reason = "the low 32 bits are the slot")]
pub const fn slot(cookie: u64) -> u32 {
    cookie as u32
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
    fn round_trips() {
        let c = encode(7, register(5).unwrap_or(NONE), CONSTANT, 111);
        assert_eq!((slot(c), first(c), second(c), constant(c)), (7, 6, CONSTANT, 111));
        assert_eq!(register(16), None);
    }
}
