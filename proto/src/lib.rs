//! The contract between the sked agent and the controller: the gRPC service and messages
//! (package `sked.agent.v1`), and the names both sides must agree on outside the messages
//! (environment, mount paths, port, token audience), in [`contract`].

#![forbid(unsafe_code)]

/// Protobuf package of the agent API.
pub const PACKAGE: &str = "sked.agent.v1";

/// Generated messages, and with the `grpc` feature the client and server.
pub mod v1 {
    #![allow(clippy::all, clippy::pedantic)]
    include!(concat!(env!("OUT_DIR"), "/sked.agent.v1.rs"));
}

#[cfg(feature = "grpc")]
pub mod codec;
pub mod contract;
pub mod text;

pub use v1::{
    Ack, CgroupOp, CpuContract, Health, HealthSample, KernelExit, KernelState, PodCpu, PodOverLimit, Report, Verdict,
};

impl Verdict {
    /// The verdict's name as users read it (logs, `/readyz`, metric labels).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unspecified => "Unspecified",
            Self::Attached => "Attached",
            Self::NotAttached => "NotAttached",
            Self::ForeignScheduler => "ForeignScheduler",
            Self::KernelUnsupported => "KernelUnsupported",
        }
    }

    /// The verdict of a wire value. A value this build does not know (a newer agent) or an
    /// unset one counts as not attached: only an explicit Attached proves attachment.
    pub fn from_wire(value: i32) -> Self {
        match Self::try_from(value) {
            Ok(Self::Unspecified) | Err(_) => Self::NotAttached,
            Ok(known) => known,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Verdict;

    #[test]
    fn unknown_and_unset_wire_values_are_not_attached() {
        assert_eq!(Verdict::from_wire(0), Verdict::NotAttached);
        assert_eq!(Verdict::from_wire(99), Verdict::NotAttached);
        assert_eq!(Verdict::from_wire(Verdict::Attached as i32), Verdict::Attached);
        assert_eq!(Verdict::from_wire(Verdict::KernelUnsupported as i32), Verdict::KernelUnsupported);
    }
}
