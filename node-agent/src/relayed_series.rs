//! The scheduler's own statistics as the agent's `/metrics` serves them: the last reply the
//! relay ([`crate::stats_relay`]) read, kept as series and encoded at each scrape. Apart from
//! the relay, so the metrics registry that holds it and the relay that fills it import it from
//! below instead of each other.

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::scx_stats::Sample;

/// A series' labels, in order.
type Labels = Vec<(String, String)>;

/// Most characters kept of the last reply as text (the snapshot a report carries when the
/// scheduler left).
pub const MAX_SNAPSHOT_CHARS: usize = sked_proto::text::MAX_SCHEDULER_STATS_CHARS;

/// The last reply relayed, as series: what scrapes serve.
#[derive(Debug, Default)]
pub struct Relayed {
    samples: Mutex<Vec<Sample>>,
    /// The labels every relayed series carries: scheduler and ops.
    own: Mutex<Vec<(String, String)>>,
    /// The last reply as JSON text, escaped and capped: kept when the scheduler leaves, for
    /// the report that tells why ([`Relayed::snapshot`]).
    snapshot: Mutex<Option<String>>,
}

impl Relayed {
    /// Keeps `reply` (the scheduler's last `stats` answer) as the snapshot.
    pub(crate) fn keep_snapshot(&self, reply: &serde_json::Value) {
        let text = sked_proto::text::escape_and_cap(&reply.to_string(), MAX_SNAPSHOT_CHARS);
        *crate::lock(&self.snapshot) = Some(text);
    }

    /// The scheduler's last statistics the relay read (while it ran attached), if any.
    pub fn snapshot(&self) -> Option<String> {
        crate::lock(&self.snapshot).clone()
    }

    pub(crate) fn set(&self, own: Vec<(String, String)>, samples: Vec<Sample>) {
        *crate::lock(&self.own) = own;
        *crate::lock(&self.samples) = samples;
    }

    pub(crate) fn clear(&self) {
        crate::lock(&self.samples).clear();
    }
}

impl Collector for Relayed {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let samples = crate::lock(&self.samples);
        let own = crate::lock(&self.own).clone();
        // One family per name (its first help text), each label set once.
        let mut families: BTreeMap<&str, (&str, BTreeMap<Labels, f64>)> = BTreeMap::new();
        for s in samples.iter() {
            let (_, series) = families.entry(s.name.as_str()).or_insert((s.help.as_str(), BTreeMap::new()));
            let labels: Labels = own.iter().chain(&s.labels).cloned().collect();
            series.entry(labels).or_insert(s.value);
        }
        for (name, (help, series)) in families {
            let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (labels, value) in series {
                ConstGauge::new(value).encode(metric.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
