//! Types shared by the BPF programs (`tracer-ebpf`) and the loader
//! (`tracer-user`). Everything here is `#[repr(C)]`, `Copy` and free of
//! implicit padding, because both sides read the same bytes out of BPF maps.
#![no_std]

pub mod counter;
pub mod gc;
pub mod growth;
pub mod heat;
pub mod live;
pub mod returns;
pub mod site;
pub mod sizes;
pub mod stack;
pub mod stats;
pub mod types;
pub mod unwind;

/// Names of the maps and globals, so the loader and the BPF object cannot
/// drift apart silently.
pub mod names {
    /// Per-CPU hash of [`crate::counter::Counter`] by
    /// [`crate::counter::CounterKey`] (process and probe slot).
    pub const COUNTERS_MAP: &str = "COUNTERS";
    /// Per-CPU hash of [`crate::returns::Returned`] by
    /// [`crate::counter::CounterKey`].
    pub const RETURNS_MAP: &str = "RETURNS";
    /// Per-CPU array of `u64`, indexed by [`crate::stats::Stat`].
    pub const STATS_MAP: &str = "STATS";
    /// Per-CPU hash of [`crate::types::TypeCounts`] by
    /// [`crate::types::TypeKey`] (process and type object), with `--types`.
    pub const TYPES_MAP: &str = "TYPES";
    /// Hash of type object addresses by [`crate::types::ObjectKey`]: the
    /// objects `--types` saw created and not yet destroyed.
    pub const OBJECTS_MAP: &str = "OBJECTS";
    /// BPF global: the pre-header sizes a freed block may start at before
    /// its object (`[u64; PRE_HEADERS]`).
    pub const PRE_HEADERS_GLOBAL: &str = "PRE_HEADERS_AT";
    /// Per-CPU array of [`crate::counter::Counter`] by
    /// [`crate::sizes::index`]: calls and bytes per domain and size bucket.
    pub const SIZES_MAP: &str = "SIZES";
    /// Array of `u32`, by probe slot: the [`crate::sizes::Domain`] of an
    /// allocating probe, [`crate::sizes::NO_DOMAIN`] for the others.
    pub const SLOT_DOMAINS_MAP: &str = "SLOT_DOMAINS";
    /// Array of `u32` by probe slot: 1 where the probe's events get stacks.
    pub const SLOT_STACKS_MAP: &str = "SLOT_STACKS";
    /// Hash of `u32` by thread id, with `--native`: the counter slot of
    /// the probed libc function a nested call site (inside another probed
    /// libc function) is about to call.
    pub const NESTED_MAP: &str = "NESTED";
    /// Hash of [`crate::stack::WalkConfig`] by thread-group id.
    pub const WALKS_MAP: &str = "WALKS";
    /// Hash of [`crate::stack::Stack`] by its hash.
    pub const STACKS_MAP: &str = "STACKS";
    /// Per-CPU hash of [`crate::counter::Counter`] by
    /// [`crate::stack::StackKey`].
    pub const STACK_COUNTS_MAP: &str = "STACK_COUNTS";
    /// BPF global: 1 with `--native-stacks`.
    pub const NATIVE_ON_GLOBAL: &str = "NATIVE_ON";
    /// Array of [`crate::unwind::Row`]: every module's unwind rows.
    pub const UNWIND_ROWS_MAP: &str = "UNWIND_ROWS";
    /// Hash of [`crate::unwind::Page`] by [`crate::unwind::PageKey`].
    pub const NATIVE_PAGES_MAP: &str = "NATIVE_PAGES";
    /// Hash of [`crate::unwind::NativeStack`] by its hash.
    pub const NATIVE_STACKS_MAP: &str = "NATIVE_STACKS";
    /// Per-CPU array of one [`crate::heat::Heat`]: hits per site bucket.
    pub const HEAT_MAP: &str = "HEAT";
    /// BPF global: whether the programs count [`HEAT_MAP`] (the budget's
    /// windows through uprobe-multi links).
    pub const HEAT_ON_GLOBAL: &str = "HEAT_ON";
    /// BPF global: whether any probe records stacks.
    pub const STACKS_ON_GLOBAL: &str = "STACKS_ON";
    /// BPF global: `--sample N`.
    pub const SAMPLE_EVERY_GLOBAL: &str = "SAMPLE_EVERY";
    /// BPF global: the offset of `ob_type` in an object, from the version
    /// module.
    pub const OB_TYPE_OFFSET_GLOBAL: &str = "OB_TYPE_OFFSET";
    /// BPF global: thread-group id the probes count for (0 = any process).
    pub const TARGET_TGID_GLOBAL: &str = "TARGET_TGID";
    /// Per-CPU hash of [`crate::gc::GcTotals`] by [`crate::gc::GcKey`]
    /// (process and generation).
    pub const GC_TOTALS_MAP: &str = "GC_TOTALS";
    /// LRU hash of [`crate::gc::GcRunning`] by thread id: each thread's
    /// collection in flight.
    pub const GC_RUNNING_MAP: &str = "GC_RUNNING";
    /// Hash of [`crate::growth::PoolSample`] by [`crate::growth::PoolKey`]:
    /// with `--growth`, each sampled pool's taker.
    pub const GROWTH_POOLS_MAP: &str = "GROWTH_POOLS";
    /// Hash of [`crate::growth::MappedSample`] by
    /// [`crate::growth::MappedKey`]: the C library's heap growth sampled.
    pub const GROWTH_MAPPED_MAP: &str = "GROWTH_MAPPED";
    /// Hash of each target's program break (`u64`) by its tgid (`u32`), as
    /// the last `brk` left it; the loader seeds it.
    pub const GROWTH_BRK_MAP: &str = "GROWTH_BRK";
    /// Array of one `u32`: whether `growth_arena` ends each new arena's
    /// mapped sample (see [`crate::growth::ARENA_SIZE`]).
    pub const GROWTH_ARENAS_SEEN_MAP: &str = "GROWTH_ARENAS_SEEN";
    /// Per-CPU array of one [`crate::growth::GrowthCounts`].
    pub const GROWTH_COUNTS_MAP: &str = "GROWTH_COUNTS";
    /// BPF global: one take in this many is sampled (`u32`).
    pub const GROWTH_EVERY_GLOBAL: &str = "GROWTH_EVERY";
    /// Hash of [`crate::live::LiveEntry`] by [`crate::live::LiveKey`]:
    /// the outstanding blocks, with `--live`; `--live-max` sizes it.
    pub const LIVE_MAP: &str = "LIVE";
    /// LRU hash of [`crate::live::Frames`] by thread id.
    pub const FRAMES_MAP: &str = "FRAMES";
    /// LRU hash by thread id of a walk that came before its API call's
    /// frame, with `--live --stacks`.
    pub const WALKED_MAP: &str = "WALKED";
    /// LRU hash by thread id of a mapping syscall's arguments, from its
    /// entry to its exit (growth of the C library's heap).
    pub const GROWTH_CALLS_MAP: &str = "GROWTH_CALLS";
    /// Array of one [`crate::live::Frames`]: the stack each thread's
    /// calls start from (empty).
    pub const EMPTY_FRAMES_MAP: &str = "EMPTY_FRAMES";
    /// Per-CPU array of [`crate::live::LiveCounts`] by domain.
    pub const LIVE_COUNTS_MAP: &str = "LIVE_COUNTS";
    /// Array of [`crate::live::Role`] by probe slot.
    pub const SLOT_LIVE_MAP: &str = "SLOT_LIVE";
    /// Array of one [`crate::live::Pymalloc`]: where the target's pymalloc
    /// state is, for `--live` on builds that inline the allocator API.
    pub const PYMALLOC_MAP: &str = "PYMALLOC";
    /// BPF global: whether `--live` is on.
    pub const LIVE_ON_GLOBAL: &str = "LIVE_ON";
    /// Bench-only: a table shaped as [`LIVE_MAP`], for `meta_insert` and
    /// `meta_lookup`.
    pub const META_LIVE_MAP: &str = "META_LIVE";

    /// The BPF programs, by their function names in tracer-ebpf.
    pub mod programs {
        /// Counts calls only.
        pub const COUNT_CALL: &str = "count_call";
        /// Counts calls and the size in the first argument.
        pub const COUNT_SIZE_ARG0: &str = "count_size_arg0";
        /// Counts calls and the size in the second argument.
        pub const COUNT_SIZE_ARG1: &str = "count_size_arg1";
        /// Counts calls and nelem × elsize.
        pub const COUNT_CALLOC: &str = "count_calloc";
        /// `--native`: libc's allocating functions, with the size where
        /// each takes it (see `tracer_user::plan::native`), and `free`.
        pub const NATIVE_SIZE_ARG0: &str = "native_size_arg0";
        pub const NATIVE_SIZE_ARG1: &str = "native_size_arg1";
        pub const NATIVE_SIZE_ARG2: &str = "native_size_arg2";
        pub const NATIVE_CALLOC: &str = "native_calloc";
        pub const NATIVE_CALL: &str = "native_call";
        /// `munmap`: the length in the second argument, released.
        pub const NATIVE_RELEASE_ARG1: &str = "native_release_arg1";
        /// A call site, inside one probed libc function, of another
        /// (glibc's `realloc` calling `malloc`): marks the thread so that
        /// the callee counts the call as nested.
        pub const NATIVE_NESTED: &str = "native_nested";
        /// Counts a call at the allocator implementation a free's function
        /// pointer holds (see `tracer_user::plan::slots`), but apart, as
        /// nested, where the thread was marked by another API function
        /// that shares it or by a direct call in the image.
        pub const COUNT_CLAIMED: &str = "count_claimed";
        /// Does nothing (the bare cost of a hit).
        pub const EMPTY: &str = "empty";
        /// Bench-only (tracer-ebpf/src/experiment.rs): the pointer in the
        /// first argument put in a table shaped as the live table and taken out; the
        /// same and looked up 32 times; pymalloc's pool header read 32
        /// times; glibc's chunk size word read 32 times.
        pub const META_INSERT: &str = "meta_insert";
        pub const META_LOOKUP: &str = "meta_lookup";
        pub const META_POOL: &str = "meta_pool";
        pub const META_CHUNK: &str = "meta_chunk";
        /// Records rax at a return site.
        pub const RET_VALUE: &str = "ret_value";
        /// Records the return value through a uretprobe.
        pub const RET_VALUE_URET: &str = "ret_value_uret";
        /// With `--live`, at an allocating API function's entry: keeps the
        /// call's domain for the implementation it calls.
        pub const LIVE_ALLOC: &str = "live_alloc";
        /// With `--live`, at a free's entry: the same, for a free.
        pub const LIVE_FREE: &str = "live_free";
        /// With `--live`, at an allocator implementation's entry.
        pub const LIVE_IMPL: &str = "live_impl";
        /// With `--live`, at an implementation's `ret`s.
        pub const LIVE_RET: &str = "live_ret";
        /// With `--live`, at an implementation's return, by uretprobe.
        pub const LIVE_RET_URET: &str = "live_ret_uret";
        /// Counts a call at an inlined copy, reading the size where the
        /// attach cookie says it is (see [`crate::site`]).
        pub const COUNT_SITE: &str = "count_site";
        /// Counts a new reference and the new object's type, reading the
        /// object where the attach cookie says (see [`crate::site`]).
        pub const COUNT_OBJECT: &str = "count_object";
        /// Counts a call of the object domain's free and, with `--types`,
        /// the destruction of the object whose block it frees, reading the
        /// pointer where the attach cookie says.
        pub const FREE_OBJECT: &str = "free_object";
        /// A collection starts: records the thread's start and the
        /// generation, where the cookie says (see [`crate::gc`]).
        pub const GC_START: &str = "gc_start";
        /// A collection ends: adds it, its duration and the objects found
        /// unreachable (where the cookie says: a marker's argument, or rax
        /// at the collection function's return).
        pub const GC_DONE: &str = "gc_done";
        /// With `--growth`, in pymalloc's `allocate_from_new_pool` where
        /// `usable_arenas` is where the cookie says: a pool taken from
        /// empty (see [`crate::growth`]).
        pub const GROWTH_TAKE: &str = "growth_take";
        /// With `--growth`, in each of `allocate_from_new_pool`'s carve
        /// blocks, the carved pool's address where the cookie says: a
        /// never used pool taken (see [`crate::growth`]).
        pub const GROWTH_CARVE: &str = "growth_carve";
        /// With `--growth`, at the call that marks a new arena used, its
        /// address where the cookie says: the arena's first pool taken.
        pub const GROWTH_ARENA: &str = "growth_arena";
        /// The C library's heap (see [`crate::growth::MappedKey`]):
        /// programs on syscall tracepoints, each with its tracepoint (in
        /// the `syscalls` group).
        pub const GROWTH_MAPPED: [(&str, &str); 6] = [
            ("growth_mmap_enter", "sys_enter_mmap"),
            ("growth_mmap_exit", "sys_exit_mmap"),
            ("growth_munmap_enter", "sys_enter_munmap"),
            ("growth_mremap_enter", "sys_enter_mremap"),
            ("growth_mremap_exit", "sys_exit_mremap"),
            ("growth_brk_exit", "sys_exit_brk"),
        ];
    }
}

/// The license the BPF object declares, NUL-terminated as the kernel wants
/// it; GPL-compatible, which the helpers tracer uses require.
pub const LICENSE: &[u8] = b"Dual MIT/GPL\0";
