//! How probes are planned, as the flags ask, and the one place the
//! plan's options are made: what was asked, with what calibration measured
//! of reading a return value.

use crate::{
    plan::{self, ImageRef, PlacementMode, Plan, PlanError, PlanOptions, returns::ReturnCosts},
    probe::{ProbeSpec, Program},
};

/// Bench-only: `TRACER_BENCH_PROGRAM=empty` makes `tracer attach` put the
/// program that does nothing at every site it plans, the kernel's floor at
/// those very sites (`cargo xtask bench`'s LTO section); it then counts
/// nothing. Not for production.
pub const BENCH_PROGRAM: &str = "TRACER_BENCH_PROGRAM";

/// The program [`BENCH_PROGRAM`] puts at every site, if set; `Err` where it
/// names none.
pub fn bench_program() -> Result<Option<Program>, String> {
    match std::env::var_os(BENCH_PROGRAM) {
        None => Ok(None),
        Some(v) if v == "empty" => Ok(Some(Program::Empty)),
        Some(v) => Err(format!(
            "{BENCH_PROGRAM}={} (a bench-only knob) names no program tracer knows; the one it takes is empty",
            v.to_string_lossy()
        )),
    }
}

/// How to plan probes: what is asked, before calibration says what
/// reading a return value costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(clippy::struct_excessive_bools, reason = "one switch per thing a plan may do")]
pub struct Planning {
    /// Where in each function.
    pub placement: PlacementMode,
    /// Attach this program to every probe instead of its own (`tracer
    /// bench`'s setups, calibration).
    pub program: Option<Program>,
    /// `--returns`: read what the allocating functions return.
    pub returns: bool,
    /// Probe the inlined copies the DWARF lists too (not `--no-inlined`).
    pub inlined: bool,
    /// `--types`: count new references by their object's type.
    pub types: bool,
    /// `--live`: keep the outstanding blocks.
    pub live: bool,
}

impl Default for Planning {
    fn default() -> Self {
        Self {
            // `auto` is resolved by what runs (config, bench, probes).
            placement: PlacementMode::Inside,
            program: None,
            returns: false,
            inlined: true,
            types: false,
            live: false,
        }
    }
}

impl Planning {
    /// Whether the plan reads return values, and so needs their costs
    /// calibrated first: `--returns` on the API functions, `--live` on the
    /// allocator implementations.
    #[must_use]
    pub const fn reads_returns(&self) -> bool {
        self.returns || self.live
    }

    /// Plans `specs` in `image`; `costs`, when calibrated, pick how each
    /// return value is read.
    pub fn plan(
        &self,
        image: ImageRef<'_>,
        specs: &[ProbeSpec],
        costs: Option<ReturnCosts>,
    ) -> Result<Plan, PlanError> {
        plan::plan(image, specs, self.options(costs))
    }

    /// The C library's functions (`--native`), planned as the
    /// interpreter's, except: call sites are for the interpreter's
    /// functions (libc's are probed in their own code), libc has no
    /// inlined copies to probe nor objects to count by type, and its
    /// functions' roles in the live table are not an API function's (the
    /// native plan sets them).
    #[must_use]
    pub const fn for_libc(self) -> Self {
        let placement = match self.placement {
            PlacementMode::Auto | PlacementMode::CallSites => PlacementMode::Inside,
            other => other,
        };
        Self { placement, inlined: false, types: false, live: false, ..self }
    }

    /// The plan's options: the one place they are made.
    #[must_use]
    pub fn options(&self, costs: Option<ReturnCosts>) -> PlanOptions {
        PlanOptions {
            program_override: self.program,
            placement: self.placement,
            returns: costs.filter(|_| self.returns),
            inlined: self.inlined,
            types: self.types,
            live: self.live,
            live_costs: costs.filter(|_| self.live),
        }
    }
}
