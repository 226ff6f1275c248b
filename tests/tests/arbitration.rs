//! Node arbitration against a real API server: the oldest Scheduler wins each node; losers
//! exclude lost nodes or lose their DaemonSet; ownership moves when the winner goes or labels
//! change; conditions and events say so.

use anyhow::Result;
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use sked_tests::{Fixture, has_condition, next_second_after, spec, spec_on};

const IMAGE: &str = "ghcr.io/schedkit/scx_rusty:v1";

/// The node names a DaemonSet excludes with `matchFields metadata.name NotIn`, sorted.
fn excluded(ds: &DaemonSet) -> Vec<String> {
    let Some(terms) = ds
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|p| p.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
    else {
        return Vec::new();
    };
    let mut names: Vec<String> = terms
        .node_selector_terms
        .iter()
        .flat_map(|t| t.match_fields.iter().flatten())
        .filter(|f| f.key == "metadata.name" && f.operator == "NotIn")
        .flat_map(|f| f.values.iter().flatten().cloned())
        .collect();
    names.sort();
    names
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn conflicting(s: &sked_controller::Scheduler) -> i32 {
    s.status.as_ref().map_or(-1, |st| st.conflicting_nodes)
}

#[tokio::test]
async fn the_oldest_of_two_overlapping_schedulers_wins_even_against_name_order() -> Result<()> {
    let fx = Fixture::start().await?;
    for n in ["n1", "n2"] {
        fx.create_node(n, &[("pool", "batch")]).await?;
    }
    // "zz-old" is older; "aa-new" sorts first by name but is younger.
    let old = fx.create_scheduler("zz-old", spec_on(IMAGE, &[("pool", "batch")])).await?;
    next_second_after(old.creation_timestamp().as_ref().expect("created")).await?;
    fx.create_scheduler("aa-new", spec(IMAGE)).await?;

    fx.wait_daemonset("zz-old", "no exclusions", |d| excluded(d).is_empty()).await?;
    let s = fx
        .wait_scheduler("aa-new", "total conflict", |s| {
            has_condition(s, "Degraded", "True", "SchedulerConflict") && conflicting(s) == 2
        })
        .await?;
    let msg = &sked_tests::condition(&s, "Degraded").expect("Degraded").message;
    assert!(msg.contains("2 of 2") && msg.contains("zz-old"), "{msg}");
    fx.wait_daemonset_gone("aa-new").await?;
    assert!(has_condition(&s, "Ready", "False", "NoNodesScheduled"));
    Ok(())
}

#[tokio::test]
async fn partial_conflict_excludes_lost_nodes_and_keeps_the_rest() -> Result<()> {
    let fx = Fixture::start().await?;
    fx.create_node("batch-1", &[("pool", "batch"), ("zone", "a")]).await?;
    fx.create_node("batch-2", &[("pool", "batch"), ("zone", "b")]).await?;
    fx.create_node("batch-3", &[("pool", "batch"), ("zone", "b")]).await?;
    let winner = fx.create_scheduler("zone-b", spec_on(IMAGE, &[("zone", "b")])).await?;
    next_second_after(winner.creation_timestamp().as_ref().expect("created")).await?;
    fx.create_scheduler("batch", spec_on(IMAGE, &[("pool", "batch")])).await?;

    let ds = fx.wait_daemonset("batch", "excludes zone b", |d| excluded(d) == names(&["batch-2", "batch-3"])).await?;
    // The selector itself is kept: the exclusion is added to it.
    let pod = ds.spec.template.spec.as_ref().expect("pod spec");
    assert_eq!(pod.node_selector.as_ref().and_then(|s| s.get("pool")).map(String::as_str), Some("batch"));

    let s = fx
        .wait_scheduler("batch", "1 desired, degraded by the conflict", |s| {
            s.status.as_ref().is_some_and(|st| st.desired_number_scheduled == 1)
                && has_condition(s, "Degraded", "True", "SchedulerConflict")
                && conflicting(s) == 2
        })
        .await?;
    let msg = &sked_tests::condition(&s, "Degraded").expect("Degraded").message;
    assert_eq!(msg, "2 of 3 selected nodes belong to older Schedulers: zone-b");

    // The loser can be Ready on its remaining node while Degraded.
    fx.mark_pods_ready("batch").await?;
    fx.wait_scheduler("batch", "Ready and Degraded", |s| {
        has_condition(s, "Ready", "True", "DaemonSetReady") && has_condition(s, "Degraded", "True", "SchedulerConflict")
    })
    .await?;
    fx.wait_scheduler("zone-b", "2 desired, not degraded", |s| {
        s.status.as_ref().is_some_and(|st| st.desired_number_scheduled == 2 && st.conflicting_nodes == 0)
            && has_condition(s, "Degraded", "False", "AsExpected")
    })
    .await?;

    // Warnings while degraded, and pod-count or readiness changes record nothing more.
    fx.wait_events("batch", &[("Warning", "SchedulerConflict", 1)]).await?;
    Ok(())
}

#[tokio::test]
async fn three_overlapping_schedulers_split_nodes_by_age() -> Result<()> {
    let fx = Fixture::start().await?;
    fx.create_node("x-1", &[("a", "1"), ("b", "1")]).await?;
    fx.create_node("x-2", &[("b", "1"), ("c", "1")]).await?;
    fx.create_node("x-3", &[("a", "1"), ("c", "1")]).await?;
    fx.create_node("x-4", &[("c", "1")]).await?;
    let first = fx.create_scheduler("first", spec_on(IMAGE, &[("a", "1")])).await?;
    next_second_after(first.creation_timestamp().as_ref().expect("created")).await?;
    let second = fx.create_scheduler("second", spec_on(IMAGE, &[("b", "1")])).await?;
    next_second_after(second.creation_timestamp().as_ref().expect("created")).await?;
    fx.create_scheduler("third", spec_on(IMAGE, &[("c", "1")])).await?;

    // first: x-1, x-3. second: x-2 (x-1 lost to first). third: x-4 (x-2 to second, x-3 to first).
    fx.wait_daemonset("first", "no exclusions", |d| excluded(d).is_empty()).await?;
    fx.wait_daemonset("second", "excludes x-1", |d| excluded(d) == names(&["x-1"])).await?;
    fx.wait_daemonset("third", "excludes x-2 and x-3", |d| excluded(d) == names(&["x-2", "x-3"])).await?;
    let s = fx
        .wait_scheduler("third", "conflict with both", |s| {
            conflicting(s) == 2 && has_condition(s, "Degraded", "True", "SchedulerConflict")
        })
        .await?;
    let msg = &sked_tests::condition(&s, "Degraded").expect("Degraded").message;
    assert_eq!(msg, "2 of 3 selected nodes belong to older Schedulers: first, second");
    fx.wait_scheduler("third", "1 desired", |s| s.status.as_ref().is_some_and(|st| st.desired_number_scheduled == 1))
        .await?;
    Ok(())
}

#[tokio::test]
async fn deleting_the_winner_hands_its_nodes_to_the_loser() -> Result<()> {
    let fx = Fixture::start().await?;
    fx.create_node("w-1", &[("pool", "p")]).await?;
    fx.create_node("w-2", &[("pool", "p")]).await?;
    let winner = fx.create_scheduler("winner", spec_on(IMAGE, &[("pool", "p")])).await?;
    next_second_after(winner.creation_timestamp().as_ref().expect("created")).await?;
    fx.create_scheduler("loser", spec_on(IMAGE, &[("pool", "p")])).await?;
    fx.wait_scheduler("loser", "total conflict", |s| has_condition(s, "Degraded", "True", "SchedulerConflict")).await?;
    fx.wait_daemonset_gone("loser").await?;

    fx.schedulers().delete("winner", &Default::default()).await?;
    fx.wait_daemonset("loser", "recreated without exclusions", |d| excluded(d).is_empty()).await?;
    fx.wait_scheduler("loser", "owns both nodes", |s| {
        conflicting(s) == 0
            && s.status.as_ref().is_some_and(|st| st.desired_number_scheduled == 2)
            && has_condition(s, "Degraded", "False", "AsExpected")
    })
    .await?;
    fx.mark_pods_ready("loser").await?;
    fx.wait_scheduler("loser", "Ready", |s| has_condition(s, "Ready", "True", "DaemonSetReady")).await?;
    // Warning while in conflict, Normal on recovery, nothing repeated.
    fx.wait_events(
        "loser",
        &[("Warning", "SchedulerConflict", 1), ("Normal", "RolloutInProgress", 1), ("Normal", "DaemonSetReady", 1)],
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_terminating_winner_applies_nothing_and_its_nodes_pass_on() -> Result<()> {
    let fx = Fixture::start().await?;
    fx.create_node("t-1", &[("pool", "t")]).await?;
    let winner = fx.create_scheduler("leaving", spec_on(IMAGE, &[("pool", "t")])).await?;
    next_second_after(winner.creation_timestamp().as_ref().expect("created")).await?;
    fx.create_scheduler("heir", spec_on(IMAGE, &[("pool", "t")])).await?;
    fx.wait_scheduler("heir", "total conflict", |s| has_condition(s, "Degraded", "True", "SchedulerConflict")).await?;
    let before = fx.wait_daemonset("leaving", "applied", |_| true).await?;

    // A finalizer holds the winner in deletion (as foreground deletion or another controller
    // would): it is terminating, not gone.
    let hold = json!({"metadata": {"finalizers": ["sked.test/hold"]}});
    fx.schedulers().patch("leaving", &PatchParams::default(), &Patch::Merge(&hold)).await?;
    fx.schedulers().delete("leaving", &Default::default()).await?;
    fx.wait_daemonset("heir", "created for the node the terminating winner held", |_| true).await?;
    fx.wait_scheduler("heir", "owns the node", |s| conflicting(s) == 0).await?;
    // Nothing was applied to the terminating Scheduler's DaemonSet.
    let after = fx.daemonsets().get("leaving").await?;
    assert_eq!(after.metadata.generation, before.metadata.generation);
    assert_eq!(after.metadata.resource_version, before.metadata.resource_version);

    let release = json!({"metadata": {"finalizers": null}});
    fx.schedulers().patch("leaving", &PatchParams::default(), &Patch::Merge(&release)).await?;
    Ok(())
}

#[tokio::test]
async fn relabelling_a_node_moves_its_ownership() -> Result<()> {
    let fx = Fixture::start().await?;
    fx.create_node("r-1", &[("pool", "a")]).await?;
    fx.create_node("r-2", &[("pool", "b")]).await?;
    let a = fx.create_scheduler("pool-a", spec_on(IMAGE, &[("pool", "a")])).await?;
    next_second_after(a.creation_timestamp().as_ref().expect("created")).await?;
    fx.create_scheduler("everything", spec(IMAGE)).await?;
    fx.wait_daemonset("everything", "excludes r-1", |d| excluded(d) == names(&["r-1"])).await?;

    // r-1 leaves pool a: the younger catch-all takes it.
    fx.relabel_node("r-1", &[("pool", "c")]).await?;
    fx.wait_daemonset("everything", "no exclusions", |d| excluded(d).is_empty()).await?;
    fx.wait_scheduler("pool-a", "no nodes", |s| has_condition(s, "Ready", "False", "NoNodesScheduled")).await?;
    fx.wait_scheduler("everything", "not degraded", |s| conflicting(s) == 0).await?;

    // r-2 joins pool a: the older Scheduler takes it back.
    fx.relabel_node("r-2", &[("pool", "a")]).await?;
    fx.wait_daemonset("everything", "excludes r-2", |d| excluded(d) == names(&["r-2"])).await?;
    fx.wait_scheduler("pool-a", "owns r-2", |s| s.status.as_ref().is_some_and(|st| st.desired_number_scheduled == 1))
        .await?;
    Ok(())
}

#[tokio::test]
async fn an_empty_selector_claims_every_node() -> Result<()> {
    let fx = Fixture::start().await?;
    for (n, pool) in [("e-1", "a"), ("e-2", "b"), ("e-3", "c")] {
        fx.create_node(n, &[("pool", pool)]).await?;
    }
    let all = fx.create_scheduler("claims-all", spec(IMAGE)).await?;
    next_second_after(all.creation_timestamp().as_ref().expect("created")).await?;
    fx.create_scheduler("pool-b", spec_on(IMAGE, &[("pool", "b")])).await?;
    fx.wait_scheduler("claims-all", "3 desired", |s| {
        s.status.as_ref().is_some_and(|st| st.desired_number_scheduled == 3)
    })
    .await?;
    fx.wait_scheduler("pool-b", "lost its only node", |s| conflicting(s) == 1).await?;
    fx.wait_daemonset_gone("pool-b").await?;

    // Narrowing the winner's selector releases the other nodes.
    fx.schedulers()
        .patch("claims-all", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"nodeSelector": {"pool": "a"}}})))
        .await?;
    fx.wait_daemonset("pool-b", "recreated", |d| excluded(d).is_empty()).await?;
    fx.wait_scheduler("pool-b", "owns its node", |s| {
        conflicting(s) == 0 && s.status.as_ref().is_some_and(|st| st.desired_number_scheduled == 1)
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn unavailable_pods_after_readiness_are_reported_and_recovery_is_normal() -> Result<()> {
    let fx = Fixture::start().await?;
    fx.create_node("u-1", &[]).await?;
    fx.create_scheduler("flaky", spec(IMAGE)).await?;
    fx.wait_scheduler("flaky", "1 desired", |s| s.status.as_ref().is_some_and(|st| st.desired_number_scheduled == 1))
        .await?;
    sked_tests::wait_for("the pod", || async { Ok((fx.mark_pods_ready("flaky").await? == 1).then_some(())) }).await?;
    fx.wait_scheduler("flaky", "Ready", |s| has_condition(s, "Ready", "True", "DaemonSetReady")).await?;

    // The kubelet reports the pod not ready.
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(fx.client.clone(), &fx.namespace);
    let pod = pods.list(&kube::api::ListParams::default().labels("name=flaky")).await?.items.remove(0);
    let now = jiff::Timestamp::now().to_string();
    let not_ready =
        json!({"status": {"conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}]}});
    pods.patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&not_ready)).await?;
    fx.wait_scheduler("flaky", "NodesUnavailable", |s| has_condition(s, "Degraded", "True", "NodesUnavailable"))
        .await?;

    fx.mark_pods_ready("flaky").await?;
    fx.wait_scheduler("flaky", "recovered", |s| has_condition(s, "Ready", "True", "DaemonSetReady")).await?;
    fx.wait_event("flaky", "Warning", "NodesUnavailable", 1).await?;
    fx.wait_event("flaky", "Normal", "DaemonSetReady", 2).await?;
    Ok(())
}
