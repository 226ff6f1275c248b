//! The one `Context` every reconcile shares: the client, flags, index, kernel table, memo,
//! limiter and leadership. Its own module so the reconcile and the parts it calls (pod
//! conditions) both import it from below.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::Client;
use kube::runtime::events::Recorder;

use crate::config::ControllerFlags;
use crate::index::Index;
use crate::kernel_table::KernelTable;
use crate::memo::Memo;
use crate::metrics::{Metrics, ReportStats};
use crate::throttle::TokenBucket;
use crate::trust::Trust;
use sked_core::workload::WorkloadSettings;

/// State shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub flags: ControllerFlags,
    pub settings: WorkloadSettings,
    /// The Schedulers and their placements.
    pub(crate) index: Index,
    pub(crate) recorder: Recorder,
    pub(crate) limiter: TokenBucket,
    pub(crate) memo: Arc<Memo>,
    /// Consecutive failures per Scheduler, for the retry delay.
    pub(crate) failures: Mutex<HashMap<String, u32>>,
    /// Latest kernel report per node.
    pub kernel: Arc<KernelTable>,
    pub report_stats: Arc<ReportStats>,
    /// Whether this replica leads; every write checks it.
    pub(crate) leader: crate::leader::Leader,
    pub metrics: Arc<Metrics>,
    /// Decides which images may run and resolves them to digests.
    pub trust: Arc<Trust>,
    /// Whose canary runs, across Schedulers (`--max-concurrent-canaries`).
    pub(crate) canaries: crate::canaries::Canaries,
}

impl Context {
    /// Writes are allowed only while this replica holds the leader lease.
    pub(crate) fn leading(&self) -> bool {
        self.leader.leading()
    }
}
