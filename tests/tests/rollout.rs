//! Rollouts paced by the kernel, against the real API server: the DaemonSets use `OnDelete` and
//! the controller replaces pods itself (a canary, then waves, each after the new pods' agents
//! report the scheduler attached and it baked), rolls a failing revision back, skips nodes whose
//! kernel runs another scheduler, and adopts the pods of an older sked without restarting them.
//!
//! The harness plays the kubelet and the kernel of each node (`sked_tests::fake_nodes`, which
//! `make demo` uses too): for every new pod it starts a real agent (with a token bound to that
//! pod) on a fake sysfs that shows the scheduler attached, or not, as the test wants of that
//! revision; a pod is marked Ready when its agent's /readyz is.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use sked_controller::api::labels::OWNER_LABEL;
use sked_controller::api::{RolloutPhase, RolloutSpec};
use sked_controller::config::ControllerFlags;
use sked_controller::{Scheduler, SchedulerSpec};
use sked_tests::agents::{ReportsEndpoint, ReportsTls};
use sked_tests::fake_nodes::{FakeNodes, Kernel, is_not_found};
use sked_tests::{Fixture, condition, has_condition, spec_on};

const IMAGE: &str = "ghcr.io/schedkit/scx_rusty:v1";
const REVISION: &str = "sked.schedkit.io/revision";

struct Cluster {
    fx: Fixture,
    name: String,
    /// The nodes' kubelets and kernels (see `sked_tests::fake_nodes`).
    nodes: FakeNodes,
    phases: Vec<RolloutPhase>,
    flags: ControllerFlags,
    /// The reports server the agents report to, and its CA.
    controller: String,
    ca: std::path::PathBuf,
    dir: tempfile::TempDir,
}

fn rollout(bake: i32, attach_timeout: i32) -> RolloutSpec {
    RolloutSpec { bake_seconds: Some(bake), attach_timeout_seconds: Some(attach_timeout), ..RolloutSpec::default() }
}

async fn cluster(name: &str, nodes: &[&str], spec: SchedulerSpec) -> Result<Cluster> {
    // Built (or found current) before the controller starts: the harness starts agents from
    // inside the test's runtime, which the in-process controller shares.
    sked_tests::agents::agent_binary()?;
    let dir = tempfile::tempdir()?;
    let tls = ReportsTls::generate(dir.path())?;
    let (flags, controller) = tls.serving_flags()?;
    let fx = Fixture::start_with(flags.clone()).await?;
    for n in nodes {
        fx.create_node(n, &[("pool", name)]).await?;
    }
    fx.create_scheduler(name, spec).await?;
    let reports = ReportsEndpoint { address: &controller, ca: &tls.ca, server_name: None, replicas: None };
    let played = FakeNodes::new(
        &fx.client,
        &fx.namespace,
        &format!("name={name}"),
        &format!("pool={name}"),
        dir.path(),
        &reports,
    );
    let ca = tls.ca.clone();
    Ok(Cluster { fx, name: name.to_owned(), nodes: played, phases: Vec::new(), flags, controller, ca, dir })
}

fn base_spec(name: &str, rollout: RolloutSpec) -> SchedulerSpec {
    SchedulerSpec { expected_ops: Some("rusty".into()), rollout: Some(rollout), ..spec_on(IMAGE, &[("pool", name)]) }
}

impl Cluster {
    /// One move of every node's kubelet and kernel, and the rollout phase it led to.
    async fn drive(&mut self) -> Result<()> {
        self.nodes.drive().await?;
        let s = self.fx.schedulers().get(&self.name).await?;
        record_phase(&mut self.phases, &s);
        Ok(())
    }

    /// Drives the nodes until the Scheduler satisfies `pred`, recording the phases on the way.
    async fn drive_until(&mut self, what: &str, pred: impl Fn(&Scheduler) -> bool) -> Result<Scheduler> {
        let phases = &mut self.phases;
        self.nodes.drive_until(&self.name, what, |s| record_phase(phases, s), pred).await
    }

    async fn patch_spec(&self, spec: serde_json::Value) -> Result<()> {
        let body = json!({ "spec": spec });
        self.fx.schedulers().patch(&self.name, &PatchParams::default(), &Patch::Merge(&body)).await?;
        Ok(())
    }

    /// How often each node's pod was replaced since the harness first saw it.
    fn replacements(&self) -> BTreeMap<String, usize> {
        self.nodes.replacements()
    }

    /// The kubelets and kernels of the pool's nodes for another Scheduler's pods (their fake
    /// kernels in a directory of their own).
    fn play(&self, scheduler: &str) -> Result<FakeNodes> {
        let reports = ReportsEndpoint { address: &self.controller, ca: &self.ca, server_name: None, replicas: None };
        let dir = self.dir.path().join(scheduler);
        std::fs::create_dir_all(&dir)?;
        let (pods, nodes) = (format!("name={scheduler}"), format!("pool={}", self.name));
        Ok(FakeNodes::new(&self.fx.client, &self.fx.namespace, &pods, &nodes, &dir, &reports))
    }
}

/// Appends the Scheduler's rollout phase to `phases` when it is a new one.
fn record_phase(phases: &mut Vec<RolloutPhase>, s: &Scheduler) {
    if let Some(phase) = s.status.as_ref().and_then(|st| st.rollout.as_ref()).map(|r| r.phase)
        && phases.last() != Some(&phase)
    {
        phases.push(phase);
    }
}

/// What kstatus (the library Flux, Argo CD and `helm --wait` use) makes of the Scheduler.
fn kstatus(s: &Scheduler) -> Result<String> {
    use std::io::Write;
    let mut child = std::process::Command::new(sked_tests::cluster::tools_dir().join("kstatus"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running kstatus")?;
    let mut object = serde_json::to_value(s)?;
    object["apiVersion"] = json!("sked.schedkit.io/v1");
    object["kind"] = json!("Scheduler");
    child.stdin.take().context("stdin")?.write_all(&serde_json::to_vec(&object)?)?;
    let out = child.wait_with_output()?;
    anyhow::ensure!(out.status.success(), "kstatus: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).split('\t').next().unwrap_or_default().to_owned())
}

/// Whether `kubectl wait --for=condition=Ready` is satisfied now (it checks once).
fn kubectl_wait_ready(fx: &Fixture, name: &str) -> Result<bool> {
    let out = fx.cluster.kubectl(&["wait", "--for=condition=Ready", &format!("scheduler/{name}"), "--timeout=0s"])?;
    Ok(out.status.success())
}

fn phase(s: &Scheduler) -> Option<RolloutPhase> {
    s.status.as_ref()?.rollout.as_ref().map(|r| r.phase)
}

fn complete_at(s: &Scheduler, generation: i64) -> bool {
    let Some(st) = s.status.as_ref() else { return false };
    phase(s) == Some(RolloutPhase::Complete)
        && st.rollout.as_ref().and_then(|r| r.current_revision.as_ref()).is_some_and(|r| r.generation == generation)
        && condition(s, "Ready").is_some_and(|c| c.status == "True" && c.observed_generation == Some(generation))
}

fn args(pod: &Pod) -> Vec<String> {
    pod.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.args.clone()).unwrap_or_default()
}

#[tokio::test]
async fn a_new_revision_goes_canary_first_then_in_waves_each_node_once() -> Result<()> {
    let nodes = ["w-1", "w-2", "w-3", "w-4"];
    let mut c = cluster("waves", &nodes, base_spec("waves", rollout(2, 30))).await?;
    c.drive_until("the first deployment complete", |s| complete_at(s, 1)).await?;
    assert_eq!(c.replacements().values().sum::<usize>(), 0);
    let first = c.fx.schedulers().get("waves").await?;
    let v1 = first.status.and_then(|s| s.rollout).and_then(|r| r.current_revision).context("current revision")?;

    // A new revision, paused at once: nothing is replaced.
    c.patch_spec(json!({"args": ["--v2"], "rollout": {"paused": true}})).await?;
    let paused = c
        .drive_until("paused", |s| {
            phase(s) == Some(RolloutPhase::Paused) && has_condition(s, "Progressing", "False", "RolloutPaused")
        })
        .await?;
    assert!(has_condition(&paused, "Progressing", "False", "RolloutPaused"));
    assert!(has_condition(&paused, "Reconciling", "True", "RolloutPaused"));
    assert_eq!(c.replacements().values().sum::<usize>(), 0, "a paused rollout replaces nothing");
    // Ready still describes the generation that runs, not the one waiting.
    let ready = condition(&paused, "Ready").context("Ready")?;
    assert_eq!((ready.status.as_str(), ready.observed_generation), ("True", Some(1)));
    assert_eq!(kstatus(&paused)?, "InProgress");
    assert!(!kubectl_wait_ready(&c.fx, "waves")?, "kubectl wait does not take the running generation for this one");

    // Resumed: a canary, then waves of one, never two nodes down at once.
    c.nodes.most_down = 0;
    c.phases.clear();
    c.patch_spec(json!({"rollout": {"paused": false}})).await?;
    let done = c.drive_until("the new revision complete", |s| complete_at(s, 3)).await?;
    let resumed: Vec<&RolloutPhase> = c.phases.iter().filter(|p| **p != RolloutPhase::Paused).collect();
    assert_eq!(resumed.first(), Some(&&RolloutPhase::Canary), "{:?}", c.phases);
    assert!(c.phases.contains(&RolloutPhase::Rolling), "{:?}", c.phases);
    assert!(
        c.nodes.most_down <= 1,
        "at most maxUnavailable (1) node without an attached scheduler: {}",
        c.nodes.most_down
    );
    assert!(c.replacements().values().all(|n| *n == 1), "each node replaced once: {:?}", c.replacements());
    let st = done.status.clone().context("status")?;
    let r = st.rollout.clone().context("rollout")?;
    assert_ne!(r.current_revision.as_ref().map(|r| &r.name), Some(&v1.name));
    assert_eq!((st.updated_number_scheduled, r.attached_nodes), (4, 4));
    assert!(has_condition(&done, "Reconciling", "False", "AsExpected"));
    assert!(has_condition(&done, "Stalled", "False", "AsExpected"));
    assert_eq!(kstatus(&done)?, "Current");
    assert!(kubectl_wait_ready(&c.fx, "waves")?);
    let pods = sked_tests::wait_bound_pods(&c.fx.client, &c.fx.namespace, "waves", 4).await?;
    assert!(pods.values().all(|p| args(p) == ["--v2"]));
    let ds = c.fx.daemonsets().get("waves").await?;
    assert_eq!(ds.spec.update_strategy.and_then(|u| u.type_).as_deref(), Some("OnDelete"));
    Ok(())
}

#[tokio::test]
async fn a_revision_that_never_attaches_is_rolled_back_and_not_retried() -> Result<()> {
    let nodes = ["b-1", "b-2", "b-3"];
    let mut c = cluster("rollback", &nodes, base_spec("rollback", rollout(1, 4))).await?;
    c.drive_until("the first deployment complete", |s| complete_at(s, 1)).await?;
    let before: BTreeMap<String, String> = c.nodes.history.iter().map(|(n, u)| (n.clone(), u[0].clone())).collect();
    let stable =
        c.fx.schedulers().get("rollback").await?.status.and_then(|s| s.rollout).and_then(|r| r.current_revision);

    // The kernel refuses the scheduler of the new revision.
    c.nodes.kernel = Box::new(|_, pod| if args(pod) == ["--broken"] { Kernel::Refuses } else { Kernel::Attaches });
    c.patch_spec(json!({"args": ["--broken"]})).await?;
    let failed = c
        .drive_until("rolled back", |s| {
            phase(s) == Some(RolloutPhase::RolledBack) && has_condition(s, "Degraded", "True", "RolloutFailed")
        })
        .await?;
    let degraded = condition(&failed, "Degraded").context("Degraded")?;
    assert!(degraded.message.contains("attachTimeoutSeconds"), "{}", degraded.message);
    assert!(has_condition(&failed, "Stalled", "True", "RolloutFailed"));
    assert_eq!(kstatus(&failed)?, "Failed");
    let r = failed.status.as_ref().and_then(|s| s.rollout.clone()).context("rollout")?;
    assert_eq!(r.current_revision, stable, "the last attached revision stays current");
    let failure = r.failed.context("failure recorded")?;
    c.fx.wait_event("rollback", "Warning", "RolledBack", 1).await?;
    let metrics = c.fx.scrape_metrics().await?;
    assert!(metrics.lines().any(|l| l == "sked_rollbacks_total{scheduler=\"rollback\"} 1"), "{metrics}");

    // The canary node runs the stable revision again, attached; the others were never touched.
    let restored = c
        .drive_until("the canary restored", |s| {
            has_condition(s, "Ready", "True", "DaemonSetReady")
                && s.status.as_ref().is_some_and(|st| st.kernel_attached == 3)
        })
        .await?;
    let ready = condition(&restored, "Ready").context("Ready")?;
    assert_eq!(ready.observed_generation, Some(1), "Ready does not claim the failed generation");
    let pods = sked_tests::wait_bound_pods(&c.fx.client, &c.fx.namespace, "rollback", 3).await?;
    for (node, pod) in &pods {
        assert!(args(pod).is_empty(), "{node} runs the stable revision");
        if *node != failure.node {
            assert_eq!(pod.uid().as_ref(), before.get(node), "{node} was never replaced");
        }
    }
    assert_eq!(c.replacements().get(&failure.node), Some(&2), "the failed node: replaced, then restored");

    // Not retried while the spec stays: a reconcile after it (a touch of the Scheduler wakes
    // one), and longer than a retry's attach timeout (4 s), replace nothing.
    let replaced = c.replacements();
    let reconciles = c.fx.metric_total("sked_reconciles_total").await?;
    let touch = json!({"metadata": {"annotations": {"example.com/touched": "1"}}});
    c.fx.schedulers().patch("rollback", &PatchParams::default(), &Patch::Merge(&touch)).await?;
    let touched = std::time::Instant::now();
    let deadline = touched + Duration::from_secs(60);
    while c.fx.metric_total("sked_reconciles_total").await? <= reconciles || touched.elapsed() < Duration::from_secs(5)
    {
        anyhow::ensure!(std::time::Instant::now() < deadline, "no reconcile after the touch");
        c.drive().await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let after = c.fx.schedulers().get("rollback").await?;
    assert_eq!(phase(&after), Some(RolloutPhase::RolledBack));
    assert_eq!(c.replacements(), replaced, "the failed revision was tried again");
    let pods = sked_tests::wait_bound_pods(&c.fx.client, &c.fx.namespace, "rollback", 3).await?;
    assert!(pods.values().all(|p| args(p).is_empty()), "no pod of the failed revision");

    // The DaemonSet deleted by hand while the failure is recorded: made again at once, as the
    // rollback left it (the stable revision), and every node runs that again.
    let old = c.fx.daemonsets().get("rollback").await?;
    c.fx.daemonsets().delete("rollback", &Default::default()).await?;
    let again = c.fx.wait_daemonset("rollback", "made again", |d| d.uid() != old.uid()).await?;
    let template = again.spec.template.metadata.as_ref().and_then(|m| m.labels.as_ref());
    let stable_name = stable.as_ref().map(|r| r.name.as_str());
    assert_eq!(template.and_then(|l| l.get(REVISION)).map(String::as_str), stable_name, "the stable revision");
    c.drive_until("every node back on the stable revision", |s| {
        s.status.as_ref().is_some_and(|st| st.kernel_attached == 3) && phase(s) == Some(RolloutPhase::RolledBack)
    })
    .await?;
    let pods = sked_tests::wait_bound_pods(&c.fx.client, &c.fx.namespace, "rollback", 3).await?;
    assert!(pods.values().all(|p| args(p).is_empty()), "no pod of the failed revision");
    Ok(())
}

#[tokio::test]
async fn an_ejection_during_the_bake_rolls_back_and_foreign_nodes_are_skipped() -> Result<()> {
    let nodes = ["e-1", "e-2", "e-3"];
    let mut c = cluster("eject", &nodes, base_spec("eject", rollout(1, 60))).await?;
    // e-3's kernel runs another scheduler: skipped by every rollout, never failing one.
    c.nodes.kernel = Box::new(|node, _| if node == "e-3" { Kernel::Foreign } else { Kernel::Attaches });
    let s = c
        .drive_until("first deployment, e-3 skipped", |s| {
            phase(s) == Some(RolloutPhase::Complete)
                && s.status.as_ref().and_then(|st| st.rollout.as_ref()).is_some_and(|r| r.skipped_nodes == ["e-3"])
        })
        .await?;
    assert!(has_condition(&s, "KernelAttached", "False", "ForeignScheduler"));
    let untouched = c.nodes.history.get("e-3").cloned().context("e-3's pod")?;

    // A whole rollout, canary and waves, reaches every node but e-3, which it never replaces.
    c.patch_spec(json!({"args": ["--v2"], "rollout": {"bakeSeconds": 1}})).await?;
    let done = c
        .drive_until("v2 complete, e-3 skipped", |s| {
            let r = s.status.as_ref().and_then(|st| st.rollout.as_ref());
            phase(s) == Some(RolloutPhase::Complete)
                && r.and_then(|r| r.current_revision.as_ref()).is_some_and(|c| c.generation == 2)
        })
        .await?;
    assert_eq!(done.status.and_then(|s| s.rollout).map(|r| r.skipped_nodes), Some(vec!["e-3".to_owned()]));
    let replaced = c.replacements();
    assert_eq!((replaced.get("e-1"), replaced.get("e-2")), (Some(&1), Some(&1)), "{replaced:?}");
    assert_eq!(c.nodes.history.get("e-3"), Some(&untouched), "the foreign node was never replaced");

    // v3: the kernel ejects the canary's scheduler during its bake.
    c.patch_spec(json!({"args": ["--v3"], "rollout": {"bakeSeconds": 600}})).await?;
    c.drive_until("the canary baking", |s| {
        phase(s) == Some(RolloutPhase::Canary)
            && s.status.as_ref().and_then(|st| st.rollout.as_ref()).is_some_and(|r| r.attached_nodes == 1)
    })
    .await?;
    let pods = sked_tests::wait_bound_pods(&c.fx.client, &c.fx.namespace, "eject", 3).await?;
    let canary_node = pods.iter().find(|(_, p)| args(p) == ["--v3"]).map(|(n, _)| n.clone()).context("canary")?;
    assert_ne!(canary_node, "e-3", "the foreign node is no canary");
    // The canary's scheduler serves its statistics; its agent relays them.
    let agent = c.nodes.agent(&canary_node).context("the canary's agent")?;
    agent.serve_stats(7)?;
    sked_tests::wait_for("the canary's statistics relayed", || async {
        Ok(agent.get("/metrics")?.1.contains("sked_agent_scx_stats_up 1").then_some(()))
    })
    .await?;
    // As the kernel does: its lines in the log (a stall, its detail, its backtrace), then the
    // state disabled.
    c.nodes.eject(&canary_node)?;
    c.nodes.kernel = Box::new(|node, pod| {
        if node == "e-3" {
            Kernel::Foreign
        } else if args(pod) == ["--v3"] {
            Kernel::Refuses
        } else {
            Kernel::Attaches
        }
    });
    let failed = c.drive_until("rolled back", |s| phase(s) == Some(RolloutPhase::RolledBack)).await?;
    let failure = failed.status.and_then(|s| s.rollout).and_then(|r| r.failed).context("failure")?;
    assert_eq!(failure.node, canary_node);
    assert!(failure.cause.contains("stopped running"), "{}", failure.cause);
    // The evidence kept with the failure: the kernel's words and its backtrace.
    let kernel = failure.evidence.as_ref().and_then(|e| e.kernel_exit.as_ref());
    let kernel = kernel.with_context(|| format!("the kernel's exit kept with {failure:?}"))?;
    assert_eq!(
        (kernel.reason.as_str(), kernel.detail.as_str()),
        ("runnable task stall", "kworker/1:2[91] failed to run for 31.004s")
    );
    assert_eq!(kernel.trace, ["scx_watchdog_workfn+0x15b/0x1f0", "process_one_work+0x176/0x330"]);
    // And what the scheduler said last: its statistics, relayed before the kernel ended it.
    let stats = failure.evidence.as_ref().and_then(|e| e.scheduler_stats.as_deref()).unwrap_or_default();
    assert_eq!(stats, r#"{"nr_running":7}"#);
    c.drive_until("the canary restored", |s| s.status.as_ref().is_some_and(|st| st.kernel_attached == 2)).await?;
    let pods = sked_tests::wait_bound_pods(&c.fx.client, &c.fx.namespace, "eject", 3).await?;
    for (node, pod) in &pods {
        let expected: &[&str] = if node == "e-3" { &[] } else { &["--v2"] };
        assert_eq!(args(pod), expected, "{node} runs the revision it ran before v3");
    }
    assert_eq!(c.nodes.history.get("e-3"), Some(&untouched), "the foreign node was never replaced");
    Ok(())
}

/// The nodes of `c` that carry the Scheduler's owner label.
async fn entered(c: &Cluster) -> Result<BTreeSet<String>> {
    let nodes: Api<Node> = Api::all(c.fx.client.clone());
    let selector = format!("pool={},{OWNER_LABEL}={}", c.name, c.name);
    Ok(nodes.list(&ListParams::default().labels(&selector)).await?.items.iter().map(ResourceExt::name_any).collect())
}

fn entering_nodes(s: &Scheduler) -> i32 {
    s.status.as_ref().and_then(|st| st.rollout.as_ref()).map_or(0, |r| r.entering_nodes)
}

fn twenty(prefix: &str) -> Vec<String> {
    (1..=20).map(|i| format!("{prefix}-{i:02}")).collect()
}

#[tokio::test]
async fn a_first_deployment_leaves_the_kernel_default_canary_first_then_in_waves() -> Result<()> {
    let names = twenty("z");
    let nodes: Vec<&str> = names.iter().map(String::as_str).collect();
    let pacing = RolloutSpec { max_unavailable: Some(IntOrString::Int(5)), ..rollout(1, 60) };
    let mut c = cluster("zero", &nodes, base_spec("zero", pacing)).await?;
    // The canary alone first: one node enters, the other 19 wait on the kernel's default.
    let canary = c
        .drive_until("the canary", |s| {
            phase(s) == Some(RolloutPhase::Canary)
                && entering_nodes(s) == 19
                && s.status.as_ref().is_some_and(|st| st.desired_number_scheduled == 20)
        })
        .await?;
    assert_eq!(kstatus(&canary)?, "InProgress");
    assert!(!kubectl_wait_ready(&c.fx, "zero")?);
    let done = c.drive_until("the first deployment complete", |s| complete_at(s, 1)).await?;
    assert_eq!(c.phases.first(), Some(&RolloutPhase::Canary), "{:?}", c.phases);
    assert!(c.phases.contains(&RolloutPhase::Rolling), "{:?}", c.phases);
    assert!(c.nodes.most_down <= 5, "at most maxUnavailable (5) nodes switching at once: {}", c.nodes.most_down);
    assert_eq!(c.nodes.history.len(), 20);
    assert!(c.replacements().values().all(|n| *n == 0), "each node entered once: {:?}", c.replacements());
    // No other node entered before the canary ran attached and Ready: each node's entry is
    // the controller's first patch of its labels (the owner label) in the API server's audit
    // log, to the microsecond.
    let mut entries: Vec<(jiff::Timestamp, String)> = Vec::new();
    for w in c.fx.writes_by(&c.fx.controller_user)? {
        let label_patch =
            w.resource == "nodes" && w.subresource.is_empty() && w.verb == "patch" && names.contains(&w.name);
        if label_patch && !entries.iter().any(|(_, n)| *n == w.name) {
            entries.push((w.received, w.name));
        }
    }
    assert_eq!(entries.len(), 20, "each node entered: {entries:?}");

    let (canary_entered, first) = entries.first().cloned().context("the canary's entry")?;
    let canary_ready = c.nodes.first_ready.get(&first).copied().context("the canary marked Ready")?;
    assert!(canary_ready > canary_entered, "the canary {first} was Ready after it entered");
    for (entered, node) in &entries[1..] {
        assert!(
            *entered > canary_ready,
            "{node} entered at {entered}, before the canary {first} was Ready at {canary_ready}"
        );
    }
    let st = done.status.context("status")?;
    assert_eq!((st.desired_number_scheduled, st.kernel_attached), (20, 20));
    assert_eq!(entering_nodes(&canary), 19, "the 19 others wait, and are counted");
    Ok(())
}

/// When a pod's condition `type_` last turned True.
fn condition_time(pod: &Pod, type_: &str) -> Option<k8s_openapi::jiff::Timestamp> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    let c = conditions.iter().find(|c| c.type_ == type_ && c.status == "True")?;
    c.last_transition_time.as_ref().map(|t| t.0)
}

#[tokio::test]
async fn a_first_revision_that_never_attaches_goes_back_to_the_kernel_default() -> Result<()> {
    let names = twenty("r");
    let nodes: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut c = cluster("refused", &nodes, base_spec("refused", rollout(1, 3))).await?;
    c.nodes.kernel = Box::new(|_, pod| if args(pod).is_empty() { Kernel::Refuses } else { Kernel::Attaches });
    let failed = c
        .drive_until("failed", |s| {
            phase(s) == Some(RolloutPhase::Failed) && has_condition(s, "Stalled", "True", "RolloutFailed")
        })
        .await?;
    let degraded = condition(&failed, "Degraded").map(|c| c.message.clone()).unwrap_or_default();
    assert!(degraded.contains("the kernel did not run the scheduler within 3s"), "{degraded}");
    assert!(degraded.contains("kernel's default scheduler again"), "{degraded}");
    assert_eq!(kstatus(&failed)?, "Failed");
    c.fx.wait_event("refused", "Warning", "RolledBack", 1).await?;
    // Back on the kernel's default: no node carries the label, no pod of the revision is left,
    // and only the canary was ever touched.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !entered(&c).await?.is_empty() || c.nodes.agents().next().is_some() {
        anyhow::ensure!(std::time::Instant::now() < deadline, "the canary still carries the label or runs a pod");
        c.drive().await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let pods: Api<Pod> = Api::namespaced(c.fx.client.clone(), &c.fx.namespace);
    let left = pods.list(&ListParams::default().labels("name=refused")).await?;
    assert!(left.items.iter().all(|p| p.metadata.deletion_timestamp.is_some()), "a pod of the failed revision is left");
    assert_eq!(c.nodes.history.len(), 1, "19 nodes never touched: {:?}", c.nodes.history.keys());
    let failure = failed.status.and_then(|s| s.rollout).and_then(|r| r.failed).context("failure")?;
    assert!(c.nodes.history.contains_key(&failure.node));
    // Deleted by hand while the failure is recorded, the DaemonSet is made again at once (its
    // pods go nowhere: no node carries the label).
    let old = c.fx.daemonsets().get("refused").await?;
    c.fx.daemonsets().delete("refused", &Default::default()).await?;
    c.fx.wait_daemonset("refused", "made again", |d| d.uid() != old.uid()).await?;
    assert!(entered(&c).await?.is_empty());

    // Retried with a fixed spec: a canary again, then every node.
    c.patch_spec(json!({"args": ["--fixed"]})).await?;
    c.phases.clear();
    c.drive_until("the fixed revision complete", |s| complete_at(s, 2)).await?;
    let retried: Vec<&RolloutPhase> = c.phases.iter().filter(|p| **p != RolloutPhase::Failed).collect();
    assert_eq!(retried.first(), Some(&&RolloutPhase::Canary), "{:?}", c.phases);
    assert_eq!(entered(&c).await?.len(), 20);
    Ok(())
}

#[tokio::test]
async fn a_node_that_joins_enters_at_once_and_a_relabelled_one_waits_for_its_wave() -> Result<()> {
    // Every node in one wave, baked a second; then a bake of an hour.
    let pacing = RolloutSpec { canary: Some(0), max_unavailable: Some(IntOrString::Int(3)), ..rollout(1, 60) };
    let mut c = cluster("joins", &["j-1", "j-2", "j-3"], base_spec("joins", pacing)).await?;
    c.drive_until("the first deployment complete", |s| complete_at(s, 1)).await?;
    c.patch_spec(json!({"rollout": {"bakeSeconds": 3600}})).await?;
    let nodes: Api<Node> = Api::all(c.fx.client.clone());
    let pool = |value: Option<&str>| json!({"metadata": {"labels": {"pool": value}}});

    // j-3 leaves the pool: its label goes at once, and its pod with it.
    nodes.patch("j-3", &PatchParams::default(), &Patch::Merge(&pool(None))).await?;
    c.drive_until("j-3 gone", |s| s.status.as_ref().is_some_and(|st| st.desired_number_scheduled == 2)).await?;
    assert!(!entered(&c).await?.contains("j-3"));

    // A node joins the cluster, into the pool: it gets its pod without waiting for the bake.
    let created = c.fx.schedulers().get("joins").await?.metadata.creation_timestamp.context("created")?;
    sked_tests::next_second_after(&created).await?;
    c.fx.create_node("j-new", &[("pool", "joins")]).await?;
    c.drive_until("the new node attached", |s| s.status.as_ref().is_some_and(|st| st.kernel_attached == 3)).await?;
    assert!(entered(&c).await?.contains("j-new"));

    // j-3, there before the Scheduler, is relabelled into the pool again: a switch, held for
    // the bake like any wave.
    nodes.patch("j-3", &PatchParams::default(), &Patch::Merge(&pool(Some("joins")))).await?;
    let waiting = c.drive_until("j-3 waiting to enter", |s| entering_nodes(s) == 1).await?;
    assert_eq!(phase(&waiting), Some(RolloutPhase::Rolling));
    assert!(!entered(&c).await?.contains("j-3"), "j-3 entered before its wave");
    let st = waiting.status.context("status")?;
    assert_eq!(st.desired_number_scheduled, 4, "DESIRED counts the node waiting to enter");
    Ok(())
}

#[tokio::test]
async fn a_new_leader_carries_on_a_rollout_and_replaces_no_node_twice() -> Result<()> {
    let nodes = ["f-1", "f-2", "f-3"];
    let mut c = cluster("failover", &nodes, base_spec("failover", rollout(3, 60))).await?;
    c.drive_until("the first deployment complete", |s| complete_at(s, 1)).await?;
    c.patch_spec(json!({"args": ["--v2"]})).await?;
    c.drive_until("the canary attached", |s| {
        s.status.as_ref().and_then(|st| st.rollout.as_ref()).is_some_and(|r| r.attached_nodes == 1)
    })
    .await?;
    // The leader goes mid-rollout; a new one starts from what the API server holds.
    let old = c.fx.controller_user.clone();
    c.fx.stop_controller().await?;
    let stopped = jiff::Timestamp::now();
    let left: BTreeSet<String> =
        live_pods(&c).await?.into_iter().filter(|p| args(p).is_empty()).map(|p| p.name_any()).collect();
    assert_eq!(left.len(), 2, "the canary alone runs v2 when the leader goes: {left:?}");
    c.fx.start_controller(c.flags.clone())?;
    c.drive_until("the rollout complete under the new leader", |s| complete_at(s, 2)).await?;
    assert!(c.replacements().values().all(|n| *n == 1), "each node replaced once: {:?}", c.replacements());
    // As the API server's audit log has it: the old leader wrote nothing once stopped, and the
    // new one deleted exactly the pods the canary had not replaced.
    let late: Vec<String> = c.fx.writes_by(&old)?.iter().filter(|w| w.received > stopped).map(|w| w.kind()).collect();
    assert!(late.is_empty(), "the stopped controller still wrote: {late:?}");
    let new = c.fx.controller_user.clone();
    assert_eq!(deleted_pods(&c, &new)?, left, "the new leader replaced what was left, once");
    Ok(())
}

/// The Scheduler's pods not being deleted.
async fn live_pods(c: &Cluster) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(c.fx.client.clone(), &c.fx.namespace);
    let list = pods.list(&ListParams::default().labels(&format!("name={}", c.name))).await?;
    Ok(list.items.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect())
}

/// The names of the Scheduler's pods `user` deleted (the API server's audit log).
fn deleted_pods(c: &Cluster, user: &str) -> Result<BTreeSet<String>> {
    let writes = c.fx.writes_by(user)?;
    let prefix = format!("{}-", c.name);
    Ok(writes
        .iter()
        .filter(|w| w.kind() == "pods delete" && w.namespace == c.fx.namespace && w.name.starts_with(&prefix))
        .map(|w| w.name.clone())
        .collect())
}

/// The DaemonSet an earlier sked made: RollingUpdate, nodes excluded by name, no revision label.
fn legacy_daemonset(scheduler: &Scheduler, namespace: &str) -> Result<DaemonSet> {
    let uid = scheduler.uid().context("uid")?;
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {
            "name": scheduler.name_any(), "namespace": namespace,
            "labels": {"name": scheduler.name_any(), "app.kubernetes.io/managed-by": "sked"},
            "ownerReferences": [{"apiVersion": "sked.schedkit.io/v1", "kind": "Scheduler",
                "name": scheduler.name_any(), "uid": uid, "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": {
            "selector": {"matchLabels": {"name": scheduler.name_any()}},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": {"name": scheduler.name_any(), "app.kubernetes.io/managed-by": "sked"}},
                "spec": {
                    "nodeSelector": {"pool": "legacy"},
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchFields": [
                            {"key": "metadata.name", "operator": "NotIn", "values": ["elsewhere"]}]}]}}},
                    "shareProcessNamespace": true,
                    "automountServiceAccountToken": false,
                    "serviceAccountName": "sked-agent",
                    "containers": [
                        {"name": "scx", "image": IMAGE, "securityContext": {"privileged": true}},
                        {"name": "agent", "image": "ghcr.io/schedkit/sked-agent:old",
                         "securityContext": {"capabilities": {"add": ["BPF", "PERFMON", "SYS_ADMIN", "SYS_PTRACE"], "drop": ["ALL"]}}},
                    ],
                },
            },
        },
    }))?)
}

#[tokio::test]
async fn upgrading_from_a_notin_daemonset_restarts_no_pod() -> Result<()> {
    let mut fx = Fixture::without_controller().await?;
    for n in ["l-1", "l-2"] {
        fx.create_node(n, &[("pool", "legacy")]).await?;
    }
    let scheduler = fx.create_scheduler("legacy", spec_on(IMAGE, &[("pool", "legacy")])).await?;
    let daemonsets: Api<DaemonSet> = Api::namespaced(fx.client.clone(), &fx.namespace);
    // Applied as the earlier sked applied it: server-side, field manager "sked".
    let legacy = legacy_daemonset(&scheduler, &fx.namespace)?;
    daemonsets.patch("legacy", &PatchParams::apply("sked").force(), &Patch::Apply(&legacy)).await?;
    let before = sked_tests::wait_bound_pods(&fx.client, &fx.namespace, "legacy", 2).await?;
    fx.mark_pods_ready("legacy").await?;
    let uids: BTreeSet<String> = before.values().filter_map(ResourceExt::uid).collect();

    // The new controller takes over: owner labels first, then its own template, OnDelete.
    fx.start_controller(ControllerFlags::default())?;
    fx.wait_owners(&[("l-1", Some("legacy")), ("l-2", Some("legacy"))]).await?;
    let ds = fx
        .wait_daemonset("legacy", "the new template", |d| {
            d.spec.update_strategy.as_ref().and_then(|u| u.type_.as_deref()) == Some("OnDelete")
                && d.status.as_ref().and_then(|s| s.observed_generation) == d.metadata.generation
        })
        .await?;
    assert!(ds.spec.template.spec.as_ref().is_some_and(|p| p.affinity.is_none()));
    let s = fx
        .wait_scheduler("legacy", "the adopted pods complete", |s| {
            phase(s) == Some(RolloutPhase::Complete) && has_condition(s, "Ready", "True", "DaemonSetReady")
        })
        .await?;
    assert_eq!(s.status.as_ref().map(|st| st.updated_number_scheduled), Some(2), "adopted as the current revision");
    // The same two pods, never restarted.
    let after = sked_tests::wait_bound_pods(&fx.client, &fx.namespace, "legacy", 2).await?;
    assert_eq!(after.values().filter_map(ResourceExt::uid).collect::<BTreeSet<_>>(), uids);
    assert!(after.values().all(|p| !p.labels().contains_key(REVISION)), "the old pods, as they were");
    Ok(())
}

/// How many nodes carry `scheduler`'s owner label without a Ready pod of it.
async fn switching(c: &Cluster, scheduler: &str) -> Result<usize> {
    let nodes: Api<Node> = Api::all(c.fx.client.clone());
    let labelled = nodes.list(&ListParams::default().labels(&format!("{OWNER_LABEL}={scheduler}"))).await?;
    let pods: Api<Pod> = Api::namespaced(c.fx.client.clone(), &c.fx.namespace);
    let ready: BTreeSet<String> = pods
        .list(&ListParams::default().labels(&format!("name={scheduler}")))
        .await?
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && condition_time(p, "Ready").is_some())
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    Ok(labelled.items.iter().filter(|n| !ready.contains(&n.name_any())).count())
}

#[tokio::test]
async fn when_the_winner_is_deleted_the_loser_takes_its_nodes_over_in_waves() -> Result<()> {
    let nodes = ["t-1", "t-2", "t-3", "t-4", "t-5"];
    let pacing = RolloutSpec { max_unavailable: Some(IntOrString::Int(2)), ..rollout(1, 60) };
    let mut c = cluster("takeover", &nodes, base_spec("takeover", pacing.clone())).await?;
    c.drive_until("the winner complete", |s| complete_at(s, 1)).await?;
    // The heir selects the same pool and owns none of it while the winner is there.
    let created = c.fx.schedulers().get("takeover").await?.metadata.creation_timestamp.context("created")?;
    sked_tests::next_second_after(&created).await?;
    c.fx.create_scheduler("heir", SchedulerSpec { args: vec!["--heir".into()], ..base_spec("takeover", pacing) })
        .await?;
    c.fx.wait_scheduler("heir", "no nodes", |s| has_condition(s, "Ready", "False", "NoNodesScheduled")).await?;
    let mut heir = c.play("heir")?;

    // The winner goes: its pods at once (the user asked for its nodes back); the heir takes the
    // nodes over from the kernel's default, canary first, then in waves of two.
    c.fx.schedulers().delete("takeover", &Default::default()).await?;
    let heirs = c.fx.schedulers();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut phases: Vec<RolloutPhase> = Vec::new();
    let (mut canary_seen, mut most_switching) = (false, 0);
    loop {
        for played in [&mut c.nodes, &mut heir] {
            match played.drive().await {
                Err(e) if !is_not_found(&e) => return Err(e),
                _ => {}
            }
        }
        // Switching: labelled for the heir, without a Ready pod of it (the winner's stale labels
        // stay on the nodes still waiting, which run the kernel's default).
        most_switching = most_switching.max(switching(&c, "heir").await?);
        let s = heirs.get("heir").await?;
        if let Some(p) = phase(&s).filter(|p| phases.last() != Some(p)) {
            phases.push(p);
        }
        if phase(&s) == Some(RolloutPhase::Canary) && entering_nodes(&s) == 4 {
            canary_seen = true;
            assert!(heir.agents().count() <= 1, "only the canary runs the heir during the canary");
        }
        if complete_at(&s, 1) && s.status.as_ref().is_some_and(|st| st.kernel_attached == 5) {
            break;
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "the takeover did not complete: {phases:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(canary_seen, "the heir's canary, with 4 nodes waiting: {phases:?}");
    assert_eq!(phases.iter().find(|p| **p != RolloutPhase::Complete), Some(&RolloutPhase::Canary), "{phases:?}");
    assert!(phases.contains(&RolloutPhase::Rolling), "{phases:?}");
    assert!(most_switching <= 2, "at most maxUnavailable (2) nodes switching at once: {most_switching}");
    assert!(heir.replacements().values().all(|n| *n == 0), "each node entered once: {:?}", heir.replacements());
    Ok(())
}

#[tokio::test]
async fn a_node_taken_over_under_the_stable_revision_that_fails_goes_back_to_the_kernel_default() -> Result<()> {
    let pacing = RolloutSpec { max_unavailable: Some(IntOrString::Int(1)), ..rollout(1, 3) };
    let mut c = cluster("grows", &["g-1", "g-2"], base_spec("grows", pacing)).await?;
    c.drive_until("the first deployment complete", |s| complete_at(s, 1)).await?;
    // A node joins the pool: the stable revision takes it over from the kernel's default, and
    // there the kernel refuses it.
    c.fx.create_node("g-3", &[]).await?;
    c.nodes.kernel = Box::new(|node, _| if node == "g-3" { Kernel::Refuses } else { Kernel::Attaches });
    c.fx.relabel_node("g-3", &[("pool", "grows")]).await?;
    let failed = c
        .drive_until("the takeover failed", |s| {
            phase(s) == Some(RolloutPhase::RolledBack) && has_condition(s, "Stalled", "True", "RolloutFailed")
        })
        .await?;
    let failure = failed.status.as_ref().and_then(|s| s.rollout.as_ref()).and_then(|r| r.failed.clone());
    assert_eq!(failure.as_ref().map(|f| f.node.as_str()), Some("g-3"));
    let degraded = condition(&failed, "Degraded").map(|c| c.message.clone()).unwrap_or_default();
    assert!(degraded.contains("the kernel did not run the scheduler within 3s"), "{degraded}");
    assert!(degraded.contains("kernel's default scheduler again"), "{degraded}");
    c.fx.wait_event("grows", "Warning", "RolledBack", 1).await?;
    // g-3 runs the kernel's default again, without the label or a pod; g-1 and g-2 untouched.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while entered(&c).await?.contains("g-3") || c.nodes.agent("g-3").is_some() {
        anyhow::ensure!(std::time::Instant::now() < deadline, "g-3 still carries the label or runs a pod");
        c.drive().await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let st = c.fx.schedulers().get("grows").await?.status.context("status")?;
    assert_eq!((st.kernel_attached, phase_of(&st)), (2, Some(RolloutPhase::RolledBack)));
    assert!(c.replacements().values().all(|n| *n == 0), "{:?}", c.replacements());
    Ok(())
}

fn phase_of(st: &sked_controller::SchedulerStatus) -> Option<RolloutPhase> {
    st.rollout.as_ref().map(|r| r.phase)
}

#[tokio::test]
async fn nodes_that_cannot_run_a_pod_are_skipped_and_do_not_fail_the_rollout() -> Result<()> {
    let pacing = RolloutSpec { max_unavailable: Some(IntOrString::Int(1)), ..rollout(1, 3) };
    let mut c = cluster("skips", &["s-1", "s-2", "s-3"], base_spec("skips", pacing)).await?;
    c.drive_until("the first deployment complete", |s| complete_at(s, 1)).await?;
    // s-3's kubelet stops answering: its Node turns NotReady.
    sked_tests::set_node_ready(&c.fx.client, "s-3", false).await?;
    // A new revision rolls over s-1 and s-2 and leaves s-3 out, past its attach timeout.
    c.patch_spec(json!({"args": ["--v2"]})).await?;
    let done = c
        .drive_until("v2 complete without s-3", |s| {
            phase(s) == Some(RolloutPhase::Complete)
                && s.status.as_ref().and_then(|st| st.rollout.as_ref()).is_some_and(|r| {
                    r.current_revision.as_ref().is_some_and(|c| c.generation == 2) && r.skipped_nodes == ["s-3"]
                })
        })
        .await?;
    let r = done.status.as_ref().and_then(|s| s.rollout.clone()).context("rollout")?;
    assert_eq!(r.skipped_reasons, BTreeMap::from([("NodeNotReady".to_owned(), 1)]));
    assert_eq!(r.failed, None);
    let replaced = c.replacements();
    assert_eq!((replaced.get("s-1"), replaced.get("s-2"), replaced.get("s-3")), (Some(&1), Some(&1), Some(&0)));
    Ok(())
}

#[tokio::test]
async fn a_pool_whose_nodes_all_have_an_untolerated_taint_says_which_and_rolls_once_tolerated() -> Result<()> {
    let mut c = cluster("tainted", &[], base_spec("tainted", rollout(1, 60))).await?;
    let nodes: Api<Node> = Api::all(c.fx.client.clone());
    for n in ["x-1", "x-2"] {
        c.fx.create_node(n, &[]).await?;
        let taint = json!({"spec": {"taints": [{"key": "dedicated", "value": "batch", "effect": "NoSchedule"}]}});
        nodes.patch(n, &PatchParams::default(), &Patch::Merge(&taint)).await?;
        c.fx.relabel_node(n, &[("pool", "tainted")]).await?;
    }
    let s = c
        .drive_until("no pod can run", |s| {
            has_condition(s, "Ready", "False", "NoNodesScheduled")
                && s.status.as_ref().and_then(|st| st.rollout.as_ref()).is_some_and(|r| r.skipped_nodes.len() == 2)
        })
        .await?;
    let ready = condition(&s, "Ready").map(|c| c.message.clone()).unwrap_or_default();
    assert!(ready.contains("dedicated=batch:NoSchedule on x-1, x-2") && ready.contains("spec.tolerations"), "{ready}");
    assert_ne!(phase(&s), Some(RolloutPhase::Rolling), "not Rolling for ever");
    let r = s.status.as_ref().and_then(|st| st.rollout.clone()).context("rollout")?;
    assert_eq!(r.skipped_reasons, BTreeMap::from([("TaintNotTolerated".to_owned(), 2)]));
    assert_eq!(r.current_revision, None, "a revision that ran nowhere is not one to go back to");
    assert!(
        has_condition(&s, "Reconciling", "False", "AsExpected"),
        "nothing to work on until a toleration or the taint changes"
    );
    // Tolerated: the pods go where the taint kept them away, and attach.
    c.patch_spec(
        json!({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "batch", "effect": "NoSchedule"}]}),
    )
    .await?;
    let done = c
        .drive_until("the first deployment complete", |s| {
            complete_at(s, 2) && s.status.as_ref().is_some_and(|st| st.kernel_attached == 2)
        })
        .await?;
    assert!(done.status.and_then(|s| s.rollout).is_some_and(|r| r.skipped_nodes.is_empty()));
    Ok(())
}

#[tokio::test]
async fn a_node_whose_pod_no_kubelet_takes_up_is_skipped_not_a_failed_deployment() -> Result<()> {
    let pacing = RolloutSpec { max_unavailable: Some(IntOrString::Int(1)), ..rollout(1, 3) };
    let mut c = cluster("ghost", &["k-1", "k-2", "k-ghost"], base_spec("ghost", pacing)).await?;
    // k-ghost's kubelet never runs: its pod stays Pending.
    c.nodes.absent.insert("k-ghost".into());
    let done = c
        .drive_until("the first deployment complete without k-ghost", |s| {
            phase(s) == Some(RolloutPhase::Complete)
                && s.status.as_ref().and_then(|st| st.rollout.as_ref()).is_some_and(|r| r.skipped_nodes == ["k-ghost"])
        })
        .await?;
    let r = done.status.as_ref().and_then(|s| s.rollout.clone()).context("rollout")?;
    assert_eq!((r.failed, r.skipped_reasons), (None, BTreeMap::from([("PodNotStarted".to_owned(), 1)])));
    assert_eq!(done.status.as_ref().map(|st| st.kernel_attached), Some(2));
    assert!(r.current_revision.is_some(), "the revision ran attached on every node that can run it");
    Ok(())
}

#[tokio::test]
async fn a_new_leader_carries_a_first_deployment_on_where_it_stood() -> Result<()> {
    let nodes = ["o-1", "o-2", "o-3", "o-4"];
    let mut c = cluster("onward", &nodes, base_spec("onward", rollout(2, 60))).await?;
    c.drive_until("the canary attached", |s| {
        phase(s) == Some(RolloutPhase::Canary)
            && s.status.as_ref().and_then(|st| st.rollout.as_ref()).is_some_and(|r| r.attached_nodes == 1)
    })
    .await?;
    // The leader goes during the canary; the new one reads where the first deployment stood.
    let old = c.fx.controller_user.clone();
    c.fx.stop_controller().await?;
    let stopped = jiff::Timestamp::now();
    let waiting: BTreeSet<String> =
        nodes.iter().map(|n| n.to_string()).filter(|n| !c.nodes.history.contains_key(n)).collect();
    assert_eq!(entered(&c).await?.len(), 1, "the canary alone entered when the leader went");
    c.fx.start_controller(c.flags.clone())?;
    c.drive_until("the first deployment complete under the new leader", |s| complete_at(s, 1)).await?;
    assert!(c.replacements().values().all(|n| *n == 0), "each node entered once: {:?}", c.replacements());
    // As the API server's audit log has it: the old leader wrote nothing once stopped; the new
    // one deleted no pod and set the owner label on the nodes that waited.
    let late: Vec<String> = c.fx.writes_by(&old)?.iter().filter(|w| w.received > stopped).map(|w| w.kind()).collect();
    assert!(late.is_empty(), "the stopped controller still wrote: {late:?}");
    let new = c.fx.controller_user.clone();
    assert_eq!(deleted_pods(&c, &new)?, BTreeSet::new(), "the new leader deleted no pod");
    let labelled: BTreeSet<String> =
        c.fx.writes_by(&new)?.iter().filter(|w| w.kind() == "nodes patch").map(|w| w.name.clone()).collect();
    assert_eq!(labelled, waiting, "the new leader let in the nodes that waited, and no other");
    assert!(c.nodes.most_down <= 1, "at most maxUnavailable (1) node switching at once: {}", c.nodes.most_down);
    assert_eq!(entered(&c).await?.len(), 4);
    Ok(())
}

/// Every copy of the Scheduler the API server stored, from a watch started before the
/// Scheduler was made (a watch hands over each stored change), gathered into the list returned.
fn watch_statuses(fx: &Fixture, name: &str) -> std::sync::Arc<std::sync::Mutex<Vec<Scheduler>>> {
    use futures::StreamExt;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (schedulers, into) = (fx.schedulers(), seen.clone());
    let fields = format!("metadata.name={name}");
    tokio::spawn(async move {
        let params = kube::api::WatchParams::default().fields(&fields).timeout(290);
        let Ok(stream) = schedulers.watch(&params, "0").await else { return };
        let mut stream = stream.boxed();
        while let Some(Ok(event)) = stream.next().await {
            if let kube::api::WatchEvent::Added(s) | kube::api::WatchEvent::Modified(s) = event
                && let Ok(mut seen) = into.lock()
            {
                seen.push(s);
            }
        }
    });
    seen
}

/// What every stored status of a first deployment must hold: the phase never goes back from
/// Rolling to Canary, Ready is not True before the rollout is Complete, and DESIRED never dips
/// but for a node skipped or gone: the nodes it counts plus the skipped ones (the pool) never
/// grow back once they shrank, and shrink only by the `deleted` nodes.
fn no_flicker(seen: &[Scheduler], pool: usize, deleted: usize) -> Result<()> {
    let mut rolled = false;
    let mut counted = Vec::new();
    for s in seen {
        let Some(st) = s.status.as_ref() else { continue };
        let p = phase(s);
        anyhow::ensure!(!(rolled && p == Some(RolloutPhase::Canary)), "back to Canary after Rolling: {st:?}");
        rolled |= p == Some(RolloutPhase::Rolling);
        let ready = condition(s, "Ready").is_some_and(|c| c.status == "True");
        anyhow::ensure!(!ready || p == Some(RolloutPhase::Complete), "Ready before Complete: {st:?}");
        if let Some(r) = st.rollout.as_ref().filter(|_| st.desired_number_scheduled > 0) {
            let total = usize::try_from(st.desired_number_scheduled)? + r.skipped_nodes.len();
            if counted.last() != Some(&total) {
                counted.push(total);
            }
        }
    }
    anyhow::ensure!(rolled, "the deployment never rolled: {} statuses seen", seen.len());
    let expected: Vec<usize> = (0..=deleted).map(|d| pool - d).collect();
    anyhow::ensure!(counted == expected, "DESIRED plus the skipped nodes went {counted:?}, not {expected:?}");
    Ok(())
}

#[tokio::test]
async fn a_first_deployment_finishes_around_nodes_that_cannot_run_its_pod_and_lets_them_in_once_they_can() -> Result<()>
{
    // Three nodes that can run the scheduler, and four that cannot, each as a real fleet has
    // them: one registering (no kubelet ever reported), one full (its pod is never bound), one
    // whose kubelet dies once its pod is made (the Node then goes NotReady), one deleted while
    // its pod waits. The Scheduler tolerates every taint, as "run everywhere" DaemonSets do.
    let name = "fleet";
    let mut spec = base_spec(name, RolloutSpec { canary: Some(1), ..rollout(1, 5) });
    spec.tolerations = vec![serde_json::from_value(json!({"operator": "Exists"}))?];
    sked_tests::agents::agent_binary()?;
    let dir = tempfile::tempdir()?;
    let tls = ReportsTls::generate(dir.path())?;
    let (flags, controller) = tls.serving_flags()?;
    let fx = Fixture::start_with(flags).await?;
    let pool = [("pool", name)];
    for n in ["f-1", "f-2", "f-3", "f-dies", "f-gone"] {
        fx.create_node(n, &pool).await?;
    }
    sked_tests::create_registering_node(&fx.client, "f-registering", &pool).await?;
    sked_tests::create_full_node(&fx.client, "f-full", &pool).await?;
    let watched = watch_statuses(&fx, name);
    fx.create_scheduler(name, spec).await?;
    let reports = ReportsEndpoint { address: &controller, ca: &tls.ca, server_name: None, replicas: None };
    let mut nodes =
        FakeNodes::new(&fx.client, &fx.namespace, &format!("name={name}"), "pool=fleet", dir.path(), &reports);
    // Their kubelets never take a pod up.
    nodes.absent.extend(["f-dies".to_owned(), "f-gone".to_owned()]);
    let pods: Api<Pod> = Api::namespaced(fx.client.clone(), &fx.namespace);
    let node_api: Api<Node> = Api::all(fx.client.clone());
    let (mut died, mut deleted) = (false, false);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    // The kubelets' moves, every 300 ms, as `FakeNodes::drive_until` makes them, with what
    // happens to f-dies and f-gone once their pods are made.
    let done = loop {
        match nodes.drive().await {
            Err(e) if !is_not_found(&e) => return Err(e),
            _ => {}
        }
        let list = pods.list(&ListParams::default().labels("name=fleet")).await?;
        let bound =
            |node: &str| list.items.iter().any(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node));
        if !died && bound("f-dies") {
            // Its pod was made, not started: now its kubelet is gone for good.
            sked_tests::set_node_ready(&fx.client, "f-dies", false).await?;
            died = true;
        }
        if !deleted && bound("f-gone") {
            node_api.delete("f-gone", &Default::default()).await?;
            deleted = true;
        }
        let s = fx.schedulers().get(name).await?;
        let skipped = s.status.as_ref().and_then(|st| st.rollout.as_ref()).map(|r| r.skipped_nodes.len());
        if deleted && complete_at(&s, 1) && skipped == Some(3) {
            break s;
        }
        if tokio::time::Instant::now() > deadline {
            let ds: Api<DaemonSet> = Api::namespaced(fx.client.clone(), &fx.namespace);
            let ds = ds.get(name).await?.status;
            let placed: Vec<(String, Option<String>)> =
                list.items.iter().map(|p| (p.name_any(), p.spec.as_ref().and_then(|s| s.node_name.clone()))).collect();
            anyhow::bail!(
                "timed out waiting for the first deployment to finish; last status: {}; DaemonSet: {ds:?}; pods: {placed:?}",
                serde_json::to_string_pretty(&s.status)?
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    // From every status stored until then.
    let first_deployment: Vec<Scheduler> = watched.lock().map(|seen| seen.clone()).unwrap_or_default();
    no_flicker(&first_deployment, 7, 1)?;
    let st = done.status.clone().context("status")?;
    let r = st.rollout.clone().context("rollout")?;
    assert_eq!(r.skipped_nodes, ["f-dies", "f-full", "f-registering"]);
    assert_eq!(r.skipped_reasons, BTreeMap::from([("NodeNotReady".to_owned(), 2), ("PodNotScheduled".to_owned(), 1)]));
    assert_eq!(r.failed, None);
    assert_eq!((st.desired_number_scheduled, st.kernel_attached), (3, 3), "the nodes that can run it, all attached");
    let kernel = condition(&done, "KernelAttached").context("KernelAttached")?;
    assert_eq!(kernel.status, "True", "no node that cannot run a pod makes it False: {}", kernel.message);
    assert!(kernel.message.contains("3 node(s) skipped (2 NodeNotReady, 1 PodNotScheduled)"), "{}", kernel.message);
    assert!(kubectl_wait_ready(&fx, name)?, "kubectl wait --for=condition=Ready succeeds");
    assert!(!entered_nodes(&fx, name).await?.contains("f-registering"), "a registering node takes no place in a wave");

    // The registering node's kubelet comes up: it enters the current revision by itself.
    sked_tests::set_node_ready(&fx.client, "f-registering", true).await?;
    let joined = nodes
        .drive_until(
            name,
            "f-registering running the scheduler",
            |_| {},
            |s| {
                s.status.as_ref().is_some_and(|st| {
                    st.kernel_attached == 4
                        && st.rollout.as_ref().is_some_and(|r| !r.skipped_nodes.contains(&"f-registering".to_owned()))
                })
            },
        )
        .await?;
    assert_eq!(joined.status.as_ref().map(|st| st.desired_number_scheduled), Some(4));
    assert_eq!(nodes.replacements().values().sum::<usize>(), 0, "no node was switched twice");

    // A new revision over the same pool: it rolls over the four nodes that run the scheduler
    // and around the two that still cannot run a pod, and completes.
    let body = json!({"spec": {"args": ["--v2"]}});
    fx.schedulers().patch(name, &PatchParams::default(), &Patch::Merge(&body)).await?;
    let done = nodes.drive_until(name, "v2 complete around f-dies and f-full", |_| {}, |s| complete_at(s, 2)).await?;
    let r = done.status.as_ref().and_then(|st| st.rollout.clone()).context("rollout")?;
    assert_eq!((r.skipped_nodes.clone(), r.failed.clone()), (vec!["f-dies".to_owned(), "f-full".to_owned()], None));
    assert_eq!(done.status.as_ref().map(|st| (st.desired_number_scheduled, st.kernel_attached)), Some((4, 4)));
    let replaced = nodes.replacements();
    for n in ["f-1", "f-2", "f-3", "f-registering"] {
        assert_eq!(replaced.get(n), Some(&1), "{n} switched once to v2: {replaced:?}");
    }
    assert!(kubectl_wait_ready(&fx, name)?);
    Ok(())
}

/// The nodes that carry `scheduler`'s owner label.
async fn entered_nodes(fx: &Fixture, scheduler: &str) -> Result<BTreeSet<String>> {
    let nodes: Api<Node> = Api::all(fx.client.clone());
    let selector = format!("{OWNER_LABEL}={scheduler}");
    Ok(nodes.list(&ListParams::default().labels(&selector)).await?.items.iter().map(ResourceExt::name_any).collect())
}

/// The first pod delete of each Scheduler (`prefix` of its pods' names) by `user`, in order.
fn first_deletes(c: &Cluster, users: &[String], schedulers: &[&str]) -> Result<Vec<(String, jiff::Timestamp)>> {
    let mut writes = Vec::new();
    for user in users {
        writes.extend(c.fx.writes_by(user)?);
    }
    let mut firsts: Vec<(String, jiff::Timestamp)> = schedulers
        .iter()
        .filter_map(|s| {
            let prefix = format!("{s}-");
            let first = writes
                .iter()
                .filter(|w| w.kind() == "pods delete" && w.namespace == c.fx.namespace && w.name.starts_with(&prefix))
                .map(|w| w.received)
                .min()?;
            Some(((*s).to_owned(), first))
        })
        .collect();
    firsts.sort_by_key(|(_, t)| *t);
    Ok(firsts)
}

/// `helm upgrade` to a new agent image, as the controller sees it: the same Schedulers, a new
/// `--agent-image`. Each Scheduler's pods are a new revision (the agent shares the scheduler's
/// pod), rolled out canary first; across Schedulers one canary runs at a time
/// (`--max-concurrent-canaries` 1), the others wait in phase Queued, also across a restart of
/// the controller during the first canary.
#[tokio::test]
async fn a_new_agent_image_rolls_every_scheduler_out_one_canary_at_a_time() -> Result<()> {
    const NEXT_AGENT: &str = "ghcr.io/schedkit/sked-agent:next";
    let pools = ["up-a", "up-b", "up-c"];
    let mut c = cluster(pools[0], &["ua-1", "ua-2"], base_spec(pools[0], rollout(2, 60))).await?;
    let mut played = Vec::new();
    for pool in &pools[1..] {
        for i in 1..=2 {
            c.fx.create_node(&format!("{pool}-n{i}"), &[("pool", pool)]).await?;
        }
        c.fx.create_scheduler(pool, base_spec(pool, rollout(2, 60))).await?;
        let dir = c.dir.path().join(pool);
        std::fs::create_dir_all(&dir)?;
        let reports = ReportsEndpoint { address: &c.controller, ca: &c.ca, server_name: None, replicas: None };
        let (pods, nodes) = (format!("name={pool}"), format!("pool={pool}"));
        played.push(FakeNodes::new(&c.fx.client, &c.fx.namespace, &pods, &nodes, &dir, &reports));
    }
    let schedulers = c.fx.schedulers();
    let all_complete = |statuses: &[Scheduler], generation| statuses.iter().all(|s| complete_at(s, generation));
    let drive_all = async |c: &mut Cluster, played: &mut Vec<FakeNodes>| -> Result<Vec<Scheduler>> {
        c.drive().await?;
        for p in played.iter_mut() {
            p.drive().await?;
        }
        let mut statuses = Vec::new();
        for pool in pools {
            statuses.push(schedulers.get(pool).await?);
        }
        Ok(statuses)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !all_complete(&drive_all(&mut c, &mut played).await?, 1) {
        anyhow::ensure!(std::time::Instant::now() < deadline, "the first deployments did not complete");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // The upgrade: a new controller with the new agent image.
    c.fx.stop_controller().await?;
    c.fx.start_controller(ControllerFlags { agent_image: NEXT_AGENT.into(), ..c.flags.clone() })?;
    let mut upgraders = vec![c.fx.controller_user.clone()];
    let mut queued: BTreeMap<String, String> = BTreeMap::new();
    let mut most_in_canary = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(150);
    loop {
        let statuses = drive_all(&mut c, &mut played).await?;
        // A status in Canary is a canary holding the one slot: never two at once.
        let in_canary = statuses.iter().filter(|s| phase(s) == Some(RolloutPhase::Canary)).count();
        most_in_canary = most_in_canary.max(in_canary);
        if in_canary == 1 && upgraders.len() == 1 {
            // The controller restarts while the first canary runs: the new term takes that
            // canary's slot from its status before it reconciles anything, so no other starts.
            c.fx.stop_controller().await?;
            c.fx.start_controller(ControllerFlags { agent_image: NEXT_AGENT.into(), ..c.flags.clone() })?;
            upgraders.push(c.fx.controller_user.clone());
        }
        for s in &statuses {
            if phase(s) == Some(RolloutPhase::Queued) {
                // Progressing says why once the DaemonSet controller saw the new template (until
                // then the conditions keep the last state it reported).
                let message = condition(s, "Progressing").map(|c| c.message.clone()).unwrap_or_default();
                if message.starts_with("Queued:") {
                    queued.insert(s.name_any(), message);
                } else {
                    queued.entry(s.name_any()).or_insert(message);
                }
            }
        }
        let on_next_agent = live_pods_of(&c, &pools).await?.iter().all(|p| agent_image(p) == Some(NEXT_AGENT));
        if on_next_agent && all_complete(&statuses, 1) {
            break;
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "the upgrade did not complete; queued: {queued:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(most_in_canary, 1, "Schedulers whose status said Canary at once");
    // Two of three waited for a slot, and said why.
    assert_eq!(queued.len(), 2, "{queued:?}");
    for message in queued.values() {
        assert!(message.starts_with("Queued: revision") && message.contains("at most 1 at a time"), "{message}");
    }
    // Each canary started once the one before it had attached and baked (2 s): its first pod
    // delete comes at least a bake after the previous Scheduler's, less the second the rollout's
    // clock (whole seconds) may round away. Without the gate they come milliseconds apart.
    let firsts = first_deletes(&c, &upgraders, &pools)?;
    assert_eq!(firsts.len(), 3, "{firsts:?}");
    for pair in firsts.windows(2) {
        let apart = pair[1].1.duration_since(pair[0].1);
        assert!(apart >= jiff::SignedDuration::from_secs(1), "canaries {pair:?} started {apart:?} apart");
    }
    // Every node was switched once, to a pod that runs the new agent.
    let mut replaced = c.replacements();
    for p in &played {
        replaced.extend(p.replacements());
    }
    assert!(replaced.len() == 6 && replaced.values().all(|n| *n == 1), "each node replaced once: {replaced:?}");
    Ok(())
}

/// The live pods of the Schedulers `names`.
async fn live_pods_of(c: &Cluster, names: &[&str]) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(c.fx.client.clone(), &c.fx.namespace);
    let mut live = Vec::new();
    for name in names {
        let list = pods.list(&ListParams::default().labels(&format!("name={name}"))).await?;
        live.extend(list.items.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()));
    }
    Ok(live)
}

fn agent_image(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.containers.iter().find(|c| c.name == "agent").and_then(|c| c.image.as_deref())
}

/// A CPU going on or off line under a scheduler without `cpu_online`/`cpu_offline`: the kernel
/// asks it to restart ("unregistered from the main kernel"). During the canary's bake that is a
/// restart, not an ejection: the rollout waits for the scheduler to attach again and goes on.
#[tokio::test]
async fn a_restart_the_kernel_asks_for_during_a_bake_fails_nothing() -> Result<()> {
    let nodes = ["hp-1", "hp-2"];
    let mut c = cluster("hotplug", &nodes, base_spec("hotplug", rollout(1, 60))).await?;
    c.drive_until("the first deployment complete", |s| complete_at(s, 1)).await?;
    // A new revision whose canary bakes long enough for the restart to fall in its bake.
    c.patch_spec(json!({"args": ["--v2"], "rollout": {"bakeSeconds": 20}})).await?;
    c.drive_until("the canary attached", |s| {
        s.status.as_ref().and_then(|st| st.rollout.as_ref()).is_some_and(|r| r.attached_nodes == 1)
    })
    .await?;
    let canary = live_pods(&c)
        .await?
        .into_iter()
        .find(|p| args(p) == ["--v2"])
        .and_then(|p| p.spec.and_then(|s| s.node_name))
        .context("the canary's node")?;
    c.nodes.ask_restart(&canary)?;
    let asked = c
        .drive_until("KernelAttached to tell the restart", |s| {
            condition(s, "KernelAttached").is_some_and(|k| k.message.contains("to restart"))
        })
        .await?;
    let message = condition(&asked, "KernelAttached").map(|k| k.message.clone()).unwrap_or_default();
    assert!(message.contains("the kernel asked") && message.contains("unregistered from the main kernel"), "{message}");
    assert_eq!(phase(&asked), Some(RolloutPhase::Canary), "no rollback for a restart");
    c.nodes.attach_again(&canary)?;
    c.drive_until("the rollout complete", |s| complete_at(s, 2)).await?;
    assert!(!c.phases.contains(&RolloutPhase::RolledBack), "{:?}", c.phases);
    assert!(c.replacements().values().all(|n| *n == 1), "each node replaced once: {:?}", c.replacements());
    Ok(())
}

/// A new agent image whose pods never attach: its canary fails and the Scheduler goes back to
/// the revision that ran, with the agent it ran with, and stays there.
#[tokio::test]
async fn a_new_agent_that_fails_its_canary_is_rolled_back_to_the_previous_agent() -> Result<()> {
    const NEXT_AGENT: &str = "ghcr.io/schedkit/sked-agent:broken";
    let nodes = ["af-1", "af-2", "af-3"];
    let mut c = cluster("agentfail", &nodes, base_spec("agentfail", rollout(1, 8))).await?;
    c.drive_until("the first deployment complete", |s| complete_at(s, 1)).await?;
    let before = live_pods_of(&c, &["agentfail"]).await?;
    let previous = before.first().and_then(agent_image).context("the agent image")?.to_owned();
    c.nodes.kernel =
        Box::new(|_, pod| if agent_image(pod) == Some(NEXT_AGENT) { Kernel::Refuses } else { Kernel::Attaches });
    c.fx.stop_controller().await?;
    c.fx.start_controller(ControllerFlags { agent_image: NEXT_AGENT.into(), ..c.flags.clone() })?;
    let failed = c.drive_until("rolled back", |s| phase(s) == Some(RolloutPhase::RolledBack)).await?;
    let rollout = failed.status.and_then(|st| st.rollout).context("rollout status")?;
    let stable = rollout.current_revision.context("the revision rolled back to")?;
    // Every node back on the previous agent, attached.
    c.drive_until("every node attached again", |s| s.status.as_ref().is_some_and(|st| st.kernel_attached == 3)).await?;
    // The DaemonSet is the revision that ran, agent included: not the failed one.
    let daemonsets: Api<DaemonSet> = Api::namespaced(c.fx.client.clone(), &c.fx.namespace);
    let ds = daemonsets.get("agentfail").await?;
    let template = &ds.spec.template;
    let label = template.metadata.as_ref().and_then(|m| m.labels.as_ref()).and_then(|l| l.get(REVISION));
    assert_eq!(label, Some(&stable.name), "the template is the stable revision's");
    let agent = template.spec.as_ref().and_then(|p| p.containers.iter().find(|c| c.name == "agent"));
    assert_eq!(agent.and_then(|a| a.image.as_deref()), Some(previous.as_str()), "with its agent");
    let after = live_pods_of(&c, &["agentfail"]).await?;
    assert!(after.iter().all(|p| agent_image(p) == Some(previous.as_str())), "the previous agent everywhere");
    Ok(())
}
