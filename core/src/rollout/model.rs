//! What a rollout reads and decides: its pacing, the views of its nodes and pods, its input,
//! and the decision. The ground floor of `rollout`: the decision (`mod.rs`), the bake
//! (`bake.rs`) and the status it folds into (`advance.rs`) read these types.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sked_api::{AnalysisStatus, RolloutPhase, RolloutSpec, WaveBaseline};

use crate::analysis;

/// Defaults of `spec.rollout`.
pub const DEFAULT_CANARY: i32 = 1;
/// `maxUnavailable` when the spec sets none: a quarter of the nodes in the rollout (at least
/// one). A node between two schedulers runs its work on the kernel's default scheduler for the
/// seconds its switch takes, so this caps the risk a wave takes, not an outage; waves grow to it
/// only after the canary and every smaller wave baked clean.
pub const DEFAULT_MAX_UNAVAILABLE_PERCENT: usize = 25;
pub const DEFAULT_BAKE_SECONDS: i32 = 30;
pub const DEFAULT_ATTACH_TIMEOUT_SECONDS: i32 = 120;
/// Restarts of the scheduler container after which a new revision counts as crash-looping.
pub const CRASH_LOOP_RESTARTS: i32 = 3;

/// Why a node is left out of a rollout: nothing its pod could do there says anything of the
/// revision. Counted by name in `status.rollout.skippedReasons`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Skip {
    /// Its kernel has no sched_ext.
    KernelUnsupported,
    /// Another scheduler, started outside sked, owns its kernel.
    ForeignScheduler,
    /// The Node is not Ready, or is unreachable.
    NodeNotReady,
    /// It has a taint the Scheduler does not tolerate: no pod of it can go there.
    TaintNotTolerated,
    /// kube-scheduler did not bind its pod to it within the attach timeout (no room for the
    /// pod's requests, the node's pod limit, an affinity it does not meet).
    PodNotScheduled,
    /// Its pod was bound, and no kubelet took it up within the attach timeout.
    PodNotStarted,
    /// Its kubelet cannot pull the image, which other nodes pulled.
    ImagePullFailing,
}

impl Skip {
    /// The node's kernel is why (no sched_ext, or another scheduler runs there): the kernel's
    /// truth, which KernelAttached tells. Every other reason is the node's own trouble (down,
    /// full, tainted, its kubelet or its registry access), where no pod of any revision runs.
    pub const fn is_the_kernels(self) -> bool {
        matches!(self, Skip::KernelUnsupported | Skip::ForeignScheduler)
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Skip::KernelUnsupported => "KernelUnsupported",
            Skip::ForeignScheduler => "ForeignScheduler",
            Skip::NodeNotReady => "NodeNotReady",
            Skip::TaintNotTolerated => "TaintNotTolerated",
            Skip::PodNotScheduled => "PodNotScheduled",
            Skip::PodNotStarted => "PodNotStarted",
            Skip::ImagePullFailing => "ImagePullFailing",
        }
    }
}

/// `spec.rollout` with its defaults applied, for a Scheduler with `nodes` nodes in the rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pacing {
    pub canary: usize,
    pub max_unavailable: usize,
    pub bake_seconds: i64,
    pub attach_timeout_seconds: i64,
    pub paused: bool,
}

impl Pacing {
    pub fn of(spec: Option<&RolloutSpec>, nodes: usize) -> Self {
        let spec = spec.cloned().unwrap_or_default();
        let count = |v: i32| usize::try_from(v).unwrap_or(0);
        let max_unavailable = match spec.max_unavailable {
            None => nodes * DEFAULT_MAX_UNAVAILABLE_PERCENT / 100,
            Some(IntOrString::Int(n)) => count(n),
            Some(IntOrString::String(p)) => {
                let percent: usize = p.trim_end_matches('%').parse().unwrap_or(0);
                nodes * percent / 100
            }
        }
        .max(1);
        Self {
            canary: count(spec.canary.unwrap_or(DEFAULT_CANARY)),
            max_unavailable,
            bake_seconds: i64::from(spec.bake_seconds.unwrap_or(DEFAULT_BAKE_SECONDS).max(0)),
            attach_timeout_seconds: i64::from(
                spec.attach_timeout_seconds.unwrap_or(DEFAULT_ATTACH_TIMEOUT_SECONDS).max(1),
            ),
            paused: spec.paused,
        }
    }
}

/// The scheduler pod on one node, as the rollout sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    pub name: String,
    /// The revision it runs.
    pub revision: String,
    /// Since when (seconds since the epoch) the pod's Ready condition is True; `None` while not
    /// Ready. The kubelet marks a scheduler pod Ready only when its agent's /readyz says the
    /// pod's own scheduler is attached.
    pub ready_since: Option<i64>,
    /// `creationTimestamp`, seconds since the epoch.
    pub created: i64,
    /// The scheduler container restarted [`CRASH_LOOP_RESTARTS`] times or more, or waits in
    /// CrashLoopBackOff.
    pub crash_looping: bool,
    /// kube-scheduler bound it to the node. A pod never bound says nothing of its revision: the
    /// node has no room for it (or no kubelet that ever reported).
    pub bound: bool,
    /// A kubelet took the pod up (it is past Pending, or reports a container). A pod no kubelet
    /// took up says nothing of its revision: its node is down or unreachable.
    pub started: bool,
    /// The kubelet cannot pull the scheduler container's image: its waiting reason and message.
    pub pull_error: Option<String>,
    /// How the scheduler container last ended (exit code, last log lines), if it did.
    pub last_exit: Option<String>,
    /// Being deleted since then (seconds since the epoch).
    pub terminating_since: Option<i64>,
}

/// What this pod's agent last reported of the node's kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelView {
    /// No fresh report from this pod's agent (the reports server may be off): the pod's Ready
    /// condition, which the same agent's /readyz drives, tells attachment instead.
    Unknown,
    /// The pod's scheduler is attached, since `since` (seconds since the epoch).
    Attached {
        since: i64,
    },
    NotAttached,
    /// It was attached, then the kernel stopped running it (while the same pod runs).
    Ejected,
    /// It was attached, and the kernel asked it to restart at `since` (seconds since the epoch;
    /// a CPU went on or off line): down until it attaches again, a failure only once the attach
    /// timeout has passed since.
    Restarting {
        since: i64,
    },
    /// The node's kernel has no sched_ext.
    Unsupported,
    /// Another scheduler owns the node's kernel.
    Foreign,
}

/// One node the Scheduler owns that carries its owner label (the DaemonSet runs a pod there).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    pub node: String,
    /// Its live or terminating scheduler pod; `None` until the DaemonSet controller creates one.
    pub pod: Option<PodView>,
    pub kernel: KernelView,
    /// The node's last exit, when its agent read it from the kernel log.
    pub exit: Option<sked_api::KernelExit>,
    /// The scheduler's last statistics (scx_stats), when its agent sent them after the kernel
    /// ended it.
    pub scheduler_stats: Option<String>,
    /// Its owner label was written moments ago (less than the attach timeout) and its pod is
    /// not there yet: the DaemonSet controller is about to make it.
    pub just_labelled: bool,
    /// This term deleted its pod for the target revision moments ago (less than the attach
    /// timeout) and the new pod is not there yet (`pod` is `None` then, whatever the watch
    /// still lists): the node is switching, counted as unavailable, and no wave takes another
    /// node in its place.
    pub just_replaced: bool,
    /// No pod of the Scheduler can run there now ([`Skip::NodeNotReady`] or
    /// [`Skip::TaintNotTolerated`]).
    pub unfit: Option<Skip>,
    /// When (seconds since the epoch) this leader wrote its owner label: a pod made since then
    /// is the node's first switch away from revision zero, judged like a new revision's.
    pub entered_at: Option<i64>,
}

/// A node the Scheduler owns that does not carry its owner label yet: it still runs revision
/// zero, the kernel's default scheduler (or, until this Scheduler takes it, another one's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entering {
    pub node: String,
    /// It joined the cluster after the Scheduler was created and no other Scheduler runs there:
    /// nothing runs on it yet that a switch could put at risk, so it enters at once (once the
    /// Scheduler has a revision that ran everywhere).
    pub joined: bool,
    /// It runs this Scheduler's pod already (a DaemonSet from a sked without owner labels):
    /// labelling it switches nothing.
    pub runs_it: bool,
    /// No pod of the Scheduler can run there now: [`Skip::NodeNotReady`] (skipped, it takes
    /// no place in a wave and enters like any other node once it is Ready) or
    /// [`Skip::TaintNotTolerated`] (labelled at once, which switches nothing: no pod goes there
    /// until the taint goes or a toleration comes).
    pub unfit: Option<Skip>,
}

/// Whether this Scheduler may start a canary now: across Schedulers, at most
/// `--max-concurrent-canaries` run one at a time, so an upgrade of sked (a new agent image is a
/// new revision of every Scheduler) never switches every pool's first nodes at once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum CanaryGate {
    #[default]
    Open,
    /// `max` other Schedulers run their canary now. Who they are is not part of it: a queued
    /// Scheduler's status says nothing that changes with another object (else every hand-off
    /// of the slot would rewrite every queued Scheduler's status, each write a token of the
    /// rate limit).
    Full { max: usize },
}

/// What a decision does with the canary slot the [`CanaryGate`] guards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CanaryClaim {
    /// It runs no canary (none is due, it is over, or it waits in [`RolloutPhase::Queued`]).
    #[default]
    None,
    /// It starts its canary now: it switches its first nodes to the target revision (or, once
    /// carried out, writes phase Canary and switches them when the DaemonSet controller has
    /// seen the new template).
    Starts,
    /// Its canary is under way (nodes switched, not yet attached and baked).
    Runs,
}

/// Everything a rollout decision depends on.
#[derive(Clone, Debug)]
pub struct Input<'a> {
    /// The revision the DaemonSet's template makes (what a replaced pod comes back as).
    pub target: &'a str,
    /// The last revision that completed a rollout, if any.
    pub stable: Option<&'a str>,
    /// The owned nodes that carry the owner label.
    pub nodes: &'a [NodeView],
    /// The owned nodes that do not yet.
    pub entering: &'a [Entering],
    /// Nodes held out (`status.heldNodes` while the failure they were held under stands): sent
    /// back to revision zero when taking them over failed, they count as entering but enter no
    /// wave until the spec changes.
    pub held: &'a [String],
    /// How many nodes the DaemonSet controller means to run a pod on (its
    /// `desiredNumberScheduled`): an owned node may get none (a taint the Scheduler does not
    /// tolerate), and such a node is not waited for.
    pub expected_pods: usize,
    /// The target revision is being tried again after it failed at this time (seconds since
    /// the epoch): a pod of it made before then that does not run attached is the failed
    /// attempt's, which says nothing of this one. It is replaced in its wave like a pod of
    /// another revision, never judged. (One that runs attached is kept.)
    pub retried_after: Option<i64>,
    pub pacing: Pacing,
    /// `spec.rollout.analysis`, with the nodes' health samples: each bake is judged by it.
    pub analysis: Option<Analysis<'a>>,
    /// Whether a canary may start now.
    pub canary_gate: &'a CanaryGate,
    /// Seconds since the epoch.
    pub now: i64,
}

/// What the analysis of a bake reads.
#[derive(Clone, Copy, Debug)]
pub struct Analysis<'a> {
    pub limits: &'a analysis::Limits,
    /// Each node's health samples and counter names.
    pub health: &'a std::collections::BTreeMap<String, analysis::NodeHealth>,
    /// The target revision's last verdict that did not fail it: a bake that ended before its
    /// time is judged already, and not again (a rollout held after its bake, by its budget,
    /// would otherwise write a new verdict at every reconcile); only nodes switched after it are
    /// of the next wave.
    pub last: Option<&'a AnalysisStatus>,
    /// The window before the switch of the wave in flight, frozen when its pods were replaced
    /// (the target revision's, and not judged yet).
    pub baseline: Option<&'a WaveBaseline>,
    /// The Scheduler's generation: a verdict that holds the rollout holds it under the
    /// generation it was reached in.
    pub generation: i64,
}

impl Analysis<'_> {
    /// When the last verdict was reached (seconds since the epoch).
    pub(super) fn judged_at(&self) -> Option<i64> {
        self.last.map(|a| a.time.0.as_second())
    }
}

/// Why the target revision failed on a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub node: String,
    pub cause: String,
    /// The analysis of a bake failed it (the revision attached).
    pub by_analysis: bool,
    /// What the kernel and the scheduler said last on that node.
    pub evidence: Option<sked_api::FailureEvidence>,
}

/// What the rollout decides at one moment: the nodes to switch now, and the counts it read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    pub phase: RolloutPhase,
    /// Pods to delete now (each comes back as the target revision).
    pub replace: Vec<String>,
    /// Entering nodes to label now (each gets the target revision's pod).
    pub admit: Vec<String>,
    /// Entering nodes left after `admit`.
    pub entering: usize,
    /// The nodes that carry the owner label (what a failed first revision reached).
    pub labelled: Vec<String>,
    /// The target revision failed (only while it is not the stable one).
    pub failure: Option<Failure>,
    /// Nodes that run the target revision.
    pub updated: usize,
    /// Of those, the ones Ready with the scheduler attached.
    pub attached: usize,
    /// The nodes the rollout covers: every node the Scheduler owns, labelled or entering, less
    /// those skipped for their own trouble ([`Decision::off_kernel_count`]; a node whose kernel
    /// runs another scheduler still counts, not attached). What DESIRED shows: it does not dip
    /// while a node's label and its pod are on their way.
    pub desired: usize,
    /// Nodes left out (see [`Skip`]), sorted, and how many for each reason.
    pub skipped: Vec<String>,
    pub skipped_for: std::collections::BTreeMap<Skip, usize>,
    /// The skipped nodes whose trouble is the node's (not its kernel's, see
    /// [`Skip::is_the_kernels`]): KernelAttached does not count them, as it counts no node a
    /// pod cannot run on.
    pub off_kernel_count: Vec<String>,
    /// Nodes that entered from revision zero under the stable revision (a takeover, or nodes
    /// relabelled into the pool) where it failed: they go back to revision zero.
    pub broken: Vec<String>,
    /// Decide again after this many seconds (end of a bake, an attach deadline).
    pub recheck_in: Option<i64>,
    /// The verdict of the analysis of the bake that ended, when one was judged now.
    pub analysis: Option<analysis::Judgement>,
    /// The rollout waits on that verdict (Inconclusive, and the spec says Pause).
    pub analysis_holds: bool,
    /// The window before the switch of the wave replaced now, frozen (with analysis).
    pub baseline: Option<WaveBaseline>,
    /// What it does with the canary slot.
    pub canary: CanaryClaim,
}

impl Decision {
    /// Whether the target revision runs, attached and baked, on every node in the rollout.
    pub fn complete(&self) -> bool {
        self.phase == RolloutPhase::Complete
    }

    pub(super) fn skip(&mut self, node: &str, why: Skip) {
        if !why.is_the_kernels() {
            self.off_kernel_count.push(node.to_owned());
        }
        self.skipped.push(node.to_owned());
        *self.skipped_for.entry(why).or_default() += 1;
    }

    pub(super) fn recheck(&mut self, after: i64) {
        let after = after.max(1);
        self.recheck_in = Some(self.recheck_in.map_or(after, |r| r.min(after)));
    }
}

/// The labelled nodes, counted: what runs where, and what is down.
#[derive(Default)]
pub(super) struct Tally {
    /// Pods of another revision whose node is down anyway, and those that run attached.
    pub(super) old_down: Vec<String>,
    pub(super) old_up: Vec<String>,
    /// Nodes without an attached scheduler right now.
    pub(super) unavailable: usize,
    /// Every node of the target revision runs it attached.
    pub(super) all_attached: bool,
    /// When the newest of them attached.
    pub(super) newest_attach: Option<i64>,
    /// Skipped nodes that have a pod (the DaemonSet controller counts them).
    pub(super) skipped_pods: usize,
    /// The nodes that run the target revision attached, with when their pod was made and when
    /// it attached: what an analysis judges; and the nodes that run another revision attached,
    /// with when: with the target's nodes of earlier waves, its control nodes (both only when
    /// the spec asks for analysis).
    pub(super) wave: Vec<(String, i64, i64)>,
    pub(super) controls: Vec<(String, i64)>,
    /// The node of each pod of another revision (with analysis): whose window to freeze when
    /// it is replaced.
    pub(super) pod_nodes: Vec<(String, String)>,
    /// Nodes of the target revision that went NotReady within two bakes of their switch (with
    /// analysis), with when their pod was made.
    pub(super) fallen: Vec<(String, i64)>,
}
