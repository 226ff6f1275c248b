use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sked_api::{AnalysisSpec, AnalysisVerdict, EventLimit, IncreasePercent};

use super::*;

/// A node's samples every 5 s: `before` (waiting tasks per CPU) from -300 s to 0 s, `after`
/// from 0 s to 60 s, each with ±4 % of noise that depends on the node.
fn node(seed: u64, before: f64, after: f64) -> NodeHealth {
    let noise = |i: i64| 1.0 + ((seed as i64 * 7919 + i * 104_729).rem_euclid(9) as f64 - 4.0) / 100.0;
    let sample = |at: i64, w: f64| Sample {
        at_ms: at * 5000,
        interval_ms: 5000,
        waiting_per_cpu: Some(w * noise(at)),
        events: Some(BTreeMap::new()),
        ..Sample::default()
    };
    NodeHealth {
        samples: (-59..=0).map(|at| sample(at, before)).chain((1..=12).map(|at| sample(at, after))).collect(),
        counters: Vec::new(),
        contracts: Vec::new(),
    }
}

fn waiting_only() -> Limits {
    Limits::of(&AnalysisSpec {
        waiting_tasks: Some(IncreasePercent { max_increase_percent: Some(50) }),
        ..AnalysisSpec::default()
    })
}

/// Judges `wave` against `controls` (name, health), with the window before frozen at 0 s and
/// the bake from 0 s to 60 s.
fn judged(limits: &Limits, wave: &[(&str, NodeHealth)], controls: &[(&str, NodeHealth)]) -> Judgement {
    let health: BTreeMap<String, NodeHealth> =
        wave.iter().chain(controls).map(|(n, h)| ((*n).to_owned(), h.clone())).collect();
    let wave_names: Vec<&str> = wave.iter().map(|(n, _)| *n).collect();
    let control_names: Vec<(&str, i64)> = controls.iter().map(|(n, _)| (*n, i64::MIN)).collect();
    let baseline = freeze(limits, "r2", Time(jiff::Timestamp::UNIX_EPOCH), &wave_names, &control_names, &health);
    let case = Case {
        revision: "r2",
        limits,
        baseline: Some(&baseline),
        from_ms: 0,
        to_ms: 60_000,
        wave: wave_names,
        controls: control_names.iter().map(|(n, _)| *n).collect(),
        health: &health,
        may_wait: false,
    };
    match judge(&case) {
        Outcome::Judged(j) => j,
        Outcome::Waiting => panic!("waiting"),
    }
}

fn controls(level: f64, change: f64) -> Vec<(&'static str, NodeHealth)> {
    ["c1", "c2", "c3", "c4", "c5"]
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            let l = level * (1.0 + i as f64 * 0.3);
            (n, node(10 + i as u64, l, l * change))
        })
        .collect()
}

/// Every node of a wave is read against the same median of the controls' changes: the fewer the
/// controls, the further out the bound (a quorum failing by chance stays within 1 in 200); a
/// node alone hardly moves it.
#[test]
fn the_bound_moves_out_as_the_controls_median_gets_less_sure() {
    let limits = Limits::of(&AnalysisSpec::default());
    let (many, fifty, few) =
        (limits.spread_z(256, 26, 200), limits.spread_z(256, 26, 50), limits.spread_z(256, 26, 10));
    assert!(many < fifty && fifty < few, "{many} {fifty} {few}");
    assert!(fifty > limits.spread_z(256, 26, 0) + 0.2, "{fifty}");
    let alone = limits.spread_z(1, 1, 50) - limits.spread_z(1, 1, 0);
    assert!(alone > 0.0 && alone < 0.1, "{alone}");
}

#[test]
fn a_quiet_node_that_triples_fails_though_the_controls_are_busier() {
    let j = judged(&waiting_only(), &[("w", node(1, 0.3, 0.9))], &controls(2.0, 1.0));
    assert_eq!(j.verdict, AnalysisVerdict::Failed, "{}", j.message);
    let (node, cause) = j.failure.unwrap_or_default();
    assert_eq!(node, "w");
    assert!(cause.starts_with("waiting tasks per CPU on w went from 0.30"), "{cause}");
    assert!(cause.contains("before its switch to 0.9"), "{cause}");
    assert!(cause.contains("beyond the median change of 5 control nodes, past their spread"), "{cause}");
}

#[test]
fn a_node_busier_than_the_controls_that_did_not_change_passes() {
    let j = judged(&waiting_only(), &[("w", node(1, 3.0, 3.0))], &controls(2.0, 1.0));
    assert_eq!(j.verdict, AnalysisVerdict::Passed, "{}", j.message);
}

#[test]
fn a_rise_the_controls_share_over_the_same_time_passes() {
    // Traffic doubled everywhere: the wave's node doubled too.
    let j = judged(&waiting_only(), &[("w", node(1, 1.0, 2.0))], &controls(1.0, 2.0));
    assert_eq!(j.verdict, AnalysisVerdict::Passed, "{}", j.message);
    let j = judged(&waiting_only(), &[("w", node(1, 1.0, 4.0))], &controls(1.0, 2.0));
    assert_eq!(j.verdict, AnalysisVerdict::Failed, "twice the controls' rise: {}", j.message);
}

#[test]
fn too_few_controls_are_inconclusive_and_no_window_before_is_nothing_to_compare() {
    let few = controls(1.0, 1.0).into_iter().take(2).collect::<Vec<_>>();
    let j = judged(&waiting_only(), &[("w", node(1, 1.0, 3.0))], &few);
    assert_eq!((j.verdict, j.doubt), (AnalysisVerdict::Inconclusive, Some(Doubt::Missing)), "{}", j.message);
    // A node with no samples before its switch (it ran the kernel's default, with no agent).
    let mut fresh = node(1, 1.0, 1.0);
    fresh.samples.retain(|s| s.at_ms > 0);
    let j = judged(&waiting_only(), &[("w", fresh)], &controls(1.0, 1.0));
    assert_eq!((j.verdict, j.doubt), (AnalysisVerdict::Inconclusive, Some(Doubt::NothingBefore)), "{}", j.message);
}

#[test]
fn a_node_silent_after_its_switch_fails() {
    let mut silent = node(1, 1.0, 1.0);
    silent.samples.retain(|s| s.at_ms <= 0);
    let j = judged(&waiting_only(), &[("w", silent)], &controls(1.0, 1.0));
    assert_eq!(j.verdict, AnalysisVerdict::Failed, "{}", j.message);
    assert!(j.failure.is_some_and(|(_, c)| c.starts_with("w sent 0 sample(s)")));
}

#[test]
fn a_wave_fails_on_its_quorum_not_on_one_node() {
    let limits = Limits::of(&AnalysisSpec {
        waiting_tasks: Some(IncreasePercent { max_increase_percent: Some(50) }),
        failed_nodes_percent: Some(50),
        critical_factor: Some(10),
        ..AnalysisSpec::default()
    });
    let wave = |slowed: usize| -> Vec<(&'static str, NodeHealth)> {
        ["w1", "w2", "w3", "w4"]
            .into_iter()
            .enumerate()
            .map(|(i, n)| (n, node(i as u64, 1.0, if i < slowed { 2.5 } else { 1.0 })))
            .collect()
    };
    let one = judged(&limits, &wave(1), &controls(1.0, 1.0));
    assert_eq!(one.verdict, AnalysisVerdict::Passed, "1 of 4 under a quorum of 2: {}", one.message);
    assert!(one.message.contains("1 over a limit, under a quorum of 2"), "{}", one.message);
    let two = judged(&limits, &wave(2), &controls(1.0, 1.0));
    assert_eq!(two.verdict, AnalysisVerdict::Failed, "{}", two.message);
    assert!(two.message.starts_with("2 of 4 node(s) failed (the quorum"), "{}", two.message);
    // Past the critical bound, one node is enough.
    let critical =
        judged(&waiting_only(), &[("w1", node(1, 1.0, 5.0)), ("w2", node(2, 1.0, 1.0))], &controls(1.0, 1.0));
    assert!(critical.message.contains("past the critical bound"), "{}", critical.message);
}

#[test]
fn an_event_counter_the_kernel_does_not_count_holds_with_an_error_and_durations_are_shares() {
    let limits = Limits::of(&AnalysisSpec {
        events: vec![EventLimit { name: "SCX_EV_TYPO".into(), max_per_second: Some(1), max_percent_of_time: None }],
        ..AnalysisSpec::default()
    });
    let mut w = node(1, 1.0, 1.0);
    w.counters = vec!["SCX_EV_BYPASS_DURATION".into()];
    let j = judged(&limits, &[("w", w.clone())], &controls(1.0, 1.0));
    assert_eq!(j.doubt, Some(Doubt::UnknownCounter), "{}", j.message);
    assert!(j.message.starts_with("spec.rollout.analysis.events names SCX_EV_TYPO, which the kernel of node w"));
    // 0.2 s of bypass a second is 20 % of the time: over a limit of 10 %.
    let share = Limits::of(&AnalysisSpec {
        events: vec![EventLimit {
            name: "SCX_EV_BYPASS_DURATION".into(),
            max_per_second: None,
            max_percent_of_time: Some(10),
        }],
        ..AnalysisSpec::default()
    });
    for s in w.samples.iter_mut() {
        s.events = Some([("SCX_EV_BYPASS_DURATION".to_owned(), 2e8)].into());
    }
    let j = judged(&share, &[("w", w)], &controls(1.0, 1.0));
    let cause = j.failure.map(|(_, c)| c).unwrap_or_default();
    assert!(cause.contains("ran at 20.00 % of the time") && cause.contains("10 % (maxPercentOfTime)"), "{cause}");
}

#[test]
fn only_samples_wholly_inside_a_window_count() {
    let s = Sample { at_ms: 10_000, interval_ms: 5000, ..Sample::default() };
    assert!(s.within(5000, 10_000));
    assert!(!s.within(5001, 10_000), "its interval began before the window");
    assert!(!s.within(0, 9999));
}

#[test]
fn the_window_before_ends_at_the_switch_and_a_control_s_starts_at_its_attach() {
    let limits = waiting_only();
    let health: BTreeMap<String, NodeHealth> =
        [("w".to_owned(), node(1, 1.0, 9.0)), ("c".to_owned(), node(2, 1.0, 1.0))].into();
    // The control attached at -100 s: 20 samples of its window are its own scheduler's.
    let b = freeze(&limits, "r2", Time(jiff::Timestamp::UNIX_EPOCH), &["w"], &[("c", -100_000)], &health);
    let of = |n: &str| b.nodes.iter().find(|x| x.node == n).and_then(|x| x.signals.get("waitingTasks").copied());
    let w = of("w").unwrap_or_else(|| panic!("the wave node's window"));
    assert_eq!(w.samples, 60, "the samples after the switch are not in it");
    assert!((w.median - 1.0).abs() < 0.05, "{}", w.median);
    assert_eq!(of("c").map(|c| c.samples), Some(20));
}

#[test]
fn defaults_judge_waiting_tasks_idle_cpus_and_pressure_when_no_signal_is_named() {
    let l = Limits::of(&AnalysisSpec::default());
    let signals: Vec<Signal> = l.signals.iter().map(|(s, _)| *s).collect();
    assert_eq!(signals, [Signal::WaitingTasks, Signal::IdleWhileWaiting, Signal::CpuPressure]);
    assert_eq!((l.min_samples, l.min_control_nodes, l.failed_nodes, l.critical_factor), (5, 3, 0.2, 3.0));
    assert!(!l.proceed_on_inconclusive);
}

#[test]
fn a_rise_from_almost_nothing_is_not_a_rise() {
    // 0.01 to 0.03 tasks waiting per CPU: three times nothing, on an idle node.
    let j = judged(&waiting_only(), &[("w", node(1, 0.01, 0.03))], &controls(0.01, 1.0));
    assert_eq!(j.verdict, AnalysisVerdict::Passed, "{}", j.message);
}

#[test]
fn the_verdict_waits_while_any_node_of_the_wave_is_short_of_samples() {
    let limits = waiting_only();
    let mut short = node(2, 1.0, 1.0);
    short.samples.retain(|s| s.at_ms <= 20_000);
    let health: BTreeMap<String, NodeHealth> = [("w1".to_owned(), node(1, 1.0, 1.0)), ("w2".to_owned(), short)]
        .into_iter()
        .chain(controls(1.0, 1.0).into_iter().map(|(n, h)| (n.to_owned(), h)))
        .collect();
    let control_names: Vec<(&str, i64)> = ["c1", "c2", "c3", "c4", "c5"].iter().map(|n| (*n, i64::MIN)).collect();
    let baseline = freeze(&limits, "r2", Time(jiff::Timestamp::UNIX_EPOCH), &["w1", "w2"], &control_names, &health);
    let case = |may_wait| Case {
        revision: "r2",
        limits: &limits,
        baseline: Some(&baseline),
        from_ms: 0,
        to_ms: 60_000,
        wave: vec!["w1", "w2"],
        controls: control_names.iter().map(|(n, _)| *n).collect(),
        health: &health,
        may_wait,
    };
    assert_eq!(judge(&case(true)), Outcome::Waiting, "one node of two is short: wait for it");
    let Outcome::Judged(j) = judge(&case(false)) else { panic!("judged past the grace") };
    assert!(j.failure.is_some_and(|(n, c)| n == "w2" && c.starts_with("w2 sent 4 sample(s)")));
}

#[test]
fn the_verdict_waits_while_too_few_controls_have_their_bake_s_samples() {
    let limits = waiting_only();
    let mut health: BTreeMap<String, NodeHealth> = [("w1".to_owned(), node(1, 1.0, 1.0))]
        .into_iter()
        .chain(controls(1.0, 1.0).into_iter().map(|(n, h)| (n.to_owned(), h)))
        .collect();
    let control_names: Vec<(&str, i64)> = ["c1", "c2", "c3", "c4", "c5"].iter().map(|n| (*n, i64::MIN)).collect();
    let baseline = freeze(&limits, "r2", Time(jiff::Timestamp::UNIX_EPOCH), &["w1"], &control_names, &health);
    // Three of five controls' reports of the bake are late (their agents reconnect).
    for c in ["c1", "c2", "c3"] {
        if let Some(h) = health.get_mut(c) {
            h.samples.retain(|s| s.at_ms <= 0);
        }
    }
    let case = |may_wait| Case {
        revision: "r2",
        limits: &limits,
        baseline: Some(&baseline),
        from_ms: 0,
        to_ms: 60_000,
        wave: vec!["w1"],
        controls: control_names.iter().map(|(n, _)| *n).collect(),
        health: &health,
        may_wait,
    };
    assert_eq!(judge(&case(true)), Outcome::Waiting, "2 of 5 controls sampled, 3 asked for: wait for them");
    let Outcome::Judged(j) = judge(&case(false)) else { panic!("judged past the grace") };
    assert_eq!(j.verdict, AnalysisVerdict::Inconclusive, "past the grace it fails closed: {}", j.message);
}

#[test]
fn the_controls_change_is_their_median_not_their_least() {
    // Four controls doubled, one halved: the fleet doubled, and the wave's node rose 75 % more.
    let controls: Vec<(&str, NodeHealth)> = [("c1", 2.0), ("c2", 2.0), ("c3", 2.0), ("c4", 2.0), ("c5", 0.5)]
        .into_iter()
        .enumerate()
        .map(|(i, (n, change))| (n, node(10 + i as u64, 1.0, change)))
        .collect();
    let j = judged(&waiting_only(), &[("w", node(1, 1.0, 3.5))], &controls);
    assert_eq!(j.verdict, AnalysisVerdict::Failed, "{}", j.message);
    assert!(j.failure.is_some_and(|(_, c)| c.contains("+7")), "75 % beyond the controls' doubling");
    let j = judged(&waiting_only(), &[("w", node(1, 1.0, 2.0))], &controls);
    assert_eq!(j.verdict, AnalysisVerdict::Passed, "{}", j.message);
}

#[test]
fn a_change_within_the_controls_own_spread_passes() {
    // The controls moved every which way (0.5x to 3.2x): a node 1.6 times their median change
    // is not outside what nodes do here.
    let controls: Vec<(&str, NodeHealth)> = [("c1", 0.5), ("c2", 1.0), ("c3", 1.6), ("c4", 2.5), ("c5", 3.2)]
        .into_iter()
        .enumerate()
        .map(|(i, (n, change))| (n, node(10 + i as u64, 1.0, change)))
        .collect();
    let j = judged(&waiting_only(), &[("w", node(1, 1.0, 2.6))], &controls);
    assert_eq!(j.verdict, AnalysisVerdict::Passed, "{}", j.message);
}

/// `cpuContract` with the default signals.
fn contract_too() -> Limits {
    Limits::of(&AnalysisSpec { cpu_contract: Some(true), ..AnalysisSpec::default() })
}

/// A node's contract: the scheduler's callbacks, and the pods read with the ones over their
/// limit (uid, used, limit, in thousandths of a CPU).
fn contract(limits: Op, requests: Op, over: &[(&str, u32, u32)]) -> NodeCpuContract {
    use crate::cpu_contract::{OverLimit, PodCpu};
    let over_limit: Vec<OverLimit> = over
        .iter()
        .map(|(uid, used, limit)| OverLimit { uid: (*uid).into(), used_millicpu: *used, limit_millicpu: *limit })
        .collect();
    let pods = PodCpu { pods: 4, limited: 1, exercised: 1, over_limit, distinct_weights: 1, ..PodCpu::default() };
    NodeCpuContract { limits, requests, unread: String::new(), pods: Some(pods), enable_seq: 2 }
}

use crate::cpu_contract::{NodeCpuContract, Op};

#[test]
fn a_wave_node_that_ran_a_pod_over_its_limit_during_the_bake_fails_the_wave_alone() {
    let mut w = node(1, 1.0, 1.0);
    // Kept at the start of the bake, broken for one window in it, kept again at its end.
    let implemented = contract(Op::Implemented, Op::Implemented, &[]);
    // Broken before the bake (another scheduler), kept at its start, broken for one window in
    // it, kept again at its end.
    w.contracts = vec![
        (-10_000, NodeCpuContract { enable_seq: 1, ..contract(Op::Missing, Op::Missing, &[("u0", 2000, 500)]) }),
        (1_000, implemented.clone()),
        (20_000, contract(Op::Implemented, Op::Implemented, &[("u1", 1380, 500)])),
        (40_000, implemented.clone()),
    ];
    let mut quiet = node(2, 1.0, 1.0);
    quiet.contracts = vec![(1_000, implemented)];
    let j = judged(&contract_too(), &[("w", w), ("q", quiet)], &controls(1.0, 1.0));
    assert_eq!(j.verdict, AnalysisVerdict::Failed, "{}", j.message);
    let (failed, cause) = j.failure.unwrap_or_default();
    assert_eq!(failed, "w");
    assert_eq!(
        cause,
        "pod UID u1 used 1.38 CPU against its limit of 0.50 on node w under revision r2: the scheduler takes \
         cpu.max (ops.cgroup_set_bandwidth) but does not keep it"
    );
    // Without cpuContract the same wave passes on its signals.
    let mut w = node(1, 1.0, 1.0);
    w.contracts = vec![(20_000, contract(Op::Missing, Op::Missing, &[("u1", 1380, 500)]))];
    assert_eq!(judged(&waiting_only(), &[("w", w)], &controls(1.0, 1.0)).verdict, AnalysisVerdict::Passed);
}

#[test]
fn a_missing_callback_where_pods_need_it_fails_and_a_breach_after_the_bake_does_not_count() {
    let mut w = node(1, 1.0, 1.0);
    w.contracts = vec![(5_000, contract(Op::Missing, Op::Implemented, &[]))];
    let j = judged(&contract_too(), &[("w", w.clone())], &controls(1.0, 1.0));
    let cause = j.failure.map(|(_, c)| c).unwrap_or_default();
    assert!(cause.starts_with("1 pod(s) with a CPU limit run on node w under revision r2"), "{cause}");
    assert!(cause.ends_with("no ops.cgroup_set_bandwidth)"), "{cause}");
    // A later window that measured a pod over its limit names that pod instead.
    w.contracts.push((9_000, contract(Op::Missing, Op::Implemented, &[("u2", 1900, 500)])));
    let j = judged(&contract_too(), &[("w", w)], &controls(1.0, 1.0));
    let cause = j.failure.map(|(_, c)| c).unwrap_or_default();
    assert!(cause.starts_with("pod UID u2 used 1.90 CPU against its limit of 0.50 on node w"), "{cause}");
    // Pods not read prove nothing either way: the missing callback alone does not fail the
    // bake, and the wave is not passed on it either.
    let mut unread = node(1, 1.0, 1.0);
    let no_pods = NodeCpuContract { pods: None, ..contract(Op::Missing, Op::Missing, &[]) };
    unread.contracts = vec![(5_000, no_pods)];
    let j = judged(&contract_too(), &[("w", unread)], &controls(1.0, 1.0));
    assert_eq!(j.verdict, AnalysisVerdict::Inconclusive, "{}", j.message);
    let mut late = node(1, 1.0, 1.0);
    late.contracts = vec![
        (5_000, contract(Op::Implemented, Op::Implemented, &[])),
        (61_000, contract(Op::Implemented, Op::Implemented, &[("u1", 900, 500)])),
    ];
    assert_eq!(judged(&contract_too(), &[("w", late)], &controls(1.0, 1.0)).verdict, AnalysisVerdict::Passed);
}

#[test]
fn a_node_that_switched_before_the_bake_began_is_judged_on_what_its_scheduler_said_since() {
    // It attached before the wave's newest node (when the bake starts), said it all then, and
    // nothing changed since: no entry inside the bake, the one in effect counts.
    let mut early = node(1, 1.0, 1.0);
    early.contracts = vec![(-3_000, contract(Op::Missing, Op::Implemented, &[]))];
    let j = judged(&contract_too(), &[("w", early)], &controls(1.0, 1.0));
    let cause = j.failure.map(|(_, c)| c).unwrap_or_default();
    assert!(cause.starts_with("1 pod(s) with a CPU limit run on node w"), "{cause}");
    // The same entry from the scheduler it ran before (another enable) does not.
    let mut switched = node(1, 1.0, 1.0);
    let before = NodeCpuContract { enable_seq: 1, ..contract(Op::Missing, Op::Implemented, &[]) };
    switched.contracts = vec![(-3_000, before), (1_000, contract(Op::Implemented, Op::Implemented, &[]))];
    assert_eq!(judged(&contract_too(), &[("w", switched)], &controls(1.0, 1.0)).verdict, AnalysisVerdict::Passed);
}

#[test]
fn the_verdict_waits_for_the_first_reading_of_the_wave_s_pods_but_not_to_fail() {
    let limits = contract_too();
    let mut w = node(1, 1.0, 1.0);
    // Only the callbacks so far: the agent's first window of the pods comes with a heartbeat.
    w.contracts = vec![(1_000, NodeCpuContract { pods: None, ..contract(Op::Missing, Op::Missing, &[]) })];
    let health: BTreeMap<String, NodeHealth> = [("w".to_owned(), w.clone())].into();
    let case = |health| Case {
        revision: "r2",
        limits: &limits,
        baseline: None,
        from_ms: 0,
        to_ms: 60_000,
        wave: vec!["w"],
        controls: Vec::new(),
        health,
        may_wait: true,
    };
    assert_eq!(judge(&case(&health)), Outcome::Waiting);
    w.contracts.push((12_000, contract(Op::Missing, Op::Missing, &[("u1", 1700, 500)])));
    let health: BTreeMap<String, NodeHealth> = [("w".to_owned(), w)].into();
    let Outcome::Judged(j) = judge(&case(&health)) else { panic!("judged at once") };
    assert_eq!(j.verdict, AnalysisVerdict::Failed, "{}", j.message);
    // Past the grace, a node that still sent no reading holds the wave, even one with nothing
    // before to compare its signals with.
    let unread: BTreeMap<String, NodeHealth> = [("w".to_owned(), node(1, 1.0, 1.0))].into();
    let Outcome::Judged(j) = judge(&Case { may_wait: false, ..case(&unread) }) else { panic!("judged") };
    assert_eq!((j.verdict, j.doubt), (AnalysisVerdict::Inconclusive, Some(Doubt::Missing)), "{}", j.message);
}

#[test]
fn a_wave_node_that_did_not_say_leaves_a_passing_wave_inconclusive() {
    // What it said before the bake, under the scheduler it ran then, does not count.
    let mut before = node(1, 1.0, 1.0);
    let previous = NodeCpuContract { enable_seq: 1, ..contract(Op::Implemented, Op::Implemented, &[]) };
    let unread_now = NodeCpuContract { pods: None, ..contract(Op::Missing, Op::Missing, &[]) };
    before.contracts = vec![(-1_000, previous), (2_000, unread_now)];
    let j = judged(&contract_too(), &[("w", before)], &controls(1.0, 1.0));
    assert_eq!((j.verdict, j.doubt), (AnalysisVerdict::Inconclusive, Some(Doubt::Missing)), "{}", j.message);
    assert!(
        j.message.contains("1 node(s) did not say whether their pods' CPU limits and requests hold (w)"),
        "{}",
        j.message
    );
    // A failing signal still fails the wave: the contract's silence does not hide it.
    let j = judged(&contract_too(), &[("w", node(1, 0.3, 0.9))], &controls(1.0, 1.0));
    assert_eq!(j.verdict, AnalysisVerdict::Failed, "{}", j.message);
}
