//! `kubectl sked` against the real API server, with the controller writing each scheduler pod's
//! `sked.schedkit.io/KernelAttached` condition from real agents on fake kernels
//! (`sked_tests::fake_nodes`): what `status`, `nodes` and `doctor` say of attached, not
//! attached, foreign, unsupported, ejected and stale nodes; what a user with only read rights
//! may run; and the rollout commands with their exit codes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use sked_controller::api::{RolloutPhase, RolloutSpec};
use sked_controller::config::ControllerFlags;
use sked_controller::{Scheduler, SchedulerSpec};
use sked_tests::agents::{ReportsEndpoint, ReportsTls, workspace_binary};
use sked_tests::fake_nodes::{FOREIGN_OPS, FakeNodes, Kernel, ops_of_image};
use sked_tests::{Fixture, spec_on, wait_for};

const IMAGE: &str = "ghcr.io/schedkit/scx_rusty:v1";
const STALE_AFTER: Duration = Duration::from_secs(3);
const POD_CONDITION: &str = "sked.schedkit.io/KernelAttached";

/// A pool of nodes with one Scheduler, its pods played by fake kubelets and kernels.
struct Pool {
    fx: Fixture,
    name: String,
    nodes: FakeNodes,
    _dir: tempfile::TempDir,
}

async fn pool(name: &str, nodes: &[&str], rollout: RolloutSpec) -> Result<Pool> {
    // Built before the clock of any attach timeout starts.
    sked_tests::agents::agent_binary()?;
    plugin()?;
    let dir = tempfile::tempdir()?;
    let tls = ReportsTls::generate(dir.path())?;
    let (flags, controller) = tls.serving_flags()?;
    let fx = Fixture::start_with(ControllerFlags { report_stale_after: STALE_AFTER, ..flags }).await?;
    for n in nodes {
        fx.create_node(n, &[("pool", name)]).await?;
    }
    let spec = SchedulerSpec {
        expected_ops: Some("rusty".into()),
        rollout: Some(rollout),
        ..spec_on(IMAGE, &[("pool", name)])
    };
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
    Ok(Pool { fx, name: name.to_owned(), nodes: played, _dir: dir })
}

fn quick() -> RolloutSpec {
    RolloutSpec { bake_seconds: Some(1), attach_timeout_seconds: Some(15), ..RolloutSpec::default() }
}

impl Pool {
    /// Drives the nodes until the Scheduler satisfies `pred`.
    async fn drive_until(&mut self, what: &str, pred: impl Fn(&Scheduler) -> bool) -> Result<Scheduler> {
        self.nodes.drive_until(&self.name, what, |_| {}, pred).await
    }

    /// Runs `kubectl sked -n <workload namespace> ARGS` with `kubeconfig`.
    fn sked(&self, kubeconfig: &Path, args: &[&str]) -> Result<Output> {
        Command::new(plugin()?)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["-n", &self.fx.namespace])
            .args(args)
            .output()
            .context("running kubectl-sked")
    }

    fn admin(&self, args: &[&str]) -> Result<Output> {
        self.sked(&self.fx.cluster.kubeconfig, args)
    }

    /// The pod conditions of the Scheduler's pods, by node: (reason, message).
    async fn pod_conditions(&self) -> Result<BTreeMap<String, (String, String)>> {
        let pods: Api<Pod> = Api::namespaced(self.fx.client.clone(), &self.fx.namespace);
        let list = pods.list(&ListParams::default().labels(&format!("name={}", self.name))).await?;
        Ok(list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| {
                let node = p.spec.as_ref()?.node_name.clone()?;
                let c = p.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == POD_CONDITION)?;
                Some((node, (c.reason.clone().unwrap_or_default(), c.message.clone().unwrap_or_default())))
            })
            .collect())
    }
}

fn plugin() -> Result<PathBuf> {
    workspace_binary("kubectl-sked", "SKED_KUBECTL_SKED_BIN")
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ok(out: Output) -> Result<String> {
    if !out.status.success() {
        bail!("kubectl sked failed ({}): {}", code(&out), String::from_utf8_lossy(&out.stderr));
    }
    Ok(stdout(&out))
}

fn complete(s: &Scheduler) -> bool {
    let st = s.status.clone().unwrap_or_default();
    st.observed_generation == s.metadata.generation
        && st.rollout.is_some_and(|r| r.phase == RolloutPhase::Complete)
        && st.kernel_attached == st.desired_number_scheduled
        && st.desired_number_scheduled > 0
}

/// A node's row in `status -o json`: kernel, ops, last exit's reason.
type Row = (String, Option<String>, Option<String>);

/// Each node's row in `status -o json`.
fn rows(json: &str) -> Result<BTreeMap<String, Row>> {
    let reports: Value = serde_json::from_str(json).context("status -o json")?;
    let nodes = reports[0]["nodes"].as_array().context("nodes")?;
    Ok(nodes
        .iter()
        .map(|r| {
            let text = |v: &Value| v.as_str().map(str::to_owned);
            let node = text(&r["node"]).unwrap_or_default();
            (node, (text(&r["kernel"]).unwrap_or_default(), text(&r["ops"]), text(&r["lastExit"]["reason"])))
        })
        .collect())
}

/// A kubeconfig for the same cluster as `user`, impersonated by the admin (as `kubectl --as`).
fn kubeconfig_as(admin: &Path, user: &str, dir: &Path) -> Result<PathBuf> {
    let text = std::fs::read_to_string(admin)?;
    let path = dir.join(format!("kubeconfig-{user}"));
    std::fs::write(&path, text.replace("  user:\n", &format!("  user:\n    as: {user}\n")))?;
    Ok(path)
}

/// Grants `user` what the chart's viewer ClusterRole grants: get, list and watch of
/// Schedulers, Nodes and pods.
async fn grant_view(fx: &Fixture, user: &str) -> Result<()> {
    let chart = sked_tests::cluster::workspace_root().join("charts/sked");
    let chart = chart.to_string_lossy();
    let rendered = fx.cluster.helm(&["template", "sked", &chart, "--show-only", "templates/viewer-rbac.yaml"])?;
    if !rendered.status.success() {
        bail!("helm template: {}", String::from_utf8_lossy(&rendered.stderr));
    }
    let text = String::from_utf8_lossy(&rendered.stdout).into_owned();
    let docs = text.split("\n---").map(serde_saphyr::from_str::<Value>).collect::<Result<Vec<_>, _>>()?;
    let role = docs
        .iter()
        .find(|d| d["metadata"]["name"] == "sked-viewer")
        .context("the chart renders the sked-viewer ClusterRole")?;
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(fx.client.clone());
    let mut role: k8s_openapi::api::rbac::v1::ClusterRole = serde_json::from_value(role.clone())?;
    role.metadata.name = Some("sked-test-viewer".into());
    role.metadata.resource_version = None;
    let _ = roles.delete("sked-test-viewer", &Default::default()).await;
    roles.create(&PostParams::default(), &role).await?;
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(fx.client.clone());
    let _ = bindings.delete("sked-test-viewer", &Default::default()).await;
    let binding = serde_json::from_value(json!({
        "metadata": {"name": "sked-test-viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "sked-test-viewer"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))?;
    bindings.create(&PostParams::default(), &binding).await?;
    Ok(())
}

const NODES: [&str; 6] = ["t-attached", "t-ejected", "t-foreign", "t-not-attached", "t-stale", "t-unsupported"];

#[tokio::test]
async fn kubectl_sked_tells_each_node_s_kernel_truth_from_the_pod_conditions() -> Result<()> {
    let mut p = pool("truth", &NODES, quick()).await?;
    p.drive_until("rolled out, attached everywhere", complete).await?;
    let ours = ops_of_image(IMAGE);
    wait_for("every pod says attached", || async {
        let conditions = p.pod_conditions().await?;
        Ok((conditions.len() == NODES.len()
            && conditions.values().all(|(reason, message)| reason == "KernelAttached" && message.contains(&ours)))
        .then_some(()))
    })
    .await?;

    // Then each node's kernel goes its own way.
    let agent = |node: &str| p.nodes.agent(node).with_context(|| format!("the agent of {node}"));
    agent("t-not-attached")?.set_kernel("disabled", None, 2)?;
    agent("t-foreign")?.set_kernel("enabled", Some(FOREIGN_OPS), 3)?;
    std::fs::remove_dir_all(agent("t-unsupported")?.sysfs.join("kernel/sched_ext"))?;
    p.nodes.eject("t-ejected")?;
    p.nodes.stop_agent("t-stale");
    let expected: BTreeMap<&str, &str> = [
        ("t-attached", "KernelAttached"),
        ("t-ejected", "KernelEjected"),
        ("t-foreign", "ForeignScheduler"),
        ("t-not-attached", "NotAttached"),
        ("t-stale", "ReportStale"),
    ]
    .into();
    let conditions = wait_for("each pod's condition tells its node's kernel", || async {
        let conditions = p.pod_conditions().await?;
        let reasons: BTreeMap<&str, &str> = conditions
            .iter()
            .filter(|(n, _)| *n != "t-unsupported")
            .map(|(n, (r, _))| (n.as_str(), r.as_str()))
            .collect();
        let unsupported = p.fx.nodes().get("t-unsupported").await?.labels().get("sked.schedkit.io/sched-ext").cloned();
        Ok((reasons == expected && unsupported.as_deref() == Some("unsupported")).then_some(conditions))
    })
    .await?;
    assert_eq!(conditions["t-foreign"].1, format!("the kernel runs another scheduler: ops {FOREIGN_OPS}"));
    assert!(conditions["t-ejected"].1.ends_with(": runnable task stall"), "{:?}", conditions["t-ejected"]);
    assert_eq!(conditions["t-stale"].1, "no report from the node's agent for more than 3s");

    let status = rows(&ok(p.admin(&["status", "truth", "-o", "json"])?)?)?;
    let row = |node: &str| status.get(node).cloned().unwrap_or_default();
    assert_eq!(row("t-attached"), ("attached".into(), Some(ours.clone()), None));
    assert_eq!(row("t-foreign"), ("foreign".into(), Some(FOREIGN_OPS.into()), None));
    assert_eq!(row("t-not-attached").0, "not-attached");
    assert_eq!(row("t-ejected"), ("ejected".into(), Some(ours.clone()), Some("runnable task stall".into())));
    assert_eq!(row("t-stale").0, "stale");
    assert_eq!(row("t-unsupported").0, "unsupported", "a node left out for its kernel still has its row");

    let table = ok(p.admin(&["status", "truth"])?)?;
    assert!(table.starts_with("truth: KERNEL-ATTACHED "), "{table}");
    assert!(table.contains("NODE") && table.contains("LAST-EXIT"), "{table}");
    assert!(table.lines().any(|l| l.starts_with("t-ejected") && l.contains("runnable task stall")), "{table}");
    let not_attached = rows(&ok(p.admin(&["status", "truth", "--not-attached", "-o", "json"])?)?)?;
    assert!(!not_attached.contains_key("t-attached") && not_attached.len() == NODES.len() - 1, "{not_attached:?}");

    let nodes: Value = serde_json::from_str(&ok(p.admin(&["nodes", "-o", "json"])?)?)?;
    let node =
        |name: &str| nodes.as_array().and_then(|a| a.iter().find(|n| n["node"] == name)).cloned().unwrap_or_default();
    assert_eq!(
        (node("t-attached")["kernel"].clone(), node("t-attached")["owner"].clone()),
        (json!("ours"), json!("truth"))
    );
    assert_eq!(
        (node("t-foreign")["kernel"].clone(), node("t-foreign")["ops"].clone()),
        (json!("foreign"), json!(FOREIGN_OPS))
    );
    assert_eq!(node("t-not-attached")["kernel"], json!("none"));
    assert_eq!(node("t-unsupported")["schedExt"], json!("unsupported"));

    let doctor = ok(p.admin(&["doctor", "t-foreign"])?)?;
    assert!(doctor.contains(&format!("Another scheduler owns the kernel (ops {FOREIGN_OPS})")), "{doctor}");
    let doctor = ok(p.admin(&["doctor", "t-unsupported"])?)?;
    assert!(doctor.contains("has no sched_ext"), "{doctor}");
    let doctor = ok(p.admin(&["doctor", "t-stale"])?)?;
    assert!(doctor.contains("has not reported for more than 3s"), "{doctor}");
    assert_eq!(code(&p.admin(&["doctor", "no-such-node"])?), 4, "a missing node is exit 4");

    // Someone with only the viewer's rights reads the same, and may not pause.
    let dir = tempfile::tempdir()?;
    grant_view(&p.fx, "sked-viewer").await?;
    let viewer = kubeconfig_as(&p.fx.cluster.kubeconfig, "sked-viewer", dir.path())?;
    assert_eq!(rows(&ok(p.sked(&viewer, &["status", "truth", "-o", "json"])?)?)?, status);
    ok(p.sked(&viewer, &["nodes"])?)?;
    let refused = p.sked(&viewer, &["rollout", "pause", "truth"])?;
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(code(&refused), 5, "a refusal is exit 5: {said}");
    assert!(said.contains("cannot patch resource \"schedulers\"") && said.contains("sked-viewer"), "{said}");
    // Nor read a node's scheduler statistics through the pod proxy, which the viewer role
    // leaves out: the refusal names the Role that grants it.
    let refused = p.sked(&viewer, &["stats", "t-attached"])?;
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(code(&refused), 5, "a refusal is exit 5: {said}");
    assert!(said.contains("\"pods/proxy\"") && said.contains("<release>-stats-reader Role"), "{said}");
    assert_eq!(code(&p.admin(&["stats", "no-such-node"])?), 4, "no scheduler pod there: exit 4");
    Ok(())
}

#[tokio::test]
async fn kubectl_sked_follows_a_rollout_and_pauses_retries_and_undoes_it() -> Result<()> {
    let mut p = pool("steer", &["s-1", "s-2", "s-3"], quick()).await?;
    // `rollout status` follows the first deployment to its end: exit 0.
    let follow = Command::new(plugin()?)
        .arg("--kubeconfig")
        .arg(&p.fx.cluster.kubeconfig)
        .args(["-n", &p.fx.namespace, "rollout", "status", "steer", "--timeout", "90s"])
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let first = p.drive_until("the first revision rolled out", complete).await?;
    // It ends by itself (within its own --timeout): the rollout is over.
    let followed = tokio::task::spawn_blocking(move || follow.wait_with_output()).await??;
    let said = stdout(&followed);
    assert_eq!(code(&followed), 0, "{said}");
    assert!(said.lines().last().is_some_and(|l| l.starts_with("Scheduler steer rolled out")), "{said}");
    let good = first.status.and_then(|s| s.rollout).and_then(|r| r.current_revision).context("a current revision")?;

    assert_eq!(ok(p.admin(&["rollout", "pause", "steer"])?)?.trim(), "scheduler.sked.schedkit.io/steer paused");
    assert!(p.fx.schedulers().get("steer").await?.spec.rollout.is_some_and(|r| r.paused));
    ok(p.admin(&["rollout", "resume", "steer"])?)?;
    assert!(p.fx.schedulers().get("steer").await?.spec.rollout.is_some_and(|r| !r.paused));
    assert_eq!(code(&p.admin(&["rollout", "retry", "steer"])?), 4, "nothing failed: nothing to retry");

    // A revision whose scheduler never attaches is rolled back: exit 1. The kubelet's play
    // counts the broken revision's pods it starts.
    let broken_started = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = broken_started.clone();
    p.nodes.kernel = Box::new(move |_, pod: &Pod| {
        let args =
            pod.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.args.clone()).unwrap_or_default();
        if args.iter().any(|a| a == "--broken") {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Kernel::Refuses
        } else {
            Kernel::Attaches
        }
    });
    let body = json!({"spec": {"args": ["--broken"]}});
    p.fx.schedulers().patch("steer", &PatchParams::default(), &Patch::Merge(&body)).await?;
    let rolled_back = |s: &Scheduler| {
        s.status.as_ref().and_then(|st| st.rollout.as_ref()).is_some_and(|r| r.phase == RolloutPhase::RolledBack)
            && s.status.as_ref().and_then(|st| st.observed_generation) == s.metadata.generation
    };
    let failed = p.drive_until("the broken revision rolled back", rolled_back).await?;
    let out = p.admin(&["rollout", "status", "steer"])?;
    assert_eq!(code(&out), 1, "{}", stdout(&out));
    assert!(stdout(&out).contains("rolled back to the previous revision: revision"), "{}", stdout(&out));

    // retry: the same revision again, under a new generation: a pod of it is made again.
    let before_retry = broken_started.load(std::sync::atomic::Ordering::SeqCst);
    assert!(before_retry >= 1, "the broken revision's canary ran");
    let said = ok(p.admin(&["rollout", "retry", "steer"])?)?;
    assert!(said.contains("retrying revision"), "{said}");
    let generation = failed.metadata.generation.unwrap_or_default();
    let retried = p
        .drive_until("the retried revision rolled back again", |s| {
            rolled_back(s)
                && s.status
                    .as_ref()
                    .and_then(|st| st.rollout.as_ref()?.failed.as_ref())
                    .is_some_and(|f| f.generation > generation)
        })
        .await?;
    assert_eq!(retried.metadata.generation, Some(generation + 2), "a pause and a resume");
    assert!(
        broken_started.load(std::sync::atomic::Ordering::SeqCst) > before_retry,
        "the retry made a pod of the failed revision again"
    );

    // undo: the spec is set back to the revision that ran attached everywhere. Once the
    // rollback has put it back on every node (the broken one never attaches), no pod may move.
    p.drive_until("the rollback restored every node", |s| {
        rolled_back(s) && s.status.as_ref().is_some_and(|st| st.kernel_attached == 3 && st.number_ready == 3)
    })
    .await?;
    let pods_before_undo = p.nodes.history.clone();
    let said = ok(p.admin(&["rollout", "undo", "steer"])?)?;
    assert!(said.contains(&format!("set back to revision {}", good.name)), "{said}");
    let undone = p.fx.schedulers().get("steer").await?;
    assert_eq!(undone.spec.sched, good.image, "pinned to the recorded digest");
    assert!(undone.spec.args.is_empty(), "the recorded fields: {:?}", undone.spec.args);
    let done = p.drive_until("the undone spec rolled out", complete).await?;
    let current = done.status.and_then(|s| s.rollout).and_then(|r| r.current_revision).context("current")?;
    assert_eq!(current.name, good.name, "the same revision as before, so no pod restarted for it");
    assert_eq!(p.nodes.history, pods_before_undo, "no pod was replaced by the undo");
    assert_eq!(code(&p.admin(&["rollout", "status", "steer", "--watch=false"])?), 0);
    let again = ok(p.admin(&["rollout", "undo", "steer"])?)?;
    assert!(again.contains("already asks for revision"), "{again}");
    assert_eq!(code(&p.admin(&["rollout", "status", "nope"])?), 4, "a missing Scheduler is exit 4");
    Ok(())
}
