//! `--all`'s one report from its children's: the attach headers joined,
//! and the snapshots added up (each child counts its own interpreter's
//! processes, so the host PIDs never overlap and every count is a sum).
//! Costs are the children's summed, their fractions weighed by the target
//! CPU time each priced.

use indexmap::IndexMap;

use crate::model::{
    Attached, Budget, Cost, Gc, GcGeneration, InterpreterInfo, ProbeCounts, ProbeEstimate, ProfileCost, PythonInfo,
    Sizes, Slowdown, Snapshot, SourceCost,
};

/// The header of `--all`: the first interpreter's, with every probe and
/// coverage of the others added and each interpreter listed.
#[must_use]
pub fn attached(parts: &[(&Attached, InterpreterInfo)]) -> Option<Attached> {
    let ((first, _), rest) = parts.split_first()?;
    let mut out = (*first).clone();
    out.pid = None;
    out.exe = None;
    out.pid_in_namespace = None;
    out.python = PythonInfo {
        version: join_distinct(parts.iter().map(|(a, _)| a.python.version.as_str())),
        image: format!("{} interpreter{}", parts.len(), if parts.len() == 1 { "" } else { "s" }),
    };
    for (a, _) in rest {
        add_attached(&mut out, a);
    }
    // A probe one build lacks is missing only where no build has it.
    out.missing.retain(|m| !out.probes.contains(m));
    out.interpreters = parts.iter().map(|(_, info)| info.clone()).collect();
    Some(out)
}

/// `a`'s probes, coverage and sites added to `out`.
fn add_attached(out: &mut Attached, a: &Attached) {
    for p in &a.probes {
        if !out.probes.contains(p) {
            out.probes.push(p.clone());
        }
    }
    for m in &a.missing {
        if !out.missing.contains(m) {
            out.missing.push(m.clone());
        }
    }
    for m in &a.measures_bytes {
        if !out.measures_bytes.contains(m) {
            out.measures_bytes.push(m.clone());
        }
    }
    // A function partly covered in any interpreter is partly covered.
    for (name, c) in &a.coverage {
        match out.coverage.get(name) {
            Some(have) if have.is_partial() || !c.is_partial() => {}
            _ => {
                let mut c = c.clone();
                c.reason = Some(format!(
                    "in {}: {}",
                    a.python.image,
                    c.reason.as_deref().unwrap_or("some copies are not probed")
                ));
                out.coverage.insert(name.clone(), c);
            }
        }
    }
    for (name, k) in &a.sites {
        let sum = out.sites.get(name).copied().unwrap_or_default() + *k;
        out.sites.insert(name.clone(), sum);
    }
    for (name, p) in &a.placements {
        out.placements.entry(name.clone()).or_insert_with(|| p.clone());
    }
}

/// Distinct values joined with ", ", in first-seen order.
fn join_distinct<'a>(values: impl Iterator<Item = &'a str>) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for v in values {
        if !seen.contains(&v) {
            seen.push(v);
        }
    }
    seen.join(", ")
}

/// The sum of the children's snapshots, at `elapsed_s` since `--all`
/// attached. Rates are left for the caller to compute over the sum.
#[must_use]
pub fn snapshots(parts: &[&Snapshot], elapsed_s: f64) -> Snapshot {
    let mut out = Snapshot { elapsed_s, ..Snapshot::default() };
    for s in parts {
        for (name, p) in &s.probes {
            if let Some(have) = out.probes.get_mut(name) {
                add_probe(have, p);
            } else {
                let mut p = *p;
                p.calls_per_s = None;
                p.bytes_per_s = None;
                out.probes.insert(name.clone(), p);
            }
        }
        for (pid, probes) in &s.pids {
            let mine = out.pids.entry(pid.clone()).or_default();
            for (name, c) in probes {
                let have = mine.entry(name.clone()).or_default();
                have.calls += c.calls;
                have.bytes += c.bytes;
            }
        }
        for (name, v) in &s.stats {
            *out.stats.entry(name.clone()).or_default() += v;
        }
        out.late_modules.extend(s.late_modules.iter().cloned());
        out.exited.extend(s.exited.iter().cloned());
        out.hits = add_opt(out.hits, s.hits);
        out.sizes = match (out.sizes.take(), &s.sizes) {
            (Some(mut a), Some(b)) => {
                add_sizes(&mut a, b);
                Some(a)
            }
            (a, b) => a.or_else(|| b.clone()),
        };
        out.gc = match (out.gc.take(), &s.gc) {
            (Some(mut a), Some(b)) => {
                add_gc(&mut a, b);
                Some(a)
            }
            (a, b) => a.or_else(|| b.clone()),
        };
    }
    out.cost = merge_cost(parts.iter().filter_map(|s| s.cost));
    out.budget = merge_budget(parts.iter().filter_map(|s| s.budget));
    out.profile = merge_profile(parts.iter().filter_map(|s| s.profile.as_ref()));
    out
}

/// What the children reported that `--all` does not add up (none of the
/// flags that give them is passed on): named, so that it is never lost in
/// silence.
#[must_use]
pub fn unmerged(s: &Snapshot) -> Vec<&'static str> {
    let mut out = Vec::new();
    for (present, name) in [
        (s.heap.is_some(), "heap"),
        (s.growth.is_some(), "growth"),
        (s.types.is_some(), "types"),
        (s.sites.is_some() || s.stacks.is_some(), "stacks"),
        (s.live.is_some() || s.leaks.is_some(), "live"),
    ] {
        if present {
            out.push(name);
        }
    }
    out
}

fn add_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    }
}

fn add_probe(have: &mut ProbeCounts, p: &ProbeCounts) {
    // Exact only where every member with hits counted them apart (whether
    // a site is emulated depends on the member's kernel).
    have.stepped_hits = match (have.stepped_hits, p.stepped_hits) {
        (Some(a), Some(b)) => Some(a + b),
        (Some(a), None) if p.calls + p.gate_other == 0 => Some(a),
        (None, Some(b)) if have.calls + have.gate_other == 0 => Some(b),
        _ => None,
    };
    have.calls += p.calls;
    have.bytes += p.bytes;
    have.gate_other += p.gate_other;
    have.nested = match (have.nested, p.nested) {
        (Some(mut a), Some(b)) => {
            a.calls += b.calls;
            a.bytes += b.bytes;
            Some(a)
        }
        (a, b) => a.or(b),
    };
    have.returned = match (have.returned, p.returned) {
        (Some(mut a), Some(b)) => {
            a.returns += b.returns;
            a.null += b.null;
            a.pointer_sum = a.pointer_sum.wrapping_add(b.pointer_sum);
            Some(a)
        }
        (a, b) => a.or(b),
    };
    // One interpreter's rate unknown leaves the sum unknown: the other's
    // alone would be a part shown as the whole.
    have.estimate = match (have.estimate, p.estimate) {
        (Some(a), Some(b)) => Some(add_estimates(a, b)),
        _ => None,
    };
}

/// Two interpreters' estimated rates: their sum, and the interval of the
/// sum as the sum of the bounds (wider than the two estimates' joint
/// interval, never narrower).
fn add_estimates(a: ProbeEstimate, b: ProbeEstimate) -> ProbeEstimate {
    let add = |x: Option<[f64; 2]>, y: Option<[f64; 2]>| Some([x?[0] + y?[0], x?[1] + y?[1]]);
    ProbeEstimate {
        calls_per_s: a.calls_per_s + b.calls_per_s,
        calls_per_s_ci95: add(a.calls_per_s_ci95, b.calls_per_s_ci95),
        bytes_per_s: a.bytes_per_s + b.bytes_per_s,
        bytes_per_s_ci95: add(a.bytes_per_s_ci95, b.bytes_per_s_ci95),
        lower_bound: a.lower_bound || b.lower_bound,
    }
}

fn add_buckets(a: &mut Vec<[u64; 4]>, b: &[[u64; 4]]) {
    for bucket in b {
        match a.iter_mut().find(|x| x[0] == bucket[0]) {
            Some(x) => {
                x[2] += bucket[2];
                x[3] += bucket[3];
            }
            None => a.push(*bucket),
        }
    }
    a.sort_unstable_by_key(|x| x[0]);
}

fn add_sizes(a: &mut Sizes, b: &Sizes) {
    add_buckets(&mut a.object, &b.object);
    add_buckets(&mut a.mem, &b.mem);
    add_buckets(&mut a.raw, &b.raw);
    if let Some(native) = &b.native {
        add_buckets(a.native.get_or_insert_with(Vec::new), native);
    }
    for (domain, n) in &b.unsized_calls {
        *a.unsized_calls.entry(domain.clone()).or_default() += n;
    }
}

fn add_generations(a: &mut Vec<GcGeneration>, b: &[GcGeneration]) {
    for g in b {
        match a.iter_mut().find(|x| x.generation == g.generation) {
            Some(x) => {
                x.collections += g.collections;
                x.collected += g.collected;
                x.uncollectable = add_opt(x.uncollectable, g.uncollectable);
                x.duration_s = x.duration_s.zip(g.duration_s).map(|(p, q)| p + q);
                x.collections_per_s = None;
            }
            None => a.push(GcGeneration { collections_per_s: None, ..*g }),
        }
    }
}

fn add_gc(a: &mut Gc, b: &Gc) {
    add_generations(&mut a.generations, &b.generations);
    for (pid, own) in &b.pids {
        add_generations(a.pids.entry(pid.clone()).or_default(), own);
    }
    // Interpreters that see collections differently say so each.
    if a.source != b.source || a.reason != b.reason {
        let theirs = format!(
            "{}{}",
            format!("{:?}", b.source).to_lowercase(),
            b.reason.as_ref().map_or(String::new(), |r| format!(": {r}"))
        );
        a.reason = Some(match a.reason.take() {
            Some(mine) if mine.contains(&theirs) => mine,
            Some(mine) => format!("{mine}; another interpreter: {theirs}"),
            None => format!("another interpreter: {theirs}"),
        });
    }
}

/// `sum(f_i * w_i) / sum(w_i)`, or the plain mean where no weight is
/// known.
fn weighed(values: &[(f64, f64)]) -> f64 {
    let total: f64 = values.iter().map(|(_, w)| w).sum();
    if total > 0.0 {
        values.iter().map(|(f, w)| f * w).sum::<f64>() / total
    } else if values.is_empty() {
        0.0
    } else {
        #[allow(clippy::cast_precision_loss, reason = "a handful of interpreters")]
        let n = values.len() as f64;
        values.iter().map(|(f, _)| f).sum::<f64>() / n
    }
}

fn merge_cost(costs: impl Iterator<Item = Cost>) -> Option<Cost> {
    let costs: Vec<Cost> = costs.collect();
    let first = *costs.first()?;
    let fraction = |pick: fn(&Cost) -> Option<f64>| {
        let known: Option<Vec<(f64, f64)>> = costs.iter().map(|c| Some((pick(c)?, c.target_cpu_s))).collect();
        known.map(|k| weighed(&k))
    };
    Some(Cost {
        estimate: costs.iter().any(|c| c.estimate),
        overhead_fraction: fraction(|c| c.overhead_fraction),
        overhead_fraction_low: fraction(|c| c.overhead_fraction_low),
        tracer_cpu_s: costs.iter().map(|c| c.tracer_cpu_s).sum(),
        target_cpu_s: costs.iter().map(|c| c.target_cpu_s).sum(),
        hits: costs.iter().map(|c| c.hits).sum(),
        unpriced_hits: costs.iter().map(|c| c.unpriced_hits).sum(),
        hit_cost_ns: first.hit_cost_ns,
    })
}

fn merge_budget(budgets: impl Iterator<Item = Budget>) -> Option<Budget> {
    let budgets: Vec<Budget> = budgets.collect();
    let first = *budgets.first()?;
    let weight = |b: &Budget| b.target_cpu_s.unwrap_or(0.0);
    let of = |pick: fn(&Budget) -> f64| weighed(&budgets.iter().map(|b| (pick(b), weight(b))).collect::<Vec<_>>());
    Some(Budget {
        estimates: budgets.iter().any(|b| b.estimates),
        percent: first.percent,
        windows: budgets.iter().map(|b| b.windows).sum(),
        traced_s: budgets.iter().map(|b| b.traced_s).sum(),
        traced_fraction: of(|b| b.traced_fraction),
        estimated_overhead_fraction: of(|b| b.estimated_overhead_fraction),
        hit_cost_ns: first.hit_cost_ns,
        switching_s: budgets.iter().map(|b| b.switching_s).sum(),
        target_cpu_s: budgets.iter().map(|b| b.target_cpu_s).sum(),
        // The widest: each interpreter's rates were taken by its own.
        slowdown: budgets.iter().filter_map(|b| b.slowdown).reduce(|a, b| Slowdown {
            at_least: a.at_least.min(b.at_least),
            likely: None,
            at_most: a.at_most.zip(b.at_most).map(|(a, b)| a.max(b)),
        }),
    })
}

fn merge_profile<'a>(profiles: impl Iterator<Item = &'a ProfileCost>) -> Option<ProfileCost> {
    merge_profiles(&profiles.collect::<Vec<_>>())
}

fn merge_profiles(profiles: &[&ProfileCost]) -> Option<ProfileCost> {
    let first = profiles.first()?;
    let mut sources: IndexMap<String, Vec<(SourceCost, f64)>> = IndexMap::new();
    for p in profiles {
        for (name, s) in &p.sources {
            sources.entry(name.clone()).or_default().push((*s, p.target_cpu_s));
        }
    }
    let sources = sources
        .into_iter()
        .map(|(name, each)| {
            let of =
                |pick: fn(&SourceCost) -> f64| weighed(&each.iter().map(|(s, w)| (pick(s), *w)).collect::<Vec<_>>());
            let sum = SourceCost {
                target_s: each.iter().map(|(s, _)| s.target_s).sum(),
                fraction: of(|s| s.fraction),
                tracer_fraction: of(|s| s.tracer_fraction),
                tracer_cpu_s: each.iter().map(|(s, _)| s.tracer_cpu_s).sum(),
                bytes_read: each.iter().map(|(s, _)| s.bytes_read).sum(),
            };
            (name, sum)
        })
        .collect();
    Some(ProfileCost {
        budget_percent: first.budget_percent,
        fraction: weighed(&profiles.iter().map(|p| (p.fraction, p.target_cpu_s)).collect::<Vec<_>>()),
        span_s: profiles.iter().map(|p| p.span_s).fold(0.0, f64::max),
        target_cpu_s: profiles.iter().map(|p| p.target_cpu_s).sum(),
        sources,
        // Every process's run so far, where each has one.
        so_far: (profiles.iter().all(|p| p.so_far.is_some()))
            .then(|| merge_profiles(&profiles.iter().filter_map(|p| p.so_far.as_deref()).collect::<Vec<_>>()))
            .flatten()
            .map(Box::new),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::examples;

    #[test]
    fn counts_add_up_and_pids_stay_apart() {
        let a = examples::snapshot(1000, 1);
        let mut b = examples::snapshot(2000, 3);
        let per = b.pids.swap_remove("77").unwrap();
        b.pids.insert("88".into(), per);
        let sum = snapshots(&[&a, &b], 2.5);
        assert!((sum.elapsed_s - 2.5).abs() < f64::EPSILON);
        assert_eq!(sum.probes["_Py_NewReference"].calls, 40);
        assert_eq!(sum.probes["PyObject_Malloc"].bytes, 16_000);
        assert_eq!(sum.probes["PyObject_Malloc"].calls_per_s, None);
        assert_eq!(sum.pids.len(), 2);
        assert_eq!(sum.pids["88"]["_Py_NewReference"].calls, 30);
        assert!(unmerged(&sum).is_empty());
    }

    /// Hits counted apart by kind add up only where every member with
    /// hits counted them apart.
    #[test]
    fn stepped_hits_are_exact_only_where_every_member_counted_them() {
        let with = |calls, stepped| ProbeCounts { stepped_hits: stepped, ..ProbeCounts::new(calls, 0) };
        let sum = |a: ProbeCounts, b: &ProbeCounts| {
            let mut a = a;
            add_probe(&mut a, b);
            a.stepped_hits
        };
        assert_eq!(sum(with(10, Some(3)), &with(5, Some(2))), Some(5));
        assert_eq!(sum(with(10, Some(3)), &with(5, None)), None, "5 hits of unknown kind");
        assert_eq!(sum(with(10, Some(3)), &with(0, None)), Some(3), "a member without hits");
        assert_eq!(sum(with(0, None), &with(5, Some(2))), Some(2));
        assert_eq!(sum(with(1, None), &with(5, Some(2))), None);
    }

    /// A member whose rate is not known leaves the sum's unknown.
    #[test]
    fn an_unknown_rate_leaves_the_sum_unknown() {
        let e = ProbeEstimate {
            calls_per_s: 100.0,
            calls_per_s_ci95: Some([90.0, 110.0]),
            bytes_per_s: 0.0,
            bytes_per_s_ci95: None,
            lower_bound: false,
        };
        let known = ProbeCounts { estimate: Some(e), ..ProbeCounts::new(10, 0) };
        let unknown = ProbeCounts { estimate: None, ..ProbeCounts::new(0, 0) };
        let mut a = known;
        add_probe(&mut a, &unknown);
        assert_eq!(a.estimate, None);
        let mut a = known;
        add_probe(&mut a, &known);
        assert_eq!(a.estimate.map(|e| (e.calls_per_s, e.calls_per_s_ci95)), Some((200.0, Some([180.0, 220.0]))));
    }

    #[test]
    fn headers_join_and_missing_means_missing_everywhere() {
        let mut a = examples::attached(None);
        a.missing.push("_Py_Dealloc".into());
        let mut b = examples::attached(None);
        b.python.version = "3.14.0".into();
        b.probes.push("_Py_Dealloc".into());
        let info = |image: &str| InterpreterInfo {
            image: image.into(),
            version: String::new(),
            since_s: 0.0,
            probes: Vec::new(),
            missing: Vec::new(),
        };
        let joined = attached(&[(&a, info("/a")), (&b, info("/b"))]).unwrap();
        // Missing in both (the example's) stays missing; in one only, not.
        assert_eq!(joined.missing, ["PyMem_RawCalloc"]);
        assert!(joined.probes.contains(&"_Py_Dealloc".to_owned()));
        assert_eq!(joined.interpreters.len(), 2);
        assert_eq!(joined.python.image, "2 interpreters");
        assert!(joined.python.version.ends_with(", 3.14.0"));
    }
}
