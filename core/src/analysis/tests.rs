use proptest::prelude::*;
use sked_api::{AnalysisSpec, AnalysisVerdict, CpuPressureLimit, EventLimit, RunDelayLimit};

use super::*;

/// Samples every second from `from_s` (exclusive) for `n` seconds, with run delay `delay(i)`.
fn samples(from_s: i64, n: usize, delay: impl Fn(usize) -> f64) -> Vec<Sample> {
    (0..n)
        .map(|i| Sample {
            at_ms: (from_s + 1 + i as i64) * 1000,
            run_delay_us: Some(delay(i)),
            cpu_pressure: Some(20.0),
            events: Some(BTreeMap::new()),
        })
        .collect()
}

fn limits(percent: f64) -> Limits {
    Limits {
        run_delay_percent: Some(percent),
        pressure_points: None,
        events: Vec::new(),
        min_samples: 5,
        min_control_nodes: 3,
    }
}

/// A wave node switched at 100 s (samples 40..100 before it), baked from 110 s to 140 s.
fn case<'a>(limits: &'a Limits, wave: Vec<WaveNode<'a>>, controls: Vec<&'a [Sample]>) -> Case<'a> {
    Case { revision: "r2", limits, from_ms: 110_000, to_ms: 140_000, wave, controls, may_wait: false }
}

fn judged(outcome: Outcome) -> Judgement {
    match outcome {
        Outcome::Judged(j) => j,
        Outcome::Waiting => panic!("waiting"),
    }
}

#[test]
fn defaults_judge_run_delay_and_pressure_when_no_signal_is_named() {
    let l = Limits::of(&AnalysisSpec::default());
    assert_eq!(
        (l.run_delay_percent, l.pressure_points, l.min_samples, l.min_control_nodes),
        (Some(50.0), Some(10.0), 5, 3)
    );
    let only = Limits::of(&AnalysisSpec {
        run_delay: Some(RunDelayLimit { max_increase_percent: Some(25) }),
        ..AnalysisSpec::default()
    });
    assert_eq!((only.run_delay_percent, only.pressure_points), (Some(25.0), None));
    let pressure =
        Limits::of(&AnalysisSpec { cpu_pressure: Some(CpuPressureLimit::default()), ..AnalysisSpec::default() });
    assert_eq!((pressure.run_delay_percent, pressure.pressure_points), (None, Some(10.0)));
}

#[test]
fn a_risen_run_delay_fails_with_a_cause_naming_node_values_and_baselines() {
    let l = limits(25.0);
    let node: Vec<Sample> = [samples(40, 60, |_| 1300.0), samples(110, 30, |_| 1900.0)].concat();
    let controls: Vec<Vec<Sample>> = (0..4).map(|_| samples(40, 100, |_| 1350.0)).collect();
    let wave = vec![WaveNode { node: "node-3", switched_at_ms: 100_000, samples: &node }];
    let j = judged(judge(&case(&l, wave, controls.iter().map(Vec::as_slice).collect())));
    assert_eq!(j.verdict, AnalysisVerdict::Failed);
    let (node, cause) = j.failure.expect("a failure");
    assert_eq!(node, "node-3");
    assert_eq!(
        cause,
        "run delay on node-3 rose to 1.90 ms (41 % over a median of 1.35 ms over 4 control nodes, and 46 % over 1.30 ms on the node before its switch) during the bake of revision r2; the limit is 25 % (spec.rollout.analysis.runDelay.maxIncreasePercent)"
    );
    assert_eq!(j.nodes[0].verdict, AnalysisVerdict::Failed);
    assert!(
        j.nodes[0].detail.starts_with("run delay 1.90 ms (control 1.35 ms over 4 nodes; before its switch 1.30 ms)"),
        "{}",
        j.nodes[0].detail
    );
}

#[test]
fn a_rise_against_only_one_baseline_passes() {
    // The whole fleet got slower (traffic): the controls rose as much as the wave.
    let l = limits(25.0);
    let node: Vec<Sample> = [samples(40, 60, |_| 1000.0), samples(110, 30, |_| 2000.0)].concat();
    let controls: Vec<Vec<Sample>> =
        (0..3).map(|_| [samples(40, 70, |_| 1000.0), samples(110, 30, |_| 1900.0)].concat()).collect();
    let wave = vec![WaveNode { node: "n1", switched_at_ms: 100_000, samples: &node }];
    let j = judged(judge(&case(&l, wave, controls.iter().map(Vec::as_slice).collect())));
    assert_eq!(j.verdict, AnalysisVerdict::Passed, "{}", j.message);
}

#[test]
fn without_controls_the_node_s_own_past_is_the_baseline() {
    let l = limits(25.0);
    let node: Vec<Sample> = [samples(40, 60, |_| 20_000.0), samples(110, 30, |_| 250_000.0)].concat();
    let wave = vec![WaveNode { node: "kvm-node", switched_at_ms: 100_000, samples: &node }];
    let j = judged(judge(&case(&l, wave, vec![])));
    assert_eq!(j.verdict, AnalysisVerdict::Failed);
    let cause = j.failure.expect("failure").1;
    assert!(cause.contains("rose to 250.00 ms (1150 % over 20.00 ms on the node before its switch)"), "{cause}");
}

#[test]
fn no_baseline_is_inconclusive_and_the_rollout_goes_on() {
    let l = limits(25.0);
    // A first deployment: nothing before the switch, no control nodes.
    let node = samples(110, 30, |_| 9_000.0);
    let wave = vec![WaveNode { node: "n1", switched_at_ms: 100_000, samples: &node }];
    let two: Vec<Vec<Sample>> = (0..2).map(|_| samples(40, 100, |_| 1.0)).collect();
    let j = judged(judge(&case(&l, wave, two.iter().map(Vec::as_slice).collect())));
    assert_eq!(j.verdict, AnalysisVerdict::Inconclusive);
    assert!(j.failure.is_none());
    assert!(j.message.contains("fewer than 3 control nodes with 5 samples"), "{}", j.message);
}

#[test]
fn too_few_samples_wait_within_the_grace_and_are_inconclusive_after() {
    let l = limits(25.0);
    let node: Vec<Sample> = [samples(40, 60, |_| 1000.0), samples(110, 4, |_| 9000.0)].concat();
    let wave = || vec![WaveNode { node: "n1", switched_at_ms: 100_000, samples: &node }];
    let mut c = case(&l, wave(), vec![]);
    c.may_wait = true;
    assert_eq!(judge(&c), Outcome::Waiting);
    let j = judged(judge(&case(&l, wave(), vec![])));
    assert_eq!(j.verdict, AnalysisVerdict::Inconclusive, "4 samples are too few to fail on");
}

#[test]
fn a_tiny_rise_on_an_idle_node_is_noise() {
    let l = limits(25.0);
    let node: Vec<Sample> = [samples(40, 60, |_| 4.0), samples(110, 30, |_| 40.0)].concat();
    let wave = vec![WaveNode { node: "idle", switched_at_ms: 100_000, samples: &node }];
    assert_eq!(judged(judge(&case(&l, wave, vec![]))).verdict, AnalysisVerdict::Passed);
}

#[test]
fn pressure_is_judged_in_points_and_events_against_their_rate() {
    let mut l = limits(1000.0);
    l.pressure_points = Some(10.0);
    l.events = vec![("SCX_EV_SELECT_CPU_FALLBACK".to_owned(), 5.0)];
    let mut node: Vec<Sample> = [samples(40, 60, |_| 1000.0), samples(110, 30, |_| 1000.0)].concat();
    for s in node.iter_mut().filter(|s| s.at_ms > 110_000) {
        s.cpu_pressure = Some(35.0);
    }
    let wave = vec![WaveNode { node: "n1", switched_at_ms: 100_000, samples: &node }];
    let cause = judged(judge(&case(&l, wave, vec![]))).failure.expect("pressure fails").1;
    assert!(
        cause.starts_with("CPU pressure on n1 rose to 35.0 % (15.0 points over 20.0 % on the node before its switch)"),
        "{cause}"
    );

    l.pressure_points = None;
    for s in node.iter_mut().filter(|s| s.at_ms > 110_000) {
        s.events = Some(BTreeMap::from([("SCX_EV_SELECT_CPU_FALLBACK".to_owned(), 12.0)]));
    }
    let wave = vec![WaveNode { node: "n1", switched_at_ms: 100_000, samples: &node }];
    let cause = judged(judge(&case(&l, wave, vec![]))).failure.expect("events fail").1;
    assert_eq!(
        cause,
        "SCX_EV_SELECT_CPU_FALLBACK on n1 ran at 12.0/s (median over the bake of revision r2); the limit is 5/s (spec.rollout.analysis.events)"
    );
}

#[test]
fn an_unavailable_signal_is_not_judged_as_zero() {
    let l = limits(25.0);
    let mut node: Vec<Sample> = [samples(40, 60, |_| 1000.0), samples(110, 30, |_| 1000.0)].concat();
    for s in &mut node {
        s.run_delay_us = None;
    }
    let wave = vec![WaveNode { node: "n1", switched_at_ms: 100_000, samples: &node }];
    let j = judged(judge(&case(&l, wave, vec![])));
    assert_eq!(j.verdict, AnalysisVerdict::Inconclusive);
    assert!(j.nodes[0].detail.contains("run delay too few samples"), "{}", j.nodes[0].detail);
}

#[test]
fn event_names_from_the_spec_are_limits() {
    let spec = AnalysisSpec {
        events: vec![EventLimit { name: "SCX_EV_BYPASS_ACTIVATE".into(), max_per_second: 2 }],
        ..AnalysisSpec::default()
    };
    let l = Limits::of(&spec);
    assert_eq!((l.run_delay_percent, l.events.len()), (None, 1));
}

/// A node's samples: `level × (1 + u)`, `u` within ±`noise`, and some replaced by spikes.
fn noisy(level: f64, noise: &[f64], spikes: &[(usize, f64)], from_s: i64) -> Vec<Sample> {
    let mut s = samples(from_s, noise.len(), |i| level * (1.0 + noise[i]));
    for &(i, spike) in spikes {
        let i = i % s.len();
        s[i].run_delay_us = Some(spike);
    }
    s
}

/// Noise within ±10 %, and spikes on fewer than half of a node's samples.
fn node_noise(n: usize) -> impl Strategy<Value = (Vec<f64>, Vec<(usize, f64)>)> {
    (prop::collection::vec(-0.1f64..0.1, n), prop::collection::vec((0..n, 0.0f64..1e7), 0..(n - 1) / 2))
}

/// Spikes on distinct samples only (two spikes on one sample count once).
fn fewer_than_half(spikes: &[(usize, f64)], n: usize) -> bool {
    let mut at: Vec<usize> = spikes.iter().map(|(i, _)| i % n).collect();
    at.sort_unstable();
    at.dedup();
    at.len() * 2 < n
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A good revision is not failed by noise of ±10 % around one level on every node (wave,
    /// controls, the node's past), nor by spikes on fewer than half of any node's samples, at
    /// a limit of 25 %: (1.1 / 0.9 = 1.22 < 1.25).
    #[test]
    fn noise_of_ten_percent_never_fails_a_limit_of_twenty_five(
        level in 500.0f64..50_000.0,
        wave in prop::collection::vec((node_noise(60), node_noise(30)), 1..4),
        controls in prop::collection::vec(node_noise(30), 0..6),
    ) {
        let l = limits(25.0);
        let nodes: Vec<Vec<Sample>> = wave.iter().map(|((bn, bs), (wn, ws))| [noisy(level, bn, bs, 40), noisy(level, wn, ws, 110)].concat()).collect();
        let control: Vec<Vec<Sample>> = controls.iter().map(|(n, s)| noisy(level, n, s, 110)).collect();
        let names: Vec<String> = (0..nodes.len()).map(|i| format!("n{i}")).collect();
        let wave: Vec<WaveNode<'_>> = nodes.iter().zip(&names).map(|(s, n)| WaveNode { node: n, switched_at_ms: 100_000, samples: s }).collect();
        let j = judged(judge(&case(&l, wave, control.iter().map(Vec::as_slice).collect())));
        prop_assert_ne!(j.verdict, AnalysisVerdict::Failed, "{}", j.message);
    }

    /// A regression of 60 % on one wave node, under the same noise (and spikes on fewer than
    /// half of its samples), is caught at a limit of 25 %: 1.6 × 0.9 / 1.1 = 1.31.
    #[test]
    fn a_regression_of_sixty_percent_is_caught_at_twenty_five(
        level in 500.0f64..50_000.0,
        before in node_noise(60),
        during in node_noise(30),
        controls in prop::collection::vec(node_noise(30), 0..6),
    ) {
        prop_assume!(fewer_than_half(&during.1, 30) && fewer_than_half(&before.1, 60));
        let l = limits(25.0);
        let node = [noisy(level, &before.0, &before.1, 40), noisy(level * 1.6, &during.0, &during.1, 110)].concat();
        let control: Vec<Vec<Sample>> = controls.iter().map(|(n, s)| noisy(level, n, s, 110)).collect();
        let wave = vec![WaveNode { node: "slow", switched_at_ms: 100_000, samples: &node }];
        let j = judged(judge(&case(&l, wave, control.iter().map(Vec::as_slice).collect())));
        prop_assert_eq!(j.verdict, AnalysisVerdict::Failed, "{}", j.message);
        prop_assert_eq!(j.failure.map(|f| f.0), Some("slow".to_owned()));
    }

    /// No verdict from too few samples: fewer than minSamples in the bake never fail a node,
    /// whatever they say; within the grace the verdict waits for more.
    #[test]
    fn too_few_samples_never_fail(values in prop::collection::vec(0.0f64..1e9, 0..5), wait in any::<bool>()) {
        let l = limits(25.0);
        let node = [samples(40, 60, |_| 1.0), samples(110, values.len(), |i| values[i])].concat();
        let wave = vec![WaveNode { node: "n", switched_at_ms: 100_000, samples: &node }];
        let mut c = case(&l, wave, vec![]);
        c.may_wait = wait;
        match judge(&c) {
            Outcome::Waiting => prop_assert!(wait),
            Outcome::Judged(j) => prop_assert_eq!(j.verdict, AnalysisVerdict::Inconclusive),
        }
    }
}
