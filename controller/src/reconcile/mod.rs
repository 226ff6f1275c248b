//! The reconcile of one Scheduler: read its spec and placement from the index, apply the desired
//! DaemonSet (server-side apply), gather the rollout's inputs and carry out its step (pods to
//! replace, owner labels to write, a rollback), fold DaemonSet status and kernel reports into the
//! Scheduler's status, and record state-change events. What to do is decided by the pure
//! functions of `sked_core` ([`sked_core::arbiter`], [`sked_core::workload`], [`sked_core::rollout`],
//! [`sked_core::status`], `kernel_summary`); this module reads and writes. Startup and leadership are
//! in [`crate::manager`].
//!
//! One reconcile is [`reconcile`] (the rate-limit token, the timeout, leadership, failures) around
//! `reconcile_scheduler`: it reads a [`Pass`], then `admission` (the image), `daemonset` (apply,
//! keep, make again, delete, roll back), `step` (the rollout's view of nodes and pods and its next
//! step), `kernel_view` (the KernelAttached fold), and `writes` (status first, then the step's
//! pods, labels and events).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::api::{Reason, RevisionSpec, RolloutFailure, RolloutStatus, Scheduler, SchedulerStatus};
pub use crate::context::Context;
use crate::error::ReconcileError as Error;
use crate::kernel_table as kernel;
use crate::mutex::lock;
use crate::throttle::retry_delay;
use crate::trust::TrustError;
use sked_core::node_view::{Labelling, TemplateRevision};
use sked_core::pods::SchedulerPod;
use sked_core::rollout;
use sked_core::status::{self, EventKind, EventSpec, Observed};
use sked_core::workload::{self, FIELD_MANAGER};

mod admission;
mod daemonset;
mod kernel_view;
mod step;
mod writes;

use self::admission::*;
use self::daemonset::*;
use self::kernel_view::*;
use self::step::*;
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

/// One reconcile of the Scheduler `name`: when it must be reconciled again if nothing changes
/// (`None`: only an event wakes it).
async fn reconcile_scheduler(name: &str, ctx: &Context) -> Result<Option<Duration>, Error> {
    if !ctx.leading() {
        debug!("not leading; no writes");
        return Ok(None);
    }
    // The spec and the placement computed from it, read together.
    let Some((scheduler, placement)) = ctx.index.snapshot(name) else {
        debug!("Scheduler is gone");
        return Ok(None);
    };
    let scheduler = scheduler.as_ref();
    if scheduler.metadata.deletion_timestamp.is_some() {
        // Being deleted: the garbage collector removes its DaemonSet; nothing is applied again.
        debug!("Scheduler is being deleted; nothing to apply");
        return Ok(None);
    }
    let uid = scheduler.uid().unwrap_or_default();
    let previous = lock(&ctx.memo.written).get(&uid).cloned().unwrap_or_else(|| scheduler.status_or_default());
    let previous_rollout = previous.rollout.clone().unwrap_or_default();

    // The trust policy admits the image (whether or not the Scheduler has nodes, so its status
    // always tells) before anything is deployed; a refusal leaves the DaemonSet as it is.
    let admission = Box::pin(admit(ctx, scheduler, &uid)).await;
    if let Err(e) = &admission {
        warn!(image = %scheduler.spec.sched, err = %e, "image refused; the DaemonSet is left as it is");
    }
    let (wanted, failed) = wanted_revision(scheduler, admission.as_ref().ok(), &previous_rollout);
    let Some(deployed) =
        Box::pin(sync_daemonset(ctx, scheduler, &placement, wanted.as_ref(), failed.as_ref(), &previous_rollout))
            .await?
    else {
        return Ok(None);
    };
    let daemonset = deployed.daemonset.as_ref();

    ctx.metrics.set_conflicting_nodes(&scheduler.name_any(), placement.lost.len());
    let reports = ctx.kernel.reports_of(placement.owned.iter().chain(&ctx.index.scheduled_nodes(name)));
    let pass = Pass {
        ctx,
        scheduler,
        placement: &placement,
        previous: &previous,
        previous_rollout: &previous_rollout,
        wanted: wanted.as_ref(),
        failed: failed.as_ref(),
        reports: &reports,
        wall: jiff::Timestamp::now().as_second(),
        now: std::time::Instant::now(),
    };
    // The rollout: which pods to replace, and whether the revision being rolled out failed.
    let step = daemonset.map(|ds| rollout_step(&pass, ds));
    let covered = KernelCount::covered(step.as_ref(), daemonset);
    let kernel = Box::pin(kernel_view(&pass, &covered)).await;
    let outcome = status_of(&pass, &deployed, &admission, &kernel, step.as_ref());
    if !ctx.leading() {
        // Leadership was lost during this reconcile: the new leader writes the status.
        return Ok(None);
    }
    // The status first: it carries the rollout's state, so a new leader carries on from it.
    save_status(ctx, scheduler, &uid, &previous, &outcome).await?;
    ctx.memo.exits_recorded(&kernel.heard_ejections);
    let rollout_recheck = match &step {
        Some(step) => carry_out(ctx, scheduler, step, daemonset, &previous_rollout).await?,
        None => None,
    };
    let pods_recheck = crate::pod_conditions::sync(ctx, name, &reports, kernel.grace_left.is_zero()).await;
    if let Err(source) = admission {
        // Retried with backoff by `error_policy`; the Warning event above already says why.
        return Err(Error::Image { name: scheduler.name_any(), source });
    }
    // Look again when a rollout waits for a bake or a deadline, when a new term's grace for the
    // agents ends, when a tag is due to be resolved again, and when pod conditions are left to
    // write; everything else (reports, reports going stale, pods, the DaemonSet) is an event.
    let grace_recheck = (!kernel.summary.settled).then_some(kernel.grace_left + Duration::from_millis(100));
    let rechecks = [grace_recheck, deployed.requeue, rollout_recheck, pods_recheck];
    Ok(rechecks.into_iter().flatten().min())
}

/// The revision the spec asks for (with the admitted image), and its failure if it already
/// failed: then it is not tried again until the spec changes. While the image is not admitted,
/// the failure of this generation stands too.
fn wanted_revision(
    scheduler: &Scheduler,
    admitted: Option<&crate::trust::Admitted>,
    previous: &RolloutStatus,
) -> (Option<(String, String)>, Option<RolloutFailure>) {
    let wanted = admitted.map(|a| (workload::revision(scheduler, &a.image), a.image.clone()));
    let failed = previous.failed.clone().filter(|f| {
        scheduler.metadata.generation == Some(f.generation)
            && wanted.as_ref().is_none_or(|(revision, _)| *revision == f.revision)
    });
    (wanted, failed)
}

/// What one reconcile pass read before it decides: the Scheduler and its placement (read
/// together), the status it last wrote, the revision the spec asks for and that revision's
/// failure if it failed, and the clocks the decisions are made at.
struct Pass<'a> {
    ctx: &'a Context,
    scheduler: &'a Scheduler,
    placement: &'a sked_core::arbiter::Placement,
    previous: &'a SchedulerStatus,
    previous_rollout: &'a RolloutStatus,
    wanted: Option<&'a (String, String)>,
    failed: Option<&'a RolloutFailure>,
    /// The kernel reports of its nodes (those it owns, and those its pods run on), read once.
    reports: &'a HashMap<String, kernel::NodeReport>,
    /// Seconds since the epoch (pod and report times are whole seconds).
    wall: i64,
    now: std::time::Instant,
}

/// The Scheduler's status from what this reconcile saw (decided by [`status::compute`]).
fn status_of(
    pass: &Pass<'_>,
    deployed: &Deployed,
    admission: &Result<crate::trust::Admitted, TrustError>,
    kernel: &KernelView,
    step: Option<&RolloutStep>,
) -> status::Outcome {
    let Pass { ctx, scheduler, placement, previous, .. } = *pass;
    let daemonset = deployed.daemonset.as_ref();
    let desired = daemonset.and_then(|d| d.status.as_ref()).map_or(0, |s| s.desired_number_scheduled);
    let rollout = step.map(|s| s.status.clone()).or(previous.rollout.clone());
    // Only when no pod can go anywhere does the status name what keeps them away.
    let untolerated =
        (desired == 0 && !placement.owned.is_empty()).then(|| untolerated_taints(ctx, scheduler, placement)).flatten();
    status::compute(&Observed {
        generation: scheduler.metadata.generation,
        previous,
        daemonset,
        placement,
        image: step.map(|s| s.image.as_str()),
        spec_error: deployed.spec_error.as_deref(),
        image_error: admission.as_ref().err().map(ToString::to_string).as_deref(),
        image_error_transient: admission.as_ref().err().is_some_and(TrustError::is_transient),
        kernel: &kernel.summary,
        rollout: rollout.as_ref(),
        desired: step.map(|s| s.desired),
        untolerated: untolerated.as_deref(),
        now: Time(jiff::Timestamp::now()),
    })
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
