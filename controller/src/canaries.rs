//! The canary slots every Scheduler's reconcile shares (`--max-concurrent-canaries`): at most
//! that many Schedulers run a canary at a time, so a change that makes a new revision of every
//! Scheduler at once (a `helm upgrade` to a new agent image) switches one pool's first nodes at
//! a time, not every pool's.
//!
//! Held in memory by the leader. The claims are facts of the Schedulers' own rollouts (a
//! canary under way is one whose status says Canary), so a new leader seeds them from the
//! statuses it finds and settles them at its first reconcile of each Scheduler: a canary under
//! way keeps its slot whatever the count, and only the start of a canary is refused.

use std::collections::BTreeSet;
use std::sync::Mutex;

use sked_core::rollout::{CanaryClaim, CanaryGate};

use crate::mutex::lock;
use crate::triggers::Triggers;

/// The slots, and who waits for one.
pub struct Canaries {
    /// 0: no limit.
    max: usize,
    slots: Mutex<Slots>,
    /// Wakes the queued Schedulers when a slot comes free.
    triggers: Triggers,
}

#[derive(Default)]
struct Slots {
    running: BTreeSet<String>,
    queued: BTreeSet<String>,
}

/// What became of a decision's claim.
#[derive(Debug, PartialEq, Eq)]
pub enum Settled {
    /// As decided.
    Kept,
    /// It started a canary, and the slots were taken in the meantime (by a reconcile of another
    /// Scheduler that ran beside it): decide again behind this gate.
    Refused(CanaryGate),
}

impl Canaries {
    pub fn new(max: usize, triggers: Triggers) -> Self {
        Self { max, slots: Mutex::default(), triggers }
    }

    /// A new term's slots, from the Schedulers whose status says their canary runs (a status
    /// in Canary holds a slot): taken before the first reconcile, so no other canary starts
    /// before this term has seen the ones under way.
    pub fn seed<'a>(&self, running: impl IntoIterator<Item = &'a str>) {
        lock(&self.slots).running.extend(running.into_iter().map(str::to_owned));
    }

    /// The gate the Scheduler `name` decides behind: open when it holds a slot or one is free.
    /// `exists` says whether a Scheduler still exists: one deleted while it held a slot (whose
    /// last reconcile found it gone) holds none.
    pub fn gate(&self, name: &str, exists: impl Fn(&str) -> bool) -> CanaryGate {
        let mut slots = lock(&self.slots);
        let before = slots.running.len();
        slots.running.retain(|n| n == name || exists(n));
        if slots.running.len() < before {
            self.wake(&mut slots);
        }
        self.gate_of(&slots, name)
    }

    fn gate_of(&self, slots: &Slots, name: &str) -> CanaryGate {
        if self.max == 0 || slots.running.contains(name) || slots.running.len() < self.max {
            return CanaryGate::Open;
        }
        CanaryGate::Full { max: self.max }
    }

    /// Records what the decision of `name` does with its slot (`queued`: it waits for one).
    /// A start is checked against the slots again, under the same lock that records it.
    pub fn settle(&self, name: &str, claim: CanaryClaim, queued: bool) -> Settled {
        let mut slots = lock(&self.slots);
        match claim {
            CanaryClaim::Starts => {
                let gate = self.gate_of(&slots, name);
                if gate != CanaryGate::Open {
                    slots.queued.insert(name.to_owned());
                    return Settled::Refused(gate);
                }
                slots.queued.remove(name);
                slots.running.insert(name.to_owned());
            }
            CanaryClaim::Runs => {
                slots.queued.remove(name);
                slots.running.insert(name.to_owned());
            }
            CanaryClaim::None => {
                if slots.running.remove(name) {
                    self.wake(&mut slots);
                }
                if queued && self.gate_of(&slots, name) == CanaryGate::Open {
                    // A slot came free while this one decided behind a closed gate: the wake
                    // went out before it queued. It decides again now.
                    slots.queued.remove(name);
                    self.triggers.send(name);
                } else if queued {
                    slots.queued.insert(name.to_owned());
                } else {
                    slots.queued.remove(name);
                }
            }
        }
        Settled::Kept
    }

    /// The Scheduler `name` is gone, or has no rollout to decide: it holds no slot.
    pub fn release(&self, name: &str) {
        let mut slots = lock(&self.slots);
        slots.queued.remove(name);
        if slots.running.remove(name) {
            self.wake(&mut slots);
        }
    }

    /// A slot came free: every queued Scheduler decides again (the first to claim it gets it).
    fn wake(&self, slots: &mut Slots) {
        for name in std::mem::take(&mut slots.queued) {
            self.triggers.send(&name);
        }
    }

    /// How many canaries run, and how many Schedulers wait for a slot.
    pub fn counts(&self) -> (usize, usize) {
        let slots = lock(&self.slots);
        (slots.running.len(), slots.queued.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(_: &str) -> bool {
        true
    }

    #[test]
    fn one_canary_at_a_time_and_the_queue_is_woken_when_it_ends() {
        let triggers = Triggers::default();
        let canaries = Canaries::new(1, triggers.clone());
        assert_eq!(canaries.gate("a", all), CanaryGate::Open);
        assert_eq!(canaries.gate("b", all), CanaryGate::Open, "nobody holds the slot yet");
        // Both decided behind an open gate and start: the second to settle is refused.
        assert_eq!(canaries.settle("a", CanaryClaim::Starts, false), Settled::Kept);
        let refused = canaries.settle("b", CanaryClaim::Starts, false);
        assert_eq!(refused, Settled::Refused(CanaryGate::Full { max: 1 }));
        assert_eq!(canaries.gate("a", all), CanaryGate::Open, "its own slot");
        assert_eq!(canaries.settle("b", CanaryClaim::None, true), Settled::Kept);
        assert_eq!(canaries.counts(), (1, 1));
        assert_eq!(triggers.pending(), 0);
        // a's canary baked: its waves start, and b is woken.
        canaries.settle("a", CanaryClaim::None, false);
        assert_eq!((canaries.counts(), triggers.pending()), ((0, 0), 1));
        assert_eq!(canaries.gate("b", all), CanaryGate::Open);
    }

    #[test]
    fn a_scheduler_that_queues_after_the_slot_came_free_is_woken_at_once() {
        // b read a closed gate, then a gave the slot back (waking nobody: b was not queued yet),
        // then b settled as queued.
        let triggers = Triggers::default();
        let canaries = Canaries::new(1, triggers.clone());
        canaries.settle("a", CanaryClaim::Starts, false);
        assert_eq!(canaries.gate("b", all), CanaryGate::Full { max: 1 });
        canaries.settle("a", CanaryClaim::None, false);
        assert_eq!(triggers.pending(), 0);
        canaries.settle("b", CanaryClaim::None, true);
        assert_eq!((triggers.pending(), canaries.counts()), (1, (0, 0)), "b decides again now");
        // A holder gone from the index wakes the queue.
        canaries.settle("c", CanaryClaim::Starts, false);
        canaries.settle("d", CanaryClaim::None, true);
        let pending = triggers.pending();
        assert_eq!(canaries.gate("e", |n| n != "c"), CanaryGate::Open);
        assert_eq!(triggers.pending(), pending + 1, "d is woken");
    }

    #[test]
    fn a_canary_under_way_keeps_its_slot_past_the_limit() {
        // A new leader finds two canaries under way (the limit was lowered, or two leaders'
        // views crossed): neither is stopped, and a third waits for both.
        let canaries = Canaries::new(1, Triggers::default());
        canaries.settle("a", CanaryClaim::Runs, false);
        canaries.settle("b", CanaryClaim::Runs, false);
        assert_eq!(canaries.gate("c", all), CanaryGate::Full { max: 1 });
        assert_eq!(canaries.counts(), (2, 0));
        canaries.release("a");
        assert!(matches!(canaries.gate("c", all), CanaryGate::Full { .. }), "b still runs its canary");
    }

    #[test]
    fn a_new_term_seeded_with_a_canary_under_way_starts_no_other() {
        let canaries = Canaries::new(1, Triggers::default());
        canaries.seed(["a"]);
        assert_eq!(canaries.gate("b", all), CanaryGate::Full { max: 1 }, "a's canary, from its status, holds the slot");
        assert!(matches!(canaries.settle("b", CanaryClaim::Starts, false), Settled::Refused(_)));
        assert_eq!(canaries.gate("a", all), CanaryGate::Open, "a goes on");
        // a's first reconcile finds its canary over: the slot goes to b.
        canaries.settle("a", CanaryClaim::None, false);
        assert_eq!(canaries.settle("b", CanaryClaim::Starts, false), Settled::Kept);
    }

    #[test]
    fn a_deleted_holder_frees_its_slot_and_no_limit_is_no_gate() {
        let canaries = Canaries::new(1, Triggers::default());
        canaries.settle("gone", CanaryClaim::Starts, false);
        assert_eq!(canaries.gate("b", |n| n != "gone"), CanaryGate::Open);
        let unlimited = Canaries::new(0, Triggers::default());
        unlimited.settle("a", CanaryClaim::Starts, false);
        assert_eq!(unlimited.settle("b", CanaryClaim::Starts, false), Settled::Kept);
        assert_eq!(unlimited.counts(), (2, 0));
    }
}
