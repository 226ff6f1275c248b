//! The Scheduler's DaemonSet as `sked_core::plan` decided it: applied from the admitted
//! revision, kept, made again after a deletion, deleted, and set back to the last good revision
//! by a rollback (its template from the revision's recorded fields or the DaemonSet's history).

use super::*;

/// Carries out the DaemonSet's write `plan::daemonset` decided, and returns the DaemonSet as it
/// left it; `None` when leadership was lost first.
pub(super) async fn write_daemonset(
    ctx: &Context,
    s: &Snapshot<'_>,
    write: DaemonSetWrite,
) -> Result<Option<Deployed>, Error> {
    let name = s.scheduler.name_any();
    let live = s.daemonset.cloned();
    let deployed = match write {
        DaemonSetWrite::Keep { remember, requeue } => {
            if let Some(applied) = remember {
                lock(&ctx.memo.applied).insert(name.clone(), applied);
            }
            Deployed { daemonset: live, requeue, ..Deployed::default() }
        }
        DaemonSetWrite::Apply { desired, hash, image } => {
            let Some(deployed) = Box::pin(apply(ctx, &name, &desired, hash, &image)).await? else { return Ok(None) };
            deployed
        }
        DaemonSetWrite::Recreate(from) => {
            let Some(daemonset) = Box::pin(recreate(ctx, s.scheduler, from)).await? else { return Ok(None) };
            Deployed { daemonset, ..Deployed::default() }
        }
        DaemonSetWrite::Delete => {
            if !ctx.leading() {
                return Ok(None);
            }
            delete_daemonset(ctx, &name).await?;
            Deployed::default()
        }
    };
    let applied_generation = lock(&ctx.memo.applied).get(&name).map_or(0, |a| a.generation);
    Ok(Some(Deployed { applied_generation, ..deployed }))
}

/// Applies the DaemonSet `desired` (of digest `hash`, running `image`) for the Scheduler `name`.
async fn apply(
    ctx: &Context,
    name: &str,
    desired: &DaemonSet,
    hash: String,
    image: &str,
) -> Result<Option<Deployed>, Error> {
    let namespace = &ctx.settings.namespace;
    let apply_error = |source| Error::ApplyDaemonSet { namespace: namespace.clone(), name: name.to_owned(), source };
    if !ctx.leading() {
        return Ok(None);
    }
    crate::throttle::before_write(&ctx.limiter)?;
    match server_side_apply(ctx, name, desired).await {
        Ok(None) => Ok(None),
        Ok(Some(applied)) => {
            let generation = applied.metadata.generation.unwrap_or(0);
            let before = lock(&ctx.memo.applied).insert(name.to_owned(), plan::Applied { hash, generation });
            if before.map(|a| a.generation) != Some(generation) {
                info!(daemonset = %format!("{namespace}/{name}"), image = %image, "applied DaemonSet");
            }
            Ok(Some(Deployed { daemonset: Some(applied), ..Deployed::default() }))
        }
        Err(kube::Error::Api(status)) if status.code == 422 => {
            // The spec passed the CRD schema but the DaemonSet built from it does not: report it
            // on the Scheduler and wait for the user to change the spec.
            warn!(err = %status.message, "API server refused the DaemonSet built from this spec");
            let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), namespace);
            let daemonset = daemonsets.get_opt(name).await.map_err(apply_error)?;
            Ok(Some(Deployed { daemonset, spec_error: Some(status.message.clone()), ..Deployed::default() }))
        }
        Err(source) => Err(apply_error(source)),
    }
}

/// Deletes the DaemonSet of a Scheduler that owns no node.
async fn delete_daemonset(ctx: &Context, name: &str) -> Result<(), Error> {
    let namespace = &ctx.settings.namespace;
    crate::throttle::before_write(&ctx.limiter)?;
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), namespace);
    match daemonsets.delete(name, &DeleteParams::background()).await {
        Ok(_) => {
            info!(daemonset = %format!("{namespace}/{name}"), "deleted DaemonSet: every selected node belongs to an older Scheduler")
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(source) => {
            return Err(Error::DeleteDaemonSet { namespace: namespace.clone(), name: name.to_owned(), source });
        }
    }
    lock(&ctx.memo.applied).remove(name);
    Ok(())
}

/// Makes again the DaemonSet of a Scheduler whose rollout failed, after someone deleted it (see
/// [`Recreate`]). `Some(None)`: the revision rolled back to cannot be made again.
async fn recreate(ctx: &Context, scheduler: &Scheduler, from: Recreate) -> Result<Option<Option<DaemonSet>>, Error> {
    let name = scheduler.name_any();
    let namespace = &ctx.settings.namespace;
    let desired = match from {
        Recreate::Stable(stable) => match stable_daemonset(ctx, scheduler, None, &stable).await {
            Ok(desired) => desired,
            Err(e) => {
                warn!(err = %e, "the DaemonSet was deleted and the revision rolled back to cannot be made again; change the spec to deploy one");
                return Ok(Some(None));
            }
        },
        Recreate::Spec(desired) => *desired,
    };
    if !ctx.leading() {
        return Ok(None);
    }
    crate::throttle::before_write(&ctx.limiter)?;
    let Some(applied) = server_side_apply(ctx, &name, &desired).await.map_err(|source| Error::ApplyDaemonSet {
        namespace: namespace.clone(),
        name: name.clone(),
        source,
    })?
    else {
        return Ok(None);
    };
    info!(daemonset = %format!("{namespace}/{name}"), "made the DaemonSet again (deleted while a failed revision is recorded)");
    Ok(Some(Some(applied)))
}

/// The one DaemonSet write: `desired` applied server-side as sked's field manager, as the
/// DaemonSet of Scheduler `name`. `None` when this replica no longer leads.
async fn server_side_apply(ctx: &Context, name: &str, desired: &DaemonSet) -> Result<Option<DaemonSet>, kube::Error> {
    if !ctx.leading() {
        return Ok(None);
    }
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), &ctx.settings.namespace);
    daemonsets.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(desired)).await.map(Some)
}

/// The DaemonSet of the Scheduler's current revision `stable` (what a rollback restores): from
/// the revision's fields and agent image the status keeps or, for a revision recorded before
/// sked kept them (or before agent images were part of revisions), from the ControllerRevision
/// history of the DaemonSet `ds_uid`. Either way its pods carry `stable`'s name, so the rollout
/// knows them for the revision it went back to.
pub(super) async fn stable_daemonset(
    ctx: &Context,
    scheduler: &Scheduler,
    ds_uid: Option<&str>,
    stable: &crate::api::Revision,
) -> Result<DaemonSet, Error> {
    let Some(fields) = &stable.spec else { return from_history(ctx, scheduler, ds_uid, stable).await };
    let mut restored = scheduler.clone();
    restored.spec = fields.applied_to(&scheduler.spec, &stable.image);
    let mut settings = ctx.settings.clone();
    if let Some(agent) = &stable.agent_image {
        settings.agent.image = agent.clone();
    }
    let mut desired = workload::desired_daemonset(&restored, &stable.image, &settings)?;
    if workload::template_revision(&desired) == Some(stable.name.as_str()) {
        return Ok(desired);
    }
    // Recorded under the name an earlier sked gave it: its template as it ran, from the
    // history; else its fields with the current agent, under its own name.
    if let Ok(ran) = from_history(ctx, scheduler, ds_uid, stable).await {
        return Ok(ran);
    }
    workload::set_template_revision(&mut desired, &stable.name);
    Ok(desired)
}

/// The DaemonSet of revision `stable` from the ControllerRevision history of the DaemonSet
/// `ds_uid`: its template as it ran, in the current placement.
async fn from_history(
    ctx: &Context,
    scheduler: &Scheduler,
    ds_uid: Option<&str>,
    stable: &crate::api::Revision,
) -> Result<DaemonSet, Error> {
    let name = scheduler.name_any();
    let namespace = &ctx.settings.namespace;
    let lost =
        || Error::RollbackLost { name: name.clone(), namespace: namespace.clone(), revision: stable.name.clone() };
    let ds_uid = ds_uid.ok_or_else(lost)?;
    let revisions: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), namespace);
    let selector = format!("{}={name},{}={}", workload::NAME_LABEL, workload::REVISION_LABEL, stable.name);
    let listed = revisions
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| Error::ApplyDaemonSet { namespace: namespace.clone(), name: name.clone(), source })?;
    let owned_by_ds = |r: &&ControllerRevision| r.owner_references().iter().any(|o| o.uid == ds_uid);
    let template = listed
        .items
        .iter()
        .filter(owned_by_ds)
        .max_by_key(|r| r.revision)
        .and_then(|r| r.data.0.get("spec")?.get("template").cloned())
        .and_then(|mut t| {
            if let Some(t) = t.as_object_mut() {
                t.remove("$patch");
            }
            serde_json::from_value::<PodTemplateSpec>(t).ok()
        })
        .ok_or_else(lost)?;
    let mut desired = workload::desired_daemonset(scheduler, &stable.image, &ctx.settings)?;
    workload::restore_revision(&mut desired, &template);
    Ok(desired)
}

/// Sets the DaemonSet's template back to the revision `to` (the last that ran attached
/// everywhere). The nodes the failed revision reached are replaced by the next reconciles.
pub(super) async fn roll_back(
    ctx: &Context,
    scheduler: &Scheduler,
    ds: &DaemonSet,
    to: &crate::api::Revision,
    newly: bool,
) -> Result<(), Error> {
    let name = scheduler.name_any();
    let namespace = &ctx.settings.namespace;
    let desired = stable_daemonset(ctx, scheduler, ds.metadata.uid.as_deref(), to).await?;
    let applied = server_side_apply(ctx, &name, &desired).await.map_err(|source| Error::ApplyDaemonSet {
        namespace: namespace.clone(),
        name: name.clone(),
        source,
    })?;
    if applied.is_some() && newly {
        info!(revision = %to.name, image = %to.image, "rolled back to the last attached revision");
    }
    Ok(())
}
