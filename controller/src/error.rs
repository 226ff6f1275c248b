//! The controller's errors: [`BoxError`] for startup and the servers, [`ReconcileError`] for a
//! reconcile (each variant a metric label).

use std::time::Duration;

pub use sked_logging::BoxError;

/// Why a reconcile failed. Each variant maps to a metric label.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("applying DaemonSet {namespace}/{name}: {source}")]
    ApplyDaemonSet { namespace: String, name: String, source: kube::Error },
    #[error("deleting DaemonSet {namespace}/{name}: {source}")]
    DeleteDaemonSet { namespace: String, name: String, source: kube::Error },
    #[error("writing status of Scheduler {name}: {source}")]
    WriteStatus { name: String, source: kube::Error },
    #[error(
        "reconciling Scheduler {name} took longer than --reconcile-timeout ({timeout:?}); it was cancelled and will be retried"
    )]
    Timeout { name: String, timeout: Duration },
    #[error(transparent)]
    Identity(#[from] sked_core::workload::MissingIdentity),
    #[error("image of Scheduler {name} refused: {source}")]
    Image { name: String, source: crate::trust::TrustError },
    #[error(
        "rolling Scheduler {name} back to revision {revision}: its fields are not in status.rollout.currentRevision (an older sked recorded it) and the DaemonSet's history (ControllerRevisions in {namespace}) no longer holds it; set spec back to that revision's image and args, or fix the failed one"
    )]
    RollbackLost { name: String, namespace: String, revision: String },
    /// The pass had to wait for its rate-limit token before its first write: `reconcile` waits
    /// and starts it over; it never ends a reconcile.
    #[error("waiting {0:?} for a reconcile rate-limit token before the first write")]
    Throttled(Duration),
}

impl From<crate::throttle::Throttled> for ReconcileError {
    fn from(t: crate::throttle::Throttled) -> Self {
        ReconcileError::Throttled(t.0)
    }
}

impl ReconcileError {
    /// Low-cardinality label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ReconcileError::ApplyDaemonSet { .. } => "apply_daemonset",
            ReconcileError::DeleteDaemonSet { .. } => "delete_daemonset",
            ReconcileError::WriteStatus { .. } => "write_status",
            ReconcileError::Timeout { .. } => "timeout",
            ReconcileError::Identity(_) => "identity",
            ReconcileError::Image { .. } => "image_verification",
            ReconcileError::RollbackLost { .. } => "rollback_lost",
            ReconcileError::Throttled(_) => "throttled",
        }
    }
}
