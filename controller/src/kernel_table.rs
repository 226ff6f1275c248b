//! The latest report per node, shared by the reports server (which fills it) and the reconcile
//! (which reads a snapshot and folds it with [`summarize`], from `sked_core::kernel_summary`).

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sked_api::KernelExit;
use sked_api::verdict::Verdict;

use crate::mutex::lock;

pub use sked_core::kernel_summary::{KernelSummary, NodeReport, ejection_key, grace_left, same_exit, summarize};

/// Latest report per node, shared by the reports server and the reconciler.
#[derive(Debug, Default)]
pub struct KernelTable {
    nodes: Mutex<HashMap<String, NodeReport>>,
    /// Nodes whose verdict changed since [`KernelTable::take_changed`] last took them (the support
    /// labels follow verdicts), and a wake-up for whoever takes them.
    changed_nodes: Mutex<BTreeSet<String>>,
    verdicts: tokio::sync::Notify,
    /// When a node was last heard from for the first time (or again after its stale report was
    /// forgotten): agents coming back to a new leader.
    last_arrival: Mutex<Option<Instant>>,
    /// The nodes' health samples, which come with their reports.
    pub health: crate::health_table::HealthTable,
}

impl KernelTable {
    /// Stores a node's report. Returns the Schedulers whose kernel view changed (the reporting
    /// one, and a previous one on that node), or nothing for a heartbeat that changes nothing.
    /// A heartbeat after `stale_after` of silence is news: the node is back.
    /// A report from a pod on its way out (older than the one whose fresh report the node holds,
    /// or terminating) changes nothing (see [`NodeReport::yields_to`]): while a replaced pod
    /// terminates, its agent still reports for the node beside the new pod's.
    pub fn record(&self, node: &str, mut report: NodeReport, stale_after: Duration) -> Vec<String> {
        let mut nodes = lock(&self.nodes);
        if nodes.get(node).is_some_and(|held| report.yields_to(held, report.received, stale_after)) {
            return Vec::new();
        }
        let same_pod = nodes
            .get(node)
            .filter(|p| p.pod == report.pod && p.pod_uid == report.pod_uid && p.scheduler == report.scheduler);
        let was_attached = same_pod.and_then(|p| p.attached_since);
        let now = jiff::Timestamp::now().as_second();
        if report.verdict == Verdict::Attached {
            report.attached_since = Some(was_attached.unwrap_or(now));
            (report.ejected, report.restarting_since) = (false, None);
        } else {
            report.attached_since = None;
            // Away since the kernel asked it to restart (its last exit says so): not ejected,
            // unless it was before.
            let restarting = same_pod.and_then(|p| p.restarting_since);
            let away = was_attached.is_some() || restarting.is_some();
            let ejected_before = same_pod.is_some_and(|p| p.ejected);
            // A restart the kernel asked for since the scheduler attached (an older one was
            // answered: the scheduler attached again after it).
            let asked_since = |e: &KernelExit| {
                let at = e.time.parse::<jiff::Timestamp>().map_or(i64::MIN, |t| t.as_second());
                e.restart && was_attached.is_none_or(|since| at + 1 >= since)
            };
            if away && !ejected_before && report.last_exit.as_ref().is_some_and(asked_since) {
                (report.ejected, report.restarting_since) = (false, Some(restarting.unwrap_or(now)));
            } else {
                (report.ejected, report.restarting_since) = (away || ejected_before, None);
            }
        }
        let previous = nodes.insert(node.to_owned(), report.clone());
        if previous.is_none() {
            *lock(&self.last_arrival) = Some(report.received);
        }
        if previous.as_ref().is_none_or(|p| p.verdict != report.verdict || p.stale) {
            lock(&self.changed_nodes).insert(node.to_owned());
            self.verdicts.notify_one();
        }
        match previous {
            Some(p)
                if p.scheduler == report.scheduler
                    && p.pod == report.pod
                    && p.pod_uid == report.pod_uid
                    && p.verdict == report.verdict
                    && p.reason == report.reason
                    && p.last_exit == report.last_exit
                    && p.cpu_contract.as_ref().map(|c| c.standing())
                        == report.cpu_contract.as_ref().map(|c| c.standing())
                    && report.received.saturating_duration_since(p.received) <= stale_after =>
            {
                Vec::new()
            }
            Some(p) if p.scheduler != report.scheduler => vec![report.scheduler, p.scheduler],
            _ => vec![report.scheduler],
        }
    }

    /// Marks the reports older than `stale_after` stale, and returns the Schedulers of those
    /// that just went stale: each node's silence touches only its own Scheduler, once.
    pub fn expire(&self, now: Instant, stale_after: Duration) -> Vec<String> {
        let mut nodes = lock(&self.nodes);
        nodes
            .values_mut()
            .filter(|r| !r.stale && now.saturating_duration_since(r.received) > stale_after)
            .map(|r| {
                r.stale = true;
                r.scheduler.clone()
            })
            .collect()
    }

    /// Drops the stale reports of nodes `known` no longer names (deleted Nodes): the table holds
    /// one entry per node that ever reported, and a fleet replaces nodes. A fresh report is kept
    /// whatever `known` says (its Node may not be in the index yet). Returns how many went.
    pub fn forget_unknown(&self, known: impl Fn(&str) -> bool) -> usize {
        let mut nodes = lock(&self.nodes);
        let before = nodes.len();
        nodes.retain(|node, r| !r.stale || known(node));
        self.health.retain(|node| nodes.contains_key(node));
        before - nodes.len()
    }

    /// What a new leadership term keeps: the reports that came on streams their agents hold to
    /// every replica and are not stale (by age, `stale_after` at `now`: the stale mark is set
    /// only once a second). Every other node is waited for as a node never heard: an agent
    /// that reaches the leader alone told another leader in the meantime. Returns how many
    /// went.
    pub fn forget_for_new_term(&self, now: Instant, stale_after: Duration) -> usize {
        let mut nodes = lock(&self.nodes);
        let before = nodes.len();
        nodes.retain(|_, r| r.every_replica && !r.stale && now.saturating_duration_since(r.received) <= stale_after);
        before - nodes.len()
    }

    /// When a node was last heard from for the first time, or again after its stale report was
    /// forgotten.
    pub fn last_arrival(&self) -> Option<Instant> {
        *lock(&self.last_arrival)
    }

    /// Drops a node's report: what it said is about a kernel the node no longer runs.
    pub fn forget(&self, node: &str) {
        lock(&self.nodes).remove(node);
    }

    /// Resolves after a node's verdict changed (or at once, if one did since the last call).
    pub async fn changed(&self) {
        self.verdicts.notified().await;
    }

    /// The nodes whose verdict changed since the last call.
    pub fn take_changed(&self) -> BTreeSet<String> {
        std::mem::take(&mut *lock(&self.changed_nodes))
    }

    /// The reports of `nodes`, copied under one lock: what one reconcile reads of the table (a
    /// few nodes of a table that can hold thousands), so all it decides sees the same reports.
    pub fn reports_of<'a>(&self, nodes: impl IntoIterator<Item = &'a String>) -> HashMap<String, NodeReport> {
        let table = lock(&self.nodes);
        nodes.into_iter().filter_map(|n| Some((n.clone(), table.get(n)?.clone()))).collect()
    }

    /// Runs `f` on the table under its lock, without copying it.
    pub fn read<R>(&self, f: impl FnOnce(&HashMap<String, NodeReport>) -> R) -> R {
        f(&lock(&self.nodes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::KernelExit;

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
    fn heartbeats_change_nothing_but_a_new_verdict_or_scheduler_does() {
        let t = KernelTable::default();
        let now = Instant::now();
        assert_eq!(t.record("a", report("s", Verdict::NotAttached, now), STALE), vec!["s"]);
        assert!(t.record("a", report("s", Verdict::NotAttached, now), STALE).is_empty());
        assert_eq!(t.record("a", report("s", Verdict::Attached, now), STALE), vec!["s"]);
        assert_eq!(t.record("a", report("s2", Verdict::Attached, now), STALE), vec!["s2", "s"]);
        // Back after a silence longer than the stale limit.
        let later = now + STALE + Duration::from_secs(1);
        assert_eq!(t.record("a", report("s2", Verdict::Attached, later), STALE), vec!["s2"]);
        assert_eq!(t.read(|nodes| nodes["a"].scheduler.clone()), "s2");
        // A new pod of the same Scheduler reporting the same: its rollout waits for that pod.
        let replaced = NodeReport { pod: "p2".into(), ..report("s2", Verdict::Attached, later) };
        assert_eq!(t.record("a", replaced.clone(), STALE), vec!["s2"]);
        assert!(t.record("a", replaced, STALE).is_empty());
    }

    #[test]
    fn a_terminating_older_pod_does_not_speak_over_the_newer_one() {
        let t = KernelTable::default();
        let now = Instant::now();
        let of = |uid: &str, created: i64, received: Instant| {
            report("s", Verdict::Attached, received).from_pod(uid).created_at(Some(created))
        };
        assert_eq!(t.record("a", of("old", 100, now), STALE), vec!["s"]);
        assert_eq!(t.record("a", of("new", 101, now), STALE), vec!["s"], "the newer pod replaces the older");
        // The older pod's agent, still up while its pod terminates, keeps reporting: nothing changes.
        for k in 1..5 {
            assert!(t.record("a", of("old", 100, now + STALE / 8 * k), STALE).is_empty());
        }
        assert_eq!(t.read(|n| n["a"].pod_uid.clone()), "new");
        // Once the newer pod's report is stale, the older one speaks again.
        let later = now + STALE + Duration::from_secs(1);
        assert_eq!(t.record("a", of("old", 100, later), STALE), vec!["s"]);
        assert_eq!(t.read(|n| n["a"].pod_uid.clone()), "old");
        // Pods created in the same second: a terminating one yields to one that is not; else
        // (or for pods of unknown age) the latest report wins.
        assert_eq!(t.record("a", of("twin", 100, later), STALE), vec!["s"]);
        assert!(t.record("a", of("old", 100, later).leaving(true), STALE).is_empty(), "the leaving twin yields");
        assert_eq!(t.read(|n| n["a"].pod_uid.clone()), "twin");
        let unknown = report("s", Verdict::Attached, later).from_pod("unknown");
        assert_eq!(t.record("a", unknown, STALE), vec!["s"]);
    }

    #[test]
    fn only_a_node_new_to_the_table_is_an_arrival() {
        let t = KernelTable::default();
        assert_eq!(t.last_arrival(), None);
        let now = Instant::now();
        t.record("a", report("s", Verdict::Attached, now), STALE);
        assert_eq!(t.last_arrival(), Some(now), "a node new to the table arrived");
        t.record("a", report("s", Verdict::Attached, now + STALE), STALE);
        assert_eq!(t.last_arrival(), Some(now), "a known node's report is no arrival");
    }

    #[test]
    fn a_new_term_keeps_only_fresh_reports_from_streams_to_every_replica() {
        let t = KernelTable::default();
        let now = Instant::now();
        let every = |received| report("s", Verdict::Attached, received).from_every_replica(true);
        t.record("old", every(now), STALE);
        t.record("aging", every(now + STALE / 2), STALE);
        t.record("fresh", every(now + STALE), STALE);
        t.record("leader-only", report("s", Verdict::Attached, now + STALE), STALE);
        assert_eq!(t.expire(now + STALE + STALE / 4, STALE), ["s"], "the old report went stale");
        // Past the stale limit of "aging", before the next expiry marks it.
        assert_eq!(t.forget_for_new_term(now + STALE + STALE * 3 / 4, STALE), 3);
        let left: BTreeSet<String> = t.read(|n| n.keys().cloned().collect());
        assert_eq!(left, BTreeSet::from(["fresh".to_owned()]));
        let back = now + STALE * 2;
        t.record("old", every(back), STALE);
        assert_eq!(t.last_arrival(), Some(back), "the forgotten node arrives again");
    }

    #[test]
    fn silence_expires_a_node_once_and_a_report_brings_it_back() {
        let t = KernelTable::default();
        let now = Instant::now();
        t.record("a", report("s", Verdict::Attached, now), STALE);
        t.record("b", report("s2", Verdict::Attached, now + Duration::from_secs(20)), STALE);
        assert!(t.expire(now + STALE, STALE).is_empty(), "not older than the limit yet");
        let later = now + STALE + Duration::from_secs(1);
        assert_eq!(t.expire(later, STALE), vec!["s"], "only the silent node's Scheduler");
        assert!(t.expire(later, STALE).is_empty(), "once");
        // The node reports again: news for its Scheduler, and it may go stale again later.
        assert_eq!(t.record("a", report("s", Verdict::Attached, later), STALE), vec!["s"]);
        assert_eq!(t.expire(later + STALE + Duration::from_secs(1), STALE).len(), 2);
    }

    #[test]
    fn only_stale_reports_of_unknown_nodes_are_forgotten() {
        let t = KernelTable::default();
        let long_ago = Instant::now();
        for node in ["kept", "gone", "new"] {
            t.record(node, report("s", Verdict::Attached, long_ago), STALE);
        }
        t.expire(long_ago + STALE * 2, STALE);
        t.record("new", report("s", Verdict::Attached, long_ago + STALE * 2), STALE);
        assert_eq!(t.forget_unknown(|n| n == "kept"), 1, "only the stale report of a deleted node goes");
        let left: BTreeSet<String> = t.read(|n| n.keys().cloned().collect());
        assert_eq!(left, nodes(&["kept", "new"]), "a fresh report of a node not indexed yet stays");
    }

    #[test]
    fn an_ejection_is_listed_until_the_term_recorded_it_and_stays_recorded_while_reported() {
        let (t, memo) = (KernelTable::default(), crate::memo::Memo::default());
        let now = Instant::now();
        let stall = KernelExit {
            node: "a".into(),
            ops: "lavd".into(),
            reason: "runnable task stall".into(),
            time: "2026-12-01T00:00:01.000Z".into(),
            ejected: true,
            ..KernelExit::default()
        };
        let mut r = report("s", Verdict::NotAttached, now);
        r.last_exit = Some(stall.clone());
        t.record("a", r.clone(), STALE);
        // What the reconcile lists: the table's ejections the term has not recorded.
        let listed = |t: &KernelTable, memo: &crate::memo::Memo| {
            let mut listed = t.read(|n| summarize("s", &nodes(&["a"]), 1, n, now, STALE).ejections);
            listed.retain(|e| !memo.exit_recorded(e));
            listed
        };
        assert_eq!(listed(&t, &memo), vec![stall.clone()]);
        memo.exits_recorded(std::slice::from_ref(&stall));
        assert!(listed(&t, &memo).is_empty());
        // Heartbeats, and the detail line in a later report, are the same exit.
        r.last_exit = Some(KernelExit { detail: "x[1] failed to run for 2s".into(), ..stall.clone() });
        t.record("a", r.clone(), STALE);
        assert!(listed(&t, &memo).is_empty());
        // The next one is new.
        r.last_exit = Some(KernelExit { time: "2026-12-01T00:01:00.000Z".into(), ..stall.clone() });
        t.record("a", r.clone(), STALE);
        assert_eq!(listed(&t, &memo).len(), 1);
        // A new term remembers nothing (the events tell it what an earlier term recorded).
        memo.exits_recorded(&listed(&t, &memo));
        memo.new_term();
        assert_eq!(listed(&t, &memo).len(), 1);
    }

    #[test]
    fn a_new_exit_is_news() {
        let t = KernelTable::default();
        let now = Instant::now();
        t.record("a", report("s", Verdict::NotAttached, now), STALE);
        let mut r = report("s", Verdict::NotAttached, now);
        r.last_exit = Some(KernelExit { node: "a".into(), time: "t".into(), ..KernelExit::default() });
        assert_eq!(t.record("a", r.clone(), STALE), vec!["s"]);
        assert!(t.record("a", r, STALE).is_empty());
    }

    #[test]
    fn attachment_is_dated_and_an_ejection_remembered_for_the_same_pod() {
        let t = KernelTable::default();
        let now = Instant::now();
        t.record("a", report("s", Verdict::NotAttached, now), STALE);
        assert_eq!(t.read(|n| (n["a"].attached_since, n["a"].ejected)), (None, false));
        t.record("a", report("s", Verdict::Attached, now), STALE);
        let since = t.read(|n| n["a"].attached_since);
        assert!(since.is_some());
        t.record("a", report("s", Verdict::Attached, now), STALE);
        assert_eq!(t.read(|n| n["a"].attached_since), since, "a heartbeat keeps the date");
        t.record("a", report("s", Verdict::NotAttached, now), STALE);
        assert_eq!(t.read(|n| (n["a"].attached_since, n["a"].ejected)), (None, true));
        t.record("a", report("s", Verdict::NotAttached, now), STALE);
        assert!(t.read(|n| n["a"].ejected), "remembered while the same pod reports");
        let mut next = report("s", Verdict::NotAttached, now);
        next.pod = "p2".into();
        t.record("a", next, STALE);
        assert!(!t.read(|n| n["a"].ejected), "a new pod starts clean");
    }

    #[test]
    fn a_restart_the_kernel_asked_for_is_no_ejection_and_ends_when_it_attaches_again() {
        let t = KernelTable::default();
        let now = Instant::now();
        let logged = jiff::Timestamp::now().to_string();
        let away = |exit: &str, restart: bool| {
            let mut r = report("s", Verdict::NotAttached, now);
            let time = logged.clone();
            r.last_exit =
                Some(KernelExit { node: "a".into(), reason: exit.into(), restart, time, ..KernelExit::default() });
            r
        };
        let state = |t: &KernelTable| t.read(|n| (n["a"].ejected, n["a"].restarting_since.is_some()));
        // Never attached: a restart is nothing to wait for.
        t.record("a", away("unregistered from the main kernel", true), STALE);
        assert_eq!(state(&t), (false, false));
        t.record("a", report("s", Verdict::Attached, now), STALE);
        t.record("a", away("unregistered from the main kernel", true), STALE);
        assert_eq!(state(&t), (false, true), "away for a restart");
        let since = t.read(|n| n["a"].restarting_since);
        t.record("a", away("unregistered from the main kernel", true), STALE);
        assert_eq!(t.read(|n| n["a"].restarting_since), since, "a heartbeat keeps when it went");
        t.record("a", report("s", Verdict::Attached, now), STALE);
        assert_eq!(state(&t), (false, false), "back");
        // Thrown out after that: an ejection, and it stays one.
        t.record("a", away("disabled by sysrq-S", false), STALE);
        assert_eq!(state(&t), (true, false));
        t.record("a", away("unregistered from the main kernel", true), STALE);
        assert_eq!(state(&t), (true, false), "an ejection is not undone by a later restart");
        // A restart asked for before the scheduler attached again was answered: leaving after
        // that, with no newer line in the log, is an ejection.
        let t = KernelTable::default();
        let mut old = away("unregistered from the main kernel", true);
        old.last_exit.iter_mut().for_each(|e| e.time = "2020-01-01T00:00:00.000Z".into());
        t.record("a", report("s", Verdict::Attached, now), STALE);
        t.record("a", old, STALE);
        assert_eq!(state(&t), (true, false));
    }
}
