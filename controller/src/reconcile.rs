//! The reconcile of one Scheduler: read its spec and placement from the index, apply the desired
//! DaemonSet (server-side apply), fold DaemonSet status and kernel reports into the Scheduler's
//! status, and record state-change events. The decisions live in [`crate::arbiter`],
//! [`crate::workload`], [`crate::status`] and [`crate::kernel`]; startup and leadership in
//! [`crate::manager`].

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::watch;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::api::{Reason, Scheduler, SchedulerStatus};
use crate::config::ControllerFlags;
use crate::index::Index;
use crate::kernel::{self, KernelTable};
use crate::memo::Memo;
use crate::metrics::{Metrics, ReportStats};
use crate::pacing::{TokenBucket, retry_delay};
use crate::status::{self, EventKind, EventSpec, Observed};
use crate::sync::lock;
use crate::trust::{Trust, TrustError};
use crate::workload::{self, FIELD_MANAGER, WorkloadSettings};

/// Why a reconcile failed. Each variant maps to a metric label.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("applying DaemonSet {namespace}/{name}: {source}")]
    ApplyDaemonSet { namespace: String, name: String, source: kube::Error },
    #[error("deleting DaemonSet {namespace}/{name}: {source}")]
    DeleteDaemonSet { namespace: String, name: String, source: kube::Error },
    #[error("writing status of Scheduler {name}: {source}")]
    WriteStatus { name: String, source: kube::Error },
    #[error(
        "reconciling Scheduler {name} took longer than --reconcile-timeout ({timeout:?}); it was cancelled and will be retried"
    )]
    Timeout { name: String, timeout: Duration },
    #[error(transparent)]
    Identity(#[from] workload::MissingIdentity),
    #[error("image of Scheduler {name} refused: {source}")]
    Image { name: String, source: TrustError },
}

impl Error {
    /// Low-cardinality label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::ApplyDaemonSet { .. } => "apply_daemonset",
            Error::DeleteDaemonSet { .. } => "delete_daemonset",
            Error::WriteStatus { .. } => "write_status",
            Error::Timeout { .. } => "timeout",
            Error::Identity(_) => "identity",
            Error::Image { .. } => "image_verification",
        }
    }
}

/// State shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub flags: ControllerFlags,
    pub settings: WorkloadSettings,
    /// The Schedulers and their placements.
    pub(crate) index: Index,
    pub(crate) recorder: Recorder,
    pub(crate) limiter: TokenBucket,
    pub(crate) memo: Arc<Memo>,
    /// Consecutive failures per Scheduler, for the retry delay.
    pub(crate) failures: Mutex<HashMap<String, u32>>,
    /// Latest kernel report per node.
    pub kernel: Arc<KernelTable>,
    pub report_stats: Arc<ReportStats>,
    /// Whether this replica leads; every write checks it.
    pub(crate) leader: watch::Receiver<bool>,
    pub metrics: Arc<Metrics>,
    /// Decides which images may run and resolves them to digests.
    pub trust: Arc<Trust>,
}

impl Context {
    /// Writes are allowed only while this replica holds the leader lease.
    fn leading(&self) -> bool {
        *self.leader.borrow()
    }
}

static RECONCILE_IDS: AtomicU64 = AtomicU64::new(0);

fn reconcile_id() -> String {
    let n = RECONCILE_IDS.fetch_add(1, Ordering::Relaxed);
    let salt = jiff::Timestamp::now().as_nanosecond() as u64;
    format!("{:016x}", salt.rotate_left(17) ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

pub(crate) async fn reconcile(scheduler: Arc<Scheduler>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.leading() {
        // A standby spends no rate-limit tokens; gaining leadership reconciles everything.
        return Ok(Action::await_change());
    }
    ctx.limiter.acquire().await;
    let name = scheduler.name_any();
    let span = info_span!("reconcile", controller = "scheduler", scheduler = %name, reconcileID = %reconcile_id());
    let timeout = ctx.flags.reconcile_timeout;
    let started = std::time::Instant::now();
    let bounded = tokio::time::timeout(timeout, reconcile_scheduler(&name, &ctx).instrument(span.clone()));
    let result = tokio::select! {
        result = bounded => match result {
            Ok(result) => result,
            Err(_) => Err(Error::Timeout { name: name.clone(), timeout }),
        },
        // Leadership lost mid-reconcile: abandon it; the new leader reconciles from scratch.
        () = crate::leader::lost(ctx.leader.clone()) => {
            debug!(parent: &span, "leadership lost; reconcile abandoned");
            Ok(Action::await_change())
        }
    };
    ctx.metrics.reconciled(started.elapsed(), result.as_ref().err().map(Error::metric_label));
    if result.is_ok() {
        lock(&ctx.failures).remove(&name);
    }
    result
}

async fn reconcile_scheduler(name: &str, ctx: &Context) -> Result<Action, Error> {
    if !ctx.leading() {
        debug!("not leading; no writes");
        return Ok(Action::await_change());
    }
    // The spec and the placement computed from it, read together.
    let Some((scheduler, placement)) = ctx.index.snapshot(name) else {
        debug!("Scheduler is gone");
        return Ok(Action::await_change());
    };
    let scheduler = scheduler.as_ref();
    if scheduler.metadata.deletion_timestamp.is_some() {
        // Being deleted: the garbage collector removes its DaemonSet; nothing is applied again.
        debug!("Scheduler is being deleted; nothing to apply");
        return Ok(Action::await_change());
    }
    let name = name.to_owned();
    let generation = scheduler.metadata.generation;

    let namespace = &ctx.settings.namespace;
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), namespace);
    let get_current = || async {
        daemonsets.get_opt(&name).await.map_err(|source| Error::ApplyDaemonSet {
            namespace: namespace.clone(),
            name: name.clone(),
            source,
        })
    };

    // The trust policy admits the image (whether or not the Scheduler has nodes, so its status
    // always tells) before anything is deployed; a refusal leaves the DaemonSet as it is.
    let secrets = scheduler.spec.pull_secret_names();
    let admission = ctx.trust.admit(&ctx.client, &scheduler.spec.sched, &secrets).await;
    ctx.metrics.verified("reconcile", crate::trust::outcome_label(&admission));
    if let Err(e) = &admission {
        warn!(image = %scheduler.spec.sched, err = %e, "image refused; the DaemonSet is left as it is");
    }

    let mut spec_error = None;
    let daemonset = match (&admission, placement.wants_daemonset()) {
        (Ok(admitted), true) => {
            let image = &admitted.image;
            let desired = workload::desired_daemonset(scheduler, image, &placement.lost_nodes(), &ctx.settings)?;
            if !ctx.leading() {
                return Ok(Action::await_change());
            }
            match daemonsets.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&desired)).await {
                Ok(applied) => {
                    let generation = applied.metadata.generation.unwrap_or(0);
                    let previous = lock(&ctx.memo.applied).insert(name.clone(), generation);
                    if previous != Some(generation) {
                        info!(daemonset = %format!("{namespace}/{name}"), image = %image, lost_nodes = placement.lost.len(), "applied DaemonSet");
                    }
                    Some(applied)
                }
                Err(kube::Error::Api(status)) if status.code == 422 => {
                    // The spec passed the CRD schema but the DaemonSet built from it does not:
                    // report it on the Scheduler and wait for the user to change the spec.
                    warn!(err = %status.message, "API server refused the DaemonSet built from this spec");
                    spec_error = Some(status.message.clone());
                    get_current().await?
                }
                Err(source) => return Err(Error::ApplyDaemonSet { namespace: namespace.clone(), name, source }),
            }
        }
        (Err(_), true) => get_current().await?,
        (_, false) => {
            if !ctx.leading() {
                return Ok(Action::await_change());
            }
            match daemonsets.delete(&name, &DeleteParams::background()).await {
                Ok(_) => {
                    info!(daemonset = %format!("{namespace}/{name}"), "deleted DaemonSet: every selected node belongs to an older Scheduler")
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(source) => return Err(Error::DeleteDaemonSet { namespace: namespace.clone(), name, source }),
            }
            lock(&ctx.memo.applied).remove(&name);
            None
        }
    };

    ctx.metrics.set_conflicting_nodes(&name, placement.lost.len());
    let desired = daemonset.as_ref().and_then(|d| d.status.as_ref()).map_or(0, |s| s.desired_number_scheduled);
    let now = std::time::Instant::now();
    let stale_after = ctx.flags.report_stale_after;
    // The nodes that run this Scheduler's pod (and are still its own).
    let scheduled: BTreeSet<String> =
        ctx.index.scheduled_nodes(&name).intersection(&placement.owned).cloned().collect();
    let mut kernel =
        ctx.kernel.read(|reports| kernel::summarize(&name, &scheduled, desired, reports, now, stale_after));
    // Early in a leadership term the table holds only the agents that reconnected so far: keep
    // the kernel view as it was until every node reported or one heartbeat passed.
    let grace_left = ctx.flags.agent_heartbeat_interval.saturating_sub(ctx.memo.term_age());
    if kernel.unreported > 0 && !grace_left.is_zero() {
        kernel.settled = false;
    }
    let uid = scheduler.uid().unwrap_or_default();
    let previous = lock(&ctx.memo.written).get(&uid).cloned().unwrap_or_else(|| scheduler.status_or_default());
    let outcome = status::compute(&Observed {
        generation,
        previous: &previous,
        daemonset: daemonset.as_ref(),
        placement: &placement,
        image: admission.as_ref().ok().map(|a| a.image.as_str()),
        spec_error: spec_error.as_deref(),
        image_error: admission.as_ref().err().map(ToString::to_string).as_deref(),
        kernel: &kernel,
        now: Time(jiff::Timestamp::now()),
    });

    if !ctx.leading() {
        // Leadership was lost during this reconcile: the new leader writes the status.
        return Ok(Action::await_change());
    }
    if outcome.status != previous {
        if let Err(source) = write_status(ctx, scheduler, &outcome.status).await {
            publish(
                ctx,
                scheduler,
                &EventSpec {
                    kind: EventKind::Warning,
                    reason: Reason::StatusUpdateFailed,
                    message: format!("Could not save the Scheduler's status: {source}"),
                },
            )
            .await;
            return Err(Error::WriteStatus { name, source });
        }
        lock(&ctx.memo.written).insert(uid, outcome.status.clone());
    } else {
        debug!("reconciled; nothing changed");
    }
    for event in outcome.event.iter().chain(&outcome.kernel_event) {
        info!(reason = %event.reason, kind = ?event.kind, note = %event.message, "state changed");
        publish(ctx, scheduler, event).await;
    }
    let admitted = match admission {
        Ok(admitted) => admitted,
        // Retried with backoff by `error_policy`; the Warning event above already says why.
        Err(source) => return Err(Error::Image { name, source }),
    };
    // Look again when the freshest report would turn stale, and periodically when the image is
    // a tag that may move; everything else is a watch event.
    let tag_recheck = admitted.from_tag.then_some(ctx.flags.image_recheck_interval);
    let kernel_recheck = kernel.recheck_in.map(|after| after + Duration::from_millis(100));
    let grace_recheck = (!kernel.settled).then_some(grace_left + Duration::from_millis(100));
    Ok(match kernel_recheck.into_iter().chain(grace_recheck).chain(tag_recheck).min() {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
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

async fn publish(ctx: &Context, scheduler: &Scheduler, event: &EventSpec) {
    if !ctx.leading() {
        return;
    }
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

pub(crate) fn error_policy(scheduler: Arc<Scheduler>, err: &Error, ctx: Arc<Context>) -> Action {
    let name = scheduler.name_any();
    let failures = {
        let mut failures = lock(&ctx.failures);
        let n = failures.entry(name.clone()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    let delay = retry_delay(ctx.flags.reconcile_retry_base_delay, ctx.flags.reconcile_retry_max_delay, failures);
    error!(scheduler = %name, err = %err, error_kind = err.metric_label(), failures, retry_in = ?delay, "reconcile failed");
    // A refused image has its own Warning (ImageVerificationFailed) from the reconcile.
    if failures == 1 && !matches!(err, Error::WriteStatus { .. } | Error::Image { .. }) {
        // Record the start of a failure streak once, not every retry.
        let message = err.to_string();
        let ctx = ctx.clone();
        tokio::spawn(async move {
            publish(
                &ctx,
                &scheduler,
                &EventSpec { kind: EventKind::Warning, reason: Reason::ReconcileFailed, message },
            )
            .await;
        });
    }
    Action::requeue(delay)
}
