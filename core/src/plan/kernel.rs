//! The kernel reports of a Scheduler's nodes, folded for its KernelAttached condition, less the
//! ejections already recorded as events.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use sked_api::KernelExit;

use super::rollout_step::RolloutActions;
use super::{Snapshot, name_of};
use crate::kernel_summary::{self, KernelSummary, ejection_key};

/// What the agents report of the Scheduler's nodes, as this reconcile sees it.
pub(super) struct View {
    pub(super) summary: KernelSummary,
    /// Every ejection heard that this term had not recorded (they are remembered as recorded
    /// once the status and its events are out).
    pub(super) heard_ejections: Vec<KernelExit>,
    /// How much longer a new leader waits for agents before it judges silent nodes.
    pub(super) grace_left: Duration,
}

/// Which nodes KernelAttached counts: `desired` of them, none of `off` (skipped for their own
/// trouble).
pub(super) struct Count<'a> {
    pub(super) desired: i32,
    pub(super) off: &'a [String],
}

impl<'a> Count<'a> {
    /// KernelAttached counts the nodes the rollout covers: not those skipped for their own
    /// trouble (down, full, tainted), where no pod of any revision runs. Without a rollout step
    /// (no DaemonSet), the DaemonSet's own count.
    pub(super) fn covered(step: Option<&'a RolloutActions>, daemonset: Option<&DaemonSet>) -> Self {
        match step {
            Some(step) => Count { desired: step.desired, off: &step.off_kernel_count },
            None => Count {
                desired: daemonset.and_then(|d| d.status.as_ref()).map_or(0, |s| s.desired_number_scheduled),
                off: &[],
            },
        }
    }
}

/// Folds the kernel reports of the nodes that run the Scheduler's pod (and are still its own).
/// Early in a leadership term the table holds only the agents that reconnected so far: while
/// nodes without a report are the only thing short of the condition found, it is kept as it was,
/// until every node reported, or until a silent node would be stale anyway
/// (`--report-stale-after`, at least one heartbeat), longer while agents are still coming back.
/// A reported problem is news at once. Each ejection is recorded once: one from before this
/// term may have been recorded by the previous leader, which its events say.
pub(super) fn view(s: &Snapshot<'_>, count: &Count<'_>) -> View {
    let name = name_of(s);
    let stale_after = s.settings.stale_after;
    let scheduled: BTreeSet<String> =
        s.nodes.scheduled.intersection(&s.placement.owned).filter(|n| !count.off.contains(*n)).cloned().collect();
    let mut summary = kernel_summary::summarize(&name, &scheduled, count.desired, s.reports, s.clock.now, stale_after);
    let heartbeat = s.settings.heartbeat;
    let grace = stale_after.max(heartbeat);
    let grace_left = kernel_summary::grace_left(s.memory.term_age, grace, heartbeat, s.clock.since_arrival);
    summary.settled = !summary.awaits_reports(scheduled.len(), grace_left);
    // Each ejection's event once: not those this term recorded already...
    summary.ejections.retain(|e| !s.memory.exits_recorded.contains(&ejection_key(&e.node, &e.time)));
    let heard_ejections = summary.ejections.clone();
    // ...nor those the events show recorded (read when one is from before this term).
    summary.ejections.retain(|e| !s.memory.ejections_on_record.contains(&ejection_key(&e.node, &e.time)));
    View { summary, heard_ejections, grace_left }
}

/// Whether the reports of `scheduler` carry an ejection from before this term (`memory.term_age` before `wall`)
/// that this term has not recorded: then the Scheduler's KernelEjected events are read
/// ([`super::Memory::ejections_on_record`]) to know whether an earlier leader recorded it.
pub fn ejections_to_look_up(
    scheduler: &str,
    reports: &std::collections::HashMap<String, crate::kernel_summary::NodeReport>,
    memory: &super::Memory,
    wall: jiff::Timestamp,
) -> bool {
    let began = wall.checked_sub(memory.term_age).map(|t| format!("{t:.3}")).unwrap_or_default();
    reports
        .values()
        .filter(|r| r.scheduler == scheduler)
        .filter_map(|r| r.last_exit.as_ref())
        .filter(|e| e.ejected)
        .any(|e| e.time < began && !memory.exits_recorded.contains(&ejection_key(&e.node, &e.time)))
}
