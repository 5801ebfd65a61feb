//! `cargo xtask bench`: what the sections of the first part share: the
//! statements and the ctypes setup they time, one `tracer bench` run, the
//! plans `tracer probes` makes, and the cells and rows of their tables.

use std::{
    fmt::Write as _,
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::markdown::{fmt_ns, shell_quote};

/// Setup for the per-probe costs: `body()` calls each allocator function of
/// the C API once through ctypes and makes and drops a list, so one
/// statement hits every default probe (how often, `tracer bench` counts).
pub const API_SETUP: &str = "import ctypes
api = ctypes.pythonapi
calls = []
for fam in ('PyObject_', 'PyMem_', 'PyMem_Raw'):
    m, c, r, f = (getattr(api, fam + n) for n in ('Malloc', 'Calloc', 'Realloc', 'Free'))
    for g in (m, c, r):
        g.restype = ctypes.c_void_p
    m.argtypes = [ctypes.c_size_t]
    c.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    r.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    f.argtypes = [ctypes.c_void_p]
    f.restype = None
    calls.append((m, c, r, f))
def body():
    for m, c, r, f in calls:
        f(m(64))
        f(r(c(2, 32), 128))
    return []";

/// The default probes, one per-hit measurement each.
pub const DEFAULT_PROBES: [&str; 14] = [
    "_Py_NewReference",
    "_Py_Dealloc",
    "PyObject_Malloc",
    "PyObject_Calloc",
    "PyObject_Realloc",
    "PyObject_Free",
    "PyMem_Malloc",
    "PyMem_Calloc",
    "PyMem_Realloc",
    "PyMem_Free",
    "PyMem_RawMalloc",
    "PyMem_RawCalloc",
    "PyMem_RawRealloc",
    "PyMem_RawFree",
];

/// The statements measured, as (name, setup, stmt).
pub const STATEMENTS: &[(&str, &str, &str)] = &[
    ("empty list", "pass", "[]"),
    ("JSON round trip", "import json; d = {'a': 1, 'b': [1, 2, 3], 'c': 'text'}", "json.loads(json.dumps(d))"),
    ("list of str", "pass", "[str(i) for i in range(100)]"),
];

/// One `tracer bench` run: the command, as printed, and its JSON.
pub struct Measured {
    pub command: String,
    pub result: Value,
}

#[allow(clippy::too_many_arguments)]
pub fn bench(
    tracer: &Path,
    python: &Path,
    out: &Path,
    setup: &str,
    stmt: &str,
    probes: &str,
    also: &str,
    effort: &str,
) -> anyhow::Result<Measured> {
    let mut args: Vec<String> = vec![
        "bench".into(),
        "--python".into(),
        python.display().to_string(),
        "--setup".into(),
        setup.into(),
        "--stmt".into(),
        stmt.into(),
        "--probes".into(),
        probes.into(),
        "--also".into(),
        also.into(),
        "--json".into(),
        "-o".into(),
        out.display().to_string(),
    ];
    match effort {
        "fast" => args.push("--fast".into()),
        "rigorous" => args.push("--rigorous".into()),
        _ => {}
    }
    let command = format!("sudo tracer {}", args.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" "));
    eprintln!("xtask: $ {command}");
    let output = Command::new(tracer).args(&args).stderr(Stdio::inherit()).output().context("running tracer bench")?;
    if !output.status.success() {
        bail!("`{command}` failed ({})", output.status);
    }
    let result: Value = serde_json::from_slice(&output.stdout).context("tracer bench --json output")?;
    Ok(Measured { command, result })
}

/// The plan `tracer probes` prints for the probes `set` of `python`: one
/// entry per probe the build has.
pub fn probe_plans(tracer: &Path, python: &Path, set: &str, placement: &str) -> anyhow::Result<Vec<Value>> {
    let out = Command::new(tracer)
        .args(["probes", "--exe"])
        .arg(python)
        .args(["--probes", set, "--placement", placement, "--json"])
        .output()
        .context("running tracer probes")?;
    if !out.status.success() {
        bail!("tracer probes --probes {set} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let plan: Value = serde_json::from_slice(&out.stdout).context("tracer probes --json printed no JSON")?;
    Ok(plan["probes"].as_array().cloned().unwrap_or_default())
}

/// The plan for one probe of `python`; null when the build lacks it.
pub fn probe_plan(tracer: &Path, python: &Path, probe: &str, placement: &str) -> anyhow::Result<Value> {
    Ok(probe_plans(tracer, python, probe, placement)?.into_iter().next().unwrap_or(Value::Null))
}

/// "`push %rbx` at +7", or "its entry, `mov …`", from a plan.
pub fn placed_at(plan: &Value) -> String {
    let instruction = plan["instruction"].as_str().unwrap_or("?");
    match plan["offset"].as_u64() {
        Some(0) => format!("its entry, `{instruction}`"),
        Some(offset) => format!("`{instruction}` at +{offset}"),
        None => "?".to_owned(),
    }
}

/// A setup's cost per hit in µs, or "—" where it was not measured or the
/// statement hits the probe less than once per loop.
pub fn per_hit_cell(result: &Value, setup: &str) -> String {
    let hits = result["hits_per_loop"].as_f64().unwrap_or(0.0);
    result["ns_per_hit_by_setup"][setup]
        .as_f64()
        .filter(|_| hits >= 1.0)
        .map_or_else(|| "—".to_owned(), |ns| format!("{:.2} µs", ns / 1e3))
}

/// The commands of a per-probe table, with the ctypes setup as `$API_SETUP`.
pub fn api_commands(md: &mut String, setup_is: &str, commands: &[String]) -> anyhow::Result<()> {
    writeln!(md, "Commands (one per row; `API_SETUP` is {setup_is}):\n\n```")?;
    for c in commands {
        writeln!(md, "{}", c.replace(&shell_quote(API_SETUP), "\"$API_SETUP\""))?;
    }
    writeln!(md, "```\n")?;
    Ok(())
}

/// What each tracing setup adds to a loop over the baseline, and how
/// tracer's compares with bpftrace's.
pub fn added_time(md: &mut String, r: &Value) -> anyhow::Result<()> {
    let mean = |k: &str| r[k]["mean_ns"].as_f64();
    let Some(base) = mean("baseline") else { return Ok(()) };
    let added = |k: &str| mean(k).map(|m| m - base);
    let hits = r["hits_per_loop"].as_f64().unwrap_or(0.0);
    let Some(bpftrace) = added("bpftrace") else { return Ok(()) };
    let mut parts = Vec::new();
    for (key, what) in [("attached", "tracer"), ("call-sites", "tracer with call sites")] {
        if let Some(a) = added(key) {
            let versus = if a <= bpftrace {
                format!("{:.1}x less than bpftrace", bpftrace / a)
            } else {
                format!("{:.1}x more than bpftrace, which sees only the out-of-line calls", a / bpftrace)
            };
            parts.push(format!("{what} adds {} per loop ({versus})", fmt_ns(a)));
        }
    }
    writeln!(
        md,
        "Added per loop over the baseline: {}; bpftrace adds {}; tracemalloc with 25 frames adds {}. \
         Issue #4's bound (a target, not a measurement) is {hits} hits × {:.1} µs = {}.\n",
        parts.join("; "),
        fmt_ns(bpftrace),
        added("tracemalloc25").map_or_else(|| "—".to_owned(), fmt_ns),
        BOUND_NS_PER_HIT / 1e3,
        fmt_ns(hits * BOUND_NS_PER_HIT)
    )?;
    Ok(())
}

/// A statement's heading, the command that measured it, its exact hits per
/// loop, and the head of its table.
pub fn statement_head(md: &mut String, heading: &str, m: &Measured) -> anyhow::Result<()> {
    writeln!(md, "{heading}\n")?;
    writeln!(md, "```\n{}\n```\n", m.command)?;
    writeln!(md, "Probe hits per loop (exact): {}.\n", m.result["hits_per_loop"])?;
    writeln!(md, "| setup | mean per loop | vs baseline | cost per probe hit |\n|---|---|---|---|")?;
    Ok(())
}

/// Issue #4's goal for one probe hit, in ns: what the added time per loop
/// is compared with.
pub const BOUND_NS_PER_HIT: f64 = 1200.0;

/// A table row for setup `key`, if the command measured it.
pub fn row(md: &mut String, r: &Value, key: &str, what: &str) -> anyhow::Result<()> {
    let s = &r[key];
    if s.is_null() {
        return Ok(());
    }
    let mean = s["mean_ns"].as_f64().unwrap_or(f64::NAN);
    let stdev = s["stdev_ns"].as_f64().unwrap_or(f64::NAN);
    let (vs, per_hit) = if key == "baseline" {
        ("1.00x".to_owned(), "—".to_owned())
    } else {
        let c = &r[format!("{key}_vs_baseline")];
        let ratio = c["ratio"].as_f64().unwrap_or(f64::NAN);
        let sig = if c["significant"].as_bool() == Some(false) { " (not significant)" } else { "" };
        // tracer bench gives a cost per hit only to setups that pay for
        // every hit.
        let per_hit = r["ns_per_hit_by_setup"][key].as_f64().map_or_else(|| "—".to_owned(), |ns| format!("{ns:.0} ns"));
        (format!("{ratio:.2}x{sig}"), per_hit)
    };
    writeln!(md, "| {what} | {} ± {} | {vs} | {per_hit} |", fmt_ns(mean), fmt_ns(stdev))?;
    Ok(())
}
