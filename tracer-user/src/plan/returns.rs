//! Where to read an allocator's return value (`--returns`).
//!
//! Three ways, all reading rax, compared per function with costs measured
//! on this machine at start (by tracer's calibration, `prepare::calibrate`):
//! - **`ret` probes:** a uprobe on every `ret` of the function, found by
//!   decoding the whole symbol. The kernel single-steps a `ret`.
//! - **placed probes:** where a `ret` can only be reached by direct `jmp`s
//!   to an epilogue that leaves rax alone (`pop`s), a probe on each such
//!   `jmp` reads the same value, and the kernel emulates a `jmp`.
//! - **a uretprobe:** a breakpoint at the entry that swaps the return
//!   address, so the kernel sees the return however the function leaves.
//!   It costs the entry breakpoint (nothing extra when the counting probe is
//!   at the entry too, as both share one breakpoint) plus the return, which
//!   Linux 6.11+ takes through a syscall instead of a trap.
//!
//! Each call passes exactly one return site, so sites cost at most their
//! dearest site per call. A function that can leave through a tail call (a
//! jump out of the symbol, or an indirect jump that may be one) returns
//! where no site can see it, so it always gets the uretprobe; so does one
//! that cannot be decoded or has no `ret`.

use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Formatter as _, GasFormatter, Instruction, InstructionInfoFactory, Mnemonic,
    OpAccess, Register,
};

use super::{
    HitCosts,
    placement::{self, KernelVersion},
};

/// What each way of reading a return costs here, per call.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReturnCosts {
    /// A probe on a single-stepped or an emulated instruction.
    pub hit: HitCosts,
    /// A uretprobe's return, on top of its entry breakpoint.
    pub uretprobe_return_ns: f64,
}

/// What a return probe costs here, per call, measured by
/// tracer's calibration (`prepare::calibrate`) on a function of its own.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReturnMeasurement {
    /// A uretprobe, all told (its entry is an emulated `push`).
    #[serde(rename = "uretprobe")]
    pub uretprobe_ns: f64,
    /// A uprobe on the `ret`.
    #[serde(rename = "ret")]
    pub ret_ns: f64,
    /// A uprobe on the `jmp` into the epilogue.
    #[serde(rename = "placed")]
    pub placed_ns: f64,
}

/// One uprobe that reads a return value.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReturnSite {
    /// Bytes from the function's entry.
    pub offset: u64,
    /// The instruction there, AT&T syntax.
    pub instruction: String,
    /// Whether the kernel emulates it.
    pub emulated: bool,
}

/// How a function's return value is read: in the JSON,
/// `{"how":"sites","sites":[…],"reason":…}` or `{"how":"uretprobe","reason":…}`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "how", rename_all = "lowercase")]
pub enum ReturnPlan {
    /// uprobes on these sites, one of which every call passes.
    Sites { sites: Vec<ReturnSite>, reason: String },
    /// A uretprobe, and why.
    Uretprobe { reason: String },
}

impl ReturnPlan {
    /// The JSON `how` value.
    #[must_use]
    pub const fn how(&self) -> &'static str {
        match self {
            Self::Sites { .. } => "sites",
            Self::Uretprobe { .. } => "uretprobe",
        }
    }

    /// Why this way.
    #[must_use]
    pub fn reason(&self) -> &str {
        match self {
            Self::Sites { reason, .. } | Self::Uretprobe { reason } => reason,
        }
    }
}

/// Plans the return probes of the function whose whole code is `code`,
/// linked at `address`, whose counting probe sits at `probe_offset`.
#[must_use]
///
/// With `rets_only` (`--live`), a site is always a `ret`, never a `jmp`
/// into the epilogue: the live table matches a return with its call by the
/// stack pointer, which is the entry's at a `ret` and unknown at a `jmp`
/// before the epilogue's `pop`s.
pub fn plan(
    code: &[u8],
    address: u64,
    probe_offset: u64,
    costs: &ReturnCosts,
    (kernel, rets_only): (KernelVersion, bool),
) -> ReturnPlan {
    let uret = |reason: String| ReturnPlan::Uretprobe { reason };
    let insns = match decode(code, address) {
        Ok(insns) => insns,
        Err(reason) => return uret(reason),
    };
    let Some(first) = insns.first() else { return uret("the symbol has no size, so its end is unknown".to_owned()) };
    let sites = match sites(&insns, address, code, (kernel, rets_only)) {
        Ok(sites) => sites,
        Err(reason) => return uret(reason),
    };
    let site_cost = sites.iter().map(|s| costs.hit.of(s.emulated)).fold(0.0, f64::max);
    // The uretprobe's entry breakpoint is free when the counting probe
    // already traps there.
    let entry =
        if probe_offset == 0 { 0.0 } else { costs.hit.of(placement::emulated(&code[..first.len()], kernel).is_some()) };
    let uret_cost = entry + costs.uretprobe_return_ns;
    let compared =
        format!("{} site(s), {site_cost:.0} ns per call, against a uretprobe, {uret_cost:.0} ns", sites.len());
    if site_cost <= uret_cost {
        ReturnPlan::Sites { sites, reason: format!("cheaper: {compared}") }
    } else {
        uret(format!("cheaper than {compared}"))
    }
}

fn decode(code: &[u8], address: u64) -> Result<Vec<Instruction>, String> {
    let mut insns = Vec::new();
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    while decoder.can_decode() {
        let insn = decoder.decode();
        if insn.is_invalid() {
            return Err(format!("undecodable code at +{}", insn.ip() - address));
        }
        insns.push(insn);
    }
    Ok(insns)
}

fn show(insn: &Instruction) -> String {
    let mut text = String::new();
    GasFormatter::new().format(insn, &mut text);
    text
}

/// Every return site, placed on `jmp`s where that reads the same rax, or an
/// error naming why the function needs a uretprobe.
fn sites(
    insns: &[Instruction],
    address: u64,
    code: &[u8],
    (kernel, rets_only): (KernelVersion, bool),
) -> Result<Vec<ReturnSite>, String> {
    let end = address + code.len() as u64;
    let inside = |target: u64| (address..end).contains(&target);
    for insn in insns {
        let offset = insn.ip() - address;
        match insn.flow_control() {
            FlowControl::Return if insn.mnemonic() != Mnemonic::Ret => {
                return Err(format!("an unusual return at +{offset} ({})", show(insn)));
            }
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch if !inside(insn.near_branch_target()) => {
                return Err(format!(
                    "it jumps out of the function at +{offset} ({}): a tail call, or a split-off .cold part",
                    show(insn)
                ));
            }
            FlowControl::IndirectBranch => {
                return Err(format!("an indirect jump at +{offset} ({}) may be a tail call", show(insn)));
            }
            _ => {}
        }
    }
    let site = |insn: &Instruction| {
        let offset = insn.ip() - address;
        let bytes = &code[usize::try_from(offset).unwrap_or(0)..][..insn.len()];
        ReturnSite { offset, instruction: show(insn), emulated: placement::emulated(bytes, kernel).is_some() }
    };
    let mut sites = Vec::new();
    for (k, insn) in insns.iter().enumerate() {
        if insn.mnemonic() != Mnemonic::Ret {
            continue;
        }
        match jumps_into_epilogue(insns, k).filter(|_| !rets_only) {
            Some(jumps) if jumps.iter().all(|&j| site(&insns[j]).emulated) && !jumps.is_empty() => {
                sites.extend(jumps.iter().map(|&j| site(&insns[j])));
            }
            _ => sites.push(site(insn)),
        }
    }
    if sites.is_empty() {
        return Err("no ret instruction".to_owned());
    }
    sites.sort_by_key(|s| s.offset);
    sites.dedup_by_key(|s| s.offset);
    Ok(sites)
}

/// For the `ret` at `k`: the indices of the direct `jmp`s that are the only
/// ways into its epilogue (the straight run before it that leaves rax
/// alone), if that is how it is reached; `None` if anything else enters it.
fn jumps_into_epilogue(insns: &[Instruction], k: usize) -> Option<Vec<usize>> {
    let mut info = InstructionInfoFactory::new();
    let mut start = k;
    while start > 0 {
        let prev = &insns[start - 1];
        if prev.flow_control() != FlowControl::Next || writes_rax(&mut info, prev) {
            break;
        }
        start -= 1;
    }
    // Falling into the epilogue from an instruction that may have set rax
    // is a way in no jump probe sees.
    if let Some(prev) = start.checked_sub(1).map(|i| &insns[i])
        && !matches!(
            prev.flow_control(),
            FlowControl::UnconditionalBranch | FlowControl::Return | FlowControl::Interrupt | FlowControl::Exception
        )
    {
        return None;
    }
    let (from, to) = (insns[start].ip(), insns[k].ip());
    let mut jumps = Vec::new();
    for (j, insn) in insns.iter().enumerate() {
        let branch = matches!(
            insn.flow_control(),
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch | FlowControl::Call
        );
        if !branch || !(from..=to).contains(&insn.near_branch_target()) {
            continue;
        }
        if insn.near_branch_target() != from || insn.flow_control() != FlowControl::UnconditionalBranch {
            return None;
        }
        jumps.push(j);
    }
    Some(jumps)
}

fn writes_rax(info: &mut InstructionInfoFactory, insn: &Instruction) -> bool {
    info.info(insn).used_registers().iter().any(|r| {
        r.register().full_register() == Register::RAX
            && matches!(
                r.access(),
                OpAccess::Write | OpAccess::ReadWrite | OpAccess::CondWrite | OpAccess::ReadCondWrite
            )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: KernelVersion = (6, 18);
    const COSTS: ReturnCosts = ReturnCosts {
        hit: HitCosts { single_stepped_ns: 16000.0, emulated_ns: 500.0, calibrated_unix_s: None },
        uretprobe_return_ns: 1500.0,
    };

    fn offsets(p: &ReturnPlan) -> Vec<u64> {
        match p {
            ReturnPlan::Sites { sites, .. } => sites.iter().map(|s| s.offset).collect(),
            ReturnPlan::Uretprobe { reason } => panic!("a uretprobe: {reason}"),
        }
    }

    #[test]
    fn every_ret_when_that_is_cheaper() {
        // test %rdi,%rdi; je +8; mov %rdi,%rax; ret; xor %eax,%eax; ret
        let code = [0x48, 0x85, 0xff, 0x74, 0x04, 0x48, 0x89, 0xf8, 0xc3, 0x31, 0xc0, 0xc3];
        // The counting probe traps at the entry anyway, so a uretprobe
        // costs only its return (1.5 µs), less than a single-stepped ret.
        let p = plan(&code, 0x1000, 0, &COSTS, (K, false));
        assert!(matches!(p, ReturnPlan::Uretprobe { .. }), "{p:?}");
        // With a dear uretprobe return, the rets win.
        let dear = ReturnCosts { uretprobe_return_ns: 20000.0, ..COSTS };
        let p = plan(&code, 0x1000, 0, &dear, (K, false));
        assert_eq!(offsets(&p), [8, 11]);
        assert!(p.reason().contains("2 site(s), 16000 ns per call"), "{}", p.reason());
    }

    #[test]
    fn jumps_to_an_epilogue_replace_its_ret() {
        // push %rbx; mov %rdi,%rax; test %rdi,%rdi; je +2 (to the epilogue);
        // jmp +0 (to it as well); pop %rbx; ret
        let code = [0x53, 0x48, 0x89, 0xf8, 0x48, 0x85, 0xff, 0x74, 0x02, 0xeb, 0x00, 0x5b, 0xc3];
        // The je into the epilogue is conditional: only the ret will do.
        assert_eq!(offsets(&plan(&code, 0, 1, &ReturnCosts { uretprobe_return_ns: 1e9, ..COSTS }, (K, false))), [12]);
        // Only a jmp leads there: the jmp is the site, and it is emulated.
        // push %rbx; mov %rdi,%rax; jmp +1; int3; pop %rbx; ret
        let code = [0x53, 0x48, 0x89, 0xf8, 0xeb, 0x01, 0xcc, 0x5b, 0xc3];
        let p = plan(&code, 0, 1, &COSTS, (K, false));
        let ReturnPlan::Sites { sites, reason } = &p else { panic!("{p:?}") };
        assert_eq!(sites.len(), 1);
        assert_eq!((sites[0].offset, sites[0].emulated), (4, true));
        assert!(reason.contains("500 ns per call"), "{reason}");
        // A rax write in the epilogue moves its start: pop %rax is not
        // transparent, so the ret itself is probed.
        let code = [0x53, 0x48, 0x89, 0xf8, 0xeb, 0x01, 0xcc, 0x58, 0xc3];
        let dear = ReturnCosts { uretprobe_return_ns: 1e9, ..COSTS };
        assert_eq!(offsets(&plan(&code, 0, 1, &dear, (K, false))), [8]);
    }

    #[test]
    fn tail_calls_need_a_uretprobe() {
        let dear = ReturnCosts { uretprobe_return_ns: 1e9, ..COSTS };
        // pyenv's PyObject_Malloc: mov %rdi,%rsi; mov ctx(%rip),%rdi;
        // jmp *fn(%rip)
        let code = [0x48, 0x89, 0xfe, 0x48, 0x8b, 0x3d, 0, 0, 0, 0, 0xff, 0x25, 0, 0, 0, 0];
        let p = plan(&code, 0x2000, 0, &dear, (K, false));
        assert!(matches!(&p, ReturnPlan::Uretprobe { reason } if reason.contains("indirect jump at +10")), "{p:?}");
        // Debian's PyMem_RawMalloc ends in jmp malloc@plt: a direct jump out.
        let code = [0x48, 0x85, 0xff, 0xe9, 0x00, 0x10, 0x00, 0x00];
        let p = plan(&code, 0x3000, 0, &dear, (K, false));
        assert!(matches!(&p, ReturnPlan::Uretprobe { reason } if reason.contains("out of the function at +3")));
        // A conditional jump out (to a .cold part) as well.
        let code = [0x0f, 0x88, 0x00, 0x10, 0x00, 0x00, 0xc3];
        assert!(matches!(plan(&code, 0x3000, 0, &dear, (K, false)), ReturnPlan::Uretprobe { .. }));
    }

    #[test]
    fn unknown_shapes_need_a_uretprobe() {
        let dear = ReturnCosts { uretprobe_return_ns: 1e9, ..COSTS };
        assert!(matches!(plan(&[], 0, 0, &dear, (K, false)), ReturnPlan::Uretprobe { .. }));
        // No ret at all (ends in ud2).
        assert!(matches!(plan(&[0x0f, 0x0b], 0, 0, &dear, (K, false)), ReturnPlan::Uretprobe { .. }));
        // A jump inside the function is fine; here it is the only way to
        // the ret, so it becomes the (emulated) site.
        assert_eq!(offsets(&plan(&[0xeb, 0x00, 0xc3], 0, 0, &dear, (K, false))), [0]);
    }
}
