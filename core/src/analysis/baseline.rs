//! The window before a wave's switch, frozen when its old pods are deleted: each wave node's
//! summary of it, and the control nodes' over the same clock range.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sked_api::{NodeBaseline, SignalSummary, WaveBaseline};

use super::{Limits, NodeHealth, Sample, stats};

/// How far back the window before a switch reaches (the controller keeps fewer samples than
/// that at short agent intervals: then the window is what it keeps).
pub const PRE_WINDOW_SECONDS: i64 = 300;
/// Most wave nodes whose window is kept: a larger wave is judged on this many of its nodes,
/// spread over it by a hash of their names (status stays small).
pub const MAX_WAVE_BASELINES: usize = 256;
/// Most control nodes whose window is kept, chosen the same way.
pub const MAX_CONTROL_BASELINES: usize = 200;

/// The baseline of a wave switched at `taken_at` (its old pods deleted now): the summaries of
/// the window before it, of the wave's nodes and of the control nodes, over the same clock
/// range, for the signals `limits` judges. Each control is given with when its scheduler
/// attached (ms): its window starts no earlier, so it is under one scheduler (a node of an
/// earlier wave is a control too: it does not switch in this one). Nodes without a sample
/// there are left out.
pub fn freeze(
    limits: &Limits,
    revision: &str,
    taken_at: Time,
    wave: &[&str],
    controls: &[(&str, i64)],
    health: &BTreeMap<String, NodeHealth>,
) -> WaveBaseline {
    let to_ms = taken_at.0.as_millisecond();
    let window_from = to_ms.saturating_sub(PRE_WINDOW_SECONDS * 1000);
    let since: BTreeMap<&str, i64> = controls.iter().copied().collect();
    let summarise = |node: &str, control: bool| {
        let samples = &health.get(node)?.samples;
        let from_ms = since.get(node).map_or(window_from, |s| window_from.max(*s));
        let signals: BTreeMap<String, SignalSummary> = limits
            .signals
            .iter()
            .filter_map(|(signal, _)| {
                let values: Vec<f64> = window(samples, from_ms, to_ms).filter_map(|s| signal.of(s)).collect();
                Some((signal.key().to_owned(), stats::summary(values)?))
            })
            .collect();
        (!signals.is_empty()).then(|| NodeBaseline { node: node.to_owned(), control, signals })
    };
    let mut nodes: Vec<NodeBaseline> = spread(wave, MAX_WAVE_BASELINES, |n| summarise(n, false));
    let controls: Vec<&str> = controls.iter().map(|(n, _)| *n).collect();
    nodes.extend(spread(&controls, MAX_CONTROL_BASELINES, |n| summarise(n, true)));
    WaveBaseline { revision: revision.to_owned(), taken_at, window_seconds: PRE_WINDOW_SECONDS, nodes }
}

/// The baseline of a wave whose pods are replaced over more than one reconcile (a delete that
/// failed and is tried again): the nodes frozen before keep their window, the new ones add
/// theirs, the controls stay those chosen first.
pub fn merge(previous: &WaveBaseline, fresh: WaveBaseline) -> WaveBaseline {
    let wave_count = previous.nodes.iter().filter(|n| !n.control).count();
    let known = |n: &NodeBaseline| previous.nodes.iter().any(|p| !p.control && p.node == n.node);
    let added: Vec<NodeBaseline> = fresh
        .nodes
        .into_iter()
        .filter(|n| !n.control && !known(n))
        .take(MAX_WAVE_BASELINES.saturating_sub(wave_count))
        .collect();
    // A node that joins the wave is no longer a control.
    let mut nodes: Vec<NodeBaseline> =
        previous.nodes.iter().filter(|p| !(p.control && added.iter().any(|a| a.node == p.node))).cloned().collect();
    nodes.extend(added);
    nodes.sort_by(|a, b| (a.control, &a.node).cmp(&(b.control, &b.node)));
    WaveBaseline { nodes, ..previous.clone() }
}

/// The samples whose whole interval lies in `from..=to`.
pub(super) fn window(samples: &[Sample], from_ms: i64, to_ms: i64) -> impl Iterator<Item = &Sample> {
    samples.iter().filter(move |s| s.within(from_ms, to_ms))
}

/// Up to `most` of `nodes` that `keep` keeps, in the order of a hash of their names (a sample
/// spread over the fleet whatever its naming), sorted by name.
fn spread<T>(nodes: &[&str], most: usize, keep: impl Fn(&str) -> Option<T>) -> Vec<T>
where
    T: Named,
{
    let mut order: Vec<&str> = nodes.to_vec();
    order.sort_by_key(|n| (fnv1a(n), *n));
    order.dedup();
    let mut kept: Vec<T> = order.into_iter().filter_map(keep).take(most).collect();
    kept.sort_by(|a, b| a.name().cmp(b.name()));
    kept
}

/// Something with a node's name.
pub(super) trait Named {
    fn name(&self) -> &str;
}

impl Named for NodeBaseline {
    fn name(&self) -> &str {
        &self.node
    }
}

/// FNV-1a of a name: a stable order that does not follow the names' own (std's hasher may
/// change between Rust releases, and two replicas must choose the same nodes).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}
