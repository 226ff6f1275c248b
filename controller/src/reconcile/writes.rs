//! What a reconcile writes once it decided ([`Plan`]): the status (first: it carries the
//! rollout's state), the rollout step's pods, owner labels and rollback, the events, and the
//! pods' conditions (`crate::pod_conditions`).

use super::*;

/// Saves the status when it changed (a failed write is a Warning event and a retried error),
/// then records the events of the change.
pub(super) async fn save_status(
    ctx: &Context,
    scheduler: &Scheduler,
    uid: &str,
    previous: &SchedulerStatus,
    outcome: &status::NewStatus,
) -> Result<(), Error> {
    let events =
        outcome.event.iter().chain(&outcome.kernel_event).chain(&outcome.contract_event).chain(&outcome.exit_events);
    if outcome.status != *previous || events.clone().next().is_some() {
        crate::throttle::before_write(&ctx.limiter)?;
    }
    if outcome.status != *previous {
        // Remembered before the write: the watch may show it before the response comes, and it
        // is this write's echo then (see `sked_core::plan::echo`). Put back if it fails.
        let before = lock(&ctx.memo.written).insert(uid.to_owned(), outcome.status.clone());
        if let Err(source) = write_status(ctx, scheduler, &outcome.status).await {
            {
                let mut written = lock(&ctx.memo.written);
                match before {
                    Some(before) => written.insert(uid.to_owned(), before),
                    None => written.remove(uid),
                };
            }
            let message = format!("Could not save the Scheduler's status: {source}");
            let event = EventSpec { kind: EventKind::Warning, reason: Reason::StatusUpdateFailed, message };
            publish(ctx, scheduler, &event).await;
            return Err(Error::WriteStatus { name: scheduler.name_any(), source });
        }
    } else {
        debug!("reconciled; nothing changed");
    }
    for event in events {
        info!(reason = %event.reason, kind = ?event.kind, note = %event.message, "state changed");
        publish(ctx, scheduler, event).await;
    }
    Ok(())
}

/// Carries out a plan: the status first (it carries the rollout's state, so a new leader
/// carries on from it) and its events, what the term remembers, the rollout's step, then the
/// pods' conditions. Returns when to look again: the plan's, or sooner when a pod condition
/// could not be written.
pub(super) async fn carry_out(
    ctx: &Context,
    s: &Snapshot<'_>,
    deployed: &Deployed,
    plan: &Plan,
    status_saved: impl FnOnce(),
) -> Result<Option<Duration>, Error> {
    let name = s.scheduler.name_any();
    ctx.metrics.set_conflicting_nodes(&name, s.placement.lost.len());
    save_status(ctx, s.scheduler, &s.scheduler.uid().unwrap_or_default(), s.previous, &plan.status).await?;
    status_saved();
    remember(ctx, &plan.remember);
    if let Some(step) = &plan.rollout {
        count_verdict(ctx, &name, s.previous, step);
        carry_out_step(ctx, s.scheduler, step, deployed.daemonset.as_ref()).await?;
    }
    let retry = crate::pod_conditions::write(ctx, &name, s.pods, &plan.pod_conditions).await;
    Ok([plan.recheck, retry].into_iter().flatten().min())
}

/// Counts the analysis verdict this step reached, if it reached one (a verdict kept from an
/// earlier bake is not counted again).
fn count_verdict(ctx: &Context, name: &str, previous: &sked_api::SchedulerStatus, step: &RolloutActions) {
    let before = previous.rollout.as_ref().and_then(|r| r.analysis.as_ref());
    if let Some(now) = step.status.analysis.as_ref().filter(|a| Some(*a) != before) {
        info!(revision = %now.revision, verdict = now.verdict.as_str(), message = %now.message, "analysis of a bake");
        ctx.metrics.analysis_verdict(name, now.verdict);
    }
}

/// Keeps what the plan says the term remembers: the nodes now seen attached are no longer
/// switching, and the ejections heard have their events.
fn remember(ctx: &Context, remember: &plan::Remember) {
    ctx.memo.exits_recorded(&remember.exits_recorded);
    ctx.memo.expectations.seen_attached(&remember.attached);
}

/// Carries out a rollout step once its status is saved: the rollback, the pods to replace, the
/// owner labels to write, and the RolledBack events.
async fn carry_out_step(
    ctx: &Context,
    scheduler: &Scheduler,
    step: &RolloutActions,
    daemonset: Option<&DaemonSet>,
) -> Result<(), Error> {
    let name = scheduler.name_any();
    if let Some(failure) = &step.newly_failed {
        warn!(revision = %failure.revision, node = %failure.node, cause = %failure.cause, "rollout failed");
        ctx.metrics.rolled_back(&name);
    }
    if step.recovered {
        info!("the revision reported failed runs attached everywhere now");
    }
    if step.writes() {
        crate::throttle::before_write(&ctx.limiter)?;
    }
    if let (Some(to), Some(ds)) = (&step.roll_back, daemonset) {
        roll_back(ctx, scheduler, ds, to, step.newly_failed.is_some()).await?;
    }
    replace_pods(ctx, &name, &step.replace).await;
    write_owner_labels(ctx, &name, &step.admit, &step.evict).await;
    for event in step.events() {
        publish(ctx, scheduler, event).await;
    }
    Ok(())
}

/// Writes the owner labels a rollout step decided: `admit` gets this Scheduler's, `evict` loses
/// it (back to the kernel's default scheduler). A label not written is decided again at the
/// next reconcile.
pub(super) async fn write_owner_labels(ctx: &Context, scheduler: &str, admit: &[String], evict: &[String]) {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(ctx.client.clone());
    let writes = admit.iter().map(|n| (n, Some(scheduler))).chain(evict.iter().map(|n| (n, None)));
    for (node, owner) in writes {
        if !ctx.leading() {
            return;
        }
        match crate::owner_labels::write_label(&nodes, node, owner).await {
            Ok(version) => {
                ctx.memo.expectations.label_written(node, owner, version);
                match owner {
                    Some(_) => info!(node = %node, "node enters this Scheduler"),
                    None => info!(node = %node, "node back on the kernel's default scheduler"),
                }
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                warn!(node = %node, err = %e, "could not write the node's owner label; retried at the next reconcile")
            }
        }
    }
}

/// Deletes the pods a rollout of Scheduler `scheduler` replaces now, and remembers each until
/// its successor shows.
pub(super) async fn replace_pods(ctx: &Context, scheduler: &str, replace: &[sked_core::plan::Replacement]) {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.settings.namespace);
    for sked_core::plan::Replacement { pod, uid, node } in replace {
        if !ctx.leading() {
            return;
        }
        let params = DeleteParams {
            preconditions: Some(kube::api::Preconditions { uid: Some(uid.clone()), resource_version: None }),
            ..DeleteParams::default()
        };
        match pods.delete(pod, &params).await {
            Ok(_) => {
                ctx.memo.expectations.pod_replaced(node, scheduler, pod);
                info!(pod = %pod, node = %node, "replacing pod with the new revision");
            }
            // Gone, or another pod by now: decided again at the next reconcile.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => warn!(pod = %pod, err = %e, "could not delete pod; retried at the next reconcile"),
        }
    }
}

pub(super) async fn write_status(
    ctx: &Context,
    scheduler: &Scheduler,
    status: &SchedulerStatus,
) -> Result<(), kube::Error> {
    let api: Api<Scheduler> = Api::all(ctx.client.clone());
    let body = json!({
        "apiVersion": Scheduler::api_version(&()),
        "kind": Scheduler::kind(&()),
        "metadata": { "name": scheduler.name_any() },
        "status": status,
    });
    api.patch_status(&scheduler.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body))
        .await
        .map(|_| ())
}

pub(super) async fn publish(ctx: &Context, scheduler: &Scheduler, event: &EventSpec) {
    if !ctx.leading() {
        return;
    }
    crate::throttle::before_late_write(&ctx.limiter).await;
    let ev = KubeEvent {
        type_: match event.kind {
            EventKind::Normal => EventType::Normal,
            EventKind::Warning => EventType::Warning,
        },
        reason: event.reason.as_str().to_owned(),
        note: Some(event.message.clone()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &scheduler.object_ref(&())).await {
        warn!(err = %e, reason = %event.reason, "could not record event");
    }
}
