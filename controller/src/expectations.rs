//! What this leadership term wrote to nodes and pods that the watches may not show yet
//! (client-go's "expectations"): the owner labels it wrote, and the pods it deleted for a new
//! revision. Until a watch shows a write's effect, a reconcile counts it as done, so no reconcile
//! acts on a view older than this term's own last write. Every access goes through these
//! methods, each under one short lock; a new term starts with none.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::mutex::lock;

/// Past the longest attach timeout an entry tells nothing any more.
const FORGOTTEN_AFTER: Duration = Duration::from_secs(86_400);

/// An owner label this term wrote on a node.
#[derive(Clone, Debug)]
struct LabelWrite {
    /// The Scheduler it names.
    owner: String,
    at: Instant,
    /// The Node's resourceVersion the write made (the watch caught up once it shows one as new).
    version: Option<u64>,
}

/// A pod this term deleted for a new revision.
#[derive(Clone, Debug)]
struct PodReplaced {
    /// The Scheduler whose pod it was.
    scheduler: String,
    pod: String,
    at: Instant,
}

/// What one Scheduler's reconcile reads of this term's writes, by node.
#[derive(Clone, Debug, Default)]
pub(crate) struct Expected {
    /// How long ago its owner label was written, for nodes not seen attached since.
    pub(crate) labelled: HashMap<String, Duration>,
    /// The Node's resourceVersion that write made.
    pub(crate) label_versions: HashMap<String, u64>,
    /// The pod deleted there for a new revision, and how long ago.
    pub(crate) replaced: HashMap<String, (String, Duration)>,
}

#[derive(Default)]
pub(crate) struct Expectations {
    /// By node: the owner label written there.
    labels: Mutex<HashMap<String, LabelWrite>>,
    /// By node: the pod deleted there.
    replacements: Mutex<HashMap<String, PodReplaced>>,
}

impl Expectations {
    /// The owner label of `node` was written: to `owner`, or taken off (`None`), making
    /// resourceVersion `version`.
    pub(crate) fn label_written(&self, node: &str, owner: Option<&str>, version: Option<u64>) {
        let mut labels = lock(&self.labels);
        match owner {
            Some(owner) => {
                labels.retain(|_, w| w.at.elapsed() < FORGOTTEN_AFTER);
                labels.insert(node.to_owned(), LabelWrite { owner: owner.to_owned(), at: Instant::now(), version });
            }
            None => {
                labels.remove(node);
            }
        }
    }

    /// `nodes` run attached: when they were labelled tells nothing any more.
    pub(crate) fn seen_attached(&self, nodes: &[String]) {
        if nodes.is_empty() {
            return;
        }
        let mut labels = lock(&self.labels);
        for node in nodes {
            labels.remove(node);
        }
    }

    /// The pod `pod` of Scheduler `scheduler` on `node` was deleted for a new revision.
    pub(crate) fn pod_replaced(&self, node: &str, scheduler: &str, pod: &str) {
        let mut replacements = lock(&self.replacements);
        replacements.retain(|_, r| r.at.elapsed() < FORGOTTEN_AFTER);
        let entry = PodReplaced { scheduler: scheduler.to_owned(), pod: pod.to_owned(), at: Instant::now() };
        replacements.insert(node.to_owned(), entry);
    }

    /// What the Scheduler `scheduler` expects of `nodes`.
    pub(crate) fn of<'a>(&self, scheduler: &str, nodes: impl Iterator<Item = &'a String> + Clone) -> Expected {
        let labels = lock(&self.labels);
        let ours = |n: &String| labels.get(n).filter(|w| w.owner == scheduler);
        let labelled = nodes.clone().filter_map(|n| Some((n.clone(), ours(n)?.at.elapsed()))).collect();
        let label_versions = nodes.clone().filter_map(|n| Some((n.clone(), ours(n)?.version?))).collect();
        drop(labels);
        let replacements = lock(&self.replacements);
        let replaced = nodes
            .filter_map(|n| {
                let r = replacements.get(n).filter(|r| r.scheduler == scheduler)?;
                Some((n.clone(), (r.pod.clone(), r.at.elapsed())))
            })
            .collect();
        Expected { labelled, label_versions, replaced }
    }

    /// A new term: it expects nothing of the last one's writes.
    pub(crate) fn clear(&self) {
        lock(&self.labels).clear();
        lock(&self.replacements).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scheduler_expects_its_own_writes_only_until_they_are_seen() {
        let e = Expectations::default();
        let nodes = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
        e.label_written("a", Some("s"), Some(7));
        e.label_written("b", Some("other"), None);
        e.pod_replaced("c", "s", "s-c1");
        let seen = e.of("s", nodes.iter());
        assert_eq!(seen.labelled.keys().collect::<Vec<_>>(), ["a"], "b was labelled for another Scheduler");
        assert_eq!(seen.label_versions.get("a"), Some(&7));
        assert_eq!(seen.replaced.get("c").map(|(pod, _)| pod.as_str()), Some("s-c1"));
        assert!(e.of("other", nodes.iter()).replaced.is_empty());
        e.seen_attached(&["a".to_owned()]);
        e.label_written("b", None, None);
        assert!(e.of("s", nodes.iter()).labelled.is_empty());
        assert!(e.of("other", nodes.iter()).labelled.is_empty(), "its label was taken off");
        e.clear();
        assert!(e.of("s", nodes.iter()).replaced.is_empty(), "a new term expects nothing");
    }
}
