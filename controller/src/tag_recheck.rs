//! Resolves the tags Schedulers name again, apart from their reconciles.
//!
//! A Scheduler that names a tag keeps its admitted digest until `--image-recheck-interval`
//! passes (see `reconcile::admit`). When it does, the Schedulers whose admissions are due are
//! checked here, once per image reference and pull secrets: a tag that still names the digest
//! they run only moves their next recheck, and nothing else happens. Only a Scheduler whose tag
//! moved, was refused, or could not be resolved is reconciled, and its reconcile admits the image
//! as before (reusing the resolution made here, so the registry is asked once).
//!
//! Rechecking by reconciling put every Scheduler on a tag in the reconcile rate limit's queue in
//! the same second (they share the tag's resolution, so they fall due together): at the default
//! 5 reconciles a second, 200 of them held the kernel changes agents report for 40 s.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::debug;

use crate::context::Context;
use crate::index::Triggers;
use crate::memo::Admission;
use crate::mutex::lock;
use crate::trust::{Admitted, TrustError};

/// How often the admissions are looked at for rechecks that fell due.
const TICK: Duration = Duration::from_secs(1);

/// The metric caller of the admissions made here.
const CALLER: &str = "recheck";

/// One Scheduler's admission that is due, as it was when it was picked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Due {
    pub(crate) uid: String,
    pub(crate) name: String,
    pub(crate) inputs: (String, Vec<String>, u64),
    pub(crate) image: String,
    pub(crate) recheck_at: Instant,
}

/// Rechecks due tags every second while this replica leads.
pub(crate) async fn recheck_tags(ctx: Arc<Context>, triggers: Triggers, mut leader: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if leader.wait_for(|leading| *leading).await.is_err() {
            return;
        }
        tick.tick().await;
        if ctx.leading() {
            recheck_due(&ctx, &triggers, Instant::now()).await;
        }
    }
}

/// Resolves each due image reference once and settles every admission that was due on it.
async fn recheck_due(ctx: &Context, triggers: &Triggers, now: Instant) {
    let groups = due_by_reference(&lock(&ctx.memo.admissions), now);
    for ((image, secrets), due) in groups {
        let result = ctx.trust.admit(&ctx.client, &image, &secrets).await;
        match &result {
            Ok(admitted) => ctx.metrics.verified(CALLER, admitted.outcome.metric_label()),
            Err(e) => ctx.metrics.verified(CALLER, e.metric_label()),
        }
        let generation = ctx.trust.policy().generation;
        let next = next_recheck(&result, now, ctx.flags.image_recheck_interval);
        let mut admissions = lock(&ctx.memo.admissions);
        for d in due {
            let Some(entry) = admissions.get_mut(&d.uid) else { continue };
            // A reconcile of this Scheduler admitted it again meanwhile: its own result stands.
            if entry.recheck_at != Some(d.recheck_at) || entry.inputs != d.inputs {
                continue;
            }
            match unchanged(&result, &d, generation).then_some(next).flatten() {
                Some(at) => entry.recheck_at = Some(at),
                None => {
                    debug!(scheduler = %d.name, image = %image, "the tag's recheck changed what is admitted; reconciling");
                    triggers.send(&d.name);
                }
            }
        }
    }
}

/// The admissions due at `now` (a tag's recheck time passed), by image reference and pull
/// secrets, each group in the order of its Schedulers' uids.
pub(crate) fn due_by_reference<S: std::hash::BuildHasher>(
    admissions: &std::collections::HashMap<String, Admission, S>,
    now: Instant,
) -> BTreeMap<(String, Vec<String>), Vec<Due>> {
    let mut groups: BTreeMap<(String, Vec<String>), Vec<Due>> = BTreeMap::new();
    for (uid, a) in admissions {
        let Some(recheck_at) = a.recheck_at.filter(|at| *at <= now) else { continue };
        groups.entry((a.inputs.0.clone(), a.inputs.1.clone())).or_default().push(Due {
            uid: uid.clone(),
            name: a.name.clone(),
            inputs: a.inputs.clone(),
            image: a.admitted.image.clone(),
            recheck_at,
        });
    }
    for due in groups.values_mut() {
        due.sort_by(|a, b| a.uid.cmp(&b.uid));
    }
    groups
}

/// Whether the recheck admits what `due` runs, under the policy it was admitted by.
pub(crate) fn unchanged(result: &Result<Admitted, TrustError>, due: &Due, generation: u64) -> bool {
    result.as_ref().is_ok_and(|a| a.image == due.image) && due.inputs.2 == generation
}

/// When to recheck next after an admission: counted from when the registry was asked.
pub(crate) fn next_recheck(result: &Result<Admitted, TrustError>, now: Instant, interval: Duration) -> Option<Instant> {
    let admitted = result.as_ref().ok()?;
    admitted.from_tag.then(|| admitted.resolved_at.unwrap_or(now) + interval)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::trust::AdmittedBy;

    const TAG: &str = "r.io/team/sched:v1";
    const DIGEST: &str = "r.io/team/sched@sha256:aaaa";

    fn admitted(image: &str, resolved_at: Instant) -> Admitted {
        Admitted { image: image.into(), outcome: AdmittedBy::Verified, from_tag: true, resolved_at: Some(resolved_at) }
    }

    fn admission(name: &str, tag: &str, secrets: &[&str], recheck_at: Option<Instant>, t0: Instant) -> Admission {
        Admission {
            name: name.into(),
            inputs: (tag.into(), secrets.iter().map(|s| (*s).to_owned()).collect(), 1),
            admitted: admitted(DIGEST, t0),
            recheck_at,
        }
    }

    #[test]
    fn only_due_admissions_are_picked_once_per_reference_and_secrets() {
        let t0 = Instant::now();
        let now = t0 + Duration::from_secs(300);
        let admissions: HashMap<String, Admission> = [
            ("u2", admission("b", TAG, &[], Some(now), t0)),
            ("u1", admission("a", TAG, &[], Some(t0 + Duration::from_secs(10)), t0)),
            ("u3", admission("c", TAG, &["creds"], Some(now), t0)),
            ("u4", admission("d", TAG, &[], Some(now + Duration::from_secs(1)), t0)),
            ("u5", admission("e", "r.io/x@sha256:bbbb", &[], None, t0)),
        ]
        .into_iter()
        .map(|(uid, a)| (uid.to_owned(), a))
        .collect();
        let groups = due_by_reference(&admissions, now);
        let names: Vec<(Vec<String>, Vec<&str>)> = groups
            .iter()
            .map(|((_, secrets), due)| (secrets.clone(), due.iter().map(|d| d.name.as_str()).collect()))
            .collect();
        assert_eq!(names, vec![(vec![], vec!["a", "b"]), (vec!["creds".to_owned()], vec!["c"])]);
    }

    #[test]
    fn the_same_digest_under_the_same_policy_only_moves_the_recheck() {
        let t0 = Instant::now();
        let now = t0 + Duration::from_secs(300);
        let due = Due {
            uid: "u".into(),
            name: "a".into(),
            inputs: (TAG.into(), vec![], 1),
            image: DIGEST.into(),
            recheck_at: now,
        };
        let same = Ok(admitted(DIGEST, now));
        assert!(unchanged(&same, &due, 1));
        assert_eq!(next_recheck(&same, now, Duration::from_secs(300)), Some(now + Duration::from_secs(300)));
        assert!(!unchanged(&Ok(admitted("r.io/team/sched@sha256:bbbb", now)), &due, 1), "the tag moved");
        assert!(!unchanged(&same, &due, 2), "the policy changed since");
        let unreachable =
            Err(TrustError::Unreachable { image: TAG.into(), registry: "r.io".into(), detail: "down".into() });
        assert!(!unchanged(&unreachable, &due, 1), "the reconcile keeps the digest and says so");
        assert_eq!(next_recheck(&unreachable, now, Duration::from_secs(300)), None);
    }
}
