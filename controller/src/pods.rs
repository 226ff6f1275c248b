//! Facts read off a scheduler pod, shared by the index (what triggers a reconcile) and the
//! rollout (what a node's pod tells).

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::workload::{REVISION_LABEL, SCHEDULER_CONTAINER};

/// Since when (seconds since the epoch) the pod's Ready condition is True.
pub(crate) fn ready_since(p: &Pod) -> Option<i64> {
    let c = p.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready" && c.status == "True")?;
    Some(c.last_transition_time.as_ref().map_or(0, |t| t.0.as_second()))
}

/// How often the scheduler container restarted, and whether it waits in CrashLoopBackOff.
pub(crate) fn scheduler_restarts(p: &Pod) -> (i32, bool) {
    let Some(status) = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == SCHEDULER_CONTAINER))
    else {
        return (0, false);
    };
    let backing_off = status
        .state
        .as_ref()
        .and_then(|s| s.waiting.as_ref())
        .is_some_and(|w| w.reason.as_deref() == Some("CrashLoopBackOff"));
    (status.restart_count, backing_off)
}

/// The node the pod is bound to.
pub(crate) fn node(p: &Pod) -> Option<&str> {
    p.spec.as_ref()?.node_name.as_deref()
}

/// The revision a pod runs: its revision label. A pod made by a sked version before revisions
/// has none; it counts as `current` (adopted, so upgrading sked restarts nothing) when its
/// scheduler container runs the same image and arguments as `current` would, else as a revision
/// of its own.
pub(crate) fn revision(p: &Pod, current: &str, image: &str, args: &[String]) -> String {
    if let Some(r) = p.labels().get(REVISION_LABEL) {
        return r.clone();
    }
    let scx = p.spec.as_ref().and_then(|s| s.containers.iter().find(|c| c.name == SCHEDULER_CONTAINER));
    let same = scx.is_some_and(|c| c.image.as_deref() == Some(image) && c.args.as_deref().unwrap_or_default() == args);
    if same { current.to_owned() } else { "unlabelled".to_owned() }
}
