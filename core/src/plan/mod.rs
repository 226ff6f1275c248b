//! One reconcile's decisions, as pure functions of one immutable [`Snapshot`]: the Scheduler and
//! its placement, the status last written, the image's admission, the DaemonSet, its pods, its
//! nodes, one read of the kernel table, the clocks and what this leadership term remembers.
//!
//! A reconcile observes, decides and applies:
//! - [`daemonset`] decides the DaemonSet's write (apply, keep, make again, delete);
//! - [`decide`] turns the snapshot, with the DaemonSet as that write left it, into a [`Plan`]:
//!   the status and its events, the rollout's actions (replace, let in, send back, roll back)
//!   and their events, the pods' KernelAttached conditions, what the term remembers, and when to
//!   look again.
//!
//! Two decisions, not one, because the rollout is judged against the DaemonSet the API server
//! accepted (its template's revision and generation), which only that write returns. The
//! controller carries each out, fenced by leadership.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use kube_core::ResourceExt;
use sked_api::{KernelExit, RolloutFailure, RolloutStatus, Scheduler, SchedulerStatus};

use crate::arbiter::Placement;
use crate::kernel_summary::NodeReport;
use crate::nodes::NodeFacts;
use crate::pods::{KernelCondition, SchedulerPod};
use crate::status::{self, EventSpec};
use crate::workload::{self, WorkloadSettings};

pub mod echo;
mod kernel;
mod rollout_step;
mod writes;

pub use self::kernel::ejections_to_look_up;
pub use self::rollout_step::{Replacement, RolloutActions};
pub use self::writes::{DaemonSetWrite, PodConditionWrite, Recreate, daemonset};

#[cfg(test)]
mod tests;

/// Everything one reconcile of a Scheduler reads before it decides, read once.
#[derive(Clone, Debug)]
pub struct Snapshot<'a> {
    pub scheduler: &'a Scheduler,
    /// Which selected nodes it owns and lost (read with the Scheduler, at the same moment).
    pub placement: &'a Placement,
    /// The status this term last wrote (newer than a cache that may lag behind), else the
    /// object's.
    pub previous: &'a SchedulerStatus,
    /// The trust policy's verdict on the image.
    pub admission: &'a Result<Admitted, ImageRefusal>,
    /// The DaemonSet as the index holds it.
    pub daemonset: Option<&'a DaemonSet>,
    /// Every pod of the Scheduler, terminating ones included.
    pub pods: &'a [Arc<SchedulerPod>],
    pub nodes: &'a Nodes,
    /// The kernel reports of its nodes (those it owns, and those its pods run on).
    pub reports: &'a HashMap<String, NodeReport>,
    /// Its nodes' health samples, when `spec.rollout.analysis` asks for them (else empty).
    pub health: &'a BTreeMap<String, crate::analysis::NodeHealth>,
    pub memory: &'a Memory,
    pub settings: &'a Settings,
    /// Whether it may start a canary now (`--max-concurrent-canaries`).
    pub canary_gate: &'a crate::rollout::CanaryGate,
    pub clock: Clock,
}

/// An image the trust policy admitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// The image by digest.
    pub image: String,
    /// The admission key the DaemonSet carries ([`workload::ADMITTED_ANNOTATION`]).
    pub key: Option<String>,
}

/// Why the image may not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRefusal {
    pub message: String,
    /// It may go away by itself (a registry or trust root that could not be reached).
    pub transient: bool,
}

/// The Nodes a Scheduler's reconcile speaks of: those it owns, those that carry its owner label,
/// and those its pods are on or made for.
#[derive(Clone, Debug, Default)]
pub struct Nodes {
    /// Each such Node that exists (as last seen), by name.
    pub known: HashMap<String, NodeEntry>,
    /// The nodes that run a live pod of the Scheduler.
    pub scheduled: BTreeSet<String>,
    /// The nodes that carry its owner label, whether or not it still owns them.
    pub labelled: BTreeSet<String>,
}

/// One Node as the index last saw it.
#[derive(Clone, Debug, Default)]
pub struct NodeEntry {
    /// Its owner label (`None`: it has none).
    pub owner: Option<String>,
    /// Whether it is down, its taints, when it was created.
    pub facts: Option<Arc<NodeFacts>>,
    /// Its `metadata.resourceVersion` as the watch last showed it.
    pub version: Option<u64>,
}

impl Nodes {
    /// The owner label of `node`: `None` for an unknown Node, `Some(None)` for one without it.
    fn owner(&self, node: &str) -> Option<Option<&str>> {
        self.known.get(node).map(|e| e.owner.as_deref())
    }

    fn facts(&self, node: &str) -> Option<&NodeFacts> {
        self.known.get(node)?.facts.as_deref()
    }
}

/// What this leadership term remembers that a reconcile reads.
#[derive(Clone, Debug, Default)]
pub struct Memory {
    /// How long the term has lasted.
    pub term_age: Duration,
    /// How long ago this term wrote each node's owner label to this Scheduler, for nodes not seen
    /// attached since.
    pub labelled: HashMap<String, Duration>,
    /// The Node's resourceVersion that write made: until the watch shows one as new, it shows
    /// the node from before the write.
    pub label_versions: HashMap<String, u64>,
    /// The DaemonSet this term last applied for the Scheduler.
    pub applied: Option<Applied>,
    /// The ejections (`kernel_summary::ejection_key`) whose KernelEjected event this term
    /// recorded or found recorded.
    pub exits_recorded: HashSet<String>,
    /// The ejections the Scheduler's KernelEjected events show recorded (by any leader): read
    /// when a report carries an ejection from before this term.
    pub ejections_on_record: HashSet<String>,
    /// The pod conditions this term wrote that the pod watch has not shown yet, by pod uid.
    pub conditions_sent: HashMap<String, SentCondition>,
    /// The pods this term deleted for a new revision, by node, and how long ago: until the pod
    /// watch shows their successors, the nodes are switching whatever the watch shows yet (a
    /// reconcile that reads a view older than its own last write takes no other node instead).
    pub replaced: HashMap<String, (String, Duration)>,
}

/// A DaemonSet as this controller last applied it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// Digest of the object sent ([`workload::applied_digest`]).
    pub hash: String,
    /// The `metadata.generation` the API server gave it.
    pub generation: i64,
}

/// A pod condition written, and what the pod carried then.
pub type SentCondition = (KernelCondition, Option<KernelCondition>);

/// The controller's settings the decisions read.
#[derive(Clone, Debug)]
pub struct Settings {
    pub workload: WorkloadSettings,
    /// `--report-stale-after`: a report older than this tells nothing.
    pub stale_after: Duration,
    /// `--agent-heartbeat-interval`.
    pub heartbeat: Duration,
}

/// The moment of the snapshot.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// Monotonic, for report ages.
    pub now: Instant,
    /// Wall time, for pod ages and the times written.
    pub wall: jiff::Timestamp,
    /// How long ago an agent was last heard from for the first time (new reports still coming).
    pub since_arrival: Option<Duration>,
}

/// The DaemonSet as this reconcile's write left it.
#[derive(Clone, Debug, Default)]
pub struct Deployed {
    pub daemonset: Option<DaemonSet>,
    /// Why the API server refused the DaemonSet built from the spec, if it did.
    pub spec_error: Option<String>,
    /// Look again after this long (owner labels still on their way).
    pub requeue: Option<Duration>,
    /// The generation this term last applied (the index may lag behind its own write).
    pub applied_generation: i64,
}

/// What one reconcile does, in order: the status (it carries the rollout's state, so a new
/// leader carries on from it) and its events, then the rollout's actions and their events,
/// then the pods' conditions.
#[derive(Clone, Debug)]
pub struct Plan {
    pub status: status::NewStatus,
    pub rollout: Option<RolloutActions>,
    pub pod_conditions: Vec<PodConditionWrite>,
    pub remember: Remember,
    /// When to look again if nothing changes (`None`: only an event wakes it).
    pub recheck: Option<Duration>,
}

/// What the term remembers once the plan is carried out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Remember {
    /// Nodes now seen attached: when they were labelled tells nothing any more.
    pub attached: Vec<String>,
    /// Ejections whose events are out with the status (or were found out already).
    pub exits_recorded: Vec<KernelExit>,
}

impl Plan {
    /// Every event the plan records, in order.
    pub fn events(&self) -> impl Iterator<Item = &EventSpec> {
        let outcome = &self.status;
        let rollout = self.rollout.iter().flat_map(RolloutActions::events);
        outcome
            .event
            .iter()
            .chain(&outcome.kernel_event)
            .chain(&outcome.contract_event)
            .chain(&outcome.exit_events)
            .chain(rollout)
    }
}

/// The revision the spec asks for (with the admitted image), and its failure if it already
/// failed: then it is not tried again until the spec (or sked's agent image) changes. While the
/// image is not admitted, the failure of this generation stands too. A failure recorded under
/// the name an earlier sked gave the same revision (before agent images were part of revisions)
/// is this revision's, under its name now: upgrading sked retries no failed revision.
pub fn wanted_revision(s: &Snapshot<'_>) -> (Option<(String, String)>, Option<RolloutFailure>) {
    let agent = &s.settings.workload.agent.image;
    let admitted = s.admission.as_ref().ok();
    let wanted = admitted.map(|a| (workload::revision(s.scheduler, &a.image, agent), a.image.clone()));
    let earlier = admitted.map(|a| workload::revision_before_agents(s.scheduler, &a.image));
    let failed = previous_rollout(s)
        .failed
        .clone()
        .map(|mut f| {
            if let (Some((name, _)), Some(earlier)) = (&wanted, &earlier)
                && f.revision == *earlier
            {
                f.revision = name.clone();
            }
            f
        })
        .filter(|f| {
            s.scheduler.metadata.generation == Some(f.generation)
                && wanted.as_ref().is_none_or(|(revision, _)| *revision == f.revision)
        });
    (wanted, failed)
}

fn previous_rollout<'a>(s: &Snapshot<'a>) -> std::borrow::Cow<'a, RolloutStatus> {
    match &s.previous.rollout {
        Some(r) => std::borrow::Cow::Borrowed(r),
        None => std::borrow::Cow::Owned(RolloutStatus::default()),
    }
}

/// The plan for the Scheduler of `s`, with the DaemonSet as this reconcile's write left it.
pub fn decide(s: &Snapshot<'_>, deployed: &Deployed) -> Plan {
    let (wanted, failed) = wanted_revision(s);
    let intent = rollout_step::Intent { wanted: wanted.as_ref(), failed: failed.as_ref() };
    let (step, attached) = match &deployed.daemonset {
        Some(ds) => {
            let (step, attached) = rollout_step::decide(s, ds, deployed.applied_generation, &intent);
            (Some(step), attached)
        }
        None => (None, Vec::new()),
    };
    let count = kernel::Count::covered(step.as_ref(), deployed.daemonset.as_ref());
    let kernel = kernel::view(s, &count);
    let outcome = status_of(s, deployed, &kernel.summary, step.as_ref());
    let grace_over = kernel.grace_left.is_zero();
    let (pod_conditions, pods_recheck) = writes::pod_conditions(s, grace_over);
    let grace_recheck = (!kernel.summary.settled).then_some(kernel.grace_left + Duration::from_millis(100));
    let rollout_recheck = step.as_ref().and_then(|s| s.recheck_in);
    let recheck = [grace_recheck, deployed.requeue, rollout_recheck, pods_recheck].into_iter().flatten().min();
    Plan {
        status: outcome,
        rollout: step,
        pod_conditions,
        remember: Remember { attached, exits_recorded: kernel.heard_ejections },
        recheck,
    }
}

/// The Scheduler's status from what this reconcile saw ([`status::compute`]).
fn status_of(
    s: &Snapshot<'_>,
    deployed: &Deployed,
    kernel: &crate::kernel_summary::KernelSummary,
    step: Option<&RolloutActions>,
) -> status::NewStatus {
    let daemonset = deployed.daemonset.as_ref();
    let desired = daemonset.and_then(|d| d.status.as_ref()).map_or(0, |s| s.desired_number_scheduled);
    let rollout = step.map(|s| s.status.clone()).or(s.previous.rollout.clone());
    // Only when no pod can go anywhere does the status name what keeps them away.
    let untolerated = (desired == 0 && !s.placement.owned.is_empty()).then(|| untolerated_taints(s)).flatten();
    let refusal = s.admission.as_ref().err();
    status::compute(&status::Inputs {
        generation: s.scheduler.metadata.generation,
        previous: s.previous,
        daemonset,
        placement: s.placement,
        image: step.map(|s| s.image.as_str()),
        spec_error: deployed.spec_error.as_deref(),
        image_error: refusal.map(|r| r.message.as_str()),
        image_error_transient: refusal.is_some_and(|r| r.transient),
        kernel,
        rollout: rollout.as_ref(),
        desired: step.map(|s| s.desired),
        untolerated: untolerated.as_deref(),
        canary_gate: s.canary_gate,
        now: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(s.clock.wall),
    })
}

/// What keeps the Scheduler's pods off its tainted nodes, for its status: the taints by node,
/// a few of each; `None` when no owned node has a taint it does not tolerate.
fn untolerated_taints(s: &Snapshot<'_>) -> Option<String> {
    let mut by_taint: std::collections::BTreeMap<String, Vec<&str>> = std::collections::BTreeMap::new();
    for node in &s.placement.owned {
        let Some(facts) = s.nodes.facts(node) else { continue };
        if let Some(taint) = facts.untolerated(&s.scheduler.spec.tolerations) {
            by_taint.entry(crate::nodes::describe_taint(taint)).or_default().push(node);
        }
    }
    let count: usize = by_taint.values().map(Vec::len).sum();
    if count == 0 {
        return None;
    }
    let listed: Vec<String> = by_taint
        .iter()
        .take(3)
        .map(|(taint, nodes)| {
            let more = nodes.len().saturating_sub(3);
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            format!("{taint} on {}{more}", nodes.iter().take(3).copied().collect::<Vec<_>>().join(", "))
        })
        .collect();
    Some(format!(
        "{count} selected node(s) have a taint the Scheduler does not tolerate, so no pod of it can run there: {}; add a matching toleration to spec.tolerations",
        listed.join("; ")
    ))
}

/// The Scheduler's name, as every decision names it.
fn name_of(s: &Snapshot<'_>) -> String {
    s.scheduler.name_any()
}
