//! The writes a reconcile decides besides the status and the rollout: the DaemonSet's
//! ([`daemonset`]), which comes first, and the pods' KernelAttached conditions.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use kube_core::ResourceExt;
use sked_api::{Revision, RolloutFailure};

use super::{Admitted, Applied, Snapshot, name_of, previous_rollout, wanted_revision};
use crate::pods::KernelCondition;
use crate::workload::{self, MissingIdentity};

/// How soon a Scheduler whose running nodes wait for their owner label is looked at again
/// (the label's arrival wakes it anyway).
pub const LABELS_AWAITED: Duration = Duration::from_secs(5);
/// Most pod conditions one reconcile writes; the rest go in the next one, soon after.
pub const MAX_POD_CONDITIONS: usize = 500;
/// How soon a reconcile that left pod conditions over looks again.
pub const MORE_CONDITIONS_AFTER: Duration = Duration::from_secs(1);

/// What to do with the Scheduler's DaemonSet.
#[derive(Clone, Debug, PartialEq)]
pub enum DaemonSetWrite {
    /// Apply `desired`, which carries the digest `hash` ([`workload::APPLIED_ANNOTATION`]).
    Apply { desired: Box<DaemonSet>, hash: String, image: String },
    /// Leave it as it is (or as missing). `remember`: a new leader found it as it would apply
    /// it, which the term remembers as its own apply. `requeue`: nodes that run its pod wait for
    /// their owner label, which the template selects.
    Keep { remember: Option<Applied>, requeue: Option<Duration> },
    /// Make it again, as a recorded failure left it, after someone deleted it.
    Recreate(Recreate),
    /// Delete it: the Scheduler owns no node and no node carries its label.
    Delete,
}

/// Which DaemonSet to make again after a failure.
#[derive(Clone, Debug, PartialEq)]
pub enum Recreate {
    /// The revision rolled back to (the current one).
    Stable(Box<Revision>),
    /// The spec's own, for a first revision or a takeover (its failed nodes lost their label,
    /// so no pod of it goes anywhere).
    Spec(Box<DaemonSet>),
}

impl DaemonSetWrite {
    fn keep() -> Self {
        DaemonSetWrite::Keep { remember: None, requeue: None }
    }
}

/// What to do with the DaemonSet: apply the admitted image of a revision that has not failed;
/// keep it as it is while the image is refused or the revision failed (made again if someone
/// deleted it meanwhile); delete it when the Scheduler owns no node. Nodes another Scheduler took
/// keep this one's pod until their wave moves their label: the DaemonSet stays while any node
/// carries it. Nothing to delete (none seen, none applied in this term) is no write, so a
/// Scheduler that owns no node costs nothing when it is reconciled again.
pub fn daemonset(s: &Snapshot<'_>) -> Result<DaemonSetWrite, MissingIdentity> {
    let (wanted, failed) = wanted_revision(s);
    let wants_daemonset = s.placement.wants_daemonset() || !s.nodes.labelled.is_empty();
    match (s.admission.as_ref().ok(), wants_daemonset, failed) {
        (Some(admitted), true, None) => apply(s, admitted),
        (_, true, failed) => match (s.daemonset, failed) {
            (None, Some(failure)) => recreate(s, &failure, wanted.as_ref()),
            _ => Ok(DaemonSetWrite::keep()),
        },
        (_, false, _) if s.daemonset.is_some() || s.memory.applied.is_some() => Ok(DaemonSetWrite::Delete),
        (_, false, _) => Ok(DaemonSetWrite::keep()),
    }
}

/// Applies the DaemonSet that runs the admitted image, unless the one applied before is
/// unchanged, or nodes that run its pod wait for their owner label (the template selects it).
fn apply(s: &Snapshot<'_>, admitted: &Admitted) -> Result<DaemonSetWrite, MissingIdentity> {
    let name = name_of(s);
    let mut desired = workload::desired_daemonset(s.scheduler, &admitted.image, &s.settings.workload)?;
    if let Some(key) = &admitted.key {
        desired.annotations_mut().insert(workload::ADMITTED_ANNOTATION.to_owned(), key.clone());
    }
    let hash = workload::applied_digest(&desired);
    desired.annotations_mut().insert(workload::APPLIED_ANNOTATION.to_owned(), hash.clone());
    if let Some(remember) = applied_unchanged(s, &hash) {
        return Ok(DaemonSetWrite::Keep { remember, requeue: None });
    }
    let running: BTreeSet<&String> = s.nodes.scheduled.intersection(&s.placement.owned).collect();
    let waiting = running.iter().any(|n| s.nodes.owner(n).flatten() != Some(name.as_str()));
    if waiting {
        return Ok(DaemonSetWrite::Keep { remember: None, requeue: Some(LABELS_AWAITED) });
    }
    Ok(DaemonSetWrite::Apply { desired: Box::new(desired), hash, image: admitted.image.clone() })
}

/// Whether the DaemonSet needs no apply (`Some`), and what the term then remembers: applied in
/// this term with the same digest and not edited since (its generation did not move past the
/// one the apply got); or, not applied in this term (a new leader), carrying the digest with no
/// other writer ([`workload::applied_unchanged`]), remembered as applied at its generation.
fn applied_unchanged(s: &Snapshot<'_>, hash: &str) -> Option<Option<Applied>> {
    let live = s.daemonset?;
    let generation = live.metadata.generation.unwrap_or(0);
    match &s.memory.applied {
        Some(a) => (a.hash == hash && generation <= a.generation).then_some(None),
        None => workload::applied_unchanged(live, hash).then(|| Some(Applied { hash: hash.to_owned(), generation })),
    }
}

/// Makes again the DaemonSet of a Scheduler whose rollout failed, after someone deleted it: the
/// template of the revision rolled back to (the current one), or, for a first revision or a
/// takeover, the spec's own (without an admitted image: none).
fn recreate(
    s: &Snapshot<'_>,
    failure: &RolloutFailure,
    wanted: Option<&(String, String)>,
) -> Result<DaemonSetWrite, MissingIdentity> {
    let previous = previous_rollout(s);
    if let Some(stable) = previous.current_revision.as_ref().filter(|stable| stable.name != failure.revision) {
        return Ok(DaemonSetWrite::Recreate(Recreate::Stable(Box::new(stable.clone()))));
    }
    Ok(match wanted {
        Some((_, image)) => DaemonSetWrite::Recreate(Recreate::Spec(Box::new(workload::desired_daemonset(
            s.scheduler,
            image,
            &s.settings.workload,
        )?))),
        None => DaemonSetWrite::keep(),
    })
}

/// One pod condition to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodConditionWrite {
    pub pod: String,
    pub uid: String,
    pub condition: KernelCondition,
    /// What the pod carried when it was decided.
    pub observed: Option<KernelCondition>,
}

/// The KernelAttached conditions to write on the Scheduler's pods, where a pod does not say so
/// already and this term did not write it (at most [`MAX_POD_CONDITIONS`]), and when to look
/// again: writes left over, or a silent pod not old enough to judge yet. `grace_over`: a new
/// leader's grace for agents to report has passed, so a silent pod may be called stale.
pub(super) fn pod_conditions(s: &Snapshot<'_>, grace_over: bool) -> (Vec<PodConditionWrite>, Option<Duration>) {
    let stale_after = s.settings.stale_after;
    let wall = s.clock.wall.as_second();
    let mut recheck: Option<Duration> = None;
    let mut writes: Vec<PodConditionWrite> = s
        .pods
        .iter()
        .filter_map(|pod| {
            let report = pod.node.as_ref().and_then(|n| s.reports.get(n));
            let reported = report.is_some_and(|r| r.pod == pod.name);
            let age = pod.created.map_or(0, |c| wall.saturating_sub(c).max(0).cast_unsigned());
            let old_enough = Duration::from_secs(age) > stale_after;
            if grace_over && !old_enough && !reported && pod.started && !pod.is_terminating() {
                let due = stale_after.saturating_sub(Duration::from_secs(age)) + MORE_CONDITIONS_AFTER;
                recheck = Some(recheck.map_or(due, |r| r.min(due)));
            }
            let want = crate::pod_conditions::desired(pod, report, s.clock.now, stale_after, grace_over && old_enough)?;
            let written = s.memory.conditions_sent.get(&pod.uid);
            let condition = crate::pod_conditions::to_write(pod.kernel.as_ref(), &want, written, wall)?;
            Some(PodConditionWrite {
                pod: pod.name.clone(),
                uid: pod.uid.clone(),
                condition,
                observed: pod.kernel.clone(),
            })
        })
        .collect();
    if writes.len() > MAX_POD_CONDITIONS {
        writes.truncate(MAX_POD_CONDITIONS);
        recheck = Some(recheck.map_or(MORE_CONDITIONS_AFTER, |r| r.min(MORE_CONDITIONS_AFTER)));
    }
    (writes, recheck)
}
