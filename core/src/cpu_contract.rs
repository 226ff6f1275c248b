//! The pods' CPU contract where a Scheduler runs: whether the pods' CPU limits (`cpu.max`) and
//! requests (`cpu.weight`) still mean anything under its BPF scheduler, folded from its agents'
//! reports into the Scheduler's `PodCPUContract` condition.
//!
//! Under sched_ext the kernel enforces neither and hands both to the scheduler
//! (`ops.cgroup_set_bandwidth`, `ops.cgroup_set_weight`). Each agent says which of them the
//! running scheduler implements (read from its struct_ops map) and what the pods' cgroups showed
//! over its last window: how many pods have a limit, how many wanted it, and which used more.
//!
//! - Limits are broken where a pod was measured over its limit (the proof, whatever the
//!   scheduler implements), or where the scheduler lacks the callback and pods have limits.
//! - Requests are broken where the scheduler lacks `cgroup_set_weight` and pods have different
//!   weights.
//! - Where the scheduler lacks a callback and the pods could not be read, whether it costs a pod
//!   is not known: the condition is Unknown, never a guess either way.
//! - Implemented is not kept: a scheduler that takes a limit may still not enforce it. Only a pod
//!   measured over its limit proves that; a limited pod that never wants its limit proves
//!   nothing either way, and the condition never says "kept".

use sked_api::Reason;
use sked_proto::text::{MAX_NAME_CHARS, MAX_REASON_CHARS, escape_and_cap};

/// At most this many nodes are named in the condition's message.
const MAX_NODES_LISTED: usize = 3;
/// Most pods over their limit kept of one report.
pub const MAX_OVER_LIMIT: usize = 8;

/// Whether the running scheduler implements one cgroup callback.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Op {
    /// Not read (the agent said why, or sent nothing).
    #[default]
    Unknown,
    Implemented,
    /// The scheduler lacks it: the control is not enforced.
    Missing,
    /// The kernel has no such callback: nothing passes the control to the scheduler.
    NotInKernel,
}

impl Op {
    fn not_enforced(self) -> bool {
        matches!(self, Op::Missing | Op::NotInKernel)
    }

    /// Why the control is not enforced, naming the callback.
    fn why_not(self, callback: &str) -> String {
        match self {
            Op::NotInKernel => format!("this kernel has no ops.{callback} to pass it to a sched_ext scheduler"),
            _ => format!("the scheduler lacks ops.{callback}"),
        }
    }

    fn words(self, callback: &str) -> String {
        match self {
            Op::Unknown => "not read".to_owned(),
            Op::Implemented => format!("implemented (ops.{callback})"),
            Op::Missing => format!("not enforced (no ops.{callback})"),
            Op::NotInKernel => format!("not enforced (this kernel has no ops.{callback})"),
        }
    }
}

/// A pod measured above its CPU limit over one window, in thousandths of a CPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverLimit {
    pub uid: String,
    pub used_millicpu: u32,
    pub limit_millicpu: u32,
}

impl OverLimit {
    fn excess(&self) -> u32 {
        self.used_millicpu.saturating_sub(self.limit_millicpu)
    }
}

/// What the pods' cgroups on one node showed over the agent's last window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodCpu {
    pub pods: u32,
    /// Pods with a CPU limit.
    pub limited: u32,
    /// Limited pods that wanted their limit in the window.
    pub exercised: u32,
    /// Pods over their limit, worst first.
    pub over_limit: Vec<OverLimit>,
    /// How many different `cpu.weight` values the pods have.
    pub distinct_weights: u32,
    /// Why the pods could not be read (empty when they were).
    pub unavailable: String,
}

/// One node's CPU contract, as its agent reported it (escaped and capped by the controller).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeCpuContract {
    /// `ops.cgroup_set_bandwidth`: CPU limits.
    pub limits: Op,
    /// `ops.cgroup_set_weight`: CPU requests.
    pub requests: Op,
    /// Why the callbacks could not be read.
    pub unread: String,
    /// The pods' cgroups (`None`: the agent does not read them, or has no window under this
    /// scheduler yet).
    pub pods: Option<PodCpu>,
    /// The kernel's `enable_seq` when it was read: the scheduler instance it describes (a report
    /// under a new instance is a new fact even when it says the same).
    pub enable_seq: u64,
}

/// How the pods' CPU contract is broken on a node: what happened (`subject`, e.g. "pod UID u
/// used 1.38 CPU against its limit of 0.50") and why (`why`, the callback the scheduler lacks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Breach {
    pub subject: String,
    pub why: String,
    /// A pod was measured over its limit (the proof), rather than a callback found missing.
    pub measured: bool,
}

impl Breach {
    /// The cause as a rollout states it: "<subject> on node <node> under revision <revision>:
    /// <why>".
    pub fn cause(&self, node: &str, revision: &str) -> String {
        format!("{} on node {node} under revision {revision}: {}", self.subject, self.why)
    }
}

/// What a report's contract changes in the condition and the gate: a new report that keeps it
/// changes nothing worth a reconcile or a new entry in the node's history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Standing {
    limits: Op,
    requests: Op,
    pods_known: bool,
    limited: bool,
    over_limit: bool,
    weights_differ: bool,
}

impl NodeCpuContract {
    /// A report's contract as the controller keeps it: the node's words escaped and capped, its
    /// numbers bounded (a negative or non-finite number of CPUs is 0), an op this build does
    /// not know unknown.
    pub fn from_wire(c: &sked_proto::CpuContract) -> Self {
        use sked_proto::CgroupOp;
        let op = |wire: i32| match CgroupOp::try_from(wire) {
            Ok(CgroupOp::Implemented) => Op::Implemented,
            Ok(CgroupOp::Missing) => Op::Missing,
            Ok(CgroupOp::NotInKernel) => Op::NotInKernel,
            Ok(CgroupOp::Unknown) | Err(_) => Op::Unknown,
        };
        let milli = |cpus: f64| {
            // In range by the clamp: the cast neither wraps nor saturates unseen.
            if cpus.is_finite() && cpus > 0.0 { (cpus * 1000.0).min(f64::from(u32::MAX)) as u32 } else { 0 }
        };
        let pods = c.pods.as_ref().map(|p| PodCpu {
            pods: p.pods,
            limited: p.limited,
            exercised: p.exercised,
            over_limit: p
                .over_limit
                .iter()
                .take(MAX_OVER_LIMIT)
                .map(|o| OverLimit {
                    uid: escape_and_cap(&o.uid, MAX_NAME_CHARS),
                    used_millicpu: milli(o.used_cpus),
                    limit_millicpu: milli(o.limit_cpus),
                })
                .collect(),
            distinct_weights: p.distinct_weights,
            unavailable: escape_and_cap(&p.unavailable, MAX_REASON_CHARS),
        });
        Self {
            limits: op(c.limits),
            requests: op(c.requests),
            unread: escape_and_cap(&c.ops_unread, MAX_REASON_CHARS),
            pods,
            enable_seq: 0,
        }
    }

    /// The same, read under the scheduler instance `enable_seq`.
    pub fn under(self, enable_seq: u64) -> Self {
        Self { enable_seq, ..self }
    }

    /// The pods, when they were read.
    fn pods_read(&self) -> Option<&PodCpu> {
        self.pods.as_ref().filter(|p| p.unavailable.is_empty())
    }

    /// What makes this report a new entry in the node's history (`HealthTable`): its
    /// [`Standing`], the scheduler instance, and the pod measured over its limit, if any; not
    /// the numbers every window moves.
    pub fn same_fact_as(&self, other: &NodeCpuContract) -> bool {
        let worst = |c: &NodeCpuContract| c.pods_read().and_then(|p| p.over_limit.first()).map(|o| o.uid.clone());
        self.standing() == other.standing() && self.enable_seq == other.enable_seq && worst(self) == worst(other)
    }

    pub fn standing(&self) -> Standing {
        let pods = self.pods_read();
        Standing {
            limits: self.limits,
            requests: self.requests,
            pods_known: pods.is_some(),
            limited: pods.is_some_and(|p| p.limited > 0),
            over_limit: pods.is_some_and(|p| !p.over_limit.is_empty()),
            weights_differ: pods.is_some_and(|p| p.distinct_weights > 1),
        }
    }

    /// Whether the agent read anything of it: the scheduler's callbacks or the pods.
    pub fn said_anything(&self) -> bool {
        self.limits != Op::Unknown || self.requests != Op::Unknown || self.pods_known()
    }

    /// Whether the agent read the pods' cgroups: without them, nothing proves the contract held.
    pub fn pods_known(&self) -> bool {
        self.pods_read().is_some()
    }

    /// Why the pods' CPU contract is broken here, or `None` when it holds as far as the agent
    /// can tell: the worst pod measured over its limit first, then a missing callback that the
    /// pods read are known to need (pods not read yet prove nothing).
    pub fn breach(&self) -> Option<Breach> {
        let limits = || match self.limits {
            Op::Missing => "the scheduler does not enforce cpu.max (no ops.cgroup_set_bandwidth)".to_owned(),
            Op::NotInKernel => "this kernel passes cpu.max to no sched_ext scheduler".to_owned(),
            Op::Implemented => "the scheduler takes cpu.max (ops.cgroup_set_bandwidth) but does not keep it".to_owned(),
            Op::Unknown => format!(
                "the scheduler does not keep cpu.max (whether it implements ops.cgroup_set_bandwidth was not read: {})",
                self.unread
            ),
        };
        let pods = self.pods_read();
        if let Some(worst) = pods.and_then(|p| p.over_limit.first()) {
            let subject = format!(
                "pod UID {} used {} CPU against its limit of {}",
                worst.uid,
                cpus(worst.used_millicpu),
                cpus(worst.limit_millicpu)
            );
            return Some(Breach { subject, why: limits(), measured: true });
        }
        // A missing callback breaks the contract only where the pods are known to need it.
        let pods = pods?;
        if self.limits.not_enforced() && pods.limited > 0 {
            let subject = format!("{} pod(s) with a CPU limit run", pods.limited);
            return Some(Breach { subject, why: limits(), measured: false });
        }
        if self.requests.not_enforced() && pods.distinct_weights > 1 {
            let why = match self.requests {
                Op::NotInKernel => "this kernel passes cpu.weight to no sched_ext scheduler",
                _ => "the scheduler does not enforce cpu.weight (no ops.cgroup_set_weight)",
            };
            let subject = format!("pods with {} different CPU requests (cpu.weight) run", pods.distinct_weights);
            return Some(Breach { subject, why: why.to_owned(), measured: false });
        }
        None
    }

    /// Limits are not enforced here and it matters: a pod was measured over its limit, or the
    /// scheduler lacks the callback and pods read have limits.
    fn limits_broken(&self) -> bool {
        let s = self.standing();
        s.over_limit || (s.limits.not_enforced() && s.limited)
    }

    /// Requests are not enforced here and it matters.
    fn requests_broken(&self) -> bool {
        let s = self.standing();
        s.requests.not_enforced() && s.weights_differ
    }

    /// What the scheduler is handed, and the pod measured over its limit if any, in words that
    /// change only when the [`Standing`] or that pod does (the scheduler pod's condition
    /// carries them: a window's numbers would rewrite it every few seconds).
    pub fn brief(&self) -> String {
        use sked_api::pod_kernel::{CONTRACT_BROKEN, CONTRACT_HOLDS, CONTRACT_UNKNOWN};
        let pods = self.pods_read();
        if self.limits == Op::Unknown && self.requests == Op::Unknown {
            // The callbacks not read, the pods may still have been: one over its limit says it.
            let read = format!("CPU limits and requests: not read ({})", self.unread);
            return match pods.and_then(|p| p.over_limit.first()) {
                Some(o) => format!("{CONTRACT_BROKEN}{read}; pod UID {} measured over its limit", o.uid),
                None => read,
            };
        }
        let stake = |enforced: bool, at_stake: Option<bool>, what: &str| match (enforced, at_stake) {
            (true, _) => String::new(),
            (false, None) => ", the pods not read".to_owned(),
            (false, Some(true)) => format!(", and pods here have {what}"),
            (false, Some(false)) => format!(", but no pod here has {what}"),
        };
        let over = pods.and_then(|p| p.over_limit.first());
        let over = over.map(|o| format!(", pod UID {} measured over its limit", o.uid)).unwrap_or_default();
        let limits = stake(!self.limits.not_enforced(), pods.map(|p| p.limited > 0), "CPU limits");
        let requests = stake(!self.requests.not_enforced(), pods.map(|p| p.distinct_weights > 1), "different requests");
        let missing = self.limits.not_enforced() || self.requests.not_enforced();
        let verdict = if self.limits_broken() || self.requests_broken() {
            CONTRACT_BROKEN
        } else if missing && pods.is_none() {
            CONTRACT_UNKNOWN
        } else {
            CONTRACT_HOLDS
        };
        format!(
            "{verdict}CPU limits: {}{limits}{over}; CPU requests: {}{requests}",
            self.limits.words("cgroup_set_bandwidth"),
            self.requests.words("cgroup_set_weight")
        )
    }

    /// One line for a person: what the scheduler is handed and what the pods got.
    pub fn describe(&self) -> String {
        let mut line = format!(
            "CPU limits: {}; CPU requests: {}",
            self.limits.words("cgroup_set_bandwidth"),
            self.requests.words("cgroup_set_weight")
        );
        if !self.unread.is_empty() {
            line.push_str(&format!(" ({})", self.unread));
        }
        match (&self.pods, self.pods_read()) {
            (None, _) => line.push_str("; pods not read"),
            (Some(p), None) => line.push_str(&format!("; pods not read: {}", p.unavailable)),
            (_, Some(p)) => {
                line.push_str(&format!("; {} pods, {} limited, {} wanted their limit", p.pods, p.limited, p.exercised));
                if let Some(worst) = p.over_limit.first() {
                    line.push_str(&format!(
                        ", {} over it (worst: pod UID {} used {} CPU against {})",
                        p.over_limit.len(),
                        worst.uid,
                        cpus(worst.used_millicpu),
                        cpus(worst.limit_millicpu)
                    ));
                }
            }
        }
        line
    }
}

/// Thousandths of a CPU as CPUs, two decimals.
fn cpus(milli: u32) -> String {
    format!("{:.2}", f64::from(milli) / 1000.0)
}

/// The `PodCPUContract` condition, in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContractView {
    /// `None`: Unknown.
    pub status: Option<bool>,
    pub reason: Reason,
    pub message: String,
}

/// Folds the contracts of the nodes that run the Scheduler attached into its condition.
#[derive(Debug, Default)]
pub struct Fold {
    nodes: u32,
    unknown: Vec<String>,
    limits_broken: Vec<String>,
    limits_missing: Vec<(String, Op)>,
    requests_broken: Vec<String>,
    requests_missing: Vec<(String, Op)>,
    limited_pods: u64,
    /// Nodes whose pods were not read.
    pods_unread: u32,
    /// The pod most over its limit, its node, and what that node's scheduler was read to do
    /// with limits.
    worst: Option<(String, OverLimit, Op)>,
}

impl Fold {
    /// Adds one attached node's contract (`None`: its agent sent none).
    pub fn add(&mut self, node: &str, contract: Option<&NodeCpuContract>) {
        self.nodes += 1;
        let Some(c) = contract.filter(|c| c.limits != Op::Unknown || c.pods_known()) else {
            self.unknown.push(node.to_owned());
            return;
        };
        if c.limits.not_enforced() {
            self.limits_missing.push((node.to_owned(), c.limits));
        }
        if c.requests.not_enforced() {
            self.requests_missing.push((node.to_owned(), c.requests));
        }
        if c.limits_broken() {
            self.limits_broken.push(node.to_owned());
        }
        if c.requests_broken() {
            self.requests_broken.push(node.to_owned());
        }
        if !c.pods_known() {
            self.pods_unread += 1;
        }
        if let Some(p) = c.pods_read() {
            self.limited_pods += u64::from(p.limited);
            if let Some(w) = p.over_limit.first()
                && self.worst.as_ref().is_none_or(|(_, worst, _)| w.excess() > worst.excess())
            {
                self.worst = Some((node.to_owned(), w.clone(), c.limits));
            }
        }
        // A missing callback with the pods unread: whether it costs any pod is not known.
        let unread_stake = !c.pods_known() && (c.limits.not_enforced() || c.requests.not_enforced());
        if c.limits == Op::Unknown || c.requests == Op::Unknown || unread_stake {
            self.unknown.push(node.to_owned());
        }
    }

    /// The condition the nodes added make.
    pub fn finish(self) -> ContractView {
        let n = self.nodes;
        if n == 0 {
            return view(None, Reason::ContractUnknown, "No node runs this scheduler attached".to_owned());
        }
        if !self.limits_broken.is_empty() {
            return view(Some(false), Reason::LimitsNotEnforced, self.limits_message());
        }
        if !self.requests_broken.is_empty() {
            let (node, op) = self.requests_missing.first().cloned().unwrap_or_default();
            let message = format!(
                "Pods' CPU requests (cpu.weight) are not enforced on {} of {n} nodes: {} ({}), and their pods have \
                 different requests, so CPU is shared as the scheduler decides, not by request. Run a scheduler \
                 that implements ops.cgroup_set_weight, or accept shares that ignore requests on these nodes",
                self.requests_broken.len(),
                op.why_not("cgroup_set_weight"),
                listed(&self.requests_broken, &node),
            );
            return view(Some(false), Reason::RequestsNotEnforced, message);
        }
        if !self.unknown.is_empty() {
            let message = format!(
                "{} of {n} nodes did not say whether the scheduler keeps pods' CPU limits and requests ({})",
                self.unknown.len(),
                listed(&self.unknown, "")
            );
            return view(None, Reason::ContractUnknown, message);
        }
        if self.limits_missing.is_empty() && self.requests_missing.is_empty() {
            let message = format!(
                "The scheduler implements ops.cgroup_set_bandwidth and ops.cgroup_set_weight on all {n} nodes, and \
                 no pod was measured over its CPU limit ({} limited pods{})",
                self.limited_pods,
                self.unread_pods_words()
            );
            return view(Some(true), Reason::CpuControlsImplemented, message);
        }
        let message = format!(
            "The scheduler does not enforce pods' CPU limits on {} and requests on {} of {n} nodes, but no pod there \
             has a CPU limit or a request that differs from the others'",
            self.limits_missing.len(),
            self.requests_missing.len()
        );
        view(Some(true), Reason::NothingAtStake, message)
    }

    /// "; the pods of N nodes not read", when some were not.
    fn unread_pods_words(&self) -> String {
        match self.pods_unread {
            0 => String::new(),
            k => format!("; the pods of {k} of {} nodes not read", self.nodes),
        }
    }

    fn limits_message(&self) -> String {
        let n = self.nodes;
        let broken = self.limits_broken.len();
        let mut message = match &self.worst {
            Some((node, w, _)) => format!(
                "Pods' CPU limits (cpu.max) are not enforced: pod UID {} used {} CPU against its limit of {} on node \
                 {node}; ",
                w.uid,
                cpus(w.used_millicpu),
                cpus(w.limit_millicpu)
            ),
            None => "Pods' CPU limits (cpu.max) are not enforced: ".to_owned(),
        };
        // The node of the worst pod first, when it lacks the callback too.
        let worst_node = self.worst.as_ref().map(|(node, _, _)| node.as_str());
        let first = self.limits_missing.iter().find(|(n, _)| Some(n.as_str()) == worst_node);
        match first.or(self.limits_missing.first()) {
            Some((node, op)) => message.push_str(&format!(
                "{} on {} of {n} nodes ({})",
                op.why_not("cgroup_set_bandwidth"),
                self.limits_missing.len(),
                listed(&self.limits_missing.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(), node)
            )),
            None => message.push_str(match self.worst.as_ref().map(|(_, _, op)| *op) {
                Some(Op::Unknown) => {
                    "whether the scheduler implements ops.cgroup_set_bandwidth was not read, and it does not keep them"
                }
                _ => "the scheduler implements ops.cgroup_set_bandwidth but does not keep them",
            }),
        }
        let limited = match self.limited_pods {
            0 => "no pod read has a CPU limit".to_owned(),
            1 => "1 pod has a CPU limit".to_owned(),
            many => format!("{many} pods have CPU limits"),
        };
        let limited = format!("{limited}{}", self.unread_pods_words());
        message.push_str(&format!(
            ", where {limited} ({broken} of {n} nodes affected). Run a scheduler that enforces cpu.max, or keep \
             pods with CPU limits off these nodes"
        ));
        message
    }
}

fn view(status: Option<bool>, reason: Reason, message: String) -> ContractView {
    ContractView { status, reason, message }
}

/// Up to [`MAX_NODES_LISTED`] of `nodes`, `first` first when given, and how many more.
fn listed(nodes: &[String], first: &str) -> String {
    let mut names: Vec<&str> = Vec::new();
    if !first.is_empty() {
        names.push(first);
    }
    names.extend(nodes.iter().map(String::as_str).filter(|n| *n != first));
    let more = names.len().saturating_sub(MAX_NODES_LISTED);
    names.truncate(MAX_NODES_LISTED);
    let mut text = names.join(", ");
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(limited: u32, over: &[(u32, u32)], weights: u32) -> PodCpu {
        PodCpu {
            pods: limited + 2,
            limited,
            exercised: over.len() as u32,
            over_limit: over
                .iter()
                .enumerate()
                .map(|(i, (used, limit))| OverLimit {
                    uid: format!("uid-{i}"),
                    used_millicpu: *used,
                    limit_millicpu: *limit,
                })
                .collect(),
            distinct_weights: weights,
            unavailable: String::new(),
        }
    }

    fn node(limits: Op, requests: Op, pods: Option<PodCpu>) -> NodeCpuContract {
        NodeCpuContract { limits, requests, unread: String::new(), pods, enable_seq: 0 }
    }

    fn fold(nodes: &[(&str, Option<NodeCpuContract>)]) -> ContractView {
        let mut f = Fold::default();
        for (name, c) in nodes {
            f.add(name, c.as_ref());
        }
        f.finish()
    }

    #[test]
    fn a_pod_over_its_limit_names_the_pod_the_node_and_the_missing_callback() {
        let v = fold(&[
            ("n1", Some(node(Op::Missing, Op::Missing, Some(pods(2, &[], 1))))),
            ("n7", Some(node(Op::Missing, Op::Missing, Some(pods(1, &[(1380, 500)], 1))))),
        ]);
        assert_eq!((v.status, v.reason), (Some(false), Reason::LimitsNotEnforced));
        assert!(
            v.message.contains("pod UID uid-0 used 1.38 CPU against its limit of 0.50 on node n7"),
            "{}",
            v.message
        );
        assert!(
            v.message.contains("the scheduler lacks ops.cgroup_set_bandwidth on 2 of 2 nodes (n7, n1)"),
            "{}",
            v.message
        );
        assert!(v.message.contains("where 3 pods have CPU limits"), "{}", v.message);
    }

    #[test]
    fn a_pod_over_its_limit_breaks_limits_whatever_the_scheduler_implements() {
        let v = fold(&[("n1", Some(node(Op::Implemented, Op::Implemented, Some(pods(1, &[(900, 500)], 1)))))]);
        assert_eq!(v.reason, Reason::LimitsNotEnforced);
        assert!(v.message.contains("implements ops.cgroup_set_bandwidth but does not keep them"), "{}", v.message);
    }

    #[test]
    fn a_missing_callback_matters_only_where_pods_need_it_or_are_unknown() {
        let quiet = fold(&[("n1", Some(node(Op::Missing, Op::Missing, Some(pods(0, &[], 1)))))]);
        assert_eq!((quiet.status, quiet.reason), (Some(true), Reason::NothingAtStake));
        let limited = fold(&[("n1", Some(node(Op::Missing, Op::Implemented, Some(pods(3, &[], 1)))))]);
        assert_eq!(limited.reason, Reason::LimitsNotEnforced, "limited pods, no callback: not enforced");
        let unread = PodCpu { unavailable: "no kubepods cgroup".into(), ..PodCpu::default() };
        let blind = fold(&[("n1", Some(node(Op::NotInKernel, Op::Implemented, Some(unread))))]);
        assert_eq!((blind.status, blind.reason), (None, Reason::ContractUnknown), "whether it costs a pod is unknown");
        let implemented_blind = fold(&[("n1", Some(node(Op::Implemented, Op::Implemented, None)))]);
        assert!(implemented_blind.message.ends_with("(0 limited pods; the pods of 1 of 1 nodes not read)"));
        let weights = fold(&[("n1", Some(node(Op::Implemented, Op::Missing, Some(pods(0, &[], 3)))))]);
        assert_eq!((weights.status, weights.reason), (Some(false), Reason::RequestsNotEnforced));
    }

    #[test]
    fn implemented_everywhere_with_no_pod_over_is_true_and_never_says_kept() {
        let v = fold(&[("n1", Some(node(Op::Implemented, Op::Implemented, Some(pods(4, &[], 2)))))]);
        assert_eq!((v.status, v.reason), (Some(true), Reason::CpuControlsImplemented));
        assert!(!v.message.contains("kept"), "{}", v.message);
    }

    #[test]
    fn a_node_that_did_not_say_leaves_the_condition_unknown_unless_another_shows_a_breach() {
        let unknown =
            fold(&[("n1", None), ("n2", Some(node(Op::Implemented, Op::Implemented, Some(pods(1, &[], 1)))))]);
        assert_eq!((unknown.status, unknown.reason), (None, Reason::ContractUnknown));
        assert!(unknown.message.starts_with("1 of 2 nodes did not say"), "{}", unknown.message);
        let breach = fold(&[("n1", None), ("n2", Some(node(Op::Missing, Op::Missing, Some(pods(1, &[], 1)))))]);
        assert_eq!(breach.reason, Reason::LimitsNotEnforced);
        assert_eq!(fold(&[]).status, None);
    }

    #[test]
    fn the_worst_pod_is_the_one_most_over() {
        let v = fold(&[
            ("a", Some(node(Op::Missing, Op::Missing, Some(pods(1, &[(700, 500)], 1))))),
            ("b", Some(node(Op::Missing, Op::Missing, Some(pods(1, &[(2000, 1000)], 1))))),
        ]);
        assert!(v.message.contains("used 2.00 CPU against its limit of 1.00 on node b"), "{}", v.message);
    }

    #[test]
    fn a_report_s_standing_ignores_the_numbers_that_move_every_window() {
        let a = node(Op::Missing, Op::Missing, Some(pods(3, &[(1380, 500)], 2)));
        let mut b = a.clone();
        b.pods.as_mut().unwrap().over_limit[0].used_millicpu = 1400;
        b.pods.as_mut().unwrap().limited = 4;
        assert_eq!(a.standing(), b.standing());
        b.pods.as_mut().unwrap().over_limit.clear();
        assert_ne!(a.standing(), b.standing());
    }

    #[test]
    fn a_hostile_report_is_escaped_capped_and_bounded() {
        let over =
            |uid: &str, used: f64| sked_proto::PodOverLimit { uid: uid.into(), used_cpus: used, limit_cpus: 0.5 };
        let wire = sked_proto::CpuContract {
            limits: 99,
            requests: sked_proto::CgroupOp::Missing as i32,
            ops_unread: "x\u{1b}[31m".repeat(200),
            pods: Some(sked_proto::PodCpu {
                over_limit: [over("a\nb", f64::NAN), over("c", -3.0), over("d", 1e30)]
                    .into_iter()
                    .chain((0..20).map(|i| over(&i.to_string(), 1.0)))
                    .collect(),
                ..Default::default()
            }),
        };
        let c = NodeCpuContract::from_wire(&wire);
        assert_eq!((c.limits, c.requests), (Op::Unknown, Op::Missing), "an op this build does not know");
        assert!(c.unread.chars().count() <= MAX_REASON_CHARS + 32 && !c.unread.contains('\u{1b}'), "{}", c.unread);
        let pods = c.pods.unwrap();
        assert_eq!(pods.over_limit.len(), MAX_OVER_LIMIT);
        let used: Vec<u32> = pods.over_limit.iter().take(3).map(|o| o.used_millicpu).collect();
        assert_eq!(used, [0, 0, u32::MAX]);
        assert_eq!(pods.over_limit[0].uid, "a\\nb");
    }

    #[test]
    fn a_node_is_described_in_one_line() {
        let c = node(Op::Missing, Op::Implemented, Some(pods(2, &[(1380, 500)], 1)));
        assert_eq!(
            c.describe(),
            "CPU limits: not enforced (no ops.cgroup_set_bandwidth); CPU requests: implemented \
             (ops.cgroup_set_weight); 4 pods, 2 limited, 1 wanted their limit, 1 over it (worst: pod UID uid-0 used \
             1.38 CPU against 0.50)"
        );
        assert!(node(Op::Unknown, Op::Unknown, None).describe().ends_with("pods not read"));
        assert_eq!(
            c.brief(),
            "the pods' CPU contract is broken: CPU limits: not enforced (no ops.cgroup_set_bandwidth), and pods here \
             have CPU limits, pod UID uid-0 measured over its limit; CPU requests: implemented (ops.cgroup_set_weight)"
        );
        let quiet = node(Op::Missing, Op::Missing, Some(pods(0, &[], 1)));
        assert_eq!(
            quiet.brief(),
            "the pods' CPU contract holds as far as read: CPU limits: not enforced (no ops.cgroup_set_bandwidth), but \
             no pod here has CPU limits; CPU requests: not enforced (no ops.cgroup_set_weight), but no pod here has \
             different requests"
        );
        let unread = NodeCpuContract { unread: "no CAP_SYS_ADMIN".into(), ..NodeCpuContract::default() };
        assert_eq!(unread.brief(), "CPU limits and requests: not read (no CAP_SYS_ADMIN)");
        // The callbacks not read and a pod measured over its limit: broken, and not said to
        // implement anything.
        let over = NodeCpuContract { pods: Some(pods(1, &[(1380, 500)], 1)), ..unread };
        assert_eq!(
            over.brief(),
            "the pods' CPU contract is broken: CPU limits and requests: not read (no CAP_SYS_ADMIN); pod UID uid-0 \
             measured over its limit"
        );
        let breach = over.breach().unwrap_or_else(|| panic!("a breach"));
        assert_eq!(
            breach.why,
            "the scheduler does not keep cpu.max (whether it implements ops.cgroup_set_bandwidth was not read: no \
             CAP_SYS_ADMIN)"
        );
        let v = fold(&[("n1", Some(over))]);
        assert_eq!(v.reason, Reason::LimitsNotEnforced);
        assert!(
            v.message.contains("ops.cgroup_set_bandwidth was not read, and it does not keep them"),
            "{}",
            v.message
        );
    }
}
