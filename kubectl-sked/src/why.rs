//! `kubectl sked why SCHEDULER`: why its last revision failed, with what the kernel and the
//! scheduler said last on the node where it did (`status.rollout.failed` and its evidence).

use std::io::Write;

use kube::ResourceExt;
use sked_api::{RolloutFailure, Scheduler};

use crate::cluster::Cluster;
use crate::error::{Error, Result};

/// Prints why the Scheduler `name`'s last revision failed.
pub async fn why(cluster: &Cluster, name: &str) -> Result<()> {
    let scheduler = cluster.scheduler(name).await?;
    let text = crate::rollout::name_pods(cluster, &scheduler, explain(&scheduler)).await;
    std::io::stdout().lock().write_all(text.as_bytes()).map_err(|e| Error::Other(e.to_string()))
}

/// The explanation, as printed.
pub fn explain(scheduler: &Scheduler) -> String {
    let name = scheduler.name_any();
    let rollout = scheduler.status.as_ref().and_then(|st| st.rollout.as_ref());
    let Some(failed) = rollout.and_then(|r| r.failed.as_ref()) else {
        let phase = rollout.map_or("not rolled out yet", |r| r.phase.as_str());
        return format!("Scheduler {name} has no failed revision (phase {phase}).\n");
    };
    failure_text(&name, failed)
}

fn failure_text(name: &str, f: &RolloutFailure) -> String {
    let mut out = format!(
        "Scheduler {name}: revision {} (generation {}) failed on node {} at {}{}.\n\nCause: {}\n",
        f.revision,
        f.generation,
        f.node,
        f.time.0,
        f.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default(),
        f.cause
    );
    let evidence = f.evidence.as_ref();
    match evidence.and_then(|e| e.kernel_exit.as_ref()) {
        Some(exit) => {
            out.push_str(&format!("\nKernel: {}\n", exit.describe()));
            for line in &exit.trace {
                out.push_str(&format!("    {line}\n"));
            }
        }
        None => out.push_str("\nKernel: no exit of the scheduler in the node's kernel log.\n"),
    }
    match evidence.and_then(|e| e.scheduler_exit.as_ref()) {
        Some(words) => out.push_str(&format!("\nScheduler container: {words}\n")),
        None => out.push_str("\nScheduler container: it did not end (or its kubelet did not say how).\n"),
    }
    if let Some(stats) = evidence.and_then(|e| e.scheduler_stats.as_ref()) {
        out.push_str(&format!("\nScheduler statistics (its last scx_stats reply): {stats}\n"));
    }
    out.push_str(&format!(
        "\nThe revision is not tried again until the spec changes: fix it, or `kubectl sked rollout retry {name}`.\n"
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use sked_api::{FailureEvidence, KernelExit, RolloutStatus, SchedulerSpec, SchedulerStatus};

    fn failed(evidence: Option<FailureEvidence>) -> Scheduler {
        let mut s = Scheduler::new("bpfland", SchedulerSpec::default());
        s.status = Some(SchedulerStatus {
            rollout: Some(RolloutStatus {
                phase: sked_api::RolloutPhase::RolledBack,
                failed: Some(RolloutFailure {
                    revision: "5f0c2a9e1b".into(),
                    generation: 3,
                    node: "node-7".into(),
                    cause: "the scheduler stopped running after it had attached".into(),
                    time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                    reason: None,
                    evidence,
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        s
    }

    #[test]
    fn the_kernel_s_words_its_backtrace_and_the_scheduler_s_last_words() {
        let exit = KernelExit {
            node: "node-7".into(),
            ops: "bpfland_1.1.4".into(),
            reason: "runnable task stall".into(),
            detail: "kworker/1:2[91] failed to run for 31.004s".into(),
            time: "1970-01-01T00:00:00.000Z".into(),
            ejected: true,
            restart: false,
            trace: vec!["scx_watchdog_workfn+0x15b/0x1f0".into()],
        };
        let evidence = FailureEvidence::of(
            Some(exit),
            Some("exit code 1: Error: EXIT: runnable task stall".into()),
            Some(r#"{"nr_running":3}"#.into()),
        );
        let text = explain(&failed(evidence));
        assert!(
            text.starts_with("Scheduler bpfland: revision 5f0c2a9e1b (generation 3) failed on node node-7"),
            "{text}"
        );
        assert!(text.contains("Kernel: the kernel ejected bpfland_1.1.4 at 1970-01-01T00:00:00.000Z (runnable task stall: kworker/1:2[91] failed to run for 31.004s)\n    scx_watchdog_workfn+0x15b/0x1f0\n"), "{text}");
        assert!(text.contains("Scheduler container: exit code 1: Error: EXIT: runnable task stall"), "{text}");
        assert!(text.contains("Scheduler statistics (its last scx_stats reply): {\"nr_running\":3}"), "{text}");
        assert!(text.contains("kubectl sked rollout retry bpfland"), "{text}");
    }

    #[test]
    fn without_evidence_or_failure_it_says_so() {
        let text = explain(&failed(None));
        assert!(
            text.contains("Kernel: no exit of the scheduler") && text.contains("Scheduler container: it did not end"),
            "{text}"
        );
        let fine = Scheduler::new("ok", SchedulerSpec::default());
        assert_eq!(explain(&fine), "Scheduler ok has no failed revision (phase not rolled out yet).\n");
    }
}
