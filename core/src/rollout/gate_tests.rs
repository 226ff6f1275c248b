//! The canary gate: across Schedulers, at most `--max-concurrent-canaries` canaries at once.

use proptest::prelude::*;

use super::tests::{S, T, entering, input_at, node, pacing, up};
use super::*;

fn full() -> CanaryGate {
    CanaryGate::Full { max: 1 }
}

#[test]
fn a_canary_waits_while_another_schedulers_canary_holds_the_slot() {
    let nodes: Vec<NodeView> = (0..4).map(|i| up(&format!("n{i}"), S)).collect();
    let gate = full();
    let queued = decide(&Input { canary_gate: &gate, ..input_at(&nodes, pacing(1, 2), 1000) });
    assert_eq!((queued.phase, queued.replace.len(), queued.canary), (RolloutPhase::Queued, 0, CanaryClaim::None));
    assert_eq!(queued.recheck_in, Some(QUEUED_RECHECK_SECONDS), "a slot set free wakes it; a timer is the net");
    // The slot is free: the canary starts, and claims it.
    let started = decide(&input_at(&nodes, pacing(1, 2), 1000));
    assert_eq!((started.phase, started.replace.len(), started.canary), (RolloutPhase::Canary, 1, CanaryClaim::Starts));
}

#[test]
fn a_first_deployment_queues_too_and_admits_no_node() {
    let waiting = entering(&["a", "b", "c"], false);
    let gate = full();
    let input = Input { stable: None, entering: &waiting, canary_gate: &gate, ..input_at(&[], pacing(1, 1), 1000) };
    let queued = decide(&input);
    assert_eq!((queued.phase, queued.admit.len(), queued.entering), (RolloutPhase::Queued, 0, 3));
}

#[test]
fn a_canary_under_way_keeps_its_course_whatever_the_gate_says() {
    // The canary runs attached and bakes: the slot is its own (a new leader may find more
    // canaries under way than the limit, after a failover or a lowered limit).
    let mut nodes: Vec<NodeView> = (0..4).map(|i| up(&format!("n{i}"), S)).collect();
    nodes[0] = node("n0", T, KernelView::Attached { since: 990 });
    let gate = full();
    let baking = decide(&Input { canary_gate: &gate, ..input_at(&nodes, pacing(1, 2), 1000) });
    assert_eq!((baking.phase, baking.canary), (RolloutPhase::Canary, CanaryClaim::Runs));
    // Baked: the waves start and give the slot back.
    let rolling = decide(&Input { canary_gate: &gate, ..input_at(&nodes, pacing(1, 2), 1030) });
    assert_eq!((rolling.phase, rolling.canary), (RolloutPhase::Rolling, CanaryClaim::None));
    assert!(!rolling.replace.is_empty());
}

#[test]
fn a_rollback_and_an_unpaced_rollout_never_queue() {
    let mut nodes: Vec<NodeView> = (0..3).map(|i| up(&format!("n{i}"), S)).collect();
    nodes[1] = up("n1", T);
    let gate = full();
    // Back to the stable revision: every other pod goes at once.
    let restore = decide(&Input { target: S, canary_gate: &gate, ..input_at(&nodes, pacing(1, 1), 1000) });
    assert_eq!((restore.replace.len(), restore.canary), (1, CanaryClaim::None));
    // `canary: 0` over a maxUnavailable that covers every node asks for no canary at all.
    let old: Vec<NodeView> = (0..3).map(|i| up(&format!("n{i}"), S)).collect();
    let unpaced = decide(&Input { canary_gate: &gate, ..input_at(&old, pacing(0, 3), 1000) });
    assert_eq!((unpaced.phase, unpaced.replace.len()), (RolloutPhase::Rolling, 3));
}

proptest! {
    /// Whatever the nodes run, a closed gate never lets a rollout switch its first node to the
    /// target revision, and an open one marks every such start as a claim.
    #[test]
    fn no_canary_starts_past_a_closed_gate(
        revisions in proptest::collection::vec(0u8..3, 1..8),
        canary in 1usize..3,
        max_unavailable in 1usize..4,
    ) {
        let nodes: Vec<NodeView> = revisions
            .iter()
            .enumerate()
            .map(|(i, r)| match r {
                0 => up(&format!("n{i}"), S),
                1 => up(&format!("n{i}"), T),
                _ => node(&format!("n{i}"), S, KernelView::NotAttached),
            })
            .collect();
        let on_target = revisions.iter().filter(|r| **r == 1).count();
        let gate = full();
        let closed = decide(&Input { canary_gate: &gate, ..input_at(&nodes, pacing(canary, max_unavailable), 1000) });
        let open = decide(&input_at(&nodes, pacing(canary, max_unavailable), 1000));
        if on_target == 0 {
            prop_assert!(closed.replace.is_empty() && closed.admit.is_empty(), "{closed:?}");
            prop_assert_eq!(open.canary == CanaryClaim::Starts, !open.replace.is_empty());
        } else {
            prop_assert_eq!(&closed.replace, &open.replace);
            prop_assert_ne!(open.canary, CanaryClaim::Starts);
        }
    }
}
