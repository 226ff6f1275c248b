//! `kubectl sked`: each node's kernel truth and the rollouts of sked Schedulers, read from the
//! API server with the user's kubeconfig and RBAC (read commands need only get, list and watch).
//! kubectl runs it as a plugin when `kubectl-sked` is on the PATH.
#![forbid(unsafe_code)]

mod cli;
mod cluster;
mod doctor;
mod error;
mod fleet;
mod pod_names;
mod render;
mod rollout;
mod stats;
#[cfg(test)]
mod test_objects;
mod why;

use std::io::Write;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use kube::ResourceExt;

use crate::cli::{Cli, Command, Output, OutputArgs, Rollout, StatusArgs};
use crate::cluster::{Cluster, Nodes};
use crate::error::{Error, Result};
use crate::fleet::Summary;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Completion { shell } = cli.command {
        clap_complete::generate(shell, &mut Cli::command(), "kubectl-sked", &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::from(6);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    let cluster = Cluster::connect(&cli.global).await?;
    match cli.command {
        Command::Status(args) => status(&cluster, &args).await,
        Command::Nodes(output) => nodes(&cluster, output).await,
        Command::Doctor { node } => doctor(&cluster, &node).await,
        Command::Stats { node, output } => node_stats(&cluster, &node, output).await,
        Command::Why { scheduler } => why::why(&cluster, &scheduler).await,
        Command::Rollout(Rollout::Status { scheduler, watch, timeout }) => {
            rollout::status(&cluster, &scheduler, watch, timeout).await
        }
        Command::Rollout(Rollout::Pause { scheduler }) => rollout::set_paused(&cluster, &scheduler, true).await,
        Command::Rollout(Rollout::Resume { scheduler }) => rollout::set_paused(&cluster, &scheduler, false).await,
        Command::Rollout(Rollout::Retry { scheduler }) => rollout::retry(&cluster, &scheduler).await,
        Command::Rollout(Rollout::Proceed { scheduler }) => rollout::proceed(&cluster, &scheduler).await,
        Command::Rollout(Rollout::Undo { scheduler }) => rollout::undo(&cluster, &scheduler).await,
        Command::Completion { .. } => Ok(()),
    }
}

async fn status(cluster: &Cluster, args: &StatusArgs) -> Result<()> {
    let fleet = cluster.fleet(args.scheduler.as_deref(), Nodes::IfAllowed).await?;
    if fleet.schedulers.is_empty() {
        return Err(Error::NotFound("no Scheduler in the cluster (kubectl apply one first)".into()));
    }
    let assignment = fleet.assignment();
    let mut reports: Vec<render::SchedulerReport> = fleet
        .schedulers
        .iter()
        .map(|s| {
            let mut nodes = fleet.status_rows(s, assignment.as_ref());
            if args.not_attached {
                nodes.retain(|r| !r.attached());
            }
            render::SchedulerReport { summary: Summary::of(s), nodes }
        })
        .collect();
    name_pods(cluster, &mut reports).await;
    let mut out = std::io::stdout().lock();
    match args.output.output {
        Some(format @ (Output::Json | Output::Yaml)) => render::structured(&mut out, format, &reports),
        wide => {
            let now = jiff::Timestamp::now();
            for (i, r) in reports.iter().enumerate() {
                if i > 0 {
                    writeln!(out).map_err(|e| Error::Other(e.to_string()))?;
                }
                render::status_table(&mut out, &r.summary, &r.nodes, wide == Some(Output::Wide), now)?;
            }
            Ok(())
        }
    }
}

/// The pods the rows name by UID (the pods' CPU contract, the analysis), named as the user
/// knows them where the user may list them (see `pod_names`).
async fn name_pods(cluster: &Cluster, reports: &mut [render::SchedulerReport]) {
    fn texts(r: &fleet::StatusRow) -> impl Iterator<Item = &str> {
        [r.cpu_contract.as_deref(), r.analysis.as_deref()].into_iter().flatten()
    }
    let rows = || reports.iter().flat_map(|r| &r.nodes);
    let naming: Vec<&fleet::StatusRow> = rows().filter(|r| texts(r).any(|t| !pod_names::uids(t).is_empty())).collect();
    if naming.is_empty() {
        return;
    }
    let names = cluster.pod_names(naming.iter().map(|r| r.node.as_str()), naming.iter().flat_map(|r| texts(r))).await;
    for row in reports.iter_mut().flat_map(|r| &mut r.nodes) {
        for text in [&mut row.cpu_contract, &mut row.analysis].into_iter().flatten() {
            *text = names.apply(text);
        }
    }
}

async fn nodes(cluster: &Cluster, output: OutputArgs) -> Result<()> {
    let fleet = cluster.fleet(None, Nodes::Required).await?;
    let assignment = fleet.assignment().unwrap_or_default();
    let rows = fleet.node_rows(&assignment);
    let mut out = std::io::stdout().lock();
    match output.output {
        Some(format @ (Output::Json | Output::Yaml)) => render::structured(&mut out, format, &rows),
        wide => render::nodes_table(&mut out, &rows, wide == Some(Output::Wide)),
    }
}

async fn doctor(cluster: &Cluster, node: &str) -> Result<()> {
    let fleet = cluster.fleet(None, Nodes::Required).await?;
    let found = fleet.nodes.as_deref().unwrap_or_default().iter().find(|n| n.name_any() == node);
    let Some(found) = found else {
        return Err(Error::NotFound(format!("Node {node} not found (kubectl get nodes lists them)")));
    };
    let diagnosis = doctor::diagnose(&fleet, found, &cluster.namespace);
    render::diagnosis(&mut std::io::stdout().lock(), &diagnosis)
}

async fn node_stats(cluster: &Cluster, node: &str, output: OutputArgs) -> Result<()> {
    let (pod, text) = cluster.agent_metrics(node).await?;
    let stats = stats::parse(node, &pod, &text).map_err(Error::Other)?;
    if let Some(why) = stats.why_none() {
        return Err(Error::NotFound(why));
    }
    let mut out = std::io::stdout().lock();
    match output.output {
        Some(format @ (Output::Json | Output::Yaml)) => render::structured(&mut out, format, &stats),
        _ => out.write_all(stats.table().as_bytes()).map_err(|e| Error::Other(format!("writing the output: {e}"))),
    }
}
