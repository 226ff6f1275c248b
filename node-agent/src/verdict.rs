//! What the agent concludes from a kernel read: is this pod's scheduler the one running?

pub use sked_proto::Verdict;

use crate::attacher::Owner;
use crate::sysfs::{KernelRead, SchedState};

/// Decides the verdict and says why.
///
/// Attached: sched_ext is enabled and the attached ops belong to this pod's scheduler process,
/// or match `expected_ops` (a prefix: scx schedulers append their version and target).
/// ForeignScheduler: enabled, but neither is true. NotAttached: nothing enabled (or still
/// enabling/disabling), or ownership cannot be checked and no `expected_ops` was given.
pub fn decide(read: &KernelRead, expected_ops: Option<&str>, owner: &Owner) -> (Verdict, String) {
    if !read.supported {
        return (
            Verdict::KernelUnsupported,
            "no /sys/kernel/sched_ext: this kernel is built without sched_ext (CONFIG_SCHED_CLASS_EXT)".into(),
        );
    }
    match &read.state {
        SchedState::Enabled => {}
        SchedState::Disabled => return (Verdict::NotAttached, "no sched_ext scheduler is enabled".into()),
        SchedState::Enabling | SchedState::Disabling => {
            return (Verdict::NotAttached, format!("sched_ext is {}", read.state.as_str()));
        }
        SchedState::Other(s) => return (Verdict::NotAttached, format!("unknown sched_ext state \"{s}\"")),
        SchedState::Unreadable => {
            let why = read.problems.first().map_or("unreadable", String::as_str);
            return (Verdict::NotAttached, format!("cannot read sched_ext state: {why}"));
        }
    }
    let ops = read.ops.as_deref().unwrap_or("");
    if ops.is_empty() {
        // Between `state` and `root/ops` (attach or detach in progress): nobody to judge yet.
        return (Verdict::NotAttached, "sched_ext is enabled but root/ops names no scheduler yet".into());
    }
    let expected = expected_ops.filter(|e| !e.is_empty());
    let matches_expected = expected.is_some_and(|e| !ops.is_empty() && ops.starts_with(e));
    match (owner, expected) {
        // The Scheduler names its ops: others are another scheduler's, even one a process of the
        // pod holds (a second scheduler started in the pod, or a link its holder passed on).
        (_, Some(e)) if !matches_expected => (
            Verdict::ForeignScheduler,
            format!("kernel runs ops \"{ops}\", not this pod's scheduler (expectedOps {e:?})"),
        ),
        (Owner::Ours { pid, comm, .. }, _) => {
            (Verdict::Attached, format!("kernel runs ops \"{ops}\", attached by {comm} (pid {pid}) in this pod"))
        }
        (_, Some(e)) => (Verdict::Attached, format!("kernel runs ops \"{ops}\", which matches expectedOps {e:?}")),
        (Owner::NotOurs, None) => {
            (Verdict::ForeignScheduler, format!("kernel runs ops \"{ops}\", attached by a process outside this pod"))
        }
        (Owner::Unknown(why), None) => (
            Verdict::NotAttached,
            format!(
                "kernel runs ops \"{ops}\" but its owner cannot be checked ({why}): set spec.expectedOps, or give the agent CAP_SYS_ADMIN and CAP_SYS_PTRACE"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::fixture;

    fn kernel(state: &str, ops: Option<&str>) -> KernelRead {
        let tmp = tempfile::tempdir().unwrap();
        fixture::write(tmp.path(), state, ops, 1).unwrap();
        crate::sysfs::read(tmp.path())
    }

    fn ours() -> Owner {
        Owner::Ours { pid: 42, comm: "scx_rusty".into(), link: Some(3), map: Some(12) }
    }

    #[test]
    fn unsupported_kernel() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("kernel")).unwrap();
        let (v, why) = decide(&crate::sysfs::read(tmp.path()), None, &Owner::NotOurs);
        assert_eq!(v, Verdict::KernelUnsupported);
        assert!(why.contains("CONFIG_SCHED_CLASS_EXT"));
    }

    #[test]
    fn disabled_and_transitional_states_are_not_attached() {
        for state in ["disabled", "enabling", "disabling"] {
            let (v, why) = decide(&kernel(state, None), Some("rusty"), &ours());
            assert_eq!(v, Verdict::NotAttached, "{state}");
            assert!(why.contains(if state == "disabled" { "no sched_ext" } else { state }), "{why}");
        }
    }

    #[test]
    fn owned_by_this_pod_is_attached() {
        let (v, why) = decide(&kernel("enabled", Some("rusty_1.0.0_x86_64")), None, &ours());
        assert_eq!(v, Verdict::Attached);
        assert!(why.contains("pid 42"), "{why}");
    }

    #[test]
    fn expected_ops_match_by_prefix() {
        let k = kernel("enabled", Some("bpfland_1.1.4_x86_64_unknown_linux_gnu"));
        assert_eq!(decide(&k, Some("bpfland"), &Owner::NotOurs).0, Verdict::Attached);
        assert_eq!(decide(&k, Some("bpfland"), &Owner::Unknown("EPERM".into())).0, Verdict::Attached);
        let (v, why) = decide(&k, Some("lavd"), &Owner::NotOurs);
        assert_eq!(v, Verdict::ForeignScheduler);
        assert!(why.contains("bpfland") && why.contains("lavd"), "{why}");
    }

    #[test]
    fn ops_other_than_expected_are_foreign_whoever_holds_them() {
        // A second scheduler started inside the pod (or the VM test's intruder, pinned by a
        // loader that held its link a moment) is not the one the Scheduler names.
        let k = kernel("enabled", Some("sked_intruder"));
        let (v, why) = decide(&k, Some("sked_canary"), &ours());
        assert_eq!(v, Verdict::ForeignScheduler);
        assert!(why.contains("sked_intruder") && why.contains("sked_canary"), "{why}");
        // Without expectedOps, holding the link is the proof.
        assert_eq!(decide(&k, None, &ours()).0, Verdict::Attached);
    }

    #[test]
    fn enabled_without_an_ops_name_is_not_judged_yet() {
        let mut k = kernel("enabled", Some("rusty"));
        k.ops = None;
        let (v, why) = decide(&k, Some("rusty"), &Owner::NotOurs);
        assert_eq!(v, Verdict::NotAttached, "never foreign on an empty ops name");
        assert!(why.contains("root/ops"), "{why}");
    }

    #[test]
    fn someone_else_s_scheduler_is_foreign() {
        let k = kernel("enabled", Some("started_by_hand"));
        assert_eq!(decide(&k, None, &Owner::NotOurs).0, Verdict::ForeignScheduler);
    }

    #[test]
    fn unknown_owner_without_expectation_is_not_claimed() {
        let (v, why) = decide(&kernel("enabled", Some("x")), None, &Owner::Unknown("no CAP_BPF".into()));
        assert_eq!(v, Verdict::NotAttached);
        assert!(why.contains("spec.expectedOps"), "{why}");
    }
}
