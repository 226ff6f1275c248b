//! Starting and running the controller: named parts (servers, index feeds, the reconcile loop)
//! composed under one shutdown; the CRD wait; leadership as a `watch` input that gates writes.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::wait;
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::api::Scheduler;
use crate::config::ControllerFlags;
use crate::crd::CRD_NAME;
use crate::error::BoxError;
use crate::index::{self, Index, Triggers};
use crate::kernel_table::KernelTable;
use crate::leader::Leadership;
use crate::memo::Memo;
use crate::metrics::{Metrics, ReportStats};
use crate::reconcile::{Context, error_policy, reconcile};
use crate::reports::ReportsService;
use crate::throttle::TokenBucket;
use crate::trust::{Trust, TrustRootSource, TrustSettings};
use crate::webhook::WebhookState;
use sked_core::workload::FIELD_MANAGER;

/// Trust settings from the flags.
fn trust_settings(flags: &ControllerFlags) -> TrustSettings {
    TrustSettings {
        trust_root: match &flags.trusted_root {
            Some(path) => TrustRootSource::File(path.clone()),
            None => TrustRootSource::PublicGood { cache_dir: flags.tuf_cache_dir.clone() },
        },
        registry: crate::trust::registry::RegistrySettings {
            insecure: flags.insecure_registries.clone(),
            timeout: flags.registry_timeout,
        },
        secrets_namespace: flags.workload_namespace.clone(),
        tags_fresh_for: flags.image_recheck_interval,
    }
}

/// Runs the controller until `shutdown` resolves, then drains in-flight reconciles.
pub async fn run(
    client: Client,
    flags: ControllerFlags,
    instance: String,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BoxError> {
    run_with_stats(client, flags, instance, shutdown, Arc::default()).await
}

/// [`run`], counting the reports server's accepted and refused streams in `report_stats`.
///
/// The controller is a composition of named parts under one shutdown: the metrics and health
/// server, the admission webhook and the trust policy follower run on every replica from the
/// start; [`control`] loads the cluster, campaigns for leadership and runs the reports server and
/// the reconcile loop. A part that fails (a port taken, a certificate missing) stops them all
/// and the process exits with its error.
pub async fn run_with_stats(
    client: Client,
    flags: ControllerFlags,
    instance: String,
    shutdown: impl Future<Output = ()> + Send + 'static,
    report_stats: Arc<ReportStats>,
) -> Result<(), BoxError> {
    let stop = Stop::on(shutdown);
    let metrics = Arc::new(Metrics::new(report_stats.clone()));
    let (ready_tx, ready_rx) = watch::channel(false);
    // The trust policy is checked before anything else: a file that does not parse stops the
    // controller here, naming the line.
    let loaded = crate::trust::load_policy(flags.trust_policy.as_deref())?;
    info!(logger = "sked-controller/trust", source = %loaded.source, rules = loaded.policy.rules().len(), "trust policy loaded");
    let (policy_tx, policy_rx) = watch::channel(Arc::new(loaded));
    let trust = Arc::new(Trust::new(trust_settings(&flags), policy_rx.clone()));

    let parts = async {
        tokio::try_join!(
            metrics_server(&flags, metrics.clone(), ready_rx, stop.clone()),
            webhook_server(&flags, &client, &trust, &metrics, stop.clone()),
            follow_trust_policy(&flags, policy_tx, &metrics, stop.clone()),
            control(
                Control { client: &client, flags: &flags, instance, trust: &trust, metrics: &metrics, report_stats },
                policy_rx,
                ready_tx,
                stop.clone()
            ),
        )
    };
    // Parts get a bounded time to drain after the shutdown signal: a peer that keeps a
    // connection open must not keep the process alive until it is killed.
    tokio::select! {
        result = parts => { result?; }
        () = async {
            stop.clone().requested().await;
            tokio::time::sleep(DRAIN_WITHIN).await;
        } => warn!(?DRAIN_WITHIN, "stopping without waiting longer for every part to drain"),
    }
    info!("controller stopped");
    Ok(())
}

/// How long the parts may drain after the shutdown signal.
const DRAIN_WITHIN: Duration = Duration::from_secs(8);

/// The one shutdown signal, fanned out to every part.
#[derive(Clone)]
struct Stop(watch::Receiver<bool>);

impl Stop {
    fn on(shutdown: impl Future<Output = ()> + Send + 'static) -> Self {
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            shutdown.await;
            let _ = tx.send(true);
        });
        Self(rx)
    }

    /// Resolves once shutdown began.
    async fn requested(mut self) {
        let _ = self.0.wait_for(|stop| *stop).await;
    }

    fn receiver(&self) -> watch::Receiver<bool> {
        self.0.clone()
    }
}

/// `/metrics`, `/healthz` and `/readyz` (ready once the Scheduler and Node lists are loaded).
async fn metrics_server(
    flags: &ControllerFlags,
    metrics: Arc<Metrics>,
    ready: watch::Receiver<bool>,
    stop: Stop,
) -> Result<(), BoxError> {
    let address = flags.metrics_bind_address;
    crate::metrics::serve(address, metrics, ready, stop.requested()).await.map_err(|e| {
        format!("metrics and health server on {address} failed: {e}; choose another --metrics-bind-address").into()
    })
}

/// The validating admission webhook, on every replica (leader or not), when it has a certificate.
async fn webhook_server(
    flags: &ControllerFlags,
    client: &Client,
    trust: &Arc<Trust>,
    metrics: &Arc<Metrics>,
    stop: Stop,
) -> Result<(), BoxError> {
    let Some(cert_dir) = flags.webhook_cert_dir.clone() else {
        info!(logger = "sked-controller/webhook", "no --webhook-cert-dir: the admission webhook is off");
        return Ok(());
    };
    let state = Arc::new(WebhookState {
        trust: trust.clone(),
        client: client.clone(),
        metrics: metrics.clone(),
        timeout: flags.registry_timeout * 2,
    });
    let address = flags.webhook_bind_address;
    crate::webhook::serve(address, cert_dir, state, stop.receiver())
        .await
        .map_err(|e| format!("admission webhook on {address} (--webhook-bind-address): {e}").into())
}

/// Re-reads the trust policy file when it changes (nothing to follow for the built-in default).
async fn follow_trust_policy(
    flags: &ControllerFlags,
    policy: watch::Sender<Arc<crate::trust::LoadedPolicy>>,
    metrics: &Arc<Metrics>,
    stop: Stop,
) -> Result<(), BoxError> {
    if let Some(path) = flags.trust_policy.clone() {
        let interval = flags.trust_policy_poll_interval;
        crate::trust::follow_policy_file(path, interval, policy, metrics.clone(), stop.receiver()).await;
    }
    Ok(())
}

/// What [`control`] shares with its parts.
struct Control<'a> {
    client: &'a Client,
    flags: &'a ControllerFlags,
    instance: String,
    trust: &'a Arc<Trust>,
    metrics: &'a Arc<Metrics>,
    report_stats: Arc<ReportStats>,
}

/// Waits for the CRD, loads every Scheduler and Node, then campaigns for leadership and runs the
/// index feeds, the reports server, the policy re-verifier and the reconcile loop until
/// shutdown; releases the lease at the end.
async fn control(
    parts: Control<'_>,
    policy: watch::Receiver<Arc<crate::trust::LoadedPolicy>>,
    ready: watch::Sender<bool>,
    stop: Stop,
) -> Result<(), BoxError> {
    let client = parts.client;
    wait_for_crd(client).await?;

    let (index, feeds) = index::index();
    let memo = Arc::new(Memo::default());
    let triggers = Triggers::default();
    let trigger_rx = triggers.stream();
    let (listed_tx, mut listed) = watch::channel(false);
    let feeds = until(
        stop.clone(),
        feeds.run(client.clone(), &parts.flags.workload_namespace, &memo, parts.metrics, triggers.clone(), listed_tx),
    );

    let lead_and_reconcile = async {
        // Arbitrate only once every Scheduler and Node is known: a partial view could hand a
        // node to the wrong Scheduler and roll its pods for nothing.
        tokio::select! {
            loaded = listed.wait_for(|l| *l) => if loaded.is_err() { return Ok(()) },
            () = stop.clone().requested() => return Ok(()),
        }
        let (schedulers, nodes) = index.counts();
        info!(schedulers, nodes, "initial Scheduler and Node lists loaded");
        let _ = ready.send(true);

        // Every replica's kernel table follows the reports of the agents that hold a stream to
        // each replica, leading or not: a new term keeps those that are fresh, and waits for
        // every other node as for a node not heard yet. What an earlier term of this replica
        // wrote is forgotten: the API server says what is written now.
        let kernel = Arc::new(KernelTable::default());
        let term = {
            let (memo, kernel, stale_after) = (memo.clone(), kernel.clone(), parts.flags.report_stale_after);
            move || {
                memo.new_term();
                let forgotten = kernel.forget_for_new_term(std::time::Instant::now(), stale_after);
                debug!(nodes = forgotten, "a new term waits for the nodes whose reports it did not keep");
            }
        };
        let leadership = elect(client, parts.flags, &parts.instance, term).await?;
        let ctx = context(&parts, &index, &memo, &kernel, &triggers, leadership.leader());
        let result = serve(&ctx, &leadership, policy, &triggers, trigger_rx, stop.clone()).await;
        leadership.step_down().await;
        // No longer the leader, whatever ended the term: say so on the pod and in the metric.
        parts.metrics.set_leader(false);
        // Only the leader counts canaries.
        parts.metrics.set_canaries((0, 0));
        label_own_pod(client, false).await;
        result
    };
    // A part that fails (the election, the reports server) stops the process, feeds included.
    tokio::try_join!(Box::pin(feeds), Box::pin(lead_and_reconcile)).map(|_| ())
}

/// The one reconcile context: what every reconcile and every part that writes shares.
fn context(
    parts: &Control<'_>,
    index: &Index,
    memo: &Arc<Memo>,
    kernel: &Arc<KernelTable>,
    triggers: &Triggers,
    leader: crate::leader::Leader,
) -> Arc<Context> {
    let flags = parts.flags;
    Arc::new(Context {
        limiter: TokenBucket::new(
            flags.reconcile_rate_limit_qps,
            flags.reconcile_rate_limit_burst,
            tokio::time::Instant::now(),
        ),
        recorder: Recorder::new(
            parts.client.clone(),
            Reporter { controller: "sked".into(), instance: Some(parts.instance.clone()) },
        ),
        settings: flags.workload_settings(),
        client: parts.client.clone(),
        flags: flags.clone(),
        index: index.clone(),
        memo: memo.clone(),
        failures: Mutex::default(),
        kernel: kernel.clone(),
        report_stats: parts.report_stats.clone(),
        leader,
        metrics: parts.metrics.clone(),
        trust: parts.trust.clone(),
        canaries: seeded_canaries(flags.max_concurrent_canaries, index, triggers),
    })
}

/// A term's canary slots, taken by the Schedulers whose status says their canary runs.
fn seeded_canaries(max: usize, index: &Index, triggers: &Triggers) -> crate::canaries::Canaries {
    let canaries = crate::canaries::Canaries::new(max, triggers.clone());
    let schedulers = index.store().state();
    let running = schedulers.iter().filter(|s| {
        s.status
            .as_ref()
            .and_then(|st| st.rollout.as_ref())
            .is_some_and(|r| r.phase == crate::api::RolloutPhase::Canary)
    });
    canaries.seed(running.map(|s| s.metadata.name.as_deref().unwrap_or_default()));
    canaries
}

/// Runs the reports server, the label keepers, the policy re-verifier, the tags' rechecks and
/// the reconcile loop until shutdown or until one of them fails.
async fn serve(
    ctx: &Arc<Context>,
    leadership: &Leadership,
    policy: watch::Receiver<Arc<crate::trust::LoadedPolicy>>,
    triggers: &Triggers,
    trigger_rx: impl futures::Stream<Item = ObjectRef<Scheduler>> + Send + 'static,
    stop: Stop,
) -> Result<(), BoxError> {
    let (client, flags, index, kernel) = (&ctx.client, &ctx.flags, &ctx.index, &ctx.kernel);
    let leader = || leadership.rx.clone();
    tokio::try_join!(
        reports_server(ctx, triggers, stop.clone()),
        until(stop.clone(), reverify_on_policy_change(policy, index, triggers)),
        until(stop.clone(), mark_leadership(client, flags, &ctx.metrics, &ctx.memo, leader())),
        until(stop.clone(), crate::owner_labels::keep_owner_labels(client.clone(), index.clone(), leadership.leader())),
        until(
            stop.clone(),
            crate::sched_ext_labels::keep_support_labels(
                client.clone(),
                index.clone(),
                kernel.clone(),
                leadership.leader()
            )
        ),
        until(
            stop.clone(),
            crate::reports::expire_stale_reports(
                kernel.clone(),
                index.clone(),
                triggers.clone(),
                flags.report_stale_after
            )
        ),
        until(stop.clone(), publish_reports_ca(client, flags, leader())),
        until(stop.clone(), crate::tag_recheck::recheck_tags(ctx.clone(), triggers.clone(), leader())),
        reconcile_loop(flags, index, ctx.clone(), trigger_rx, leader(), stop.clone()),
        // On shutdown, hand leadership over first, while the rest drains.
        async {
            stop.clone().requested().await;
            leadership.step_down().await;
            Ok(())
        },
    )
    .map(|_| ())
}

/// Runs `part` until shutdown.
async fn until(stop: Stop, part: impl Future<Output = ()>) -> Result<(), BoxError> {
    tokio::select! {
        () = part => {}
        () = stop.requested() => {}
    }
    Ok(())
}

/// Campaigns for the leader Lease, or leads from the start without election.
async fn elect(
    client: &Client,
    flags: &ControllerFlags,
    instance: &str,
    on_gain: impl Fn() + Send + 'static,
) -> Result<Leadership, BoxError> {
    if !flags.leader_elect {
        return Ok(Leadership::always(on_gain));
    }
    if let Some(error) = flags.lease_timing_error() {
        return Err(error.into());
    }
    let identity = format!("{}_{:x}", instance, jiff::Timestamp::now().as_nanosecond() as u64);
    Leadership::elect(
        client.clone(),
        &flags.leader_election_namespace,
        &flags.leader_election_id,
        &identity,
        flags.leader_election_lease_duration,
        flags.leader_election_renew_grace,
        on_gain,
    )
    .await
    .map_err(|e| {
        format!(
            "starting leader election on Lease {}/{}: {e}",
            flags.leader_election_namespace, flags.leader_election_id
        )
        .into()
    })
}

/// Keeps the reports CA published for the agents, when --reports-ca-file names it.
async fn publish_reports_ca(client: &Client, flags: &ControllerFlags, leader: watch::Receiver<bool>) {
    let Some(file) = flags.reports_ca_file.clone() else { return };
    let what = crate::reports_ca::Publication {
        file,
        namespace: flags.workload_namespace.clone(),
        configmap: flags.reports_ca_configmap.clone(),
    };
    crate::reports_ca::keep_published(client.clone(), what, leader).await;
}

/// The gRPC server agents stream kernel reports to, when it has a certificate.
async fn reports_server(ctx: &Context, triggers: &Triggers, stop: Stop) -> Result<(), BoxError> {
    let flags = &ctx.flags;
    let (Some(cert), Some(key)) = (&flags.reports_cert_file, &flags.reports_key_file) else {
        warn!(
            "no --reports-cert-file/--reports-key-file: the reports server is off and no node can be shown as kernel-attached"
        );
        return Ok(());
    };
    let tls = crate::tls::ReloadingCert::load(cert, key)
        .map_err(|e| format!("reports server certificate (--reports-cert-file, --reports-key-file): {e}"))?;
    let settings = crate::reports::ReportsSettings {
        agent_namespace: flags.workload_namespace.clone(),
        agent_service_account: flags.agent_service_account.clone(),
        stale_after: flags.report_stale_after,
    };
    let service = ReportsService::new(
        ctx.client.clone(),
        &settings,
        ctx.kernel.clone(),
        triggers.clone(),
        ctx.report_stats.clone(),
        ctx.leader.receiver(),
    )
    .with_index(ctx.index.clone());
    let address = flags.reports_bind_address;
    info!(%address, "serving agent reports");
    // The certificate is followed for as long as the server runs; the server's end is the part's.
    let follow = tls.clone().follow("reports server", stop.receiver());
    let gate = crate::handshake_gate::HandshakeGate::new("reports", ctx.metrics.clone());
    let serve = crate::reports::serve(service, address, tls, gate, stop.requested());
    tokio::pin!(serve);
    let served = tokio::select! {
        served = &mut serve => served,
        () = follow => serve.await,
    };
    served.map_err(|e| format!("reports server on {address}: {}", sked_logging::error_chain(e.as_ref())).into())
}

/// A new trust policy re-verifies every Scheduler's image.
async fn reverify_on_policy_change(
    mut policy: watch::Receiver<Arc<crate::trust::LoadedPolicy>>,
    index: &Index,
    triggers: &Triggers,
) {
    while policy.changed().await.is_ok() {
        for name in index.scheduler_names() {
            triggers.send(&name);
        }
    }
}

/// Follows this replica's leadership: the leader metric and the leader label on its pod, the
/// workload namespace's Pod Security labels when it starts leading, and forgetting this term's
/// writes when it stops.
async fn mark_leadership(
    client: &Client,
    flags: &ControllerFlags,
    metrics: &Metrics,
    memo: &Memo,
    mut leader: watch::Receiver<bool>,
) {
    let mut leading = false;
    loop {
        let now = *leader.borrow_and_update();
        if now != leading {
            leading = now;
            metrics.set_leader(leading);
            if leading {
                info!("leading: reconciling Schedulers");
            } else {
                // What this term wrote may be overtaken by the next leader's writes: forget it.
                memo.new_term();
                warn!("lost leadership: stopped reconciling and writing");
            }
            label_own_pod(client, leading).await;
            if leading {
                // The leader keeps the workload namespace ready for privileged scheduler pods.
                ensure_workload_namespace(client, flags).await;
            }
        }
        if leader.changed().await.is_err() {
            return;
        }
    }
}

/// The reconcile loop: one `Controller` for the life of the process, fed by the shared
/// Scheduler store, the managed DaemonSets, and the triggers of the indexes, the reports server
/// and policy changes. Every replica runs it; a reconcile writes only while this replica leads
/// (it returns at once otherwise), and gaining leadership reconciles every Scheduler.
async fn reconcile_loop(
    flags: &ControllerFlags,
    index: &Index,
    ctx: Arc<Context>,
    triggers: impl futures::Stream<Item = ObjectRef<Scheduler>> + Send + 'static,
    leader: watch::Receiver<bool>,
    stop: Stop,
) -> Result<(), BoxError> {
    // The leader metric is set here, so no reconcile of the new term runs before it says so (the
    // term itself started before leadership was published: see `elect`).
    let metrics = ctx.metrics.clone();
    let gained = leadership_gained(leader).map(move |()| metrics.set_leader(true));
    // The index feeds trigger every change of a Scheduler itself (after the arbiter saw it), of
    // its DaemonSet and of its pods, so the Controller's own trigger stream stays empty.
    Controller::for_shared_stream(futures::stream::pending(), index.store())
        .reconcile_on(triggers)
        .reconcile_all_on(gained)
        .with_config(ControllerConfig::default().concurrency(flags.max_concurrent_reconciles))
        .graceful_shutdown_on(stop.requested())
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
    Ok(())
}

/// Emits once each time this replica becomes the leader (including at start, if it leads).
fn leadership_gained(leader: watch::Receiver<bool>) -> impl futures::Stream<Item = ()> + Send {
    futures::stream::unfold((leader, false), |(mut leader, mut leading)| async move {
        loop {
            let now = *leader.borrow_and_update();
            let gained = now && !leading;
            leading = now;
            if gained {
                return Some(((), (leader, leading)));
            }
            leader.changed().await.ok()?;
        }
    })
}

/// Creates the workload namespace if needed and sets its Pod Security labels, so the
/// privileged scheduler pods are admitted however sked was installed; a namespace that carries
/// them already is not written (a new leader writes nothing it need not).
async fn ensure_workload_namespace(client: &Client, flags: &ControllerFlags) {
    let level = flags.workload_namespace_pod_security.as_str();
    if level.is_empty() {
        return;
    }
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let modes = ["enforce", "audit", "warn"].map(|mode| format!("pod-security.kubernetes.io/{mode}"));
    // Labelled already (by an earlier leader, or the chart): a new leader writes nothing.
    if let Ok(Some(existing)) = namespaces.get_opt(&flags.workload_namespace).await {
        let labels = existing.metadata.labels.unwrap_or_default();
        if modes.iter().all(|m| labels.get(m).map(String::as_str) == Some(level)) {
            return;
        }
    }
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
