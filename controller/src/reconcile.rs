//! The Scheduler controller: watches, and the reconcile that applies the desired DaemonSet and
//! writes status. The decisions themselves live in [`crate::arbiter`], [`crate::workload`] and
//! [`crate::status`]; this module only moves data between them and the API server.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc::{UnboundedSender, unbounded};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, wait};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::watch;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::api::{Scheduler, SchedulerStatus, reason};
use crate::arbiter::{Arbiter, Changed, Claim};
use crate::config::ControllerFlags;
use crate::kernel::{self, KernelTable};
use crate::pacing::{TokenBucket, retry_delay};
use crate::reports::{ReportStats, ReportsService};
use crate::status::{self, EventKind, EventSpec, Observed};
use crate::workload::{self, AgentSettings, FIELD_MANAGER, WorkloadSettings};

/// Errors that stop the controller from starting.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Name of the Scheduler CRD.
pub const CRD_NAME: &str = "schedulers.sked.schedkit.io";

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
        }
    }
}

/// State shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub flags: ControllerFlags,
    pub settings: WorkloadSettings,
    arbiter: Arc<Mutex<Arbiter>>,
    recorder: Recorder,
    limiter: TokenBucket,
    memo: Arc<Memo>,
    /// Consecutive failures per Scheduler, for the retry delay.
    failures: Mutex<HashMap<String, u32>>,
    /// Latest kernel report per node.
    pub kernel: Arc<KernelTable>,
    pub report_stats: Arc<ReportStats>,
    /// Whether this replica leads; every write checks it.
    leader: watch::Receiver<bool>,
    pub metrics: Arc<crate::metrics::Metrics>,
}

impl Context {
    /// Writes are allowed only while this replica holds the leader lease.
    fn leading(&self) -> bool {
        *self.leader.borrow()
    }
}

/// What the controller remembers of its own writes, dropped when a Scheduler is deleted.
#[derive(Default)]
struct Memo {
    /// The status last written, per Scheduler uid: newer than a cache that may lag behind.
    written: Mutex<HashMap<String, SchedulerStatus>>,
    /// Generation of the DaemonSet last applied, per Scheduler (to log real changes at info).
    applied: Mutex<HashMap<String, i64>>,
}

impl Memo {
    fn forget(&self, scheduler: &Scheduler) {
        if let Some(uid) = scheduler.uid() {
            lock(&self.written).remove(&uid);
        }
        lock(&self.applied).remove(&scheduler.name_any());
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

static RECONCILE_IDS: AtomicU64 = AtomicU64::new(0);

fn reconcile_id() -> String {
    let n = RECONCILE_IDS.fetch_add(1, Ordering::Relaxed);
    let salt = jiff::Timestamp::now().as_nanosecond() as u64;
    format!("{:016x}", salt.rotate_left(17) ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// Runs the controller until `shutdown` resolves, then drains in-flight reconciles.
pub async fn run(
    client: Client,
    flags: ControllerFlags,
    instance: String,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), BoxError> {
    run_with_stats(client, flags, instance, shutdown, Arc::default()).await
}

/// [`run`], counting the reports server's accepted and refused streams in `report_stats`.
pub async fn run_with_stats(
    client: Client,
    flags: ControllerFlags,
    instance: String,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    report_stats: Arc<ReportStats>,
) -> Result<(), BoxError> {
    // One shutdown signal, fanned out to every server and the controller.
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let metrics = Arc::new(crate::metrics::Metrics::new(report_stats.clone()));
    let (ready_tx, ready_rx) = watch::channel(false);
    {
        let (metrics, address, stop) = (metrics.clone(), flags.metrics_bind_address, stopped(stop_rx.clone()));
        tokio::spawn(async move {
            if let Err(e) = crate::metrics::serve(address, metrics, ready_rx, stop).await {
                error!(err = %e, %address, "metrics and health server failed: choose another --metrics-bind-address");
            }
        });
    }

    wait_for_crd(&client).await?;
    ensure_workload_namespace(&client, &flags).await;

    let arbiter = Arc::new(Mutex::new(Arbiter::new()));
    let memo = Arc::new(Memo::default());
    let (trigger_tx, trigger_rx) = unbounded::<ObjectRef<Scheduler>>();
    let (sched_ready_tx, mut sched_ready) = watch::channel(false);
    let (node_ready_tx, mut node_ready) = watch::channel(false);
    let index_tasks = [
        tokio::spawn(index_schedulers(
            Api::all(client.clone()),
            arbiter.clone(),
            memo.clone(),
            metrics.clone(),
            trigger_tx.clone(),
            sched_ready_tx,
        )),
        tokio::spawn(index_nodes(Api::all(client.clone()), arbiter.clone(), trigger_tx.clone(), node_ready_tx)),
    ];
    // Arbitrate only once every Scheduler and Node is known: a partial view could hand a node
    // to the wrong Scheduler and roll its pods for nothing.
    let _ = sched_ready.wait_for(|r| *r).await;
    let _ = node_ready.wait_for(|r| *r).await;
    let (schedulers, nodes) = {
        let arbiter = lock(&arbiter);
        (arbiter.schedulers().count(), arbiter.nodes().count())
    };
    info!(schedulers, nodes, "initial Scheduler and Node lists loaded");
    let _ = ready_tx.send(true);

    // Reconcile only while leading. Each term gets a fresh Controller; triggers from the
    // indexes and the reports server go to the current term, if any.
    let leadership = if flags.leader_elect {
        let identity = format!("{}_{:x}", instance, jiff::Timestamp::now().as_nanosecond() as u64);
        crate::leader::Leadership::elect(
            client.clone(),
            &flags.leader_election_namespace,
            &flags.leader_election_id,
            &identity,
            flags.leader_election_lease_duration,
            flags.leader_election_renew_grace,
        )
        .await
        .map_err(|e| {
            format!(
                "starting leader election on Lease {}/{}: {e}",
                flags.leader_election_namespace, flags.leader_election_id
            )
        })?
    } else {
        crate::leader::Leadership::always()
    };
    let kernel_table = Arc::new(KernelTable::default());
    let reports_task = match (&flags.reports_cert_file, &flags.reports_key_file) {
        (Some(cert), Some(key)) => {
            let read = |p: &std::path::PathBuf, what: &str| {
                std::fs::read(p).map_err(|e| format!("reading the reports server {what} {}: {e}", p.display()))
            };
            let (cert, key) = (read(cert, "certificate")?, read(key, "key")?);
            let service = ReportsService::new(
                client.clone(),
                &flags.workload_namespace,
                &flags.agent_service_account,
                kernel_table.clone(),
                flags.report_stale_after,
                trigger_tx.clone(),
                report_stats.clone(),
                leadership.rx.clone(),
            );
            let address = flags.reports_bind_address;
            info!(%address, "serving agent reports");
            let stop = stopped(stop_rx.clone());
            Some(tokio::spawn(async move {
                if let Err(e) = crate::reports::serve(service, address, cert, key, stop).await {
                    error!(err = %sked_logging::error_chain(&e), %address, "reports server failed");
                }
            }))
        }
        _ => {
            warn!(
                "no --reports-cert-file/--reports-key-file: the reports server is off and no node can be shown as kernel-attached"
            );
            None
        }
    };

    let ctx = Arc::new(Context {
        limiter: TokenBucket::new(
            flags.reconcile_rate_limit_qps,
            flags.reconcile_rate_limit_burst,
            tokio::time::Instant::now(),
        ),
        recorder: Recorder::new(client.clone(), Reporter { controller: "sked".into(), instance: Some(instance) }),
        settings: WorkloadSettings {
            namespace: flags.workload_namespace.clone(),
            agent: AgentSettings {
                image: flags.agent_image.clone(),
                service_account: flags.agent_service_account.clone(),
                reports_address: flags.reports_address.clone(),
                ca_configmap: flags.reports_ca_configmap.clone(),
            },
        },
        client: client.clone(),
        flags: flags.clone(),
        arbiter,
        memo,
        failures: Mutex::default(),
        kernel: kernel_table,
        report_stats,
        leader: leadership.rx.clone(),
        metrics: metrics.clone(),
    });

    let term: Arc<Mutex<Option<UnboundedSender<ObjectRef<Scheduler>>>>> = Arc::default();
    let forward_term = term.clone();
    let forwarder = tokio::spawn(async move {
        let mut triggers = trigger_rx;
        while let Some(target) = triggers.next().await {
            if let Some(tx) = lock(&forward_term).as_ref() {
                let _ = tx.unbounded_send(target);
            }
        }
    });

    loop {
        let mut leader = leadership.rx.clone();
        tokio::select! {
            _ = leader.wait_for(|l| *l) => {}
            () = stopped(stop_rx.clone()) => break,
        }
        if *stop_rx.borrow() {
            break;
        }
        info!("leading: reconciling Schedulers");
        metrics.set_leader(true);
        label_own_pod(&client, true).await;
        let (tx, rx) = unbounded::<ObjectRef<Scheduler>>();
        *lock(&term) = Some(tx);
        let mut lost = leadership.rx.clone();
        let stop = stopped(stop_rx.clone());
        let term_end = async move {
            tokio::select! {
                _ = lost.wait_for(|l| !*l) => {}
                () = stop => {}
            }
        };
        let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &flags.workload_namespace);
        let managed =
            watcher::Config::default().labels(&format!("{}={}", workload::MANAGED_BY_LABEL, workload::MANAGED_BY));
        Controller::new(Api::<Scheduler>::all(client.clone()), watcher::Config::default())
            // Not `owns`: it would look the cluster-scoped owner up in the child's namespace.
            .watches(daemonsets, managed, |ds| owning_scheduler(&ds))
            .reconcile_on(rx)
            .with_config(ControllerConfig::default().concurrency(flags.max_concurrent_reconciles))
            .graceful_shutdown_on(term_end)
            .run(reconcile, error_policy, ctx.clone())
            .for_each(|_| futures::future::ready(()))
            .await;
        *lock(&term) = None;
        metrics.set_leader(false);
        label_own_pod(&client, false).await;
        if *stop_rx.borrow() {
            break;
        }
        warn!("lost leadership: stopped reconciling and writing");
    }
    forwarder.abort();
    leadership.release().await;
    for task in index_tasks {
        task.abort();
    }
    if let Some(task) = reports_task {
        let _ = task.await;
    }
    info!("controller stopped");
    Ok(())
}

/// Creates the workload namespace if needed and sets its Pod Security labels, so the
/// privileged scheduler pods are admitted however sked was installed.
async fn ensure_workload_namespace(client: &Client, flags: &ControllerFlags) {
    let level = flags.workload_namespace_pod_security.as_str();
    if level.is_empty() {
        return;
    }
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns = json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": flags.workload_namespace,
            "labels": {
                "pod-security.kubernetes.io/enforce": level,
                "pod-security.kubernetes.io/audit": level,
                "pod-security.kubernetes.io/warn": level,
            },
        },
    });
    let params = PatchParams::apply(FIELD_MANAGER);
    if let Err(e) = namespaces.patch(&flags.workload_namespace, &params, &Patch::Apply(&ns)).await {
        warn!(err = %e, namespace = %flags.workload_namespace, "could not set the workload namespace's Pod Security labels; scheduler pods may be refused: label it pod-security.kubernetes.io/enforce={level}");
    }
}

/// Label on the leader's pod; the reports Service selects it so agents reach the leader.
pub const LEADER_LABEL: &str = "sked.schedkit.io/leader";

/// Marks (or unmarks) this replica's pod as the leader, when running in a pod (POD_NAME and
/// POD_NAMESPACE set by the downward API).
async fn label_own_pod(client: &Client, leading: bool) {
    let (Ok(name), Ok(namespace)) = (std::env::var("POD_NAME"), std::env::var("POD_NAMESPACE")) else {
        return;
    };
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &namespace);
    let value = if leading { json!("true") } else { serde_json::Value::Null };
    let patch = json!({"metadata": {"labels": {LEADER_LABEL: value}}});
    if let Err(e) = pods.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        warn!(err = %e, pod = %format!("{namespace}/{name}"), "could not update the leader label of this pod; agents may reach a standby and retry");
    }
}

/// Waits until the Scheduler CRD is established, so the first watch does not fail.
async fn wait_for_crd(client: &Client) -> Result<(), BoxError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let established = wait::await_condition(crds, CRD_NAME, wait::conditions::is_crd_established());
    match tokio::time::timeout(Duration::from_secs(5), established).await {
        Ok(result) => {
            result?;
        }
        Err(_) => {
            warn!(
                crd = CRD_NAME,
                "waiting for the Scheduler CRD to be established; apply crds/ (or install the chart) if it is missing"
            );
            let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
            wait::await_condition(crds, CRD_NAME, wait::conditions::is_crd_established()).await?;
        }
    }
    Ok(())
}

fn owning_scheduler(ds: &DaemonSet) -> Option<ObjectRef<Scheduler>> {
    ds.owner_references()
        .iter()
        .find(|o| o.kind == Scheduler::kind(&()) && o.api_version == Scheduler::api_version(&()))
        .map(|o| ObjectRef::new(&o.name))
}

fn claim_of(s: &Scheduler) -> Claim {
    Claim {
        name: s.name_any(),
        uid: s.uid().unwrap_or_default(),
        created: s.creation_timestamp().map_or(0, |t| t.0.as_second()),
        generation: s.metadata.generation.unwrap_or(0),
        selector: s.spec.node_selector.clone(),
    }
}

fn trigger(tx: &UnboundedSender<ObjectRef<Scheduler>>, changed: Changed) {
    for name in changed {
        let _ = tx.unbounded_send(ObjectRef::new(&name));
    }
}

/// Drives the arbiter from one watch: a relist replaces the whole set at once, single events
/// apply one by one; every Scheduler whose placement moved is triggered. `ready` turns true
/// after the first full list.
async fn feed_arbiter<K, S>(
    what: &str,
    events: S,
    tx: UnboundedSender<ObjectRef<Scheduler>>,
    ready: watch::Sender<bool>,
    mut relisted: impl FnMut(Vec<K>) -> Changed,
    mut applied: impl FnMut(K) -> Changed,
    mut deleted: impl FnMut(K) -> Changed,
) where
    S: futures::Stream<Item = Result<Event<K>, watcher::Error>>,
{
    let mut relist: Vec<K> = Vec::new();
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        let changed = match event {
            Ok(Event::Init) => {
                relist.clear();
                Changed::new()
            }
            Ok(Event::InitApply(obj)) => {
                relist.push(obj);
                Changed::new()
            }
            Ok(Event::InitDone) => {
                let changed = relisted(std::mem::take(&mut relist));
                let _ = ready.send(true);
                changed
            }
            Ok(Event::Apply(obj)) => applied(obj),
            Ok(Event::Delete(obj)) => deleted(obj),
            Err(e) => {
                warn!(err = %e, "{what} watch failed; retrying");
                Changed::new()
            }
        };
        trigger(&tx, changed);
    }
}

/// Feeds Scheduler selectors and ages into the arbiter.
async fn index_schedulers(
    api: Api<Scheduler>,
    arbiter: Arc<Mutex<Arbiter>>,
    memo: Arc<Memo>,
    metrics: Arc<crate::metrics::Metrics>,
    tx: UnboundedSender<ObjectRef<Scheduler>>,
    ready: watch::Sender<bool>,
) {
    let events = watcher::watcher(api, watcher::Config::default()).default_backoff();
    feed_arbiter(
        "Scheduler",
        events,
        tx,
        ready,
        |all: Vec<Scheduler>| lock(&arbiter).replace_schedulers(all.iter().map(claim_of).collect()),
        |s| lock(&arbiter).upsert_scheduler(claim_of(&s)),
        |s| {
            memo.forget(&s);
            metrics.forget_scheduler(&s.name_any());
            lock(&arbiter).remove_scheduler(&s.name_any())
        },
    )
    .await;
}

/// Feeds Node labels (metadata only) into the arbiter.
async fn index_nodes(
    api: Api<PartialObjectMeta<Node>>,
    arbiter: Arc<Mutex<Arbiter>>,
    tx: UnboundedSender<ObjectRef<Scheduler>>,
    ready: watch::Sender<bool>,
) {
    let events = watcher::watcher(api, watcher::Config::default()).default_backoff();
    let labels = |n: PartialObjectMeta<Node>| (n.name_any(), n.metadata.labels.unwrap_or_default());
    feed_arbiter(
        "Node",
        events,
        tx,
        ready,
        |all| lock(&arbiter).replace_nodes(all.into_iter().map(labels).collect()),
        |n| {
            let (name, l) = labels(n);
            lock(&arbiter).upsert_node(&name, l)
        },
        |n| lock(&arbiter).remove_node(&n.name_any()),
    )
    .await;
}

async fn reconcile(scheduler: Arc<Scheduler>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.limiter.acquire().await;
    let name = scheduler.name_any();
    let span = info_span!("reconcile", controller = "scheduler", scheduler = %name, reconcileID = %reconcile_id());
    let timeout = ctx.flags.reconcile_timeout;
    let started = std::time::Instant::now();
    let result =
        match tokio::time::timeout(timeout, reconcile_scheduler(&scheduler, &ctx).instrument(span.clone())).await {
            Ok(result) => result,
            Err(_) => Err(Error::Timeout { name: name.clone(), timeout }),
        };
    ctx.metrics.reconciled(started.elapsed(), result.as_ref().err().map(Error::metric_label));
    if result.is_ok() {
        lock(&ctx.failures).remove(&name);
    }
    result
}

async fn reconcile_scheduler(scheduler: &Scheduler, ctx: &Context) -> Result<Action, Error> {
    let name = scheduler.name_any();
    if !ctx.leading() {
        debug!("not leading; no writes");
        return Ok(Action::await_change());
    }
    let generation = scheduler.metadata.generation;
    let placement = {
        let arbiter = lock(&ctx.arbiter);
        if arbiter.generation(&name) != Some(generation.unwrap_or(0)) {
            // The arbiter and this copy disagree on the spec; whichever is behind will trigger
            // another reconcile when it catches up.
            debug!(?generation, known = ?arbiter.generation(&name), "arbiter has not seen this generation yet");
            return Ok(Action::await_change());
        }
        arbiter.placement(&name)
    };

    let namespace = &ctx.settings.namespace;
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), namespace);
    // Until image trust lands, the image is deployed as written.
    let image = scheduler.spec.sched.clone();

    let mut spec_error = None;
    let daemonset = if placement.wants_daemonset() {
        let desired = workload::desired_daemonset(scheduler, &image, &placement.lost_nodes(), &ctx.settings)?;
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
                daemonsets.get_opt(&name).await.map_err(|source| Error::ApplyDaemonSet {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    source,
                })?
            }
            Err(source) => return Err(Error::ApplyDaemonSet { namespace: namespace.clone(), name, source }),
        }
    } else {
        match daemonsets.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {
                info!(daemonset = %format!("{namespace}/{name}"), "deleted DaemonSet: every selected node belongs to an older Scheduler")
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => return Err(Error::DeleteDaemonSet { namespace: namespace.clone(), name, source }),
        }
        lock(&ctx.memo.applied).remove(&name);
        None
    };

    ctx.metrics.set_conflicting_nodes(&name, placement.lost.len());
    let desired = daemonset.as_ref().and_then(|d| d.status.as_ref()).map_or(0, |s| s.desired_number_scheduled);
    let kernel = kernel::summarize(
        &name,
        &placement.owned,
        desired,
        &ctx.kernel.snapshot(),
        std::time::Instant::now(),
        ctx.flags.report_stale_after,
    );
    let uid = scheduler.uid().unwrap_or_default();
    let previous = lock(&ctx.memo.written).get(&uid).cloned().unwrap_or_else(|| scheduler.status_or_default());
    let outcome = status::compute(&Observed {
        generation,
        previous: &previous,
        daemonset: daemonset.as_ref(),
        placement: &placement,
        image: &image,
        spec_error: spec_error.as_deref(),
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
                    reason: reason::STATUS_UPDATE_FAILED.into(),
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
    // Look again when the freshest report would turn stale; everything else is a watch event.
    Ok(match kernel.recheck_in {
        Some(after) => Action::requeue(after + Duration::from_millis(100)),
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
    let ev = KubeEvent {
        type_: match event.kind {
            EventKind::Normal => EventType::Normal,
            EventKind::Warning => EventType::Warning,
        },
        reason: event.reason.clone(),
        note: Some(event.message.clone()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &scheduler.object_ref(&())).await {
        warn!(err = %e, reason = %event.reason, "could not record event");
    }
}

fn error_policy(scheduler: Arc<Scheduler>, err: &Error, ctx: Arc<Context>) -> Action {
    let name = scheduler.name_any();
    let failures = {
        let mut failures = lock(&ctx.failures);
        let n = failures.entry(name.clone()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    let delay = retry_delay(ctx.flags.reconcile_retry_base_delay, ctx.flags.reconcile_retry_max_delay, failures);
    error!(scheduler = %name, err = %err, error_kind = err.metric_label(), failures, retry_in = ?delay, "reconcile failed");
    if failures == 1 && !matches!(err, Error::WriteStatus { .. }) {
        // Record the start of a failure streak once, not every retry.
        let message = err.to_string();
        let ctx = ctx.clone();
        tokio::spawn(async move {
            publish(
                &ctx,
                &scheduler,
                &EventSpec { kind: EventKind::Warning, reason: reason::RECONCILE_FAILED.into(), message },
            )
            .await;
        });
    }
    Action::requeue(delay)
}

/// Resolves on SIGTERM or SIGINT: the one shutdown signal every server and controller shares.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => futures::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = futures::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    info!("shutdown signal received; draining");
}
