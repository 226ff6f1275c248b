//! The `sked-controller` binary: flags, the runtime, and the manager of `sked_controller`.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use sked_controller::config::{Cli, Command, refuse_legacy_flags};
use sked_controller::{crd, manager, telemetry};

/// The process's allocator, chosen by `make bench` (docs/performance.md): thousands of
/// long-lived report streams each hold buffers they fill only in part, and a reconnect storm
/// frees what it took at once, so what matters is memory handed back to the system on its own
/// (jemalloc's background purging) without a pass that stalls the process.
#[cfg(all(target_os = "linux", feature = "jemalloc", not(feature = "mimalloc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The alternative `make bench` compared (`--no-default-features --features mimalloc`).
#[cfg(all(target_os = "linux", feature = "mimalloc"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
