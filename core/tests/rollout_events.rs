//! Rollouts driven as random event sequences against the pure deciders ([`rollout::decide`]
//! and [`rollout::advance`]), the way the reconcile drives them: a simulated cluster (nodes
//! entered or not, pods present, terminating or absent, kernels that attach, report nothing,
//! run another scheduler or have no sched_ext, crash loops, ejections, nodes going down or
//! tainted, nodes that never had a kubelet, full nodes whose pods are never bound, kubelets that
//! die before they start a pod, a DaemonSet controller that lags, leader failovers, spec
//! changes mid-rollout, pauses, first deployments from revision zero) is stepped; between steps
//! random events hit it; then the events stop and the revision's trouble heals: the rollout
//! must settle around the nodes still in trouble; then those heal too, and it must settle
//! with every node in.
//!
//! Every invariant is checked against the simulated world's truth, never against the
//! decider's own counting.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use proptest::prelude::*;
use sked_api::{Revision, RolloutFailure, RolloutPhase, RolloutStatus};
use sked_core::rollout::{
    self, Decision, Entering, Input, KernelView, NodeView, Pacing, PodView, Progress, Skip, Step,
};

const ATTACH_TIMEOUT: i64 = 120;
const BAKE: i64 = 30;
/// Seconds between two reconciles.
const TICK: i64 = 10;

/// What a node's kernel can do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    SchedExt,
    /// Another scheduler, started outside sked, owns it.
    Foreign,
    /// No sched_ext.
    Unsupported,
}

/// A scheduler pod, as the world knows it.
#[derive(Clone, Debug)]
struct Pod {
    name: String,
    revision: String,
    created: i64,
    /// Attached (and so Ready) since then.
    attached_since: Option<i64>,
    crash_looping: bool,
    ejected: bool,
    /// kube-scheduler bound it (its node had room when it was made).
    bound: bool,
    started: bool,
    terminating_since: Option<i64>,
}

impl Pod {
    fn live(&self) -> bool {
        self.terminating_since.is_none()
    }
}

#[derive(Clone, Debug)]
struct Node {
    kernel: Kernel,
    /// Carries the Scheduler's owner label (it entered the Scheduler).
    labelled: bool,
    /// Joined the cluster after the Scheduler was created.
    joined: bool,
    /// Not Ready: its kubelet starts nothing.
    down: bool,
    /// No kubelet ever reported on it (a Node still registering): no Ready condition.
    registering: bool,
    /// No room for one more pod: a pod made for it is never bound.
    full: bool,
    /// Its kubelet died and the Node does not show it yet: a bound pod is never started.
    kubelet_dead: bool,
    /// A taint the Scheduler does not tolerate: the DaemonSet puts no new pod there.
    tainted: bool,
    /// Its agent's report is missing (stale): only the pod's readiness tells.
    report_lost: bool,
    /// Its last pod was deleted by someone else (not by the rollout): the DaemonSet controller
    /// makes the next one from the template it last saw, which may still be a failed one.
    deleted_by_world: bool,
    pod: Option<Pod>,
}

impl Node {
    fn new(kernel: Kernel, joined: bool) -> Self {
        Node {
            kernel,
            labelled: false,
            joined,
            down: false,
            registering: false,
            full: false,
            kubelet_dead: false,
            tainted: false,
            report_lost: false,
            deleted_by_world: false,
            pod: None,
        }
    }

    /// Skipped by definition: nothing a pod does there says anything of a revision.
    fn skipped(&self) -> bool {
        self.kernel != Kernel::SchedExt || self.cannot_run()
    }

    /// No pod can run on it now, as the Node shows (not Ready, registering, tainted): it takes
    /// no place in a wave.
    fn cannot_run(&self) -> bool {
        self.down || self.registering || self.tainted
    }

    /// Labelling it switches nothing: it joined the cluster on its own after a revision ran
    /// everywhere, or a taint keeps every pod of the Scheduler away (and it is Ready).
    fn enters_at_once(&self, stable: bool) -> bool {
        (self.joined && stable) || (self.tainted && !self.down && !self.registering)
    }

    /// Its kernel can be known: a pod runs there, whose agent reports it.
    fn kernel_known(&self) -> bool {
        self.pod.as_ref().is_some_and(|p| p.live() && p.started)
    }

    /// No pod of it runs, and the next one will not either: its live pod was never bound or
    /// never started, or it is full or its kubelet is dead (the node's trouble, which the
    /// rollout finds out only at the pod's deadline).
    fn stuck_pod(&self) -> bool {
        !self.kernel_known() && (self.full || self.kubelet_dead || self.pod.as_ref().is_some_and(|p| p.live()))
    }

    /// The node's live pod, attached and Ready.
    fn available(&self) -> bool {
        self.pod.as_ref().is_some_and(|p| p.live() && p.attached_since.is_some())
    }
}

/// What the reconcile reads off the Node: why no pod can run there now, if so.
fn unfit(node: &Node) -> Option<Skip> {
    if node.down || node.registering {
        Some(Skip::NodeNotReady)
    } else {
        node.tainted.then_some(Skip::TaintNotTolerated)
    }
}

/// A random event between two reconciles. Node indices are taken modulo the node count.
#[derive(Clone, Debug)]
enum Event {
    Nothing,
    CrashLoop(usize),
    Eject(usize),
    ToggleReport(usize),
    ToggleDown(usize),
    ToggleTaint(usize),
    ToggleFull(usize),
    ToggleKubeletDead(usize),
    DeletePod(usize),
    /// The spec asks for a new revision (broken everywhere, or not).
    NewRevision {
        broken: bool,
    },
    /// The spec is set back to the stable revision.
    SpecBack,
    TogglePause,
    Failover,
    /// The DaemonSet controller misses the next template change for a tick.
    DaemonSetSlow,
    NodeJoins {
        joined: bool,
        kernel: Kernel,
        /// It joins as a Node no kubelet reported on yet.
        registering: bool,
    },
    NodeGone(usize),
}

fn arb_kernel() -> impl Strategy<Value = Kernel> {
    prop_oneof![6 => Just(Kernel::SchedExt), 1 => Just(Kernel::Foreign), 1 => Just(Kernel::Unsupported)]
}

fn arb_event() -> impl Strategy<Value = Event> {
    let i = 0usize..16;
    prop_oneof![
        12 => Just(Event::Nothing),
        2 => i.clone().prop_map(Event::CrashLoop),
        1 => i.clone().prop_map(Event::Eject),
        1 => i.clone().prop_map(Event::ToggleReport),
        1 => i.clone().prop_map(Event::ToggleDown),
        1 => i.clone().prop_map(Event::ToggleTaint),
        1 => i.clone().prop_map(Event::ToggleFull),
        1 => i.clone().prop_map(Event::ToggleKubeletDead),
        1 => i.clone().prop_map(Event::DeletePod),
        2 => prop_oneof![3 => Just(false), 1 => Just(true)].prop_map(|broken| Event::NewRevision { broken }),
        1 => Just(Event::SpecBack),
        1 => Just(Event::TogglePause),
        1 => Just(Event::Failover),
        1 => Just(Event::DaemonSetSlow),
        1 => (any::<bool>(), arb_kernel(), any::<bool>())
            .prop_map(|(joined, kernel, registering)| Event::NodeJoins { joined, kernel, registering }),
        1 => i.prop_map(Event::NodeGone),
    ]
}

/// How a simulated rollout starts.
#[derive(Clone, Debug)]
struct Setup {
    kernels: Vec<Kernel>,
    /// No revision ran before: every node still runs revision zero.
    first_deployment: bool,
    /// The first revision asked for is broken everywhere.
    broken: bool,
    canary: usize,
    max_unavailable: usize,
    /// Seconds from a pod's creation to its scheduler attaching (less than the attach timeout).
    attach_after: i64,
}

fn arb_setup() -> impl Strategy<Value = Setup> {
    (
        proptest::collection::vec(arb_kernel(), 1..8),
        any::<bool>(),
        prop_oneof![4 => Just(false), 1 => Just(true)],
        0usize..3,
        1usize..4,
        0i64..60,
    )
        .prop_map(|(kernels, first_deployment, broken, canary, max_unavailable, attach_after)| Setup {
            kernels,
            first_deployment,
            broken,
            canary,
            max_unavailable,
            attach_after,
        })
}

fn revision(name: &str, generation: i64) -> Revision {
    Revision { name: name.into(), image: image(name), generation, spec: None, agent_image: None }
}

fn image(revision: &str) -> String {
    format!("r.io/s@sha256:{revision}")
}

fn time(now: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(now).expect("a valid timestamp"))
}

/// A failed revision being rolled back: the nodes it reached, and those restored since.
#[derive(Clone, Debug)]
struct Rollback {
    revision: String,
    /// A first revision: its nodes go back to revision zero (their owner label is removed).
    first: bool,
    reached: BTreeSet<String>,
    restored: BTreeSet<String>,
}

/// The simulated cluster, the Scheduler's spec and status, and the controller's memory.
struct World {
    nodes: BTreeMap<String, Node>,
    /// The revision the spec asks for, the Scheduler's generation, `spec.rollout.paused`.
    wanted: String,
    generation: i64,
    paused: bool,
    /// Revisions that attach nowhere.
    broken: BTreeSet<String>,
    /// The DaemonSet's template, and the one its controller has seen.
    template: String,
    observed: String,
    ds_slow: bool,
    /// Bumped each time the template changes: one rollout.
    epoch: usize,
    status: RolloutStatus,
    /// The leader's memory: when it wrote each owner label; when its term began.
    labelled_at: BTreeMap<String, i64>,
    term_start: i64,
    now: i64,
    counter: usize,
    attach_after: i64,
    canary: usize,
    max_unavailable: usize,
    /// Pod replacements and admissions per node and epoch.
    replaced: BTreeMap<(String, usize), usize>,
    admitted: BTreeMap<(String, usize), usize>,
    rollback: Option<Rollback>,
    /// Nodes sent back to revision zero after the stable revision failed to take them over while
    /// another revision's failure stood: they stay out until the spec changes.
    held: BTreeSet<String>,
}

impl World {
    /// A first deployment (every node on revision zero, none labelled) or an established
    /// Scheduler whose stable revision runs attached everywhere and whose spec just changed.
    fn new(setup: &Setup) -> Self {
        let mut nodes: BTreeMap<String, Node> =
            setup.kernels.iter().enumerate().map(|(i, k)| (format!("n{i:02}"), Node::new(*k, false))).collect();
        let mut status = RolloutStatus::default();
        let mut template = "r1".to_owned();
        if !setup.first_deployment {
            template = "r0".to_owned();
            for (name, node) in &mut nodes {
                node.labelled = true;
                let attached = (node.kernel == Kernel::SchedExt).then_some(0);
                node.pod = Some(Pod {
                    name: format!("{name}-r0"),
                    revision: "r0".into(),
                    created: 0,
                    attached_since: attached,
                    crash_looping: false,
                    ejected: false,
                    bound: true,
                    started: true,
                    terminating_since: None,
                });
            }
            status.current_revision = Some(revision("r0", 1));
            status.phase = RolloutPhase::Complete;
        }
        World {
            nodes,
            wanted: "r1".into(),
            generation: 2,
            paused: false,
            broken: if setup.broken { BTreeSet::from(["r1".to_owned()]) } else { BTreeSet::new() },
            observed: template.clone(),
            template,
            ds_slow: false,
            epoch: 0,
            status,
            labelled_at: BTreeMap::new(),
            term_start: -1000,
            now: 1000,
            counter: 1,
            attach_after: setup.attach_after,
            canary: setup.canary,
            max_unavailable: setup.max_unavailable,
            replaced: BTreeMap::new(),
            admitted: BTreeMap::new(),
            rollback: None,
            held: BTreeSet::new(),
        }
    }

    fn stable(&self) -> Option<String> {
        self.status.current_revision.as_ref().map(|r| r.name.clone())
    }

    /// The recorded failure of the revision the spec asks for, as the reconcile filters it.
    fn failed(&self) -> Option<RolloutFailure> {
        self.status.failed.clone().filter(|f| f.generation == self.generation && f.revision == self.wanted)
    }

    /// The name of the `i`th node (modulo their count), if there is any.
    fn nth(&self, i: usize) -> Option<String> {
        self.nodes.keys().nth(i % self.nodes.len().max(1)).cloned()
    }

    /// A spec change: a new generation, so a recorded failure no longer stops the rollout.
    /// A failure recorded for the old generation no longer holds, so the revision may be tried
    /// again: a new rollout (epoch) for the replace-once and admit-once counts.
    fn spec_changed(&mut self) {
        if self.status.failed.is_some() {
            self.epoch += 1;
        }
        self.generation += 1;
        self.rollback = None;
        self.held.clear();
    }

    /// Applies one random event to the world.
    fn event(&mut self, event: &Event) {
        let node_of = |w: &mut World, i: usize| w.nth(i).and_then(|n| w.nodes.get_mut(&n).map(|_| n));
        match *event {
            Event::Nothing => {}
            Event::CrashLoop(i) | Event::Eject(i) => {
                let crash = matches!(event, Event::CrashLoop(_));
                let Some(n) = node_of(self, i) else { return };
                // Only a scheduler that runs can crash or be ejected.
                let Some(pod) = self.nodes.get_mut(&n).and_then(|node| node.pod.as_mut()).filter(|p| p.started) else {
                    return;
                };
                if crash {
                    (pod.crash_looping, pod.attached_since) = (true, None);
                } else if pod.attached_since.is_some() {
                    (pod.ejected, pod.attached_since) = (true, None);
                }
            }
            Event::ToggleReport(i)
            | Event::ToggleDown(i)
            | Event::ToggleTaint(i)
            | Event::ToggleFull(i)
            | Event::ToggleKubeletDead(i) => {
                let Some(node) = self.nth(i).and_then(|n| self.nodes.get_mut(&n)) else { return };
                let flag = match event {
                    Event::ToggleReport(_) => &mut node.report_lost,
                    Event::ToggleDown(_) => &mut node.down,
                    Event::ToggleFull(_) => &mut node.full,
                    Event::ToggleKubeletDead(_) => &mut node.kubelet_dead,
                    _ => &mut node.tainted,
                };
                *flag = !*flag;
            }
            Event::DeletePod(i) => {
                let Some(n) = self.nth(i) else { return };
                let now = self.now;
                let node = self.nodes.get_mut(&n);
                if let Some((node, pod)) = node
                    .and_then(|node| node.pod.as_mut().map(|p| (&mut node.deleted_by_world, p)))
                    .filter(|(_, p)| p.live())
                {
                    (*node, pod.terminating_since) = (true, Some(now));
                    // Replaced by the world, not by the rollout.
                    if let Some(r) = self.rollback.as_mut().filter(|r| !r.first && !r.restored.contains(&n)) {
                        r.reached.remove(&n);
                    }
                }
            }
            Event::NewRevision { broken } => {
                self.counter += 1;
                self.wanted = format!("r{}", self.counter);
                if broken {
                    self.broken.insert(self.wanted.clone());
                }
                self.spec_changed();
            }
            Event::SpecBack => {
                if let Some(stable) = self.stable().filter(|s| *s != self.wanted) {
                    self.wanted = stable;
                    self.spec_changed();
                }
            }
            Event::TogglePause => {
                self.paused = !self.paused;
                self.spec_changed();
            }
            Event::Failover => {
                self.labelled_at.clear();
                self.term_start = self.now;
            }
            Event::DaemonSetSlow => self.ds_slow = true,
            Event::NodeJoins { joined, kernel, registering } => {
                self.counter += 1;
                self.nodes.insert(format!("j{:02}", self.counter), Node { registering, ..Node::new(kernel, joined) });
            }
            Event::NodeGone(i) => {
                let Some(n) = self.nth(i) else { return };
                self.nodes.remove(&n);
                if let Some(r) = self.rollback.as_mut() {
                    r.reached.remove(&n);
                    r.restored.remove(&n);
                }
            }
        }
    }

    /// The revision's world behaves from now on: reports arrive, crash-looping or ejected
    /// schedulers of a good revision restart and attach, the rollout is unpaused. The nodes'
    /// own trouble stays ([`World::heal_nodes`]).
    fn heal(&mut self) {
        for node in self.nodes.values_mut() {
            node.report_lost = false;
            if let Some(pod) = node.pod.as_mut().filter(|p| !self.broken.contains(&p.revision)) {
                (pod.crash_looping, pod.ejected) = (false, false);
            }
        }
        if self.paused {
            self.paused = false;
            self.spec_changed();
        }
    }

    /// The nodes come back: Ready, registered, untainted, with room and a live kubelet.
    fn heal_nodes(&mut self) {
        for node in self.nodes.values_mut() {
            (node.down, node.registering, node.tainted, node.full, node.kubelet_dead) =
                (false, false, false, false, false);
        }
    }
}

impl World {
    /// The cluster between two reconciles: the DaemonSet controller sees the template (unless
    /// slow), deletes pods on nodes without the owner label and makes pods on labelled nodes
    /// that have none; deleted pods go (except on a node that is down); kubelets start pods;
    /// schedulers of a good revision attach `attach_after` seconds after their pod's creation.
    /// Fails when a pod of a revision whose failure is recorded is made.
    fn tick(&mut self) -> Result<(), TestCaseError> {
        if !std::mem::take(&mut self.ds_slow) {
            self.observed = self.template.clone();
        }
        let failed = self.failed().map(|f| f.revision).filter(|f| Some(f) != self.stable().as_ref());
        let now = self.now;
        for (name, node) in &mut self.nodes {
            let gone = node.pod.as_ref().is_some_and(|p| p.terminating_since.is_some_and(|t| t < now) && !node.down);
            if gone {
                node.pod = None;
            }
            // The pod someone else deleted is gone now: the DaemonSet controller refills at once.
            let world_deleted = gone && std::mem::take(&mut node.deleted_by_world);
            match node.pod.as_mut() {
                Some(pod) if !node.labelled && pod.live() => pod.terminating_since = Some(now),
                Some(_) => {}
                None if node.labelled && !node.tainted => {
                    // Unless someone else deleted the pod before the DaemonSet controller saw
                    // the rollback (no controller can stop that; the rollout then replaces it).
                    let lagging_refill = world_deleted && self.observed != self.template;
                    prop_assert!(
                        failed.as_ref() != Some(&self.observed) || lagging_refill,
                        "a pod of failed {failed:?} made on {name}"
                    );
                    if let Some(r) = self.rollback.as_mut().filter(|r| !r.first && lagging_refill) {
                        // The failed revision reached this node after all: the rollback restores it.
                        if failed.as_ref() == Some(&self.observed) {
                            r.reached.insert(name.clone());
                        }
                    }
                    self.counter += 1;
                    node.pod = Some(Pod {
                        name: format!("{name}-{}", self.counter),
                        revision: self.observed.clone(),
                        created: now,
                        attached_since: None,
                        crash_looping: false,
                        ejected: false,
                        bound: false,
                        started: false,
                        terminating_since: None,
                    });
                }
                None => {}
            }
            let Some(pod) = node.pod.as_mut().filter(|p| p.live()) else { continue };
            // kube-scheduler binds it once the node has room; a kubelet that runs takes it up.
            pod.bound |= !node.full && !node.registering;
            pod.started |= pod.bound && !node.down && !node.registering && !node.kubelet_dead;
            let attaches = node.kernel == Kernel::SchedExt
                && pod.started
                && !node.down
                && !pod.crash_looping
                && !pod.ejected
                && !self.broken.contains(&pod.revision)
                && now >= pod.created + self.attach_after;
            if attaches && pod.attached_since.is_none() {
                pod.attached_since = Some(now);
            }
        }
        Ok(())
    }

    /// What the reconcile reads of one labelled node (and, like it, forgets when it labelled
    /// a node once that node runs attached).
    fn view(&mut self, name: &str) -> NodeView {
        let node = &self.nodes[name];
        let live = node.pod.as_ref().filter(|p| p.live() && p.started);
        let kernel = match (node.kernel, live) {
            (_, None) => KernelView::Unknown,
            (Kernel::Foreign, Some(_)) => KernelView::Foreign,
            (Kernel::Unsupported, Some(_)) => KernelView::Unsupported,
            (Kernel::SchedExt, Some(_)) if node.report_lost => KernelView::Unknown,
            (Kernel::SchedExt, Some(p)) => match p.attached_since {
                Some(since) => KernelView::Attached { since },
                None if p.ejected => KernelView::Ejected,
                None => KernelView::NotAttached,
            },
        };
        let pod = node.pod.as_ref().map(|p| PodView {
            name: p.name.clone(),
            revision: p.revision.clone(),
            ready_since: p.attached_since,
            created: p.created,
            crash_looping: p.crash_looping,
            bound: p.bound,
            started: p.started,
            pull_error: None,
            last_exit: None,
            terminating_since: p.terminating_since,
        });
        let unfit = unfit(node);
        if node.available() {
            self.labelled_at.remove(name);
        }
        let at = self.labelled_at.get(name).copied();
        let just_labelled = pod.is_none()
            && (self.now - self.term_start < ATTACH_TIMEOUT || at.is_some_and(|at| self.now - at < ATTACH_TIMEOUT));
        NodeView {
            node: name.to_owned(),
            pod,
            kernel,
            exit: None,
            just_labelled,
            // Its replacements are seen at once here: no watch lags behind them.
            just_replaced: false,
            unfit,
            entered_at: at.map(|at| at - 1),
            scheduler_stats: None,
        }
    }

    /// The owned nodes without the owner label, entering from revision zero.
    fn entering(&self) -> Vec<Entering> {
        let unlabelled = self.nodes.iter().filter(|(_, n)| !n.labelled);
        unlabelled
            .map(|(name, n)| Entering { node: name.clone(), joined: n.joined, runs_it: false, unfit: unfit(n) })
            .collect()
    }

    /// The truth: labelled nodes that could run an attached scheduler and do not. Leaves out
    /// `fresh` (nodes that joined on their own, admitted at once, which runs nothing at risk)
    /// and, under the stable revision, nodes whose stable pod went down on its own (not a
    /// switch: they entered before this leader's memory).
    fn unavailable(&self, fresh: &BTreeSet<String>) -> usize {
        let restoring = self.stable().as_ref() == Some(&self.template);
        let counts = |(name, n): &(&String, &Node)| {
            let down_on_its_own = restoring
                && !self.labelled_at.contains_key(*name)
                && n.pod.as_ref().is_some_and(|p| p.live() && Some(&p.revision) == self.stable().as_ref());
            // A pod never bound or never started, past its deadline, is the node's known
            // trouble: skipped, it does not count against the budget.
            let known_stuck =
                n.pod.as_ref().is_some_and(|p| p.live() && !p.started && self.now >= p.created + ATTACH_TIMEOUT);
            n.labelled && !n.skipped() && !n.available() && !fresh.contains(*name) && !down_on_its_own && !known_stuck
        };
        self.nodes.iter().filter(counts).count()
    }
}

impl World {
    fn set_template(&mut self, revision: String) {
        if self.template != revision {
            self.template = revision;
            self.epoch += 1;
        }
    }

    /// One reconcile, as the controller runs it: the DaemonSet gets the spec's revision unless
    /// its failure is recorded; the rollout is decided, advanced, checked and carried out.
    fn reconcile(&mut self) -> Result<(), TestCaseError> {
        let failed = self.failed();
        if failed.is_none() {
            self.set_template(self.wanted.clone());
        }
        let labelled: Vec<String> = self.nodes.iter().filter(|(_, n)| n.labelled).map(|(k, _)| k.clone()).collect();
        let views: Vec<NodeView> = labelled.iter().map(|n| self.view(n)).collect();
        let entering = self.entering();
        let expected_pods = self.nodes.values().filter(|n| n.labelled && !n.tainted).count();
        let pacing = Pacing {
            canary: self.canary,
            max_unavailable: self.max_unavailable,
            bake_seconds: BAKE,
            attach_timeout_seconds: ATTACH_TIMEOUT,
            paused: self.paused,
        };
        let (template, stable, wanted) = (self.template.clone(), self.stable(), self.wanted.clone());
        let input = Input {
            target: &template,
            stable: stable.as_deref(),
            nodes: &views,
            entering: &entering,
            held: if failed.is_some() { &self.status.held_nodes } else { &[] },
            expected_pods,
            // As the reconcile reads it: a failure of the template's revision under an earlier
            // generation means a retry, whose earlier attempt's pods are not judged again.
            retried_after: self
                .status
                .failed
                .as_ref()
                .filter(|f| failed.is_none() && f.revision == template)
                .map(|f| f.time.0.as_second()),
            pacing,
            analysis: None,
            canary_gate: &rollout::CanaryGate::Open,
            now: self.now,
        };
        let plan = rollout::decide(&input);
        let wanted_image = image(&wanted);
        let step = rollout::advance(&Progress {
            previous: &self.status,
            failed: failed.as_ref(),
            plan: &plan,
            template: revision(&template, self.generation),
            wanted: Some((&wanted, &wanted_image)),
            caught_up: self.observed == template,
            now: time(self.now),
        });
        self.check_step(&plan, &step)?;
        self.carry_out(&step)
    }

    /// The node whose pod is named `pod`.
    fn node_of_pod(&self, pod: &str) -> Option<String> {
        self.nodes.iter().find(|(_, n)| n.pod.as_ref().is_some_and(|p| p.name == pod)).map(|(k, _)| k.clone())
    }

    /// Before a step is carried out: (e) no skipped node is replaced; (b) no node is replaced
    /// or admitted twice in one rollout (one template); a paused rollout starts no wave.
    fn check_step(&mut self, plan: &Decision, step: &Step) -> Result<(), TestCaseError> {
        let restoring = self.stable().as_ref() == Some(&self.template);
        for pod in &step.replace {
            let node = self.node_of_pod(pod).ok_or_else(|| TestCaseError::fail(format!("no pod {pod}")))?;
            let truth = &self.nodes[&node];
            let known_skipped = truth.cannot_run() || (truth.kernel != Kernel::SchedExt && truth.kernel_known());
            prop_assert!(!known_skipped, "skipped node {node} replaced: {truth:?}");
            prop_assert!(!plan.skipped.contains(&node), "{node} both skipped and replaced");
            let count = self.replaced.entry((node.clone(), self.epoch)).or_default();
            *count += 1;
            prop_assert!(*count == 1, "{node} replaced twice for revision {}", self.template);
        }
        let stable = self.stable();
        for node in &step.admit {
            prop_assert!(!self.nodes[node].labelled, "{node} admitted while labelled");
            prop_assert!(!self.held.contains(node), "{node} admitted again after it was sent back");
            let count = self.admitted.entry((node.clone(), self.epoch)).or_default();
            *count += 1;
            prop_assert!(*count == 1, "{node} admitted twice for revision {}", self.template);
            let at_once = self.nodes[node].enters_at_once(stable.is_some());
            prop_assert!(!self.paused || restoring || at_once, "paused, yet {node} admitted");
        }
        prop_assert!(!self.paused || restoring || step.replace.is_empty(), "paused, yet {:?} replaced", step.replace);
        for node in &step.admit {
            let not_ready = self.nodes[node].down || self.nodes[node].registering;
            prop_assert!(!not_ready, "{node} admitted though it is not Ready: {:?}", self.nodes[node]);
        }
        self.check_pacing(step)
    }

    /// A new revision goes canary first, and every wave after it waits for the bake of the
    /// nodes that run it (those that can: not down, and whose pod was bound and started).
    fn check_pacing(&self, step: &Step) -> Result<(), TestCaseError> {
        let stable = self.stable();
        if stable.as_ref() == Some(&self.template) || self.canary == 0 {
            return Ok(());
        }
        let fresh = |n: &String| self.nodes[n].enters_at_once(stable.is_some());
        let switched = step.replace.len() + step.admit.iter().filter(|n| !fresh(n)).count();
        if switched == 0 {
            return Ok(());
        }
        // A retry: the failed attempt's pods that do not run attached are made again, not baked.
        let retried_after =
            self.status.failed.as_ref().filter(|f| f.revision == self.template).map(|f| f.time.0.as_second());
        let earlier_attempt = |p: &Pod| p.attached_since.is_none() && retried_after.is_some_and(|t| p.created < t);
        let runs_template =
            |n: &Node| n.pod.as_ref().is_some_and(|p| p.live() && p.revision == self.template && !earlier_attempt(p));
        if !self.nodes.values().any(|n| n.labelled && runs_template(n)) {
            prop_assert!(switched <= self.canary, "{switched} node(s) switched before the canary of {}", self.template);
        }
        for (name, n) in &self.nodes {
            let judged = n.labelled && n.kernel == Kernel::SchedExt && !n.cannot_run() && !n.stuck_pod();
            if judged && runs_template(n) {
                let since = n.pod.as_ref().and_then(|p| p.attached_since);
                prop_assert!(
                    since.is_some_and(|t| self.now - t >= BAKE),
                    "a wave started while {name} had not baked: {n:?}"
                );
            }
        }
        Ok(())
    }

    /// Carries a step out (status saved, template rolled back, pods deleted, owner labels
    /// written and removed) and checks (a), the budget, and (d), the rollback's reach.
    fn carry_out(&mut self, step: &Step) -> Result<(), TestCaseError> {
        let stable = self.stable();
        let restoring = stable.as_ref() == Some(&self.template);
        let fresh: BTreeSet<String> =
            step.admit.iter().filter(|n| self.nodes[*n].enters_at_once(stable.is_some())).cloned().collect();
        let replaced: Vec<String> = step.replace.iter().filter_map(|p| self.node_of_pod(p)).collect();
        let up_replaced = replaced.iter().filter(|n| self.nodes[*n].available()).count();
        let took_down = if restoring { 0 } else { up_replaced } + step.admit.len() - fresh.len();
        self.start_rollback(step)?;
        self.status = step.status.clone();
        if step.roll_back && step.status.failed.is_some() {
            let back = stable.clone().ok_or_else(|| TestCaseError::fail("a rollback with no stable revision"))?;
            self.set_template(back);
        }
        for n in &replaced {
            if let Some(pod) = self.nodes.get_mut(n).and_then(|n| n.pod.as_mut()) {
                pod.terminating_since = Some(self.now);
            }
        }
        for n in &step.admit {
            self.nodes.get_mut(n).expect("an admitted node exists").labelled = true;
            self.labelled_at.insert(n.clone(), self.now);
        }
        let other_failure = self.failed().is_some_and(|f| Some(&f.revision) != stable.as_ref());
        for n in &step.evict {
            self.nodes.get_mut(n).expect("an evicted node exists").labelled = false;
            if restoring && other_failure {
                self.held.insert(n.clone());
            }
        }
        let after = self.unavailable(&fresh);
        prop_assert!(
            took_down == 0 || after <= self.max_unavailable,
            "{took_down} node(s) switched, {after} unavailable, budget {}",
            self.max_unavailable
        );
        if let Some(r) = self.rollback.as_mut() {
            r.restored.extend(if r.first { step.evict.clone() } else { replaced });
            prop_assert!(
                r.restored.is_subset(&r.reached),
                "restored {:?} beyond the reach {:?}",
                r.restored,
                r.reached
            );
        }
        Ok(())
    }

    /// When a revision (not the stable one) fails in this step: the nodes it reached, from the
    /// world's truth. A first revision reached every labelled node; any other, every labelled
    /// node with sched_ext whose live pod runs something else than the stable revision.
    fn start_rollback(&mut self, step: &Step) -> Result<(), TestCaseError> {
        let Some(failure) = step.newly_failed.as_ref() else { return Ok(()) };
        let stable = self.stable();
        if stable.as_ref() == Some(&failure.revision) {
            return Ok(()); // A takeover under the stable revision: only its failed nodes go back.
        }
        prop_assert!(self.rollback.is_none(), "a second failure while {:?} is rolled back", self.rollback);
        // (A node whose kernel is not known yet, its pod never started, is reached too.)
        let reached = self.nodes.iter().filter(|(_, n)| {
            n.labelled
                && (stable.is_none()
                    || (n.kernel == Kernel::SchedExt || !n.kernel_known())
                        && n.pod.as_ref().is_some_and(|p| p.live() && Some(&p.revision) != stable.as_ref()))
        });
        let reached = reached.map(|(k, _)| k.clone()).collect();
        self.rollback = Some(Rollback {
            revision: failure.revision.clone(),
            first: stable.is_none(),
            reached,
            restored: BTreeSet::new(),
        });
        Ok(())
    }

    /// (c) The rollout settled, by the world's truth: the spec's revision runs attached on
    /// every node with sched_ext and is the current one; or its failure is recorded and the
    /// stable revision runs attached on every labelled node with sched_ext, and every node entered
    /// unless the stable revision's own takeover failed (RolledBack), or, for
    /// a first revision, no node carries the owner label or runs a pod (Failed).
    fn settled(&self) -> bool {
        self.settled_among(|_| true)
    }

    /// (c) before the nodes heal: the rollout settled around the nodes still in trouble (not
    /// Ready, registering, tainted, a pod never bound or never started), judged only by the
    /// nodes that can run a pod; none of those holds it. (Pods on a node that is down do not
    /// go: no kubelet confirms.)
    fn settled_around_trouble(&self) -> bool {
        self.settled_among(|n| !n.cannot_run() && !n.stuck_pod())
    }

    /// (c) judged on the nodes `fit` keeps.
    fn settled_among(&self, fit: impl Fn(&Node) -> bool) -> bool {
        let phase = self.status.phase;
        let capable = || self.nodes.values().filter(|n| n.labelled && n.kernel == Kernel::SchedExt && fit(n));
        let runs = |rev: &str| capable().all(|n| n.available() && n.pod.as_ref().is_some_and(|p| p.revision == rev));
        match (self.failed(), self.stable()) {
            (None, stable) => {
                phase == RolloutPhase::Complete
                    && self.nodes.values().filter(|n| fit(n)).all(|n| n.labelled)
                    && runs(&self.wanted)
                    && (stable.as_ref() == Some(&self.wanted) || capable().next().is_none())
            }
            (Some(failed), Some(stable)) => {
                // A takeover that failed under the stable revision holds the nodes it sent back
                // until the spec changes; any other failure lets every node in on the stable one.
                let held = failed.revision == stable;
                phase == RolloutPhase::RolledBack
                    && self.template == stable
                    && (held || self.nodes.iter().all(|(name, n)| n.labelled || self.held.contains(name) || !fit(n)))
                    && runs(&stable)
            }
            (Some(_), None) => {
                let gone = |n: &Node| n.pod.as_ref().is_none_or(|p| !p.live() && !fit(n));
                phase == RolloutPhase::Failed && self.nodes.values().all(|n| !n.labelled && gone(n))
            }
        }
    }

    /// The world moves on, then the controller reconciles.
    fn step(&mut self) -> Result<(), TestCaseError> {
        self.tick()?;
        self.reconcile()?;
        self.now += TICK;
        Ok(())
    }
}

/// Steps the world until `settled` holds (within a bound), then three steps more, in which it
/// must keep holding.
fn settle(world: &mut World, settled: fn(&World) -> bool, what: &str) -> Result<(), TestCaseError> {
    let bound = 40 + 14 * world.nodes.len();
    let mut done = false;
    for _ in 0..bound {
        world.step()?;
        if settled(world) {
            done = true;
            break;
        }
    }
    prop_assert!(done, "not settled {what} after {bound} steps: {:?}\n{:#?}", world.status, world.nodes);
    for _ in 0..3 {
        world.step()?;
        prop_assert!(settled(world), "settled {what}, then not: {:?}\n{:#?}", world.status, world.nodes);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// Random events against a rollout, then a world that behaves: (a) the budget holds after
    /// every step that switched a node, counting every entered node without an attached
    /// scheduler; (b) no node is replaced (or admitted) twice for one revision; (e) skipped
    /// nodes are never replaced; no pod of a failed revision is made again; (c) the rollout
    /// settles within a bound and stays settled; (d) a rollback restored exactly the nodes the
    /// failed revision reached.
    #[test]
    fn rollouts_under_random_events_keep_their_invariants_and_settle(
        setup in arb_setup(),
        events in proptest::collection::vec(arb_event(), 0..40),
    ) {
        let mut world = World::new(&setup);
        for event in &events {
            world.event(event);
            world.step()?;
        }
        world.heal();
        // First around the nodes still in trouble: none of them may hold the rollout.
        settle(&mut world, World::settled_around_trouble, "around the nodes in trouble")?;
        world.heal_nodes();
        settle(&mut world, World::settled, "once every node can run a pod")?;
        if let Some(r) = &world.rollback {
            // A node reached while its kernel was not known (no pod of it ever ran) and known
            // since to run another scheduler, or none, is skipped: nothing to restore there.
            let foreign = |n: &String| world.nodes.get(n).is_some_and(|n| n.kernel != Kernel::SchedExt && n.kernel_known());
            let reached: BTreeSet<String> = r.reached.iter().filter(|n| !foreign(n) || r.restored.contains(*n)).cloned().collect();
            prop_assert_eq!(&r.restored, &reached, "the rollback of {}", r.revision);
        }
    }
}
