//! The reconcile of one Scheduler, as observe -> decide -> apply: `observe` reads everything
//! once (the Scheduler and its placement, the image's admission, the DaemonSet, pods, nodes,
//! kernel reports, clocks, this term's memory) into a `sked_core::plan::Snapshot`;
//! [`sked_core::plan`] decides, purely, the DaemonSet's write and then the [`Plan`] (status,
//! events, rollout actions, pod conditions, what to remember, when to look again); `daemonset`
//! and `writes` carry them out, each write fenced by leadership and the rate limit. Startup and
//! leadership are in [`crate::manager`].
//!
//! One reconcile is [`reconcile`] (the rate-limit token, the timeout, leadership, failures)
//! around `reconcile_scheduler`, which reads as those three steps.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::api::{Reason, Scheduler, SchedulerStatus};
use crate::canaries::Settled;
pub use crate::context::Context;
use crate::error::ReconcileError as Error;
use crate::kernel_table as kernel;
use crate::mutex::lock;
use crate::throttle::retry_delay;
use crate::trust::TrustError;
use sked_core::arbiter::Placement;
use sked_core::plan::{self, DaemonSetWrite, Deployed, Plan, Recreate, RolloutActions, Snapshot};
use sked_core::pods::SchedulerPod;
use sked_core::rollout::CanaryClaim;
use sked_core::status::{self, EventKind, EventSpec};
use sked_core::workload::{self, FIELD_MANAGER};

mod admission;
mod daemonset;
mod observe;
mod writes;

use self::admission::*;
use self::daemonset::*;
use self::observe::*;
use self::writes::*;

static RECONCILE_IDS: AtomicU64 = AtomicU64::new(0);

fn reconcile_id() -> String {
    let n = RECONCILE_IDS.fetch_add(1, Ordering::Relaxed);
    let salt = jiff::Timestamp::now().as_nanosecond() as u64;
    format!("{:016x}", salt.rotate_left(17) ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

pub(crate) async fn reconcile(scheduler: Arc<Scheduler>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.leading() {
        // A standby spends no rate-limit tokens; gaining leadership reconciles everything.
        ctx.metrics.timed_recheck(&scheduler.name_any(), false);
        return Ok(Action::await_change());
    }
    let name = scheduler.name_any();
    let span = info_span!("reconcile", controller = "scheduler", scheduler = %name, reconcileID = %reconcile_id());
    let timeout = ctx.flags.reconcile_timeout;
    let started = std::time::Instant::now();
    let mut holds_token = false;
    let result = loop {
        let pass = crate::throttle::reconcile_pass(holds_token, reconcile_scheduler(&name, &ctx));
        let bounded = tokio::time::timeout(timeout, Box::pin(pass.instrument(span.clone())));
        let result = tokio::select! {
            result = bounded => match result {
                Ok(result) => result,
                Err(_) => Err(Error::Timeout { name: name.clone(), timeout }),
            },
            // Leadership lost mid-reconcile: abandon it; the new leader reconciles from scratch.
            () = crate::leader::lost(ctx.leader.clone()) => {
                debug!(parent: &span, "leadership lost; reconcile abandoned");
                Ok(None)
            }
        };
        // Its first write needs a token that comes later: wait (outside the timeout, as a
        // token's wait is the limit's, not the reconcile's), then start over from a fresh read.
        let Err(Error::Throttled(wait)) = result else { break result };
        tokio::select! {
            () = tokio::time::sleep(wait) => holds_token = true,
            () = crate::leader::lost(ctx.leader.clone()) => break Ok(None),
        }
    };
    ctx.metrics.reconciled(started.elapsed(), result.as_ref().err().map(Error::metric_label));
    // A failed reconcile's retry is `error_policy`'s, counted by the errors.
    ctx.metrics.timed_recheck(&name, matches!(result, Ok(Some(_))));
    match &result {
        Ok(_) => {
            lock(&ctx.failures).remove(&name);
        }
        Err(err) => record_failure(&ctx, &scheduler, err).instrument(span).await,
    }
    Ok(match result? {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

/// One reconcile of the Scheduler `name`: observe, decide, apply. Returns when it must be
/// reconciled again if nothing changes (`None`: only an event wakes it).
async fn reconcile_scheduler(name: &str, ctx: &Context) -> Result<Option<Duration>, Error> {
    if !ctx.leading() {
        debug!("not leading; no writes");
        return Ok(None);
    }
    let Some(observed) = Box::pin(observe(ctx, name)).await else {
        release_canary(ctx, name);
        return Ok(None);
    };
    let gate = ctx.canaries.gate(name, |n| ctx.index.snapshot(n).is_some());
    let snapshot = observed.snapshot(&gate);
    // The DaemonSet first: the rollout is judged against the template the API server accepted.
    let write = plan::daemonset(&snapshot)?;
    let Some(deployed) = Box::pin(write_daemonset(ctx, &snapshot, write)).await? else {
        release_canary(ctx, name);
        return Ok(None);
    };
    let mut plan = plan::decide(&snapshot, &deployed);
    if let Settled::Refused(gate) = settle_canary(ctx, name, &plan, Claims::Taken) {
        // Another Scheduler's reconcile took the last slot while this one decided.
        plan = plan::decide(&Snapshot { canary_gate: &gate, ..snapshot }, &deployed);
        settle_canary(ctx, name, &plan, Claims::Taken);
    }
    if !ctx.leading() {
        // Leadership was lost during this reconcile: the new leader writes the status.
        return Ok(None);
    }
    // Look again when a rollout waits for a bake or a deadline, when a new term's grace for the
    // agents ends, when a tag is due to be resolved again, and when pod conditions are left to
    // write; everything else (reports, reports going stale, pods, the DaemonSet) is an event.
    let given_up = || {
        settle_canary(ctx, name, &plan, Claims::GivenUp);
    };
    let recheck = Box::pin(carry_out(ctx, &snapshot, &deployed, &plan, given_up)).await?;
    match observed.refusal {
        // Retried with backoff by `error_policy`; the Warning event already says why.
        Some(source) => Err(Error::Image { name: name.to_owned(), source }),
        None => Ok(recheck),
    }
}

/// Which claims on the canary slots [`settle_canary`] records.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Claims {
    /// A slot taken or kept (a canary starts or runs): recorded before the plan is carried out.
    Taken,
    /// No slot (a slot given up, a wait for one): recorded once the plan's status is saved, so
    /// a slot comes free only when the status no longer shows the canary, and the next
    /// Scheduler's canary never shows beside it.
    GivenUp,
}

/// Records what `plan` does with the Scheduler's canary slot, if its claim is of the kind
/// `claims`.
fn settle_canary(ctx: &Context, name: &str, plan: &Plan, claims: Claims) -> Settled {
    let (claim, queued) = plan
        .rollout
        .as_ref()
        .map_or((CanaryClaim::None, false), |r| (r.canary, r.status.phase == crate::api::RolloutPhase::Queued));
    if (claim == CanaryClaim::None) != (claims == Claims::GivenUp) {
        return Settled::Kept;
    }
    let settled = ctx.canaries.settle(name, claim, queued);
    ctx.metrics.set_canaries(ctx.canaries.counts());
    settled
}

/// The Scheduler `name` is gone or has no rollout: it holds no canary slot.
fn release_canary(ctx: &Context, name: &str) {
    ctx.canaries.release(name);
    ctx.metrics.set_canaries(ctx.canaries.counts());
}

/// Counts a failed reconcile of `scheduler` (the streaks of Schedulers that are gone are
/// forgotten), logs it in the caller's span (its controller, scheduler and reconcileID) and
/// records a Warning event at the start of a streak, not at every retry.
async fn record_failure(ctx: &Context, scheduler: &Scheduler, err: &Error) {
    let name = scheduler.name_any();
    let failures = {
        let mut failures = lock(&ctx.failures);
        let known: BTreeSet<String> = ctx.index.scheduler_names().into_iter().collect();
        failures.retain(|n, _| *n == name || known.contains(n));
        let n = failures.entry(name).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    let delay = retry_delay(ctx.flags.reconcile_retry_base_delay, ctx.flags.reconcile_retry_max_delay, failures);
    error!(err = %err, error_kind = err.metric_label(), failures, retry_in = ?delay, "reconcile failed");
    // A refused image has its own Warning (ImageVerificationFailed), a failed status write its
    // StatusUpdateFailed, from the reconcile.
    if failures == 1 && !matches!(err, Error::WriteStatus { .. } | Error::Image { .. }) {
        let event = EventSpec { kind: EventKind::Warning, reason: Reason::ReconcileFailed, message: err.to_string() };
        publish(ctx, scheduler, &event).await;
    }
}

/// When a failed reconcile is tried again: the streak `reconcile` counted, backed off.
pub(crate) fn error_policy(scheduler: Arc<Scheduler>, _err: &Error, ctx: Arc<Context>) -> Action {
    let failures = lock(&ctx.failures).get(&scheduler.name_any()).copied().unwrap_or(1);
    Action::requeue(retry_delay(ctx.flags.reconcile_retry_base_delay, ctx.flags.reconcile_retry_max_delay, failures))
}
