//! Kernel truth per node, from the agents' reports, folded into a Scheduler's KernelAttached
//! condition: [`summarize`] reads a snapshot of the latest [`NodeReport`] per node (the
//! controller's reports server keeps them); [`grace_left`] says how long a new leader waits for
//! agents before it judges a node that has not reported.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use sked_api::verdict::Verdict;
use sked_api::{KernelExit, Reason};

/// At most this many nodes are named in a condition message.
const MAX_NODES_LISTED: usize = 3;

/// The latest report from one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeReport {
    pub scheduler: String,
    pub pod: String,
    /// The UID of the pod that sent it (its token is bound to that pod): a report counts for
    /// that pod alone, never for another of the same name or a Scheduler made again under the
    /// same name.
    pub pod_uid: String,
    /// When that pod was created (seconds since the epoch), if known: of two pods reporting
    /// for one node, the older is on its way out (a Scheduler made again, a pod replaced) and
    /// does not speak over the newer one while the newer one's report is fresh.
    pub pod_created: Option<i64>,
    /// That pod was terminating when it sent this (the controller's index said so): it yields
    /// to a pod that is not, whatever their creation times.
    pub leaving: bool,
    pub verdict: Verdict,
    pub reason: String,
    pub ops: String,
    pub received: Instant,
    /// Since when (seconds since the epoch) this pod's scheduler has been reported attached;
    /// kept by the controller's kernel table across heartbeats.
    pub attached_since: Option<i64>,
    /// This pod's scheduler was attached and no longer is: the kernel ejected it, or it exited.
    /// Kept by the kernel table for as long as the same pod reports.
    pub ejected: bool,
    /// Since when (seconds since the epoch) this pod's scheduler, which was attached, is away
    /// because the kernel asked it to restart (a CPU went on or off line): not an ejection while
    /// it attaches again within the rollout's attach timeout. Kept by the kernel table.
    pub restarting_since: Option<i64>,
    /// Marked by the kernel table once the report went stale.
    pub stale: bool,
    /// The node's last exit from the kernel log, since its agent started.
    pub last_exit: Option<KernelExit>,
    /// The scheduler's last statistics, sent once the kernel ended it (escaped and capped).
    pub scheduler_stats: Option<String>,
    /// What the agent said of the pods' CPU contract on the node (`None`: an agent that does not
    /// say).
    pub cpu_contract: Option<crate::cpu_contract::NodeCpuContract>,
    /// It came on a stream its agent holds to every controller replica: a standby heard it
    /// too, and keeps it into its term as leader. An agent that reaches the leader alone told
    /// another leader in the meantime, so its report is not kept into a new term.
    pub every_replica: bool,
}

impl NodeReport {
    /// Whether the report is fresh at `now`: received at most `stale_after` ago. The one
    /// definition of a report's freshness (the Scheduler's KernelAttached, each pod's
    /// condition and the rollout's view of a node all read it).
    pub fn fresh(&self, now: Instant, stale_after: Duration) -> bool {
        now.saturating_duration_since(self.received) <= stale_after
    }

    /// A report as its agent sent it, received at `received`: nothing kept across reports yet
    /// (attachment time, ejection, staleness, whether its exit was recorded).
    pub fn arrived(
        scheduler: String,
        pod: String,
        verdict: Verdict,
        reason: String,
        ops: String,
        received: Instant,
        last_exit: Option<KernelExit>,
    ) -> Self {
        Self {
            scheduler,
            pod,
            pod_uid: String::new(),
            pod_created: None,
            leaving: false,
            verdict,
            reason,
            ops,
            received,
            attached_since: None,
            ejected: false,
            restarting_since: None,
            stale: false,
            last_exit,
            scheduler_stats: None,
            cpu_contract: None,
            every_replica: false,
        }
    }

    /// The same report, from the pod with UID `uid`.
    pub fn from_pod(self, uid: &str) -> Self {
        Self { pod_uid: uid.to_owned(), ..self }
    }

    /// The same report, from a pod created at `created` (seconds since the epoch).
    pub fn created_at(self, created: Option<i64>) -> Self {
        Self { pod_created: created, ..self }
    }

    /// The same report, from a pod that is terminating (`leaving`) or not.
    pub fn leaving(self, leaving: bool) -> Self {
        Self { leaving, ..self }
    }

    /// Whether this report must not replace `held`, another pod's report on the same node, at
    /// `now`: `held` is fresh, and this one's pod is on its way out: it was created before
    /// `held`'s (to the second), or it is terminating while `held`'s was not.
    pub fn yields_to(&self, held: &NodeReport, now: Instant, stale_after: Duration) -> bool {
        if self.pod_uid == held.pod_uid || held.stale || !held.fresh(now, stale_after) {
            return false;
        }
        let older = matches!((self.pod_created, held.pod_created), (Some(mine), Some(theirs)) if mine < theirs);
        older || (self.leaving && !held.leaving)
    }

    /// The same report, marked as come on a stream its agent holds to every replica.
    pub fn from_every_replica(self, every_replica: bool) -> Self {
        Self { every_replica, ..self }
    }
}

/// Keeps the reports that count for one Scheduler: those sent by one of its pods, by UID, the
/// pods its own DaemonSet controls (`daemonset_uid`, the DaemonSet whose controller is that
/// Scheduler's UID; `None` before it has one). A Scheduler deleted and made again under the same
/// name does not read its predecessor's reports, nor a report of a pod that was replaced.
pub fn keep_own_reports(
    reports: &mut HashMap<String, NodeReport>,
    pods: &[std::sync::Arc<crate::pods::SchedulerPod>],
    daemonset_uid: Option<&str>,
) {
    let own: BTreeSet<&str> = pods
        .iter()
        .filter(|p| daemonset_uid.is_some_and(|ds| p.daemonset.as_ref().is_some_and(|(_, uid)| uid == ds)))
        .map(|p| p.uid.as_str())
        .collect();
    reports.retain(|_, r| own.contains(r.pod_uid.as_str()));
}

/// The key of one ejection, `node@time`: the same in a report, in this term's memory of the
/// events recorded, and in a KernelEjected event's note (its detail may come later).
pub fn ejection_key(node: &str, time: &str) -> String {
    format!("{node}@{time}")
}

/// Whether two exits are the same event (its detail may have come later).
pub fn same_exit(a: Option<&KernelExit>, b: Option<&KernelExit>) -> bool {
    matches!((a, b), (Some(a), Some(b)) if a.is_same_as(b))
}

/// The KernelAttached view of one Scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSummary {
    /// Scheduled nodes whose kernel runs this Scheduler (fresh Attached reports).
    pub attached: i32,
    /// The nodes counted: those that run the Scheduler's pod.
    pub scheduled: i32,
    pub is_true: bool,
    pub reason: Reason,
    pub message: String,
    /// Scheduled nodes with no report from this Scheduler's agent at all.
    pub unreported: usize,
    /// Whether this view may replace the condition written before: false while a new leader
    /// still gives agents time to report (see `--agent-heartbeat-interval`).
    pub settled: bool,
    /// The newest exit reported from the nodes.
    pub last_exit: Option<KernelExit>,
    /// The ejections the nodes report (each node's last exit, when the kernel ejected it), oldest
    /// first; which of them already have their event is the controller's memory to tell.
    pub ejections: Vec<KernelExit>,
    /// The pods' CPU contract on the attached nodes (the PodCPUContract condition).
    pub cpu_contract: crate::cpu_contract::ContractView,
}

/// How much longer a new leader gives agents to report before it judges a node that has not:
/// `grace` from the start of its term (`term_age` ago), and while agents are still coming back
/// (a node was first heard from less than a `heartbeat` ago, `since_arrival`), one heartbeat
/// more at a time, up to twice `grace`. A reconnect storm that outlasts the grace (a slow API
/// server reviewing thousands of tokens) does not turn the nodes still queued into changes.
pub fn grace_left(
    term_age: Duration,
    grace: Duration,
    heartbeat: Duration,
    since_arrival: Option<Duration>,
) -> Duration {
    if term_age < grace {
        return grace - term_age;
    }
    let arriving = since_arrival.is_some_and(|since| since < heartbeat);
    let limit = grace.saturating_mul(2);
    if arriving && term_age < limit { heartbeat.min(limit - term_age) } else { Duration::ZERO }
}

impl KernelSummary {
    /// Whether a new leader should keep the condition it found rather than this view: some of
    /// the `scheduled` nodes have not reported yet, they are all this view lacks (every node that
    /// reported is attached), and there is `grace_left`.
    pub fn awaits_reports(&self, scheduled: usize, grace_left: Duration) -> bool {
        let attached = usize::try_from(self.attached).unwrap_or(0);
        self.unreported > 0 && attached.saturating_add(self.unreported) >= scheduled && !grace_left.is_zero()
    }
}

/// Folds the reports of `nodes` into a Scheduler's KernelAttached view. `nodes` are the nodes
/// that run a pod of this Scheduler: the message counts them and lists among them, so its numbers
/// and its names are about the same nodes. `desired` is the DaemonSet's count of nodes that should
/// run a pod; the condition is true only once every one of them does and is attached.
pub fn summarize(
    scheduler: &str,
    nodes: &BTreeSet<String>,
    desired: i32,
    reports: &HashMap<String, NodeReport>,
    now: Instant,
    stale_after: Duration,
) -> KernelSummary {
    let mut attached = 0i32;
    let mut by_kind: BTreeMap<Reason, Vec<String>> = BTreeMap::new();
    let mut unreported = 0;
    let mut last_exit: Option<&KernelExit> = None;
    let mut ejections = Vec::new();
    let mut contract = crate::cpu_contract::Fold::default();
    for node in nodes {
        let report = reports.get(node).filter(|r| r.scheduler == scheduler);
        if let Some(exit) = report.and_then(|r| r.last_exit.as_ref()).filter(|e| e.ejected) {
            ejections.push(exit.clone());
        }
        if let Some(exit) = report.and_then(|r| r.last_exit.as_ref())
            && last_exit.is_none_or(|newest| exit.is_newer_than(newest))
        {
            last_exit = Some(exit);
        }
        let Some(r) = report else {
            unreported += 1;
            by_kind.entry(Reason::NotAttached).or_default().push(format!("{node}: no report yet"));
            continue;
        };
        if !r.fresh(now, stale_after) {
            let age = now.saturating_duration_since(r.received);
            by_kind.entry(Reason::ReportStale).or_default().push(format!("{node}: no report for {}s", age.as_secs()));
            continue;
        }
        let kind = match r.verdict {
            Verdict::Attached => {
                attached += 1;
                contract.add(node, r.cpu_contract.as_ref());
                continue;
            }
            Verdict::NotAttached => Reason::NotAttached,
            Verdict::ForeignScheduler => Reason::ForeignScheduler,
            Verdict::KernelUnsupported => Reason::KernelUnsupported,
        };
        let told = |e: &&KernelExit| e.ejected || (e.restart && r.restarting_since.is_some());
        match r.last_exit.as_ref().filter(told).filter(|_| kind == Reason::NotAttached) {
            Some(exit) => by_kind.entry(kind).or_default().push(format!("{node}: {}; {}", r.reason, exit.describe())),
            None => by_kind.entry(kind).or_default().push(format!("{node}: {}", r.reason)),
        }
    }
    let scheduled = i32::try_from(nodes.len()).unwrap_or(i32::MAX);
    let attached = attached.min(scheduled);
    let counted = format!("{attached} of {scheduled} scheduled nodes run this scheduler in the kernel");
    let (is_true, reason, message) = if scheduled == 0 && desired <= 0 {
        (false, Reason::NotAttached, "No node is scheduled to run this scheduler".to_owned())
    } else if attached >= scheduled && scheduled >= desired {
        (true, Reason::KernelAttached, counted)
    } else if attached >= scheduled {
        let waiting = desired - scheduled;
        let nodes = if waiting == 1 { "node waits" } else { "nodes wait" };
        (false, Reason::NotAttached, format!("{counted}; {waiting} more {nodes} for a pod"))
    } else {
        // The most telling problem names the condition.
        let reason = [Reason::ForeignScheduler, Reason::KernelUnsupported, Reason::ReportStale, Reason::NotAttached]
            .into_iter()
            .find(|k| by_kind.contains_key(k))
            .unwrap_or(Reason::NotAttached);
        let listed = by_kind.get(&reason).map(|v| list(v)).unwrap_or_default();
        (false, reason, format!("{counted}; {listed}"))
    };
    ejections.sort_by(|a: &KernelExit, b| (a.time.as_str(), a.node.as_str()).cmp(&(b.time.as_str(), b.node.as_str())));
    KernelSummary {
        attached,
        scheduled,
        is_true,
        reason,
        message,
        unreported,
        settled: true,
        last_exit: last_exit.cloned(),
        ejections,
        cpu_contract: contract.finish(),
    }
}

fn list(items: &[String]) -> String {
    let shown: Vec<&str> = items.iter().take(MAX_NODES_LISTED).map(String::as_str).collect();
    let more = items.len().saturating_sub(MAX_NODES_LISTED);
    if more > 0 { format!("{} (and {more} more)", shown.join("; ")) } else { shown.join("; ") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(scheduler: &str, verdict: Verdict, received: Instant) -> NodeReport {
        NodeReport::arrived(
            scheduler.into(),
            "p".into(),
            verdict,
            format!("{verdict:?} here"),
            "rusty".into(),
            received,
            None,
        )
    }

    fn nodes(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    const STALE: Duration = Duration::from_secs(30);

    #[test]
    fn a_report_counts_for_its_own_pod_of_its_own_daemonset_only() {
        use crate::test_objects::{pod, report};
        let mine = |name: &str, uid: &str, ds: &str| {
            let mut p = pod(name);
            p.uid = uid.into();
            p.daemonset = Some(("s".into(), ds.into()));
            std::sync::Arc::new(p)
        };
        let pods = vec![mine("s-a", "u1", "ds-now"), mine("s-b", "u2", "ds-before")];
        let now = Instant::now();
        let mut reports: HashMap<String, NodeReport> = [
            ("a", report("s-a", Verdict::Attached, now).from_pod("u1")),
            // The Scheduler made before under the same name: its pod, its DaemonSet.
            ("b", report("s-b", Verdict::Attached, now).from_pod("u2")),
            // A pod of the same name, another UID (replaced).
            ("c", report("s-a", Verdict::Attached, now).from_pod("u9")),
        ]
        .into_iter()
        .map(|(n, r)| (n.to_owned(), r))
        .collect();
        let mut before = reports.clone();
        keep_own_reports(&mut reports, &pods, Some("ds-now"));
        assert_eq!(reports.keys().collect::<Vec<_>>(), ["a"]);
        keep_own_reports(&mut before, &pods, None);
        assert!(before.is_empty(), "no DaemonSet of its own yet: no report is its own");
    }

    #[test]
    fn the_message_counts_and_lists_the_same_nodes() {
        let now = Instant::now();
        let reports = HashMap::from([("a".to_string(), report("s", Verdict::Attached, now))]);
        // Two nodes run a pod (the DaemonSet wants 2); nodes without a pod are not named.
        let k = summarize("s", &nodes(&["a", "b"]), 2, &reports, now, STALE);
        assert_eq!(k.message, "1 of 2 scheduled nodes run this scheduler in the kernel; b: no report yet");
        // Every node with a pod is attached, but the DaemonSet wants one more pod.
        let k = summarize("s", &nodes(&["a"]), 2, &reports, now, STALE);
        assert!(!k.is_true);
        assert_eq!(k.message, "1 of 1 scheduled nodes run this scheduler in the kernel; 1 more node waits for a pod");
    }

    #[test]
    fn all_attached_is_true() {
        let now = Instant::now();
        let reports = HashMap::from([
            ("a".to_string(), report("s", Verdict::Attached, now - Duration::from_secs(10))),
            ("b".to_string(), report("s", Verdict::Attached, now)),
        ]);
        let k = summarize("s", &nodes(&["a", "b"]), 2, &reports, now, STALE);
        assert!(k.is_true);
        assert_eq!((k.attached, k.reason.as_str()), (2, "KernelAttached"));
    }

    #[test]
    fn the_most_telling_problem_names_the_condition() {
        let now = Instant::now();
        let mut reports = HashMap::from([
            ("a".to_string(), report("s", Verdict::Attached, now)),
            ("b".to_string(), report("s", Verdict::NotAttached, now)),
        ]);
        let k = summarize("s", &nodes(&["a", "b", "c"]), 3, &reports, now, STALE);
        assert_eq!((k.is_true, k.attached, k.reason.as_str()), (false, 1, "NotAttached"));
        assert!(k.message.starts_with("1 of 3"), "{}", k.message);
        assert!(k.message.contains("c: no report yet"), "{}", k.message);

        reports.insert("c".into(), report("s", Verdict::KernelUnsupported, now));
        assert_eq!(summarize("s", &nodes(&["a", "b", "c"]), 3, &reports, now, STALE).reason, Reason::KernelUnsupported);
        reports.insert("b".into(), report("s", Verdict::ForeignScheduler, now));
        let k = summarize("s", &nodes(&["a", "b", "c"]), 3, &reports, now, STALE);
        assert_eq!(k.reason, Reason::ForeignScheduler);
        assert!(k.message.contains("b: ForeignScheduler here"), "{}", k.message);
    }

    #[test]
    fn silent_nodes_go_stale() {
        let now = Instant::now();
        let reports = HashMap::from([("a".to_string(), report("s", Verdict::Attached, now - Duration::from_secs(45)))]);
        let k = summarize("s", &nodes(&["a"]), 1, &reports, now, STALE);
        assert_eq!((k.is_true, k.attached, k.reason.as_str()), (false, 0, "ReportStale"));
        assert!(k.message.contains("a: no report for 45s"), "{}", k.message);
    }

    #[test]
    fn reports_of_another_scheduler_do_not_count() {
        let now = Instant::now();
        let reports = HashMap::from([("a".to_string(), report("other", Verdict::Attached, now))]);
        let k = summarize("s", &nodes(&["a"]), 1, &reports, now, STALE);
        assert_eq!((k.attached, k.reason.as_str()), (0, "NotAttached"));
    }

    #[test]
    fn no_desired_nodes_is_not_attached() {
        let k = summarize("s", &BTreeSet::new(), 0, &HashMap::new(), Instant::now(), STALE);
        assert!(!k.is_true);
        assert_eq!(k.attached, 0);
    }

    #[test]
    fn a_new_leader_waits_its_grace_and_longer_while_agents_still_arrive() {
        let (grace, beat) = (Duration::from_secs(30), Duration::from_secs(10));
        let s = Duration::from_secs;
        assert_eq!(grace_left(s(0), grace, beat, None), s(30));
        assert_eq!(grace_left(s(12), grace, beat, Some(s(1))), s(18), "the grace first");
        assert_eq!(grace_left(s(30), grace, beat, None), Duration::ZERO, "nobody came back: judged");
        assert_eq!(grace_left(s(31), grace, beat, Some(s(11))), Duration::ZERO, "arrivals stopped");
        assert_eq!(grace_left(s(31), grace, beat, Some(s(2))), s(10), "still arriving: a heartbeat more");
        assert_eq!(grace_left(s(55), grace, beat, Some(s(0))), s(5), "never past twice the grace");
        assert_eq!(grace_left(s(60), grace, beat, Some(s(0))), Duration::ZERO);
    }

    #[test]
    fn the_newest_exit_is_summarized_and_an_ejection_named_in_the_message() {
        let now = Instant::now();
        let exit = |node: &str, time: &str| KernelExit {
            node: node.into(),
            ops: "lavd".into(),
            reason: "disabled by sysrq-S".into(),
            detail: String::new(),
            time: time.into(),
            ejected: true,
            restart: false,
            trace: Vec::new(),
        };
        let mut a = report("s", Verdict::NotAttached, now);
        a.last_exit = Some(exit("a", "2026-12-01T00:00:02.000Z"));
        let mut b = report("s", Verdict::Attached, now);
        b.last_exit = Some(exit("b", "2026-12-01T00:00:01.000Z"));
        let reports = HashMap::from([("a".to_string(), a), ("b".to_string(), b)]);
        let k = summarize("s", &nodes(&["a", "b"]), 2, &reports, now, STALE);
        assert_eq!(k.last_exit.map(|e| e.node), Some("a".into()));
        assert!(
            k.message.contains(
                "a: NotAttached here; the kernel ejected lavd at 2026-12-01T00:00:02.000Z (disabled by sysrq-S)"
            ),
            "{}",
            k.message
        );
    }

    #[test]
    fn a_new_leader_waits_only_for_missing_reports() {
        let now = Instant::now();
        let grace = Duration::from_secs(20);
        let mut reports = HashMap::from([("a".to_string(), report("s", Verdict::Attached, now))]);
        let k = summarize("s", &nodes(&["a", "b"]), 2, &reports, now, STALE);
        assert!(k.awaits_reports(2, grace), "b has not reported yet");
        assert!(!k.awaits_reports(2, Duration::ZERO), "not past the grace");
        reports.insert("b".into(), report("s", Verdict::Attached, now));
        assert!(!summarize("s", &nodes(&["a", "b"]), 2, &reports, now, STALE).awaits_reports(2, grace), "all heard");
        // A node that reported a problem is news at once, even while another is still missing.
        reports.insert("b".into(), report("s", Verdict::NotAttached, now));
        let k = summarize("s", &nodes(&["a", "b", "c"]), 3, &reports, now, STALE);
        assert!(!k.awaits_reports(3, grace));
    }
}
