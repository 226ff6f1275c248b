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

use sked_api::RolloutPhase;

/// Decides the next step of a rollout.
///
/// The kernel's default scheduler is revision zero: an entering node is switched like a pod of
/// another revision that runs attached, so a first deployment and a takeover go canary first
/// and then in waves, within `maxUnavailable`.
pub fn decide(input: &Input<'_>) -> Decision {
    let mut plan = decide_step(input);
    if plan.canary != CanaryClaim::Starts {
        plan.canary = claim_of(plan.phase);
    }
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
    plan.failure = Some(Failure { node: node.clone(), cause, by_analysis: true, evidence: None });
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
    // A restart the kernel asked for has the attach timeout from when it was asked.
    let restarting = match n.kernel {
        KernelView::Restarting { since } => Some(since),
        _ => None,
    };
    let deadline = restarting.unwrap_or(pod.created) + pacing.attach_timeout_seconds;
    let cause = if pod.crash_looping {
        match &pod.last_exit {
            Some(exit) => format!("the scheduler container is crash-looping; it last ended with {exit}"),
            None => "the scheduler container is crash-looping".to_owned(),
        }
    } else if n.kernel == KernelView::Ejected {
        match &n.exit {
            Some(exit) => format!("the scheduler stopped running after it had attached: {}", exit.describe()),
            None => "the kernel stopped running the scheduler after it had attached".to_owned(),
        }
    } else if let Some(why) = pod.pull_error.as_ref().filter(|_| now >= deadline) {
        format!(
            "the kubelet could not pull the scheduler's image within {}s (spec.rollout.attachTimeoutSeconds): {why}; check spec.sched and spec.imagePullSecrets",
            pacing.attach_timeout_seconds
        )
    } else if let Some(since) = restarting.filter(|_| now >= deadline) {
        format!(
            "the kernel asked the scheduler to restart {}s ago (a CPU went on or off line: unregistered from the main kernel) and it did not attach again within {}s (spec.rollout.attachTimeoutSeconds); check that the scheduler registers again when the kernel asks it to restart (scx_utils schedulers do)",
            now - since,
            pacing.attach_timeout_seconds
        )
    } else if now >= deadline {
        attach_timeout_cause(n.kernel, &pod.name, pacing.attach_timeout_seconds)
    } else {
        plan.recheck(deadline - now);
        return None;
    };
    // The kernel's exit when the kernel ended the scheduler (not a normal unregistration), and
    // the scheduler container's last words.
    let kernel_exit = n.exit.clone().filter(|e| e.ejected || e.restart);
    let evidence = sked_api::FailureEvidence::of(kernel_exit, pod.last_exit.clone(), n.scheduler_stats.clone());
    Some(Failure { node: n.node.clone(), cause, by_analysis: false, evidence })
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
    let starts_canary = !unpaced && canary > 0 && plan.updated == 0 && down + up + zero > 0;
    if starts_canary && *input.canary_gate != CanaryGate::Open {
        // Another Scheduler's canary holds the slot: this one starts when it is over (a slot
        // coming free wakes it; the recheck is the safety net).
        plan.phase = RolloutPhase::Queued;
        plan.recheck(QUEUED_RECHECK_SECONDS);
        return plan;
    }
    plan.replace = old_down.into_iter().take(down).chain(old_up.into_iter().take(up)).collect();
    plan.baseline = freeze_wave(input, &tally, &plan.replace, plan.analysis.is_some());
    plan.admit.extend(waiting.into_iter().take(zero));
    plan.entering -= zero;
    plan.phase = phase_for(plan.updated + plan.replace.len() + zero);
    if starts_canary {
        plan.canary = CanaryClaim::Starts;
    }
    plan
}

/// How often a queued rollout looks at the canary slots again, should no hand-off wake it (a
/// holder deleted while this replica did not see it go, say).
pub const QUEUED_RECHECK_SECONDS: i64 = 30;

/// A canary under way holds its slot until it has baked and the waves start (or it failed, or
/// was paused).
fn claim_of(phase: RolloutPhase) -> CanaryClaim {
    if phase == RolloutPhase::Canary { CanaryClaim::Runs } else { CanaryClaim::None }
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

mod advance;
mod bake;
#[cfg(test)]
mod gate_tests;
mod model;
#[cfg(test)]
mod restart_tests;
#[cfg(test)]
mod tests;

pub use self::advance::{Progress, Step, advance};
use self::bake::{after_bake, freeze_wave};
use self::model::Tally;
pub use self::model::{
    Analysis, CRASH_LOOP_RESTARTS, CanaryClaim, CanaryGate, DEFAULT_ATTACH_TIMEOUT_SECONDS, DEFAULT_BAKE_SECONDS,
    DEFAULT_CANARY, DEFAULT_MAX_UNAVAILABLE_PERCENT, Decision, Entering, Failure, Input, KernelView, NodeView, Pacing,
    PodView, Skip,
};
