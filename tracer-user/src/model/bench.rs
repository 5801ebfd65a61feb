//! `tracer bench --json`: the timings of each setup against the baseline,
//! and what one probe hit costs.

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

use super::notes::Note;

/// `tracer bench --json`: one object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    pub python: BenchPython,
    pub stmt: String,
    pub setup: String,
    pub baseline: BenchState,
    /// Per measured setup, in order: `NAME` (its timing), then
    /// `NAME_vs_baseline` (pyperf's comparison).
    #[serde(flatten)]
    pub setups: IndexMap<String, BenchEntry>,
    /// Exact probe hits per loop of the statement.
    pub hits_per_loop: f64,
    pub hits_per_loop_by_probe: IndexMap<String, f64>,
    /// What one hit costs while attached (`attached` in
    /// `ns_per_hit_by_setup`); `null` when the statement hits no probe.
    pub ns_per_hit: Option<f64>,
    pub ns_per_hit_by_setup: IndexMap<String, Option<f64>>,
    /// What the user should know about the interpreter.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<Note>,
}

/// The interpreter `tracer bench` measured.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BenchPython {
    /// As `--python` named it: inside `root` where there is one.
    pub executable: std::path::PathBuf,
    pub version: String,
    /// The image probed, as the host sees it.
    pub image: std::path::PathBuf,
    /// `--root`: the directory the interpreter ran chrooted in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<std::path::PathBuf>,
}

/// One setup's timing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchState {
    pub mean_ns: f64,
    pub stdev_ns: f64,
    pub values: usize,
    /// pyperf's JSON file.
    pub file: std::path::PathBuf,
}

/// A setup's timing, or its comparison with the baseline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum BenchEntry {
    State(BenchState),
    Versus {
        /// mean(setup) / mean(baseline).
        ratio: f64,
        /// pyperf's significance test.
        significant: bool,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bench_report_round_trips() {
        let line = r#"{"python":{"executable":"/v/bin/python","version":"3.11.7","image":"/l.so"},"stmt":"[]","setup":"pass","baseline":{"mean_ns":20.6,"stdev_ns":0.4,"values":60,"file":"b/baseline.json"},"attached":{"mean_ns":22.4,"stdev_ns":0.5,"values":60,"file":"b/attached.json"},"attached_vs_baseline":{"ratio":1.087,"significant":true},"hits_per_loop":2.0,"hits_per_loop_by_probe":{"_Py_NewReference":1.0,"_Py_Dealloc":1.0},"ns_per_hit":0.9,"ns_per_hit_by_setup":{"attached":0.9}}"#;
        let report: BenchReport = serde_json::from_str(line).unwrap();
        assert!(matches!(report.setups["attached_vs_baseline"], BenchEntry::Versus { significant: true, .. }));
        assert_eq!(serde_json::to_string(&report).unwrap(), line);
    }
}
