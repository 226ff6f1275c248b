//! What one reconcile reads before it decides, read once into [`Observed`]: the Scheduler and
//! its placement, the status last written, the image's admission, the DaemonSet, the pods, the
//! nodes, the kernel reports, the clocks and this term's memory. [`Observed::snapshot`] lends it
//! to `sked_core::plan` as one immutable [`Snapshot`].

use super::*;
use sked_core::rollout::CanaryGate;

/// One reconcile's reads, owned.
pub(super) struct Observed {
    pub(super) scheduler: Arc<Scheduler>,
    placement: Placement,
    pub(super) previous: SchedulerStatus,
    admission: Result<plan::Admitted, plan::ImageRefusal>,
    /// Why the trust policy refused the image, if it did (the reconcile fails with it once the
    /// rest is done).
    pub(super) refusal: Option<TrustError>,
    daemonset: Option<Arc<DaemonSet>>,
    pods: Vec<Arc<SchedulerPod>>,
    nodes: plan::Nodes,
    reports: HashMap<String, kernel::NodeReport>,
    /// The nodes' health samples, read only when the Scheduler asks for analysis.
    health: std::collections::BTreeMap<String, sked_core::analysis::NodeHealth>,
    memory: plan::Memory,
    settings: plan::Settings,
    clock: plan::Clock,
}

impl Observed {
    /// The snapshot, deciding behind the canary gate `canary_gate`.
    pub(super) fn snapshot<'a>(&'a self, canary_gate: &'a CanaryGate) -> Snapshot<'a> {
        Snapshot {
            scheduler: &self.scheduler,
            placement: &self.placement,
            previous: &self.previous,
            admission: &self.admission,
            daemonset: self.daemonset.as_deref(),
            pods: &self.pods,
            nodes: &self.nodes,
            reports: &self.reports,
            health: &self.health,
            memory: &self.memory,
            settings: &self.settings,
            canary_gate,
            clock: self.clock,
        }
    }
}

/// Reads what the reconcile of the Scheduler `name` decides on; `None` when there is nothing to
/// decide (it is gone, or being deleted: the garbage collector removes its DaemonSet).
pub(super) async fn observe(ctx: &Context, name: &str) -> Option<Observed> {
    // The spec and the placement computed from it, read together.
    let Some((scheduler, placement)) = ctx.index.snapshot(name) else {
        debug!("Scheduler is gone");
        return None;
    };
    if scheduler.metadata.deletion_timestamp.is_some() {
        debug!("Scheduler is being deleted; nothing to apply");
        return None;
    }
    let uid = scheduler.uid().unwrap_or_default();
    let previous = lock(&ctx.memo.written).get(&uid).cloned().unwrap_or_else(|| scheduler.status_or_default());
    // The trust policy admits the image (whether or not the Scheduler has nodes, so its status
    // always tells) before anything is deployed; a refusal leaves the DaemonSet as it is.
    let admission = Box::pin(admit(ctx, &scheduler, &uid)).await;
    let (admission, refusal) = match admission {
        Ok(admitted) => {
            let key = ctx.trust.admission_key(&scheduler.spec.sched, &scheduler.spec.pull_secret_names());
            (Ok(plan::Admitted { image: admitted.image, key }), None)
        }
        Err(e) => {
            warn!(image = %scheduler.spec.sched, err = %e, "image refused; the DaemonSet is left as it is");
            (Err(plan::ImageRefusal { message: e.to_string(), transient: e.is_transient() }), Some(e))
        }
    };
    let daemonset = ctx.index.daemonset(name, &ctx.settings.namespace);
    let pods = ctx.index.pods_of(name);
    let nodes = ctx.index.nodes_of(name, &placement, &pods);
    let mut reports = ctx.kernel.reports_of(placement.owned.iter().chain(&nodes.scheduled));
    // Reports count for this Scheduler's own pods, by UID, never by its name.
    let own_daemonset = daemonset.as_deref().filter(|ds| {
        ds.owner_references().iter().any(|o| o.controller == Some(true) && o.kind == "Scheduler" && o.uid == uid)
    });
    sked_core::kernel_summary::keep_own_reports(
        &mut reports,
        &pods,
        own_daemonset.and_then(|ds| ds.metadata.uid.as_deref()),
    );
    let analysed = scheduler.spec.rollout.as_ref().is_some_and(|r| r.analysis.is_some());
    let health = if analysed { ctx.kernel.health.samples_of(&placement.owned) } else { Default::default() };
    let clock = plan::Clock {
        now: std::time::Instant::now(),
        wall: jiff::Timestamp::now(),
        since_arrival: ctx.kernel.last_arrival().map(|t| std::time::Instant::now().saturating_duration_since(t)),
    };
    let mut memory = memory_of(ctx, name, &nodes, &reports);
    if plan::ejections_to_look_up(name, &reports, &memory, clock.wall) {
        memory.ejections_on_record = recorded_ejections(ctx, &scheduler).await;
    }
    let settings = plan::Settings {
        workload: ctx.settings.clone(),
        stale_after: ctx.flags.report_stale_after,
        heartbeat: ctx.flags.agent_heartbeat_interval,
    };
    Some(Observed {
        scheduler,
        placement,
        previous,
        admission,
        refusal,
        daemonset,
        pods,
        nodes,
        reports,
        health,
        memory,
        settings,
        clock,
    })
}

/// What this term remembers of the Scheduler `name` and its nodes.
fn memory_of(
    ctx: &Context,
    name: &str,
    nodes: &plan::Nodes,
    reports: &HashMap<String, kernel::NodeReport>,
) -> plan::Memory {
    let expected = ctx.memo.expectations.of(name, nodes.known.keys());
    let exits_recorded = reports
        .values()
        .filter_map(|r| r.last_exit.as_ref())
        .filter(|e| ctx.memo.exit_recorded(e))
        .map(|e| kernel::ejection_key(&e.node, &e.time))
        .collect();
    plan::Memory {
        term_age: ctx.memo.term_age(),
        labelled: expected.labelled,
        label_versions: expected.label_versions,
        applied: lock(&ctx.memo.applied).get(name).cloned(),
        exits_recorded,
        ejections_on_record: Default::default(),
        conditions_sent: lock(&ctx.memo.pod_conditions).get(name).cloned().unwrap_or_default(),
        replaced: expected.replaced,
    }
}

/// Where the events of a Scheduler are (the recorder's namespace for cluster-scoped objects).
pub(super) const EVENTS_NAMESPACE: &str = "default";

/// The ejections of `scheduler` that have a KernelEjected event (recorded by this replica or an
/// earlier leader), read once per Scheduler and leadership term. Unreadable events count as
/// none: an event twice rather than none.
async fn recorded_ejections(ctx: &Context, scheduler: &Scheduler) -> std::collections::HashSet<String> {
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
