//! Writes each scheduler pod's `sked.schedkit.io/KernelAttached` condition: what its node's
//! agent reported (decided by `sked_core::pod_conditions`), only where the pod does not say so
//! already, so a fleet at rest costs no write. Each write is fenced like every other (this
//! replica must lead) and bounded per reconcile: a fleet-wide change is written over a few
//! reconciles, which the reconcile rate limit paces, not in one burst.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tracing::{debug, warn};

use crate::api::pod_kernel::POD_CONDITION;
use crate::context::Context;
use crate::kernel_table::NodeReport;
use crate::memo::SentCondition;
use crate::mutex::lock;
use sked_core::pods::{KernelCondition, SchedulerPod};
use sked_core::workload::FIELD_MANAGER;

/// Most pod conditions one reconcile writes; the rest go in the next one, soon after.
pub(crate) const MAX_WRITES_PER_RECONCILE: usize = 500;
/// Pod condition writes in flight at once.
const CONCURRENT_WRITES: usize = 16;
/// How soon a reconcile that left writes over (or had one fail) looks again.
const MORE_AFTER: Duration = Duration::from_secs(1);
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// One condition to write.
struct Write {
    pod: String,
    uid: String,
    condition: KernelCondition,
    observed: Option<KernelCondition>,
}

/// Brings the KernelAttached condition of every pod of `scheduler` up to date with `reports`
/// (what the reconcile read of the kernel table). `grace_over`: a new leader's grace for agents to report has passed, so a pod whose
/// agent is silent may be called stale. Returns when to look again: writes left over or
/// failed, or a silent pod not old enough to judge yet.
pub(crate) async fn sync(
    ctx: &Context,
    scheduler: &str,
    reports: &HashMap<String, NodeReport>,
    grace_over: bool,
) -> Option<Duration> {
    let pods = ctx.index.pods_of(scheduler);
    let (mut writes, mut recheck) = decide(ctx, scheduler, &pods, reports, grace_over);
    if writes.len() > MAX_WRITES_PER_RECONCILE {
        debug!(pending = writes.len(), "more pod conditions to write than one reconcile writes");
        writes.truncate(MAX_WRITES_PER_RECONCILE);
        recheck = Some(recheck.map_or(MORE_AFTER, |r| r.min(MORE_AFTER)));
    }
    let live: HashMap<String, Option<KernelCondition>> =
        pods.iter().map(|p| (p.uid.clone(), p.kernel.clone())).collect();
    // Remembered before the writes: the watch may show one before its response comes, and it
    // is that write's echo then (see `Memo::is_own_pod_condition`). Put back if it fails.
    let mut before: HashMap<String, Option<SentCondition>> = HashMap::new();
    {
        let mut memo = lock(&ctx.memo.pod_conditions);
        let sent = memo.entry(scheduler.to_owned()).or_default();
        // What the watch has shown, or what is gone, is no longer in flight.
        sent.retain(|uid, (condition, _)| live.get(uid).is_some_and(|kernel| kernel.as_ref() != Some(condition)));
        for w in &writes {
            before.insert(w.uid.clone(), sent.insert(w.uid.clone(), (w.condition.clone(), w.observed.clone())));
        }
    }
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.settings.namespace);
    let results: Vec<(Write, bool)> = futures::stream::iter(writes)
        .map(|w| {
            let api = api.clone();
            async move {
                let ok = write(ctx, &api, &w).await;
                (w, ok)
            }
        })
        .buffer_unordered(CONCURRENT_WRITES)
        .collect()
        .await;
    let mut memo = lock(&ctx.memo.pod_conditions);
    let sent = memo.entry(scheduler.to_owned()).or_default();
    for (w, ok) in results {
        if !ok {
            match before.remove(&w.uid).flatten() {
                Some(earlier) => sent.insert(w.uid, earlier),
                None => sent.remove(&w.uid),
            };
            recheck = Some(recheck.map_or(RETRY_AFTER, |r| r.min(RETRY_AFTER)));
        }
    }
    recheck
}

/// The conditions to write, and when a silent pod will be old enough to judge.
fn decide(
    ctx: &Context,
    scheduler: &str,
    pods: &[std::sync::Arc<SchedulerPod>],
    reports: &HashMap<String, NodeReport>,
    grace_over: bool,
) -> (Vec<Write>, Option<Duration>) {
    let stale_after = ctx.flags.report_stale_after;
    let now = Instant::now();
    let wall = jiff::Timestamp::now().as_second();
    let memo = lock(&ctx.memo.pod_conditions);
    let sent = memo.get(scheduler);
    let mut recheck: Option<Duration> = None;
    let writes = pods
        .iter()
        .filter_map(|pod| {
            let report = pod.node.as_ref().and_then(|n| reports.get(n));
            let reported = report.is_some_and(|r| r.pod == pod.name);
            let age = pod.created.map_or(0, |c| wall.saturating_sub(c).max(0).cast_unsigned());
            let old_enough = Duration::from_secs(age) > stale_after;
            if grace_over && !old_enough && !reported && pod.started && !pod.is_terminating() {
                let due = stale_after.saturating_sub(Duration::from_secs(age)) + MORE_AFTER;
                recheck = Some(recheck.map_or(due, |r| r.min(due)));
            }
            let want = sked_core::pod_conditions::desired(pod, report, now, stale_after, grace_over && old_enough)?;
            let written = sent.and_then(|s| s.get(&pod.uid));
            let condition = sked_core::pod_conditions::to_write(pod.kernel.as_ref(), &want, written, wall)?;
            Some(Write { pod: pod.name.clone(), uid: pod.uid.clone(), condition, observed: pod.kernel.clone() })
        })
        .collect();
    (writes, recheck)
}

/// Writes one pod's condition (a strategic merge: the kubelet's conditions stay as they are),
/// on the pod of that uid only. Whether it was written (a pod gone meanwhile counts as done).
async fn write(ctx: &Context, api: &Api<Pod>, w: &Write) -> bool {
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
