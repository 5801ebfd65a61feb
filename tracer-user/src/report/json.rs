//! JSON Lines on stdout: each event of [`crate::model`] as one line.

use std::io::Write;

use super::Reporter;
use crate::model::Event;

/// Writes one JSON object per line and flushes it, so a consumer reading a
/// pipe sees each event as it happens; notes also go to `err` for a person.
pub struct JsonReporter<W: Write, E: Write> {
    out: W,
    err: E,
}

impl<W: Write, E: Write> JsonReporter<W, E> {
    pub const fn new(out: W, err: E) -> Self {
        Self { out, err }
    }
}

impl<W: Write, E: Write> Reporter for JsonReporter<W, E> {
    fn event(&mut self, event: &Event) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.out, event)?;
        self.out.write_all(b"\n")?;
        self.out.flush()?;
        if let Event::Note(note) = event {
            super::note_line(&mut self.err, note)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::{
        model::{End, LateCoverage, LateModule, Level, Note, NoteCode, Summary},
        report::examples::{attached, budget_snapshot, snapshot},
    };

    fn lines(events: &[Event]) -> (Vec<Value>, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut r = JsonReporter::new(&mut out, &mut err);
        for e in events {
            r.event(e).unwrap();
        }
        let values = String::from_utf8(out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        (values, String::from_utf8(err).unwrap())
    }

    #[test]
    fn schema_of_each_line() {
        let (out, _) = lines(&[
            Event::Attached(attached(Some(12))),
            Event::Interval(snapshot(1000, 1)),
            Event::Summary(Summary::new(snapshot(2500, 2), End::Signal("SIGINT"))),
        ]);
        assert_eq!(
            out[0],
            json!({"type":"attached","pid":12,"exe":null,"python":{"version":"3.11.7","image":"/lib/libpython3.11.so.1.0"},
                   "probes":["_Py_NewReference","PyObject_Malloc"],"missing":["PyMem_RawCalloc"],"links":"multi","returns":{},"return_costs_ns":null,"call_sites":{"_Py_Dealloc":10989},"placements":{},
                   "measures_bytes":["PyObject_Malloc"]})
        );
        assert_eq!(out[1]["type"], "interval");
        assert_eq!(out[1]["elapsed_s"], 1.0);
        assert_eq!(out[1]["probes"]["PyObject_Malloc"], json!({"calls":4,"bytes":4000}));
        assert_eq!(out[1]["stats"]["arg_missing"], 0);
        assert_eq!(out[1]["pids"]["77"]["PyObject_Malloc"], json!({"calls":4,"bytes":4000}));
        assert_eq!(out[1]["stats"]["kernel_recursion_misses"], 0);
        assert_eq!(out[1]["late_modules"], json!([]));
        assert_eq!(out[2]["type"], "summary");
        assert_eq!(out[2]["end"], "signal");
        assert_eq!(out[2]["signal"], "SIGINT");
        assert_eq!(out[2]["probes"]["_Py_NewReference"], json!({"calls":20,"bytes":0}));
        // Report order is table order, not alphabetical.
        let keys: Vec<_> = out[2]["probes"].as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["_Py_NewReference", "PyObject_Malloc"]);
        let (out, _) = lines(&[Event::Summary(Summary::new(snapshot(1, 1), End::TargetExit))]);
        assert_eq!(out[0]["end"], "target-exit");
        assert!(out[0].get("signal").is_none());
    }

    #[test]
    fn budget_fields() {
        let sample = budget_snapshot(3, 0.005, (100.0, Some([90.0, 110.0])));
        let (out, _) = lines(&[Event::Interval(sample)]);
        assert_eq!(out[0]["probes"]["_Py_NewReference"]["calls"], 10);
        assert_eq!(
            out[0]["probes"]["_Py_NewReference"]["estimate"],
            json!({"calls_per_s": 100.0, "calls_per_s_ci95": [90.0, 110.0], "bytes_per_s": 0.0, "bytes_per_s_ci95": null})
        );
        assert_eq!(out[0]["probes"]["PyObject_Malloc"]["estimate"]["bytes_per_s"], 40000.0);
        let b = &out[0]["budget"];
        assert_eq!(b["estimates"], true);
        assert_eq!(b["percent"], 1.0);
        assert_eq!(b["windows"], 3);
        assert_eq!(b["traced_fraction"], 0.01);
        assert_eq!(b["estimated_overhead_fraction"], 0.005);
        assert_eq!(b["hit_cost_ns"]["emulated"], 500.0);
        // Budget comes before the probes, as docs/json.md's schema shows.
        let keys: Vec<_> = out[0].as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["type", "elapsed_s", "budget", "probes", "pids", "stats", "late_modules"]);
    }

    #[test]
    fn cost_fields() {
        use crate::{model::Cost, plan::HitCosts};
        let mut sample = snapshot(1000, 1);
        let (out, _) = lines(&[Event::Interval(sample.clone())]);
        assert!(out[0].get("cost").is_none(), "no cost before it is known");
        sample.cost = Some(Cost {
            estimate: true,
            overhead_fraction: Some(0.034),
            overhead_fraction_low: None,
            tracer_cpu_s: 0.034,
            target_cpu_s: 1.0,
            hits: 2267,
            unpriced_hits: 0,
            hit_cost_ns: HitCosts { single_stepped_ns: 15_000.0, emulated_ns: 500.0, calibrated_unix_s: None },
        });
        let (out, _) = lines(&[Event::Summary(Summary::new(sample, End::Duration))]);
        assert_eq!(
            out[0]["cost"],
            json!({"estimate":true,"overhead_fraction":0.034,"tracer_cpu_s":0.034,"target_cpu_s":1.0,"hits":2267,
                   "hit_cost_ns":{"single_stepped":15000.0,"emulated":500.0}})
        );
    }

    #[test]
    fn late_modules_say_from_when() {
        let mut sample = snapshot(3000, 1);
        sample.late_modules = vec![
            LateModule {
                path: "/venv/_psutil_linux.abi3.so".into(),
                since_s: 2.0,
                coverage: LateCoverage::Sites { symbol: "_Py_Dealloc".into(), sites: 58, escape: None },
            },
            LateModule {
                path: "/venv/gone.so".into(),
                since_s: 2.5,
                coverage: LateCoverage::Failed { error: "cannot read it".into() },
            },
        ];
        let (out, _) = lines(&[Event::Summary(Summary::new(sample, End::Duration))]);
        assert_eq!(
            out[0]["late_modules"],
            json!([
                {"path": "/venv/_psutil_linux.abi3.so", "since_s": 2.0, "symbol": "_Py_Dealloc", "sites": 58, "escape": null},
                {"path": "/venv/gone.so", "since_s": 2.5, "error": "cannot read it"},
            ])
        );
    }

    #[test]
    fn notes_are_events_and_lines_for_a_person() {
        let note = Note::new(Level::Note, NoteCode::LateModule, "x.so was mapped after attaching");
        let (out, err) = lines(&[Event::Note(note)]);
        assert_eq!(
            out[0],
            json!({"type":"note","level":"note","code":"late_module","message":"x.so was mapped after attaching"})
        );
        assert_eq!(err, "tracer: note: x.so was mapped after attaching\n");
    }
}
