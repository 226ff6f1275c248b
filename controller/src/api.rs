//! The `Scheduler` custom resource (`sked.schedkit.io/v1`, cluster-scoped).
//!
//! The schema carries as much validation as the API server can enforce on its own (required
//! fields, image-reference shape, lengths, and CEL rules), so a bad spec is refused at
//! `kubectl apply` with a message naming the field instead of failing later in a reconcile.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, LocalObjectReference, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::image::IMAGE_REFERENCE_PATTERN;

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
    printcolumn(name = "Available", type_ = "integer", json_path = ".status.numberAvailable",
        description = "Scheduled pods that are available"),
    printcolumn(name = "Kernel-Attached", type_ = "string", json_path = ".status.kernelAttachedSummary",
        description = "Nodes whose kernel runs this scheduler, out of the desired nodes"),
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
    /// Ready, Progressing, Degraded and KernelAttached, each with its own observedGeneration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Condition types the controller writes.
pub mod condition {
    pub const READY: &str = "Ready";
    pub const PROGRESSING: &str = "Progressing";
    pub const DEGRADED: &str = "Degraded";
    pub const KERNEL_ATTACHED: &str = "KernelAttached";
}

/// Reasons of conditions and events (the names users know from the reference documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    // Ready and Progressing.
    RolloutInProgress,
    DaemonSetReady,
    NoNodesScheduled,
    // Degraded.
    SchedulerConflict,
    NodesUnavailable,
    SpecInvalid,
    ImageVerificationFailed,
    /// Degraded=False.
    AsExpected,
    // Events only.
    ReconcileFailed,
    StatusUpdateFailed,
    // KernelAttached condition and kernel events.
    KernelAttached,
    NotAttached,
    ForeignScheduler,
    KernelUnsupported,
    ReportStale,
}

impl Reason {
    pub const ALL: [Reason; 15] = [
        Reason::RolloutInProgress,
        Reason::DaemonSetReady,
        Reason::NoNodesScheduled,
        Reason::SchedulerConflict,
        Reason::NodesUnavailable,
        Reason::SpecInvalid,
        Reason::ImageVerificationFailed,
        Reason::AsExpected,
        Reason::ReconcileFailed,
        Reason::StatusUpdateFailed,
        Reason::KernelAttached,
        Reason::NotAttached,
        Reason::ForeignScheduler,
        Reason::KernelUnsupported,
        Reason::ReportStale,
    ];

    /// The name written into conditions and events.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::RolloutInProgress => "RolloutInProgress",
            Reason::DaemonSetReady => "DaemonSetReady",
            Reason::NoNodesScheduled => "NoNodesScheduled",
            Reason::SchedulerConflict => "SchedulerConflict",
            Reason::NodesUnavailable => "NodesUnavailable",
            Reason::SpecInvalid => "SpecInvalid",
            Reason::ImageVerificationFailed => "ImageVerificationFailed",
            Reason::AsExpected => "AsExpected",
            Reason::ReconcileFailed => "ReconcileFailed",
            Reason::StatusUpdateFailed => "StatusUpdateFailed",
            Reason::KernelAttached => "KernelAttached",
            Reason::NotAttached => "NotAttached",
            Reason::ForeignScheduler => "ForeignScheduler",
            Reason::KernelUnsupported => "KernelUnsupported",
            Reason::ReportStale => "ReportStale",
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
