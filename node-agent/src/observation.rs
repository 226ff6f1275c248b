//! One look at the node: what was read, and what the agent concluded from it.

use crate::cgroup_ops::CgroupOps;
use crate::kmsg::Exit;
use crate::sysfs::KernelRead;
use crate::verdict::Verdict;

/// One look at the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    pub read: KernelRead,
    pub verdict: Verdict,
    pub reason: String,
    /// The node's last exit, from the kernel log.
    pub last_exit: Option<Exit>,
    /// The running scheduler's cgroup callbacks, or why they could not be read (`None` while
    /// no scheduler is enabled).
    pub cgroup_ops: Option<Result<CgroupOps, String>>,
}

impl Observation {
    pub fn state_name(&self) -> &str {
        if self.read.supported { self.read.state.as_str() } else { "unsupported" }
    }

    /// Whether this observation finds the scheduler gone that `before` found attached, and the
    /// kernel log has not said why yet (no exit since `before`): the kernel sets the state before
    /// it logs the reason, and whether the departure is an ejection or a restart it asked for
    /// depends on that reason.
    pub fn left_without_a_reason(&self, before: &Observation) -> bool {
        before.verdict == Verdict::Attached && self.verdict != Verdict::Attached && self.last_exit == before.last_exit
    }

    /// Whether `other` differs in anything but counters (which change all the time).
    pub fn differs_from(&self, other: &Observation) -> bool {
        self.verdict != other.verdict
            || self.read.state != other.read.state
            || self.read.ops != other.read.ops
            || self.read.enable_seq != other.read.enable_seq
            || self.reason != other.reason
            || self.last_exit != other.last_exit
            || self.cgroup_ops != other.cgroup_ops
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(verdict: Verdict, exit_seq: Option<u64>) -> Observation {
        let read = KernelRead { supported: true, ..crate::sysfs::read(std::path::Path::new("/nonexistent")) };
        let last_exit = exit_seq.map(|seq| Exit {
            ops: "a".into(),
            reason: "unregistered from the main kernel".into(),
            detail: String::new(),
            at_ms: 0,
            seq,
            ejected: false,
            restart: true,
            trace: Vec::new(),
        });
        Observation { read, verdict, reason: String::new(), last_exit, cgroup_ops: None }
    }

    #[test]
    fn a_scheduler_gone_waits_for_the_reason_only_until_the_log_has_a_new_exit() {
        let attached = seen(Verdict::Attached, Some(1));
        assert!(seen(Verdict::NotAttached, Some(1)).left_without_a_reason(&attached), "the same exit as before");
        assert!(!seen(Verdict::NotAttached, Some(2)).left_without_a_reason(&attached), "the log said why");
        assert!(!seen(Verdict::NotAttached, Some(1)).left_without_a_reason(&seen(Verdict::NotAttached, Some(1))));
        assert!(!seen(Verdict::Attached, Some(1)).left_without_a_reason(&attached));
    }
}
