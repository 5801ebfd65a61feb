//! Where in a function to put its uprobe.
//!
//! A uprobe hit on an instruction the kernel must single-step out of line
//! costs several times one on an instruction it emulates. x86-64 functions
//! usually start with an instruction that is single-stepped (a rip-relative
//! `mov`, `endbr64`, `sub $n,%rsp`), but often reach an emulated one (a
//! register `push`) within a few bytes. Probing there counts exactly the
//! same calls, as long as every call reaches that instruction exactly once
//! and has not yet changed what the program reads.
//!
//! What the kernel emulates, from arch/x86/kernel/uprobes.c
//! (`branch_setup_xol_ops`, `push_setup_xol_ops`), by kernel version:
//! - `push %reg` (opcodes 50–57, alone or with REX prefix 41 only): long
//!   before 6.0;
//! - `jmp`, `call`, `jcc` (eb, e9, e8, 70–7f, 0f 80–8f), never with a 66
//!   prefix: since 2014;
//! - opcode 90 (`nop`) whatever its prefixes: since 6.2; tracer uses it
//!   only without REX.B, where 41 90 is really `xchg %r8,%rax`;
//! - the multi-byte nops of `x86_nops[]`: since 6.16.
//!
//! Instructions before the chosen one must not branch, must not write the
//! argument registers the probe's program reads, and must not move the
//! stack pointer; and no branch inside the function may land between the
//! entry and the chosen instruction (that path would be counted once more
//! or once less than calls). Otherwise the probe stays at the entry, and
//! the reason is reported.
//!
//! The stack pointer rule is for what reads the stack at the probe: the
//! live table's frames (paired by the entry's stack pointer) and a
//! uretprobe sharing the breakpoint (which takes the return address from
//! the stack pointer). A probe whose programs read only registers and the
//! target's memory through them is indifferent to it: [`place_off_stack`]
//! places those past stack-pointer moves (the native unwinder looks up
//! each pc's own CFA rule, so `--native-stacks` is such too). On Debian's
//! LTO 3.11 `PyObject_Malloc` and `PyMem_Malloc` start `sub $0x18,%rsp;
//! test %rdi,%rdi; js`: the `js` is emulated. `--growth`'s programs are
//! such as well, and `plan::growth` places them past stack-pointer moves
//! with the same other rules (no branch before, none into, the registers
//! read intact), using [`instructions`], [`written`], [`branch_into`] and
//! [`emulated`].

use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Formatter as _, GasFormatter, Instruction, InstructionInfoFactory, OpAccess,
    Register,
};

use crate::probe::Program;

/// How far into a function tracer looks for an emulated instruction.
const MAX_PROLOGUE: u64 = 32;

/// A kernel version as (major, minor).
pub type KernelVersion = (u32, u32);

/// The first kernel with uprobe-multi links (`BPF_TRACE_UPROBE_MULTI`,
/// Linux 6.6), which `auto` placement needs for call sites.
pub const MULTI_LINKS: KernelVersion = (6, 6);

/// The running kernel's version from uname's release ("6.18.44-...").
#[must_use]
pub fn running_kernel() -> KernelVersion {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    parse_release(&release)
}

fn parse_release(release: &str) -> KernelVersion {
    let mut parts = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// Where the probe goes and why.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Placement {
    /// Bytes from the function's entry.
    pub offset: u64,
    /// The probed instruction, AT&T syntax.
    pub instruction: String,
    /// Whether the kernel emulates it (false: single-stepped).
    pub emulated: bool,
    /// Why this instruction.
    pub reason: String,
    /// The function the probe is in, where it is not the probed one (a
    /// free probed at its allocator's implementation: see
    /// [`super::slots`]); `offset` is then from its entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
}

/// The argument registers `program` reads.
fn reads(program: Program) -> &'static [Register] {
    match program {
        Program::SizeArg0
        | Program::CountObject
        | Program::FreeObject
        | Program::NativeSizeArg0
        | Program::MetaInsert
        | Program::MetaLookup
        | Program::MetaPool
        | Program::MetaChunk
        // At a free's API call: the block.
        | Program::LiveFree => &[Register::RDI],
        Program::SizeArg1 | Program::NativeSizeArg1 | Program::NativeReleaseArg1 => &[Register::RSI],
        Program::NativeSizeArg2 => &[Register::RDX],
        Program::Calloc | Program::NativeCalloc => &[Register::RDI, Register::RSI],
        // An implementation's arguments follow the allocator's context:
        // the size (or the block) and a calloc's or realloc's second one.
        Program::LiveImpl => &[Register::RSI, Register::RDX],
        Program::CountCall
        | Program::CountClaimed
        | Program::Empty
        | Program::RetValue
        | Program::RetValueUret
        // At an API call it reads what the call's counting program
        // reads (see plan::place_with_live).
        | Program::LiveAlloc
        | Program::LiveRet
        | Program::LiveRetUret
        | Program::CountSite
        | Program::NativeCall
        | Program::NativeNested => &[],
    }
}

/// Chooses the probe point for a function whose code starts with `code`
/// (the whole function if `code.len()` is its size) at virtual address
/// `address`, before the stack pointer moves.
#[must_use]
pub fn place(code: &[u8], address: u64, program: Program, kernel: KernelVersion) -> Placement {
    place_with(code, address, program, kernel, true)
}

/// As [`place`], for a probe where nothing reads the stack (no `--live`,
/// no `--returns`): past moves of the stack pointer too.
#[must_use]
pub fn place_off_stack(code: &[u8], address: u64, program: Program, kernel: KernelVersion) -> Placement {
    place_with(code, address, program, kernel, false)
}

fn place_with(code: &[u8], address: u64, program: Program, kernel: KernelVersion, stack_read: bool) -> Placement {
    let mut info = InstructionInfoFactory::new();
    let mut skipped: Vec<String> = Vec::new();
    let mut entry_text = None;
    let mut candidate: Option<Placement> = None;
    let mut moved_stack = false;
    for Step { offset, bytes, instr, shown } in instructions(code, address) {
        if offset == 0 {
            entry_text = Some(shown.clone());
        }
        if let Some(kind) = emulated(bytes, kernel) {
            let reason = if offset == 0 {
                format!("entry instruction is emulated ({kind})")
            } else if moved_stack {
                format!(
                    "first emulated instruction ({kind}); before it: {} (nothing reads the stack here, so moving the stack pointer does not matter)",
                    skipped.join("; ")
                )
            } else {
                format!("first emulated instruction ({kind}); before it: {}", skipped.join("; "))
            };
            candidate = Some(Placement { offset, instruction: shown, emulated: true, reason, function: None });
            break;
        }
        if offset >= MAX_PROLOGUE {
            return entry(entry_text, &format!("no emulated instruction in the first {MAX_PROLOGUE} bytes"));
        }
        if instr.flow_control() != FlowControl::Next {
            return entry(entry_text, &format!("`{shown}` at +{offset} changes control flow first"));
        }
        for full in written(&mut info, &instr) {
            if full == Register::RSP {
                if stack_read {
                    return entry(entry_text, &format!("`{shown}` at +{offset} moves the stack pointer first"));
                }
                moved_stack = true;
            }
            if reads(program).contains(&full) {
                return entry(
                    entry_text,
                    &format!("`{shown}` at +{offset} overwrites {full:?}, which the probe reads"),
                );
            }
        }
        skipped.push(shown);
    }
    let Some(found) = candidate else {
        return entry(entry_text, "the code could not be decoded");
    };
    if let Some(why) = branch_into(code, address, found.offset) {
        return entry(entry_text, &why);
    }
    found
}

/// One instruction of a function, as the prologue walks of [`place`] and
/// `plan::growth` see it.
pub struct Step<'c> {
    /// Bytes from the function's entry.
    pub offset: u64,
    pub bytes: &'c [u8],
    pub instr: Instruction,
    /// AT&T syntax, as [`formatter`] shows it.
    pub shown: String,
}

/// The instructions of the function whose code is `code` (at `address`),
/// from its entry up to the first that does not decode.
pub fn instructions(code: &[u8], address: u64) -> impl Iterator<Item = Step<'_>> {
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut formatter = formatter();
    std::iter::from_fn(move || {
        if !decoder.can_decode() {
            return None;
        }
        let at = decoder.ip();
        let instr = decoder.decode();
        if instr.is_invalid() {
            return None;
        }
        let offset = at - address;
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let bytes = code.get(start..start + instr.len()).unwrap_or(&[]);
        let mut shown = String::new();
        formatter.format(&instr, &mut shown);
        Some(Step { offset, bytes, instr, shown })
    })
}

/// The registers `instr` writes (or may write), whole, in the order its
/// operands name them.
pub fn written(info: &mut InstructionInfoFactory, instr: &Instruction) -> Vec<Register> {
    info.info(instr)
        .used_registers()
        .iter()
        .filter(|r| {
            matches!(r.access(), OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite)
        })
        .map(|r| r.register().full_register())
        .collect()
}

/// The plan's formatter: AT&T syntax, with rip-relative operands shown as
/// objdump does, as the bytes say.
#[must_use]
pub fn formatter() -> GasFormatter {
    let mut formatter = GasFormatter::new();
    formatter.options_mut().set_rip_relative_addresses(true);
    formatter
}

/// Why a probe `offset` bytes into the function whose code is `code` (at
/// `address`) would not count each call once: a branch of the function
/// that lands in (entry, entry + offset]. `None` where none does.
#[must_use]
pub fn branch_into(code: &[u8], address: u64, offset: u64) -> Option<String> {
    if offset == 0 {
        return None;
    }
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut instr);
        if instr.is_invalid() {
            break;
        }
        if matches!(
            instr.flow_control(),
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch | FlowControl::Call
        ) {
            let target = instr.near_branch_target();
            if target > address && target <= address + offset {
                return Some(format!(
                    "a branch at {:#x} lands at +{} inside the prologue",
                    instr.ip(),
                    target - address
                ));
            }
        }
    }
    None
}

fn entry(instruction: Option<String>, why: &str) -> Placement {
    Placement {
        instruction: instruction.unwrap_or_default(),
        ..Placement::at_entry(format!("entry (single-stepped): {why}"))
    }
}

/// The function's first instruction (`--placement entry`), decoded so that
/// the plan says whether the kernel emulates it.
#[must_use]
pub fn at_entry_of(code: &[u8], address: u64, kernel: KernelVersion, reason: &str) -> Placement {
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let instr = decoder.decode();
    if instr.is_invalid() {
        return Placement::at_entry(reason.to_owned());
    }
    let mut instruction = String::new();
    formatter().format(&instr, &mut instruction);
    let emulated = code.get(..instr.len()).is_some_and(|b| emulated(b, kernel).is_some());
    Placement { offset: 0, instruction, emulated, reason: reason.to_owned(), function: None }
}

impl Placement {
    /// The function's first instruction, not decoded.
    #[must_use]
    pub const fn at_entry(reason: String) -> Self {
        Self { offset: 0, instruction: String::new(), emulated: false, reason, function: None }
    }
}

/// The multi-byte nops of the kernel's `x86_nops[]` (arch/x86/kernel/alternative.c).
const X86_NOPS: [&[u8]; 8] = [
    &[0x90],
    &[0x66, 0x90],
    &[0x0f, 0x1f, 0x00],
    &[0x0f, 0x1f, 0x40, 0x00],
    &[0x0f, 0x1f, 0x44, 0x00, 0x00],
    &[0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00],
    &[0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00],
    &[0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00],
];

/// Whether the kernel can put a uprobe on the instruction `code` starts
/// with (arch/x86/kernel/uprobes.c refuses segment overrides and lock
/// prefixes, and a breakpoint is already one).
pub fn probeable(code: &[u8]) -> Result<(), String> {
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let insn = decoder.decode();
    if insn.is_invalid() {
        return Err("not an instruction tracer can decode".to_owned());
    }
    if code.first() == Some(&0xcc) {
        return Err("an int3 is there already".to_owned());
    }
    let prefixes = code
        .iter()
        .take(insn.len())
        .take_while(|b| matches!(b, 0x26 | 0x2e | 0x36 | 0x3e | 0x64 | 0x65 | 0x66 | 0x67 | 0xf0 | 0xf2 | 0xf3));
    if let Some(b) = prefixes.into_iter().find(|b| matches!(b, 0x26 | 0x2e | 0x36 | 0x3e | 0xf0)) {
        let mut text = String::new();
        GasFormatter::new().format(&insn, &mut text);
        return Err(format!("the kernel refuses to probe {text} (prefix {b:#04x})"));
    }
    Ok(())
}

/// Whether the kernel emulates the instruction `bytes`, and as what.
#[must_use]
pub fn emulated(bytes: &[u8], kernel: KernelVersion) -> Option<&'static str> {
    if kernel >= (6, 16) && X86_NOPS.contains(&bytes) {
        return Some("nop");
    }
    let mut i = 0;
    let mut op66 = false;
    while let Some(&b) = bytes.get(i) {
        match b {
            // Segment overrides and lock: the kernel refuses to probe these.
            0x26 | 0x2e | 0x36 | 0x3e | 0xf0 => return None,
            0x66 => op66 = true,
            0x67 | 0xf2 | 0xf3 | 0x64 | 0x65 => {}
            _ => break,
        }
        i += 1;
    }
    let rex = bytes.get(i).copied().filter(|b| (0x40..=0x4f).contains(b));
    if rex.is_some() {
        i += 1;
    }
    let opcode = *bytes.get(i)?;
    match opcode {
        0x90 if kernel >= (6, 2) && rex.is_none_or(|r| r & 1 == 0) => Some("nop"),
        0x50..=0x57 if bytes.len() == 1 || (bytes.len() == 2 && rex == Some(0x41)) => Some("push"),
        0xeb | 0xe9 | 0x70..=0x7f if !op66 => Some("jump"),
        0xe8 if !op66 => Some("call"),
        0x0f if !op66 && bytes.get(i + 1).is_some_and(|b| (0x80..=0x8f).contains(b)) => Some("jump"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K618: KernelVersion = (6, 18);

    #[test]
    fn parses_kernel_release() {
        assert_eq!(parse_release("6.18.44-fc-v669\n"), (6, 18));
        assert_eq!(parse_release("5.15.0"), (5, 15));
        assert_eq!(parse_release("garbage"), (0, 0));
    }

    #[test]
    fn emulated_instructions() {
        assert_eq!(emulated(&[0x53], K618), Some("push")); // push %rbx
        assert_eq!(emulated(&[0x41, 0x54], K618), Some("push")); // push %r12
        assert_eq!(emulated(&[0x48, 0x53], K618), None); // rex.W push: single-stepped
        assert_eq!(emulated(&[0x90], K618), Some("nop"));
        assert_eq!(emulated(&[0x41, 0x90], K618), None); // xchg %r8,%rax
        assert_eq!(emulated(&[0x0f, 0x1f, 0x44, 0x00, 0x00], K618), Some("nop"));
        assert_eq!(emulated(&[0x0f, 0x1f, 0x44, 0x00, 0x00], (6, 12)), None);
        assert_eq!(emulated(&[0xe9, 0, 0, 0, 0], K618), Some("jump"));
        assert_eq!(emulated(&[0x0f, 0x84, 0, 0, 0, 0], K618), Some("jump"));
        assert_eq!(emulated(&[0x66, 0xe9, 0, 0], K618), None);
        assert_eq!(emulated(&[0xe8, 0, 0, 0, 0], K618), Some("call"));
        assert_eq!(emulated(&[0xf3, 0x0f, 0x1e, 0xfa], K618), None); // endbr64
        assert_eq!(emulated(&[0x48, 0x8b, 0x05, 0, 0, 0, 0], K618), None); // rip-relative mov
        assert_eq!(emulated(&[0xf0, 0x90], K618), None);
    }

    // _Py_NewReference in pyenv's libpython3.11: a rip-relative mov, then
    // push %rbx at +7.
    const NEW_REFERENCE: &[u8] = &[
        0x48, 0x8b, 0x05, 0x10, 0x20, 0x30, 0x00, // mov 0x302010(%rip),%rax
        0x53, // push %rbx
        0x48, 0x89, 0xfb, // mov %rdi,%rbx
        0xc3, // ret
    ];

    #[test]
    fn an_entry_placement_says_whether_the_entry_is_emulated() {
        let p = at_entry_of(NEW_REFERENCE, 0x1000, K618, "entry");
        assert_eq!((p.offset, p.instruction.as_str(), p.emulated), (0, "mov 0x302010(%rip),%rax", false));
        let p = at_entry_of(&NEW_REFERENCE[7..], 0x1007, K618, "entry");
        assert_eq!((p.instruction.as_str(), p.emulated), ("push %rbx", true));
    }

    #[test]
    fn skips_to_the_first_push() {
        let p = place(NEW_REFERENCE, 0x1000, Program::CountCall, K618);
        assert_eq!(p.offset, 7, "{p:?}");
        assert_eq!(p.instruction, "push %rbx");
        assert!(p.emulated);
        assert!(p.reason.contains("mov 0x302010(%rip),%rax"), "{}", p.reason);
    }

    #[test]
    fn stays_at_entry_when_an_argument_is_overwritten() {
        // mov %rax,%rdi; push %rbx — SizeArg0 reads rdi.
        let code = [0x48, 0x89, 0xc7, 0x53, 0xc3];
        let p = place(&code, 0, Program::SizeArg0, K618);
        assert_eq!(p.offset, 0);
        assert!(!p.emulated);
        assert!(p.reason.contains("overwrites RDI"), "{}", p.reason);
        // CountCall reads nothing: the push is fine.
        assert_eq!(place(&code, 0, Program::CountCall, K618).offset, 3);
    }

    #[test]
    fn stays_at_entry_when_the_stack_moves_or_control_flows() {
        // sub $0x8,%rsp; push %rbx
        let code = [0x48, 0x83, 0xec, 0x08, 0x53];
        assert!(place(&code, 0, Program::CountCall, K618).reason.contains("moves the stack pointer"));
        // ret first
        let code = [0xc3, 0x53];
        assert!(place(&code, 0, Program::CountCall, K618).reason.contains("changes control flow"));
    }

    /// Debian's LTO 3.11 `PyObject_Malloc` (its first bytes): off the
    /// stack, the `js` after `sub $0x18,%rsp` and the size's test; where
    /// the stack is read (`--live`, `--returns`), the entry.
    #[test]
    fn off_the_stack_a_probe_goes_past_stack_pointer_moves() {
        let code = [
            0x48, 0x83, 0xec, 0x18, // sub $0x18,%rsp
            0x48, 0x85, 0xff, // test %rdi,%rdi
            0x0f, 0x88, 0xff, 0x43, 0xf5, 0xff, // js -0xabc01
            0x48, 0x89, 0xfe, // mov %rdi,%rsi
            0xc3, // ret
        ];
        let p = place_off_stack(&code, 0x4d_0ad0, Program::SizeArg0, K618);
        assert_eq!((p.offset, p.emulated), (7, true), "{p:?}");
        assert!(p.instruction.starts_with("js "), "{p:?}");
        assert!(p.reason.contains("sub $0x18,%rsp; test %rdi,%rdi"), "{}", p.reason);
        assert!(p.reason.contains("nothing reads the stack here"), "{}", p.reason);
        let p = place(&code, 0x4d_0ad0, Program::SizeArg0, K618);
        assert_eq!((p.offset, p.emulated), (0, false), "{p:?}");
        assert!(p.reason.contains("moves the stack pointer"), "{}", p.reason);
        // The argument's register still rules: `mov %rax,%rdi` first.
        let code = [0x48, 0x83, 0xec, 0x18, 0x48, 0x89, 0xc7, 0x53];
        let p = place_off_stack(&code, 0, Program::SizeArg0, K618);
        assert_eq!(p.offset, 0, "{p:?}");
        assert!(p.reason.contains("overwrites RDI"), "{}", p.reason);
    }

    #[test]
    fn stays_at_entry_when_a_branch_lands_in_the_prologue() {
        // 0: mov (%rip),%rax (7)  7: push %rbx  8: jmp -> 7
        let code = [0x48, 0x8b, 0x05, 0, 0, 0, 0, 0x53, 0xeb, 0xfd];
        let p = place(&code, 0x100, Program::CountCall, K618);
        assert_eq!(p.offset, 0, "{p:?}");
        assert!(p.reason.contains("lands at +7"), "{}", p.reason);
    }

    #[test]
    fn entry_that_is_emulated_is_kept() {
        let p = place(&[0x55, 0x48, 0x89, 0xe5], 0, Program::SizeArg0, K618);
        assert_eq!((p.offset, p.emulated), (0, true));
        assert_eq!(p.instruction, "push %rbp");
    }
}
