//! The Node's `sked.schedkit.io/scheduler` label says which Scheduler's DaemonSet runs a pod
//! there (the DaemonSets select it, so ownership never enters a pod template). Two writers:
//! - a Scheduler's rollout sets it on the nodes that Scheduler owns, in its waves (a first
//!   deployment and a takeover are switches like any other), and removes it from the nodes a
//!   failed first revision reached (see `rollout`);
//! - this loop removes it at once from a node no Scheduler selects any more (the Scheduler was
//!   deleted, or the node left its selector): the user asked for that node back.
//!
//! The label is the only thing sked writes on a Node (a merge patch of that one label); the
//! chart's ValidatingAdmissionPolicy holds the controller to it. Writes happen only while
//! leading, and only what differs, so an idle cluster costs no write.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use tracing::{info, warn};

use crate::index::Index;
use sked_core::workload::OWNER_LABEL;

/// Node writes in flight at once.
const CONCURRENT_WRITES: usize = 8;
/// A label written this recently is not written again before the Node watch shows it.
const ECHO_WAIT: Duration = Duration::from_secs(10);

/// Runs until the leadership channel closes.
pub(crate) async fn keep_owner_labels(client: Client, index: Index, leader: crate::leader::Leader) {
    let mut changes = leader.receiver();
    let nodes: Api<Node> = Api::all(client);
    let mut written: HashMap<String, (Option<String>, Instant)> = HashMap::new();
    let mut retry = Duration::from_millis(500);
    loop {
        changes.borrow_and_update();
        if !leader.leading() {
            written.clear();
            if changes.changed().await.is_err() {
                return;
            }
            continue;
        }
        let drift: Vec<(String, Option<String>)> = index
            .orphaned_owner_labels()
            .into_iter()
            .map(|node| (node, None))
            .filter(|(node, owner)| {
                written.get(node).is_none_or(|(value, at)| value != owner || at.elapsed() >= ECHO_WAIT)
            })
            .collect();
        let leading = leader.clone();
        let results: Vec<(String, Option<String>, Result<(), kube::Error>)> = futures::stream::iter(drift)
            .map(|(node, owner)| {
                let (nodes, leading) = (nodes.clone(), leading.clone());
                async move {
                    if !leading.leading() {
                        return (node, owner, Ok(()));
                    }
                    let result = write_label(&nodes, &node, owner.as_deref()).await.map(|_| ());
                    (node, owner, result)
                }
            })
            .buffer_unordered(CONCURRENT_WRITES)
            .collect()
            .await;
        let mut failed = false;
        for (node, owner, result) in results {
            match result {
                Ok(()) => {
                    info!(node = %node, owner = owner.as_deref().unwrap_or("-"), "node owner label set");
                    written.insert(node, (owner, Instant::now()));
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    failed = true;
                    warn!(node = %node, err = %e, "could not write the node's owner label; retrying");
                }
            }
        }
        written.retain(|_, (_, at)| at.elapsed() < ECHO_WAIT);
        let wait = if failed {
            retry = (retry * 2).min(Duration::from_secs(30));
            Some(retry)
        } else {
            retry = Duration::from_millis(500);
            // Woken again once an echo is due, in case the watch never shows the write.
            (!written.is_empty()).then_some(ECHO_WAIT)
        };
        tokio::select! {
            () = index.ownership_changed() => {}
            changed = changes.changed() => if changed.is_err() { return },
            () = async { match wait { Some(d) => tokio::time::sleep(d).await, None => std::future::pending().await } } => {}
        }
    }
}

/// Sets (or, with `None`, removes) the owner label of `node`; returns the Node's resourceVersion
/// after the write, when it is a number (the watch has caught up with the write once it shows
/// one as new).
pub(crate) async fn write_label(
    nodes: &Api<Node>,
    node: &str,
    owner: Option<&str>,
) -> Result<Option<u64>, kube::Error> {
    let patch = json!({ "metadata": { "labels": { OWNER_LABEL: owner } } });
    let written = nodes.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(written.metadata.resource_version.and_then(|v| v.parse().ok()))
}
