//! The verdict on a wave that baked: each node's change against the controls' change over the
//! same time, node by node, then the wave by its quorum.

use std::collections::BTreeMap;

use sked_api::{AnalysisVerdict, NodeAnalysis, NodeBaseline, SignalSummary, WaveBaseline};

use super::baseline::window;
use super::contract::{self, Finding};
use super::stats::{MAD_TO_SD, median};
use super::{EventRule, Limits, MAX_LISTED_NODES, NodeHealth, Sample, Signal};

/// One wave's bake to judge.
#[derive(Clone, Debug)]
pub struct Case<'a> {
    pub revision: &'a str,
    pub limits: &'a Limits,
    /// The window before the wave's switch, frozen when its pods were replaced (`None` when
    /// nothing was frozen: the wave's nodes ran no agent before).
    pub baseline: Option<&'a WaveBaseline>,
    /// The bake: from when the newest node of the wave attached, to now (ms, controller clock).
    pub from_ms: i64,
    pub to_ms: i64,
    /// The wave's nodes: they run the revision, attached.
    pub wave: Vec<&'a str>,
    /// The nodes that run another revision, attached, now: the baseline's controls among them
    /// are the controls.
    pub controls: Vec<&'a str>,
    pub health: &'a BTreeMap<String, NodeHealth>,
    /// Whether the verdict may still wait for samples (within the grace after the bake).
    pub may_wait: bool,
}

/// What the analysis of a bake says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A node of the wave has too few samples yet: ask again in a few seconds.
    Waiting,
    Judged(Judgement),
}

/// Why a verdict is Inconclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Doubt {
    /// No node of the wave had a window before its switch: they ran the kernel's default
    /// scheduler, with no agent (a first deployment, nodes taken over). Nothing to compare.
    NothingBefore,
    /// Some node could not be judged: too few samples, too few control nodes.
    Missing,
    /// The spec names an event counter a wave node's kernel does not count.
    UnknownCounter,
}

/// A verdict, with what it rests on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judgement {
    pub verdict: AnalysisVerdict,
    pub message: String,
    /// The nodes judged, failed first, at most [`MAX_LISTED_NODES`].
    pub nodes: Vec<NodeAnalysis>,
    /// The node that failed the revision, and why (when the verdict is Failed).
    pub failure: Option<(String, String)>,
    /// Why it is Inconclusive (when it is).
    pub doubt: Option<Doubt>,
}

/// The controls' change of one signal between the two windows.
#[derive(Clone, Copy, Debug)]
struct Controls {
    centre: f64,
    /// A robust standard deviation of their changes.
    sd: f64,
    count: usize,
    /// How many `sd` past `centre` a node's change must lie: to count toward the quorum
    /// (`node`), and to fail the wave alone (`alone`), so that no node of the wave is likely to
    /// pass it by chance ([`Limits::spread_z`]).
    z: Spread,
}

impl Controls {
    /// What a node's excess is measured against, in words.
    fn beyond(&self) -> String {
        if self.count == 0 {
            "on its own, with no control nodes (spec.rollout.analysis.minControlNodes is 0)".to_owned()
        } else {
            format!("beyond the median change of {} control nodes", self.count)
        }
    }

    /// How far past the controls' median change a node's change must lie to be outside their
    /// spread, to count toward the quorum or alone.
    fn outside(&self, alone: bool) -> f64 {
        self.sd * if alone { self.z.alone } else { self.z.node }
    }
}

/// One node's verdict.
#[derive(Clone, Debug)]
enum Verdict {
    Passed,
    /// Over a limit; `critical`: alone enough to fail the wave.
    Failed {
        cause: String,
        critical: bool,
    },
    /// Reported before its switch, silent after.
    Silent(String),
    Unjudged,
    NoBefore,
    UnknownCounter(String),
}

/// Judges one wave's bake.
pub fn judge(case: &Case<'_>) -> Outcome {
    // A breach of the pods' CPU contract is a fact: it fails the wave at once.
    let contract = case.limits.cpu_contract.then(|| contract::check(case));
    if let Some(Finding::Broken { node, cause }) = contract {
        return Outcome::Judged(contract_broken(node, cause));
    }
    let min = case.limits.min_samples;
    let short = |n: &&str| bake(case, n).len() < min && before(case, n).is_some();
    // The first reading of a node's pods comes with a heartbeat after the agent's first window.
    let unread = matches!(contract, Some(Finding::Unknown(_)));
    if case.may_wait && (case.wave.iter().any(short) || controls_short(case) || unread) {
        return Outcome::Waiting;
    }
    let candidates = case.wave.iter().filter(|n| before(case, n).is_some()).count();
    let controls: Vec<(Signal, f64, Option<Controls>)> =
        case.limits.signals.iter().map(|&(s, limit)| (s, limit, controls(case, s, candidates))).collect();
    let judged: Vec<(&str, Verdict, String)> = case
        .wave
        .iter()
        .map(|node| {
            let (verdict, detail) = judge_node(case, node, &controls);
            (*node, verdict, detail)
        })
        .collect();
    let judgement = verdict(case, judged);
    match contract {
        Some(Finding::Unknown(nodes)) if judgement.verdict != AnalysisVerdict::Failed => {
            Outcome::Judged(contract_unknown(judgement, &nodes))
        }
        _ => Outcome::Judged(judgement),
    }
}

/// The verdict of a wave whose `node` broke the pods' CPU contract: Failed, whatever the
/// signals say.
fn contract_broken(node: String, cause: String) -> Judgement {
    let detail = format!("broke the pods' CPU contract: {cause}");
    Judgement {
        verdict: AnalysisVerdict::Failed,
        message: format!("1 node broke the pods' CPU contract (spec.rollout.analysis.cpuContract); {cause}"),
        nodes: vec![NodeAnalysis { node: node.clone(), verdict: AnalysisVerdict::Failed, detail }],
        failure: Some((node, cause)),
        doubt: None,
    }
}

/// A verdict that did not fail, which cannot stand on the pods' CPU contract of `nodes`, which
/// said nothing of it: Inconclusive for want of data (as missing samples make it), even where
/// nothing ran before to compare the signals with: the contract needs no window before the
/// switch.
fn contract_unknown(passed: Judgement, nodes: &[String]) -> Judgement {
    let listed = nodes.iter().take(5).map(String::as_str).collect::<Vec<_>>().join(", ");
    Judgement {
        verdict: AnalysisVerdict::Inconclusive,
        message: format!(
            "{}; but {} node(s) did not say whether their pods' CPU limits and requests hold ({listed}): their \
             agents did not read the scheduler's cgroup callbacks or the pods' cgroups (see their logs)",
            passed.message,
            nodes.len()
        ),
        doubt: Some(Doubt::Missing),
        ..passed
    }
}

/// Whether fewer controls than the spec asks for have their bake's samples yet, while enough
/// of them were frozen to have them: their reports may come late (an agent reconnecting after
/// a failover), and a verdict now would be Inconclusive for want of them.
fn controls_short(case: &Case<'_>) -> bool {
    let Some(baseline) = case.baseline else { return false };
    let min = case.limits.min_samples;
    let frozen: Vec<&str> = baseline
        .nodes
        .iter()
        .filter(|b| b.control && case.controls.contains(&b.node.as_str()))
        .map(|b| b.node.as_str())
        .collect();
    let sampled = frozen.iter().filter(|n| bake(case, n).len() >= min).count();
    let needed = case.limits.min_control_nodes;
    sampled < needed && frozen.len() >= needed
}

/// The node's frozen window before its switch, when it has one.
fn before<'a>(case: &Case<'a>, node: &str) -> Option<&'a NodeBaseline> {
    case.baseline?.nodes.iter().find(|b| !b.control && b.node == node)
}

/// The node's samples over the bake.
fn bake<'a>(case: &Case<'a>, node: &str) -> Vec<&'a Sample> {
    case.health.get(node).map_or_else(Vec::new, |h| window(&h.samples, case.from_ms, case.to_ms).collect())
}

/// The median of a signal over samples, from at least `min` values.
fn bake_median(samples: &[&Sample], signal: Signal, min: usize) -> Option<f64> {
    let values: Vec<f64> = samples.iter().filter_map(|s| signal.of(s)).collect();
    if values.len() < min { None } else { median(values) }
}

/// A summary of the window before, from at least `min` samples.
fn summary_of(b: &NodeBaseline, signal: Signal, min: usize) -> Option<SignalSummary> {
    b.signals.get(signal.key()).copied().filter(|s| usize::try_from(s.samples).unwrap_or(0) >= min)
}

/// The controls' changes of a signal: the baseline's control nodes that still run another
/// revision, each with enough samples in both windows; none when fewer than the spec asks.
/// The controls' change of `signal`, for a wave of `candidates` nodes to be read against.
fn controls(case: &Case<'_>, signal: Signal, candidates: usize) -> Option<Controls> {
    let min = case.limits.min_samples;
    let changes: Vec<f64> = case
        .baseline?
        .nodes
        .iter()
        .filter(|b| b.control && case.controls.contains(&b.node.as_str()))
        .filter_map(|b| {
            let before = summary_of(b, signal, min)?;
            let after = bake_median(&bake(case, &b.node), signal, min)?;
            Some(signal.change(before.median, after))
        })
        .collect();
    let count = changes.len();
    if count == 0 && case.limits.min_control_nodes == 0 {
        // Asked for: each node judged by its own change alone, against the limit.
        return Some(Controls { centre: 0.0, sd: 0.0, count, z: Spread { node: 0.0, alone: 0.0 } });
    }
    if count < case.limits.min_control_nodes.max(1) {
        return None;
    }
    let centre = median(changes.clone())?;
    let mad = median(changes.iter().map(|c| (c - centre).abs()).collect())?;
    let limits = case.limits;
    let z = Spread {
        node: limits.spread_z(candidates, limits.quorum(candidates), count),
        alone: limits.spread_z(candidates, 1, count),
    };
    Some(Controls { centre, sd: MAD_TO_SD * mad, count, z })
}

/// How many robust standard deviations of the controls' changes a node's excess must pass (see
/// [`Controls::z`]).
#[derive(Clone, Copy, Debug)]
struct Spread {
    node: f64,
    alone: f64,
}

/// One wave node's verdict and the detail shown for it.
fn judge_node(case: &Case<'_>, node: &str, controls: &[(Signal, f64, Option<Controls>)]) -> (Verdict, String) {
    let min = case.limits.min_samples;
    let samples = bake(case, node);
    let Some(before) = before(case, node) else {
        if let Some(unknown) = unknown_counter(case, node) {
            return (Verdict::UnknownCounter(unknown.clone()), unknown);
        }
        return match events_over(case, node, &samples) {
            Some(cause) => (Verdict::Failed { cause: cause.clone(), critical: true }, cause),
            None => (Verdict::NoBefore, "no window before its switch (no agent ran there)".to_owned()),
        };
    };
    if samples.len() < min {
        let sent = before.signals.values().map(|s| s.samples).max().unwrap_or(0);
        let cause = format!(
            "{node} sent {} sample(s) during the bake of revision {} after {sent} in the window before its switch: a node that reported before its switch and is silent after fails (the scheduler may starve its agent, or the node its network)",
            samples.len(),
            case.revision
        );
        return (Verdict::Silent(cause.clone()), "silent since its switch".to_owned());
    }
    if let Some(unknown) = unknown_counter(case, node) {
        return (Verdict::UnknownCounter(unknown.clone()), unknown);
    }
    let mut details = Vec::new();
    let mut worst: Option<(f64, String, bool)> = None;
    let mut judged = false;
    for &(signal, limit, c) in controls {
        let (Some(b), Some(after), Some(c)) = (summary_of(before, signal, min), bake_median(&samples, signal, min), c)
        else {
            details.push(format!("{} not judged", signal.name()));
            continue;
        };
        judged = true;
        let excess = signal.change(b.median, after) - c.centre;
        details.push(format!(
            "{} {} from {} ({} {})",
            signal.name(),
            signal.show(after),
            signal.show(b.median),
            signal.show_excess(excess),
            c.beyond()
        ));
        if excess > c.outside(false) && excess > signal.bound(limit, 1.0) {
            let critical = excess > c.outside(true) && excess > signal.bound(limit, case.limits.critical_factor);
            let ratio = excess / signal.bound(limit, 1.0);
            if worst.as_ref().is_none_or(|(r, _, _)| ratio > *r) {
                let cause = format!(
                    "{} on {node} went from {} before its switch to {} during the bake of revision {}: {} {}; the limit is {}",
                    signal.name(),
                    signal.show(b.median),
                    signal.show(after),
                    case.revision,
                    signal.show_excess(excess),
                    if c.count == 0 { c.beyond() } else { format!("{}, past their spread", c.beyond()) },
                    signal.limit_text(limit)
                );
                worst = Some((ratio, cause, critical));
            }
        }
    }
    if let Some(cause) = events_over(case, node, &samples) {
        return (Verdict::Failed { cause, critical: true }, capped(&details.join("; ")));
    }
    let verdict = match worst {
        Some((_, cause, critical)) => Verdict::Failed { cause, critical },
        None if judged => Verdict::Passed,
        None => Verdict::Unjudged,
    };
    (verdict, capped(&details.join("; ")))
}

/// The first event counter the spec names that the node's kernel does not count, as an error.
fn unknown_counter(case: &Case<'_>, node: &str) -> Option<String> {
    let counters = &case.health.get(node)?.counters;
    let rule = case.limits.events.iter().find(|r| !counters.is_empty() && !counters.contains(&r.name))?;
    let known: Vec<&str> = counters.iter().map(String::as_str).take(12).collect();
    Some(format!(
        "spec.rollout.analysis.events names {}, which the kernel of node {node} does not count (it counts {}): correct the name",
        rule.name,
        known.join(", ")
    ))
}

/// The first event counter over its limit on the node during the bake, as a cause.
fn events_over(case: &Case<'_>, node: &str, samples: &[&Sample]) -> Option<String> {
    let counted = case.health.get(node).is_some_and(|h| !h.counters.is_empty());
    case.limits.events.iter().find_map(|rule| event_over(case, node, samples, rule, counted))
}

fn event_over(case: &Case<'_>, node: &str, samples: &[&Sample], rule: &EventRule, counted: bool) -> Option<String> {
    // A counter missing from a sample's rates ran at 0 only when the agent said which counters
    // it read; otherwise that sample tells nothing of it.
    let rates: Vec<f64> = samples
        .iter()
        .filter_map(|s| s.events.as_ref())
        .filter_map(|e| e.get(&rule.name).copied().or(counted.then_some(0.0)))
        .filter(|r| r.is_finite() && *r >= 0.0)
        .collect();
    if rates.len() < case.limits.min_samples {
        return None;
    }
    let rate = median(rates)?;
    let (value, limit) = if rule.share_of_time {
        (format!("{:.2} % of the time", rate / 1e7), format!("{:.0} % (maxPercentOfTime)", rule.limit))
    } else {
        (format!("{rate:.1}/s"), format!("{:.0}/s (maxPerSecond)", rule.limit))
    };
    let over = if rule.share_of_time { rate / 1e7 > rule.limit } else { rate > rule.limit };
    over.then(|| {
        format!(
            "{} on {node} ran at {value} (median over the bake of revision {}); the limit is {limit} in spec.rollout.analysis.events",
            rule.name, case.revision
        )
    })
}

/// Caps a node's detail: it lands in the Scheduler's status.
fn capped(s: &str) -> String {
    const MAX: usize = 400;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The wave's verdict from its nodes'.
fn verdict(case: &Case<'_>, nodes: Vec<(&str, Verdict, String)>) -> Judgement {
    let listed = listed(&nodes);
    let count = |f: fn(&Verdict) -> bool| nodes.iter().filter(|(_, v, _)| f(v)).count();
    let failing: Vec<(&str, &String, bool)> = nodes
        .iter()
        .filter_map(|(n, v, _)| match v {
            Verdict::Failed { cause, critical } => Some((*n, cause, *critical)),
            Verdict::Silent(cause) => Some((*n, cause, false)),
            _ => None,
        })
        .collect();
    let judged = count(|v| matches!(v, Verdict::Passed | Verdict::Failed { .. } | Verdict::Silent(_)));
    let quorum = case.limits.quorum(judged);
    let judgement = |verdict, message: String, failure, doubt| Judgement {
        verdict,
        message,
        nodes: listed.clone(),
        failure,
        doubt,
    };
    if let Some((_, Verdict::UnknownCounter(error), _)) =
        nodes.iter().find(|(_, v, _)| matches!(v, Verdict::UnknownCounter(_)))
    {
        return judgement(AnalysisVerdict::Inconclusive, error.clone(), None, Some(Doubt::UnknownCounter));
    }
    let critical = failing.iter().find(|(_, _, critical)| *critical);
    if let Some((node, cause, _)) = critical.or(failing.first().filter(|_| failing.len() >= quorum)) {
        let why = if critical.is_some() { "past the critical bound" } else { "the quorum" };
        let message =
            format!("{} of {judged} node(s) failed ({why}: {}); {cause}", failing.len(), quorum_text(case, quorum));
        return judgement(AnalysisVerdict::Failed, message, Some(((*node).to_owned(), (*cause).clone())), None);
    }
    let unjudged: Vec<&str> =
        nodes.iter().filter(|(_, v, _)| matches!(v, Verdict::Unjudged)).map(|(n, _, _)| *n).collect();
    if !unjudged.is_empty() {
        let message = format!(
            "{} of {} node(s) could not be judged ({}): fewer than {} samples in a window, or fewer than {} control nodes with them",
            unjudged.len(),
            nodes.len(),
            unjudged.iter().take(5).copied().collect::<Vec<_>>().join(", "),
            case.limits.min_samples,
            case.limits.min_control_nodes
        );
        return judgement(AnalysisVerdict::Inconclusive, message, None, Some(Doubt::Missing));
    }
    if judged == 0 {
        let message = format!(
            "none of the {} node(s) of the wave had a window before its switch to compare with: they ran the kernel's default scheduler, with no agent",
            nodes.len()
        );
        return judgement(AnalysisVerdict::Inconclusive, message, None, Some(Doubt::NothingBefore));
    }
    let over = if failing.is_empty() {
        String::new()
    } else {
        format!("; {} over a limit, under {}", failing.len(), quorum_text(case, quorum))
    };
    let message = format!(
        "{judged} node(s) judged by their change since their switch, during the bake of revision {}{over}",
        case.revision
    );
    judgement(AnalysisVerdict::Passed, message, None, None)
}

fn quorum_text(case: &Case<'_>, quorum: usize) -> String {
    format!(
        "a quorum of {quorum}, {:.0} % (spec.rollout.analysis.failedNodesPercent)",
        case.limits.failed_nodes * 100.0
    )
}

/// The nodes listed in the verdict: failed first, then silent, unjudged, passed, without a window.
fn listed(nodes: &[(&str, Verdict, String)]) -> Vec<NodeAnalysis> {
    let rank = |v: &Verdict| match v {
        Verdict::Failed { critical: true, .. } | Verdict::UnknownCounter(_) => 0,
        Verdict::Failed { .. } => 1,
        Verdict::Silent(_) => 2,
        Verdict::Unjudged => 3,
        Verdict::Passed => 4,
        Verdict::NoBefore => 5,
    };
    let mut sorted: Vec<&(&str, Verdict, String)> = nodes.iter().collect();
    sorted.sort_by_key(|(n, v, _)| (rank(v), *n));
    sorted
        .into_iter()
        .take(MAX_LISTED_NODES)
        .map(|(node, v, detail)| NodeAnalysis {
            node: (*node).to_owned(),
            verdict: match v {
                Verdict::Passed => AnalysisVerdict::Passed,
                Verdict::Failed { .. } | Verdict::Silent(_) => AnalysisVerdict::Failed,
                Verdict::Unjudged | Verdict::NoBefore | Verdict::UnknownCounter(_) => AnalysisVerdict::Inconclusive,
            },
            detail: detail.clone(),
        })
        .collect()
}
