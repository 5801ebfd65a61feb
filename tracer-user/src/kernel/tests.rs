//! The kernel side's tests: every program loads (with each feature on,
//! for multi links, from the bench object) and the maps read back what the
//! programs count, on real BPF.
use std::collections::BTreeSet;

use aya_obj::generated::bpf_map_type;

use super::*;
use crate::{
    discover::elf::ElfImage,
    plan::{self, ImageRef, PlanOptions},
    probe::ProbeSpec,
};

/// A plan of `spec` against this test binary (tracer's own code, with the
/// `tracer_test_*` functions the tests probe), and its ELF image, for the
/// tests of every kernel module. The tests load BPF, so they need root.
pub(super) fn own_plan(spec: &[ProbeSpec], options: PlanOptions) -> (Plan, ElfImage) {
    assert!(crate::privileges::is_root(), "this test loads BPF: run it as root (cargo xtask test)");
    let exe = std::env::current_exe().expect("the test binary");
    let elf = ElfImage::open(&exe).expect("the test binary is ELF");
    let plan = plan::plan(ImageRef::own(&elf, &exe), spec, options).expect("a plan on the test binary");
    (plan, elf)
}

/// [`own_plan`] with one probe counting calls of `main`, which is never
/// hit again: a plan to load the object with, whose tests probe other
/// points.
pub(super) fn main_plan() -> (Plan, ElfImage) {
    own_plan(&[ProbeSpec::function("main", Program::CountCall, true, true)], PlanOptions::default())
}

/// Every program loads for uprobe-multi links against the object's
/// maps, whatever their type: a map type the multi loader left out
/// would fail this load, and `--links auto` would fall back silently.
#[test]
fn every_program_loads_for_multi_links_with_every_map_type() {
    let obj = aya_obj::Object::parse(crate::BPF_OBJECT).expect("the embedded BPF object parses");
    let types: BTreeSet<u32> = obj.maps.values().map(aya_obj::Map::map_type).collect();
    for (wanted, name) in [
        (bpf_map_type::BPF_MAP_TYPE_PERCPU_HASH, "per-CPU hash (counters, returns)"),
        (bpf_map_type::BPF_MAP_TYPE_PERCPU_ARRAY, "per-CPU array (stats)"),
        (bpf_map_type::BPF_MAP_TYPE_RINGBUF, "ring buffer (aya-log)"),
        (bpf_map_type::BPF_MAP_TYPE_ARRAY, "array (.rodata globals)"),
        (bpf_map_type::BPF_MAP_TYPE_LRU_HASH, "LRU hash (GC collections in flight)"),
    ] {
        assert!(types.contains(&(wanted as u32)), "the object has no {name} map: {types:?}");
    }
    let (plan, _) = main_plan();
    let options = LoadOptions { bpf_log: true, ..LoadOptions::default() };
    let session = Session::load(plan, std::process::id(), &options).expect("the object loads");
    let names: BTreeSet<&str> = session.map_fds.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.len(), obj.maps.len(), "every map of the object has an fd for the multi loader: {names:?}");
    let chains = [
        names::programs::GC_START,
        names::programs::GC_DONE,
        names::programs::GROWTH_TAKE,
        names::programs::GROWTH_CARVE,
        names::programs::GROWTH_ARENA,
    ];
    for name in Program::ALL.iter().filter(|p| !p.bench_only()).map(|p| p.name()).chain(chains) {
        multi::load(crate::BPF_OBJECT, name, &session.map_fds)
            .unwrap_or_else(|e| panic!("{name} does not load for uprobe-multi links: {e}"));
    }
}

/// Never called: its immediate holds bytes that decode as no
/// instruction, for a probe the kernel refuses.
/// With `--stacks`, `--types` and `--live` on (and the budget's heat),
/// the stack walk, the type count and the live table's code are live code,
/// which the verifier must accept in every program, together (`--types --live` once failed
/// to load `free_object`: a value spilled where it was undefined).
#[test]
fn every_program_loads_with_stacks_types_and_live() {
    let (plan, _) = main_plan();
    let options = LoadOptions {
        types: Some(TypesOptions { entries: 16, ob_type_offset: 8, objects: 16, pre_headers: [0, 16, 32] }),
        stacks: Some(StacksOptions { slots: vec![0], sample: 3, entries: 16, native_rows: Some(1024) }),
        live: Some(16),
        heat: true,
        ..LoadOptions::default()
    };
    let session = Session::load(plan, std::process::id(), &options).expect("the object loads");
    for program in Program::ALL.iter().filter(|p| !p.bench_only()) {
        multi::load(crate::BPF_OBJECT, program.name(), &session.map_fds)
            .unwrap_or_else(|e| panic!("{} does not load with stacks, types and live on: {e}", program.name()));
    }
}

/// The bench-only programs are in the bench object, which a plan that
/// attaches one loads, and not in the product's.
#[test]
fn bench_programs_load_from_the_bench_object_alone() {
    let product = aya_obj::Object::parse(crate::BPF_OBJECT).expect("the embedded BPF object parses");
    let bench = aya_obj::Object::parse(crate::BENCH_OBJECT).expect("the bench object parses");
    let bench_only: Vec<Program> = Program::ALL.into_iter().filter(|p| p.bench_only()).collect();
    assert_eq!(bench_only.len(), 4, "{bench_only:?}");
    for program in Program::ALL {
        let name = program.name();
        assert_eq!(product.programs.contains_key(name), !program.bench_only(), "{name} in the product's object");
        assert!(bench.programs.contains_key(name), "{name} is not in the bench object");
    }
    let spec = [ProbeSpec::function("main", Program::CountCall, true, true)];
    // Not a literal: the plan's options are built in one place
    // (prepare::planning), which the kernel does not depend on.
    #[allow(clippy::field_reassign_with_default, reason = "see the comment above")]
    let options = {
        let mut options = PlanOptions::default();
        options.program_override = Some(Program::MetaLookup);
        options
    };
    let (plan, _) = own_plan(&spec, options);
    let session = Session::load(plan, std::process::id(), &LoadOptions::default()).expect("the bench object loads");
    assert!(std::ptr::eq(session.object, crate::BENCH_OBJECT), "a bench plan loads the bench object");
    for program in bench_only {
        multi::load(program.object(), program.name(), &session.map_fds)
            .unwrap_or_else(|e| panic!("{} does not load from the bench object: {e}", program.name()));
    }
}

#[unsafe(no_mangle)]
#[inline(never)]
extern "C" fn tracer_test_never_called() -> u64 {
    std::hint::black_box(0x0606_0606_0606_0606)
}

/// One offset the kernel refuses does not fail the link of the hundreds
/// beside it: the others attach, and the refused one makes its probe's
/// coverage partial.
#[test]
fn a_refused_offset_is_left_out_and_reported() {
    let (mut plan, elf) = main_plan();
    // Its address taken, so that the linker keeps it.
    std::hint::black_box(tracer_test_never_called as extern "C" fn() -> u64);
    let never = elf.function("tracer_test_never_called").expect("the never-called function");
    let code = elf.read_at(never.file_offset, 32).expect("its code");
    // An 0x06 byte inside its `movabs`: no instruction in 64-bit mode.
    let inside = code.iter().skip(1).position(|&b| b == 0x06).expect("an 0x06 byte") as u64 + 1;
    let bad = never.file_offset + inside;
    let site = |offset| plan::InlineSite {
        offset,
        size: None,
        object: None,
        emulated: false,
        moved: false,
        stay: None,
        gate: None,
        jump: false,
        also: false,
    };
    plan.probes[0].inline_sites = vec![site(never.file_offset), site(bad)];
    let mut session = Session::load(plan, std::process::id(), &LoadOptions::default()).expect("the object loads");
    session.prepare(true).expect("programs load");
    session.attach_multi(std::process::id()).expect("the other points attach");
    assert_eq!(session.refused().iter().copied().collect::<Vec<_>>(), [("main", bad)]);
    let c = &session.plan().probes[0].coverage;
    assert_eq!(c.calls, crate::plan::coverage::Completeness::Partial, "{c:?}");
    let reason = c.reason.as_deref().unwrap_or_default();
    assert!(reason.contains(&format!("the kernel refused the probe at file offset {bad:#x}")), "{reason}");
    session.detach_multi(std::process::id());
}

/// Takes its seventh argument on the stack: at its entry, 8 bytes above
/// the stack pointer.
#[unsafe(no_mangle)]
#[inline(never)]
extern "C" fn tracer_test_seven(a1: u64, a2: u64, a3: u64, a4: u64, a5: u64, a6: u64, on_stack: u64) -> u64 {
    std::hint::black_box(a1 ^ a2 ^ a3 ^ a4 ^ a5 ^ a6 ^ on_stack)
}

/// A plan of main's probe (never hit again) with one inlined site, at
/// [`tracer_test_seven`]'s entry, whose size is its seventh argument, in a
/// stack slot: the plan, and the site's file offset.
fn seven_plan() -> (Plan, u64) {
    use tracer_common::site;
    let spec = [ProbeSpec::function("main", Program::SizeArg0, true, true)];
    let (mut plan, elf) = own_plan(&spec, PlanOptions::default());
    std::hint::black_box(tracer_test_seven as extern "C" fn(u64, u64, u64, u64, u64, u64, u64) -> u64);
    let seven = elf.function("tracer_test_seven").expect("the seven-argument function");
    // DWARF register 7 is %rsp.
    let (first, offset) = site::memory(7, 8).expect("fits");
    plan.probes[0].inline_sites = vec![plan::InlineSite {
        object: None,
        offset: seven.file_offset,
        size: Some((first, site::NONE, offset)),
        emulated: false,
        moved: false,
        stay: None,
        gate: None,
        jump: false,
        also: false,
    }];
    (plan, seven.file_offset)
}

/// A size in a stack slot (the DWARF's `DW_OP_fbreg` or a register plus
/// an offset) is read from the thread's memory at each hit.
#[test]
fn a_size_in_a_stack_slot_is_read_from_memory() {
    const N: u64 = 300;
    let (plan, _) = seven_plan();
    let mut session = Session::load(plan, std::process::id(), &LoadOptions::default()).expect("the object loads");
    session.prepare(true).expect("programs load");
    session.attach_multi(std::process::id()).expect("attached");
    for i in 0..N {
        tracer_test_seven(i, 0, 0, 0, 0, 0, 1234);
    }
    let readings = session.read().expect("the counters read");
    session.detach_multi(std::process::id());
    let probe = readings.probes[0];
    assert_eq!((probe.calls, probe.bytes), (N, 1234 * N), "{readings:?}");
    assert!(readings.stats.iter().all(|&v| v == 0), "{readings:?}");
}

/// The sizes' buckets read in one batch lookup are those read an index at
/// a time, and hold every call of the probe's domain.
#[test]
fn the_sizes_read_in_one_batch_are_those_read_one_by_one() {
    const N: u64 = 300;
    let (mut plan, _) = seven_plan();
    plan.probes[0].domain = Some(tracer_common::sizes::Domain::Mem);
    let mut session = Session::load(plan, std::process::id(), &LoadOptions::default()).expect("the object loads");
    session.prepare(true).expect("programs load");
    session.attach_multi(std::process::id()).expect("attached");
    for i in 0..N {
        tracer_test_seven(i, 0, 0, 0, 0, 0, 1234);
    }
    session.detach_multi(std::process::id());
    let readings = session.read().expect("the counters read");
    let len = tracer_common::sizes::DOMAINS * tracer_common::sizes::BUCKETS;
    let one_by_one: Vec<Counter> = (0..len)
        .map(|i| session.sizes.get(&i, 0).expect("a bucket").iter().fold(Counter::default(), |s, c| s.merged(*c)))
        .collect();
    assert_eq!(readings.sizes, one_by_one);
    // This kernel has the batch lookup: that is what read them.
    let batch = super::batch::array_values(&session.sizes, len);
    assert_eq!(batch.expect("read").expect("the batch lookup").len(), len as usize);
    let bucket =
        tracer_common::sizes::index(tracer_common::sizes::Domain::Mem as u32, tracer_common::sizes::bucket(1234));
    assert_eq!(readings.sizes[bucket as usize], Counter { calls: N, bytes: 1234 * N }, "{:?}", readings.sizes);
    assert_eq!(readings.sizes.iter().map(|c| c.calls).sum::<u64>(), N);
}

/// A per-CPU hash map read in batches of a few entries (doubled where a
/// bucket holds more) is the map read a key at a time, and so is a
/// per-CPU array read in batches.
#[test]
fn batches_read_every_entry_once() {
    use aya::maps::{IterableMap as _, PerCpuValues};
    use tracer_common::returns::Returned;
    let (plan, _) = seven_plan();
    // For every process: room for 1,024 processes' entries.
    let mut session = Session::load(plan, ALL_PROCESSES, &LoadOptions::default()).expect("the object loads");
    let cpus = aya::util::nr_cpus().expect("possible CPUs");
    for i in 1..=50u32 {
        let key = CounterKey { tgid: i, slot: 0 };
        // A value of its own on each CPU: a layout read wrong shows.
        let values: Vec<Returned> = (0..cpus as u64)
            .map(|cpu| Returned { returns: u64::from(i) * 1000 + cpu, null: cpu, pointer_sum: u64::from(i) << 32 })
            .collect();
        session.returns.insert(key, PerCpuValues::try_from(values).expect("values"), 0).expect("inserted");
    }
    let mut one_by_one: Vec<(CounterKey, Vec<Returned>)> =
        session.returns.iter().map(|e| e.map(|(k, v)| (k, v.to_vec()))).collect::<Result<_, _>>().expect("iterated");
    // SAFETY: the typed map's key and value are CounterKey and Returned,
    // and the CPUs are the possible ones.
    let mut batched: Vec<(CounterKey, Vec<Returned>)> =
        unsafe { super::batch::in_chunks(session.returns.map(), cpus, 1) }.expect("read").expect("the batch lookup");
    one_by_one.sort_by_key(|(k, _)| k.tgid);
    batched.sort_by_key(|(k, _)| k.tgid);
    assert_eq!(batched.len(), 50);
    assert_eq!(batched, one_by_one);
    assert_eq!(
        batched[0].1.iter().map(|r| r.returns).collect::<Vec<_>>(),
        (0..cpus as u64).map(|c| 1000 + c).collect::<Vec<_>>()
    );
    let len = tracer_common::sizes::DOMAINS * tracer_common::sizes::BUCKETS;
    // SAFETY: an array's key is a u32, and its values are Counters.
    let array: Vec<(u32, Vec<Counter>)> =
        unsafe { super::batch::in_chunks(session.sizes.map(), cpus, 7) }.expect("read").expect("the batch lookup");
    assert_eq!(array.iter().map(|(k, _)| *k).collect::<Vec<u32>>(), (0..len).collect::<Vec<u32>>());
}

/// A map the kernel has no batch lookup for falls back to a key at a time,
/// and the fallback is counted under its reason, with the errno it was
/// first seen with: never silent.
#[test]
fn a_fallback_to_a_key_at_a_time_is_counted() {
    use std::os::fd::FromRawFd as _;

    use super::batch::FallbackReason::{Busy, Unsupported};
    // A perf event array: a map type without batch operations (the
    // kernel answers ENOTSUPP), as a kernel before 5.6 (EINVAL) has none
    // for any map.
    #[repr(C)]
    #[derive(Default)]
    struct CreateAttr {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        map_flags: u32,
    }
    assert!(crate::privileges::is_root(), "this test creates a BPF map: run it as root (cargo xtask test)");
    let mut attr = CreateAttr {
        map_type: bpf_map_type::BPF_MAP_TYPE_PERF_EVENT_ARRAY as u32,
        key_size: 4,
        value_size: 4,
        max_entries: 4,
        ..CreateAttr::default()
    };
    // SAFETY: attr is the start of the kernel's bpf_attr for
    // BPF_MAP_CREATE (the kernel zero-extends a shorter one), its size
    // passed with it; it outlives the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            aya_obj::generated::bpf_cmd::BPF_MAP_CREATE as libc::c_long,
            &raw mut attr,
            size_of::<CreateAttr>(),
        )
    };
    assert!(fd >= 0, "a perf event array: {}", std::io::Error::last_os_error());
    // SAFETY: the syscall returned this new fd, owned by nothing else.
    let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(i32::try_from(fd).expect("an fd")) };
    let map = aya::maps::MapData::from_fd(owned).expect("the map's info");
    let before = super::batch::fallbacks();
    // SAFETY: the buffers in_chunks sizes hold 4-byte keys and values of
    // four u32s a CPU (at least the map's 4 bytes), and the CPUs are the
    // possible ones.
    let read = unsafe { super::batch::in_chunks::<u32, u32>(&map, aya::util::nr_cpus().expect("CPUs"), 4) };
    assert!(read.expect("no error: a fallback").is_none(), "this map type has no batch lookup");
    let after = super::batch::fallbacks();
    assert!(after.unsupported > before.unsupported, "{before:?} -> {after:?}");
    assert_ne!(after.first_unsupported, 0, "{after:?}");
    assert_eq!(super::batch::FallbackReason::of(after.first_unsupported), Some(Unsupported));
    // The classes: no support, and a busy bucket (tried again next time).
    for (code, class) in [
        (libc::EINVAL, Some(Unsupported)),
        (libc::EOPNOTSUPP, Some(Unsupported)),
        (524, Some(Unsupported)),
        (libc::EBUSY, Some(Busy)),
        (libc::EDEADLK, Some(Busy)),
        (libc::ETIMEDOUT, Some(Busy)),
        (libc::EINTR, Some(Busy)),
        (libc::EAGAIN, Some(Busy)),
        (libc::EPERM, None),
        (libc::EFAULT, None),
    ] {
        assert_eq!(super::batch::FallbackReason::of(code), class, "errno {code}");
    }
    assert_eq!(super::batch::Fallbacks::errno_name(524), "ENOTSUPP (524)");
}

/// With heat on (the budget's), each hit counts in its address's bucket,
/// and the next attach puts the site hit into a tier of its own, where it
/// counts as before.
#[test]
fn heat_counts_each_hit_where_it_landed_and_tiers_the_next_attach() {
    use tracer_common::heat::bucket;
    const N: u64 = 200;
    let (plan, seven) = seven_plan();
    let options = LoadOptions { heat: true, ..LoadOptions::default() };
    let mut session = Session::load(plan, std::process::id(), &options).expect("the object loads");
    session.prepare(true).expect("programs load");
    let pid = std::process::id();
    let tiers = |s: &Session| s.multi_links[&pid].iter().map(super::links::MultiLink::tier).collect::<Vec<_>>();
    session.attach_multi(pid).expect("attached");
    // No heat yet: every link cold.
    assert!(tiers(&session).iter().all(|&t| t == 0), "{:?}", tiers(&session));
    for i in 0..N {
        tracer_test_seven(i, 0, 0, 0, 0, 0, 1);
    }
    session.detach_multi(pid);
    let heat = session.heat().expect("heat reads").expect("heat counted");
    assert_eq!(heat[bucket(seven)], N);
    assert_eq!(heat.iter().sum::<u64>(), N, "no hit elsewhere");
    // The site hit goes into the hottest tier, main's entry stays cold.
    session.attach_multi(pid).expect("attached again");
    let mut t = tiers(&session);
    t.sort_unstable();
    assert_eq!(t, [0, super::heat::TIERS.len()]);
    for i in 0..N {
        tracer_test_seven(i, 0, 0, 0, 0, 0, 1);
    }
    let readings = session.read().expect("the counters read");
    session.detach_multi(pid);
    assert_eq!((readings.probes[0].calls, readings.probes[0].bytes), (2 * N, 2 * N), "{readings:?}");
    assert_eq!(session.heat().expect("heat reads").expect("heat")[bucket(seven)], 2 * N);
}

#[unsafe(no_mangle)]
#[inline(never)]
extern "C" fn tracer_test_new_reference(op: *const u64) -> u64 {
    std::hint::black_box(op as u64)
}

#[unsafe(no_mangle)]
#[inline(never)]
extern "C" fn tracer_test_free(ptr: *const u64) -> u64 {
    std::hint::black_box(ptr as u64)
}

/// `--types` in the kernel: each new reference keeps its object, a free
/// of its block (the object, or the object minus a pre-header) counts
/// it destroyed when its memory still holds its type, a second new
/// reference at a kept address counts the first object reused, and a
/// full objects table is counted.
#[test]
fn objects_are_kept_destroyed_at_their_block_and_reused() {
    std::hint::black_box(tracer_test_new_reference as extern "C" fn(*const u64) -> u64);
    std::hint::black_box(tracer_test_free as extern "C" fn(*const u64) -> u64);
    let spec = [
        ProbeSpec::function("tracer_test_new_reference", Program::CountObject, true, true),
        ProbeSpec::function("tracer_test_free", Program::FreeObject, true, true),
    ];
    let (plan, _) = own_plan(&spec, PlanOptions::default());
    // Room for three objects.
    let types = TypesOptions { entries: 16, ob_type_offset: 8, objects: 3, pre_headers: [0, 16, 32] };
    let options = LoadOptions { types: Some(types), ..LoadOptions::default() };
    let mut session = Session::load(plan, std::process::id(), &options).expect("the object loads");
    session.prepare(true).expect("programs load");
    session.attach_multi(std::process::id()).expect("attached");
    // Two type objects, and blocks whose objects' second word is
    // their type: `a`, `c` and `d` without a pre-header, `b` after 32
    // bytes of one (a GC header and a managed dict's).
    let (t1, t2) = (Box::new([0u64; 4]), Box::new([0u64; 4]));
    let (t1, t2) = (t1.as_ptr() as u64, t2.as_ptr() as u64);
    let mut a = Box::new([0, t1, 0, 0]);
    let b = Box::new([0, 0, 0, 0, 0, t2, 0, 0]);
    let c = Box::new([0, t1, 0, 0]);
    let d = Box::new([0, t1, 0, 0]);
    let b_object = b[4..].as_ptr();
    tracer_test_new_reference(a.as_ptr());
    tracer_test_new_reference(b_object);
    tracer_test_new_reference(c.as_ptr());
    // The table is full: counted, not kept.
    tracer_test_new_reference(d.as_ptr());
    tracer_test_free(a.as_ptr());
    tracer_test_free(b.as_ptr());
    // A block tracer never saw an object of.
    tracer_test_free(d[2..].as_ptr());
    tracer_test_new_reference(b_object);
    tracer_test_new_reference(b_object);
    // A block whose memory no longer holds the kept type is not the
    // kept object's.
    a[1] = t2;
    tracer_test_new_reference(a.as_ptr());
    a[1] = t1;
    tracer_test_free(a.as_ptr());
    let readings = session.read().expect("the counters read");
    session.detach_multi(std::process::id());
    std::hint::black_box((&a, &b, &c, &d));
    let calls: Vec<u64> = readings.probes.iter().map(|p| p.calls).collect();
    assert_eq!(calls, [7, 4], "{readings:?}");
    let counts = &readings.types[&std::process::id()];
    let made = |created, destroyed, reused| tracer_common::types::TypeCounts { created, destroyed, reused };
    // t1: a, c, d created; a destroyed. t2: b twice and a (retyped)
    // created; b destroyed, then reused by its second new reference.
    assert_eq!(counts.get(&t1), Some(&made(3, 1, 0)), "{counts:?}");
    assert_eq!(counts.get(&t2), Some(&made(4, 1, 1)), "{counts:?}");
    let stat = |s: tracer_common::stats::Stat| readings.stats[s as usize];
    assert_eq!(stat(tracer_common::stats::Stat::ObjectsFull), 1, "{readings:?}");
    assert_eq!(stat(tracer_common::stats::Stat::FreeArgMissing), 0, "{readings:?}");
}

#[unsafe(no_mangle)]
#[inline(never)]
extern "C" fn tracer_test_gate(x: u64) -> u64 {
    if std::hint::black_box(x) < 100 { std::hint::black_box(1) } else { std::hint::black_box(2) }
}

/// A copy probed at the jump into it counts only the passes the flags send
/// there: two probes at one jump with opposite conditions split its passes,
/// each counting those its condition holds for, and every pass one of them
/// leaves is `gate_other`, and its probe's (a hit priced with its calls).
/// The kernel takes two probes at one offset in one link.
#[test]
fn a_gate_counts_the_passes_its_condition_holds_for() {
    use iced_x86::{Decoder, DecoderOptions};
    use tracer_common::stats::Stat;
    const N: u64 = 300;
    std::hint::black_box(tracer_test_gate as extern "C" fn(u64) -> u64);
    std::hint::black_box(tracer_test_never_called as extern "C" fn() -> u64);
    let spec = [
        ProbeSpec::function("main", Program::CountCall, true, true),
        ProbeSpec::function("tracer_test_never_called", Program::CountCall, true, true),
    ];
    let (mut plan, elf) = own_plan(&spec, PlanOptions::default());
    let gate = elf.function("tracer_test_gate").expect("the gate's function");
    let code = elf.read_at(gate.file_offset, 64).expect("its code");
    let mut decoder = Decoder::with_ip(64, &code, 0, DecoderOptions::NONE);
    let jump = decoder.iter().find(iced_x86::Instruction::is_jcc_short_or_near).expect("a conditional jump");
    // iced numbers the conditions from 1.
    let condition = jump.condition_code() as u8 - 1;
    for (probe, condition) in [(0, condition), (1, condition ^ 1)] {
        plan.probes[probe].inline_sites = vec![plan::InlineSite {
            offset: gate.file_offset + jump.ip(),
            size: None,
            object: None,
            emulated: true,
            moved: true,
            stay: None,
            gate: Some(condition),
            jump: true,
            also: probe == 1,
        }];
    }
    let mut session = Session::load(plan, std::process::id(), &LoadOptions::default()).expect("the object loads");
    session.prepare(true).expect("programs load");
    session.attach_multi(std::process::id()).expect("attached");
    for i in 0..N {
        tracer_test_gate(i);
    }
    let readings = session.read().expect("the counters read");
    session.detach_multi(std::process::id());
    let (a, b) = (readings.probes[0].calls, readings.probes[1].calls);
    assert!(matches!((a, b), (100, 200) | (200, 100)), "{a} and {b} of {N} passes: {readings:?}");
    assert_eq!(readings.stats[Stat::GateOther as usize], N, "{readings:?}");
    // Each probe's other passes, under its slot, priced with its hits.
    for p in &readings.probes[..2] {
        assert_eq!((p.gate_other, p.hits()), (N - p.calls, N), "{readings:?}");
    }
    let others = readings.stats.iter().enumerate().filter(|&(i, _)| i != Stat::GateOther as usize);
    assert!(others.clone().all(|(_, &v)| v == 0), "{:?}", others.collect::<Vec<_>>());
}
