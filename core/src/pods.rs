//! What sked reads off a scheduler pod, taken once when the pod is seen: the index keeps these
//! facts, not the pod (a whole pod, with its managed fields, volumes and environment, is tens of
//! KiB, and the index holds one per node of the fleet). The reports server (who may report) and
//! the rollout (what a node's pod tells) read them.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube_core::ResourceExt;
use sked_api::pod_kernel::POD_CONDITION;

use crate::workload::{AGENT_CONTAINER, MANAGED_BY, MANAGED_BY_LABEL, NAME_LABEL, REVISION_LABEL, SCHEDULER_CONTAINER};

/// The facts of one scheduler pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedulerPod {
    pub name: String,
    pub uid: String,
    /// The Scheduler it belongs to (its `name` label).
    pub scheduler: Option<String>,
    /// The DaemonSet that controls it, by name and uid, when the pod looks like one sked manages
    /// (sked's label, and a controller reference to the DaemonSet its `name` label names).
    pub daemonset: Option<(String, String)>,
    /// The node it is bound to.
    pub node: Option<String>,
    /// The node it is made for while not bound yet: the DaemonSet controller names it in the
    /// pod's node affinity (`metadata.name` in a required term) and kube-scheduler binds it
    /// there. Only the rollout reads it (a pod never bound is its node's trouble); who may
    /// report for a node is judged by `node` alone.
    pub meant_for: Option<String>,
    /// kube-scheduler could not bind it: its `PodScheduled` condition is False, with the reason
    /// and message (escaped and capped), e.g. "Unschedulable: 0/6 nodes are available: 1 Too
    /// many pods".
    pub unschedulable: Option<String>,
    pub revision: PodRevision,
    /// The agent container's image.
    pub agent_image: Option<String>,
    /// Since when (seconds since the epoch) the pod's Ready condition is True.
    pub ready_since: Option<i64>,
    /// How often the scheduler container restarted.
    pub restarts: i32,
    /// Whether the scheduler container waits in CrashLoopBackOff.
    pub backing_off: bool,
    /// How the scheduler container last ended: its exit code and its termination message (with
    /// `terminationMessagePolicy: FallbackToLogsOnError`, its last log lines), escaped and capped.
    pub last_exit: Option<String>,
    /// A kubelet took the pod up: it is past Pending, or reports a container's status.
    pub started: bool,
    /// The kubelet cannot pull the scheduler container's image: its waiting reason and message
    /// (escaped and capped: the kubelet quotes the registry).
    pub pull_error: Option<String>,
    /// When it was created (seconds since the epoch).
    pub created: Option<i64>,
    /// Since when it is terminating (seconds since the epoch).
    pub terminating_since: Option<i64>,
    /// Its `sked.schedkit.io/KernelAttached` condition, as last written.
    pub kernel: Option<KernelCondition>,
}

/// A pod's `sked.schedkit.io/KernelAttached` condition (see [`crate::pod_conditions`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelCondition {
    pub status: String,
    pub reason: String,
    pub message: String,
    /// Its `lastTransitionTime` (seconds since the epoch).
    pub since: i64,
}

/// The waiting reasons of a container whose image the kubelet cannot pull.
const PULL_ERRORS: [&str; 4] = ["ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"];
/// Most characters kept of the kubelet's words on a failed pull.
const MAX_PULL_ERROR_CHARS: usize = 256;
/// Most characters kept of a container's termination message, and its last lines kept.
const MAX_EXIT_CHARS: usize = 300;
const EXIT_LINES: usize = 3;

/// The lines of a termination message that say why the container ended: from the line before
/// the last one naming an error (a CLI's `error: unexpected argument ...` comes first, followed
/// by its usage; libbpf's cause comes just before the scheduler's `Error: ...`), or the last
/// lines when none does; at most [`EXIT_LINES`].
fn last_words<'a, 'b>(lines: &'b [&'a str]) -> &'b [&'a str] {
    let start = match lines.iter().rposition(|l| l.to_ascii_lowercase().contains("error")) {
        Some(i) => i.saturating_sub(1),
        None => lines.len().saturating_sub(EXIT_LINES),
    };
    &lines[start..lines.len().min(start + EXIT_LINES)]
}

/// The revision a DaemonSet's pod template makes: what a replaced pod comes back as.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TemplateRevision {
    /// Its revision label.
    pub name: String,
    /// The scheduler container's image and args (a pod from before revision labels is of this
    /// revision when it runs the same).
    pub image: String,
    pub args: Vec<String>,
    /// The agent container's image.
    pub agent_image: String,
    /// The name a sked before agent images were part of revisions gave the same spec
    /// ([`crate::workload::revision_before_agents`]), when the template is the spec's: a pod
    /// labelled so that runs this agent image is of this revision (adopted, so upgrading to a
    /// sked that names revisions so restarts no scheduler; a new agent image still does).
    pub earlier_name: Option<String>,
}

impl TemplateRevision {
    pub fn of(ds: &DaemonSet) -> Self {
        let template = &ds.spec.template;
        let labels = template.metadata.as_ref().and_then(|m| m.labels.as_ref());
        let container = |name: &str| template.spec.as_ref().and_then(|p| p.containers.iter().find(|c| c.name == name));
        let scx = container(SCHEDULER_CONTAINER);
        Self {
            name: labels.and_then(|l| l.get(REVISION_LABEL)).cloned().unwrap_or_default(),
            image: scx.and_then(|c| c.image.clone()).unwrap_or_default(),
            args: scx.and_then(|c| c.args.clone()).unwrap_or_default(),
            agent_image: container(AGENT_CONTAINER).and_then(|c| c.image.clone()).unwrap_or_default(),
            earlier_name: None,
        }
    }
}

/// What tells a pod's revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodRevision {
    /// Its revision label.
    Labelled(String),
    /// No label (a pod made by a sked version before revisions): the scheduler container's
    /// image and arguments.
    Unlabelled { image: Option<String>, args: Vec<String> },
}

impl SchedulerPod {
    /// The facts of `pod`.
    pub fn of(pod: &Pod) -> Self {
        let labels = pod.labels();
        let scheduler = labels.get(NAME_LABEL).cloned();
        let managed = labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY);
        let daemonset = pod
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true))
            .filter(|o| managed && o.kind == "DaemonSet" && o.api_version == "apps/v1")
            .filter(|o| scheduler.as_ref() == Some(&o.name))
            .map(|o| (o.name.clone(), o.uid.clone()));
        let revision = match labels.get(REVISION_LABEL) {
            Some(r) => PodRevision::Labelled(r.clone()),
            None => {
                let scx = pod.spec.as_ref().and_then(|s| s.containers.iter().find(|c| c.name == SCHEDULER_CONTAINER));
                PodRevision::Unlabelled {
                    image: scx.and_then(|c| c.image.clone()),
                    args: scx.and_then(|c| c.args.clone()).unwrap_or_default(),
                }
            }
        };
        let agent_image = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.iter().find(|c| c.name == AGENT_CONTAINER))
            .and_then(|c| c.image.clone());
        let status = pod.status.as_ref();
        let ready_since = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready" && c.status == "True"))
            .map(|c| c.last_transition_time.as_ref().map_or(0, |t| t.0.as_second()));
        let scx_status = status
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.name == SCHEDULER_CONTAINER));
        let waiting = scx_status.and_then(|c| c.state.as_ref()).and_then(|s| s.waiting.as_ref());
        let backing_off = waiting.is_some_and(|w| w.reason.as_deref() == Some("CrashLoopBackOff"));
        let pull_error = waiting.filter(|w| PULL_ERRORS.contains(&w.reason.as_deref().unwrap_or_default())).map(|w| {
            let said =
                format!("{}: {}", w.reason.as_deref().unwrap_or_default(), w.message.as_deref().unwrap_or_default());
            sked_proto::text::escape_and_cap(said.trim_end_matches([':', ' ']), MAX_PULL_ERROR_CHARS)
        });
        let terminated = scx_status.and_then(|c| {
            let now = c.state.as_ref().and_then(|s| s.terminated.as_ref());
            now.or_else(|| c.last_state.as_ref().and_then(|s| s.terminated.as_ref()))
        });
        let last_exit = terminated.map(|t| {
            let message = t.message.as_deref().unwrap_or_default();
            let lines: Vec<&str> = message.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
            let said = last_words(&lines).join(" | ");
            let code = format!("exit code {}", t.exit_code);
            sked_proto::text::escape_and_cap(
                &if said.is_empty() { code } else { format!("{code}: {said}") },
                MAX_EXIT_CHARS,
            )
        });
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        Self {
            name: pod.name_any(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            scheduler,
            daemonset,
            meant_for: if node.is_some() { None } else { affinity_node(pod) },
            unschedulable: if node.is_some() { None } else { unschedulable(pod) },
            node,
            revision,
            agent_image,
            ready_since,
            restarts: scx_status.map_or(0, |c| c.restart_count),
            backing_off,
            last_exit,
            pull_error,
            started: status.and_then(|s| s.phase.as_deref()).is_some_and(|p| p != "Pending")
                || status.and_then(|s| s.container_statuses.as_ref()).is_some_and(|cs| !cs.is_empty()),
            created: pod.creation_timestamp().map(|t| t.0.as_second()),
            terminating_since: pod.metadata.deletion_timestamp.as_ref().map(|t| t.0.as_second()),
            kernel: status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == POD_CONDITION))
                .map(|c| KernelCondition {
                    status: c.status.clone(),
                    reason: c.reason.clone().unwrap_or_default(),
                    message: c.message.clone().unwrap_or_default(),
                    since: c.last_transition_time.as_ref().map_or(0, |t| t.0.as_second()),
                }),
        }
    }

    /// The revision the pod runs: its label, or `current`'s (adopted, so upgrading sked restarts
    /// nothing) for a pod without one whose scheduler container runs the same image and
    /// arguments as `current` would, and for one labelled with `current`'s earlier name that
    /// runs its agent image; else a revision of its own.
    pub fn revision(&self, current: &TemplateRevision) -> String {
        match &self.revision {
            PodRevision::Labelled(r)
                if current.earlier_name.as_ref() == Some(r)
                    && self.agent_image.as_deref() == Some(current.agent_image.as_str()) =>
            {
                current.name.clone()
            }
            PodRevision::Labelled(r) => r.clone(),
            PodRevision::Unlabelled { image: Some(ran), args } if *ran == current.image && *args == current.args => {
                current.name.clone()
            }
            PodRevision::Unlabelled { .. } => "unlabelled".to_owned(),
        }
    }

    pub fn is_terminating(&self) -> bool {
        self.terminating_since.is_some()
    }

    /// The node the pod runs on or, while not bound, is made for.
    pub fn node_or_target(&self) -> Option<&str> {
        self.node.as_deref().or(self.meant_for.as_deref())
    }
}

/// Most characters kept of why kube-scheduler could not bind a pod.
const MAX_UNSCHEDULABLE_CHARS: usize = 256;

/// The node a DaemonSet pod is made for: the one `metadata.name` value in a required node
/// affinity term, as the DaemonSet controller writes it.
fn affinity_node(pod: &Pod) -> Option<String> {
    let terms = &pod
        .spec
        .as_ref()?
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms.iter().flat_map(|t| t.match_fields.iter().flatten()).find_map(|f| {
        let one = f.key == "metadata.name" && f.operator == "In";
        match f.values.as_deref() {
            Some([node]) if one => Some(node.clone()),
            _ => None,
        }
    })
}

/// Why kube-scheduler could not bind the pod, when its `PodScheduled` condition is False.
fn unschedulable(pod: &Pod) -> Option<String> {
    let c =
        pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
    let said = crate::conditions::said(c.reason.as_deref(), c.message.as_deref(), MAX_UNSCHEDULABLE_CHARS);
    Some(if said.is_empty() { "PodScheduled is False".to_owned() } else { said })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scheduler pod as the API server returns it.
    fn pod(labels: serde_json::Value, owner: serde_json::Value) -> Pod {
        let pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "rusty-x7k2p", "namespace": "sked-system", "uid": "u-1",
                "creationTimestamp": "2026-12-01T10:00:00Z", "deletionTimestamp": "2026-12-01T11:00:00Z",
                "labels": labels,
                "ownerReferences": [owner],
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update"}]
            },
            "spec": {
                "nodeName": "node-a",
                "containers": [
                    {"name": "scx", "image": "r.example/rusty@sha256:1", "args": ["--slice", "5"]},
                    {"name": "agent", "image": "r.example/agent:v1", "args": ["--node=$(NODE_NAME)"]}
                ]
            },
            "status": {
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-01T09:59:00Z"},
                    {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T10:01:00Z"},
                    {"type": "sked.schedkit.io/KernelAttached", "status": "True", "reason": "KernelAttached",
                     "message": "ops rusty attached", "lastTransitionTime": "2026-12-01T10:00:30Z"}
                ],
                "containerStatuses": [
                    {"name": "agent", "ready": true, "restartCount": 9, "image": "i", "imageID": "id"},
                    {"name": "scx", "ready": false, "restartCount": 3, "image": "i", "imageID": "id",
                     "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}},
                     "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                        "message": "starting\n\nlibbpf: failed to open system Kconfig\nError: Failed to load BPF program\n\u{1b}[0m"}}}
                ]
            }
        }));
        pod.unwrap_or_default()
    }

    fn daemonset_owner(name: &str) -> serde_json::Value {
        serde_json::json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name, "uid": "ds-1", "controller": true})
    }

    fn managed(extra: &[(&str, &str)]) -> serde_json::Value {
        let mut labels = serde_json::json!({"name": "rusty", "app.kubernetes.io/managed-by": "sked"});
        for (k, v) in extra {
            labels[*k] = (*v).into();
        }
        labels
    }

    #[test]
    fn the_last_words_of_a_scheduler_are_the_lines_around_its_last_error() {
        let clap = [
            "error: unexpected argument '--no-such-flag' found",
            "tip: to pass '--no-such-flag' as a value, use '-- --no-such-flag'",
            "Usage: scx_bpfland [OPTIONS]",
            "For more information, try '--help'.",
        ];
        assert_eq!(last_words(&clap), &clap[..3]);
        let libbpf = ["starting", "libbpf: failed to open system Kconfig", "Error: Failed to load BPF program", "bye"];
        assert_eq!(last_words(&libbpf), &libbpf[1..]);
        let quiet = ["one", "two", "three", "four"];
        assert_eq!(last_words(&quiet), &quiet[1..]);
        assert!(last_words(&[]).is_empty());
    }

    #[test]
    fn the_facts_of_a_scheduler_pod() {
        let facts = SchedulerPod::of(&pod(managed(&[(REVISION_LABEL, "abc123")]), daemonset_owner("rusty")));
        let at = |s: &str| s.parse::<jiff::Timestamp>().map(|t| t.as_second()).ok();
        assert_eq!(
            facts,
            SchedulerPod {
                name: "rusty-x7k2p".into(),
                uid: "u-1".into(),
                scheduler: Some("rusty".into()),
                daemonset: Some(("rusty".into(), "ds-1".into())),
                node: Some("node-a".into()),
                meant_for: None,
                unschedulable: None,
                revision: PodRevision::Labelled("abc123".into()),
                agent_image: Some("r.example/agent:v1".into()),
                ready_since: at("2026-12-01T10:01:00Z"),
                restarts: 3,
                backing_off: true,
                last_exit: Some(
                    "exit code 1: libbpf: failed to open system Kconfig | Error: Failed to load BPF program | \\u{1b}[0m".into()
                ),
                started: true,
                pull_error: None,
                created: at("2026-12-01T10:00:00Z"),
                terminating_since: at("2026-12-01T11:00:00Z"),
                kernel: Some(KernelCondition {
                    status: "True".into(),
                    reason: "KernelAttached".into(),
                    message: "ops rusty attached".into(),
                    since: at("2026-12-01T10:00:30Z").unwrap_or_default(),
                }),
            }
        );
        assert!(facts.is_terminating());
        let current = |earlier: Option<&str>, agent: &str| TemplateRevision {
            name: "cur".into(),
            image: "any".into(),
            agent_image: agent.into(),
            earlier_name: earlier.map(str::to_owned),
            ..Default::default()
        };
        assert_eq!(facts.revision(&current(None, "r.example/agent:v1")), "abc123", "the label wins");
        // Labelled with the current revision's earlier name (before agent images counted) and
        // running its agent: adopted. With another agent: a revision of its own, rolled out.
        assert_eq!(facts.revision(&current(Some("abc123"), "r.example/agent:v1")), "cur");
        assert_eq!(facts.revision(&current(Some("abc123"), "r.example/agent:v2")), "abc123");
    }

    #[test]
    fn a_pod_never_bound_names_the_node_it_is_made_for_and_why_it_is_not_there() {
        let mut p = pod(managed(&[(REVISION_LABEL, "abc123")]), daemonset_owner("rusty"));
        let spec: k8s_openapi::api::core::v1::PodSpec = serde_json::from_value(serde_json::json!({
            "containers": [{"name": "scx", "image": "i"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-full"]}]}]}}}
        }))
        .unwrap_or_default();
        p.spec = Some(spec);
        p.status = serde_json::from_value(serde_json::json!({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/6 nodes are available: 1 Too many pods, 5 node(s) didn't match Pod's node affinity/selector.\u{1b}[0m"}]}))
        .ok();
        let facts = SchedulerPod::of(&p);
        assert_eq!((facts.node.as_deref(), facts.meant_for.as_deref()), (None, Some("node-full")));
        assert_eq!(facts.node_or_target(), Some("node-full"));
        assert!(!facts.started);
        assert_eq!(
            facts.unschedulable.as_deref(),
            Some(
                "Unschedulable: 0/6 nodes are available: 1 Too many pods, 5 node(s) didn't match Pod's node affinity/selector.\\u{1b}[0m"
            )
        );
        // Bound: the node it runs on, nothing more.
        let bound = SchedulerPod::of(&pod(managed(&[]), daemonset_owner("rusty")));
        assert_eq!(
            (bound.node_or_target(), bound.meant_for.as_deref(), bound.unschedulable.as_deref()),
            (Some("node-a"), None, None)
        );
    }

    #[test]
    fn an_unlabelled_pod_is_the_current_revision_only_when_it_runs_what_that_would() {
        let facts = SchedulerPod::of(&pod(managed(&[]), daemonset_owner("rusty")));
        let args = ["--slice".to_owned(), "5".to_owned()];
        let current = |image: &str, args: &[String]| TemplateRevision {
            name: "cur".into(),
            image: image.into(),
            args: args.to_vec(),
            ..Default::default()
        };
        assert_eq!(facts.revision(&current("r.example/rusty@sha256:1", &args)), "cur");
        assert_eq!(facts.revision(&current("r.example/rusty@sha256:2", &args)), "unlabelled");
        assert_eq!(facts.revision(&current("r.example/rusty@sha256:1", &args[..1])), "unlabelled");
    }

    #[test]
    fn only_a_pod_sked_manages_under_its_schedulers_daemonset_names_one() {
        let not_managed = serde_json::json!({"name": "rusty"});
        for (labels, owner) in [
            (not_managed, daemonset_owner("rusty")),
            (managed(&[]), daemonset_owner("other")),
            (
                managed(&[]),
                serde_json::json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rusty", "uid": "x", "controller": true}),
            ),
            (
                managed(&[]),
                serde_json::json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "rusty", "uid": "x"}),
            ),
        ] {
            let facts = SchedulerPod::of(&pod(labels.clone(), owner.clone()));
            assert_eq!(facts.daemonset, None, "{labels} {owner}");
        }
    }

    #[test]
    fn a_pod_without_status_or_spec_has_no_facts_to_tell() {
        let facts = SchedulerPod::of(&Pod::default());
        assert_eq!((facts.node, facts.ready_since, facts.restarts, facts.backing_off), (None, None, 0, false));
        assert_eq!(facts.revision, PodRevision::Unlabelled { image: None, args: Vec::new() });
    }
}
