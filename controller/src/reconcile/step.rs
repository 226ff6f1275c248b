//! One rollout step: the nodes and pods as the rollout sees them (`rollout::NodeView`), the
//! nodes entering from revision zero, and the step `sked_core::rollout` decides on them.

use super::*;

/// One step of a Scheduler's rollout, decided but not yet carried out.
pub(super) struct RolloutStep {
    pub(super) status: RolloutStatus,
    /// The image the DaemonSet's template runs.
    pub(super) image: String,
    /// Pods to delete, by name and uid (each comes back as the template's revision).
    pub(super) replace: Vec<(String, String)>,
    /// Set the template back to the current revision, for this failure (and whether it failed
    /// in this reconcile).
    pub(super) roll_back: Option<(RolloutFailure, bool)>,
    /// Entering nodes to label now, and labels to remove (a first revision failed).
    pub(super) admit: Vec<String>,
    pub(super) evict: Vec<String>,
    /// A first revision failed in this reconcile: its nodes go back to the kernel's default.
    pub(super) to_zero: Option<RolloutFailure>,
    pub(super) recheck_in: Option<Duration>,
    /// Skipped nodes KernelAttached does not count (see `rollout::Plan::off_kernel_count`).
    pub(super) off_kernel_count: Vec<String>,
    /// The nodes the rollout covers (`rollout::Plan::desired`): DESIRED.
    pub(super) desired: i32,
}

/// Reads the Scheduler's pods and kernel reports and decides the next rollout step.
pub(super) fn rollout_step(pass: &Pass<'_>, ds: &DaemonSet) -> RolloutStep {
    let Pass { ctx, scheduler, placement, previous_rollout: previous, failed, wanted, wall, .. } = *pass;
    let name = scheduler.name_any();
    let template = TemplateRevision::of(ds);
    let stable = previous.current_revision.as_ref().map(|r| r.name.as_str());
    let pods = ctx.index.pods_of(&name);
    let (labelled, entering) = entering_nodes(ctx, scheduler, placement);
    let nodes = node_views(pass, &labelled, &pods, &template);
    let plan = rollout::decide(&rollout::Input {
        target: &template.name,
        stable,
        nodes: &nodes,
        entering: &entering,
        // Held while the failure they were held under stands (as `rollout::advance` keeps them).
        held: if failed.is_some() { &previous.held_nodes } else { &[] },
        expected_pods: expected_pods(ctx, &name, ds, placement, &pods, nodes.len()),
        // A retry of a revision that failed under an earlier generation: the pods of that
        // attempt are replaced, not judged again.
        retried_after: previous
            .failed
            .as_ref()
            .filter(|f| failed.is_none() && f.revision == template.name)
            .map(|f| f.time.0.as_second()),
        pacing: rollout::Pacing::of(scheduler.spec.rollout.as_ref(), nodes.len() + entering.len()),
        now: wall,
    });
    let step = rollout::advance(&rollout::Progress {
        previous,
        failed,
        plan: &plan,
        template: crate::api::Revision {
            name: template.name.clone(),
            image: template.image.clone(),
            generation: scheduler.metadata.generation.unwrap_or(0),
            // The spec's fields, when the template is the spec's revision (not one rolled back to).
            spec: wanted
                .is_some_and(|(revision, _)| *revision == template.name)
                .then(|| RevisionSpec::of(&scheduler.spec)),
        },
        wanted: wanted.map(|(revision, image)| (revision.as_str(), image.as_str())),
        caught_up: caught_up(ctx, &name, ds),
        now: Time(jiff::Timestamp::now()),
    });
    if let Some(failure) = &step.newly_failed {
        warn!(revision = %failure.revision, node = %failure.node, cause = %failure.cause, "rollout failed");
        ctx.metrics.rolled_back(&name);
    }
    if step.status.failed.is_none() && failed.is_some() {
        info!(revision = %template.name, "the revision reported failed runs attached everywhere now");
    }
    let recheck_in =
        plan.recheck_in.map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(1)) + Duration::from_millis(200));
    RolloutStep {
        off_kernel_count: plan.off_kernel_count,
        ..RolloutStep::of(step, template.image, &pods, stable.is_none(), recheck_in)
    }
}

impl RolloutStep {
    /// The step `rollout::advance` decided, with the pods to replace named by uid too: a pod of
    /// the same name made since is not the one decided on.
    pub(super) fn of(
        step: rollout::Step,
        image: String,
        pods: &[Arc<SchedulerPod>],
        first_revision: bool,
        recheck_in: Option<Duration>,
    ) -> Self {
        let newly = step.newly_failed.is_some();
        let roll_back = step.status.failed.clone().filter(|_| step.roll_back).map(|f| (f, newly));
        // Nodes back to revision zero: a first revision failed, or a takeover under the stable one.
        let to_zero = step.newly_failed.clone().filter(|_| first_revision || !step.evict.is_empty());
        let replace = step
            .replace
            .into_iter()
            .filter_map(|name| {
                let uid = pods.iter().find(|p| p.name == name)?.uid.clone();
                Some((name, uid))
            })
            .collect();
        Self {
            status: step.status,
            image,
            replace,
            roll_back,
            admit: step.admit,
            evict: step.evict,
            to_zero,
            recheck_in,
            off_kernel_count: Vec::new(),
            desired: i32::try_from(step.desired).unwrap_or(i32::MAX),
        }
    }
}

/// Each labelled node with its pod (a live one before a terminating one) and what that pod's
/// agent last reported, if the report is fresh.
pub(super) fn node_views(
    pass: &Pass<'_>,
    labelled: &[String],
    pods: &[Arc<SchedulerPod>],
    template: &TemplateRevision,
) -> Vec<rollout::NodeView> {
    let Pass { ctx, scheduler, reports, now, .. } = *pass;
    let name = scheduler.name_any();
    let stale_after = ctx.flags.report_stale_after;
    let attach_timeout = Duration::from_secs(
        u64::try_from(rollout::Pacing::of(scheduler.spec.rollout.as_ref(), 1).attach_timeout_seconds).unwrap_or(1),
    );
    labelled
        .iter()
        .map(|node| {
            // A pod not bound yet counts for the node it is made for: one never bound is that
            // node's trouble, not a pod the DaemonSet controller still owes.
            let pod =
                pods.iter().filter(|p| p.node_or_target() == Some(node.as_str())).min_by_key(|p| p.is_terminating());
            let report = reports.get(node).filter(|r| r.scheduler == name && r.fresh(now, stale_after));
            node_view(pass, node, pod.map(|p| p.as_ref()), report, template, attach_timeout)
        })
        .collect()
}

/// The pods the DaemonSet controller means to run; until it has counted them, one per labelled
/// node. (Less the nodes another Scheduler took, which keep this one's pod until their wave, and
/// the nodes deleted under a pod: the DaemonSet controller counts such a node until the pod
/// garbage collector removes its pod, which may take a minute or never come.)
pub(super) fn expected_pods(
    ctx: &Context,
    name: &str,
    ds: &DaemonSet,
    placement: &sked_core::arbiter::Placement,
    pods: &[Arc<SchedulerPod>],
    labelled: usize,
) -> usize {
    let taken = ctx.index.labelled_nodes(name).iter().filter(|n| !placement.owned.contains(*n)).count();
    let node_gone = pods
        .iter()
        .filter(|p| !p.is_terminating())
        .filter(|p| p.node.as_deref().is_some_and(|n| !ctx.index.knows_node(n)))
        .count();
    ds.status
        .as_ref()
        .filter(|s| s.observed_generation.is_some())
        .map_or(labelled, |s| usize::try_from(s.desired_number_scheduled).unwrap_or(0))
        .saturating_sub(taken + node_gone)
}

/// The DaemonSet controller has seen the template, and this copy is not older than the one
/// this controller last applied (the index may lag behind its own write).
pub(super) fn caught_up(ctx: &Context, name: &str, ds: &DaemonSet) -> bool {
    let applied = lock(&ctx.memo.applied).get(name).map_or(0, |a| a.generation);
    let ds_generation = ds.metadata.generation.unwrap_or(0);
    ds.status.as_ref().and_then(|s| s.observed_generation).unwrap_or(0) >= ds_generation && ds_generation >= applied
}

/// One labelled node as the rollout sees it ([`sked_core::node_view::node_view`]): the term
/// forgets when it labelled a node once it runs attached, and the node's own state says
/// whether a pod can run there.
pub(super) fn node_view(
    pass: &Pass<'_>,
    node: &str,
    pod: Option<&SchedulerPod>,
    report: Option<&kernel::NodeReport>,
    template: &TemplateRevision,
    attach_timeout: Duration,
) -> rollout::NodeView {
    let Pass { ctx, scheduler, wall, .. } = *pass;
    let attached = sked_core::node_view::runs_attached(&sked_core::node_view::kernel_view(report, pod), pod);
    let ago = {
        let mut labelled = lock(&ctx.memo.labelled);
        if attached {
            labelled.remove(node);
            None
        } else {
            labelled.get(node).map(|at| at.elapsed())
        }
    };
    let labelling = Labelling { ago, term_age: ctx.memo.term_age(), attach_timeout };
    rollout::NodeView {
        unfit: unfit(ctx, scheduler, node),
        ..sked_core::node_view::node_view(node, pod, report, template, labelling, wall)
    }
}

/// The nodes the Scheduler owns, split into those that carry its owner label (sorted) and those
/// that do not yet, entering from revision zero. An entering node joined on its own when it was
/// created after the Scheduler and no other Scheduler's label is on it.
pub(super) fn entering_nodes(
    ctx: &Context,
    scheduler: &Scheduler,
    placement: &sked_core::arbiter::Placement,
) -> (Vec<String>, Vec<rollout::Entering>) {
    let name = scheduler.name_any();
    let created = scheduler.metadata.creation_timestamp.as_ref().map_or(i64::MAX, |t| t.0.as_second());
    let running = ctx.index.scheduled_nodes(&name);
    let mut labelled = Vec::new();
    let mut entering = Vec::new();
    for node in &placement.owned {
        match ctx.index.node_label(node, workload::OWNER_LABEL) {
            Some(Some(owner)) if owner == name => labelled.push(node.clone()),
            Some(owner) => {
                let joined = owner.is_none() && ctx.index.node_created(node).is_some_and(|t| t > created);
                entering.push(rollout::Entering {
                    node: node.clone(),
                    joined,
                    runs_it: running.contains(node),
                    unfit: unfit(ctx, scheduler, node),
                });
            }
            None => {}
        }
    }
    (labelled, entering)
}

/// Why no pod of `scheduler` can run on `node` now, if so: the Node is down, or it has a taint
/// the Scheduler does not tolerate.
pub(super) fn unfit(ctx: &Context, scheduler: &Scheduler, node: &str) -> Option<rollout::Skip> {
    let facts = ctx.index.node_facts(node)?;
    if facts.down() {
        Some(rollout::Skip::NodeNotReady)
    } else {
        facts.untolerated(&scheduler.spec.tolerations).map(|_| rollout::Skip::TaintNotTolerated)
    }
}

/// What keeps the Scheduler's pods off its tainted nodes, for its status: the taints by node,
/// a few of each; `None` when no owned node has a taint it does not tolerate.
pub(super) fn untolerated_taints(
    ctx: &Context,
    scheduler: &Scheduler,
    placement: &sked_core::arbiter::Placement,
) -> Option<String> {
    let mut by_taint: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for node in &placement.owned {
        let Some(facts) = ctx.index.node_facts(node) else { continue };
        if let Some(taint) = facts.untolerated(&scheduler.spec.tolerations) {
            by_taint.entry(sked_core::nodes::describe_taint(taint)).or_default().push(node);
        }
    }
    let count: usize = by_taint.values().map(Vec::len).sum();
    if count == 0 {
        return None;
    }
    let listed: Vec<String> = by_taint
        .iter()
        .take(3)
        .map(|(taint, nodes)| {
            let more = nodes.len().saturating_sub(3);
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            format!("{taint} on {}{more}", nodes.iter().take(3).copied().collect::<Vec<_>>().join(", "))
        })
        .collect();
    Some(format!(
        "{count} selected node(s) have a taint the Scheduler does not tolerate, so no pod of it can run there: {}; add a matching toleration to spec.tolerations",
        listed.join("; ")
    ))
}
