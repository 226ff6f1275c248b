//! Node arbitration against a real API server: the oldest Scheduler wins each node, and the
//! controller writes the winner on the node as the `sked.schedkit.io/scheduler` label, which the
//! DaemonSets select; losers of every node lose their DaemonSet; ownership moves when the winner
//! goes or labels change; conditions and events say so.

use anyhow::Result;
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use sked_tests::{Fixture, has_condition, next_second_after, spec, spec_on};

const IMAGE: &str = "ghcr.io/schedkit/scx_rusty:v1";

/// The nodes a DaemonSet's pods may run on: its nodeSelector, which names the owner label.
fn node_selector(ds: &DaemonSet) -> std::collections::BTreeMap<String, String> {
    ds.spec.template.spec.as_ref().and_then(|p| p.node_selector.clone()).unwrap_or_default()
}

/// The DaemonSet selects the nodes its Scheduler owns, through the owner label.
fn selects_owned(ds: &DaemonSet) -> bool {
    node_selector(ds).get("sked.schedkit.io/scheduler") == Some(&ds.name_any())
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

    fx.wait_daemonset("zz-old", "selects its nodes by owner", selects_owned).await?;
    fx.wait_owners(&[("n1", Some("zz-old")), ("n2", Some("zz-old"))]).await?;
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

    fx.wait_owners(&[("batch-1", Some("batch")), ("batch-2", Some("zone-b")), ("batch-3", Some("zone-b"))]).await?;
    let ds = fx.wait_daemonset("batch", "selects its nodes by owner", selects_owned).await?;
    // The Scheduler's own selector is kept next to the owner label; no node names in the template.
    assert_eq!(node_selector(&ds).get("pool").map(String::as_str), Some("batch"));
    assert!(ds.spec.template.spec.as_ref().is_some_and(|p| p.affinity.is_none()));

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
    fx.wait_owners(&[("x-1", Some("first")), ("x-2", Some("second")), ("x-3", Some("first")), ("x-4", Some("third"))])
        .await?;
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
    fx.wait_daemonset("loser", "recreated", selects_owned).await?;
    fx.wait_owners(&[("w-1", Some("loser")), ("w-2", Some("loser"))]).await?;
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
    let after = fx.daemonsets().get("leaving").await?;
    let release = json!({"metadata": {"finalizers": null}});
    fx.schedulers().patch("leaving", &PatchParams::default(), &Patch::Merge(&release)).await?;
    // Nothing was applied to the terminating Scheduler's DaemonSet (its status moves: the
    // DaemonSet controller removes its pod from the node that changed owner).
    assert_eq!(after.metadata.generation, before.metadata.generation);
    assert_eq!(after.metadata.labels, before.metadata.labels);
    Ok(())
}

#[tokio::test]
async fn relabelling_adding_and_deleting_nodes_moves_ownership_without_touching_a_template() -> Result<()> {
    let fx = Fixture::start().await?;
    fx.create_node("r-1", &[("pool", "a")]).await?;
    fx.create_node("r-2", &[("pool", "b")]).await?;
    let a = fx.create_scheduler("pool-a", spec_on(IMAGE, &[("pool", "a")])).await?;
    next_second_after(a.creation_timestamp().as_ref().expect("created")).await?;
    fx.create_scheduler("everything", spec(IMAGE)).await?;
    fx.wait_owners(&[("r-1", Some("pool-a")), ("r-2", Some("everything"))]).await?;
    let pods = sked_tests::wait_bound_pods(&fx.client, &fx.namespace, "everything", 1).await?;
    let on_r2 = pods.get("r-2").and_then(|p| p.uid()).expect("a pod on r-2");
    let ds = fx
        .wait_daemonset("everything", "observed", |d| {
            d.status.as_ref().and_then(|s| s.observed_generation) == d.metadata.generation
        })
        .await?;
    let generation = ds.metadata.generation;

    // r-1 leaves pool a: the younger catch-all takes it.
    fx.relabel_node("r-1", &[("pool", "c")]).await?;
    fx.wait_owners(&[("r-1", Some("everything")), ("r-2", Some("everything"))]).await?;
    fx.wait_scheduler("pool-a", "no nodes", |s| has_condition(s, "Ready", "False", "NoNodesScheduled")).await?;
    fx.wait_scheduler("everything", "not degraded", |s| conflicting(s) == 0).await?;
    let pods = sked_tests::wait_bound_pods(&fx.client, &fx.namespace, "everything", 2).await?;
    assert_eq!(pods.get("r-2").and_then(|p| p.uid()), Some(on_r2.clone()), "the pod on r-2 was not restarted");

    // r-2 joins pool a: the older Scheduler takes it back; a node comes and one goes.
    fx.relabel_node("r-2", &[("pool", "a")]).await?;
    fx.create_node("r-3", &[("pool", "c")]).await?;
    fx.wait_owners(&[("r-1", Some("everything")), ("r-2", Some("pool-a")), ("r-3", Some("everything"))]).await?;
    fx.wait_scheduler("pool-a", "owns r-2", |s| s.status.as_ref().is_some_and(|st| st.desired_number_scheduled == 1))
        .await?;
    // (No pod garbage collector runs here, so the pod on a deleted node stays; the DaemonSet's
    // template is what matters.)
    fx.nodes().delete("r-3", &Default::default()).await?;
    // None of this changed the catch-all's pod template.
    let ds = fx.daemonsets().get("everything").await?;
    assert_eq!(ds.metadata.generation, generation, "node moves never change a DaemonSet's template");

    // Someone removes the owner label by hand: it is put back. A Scheduler gone: its label goes.
    fx.relabel_node("r-1", &[("pool", "c")]).await?;
    fx.wait_owners(&[("r-1", Some("everything"))]).await?;
    fx.schedulers().delete("everything", &Default::default()).await?;
    fx.wait_owners(&[("r-1", None), ("r-2", Some("pool-a"))]).await?;
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
    fx.wait_daemonset("pool-b", "recreated", selects_owned).await?;
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
