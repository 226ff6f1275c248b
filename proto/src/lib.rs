//! The gRPC contract between the sked agent and the controller (package `sked.agent.v1`).

/// Protobuf package of the agent API.
pub const PACKAGE: &str = "sked.agent.v1";

/// Generated messages, client and server.
pub mod v1 {
    #![allow(clippy::all, clippy::pedantic)]
    tonic::include_proto!("sked.agent.v1");
}

pub use v1::{Ack, KernelState, Report, Verdict};
