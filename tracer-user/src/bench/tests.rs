use super::*;

#[test]
fn ratio_wording_matches_pyperf() {
    assert_eq!(describe_ratio(1.087), "1.09x slower (+9%)");
    assert_eq!(describe_ratio(0.98), "1.02x faster (-2%)");
    assert_eq!(describe_ratio(68.0), "68.00x slower (+6700%)");
}

#[test]
fn rotation_and_plans() {
    assert_eq!(Effort::Fast.plan().rounds, 3);
    assert!(Effort::Rigorous.plan().rounds > Effort::Normal.plan().rounds);
    let line = compare_line(
        "baseline",
        &StateStats { file: "a".into(), mean: 2e-8, stdev: 1e-10, values: 6, formatted: "20.0 ns +- 0.1 ns".into() },
        "detached",
        &StateStats { file: "b".into(), mean: 2e-8, stdev: 1e-10, values: 6, formatted: "20.1 ns +- 0.1 ns".into() },
        &Comparison { ratio: 1.005, significant: false },
    );
    assert_eq!(line, "Mean +- std dev: [baseline] 20.0 ns +- 0.1 ns -> [detached] 20.1 ns +- 0.1 ns: not significant");
}
