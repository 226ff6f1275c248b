//! Test harness for sked: a real control plane ([`cluster::TestCluster`]) and helpers for the
//! integration suites in `tests/tests/`, by concern:
//! - [`chaos`]: the fault matrix of `make chaos` and how its outcomes are judged;
//! - [`fixture`]: the shared cluster taken in turns, the in-process controller, waits;
//! - [`kubelet`]: stand-ins for the kubelet (Ready nodes and pods, finished deletions);
//! - [`objects`]: Scheduler specs and conditions, CRDs, namespaces, trust policies;
//! - [`pki`]: throwaway certificate authorities; [`webhooks`]: webhook registration;
//! - [`certmanager`]: a real cert-manager; [`controller_pods`]: the chart's controller pods
//!   run as processes; [`controller_process`]: a controller replica as a process (killed,
//!   frozen, thawed);
//! - [`command`]: running the upstream tools; [`agents`], [`registry`], [`vm`], [`vmlink`]:
//!   fake-kernel agents, the OCI registry, and the qemu VM with its console relays;
//! - [`stall_proxy`]: a TCP relay that can hold the bytes it carries;
//! - [`node`]: a real Kubernetes node (containerd and a kubelet) in that VM, [`vmdns`] its
//!   pods' name server.

pub mod agents;
pub mod certmanager;
pub mod chaos;
pub mod cluster;
pub mod command;
pub mod controller_pods;
pub mod controller_process;
pub mod fake_nodes;
pub mod fixture;
pub mod kubelet;
pub mod node;
pub mod objects;
pub mod pki;
pub mod registry;
pub mod simulated_agents;
pub mod stall_proxy;
pub mod vm;
pub mod vmdns;
pub mod vmlink;
pub mod webhooks;

pub use cluster::TestCluster;
pub use command::{promtool_check_metrics, run_command};
pub use fixture::{DEADLINE, Fixture, event_counts, init_test_logging, shared_cluster, wait_for, wait_for_within};
pub use kubelet::{
    create_full_node, create_ready_node, create_registering_node, finish_pod_deletions, set_node_ready, wait_bound_pods,
};
pub use objects::{
    allow_unsigned_policy, clear, condition, ensure_namespace, ensure_service_account, has_condition, install_crds,
    next_second_after, spec, spec_on,
};
pub use webhooks::{delete_validating_webhook, register_validating_webhook};
