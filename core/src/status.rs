//! A Scheduler's status and the event to record, as a pure function of what was observed.
//!
//! Two axes make up the state:
//! - rollout (conditions Ready and Progressing): `RolloutInProgress` until the DaemonSet runs
//!   the current spec on every scheduled node for the first time, then `DaemonSetReady`;
//!   pods that stop being available after that are `NodesUnavailable`; no scheduled node at all
//!   is `NoNodesScheduled`;
//! - health (condition Degraded): `SchedulerConflict` when older Schedulers own some selected
//!   nodes, `NodesUnavailable` when scheduled pods are not available, else `AsExpected`.
//!
//! An event is recorded only when the state key changes: a Warning with the Degraded reason
//! while degraded, otherwise a Normal event with the rollout reason. Pod counts and messages
//! are not part of the key, so re-reconciles and count changes record nothing.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::arbiter::Placement;
use crate::kernel_summary::KernelSummary;
use sked_api::{Reason, RolloutPhase, RolloutStatus, SchedulerStatus, condition};

/// At most this many winner names are listed in a conflict message.
const MAX_WINNERS_LISTED: usize = 3;

/// Everything the status depends on.
#[derive(Clone, Debug)]
pub struct Inputs<'a> {
    /// `metadata.generation` of the Scheduler.
    pub generation: Option<i64>,
    /// The status as last written (by this controller, or as read from the API server).
    pub previous: &'a SchedulerStatus,
    /// The DaemonSet as the API server returned it, or `None` when there is none.
    pub daemonset: Option<&'a DaemonSet>,
    /// Which selected nodes the Scheduler owns and lost.
    pub placement: &'a Placement,
    /// The image this reconcile deployed; `None` when it deployed nothing new (the status
    /// keeps the image last resolved).
    pub image: Option<&'a str>,
    /// Why the API server refused the DaemonSet built from this spec, if it did.
    pub spec_error: Option<&'a str>,
    /// Why the image may not run (trust policy, registry, signature), if so.
    pub image_error: Option<&'a str>,
    /// That refusal may go away by itself (the registry or the trust root could not be reached).
    pub image_error_transient: bool,
    /// What the agents report of the kernels of this Scheduler's nodes.
    pub kernel: &'a KernelSummary,
    /// The rollout as this reconcile decided it (`None` without a DaemonSet).
    pub rollout: Option<&'a RolloutStatus>,
    /// The nodes that rollout covers (`rollout::Decision::desired`: every owned node, less those
    /// skipped for their own trouble): what DESIRED shows. `None` when no rollout was decided:
    /// then the DaemonSet's count and the nodes waiting to enter.
    pub desired: Option<i32>,
    /// Which taints keep the Scheduler's pods off its selected nodes, if any do.
    pub untolerated: Option<&'a str>,
    /// Whether it may start a canary now, and how many may run at once while it is queued.
    pub canary_gate: &'a crate::rollout::CanaryGate,
    pub now: Time,
}

/// Kind of a Kubernetes event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Normal,
    Warning,
}

/// An event to record on the Scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventSpec {
    pub kind: EventKind,
    pub reason: Reason,
    pub message: String,
}

/// The new status and, on a change of state, the events to record once it is saved.
#[derive(Clone, Debug, PartialEq)]
pub struct NewStatus {
    pub status: SchedulerStatus,
    /// Rollout and health (Ready/Degraded) state change.
    pub event: Option<EventSpec>,
    /// KernelAttached state change.
    pub kernel_event: Option<EventSpec>,
    /// PodCPUContract change: a Warning when it turns False (once per reason), a Normal event
    /// when it comes back True from False.
    pub contract_event: Option<EventSpec>,
    /// One per ejection this controller has not recorded yet.
    pub exit_events: Vec<EventSpec>,
}

/// Rollout facts read off a DaemonSet and the rollout decided for it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Rollout {
    /// The DaemonSet controller has seen the DaemonSet's current generation.
    observed: bool,
    desired: i32,
    updated: i32,
    ready: i32,
    available: i32,
    phase: RolloutPhase,
    /// The revision being rolled out.
    revision: String,
    attached: i32,
    /// A revision completed a rollout before (one runs everywhere to fall back on).
    ran_everywhere: bool,
}

impl Rollout {
    fn of(ds: Option<&DaemonSet>, rollout: Option<&RolloutStatus>, covered: Option<i32>) -> Self {
        let Some(ds) = ds else { return Self { observed: true, ..Self::default() } };
        let Some(st) = ds.status.as_ref() else { return Self::default() };
        let rollout = rollout.cloned().unwrap_or_default();
        // The nodes the rollout covers, entering ones too (a paced first deployment on 20 nodes
        // is 1 of 20, not 1 of 1), not those skipped for their own trouble; from the
        // DaemonSet's count while no rollout has counted them.
        let desired = covered.unwrap_or_else(|| st.desired_number_scheduled.saturating_add(rollout.entering_nodes));
        Self {
            observed: st.observed_generation.unwrap_or(0) >= ds.metadata.generation.unwrap_or(0),
            desired,
            updated: rollout.updated_nodes,
            // A skipped node's pod may still count (a node gone NotReady keeps its pod's last
            // status): never more than the nodes counted.
            ready: st.number_ready.min(desired),
            available: st.number_available.unwrap_or(0).min(desired),
            phase: rollout.phase,
            revision: rollout.update_revision.map(|r| r.name).unwrap_or_default(),
            attached: rollout.attached_nodes,
            ran_everywhere: rollout.current_revision.is_some(),
        }
    }

    /// A rollout is under way (its waves may still replace pods).
    fn rolling(&self) -> bool {
        matches!(self.phase, RolloutPhase::Queued | RolloutPhase::Canary | RolloutPhase::Rolling | RolloutPhase::Paused)
    }

    fn complete(&self) -> bool {
        self.observed && !self.rolling() && self.available >= self.desired
    }
}

/// The rollout axis: Ready and Progressing describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RolloutState {
    reason: Reason,
    message: String,
}

/// The health axis: the Degraded condition.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Health {
    degraded: bool,
    reason: Reason,
    message: String,
}

impl Health {
    fn degraded(reason: Reason, message: String) -> Self {
        Self { degraded: true, reason, message }
    }

    /// Not degraded, with a message that says what is true of the pods right now.
    fn as_expected(rollout: Option<&Rollout>) -> Self {
        let message = match rollout {
            None => "No conflicts; the DaemonSet controller has not counted the pods yet".to_owned(),
            Some(r) if r.desired <= 0 => "No conflicts; no node is scheduled".to_owned(),
            Some(r) if r.complete() => "No conflicts and every scheduled pod is available".to_owned(),
            Some(r) => format!(
                "No conflicts; {} of {} scheduled pods are available, the rollout is in progress",
                r.available, r.desired
            ),
        };
        Self { degraded: false, reason: Reason::AsExpected, message }
    }
}

/// Computes the status and the event for one reconcile.
pub fn compute(obs: &Inputs<'_>) -> NewStatus {
    let rollout = Rollout::of(obs.daemonset, obs.rollout, obs.desired);
    let ds_name = daemonset_name(obs.daemonset);
    // Rollout axis, known only once the DaemonSet controller has seen the current DaemonSet.
    let rollout_state = rollout.observed.then(|| rollout_state(&rollout, obs, &ds_name));
    let health = health(obs, &rollout, rollout_state.as_ref());
    let ready_state = rollout_state.as_ref().map(|r| ready_state(r, &rollout, &ds_name));

    let mut conditions = rollout_conditions(obs, &rollout, rollout_state.as_ref(), ready_state.as_ref());
    conditions.extend(kstatus_conditions(obs, &health, rollout_state.as_ref(), &ds_name));
    let prev = &obs.previous.conditions;
    conditions.push(condition(
        prev,
        condition::DEGRADED,
        health.degraded,
        health.reason,
        &health.message,
        obs.generation,
        &obs.now,
    ));
    // A new leader that has not heard every agent yet keeps the kernel view it found.
    let carried = (!obs.kernel.settled).then(|| find(prev, condition::KERNEL_ATTACHED)).flatten();
    conditions.push(carried.cloned().unwrap_or_else(|| kernel_condition(obs)));
    let contract = &obs.kernel.cpu_contract;
    let contract_carried = (!obs.kernel.settled).then(|| find(prev, condition::POD_CPU_CONTRACT)).flatten();
    conditions.push(contract_carried.cloned().unwrap_or_else(|| {
        let status = contract.status.map_or("Unknown", |t| if t { "True" } else { "False" });
        let type_ = condition::POD_CPU_CONTRACT;
        condition_of(prev, type_, status, contract.reason, &contract.message, obs.generation, &obs.now)
    }));
    // Conditions this module does not own are carried over untouched.
    const OWNED: [&str; 7] = [
        condition::READY,
        condition::PROGRESSING,
        condition::RECONCILING,
        condition::STALLED,
        condition::DEGRADED,
        condition::KERNEL_ATTACHED,
        condition::POD_CPU_CONTRACT,
    ];
    conditions.extend(prev.iter().filter(|c| !OWNED.contains(&c.type_.as_str())).cloned());

    let status = scheduler_status(obs, &rollout, carried.is_some(), conditions);
    let event = state_event(obs, &status, &health, ready_state);
    NewStatus {
        status,
        event,
        kernel_event: kernel_event(obs, carried.is_some()),
        contract_event: contract_event(obs, contract_carried.is_some()),
        exit_events: exit_events(obs.kernel),
    }
}

/// "DaemonSet namespace/name", as conditions name it.
fn daemonset_name(daemonset: Option<&DaemonSet>) -> String {
    daemonset
        .map(|ds| {
            format!(
                "DaemonSet {}/{}",
                ds.metadata.namespace.as_deref().unwrap_or_default(),
                ds.metadata.name.as_deref().unwrap_or_default()
            )
        })
        .unwrap_or_else(|| "the DaemonSet".to_owned())
}

/// While a rollout is under way, Ready says whether the pods that run are all available, once
/// a revision ran everywhere: a first deployment is not Ready before it is Complete.
fn ready_state(state: &RolloutState, rollout: &Rollout, ds_name: &str) -> RolloutState {
    match state.reason {
        Reason::RolloutInProgress | Reason::RolloutPaused
            if rollout.ran_everywhere && rollout.desired > 0 && rollout.available >= rollout.desired =>
        {
            RolloutState {
                reason: Reason::DaemonSetReady,
                message: format!(
                    "{ds_name}: {} of {} pods available; {}",
                    rollout.available, rollout.desired, state.message
                ),
            }
        }
        _ => state.clone(),
    }
}

/// Ready and Progressing. Until the DaemonSet controller reports, both keep describing the last
/// known state (with that state's observedGeneration).
fn rollout_conditions(
    obs: &Inputs<'_>,
    rollout: &Rollout,
    state: Option<&RolloutState>,
    ready: Option<&RolloutState>,
) -> Vec<Condition> {
    let prev = &obs.previous.conditions;
    let (Some(state), Some(ready)) = (state, ready) else {
        return [condition::READY, condition::PROGRESSING].iter().filter_map(|t| find(prev, t).cloned()).collect();
    };
    // Ready describes the generation whose revision runs: while a newer generation is refused,
    // rolling out or rolled back, it does not claim that one.
    let settled = !rollout.rolling()
        && obs.image_error.is_none()
        && obs.spec_error.is_none()
        && !matches!(rollout.phase, RolloutPhase::RolledBack | RolloutPhase::Failed);
    let running_generation = obs.rollout.and_then(|r| r.current_revision.as_ref()).map(|r| r.generation);
    let ready_before = find(prev, condition::READY).and_then(|c| c.observed_generation);
    let ready_generation =
        if settled { obs.generation } else { running_generation.or(ready_before).or(obs.generation) };
    vec![
        condition(
            prev,
            condition::READY,
            ready.reason == Reason::DaemonSetReady,
            ready.reason,
            &ready.message,
            ready_generation,
            &obs.now,
        ),
        condition(
            prev,
            condition::PROGRESSING,
            state.reason == Reason::RolloutInProgress,
            state.reason,
            &state.message,
            obs.generation,
            &obs.now,
        ),
    ]
}

/// The kstatus pair: Reconciling while the controller works toward this generation, Stalled
/// when it cannot get there without a change of spec.
fn kstatus_conditions(
    obs: &Inputs<'_>,
    health: &Health,
    state: Option<&RolloutState>,
    ds_name: &str,
) -> [Condition; 2] {
    // Stalled: only a change of spec (or of the policy) gets the controller further. A registry
    // that cannot be reached is retried: that is still reconciling.
    let stalled = match health.reason {
        Reason::SpecInvalid | Reason::RolloutFailed => true,
        Reason::ImageVerificationFailed => !obs.image_error_transient,
        _ => false,
    };
    let retrying = health.reason == Reason::ImageVerificationFailed && obs.image_error_transient;
    let reconciling = !stalled
        && (retrying || state.is_none_or(|r| matches!(r.reason, Reason::RolloutInProgress | Reason::RolloutPaused)));
    let (reconciling_reason, reconciling_message) = match state {
        _ if retrying => (health.reason, health.message.clone()),
        Some(r) => (r.reason, r.message.clone()),
        None => (Reason::RolloutInProgress, format!("Waiting for the DaemonSet controller to observe {ds_name}")),
    };
    let prev = &obs.previous.conditions;
    [
        condition(
            prev,
            condition::RECONCILING,
            reconciling,
            if reconciling || stalled { reconciling_reason } else { Reason::AsExpected },
            &reconciling_message,
            obs.generation,
            &obs.now,
        ),
        condition(
            prev,
            condition::STALLED,
            stalled,
            if stalled { health.reason } else { Reason::AsExpected },
            if stalled { &health.message } else { "Nothing stops the controller from reaching the current generation" },
            obs.generation,
            &obs.now,
        ),
    ]
}

/// KernelAttached as the agents' reports tell it, with the selected nodes that have no
/// sched_ext named.
fn kernel_condition(obs: &Inputs<'_>) -> Condition {
    let k = obs.kernel;
    let unsupported = &obs.placement.unsupported;
    let back_to_zero = obs.rollout.filter(|r| r.phase == RolloutPhase::Failed);
    let message = if let Some(r) = back_to_zero {
        // Not "N more nodes wait for a pod": none gets one until the spec changes.
        let revision = r
            .failed
            .as_ref()
            .map(|f| f.revision.as_str())
            .or(r.update_revision.as_ref().map(|u| u.name.as_str()))
            .unwrap_or_default();
        let rolled_back = format!(
            "revision {revision} failed and was rolled back to the kernel's default scheduler, and no node gets a pod until the spec changes"
        );
        if k.attached == 0 {
            format!("No node runs this scheduler: {rolled_back}")
        } else {
            format!(
                "{} of {} scheduled nodes run this scheduler in the kernel until their pods are gone: {rolled_back}",
                k.attached, k.scheduled
            )
        }
    } else if unsupported.is_empty() {
        format!("{}{}", k.message, skipped_summary(obs.rollout))
    } else {
        let names: Vec<&str> = unsupported.iter().take(MAX_WINNERS_LISTED).map(String::as_str).collect();
        let more = unsupported.len().saturating_sub(MAX_WINNERS_LISTED);
        let more = if more > 0 { format!(" (and {more} more)") } else { String::new() };
        format!(
            "{}; {} selected node(s) have no sched_ext in their kernel and run no pod until it changes: {}{more}",
            k.message,
            unsupported.len(),
            names.join(", ")
        )
    };
    condition(
        &obs.previous.conditions,
        condition::KERNEL_ATTACHED,
        k.is_true,
        k.reason,
        &message,
        obs.generation,
        &obs.now,
    )
}

/// The status fields around the conditions; `kernel_carried` keeps the kernel count found
/// alongside the KernelAttached condition kept.
fn scheduler_status(
    obs: &Inputs<'_>,
    rollout: &Rollout,
    kernel_carried: bool,
    conditions: Vec<Condition>,
) -> SchedulerStatus {
    let k = obs.kernel;
    let attached = if kernel_carried { obs.previous.kernel_attached } else { k.attached };
    // The newest exit replaces the one kept, and so does the same exit with its detail now.
    let newer_exit = k.last_exit.as_ref().filter(|e| {
        obs.previous
            .last_exit
            .as_ref()
            .is_none_or(|known| e.is_newer_than(known) || (e.is_same_as(known) && *e != known))
    });
    let kernel_attached = attached.min(rollout.desired);
    SchedulerStatus {
        observed_generation: obs.generation,
        resolved_image: obs.image.map(str::to_owned).or_else(|| obs.previous.resolved_image.clone()),
        desired_number_scheduled: rollout.desired,
        number_ready: rollout.ready,
        number_available: rollout.available,
        kernel_attached,
        kernel_attached_summary: Some(format!("{kernel_attached}/{}", rollout.desired)),
        conflicting_nodes: i32::try_from(obs.placement.lost.len()).unwrap_or(i32::MAX),
        unsupported_nodes: i32::try_from(obs.placement.unsupported.len()).unwrap_or(i32::MAX),
        updated_number_scheduled: obs.rollout.map_or(0, |r| r.updated_nodes),
        rollout: obs.rollout.cloned().or_else(|| obs.previous.rollout.clone()),
        last_exit: newer_exit.cloned().or_else(|| obs.previous.last_exit.clone()),
        conditions,
    }
}

/// The rollout or health event, when the state an event describes changed. A rollout state
/// carried over while the DaemonSet controller catches up is not news; a conflict or a refused
/// spec is.
fn state_event(
    obs: &Inputs<'_>,
    status: &SchedulerStatus,
    health: &Health,
    ready: Option<RolloutState>,
) -> Option<EventSpec> {
    let key = state_key(status);
    if key.is_none() || key == state_key(obs.previous) {
        return None;
    }
    if health.degraded {
        return Some(EventSpec { kind: EventKind::Warning, reason: health.reason, message: health.message.clone() });
    }
    ready.map(|r| EventSpec { kind: EventKind::Normal, reason: r.reason, message: r.message })
}

/// The kernel event: on a change of the KernelAttached reason, once there is something to say
/// (not for the first "nothing scheduled yet"), and never while the condition is carried.
fn kernel_event(obs: &Inputs<'_>, kernel_carried: bool) -> Option<EventSpec> {
    let k = obs.kernel;
    let prev_kernel = find(&obs.previous.conditions, condition::KERNEL_ATTACHED);
    let first_and_idle = prev_kernel.is_none() && k.reason == Reason::NotAttached;
    (!kernel_carried && !prev_kernel.is_some_and(|c| k.reason.is_of(c)) && !first_and_idle).then(|| EventSpec {
        kind: match k.reason {
            Reason::KernelAttached | Reason::NotAttached => EventKind::Normal,
            _ => EventKind::Warning,
        },
        reason: k.reason,
        message: k.message.clone(),
    })
}

/// The PodCPUContract event: a Warning each time the condition turns False for a new reason,
/// a Normal event when it turns True from False; none while a new leader carries the condition,
/// and none for Unknown.
fn contract_event(obs: &Inputs<'_>, carried: bool) -> Option<EventSpec> {
    let c = &obs.kernel.cpu_contract;
    let prev = find(&obs.previous.conditions, condition::POD_CPU_CONTRACT);
    let changed = !prev.is_some_and(|p| c.reason.is_of(p));
    let kind = match c.status {
        Some(false) => EventKind::Warning,
        Some(true) if prev.is_some_and(|p| p.status == "False") => EventKind::Normal,
        _ => return None,
    };
    (changed && !carried).then(|| EventSpec { kind, reason: c.reason, message: c.message.clone() })
}

/// One Warning per ejection the kernel summary holds.
fn exit_events(kernel: &KernelSummary) -> Vec<EventSpec> {
    kernel
        .ejections
        .iter()
        .map(|e| EventSpec {
            kind: EventKind::Warning,
            reason: Reason::KernelEjected,
            message: format!("Node {}: {}", e.node, e.describe()),
        })
        .collect()
}

/// The Degraded condition: a refused spec, then a refused image, then a conflict, then pods
/// that stopped being available.
fn health(obs: &Inputs<'_>, rollout: &Rollout, rollout_state: Option<&RolloutState>) -> Health {
    if let Some(why) = obs.spec_error {
        return Health::degraded(
            Reason::SpecInvalid,
            format!("The API server refused the DaemonSet built from this spec; fix the Scheduler's spec: {why}"),
        );
    }
    if let Some(why) = obs.image_error {
        return Health::degraded(
            Reason::ImageVerificationFailed,
            format!("{why}. The running DaemonSet (if any) is kept as it was; retrying with backoff"),
        );
    }
    if let Some(msg) = obs.rollout.and_then(|r| rollout_failure_message(r, obs.generation)) {
        return Health::degraded(Reason::RolloutFailed, msg);
    }
    if let Some(msg) = conflict_message(obs.placement) {
        return Health::degraded(Reason::SchedulerConflict, msg);
    }
    match (rollout_state, find(&obs.previous.conditions, condition::DEGRADED)) {
        (Some(r), _) if r.reason == Reason::NodesUnavailable => Health::degraded(r.reason, r.message.clone()),
        // Not known yet: keep what was last known.
        (None, Some(d)) if Reason::NodesUnavailable.is_of(d) => {
            Health { degraded: d.status == "True", reason: Reason::NodesUnavailable, message: d.message.clone() }
        }
        _ => Health::as_expected(rollout.observed.then_some(rollout)),
    }
}

/// The nodes a rollout leaves out, counted by reason ("; 3 nodes skipped: 2 NodeNotReady, 1
/// TaintNotTolerated"), or nothing.
fn skipped_summary(rollout: Option<&RolloutStatus>) -> String {
    let Some(reasons) = rollout.map(|r| &r.skipped_reasons).filter(|r| !r.is_empty()) else { return String::new() };
    let total: i32 = reasons.values().sum();
    let by: Vec<String> = reasons.iter().map(|(why, n)| format!("{n} {why}")).collect();
    format!("; {total} node(s) skipped ({}): see status.rollout.skippedNodes", by.join(", "))
}

/// What a failed rollout of the current generation says, if it failed.
fn rollout_failure_message(rollout: &RolloutStatus, generation: Option<i64>) -> Option<String> {
    let failed = rollout.failed.as_ref().filter(|f| Some(f.generation) == generation)?;
    let what = format!("Revision {} failed on node {}: {}", failed.revision, failed.node, failed.cause);
    Some(match (&rollout.phase, &rollout.current_revision) {
        (RolloutPhase::RolledBack, Some(current)) if current.name == failed.revision => format!(
            "{what}. It was taking that node over from the kernel's default scheduler (or another Scheduler): the nodes where it failed run the kernel's default scheduler again, and no other node enters until the spec changes (to retry the same spec, pause and resume the rollout)"
        ),
        (RolloutPhase::RolledBack, Some(current)) => format!(
            "{what}. The nodes it reached run revision {} ({}) again; it is not tried again until the spec changes (to retry the same spec, pause and resume the rollout)",
            current.name, current.image
        ),
        _ => format!(
            "{what}. No earlier revision ever attached, so it was rolled back to revision zero: the nodes it reached run the kernel's default scheduler again. It is not tried again until the spec changes; fix the image or the spec"
        ),
    })
}

/// Why no node is scheduled: the taints that keep every pod away, every node skipped for its
/// own trouble, no node selected, or every selected node lost to an older Scheduler.
fn no_nodes_message(obs: &Inputs<'_>) -> String {
    let skipped = skipped_summary(obs.rollout);
    let why = match obs.untolerated {
        Some(taints) => taints,
        None if !skipped.is_empty() => {
            return format!("No node can run the scheduler now{skipped}; each enters by itself once it can");
        }
        None if obs.placement.lost.is_empty() => {
            "no node matches the nodeSelector, or the matching nodes have taints the Scheduler does not tolerate"
        }
        None => "every selected node belongs to an older Scheduler",
    };
    format!("No nodes scheduled: {why}")
}

/// The rollout state of an observed DaemonSet.
fn rollout_state(rollout: &Rollout, obs: &Inputs<'_>, ds_name: &str) -> RolloutState {
    let state = |reason, message| RolloutState { reason, message };
    let previous = obs.previous;
    let prev_ready = find(&previous.conditions, condition::READY).filter(|c| c.observed_generation == obs.generation);
    let was_ready = prev_ready.is_some_and(|c| c.status == "True");
    let was_unavailable = prev_ready.is_some_and(|c| Reason::NodesUnavailable.is_of(c));
    if rollout.phase == RolloutPhase::Failed {
        // Back on revision zero: no node runs this Scheduler until the spec changes.
        return state(
            Reason::RolloutFailed,
            format!(
                "Revision {} failed and was rolled back to the kernel's default scheduler: no node runs this Scheduler until the spec changes",
                rollout.revision
            ),
        );
    }
    if rollout.desired == 0 {
        return state(Reason::NoNodesScheduled, no_nodes_message(obs));
    }
    match rollout.phase {
        RolloutPhase::Paused => {
            // Paused by the spec, or held by an Inconclusive verdict: say which.
            let held = obs.rollout.and_then(|r| r.analysis.as_ref()).filter(|a| a.holds);
            let why = match held {
                Some(a) => format!(
                    "the analysis of the last bake was Inconclusive ({}); kubectl sked rollout proceed goes on",
                    a.message
                ),
                None => "spec.rollout.paused".to_owned(),
            };
            return state(
                Reason::RolloutPaused,
                format!(
                    "Rollout paused ({why}): {} of {} nodes run revision {}",
                    rollout.updated, rollout.desired, rollout.revision
                ),
            );
        }
        RolloutPhase::Queued => {
            return state(Reason::RolloutInProgress, queued_message(rollout, obs.canary_gate));
        }
        RolloutPhase::Canary | RolloutPhase::Rolling => {
            return state(
                Reason::RolloutInProgress,
                format!(
                    "{}: {} of {} nodes run revision {}, {} of them Ready with the scheduler attached{}",
                    rollout.phase.as_str(),
                    rollout.updated,
                    rollout.desired,
                    rollout.revision,
                    rollout.attached,
                    skipped_summary(obs.rollout)
                ),
            );
        }
        _ => {}
    }
    if rollout.complete() {
        return state(
            Reason::DaemonSetReady,
            format!(
                "{ds_name}: {} of {} pods available{}",
                rollout.available,
                rollout.desired,
                skipped_summary(obs.rollout)
            ),
        );
    }
    // Unavailable means a pod that was available stopped being so; pods on nodes that just
    // joined are still rolling out.
    let lost_one = was_ready && rollout.available < previous.number_available;
    if !rollout.rolling() && (was_unavailable || lost_one) {
        let down = rollout.desired - rollout.available;
        return state(
            Reason::NodesUnavailable,
            format!("{ds_name}: {down} of {} scheduled pods are not available", rollout.desired),
        );
    }
    state(Reason::RolloutInProgress, format!("{ds_name}: {} of {} pods available", rollout.available, rollout.desired))
}

/// Why a rollout waits to start its canary. It names no other Scheduler: the message stays the
/// same while the slot passes from one to the next, so a queued Scheduler's status is written
/// once, not at every hand-off.
fn queued_message(rollout: &Rollout, gate: &crate::rollout::CanaryGate) -> String {
    let waiting = format!(
        "Queued: revision {} waits to start its canary ({} of {} nodes run it)",
        rollout.revision, rollout.updated, rollout.desired
    );
    match gate {
        crate::rollout::CanaryGate::Full { max } => format!(
            "{waiting}: other Schedulers run their canary, at most {max} at a time (the controller's --max-concurrent-canaries, chart value rollout.maxConcurrentCanaries); it starts once a slot is free (kubectl get schedulers: PHASE Canary shows who holds one)"
        ),
        crate::rollout::CanaryGate::Open => {
            format!("{waiting}: a canary slot is free, it starts at the next reconcile")
        }
    }
}

fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// The part of a status that decides whether an event is due.
pub fn state_key(status: &SchedulerStatus) -> Option<(EventKind, String)> {
    let find = |t: &str| status.conditions.iter().find(|c| c.type_ == t);
    if let Some(d) = find(condition::DEGRADED).filter(|d| d.status == "True") {
        return Some((EventKind::Warning, d.reason.clone()));
    }
    find(condition::READY).map(|r| (EventKind::Normal, r.reason.clone()))
}

fn conflict_message(placement: &Placement) -> Option<String> {
    if placement.lost.is_empty() {
        return None;
    }
    let winners = placement.winners();
    let mut listed: Vec<&str> = winners.iter().copied().take(MAX_WINNERS_LISTED).collect();
    let more = winners.len().saturating_sub(MAX_WINNERS_LISTED);
    let more = if more > 0 { format!(" and {more} more") } else { String::new() };
    let lost = placement.lost.len();
    let of = lost + placement.owned.len();
    listed.sort_unstable();
    // Say why they won: a winner created in the same second won on its name, not its age.
    let whose = if placement.tied.is_empty() {
        "older Schedulers"
    } else if placement.tied.len() == winners.len() {
        "Schedulers created in the same second and earlier by name"
    } else {
        "Schedulers that are older, or created in the same second and earlier by name"
    };
    Some(format!("{lost} of {of} selected nodes belong to {whose}: {}{more}", listed.join(", ")))
}

/// A condition, keeping the previous transition time unless its status flips.
fn condition(
    previous: &[Condition],
    type_: &str,
    is_true: bool,
    reason: Reason,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let status = if is_true { "True" } else { "False" };
    condition_of(previous, type_, status, reason, message, generation, now)
}

/// A condition of `status` ("True", "False" or "Unknown"), keeping its last transition time
/// while the status stays.
fn condition_of(
    previous: &[Condition],
    type_: &str,
    status: &str,
    reason: Reason,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.as_str().to_owned(),
        message: message.to_owned(),
        observed_generation: generation,
        last_transition_time,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DaemonSetStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::{BTreeMap, BTreeSet};

    fn time(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    fn ds(generation: i64, observed: i64, desired: i32, updated: i32, available: i32) -> DaemonSet {
        DaemonSet {
            metadata: ObjectMeta {
                name: Some("rusty".into()),
                namespace: Some("sked-system".into()),
                generation: Some(generation),
                ..Default::default()
            },
            spec: Default::default(),
            status: Some(DaemonSetStatus {
                observed_generation: Some(observed),
                desired_number_scheduled: desired,
                current_number_scheduled: desired,
                updated_number_scheduled: Some(updated),
                number_ready: available,
                number_available: Some(available),
                ..Default::default()
            }),
        }
    }

    struct Run {
        previous: SchedulerStatus,
        generation: i64,
        clock: i64,
        kernel: KernelSummary,
    }

    /// The rollout a DaemonSet's counts stand for: rolling while some pods run another revision.
    fn rollout_of(ds: &DaemonSet) -> RolloutStatus {
        let st = ds.status.clone().unwrap_or_default();
        let updated = st.updated_number_scheduled.unwrap_or(0);
        RolloutStatus {
            phase: if updated < st.desired_number_scheduled { RolloutPhase::Rolling } else { RolloutPhase::Complete },
            updated_nodes: updated,
            // A revision ran everywhere before (these tests follow a Scheduler past its first
            // deployment).
            current_revision: Some(sked_api::Revision {
                name: "r0".into(),
                image: "i".into(),
                generation: 1,
                spec: None,
                agent_image: None,
            }),
            ..Default::default()
        }
    }

    fn kernel(attached: i32, desired: i32, reason: &'static str) -> KernelSummary {
        let reason = Reason::parse(reason).unwrap();
        KernelSummary {
            attached,
            scheduled: desired,
            is_true: reason == Reason::KernelAttached,
            reason,
            message: format!("{attached} of {desired}"),
            unreported: 0,
            settled: true,
            last_exit: None,
            ejections: Vec::new(),
            cpu_contract: crate::cpu_contract::Fold::default().finish(),
        }
    }

    impl Run {
        fn new() -> Self {
            Self {
                previous: SchedulerStatus::default(),
                generation: 1,
                clock: 1000,
                kernel: kernel(0, 0, "NotAttached"),
            }
        }

        fn step(&mut self, daemonset: Option<&DaemonSet>, placement: &Placement) -> NewStatus {
            let rollout = daemonset.map(rollout_of);
            self.step_with(daemonset, placement, rollout.as_ref(), None)
        }

        /// A step with the rollout status the rollout decided.
        fn step_with(
            &mut self,
            daemonset: Option<&DaemonSet>,
            placement: &Placement,
            rollout: Option<&RolloutStatus>,
            desired: Option<i32>,
        ) -> NewStatus {
            self.clock += 10;
            let out = compute(&Inputs {
                generation: Some(self.generation),
                previous: &self.previous,
                daemonset,
                placement,
                image: Some("x/y:z"),
                spec_error: None,
                image_error: None,
                image_error_transient: false,
                kernel: &self.kernel,
                rollout,
                desired,
                untolerated: None,
                canary_gate: &crate::rollout::CanaryGate::Open,
                now: time(self.clock),
            });
            self.previous = out.status.clone();
            out
        }
    }

    fn cond<'a>(s: &'a SchedulerStatus, t: &str) -> &'a Condition {
        cond_opt(s, t).unwrap()
    }

    fn cond_opt<'a>(s: &'a SchedulerStatus, t: &str) -> Option<&'a Condition> {
        s.conditions.iter().find(|c| c.type_ == t)
    }

    fn reasons(e: &Option<EventSpec>) -> Option<(EventKind, &str)> {
        e.as_ref().map(|e| (e.kind, e.reason.as_str()))
    }

    #[test]
    fn rollout_then_ready_records_one_event_each() {
        let p = Placement { owned: BTreeSet::from(["n1".into(), "n2".into()]), ..Default::default() };
        let mut run = Run::new();

        let out = run.step(Some(&ds(1, 1, 2, 2, 0)), &p);
        assert_eq!(reasons(&out.event), Some((EventKind::Normal, "RolloutInProgress")));
        assert_eq!(cond(&out.status, "Ready").status, "False");
        assert_eq!(cond(&out.status, "Progressing").status, "True");
        assert_eq!(out.status.kernel_attached_summary.as_deref(), Some("0/2"));

        // A pod count change alone records nothing.
        let out = run.step(Some(&ds(1, 1, 2, 2, 1)), &p);
        assert_eq!(out.event, None);
        assert_eq!(out.status.number_available, 1);

        let out = run.step(Some(&ds(1, 1, 2, 2, 2)), &p);
        assert_eq!(reasons(&out.event), Some((EventKind::Normal, "DaemonSetReady")));
        let ready = cond(&out.status, "Ready");
        assert_eq!((ready.status.as_str(), ready.observed_generation), ("True", Some(1)));
        assert_eq!(cond(&out.status, "Progressing").status, "False");
        assert_eq!(cond(&out.status, "Degraded").status, "False");

        // A plain re-reconcile changes nothing, not even transition times.
        let before = out.status.clone();
        let out = run.step(Some(&ds(1, 1, 2, 2, 2)), &p);
        assert_eq!(out.event, None);
        assert_eq!(out.status, before);
    }

    #[test]
    fn pods_lost_after_ready_are_nodes_unavailable_then_recover() {
        let p = Placement { owned: BTreeSet::from(["n1".into(), "n2".into()]), ..Default::default() };
        let mut run = Run::new();
        run.step(Some(&ds(1, 1, 2, 2, 2)), &p);

        let out = run.step(Some(&ds(1, 1, 2, 2, 1)), &p);
        assert_eq!(reasons(&out.event), Some((EventKind::Warning, "NodesUnavailable")));
        assert_eq!(cond(&out.status, "Degraded").status, "True");
        assert_eq!(cond(&out.status, "Ready").status, "False");
        assert!(cond(&out.status, "Degraded").message.contains("1 of 2"));

        // Still down, different message: no new event.
        assert_eq!(run.step(Some(&ds(1, 1, 3, 3, 1)), &p).event, None);

        let out = run.step(Some(&ds(1, 1, 3, 3, 3)), &p);
        assert_eq!(reasons(&out.event), Some((EventKind::Normal, "DaemonSetReady")));
    }

    #[test]
    fn a_first_deployment_is_not_ready_before_it_is_complete_and_desired_never_dips() {
        let p = Placement { owned: (1..=5).map(|i| format!("n{i}")).collect(), ..Default::default() };
        let mut run = Run::new();
        let first = |updated: i32, entering: i32, phase| RolloutStatus {
            phase,
            updated_nodes: updated,
            attached_nodes: updated,
            entering_nodes: entering,
            ..Default::default()
        };
        // The last node's label is written, the DaemonSet controller has not counted it yet:
        // its count says 4 of 4, the rollout 4 of 5.
        let daemonset = ds(1, 1, 4, 4, 4);
        let rolling = first(4, 0, RolloutPhase::Rolling);
        let out = run.step_with(Some(&daemonset), &p, Some(&rolling), Some(5));
        assert_eq!(out.status.desired_number_scheduled, 5);
        assert_eq!(cond(&out.status, "Ready").status, "False", "{:?}", cond(&out.status, "Ready"));
        assert_ne!(reasons(&out.event), Some((EventKind::Normal, "DaemonSetReady")));
        // Every pod available, the rollout not done yet (the last report on its way): still not
        // Ready, as a first deployment has nothing that ran everywhere.
        let out = run.step_with(Some(&ds(1, 1, 5, 5, 5)), &p, Some(&rolling), Some(5));
        assert_eq!(cond(&out.status, "Ready").status, "False");
        let done = RolloutStatus {
            current_revision: Some(sked_api::Revision {
                name: "r1".into(),
                image: "i".into(),
                generation: 1,
                spec: None,
                agent_image: None,
            }),
            ..first(5, 0, RolloutPhase::Complete)
        };
        let out = run.step_with(Some(&ds(1, 1, 5, 5, 5)), &p, Some(&done), Some(5));
        assert_eq!(cond(&out.status, "Ready").status, "True");
        assert_eq!(reasons(&out.event), Some((EventKind::Normal, "DaemonSetReady")));
    }

    #[test]
    fn skipped_nodes_are_not_desired_and_a_fleet_of_only_skipped_nodes_says_so() {
        let p = Placement { owned: BTreeSet::from(["n1".into(), "n2".into()]), ..Default::default() };
        let mut run = Run::new();
        let skipped = RolloutStatus {
            phase: RolloutPhase::Complete,
            updated_nodes: 1,
            attached_nodes: 1,
            skipped_nodes: vec!["n2".into()],
            skipped_reasons: BTreeMap::from([("NodeNotReady".into(), 1)]),
            current_revision: Some(sked_api::Revision {
                name: "r1".into(),
                image: "i".into(),
                generation: 1,
                spec: None,
                agent_image: None,
            }),
            ..Default::default()
        };
        // The NotReady node's pod still counts as available in the DaemonSet's numbers.
        let out = run.step_with(Some(&ds(1, 1, 2, 2, 2)), &p, Some(&skipped), Some(1));
        assert_eq!((out.status.desired_number_scheduled, out.status.number_available), (1, 1));
        let ready = cond(&out.status, "Ready");
        assert_eq!(ready.status, "True");
        assert!(
            ready.message.contains("1 of 1 pods available; 1 node(s) skipped (1 NodeNotReady)"),
            "{}",
            ready.message
        );
        let none = RolloutStatus { updated_nodes: 0, attached_nodes: 0, ..skipped };
        let out = run.step_with(Some(&ds(1, 1, 1, 0, 0)), &p, Some(&none), Some(0));
        let ready = cond(&out.status, "Ready");
        assert_eq!(ready.reason, "NoNodesScheduled");
        assert!(ready.message.starts_with("No node can run the scheduler now; 1 node(s) skipped"), "{}", ready.message);
    }

    #[test]
    fn a_spec_change_is_a_new_rollout_with_new_observed_generation() {
        let p = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
        let mut run = Run::new();
        run.step(Some(&ds(1, 1, 1, 1, 1)), &p);
        run.generation = 2;
        // The DaemonSet controller has not seen the new template yet: the rollout conditions
        // still describe generation 1, and nothing is recorded.
        let out = run.step(Some(&ds(2, 1, 1, 1, 1)), &p);
        assert_eq!(out.event, None);
        assert_eq!(out.status.observed_generation, Some(2));
        assert_eq!(cond(&out.status, "Ready").observed_generation, Some(1));
        // Inputs, the old pod still available: Ready stays, the rollout is under way.
        let out = run.step(Some(&ds(2, 2, 1, 0, 1)), &p);
        assert_eq!(out.event, None);
        assert_eq!(cond(&out.status, "Ready").status, "True");
        assert_eq!(cond(&out.status, "Progressing").reason, "RolloutInProgress");
        assert_eq!(cond(&out.status, "Reconciling").status, "True");
        // The pod being replaced.
        let out = run.step(Some(&ds(2, 2, 1, 0, 0)), &p);
        assert_eq!(reasons(&out.event), Some((EventKind::Normal, "RolloutInProgress")));
        // Ready stays with the generation that ran until this one runs everywhere.
        assert!(
            out.status.conditions.iter().all(|c| c.observed_generation == Some(if c.type_ == "Ready" { 1 } else { 2 }))
        );
        let out = run.step(Some(&ds(2, 2, 1, 1, 1)), &p);
        assert_eq!(reasons(&out.event), Some((EventKind::Normal, "DaemonSetReady")));
        assert_eq!(cond(&out.status, "Ready").observed_generation, Some(2));
        assert_eq!(cond(&out.status, "Reconciling").status, "False");
    }

    #[test]
    fn ready_describes_the_running_generation_while_a_newer_one_rolls_or_fails() {
        use sked_api::{Revision, RolloutFailure};
        let p = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
        let daemonset = ds(3, 3, 1, 0, 1);
        let previous = SchedulerStatus::default();
        let kernel_summary = kernel(1, 1, "KernelAttached");
        let running =
            Revision { name: "aaa".into(), image: "x/y@sha256:1".into(), generation: 2, spec: None, agent_image: None };
        let observe = |rollout: &RolloutStatus| {
            compute(&Inputs {
                generation: Some(3),
                previous: &previous,
                daemonset: Some(&daemonset),
                placement: &p,
                image: None,
                image_error: None,
                image_error_transient: false,
                spec_error: None,
                kernel: &kernel_summary,
                rollout: Some(rollout),
                desired: None,
                untolerated: None,
                canary_gate: &crate::rollout::CanaryGate::Open,
                now: time(5),
            })
        };
        let rolling = RolloutStatus {
            phase: RolloutPhase::Canary,
            current_revision: Some(running.clone()),
            ..Default::default()
        };
        let out = observe(&rolling);
        assert_eq!(cond(&out.status, "Ready").observed_generation, Some(2));
        assert_eq!(cond(&out.status, "Reconciling").status, "True");
        assert_eq!(cond(&out.status, "Stalled").status, "False");

        let rolled_back = RolloutStatus {
            phase: RolloutPhase::RolledBack,
            current_revision: Some(running),
            failed: Some(RolloutFailure {
                reason: None,
                revision: "bbb".into(),
                generation: 3,
                node: "n1".into(),
                cause: "the scheduler did not attach within 120s".into(),
                time: time(4),
                evidence: None,
            }),
            ..Default::default()
        };
        let out = observe(&rolled_back);
        assert_eq!(cond(&out.status, "Ready").observed_generation, Some(2));
        let stalled = cond(&out.status, "Stalled");
        assert_eq!((stalled.status.as_str(), stalled.reason.as_str()), ("True", "RolloutFailed"));
        assert_eq!(cond(&out.status, "Reconciling").status, "False");
        let degraded = cond(&out.status, "Degraded");
        assert_eq!(degraded.reason, "RolloutFailed");
        assert!(
            degraded.message.contains("n1") && degraded.message.contains("pause and resume"),
            "{}",
            degraded.message
        );
    }

    /// The first status of generation 1, no kernel attached, nothing refused.
    fn first_computation(
        daemonset: &DaemonSet,
        placement: &Placement,
        rollout: &RolloutStatus,
        untolerated: Option<&str>,
    ) -> NewStatus {
        compute(&Inputs {
            generation: Some(1),
            previous: &SchedulerStatus::default(),
            daemonset: Some(daemonset),
            placement,
            image: None,
            image_error: None,
            image_error_transient: false,
            spec_error: None,
            kernel: &kernel(0, 0, "NotAttached"),
            rollout: Some(rollout),
            desired: None,
            untolerated,
            canary_gate: &crate::rollout::CanaryGate::Open,
            now: time(5),
        })
    }

    #[test]
    fn a_first_revision_rolled_back_to_the_default_is_failed_not_in_progress() {
        use sked_api::{Revision, RolloutFailure};
        let p = Placement { owned: BTreeSet::from(["n1".into(), "n2".into()]), ..Default::default() };
        // Its nodes lost their labels: the DaemonSet runs no pod; one node still waits to enter.
        let daemonset = ds(1, 1, 0, 0, 0);
        let failed = RolloutStatus {
            phase: RolloutPhase::Failed,
            update_revision: Some(Revision {
                name: "bbb".into(),
                image: "x/y@sha256:2".into(),
                generation: 1,
                spec: None,
                agent_image: None,
            }),
            entering_nodes: 1,
            failed: Some(RolloutFailure {
                reason: None,
                revision: "bbb".into(),
                generation: 1,
                node: "n1".into(),
                cause: "the scheduler container is crash-looping".into(),
                time: time(4),
                evidence: None,
            }),
            ..Default::default()
        };
        let out = first_computation(&daemonset, &p, &failed, None);
        for (type_, status, reason) in [
            ("Progressing", "False", "RolloutFailed"),
            ("Ready", "False", "RolloutFailed"),
            ("Reconciling", "False", "RolloutFailed"),
            ("Stalled", "True", "RolloutFailed"),
            ("Degraded", "True", "RolloutFailed"),
        ] {
            let c = cond(&out.status, type_);
            assert_eq!((c.status.as_str(), c.reason.as_str()), (status, reason), "{type_}: {}", c.message);
        }
        assert!(cond(&out.status, "Progressing").message.contains("kernel's default scheduler"));
        assert!(cond(&out.status, "Degraded").message.contains("node n1: the scheduler container is crash-looping"));
    }

    #[test]
    fn no_pod_anywhere_names_the_taints_that_keep_them_away() {
        let p = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
        let daemonset = ds(1, 1, 0, 0, 0);
        let taints = "1 selected node(s) have a taint the Scheduler does not tolerate, so no pod of it can run there: dedicated=batch:NoSchedule on n1; add a matching toleration to spec.tolerations";
        let complete = RolloutStatus { phase: RolloutPhase::Complete, ..Default::default() };
        let out = first_computation(&daemonset, &p, &complete, Some(taints));
        let ready = cond(&out.status, "Ready");
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "NoNodesScheduled"));
        assert_eq!(ready.message, format!("No nodes scheduled: {taints}"));
        assert_eq!(cond(&out.status, "Reconciling").status, "False", "nothing to wait for: the spec must change");
    }

    #[test]
    fn skipped_nodes_are_counted_by_reason_in_the_rollout_message() {
        let rolling = RolloutStatus {
            skipped_reasons: BTreeMap::from([("NodeNotReady".into(), 2), ("TaintNotTolerated".into(), 1)]),
            ..Default::default()
        };
        assert_eq!(
            skipped_summary(Some(&rolling)),
            "; 3 node(s) skipped (2 NodeNotReady, 1 TaintNotTolerated): see status.rollout.skippedNodes"
        );
        assert_eq!(skipped_summary(Some(&RolloutStatus::default())), "");
    }

    #[test]
    fn a_fresh_daemonset_records_nothing_until_observed() {
        let p = Placement::default();
        let mut run = Run::new();
        let mut fresh = ds(1, 0, 0, 0, 0);
        fresh.status = None;
        let out = run.step(Some(&fresh), &p);
        assert_eq!(out.event, None);
        assert!(cond_opt(&out.status, "Ready").is_none());
        let out = run.step(Some(&ds(1, 1, 0, 0, 0)), &p);
        assert_eq!(reasons(&out.event), Some((EventKind::Normal, "NoNodesScheduled")));
    }

    #[test]
    fn leaving_a_conflict_waits_for_the_daemonset_controller_before_recording() {
        let lost = Placement { lost: BTreeMap::from([("n1".into(), "w".into())]), ..Default::default() };
        let mut run = Run::new();
        let out = run.step(None, &lost);
        assert_eq!(reasons(&out.event), Some((EventKind::Warning, "SchedulerConflict")));
        // The winner is gone; the new DaemonSet is not observed yet: no stale NoNodesScheduled.
        let owned = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
        let mut fresh = ds(1, 0, 0, 0, 0);
        fresh.status = None;
        let out = run.step(Some(&fresh), &owned);
        assert_eq!(out.event, None);
        assert_eq!(cond(&out.status, "Degraded").status, "False");
        let out = run.step(Some(&ds(1, 1, 1, 1, 0)), &owned);
        assert_eq!(reasons(&out.event), Some((EventKind::Normal, "RolloutInProgress")));
    }

    #[test]
    fn a_node_joining_after_ready_is_a_rollout_not_an_outage() {
        let p = Placement { owned: BTreeSet::from(["n1".into(), "n2".into()]), ..Default::default() };
        let mut run = Run::new();
        run.step(Some(&ds(1, 1, 2, 2, 2)), &p);
        let out = run.step(Some(&ds(1, 1, 3, 3, 2)), &p);
        assert_eq!(reasons(&out.event), Some((EventKind::Normal, "RolloutInProgress")));
        assert_eq!(cond(&out.status, "Degraded").status, "False");
        // ...but losing an available pod while it joins is an outage.
        let out = run.step(Some(&ds(1, 1, 3, 3, 3)), &p);
        assert_eq!(reasons(&out.event), Some((EventKind::Normal, "DaemonSetReady")));
        let out = run.step(Some(&ds(1, 1, 4, 4, 2)), &p);
        assert_eq!(reasons(&out.event), Some((EventKind::Warning, "NodesUnavailable")));
    }

    #[test]
    fn no_nodes_is_its_own_state() {
        let mut run = Run::new();
        let out = run.step(Some(&ds(1, 1, 0, 0, 0)), &Placement::default());
        assert_eq!(reasons(&out.event), Some((EventKind::Normal, "NoNodesScheduled")));
        assert_eq!(cond(&out.status, "Ready").status, "False");
        assert_eq!(cond(&out.status, "Progressing").status, "False");
        assert!(cond(&out.status, "Ready").message.contains("nodeSelector"));
    }

    #[test]
    fn partial_conflict_is_ready_and_degraded_with_a_warning() {
        let p = Placement {
            owned: BTreeSet::from(["n1".into()]),
            lost: BTreeMap::from([("n2".into(), "old-b".into()), ("n3".into(), "old-a".into())]),
            ..Default::default()
        };
        let mut run = Run::new();
        let out = run.step(Some(&ds(1, 1, 1, 1, 1)), &p);
        assert_eq!(reasons(&out.event), Some((EventKind::Warning, "SchedulerConflict")));
        assert_eq!(cond(&out.status, "Ready").status, "True");
        let d = cond(&out.status, "Degraded");
        assert_eq!((d.status.as_str(), d.reason.as_str()), ("True", "SchedulerConflict"));
        assert_eq!(d.message, "2 of 3 selected nodes belong to older Schedulers: old-a, old-b");
        assert_eq!(out.status.conflicting_nodes, 2);

        // Conflict resolved: a Normal event.
        let p = Placement { owned: BTreeSet::from(["n1".into(), "n2".into(), "n3".into()]), ..Default::default() };
        let out = run.step(Some(&ds(1, 1, 3, 3, 3)), &p);
        assert_eq!(reasons(&out.event), Some((EventKind::Normal, "DaemonSetReady")));
        assert_eq!(out.status.conflicting_nodes, 0);
    }

    #[test]
    fn total_conflict_without_daemonset_and_capped_winner_list() {
        let lost: BTreeMap<String, String> = (0..6).map(|i| (format!("n{i}"), format!("w{i}"))).collect();
        let p = Placement { lost, ..Default::default() };
        let mut run = Run::new();
        let out = run.step(None, &p);
        assert_eq!(reasons(&out.event), Some((EventKind::Warning, "SchedulerConflict")));
        assert_eq!(out.status.desired_number_scheduled, 0);
        assert_eq!(cond(&out.status, "Ready").reason, "NoNodesScheduled");
        assert!(cond(&out.status, "Ready").message.contains("older Scheduler"));
        assert_eq!(
            cond(&out.status, "Degraded").message,
            "6 of 6 selected nodes belong to older Schedulers: w0, w1, w2 and 3 more"
        );
    }

    #[test]
    fn conflict_message_says_when_a_winner_won_on_its_name() {
        let lost = |winners: &[&str]| -> BTreeMap<String, String> {
            winners.iter().enumerate().map(|(i, w)| (format!("n{i}"), w.to_string())).collect()
        };
        let degraded = |p: &Placement| cond(&Run::new().step(None, p).status, "Degraded").message.clone();

        let tie = Placement { lost: lost(&["tie-a"]), tied: BTreeSet::from(["tie-a".into()]), ..Default::default() };
        assert_eq!(
            degraded(&tie),
            "1 of 1 selected nodes belong to Schedulers created in the same second and earlier by name: tie-a"
        );
        let mixed =
            Placement { lost: lost(&["old", "tie-a"]), tied: BTreeSet::from(["tie-a".into()]), ..Default::default() };
        assert_eq!(
            degraded(&mixed),
            "2 of 2 selected nodes belong to Schedulers that are older, or created in the same second and earlier by name: old, tie-a"
        );
        let older = Placement { lost: lost(&["old"]), ..Default::default() };
        assert_eq!(degraded(&older), "1 of 1 selected nodes belong to older Schedulers: old");
    }

    #[test]
    fn degraded_false_says_what_is_true_of_the_pods() {
        let p = Placement { owned: BTreeSet::from(["n1".into(), "n2".into()]), ..Default::default() };
        let degraded = |out: &NewStatus| {
            let d = cond(&out.status, "Degraded");
            (d.status.clone(), d.reason.clone(), d.message.clone())
        };
        let mut run = Run::new();
        // The DaemonSet controller has not counted the pods yet.
        let out = run.step(Some(&ds(1, 0, 0, 0, 0)), &p);
        assert_eq!(
            degraded(&out),
            (
                "False".into(),
                "AsExpected".into(),
                "No conflicts; the DaemonSet controller has not counted the pods yet".into()
            )
        );
        // Rolling out: 0 of 2 available is not "every pod is available".
        let out = run.step(Some(&ds(1, 1, 2, 2, 0)), &p);
        assert_eq!(
            degraded(&out),
            (
                "False".into(),
                "AsExpected".into(),
                "No conflicts; 0 of 2 scheduled pods are available, the rollout is in progress".into()
            )
        );
        let out = run.step(Some(&ds(1, 1, 2, 2, 2)), &p);
        assert_eq!(
            degraded(&out),
            ("False".into(), "AsExpected".into(), "No conflicts and every scheduled pod is available".into())
        );
        let none = Placement::default();
        let out = Run::new().step(Some(&ds(1, 1, 0, 0, 0)), &none);
        assert_eq!(degraded(&out), ("False".into(), "AsExpected".into(), "No conflicts; no node is scheduled".into()));
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let p = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
        let mut run = Run::new();
        let first = run.step(Some(&ds(1, 1, 1, 1, 0)), &p);
        let t0 = cond(&first.status, "Ready").last_transition_time.clone();
        let out = run.step(Some(&ds(1, 1, 2, 2, 0)), &p);
        assert_eq!(cond(&out.status, "Ready").last_transition_time, t0, "False -> False keeps the time");
        let out = run.step(Some(&ds(1, 1, 2, 2, 2)), &p);
        assert_ne!(cond(&out.status, "Ready").last_transition_time, t0, "False -> True moves it");
    }

    #[test]
    fn a_refused_spec_is_degraded_spec_invalid() {
        let p = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
        let previous = SchedulerStatus::default();
        let daemonset = ds(1, 1, 1, 1, 1);
        let out = compute(&Inputs {
            generation: Some(2),
            previous: &previous,
            daemonset: Some(&daemonset),
            placement: &p,
            image: Some("x/y"),
            image_error: None,
            image_error_transient: false,
            spec_error: Some("spec.template.spec.containers[0].resources.limits: Invalid value"),
            kernel: &kernel(0, 1, "NotAttached"),
            rollout: None,
            desired: None,
            untolerated: None,
            canary_gate: &crate::rollout::CanaryGate::Open,
            now: time(5),
        });
        assert_eq!(reasons(&out.event), Some((EventKind::Warning, "SpecInvalid")));
        let d = cond(&out.status, "Degraded");
        assert_eq!(d.reason, "SpecInvalid");
        assert!(d.message.contains("resources.limits"), "{}", d.message);
    }

    #[test]
    fn a_refused_image_is_degraded_and_keeps_the_running_image() {
        let p = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
        let previous = SchedulerStatus { resolved_image: Some("r.io/a@sha256:1".into()), ..Default::default() };
        let daemonset = ds(1, 1, 1, 1, 1);
        let kernel_summary = kernel(1, 1, "KernelAttached");
        let observe = |image_error| Inputs {
            generation: Some(2),
            previous: &previous,
            daemonset: Some(&daemonset),
            placement: &p,
            image: None,
            image_error,
            image_error_transient: false,
            spec_error: None,
            kernel: &kernel_summary,
            rollout: None,
            desired: None,
            untolerated: None,
            canary_gate: &crate::rollout::CanaryGate::Open,
            now: time(5),
        };
        let out = compute(&observe(Some("signature of image \"r.io/a:v2\" is invalid")));
        assert_eq!(reasons(&out.event), Some((EventKind::Warning, "ImageVerificationFailed")));
        let d = cond(&out.status, "Degraded");
        assert_eq!((d.status.as_str(), d.reason.as_str()), ("True", "ImageVerificationFailed"));
        assert!(d.message.contains("r.io/a:v2") && d.message.contains("kept as it was"), "{}", d.message);
        assert_eq!(out.status.resolved_image.as_deref(), Some("r.io/a@sha256:1"));
        assert_eq!(cond(&out.status, "Ready").status, "True", "the running pods are still ready");
    }

    #[test]
    fn an_unreachable_registry_is_retried_not_stalled() {
        let p = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
        let previous = SchedulerStatus::default();
        let daemonset = ds(1, 1, 1, 1, 1);
        let kernel_summary = kernel(1, 1, "KernelAttached");
        let observe = |transient| {
            compute(&Inputs {
                generation: Some(1),
                previous: &previous,
                daemonset: Some(&daemonset),
                placement: &p,
                image: None,
                image_error: Some("cannot reach the registry r.io for image \"r.io/a:v1\""),
                image_error_transient: transient,
                spec_error: None,
                kernel: &kernel_summary,
                rollout: None,
                desired: None,
                untolerated: None,
                canary_gate: &crate::rollout::CanaryGate::Open,
                now: time(5),
            })
        };
        let out = observe(true);
        assert_eq!(cond(&out.status, "Stalled").status, "False");
        let r = cond(&out.status, "Reconciling");
        assert_eq!((r.status.as_str(), r.reason.as_str()), ("True", "ImageVerificationFailed"));
        let out = observe(false);
        assert_eq!(cond(&out.status, "Stalled").status, "True");
        assert_eq!(cond(&out.status, "Reconciling").status, "False");
    }

    #[test]
    fn kernel_truth_gives_the_count_the_condition_and_its_own_events() {
        let p = Placement { owned: BTreeSet::from(["n1".into(), "n2".into()]), ..Default::default() };
        let mut run = Run::new();
        run.kernel = kernel(0, 2, "NotAttached");
        let out = run.step(Some(&ds(1, 1, 2, 2, 0)), &p);
        assert_eq!(out.kernel_event, None, "nothing to say before anything attached");
        assert_eq!(out.status.kernel_attached_summary.as_deref(), Some("0/2"));
        assert_eq!(cond(&out.status, "KernelAttached").status, "False");

        run.kernel = kernel(1, 2, "NotAttached");
        let out = run.step(Some(&ds(1, 1, 2, 2, 1)), &p);
        assert_eq!(out.kernel_event, None, "a count change is not a state change");
        assert_eq!(out.status.kernel_attached_summary.as_deref(), Some("1/2"));

        run.kernel = kernel(2, 2, "KernelAttached");
        let out = run.step(Some(&ds(1, 1, 2, 2, 2)), &p);
        let ev = out.kernel_event.as_ref().map(|e| (e.kind, e.reason.as_str()));
        assert_eq!(ev, Some((EventKind::Normal, "KernelAttached")));
        assert_eq!(cond(&out.status, "KernelAttached").status, "True");
        assert_eq!(out.status.kernel_attached, 2);

        run.kernel = kernel(1, 2, "ForeignScheduler");
        let out = run.step(Some(&ds(1, 1, 2, 2, 2)), &p);
        let ev = out.kernel_event.as_ref().map(|e| (e.kind, e.reason.as_str()));
        assert_eq!(ev, Some((EventKind::Warning, "ForeignScheduler")));
        // The count never exceeds the desired nodes.
        run.kernel = kernel(5, 2, "KernelAttached");
        assert_eq!(run.step(Some(&ds(1, 1, 2, 2, 2)), &p).status.kernel_attached, 2);
    }

    #[test]
    fn ejections_are_recorded_and_the_newest_exit_kept() {
        use sked_api::KernelExit;
        let p = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
        let exit = |node: &str, time: &str, ejected: bool| KernelExit {
            node: node.into(),
            ops: "lavd".into(),
            reason: if ejected { "runnable task stall" } else { "unregistered from user space" }.into(),
            detail: String::new(),
            time: time.into(),
            ejected,
            restart: false,
            trace: Vec::new(),
        };
        let mut run = Run::new();
        let stall = exit("n1", "2026-12-01T00:00:01.000Z", true);
        let other = exit("n0", "2026-12-01T00:00:00.500Z", true);
        run.kernel = KernelSummary {
            last_exit: Some(stall.clone()),
            ejections: vec![other.clone(), stall.clone()],
            ..kernel(0, 1, "NotAttached")
        };
        let out = run.step(Some(&ds(1, 1, 1, 1, 0)), &p);
        let events: Vec<(EventKind, &str)> = out.exit_events.iter().map(|e| (e.kind, e.reason.as_str())).collect();
        assert_eq!(events, [(EventKind::Warning, "KernelEjected"); 2], "one per ejection, of each node");
        let message = &out.exit_events[1].message;
        assert!(
            message.starts_with("Node n1: the kernel ejected lavd") && message.contains("runnable task stall"),
            "{message}"
        );
        assert_eq!(out.status.last_exit.as_ref(), Some(&stall));
        // The detail line came with a later report: the same exit, kept with it.
        let detailed = KernelExit { detail: "kworker/0:1[12] failed to run for 2.1s".into(), ..stall.clone() };
        run.kernel = KernelSummary { last_exit: Some(detailed.clone()), ..kernel(0, 1, "NotAttached") };
        let out = run.step(Some(&ds(1, 1, 1, 1, 0)), &p);
        assert!(out.exit_events.is_empty());
        assert_eq!(out.status.last_exit.as_ref(), Some(&detailed));
        // An older exit does not replace the newer one; a newer normal unregistration does.
        run.kernel.last_exit = Some(other);
        assert_eq!(run.step(Some(&ds(1, 1, 1, 1, 0)), &p).status.last_exit, Some(detailed));
        run.kernel.last_exit = Some(exit("n1", "2026-12-01T00:00:09.000Z", false));
        assert_eq!(run.step(Some(&ds(1, 1, 1, 1, 0)), &p).status.last_exit.map(|e| e.ejected), Some(false));
    }

    #[test]
    fn the_pod_cpu_contract_turning_false_is_told_once_and_its_recovery_once() {
        use crate::cpu_contract::ContractView;
        let p = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
        let mut run = Run::new();
        let view = |status, reason, message: &str| ContractView { status, reason, message: message.into() };
        run.kernel = kernel(1, 1, "KernelAttached");
        let unknown = run.step(Some(&ds(1, 1, 1, 1, 1)), &p);
        let c = find(&unknown.status.conditions, condition::POD_CPU_CONTRACT).unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("Unknown", "ContractUnknown"));
        assert_eq!(unknown.contract_event, None, "nothing to tell while nobody said");
        let broken = view(Some(false), Reason::LimitsNotEnforced, "pod UID u used 1.38 CPU against its limit of 0.50");
        run.kernel.cpu_contract = broken.clone();
        let out = run.step(Some(&ds(1, 1, 1, 1, 1)), &p);
        let event = out.contract_event.as_ref().map(|e| (e.kind, e.reason, e.message.as_str()));
        assert_eq!(event, Some((EventKind::Warning, Reason::LimitsNotEnforced, broken.message.as_str())));
        let c = find(&out.status.conditions, condition::POD_CPU_CONTRACT).unwrap();
        assert_eq!((c.status.as_str(), c.message.as_str()), ("False", broken.message.as_str()));
        run.kernel.cpu_contract.message = "pod UID u used 1.41 CPU against its limit of 0.50".into();
        assert_eq!(run.step(Some(&ds(1, 1, 1, 1, 1)), &p).contract_event, None, "the same reason: told once");
        run.kernel.cpu_contract = view(Some(true), Reason::CpuControlsImplemented, "implemented");
        let back = run.step(Some(&ds(1, 1, 1, 1, 1)), &p).contract_event.map(|e| (e.kind, e.reason));
        assert_eq!(back, Some((EventKind::Normal, Reason::CpuControlsImplemented)));
        // A new leader that has not heard every agent keeps the condition it found.
        run.kernel = KernelSummary { settled: false, cpu_contract: broken, ..kernel(1, 1, "KernelAttached") };
        let carried = run.step(Some(&ds(1, 1, 1, 1, 1)), &p);
        let c = find(&carried.status.conditions, condition::POD_CPU_CONTRACT).unwrap();
        assert_eq!((c.status.as_str(), carried.contract_event), ("True", None));
    }

    #[test]
    fn an_unsettled_kernel_view_keeps_the_condition_and_records_nothing() {
        let p = Placement { owned: BTreeSet::from(["n1".into(), "n2".into()]), ..Default::default() };
        let mut run = Run::new();
        run.kernel = kernel(2, 2, "KernelAttached");
        let attached = run.step(Some(&ds(1, 1, 2, 2, 2)), &p);
        // A new leader has heard no agent yet.
        run.kernel = KernelSummary { settled: false, unreported: 2, ..kernel(0, 2, "NotAttached") };
        let out = run.step(Some(&ds(1, 1, 2, 2, 2)), &p);
        assert_eq!(cond(&out.status, "KernelAttached"), cond(&attached.status, "KernelAttached"));
        assert_eq!(out.status.kernel_attached, 2);
        assert_eq!(out.kernel_event, None);
        // Once settled, the view counts.
        run.kernel = kernel(1, 2, "NotAttached");
        let out = run.step(Some(&ds(1, 1, 2, 2, 2)), &p);
        assert_eq!(cond(&out.status, "KernelAttached").reason, "NotAttached");
        assert!(out.kernel_event.is_some());
    }

    #[test]
    fn foreign_conditions_are_carried_over() {
        let mut run = Run::new();
        run.previous.conditions.push(Condition {
            type_: "ExampleFromAnotherTool".into(),
            status: "True".into(),
            reason: "Because".into(),
            message: "".into(),
            observed_generation: Some(1),
            last_transition_time: time(1),
        });
        let p = Placement { owned: BTreeSet::from(["n1".into()]), ..Default::default() };
        let out = run.step(Some(&ds(1, 1, 1, 1, 1)), &p);
        assert!(out.status.conditions.iter().any(|c| c.type_ == "ExampleFromAnotherTool"));
    }
}
