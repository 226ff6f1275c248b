//! The kernel reports of a Scheduler's nodes, folded for its KernelAttached condition, and the
//! ejections already recorded as events.

use super::*;

/// What the agents report of the Scheduler's nodes, as this reconcile sees it.
pub(super) struct KernelView {
    pub(super) summary: kernel::KernelSummary,
    /// Every ejection heard, recorded or not (they are marked recorded once the events are out).
    pub(super) heard_ejections: Vec<crate::api::KernelExit>,
    /// How much longer a new leader waits for agents before it judges silent nodes.
    pub(super) grace_left: Duration,
}

/// Which nodes KernelAttached counts: `desired` of them, none of `off` (skipped for their own
/// trouble).
pub(super) struct KernelCount<'a> {
    pub(super) desired: i32,
    pub(super) off: &'a [String],
}

impl<'a> KernelCount<'a> {
    /// KernelAttached counts the nodes the rollout covers: not those skipped for their own
    /// trouble (down, full, tainted), where no pod of any revision runs. Without a rollout step
    /// (no DaemonSet), the DaemonSet's own count.
    pub(super) fn covered(step: Option<&'a RolloutStep>, daemonset: Option<&DaemonSet>) -> Self {
        match step {
            Some(step) => KernelCount { desired: step.desired, off: &step.off_kernel_count },
            None => KernelCount {
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
pub(super) async fn kernel_view(pass: &Pass<'_>, count: &KernelCount<'_>) -> KernelView {
    let Pass { ctx, scheduler, placement, reports, now, .. } = *pass;
    let name = scheduler.name_any();
    let stale_after = ctx.flags.report_stale_after;
    let scheduled: BTreeSet<String> = ctx
        .index
        .scheduled_nodes(&name)
        .intersection(&placement.owned)
        .filter(|n| !count.off.contains(*n))
        .cloned()
        .collect();
    let desired = count.desired;
    let mut summary = kernel::summarize(&name, &scheduled, desired, reports, now, stale_after);
    let heartbeat = ctx.flags.agent_heartbeat_interval;
    let grace = ctx.flags.report_stale_after.max(heartbeat);
    let since_arrival = ctx.kernel.last_arrival().map(|t| now.saturating_duration_since(t));
    let grace_left = kernel::grace_left(ctx.memo.term_age(), grace, heartbeat, since_arrival);
    summary.settled = !summary.awaits_reports(scheduled.len(), grace_left);
    // Each ejection's event once: not those this term recorded already.
    summary.ejections.retain(|e| !ctx.memo.exit_recorded(e));
    let heard_ejections = summary.ejections.clone();
    let term_began =
        jiff::Timestamp::now().checked_sub(ctx.memo.term_age()).map(|t| format!("{t:.3}")).unwrap_or_default();
    if summary.ejections.iter().any(|e| e.time < term_began) {
        let recorded = recorded_ejections(ctx, scheduler).await;
        summary.ejections.retain(|e| !recorded.contains(&kernel::ejection_key(&e.node, &e.time)));
    }
    KernelView { summary, heard_ejections, grace_left }
}

/// Where the events of a Scheduler are (the recorder's namespace for cluster-scoped objects).
pub(super) const EVENTS_NAMESPACE: &str = "default";

/// The ejections of `scheduler` that have a KernelEjected event (recorded by this replica or an
/// earlier leader), read once per Scheduler and leadership term. Unreadable events count as
/// none: an event twice rather than none.
pub(super) async fn recorded_ejections(ctx: &Context, scheduler: &Scheduler) -> std::collections::HashSet<String> {
    let uid = scheduler.uid().unwrap_or_default();
    if let Some(known) = lock(&ctx.memo.recorded_ejections).get(&uid) {
        return known.clone();
    }
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(ctx.client.clone(), EVENTS_NAMESPACE);
    let params = ListParams::default().fields(&format!("regarding.uid={uid},reason={}", Reason::KernelEjected));
    let known: std::collections::HashSet<String> = match events.list(&params).await {
        Ok(list) => list
            .items
            .iter()
            .filter_map(|e| {
                // "Node <node>: the kernel ejected <ops> at <time> (<reason>...)"
                let (node, rest) = e.note.as_deref()?.strip_prefix("Node ")?.split_once(": the kernel ejected ")?;
                let time = rest.split_once(" at ")?.1.split_once(" (")?.0;
                Some(kernel::ejection_key(node, time))
            })
            .collect(),
        Err(e) => {
            warn!(err = %e, "could not read the recorded KernelEjected events; ejections from before this term may be recorded again");
            return Default::default();
        }
    };
    lock(&ctx.memo.recorded_ejections).insert(uid, known.clone());
    known
}
