//! What the run does once its probes are detached: waits for what the
//! summary still needs (a calibration, a heap census). The files written
//! from the summary are [`crate::report::written`]'s.

use tokio::time::sleep_until;

use super::{
    census,
    cost::{self, CostMeter},
    profile::Profile,
};
use crate::launch::{Child, signals::Signals};

/// Waits for a calibration still running and a heap census still running
/// (or a first one), each within its limit; a second `SIGINT` or
/// `SIGTERM` stops waiting at once, or with `child` (`tracer run`'s) is
/// passed on to it, as every signal is.
pub async fn wait_detached(
    cost: &mut CostMeter,
    mut profile: Option<&mut Profile>,
    signals: &mut Signals,
    child: Option<&Child>,
) {
    // Detached, so waiting costs the target nothing: a run shorter than
    // the calibration still ends with its cost, and one that ended while
    // a census was running (or before any) with its heap.
    let calibrated_by = tokio::time::Instant::now() + cost::CALIBRATION_WAIT;
    let census_by = tokio::time::Instant::now() + census::SUMMARY_WAIT;
    let mut census_wait = profile.is_some();
    loop {
        census_wait = census_wait && profile.as_deref_mut().is_some_and(Profile::census_pending);
        if !cost.calibrating() && !census_wait {
            break;
        }
        tokio::select! {
            biased;
            signal = signals.recv() => {
                if let Some(c) = child {
                    c.pass_on(signal);
                } else {
                    // Asked again to stop: at once, without a cost or the
                    // heap being read.
                    cost.give_up(None);
                    census_wait = false;
                }
            }
            () = sleep_until(calibrated_by), if cost.calibrating() => {
                cost.give_up(Some(format!("calibrating took over {} s", cost::CALIBRATION_WAIT.as_secs())));
            }
            () = sleep_until(census_by), if census_wait => census_wait = false,
            () = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
        }
    }
}

/// Waits for `child` (`tracer run`'s) to exit, passing signals on
/// meanwhile: after a run that ended before it did (`--duration`, an
/// error).
pub async fn wait_exit(child: &Child, signals: &mut Signals) -> Result<(), super::RunError> {
    let exit = super::exit::ProcessExit::watch(child.pid())?;
    loop {
        tokio::select! {
            () = exit.exited() => return Ok(()),
            signal = signals.recv() => child.pass_on(signal),
        }
    }
}
