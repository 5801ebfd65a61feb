//! The table's header, once every probe is live: what is traced and how,
//! each probe whose counts are partial and why, how garbage collections
//! are seen, and which probes are single-stepped.

use std::io::Write;

use super::TableReporter;
use crate::{
    model::{Attached, Links},
    plan::coverage::Completeness,
};

impl<W: Write, E: Write> TableReporter<W, E> {
    pub(super) fn header(&mut self, info: &Attached) -> std::io::Result<()> {
        if let Some(line) = mode_line(info) {
            writeln!(self.out, "{line}")?;
        }
        let what = match (&info.pid, &info.exe) {
            (Some(pid), _) => match info.pid_in_namespace {
                Some(inner) => format!("PID {pid} (PID {inner} in its namespace)"),
                None => format!("PID {pid}"),
            },
            (None, Some(exe)) => format!("every process running {exe}"),
            (None, None) => "every process".to_owned(),
        };
        writeln!(
            self.out,
            "tracer: attached to {what} (Python {}, {}): {} probes live ({}){}{}",
            info.python.version,
            crate::text::display(&info.python.image),
            info.probes.len(),
            if info.links == Links::Multi { "uprobe-multi links" } else { "perf-event uprobes" },
            if info.call_sites.is_empty() {
                String::new()
            } else {
                let each: Vec<String> = info.call_sites.iter().map(|(f, n)| format!("{f} at {n} call sites")).collect();
                format!("; {}", each.join(", "))
            },
            if info.missing.is_empty() {
                String::new()
            } else {
                format!("; not in this build: {}", info.missing.join(", "))
            }
        )?;
        for i in &info.interpreters {
            let missing = if i.missing.is_empty() {
                String::new()
            } else {
                format!("; not in this build: {}", i.missing.join(", "))
            };
            writeln!(
                self.out,
                "tracer: interpreter: {} (Python {}): {} probes{missing}",
                crate::text::display(&i.image),
                i.version,
                i.probes.len()
            )?;
        }
        for (name, c) in info.coverage.iter().filter(|(_, c)| c.is_partial()) {
            let mut parts = Vec::new();
            if c.calls == Completeness::Partial {
                parts.push("calls");
            }
            if c.bytes == Completeness::Partial {
                parts.push("bytes");
            }
            if c.types == Some(Completeness::Partial) {
                parts.push("types");
            }
            let what = parts.join(" and ");
            let why = c.reason.as_deref().unwrap_or("some copies are not probed");
            let fix = c.fix.as_ref().map_or(String::new(), |f| format!("; fix: {f}"));
            let line = crate::text::line(&format!("{why}{fix}"));
            writeln!(self.out, "tracer: coverage: {name}: {what} PARTIAL: {line}")?;
        }
        if let Some(gc) = &info.gc {
            writeln!(self.out, "tracer: gc: {}", crate::text::line(&gc.detail))?;
            if let Some(caveat) = &gc.caveat {
                writeln!(self.out, "tracer: gc: PARTIAL: {}", crate::text::line(caveat))?;
            }
        }
        if let Some(growth) = &info.growth {
            self.growth_header(growth)?;
        }
        // By site where the attach says (inlined copies and call sites each
        // have their own instruction), else by each probe's placement.
        let stepped: Vec<String> = if info.sites.is_empty() {
            info.placements.iter().filter(|(_, p)| !p.emulated).map(|(name, _)| name.clone()).collect()
        } else {
            info.sites
                .iter()
                .filter(|(_, k)| k.single_stepped > 0)
                .map(|(name, k)| match k.emulated {
                    0 if k.single_stepped == 1 => name.clone(),
                    0 => format!("{name} (all {} sites)", k.single_stepped),
                    emulated => format!("{name} ({} of its {} sites)", k.single_stepped, emulated + k.single_stepped),
                })
                .collect()
        };
        if !stepped.is_empty() {
            // `tracer probes` plans as `attach --exact` places: the
            // profile's windows keep every probe inside its function and
            // the frees at their entries, where some are single-stepped.
            let see = if info.mode.as_deref() == Some("profile") {
                "as the profile's windows place them; `tracer probes` shows where --exact would"
            } else {
                "see `tracer probes`"
            };
            writeln!(
                self.out,
                "tracer: single-stepped, so each hit costs a debug trap ({see}): {}",
                stepped.join(", ")
            )?;
        }
        writeln!(self.out)?;
        self.out.flush()
    }
}

/// The first line: which mode runs, and its estimated cost to the target.
fn mode_line(info: &Attached) -> Option<String> {
    let mode = info.mode.as_deref()?;
    let what = match (mode, &info.exact_because) {
        ("profile", _) => "production profile".to_owned(),
        (_, Some(flag)) => format!("exact tracing (chosen by {flag}, which only exact tracing serves)"),
        _ => "exact tracing (--exact)".to_owned(),
    };
    let Some(e) = &info.estimated_cost else { return Some(format!("tracer: {what}")) };
    let percent = |f: f64| format!("{:.2}%", f * 100.0);
    let cost = match e.fraction {
        Some(f) => format!("estimated cost {} of the target's CPU time", percent(f)),
        None => format!("estimated cost unknown: {}", e.reason.as_deref().unwrap_or("no hit's cost")),
    };
    let budget = e.budget_fraction.map_or(String::new(), |b| format!(", budget {}", percent(b)));
    let basis = match (mode, e.exact_fraction) {
        // A share of the CPU time the probes run on is at most all of it:
        // near that, the hits would take many times the target's own time.
        ("profile", Some(full)) if full >= 0.995 => format!(
            "; exact tracing at the profile's sites would cost over 99% of it (its probes would take many times its own time), from {} hits in the first {:.3} s",
            e.hits, e.window_s
        ),
        ("profile", Some(full)) => format!(
            "; exact tracing at the profile's sites would cost {}, from {} hits in the first {:.3} s",
            percent(full),
            e.hits,
            e.window_s
        ),
        (_, Some(_)) => format!("; from {} hits in the first {:.2} s", e.hits, e.window_s),
        (_, None) => String::new(),
    };
    let warning = e.warning.as_ref().map_or(String::new(), |w| format!("; {w}"));
    Some(format!("tracer: {what}: {cost}{budget}{basis}{warning}"))
}

#[cfg(test)]
mod tests {
    use crate::{
        model::Event,
        report::{examples::attached, table::tests::render},
    };

    #[test]
    fn header_names_call_sites_and_single_stepped_probes() {
        use crate::plan::placement::Placement;
        let placed = Placement {
            offset: 7,
            instruction: "push %rbx".into(),
            emulated: true,
            reason: String::new(),
            function: None,
        };
        let mut info = attached(Some(12));
        info.probes = vec!["_Py_NewReference".into(), "_Py_Dealloc".into(), "PyObject_Free".into()];
        info.missing = vec![];
        info.placements = [
            ("_Py_NewReference".to_owned(), placed.clone()),
            ("_Py_Dealloc".to_owned(), Placement { instruction: "10989 calls".into(), ..placed }),
            ("PyObject_Free".to_owned(), Placement::at_entry("entry".into())),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            render(&[Event::Attached(info)]),
            "tracer: attached to PID 12 (Python 3.11.7, /lib/libpython3.11.so.1.0): 3 probes live (uprobe-multi links); \
             _Py_Dealloc at 10989 call sites\n\
             tracer: single-stepped, so each hit costs a debug trap (see `tracer probes`): PyObject_Free\n\n"
        );
    }

    #[test]
    fn the_header_counts_single_stepped_sites() {
        use crate::model::SiteKinds;
        let mut info = attached(Some(12));
        info.call_sites.clear();
        info.sites = [
            ("_Py_NewReference".to_owned(), SiteKinds { emulated: 1, single_stepped: 208 }),
            ("PyObject_Malloc".to_owned(), SiteKinds { emulated: 1, single_stepped: 0 }),
            ("_Py_Dealloc".to_owned(), SiteKinds { emulated: 0, single_stepped: 1 }),
        ]
        .into_iter()
        .collect();
        let text = render(&[Event::Attached(info.clone())]);
        assert!(
            text.contains(
                "tracer: single-stepped, so each hit costs a debug trap (see `tracer probes`): _Py_NewReference (208 of its 209 sites), _Py_Dealloc\n"
            ),
            "{text}"
        );
        // The profile places as `tracer probes` does not (it plans as
        // --exact): the header says so.
        info.mode = Some("profile".into());
        let text = render(&[Event::Attached(info)]);
        assert!(
            text.contains(
                "tracer: single-stepped, so each hit costs a debug trap (as the profile's windows place them; `tracer probes` shows where --exact would): _Py_NewReference"
            ),
            "{text}"
        );
    }
}
