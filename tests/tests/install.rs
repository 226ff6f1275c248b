//! `helm install` as the chart README says: a real cert-manager (built from source) in the
//! cluster, no values, `--wait`. The chart's controller pods run as processes
//! ([`ControllerPods`]), so the webhook answers through its Service, the agents' CA is
//! published from the reports Secret, and a forced renewal reaches both servers without a
//! restart. The Kustomize base deploys the same objects; an uninstall removes them.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::{Command, Output};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use sked_tests::agents::{AgentProcess, ReportsEndpoint};
use sked_tests::cluster::{tools_dir, workspace_root};
use sked_tests::controller_pods::ControllerPods;
use sked_tests::{Fixture, wait_for};

const NS: &str = "sked-system";
const CONTROLLER_PODS: &str = "app.kubernetes.io/name=sked,control-plane=controller-manager";

fn helm(fx: &Fixture, args: &[&str]) -> Result<Output> {
    fx.cluster.helm(args)
}

use sked_tests::command::output_text as text;

/// (apiVersion, kind, namespace, name) of every object in a multi-document YAML stream.
fn objects(yaml: &str) -> Result<BTreeSet<(String, String, String, String)>> {
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(yaml)?;
    Ok(docs
        .iter()
        .filter(|doc| doc.get("kind").is_some())
        .map(|doc| {
            let field = |pointer: &str| doc.pointer(pointer).and_then(|v| v.as_str()).unwrap_or_default().to_owned();
            (field("/apiVersion"), field("/kind"), field("/metadata/namespace"), field("/metadata/name"))
        })
        .collect())
}

/// The leaf certificate `address` presents for `name`, verified against `ca_pem`.
async fn served_certificate(address: SocketAddr, ca_pem: &str, name: &str) -> Result<Vec<u8>> {
    sked_tests::agents::served_certificate(address, ca_pem, name, &[]).await
}

async fn secret_key(fx: &Fixture, name: &str, key: &str) -> Result<Option<String>> {
    let secret = Api::<Secret>::namespaced(fx.client.clone(), NS).get_opt(name).await?;
    Ok(secret.and_then(|s| s.data).and_then(|d| d.get(key).map(|v| String::from_utf8_lossy(&v.0).into_owned())))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_with_cert_manager_needs_no_values_and_waits_until_ready() -> Result<()> {
    let fx = fresh_release(&["control-1", "control-2"], &[]).await?;
    let chart = workspace_root().join("charts/sked");
    let chart = chart.to_string_lossy().into_owned();

    // The Kustomize base: generated from the chart (no drift), and accepted by the API server.
    let generated = fx.cluster.dir.join("kustomize-sked.yaml");
    let out = Command::new("bash")
        .arg(workspace_root().join("hack/kustomize.sh"))
        .arg(tools_dir().join("helm"))
        .arg(&generated)
        .output()?;
    ensure!(out.status.success(), "hack/kustomize.sh: {}", text(&out));
    let checked_in = std::fs::read_to_string(workspace_root().join("config/default/sked.yaml"))?;
    assert!(
        std::fs::read_to_string(&generated)? == checked_in,
        "config/default/sked.yaml is not what the chart renders: run `make kustomize`"
    );
    let base = workspace_root().join("config/default");
    let out = fx.cluster.kubectl(&["apply", "-k", &base.to_string_lossy(), "--dry-run=server"])?;
    assert!(out.status.success(), "kubectl apply -k config/default --dry-run=server:\n{}", text(&out));
    let out = fx.cluster.kubectl(&["kustomize", &base.to_string_lossy()])?;
    let kustomized = objects(&String::from_utf8_lossy(&out.stdout))?;
    let out = helm(&fx, &["template", "sked", &chart, "--namespace", NS, "--include-crds"])?;
    let mut rendered = objects(&String::from_utf8_lossy(&out.stdout))?;
    rendered.insert(("v1".into(), "Namespace".into(), String::new(), NS.into()));
    assert_eq!(kustomized, rendered, "Kustomize and Helm deploy the same objects");

    // The README's command, with the chart from this checkout; the test plays the kubelet.
    let pods = ControllerPods::run(fx.cluster, fx.client.clone(), NS, CONTROLLER_PODS, &[("sked-webhook", "webhook")]);
    let started = std::time::Instant::now();
    let install = {
        let (cluster, chart) = (fx.cluster, chart.clone());
        tokio::task::spawn_blocking(move || cluster.helm_install(&chart, NS, &[]))
    };
    let out = install.await??;
    eprintln!("measured: helm install --wait (cert-manager issuing, two replicas ready): {:?}", started.elapsed());
    assert!(
        out.status.success(),
        "helm install --wait:\n{}\n{}\ncert-manager:\n{}",
        text(&out),
        pods.logs(),
        fx.cluster.log_tail("cert-manager-controller", 20)
    );
    let pids: Vec<u32> = pods.pods.lock().map(|p| p.iter().map(|p| p.pid()).collect()).unwrap_or_default();
    assert_eq!(pids.len(), 2, "two controller replicas run");

    // The agents' CA: the leader publishes the reports Secret's ca.crt.
    let ca = wait_for("the reports CA published for the agents", || async {
        let want = secret_key(&fx, "sked-reports-tls", "ca.crt").await?;
        let map = Api::<ConfigMap>::namespaced(fx.client.clone(), NS).get("sked-reports-ca").await?;
        let have = map.data.and_then(|d| d.get("ca.crt").cloned());
        Ok(want.filter(|w| Some(w) == have.as_ref()))
    })
    .await?;
    // An agent that trusts it reaches the leader's reports server under the Service's name.
    let reports_name = format!("sked-reports.{NS}.svc");
    let reports = wait_for("the leader's reports server, trusted through the published CA", || async {
        for port in pods.ports("reports") {
            let address = SocketAddr::from(([127, 0, 0, 1], port));
            if let Ok(cert) = served_certificate(address, &ca, &reports_name).await {
                return Ok(Some((address, cert)));
            }
        }
        Ok(None)
    })
    .await?;

    // The webhook answers through its Service (routed to the pods) once cert-manager injected
    // its CA.
    wait_for("the webhook's caBundle injected by cert-manager", || async {
        let hooks =
            Api::<ValidatingWebhookConfiguration>::all(fx.client.clone()).get("sked-sked-system-schedulers").await?;
        let injected = hooks.webhooks.unwrap_or_default().iter().all(|w| w.client_config.ca_bundle.is_some());
        Ok(injected.then_some(()))
    })
    .await?;
    let scheduler = "apiVersion: sked.schedkit.io/v1\nkind: Scheduler\nmetadata:\n  name: elsewhere\nspec:\n  sched: docker.io/someone/else:v1\n";
    let manifest = fx.cluster.dir.join("elsewhere.yaml");
    std::fs::write(&manifest, scheduler)?;
    let out = fx.cluster.kubectl(&["apply", "-f", &manifest.to_string_lossy()])?;
    assert!(!out.status.success(), "the webhook refuses an image no rule allows");
    assert!(text(&out).contains("is not allowed") && text(&out).contains("add a rule"), "{}", text(&out));

    // A renewal forced through cert-manager reaches both servers without a restart.
    let webhook_name = format!("sked-webhook.{NS}.svc");
    let webhook_ports = pods.ports("webhook");
    let mut before = Vec::new();
    for port in &webhook_ports {
        let address = SocketAddr::from(([127, 0, 0, 1], *port));
        // A replica serves what its Secret held when it last looked (files sync, then reload).
        let served = wait_for("a webhook replica serving a certificate of the chart's CA", || async {
            Ok(served_certificate(address, &ca, &webhook_name).await.ok())
        })
        .await?;
        before.push(served);
    }
    let renewing = std::time::Instant::now();
    for certificate in ["sked-reports", "sked-webhook"] {
        fx.cluster.renew_certificate(NS, certificate)?;
    }
    wait_for("the renewed certificates served", || async {
        let mut renewed = served_certificate(reports.0, &ca, &reports_name).await.is_ok_and(|c| c != reports.1);
        for (port, old) in webhook_ports.iter().zip(&before) {
            let now = served_certificate(SocketAddr::from(([127, 0, 0, 1], *port)), &ca, &webhook_name).await;
            renewed &= now.is_ok_and(|c| &c != old);
        }
        Ok(renewed.then_some(()))
    })
    .await?;
    eprintln!("measured: renewal asked -> both servers present the new certificates: {:?}", renewing.elapsed());
    let after: Vec<u32> = pods.pods.lock().map(|p| p.iter().map(|p| p.pid()).collect()).unwrap_or_default();
    assert_eq!(after, pids, "no replica restarted");

    // An agent that trusts only the published CA is accepted by the leader. Its Scheduler needs
    // an image the policy allows: the user's way, a policy given to helm upgrade.
    let policy = "rules:\n  - repository: \"registry.example/**\"\n    unsigned: allow\n";
    let out = helm(
        &fx,
        &[
            "upgrade",
            "sked",
            &chart,
            "--namespace",
            NS,
            "--reuse-values",
            "--set-string",
            &format!("trust.policy={policy}"),
        ],
    )?;
    assert!(out.status.success(), "{}", text(&out));
    fx.create_node("worker-1", &[("pool", "sched")]).await?;
    wait_for("a Scheduler the new policy admits", || async {
        let spec = sked_controller::SchedulerSpec {
            expected_ops: Some("rusty".into()),
            ..sked_tests::spec_on("registry.example/sched/canary:v1", &[("pool", "sched")])
        };
        Ok(fx.create_scheduler("canary", spec).await.ok().map(|_| ()))
    })
    .await?;
    let pod = sked_tests::wait_bound_pods(&fx.client, NS, "canary", 1)
        .await?
        .remove("worker-1")
        .context("the canary pod on worker-1")?;
    let ca_file = fx.cluster.dir.join("published-ca.crt");
    std::fs::write(&ca_file, &ca)?;
    let leader = leader_reports_port(&fx, &pods).await?;
    let address = format!("https://127.0.0.1:{leader}");
    let endpoint =
        ReportsEndpoint { address: &address, ca: &ca_file, server_name: Some(&reports_name), replicas: None };
    let agents = fx.cluster.dir.join("agents");
    AgentProcess::preset_kernel(&agents, "worker-1", "enabled", Some("rusty_1.0.0_x86_64"), 1)?;
    let mut agent = AgentProcess::for_pod(&fx.client, NS, &agents, &pod, "canary", &endpoint).await?;
    let attached = fx
        .wait_scheduler("canary", "the agent's report accepted", |s| {
            s.status.as_ref().is_some_and(|st| st.kernel_attached_summary.as_deref() == Some("1/1"))
        })
        .await;
    if attached.is_err() {
        eprintln!("agent:\n{}\n{}", agent.stderr_tail(), pods.logs());
    }
    attached?;
    agent.stop();

    // An uninstall removes everything the release made.
    let out = helm(&fx, &["get", "manifest", "sked", "--namespace", NS])?;
    let released = objects(&String::from_utf8_lossy(&out.stdout))?;
    let out = helm(&fx, &["uninstall", "sked", "--namespace", NS, "--wait"])?;
    assert!(out.status.success(), "{}", text(&out));
    for (_, kind, namespace, name) in &released {
        let mut args = vec!["get", kind.as_str(), name.as_str(), "--ignore-not-found", "-o", "name"];
        if !namespace.is_empty() {
            args.extend(["-n", namespace.as_str()]);
        }
        let out = fx.cluster.kubectl(&args)?;
        assert!(out.stdout.is_empty(), "{kind} {namespace}/{name} outlived helm uninstall");
    }
    Ok(())
}

/// The chart as released before this one (the last commit that changed it before the chart made
/// its own CA): what `helm upgrade` starts from.
const PREVIOUS_CHART: &str = "f8187c9";

/// Reconciles each running controller has done so far (by pod UID), from their /metrics.
async fn reconciles(pods: &ControllerPods) -> std::collections::BTreeMap<String, u64> {
    let ports: Vec<(String, u16)> = pods
        .pods
        .lock()
        .map(|p| p.iter().filter_map(|p| Some((p.uid.clone(), *p.ports.get("metrics")?))).collect())
        .unwrap_or_default();
    let mut counts = std::collections::BTreeMap::new();
    for (uid, port) in ports {
        let body = sked_tests::controller_pods::get(port, "/metrics").await.unwrap_or_default();
        let count: f64 = body
            .lines()
            .filter(|l| l.starts_with("sked_reconciles_total"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        counts.insert(uid, count as u64);
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helm_upgrade_from_the_previous_chart_restarts_no_scheduler_pod() -> Result<()> {
    let fx = fresh_release(&["control-1", "control-2"], &[("pool", "sched")]).await?;
    // The previous chart wanted an issuer and the CA by hand: a CA made through cert-manager.
    let ca_objects = fx.cluster.dir.join("test-ca.yaml");
    std::fs::write(
        &ca_objects,
        format!(
            "apiVersion: cert-manager.io/v1\nkind: Issuer\nmetadata: {{name: test-selfsigned, namespace: {NS}}}\nspec: {{selfSigned: {{}}}}\n---\n\
             apiVersion: cert-manager.io/v1\nkind: Certificate\nmetadata: {{name: test-ca, namespace: {NS}}}\n\
             spec: {{isCA: true, commonName: test-ca, secretName: test-ca, issuerRef: {{name: test-selfsigned, kind: Issuer}}}}\n---\n\
             apiVersion: cert-manager.io/v1\nkind: Issuer\nmetadata: {{name: test-ca, namespace: {NS}}}\nspec: {{ca: {{secretName: test-ca}}}}\n"
        ),
    )?;
    let out = fx.cluster.kubectl(&["apply", "-f", &ca_objects.to_string_lossy()])?;
    ensure!(out.status.success(), "{}", text(&out));
    let ca = wait_for("the test CA issued", || secret_key(&fx, "test-ca", "ca.crt")).await?;
    let previous = fx.cluster.dir.join("previous-chart");
    std::fs::create_dir_all(&previous)?;
    let archive = Command::new("git")
        .current_dir(workspace_root())
        .args(["archive", "--format=tar", PREVIOUS_CHART, "charts/sked"])
        .output()?;
    ensure!(archive.status.success(), "git archive {PREVIOUS_CHART}: {}", text(&archive));
    let tar = fx.cluster.dir.join("previous-chart.tar");
    std::fs::write(&tar, &archive.stdout)?;
    let out = Command::new("tar").arg("-xf").arg(&tar).arg("-C").arg(&previous).output()?;
    ensure!(out.status.success(), "{}", text(&out));
    let previous = previous.join("charts/sked");

    // The previous chart, installed as its README said, allowing unsigned images for the test,
    // with its own CRD: the fixture's (the current one, applied by another field manager) goes
    // first, as on a cluster that never had sked.
    let out = fx.cluster.kubectl(&["delete", "crd", "schedulers.sked.schedkit.io", "--wait=true"])?;
    ensure!(out.status.success(), "{}", text(&out));
    let pods = ControllerPods::run(fx.cluster, fx.client.clone(), NS, CONTROLLER_PODS, &[("sked-webhook", "webhook")]);
    let values = [
        "--set",
        "reports.tls.issuerRef.name=test-ca",
        "--set-string",
        &format!("reports.tls.caBundle={ca}"),
        "--set-string",
        "trust.policy=rules:\n  - repository: \"**\"\n    unsigned: allow\n",
    ];
    let install = {
        let (cluster, chart) = (fx.cluster, previous.to_string_lossy().into_owned());
        let values: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        tokio::task::spawn_blocking(move || {
            let mut args = vec!["install", "sked", &chart, "--namespace", NS, "--wait", "--timeout", "5m"];
            args.extend(values.iter().map(String::as_str));
            cluster.helm(&args)
        })
    };
    let out = install.await??;
    assert!(out.status.success(), "helm install (previous chart):\n{}\n{}", text(&out), pods.logs());
    // The harness's controller pods run this checkout's binary, which writes this release's
    // status fields (server-side apply refuses a field the CRD does not declare): this
    // release's CRD first, as the chart README asks before an upgrade. A real previous
    // release's controller writes only the fields its own CRD has.
    let crd = workspace_root().join("crds/sked.schedkit.io_schedulers.yaml");
    let out = fx.cluster.kubectl(&["apply", "--server-side", "--force-conflicts", "-f", &crd.to_string_lossy()])?;
    ensure!(out.status.success(), "{}", text(&out));

    // A Scheduler and its pods, from the previous release's controller.
    let spec = sked_tests::spec_on("registry.example/sched/canary:v1", &[("pool", "sched")]);
    fx.create_scheduler("canary", spec).await?;
    let before = sked_tests::wait_bound_pods(&fx.client, NS, "canary", 2).await?;
    let uids = |pods: &std::collections::BTreeMap<String, k8s_openapi::api::core::v1::Pod>| -> BTreeSet<String> {
        pods.values().filter_map(|p| p.metadata.uid.clone()).collect()
    };

    // The upgrade to this chart, keeping the values.
    let upgrade = {
        let (cluster, chart) = (fx.cluster, workspace_root().join("charts/sked").to_string_lossy().into_owned());
        tokio::task::spawn_blocking(move || {
            cluster.helm(&[
                "upgrade",
                "sked",
                &chart,
                "--namespace",
                NS,
                "--reset-then-reuse-values",
                "--wait",
                "--timeout",
                "5m",
            ])
        })
    };
    let out = upgrade.await??;
    assert!(out.status.success(), "helm upgrade:\n{}\n{}", text(&out), pods.logs());
    // The upgraded release's leader reconciles the Scheduler (poked after the upgrade settled).
    let settled = reconciles(&pods).await;
    let out = fx.cluster.kubectl(&["annotate", "scheduler", "canary", "sked-tests/poke=after-upgrade"])?;
    ensure!(out.status.success(), "{}\n{}", text(&out), pods.logs());
    wait_for("a reconcile after the upgrade", || async {
        let now = reconciles(&pods).await;
        Ok(now.iter().any(|(uid, n)| *n > settled.get(uid).copied().unwrap_or(0)).then_some(()))
    })
    .await?;
    let after = sked_tests::wait_bound_pods(&fx.client, NS, "canary", 2).await?;
    assert_eq!(uids(&after), uids(&before), "the upgrade restarted no scheduler pod");

    // An uninstall stops the controller and leaves the running schedulers alone.
    let out = helm(&fx, &["uninstall", "sked", "--namespace", NS, "--wait"])?;
    assert!(out.status.success(), "{}", text(&out));
    let out = fx.cluster.kubectl(&[
        "get",
        "deployment",
        "sked-controller-manager",
        "-n",
        NS,
        "--ignore-not-found",
        "-o",
        "name",
    ])?;
    assert!(out.stdout.is_empty(), "the controller is gone");
    fx.daemonsets().get("canary").await.context("the Scheduler's DaemonSet outlives the release")?;
    let left = sked_tests::wait_bound_pods(&fx.client, NS, "canary", 2).await?;
    assert_eq!(uids(&left), uids(&before), "helm uninstall stopped no scheduler pod");
    Ok(())
}

/// A cluster as a first `helm install` finds it: cert-manager running, the release namespace
/// fresh, and Ready `nodes` with `labels`.
async fn fresh_release(nodes: &[&str], labels: &[(&str, &str)]) -> Result<Fixture> {
    let fx = Fixture::without_controller().await?;
    fx.cluster.start_cert_manager()?;
    sked_tests::objects::fresh_release_namespace(&fx.client, NS).await;
    for node in nodes {
        fx.create_node(node, labels).await?;
    }
    Ok(fx)
}

/// The reports port of the leading replica (its pod carries the leader label the reports
/// Service selects).
async fn leader_reports_port(fx: &Fixture, pods: &ControllerPods) -> Result<u16> {
    wait_for("the leading replica", || async {
        let leading = format!("{CONTROLLER_PODS},sked.schedkit.io/leader=true");
        let listed =
            Api::<Pod>::namespaced(fx.client.clone(), NS).list(&ListParams::default().labels(&leading)).await?;
        Ok(listed.items.first().and_then(|p| pods.port_of(&p.name_any(), "reports")))
    })
    .await
}

/// The `sh` blocks of a Markdown text, in order.
fn sh_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(String::new()),
            (Some(block), "```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

/// Why the guide's test leaves a block to the reader, if it does: a shell on a node, or logs
/// read through a kubelet (the test cluster's pods have none).
fn not_run_here(block: &str) -> Option<&'static str> {
    let first = block.lines().next().unwrap_or_default();
    if first.starts_with("# On the node") {
        Some("needs a shell on a node")
    } else if first.starts_with("# Through the kubelet") {
        Some("reads logs through a kubelet")
    } else {
        None
    }
}

/// docs/usage.md as a reader runs it on a cluster of their own: every command of its `sh`
/// blocks that needs no node shell, as written, in order, in the reader's directory (holding
/// their cosign key), with four substitutions only: the test registry for
/// `registry.example.com`, this checkout's `./charts/sked`, `make images` as the script it runs
/// (its set-up is what `make test` did already), and no `SCHED=bpfland`
/// (building scx_bpfland takes minutes of clang: a stand-in of that image is pushed and signed
/// with the reader's key instead). The images are this checkout's own, built by `make images`
/// (from the test build's binaries); the chart's controller pods run as processes and the
/// nodes' kubelets and kernels are played, as in the other suites.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_usage_guide_goes_from_images_built_here_to_an_attached_scheduler_and_back() -> Result<()> {
    let fx = fresh_release(&["control-1", "worker-1", "worker-2"], &[]).await?;
    let registry = sked_tests::registry::TestRegistry::start()?;
    let cosign = sked_tests::registry::Cosign::new()?;
    let key = cosign.generate_key_pair("reader")?;
    let reader = tempfile::Builder::new().prefix("sked-guide-").tempdir()?;
    std::fs::copy(&key.key, reader.path().join("cosign.key"))?;
    let digest = registry.push("sked/scx-bpfland", "1.1.4", "a stand-in for scx_bpfland 1.1.4")?;
    cosign.sign_with_key(&format!("{}/sked/scx-bpfland@{digest}", registry.host), &key.key)?;

    let root = workspace_root();
    let guide = std::fs::read_to_string(root.join("docs/usage.md"))?;
    let script = root.join("hack/publish-images.sh");
    let substitute = |block: &str| {
        let block = block
            .replace("registry.example.com/sked", &format!("{}/sked", registry.host))
            .replace("./charts/sked", &root.join("charts/sked").to_string_lossy())
            .replace(" SCHED=bpfland", "");
        // `make images VARS` is `make setup`, the tools `make test` built already, then the
        // script with VARS (run directly: relinking the tools would race the other suites).
        block
            .lines()
            .map(|line| match line.strip_prefix("make images ") {
                Some(vars) => format!("env {vars} bash {}", script.display()),
                None => line.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let plugin = sked_tests::agents::workspace_binary("kubectl-sked", "SKED_KUBECTL_SKED_BIN")?;
    let path = format!(
        "{}:{}:{}",
        tools_dir().display(),
        plugin.parent().context("kubectl-sked's directory")?.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let controller_bin = sked_tests::agents::workspace_binary("sked-controller", "SKED_CONTROLLER_BIN")?;
    let agent_bin = sked_tests::agents::workspace_binary("sked-agent", "SKED_AGENT_BIN")?;
    let run_block = |block: String| {
        let mut cmd = Command::new("bash");
        cmd.arg("-euo")
            .arg("pipefail")
            .arg("-c")
            .arg(block)
            .current_dir(reader.path())
            .env("PATH", &path)
            .env("TUF_ROOT", reader.path().join("tuf"))
            .env("KUBECONFIG", &fx.cluster.kubeconfig)
            .env("HELM_CACHE_HOME", fx.cluster.dir.join("helm/cache"))
            .env("HELM_CONFIG_HOME", fx.cluster.dir.join("helm/config"))
            .env("HELM_DATA_HOME", fx.cluster.dir.join("helm/data"))
            .env("COSIGN_PASSWORD", "")
            .env("SKED_CONTROLLER_BIN", &controller_bin)
            .env("SKED_AGENT_BIN", &agent_bin)
            .env("SKED_TOOLS_BIN", tools_dir());
        tokio::task::spawn_blocking(move || cmd.output())
    };

    let pods = ControllerPods::run(fx.cluster, fx.client.clone(), NS, CONTROLLER_PODS, &[("sked-webhook", "webhook")]);
    let mut nodes_driven: Option<tokio::task::JoinHandle<()>> = None;
    let (mut ran, mut left) = (0, Vec::new());
    for block in sh_blocks(&guide) {
        if let Some(why) = not_run_here(&block) {
            left.push(why);
            continue;
        }
        let out = run_block(substitute(&block)).await??;
        ensure!(
            out.status.success(),
            "docs/usage.md's block failed:\n{block}\n{}\ncontroller pods:\n{}",
            text(&out),
            pods.logs()
        );
        ran += 1;
        // Once the chart is installed, the nodes' kubelets and kernels are played.
        if nodes_driven.is_none() && block.contains("helm install") {
            nodes_driven = Some(drive_pool_nodes(&fx, &pods).await?);
            let deployment = fx.cluster.kubectl(&[
                "get",
                "deployment/sked-controller-manager",
                "-n",
                NS,
                "-o",
                "jsonpath={.spec.template.spec.containers[0].image} {.spec.template.spec.containers[0].args}",
            ])?;
            let deployment = text(&deployment);
            let pinned = format!("{}/sked/sked:dev-", registry.host);
            assert!(deployment.contains(&pinned) && deployment.contains("@sha256:"), "{deployment}");
            let agent = format!("--agent-image={}/sked/sked-agent:dev-", registry.host);
            assert!(deployment.contains(&agent), "the chart's agent image is the one pushed: {deployment}");
        }
        if block.contains("kubectl wait --for=condition=Ready") {
            let s = fx.schedulers().get("scx-bpfland").await?;
            let st = s.status.context("scx-bpfland's status")?;
            assert_eq!(st.kernel_attached_summary.as_deref(), Some("2/2"), "the guide's wait ends attached");
            assert_eq!(st.resolved_image.as_deref().map(|i| i.contains(&digest)), Some(true));
        }
    }
    eprintln!("measured: docs/usage.md ran {ran} blocks; left to the reader: {left:?}");
    assert!(ran >= 10, "the guide's blocks ran: {ran}");
    assert_eq!(left, ["needs a shell on a node", "reads logs through a kubelet"]);

    // Its images are what `make images` pushed: this checkout's controller, runnable.
    let export = fx.cluster.dir.join("controller-image");
    std::fs::create_dir_all(&export)?;
    let reference = format!("{}/sked/sked:dev-{}", registry.host, git_short_head()?);
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "{} export --insecure {reference} - | tar -x -C {}",
            tools_dir().join("crane").display(),
            export.display()
        ))
        .output()?;
    ensure!(out.status.success(), "crane export {reference}: {}", text(&out));
    let version = Command::new(export.join("usr/local/bin/sked-controller")).arg("--version").output()?;
    assert!(text(&version).contains("sked-controller"), "{}", text(&version));

    if let Some(driven) = nodes_driven {
        driven.abort();
    }
    let out = helm(&fx, &["uninstall", "sked", "--namespace", NS, "--wait"])?;
    assert!(out.status.success(), "{}", text(&out));
    Ok(())
}

/// The checkout's commit, as `make images` tags with it.
fn git_short_head() -> Result<String> {
    let out = Command::new("git").current_dir(workspace_root()).args(["rev-parse", "--short=12", "HEAD"]).output()?;
    ensure!(out.status.success(), "git rev-parse: {}", text(&out));
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Plays the kubelets and kernels of the nodes labelled `schedkit.io/pool=batch` (the guide's
/// pool) for the pods of its Scheduler, their agents reporting to the leading replica through
/// the CA the chart published.
async fn drive_pool_nodes(fx: &Fixture, pods: &ControllerPods) -> Result<tokio::task::JoinHandle<()>> {
    let ca = wait_for("the reports CA published for the agents", || async {
        let map = Api::<ConfigMap>::namespaced(fx.client.clone(), NS).get_opt("sked-reports-ca").await?;
        Ok(map.and_then(|m| m.data).and_then(|d| d.get("ca.crt").cloned()))
    })
    .await?;
    let leader = leader_reports_port(fx, pods).await?;
    let ca_file = fx.cluster.dir.join("guide-ca.crt");
    std::fs::write(&ca_file, &ca)?;
    let address = format!("https://127.0.0.1:{leader}");
    let server_name = format!("sked-reports.{NS}.svc");
    let endpoint = ReportsEndpoint { address: &address, ca: &ca_file, server_name: Some(&server_name), replicas: None };
    let dir = fx.cluster.dir.join("guide-nodes");
    let mut nodes = sked_tests::fake_nodes::FakeNodes::new(
        &fx.client,
        NS,
        "name=scx-bpfland",
        "schedkit.io/pool=batch",
        &dir,
        &endpoint,
    );
    Ok(tokio::spawn(async move {
        loop {
            let _ = nodes.drive().await;
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
    }))
}
