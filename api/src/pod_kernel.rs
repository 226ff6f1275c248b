//! One node's kernel truth, as it stands on that node's scheduler pod: the controller writes it
//! into the pod's [`POD_CONDITION`] condition from what the node's agent reported, `kubectl
//! sked` reads it back. This is the one home of that condition's reasons and message format, so
//! what one writes the other parses.
//!
//! Since when a state holds is the condition's `lastTransitionTime` (set when its status turns),
//! not part of the message: a new leader, which hears the agents afresh, then finds every
//! condition as it would write it and writes nothing.

use crate::Reason;

/// The pod condition type.
pub const POD_CONDITION: &str = "sked.schedkit.io/KernelAttached";

/// How the node's part of the pods' CPU contract in an attached pod's condition begins when the
/// contract is broken there (`PodKernel::Attached::contract`).
pub const CONTRACT_BROKEN: &str = "the pods' CPU contract is broken: ";
/// ... when the scheduler lacks a callback and the node's pods were not read.
pub const CONTRACT_UNKNOWN: &str = "the pods' CPU contract is not known: ";
/// ... when it is not broken as far as the agent read.
pub const CONTRACT_HOLDS: &str = "the pods' CPU contract holds as far as read: ";

/// What a node's kernel does with its scheduler pod's scheduler, as its agent reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodKernel {
    /// The kernel runs this pod's scheduler, registered as `ops`; `contract` says, in words
    /// that change only when it does, what becomes of the pods' CPU limits and requests under it
    /// (empty when the agent did not say).
    Attached { ops: String, contract: String },
    /// Nothing of this pod runs in the kernel; the agent's words.
    NotAttached { said: String },
    /// Another scheduler (started by hand, or another tool's) owns the kernel.
    Foreign { ops: String },
    /// The node's kernel has no sched_ext; the agent's words.
    Unsupported { said: String },
    /// This pod's scheduler was attached and the kernel threw it out: the kernel's reason, and
    /// when (its log's time).
    Ejected { ops: String, reason: String, time: String },
    /// The node's agent has not reported for longer than `after` (e.g. `30s`).
    Stale { after: String },
}

const ATTACHED: (&str, &str, &str) = ("ops ", " attached", "; ");
const NOT_ATTACHED: &str = "not attached: ";
const FOREIGN: &str = "the kernel runs another scheduler: ops ";
const UNSUPPORTED: &str = "the kernel has no sched_ext: ";
const EJECTED: (&str, &str, &str) = ("ops ", " ejected at ", ": ");
const STALE: &str = "no report from the node's agent for more than ";

impl PodKernel {
    /// The condition's status: `True` only while attached.
    pub fn status(&self) -> &'static str {
        if matches!(self, PodKernel::Attached { .. }) { "True" } else { "False" }
    }

    /// The condition's reason.
    pub fn reason(&self) -> Reason {
        match self {
            PodKernel::Attached { .. } => Reason::KernelAttached,
            PodKernel::NotAttached { .. } => Reason::NotAttached,
            PodKernel::Foreign { .. } => Reason::ForeignScheduler,
            PodKernel::Unsupported { .. } => Reason::KernelUnsupported,
            PodKernel::Ejected { .. } => Reason::KernelEjected,
            PodKernel::Stale { .. } => Reason::ReportStale,
        }
    }

    /// The condition's message (the texts in it were escaped and capped when they arrived).
    pub fn message(&self) -> String {
        match self {
            PodKernel::Attached { ops, contract } if contract.is_empty() => {
                format!("{}{ops}{}", ATTACHED.0, ATTACHED.1)
            }
            PodKernel::Attached { ops, contract } => {
                format!("{}{ops}{}{}{contract}", ATTACHED.0, ATTACHED.1, ATTACHED.2)
            }
            PodKernel::NotAttached { said } => format!("{NOT_ATTACHED}{said}"),
            PodKernel::Foreign { ops } => format!("{FOREIGN}{ops}"),
            PodKernel::Unsupported { said } => format!("{UNSUPPORTED}{said}"),
            PodKernel::Ejected { ops, reason, time } => {
                format!("{}{ops}{}{time}{}{reason}", EJECTED.0, EJECTED.1, EJECTED.2)
            }
            PodKernel::Stale { after } => format!("{STALE}{after}"),
        }
    }

    /// The state a condition with this reason and message tells, if sked wrote it.
    pub fn parse(reason: &str, message: &str) -> Option<PodKernel> {
        let owned = |s: &str| s.to_owned();
        Some(match Reason::parse(reason)? {
            Reason::KernelAttached => {
                // Ops names hold no spaces.
                let (ops, rest) = message.strip_prefix(ATTACHED.0)?.split_once(ATTACHED.1)?;
                let contract = if rest.is_empty() { "" } else { rest.strip_prefix(ATTACHED.2)? };
                PodKernel::Attached { ops: owned(ops), contract: owned(contract) }
            }
            Reason::NotAttached => PodKernel::NotAttached { said: owned(message.strip_prefix(NOT_ATTACHED)?) },
            Reason::ForeignScheduler => PodKernel::Foreign { ops: owned(message.strip_prefix(FOREIGN)?) },
            Reason::KernelUnsupported => PodKernel::Unsupported { said: owned(message.strip_prefix(UNSUPPORTED)?) },
            Reason::KernelEjected => {
                // Ops names and the log's times hold no spaces; the kernel's reason may.
                let (ops, rest) = message.strip_prefix(EJECTED.0)?.split_once(EJECTED.1)?;
                let (time, reason) = rest.split_once(EJECTED.2)?;
                PodKernel::Ejected { ops: owned(ops), reason: owned(reason), time: owned(time) }
            }
            Reason::ReportStale => PodKernel::Stale { after: owned(message.strip_prefix(STALE)?) },
            _ => return None,
        })
    }

    /// The ops name the kernel runs, where the state names one (a foreign scheduler's too).
    pub fn ops(&self) -> Option<&str> {
        match self {
            PodKernel::Attached { ops, .. } | PodKernel::Foreign { ops } | PodKernel::Ejected { ops, .. } => Some(ops),
            _ => None,
        }
    }

    /// A short name of the state, for tables (`attached`, `not-attached`, `foreign`,
    /// `unsupported`, `ejected`, `stale`).
    pub fn short(&self) -> &'static str {
        match self {
            PodKernel::Attached { .. } => "attached",
            PodKernel::NotAttached { .. } => "not-attached",
            PodKernel::Foreign { .. } => "foreign",
            PodKernel::Unsupported { .. } => "unsupported",
            PodKernel::Ejected { .. } => "ejected",
            PodKernel::Stale { .. } => "stale",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn word() -> impl Strategy<Value = String> {
        "[a-z0-9_.]{0,20}"
    }

    fn text() -> impl Strategy<Value = String> {
        "[ -~]{0,60}"
    }

    fn state() -> impl Strategy<Value = PodKernel> {
        prop_oneof![
            (word(), prop_oneof![Just(String::new()), text()])
                .prop_map(|(ops, contract)| PodKernel::Attached { ops, contract }),
            text().prop_map(|said| PodKernel::NotAttached { said }),
            word().prop_map(|ops| PodKernel::Foreign { ops }),
            text().prop_map(|said| PodKernel::Unsupported { said }),
            (word(), text(), "[0-9TZ:.-]{0,24}").prop_map(|(ops, reason, time)| PodKernel::Ejected {
                ops,
                reason,
                time
            }),
            "[0-9a-z]{1,6}".prop_map(|after| PodKernel::Stale { after }),
        ]
    }

    proptest! {
        #[test]
        fn what_the_controller_writes_the_plugin_reads_back(s in state()) {
            prop_assert_eq!(PodKernel::parse(s.reason().as_str(), &s.message()), Some(s.clone()));
            prop_assert_eq!(s.status() == "True", s.reason() == Reason::KernelAttached);
        }
    }

    #[test]
    fn messages_read_as_sentences() {
        let ejected = PodKernel::Ejected {
            ops: "rusty_1.0.0".into(),
            reason: "runnable task stall (x[1] failed to run for 5s)".into(),
            time: "2026-12-04T01:02:03.000Z".into(),
        };
        assert_eq!(
            ejected.message(),
            "ops rusty_1.0.0 ejected at 2026-12-04T01:02:03.000Z: runnable task stall (x[1] failed to run for 5s)"
        );
        assert_eq!(
            PodKernel::Attached { ops: "rusty".into(), contract: String::new() }.message(),
            "ops rusty attached"
        );
        let contract = "CPU limits: not enforced (no ops.cgroup_set_bandwidth)".to_owned();
        let with = PodKernel::Attached { ops: "rusty".into(), contract: contract.clone() };
        assert_eq!(with.message(), format!("ops rusty attached; {contract}"));
        assert_eq!(PodKernel::parse("KernelAttached", &with.message()), Some(with));
        assert_eq!(
            PodKernel::Stale { after: "30s".into() }.message(),
            "no report from the node's agent for more than 30s"
        );
    }

    #[test]
    fn a_condition_sked_did_not_write_tells_nothing() {
        assert_eq!(PodKernel::parse("Ready", "ops x attached"), None);
        assert_eq!(PodKernel::parse("KernelAttached", "something else"), None);
        assert_eq!(PodKernel::parse("RolloutInProgress", "not attached: x"), None);
    }
}
