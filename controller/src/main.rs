use std::process::ExitCode;

use clap::Parser;
use sked_controller::config::{Cli, Command, refuse_legacy_flags};
use sked_controller::{crd, manager, telemetry};

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

    tune_allocator();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(cli))
}

/// Blocks of at least this many bytes are mapped from the system on their own (glibc's default
/// starts at 128 KiB and grows).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 8 * 1024;

/// Every report stream holds a few small buffers for as long as it lives, and its TLS handshake
/// allocates and frees larger ones. With glibc's default thresholds those transients end up
/// between the long-lived buffers and the heap cannot give them back: at 5,000 streams that is
/// tens of MiB. Mapping larger blocks on their own returns them when freed. `GLIBC_TUNABLES`,
/// when set, is the operator's choice and is left alone.
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("GLIBC_TUNABLES").is_none() {
        // SAFETY: mallopt only sets a parameter of the allocator, and no other thread exists yet.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        }
    }
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
