use std::process::ExitCode;

use clap::Parser;
use sked_controller::config::{Cli, Command, refuse_legacy_flags};
use sked_controller::{crd, manager, telemetry};

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod allocator;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[global_allocator]
static ALLOCATOR: allocator::Allocator = allocator::Allocator;

/// Flags are parsed (and `--version`, `--help`, `crd` answered) before the async runtime
/// starts: they need no threads, so they also answer under qemu-user, where the cross-build
/// smoke test runs them.
fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Err(message) = refuse_legacy_flags(&args) {
        eprintln!("error: {message}");
        return ExitCode::from(2);
    }
    let cli = Cli::parse();
    if let Some(Command::Crd) = cli.command {
        return match crd::crd_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: rendering the CRD: {e}");
                ExitCode::FAILURE
            }
        };
    }

    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    runtime.spawn(allocator::give_back_free_pages());
    runtime.block_on(run(cli))
}

async fn run(cli: Cli) -> ExitCode {
    telemetry::init(&cli.log);
    let client = match kube::Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(err = %e, "cannot build a Kubernetes client: set KUBECONFIG or run in a pod with a service account");
            return ExitCode::FAILURE;
        }
    };
    let instance = std::env::var("POD_NAME").unwrap_or_else(|_| hostname());
    match manager::run(client, cli.controller, instance, manager::shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(err = %e, "controller stopped with an error");
            ExitCode::FAILURE
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "sked-controller".to_owned())
}
