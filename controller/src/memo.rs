//! What the controller remembers of its own writes, so it neither repeats a write nor trusts a
//! cache that has not caught up with it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::ResourceExt;

use crate::api::{Scheduler, SchedulerStatus};
use crate::sync::lock;

/// Per-Scheduler memory of the last writes, dropped when a Scheduler is deleted, and when this
/// leadership term began.
pub(crate) struct Memo {
    /// When the current leadership term began.
    term_started: Mutex<Instant>,
    /// The status last written, per Scheduler uid: newer than a cache that may lag behind.
    pub(crate) written: Mutex<HashMap<String, SchedulerStatus>>,
    /// Generation of the DaemonSet last applied, per Scheduler (to log real changes at info).
    pub(crate) applied: Mutex<HashMap<String, i64>>,
}

impl Default for Memo {
    fn default() -> Self {
        Self { term_started: Mutex::new(Instant::now()), written: Mutex::default(), applied: Mutex::default() }
    }
}

impl Memo {
    /// Starts a new leadership term: forgets everything written in earlier ones.
    pub(crate) fn new_term(&self) {
        *lock(&self.term_started) = Instant::now();
        lock(&self.written).clear();
        lock(&self.applied).clear();
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
        lock(&self.applied).retain(|name, _| names.contains(name));
    }

    pub(crate) fn forget(&self, scheduler: &Scheduler) {
        if let Some(uid) = scheduler.uid() {
            lock(&self.written).remove(&uid);
        }
        lock(&self.applied).remove(&scheduler.name_any());
    }
}
