//! The gRPC contract between the sked agent and the controller (package `sked.agent.v1`).

/// Protobuf package of the agent API.
pub const PACKAGE: &str = "sked.agent.v1";
