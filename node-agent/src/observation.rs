//! One look at the node: what was read, and what the agent concluded from it.

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
}

impl Observation {
    pub fn state_name(&self) -> &str {
        if self.read.supported { self.read.state.as_str() } else { "unsupported" }
    }

    /// Whether `other` differs in anything but counters (which change all the time).
    pub fn differs_from(&self, other: &Observation) -> bool {
        self.verdict != other.verdict
            || self.read.state != other.read.state
            || self.read.ops != other.read.ops
            || self.read.enable_seq != other.read.enable_seq
            || self.reason != other.reason
            || self.last_exit != other.last_exit
    }
}
