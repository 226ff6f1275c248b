//! Which watch events are the echo of a reconcile's own writes: they tell the next reconcile
//! nothing, so the index wakes none for them (a reconcile, and a rate-limit token, spent on
//! nothing, and the next real change waiting behind it). The controller's memory of its writes
//! is the data; these are the rules.

use kube_core::ResourceExt;
use sked_api::{Scheduler, SchedulerStatus};

use super::SentCondition;
use crate::pods::SchedulerPod;

/// Whether `now`, the Scheduler the watch shows after `before`, is what this term's last status
/// write (`written`) left it: only its status moved, to the status written, observing the
/// generation it has. A spec change moves the generation; anyone else's status write differs
/// from ours; an annotation, a label or a finalizer is never an echo.
pub fn status_echo(before: &Scheduler, now: &Scheduler, written: Option<&SchedulerStatus>) -> bool {
    only_status_moved(before, now) && is_written_status(now, written)
}

/// Whether `after` differs from `before` in its status alone (and the bookkeeping every write
/// moves: resourceVersion, managedFields).
fn only_status_moved(before: &Scheduler, after: &Scheduler) -> bool {
    let (b, a) = (&before.metadata, &after.metadata);
    before.spec == after.spec
        && b.generation == a.generation
        && b.labels == a.labels
        && b.annotations == a.annotations
        && b.finalizers == a.finalizers
        && b.owner_references == a.owner_references
        && b.deletion_timestamp == a.deletion_timestamp
}

/// Whether the status `scheduler` carries is `written`, observing its generation.
fn is_written_status(scheduler: &Scheduler, written: Option<&SchedulerStatus>) -> bool {
    let (Some(_), Some(status), Some(written)) = (scheduler.uid(), scheduler.status.as_ref(), written) else {
        return false;
    };
    if status.observed_generation.is_none() || status.observed_generation != scheduler.metadata.generation {
        return false;
    }
    // Compared as written on the wire: the API server keeps times to the second.
    matches!((serde_json::to_value(written), serde_json::to_value(status)), (Ok(w), Ok(s)) if w == s)
}

/// Whether the one change from `before` to `now` is the KernelAttached condition this term
/// wrote on the pod and the pod watch had not shown yet (`sent`).
pub fn condition_echo(before: &SchedulerPod, now: &SchedulerPod, sent: Option<&SentCondition>) -> bool {
    let otherwise_same = SchedulerPod { kernel: before.kernel.clone(), ..now.clone() } == *before;
    let written = sent.map(|(condition, _)| condition);
    otherwise_same && written.is_some() && written == now.kernel.as_ref()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    use super::*;
    use crate::pods::KernelCondition;

    fn scheduler(generation: i64, observed: i64, summary: &str) -> Scheduler {
        let mut s: Scheduler = serde_json::from_value(serde_json::json!({
            "apiVersion": "sked.schedkit.io/v1",
            "kind": "Scheduler",
            "metadata": {"name": "a", "uid": "u-1", "generation": generation, "resourceVersion": "1"},
            "spec": {"sched": "r.io/s@sha256:00"},
        }))
        .unwrap_or_else(|e| panic!("a valid Scheduler: {e}"));
        s.status = Some(SchedulerStatus {
            observed_generation: Some(observed),
            kernel_attached_summary: Some(summary.to_owned()),
            ..SchedulerStatus::default()
        });
        s
    }

    #[test]
    fn only_the_scheduler_as_its_own_last_write_left_it_is_an_echo() {
        let before = Scheduler { status: None, ..scheduler(2, 2, "1/1") };
        let written = scheduler(2, 2, "1/1");
        let status = written.status.clone().unwrap_or_default();
        assert!(!status_echo(&before, &written, None), "nothing written yet");
        assert!(status_echo(&before, &written, Some(&status)));
        // The spec changed since (the generation moved on): not an echo.
        assert!(!status_echo(&before, &scheduler(3, 2, "1/1"), Some(&status)));
        // Someone else's status: not an echo.
        assert!(!status_echo(&before, &scheduler(2, 2, "0/1"), Some(&status)));
        // An annotation, or a spec change, with the status written: reconciled.
        let mut annotated = written.clone();
        annotated.metadata.annotations = Some([("poke".to_owned(), "1".to_owned())].into());
        assert!(!status_echo(&before, &annotated, Some(&status)), "an annotation is reconciled");
        let mut respecced = written.clone();
        respecced.spec.args = vec!["--x".into()];
        assert!(!status_echo(&before, &respecced, Some(&status)));
    }

    #[test]
    fn the_status_is_compared_as_the_wire_keeps_it() {
        let mut precise = SchedulerStatus { observed_generation: Some(2), ..SchedulerStatus::default() };
        precise.conditions = vec![Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "Ready".into(),
            message: String::new(),
            last_transition_time: Time(jiff::Timestamp::from_millisecond(1_700_000_000_123).unwrap_or_default()),
            observed_generation: Some(2),
        }];
        let echoed: SchedulerStatus =
            serde_json::from_value(serde_json::to_value(&precise).unwrap_or_default()).unwrap_or_default();
        assert_ne!(echoed, precise, "the wire drops the milliseconds");
        let before = Scheduler { status: None, ..scheduler(2, 2, "") };
        let now = Scheduler { status: Some(echoed), ..before.clone() };
        assert!(status_echo(&before, &now, Some(&precise)));
    }

    #[test]
    fn only_the_condition_this_term_wrote_is_an_echo() {
        let pod = |ready: Option<i64>, kernel: Option<&str>| SchedulerPod {
            ready_since: ready,
            kernel: kernel.map(|status| KernelCondition {
                status: status.into(),
                reason: "KernelAttached".into(),
                message: "m".into(),
                since: 7,
            }),
            ..crate::test_objects::pod("a-x")
        };
        let (before, after) = (pod(Some(1), None), pod(Some(1), Some("True")));
        assert!(!condition_echo(&before, &after, None), "not written by this term");
        let sent = (after.kernel.clone().unwrap_or_else(|| panic!("set above")), None);
        assert!(condition_echo(&before, &after, Some(&sent)));
        // Another fact changed with it (Ready): the reconcile has something to look at.
        assert!(!condition_echo(&before, &pod(None, Some("True")), Some(&sent)));
        // A condition someone else set is no echo.
        assert!(!condition_echo(&before, &pod(Some(1), Some("False")), Some(&sent)));
    }
}
