//! What the controller remembers of its own writes, so it neither repeats a write nor trusts a
//! cache that has not caught up with it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::ResourceExt;

use crate::api::{Scheduler, SchedulerStatus};
use crate::mutex::lock;
use crate::trust::Admitted;
use sked_core::pods::KernelCondition;

/// A DaemonSet as this controller last applied it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Applied {
    /// Digest of the object sent (`workload::applied_digest`).
    pub(crate) hash: String,
    /// The `metadata.generation` the API server gave it.
    pub(crate) generation: i64,
}

/// An image admission kept for one Scheduler, with what it was decided from.
#[derive(Clone, Debug)]
pub(crate) struct Admission {
    /// The Scheduler's name, to reconcile it when a recheck of its tag changes what is admitted.
    pub(crate) name: String,
    /// `spec.sched`, the pull secrets' names and the trust policy generation it was decided under.
    pub(crate) inputs: (String, Vec<String>, u64),
    pub(crate) admitted: Admitted,
    /// When to ask the registry again (a tag may move; `tag_recheck` does, apart from the
    /// reconciles); `None` for a digest, which cannot.
    pub(crate) recheck_at: Option<Instant>,
}

/// Per-Scheduler memory of the last writes, dropped when a Scheduler is deleted, and when this
/// leadership term began.
pub(crate) struct Memo {
    /// When the current leadership term began.
    term_started: Mutex<Instant>,
    /// The status last written, per Scheduler uid: newer than a cache that may lag behind.
    pub(crate) written: Mutex<HashMap<String, SchedulerStatus>>,
    /// The DaemonSet last applied, per Scheduler: an unchanged one is not applied again.
    pub(crate) applied: Mutex<HashMap<String, Applied>>,
    /// The last admission of each Scheduler's image, per Scheduler uid: reused until its inputs
    /// change or a tag is due to be resolved again. Kept across leadership terms.
    pub(crate) admissions: Mutex<HashMap<String, Admission>>,
    /// Per Scheduler uid, the ejections (`node@time`) the events show recorded, read once a term.
    pub(crate) recorded_ejections: Mutex<HashMap<String, std::collections::HashSet<String>>>,
    /// The ejections (`node@time`) whose KernelEjected event this term recorded, or found
    /// recorded: each is recorded once however often its node reports it again.
    recorded_exits: Mutex<std::collections::HashSet<String>>,
    /// When this term set each node's owner label: until its pod appears (or the attach timeout
    /// passes) the node counts as switching, so the next wave does not start before it.
    pub(crate) labelled: Mutex<HashMap<String, Instant>>,
    /// Per Scheduler, the pod conditions this term wrote that the pod watch has not shown yet,
    /// by pod uid: each with what the pod carried when it was written.
    pub(crate) pod_conditions: Mutex<HashMap<String, HashMap<String, SentCondition>>>,
}

/// A pod condition written, and what the pod carried then.
pub(crate) type SentCondition = (KernelCondition, Option<KernelCondition>);

impl Default for Memo {
    fn default() -> Self {
        Self {
            term_started: Mutex::new(Instant::now()),
            written: Mutex::default(),
            applied: Mutex::default(),
            admissions: Mutex::default(),
            recorded_ejections: Mutex::default(),
            recorded_exits: Mutex::default(),
            labelled: Mutex::default(),
            pod_conditions: Mutex::default(),
        }
    }
}

impl Memo {
    /// Starts a new leadership term: forgets everything written in earlier ones.
    pub(crate) fn new_term(&self) {
        *lock(&self.term_started) = Instant::now();
        lock(&self.written).clear();
        lock(&self.applied).clear();
        lock(&self.recorded_ejections).clear();
        lock(&self.recorded_exits).clear();
        lock(&self.labelled).clear();
        lock(&self.pod_conditions).clear();
    }

    /// Remembers that the events of `exits` are out (or were found out already).
    pub(crate) fn exits_recorded(&self, exits: &[crate::api::KernelExit]) {
        lock(&self.recorded_exits).extend(exits.iter().map(|e| crate::kernel_table::ejection_key(&e.node, &e.time)));
    }

    /// Whether this term recorded (or found recorded) the event of `exit`.
    pub(crate) fn exit_recorded(&self, exit: &crate::api::KernelExit) -> bool {
        lock(&self.recorded_exits).contains(&crate::kernel_table::ejection_key(&exit.node, &exit.time))
    }

    /// How long the current term has lasted.
    pub(crate) fn term_age(&self) -> Duration {
        lock(&self.term_started).elapsed()
    }

    /// Keeps only what concerns `live` Schedulers (after a relist, which shows no deletions).
    pub(crate) fn retain_live(&self, live: &[Scheduler]) {
        let uids: std::collections::HashSet<String> = live.iter().filter_map(ResourceExt::uid).collect();
        let names: std::collections::HashSet<String> = live.iter().map(ResourceExt::name_any).collect();
        lock(&self.written).retain(|uid, _| uids.contains(uid));
        lock(&self.admissions).retain(|uid, _| uids.contains(uid));
        lock(&self.recorded_ejections).retain(|uid, _| uids.contains(uid));
        lock(&self.applied).retain(|name, _| names.contains(name));
    }

    /// Whether `scheduler` is what this term's last status write left it: the status written,
    /// observing the generation it has. Its watch event is then the echo of that write and
    /// tells a reconcile nothing new (a spec change moves the generation; anyone else's status
    /// write differs from ours).
    pub(crate) fn is_own_status_echo(&self, scheduler: &Scheduler) -> bool {
        let (Some(uid), Some(status)) = (scheduler.uid(), scheduler.status.as_ref()) else { return false };
        if status.observed_generation.is_none() || status.observed_generation != scheduler.metadata.generation {
            return false;
        }
        // Compared as written on the wire: the API server keeps times to the second.
        let written = lock(&self.written).get(&uid).map(serde_json::to_value);
        matches!(written, Some(Ok(w)) if serde_json::to_value(status).is_ok_and(|s| s == w))
    }

    /// Whether `condition` on the pod `uid` of `scheduler` is the one this term wrote there and
    /// the pod watch had not shown yet: the echo of that write.
    pub(crate) fn is_own_pod_condition(&self, scheduler: &str, uid: &str, condition: Option<&KernelCondition>) -> bool {
        let sent = lock(&self.pod_conditions);
        let written = sent.get(scheduler).and_then(|s| s.get(uid)).map(|(c, _)| c);
        written.is_some() && written == condition
    }

    pub(crate) fn forget(&self, scheduler: &Scheduler) {
        if let Some(uid) = scheduler.uid() {
            lock(&self.written).remove(&uid);
            lock(&self.admissions).remove(&uid);
            lock(&self.recorded_ejections).remove(&uid);
        }
        lock(&self.applied).remove(&scheduler.name_any());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scheduler(generation: i64, observed: i64, phase_message: &str) -> Scheduler {
        let mut s: Scheduler = serde_json::from_value(serde_json::json!({
            "apiVersion": "sked.schedkit.io/v1",
            "kind": "Scheduler",
            "metadata": {"name": "a", "uid": "u-1", "generation": generation},
            "spec": {"sched": "r.io/s@sha256:00"},
        }))
        .expect("a valid Scheduler");
        s.status = Some(SchedulerStatus {
            observed_generation: Some(observed),
            kernel_attached_summary: Some(phase_message.to_owned()),
            ..SchedulerStatus::default()
        });
        s
    }

    #[test]
    fn only_the_scheduler_as_its_own_last_write_left_it_is_an_echo() {
        let memo = Memo::default();
        let written = scheduler(2, 2, "1/1");
        assert!(!memo.is_own_status_echo(&written), "nothing written yet");
        lock(&memo.written).insert("u-1".into(), written.status.clone().unwrap_or_default());
        assert!(memo.is_own_status_echo(&written));
        // The spec changed since (the generation moved on): not an echo.
        assert!(!memo.is_own_status_echo(&scheduler(3, 2, "1/1")));
        // Someone else's status: not an echo.
        assert!(!memo.is_own_status_echo(&scheduler(2, 2, "0/1")));
        // The API server keeps times to the second: what comes back is still the echo.
        let mut precise = written.status.clone().unwrap_or_default();
        precise.conditions = vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "Ready".into(),
            message: String::new(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_millisecond(1_700_000_000_123).unwrap_or_default(),
            ),
            observed_generation: Some(2),
        }];
        lock(&memo.written).insert("u-1".into(), precise.clone());
        let echoed: SchedulerStatus =
            serde_json::from_value(serde_json::to_value(&precise).unwrap_or_default()).unwrap_or_default();
        assert_ne!(echoed, precise, "the wire drops the milliseconds");
        assert!(memo.is_own_status_echo(&Scheduler { status: Some(echoed), ..written.clone() }));
        // A new term remembers no write.
        memo.new_term();
        assert!(!memo.is_own_status_echo(&written));
    }

    #[test]
    fn a_pod_condition_is_an_echo_only_while_it_is_the_one_sent() {
        let memo = Memo::default();
        let sent =
            KernelCondition { status: "True".into(), reason: "KernelAttached".into(), message: "m".into(), since: 7 };
        assert!(!memo.is_own_pod_condition("a", "p-1", Some(&sent)));
        lock(&memo.pod_conditions).entry("a".into()).or_default().insert("p-1".into(), (sent.clone(), None));
        assert!(memo.is_own_pod_condition("a", "p-1", Some(&sent)));
        let other = KernelCondition { status: "False".into(), ..sent.clone() };
        assert!(!memo.is_own_pod_condition("a", "p-1", Some(&other)));
        assert!(!memo.is_own_pod_condition("a", "p-1", None));
        assert!(!memo.is_own_pod_condition("a", "p-2", Some(&sent)));
        assert!(!memo.is_own_pod_condition("b", "p-1", Some(&sent)));
    }
}
