//! sked controller: runs sched_ext schedulers, packaged as OCI images, on chosen nodes.
//!
//! Where the decisions live:
//! - [`arbiter`]: which Scheduler owns each node;
//! - [`workload`]: the DaemonSet a Scheduler should have;
//! - [`status`]: a Scheduler's status and the events to record;
//! - [`reconcile`]: the watches and the reconcile that connects them to the API server.

pub mod api;
pub mod arbiter;
pub mod config;
pub mod crd;
pub mod image;
pub mod kernel;
pub mod leader;
pub mod metrics;
pub mod pacing;
pub mod reconcile;
pub mod reports;
pub mod status;
pub mod telemetry;
pub mod workload;

pub use api::{Scheduler, SchedulerSpec, SchedulerStatus};
