//! `kubectl sked doctor NODE`: what sked knows of one node, and the one thing to do next, from
//! the same [`Fleet`] the other commands read. Pure: tested without a server.

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use serde::Serialize;
use sked_api::Scheduler;
use sked_api::labels::{KERNEL_LABEL, OWNER_LABEL, SCHED_EXT_LABEL, UNSUPPORTED};
use sked_api::pod_kernel::PodKernel;
use sked_core::arbiter::Claim;
use sked_core::nodes::{NodeFacts, describe_taint};

use crate::fleet::{Fleet, StatusRow};

/// What `doctor` found.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Diagnosis {
    pub node: String,
    /// What is known, as `(what, value)` lines.
    pub facts: Vec<(String, String)>,
    /// What to do, most pressing first; empty: nothing.
    pub advice: Vec<String>,
}

/// Diagnoses `node` (which must be in `fleet.nodes`) of a fleet whose pods live in `namespace`.
pub fn diagnose(fleet: &Fleet, node: &Node, namespace: &str) -> Diagnosis {
    let name = node.name_any();
    let labels = node.labels();
    let mut facts = Vec::new();
    let mut advice = Vec::new();
    let mut fact = |what: &str, value: String| facts.push((what.to_owned(), value));
    let kernel_version = node
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.kernel_version.clone())
        .filter(|v| !v.is_empty());
    fact("kernel", kernel_version.clone().unwrap_or_else(|| "unknown".into()));
    fact(
        "sched_ext",
        labels.get(SCHED_EXT_LABEL).cloned().unwrap_or_else(|| "not known yet (no scheduler reported from it)".into()),
    );
    let owner = labels.get(OWNER_LABEL).cloned();
    fact("owner label", owner.clone().unwrap_or_else(|| "none (the kernel's default scheduler)".into()));

    // Who claims it, in the arbiter's order: the oldest Scheduler first, then by name.
    let mut claims: Vec<(&Scheduler, Claim)> = fleet
        .schedulers
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .map(|s| (s, Claim::of(s)))
        .filter(|(_, c)| c.selects(labels))
        .collect();
    claims.sort_by(|a, b| (a.1.created, &a.1.name).cmp(&(b.1.created, &b.1.name)));
    let names: Vec<&str> = claims.iter().map(|(_, c)| c.name.as_str()).collect();
    fact("selected by", if names.is_empty() { "no Scheduler".into() } else { names.join(", ") });
    let Some((winner, _)) = claims.first() else {
        advice.push(format!(
            "No Scheduler selects {name}: label it to match a Scheduler's spec.nodeSelector (kubectl label node {name} KEY=VALUE), or leave it on the kernel's default scheduler"
        ));
        return Diagnosis { node: name, facts, advice };
    };
    let winner_name = winner.name_any();
    let why = if claims.len() > 1 { " (the oldest of those that select it, ties broken by name)" } else { "" };
    fact("would be owned by", format!("{winner_name}{why}"));

    if labels.get(SCHED_EXT_LABEL).map(String::as_str) == Some(UNSUPPORTED) {
        let judged = labels.get(KERNEL_LABEL).cloned().or(kernel_version).unwrap_or_else(|| "its kernel".into());
        advice.push(format!(
            "The node's kernel ({judged}) has no sched_ext: boot a kernel built with CONFIG_SCHED_CLASS_EXT=y (Linux 6.12 or later); sked leaves {name} out until its kernel changes"
        ));
        return Diagnosis { node: name, facts, advice };
    }
    let node_facts = NodeFacts::of(node);
    if let Some(not_ready) = &node_facts.not_ready {
        fact("node", format!("not ready: {}", not_ready.describe()));
        advice.push(not_ready_advice(&name, &winner_name, not_ready));
    }
    let taints: Vec<String> =
        node_facts.all_untolerated(&winner.spec.tolerations).into_iter().map(describe_taint).collect();
    if !taints.is_empty() {
        fact("taints kept away", taints.join(", "));
        advice.push(format!(
            "Scheduler {winner_name} does not tolerate {}: add a matching toleration to its spec.tolerations, or remove the taint",
            taints.join(", ")
        ));
    }
    let rows = fleet.status_rows(winner, None);
    let row = rows.iter().find(|r| r.node == name && !r.terminating);
    match (owner.as_deref(), row) {
        (_, Some(row)) => pod_advice(&mut facts, &mut advice, row, namespace),
        (Some(o), None) if o == winner_name => advice.push(format!(
            "No pod of {winner_name} on {name} yet: see kubectl -n {namespace} describe daemonset {winner_name}, and kubectl -n {namespace} get pods -l name={winner_name} -o wide"
        )),
        (Some(other), None) => advice.push(format!(
            "The owner label still names {other}; the controller hands the node to {winner_name} in {winner_name}'s rollout (kubectl sked rollout status {winner_name})"
        )),
        (None, None) => advice.push(format!(
            "{winner_name}'s rollout has not reached {name}: it runs the kernel's default scheduler until its wave (kubectl sked rollout status {winner_name})"
        )),
    }
    Diagnosis { node: name, facts, advice }
}

/// What to do about a node that is not ready: the node's own trouble, which no toleration helps
/// and no rollout waits for.
fn not_ready_advice(name: &str, winner: &str, not_ready: &sked_core::nodes::NotReady) -> String {
    format!(
        "{name} cannot run a pod now: {}. Its kubelet must report it Ready (check the kubelet and container runtime on the node, e.g. systemctl status kubelet; kubectl describe node {name}). Until then {winner}'s rollouts skip it (NodeNotReady in status.rollout.skippedReasons) without waiting; it enters by itself once Ready",
        not_ready.describe()
    )
}

/// The facts of the node's pod, and what its kernel state asks for.
fn pod_advice(facts: &mut Vec<(String, String)>, advice: &mut Vec<String>, row: &StatusRow, namespace: &str) {
    let pod = row.pod.clone().unwrap_or_default();
    facts.push((
        "pod".into(),
        format!("{namespace}/{pod} (ready: {}, restarts: {})", row.ready.unwrap_or(false), row.restarts),
    ));
    let state = match (&row.reason, &row.message) {
        (Some(reason), Some(message)) => PodKernel::parse(reason, message),
        _ => None,
    };
    let since = row.since.as_deref().map(|s| format!(" since {s}")).unwrap_or_default();
    facts.push((
        "kernel state".into(),
        format!("{}{since}: {}", row.kernel, row.message.as_deref().unwrap_or("no report yet")),
    ));
    let scheduler = &row.scheduler;
    advice.push(match state {
        Some(PodKernel::Attached { ops, contract }) if contract.is_empty() => {
            format!("Nothing to do: the kernel runs {scheduler}'s scheduler (ops {ops}){since}")
        }
        Some(PodKernel::Attached { ops, contract }) if contract.starts_with(sked_api::pod_kernel::CONTRACT_BROKEN) => format!(
            "The kernel runs {scheduler}'s scheduler (ops {ops}){since}, but the pods' CPU limits or requests mean \
             nothing under it ({contract}): run a scheduler that enforces them, or keep pods with CPU limits off this node"
        ),
        Some(PodKernel::Attached { ops, contract }) => {
            format!("Nothing to do: the kernel runs {scheduler}'s scheduler (ops {ops}){since}; {contract}")
        }
        Some(PodKernel::Foreign { ops }) => format!(
            "Another scheduler owns the kernel (ops {ops}), started outside sked: stop it on the node (its service or process), and {scheduler}'s scheduler can attach"
        ),
        Some(PodKernel::NotAttached { said }) => format!(
            "{scheduler}'s scheduler is not attached ({said}): read its log, kubectl -n {namespace} logs {pod} -c scx"
        ),
        Some(PodKernel::Ejected { reason, time, .. }) => format!(
            "The kernel ejected {scheduler}'s scheduler at {time} ({reason}): read kubectl -n {namespace} logs {pod} -c scx --previous and kubectl describe scheduler {scheduler}"
        ),
        Some(PodKernel::Stale { after }) => format!(
            "The node's agent has not reported for more than {after}: read kubectl -n {namespace} logs {pod} -c agent, and check that it reaches the sked-reports Service"
        ),
        Some(PodKernel::Unsupported { said }) => format!(
            "The node's kernel has no sched_ext ({said}): boot a kernel built with CONFIG_SCHED_CLASS_EXT=y"
        ),
        None => format!(
            "No kernel report for {pod} yet: wait for its agent's first report, or read kubectl -n {namespace} logs {pod} -c agent"
        ),
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_objects::{node, pod, rolling, scheduler};
    use serde_json::json;

    fn diagnosis(pods: Vec<k8s_openapi::api::core::v1::Pod>, n: Node) -> Diagnosis {
        let rusty = scheduler("rusty", "2026-12-04T09:00:00Z", json!({"pool": "a"}), rolling("cur", "upd"));
        let fleet = Fleet { schedulers: vec![rusty], pods, nodes: Some(vec![n.clone()]) };
        diagnose(&fleet, &n, "sked-system")
    }

    fn fact<'a>(d: &'a Diagnosis, what: &str) -> &'a str {
        d.facts.iter().find(|(w, _)| w == what).map_or("", |(_, v)| v.as_str())
    }

    #[test]
    fn a_node_no_scheduler_selects_is_told_how_to_join_one() {
        let d = diagnosis(vec![], node("n", json!({"pool": "b"}), json!([])));
        assert_eq!(fact(&d, "selected by"), "no Scheduler");
        assert!(d.advice[0].contains("kubectl label node n"), "{:?}", d.advice);
    }

    #[test]
    fn a_kernel_without_sched_ext_is_named() {
        let labels = json!({"pool": "a", "sked.schedkit.io/sched-ext": "unsupported", "sked.schedkit.io/sched-ext-kernel": "6.1.0-28"});
        let d = diagnosis(vec![], node("n", labels, json!([])));
        assert!(d.advice[0].contains("(6.1.0-28) has no sched_ext"), "{:?}", d.advice);
    }

    #[test]
    fn a_taint_the_owner_does_not_tolerate_is_named_with_the_fix() {
        let taints = json!([{"key": "gpu", "value": "yes", "effect": "NoSchedule"},
                            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]);
        let d = diagnosis(vec![], node("n", json!({"pool": "a"}), taints));
        assert_eq!(fact(&d, "taints kept away"), "gpu=yes:NoSchedule", "a DaemonSet pod tolerates cordoning");
        assert!(d.advice[0].contains("spec.tolerations"), "{:?}", d.advice);
        assert!(d.advice[1].contains("has not reached n"), "no owner label yet: {:?}", d.advice);
    }

    #[test]
    fn a_node_that_is_not_ready_is_the_nodes_problem_never_a_toleration() {
        let taints = json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
                            {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]);
        let mut n = node("n", json!({"pool": "a"}), taints);
        if let Some(status) = n.status.as_mut() {
            status.conditions = serde_json::from_value(json!([{"type": "Ready", "status": "Unknown",
                "reason": "NodeStatusUnknown", "message": "Kubelet stopped posting node status.",
                "lastHeartbeatTime": "2026-12-06T10:00:00Z"}]))
            .ok();
        }
        let d = diagnosis(vec![], n);
        assert_eq!(
            fact(&d, "node"),
            "not ready: its Ready condition is Unknown (NodeStatusUnknown: Kubelet stopped posting node status.); its kubelet's last heartbeat was at 2026-12-06T10:00:00Z"
        );
        assert!(
            d.advice[0].contains("Its kubelet must report it Ready") && d.advice[0].contains("NodeNotReady"),
            "{:?}",
            d.advice
        );
        assert!(d.advice.iter().all(|a| !a.contains("toleration")), "{:?}", d.advice);
        assert_eq!(fact(&d, "taints kept away"), "");
        // A Node no kubelet ever reported on.
        let mut registering = node("n", json!({"pool": "a"}), json!([]));
        registering.status = None;
        let d = diagnosis(vec![], registering);
        assert!(fact(&d, "node").contains("no kubelet has reported on it"), "{:?}", d.facts);
    }

    #[test]
    fn each_kernel_state_has_its_advice() {
        let owned = || node("n", json!({"pool": "a", "sked.schedkit.io/scheduler": "rusty"}), json!([]));
        let advice = |condition| diagnosis(vec![pod("rusty", "n", "cur", condition)], owned()).advice;
        assert!(advice(Some(("True", "KernelAttached", "ops rusty_1 attached")))[0].starts_with("Nothing to do"));
        let broken = "ops rusty_1 attached; the pods' CPU contract is broken: CPU limits: not enforced (no \
                      ops.cgroup_set_bandwidth), and pods here have CPU limits; CPU requests: implemented";
        let said = &advice(Some(("True", "KernelAttached", broken)))[0];
        assert!(said.contains("the pods' CPU limits or requests mean nothing under it"), "{said}");
        assert!(said.ends_with("keep pods with CPU limits off this node"), "{said}");
        let holds = "ops rusty_1 attached; the pods' CPU contract holds as far as read: CPU limits: implemented";
        assert!(advice(Some(("True", "KernelAttached", holds)))[0].starts_with("Nothing to do"));
        assert!(
            advice(Some(("False", "ForeignScheduler", "the kernel runs another scheduler: ops lavd")))[0]
                .contains("Another scheduler owns the kernel (ops lavd)")
        );
        assert!(
            advice(Some(("False", "ReportStale", "no report from the node's agent for more than 30s")))[0]
                .contains("logs rusty-n -c agent")
        );
        assert!(
            advice(Some(("False", "KernelEjected", "ops rusty_1 ejected at t: runnable task stall")))[0]
                .contains("ejected rusty's scheduler at t (runnable task stall)")
        );
        assert!(advice(None)[0].contains("No kernel report"));
        let no_pod = diagnosis(vec![], owned());
        assert!(no_pod.advice[0].contains("describe daemonset rusty"), "{:?}", no_pod.advice);
    }
}
