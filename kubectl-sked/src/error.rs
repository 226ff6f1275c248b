//! What can go wrong, each with the exit code scripts rely on (see `cli::EXIT_CODES`) and a
//! message that names the object and what to do.

use std::process::ExitCode;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The rollout ended in RolledBack or Failed.
    #[error("{0}")]
    RolloutFailed(String),
    #[error("{0}")]
    TimedOut(String),
    /// No such object, or nothing to act on.
    #[error("{0}")]
    NotFound(String),
    /// The API server refused: the message names the verb, resource and user.
    #[error(
        "{what}: {message}\n  your RBAC does not allow this; ask for a role that grants it (the chart's `<release>-viewer` ClusterRole covers the read commands)"
    )]
    Forbidden { what: String, message: String },
    #[error("{0}")]
    Other(String),
}

impl Error {
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            Error::RolloutFailed(_) => 1,
            Error::TimedOut(_) => 3,
            Error::NotFound(_) => 4,
            Error::Forbidden { .. } => 5,
            Error::Other(_) => 6,
        })
    }

    /// An API call's failure, `what` saying which call (e.g. "getting Scheduler rusty").
    pub fn api(what: impl Into<String>, e: kube::Error) -> Error {
        let what = what.into();
        match e {
            kube::Error::Api(s) if s.code == 403 || s.code == 401 => Error::Forbidden { what, message: s.message },
            kube::Error::Api(s) if s.code == 404 => Error::NotFound(format!("{what}: not found")),
            kube::Error::Api(s) if s.code == 409 => {
                Error::Other(format!("{what}: {}; it changed meanwhile, run the command again", s.message))
            }
            other => Error::Other(format!("{what}: {other}")),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(kube::core::Status::failure(message, "").with_code(code).boxed())
    }

    #[test]
    fn each_failure_has_its_exit_code() {
        let forbidden =
            Error::api("patching Scheduler s", api_error(403, "schedulers is forbidden: User \"v\" cannot patch"));
        assert_eq!(forbidden.exit_code(), ExitCode::from(5));
        assert!(forbidden.to_string().contains("cannot patch"), "the API server's words name the verb: {forbidden}");
        assert_eq!(Error::api("getting Scheduler s", api_error(404, "x")).exit_code(), ExitCode::from(4));
        assert_eq!(Error::api("updating Scheduler s", api_error(409, "x")).exit_code(), ExitCode::from(6));
    }
}
