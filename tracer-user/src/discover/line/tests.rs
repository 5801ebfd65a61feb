use iced_x86::{Decoder, DecoderOptions};

use super::*;

const AT: u64 = 0x1000;

/// The line from the first instruction of `code` (at [`AT`]) with `size`
/// and `object` there, and `landings`.
fn line(
    code: &[u8],
    size: Option<(u8, u8, u16)>,
    object: Option<(u8, u16)>,
    landings: &[u64],
) -> (Vec<InlineEntry>, LineEnd) {
    let decode = |address: u64| {
        let offset = usize::try_from(address.checked_sub(AT)?).ok()?;
        let mut decoder = Decoder::with_ip(64, code.get(offset..)?, address, DecoderOptions::NONE);
        let insn = decoder.decode();
        (!insn.is_invalid()).then_some(insn)
    };
    // An import slot 0x10 past the end of the code below.
    let imports = vec![(AT + 0x16, AT + 0x1e)];
    let landings = Landings(Arc::new(landings.iter().copied().collect()), Arc::new(imports), Arc::default());
    follow(&InlineEntry { address: AT, size, object, returned: false }, decode, &landings)
}

fn reg(n: u16) -> u8 {
    site::register(n).unwrap_or(NONE)
}

const RDI: u16 = 5;
const RBX: u16 = 3;
const RSI: u16 = 4;

// mov 0x10(%rip),%rax; mov %rdi,%rbx; mov $1,%edi; test %rax,%rax; jne +0x10
const NEW_REFERENCE: &[u8] =
    &[0x48, 0x8b, 0x05, 0x10, 0, 0, 0, 0x48, 0x89, 0xfb, 0xbf, 1, 0, 0, 0, 0x48, 0x85, 0xc0, 0x75, 0x10];

#[test]
fn a_register_moved_before_it_is_overwritten_is_read_from_its_new_home() {
    let (points, end) = line(NEW_REFERENCE, None, Some((reg(RDI), 0)), &[]);
    let seen: Vec<(u64, Option<(u8, u16)>)> = points.iter().map(|p| (p.address - AT, p.object)).collect();
    assert_eq!(
        seen,
        [(7, Some((reg(RDI), 0))), (10, Some((reg(RDI), 0))), (15, Some((reg(RBX), 0))), (18, Some((reg(RBX), 0)))]
    );
    assert_eq!(end, LineEnd::Branch);
}

#[test]
fn the_line_ends_before_a_landing_or_an_endbr64() {
    let (points, end) = line(NEW_REFERENCE, None, None, &[AT + 15]);
    assert_eq!(points.iter().map(|p| p.address - AT).collect::<Vec<_>>(), [7, 10]);
    assert_eq!(end, LineEnd::Landing(AT + 15));
    // The first point itself may be landed on: that is its own entry.
    assert_eq!(line(NEW_REFERENCE, None, None, &[AT]).0.len(), 4);
    // mov %rdi,%rbx; endbr64; jmp
    let (points, end) = line(&[0x48, 0x89, 0xfb, 0xf3, 0x0f, 0x1e, 0xfa, 0xeb, 0], None, None, &[]);
    assert!(points.is_empty() && end == LineEnd::Landing(AT + 3), "{points:?} {end:?}");
}

#[test]
fn a_size_spilled_to_the_stack_is_followed_across_pushes() {
    // push %rbx; sub $0x10,%rsp; mov %rdi,0x8(%rsp); xor %edi,%edi; jmp
    let code = [0x53, 0x48, 0x83, 0xec, 0x10, 0x48, 0x89, 0x7c, 0x24, 0x08, 0x31, 0xff, 0xeb, 0];
    let (points, end) = line(&code, Some((reg(RDI), NONE, 0)), None, &[]);
    let last = points.last().expect("points");
    assert_eq!((last.address - AT, end), (12, LineEnd::Branch));
    // 0x8 above the stack pointer there.
    assert_eq!(last.size, Some((MEMORY + 8, NONE, 8)));
    // A size the DWARF puts on the stack moves with the stack pointer.
    let (points, _) = line(&[0x53, 0xeb, 0], Some((MEMORY + 8, NONE, 16)), None, &[]);
    assert_eq!(points[0].size, Some((MEMORY + 8, NONE, 24)));
}

#[test]
fn a_slot_is_dropped_where_the_stack_pointer_or_the_store_cannot_be_followed() {
    // and $-16,%rsp; jmp
    let (points, _) = line(&[0x48, 0x83, 0xe4, 0xf0, 0xeb, 0], Some((MEMORY + 8, NONE, 16)), None, &[]);
    assert_eq!(points[0].size, None);
    // movq $1,(%rax); jmp: the store may be to the slot.
    let (points, _) = line(&[0x48, 0xc7, 0, 1, 0, 0, 0, 0xeb, 0], None, Some((MEMORY + 8, 16)), &[]);
    assert_eq!(points[0].object, None);
    // A store to another slot leaves it.
    // mov %rax,0x20(%rsp); jmp
    let (points, _) = line(&[0x48, 0x89, 0x44, 0x24, 0x20, 0xeb, 0], None, Some((MEMORY + 8, 16)), &[]);
    assert_eq!(points[0].object, Some((MEMORY + 8, 16)));
}

#[test]
fn a_32_bit_move_is_no_copy() {
    // mov %edi,%eax; xor %edi,%edi; jmp
    let (points, _) = line(&[0x89, 0xf8, 0x31, 0xff, 0xeb, 0], Some((reg(RDI), NONE, 0)), None, &[]);
    assert_eq!(points.last().expect("points").size, None);
}

#[test]
fn both_factors_of_a_calloc_are_followed() {
    // mov %rdi,%rsi; xor %edi,%edi; jmp
    let (points, _) = line(&[0x48, 0x89, 0xfe, 0x31, 0xff, 0xeb, 0], Some((reg(RDI), CONSTANT, 8)), None, &[]);
    assert_eq!(points.last().expect("points").size, Some((reg(RSI), CONSTANT, 8)));
    // A constant size is known anywhere.
    let (points, _) = line(&[0x31, 0xff, 0xeb, 0], Some((CONSTANT, NONE, 56)), None, &[]);
    assert_eq!(points[0].size, Some((CONSTANT, NONE, 56)));
}

#[test]
fn the_line_stops_at_its_limit_and_where_code_ends() {
    let nops = vec![0x90; MAX_LINE + 8];
    let (points, end) = line(&nops, None, None, &[]);
    assert_eq!((points.len(), end), (MAX_LINE, LineEnd::Limit));
    let (points, end) = line(&[0x90, 0x90], None, None, &[]);
    assert_eq!((points.len(), end), (1, LineEnd::Undecodable));
}

// mov 0x8(%rdi),%rax; call *0x30(%rax); jmp: an inlined `_Py_Dealloc`
// and the jump back after it.
const DEALLOC: &[u8] = &[0x48, 0x8b, 0x47, 0x08, 0xff, 0x50, 0x30, 0xeb, 0];

#[test]
fn the_line_goes_on_past_an_indirect_call_without_the_object() {
    let (points, end) = line(DEALLOC, None, Some((reg(RDI), 0)), &[]);
    let seen: Vec<(u64, Option<(u8, u16)>)> = points.iter().map(|p| (p.address - AT, p.object)).collect();
    // The callee may have freed the object: not read past the call, even
    // from a register it keeps.
    assert_eq!(seen, [(4, Some((reg(RDI), 0))), (7, None)]);
    assert_eq!(end, LineEnd::Branch);
    let (points, _) = line(DEALLOC, None, Some((reg(RBX), 0)), &[]);
    assert_eq!(points[1].object, None);
    // The return lands after the call, nothing else may.
    let (points, end) = line(DEALLOC, None, None, &[AT + 7]);
    assert_eq!((points.len(), end), (1, LineEnd::Landing(AT + 7)));
}

#[test]
fn a_size_past_an_indirect_call_is_where_the_callee_keeps_it() {
    // call *0x30(%rax); jmp
    let code = &DEALLOC[4..];
    let at_jmp = |size| line(code, Some(size), None, &[]).0[0].size;
    assert_eq!(at_jmp((reg(RBX), NONE, 0)), Some((reg(RBX), NONE, 0)));
    assert_eq!(at_jmp((reg(RDI), NONE, 0)), None);
    assert_eq!(at_jmp((CONSTANT, NONE, 56)), Some((CONSTANT, NONE, 56)));
    // The callee may write the caller's stack slots: its stack arguments'
    // area is its own.
    assert_eq!(at_jmp((MEMORY + 8, NONE, 8)), None);
}

#[test]
fn a_direct_call_or_one_through_a_static_slot_ends_the_line() {
    // call +0; jmp: the callee may never return.
    let (points, end) = line(&[0xe8, 0, 0, 0, 0, 0xeb, 0], None, None, &[]);
    assert!(points.is_empty() && end == LineEnd::Branch, "{points:?} {end:?}");
    // call *0x10(%rip); jmp: the slot at 0x16 is an import's, whose
    // function may be `abort`.
    let (points, end) = line(&[0xff, 0x15, 0x10, 0, 0, 0, 0xeb, 0], None, None, &[]);
    assert!(points.is_empty() && end == LineEnd::Branch, "{points:?} {end:?}");
    // call *0x20(%rip); jmp: a slot in data (an allocator table's): the line
    // goes on.
    let (points, end) = line(&[0xff, 0x15, 0x20, 0, 0, 0, 0xeb, 0], None, None, &[]);
    assert!(points.len() == 1 && end == LineEnd::Branch, "{points:?} {end:?}");
}

/// The gates of `code` (at [`AT`]), with `data` naming addresses.
fn gates_of(code: &[u8], data: &[u64]) -> HashMap<u64, Vec<Gate>> {
    let mut decoder = Decoder::with_ip(64, code, AT, DecoderOptions::NONE);
    let instructions: Vec<Instruction> =
        std::iter::from_fn(|| decoder.can_decode().then(|| decoder.decode())).collect();
    let data: HashSet<u64> = data.iter().copied().collect();
    gates(&instructions, &data, &[])
}

fn one(jump: u64, condition: Option<u8>) -> Vec<Gate> {
    vec![Gate { jump, condition }]
}

// subq $1,(%rbx); jne +10; mov 8(%rbx),%rax; mov %rbx,%rdi; call *0x30(%rax); ret
const DECREF: &[u8] = &[0x48, 0x83, 0x2b, 1, 0x75, 0x0a, 0x48, 0x8b, 0x43, 8, 0x48, 0x89, 0xdf, 0xff, 0x50, 0x30, 0xc3];

#[test]
fn a_copy_after_a_jump_that_falls_into_it_is_gated_on_the_jump_not_taken() {
    let gates = gates_of(DECREF, &[]);
    // jne is condition 5; the copy runs where it does not jump: e (4).
    assert_eq!(gates.get(&(AT + 6)), Some(&one(AT + 4, Some(4))), "{gates:?}");
    // The jne's target is also the call's return: other code falls into it.
    assert_eq!(gates.get(&(AT + 16)), None, "{gates:?}");
    let start = InlineEntry { address: AT + 6, size: None, object: Some((reg(RBX), 0)), returned: false };
    let landings = Landings(Arc::default(), Arc::default(), Arc::new(gates));
    let points = gate(&start, &landings);
    assert_eq!(points.len(), 1);
    assert_eq!((points[0].0.address, points[0].0.object, points[0].1), (AT + 4, start.object, Some(4)));
}

// test $1,%al; je +6; jmp *0(%rip); mov 0(%rip),%rdi; jmp *0(%rip)
const TAIL: &[u8] = &[0xa8, 1, 0x74, 6, 0xff, 0x25, 0, 0, 0, 0, 0x48, 0x8b, 0x3d, 0, 0, 0, 0, 0xff, 0x25, 0, 0, 0, 0];

#[test]
fn a_copy_one_jump_alone_lands_on_is_gated_on_the_jump_taken() {
    let gates = gates_of(TAIL, &[]);
    assert_eq!(gates.get(&(AT + 10)), Some(&one(AT + 2, Some(4))), "{gates:?}");
    assert_eq!(gates.get(&(AT + 4)), Some(&one(AT + 2, Some(5))), "{gates:?}");
    // Named by data (a jump table's entry), it has other ways in.
    assert_eq!(gates_of(TAIL, &[AT + 10]).get(&(AT + 10)), None);
}

// test %al,%al; je +4 (to the mov); jmp +7 (to the ret); nop (66 90);
// mov 0x10(%r12),%rdx; ret; jmp -8 (to the mov)
const TWO_WAYS: &[u8] =
    &[0x84, 0xc0, 0x74, 0x04, 0xeb, 0x06, 0x66, 0x90, 0x49, 0x8b, 0x54, 0x24, 0x10, 0xc3, 0xeb, 0xf8];

#[test]
fn a_copy_only_jumps_lead_into_is_gated_on_each_past_padding() {
    // The mov at +8: the je's target, the last jmp's, and after padding
    // that the jmp at +4 jumps over.
    let gates = gates_of(TWO_WAYS, &[]);
    let into = gates.get(&(AT + 8)).unwrap_or_else(|| panic!("{gates:?}"));
    assert_eq!(into, &vec![Gate { jump: AT + 2, condition: Some(4) }, Gate { jump: AT + 14, condition: None }]);
    // A call to it too: not only jumps.
    let mut called = TWO_WAYS.to_vec();
    called.truncate(14);
    // call rel32 at +14, to +8.
    called.extend_from_slice(&[0xe8, 0xf5, 0xff, 0xff, 0xff]);
    assert_eq!(gates_of(&called, &[]).get(&(AT + 8)), None);
}
