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
mod tests;
