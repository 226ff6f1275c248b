//! Requests to reconcile a Scheduler, from the parts that see news of it (the indexes, the
//! reports server, a policy change, a tag recheck), for the reconcile loop. They are coalesced
//! by name: at most one is pending per Scheduler, so they are bounded by the number of
//! Schedulers whatever floods them, a sender never waits, and none is lost (a request made while
//! the same one is pending is already answered by it, as the reconcile reads the latest state).
//!
//! Hand-made: a bounded channel (futures', tokio's) would make the reports server wait for the
//! reconcile loop, or drop a request when full; an unbounded one grows with a flood of reports
//! while the loop is busy. kube-runtime's `reconcile_on` takes any stream, and its own queue
//! deduplicates only what it has already received.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use futures::Stream;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::Notify;

use crate::api::Scheduler;
use crate::mutex::lock;

/// The pending requests; clones share them.
#[derive(Clone, Default)]
pub struct Triggers(Arc<Pending>);

#[derive(Default)]
struct Pending {
    names: Mutex<BTreeSet<String>>,
    /// Holds a permit when a request came while no one waited (no wake-up is lost).
    added: Notify,
}

impl Triggers {
    /// Asks for a reconcile of the Scheduler `name`.
    pub fn send(&self, name: &str) {
        let added = lock(&self.0.names).insert(name.to_owned());
        if added {
            self.0.added.notify_one();
        }
    }

    /// How many requests are pending.
    pub fn pending(&self) -> usize {
        lock(&self.0.names).len()
    }

    /// The requests, each once, in name order when several are pending. One consumer.
    pub fn stream(&self) -> impl Stream<Item = ObjectRef<Scheduler>> + Send + 'static {
        futures::stream::unfold(self.clone(), |triggers| async move {
            loop {
                let next = lock(&triggers.0.names).pop_first();
                if let Some(name) = next {
                    return Some((ObjectRef::new(&name), triggers));
                }
                triggers.0.added.notified().await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    #[tokio::test]
    async fn a_flood_is_bounded_by_the_schedulers_and_loses_none() {
        let triggers = Triggers::default();
        for _ in 0..10_000 {
            triggers.send("b");
            triggers.send("a");
        }
        assert_eq!(triggers.pending(), 2, "one pending request per Scheduler");
        let mut stream = Box::pin(triggers.stream());
        let first: Vec<String> = stream.as_mut().take(2).map(|r| r.name).collect().await;
        assert_eq!(first, ["a", "b"]);
        // A request made while the consumer waits wakes it.
        let sender = triggers.clone();
        let waiting = tokio::spawn(async move { stream.next().await.map(|r| r.name) });
        tokio::task::yield_now().await;
        sender.send("c");
        assert_eq!(waiting.await.ok().flatten().as_deref(), Some("c"));
    }
}
