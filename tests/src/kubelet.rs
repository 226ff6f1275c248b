//! Stand-ins for the kubelet: there is none on the test control plane, so the harness makes the
//! moves it would (a Node reporting Ready, pods turning Ready, deleted pods going away).

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::fixture::{Fixture, wait_for};

impl Fixture {
    /// Plays the kubelet for a DaemonSet's pods: marks every pod of `scheduler` Running and
    /// Ready. Returns how many pods it marked.
    pub async fn mark_pods_ready(&self, scheduler: &str) -> Result<usize> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let list = pods.list(&ListParams::default().labels(&format!("name={scheduler}"))).await?;
        for pod in &list.items {
            set_pod_ready(&pods, &pod.name_any(), true).await?;
        }
        Ok(list.items.len())
    }
}

/// Plays the kubelet's readiness report for one pod: Running, and Ready (or not) as of now.
pub async fn set_pod_ready(pods: &Api<Pod>, name: &str, ready: bool) -> Result<()> {
    let now = jiff::Timestamp::now().to_string();
    let status = if ready { "True" } else { "False" };
    let body = json!({"status": {
        "phase": "Running",
        "conditions": [
            {"type": "Ready", "status": status, "lastTransitionTime": now},
            {"type": "ContainersReady", "status": status, "lastTransitionTime": now},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
        ],
    }});
    // A strategic merge, as the kubelet keeps the conditions others own (sked's KernelAttached).
    pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(&body)).await?;
    Ok(())
}

/// Creates a Node and plays its kubelet's first moves: reports it Ready with some capacity
/// (so kube-scheduler places pods on it) and lifts the
/// `node.kubernetes.io/not-ready` taint the API server puts on every new Node (there is no
/// kubelet here, and no node lifecycle controller to do it).
pub async fn create_ready_node(client: &Client, name: &str, labels: &[(&str, &str)]) -> Result<Node> {
    create_registering_node(client, name, labels).await?;
    set_node_ready(client, name, true).await
}

/// Creates a Node as one looks while it registers: its labels and nothing else, no Ready
/// condition (no kubelet has reported on it), the API server's not-ready taint kept.
pub async fn create_registering_node(client: &Client, name: &str, labels: &[(&str, &str)]) -> Result<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    let labels: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": name, "labels": labels },
    }))?;
    nodes.create(&PostParams::default(), &node).await.with_context(|| format!("creating Node {name}"))
}

/// Creates a Ready Node with no room for one more pod (its allocatable pods are 0), as a full
/// node looks to kube-scheduler: a pod made for it stays unbound ("Too many pods").
pub async fn create_full_node(client: &Client, name: &str, labels: &[(&str, &str)]) -> Result<Node> {
    create_registering_node(client, name, labels).await?;
    report_ready(client, name, "True", "0").await?;
    lift_not_ready_taint(client, name).await
}

/// Plays a kubelet that comes up (Ready, with room for pods, the not-ready taint lifted) or one
/// that stops posting (Ready Unknown, as the node lifecycle controller marks it).
pub async fn set_node_ready(client: &Client, name: &str, ready: bool) -> Result<Node> {
    if ready {
        report_ready(client, name, "True", "110").await?;
        lift_not_ready_taint(client, name).await
    } else {
        report_ready(client, name, "Unknown", "110").await
    }
}

/// Writes the Node's Ready condition (`True` from the kubelet, `Unknown` as the node lifecycle
/// controller writes it once the kubelet stopped posting) and its capacity in pods.
async fn report_ready(client: &Client, name: &str, status: &str, pods: &str) -> Result<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    let now = jiff::Timestamp::now().to_string();
    let resources = json!({"cpu": "8", "memory": "16Gi", "pods": pods});
    let (reason, message) = match status {
        "True" => ("KubeletReady", "sked test kubelet"),
        _ => ("NodeStatusUnknown", "Kubelet stopped posting node status."),
    };
    let ready = json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [{
            "type": "Ready", "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }],
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&ready))
        .await
        .with_context(|| format!("reporting Node {name} Ready={status}"))
}

/// Plays the node lifecycle controller (which the test control plane does not run): lifts the
/// `node.kubernetes.io/not-ready` taint the API server puts on a new Node, keeping any other.
pub async fn lift_not_ready_taint(client: &Client, name: &str) -> Result<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    let taints: Vec<serde_json::Value> = nodes
        .get(name)
        .await?
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != "node.kubernetes.io/not-ready")
        .map(|t| json!(t))
        .collect();
    let taints = (!taints.is_empty()).then_some(taints);
    let patch = json!({"spec": {"taints": taints}});
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("lifting the not-ready taint of Node {name}"))
}

/// Plays the kubelet's last move: a pod being deleted is gone once its kubelet confirms, so
/// pods marked for deletion are removed at once (there is no kubelet to do it), except on a
/// node whose real kubelet reports itself (see [`crate::node`]).
pub async fn finish_pod_deletions(client: Client, namespace: String) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let nodes: Api<Node> = Api::all(client);
    let mut stream = watcher(pods.clone(), watcher::Config::default()).default_backoff().applied_objects().boxed();
    // A watch error (the API server restarting) is retried with backoff; the list after it
    // shows every pod again, those still terminating included.
    while let Some(next) = stream.next().await {
        let Ok(pod) = next else { continue };
        if pod.metadata.deletion_timestamp.is_some() {
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            // A real kubelet reports its version; when the Node cannot be read, leave the pod
            // (the watch brings it again) rather than take it from a kubelet.
            let real_kubelet = match node {
                Some(node) => match nodes.get_opt(&node).await {
                    Ok(node) => node.and_then(|n| n.status?.node_info).is_some_and(|i| !i.kubelet_version.is_empty()),
                    Err(_) => true,
                },
                None => false,
            };
            if real_kubelet {
                continue;
            }
            let _ = pods
                .delete(&pod.name_any(), &DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
                .await;
        }
    }
}

/// Waits until `count` live pods of the Scheduler's DaemonSet are bound to nodes; keyed by node.
pub async fn wait_bound_pods(
    client: &Client,
    namespace: &str,
    scheduler: &str,
    count: usize,
) -> Result<BTreeMap<String, Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    wait_for(&format!("{count} pods of {scheduler} bound to nodes"), || {
        let pods = pods.clone();
        async move {
            let list = pods.list(&ListParams::default().labels(&format!("name={scheduler}"))).await?;
            // What a timeout shows: every pod of the Scheduler, bound or not, deleted or not.
            let seen: Vec<String> = list
                .items
                .iter()
                .map(|p| {
                    let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_else(|| "-".into());
                    let deleted = if p.metadata.deletion_timestamp.is_some() { " (deleted)" } else { "" };
                    format!("{} on {node}{deleted}", p.name_any())
                })
                .collect();
            let bound: BTreeMap<String, Pod> = list
                .items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter_map(|p| Some((p.spec.as_ref()?.node_name.clone()?, p)))
                .collect();
            if bound.len() == count {
                return Ok(Some(bound));
            }
            Err(anyhow::anyhow!("pods of {scheduler}: {seen:?}"))
        }
    })
    .await
}
