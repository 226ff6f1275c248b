//! `kubectl sked stats NODE`: the statistics the scheduler on a node serves (scx_stats), as the
//! node's agent relays them on its `/metrics` (the `scx_*` series), read through the API
//! server's pod proxy. Parsing and the view are pure; `main` fetches.

use std::collections::BTreeMap;

use serde::Serialize;

/// What the agent's scrape says of the scheduler's statistics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeStats {
    pub node: String,
    pub pod: String,
    /// The Scheduler and the kernel's ops name the relayed series carry.
    pub scheduler: String,
    pub ops: String,
    /// The agent relays the scheduler's statistics right now.
    pub relayed: bool,
    /// Failed requests of the stats socket since the agent started, by reason.
    pub failures: BTreeMap<String, f64>,
    pub statistics: Vec<Statistic>,
}

/// One relayed statistic.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Statistic {
    /// The scheduler's field name (the series name without `scx_`).
    pub name: String,
    /// Labels the scheduler's hints add (a domain, a CPU, ...).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    pub value: f64,
    pub help: String,
}

/// Reads the agent's `/metrics` text.
pub fn parse(node: &str, pod: &str, text: &str) -> Result<NodeStats, String> {
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).map_err(|e| format!("the agent's /metrics: {e}"))?;
    let mut stats = NodeStats {
        node: node.to_owned(),
        pod: pod.to_owned(),
        scheduler: String::new(),
        ops: String::new(),
        relayed: false,
        failures: BTreeMap::new(),
        statistics: Vec::new(),
    };
    for sample in &scrape.samples {
        let value = match sample.value {
            prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => continue,
        };
        match sample.metric.as_str() {
            "sked_agent_scx_stats_up" => stats.relayed = value >= 1.0,
            "sked_agent_scx_stats_failures_total" => {
                let reason = sample.labels.get("reason").unwrap_or_default().to_owned();
                stats.failures.insert(reason, value);
            }
            name => {
                let Some(field) = name.strip_prefix("scx_") else { continue };
                let mut labels: BTreeMap<String, String> =
                    sample.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                stats.scheduler = labels.remove("scheduler").unwrap_or_default();
                stats.ops = labels.remove("ops").unwrap_or_default();
                let help = scrape.docs.get(name).cloned().unwrap_or_default();
                stats.statistics.push(Statistic { name: field.to_owned(), labels, value, help });
            }
        }
    }
    stats.statistics.sort_by(|a, b| (&a.name, &a.labels).cmp(&(&b.name, &b.labels)));
    Ok(stats)
}

impl NodeStats {
    /// Why nothing is relayed, in words (None while statistics are relayed).
    pub fn why_none(&self) -> Option<String> {
        if self.relayed && !self.statistics.is_empty() {
            return None;
        }
        let failures: Vec<String> =
            self.failures.iter().filter(|(_, n)| **n > 0.0).map(|(r, n)| format!("{r} {n}")).collect();
        let seen = if failures.is_empty() {
            String::new()
        } else {
            format!(" (failed requests by reason: {})", failures.join(", "))
        };
        Some(format!(
            "the scheduler on node {} (pod {}) serves no statistics the agent can relay{seen}; schedulers built on scx_utils (scx_bpfland, scx_lavd, scx_rusty, ...) serve them, others have none; the agent's logs say more (kubectl logs -n <namespace> {} -c agent)",
            self.node, self.pod, self.pod
        ))
    }

    /// The table: a header line, then one row per statistic.
    pub fn table(&self) -> String {
        let label_text = |s: &Statistic| s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
        let width =
            |f: &dyn Fn(&Statistic) -> usize, min: usize| self.statistics.iter().map(f).max().unwrap_or(0).max(min);
        let (name_w, labels_w) = (width(&|s| s.name.len(), 9), width(&|s| label_text(s).len(), 6));
        let mut out = format!(
            "{}: scheduler {}, ops {} (pod {}), {} statistics\n{:<name_w$}  {:<labels_w$}  VALUE\n",
            self.node,
            self.scheduler,
            self.ops,
            self.pod,
            self.statistics.len(),
            "STATISTIC",
            "LABELS"
        );
        for s in &self.statistics {
            let labels = label_text(s);
            out.push_str(&format!("{:<name_w$}  {:<labels_w$}  {}\n", s.name, labels, s.value));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAPE: &str = r#"# HELP sked_agent_attached 1 when this pod's scheduler is attached in the kernel
# TYPE sked_agent_attached gauge
sked_agent_attached 1
# HELP sked_agent_scx_stats_up 1 while the scheduler's statistics (scx_stats) are relayed
# TYPE sked_agent_scx_stats_up gauge
sked_agent_scx_stats_up 1
# HELP sked_agent_scx_stats_failures_total Failed connections
# TYPE sked_agent_scx_stats_failures_total counter
sked_agent_scx_stats_failures_total{reason="no_socket"} 2
# HELP scx_nr_running Number of running tasks
# TYPE scx_nr_running gauge
scx_nr_running{scheduler="canary",ops="bpfland_1.1.4_x86_64_unknown_linux_gnu"} 3
# HELP scx_d_events an event counter
# TYPE scx_d_events gauge
scx_d_events{scheduler="canary",ops="bpfland_1.1.4_x86_64_unknown_linux_gnu",domain="1"} 7
scx_d_events{scheduler="canary",ops="bpfland_1.1.4_x86_64_unknown_linux_gnu",domain="0"} 5
"#;

    #[test]
    fn the_relayed_statistics_of_a_scrape() {
        let stats = parse("n1", "canary-x", SCRAPE).unwrap();
        assert!(stats.relayed && stats.why_none().is_none());
        assert_eq!(
            (stats.scheduler.as_str(), stats.ops.as_str()),
            ("canary", "bpfland_1.1.4_x86_64_unknown_linux_gnu")
        );
        let rows: Vec<String> =
            stats.statistics.iter().map(|s| format!("{} {:?} {}", s.name, s.labels, s.value)).collect();
        assert_eq!(rows, [r#"d_events {"domain": "0"} 5"#, r#"d_events {"domain": "1"} 7"#, "nr_running {} 3"]);
        assert_eq!(stats.statistics[2].help, "Number of running tasks");
        let table = stats.table();
        assert!(table.starts_with(
            "n1: scheduler canary, ops bpfland_1.1.4_x86_64_unknown_linux_gnu (pod canary-x), 3 statistics\n"
        ));
        assert!(table.contains("\nnr_running            3\n"), "{table}");
        assert!(table.contains("\nd_events    domain=0  5\n"), "{table}");
    }

    #[test]
    fn a_scheduler_without_statistics_says_why() {
        let text = "sked_agent_scx_stats_up 0\nsked_agent_scx_stats_failures_total{reason=\"no_socket\"} 4\n";
        let stats = parse("n1", "canary-x", text).unwrap();
        let why = stats.why_none().unwrap();
        assert!(why.contains("node n1 (pod canary-x) serves no statistics") && why.contains("no_socket 4"), "{why}");
    }
}
