//! Prometheus metrics of the agent, served on `/metrics`.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::observation::Observation;
use crate::verdict::Verdict;

type Labels = Vec<(String, String)>;

/// Every metric the agent exports.
pub struct Metrics {
    registry: Registry,
    state: Family<Labels, Gauge>,
    verdict: Family<Labels, Gauge>,
    attached: Gauge,
    enable_seq: Gauge,
    nr_rejected: Gauge,
    events: Family<Labels, Gauge>,
    capability_missing: Family<Labels, Gauge>,
    pub stream_connected: Gauge,
    pub reports_sent: Counter,
    pub stream_failures: Counter,
    pub kernel_reads: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("sked_agent");
        let m = Self {
            state: Family::default(),
            verdict: Family::default(),
            attached: Gauge::default(),
            enable_seq: Gauge::default(),
            nr_rejected: Gauge::default(),
            events: Family::default(),
            capability_missing: Family::default(),
            stream_connected: Gauge::default(),
            reports_sent: Counter::default(),
            stream_failures: Counter::default(),
            kernel_reads: Counter::default(),
            registry: Registry::default(),
        };
        registry.register("sched_ext_state", "sched_ext state (1 for the current one)", m.state.clone());
        registry.register("verdict", "The agent's verdict (1 for the current one)", m.verdict.clone());
        registry.register("attached", "1 when this pod's scheduler is attached in the kernel", m.attached.clone());
        registry.register(
            "sched_ext_enable_seq",
            "Times a sched_ext scheduler was enabled since boot",
            m.enable_seq.clone(),
        );
        registry.register("sched_ext_nr_rejected", "Tasks sched_ext rejected", m.nr_rejected.clone());
        registry.register("sched_ext_events", "Counters of root/events of the attached scheduler", m.events.clone());
        registry.register(
            "capability_missing",
            "1 for each capability the owner check needs and the agent lacks (CAP_SYS_ADMIN, CAP_SYS_PTRACE)",
            m.capability_missing.clone(),
        );
        registry.register(
            "report_stream_connected",
            "1 while the report stream to the controller is up",
            m.stream_connected.clone(),
        );
        registry.register("reports_sent", "Reports sent to the controller", m.reports_sent.clone());
        registry.register(
            "report_stream_failures",
            "Report streams that failed or could not be opened",
            m.stream_failures.clone(),
        );
        registry.register("kernel_reads", "Reads of the sched_ext sysfs files", m.kernel_reads.clone());
        Self { registry, ..m }
    }

    /// Records the capabilities the agent lacks.
    pub fn capabilities_missing(&self, missing: &[(&'static str, &'static str)]) {
        for (capability, _) in missing {
            self.capability_missing.get_or_create(&vec![("capability".into(), (*capability).into())]).set(1);
        }
    }

    /// Records an observation.
    pub fn observe(&self, o: &Observation) {
        self.kernel_reads.inc();
        self.state.clear();
        self.state.get_or_create(&vec![("state".into(), o.state_name().into())]).set(1);
        self.verdict.clear();
        self.verdict.get_or_create(&vec![("verdict".into(), o.verdict.as_str().into())]).set(1);
        self.attached.set(i64::from(o.verdict == Verdict::Attached));
        self.enable_seq.set(o.read.enable_seq.map_or(0, |v| i64::try_from(v).unwrap_or(i64::MAX)));
        self.nr_rejected.set(o.read.nr_rejected.map_or(0, |v| i64::try_from(v).unwrap_or(i64::MAX)));
        self.events.clear();
        for (name, value) in &o.read.events {
            self.events
                .get_or_create(&vec![("event".into(), name.clone())])
                .set(i64::try_from(*value).unwrap_or(i64::MAX));
        }
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = encode(&mut out, &self.registry);
        out
    }
}
