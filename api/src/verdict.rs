//! What a node's agent concluded about its scheduler, in sked's own terms: the wire's verdict
//! (`sked_proto::Verdict`) is converted where reports arrive, so the deciders never see a
//! value the protocol may add or leave unspecified.

/// An agent's verdict on its pod's scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The kernel runs this pod's scheduler.
    Attached,
    /// The kernel runs no scheduler of this pod's (nothing, or nothing it can tie to the pod).
    NotAttached,
    /// Another scheduler owns sched_ext on the node.
    ForeignScheduler,
    /// The node's kernel has no sched_ext.
    KernelUnsupported,
}

impl Verdict {
    /// The verdict's name, as logs and metrics spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Attached => "Attached",
            Verdict::NotAttached => "NotAttached",
            Verdict::ForeignScheduler => "ForeignScheduler",
            Verdict::KernelUnsupported => "KernelUnsupported",
        }
    }
}
