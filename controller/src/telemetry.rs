//! Logging: newline-delimited JSON on stderr with the fields `time`, `level`, `msg`, `logger`
//! and `err` (plus the structured fields of the event and of its enclosing spans), or
//! human-readable text.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

pub use sked_logging::{JsonLayer, error_chain, level_name, logger_name};

use crate::config::{LogFlags, LogFormat, LogLevel};

/// The most verbose level the flags enable. `debug!` lines are V(1) and `trace!` lines V(4):
/// `--log-verbosity=1..3` enables the first, `--log-verbosity>=4` and `--log-level=debug` both.
pub fn level_filter(flags: &LogFlags) -> LevelFilter {
    match (flags.log_level, flags.log_verbosity) {
        (Some(LogLevel::Error), _) => LevelFilter::ERROR,
        (Some(LogLevel::Debug), _) => LevelFilter::TRACE,
        (Some(LogLevel::Info), _) | (None, None) | (None, Some(0)) => LevelFilter::INFO,
        (None, Some(1..=3)) => LevelFilter::DEBUG,
        (None, Some(_)) => LevelFilter::TRACE,
    }
}

/// Installs the global subscriber. Third-party crates log at warn and above unless `RUST_LOG`
/// says otherwise.
pub fn init(flags: &LogFlags) {
    let level = level_filter(flags);
    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::WARN.into())
        .parse_lossy(format!("sked_controller={level},sked={level},{}", std::env::var("RUST_LOG").unwrap_or_default()));
    let registry = tracing_subscriber::registry().with(filter);
    let result = match flags.log_format {
        LogFormat::Json => registry.with(JsonLayer::new(std::io::stderr)).try_init(),
        LogFormat::Text => {
            // Colour only on a terminal: a text log written to a file or a pipe stays plain.
            let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
            registry.with(tracing_subscriber::fmt::layer().with_ansi(ansi).with_writer(std::io::stderr)).try_init()
        }
    };
    // A subscriber is already installed (tests run several controllers in one process).
    let _ = result;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbosity_maps_to_levels() {
        let f = |level, verbosity| {
            level_filter(&LogFlags { log_format: LogFormat::Json, log_level: level, log_verbosity: verbosity })
        };
        assert_eq!(f(None, None), LevelFilter::INFO);
        assert_eq!(f(Some(LogLevel::Error), None), LevelFilter::ERROR);
        assert_eq!(f(Some(LogLevel::Debug), None), LevelFilter::TRACE);
        assert_eq!(f(None, Some(0)), LevelFilter::INFO);
        assert_eq!(f(None, Some(2)), LevelFilter::DEBUG);
    }
}
