//! `make chaos`: what a fault at each step of a rollout does, from real processes. A real
//! control plane (etcd, kube-apiserver with its audit log, the DaemonSet controller,
//! kube-scheduler), two `sked-controller` replicas electing a leader, and a real `sked-agent` per
//! pod on a stand-in kernel (`sked_tests::fake_nodes`), reaching the replicas through relays
//! that can hold their bytes.
//!
//! Each fault gets a round: six Schedulers on pools of their own (54 nodes), each brought to one
//! rollout step ([`Step`]) and held there (a kernel that does not attach yet, a long bake), the
//! fault injected once for all six, the holds let go, and every rollout driven until it settles.
//! Each cell is judged: the rollout settles (Complete, or RolledBack for the failed revision)
//! with no failure the fault could not cause; no node's pod is replaced by one of its own
//! revision; never more than `maxUnavailable` nodes down at once; and, from the audit log, no
//! write by a replica while the other held the Lease. The analysed cell (`spec.rollout.analysis`
//! on) also: the good revision passes every wave's analysis, each wave judged once (no more
//! verdicts seen than waves), and a canary gone NotReady in its bake fails the revision. The
//! table goes to standard output; the run fails on any violation.
//!
//! `CHAOS_FAULTS` (a comma list of fault names, default all) picks the rounds: CI runs a few.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use sked_controller::api::{RolloutPhase, RolloutSpec};
use sked_controller::{Scheduler, SchedulerSpec};
use sked_tests::agents::{ReportsEndpoint, ReportsTls};
use sked_tests::chaos::{Fault, Outcome, Step, replaced_by_same_revision, table, writes_while_not_leading};
use sked_tests::cluster::free_port;
use sked_tests::controller_process::{ControllerProcess, LEASE, holder, webhook_cert};
use sked_tests::fake_nodes::{FakeNodes, Kernel};
use sked_tests::stall_proxy::StallProxy;
use sked_tests::{Fixture, has_condition, set_node_ready, spec_on};

const REV1: &str = "ghcr.io/schedkit/scx_rusty:v1";
const REV2: &str = "ghcr.io/schedkit/scx_rusty:v2";
const REPLICAS: [&str; 2] = ["chaos-a", "chaos-b"];
const NODES_PER_STEP: usize = 9;
const MAX_UNAVAILABLE: i32 = 2;
/// `--report-stale-after` of the replicas: the stalled path outlasts it.
const STALE_AFTER: Duration = Duration::from_secs(6);
/// A kernel that does not attach until the hold is let go.
const HOLD: Duration = Duration::from_secs(3600);
const LONG_BAKE: i32 = 600;
/// How long a step may take to be reached, and a rollout to settle after the fault.
const ARM_WITHIN: Duration = Duration::from_secs(150);
const SETTLE_WITHIN: Duration = Duration::from_secs(150);
/// One move of the stand-in kubelets and kernels.
const MOVE: Duration = Duration::from_millis(300);

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("chaos: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run() -> Result<bool> {
    // The harness's own clients log every refused connection while kube-apiserver is down.
    let quiet = tracing_subscriber::EnvFilter::new("error,kube_client=off");
    let _ = tracing_subscriber::fmt().with_env_filter(quiet).try_init();
    let faults: Vec<Fault> = match std::env::var("CHAOS_FAULTS") {
        Ok(list) if !list.trim().is_empty() => list
            .split(',')
            .map(|n| Fault::parse(n.trim()).ok_or_else(|| anyhow!("CHAOS_FAULTS: no fault named {n:?}")))
            .collect::<Result<_>>()?,
        _ => Fault::ALL.to_vec(),
    };
    sked_tests::agents::agent_binary()?;
    let mut h = Harness::start().await?;
    let started = Instant::now();
    let mut outcomes = BTreeMap::new();
    for (i, fault) in faults.into_iter().enumerate() {
        log(started, &format!("round {}: {}", i + 1, fault.name()));
        for (step, outcome) in round(&mut h, fault, i + 1).await? {
            outcomes.insert((fault, step), outcome);
        }
    }
    println!("\n{}", table(&outcomes));
    let failed = outcomes.values().filter(|o| !o.passed()).count();
    println!("{} cells, {failed} failed, in {:.0} s", outcomes.len(), started.elapsed().as_secs_f64());
    Ok(failed == 0)
}

fn log(started: Instant, what: &str) {
    println!("[{:6.1} s] {what}", started.elapsed().as_secs_f64());
}

/// The control plane, the two replicas and the relays in front of their reports servers.
struct Harness {
    fx: Fixture,
    dir: tempfile::TempDir,
    tls: ReportsTls,
    /// Each replica's name, reports port and process (`None` while it is down).
    replicas: Vec<(&'static str, u16, Option<ControllerProcess>)>,
    proxies: Vec<StallProxy>,
}

impl Harness {
    async fn start() -> Result<Self> {
        let fx = Fixture::without_controller().await?;
        let dir = tempfile::tempdir()?;
        webhook_cert(dir.path())?;
        let tls = ReportsTls::generate(dir.path())?;
        let mut h = Harness { fx, dir, tls, replicas: Vec::new(), proxies: Vec::new() };
        for name in REPLICAS {
            let port = free_port()?;
            h.proxies.push(StallProxy::start(([127, 0, 0, 1], port).into()).await?);
            h.replicas.push((name, port, None));
        }
        for i in 0..REPLICAS.len() {
            h.start_replica(i)?;
        }
        Ok(h)
    }

    fn start_replica(&mut self, i: usize) -> Result<()> {
        let (name, port, _) = self.replicas[i];
        let flags = [
            format!("--reports-bind-address=127.0.0.1:{port}"),
            format!("--reports-cert-file={}", self.tls.cert.display()),
            format!("--reports-key-file={}", self.tls.key.display()),
            "--agent-heartbeat-interval=1s".to_owned(),
            format!("--report-stale-after={}s", STALE_AFTER.as_secs()),
            // Each cell of a round is an experiment of its own, on a Scheduler of its own, all
            // started together: none waits for another's canary (the fleet-wide gate is the
            // rollout suite's to test).
            "--max-concurrent-canaries=0".to_owned(),
        ];
        let process = ControllerProcess::start(self.fx.cluster, self.dir.path(), name, &flags)?;
        self.replicas[i].2 = Some(process);
        Ok(())
    }

    /// The replica that holds the Lease, by index.
    async fn leader(&self) -> Result<Option<usize>> {
        let holder = holder(&self.fx.client, &self.fx.namespace).await?;
        Ok(holder.and_then(|h| REPLICAS.iter().position(|r| h.starts_with(r))))
    }

    /// The agents dial the relays, one per replica.
    fn reports(&self) -> (String, String) {
        let address = format!("https://localhost:{}", self.proxies[0].address.port());
        let replicas = self.proxies.iter().map(|p| p.address.to_string()).collect::<Vec<_>>().join(",");
        (address, replicas)
    }
}

/// One Scheduler of a round, on its own pool, and the stand-in kubelets and kernels of its pods.
struct Cell {
    step: Step,
    name: String,
    play: FakeNodes,
    last: Option<Scheduler>,
    /// The node the canary went to, once seen.
    canary: Option<String>,
    /// The node a fault on a node befalls.
    target: Option<String>,
    armed: bool,
    settled_after: Option<f64>,
    /// Every analysis verdict seen (its time and verdict), for the analysed cell.
    verdicts: std::collections::BTreeSet<(String, String)>,
}

async fn round(h: &mut Harness, fault: Fault, n: usize) -> Result<Vec<(Step, Outcome)>> {
    let since = jiff::Timestamp::now();
    let started = Instant::now();
    let mut cells = Vec::new();
    for step in Step::ALL {
        cells.push(cell(h, step, n).await?);
    }
    settle_first_revision(h, &mut cells).await.context("the first revision")?;
    for cell in &mut cells {
        begin_step(h, cell).await?;
    }
    drive_until(h, &mut cells, ARM_WITHIN, "every step reached", |c| c.armed, arm).await?;
    log(started, &format!("every step reached; injecting {}", fault.name()));
    let fault_end = inject(h, fault, &mut cells).await?;
    log(started, "fault over; letting go of the holds");
    release(h, &mut cells).await?;
    let settled = drive_until(
        h,
        &mut cells,
        SETTLE_WITHIN,
        "every rollout settled",
        |c| c.settled_after.is_some(),
        |c| settle(c, fault_end),
    )
    .await;
    if let Err(e) = settled {
        log(started, &format!("{e:#}"));
    }
    // Who led is read from every Lease write since the start; the writes judged are the round's.
    let writes = h.fx.cluster.audited_writes()?;
    anyhow::ensure!(
        writes.iter().any(|w| w.resource == "leases" && w.name == LEASE && w.holder.is_some()),
        "the audit log records no holder of Lease {LEASE}: leadership cannot be judged"
    );
    let not_leading: Vec<String> = writes_while_not_leading(&writes, &REPLICAS, LEASE)
        .iter()
        .filter(|w| w.received >= since)
        .map(|w| format!("{} wrote {} {} while not leading", w.user, w.kind(), w.name))
        .collect();
    let outcomes: Vec<(Step, Outcome)> = cells.iter().map(|c| (c.step, judge(c, fault, &not_leading))).collect();
    if outcomes.iter().any(|(_, o)| !o.passed()) {
        keep_logs(h, fault)?;
    }
    drop(cells);
    sked_tests::clear(&h.fx.client).await?;
    Ok(outcomes)
}

/// Keeps the logs of a round that failed (the replicas', the API server's audit log,
/// kube-controller-manager's) under `target/chaos/<fault>/`.
fn keep_logs(h: &Harness, fault: Fault) -> Result<()> {
    let dest = sked_tests::cluster::workspace_root().join("target/chaos").join(fault.name());
    std::fs::create_dir_all(&dest)?;
    let from_cluster =
        ["audit.log", "kube-controller-manager.log", "kube-apiserver.log"].map(|f| h.fx.cluster.dir.join(f));
    let from_replicas = REPLICAS.map(|r| h.dir.path().join(format!("{r}.log")));
    for file in from_cluster.iter().chain(&from_replicas) {
        if let Some(name) = file.file_name() {
            let _ = std::fs::copy(file, dest.join(name));
        }
    }
    println!("logs of the failed round kept in {}", dest.display());
    Ok(())
}

/// The pool of `step` in round `n`, its stand-in nodes, and (but for a first deployment) its
/// Scheduler at the first revision.
async fn cell(h: &Harness, step: Step, n: usize) -> Result<Cell> {
    let name = format!("r{n}-{}", step.name());
    for i in 0..NODES_PER_STEP {
        h.fx.create_node(&format!("{name}-{i}"), &[("pool", &name)]).await?;
    }
    let (address, replicas) = h.reports();
    let reports = ReportsEndpoint { address: &address, ca: &h.tls.ca, server_name: None, replicas: Some(&replicas) };
    let dir = h.dir.path().join(&name);
    std::fs::create_dir_all(&dir)?;
    let play =
        FakeNodes::new(&h.fx.client, &h.fx.namespace, &format!("name={name}"), &format!("pool={name}"), &dir, &reports);
    let mut spec = spec(&name, REV1);
    if step == Step::AnalysedBaking
        && let Some(rollout) = spec.rollout.as_mut()
    {
        // On from the first revision: the controller keeps the nodes' samples from then on.
        rollout.analysis = Some(analysed());
    }
    if step != Step::FirstDeployment {
        h.fx.create_scheduler(&name, spec).await?;
    }
    Ok(Cell {
        step,
        name,
        play,
        last: None,
        canary: None,
        target: None,
        armed: false,
        settled_after: None,
        verdicts: Default::default(),
    })
}

/// The analysed cell's analysis: the defaults, over the stand-in agents' 1 s samples.
fn analysed() -> sked_controller::api::AnalysisSpec {
    sked_controller::api::AnalysisSpec { min_samples: Some(3), ..Default::default() }
}

fn spec(pool: &str, image: &str) -> SchedulerSpec {
    let rollout = RolloutSpec {
        canary: Some(1),
        max_unavailable: Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(MAX_UNAVAILABLE)),
        bake_seconds: Some(1),
        attach_timeout_seconds: Some(60),
        paused: false,
        analysis: None,
    };
    SchedulerSpec { expected_ops: Some("rusty".into()), rollout: Some(rollout), ..spec_on(image, &[("pool", pool)]) }
}

async fn settle_first_revision(h: &Harness, cells: &mut [Cell]) -> Result<()> {
    let done = |c: &Cell| {
        c.step == Step::FirstDeployment
            || (c.last.as_ref().is_some_and(|s| complete_on(s, REV1, NODES_PER_STEP)) && sampled(c))
    };
    drive_until(h, cells, ARM_WITHIN, "the first revision everywhere", done, |_| {}).await
}

/// Whether the analysed cell's agents have sampled their nodes long enough for a window before
/// the next switch (`minSamples` 3 at one sample a second, with room): its nodes' first pods
/// were Ready 6 s ago. Other cells need no samples.
fn sampled(c: &Cell) -> bool {
    let since = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(6);
    c.step != Step::AnalysedBaking
        || (c.play.first_ready.len() == NODES_PER_STEP && c.play.first_ready.values().all(|t| *t <= since))
}

/// Whether `s` completed its rollout of `image` with `nodes` nodes attached.
fn complete_on(s: &Scheduler, image: &str, nodes: usize) -> bool {
    let Some(rollout) = s.status.as_ref().and_then(|st| st.rollout.as_ref()) else { return false };
    rollout.phase == RolloutPhase::Complete
        && rollout.current_revision.as_ref().is_some_and(|r| r.image == image)
        && s.status.as_ref().is_some_and(|st| usize::try_from(st.kernel_attached).unwrap_or(0) == nodes)
}

/// Starts the change that brings `cell` to its step, with the holds that keep it there.
async fn begin_step(h: &Harness, cell: &mut Cell) -> Result<()> {
    let schedulers = h.fx.schedulers();
    let patch = |body: serde_json::Value| {
        let schedulers = schedulers.clone();
        let name = cell.name.clone();
        async move { schedulers.patch(&name, &PatchParams::default(), &Patch::Merge(&json!({ "spec": body }))).await }
    };
    match cell.step {
        Step::FirstDeployment => {
            cell.play.attach_after = HOLD;
            h.fx.create_scheduler(&cell.name, spec(&cell.name, REV2)).await?;
        }
        Step::CanaryAttaching => {
            cell.play.attach_after = HOLD;
            patch(json!({ "sched": REV2 })).await?;
        }
        Step::CanaryBaking | Step::AnalysedBaking => {
            patch(json!({ "sched": REV2, "rollout": { "bakeSeconds": LONG_BAKE } })).await?;
        }
        Step::WaveAttaching | Step::WaveBaking => {
            patch(json!({ "sched": REV2 })).await?;
        }
        Step::RollingBack => {
            cell.play.kernel =
                Box::new(|_, pod: &Pod| if image_of(pod) == REV2 { Kernel::Refuses } else { Kernel::Attaches });
            patch(json!({ "sched": REV2, "rollout": { "attachTimeoutSeconds": 4 } })).await?;
        }
    }
    Ok(())
}

fn image_of(pod: &Pod) -> String {
    pod.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.image.clone()).unwrap_or_default()
}

/// The rollout of `s`, if any.
fn rollout(s: &Scheduler) -> Option<&sked_controller::api::RolloutStatus> {
    s.status.as_ref()?.rollout.as_ref()
}

/// The nodes whose newest pod is of the revision being rolled out.
fn on_update_revision(cell: &Cell) -> Vec<String> {
    let Some(revision) = cell.last.as_ref().and_then(rollout).and_then(|r| r.update_revision.as_ref()) else {
        return Vec::new();
    };
    let revision = &revision.name;
    cell.play.revisions.iter().filter(|(_, r)| r.last() == Some(revision)).map(|(n, _)| n.clone()).collect()
}

/// Moves `cell` on towards its step (the holds that need a moment), and marks it armed once it
/// stands there, with the node a node fault will befall.
fn arm(cell: &mut Cell) {
    let Some(s) = cell.last.clone() else { return };
    let Some(r) = rollout(&s) else { return };
    let updating = r.update_revision.as_ref().is_some_and(|u| u.image == REV2);
    let updated = on_update_revision(cell);
    if cell.canary.is_none() && updating {
        cell.canary = updated.first().cloned();
    }
    let wave_node = updated.iter().find(|n| Some(*n) != cell.canary.as_ref()).cloned();
    let (armed, target) = match cell.step {
        Step::FirstDeployment | Step::CanaryAttaching => (updating && r.updated_nodes >= 1, cell.canary.clone()),
        Step::CanaryBaking => {
            (updating && r.phase == RolloutPhase::Canary && r.attached_nodes >= 1, cell.canary.clone())
        }
        Step::AnalysedBaking => {
            // The canary's window before its switch is frozen in status.
            let frozen = r.baseline.as_ref().is_some_and(|b| b.nodes.iter().any(|n| !n.control));
            (updating && r.phase == RolloutPhase::Canary && r.attached_nodes >= 1 && frozen, cell.canary.clone())
        }
        Step::WaveAttaching => {
            if r.phase == RolloutPhase::Canary && r.attached_nodes >= 1 {
                cell.play.attach_after = HOLD;
            }
            (r.phase == RolloutPhase::Rolling && r.updated_nodes > r.attached_nodes, wave_node)
        }
        Step::WaveBaking => {
            (r.phase == RolloutPhase::Rolling && r.updated_nodes >= 3 && r.attached_nodes == r.updated_nodes, wave_node)
        }
        Step::RollingBack => {
            if r.failed.is_some() {
                cell.play.attach_after = HOLD;
            }
            (r.failed.is_some(), r.failed.as_ref().map(|f| f.node.clone()))
        }
    };
    if armed && target.is_some() {
        cell.armed = true;
        cell.target = target;
    }
}

/// Drives every cell's kubelets and kernels, a move at a time, reading each Scheduler and
/// calling `step` on each cell, until `done` holds for all (errors of a move, as while the API
/// server is down, are the next move's to retry).
async fn drive_until(
    h: &Harness,
    cells: &mut [Cell],
    within: Duration,
    what: &str,
    done: impl Fn(&Cell) -> bool,
    mut step: impl FnMut(&mut Cell),
) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        drive_once(h, cells).await;
        cells.iter_mut().for_each(&mut step);
        if cells.iter().all(&done) {
            return Ok(());
        }
        if Instant::now() > deadline {
            let waiting: Vec<String> = cells
                .iter()
                .filter(|c| !done(c))
                .map(|c| format!("{}: {:?}", c.name, c.last.as_ref().and_then(rollout)))
                .collect();
            bail!("timed out after {within:?} waiting for {what}: {}", waiting.join("; "));
        }
        tokio::time::sleep(MOVE).await;
    }
}

async fn drive_once(h: &Harness, cells: &mut [Cell]) {
    for cell in cells.iter_mut() {
        let _ = cell.play.drive().await;
        if let Ok(s) = h.fx.schedulers().get(&cell.name).await {
            let verdict = rollout(&s).and_then(|r| r.analysis.as_ref());
            if let Some(a) = verdict.filter(|_| cell.armed) {
                cell.verdicts.insert((a.time.0.to_string(), a.verdict.as_str().to_owned()));
            }
            cell.last = Some(s);
        }
    }
}

/// Drives the cells for `length`: the fault lasts that long.
async fn drive_for(h: &Harness, cells: &mut [Cell], length: Duration) {
    let until = Instant::now() + length;
    while Instant::now() < until {
        drive_once(h, cells).await;
        tokio::time::sleep(MOVE).await;
    }
}

/// Injects `fault`; returns when it is over.
async fn inject(h: &mut Harness, fault: Fault, cells: &mut [Cell]) -> Result<Instant> {
    match fault {
        Fault::LeaderKilled | Fault::LeaderFrozen => {
            let leader = h.leader().await?.ok_or_else(|| anyhow!("no replica holds the Lease"))?;
            let process = h.replicas[leader].2.as_mut().ok_or_else(|| anyhow!("the leader is not running"))?;
            if fault == Fault::LeaderKilled {
                process.kill()?;
            } else {
                process.freeze()?;
            }
            let other = 1 - leader;
            let deadline = Instant::now() + Duration::from_secs(60);
            while h.leader().await.ok().flatten() != Some(other) {
                if Instant::now() > deadline {
                    bail!("{} did not take the Lease over", REPLICAS[other]);
                }
                drive_once(h, cells).await;
                tokio::time::sleep(MOVE).await;
            }
            if fault == Fault::LeaderKilled {
                h.start_replica(leader)?;
            } else {
                // Frozen well past the handover, then woken: it still believes it leads.
                drive_for(h, cells, Duration::from_secs(3)).await;
                h.replicas[leader].2.as_ref().map(ControllerProcess::thaw).transpose()?;
            }
        }
        Fault::ApiServerRestarted => {
            let cluster = h.fx.cluster;
            let restart =
                tokio::task::spawn_blocking(move || cluster.restart("kube-apiserver", Duration::from_secs(3)));
            let mut restart = std::pin::pin!(restart);
            loop {
                tokio::select! {
                    done = &mut restart => { done??; break; }
                    () = drive_for(h, cells, MOVE) => {}
                }
            }
        }
        Fault::AgentPathStalled => {
            h.proxies.iter().for_each(StallProxy::stall);
            drive_for(h, cells, STALE_AFTER + Duration::from_secs(4)).await;
            h.proxies.iter().for_each(StallProxy::heal);
        }
        Fault::AgentRestarted | Fault::NodeNotReady | Fault::NodeDeleted => {
            for cell in cells.iter_mut() {
                let target = cell.target.clone().ok_or_else(|| anyhow!("{}: no node to fault", cell.name))?;
                node_fault(h, cell, fault, &target).await.with_context(|| format!("{} on {target}", fault.name()))?;
            }
        }
    }
    Ok(Instant::now())
}

async fn node_fault(h: &Harness, cell: &mut Cell, fault: Fault, node: &str) -> Result<()> {
    match fault {
        Fault::AgentRestarted => cell.play.restart_agent(node).await,
        Fault::NodeNotReady => set_node_ready(&h.fx.client, node, false).await.map(|_| ()),
        Fault::NodeDeleted => {
            let nodes: Api<Node> = Api::all(h.fx.client.clone());
            nodes.delete(node, &DeleteParams::default()).await?;
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Lets go of the holds: kernels attach, bakes end.
async fn release(h: &Harness, cells: &mut [Cell]) -> Result<()> {
    for cell in cells.iter_mut() {
        cell.play.attach_after = Duration::ZERO;
        if matches!(cell.step, Step::CanaryBaking | Step::WaveBaking | Step::AnalysedBaking) {
            let body = json!({ "spec": { "rollout": { "bakeSeconds": 1 } } });
            h.fx.schedulers().patch(&cell.name, &PatchParams::default(), &Patch::Merge(&body)).await?;
        }
    }
    Ok(())
}

/// Marks `cell` settled, with the seconds since the fault ended, once its rollout came to rest:
/// Complete on the new revision, or RolledBack for the failed one, with every node it counts
/// attached.
fn settle(cell: &mut Cell, fault_end: Instant) {
    let Some(s) = &cell.last else { return };
    let Some(r) = rollout(s) else { return };
    let at_rest = match cell.step {
        Step::RollingBack => r.phase == RolloutPhase::RolledBack,
        Step::AnalysedBaking if r.failed.as_ref().is_some_and(|f| f.cause.contains("went NotReady")) => {
            r.phase == RolloutPhase::RolledBack
        }
        _ => r.phase == RolloutPhase::Complete && r.current_revision.as_ref().is_some_and(|c| c.image == REV2),
    };
    if cell.settled_after.is_none() && at_rest && has_condition(s, "KernelAttached", "True", "KernelAttached") {
        cell.settled_after = Some(fault_end.elapsed().as_secs_f64());
    }
}

/// The outcome of `cell` after `fault`; `not_leading`: the writes of the round by a replica
/// that did not hold the Lease.
fn judge(cell: &Cell, fault: Fault, not_leading: &[String]) -> Outcome {
    let r = cell.last.as_ref().and_then(rollout);
    let phase = r.map_or_else(|| "no rollout".to_owned(), |r| r.phase.as_str().to_owned());
    let mut violations: Vec<String> = not_leading.to_vec();
    match (cell.step, r.and_then(|r| r.failed.as_ref())) {
        (Step::RollingBack, Some(f)) if !f.cause.contains("did not run the scheduler") => {
            violations.push(format!("failed for {:?}, not for the kernel that never attached", f.cause));
        }
        (Step::RollingBack, _) => {}
        // The canary gone NotReady within its bake fails an analysed revision: fail closed.
        (Step::AnalysedBaking, Some(f)) if fault == Fault::NodeNotReady && f.cause.contains("went NotReady") => {}
        (Step::AnalysedBaking, None) if fault == Fault::NodeNotReady => {
            violations.push("the canary went NotReady in its bake and the analysed revision did not fail".to_owned());
        }
        (_, Some(f)) => violations.push(format!("the revision failed on {}: {}", f.node, f.cause)),
        (_, None) => {}
    }
    if cell.step == Step::AnalysedBaking {
        violations.extend(analysis_violations(cell, fault));
    }
    if fault == Fault::NodeNotReady
        && cell.step != Step::AnalysedBaking
        && let (Some(target), Some(r)) = (&cell.target, r)
        && cell.settled_after.is_some()
        && !r.skipped_nodes.contains(target)
    {
        violations.push(format!("{target} is NotReady but not skipped"));
    }
    for node in replaced_by_same_revision(&cell.play.revisions) {
        violations.push(format!("{node}'s pod was replaced by one of its own revision"));
    }
    if cell.play.most_down > usize::try_from(MAX_UNAVAILABLE).unwrap_or(0) {
        let down = cell.play.most_down_at.join(", ");
        violations
            .push(format!("{} nodes down at once (maxUnavailable {MAX_UNAVAILABLE}): {down}", cell.play.most_down));
    }
    Outcome { phase, settled_after: cell.settled_after, violations }
}

/// What the analysed cell must show besides: each wave judged once (no more distinct verdicts
/// seen than the rollout has waves: a canary of one, then waves that grow to maxUnavailable),
/// and every verdict of the good revision Passed (a node restarted, a leader changed, a path
/// stalled moves no verdict).
fn analysis_violations(cell: &Cell, fault: Fault) -> Vec<String> {
    let mut violations = Vec::new();
    let most_down = usize::try_from(MAX_UNAVAILABLE).unwrap_or(1).max(1);
    let waves = 1 + (NODES_PER_STEP - 1).div_ceil(most_down);
    if cell.verdicts.len() > waves {
        violations.push(format!("{} verdicts for {waves} waves: {:?}", cell.verdicts.len(), cell.verdicts));
    }
    let failed_on_purpose = fault == Fault::NodeNotReady;
    for (time, verdict) in &cell.verdicts {
        if verdict != "Passed" && !failed_on_purpose {
            violations.push(format!("the good revision's analysis said {verdict} at {time}"));
        }
    }
    if !failed_on_purpose && cell.verdicts.is_empty() {
        violations.push("no analysis verdict was seen".to_owned());
    }
    violations
}
