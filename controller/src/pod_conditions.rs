//! Writes each scheduler pod's `sked.schedkit.io/KernelAttached` condition, as a reconcile's
//! plan decided it (`sked_core::plan`, from `sked_core::pod_conditions`): only where the pod does
//! not say so already, so a fleet at rest costs no write. Each write is fenced like every other (this
//! replica must lead) and bounded per reconcile: a fleet-wide change is written over a few
//! reconciles, which the reconcile rate limit paces, not in one burst.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tracing::{debug, warn};

use crate::api::pod_kernel::POD_CONDITION;
use crate::context::Context;
use crate::mutex::lock;
use sked_core::plan::{PodConditionWrite, SentCondition};
use sked_core::pods::{KernelCondition, SchedulerPod};
use sked_core::workload::FIELD_MANAGER;

/// Pod condition writes in flight at once.
const CONCURRENT_WRITES: usize = 16;
/// How soon a reconcile that had a write fail looks again.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// Writes the KernelAttached conditions a reconcile's plan decided on the pods of `scheduler`
/// (`pods`, as the reconcile read them). Returns when to look again if a write failed.
pub(crate) async fn write(
    ctx: &Context,
    scheduler: &str,
    pods: &[Arc<SchedulerPod>],
    writes: &[PodConditionWrite],
) -> Option<Duration> {
    let live: HashMap<&str, Option<&KernelCondition>> =
        pods.iter().map(|p| (p.uid.as_str(), p.kernel.as_ref())).collect();
    // Remembered before the writes: the watch may show one before its response comes, and it
    // is that write's echo then (see `sked_core::plan::echo`). Put back if it fails.
    let mut before: HashMap<String, Option<SentCondition>> = HashMap::new();
    {
        let mut memo = lock(&ctx.memo.pod_conditions);
        let sent = memo.entry(scheduler.to_owned()).or_default();
        // What the watch has shown, or what is gone, is no longer in flight.
        sent.retain(|uid, (condition, _)| live.get(uid.as_str()).is_some_and(|kernel| *kernel != Some(condition)));
        for w in writes {
            before.insert(w.uid.clone(), sent.insert(w.uid.clone(), (w.condition.clone(), w.observed.clone())));
        }
    }
    if writes.is_empty() {
        return None;
    }
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.settings.namespace);
    let results: Vec<(PodConditionWrite, bool)> = futures::stream::iter(writes.iter().cloned())
        .map(|w| {
            let api = api.clone();
            async move {
                let ok = write_one(ctx, &api, &w).await;
                (w, ok)
            }
        })
        .buffer_unordered(CONCURRENT_WRITES)
        .collect()
        .await;
    let mut memo = lock(&ctx.memo.pod_conditions);
    let sent = memo.entry(scheduler.to_owned()).or_default();
    let mut retry = None;
    for (w, ok) in results {
        if !ok {
            match before.remove(&w.uid).flatten() {
                Some(earlier) => sent.insert(w.uid.clone(), earlier),
                None => sent.remove(&w.uid),
            };
            retry = Some(RETRY_AFTER);
        }
    }
    retry
}

/// Writes one pod's condition (a strategic merge: the kubelet's conditions stay as they are),
/// on the pod of that uid only. Whether it was written (a pod gone meanwhile counts as done).
async fn write_one(ctx: &Context, api: &Api<Pod>, w: &PodConditionWrite) -> bool {
    if !ctx.leading() {
        return false;
    }
    let since = jiff::Timestamp::from_second(w.condition.since).unwrap_or_else(|_| jiff::Timestamp::now());
    let body = json!({
        "metadata": { "uid": w.uid },
        "status": { "conditions": [{
            "type": POD_CONDITION,
            "status": w.condition.status,
            "reason": w.condition.reason,
            "message": w.condition.message,
            "lastTransitionTime": since.to_string(),
        }]},
    });
    crate::throttle::before_late_write(&ctx.limiter).await;
    // A strategic merge patch, not an apply: the manager is named, nothing is owned.
    let params = PatchParams { field_manager: Some(FIELD_MANAGER.to_owned()), ..PatchParams::default() };
    match api.patch_status(&w.pod, &params, &Patch::Strategic(&body)).await {
        Ok(_) => {
            debug!(pod = %w.pod, reason = %w.condition.reason, "pod condition written");
            true
        }
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => true,
        Err(e) => {
            warn!(pod = %w.pod, err = %e, "could not write the pod's KernelAttached condition; retried shortly");
            false
        }
    }
}
