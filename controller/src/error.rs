//! The error type of startup and of the servers (reconcile errors have their own enum).

/// An error that stops the controller (or one of its servers), with its cause chain.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
