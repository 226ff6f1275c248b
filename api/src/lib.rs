//! sked's API: the `Scheduler` custom resource (`sked.schedkit.io/v1`, cluster-scoped), its
//! reasons and conditions, the CRD rendered as YAML ([`crd`]), the image references its spec
//! names ([`image`]), and an agent's [`verdict`] on its scheduler in sked's own terms. The controller, the tests and `kubectl sked` build on it; it holds no
//! client and does no I/O.
//!
//! The schema carries as much validation as the API server can enforce on its own (required
//! fields, image-reference shape, lengths, and CEL rules), so a bad spec is refused at
//! `kubectl apply` with a message naming the field instead of failing later in a reconcile.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, LocalObjectReference, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::image::IMAGE_REFERENCE_PATTERN;

pub mod crd;
pub mod image;
pub mod labels;
pub mod pod_kernel;
pub mod verdict;

/// API group of every sked resource.
pub const GROUP: &str = "sked.schedkit.io";

/// A sched_ext CPU scheduler, packaged as an OCI image, to run on the nodes it selects.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "sked.schedkit.io",
    version = "v1",
    kind = "Scheduler",
    plural = "schedulers",
    singular = "scheduler",
    status = "SchedulerStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A sched_ext CPU scheduler, packaged as an OCI image, run by sked on the nodes it selects",
    validation = Rule::new("self.metadata.name.size() <= 63").message(
        "metadata.name must be at most 63 characters: it becomes the DaemonSet's name=<scheduler> label value"
    ),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.numberReady",
        description = "Scheduled pods that are ready"),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".status.desiredNumberScheduled",
        description = "Nodes that should run the scheduler"),
    printcolumn(name = "Up-to-date", type_ = "integer", json_path = ".status.updatedNumberScheduled",
        description = "Nodes that run the revision of the current spec"),
    printcolumn(name = "Available", type_ = "integer", json_path = ".status.numberAvailable",
        description = "Scheduled pods that are available"),
    printcolumn(name = "Kernel-Attached", type_ = "string", json_path = ".status.kernelAttachedSummary",
        description = "Nodes whose kernel runs this scheduler, out of the desired nodes"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.rollout.phase",
        description = "Where the rollout of the current spec stands"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct SchedulerSpec {
    /// OCI image of the scheduler: `registry/repository:tag` or `registry/repository@sha256:<digest>`.
    #[schemars(length(min = 1, max = 512), regex(pattern = IMAGE_REFERENCE_PATTERN))]
    pub sched: String,

    /// Labels a node must carry to run this scheduler. Empty selects every node, and so claims
    /// every node in conflict arbitration (the oldest Scheduler wins a node).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "node_selector_schema")]
    #[x_kube(validation = Rule::new(
        "self.all(k, k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$'))"
    ).message("nodeSelector keys must be valid label keys: an optional DNS-subdomain prefix and '/', then up to 63 alphanumerics, '-', '_' or '.'"))]
    #[x_kube(validation = Rule::new("!('sked.schedkit.io/scheduler' in self)").message(
        "nodeSelector may not use sked.schedkit.io/scheduler: sked sets that label on the nodes each Scheduler owns; select nodes by your own labels"
    ))]
    pub node_selector: BTreeMap<String, String>,

    /// Tolerations for the scheduler's pods. A toleration permits placement on a tainted node;
    /// it does not select nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new(
        "self.all(t, !has(t.operator) || t.operator != 'Exists' || !has(t.value) || t.value == '')"
    ).message("tolerations: value must be empty when operator is Exists"))]
    pub tolerations: Vec<Toleration>,

    /// Arguments passed to the scheduler binary.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub args: Vec<String>,

    /// Environment of the scheduler container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    #[x_kube(validation = Rule::new("self.all(e, e.name.size() > 0)")
        .message("env: every entry needs a non-empty name"))]
    pub env: Vec<EnvVar>,

    /// Secrets in the workload namespace used to pull the image (and, with image trust, to
    /// resolve and verify it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.all(s, has(s.name) && s.name.size() > 0)")
        .message("imagePullSecrets: every entry needs a non-empty name"))]
    pub image_pull_secrets: Vec<LocalObjectReference>,

    /// CPU and memory requests and limits of the scheduler container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// PriorityClass of the scheduler's pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub priority_class_name: Option<String>,

    /// Ops name the scheduler registers in the kernel (for example `rusty`); matched as a prefix,
    /// since scx schedulers append their version and target. When empty, the agent accepts the
    /// ops owned by the pod's own scheduler process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 127), regex(pattern = r"^[A-Za-z0-9_.-]+$"))]
    pub expected_ops: Option<String>,

    /// How a new revision (a new image digest, args, env, ...) replaces the running one, node by
    /// node. Unset fields take their defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutSpec>,
}

/// Pacing of a rollout: a canary first, then waves, each moving on only once the kernel reports
/// the new revision attached and it baked without an ejection; a revision that fails is rolled
/// back.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// Nodes updated (and baked) before any other node. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10000))]
    pub canary: Option<i32>,
    /// Most nodes replaced in one wave (waves double after each clean bake up to it), and most
    /// nodes without an attached scheduler at once because of the rollout: a number, or a
    /// percentage of the Scheduler's nodes such as `25%` (rounded down, at least 1). Default 25%.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "int_or_percent_schema")]
    #[x_kube(validation = Rule::new(
        "type(self) == int ? self >= 1 : string(self).matches('^([1-9][0-9]?|100)%$')"
    ).message("maxUnavailable must be a number of nodes (at least 1) or a percentage from 1% to 100%, such as 25%"))]
    pub max_unavailable: Option<IntOrString>,
    /// How long the newest updated node must stay attached, with no node ejected, before the
    /// next wave starts. Default 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 86400))]
    pub bake_seconds: Option<i32>,
    /// How long a replaced node may take to report the new revision attached before the
    /// rollout is rolled back. Default 120.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub attach_timeout_seconds: Option<i32>,
    /// Stops the rollout before its next wave; running pods are left as they are.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// Judges the wave of each bake by the kernel's own accounting of scheduling health: each
    /// wave node's change from its own window before its switch, against the change of the
    /// Scheduler's nodes outside the wave over the same clock range; a wave that fails is
    /// rolled back (reason AnalysisFailed). Unset: no analysis. `{}`: the defaults (waiting
    /// tasks per CPU may rise 50 % more than the controls', idle CPUs beside waiting tasks 10
    /// points, CPU pressure 10 points).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<AnalysisSpec>,
}

/// What judges a bake, and how much evidence a verdict needs. A signal left unset is not
/// judged; when none is set, waiting tasks, idle CPUs beside waiting tasks and CPU pressure are
/// judged with their defaults. Every limit is on a node's change beyond the control nodes'
/// change over the same time.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisSpec {
    /// Tasks waiting for a CPU, per CPU (/proc/schedstat: run delay over wall time and CPUs):
    /// how much work waits, whatever the slice length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_tasks: Option<IncreasePercent>,
    /// Idle CPUs beside waiting tasks (/proc/schedstat per CPU), in points of the CPUs' time: a
    /// scheduler that strands tasks on busy CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_while_waiting: Option<IncreasePoints>,
    /// Share of the CPUs' time spent running tasks (/proc/schedstat), in points: a fall while
    /// work waits is work not done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilisation: Option<DecreasePoints>,
    /// Timeslices per CPU-second (/proc/schedstat): context-switch overhead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch_rate: Option<IncreasePercent>,
    /// Mean run-queue wait per timeslice (/proc/schedstat), a latency signal: it scales with
    /// the slice length, so a scheduler with longer slices raises it without harm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_delay: Option<IncreasePercent>,
    /// Share of time some task waited for a CPU (/proc/pressure/cpu, "some"), in points.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_pressure: Option<IncreasePoints>,
    /// sched_ext event counters (root/events) and the most each may move on a wave's node
    /// (absolute: another scheduler's counters are no baseline). A name this kernel does not
    /// count holds the rollout with an error.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub events: Vec<EventLimit>,
    /// Samples a node needs within each window before it is judged (at the agents'
    /// --health-interval, 5 s by default: set bakeSeconds to at least this many intervals).
    /// Default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 3, max = 1000))]
    pub min_samples: Option<i32>,
    /// Nodes outside the wave, each with enough samples in both windows, before their change
    /// counts as the baseline. Default 3. 0 judges each node by its own change alone, against
    /// the limit, when there are no control nodes: only for pools too small to have them (a
    /// change of load during the bake then fails a node as surely as its scheduler).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub min_control_nodes: Option<i32>,
    /// Share of a wave's judged nodes that must fail before the wave fails (at least one
    /// node). Default 20.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub failed_nodes_percent: Option<i32>,
    /// A single node fails its wave when its change is this many times its limit's: the
    /// controls' change times this factor for a percentage, this many times the points.
    /// Default 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 2, max = 100))]
    pub critical_factor: Option<i32>,
    /// Judge the pods' CPU contract too: a wave fails when, during its bake, a node of it ran a
    /// pod over its CPU limit, or its scheduler lacks the cgroup callback that keeps the pods'
    /// limits (`ops.cgroup_set_bandwidth`, where pods have limits) or requests
    /// (`ops.cgroup_set_weight`, where pods' requests differ); a node whose agent could not say
    /// leaves the wave Inconclusive. Default false. See docs/cpu-contract.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_contract: Option<bool>,
    /// What a wave that could not be judged (no samples, too few control nodes, no window
    /// before its switch) does: Pause (the default: it waits for `kubectl sked rollout
    /// proceed`) or Proceed. A first deployment has no window before its switch and proceeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_inconclusive: Option<OnInconclusive>,
}

/// What an Inconclusive verdict does.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
pub enum OnInconclusive {
    #[default]
    Pause,
    Proceed,
}

/// How far a signal may rise, in percent, beyond the controls' change.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct IncreasePercent {
    /// Percent above the controls' change. Default 50.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_increase_percent: Option<i32>,
}

/// How far a share of time may rise, in percentage points, beyond the controls' change.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct IncreasePoints {
    /// Points above the controls' change. Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub max_increase_points: Option<i32>,
}

/// How far a share of time may fall, in percentage points, beyond the controls' change.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DecreasePoints {
    /// Points below the controls' change. Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub max_decrease_points: Option<i32>,
}

/// The most a sched_ext event counter may move on a wave's node: a count per second, or for
/// a duration counter (its name ends in `_DURATION`, nanoseconds) a share of time.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "self.name.endsWith('_DURATION') ? (has(self.maxPercentOfTime) && !has(self.maxPerSecond)) : (has(self.maxPerSecond) && !has(self.maxPercentOfTime))"
).message("a duration counter (name ending in _DURATION, nanoseconds) takes maxPercentOfTime; every other counter takes maxPerSecond"))]
pub struct EventLimit {
    /// The counter's name in root/events, e.g. SCX_EV_SELECT_CPU_FALLBACK.
    #[schemars(length(min = 1, max = 63), regex(pattern = "^SCX_EV_[A-Z0-9_]+$"))]
    pub name: String,
    /// Most counts per second (the median over the bake).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_per_second: Option<i64>,
    /// For a duration counter: most percent of wall time (the median over the bake).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub max_percent_of_time: Option<i32>,
}

fn int_or_percent_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "x-kubernetes-int-or-string": true,
        "description": "Most nodes replaced in one wave, and most nodes without an attached scheduler at once because of the rollout: a number, or a percentage of the Scheduler's nodes such as `25%` (rounded down, at least 1). Default 1."
    })
}

impl SchedulerSpec {
    /// Names of the image pull secrets (in the workload namespace).
    pub fn pull_secret_names(&self) -> Vec<String> {
        self.image_pull_secrets.iter().map(|r| r.name.clone()).collect()
    }
}

/// Observed state of a Scheduler, written only by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchedulerStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The image the DaemonSet runs, pinned by digest once image trust resolves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_image: Option<String>,
    /// Nodes that should run the scheduler (from the DaemonSet).
    #[serde(default)]
    pub desired_number_scheduled: i32,
    /// Scheduled pods that are ready.
    #[serde(default)]
    pub number_ready: i32,
    /// Scheduled pods that are available.
    #[serde(default)]
    pub number_available: i32,
    /// Nodes whose kernel reports this scheduler attached.
    #[serde(default)]
    pub kernel_attached: i32,
    /// `kernelAttached/desiredNumberScheduled`, for the KERNEL-ATTACHED column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_attached_summary: Option<String>,
    /// Selected nodes this Scheduler lost to older Schedulers.
    #[serde(default)]
    pub conflicting_nodes: i32,
    /// Nodes this Scheduler would own whose kernel has no sched_ext (labelled
    /// `sked.schedkit.io/sched-ext=unsupported`): no pod runs there until their kernel changes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unsupported_nodes: i32,
    /// Nodes that run the revision of the current spec (the UP-TO-DATE column).
    #[serde(default)]
    pub updated_number_scheduled: i32,
    /// Where the rollout of the current spec stands. The controller keeps its state here, so a
    /// new leader carries on where the last one stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
    /// The newest exit of a BPF scheduler from the kernel of one of this Scheduler's nodes, as
    /// the kernel logged it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit: Option<KernelExit>,
    /// Ready, Progressing, Reconciling, Stalled, Degraded and KernelAttached, each with the
    /// observedGeneration whose revision it describes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A BPF scheduler leaving a node's kernel: the kernel's own words, from its log, as the node's
/// agent read them (escaped and capped).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelExit {
    pub node: String,
    /// The ops name of the scheduler that left.
    pub ops: String,
    /// The kernel's reason: `runnable task stall`, `scx_bpf_error`, `disabled by sysrq-S`,
    /// `unregistered from user space`, ...
    pub reason: String,
    /// The kernel's detail for an error exit (for a stall, the task that did not run and for
    /// how long).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// When the kernel logged it (RFC 3339, UTC, milliseconds).
    pub time: String,
    /// True when the kernel threw the scheduler out (an error, a stall, SysRq-S, the scheduler's
    /// own exit); false when its user space unregistered it (its process ended: a rollout, a
    /// deleted pod), and for a restart.
    pub ejected: bool,
    /// The kernel asked the scheduler to restart (`unregistered from the main kernel`: a CPU
    /// went on or off line): not a failure while the same pod's scheduler attaches again within
    /// the attach timeout.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restart: bool,
    /// The backtrace the kernel printed with an error exit (at most 16 lines, escaped and
    /// capped): where in the kernel the scheduler was when it failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trace: Vec<String>,
}

impl KernelExit {
    /// Orders exits in time (RFC 3339 UTC with a fixed precision sorts as text), then by node.
    pub fn is_newer_than(&self, other: &KernelExit) -> bool {
        (self.time.as_str(), self.node.as_str()) > (other.time.as_str(), other.node.as_str())
    }

    /// The same exit of the same node (its detail may differ: it can come in a later report).
    pub fn is_same_as(&self, other: &KernelExit) -> bool {
        self.node == other.node && self.time == other.time && self.ops == other.ops && self.reason == other.reason
    }

    /// `the kernel ejected OPS at TIME (REASON: DETAIL)`, or `unregistered`, or `asked OPS to
    /// restart`.
    pub fn describe(&self) -> String {
        let what = match (self.ejected, self.restart) {
            (true, _) => format!("ejected {}", self.ops),
            (false, true) => format!("asked {} to restart", self.ops),
            (false, false) => format!("unregistered {}", self.ops),
        };
        if self.detail.is_empty() {
            format!("the kernel {what} at {} ({})", self.time, self.reason)
        } else {
            format!("the kernel {what} at {} ({}: {})", self.time, self.reason, self.detail)
        }
    }
}

/// A revision of a Scheduler's pods: what its spec and resolved image make of them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Revision {
    /// The value of the pods' `sked.schedkit.io/revision` label.
    pub name: String,
    /// The scheduler image, pinned by digest when image trust resolved it.
    pub image: String,
    /// The newest Scheduler generation whose spec makes this revision.
    pub generation: i64,
    /// The spec fields that make it, with `image`: kept for the current revision, so a rollback
    /// (or an undo) can make its pods again even when the DaemonSet and its history are gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<RevisionSpec>,
    /// The image of sked's agent its pods run (part of the revision): a rollback makes its pods
    /// again with this agent, not the controller's current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_image: Option<String>,
}

/// The fields of a Scheduler's spec that make up a revision of its pods (placement and pacing
/// do not).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevisionSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_ops: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
}

impl RevisionSpec {
    /// The revision fields of `spec`.
    pub fn of(spec: &SchedulerSpec) -> Self {
        Self {
            args: spec.args.clone(),
            env: spec.env.clone(),
            resources: spec.resources.clone(),
            expected_ops: spec.expected_ops.clone(),
            tolerations: spec.tolerations.clone(),
            image_pull_secrets: spec.image_pull_secrets.clone(),
            priority_class_name: spec.priority_class_name.clone(),
        }
    }

    /// `spec` with these revision fields and `image` in place of its own; placement and pacing
    /// stay as they are.
    pub fn applied_to(&self, spec: &SchedulerSpec, image: &str) -> SchedulerSpec {
        SchedulerSpec {
            sched: image.to_owned(),
            args: self.args.clone(),
            env: self.env.clone(),
            resources: self.resources.clone(),
            expected_ops: self.expected_ops.clone(),
            tolerations: self.tolerations.clone(),
            image_pull_secrets: self.image_pull_secrets.clone(),
            priority_class_name: self.priority_class_name.clone(),
            ..spec.clone()
        }
    }
}

/// The rollout of a Scheduler's current revision.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// Queued, Canary, Rolling, Paused, Complete, RolledBack or Failed.
    pub phase: RolloutPhase,
    /// The last revision that ran attached on every node (what a rollback restores).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_revision: Option<Revision>,
    /// The revision being rolled out (equal to the current one once complete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_revision: Option<Revision>,
    /// Nodes that run the update revision.
    #[serde(default)]
    pub updated_nodes: i32,
    /// Nodes that run the update revision and report it attached.
    #[serde(default)]
    pub attached_nodes: i32,
    /// Selected nodes that still run revision zero (the kernel's default scheduler, or another
    /// Scheduler's until this one takes them) and wait for their wave.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub entering_nodes: i32,
    /// Nodes left out of the rollout: their kernel cannot run sched_ext or runs another
    /// scheduler, the Node is not Ready (or has not registered), a taint the Scheduler does not
    /// tolerate keeps its pod away, kube-scheduler did not bind their pod, no kubelet took their
    /// pod up, or only their kubelet cannot pull the image. Each enters by itself once it can.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped_nodes: Vec<String>,
    /// How many nodes are skipped for each reason (`KernelUnsupported`, `ForeignScheduler`,
    /// `NodeNotReady`, `TaintNotTolerated`, `PodNotScheduled`, `PodNotStarted`,
    /// `ImagePullFailing`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub skipped_reasons: std::collections::BTreeMap<String, i32>,
    /// The revision that failed and was rolled back; not tried again until the spec changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<RolloutFailure>,
    /// Nodes the current revision failed to take over while another revision's failure is
    /// recorded: sent back to the kernel's default, they do not enter again until the spec
    /// changes (a retry), so a node where the scheduler crashes is not switched over and over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held_nodes: Vec<String>,
    /// The verdict of the analysis of the update revision's last judged bake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<AnalysisStatus>,
    /// The wave in flight, when its bake will be judged: each node's summary of the window
    /// before its switch, frozen when its old pod was deleted, and the control nodes' over the
    /// same clock range (kept here so a new leader judges the same wave the same way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<WaveBaseline>,
}

/// The window before a wave's switch, frozen when its pods were replaced.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaveBaseline {
    /// The revision the wave switched to.
    pub revision: String,
    /// When the wave's first old pod was deleted: the window before it ends here, and a pod of
    /// the revision made since is of this wave.
    pub taken_at: Time,
    /// How long the window before it is, in seconds.
    pub window_seconds: i64,
    /// The wave's nodes (at most 256, the others are judged without a window of their own) and
    /// the control nodes (at most 200), each with its signals' summaries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeBaseline>,
}

/// One node's window before a wave's switch.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeBaseline {
    pub node: String,
    /// A control node (outside the wave) rather than one of the wave.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub control: bool,
    /// Each signal's summary, by signal name (waitingTasks, idleWhileWaiting, utilisation,
    /// switchRate, runDelay, cpuPressure).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub signals: std::collections::BTreeMap<String, SignalSummary>,
}

/// A signal's samples in a window: their median, their median absolute deviation, how many.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, schemars::JsonSchema)]
pub struct SignalSummary {
    pub median: f64,
    pub spread: f64,
    pub samples: i32,
}

/// Why a revision was rolled back.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutFailure {
    /// The revision that failed.
    pub revision: String,
    /// The Scheduler generation that asked for it.
    pub generation: i64,
    /// The node where it failed.
    pub node: String,
    /// What happened there.
    pub cause: String,
    /// When the rollout was stopped.
    pub time: Time,
    /// `AnalysisFailed` when the revision attached and the analysis of a bake failed it;
    /// unset when the kernel or the pod failed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What the kernel and the scheduler said last on that node, kept with the failure
    /// (`kubectl sked why` prints it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<FailureEvidence>,
}

/// What the kernel and the scheduler said last on the node where a revision failed, as its
/// agent and its kubelet reported them (escaped and capped).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureEvidence {
    /// The node's last exit from the kernel log (reason, detail, the kernel's backtrace), when
    /// the kernel ended the scheduler there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_exit: Option<KernelExit>,
    /// How the scheduler container last ended (exit code, its last log lines), when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_exit: Option<String>,
    /// The scheduler's last statistics (its scx_stats reply, JSON, escaped and capped at 4,096
    /// characters) the node's agent read while it ran attached, when the kernel ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_stats: Option<String>,
}

impl FailureEvidence {
    /// `None` when there is nothing to keep.
    pub fn of(
        kernel_exit: Option<KernelExit>,
        scheduler_exit: Option<String>,
        scheduler_stats: Option<String>,
    ) -> Option<Self> {
        let evidence = Self { kernel_exit, scheduler_exit, scheduler_stats };
        (evidence != Self::default()).then_some(evidence)
    }
}

/// The verdict of the analysis of the last bake (`spec.rollout.analysis`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisStatus {
    /// The revision judged.
    pub revision: String,
    /// Passed, Failed, or Inconclusive (too few samples, no control nodes, no window before
    /// the switch: the rollout pauses, or goes on with `onInconclusive: Proceed`).
    pub verdict: AnalysisVerdict,
    /// The Scheduler generation the verdict was reached under: a rollout paused on an
    /// Inconclusive verdict goes on once the generation moves (`kubectl sked rollout proceed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// The rollout waits on this verdict (Inconclusive, `onInconclusive: Pause`) until the
    /// generation moves.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub holds: bool,
    /// The verdict in words.
    pub message: String,
    /// The nodes judged, failed ones first (at most 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeAnalysis>,
    /// When the verdict was reached.
    pub time: Time,
}

/// One node's verdict, with what it was measured at against its baselines.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeAnalysis {
    pub node: String,
    pub verdict: AnalysisVerdict,
    /// Each signal's median over the bake and its baselines, e.g. "run delay 1.9 ms (control
    /// 1.35 ms over 4 nodes; before its switch 1.3 ms)".
    pub detail: String,
}

/// How a bake was judged.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum AnalysisVerdict {
    Passed,
    Failed,
    Inconclusive,
}

impl AnalysisVerdict {
    pub const fn as_str(self) -> &'static str {
        match self {
            AnalysisVerdict::Passed => "Passed",
            AnalysisVerdict::Failed => "Failed",
            AnalysisVerdict::Inconclusive => "Inconclusive",
        }
    }
}

/// Where a rollout stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
pub enum RolloutPhase {
    /// A new revision waits to start its canary: other Schedulers run theirs, as many as the
    /// controller lets run at once (`--max-concurrent-canaries`).
    Queued,
    /// The first nodes run the new revision; the rest wait for them to attach and bake.
    Canary,
    /// Waves replace the remaining nodes.
    Rolling,
    /// `spec.rollout.paused`: no further wave starts.
    Paused,
    /// Every node runs the current revision, attached.
    #[default]
    Complete,
    /// The revision failed; the nodes it reached run the previous revision again.
    RolledBack,
    /// The revision failed and no earlier revision ever attached: rolled back to revision zero,
    /// the nodes it reached run the kernel's default scheduler again.
    Failed,
}

impl RolloutPhase {
    pub const fn as_str(self) -> &'static str {
        match self {
            RolloutPhase::Queued => "Queued",
            RolloutPhase::Canary => "Canary",
            RolloutPhase::Rolling => "Rolling",
            RolloutPhase::Paused => "Paused",
            RolloutPhase::Complete => "Complete",
            RolloutPhase::RolledBack => "RolledBack",
            RolloutPhase::Failed => "Failed",
        }
    }
}

/// Condition types the controller writes.
pub mod condition {
    pub const READY: &str = "Ready";
    pub const PROGRESSING: &str = "Progressing";
    pub const DEGRADED: &str = "Degraded";
    pub const KERNEL_ATTACHED: &str = "KernelAttached";
    /// kstatus: the controller is still working toward the current generation.
    pub const RECONCILING: &str = "Reconciling";
    /// kstatus: the controller cannot reach the current generation without a change of spec.
    pub const STALLED: &str = "Stalled";
    /// Whether the pods' CPU limits and requests are enforced on the nodes the scheduler runs on.
    pub const POD_CPU_CONTRACT: &str = "PodCPUContract";
}

/// Reasons of conditions and events (the names users know from the reference documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    // Ready, Progressing and Reconciling.
    RolloutInProgress,
    RolloutPaused,
    DaemonSetReady,
    NoNodesScheduled,
    // Degraded.
    SchedulerConflict,
    NodesUnavailable,
    SpecInvalid,
    ImageVerificationFailed,
    /// Degraded and Stalled: a revision failed and was rolled back (or had nothing to go back to).
    RolloutFailed,
    /// Degraded=False, Stalled=False.
    AsExpected,
    // Events only.
    ReconcileFailed,
    StatusUpdateFailed,
    RolledBack,
    // KernelAttached condition and kernel events.
    KernelAttached,
    NotAttached,
    ForeignScheduler,
    KernelUnsupported,
    ReportStale,
    /// Event: the kernel threw a node's scheduler out.
    KernelEjected,
    /// Event: the analysis of a bake failed the revision, which was rolled back.
    AnalysisFailed,
    // PodCPUContract condition and its events.
    /// Pods' CPU limits are not enforced where the scheduler runs (a pod measured over its
    /// limit, or the scheduler lacks ops.cgroup_set_bandwidth where pods have limits).
    LimitsNotEnforced,
    /// Pods' CPU requests are not enforced where the scheduler runs (it lacks
    /// ops.cgroup_set_weight where pods have different requests).
    RequestsNotEnforced,
    /// The scheduler implements both cgroup callbacks on every node it runs on, and no pod was
    /// measured over its limit.
    CpuControlsImplemented,
    /// The scheduler lacks a callback, but no node it runs on has a pod the callback would serve.
    NothingAtStake,
    /// Not every node it runs on said (an agent that cannot read the struct_ops maps, no node
    /// attached).
    ContractUnknown,
}

impl Reason {
    pub const ALL: [Reason; 25] = [
        Reason::RolloutInProgress,
        Reason::RolloutPaused,
        Reason::DaemonSetReady,
        Reason::NoNodesScheduled,
        Reason::SchedulerConflict,
        Reason::NodesUnavailable,
        Reason::SpecInvalid,
        Reason::ImageVerificationFailed,
        Reason::RolloutFailed,
        Reason::AsExpected,
        Reason::ReconcileFailed,
        Reason::StatusUpdateFailed,
        Reason::RolledBack,
        Reason::KernelAttached,
        Reason::NotAttached,
        Reason::ForeignScheduler,
        Reason::KernelUnsupported,
        Reason::ReportStale,
        Reason::KernelEjected,
        Reason::AnalysisFailed,
        Reason::LimitsNotEnforced,
        Reason::RequestsNotEnforced,
        Reason::CpuControlsImplemented,
        Reason::NothingAtStake,
        Reason::ContractUnknown,
    ];

    /// The name written into conditions and events.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::RolloutInProgress => "RolloutInProgress",
            Reason::RolloutPaused => "RolloutPaused",
            Reason::DaemonSetReady => "DaemonSetReady",
            Reason::NoNodesScheduled => "NoNodesScheduled",
            Reason::SchedulerConflict => "SchedulerConflict",
            Reason::NodesUnavailable => "NodesUnavailable",
            Reason::SpecInvalid => "SpecInvalid",
            Reason::ImageVerificationFailed => "ImageVerificationFailed",
            Reason::RolloutFailed => "RolloutFailed",
            Reason::AsExpected => "AsExpected",
            Reason::ReconcileFailed => "ReconcileFailed",
            Reason::StatusUpdateFailed => "StatusUpdateFailed",
            Reason::RolledBack => "RolledBack",
            Reason::KernelAttached => "KernelAttached",
            Reason::NotAttached => "NotAttached",
            Reason::ForeignScheduler => "ForeignScheduler",
            Reason::KernelUnsupported => "KernelUnsupported",
            Reason::ReportStale => "ReportStale",
            Reason::KernelEjected => "KernelEjected",
            Reason::AnalysisFailed => "AnalysisFailed",
            Reason::LimitsNotEnforced => "LimitsNotEnforced",
            Reason::RequestsNotEnforced => "RequestsNotEnforced",
            Reason::CpuControlsImplemented => "CPUControlsImplemented",
            Reason::NothingAtStake => "NothingAtStake",
            Reason::ContractUnknown => "ContractUnknown",
        }
    }

    /// The reason a condition read from the API server carries, if it is one of these.
    pub fn parse(name: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == name)
    }

    /// Whether `condition` carries this reason.
    pub fn is_of(self, condition: &Condition) -> bool {
        condition.reason == self.as_str()
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A label map: at most 16 entries (which bounds the CEL key check's cost), values that are
/// valid label values.
fn node_selector_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "maxProperties": 16,
        "additionalProperties": {
            "type": "string",
            "maxLength": 63,
            "pattern": "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
        },
        "description": "Labels a node must carry to run this scheduler. Empty selects every node, and so claims every node in conflict arbitration (the oldest Scheduler wins a node)."
    })
}

impl Scheduler {
    /// The Scheduler's status, or an empty one before the controller first wrote it.
    pub fn status_or_default(&self) -> SchedulerStatus {
        self.status.clone().unwrap_or_default()
    }
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::Reason;

    #[test]
    fn every_reason_parses_back_from_its_name() {
        for reason in Reason::ALL {
            assert_eq!(Reason::parse(reason.as_str()), Some(reason));
        }
        assert_eq!(Reason::parse("SomethingElse"), None);
    }
}
