//! Each node's scheduling-health samples, as its agents sent them: what the analysis of a bake
//! reads (`sked_core::analysis`). Filled by the reports server beside the kernel table, for the
//! nodes of Schedulers that ask for analysis; read by their reconciles. A sample never wakes a reconcile: the
//! rollout asks at the end of each bake.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use sked_core::analysis::{NodeHealth, Sample};
use sked_core::cpu_contract::NodeCpuContract;
use sked_proto::{Health, HealthSample};

use crate::mutex::lock;

/// Samples kept per node: about 10 minutes at the agents' default interval (5 s), 2 at 1 s.
/// The controller's memory for them grows with the fleet: 56 bytes a sample ([`Kept`]), 7 KiB a
/// node once full, 35 MiB for 5,000 nodes (only for the nodes of Schedulers with analysis).
pub const SAMPLES_PER_NODE: usize = 128;
/// Most event counters kept per sample (the kernel has about a dozen), and most counter names
/// kept per node.
const MAX_EVENTS: usize = 32;
/// A sample from further ahead of the controller's clock than this, once rebased, is refused:
/// it would hold back every later one.
const MAX_AHEAD_MS: i64 = 60 * 1000;
/// The longest sampling interval believed (an agent's --health-interval is seconds).
const MAX_INTERVAL_MS: i64 = 10 * 60 * 1000;

/// Health samples by node, oldest first, and the counter names each node's kernel counts.
#[derive(Debug, Default)]
pub struct HealthTable {
    nodes: Mutex<HashMap<String, Node>>,
}

#[derive(Debug, Default)]
struct Node {
    samples: VecDeque<Kept>,
    counters: Box<[Box<str>]>,
    /// The pods' CPU contract as reported, each when received: a new entry only when it differs.
    contracts: VecDeque<(i64, NodeCpuContract)>,
}

/// Contract entries kept per node: one per change, so a few bakes' worth.
const CONTRACTS_PER_NODE: usize = 16;

/// Event counters that moved, and their rates.
type Rates = Box<[(Box<str>, f32)]>;

/// A sample as the table keeps it: single precision, NaN for unknown, event rates only when
/// some counter moved.
#[derive(Clone, Debug, PartialEq)]
struct Kept {
    at_ms: i64,
    interval_ms: u32,
    values: [f32; 6],
    /// `None`: the counters were not known; `Some` of nothing: known, and none moved.
    events: Option<Rates>,
}

impl Kept {
    fn of(s: &Sample) -> Self {
        let narrow = |v: Option<f64>| v.map_or(f32::NAN, |v| v as f32);
        Self {
            at_ms: s.at_ms,
            interval_ms: u32::try_from(s.interval_ms.clamp(0, MAX_INTERVAL_MS)).unwrap_or(0),
            values: [
                narrow(s.waiting_per_cpu),
                narrow(s.utilisation),
                narrow(s.switches_per_cpu_second),
                narrow(s.idle_while_waiting),
                narrow(s.run_delay_us),
                narrow(s.cpu_pressure),
            ],
            events: s.events.as_ref().map(|e| e.iter().map(|(n, r)| (n.as_str().into(), *r as f32)).collect()),
        }
    }

    fn sample(&self) -> Sample {
        let wide = |v: f32| (!v.is_nan()).then_some(f64::from(v));
        let [waiting, utilisation, switches, idle, run_delay, pressure] = self.values;
        Sample {
            at_ms: self.at_ms,
            interval_ms: i64::from(self.interval_ms),
            waiting_per_cpu: wide(waiting),
            utilisation: wide(utilisation),
            switches_per_cpu_second: wide(switches),
            idle_while_waiting: wide(idle),
            run_delay_us: wide(run_delay),
            cpu_pressure: wide(pressure),
            events: self.events.as_ref().map(|e| e.iter().map(|(n, r)| (n.to_string(), f64::from(*r))).collect()),
        }
    }
}

impl HealthTable {
    /// Keeps the samples of `health` newer than the node's newest (a report repeats the
    /// previous one's), after checking each: a value that is not a finite, non-negative
    /// number, or an event name that is not a sched_ext counter's, is dropped. Sample times are
    /// rebased on the controller's clock: shifted by the difference between `now_ms` (when the
    /// report arrived) and when the agent sent it, so every node's windows are on one clock.
    pub fn record(&self, node: &str, health: &Health, now_ms: i64) -> usize {
        let offset = if health.sent_unix_ms > 0 { now_ms.saturating_sub(health.sent_unix_ms) } else { 0 };
        let mut nodes = lock(&self.nodes);
        let entry = nodes.entry(node.to_owned()).or_default();
        if !health.event_names.is_empty() {
            entry.counters = health
                .event_names
                .iter()
                .filter(|n| sched_ext_counter(n))
                .take(MAX_EVENTS)
                .map(|n| n.as_str().into())
                .collect();
        }
        let samples = &mut entry.samples;
        let mut newest = samples.back().map_or(i64::MIN, |s| s.at_ms);
        let mut added = 0;
        for wire in &health.samples {
            let at = wire.time_unix_ms.saturating_add(offset);
            if at <= newest || at > now_ms.saturating_add(MAX_AHEAD_MS) {
                continue;
            }
            newest = at;
            samples.push_back(Kept::of(&Sample { at_ms: at, ..sample_of(wire) }));
            added += 1;
        }
        while samples.len() > SAMPLES_PER_NODE {
            samples.pop_front();
        }
        added
    }

    /// Keeps the pods' CPU contract `contract` of `node`, received at `now_ms`, when it tells
    /// another fact than the last one kept (`NodeCpuContract::same_fact_as`): the numbers every
    /// window moves make no new entry, so the entries span many bakes.
    pub fn record_contract(&self, node: &str, contract: &NodeCpuContract, now_ms: i64) {
        let mut nodes = lock(&self.nodes);
        let kept = &mut nodes.entry(node.to_owned()).or_default().contracts;
        if kept.back().is_some_and(|(_, last)| last.same_fact_as(contract)) {
            return;
        }
        kept.push_back((now_ms, contract.clone()));
        while kept.len() > CONTRACTS_PER_NODE {
            kept.pop_front();
        }
    }

    /// The samples and counter names of `nodes`, copied under one lock.
    pub fn samples_of<'a>(&self, nodes: impl IntoIterator<Item = &'a String>) -> BTreeMap<String, NodeHealth> {
        let table = lock(&self.nodes);
        nodes
            .into_iter()
            .filter_map(|n| {
                let node = table.get(n)?;
                Some((
                    n.clone(),
                    NodeHealth {
                        samples: node.samples.iter().map(Kept::sample).collect(),
                        counters: node.counters.iter().map(|c| c.to_string()).collect(),
                        contracts: node.contracts.iter().cloned().collect(),
                    },
                ))
            })
            .collect()
    }

    /// Drops the samples of nodes `keep` does not name (nodes gone from the kernel table).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        lock(&self.nodes).retain(|node, _| keep(node));
    }

    /// How many nodes have samples.
    pub fn len(&self) -> usize {
        lock(&self.nodes).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn value(v: Option<f64>, max: f64) -> Option<f64> {
    v.filter(|v| v.is_finite() && *v >= 0.0).map(|v| v.min(max))
}

fn sched_ext_counter(name: &str) -> bool {
    name.len() <= 64
        && name.strip_prefix("SCX_EV_").is_some_and(|rest| {
            !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        })
}

/// A wire sample as the analysis reads it (its time still the node's).
fn sample_of(wire: &HealthSample) -> Sample {
    let events = wire.events_known.then(|| {
        wire.event_rates
            .iter()
            .filter(|(name, _)| sched_ext_counter(name))
            .filter_map(|(name, rate)| Some((name.clone(), value(Some(*rate), f64::MAX)?)))
            .take(MAX_EVENTS)
            .collect()
    });
    Sample {
        at_ms: wire.time_unix_ms,
        interval_ms: i64::from(wire.interval_ms).min(MAX_INTERVAL_MS),
        waiting_per_cpu: value(wire.waiting_per_cpu, 1e6),
        utilisation: value(wire.utilisation, 1.0),
        switches_per_cpu_second: value(wire.switches_per_cpu_second, 1e9),
        idle_while_waiting: value(wire.idle_while_waiting, 1.0),
        run_delay_us: value(wire.run_delay_us, f64::MAX),
        cpu_pressure: value(wire.cpu_pressure_percent, 100.0),
        events,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(at: i64, delay: f64) -> HealthSample {
        HealthSample { time_unix_ms: at, interval_ms: 1000, run_delay_us: Some(delay), ..HealthSample::default() }
    }

    #[test]
    fn repeated_samples_are_kept_once_and_the_newest_bounded() {
        let t = HealthTable::default();
        let health = |range: std::ops::Range<i64>| Health {
            samples: range.map(|i| wire(i * 1000, 10.0)).collect(),
            ..Health::default()
        };
        let now = 1_000_000;
        assert_eq!(t.record("n", &health(1..17), now), 16);
        assert_eq!(t.record("n", &health(10..26), now), 9, "a report repeats the previous one's samples");
        for k in 0..20 {
            t.record("n", &health(26 + k * 16..42 + k * 16), now);
        }
        let kept = t.samples_of([&"n".to_owned()]).remove("n").unwrap_or_default().samples;
        assert_eq!(kept.len(), SAMPLES_PER_NODE);
        assert!(kept.windows(2).all(|w| w[0].at_ms < w[1].at_ms));
        t.retain(|n| n != "n");
        assert!(t.is_empty());
    }

    #[test]
    fn a_sample_is_kept_in_56_bytes_and_read_back_as_sent() {
        assert_eq!(std::mem::size_of::<Kept>(), 56);
        let sent = Sample {
            at_ms: 7,
            interval_ms: 5000,
            waiting_per_cpu: Some(0.5),
            utilisation: Some(0.25),
            idle_while_waiting: Some(0.125),
            run_delay_us: Some(1350.25),
            events: Some(BTreeMap::from([("SCX_EV_A".to_owned(), 2.5)])),
            ..Sample::default()
        };
        assert_eq!(Kept::of(&sent).sample(), sent);
        let unknown = Sample { events: None, ..sent };
        assert_eq!(Kept::of(&unknown).sample(), unknown);
    }

    #[test]
    fn sample_times_are_rebased_on_the_controller_s_clock_and_counter_names_kept() {
        let t = HealthTable::default();
        // The node's clock is 30 s behind: it sent at 70 s what arrived at 100 s.
        let health = Health {
            samples: vec![wire(60_000, 10.0), wire(65_000, 10.0)],
            sent_unix_ms: 70_000,
            event_names: vec!["SCX_EV_A".into(), "not a counter".into()],
            ..Health::default()
        };
        t.record("n", &health, 100_000);
        let kept = t.samples_of([&"n".to_owned()]).remove("n").unwrap_or_default();
        let times: Vec<i64> = kept.samples.iter().map(|s| s.at_ms).collect();
        assert_eq!(times, [90_000, 95_000]);
        assert_eq!(kept.counters, ["SCX_EV_A"]);
    }

    #[test]
    fn a_hostile_agent_s_values_are_dropped_not_kept() {
        let t = HealthTable::default();
        let mut bad = wire(1000, f64::NAN);
        bad.cpu_pressure_percent = Some(1e9);
        bad.events_known = true;
        bad.event_rates =
            [("SCX_EV_X".to_owned(), -1.0), ("rm -rf".to_owned(), 1.0), ("SCX_EV_OK".to_owned(), 2.0)].into();
        let ahead = wire(MAX_AHEAD_MS + 10_000, 1.0);
        t.record("n", &Health { samples: vec![bad, ahead], ..Health::default() }, 0);
        let kept = t.samples_of([&"n".to_owned()]).remove("n").unwrap_or_default().samples;
        assert_eq!(kept.len(), 1, "a sample from far ahead of the controller's clock is refused");
        assert_eq!((kept[0].run_delay_us, kept[0].cpu_pressure), (None, Some(100.0)));
        assert_eq!(kept[0].events, Some(BTreeMap::from([("SCX_EV_OK".to_owned(), 2.0)])));
    }

    #[test]
    fn a_contract_is_kept_once_per_change_and_the_newest_bounded() {
        use sked_core::cpu_contract::Op;
        let table = HealthTable::default();
        let kept = NodeCpuContract { limits: Op::Implemented, ..NodeCpuContract::default() };
        let lost = NodeCpuContract { limits: Op::Missing, ..NodeCpuContract::default() };
        let pods = |limited| Some(sked_core::cpu_contract::PodCpu { pods: limited + 1, limited, ..Default::default() });
        // Another count of the same standing is no new fact.
        table.record_contract("n2", &NodeCpuContract { pods: pods(2), ..lost.clone() }, 1);
        table.record_contract("n2", &NodeCpuContract { pods: pods(3), ..lost.clone() }, 2);
        assert_eq!(table.samples_of(&["n2".to_owned()])["n2"].contracts.len(), 1);
        for (at, c) in [(1, &kept), (2, &kept), (3, &lost), (4, &lost), (5, &kept)] {
            table.record_contract("n1", c, at);
        }
        let contracts = |t: &HealthTable| t.samples_of(&["n1".to_owned()])["n1"].contracts.clone();
        let times: Vec<i64> = contracts(&table).iter().map(|(at, _)| *at).collect();
        assert_eq!(times, [1, 3, 5], "a report that repeats the last one adds nothing");
        for at in 6..40 {
            table.record_contract("n1", if at % 2 == 0 { &kept } else { &lost }, at);
        }
        let all = contracts(&table);
        assert_eq!((all.len(), all.last().map(|(at, _)| *at)), (CONTRACTS_PER_NODE, Some(39)));
    }
}
