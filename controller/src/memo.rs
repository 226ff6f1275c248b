//! What the controller remembers of its own writes, so it neither repeats a write nor trusts a
//! cache that has not caught up with it.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::ResourceExt;

use crate::api::{Scheduler, SchedulerStatus};
use crate::sync::lock;

/// Per-Scheduler memory of the last writes, dropped when a Scheduler is deleted.
#[derive(Default)]
pub(crate) struct Memo {
    /// The status last written, per Scheduler uid: newer than a cache that may lag behind.
    pub(crate) written: Mutex<HashMap<String, SchedulerStatus>>,
    /// Generation of the DaemonSet last applied, per Scheduler (to log real changes at info).
    pub(crate) applied: Mutex<HashMap<String, i64>>,
}

impl Memo {
    /// Forgets everything (a new leadership term).
    pub(crate) fn clear(&self) {
        lock(&self.written).clear();
        lock(&self.applied).clear();
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
