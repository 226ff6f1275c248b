//! How a rollout sees one labelled node: its scheduler pod, what that pod's agent last reported,
//! and what this leadership term remembers of labelling it. The controller reads the pieces
//! (the pod index, one read of the kernel table, its Memo); these pure functions turn them into
//! the [`NodeView`] [`crate::rollout::decide`] judges.

use std::time::Duration;

use sked_api::verdict::Verdict;

use crate::kernel_summary::NodeReport;
use crate::pods::SchedulerPod;
use crate::rollout::{CRASH_LOOP_RESTARTS, KernelView, NodeView, PodView};

pub use crate::pods::TemplateRevision;

/// What this leadership term remembers of labelling a node, and of replacing its pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Labelling<'a> {
    /// How long ago this leader wrote the node's owner label, while it has not seen the node
    /// run attached since.
    pub ago: Option<Duration>,
    /// The pod this term deleted on the node for the new revision, and how long ago.
    pub replaced: Option<(&'a str, Duration)>,
    /// How long the term has lasted.
    pub term_age: Duration,
    /// The Scheduler's `attachTimeoutSeconds`.
    pub attach_timeout: Duration,
}

/// What the node's kernel runs, as the rollout weighs it: the report of the node (fresh, for
/// this Scheduler) and whether it is its pod's own. A node without sched_ext, or owned by
/// another scheduler, is so whatever pod reported it; an attachment or an ejection counts only
/// when the pod that reported it is the node's pod now.
pub fn kernel_view(report: Option<&NodeReport>, pod: Option<&SchedulerPod>) -> KernelView {
    let Some(report) = report else { return KernelView::Unknown };
    match report.verdict {
        Verdict::KernelUnsupported => KernelView::Unsupported,
        Verdict::ForeignScheduler => KernelView::Foreign,
        Verdict::Attached | Verdict::NotAttached => match pod.filter(|p| p.name == report.pod) {
            None => KernelView::Unknown,
            Some(_) => match (report.attached_since, report.ejected, report.restarting_since) {
                (Some(since), _, _) => KernelView::Attached { since },
                (None, true, _) => KernelView::Ejected,
                (None, false, Some(since)) => KernelView::Restarting { since },
                (None, false, None) => KernelView::NotAttached,
            },
        },
    }
}

/// Whether the node runs its scheduler attached with its pod Ready: from then on the node no
/// longer enters (a later restart of its pod is not a switch from revision zero), so the term
/// forgets when it labelled it.
pub fn runs_attached(kernel: &KernelView, pod: Option<&SchedulerPod>) -> bool {
    matches!(kernel, KernelView::Attached { .. }) && pod.is_some_and(|p| p.ready_since.is_some())
}

/// The pod as the rollout weighs it (`wall`: now, seconds since the epoch, for a pod whose
/// creation time is not known).
pub fn pod_view(pod: &SchedulerPod, template: &TemplateRevision, wall: i64) -> PodView {
    PodView {
        name: pod.name.clone(),
        revision: pod.revision(template),
        ready_since: pod.ready_since,
        created: pod.created.unwrap_or(wall),
        crash_looping: pod.backing_off || pod.restarts >= CRASH_LOOP_RESTARTS,
        bound: pod.node.is_some(),
        started: pod.started,
        pull_error: pod.pull_error.clone(),
        last_exit: pod.last_exit.clone(),
        terminating_since: pod.terminating_since,
    }
}

/// One labelled node as the rollout sees it. `unfit` is left `None`: whether a pod can run
/// there is the node's own state, which the caller adds.
pub fn node_view(
    node: &str,
    pod: Option<&SchedulerPod>,
    report: Option<&NodeReport>,
    template: &TemplateRevision,
    labelling: Labelling<'_>,
    wall: i64,
) -> NodeView {
    let Labelling { ago, replaced, term_age, attach_timeout } = labelling;
    // Replaced by this term moments ago, and its new pod not seen yet: the pod listed (if any)
    // is the one deleted, whatever the watch shows of it so far. The node is switching, not
    // a node of the old revision a wave could take again (client-go's expectations).
    let just_replaced = replaced.is_some_and(|(old, ago)| ago < attach_timeout && pod.is_none_or(|p| p.name == old));
    let pod = pod.filter(|_| !just_replaced);
    let own_report = report.filter(|r| pod.is_some_and(|p| p.name == r.pod));
    let view = pod.map(|p| pod_view(p, template, wall));
    // Labelled moments ago and no pod yet: by this leader (it remembers), or by the last one
    // (early in a term, any labelled node without a pod may be).
    let just_labelled = view.is_none() && (term_age < attach_timeout || ago.is_some_and(|ago| ago < attach_timeout));
    NodeView {
        node: node.to_owned(),
        pod: view,
        kernel: kernel_view(report, pod),
        exit: own_report.and_then(|r| r.last_exit.clone()),
        scheduler_stats: own_report.and_then(|r| r.scheduler_stats.clone()),
        just_labelled,
        just_replaced,
        unfit: None,
        // In whole seconds, rounded down (pod creation times are whole seconds too).
        entered_at: ago.map(|ago| wall.saturating_sub(i64::try_from(ago.as_secs() + 1).unwrap_or(i64::MAX))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    use crate::test_objects::pod;

    fn report(pod: &str, verdict: Verdict) -> NodeReport {
        crate::test_objects::report(pod, verdict, Instant::now())
    }

    const LONG_AGO: Labelling<'static> = Labelling {
        ago: None,
        replaced: None,
        term_age: Duration::from_secs(3600),
        attach_timeout: Duration::from_secs(120),
    };

    #[test]
    fn the_kernel_as_the_rollout_weighs_it() {
        let p = pod("p");
        let attached = NodeReport { attached_since: Some(100), ..report("p", Verdict::Attached) };
        assert_eq!(kernel_view(Some(&attached), Some(&p)), KernelView::Attached { since: 100 });
        let ejected = NodeReport { ejected: true, ..report("p", Verdict::NotAttached) };
        assert_eq!(kernel_view(Some(&ejected), Some(&p)), KernelView::Ejected);
        assert_eq!(kernel_view(Some(&report("p", Verdict::NotAttached)), Some(&p)), KernelView::NotAttached);
        // Whatever pod reported it: the node's own state.
        assert_eq!(kernel_view(Some(&report("old", Verdict::KernelUnsupported)), Some(&p)), KernelView::Unsupported);
        assert_eq!(kernel_view(Some(&report("old", Verdict::ForeignScheduler)), None), KernelView::Foreign);
        // The previous pod's attachment says nothing of this one; nor does silence.
        let old = NodeReport { attached_since: Some(100), ..report("old", Verdict::Attached) };
        assert_eq!(kernel_view(Some(&old), Some(&p)), KernelView::Unknown);
        assert_eq!(kernel_view(Some(&old), None), KernelView::Unknown);
        assert_eq!(kernel_view(None, Some(&p)), KernelView::Unknown);
    }

    #[test]
    fn only_an_attached_and_ready_pod_ends_a_nodes_entry() {
        let attached = KernelView::Attached { since: 1 };
        let ready = SchedulerPod { ready_since: Some(2), ..pod("p") };
        assert!(runs_attached(&attached, Some(&ready)));
        assert!(!runs_attached(&attached, Some(&pod("p"))), "attached, not Ready yet");
        assert!(!runs_attached(&KernelView::NotAttached, Some(&ready)));
        assert!(!runs_attached(&attached, None));
    }

    #[test]
    fn a_node_labelled_moments_ago_without_a_pod_is_switching() {
        let template = TemplateRevision::default();
        let labelled = |ago: Option<u64>, term_age: u64| Labelling {
            ago: ago.map(Duration::from_secs),
            replaced: None,
            term_age: Duration::from_secs(term_age),
            attach_timeout: Duration::from_secs(120),
        };
        let view = |pod: Option<&SchedulerPod>, l| node_view("n", pod, None, &template, l, 1_000);
        assert!(view(None, labelled(Some(5), 3600)).just_labelled, "this leader labelled it 5 s ago");
        assert!(!view(None, labelled(Some(500), 3600)).just_labelled, "past the attach timeout");
        assert!(view(None, labelled(None, 10)).just_labelled, "early in a term the last leader may have");
        assert!(!view(None, LONG_AGO).just_labelled);
        assert!(!view(Some(&pod("p")), labelled(Some(5), 3600)).just_labelled, "its pod is there");
        // When it entered, in whole seconds rounded down.
        assert_eq!(view(None, labelled(Some(10), 3600)).entered_at, Some(989));
        assert_eq!(view(None, LONG_AGO).entered_at, None);
    }

    #[test]
    fn a_node_whose_pod_this_term_replaced_is_switching_until_the_new_pod_shows() {
        let template = TemplateRevision::default();
        let replaced = |ago: u64| Labelling { replaced: Some(("old", Duration::from_secs(ago))), ..LONG_AGO };
        let view = |pod: Option<&SchedulerPod>, l| node_view("n", pod, None, &template, l, 1_000);
        let old = view(Some(&pod("old")), replaced(1));
        assert!(old.just_replaced && old.pod.is_none(), "the watch still lists the pod deleted: it is going");
        assert!(view(None, replaced(1)).just_replaced, "gone, its successor not made yet");
        let new = view(Some(&pod("new")), replaced(1));
        assert!(!new.just_replaced && new.pod.is_some(), "the new pod is there");
        assert!(!view(Some(&pod("old")), replaced(500)).just_replaced, "past the attach timeout");
        assert!(!view(Some(&pod("old")), LONG_AGO).just_replaced);
    }

    #[test]
    fn a_pod_as_the_rollout_weighs_it() {
        let template = TemplateRevision { name: "r1".into(), ..TemplateRevision::default() };
        let fresh = pod_view(&pod("p"), &template, 1_000);
        assert_eq!((fresh.created, fresh.crash_looping, fresh.bound), (1_000, false, false), "no creation time: now");
        let looping = SchedulerPod { restarts: CRASH_LOOP_RESTARTS, created: Some(7), ..pod("p") };
        assert!(pod_view(&looping, &template, 1_000).crash_looping);
        assert_eq!(pod_view(&looping, &template, 1_000).created, 7);
        let backing_off = SchedulerPod { backing_off: true, node: Some("n".into()), ..pod("p") };
        let v = pod_view(&backing_off, &template, 1_000);
        assert!(v.crash_looping && v.bound);
        // The node's exit is told only from its own pod's report.
        let mut r = report("p", Verdict::NotAttached);
        r.last_exit = Some(sked_api::KernelExit { ops: "rusty".into(), reason: "stall".into(), ..Default::default() });
        assert!(node_view("n", Some(&pod("p")), Some(&r), &template, LONG_AGO, 1_000).exit.is_some());
        assert!(node_view("n", Some(&pod("q")), Some(&r), &template, LONG_AGO, 1_000).exit.is_none());
    }
}
