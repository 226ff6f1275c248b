//! Leader election on a Lease (kube-lease-manager). Leadership is a `watch` channel: the
//! reconcile loop runs only while it is `true`, and every write checks it, so losing the lease
//! stops writes at once. Webhook and reports servers run on every replica.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// This replica's leadership.
pub struct Leadership {
    pub rx: watch::Receiver<bool>,
    task: Option<JoinHandle<kube_lease_manager::Result<LeaseManager>>>,
    /// Keeps the channel open when there is no election.
    _always: Option<watch::Sender<bool>>,
}

impl Leadership {
    /// Leader from the start (no election: a single replica, or tests).
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(true);
        Self { rx, task: None, _always: Some(tx) }
    }

    /// Campaigns for the Lease `name` in `namespace` as `identity`.
    pub async fn elect(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        lease_duration: Duration,
        renew_grace: Duration,
    ) -> kube_lease_manager::Result<Self> {
        let manager = LeaseManagerBuilder::new(client, name)
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(lease_duration.as_secs().max(2))
            .with_grace(renew_grace.as_secs().max(1))
            .with_field_manager(format!("sked-leader-{identity}"))
            .build()
            .await?;
        let (rx, task) = manager.watch().await;
        info!(lease = %format!("{namespace}/{name}"), %identity, "campaigning for leadership");
        Ok(Self { rx, task: Some(task), _always: None })
    }

    pub fn is_leader(&self) -> bool {
        *self.rx.borrow()
    }

    /// Releases the Lease (so another replica takes over at once) and stops campaigning.
    pub async fn release(self) {
        let Self { rx, task, _always } = self;
        drop(rx);
        if let Some(task) = task {
            match tokio::time::timeout(Duration::from_secs(5), task).await {
                Ok(Ok(Ok(_))) => info!("released the leader lease"),
                Ok(Ok(Err(e))) => warn!(err = %e, "could not release the leader lease; it expires on its own"),
                _ => warn!("leader lease manager did not stop in time; the lease expires on its own"),
            }
        }
    }
}
