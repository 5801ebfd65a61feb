//! Per-CPU counters of everything a BPF program could not do.
//!
//! Nothing in the BPF programs fails silently: each early return bumps one
//! of these, and `tracer` reports any that are non-zero.

/// Index into the `STATS` map.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stat {
    /// A hit whose probe slot names no probe: in BPF, an attach cookie too
    /// large for a slot; in userspace, a counter or return entry whose slot
    /// is past the last probe (tracer adds those hits when it reads).
    SlotOutOfRange = 0,
    /// A function argument could not be read from the registers.
    ArgMissing = 1,
    /// A hit from a process other than the target (the kernel's per-process
    /// filter should make this impossible; counted to prove it).
    OtherProcess = 2,
    /// calloc's nelem × elsize overflowed 64 bits and was saturated.
    SizeOverflow = 3,
    /// The counters map was full: a new (process, probe) pair could not be
    /// added, so its hits were not counted.
    MapFull = 4,
    /// With `--types`: the object's type could not be read from the
    /// target's memory, so the creation is counted but not its type.
    TypeUnread = 5,
    /// With `--types`: the types map was full, so a new (process, type)
    /// pair could not be added and that creation's type was not counted.
    TypesFull = 6,
    /// With `--stacks`: a walk was cut at `--depth` (or the walk's bound);
    /// the event is counted under the truncated stack.
    StackTruncated = 7,
    /// With `--stacks`: a read of the target's memory failed mid-walk, so
    /// the event has no stack.
    StackReadFailed = 8,
    /// With `--stacks`: the event's process has no walk configuration (it
    /// appeared after the attach and tracer has not seen it yet).
    StackNoConfig = 9,
    /// With `--stacks`: the event's thread has no Python thread state (a
    /// thread Python did not create, or none holds the GIL).
    StackNoThread = 10,
    /// With `--stacks`: the thread state found belongs to another thread
    /// (the GIL's holder while this thread allocates without the GIL).
    StackOtherThread = 11,
    /// With `--stacks`: the stacks or stack-counts map was full.
    StacksFull = 12,
    /// A collection ended on a thread with none in flight: its start was
    /// not seen (it began before the attach, or the in-flight map dropped
    /// it), so it is not counted; or a thread id reused by another process
    /// held a start whose end never came.
    GcUnmatched = 13,
    /// A collection started on a thread whose previous collection's end
    /// was not seen: that previous one is not counted. CPython never runs
    /// a collection inside another on one thread, so its end was lost (a
    /// done probe not yet attached when it ended); the new start replaces
    /// it, so that one lost end costs one collection, not every later one.
    GcUnended = 14,
    /// A GC marker's (or the collection function's) argument could not be
    /// read: the collection is counted under an unknown generation, or
    /// without its objects.
    GcArgMissing = 15,
    /// A map of the GC probes was full: the collection was not counted.
    GcFull = 16,
    /// With `--native`: the nested-calls map was full at a nested call
    /// site, so the call it makes (realloc's `malloc`) is counted again
    /// under its function.
    NestedFull = 17,
    /// With `--native-stacks`: a native unwind was cut at its bound; the
    /// event is counted under the cut stack.
    NativeTruncated = 18,
    /// With `--native-stacks`: an unwind reached a pc in no mapping tracer
    /// knows (JIT code, the vDSO, a module mapped after tracer read the
    /// maps); the stack is kept up to there.
    NativeNoMapping = 19,
    /// With `--native-stacks`: an unwind reached a pc its module's unwind
    /// tables do not cover (no `.eh_frame`, or a gap).
    NativeNoInfo = 20,
    /// With `--native-stacks`: an unwind reached a rule the BPF unwinder
    /// does not follow (a DWARF expression).
    NativeUnsupported = 21,
    /// With `--native-stacks`: a read of the stack failed mid-unwind.
    NativeReadFailed = 22,
    /// With `--native-stacks`: the native stacks map was full, so the
    /// event was counted without its native frames.
    NativeFull = 23,
    /// With `--types`: the objects table was full, so a new object was
    /// counted as created but not kept, and its destruction cannot be seen
    /// (its type's live count is then too high by one).
    ObjectsFull = 24,
    /// With `--types`: the pointer a free was given could not be read
    /// where the probe's cookie says, so a destruction may be missed.
    FreeArgMissing = 25,
    /// With `--live`: the live table was full, so a block was not put in
    /// it (its domain's `dropped` counts it too).
    LiveFull = 26,
    /// With `--live`: an allocator implementation was entered with no API
    /// call of its kind on its thread's stack (or far below it), or
    /// returned with no frame at its stack pointer: its block was not put
    /// in the table, nor taken out.
    LiveUnmatched = 27,
    /// With `--live`: a call in flight could not be kept (a thread's frame
    /// stack was full, or the map of threads).
    LivePendingFull = 28,
    /// With `--live` and `--stacks`: a block was put in the table without
    /// its Python stack, though its function's events get stacks (the
    /// walk's result did not reach the call's frame: a thread pushed out
    /// of the in-flight maps); `--leaks` says so for that block.
    LiveNoStack = 29,
    /// A hit at a conditional jump probed for the inlined copy it leads
    /// into (`tracer probes`: "at the jump into the copy"), where the jump
    /// went the other way: no event, only the hit's cost. Not a loss.
    GateOther = 30,
}

/// Number of entries in the `STATS` map.
pub const STAT_COUNT: u32 = 31;

impl Stat {
    /// Every stat, in map order (the JSON `stats` keys, in this order).
    pub const ALL: [Self; STAT_COUNT as usize] = [
        Self::SlotOutOfRange,
        Self::ArgMissing,
        Self::OtherProcess,
        Self::SizeOverflow,
        Self::MapFull,
        Self::TypeUnread,
        Self::TypesFull,
        Self::StackTruncated,
        Self::StackReadFailed,
        Self::StackNoConfig,
        Self::StackNoThread,
        Self::StackOtherThread,
        Self::StacksFull,
        Self::GcUnmatched,
        Self::GcUnended,
        Self::GcArgMissing,
        Self::GcFull,
        Self::NestedFull,
        Self::NativeTruncated,
        Self::NativeNoMapping,
        Self::NativeNoInfo,
        Self::NativeUnsupported,
        Self::NativeReadFailed,
        Self::NativeFull,
        Self::ObjectsFull,
        Self::FreeArgMissing,
        Self::LiveFull,
        Self::LiveUnmatched,
        Self::LivePendingFull,
        Self::LiveNoStack,
        Self::GateOther,
    ];

    /// Stable name used in the table and the JSON output.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::SlotOutOfRange => "slot_out_of_range",
            Self::ArgMissing => "arg_missing",
            Self::OtherProcess => "other_process",
            Self::SizeOverflow => "size_overflow",
            Self::MapFull => "map_full",
            Self::TypeUnread => "type_unread",
            Self::TypesFull => "types_full",
            Self::StackTruncated => "stack_truncated",
            Self::StackReadFailed => "stack_read_failed",
            Self::StackNoConfig => "stack_no_config",
            Self::StackNoThread => "stack_no_thread",
            Self::StackOtherThread => "stack_other_thread",
            Self::StacksFull => "stacks_full",
            Self::GcUnmatched => "gc_unmatched",
            Self::GcUnended => "gc_unended",
            Self::GcArgMissing => "gc_arg_missing",
            Self::GcFull => "gc_full",
            Self::NestedFull => "nested_full",
            Self::NativeTruncated => "native_truncated",
            Self::NativeNoMapping => "native_no_mapping",
            Self::NativeNoInfo => "native_no_info",
            Self::NativeUnsupported => "native_unsupported",
            Self::NativeReadFailed => "native_read_failed",
            Self::NativeFull => "native_full",
            Self::ObjectsFull => "objects_full",
            Self::FreeArgMissing => "free_arg_missing",
            Self::LiveFull => "live_full",
            Self::LiveUnmatched => "live_unmatched",
            Self::LivePendingFull => "live_pending_full",
            Self::LiveNoStack => "live_no_stack",
            Self::GateOther => "gate_other",
        }
    }

    /// Whether a non-zero value means lost or wrong counts (as opposed to a
    /// merely noteworthy event).
    #[must_use]
    pub const fn is_loss(self) -> bool {
        // A stack miss loses a stack, never an event: the event is counted
        // already, and the stack coverage says how many have no stack.
        !matches!(
            self,
            Self::OtherProcess
                | Self::SizeOverflow
                | Self::StackTruncated
                | Self::StackReadFailed
                | Self::StackNoConfig
                | Self::StackNoThread
                | Self::StackOtherThread
                | Self::StacksFull
                | Self::NativeTruncated
                | Self::NativeNoMapping
                | Self::NativeNoInfo
                | Self::NativeUnsupported
                | Self::NativeReadFailed
                | Self::NativeFull
                | Self::LiveNoStack
                | Self::GateOther
        )
    }
}
