//! Objects the suites create, read and clean up: Scheduler specs and conditions, the CRDs,
//! namespaces, service accounts and trust policies.

use anyhow::{Context as _, Result, anyhow};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use sked_controller::{Scheduler, SchedulerSpec};

use crate::cluster;
use crate::fixture::{DEADLINE, wait_for};

/// A condition of a Scheduler's status.
pub fn condition<'a>(
    s: &'a Scheduler,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    s.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
}

/// Whether a condition has the given status and reason.
pub fn has_condition(s: &Scheduler, type_: &str, status: &str, reason: &str) -> bool {
    condition(s, type_).is_some_and(|c| c.status == status && c.reason == reason)
}

/// A trust policy that lets every image run unsigned, as written: for tests that are not
/// about image trust (their images exist in no registry).
pub fn allow_unsigned_policy(dir: &std::path::Path) -> Result<std::path::PathBuf> {
    let path = dir.join("trust-policy-allow-unsigned.yaml");
    std::fs::write(&path, "rules:\n  - repository: \"**\"\n    unsigned: allow\n")?;
    Ok(path)
}

/// Applies the committed CRDs (server-side) and waits until they are established.
pub async fn install_crds(client: &Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let dir = cluster::workspace_root().join("crds");
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let name = crd.name_any();
        crds.patch(&name, &PatchParams::apply("sked-tests").force(), &Patch::Apply(&crd))
            .await
            .with_context(|| format!("applying {}", path.display()))?;
        tokio::time::timeout(DEADLINE, await_condition(crds.clone(), &name, conditions::is_crd_established()))
            .await
            .map_err(|_| anyhow!("CRD {name} not established"))??;
    }
    Ok(())
}

/// Deletes every Scheduler and Node and waits until they are gone.
pub async fn clear(client: &Client) -> Result<()> {
    let schedulers: Api<Scheduler> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    schedulers.delete_collection(&DeleteParams::default(), &ListParams::default()).await?;
    nodes.delete_collection(&DeleteParams::default(), &ListParams::default()).await?;
    wait_for("Schedulers and Nodes of earlier tests to be gone", || {
        let (schedulers, nodes) = (schedulers.clone(), nodes.clone());
        async move {
            let s = schedulers.list(&ListParams::default()).await?.items.len();
            let n = nodes.list(&ListParams::default()).await?.items.len();
            Ok((s == 0 && n == 0).then_some(()))
        }
    })
    .await
}

/// Creates a ServiceAccount if it does not exist (the chart creates the agent's).
pub async fn ensure_service_account(client: &Client, namespace: &str, name: &str) -> Result<()> {
    let api: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let sa: k8s_openapi::api::core::v1::ServiceAccount =
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}))?;
    api.patch(name, &PatchParams::apply("sked-tests"), &Patch::Apply(&sa)).await?;
    Ok(())
}

/// Creates a namespace if it does not exist.
pub async fn ensure_namespace(client: &Client, name: &str) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}))?;
    namespaces.patch(name, &PatchParams::apply("sked-tests"), &Patch::Apply(&ns)).await?;
    Ok(())
}

/// A Scheduler spec with just an image, for suites that are not about pacing: every selected
/// node enters at once (no canary, `maxUnavailable: 100%`), as if no kubelet had to attach
/// anything first (the test control plane runs none), and the one wave bakes a second, not the
/// default 30 s, before the rollout is Complete. The rollout suite sets its own pacing.
pub fn spec(image: &str) -> SchedulerSpec {
    SchedulerSpec { sched: image.into(), rollout: Some(all_at_once()), ..SchedulerSpec::default() }
}

/// [`spec`] with a node selector.
pub fn spec_on(image: &str, selector: &[(&str, &str)]) -> SchedulerSpec {
    SchedulerSpec {
        node_selector: selector.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..spec(image)
    }
}

/// Pacing that switches every node in one wave, baked for a second.
pub fn all_at_once() -> sked_controller::api::RolloutSpec {
    sked_controller::api::RolloutSpec {
        canary: Some(0),
        max_unavailable: Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("100%".into())),
        bake_seconds: Some(1),
        ..Default::default()
    }
}

/// Waits until the wall clock is in a later second than `t`, so the next object created gets
/// a strictly later `creationTimestamp` (the API server stores whole seconds).
pub async fn next_second_after(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> Result<()> {
    let created = t.0.as_second();
    wait_for("the clock to pass the creation second", || async move {
        Ok((jiff::Timestamp::now().as_second() > created).then_some(()))
    })
    .await
}

/// The release namespace as a first `helm install` finds it: without the agents'
/// ServiceAccount the harness makes for other suites (the chart makes it), without the Secrets
/// cert-manager wrote for an earlier test's release (the chart README has users delete them
/// after an uninstall), and without that release's Lease (whose holder is gone; a new one would
/// wait out its term).
pub async fn fresh_release_namespace(client: &Client, namespace: &str) {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
    let _ = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .delete("sked-agent", &DeleteParams::default())
        .await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    for secret in ["sked-ca", "sked-reports-tls", "sked-webhook-tls"] {
        let _ = secrets.delete(secret, &DeleteParams::default()).await;
    }
    let _ =
        Api::<Lease>::namespaced(client.clone(), namespace).delete("sked-controller", &DeleteParams::default()).await;
}
