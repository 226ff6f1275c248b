//! The pods' CPU contract of a wave's nodes over its bake (`spec.rollout.analysis.cpuContract`).
//!
//! Unlike the scheduling signals, which are noisy levels compared with the controls' change, a
//! breach of the contract is a fact: a pod measured over its limit, or a scheduler without the
//! callback that the node's pods need. One node is enough to fail the wave. What counts is every
//! report received during the bake: a pod that went over for one window and then stopped
//! wanting CPU still broke its limit.

use super::judge::Case;
use crate::cpu_contract::NodeCpuContract;

/// What the wave's nodes said of the pods' CPU contract over the bake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Finding {
    /// A node broke it: the node, and the cause, naming the node and the revision.
    Broken { node: String, cause: String },
    /// These nodes sent no reading of their pods over the bake (an agent that does not read
    /// them, or could not): nothing proves the contract held there.
    Unknown(Vec<String>),
    /// Every node said, and none broke it.
    Kept,
}

/// The contract reports of `node` received during the bake. One from before it told of the
/// scheduler the node ran then; the new one is another instance (another `enable_seq`), so its
/// first report is always a new entry, and the agent starts the pods' windows again when its
/// scheduler changes.
fn in_bake<'a>(case: &Case<'a>, node: &str) -> Vec<&'a NodeCpuContract> {
    let Some(health) = case.health.get(node) else { return Vec::new() };
    health.contracts.iter().filter(|(at, _)| (case.from_ms..=case.to_ms).contains(at)).map(|(_, c)| c).collect()
}

/// The wave's nodes' contract over the bake: the first node (in the wave's order) that broke
/// it, else the nodes that did not say, else kept.
pub(super) fn check(case: &Case<'_>) -> Finding {
    let mut unknown = Vec::new();
    for node in &case.wave {
        let seen = in_bake(case, node);
        // A pod measured over its limit is the better cause: it names who paid for it.
        let breaches: Vec<_> = seen.iter().filter_map(|c| c.breach()).collect();
        if let Some(breach) = breaches.iter().find(|b| b.measured).or(breaches.first()) {
            return Finding::Broken { node: (*node).to_owned(), cause: breach.cause(node, case.revision) };
        }
        if !seen.iter().any(|c| c.pods_known()) {
            unknown.push((*node).to_owned());
        }
    }
    if unknown.is_empty() { Finding::Kept } else { Finding::Unknown(unknown) }
}
