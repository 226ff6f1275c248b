//! Each scheduler pod's `sked.schedkit.io/KernelAttached` condition: what its node's agent
//! reported, as [`PodKernel`] (sked-api), and whether the pod already says so.
//!
//! [`desired`] decides from the pod's facts and its node's latest report; [`to_write`] compares
//! with what the pod carries (and what this controller wrote that the pod watch has not shown
//! yet), so a fleet at rest costs no write, and a new leader, which finds the conditions as it
//! would write them, writes none.

use std::time::{Duration, Instant};

use sked_api::pod_kernel::PodKernel;
use sked_api::verdict::Verdict;

use crate::kernel_summary::NodeReport;
use crate::pods::{KernelCondition, SchedulerPod};

/// The state the pod's condition should tell, or `None` to leave it as it is: a pod not taken up
/// by a kubelet yet, a terminating one, or one whose agent has not reported while the silence is
/// not judged yet (`judge_silence`: a new leader's grace for agents is over, and the pod started
/// longer than `stale_after` ago).
pub fn desired(
    pod: &SchedulerPod,
    report: Option<&NodeReport>,
    now: Instant,
    stale_after: Duration,
    judge_silence: bool,
) -> Option<PodKernel> {
    if pod.is_terminating() || !pod.started {
        return None;
    }
    let stale = PodKernel::Stale { after: humane(stale_after) };
    let Some(r) = report.filter(|r| r.pod == pod.name && pod.scheduler.as_ref() == Some(&r.scheduler)) else {
        return judge_silence.then_some(stale);
    };
    if !r.fresh(now, stale_after) {
        return Some(stale);
    }
    Some(match r.verdict {
        Verdict::Attached => PodKernel::Attached {
            ops: r.ops.clone(),
            // Nothing when the agent read nothing of it: the Scheduler's condition says why.
            contract: r.cpu_contract.as_ref().filter(|c| c.said_anything()).map(|c| c.brief()).unwrap_or_default(),
        },
        Verdict::ForeignScheduler => PodKernel::Foreign { ops: r.ops.clone() },
        Verdict::KernelUnsupported => PodKernel::Unsupported { said: r.reason.clone() },
        Verdict::NotAttached => match r.last_exit.as_ref().filter(|e| e.ejected) {
            Some(e) => PodKernel::Ejected { ops: e.ops.clone(), reason: e.reason.clone(), time: e.time.clone() },
            None => PodKernel::NotAttached { said: r.reason.clone() },
        },
    })
}

/// A duration as the flags spell it (`30s`, `2m`, `1m30s`).
fn humane(d: Duration) -> String {
    let secs = d.as_secs();
    match (secs / 60, secs % 60) {
        (0, s) => format!("{s}s"),
        (m, 0) => format!("{m}m"),
        (m, s) => format!("{m}m{s}s"),
    }
}

/// The condition to write on a pod that carries `observed`, for the state `want`; `None` when
/// it already says so, or when this controller already wrote it (`written`) and the pod watch
/// has not shown anything since (`written` is the condition written, with what the pod carried
/// then). `now` dates a condition whose status turns; one that keeps its status keeps its date.
pub fn to_write(
    observed: Option<&KernelCondition>,
    want: &PodKernel,
    written: Option<&(KernelCondition, Option<KernelCondition>)>,
    now: i64,
) -> Option<KernelCondition> {
    let says = |c: &KernelCondition| {
        c.status == want.status() && c.reason == want.reason().as_str() && c.message == want.message()
    };
    if observed.is_some_and(says) {
        return None;
    }
    if let Some((sent, seen_then)) = written
        && says(sent)
        && seen_then.as_ref() == observed
    {
        return None;
    }
    let since = observed.filter(|c| c.status == want.status()).map_or(now, |c| c.since);
    Some(KernelCondition {
        status: want.status().to_owned(),
        reason: want.reason().as_str().to_owned(),
        message: want.message(),
        since,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sked_api::KernelExit;

    use crate::test_objects::{pod, report};

    const STALE: Duration = Duration::from_secs(30);

    #[test]
    fn each_verdict_tells_its_state() {
        let now = Instant::now();
        let p = pod("p");
        let state = |v| desired(&p, Some(&report("p", v, now)), now, STALE, false);
        assert_eq!(
            state(Verdict::Attached),
            Some(PodKernel::Attached { ops: "rusty".into(), contract: String::new() })
        );
        let mut limits_lost = report("p", Verdict::Attached, now);
        limits_lost.cpu_contract = Some(crate::cpu_contract::NodeCpuContract {
            limits: crate::cpu_contract::Op::Missing,
            requests: crate::cpu_contract::Op::Implemented,
            ..Default::default()
        });
        let mut unread = report("p", Verdict::Attached, now);
        unread.cpu_contract = Some(crate::cpu_contract::NodeCpuContract {
            unread: "the agent lacks CAP_SYS_ADMIN".into(),
            ..Default::default()
        });
        assert_eq!(
            desired(&p, Some(&unread), now, STALE, false),
            Some(PodKernel::Attached { ops: "rusty".into(), contract: String::new() }),
            "nothing read: the pod's condition says nothing of it"
        );
        let contract = "the pods' CPU contract is not known: CPU limits: not enforced (no \
                        ops.cgroup_set_bandwidth), the pods not read; CPU requests: implemented (ops.cgroup_set_weight)";
        assert_eq!(
            desired(&p, Some(&limits_lost), now, STALE, false),
            Some(PodKernel::Attached { ops: "rusty".into(), contract: contract.into() }),
            "the pod's condition tells its node's CPU contract"
        );
        assert_eq!(state(Verdict::ForeignScheduler), Some(PodKernel::Foreign { ops: "rusty".into() }));
        assert_eq!(state(Verdict::KernelUnsupported), Some(PodKernel::Unsupported { said: "said".into() }));
        assert_eq!(state(Verdict::NotAttached), Some(PodKernel::NotAttached { said: "said".into() }));
        let mut ejected = report("p", Verdict::NotAttached, now);
        ejected.last_exit = Some(KernelExit {
            ops: "rusty".into(),
            reason: "runnable task stall".into(),
            time: "t1".into(),
            ejected: true,
            ..KernelExit::default()
        });
        assert_eq!(
            desired(&p, Some(&ejected), now, STALE, false),
            Some(PodKernel::Ejected { ops: "rusty".into(), reason: "runnable task stall".into(), time: "t1".into() })
        );
        let later = now + STALE + Duration::from_secs(1);
        assert_eq!(
            desired(&p, Some(&report("p", Verdict::Attached, now)), later, STALE, false),
            Some(PodKernel::Stale { after: "30s".into() })
        );
    }

    #[test]
    fn silence_is_judged_only_when_asked_and_another_pods_report_is_silence() {
        let now = Instant::now();
        let p = pod("p");
        let other = report("old-pod", Verdict::Attached, now);
        assert_eq!(desired(&p, Some(&other), now, STALE, false), None);
        assert_eq!(desired(&p, None, now, STALE, false), None);
        assert_eq!(
            desired(&p, None, now, Duration::from_secs(90), true),
            Some(PodKernel::Stale { after: "1m30s".into() })
        );
        let pending = SchedulerPod { started: false, ..pod("p") };
        assert_eq!(desired(&pending, Some(&report("p", Verdict::Attached, now)), now, STALE, true), None);
        let leaving = SchedulerPod { terminating_since: Some(1), ..pod("p") };
        assert_eq!(desired(&leaving, Some(&report("p", Verdict::Attached, now)), now, STALE, true), None);
    }

    fn condition(state: &PodKernel, since: i64) -> KernelCondition {
        KernelCondition {
            status: state.status().into(),
            reason: state.reason().as_str().into(),
            message: state.message(),
            since,
        }
    }

    #[test]
    fn a_pod_that_says_it_already_is_not_written_and_a_date_moves_only_with_the_status() {
        let attached = PodKernel::Attached { ops: "rusty".into(), contract: String::new() };
        let other_ops = PodKernel::Attached { ops: "lavd".into(), contract: String::new() };
        let stale = PodKernel::Stale { after: "30s".into() };
        assert_eq!(to_write(Some(&condition(&attached, 5)), &attached, None, 100), None);
        assert_eq!(to_write(None, &attached, None, 100), Some(condition(&attached, 100)));
        assert_eq!(to_write(Some(&condition(&attached, 5)), &other_ops, None, 100), Some(condition(&other_ops, 5)));
        assert_eq!(to_write(Some(&condition(&attached, 5)), &stale, None, 100), Some(condition(&stale, 100)));
    }

    #[test]
    fn a_write_the_watch_has_not_shown_is_not_repeated_but_one_undone_is() {
        let attached = PodKernel::Attached { ops: "rusty".into(), contract: String::new() };
        let stale = PodKernel::Stale { after: "30s".into() };
        let before = Some(condition(&stale, 5));
        let sent = (condition(&attached, 100), before.clone());
        assert_eq!(to_write(before.as_ref(), &attached, Some(&sent), 101), None, "in flight");
        // Someone else changed it since: written again.
        let changed = condition(&PodKernel::NotAttached { said: "x".into() }, 102);
        assert!(to_write(Some(&changed), &attached, Some(&sent), 103).is_some());
        // Another state wanted meanwhile: written.
        assert!(to_write(before.as_ref(), &stale, Some(&sent), 103).is_none(), "the pod says so");
        let foreign = PodKernel::Foreign { ops: "lavd".into() };
        assert!(to_write(before.as_ref(), &foreign, Some(&sent), 103).is_some());
    }
}
