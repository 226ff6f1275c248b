//! The image's admission in a reconcile: the trust policy's verdict, reused while its inputs
//! stay the same, and the digest a DaemonSet already runs kept while a registry is unreachable.

use super::*;

/// Admits the Scheduler's image, reusing its last admission while the inputs (image, pull
/// secrets, trust policy) are the same and, for a tag, until `--image-recheck-interval` says to
/// resolve it again: an idle Scheduler costs no registry request. When that recheck cannot
/// reach the registry (or the trust root), the digest verified before stays admitted and the
/// recheck is tried again within a minute; so does the digest a DaemonSet runs for the same
/// inputs (its admission annotation), which a new leader finds without having verified it
/// itself. When a tag is due, `tag_recheck` resolves it apart from the reconciles and
/// reconciles only the Schedulers it changed for; a reconcile that comes first admits again here.
pub(super) async fn admit(
    ctx: &Context,
    scheduler: &Scheduler,
    uid: &str,
) -> Result<crate::trust::Admitted, TrustError> {
    let secrets = scheduler.spec.pull_secret_names();
    let inputs = (scheduler.spec.sched.clone(), secrets.clone(), ctx.trust.policy().generation);
    let now = std::time::Instant::now();
    let kept = lock(&ctx.memo.admissions).get(uid).filter(|a| a.inputs == inputs).cloned();
    if let Some(kept) = &kept
        && kept.recheck_at.is_none_or(|at| now < at)
    {
        return Ok(kept.admitted.clone());
    }
    let result = ctx.trust.admit(&ctx.client, &scheduler.spec.sched, &secrets).await;
    let interval = ctx.flags.image_recheck_interval;
    let kept = match (&result, kept) {
        (Err(e), kept) if e.is_transient() => kept.or_else(|| {
            let admitted = deployed_admission(ctx, scheduler, &secrets)?;
            Some(crate::memo::Admission {
                name: scheduler.name_any(),
                inputs: inputs.clone(),
                admitted,
                recheck_at: None,
            })
        }),
        _ => None,
    };
    let mut admissions = lock(&ctx.memo.admissions);
    match (result, kept) {
        (Ok(admitted), _) => {
            ctx.metrics.verified("reconcile", admitted.outcome.metric_label());
            // Counted from when the registry was asked, perhaps for another Scheduler on the same
            // tag: the Schedulers sharing a tag recheck it together, with one request.
            let recheck_at = crate::tag_recheck::next_recheck(&Ok(admitted.clone()), now, interval);
            let admission =
                crate::memo::Admission { name: scheduler.name_any(), inputs, admitted: admitted.clone(), recheck_at };
            admissions.insert(uid.to_owned(), admission);
            Ok(admitted)
        }
        (Err(e), Some(mut kept)) => {
            // Not a refusal: said apart, so an outage is not counted as a failed verification.
            ctx.metrics.verified("reconcile", KEPT_UNREACHABLE);
            warn!(image = %scheduler.spec.sched, err = %e, kept = %kept.admitted.image,
                "could not resolve the image again; the digest verified before stays deployed");
            kept.recheck_at = Some(now + interval.min(Duration::from_secs(60)));
            let admitted = kept.admitted.clone();
            admissions.insert(uid.to_owned(), kept);
            Ok(admitted)
        }
        (Err(e), None) => {
            ctx.metrics.verified("reconcile", e.metric_label());
            admissions.remove(uid);
            Err(e)
        }
    }
}

/// The metric outcome of a recheck that could not reach the registry (or the trust root) while
/// a digest admitted before stays deployed.
pub(super) const KEPT_UNREACHABLE: &str = "kept_registry_unreachable";

/// The digest the Scheduler's DaemonSet runs, when the DaemonSet says it was admitted for the
/// inputs the Scheduler has now (its image reference and pull secrets, and the policy rule).
pub(super) fn deployed_admission(
    ctx: &Context,
    scheduler: &Scheduler,
    secrets: &[String],
) -> Option<crate::trust::Admitted> {
    let ds = ctx.index.daemonset(&scheduler.name_any(), &ctx.settings.namespace)?;
    let recorded = ds.annotations().get(workload::ADMITTED_ANNOTATION).map(String::as_str);
    let pod = ds.spec.template.spec.as_ref()?;
    let running = pod.containers.iter().find(|c| c.name == workload::SCHEDULER_CONTAINER)?.image.as_deref();
    ctx.trust.recorded_admission(&scheduler.spec.sched, secrets, recorded, running)
}
