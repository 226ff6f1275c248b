//! The reconcile of one Scheduler: read its spec and placement from the index, apply the desired
//! DaemonSet (server-side apply), gather the rollout's inputs and carry out its step (pods to
//! replace, owner labels to write, a rollback), fold DaemonSet status and kernel reports into the
//! Scheduler's status, and record state-change events. What to do is decided by the pure
//! functions of `sked_core` ([`sked_core::arbiter`], [`sked_core::workload`], [`sked_core::rollout`],
//! [`sked_core::status`], `kernel_summary`); this module reads and writes. Startup and leadership are
//! in [`crate::manager`].

use std::collections::{BTreeMap, BTreeSet};
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
use sked_api::verdict::Verdict;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::api::{Reason, RevisionSpec, RolloutFailure, RolloutStatus, Scheduler, SchedulerStatus};
pub use crate::context::Context;
use crate::error::ReconcileError as Error;
use crate::kernel_table as kernel;
use crate::mutex::lock;
use crate::throttle::retry_delay;
use crate::trust::TrustError;
use sked_core::pods::SchedulerPod;
use sked_core::rollout;
use sked_core::status::{self, EventKind, EventSpec, Observed};
use sked_core::workload::{self, FIELD_MANAGER};

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
    let pass = Pass {
        ctx,
        scheduler,
        placement: &placement,
        previous: &previous,
        previous_rollout: &previous_rollout,
        wanted: wanted.as_ref(),
        failed: failed.as_ref(),
        wall: jiff::Timestamp::now().as_second(),
        now: std::time::Instant::now(),
    };
    // The rollout: which pods to replace, and whether the revision being rolled out failed.
    let step = daemonset.map(|ds| rollout_step(&pass, ds));
    let covered = KernelCount::covered(step.as_ref(), daemonset);
    let kernel = Box::pin(kernel_view(ctx, scheduler, &placement, &covered, pass.now)).await;
    let outcome = status_of(&pass, &deployed, &admission, &kernel, step.as_ref());
    if !ctx.leading() {
        // Leadership was lost during this reconcile: the new leader writes the status.
        return Ok(None);
    }
    // The status first: it carries the rollout's state, so a new leader carries on from it.
    save_status(ctx, scheduler, &uid, &previous, &outcome).await?;
    ctx.kernel.exits_recorded(&kernel.heard_ejections);
    let rollout_recheck = match &step {
        Some(step) => carry_out(ctx, scheduler, step, daemonset, &previous_rollout).await?,
        None => None,
    };
    let pods_recheck = crate::pod_conditions::sync(ctx, name, kernel.grace_left.is_zero()).await;
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

/// The Scheduler's DaemonSet after this reconcile's write, if it has one.
struct Deployed {
    daemonset: Option<DaemonSet>,
    /// Why the API server refused the DaemonSet built from the spec, if it did.
    spec_error: Option<String>,
    /// Look again after this long (owner labels still on their way).
    requeue: Option<Duration>,
}

impl Deployed {
    /// The DaemonSet as it is after this reconcile (`None`: there is none), with no refusal
    /// and nothing to wait for.
    fn new(daemonset: Option<DaemonSet>) -> Self {
        Self { daemonset, spec_error: None, requeue: None }
    }
}

/// Makes the DaemonSet what the Scheduler asks for: applied (the admitted image of a revision
/// that has not failed), kept as it is (a refused image or a failed revision; made again if
/// someone deleted it), or deleted (it owns no node). `None` when leadership was lost first.
async fn sync_daemonset(
    ctx: &Context,
    scheduler: &Scheduler,
    placement: &sked_core::arbiter::Placement,
    wanted: Option<&(String, String)>,
    failed: Option<&RolloutFailure>,
    previous: &RolloutStatus,
) -> Result<Option<Deployed>, Error> {
    let name = scheduler.name_any();
    let namespace = &ctx.settings.namespace;
    // Nodes another Scheduler took keep this one's pod until their wave moves their label: the
    // DaemonSet stays while any node carries it.
    let wants_daemonset = placement.wants_daemonset() || !ctx.index.labelled_nodes(&name).is_empty();
    match (wanted, wants_daemonset, failed) {
        (Some((_, image)), true, None) => Box::pin(apply_daemonset(ctx, scheduler, placement, image)).await,
        // Refused image, or a revision that failed: the DaemonSet stays as it is...
        (_, true, failed) => match (ctx.index.daemonset(&name, namespace), failed) {
            (Some(ds), _) => Ok(Some(Deployed::new(Some(ds.as_ref().clone())))),
            // ...and one deleted by hand while a failure is recorded is made again as it was.
            (None, Some(failure)) => {
                let recreated = Box::pin(recreate_after_failure(ctx, scheduler, previous, failure, wanted)).await?;
                Ok(Some(Deployed::new(recreated)))
            }
            (None, None) => Ok(Some(Deployed::new(None))),
        },
        (_, false, _) => {
            if !ctx.leading() {
                return Ok(None);
            }
            delete_daemonset(ctx, &name).await?;
            Ok(Some(Deployed::new(None)))
        }
    }
}

/// Applies the DaemonSet that runs `image` for the Scheduler, unless the one applied before is
/// unchanged, or nodes that run its pod wait for their owner label (the template selects it).
async fn apply_daemonset(
    ctx: &Context,
    scheduler: &Scheduler,
    placement: &sked_core::arbiter::Placement,
    image: &str,
) -> Result<Option<Deployed>, Error> {
    let name = scheduler.name_any();
    let namespace = &ctx.settings.namespace;
    let apply_error = |source| Error::ApplyDaemonSet { namespace: namespace.clone(), name: name.clone(), source };
    let mut desired = workload::desired_daemonset(scheduler, image, &ctx.settings)?;
    if let Some(key) = ctx.trust.admission_key(&scheduler.spec.sched, &scheduler.spec.pull_secret_names()) {
        desired.annotations_mut().insert(workload::ADMITTED_ANNOTATION.to_owned(), key);
    }
    let hash = workload::applied_digest(&desired);
    desired.annotations_mut().insert(workload::APPLIED_ANNOTATION.to_owned(), hash.clone());
    let live = ctx.index.daemonset(&name, namespace).map(|ds| ds.as_ref().clone());
    let unchanged = applied_unchanged(ctx, &name, &hash, live.as_ref());
    // A node that runs this Scheduler's pod keeps it only if it carries the owner label the
    // template selects: apply once those labels are written.
    let running: BTreeSet<String> = ctx.index.scheduled_nodes(&name).intersection(&placement.owned).cloned().collect();
    let waiting = ctx.index.unlabelled(&name, &running);
    if unchanged {
        return Ok(Some(Deployed::new(live)));
    }
    if waiting > 0 {
        // The label's arrival triggers this Scheduler; look again now and then anyway.
        debug!(nodes = waiting, "waiting for the owner label on nodes that run this Scheduler");
        return Ok(Some(Deployed { daemonset: live, spec_error: None, requeue: Some(Duration::from_secs(5)) }));
    }
    if !ctx.leading() {
        return Ok(None);
    }
    crate::throttle::before_write(&ctx.limiter)?;
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), namespace);
    match daemonsets.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&desired)).await {
        Ok(applied) => {
            let generation = applied.metadata.generation.unwrap_or(0);
            let before =
                lock(&ctx.memo.applied).insert(name.clone(), crate::memo::Applied { hash: hash.clone(), generation });
            if before.map(|a| a.generation) != Some(generation) {
                info!(daemonset = %format!("{namespace}/{name}"), image = %image, "applied DaemonSet");
            }
            Ok(Some(Deployed::new(Some(applied))))
        }
        Err(kube::Error::Api(status)) if status.code == 422 => {
            // The spec passed the CRD schema but the DaemonSet built from it does not: report it
            // on the Scheduler and wait for the user to change the spec.
            warn!(err = %status.message, "API server refused the DaemonSet built from this spec");
            let daemonset = daemonsets.get_opt(&name).await.map_err(apply_error)?;
            Ok(Some(Deployed { daemonset, spec_error: Some(status.message.clone()), requeue: None }))
        }
        Err(source) => Err(apply_error(source)),
    }
}

/// Whether the DaemonSet `name` needs no apply: applied in this term with the same digest and not
/// edited since (its generation did not move past the one the apply got), or, not applied in
/// this term (a new leader), carrying the digest with no other writer
/// ([`workload::applied_unchanged`]); then remembered as applied at its generation.
fn applied_unchanged(ctx: &Context, name: &str, hash: &str, live: Option<&DaemonSet>) -> bool {
    let mut applied = lock(&ctx.memo.applied);
    let Some(live) = live else { return false };
    let generation = live.metadata.generation.unwrap_or(0);
    match applied.get(name) {
        Some(a) => a.hash == hash && generation <= a.generation,
        None if workload::applied_unchanged(live, hash) => {
            applied.insert(name.to_owned(), crate::memo::Applied { hash: hash.to_owned(), generation });
            true
        }
        None => false,
    }
}

/// Deletes the DaemonSet of a Scheduler that owns no node. Nothing to delete (none seen, none
/// applied in this term): no write, so a Scheduler that owns no node costs nothing when it is
/// reconciled again.
async fn delete_daemonset(ctx: &Context, name: &str) -> Result<(), Error> {
    let namespace = &ctx.settings.namespace;
    let present = ctx.index.daemonset(name, namespace).is_some() || lock(&ctx.memo.applied).contains_key(name);
    if !present {
        return Ok(());
    }
    crate::throttle::before_write(&ctx.limiter)?;
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), namespace);
    match daemonsets.delete(name, &DeleteParams::background()).await {
        Ok(_) => {
            info!(daemonset = %format!("{namespace}/{name}"), "deleted DaemonSet: every selected node belongs to an older Scheduler")
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(source) => {
            return Err(Error::DeleteDaemonSet { namespace: namespace.clone(), name: name.to_owned(), source });
        }
    }
    lock(&ctx.memo.applied).remove(name);
    Ok(())
}

/// What the agents report of the Scheduler's nodes, as this reconcile sees it.
struct KernelView {
    summary: kernel::KernelSummary,
    /// Every ejection heard, recorded or not (they are marked recorded once the events are out).
    heard_ejections: Vec<crate::api::KernelExit>,
    /// How much longer a new leader waits for agents before it judges silent nodes.
    grace_left: Duration,
}

/// Which nodes KernelAttached counts: `desired` of them, none of `off` (skipped for their own
/// trouble).
struct KernelCount<'a> {
    desired: i32,
    off: &'a [String],
}

impl<'a> KernelCount<'a> {
    /// KernelAttached counts the nodes the rollout covers: not those skipped for their own
    /// trouble (down, full, tainted), where no pod of any revision runs. Without a rollout step
    /// (no DaemonSet), the DaemonSet's own count.
    fn covered(step: Option<&'a RolloutStep>, daemonset: Option<&DaemonSet>) -> Self {
        match step {
            Some(step) => KernelCount { desired: step.desired, off: &step.off_kernel_count },
            None => KernelCount {
                desired: daemonset.and_then(|d| d.status.as_ref()).map_or(0, |s| s.desired_number_scheduled),
                off: &[],
            },
        }
    }
}

/// Folds the kernel reports of the nodes that run the Scheduler's pod (and are still its own).
/// Early in a leadership term the table holds only the agents that reconnected so far: while
/// nodes without a report are the only thing short of the condition found, it is kept as it was,
/// until every node reported, or until a silent node would be stale anyway
/// (`--report-stale-after`, at least one heartbeat), longer while agents are still coming back.
/// A reported problem is news at once. Each ejection is recorded once: one from before this
/// term may have been recorded by the previous leader, which its events say.
async fn kernel_view(
    ctx: &Context,
    scheduler: &Scheduler,
    placement: &sked_core::arbiter::Placement,
    count: &KernelCount<'_>,
    now: std::time::Instant,
) -> KernelView {
    let name = scheduler.name_any();
    let stale_after = ctx.flags.report_stale_after;
    let scheduled: BTreeSet<String> = ctx
        .index
        .scheduled_nodes(&name)
        .intersection(&placement.owned)
        .filter(|n| !count.off.contains(*n))
        .cloned()
        .collect();
    let desired = count.desired;
    let mut summary =
        ctx.kernel.read(|reports| kernel::summarize(&name, &scheduled, desired, reports, now, stale_after));
    let heartbeat = ctx.flags.agent_heartbeat_interval;
    let grace = ctx.flags.report_stale_after.max(heartbeat);
    let since_arrival = ctx.kernel.last_arrival().map(|t| now.saturating_duration_since(t));
    let grace_left = kernel::grace_left(ctx.memo.term_age(), grace, heartbeat, since_arrival);
    summary.settled = !summary.awaits_reports(scheduled.len(), grace_left);
    let heard_ejections = summary.ejections.clone();
    let term_began =
        jiff::Timestamp::now().checked_sub(ctx.memo.term_age()).map(|t| format!("{t:.3}")).unwrap_or_default();
    if summary.ejections.iter().any(|e| e.time < term_began) {
        let recorded = recorded_ejections(ctx, scheduler).await;
        summary.ejections.retain(|e| !recorded.contains(&ejection_key(&e.node, &e.time)));
    }
    KernelView { summary, heard_ejections, grace_left }
}

/// Saves the status when it changed (a failed write is a Warning event and a retried error),
/// then records the events of the change.
async fn save_status(
    ctx: &Context,
    scheduler: &Scheduler,
    uid: &str,
    previous: &SchedulerStatus,
    outcome: &status::Outcome,
) -> Result<(), Error> {
    let events = outcome.event.iter().chain(&outcome.kernel_event).chain(&outcome.exit_events);
    if outcome.status != *previous || events.clone().next().is_some() {
        crate::throttle::before_write(&ctx.limiter)?;
    }
    if outcome.status != *previous {
        // Remembered before the write: the watch may show it before the response comes, and it
        // is this write's echo then (see `Memo::is_own_status_echo`). Put back if it fails.
        let before = lock(&ctx.memo.written).insert(uid.to_owned(), outcome.status.clone());
        if let Err(source) = write_status(ctx, scheduler, &outcome.status).await {
            {
                let mut written = lock(&ctx.memo.written);
                match before {
                    Some(before) => written.insert(uid.to_owned(), before),
                    None => written.remove(uid),
                };
            }
            let message = format!("Could not save the Scheduler's status: {source}");
            let event = EventSpec { kind: EventKind::Warning, reason: Reason::StatusUpdateFailed, message };
            publish(ctx, scheduler, &event).await;
            return Err(Error::WriteStatus { name: scheduler.name_any(), source });
        }
    } else {
        debug!("reconciled; nothing changed");
    }
    for event in events {
        info!(reason = %event.reason, kind = ?event.kind, note = %event.message, "state changed");
        publish(ctx, scheduler, event).await;
    }
    Ok(())
}

/// Carries out a rollout step once its status is saved: the rollback, the pods to replace, the
/// owner labels to write, and the event of a return to the kernel's default. Returns when the
/// rollout wants to decide again.
async fn carry_out(
    ctx: &Context,
    scheduler: &Scheduler,
    step: &RolloutStep,
    daemonset: Option<&DaemonSet>,
    previous: &RolloutStatus,
) -> Result<Option<Duration>, Error> {
    let writes = step.roll_back.is_some()
        || !step.replace.is_empty()
        || !step.admit.is_empty()
        || !step.evict.is_empty()
        || step.to_zero.is_some();
    if writes {
        crate::throttle::before_write(&ctx.limiter)?;
    }
    if let (Some((failure, newly)), Some(ds)) = (&step.roll_back, daemonset) {
        roll_back(ctx, scheduler, ds, previous, failure, *newly).await?;
    }
    replace_pods(ctx, &step.replace).await;
    write_owner_labels(ctx, &scheduler.name_any(), &step.admit, &step.evict).await;
    if let Some(failure) = &step.to_zero {
        let which = if previous.current_revision.is_some() {
            "the nodes it was taking over where it failed"
        } else {
            "every node it reached"
        };
        let message = format!(
            "Revision {} failed on node {}: {}. Rolled back to the kernel's default scheduler on {which} ({})",
            failure.revision,
            failure.node,
            failure.cause,
            step.evict.len()
        );
        publish(ctx, scheduler, &EventSpec { kind: EventKind::Warning, reason: Reason::RolledBack, message }).await;
    }
    Ok(step.recheck_in)
}

/// Admits the Scheduler's image, reusing its last admission while the inputs (image, pull
/// secrets, trust policy) are the same and, for a tag, until `--image-recheck-interval` says to
/// resolve it again: an idle Scheduler costs no registry request. When that recheck cannot
/// reach the registry (or the trust root), the digest verified before stays admitted and the
/// recheck is tried again within a minute; so does the digest a DaemonSet runs for the same
/// inputs (its admission annotation), which a new leader finds without having verified it
/// itself. When a tag is due, `tag_recheck` resolves it apart from the reconciles and
/// reconciles only the Schedulers it changed for; a reconcile that comes first admits again here.
async fn admit(ctx: &Context, scheduler: &Scheduler, uid: &str) -> Result<crate::trust::Admitted, TrustError> {
    let secrets = scheduler.spec.pull_secret_names();
    let inputs = (scheduler.spec.sched.clone(), secrets.clone(), ctx.trust.policy().generation);
    let now = std::time::Instant::now();
    let kept = lock(&ctx.memo.admissions).get(uid).filter(|a| a.inputs == inputs).cloned();
    if let Some(kept) = &kept
        && kept.recheck_at.is_none_or(|at| now < at)
    {
        return Ok(kept.admitted.clone());
    }
    let result = ctx.trust.admit(&ctx.client, &scheduler.spec.sched, &secrets).await;
    let interval = ctx.flags.image_recheck_interval;
    let kept = match (&result, kept) {
        (Err(e), kept) if e.is_transient() => kept.or_else(|| {
            let admitted = deployed_admission(ctx, scheduler, &secrets)?;
            Some(crate::memo::Admission {
                name: scheduler.name_any(),
                inputs: inputs.clone(),
                admitted,
                recheck_at: None,
            })
        }),
        _ => None,
    };
    let mut admissions = lock(&ctx.memo.admissions);
    match (result, kept) {
        (Ok(admitted), _) => {
            ctx.metrics.verified("reconcile", admitted.outcome.metric_label());
            // Counted from when the registry was asked, perhaps for another Scheduler on the same
            // tag: the Schedulers sharing a tag recheck it together, with one request.
            let recheck_at = crate::tag_recheck::next_recheck(&Ok(admitted.clone()), now, interval);
            let admission =
                crate::memo::Admission { name: scheduler.name_any(), inputs, admitted: admitted.clone(), recheck_at };
            admissions.insert(uid.to_owned(), admission);
            Ok(admitted)
        }
        (Err(e), Some(mut kept)) => {
            // Not a refusal: said apart, so an outage is not counted as a failed verification.
            ctx.metrics.verified("reconcile", KEPT_UNREACHABLE);
            warn!(image = %scheduler.spec.sched, err = %e, kept = %kept.admitted.image,
                "could not resolve the image again; the digest verified before stays deployed");
            kept.recheck_at = Some(now + interval.min(Duration::from_secs(60)));
            let admitted = kept.admitted.clone();
            admissions.insert(uid.to_owned(), kept);
            Ok(admitted)
        }
        (Err(e), None) => {
            ctx.metrics.verified("reconcile", e.metric_label());
            admissions.remove(uid);
            Err(e)
        }
    }
}

/// The metric outcome of a recheck that could not reach the registry (or the trust root) while
/// a digest admitted before stays deployed.
const KEPT_UNREACHABLE: &str = "kept_registry_unreachable";

/// The digest the Scheduler's DaemonSet runs, when the DaemonSet says it was admitted for the
/// inputs the Scheduler has now (its image reference and pull secrets, and the policy rule).
fn deployed_admission(ctx: &Context, scheduler: &Scheduler, secrets: &[String]) -> Option<crate::trust::Admitted> {
    let ds = ctx.index.daemonset(&scheduler.name_any(), &ctx.settings.namespace)?;
    let recorded = ds.annotations().get(workload::ADMITTED_ANNOTATION).map(String::as_str);
    let pod = ds.spec.template.spec.as_ref()?;
    let running = pod.containers.iter().find(|c| c.name == workload::SCHEDULER_CONTAINER)?.image.as_deref();
    ctx.trust.recorded_admission(&scheduler.spec.sched, secrets, recorded, running)
}

/// One step of a Scheduler's rollout, decided but not yet carried out.
struct RolloutStep {
    status: RolloutStatus,
    /// The image the DaemonSet's template runs.
    image: String,
    /// Pods to delete, by name and uid (each comes back as the template's revision).
    replace: Vec<(String, String)>,
    /// Set the template back to the current revision, for this failure (and whether it failed
    /// in this reconcile).
    roll_back: Option<(RolloutFailure, bool)>,
    /// Entering nodes to label now, and labels to remove (a first revision failed).
    admit: Vec<String>,
    evict: Vec<String>,
    /// A first revision failed in this reconcile: its nodes go back to the kernel's default.
    to_zero: Option<RolloutFailure>,
    recheck_in: Option<Duration>,
    /// Skipped nodes KernelAttached does not count (see `rollout::Plan::off_kernel_count`).
    off_kernel_count: Vec<String>,
    /// The nodes the rollout covers (`rollout::Plan::desired`): DESIRED.
    desired: i32,
}

/// Reads the Scheduler's pods and kernel reports and decides the next rollout step.
fn rollout_step(pass: &Pass<'_>, ds: &DaemonSet) -> RolloutStep {
    let Pass { ctx, scheduler, placement, previous_rollout: previous, failed, wanted, wall, .. } = *pass;
    let name = scheduler.name_any();
    let template = TemplateRevision::of(ds);
    let stable = previous.current_revision.as_ref().map(|r| r.name.as_str());
    let pods = ctx.index.pods_of(&name);
    let (labelled, entering) = entering_nodes(ctx, scheduler, placement);
    let nodes = node_views(pass, &labelled, &pods, &template);
    let plan = rollout::decide(&rollout::Input {
        target: &template.name,
        stable,
        nodes: &nodes,
        entering: &entering,
        // Held while the failure they were held under stands (as `rollout::advance` keeps them).
        held: if failed.is_some() { &previous.held_nodes } else { &[] },
        expected_pods: expected_pods(ctx, &name, ds, placement, &pods, nodes.len()),
        // A retry of a revision that failed under an earlier generation: the pods of that
        // attempt are replaced, not judged again.
        retried_after: previous
            .failed
            .as_ref()
            .filter(|f| failed.is_none() && f.revision == template.name)
            .map(|f| f.time.0.as_second()),
        pacing: rollout::Pacing::of(scheduler.spec.rollout.as_ref(), nodes.len() + entering.len()),
        now: wall,
    });
    let step = rollout::advance(&rollout::Progress {
        previous,
        failed,
        plan: &plan,
        template: crate::api::Revision {
            name: template.name.clone(),
            image: template.image.clone(),
            generation: scheduler.metadata.generation.unwrap_or(0),
            // The spec's fields, when the template is the spec's revision (not one rolled back to).
            spec: wanted
                .is_some_and(|(revision, _)| *revision == template.name)
                .then(|| RevisionSpec::of(&scheduler.spec)),
        },
        wanted: wanted.map(|(revision, image)| (revision.as_str(), image.as_str())),
        caught_up: caught_up(ctx, &name, ds),
        now: Time(jiff::Timestamp::now()),
    });
    if let Some(failure) = &step.newly_failed {
        warn!(revision = %failure.revision, node = %failure.node, cause = %failure.cause, "rollout failed");
        ctx.metrics.rolled_back(&name);
    }
    if step.status.failed.is_none() && failed.is_some() {
        info!(revision = %template.name, "the revision reported failed runs attached everywhere now");
    }
    let recheck_in =
        plan.recheck_in.map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(1)) + Duration::from_millis(200));
    RolloutStep {
        off_kernel_count: plan.off_kernel_count,
        ..RolloutStep::of(step, template.image, &pods, stable.is_none(), recheck_in)
    }
}

impl RolloutStep {
    /// The step `rollout::advance` decided, with the pods to replace named by uid too: a pod of
    /// the same name made since is not the one decided on.
    fn of(
        step: rollout::Step,
        image: String,
        pods: &[Arc<SchedulerPod>],
        first_revision: bool,
        recheck_in: Option<Duration>,
    ) -> Self {
        let newly = step.newly_failed.is_some();
        let roll_back = step.status.failed.clone().filter(|_| step.roll_back).map(|f| (f, newly));
        // Nodes back to revision zero: a first revision failed, or a takeover under the stable one.
        let to_zero = step.newly_failed.clone().filter(|_| first_revision || !step.evict.is_empty());
        let replace = step
            .replace
            .into_iter()
            .filter_map(|name| {
                let uid = pods.iter().find(|p| p.name == name)?.uid.clone();
                Some((name, uid))
            })
            .collect();
        Self {
            status: step.status,
            image,
            replace,
            roll_back,
            admit: step.admit,
            evict: step.evict,
            to_zero,
            recheck_in,
            off_kernel_count: Vec::new(),
            desired: i32::try_from(step.desired).unwrap_or(i32::MAX),
        }
    }
}

/// Each labelled node with its pod (a live one before a terminating one) and what that pod's
/// agent last reported, if the report is fresh.
fn node_views(
    pass: &Pass<'_>,
    labelled: &[String],
    pods: &[Arc<SchedulerPod>],
    template: &TemplateRevision,
) -> Vec<rollout::NodeView> {
    let Pass { ctx, scheduler, now, .. } = *pass;
    let name = scheduler.name_any();
    let stale_after = ctx.flags.report_stale_after;
    let attach_timeout = Duration::from_secs(
        u64::try_from(rollout::Pacing::of(scheduler.spec.rollout.as_ref(), 1).attach_timeout_seconds).unwrap_or(1),
    );
    ctx.kernel.read(|reports| {
        labelled
            .iter()
            .map(|node| {
                // A pod not bound yet counts for the node it is made for: one never bound is
                // that node's trouble, not a pod the DaemonSet controller still owes.
                let pod = pods
                    .iter()
                    .filter(|p| p.node_or_target() == Some(node.as_str()))
                    .min_by_key(|p| p.is_terminating());
                let report = reports.get(node).filter(|r| r.scheduler == name && r.fresh(now, stale_after));
                node_view(pass, node, pod.map(|p| p.as_ref()), report, template, attach_timeout)
            })
            .collect()
    })
}

/// The pods the DaemonSet controller means to run; until it has counted them, one per labelled
/// node. (Less the nodes another Scheduler took, which keep this one's pod until their wave, and
/// the nodes deleted under a pod: the DaemonSet controller counts such a node until the pod
/// garbage collector removes its pod, which may take a minute or never come.)
fn expected_pods(
    ctx: &Context,
    name: &str,
    ds: &DaemonSet,
    placement: &sked_core::arbiter::Placement,
    pods: &[Arc<SchedulerPod>],
    labelled: usize,
) -> usize {
    let taken = ctx.index.labelled_nodes(name).iter().filter(|n| !placement.owned.contains(*n)).count();
    let node_gone = pods
        .iter()
        .filter(|p| !p.is_terminating())
        .filter(|p| p.node.as_deref().is_some_and(|n| !ctx.index.knows_node(n)))
        .count();
    ds.status
        .as_ref()
        .filter(|s| s.observed_generation.is_some())
        .map_or(labelled, |s| usize::try_from(s.desired_number_scheduled).unwrap_or(0))
        .saturating_sub(taken + node_gone)
}

/// The DaemonSet controller has seen the template, and this copy is not older than the one
/// this controller last applied (the index may lag behind its own write).
fn caught_up(ctx: &Context, name: &str, ds: &DaemonSet) -> bool {
    let applied = lock(&ctx.memo.applied).get(name).map_or(0, |a| a.generation);
    let ds_generation = ds.metadata.generation.unwrap_or(0);
    ds.status.as_ref().and_then(|s| s.observed_generation).unwrap_or(0) >= ds_generation && ds_generation >= applied
}

/// What a pod of the DaemonSet's template runs: its revision label, image and arguments.
struct TemplateRevision {
    name: String,
    image: String,
    args: Vec<String>,
}

impl TemplateRevision {
    fn of(ds: &DaemonSet) -> Self {
        let template = &ds.spec.template;
        let name = template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.as_ref())
            .and_then(|l| l.get(workload::REVISION_LABEL))
            .cloned()
            .unwrap_or_default();
        let scx =
            template.spec.as_ref().and_then(|p| p.containers.iter().find(|c| c.name == workload::SCHEDULER_CONTAINER));
        Self {
            name,
            image: scx.and_then(|c| c.image.clone()).unwrap_or_default(),
            args: scx.and_then(|c| c.args.clone()).unwrap_or_default(),
        }
    }
}

/// One labelled node as the rollout sees it: its pod (a live one before a terminating one),
/// what that pod's agent last reported (a fresh report, or none), and the node's own state.
fn node_view(
    pass: &Pass<'_>,
    node: &str,
    pod: Option<&SchedulerPod>,
    report: Option<&kernel::NodeReport>,
    template: &TemplateRevision,
    attach_timeout: Duration,
) -> rollout::NodeView {
    let Pass { ctx, scheduler, wall, .. } = *pass;
    let own_report = report.filter(|r| pod.is_some_and(|p| p.name == r.pod));
    let exit = own_report.and_then(|r| r.last_exit.as_ref()).map(|e| e.describe());
    let kernel = match report {
        Some(r) if r.verdict == Verdict::KernelUnsupported => rollout::KernelView::Unsupported,
        Some(r) if r.verdict == Verdict::ForeignScheduler => rollout::KernelView::Foreign,
        Some(_) => match own_report.map(|r| (r.attached_since, r.ejected)) {
            Some((Some(since), _)) => rollout::KernelView::Attached { since },
            Some((None, true)) => rollout::KernelView::Ejected,
            Some((None, false)) => rollout::KernelView::NotAttached,
            None => rollout::KernelView::Unknown,
        },
        None => rollout::KernelView::Unknown,
    };
    let view = pod.map(|p| rollout::PodView {
        name: p.name.clone(),
        revision: p.revision(&template.name, &template.image, &template.args),
        ready_since: p.ready_since,
        created: p.created.unwrap_or(wall),
        crash_looping: p.backing_off || p.restarts >= rollout::CRASH_LOOP_RESTARTS,
        bound: p.node.is_some(),
        started: p.started,
        pull_error: p.pull_error.clone(),
        last_exit: p.last_exit.clone(),
        terminating_since: p.terminating_since,
    });
    // When this leader labelled it, as long as it has not run attached since: once it has, it
    // no longer enters (a later restart of its pod is not a switch from revision zero).
    let attached =
        matches!(kernel, rollout::KernelView::Attached { .. }) && pod.is_some_and(|p| p.ready_since.is_some());
    let labelled_ago = {
        let mut labelled = lock(&ctx.memo.labelled);
        if attached {
            labelled.remove(node);
            None
        } else {
            labelled.get(node).map(|at| at.elapsed())
        }
    };
    // Labelled moments ago and no pod yet: by this leader (it remembers), or by the last one
    // (early in a term, any labelled node without a pod may be).
    let just_labelled = view.is_none()
        && (ctx.memo.term_age() < attach_timeout || labelled_ago.is_some_and(|ago| ago < attach_timeout));
    rollout::NodeView {
        node: node.to_owned(),
        pod: view,
        kernel,
        exit,
        just_labelled,
        unfit: unfit(ctx, scheduler, node),
        // In whole seconds, rounded down (pod creation times are whole seconds too).
        entered_at: labelled_ago.map(|ago| wall.saturating_sub(i64::try_from(ago.as_secs() + 1).unwrap_or(i64::MAX))),
    }
}

/// The nodes the Scheduler owns, split into those that carry its owner label (sorted) and those
/// that do not yet, entering from revision zero. An entering node joined on its own when it was
/// created after the Scheduler and no other Scheduler's label is on it.
fn entering_nodes(
    ctx: &Context,
    scheduler: &Scheduler,
    placement: &sked_core::arbiter::Placement,
) -> (Vec<String>, Vec<rollout::Entering>) {
    let name = scheduler.name_any();
    let created = scheduler.metadata.creation_timestamp.as_ref().map_or(i64::MAX, |t| t.0.as_second());
    let running = ctx.index.scheduled_nodes(&name);
    let mut labelled = Vec::new();
    let mut entering = Vec::new();
    for node in &placement.owned {
        match ctx.index.node_label(node, workload::OWNER_LABEL) {
            Some(Some(owner)) if owner == name => labelled.push(node.clone()),
            Some(owner) => {
                let joined = owner.is_none() && ctx.index.node_created(node).is_some_and(|t| t > created);
                entering.push(rollout::Entering {
                    node: node.clone(),
                    joined,
                    runs_it: running.contains(node),
                    unfit: unfit(ctx, scheduler, node),
                });
            }
            None => {}
        }
    }
    (labelled, entering)
}

/// Why no pod of `scheduler` can run on `node` now, if so: the Node is down, or it has a taint
/// the Scheduler does not tolerate.
fn unfit(ctx: &Context, scheduler: &Scheduler, node: &str) -> Option<rollout::Skip> {
    let facts = ctx.index.node_facts(node)?;
    if facts.down() {
        Some(rollout::Skip::NodeNotReady)
    } else {
        facts.untolerated(&scheduler.spec.tolerations).map(|_| rollout::Skip::TaintNotTolerated)
    }
}

/// What keeps the Scheduler's pods off its tainted nodes, for its status: the taints by node,
/// a few of each; `None` when no owned node has a taint it does not tolerate.
fn untolerated_taints(
    ctx: &Context,
    scheduler: &Scheduler,
    placement: &sked_core::arbiter::Placement,
) -> Option<String> {
    let mut by_taint: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for node in &placement.owned {
        let Some(facts) = ctx.index.node_facts(node) else { continue };
        if let Some(taint) = facts.untolerated(&scheduler.spec.tolerations) {
            by_taint.entry(sked_core::nodes::describe_taint(taint)).or_default().push(node);
        }
    }
    let count: usize = by_taint.values().map(Vec::len).sum();
    if count == 0 {
        return None;
    }
    let listed: Vec<String> = by_taint
        .iter()
        .take(3)
        .map(|(taint, nodes)| {
            let more = nodes.len().saturating_sub(3);
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            format!("{taint} on {}{more}", nodes.iter().take(3).copied().collect::<Vec<_>>().join(", "))
        })
        .collect();
    Some(format!(
        "{count} selected node(s) have a taint the Scheduler does not tolerate, so no pod of it can run there: {}; add a matching toleration to spec.tolerations",
        listed.join("; ")
    ))
}

/// Writes the owner labels a rollout step decided: `admit` gets this Scheduler's, `evict` loses
/// it (back to the kernel's default scheduler). A label not written is decided again at the
/// next reconcile.
async fn write_owner_labels(ctx: &Context, scheduler: &str, admit: &[String], evict: &[String]) {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(ctx.client.clone());
    let writes = admit.iter().map(|n| (n, Some(scheduler))).chain(evict.iter().map(|n| (n, None)));
    for (node, owner) in writes {
        if !ctx.leading() {
            return;
        }
        match crate::owner_labels::write_label(&nodes, node, owner).await {
            Ok(()) => {
                if owner.is_some() {
                    let mut labelled = lock(&ctx.memo.labelled);
                    // Past the longest attach timeout an entry tells nothing any more.
                    labelled.retain(|_, at| at.elapsed() < Duration::from_secs(86_400));
                    labelled.insert(node.clone(), std::time::Instant::now());
                    info!(node = %node, "node enters this Scheduler");
                } else {
                    info!(node = %node, "node back on the kernel's default scheduler");
                }
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                warn!(node = %node, err = %e, "could not write the node's owner label; retried at the next reconcile")
            }
        }
    }
}

/// Deletes the pods a rollout replaces now.
async fn replace_pods(ctx: &Context, replace: &[(String, String)]) {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.settings.namespace);
    for (pod, uid) in replace {
        if !ctx.leading() {
            return;
        }
        let params = DeleteParams {
            preconditions: Some(kube::api::Preconditions { uid: Some(uid.clone()), resource_version: None }),
            ..DeleteParams::default()
        };
        match pods.delete(pod, &params).await {
            Ok(_) => info!(pod = %pod, "replacing pod with the new revision"),
            // Gone, or another pod by now: decided again at the next reconcile.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => warn!(pod = %pod, err = %e, "could not delete pod; retried at the next reconcile"),
        }
    }
}

/// Makes again the DaemonSet of a Scheduler whose rollout failed, after someone deleted it: as
/// the failure left it, the template of the revision rolled back to (the current one), or, for a
/// first revision or a takeover (the failed revision is the template; its failed nodes lost
/// their label, so no pod of it goes anywhere), the spec's own.
async fn recreate_after_failure(
    ctx: &Context,
    scheduler: &Scheduler,
    previous: &RolloutStatus,
    failure: &RolloutFailure,
    wanted: Option<&(String, String)>,
) -> Result<Option<DaemonSet>, Error> {
    let name = scheduler.name_any();
    let namespace = &ctx.settings.namespace;
    let desired = match previous.current_revision.as_ref().filter(|stable| stable.name != failure.revision) {
        Some(stable) => match stable_daemonset(ctx, scheduler, None, stable).await {
            Ok(desired) => desired,
            Err(e) => {
                warn!(err = %e, "the DaemonSet was deleted and the revision rolled back to cannot be made again; change the spec to deploy one");
                return Ok(None);
            }
        },
        None => match wanted {
            Some((_, image)) => workload::desired_daemonset(scheduler, image, &ctx.settings)?,
            None => return Ok(None),
        },
    };
    if !ctx.leading() {
        return Ok(None);
    }
    crate::throttle::before_write(&ctx.limiter)?;
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), namespace);
    let applied = daemonsets
        .patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&desired))
        .await
        .map_err(|source| Error::ApplyDaemonSet { namespace: namespace.clone(), name: name.clone(), source })?;
    info!(daemonset = %format!("{namespace}/{name}"), "made the DaemonSet again (deleted while a failed revision is recorded)");
    Ok(Some(applied))
}

/// The DaemonSet of the Scheduler's current revision `stable` (what a rollback restores): from
/// the revision's fields the status keeps or, for a revision recorded before sked kept them,
/// from the ControllerRevision history of the DaemonSet `ds_uid`.
async fn stable_daemonset(
    ctx: &Context,
    scheduler: &Scheduler,
    ds_uid: Option<&str>,
    stable: &crate::api::Revision,
) -> Result<DaemonSet, Error> {
    let name = scheduler.name_any();
    let namespace = &ctx.settings.namespace;
    if let Some(fields) = &stable.spec {
        let mut restored = scheduler.clone();
        restored.spec = fields.applied_to(&scheduler.spec, &stable.image);
        return Ok(workload::desired_daemonset(&restored, &stable.image, &ctx.settings)?);
    }
    let lost =
        || Error::RollbackLost { name: name.clone(), namespace: namespace.clone(), revision: stable.name.clone() };
    let ds_uid = ds_uid.ok_or_else(lost)?;
    let revisions: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), namespace);
    let selector = format!("{}={name},{}={}", workload::NAME_LABEL, workload::REVISION_LABEL, stable.name);
    let listed = revisions
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| Error::ApplyDaemonSet { namespace: namespace.clone(), name: name.clone(), source })?;
    let owned_by_ds = |r: &&ControllerRevision| r.owner_references().iter().any(|o| o.uid == ds_uid);
    let template = listed
        .items
        .iter()
        .filter(owned_by_ds)
        .max_by_key(|r| r.revision)
        .and_then(|r| r.data.0.get("spec")?.get("template").cloned())
        .and_then(|mut t| {
            if let Some(t) = t.as_object_mut() {
                t.remove("$patch");
            }
            serde_json::from_value::<PodTemplateSpec>(t).ok()
        })
        .ok_or_else(lost)?;
    let mut desired = workload::desired_daemonset(scheduler, &stable.image, &ctx.settings)?;
    workload::restore_revision(&mut desired, &template);
    Ok(desired)
}

/// Sets the DaemonSet's template back to the last revision that ran attached everywhere and
/// records RolledBack. The nodes the failed revision reached are replaced by the next reconciles.
async fn roll_back(
    ctx: &Context,
    scheduler: &Scheduler,
    ds: &DaemonSet,
    previous: &RolloutStatus,
    failure: &RolloutFailure,
    newly: bool,
) -> Result<(), Error> {
    let name = scheduler.name_any();
    let namespace = &ctx.settings.namespace;
    let Some(stable) = previous.current_revision.as_ref() else { return Ok(()) };
    let desired = stable_daemonset(ctx, scheduler, ds.metadata.uid.as_deref(), stable).await?;
    if !ctx.leading() {
        return Ok(());
    }
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), namespace);
    daemonsets
        .patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&desired))
        .await
        .map_err(|source| Error::ApplyDaemonSet { namespace: namespace.clone(), name: name.clone(), source })?;
    if newly {
        info!(revision = %stable.name, image = %stable.image, "rolled back to the last attached revision");
        let message = format!(
            "Revision {} failed on node {}: {}. Rolled back to revision {} ({})",
            failure.revision, failure.node, failure.cause, stable.name, stable.image
        );
        publish(ctx, scheduler, &EventSpec { kind: EventKind::Warning, reason: Reason::RolledBack, message }).await;
    }
    Ok(())
}

async fn write_status(ctx: &Context, scheduler: &Scheduler, status: &SchedulerStatus) -> Result<(), kube::Error> {
    let api: Api<Scheduler> = Api::all(ctx.client.clone());
    let body = json!({
        "apiVersion": Scheduler::api_version(&()),
        "kind": Scheduler::kind(&()),
        "metadata": { "name": scheduler.name_any() },
        "status": status,
    });
    api.patch_status(&scheduler.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body))
        .await
        .map(|_| ())
}

/// Where the events of a Scheduler are (the recorder's namespace for cluster-scoped objects).
const EVENTS_NAMESPACE: &str = "default";

/// `node@time`: one ejection.
fn ejection_key(node: &str, time: &str) -> String {
    format!("{node}@{time}")
}

/// The ejections of `scheduler` that have a KernelEjected event (recorded by this replica or an
/// earlier leader), read once per Scheduler and leadership term. Unreadable events count as
/// none: an event twice rather than none.
async fn recorded_ejections(ctx: &Context, scheduler: &Scheduler) -> std::collections::HashSet<String> {
    let uid = scheduler.uid().unwrap_or_default();
    if let Some(known) = lock(&ctx.memo.recorded_ejections).get(&uid) {
        return known.clone();
    }
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(ctx.client.clone(), EVENTS_NAMESPACE);
    let params = ListParams::default().fields(&format!("regarding.uid={uid},reason={}", Reason::KernelEjected));
    let known: std::collections::HashSet<String> = match events.list(&params).await {
        Ok(list) => list
            .items
            .iter()
            .filter_map(|e| {
                // "Node <node>: the kernel ejected <ops> at <time> (<reason>...)"
                let (node, rest) = e.note.as_deref()?.strip_prefix("Node ")?.split_once(": the kernel ejected ")?;
                let time = rest.split_once(" at ")?.1.split_once(" (")?.0;
                Some(ejection_key(node, time))
            })
            .collect(),
        Err(e) => {
            warn!(err = %e, "could not read the recorded KernelEjected events; ejections from before this term may be recorded again");
            return Default::default();
        }
    };
    lock(&ctx.memo.recorded_ejections).insert(uid, known.clone());
    known
}

async fn publish(ctx: &Context, scheduler: &Scheduler, event: &EventSpec) {
    if !ctx.leading() {
        return;
    }
    crate::throttle::before_late_write(&ctx.limiter).await;
    let ev = KubeEvent {
        type_: match event.kind {
            EventKind::Normal => EventType::Normal,
            EventKind::Warning => EventType::Warning,
        },
        reason: event.reason.as_str().to_owned(),
        note: Some(event.message.clone()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &scheduler.object_ref(&())).await {
        warn!(err = %e, reason = %event.reason, "could not record event");
    }
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
