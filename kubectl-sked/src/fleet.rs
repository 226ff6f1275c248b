//! What the API server holds about the fleet, read once ([`Fleet`]), and the rows of `status`
//! and `nodes` made from it: pure functions, tested without a server.
//!
//! Each node's kernel state is its scheduler pod's `sked.schedkit.io/KernelAttached` condition
//! (sked-api's `pod_kernel`), which the controller writes from the node's agent; who owns a node
//! is the controller's owner label, and who claims it is the arbiter's rule (sked-core).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use serde::Serialize;
use sked_api::labels::{AGENT_CONTAINER, KERNEL_LABEL, NAME_LABEL, OWNER_LABEL, REVISION_LABEL, SCHED_EXT_LABEL};
use sked_api::pod_kernel::{POD_CONDITION, PodKernel};
use sked_api::{RolloutPhase, Scheduler};
use sked_core::arbiter::{Assignment, Claim, assign};
use sked_core::pods::SchedulerPod;

/// The Schedulers, their pods and (when the caller may list them) the Nodes.
pub struct Fleet {
    pub schedulers: Vec<Scheduler>,
    pub pods: Vec<Pod>,
    /// `None`: the caller may not list Nodes; rows only a Node tells are left out.
    pub nodes: Option<Vec<Node>>,
}

/// One node of a Scheduler, as `kubectl sked status` shows it.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct StatusRow {
    pub scheduler: String,
    pub node: String,
    pub pod: Option<String>,
    /// The pod's revision label.
    pub revision: Option<String>,
    /// `current`, `updating`, or `other` (neither the current nor the update revision).
    pub revision_role: Option<&'static str>,
    pub ready: Option<bool>,
    /// `attached`, `not-attached`, `foreign`, `unsupported`, `ejected`, `stale`; without a
    /// condition `unknown`; a node without a pod `no-pod`, `not-owned` (another Scheduler owns
    /// it) or `unsupported`.
    pub kernel: String,
    /// The node's verdict in the analysis of the last bake, and its values
    /// (`status.rollout.analysis.nodes`), e.g. "Failed: run delay 1.90 ms (...)".
    pub analysis: Option<String>,
    /// What becomes of the pods' CPU limits and requests under the node's scheduler, as the
    /// pod's condition says (see `kubectl sked status`: "The pods' CPU contract, by node").
    pub cpu_contract: Option<String>,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub ops: Option<String>,
    /// Since when the kernel state holds (the condition's lastTransitionTime).
    pub since: Option<String>,
    pub last_exit: Option<LastExit>,
    pub restarts: i32,
    pub terminating: bool,
    /// The version of sked's agent in the pod: its image's tag, or digest (a `helm upgrade`
    /// to a new agent rolls through the nodes like any revision).
    pub agent: Option<String>,
}

#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LastExit {
    pub reason: String,
    pub time: String,
}

/// A Scheduler's line above its rows, in the words of `kubectl get schedulers`.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub scheduler: String,
    pub kernel_attached: i32,
    pub desired: i32,
    pub up_to_date: i32,
    pub ready: i32,
    pub phase: Option<String>,
}

impl Summary {
    pub fn of(s: &Scheduler) -> Self {
        let st = s.status.clone().unwrap_or_default();
        let rollout = st.rollout.as_ref();
        Summary {
            scheduler: s.name_any(),
            kernel_attached: st.kernel_attached,
            desired: st.desired_number_scheduled,
            up_to_date: st.updated_number_scheduled,
            ready: st.number_ready,
            phase: rollout.map(|r| r.phase.as_str().to_owned()),
        }
    }

    pub fn line(&self) -> String {
        format!(
            "{}: KERNEL-ATTACHED {}/{}  UP-TO-DATE {}  READY {}  PHASE {}",
            self.scheduler,
            self.kernel_attached,
            self.desired,
            self.up_to_date,
            self.ready,
            self.phase.as_deref().unwrap_or("-")
        )
    }
}

/// A pod's condition as written: reason, message, lastTransitionTime.
struct Written {
    reason: String,
    message: String,
    since: Option<String>,
}

/// The kernel state a pod's condition tells (`None` when sked did not write it), and the
/// condition as written.
fn pod_kernel(pod: &Pod) -> (Option<PodKernel>, Option<Written>) {
    let condition = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == POD_CONDITION));
    let Some(c) = condition else { return (None, None) };
    let reason = c.reason.clone().unwrap_or_default();
    let message = c.message.clone().unwrap_or_default();
    let since = c.last_transition_time.as_ref().map(|t| t.0.to_string());
    (PodKernel::parse(&reason, &message), Some(Written { reason, message, since }))
}

impl Fleet {
    /// Who owns each node by the arbiter's rule, when the Nodes are known.
    pub fn assignment(&self) -> Option<Assignment> {
        let nodes = self.nodes.as_ref()?;
        let claims: Vec<Claim> =
            self.schedulers.iter().filter(|s| s.metadata.deletion_timestamp.is_none()).map(Claim::of).collect();
        let labels = nodes.iter().map(|n| (n.name_any(), n.labels().clone())).collect();
        Some(assign(&claims, &labels))
    }

    fn pods_of<'a>(&'a self, scheduler: &'a str) -> impl Iterator<Item = &'a Pod> + 'a {
        self.pods.iter().filter(move |p| p.labels().get(NAME_LABEL).map(String::as_str) == Some(scheduler))
    }

    /// The rows of one Scheduler: a row per pod, and per selected node without one.
    pub fn status_rows(&self, s: &Scheduler, assignment: Option<&Assignment>) -> Vec<StatusRow> {
        let name = s.name_any();
        let mut rows: Vec<StatusRow> = self.pods_of(&name).map(|p| pod_row(s, p)).collect();
        let with_pod: BTreeSet<String> = rows.iter().map(|r| r.node.clone()).collect();
        if let (Some(placement), Some(nodes)) = (assignment.and_then(|a| a.get(&name)), self.nodes.as_ref()) {
            let owners: BTreeMap<String, Option<&String>> =
                nodes.iter().map(|n| (n.name_any(), n.labels().get(OWNER_LABEL))).collect();
            let owner = |node: &str| owners.get(node).copied().flatten();
            let mut empty = |node: &String, kernel: &str, message: String| {
                if !with_pod.contains(node) {
                    rows.push(StatusRow::empty(&name, node, kernel, message));
                }
            };
            for node in &placement.owned {
                let message = match owner(node) {
                    Some(o) if *o == name => "its pod is not there yet".to_owned(),
                    _ => "runs the kernel's default scheduler until its wave".to_owned(),
                };
                empty(node, "no-pod", message);
            }
            for (node, winner) in &placement.lost {
                empty(node, "not-owned", format!("Scheduler {winner} owns it (older, or same age and first by name)"));
            }
            for node in &placement.unsupported {
                empty(node, "unsupported", "the node's kernel has no sched_ext".to_owned());
            }
        }
        rows.sort_by(|a, b| a.node.cmp(&b.node).then(a.pod.cmp(&b.pod)));
        rows
    }
}

impl StatusRow {
    fn empty(scheduler: &str, node: &str, kernel: &str, message: String) -> Self {
        StatusRow {
            scheduler: scheduler.to_owned(),
            node: node.to_owned(),
            pod: None,
            revision: None,
            revision_role: None,
            ready: None,
            kernel: kernel.to_owned(),
            analysis: None,
            cpu_contract: None,
            reason: None,
            message: Some(message),
            ops: None,
            since: None,
            last_exit: None,
            restarts: 0,
            terminating: false,
            agent: None,
        }
    }

    pub fn attached(&self) -> bool {
        self.kernel == "attached"
    }
}

/// The row of one scheduler pod.
fn pod_row(s: &Scheduler, pod: &Pod) -> StatusRow {
    let facts = SchedulerPod::of(pod);
    let rollout = s.status.as_ref().and_then(|st| st.rollout.as_ref());
    let revision = pod.labels().get(REVISION_LABEL).cloned();
    let role = revision.as_ref().map(|r| {
        let is = |rev: Option<&sked_api::Revision>| rev.is_some_and(|rev| &rev.name == r);
        if is(rollout.and_then(|r| r.current_revision.as_ref())) {
            "current"
        } else if is(rollout.and_then(|r| r.update_revision.as_ref())) {
            "updating"
        } else {
            "other"
        }
    });
    let (state, written) = pod_kernel(pod);
    let node = facts.node.clone().unwrap_or_default();
    let last_exit = match &state {
        Some(PodKernel::Ejected { reason, time, .. }) => Some(LastExit { reason: reason.clone(), time: time.clone() }),
        _ => s
            .status
            .as_ref()
            .and_then(|st| st.last_exit.as_ref())
            .filter(|e| e.node == node)
            .map(|e| LastExit { reason: e.reason.clone(), time: e.time.clone() }),
    };
    let analysis = rollout
        .and_then(|r| r.analysis.as_ref())
        .and_then(|a| a.nodes.iter().find(|n| n.node == node))
        .map(|n| format!("{}: {}", n.verdict.as_str(), n.detail));
    StatusRow {
        scheduler: s.name_any(),
        node,
        pod: Some(facts.name.clone()),
        revision,
        revision_role: role,
        ready: Some(facts.ready_since.is_some()),
        kernel: state.as_ref().map_or("unknown", PodKernel::short).to_owned(),
        analysis,
        cpu_contract: match &state {
            Some(PodKernel::Attached { contract, .. }) if !contract.is_empty() => Some(contract.clone()),
            _ => None,
        },
        reason: written.as_ref().map(|w| w.reason.clone()),
        message: written.as_ref().map(|w| w.message.clone()),
        ops: state.as_ref().and_then(|k| k.ops()).map(str::to_owned),
        since: written.and_then(|w| w.since),
        last_exit,
        restarts: facts.restarts,
        terminating: facts.is_terminating(),
        agent: agent_version(pod),
    }
}

/// The agent container's image tag (or its digest, shortened), as the pod spec names it.
fn agent_version(pod: &Pod) -> Option<String> {
    let image = pod.spec.as_ref()?.containers.iter().find(|c| c.name == AGENT_CONTAINER)?.image.as_deref()?;
    if let Some((_, digest)) = image.split_once('@') {
        return Some(digest.chars().take(19).collect());
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    Some(last.split_once(':').map_or("latest", |(_, tag)| tag).to_owned())
}

/// One Node, as `kubectl sked nodes` shows it.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodeRow {
    pub node: String,
    /// `Ready`, `NotReady` (its Ready condition is False or Unknown, or it is tainted
    /// not-ready or unreachable) or `Registering` (no kubelet has reported on it yet).
    pub status: &'static str,
    /// Why it is not ready, as the Node shows it (its Ready condition's reason and last
    /// heartbeat); `None` when Ready.
    pub not_ready: Option<String>,
    /// `supported`, `unsupported` (with the kernel it was judged on), or `unknown`.
    pub sched_ext: String,
    pub unsupported_kernel: Option<String>,
    /// The Scheduler whose owner label the node carries.
    pub owner: Option<String>,
    /// What the kernel runs, as sked's pod there says: `ours` (the pod's scheduler), `foreign`
    /// (another scheduler), `none`, or `unknown` (no sked pod, or no condition yet).
    pub kernel: &'static str,
    pub ops: Option<String>,
    /// The Schedulers that select the node but lose it to the owner by the arbiter's rule.
    pub conflicts: Vec<String>,
}

impl Fleet {
    pub fn node_rows(&self, assignment: &Assignment) -> Vec<NodeRow> {
        let mut losers: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (scheduler, placement) in assignment {
            for node in placement.lost.keys() {
                losers.entry(node).or_default().push(scheduler.clone());
            }
        }
        // Each node's live sked pod, found once (a fleet has thousands of both).
        let pod_on: BTreeMap<&str, &Pod> = self
            .pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| Some((p.spec.as_ref()?.node_name.as_deref()?, p)))
            .collect();
        let nodes = self.nodes.as_deref().unwrap_or_default();
        nodes
            .iter()
            .map(|n| {
                let name = n.name_any();
                let labels = n.labels();
                let state = pod_on.get(name.as_str()).and_then(|p| pod_kernel(p).0);
                let kernel = match &state {
                    Some(PodKernel::Attached { .. }) => "ours",
                    Some(PodKernel::Foreign { .. }) => "foreign",
                    Some(PodKernel::NotAttached { .. } | PodKernel::Ejected { .. } | PodKernel::Unsupported { .. }) => {
                        "none"
                    }
                    Some(PodKernel::Stale { .. }) | None => "unknown",
                };
                let not_ready = sked_core::nodes::NodeFacts::of(n).not_ready;
                NodeRow {
                    status: match &not_ready {
                        None => "Ready",
                        Some(sked_core::nodes::NotReady::Registering) => "Registering",
                        Some(_) => "NotReady",
                    },
                    not_ready: not_ready.map(|r| r.describe()),
                    sched_ext: labels.get(SCHED_EXT_LABEL).cloned().unwrap_or_else(|| "unknown".to_owned()),
                    unsupported_kernel: labels.get(KERNEL_LABEL).cloned(),
                    owner: labels.get(OWNER_LABEL).cloned(),
                    kernel,
                    ops: state.as_ref().filter(|_| kernel != "none").and_then(|k| k.ops()).map(str::to_owned),
                    conflicts: losers.remove(name.as_str()).unwrap_or_default(),
                    node: name,
                }
            })
            .collect()
    }
}

/// Whether a rollout phase is final: Complete is done, RolledBack and Failed failed.
pub fn finished(phase: RolloutPhase) -> Option<bool> {
    match phase {
        RolloutPhase::Complete => Some(true),
        RolloutPhase::RolledBack | RolloutPhase::Failed => Some(false),
        RolloutPhase::Queued | RolloutPhase::Canary | RolloutPhase::Rolling | RolloutPhase::Paused => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_objects::{node, pod, rolling, scheduler};
    use serde_json::json;

    /// rusty selects pool=a (n1..n5); old, older, selects n5 too.
    fn fleet() -> Fleet {
        let rusty = scheduler("rusty", "2026-12-04T09:00:00Z", json!({"pool": "a"}), rolling("cur", "upd"));
        let old = scheduler("old", "2026-12-01T09:00:00Z", json!({"team": "x"}), json!({}));
        let pool = |extra: serde_json::Value| {
            let mut labels = json!({"pool": "a"});
            if let (Some(l), Some(e)) = (labels.as_object_mut(), extra.as_object()) {
                l.extend(e.clone());
            }
            labels
        };
        Fleet {
            schedulers: vec![rusty, old],
            pods: vec![
                pod("rusty", "n1", "cur", Some(("True", "KernelAttached", "ops rusty_1.0 attached"))),
                pod(
                    "rusty",
                    "n2",
                    "upd",
                    Some(("False", "ForeignScheduler", "the kernel runs another scheduler: ops lavd_1.0")),
                ),
                pod(
                    "rusty",
                    "n6",
                    "zzz",
                    Some((
                        "False",
                        "KernelEjected",
                        "ops rusty_1.0 ejected at 2026-12-04T10:02:00.000Z: runnable task stall",
                    )),
                ),
                pod("old", "n5", "o1", None),
            ],
            nodes: Some(vec![
                node(
                    "n1",
                    pool(json!({"sked.schedkit.io/scheduler": "rusty", "sked.schedkit.io/sched-ext": "supported"})),
                    json!([]),
                ),
                node("n2", pool(json!({"sked.schedkit.io/scheduler": "rusty"})), json!([])),
                node("n3", pool(json!({})), json!([])),
                node(
                    "n4",
                    pool(
                        json!({"sked.schedkit.io/sched-ext": "unsupported", "sked.schedkit.io/sched-ext-kernel": "6.1.0"}),
                    ),
                    json!([]),
                ),
                node("n5", pool(json!({"team": "x", "sked.schedkit.io/scheduler": "old"})), json!([])),
                node("n6", pool(json!({"sked.schedkit.io/scheduler": "rusty"})), json!([])),
            ]),
        }
    }

    #[test]
    fn a_scheduler_s_rows_tell_each_selected_node_s_kernel() {
        let f = fleet();
        let a = f.assignment();
        let rows = f.status_rows(&f.schedulers[0], a.as_ref());
        let seen: Vec<(&str, &str, Option<&str>, Option<&str>)> =
            rows.iter().map(|r| (r.node.as_str(), r.kernel.as_str(), r.revision_role, r.ops.as_deref())).collect();
        assert_eq!(
            seen,
            vec![
                ("n1", "attached", Some("current"), Some("rusty_1.0")),
                ("n2", "foreign", Some("updating"), Some("lavd_1.0")),
                ("n3", "no-pod", None, None),
                ("n4", "unsupported", None, None),
                ("n5", "not-owned", None, None),
                ("n6", "ejected", Some("other"), Some("rusty_1.0")),
            ]
        );
        assert_eq!(rows[0].since.as_deref(), Some("2026-12-04T10:01:00Z"), "since the condition turned");
        assert_eq!(
            rows[5].last_exit,
            Some(LastExit { reason: "runnable task stall".into(), time: "2026-12-04T10:02:00.000Z".into() })
        );
        assert!(rows[4].message.as_deref().is_some_and(|m| m.contains("Scheduler old owns it")));
        assert_eq!((rows[0].restarts, rows[0].ready), (2, Some(true)));
        assert_eq!((rows[0].agent.as_deref(), rows[2].agent.as_deref()), (Some("v0.5.0"), None), "the agent's version");
    }

    #[test]
    fn a_node_s_row_carries_its_pods_cpu_contract_and_the_table_lists_it() {
        let mut f = fleet();
        let contract = "the pods' CPU contract is broken: CPU limits: not enforced (no ops.cgroup_set_bandwidth), \
                        and pods here have CPU limits, pod UID u1 measured over its limit; CPU requests: not enforced \
                        (no ops.cgroup_set_weight), but no pod here has different requests";
        f.pods[0] =
            pod("rusty", "n1", "cur", Some(("True", "KernelAttached", &format!("ops rusty_1.0 attached; {contract}"))));
        let rows = f.status_rows(&f.schedulers[0], f.assignment().as_ref());
        assert_eq!((rows[0].ops.as_deref(), rows[0].cpu_contract.as_deref()), (Some("rusty_1.0"), Some(contract)));
        assert!(rows[1..].iter().all(|r| r.cpu_contract.is_none()));
        let mut out = Vec::new();
        let now = jiff::Timestamp::UNIX_EPOCH;
        crate::render::status_table(&mut out, &Summary::of(&f.schedulers[0]), &rows, false, now).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains(&format!("The pods' CPU contract, by node:\n  n1: {contract}\n")), "{text}");
    }

    #[test]
    fn the_agent_version_is_its_image_tag_or_digest() {
        let with = |image: &str| {
            let pod: Pod = serde_json::from_value(
                serde_json::json!({"spec": {"containers": [{"name": "agent", "image": image}]}}),
            )
            .unwrap_or_default();
            agent_version(&pod)
        };
        assert_eq!(with("registry:5000/sked/agent:v1.2").as_deref(), Some("v1.2"), "not the registry's port");
        assert_eq!(with("sked/agent").as_deref(), Some("latest"));
        assert_eq!(with("sked/agent@sha256:0123456789abcdef0123").as_deref(), Some("sha256:0123456789ab"));
        assert_eq!(agent_version(&Pod::default()), None);
    }

    #[test]
    fn a_node_s_row_carries_its_verdict_in_the_last_bake() {
        let mut f = fleet();
        let mut status = crate::test_objects::rolling("r1", "r2");
        status["observedGeneration"] = serde_json::json!(2);
        status["rollout"]["analysis"] = serde_json::json!({
            "revision": "r2", "verdict": "Failed", "message": "1 of 1 node(s) failed", "time": "2026-12-04T10:03:00Z",
            "nodes": [{"node": "n2", "verdict": "Failed", "detail": "run delay 1.90 ms (control 1.35 ms over 4 nodes; before its switch none)"}],
        });
        f.schedulers[0].status = serde_json::from_value(status).ok();
        let rows = f.status_rows(&f.schedulers[0], None);
        let judged: Vec<(&str, Option<&str>)> = rows.iter().map(|r| (r.node.as_str(), r.analysis.as_deref())).collect();
        assert!(
            judged.contains(&(
                "n2",
                Some("Failed: run delay 1.90 ms (control 1.35 ms over 4 nodes; before its switch none)")
            )),
            "{judged:?}"
        );
        assert!(judged.iter().filter(|(_, a)| a.is_some()).count() == 1);
        let (line, _) = crate::rollout::progress(&f.schedulers[0]);
        assert!(line.ends_with("; analysis of the last bake: Failed (1 of 1 node(s) failed)"), "{line}");
    }

    #[test]
    fn without_nodes_only_pods_make_rows() {
        let mut f = fleet();
        f.nodes = None;
        let rows = f.status_rows(&f.schedulers[0], f.assignment().as_ref());
        assert_eq!(rows.iter().map(|r| r.node.as_str()).collect::<Vec<_>>(), ["n1", "n2", "n6"]);
    }

    #[test]
    fn the_summary_reads_like_kubectl_get_schedulers() {
        let f = fleet();
        assert_eq!(
            Summary::of(&f.schedulers[0]).line(),
            "rusty: KERNEL-ATTACHED 1/3  UP-TO-DATE 1  READY 3  PHASE Rolling"
        );
    }

    #[test]
    fn every_node_tells_support_owner_kernel_and_conflicts() {
        let f = fleet();
        let a = f.assignment().unwrap_or_default();
        let rows = f.node_rows(&a);
        let seen: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{} {} {} {} {}",
                    r.node,
                    r.sched_ext,
                    r.owner.as_deref().unwrap_or("-"),
                    r.kernel,
                    r.conflicts.join(",")
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                "n1 supported rusty ours ",
                "n2 unknown rusty foreign ",
                "n3 unknown - unknown ",
                "n4 unsupported - unknown ",
                "n5 unknown old unknown rusty",
                "n6 unknown rusty none ",
            ]
        );
        assert_eq!(rows[3].unsupported_kernel.as_deref(), Some("6.1.0"));
        assert_eq!(rows[1].ops.as_deref(), Some("lavd_1.0"));
    }

    #[test]
    fn only_complete_succeeds_and_only_a_rollback_fails() {
        assert_eq!(finished(RolloutPhase::Complete), Some(true));
        assert_eq!(finished(RolloutPhase::RolledBack), Some(false));
        assert_eq!(finished(RolloutPhase::Failed), Some(false));
        assert_eq!(finished(RolloutPhase::Paused), None);
    }
}
