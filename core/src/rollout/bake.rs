//! The bake that ended, judged by the analysis the spec asks for, and the window before a wave's
//! switch, frozen when its pods are replaced.

use std::ops::ControlFlow;

use sked_api::{AnalysisVerdict, RolloutPhase, WaveBaseline};

use super::model::{Analysis, Decision, Failure, Input, Tally};
use crate::analysis;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// How often a bake's verdict asks again while it waits for samples.
const ANALYSIS_RECHECK_SECONDS: i64 = 5;

/// The bake that ended (`baked_in` seconds ago, negated), judged by the analysis the spec asks
/// for: `Continue` with its verdict to go on, `Break` with the plan that stops here: in phase
/// `holding` while the verdict waits for samples, Paused on a verdict that holds the rollout,
/// or rolled back. The stable revision is not judged.
pub(super) fn after_bake(
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
                plan.failure = Some(Failure { node, cause, by_analysis: true, evidence: None });
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
pub(super) fn freeze_wave(
    input: &Input<'_>,
    tally: &Tally,
    replace: &[String],
    judged_now: bool,
) -> Option<WaveBaseline> {
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
