//! `make bench-upgrade`: what an upgrade of sked to a new agent image restarts in a fleet, and how
//! long the fleet takes to carry it out. On the test control plane: real Nodes (5,000 by
//! default), Schedulers (200) each over a pool of its own, the real DaemonSet controller and
//! kube-scheduler making and binding the pods, a simulated agent per pod (see
//! `sked_tests::simulated_agents`) and the kubelets played by this bench (a pod is Ready once
//! bound, and a deleted pod is gone at once, its agent stopped).
//!
//! A first `sked-controller` deploys every Scheduler (no canary limit, one wave). Then the
//! Schedulers get the rollout an upgrade is paced by (a canary of one, waves up to
//! `maxUnavailable` 25%, `BENCH_BAKE_SECONDS` bakes, default 1), and the controller is replaced,
//! as `helm upgrade` replaces its pod, by one with a new `--agent-image` and default flags (one
//! canary at a time across Schedulers, 5 reconciles a second). The bench plays the fleet until
//! every Scheduler is Complete on the new agent with every node attached, and prints: the
//! pods the upgrade deleted (each node's scheduler restarts once), the time it took, the
//! hand-off between one Scheduler's canary and the next, the most canaries seen at once, the
//! new controller's writes and its peak memory.
//!
//! `BENCH_NODES` and `BENCH_SCHEDULERS` try another fleet; the controller binary is
//! `SKED_CONTROLLER_BIN`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use sked_controller::api::{RolloutPhase, RolloutSpec};
use sked_controller::mutex::lock;
use sked_controller::{Scheduler, SchedulerSpec};
use sked_tests::agents::ReportsTls;
use sked_tests::cluster::{TestCluster, free_port};
use sked_tests::controller_process::ControllerProcess;
use sked_tests::kubelet::set_pod_ready;
use sked_tests::simulated_agents::{AgentFleet, agent_identities};
use sked_tests::{create_ready_node, ensure_namespace, ensure_service_account};

const NAMESPACE: &str = "sked-system";
const POOL: &str = "bench.sked/pool";
const IMAGE: &str = "bench.example/scheduler:v1";
const AGENT_BEFORE: &str = "bench.example/sked-agent:v1";
const AGENT_AFTER: &str = "bench.example/sked-agent:v2";
/// The replica that carries out the upgrade: the audit log's user for its writes.
const AFTER: &str = "sked-bench-upgraded";
/// How long the first deployment, and then the upgrade, may take before the bench gives up.
const PATIENCE: Duration = Duration::from_secs(4 * 3600);
/// Concurrency of the bench's own writes (Nodes, pod readiness): the kubelets of a fleet.
const KUBELETS: usize = 64;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sked-bench-upgrade: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn setting(name: &str, default: usize) -> Result<usize> {
    std::env::var(name)
        .map_or(Ok(default), |v| v.trim().parse().with_context(|| format!("{name}: {v:?} is not a number")))
}

/// A pod deletion the kubelets saw: when, and on which node.
struct Deletion {
    at: Instant,
    node: String,
}

async fn run() -> Result<()> {
    let nodes = setting("BENCH_NODES", 5000)?;
    let count = setting("BENCH_SCHEDULERS", 200)?.clamp(1, nodes.max(1));
    let bake = i32::try_from(setting("BENCH_BAKE_SECONDS", 1)?)?;
    let started = Instant::now();
    let say = |what: String| eprintln!("[{:>5.0}s] {what}", started.elapsed().as_secs_f64());
    say("starting the test control plane".into());
    let cluster = tokio::task::spawn_blocking(TestCluster::start).await??;
    let client = cluster.client().await?;
    ensure_namespace(&client, NAMESPACE).await?;
    ensure_service_account(&client, NAMESPACE, "sked-agent").await?;
    let dir = tempfile::Builder::new().prefix("sked-bench-upgrade-").tempdir()?;
    let tls = ReportsTls::generate(dir.path())?;
    let reports = free_port()?;
    let serving = [
        format!("--reports-cert-file={}", tls.cert.display()),
        format!("--reports-key-file={}", tls.key.display()),
        format!("--reports-bind-address=127.0.0.1:{reports}"),
    ];
    let before = [format!("--agent-image={AGENT_BEFORE}"), "--max-concurrent-canaries=0".into()];
    sked_tests::controller_process::webhook_cert(dir.path())?;
    let mut first =
        ControllerProcess::start(&cluster, dir.path(), "sked-bench-first", &[&serving[..], &before].concat())?;
    let deletions = Arc::new(Mutex::new(Vec::new()));
    // Played beside each wait, in this task.
    let kubelets =
        play_kubelets(client.clone(), format!("https://localhost:{reports}"), tls.ca.clone(), deletions.clone());
    tokio::pin!(kubelets);

    say(format!("{nodes} Ready Nodes in {count} pools, and a Scheduler over each"));
    create_fleet(&client, nodes, count).await?;
    let pacing = RolloutSpec {
        canary: Some(1),
        max_unavailable: Some(IntOrString::String("100%".into())),
        bake_seconds: Some(1),
        ..RolloutSpec::default()
    };
    create_schedulers(&client, count, &pacing).await?;
    let setup = tokio::select! {
        done = wait_fleet(&client, nodes, count, AGENT_BEFORE, |_| {}) => done?,
        stopped = &mut kubelets => bail!("the kubelets' player stopped: {stopped:?}"),
    };
    say(format!("first deployment Complete in {:.0}s", setup.as_secs_f64()));

    let pacing = RolloutSpec {
        canary: Some(1),
        max_unavailable: Some(IntOrString::String("25%".into())),
        bake_seconds: Some(bake),
        ..RolloutSpec::default()
    };
    set_pacing(&client, count, &pacing).await?;
    // `helm upgrade`: the controller's pod is replaced (SIGTERM, and it hands the Lease over),
    // the new one runs the new release's flags, defaults otherwise.
    first.signal(libc::SIGTERM)?;
    tokio::task::spawn_blocking(move || first.child.wait()).await??;
    let upgraded_at = Instant::now();
    let after = [
        format!("--agent-image={AGENT_AFTER}"),
        "--reconcile-rate-limit-qps=5".into(),
        "--leader-election-lease-duration=10s".into(),
        "--leader-election-renew-grace=7s".into(),
    ];
    let upgraded = ControllerProcess::start(&cluster, dir.path(), AFTER, &[&serving[..], &after].concat())?;
    say(format!(
        "controller replaced with agent image {AGENT_AFTER}; rollout canary 1, maxUnavailable 25%, bake {bake}s"
    ));
    let mut most_canaries = 0;
    let took = tokio::select! {
        done = wait_fleet(&client, nodes, count, AGENT_AFTER, |canaries| most_canaries = most_canaries.max(canaries)) => done?,
        stopped = &mut kubelets => bail!("the kubelets' player stopped: {stopped:?}"),
    };
    say(format!("upgrade Complete in {:.0}s", took.as_secs_f64()));

    let deleted: Vec<Deletion> =
        std::mem::take(&mut *lock(&deletions)).into_iter().filter(|d| d.at >= upgraded_at).collect();
    let mut per_node: HashMap<&str, usize> = HashMap::new();
    for d in &deleted {
        *per_node.entry(&d.node).or_default() += 1;
    }
    // Each Scheduler's canary starts with its first pod deleted: when the API server received
    // the new controller's delete (its audit log), by the pod's Scheduler (its name's prefix).
    let writes = cluster.audited_writes()?;
    let mut canary_starts: BTreeMap<&str, jiff::Timestamp> = BTreeMap::new();
    for w in writes.iter().filter(|w| w.user == AFTER && w.kind() == "pods delete" && w.code < 300) {
        let scheduler = w.name.rsplit_once('-').map_or(w.name.as_str(), |(s, _)| s);
        canary_starts.entry(scheduler).and_modify(|t| *t = (*t).min(w.received)).or_insert(w.received);
    }
    let mut starts: Vec<jiff::Timestamp> = canary_starts.values().copied().collect();
    starts.sort();
    let seconds = |d: jiff::SignedDuration| d.as_secs_f64();
    let mut gaps: Vec<f64> = starts.windows(2).map(|w| seconds(w[1].duration_since(w[0]))).collect();
    gaps.sort_by(f64::total_cmp);
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for w in writes.iter().filter(|w| w.user == AFTER && w.changes_state()) {
        *by_kind.entry(w.kind()).or_default() += 1;
    }
    let peak_rss = peak_rss_kib(upgraded.child.id())?;

    println!("\nAn upgrade of sked to a new agent image, {nodes} nodes under {count} Schedulers (bake {bake} s):");
    println!("  pods deleted (schedulers restarted)   {:>8}", deleted.len());
    println!("  nodes restarted                       {:>8}", per_node.len());
    println!("  most restarts of one node             {:>8}", per_node.values().max().copied().unwrap_or(0));
    println!("  Complete on the new agent after       {:>8.0} s", took.as_secs_f64());
    println!("  Schedulers whose canary ran           {:>8}", canary_starts.len());
    println!("  most Schedulers in Canary at one look {:>8}  (statuses read once a second)", most_canaries);
    if let (Some(first), Some(last)) = (starts.first(), starts.last()) {
        println!("  first to last canary start            {:>8.0} s", seconds(last.duration_since(*first)));
    }
    if !gaps.is_empty() {
        println!("  canary to next canary, median         {:>8.1} s", gaps[gaps.len() / 2]);
        println!("  canary to next canary, max            {:>8.1} s", gaps[gaps.len() - 1]);
    }
    let total: usize = by_kind.values().sum();
    println!("  writes of the new controller          {total:>8}");
    for (kind, n) in &by_kind {
        println!("    {kind:<36}{n:>8}");
    }
    println!("  new controller peak RSS (VmHWM)       {:>8.1} MiB", peak_rss as f64 / 1024.0);
    let restarted_twice = per_node.values().filter(|n| **n > 1).count();
    if deleted.len() != nodes || restarted_twice > 0 {
        bail!(
            "{} pod deletions over {} nodes ({restarted_twice} restarted more than once): each node's pod should be replaced exactly once",
            deleted.len(),
            per_node.len()
        );
    }
    if most_canaries > 1 {
        bail!("{most_canaries} Schedulers were in Canary at once; --max-concurrent-canaries is 1");
    }
    Ok(())
}

/// Nodes `n00000`... in pools `s000`... (node `i` in pool `i % count`), Ready.
async fn create_fleet(client: &Client, nodes: usize, count: usize) -> Result<()> {
    futures::stream::iter(0..nodes)
        .map(|i| async move {
            let pool = format!("s{:03}", i % count);
            create_ready_node(client, &format!("n{i:05}"), &[(POOL, &pool)]).await.map(|_| ())
        })
        .buffer_unordered(KUBELETS)
        .collect::<Vec<Result<()>>>()
        .await
        .into_iter()
        .collect()
}

async fn create_schedulers(client: &Client, count: usize, pacing: &RolloutSpec) -> Result<()> {
    let schedulers: Api<Scheduler> = Api::all(client.clone());
    for s in 0..count {
        let name = format!("s{s:03}");
        let spec = SchedulerSpec {
            sched: IMAGE.into(),
            expected_ops: Some("bench_ops".into()),
            node_selector: [(POOL.to_owned(), name.clone())].into(),
            rollout: Some(pacing.clone()),
            ..SchedulerSpec::default()
        };
        schedulers.create(&PostParams::default(), &Scheduler::new(&name, spec)).await?;
    }
    Ok(())
}

async fn set_pacing(client: &Client, count: usize, pacing: &RolloutSpec) -> Result<()> {
    let schedulers: Api<Scheduler> = Api::all(client.clone());
    let patch = serde_json::json!({"spec": {"rollout": pacing}});
    for s in 0..count {
        schedulers.patch(&format!("s{s:03}"), &PatchParams::default(), &Patch::Merge(&patch)).await?;
    }
    Ok(())
}

/// Waits until every Scheduler is Complete on a revision with `agent`, each of its nodes
/// attached; `seen` is told how many were in Canary at each look. Returns how long it took.
async fn wait_fleet(
    client: &Client,
    nodes: usize,
    count: usize,
    agent: &str,
    mut seen: impl FnMut(usize),
) -> Result<Duration> {
    let schedulers: Api<Scheduler> = Api::all(client.clone());
    let t0 = Instant::now();
    loop {
        let list = schedulers.list(&Default::default()).await?;
        let pool_size = |s: &Scheduler| nodes / count + usize::from(scheduler_index(s) < nodes % count);
        let mut canaries = 0;
        let mut done = 0;
        for s in &list.items {
            let Some(rollout) = s.status.as_ref().and_then(|st| st.rollout.as_ref()) else { continue };
            canaries += usize::from(rollout.phase == RolloutPhase::Canary);
            let on_agent = rollout.update_revision.as_ref().and_then(|r| r.agent_image.as_deref()) == Some(agent);
            let attached = s.status.as_ref().map_or(0, |st| usize::try_from(st.kernel_attached).unwrap_or(0));
            if rollout.phase == RolloutPhase::RolledBack {
                bail!("Scheduler {} rolled back: {}", s.name_any(), serde_json::to_string(&s.status)?);
            }
            done += usize::from(on_agent && rollout.phase == RolloutPhase::Complete && attached == pool_size(s));
        }
        seen(canaries);
        if done == count {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > PATIENCE {
            bail!("{done} of {count} Schedulers Complete on {agent} after {PATIENCE:?}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn scheduler_index(s: &Scheduler) -> usize {
    s.name_any().trim_start_matches('s').parse().unwrap_or(usize::MAX)
}

/// Plays every node's kubelet: a bound pod is marked Ready and its agent started (reporting the
/// scheduler attached); a pod marked for deletion has its agent stopped and is then removed,
/// its deletion recorded.
async fn play_kubelets(
    client: Client,
    endpoint: String,
    ca: std::path::PathBuf,
    deletions: Arc<Mutex<Vec<Deletion>>>,
) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let mut events = watcher(pods.clone(), watcher::Config::default()).default_backoff().boxed();
    let mut fleets: Vec<AgentFleet> = Vec::new();
    let mut fleet_of: HashMap<String, usize> = HashMap::new();
    let mut played: HashSet<String> = HashSet::new();
    let mut agents_started = 0u32;
    while let Some(first) = events.next().await {
        // Everything the watch has ready, as one batch.
        let mut batch = vec![first];
        while let Some(Some(next)) = events.next().now_or_never() {
            batch.push(next);
        }
        let mut new: BTreeMap<String, Pod> = BTreeMap::new();
        let mut going: BTreeMap<String, Pod> = BTreeMap::new();
        for event in batch {
            let (watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) = event? else { continue };
            let name = pod.name_any();
            if pod.metadata.deletion_timestamp.is_some() {
                new.remove(&name);
                going.insert(name, pod);
            } else if pod.spec.as_ref().is_some_and(|s| s.node_name.is_some()) && !played.contains(&name) {
                new.insert(name, pod);
            }
        }
        for (name, pod) in &going {
            if let Some(fleet) = fleet_of.remove(name) {
                fleets[fleet].retire(name);
                let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
                lock(&deletions).push(Deletion { at: Instant::now(), node });
            }
        }
        let names: Vec<String> = going.into_keys().collect();
        let _ = futures::stream::iter(names)
            .map(|name| {
                let pods = pods.clone();
                async move {
                    pods.delete(&name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await
                }
            })
            .buffer_unordered(KUBELETS)
            .collect::<Vec<_>>()
            .await;
        if new.is_empty() {
            continue;
        }
        let new: Vec<Pod> = new.into_values().collect();
        let names: Vec<String> = new.iter().map(ResourceExt::name_any).collect();
        futures::stream::iter(names)
            .map(|name| {
                let pods = pods.clone();
                async move { set_pod_ready(&pods, &name, true).await }
            })
            .buffer_unordered(KUBELETS)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<()>>()?;
        let identities = agent_identities(&client, NAMESPACE, &new).await?;
        let started = u32::try_from(identities.len())?;
        for p in &new {
            played.insert(p.name_any());
            fleet_of.insert(p.name_any(), fleets.len());
        }
        fleets.push(AgentFleet::start(identities, vec![endpoint.clone()], &ca, agents_started).await?);
        agents_started += started;
    }
    bail!("the pod watch ended")
}

/// A process's peak resident memory (VmHWM), in KiB.
fn peak_rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmHWM in /proc/PID/status")
}
