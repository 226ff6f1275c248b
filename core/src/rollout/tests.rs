use super::*;
use crate::analysis;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use proptest::prelude::*;
use sked_api::{AnalysisStatus, Revision, RolloutFailure, RolloutSpec, RolloutStatus, WaveBaseline};
use std::collections::BTreeMap;

pub(super) const T: &str = "new";
pub(super) const S: &str = "old";

pub(super) fn pacing(canary: usize, max_unavailable: usize) -> Pacing {
    Pacing { canary, max_unavailable, bake_seconds: 30, attach_timeout_seconds: 120, paused: false }
}

pub(super) fn node(name: &str, revision: &str, kernel: KernelView) -> NodeView {
    NodeView {
        node: name.into(),
        pod: Some(PodView {
            name: format!("{name}-{revision}"),
            revision: revision.into(),
            ready_since: match kernel {
                KernelView::Attached { since } => Some(since),
                _ => None,
            },
            created: 0,
            crash_looping: false,
            bound: true,
            started: true,
            pull_error: None,
            last_exit: None,
            terminating_since: None,
        }),
        kernel,
        exit: None,
        just_labelled: false,
        just_replaced: false,
        unfit: None,
        entered_at: None,
        scheduler_stats: None,
    }
}

/// A labelled node whose pod is not there (yet).
fn pod_less(name: &str) -> NodeView {
    NodeView { pod: None, ..node(name, T, KernelView::Unknown) }
}

pub(super) fn up(name: &str, revision: &str) -> NodeView {
    node(name, revision, KernelView::Attached { since: 0 })
}

/// Decides with the default pacing at t=1000, the DaemonSet expecting `expected` pods.
fn decide_expecting(nodes: &[NodeView], stable: Option<&str>, expected: usize) -> Decision {
    decide(&Input {
        target: T,
        stable,
        nodes,
        entering: &[],
        held: &[],
        expected_pods: expected,
        retried_after: None,
        pacing: pacing(1, 1),
        analysis: None,
        canary_gate: &CanaryGate::Open,
        now: 1000,
    })
}

pub(super) fn decide_at(nodes: &[NodeView], pacing: Pacing, now: i64) -> Decision {
    decide(&input_at(nodes, pacing, now))
}

pub(super) fn input_at(nodes: &[NodeView], pacing: Pacing, now: i64) -> Input<'_> {
    Input {
        target: T,
        stable: Some(S),
        nodes,
        entering: &[],
        held: &[],
        expected_pods: nodes.len(),
        retried_after: None,
        pacing,
        analysis: None,
        canary_gate: &CanaryGate::Open,
        now,
    }
}

/// A baseline frozen at 0 s for `wave`, each node with 60 samples of waiting tasks.
fn baseline_of(wave: &[&str]) -> WaveBaseline {
    let summary = sked_api::SignalSummary { median: 0.5, spread: 0.05, samples: 60 };
    WaveBaseline {
        revision: T.into(),
        taken_at: Time(jiff::Timestamp::UNIX_EPOCH),
        window_seconds: 300,
        nodes: wave
            .iter()
            .map(|n| sked_api::NodeBaseline {
                node: (*n).into(),
                control: false,
                signals: [("waitingTasks".to_owned(), summary)].into(),
            })
            .collect(),
    }
}

fn verdict(verdict: sked_api::AnalysisVerdict, holds: bool, generation: i64, at: i64) -> AnalysisStatus {
    AnalysisStatus {
        revision: T.into(),
        verdict,
        generation: Some(generation),
        holds,
        message: String::new(),
        nodes: Vec::new(),
        time: Time(jiff::Timestamp::from_second(at).unwrap_or_default()),
    }
}

#[test]
fn a_bake_judged_already_is_not_judged_again() {
    let mut nodes: Vec<NodeView> = (0..5).map(|i| up(&format!("n{i}"), S)).collect();
    nodes[0] = node("n0", T, KernelView::Attached { since: 110 });
    let limits = analysis::Limits::of(&sked_api::AnalysisSpec::default());
    let health = std::collections::BTreeMap::new();
    let baseline = baseline_of(&["n0"]);
    let passed = |at: i64| verdict(sked_api::AnalysisVerdict::Passed, false, 1, at);
    let at = |judged_at: Option<i64>| {
        let last = judged_at.map(passed);
        decide(&Input {
            analysis: Some(Analysis {
                limits: &limits,
                health: &health,
                last: last.as_ref(),
                baseline: Some(&baseline),
                generation: 1,
            }),
            ..input_at(&nodes, pacing(1, 2), 140)
        })
    };
    let waiting = at(None);
    assert_eq!((waiting.replace.len(), waiting.recheck_in), (0, Some(5)), "no samples yet: the verdict waits");
    let judged = at(Some(140));
    assert_eq!(judged.replace.len(), 2, "judged when this bake ended: the next wave, no new verdict");
    assert!(judged.analysis.is_none());
    let before = at(Some(139));
    assert_eq!(before.replace.len(), 2, "the node switched before the last verdict was judged by it: no wave to judge");
    assert!(before.analysis.is_none());
}

#[test]
fn an_inconclusive_verdict_that_holds_pauses_until_the_generation_moves() {
    let mut nodes: Vec<NodeView> = (0..5).map(|i| up(&format!("n{i}"), S)).collect();
    nodes[0] = node("n0", T, KernelView::Attached { since: 110 });
    let limits = analysis::Limits::of(&sked_api::AnalysisSpec::default());
    let health = std::collections::BTreeMap::new();
    let baseline = baseline_of(&["n0"]);
    let at = |generation: i64, last: &AnalysisStatus, now: i64| {
        decide(&Input {
            analysis: Some(Analysis {
                limits: &limits,
                health: &health,
                last: Some(last),
                baseline: Some(&baseline),
                generation,
            }),
            ..input_at(&nodes, pacing(1, 2), now)
        })
    };
    let held = verdict(sked_api::AnalysisVerdict::Inconclusive, true, 1, 140);
    let paused = at(1, &held, 200);
    assert_eq!((paused.phase, paused.replace.len()), (RolloutPhase::Paused, 0));
    let proceeded = at(2, &held, 200);
    assert_eq!(proceeded.replace.len(), 2, "a new generation (kubectl sked rollout proceed) goes on");
    let let_go = verdict(sked_api::AnalysisVerdict::Inconclusive, false, 1, 140);
    assert_eq!(at(1, &let_go, 200).replace.len(), 2, "an Inconclusive verdict that did not hold");
}

#[test]
fn a_silent_node_fails_and_missing_controls_pause_the_rollout() {
    let mut nodes: Vec<NodeView> = (0..5).map(|i| up(&format!("n{i}"), S)).collect();
    nodes[0] = node("n0", T, KernelView::Attached { since: 110 });
    let limits = analysis::Limits::of(&sked_api::AnalysisSpec::default());
    let baseline = baseline_of(&["n0"]);
    let sample = |at: i64| analysis::Sample {
        at_ms: at * 1000,
        interval_ms: 5000,
        waiting_per_cpu: Some(0.5),
        idle_while_waiting: Some(0.02),
        cpu_pressure: Some(30.0),
        ..analysis::Sample::default()
    };
    let decide_with = |health: &std::collections::BTreeMap<String, analysis::NodeHealth>| {
        decide(&Input {
            analysis: Some(Analysis { limits: &limits, health, last: None, baseline: Some(&baseline), generation: 1 }),
            ..input_at(&nodes, pacing(1, 2), 200)
        })
    };
    let silent = decide_with(&std::collections::BTreeMap::new());
    let failure = silent.failure.unwrap_or_else(|| panic!("a silent node fails"));
    assert!(failure.by_analysis && failure.cause.starts_with("n0 sent 0 sample(s)"), "{}", failure.cause);
    let heard: std::collections::BTreeMap<String, analysis::NodeHealth> = [(
        "n0".to_owned(),
        analysis::NodeHealth {
            samples: (115..=200).step_by(5).map(sample).collect(),
            counters: Vec::new(),
            contracts: Vec::new(),
        },
    )]
    .into();
    let paused = decide_with(&heard);
    assert_eq!((paused.phase, paused.replace.len(), paused.analysis_holds), (RolloutPhase::Paused, 0, true));
    let message = paused.analysis.map(|j| j.message).unwrap_or_default();
    assert!(message.contains("could not be judged") && message.contains("kubectl sked rollout proceed"), "{message}");
}

#[test]
fn the_stable_revision_restored_is_not_judged() {
    let mut nodes: Vec<NodeView> = (0..5).map(|i| up(&format!("n{i}"), S)).collect();
    nodes[0] = node("n0", S, KernelView::Attached { since: 110 });
    let limits = analysis::Limits::of(&sked_api::AnalysisSpec::default());
    let health = std::collections::BTreeMap::new();
    let baseline = WaveBaseline { revision: S.into(), ..baseline_of(&["n0"]) };
    let joining = entering(&["e1"], false);
    let plan = decide(&Input {
        target: S,
        stable: Some(S),
        entering: &joining,
        analysis: Some(Analysis {
            limits: &limits,
            health: &health,
            last: None,
            baseline: Some(&baseline),
            generation: 1,
        }),
        ..input_at(&nodes, pacing(1, 2), 200)
    });
    assert!(plan.analysis.is_none() && plan.failure.is_none(), "{plan:?}");
}

#[test]
fn a_canary_that_goes_not_ready_within_its_bake_fails_the_revision_with_analysis() {
    let mut nodes: Vec<NodeView> = (0..5).map(|i| up(&format!("n{i}"), S)).collect();
    nodes[0] = NodeView { unfit: Some(Skip::NodeNotReady), ..node("n0", T, KernelView::Attached { since: 20 }) };
    let limits = analysis::Limits::of(&sked_api::AnalysisSpec::default());
    let health = std::collections::BTreeMap::new();
    let with = decide(&Input {
        analysis: Some(Analysis { limits: &limits, health: &health, last: None, baseline: None, generation: 1 }),
        ..input_at(&nodes, pacing(1, 2), 60)
    });
    let failure = with.failure.unwrap_or_else(|| panic!("the canary fell"));
    assert!(failure.cause.starts_with("node n0 went NotReady 60s after its switch"), "{}", failure.cause);
    let without = decide(&input_at(&nodes, pacing(1, 2), 60));
    assert!(without.failure.is_none() && without.skipped == ["n0"], "without analysis it is the node's trouble");
    let later = decide(&Input {
        analysis: Some(Analysis { limits: &limits, health: &health, last: None, baseline: None, generation: 1 }),
        ..input_at(&nodes, pacing(1, 2), 60 + 181)
    });
    assert!(later.failure.is_none() && later.skipped == ["n0"], "past two bakes and its attach timeout");
}

#[test]
fn defaults_and_percentages() {
    let p = Pacing::of(None, 10);
    assert_eq!((p.canary, p.max_unavailable, p.bake_seconds, p.attach_timeout_seconds), (1, 2, 30, 120));
    assert_eq!(Pacing::of(None, 3).max_unavailable, 1, "a quarter, at least one node");
    assert_eq!(Pacing::of(None, 5_000).max_unavailable, 1_250);
    let spec = RolloutSpec { max_unavailable: Some(IntOrString::String("25%".into())), ..Default::default() };
    assert_eq!(Pacing::of(Some(&spec), 10).max_unavailable, 2);
    assert_eq!(Pacing::of(Some(&spec), 3).max_unavailable, 1, "at least one node");
}

#[test]
fn a_canary_first_then_waves_after_each_bake() {
    let nodes: Vec<NodeView> = (0..5).map(|i| up(&format!("n{i}"), S)).collect();
    let plan = decide_at(&nodes, pacing(1, 2), 100);
    assert_eq!((plan.phase, plan.replace.clone()), (RolloutPhase::Canary, vec!["n0-old".to_string()]));

    // The canary runs but has not attached: nothing more.
    let mut nodes = nodes;
    nodes[0] = node("n0", T, KernelView::NotAttached);
    let plan = decide_at(&nodes, pacing(1, 2), 100);
    assert_eq!((plan.phase, plan.replace.len()), (RolloutPhase::Canary, 0));
    assert_eq!(plan.recheck_in, Some(20), "the attach deadline");

    // Attached at 110: baking until 140.
    nodes[0] = node("n0", T, KernelView::Attached { since: 110 });
    let plan = decide_at(&nodes, pacing(1, 2), 120);
    assert_eq!((plan.phase, plan.replace.len(), plan.recheck_in), (RolloutPhase::Canary, 0, Some(20)));

    // Baked: a wave of two.
    let plan = decide_at(&nodes, pacing(1, 2), 140);
    assert_eq!((plan.phase, plan.replace.clone()), (RolloutPhase::Rolling, vec!["n1-old".into(), "n2-old".into()]));
}

#[test]
fn a_first_deployments_last_wave_bakes_too() {
    let first = |nodes: &[NodeView], now: i64| decide(&Input { stable: None, ..input_at(nodes, pacing(1, 2), now) });
    // One node: its canary is the last wave, and bakes before Complete.
    let one = [node("n0", T, KernelView::Attached { since: 100 })];
    let plan = first(&one, 105);
    assert_eq!((plan.phase, plan.recheck_in), (RolloutPhase::Canary, Some(25)), "baking until 130");
    assert_eq!(first(&one, 130).phase, RolloutPhase::Complete);
    // Two nodes: the second attached at 150 bakes until 180.
    let two = [node("n0", T, KernelView::Attached { since: 100 }), node("n1", T, KernelView::Attached { since: 150 })];
    let plan = first(&two, 151);
    assert_eq!((plan.phase, plan.recheck_in), (RolloutPhase::Rolling, Some(29)));
    assert_eq!(first(&two, 180).phase, RolloutPhase::Complete);
    // Ejected during that bake: the revision fails, with nothing to go back to but the
    // kernel's default.
    let ejected = [node("n0", T, KernelView::Attached { since: 100 }), node("n1", T, KernelView::Ejected)];
    let plan = first(&ejected, 170);
    assert_eq!(plan.phase, RolloutPhase::RolledBack);
    let failure = plan.failure.as_ref().map(|f| (f.node.as_str(), f.cause.as_str()));
    assert!(
        failure.is_some_and(|(n, c)| n == "n1" && c.contains("kernel stopped running the scheduler")),
        "{failure:?}"
    );
}

#[test]
fn a_pod_this_term_replaced_counts_as_switching_until_its_successor_shows() {
    // n0 was replaced as the canary moments ago; the watch shows it gone and its
    // successor not made yet, and the DaemonSet's count dropped meanwhile (a node deleted):
    // nothing says a pod is owed there, but this term's own write does.
    let mut nodes: Vec<NodeView> = (0..8).map(|i| up(&format!("n{i}"), S)).collect();
    nodes[0] = NodeView { just_replaced: true, ..pod_less("n0") };
    let plan = decide(&Input { expected_pods: 7, ..input_at(&nodes, pacing(1, 2), 100) });
    assert_eq!((plan.phase, plan.replace.clone()), (RolloutPhase::Canary, vec![]), "one canary, not two");
    // Without that memory, the node looks like one the DaemonSet owes nothing.
    nodes[0].just_replaced = false;
    let plan = decide(&Input { expected_pods: 7, ..input_at(&nodes, pacing(1, 2), 100) });
    assert_eq!(plan.replace.len(), 1, "the race the memory closes: a second canary");
}

#[test]
fn failures_of_the_new_revision() {
    let timeout = decide_at(&[node("a", T, KernelView::NotAttached), up("b", S)], pacing(1, 1), 120);
    assert_eq!(timeout.phase, RolloutPhase::RolledBack);
    let failure = timeout.failure.unwrap();
    assert_eq!(failure.node, "a");
    assert!(failure.cause.contains("attachTimeoutSeconds"), "{}", failure.cause);
    assert!(failure.cause.starts_with("the kernel did not run the scheduler within 120s"), "{}", failure.cause);

    // Attached in the kernel, but the pod never Ready: the cause says so, not "did not attach".
    let mut unready = node("a", T, KernelView::Attached { since: 5 });
    if let Some(pod) = unready.pod.as_mut() {
        pod.ready_since = None;
    }
    let cause = decide_at(&[unready, up("b", S)], pacing(1, 1), 120).failure.unwrap().cause;
    assert!(cause.contains("reports the scheduler attached, but pod a-new did not become Ready"), "{cause}");
    // Nothing heard from the agent, and no readiness either.
    let mut silent = node("a", T, KernelView::Unknown);
    if let Some(pod) = silent.pod.as_mut() {
        pod.ready_since = None;
    }
    let cause = decide_at(&[silent, up("b", S)], pacing(1, 1), 120).failure.unwrap().cause;
    assert!(
        cause.contains("did not become Ready within 120s") && cause.contains("its agent sent no report"),
        "{cause}"
    );

    let ejected = decide_at(&[node("a", T, KernelView::Ejected), up("b", S)], pacing(1, 1), 10);
    assert!(ejected.failure.unwrap().cause.contains("stopped running"));
    // With the kernel log read, the cause is the kernel's own.
    let why = "the kernel ejected lavd at 2026-12-01T00:00:00.000Z (runnable task stall)";
    let exit = sked_api::KernelExit {
        node: "a".into(),
        ops: "lavd".into(),
        reason: "runnable task stall".into(),
        time: "2026-12-01T00:00:00.000Z".into(),
        ejected: true,
        trace: vec!["scx_watchdog_workfn+0x15b/0x1f0".into()],
        ..Default::default()
    };
    let said = NodeView { exit: Some(exit.clone()), ..node("a", T, KernelView::Ejected) };
    let failure = decide_at(&[said, up("b", S)], pacing(1, 1), 10).failure.unwrap();
    assert!(failure.cause.ends_with(why));
    // The kernel's exit, backtrace included, is kept with the failure as its evidence.
    let evidence = failure.evidence.unwrap();
    assert_eq!((evidence.kernel_exit, evidence.scheduler_exit), (Some(exit), None));

    let mut crashing = node("a", T, KernelView::NotAttached);
    crashing.pod.as_mut().unwrap().crash_looping = true;
    let plan = decide_at(&[crashing.clone(), up("b", S)], pacing(1, 1), 10);
    assert!(plan.failure.unwrap().cause.contains("crash-looping"));
    // What the scheduler said as it ended is the cause's end.
    crashing.pod.as_mut().unwrap().last_exit = Some("exit code 1: libbpf: failed to open system Kconfig".into());
    let plan = decide_at(&[crashing, up("b", S)], pacing(1, 1), 10);
    assert_eq!(
        plan.failure.map(|f| f.cause).as_deref(),
        Some(
            "the scheduler container is crash-looping; it last ended with exit code 1: libbpf: failed to open system Kconfig"
        )
    );
}

#[test]
fn unsupported_and_foreign_nodes_are_skipped_not_failed() {
    let nodes = [node("a", S, KernelView::Unsupported), node("b", T, KernelView::Foreign), up("c", T), up("d", S)];
    let plan = decide_at(&nodes, pacing(1, 1), 1000);
    assert_eq!(plan.skipped, vec!["a".to_string(), "b".to_string()]);
    assert_eq!(plan.failure, None);
    assert_eq!(plan.replace, vec!["d-old".to_string()]);
    let done = decide_at(&[node("a", S, KernelView::Unsupported), up("c", T)], pacing(1, 1), 1000);
    assert!(done.complete());
}

#[test]
fn nodes_the_daemonset_puts_no_pod_on_do_not_hold_a_rollout() {
    let no_pod = pod_less("tainted");
    let nodes = [up("a", T), up("b", S), no_pod.clone()];
    // The DaemonSet means to run two pods: the pod-less node is not one of them.
    let plan = decide_expecting(&nodes, Some(S), 2);
    assert_eq!(plan.replace, vec!["b-old".to_string()]);
    // It means to run three: the third is on its way, so the next wave waits.
    let plan = decide_expecting(&nodes, Some(S), 3);
    assert!(plan.replace.is_empty());
    // A pod terminating for longer than the attach timeout (its node unreachable) holds nothing.
    let mut stuck = up("c", S);
    stuck.pod.as_mut().unwrap().terminating_since = Some(0);
    let nodes = [up("a", T), up("b", S), stuck];
    let plan = decide_expecting(&nodes, Some(S), 2);
    assert_eq!(plan.replace, vec!["b-old".to_string()]);
    // ...but one deleted a moment ago is being replaced.
    let mut deleted = up("c", S);
    deleted.pod.as_mut().unwrap().terminating_since = Some(990);
    let nodes = [up("a", T), up("b", S), deleted];
    let plan = decide_expecting(&nodes, Some(S), 3);
    assert!(plan.replace.is_empty());
}

#[test]
fn nothing_is_complete_while_the_daemonset_expects_more_pods_than_run_attached() {
    // A pod the index has not seen yet: the node looks pod-less, the DaemonSet expects it.
    let nodes = [up("a", T), pod_less("b")];
    let plan = decide_expecting(&nodes, None, 2);
    assert!(!plan.complete());
    let plan = decide_expecting(&nodes[..1], None, 2);
    assert!(!plan.complete(), "fewer attached than expected");
    let plan = decide_expecting(&nodes[..1], None, 1);
    assert!(plan.complete());
    // A DaemonSet that has not counted the node yet (its owner label is on its way) does not
    // make a revision that runs nowhere complete.
    let pod_less = [pod_less("b")];
    let plan = decide_expecting(&pod_less, None, 0);
    assert!(!plan.complete());
    // Nor is it looked at again on a timer: what ends the wait (a pod, the DaemonSet's
    // count) is an event, and nodes the DaemonSet never puts a pod on (taints) stay idle.
    assert_eq!(plan.recheck_in, None);
    assert!(decide_expecting(&[], None, 0).complete(), "no node at all: nothing to wait for");
}

#[test]
fn paused_starts_no_wave() {
    let mut p = pacing(1, 1);
    p.paused = true;
    let plan = decide_at(&[up("a", T), up("b", S)], p, 1000);
    assert_eq!((plan.phase, plan.replace.len()), (RolloutPhase::Paused, 0));
}

#[test]
fn restoring_the_stable_revision_replaces_every_other_pod_at_once() {
    let nodes = [up("a", "bad"), node("b", "bad", KernelView::NotAttached), up("c", S)];
    let plan = decide(&Input {
        target: S,
        stable: Some(S),
        nodes: &nodes,
        entering: &[],
        held: &[],
        expected_pods: 3,
        retried_after: None,
        pacing: pacing(1, 1),
        analysis: None,
        canary_gate: &CanaryGate::Open,
        now: 0,
    });
    assert_eq!(plan.replace, vec!["b-bad".to_string(), "a-bad".to_string()]);
    assert_eq!(plan.failure, None);
}

// A simulated cluster: the DaemonSet controller recreates a deleted pod at the target
// revision; a new pod attaches `attach_after` seconds after its creation unless its node is
// broken for the target revision.
#[derive(Clone, Debug)]
struct Sim {
    nodes: BTreeMap<String, (String, i64)>, // node -> (revision, created)
    broken: Vec<String>,
    attach_after: i64,
    replaced: BTreeMap<String, usize>,
}

impl Sim {
    fn new(count: usize, broken: Option<String>, attach_after: i64) -> Self {
        Sim {
            nodes: (0..count).map(|i| (format!("n{i:02}"), (S.to_owned(), 0))).collect(),
            broken: broken.into_iter().collect(),
            attach_after,
            replaced: BTreeMap::new(),
        }
    }

    fn views(&self, now: i64) -> Vec<NodeView> {
        self.nodes
            .iter()
            .map(|(n, (rev, created))| {
                let attached = !(rev == T && self.broken.contains(n)) && now >= created + self.attach_after;
                let mut v = node(
                    n,
                    rev,
                    if attached {
                        KernelView::Attached { since: created + self.attach_after }
                    } else {
                        KernelView::NotAttached
                    },
                );
                if let Some(p) = v.pod.as_mut() {
                    p.created = *created;
                    p.name = format!("{n}/{created}");
                }
                v
            })
            .collect()
    }

    fn unavailable(&self, now: i64) -> usize {
        self.views(now).iter().filter(|v| !matches!(v.kernel, KernelView::Attached { .. })).count()
    }

    fn apply(&mut self, plan: &Decision, target: &str, now: i64) {
        for pod in &plan.replace {
            let node = pod.split('/').next().unwrap_or_default().to_owned();
            *self.replaced.entry(node.clone()).or_default() += 1;
            self.nodes.insert(node, (target.to_owned(), now));
        }
    }
}

fn revision(name: &str, generation: i64) -> Revision {
    Revision { name: name.into(), image: format!("r.io/s@sha256:{name}"), generation, spec: None, agent_image: None }
}

fn progress<'a>(previous: &'a RolloutStatus, plan: &'a Decision, template: Revision) -> Progress<'a> {
    Progress {
        previous,
        failed: None,
        plan,
        wanted: None,
        template,
        caught_up: true,
        now: Time(k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap()),
    }
}

#[test]
fn a_complete_revision_becomes_the_current_one() {
    let previous = RolloutStatus { current_revision: Some(revision(S, 1)), ..Default::default() };
    let plan = Decision { phase: RolloutPhase::Complete, updated: 2, attached: 2, ..Default::default() };
    let mut p = progress(&previous, &plan, revision(T, 2));
    p.wanted = Some((T, "r.io/s@sha256:new"));
    let step = advance(&p);
    assert_eq!(step.status.current_revision, Some(revision(T, 2)));
    assert_eq!((step.status.updated_nodes, step.status.attached_nodes), (2, 2));
    // A template the spec does not ask for (its image refused) is not made current.
    p.wanted = None;
    assert_eq!(advance(&p).status.current_revision, Some(revision(S, 1)));
    // Nor one that is not yet the revision asked for: that rollout has not begun.
    p.wanted = Some(("newer", "r.io/s@sha256:newer"));
    let step = advance(&p);
    assert_eq!((step.status.phase, step.status.current_revision), (RolloutPhase::Rolling, Some(revision(S, 1))));
}

#[test]
fn a_failure_rolls_back_when_there_is_something_to_go_back_to() {
    let failure = Failure { node: "n1".into(), cause: "crash".into(), by_analysis: false, evidence: None };
    let plan = Decision { failure: Some(failure), replace: vec!["p".into()], ..Default::default() };
    let previous = RolloutStatus { current_revision: Some(revision(S, 1)), ..Default::default() };
    let step = advance(&progress(&previous, &plan, revision(T, 2)));
    assert!(step.roll_back);
    assert_eq!(step.status.phase, RolloutPhase::RolledBack);
    assert!(step.replace.is_empty());
    let recorded = step.status.failed.clone().unwrap();
    assert_eq!((recorded.revision.as_str(), recorded.generation, recorded.node.as_str()), (T, 2, "n1"));
    assert_eq!(step.newly_failed, Some(recorded));

    // A first revision goes back to revision zero: every node it reached loses the owner
    // label, and no node waiting to enter gets it.
    let first = RolloutStatus::default();
    let plan = Decision { labelled: vec!["n1".into(), "n2".into()], admit: vec!["joined".into()], ..plan };
    let step = advance(&progress(&first, &plan, revision(T, 2)));
    assert!(!step.roll_back && step.newly_failed.is_some());
    assert_eq!(step.status.phase, RolloutPhase::Failed);
    assert_eq!(step.evict, vec!["n1".to_string(), "n2".to_string()]);
    assert!(step.admit.is_empty());
    // ...and stays there while the failure is recorded (a rollback cut short is carried on).
    let recorded = step.status.failed.clone().unwrap();
    let after = RolloutStatus { failed: Some(recorded.clone()), ..RolloutStatus::default() };
    let plan = Decision {
        phase: RolloutPhase::Rolling,
        labelled: vec!["n2".into()],
        admit: vec!["n3".into()],
        entering: 2,
        desired: 4,
        ..Decision::default()
    };
    let mut p = progress(&after, &plan, revision(T, 2));
    p.failed = Some(&recorded);
    let step = advance(&p);
    // DESIRED leaves out the nodes that wait to enter: none gets a pod until the spec changes.
    assert_eq!((step.desired, step.status.entering_nodes), (1, 3));
    assert_eq!((step.evict, step.admit, step.status.phase), (vec!["n2".to_string()], vec![], RolloutPhase::Failed));
}

#[test]
fn back_on_the_stable_revision_the_nodes_waiting_to_enter_still_count() {
    // A later revision failed and the template is the stable one again: nodes being taken over
    // still enter in waves, so DESIRED keeps them.
    let failed = RolloutFailure {
        revision: T.into(),
        generation: 2,
        node: "n1".into(),
        cause: "crash".into(),
        time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        reason: None,
        evidence: None,
    };
    let previous =
        RolloutStatus { current_revision: Some(revision(S, 1)), failed: Some(failed.clone()), ..Default::default() };
    let plan = Decision { entering: 2, desired: 5, ..Default::default() };
    let mut p = progress(&previous, &plan, revision(S, 1));
    p.failed = Some(&failed);
    assert_eq!(advance(&p).desired, 5);
}

pub(super) fn entering(names: &[&str], joined: bool) -> Vec<Entering> {
    names.iter().map(|n| Entering { node: (*n).into(), joined, runs_it: false, unfit: None }).collect()
}

fn decide_first(nodes: &[NodeView], entering: &[Entering], pacing: Pacing, now: i64) -> Decision {
    decide(&Input {
        target: T,
        stable: None,
        nodes,
        entering,
        held: &[],
        expected_pods: nodes.len(),
        retried_after: None,
        pacing,
        analysis: None,
        canary_gate: &CanaryGate::Open,
        now,
    })
}

#[test]
fn a_first_deployment_leaves_revision_zero_canary_first_then_in_waves() {
    let waiting = entering(&["a", "b", "c", "d", "e"], false);
    let plan = decide_first(&[], &waiting, pacing(1, 2), 100);
    assert_eq!((plan.phase, plan.admit.clone(), plan.entering), (RolloutPhase::Canary, vec!["a".to_string()], 4));
    // The canary's label is written, its pod not made yet: it counts as switching.
    let labelled = NodeView { just_labelled: true, ..pod_less("a") };
    let plan = decide_first(&[labelled], &waiting[1..], pacing(1, 2), 101);
    assert_eq!((plan.phase, plan.admit.len()), (RolloutPhase::Canary, 0));
    // Attached at 110, baking until 140; then a wave of two.
    let canary = [node("a", T, KernelView::Attached { since: 110 })];
    let plan = decide_first(&canary, &waiting[1..], pacing(1, 2), 120);
    assert_eq!((plan.admit.len(), plan.recheck_in), (0, Some(20)));
    let plan = decide_first(&canary, &waiting[1..], pacing(1, 2), 140);
    assert_eq!((plan.phase, plan.admit.clone()), (RolloutPhase::Rolling, vec!["b".to_string(), "c".to_string()]));
    // A canary that never attaches fails the revision; nobody else was touched.
    let stuck = [node("a", T, KernelView::NotAttached)];
    let plan = decide_first(&stuck, &waiting[1..], pacing(1, 2), 120);
    assert_eq!((plan.phase, plan.admit.len()), (RolloutPhase::RolledBack, 0));
    assert_eq!(plan.labelled, vec!["a".to_string()]);
}

#[test]
fn a_node_that_joined_on_its_own_enters_at_once() {
    let nodes = [up("a", T), up("b", T)];
    let mut joined = entering(&["new"], true);
    joined.extend(entering(&["relabelled-1", "relabelled-2"], false));
    let plan = decide(&Input {
        target: T,
        stable: Some(T),
        nodes: &nodes,
        entering: &joined,
        held: &[],
        expected_pods: 2,
        retried_after: None,
        pacing: pacing(1, 1),
        analysis: None,
        canary_gate: &CanaryGate::Open,
        now: 1000,
    });
    // The new node at once, and one relabelled node as the next wave (nothing else switches).
    assert_eq!(plan.admit, vec!["new".to_string(), "relabelled-1".to_string()]);
    assert_eq!((plan.phase, plan.entering), (RolloutPhase::Rolling, 1));
}

#[test]
fn a_pod_no_kubelet_took_up_is_skipped_not_failed() {
    let mut pending = node("dead", T, KernelView::Unknown);
    if let Some(p) = pending.pod.as_mut() {
        (p.started, p.ready_since) = (false, None);
    }
    let plan = decide_first(&[pending.clone(), up("b", T)], &[], pacing(1, 1), 50);
    assert_eq!((plan.phase, plan.failure.clone()), (RolloutPhase::Rolling, None), "waited for until its deadline");
    let plan = decide_first(&[pending, up("b", T)], &[], pacing(1, 1), 120);
    assert_eq!((plan.phase, plan.failure, plan.skipped), (RolloutPhase::Complete, None, vec!["dead".to_string()]));
}

#[test]
fn a_pod_never_bound_is_its_nodes_trouble_past_its_deadline() {
    // kube-scheduler finds no room: the pod stays Pending, bound nowhere.
    let mut full = node("full", T, KernelView::Unknown);
    if let Some(p) = full.pod.as_mut() {
        (p.bound, p.started, p.ready_since, p.created) = (false, false, None, 100);
    }
    let waiting = entering(&["c", "d"], false);
    let plan = decide_first(&[full.clone(), up("b", T)], &waiting, pacing(1, 1), 150);
    assert_eq!(
        (plan.phase, plan.admit.len(), plan.recheck_in),
        (RolloutPhase::Rolling, 0, Some(70)),
        "waited for until its deadline"
    );
    let plan = decide_first(&[full, up("b", T)], &waiting, pacing(1, 1), 220);
    assert_eq!((plan.failure, plan.skipped.clone()), (None, vec!["full".to_string()]));
    assert_eq!(plan.skipped_for, BTreeMap::from([(Skip::PodNotScheduled, 1)]));
    assert_eq!(plan.off_kernel_count, vec!["full".to_string()], "KernelAttached does not count it");
    // It holds no wave, and takes no place in the budget: the next wave goes.
    assert_eq!(plan.admit, vec!["c".to_string()]);
    assert_eq!(plan.desired, 3, "b, c and d; not the full node");
}

#[test]
fn a_node_that_cannot_run_a_pod_takes_no_place_in_a_wave_and_enters_once_it_can() {
    let mut nodes = entering(&["a", "b", "ghost"], false);
    nodes[2].unfit = Some(Skip::NodeNotReady);
    // The canary is never a node no pod can run on.
    let plan = decide_first(&[], &nodes, pacing(1, 1), 100);
    assert_eq!((plan.admit.clone(), plan.entering), (vec!["a".to_string()], 1));
    assert_eq!((plan.skipped.clone(), plan.desired), (vec!["ghost".to_string()], 2));
    // The others run attached and baked: Complete around it.
    let done = [up("a", T), up("b", T)];
    let plan = decide_first(&done, &nodes[2..], pacing(1, 1), 100);
    assert_eq!(
        (plan.phase, plan.admit.len(), plan.skipped.clone()),
        (RolloutPhase::Complete, 0, vec!["ghost".to_string()])
    );
    // Ready now: it enters as a wave of its own (it may run work worth pacing).
    let back = entering(&["ghost"], false);
    let plan = decide(&Input {
        target: T,
        stable: Some(T),
        nodes: &done,
        entering: &back,
        held: &[],
        expected_pods: 2,
        retried_after: None,
        pacing: pacing(1, 1),
        analysis: None,
        canary_gate: &CanaryGate::Open,
        now: 100,
    });
    assert_eq!((plan.admit.clone(), plan.skipped.len()), (vec!["ghost".to_string()], 0));
    // A node that joined while registering enters at once once Ready.
    let joined = Entering { unfit: Some(Skip::NodeNotReady), ..entering(&["new"], true).remove(0) };
    let input = Input {
        target: T,
        stable: Some(T),
        nodes: &done,
        entering: std::slice::from_ref(&joined),
        held: &[],
        expected_pods: 2,
        retried_after: None,
        pacing: pacing(1, 1),
        analysis: None,
        canary_gate: &CanaryGate::Open,
        now: 100,
    };
    assert_eq!(decide(&input).admit.len(), 0);
    let ready = Entering { unfit: None, ..joined.clone() };
    assert_eq!(
        decide(&Input { entering: std::slice::from_ref(&ready), ..input.clone() }).admit,
        vec!["new".to_string()]
    );
    // A node tainted against the Scheduler is labelled at once, in no wave: that switches
    // nothing, as no pod of it can go there.
    let tainted = Entering { unfit: Some(Skip::TaintNotTolerated), ..entering(&["dedicated"], false).remove(0) };
    let plan = decide(&Input { entering: std::slice::from_ref(&tainted), ..input });
    assert_eq!((plan.admit, plan.skipped.len()), (vec!["dedicated".to_string()], 0));
}

#[test]
fn waves_double_after_each_clean_bake_up_to_max_unavailable() {
    let sizes: Vec<usize> = [1, 3, 7, 15].iter().map(|&updated| grown_wave(updated, 1, 100)).collect();
    assert_eq!(sizes, vec![2, 4, 8, 16]);
    assert_eq!(grown_wave(31, 1, 25), 25, "capped by maxUnavailable");
    assert_eq!(grown_wave(0, 0, 10), 1, "no canary: one node first");
    assert_eq!(grown_wave(2, 2, 10), 4, "a canary of two: waves of 4, 8...");
    // In a rollout: three nodes baked, eight wait; maxUnavailable 5 caps the wave of 4+...
    let mut nodes: Vec<NodeView> = (0..3).map(|i| up(&format!("a{i}"), T)).collect();
    nodes.extend((0..8).map(|i| up(&format!("b{i}"), S)));
    let plan = decide_at(&nodes, pacing(1, 5), 100);
    assert_eq!(plan.replace.len(), 4);
    nodes.extend((0..4).map(|i| up(&format!("c{i}"), T)));
    let plan = decide_at(&nodes, pacing(1, 5), 100);
    assert_eq!(plan.replace.len(), 5, "eight would double; maxUnavailable keeps five");
}

#[test]
fn a_retry_makes_the_failed_attempts_pod_again_before_it_judges_the_revision() {
    // The failed attempt's pod is still there (the rollback has not replaced it yet) when
    // the revision is tried again: it is past its deadline and not attached.
    let mut stale = node("a", T, KernelView::NotAttached);
    if let Some(p) = stale.pod.as_mut() {
        p.created = 100;
    }
    let nodes = [stale, up("b", S)];
    let input = Input {
        target: T,
        stable: Some(S),
        nodes: &nodes,
        entering: &[],
        held: &[],
        expected_pods: 2,
        retried_after: Some(225),
        pacing: pacing(1, 1),
        analysis: None,
        canary_gate: &CanaryGate::Open,
        now: 230,
    };
    let plan = decide(&input);
    assert_eq!((plan.failure.clone(), plan.replace.clone()), (None, vec!["a-new".to_string()]), "made again");
    // Without the retry's time, the same pod fails the revision at once.
    assert!(decide(&Input { retried_after: None, ..input.clone() }).failure.is_some());
    // A pod of that attempt that runs attached is kept, and counts.
    let kept = [up("a", T), up("b", S)];
    let plan = decide(&Input { nodes: &kept, ..input });
    assert_eq!((plan.replace.clone(), plan.attached), (vec!["b-old".to_string()], 1));
    // The failure tried again stays in the status while the retry runs, so every reconcile
    // of it knows the attempt's time.
    let failed = RolloutFailure {
        reason: None,
        revision: T.into(),
        generation: 1,
        node: "a".into(),
        cause: "x".into(),
        time: Time(k8s_openapi::jiff::Timestamp::from_second(225).unwrap_or_default()),
        evidence: None,
    };
    let previous =
        RolloutStatus { current_revision: Some(revision(S, 1)), failed: Some(failed.clone()), ..Default::default() };
    let step = advance(&progress(&previous, &plan, revision(T, 3)));
    assert_eq!(step.status.failed, Some(failed), "kept while the retry runs");
}

#[test]
fn the_phase_never_goes_back_from_rolling_to_canary() {
    // A wave's node is labelled, its pod not made yet: the plan counts one updated node.
    let waiting = entering(&["c"], false);
    let nodes = [up("a", T), NodeView { just_labelled: true, ..pod_less("b") }];
    let plan = decide_first(&nodes, &waiting, pacing(1, 1), 100);
    assert_eq!(plan.phase, RolloutPhase::Canary, "the plan alone would say so");
    let previous =
        RolloutStatus { phase: RolloutPhase::Rolling, update_revision: Some(revision(T, 1)), ..Default::default() };
    let step = advance(&progress(&previous, &plan, revision(T, 1)));
    assert_eq!(step.status.phase, RolloutPhase::Rolling);
    // A new revision starts with its canary again.
    let step = advance(&progress(&previous, &plan, revision("newer", 2)));
    assert_eq!(step.status.phase, RolloutPhase::Canary);
}

#[test]
fn nodes_no_pod_can_run_on_are_skipped_and_counted_not_failed() {
    // A Node gone NotReady under a pod of the new revision: past its deadline, not a failure.
    let down = NodeView { unfit: Some(Skip::NodeNotReady), ..node("down", T, KernelView::Unknown) };
    // A node with an untolerated taint gets no pod: skipped at once, not waited for.
    let tainted = NodeView {
        pod: None,
        just_labelled: true,
        unfit: Some(Skip::TaintNotTolerated),
        ..node("tainted", T, KernelView::Unknown)
    };
    let fresh = entering(&["fresh"], false);
    let plan = decide(&Input {
        target: T,
        stable: None,
        nodes: &[down, tainted, up("a", T)],
        entering: &fresh,
        held: &[],
        expected_pods: 2,
        retried_after: None,
        pacing: pacing(1, 1),
        analysis: None,
        canary_gate: &CanaryGate::Open,
        now: 500,
    });
    assert_eq!(plan.failure, None);
    assert_eq!(plan.skipped, vec!["down".to_string(), "tainted".to_string()]);
    assert_eq!(plan.skipped_for, BTreeMap::from([(Skip::NodeNotReady, 1), (Skip::TaintNotTolerated, 1)]));
    // Neither holds the next wave.
    assert_eq!((plan.admit.clone(), plan.entering), (vec!["fresh".to_string()], 0));
    let step = advance(&progress(&RolloutStatus::default(), &plan, revision(T, 1)));
    assert_eq!(
        step.status.skipped_reasons,
        BTreeMap::from([("NodeNotReady".to_string(), 1), ("TaintNotTolerated".to_string(), 1)])
    );
}

#[test]
fn when_every_node_is_tainted_nothing_rolls_and_nothing_is_promoted() {
    let tainted = |n: &str| NodeView {
        node: n.into(),
        pod: None,
        kernel: KernelView::Unknown,
        exit: None,
        just_labelled: true,
        just_replaced: false,
        unfit: Some(Skip::TaintNotTolerated),
        entered_at: None,
        scheduler_stats: None,
    };
    let plan = decide(&Input {
        target: T,
        stable: None,
        nodes: &[tainted("a"), tainted("b")],
        entering: &[],
        held: &[],
        expected_pods: 0,
        retried_after: None,
        pacing: pacing(1, 1),
        analysis: None,
        canary_gate: &CanaryGate::Open,
        now: 500,
    });
    // Not Rolling for ever: there is nothing to roll, and no timer either.
    assert_eq!((plan.phase, plan.admit.len(), plan.recheck_in), (RolloutPhase::Complete, 0, None));
    assert_eq!(plan.skipped_for, BTreeMap::from([(Skip::TaintNotTolerated, 2)]));
    // A revision that ran on no node is not one to go back to.
    let first = RolloutStatus::default();
    let mut p = progress(&first, &plan, revision(T, 1));
    p.wanted = Some((T, "r.io/s@sha256:new"));
    assert_eq!(advance(&p).status.current_revision, None);
    // The tainted nodes enter in waves, each skipped at once.
    let waiting = entering(&["b", "c"], false);
    let plan = decide(&Input {
        target: T,
        stable: None,
        nodes: &[tainted("a")],
        entering: &waiting,
        held: &[],
        expected_pods: 0,
        retried_after: None,
        pacing: pacing(1, 1),
        analysis: None,
        canary_gate: &CanaryGate::Open,
        now: 500,
    });
    assert_eq!(plan.admit, vec!["b".to_string()]);
}

#[test]
fn an_image_only_one_node_cannot_pull_is_that_nodes_problem() {
    let pull = |n: &str| {
        let mut v = node(n, T, KernelView::Unknown);
        if let Some(p) = v.pod.as_mut() {
            (p.ready_since, p.pull_error) = (None, Some("ImagePullBackOff: Back-off pulling image".into()));
        }
        v
    };
    let plan = decide_first(&[up("a", T), pull("b")], &[], pacing(1, 1), 50);
    assert_eq!((plan.failure, plan.skipped), (None, vec!["b".to_string()]));
    // Nobody pulled it: at the deadline the revision failed, and the cause says why.
    let plan = decide_first(&[pull("b")], &[], pacing(1, 1), 50);
    assert_eq!(plan.failure, None, "before the deadline the kubelet keeps trying");
    let cause = decide_first(&[pull("b")], &[], pacing(1, 1), 120).failure.map(|f| f.cause).unwrap_or_default();
    assert!(cause.starts_with("the kubelet could not pull the scheduler's image within 120s"), "{cause}");
    assert!(cause.contains("ImagePullBackOff") && cause.contains("spec.imagePullSecrets"), "{cause}");
}

#[test]
fn a_takeover_that_fails_sends_only_the_nodes_it_switched_back_to_revision_zero() {
    // The stable revision runs on a and b; c entered at 100 and crash-loops; d ran it before
    // and is down now (not the takeover's doing).
    let mut c = node("c", S, KernelView::NotAttached);
    c.entered_at = Some(100);
    if let Some(p) = c.pod.as_mut() {
        (p.created, p.crash_looping) = (101, true);
    }
    let mut d = node("d", S, KernelView::NotAttached);
    d.entered_at = Some(100);
    let nodes = [up("a", S), up("b", S), c, d];
    let waiting = entering(&["e"], false);
    let input = Input {
        target: S,
        stable: Some(S),
        nodes: &nodes,
        entering: &waiting,
        held: &[],
        expected_pods: 4,
        retried_after: None,
        pacing: pacing(1, 1),
        analysis: None,
        canary_gate: &CanaryGate::Open,
        now: 300,
    };
    let plan = decide(&input);
    assert_eq!(plan.failure.as_ref().map(|f| (f.node.as_str(), f.cause.contains("crash-looping"))), Some(("c", true)));
    assert_eq!(plan.broken, vec!["c".to_string()]);
    let previous = RolloutStatus { current_revision: Some(revision(S, 1)), ..Default::default() };
    let mut p = progress(&previous, &plan, revision(S, 1));
    p.wanted = Some((S, "r.io/s@sha256:old"));
    let step = advance(&p);
    assert_eq!((step.status.phase, step.evict.clone()), (RolloutPhase::RolledBack, vec!["c".to_string()]));
    assert!(step.admit.is_empty() && !step.roll_back && step.newly_failed.is_some());
    assert_eq!(step.status.entering_nodes, 1);

    // Recorded: c is back on revision zero (entering again), and nothing enters until a retry.
    let failure = step.status.failed.clone();
    let back = entering(&["c", "e"], false);
    let plan = decide(&Input { nodes: &nodes[..2], entering: &back, ..input });
    let mut p = progress(&previous, &plan, revision(S, 1));
    p.failed = failure.as_ref();
    let step = advance(&p);
    assert_eq!((step.status.phase, step.admit.len(), step.status.entering_nodes), (RolloutPhase::RolledBack, 0, 2));
}

#[test]
fn a_takeover_failing_under_an_updates_recorded_failure_holds_that_node_until_a_retry() {
    // The update T failed and was rolled back to S; c entered under S and crash-loops.
    let failure = RolloutFailure {
        reason: None,
        revision: T.into(),
        generation: 2,
        node: "a".into(),
        cause: "crash".into(),
        time: Time(k8s_openapi::jiff::Timestamp::from_second(900).unwrap()),
        evidence: None,
    };
    let mut c = node("c", S, KernelView::NotAttached);
    c.entered_at = Some(100);
    if let Some(p) = c.pod.as_mut() {
        (p.created, p.crash_looping) = (101, true);
    }
    let nodes = [up("a", S), c];
    let input = Input {
        target: S,
        stable: Some(S),
        nodes: &nodes,
        entering: &[],
        held: &[],
        expected_pods: 2,
        retried_after: None,
        pacing: pacing(1, 1),
        analysis: None,
        canary_gate: &CanaryGate::Open,
        now: 300,
    };
    let plan = decide(&input);
    assert_eq!(plan.broken, vec!["c".to_string()]);
    let previous = RolloutStatus { current_revision: Some(revision(S, 1)), ..Default::default() };
    let mut p = progress(&previous, &plan, revision(S, 2));
    (p.failed, p.wanted) = (Some(&failure), Some((T, "r.io/s@sha256:new")));
    let step = advance(&p);
    assert_eq!((step.evict.clone(), step.status.held_nodes.clone()), (vec!["c".to_string()], vec!["c".to_string()]));

    // c is on revision zero and would enter again (with e, which may): it is held.
    let back = entering(&["c", "e"], true);
    let plan = decide(&Input { nodes: &nodes[..1], entering: &back, ..input });
    let mut p = progress(&step.status, &plan, revision(S, 2));
    (p.failed, p.wanted) = (Some(&failure), Some((T, "r.io/s@sha256:new")));
    let held = advance(&p);
    assert_eq!((held.admit.clone(), held.status.entering_nodes), (vec!["e".to_string()], 1));
    assert_eq!(held.status.held_nodes, vec!["c".to_string()]);
    // The spec changed: the failure no longer stands, and c may enter.
    let mut p = progress(&held.status, &plan, revision(S, 3));
    p.wanted = Some((S, "r.io/s@sha256:old"));
    let retried = advance(&p);
    assert_eq!((retried.admit.len(), retried.status.held_nodes.len()), (2, 0));
}

#[test]
fn a_held_node_takes_no_place_in_a_wave_and_the_nodes_behind_it_enter() {
    // Under S after T failed, c was sent back and is held; b and e wait to be taken over
    // one at a time. c sorts first, yet the wave is b's, then e's: c never enters.
    let nodes = [up("a", S)];
    let waiting = entering(&["c", "b", "e"], false);
    let held = vec!["c".to_string()];
    let input = Input {
        target: S,
        stable: Some(S),
        nodes: &nodes,
        entering: &waiting,
        held: &held,
        expected_pods: 1,
        retried_after: None,
        pacing: pacing(0, 1),
        analysis: None,
        canary_gate: &CanaryGate::Open,
        now: 1_000,
    };
    let plan = decide(&input);
    assert_eq!((plan.admit.clone(), plan.entering), (vec!["b".to_string()], 2));
    let plan = decide(&Input { entering: &entering(&["c", "e"], false), ..input.clone() });
    assert_eq!((plan.admit.clone(), plan.entering), (vec!["e".to_string()], 1));
    // A held node that joined the cluster on its own is not admitted at once either.
    let plan = decide(&Input { entering: &entering(&["c"], true), ..input });
    assert_eq!((plan.admit.len(), plan.entering), (0, 1));
}

#[test]
fn a_recorded_failure_stops_the_rollout_until_restored_or_recovered() {
    let failure = RolloutFailure {
        reason: None,
        revision: T.into(),
        generation: 2,
        node: "n1".into(),
        cause: "crash".into(),
        time: Time(k8s_openapi::jiff::Timestamp::from_second(900).unwrap()),
        evidence: None,
    };
    let previous = RolloutStatus { current_revision: Some(revision(S, 1)), ..Default::default() };
    // The template is the stable revision again: its restoring replacements go ahead.
    let plan = Decision { phase: RolloutPhase::Complete, replace: vec!["bad-pod".into()], ..Default::default() };
    let mut p = progress(&previous, &plan, revision(S, 2));
    p.failed = Some(&failure);
    p.wanted = Some((T, "r.io/s@sha256:new"));
    let step = advance(&p);
    assert_eq!(step.status.phase, RolloutPhase::RolledBack);
    assert_eq!(step.replace, vec!["bad-pod".to_string()]);
    assert_eq!(step.status.update_revision.as_ref().map(|r| r.name.as_str()), Some(T));
    assert!(step.newly_failed.is_none() && !step.roll_back, "the template is the stable one already");
    // A rollback cut short (the template still the failed revision) is carried on.
    let mut q = p.clone();
    q.template = revision(T, 2);
    let step = advance(&q);
    assert!(step.roll_back && step.newly_failed.is_none() && step.replace.is_empty());
    // ...but not before the DaemonSet controller saw the template.
    p.caught_up = false;
    assert!(advance(&p).replace.is_empty());

    // A first revision that failed and then attached everywhere recovers.
    let first = RolloutStatus::default();
    let complete = Decision { phase: RolloutPhase::Complete, updated: 1, attached: 1, ..Default::default() };
    let mut p = progress(&first, &complete, revision(T, 2));
    p.failed = Some(&failure);
    let step = advance(&p);
    assert_eq!(step.status.failed, None);
    assert_eq!(step.status.current_revision, Some(revision(T, 2)));
    assert_eq!(step.status.phase, RolloutPhase::Complete);
}

proptest! {
    #[test]
    fn rollouts_respect_the_budget_replace_once_and_converge(
        count in 1usize..12,
        canary in 0usize..4,
        max_unavailable in 1usize..4,
        attach_after in 0i64..100,
    ) {
        let mut sim = Sim::new(count, None, attach_after);
        let p = pacing(canary, max_unavailable);
        let mut now = 1000;
        let mut complete = false;
        for _ in 0..(count * 20 + 20) {
            let before = sim.unavailable(now);
            let plan = decide_at(&sim.views(now), p, now);
            prop_assert!(plan.failure.is_none());
            if plan.complete() { complete = true; break; }
            sim.apply(&plan, T, now);
            // Never more nodes without an attached scheduler than the budget (or than
            // before, when they were down already).
            prop_assert!(sim.unavailable(now) <= before.max(max_unavailable));
            now += 10;
        }
        prop_assert!(complete, "the rollout converged");
        prop_assert!(sim.replaced.values().all(|n| *n == 1), "each node replaced once: {:?}", sim.replaced);
        prop_assert_eq!(sim.replaced.len(), count);
    }

    #[test]
    fn a_failed_revision_is_caught_and_the_rollback_restores_exactly_the_changed_nodes(
        count in 2usize..10,
        broken_at in 0usize..10,
        canary in 1usize..3,
        max_unavailable in 1usize..3,
    ) {
        let broken = format!("n{:02}", broken_at % count);
        let mut sim = Sim::new(count, Some(broken.clone()), 5);
        let p = pacing(canary, max_unavailable);
        let mut now = 1000;
        let mut failed = None;
        for _ in 0..(count * 40 + 40) {
            let plan = decide_at(&sim.views(now), p, now);
            if let Some(f) = plan.failure { failed = Some(f); break; }
            prop_assert!(!plan.complete(), "a rollout with a broken node cannot complete");
            sim.apply(&plan, T, now);
            now += 10;
        }
        let failure = failed.expect("the failure is caught");
        prop_assert_eq!(&failure.node, &broken);
        let changed: Vec<String> = sim.nodes.iter().filter(|(_, (r, _))| r == T).map(|(n, _)| n.clone()).collect();
        // The rollback: the template is the stable revision again, every changed node restored.
        let views = sim.views(now);
        let restore = decide(&Input { canary_gate: &CanaryGate::Open, target: S, stable: Some(S), nodes: &views, entering: &[], held: &[], expected_pods: views.len(), retried_after: None, pacing: p, analysis: None, now });
        let mut restored: Vec<String> = restore.replace.iter().map(|p| p.split('/').next().unwrap_or_default().to_owned()).collect();
        restored.sort();
        prop_assert_eq!(restored, changed);
    }

    #[test]
    fn a_first_deployment_paces_nodes_leaving_revision_zero_and_a_failure_leaves_none_on_it(
        count in 1usize..14,
        joined in 0usize..3,
        broken_at in proptest::option::of(0usize..14),
        tainted_at in proptest::option::of(0usize..14),
        pod_delay in 0i64..30,
        canary in 0usize..3,
        max_unavailable in 1usize..4,
    ) {
        // Node -> (labelled at, attaches); unlabelled nodes run revision zero. A labelled
        // node's pod comes `pod_delay` after its label; the tainted node never gets one.
        let names: Vec<String> = (0..count).map(|i| format!("n{i:02}")).collect();
        let broken = broken_at.map(|b| names[b % count].clone());
        let tainted = tainted_at.map(|t| names[t % count].clone()).filter(|t| broken.as_ref() != Some(t));
        let joined: Vec<String> = names.iter().rev().take(joined.min(count)).cloned().collect();
        let mut labelled: BTreeMap<String, i64> = BTreeMap::new();
        let p = pacing(canary, max_unavailable);
        let mut now = 1000;
        let mut outcome = None;
        for _ in 0..(count * 40 + 40) {
            let views: Vec<NodeView> = labelled.iter().map(|(n, at)| {
                if tainted.as_ref() == Some(n) {
                    let no_pod = NodeView { pod: None, unfit: Some(Skip::TaintNotTolerated), ..node(n, T, KernelView::Unknown) };
                    return NodeView { just_labelled: now < at + 120, ..no_pod };
                }
                if now < at + pod_delay {
                    return NodeView { pod: None, just_labelled: true, ..node(n, T, KernelView::Unknown) };
                }
                let created = at + pod_delay;
                let attached = broken.as_ref() != Some(n) && now >= created + 5;
                let mut v = node(n, T, if attached { KernelView::Attached { since: created + 5 } } else { KernelView::NotAttached });
                if let Some(pod) = v.pod.as_mut() { pod.created = created; }
                v
            }).collect();
            let waiting: Vec<Entering> = names.iter().filter(|n| !labelled.contains_key(*n))
                .map(|n| Entering { node: n.clone(), joined: joined.contains(n), runs_it: false, unfit: None }).collect();
            let expected = views.iter().filter(|v| v.unfit.is_none()).count();
            let plan = decide(&Input { canary_gate: &CanaryGate::Open, target: T, stable: None, nodes: &views, entering: &waiting, held: &[], expected_pods: expected, retried_after: None, pacing: p, analysis: None, now });
            prop_assert!(tainted.is_none() || plan.failure.as_ref().map(|f| &f.node) != tainted.as_ref(), "a tainted node never fails it");
            let switching = views.iter().filter(|v| v.unfit.is_none() && !matches!(v.kernel, KernelView::Attached { .. })).count();
            // Leaving revision zero counts against the budget like any switch; in a first
            // deployment even nodes that joined on their own wait for their wave.
            let admitted = plan.admit.len();
            prop_assert!(admitted == 0 || switching + admitted <= max_unavailable);
            if plan.failure.is_some() || plan.complete() { outcome = Some(plan); break; }
            for n in &plan.admit {
                prop_assert!(labelled.insert(n.clone(), now).is_none(), "{} admitted twice", n);
            }
            now += 10;
        }
        let plan = outcome.expect("the first deployment completes or fails");
        if let Some(broken) = broken {
            prop_assert_eq!(plan.failure.as_ref().map(|f| f.node.clone()), Some(broken));
            // Back to revision zero: the nodes to evict are exactly the nodes it reached.
            let step = advance(&progress(&RolloutStatus::default(), &plan, revision(T, 1)));
            let reached: Vec<String> = labelled.keys().cloned().collect();
            prop_assert_eq!(step.evict, reached);
            prop_assert!(step.admit.is_empty());
        } else {
            prop_assert!(plan.complete());
            prop_assert_eq!(labelled.len(), count);
            prop_assert_eq!(plan.skipped, tainted.into_iter().collect::<Vec<_>>());
        }
    }
}
