//! Kernel truth per node, from the agents' reports, folded into a Scheduler's KernelAttached
//! condition. Pure: the reports server fills a [`KernelTable`]; [`summarize`] reads a snapshot.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::api::reason;

/// At most this many nodes are named in a condition message.
const MAX_NODES_LISTED: usize = 3;

/// An agent's verdict for its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeVerdict {
    Attached,
    NotAttached,
    ForeignScheduler,
    KernelUnsupported,
}

impl NodeVerdict {
    /// From the wire enum; unknown values count as not attached.
    pub fn from_proto(v: i32) -> Self {
        match sked_proto::Verdict::try_from(v) {
            Ok(sked_proto::Verdict::Attached) => Self::Attached,
            Ok(sked_proto::Verdict::ForeignScheduler) => Self::ForeignScheduler,
            Ok(sked_proto::Verdict::KernelUnsupported) => Self::KernelUnsupported,
            _ => Self::NotAttached,
        }
    }
}

/// The latest report from one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeReport {
    pub scheduler: String,
    pub pod: String,
    pub verdict: NodeVerdict,
    pub reason: String,
    pub ops: String,
    pub received: Instant,
}

/// Latest report per node, shared by the reports server and the reconciler.
#[derive(Debug, Default)]
pub struct KernelTable {
    nodes: Mutex<HashMap<String, NodeReport>>,
}

impl KernelTable {
    /// Stores a node's report. Returns the Schedulers whose kernel view changed (the reporting
    /// one, and a previous one on that node), or nothing for a heartbeat that changes nothing.
    /// A heartbeat after `stale_after` of silence is news: the node is back.
    pub fn record(&self, node: &str, report: NodeReport, stale_after: Duration) -> Vec<String> {
        let mut nodes = self.nodes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let previous = nodes.insert(node.to_owned(), report.clone());
        match previous {
            Some(p)
                if p.scheduler == report.scheduler
                    && p.verdict == report.verdict
                    && p.reason == report.reason
                    && report.received.saturating_duration_since(p.received) <= stale_after =>
            {
                Vec::new()
            }
            Some(p) if p.scheduler != report.scheduler => vec![report.scheduler, p.scheduler],
            _ => vec![report.scheduler],
        }
    }

    /// Runs `f` on the table under its lock, without copying it (a reconcile reads a few
    /// nodes of a table that can hold thousands).
    pub fn read<R>(&self, f: impl FnOnce(&HashMap<String, NodeReport>) -> R) -> R {
        f(&self.nodes.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

/// The KernelAttached view of one Scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSummary {
    /// Scheduled nodes whose kernel runs this Scheduler (fresh Attached reports).
    pub attached: i32,
    pub is_true: bool,
    pub reason: &'static str,
    pub message: String,
    /// When the freshest-but-aging report turns stale: reconcile again then.
    pub recheck_in: Option<Duration>,
}

/// Folds the reports of `nodes` (the nodes this Scheduler owns) into its KernelAttached view.
pub fn summarize(
    scheduler: &str,
    nodes: &BTreeSet<String>,
    desired: i32,
    reports: &HashMap<String, NodeReport>,
    now: Instant,
    stale_after: Duration,
) -> KernelSummary {
    let mut attached = 0i32;
    let mut by_kind: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    let mut recheck_in: Option<Duration> = None;
    for node in nodes {
        let Some(r) = reports.get(node).filter(|r| r.scheduler == scheduler) else {
            by_kind.entry(reason::NOT_ATTACHED).or_default().push(format!("{node}: no report yet"));
            continue;
        };
        let age = now.saturating_duration_since(r.received);
        if age > stale_after {
            by_kind.entry(reason::REPORT_STALE).or_default().push(format!("{node}: no report for {}s", age.as_secs()));
            continue;
        }
        let left = stale_after - age;
        recheck_in = Some(recheck_in.map_or(left, |d| d.min(left)));
        let kind = match r.verdict {
            NodeVerdict::Attached => {
                attached += 1;
                continue;
            }
            NodeVerdict::NotAttached => reason::NOT_ATTACHED,
            NodeVerdict::ForeignScheduler => reason::FOREIGN_SCHEDULER,
            NodeVerdict::KernelUnsupported => reason::KERNEL_UNSUPPORTED,
        };
        by_kind.entry(kind).or_default().push(format!("{node}: {}", r.reason));
    }
    let attached = attached.min(desired.max(0));
    let (is_true, reason, message) = if desired <= 0 {
        (false, reason::NOT_ATTACHED, "No node is scheduled to run this scheduler".to_owned())
    } else if attached >= desired {
        (
            true,
            reason::KERNEL_ATTACHED,
            format!("{attached} of {desired} scheduled nodes run this scheduler in the kernel"),
        )
    } else {
        // The most telling problem names the condition.
        let reason =
            [reason::FOREIGN_SCHEDULER, reason::KERNEL_UNSUPPORTED, reason::REPORT_STALE, reason::NOT_ATTACHED]
                .into_iter()
                .find(|k| by_kind.contains_key(k))
                .unwrap_or(reason::NOT_ATTACHED);
        let listed = by_kind.get(reason).map(|v| list(v)).unwrap_or_default();
        (false, reason, format!("{attached} of {desired} scheduled nodes run this scheduler in the kernel; {listed}"))
    };
    KernelSummary { attached, is_true, reason, message, recheck_in }
}

fn list(items: &[String]) -> String {
    let shown: Vec<&str> = items.iter().take(MAX_NODES_LISTED).map(String::as_str).collect();
    let more = items.len().saturating_sub(MAX_NODES_LISTED);
    if more > 0 { format!("{} (and {more} more)", shown.join("; ")) } else { shown.join("; ") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(scheduler: &str, verdict: NodeVerdict, received: Instant) -> NodeReport {
        NodeReport {
            scheduler: scheduler.into(),
            pod: "p".into(),
            verdict,
            reason: format!("{verdict:?} here"),
            ops: "rusty".into(),
            received,
        }
    }

    fn nodes(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    const STALE: Duration = Duration::from_secs(30);

    #[test]
    fn all_attached_is_true_and_rechecks_before_going_stale() {
        let now = Instant::now();
        let reports = HashMap::from([
            ("a".to_string(), report("s", NodeVerdict::Attached, now - Duration::from_secs(10))),
            ("b".to_string(), report("s", NodeVerdict::Attached, now)),
        ]);
        let k = summarize("s", &nodes(&["a", "b"]), 2, &reports, now, STALE);
        assert!(k.is_true);
        assert_eq!((k.attached, k.reason), (2, "KernelAttached"));
        assert_eq!(k.recheck_in, Some(Duration::from_secs(20)));
    }

    #[test]
    fn the_most_telling_problem_names_the_condition() {
        let now = Instant::now();
        let mut reports = HashMap::from([
            ("a".to_string(), report("s", NodeVerdict::Attached, now)),
            ("b".to_string(), report("s", NodeVerdict::NotAttached, now)),
        ]);
        let k = summarize("s", &nodes(&["a", "b", "c"]), 3, &reports, now, STALE);
        assert_eq!((k.is_true, k.attached, k.reason), (false, 1, "NotAttached"));
        assert!(k.message.starts_with("1 of 3"), "{}", k.message);
        assert!(k.message.contains("c: no report yet"), "{}", k.message);

        reports.insert("c".into(), report("s", NodeVerdict::KernelUnsupported, now));
        assert_eq!(summarize("s", &nodes(&["a", "b", "c"]), 3, &reports, now, STALE).reason, "KernelUnsupported");
        reports.insert("b".into(), report("s", NodeVerdict::ForeignScheduler, now));
        let k = summarize("s", &nodes(&["a", "b", "c"]), 3, &reports, now, STALE);
        assert_eq!(k.reason, "ForeignScheduler");
        assert!(k.message.contains("b: ForeignScheduler here"), "{}", k.message);
    }

    #[test]
    fn silent_nodes_go_stale() {
        let now = Instant::now();
        let reports =
            HashMap::from([("a".to_string(), report("s", NodeVerdict::Attached, now - Duration::from_secs(45)))]);
        let k = summarize("s", &nodes(&["a"]), 1, &reports, now, STALE);
        assert_eq!((k.is_true, k.attached, k.reason), (false, 0, "ReportStale"));
        assert!(k.message.contains("a: no report for 45s"), "{}", k.message);
        assert_eq!(k.recheck_in, None);
    }

    #[test]
    fn reports_of_another_scheduler_do_not_count() {
        let now = Instant::now();
        let reports = HashMap::from([("a".to_string(), report("other", NodeVerdict::Attached, now))]);
        let k = summarize("s", &nodes(&["a"]), 1, &reports, now, STALE);
        assert_eq!((k.attached, k.reason), (0, "NotAttached"));
    }

    #[test]
    fn no_desired_nodes_is_not_attached() {
        let k = summarize("s", &BTreeSet::new(), 0, &HashMap::new(), Instant::now(), STALE);
        assert!(!k.is_true);
        assert_eq!(k.attached, 0);
    }

    #[test]
    fn heartbeats_change_nothing_but_a_new_verdict_or_scheduler_does() {
        let t = KernelTable::default();
        let now = Instant::now();
        assert_eq!(t.record("a", report("s", NodeVerdict::NotAttached, now), STALE), vec!["s"]);
        assert!(t.record("a", report("s", NodeVerdict::NotAttached, now), STALE).is_empty());
        assert_eq!(t.record("a", report("s", NodeVerdict::Attached, now), STALE), vec!["s"]);
        assert_eq!(t.record("a", report("s2", NodeVerdict::Attached, now), STALE), vec!["s2", "s"]);
        // Back after a silence longer than the stale limit.
        let later = now + STALE + Duration::from_secs(1);
        assert_eq!(t.record("a", report("s2", NodeVerdict::Attached, later), STALE), vec!["s2"]);
        assert_eq!(t.read(|nodes| nodes["a"].scheduler.clone()), "s2");
    }
}
