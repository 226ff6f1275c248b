//! `kubectl sked rollout status|pause|resume|retry|undo`: follow a Scheduler's rollout, or
//! change the one field of its spec each command is about. Every write is a patch of that field
//! or, for `undo`, an update that fails if the Scheduler changed since it was read.

use std::time::Duration;

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use sked_api::{RevisionSpec, RolloutPhase, Scheduler};

use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::fleet::finished;

/// Where a rollout stands, in one line, and whether it is over (`Some(true)`: complete).
pub fn progress(s: &Scheduler) -> (String, Option<bool>) {
    let name = s.name_any();
    let st = s.status.clone().unwrap_or_default();
    let observed = st.observed_generation.unwrap_or(0) >= s.metadata.generation.unwrap_or(0);
    let Some(r) = st.rollout.as_ref().filter(|_| observed) else {
        return (format!("Waiting for the controller to observe Scheduler {name}'s latest spec"), None);
    };
    let desired = st.desired_number_scheduled;
    let revision = r.update_revision.as_ref().or(r.current_revision.as_ref()).map_or("-", |rev| rev.name.as_str());
    let line = match r.phase {
        RolloutPhase::Complete => format!(
            "Scheduler {name} rolled out: revision {revision} runs attached on {} of {desired} nodes",
            st.kernel_attached
        ),
        RolloutPhase::RolledBack | RolloutPhase::Failed => {
            let why = r.failed.as_ref().map_or_else(String::new, |f| {
                format!(": revision {} failed on node {}: {}", f.revision, f.node, f.cause)
            });
            let back = if r.phase == RolloutPhase::Failed {
                "the kernel's default scheduler"
            } else {
                "the previous revision"
            };
            format!("Scheduler {name} rolled back to {back}{why}")
        }
        // Why it waits, as the controller wrote it.
        RolloutPhase::Queued => st
            .conditions
            .iter()
            .find(|c| c.type_ == sked_api::condition::PROGRESSING && c.message.starts_with("Queued:"))
            .map_or_else(|| format!("Queued: revision {revision} waits for a canary slot"), |c| c.message.clone()),
        phase => format!(
            "{}: {} of {desired} nodes updated to revision {revision}, {} attached{}{}{}",
            phase.as_str(),
            r.updated_nodes,
            r.attached_nodes,
            if r.entering_nodes > 0 { format!(", {} entering", r.entering_nodes) } else { String::new() },
            if phase == RolloutPhase::Paused { " (paused: kubectl sked rollout resume resumes it)" } else { "" },
            last_verdict(r, revision),
        ),
    };
    (line, finished(r.phase))
}

/// The analysis of the revision's last bake, when there was one: "; last bake Passed (...)".
fn last_verdict(r: &sked_api::RolloutStatus, revision: &str) -> String {
    r.analysis
        .as_ref()
        .filter(|a| a.revision == revision)
        .map_or_else(String::new, |a| format!("; analysis of the last bake: {} ({})", a.verdict.as_str(), a.message))
}

/// Follows the rollout, printing each new state, until it is over or `timeout` (zero: none).
pub async fn status(cluster: &Cluster, name: &str, watch: bool, timeout: Duration) -> Result<()> {
    let s = cluster.scheduler(name).await?;
    let (line, done) = progress(&s);
    let line = name_pods(cluster, &s, line).await;
    println!("{line}");
    match done {
        Some(true) => return Ok(()),
        Some(false) => return Err(Error::RolloutFailed(format!("the rollout of Scheduler {name} failed"))),
        None if !watch => return Ok(()),
        None => {}
    }
    let follow = follow(cluster, name, line);
    if timeout.is_zero() {
        return follow.await;
    }
    tokio::time::timeout(timeout, follow).await.unwrap_or_else(|_| {
        Err(Error::TimedOut(format!(
            "timed out after {}s waiting for the rollout of Scheduler {name}",
            timeout.as_secs()
        )))
    })
}

async fn follow(cluster: &Cluster, name: &str, mut last: String) -> Result<()> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher(cluster.schedulers(), config).default_backoff());
    while let Some(event) = events.next().await {
        let s = match event {
            Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => s,
            Ok(watcher::Event::Delete(_)) => return Err(Error::NotFound(format!("Scheduler {name} was deleted"))),
            Ok(_) => continue,
            Err(watcher::Error::WatchError(s) | watcher::Error::InitialListFailed(kube::Error::Api(s)))
                if s.code == 403 =>
            {
                return Err(Error::Forbidden { what: format!("watching Scheduler {name}"), message: s.message });
            }
            // Anything else is retried with backoff, as kubectl's own watches do.
            Err(_) => continue,
        };
        let (line, done) = progress(&s);
        let line = name_pods(cluster, &s, line).await;
        if line != last {
            println!("{line}");
            last = line;
        }
        match done {
            Some(true) => return Ok(()),
            Some(false) => return Err(Error::RolloutFailed(format!("the rollout of Scheduler {name} failed"))),
            None => {}
        }
    }
    Err(Error::Other(format!("the watch of Scheduler {name} ended")))
}

/// `line` with the pods the failure's cause names by UID named as the user knows them, where
/// the user may list the pods of the node it failed on (see `crate::pod_names`).
pub async fn name_pods(cluster: &Cluster, s: &Scheduler, line: String) -> String {
    let failed = s.status.as_ref().and_then(|st| st.rollout.as_ref()).and_then(|r| r.failed.as_ref());
    match failed {
        Some(f) => cluster.pod_names([f.node.as_str()], [line.as_str()]).await.apply(&line),
        None => line,
    }
}

/// Sets `spec.rollout.paused`.
pub async fn set_paused(cluster: &Cluster, name: &str, paused: bool) -> Result<()> {
    let s = cluster.scheduler(name).await?;
    let is_paused = s.spec.rollout.as_ref().is_some_and(|r| r.paused);
    let word = if paused { "paused" } else { "resumed" };
    if is_paused == paused {
        println!(
            "scheduler.sked.schedkit.io/{name} already {}",
            if paused { "paused" } else { "running (not paused)" }
        );
        return Ok(());
    }
    patch_paused(cluster, name, paused).await?;
    println!("scheduler.sked.schedkit.io/{name} {word}");
    Ok(())
}

async fn patch_paused(cluster: &Cluster, name: &str, paused: bool) -> Result<()> {
    let body = json!({"spec": {"rollout": {"paused": paused}}});
    cluster
        .schedulers()
        .patch(name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map_err(|e| Error::api(format!("patching Scheduler {name}"), e))?;
    Ok(())
}

/// Tries the failed revision again: a pause and a resume, each a new generation of the spec,
/// after which the failure (recorded for its generation) no longer holds.
pub async fn retry(cluster: &Cluster, name: &str) -> Result<()> {
    let s = cluster.scheduler(name).await?;
    let rollout = s.status.as_ref().and_then(|st| st.rollout.as_ref());
    let Some(failed) = rollout.and_then(|r| r.failed.as_ref()).filter(|f| Some(f.generation) == s.metadata.generation)
    else {
        let phase = rollout.map_or("none yet", |r| r.phase.as_str());
        return Err(Error::NotFound(format!(
            "Scheduler {name} has no failed revision to retry (rollout phase: {phase})"
        )));
    };
    let resume = format!("tries revision {} again", failed.revision);
    pause_and_resume(cluster, &s, &resume).await?;
    println!(
        "scheduler.sked.schedkit.io/{name} retrying revision {} (it failed on node {}: {})",
        failed.revision, failed.node, failed.cause
    );
    Ok(())
}

/// Goes on past an Inconclusive verdict that holds the rollout: a pause and a resume, each a
/// new generation of the spec, after which the verdict (reached under its generation) no
/// longer holds.
pub async fn proceed(cluster: &Cluster, name: &str) -> Result<()> {
    let s = cluster.scheduler(name).await?;
    let rollout = s.status.as_ref().and_then(|st| st.rollout.as_ref());
    let Some(held) =
        rollout.and_then(|r| r.analysis.as_ref()).filter(|a| a.holds && a.generation == s.metadata.generation)
    else {
        let phase = rollout.map_or("none yet", |r| r.phase.as_str());
        return Err(Error::NotFound(format!(
            "the rollout of Scheduler {name} does not wait on an Inconclusive analysis (rollout phase: {phase})"
        )));
    };
    pause_and_resume(cluster, &s, "goes on past the analysis too").await?;
    println!(
        "scheduler.sked.schedkit.io/{name} proceeding past the analysis of revision {} ({})",
        held.revision, held.message
    );
    Ok(())
}

/// A new generation of the spec, twice (paused, then not): what moves a recorded failure or an
/// Inconclusive verdict, both held only under the generation they were reached in. A paused
/// Scheduler is left to `resume`, which does the same (`resume` says what it does then).
async fn pause_and_resume(cluster: &Cluster, s: &Scheduler, resume: &str) -> Result<()> {
    let name = s.name_any();
    if s.spec.rollout.as_ref().is_some_and(|r| r.paused) {
        return Err(Error::NotFound(format!(
            "Scheduler {name} is paused: kubectl sked rollout resume {name} resumes it, which {resume}"
        )));
    }
    patch_paused(cluster, &name, true).await?;
    patch_paused(cluster, &name, false).await
}

/// Sets the spec back to the current revision: the one sked last ran attached everywhere.
pub async fn undo(cluster: &Cluster, name: &str) -> Result<()> {
    let mut s = cluster.scheduler(name).await?;
    let current = s.status.as_ref().and_then(|st| st.rollout.as_ref()).and_then(|r| r.current_revision.clone());
    let Some(current) = current else {
        return Err(Error::NotFound(format!(
            "no revision of Scheduler {name} ran attached everywhere yet: there is nothing to go back to (the nodes it reached run the kernel's default scheduler)"
        )));
    };
    let Some(fields) = current.spec.as_ref() else {
        return Err(Error::NotFound(format!(
            "revision {} of Scheduler {name} was recorded by a sked without its fields: set the spec back by hand (image {})",
            current.name, current.image
        )));
    };
    let resolved = s.status.as_ref().and_then(|st| st.resolved_image.as_deref());
    let same_image = s.spec.sched == current.image || resolved == Some(current.image.as_str());
    if same_image && RevisionSpec::of(&s.spec) == *fields {
        println!(
            "scheduler.sked.schedkit.io/{name} already asks for revision {}, the last that ran attached everywhere",
            current.name
        );
        return Ok(());
    }
    s.spec = fields.applied_to(&s.spec, &current.image);
    s.status = None;
    cluster
        .schedulers()
        .replace(name, &PostParams::default(), &s)
        .await
        .map_err(|e| Error::api(format!("updating Scheduler {name}"), e))?;
    println!("scheduler.sked.schedkit.io/{name} set back to revision {} ({})", current.name, current.image);
    Ok(())
}
