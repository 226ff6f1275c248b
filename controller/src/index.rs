//! What the controller knows of the cluster: every Scheduler (the store the reconcile loop reads)
//! and the arbiter's view of Schedulers and Nodes. One watch per kind feeds it, each owned by one
//! task and applied event by event (a relist replaces the whole set at once). The Scheduler store
//! and the arbiter change under one lock, so a reconcile reads a spec and the placement computed
//! from that same spec ([`Index::snapshot`]). Every Scheduler an event touches is triggered for a
//! reconcile: the one that changed, and every one whose placement moved. The scheduler pods are
//! kept too, so a Scheduler's kernel view counts the nodes that really run its pod.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::{Notify, watch};
use tracing::warn;

use crate::api::Scheduler;
use crate::memo::Memo;
use crate::metrics::Metrics;
use crate::mutex::lock;
use sked_core::arbiter::{Arbiter, Changed, Claim, Placement};
use sked_core::nodes::NodeFacts;
use sked_core::plan;
use sked_core::pods::SchedulerPod;
use sked_core::workload::{FIELD_MANAGER, MANAGED_BY, MANAGED_BY_LABEL, NAME_LABEL, OWNER_LABEL};

/// Schedulers to reconcile, sent by the indexes, the reports server and policy changes.
pub(crate) use crate::triggers::Triggers;

/// Read side of the index, shared by the reconcile loop and the servers.
#[derive(Clone)]
pub(crate) struct Index {
    arbiter: Arc<Mutex<Arbiter>>,
    schedulers: Store<Scheduler>,
    /// The scheduler pods (those sked manages in the workload namespace), as facts.
    pods: Arc<Mutex<PodSet>>,
    /// The Schedulers' DaemonSets.
    daemonsets: Store<DaemonSet>,
    /// Woken when a Node or a Scheduler changed: the owner labels may need writing.
    ownership: Arc<Notify>,
    /// Each Node's facts: when it was created (a node that joined after a Scheduler was
    /// created enters it at once), whether it is down, the taints that keep pods away.
    node_facts: NodeFactsByName,
    /// Each Node's resourceVersion as last seen: whether the watch caught up with a write.
    node_versions: NodeVersions,
}

type NodeFactsByName = Arc<Mutex<HashMap<String, Arc<NodeFacts>>>>;
type NodeVersions = Arc<Mutex<HashMap<String, u64>>>;

/// Write side of the index: the Scheduler, Node, pod and DaemonSet feeds, joined in one task
/// ([`Feeds::run`]).
pub(crate) struct Feeds {
    arbiter: Arc<Mutex<Arbiter>>,
    store: reflector::store::Writer<Scheduler>,
    pods: Arc<Mutex<PodSet>>,
    daemonsets: reflector::store::Writer<DaemonSet>,
    ownership: Arc<Notify>,
    node_facts: NodeFactsByName,
    node_versions: NodeVersions,
}

/// The facts of the scheduler pods, by name (who may report) and by Scheduler (what a reconcile
/// reads), changed only by the pod feed.
#[derive(Default)]
pub(crate) struct PodSet {
    by_name: HashMap<String, Arc<SchedulerPod>>,
    by_scheduler: HashMap<String, BTreeMap<String, Arc<SchedulerPod>>>,
}

impl PodSet {
    /// Keeps `pod` in place of the pod of that name; returns the one it replaces.
    fn insert(&mut self, pod: SchedulerPod) -> Option<Arc<SchedulerPod>> {
        let before = self.remove(&pod.name);
        let pod = Arc::new(pod);
        if let Some(scheduler) = &pod.scheduler {
            self.by_scheduler.entry(scheduler.clone()).or_default().insert(pod.name.clone(), pod.clone());
        }
        self.by_name.insert(pod.name.clone(), pod);
        before
    }

    fn remove(&mut self, name: &str) -> Option<Arc<SchedulerPod>> {
        let before = self.by_name.remove(name)?;
        if let Some(scheduler) = &before.scheduler
            && let Some(pods) = self.by_scheduler.get_mut(scheduler)
        {
            pods.remove(name);
            if pods.is_empty() {
                self.by_scheduler.remove(scheduler);
            }
        }
        Some(before)
    }

    /// The Schedulers that have a pod.
    fn schedulers(&self) -> BTreeSet<String> {
        self.by_scheduler.keys().cloned().collect()
    }
}

/// An empty index and its feeds.
pub(crate) fn index() -> (Index, Feeds) {
    let arbiter = Arc::new(Mutex::new(Arbiter::new()));
    let (schedulers, store) = reflector::store();
    let pods = Arc::new(Mutex::new(PodSet::default()));
    let (daemonset_reader, daemonsets) = reflector::store();
    let ownership = Arc::new(Notify::new());
    let node_facts = NodeFactsByName::default();
    let node_versions = NodeVersions::default();
    (
        Index {
            arbiter: arbiter.clone(),
            schedulers,
            pods: pods.clone(),
            daemonsets: daemonset_reader,
            ownership: ownership.clone(),
            node_facts: node_facts.clone(),
            node_versions: node_versions.clone(),
        },
        Feeds { arbiter, store, pods, daemonsets, ownership, node_facts, node_versions },
    )
}

impl Index {
    /// The Scheduler store (what the reconcile loop is built on).
    pub(crate) fn store(&self) -> Store<Scheduler> {
        self.schedulers.clone()
    }

    /// The current copy of the Scheduler `name` and its placement, read at the same moment; `None`
    /// once it is deleted.
    pub(crate) fn snapshot(&self, name: &str) -> Option<(Arc<Scheduler>, Placement)> {
        let arbiter = lock(&self.arbiter);
        let scheduler = self.schedulers.get(&ObjectRef::new(name))?;
        Some((scheduler, arbiter.placement(name)))
    }

    /// Whether the Scheduler `name` asks for the analysis of its bakes (its nodes' health samples
    /// are worth keeping).
    pub(crate) fn analysed(&self, name: &str) -> bool {
        let scheduler = self.schedulers.get(&ObjectRef::new(name));
        scheduler.is_some_and(|s| s.spec.rollout.as_ref().is_some_and(|r| r.analysis.is_some()))
    }

    /// The DaemonSet of the Scheduler `name`, as last seen (it may lag behind a write just made).
    pub(crate) fn daemonset(&self, name: &str, namespace: &str) -> Option<Arc<DaemonSet>> {
        self.daemonsets.get(&ObjectRef::new(name).within(namespace))
    }

    /// The scheduler pod `name` of the workload namespace, as last seen.
    pub(crate) fn pod(&self, name: &str) -> Option<Arc<SchedulerPod>> {
        lock(&self.pods).by_name.get(name).cloned()
    }

    /// The value of one label of a known Node: `None` for an unknown Node, `Some(None)` for a
    /// Node without that label.
    pub(crate) fn node_label(&self, name: &str, key: &str) -> Option<Option<String>> {
        lock(&self.arbiter).node_labels(name).map(|labels| labels.get(key).cloned())
    }

    /// Whether a Node of that name exists (as last seen).
    pub(crate) fn knows_node(&self, name: &str) -> bool {
        lock(&self.arbiter).node_labels(name).is_some()
    }

    /// Every pod of the Scheduler `name`, terminating ones included.
    pub(crate) fn pods_of(&self, name: &str) -> Vec<Arc<SchedulerPod>> {
        lock(&self.pods).by_scheduler.get(name).map(|pods| pods.values().cloned().collect()).unwrap_or_default()
    }

    /// The nodes that carry an owner label although no Scheduler selects them any more: their
    /// label goes at once. (A node some Scheduler owns gets its label from that Scheduler's
    /// rollout, in its wave.)
    pub(crate) fn orphaned_owner_labels(&self) -> Vec<String> {
        lock(&self.arbiter)
            .owners()
            .filter(|(_, labels, owner)| owner.is_none() && labels.contains_key(OWNER_LABEL))
            .map(|(node, _, _)| node.to_owned())
            .collect()
    }

    /// The Nodes a reconcile of the Scheduler `name` speaks of (`sked_core::plan::Nodes`): those it
    /// owns (`placement`), those that carry its owner label, and those its `pods` are on or made
    /// for; each with its owner label and facts, read under one lock of each.
    pub(crate) fn nodes_of(&self, name: &str, placement: &Placement, pods: &[Arc<SchedulerPod>]) -> plan::Nodes {
        let scheduled: BTreeSet<String> =
            pods.iter().filter(|p| !p.is_terminating()).filter_map(|p| p.node.clone()).collect();
        let under_pods = pods.iter().filter_map(|p| p.node_or_target());
        let (labelled, mut known) = {
            let arbiter = lock(&self.arbiter);
            let labelled: BTreeSet<String> = arbiter
                .owners()
                .filter(|(_, labels, _)| labels.get(OWNER_LABEL).is_some_and(|o| o == name))
                .map(|(node, _, _)| node.to_owned())
                .collect();
            let names: BTreeSet<&str> =
                placement.owned.iter().chain(&labelled).map(String::as_str).chain(under_pods).collect();
            let known: HashMap<String, plan::NodeEntry> = names
                .into_iter()
                .filter_map(|n| {
                    let owner = arbiter.node_labels(n)?.get(OWNER_LABEL).cloned();
                    Some((n.to_owned(), plan::NodeEntry { owner, facts: None, version: None }))
                })
                .collect();
            (labelled, known)
        };
        let facts = lock(&self.node_facts);
        let versions = lock(&self.node_versions);
        for (node, entry) in &mut known {
            entry.facts = facts.get(node).cloned();
            entry.version = versions.get(node).copied();
        }
        plan::Nodes { known, scheduled, labelled }
    }

    /// Resolves after the next change of a Node or a Scheduler (or at once, if one happened
    /// since the last call).
    pub(crate) async fn ownership_changed(&self) {
        self.ownership.notified().await;
    }

    /// Names of every known Scheduler.
    pub(crate) fn scheduler_names(&self) -> Vec<String> {
        lock(&self.arbiter).schedulers().map(str::to_owned).collect()
    }

    /// How many Schedulers and Nodes are known.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let arbiter = lock(&self.arbiter);
        (arbiter.schedulers().count(), arbiter.nodes().count())
    }
}

/// Whether the Scheduler is being deleted (a finalizer or foreground deletion holds it).
fn terminating(s: &Scheduler) -> bool {
    s.metadata.deletion_timestamp.is_some()
}

fn trigger(tx: &Triggers, changed: Changed) {
    for name in changed {
        tx.send(&name);
    }
}

/// The events of a watch; its errors are logged and skipped (the watcher retries with backoff).
fn logged<K>(
    what: &'static str,
    events: impl futures::Stream<Item = Result<Event<K>, watcher::Error>>,
) -> impl futures::Stream<Item = Event<K>> {
    events.filter_map(move |event| {
        futures::future::ready(match event {
            Ok(event) => Some(event),
            Err(e) => {
                warn!(err = %e, "{what} watch failed; retrying");
                None
            }
        })
    })
}

/// How one kind of object changes the arbiter. Each method runs under the arbiter's lock.
trait Feed<K> {
    /// Called first for every event, with the lock held.
    fn observe(&mut self, _event: &Event<K>) {}
    fn relisted(&mut self, arbiter: &mut Arbiter, all: Vec<K>) -> Changed;
    fn applied(&mut self, arbiter: &mut Arbiter, obj: K) -> Changed;
    fn deleted(&mut self, arbiter: &mut Arbiter, obj: K) -> Changed;
}

/// Applies a watch's events to the arbiter, one at a time; triggers every Scheduler whose
/// placement moved. `ready` turns true after the first full list.
async fn feed_arbiter<K, S>(
    what: &'static str,
    arbiter: &Mutex<Arbiter>,
    events: S,
    mut feed: impl Feed<K>,
    tx: Triggers,
    ready: watch::Sender<bool>,
    ownership: &Notify,
) where
    S: futures::Stream<Item = Result<Event<K>, watcher::Error>>,
{
    let mut relist: Vec<K> = Vec::new();
    let mut events = std::pin::pin!(logged(what, events));
    while let Some(event) = events.next().await {
        let changed = {
            let mut arbiter = lock(arbiter);
            feed.observe(&event);
            match event {
                Event::Init => {
                    relist.clear();
                    Changed::new()
                }
                Event::InitApply(obj) => {
                    relist.push(obj);
                    Changed::new()
                }
                Event::InitDone => {
                    let changed = feed.relisted(&mut arbiter, std::mem::take(&mut relist));
                    let _ = ready.send(true);
                    changed
                }
                Event::Apply(obj) => feed.applied(&mut arbiter, obj),
                Event::Delete(obj) => feed.deleted(&mut arbiter, obj),
            }
        };
        trigger(&tx, changed);
        ownership.notify_one();
    }
}

/// The Scheduler feed: the reconcile loop's store and the arbiter's claims.
struct SchedulerFeed<'a> {
    store: &'a mut reflector::store::Writer<Scheduler>,
    memo: &'a Memo,
    metrics: &'a Metrics,
    /// The Scheduler an `Apply` event replaces, as the store held it.
    replaced: Option<Arc<Scheduler>>,
}

impl Feed<Scheduler> for SchedulerFeed<'_> {
    fn observe(&mut self, event: &Event<Scheduler>) {
        self.replaced = match event {
            Event::Apply(s) => self.store.as_reader().get(&ObjectRef::from_obj(s)),
            _ => None,
        };
        self.store.apply_watcher_event(event);
    }

    fn relisted(&mut self, arbiter: &mut Arbiter, all: Vec<Scheduler>) -> Changed {
        // Schedulers deleted while the watch was down show up only as missing from the list.
        let gone: Vec<String> =
            arbiter.schedulers().filter(|name| !all.iter().any(|s| s.name_any() == *name)).map(str::to_owned).collect();
        for name in &gone {
            self.metrics.forget_scheduler(name);
        }
        self.memo.retain_live(&all);
        let live = all.iter().filter(|s| !terminating(s)).map(Claim::of).collect();
        let mut changed = arbiter.replace_schedulers(live);
        // Every Scheduler is reconciled after a (re)list, as a fresh watch would.
        changed.extend(all.iter().map(ResourceExt::name_any));
        changed
    }

    fn applied(&mut self, arbiter: &mut Arbiter, s: Scheduler) -> Changed {
        // A Scheduler being deleted claims nothing: its nodes go to the next oldest at once.
        let mut changed = if terminating(&s) {
            arbiter.remove_scheduler(&s.name_any())
        } else {
            arbiter.upsert_scheduler(Claim::of(&s))
        };
        // Any change of the Scheduler itself is reconciled (an annotation too), placement moved
        // or not; but not the echo of the status its own reconcile wrote (a reconcile, and a
        // rate-limit token, spent on nothing, and the next real change waits behind it).
        let written = s.uid().and_then(|uid| self.memo.written_status(&uid));
        let echo = self.replaced.take().is_some_and(|before| plan::echo::status_echo(&before, &s, written.as_ref()));
        if terminating(&s) || !echo {
            changed.insert(s.name_any());
        }
        changed
    }

    fn deleted(&mut self, arbiter: &mut Arbiter, s: Scheduler) -> Changed {
        self.memo.forget(&s);
        self.metrics.forget_scheduler(&s.name_any());
        arbiter.remove_scheduler(&s.name_any())
    }
}

/// The Node feed: labels into the arbiter, and each Node's facts.
struct NodeFeed {
    facts: NodeFactsByName,
    versions: NodeVersions,
}

impl NodeFeed {
    /// Keeps the Node's facts; returns its name and labels, and whether its facts changed.
    fn take(&self, n: Node) -> (String, std::collections::BTreeMap<String, String>, bool) {
        let name = n.name_any();
        let facts = NodeFacts::of(&n);
        if let Some(version) = n.metadata.resource_version.as_deref().and_then(|v| v.parse().ok()) {
            lock(&self.versions).insert(name.clone(), version);
        }
        let before = lock(&self.facts).insert(name.clone(), Arc::new(facts.clone()));
        let changed = before.is_some_and(|b| *b != facts);
        (name, n.metadata.labels.unwrap_or_default(), changed)
    }
}

impl Feed<Node> for NodeFeed {
    fn relisted(&mut self, arbiter: &mut Arbiter, all: Vec<Node>) -> Changed {
        let before = std::mem::take(&mut *lock(&self.facts));
        lock(&self.versions).clear();
        let mut moved = Vec::new();
        let nodes = all
            .into_iter()
            .map(|n| {
                let (name, labels, _) = self.take(n);
                if before.get(&name) != lock(&self.facts).get(&name) {
                    moved.push(name.clone());
                }
                (name, labels)
            })
            .collect();
        let mut changed = arbiter.replace_nodes(nodes);
        // Facts that changed while the watch was away: their owners look again.
        changed.extend(moved.iter().filter_map(|n| arbiter.owner(n)).map(str::to_owned));
        changed
    }

    fn applied(&mut self, arbiter: &mut Arbiter, n: Node) -> Changed {
        let (name, labels, facts_changed) = self.take(n);
        // The owner label appearing or moving lets its Schedulers go on (a DaemonSet waits for
        // the labels of its nodes), even though placement did not change.
        let before = arbiter.node_labels(&name).and_then(|l| l.get(OWNER_LABEL)).cloned();
        let after = labels.get(OWNER_LABEL).cloned();
        let mut changed = arbiter.upsert_node(&name, labels);
        if before != after {
            changed.extend(before.into_iter().chain(after.clone()));
        }
        if facts_changed {
            // Down or back, tainted or not: its owner's rollout may skip it or go on.
            changed.extend(arbiter.owner(&name).map(str::to_owned).into_iter().chain(after));
        }
        changed
    }

    fn deleted(&mut self, arbiter: &mut Arbiter, n: Node) -> Changed {
        lock(&self.facts).remove(&n.name_any());
        lock(&self.versions).remove(&n.name_any());
        arbiter.remove_node(&n.name_any())
    }
}

/// Keeps the facts of the scheduler pods, and triggers a Scheduler when a fact of one of its pods
/// changed (bound to a node, Ready or not, restarted, terminating, its KernelAttached condition
/// unless that is the one this term wrote), when one came or went; after a relist, every
/// Scheduler with a pod before or after. `listed` turns true after the first full list.
async fn feed_pods<S>(events: S, pods: Arc<Mutex<PodSet>>, memo: &Memo, tx: Triggers, listed: watch::Sender<bool>)
where
    S: futures::Stream<Item = Result<Event<Pod>, watcher::Error>>,
{
    let mut relist = PodSet::default();
    let mut events = std::pin::pin!(logged("scheduler Pod", events));
    while let Some(event) = events.next().await {
        let touched: BTreeSet<String> = match event {
            Event::Apply(p) => {
                let facts = SchedulerPod::of(&p);
                let now = facts.scheduler.clone();
                match lock(&pods).insert(facts.clone()) {
                    Some(before) if *before == facts || own_condition_echo(memo, &before, &facts) => BTreeSet::new(),
                    Some(before) => now.into_iter().chain(before.scheduler.clone()).collect(),
                    None => now.into_iter().collect(),
                }
            }
            Event::Delete(p) => {
                let gone = lock(&pods).remove(&p.name_any());
                gone.and_then(|g| g.scheduler.clone())
                    .or_else(|| p.labels().get(NAME_LABEL).cloned())
                    .into_iter()
                    .collect()
            }
            Event::Init => {
                relist = PodSet::default();
                BTreeSet::new()
            }
            Event::InitApply(p) => {
                relist.insert(SchedulerPod::of(&p));
                BTreeSet::new()
            }
            Event::InitDone => {
                let fresh = std::mem::take(&mut relist);
                let mut set = lock(&pods);
                let mut touched = set.schedulers();
                touched.extend(fresh.schedulers());
                *set = fresh;
                drop(set);
                let _ = listed.send(true);
                touched
            }
        };
        for scheduler in touched {
            tx.send(&scheduler);
        }
    }
}

/// Whether the one change from `before` to `now` is the KernelAttached condition this term wrote
/// ([`plan::echo::condition_echo`]).
fn own_condition_echo(memo: &Memo, before: &SchedulerPod, now: &SchedulerPod) -> bool {
    let Some(scheduler) = now.scheduler.as_deref() else { return false };
    plan::echo::condition_echo(before, now, memo.sent_condition(scheduler, &now.uid).as_ref())
}

/// The Scheduler owning a DaemonSet (the owner is cluster-scoped, so the namespace is dropped).
fn owning_scheduler(ds: &DaemonSet) -> Option<String> {
    ds.owner_references()
        .iter()
        .find(|o| o.kind == Scheduler::kind(&()) && o.api_version == Scheduler::api_version(&()))
        .map(|o| o.name.clone())
}

/// Keeps the Schedulers' DaemonSets and triggers the owner of one that changed (its status, a
/// hand edit, a deletion); after a relist, every owner. `listed` turns true after the first
/// full list.
async fn feed_daemonsets<S>(
    events: S,
    mut store: reflector::store::Writer<DaemonSet>,
    tx: Triggers,
    listed: watch::Sender<bool>,
) where
    S: futures::Stream<Item = Result<Event<DaemonSet>, watcher::Error>>,
{
    let mut events = std::pin::pin!(logged("DaemonSet", events));
    while let Some(event) = events.next().await {
        store.apply_watcher_event(&event);
        let touched: Vec<String> = match &event {
            Event::Apply(ds) | Event::Delete(ds) => owning_scheduler(ds).into_iter().collect(),
            Event::InitDone => {
                let _ = listed.send(true);
                store.as_reader().state().iter().filter_map(|ds| owning_scheduler(ds)).collect()
            }
            _ => Vec::new(),
        };
        for scheduler in touched {
            tx.send(&scheduler);
        }
    }
}

impl Feeds {
    /// Runs the feeds: every Scheduler into the store and the arbiter, from the one Scheduler
    /// watch; Node labels into the arbiter and each Node's facts (readiness, taints), from a
    /// Node watch whose objects are slimmed as they arrive; the scheduler pods and the
    /// DaemonSets of `workload_namespace`. `ready` turns true once all four were listed in full.
    pub(crate) async fn run(
        self,
        client: Client,
        workload_namespace: &str,
        memo: &Memo,
        metrics: &Metrics,
        tx: Triggers,
        ready: watch::Sender<bool>,
    ) {
        let Feeds { arbiter, mut store, pods, daemonsets, ownership, node_facts, node_versions } = self;
        let (schedulers_listed, mut schedulers_ready) = watch::channel(false);
        let (nodes_listed, mut nodes_ready) = watch::channel(false);
        let (pods_listed, mut pods_ready) = watch::channel(false);
        let (daemonsets_listed, mut daemonsets_ready) = watch::channel(false);
        let schedulers = watcher::watcher(Api::<Scheduler>::all(client.clone()), watcher::Config::default());
        // Slimmed as they arrive: labels, creation, Ready and taints are all that is read.
        let nodes = watcher::watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .modify(sked_core::nodes::slim);
        let managed = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
        let scheduler_pods =
            watcher::watcher(Api::<Pod>::namespaced(client.clone(), workload_namespace), managed.clone());
        // Of the managed fields, only who else wrote the object is read (not what they wrote):
        // see `workload::applied_unchanged`.
        let scheduler_daemonsets = watcher::watcher(Api::<DaemonSet>::namespaced(client, workload_namespace), managed)
            .modify(|ds| {
                let others = ds.managed_fields_mut();
                others.retain(|m| {
                    m.manager.as_deref() != Some(FIELD_MANAGER) && m.subresource.as_deref().is_none_or(str::is_empty)
                });
                others.iter_mut().for_each(|m| m.fields_v1 = None);
            });
        let feed = SchedulerFeed { store: &mut store, memo, metrics, replaced: None };
        futures::join!(
            feed_arbiter(
                "Scheduler",
                &arbiter,
                schedulers.default_backoff(),
                feed,
                tx.clone(),
                schedulers_listed,
                &ownership
            ),
            feed_arbiter(
                "Node",
                &arbiter,
                nodes.default_backoff(),
                NodeFeed { facts: node_facts, versions: node_versions },
                tx.clone(),
                nodes_listed,
                &ownership
            ),
            feed_pods(scheduler_pods.default_backoff(), pods, memo, tx.clone(), pods_listed),
            feed_daemonsets(scheduler_daemonsets.default_backoff(), daemonsets, tx, daemonsets_listed),
            async {
                // Every list, or nothing: a partial view could hand a node to the wrong Scheduler
                // or count a Scheduler's kernels on nodes without its pods.
                if schedulers_ready.wait_for(|r| *r).await.is_ok()
                    && nodes_ready.wait_for(|r| *r).await.is_ok()
                    && pods_ready.wait_for(|r| *r).await.is_ok()
                    && daemonsets_ready.wait_for(|r| *r).await.is_ok()
                {
                    let _ = ready.send(true);
                }
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ready: &str, kernel: Option<&str>) -> SchedulerPod {
        let mut conditions = vec![serde_json::json!({"type": "Ready", "status": ready})];
        if let Some(status) = kernel {
            conditions.push(serde_json::json!({"type": crate::api::pod_kernel::POD_CONDITION, "status": status,
                "reason": "KernelAttached", "message": "m", "lastTransitionTime": "1970-01-01T00:00:07Z"}));
        }
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a-x", "uid": "p-1", "labels": {NAME_LABEL: "a", MANAGED_BY_LABEL: MANAGED_BY}},
            "spec": {"containers": [], "nodeName": "n"},
            "status": {"conditions": conditions},
        }))
        .expect("a valid Pod");
        SchedulerPod::of(&pod)
    }

    /// The pod watch reads the condition off a real Pod and asks this term's memory by the
    /// pod's Scheduler and uid (the rule is `plan::echo`'s).
    #[test]
    fn only_the_condition_this_term_wrote_is_an_echo() {
        let memo = Memo::default();
        let (before, after) = (pod("True", None), pod("True", Some("True")));
        assert!(after.kernel.is_some(), "the condition is read: {after:?}");
        assert!(!own_condition_echo(&memo, &before, &after), "not written by this term");
        let sent = after.kernel.clone().expect("read above");
        lock(&memo.pod_conditions).entry("a".into()).or_default().insert("p-1".into(), (sent, None));
        assert!(own_condition_echo(&memo, &before, &after));
        // Another fact changed with it (Ready): the reconcile has something to look at.
        assert!(!own_condition_echo(&memo, &before, &pod("False", Some("True"))));
        // A condition someone else set is no echo.
        assert!(!own_condition_echo(&memo, &before, &pod("True", Some("False"))));
    }
}
