//! `make demo`: a local control plane, the CRD, the controller with its reports server, five
//! demo Nodes and the example Scheduler, with the nodes' kubelets and kernels played by
//! `sked_tests::fake_nodes` (the rollout suite's stand-in): each pod gets its own agent on a
//! fake sched_ext tree, the fake kernel attaches the pod's scheduler a moment after it starts,
//! and the pod is Ready when its agent says so. A revision whose args hold
//! `--demo-never-attach` never attaches; one with `--demo-eject` attaches and is then ejected
//! for a runnable task stall; one with `--demo-slow` attaches and strands its nodes' tasks (the
//! stand-in kernel's CPUs run less while four times as many tasks wait), which the analysis of
//! its bake catches; one with `--demo-ignore-limits` attaches and keeps no pod's CPU limit (each
//! node runs a pod of `team-a` limited to half a CPU that wants two), which the pods' CPU
//! contract catches. Prints the table and what to try; `DEMO_SCRIPT=1` runs the tour
//! itself (its last step adds a sixth Node that no kubelet reports on) and exits.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use sked_controller::Scheduler;
use sked_controller::api::RolloutPhase;
use sked_tests::agents::{ReportsEndpoint, ReportsTls};
use sked_tests::fake_nodes::{FakeNodes, Kernel};
use sked_tests::{TestCluster, cluster, create_ready_node, ensure_namespace, ensure_service_account, install_crds};
use tokio::sync::Mutex;

const NODES: [&str; 5] = ["demo-node-1", "demo-node-2", "demo-node-3", "demo-node-4", "demo-node-5"];
const NAME: &str = "scx-rusty";
const NAMESPACE: &str = "sked-system";
/// The example's rollout, made quick enough to watch: bake 5 s, give up on an attach after 15 s,
/// two nodes at a time after the canary; each bake judged by the analysis at its defaults (each
/// node's change from its own window before its switch, against the change of the nodes left
/// alone; 3 samples a node, which a bake of 5 s at the demo agents' 1 s interval holds).
/// Each bake also checks the pods' CPU contract (a pod over its limit fails it).
const QUICK_ROLLOUT: &str = r#"{"spec":{"rollout":{"bakeSeconds":5,"attachTimeoutSeconds":15,"maxUnavailable":2,"analysis":{"minSamples":3,"cpuContract":true}}}}"#;
/// The same for the example's first deployment, with more time to attach: on a machine still
/// busy (the first build, a test run beside it) its agents may take longer than 15 s to start,
/// and a first deployment that fails leaves nothing to show. Analysed already, so the controller
/// keeps every node's health samples from its first attach (it keeps none for a Scheduler
/// without analysis): the tour's first revision follows at once, and its controls need a
/// window before it (a first deployment has none to be judged by, and is not held for it).
const FIRST_ROLLOUT: &str = r#"{"spec":{"rollout":{"bakeSeconds":5,"attachTimeoutSeconds":90,"maxUnavailable":2,"analysis":{"minSamples":3}}}}"#;
const MAX_UNAVAILABLE: usize = 2;
/// A revision whose scheduler slows its nodes down (the example's rollout analyses each bake).
const SLOW_REVISION: &str = r#"{"spec":{"args":["--demo-slow"]}}"#;
/// A revision whose scheduler keeps no pod's CPU limit (no `ops.cgroup_set_bandwidth`).
const IGNORES_LIMITS_REVISION: &str = r#"{"spec":{"args":["--demo-ignore-limits"]}}"#;
/// The namespace of the pods whose CPU limits the demo's nodes keep (or not).
const WORKLOAD_NAMESPACE: &str = "team-a";

/// One line per step of the demo's start.
fn step(what: &str) {
    eprintln!("demo: {what}");
}

/// How the demo's fake kernels treat a pod's scheduler: by the args of its revision.
fn demo_kernel(_node: &str, pod: &Pod) -> Kernel {
    let args = pod.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.args.clone()).unwrap_or_default();
    if args.iter().any(|a| a == "--demo-never-attach") {
        Kernel::Refuses
    } else if args.iter().any(|a| a == "--demo-eject") {
        Kernel::AttachesThenEjected
    } else if args.iter().any(|a| a == "--demo-slow") {
        Kernel::AttachesSlow
    } else if args.iter().any(|a| a == "--demo-ignore-limits") {
        Kernel::AttachesIgnoringLimits
    } else {
        Kernel::Attaches
    }
}

struct Demo {
    cluster: TestCluster,
    client: Client,
    nodes: Arc<Mutex<FakeNodes>>,
    controller: Child,
    _tls: ReportsTls,
}

#[tokio::main]
async fn main() -> Result<()> {
    let demo = start().await?;
    let scripted = std::env::var("DEMO_SCRIPT").is_ok_and(|v| !v.is_empty() && v != "0");
    let result = if scripted { tour(&demo).await } else { interactive(&demo).await };
    stop(demo);
    result
}

async fn start() -> Result<Demo> {
    let started = Instant::now();
    step("starting the control plane on 127.0.0.1 (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)");
    let cluster = tokio::task::spawn_blocking(TestCluster::start).await??;
    let client = cluster.client().await?;
    step("installing the Scheduler CRD and five demo Nodes (no kubelet: the demo plays it, see below)");
    install_crds(&client).await?;
    ensure_namespace(&client, NAMESPACE).await?;
    ensure_service_account(&client, NAMESPACE, "sked-agent").await?;
    for name in NODES {
        create_ready_node(&client, name, &[("schedkit.io/pool", "batch")]).await?;
    }
    tokio::spawn(sked_tests::finish_pod_deletions(client.clone(), NAMESPACE.to_owned()));
    let tls = ReportsTls::generate(&cluster.dir)?;
    let reports_port = cluster::free_port()?;
    step("starting sked-controller with its reports server");
    let controller = start_controller(&cluster, &tls, reports_port)?;

    step("applying examples/scx-rusty.yaml, with a rollout quick enough to watch (bake 5 s), each bake analysed");
    let example = cluster::workspace_root().join("examples/scx-rusty.yaml");
    kubectl(&cluster, &["apply", "-f", &example.to_string_lossy()])?;
    kubectl(&cluster, &["patch", "scheduler", NAME, "--type=merge", "-p", FIRST_ROLLOUT])?;

    step("playing each node's kubelet and kernel: an agent per pod on a fake sched_ext tree");
    let address = format!("https://localhost:{reports_port}");
    let reports = ReportsEndpoint { address: &address, ca: &tls.ca, server_name: None, replicas: None };
    let mut nodes = FakeNodes::new(
        &client,
        NAMESPACE,
        "app.kubernetes.io/managed-by=sked",
        "schedkit.io/pool=batch",
        &cluster.dir,
        &reports,
    );
    nodes.attach_after = Duration::from_millis(800);
    nodes.kernel = Box::new(demo_kernel);
    step("running a pod of team-a on each node, limited to half a CPU, that wants two");
    nodes.limited_pods = limited_pods(&client).await?;
    let nodes = Arc::new(Mutex::new(nodes));
    tokio::spawn(play(nodes.clone()));

    let demo = Demo { cluster, client, nodes, controller, _tls: tls };
    wait_scheduler(&demo, "every node attached", complete).await?;
    // Pacing is not part of a revision: this restarts nothing.
    kubectl(&demo.cluster, &["patch", "scheduler", NAME, "--type=merge", "-p", QUICK_ROLLOUT])?;
    step(&format!("ready in {:.1}s", started.elapsed().as_secs_f64()));
    Ok(demo)
}

/// One pod a node in [`WORKLOAD_NAMESPACE`] (`api-1` on `demo-node-1`...), limited to half a
/// CPU, shown Running (the demo plays its kubelet): their UIDs by node, for the stand-in
/// kernels to write their cgroups.
async fn limited_pods(client: &Client) -> Result<std::collections::BTreeMap<String, String>> {
    ensure_namespace(client, WORKLOAD_NAMESPACE).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
    let mut uids = std::collections::BTreeMap::new();
    for (i, node) in NODES.iter().enumerate() {
        let name = format!("api-{}", i + 1);
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"app": "api"}},
            "spec": {
                "nodeName": node,
                "containers": [{
                    "name": "api",
                    "image": "registry.example/team-a/api:1",
                    "resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "500m"}}
                }]
            }
        }))?;
        let created = pods.create(&kube::api::PostParams::default(), &pod).await?;
        let running =
            serde_json::json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        pods.patch_status(&name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&running)).await?;
        let uid = created.metadata.uid.context("a created pod has a UID")?;
        uids.insert((*node).to_owned(), uid);
    }
    Ok(uids)
}

fn start_controller(cluster: &TestCluster, tls: &ReportsTls, reports_port: u16) -> Result<Child> {
    // The controller binary sits next to this one (same Cargo target directory).
    let controller_bin = match std::env::var("SKED_CONTROLLER_BIN") {
        Ok(path) => PathBuf::from(path),
        Err(_) => std::env::current_exe()?.with_file_name("sked-controller"),
    };
    if !controller_bin.exists() {
        bail!("{} not found: build it with `cargo build -p sked-controller`", controller_bin.display());
    }
    // The demo has no registry to verify signatures against; its trust policy lets the
    // example's repository run unsigned. The built-in default requires schedkit's signature.
    let policy = cluster.dir.join("demo-trust-policy.yaml");
    std::fs::write(&policy, "rules:\n  - repository: ghcr.io/schedkit/*\n    unsigned: allow\n")?;
    let log = std::fs::File::create(cluster.dir.join("sked-controller.log"))?;
    Command::new(&controller_bin)
        .env("KUBECONFIG", &cluster.kubeconfig)
        .args(["--log-format=json", &format!("--reports-bind-address=127.0.0.1:{reports_port}")])
        .arg("--reports-cert-file")
        .arg(&tls.cert)
        .arg("--reports-key-file")
        .arg(&tls.key)
        .arg("--trust-policy")
        .arg(&policy)
        .stdout(log.try_clone()?)
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .context("starting sked-controller")
}

/// The nodes' kubelets and kernels, one move every 300 ms (a kubelet's probes run every few
/// seconds) until the demo stops.
async fn play(nodes: Arc<Mutex<FakeNodes>>) {
    loop {
        if let Err(e) = nodes.lock().await.drive().await
            && !sked_tests::fake_nodes::is_not_found(&e)
        {
            eprintln!("demo: playing the nodes: {e:#}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn stop(mut demo: Demo) {
    let _ = demo.controller.kill();
    let _ = demo.controller.wait();
}

fn kubectl(cluster: &TestCluster, args: &[&str]) -> Result<String> {
    let out = cluster.kubectl(args)?;
    if !out.status.success() {
        bail!("kubectl {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Prints a command as typed and what it printed.
fn show(cluster: &TestCluster, args: &[&str]) -> Result<()> {
    println!("\n$ kubectl {}", args.iter().map(|a| shell_word(a)).collect::<Vec<_>>().join(" "));
    print!("{}", kubectl(cluster, args)?);
    Ok(())
}

/// Prints `kubectl sked ARGS` as typed and what the plugin printed.
fn show_sked(cluster: &TestCluster, args: &[&str]) -> Result<()> {
    show_sked_exiting(cluster, args, 0)
}

/// The same, for a command expected to exit with `code` (`rollout status` of a rolled-back
/// rollout exits 1), which is printed as a shell would show it.
fn show_sked_exiting(cluster: &TestCluster, args: &[&str], code: i32) -> Result<()> {
    println!("\n$ kubectl sked {}", args.join(" "));
    let plugin = sked_tests::agents::workspace_binary("kubectl-sked", "SKED_KUBECTL_SKED_BIN")?;
    let out = Command::new(plugin)
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .args(["-n", NAMESPACE])
        .args(args)
        .output()?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    if out.status.code() != Some(code) {
        bail!(
            "kubectl sked {} exited with {:?}: {}",
            args.join(" "),
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    if code != 0 {
        println!("(exit code {code})");
    }
    Ok(())
}

fn shell_word(a: &str) -> String {
    if a.contains(['{', ' ', '"', '[']) { format!("'{a}'") } else { a.to_owned() }
}

fn phase(s: &Scheduler) -> Option<RolloutPhase> {
    s.status.as_ref()?.rollout.as_ref().map(|r| r.phase)
}

/// The current generation observed, and every node Ready with its scheduler attached.
fn settled(s: &Scheduler) -> bool {
    let nodes = i32::try_from(NODES.len()).unwrap_or(i32::MAX);
    s.status.as_ref().is_some_and(|st| {
        st.observed_generation == s.metadata.generation && st.number_ready == nodes && st.kernel_attached == nodes
    })
}

fn complete(s: &Scheduler) -> bool {
    phase(s) == Some(RolloutPhase::Complete) && settled(s)
}

/// The current generation's revision failed and was rolled back; every node runs the last
/// good one again, Ready and attached.
fn rolled_back(s: &Scheduler) -> bool {
    let failed_now = s.status.as_ref().and_then(|st| st.rollout.as_ref()).and_then(|r| r.failed.as_ref());
    phase(s) == Some(RolloutPhase::RolledBack)
        && failed_now.is_some_and(|f| Some(f.generation) == s.metadata.generation)
        && settled(s)
}

/// Waits (at most three minutes) until the example Scheduler satisfies `pred`; records every
/// rollout phase it passes through.
async fn wait_scheduler(demo: &Demo, what: &str, pred: impl Fn(&Scheduler) -> bool) -> Result<Vec<RolloutPhase>> {
    let schedulers: Api<Scheduler> = Api::all(demo.client.clone());
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut phases = Vec::new();
    loop {
        if let Some(s) = schedulers.get_opt(NAME).await? {
            // Phases of the current generation only (not what the last one ended in).
            let current = s.status.as_ref().is_some_and(|st| st.observed_generation == s.metadata.generation);
            if let Some(p) = phase(&s).filter(|_| current)
                && phases.last() != Some(&p)
            {
                phases.push(p);
            }
            if pred(&s) {
                return Ok(phases);
            }
        }
        if Instant::now() > deadline {
            let why = schedulers.get_opt(NAME).await?.and_then(|s| s.status).and_then(|st| {
                let failed = st.rollout.and_then(|r| r.failed).map(|f| format!("; its rollout failed: {}", f.cause));
                failed.or_else(|| {
                    st.conditions.iter().find(|c| c.type_ == "Ready").map(|c| format!("; Ready: {}", c.message))
                })
            });
            bail!("the demo's Scheduler never got to: {what}{}", why.unwrap_or_default());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

const TABLE: [&str; 2] = ["get", "schedulers"];
const CONDITIONS: [&str; 5] = [
    "get",
    "scheduler",
    NAME,
    "-o",
    "jsonpath={range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{\"\\n\"}{end}",
];

async fn interactive(demo: &Demo) -> Result<()> {
    show(&demo.cluster, &TABLE)?;
    show(&demo.cluster, &["get", "daemonset", "-n", NAMESPACE, "-o", "wide"])?;
    show(&demo.cluster, &CONDITIONS)?;
    println!("{}", what_to_try(&demo.cluster));
    tokio::signal::ctrl_c().await?;
    Ok(())
}

/// What the user can try, each one command, with what they will see.
fn what_to_try(cluster: &TestCluster) -> String {
    let patch = |json: &str| format!("kubectl patch scheduler {NAME} --type=merge -p '{json}'");
    format!(
        "\nThe demo cluster is running. Its nodes' kubelets and kernels are played by the demo: each pod\n\
         gets its own sked-agent on a fake sched_ext tree, whose kernel attaches the pod's scheduler\n\
         a moment after it starts. In another shell:\n\
         \n  export KUBECONFIG={kubeconfig}\n  export PATH={tools}:{plugin}:$PATH\n  kubectl get schedulers -w\n\
         \nEach node's kernel, and a rollout as it goes:\n  kubectl sked -n {NAMESPACE} status {NAME}\n  kubectl sked rollout status {NAME}\n\
         \nThen try, one at a time:\n\
         - A new revision, paced by the kernel: one canary node, a 5 s bake, then waves of two\n    \
         (PHASE Canary -> Rolling -> Complete, UP-TO-DATE counting up):\n    {args}\n\
         - A revision whose scheduler never attaches: the canary fails after 15 s and is rolled back\n    \
         (PHASE RolledBack, Degraded=True RolloutFailed, a RolledBack event; 4 nodes never touched):\n    {broken}\n\
         - A revision the kernel ejects during its bake (the kernel's reason in the cause; what the\n    \
         kernel and the scheduler said last: kubectl sked why {NAME}):\n    {eject}\n\
         - A revision that attaches and slows its nodes down, judged by the analysis of its bake\n    \
         (the canary's change against the nodes it left alone; reason AnalysisFailed):\n    {slow}\n\
         - A revision whose scheduler keeps no pod's CPU limit: the canary's team-a pod runs at 1.38\n    \
         CPU against its 0.5 (kubectl get pods -n team-a -o wide); the pods' CPU contract fails the\n    \
         bake (reason AnalysisFailed, the pod named in the cause):\n    {ignores_limits}\n\
         - Pause, change, resume:\n    {pause}\n    {paused_args}\n    {resume}\n\
         - Events:  kubectl get events -n default --field-selector involvedObject.name={NAME}\n\
         - Delete it (every node back on the kernel's default scheduler at once):\n    kubectl delete scheduler {NAME}\n\
         \nController log: {log}\nDEMO_SCRIPT=1 make demo runs these steps itself. Press Ctrl-C to stop and clean up.",
        kubeconfig = cluster.kubeconfig.display(),
        tools = cluster::tools_dir().display(),
        plugin = sked_tests::agents::workspace_binary("kubectl-sked", "SKED_KUBECTL_SKED_BIN")
            .ok()
            .and_then(|p| p.parent().map(|d| d.display().to_string()))
            .unwrap_or_default(),
        args = patch(r#"{"spec":{"args":["--slice-us","8000"]}}"#),
        broken = patch(r#"{"spec":{"args":["--demo-never-attach"]}}"#),
        eject = patch(r#"{"spec":{"args":["--demo-eject"]}}"#),
        slow = patch(SLOW_REVISION),
        ignores_limits = patch(IGNORES_LIMITS_REVISION),
        pause = patch(r#"{"spec":{"rollout":{"paused":true}}}"#),
        paused_args = patch(r#"{"spec":{"args":["--slice-us","9000"]}}"#),
        resume = patch(r#"{"spec":{"rollout":{"paused":false}}}"#),
        log = cluster.dir.join("sked-controller.log").display(),
    )
}

/// One step of the tour: a title, the command as the user would type it, and what happened.
async fn tour_step(demo: &Demo, title: &str, patch: &str) -> Result<()> {
    println!("\n== {title}");
    demo.nodes.lock().await.most_down = 0;
    show(&demo.cluster, &["patch", "scheduler", NAME, "--type=merge", "-p", patch])?;
    Ok(())
}

/// After a step: the phases seen, the most nodes down at once, the table and the conditions.
async fn tour_report(demo: &Demo, phases: &[RolloutPhase]) -> Result<()> {
    let seen: Vec<&str> = phases.iter().map(|p| p.as_str()).collect();
    println!("phases seen: {}", seen.join(" -> "));
    let down = demo.nodes.lock().await.most_down;
    println!("most nodes without an attached, Ready scheduler at once: {down} (maxUnavailable {MAX_UNAVAILABLE})");
    show(&demo.cluster, &TABLE)?;
    show(&demo.cluster, &CONDITIONS)?;
    show_sked(&demo.cluster, &["status", NAME])?;
    print_revisions(demo).await
}

/// How many nodes run each revision (the pods' revision labels).
async fn print_revisions(demo: &Demo) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(demo.client.clone(), NAMESPACE);
    let list = pods.list(&kube::api::ListParams::default().labels(&format!("name={NAME}"))).await?;
    let mut by_revision = std::collections::BTreeMap::<String, usize>::new();
    for pod in list.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
        let revision = pod.metadata.labels.as_ref().and_then(|l| l.get("sked.schedkit.io/revision")).cloned();
        *by_revision.entry(revision.unwrap_or_default()).or_default() += 1;
    }
    let shown: Vec<String> = by_revision.iter().map(|(r, n)| format!("{r} on {n} nodes")).collect();
    println!("revisions running: {}", shown.join(", "));
    Ok(())
}

async fn tour(demo: &Demo) -> Result<()> {
    show(&demo.cluster, &TABLE)?;
    tour_step(demo, "1. a new revision, paced by the kernel", r#"{"spec":{"args":["--slice-us","8000"]}}"#).await?;
    // Each node's kernel, while the waves go.
    let under_way = |s: &Scheduler| {
        let current = s.status.as_ref().is_some_and(|st| st.observed_generation == s.metadata.generation);
        current && matches!(phase(s), Some(RolloutPhase::Canary | RolloutPhase::Rolling | RolloutPhase::Complete))
    };
    let mut phases = wait_scheduler(demo, "the new revision under way", under_way).await?;
    show_sked(&demo.cluster, &["status", NAME])?;
    phases.extend(wait_scheduler(demo, "the new revision complete", complete).await?);
    phases.dedup();
    tour_report(demo, &phases).await?;

    tour_step(demo, "2. a revision that never attaches", r#"{"spec":{"args":["--demo-never-attach"]}}"#).await?;
    let phases = wait_scheduler(demo, "rolled back, every node attached again", rolled_back).await?;
    tour_report(demo, &phases).await?;
    show(&demo.cluster, &["get", "events", "-n", "default", "--field-selector", "reason=RolledBack"])?;

    tour_step(demo, "3. a revision the kernel ejects during its bake", r#"{"spec":{"args":["--demo-eject"]}}"#).await?;
    let phases = wait_scheduler(demo, "rolled back after the ejection", rolled_back).await?;
    tour_report(demo, &phases).await?;
    show_sked(&demo.cluster, &["why", NAME])?;

    tour_step(demo, "4. a revision that slows its nodes, judged by the analysis of its bake", SLOW_REVISION).await?;
    let phases = wait_scheduler(demo, "rolled back by the analysis", rolled_back).await?;
    tour_report(demo, &phases).await?;
    show_sked_exiting(&demo.cluster, &["rollout", "status", NAME], 1)?;
    show(&demo.cluster, &["get", "events", "-n", "default", "--field-selector", "reason=AnalysisFailed"])?;

    tour_step(
        demo,
        "5. a revision that keeps no pod's CPU limit, caught by the pods' CPU contract",
        IGNORES_LIMITS_REVISION,
    )
    .await?;
    let phases = wait_scheduler(demo, "rolled back by the pods' CPU contract", rolled_back).await?;
    tour_report(demo, &phases).await?;
    show_sked_exiting(&demo.cluster, &["rollout", "status", NAME], 1)?;

    tour_step(demo, "6. pause, change, resume", r#"{"spec":{"rollout":{"paused":true},"args":["--slice-us","9000"]}}"#)
        .await?;
    let paused = |s: &Scheduler| {
        phase(s) == Some(RolloutPhase::Paused)
            && s.status.as_ref().is_some_and(|st| st.observed_generation == s.metadata.generation)
    };
    let phases = wait_scheduler(demo, "paused", paused).await?;
    tour_report(demo, &phases).await?;
    demo.nodes.lock().await.most_down = 0;
    show(
        &demo.cluster,
        &["patch", "scheduler", NAME, "--type=merge", "-p", r#"{"spec":{"rollout":{"paused":false}}}"#],
    )?;
    let phases = wait_scheduler(demo, "the resumed revision complete", complete).await?;
    tour_report(demo, &phases).await?;

    println!("\n== 7. delete the Scheduler");
    show(&demo.cluster, &["delete", "scheduler", NAME])?;
    wait_pods_gone(demo).await?;
    show(&demo.cluster, &["get", "pods", "-n", NAMESPACE])?;

    first_deployment_that_fails(demo).await?;
    a_node_that_cannot_run_a_pod(demo).await?;
    println!("\ntour complete");
    Ok(())
}

/// Tour step 8: the example again, as a first deployment whose scheduler never attaches. The
/// canary fails and goes back to revision zero, the kernel's default scheduler; the other
/// nodes never leave it.
async fn first_deployment_that_fails(demo: &Demo) -> Result<()> {
    println!("\n== 8. a first deployment whose scheduler never attaches");
    demo.nodes.lock().await.most_down = 0;
    let manifest = demo.cluster.dir.join("scx-rusty-never-attaches.yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: sked.schedkit.io/v1\nkind: Scheduler\nmetadata:\n  name: {NAME}\nspec:\n  \
             sched: ghcr.io/schedkit/scx_rusty:latest\n  expectedOps: rusty\n  args: [--demo-never-attach]\n  \
             nodeSelector:\n    schedkit.io/pool: batch\n  \
             rollout: {{bakeSeconds: 5, attachTimeoutSeconds: 15, maxUnavailable: {MAX_UNAVAILABLE}}}\n"
        ),
    )?;
    show(&demo.cluster, &["apply", "-f", &manifest.to_string_lossy()])?;
    let back_to_zero = |s: &Scheduler| {
        let rollout = s.status.as_ref().and_then(|st| st.rollout.as_ref());
        phase(s) == Some(RolloutPhase::Failed) && rollout.is_some_and(|r| r.entering_nodes == 5)
    };
    let phases = wait_scheduler(demo, "failed, every node on the kernel's default", back_to_zero).await?;
    wait_pods_gone(demo).await?;
    tour_report(demo, &phases).await?;
    show(&demo.cluster, &["get", "nodes", "-L", "sked.schedkit.io/scheduler"])?;
    show(&demo.cluster, &["get", "events", "-n", "default", "--field-selector", "reason=RolledBack"])
}

/// The Node of tour step 9: no kubelet ever reported on it.
const GHOST: &str = "demo-node-6-no-kubelet";

/// Tour step 9: a Node no kubelet ever reported on (as one looks while it registers) joins the
/// pool, and the example is deployed again (its spec fixed): the first deployment goes canary
/// first over the five demo nodes, skips the sixth with its reason, and completes around it.
async fn a_node_that_cannot_run_a_pod(demo: &Demo) -> Result<()> {
    println!("\n== 9. a node with no kubelet in the pool");
    sked_tests::create_registering_node(&demo.client, GHOST, &[("schedkit.io/pool", "batch")]).await?;
    println!("(Node {GHOST} joins the pool: no kubelet has reported on it, as a node looks while it registers)");
    demo.nodes.lock().await.most_down = 0;
    let fixed = r#"[{"op":"remove","path":"/spec/args"}]"#;
    show(&demo.cluster, &["patch", "scheduler", NAME, "--type=json", "-p", fixed])?;
    let around = |s: &Scheduler| {
        let skipped = s.status.as_ref().and_then(|st| st.rollout.as_ref()).map(|r| r.skipped_nodes.clone());
        complete(s) && skipped.is_some_and(|n| n == [GHOST])
    };
    let phases = wait_scheduler(demo, "complete around the node with no kubelet", around).await?;
    tour_report(demo, &phases).await?;
    let skipped = "jsonpath=skipped: {.status.rollout.skippedNodes} {.status.rollout.skippedReasons}{\"\\n\"}";
    show(&demo.cluster, &["get", "scheduler", NAME, "-o", skipped])?;
    show_sked(&demo.cluster, &["nodes"])
}

/// Waits until no scheduler pod is left (the nodes run the kernel's default scheduler again).
async fn wait_pods_gone(demo: &Demo) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(demo.client.clone(), NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pods.list(&kube::api::ListParams::default().labels(&format!("name={NAME}"))).await?.items.is_empty() {
        if Instant::now() > deadline {
            bail!("the Scheduler's pods are still there a minute after its deletion");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}
