//! Which nodes can run sched_ext, as labels: `sked.schedkit.io/sched-ext=unsupported` once an
//! agent found no sched_ext in its node's kernel, `=supported` once a scheduler attached there.
//! The arbiter keeps unsupported nodes out of placement ([`sked_core::arbiter::unsupported`]), so no
//! pod is sent to a kernel that cannot run it, again and again.
//!
//! An unsupported node comes back when its kernel changes: the label
//! `sked.schedkit.io/sched-ext-kernel` keeps the kernel it was judged on (the kubelet's
//! `status.nodeInfo.kernelVersion`, made a label value), and a watch of the unsupported nodes (full
//! objects, a small set) clears both labels once the kubelet reports another kernel.
//!
//! Writes are merge patches of these two labels (the chart's ValidatingAdmissionPolicy allows
//! labels under sked.schedkit.io/ only), made while leading and only where a label differs, so
//! idle costs nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use sked_api::verdict::Verdict;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::index::Index;
use crate::kernel_table::KernelTable;
use sked_core::arbiter::{SCHED_EXT_LABEL, SUPPORTED, UNSUPPORTED};

pub use sked_api::labels::KERNEL_LABEL;

/// The label a node's fresh report asks for: `None` when the report says nothing about support
/// (another scheduler attached, nothing attached yet).
pub fn wanted(verdict: Verdict) -> Option<&'static str> {
    match verdict {
        Verdict::Attached => Some(SUPPORTED),
        Verdict::KernelUnsupported => Some(UNSUPPORTED),
        Verdict::NotAttached | Verdict::ForeignScheduler => None,
    }
}

/// A kernel version (`uname -r`) as a label value: at most 63 characters of `[A-Za-z0-9._-]`,
/// others replaced by `_`, starting and ending alphanumeric.
pub fn kernel_label_value(version: &str) -> String {
    let cleaned: String = version
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' })
        .take(63)
        .collect();
    cleaned.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_owned()
}

/// Whether an unsupported node now runs another kernel than it was judged on.
pub fn kernel_changed(node: &Node) -> bool {
    let judged = node.labels().get(KERNEL_LABEL).map(String::as_str).unwrap_or_default();
    let running =
        node.status.as_ref().and_then(|s| s.node_info.as_ref()).map(|i| kernel_label_value(&i.kernel_version));
    running.is_some_and(|running| running != judged)
}

/// A label value written this recently is not written again before the Node watch shows it
/// (another value is written at once).
const ECHO_WAIT: Duration = Duration::from_secs(10);
/// Node writes in flight at once.
const CONCURRENT_WRITES: usize = 8;

/// Keeps the sched-ext labels: from the agents' reports (woken by the kernel table), and clears
/// them on unsupported nodes whose kernel changed. Runs until the leadership channel closes.
pub(crate) async fn keep_support_labels(
    client: Client,
    index: Index,
    kernel: Arc<KernelTable>,
    leader: crate::leader::Leader,
) {
    let nodes: Api<Node> = Api::all(client);
    let unsupported =
        watcher::watcher(nodes.clone(), watcher::Config::default().labels(&format!("{SCHED_EXT_LABEL}={UNSUPPORTED}")));
    let mut unsupported = std::pin::pin!(unsupported);
    let mut labels = SupportLabels {
        nodes,
        index,
        kernel,
        changes: leader.receiver(),
        leader,
        seen: HashMap::new(),
        written: HashMap::new(),
        full_pass: true,
    };
    let mut retry: Option<Duration> = None;
    loop {
        let failed = labels.pass().await;
        retry = failed.then(|| retry.map_or(Duration::from_millis(500), |r| (r * 2).min(Duration::from_secs(30))));
        let wait = retry.is_some() || !labels.written.is_empty();
        tokio::select! {
            () = labels.kernel.changed() => {}
            changed = labels.changes.changed() => if changed.is_err() { return },
            event = unsupported.next() => match event {
                Some(Ok(event)) => labels.saw(event),
                Some(Err(e)) => {
                    warn!(err = %e, "watching unsupported nodes failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                None => return,
            },
            () = tokio::time::sleep(retry.unwrap_or(ECHO_WAIT)), if wait => {}
        }
    }
}

/// What [`keep_support_labels`] keeps between passes.
struct SupportLabels {
    nodes: Api<Node>,
    index: Index,
    kernel: Arc<KernelTable>,
    /// Whether this replica may write (fenced), and the lease manager's changes.
    leader: crate::leader::Leader,
    changes: watch::Receiver<bool>,
    /// The unsupported nodes as last seen, to re-check when this replica starts leading.
    seen: HashMap<String, Node>,
    /// Node -> (when, value) of this replica's recent writes.
    written: HashMap<String, (Instant, String)>,
    /// The next pass looks at every node, not only at those whose verdict changed.
    full_pass: bool,
}

impl SupportLabels {
    /// One pass while leading: the labels the reports ask for, then the unsupported nodes whose
    /// kernel changed. Whether a write failed (it is looked at again on the next pass).
    async fn pass(&mut self) -> bool {
        self.changes.borrow_and_update();
        if !self.leader.leading() {
            self.full_pass = true;
            self.kernel.take_changed();
            return false;
        }
        // A write whose echo never came is looked at again.
        self.full_pass |= self.written.values().any(|(at, _)| at.elapsed() >= ECHO_WAIT);
        self.written.retain(|_, (at, _)| at.elapsed() < ECHO_WAIT);
        let drift = self.drift();
        let mut failed = self.write(drift).await;
        failed |= self.clear_changed_kernels().await;
        self.full_pass |= failed;
        failed
    }

    /// The nodes whose label differs from what their fresh report asks for, with that value. A
    /// new term looks at every node once; after that, at the nodes whose verdict changed.
    fn drift(&mut self) -> Vec<(String, String)> {
        let changed = self.kernel.take_changed();
        let look_at_all = std::mem::take(&mut self.full_pass);
        let (index, written) = (&self.index, &self.written);
        self.kernel.read(|reports| {
            let wants = |node: &String| {
                let r = reports.get(node).filter(|r| !r.stale)?;
                let want = wanted(r.verdict)?;
                let have = index.node_label(node, SCHED_EXT_LABEL)?;
                let echo_pending = written.get(node).is_some_and(|(_, value)| value == want);
                // Owned strings: a borrowed one in the write futures trips the compiler's Send
                // inference.
                (have.as_deref() != Some(want) && !echo_pending).then(|| (node.clone(), want.to_owned()))
            };
            if look_at_all {
                reports.keys().filter_map(wants).collect()
            } else {
                changed.iter().filter_map(wants).collect()
            }
        })
    }

    /// Writes the labels, a few at a time; whether one failed.
    async fn write(&mut self, drift: Vec<(String, String)>) -> bool {
        let writes = futures::stream::iter(drift)
            .map(|(node, want)| {
                let (nodes, leader) = (self.nodes.clone(), self.leader.clone());
                async move {
                    // Each write checks leadership: the lease may move during a long pass.
                    if !leader.leading() {
                        return (node, want, Ok(()));
                    }
                    let result = set_support(&nodes, &node, &want).await;
                    (node, want, result)
                }
            })
            .buffer_unordered(CONCURRENT_WRITES)
            .collect::<Vec<_>>()
            .await;
        let mut failed = false;
        for (node, want, result) in writes {
            match result {
                Ok(()) => {
                    info!(node = %node, sched_ext = want, "node sched-ext label set");
                    self.written.insert(node, (Instant::now(), want));
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    failed = true;
                    warn!(node = %node, err = %e, "could not label the node's sched_ext support; retrying");
                }
            }
        }
        failed
    }

    /// Clears the labels of the unsupported nodes that run another kernel now; whether a write
    /// failed.
    async fn clear_changed_kernels(&mut self) -> bool {
        let changed: Vec<Node> = self.seen.values().filter(|n| kernel_changed(n)).cloned().collect();
        let mut failed = false;
        for node in changed {
            if !self.leader.leading() {
                break;
            }
            if clear(&self.nodes, &node).await {
                // Its last report judged the old kernel.
                self.kernel.forget(&node.name_any());
                self.seen.remove(&node.name_any());
            } else {
                failed = true;
            }
        }
        failed
    }

    /// Follows the watch of the unsupported nodes.
    fn saw(&mut self, event: watcher::Event<Node>) {
        match event {
            watcher::Event::Apply(n) | watcher::Event::InitApply(n) => {
                self.seen.insert(n.name_any(), n);
            }
            watcher::Event::Delete(n) => {
                self.seen.remove(&n.name_any());
            }
            watcher::Event::Init => self.seen.clear(),
            watcher::Event::InitDone => {}
        }
    }
}

async fn set_support(nodes: &Api<Node>, name: &str, want: &str) -> Result<(), kube::Error> {
    let kernel = if want == UNSUPPORTED {
        let node = nodes.get(name).await?;
        node.status.and_then(|s| s.node_info).map(|i| kernel_label_value(&i.kernel_version))
    } else {
        None
    };
    let patch = json!({ "metadata": { "labels": { SCHED_EXT_LABEL: want, KERNEL_LABEL: kernel } } });
    nodes.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.map(|_| ())
}

/// Clears a node's sched-ext labels; whether it did.
async fn clear(nodes: &Api<Node>, node: &Node) -> bool {
    let name = node.name_any();
    let patch = json!({ "metadata": { "labels": { SCHED_EXT_LABEL: null, KERNEL_LABEL: null } } });
    match nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {
            info!(node = %name, "the node runs another kernel: its sched_ext support will be judged again");
            true
        }
        Err(e) => {
            warn!(node = %name, err = %e, "could not clear the node's sched-ext label");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeStatus, NodeSystemInfo};

    #[test]
    fn kernel_versions_become_label_values() {
        assert_eq!(kernel_label_value("6.1.0-28-cloud-amd64"), "6.1.0-28-cloud-amd64");
        assert_eq!(kernel_label_value("6.6.58+"), "6.6.58");
        assert_eq!(kernel_label_value("5.15.0 #1 SMP"), "5.15.0__1_SMP");
        assert_eq!(kernel_label_value(&"9".repeat(100)).len(), 63);
    }

    #[test]
    fn reports_ask_for_support_labels() {
        assert_eq!(wanted(Verdict::Attached), Some("supported"));
        assert_eq!(wanted(Verdict::KernelUnsupported), Some("unsupported"));
        assert_eq!(wanted(Verdict::ForeignScheduler), None);
        assert_eq!(wanted(Verdict::NotAttached), None);
    }

    #[test]
    fn a_new_kernel_clears_the_judgement() {
        let node = |judged: &str, running: &str| {
            let mut n = Node::default();
            n.metadata.labels = Some([(KERNEL_LABEL.to_owned(), judged.to_owned())].into());
            n.status = Some(NodeStatus {
                node_info: Some(NodeSystemInfo { kernel_version: running.into(), ..NodeSystemInfo::default() }),
                ..NodeStatus::default()
            });
            n
        };
        assert!(!kernel_changed(&node("6.1.0-28-cloud-amd64", "6.1.0-28-cloud-amd64")));
        assert!(kernel_changed(&node("6.1.0-28-cloud-amd64", "6.12.9-cloud-amd64")));
        assert!(!kernel_changed(&Node::default()), "no kubelet report yet: nothing to compare");
    }
}
