//! What the controller remembers of its own writes, so it neither repeats a write nor trusts a
//! cache that has not caught up with it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::ResourceExt;

use crate::api::{Scheduler, SchedulerStatus};
use crate::mutex::lock;
use crate::trust::Admitted;

pub(crate) use sked_core::plan::{Applied, SentCondition};

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
    /// The owner labels and pod deletions this term wrote that the watches may not show yet.
    pub(crate) expectations: crate::expectations::Expectations,
    /// Per Scheduler, the pod conditions this term wrote that the pod watch has not shown yet,
    /// by pod uid: each with what the pod carried when it was written.
    pub(crate) pod_conditions: Mutex<HashMap<String, HashMap<String, SentCondition>>>,
}

impl Default for Memo {
    fn default() -> Self {
        Self {
            term_started: Mutex::new(Instant::now()),
            written: Mutex::default(),
            applied: Mutex::default(),
            admissions: Mutex::default(),
            recorded_ejections: Mutex::default(),
            recorded_exits: Mutex::default(),
            expectations: Default::default(),
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
        self.expectations.clear();
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

    /// The status this term last wrote for the Scheduler `uid` (what its echo carries).
    pub(crate) fn written_status(&self, uid: &str) -> Option<SchedulerStatus> {
        lock(&self.written).get(uid).cloned()
    }

    /// The KernelAttached condition this term wrote on the pod `uid` of `scheduler` that the pod
    /// watch has not shown yet, with what the pod carried then.
    pub(crate) fn sent_condition(&self, scheduler: &str, uid: &str) -> Option<SentCondition> {
        lock(&self.pod_conditions).get(scheduler)?.get(uid).cloned()
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
