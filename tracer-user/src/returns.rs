//! Where to read an allocator's return value (`--returns`).
//!
//! Two ways, both reading rax:
//! - **`ret` probes:** a uprobe on every `ret` instruction of the function,
//!   found by decoding the whole symbol. Exact only when every path out of
//!   the function goes through one of them.
//! - **a uretprobe:** a breakpoint at the entry that replaces the return
//!   address, so the kernel sees the return however the function leaves
//!   (since Linux 6.11 x86 returns through a syscall rather than a trap).
//!
//! A function that can leave through a tail call (a jump out of the symbol,
//! or an indirect jump that may be one) returns from somewhere tracer cannot
//! see, so it gets the uretprobe. So does a function that cannot be decoded
//! or has no `ret`. Which of the two costs less per hit is measured in
//! BENCHMARKS.md; the kernel emulates neither a `ret` nor (in general) the
//! first instruction, so both pay a trap per call.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Formatter as _, GasFormatter, Instruction, Mnemonic};

/// How a function's return value is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReturnPlan {
    /// uprobes at these offsets from the entry, each a `ret`.
    RetSites { offsets: Vec<u64> },
    /// A uretprobe, and why not `ret` probes.
    Uretprobe { reason: String },
}

impl ReturnPlan {
    /// The JSON `how` value.
    #[must_use]
    pub const fn how(&self) -> &'static str {
        match self {
            Self::RetSites { .. } => "ret",
            Self::Uretprobe { .. } => "uretprobe",
        }
    }
}

/// Plans the return probes of the function whose whole code is `code`,
/// linked at `address`.
#[must_use]
pub fn plan(code: &[u8], address: u64) -> ReturnPlan {
    let uret = |reason: String| ReturnPlan::Uretprobe { reason };
    if code.is_empty() {
        return uret("the symbol has no size, so its end is unknown".to_owned());
    }
    let end = address + code.len() as u64;
    let inside = |target: u64| (address..end).contains(&target);
    let mut offsets = Vec::new();
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut insn = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut insn);
        let offset = insn.ip() - address;
        if insn.is_invalid() {
            return uret(format!("undecodable code at +{offset}"));
        }
        let show = || {
            let mut text = String::new();
            GasFormatter::new().format(&insn, &mut text);
            text
        };
        match insn.flow_control() {
            FlowControl::Return if insn.mnemonic() == Mnemonic::Ret => offsets.push(offset),
            FlowControl::Return => return uret(format!("an unusual return at +{offset} ({})", show())),
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch if !inside(insn.near_branch_target()) => {
                return uret(format!(
                    "it jumps out of the function at +{offset} ({}): a tail call, or a split-off .cold part",
                    show()
                ));
            }
            FlowControl::IndirectBranch => {
                return uret(format!("an indirect jump at +{offset} ({}) may be a tail call", show()));
            }
            _ => {}
        }
    }
    if offsets.is_empty() {
        return uret("no ret instruction".to_owned());
    }
    ReturnPlan::RetSites { offsets }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ret_of_a_self_contained_function() {
        // test %rdi,%rdi; je +8; mov %rdi,%rax; ret; xor %eax,%eax; ret
        let code = [0x48, 0x85, 0xff, 0x74, 0x04, 0x48, 0x89, 0xf8, 0xc3, 0x31, 0xc0, 0xc3];
        assert_eq!(plan(&code, 0x1000), ReturnPlan::RetSites { offsets: vec![8, 11] });
    }

    #[test]
    fn tail_calls_need_a_uretprobe() {
        // pyenv's PyObject_Malloc: mov %rdi,%rsi; mov ctx(%rip),%rdi;
        // jmp *fn(%rip)
        let code = [0x48, 0x89, 0xfe, 0x48, 0x8b, 0x3d, 0, 0, 0, 0, 0xff, 0x25, 0, 0, 0, 0];
        let ReturnPlan::Uretprobe { reason } = plan(&code, 0x2000) else { panic!("a tail call") };
        assert!(reason.contains("indirect jump at +10"), "{reason}");
        // Debian's PyMem_RawMalloc ends in jmp malloc@plt: a direct jump out.
        let code = [0x48, 0x85, 0xff, 0xe9, 0x00, 0x10, 0x00, 0x00];
        let ReturnPlan::Uretprobe { reason } = plan(&code, 0x3000) else { panic!("a tail call") };
        assert!(reason.contains("jumps out of the function at +3"), "{reason}");
        // A conditional jump out (to a .cold part) as well.
        let code = [0x0f, 0x88, 0x00, 0x10, 0x00, 0x00, 0xc3];
        assert!(matches!(plan(&code, 0x3000), ReturnPlan::Uretprobe { .. }));
    }

    #[test]
    fn unknown_shapes_need_a_uretprobe() {
        assert!(matches!(plan(&[], 0), ReturnPlan::Uretprobe { .. }));
        // No ret at all (ends in ud2).
        assert!(matches!(plan(&[0x0f, 0x0b], 0), ReturnPlan::Uretprobe { .. }));
        // A jump inside the function is fine.
        assert_eq!(plan(&[0xeb, 0x00, 0xc3], 0), ReturnPlan::RetSites { offsets: vec![2] });
    }
}
