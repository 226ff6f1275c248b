//! One rollout step: the nodes and pods as the rollout sees them ([`rollout::NodeView`]), the
//! nodes entering from revision zero, the step [`rollout::decide`] and [`rollout::advance`]
//! decide on them, and the events of a rollback.

use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sked_api::{Reason, Revision, RevisionSpec, RolloutFailure, RolloutStatus};

use super::{Snapshot, name_of, previous_rollout};
use crate::node_view::{self, Labelling, TemplateRevision};
use crate::pods::SchedulerPod;
use crate::rollout;
use crate::status::{EventKind, EventSpec};
use crate::workload;

/// What the spec asks for: the revision and image when the image is admitted, and that
/// revision's failure when it already failed under this generation.
pub(super) struct Intent<'a> {
    pub(super) wanted: Option<&'a (String, String)>,
    pub(super) failed: Option<&'a RolloutFailure>,
}

/// One step of a Scheduler's rollout, decided but not yet carried out.
/// A pod a rollout step deletes for the template's revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replacement {
    pub pod: String,
    /// The pod's uid: a pod of the same name made since is not the one decided on.
    pub uid: String,
    /// Its node: switching until the new pod shows (see [`super::Memory::replaced`]).
    pub node: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RolloutActions {
    pub status: RolloutStatus,
    /// The image the DaemonSet's template runs.
    pub image: String,
    /// Pods to delete (each comes back as the template's revision).
    pub replace: Vec<Replacement>,
    /// Set the template back to this revision (the current one): a revision failed.
    pub roll_back: Option<Revision>,
    /// Entering nodes to label now, and nodes whose label goes (back to the kernel's default).
    pub admit: Vec<String>,
    pub evict: Vec<String>,
    /// The RolledBack events, when the revision failed in this step: to the current revision,
    /// and to the kernel's default on the nodes that go back to it.
    pub rolled_back: Vec<EventSpec>,
    /// The revision failed in this step.
    pub newly_failed: Option<RolloutFailure>,
    /// A revision recorded failed runs attached everywhere after all.
    pub recovered: bool,
    pub recheck_in: Option<Duration>,
    /// Skipped nodes KernelAttached does not count (see `rollout::Decision::off_kernel_count`).
    pub off_kernel_count: Vec<String>,
    /// The nodes the rollout covers (`rollout::Decision::desired`): DESIRED.
    pub desired: i32,
    /// What the step does with the canary slot (`rollout::Decision::canary`).
    pub canary: rollout::CanaryClaim,
}

impl RolloutActions {
    /// Whether carrying the step out writes anything.
    pub fn writes(&self) -> bool {
        self.roll_back.is_some()
            || !self.replace.is_empty()
            || !self.admit.is_empty()
            || !self.evict.is_empty()
            || !self.rolled_back.is_empty()
    }

    /// The events recorded once the step is carried out.
    pub fn events(&self) -> impl Iterator<Item = &EventSpec> {
        self.rolled_back.iter()
    }
}

/// Decides the next rollout step on the DaemonSet `ds` (`applied_generation`: the one this
/// term last applied), and the labelled nodes now seen attached.
pub(super) fn decide(
    s: &Snapshot<'_>,
    ds: &DaemonSet,
    applied_generation: i64,
    intent: &Intent<'_>,
) -> (RolloutActions, Vec<String>) {
    let previous = previous_rollout(s);
    let template = template_revision(s, ds);
    let stable = previous.current_revision.as_ref().map(|r| r.name.as_str());
    let wall = s.clock.wall.as_second();
    let (labelled, entering) = entering_nodes(s);
    let (nodes, attached) = node_views(s, &labelled, &template);
    let limits = s.scheduler.spec.rollout.as_ref().and_then(|r| r.analysis.as_ref()).map(crate::analysis::Limits::of);
    let plan = rollout::decide(&rollout::Input {
        target: &template.name,
        stable,
        nodes: &nodes,
        entering: &entering,
        // Held while the failure they were held under stands (as `rollout::advance` keeps them).
        held: if intent.failed.is_some() { &previous.held_nodes } else { &[] },
        expected_pods: expected_pods(s, ds, nodes.len()),
        // A retry of a revision that failed under an earlier generation: the pods of that
        // attempt are replaced, not judged again.
        retried_after: previous
            .failed
            .as_ref()
            .filter(|f| intent.failed.is_none() && f.revision == template.name)
            .map(|f| f.time.0.as_second()),
        pacing: rollout::Pacing::of(s.scheduler.spec.rollout.as_ref(), nodes.len() + entering.len()),
        analysis: limits.as_ref().map(|limits| rollout::Analysis {
            limits,
            health: s.health,
            last: previous
                .analysis
                .as_ref()
                .filter(|a| a.revision == template.name && a.verdict != sked_api::AnalysisVerdict::Failed),
            baseline: previous.baseline.as_ref(),
            generation: s.scheduler.metadata.generation.unwrap_or(0),
        }),
        canary_gate: s.canary_gate,
        now: wall,
    });
    let step = rollout::advance(&rollout::Progress {
        previous: &previous,
        failed: intent.failed,
        plan: &plan,
        template: Revision {
            name: template.name.clone(),
            image: template.image.clone(),
            generation: s.scheduler.metadata.generation.unwrap_or(0),
            // The spec's fields, when the template is the spec's revision (not one rolled back to).
            spec: intent
                .wanted
                .is_some_and(|(revision, _)| *revision == template.name)
                .then(|| RevisionSpec::of(&s.scheduler.spec)),
            agent_image: Some(template.agent_image.clone()).filter(|a| !a.is_empty()),
        },
        wanted: intent.wanted.map(|(revision, image)| (revision.as_str(), image.as_str())),
        caught_up: caught_up(ds, applied_generation),
        now: Time(s.clock.wall),
    });
    let recovered = step.status.failed.is_none() && intent.failed.is_some();
    let canary = canary_claim(plan.canary, &step);
    let recheck_in =
        plan.recheck_in.map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(1)) + Duration::from_millis(200));
    let actions = RolloutActions {
        off_kernel_count: plan.off_kernel_count,
        canary,
        recovered,
        ..RolloutActions::of(step, template.image, s.pods, &previous, recheck_in)
    };
    (actions, attached)
}

/// What the step does with the canary slot, as carried out: the decision's claim, unless a
/// failure stands (the rollout is RolledBack or Failed) or a start neither switches a node nor
/// writes Canary; and a canary runs only while the phase written is Canary (a wave past the canary stays Rolling
/// while its pods come back, though the decision alone would call it Canary again).
fn canary_claim(decided: rollout::CanaryClaim, step: &rollout::Step) -> rollout::CanaryClaim {
    use sked_api::RolloutPhase;
    let phase = step.status.phase;
    let switches = !step.replace.is_empty() || !step.admit.is_empty();
    match decided {
        _ if matches!(phase, RolloutPhase::RolledBack | RolloutPhase::Failed) => rollout::CanaryClaim::None,
        // A start claims its slot even when it switches nothing yet (the DaemonSet controller
        // has not seen the new template): its status already says Canary, and a status in
        // Canary is a canary that holds a slot.
        rollout::CanaryClaim::Starts if switches || phase == RolloutPhase::Canary => rollout::CanaryClaim::Starts,
        rollout::CanaryClaim::Runs if phase == RolloutPhase::Canary => rollout::CanaryClaim::Runs,
        _ => rollout::CanaryClaim::None,
    }
}

/// The revision the DaemonSet's template makes, with its earlier name when it is the spec's
/// (not one rolled back to): pods an earlier sked labelled so still count as its own.
fn template_revision(s: &Snapshot<'_>, ds: &DaemonSet) -> TemplateRevision {
    let mut template = TemplateRevision::of(ds);
    if template.name == workload::revision(s.scheduler, &template.image, &template.agent_image) {
        template.earlier_name = Some(workload::revision_before_agents(s.scheduler, &template.image));
    }
    template
}

impl RolloutActions {
    /// The actions of the step `rollout::advance` decided, from the rollout status `previous`.
    fn of(
        step: rollout::Step,
        image: String,
        pods: &[std::sync::Arc<SchedulerPod>],
        previous: &RolloutStatus,
        recheck_in: Option<Duration>,
    ) -> Self {
        let stable = previous.current_revision.as_ref();
        let roll_back = stable.filter(|_| step.roll_back && step.status.failed.is_some()).cloned();
        let mut rolled_back = Vec::new();
        if let Some(failure) = &step.newly_failed {
            rolled_back.extend(roll_back.as_ref().map(|to| rolled_back_to(failure, to)));
            // Nodes back to revision zero: a first revision failed, or a takeover under the
            // stable one.
            if stable.is_none() || !step.evict.is_empty() {
                let which = if stable.is_some() {
                    "the nodes it was taking over where it failed"
                } else {
                    "every node it reached"
                };
                rolled_back.push(back_to_zero(failure, which, step.evict.len()));
            }
        }
        let replace = step
            .replace
            .into_iter()
            .filter_map(|name| {
                let pod = pods.iter().find(|p| p.name == name)?;
                Some(Replacement { uid: pod.uid.clone(), node: pod.node_or_target()?.to_owned(), pod: name })
            })
            .collect();
        Self {
            status: step.status,
            image,
            replace,
            roll_back,
            admit: step.admit,
            evict: step.evict,
            rolled_back,
            newly_failed: step.newly_failed,
            recovered: false,
            recheck_in,
            off_kernel_count: Vec::new(),
            desired: i32::try_from(step.desired).unwrap_or(i32::MAX),
            canary: rollout::CanaryClaim::None,
        }
    }
}

/// The reason of a RolledBack event: AnalysisFailed when the analysis of a bake failed it.
fn rollback_reason(failure: &RolloutFailure) -> Reason {
    match failure.reason.as_deref() {
        Some(r) if r == Reason::AnalysisFailed.as_str() => Reason::AnalysisFailed,
        _ => Reason::RolledBack,
    }
}

fn rolled_back_to(failure: &RolloutFailure, to: &Revision) -> EventSpec {
    let message = format!(
        "Revision {} failed on node {}: {}. Rolled back to revision {} ({})",
        failure.revision, failure.node, failure.cause, to.name, to.image
    );
    EventSpec { kind: EventKind::Warning, reason: rollback_reason(failure), message }
}

fn back_to_zero(failure: &RolloutFailure, which: &str, nodes: usize) -> EventSpec {
    let message = format!(
        "Revision {} failed on node {}: {}. Rolled back to the kernel's default scheduler on {which} ({nodes})",
        failure.revision, failure.node, failure.cause
    );
    EventSpec { kind: EventKind::Warning, reason: rollback_reason(failure), message }
}

/// Each labelled node with its pod (a live one before a terminating one) and what that pod's
/// agent last reported, if the report is fresh; and the nodes now seen running attached (the
/// term forgets when it labelled them).
fn node_views(
    s: &Snapshot<'_>,
    labelled: &[String],
    template: &TemplateRevision,
) -> (Vec<rollout::NodeView>, Vec<String>) {
    let name = name_of(s);
    let attach_timeout = attach_timeout(s);
    let mut attached = Vec::new();
    let views = labelled
        .iter()
        .map(|node| {
            // A pod not bound yet counts for the node it is made for: one never bound is that
            // node's trouble, not a pod the DaemonSet controller still owes.
            let pod = s
                .pods
                .iter()
                .filter(|p| p.node_or_target() == Some(node.as_str()))
                .min_by_key(|p| p.is_terminating())
                .map(AsRef::as_ref);
            let report =
                s.reports.get(node).filter(|r| r.scheduler == name && r.fresh(s.clock.now, s.settings.stale_after));
            // A node that runs attached has a pod, so it is not `just_labelled` whatever `ago`.
            let ago = s.memory.labelled.get(node).copied();
            let replaced = s.memory.replaced.get(node).map(|(pod, ago)| (pod.as_str(), *ago));
            let labelling = Labelling { ago, replaced, term_age: s.memory.term_age, attach_timeout };
            let view = node_view::node_view(node, pod, report, template, labelling, s.clock.wall.as_second());
            // Forgotten once the Node watch shows the label too (it may lag behind the pods').
            let label_seen = s.nodes.owner(node) == Some(Some(name.as_str()));
            if ago.is_some() && label_seen && node_view::runs_attached(&view.kernel, pod) {
                attached.push(node.clone());
            }
            rollout::NodeView { unfit: unfit(s, node), ..view }
        })
        .collect();
    (views, attached)
}

/// The pods the DaemonSet controller means to run; until it has counted them, one per labelled
/// node. (Less the nodes another Scheduler took, which keep this one's pod until their wave, and
/// the nodes deleted under a pod: the DaemonSet controller counts such a node until the pod
/// garbage collector removes its pod, which may take a minute or never come.)
fn expected_pods(s: &Snapshot<'_>, ds: &DaemonSet, labelled: usize) -> usize {
    let taken = s.nodes.labelled.iter().filter(|n| !s.placement.owned.contains(*n)).count();
    let node_gone = s
        .pods
        .iter()
        .filter(|p| !p.is_terminating())
        .filter(|p| p.node.as_deref().is_some_and(|n| !s.nodes.known.contains_key(n)))
        .count();
    ds.status
        .as_ref()
        .filter(|s| s.observed_generation.is_some())
        .map_or(labelled, |s| usize::try_from(s.desired_number_scheduled).unwrap_or(0))
        .saturating_sub(taken + node_gone)
}

/// The DaemonSet controller has seen the template, and this copy is not older than the one
/// this term last applied (the index may lag behind its own write).
fn caught_up(ds: &DaemonSet, applied_generation: i64) -> bool {
    let ds_generation = ds.metadata.generation.unwrap_or(0);
    ds.status.as_ref().and_then(|s| s.observed_generation).unwrap_or(0) >= ds_generation
        && ds_generation >= applied_generation
}

/// The nodes the Scheduler owns, split into those that carry its owner label (sorted) and those
/// that do not yet, entering from revision zero. An entering node joined on its own when it was
/// created after the Scheduler and no other Scheduler's label is on it.
///
/// A node this term labelled within the attach timeout counts as labelled while the Node watch
/// shows it older than that write (a resourceVersion before the one the write made): the watch
/// may lag far behind (it starts over after an API server restart), and a node taken for
/// entering again would be let in again, and the next wave with it, past `maxUnavailable`. Once
/// the watch caught up, it says what the node carries (someone may have taken the label off).
fn entering_nodes(s: &Snapshot<'_>) -> (Vec<String>, Vec<rollout::Entering>) {
    let name = name_of(s);
    let created = s.scheduler.metadata.creation_timestamp.as_ref().map_or(i64::MAX, |t| t.0.as_second());
    let attach_timeout = attach_timeout(s);
    let mut labelled = Vec::new();
    let mut entering = Vec::new();
    for node in &s.placement.owned {
        let written = s.memory.label_versions.get(node);
        let seen = s.nodes.known.get(node).and_then(|e| e.version);
        let behind = written.is_some_and(|w| seen.is_none_or(|seen| seen < *w));
        let just_written = behind && s.memory.labelled.get(node).is_some_and(|ago| *ago < attach_timeout);
        match s.nodes.owner(node) {
            Some(Some(owner)) if owner == name => labelled.push(node.clone()),
            Some(_) if just_written => labelled.push(node.clone()),
            Some(owner) => {
                let node_created = s.nodes.facts(node).and_then(|f| f.created);
                entering.push(rollout::Entering {
                    node: node.clone(),
                    joined: owner.is_none() && node_created.is_some_and(|t| t > created),
                    runs_it: s.nodes.scheduled.contains(node),
                    unfit: unfit(s, node),
                });
            }
            None => {}
        }
    }
    (labelled, entering)
}

/// The Scheduler's `attachTimeoutSeconds`.
fn attach_timeout(s: &Snapshot<'_>) -> Duration {
    let seconds = rollout::Pacing::of(s.scheduler.spec.rollout.as_ref(), 1).attach_timeout_seconds;
    Duration::from_secs(u64::try_from(seconds).unwrap_or(1))
}

/// Why no pod of the Scheduler can run on `node` now, if so: the Node is down, or it has a
/// taint the Scheduler does not tolerate.
fn unfit(s: &Snapshot<'_>, node: &str) -> Option<rollout::Skip> {
    let facts = s.nodes.facts(node)?;
    if facts.down() {
        Some(rollout::Skip::NodeNotReady)
    } else {
        facts.untolerated(&s.scheduler.spec.tolerations).map(|_| rollout::Skip::TaintNotTolerated)
    }
}
