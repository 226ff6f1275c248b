//! `make bench-rollout`: a Scheduler's first deployment with the default pacing (a canary of one,
//! then waves that double up to `maxUnavailable` 25%, each after a 30 s bake), over a fleet of
//! simulated nodes on the test control plane: real Nodes, the real DaemonSet controller and
//! kube-scheduler making and binding the pods, one `sked-controller` with default flags, and a
//! simulated agent per pod (a real TLS report stream with a token bound to that pod, reporting
//! the scheduler attached; see `sked_tests::simulated_agents`) started once the pod is bound,
//! the pod marked Ready as its kubelet would.
//!
//! For each fleet size it prints the seconds from the Scheduler's creation to its rollout
//! `Complete` with every node attached, the waves (nodes switched in each) and the bakes.
//! Sizes come from `BENCH_ROLLOUT_NODES` (a comma list, default `100,5000`); each size gets a
//! pool and a Scheduler of its own on the same control plane. The controller binary is
//! `SKED_CONTROLLER_BIN`.

use std::collections::BTreeSet;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use sked_controller::api::RolloutPhase;
use sked_controller::{Scheduler, SchedulerSpec};
use sked_tests::agents::{ReportsTls, workspace_binary};
use sked_tests::cluster::{TestCluster, free_port};
use sked_tests::kubelet::set_pod_ready;
use sked_tests::simulated_agents::{AgentFleet, agent_identities};
use sked_tests::{allow_unsigned_policy, create_ready_node, ensure_namespace, ensure_service_account};

const NAMESPACE: &str = "sked-system";
const POOL: &str = "bench.sked/pool";
const IMAGE: &str = "bench.example/scheduler:v1";
/// How long one first deployment may take before the bench gives up.
const PATIENCE: Duration = Duration::from_secs(1800);
/// Nodes that start running the new revision this close together are one wave (waves are a
/// bake, 30 s, apart).
const WAVE_GAP: Duration = Duration::from_secs(10);
/// Concurrency of the bench's own writes (Nodes, pod readiness): the kubelets of a fleet.
const KUBELETS: usize = 64;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sked-bench-rollout: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One first deployment, as measured.
struct Deployment {
    nodes: usize,
    took: Duration,
    /// Nodes switched in each step, canary first.
    waves: Vec<usize>,
}

async fn run() -> Result<()> {
    let sizes: Vec<usize> = std::env::var("BENCH_ROLLOUT_NODES")
        .unwrap_or_else(|_| "100,5000".into())
        .split(',')
        .map(|n| n.trim().parse().with_context(|| format!("BENCH_ROLLOUT_NODES: {n:?} is not a number")))
        .collect::<Result<_>>()?;
    let started = Instant::now();
    eprintln!("[{:>5.0}s] starting the test control plane and sked-controller", started.elapsed().as_secs_f64());
    let cluster = tokio::task::spawn_blocking(TestCluster::start).await??;
    let client = cluster.client().await?;
    ensure_namespace(&client, NAMESPACE).await?;
    ensure_service_account(&client, NAMESPACE, "sked-agent").await?;
    let dir = tempfile::Builder::new().prefix("sked-bench-rollout-").tempdir()?;
    let tls = ReportsTls::generate(dir.path())?;
    let reports = free_port()?;
    let mut controller = Command::new(workspace_binary("sked-controller", "SKED_CONTROLLER_BIN")?)
        .env("KUBECONFIG", cluster.user_kubeconfig("sked-bench-rollout")?)
        .env("POD_NAME", "sked-bench-rollout")
        .args([
            format!("--trust-policy={}", allow_unsigned_policy(dir.path())?.display()),
            format!("--reports-cert-file={}", tls.cert.display()),
            format!("--reports-key-file={}", tls.key.display()),
            format!("--reports-bind-address=127.0.0.1:{reports}"),
            format!("--metrics-bind-address=127.0.0.1:{}", free_port()?),
            format!("--webhook-bind-address=127.0.0.1:{}", free_port()?),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("controller.log"))?)
        .spawn()
        .context("starting sked-controller")?;
    let endpoint = format!("https://localhost:{reports}");
    let mut results = Vec::new();
    let mut agents_started = 0u32;
    for size in sizes {
        eprintln!("[{:>5.0}s] {size} Ready Nodes in pool p{size}", started.elapsed().as_secs_f64());
        create_pool(&client, size).await?;
        eprintln!("[{:>5.0}s] a first deployment over them, default pacing", started.elapsed().as_secs_f64());
        let deployment = first_deployment(&client, size, &endpoint, &tls.ca, &mut agents_started).await?;
        eprintln!(
            "[{:>5.0}s] {size} nodes Complete in {:.0}s",
            started.elapsed().as_secs_f64(),
            deployment.took.as_secs_f64()
        );
        results.push(deployment);
    }
    let _ = controller.kill();
    println!("\nA first deployment with the default pacing (canary 1, maxUnavailable 25%, bake 30 s):");
    for d in &results {
        let waves: Vec<String> = d.waves.iter().map(ToString::to_string).collect();
        println!(
            "  {:>5} nodes: Complete in {:>4.0} s; {} steps (each after a bake): {}",
            d.nodes,
            d.took.as_secs_f64(),
            d.waves.len(),
            waves.join(", ")
        );
    }
    Ok(())
}

async fn create_pool(client: &Client, size: usize) -> Result<()> {
    let pool = format!("p{size}");
    futures::stream::iter(0..size)
        .map(|i| {
            let pool = pool.clone();
            async move { create_ready_node(client, &format!("{pool}-{i:05}"), &[(POOL, &pool)]).await.map(|_| ()) }
        })
        .buffer_unordered(KUBELETS)
        .collect::<Vec<Result<()>>>()
        .await
        .into_iter()
        .collect()
}

/// Creates the pool's Scheduler and plays the kubelets and agents of its pods until its rollout
/// is Complete with every node attached.
async fn first_deployment(
    client: &Client,
    size: usize,
    endpoint: &str,
    ca: &std::path::Path,
    agents_started: &mut u32,
) -> Result<Deployment> {
    let name = format!("p{size}");
    let spec = SchedulerSpec {
        sched: IMAGE.into(),
        expected_ops: Some("bench_ops".into()),
        node_selector: [(POOL.to_owned(), name.clone())].into(),
        ..SchedulerSpec::default()
    };
    let schedulers: Api<Scheduler> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    schedulers.create(&PostParams::default(), &Scheduler::new(&name, spec)).await?;
    let t0 = Instant::now();
    let mut played = BTreeSet::new();
    let mut fleets = Vec::new();
    let mut waves: Vec<usize> = Vec::new();
    let mut last_change = Instant::now();
    loop {
        let list = pods.list(&ListParams::default().labels(&format!("name={name}"))).await?;
        let new: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
            .filter(|p| !played.contains(&p.name_any()))
            .collect();
        if !new.is_empty() {
            // The kubelets start the pods; their agents come up and report the scheduler attached.
            futures::stream::iter(&new)
                .map(|p| {
                    let (pods, pod) = (pods.clone(), p.name_any());
                    async move { set_pod_ready(&pods, &pod, true).await }
                })
                .buffer_unordered(KUBELETS)
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .collect::<Result<()>>()?;
            let identities = agent_identities(client, NAMESPACE, &new).await?;
            let count = u32::try_from(identities.len())?;
            fleets.push(AgentFleet::start(identities, vec![endpoint.to_owned()], ca, *agents_started).await?);
            *agents_started += count;
            played.extend(new.iter().map(ResourceExt::name_any));
        }
        let s = schedulers.get(&name).await?;
        let st = s.status.as_ref();
        let updated =
            st.and_then(|st| st.rollout.as_ref()).map_or(0, |r| usize::try_from(r.updated_nodes).unwrap_or(0));
        // A wave's nodes come up over a few seconds; the next wave only after a 30 s bake.
        let switched: usize = waves.iter().sum();
        if updated > switched {
            match waves.last_mut() {
                Some(last) if last_change.elapsed() < WAVE_GAP => *last += updated - switched,
                _ => waves.push(updated - switched),
            }
            last_change = Instant::now();
        }
        let complete = st.and_then(|st| st.rollout.as_ref()).is_some_and(|r| r.phase == RolloutPhase::Complete);
        if complete && st.is_some_and(|st| usize::try_from(st.kernel_attached).unwrap_or(0) == size) {
            return Ok(Deployment { nodes: size, took: t0.elapsed(), waves });
        }
        if t0.elapsed() > PATIENCE {
            bail!("{name}: not Complete after {PATIENCE:?}: {}", serde_json::to_string(&s.status)?);
        }
        // A kubelet's pace: pods are looked at twice a second.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
