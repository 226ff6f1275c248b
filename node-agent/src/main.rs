//! sked-agent's binary: flags, then the kernel watch, the health sampling, the report stream and
//! the HTTP server.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{ArgAction, Parser, ValueEnum};
use sked_agent::attacher::Capabilities;
use sked_agent::health;
use sked_agent::kernel_watch::{self, Observer};
use sked_agent::metrics::Metrics;
use sked_agent::observation::Observation;
use sked_agent::privileges;
use sked_agent::report::{self, Identity, ReporterConfig};
use sked_agent::stats_relay::{self, RelayConfig};
use sked_proto::Health;
use sked_proto::contract::{self, env};
use tokio::sync::watch;
use tracing::{error, info, warn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

/// Reports whether the kernel runs this pod's sched_ext scheduler.
#[derive(Debug, Parser)]
#[command(name = "sked-agent", version, about)]
struct Cli {
    /// Node this agent runs on (downward API: spec.nodeName).
    #[arg(long, env = env::NODE_NAME)]
    node_name: String,
    /// Pod this agent runs in (downward API: metadata.name).
    #[arg(long, env = env::POD_NAME, default_value = "")]
    pod_name: String,
    /// Name of the Scheduler resource this pod runs.
    #[arg(long, env = env::SCHEDULER)]
    scheduler: String,
    /// Ops name the scheduler registers (prefix match); empty: check the link's owner instead.
    #[arg(long, env = env::EXPECTED_OPS)]
    expected_ops: Option<String>,
    #[arg(long, default_value = "/sys")]
    sysfs_root: PathBuf,
    #[arg(long, default_value = "/proc")]
    proc_root: PathBuf,
    /// Re-read the kernel state this often, uevents or not.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    poll_interval: Duration,
    /// The kernel log, read from its end for why schedulers leave the kernel (needs
    /// CAP_SYSLOG where kernel.dmesg_restrict is set). Empty: not read.
    #[arg(long, default_value = "/dev/kmsg")]
    kernel_log: String,
    /// Listen for kernel uevents (effective in the host's network namespace).
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    uevents: bool,
    /// Controller reports endpoint, e.g. https://sked-reports.sked-system.svc:8443. Unset: no
    /// reporting, only /readyz and /metrics.
    #[arg(long, env = env::CONTROLLER_ADDRESS)]
    controller_address: Option<String>,
    /// Every controller replica, to hold a report stream to each (so a standby has heard this
    /// node before it leads): a name whose DNS records are the replicas, e.g.
    /// sked-reports-replicas.sked-system.svc, or a comma-separated list of host[:port] (the
    /// port defaults to the controller address's). Unset: one stream, to --controller-address.
    #[arg(long, env = env::CONTROLLER_REPLICAS)]
    controller_replicas: Option<String>,
    #[arg(long, default_value = contract::CA_FILE)]
    ca_file: PathBuf,
    #[arg(long, default_value = contract::TOKEN_FILE)]
    token_file: PathBuf,
    /// TLS name of the controller, when it differs from the address's host.
    #[arg(long)]
    server_name: Option<String>,
    /// Report at least this often, changes or not.
    #[arg(long, default_value = contract::HEARTBEAT_INTERVAL, value_parser = humantime::parse_duration)]
    heartbeat_interval: Duration,
    /// The scheduler's scx_stats socket (a directory the pod's two containers share); its
    /// statistics are relayed to /metrics as scx_* series while it is attached. Empty: not read.
    #[arg(long, default_value = sked_agent::scx_stats::DEFAULT_SOCKET)]
    stats_socket: PathBuf,
    /// Ask the scheduler for its statistics this often (scrapes serve the last reply). Many
    /// schedulers count since the previous request: such a series is a count per interval.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    stats_interval: Duration,
    /// Sample the node's scheduling health (run delay, waiting tasks and utilisation per CPU,
    /// CPU pressure, sched_ext event rates) this often (at least 1s), and send the newest samples
    /// with every report. 0s: not sampled, no health sent.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    health_interval: Duration,
    /// The host's cgroup2 tree, mounted read-only, where the agent reads the pods' CPU limits
    /// and usage (`kubepods` under it).
    #[arg(long, env = env::CGROUP_ROOT, default_value = contract::HOST_CGROUP_SOURCE)]
    cgroup_root: PathBuf,
    /// Read the pods' CPU limits and usage this often (at least 1s), and send what the last
    /// window showed with every report. 0s: not read.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pod_cpu_interval: Duration,
    /// Address of /readyz, /healthz and /metrics.
    #[arg(long, default_value_t = SocketAddr::from(([0, 0, 0, 0], contract::AGENT_PORT)))]
    listen_address: SocketAddr,
    #[arg(long, value_enum, default_value_t = LogFormat::Json)]
    log_format: LogFormat,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("sked_agent=info,warn"));
    let registry = tracing_subscriber::registry().with(filter);
    let _ = match cli.log_format {
        LogFormat::Json => registry.with(sked_logging::JsonLayer::new(std::io::stderr)).try_init(),
        LogFormat::Text => {
            // Colour only on a terminal: a text log written to a file or a pipe stays plain.
            let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
            registry.with(tracing_subscriber::fmt::layer().with_ansi(ansi).with_writer(std::io::stderr)).try_init()
        }
    };
    // Before the runtime starts threads: they inherit what is left.
    match privileges::keep_only_used() {
        Ok(dropped) if !dropped.is_empty() => {
            info!(dropped = %dropped.join(","), "dropped capabilities the agent does not use")
        }
        Ok(_) => {}
        Err(e) => warn!(err = %e, "could not drop unused capabilities"),
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            error!(err = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(cli))
}

/// Starts reading the pods' CPU limits and usage, unless `--pod-cpu-interval` is 0s. Returns
/// the newest window's summary, for the reports.
fn spawn_pod_cpu(
    cli: &Cli,
    observed: watch::Receiver<Observation>,
    metrics: Arc<Metrics>,
) -> Option<watch::Receiver<Option<(sked_agent::pod_cgroups::Instance, sked_proto::PodCpu)>>> {
    if cli.pod_cpu_interval.is_zero() {
        info!("the pods' CPU limits and usage are not read (--pod-cpu-interval 0s)");
        return None;
    }
    let (tx, rx) = watch::channel(None);
    let interval = cli.pod_cpu_interval.max(Duration::from_secs(1));
    tokio::spawn(sked_agent::pod_cgroups::run(cli.cgroup_root.clone(), interval, tx, observed, metrics));
    Some(rx)
}

/// Starts sampling the node's scheduling health, unless `--health-interval` is 0s. Returns the
/// newest samples, for the reports.
fn spawn_health(cli: &Cli, metrics: Arc<Metrics>) -> Option<watch::Receiver<Health>> {
    if cli.health_interval.is_zero() {
        info!("scheduling health is not sampled (--health-interval 0s)");
        return None;
    }
    let (tx, rx) = watch::channel(Health::default());
    let interval = cli.health_interval.max(Duration::from_secs(1));
    tokio::spawn(health::run(interval, cli.proc_root.clone(), cli.sysfs_root.clone(), tx, metrics));
    Some(rx)
}

async fn run(cli: Cli) -> ExitCode {
    let observer = Observer {
        sysfs_root: cli.sysfs_root.clone(),
        proc_root: cli.proc_root.clone(),
        expected_ops: cli.expected_ops.clone().filter(|s| !s.is_empty()),
        links: Default::default(),
        cgroup_ops: Default::default(),
    };
    let metrics = Arc::new(Metrics::new());
    sked_agent::cgroup_ops::warm_up();
    // Say at once what the owner check cannot do, rather than a verdict that looks wrong later.
    let missing = Capabilities::of_self(&cli.proc_root).missing();
    for (capability, cost) in &missing {
        warn!(capability, "the agent lacks {capability}: {cost}");
    }
    metrics.capabilities_missing(&missing);
    let first = observer.observe();
    metrics.observe(&first);
    info!(node = %cli.node_name, scheduler = %cli.scheduler, verdict = first.verdict.as_str(), reason = %first.reason, "sked-agent started");
    let (tx, rx) = watch::channel(first);

    let (exits_tx, exits_rx) = watch::channel(None);
    if !cli.kernel_log.is_empty() {
        match kernel_watch::open_kernel_log(std::path::Path::new(&cli.kernel_log)) {
            Ok(file) => {
                tokio::spawn(kernel_watch::follow_kernel_log(file, exits_tx, metrics.clone()));
            }
            Err(e) => {
                warn!(err = %e, path = %cli.kernel_log, "cannot read the kernel log: the reasons schedulers leave the kernel are not reported (the agent needs /dev/kmsg and CAP_SYSLOG)")
            }
        }
    }
    tokio::spawn(observer.run(tx, exits_rx, metrics.clone(), cli.poll_interval, cli.uevents));
    let sampled = report::Sampled {
        health: spawn_health(&cli, metrics.clone()),
        pods: spawn_pod_cpu(&cli, rx.clone(), metrics.clone()),
    };
    if let Some(address) = cli.controller_address.clone() {
        let cfg = ReporterConfig {
            address,
            replicas: cli.controller_replicas.clone().filter(|r| !r.trim().is_empty()),
            ca_file: cli.ca_file.clone(),
            token_file: cli.token_file.clone(),
            server_name: cli.server_name.clone(),
            heartbeat: cli.heartbeat_interval,
        };
        let id = Identity { node: cli.node_name.clone(), pod: cli.pod_name.clone(), scheduler: cli.scheduler.clone() };
        tokio::spawn(report::run(cfg, id, rx.clone(), sampled, metrics.clone()));
    }

    if !cli.stats_socket.as_os_str().is_empty() {
        let relay = RelayConfig {
            socket: cli.stats_socket.clone(),
            interval: cli.stats_interval.max(Duration::from_secs(1)),
            timeout: stats_relay::TIMEOUT,
            scheduler: cli.scheduler.clone(),
        };
        tokio::spawn(stats_relay::run(relay, rx.clone(), metrics.clone()));
    }

    let listener = match tokio::net::TcpListener::bind(cli.listen_address).await {
        Ok(l) => l,
        Err(e) => {
            error!(err = %e, address = %cli.listen_address, "cannot listen for /readyz and /metrics: choose another --listen-address");
            return ExitCode::FAILURE;
        }
    };
    let shutdown = async {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = term.recv() => {},
            _ = tokio::signal::ctrl_c() => {},
        }
    };
    let app = sked_agent::http::router(rx, metrics, cli.sysfs_root.clone());
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
        error!(err = %e, "HTTP server failed");
        return ExitCode::FAILURE;
    }
    info!("sked-agent stopped");
    ExitCode::SUCCESS
}
