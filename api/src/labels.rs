//! The labels sked puts on Nodes and scheduler pods: the controller writes them, `kubectl sked`
//! and the chart's selectors read them.

/// Pod label selecting a Scheduler's pods (`kubectl get pods -l name=<scheduler>`).
pub const NAME_LABEL: &str = "name";
/// Label marking objects sked manages.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "sked";
/// The label on a Node that names the Scheduler owning it (kept by the controller from the
/// arbiter); a Scheduler's DaemonSet selects it, so ownership never enters a pod template.
pub const OWNER_LABEL: &str = "sked.schedkit.io/scheduler";
/// The pod label naming the revision a pod runs.
pub const REVISION_LABEL: &str = "sked.schedkit.io/revision";
/// Whether a node's kernel runs sched_ext: `supported` once a scheduler attached there,
/// `unsupported` once an agent found no sched_ext (until the node's kernel changes).
pub const SCHED_EXT_LABEL: &str = "sked.schedkit.io/sched-ext";
pub const SUPPORTED: &str = "supported";
pub const UNSUPPORTED: &str = "unsupported";
/// The kernel an unsupported node was judged on, as a label value.
pub const KERNEL_LABEL: &str = "sked.schedkit.io/sched-ext-kernel";
/// Name of the container that runs the scheduler binary.
pub const SCHEDULER_CONTAINER: &str = "scx";
/// Name of the agent sidecar.
pub const AGENT_CONTAINER: &str = "agent";
