//! JSON Lines on stdout; the schema is documented in the README and only
//! ever gains fields.

use std::io::Write;

use serde_json::{Map, Value, json};

use super::{AttachInfo, End, LateCoverage, LateModuleSample, Reporter, Sample};
use crate::returns::ReturnPlan;

/// Writes one JSON object per line and flushes it, so a consumer reading a
/// pipe sees each event as it happens.
pub struct JsonReporter<W: Write> {
    out: W,
}

impl<W: Write> JsonReporter<W> {
    pub const fn new(out: W) -> Self {
        Self { out }
    }

    fn emit(&mut self, value: &Value) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.out, value)?;
        self.out.write_all(b"\n")?;
        self.out.flush()
    }
}

/// `{"how":"sites","sites":[{"offset","instruction","emulated"}],"reason"}`
/// or `{"how":"uretprobe","reason"}`.
#[must_use]
pub fn return_plan(plan: &ReturnPlan) -> Value {
    match plan {
        ReturnPlan::Sites { sites, reason } => json!({
            "how": plan.how(),
            "sites": sites.iter().map(|s| json!({"offset": s.offset, "instruction": s.instruction, "emulated": s.emulated}))
                .collect::<Vec<_>>(),
            "reason": reason,
        }),
        ReturnPlan::Uretprobe { reason } => json!({"how": plan.how(), "reason": reason}),
    }
}

fn counts(sample: &Sample) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("elapsed_s".into(), json!(sample.elapsed.as_secs_f64()));
    let mut probes: Map<String, Value> = sample
        .probes
        .iter()
        .map(|p| {
            let mut v = json!({"calls": p.calls, "bytes": p.bytes});
            if let (Some(r), Value::Object(o)) = (p.returned, &mut v) {
                o.insert(
                    "returned".into(),
                    json!({"returns": r.returns, "null": r.null, "pointer_sum": r.pointer_sum}),
                );
            }
            (p.name.to_owned(), v)
        })
        .collect();
    if let Some(e) = &sample.estimate {
        for (p, (calls, bytes)) in sample.probes.iter().zip(&e.rates) {
            if let Some(Value::Object(o)) = probes.get_mut(p.name) {
                o.insert(
                    "estimate".into(),
                    json!({
                        "calls_per_s": calls.per_s,
                        "calls_per_s_ci95": calls.ci95.map(|(lo, hi)| [lo, hi]),
                        "bytes_per_s": bytes.per_s,
                        "bytes_per_s_ci95": bytes.ci95.map(|(lo, hi)| [lo, hi]),
                    }),
                );
            }
        }
        m.insert(
            "budget".into(),
            json!({
                "estimates": true,
                "percent": e.budget * 100.0,
                "windows": e.windows,
                "traced_s": e.traced.as_secs_f64(),
                "traced_fraction": e.traced_fraction(sample.elapsed),
                "estimated_overhead_fraction": e.overhead_fraction(sample.elapsed),
                "hit_cost_ns": {"single_stepped": e.costs.single_stepped_ns, "emulated": e.costs.emulated_ns},
            }),
        );
    }
    m.insert("probes".into(), Value::Object(probes));
    let pids: Map<String, Value> = sample
        .processes
        .iter()
        .map(|proc| {
            let per: Map<String, Value> = sample
                .probes
                .iter()
                .zip(&proc.counts)
                .map(|(p, (calls, bytes))| (p.name.to_owned(), json!({"calls": calls, "bytes": bytes})))
                .collect();
            (proc.pid.to_string(), Value::Object(per))
        })
        .collect();
    m.insert("pids".into(), Value::Object(pids));
    let stats: Map<String, Value> = sample.stats.iter().map(|s| (s.name.to_owned(), json!(s.value))).collect();
    m.insert("stats".into(), Value::Object(stats));
    m.insert("late_modules".into(), sample.late_modules.iter().map(late_module).collect());
    m
}

/// `{"path","since_s","symbol","sites","escape"}`, or `{"path","since_s","error"}`
/// for a file that could not be probed.
fn late_module(l: &LateModuleSample) -> Value {
    match &l.coverage {
        LateCoverage::Sites { symbol, sites, escape } => json!({
            "path": l.path, "since_s": l.since.as_secs_f64(), "symbol": symbol, "sites": sites, "escape": escape,
        }),
        LateCoverage::Failed { error } => json!({"path": l.path, "since_s": l.since.as_secs_f64(), "error": error}),
    }
}

impl<W: Write> Reporter for JsonReporter<W> {
    fn attached(&mut self, info: &AttachInfo) -> std::io::Result<()> {
        self.emit(&json!({
            "type": "attached",
            "pid": info.pid,
            "exe": info.exe,
            "python": {"version": info.python_version, "image": info.image},
            "probes": info.probes,
            "missing": info.missing,
            "links": info.links.as_str(),
            "returns": info.returns.iter().map(|(name, plan)| ((*name).to_owned(), return_plan(plan)))
                .collect::<Map<String, Value>>(),
            "return_costs_ns": info.return_costs.map(|m| json!({
                "uretprobe": m.uretprobe_ns, "ret": m.ret_ns, "placed": m.placed_ns,
            })),
            "call_sites": info.call_sites.iter().map(|(name, n)| ((*name).to_owned(), json!(n)))
                .collect::<Map<String, Value>>(),
            "placements": info.placements.iter().map(|(name, p)| ((*name).to_owned(), json!({
                "offset": p.offset, "instruction": p.instruction, "emulated": p.emulated, "reason": p.reason,
            }))).collect::<Map<String, Value>>(),
        }))
    }

    fn interval(&mut self, sample: &Sample) -> std::io::Result<()> {
        let mut m = Map::new();
        m.insert("type".into(), json!("interval"));
        m.extend(counts(sample));
        self.emit(&Value::Object(m))
    }

    fn summary(&mut self, sample: &Sample, end: End) -> std::io::Result<()> {
        let mut m = Map::new();
        m.insert("type".into(), json!("summary"));
        m.extend(counts(sample));
        m.insert("end".into(), json!(end.as_str()));
        if let End::Signal(name) = end {
            m.insert("signal".into(), json!(name));
        }
        self.emit(&Value::Object(m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::example_sample;

    fn lines(f: impl FnOnce(&mut JsonReporter<&mut Vec<u8>>)) -> Vec<Value> {
        let mut buf = Vec::new();
        f(&mut JsonReporter::new(&mut buf));
        String::from_utf8(buf).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    #[test]
    fn schema_of_each_line() {
        let info = AttachInfo {
            pid: Some(12),
            exe: None,
            python_version: "3.11.7".into(),
            image: "/lib/libpython3.11.so.1.0".into(),
            probes: vec!["_Py_NewReference", "PyObject_Malloc"],
            placements: vec![],
            missing: vec!["PyMem_RawCalloc"],
            links: crate::config::LinkMode::Multi,
            returns: vec![],
            return_costs: None,
            call_sites: vec![("_Py_Dealloc", 10989)],
        };
        let out = lines(|r| {
            r.attached(&info).unwrap();
            r.interval(&example_sample(1000, 1)).unwrap();
            r.summary(&example_sample(2500, 2), End::Signal("SIGINT")).unwrap();
        });
        assert_eq!(
            out[0],
            json!({"type":"attached","pid":12,"exe":null,"python":{"version":"3.11.7","image":"/lib/libpython3.11.so.1.0"},
                   "probes":["_Py_NewReference","PyObject_Malloc"],"missing":["PyMem_RawCalloc"],"links":"multi","returns":{},"return_costs_ns":null,"call_sites":{"_Py_Dealloc":10989},"placements":{}})
        );
        assert_eq!(out[1]["type"], "interval");
        assert_eq!(out[1]["elapsed_s"], 1.0);
        assert_eq!(out[1]["probes"]["PyObject_Malloc"], json!({"calls":4,"bytes":4000}));
        assert_eq!(out[1]["stats"]["arg_missing"], 0);
        assert_eq!(out[1]["pids"]["77"]["PyObject_Malloc"], json!({"calls":4,"bytes":4000}));
        assert_eq!(out[1]["stats"]["kernel_recursion_misses"], 0);
        assert_eq!(out[2]["type"], "summary");
        assert_eq!(out[2]["end"], "signal");
        assert_eq!(out[2]["signal"], "SIGINT");
        assert_eq!(out[2]["probes"]["_Py_NewReference"], json!({"calls":20,"bytes":0}));
        // Report order is table order, not alphabetical.
        let keys: Vec<_> = out[2]["probes"].as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["_Py_NewReference", "PyObject_Malloc"]);
    }

    #[test]
    fn budget_fields() {
        use crate::budget::{HitCosts, RateEstimate};
        let mut sample = example_sample(10_000, 1);
        sample.estimate = Some(crate::output::EstimateSample {
            budget: 0.01,
            windows: 3,
            traced: std::time::Duration::from_millis(100),
            overhead: std::time::Duration::from_millis(50),
            costs: HitCosts { single_stepped_ns: 16000.0, emulated_ns: 500.0 },
            rates: vec![
                (RateEstimate { per_s: 100.0, ci95: Some((90.0, 110.0)) }, RateEstimate { per_s: 0.0, ci95: None }),
                (RateEstimate { per_s: 40.0, ci95: None }, RateEstimate { per_s: 40000.0, ci95: None }),
            ],
        });
        let out = lines(|r| r.interval(&sample).unwrap());
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
    }

    #[test]
    fn late_modules_say_from_when() {
        use crate::output::{LateCoverage, LateModuleSample};
        let mut sample = example_sample(3000, 1);
        assert_eq!(lines(|r| r.interval(&sample).unwrap())[0]["late_modules"], json!([]));
        sample.late_modules = vec![
            LateModuleSample {
                path: "/venv/_psutil_linux.abi3.so".into(),
                since: std::time::Duration::from_secs(2),
                coverage: LateCoverage::Sites { symbol: "_Py_Dealloc", sites: 58, escape: None },
            },
            LateModuleSample {
                path: "/venv/gone.so".into(),
                since: std::time::Duration::from_millis(2500),
                coverage: LateCoverage::Failed { error: "cannot read it".into() },
            },
        ];
        let out = lines(|r| r.summary(&sample, End::Duration).unwrap());
        assert_eq!(
            out[0]["late_modules"],
            json!([
                {"path": "/venv/_psutil_linux.abi3.so", "since_s": 2.0, "symbol": "_Py_Dealloc", "sites": 58, "escape": null},
                {"path": "/venv/gone.so", "since_s": 2.5, "error": "cannot read it"},
            ])
        );
    }

    #[test]
    fn end_names() {
        assert_eq!(End::Duration.as_str(), "duration");
        assert_eq!(End::TargetExit.as_str(), "target-exit");
        let out = lines(|r| r.summary(&example_sample(1, 1), End::TargetExit).unwrap());
        assert_eq!(out[0]["end"], "target-exit");
        assert!(out[0].get("signal").is_none());
    }
}
