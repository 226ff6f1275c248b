//! The Helm chart: lint, rendered manifests accepted by the API server (server-side dry run),
//! refusals of bad values, and a real `helm install` into the test cluster.

use std::process::Output;

use anyhow::{Context as _, Result};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Api;
use sked_tests::Fixture;
use sked_tests::agents::ReportsTls;
use sked_tests::cluster::workspace_root;

fn helm(fx: &Fixture, args: &[&str]) -> Result<Output> {
    fx.cluster.helm(args)
}

use sked_tests::command::output_text as text;

/// Values for bring-your-own-secret mode (no cert-manager in the test cluster).
fn own_secret_values(ca: &str) -> Vec<String> {
    vec![
        "--set".into(),
        "reports.tls.mode=existingSecret".into(),
        "--set".into(),
        "reports.tls.existingSecret=sked-reports-tls".into(),
        "--set-string".into(),
        format!("reports.tls.caBundle={ca}"),
        "--set".into(),
        "webhook.tls.mode=existingSecret".into(),
        "--set".into(),
        "webhook.tls.existingSecret=sked-webhook-tls".into(),
        "--set-string".into(),
        format!("webhook.tls.caBundle={ca}"),
    ]
}

#[tokio::test]
async fn the_chart_lints_renders_for_the_api_server_and_installs() -> Result<()> {
    let fx = Fixture::without_controller().await?;
    let chart = workspace_root().join("charts/sked");
    let chart = chart.to_string_lossy();
    let tls = ReportsTls::generate(&fx.cluster.dir)?;
    let ca = std::fs::read_to_string(&tls.ca)?;
    let values = own_secret_values(&ca);
    let values: Vec<&str> = values.iter().map(String::as_str).collect();

    // helm lint, in both TLS modes.
    let mut lint = vec!["lint", &*chart];
    lint.extend(&values);
    let out = helm(&fx, &lint)?;
    assert!(out.status.success(), "{}", text(&out));
    let out = helm(
        &fx,
        &["lint", &chart, "--set", "reports.tls.issuerRef.name=sked-ca", "--set-string", "reports.tls.caBundle=x"],
    )?;
    assert!(out.status.success(), "{}", text(&out));

    // The rendered manifests pass the API server's validation (server-side dry run).
    let ns = "sked-chart";
    sked_tests::ensure_namespace(&fx.client, ns).await?;
    let mut template = vec!["template", "sked", &*chart, "--namespace", ns, "--include-crds"];
    template.extend(&values);
    let out = helm(&fx, &template)?;
    assert!(out.status.success(), "{}", text(&out));
    let manifests = fx.cluster.dir.join("chart-manifests.yaml");
    std::fs::write(&manifests, &out.stdout)?;
    // The NetworkPolicy that lets only scheduler pods reach the reports port is among them.
    let rendered = String::from_utf8_lossy(&out.stdout).into_owned();
    let policy = rendered
        .split("\n---")
        .find(|doc| doc.contains("kind: NetworkPolicy"))
        .ok_or_else(|| anyhow::anyhow!("no NetworkPolicy rendered:\n{rendered}"))?;
    for needle in ["port: reports", "kubernetes.io/metadata.name: sked-chart", "app.kubernetes.io/managed-by: sked"] {
        assert!(policy.contains(needle), "{needle} in {policy}");
    }
    let out =
        fx.cluster.kubectl(&["apply", "--dry-run=server", "--server-side", "-f", &manifests.to_string_lossy()])?;
    assert!(out.status.success(), "server-side dry run refused the chart:\n{}", text(&out));
    assert!(text(&out).contains("networkpolicy.networking.k8s.io/sked-controller"), "{}", text(&out));
    let mut without = template.clone();
    without.extend(["--set", "reports.networkPolicy.enabled=false"]);
    let out = helm(&fx, &without)?;
    assert!(!String::from_utf8_lossy(&out.stdout).contains("kind: NetworkPolicy"), "a value turns it off");

    // With cert-manager, a Certificate for the reports Service is rendered.
    let out = helm(
        &fx,
        &[
            "template",
            "sked",
            &chart,
            "--namespace",
            ns,
            "--set",
            "reports.tls.issuerRef.name=sked-ca",
            "--set-string",
            "reports.tls.caBundle=x",
        ],
    )?;
    let rendered = String::from_utf8_lossy(&out.stdout);
    assert!(rendered.contains("kind: Certificate") && rendered.contains("sked-reports.sked-chart.svc"), "{rendered}");
    // ...and one for the webhook Service, whose CA cert-manager injects into the webhook.
    assert!(rendered.contains("sked-webhook.sked-chart.svc"), "{rendered}");
    assert!(rendered.contains("cert-manager.io/inject-ca-from: sked-chart/sked-webhook"), "{rendered}");

    // Bad values are refused with the reason.
    for (args, why) in [
        (vec!["--set", "controller.extraArgs={--zap-devel=true}"], "--zap-devel=true is no longer supported"),
        (vec!["--set", "controller.logLevel=debug", "--set", "controller.logVerbosity=2"], "exclusive"),
        (vec!["--set", "controller.replicas=0"], "replicas"),
        (
            vec!["--set", "reports.tls.mode=existingSecret", "--set-string", "reports.tls.caBundle=x"],
            "existingSecret is required",
        ),
        (
            vec!["--set", "webhook.tls.mode=existingSecret", "--set", "webhook.tls.existingSecret=s"],
            "webhook.tls.caBundle",
        ),
        (vec!["--set", "webhook.failurePolicy=Sometimes"], "failurePolicy"),
    ] {
        let mut a = vec![
            "template",
            "sked",
            &*chart,
            "--set-string",
            "reports.tls.caBundle=x",
            "--set",
            "reports.tls.issuerRef.name=ca",
        ];
        a.extend(args);
        let out = helm(&fx, &a)?;
        assert!(!out.status.success(), "{a:?} must be refused");
        assert!(text(&out).contains(why), "{a:?}: {}", text(&out));
    }

    // A real install (own-secret mode): the controller's Deployment and everything around it.
    for secret in ["sked-reports-tls", "sked-webhook-tls"] {
        let out = fx.cluster.kubectl(&[
            "create",
            "secret",
            "tls",
            secret,
            "-n",
            ns,
            &format!("--cert={}", tls.cert.display()),
            &format!("--key={}", tls.key.display()),
        ])?;
        assert!(out.status.success(), "{}", text(&out));
    }
    // With a workload namespace of its own, which nothing else creates: the chart does.
    let workloads = "sked-chart-workloads";
    let mut install =
        vec!["install", "sked", &*chart, "--namespace", ns, "--set", "workloadNamespace=sked-chart-workloads"];
    install.extend(&values);
    let out = helm(&fx, &install)?;
    assert!(out.status.success(), "{}", text(&out));

    let deployment = Api::<Deployment>::namespaced(fx.client.clone(), ns).get("sked-controller-manager").await?;
    let spec = deployment.spec;
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.context("pod spec")?;
    assert_eq!(pod.service_account_name.as_deref(), Some("sked-controller"));
    assert_eq!(pod.security_context.as_ref().and_then(|s| s.run_as_non_root), Some(true));
    let manager = &pod.containers[0];
    let sc = manager.security_context.as_ref().context("container security context")?;
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert!(manager.resources.as_ref().and_then(|r| r.limits.as_ref()).is_some(), "limits are set");
    let args = manager.args.clone().unwrap_or_default();
    assert!(args.contains(&format!("--workload-namespace={workloads}")), "{args:?}");
    let namespace = Api::<k8s_openapi::api::core::v1::Namespace>::all(fx.client.clone()).get(workloads).await?;
    let labels = namespace.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get("pod-security.kubernetes.io/enforce").map(String::as_str), Some("privileged"));
    Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(fx.client.clone(), workloads).get("sked-workloads").await?;
    for flag in ["--trust-policy=/etc/sked/trust/policy.yaml", "--webhook-cert-dir=/var/run/sked/webhook-tls"] {
        assert!(args.contains(&flag.to_string()), "{flag} missing: {args:?}");
    }
    assert!(pod.affinity.and_then(|a| a.pod_anti_affinity).is_some(), "replicas prefer different nodes");

    let reports = Api::<Service>::namespaced(fx.client.clone(), ns).get("sked-reports").await?;
    let selector = reports.spec.and_then(|s| s.selector).unwrap_or_default();
    assert_eq!(selector.get("sked.schedkit.io/leader").map(String::as_str), Some("true"), "routes to the leader");
    // Every replica by name, for the agents to hold a stream to each.
    let replicas = Api::<Service>::namespaced(fx.client.clone(), ns).get("sked-reports-replicas").await?;
    let spec = replicas.spec.unwrap_or_default();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"), "headless: one DNS record per replica");
    assert!(!spec.selector.unwrap_or_default().contains_key("sked.schedkit.io/leader"), "lists every replica");
    let replicas_flag = format!("--reports-replicas=sked-reports-replicas.{ns}.svc");
    assert!(args.contains(&replicas_flag), "{replicas_flag} missing: {args:?}");
    // What the agents mount lives where their pods run.
    let ca_map = Api::<ConfigMap>::namespaced(fx.client.clone(), workloads).get("sked-reports-ca").await?;
    assert_eq!(ca_map.data.unwrap_or_default().get("ca.crt"), Some(&ca));
    Api::<ServiceAccount>::namespaced(fx.client.clone(), workloads).get("sked-agent").await?;

    // The webhook: every replica behind one Service, called for Scheduler creates and updates.
    let webhooks =
        Api::<ValidatingWebhookConfiguration>::all(fx.client.clone()).get("sked-sked-chart-schedulers").await?;
    let webhook = webhooks.webhooks.unwrap_or_default().into_iter().next().context("one webhook")?;
    let service = webhook.client_config.service.context("called through a Service")?;
    assert_eq!((service.name.as_str(), service.path.as_deref()), ("sked-webhook", Some("/validate-scheduler")));
    assert_eq!(webhook.client_config.ca_bundle.map(|b| b.0), Some(ca.clone().into_bytes()));
    assert_eq!(webhook.failure_policy.as_deref(), Some("Fail"));
    let webhook_service = Api::<Service>::namespaced(fx.client.clone(), ns).get("sked-webhook").await?;
    let selector = webhook_service.spec.and_then(|s| s.selector).unwrap_or_default();
    assert!(!selector.contains_key("sked.schedkit.io/leader"), "every replica serves the webhook");
    // The trust policy ConfigMap holds the built-in default unless values say otherwise.
    let policy = Api::<ConfigMap>::namespaced(fx.client.clone(), ns).get("sked-trust-policy").await?;
    let policy = policy.data.unwrap_or_default().remove("policy.yaml").unwrap_or_default();
    assert_eq!(policy, sked_controller::trust::policy::DEFAULT_POLICY);
    let role = Api::<ClusterRole>::all(fx.client.clone()).get("sked-controller").await?;
    let rules = role.rules.unwrap_or_default();
    assert!(
        rules.iter().any(|r| r.resources.as_deref().unwrap_or_default().contains(&"tokenreviews".to_string())),
        "the controller may review agent tokens"
    );
    assert!(!rules.iter().any(|r| r.verbs.contains(&"*".to_string())), "no wildcard verbs: least privilege");

    node_writes_are_held_to_sked_labels(&fx, ns).await?;

    let out = helm(&fx, &["uninstall", "sked", "--namespace", ns, "--wait"])?;
    assert!(out.status.success(), "{}", text(&out));
    // The workload namespace outlives the release (its schedulers keep running).
    let kept = Api::<k8s_openapi::api::core::v1::Namespace>::all(fx.client.clone()).get(workloads).await?;
    assert!(kept.metadata.deletion_timestamp.is_none(), "the workload namespace is kept");
    Ok(())
}

/// The chart's ValidatingAdmissionPolicy: the controller's ServiceAccount may change labels under
/// `sked.schedkit.io/` on a Node, and nothing else (RBAC alone would let it patch anything).
async fn node_writes_are_held_to_sked_labels(fx: &Fixture, ns: &str) -> Result<()> {
    let node = "vap-node";
    sked_tests::create_ready_node(&fx.client, node, &[("pool", "vap")]).await?;
    let controller = format!("--as=system:serviceaccount:{ns}:sked-controller");
    let as_controller = |args: &[&str]| -> Result<Output> {
        let mut all = args.to_vec();
        all.push(&controller);
        fx.cluster.kubectl(&all)
    };
    // The policy takes effect once the API server has loaded it (each try changes the value, so
    // none is a no-op).
    let tries = std::sync::atomic::AtomicUsize::new(0);
    sked_tests::wait_for("the node-label policy to refuse another label", || async {
        let n = tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let out = as_controller(&["label", "node", node, "--overwrite", &format!("pool=other-{n}")])?;
        Ok((!out.status.success()).then(|| text(&out)))
    })
    .await
    .map(|refusal| assert!(refusal.contains("only labels under sked.schedkit.io/"), "{refusal}"))?;
    // Put back what an early attempt may have changed.
    let out = fx.cluster.kubectl(&["label", "node", node, "--overwrite", "pool=vap"])?;
    assert!(out.status.success(), "{}", text(&out));

    let out = as_controller(&["label", "node", node, "sked.schedkit.io/scheduler=batch"])?;
    assert!(out.status.success(), "the owner label may be set: {}", text(&out));
    let out = as_controller(&["label", "node", node, "sked.schedkit.io/scheduler-"])?;
    assert!(out.status.success(), "the owner label may be removed: {}", text(&out));
    for (args, why) in [
        (vec!["label", "node", node, "pool-"], "only labels under sked.schedkit.io/"),
        (vec!["taint", "node", node, "dedicated=sked:NoSchedule"], "spec"),
        (vec!["cordon", node], "spec"),
        (vec!["annotate", "node", node, "note=x"], "annotations"),
        (
            vec!["patch", "node", node, "--type=merge", "-p", r#"{"metadata":{"finalizers":["example.com/hold"]}}"#],
            "finalizers",
        ),
    ] {
        let out = as_controller(&args)?;
        // (`kubectl cordon` reports a refusal but exits 0.)
        assert!(text(&out).contains("denied request"), "{args:?} must be refused: {}", text(&out));
        assert!(text(&out).contains(why), "{args:?}: {}", text(&out));
    }
    let n = fx.nodes().get(node).await?;
    let spec = n.spec.unwrap_or_default();
    assert!(spec.unschedulable.is_none() && spec.taints.is_none(), "the node's spec is untouched");
    assert!(!n.metadata.annotations.unwrap_or_default().contains_key("note"));
    // An administrator is not bound by it.
    let out = fx.cluster.kubectl(&["label", "node", node, "--overwrite", "pool=vap2"])?;
    assert!(out.status.success(), "{}", text(&out));
    fx.nodes().delete(node, &Default::default()).await?;
    Ok(())
}
