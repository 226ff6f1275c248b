//! sked's decisions, as pure functions of what was observed: no Kubernetes client, no async
//! runtime, no I/O (the crate depends on neither, so the compiler keeps it so). The controller
//! gathers the inputs, calls these and carries the results out.
//!
//! - [`arbiter`]: which Scheduler owns each node;
//! - [`workload`]: the DaemonSet a Scheduler should have, and its revision;
//! - [`analysis`]: whether a bake hurt the nodes' scheduling health (the verdict of
//!   `spec.rollout.analysis`);
//! - [`rollout`]: which pods a rollout replaces next, which nodes enter, and when a revision
//!   failed; [`node_view`]: how it sees one node (its pod, its agent's report, when it was
//!   labelled);
//! - [`plan`]: one reconcile's decisions over one snapshot (the DaemonSet's write, then the
//!   status, the rollout's actions, the pods' conditions, what the term remembers), from the
//!   deciders below;
//! - [`status`]: a Scheduler's status and the events to record;
//! - [`kernel_summary`]: the agents' reports folded into the KernelAttached view;
//! - [`cpu_contract`]: the agents' reports of the pods' CPU limits and requests folded into the
//!   PodCPUContract condition;
//! - [`pods`] and [`nodes`]: the facts read off a scheduler pod and a Node;
//! - [`pod_conditions`]: each scheduler pod's KernelAttached condition, and when to write it;
//! - [`conditions`]: what a Node's or a pod's condition says, in one line;
//! - [`hashing`]: SHA-256 digests as hex, for revisions, admission keys and layer checks.

#![forbid(unsafe_code)]

pub mod analysis;
pub mod arbiter;
pub mod conditions;
pub mod cpu_contract;
pub mod hashing;
pub mod kernel_summary;
pub mod node_view;
pub mod nodes;
pub mod plan;
pub mod pod_conditions;
pub mod pods;
pub mod rollout;
pub mod status;
pub mod workload;

#[cfg(test)]
mod status_agreement;
#[cfg(test)]
mod test_objects;
