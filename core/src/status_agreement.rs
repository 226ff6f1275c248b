//! Every rollout phase against every kernel count a Scheduler's status can show beside it: no
//! condition's message contradicts the phase or a number shown next to it (KERNEL-ATTACHED,
//! DESIRED).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use sked_api::verdict::Verdict;
use sked_api::{Revision, RolloutFailure, RolloutPhase, RolloutStatus, SchedulerStatus, condition};

use crate::arbiter::Placement;
use crate::kernel_summary::{NodeReport, summarize};
use crate::status::{Inputs, compute};

const PHASES: [RolloutPhase; 7] = [
    RolloutPhase::Queued,
    RolloutPhase::Canary,
    RolloutPhase::Rolling,
    RolloutPhase::Paused,
    RolloutPhase::Complete,
    RolloutPhase::RolledBack,
    RolloutPhase::Failed,
];

fn revision(name: &str) -> Revision {
    Revision { name: name.into(), image: "i".into(), generation: 1, spec: None, agent_image: None }
}

/// The rollout status of `phase` with `updated` nodes on the new revision: a failure stands in
/// RolledBack and Failed; a revision ran everywhere before, except in Failed (a first one).
fn rollout(phase: RolloutPhase, updated: i32) -> RolloutStatus {
    let failed = matches!(phase, RolloutPhase::RolledBack | RolloutPhase::Failed);
    RolloutStatus {
        phase,
        updated_nodes: updated,
        update_revision: Some(revision("r2")),
        current_revision: (phase != RolloutPhase::Failed).then(|| revision("r1")),
        failed: failed.then(|| RolloutFailure {
            revision: "r2".into(),
            generation: 1,
            node: "n0".into(),
            cause: "the kernel stopped running the scheduler after it had attached".into(),
            time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            reason: None,
            evidence: None,
        }),
        ..Default::default()
    }
}

fn daemonset(scheduled: i32, available: i32) -> DaemonSet {
    DaemonSet {
        metadata: ObjectMeta {
            name: Some("s".into()),
            namespace: Some("sked-system".into()),
            generation: Some(1),
            ..Default::default()
        },
        spec: Default::default(),
        status: Some(DaemonSetStatus {
            observed_generation: Some(1),
            desired_number_scheduled: scheduled,
            current_number_scheduled: scheduled,
            updated_number_scheduled: Some(scheduled),
            number_ready: available,
            number_available: Some(available),
            ..Default::default()
        }),
    }
}

/// The numbers a message says before "scheduled nodes run this scheduler": (attached, scheduled).
fn counted(message: &str) -> Option<(i32, i32)> {
    let head = message.split(" scheduled nodes run this scheduler").next().filter(|h| h.len() < message.len())?;
    let (a, b) = head.rsplit_once(" of ")?;
    Some((a.rsplit(' ').next()?.parse().ok()?, b.parse().ok()?))
}

/// What the status says of `phase`, `desired` nodes covered, `scheduled` of them with a pod and
/// `attached` of those attached, checked against the phase and the numbers shown.
fn check(phase: RolloutPhase, desired: i32, scheduled: i32, attached: i32, held: bool) {
    let nodes: BTreeSet<String> = (0..scheduled).map(|i| format!("n{i}")).collect();
    let now = Instant::now();
    let reports: HashMap<String, NodeReport> = nodes
        .iter()
        .take(usize::try_from(attached).unwrap_or(0))
        .map(|n| {
            (
                n.clone(),
                NodeReport::arrived(
                    "s".into(),
                    format!("p-{n}"),
                    Verdict::Attached,
                    String::new(),
                    "x".into(),
                    now,
                    None,
                ),
            )
        })
        .collect();
    let kernel = summarize("s", &nodes, desired, &reports, now, Duration::from_secs(30));
    let mut rollout = rollout(phase, scheduled);
    if held {
        // Paused by an Inconclusive verdict that holds the rollout, not by the spec.
        rollout.analysis = Some(sked_api::AnalysisStatus {
            revision: "r2".into(),
            verdict: sked_api::AnalysisVerdict::Inconclusive,
            generation: Some(1),
            holds: true,
            message: "too few samples".into(),
            nodes: Vec::new(),
            time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        });
    }
    let previous = SchedulerStatus::default();
    let placement = Placement { owned: (0..desired).map(|i| format!("n{i}")).collect(), ..Default::default() };
    let ds = daemonset(scheduled, attached);
    let gate = crate::rollout::CanaryGate::Full { max: 1 };
    let out = compute(&Inputs {
        generation: Some(1),
        previous: &previous,
        daemonset: Some(&ds),
        placement: &placement,
        image: Some("i"),
        spec_error: None,
        image_error: None,
        image_error_transient: false,
        kernel: &kernel,
        rollout: Some(&rollout),
        desired: Some(desired),
        untolerated: None,
        canary_gate: &gate,
        now: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    });
    let st = &out.status;
    let case = format!("{phase:?} (held {held}), desired {desired}, scheduled {scheduled}, attached {attached}");
    let find = |t: &str| st.conditions.iter().find(|c| c.type_ == t);
    let kernel_attached = find(condition::KERNEL_ATTACHED).map(|c| c.message.clone()).unwrap_or_default();
    // The numbers: what the message counts is what KERNEL-ATTACHED and DESIRED show.
    assert_eq!(st.kernel_attached_summary, Some(format!("{}/{}", st.kernel_attached, st.desired_number_scheduled)));
    if let Some((a, b)) = counted(&kernel_attached) {
        assert_eq!(a, st.kernel_attached, "{case}: {kernel_attached}");
        assert!(b <= st.desired_number_scheduled, "{case}: {kernel_attached}");
    }
    for c in &st.conditions {
        let m = &c.message;
        // No node waits for a pod once the rollout is over, or of a revision rolled back to the
        // kernel's default scheduler.
        if matches!(phase, RolloutPhase::Complete | RolloutPhase::Failed) {
            assert!(!m.contains("wait for a pod") && !m.contains("waits for a pod"), "{case}: {} says {m}", c.type_);
        }
        // A queued rollout switches nothing yet; a rollout that ended does not say it is in
        // progress.
        if matches!(phase, RolloutPhase::Queued | RolloutPhase::RolledBack | RolloutPhase::Failed) {
            assert!(!m.starts_with("Canary:") && !m.starts_with("Rolling:"), "{case}: {} says {m}", c.type_);
        }
    }
    if phase == RolloutPhase::Paused && desired > 0 {
        // Who paused it: the spec, or the analysis.
        let progressing = find(condition::PROGRESSING).map(|c| c.message.as_str()).unwrap_or_default();
        let said = if held { "Inconclusive" } else { "spec.rollout.paused" };
        assert!(progressing.contains(said), "{case}: {progressing}");
        assert!(!held || !st.conditions.iter().any(|c| c.message.contains("spec.rollout.paused")), "{case}");
    }
    if phase == RolloutPhase::Queued && desired > 0 {
        let progressing = find(condition::PROGRESSING).map(|c| c.message.as_str()).unwrap_or_default();
        assert!(
            progressing.starts_with("Queued:") && progressing.contains("at most 1 at a time"),
            "{case}: {progressing}"
        );
    }
    if phase == RolloutPhase::Failed {
        let ready = find(condition::READY).map(|c| c.status.as_str());
        assert_eq!(ready, Some("False"), "{case}: a revision rolled back everywhere is not Ready");
        if attached == 0 {
            assert!(
                kernel_attached.contains("rolled back to the kernel's default scheduler"),
                "{case}: {kernel_attached}"
            );
        }
    }
}

#[test]
fn no_message_contradicts_the_phase_or_the_numbers_beside_it() {
    for phase in PHASES {
        for desired in 0..=3 {
            for scheduled in 0..=desired {
                // A Complete rollout has a pod on every node it covers; a revision rolled back
                // to revision zero covers none once its pods are gone (`rollout::advance`).
                if phase == RolloutPhase::Complete && scheduled != desired {
                    continue;
                }
                if phase == RolloutPhase::Failed && scheduled == 0 && desired > 0 {
                    continue;
                }
                for attached in 0..=scheduled {
                    for held in [false, true].into_iter().filter(|h| !h || phase == RolloutPhase::Paused) {
                        check(phase, desired, scheduled, attached, held);
                    }
                }
            }
        }
    }
}
