use super::*;
use k8s_openapi::api::apps::v1::DaemonSetStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::{BTreeMap, BTreeSet};

fn time(secs: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
}

fn ds(generation: i64, observed: i64, desired: i32, updated: i32, available: i32) -> DaemonSet {
    DaemonSet {
        metadata: ObjectMeta {
            name: Some("rusty".into()),
            namespace: Some("sked-system".into()),
            generation: Some(generation),
            ..Default::default()
        },
        spec: Default::default(),
        status: Some(DaemonSetStatus {
            observed_generation: Some(observed),
            desired_number_scheduled: desired,
            current_number_scheduled: desired,
            updated_number_scheduled: Some(updated),
            number_ready: available,
            number_available: Some(available),
            ..Default::default()
        }),
    }
}

struct Run {
    previous: SchedulerStatus,
    generation: i64,
    clock: i64,
    kernel: KernelSummary,
}

/// The rollout a DaemonSet's counts stand for: rolling while some pods run another revision.
fn rollout_of(ds: &DaemonSet) -> RolloutStatus {
    let st = ds.status.clone().unwrap_or_default();
    let updated = st.updated_number_scheduled.unwrap_or(0);
    RolloutStatus {
        phase: if updated < st.desired_number_scheduled { RolloutPhase::Rolling } else { RolloutPhase::Complete },
        updated_nodes: updated,
        // A revision ran everywhere before (these tests follow a Scheduler past its first
        // deployment).
        current_revision: Some(sked_api::Revision {
            name: "r0".into(),
            image: "i".into(),
            generation: 1,
            spec: None,
            agent_image: None,
        }),
        ..Default::default()
    }
}

fn kernel(attached: i32, desired: i32, reason: &'static str) -> KernelSummary {
    let reason = Reason::parse(reason).unwrap();
    KernelSummary {
        attached,
        scheduled: desired,
        is_true: reason == Reason::KernelAttached,
        reason,
        message: format!("{attached} of {desired}"),
        unreported: 0,
        settled: true,
        last_exit: None,
        ejections: Vec::new(),
        cpu_contract: crate::cpu_contract::Fold::default().finish(),
    }
}

impl Run {
    fn new() -> Self {
        Self { previous: SchedulerStatus::default(), generation: 1, clock: 1000, kernel: kernel(0, 0, "NotAttached") }
    }

    fn step(&mut self, daemonset: Option<&DaemonSet>, placement: &Placement) -> NewStatus {
        let rollout = daemonset.map(rollout_of);
        self.step_with(daemonset, placement, rollout.as_ref(), None)
    }

    /// A step with the rollout status the rollout decided.
    fn step_with(
        &mut self,
        daemonset: Option<&DaemonSet>,
        placement: &Placement,
        rollout: Option<&RolloutStatus>,
        desired: Option<i32>,
    ) -> NewStatus {
        self.clock += 10;
        let out = compute(&Inputs {
            generation: Some(self.generation),
            previous: &self.previous,
            daemonset,
            placement,
            image: Some("x/y:z"),
            spec_error: None,
            image_error: None,
            image_error_transient: false,
            kernel: &self.kernel,
            rollout,
            desired,
            untolerated: None,
            canary_gate: &crate::rollout::CanaryGate::Open,
            now: time(self.clock),
        });
        self.previous = out.status.clone();
        out
    }
}

fn cond<'a>(s: &'a SchedulerStatus, t: &str) -> &'a Condition {
    cond_opt(s, t).unwrap()
}

fn cond_opt<'a>(s: &'a SchedulerStatus, t: &str) -> Option<&'a Condition> {
    s.conditions.iter().find(|c| c.type_ == t)
}

fn reasons(e: &Option<EventSpec>) -> Option<(EventKind, &str)> {
    e.as_ref().map(|e| (e.kind, e.reason.as_str()))
}

#[test]
fn rollout_then_ready_records_one_event_each() {
    let p = Placement { owned: BTreeSet::from(["n1".into(), "n2".into()]), ..Default::default() };
    let mut run = Run::new();

    let out = run.step(Some(&ds(1, 1, 2, 2, 0)), &p);
    assert_eq!(reasons(&out.event), Some((EventKind::Normal, "RolloutInProgress")));
    assert_eq!(cond(&out.status, "Ready").status, "False");
    assert_eq!(cond(&out.status, "Progressing").status, "True");
    assert_eq!(out.status.kernel_attached_summary.as_deref(), Some("0/2"));

    // A pod count change alone records nothing.
    let out = run.step(Some(&ds(1, 1, 2, 2, 1)), &p);
    assert_eq!(out.event, None);
    assert_eq!(out.status.number_available, 1);

    let out = run.step(Some(&ds(1, 1, 2, 2, 2)), &p);
    assert_eq!(reasons(&out.event), Some((EventKind::Normal, "DaemonSetReady")));
    let ready = cond(&out.status, "Ready");
    assert_eq!((ready.status.as_str(), ready.observed_generation), ("True", Some(1)));
    assert_eq!(cond(&out.status, "Progressing").status, "False");
    assert_eq!(cond(&out.status, "Degraded").status, "False");

    // A plain re-reconcile changes nothing, not even transition times.
    let before = out.status.clone();
    let out = run.step(Some(&ds(1, 1, 2, 2, 2)), &p);
    assert_eq!(out.event, None);
    assert_eq!(out.status, before);
}

#[test]
fn pods_lost_after_ready_are_nodes_unavailable_then_recover() {
    let p = Placement { owned: BTreeSet::from(["n1".into(), "n2".into()]), ..Default::default() };
    let mut run = Run::new();
    run.step(Some(&ds(1, 1, 2, 2, 2)), &p);

    let out = run.step(Some(&ds(1, 1, 2, 2, 1)), &p);
    assert_eq!(reasons(&out.event), Some((EventKind::Warning, "NodesUnavailable")));
    assert_eq!(cond(&out.status, "Degraded").status, "True");
    assert_eq!(cond(&out.status, "Ready").status, "False");
    assert!(cond(&out.status, "Degraded").message.contains("1 of 2"));

    // Still down, different message: no new event.
    assert_eq!(run.step(Some(&ds(1, 1, 3, 3, 1)), &p).event, None);

    let out = run.step(Some(&ds(1, 1, 3, 3, 3)), &p);
    assert_eq!(reasons(&out.event), Some((EventKind::Normal, "DaemonSetReady")));
}

#[test]
fn a_first_deployment_is_not_ready_before_it_is_complete_and_desired_never_dips() {
    let p = Placement { owned: (1..=5).map(|i| format!("n{i}")).collect(), ..Default::default() };
    let mut run = Run::new();
    let first = |updated: i32, entering: i32, phase| RolloutStatus {
        phase,
        updated_nodes: updated,
        attached_nodes: updated,
        entering_nodes: entering,
        ..Default::default()
    };
    // The last node's label is written, the DaemonSet controller has not counted it yet:
    // its count says 4 of 4, the rollout 4 of 5.
    let daemonset = ds(1, 1, 4, 4, 4);
    let rolling = first(4, 0, RolloutPhase::Rolling);
    let out = run.step_with(Some(&daemonset), &p, Some(&rolling), Some(5));
    assert_eq!(out.status.desired_number_scheduled, 5);
    assert_eq!(cond(&out.status, "Ready").status, "False", "{:?}", cond(&out.status, "Ready"));
    assert_ne!(reasons(&out.event), Some((EventKind::Normal, "DaemonSetReady")));
    // Every pod available, the rollout not done yet (the last report on its way): still not
    // Ready, as a first deployment has nothing that ran everywhere.
    let out = run.step_with(Some(&ds(1, 1, 5, 5, 5)), &p, Some(&rolling), Some(5));
    assert_eq!(cond(&out.status, "Ready").status, "False");
    let done = RolloutStatus {
        current_revision: Some(sked_api::Revision {
            name: "r1".into(),
            image: "i".into(),
            generation: 1,
            spec: None,
            agent_image: None,
        }),
        ..first(5, 0, RolloutPhase::Complete)
    };
    let out = run.step_with(Some(&ds(1, 1, 5, 5, 5)), &p, Some(&done), Some(5));
    assert_eq!(cond(&out.status, "Ready").status, "True");
    assert_eq!(reasons(&out.event), Some((EventKind::Normal, "DaemonSetReady")));
}

#[test]
fn skipped_nodes_are_not_desired_and_a_fleet_of_only_skipped_nodes_says_so() {
    let p = Placement { owned: BTreeSet::from(["n1".into(), "n2".into()]), ..Default::default() };
    let mut run = Run::new();
    let skipped = RolloutStatus {
        phase: RolloutPhase::Complete,
        updated_nodes: 1,
        attached_nodes: 1,
        skipped_nodes: vec!["n2".into()],
        skipped_reasons: BTreeMap::from([("NodeNotReady".into(), 1)]),
        current_revision: Some(sked_api::Revision {
            name: "r1".into(),
            image: "i".into(),
            generation: 1,
            spec: None,
            agent_image: None,
        }),
        ..Default::default()
    };
    // The NotReady node's pod still counts as available in the DaemonSet's numbers.
    let out = run.step_with(Some(&ds(1, 1, 2, 2, 2)), &p, Some(&skipped), Some(1));
    assert_eq!((out.status.desired_number_scheduled, out.status.number_available), (1, 1));
    let ready = cond(&out.status, "Ready");
    assert_eq!(ready.status, "True");
    assert!(ready.message.contains("1 of 1 pods available; 1 node(s) skipped (1 NodeNotReady)"), "{}", ready.message);
    let none = RolloutStatus { updated_nodes: 0, attached_nodes: 0, ..skipped };
    let out = run.step_with(Some(&ds(1, 1, 1, 0, 0)), &p, Some(&none), Some(0));
    let ready = cond(&out.status, "Ready");
    assert_eq!(ready.reason, "NoNodesScheduled");
    assert!(ready.message.starts_with("No node can run the scheduler now; 1 node(s) skipped"), "{}", ready.message);
}

#[test]
fn a_spec_change_is_a_new_rollout_with_new_observed_generation() {
    let p = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
    let mut run = Run::new();
    run.step(Some(&ds(1, 1, 1, 1, 1)), &p);
    run.generation = 2;
    // The DaemonSet controller has not seen the new template yet: the rollout conditions
    // still describe generation 1, and nothing is recorded.
    let out = run.step(Some(&ds(2, 1, 1, 1, 1)), &p);
    assert_eq!(out.event, None);
    assert_eq!(out.status.observed_generation, Some(2));
    assert_eq!(cond(&out.status, "Ready").observed_generation, Some(1));
    // Inputs, the old pod still available: Ready stays, the rollout is under way.
    let out = run.step(Some(&ds(2, 2, 1, 0, 1)), &p);
    assert_eq!(out.event, None);
    assert_eq!(cond(&out.status, "Ready").status, "True");
    assert_eq!(cond(&out.status, "Progressing").reason, "RolloutInProgress");
    assert_eq!(cond(&out.status, "Reconciling").status, "True");
    // The pod being replaced.
    let out = run.step(Some(&ds(2, 2, 1, 0, 0)), &p);
    assert_eq!(reasons(&out.event), Some((EventKind::Normal, "RolloutInProgress")));
    // Ready stays with the generation that ran until this one runs everywhere.
    assert!(
        out.status.conditions.iter().all(|c| c.observed_generation == Some(if c.type_ == "Ready" { 1 } else { 2 }))
    );
    let out = run.step(Some(&ds(2, 2, 1, 1, 1)), &p);
    assert_eq!(reasons(&out.event), Some((EventKind::Normal, "DaemonSetReady")));
    assert_eq!(cond(&out.status, "Ready").observed_generation, Some(2));
    assert_eq!(cond(&out.status, "Reconciling").status, "False");
}

#[test]
fn ready_describes_the_running_generation_while_a_newer_one_rolls_or_fails() {
    use sked_api::{Revision, RolloutFailure};
    let p = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
    let daemonset = ds(3, 3, 1, 0, 1);
    let previous = SchedulerStatus::default();
    let kernel_summary = kernel(1, 1, "KernelAttached");
    let running =
        Revision { name: "aaa".into(), image: "x/y@sha256:1".into(), generation: 2, spec: None, agent_image: None };
    let observe = |rollout: &RolloutStatus| {
        compute(&Inputs {
            generation: Some(3),
            previous: &previous,
            daemonset: Some(&daemonset),
            placement: &p,
            image: None,
            image_error: None,
            image_error_transient: false,
            spec_error: None,
            kernel: &kernel_summary,
            rollout: Some(rollout),
            desired: None,
            untolerated: None,
            canary_gate: &crate::rollout::CanaryGate::Open,
            now: time(5),
        })
    };
    let rolling =
        RolloutStatus { phase: RolloutPhase::Canary, current_revision: Some(running.clone()), ..Default::default() };
    let out = observe(&rolling);
    assert_eq!(cond(&out.status, "Ready").observed_generation, Some(2));
    assert_eq!(cond(&out.status, "Reconciling").status, "True");
    assert_eq!(cond(&out.status, "Stalled").status, "False");

    let rolled_back = RolloutStatus {
        phase: RolloutPhase::RolledBack,
        current_revision: Some(running),
        failed: Some(RolloutFailure {
            reason: None,
            revision: "bbb".into(),
            generation: 3,
            node: "n1".into(),
            cause: "the scheduler did not attach within 120s".into(),
            time: time(4),
            evidence: None,
        }),
        ..Default::default()
    };
    let out = observe(&rolled_back);
    assert_eq!(cond(&out.status, "Ready").observed_generation, Some(2));
    let stalled = cond(&out.status, "Stalled");
    assert_eq!((stalled.status.as_str(), stalled.reason.as_str()), ("True", "RolloutFailed"));
    assert_eq!(cond(&out.status, "Reconciling").status, "False");
    let degraded = cond(&out.status, "Degraded");
    assert_eq!(degraded.reason, "RolloutFailed");
    assert!(degraded.message.contains("n1") && degraded.message.contains("pause and resume"), "{}", degraded.message);
}

/// The first status of generation 1, no kernel attached, nothing refused.
fn first_computation(
    daemonset: &DaemonSet,
    placement: &Placement,
    rollout: &RolloutStatus,
    untolerated: Option<&str>,
) -> NewStatus {
    compute(&Inputs {
        generation: Some(1),
        previous: &SchedulerStatus::default(),
        daemonset: Some(daemonset),
        placement,
        image: None,
        image_error: None,
        image_error_transient: false,
        spec_error: None,
        kernel: &kernel(0, 0, "NotAttached"),
        rollout: Some(rollout),
        desired: None,
        untolerated,
        canary_gate: &crate::rollout::CanaryGate::Open,
        now: time(5),
    })
}

#[test]
fn a_first_revision_rolled_back_to_the_default_is_failed_not_in_progress() {
    use sked_api::{Revision, RolloutFailure};
    let p = Placement { owned: BTreeSet::from(["n1".into(), "n2".into()]), ..Default::default() };
    // Its nodes lost their labels: the DaemonSet runs no pod; one node still waits to enter.
    let daemonset = ds(1, 1, 0, 0, 0);
    let failed = RolloutStatus {
        phase: RolloutPhase::Failed,
        update_revision: Some(Revision {
            name: "bbb".into(),
            image: "x/y@sha256:2".into(),
            generation: 1,
            spec: None,
            agent_image: None,
        }),
        entering_nodes: 1,
        failed: Some(RolloutFailure {
            reason: None,
            revision: "bbb".into(),
            generation: 1,
            node: "n1".into(),
            cause: "the scheduler container is crash-looping".into(),
            time: time(4),
            evidence: None,
        }),
        ..Default::default()
    };
    let out = first_computation(&daemonset, &p, &failed, None);
    for (type_, status, reason) in [
        ("Progressing", "False", "RolloutFailed"),
        ("Ready", "False", "RolloutFailed"),
        ("Reconciling", "False", "RolloutFailed"),
        ("Stalled", "True", "RolloutFailed"),
        ("Degraded", "True", "RolloutFailed"),
    ] {
        let c = cond(&out.status, type_);
        assert_eq!((c.status.as_str(), c.reason.as_str()), (status, reason), "{type_}: {}", c.message);
    }
    assert!(cond(&out.status, "Progressing").message.contains("kernel's default scheduler"));
    assert!(cond(&out.status, "Degraded").message.contains("node n1: the scheduler container is crash-looping"));
}

#[test]
fn no_pod_anywhere_names_the_taints_that_keep_them_away() {
    let p = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
    let daemonset = ds(1, 1, 0, 0, 0);
    let taints = "1 selected node(s) have a taint the Scheduler does not tolerate, so no pod of it can run there: dedicated=batch:NoSchedule on n1; add a matching toleration to spec.tolerations";
    let complete = RolloutStatus { phase: RolloutPhase::Complete, ..Default::default() };
    let out = first_computation(&daemonset, &p, &complete, Some(taints));
    let ready = cond(&out.status, "Ready");
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "NoNodesScheduled"));
    assert_eq!(ready.message, format!("No nodes scheduled: {taints}"));
    assert_eq!(cond(&out.status, "Reconciling").status, "False", "nothing to wait for: the spec must change");
}

#[test]
fn skipped_nodes_are_counted_by_reason_in_the_rollout_message() {
    let rolling = RolloutStatus {
        skipped_reasons: BTreeMap::from([("NodeNotReady".into(), 2), ("TaintNotTolerated".into(), 1)]),
        ..Default::default()
    };
    assert_eq!(
        skipped_summary(Some(&rolling)),
        "; 3 node(s) skipped (2 NodeNotReady, 1 TaintNotTolerated): see status.rollout.skippedNodes"
    );
    assert_eq!(skipped_summary(Some(&RolloutStatus::default())), "");
}

#[test]
fn a_fresh_daemonset_records_nothing_until_observed() {
    let p = Placement::default();
    let mut run = Run::new();
    let mut fresh = ds(1, 0, 0, 0, 0);
    fresh.status = None;
    let out = run.step(Some(&fresh), &p);
    assert_eq!(out.event, None);
    assert!(cond_opt(&out.status, "Ready").is_none());
    let out = run.step(Some(&ds(1, 1, 0, 0, 0)), &p);
    assert_eq!(reasons(&out.event), Some((EventKind::Normal, "NoNodesScheduled")));
}

#[test]
fn leaving_a_conflict_waits_for_the_daemonset_controller_before_recording() {
    let lost = Placement { lost: BTreeMap::from([("n1".into(), "w".into())]), ..Default::default() };
    let mut run = Run::new();
    let out = run.step(None, &lost);
    assert_eq!(reasons(&out.event), Some((EventKind::Warning, "SchedulerConflict")));
    // The winner is gone; the new DaemonSet is not observed yet: no stale NoNodesScheduled.
    let owned = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
    let mut fresh = ds(1, 0, 0, 0, 0);
    fresh.status = None;
    let out = run.step(Some(&fresh), &owned);
    assert_eq!(out.event, None);
    assert_eq!(cond(&out.status, "Degraded").status, "False");
    let out = run.step(Some(&ds(1, 1, 1, 1, 0)), &owned);
    assert_eq!(reasons(&out.event), Some((EventKind::Normal, "RolloutInProgress")));
}

#[test]
fn a_node_joining_after_ready_is_a_rollout_not_an_outage() {
    let p = Placement { owned: BTreeSet::from(["n1".into(), "n2".into()]), ..Default::default() };
    let mut run = Run::new();
    run.step(Some(&ds(1, 1, 2, 2, 2)), &p);
    let out = run.step(Some(&ds(1, 1, 3, 3, 2)), &p);
    assert_eq!(reasons(&out.event), Some((EventKind::Normal, "RolloutInProgress")));
    assert_eq!(cond(&out.status, "Degraded").status, "False");
    // ...but losing an available pod while it joins is an outage.
    let out = run.step(Some(&ds(1, 1, 3, 3, 3)), &p);
    assert_eq!(reasons(&out.event), Some((EventKind::Normal, "DaemonSetReady")));
    let out = run.step(Some(&ds(1, 1, 4, 4, 2)), &p);
    assert_eq!(reasons(&out.event), Some((EventKind::Warning, "NodesUnavailable")));
}

#[test]
fn no_nodes_is_its_own_state() {
    let mut run = Run::new();
    let out = run.step(Some(&ds(1, 1, 0, 0, 0)), &Placement::default());
    assert_eq!(reasons(&out.event), Some((EventKind::Normal, "NoNodesScheduled")));
    assert_eq!(cond(&out.status, "Ready").status, "False");
    assert_eq!(cond(&out.status, "Progressing").status, "False");
    assert!(cond(&out.status, "Ready").message.contains("nodeSelector"));
}

#[test]
fn partial_conflict_is_ready_and_degraded_with_a_warning() {
    let p = Placement {
        owned: BTreeSet::from(["n1".into()]),
        lost: BTreeMap::from([("n2".into(), "old-b".into()), ("n3".into(), "old-a".into())]),
        ..Default::default()
    };
    let mut run = Run::new();
    let out = run.step(Some(&ds(1, 1, 1, 1, 1)), &p);
    assert_eq!(reasons(&out.event), Some((EventKind::Warning, "SchedulerConflict")));
    assert_eq!(cond(&out.status, "Ready").status, "True");
    let d = cond(&out.status, "Degraded");
    assert_eq!((d.status.as_str(), d.reason.as_str()), ("True", "SchedulerConflict"));
    assert_eq!(d.message, "2 of 3 selected nodes belong to older Schedulers: old-a, old-b");
    assert_eq!(out.status.conflicting_nodes, 2);

    // Conflict resolved: a Normal event.
    let p = Placement { owned: BTreeSet::from(["n1".into(), "n2".into(), "n3".into()]), ..Default::default() };
    let out = run.step(Some(&ds(1, 1, 3, 3, 3)), &p);
    assert_eq!(reasons(&out.event), Some((EventKind::Normal, "DaemonSetReady")));
    assert_eq!(out.status.conflicting_nodes, 0);
}

#[test]
fn total_conflict_without_daemonset_and_capped_winner_list() {
    let lost: BTreeMap<String, String> = (0..6).map(|i| (format!("n{i}"), format!("w{i}"))).collect();
    let p = Placement { lost, ..Default::default() };
    let mut run = Run::new();
    let out = run.step(None, &p);
    assert_eq!(reasons(&out.event), Some((EventKind::Warning, "SchedulerConflict")));
    assert_eq!(out.status.desired_number_scheduled, 0);
    assert_eq!(cond(&out.status, "Ready").reason, "NoNodesScheduled");
    assert!(cond(&out.status, "Ready").message.contains("older Scheduler"));
    assert_eq!(
        cond(&out.status, "Degraded").message,
        "6 of 6 selected nodes belong to older Schedulers: w0, w1, w2 and 3 more"
    );
}

#[test]
fn conflict_message_says_when_a_winner_won_on_its_name() {
    let lost = |winners: &[&str]| -> BTreeMap<String, String> {
        winners.iter().enumerate().map(|(i, w)| (format!("n{i}"), w.to_string())).collect()
    };
    let degraded = |p: &Placement| cond(&Run::new().step(None, p).status, "Degraded").message.clone();

    let tie = Placement { lost: lost(&["tie-a"]), tied: BTreeSet::from(["tie-a".into()]), ..Default::default() };
    assert_eq!(
        degraded(&tie),
        "1 of 1 selected nodes belong to Schedulers created in the same second and earlier by name: tie-a"
    );
    let mixed =
        Placement { lost: lost(&["old", "tie-a"]), tied: BTreeSet::from(["tie-a".into()]), ..Default::default() };
    assert_eq!(
        degraded(&mixed),
        "2 of 2 selected nodes belong to Schedulers that are older, or created in the same second and earlier by name: old, tie-a"
    );
    let older = Placement { lost: lost(&["old"]), ..Default::default() };
    assert_eq!(degraded(&older), "1 of 1 selected nodes belong to older Schedulers: old");
}

#[test]
fn degraded_false_says_what_is_true_of_the_pods() {
    let p = Placement { owned: BTreeSet::from(["n1".into(), "n2".into()]), ..Default::default() };
    let degraded = |out: &NewStatus| {
        let d = cond(&out.status, "Degraded");
        (d.status.clone(), d.reason.clone(), d.message.clone())
    };
    let mut run = Run::new();
    // The DaemonSet controller has not counted the pods yet.
    let out = run.step(Some(&ds(1, 0, 0, 0, 0)), &p);
    assert_eq!(
        degraded(&out),
        (
            "False".into(),
            "AsExpected".into(),
            "No conflicts; the DaemonSet controller has not counted the pods yet".into()
        )
    );
    // Rolling out: 0 of 2 available is not "every pod is available".
    let out = run.step(Some(&ds(1, 1, 2, 2, 0)), &p);
    assert_eq!(
        degraded(&out),
        (
            "False".into(),
            "AsExpected".into(),
            "No conflicts; 0 of 2 scheduled pods are available, the rollout is in progress".into()
        )
    );
    let out = run.step(Some(&ds(1, 1, 2, 2, 2)), &p);
    assert_eq!(
        degraded(&out),
        ("False".into(), "AsExpected".into(), "No conflicts and every scheduled pod is available".into())
    );
    let none = Placement::default();
    let out = Run::new().step(Some(&ds(1, 1, 0, 0, 0)), &none);
    assert_eq!(degraded(&out), ("False".into(), "AsExpected".into(), "No conflicts; no node is scheduled".into()));
}

#[test]
fn transition_time_moves_only_when_status_flips() {
    let p = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
    let mut run = Run::new();
    let first = run.step(Some(&ds(1, 1, 1, 1, 0)), &p);
    let t0 = cond(&first.status, "Ready").last_transition_time.clone();
    let out = run.step(Some(&ds(1, 1, 2, 2, 0)), &p);
    assert_eq!(cond(&out.status, "Ready").last_transition_time, t0, "False -> False keeps the time");
    let out = run.step(Some(&ds(1, 1, 2, 2, 2)), &p);
    assert_ne!(cond(&out.status, "Ready").last_transition_time, t0, "False -> True moves it");
}

#[test]
fn a_refused_spec_is_degraded_spec_invalid() {
    let p = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
    let previous = SchedulerStatus::default();
    let daemonset = ds(1, 1, 1, 1, 1);
    let out = compute(&Inputs {
        generation: Some(2),
        previous: &previous,
        daemonset: Some(&daemonset),
        placement: &p,
        image: Some("x/y"),
        image_error: None,
        image_error_transient: false,
        spec_error: Some("spec.template.spec.containers[0].resources.limits: Invalid value"),
        kernel: &kernel(0, 1, "NotAttached"),
        rollout: None,
        desired: None,
        untolerated: None,
        canary_gate: &crate::rollout::CanaryGate::Open,
        now: time(5),
    });
    assert_eq!(reasons(&out.event), Some((EventKind::Warning, "SpecInvalid")));
    let d = cond(&out.status, "Degraded");
    assert_eq!(d.reason, "SpecInvalid");
    assert!(d.message.contains("resources.limits"), "{}", d.message);
}

#[test]
fn a_refused_image_is_degraded_and_keeps_the_running_image() {
    let p = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
    let previous = SchedulerStatus { resolved_image: Some("r.io/a@sha256:1".into()), ..Default::default() };
    let daemonset = ds(1, 1, 1, 1, 1);
    let kernel_summary = kernel(1, 1, "KernelAttached");
    let observe = |image_error| Inputs {
        generation: Some(2),
        previous: &previous,
        daemonset: Some(&daemonset),
        placement: &p,
        image: None,
        image_error,
        image_error_transient: false,
        spec_error: None,
        kernel: &kernel_summary,
        rollout: None,
        desired: None,
        untolerated: None,
        canary_gate: &crate::rollout::CanaryGate::Open,
        now: time(5),
    };
    let out = compute(&observe(Some("signature of image \"r.io/a:v2\" is invalid")));
    assert_eq!(reasons(&out.event), Some((EventKind::Warning, "ImageVerificationFailed")));
    let d = cond(&out.status, "Degraded");
    assert_eq!((d.status.as_str(), d.reason.as_str()), ("True", "ImageVerificationFailed"));
    assert!(d.message.contains("r.io/a:v2") && d.message.contains("kept as it was"), "{}", d.message);
    assert_eq!(out.status.resolved_image.as_deref(), Some("r.io/a@sha256:1"));
    assert_eq!(cond(&out.status, "Ready").status, "True", "the running pods are still ready");
}

#[test]
fn an_unreachable_registry_is_retried_not_stalled() {
    let p = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
    let previous = SchedulerStatus::default();
    let daemonset = ds(1, 1, 1, 1, 1);
    let kernel_summary = kernel(1, 1, "KernelAttached");
    let observe = |transient| {
        compute(&Inputs {
            generation: Some(1),
            previous: &previous,
            daemonset: Some(&daemonset),
            placement: &p,
            image: None,
            image_error: Some("cannot reach the registry r.io for image \"r.io/a:v1\""),
            image_error_transient: transient,
            spec_error: None,
            kernel: &kernel_summary,
            rollout: None,
            desired: None,
            untolerated: None,
            canary_gate: &crate::rollout::CanaryGate::Open,
            now: time(5),
        })
    };
    let out = observe(true);
    assert_eq!(cond(&out.status, "Stalled").status, "False");
    let r = cond(&out.status, "Reconciling");
    assert_eq!((r.status.as_str(), r.reason.as_str()), ("True", "ImageVerificationFailed"));
    let out = observe(false);
    assert_eq!(cond(&out.status, "Stalled").status, "True");
    assert_eq!(cond(&out.status, "Reconciling").status, "False");
}

#[test]
fn kernel_truth_gives_the_count_the_condition_and_its_own_events() {
    let p = Placement { owned: BTreeSet::from(["n1".into(), "n2".into()]), ..Default::default() };
    let mut run = Run::new();
    run.kernel = kernel(0, 2, "NotAttached");
    let out = run.step(Some(&ds(1, 1, 2, 2, 0)), &p);
    assert_eq!(out.kernel_event, None, "nothing to say before anything attached");
    assert_eq!(out.status.kernel_attached_summary.as_deref(), Some("0/2"));
    assert_eq!(cond(&out.status, "KernelAttached").status, "False");

    run.kernel = kernel(1, 2, "NotAttached");
    let out = run.step(Some(&ds(1, 1, 2, 2, 1)), &p);
    assert_eq!(out.kernel_event, None, "a count change is not a state change");
    assert_eq!(out.status.kernel_attached_summary.as_deref(), Some("1/2"));

    run.kernel = kernel(2, 2, "KernelAttached");
    let out = run.step(Some(&ds(1, 1, 2, 2, 2)), &p);
    let ev = out.kernel_event.as_ref().map(|e| (e.kind, e.reason.as_str()));
    assert_eq!(ev, Some((EventKind::Normal, "KernelAttached")));
    assert_eq!(cond(&out.status, "KernelAttached").status, "True");
    assert_eq!(out.status.kernel_attached, 2);

    run.kernel = kernel(1, 2, "ForeignScheduler");
    let out = run.step(Some(&ds(1, 1, 2, 2, 2)), &p);
    let ev = out.kernel_event.as_ref().map(|e| (e.kind, e.reason.as_str()));
    assert_eq!(ev, Some((EventKind::Warning, "ForeignScheduler")));
    // The count never exceeds the desired nodes.
    run.kernel = kernel(5, 2, "KernelAttached");
    assert_eq!(run.step(Some(&ds(1, 1, 2, 2, 2)), &p).status.kernel_attached, 2);
}

#[test]
fn ejections_are_recorded_and_the_newest_exit_kept() {
    use sked_api::KernelExit;
    let p = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
    let exit = |node: &str, time: &str, ejected: bool| KernelExit {
        node: node.into(),
        ops: "lavd".into(),
        reason: if ejected { "runnable task stall" } else { "unregistered from user space" }.into(),
        detail: String::new(),
        time: time.into(),
        ejected,
        restart: false,
        trace: Vec::new(),
    };
    let mut run = Run::new();
    let stall = exit("n1", "2026-12-01T00:00:01.000Z", true);
    let other = exit("n0", "2026-12-01T00:00:00.500Z", true);
    run.kernel = KernelSummary {
        last_exit: Some(stall.clone()),
        ejections: vec![other.clone(), stall.clone()],
        ..kernel(0, 1, "NotAttached")
    };
    let out = run.step(Some(&ds(1, 1, 1, 1, 0)), &p);
    let events: Vec<(EventKind, &str)> = out.exit_events.iter().map(|e| (e.kind, e.reason.as_str())).collect();
    assert_eq!(events, [(EventKind::Warning, "KernelEjected"); 2], "one per ejection, of each node");
    let message = &out.exit_events[1].message;
    assert!(
        message.starts_with("Node n1: the kernel ejected lavd") && message.contains("runnable task stall"),
        "{message}"
    );
    assert_eq!(out.status.last_exit.as_ref(), Some(&stall));
    // The detail line came with a later report: the same exit, kept with it.
    let detailed = KernelExit { detail: "kworker/0:1[12] failed to run for 2.1s".into(), ..stall.clone() };
    run.kernel = KernelSummary { last_exit: Some(detailed.clone()), ..kernel(0, 1, "NotAttached") };
    let out = run.step(Some(&ds(1, 1, 1, 1, 0)), &p);
    assert!(out.exit_events.is_empty());
    assert_eq!(out.status.last_exit.as_ref(), Some(&detailed));
    // An older exit does not replace the newer one; a newer normal unregistration does.
    run.kernel.last_exit = Some(other);
    assert_eq!(run.step(Some(&ds(1, 1, 1, 1, 0)), &p).status.last_exit, Some(detailed));
    run.kernel.last_exit = Some(exit("n1", "2026-12-01T00:00:09.000Z", false));
    assert_eq!(run.step(Some(&ds(1, 1, 1, 1, 0)), &p).status.last_exit.map(|e| e.ejected), Some(false));
}

#[test]
fn the_pod_cpu_contract_turning_false_is_told_once_and_its_recovery_once() {
    use crate::cpu_contract::ContractView;
    let p = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
    let mut run = Run::new();
    let view = |status, reason, message: &str| ContractView { status, reason, message: message.into() };
    run.kernel = kernel(1, 1, "KernelAttached");
    let unknown = run.step(Some(&ds(1, 1, 1, 1, 1)), &p);
    let c = find(&unknown.status.conditions, condition::POD_CPU_CONTRACT).unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("Unknown", "ContractUnknown"));
    assert_eq!(unknown.contract_event, None, "nothing to tell while nobody said");
    let broken = view(Some(false), Reason::LimitsNotEnforced, "pod UID u used 1.38 CPU against its limit of 0.50");
    run.kernel.cpu_contract = broken.clone();
    let out = run.step(Some(&ds(1, 1, 1, 1, 1)), &p);
    let event = out.contract_event.as_ref().map(|e| (e.kind, e.reason, e.message.as_str()));
    assert_eq!(event, Some((EventKind::Warning, Reason::LimitsNotEnforced, broken.message.as_str())));
    let c = find(&out.status.conditions, condition::POD_CPU_CONTRACT).unwrap();
    assert_eq!((c.status.as_str(), c.message.as_str()), ("False", broken.message.as_str()));
    run.kernel.cpu_contract.message = "pod UID u used 1.41 CPU against its limit of 0.50".into();
    assert_eq!(run.step(Some(&ds(1, 1, 1, 1, 1)), &p).contract_event, None, "the same reason: told once");
    run.kernel.cpu_contract = view(Some(true), Reason::CpuControlsImplemented, "implemented");
    let back = run.step(Some(&ds(1, 1, 1, 1, 1)), &p).contract_event.map(|e| (e.kind, e.reason));
    assert_eq!(back, Some((EventKind::Normal, Reason::CpuControlsImplemented)));
    // A new leader that has not heard every agent keeps the condition it found.
    run.kernel = KernelSummary { settled: false, cpu_contract: broken, ..kernel(1, 1, "KernelAttached") };
    let carried = run.step(Some(&ds(1, 1, 1, 1, 1)), &p);
    let c = find(&carried.status.conditions, condition::POD_CPU_CONTRACT).unwrap();
    assert_eq!((c.status.as_str(), carried.contract_event), ("True", None));
}

#[test]
fn an_unsettled_kernel_view_keeps_the_condition_and_records_nothing() {
    let p = Placement { owned: BTreeSet::from(["n1".into(), "n2".into()]), ..Default::default() };
    let mut run = Run::new();
    run.kernel = kernel(2, 2, "KernelAttached");
    let attached = run.step(Some(&ds(1, 1, 2, 2, 2)), &p);
    // A new leader has heard no agent yet.
    run.kernel = KernelSummary { settled: false, unreported: 2, ..kernel(0, 2, "NotAttached") };
    let out = run.step(Some(&ds(1, 1, 2, 2, 2)), &p);
    assert_eq!(cond(&out.status, "KernelAttached"), cond(&attached.status, "KernelAttached"));
    assert_eq!(out.status.kernel_attached, 2);
    assert_eq!(out.kernel_event, None);
    // Once settled, the view counts.
    run.kernel = kernel(1, 2, "NotAttached");
    let out = run.step(Some(&ds(1, 1, 2, 2, 2)), &p);
    assert_eq!(cond(&out.status, "KernelAttached").reason, "NotAttached");
    assert!(out.kernel_event.is_some());
}

#[test]
fn foreign_conditions_are_carried_over() {
    let mut run = Run::new();
    run.previous.conditions.push(Condition {
        type_: "ExampleFromAnotherTool".into(),
        status: "True".into(),
        reason: "Because".into(),
        message: "".into(),
        observed_generation: Some(1),
        last_transition_time: time(1),
    });
    let p = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
    let out = run.step(Some(&ds(1, 1, 1, 1, 1)), &p);
    assert!(out.status.conditions.iter().any(|c| c.type_ == "ExampleFromAnotherTool"));
}
