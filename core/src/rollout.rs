//! Rollouts, decided: which of a Scheduler's pods to replace now, and whether the revision being
//! rolled out failed. Pure; the reconcile gathers the inputs and carries out the plan.
//!
//! sched_ext cannot swap a running BPF scheduler in place: replacing a pod leaves its node on the
//! kernel's default scheduler until the new one attaches. So the DaemonSet's update strategy is
//! `OnDelete` and pods are replaced here, by deleting them (the DaemonSet controller then creates
//! the new revision's pod on that node):
//! - first a canary (`spec.rollout.canary` nodes, default 1), then waves of at most
//!   `maxUnavailable` nodes;
//! - a wave starts only when every node that runs the new revision is Ready, its agent reports
//!   the scheduler attached, and the newest of them has stayed so for `bakeSeconds`;
//! - a replaced node that does not attach within `attachTimeoutSeconds`, whose scheduler
//!   container crash-loops, or whose scheduler the kernel ejects, fails the revision (the
//!   reconcile rolls it back);
//! - nodes whose kernel cannot run sched_ext, or that run another scheduler, are skipped: a new
//!   pod would not attach there either; so are nodes no pod can run on now (not Ready, or a taint
//!   the Scheduler does not tolerate), nodes whose pod no kubelet took up, and nodes whose
//!   kubelet alone cannot pull an image other nodes pulled ([`Skip`]);
//! - under the stable revision, a node's first switch away from revision zero (a takeover) is
//!   judged the same way: where it fails, the node goes back to revision zero.
//!
//! The kernel's default scheduler is revision zero. A node enters a Scheduler when its owner
//! label is set, and the rollout sets it like it replaces a pod: canary first, then in waves
//! (a first deployment and a takeover are switches too). A node that joined the cluster on its
//! own enters at once once the Scheduler has a revision that ran everywhere. A first revision
//! that fails goes back to revision zero: its nodes lose the label.
//!
//! The plan depends only on the pods, the node labels and the kernel reports (state kept in
//! the API), so a new leader carries on where the last one stopped; only pods of another
//! revision are ever replaced, so no node is replaced twice for one revision. (One thing is
//! remembered: a label this leader wrote whose pod is not there yet counts as switching; early
//! in a term every labelled node without a pod does.)

use std::ops::ControlFlow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use sked_api::{
    AnalysisStatus, AnalysisVerdict, Reason, Revision, RolloutFailure, RolloutPhase, RolloutSpec, RolloutStatus,
    WaveBaseline,
};

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
    /// The kernel's words for the node's last exit, when its agent read them from the kernel log.
    pub exit: Option<String>,
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
    fn judged_at(&self) -> Option<i64> {
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
}

impl Decision {
    /// Whether the target revision runs, attached and baked, on every node in the rollout.
    pub fn complete(&self) -> bool {
        self.phase == RolloutPhase::Complete
    }

    fn skip(&mut self, node: &str, why: Skip) {
        if !why.is_the_kernels() {
            self.off_kernel_count.push(node.to_owned());
        }
        self.skipped.push(node.to_owned());
        *self.skipped_for.entry(why).or_default() += 1;
    }

    fn recheck(&mut self, after: i64) {
        let after = after.max(1);
        self.recheck_in = Some(self.recheck_in.map_or(after, |r| r.min(after)));
    }
}

/// The labelled nodes, counted: what runs where, and what is down.
#[derive(Default)]
struct Tally {
    /// Pods of another revision whose node is down anyway, and those that run attached.
    old_down: Vec<String>,
    old_up: Vec<String>,
    /// Nodes without an attached scheduler right now.
    unavailable: usize,
    /// Every node of the target revision runs it attached.
    all_attached: bool,
    /// When the newest of them attached.
    newest_attach: Option<i64>,
    /// Skipped nodes that have a pod (the DaemonSet controller counts them).
    skipped_pods: usize,
    /// The nodes that run the target revision attached, with when their pod was made and when
    /// it attached: what an analysis judges; and the nodes that run another revision attached,
    /// with when: with the target's nodes of earlier waves, its control nodes (both only when
    /// the spec asks for analysis).
    wave: Vec<(String, i64, i64)>,
    controls: Vec<(String, i64)>,
    /// The node of each pod of another revision (with analysis): whose window to freeze when
    /// it is replaced.
    pod_nodes: Vec<(String, String)>,
    /// Nodes of the target revision that went NotReady within two bakes of their switch (with
    /// analysis), with when their pod was made.
    fallen: Vec<(String, i64)>,
}

/// Decides the next step of a rollout.
///
/// The kernel's default scheduler is revision zero: an entering node is switched like a pod of
/// another revision that runs attached, so a first deployment and a takeover go canary first
/// and then in waves, within `maxUnavailable`.
pub fn decide(input: &Input<'_>) -> Decision {
    let mut plan = decide_step(input);
    plan.skipped.sort();
    plan.off_kernel_count.sort();
    plan.desired = (input.nodes.len() + input.entering.len()).saturating_sub(plan.off_kernel_count.len());
    plan
}

fn decide_step(input: &Input<'_>) -> Decision {
    let restoring = input.stable == Some(input.target);
    let mut plan = Decision { labelled: input.nodes.iter().map(|n| n.node.clone()).collect(), ..Decision::default() };
    let mut tally = tally(input, restoring, &mut plan);
    // A node that joined the cluster on its own is not held back for a wave, once there is a
    // revision that ran everywhere (a first revision goes canary first, everywhere).
    // A held node takes no place in a wave, or the nodes behind it would never enter; nor does
    // a node that is not Ready: it is skipped, and enters like any other once it can (it may
    // run work worth a wave when it comes back). A node with a taint the Scheduler does not
    // tolerate is labelled at once: no pod of it can go there, so that switches nothing.
    let held = |e: &&Entering| input.held.contains(&e.node);
    let unfit = |e: &&Entering| !held(e) && !e.runs_it && e.unfit == Some(Skip::NodeNotReady);
    let tainted = |e: &&Entering| e.unfit == Some(Skip::TaintNotTolerated);
    let at_once =
        |e: &&Entering| !held(e) && !unfit(e) && (e.runs_it || tainted(e) || (e.joined && input.stable.is_some()));
    for e in input.entering.iter().filter(unfit) {
        plan.skip(&e.node, Skip::NodeNotReady);
    }
    plan.admit = input.entering.iter().filter(at_once).map(|e| e.node.clone()).collect();
    let mut waiting: Vec<String> =
        input.entering.iter().filter(|e| !at_once(e) && !held(e) && !unfit(e)).map(|e| e.node.clone()).collect();
    waiting.sort();
    plan.entering = waiting.len() + input.entering.iter().filter(held).count();
    if plan.failure.is_some() {
        plan.recheck_in = None;
        plan.phase = RolloutPhase::RolledBack;
        return plan;
    }
    if restoring {
        // The stable revision again (after a rollback, or a spec set back): every pod of another
        // revision goes at once; none of them is what should run. Nodes to take over still
        // enter in waves, once those pods are back.
        plan.replace =
            std::mem::take(&mut tally.old_down).into_iter().chain(std::mem::take(&mut tally.old_up)).collect();
        if waiting.is_empty() || !plan.replace.is_empty() {
            plan.phase = if waiting.is_empty() { RolloutPhase::Complete } else { RolloutPhase::Rolling };
            return plan;
        }
    }
    next_wave(input, tally, waiting, plan)
}

/// Counts the labelled nodes: what each runs, which are down, and whether a pod of the target
/// revision failed (into `plan`: updated, attached, skipped, failure, recheck).
fn tally(input: &Input<'_>, restoring: bool, plan: &mut Decision) -> Tally {
    let Input { target, nodes, pacing, now, .. } = *input;
    let mut t = Tally { all_attached: true, ..Tally::default() };
    let being_replaced = |p: &PodView| p.terminating_since.is_some_and(|t| now - t < pacing.attach_timeout_seconds);
    let mut awaited_without_pod = awaited_without_pod(input, being_replaced);
    // Evidence that the target revision's image can be pulled: a node runs it attached.
    let pulled_somewhere = nodes.iter().any(|n| {
        matches!(n.kernel, KernelView::Attached { .. })
            && n.pod.as_ref().is_some_and(|p| p.revision == target && p.terminating_since.is_none())
    });
    for n in nodes {
        if !restoring && t.fell(input, n, plan) {
            continue;
        }
        if let Some(why) = skip_reason(n) {
            plan.skip(&n.node, why);
            t.skipped_pods += usize::from(n.pod.is_some());
            continue;
        }
        let Some(pod) = n.pod.as_ref().filter(|p| p.terminating_since.is_none()) else {
            if n.just_labelled {
                // Not waited for past the attach timeout (a taint may keep its pod away).
                plan.recheck(pacing.attach_timeout_seconds);
            }
            let replaced = n.pod.as_ref().is_some_and(being_replaced) || n.just_labelled || n.just_replaced;
            if replaced || awaited_without_pod > 0 {
                if !replaced {
                    awaited_without_pod -= 1;
                }
                // Being replaced: the DaemonSet controller creates the target revision's pod.
                t.unavailable += 1;
                t.all_attached = false;
            }
            continue;
        };
        let attached = attached_since(n, pod);
        // A pod the failed attempt made that does not run attached is made again, not judged.
        let earlier_attempt = attached.is_none() && input.retried_after.is_some_and(|t| pod.created < t);
        if pod.revision != target || earlier_attempt {
            t.other_revision(input, n, pod, attached);
            continue;
        }
        let deadline = pod.created + pacing.attach_timeout_seconds;
        if attached.is_none() && !pod.started && now >= deadline {
            // Not bound (no room on the node), or no kubelet took the pod up (the node is down
            // or unreachable): the node's trouble, which says nothing of the revision. Left
            // out, like a node that cannot run sched_ext.
            plan.skip(&n.node, if pod.bound { Skip::PodNotStarted } else { Skip::PodNotScheduled });
            t.skipped_pods += 1;
            continue;
        }
        if attached.is_none() && pod.pull_error.is_some() && pulled_somewhere {
            // Other nodes pulled the same image: this node's registry access is at fault.
            plan.skip(&n.node, Skip::ImagePullFailing);
            t.skipped_pods += 1;
            continue;
        }
        plan.updated += 1;
        match attached {
            Some(since) => {
                plan.attached += 1;
                t.newest_attach = Some(t.newest_attach.map_or(since, |t| t.max(since)));
                if input.analysis.is_some() {
                    t.wave.push((n.node.clone(), pod.created, since));
                }
            }
            None => judge_unattached(input, restoring, n, pod, &mut t, plan),
        }
    }
    t.old_down.sort();
    t.old_up.sort();
    fallen_failure(input, &t, plan);
    t
}

impl Tally {
    /// Counts node `n`, whose pod runs another revision (or the failed attempt's), as up or
    /// down; with analysis, a control while attached, and whose window to freeze if replaced.
    fn other_revision(&mut self, input: &Input<'_>, n: &NodeView, pod: &PodView, attached: Option<i64>) {
        let analysed = input.analysis.is_some();
        if analysed {
            self.pod_nodes.push((pod.name.clone(), n.node.clone()));
        }
        match attached {
            Some(since) => {
                self.old_up.push(pod.name.clone());
                if analysed {
                    self.controls.push((n.node.clone(), since));
                }
            }
            None => {
                self.unavailable += 1;
                self.old_down.push(pod.name.clone());
            }
        }
    }

    /// Counts node `n` as fallen when it went NotReady after its switch ([`fell_after_switch`]):
    /// it runs the target revision, down, and holds the next wave.
    fn fell(&mut self, input: &Input<'_>, n: &NodeView, plan: &mut Decision) -> bool {
        let Some(pod) = n.pod.as_ref().filter(|_| fell_after_switch(input, n)) else { return false };
        self.fallen.push((n.node.clone(), pod.created));
        plan.updated += 1;
        self.unavailable += 1;
        self.all_attached = false;
        true
    }
}

/// How long after its switch a node of the wave that goes NotReady counts against the
/// revision (with analysis): its attach timeout and two bakes.
fn fall_window(pacing: Pacing) -> i64 {
    pacing.attach_timeout_seconds + 2 * pacing.bake_seconds
}

/// Whether node `n` runs a pod of the target revision made moments ago (within
/// [`fall_window`]) and is NotReady now, with analysis on: a scheduler that starves the kubelet
/// must not roll through a fleet as "the node's trouble". A node NotReady before its wave never
/// got the pod.
fn fell_after_switch(input: &Input<'_>, n: &NodeView) -> bool {
    let recent = |p: &PodView| input.now - p.created <= fall_window(input.pacing);
    input.analysis.is_some()
        && n.unfit == Some(Skip::NodeNotReady)
        && !matches!(n.kernel, KernelView::Unsupported | KernelView::Foreign)
        && n.pod.as_ref().is_some_and(|p| p.revision == input.target && p.terminating_since.is_none() && recent(p))
}

/// Nodes that went NotReady after their switch hold the next wave, and fail the revision when
/// the canary is one of them or two or more did; a lone one stops counting once its window
/// passes (it is skipped, as any node that is not Ready).
fn fallen_failure(input: &Input<'_>, t: &Tally, plan: &mut Decision) {
    let Some((node, created)) = t.fallen.first() else { return };
    let canary = plan.updated <= input.pacing.canary.max(1);
    if plan.failure.is_some() || (t.fallen.len() < 2 && !canary) {
        plan.recheck(created + fall_window(input.pacing) - input.now + 1);
        return;
    }
    let others = t.fallen.len() - 1;
    let cause = format!(
        "node {node} went NotReady {}s after its switch to revision {}{}: the scheduler may starve the kubelet; {} fail a revision",
        input.now - created,
        input.target,
        if others > 0 { format!(", and {others} more node(s) of its wave did too") } else { String::new() },
        if canary {
            "a canary that goes NotReady within two bakes of its switch does"
        } else {
            "two or more nodes of a wave that go NotReady within two bakes of their switch"
        }
    );
    plan.failure = Some(Failure { node: node.clone(), cause, by_analysis: true });
}

/// How many labelled nodes without a live pod are waited for. Only as far as the DaemonSet
/// controller means to run pods there: a pod terminating for less than the attach timeout is
/// being replaced; past that (its node is gone or unreachable), or with no pod at all, only as
/// many nodes as the DaemonSet still lacks pods for (and the nodes labelled moments ago, which
/// the caller counts on its own).
fn awaited_without_pod(input: &Input<'_>, being_replaced: impl Fn(&PodView) -> bool) -> usize {
    let nodes = input.nodes;
    let live = nodes.iter().filter(|n| n.pod.as_ref().is_some_and(|p| p.terminating_since.is_none())).count();
    let replacing = nodes.iter().filter(|n| n.pod.as_ref().is_some_and(&being_replaced)).count();
    input.expected_pods.saturating_sub(live + replacing)
}

/// Why a labelled node is left out of the rollout by what its agent reports or what the
/// Node says, if it is.
fn skip_reason(n: &NodeView) -> Option<Skip> {
    match n.kernel {
        KernelView::Unsupported => Some(Skip::KernelUnsupported),
        KernelView::Foreign => Some(Skip::ForeignScheduler),
        _ => n.unfit,
    }
}

/// Since when a node's pod runs attached and Ready (a node whose agent has not reported yet
/// is taken at its pod's readiness).
fn attached_since(n: &NodeView, pod: &PodView) -> Option<i64> {
    match (n.kernel, pod.ready_since) {
        (KernelView::Attached { since }, Some(ready)) => Some(since.max(ready)),
        (KernelView::Unknown, Some(ready)) => Some(ready),
        _ => None,
    }
}

/// A node whose pod runs the target revision, not attached: unavailable, and judged (a failure
/// or a recheck at its deadline). Under the stable revision, only a node's first switch away
/// from revision zero is judged (a takeover); a node that ran it before and is down now is not
/// the switch's doing, and not a reason to hold every other node back.
fn judge_unattached(
    input: &Input<'_>,
    restoring: bool,
    n: &NodeView,
    pod: &PodView,
    t: &mut Tally,
    plan: &mut Decision,
) {
    let Input { pacing, now, .. } = *input;
    let entered = n.entered_at.is_some_and(|at| pod.created >= at);
    if restoring && !entered && now >= pod.created + pacing.attach_timeout_seconds {
        return;
    }
    t.unavailable += 1;
    t.all_attached = false;
    if restoring && !entered {
        return;
    }
    if restoring {
        if let Some(failure) = failure_of(n, pod, pacing, now, plan) {
            plan.broken.push(n.node.clone());
            plan.failure.get_or_insert(failure);
        }
    } else if plan.failure.is_none() {
        plan.failure = failure_of(n, pod, pacing, now, plan);
    }
}

/// Whether the target revision failed on node `n`, whose pod runs it and is not attached: it
/// crash-loops, the kernel ejected it, or its attach deadline passed. Before the deadline, a
/// recheck at it.
fn failure_of(n: &NodeView, pod: &PodView, pacing: Pacing, now: i64, plan: &mut Decision) -> Option<Failure> {
    let deadline = pod.created + pacing.attach_timeout_seconds;
    let cause = if pod.crash_looping {
        match &pod.last_exit {
            Some(exit) => format!("the scheduler container is crash-looping; it last ended with {exit}"),
            None => "the scheduler container is crash-looping".to_owned(),
        }
    } else if n.kernel == KernelView::Ejected {
        match &n.exit {
            Some(why) => format!("the scheduler stopped running after it had attached: {why}"),
            None => "the kernel stopped running the scheduler after it had attached".to_owned(),
        }
    } else if let Some(why) = pod.pull_error.as_ref().filter(|_| now >= deadline) {
        format!(
            "the kubelet could not pull the scheduler's image within {}s (spec.rollout.attachTimeoutSeconds): {why}; check spec.sched and spec.imagePullSecrets",
            pacing.attach_timeout_seconds
        )
    } else if now >= deadline {
        attach_timeout_cause(n.kernel, &pod.name, pacing.attach_timeout_seconds)
    } else {
        plan.recheck(deadline - now);
        return None;
    };
    Some(Failure { node: n.node.clone(), cause, by_analysis: false })
}

/// The next wave: pods of another revision (those down first), then entering nodes, once every
/// node of the target revision runs it attached and the newest has baked; a canary first.
fn next_wave(input: &Input<'_>, tally: Tally, waiting: Vec<String>, mut plan: Decision) -> Decision {
    let Input { nodes, expected_pods, pacing, now, .. } = *input;
    let baked_in = tally.newest_attach.map_or(0, |t| t + pacing.bake_seconds - now);
    let (all_attached, skipped_pods) = (tally.all_attached, tally.skipped_pods);
    let in_rollout = (nodes.len() + input.entering.len()).saturating_sub(plan.skipped.len());
    let canary = pacing.canary.min(in_rollout);
    let phase_for =
        |updated: usize| if updated <= canary && canary > 0 { RolloutPhase::Canary } else { RolloutPhase::Rolling };
    if tally.old_down.is_empty() && tally.old_up.is_empty() && waiting.is_empty() {
        // The last wave bakes too, a first deployment's as well: a scheduler that ejects
        // during that bake is rolled back (to the kernel's default, when nothing ran before).
        // Every pod the DaemonSet controller means to run must be there, attached, and at least
        // one somewhere: the DaemonSet's count may not have caught up with the owner labels yet,
        // and a revision that never ran anywhere is not one to go back to.
        let everywhere =
            plan.attached >= expected_pods.saturating_sub(skipped_pods) && (plan.attached > 0 || in_rollout == 0);
        if all_attached && everywhere && plan.admit.is_empty() && baked_in <= 0 {
            let holding = phase_for(plan.updated);
            plan = match after_bake(input, &tally, baked_in, holding, plan) {
                ControlFlow::Continue(plan) => plan,
                ControlFlow::Break(stopped) => return stopped,
            };
            plan.phase = RolloutPhase::Complete;
        } else {
            // The canary's wave when it is the last one too (a fleet of one node): it bakes as
            // the canary.
            plan.phase = phase_for(plan.updated);
            // A timer only for the bake; pods, reports and the DaemonSet's count are events.
            if all_attached && baked_in > 0 {
                plan.recheck(baked_in);
            }
        }
        return plan;
    }
    if pacing.paused {
        plan.phase = RolloutPhase::Paused;
        return plan;
    }
    // `canary: 0` with a `maxUnavailable` that covers every node asks for no pacing at all.
    let unpaced = canary == 0 && pacing.max_unavailable >= in_rollout;
    if (!all_attached || baked_in > 0) && !unpaced {
        // The last wave has not attached and baked yet.
        plan.phase = phase_for(plan.updated);
        if all_attached {
            plan.recheck(baked_in);
        }
        return plan;
    }
    if !unpaced {
        let holding = phase_for(plan.updated);
        plan = match after_bake(input, &tally, baked_in, holding, plan) {
            ControlFlow::Continue(plan) => plan,
            ControlFlow::Break(stopped) => return stopped,
        };
    }
    let Tally { old_down, old_up, unavailable, .. } = &tally;
    let (old_down, old_up, unavailable) = (old_down.clone(), old_up.clone(), *unavailable);
    let wave = if unpaced {
        pacing.max_unavailable
    } else if plan.updated < canary {
        (canary - plan.updated).min(pacing.max_unavailable)
    } else {
        // Waves grow: each baked clean, so the next is as large as every node switched so far
        // plus the canary's size (1, 2, 4, 8... after a canary of one), up to maxUnavailable.
        grown_wave(plan.updated, canary, pacing.max_unavailable)
    };
    // Switching a node that runs attached (another revision, or revision zero) makes one more
    // node unavailable; keep within the budget.
    let budget = pacing.max_unavailable.saturating_sub(unavailable);
    let down = old_down.len().min(wave);
    let up = old_up.len().min(wave - down).min(budget);
    let zero = waiting.len().min(wave - down - up).min(budget - up);
    plan.replace = old_down.into_iter().take(down).chain(old_up.into_iter().take(up)).collect();
    plan.baseline = freeze_wave(input, &tally, &plan.replace, plan.analysis.is_some());
    plan.admit.extend(waiting.into_iter().take(zero));
    plan.entering -= zero;
    plan.phase = phase_for(plan.updated + plan.replace.len() + zero);
    plan
}

/// How often a bake's verdict asks again while it waits for samples.
const ANALYSIS_RECHECK_SECONDS: i64 = 5;

/// The bake that ended (`baked_in` seconds ago, negated), judged by the analysis the spec asks
/// for: `Continue` with its verdict to go on, `Break` with the plan that stops here: in phase
/// `holding` while the verdict waits for samples, Paused on a verdict that holds the rollout,
/// or rolled back. The stable revision is not judged.
fn after_bake(
    input: &Input<'_>,
    tally: &Tally,
    baked_in: i64,
    holding: RolloutPhase,
    mut plan: Decision,
) -> ControlFlow<Decision, Decision> {
    let Some(a) = input.analysis.filter(|_| input.stable != Some(input.target)) else {
        return ControlFlow::Continue(plan);
    };
    let bake_end = tally.newest_attach.map(|t| t + input.pacing.bake_seconds);
    if a.judged_at().zip(bake_end).is_some_and(|(judged, end)| judged >= end) {
        // Judged already: a verdict that holds the rollout holds it until the generation moves.
        let held = a.last.is_some_and(|last| last.holds && last.generation == Some(a.generation));
        if held {
            plan.phase = RolloutPhase::Paused;
            return ControlFlow::Break(plan);
        }
        return ControlFlow::Continue(plan);
    }
    match judge_bake(input, a, tally, -baked_in) {
        None => ControlFlow::Continue(plan),
        Some(analysis::Outcome::Waiting) => {
            // Its samples come with the agents' heartbeats.
            plan.phase = holding;
            plan.recheck(ANALYSIS_RECHECK_SECONDS);
            ControlFlow::Break(plan)
        }
        Some(analysis::Outcome::Judged(mut judgement)) => {
            if let Some((node, cause)) = judgement.failure.clone() {
                plan.failure = Some(Failure { node, cause, by_analysis: true });
                plan.phase = RolloutPhase::RolledBack;
                plan.analysis = Some(judgement);
                return ControlFlow::Break(plan);
            }
            let holds = judgement.verdict == AnalysisVerdict::Inconclusive && holds(input, a, judgement.doubt);
            if judgement.verdict == AnalysisVerdict::Inconclusive {
                judgement.message.push_str(if holds {
                    "; the rollout is paused until `kubectl sked rollout proceed` (or spec.rollout.analysis.onInconclusive: Proceed)"
                } else if judgement.doubt == Some(analysis::Doubt::NothingBefore) || input.stable.is_none() {
                    "; the rollout goes on (nothing ran there before to compare with)"
                } else {
                    "; the rollout goes on (spec.rollout.analysis.onInconclusive: Proceed)"
                });
            }
            plan.analysis = Some(judgement);
            if holds {
                plan.analysis_holds = true;
                plan.phase = RolloutPhase::Paused;
                return ControlFlow::Break(plan);
            }
            ControlFlow::Continue(plan)
        }
    }
}

/// Whether an Inconclusive verdict holds the rollout: always for a spec error (a counter the
/// kernel does not count); for missing data unless the spec says Proceed or the revision is a
/// first deployment (nothing ran before it); never when no node had a window before its switch.
fn holds(input: &Input<'_>, a: Analysis<'_>, doubt: Option<analysis::Doubt>) -> bool {
    match doubt {
        Some(analysis::Doubt::UnknownCounter) => true,
        Some(analysis::Doubt::Missing) => !a.limits.proceed_on_inconclusive && input.stable.is_some(),
        Some(analysis::Doubt::NothingBefore) | None => false,
    }
}

/// The analysis of the wave that just baked (`overdue`: seconds since its bake ended): the
/// nodes switched to the target revision since the last verdict (and since the wave's window
/// was frozen), against the control nodes.
fn judge_bake(input: &Input<'_>, a: Analysis<'_>, tally: &Tally, overdue: i64) -> Option<analysis::Outcome> {
    let newest = tally.newest_attach?;
    let baseline = a.baseline.filter(|b| b.revision == input.target);
    let since = [a.judged_at(), baseline.map(|b| b.taken_at.0.as_second())].into_iter().flatten().max();
    let in_wave = |created: i64| since.is_none_or(|s| created >= s);
    let wave: Vec<&str> = tally.wave.iter().filter(|(_, c, _)| in_wave(*c)).map(|(n, _, _)| n.as_str()).collect();
    if wave.is_empty() {
        // Every node of the revision was judged with an earlier wave.
        return None;
    }
    let case = analysis::Case {
        revision: input.target,
        limits: a.limits,
        baseline,
        from_ms: newest.saturating_mul(1000),
        to_ms: input.now.saturating_mul(1000),
        wave,
        controls: control_nodes(tally).map(|(n, _)| n).collect(),
        health: a.health,
        may_wait: overdue < analysis::SAMPLE_GRACE_SECONDS,
    };
    Some(analysis::judge(&case))
}

/// The attached nodes outside the wave being judged: those of another revision, and those of
/// the target revision (earlier waves, and when judging, the nodes of the wave are left out by
/// the caller's baseline), with when each attached (seconds).
fn control_nodes(tally: &Tally) -> impl Iterator<Item = (&str, i64)> {
    tally.controls.iter().map(|(n, s)| (n.as_str(), *s)).chain(tally.wave.iter().map(|(n, _, s)| (n.as_str(), *s)))
}

/// The window before the switch of the pods replaced now, frozen with the control nodes' over
/// the same time (with analysis, for a revision that is not the stable one): merged into the
/// wave in flight when that one is not judged yet (its pods replaced over two reconciles), a
/// new wave's when the last one was judged (`judged_now`: in this very step).
fn freeze_wave(input: &Input<'_>, tally: &Tally, replace: &[String], judged_now: bool) -> Option<WaveBaseline> {
    let a = input.analysis?;
    if replace.is_empty() || input.stable == Some(input.target) {
        return None;
    }
    let wave: Vec<&str> =
        tally.pod_nodes.iter().filter(|(pod, _)| replace.contains(pod)).map(|(_, node)| node.as_str()).collect();
    let controls: Vec<(&str, i64)> = control_nodes(tally)
        .filter(|(c, _)| !wave.contains(c))
        .map(|(c, since)| (c, since.saturating_mul(1000)))
        .collect();
    let taken_at = Time(jiff::Timestamp::from_second(input.now).unwrap_or_default());
    let fresh = analysis::freeze(a.limits, input.target, taken_at, &wave, &controls, a.health);
    let in_flight = a.baseline.filter(|b| {
        !judged_now && b.revision == input.target && a.judged_at().is_none_or(|j| b.taken_at.0.as_second() >= j)
    });
    Some(match in_flight {
        Some(previous) => analysis::merge(previous, fresh),
        None => fresh,
    })
}

/// The size of the wave after `updated` nodes run the target revision, attached and baked:
/// `updated + canary` (at least one), so each wave doubles the one before, capped by
/// `max_unavailable`. Read off the nodes, not remembered: a new leader goes on with the same
/// sizes.
pub fn grown_wave(updated: usize, canary: usize, max_unavailable: usize) -> usize {
    (updated + canary).max(1).min(max_unavailable.max(1))
}

/// Why a pod of the target revision is not attached and Ready at its attach deadline, told
/// apart by what its agent reports: the kernel never ran the scheduler, or it did and only the
/// pod's readiness is missing, or nothing was heard from the agent at all.
fn attach_timeout_cause(kernel: KernelView, pod: &str, timeout: i64) -> String {
    let within = format!("within {timeout}s (spec.rollout.attachTimeoutSeconds)");
    match kernel {
        KernelView::Attached { .. } => format!(
            "the node's agent reports the scheduler attached, but pod {pod} did not become Ready {within}; check its readiness probe and kubelet"
        ),
        KernelView::NotAttached => {
            format!("the kernel did not run the scheduler {within}: the node's agent reports it not attached")
        }
        _ => format!(
            "pod {pod} did not become Ready {within} and its agent sent no report of the kernel; check that the pod runs (kubectl describe pod {pod})"
        ),
    }
}

/// What a rollout step starts from, besides the plan.
#[derive(Clone, Debug)]
pub struct Progress<'a> {
    /// The rollout status as last written.
    pub previous: &'a RolloutStatus,
    /// The recorded failure of the revision the spec asks for, when it is that one's (same
    /// revision, same generation): it is not tried again.
    pub failed: Option<&'a RolloutFailure>,
    pub plan: &'a Decision,
    /// The revision the DaemonSet's template makes, with the Scheduler's generation.
    pub template: Revision,
    /// The revision and image the spec asks for, when its image is admitted.
    pub wanted: Option<(&'a str, &'a str)>,
    /// The DaemonSet controller has seen the current template.
    pub caught_up: bool,
    pub now: Time,
}

/// The rollout's new status and what to do.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub status: RolloutStatus,
    /// Pods to delete now.
    pub replace: Vec<String>,
    /// Entering nodes to label now.
    pub admit: Vec<String>,
    /// Nodes whose owner label to remove now: a first revision failed, so the nodes it reached
    /// go back to revision zero, the kernel's default scheduler.
    pub evict: Vec<String>,
    /// The revision failed in this step.
    pub newly_failed: Option<RolloutFailure>,
    /// Set the template back to the current revision now (there is one to go back to, and the
    /// template is not it yet).
    pub roll_back: bool,
    /// The nodes the rollout covers ([`Decision::desired`]): what DESIRED shows.
    pub desired: usize,
}

/// Folds a plan into the rollout's status: a revision that completes becomes the current one
/// (what a rollback restores); one that fails is recorded and rolled back, to the revision that
/// last completed or, for a first revision, to revision zero (its nodes lose the owner label and
/// run the kernel's default scheduler again); a recorded failure keeps the rollout stopped and
/// admits no node, unless a first revision attached everywhere after all.
pub fn advance(p: &Progress<'_>) -> Step {
    let plan = p.plan;
    let mut step = Step {
        status: planned_status(p),
        replace: plan.replace.clone(),
        admit: plan.admit.clone(),
        evict: Vec::new(),
        newly_failed: None,
        roll_back: false,
        desired: plan.desired,
    };
    let wants_template = p.wanted.is_some_and(|(revision, _)| revision == p.template.name);
    match p.failed {
        Some(f) if p.stable().is_none() && f.revision == p.template.name && plan.complete() && plan.attached > 0 => {
            // Nothing was rolled back, and the revision attached everywhere after all.
            step.status.current_revision = Some(p.template.clone());
            step.status.failed = None;
        }
        Some(f) => step.keep_failed(p, f),
        None => match plan.failure.as_ref().filter(|_| !p.on_stable() || !plan.broken.is_empty()) {
            Some(failure) => step.fail(p, failure),
            None if plan.complete() && wants_template && plan.attached > 0 => {
                // The revision of this generation runs everywhere, attached: the one to go back to.
                // (A revision that ran nowhere, on no node or only on skipped ones, is not.)
                step.status.current_revision = Some(p.template.clone());
                step.status.failed = None;
            }
            // The DaemonSet does not carry the revision asked for yet (an apply on its way, or
            // a copy older than it): not complete.
            None if p.wanted.is_some() && !wants_template && plan.complete() => {
                step.status.phase = RolloutPhase::Rolling;
            }
            None => {}
        },
    }
    if step.status.failed.is_some() {
        // While a failure stands no node enters until the spec changes: the nodes waiting to
        // enter are not ones a pod is meant for, so DESIRED and KernelAttached leave them out
        // (they said "5 more nodes wait for a pod" of a revision rolled back everywhere).
        step.desired = step.desired.saturating_sub(usize::try_from(step.status.entering_nodes).unwrap_or(0));
    }
    if !p.caught_up {
        // The DaemonSet controller has not seen the template yet: a pod deleted now could come
        // back as the old revision, or a node labelled now get it.
        step.replace.clear();
        step.hold_entering();
    }
    step.status.phase = no_going_back(p.previous, &p.template.name, step.status.phase);
    step
}

/// A rollout's phase never goes back: once a wave past the canary of a revision started, it is
/// Rolling until it ends, though the nodes of that wave may still be on their way (a label
/// written, a pod not made yet) when the plan counts them.
fn no_going_back(previous: &RolloutStatus, revision: &str, phase: RolloutPhase) -> RolloutPhase {
    let same = previous.update_revision.as_ref().is_some_and(|r| r.name == revision);
    if same && previous.phase == RolloutPhase::Rolling && phase == RolloutPhase::Canary {
        RolloutPhase::Rolling
    } else {
        phase
    }
}

/// The rollout status as the plan counts it, before a failure or a completion is folded in.
fn planned_status(p: &Progress<'_>) -> RolloutStatus {
    let plan = p.plan;
    RolloutStatus {
        phase: plan.phase,
        current_revision: p.previous.current_revision.clone(),
        // The revision's fields are kept for the current one only.
        update_revision: Some(Revision { spec: None, ..p.template.clone() }),
        updated_nodes: i32::try_from(plan.updated).unwrap_or(i32::MAX),
        attached_nodes: i32::try_from(plan.attached).unwrap_or(i32::MAX),
        entering_nodes: i32::try_from(plan.entering).unwrap_or(i32::MAX),
        skipped_nodes: plan.skipped.clone(),
        skipped_reasons: plan
            .skipped_for
            .iter()
            .map(|(why, n)| (why.as_str().to_owned(), i32::try_from(*n).unwrap_or(i32::MAX)))
            .collect(),
        failed: p.failed.cloned().or_else(|| p.tried_again().cloned()),
        // Held while the failure they were held under stands.
        held_nodes: if p.failed.is_some() { p.previous.held_nodes.clone() } else { Vec::new() },
        analysis: analysis_status(p),
        baseline: baseline_status(p),
    }
}

/// The verdict judged now, else the last one of the same revision, or of the failed revision
/// while its failure is recorded (a rollback keeps the verdict that made it, nodes and values).
fn analysis_status(p: &Progress<'_>) -> Option<AnalysisStatus> {
    let Some(j) = &p.plan.analysis else {
        let failed = p.failed.or(p.previous.failed.as_ref());
        return p
            .previous
            .analysis
            .clone()
            .filter(|a| a.revision == p.template.name || failed.is_some_and(|f| f.revision == a.revision));
    };
    Some(AnalysisStatus {
        revision: p.template.name.clone(),
        verdict: j.verdict,
        generation: Some(p.template.generation),
        holds: p.plan.analysis_holds,
        message: j.message.clone(),
        nodes: j.nodes.clone(),
        time: p.now.clone(),
    })
}

/// The window before the switch of the wave in flight: frozen now, else kept while the
/// rollout of its revision goes on (dropped once it completes or fails).
fn baseline_status(p: &Progress<'_>) -> Option<WaveBaseline> {
    if p.plan.complete() || p.plan.failure.is_some() {
        return None;
    }
    p.plan.baseline.clone().or_else(|| p.previous.baseline.clone().filter(|b| b.revision == p.template.name))
}

impl Progress<'_> {
    /// The failure of the template's revision under an earlier generation, while that revision
    /// is tried again (a retry) and has not completed: kept in the status, so every reconcile
    /// of the retry knows which pods the failed attempt made (see [`Input::retried_after`]).
    fn tried_again(&self) -> Option<&RolloutFailure> {
        self.previous.failed.as_ref().filter(|f| {
            self.failed.is_none()
                && f.revision == self.template.name
                && f.generation != self.template.generation
                && !self.plan.complete()
        })
    }

    /// The revision that last completed, if any.
    fn stable(&self) -> Option<&str> {
        self.previous.current_revision.as_ref().map(|r| r.name.as_str())
    }

    fn on_stable(&self) -> bool {
        self.stable() == Some(self.template.name.as_str())
    }

    /// A failed revision is rolled back to the stable one; a first one has nothing to go back to.
    fn failed_phase(&self) -> RolloutPhase {
        if self.stable().is_some() { RolloutPhase::RolledBack } else { RolloutPhase::Failed }
    }

    /// The nodes that go back to revision zero when the template's revision fails: every node a
    /// failed first revision reached.
    fn to_zero(&self) -> Vec<String> {
        if self.stable().is_none() { self.plan.labelled.clone() } else { Vec::new() }
    }
}

impl Step {
    /// The entering nodes decided on wait: none is labelled now, and they count as entering.
    fn hold_entering(&mut self) {
        self.status.entering_nodes += i32::try_from(self.admit.len()).unwrap_or(0);
        self.admit.clear();
    }

    /// Nodes sent back to revision zero under another revision's recorded failure: kept out
    /// (status.heldNodes) until the spec changes, with those held before.
    fn hold_nodes(&mut self, sent_back: &[String]) {
        let held = &mut self.status.held_nodes;
        held.extend(sent_back.iter().cloned());
        held.sort();
        held.dedup();
        let before = self.admit.len();
        self.admit.retain(|n| !held.contains(n));
        self.status.entering_nodes += i32::try_from(before - self.admit.len()).unwrap_or(0);
    }

    /// A failure recorded before: the nodes it reached run the current revision again once the
    /// template is set back, or, with none, go back to revision zero (their labels are
    /// removed); again, until that holds: a rollback cut short is carried on.
    fn keep_failed(&mut self, p: &Progress<'_>, f: &RolloutFailure) {
        self.status.update_revision = p.wanted.map(|(name, image)| Revision {
            name: name.into(),
            image: image.into(),
            generation: f.generation,
            spec: None,
        });
        self.status.phase = p.failed_phase();
        if p.on_stable() {
            // Under the stable revision, the nodes where taking them over failed go back to
            // revision zero; after a takeover failed, no node enters until a retry.
            self.evict = p.plan.broken.clone();
            if f.revision == p.template.name {
                self.hold_entering();
            } else {
                self.hold_nodes(&p.plan.broken);
            }
        } else {
            self.hold_entering();
            self.replace.clear();
            self.roll_back = p.stable().is_some();
            self.evict = p.to_zero();
        }
    }

    /// The template's revision failed in this step: recorded, and rolled back.
    fn fail(&mut self, p: &Progress<'_>, failure: &Failure) {
        let failure = RolloutFailure {
            revision: p.template.name.clone(),
            generation: p.template.generation,
            node: failure.node.clone(),
            cause: failure.cause.clone(),
            time: p.now.clone(),
            reason: failure.by_analysis.then(|| Reason::AnalysisFailed.as_str().to_owned()),
        };
        self.status.phase = p.failed_phase();
        self.status.failed = Some(failure.clone());
        self.newly_failed = Some(failure);
        self.hold_entering();
        if p.on_stable() {
            // A takeover failed: only the nodes it switched go back to revision zero.
            self.evict = p.plan.broken.clone();
        } else {
            self.roll_back = p.stable().is_some();
            self.replace.clear();
            self.evict = p.to_zero();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const T: &str = "new";
    const S: &str = "old";

    fn pacing(canary: usize, max_unavailable: usize) -> Pacing {
        Pacing { canary, max_unavailable, bake_seconds: 30, attach_timeout_seconds: 120, paused: false }
    }

    fn node(name: &str, revision: &str, kernel: KernelView) -> NodeView {
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
        }
    }

    /// A labelled node whose pod is not there (yet).
    fn pod_less(name: &str) -> NodeView {
        NodeView { pod: None, ..node(name, T, KernelView::Unknown) }
    }

    fn up(name: &str, revision: &str) -> NodeView {
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
            now: 1000,
        })
    }

    fn decide_at(nodes: &[NodeView], pacing: Pacing, now: i64) -> Decision {
        decide(&input_at(nodes, pacing, now))
    }

    fn input_at(nodes: &[NodeView], pacing: Pacing, now: i64) -> Input<'_> {
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
        assert_eq!(
            before.replace.len(),
            2,
            "the node switched before the last verdict was judged by it: no wave to judge"
        );
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
                analysis: Some(Analysis {
                    limits: &limits,
                    health,
                    last: None,
                    baseline: Some(&baseline),
                    generation: 1,
                }),
                ..input_at(&nodes, pacing(1, 2), 200)
            })
        };
        let silent = decide_with(&std::collections::BTreeMap::new());
        let failure = silent.failure.unwrap_or_else(|| panic!("a silent node fails"));
        assert!(failure.by_analysis && failure.cause.starts_with("n0 sent 0 sample(s)"), "{}", failure.cause);
        let heard: std::collections::BTreeMap<String, analysis::NodeHealth> = [(
            "n0".to_owned(),
            analysis::NodeHealth { samples: (115..=200).step_by(5).map(sample).collect(), counters: Vec::new() },
        )]
        .into();
        let paused = decide_with(&heard);
        assert_eq!((paused.phase, paused.replace.len(), paused.analysis_holds), (RolloutPhase::Paused, 0, true));
        let message = paused.analysis.map(|j| j.message).unwrap_or_default();
        assert!(
            message.contains("could not be judged") && message.contains("kubectl sked rollout proceed"),
            "{message}"
        );
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
        let first =
            |nodes: &[NodeView], now: i64| decide(&Input { stable: None, ..input_at(nodes, pacing(1, 2), now) });
        // One node: its canary is the last wave, and bakes before Complete.
        let one = [node("n0", T, KernelView::Attached { since: 100 })];
        let plan = first(&one, 105);
        assert_eq!((plan.phase, plan.recheck_in), (RolloutPhase::Canary, Some(25)), "baking until 130");
        assert_eq!(first(&one, 130).phase, RolloutPhase::Complete);
        // Two nodes: the second attached at 150 bakes until 180.
        let two =
            [node("n0", T, KernelView::Attached { since: 100 }), node("n1", T, KernelView::Attached { since: 150 })];
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
        let said = NodeView { exit: Some(why.into()), ..node("a", T, KernelView::Ejected) };
        let ejected = decide_at(&[said, up("b", S)], pacing(1, 1), 10);
        assert!(ejected.failure.unwrap().cause.ends_with(why));

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
        Revision { name: name.into(), image: format!("r.io/s@sha256:{name}"), generation, spec: None }
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
        let failure = Failure { node: "n1".into(), cause: "crash".into(), by_analysis: false };
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

    fn entering(names: &[&str], joined: bool) -> Vec<Entering> {
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
        };
        let previous = RolloutStatus {
            current_revision: Some(revision(S, 1)),
            failed: Some(failed.clone()),
            ..Default::default()
        };
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
            now: 300,
        };
        let plan = decide(&input);
        assert_eq!(
            plan.failure.as_ref().map(|f| (f.node.as_str(), f.cause.contains("crash-looping"))),
            Some(("c", true))
        );
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
            now: 300,
        };
        let plan = decide(&input);
        assert_eq!(plan.broken, vec!["c".to_string()]);
        let previous = RolloutStatus { current_revision: Some(revision(S, 1)), ..Default::default() };
        let mut p = progress(&previous, &plan, revision(S, 2));
        (p.failed, p.wanted) = (Some(&failure), Some((T, "r.io/s@sha256:new")));
        let step = advance(&p);
        assert_eq!(
            (step.evict.clone(), step.status.held_nodes.clone()),
            (vec!["c".to_string()], vec!["c".to_string()])
        );

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
            let restore = decide(&Input { target: S, stable: Some(S), nodes: &views, entering: &[], held: &[], expected_pods: views.len(), retried_after: None, pacing: p, analysis: None, now });
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
                let plan = decide(&Input { target: T, stable: None, nodes: &views, entering: &waiting, held: &[], expected_pods: expected, retried_after: None, pacing: p, analysis: None, now });
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
}
