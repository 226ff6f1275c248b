//! The Scheduler's DaemonSet: applied from the admitted revision, kept while a failure or a
//! refusal stands, made again after a deletion, deleted when the Scheduler owns no node, and
//! set back to the last good revision by a rollback.

use super::*;

/// The Scheduler's DaemonSet after this reconcile's write, if it has one.
pub(super) struct Deployed {
    pub(super) daemonset: Option<DaemonSet>,
    /// Why the API server refused the DaemonSet built from the spec, if it did.
    pub(super) spec_error: Option<String>,
    /// Look again after this long (owner labels still on their way).
    pub(super) requeue: Option<Duration>,
}

impl Deployed {
    /// The DaemonSet as it is after this reconcile (`None`: there is none), with no refusal
    /// and nothing to wait for.
    pub(super) fn new(daemonset: Option<DaemonSet>) -> Self {
        Self { daemonset, spec_error: None, requeue: None }
    }
}

/// Makes the DaemonSet what the Scheduler asks for: applied (the admitted image of a revision
/// that has not failed), kept as it is (a refused image or a failed revision; made again if
/// someone deleted it), or deleted (it owns no node). `None` when leadership was lost first.
pub(super) async fn sync_daemonset(
    ctx: &Context,
    scheduler: &Scheduler,
    placement: &sked_core::arbiter::Placement,
    wanted: Option<&(String, String)>,
    failed: Option<&RolloutFailure>,
    previous: &RolloutStatus,
) -> Result<Option<Deployed>, Error> {
    let name = scheduler.name_any();
    let namespace = &ctx.settings.namespace;
    // Nodes another Scheduler took keep this one's pod until their wave moves their label: the
    // DaemonSet stays while any node carries it.
    let wants_daemonset = placement.wants_daemonset() || !ctx.index.labelled_nodes(&name).is_empty();
    match (wanted, wants_daemonset, failed) {
        (Some((_, image)), true, None) => Box::pin(apply_daemonset(ctx, scheduler, placement, image)).await,
        // Refused image, or a revision that failed: the DaemonSet stays as it is...
        (_, true, failed) => match (ctx.index.daemonset(&name, namespace), failed) {
            (Some(ds), _) => Ok(Some(Deployed::new(Some(ds.as_ref().clone())))),
            // ...and one deleted by hand while a failure is recorded is made again as it was.
            (None, Some(failure)) => {
                let recreated = Box::pin(recreate_after_failure(ctx, scheduler, previous, failure, wanted)).await?;
                Ok(Some(Deployed::new(recreated)))
            }
            (None, None) => Ok(Some(Deployed::new(None))),
        },
        (_, false, _) => {
            if !ctx.leading() {
                return Ok(None);
            }
            delete_daemonset(ctx, &name).await?;
            Ok(Some(Deployed::new(None)))
        }
    }
}

/// Applies the DaemonSet that runs `image` for the Scheduler, unless the one applied before is
/// unchanged, or nodes that run its pod wait for their owner label (the template selects it).
pub(super) async fn apply_daemonset(
    ctx: &Context,
    scheduler: &Scheduler,
    placement: &sked_core::arbiter::Placement,
    image: &str,
) -> Result<Option<Deployed>, Error> {
    let name = scheduler.name_any();
    let namespace = &ctx.settings.namespace;
    let apply_error = |source| Error::ApplyDaemonSet { namespace: namespace.clone(), name: name.clone(), source };
    let mut desired = workload::desired_daemonset(scheduler, image, &ctx.settings)?;
    if let Some(key) = ctx.trust.admission_key(&scheduler.spec.sched, &scheduler.spec.pull_secret_names()) {
        desired.annotations_mut().insert(workload::ADMITTED_ANNOTATION.to_owned(), key);
    }
    let hash = workload::applied_digest(&desired);
    desired.annotations_mut().insert(workload::APPLIED_ANNOTATION.to_owned(), hash.clone());
    let live = ctx.index.daemonset(&name, namespace).map(|ds| ds.as_ref().clone());
    let unchanged = applied_unchanged(ctx, &name, &hash, live.as_ref());
    // A node that runs this Scheduler's pod keeps it only if it carries the owner label the
    // template selects: apply once those labels are written.
    let running: BTreeSet<String> = ctx.index.scheduled_nodes(&name).intersection(&placement.owned).cloned().collect();
    let waiting = ctx.index.unlabelled(&name, &running);
    if unchanged {
        return Ok(Some(Deployed::new(live)));
    }
    if waiting > 0 {
        // The label's arrival triggers this Scheduler; look again now and then anyway.
        debug!(nodes = waiting, "waiting for the owner label on nodes that run this Scheduler");
        return Ok(Some(Deployed { daemonset: live, spec_error: None, requeue: Some(Duration::from_secs(5)) }));
    }
    if !ctx.leading() {
        return Ok(None);
    }
    crate::throttle::before_write(&ctx.limiter)?;
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), namespace);
    match daemonsets.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&desired)).await {
        Ok(applied) => {
            let generation = applied.metadata.generation.unwrap_or(0);
            let before =
                lock(&ctx.memo.applied).insert(name.clone(), crate::memo::Applied { hash: hash.clone(), generation });
            if before.map(|a| a.generation) != Some(generation) {
                info!(daemonset = %format!("{namespace}/{name}"), image = %image, "applied DaemonSet");
            }
            Ok(Some(Deployed::new(Some(applied))))
        }
        Err(kube::Error::Api(status)) if status.code == 422 => {
            // The spec passed the CRD schema but the DaemonSet built from it does not: report it
            // on the Scheduler and wait for the user to change the spec.
            warn!(err = %status.message, "API server refused the DaemonSet built from this spec");
            let daemonset = daemonsets.get_opt(&name).await.map_err(apply_error)?;
            Ok(Some(Deployed { daemonset, spec_error: Some(status.message.clone()), requeue: None }))
        }
        Err(source) => Err(apply_error(source)),
    }
}

/// Whether the DaemonSet `name` needs no apply: applied in this term with the same digest and not
/// edited since (its generation did not move past the one the apply got), or, not applied in
/// this term (a new leader), carrying the digest with no other writer
/// ([`workload::applied_unchanged`]); then remembered as applied at its generation.
pub(super) fn applied_unchanged(ctx: &Context, name: &str, hash: &str, live: Option<&DaemonSet>) -> bool {
    let mut applied = lock(&ctx.memo.applied);
    let Some(live) = live else { return false };
    let generation = live.metadata.generation.unwrap_or(0);
    match applied.get(name) {
        Some(a) => a.hash == hash && generation <= a.generation,
        None if workload::applied_unchanged(live, hash) => {
            applied.insert(name.to_owned(), crate::memo::Applied { hash: hash.to_owned(), generation });
            true
        }
        None => false,
    }
}

/// Deletes the DaemonSet of a Scheduler that owns no node. Nothing to delete (none seen, none
/// applied in this term): no write, so a Scheduler that owns no node costs nothing when it is
/// reconciled again.
pub(super) async fn delete_daemonset(ctx: &Context, name: &str) -> Result<(), Error> {
    let namespace = &ctx.settings.namespace;
    let present = ctx.index.daemonset(name, namespace).is_some() || lock(&ctx.memo.applied).contains_key(name);
    if !present {
        return Ok(());
    }
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

/// Makes again the DaemonSet of a Scheduler whose rollout failed, after someone deleted it: as
/// the failure left it, the template of the revision rolled back to (the current one), or, for a
/// first revision or a takeover (the failed revision is the template; its failed nodes lost
/// their label, so no pod of it goes anywhere), the spec's own.
pub(super) async fn recreate_after_failure(
    ctx: &Context,
    scheduler: &Scheduler,
    previous: &RolloutStatus,
    failure: &RolloutFailure,
    wanted: Option<&(String, String)>,
) -> Result<Option<DaemonSet>, Error> {
    let name = scheduler.name_any();
    let namespace = &ctx.settings.namespace;
    let desired = match previous.current_revision.as_ref().filter(|stable| stable.name != failure.revision) {
        Some(stable) => match stable_daemonset(ctx, scheduler, None, stable).await {
            Ok(desired) => desired,
            Err(e) => {
                warn!(err = %e, "the DaemonSet was deleted and the revision rolled back to cannot be made again; change the spec to deploy one");
                return Ok(None);
            }
        },
        None => match wanted {
            Some((_, image)) => workload::desired_daemonset(scheduler, image, &ctx.settings)?,
            None => return Ok(None),
        },
    };
    if !ctx.leading() {
        return Ok(None);
    }
    crate::throttle::before_write(&ctx.limiter)?;
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), namespace);
    let applied = daemonsets
        .patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&desired))
        .await
        .map_err(|source| Error::ApplyDaemonSet { namespace: namespace.clone(), name: name.clone(), source })?;
    info!(daemonset = %format!("{namespace}/{name}"), "made the DaemonSet again (deleted while a failed revision is recorded)");
    Ok(Some(applied))
}

/// The DaemonSet of the Scheduler's current revision `stable` (what a rollback restores): from
/// the revision's fields the status keeps or, for a revision recorded before sked kept them,
/// from the ControllerRevision history of the DaemonSet `ds_uid`.
pub(super) async fn stable_daemonset(
    ctx: &Context,
    scheduler: &Scheduler,
    ds_uid: Option<&str>,
    stable: &crate::api::Revision,
) -> Result<DaemonSet, Error> {
    let name = scheduler.name_any();
    let namespace = &ctx.settings.namespace;
    if let Some(fields) = &stable.spec {
        let mut restored = scheduler.clone();
        restored.spec = fields.applied_to(&scheduler.spec, &stable.image);
        return Ok(workload::desired_daemonset(&restored, &stable.image, &ctx.settings)?);
    }
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

/// Sets the DaemonSet's template back to the last revision that ran attached everywhere and
/// records RolledBack. The nodes the failed revision reached are replaced by the next reconciles.
pub(super) async fn roll_back(
    ctx: &Context,
    scheduler: &Scheduler,
    ds: &DaemonSet,
    previous: &RolloutStatus,
    failure: &RolloutFailure,
    newly: bool,
) -> Result<(), Error> {
    let name = scheduler.name_any();
    let namespace = &ctx.settings.namespace;
    let Some(stable) = previous.current_revision.as_ref() else { return Ok(()) };
    let desired = stable_daemonset(ctx, scheduler, ds.metadata.uid.as_deref(), stable).await?;
    if !ctx.leading() {
        return Ok(());
    }
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), namespace);
    daemonsets
        .patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&desired))
        .await
        .map_err(|source| Error::ApplyDaemonSet { namespace: namespace.clone(), name: name.clone(), source })?;
    if newly {
        info!(revision = %stable.name, image = %stable.image, "rolled back to the last attached revision");
        let message = format!(
            "Revision {} failed on node {}: {}. Rolled back to revision {} ({})",
            failure.revision, failure.node, failure.cause, stable.name, stable.image
        );
        publish(ctx, scheduler, &EventSpec { kind: EventKind::Warning, reason: Reason::RolledBack, message }).await;
    }
    Ok(())
}
