//! The reconcile's decisions on snapshots of a small simulated fleet: [`Fleet`] plays the API
//! server, the DaemonSet controller, the kubelets and the agents as plainly as it can, and
//! carries each [`Plan`] out the way the controller does. The paths the integration suites reach
//! with real processes (a first deployment, a rollback, a refused generation, a takeover, a new
//! leader, a reconcile woken by its own writes) run here in microseconds.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};
use proptest::prelude::*;
use sked_api::verdict::Verdict;
use sked_api::{Reason, RolloutPhase, Scheduler, SchedulerStatus};

use super::*;
use crate::nodes::{NodeFacts, NotReady};
use crate::pods::{PodRevision, SchedulerPod};
use crate::status::EventKind;
use crate::workload::{AgentSettings, WorkloadSettings};

const GOOD: &str = "r.io/scx@sha256:aaaa";
const BETTER: &str = "r.io/scx@sha256:cccc";
/// An image whose scheduler never attaches.
const BAD: &str = "r.io/scx@sha256:bbbb";
/// An image whose scheduler attaches and doubles the run delay of its node.
const SLOW: &str = "r.io/scx@sha256:dddd";
/// When the Scheduler was created (seconds since the epoch).
const CREATED: i64 = 1_800_000_000;
const BAKE: i64 = 10;
const ATTACH_TIMEOUT: i64 = 60;

/// A Scheduler, its nodes, pods, DaemonSet and agents, and what the controller remembers.
#[derive(Clone)]
struct Fleet {
    scheduler: Scheduler,
    placement: Placement,
    status: SchedulerStatus,
    refusal: Option<ImageRefusal>,
    daemonset: Option<DaemonSet>,
    /// Each node's owner label.
    labels: BTreeMap<String, Option<String>>,
    facts: BTreeMap<String, NodeFacts>,
    /// Nodes whose kernel never runs any scheduler attached.
    broken: BTreeSet<String>,
    pods: BTreeMap<String, SchedulerPod>,
    reports: HashMap<String, NodeReport>,
    /// Each node's health samples (what the agents sent).
    health: std::collections::BTreeMap<String, crate::analysis::NodeHealth>,
    memory: Memory,
    /// When each node was labelled by this term (seconds since the epoch).
    labelled_at: HashMap<String, i64>,
    /// The pod this term deleted on each node for a new revision, and when.
    replaced_at: HashMap<String, (String, i64)>,
    settings: Settings,
    canary_gate: crate::rollout::CanaryGate,
    start: Instant,
    wall: i64,
    term_began: i64,
    uids: u64,
    /// Every pod ever made, by node, with its revision (and "revision zero" where a node was
    /// sent back to the kernel's default, and `("*", "failed")` where a revision failed).
    made: Vec<(String, String)>,
    events: Vec<EventSpec>,
    /// What the last reconcile wrote: the DaemonSet, the status, rollout actions, pod conditions.
    last_writes: Vec<&'static str>,
    /// How many moves an owner label written takes to show in the Node watch (0: at once).
    label_lag: usize,
    /// Owner labels written and not shown yet, with the moves left and the version they make.
    pending_labels: Vec<(String, Option<String>, usize, u64)>,
    /// Each Node's resourceVersion as the watch shows it, and the last one the API server gave.
    versions: BTreeMap<String, u64>,
    version: u64,
    /// The version each owner label this term wrote made.
    label_versions: HashMap<String, u64>,
}

fn scheduler(image: &str, generation: i64) -> Scheduler {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "sked.schedkit.io/v1",
        "kind": "Scheduler",
        "metadata": {
            "name": "s", "uid": "u-s", "generation": generation,
            "creationTimestamp": jiff::Timestamp::from_second(CREATED).unwrap_or_default().to_string(),
        },
        "spec": {
            "sched": image,
            "rollout": {"canary": 1, "maxUnavailable": 1, "bakeSeconds": BAKE, "attachTimeoutSeconds": ATTACH_TIMEOUT},
        },
    }))
    .unwrap_or_else(|e| panic!("a valid Scheduler: {e}"))
}

fn settings() -> Settings {
    Settings {
        workload: WorkloadSettings {
            namespace: "sked-system".into(),
            agent: AgentSettings {
                image: "r.io/agent:1".into(),
                service_account: "sked-agent".into(),
                reports_address: "https://sked-reports:8443".into(),
                reports_replicas: None,
                ca_configmap: "sked-reports-ca".into(),
            },
        },
        stale_after: Duration::from_secs(30),
        heartbeat: Duration::from_secs(10),
    }
}

impl Fleet {
    /// A Scheduler running `image` that owns `nodes`, none of them labelled yet, all created
    /// before it; this term began long ago.
    fn new(nodes: usize, image: &str) -> Self {
        let names: Vec<String> = (0..nodes).map(|i| format!("node-{i}")).collect();
        let wall = CREATED + 1_000;
        Fleet {
            scheduler: scheduler(image, 1),
            placement: Placement { owned: names.iter().cloned().collect(), ..Placement::default() },
            status: SchedulerStatus::default(),
            refusal: None,
            daemonset: None,
            labels: names.iter().map(|n| (n.clone(), None)).collect(),
            facts: names
                .iter()
                .map(|n| (n.clone(), NodeFacts { created: Some(CREATED - 100), ..NodeFacts::default() }))
                .collect(),
            broken: BTreeSet::new(),
            pods: BTreeMap::new(),
            reports: HashMap::new(),
            health: Default::default(),
            memory: Memory::default(),
            labelled_at: HashMap::new(),
            replaced_at: HashMap::new(),
            settings: settings(),
            canary_gate: crate::rollout::CanaryGate::Open,
            start: Instant::now(),
            wall,
            term_began: CREATED,
            uids: 0,
            made: Vec::new(),
            events: Vec::new(),
            last_writes: Vec::new(),
            label_lag: 0,
            pending_labels: Vec::new(),
            versions: names.iter().map(|n| (n.clone(), 1)).collect(),
            version: 1,
            label_versions: HashMap::new(),
        }
    }

    /// Writes `node`'s owner label; the Node watch shows it after `label_lag` moves.
    fn write_label(&mut self, node: &str, owner: Option<&str>) {
        self.version += 1;
        match owner {
            Some(_) => self.label_versions.insert(node.to_owned(), self.version),
            None => self.label_versions.remove(node),
        };
        if self.label_lag == 0 {
            self.labels.insert(node.to_owned(), owner.map(str::to_owned));
            self.versions.insert(node.to_owned(), self.version);
        } else {
            self.pending_labels.push((node.to_owned(), owner.map(str::to_owned), self.label_lag, self.version));
        }
    }

    fn set_image(&mut self, image: &str) {
        let generation = self.scheduler.metadata.generation.unwrap_or(0) + 1;
        let analysis = self.scheduler.spec.rollout.as_ref().and_then(|r| r.analysis.clone());
        self.scheduler = scheduler(image, generation);
        if let Some(rollout) = self.scheduler.spec.rollout.as_mut() {
            rollout.analysis = analysis;
        }
    }

    /// The agents' samples over the last `seconds`, one a second: 0.5 tasks waiting per CPU
    /// (1.0 under SLOW) within ±5 %, idle CPUs beside them 2 %, CPU pressure to match.
    fn sample_health(&mut self, seconds: i64) {
        for (node, pod) in &self.pods {
            let level = if image_of(&pod.revision) == Some(SLOW) { 1.0 } else { 0.5 };
            let samples = &mut self.health.entry(node.clone()).or_default().samples;
            for at in (self.wall - seconds + 1)..=self.wall {
                let noise = f64::from(u32::try_from((at * 7919 + node.len() as i64) % 11).unwrap_or(0)) / 100.0 - 0.05;
                let waiting = level * (1.0 + noise);
                samples.push(crate::analysis::Sample {
                    at_ms: at * 1000,
                    interval_ms: 1000,
                    waiting_per_cpu: Some(waiting),
                    idle_while_waiting: Some(0.02),
                    cpu_pressure: Some(100.0 * (1.0 - (-waiting).exp())),
                    events: Some(BTreeMap::new()),
                    ..crate::analysis::Sample::default()
                });
            }
            let excess = samples.len().saturating_sub(300);
            samples.drain(..excess);
        }
    }

    /// Reads a snapshot as the controller's `observe` does, and hands it to `f`.
    fn observed<R>(&self, f: impl FnOnce(&Snapshot<'_>) -> R) -> R {
        let admission = match &self.refusal {
            Some(refusal) => Err(refusal.clone()),
            None => Ok(Admitted { image: self.scheduler.spec.sched.clone(), key: None }),
        };
        let pods: Vec<Arc<SchedulerPod>> = self.pods.values().cloned().map(Arc::new).collect();
        let nodes = Nodes {
            known: self
                .labels
                .iter()
                .map(|(n, owner)| {
                    let facts = self.facts.get(n).cloned().map(Arc::new);
                    (n.clone(), NodeEntry { owner: owner.clone(), facts, version: self.versions.get(n).copied() })
                })
                .collect(),
            scheduled: pods.iter().filter(|p| !p.is_terminating()).filter_map(|p| p.node.clone()).collect(),
            labelled: self.labels.iter().filter(|(_, o)| o.as_deref() == Some("s")).map(|(n, _)| n.clone()).collect(),
        };
        let memory = Memory {
            term_age: Duration::from_secs((self.wall - self.term_began).cast_unsigned()),
            labelled: self.labelled_at.iter().map(|(n, at)| (n.clone(), secs(self.wall - at))).collect(),
            label_versions: self.label_versions.clone(),
            replaced: self
                .replaced_at
                .iter()
                .map(|(n, (pod, at))| (n.clone(), (pod.clone(), secs(self.wall - at))))
                .collect(),
            ..self.memory.clone()
        };
        let clock = Clock {
            now: self.now(),
            wall: jiff::Timestamp::from_second(self.wall).unwrap_or_default(),
            since_arrival: None,
        };
        f(&Snapshot {
            scheduler: &self.scheduler,
            placement: &self.placement,
            previous: &self.status,
            admission: &admission,
            daemonset: self.daemonset.as_ref(),
            pods: &pods,
            nodes: &nodes,
            reports: &self.reports,
            health: &self.health,
            memory: &memory,
            settings: &self.settings,
            canary_gate: &self.canary_gate,
            clock,
        })
    }

    fn now(&self) -> Instant {
        self.start + secs(self.wall - CREATED)
    }

    /// One reconcile: the DaemonSet's write, then the plan, carried out. Returns the plan.
    fn reconcile(&mut self) -> Plan {
        self.last_writes.clear();
        let write = self.observed(daemonset).unwrap_or_else(|e| panic!("{e}"));
        let deployed = self.write_daemonset(write);
        let plan = self.observed(|s| decide(s, &deployed));
        self.carry_out(&plan);
        plan
    }

    fn write_daemonset(&mut self, write: DaemonSetWrite) -> Deployed {
        match write {
            DaemonSetWrite::Apply { desired, hash, .. } => {
                let generation = self.put_daemonset(*desired);
                self.memory.applied = Some(Applied { hash, generation });
            }
            DaemonSetWrite::Keep { remember, .. } => {
                if remember.is_some() {
                    self.memory.applied = remember;
                }
            }
            DaemonSetWrite::Recreate(Recreate::Spec(desired)) => {
                self.put_daemonset(*desired);
            }
            DaemonSetWrite::Recreate(Recreate::Stable(revision)) => self.roll_back_to(&revision),
            DaemonSetWrite::Delete => {
                self.last_writes.push("daemonset");
                self.daemonset = None;
                self.memory.applied = None;
            }
        }
        Deployed {
            daemonset: self.daemonset.clone(),
            applied_generation: self.memory.applied.as_ref().map_or(0, |a| a.generation),
            ..Deployed::default()
        }
    }

    /// The API server takes `desired`; the DaemonSet controller sees it at once.
    fn put_daemonset(&mut self, mut desired: DaemonSet) -> i64 {
        self.last_writes.push("daemonset");
        let generation = self.daemonset.as_ref().and_then(|d| d.metadata.generation).unwrap_or(0) + 1;
        desired.metadata.generation = Some(generation);
        desired.status = Some(DaemonSetStatus { observed_generation: Some(generation), ..DaemonSetStatus::default() });
        self.daemonset = Some(desired);
        self.count_pods();
        generation
    }

    fn roll_back_to(&mut self, to: &sked_api::Revision) {
        let mut restored = self.scheduler.clone();
        let fields = to.spec.clone().unwrap_or_default();
        restored.spec = fields.applied_to(&self.scheduler.spec, &to.image);
        let desired = crate::workload::desired_daemonset(&restored, &to.image, &self.settings.workload);
        self.put_daemonset(desired.unwrap_or_else(|e| panic!("{e}")));
    }

    fn carry_out(&mut self, plan: &Plan) {
        if plan.status.status != self.status {
            self.last_writes.push("status");
            self.status = plan.status.status.clone();
        }
        self.events.extend(plan.events().cloned());
        for node in &plan.remember.attached {
            self.labelled_at.remove(node);
            self.label_versions.remove(node);
        }
        let recorded =
            plan.remember.exits_recorded.iter().map(|e| crate::kernel_summary::ejection_key(&e.node, &e.time));
        self.memory.exits_recorded.extend(recorded);
        if let Some(step) = &plan.rollout {
            self.carry_out_step(step);
        }
        for w in &plan.pod_conditions {
            self.last_writes.push("pod condition");
            if let Some(pod) = self.pods.values_mut().find(|p| p.uid == w.uid) {
                pod.kernel = Some(w.condition.clone());
            }
        }
    }

    fn carry_out_step(&mut self, step: &RolloutActions) {
        if step.writes() {
            self.last_writes.push("rollout");
        }
        if step.newly_failed.is_some() {
            // A retry (the spec changed, same revision) makes the failed attempt's pods again.
            self.made.push(("*".into(), "failed".into()));
        }
        if let Some(to) = &step.roll_back {
            self.roll_back_to(to);
        }
        for r in &step.replace {
            self.pods.retain(|_, p| !(p.name == r.pod && p.uid == r.uid));
            self.replaced_at.insert(r.node.clone(), (r.pod.clone(), self.wall));
        }
        for node in &step.admit {
            self.write_label(node, Some("s"));
            self.labelled_at.insert(node.clone(), self.wall);
        }
        for node in &step.evict {
            self.write_label(node, None);
            self.made.push((node.clone(), "revision zero".into()));
        }
    }

    /// Time passes: the DaemonSet controller makes a pod of its template on each labelled node
    /// that has none and deletes those on nodes that lost the label; kubelets start them, and
    /// agents report: attached unless the image is BAD or the node broken.
    fn settle(&mut self, seconds: i64) {
        self.wall += seconds;
        // The labels the API server holds; the DaemonSet controller acts on them at once, the
        // Node watch shows them when their lag ran out.
        let mut shown = Vec::new();
        for (node, owner, left, version) in &mut self.pending_labels {
            *left -= 1;
            if *left == 0 {
                shown.push((node.clone(), owner.clone(), *version));
            }
        }
        self.pending_labels.retain(|(_, _, left, _)| *left > 0);
        for (node, owner, version) in shown {
            self.labels.insert(node.clone(), owner);
            self.versions.insert(node, version);
        }
        let Some(ds) = self.daemonset.clone() else { return };
        let template = crate::node_view::TemplateRevision::of(&ds);
        let api_labels: BTreeMap<String, Option<String>> = self
            .labels
            .clone()
            .into_iter()
            .chain(self.pending_labels.iter().map(|(n, o, _, _)| (n.clone(), o.clone())))
            .collect();
        self.pods.retain(|node, _| api_labels.get(node).cloned().flatten().as_deref() == Some("s"));
        for (node, owner) in &api_labels {
            let down = self.facts.get(node).is_some_and(NodeFacts::down);
            if owner.as_deref() != Some("s") || down || self.pods.contains_key(node) {
                continue;
            }
            self.uids += 1;
            let pod = SchedulerPod {
                name: format!("s-{}", self.uids),
                uid: format!("uid-{}", self.uids),
                node: Some(node.clone()),
                revision: PodRevision::Labelled(template.name.clone()),
                created: Some(self.wall),
                ..crate::test_objects::pod("")
            };
            self.made.push((node.clone(), template.name.clone()));
            self.pods.insert(node.clone(), pod);
        }
        let now = self.now();
        for (node, pod) in &mut self.pods {
            let attaches = !self.broken.contains(node) && image_of(&pod.revision) != Some(BAD);
            pod.ready_since = attaches.then_some(pod.created.unwrap_or(self.wall));
            let verdict = if attaches { Verdict::Attached } else { Verdict::NotAttached };
            let mut report = crate::test_objects::report(&pod.name, verdict, now);
            report.attached_since = attaches.then_some(pod.created.unwrap_or(self.wall));
            self.reports.insert(node.clone(), report);
        }
        self.sample_health(seconds);
        self.count_pods();
    }

    /// The DaemonSet controller's counts.
    fn count_pods(&mut self) {
        let labelled = self.labels.values().filter(|o| o.as_deref() == Some("s")).count();
        let ready = self.pods.values().filter(|p| p.ready_since.is_some()).count();
        if let Some(status) = self.daemonset.as_mut().and_then(|d| d.status.as_mut()) {
            status.desired_number_scheduled = i32::try_from(labelled).unwrap_or(0);
            status.current_number_scheduled = i32::try_from(self.pods.len()).unwrap_or(0);
            status.number_ready = i32::try_from(ready).unwrap_or(0);
            status.number_available = Some(status.number_ready);
        }
    }

    /// Reconciles and lets `seconds` pass until `done`, at most `rounds` times.
    fn run_until(&mut self, rounds: usize, seconds: i64, mut done: impl FnMut(&Fleet) -> bool) -> bool {
        for _ in 0..rounds {
            self.reconcile();
            if done(self) {
                return true;
            }
            self.settle(seconds);
        }
        false
    }

    fn phase(&self) -> RolloutPhase {
        self.status.rollout.as_ref().map(|r| r.phase).unwrap_or_default()
    }

    fn current(&self) -> Option<&str> {
        self.status.rollout.as_ref()?.current_revision.as_ref().map(|r| r.image.as_str())
    }

    /// How many pods of each (node, revision) the fleet made.
    fn switches(&self) -> BTreeMap<(String, String), usize> {
        let mut counts = BTreeMap::new();
        for key in &self.made {
            *counts.entry(key.clone()).or_default() += 1;
        }
        counts
    }

    /// A new leader: it remembers nothing of the last term, and its term just began.
    fn new_term(&mut self) {
        self.memory = Memory::default();
        self.labelled_at.clear();
        self.replaced_at.clear();
        self.label_versions.clear();
        self.term_began = self.wall;
    }
}

/// The image of a revision this fleet made.
fn image_of(revision: &PodRevision) -> Option<&'static str> {
    let PodRevision::Labelled(r) = revision else { return None };
    [GOOD, BETTER, BAD, SLOW]
        .into_iter()
        .find(|image| *r == crate::workload::revision(&scheduler(image, 1), image, "r.io/agent:1"))
}

fn secs(s: i64) -> Duration {
    Duration::from_secs(s.max(0).cast_unsigned())
}

fn diff(a: &SchedulerStatus, b: &SchedulerStatus) -> Vec<String> {
    let (a, b) = (serde_json::to_value(a).unwrap_or_default(), serde_json::to_value(b).unwrap_or_default());
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else { return vec![] };
    b.iter().filter(|(k, v)| a.get(*k) != Some(v)).map(|(k, v)| format!("{k}: {:?} -> {v}", a.get(k))).collect()
}

/// Every labelled node runs a pod of `image`.
fn all_run(f: &Fleet, image: &str) -> bool {
    let labelled = f.labels.iter().filter(|(_, o)| o.as_deref() == Some("s"));
    labelled.map(|(n, _)| f.pods.get(n)).all(|p| p.is_some_and(|p| image_of(&p.revision) == Some(image)))
}

fn complete(f: &Fleet) -> bool {
    f.phase() == RolloutPhase::Complete
}

/// A fleet of `nodes` that finished its first deployment of GOOD.
fn deployed(nodes: usize) -> Fleet {
    let mut fleet = Fleet::new(nodes, GOOD);
    assert!(fleet.run_until(60, BAKE, complete), "the first deployment completes");
    fleet
}

#[test]
fn a_first_deployment_lets_the_canary_in_alone_then_completes_with_each_node_switched_once() {
    let mut fleet = Fleet::new(4, GOOD);
    let plan = fleet.reconcile();
    assert!(fleet.daemonset.is_some(), "the DaemonSet is applied first");
    let step = plan.rollout.unwrap_or_else(|| panic!("a rollout step"));
    assert_eq!(step.admit.len(), 1, "the canary enters alone: {step:?}");
    assert!(fleet.run_until(60, BAKE, complete), "the first deployment completes: {:?}", fleet.status.rollout);
    assert_eq!(fleet.current(), Some(GOOD));
    assert!(fleet.labelled_at.is_empty(), "a node seen attached is no longer switching: {:?}", fleet.labelled_at);
    assert!(fleet.switches().values().all(|n| *n == 1), "each node switched once: {:?}", fleet.switches());
    assert_eq!(fleet.switches().len(), 4, "{:?}", fleet.switches());
    let kernel = fleet.status.conditions.iter().find(|c| c.type_ == "KernelAttached");
    assert_eq!(kernel.map(|c| c.status.as_str()), Some("True"), "{:?}", fleet.status.conditions);
}

#[test]
fn a_revision_that_never_attaches_is_rolled_back_to_the_current_one_with_the_cause() {
    let mut fleet = deployed(4);
    fleet.set_image(BAD);
    let failed = |f: &Fleet| f.status.rollout.as_ref().is_some_and(|r| r.failed.is_some());
    assert!(fleet.run_until(20, ATTACH_TIMEOUT / 4, failed), "the bad revision fails");
    let rolled_back: Vec<&EventSpec> = fleet.events.iter().filter(|e| e.reason == Reason::RolledBack).collect();
    assert_eq!(rolled_back.len(), 1, "{:?}", fleet.events);
    assert_eq!(rolled_back[0].kind, EventKind::Warning);
    assert!(rolled_back[0].message.contains("Rolled back to revision"), "{}", rolled_back[0].message);
    let template = fleet.daemonset.as_ref().map(crate::node_view::TemplateRevision::of).unwrap_or_default();
    assert_eq!(template.image, GOOD, "the template is the current revision again");
    // Only the canary ran the bad revision; the rollback brings it back, once.
    assert!(fleet.run_until(20, BAKE, |f| all_run(f, GOOD)));
    let bad: Vec<_> =
        fleet.made.iter().filter(|(_, r)| image_of(&PodRevision::Labelled(r.clone())) == Some(BAD)).collect();
    assert_eq!(bad.len(), 1, "the canary alone ran it: {bad:?}");
}

/// A fleet that finished deploying GOOD, with `spec.rollout.analysis` at its defaults.
fn analysed(nodes: usize) -> Fleet {
    let mut fleet = deployed(nodes);
    if let Some(rollout) = fleet.scheduler.spec.rollout.as_mut() {
        rollout.analysis = Some(sked_api::AnalysisSpec::default());
    }
    fleet
}

#[test]
fn a_revision_that_doubles_waiting_tasks_is_rolled_back_by_analysis_after_the_canary_s_bake() {
    let mut fleet = analysed(6);
    fleet.set_image(SLOW);
    let failed = |f: &Fleet| f.status.rollout.as_ref().is_some_and(|r| r.failed.is_some());
    assert!(fleet.run_until(40, 2, failed), "the slow revision fails: {:?}", fleet.status.rollout);
    let rollout = fleet.status.rollout.clone().unwrap_or_default();
    let failure = rollout.failed.clone().unwrap_or_else(|| panic!("a failure"));
    assert_eq!(failure.reason.as_deref(), Some("AnalysisFailed"));
    assert!(
        (failure.cause.starts_with(&format!(
            "waiting tasks per CPU on {} went from 0.50 before its switch to 1.0",
            failure.node
        )) || failure.cause.starts_with(&format!("CPU pressure on {} went from 39.", failure.node)))
            && failure.cause.contains("control nodes, past their spread")
            && failure.cause.contains("spec.rollout.analysis."),
        "{}",
        failure.cause
    );
    let verdict = rollout.analysis.unwrap_or_else(|| panic!("a verdict in status"));
    assert_eq!(verdict.verdict, sked_api::AnalysisVerdict::Failed);
    let events: Vec<&EventSpec> = fleet.events.iter().filter(|e| e.reason == Reason::AnalysisFailed).collect();
    assert_eq!(events.len(), 1, "{:?}", fleet.events);
    assert!(events[0].message.contains("Rolled back to revision"), "{}", events[0].message);
    assert!(fleet.run_until(20, BAKE, |f| all_run(f, GOOD)), "the canary runs the good revision again");
    let slow = fleet.made.iter().filter(|(_, r)| image_of(&PodRevision::Labelled(r.clone())) == Some(SLOW)).count();
    assert_eq!(slow, 1, "the canary alone ran it");
}

#[test]
fn a_revision_within_its_limits_passes_each_bake_and_completes() {
    let mut fleet = analysed(6);
    fleet.set_image(BETTER);
    let mut verdicts = std::collections::BTreeSet::new();
    let done = fleet.run_until(80, 2, |f| {
        if let Some(a) = f.status.rollout.as_ref().and_then(|r| r.analysis.as_ref()) {
            verdicts.insert((a.time.0.as_second(), a.verdict.as_str(), a.message.clone()));
        }
        complete(f) && f.current() == Some(BETTER)
    });
    assert!(done, "{:?}", fleet.status.rollout);
    assert!(verdicts.iter().all(|(_, v, _)| *v == "Passed"), "every wave judged and passed: {verdicts:#?}");
    assert_eq!(verdicts.len(), 6, "one verdict for each wave (of one node: maxUnavailable 1): {verdicts:#?}");
    let verdict = fleet.status.rollout.and_then(|r| r.analysis).unwrap_or_else(|| panic!("a verdict"));
    assert_eq!(verdict.verdict, sked_api::AnalysisVerdict::Passed, "{}", verdict.message);
    assert!(fleet.events.iter().all(|e| e.reason != Reason::AnalysisFailed));
}

#[test]
fn a_refused_generation_is_not_tried_again_until_the_spec_changes() {
    let mut fleet = deployed(3);
    fleet.set_image(BAD);
    let failed = |f: &Fleet| f.status.rollout.as_ref().is_some_and(|r| r.failed.is_some());
    assert!(fleet.run_until(20, ATTACH_TIMEOUT / 4, failed));
    assert!(fleet.run_until(20, BAKE, |f| all_run(f, GOOD)));
    let made = fleet.made.len();
    for _ in 0..5 {
        let write = fleet.observed(daemonset).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(write, DaemonSetWrite::Keep { .. }), "the failed revision is not applied again: {write:?}");
        fleet.reconcile();
        fleet.settle(ATTACH_TIMEOUT);
    }
    assert_eq!(
        fleet.made.len(),
        made,
        "no pod of the failed generation is made again: {:?} {:?} {:?}",
        fleet.made,
        fleet.status.rollout,
        fleet.events
    );
    assert_eq!(fleet.current(), Some(GOOD));
    // A new generation is a new attempt.
    fleet.set_image(BETTER);
    let write = fleet.observed(daemonset).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(write, DaemonSetWrite::Apply { ref image, .. } if image == BETTER), "{write:?}");
    assert!(fleet.run_until(60, BAKE, |f| complete(f) && f.current() == Some(BETTER)), "{:?}", fleet.status.rollout);
}

#[test]
fn a_takeover_sends_a_node_where_it_fails_back_to_the_kernels_default() {
    let mut fleet = deployed(2);
    // Two nodes of an older Scheduler's pool come to this one; one of them never attaches.
    for node in ["node-2", "node-3"] {
        fleet.labels.insert(node.into(), Some("old".into()));
        fleet.facts.insert(node.into(), NodeFacts { created: Some(CREATED - 100), ..NodeFacts::default() });
        fleet.placement.owned.insert(node.into());
    }
    fleet.broken.insert("node-2".into());
    let evicted = |f: &Fleet| f.events.iter().any(|e| e.message.contains("the nodes it was taking over"));
    assert!(fleet.run_until(40, BAKE, evicted), "the failed takeover is sent back: {:?}", fleet.events);
    assert_eq!(fleet.labels.get("node-2"), Some(&None), "node-2 lost the owner label");
    assert_eq!(fleet.current(), Some(GOOD), "the current revision stays");
    assert!(fleet.daemonset.is_some(), "the DaemonSet stays for the nodes that run it");
}

#[test]
fn a_node_watch_behind_the_label_writes_lets_no_node_in_twice_nor_a_wave_past_the_budget() {
    let mut fleet = Fleet::new(6, GOOD);
    // The Node watch starts over (an API server restart): labels show three moves late.
    fleet.label_lag = 3;
    let mut admitted: BTreeMap<String, usize> = BTreeMap::new();
    let mut most_switching = 0;
    for _ in 0..80 {
        let plan = fleet.reconcile();
        for node in plan.rollout.iter().flat_map(|s| &s.admit) {
            *admitted.entry(node.clone()).or_default() += 1;
        }
        let running = |n: &String| fleet.pods.get(n).is_some_and(|p| p.ready_since.is_some());
        let switching = admitted.keys().filter(|n| !running(n)).count();
        most_switching = most_switching.max(switching);
        if complete(&fleet) && admitted.len() == 6 {
            break;
        }
        fleet.settle(BAKE / 2);
    }
    assert!(complete(&fleet), "{:?}", fleet.status.rollout);
    assert!(admitted.values().all(|n| *n == 1), "each node let in once: {admitted:?}");
    assert!(most_switching <= 1, "at most maxUnavailable (1) nodes switching at once: {most_switching}");
}

#[test]
fn a_label_taken_off_after_the_watch_caught_up_is_written_again() {
    let mut fleet = Fleet::new(3, GOOD);
    let plan = fleet.reconcile();
    let canary = plan.rollout.iter().flat_map(|s| s.admit.clone()).next().unwrap_or_default();
    assert!(!canary.is_empty(), "a canary is let in");
    // Someone takes the label off at once (a newer version of the node, which the watch shows).
    fleet.version += 1;
    fleet.labels.insert(canary.clone(), None);
    fleet.versions.insert(canary.clone(), fleet.version);
    let plan = fleet.reconcile();
    let admitted: Vec<String> = plan.rollout.iter().flat_map(|s| s.admit.clone()).collect();
    assert_eq!(admitted, vec![canary], "the label is written again");
}

#[test]
fn a_refused_image_keeps_the_daemonset_and_says_why() {
    let mut fleet = deployed(2);
    fleet.set_image(BETTER);
    fleet.refusal = Some(ImageRefusal { message: "no signature of r.io/scx matches".into(), transient: false });
    let plan = fleet.reconcile();
    assert!(!fleet.last_writes.contains(&"daemonset"), "a refused image deploys nothing: {:?}", fleet.last_writes);
    assert!(plan.rollout.as_ref().is_none_or(|s| s.replace.is_empty()), "no pod is replaced");
    let said = fleet.status.conditions.iter().any(|c| c.message.contains("no signature of r.io/scx matches"));
    assert!(said, "the status says why: {:?}", fleet.status.conditions);
}

#[test]
fn a_node_that_is_down_is_skipped_and_the_first_deployment_finishes() {
    let mut fleet = Fleet::new(4, GOOD);
    fleet.facts.insert("node-3".into(), NodeFacts { not_ready: Some(NotReady::Registering), ..NodeFacts::default() });
    assert!(fleet.run_until(60, BAKE, complete), "{:?}", fleet.status.rollout);
    let skipped = fleet.status.rollout.as_ref().map(|r| r.skipped_nodes.clone()).unwrap_or_default();
    assert_eq!(skipped, vec!["node-3".to_owned()]);
}

#[test]
fn a_fleet_at_rest_and_a_new_leader_that_finds_it_so_write_nothing() {
    let mut fleet = deployed(3);
    fleet.settle(BAKE);
    fleet.reconcile();
    for round in 0..3 {
        let plan = fleet.reconcile();
        assert!(fleet.last_writes.is_empty(), "round {round} wrote {:?}", fleet.last_writes);
        assert_eq!(plan.events().count(), 0, "round {round}");
        assert_eq!(plan.recheck, None, "round {round}: nothing to look at again");
    }
    // A new leader, once its grace for the agents is over: its own apply is found on the
    // DaemonSet, its conditions on the pods.
    fleet.new_term();
    fleet.settle(60);
    let write = fleet.observed(daemonset).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(write, DaemonSetWrite::Keep { remember: Some(_), requeue: None }), "{write:?}");
    fleet.reconcile();
    assert!(fleet.last_writes.is_empty(), "the new leader wrote {:?}", fleet.last_writes);
}

#[test]
fn a_new_leader_keeps_the_kernel_condition_while_its_agents_come_back() {
    let mut fleet = deployed(3);
    fleet.new_term();
    fleet.reports.clear();
    let plan = fleet.reconcile();
    assert!(!fleet.last_writes.contains(&"status"), "silent agents change nothing yet: {:?}", plan.status.status);
    assert!(plan.recheck.is_some_and(|r| r <= Duration::from_secs(31)), "it looks again when its grace ends");
}

#[test]
fn an_ejection_is_recorded_once_and_a_new_leader_reads_the_events_before_it_records_it_again() {
    let mut fleet = deployed(2);
    fleet.settle(BAKE);
    let stall = sked_api::KernelExit {
        node: "node-0".into(),
        ops: "rusty".into(),
        reason: "runnable task stall".into(),
        time: jiff::Timestamp::from_second(fleet.wall)
            .unwrap_or_default()
            .strftime("%Y-%m-%dT%H:%M:%S.000Z")
            .to_string(),
        ejected: true,
        ..sked_api::KernelExit::default()
    };
    let ejected = |f: &mut Fleet| {
        if let Some(r) = f.reports.get_mut("node-0") {
            r.last_exit = Some(stall.clone());
        }
    };
    ejected(&mut fleet);
    let plan = fleet.reconcile();
    assert_eq!(plan.status.exit_events.len(), 1, "the ejection's event: {:?}", plan.status.exit_events);
    assert_eq!(plan.remember.exits_recorded, vec![stall.clone()]);
    assert!(fleet.reconcile().status.exit_events.is_empty(), "recorded once");
    // A new leader: the ejection is from before its term, so it reads the events first.
    fleet.settle(BAKE);
    fleet.new_term();
    fleet.settle(60);
    ejected(&mut fleet);
    let looks = fleet.observed(|s| ejections_to_look_up("s", s.reports, s.memory, s.clock.wall));
    assert!(looks, "an ejection from before the term is looked up in the events");
    let key = crate::kernel_summary::ejection_key(&stall.node, &stall.time);
    fleet.memory.ejections_on_record.insert(key);
    assert!(fleet.reconcile().status.exit_events.is_empty(), "on record already: not recorded again");
    let looks = fleet.observed(|s| ejections_to_look_up("s", s.reports, s.memory, s.clock.wall));
    assert!(!looks, "once the term remembers it, the events are not read again");
}

/// A random fleet through a random history: spec changes to a good or a bad image, a node
/// whose kernel breaks, a new leader, time passing.
fn arb_history() -> impl Strategy<Value = (usize, Vec<u8>)> {
    (1usize..6, prop::collection::vec(0u8..6, 0..12))
}

fn play(nodes: usize, moves: &[u8]) -> Fleet {
    let mut fleet = Fleet::new(nodes, GOOD);
    for &m in moves {
        match m {
            0 => fleet.set_image(BAD),
            1 => fleet.set_image(BETTER),
            2 => {
                fleet.broken.insert("node-0".into());
            }
            3 => fleet.new_term(),
            _ => {}
        }
        fleet.reconcile();
        fleet.settle(i64::from(m) * 7);
    }
    fleet
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A reconcile woken by the echo of its own status and pod condition writes (nothing else
    /// changed since) writes nothing and records nothing. (A rollout action changes the world:
    /// the reconcile after it may well write.)
    #[test]
    fn a_reconcile_woken_by_its_own_writes_writes_nothing((nodes, moves) in arb_history()) {
        let mut fleet = play(nodes, &moves);
        for _ in 0..10 {
            fleet.reconcile();
            if !fleet.last_writes.iter().any(|w| *w == "rollout" || *w == "daemonset") {
                break;
            }
        }
        let before = fleet.status.clone();
        let plan = fleet.reconcile();
        prop_assert!(fleet.last_writes.is_empty(), "{moves:?} wrote {:?}: {:?}", fleet.last_writes, diff(&before, &plan.status.status));
        prop_assert_eq!(plan.events().count(), 0);
    }

    /// Whatever happens, no node's pod is replaced by one of the same revision (no scheduler
    /// restarts for nothing), save by the retry of a revision that failed.
    #[test]
    fn no_pod_is_replaced_by_one_of_its_own_revision((nodes, moves) in arb_history()) {
        let fleet = play(nodes, &moves);
        let mut last: BTreeMap<&str, &str> = BTreeMap::new();
        for (node, revision) in &fleet.made {
            if node == "*" {
                last.clear();
                continue;
            }
            prop_assert_ne!(last.insert(node, revision), Some(revision.as_str()), "{:?}: {:?}", moves, fleet.made);
        }
    }
}
