//! The attach header: what the run attached, as the model's [`Attached`].

use super::cost::CostMeter;
use crate::{
    discover::Resolved,
    kernel::Session,
    model::{Attached, Links, PythonInfo},
};

/// The attach header of a session.
pub fn attached_event(session: &Session, r: &Resolved, links: Links, cost: &CostMeter) -> Attached {
    let probes = &session.plan().probes;
    Attached {
        mode: None,
        exact_because: None,
        estimated_cost: None,
        // Set by the run, from when it started.
        started_unix_s: None,
        pid: r.pid(),
        exe: r.exe.as_ref().map(|e| e.display().to_string()),
        python: PythonInfo { version: r.version.to_string(), image: r.display_path.display().to_string() },
        pid_in_namespace: r.ns_pid,
        interpreters: Vec::new(),
        probes: probes.iter().map(|p| p.symbol.to_owned()).collect(),
        missing: session.plan().missing.iter().map(|m| (*m).to_owned()).collect(),
        links,
        returns: probes.iter().filter_map(|p| Some((p.symbol.to_owned(), p.returns.clone()?))).collect(),
        return_costs_ns: None,
        call_sites: probes
            .iter()
            .filter_map(|p| Some((p.symbol.to_owned(), p.call_sites.as_ref().map(|c| c.emulated + c.stepped)?)))
            .collect(),
        call_sites_asked: cost.call_sites_asked(),
        placements: probes.iter().map(|p| (p.symbol.to_owned(), p.placement.clone())).collect(),
        measures_bytes: probes.iter().filter(|p| p.program.counts_bytes()).map(|p| p.symbol.to_owned()).collect(),
        coverage: probes.iter().map(|p| (p.symbol.to_owned(), p.coverage.clone())).collect(),
        sites: cost.sites(session.plan()),
        gc: None,
        growth: None,
        native: probes.iter().find_map(|p| p.file.as_ref()).map(|f| f.display_path.display().to_string()),
    }
}
