//! The commands and flags, as kubectl spells its own.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Each node's kernel truth and the rollouts of sked Schedulers, read from the API server with
/// your kubeconfig and RBAC.
#[derive(Parser, Debug)]
#[command(name = "kubectl-sked", bin_name = "kubectl sked", version, about, long_about = None)]
#[command(after_help = EXIT_CODES)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

pub const EXIT_CODES: &str = "\
Exit codes:
  0  done (for `rollout status`: the rollout is Complete)
  1  the rollout failed (RolledBack or Failed)
  2  the command line is wrong
  3  timed out (`rollout status --timeout`)
  4  not found, or nothing to act on (no such Scheduler or Node, nothing failed to retry)
  5  refused by the API server (your RBAC does not allow it)
  6  any other error (API server unreachable, kubeconfig unreadable, a conflicting write)";

#[derive(Args, Debug, Clone)]
pub struct Global {
    /// The namespace of the scheduler pods (the chart's workloadNamespace, by default its
    /// release namespace).
    #[arg(short = 'n', long, global = true, env = "SKED_NAMESPACE", default_value = "sked-system")]
    pub namespace: String,
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true)]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// One row per node a Scheduler selects: its pod, revision, readiness and what its kernel
    /// runs.
    Status(StatusArgs),
    /// Every node: sched_ext support, the Scheduler owning it, what its kernel runs, conflicts.
    Nodes(OutputArgs),
    /// What sked knows of one node, and what to do about it.
    Doctor {
        /// The Node's name.
        node: String,
    },
    /// The statistics the scheduler on one node serves (scx_stats), as its agent relays them;
    /// read through the API server's pod proxy (get on pods/proxy in the pods' namespace: the
    /// chart's `<release>-stats-reader` Role).
    Stats {
        /// The Node's name.
        node: String,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Why a Scheduler's last revision failed: the cause, the node, what the kernel and the
    /// scheduler said last there.
    Why {
        /// The Scheduler.
        scheduler: String,
    },
    /// Follow or steer a Scheduler's rollout.
    #[command(subcommand)]
    Rollout(Rollout),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The Scheduler (all of them when omitted).
    pub scheduler: Option<String>,
    /// Only the nodes whose kernel does not run the Scheduler.
    #[arg(long)]
    pub not_attached: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Args, Debug, Clone, Copy)]
pub struct OutputArgs {
    /// Output format.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<Output>,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Wide,
    Json,
    Yaml,
}

#[derive(Subcommand, Debug)]
pub enum Rollout {
    /// Follow the rollout until it is Complete (exit 0), RolledBack or Failed (exit 1).
    Status {
        scheduler: String,
        /// Print the state once instead of following it.
        #[arg(short = 'w', long, default_value_t = true, action = clap::ArgAction::Set)]
        watch: bool,
        /// Give up after this long (e.g. 10m; 0 waits for ever).
        #[arg(long, default_value = "0s", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Stop the rollout before its next wave (sets spec.rollout.paused).
    Pause { scheduler: String },
    /// Let a paused rollout go on.
    Resume { scheduler: String },
    /// Try a failed revision again (what a pause and a resume do, in one command).
    Retry { scheduler: String },
    /// Go on past an Inconclusive analysis that paused the rollout (a pause and a resume: the
    /// verdict holds only under the generation it was reached in).
    Proceed { scheduler: String },
    /// Set the spec back to the revision sked last ran attached everywhere (its recorded image
    /// digest and fields).
    Undo { scheduler: String },
}

/// A duration as kubectl takes one: `90s`, `10m`, `1h`, `1m30s`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let span: jiff::Span = text.parse().map_err(|e| format!("{text:?} is not a duration like 90s or 10m: {e}"))?;
    let signed = jiff::SignedDuration::try_from(span).map_err(|e| format!("{text:?}: {e}"))?;
    Duration::try_from(signed).map_err(|_| format!("{text:?} is negative"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_read_as_kubectl_takes_them() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn kubectl_s_namespace_flag_goes_before_or_after_the_command() {
        let before = Cli::try_parse_from(["kubectl-sked", "-n", "w", "status"]).map(|c| c.global.namespace);
        let after = Cli::try_parse_from(["kubectl-sked", "status", "-n", "w"]).map(|c| c.global.namespace);
        assert_eq!(before.ok().as_deref(), Some("w"));
        assert_eq!(after.ok().as_deref(), Some("w"));
    }
}
