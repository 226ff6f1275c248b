//! The Scheduler -> DaemonSet reconcile against a real API server, DaemonSet controller and
//! garbage collector.

use anyhow::Result;
use k8s_openapi::api::core::v1::EnvVar;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use sked_controller::{Scheduler, SchedulerSpec};
use sked_tests::{Fixture, has_condition, spec};

const IMAGE: &str = "ghcr.io/schedkit/scx_rusty:v1";

fn scx_image(ds: &k8s_openapi::api::apps::v1::DaemonSet) -> Option<String> {
    ds.spec.template.spec.as_ref()?.containers.iter().find(|c| c.name == "scx")?.image.clone()
}

#[tokio::test]
async fn create_emits_an_owned_daemonset_with_labels_image_and_args() -> Result<()> {
    let fx = Fixture::start().await?;
    let s = fx.create_scheduler("rusty", SchedulerSpec { args: vec!["--slice-us=5000".into()], ..spec(IMAGE) }).await?;

    let ds = fx.wait_daemonset("rusty", "created", |_| true).await?;
    let owner = &ds.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Scheduler", "rusty"));
    assert_eq!(Some(owner.uid.clone()), s.uid());
    assert_eq!(owner.controller, Some(true));
    assert_eq!(ds.labels().get("name").map(String::as_str), Some("rusty"));
    let tmpl = ds.spec.template.spec.as_ref().expect("pod spec");
    let scx = tmpl.containers.iter().find(|c| c.name == "scx").expect("scx container");
    assert_eq!(scx.image.as_deref(), Some(IMAGE));
    assert_eq!(scx.args.as_deref(), Some(&["--slice-us=5000".to_string()][..]));
    assert_eq!(tmpl.share_process_namespace, Some(true));
    let managers: Vec<_> = ds.managed_fields().iter().filter_map(|m| m.manager.clone()).collect();
    assert!(managers.contains(&"sked".to_string()), "applied with field manager sked: {managers:?}");

    // No nodes: the status says so, with the deployed image.
    let s = fx
        .wait_scheduler("rusty", "NoNodesScheduled", |s| has_condition(s, "Ready", "False", "NoNodesScheduled"))
        .await?;
    let st = s.status.expect("status");
    assert_eq!(st.observed_generation, s.metadata.generation);
    assert_eq!(st.resolved_image.as_deref(), Some(IMAGE));
    assert_eq!(st.kernel_attached_summary.as_deref(), Some("0/0"));
    Ok(())
}

#[tokio::test]
async fn spec_change_rolls_the_daemonset_and_advances_observed_generation() -> Result<()> {
    let fx = Fixture::start().await?;
    fx.create_scheduler("rolling", spec(IMAGE)).await?;
    let first = fx.wait_scheduler("rolling", "first status", |s| s.status.is_some()).await?;
    assert_eq!(first.status.as_ref().and_then(|s| s.observed_generation), Some(1));

    let patch = json!({"spec": {
        "sched": "ghcr.io/schedkit/scx_rusty:v2",
        "args": ["--fast"],
        "env": [{"name": "SCX_DEBUG", "value": "1"}],
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}},
    }});
    fx.schedulers().patch("rolling", &PatchParams::default(), &Patch::Merge(&patch)).await?;

    let ds = fx
        .wait_daemonset("rolling", "new template", |d| scx_image(d).as_deref() == Some("ghcr.io/schedkit/scx_rusty:v2"))
        .await?;
    let pod = ds.spec.template.spec.as_ref().expect("pod spec");
    let scx = &pod.containers[0];
    assert_eq!(scx.args.as_deref(), Some(&["--fast".to_string()][..]));
    assert_eq!(
        scx.env.as_deref(),
        Some(&[EnvVar { name: "SCX_DEBUG".into(), value: Some("1".into()), ..Default::default() }][..])
    );
    assert_eq!(pod.tolerations.as_ref().map(Vec::len), Some(1));
    let requests = scx.resources.as_ref().and_then(|r| r.requests.as_ref()).expect("requests");
    assert_eq!(requests["cpu"].0, "50m");
    assert!(ds.metadata.generation.unwrap_or(0) >= 2, "template change bumps the DaemonSet generation");

    fx.wait_scheduler("rolling", "observedGeneration 2 on status and conditions", |s| {
        s.status.as_ref().is_some_and(|st| {
            st.observed_generation == Some(2) && st.conditions.iter().all(|c| c.observed_generation == Some(2))
        })
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_hand_edit_of_the_daemonset_is_reverted() -> Result<()> {
    let fx = Fixture::start().await?;
    fx.create_scheduler("guarded", spec(IMAGE)).await?;
    let ds = fx.wait_daemonset("guarded", "created", |_| true).await?;

    // What `kubectl set image` sends: a strategic-merge patch under another field manager.
    let edit = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "scx", "image": "docker.io/evil/miner:latest"}
    ]}}}});
    let by_hand = PatchParams { field_manager: Some("kubectl-edit".into()), ..Default::default() };
    let edited = fx.daemonsets().patch("guarded", &by_hand, &Patch::Strategic(&edit)).await?;
    assert_eq!(scx_image(&edited).as_deref(), Some("docker.io/evil/miner:latest"));
    assert!(edited.metadata.generation > ds.metadata.generation, "the edit landed");

    fx.wait_daemonset("guarded", "image reverted", |d| scx_image(d).as_deref() == Some(IMAGE)).await?;
    Ok(())
}

#[tokio::test]
async fn deleting_the_scheduler_garbage_collects_its_daemonset() -> Result<()> {
    let fx = Fixture::start().await?;
    fx.create_scheduler("doomed", spec(IMAGE)).await?;
    fx.wait_daemonset("doomed", "created", |_| true).await?;
    fx.schedulers().delete("doomed", &Default::default()).await?;
    fx.wait_daemonset_gone("doomed").await?;
    Ok(())
}

#[tokio::test]
async fn a_daemonset_deleted_by_hand_is_recreated() -> Result<()> {
    let fx = Fixture::start().await?;
    fx.create_scheduler("phoenix", spec(IMAGE)).await?;
    let old = fx.wait_daemonset("phoenix", "created", |_| true).await?;
    fx.daemonsets().delete("phoenix", &Default::default()).await?;
    fx.wait_daemonset("phoenix", "recreated", |d| d.uid() != old.uid()).await?;
    Ok(())
}

#[tokio::test]
async fn desired_count_follows_nodes_and_events_follow_state_changes() -> Result<()> {
    let fx = Fixture::start().await?;
    fx.create_scheduler("counted", spec(IMAGE)).await?;
    fx.wait_scheduler("counted", "NoNodesScheduled", |s| has_condition(s, "Ready", "False", "NoNodesScheduled"))
        .await?;

    for n in ["node-1", "node-2"] {
        fx.create_node(n, &[]).await?;
    }
    let s = fx
        .wait_scheduler("counted", "2 desired, rolling out", |s| {
            s.status.as_ref().is_some_and(|st| st.desired_number_scheduled == 2)
                && has_condition(s, "Progressing", "True", "RolloutInProgress")
        })
        .await?;
    assert_eq!(s.status.as_ref().and_then(|st| st.kernel_attached_summary.clone()).as_deref(), Some("0/2"));

    // Play the kubelet: pods become ready.
    sked_tests::wait_for("two pods to exist", || async {
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(fx.client.clone(), &fx.namespace);
        let n = pods.list(&kube::api::ListParams::default().labels("name=counted")).await?.items.len();
        Ok((n == 2).then_some(()))
    })
    .await?;
    fx.mark_pods_ready("counted").await?;
    fx.wait_scheduler("counted", "Ready", |s| {
        has_condition(s, "Ready", "True", "DaemonSetReady")
            && s.status.as_ref().is_some_and(|st| st.number_ready == 2 && st.number_available == 2)
    })
    .await?;

    // A third node: the count follows, and the new node is a rollout, not an outage.
    fx.create_node("node-3", &[]).await?;
    fx.wait_scheduler("counted", "3 desired, rolling out", |s| {
        s.status.as_ref().is_some_and(|st| st.desired_number_scheduled == 3)
            && has_condition(s, "Progressing", "True", "RolloutInProgress")
            && has_condition(s, "Degraded", "False", "AsExpected")
    })
    .await?;

    // A plain re-reconcile (an annotation change triggers the watch) and another pod-count
    // change (a fourth node) record nothing new.
    fx.schedulers()
        .patch("counted", &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"annotations": {"touch": "1"}}})))
        .await?;
    fx.create_node("node-4", &[]).await?;
    fx.wait_scheduler("counted", "4 desired", |s| s.status.as_ref().is_some_and(|st| st.desired_number_scheduled == 4))
        .await?;
    fx.wait_events(
        "counted",
        &[("Normal", "NoNodesScheduled", 1), ("Normal", "RolloutInProgress", 2), ("Normal", "DaemonSetReady", 1)],
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn the_api_server_refuses_invalid_specs_naming_the_field() -> Result<()> {
    let fx = Fixture::start().await?;
    let api = fx.schedulers();

    // A typed Scheduler always has `sched`; send the raw object without it.
    let raw = kube::core::DynamicObject::new("no-image", &kube::core::ApiResource::erase::<Scheduler>(&()))
        .data(json!({"spec": {"args": ["x"]}}));
    let dynamic: kube::Api<kube::core::DynamicObject> =
        kube::Api::all_with(fx.client.clone(), &kube::core::ApiResource::erase::<Scheduler>(&()));
    let err = dynamic.create(&PostParams::default(), &raw).await.expect_err("a Scheduler without sched is refused");
    assert!(err.to_string().contains("spec.sched"), "{err}");

    for bad in ["Not An Image!", "ghcr.io/x/y@sha256:tooshort", "ghcr.io/x/y:"] {
        let err = api.create(&PostParams::default(), &Scheduler::new("bad-image", spec(bad))).await.expect_err(bad);
        assert!(err.to_string().contains("spec.sched"), "{bad}: {err}");
    }

    let long = "x".repeat(64);
    let err = api.create(&PostParams::default(), &Scheduler::new(&long, spec(IMAGE))).await.expect_err("long name");
    assert!(err.to_string().contains("63 characters"), "{err}");

    let bad_toleration = SchedulerSpec {
        tolerations: vec![k8s_openapi::api::core::v1::Toleration {
            key: Some("k".into()),
            operator: Some("Exists".into()),
            value: Some("v".into()),
            ..Default::default()
        }],
        ..spec(IMAGE)
    };
    let err =
        api.create(&PostParams::default(), &Scheduler::new("bad-tol", bad_toleration)).await.expect_err("toleration");
    assert!(err.to_string().contains("spec.tolerations"), "{err}");

    let bad_selector = sked_tests::spec_on(IMAGE, &[("not a label key", "x")]);
    let err = api.create(&PostParams::default(), &Scheduler::new("bad-sel", bad_selector)).await.expect_err("selector");
    assert!(err.to_string().contains("spec.nodeSelector"), "{err}");

    // The owner label is sked's to set; selecting on it would chase its own tail.
    let owner_selector = sked_tests::spec_on(IMAGE, &[("sked.schedkit.io/scheduler", "other")]);
    let err = api
        .create(&PostParams::default(), &Scheduler::new("bad-owner", owner_selector))
        .await
        .expect_err("owner label");
    assert!(err.to_string().contains("may not use sked.schedkit.io/scheduler"), "{err}");

    // A rollout that could never move, or a percentage that is not one.
    for (value, name) in [(json!(0), "bad-wave"), (json!("150%"), "bad-percent")] {
        let mut spec = spec(IMAGE);
        spec.rollout = Some(serde_json::from_value(json!({"maxUnavailable": value}))?);
        let err = api.create(&PostParams::default(), &Scheduler::new(name, spec)).await.expect_err("maxUnavailable");
        assert!(err.to_string().contains("spec.rollout.maxUnavailable"), "{err}");
    }
    let mut percent = spec(IMAGE);
    percent.rollout = Some(serde_json::from_value(json!({"maxUnavailable": "25%", "canary": 2}))?);
    let dry_run = PostParams { dry_run: true, ..PostParams::default() };
    api.create(&dry_run, &Scheduler::new("percent", percent)).await?;
    Ok(())
}

#[tokio::test]
async fn kubectl_get_schedulers_prints_the_rollout_and_kernel_columns() -> Result<()> {
    let fx = Fixture::start().await?;
    fx.create_node("kc-node", &[]).await?;
    fx.create_scheduler("shown", spec(IMAGE)).await?;
    fx.wait_scheduler("shown", "1 desired, its pod up to date", |s| {
        s.status.as_ref().is_some_and(|st| st.desired_number_scheduled == 1 && st.updated_number_scheduled == 1)
    })
    .await?;
    let out = fx.cluster.kubectl(&["get", "schedulers"])?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "kubectl failed: {}", String::from_utf8_lossy(&out.stderr));
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "DESIRED", "UP-TO-DATE", "AVAILABLE", "KERNEL-ATTACHED", "PHASE", "AGE"]);
    let row: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    // A first deployment: its pod runs the current revision and waits to attach.
    assert_eq!(&row[..7], ["shown", "0", "1", "1", "0", "0/1", "Rolling"], "{text}");
    Ok(())
}
