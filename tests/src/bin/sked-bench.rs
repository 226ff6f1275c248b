//! `make bench`: sked at fleet scale on the test control plane, in one run (release build).
//!
//! 5,000 Nodes and 200 Schedulers with overlapping selectors (160 select a rack of 25 nodes, 40
//! select a fifth of the fleet by tier; the oldest wins each node, so 165 Schedulers own nodes),
//! two `sked-controller` processes electing a leader, a real OCI registry holding the image, and
//! 5,000 simulated agents: real TLS report streams with tokens bound to the DaemonSets' real pods,
//! all from this process, each from a loopback address of its own (127.1.x.y) as each node's pod
//! has an address of its own, so the servers' per-source handshake limit sees a fleet, not one
//! peer. It prints:
//! - cold-start convergence (every Scheduler's status current, every node labelled with its
//!   owner, every DaemonSet applied), with the reconcile rate limit raised and with default
//!   flags, and the floor: the same API writes issued back to back at the controller's
//!   concurrency against the same server (see `../shared/notes` on reading it);
//! - API writes and registry requests in an idle minute with 5,000 streams open (the leaders'
//!   tag recheck is set below the window, so the window covers one per Scheduler, and the print
//!   says whether it did);
//! - the leader's RSS and CPU at rest;
//! - report sent -> status seen: from a simulated agent sending a node's new verdict to the
//!   bench's watch seeing the Scheduler's KernelAttached condition follow, p50 and p99;
//! - the fleet-wide change of the pods' KernelAttached conditions when the agents first report:
//!   how long until every pod says True, and how many pod status writes it took;
//! - the leader killed, one node's kernel changed at the same moment: time until the standby
//!   took the Lease, until that change shows in its Scheduler's status (written by the new
//!   leader), and until the new leader had acknowledged a report of every node's since it led;
//!   then, once the new leader has reconciled and the stale limit has passed, the streams it
//!   accepted, the agents that reconnected and the TokenReviews it made after the kill (each
//!   agent holds a stream to both replicas, so none should need to reconnect), the condition
//!   changes and events, the new leader's writes by resource and verb (the API server's audit
//!   log; each controller runs as a user of its own) and the pods replaced or restarted (uids
//!   and restart counts): goal none, the changed node's own Scheduler, pod and events apart.
//!
//! The views watch Schedulers, Node labels and DaemonSets; a watch that fails or ends stops
//! the bench with that error rather than computing figures from a frozen view.
//!
//! Sizes come from `BENCH_NODES`, `BENCH_SCHEDULERS`, `BENCH_IDLE_SECONDS` and
//! `BENCH_RECHECK_SECONDS` (defaults 5000, 200, 60, 45) for a quick try at a smaller scale. The
//! controller binary is `SKED_CONTROLLER_BIN`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use sked_controller::Scheduler;
use sked_controller::mutex::lock;
use sked_proto::Verdict;
use sked_tests::agents::{ReportsTls, workspace_binary};
use sked_tests::cluster::{TestCluster, free_port};
use sked_tests::kubelet::set_pod_ready;
use sked_tests::registry::{Cosign, TestRegistry};
use sked_tests::simulated_agents::{AgentFleet, agent_identities};
use sked_tests::{ensure_namespace, ensure_service_account, spec_on};
use tokio::sync::watch;

const NAMESPACE: &str = "sked-system";
const OWNER_LABEL: &str = "sked.schedkit.io/scheduler";
const RACK: &str = "bench.sked/rack";
const TIER: &str = "bench.sked/tier";
const TIERS: usize = 5;
/// Keeps the DaemonSet controller from creating pods while cold starts are measured.
const HOLD_TAINT: &str = "bench.sked/hold";
/// The registry path of the bench image's tag: what `--image-recheck-interval` asks again.
const TAG_PATH: &str = "/v2/bench/scheduler/manifests/v1";
/// The controller's default `--report-stale-after`.
const REPORT_STALE_AFTER: Duration = Duration::from_secs(30);
/// How long any one wait of the bench may take.
const PATIENCE: Duration = Duration::from_secs(900);
/// Writes the controller issues to Nodes at once (its owner-label writer's concurrency).
const NODE_WRITE_CONCURRENCY: usize = 8;
/// The controller's default `--max-concurrent-reconciles`.
const RECONCILE_CONCURRENCY: usize = 2;
/// Concurrency of the bench's own set-up writes (not measured).
const SETUP_CONCURRENCY: usize = 64;

struct Sizes {
    nodes: usize,
    schedulers: usize,
    idle: Duration,
    /// The leaders' `--image-recheck-interval`: shorter than the idle window, so the window
    /// covers every Scheduler's tag recheck at least once (the default, 5 minutes, would not).
    recheck: Duration,
}

impl Sizes {
    fn from_env() -> Result<Self> {
        let var = |name: &str, default: u64| -> Result<u64> {
            std::env::var(name)
                .map_or(Ok(default), |v| v.parse().with_context(|| format!("{name}={v} is not a number")))
        };
        let sizes = Self {
            nodes: var("BENCH_NODES", 5000)? as usize,
            schedulers: var("BENCH_SCHEDULERS", 200)? as usize,
            idle: Duration::from_secs(var("BENCH_IDLE_SECONDS", 60)?),
            recheck: Duration::from_secs(var("BENCH_RECHECK_SECONDS", 45)?),
        };
        if sizes.schedulers < 2 * TIERS || sizes.nodes < sizes.schedulers {
            bail!("BENCH_SCHEDULERS must be at least {} and BENCH_NODES at least BENCH_SCHEDULERS", 2 * TIERS);
        }
        Ok(sizes)
    }

    /// Schedulers that select one rack; the rest (a fifth, at least one per tier) select a tier.
    fn rack_schedulers(&self) -> usize {
        self.schedulers - (self.schedulers / 5).max(TIERS)
    }

    /// The owner each node should get: its rack's Scheduler, or else the oldest Scheduler of its
    /// tier (the first created, and names sort in creation order).
    fn owner(&self, node: usize) -> String {
        let rack = node % self.schedulers;
        if rack < self.rack_schedulers() {
            scheduler_name(rack)
        } else {
            scheduler_name(self.rack_schedulers() + node % TIERS)
        }
    }
}

fn scheduler_name(j: usize) -> String {
    format!("s{j:03}")
}

fn node_name(i: usize) -> String {
    format!("node-{i:05}")
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Prints a step as it starts, with the time since the bench began.
fn step(started: Instant, what: &str) {
    eprintln!("[{:>6.1} s] {what}", started.elapsed().as_secs_f64());
}

async fn run() -> Result<()> {
    let sizes = Sizes::from_env()?;
    let started = Instant::now();
    let mut figures = Figures::default();
    step(started, "starting the test control plane and the registry");
    let cluster = tokio::task::spawn_blocking(TestCluster::start).await??;
    let client = cluster.client().await?;
    let mut dir = tempfile::Builder::new().prefix("sked-bench-").tempdir()?;
    // BENCH_KEEP=1 keeps the controllers' logs (and the rest of the run's files) for a look.
    if std::env::var_os("BENCH_KEEP").is_some() {
        dir.disable_cleanup(true);
        eprintln!("keeping {}", dir.path().display());
    }
    ensure_namespace(&client, NAMESPACE).await?;
    ensure_service_account(&client, NAMESPACE, "sked-agent").await?;
    let registry = TestRegistry::start()?;
    // A signed image behind a tag, as a fleet runs one: the controller resolves the tag and
    // verifies the signature once, and an idle minute shows what that costs at rest.
    let digest = registry.push("bench/scheduler", "v1", "a scheduler image")?;
    let image = format!("{}/bench/scheduler:v1", registry.host);
    let cosign = Cosign::new()?;
    let key = cosign.generate_key_pair("bench")?;
    cosign.sign_with_key(&format!("{}/bench/scheduler@{digest}", registry.host), &key.key)?;
    let tls = ReportsTls::generate(dir.path())?;
    let controller_bin = workspace_binary("sked-controller", "SKED_CONTROLLER_BIN")?;
    let policy = dir.path().join("trust-policy.yaml");
    let key_lines = key.public_pem.lines().map(|l| format!("      {l}\n")).collect::<String>();
    std::fs::write(
        &policy,
        format!("rules:\n  - repository: {}/bench/*\n    publicKey: |\n{key_lines}", registry.host),
    )?;
    // More controller flags for a look inside (e.g. `--log-level=debug`).
    let extra = std::env::var("BENCH_CONTROLLER_ARGS").unwrap_or_default();
    let base_flags: Vec<String> = [
        format!("--trust-policy={}", policy.display()),
        format!("--insecure-registries={}", registry.host),
        format!("--reports-cert-file={}", tls.cert.display()),
        format!("--reports-key-file={}", tls.key.display()),
    ]
    .into_iter()
    .chain(extra.split_whitespace().map(str::to_owned))
    .collect();

    step(started, &format!("creating {} Nodes and {} Schedulers", sizes.nodes, sizes.schedulers));
    create_nodes(&client, &sizes).await?;
    create_schedulers(&client, &sizes, &image).await?;
    let view = ClusterView::watch(client.clone()).await?;

    // Cold start with the limiter out of the way: the figure compared with the floor.
    step(started, "cold start, reconcile rate limit raised");
    let unthrottled = ["--reconcile-rate-limit-qps=1000".to_owned(), "--reconcile-rate-limit-burst=1000".to_owned()];
    let before = cluster.apiserver_requests()?;
    let registry_before = registry.requests();
    let (converged, controller) = cold_start(
        &cluster,
        &controller_bin,
        dir.path(),
        "cold-a",
        &[&base_flags[..], &unthrottled].concat(),
        &view,
        &sizes,
    )
    .await?;
    let writes = writes_between(&before, &cluster.apiserver_requests()?);
    figures.cold_unthrottled = converged;
    figures.cold_writes = writes.clone();
    figures.cold_reconciles = controller.metric("sked_reconciles_total")?;
    figures.cold_registry = registry.requests() - registry_before;
    controller.stop_gracefully()?;

    step(started, "the floor: the same writes, back to back");
    figures.floor = floor(&client, &writes).await?;

    step(started, "cold start, default flags (but the tag recheck, so the idle window covers one)");
    reset(&client, &sizes).await?;
    let recheck = format!("--image-recheck-interval={}s", sizes.recheck.as_secs());
    let replica_flags = [&base_flags[..], &[recheck]].concat();
    let (converged, leader) =
        cold_start(&cluster, &controller_bin, dir.path(), "replica-a", &replica_flags, &view, &sizes).await?;
    figures.cold_default = converged;
    figures.cold_rss_bytes = leader.rss()?.0;
    let standby = ControllerProcess::start(&cluster, &controller_bin, dir.path(), "replica-b", &replica_flags)?;

    step(started, "lifting the hold taint: the DaemonSets' pods are created and bound");
    lift_hold(&client, &sizes).await?;
    let pods = wait_bound_pods(&client, sizes.nodes).await?;
    step(started, "marking pods Ready and issuing pod-bound tokens");
    mark_ready(&client, &pods).await?;
    let agents = agent_identities(&client, NAMESPACE, &pods).await?;

    step(started, &format!("starting {} simulated agents", agents.len()));
    let before_agents = cluster.apiserver_requests()?;
    let fleet =
        AgentFleet::start(agents, vec![leader.reports_address(), standby.reports_address()], &tls.ca, 0).await?;
    let t0 = Instant::now();
    fleet.wait_streaming_to(0).await?;
    fleet.wait_streaming_to(1).await?;
    figures.agents_connected = t0.elapsed();
    view.wait("every owning Scheduler KernelAttached", |v| v.all_attached(&sizes)).await?;
    // The fleet-wide change of the pods' KernelAttached conditions: none to True on every pod.
    wait_pod_conditions(&client, sizes.nodes).await?;
    figures.pod_conditions_true = t0.elapsed();
    figures.pod_condition_writes = pod_status_patches(&writes_between(&before_agents, &cluster.apiserver_requests()?));

    step(started, "an idle minute");
    let requests_before = cluster.apiserver_requests()?;
    let registry_before = registry.requests();
    let rechecks_before = registry.requests_to(TAG_PATH);
    let reconciles_before = leader.metric("sked_reconciles_total")?;
    let (_, cpu_before) = leader.rss()?;
    let (_, standby_cpu_before) = standby.rss()?;
    let idle_started = Instant::now();
    tokio::time::sleep(sizes.idle).await;
    let (rss, cpu_after) = leader.rss()?;
    let (standby_rss, standby_cpu_after) = standby.rss()?;
    figures.idle_writes = writes_between(&requests_before, &cluster.apiserver_requests()?);
    figures.idle_registry = registry.requests() - registry_before;
    figures.idle_rechecks = registry.requests_to(TAG_PATH) - rechecks_before;
    figures.idle_reconciles = leader.metric("sked_reconciles_total")? - reconciles_before;
    figures.idle_timed_rechecks = leader.metric("sked_timed_rechecks_pending")?;
    figures.idle_seconds = idle_started.elapsed().as_secs_f64();
    figures.idle_covers_recheck = idle_started.elapsed() > sizes.recheck;
    figures.rest_rss_bytes = rss;
    figures.rest_cpu = (cpu_after - cpu_before) / figures.idle_seconds;
    figures.peak_rss_bytes = leader.peak_rss()?;
    figures.standby_rss_bytes = standby_rss;
    figures.standby_cpu = (standby_cpu_after - standby_cpu_before) / figures.idle_seconds;

    step(started, "one node's kernel change to its Scheduler's status");
    let reconciles_before = leader.reconcile_durations()?;
    figures.latencies = kernel_change_latencies(&fleet, &view, 50).await?;
    figures.latency_reconciles = ReconcileDurations::between(&reconciles_before, &leader.reconcile_durations()?);

    step(started, "killing the leader");
    // The node whose kernel changes right after the kill: what a user sees of a failover is
    // how long the new leader takes to show a change nobody had reconciled yet.
    let changed = fleet.agents.last().context("no agents")?.clone();
    let changed_scheduler = changed.identity.scheduler.clone();
    let conditions_before = view.conditions()?;
    let events_before = scheduler_events(&client, &changed_scheduler).await?;
    let pods_before = pod_lives(&client).await?;
    let mut leader = leader;
    let (reviews_before, accepted_before) =
        (standby.metric("sked_token_reviews_total")?, standby.metric("sked_report_streams_accepted_total")?);
    leader.kill();
    let (killed, killed_at) = (Instant::now(), jiff::Timestamp::now());
    changed.verdict.send_replace(Verdict::NotAttached);
    standby.wait_leading().await?;
    let leading = Instant::now();
    figures.failover_lease = killed.elapsed();
    // Both timed from the kill, side by side.
    let shown = async {
        view.wait(&format!("{changed_scheduler} KernelAttached=false (by the new leader)"), |v| {
            v.kernel_attached(&changed_scheduler) == Some(false)
        })
        .await?;
        anyhow::Ok(killed.elapsed())
    };
    let fresh = async {
        fleet.wait_acked_since(1, leading).await?;
        anyhow::Ok(killed.elapsed())
    };
    let (shown, fresh) = tokio::join!(shown, fresh);
    (figures.failover_change_shown, figures.failover_fresh) = (shown?, fresh?);
    changed.verdict.send_replace(Verdict::Attached);
    view.wait(&format!("{changed_scheduler} KernelAttached=true again"), |v| {
        v.kernel_attached(&changed_scheduler) == Some(true)
    })
    .await?;
    // A new leader keeps every kernel condition while missing reports are all it lacks, for up
    // to the stale limit from the start of its term: watch past that, so a node that came back
    // late would show; the counters are read then, after the new leader has reconciled.
    tokio::time::sleep(REPORT_STALE_AFTER + Duration::from_secs(5)).await;
    figures.failover_reconnected = fleet.streams_opened_since(1, killed);
    figures.failover_accepted = standby.metric("sked_report_streams_accepted_total")? - accepted_before;
    figures.failover_token_reviews = standby.metric("sked_token_reviews_total")? - reviews_before;
    let unchanged = |key: &(String, String)| key.0 != changed_scheduler;
    let changes = changed_conditions(&conditions_before, &view.conditions()?);
    for (key, before, after) in changes.iter().filter(|(key, ..)| unchanged(key)).take(5) {
        eprintln!("  changed on failover: {key:?}: {before:?} -> {after:?}");
    }
    figures.failover_changes = changes.iter().filter(|(key, ..)| unchanged(key)).count();
    figures.failover_events = scheduler_events(&client, &changed_scheduler).await? - events_before;
    // What the API server's audit log has of the new leader (all it wrote after the kill, the
    // changed node's own Scheduler, pod and events apart) and of the killed one; and the pods,
    // by uid and restarts.
    let (own, after_kill): (Vec<_>, Vec<_>) =
        cluster.audited_writes()?.into_iter().filter(|w| w.received > killed_at).partition(|w| {
            w.name == changed_scheduler
                || w.name == changed.identity.pod
                || (w.resource == "events" && w.name.starts_with(&format!("{changed_scheduler}.")))
        });
    figures.failover_writes = writes_by(&after_kill, "replica-b");
    figures.failover_change_writes = writes_by(&own, "replica-b");
    figures.failover_killed_writes = writes_by(&after_kill, "replica-a").values().sum();
    let pods_after = pod_lives(&client).await?;
    figures.failover_pods_changed =
        pods_before.iter().filter(|(name, life)| pods_after.get(*name) != Some(*life)).count();

    figures.print(&sizes);
    drop(view);
    drop(fleet);
    drop(standby);
    Ok(())
}

// ---- The fleet ---------------------------------------------------------------------------------

async fn create_nodes(client: &Client, sizes: &Sizes) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let resources = json!({"cpu": "8", "memory": "16Gi", "pods": "110"});
    futures::stream::iter(0..sizes.nodes)
        .map(|i| {
            let (nodes, resources) = (nodes.clone(), resources.clone());
            async move {
                let name = node_name(i);
                let node: Node = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": {
                        RACK: format!("r{}", i % sizes.schedulers),
                        TIER: format!("t{}", i % TIERS),
                    }},
                }))?;
                nodes.create(&PostParams::default(), &node).await.with_context(|| format!("creating Node {name}"))?;
                let now = jiff::Timestamp::now().to_string();
                let status = json!({"status": {
                    "capacity": resources, "allocatable": resources,
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}],
                }});
                nodes.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await?;
                // Only the hold taint (the API server put not-ready on the new Node).
                let taints = json!({"spec": {"taints": [{"key": HOLD_TAINT, "effect": "NoSchedule"}]}});
                nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&taints)).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .try_collect::<()>()
        .await
}

async fn create_schedulers(client: &Client, sizes: &Sizes, image: &str) -> Result<()> {
    let api: Api<Scheduler> = Api::all(client.clone());
    // One after the other: creation order (and so age) follows the names.
    for j in 0..sizes.schedulers {
        let selector = if j < sizes.rack_schedulers() {
            (RACK, format!("r{j}"))
        } else {
            (TIER, format!("t{}", (j - sizes.rack_schedulers()) % TIERS))
        };
        let spec = spec_on(image, &[(selector.0, &selector.1)]);
        api.create(&PostParams::default(), &Scheduler::new(&scheduler_name(j), spec)).await?;
    }
    Ok(())
}

async fn for_each_node<F, Fut>(sizes: &Sizes, f: F) -> Result<()>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    futures::stream::iter(0..sizes.nodes)
        .map(|i| f(node_name(i)))
        .buffer_unordered(SETUP_CONCURRENCY)
        .try_collect()
        .await
}

/// Undoes a cold start (the controller stopped): no DaemonSet, no owner label, no status.
async fn reset(client: &Client, sizes: &Sizes) -> Result<()> {
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
    daemonsets.delete_collection(&DeleteParams::default(), &ListParams::default()).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let unlabel = json!({"metadata": {"labels": {OWNER_LABEL: null}}});
    for_each_node(sizes, |name| {
        let (nodes, unlabel) = (nodes.clone(), unlabel.clone());
        async move {
            nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&unlabel)).await?;
            Ok(())
        }
    })
    .await?;
    let schedulers: Api<Scheduler> = Api::all(client.clone());
    for s in schedulers.list(&ListParams::default()).await? {
        schedulers
            .patch_status(&s.name_any(), &PatchParams::default(), &Patch::Merge(&json!({"status": null})))
            .await?;
    }
    Ok(())
}

async fn lift_hold(client: &Client, sizes: &Sizes) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    for_each_node(sizes, |name| {
        let nodes = nodes.clone();
        async move {
            nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&json!({"spec": {"taints": null}}))).await?;
            Ok(())
        }
    })
    .await
}

/// Waits until `count` scheduler pods are bound to nodes.
async fn wait_bound_pods(client: &Client, count: usize) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let bound: Vec<Pod> = pods
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
            .collect();
        if bound.len() >= count {
            return Ok(bound);
        }
        if Instant::now() > deadline {
            bail!("{} of {count} pods bound after {PATIENCE:?}", bound.len());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Waits until every one of `count` scheduler pods carries a True KernelAttached condition.
async fn wait_pod_conditions(client: &Client, count: usize) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let attached = pods
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|p| {
                let conditions = p.status.as_ref().and_then(|s| s.conditions.as_ref());
                conditions.is_some_and(|cs| {
                    cs.iter().any(|c| c.type_ == "sked.schedkit.io/KernelAttached" && c.status == "True")
                })
            })
            .count();
        if attached >= count {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{attached} of {count} pods say KernelAttached=True after {PATIENCE:?}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The pod status patches among `writes` (the controller's pod conditions; the bench's own
/// readiness marks come before and are not counted).
fn pod_status_patches(writes: &BTreeMap<(String, String, String), u64>) -> u64 {
    writes.iter().filter(|((r, s, v), _)| r == "pods" && s == "status" && v == "PATCH").map(|(_, n)| n).sum()
}

async fn mark_ready(client: &Client, pods: &[Pod]) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    futures::stream::iter(pods)
        .map(|p| {
            let api = api.clone();
            async move { set_pod_ready(&api, &p.name_any(), true).await }
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .try_collect()
        .await
}

// ---- Controller processes ----------------------------------------------------------------------

struct ControllerProcess {
    child: Child,
    metrics: u16,
    reports: u16,
}

impl ControllerProcess {
    fn start(cluster: &TestCluster, binary: &Path, dir: &Path, name: &str, flags: &[String]) -> Result<Self> {
        let (metrics, reports) = (free_port()?, free_port()?);
        let child = Command::new(binary)
            // A user of its own, so the audit log tells its writes from the other replica's.
            .env("KUBECONFIG", cluster.user_kubeconfig(name)?)
            .env("POD_NAME", name)
            .args(flags)
            .args([
                "--leader-election-id=sked-bench".to_owned(),
                format!("--metrics-bind-address=127.0.0.1:{metrics}"),
                format!("--reports-bind-address=127.0.0.1:{reports}"),
                format!("--webhook-bind-address=127.0.0.1:{}", free_port()?),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("{name}.log")))?)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        Ok(Self { child, metrics, reports })
    }

    fn reports_address(&self) -> String {
        format!("https://localhost:{}", self.reports)
    }

    /// The replica's /metrics text.
    fn scrape(&self) -> Result<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.metrics))?;
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        Ok(text)
    }

    /// The sum of a metric's samples on /metrics.
    fn metric(&self, name: &str) -> Result<f64> {
        Ok(self
            .scrape()?
            .lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum())
    }

    /// Waits until this replica's `sked_leader` gauge says it leads (polled: the bench reads
    /// the controller from outside, as Prometheus would).
    async fn wait_leading(&self) -> Result<()> {
        let deadline = Instant::now() + PATIENCE;
        while self.metric("sked_leader")? < 1.0 {
            if Instant::now() > deadline {
                bail!("replica not leading after {PATIENCE:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// (resident bytes, CPU seconds used so far).
    fn rss(&self) -> Result<(u64, f64)> {
        let pid = self.child.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // Fields after the command name: utime and stime are the 12th and 13th.
        let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("").split_whitespace().collect();
        let ticks: f64 = fields.get(11..13).unwrap_or_default().iter().filter_map(|f| f.parse::<f64>().ok()).sum();
        // SAFETY: sysconf has no preconditions.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        Ok((self.status_kib("VmRSS:")? * 1024, ticks / per_second))
    }

    /// The replica's reconcile duration histogram: cumulative counts by upper bound (seconds).
    fn reconcile_durations(&self) -> Result<Vec<(f64, f64)>> {
        Ok(self
            .scrape()?
            .lines()
            .filter_map(|l| l.strip_prefix("sked_reconcile_duration_seconds_bucket{le=\""))
            .filter_map(|l| {
                let (le, rest) = l.split_once('"')?;
                let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
                Some((le, rest.rsplit_once(' ')?.1.parse().ok()?))
            })
            .collect())
    }

    fn peak_rss(&self) -> Result<u64> {
        Ok(self.status_kib("VmHWM:")? * 1024)
    }

    fn status_kib(&self, field: &str) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.trim().strip_suffix("kB")?.trim().parse().ok())
            .ok_or_else(|| anyhow!("no {field} in /proc/{}/status", self.child.id()))
    }

    /// SIGTERM, and waits for the process to hand over and exit.
    fn stop_gracefully(mut self) -> Result<()> {
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        self.child.wait()?;
        Ok(())
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts a controller on the fleet and waits until it converged: how long that took.
async fn cold_start(
    cluster: &TestCluster,
    binary: &Path,
    dir: &Path,
    name: &str,
    flags: &[String],
    view: &ClusterView,
    sizes: &Sizes,
) -> Result<(Duration, ControllerProcess)> {
    let t0 = Instant::now();
    let controller = ControllerProcess::start(cluster, binary, dir, name, flags)?;
    view.wait("every Scheduler current, every node labelled, every DaemonSet applied", |v| v.converged(sizes)).await?;
    Ok((t0.elapsed(), controller))
}

// ---- What the bench watches --------------------------------------------------------------------

#[derive(Default)]
struct Seen {
    schedulers: HashMap<String, Scheduler>,
    owners: HashMap<String, String>,
    daemonsets: std::collections::BTreeSet<String>,
    /// The first watch that failed or ended, and how: from then on the view is not the
    /// cluster's, and every figure read from it fails (`ClusterView::wait`, `conditions`).
    failed: Option<String>,
}

impl Seen {
    fn fail(&mut self, watch: &str, how: String) {
        eprintln!("bench: the {watch} watch {how}; the view stops here");
        self.failed.get_or_insert(format!("the {watch} watch {how}"));
    }
}

impl Seen {
    fn converged(&self, sizes: &Sizes) -> bool {
        let current = |s: &Scheduler| {
            s.status.as_ref().and_then(|st| st.observed_generation).is_some_and(|g| Some(g) == s.metadata.generation)
        };
        let owning: std::collections::BTreeSet<String> = (0..sizes.nodes).map(|i| sizes.owner(i)).collect();
        self.schedulers.len() == sizes.schedulers
            && self.schedulers.values().all(current)
            && (0..sizes.nodes).all(|i| self.owners.get(&node_name(i)) == Some(&sizes.owner(i)))
            && owning.is_subset(&self.daemonsets)
    }

    fn all_attached(&self, sizes: &Sizes) -> bool {
        let owning: std::collections::BTreeSet<String> = (0..sizes.nodes).map(|i| sizes.owner(i)).collect();
        owning.iter().all(|name| self.kernel_attached(name) == Some(true))
    }

    fn kernel_attached(&self, scheduler: &str) -> Option<bool> {
        let s = self.schedulers.get(scheduler)?;
        let c = s.status.as_ref()?.conditions.iter().find(|c| c.type_ == "KernelAttached")?;
        Some(c.status == "True")
    }
}

/// Watches of Schedulers, Node labels and DaemonSets, with a version that moves on every event.
struct ClusterView {
    seen: Arc<Mutex<Seen>>,
    version: watch::Receiver<u64>,
    _tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl ClusterView {
    async fn watch(client: Client) -> Result<Self> {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (tx, version) = watch::channel(0u64);
        let tx = Arc::new(tx);
        let bump = |tx: &watch::Sender<u64>| tx.send_modify(|v| *v += 1);
        let mut tasks = Vec::new();
        {
            let (seen, tx) = (seen.clone(), tx.clone());
            let mut events =
                watcher(Api::<Scheduler>::all(client.clone()), watcher::Config::default()).default_backoff().boxed();
            tasks.push(tokio::spawn(async move {
                loop {
                    let event = match events.next().await {
                        Some(Ok(event)) => event,
                        failed => return ended(&seen, &tx, "Scheduler", failed.map(|e| e.map(|_| ()))),
                    };
                    let mut seen = lock(&seen);
                    match event {
                        watcher::Event::Apply(s) | watcher::Event::InitApply(s) => {
                            seen.schedulers.insert(s.name_any(), s);
                        }
                        watcher::Event::Delete(s) => {
                            seen.schedulers.remove(&s.name_any());
                        }
                        watcher::Event::Init | watcher::Event::InitDone => {}
                    }
                    drop(seen);
                    bump(&tx);
                }
            }));
        }
        {
            let (seen, tx) = (seen.clone(), tx.clone());
            let mut events = watcher(Api::<PartialObjectMeta<Node>>::all(client.clone()), watcher::Config::default())
                .default_backoff()
                .touched_objects()
                .boxed();
            tasks.push(tokio::spawn(async move {
                loop {
                    let n = match events.next().await {
                        Some(Ok(n)) => n,
                        failed => return ended(&seen, &tx, "Node", failed.map(|e| e.map(|_| ()))),
                    };
                    let owner = n.labels().get(OWNER_LABEL).cloned();
                    let mut seen = lock(&seen);
                    match owner {
                        Some(owner) => seen.owners.insert(n.name_any(), owner),
                        None => seen.owners.remove(&n.name_any()),
                    };
                    drop(seen);
                    bump(&tx);
                }
            }));
        }
        {
            let (seen, tx) = (seen.clone(), tx.clone());
            let mut events = watcher(Api::<DaemonSet>::namespaced(client, NAMESPACE), watcher::Config::default())
                .default_backoff()
                .boxed();
            tasks.push(tokio::spawn(async move {
                let mut names = std::collections::BTreeSet::new();
                let mut relist = std::collections::BTreeSet::new();
                loop {
                    let event = match events.next().await {
                        Some(Ok(event)) => event,
                        failed => return ended(&seen, &tx, "DaemonSet", failed.map(|e| e.map(|_| ()))),
                    };
                    match event {
                        watcher::Event::Apply(ds) => {
                            names.insert(ds.name_any());
                        }
                        watcher::Event::Delete(ds) => {
                            names.remove(&ds.name_any());
                        }
                        watcher::Event::Init => relist.clear(),
                        watcher::Event::InitApply(ds) => {
                            relist.insert(ds.name_any());
                        }
                        watcher::Event::InitDone => names = std::mem::take(&mut relist),
                    }
                    lock(&seen).daemonsets = names.clone();
                    bump(&tx);
                }
            }));
        }
        Ok(Self { seen, version, _tasks: tasks })
    }

    /// Waits until `done` holds of what is seen; fails at once if a watch failed.
    async fn wait(&self, what: &str, done: impl Fn(&Seen) -> bool) -> Result<()> {
        let mut version = self.version.clone();
        tokio::time::timeout(PATIENCE, async {
            loop {
                let answer = {
                    let seen = lock(&self.seen);
                    seen.failed.clone().map(Err).or_else(|| done(&seen).then_some(Ok(())))
                };
                match answer {
                    Some(Err(failed)) => bail!("{failed}: cannot tell whether {what}"),
                    Some(Ok(())) => return Ok(()),
                    None => version.changed().await.map_err(|_| anyhow!("the watches ended"))?,
                }
            }
        })
        .await
        .map_err(|_| anyhow!("not done after {PATIENCE:?}: {what}"))?
    }

    /// Every Scheduler's conditions: (scheduler, type) to (status, reason, message, since);
    /// an error if a watch failed.
    fn conditions(&self) -> Result<Conditions> {
        let seen = lock(&self.seen);
        if let Some(failed) = &seen.failed {
            bail!("{failed}: the conditions seen are not the cluster's");
        }
        let mut out = BTreeMap::new();
        for (name, s) in &seen.schedulers {
            for c in s.status.iter().flat_map(|st| st.conditions.iter()) {
                out.insert((name.clone(), c.type_.clone()), describe(c));
            }
        }
        Ok(out)
    }
}

impl Drop for ClusterView {
    /// The watches end with the view, before the control plane they watch stops (which they
    /// would otherwise report as a failure).
    fn drop(&mut self) {
        self._tasks.iter().for_each(tokio::task::JoinHandle::abort);
    }
}

/// Records how a watch of `kind` ended (`None`: the stream ended; `Some(Err)`: it failed) and
/// wakes the waiters, which then fail. The watcher would re-list after an error, but the events
/// in between are lost: a figure read across them could be wrong, so the bench says so and stops.
fn ended(seen: &Mutex<Seen>, tx: &watch::Sender<u64>, kind: &str, how: Option<Result<(), watcher::Error>>) {
    let how = match how {
        Some(Err(e)) => format!("failed: {e}"),
        _ => "ended".to_owned(),
    };
    lock(seen).fail(kind, how);
    tx.send_modify(|v| *v += 1);
}

/// Every pod of the fleet by name: its uid and its containers' restarts.
async fn pod_lives(client: &Client) -> Result<BTreeMap<String, (String, i32)>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    Ok(pods
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|p| {
            let restarts = p.status.iter().flat_map(|s| s.container_statuses.iter().flatten()).map(|c| c.restart_count);
            (p.name_any(), (p.uid().unwrap_or_default(), restarts.sum()))
        })
        .collect())
}

/// The writes of `user` among `writes` that change state, counted by (resource, subresource,
/// verb): its Lease renewals and its TokenReviews (counted apart) left out.
fn writes_by(writes: &[sked_tests::cluster::AuditedWrite], user: &str) -> BTreeMap<(String, String, String), u64> {
    let mut out = BTreeMap::new();
    for w in writes.iter().filter(|w| w.user == user && w.resource != "leases" && w.changes_state()) {
        *out.entry((w.resource.clone(), w.subresource.clone(), w.verb.to_uppercase())).or_default() += 1;
    }
    out
}

fn describe(c: &Condition) -> (String, String, String, String) {
    (c.status.clone(), c.reason.clone(), c.message.clone(), c.last_transition_time.0.to_string())
}

type Conditions = BTreeMap<(String, String), (String, String, String, String)>;

/// The conditions that differ: (scheduler, type), before, after.
#[allow(clippy::type_complexity)]
fn changed_conditions(
    before: &Conditions,
    after: &Conditions,
) -> Vec<((String, String), Option<(String, String, String, String)>, Option<(String, String, String, String)>)> {
    let keys: std::collections::BTreeSet<_> = before.keys().chain(after.keys()).collect();
    keys.into_iter()
        .filter(|k| before.get(*k) != after.get(*k))
        .map(|k| (k.clone(), before.get(k).cloned(), after.get(k).cloned()))
        .collect()
}

/// Events about Schedulers other than `except` recorded so far, counting an events.k8s.io
/// series' repeats.
async fn scheduler_events(client: &Client, except: &str) -> Result<i64> {
    let events: Api<Event> = Api::all(client.clone());
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|e| {
            e.regarding
                .as_ref()
                .is_some_and(|r| r.kind.as_deref() == Some("Scheduler") && r.name.as_deref() != Some(except))
        })
        .map(|e| i64::from(e.series.as_ref().map_or(1, |s| s.count)))
        .sum())
}

// ---- The floor ---------------------------------------------------------------------------------

/// Writes counted by (resource, subresource, verb) between two readings of the API server's
/// request counter.
fn writes_between(
    before: &BTreeMap<(String, String, String), u64>,
    after: &BTreeMap<(String, String, String), u64>,
) -> BTreeMap<(String, String, String), u64> {
    after
        .iter()
        .filter(|((_, _, verb), _)| {
            ["POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"].contains(&verb.as_str())
        })
        .filter_map(|(k, n)| {
            let d = n.saturating_sub(before.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// What the floor measured: how long, and which writes it could not replay.
#[derive(Default)]
struct Floor {
    took: Duration,
    replayed: u64,
    skipped: BTreeMap<(String, String, String), u64>,
}

/// Issues the writes a cold start made, back to back, at the controller's concurrency, against
/// the same server: Node label patches (8 at once) alongside DaemonSet applies, Scheduler status
/// writes and events (2 at once), on scratch copies so the fleet is left as it is.
async fn floor(client: &Client, writes: &BTreeMap<(String, String, String), u64>) -> Result<Floor> {
    let scratch = "sked-bench-floor";
    ensure_namespace(client, scratch).await?;
    let count = |resource: &str, subresource: &str| -> u64 {
        writes.iter().filter(|((r, s, v), _)| r == resource && s == subresource && v != "DELETE").map(|(_, n)| *n).sum()
    };
    let node_writes = count("nodes", "");
    let ds_writes = count("daemonsets", "");
    let status_writes = count("schedulers", "status");
    let event_writes = count("events", "");
    let replayable = [("nodes", ""), ("daemonsets", ""), ("schedulers", "status"), ("events", "")];
    let skipped = writes
        .iter()
        .filter(|((r, s, v), _)| {
            !(replayable.contains(&(r.as_str(), s.as_str())) && v != "DELETE") && r != "leases" && r != "tokenreviews"
        })
        .map(|(k, n)| (k.clone(), *n))
        .collect();

    // Scratch copies, made before the clock starts: DaemonSets that select no node, Schedulers
    // that select none, with the statuses the controller wrote.
    let live_ds = Api::<DaemonSet>::namespaced(client.clone(), NAMESPACE).list(&ListParams::default()).await?.items;
    let live_schedulers = Api::<Scheduler>::all(client.clone()).list(&ListParams::default()).await?.items;
    let live_events = Api::<Event>::namespaced(client.clone(), "default").list(&ListParams::default()).await?.items;
    anyhow::ensure!(!live_ds.is_empty() && !live_schedulers.is_empty(), "nothing to copy for the floor");
    let schedulers: Api<Scheduler> = Api::all(client.clone());
    let mut scratch_schedulers = Vec::new();
    for s in &live_schedulers {
        let name = format!("floor-{}", s.name_any());
        let spec = spec_on(&s.spec.sched, &[("bench.sked/never", "1")]);
        schedulers.create(&PostParams::default(), &Scheduler::new(&name, spec)).await?;
        scratch_schedulers.push((name, s.status.clone()));
    }
    let ds_copies: Vec<DaemonSet> = live_ds
        .iter()
        .map(|ds| {
            let mut copy = DaemonSet { metadata: Default::default(), spec: ds.spec.clone(), status: None };
            copy.metadata.name = ds.metadata.name.clone();
            copy.metadata.labels = ds.metadata.labels.clone();
            if let Some(pod) = &mut copy.spec.template.spec {
                pod.node_selector.get_or_insert_default().insert("bench.sked/never".into(), "1".into());
            }
            copy
        })
        .collect();

    let nodes: Api<Node> = Api::all(client.clone());
    let node_names: Vec<String> =
        nodes.list_metadata(&ListParams::default()).await?.items.iter().map(|n| n.name_any()).collect();
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), scratch);
    // Events about cluster-scoped objects live in `default`; these are about the scratch copies.
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let apply = PatchParams::apply("sked-bench-floor").force();

    let started = Instant::now();
    let node_part = futures::stream::iter(0..node_writes as usize)
        .map(|i| {
            let nodes = nodes.clone();
            let name = node_names[i % node_names.len()].clone();
            async move {
                let body = json!({"metadata": {"labels": {"bench.sked/floor": format!("w{i}")}}});
                nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&body)).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(NODE_WRITE_CONCURRENCY)
        .try_collect::<()>();
    // DaemonSet applies, status writes and events, in that mix, two at once.
    let mut objects: Vec<Box<dyn FnOnce() -> futures::future::BoxFuture<'static, Result<()>> + Send>> = Vec::new();
    for i in 0..ds_writes as usize {
        let (api, ds, apply) = (daemonsets.clone(), ds_copies[i % ds_copies.len()].clone(), apply.clone());
        objects.push(Box::new(move || {
            Box::pin(async move {
                api.patch(&ds.name_any(), &apply, &Patch::Apply(&ds)).await?;
                Ok(())
            })
        }));
    }
    for i in 0..status_writes as usize {
        let (api, (name, status)) = (schedulers.clone(), scratch_schedulers[i % scratch_schedulers.len()].clone());
        objects.push(Box::new(move || {
            Box::pin(async move {
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": status}))).await?;
                Ok(())
            })
        }));
    }
    for i in 0..event_writes as usize {
        let api = events.clone();
        let template = live_events.get(i % live_events.len().max(1)).cloned();
        objects.push(Box::new(move || {
            Box::pin(async move {
                let mut e = template.unwrap_or_default();
                e.metadata = Default::default();
                e.metadata.generate_name = Some("floor-".into());
                if e.event_time.is_none() {
                    e.event_time =
                        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(jiff::Timestamp::now()));
                }
                e.reporting_controller.get_or_insert_with(|| "sked-bench".into());
                e.reporting_instance.get_or_insert_with(|| "floor".into());
                e.action.get_or_insert_with(|| "Floor".into());
                e.reason.get_or_insert_with(|| "Floor".into());
                e.type_.get_or_insert_with(|| "Normal".into());
                e.series = None;
                if let Some(r) = e.regarding.as_mut() {
                    r.name = r.name.as_ref().map(|n| format!("floor-{n}"));
                    r.uid = None;
                }
                api.create(&PostParams::default(), &e).await?;
                Ok(())
            })
        }));
    }
    let replayed = node_writes + objects.len() as u64;
    let object_part =
        futures::stream::iter(objects).map(|write| write()).buffer_unordered(RECONCILE_CONCURRENCY).try_collect::<()>();
    tokio::try_join!(node_part, object_part)?;
    let took = started.elapsed();

    for (name, _) in &scratch_schedulers {
        schedulers.delete(name, &DeleteParams::default()).await?;
    }
    daemonsets.delete_collection(&DeleteParams::default(), &ListParams::default()).await?;
    Ok(Floor { took, replayed, skipped })
}

const SAMPLE_SPACING: Duration = Duration::from_millis(500);

/// Flips one node's verdict at a time, `samples` times each way, and times the Scheduler's
/// KernelAttached condition following it.
async fn kernel_change_latencies(fleet: &AgentFleet, view: &ClusterView, samples: usize) -> Result<Vec<Duration>> {
    let mut latencies = Vec::new();
    let stride = (fleet.agents.len() / samples.max(1)).max(1);
    for agent in fleet.agents.iter().step_by(stride).take(samples) {
        let scheduler = agent.identity.scheduler.clone();
        for (verdict, attached) in [(Verdict::NotAttached, false), (Verdict::Attached, true)] {
            let t0 = Instant::now();
            agent.verdict.send_replace(verdict);
            view.wait(&format!("{scheduler} KernelAttached={attached}"), |v| {
                v.kernel_attached(&scheduler) == Some(attached)
            })
            .await?;
            latencies.push(t0.elapsed());
            // Paced below the default reconcile rate limit (5/s), which would otherwise be what
            // is measured: node changes are rare, this is their path's own latency.
            tokio::time::sleep(SAMPLE_SPACING).await;
        }
    }
    Ok(latencies)
}

// ---- Figures -----------------------------------------------------------------------------------

#[derive(Default)]
struct Figures {
    cold_unthrottled: Duration,
    cold_default: Duration,
    cold_writes: BTreeMap<(String, String, String), u64>,
    cold_reconciles: f64,
    cold_rss_bytes: u64,
    floor: Floor,
    agents_connected: Duration,
    idle_writes: BTreeMap<(String, String, String), u64>,
    /// The leader's reconciles in the idle window (a tag recheck reconciles only a Scheduler
    /// whose tag moved).
    idle_reconciles: f64,
    /// Schedulers the leader was to reconcile again on a timer at the end of the window.
    idle_timed_rechecks: f64,
    idle_registry: usize,
    /// Of those, the tag's manifest asked for again (`--image-recheck-interval`, 5 minutes by
    /// default: the one registry cost idle Schedulers have, and the bench's phases are longer).
    idle_rechecks: usize,
    /// Registry requests of the first cold start (every Scheduler's tag resolved, the digest
    /// verified once).
    cold_registry: usize,
    idle_seconds: f64,
    /// Whether the idle window was longer than the leader's tag recheck interval.
    idle_covers_recheck: bool,
    rest_rss_bytes: u64,
    /// The standby at rest: it holds a stream of every agent too.
    standby_rss_bytes: u64,
    standby_cpu: f64,
    rest_cpu: f64,
    peak_rss_bytes: u64,
    latencies: Vec<Duration>,
    /// The leader's reconciles while the latencies were sampled: where a slow sample's time went.
    latency_reconciles: ReconcileDurations,
    /// From the kill to the standby's `sked_leader` gauge at 1: the killed leader's Lease ran out.
    failover_lease: Duration,
    /// From the kill to the new leader's status showing a kernel change made after the kill.
    failover_change_shown: Duration,
    /// From the kill to every node's report acknowledged by the new leader after it led.
    failover_fresh: Duration,
    failover_token_reviews: f64,
    /// Streams the new leader accepted after the kill (goal 0: each agent held one already).
    failover_accepted: f64,
    /// Agents whose stream to the new leader opened after the kill.
    failover_reconnected: usize,
    failover_changes: usize,
    failover_events: i64,
    /// From the agents' start until every pod says KernelAttached=True.
    pod_conditions_true: Duration,
    pod_condition_writes: u64,
    /// The new leader's writes after the kill (the audit log), by (resource, subresource, verb),
    /// its Lease left out.
    failover_writes: BTreeMap<(String, String, String), u64>,
    /// The new leader's writes for the changed node (its Scheduler's status, its pod's
    /// condition, events about its Scheduler).
    failover_change_writes: BTreeMap<(String, String, String), u64>,
    /// The killed leader's writes after the kill.
    failover_killed_writes: u64,
    /// Pods whose uid or restart count differ after the failover, or that are gone.
    failover_pods_changed: usize,
}

/// Reconciles of one phase, from two reads of the reconcile duration histogram.
#[derive(Default)]
struct ReconcileDurations {
    count: f64,
    /// Those over 40 ms, and the upper bound of the slowest one's bucket.
    over_40ms: f64,
    slowest_within: f64,
}

impl ReconcileDurations {
    fn between(before: &[(f64, f64)], after: &[(f64, f64)]) -> Self {
        // Bounds as printed and parsed back (`+Inf` exactly; inf - inf is NaN, never "near").
        let same = |b: f64, le: f64| b == le || (b - le).abs() < 1e-9;
        let at = |h: &[(f64, f64)], le: f64| h.iter().find(|(b, _)| same(*b, le)).map_or(0.0, |(_, n)| *n);
        let count = at(after, f64::INFINITY) - at(before, f64::INFINITY);
        let within = |le: f64| at(after, le) - at(before, le);
        let slowest_within = after.iter().map(|(le, _)| *le).find(|le| within(*le) >= count).unwrap_or(f64::INFINITY);
        Self { count, over_40ms: count - within(0.04), slowest_within }
    }
}

impl Figures {
    fn print(&mut self, sizes: &Sizes) {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let writes = |w: &BTreeMap<(String, String, String), u64>| {
            w.iter()
                .map(|((r, s, v), n)| format!("{v} {r}{}{s}: {n}", if s.is_empty() { "" } else { "/" }))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let total = |w: &BTreeMap<(String, String, String), u64>, leases: bool| -> u64 {
            w.iter().filter(|((r, _, _), _)| (r == "leases") == leases).map(|(_, n)| n).sum()
        };
        self.latencies.sort();
        let pct = |p: f64| -> Duration {
            let n = self.latencies.len();
            if n == 0 {
                return Duration::ZERO;
            }
            self.latencies[((n as f64 * p).ceil() as usize).clamp(1, n) - 1]
        };
        let ratio = self.cold_unthrottled.as_secs_f64() / self.floor.took.as_secs_f64().max(1e-9);
        println!();
        println!(
            "sked bench: {} Nodes, {} Schedulers, {} agent streams (release build)",
            sizes.nodes, sizes.schedulers, sizes.nodes
        );
        println!(
            "cold start, limiter raised        {:>8.1} s   ({} reconciles)",
            self.cold_unthrottled.as_secs_f64(),
            self.cold_reconciles
        );
        println!("  its writes                      {}", writes(&self.cold_writes));
        println!(
            "floor (same writes, back to back) {:>8.1} s   ({} writes replayed)",
            self.floor.took.as_secs_f64(),
            self.floor.replayed
        );
        if !self.floor.skipped.is_empty() {
            println!("  not replayed (Kubernetes' own)  {}", writes(&self.floor.skipped));
        }
        println!("convergence / floor               {ratio:>8.2}    (goal <= 2)");
        println!("cold start, default flags         {:>8.1} s", self.cold_default.as_secs_f64());
        println!(
            "controller RSS after cold start   {:>8.1} MiB ({:.1} KiB per node)",
            mib(self.cold_rss_bytes),
            self.cold_rss_bytes as f64 / 1024.0 / sizes.nodes as f64
        );
        println!("agents connected (first time)     {:>8.1} s", self.agents_connected.as_secs_f64());
        println!(
            "pod conditions: all True          {:>8.1} s after the agents started ({} pod status writes)",
            self.pod_conditions_true.as_secs_f64(),
            self.pod_condition_writes
        );
        println!(
            "idle {:.0} s: API writes              {:>8}    (goal 0) {}",
            self.idle_seconds,
            total(&self.idle_writes, false),
            writes(
                &self.idle_writes.iter().filter(|((r, _, _), _)| r != "leases").map(|(k, v)| (k.clone(), *v)).collect()
            )
        );
        println!("idle: Lease renewals              {:>8}", total(&self.idle_writes, true));
        println!("idle: reconciles                  {:>8}    (goal 0)", self.idle_reconciles);
        println!(
            "idle: Schedulers on a timer       {:>8}    (goal 0; sked_timed_rechecks_pending at the end)",
            self.idle_timed_rechecks
        );
        println!(
            "idle: registry requests           {:>8}    (goal 0 apart from tag rechecks; {} of them rechecks of the tag)",
            self.idle_registry, self.idle_rechecks
        );
        println!(
            "idle: the window {} a tag recheck (--image-recheck-interval={} s)",
            if self.idle_covers_recheck { "covers" } else { "does NOT cover" },
            sizes.recheck.as_secs()
        );
        println!(
            "cold start: registry requests     {:>8}    ({} Schedulers, one signed image)",
            self.cold_registry, sizes.schedulers
        );
        println!(
            "controller at rest: RSS           {:>8.1} MiB (goal <= 256; {:.1} KiB per stream over cold start)",
            mib(self.rest_rss_bytes),
            (self.rest_rss_bytes.saturating_sub(self.cold_rss_bytes)) as f64 / 1024.0 / sizes.nodes as f64
        );
        println!("controller at rest: CPU           {:>8.1} % of one core", self.rest_cpu * 100.0);
        println!("controller peak RSS (VmHWM)       {:>8.1} MiB", mib(self.peak_rss_bytes));
        println!(
            "standby at rest: RSS / CPU        {:>8.1} MiB / {:.1} % of one core (every agent streams to it too)",
            mib(self.standby_rss_bytes),
            self.standby_cpu * 100.0
        );
        // From the simulated agent being handed a new verdict (it sends the report at once) to the
        // bench's watch seeing the Scheduler's KernelAttached condition follow it.
        println!(
            "report sent -> status seen: p50   {:>8.0} ms  ({} samples, {} ms apart; agent's send to the condition in a watch)",
            pct(0.5).as_secs_f64() * 1000.0,
            self.latencies.len(),
            SAMPLE_SPACING.as_millis()
        );
        println!("report sent -> status seen: p99   {:>8.0} ms", pct(0.99).as_secs_f64() * 1000.0);
        let slowest: Vec<String> =
            self.latencies.iter().rev().take(3).map(|l| format!("{:.0}", l.as_secs_f64() * 1000.0)).collect();
        let r = &self.latency_reconciles;
        println!(
            "  slowest samples {} ms; the leader's reconciles meanwhile: {}, {} over 40 ms, the slowest under {:.0} ms",
            slowest.join(", "),
            r.count,
            r.over_40ms,
            r.slowest_within * 1000.0
        );
        println!(
            "failover: the standby leads       {:>8.1} s after the kill (the killed leader's Lease ran out)",
            self.failover_lease.as_secs_f64()
        );
        println!(
            "failover: a change after the kill {:>8.1} s after the kill, in the Scheduler's status (goal at most 15)",
            self.failover_change_shown.as_secs_f64()
        );
        println!(
            "failover: every report fresh      {:>8.1} s after the kill (each node's report acknowledged by the new leader)",
            self.failover_fresh.as_secs_f64()
        );
        println!(
            "failover: streams accepted        {:>8}    (goal 0: each agent held one to the standby; {} agents reconnected)",
            self.failover_accepted, self.failover_reconnected
        );
        println!("failover: TokenReviews            {:>8}    (after the kill)", self.failover_token_reviews);
        println!(
            "failover: condition changes       {:>8}    (goal 0; the changed node's Scheduler apart)",
            self.failover_changes
        );
        println!(
            "failover: events                  {:>8}    (goal 0; about the changed node's apart)",
            self.failover_events
        );
        println!(
            "failover: new leader's writes     {:>8}    (goal 0; the audit log, its Lease apart) {}",
            self.failover_writes.values().sum::<u64>(),
            writes(&self.failover_writes)
        );
        println!(
            "failover: writes for the change   {:>8}    (its Scheduler's status, its pod's condition, events) {}",
            self.failover_change_writes.values().sum::<u64>(),
            writes(&self.failover_change_writes)
        );
        println!("failover: killed leader's writes  {:>8}    (goal 0)", self.failover_killed_writes);
        println!(
            "failover: pods replaced/restarted {:>8}    (goal 0; uids and restart counts)",
            self.failover_pods_changed
        );
    }
}
