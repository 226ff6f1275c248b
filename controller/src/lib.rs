//! sked controller: runs sched_ext schedulers, packaged as OCI images, on chosen nodes.
//!
//! Crates by layer: the API types are `sked_api` (re-exported as [`api`], [`crd`], [`image`],
//! the resource types the tests and the plugin name); the pure deciders are `sked_core`
//! (arbiter, workload, rollout, status, nodes, pods, pod conditions), imported from there by
//! name; this crate holds what talks to the API server and the agents:
//! - [`index`]: the watch-fed Scheduler store, the arbiter's view of Nodes, the scheduler pods;
//! - [`context`]: the one `Context` every reconcile shares;
//! - [`reconcile`]: the reconcile that applies the DaemonSet and writes status;
//! - [`manager`]: startup, servers, leadership terms and shutdown;
//! - [`kernel_table`] and [`reports`]: the agents' kernel reports and the KernelAttached view;
//!   `pod_conditions`: each scheduler pod's KernelAttached condition, written when it changes;
//!   [`reviews`]: TokenReview results kept by token hash; `connections`: report connections,
//!   bounded in number and closed when they carry no stream; [`handshake_gate`]: the door of a
//!   TLS port (silent peers dropped, pending handshakes bounded per source address);
//! - [`trust`], [`webhook`]: image trust and admission; `tag_recheck`: the tags Schedulers name,
//!   resolved again apart from the reconciles.

#![forbid(unsafe_code)]

pub use sked_api as api;
pub use sked_api::{crd, image};

mod canaries;
pub mod config;
mod connections;
pub mod context;
pub mod error;
mod expectations;
pub mod handshake_gate;
pub mod health_table;
pub mod index;
pub mod kernel_table;
pub mod leader;
pub mod manager;
mod memo;
pub mod metrics;
pub mod mutex;
mod owner_labels;
mod pod_conditions;
pub mod reconcile;
pub mod reports;
pub mod reports_ca;
pub mod reviews;
pub mod sched_ext_labels;
mod tag_recheck;
pub mod telemetry;
pub mod throttle;
pub mod tls;
pub mod triggers;
pub mod trust;
pub mod webhook;

pub use api::{Scheduler, SchedulerSpec, SchedulerStatus};
