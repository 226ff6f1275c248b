//! A decision folded into the rollout's status: a revision that completes becomes the current
//! one, one that fails is recorded and rolled back.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sked_api::{AnalysisStatus, Reason, Revision, RolloutFailure, RolloutPhase, RolloutStatus, WaveBaseline};

use super::model::{Decision, Failure};

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
    // While the failure of the template's revision stands, no node enters until the spec
    // changes: the nodes waiting to enter are not ones a pod is meant for, so DESIRED and
    // KernelAttached leave them out (they said "5 more nodes wait for a pod" of a revision rolled
    // back everywhere). Back on the stable revision after a rollback, nodes still enter in waves.
    let nothing_enters = step.status.failed.as_ref().is_some_and(|f| !(p.on_stable() && f.revision != p.template.name));
    if nothing_enters {
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
            agent_image: None,
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
            evidence: failure.evidence.clone(),
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
