//! One typed model of what tracer reports. The JSON Lines schema (docs/json.md,
//! "JSON output") is these types: producers fill them, and every output
//! (the table, the JSON, later an exporter, a live view, flame graphs)
//! reads them. Fields are only ever added, as `Option`s or empty lists
//! that are left out while unset, so that older lines still read.

mod attached;
mod bench;
mod cost;
mod events;
mod growth;
pub mod heap;
mod live;
mod notes;
mod plan_report;
mod processes;
mod snapshot;
mod stacks;

pub use attached::{Attached, Links, PythonInfo, SiteKinds};
pub use bench::{BenchEntry, BenchPython, BenchReport, BenchState};
pub use cost::{
    Budget, BudgetRefuses, Cost, CostEstimate, FIRST_WINDOW_SOURCE, GROWTH_SOURCE, ProfileCost, RATES_SOURCE, Slowdown,
    SourceCost,
};
pub use events::{End, EndKind, Event, Summary};
pub use growth::{
    Growth, GrowthCost, GrowthProbed, GrowthSampled, GrowthSite, GrowthStack, GrowthStopped, GrowthTakes,
    ZERO_SAMPLES_UPPER,
};
pub use live::{Leak, Leaks, Live, LiveDomain};
pub use notes::{Level, Note, NoteCode};
pub use plan_report::{CallSitesReport, LiveImplReport, PlanReport, PlannedProbeReport, SiteFileReport};
pub use processes::{InterpreterInfo, ProcessInfo};
pub use snapshot::{
    Counts, ExitedProcess, GC_MEMORY_FAILED_COVERED, Gc, GcGeneration, KERNEL_MISSES, LateCoverage, LateModule,
    MAP_BATCH_BUSY, MAP_BATCH_UNSUPPORTED, ProbeCounts, ProbeEstimate, Returned, Sizes, Snapshot, TypeCount, rate_told,
};
pub use stacks::{NativeFrame, NativeModule, Site, SiteFrame, StackCount, StackCoverage};
