//! Leader election on a Lease (kube-lease-manager). Leadership is a `watch` channel that gates
//! writes: the reconcile loop checks it before every write and abandons a reconcile in flight
//! when it turns false; webhook and reports servers run on every replica.
//!
//! The lease manager's own channel is held here alone and forwarded, so stepping down is in this
//! replica's hands: [`Leadership::step_down`] first tells every reader "not leading", then drops
//! the manager's channel, which makes the manager clear the Lease's holder so a standby takes
//! over at once instead of after the lease expires.
//!
//! The channel says what the lease manager last concluded, which a frozen or starved process
//! does not revise until its next renewal fails: woken after its lease ran out (a SIGSTOP, a VM
//! paused, a long GC-like stall, an API server down past the lease), it would still say
//! "leading" while another replica leads. So every write also asks the [`Fence`]: this replica's
//! own Lease, watched, is valid until its last renewal plus the lease duration, less a margin;
//! past that, [`Leader::leading`] is false whatever the channel says, until a renewal is seen.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::mutex::lock;

/// How long stepping down waits for the Lease to be released.
const RELEASE_WITHIN: Duration = Duration::from_secs(2);

/// Until when this replica's Lease holds, as far as the renewals it saw say.
#[derive(Debug)]
pub struct Fence {
    /// Microseconds since the epoch.
    until: AtomicI64,
    /// Told each time the Lease is seen.
    renewed: tokio::sync::Notify,
}

impl Fence {
    /// A fence that always holds (no election).
    fn open() -> Self {
        Self { until: AtomicI64::new(i64::MAX), renewed: tokio::sync::Notify::new() }
    }

    fn closed() -> Self {
        Self { until: AtomicI64::new(0), renewed: tokio::sync::Notify::new() }
    }

    /// Whether the Lease still holds now.
    pub fn holds(&self) -> bool {
        jiff::Timestamp::now().as_microsecond() < self.until.load(Ordering::Acquire)
    }

    /// How long the Lease holds from now (zero once it ran out).
    fn left(&self) -> Duration {
        let left = self.until.load(Ordering::Acquire).saturating_sub(jiff::Timestamp::now().as_microsecond());
        Duration::from_micros(u64::try_from(left).unwrap_or(0))
    }

    /// Takes in the Lease as the API server shows it: held by `identity`, it holds until its
    /// renewal plus its duration, less `margin`; held by anyone else (or no one), not at all.
    pub fn saw(&self, lease: &Lease, identity: &str, margin: Duration) {
        let spec = lease.spec.as_ref();
        let ours = spec.and_then(|s| s.holder_identity.as_deref()) == Some(identity);
        let renewed = spec.and_then(|s| s.renew_time.as_ref().or(s.acquire_time.as_ref())).map(|t| t.0);
        let duration = spec.and_then(|s| s.lease_duration_seconds).map(|d| i64::from(d) * 1_000_000);
        let until = match (ours, renewed, duration) {
            (true, Some(renewed), Some(duration)) => renewed
                .as_microsecond()
                .saturating_add(duration)
                .saturating_sub(i64::try_from(margin.as_micros()).unwrap_or(i64::MAX)),
            _ => 0,
        };
        self.until.store(until, Ordering::Release);
    }
}

/// What a reader of leadership holds: the lease manager's word and the [`Fence`].
#[derive(Clone, Debug)]
pub struct Leader {
    rx: watch::Receiver<bool>,
    fence: Arc<Fence>,
}

impl Leader {
    /// Whether this replica may write now: the lease manager says it leads, and the Lease's
    /// last renewal it saw has not run out.
    pub fn leading(&self) -> bool {
        *self.rx.borrow() && self.fence.holds()
    }

    /// The lease manager's word alone, to wait for its changes.
    pub fn receiver(&self) -> watch::Receiver<bool> {
        self.rx.clone()
    }
}

/// This replica's leadership.
pub struct Leadership {
    /// Whether this replica leads, by the lease manager's word; [`Leadership::leader`] adds the
    /// fence for anything that writes.
    pub rx: watch::Receiver<bool>,
    fence: Arc<Fence>,
    tx: watch::Sender<bool>,
    /// Forwards the lease manager's channel (the only holder of it) into `tx`.
    forward: Mutex<Option<JoinHandle<()>>>,
    /// The lease manager's task: it releases the Lease when its channel closes.
    task: Mutex<Option<JoinHandle<kube_lease_manager::Result<LeaseManager>>>>,
    /// Follows this replica's own Lease into the fence.
    fence_task: Option<JoinHandle<()>>,
}

impl Leadership {
    /// Leader from the start (no election: a single replica, or tests). `on_gain` runs once,
    /// before any reader sees `true`.
    pub fn always(on_gain: impl Fn()) -> Self {
        on_gain();
        let (tx, rx) = watch::channel(true);
        let fence = Arc::new(Fence::open());
        Self { rx, fence, tx, forward: Mutex::new(None), task: Mutex::new(None), fence_task: None }
    }

    /// The handle every writer reads.
    pub fn leader(&self) -> Leader {
        Leader { rx: self.rx.clone(), fence: self.fence.clone() }
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
        let fence = Arc::new(Fence::closed());
        // Stop writing a little before the lease runs out (less than the renew grace, so a
        // renewal comes before the fence closes).
        let margin = Duration::from_secs(1).min(renew_grace / 2);
        let fence_task = follow_own_lease(client.clone(), namespace, name, identity, fence.clone(), margin);
        let manager = LeaseManagerBuilder::new(client, name)
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(lease_duration.as_secs().max(2))
            .with_grace(renew_grace.as_secs().max(1))
            .with_field_manager(format!("sked-leader-{identity}"))
            .build()
            .await?;
        let (manager_rx, task) = manager.watch().await;
        // Nobody leads before the forwarder says so: it runs `on_gain` first.
        let (tx, rx) = watch::channel(false);
        let forward = tokio::spawn(forward(manager_rx, fence.clone(), tx.clone(), on_gain));
        info!(lease = %format!("{namespace}/{name}"), %identity, "campaigning for leadership");
        Ok(Self {
            rx,
            fence,
            tx,
            forward: Mutex::new(Some(forward)),
            task: Mutex::new(Some(task)),
            fence_task: Some(fence_task),
        })
    }

    pub fn is_leader(&self) -> bool {
        self.leader().leading()
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

impl Drop for Leadership {
    fn drop(&mut self) {
        if let Some(task) = &self.fence_task {
            task.abort();
        }
    }
}

/// Forwards the lease manager's word, fenced, into `tx`: leading while the manager says so and
/// the fence holds; `on_gain` runs each time that begins, before any reader sees `true`. When
/// the fence closes (no renewal seen in time) readers see `false`, as a lost term: what it wrote
/// may be overtaken by another leader's writes.
async fn forward(
    mut manager: watch::Receiver<bool>,
    fence: Arc<Fence>,
    tx: watch::Sender<bool>,
    on_gain: impl Fn() + Send + 'static,
) {
    let mut was = false;
    let mut says = *manager.borrow_and_update();
    loop {
        let leading = says && fence.holds();
        if leading != was {
            if leading {
                on_gain();
            } else if says {
                warn!("no renewal of the leader Lease seen before it ran out: writes stop until one is");
            }
            was = leading;
            tx.send_replace(leading);
        }
        tokio::select! {
            changed = manager.changed() => match changed {
                Ok(()) => says = *manager.borrow_and_update(),
                Err(_) => break,
            },
            () = fence.renewed.notified() => {}
            () = tokio::time::sleep(fence.left()), if leading => {}
        }
    }
    tx.send_replace(false);
}

/// Watches the Lease `namespace/name` into `fence` for `identity`. A watch that fails is
/// retried with backoff; meanwhile the fence closes when the last renewal seen runs out.
fn follow_own_lease(
    client: Client,
    namespace: &str,
    name: &str,
    identity: &str,
    fence: Arc<Fence>,
    margin: Duration,
) -> JoinHandle<()> {
    let leases: Api<Lease> = Api::namespaced(client, namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let identity = identity.to_owned();
    tokio::spawn(async move {
        let mut leases = std::pin::pin!(watcher(leases, config).default_backoff().applied_objects());
        while let Some(next) = leases.next().await {
            match next {
                Ok(lease) => {
                    fence.saw(&lease, &identity, margin);
                    fence.renewed.notify_one();
                }
                Err(e) => debug!(err = %e, "watching the leader Lease; retried"),
            }
        }
    })
}

/// Resolves once `leader` does not lead: the lease manager says so, or the fence closed.
pub async fn lost(leader: Leader) {
    let mut rx = leader.rx.clone();
    while leader.leading() {
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            // Looked at again when the last renewal seen runs out (it may be renewed by then).
            () = tokio::time::sleep(leader.fence.left().max(Duration::from_millis(10))) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::*;

    fn lease(holder: &str, renewed_ago: Duration, duration: i32) -> Lease {
        let renewed = jiff::Timestamp::now() - jiff::SignedDuration::try_from(renewed_ago).unwrap_or_default();
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(renewed)),
                lease_duration_seconds: Some(duration),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        }
    }

    #[test]
    fn the_fence_holds_only_while_this_replicas_last_renewal_has_not_run_out() {
        let fence = Fence::closed();
        assert!(!fence.holds(), "nothing seen yet");
        let margin = Duration::from_secs(1);
        fence.saw(&lease("a-1", Duration::from_secs(2), 10), "a-1", margin);
        assert!(fence.holds(), "renewed 2 s ago, for 10 s");
        assert!(fence.left() > Duration::from_secs(6) && fence.left() <= Duration::from_secs(7), "{:?}", fence.left());
        // Frozen past the lease: the renewal seen last ran out (less the margin).
        fence.saw(&lease("a-1", Duration::from_millis(9_500), 10), "a-1", margin);
        assert!(!fence.holds(), "within the margin of running out");
        assert_eq!(fence.left(), Duration::ZERO);
        // Another replica holds it.
        fence.saw(&lease("b-1", Duration::ZERO, 10), "a-1", margin);
        assert!(!fence.holds());
    }

    #[tokio::test]
    async fn readers_see_not_leading_when_no_renewal_comes_in_time_and_leading_again_when_one_does() {
        let fence = Arc::new(Fence::closed());
        let (manager_tx, manager_rx) = watch::channel(true);
        let (tx, mut rx) = watch::channel(false);
        let gains = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = gains.clone();
        let task = tokio::spawn(forward(manager_rx, fence.clone(), tx, move || {
            counted.fetch_add(1, Ordering::SeqCst);
        }));
        // The manager says leading, but no renewal is seen: not leading.
        tokio::task::yield_now().await;
        assert!(!*rx.borrow());
        // A renewal that runs out 300 ms from now.
        fence.saw(&lease("a", Duration::from_millis(9_700), 10), "a", Duration::ZERO);
        fence.renewed.notify_one();
        rx.wait_for(|l| *l).await.ok();
        assert_eq!(gains.load(Ordering::SeqCst), 1, "the term begins once");
        // No renewal after it: readers are told, without any change from the manager.
        rx.wait_for(|l| !*l).await.ok();
        let leader = Leader { rx: rx.clone(), fence: fence.clone() };
        assert!(!leader.leading());
        // Renewed again: a new term.
        fence.saw(&lease("a", Duration::ZERO, 10), "a", Duration::ZERO);
        fence.renewed.notify_one();
        rx.wait_for(|l| *l).await.ok();
        assert!(leader.leading());
        assert_eq!(gains.load(Ordering::SeqCst), 2);
        drop(manager_tx);
        let _ = task.await;
        assert!(!*rx.borrow(), "the manager gone: not leading");
    }
}
