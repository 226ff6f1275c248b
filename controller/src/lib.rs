//! sked controller: runs sched_ext schedulers, packaged as OCI images, on chosen nodes.
//!
//! Where the decisions live:
//! - [`arbiter`]: which Scheduler owns each node;
//! - [`workload`]: the DaemonSet a Scheduler should have;
//! - [`rollout`]: which pods a rollout replaces next, and when a revision failed;
//! - [`status`]: a Scheduler's status and the events to record;
//! - [`index`]: the watch-fed Scheduler store, the arbiter's view of Nodes, the scheduler pods;
//! - [`reconcile`]: the reconcile that applies the DaemonSet and writes status;
//! - [`manager`]: startup, servers, leadership terms and shutdown;
//! - [`kernel`] and [`reports`]: the agents' kernel reports and the KernelAttached view;
//!   [`reviews`]: TokenReview results kept by token hash; `connections`: report connections,
//!   bounded in number and closed when they carry no stream;
//! - `hashing`: SHA-256 digests as hex, for revisions, admission keys and layer checks.

pub mod api;
pub mod arbiter;
pub mod config;
mod connections;
pub mod crd;
pub mod error;
mod hashing;
pub mod image;
pub mod index;
pub mod kernel;
pub mod leader;
pub mod manager;
mod memo;
pub mod metrics;
pub mod nodes;
mod ownership;
pub mod pacing;
mod pods;
pub mod reconcile;
pub mod reports;
pub mod reports_ca;
pub mod reviews;
pub mod rollout;
pub mod status;
pub mod support;
pub mod sync;
pub mod telemetry;
pub mod tls;
pub mod trust;
pub mod webhook;
pub mod workload;

pub use api::{Scheduler, SchedulerSpec, SchedulerStatus};
