//! Each node's scheduling-health samples, as its agents sent them: what the analysis of a bake
//! reads (`sked_core::analysis`). Filled by the reports server beside the kernel table, for the
//! nodes of Schedulers that ask for analysis; read by their reconciles. A sample never wakes a reconcile: the
//! rollout asks at the end of each bake.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use sked_core::analysis::Sample;
use sked_proto::{Health, HealthSample};

use crate::mutex::lock;

/// Samples kept per node: about 10 minutes at the agents' default interval (5 s), 2 at 1 s.
/// The controller's memory for them grows with the fleet: 32 bytes a sample ([`Kept`]), 4 KiB a
/// node once full, 20 MiB for 5,000 nodes.
pub const SAMPLES_PER_NODE: usize = 128;
/// Most event counters kept per sample (the kernel has about a dozen).
const MAX_EVENTS: usize = 32;
/// A sample from further ahead of the controller's clock than this is refused: it would
/// hold back every later one.
const MAX_AHEAD_MS: i64 = 5 * 60 * 1000;

/// Health samples by node, oldest first.
#[derive(Debug, Default)]
pub struct HealthTable {
    nodes: Mutex<HashMap<String, VecDeque<Kept>>>,
}

/// Event counters that moved, and their rates.
type Rates = Box<[(Box<str>, f32)]>;

/// A sample as the table keeps it: single precision (a microsecond in a minute of run delay, a
/// thousandth of a point of pressure), NaN for unknown, event rates only when some counter moved.
#[derive(Clone, Debug, PartialEq)]
struct Kept {
    at_ms: i64,
    run_delay_us: f32,
    cpu_pressure: f32,
    /// `None`: the counters were not known; `Some` of nothing: known, and none moved.
    events: Option<Rates>,
}

impl Kept {
    fn of(s: &Sample) -> Self {
        let narrow = |v: Option<f64>| v.map_or(f32::NAN, |v| v as f32);
        Self {
            at_ms: s.at_ms,
            run_delay_us: narrow(s.run_delay_us),
            cpu_pressure: narrow(s.cpu_pressure),
            events: s.events.as_ref().map(|e| e.iter().map(|(n, r)| (n.as_str().into(), *r as f32)).collect()),
        }
    }

    fn sample(&self) -> Sample {
        let wide = |v: f32| (!v.is_nan()).then_some(f64::from(v));
        Sample {
            at_ms: self.at_ms,
            run_delay_us: wide(self.run_delay_us),
            cpu_pressure: wide(self.cpu_pressure),
            events: self.events.as_ref().map(|e| e.iter().map(|(n, r)| (n.to_string(), f64::from(*r))).collect()),
        }
    }
}

impl HealthTable {
    /// Keeps the samples of `health` newer than the node's newest (a report repeats the
    /// previous one's), after checking each: a value that is not a finite, non-negative
    /// number, or an event name that is not a sched_ext counter's, is dropped.
    pub fn record(&self, node: &str, health: &Health, now_ms: i64) -> usize {
        let mut nodes = lock(&self.nodes);
        let samples = nodes.entry(node.to_owned()).or_default();
        let mut newest = samples.back().map_or(i64::MIN, |s| s.at_ms);
        let mut added = 0;
        for wire in &health.samples {
            if wire.time_unix_ms <= newest || wire.time_unix_ms > now_ms.saturating_add(MAX_AHEAD_MS) {
                continue;
            }
            newest = wire.time_unix_ms;
            samples.push_back(Kept::of(&sample_of(wire)));
            added += 1;
        }
        while samples.len() > SAMPLES_PER_NODE {
            samples.pop_front();
        }
        added
    }

    /// The samples of `nodes`, copied under one lock.
    pub fn samples_of<'a>(&self, nodes: impl IntoIterator<Item = &'a String>) -> BTreeMap<String, Vec<Sample>> {
        let table = lock(&self.nodes);
        nodes.into_iter().filter_map(|n| Some((n.clone(), table.get(n)?.iter().map(Kept::sample).collect()))).collect()
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

/// A wire sample as the analysis reads it.
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
            unavailable: String::new(),
        };
        assert_eq!(t.record("n", &health(1..17), 0), 16);
        assert_eq!(t.record("n", &health(10..26), 0), 9, "a report repeats the previous one's samples");
        for k in 0..20 {
            t.record("n", &health(26 + k * 16..42 + k * 16), 0);
        }
        let kept = t.samples_of([&"n".to_owned()]).remove("n").unwrap_or_default();
        assert_eq!(kept.len(), SAMPLES_PER_NODE);
        assert!(kept.windows(2).all(|w| w[0].at_ms < w[1].at_ms));
        t.retain(|n| n != "n");
        assert!(t.is_empty());
    }

    #[test]
    fn a_sample_is_kept_in_32_bytes_and_read_back_as_sent() {
        assert_eq!(std::mem::size_of::<Kept>(), 32);
        let sent = Sample {
            at_ms: 7,
            run_delay_us: Some(1350.25),
            cpu_pressure: None,
            events: Some(BTreeMap::from([("SCX_EV_A".to_owned(), 2.5)])),
        };
        assert_eq!(Kept::of(&sent).sample(), sent);
        let unknown = Sample { events: None, ..sent };
        assert_eq!(Kept::of(&unknown).sample(), unknown);
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
        t.record("n", &Health { samples: vec![bad, ahead], unavailable: String::new() }, 0);
        let kept = t.samples_of([&"n".to_owned()]).remove("n").unwrap_or_default();
        assert_eq!(kept.len(), 1, "a sample from far ahead of the controller's clock is refused");
        assert_eq!((kept[0].run_delay_us, kept[0].cpu_pressure), (None, Some(100.0)));
        assert_eq!(kept[0].events, Some(BTreeMap::from([("SCX_EV_OK".to_owned(), 2.0)])));
    }
}
