//! Starting and running the controller: one shutdown signal fanned out to every server and
//! the reconcile loop; the CRD wait; the metrics, health and reports servers; and leadership
//! terms (the reconcile loop runs only while this replica holds the lease).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc::{UnboundedSender, unbounded};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{wait, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::api::Scheduler;
use crate::arbiter::Arbiter;
use crate::config::ControllerFlags;
use crate::crd::CRD_NAME;
use crate::error::BoxError;
use crate::index::{index_nodes, index_schedulers};
use crate::kernel::KernelTable;
use crate::memo::Memo;
use crate::metrics::ReportStats;
use crate::pacing::TokenBucket;
use crate::reconcile::{Context, error_policy, reconcile};
use crate::reports::ReportsService;
use crate::sync::lock;
use crate::trust::{Trust, TrustRootSource, TrustSettings};
use crate::webhook::WebhookState;
use crate::workload::{self, AgentSettings, FIELD_MANAGER, WorkloadSettings};

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
    }
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

    // The trust policy is checked before anything else: a file that does not parse stops the
    // controller here, naming the line.
    let loaded = crate::trust::load_policy(flags.trust_policy.as_deref())?;
    info!(logger = "trust", source = %loaded.source, rules = loaded.policy.rules().len(), "trust policy loaded");
    let (policy_tx, policy_rx) = watch::channel(Arc::new(loaded));
    let trust = Arc::new(Trust::new(trust_settings(&flags), policy_rx.clone()));
    if let Some(path) = flags.trust_policy.clone() {
        tokio::spawn(crate::trust::follow_policy_file(
            path,
            flags.trust_policy_poll_interval,
            policy_tx,
            metrics.clone(),
            stop_rx.clone(),
        ));
    }
    // Every replica serves the webhook, leader or not.
    let webhook_task = flags.webhook_cert_dir.clone().map(|cert_dir| {
        let state = Arc::new(WebhookState {
            trust: trust.clone(),
            client: client.clone(),
            metrics: metrics.clone(),
            timeout: flags.registry_timeout * 2,
        });
        let (address, stop) = (flags.webhook_bind_address, stop_rx.clone());
        tokio::spawn(async move {
            if let Err(e) = crate::webhook::serve(address, cert_dir, state, stop).await {
                error!(logger = "webhook", err = %e, %address, "admission webhook failed");
            }
        })
    });
    if webhook_task.is_none() {
        info!(logger = "webhook", "no --webhook-cert-dir: the admission webhook is off");
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
            let tls = crate::tls::ReloadingCert::load(cert, key)
                .map_err(|e| format!("reports server certificate (--reports-cert-file, --reports-key-file): {e}"))?;
            tokio::spawn(tls.clone().follow("reports server", stop_rx.clone()));
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
                if let Err(e) = crate::reports::serve(service, address, tls, stop).await {
                    error!(err = %sked_logging::error_chain(e.as_ref()), %address, "reports server failed");
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

    // A new policy re-verifies every Scheduler's image.
    let reverify = {
        let (arbiter, trigger_tx, mut policy) = (arbiter.clone(), trigger_tx.clone(), policy_rx);
        tokio::spawn(async move {
            while policy.changed().await.is_ok() {
                let names: Vec<String> = lock(&arbiter).schedulers().map(str::to_owned).collect();
                for name in names {
                    let _ = trigger_tx.unbounded_send(ObjectRef::new(&name));
                }
            }
        })
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
        trust,
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
    reverify.abort();
    leadership.release().await;
    for task in index_tasks {
        task.abort();
    }
    if let Some(task) = reports_task {
        let _ = task.await;
    }
    if let Some(task) = webhook_task {
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

/// The Scheduler owning a DaemonSet (the owner is cluster-scoped, so the namespace is dropped).
fn owning_scheduler(ds: &DaemonSet) -> Option<ObjectRef<Scheduler>> {
    ds.owner_references()
        .iter()
        .find(|o| o.kind == Scheduler::kind(&()) && o.api_version == Scheduler::api_version(&()))
        .map(|o| ObjectRef::new(&o.name))
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
