//! Prometheus metrics of the agent, served on `/metrics`.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sked_proto::HealthSample;

use crate::observation::Observation;
use crate::relayed_series::Relayed;
use crate::sysfs::KernelRead;
use crate::verdict::Verdict;

use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};

/// The node's sched_ext `state`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

/// The agent's `verdict` on its scheduler.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerdictLabel {
    verdict: String,
}

/// A sched_ext event counter of one scheduler (`ops`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    event: String,
    ops: String,
}

/// Why: an exit's reason as the kernel logs it, or a failure's.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

/// A capability the agent lacks.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CapabilityLabel {
    capability: String,
}
/// No labels: the one series of a family that exists only while its value is known.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Unlabelled;

impl EncodeLabelSet for Unlabelled {
    fn encode(&self, _encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        Ok(())
    }
}

/// A gauge that is exported only while its value is known (an unknown value is no series, not 0).
type KnownGauge = Family<Unlabelled, Gauge<f64, AtomicU64>>;

/// An events counter: (ops name, event name).
type EventKey = (String, String);
/// The enable an events counter was last read under, and its value then.
type EventSeen = (Option<u64>, u64);

/// What the events counters were last read as.
#[derive(Default)]
struct EventsSeen {
    counters: HashMap<EventKey, EventSeen>,
    /// The ops name and enable_seq of the last read that counted.
    last: Option<(Option<String>, Option<u64>)>,
}

/// Every metric the agent exports.
pub struct Metrics {
    registry: Registry,
    state: Family<StateLabel, Gauge>,
    verdict: Family<VerdictLabel, Gauge>,
    attached: Gauge,
    enable_seq: Gauge,
    nr_rejected: Gauge,
    hotplug_seq: Gauge,
    switch_all: Gauge,
    events: Family<EventLabels, Counter>,
    /// Per (ops, event): the enable it was last read under and its value then, so the exported
    /// counters keep growing across a scheduler unloading and its counters starting again.
    events_seen: Mutex<EventsSeen>,
    exits: Family<ReasonLabel, Counter>,
    pub kernel_log_followed: Gauge,
    capability_missing: Family<CapabilityLabel, Gauge>,
    /// 1 while at least one report stream is open (see [`Metrics::stream_opened`]).
    stream_connected: Gauge,
    /// Report streams open, one per controller replica reached.
    streams_open: Gauge,
    /// Serialises the two gauges above, so they never disagree.
    streams_lock: Mutex<()>,
    pub reports_sent: Counter,
    pub stream_failures: Counter,
    pub kernel_reads: Counter,
    /// The scheduler's own statistics, relayed (see [`crate::stats_relay`]).
    pub scx_stats: Arc<Relayed>,
    pub scx_stats_up: Gauge,
    scx_stats_failures: Family<ReasonLabel, Counter>,
    scx_stats_series: Gauge,
    scx_stats_dropped: Counter,
    /// Mean run delay per timeslice over the last health interval (see [`crate::health`]).
    run_delay: KnownGauge,
    cpu_pressure: KnownGauge,
    /// Mean tasks waiting per CPU over the last health interval.
    waiting_tasks: KnownGauge,
    /// Share of the CPUs' time spent running tasks over the last health interval.
    utilisation: KnownGauge,
    pub health_samples: Counter,
    /// The pods' CPU contract over the last window (see [`Metrics::pods_sampled`]).
    pods_limited: Gauge,
    pods_over_limit: Gauge,
    pods_exercised: Gauge,
    /// 1 for each cgroup callback the running scheduler implements, 0 for one it lacks.
    cgroup_op: Family<OpLabel, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut root = Registry::default();
        let registry = root.sub_registry_with_prefix("sked_agent");
        let m = Self {
            state: Family::default(),
            verdict: Family::default(),
            attached: Gauge::default(),
            enable_seq: Gauge::default(),
            nr_rejected: Gauge::default(),
            hotplug_seq: Gauge::default(),
            switch_all: Gauge::default(),
            events: Family::default(),
            events_seen: Mutex::default(),
            exits: Family::default(),
            kernel_log_followed: Gauge::default(),
            capability_missing: Family::default(),
            stream_connected: Gauge::default(),
            streams_open: Gauge::default(),
            streams_lock: Mutex::default(),
            reports_sent: Counter::default(),
            stream_failures: Counter::default(),
            kernel_reads: Counter::default(),
            scx_stats: Arc::default(),
            scx_stats_up: Gauge::default(),
            scx_stats_failures: Family::default(),
            scx_stats_series: Gauge::default(),
            scx_stats_dropped: Counter::default(),
            run_delay: Family::default(),
            cpu_pressure: Family::default(),
            waiting_tasks: Family::default(),
            utilisation: Family::default(),
            health_samples: Counter::default(),
            pods_limited: Gauge::default(),
            pods_over_limit: Gauge::default(),
            pods_exercised: Gauge::default(),
            cgroup_op: Family::default(),
            registry: Registry::default(),
        };
        m.register_kernel(registry);
        m.register_streams(registry);
        m.register_stats(registry);
        m.register_health(registry);
        m.register_cpu_contract(registry);
        // The relayed series keep their own names (scx_...), outside the agent's prefix.
        root.register_collector(Box::new(m.scx_stats.clone()));
        Self { registry: root, ..m }
    }

    /// Registers what the agent reads of the kernel: sched_ext state, the verdict, events and exits.
    fn register_kernel(&self, registry: &mut Registry) {
        registry.register("kernel_reads", "Reads of the sched_ext sysfs files", self.kernel_reads.clone());
        registry.register("sched_ext_state", "sched_ext state (1 for the current one)", self.state.clone());
        registry.register("verdict", "The agent's verdict (1 for the current one)", self.verdict.clone());
        registry.register("attached", "1 when this pod's scheduler is attached in the kernel", self.attached.clone());
        registry.register(
            "sched_ext_enable_seq",
            "Times a sched_ext scheduler was enabled since boot",
            self.enable_seq.clone(),
        );
        registry.register(
            "sched_ext_nr_rejected",
            "Tasks sent back to the default scheduler because the BPF scheduler disallowed them (nr_rejected)",
            self.nr_rejected.clone(),
        );
        registry.register(
            "sched_ext_hotplug_seq",
            "CPU hotplug events seen by sched_ext since boot (hotplug_seq)",
            self.hotplug_seq.clone(),
        );
        registry.register(
            "sched_ext_switch_all",
            "1 when the BPF scheduler runs every task, 0 when only tasks that opted in (switch_all)",
            self.switch_all.clone(),
        );
        registry.register(
            "sched_ext_events",
            "root/events counters of the attached scheduler, by event (SCX_EV_ prefix removed) and ops name; kept growing across unloads",
            self.events.clone(),
        );
        registry.register(
            "sched_ext_exits",
            "Times the kernel disabled a BPF scheduler on this node since the agent started, by the kernel's reason",
            self.exits.clone(),
        );
        registry.register(
            "kernel_log_followed",
            "1 while the agent reads the kernel log (/dev/kmsg) for the reasons of exits",
            self.kernel_log_followed.clone(),
        );
        registry.register(
            "capability_missing",
            "1 for each capability the owner check needs and the agent lacks (CAP_SYS_ADMIN, CAP_SYS_PTRACE)",
            self.capability_missing.clone(),
        );
    }

    /// Registers the report streams to the controller.
    fn register_streams(&self, registry: &mut Registry) {
        registry.register(
            "report_stream_connected",
            "1 while at least one report stream to the controller is up",
            self.stream_connected.clone(),
        );
        registry.register(
            "report_streams_open",
            "Report streams open, one per controller replica the agent reaches (the leader and each standby)",
            self.streams_open.clone(),
        );
        registry.register(
            "reports_sent",
            "Reports sent, counted once per controller replica they went to",
            self.reports_sent.clone(),
        );
        registry.register(
            "report_stream_failures",
            "Report streams that failed or could not be opened",
            self.stream_failures.clone(),
        );
    }

    /// Registers the relay of the scheduler's own statistics.
    fn register_stats(&self, registry: &mut Registry) {
        registry.register(
            "scx_stats_up",
            "1 while the scheduler's statistics (scx_stats) are relayed, as the scx_* series",
            self.scx_stats_up.clone(),
        );
        registry.register(
            "scx_stats_failures",
            "Failed connections to and requests of the scheduler's stats socket, by reason (no_socket, timeout, oversized, garbled, refused, closed, io)",
            self.scx_stats_failures.clone(),
        );
        registry.register(
            "scx_stats_series",
            "Series relayed from the scheduler's last stats reply",
            self.scx_stats_series.clone(),
        );
        registry.register(
            "scx_stats_dropped_series",
            "Series of the scheduler's stats replies not relayed (past the cap of series per reply)",
            self.scx_stats_dropped.clone(),
        );
    }

    /// Registers the node's scheduling health, as the agent samples it.
    fn register_health(&self, registry: &mut Registry) {
        registry.register(
            "run_delay_seconds",
            "Mean time a task waited on a run queue per timeslice, over every CPU and the last health interval (/proc/schedstat); absent when unknown",
            self.run_delay.clone(),
        );
        registry.register(
            "cpu_pressure_percent",
            "Share of the last health interval in which some task waited for a CPU (/proc/pressure/cpu); absent when unknown",
            self.cpu_pressure.clone(),
        );
        registry.register(
            "waiting_tasks_per_cpu",
            "Mean number of tasks waiting on a run queue per CPU over the last health interval: run delay over wall time and CPUs (/proc/schedstat); absent when unknown",
            self.waiting_tasks.clone(),
        );
        registry.register(
            "cpu_utilisation_ratio",
            "Share of the CPUs' time spent running tasks over the last health interval, 0 to 1 (/proc/schedstat); absent when unknown",
            self.utilisation.clone(),
        );
        registry.register(
            "health_samples",
            "Scheduling-health samples taken (one per health interval)",
            self.health_samples.clone(),
        );
    }

    /// Registers the pods' CPU contract: what the running scheduler implements, what the pods got.
    fn register_cpu_contract(&self, registry: &mut Registry) {
        registry.register(
            "pods_cpu_limited",
            "Pods on the node with a CPU limit, read at both ends of the last window",
            self.pods_limited.clone(),
        );
        registry.register(
            "pods_cpu_limit_exercised",
            "Limited pods that wanted their limit in the last window (used 90 % of it, throttled, or went over)",
            self.pods_exercised.clone(),
        );
        registry.register(
            "pods_over_cpu_limit",
            "Pods that used more CPU than their limit in the last window: the scheduler does not keep cpu.max",
            self.pods_over_limit.clone(),
        );
        registry.register(
            "scheduler_cgroup_op",
            "1 when the running scheduler implements the cgroup callback (cgroup_set_bandwidth: CPU limits, cgroup_set_weight: CPU requests), 0 when it lacks it; no series while unknown",
            self.cgroup_op.clone(),
        );
    }

    /// Records what the pods' cgroups showed over the last window.
    pub fn pods_sampled(&self, limited: u32, exercised: u32, over_limit: u32) {
        self.pods_limited.set(i64::from(limited));
        self.pods_exercised.set(i64::from(exercised));
        self.pods_over_limit.set(i64::from(over_limit));
    }

    /// Records the running scheduler's cgroup callbacks (`None`: unknown, no series).
    pub fn cgroup_ops_seen(&self, ops: Option<crate::cgroup_ops::CgroupOps>) {
        use crate::cgroup_ops::Support;
        self.cgroup_op.clear();
        let Some(ops) = ops else { return };
        for (op, support) in [("cgroup_set_bandwidth", ops.limits), ("cgroup_set_weight", ops.requests)] {
            self.cgroup_op.get_or_create(&OpLabel { op }).set(i64::from(support == Support::Implemented));
        }
    }

    /// Records the newest health sample: each gauge takes its value, or is removed when the
    /// sample lacks it (never set to 0 for an unknown value).
    pub fn health_sampled(&self, sample: &HealthSample) {
        self.health_samples.inc();
        let run_delay_seconds = sample.run_delay_us.map(|us| us / 1_000_000.0);
        let gauges = [
            (&self.run_delay, run_delay_seconds),
            (&self.cpu_pressure, sample.cpu_pressure_percent),
            (&self.waiting_tasks, sample.waiting_per_cpu),
            (&self.utilisation, sample.utilisation),
        ];
        for (gauge, value) in gauges {
            match value {
                Some(v) => {
                    gauge.get_or_create(&Unlabelled).set(v);
                }
                None => {
                    gauge.remove(&Unlabelled);
                }
            }
        }
    }

    /// Counts a report stream that opened; `report_stream_connected` follows.
    pub fn stream_opened(&self) {
        let _serial = crate::lock(&self.streams_lock);
        self.streams_open.inc();
        self.stream_connected.set(1);
    }

    /// Counts a report stream that closed; `report_stream_connected` drops to 0 with the last.
    pub fn stream_closed(&self) {
        let _serial = crate::lock(&self.streams_lock);
        if self.streams_open.dec() <= 1 {
            self.stream_connected.set(0);
        }
    }

    /// Counts a failed connection to, or request of, the scheduler's stats socket.
    pub fn scx_stats_failure(&self, reason: &str) {
        self.scx_stats_failures.get_or_create(&ReasonLabel { reason: reason.to_owned() }).inc();
    }

    /// Records a relayed reply: its series, and those dropped past the cap.
    pub fn scx_stats_relayed(&self, series: usize, dropped: usize) {
        self.scx_stats_series.set(i64::try_from(series).unwrap_or(i64::MAX));
        self.scx_stats_dropped.inc_by(u64::try_from(dropped).unwrap_or(u64::MAX));
    }

    /// Records the capabilities the agent lacks.
    pub fn capabilities_missing(&self, missing: &[(&'static str, &'static str)]) {
        for (capability, _) in missing {
            self.capability_missing.get_or_create(&CapabilityLabel { capability: (*capability).to_owned() }).set(1);
        }
    }

    /// Records an observation.
    pub fn observe(&self, o: &Observation) {
        self.kernel_reads.inc();
        self.state.clear();
        self.state.get_or_create(&StateLabel { state: o.state_name().into() }).set(1);
        self.verdict.clear();
        self.verdict.get_or_create(&VerdictLabel { verdict: o.verdict.as_str().into() }).set(1);
        self.attached.set(i64::from(o.verdict == Verdict::Attached));
        self.cgroup_ops_seen(o.cgroup_ops.as_ref().and_then(|r| r.as_ref().ok()).copied());
        self.counters(&o.read);
    }

    /// Records the kernel's counters of one read (also done on every scrape).
    pub fn counters(&self, read: &KernelRead) {
        self.enable_seq.set(read.enable_seq.map_or(0, |v| i64::try_from(v).unwrap_or(i64::MAX)));
        self.nr_rejected.set(read.nr_rejected.map_or(0, |v| i64::try_from(v).unwrap_or(i64::MAX)));
        self.hotplug_seq.set(read.hotplug_seq.map_or(0, |v| i64::try_from(v).unwrap_or(i64::MAX)));
        self.switch_all.set(i64::from(read.switch_all.unwrap_or(false)));
        let mut seen = crate::lock(&self.events_seen);
        // The kernel shows a new scheduler's root/ (ops, events) before it counts the enable in
        // enable_seq: a read between the two would file the new counters under the previous
        // enable, and count them again once enable_seq moves. Such a read is left out.
        let torn = seen.last.as_ref().is_some_and(|(ops, seq)| *ops != read.ops && *seq == read.enable_seq);
        if torn && read.ops.is_some() {
            return;
        }
        seen.last = Some((read.ops.clone(), read.enable_seq));
        let Some(ops) = &read.ops else { return };
        for (name, value) in &read.events {
            let event = name.strip_prefix("SCX_EV_").unwrap_or(name);
            let key = (ops.clone(), event.to_owned());
            let (grown, kept) = counter_growth(seen.counters.get(&key).copied(), read.enable_seq, *value);
            seen.counters.insert(key, (read.enable_seq, kept));
            // Created at zero too, so a counter exists before its first event.
            self.events.get_or_create(&EventLabels { event: event.to_owned(), ops: ops.clone() }).inc_by(grown);
        }
    }

    /// Creates the exit counters of `reasons` at zero.
    pub fn exits_known(&self, reasons: &[&str]) {
        for reason in reasons {
            self.exits.get_or_create(&ReasonLabel { reason: (*reason).to_owned() }).inc_by(0);
        }
    }

    /// Counts an exit the kernel logged, by its reason.
    pub fn exit(&self, reason: &str) {
        self.exits.get_or_create(&ReasonLabel { reason: reason.to_owned() }).inc();
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// How much a kernel counter grew since the last read (`last`: the enable it was read under and
/// the largest value seen then), and the value to keep. Under a new enable the counter started
/// again from zero: all of it is new. A smaller value under the same enable is an older read
/// (the observer and a scrape race, or the files were read across an enable): nothing is new.
fn counter_growth(last: Option<EventSeen>, enable_seq: Option<u64>, value: u64) -> (u64, u64) {
    match last {
        Some((seq, before)) if seq == enable_seq => (value.saturating_sub(before), value.max(before)),
        _ => (value, value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::SchedState;
    use std::collections::BTreeMap;

    fn observation(ops: &str, enable_seq: u64, events: &[(&str, u64)]) -> Observation {
        Observation {
            read: KernelRead {
                supported: true,
                state: SchedState::Enabled,
                ops: Some(ops.into()),
                enable_seq: Some(enable_seq),
                switch_all: Some(true),
                nr_rejected: Some(0),
                hotplug_seq: Some(3),
                events: events.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect::<BTreeMap<_, _>>(),
                problems: Vec::new(),
            },
            verdict: Verdict::Attached,
            reason: String::new(),
            last_exit: None,
            cgroup_ops: None,
        }
    }

    fn value(text: &str, series: &str) -> Option<u64> {
        text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }

    #[test]
    fn event_counters_keep_growing_across_an_unload() {
        let m = Metrics::new();
        let series = "sked_agent_sched_ext_events_total{event=\"BYPASS_DURATION\",ops=\"lavd\"}";
        m.observe(&observation("lavd", 1, &[("SCX_EV_BYPASS_DURATION", 40)]));
        m.observe(&observation("lavd", 1, &[("SCX_EV_BYPASS_DURATION", 100)]));
        assert_eq!(value(&m.encode(), series), Some(100));
        // Unloaded, loaded again: its counters start from zero and have grown to 30 already.
        m.observe(&observation("lavd", 2, &[("SCX_EV_BYPASS_DURATION", 30)]));
        assert_eq!(value(&m.encode(), series), Some(130));
        // A smaller value under the same enable is an older read that lost a race: nothing new.
        m.observe(&observation("lavd", 2, &[("SCX_EV_BYPASS_DURATION", 5)]));
        assert_eq!(value(&m.encode(), series), Some(130));
        m.observe(&observation("lavd", 2, &[("SCX_EV_BYPASS_DURATION", 31)]));
        assert_eq!(value(&m.encode(), series), Some(131));
        let text = m.encode();
        assert_eq!(value(&text, "sked_agent_sched_ext_hotplug_seq"), Some(3));
        assert_eq!(value(&text, "sked_agent_sched_ext_switch_all"), Some(1));
    }

    #[test]
    fn a_read_that_sees_a_new_scheduler_before_its_enable_counts_nothing_twice() {
        let m = Metrics::new();
        let series = "sked_agent_sched_ext_events_total{event=\"REFILL_SLICE_DFL\",ops=\"rusty\"}";
        let mut idle = observation("rusty", 0, &[]);
        idle.read.ops = None;
        m.observe(&idle);
        // root/ is there, enable_seq not counted yet: the kernel's order on an enable.
        m.observe(&observation("rusty", 0, &[("SCX_EV_REFILL_SLICE_DFL", 42)]));
        m.observe(&observation("rusty", 1, &[("SCX_EV_REFILL_SLICE_DFL", 42)]));
        m.observe(&observation("rusty", 1, &[("SCX_EV_REFILL_SLICE_DFL", 42)]));
        assert_eq!(value(&m.encode(), series), Some(42));
        // Disabled, enabled again (read early once more): the new load's counters count once.
        idle.read.enable_seq = Some(1);
        m.observe(&idle);
        m.observe(&observation("rusty", 1, &[("SCX_EV_REFILL_SLICE_DFL", 5)]));
        m.observe(&observation("rusty", 2, &[("SCX_EV_REFILL_SLICE_DFL", 7)]));
        assert_eq!(value(&m.encode(), series), Some(49));
    }

    #[test]
    fn health_gauges_exist_only_while_known() {
        let m = Metrics::new();
        let text = m.encode();
        let run_delay = |text: &str| {
            text.lines().find_map(|l| l.strip_prefix("sked_agent_run_delay_seconds ")?.parse::<f64>().ok())
        };
        assert_eq!(run_delay(&text), None, "no sample yet: {text}");
        assert!(text.contains("sked_agent_health_samples_total 0"), "{text}");
        assert!(!text.contains("sked_agent_waiting_tasks_per_cpu "), "{text}");
        assert!(!text.contains("sked_agent_cpu_utilisation_ratio "), "{text}");
        m.health_sampled(&HealthSample {
            run_delay_us: Some(42_500.0),
            cpu_pressure_percent: Some(3.0),
            waiting_per_cpu: Some(0.3),
            utilisation: Some(0.6),
            ..HealthSample::default()
        });
        let text = m.encode();
        assert_eq!(run_delay(&text), Some(0.0425), "{text}");
        assert!(text.contains("sked_agent_cpu_pressure_percent 3.0\n"), "{text}");
        assert!(text.contains("\n# TYPE sked_agent_waiting_tasks_per_cpu gauge\n"), "{text}");
        assert!(text.contains("\nsked_agent_waiting_tasks_per_cpu 0.3\n"), "{text}");
        assert!(text.contains("\nsked_agent_cpu_utilisation_ratio 0.6\n"), "{text}");
        m.health_sampled(&HealthSample { run_delay_us: Some(7000.0), ..HealthSample::default() });
        let text = m.encode();
        assert_eq!(run_delay(&text), Some(0.007), "{text}");
        assert!(!text.contains("sked_agent_cpu_pressure_percent "), "unknown is no series, not 0: {text}");
        assert!(!text.contains("sked_agent_waiting_tasks_per_cpu "), "unknown is no series, not 0: {text}");
        assert!(!text.contains("sked_agent_cpu_utilisation_ratio "), "unknown is no series, not 0: {text}");
        assert!(text.contains("sked_agent_health_samples_total 2"), "{text}");
    }

    #[test]
    fn exits_are_counted_by_reason() {
        let m = Metrics::new();
        m.exit("runnable task stall");
        m.exit("runnable task stall");
        assert_eq!(value(&m.encode(), "sked_agent_sched_ext_exits_total{reason=\"runnable task stall\"}"), Some(2));
    }
}
