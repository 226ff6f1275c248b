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
/// these tolerations to the pods it makes (`NoExecute` for a node that is not ready or
/// unreachable, `NoSchedule` for pressure and cordoning). A new Node's `not-ready:NoSchedule`
/// is not among them: no DaemonSet pod goes there before its kubelet is ready.
const DAEMONSET_TOLERATED: [(&str, &str); 6] = [
    (NOT_READY, "NoExecute"),
    (UNREACHABLE, "NoExecute"),
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
    /// Its Ready condition is there and not True, or it is tainted unreachable, or not ready
    /// with `NoExecute` (as the node lifecycle controller marks a Node gone NotReady).
    /// (A Node no kubelet ever reported on has no condition: not known to be down.)
    pub down: bool,
    /// Its `NoSchedule` and `NoExecute` taints (those that keep a pod away), at most
    /// `MAX_TAINTS` (16).
    pub taints: Vec<Taint>,
}

impl NodeFacts {
    pub fn of(node: &Node) -> Self {
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status == "True");
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
        let tainted_down =
            taints.iter().any(|t| t.key == UNREACHABLE || (t.key == NOT_READY && t.effect == "NoExecute"));
        Self {
            created: node.creation_timestamp().map(|t| t.0.as_second()),
            down: ready == Some(false) || tainted_down,
            taints,
        }
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

/// Whether `taint` keeps away a DaemonSet pod with `tolerations`.
fn keeps_away(taint: &Taint, tolerations: &[Toleration]) -> bool {
    !DAEMONSET_TOLERATED.contains(&(taint.key.as_str(), taint.effect.as_str()))
        && !tolerations.iter().any(|tol| tolerates(tol, taint))
}

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
    fn a_node_is_down_when_its_kubelet_says_not_ready_or_it_is_unreachable() {
        let ready = |status: &str| {
            node(json!({"metadata": {"name": "n", "creationTimestamp": "2026-12-01T10:00:00Z"},
                "status": {"conditions": [{"type": "Ready", "status": status}]}}))
        };
        assert!(!NodeFacts::of(&ready("True")).down);
        assert!(NodeFacts::of(&ready("False")).down);
        assert!(NodeFacts::of(&ready("Unknown")).down);
        assert_eq!(NodeFacts::of(&ready("True")).created, Some(1_796_119_200));
        // No kubelet ever reported: not known to be down.
        assert!(!NodeFacts::of(&node(json!({"metadata": {"name": "n"}}))).down);
        let unreachable = node(json!({"metadata": {"name": "n"},
            "spec": {"taints": [{"key": UNREACHABLE, "effect": "NoExecute"}]}}));
        assert!(NodeFacts::of(&unreachable).down);
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
        let fresh = NodeFacts { taints: vec![taint(NOT_READY, None, "NoSchedule")], ..NodeFacts::default() };
        assert!(fresh.untolerated(&[]).is_some(), "no DaemonSet pod goes to a Node whose kubelet is not ready yet");
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
