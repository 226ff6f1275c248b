//! What sked reads off a Node, taken once when the Node is seen: when it was created, whether it
//! can run a pod now (Ready, reachable) and the taints that keep pods away. The index keeps
//! these facts, not the Node (a whole Node, with its images and managed fields, is tens of KiB).
//! The rollout reads them: a node no pod can run on is skipped, not waited for.

use k8s_openapi::api::core::v1::{Node, Taint, Toleration};
use kube_core::ResourceExt;

/// The taint the node lifecycle controller puts on a Node it cannot reach.
const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// The taint it puts on a Node whose kubelet says it is not Ready.
const NOT_READY: &str = "node.kubernetes.io/not-ready";

/// The taints every DaemonSet pod tolerates, by key and effect: the DaemonSet controller adds
/// these tolerations to the pods it makes (`NoSchedule` for pressure and cordoning; it adds
/// `NoExecute` for `not-ready` and `unreachable` too, which [`HEALTH_TAINTS`] covers).
const DAEMONSET_TOLERATED: [(&str, &str); 4] = [
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
];

/// Most taints kept of one Node.
const MAX_TAINTS: usize = 16;

/// The facts of one Node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeFacts {
    /// `creationTimestamp`, seconds since the epoch.
    pub created: Option<i64>,
    /// Why no pod can run on it now, if its kubelet is not known to be ready (see [`NotReady`]).
    pub not_ready: Option<NotReady>,
    /// Its `NoSchedule` and `NoExecute` taints (those that keep a pod away), at most
    /// `MAX_TAINTS` (16).
    pub taints: Vec<Taint>,
}

/// How a Node shows that its kubelet cannot run a pod now: each is the node's trouble, never a
/// revision's, and no toleration changes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotReady {
    /// No Ready condition at all: no kubelet has reported on it yet (a Node still registering,
    /// or one made by hand).
    Registering,
    /// Its Ready condition is False or Unknown: the kubelet says so, or stopped posting.
    Condition {
        /// `False` or `Unknown`.
        status: String,
        /// The condition's reason and message (escaped and capped), e.g. "NodeStatusUnknown:
        /// Kubelet stopped posting node status.".
        said: String,
        /// Its `lastHeartbeatTime`, seconds since the epoch.
        heartbeat: Option<i64>,
    },
    /// Tainted `not-ready` (a new Node, until the node lifecycle controller lifts it; or with
    /// `NoExecute`, one it lost) or `unreachable`, though its Ready condition says True.
    Tainted { key: String },
}

impl NotReady {
    /// One line for a person: what the Node shows.
    pub fn describe(&self) -> String {
        match self {
            NotReady::Registering => "it has no Ready condition yet: no kubelet has reported on it".to_owned(),
            NotReady::Condition { status, said, heartbeat } => {
                let said = if said.is_empty() { String::new() } else { format!(" ({said})") };
                let beat = heartbeat
                    .and_then(|t| jiff::Timestamp::from_second(t).ok())
                    .map(|t| format!("; its kubelet's last heartbeat was at {t}"))
                    .unwrap_or_default();
                format!("its Ready condition is {status}{said}{beat}")
            }
            NotReady::Tainted { key } => format!("it is tainted {key}, set while a node is not ready or unreachable"),
        }
    }
}

/// Most characters kept of a Ready condition's reason and message.
const MAX_SAID_CHARS: usize = 200;

impl NodeFacts {
    pub fn of(node: &Node) -> Self {
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
        let taints: Vec<Taint> = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
            .take(MAX_TAINTS)
            .cloned()
            .collect();
        // Any effect: a new Node's `not-ready:NoSchedule` keeps DaemonSet pods away until its
        // kubelet is ready; `NoExecute` is how the node lifecycle controller marks one it lost.
        let tainted_down = taints.iter().find(|t| HEALTH_TAINTS.contains(&t.key.as_str()));
        let not_ready = match ready {
            None => Some(NotReady::Registering),
            Some(c) if c.status != "True" => Some(NotReady::Condition {
                status: sked_proto::text::escape_and_cap(&c.status, sked_proto::text::MAX_NAME_CHARS),
                said: crate::conditions::said(c.reason.as_deref(), c.message.as_deref(), MAX_SAID_CHARS),
                heartbeat: c.last_heartbeat_time.as_ref().map(|t| t.0.as_second()),
            }),
            Some(_) => tainted_down.map(|t| NotReady::Tainted { key: t.key.clone() }),
        };
        Self { created: node.creation_timestamp().map(|t| t.0.as_second()), not_ready, taints }
    }

    /// Whether no pod can run on it now because of its own state (see [`NotReady`]).
    pub fn down(&self) -> bool {
        self.not_ready.is_some()
    }

    /// The first taint that keeps a pod with `tolerations` (and a DaemonSet pod's own) away.
    pub fn untolerated<'a>(&'a self, tolerations: &[Toleration]) -> Option<&'a Taint> {
        self.taints.iter().find(|t| keeps_away(t, tolerations))
    }

    /// Every taint that keeps a pod with `tolerations` (and a DaemonSet pod's own) away.
    pub fn all_untolerated(&self, tolerations: &[Toleration]) -> Vec<&Taint> {
        self.taints.iter().filter(|t| keeps_away(t, tolerations)).collect()
    }
}

/// Whether `taint` keeps away a DaemonSet pod with `tolerations`. The node-health taints
/// (`not-ready`, `unreachable`) are not counted: they tell that the node is down, which
/// [`NodeFacts::not_ready`] says, and tolerating them would not make its kubelet run a pod.
fn keeps_away(taint: &Taint, tolerations: &[Toleration]) -> bool {
    !HEALTH_TAINTS.contains(&taint.key.as_str())
        && !DAEMONSET_TOLERATED.contains(&(taint.key.as_str(), taint.effect.as_str()))
        && !tolerations.iter().any(|tol| tolerates(tol, taint))
}

/// The taints the node lifecycle controller (and the API server, on a new Node) set while a
/// node is not ready or unreachable.
const HEALTH_TAINTS: [&str; 2] = [NOT_READY, UNREACHABLE];

/// A taint as `kubectl describe node` shows it: `key=value:Effect`.
pub fn describe_taint(t: &Taint) -> String {
    let key = sked_proto::text::escape_and_cap(&t.key, sked_proto::text::MAX_NAME_CHARS);
    match t.value.as_deref().filter(|v| !v.is_empty()) {
        Some(v) => {
            format!("{key}={}:{}", sked_proto::text::escape_and_cap(v, sked_proto::text::MAX_NAME_CHARS), t.effect)
        }
        None => format!("{key}:{}", t.effect),
    }
}

/// Whether `tol` tolerates `taint`, as the API defines it: an empty key with `Exists` matches
/// every taint; otherwise the keys match, and `Exists` ignores the value while `Equal` (the
/// default) compares it; an empty effect matches every effect.
fn tolerates(tol: &Toleration, taint: &Taint) -> bool {
    let effect = tol.effect.as_deref().is_none_or(|e| e.is_empty() || e == taint.effect);
    let exists = tol.operator.as_deref() == Some("Exists");
    let key = tol.key.as_deref().unwrap_or_default();
    if key.is_empty() {
        return exists && effect;
    }
    let value = exists || tol.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default();
    key == taint.key && value && effect
}

/// A Node as the index keeps it while a watch lists it: what [`NodeFacts::of`] and the
/// arbiter read (name, labels, creation time, Ready condition, taints); the rest is dropped.
pub fn slim(node: &mut Node) {
    node.metadata.managed_fields = None;
    node.metadata.annotations = None;
    node.metadata.owner_references = None;
    if let Some(spec) = node.spec.as_mut() {
        *spec = k8s_openapi::api::core::v1::NodeSpec { taints: spec.taints.take(), ..Default::default() };
    }
    if let Some(status) = node.status.as_mut() {
        let ready = status.conditions.take().into_iter().flatten().filter(|c| c.type_ == "Ready").collect();
        *status = k8s_openapi::api::core::v1::NodeStatus { conditions: Some(ready), ..Default::default() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(value: serde_json::Value) -> Node {
        serde_json::from_value(value).unwrap()
    }

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint { key: key.into(), value: value.map(Into::into), effect: effect.into(), time_added: None }
    }

    fn toleration(key: &str, operator: &str, value: Option<&str>, effect: Option<&str>) -> Toleration {
        Toleration {
            key: Some(key.into()),
            operator: Some(operator.into()),
            value: value.map(Into::into),
            effect: effect.map(Into::into),
            toleration_seconds: None,
        }
    }

    #[test]
    fn a_node_is_down_when_its_kubelet_says_not_ready_never_reported_or_it_is_tainted_so() {
        let ready = |status: &str| {
            node(json!({"metadata": {"name": "n", "creationTimestamp": "2026-12-01T10:00:00Z"},
                "status": {"conditions": [{"type": "Ready", "status": status, "reason": "KubeletNotReady",
                    "message": "container runtime is down", "lastHeartbeatTime": "2026-12-01T10:05:00Z"}]}}))
        };
        assert!(!NodeFacts::of(&ready("True")).down());
        assert!(NodeFacts::of(&ready("False")).down());
        assert_eq!(
            NodeFacts::of(&ready("Unknown")).not_ready.map(|n| n.describe()).as_deref(),
            Some(
                "its Ready condition is Unknown (KubeletNotReady: container runtime is down); its kubelet's last heartbeat was at 2026-12-01T10:05:00Z"
            )
        );
        assert_eq!(NodeFacts::of(&ready("True")).created, Some(1_796_119_200));
        // No kubelet ever reported: a Node still registering runs no pod.
        assert_eq!(NodeFacts::of(&node(json!({"metadata": {"name": "n"}}))).not_ready, Some(NotReady::Registering));
        // Ready, yet tainted as the node lifecycle controller marks a node it lost (the
        // NoExecute clause), unreachable, or not ready yet (a new Node's NoSchedule).
        for (key, effect) in [(NOT_READY, "NoExecute"), (UNREACHABLE, "NoExecute"), (NOT_READY, "NoSchedule")] {
            let mut n = ready("True");
            n.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
                taints: Some(vec![taint(key, None, effect)]),
                ..Default::default()
            });
            let facts = NodeFacts::of(&n);
            assert_eq!(facts.not_ready, Some(NotReady::Tainted { key: key.into() }), "{key}:{effect}");
            assert!(
                facts.all_untolerated(&[]).is_empty(),
                "a health taint is no toleration's business: {key}:{effect}"
            );
        }
        // A pressure taint on a Ready node: not down (DaemonSet pods tolerate it).
        let mut pressure = ready("True");
        pressure.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            taints: Some(vec![taint("node.kubernetes.io/memory-pressure", None, "NoSchedule")]),
            ..Default::default()
        });
        assert!(!NodeFacts::of(&pressure).down() && NodeFacts::of(&pressure).untolerated(&[]).is_none());
    }

    #[test]
    fn taints_that_keep_pods_away_are_matched_as_the_api_defines() {
        let facts = NodeFacts {
            taints: vec![taint(NOT_READY, None, "NoExecute"), taint("dedicated", Some("batch"), "NoSchedule")],
            ..NodeFacts::default()
        };
        let untolerated = facts.untolerated(&[]).map(describe_taint);
        assert_eq!(untolerated.as_deref(), Some("dedicated=batch:NoSchedule"), "DaemonSet pods tolerate not-ready");
        for tolerated in [
            toleration("dedicated", "Equal", Some("batch"), Some("NoSchedule")),
            toleration("dedicated", "Exists", None, None),
            toleration("", "Exists", None, None),
            toleration("dedicated", "Equal", Some("batch"), None),
        ] {
            assert_eq!(facts.untolerated(std::slice::from_ref(&tolerated)), None, "{tolerated:?}");
        }
        for not in [
            toleration("dedicated", "Equal", Some("web"), None),
            toleration("dedicated", "Exists", None, Some("NoExecute")),
            toleration("other", "Exists", None, None),
            toleration("", "Equal", Some("batch"), None),
        ] {
            assert!(facts.untolerated(std::slice::from_ref(&not)).is_some(), "{not:?}");
        }
        let prefer = node(json!({"metadata": {"name": "n"},
            "spec": {"taints": [{"key": "soft", "effect": "PreferNoSchedule"}]}}));
        assert!(NodeFacts::of(&prefer).taints.is_empty(), "PreferNoSchedule keeps no pod away");
    }

    #[test]
    fn a_slim_node_keeps_what_the_index_reads() {
        let mut n = node(json!({
            "metadata": {"name": "n", "labels": {"pool": "a"}, "annotations": {"big": "x"},
                "creationTimestamp": "2026-12-01T10:00:00Z"},
            "spec": {"podCIDR": "10.0.0.0/24", "taints": [{"key": "dedicated", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "False"}],
                "images": [{"names": ["a"], "sizeBytes": 1}]}
        }));
        let before = NodeFacts::of(&n);
        slim(&mut n);
        assert_eq!(NodeFacts::of(&n), before);
        assert_eq!(n.labels().get("pool").map(String::as_str), Some("a"));
        assert!(n.metadata.annotations.is_none() && n.status.as_ref().unwrap().images.is_none());
        assert!(n.spec.as_ref().unwrap().pod_cidr.is_none());
    }
}
