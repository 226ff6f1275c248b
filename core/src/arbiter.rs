//! Node arbitration: which Scheduler owns each node.
//!
//! A Scheduler claims every node its `nodeSelector` matches (an empty selector matches every
//! node). When several Schedulers claim a node, the oldest `creationTimestamp` wins; equal
//! timestamps break on name. Tolerations, taints and pod health never change the winner, so
//! ownership is a function of labels and ages alone and is stable while those are.
//!
//! [`assign`] computes an [`Assignment`] from scratch. [`Arbiter`] keeps the same answer up to
//! date as Schedulers and Nodes come and go, and says which Schedulers' placements changed, so
//! the controller reconciles exactly those. Both are pure and tested without a server.
//!
//! A node whose agent found no sched_ext in its kernel is labelled
//! `sked.schedkit.io/sched-ext=unsupported`: its winner does not own it (no pod goes there) but
//! keeps it in [`Placement::unsupported`], until the label goes with a new kernel.

use std::collections::{BTreeMap, BTreeSet, HashMap};

pub use sked_api::labels::{SCHED_EXT_LABEL, SUPPORTED, UNSUPPORTED};

/// Whether a node with `labels` is known to have no sched_ext.
pub fn unsupported(labels: &BTreeMap<String, String>) -> bool {
    labels.get(SCHED_EXT_LABEL).is_some_and(|v| v == UNSUPPORTED)
}

/// What the arbiter needs to know of a Scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub name: String,
    /// `metadata.uid`: a Scheduler deleted and created again under the same name is new.
    pub uid: String,
    /// `creationTimestamp` in seconds since the epoch (the API server's resolution).
    pub created: i64,
    /// `metadata.generation`, so a stale copy never replaces a newer one.
    pub generation: i64,
    pub selector: BTreeMap<String, String>,
}

impl Claim {
    /// The claim of a Scheduler as the API server returned it.
    pub fn of(s: &sked_api::Scheduler) -> Self {
        use kube_core::ResourceExt;
        Claim {
            name: s.name_any(),
            uid: s.uid().unwrap_or_default(),
            created: s.creation_timestamp().map_or(0, |t| t.0.as_second()),
            generation: s.metadata.generation.unwrap_or(0),
            selector: s.spec.node_selector.clone(),
        }
    }

    /// Whether this Scheduler's selector matches a node with `labels`.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector.iter().all(|(k, v)| labels.get(k) == Some(v))
    }

    /// The arbitration order: older first, then by name.
    fn rank(&self) -> (i64, &str) {
        (self.created, &self.name)
    }
}

/// Where one Scheduler runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// Selected nodes this Scheduler owns.
    pub owned: BTreeSet<String>,
    /// Selected nodes an older Scheduler owns, with that winner.
    pub lost: BTreeMap<String, String>,
    /// The winners created in the same second as this Scheduler: they won on name, not age.
    pub tied: BTreeSet<String>,
    /// Nodes this Scheduler would own whose kernel has no sched_ext: no pod goes there.
    pub unsupported: BTreeSet<String>,
}

impl Placement {
    /// Whether the Scheduler should have a DaemonSet: it owns a node, or nothing took its
    /// nodes from it (a selector matching no node yet keeps its DaemonSet, ready for new nodes).
    pub fn wants_daemonset(&self) -> bool {
        !self.owned.is_empty() || self.lost.is_empty()
    }

    /// Lost node names, sorted.
    pub fn lost_nodes(&self) -> Vec<String> {
        self.lost.keys().cloned().collect()
    }

    /// The distinct winners, sorted.
    pub fn winners(&self) -> BTreeSet<&str> {
        self.lost.values().map(String::as_str).collect()
    }

    /// Fills [`Placement::tied`]: the winners whose creation second (`created`) is `mine`.
    fn mark_ties(&mut self, mine: Option<i64>, created: impl Fn(&str) -> Option<i64>) {
        self.tied = self.lost.values().filter(|w| mine.is_some() && created(w.as_str()) == mine).cloned().collect();
    }
}

/// The placement of every Scheduler.
pub type Assignment = BTreeMap<String, Placement>;

/// Computes every Scheduler's placement from scratch.
pub fn assign(claims: &[Claim], nodes: &BTreeMap<String, BTreeMap<String, String>>) -> Assignment {
    let mut ranked: Vec<&Claim> = claims.iter().collect();
    ranked.sort_by(|a, b| a.rank().cmp(&b.rank()));
    let mut out: Assignment = claims.iter().map(|c| (c.name.clone(), Placement::default())).collect();
    for (node, labels) in nodes {
        let mut matching = ranked.iter().filter(|c| c.selects(labels));
        let Some(winner) = matching.next() else { continue };
        let won = out.entry(winner.name.clone()).or_default();
        if unsupported(labels) { &mut won.unsupported } else { &mut won.owned }.insert(node.clone());
        for loser in matching {
            out.entry(loser.name.clone()).or_default().lost.insert(node.clone(), winner.name.clone());
        }
    }
    let created: HashMap<&str, i64> = claims.iter().map(|c| (c.name.as_str(), c.created)).collect();
    for (name, placement) in &mut out {
        placement.mark_ties(created.get(name.as_str()).copied(), |w| created.get(w).copied());
    }
    out
}

/// An incrementally maintained [`assign`]: feed it Scheduler and Node changes; each change
/// returns the Schedulers whose placement changed.
#[derive(Debug, Default)]
pub struct Arbiter {
    claims: HashMap<String, Claim>,
    nodes: BTreeMap<String, BTreeMap<String, String>>,
    /// Per node, the Schedulers that select it, in arbitration order (first = owner).
    candidates: HashMap<String, Vec<String>>,
}

/// Names of Schedulers whose placement changed.
pub type Changed = BTreeSet<String>;

impl Arbiter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn schedulers(&self) -> impl Iterator<Item = &str> {
        self.claims.keys().map(String::as_str)
    }

    pub fn nodes(&self) -> impl Iterator<Item = &str> {
        self.nodes.keys().map(String::as_str)
    }

    /// The labels of a known node.
    pub fn node_labels(&self, name: &str) -> Option<&BTreeMap<String, String>> {
        self.nodes.get(name)
    }

    /// Every known node with its labels and its owner (the oldest Scheduler selecting it; none
    /// on a node without sched_ext).
    pub fn owners(&self) -> impl Iterator<Item = (&str, &BTreeMap<String, String>, Option<&str>)> {
        self.nodes.iter().map(|(name, labels)| {
            let owner = self.candidates.get(name).and_then(|order| order.first()).map(String::as_str);
            (name.as_str(), labels, owner.filter(|_| !unsupported(labels)))
        })
    }

    /// The owner of a known node (the oldest Scheduler selecting it; none on a node without
    /// sched_ext).
    pub fn owner(&self, node: &str) -> Option<&str> {
        let owner = self.candidates.get(node).and_then(|order| order.first()).map(String::as_str);
        owner.filter(|_| !self.is_unsupported(node))
    }

    fn is_unsupported(&self, node: &str) -> bool {
        self.nodes.get(node).is_some_and(unsupported)
    }

    /// Adds or updates a Scheduler. A copy older than the stored one (by generation) is ignored.
    pub fn upsert_scheduler(&mut self, claim: Claim) -> Changed {
        if let Some(old) = self.claims.get(&claim.name)
            && ((old.uid == claim.uid && old.generation > claim.generation) || *old == claim)
        {
            return Changed::new();
        }
        let mut changed = Changed::from([claim.name.clone()]);
        let aged = self.claims.get(&claim.name).is_some_and(|old| old.created != claim.created);
        let name = claim.name.clone();
        self.claims.insert(claim.name.clone(), claim);
        self.recompute_all(&mut changed);
        if aged {
            self.report_losers_to(&name, &mut changed);
        }
        changed
    }

    /// Adds to `changed` every Scheduler that loses a node to `winner`: when the winner's age
    /// changes (a Scheduler made again under its name, seen only in a relist) and the order
    /// does not, which of them tie with it ([`Placement::tied`]) may change all the same.
    fn report_losers_to(&self, winner: &str, changed: &mut Changed) {
        for order in self.candidates.values().filter(|order| order.first().is_some_and(|w| w == winner)) {
            changed.extend(order.iter().skip(1).cloned());
        }
    }

    /// Removes a Scheduler; the nodes it owned pass to the next oldest claimant.
    pub fn remove_scheduler(&mut self, name: &str) -> Changed {
        if self.claims.remove(name).is_none() {
            return Changed::new();
        }
        let mut changed = Changed::new();
        self.recompute_all(&mut changed);
        changed.remove(name);
        changed
    }

    /// Adds a node or changes its labels.
    pub fn upsert_node(&mut self, name: &str, labels: BTreeMap<String, String>) -> Changed {
        if self.nodes.get(name) == Some(&labels) {
            return Changed::new();
        }
        let was_unsupported = self.is_unsupported(name);
        self.nodes.insert(name.to_owned(), labels);
        let mut changed = Changed::new();
        self.recompute_node(name, &mut changed);
        // The same winner, but it gains or loses the node.
        if was_unsupported != self.is_unsupported(name)
            && let Some(winner) = self.candidates.get(name).and_then(|order| order.first())
        {
            changed.insert(winner.clone());
        }
        changed
    }

    pub fn remove_node(&mut self, name: &str) -> Changed {
        if self.nodes.remove(name).is_none() {
            return Changed::new();
        }
        let mut changed = Changed::new();
        self.recompute_node(name, &mut changed);
        changed
    }

    /// Replaces the whole node set (after a watch relist); returns what changed.
    pub fn replace_nodes(&mut self, nodes: BTreeMap<String, BTreeMap<String, String>>) -> Changed {
        let mut changed = Changed::new();
        let gone: Vec<String> = self.nodes.keys().filter(|n| !nodes.contains_key(*n)).cloned().collect();
        for name in gone {
            changed.extend(self.remove_node(&name));
        }
        for (name, labels) in nodes {
            changed.extend(self.upsert_node(&name, labels));
        }
        changed
    }

    /// Replaces the whole Scheduler set (after a watch relist) with one recompute; returns what
    /// changed.
    pub fn replace_schedulers(&mut self, claims: Vec<Claim>) -> Changed {
        let keep: BTreeSet<String> = claims.iter().map(|c| c.name.clone()).collect();
        self.claims.retain(|name, _| keep.contains(name));
        let mut changed = Changed::new();
        let mut aged = Vec::new();
        for claim in claims {
            if let Some(old) = self.claims.get(&claim.name) {
                if (old.uid == claim.uid && old.generation > claim.generation) || *old == claim {
                    continue;
                }
                if old.created != claim.created {
                    aged.push(claim.name.clone());
                }
            }
            changed.insert(claim.name.clone());
            self.claims.insert(claim.name.clone(), claim);
        }
        self.recompute_all(&mut changed);
        for name in aged {
            self.report_losers_to(&name, &mut changed);
        }
        changed.retain(|name| self.claims.contains_key(name));
        changed
    }

    /// The placement of one Scheduler.
    pub fn placement(&self, scheduler: &str) -> Placement {
        let mut placement = Placement::default();
        for (node, order) in &self.candidates {
            let Some(pos) = order.iter().position(|s| s == scheduler) else { continue };
            if pos == 0 && self.is_unsupported(node) {
                placement.unsupported.insert(node.clone());
            } else if pos == 0 {
                placement.owned.insert(node.clone());
            } else {
                placement.lost.insert(node.clone(), order[0].clone());
            }
        }
        placement.mark_ties(self.created(scheduler), |w| self.created(w));
        placement
    }

    fn created(&self, scheduler: &str) -> Option<i64> {
        self.claims.get(scheduler).map(|c| c.created)
    }

    /// The placement of every Scheduler (what [`assign`] would return).
    pub fn assignment(&self) -> Assignment {
        let mut out: Assignment = self.claims.keys().map(|n| (n.clone(), Placement::default())).collect();
        for (node, order) in &self.candidates {
            let Some((winner, losers)) = order.split_first() else { continue };
            let won = out.entry(winner.clone()).or_default();
            if self.is_unsupported(node) { &mut won.unsupported } else { &mut won.owned }.insert(node.clone());
            for loser in losers {
                out.entry(loser.clone()).or_default().lost.insert(node.clone(), winner.clone());
            }
        }
        for (name, placement) in &mut out {
            placement.mark_ties(self.created(name), |w| self.created(w));
        }
        out
    }

    fn recompute_all(&mut self, changed: &mut Changed) {
        let names: Vec<String> = self.nodes.keys().cloned().collect();
        let mut ranked: Vec<&Claim> = self.claims.values().collect();
        ranked.sort_by(|a, b| a.rank().cmp(&b.rank()));
        let ranked: Vec<(&Claim, String)> = ranked.into_iter().map(|c| (c, c.name.clone())).collect();
        for name in names {
            let order: Vec<String> = match self.nodes.get(&name) {
                Some(labels) => ranked.iter().filter(|(c, _)| c.selects(labels)).map(|(_, n)| n.clone()).collect(),
                None => Vec::new(),
            };
            Self::set_candidates(&mut self.candidates, &name, order, changed);
        }
    }

    fn recompute_node(&mut self, name: &str, changed: &mut Changed) {
        let order = match self.nodes.get(name) {
            Some(labels) => {
                let mut matching: Vec<&Claim> = self.claims.values().filter(|c| c.selects(labels)).collect();
                matching.sort_by(|a, b| a.rank().cmp(&b.rank()));
                matching.into_iter().map(|c| c.name.clone()).collect()
            }
            None => Vec::new(),
        };
        Self::set_candidates(&mut self.candidates, name, order, changed);
    }

    /// Stores a node's new candidate order and records whose placement it changed: every
    /// Scheduler that entered or left the list, and, when the owner changed, every candidate.
    fn set_candidates(
        candidates: &mut HashMap<String, Vec<String>>,
        node: &str,
        order: Vec<String>,
        changed: &mut Changed,
    ) {
        let old = candidates.remove(node).unwrap_or_default();
        if old.first() != order.first() {
            changed.extend(old.iter().cloned());
            changed.extend(order.iter().cloned());
        } else {
            changed.extend(old.iter().filter(|s| !order.contains(s)).cloned());
            changed.extend(order.iter().filter(|s| !old.contains(s)).cloned());
        }
        if !order.is_empty() {
            candidates.insert(node.to_owned(), order);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn claim(name: &str, created: i64, selector: &[(&str, &str)]) -> Claim {
        Claim {
            name: name.into(),
            uid: name.into(),
            created,
            generation: 1,
            selector: selector.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_winner_of_the_same_second_is_marked_tied() {
        let claims = vec![claim("tie-b", 100, &[]), claim("tie-a", 100, &[]), claim("old", 50, &[("pool", "x")])];
        let nodes = BTreeMap::from([("n1".to_string(), labels(&[])), ("n2".to_string(), labels(&[("pool", "x")]))]);
        let out = assign(&claims, &nodes);
        // n1: tie-a beats tie-b on name; n2: old beats both on age.
        assert_eq!(out["tie-b"].tied, BTreeSet::from(["tie-a".to_string()]));
        assert_eq!(out["tie-a"].tied, BTreeSet::new());
        let mut arbiter = Arbiter::new();
        arbiter.replace_nodes(nodes);
        arbiter.replace_schedulers(claims);
        assert_eq!(arbiter.placement("tie-b"), out["tie-b"]);
        assert_eq!(arbiter.assignment(), out);
    }

    #[test]
    fn oldest_wins_and_ties_break_on_name() {
        let nodes = BTreeMap::from([("n1".to_string(), labels(&[("pool", "batch")]))]);
        let claims = [claim("young", 20, &[("pool", "batch")]), claim("old", 10, &[])];
        let a = assign(&claims, &nodes);
        assert!(a["old"].owned.contains("n1"));
        assert_eq!(a["young"].lost["n1"], "old");

        let tie = [claim("b", 10, &[]), claim("a", 10, &[])];
        let a = assign(&tie, &nodes);
        assert!(a["a"].owned.contains("n1"));
        assert_eq!(a["b"].lost["n1"], "a");
    }

    #[test]
    fn empty_selector_claims_every_node_and_unmatched_nodes_are_free() {
        let nodes = BTreeMap::from([("n1".to_string(), labels(&[])), ("n2".to_string(), labels(&[("pool", "x")]))]);
        let a = assign(&[claim("all", 1, &[]), claim("y", 2, &[("pool", "y")])], &nodes);
        assert_eq!(a["all"].owned.len(), 2);
        assert!(a["y"].owned.is_empty() && a["y"].lost.is_empty());
        assert!(a["y"].wants_daemonset(), "a selector matching nothing keeps its DaemonSet");
    }

    #[test]
    fn total_loss_means_no_daemonset() {
        let nodes = BTreeMap::from([("n1".to_string(), labels(&[("pool", "batch")]))]);
        let a = assign(&[claim("old", 1, &[]), claim("new", 2, &[("pool", "batch")])], &nodes);
        assert!(!a["new"].wants_daemonset());
        assert_eq!(a["new"].winners(), BTreeSet::from(["old"]));
    }

    #[test]
    fn incremental_changes_report_who_moved() {
        let mut arb = Arbiter::new();
        arb.upsert_node("n1", labels(&[("pool", "a")]));
        arb.upsert_node("n2", labels(&[("pool", "b")]));
        assert_eq!(arb.upsert_scheduler(claim("sa", 1, &[("pool", "a")])), Changed::from(["sa".into()]));
        // A younger Scheduler moves nobody else: sa keeps n1.
        assert_eq!(arb.upsert_scheduler(claim("all", 2, &[])), Changed::from(["all".into()]));
        assert_eq!(arb.placement("all").owned, BTreeSet::from(["n2".to_string()]));
        assert_eq!(arb.placement("all").lost["n1"], "sa");

        // An unrelated label changes nobody's placement.
        assert!(arb.upsert_node("n1", labels(&[("pool", "a"), ("zone", "z")])).is_empty());
        // Relabelling n1 away from pool a hands it to `all`.
        assert_eq!(arb.upsert_node("n1", labels(&[("pool", "c")])), Changed::from(["all".into(), "sa".into()]));
        assert_eq!(arb.placement("all").owned.len(), 2);
        // Deleting the winner of a node hands it over.
        arb.upsert_node("n1", labels(&[("pool", "a")]));
        assert_eq!(arb.remove_scheduler("sa"), Changed::from(["all".into()]));
        assert!(arb.placement("all").lost.is_empty());
        // A stale copy (older generation) is ignored.
        let mut newer = claim("all", 2, &[("pool", "b")]);
        newer.generation = 3;
        arb.upsert_scheduler(newer);
        assert!(arb.upsert_scheduler(claim("all", 2, &[])).is_empty());
        assert_eq!(arb.placement("all").owned, BTreeSet::from(["n2".to_string()]));
    }

    // ---- property tests ----

    const KEYS: [&str; 3] = ["pool", "zone", "gpu"];
    const VALUES: [&str; 2] = ["a", "b"];

    fn arb_labels() -> impl Strategy<Value = BTreeMap<String, String>> {
        proptest::collection::btree_map(
            proptest::sample::select(&KEYS[..]).prop_map(str::to_owned),
            proptest::sample::select(&VALUES[..]).prop_map(str::to_owned),
            0..3,
        )
    }

    fn arb_claims() -> impl Strategy<Value = Vec<Claim>> {
        proptest::collection::vec((0i64..4, arb_labels()), 0..6).prop_map(|v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (created, selector))| Claim {
                    name: format!("s{i}"),
                    uid: format!("s{i}"),
                    created,
                    generation: 1,
                    selector,
                })
                .collect()
        })
    }

    /// Node labels; some nodes are known to have no sched_ext.
    fn arb_node_labels() -> impl Strategy<Value = BTreeMap<String, String>> {
        (arb_labels(), any::<bool>()).prop_map(|(mut labels, no_sched_ext)| {
            if no_sched_ext {
                labels.insert(SCHED_EXT_LABEL.into(), UNSUPPORTED.into());
            }
            labels
        })
    }

    fn arb_nodes() -> impl Strategy<Value = BTreeMap<String, BTreeMap<String, String>>> {
        proptest::collection::vec(arb_node_labels(), 0..8)
            .prop_map(|v| v.into_iter().enumerate().map(|(i, l)| (format!("n{i}"), l)).collect())
    }

    fn build(claims: &[Claim], nodes: &BTreeMap<String, BTreeMap<String, String>>) -> Arbiter {
        let mut arb = Arbiter::new();
        for (n, l) in nodes {
            arb.upsert_node(n, l.clone());
        }
        for c in claims {
            arb.upsert_scheduler(c.clone());
        }
        arb
    }

    proptest! {
        #[test]
        fn each_node_has_one_owner_and_it_is_the_oldest_match(claims in arb_claims(), nodes in arb_nodes()) {
            let a = assign(&claims, &nodes);
            for (node, labels) in &nodes {
                let owners: Vec<&String> = a
                    .iter()
                    .filter(|(_, p)| p.owned.contains(node) || p.unsupported.contains(node))
                    .map(|(s, _)| s)
                    .collect();
                // A node without sched_ext is owned by no one; its winner keeps it aside.
                prop_assert!(!unsupported(labels) || a.values().all(|p| !p.owned.contains(node)));
                let oldest = claims.iter().filter(|c| c.selects(labels)).min_by(|x, y| x.rank().cmp(&y.rank()));
                match oldest {
                    None => prop_assert!(owners.is_empty()),
                    Some(o) => prop_assert_eq!(owners, vec![&o.name]),
                }
                for c in claims.iter().filter(|c| c.selects(labels)) {
                    let p = &a[&c.name];
                    prop_assert!((p.owned.contains(node) || p.unsupported.contains(node)) ^ p.lost.contains_key(node));
                }
            }
        }

        #[test]
        fn result_does_not_depend_on_input_order(claims in arb_claims(), nodes in arb_nodes(), seed in any::<u64>()) {
            let mut shuffled = claims.clone();
            // A deterministic shuffle driven by the seed.
            let len = shuffled.len();
            if len > 1 {
                for i in 0..len {
                    let j = ((seed >> (i % 32)) as usize + i * 7) % len;
                    shuffled.swap(i, j);
                }
            }
            prop_assert_eq!(assign(&claims, &nodes), assign(&shuffled, &nodes));
            let mut reversed_nodes = build(&[], &BTreeMap::new());
            for (n, l) in nodes.iter().rev() {
                reversed_nodes.upsert_node(n, l.clone());
            }
            for c in shuffled.iter().rev() {
                reversed_nodes.upsert_scheduler(c.clone());
            }
            prop_assert_eq!(reversed_nodes.assignment(), assign(&claims, &nodes));
        }

        #[test]
        fn incremental_changes_equal_a_recompute(
            claims in arb_claims(),
            nodes in arb_nodes(),
            extra in (0i64..4, arb_labels()),
            relabel in (0usize..8, arb_node_labels()),
            remove in 0usize..6,
        ) {
            let mut arb = build(&claims, &nodes);
            prop_assert_eq!(arb.assignment(), assign(&claims, &nodes));

            // Add one Scheduler.
            let added = Claim { name: "extra".into(), uid: "extra".into(), created: extra.0, generation: 1, selector: extra.1 };
            let before = arb.assignment();
            let changed = arb.upsert_scheduler(added.clone());
            let mut claims2 = claims.clone();
            claims2.push(added);
            let after = assign(&claims2, &nodes);
            prop_assert_eq!(&arb.assignment(), &after);
            assert_changed_covers(&before, &after, &changed)?;

            // Relabel one node.
            let mut nodes2 = nodes.clone();
            if let Some(name) = nodes.keys().nth(relabel.0 % nodes.len().max(1)).cloned() {
                let before = arb.assignment();
                let changed = arb.upsert_node(&name, relabel.1.clone());
                nodes2.insert(name, relabel.1);
                let after = assign(&claims2, &nodes2);
                prop_assert_eq!(&arb.assignment(), &after);
                assert_changed_covers(&before, &after, &changed)?;
            }

            // A relist with the same Schedulers changes nothing; a relist of a subset equals
            // a recompute of that subset.
            prop_assert!(arb.replace_schedulers(claims2.clone()).is_empty());
            let subset: Vec<Claim> = claims2.iter().step_by(2).cloned().collect();
            let mut relisted = build(&claims2, &nodes2);
            relisted.replace_schedulers(subset.clone());
            prop_assert_eq!(relisted.assignment(), assign(&subset, &nodes2));

            // Remove one Scheduler.
            if !claims2.is_empty() {
                let gone = claims2.remove(remove % claims2.len());
                let before = arb.assignment();
                let changed = arb.remove_scheduler(&gone.name);
                let after = assign(&claims2, &nodes2);
                prop_assert_eq!(&arb.assignment(), &after);
                assert_changed_covers(&before, &after, &changed)?;
            }
        }
    }

    /// One change the controller's watches can feed the arbiter.
    #[derive(Clone, Debug)]
    enum Event {
        /// A Scheduler created, or an existing one's selector changed (a newer generation).
        UpsertScheduler {
            slot: usize,
            created: i64,
            selector: BTreeMap<String, String>,
        },
        /// A stale copy of an existing Scheduler (an older generation) arrives late.
        StaleScheduler {
            slot: usize,
            selector: BTreeMap<String, String>,
        },
        /// A Scheduler deleted and made again under the same name (a new uid, generation 1).
        Recreate {
            slot: usize,
            created: i64,
            selector: BTreeMap<String, String>,
        },
        /// The same, but the watch missed the deletion: the new Scheduler arrives as an update
        /// (or, with `relist`, in a relist of every Scheduler).
        RecreateUnseen {
            slot: usize,
            created: i64,
            selector: BTreeMap<String, String>,
            relist: bool,
        },
        RemoveScheduler {
            slot: usize,
        },
        UpsertNode {
            slot: usize,
            labels: BTreeMap<String, String>,
        },
        RemoveNode {
            slot: usize,
        },
        /// A relist of the nodes: some kept, some relabelled, some gone, some new.
        ReplaceNodes {
            keep: Vec<bool>,
            new: Vec<(usize, BTreeMap<String, String>)>,
        },
        /// A relist of the Schedulers: some kept, the others gone.
        ReplaceSchedulers {
            keep: Vec<bool>,
        },
    }

    fn arb_event() -> impl Strategy<Value = Event> {
        let slot = 0usize..6;
        prop_oneof![
            3 => (slot.clone(), 0i64..4, arb_labels())
                .prop_map(|(slot, created, selector)| Event::UpsertScheduler { slot, created, selector }),
            1 => (slot.clone(), arb_labels()).prop_map(|(slot, selector)| Event::StaleScheduler { slot, selector }),
            1 => (slot.clone(), 0i64..4, arb_labels())
                .prop_map(|(slot, created, selector)| Event::Recreate { slot, created, selector }),
            1 => (slot.clone(), 0i64..4, arb_labels(), any::<bool>()).prop_map(|(slot, created, selector, relist)| {
                Event::RecreateUnseen { slot, created, selector, relist }
            }),
            1 => slot.clone().prop_map(|slot| Event::RemoveScheduler { slot }),
            3 => (0usize..8, arb_node_labels()).prop_map(|(slot, labels)| Event::UpsertNode { slot, labels }),
            1 => (0usize..8).prop_map(|slot| Event::RemoveNode { slot }),
            1 => (
                proptest::collection::vec(any::<bool>(), 8),
                proptest::collection::vec((0usize..8, arb_node_labels()), 0..3)
            )
                .prop_map(|(keep, new)| Event::ReplaceNodes { keep, new }),
            1 => proptest::collection::vec(any::<bool>(), 6).prop_map(|keep| Event::ReplaceSchedulers { keep }),
        ]
    }

    /// What the API server holds, as the watches would tell it: the Schedulers (newest copy of
    /// each) and the nodes with their labels.
    #[derive(Default)]
    struct World {
        claims: BTreeMap<String, Claim>,
        nodes: BTreeMap<String, BTreeMap<String, String>>,
        uids: usize,
    }

    impl World {
        /// Applies `event` to the world and feeds the arbiter what a watch would: the changed
        /// Schedulers it reports.
        fn step(&mut self, arb: &mut Arbiter, event: Event) -> Changed {
            let name = |slot: usize| format!("s{slot}");
            match event {
                Event::UpsertScheduler { slot, created, selector } => {
                    let claim = match self.claims.get(&name(slot)) {
                        // An existing Scheduler keeps its uid and age; its selector moves on.
                        Some(c) => Claim { generation: c.generation + 1, selector, ..c.clone() },
                        None => self.new_claim(name(slot), created, selector),
                    };
                    self.claims.insert(claim.name.clone(), claim.clone());
                    arb.upsert_scheduler(claim)
                }
                Event::StaleScheduler { slot, selector } => match self.claims.get(&name(slot)) {
                    Some(c) if c.generation > 1 => {
                        arb.upsert_scheduler(Claim { generation: c.generation - 1, selector, ..c.clone() })
                    }
                    _ => Changed::new(),
                },
                Event::Recreate { slot, created, selector } => {
                    let claim = self.new_claim(name(slot), created, selector);
                    let mut changed = Changed::new();
                    if self.claims.remove(&claim.name).is_some() {
                        changed.extend(arb.remove_scheduler(&claim.name));
                    }
                    self.claims.insert(claim.name.clone(), claim.clone());
                    changed.extend(arb.upsert_scheduler(claim));
                    changed
                }
                Event::RecreateUnseen { slot, created, selector, relist } => {
                    let claim = self.new_claim(name(slot), created, selector);
                    self.claims.insert(claim.name.clone(), claim.clone());
                    if relist {
                        arb.replace_schedulers(self.claims.values().cloned().collect())
                    } else {
                        arb.upsert_scheduler(claim)
                    }
                }
                Event::RemoveScheduler { slot } => {
                    self.claims.remove(&name(slot));
                    arb.remove_scheduler(&name(slot))
                }
                Event::UpsertNode { slot, labels } => {
                    self.nodes.insert(format!("n{slot}"), labels.clone());
                    arb.upsert_node(&format!("n{slot}"), labels)
                }
                Event::RemoveNode { slot } => {
                    self.nodes.remove(&format!("n{slot}"));
                    arb.remove_node(&format!("n{slot}"))
                }
                Event::ReplaceNodes { keep, new } => {
                    let mut i = 0;
                    self.nodes.retain(|_, _| {
                        i += 1;
                        keep[(i - 1) % keep.len()]
                    });
                    for (slot, labels) in new {
                        self.nodes.insert(format!("n{slot}"), labels);
                    }
                    arb.replace_nodes(self.nodes.clone())
                }
                Event::ReplaceSchedulers { keep } => {
                    let mut i = 0;
                    self.claims.retain(|_, _| {
                        i += 1;
                        keep[(i - 1) % keep.len()]
                    });
                    arb.replace_schedulers(self.claims.values().cloned().collect())
                }
            }
        }

        fn new_claim(&mut self, name: String, created: i64, selector: BTreeMap<String, String>) -> Claim {
            self.uids += 1;
            Claim { uid: format!("{name}-{}", self.uids), name, created, generation: 1, selector }
        }
    }

    proptest! {
        /// A random sequence of what the watches deliver (Schedulers created, their selectors
        /// changed, stale copies, recreations, deletions; nodes added, relabelled, removed;
        /// relists of either): after every event the arbiter's answer is a recompute's from
        /// the world as it stands, each Scheduler whose placement changed is reported, and a
        /// removed Scheduler is not.
        #[test]
        fn random_event_sequences_keep_the_arbiter_equal_to_a_recompute(
            events in proptest::collection::vec(arb_event(), 1..40)
        ) {
            let (mut world, mut arb) = (World::default(), Arbiter::new());
            for event in events {
                let before = arb.assignment();
                let changed = world.step(&mut arb, event.clone());
                let claims: Vec<Claim> = world.claims.values().cloned().collect();
                let after = assign(&claims, &world.nodes);
                prop_assert_eq!(&arb.assignment(), &after, "after {:?}", event);
                assert_changed_covers(&before, &after, &changed)?;
                prop_assert!(changed.iter().all(|s| world.claims.contains_key(s)), "{:?} reports {:?}", event, changed);
                let owners: BTreeMap<&str, Option<&str>> = arb.owners().map(|(n, _, o)| (n, o)).collect();
                for (node, labels) in &world.nodes {
                    let winner = after.iter().find(|(_, p)| p.owned.contains(node)).map(|(s, _)| s.as_str());
                    prop_assert_eq!(owners.get(node.as_str()).copied().flatten(), winner);
                    prop_assert_eq!(arb.owner(node), winner);
                    prop_assert_eq!(arb.node_labels(node), Some(labels));
                }
                prop_assert_eq!(arb.nodes().count(), world.nodes.len());
            }
        }
    }

    /// Every surviving Scheduler whose placement differs is reported as changed.
    fn assert_changed_covers(before: &Assignment, after: &Assignment, changed: &Changed) -> Result<(), TestCaseError> {
        for (name, placement) in after {
            let old = before.get(name).cloned().unwrap_or_default();
            if &old != placement {
                prop_assert!(changed.contains(name), "{name} changed but was not reported");
            }
        }
        Ok(())
    }
}
