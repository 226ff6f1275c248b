//! Analysis: whether a bake hurt the work the nodes run, judged from the kernel's own accounting
//! of scheduling health (`spec.rollout.analysis`). Pure; the agents sample, the controller keeps
//! each node's samples, the rollout asks [`judge`] at the end of each bake.
//!
//! The statistics, and why:
//! - A node's value for a window is the **median** of its samples there: one stalled second (a
//!   cron job, a page-cache flush) moves a mean, not a median, and fewer than half of the
//!   samples can be anything without moving it past the others.
//! - Two baselines: the **control** nodes (the Scheduler's nodes outside the wave, on another
//!   revision, over the same window), whose baseline is the median of their medians; and the
//!   node's **own** newest samples from before its switch. Controls see the same hour of the
//!   same traffic; the node's own window sees the same hardware and the same tenants.
//! - A node fails a signal only when it is over the limit against **every** baseline there is:
//!   a fleet-wide rise (traffic) lifts the controls too, and a node whose tenants changed at its
//!   switch still has to stand out from its peers. A false rollback costs a retry by hand; a
//!   regression this lets through on one node shows on the next wave's.
//! - No verdict from too little: a node needs `minSamples` samples in a window, the controls
//!   `minControlNodes` such nodes. A node without enough samples is waited for, up to
//!   [`SAMPLE_GRACE_SECONDS`] past its bake; a signal without any baseline is not judged. A bake
//!   where some node had nothing to be judged on is Inconclusive, and the rollout goes on: the
//!   analysis adds a reason to stop, never a reason to wait for good.

use std::collections::BTreeMap;

use sked_api::{AnalysisSpec, AnalysisVerdict, NodeAnalysis};

pub const DEFAULT_RUN_DELAY_PERCENT: i32 = 50;
pub const DEFAULT_PRESSURE_POINTS: i32 = 10;
pub const DEFAULT_MIN_SAMPLES: i32 = 5;
pub const DEFAULT_MIN_CONTROL_NODES: i32 = 3;
/// A rise of run delay smaller than this (microseconds per timeslice) never fails a node: on a
/// mostly idle node a timeslice waits a few microseconds, and half of nothing is noise.
pub const MIN_RUN_DELAY_RISE_US: f64 = 50.0;
/// The node's own baseline: at most its newest this many samples from before its switch.
pub const OWN_BASELINE_SAMPLES: usize = 60;
/// How long past the end of a bake the verdict waits for a node's samples (they come with the
/// agents' heartbeats) before it judges without them.
pub const SAMPLE_GRACE_SECONDS: i64 = 60;
/// Most nodes listed in a verdict (`status.rollout.analysis.nodes`).
pub const MAX_LISTED_NODES: usize = 10;

/// A node's scheduling health over one sampling interval, as its agent measured it. A signal
/// the node does not give is `None`, never zero.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// End of the interval, milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// Mean run-queue wait per timeslice, microseconds.
    pub run_delay_us: Option<f64>,
    /// CPU pressure ("some"), percent of wall time.
    pub cpu_pressure: Option<f64>,
    /// Rates per second of the sched_ext event counters that moved (the others ran at 0);
    /// `None` when the counters were not known.
    pub events: Option<BTreeMap<String, f64>>,
}

/// `spec.rollout.analysis` with its defaults filled in.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    pub run_delay_percent: Option<f64>,
    pub pressure_points: Option<f64>,
    /// Event counter name and its most counts per second.
    pub events: Vec<(String, f64)>,
    pub min_samples: usize,
    pub min_control_nodes: usize,
}

impl Limits {
    /// The limits a spec sets; with no signal named, run delay and CPU pressure at their
    /// defaults.
    pub fn of(spec: &AnalysisSpec) -> Self {
        let none = spec.run_delay.is_none() && spec.cpu_pressure.is_none() && spec.events.is_empty();
        let percent = spec.run_delay.as_ref().map(|r| r.max_increase_percent.unwrap_or(DEFAULT_RUN_DELAY_PERCENT));
        let points = spec.cpu_pressure.as_ref().map(|p| p.max_increase_points.unwrap_or(DEFAULT_PRESSURE_POINTS));
        let (percent, points) =
            if none { (Some(DEFAULT_RUN_DELAY_PERCENT), Some(DEFAULT_PRESSURE_POINTS)) } else { (percent, points) };
        let count = |n: Option<i32>, default: i32| usize::try_from(n.unwrap_or(default).max(1)).unwrap_or(1);
        Self {
            run_delay_percent: percent.map(f64::from),
            pressure_points: points.map(f64::from),
            events: spec.events.iter().map(|e| (e.name.clone(), e.max_per_second.max(0) as f64)).collect(),
            min_samples: count(spec.min_samples, DEFAULT_MIN_SAMPLES),
            min_control_nodes: count(spec.min_control_nodes, DEFAULT_MIN_CONTROL_NODES),
        }
    }
}

/// A node of the revision being rolled out, attached.
#[derive(Clone, Debug)]
pub struct WaveNode<'a> {
    pub node: &'a str,
    /// When its switch began (its pod of the revision was made), ms: its own baseline ends here.
    pub switched_at_ms: i64,
    pub samples: &'a [Sample],
}

/// One bake to judge.
#[derive(Clone, Debug)]
pub struct Case<'a> {
    pub revision: &'a str,
    pub limits: &'a Limits,
    /// The window: from when the newest node of the wave attached, to now (ms).
    pub from_ms: i64,
    pub to_ms: i64,
    pub wave: Vec<WaveNode<'a>>,
    /// The samples of each control node.
    pub controls: Vec<&'a [Sample]>,
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

/// A verdict, with what it rests on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judgement {
    pub verdict: AnalysisVerdict,
    pub message: String,
    /// The nodes judged, failed first, at most [`MAX_LISTED_NODES`].
    pub nodes: Vec<NodeAnalysis>,
    /// The node that failed the revision, and why (when the verdict is Failed).
    pub failure: Option<(String, String)>,
}

/// A signal compared with its baselines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Signal {
    RunDelay,
    CpuPressure,
}

impl Signal {
    fn of(self, s: &Sample) -> Option<f64> {
        match self {
            Signal::RunDelay => s.run_delay_us,
            Signal::CpuPressure => s.cpu_pressure,
        }
        .filter(|v| v.is_finite() && *v >= 0.0)
    }

    fn name(self) -> &'static str {
        match self {
            Signal::RunDelay => "run delay",
            Signal::CpuPressure => "CPU pressure",
        }
    }

    fn show(self, v: f64) -> String {
        match self {
            Signal::RunDelay => duration_us(v),
            Signal::CpuPressure => format!("{v:.1} %"),
        }
    }

    /// Whether `value` is over `limit` against `baseline`, and by how much, in the limit's unit.
    fn rise(self, value: f64, baseline: f64, limit: f64) -> (bool, f64) {
        match self {
            Signal::RunDelay => {
                let rise = value - baseline;
                let percent = if baseline > 0.0 { rise / baseline * 100.0 } else { f64::INFINITY };
                (rise >= MIN_RUN_DELAY_RISE_US && percent > limit, percent)
            }
            Signal::CpuPressure => (value - baseline > limit, value - baseline),
        }
    }

    fn limit_text(self, limit: f64) -> String {
        match self {
            Signal::RunDelay => format!("{limit:.0} % (spec.rollout.analysis.runDelay.maxIncreasePercent)"),
            Signal::CpuPressure => format!("{limit:.0} points (spec.rollout.analysis.cpuPressure.maxIncreasePoints)"),
        }
    }

    fn rise_text(self, rise: f64) -> String {
        match self {
            Signal::RunDelay if rise.is_finite() => format!("{rise:.0} %"),
            Signal::RunDelay => "from nothing".to_owned(),
            Signal::CpuPressure => format!("{rise:.1} points"),
        }
    }
}

/// A duration in microseconds, in the unit that reads best.
fn duration_us(us: f64) -> String {
    if us >= 1_000_000.0 {
        format!("{:.2} s", us / 1_000_000.0)
    } else if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}

/// The median of `values` (none when empty).
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    values.retain(|v| v.is_finite());
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 })
}

fn in_window(samples: &[Sample], from_ms: i64, to_ms: i64) -> impl Iterator<Item = &Sample> {
    samples.iter().filter(move |s| s.at_ms > from_ms && s.at_ms <= to_ms)
}

/// The median of a signal over the samples in `from..=to`, from at least `min` values.
fn window_median(samples: &[Sample], signal: Signal, from_ms: i64, to_ms: i64, min: usize) -> Option<f64> {
    let values: Vec<f64> = in_window(samples, from_ms, to_ms).filter_map(|s| signal.of(s)).collect();
    if values.len() < min { None } else { median(values) }
}

/// A signal's baselines: the controls' median of medians (and how many), and the node's own.
#[derive(Clone, Copy, Debug)]
struct Baselines {
    control: Option<(f64, usize)>,
    own: Option<f64>,
}

fn control_baseline(case: &Case<'_>, signal: Signal) -> Option<(f64, usize)> {
    let min = case.limits.min_samples;
    let medians: Vec<f64> =
        case.controls.iter().filter_map(|c| window_median(c, signal, case.from_ms, case.to_ms, min)).collect();
    let count = medians.len();
    if count < case.limits.min_control_nodes { None } else { median(medians).map(|m| (m, count)) }
}

fn own_baseline(node: &WaveNode<'_>, signal: Signal, min: usize) -> Option<f64> {
    let before: Vec<f64> =
        node.samples.iter().filter(|s| s.at_ms < node.switched_at_ms).filter_map(|s| signal.of(s)).collect();
    let newest = &before[before.len().saturating_sub(OWN_BASELINE_SAMPLES)..];
    if newest.len() < min { None } else { median(newest.to_vec()) }
}

/// A signal the spec judges, its limit, and its control baseline (the median of the control
/// nodes' medians, and how many).
type Judged = (Signal, f64, Option<(f64, usize)>);

/// One node's judgement of one signal.
struct Measured {
    signal: Signal,
    value: Option<f64>,
    baselines: Baselines,
    /// Over the limit against every baseline there is (and there is one): the cause.
    failed: Option<String>,
}

fn measure(
    case: &Case<'_>,
    node: &WaveNode<'_>,
    signal: Signal,
    limit: f64,
    control: Option<(f64, usize)>,
) -> Measured {
    let min = case.limits.min_samples;
    let value = window_median(node.samples, signal, case.from_ms, case.to_ms, min);
    let baselines = Baselines { control, own: own_baseline(node, signal, min) };
    let mut measured = Measured { signal, value, baselines, failed: None };
    let Some(v) = value else { return measured };
    let against: Vec<(f64, String)> = [
        control.map(|(b, n)| (b, format!("a median of {} over {n} control nodes", signal.show(b)))),
        baselines.own.map(|b| (b, format!("{} on the node before its switch", signal.show(b)))),
    ]
    .into_iter()
    .flatten()
    .collect();
    let rises: Vec<(bool, f64)> = against.iter().map(|(b, _)| signal.rise(v, *b, limit)).collect();
    if !against.is_empty() && rises.iter().all(|(over, _)| *over) {
        let over: Vec<String> = against
            .iter()
            .zip(&rises)
            .map(|((_, what), (_, r))| format!("{} over {what}", signal.rise_text(*r)))
            .collect();
        measured.failed = Some(format!(
            "{} on {} rose to {} ({}) during the bake of revision {}; the limit is {}",
            signal.name(),
            node.node,
            signal.show(v),
            over.join(", and "),
            case.revision,
            signal.limit_text(limit)
        ));
    }
    measured
}

impl Measured {
    fn judged(&self) -> bool {
        self.value.is_some() && (self.baselines.control.is_some() || self.baselines.own.is_some())
    }

    fn detail(&self) -> String {
        let show = |v: Option<f64>| v.map_or_else(|| "none".to_owned(), |v| self.signal.show(v));
        let value = self.value.map_or_else(|| "too few samples".to_owned(), |v| self.signal.show(v));
        let control = match self.baselines.control {
            Some((b, n)) => format!("control {} over {n} nodes", self.signal.show(b)),
            None => "no control nodes".to_owned(),
        };
        format!("{} {value} ({control}; before its switch {})", self.signal.name(), show(self.baselines.own))
    }
}

/// An event counter's median rate over the bake against its limit: the cause when it is over,
/// and a detail; `None` when the node's counters are not known.
fn event_rate(case: &Case<'_>, node: &WaveNode<'_>, name: &str, limit: f64) -> Option<(Option<String>, String)> {
    let rates: Vec<f64> = in_window(node.samples, case.from_ms, case.to_ms)
        .filter_map(|s| s.events.as_ref())
        .map(|e| e.get(name).copied().filter(|r| r.is_finite() && *r >= 0.0).unwrap_or(0.0))
        .collect();
    if rates.len() < case.limits.min_samples {
        return None;
    }
    let rate = median(rates)?;
    let detail = format!("{name} {rate:.1}/s");
    let cause = (rate > limit).then(|| {
        format!(
            "{name} on {} ran at {rate:.1}/s (median over the bake of revision {}); the limit is {limit:.0}/s (spec.rollout.analysis.events)",
            node.node, case.revision
        )
    });
    Some((cause, detail))
}

/// One wave node's verdict: its causes (if it failed), whether anything judged it, its detail.
fn judge_node(case: &Case<'_>, node: &WaveNode<'_>, controls: &[Judged]) -> (Vec<String>, bool, String) {
    let mut causes = Vec::new();
    let mut judged = false;
    let mut details = Vec::new();
    for &(signal, limit, control) in controls {
        let m = measure(case, node, signal, limit, control);
        judged |= m.judged();
        details.push(m.detail());
        causes.extend(m.failed);
    }
    for (name, limit) in &case.limits.events {
        if let Some((cause, detail)) = event_rate(case, node, name, *limit) {
            judged = true;
            details.push(detail);
            causes.extend(cause);
        }
    }
    (causes, judged, capped(&details.join("; ")))
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

/// Judges one bake: the wave's nodes against the controls and their own past.
pub fn judge(case: &Case<'_>) -> Outcome {
    let min = case.limits.min_samples;
    let short = |n: &WaveNode<'_>| in_window(n.samples, case.from_ms, case.to_ms).count() < min;
    if case.may_wait && case.wave.iter().any(short) {
        return Outcome::Waiting;
    }
    let signals: Vec<Judged> =
        [(Signal::RunDelay, case.limits.run_delay_percent), (Signal::CpuPressure, case.limits.pressure_points)]
            .into_iter()
            .filter_map(|(s, limit)| Some((s, limit?, control_baseline(case, s))))
            .collect();
    let mut failed = Vec::new();
    let mut passed = Vec::new();
    let mut unjudged = Vec::new();
    for node in &case.wave {
        let (causes, judged, detail) = judge_node(case, node, &signals);
        match causes.into_iter().next() {
            Some(cause) => failed.push((node.node.to_owned(), cause, detail)),
            None if judged => passed.push((node.node.to_owned(), detail)),
            None => unjudged.push((node.node.to_owned(), detail)),
        }
    }
    Outcome::Judged(verdict(case, failed, passed, unjudged))
}

fn verdict(
    case: &Case<'_>,
    failed: Vec<(String, String, String)>,
    passed: Vec<(String, String)>,
    unjudged: Vec<(String, String)>,
) -> Judgement {
    let entry =
        |node: &String, verdict, detail: &String| NodeAnalysis { node: node.clone(), verdict, detail: detail.clone() };
    let nodes: Vec<NodeAnalysis> = failed
        .iter()
        .map(|(n, _, d)| entry(n, AnalysisVerdict::Failed, d))
        .chain(unjudged.iter().map(|(n, d)| entry(n, AnalysisVerdict::Inconclusive, d)))
        .chain(passed.iter().map(|(n, d)| entry(n, AnalysisVerdict::Passed, d)))
        .take(MAX_LISTED_NODES)
        .collect();
    let total = failed.len() + passed.len() + unjudged.len();
    if let Some((node, cause, _)) = failed.first() {
        let message = format!("{} of {total} node(s) failed: {cause}", failed.len());
        return Judgement {
            verdict: AnalysisVerdict::Failed,
            message,
            nodes,
            failure: Some((node.clone(), cause.clone())),
        };
    }
    if !unjudged.is_empty() {
        let names: Vec<&str> = unjudged.iter().map(|(n, _)| n.as_str()).take(5).collect();
        let message = format!(
            "{} of {total} node(s) could not be judged (too few samples, or no baseline: fewer than {} control nodes with {} samples and too few samples from before the switch): {}; the rollout goes on",
            unjudged.len(),
            case.limits.min_control_nodes,
            case.limits.min_samples,
            names.join(", ")
        );
        return Judgement { verdict: AnalysisVerdict::Inconclusive, message, nodes, failure: None };
    }
    let message = format!("{total} node(s) within every limit during the bake of revision {}", case.revision);
    Judgement { verdict: AnalysisVerdict::Passed, message, nodes, failure: None }
}

#[cfg(test)]
mod tests;
