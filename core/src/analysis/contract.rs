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

/// The contract reports of `node` that bear on the bake: those received during it, and the one
/// in effect when it began if the scheduler instance that sent it (its `enable_seq`) is the one
/// the node runs now (the newest report's): a node that switched before the wave's newest node
/// and whose contract did not change since has no entry inside the bake. A report under another
/// instance told of the scheduler the node ran before; the agent starts the pods' windows again
/// when its scheduler changes, and sends a window only with the scheduler it was measured under.
fn in_bake<'a>(case: &Case<'a>, node: &str) -> Vec<&'a NodeCpuContract> {
    let Some(health) = case.health.get(node) else { return Vec::new() };
    let kept = &health.contracts;
    let during = kept.iter().filter(|(at, _)| (case.from_ms..=case.to_ms).contains(at));
    let now_running = kept.iter().rfind(|(at, _)| *at <= case.to_ms).map(|(_, c)| c.enable_seq);
    let in_effect = kept.iter().rfind(|(at, _)| *at < case.from_ms).filter(|(_, c)| Some(c.enable_seq) == now_running);
    in_effect.into_iter().chain(during).map(|(_, c)| c).collect()
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
