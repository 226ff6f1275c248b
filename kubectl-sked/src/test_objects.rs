//! Schedulers, pods and Nodes as the API server returns them, for the unit tests.

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};
use sked_api::Scheduler;

pub fn scheduler(name: &str, created: &str, selector: Value, status: Value) -> Scheduler {
    serde_json::from_value(json!({
        "apiVersion": "sked.schedkit.io/v1", "kind": "Scheduler",
        "metadata": {"name": name, "uid": format!("uid-{name}"), "creationTimestamp": created, "generation": 2},
        "spec": {"sched": "ghcr.io/schedkit/scx_rusty:v1", "nodeSelector": selector},
        "status": status,
    }))
    .unwrap_or_default()
}

/// A Ready pod of `scheduler` on `node`, at `revision`, with a KernelAttached condition
/// (`reason`, `message`) when given.
pub fn pod(scheduler: &str, node: &str, revision: &str, condition: Option<(&str, &str, &str)>) -> Pod {
    let mut conditions = vec![json!({"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-04T10:00:00Z"})];
    if let Some((status, reason, message)) = condition {
        conditions.push(json!({
            "type": "sked.schedkit.io/KernelAttached", "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-12-04T10:01:00Z",
        }));
    }
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("{scheduler}-{node}"), "uid": format!("uid-{scheduler}-{node}"),
            "labels": {"name": scheduler, "app.kubernetes.io/managed-by": "sked", "sked.schedkit.io/revision": revision},
        },
        "spec": {"nodeName": node, "containers": [{"name": "scx", "image": "i"}, {"name": "agent", "image": "ghcr.io/schedkit/sked-agent:v0.5.0"}]},
        "status": {"phase": "Running", "conditions": conditions,
                   "containerStatuses": [{"name": "scx", "ready": true, "restartCount": 2, "image": "i", "imageID": "x"}]},
    }))
    .unwrap_or_default()
}

pub fn node(name: &str, labels: Value, taints: Value) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints},
        "status": {"nodeInfo": {"kernelVersion": "6.12.9", "architecture": "amd64", "bootID": "", "containerRuntimeVersion": "",
            "kubeProxyVersion": "", "kubeletVersion": "", "machineID": "", "operatingSystem": "linux", "osImage": "", "systemUUID": ""},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
    }))
    .unwrap_or_default()
}

/// A status with a rollout whose current revision is `current` and update revision `update`.
pub fn rolling(current: &str, update: &str) -> Value {
    json!({
        "desiredNumberScheduled": 3, "kernelAttached": 1, "numberReady": 3, "updatedNumberScheduled": 1,
        "rollout": {
            "phase": "Rolling",
            "currentRevision": {"name": current, "image": "r@sha256:1", "generation": 1},
            "updateRevision": {"name": update, "image": "r@sha256:2", "generation": 2},
        },
    })
}
