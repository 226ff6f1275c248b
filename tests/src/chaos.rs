//! The fault matrix of `make chaos` (`src/bin/sked-chaos.rs`) and how its outcomes are judged:
//! which rollout steps and faults there are, who led when (from the API server's audit log), and
//! the table it prints. The judging is pure and unit-tested here; the driver runs the processes.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::cluster::AuditedWrite;

/// Where a rollout stands when the fault comes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// A first deployment's canary is attaching (no revision ran before).
    FirstDeployment,
    /// A new revision's canary is attaching.
    CanaryAttaching,
    /// The canary attached and is baking.
    CanaryBaking,
    /// A wave's nodes are attaching.
    WaveAttaching,
    /// A wave attached and is baking.
    WaveBaking,
    /// The revision failed on its canary; the rollback is putting the node back.
    RollingBack,
    /// The canary of a Scheduler with `spec.rollout.analysis` is baking: its window before its
    /// switch is frozen in status, and its verdict comes at the end of the bake.
    AnalysedBaking,
}

impl Step {
    pub const ALL: [Step; 7] = [
        Step::FirstDeployment,
        Step::CanaryAttaching,
        Step::CanaryBaking,
        Step::WaveAttaching,
        Step::WaveBaking,
        Step::RollingBack,
        Step::AnalysedBaking,
    ];

    /// A short name, for Scheduler names and the table.
    pub const fn name(self) -> &'static str {
        match self {
            Step::FirstDeployment => "first-deployment",
            Step::CanaryAttaching => "canary-attaching",
            Step::CanaryBaking => "canary-baking",
            Step::WaveAttaching => "wave-attaching",
            Step::WaveBaking => "wave-baking",
            Step::RollingBack => "rolling-back",
            Step::AnalysedBaking => "analysed-baking",
        }
    }
}

/// What goes wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// The leading replica is killed (SIGKILL), and started again once the other leads.
    LeaderKilled,
    /// The leading replica is frozen (SIGSTOP) until the other leads and a while past, then
    /// thawed (SIGCONT): it wakes believing it still leads.
    LeaderFrozen,
    /// kube-apiserver is killed and started again a few seconds later.
    ApiServerRestarted,
    /// The agent of the step's node is killed and started again.
    AgentRestarted,
    /// Every byte between the agents and the replicas is held for longer than the stale limit,
    /// then let through.
    AgentPathStalled,
    /// The step's node goes NotReady (its kubelet stops posting) and stays so.
    NodeNotReady,
    /// The step's node is deleted.
    NodeDeleted,
}

impl Fault {
    pub const ALL: [Fault; 7] = [
        Fault::LeaderKilled,
        Fault::LeaderFrozen,
        Fault::ApiServerRestarted,
        Fault::AgentRestarted,
        Fault::AgentPathStalled,
        Fault::NodeNotReady,
        Fault::NodeDeleted,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Fault::LeaderKilled => "leader-killed",
            Fault::LeaderFrozen => "leader-frozen",
            Fault::ApiServerRestarted => "apiserver-restarted",
            Fault::AgentRestarted => "agent-restarted",
            Fault::AgentPathStalled => "agent-path-stalled",
            Fault::NodeNotReady => "node-not-ready",
            Fault::NodeDeleted => "node-deleted",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Whether the fault befalls the step's node (not the control plane).
    pub const fn on_the_node(self) -> bool {
        matches!(self, Fault::AgentRestarted | Fault::NodeNotReady | Fault::NodeDeleted)
    }
}

/// How one cell ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The rollout's phase at the end (`Complete`, `RolledBack`), or what it was stuck at.
    pub phase: String,
    /// Seconds from the fault's end to the settled status; `None`: it did not settle.
    pub settled_after: Option<f64>,
    /// What broke a rule; empty when none.
    pub violations: Vec<String>,
}

impl Outcome {
    fn cell(&self) -> String {
        match (&self.settled_after, self.violations.is_empty()) {
            (Some(s), true) => format!("{} {s:.0}s", self.phase),
            (None, true) => format!("{} (did not settle)", self.phase),
            (_, false) => format!("VIOLATION: {}", self.violations.join("; ")),
        }
    }

    pub fn passed(&self) -> bool {
        self.settled_after.is_some() && self.violations.is_empty()
    }
}

/// The table of outcomes, fault by step, as markdown.
pub fn table(outcomes: &BTreeMap<(Fault, Step), Outcome>) -> String {
    let mut out = String::from("| fault |");
    for step in Step::ALL {
        let _ = write!(out, " {} |", step.name());
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(Step::ALL.len()));
    out.push('\n');
    for fault in Fault::ALL {
        if !outcomes.keys().any(|(f, _)| *f == fault) {
            continue;
        }
        let _ = write!(out, "| {} |", fault.name());
        for step in Step::ALL {
            let cell = outcomes.get(&(fault, step)).map_or_else(|| "-".to_owned(), Outcome::cell);
            let _ = write!(out, " {cell} |");
        }
        out.push('\n');
    }
    out
}

/// The writes that a replica made while another held the Lease `lease`: each write by a replica
/// (one of `replicas`, as the audit log names its user) that changed state is judged against the
/// holder the last successful write of the Lease before it left (its writer, when the audit
/// log does not say); it is the writer's own, or a violation.
/// A replica that wrote before any Lease write is a violation too.
pub fn writes_while_not_leading<'a>(
    writes: &'a [AuditedWrite],
    replicas: &[&str],
    lease: &str,
) -> Vec<&'a AuditedWrite> {
    let mut leader: Option<&str> = None;
    let mut violations = Vec::new();
    for w in writes {
        if !replicas.contains(&w.user.as_str()) || !(200..300).contains(&w.code) || !w.changes_state() {
            continue;
        }
        if w.resource == "leases" && w.name == lease {
            // The holder the write left (replica identities are `<user>_<suffix>`): a renewal
            // sent by a replica the Lease has moved away from leaves its new holder in place.
            leader = match w.holder.as_deref() {
                Some(holder) => {
                    replicas.iter().copied().find(|r| holder.strip_prefix(*r).is_some_and(|rest| rest.starts_with('_')))
                }
                None => Some(&w.user),
            };
            continue;
        }
        if leader != Some(w.user.as_str()) {
            violations.push(w);
        }
    }
    violations
}

/// The nodes whose pod was replaced by a pod of the same revision (a scheduler restarted for
/// nothing), from each node's pods' revisions in order.
pub fn replaced_by_same_revision(revisions: &BTreeMap<String, Vec<String>>) -> Vec<String> {
    revisions.iter().filter(|(_, r)| r.windows(2).any(|w| w[0] == w[1])).map(|(node, _)| node.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(user: &str, resource: &str, second: i64) -> AuditedWrite {
        AuditedWrite {
            user: user.into(),
            verb: "patch".into(),
            resource: resource.into(),
            subresource: String::new(),
            namespace: "sked-system".into(),
            name: if resource == "leases" { "lease".into() } else { "x".into() },
            code: 200,
            received: jiff::Timestamp::from_second(second).unwrap_or_default(),
            holder: None,
        }
    }

    #[test]
    fn a_write_is_its_writers_only_while_its_last_lease_write_is_the_latest() {
        let writes = vec![
            write("a", "leases", 1),
            write("a", "daemonsets", 2),
            write("b", "leases", 5),
            write("b", "pods", 6),
            // a thawed: its lease is gone, but it writes.
            write("a", "schedulers", 7),
            write("kube-controller-manager", "pods", 8),
        ];
        let bad = writes_while_not_leading(&writes, &["a", "b"], "lease");
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert_eq!((bad[0].user.as_str(), bad[0].resource.as_str()), ("a", "schedulers"));
        // A failed write of the Lease (a conflict) makes nobody the leader.
        let mut refused = write("a", "leases", 6);
        refused.code = 409;
        let writes = vec![write("b", "leases", 5), refused, write("b", "pods", 7)];
        assert!(writes_while_not_leading(&writes, &["a", "b"], "lease").is_empty());
        // A renewal a replica sends after the Lease moved on leaves the holder in place (the
        // answer says who holds it): the holder's writes after it are its own.
        let stale = AuditedWrite { holder: Some("b_18ee".into()), ..write("a", "leases", 6) };
        let writes = vec![write("b", "leases", 5), stale, write("b", "pods", 7)];
        assert!(writes_while_not_leading(&writes, &["a", "b"], "lease").is_empty());
        let taken = AuditedWrite { holder: Some("a_18ee".into()), ..write("a", "leases", 6) };
        let writes = vec![write("b", "leases", 5), taken, write("b", "pods", 7)];
        assert_eq!(writes_while_not_leading(&writes, &["a", "b"], "lease").len(), 1, "a holds it now");
        // Writing before any lease write is not leading.
        assert_eq!(writes_while_not_leading(&[write("a", "pods", 1)], &["a"], "lease").len(), 1);
    }

    #[test]
    fn a_pod_replaced_by_its_own_revision_is_named() {
        let revisions = BTreeMap::from([
            ("n-1".to_owned(), vec!["r1".to_owned(), "r2".to_owned(), "r1".to_owned()]),
            ("n-2".to_owned(), vec!["r1".to_owned(), "r2".to_owned(), "r2".to_owned()]),
        ]);
        assert_eq!(replaced_by_same_revision(&revisions), vec!["n-2".to_owned()]);
    }

    #[test]
    fn the_table_has_a_row_per_fault_run_and_a_column_per_step() {
        let ok = Outcome { phase: "Complete".into(), settled_after: Some(12.4), violations: vec![] };
        let bad = Outcome { phase: "Rolling".into(), settled_after: None, violations: vec!["x".into()] };
        let outcomes = BTreeMap::from([
            ((Fault::LeaderKilled, Step::CanaryBaking), ok.clone()),
            ((Fault::LeaderKilled, Step::WaveBaking), bad),
        ]);
        let t = table(&outcomes);
        assert_eq!(t.lines().count(), 3, "{t}");
        assert!(t.contains("| leader-killed | - | - | Complete 12s | - | VIOLATION: x | - |"), "{t}");
        assert!(ok.passed());
    }
}
