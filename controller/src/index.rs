//! The arbiter's view of the cluster, kept current by its own watches of Schedulers and Nodes
//! (metadata only); every Scheduler whose placement moves is triggered for a reconcile.

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::core::v1::Node;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use tokio::sync::watch;
use tracing::warn;

use crate::api::Scheduler;
use crate::arbiter::{Arbiter, Changed, Claim};
use crate::memo::Memo;
use crate::metrics::Metrics;
use crate::sync::lock;

fn claim_of(s: &Scheduler) -> Claim {
    Claim {
        name: s.name_any(),
        uid: s.uid().unwrap_or_default(),
        created: s.creation_timestamp().map_or(0, |t| t.0.as_second()),
        generation: s.metadata.generation.unwrap_or(0),
        selector: s.spec.node_selector.clone(),
    }
}

fn trigger(tx: &UnboundedSender<ObjectRef<Scheduler>>, changed: Changed) {
    for name in changed {
        let _ = tx.unbounded_send(ObjectRef::new(&name));
    }
}

/// Drives the arbiter from one watch: a relist replaces the whole set at once, single events
/// apply one by one; every Scheduler whose placement moved is triggered. `ready` turns true
/// after the first full list.
async fn feed_arbiter<K, S>(
    what: &str,
    events: S,
    tx: UnboundedSender<ObjectRef<Scheduler>>,
    ready: watch::Sender<bool>,
    mut relisted: impl FnMut(Vec<K>) -> Changed,
    mut applied: impl FnMut(K) -> Changed,
    mut deleted: impl FnMut(K) -> Changed,
) where
    S: futures::Stream<Item = Result<Event<K>, watcher::Error>>,
{
    let mut relist: Vec<K> = Vec::new();
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        let changed = match event {
            Ok(Event::Init) => {
                relist.clear();
                Changed::new()
            }
            Ok(Event::InitApply(obj)) => {
                relist.push(obj);
                Changed::new()
            }
            Ok(Event::InitDone) => {
                let changed = relisted(std::mem::take(&mut relist));
                let _ = ready.send(true);
                changed
            }
            Ok(Event::Apply(obj)) => applied(obj),
            Ok(Event::Delete(obj)) => deleted(obj),
            Err(e) => {
                warn!(err = %e, "{what} watch failed; retrying");
                Changed::new()
            }
        };
        trigger(&tx, changed);
    }
}

/// Feeds Scheduler selectors and ages into the arbiter.
pub(crate) async fn index_schedulers(
    api: Api<Scheduler>,
    arbiter: Arc<Mutex<Arbiter>>,
    memo: Arc<Memo>,
    metrics: Arc<Metrics>,
    tx: UnboundedSender<ObjectRef<Scheduler>>,
    ready: watch::Sender<bool>,
) {
    let events = watcher::watcher(api, watcher::Config::default()).default_backoff();
    feed_arbiter(
        "Scheduler",
        events,
        tx,
        ready,
        |all: Vec<Scheduler>| lock(&arbiter).replace_schedulers(all.iter().map(claim_of).collect()),
        |s| lock(&arbiter).upsert_scheduler(claim_of(&s)),
        |s| {
            memo.forget(&s);
            metrics.forget_scheduler(&s.name_any());
            lock(&arbiter).remove_scheduler(&s.name_any())
        },
    )
    .await;
}

/// Feeds Node labels (metadata only) into the arbiter.
pub(crate) async fn index_nodes(
    api: Api<PartialObjectMeta<Node>>,
    arbiter: Arc<Mutex<Arbiter>>,
    tx: UnboundedSender<ObjectRef<Scheduler>>,
    ready: watch::Sender<bool>,
) {
    let events = watcher::watcher(api, watcher::Config::default()).default_backoff();
    let labels = |n: PartialObjectMeta<Node>| (n.name_any(), n.metadata.labels.unwrap_or_default());
    feed_arbiter(
        "Node",
        events,
        tx,
        ready,
        |all| lock(&arbiter).replace_nodes(all.into_iter().map(labels).collect()),
        |n| {
            let (name, l) = labels(n);
            lock(&arbiter).upsert_node(&name, l)
        },
        |n| lock(&arbiter).remove_node(&n.name_any()),
    )
    .await;
}
