//! Leader election on a Lease (kube-lease-manager). Leadership is a `watch` channel that gates
//! writes: the reconcile loop checks it before every write and abandons a reconcile in flight
//! when it turns false; webhook and reports servers run on every replica.
//!
//! The lease manager's own channel is held here alone and forwarded, so stepping down is in this
//! replica's hands: [`Leadership::step_down`] first tells every reader "not leading", then drops
//! the manager's channel, which makes the manager clear the Lease's holder so a standby takes
//! over at once instead of after the lease expires.

use std::sync::Mutex;
use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::mutex::lock;

/// How long stepping down waits for the Lease to be released.
const RELEASE_WITHIN: Duration = Duration::from_secs(2);

/// This replica's leadership.
pub struct Leadership {
    /// Whether this replica leads; clone it for every reader.
    pub rx: watch::Receiver<bool>,
    tx: watch::Sender<bool>,
    /// Forwards the lease manager's channel (the only holder of it) into `tx`.
    forward: Mutex<Option<JoinHandle<()>>>,
    /// The lease manager's task: it releases the Lease when its channel closes.
    task: Mutex<Option<JoinHandle<kube_lease_manager::Result<LeaseManager>>>>,
}

impl Leadership {
    /// Leader from the start (no election: a single replica, or tests). `on_gain` runs once,
    /// before any reader sees `true`.
    pub fn always(on_gain: impl Fn()) -> Self {
        on_gain();
        let (tx, rx) = watch::channel(true);
        Self { rx, tx, forward: Mutex::new(None), task: Mutex::new(None) }
    }

    /// Campaigns for the Lease `name` in `namespace` as `identity`. `on_gain` runs each time
    /// leadership is gained, before any reader sees `true`: what a term starts from is in place
    /// before the first reconcile or report stream of that term.
    pub async fn elect(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        lease_duration: Duration,
        renew_grace: Duration,
        on_gain: impl Fn() + Send + 'static,
    ) -> kube_lease_manager::Result<Self> {
        let manager = LeaseManagerBuilder::new(client, name)
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(lease_duration.as_secs().max(2))
            .with_grace(renew_grace.as_secs().max(1))
            .with_field_manager(format!("sked-leader-{identity}"))
            .build()
            .await?;
        let (mut manager_rx, task) = manager.watch().await;
        let leading = *manager_rx.borrow_and_update();
        if leading {
            on_gain();
        }
        let (tx, rx) = watch::channel(leading);
        let forward_tx = tx.clone();
        let forward = tokio::spawn(async move {
            let mut was = leading;
            while manager_rx.changed().await.is_ok() {
                let leading = *manager_rx.borrow_and_update();
                if leading && !was {
                    on_gain();
                }
                was = leading;
                forward_tx.send_replace(leading);
            }
            forward_tx.send_replace(false);
        });
        info!(lease = %format!("{namespace}/{name}"), %identity, "campaigning for leadership");
        Ok(Self { rx, tx, forward: Mutex::new(Some(forward)), task: Mutex::new(Some(task)) })
    }

    pub fn is_leader(&self) -> bool {
        *self.rx.borrow()
    }

    /// Stops leading now: every reader sees `false` (writes stop, reconciles in flight are
    /// abandoned, the report streams of agents that reach the leader alone close), then the
    /// Lease is released so another replica takes over at once. Waits at most two seconds for
    /// the release; the lease expires on its own otherwise. Calling it again does nothing.
    pub async fn step_down(&self) {
        let forward = lock(&self.forward).take();
        if let Some(forward) = forward {
            // Stop the forwarder first (it could otherwise forward a late `true`); dropping it
            // drops the manager's only receiver, so the manager releases the Lease.
            forward.abort();
            let _ = forward.await;
        }
        self.tx.send_replace(false);
        let task = lock(&self.task).take();
        if let Some(task) = task {
            match tokio::time::timeout(RELEASE_WITHIN, task).await {
                Ok(Ok(Ok(_))) => info!("released the leader lease"),
                Ok(Ok(Err(e))) => warn!(err = %e, "could not release the leader lease; it expires on its own"),
                _ => warn!("the leader lease was not released in time; it expires on its own"),
            }
        }
    }
}

/// Resolves once `leader` is false (or its sender is gone).
pub async fn lost(mut leader: watch::Receiver<bool>) {
    let _ = leader.wait_for(|leading| !*leading).await;
}
