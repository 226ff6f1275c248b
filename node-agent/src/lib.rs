//! sked-agent: reports, for one node, whether the kernel runs this pod's sched_ext scheduler.
//!
//! - [`sysfs`] reads `/sys/kernel/sched_ext` (root directory injectable);
//! - [`attacher`] finds which process holds the scheduler's BPF link;
//! - [`cgroup_ops`] reads which cgroup callbacks (CPU limits, requests) the running scheduler implements;
//! - [`pod_cgroups`] measures the pods' CPU usage against their limits (`cpu.max`) in the host's cgroup2 tree;
//! - [`verdict`] decides Attached / NotAttached / ForeignScheduler / KernelUnsupported;
//! - [`observation`] is one look at the node (what was read, the verdict, why);
//! - [`uevent`] parses kernel uevents; [`kernel_watch`] re-reads on each one and polls as a fallback;
//! - [`reactor`] holds the agent's only unsafe call (handing a descriptor it owns to tokio);
//! - [`kmsg`] reads the kernel log's lines on why a scheduler left the kernel (followed by [`kernel_watch`]);
//! - [`privileges`] drops the capabilities the agent does not use, at start;
//! - [`health`] samples the node's scheduling health (run delay, CPU pressure, event rates) for the reports,
//!   with [`schedstat`] reading `/proc/schedstat`'s CPU lines (waiting tasks, utilisation, switch rate);
//! - [`report`] streams reports to the controller; [`http`] serves `/readyz` and `/metrics`;
//! - [`scx_stats`] speaks the schedulers' statistics protocol; [`stats_relay`] relays them to
//!   `/metrics` while this pod's scheduler is attached, as the series [`relayed_series`] keeps.

// Denied everywhere but in `reactor`, which allows it for its one call and says why.
#![deny(unsafe_code)]

pub mod attacher;
pub mod cgroup_ops;
pub mod health;
pub mod http;
pub mod kernel_watch;
pub mod kmsg;
pub mod metrics;
pub mod observation;
pub mod pod_cgroups;
pub mod privileges;
pub mod reactor;
pub mod relayed_series;
pub mod report;
pub mod schedstat;
pub mod scx_stats;
pub mod stats_relay;
pub mod sysfs;
pub mod uevent;
pub mod verdict;

/// Locks `m`, recovering the data of a lock poisoned by a panicking holder: every value behind
/// the agent's mutexes stays valid between statements, so a panic elsewhere must not stop the
/// agent reporting.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
