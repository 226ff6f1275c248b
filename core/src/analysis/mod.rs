//! Analysis: whether a wave hurt the work its nodes run, judged from the kernel's own
//! accounting of scheduling health (`spec.rollout.analysis`). Pure; the agents sample, the
//! controller keeps each node's samples, the rollout freezes a wave's window before its switch
//! ([`freeze`]) and asks [`judge`] once that wave has baked.
//!
//! How a verdict is reached, and why:
//! - **Changes, not levels.** Nodes differ (hardware, tenants, load): a busy node is not a
//!   broken one. Each node is compared with itself: its change is the median of a signal over
//!   the bake against the median over the window before its switch (frozen when its old pod
//!   was deleted and kept in the rollout's status, so neither a forgetting buffer nor a new
//!   leader loses it). The control nodes (the Scheduler's nodes outside the wave, on another
//!   revision) change over the same two clock ranges; what moved them (traffic, the hour) moved
//!   the wave too, so a node's **excess** is its change less the controls' median change.
//! - **A node fails a signal** when its excess is past the limit and outside the controls'
//!   spread: past `z` robust standard deviations of the controls' changes, `z` the normal
//!   quantile of 1 - p/m for m signals judged, p set by the wave's size and quorum so that a
//!   wave with no real change fails at most 1 time in 200 (binomially; the Bonferroni
//!   correction over signals keeps more signals from making a false failure likelier). A node **fails its wave alone** past `criticalFactor`
//!   times its limit, or when an event counter the spec names runs over its limit.
//! - **A wave fails** when at least `failedNodesPercent` of its judged nodes fail (and at least
//!   one): on a large wave a few nodes always look worse by chance; a regression shows on many.
//!   The false-rollback and detection rates of these rules on a simulated uneven fleet are in
//!   `simulation.rs` and docs/rollouts.md.
//! - **Fail closed.** A node that reported before its switch and sends nothing after fails (a
//!   scheduler that starves its agent must not pass by silence); too few samples, too few
//!   controls or no window before the switch make the wave Inconclusive, which pauses the
//!   rollout unless the spec says Proceed; an event counter the kernel does not count holds it
//!   with an error. Nodes that ran the kernel's default scheduler before (a first deployment,
//!   nodes taken over) had no agent and no window: they are not judged by change.
//! - Each wave is judged once, at the end of its bake; only its own nodes are judged.
//! - **The pods' CPU contract** (`cpuContract`): one wave node that ran a pod over its CPU limit
//!   during the bake, or whose scheduler lacks the callback its pods' limits or requests need,
//!   fails the wave alone: a pod measured over its limit is a proof, not a noisy level. A node
//!   whose agent did not say leaves it Inconclusive ([`contract`]).

mod baseline;
mod contract;
mod judge;
mod signal;
mod stats;

#[cfg(test)]
mod simulation;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use sked_api::{AnalysisSpec, OnInconclusive};

pub use baseline::{MAX_CONTROL_BASELINES, MAX_WAVE_BASELINES, PRE_WINDOW_SECONDS, freeze, merge};
pub use judge::{Case, Doubt, Judgement, Outcome, judge};
pub use signal::Signal;
pub use stats::{median, summary};

pub const DEFAULT_INCREASE_PERCENT: i32 = 50;
pub const DEFAULT_POINTS: i32 = 10;
pub const DEFAULT_MIN_SAMPLES: i32 = 5;
pub const DEFAULT_MIN_CONTROL_NODES: i32 = 3;
pub const DEFAULT_FAILED_NODES_PERCENT: i32 = 20;
pub const DEFAULT_CRITICAL_FACTOR: i32 = 3;
/// How long past the end of a bake the verdict waits for a node's samples (they come with the
/// agents' heartbeats) before it judges without them.
pub const SAMPLE_GRACE_SECONDS: i64 = 60;
/// Most nodes listed in a verdict (`status.rollout.analysis.nodes`).
pub const MAX_LISTED_NODES: usize = 10;
/// The chance that a wave with no real change fails: each node's spread bound is set so that,
/// with the wave's size, its quorum and its controls, no more than this share of such waves
/// reach it (see [`Limits::spread_z`]).
pub const WAVE_ALPHA: f64 = 0.005;

/// Thresholds [`Limits::spread_z`] found, by (judged, quorum, controls, signals): a few
/// milliseconds each to find, and a fleet's waves ask for the same few again and again.
const SPREAD_Z_MEMO: usize = 1024;
type SpreadKey = (usize, usize, usize, usize);
thread_local! {
    static SPREAD_Z: std::cell::RefCell<std::collections::HashMap<SpreadKey, f64>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// A node's scheduling health over one sampling interval, as its agent measured it. A signal
/// the node does not give is `None`, never zero.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// End of the interval, milliseconds since the Unix epoch, on the controller's clock.
    pub at_ms: i64,
    /// Length of the interval, milliseconds.
    pub interval_ms: i64,
    /// Tasks waiting for a CPU, per CPU.
    pub waiting_per_cpu: Option<f64>,
    /// Share of the CPUs' time spent running tasks, 0 to 1.
    pub utilisation: Option<f64>,
    /// Timeslices per CPU-second.
    pub switches_per_cpu_second: Option<f64>,
    /// CPUs idle while tasks waited, per CPU, 0 to 1.
    pub idle_while_waiting: Option<f64>,
    /// Mean run-queue wait per timeslice, microseconds.
    pub run_delay_us: Option<f64>,
    /// CPU pressure ("some"), percent of wall time.
    pub cpu_pressure: Option<f64>,
    /// Rates per second of the sched_ext event counters that moved (the others ran at 0);
    /// `None` when the counters were not known.
    pub events: Option<BTreeMap<String, f64>>,
}

impl Sample {
    /// Whether the whole interval of the sample lies in `from..=to` (ms).
    pub fn within(&self, from_ms: i64, to_ms: i64) -> bool {
        self.at_ms.saturating_sub(self.interval_ms.max(0)) >= from_ms && self.at_ms <= to_ms
    }
}

/// What the controller keeps of one node's health.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeHealth {
    /// Its samples, oldest first.
    pub samples: Vec<Sample>,
    /// The event counter names its kernel counts, as its agent last read them (empty: not
    /// known, e.g. an agent that does not send them).
    pub counters: Vec<String>,
    /// The pods' CPU contract as its agent reported it, each with when it was received (ms,
    /// controller clock), oldest first: a new entry only when it differs from the last.
    pub contracts: Vec<(i64, crate::cpu_contract::NodeCpuContract)>,
}

/// An event counter's limit.
#[derive(Clone, Debug, PartialEq)]
pub struct EventRule {
    pub name: String,
    /// Most counts per second, or for a duration counter (nanoseconds) most percent of time.
    pub limit: f64,
    pub share_of_time: bool,
}

/// `spec.rollout.analysis` with its defaults filled in.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// The signals judged, each with its limit in the spec's unit (percent or points).
    pub signals: Vec<(Signal, f64)>,
    pub events: Vec<EventRule>,
    pub min_samples: usize,
    pub min_control_nodes: usize,
    /// Share (0 to 1) of a wave's judged nodes that must fail before the wave fails.
    pub failed_nodes: f64,
    pub critical_factor: f64,
    pub proceed_on_inconclusive: bool,
    /// Judge the pods' CPU contract of the wave's nodes too (`cpuContract`).
    pub cpu_contract: bool,
}

impl Limits {
    /// The limits a spec sets; with no signal named, waiting tasks, idle CPUs beside waiting
    /// tasks and CPU pressure at their defaults.
    pub fn of(spec: &AnalysisSpec) -> Self {
        let percent = |l: &sked_api::IncreasePercent| l.max_increase_percent.unwrap_or(DEFAULT_INCREASE_PERCENT);
        let points = |l: &sked_api::IncreasePoints| l.max_increase_points.unwrap_or(DEFAULT_POINTS);
        let named: Vec<(Signal, i32)> = [
            (Signal::WaitingTasks, spec.waiting_tasks.as_ref().map(percent)),
            (Signal::IdleWhileWaiting, spec.idle_while_waiting.as_ref().map(points)),
            (Signal::Utilisation, spec.utilisation.as_ref().map(|l| l.max_decrease_points.unwrap_or(DEFAULT_POINTS))),
            (Signal::SwitchRate, spec.switch_rate.as_ref().map(percent)),
            (Signal::RunDelay, spec.run_delay.as_ref().map(percent)),
            (Signal::CpuPressure, spec.cpu_pressure.as_ref().map(points)),
        ]
        .into_iter()
        .filter_map(|(s, l)| Some((s, l?)))
        .collect();
        let signals = if named.is_empty() && spec.events.is_empty() {
            vec![
                (Signal::WaitingTasks, DEFAULT_INCREASE_PERCENT),
                (Signal::IdleWhileWaiting, DEFAULT_POINTS),
                (Signal::CpuPressure, DEFAULT_POINTS),
            ]
        } else {
            named
        };
        let count = |n: Option<i32>, default: i32| usize::try_from(n.unwrap_or(default).max(1)).unwrap_or(1);
        Self {
            signals: signals.into_iter().map(|(s, l)| (s, f64::from(l))).collect(),
            events: spec
                .events
                .iter()
                .map(|e| EventRule {
                    name: e.name.clone(),
                    limit: e
                        .max_percent_of_time
                        .map(f64::from)
                        .or(e.max_per_second.map(|r| r as f64))
                        .unwrap_or(0.0)
                        .max(0.0),
                    share_of_time: e.max_percent_of_time.is_some(),
                })
                .collect(),
            min_samples: count(spec.min_samples, DEFAULT_MIN_SAMPLES),
            min_control_nodes: usize::try_from(spec.min_control_nodes.unwrap_or(DEFAULT_MIN_CONTROL_NODES).max(0))
                .unwrap_or(0),
            failed_nodes: f64::from(spec.failed_nodes_percent.unwrap_or(DEFAULT_FAILED_NODES_PERCENT).clamp(1, 100))
                / 100.0,
            critical_factor: f64::from(spec.critical_factor.unwrap_or(DEFAULT_CRITICAL_FACTOR).max(2)),
            proceed_on_inconclusive: spec.on_inconclusive == Some(OnInconclusive::Proceed),
            cpu_contract: spec.cpu_contract == Some(true),
        }
    }

    /// How many robust standard deviations of the controls' changes a node's excess must pass
    /// in a wave of `judged` nodes whose quorum is `quorum`, read against the median change of
    /// `controls` nodes: the smallest that keeps the chance of a quorum failing by chance
    /// within [`WAVE_ALPHA`], each node failing by chance with m x P(Z > z) for the m signals
    /// judged, and every node read against the same median, an estimate whose standard error
    /// is 1.2533 / sqrt(controls) of their spread ([`stats::shared_centre_tail`]).
    pub fn spread_z(&self, judged: usize, quorum: usize, controls: usize) -> f64 {
        let key = (judged.max(1), quorum.max(1), controls, self.signals.len().max(1));
        SPREAD_Z.with(|memo| {
            let mut memo = memo.borrow_mut();
            if let Some(z) = memo.get(&key) {
                return *z;
            }
            let (judged, quorum, controls, m) = key;
            let s = if controls == 0 { 0.0 } else { 1.2533 / (controls as f64).sqrt() };
            let z = stats::shared_centre_z(judged, quorum, m as f64, WAVE_ALPHA, s);
            if memo.len() >= SPREAD_Z_MEMO {
                memo.clear();
            }
            memo.insert(key, z);
            z
        })
    }

    /// How many of `judged` nodes must fail before their wave does.
    pub fn quorum(&self, judged: usize) -> usize {
        ((self.failed_nodes * judged as f64).ceil() as usize).max(1)
    }
}
