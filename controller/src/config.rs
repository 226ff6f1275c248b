//! Command-line flags of `sked-controller`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// The agent image of this release.
pub const DEFAULT_AGENT_IMAGE: &str = concat!("ghcr.io/schedkit/sked-agent:v", env!("CARGO_PKG_VERSION"));

/// Runs sched_ext schedulers on chosen Kubernetes nodes and proves they attached.
#[derive(Debug, Parser)]
#[command(name = "sked-controller", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub controller: ControllerFlags,
    #[command(flatten)]
    pub log: LogFlags,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the CustomResourceDefinitions as YAML (what `crds/` holds).
    Crd,
}

impl ControllerFlags {
    /// Why the Lease timing cannot work, if it cannot: the renew grace must be shorter than the
    /// lease, in the whole seconds a Lease holds (the election library would panic otherwise).
    pub fn lease_timing_error(&self) -> Option<String> {
        let (duration, grace) = (self.leader_election_lease_duration, self.leader_election_renew_grace);
        (grace.as_secs().max(1) >= duration.as_secs().max(2)).then(|| {
            format!(
                "--leader-election-renew-grace ({}) must be shorter than --leader-election-lease-duration ({}) in whole seconds: the leader renews its lease that long before it runs out",
                humantime::format_duration(grace),
                humantime::format_duration(duration)
            )
        })
    }

    /// How the Schedulers' DaemonSets and their agent sidecars are made, by these flags.
    pub fn workload_settings(&self) -> sked_core::workload::WorkloadSettings {
        sked_core::workload::WorkloadSettings {
            namespace: self.workload_namespace.clone(),
            agent: sked_core::workload::AgentSettings {
                image: self.agent_image.clone(),
                service_account: self.agent_service_account.clone(),
                reports_address: self.reports_address.clone(),
                reports_replicas: Some(self.reports_replicas.trim()).filter(|r| !r.is_empty()).map(str::to_owned),
                ca_configmap: self.reports_ca_configmap.clone(),
            },
        }
    }
}

/// Reconciler settings (defaults are those of the reference documentation).
#[derive(Clone, Debug, Args)]
pub struct ControllerFlags {
    /// Namespace that holds the scheduler DaemonSets.
    #[arg(long, default_value = "sked-system", env = "SKED_WORKLOAD_NAMESPACE")]
    pub workload_namespace: String,

    /// Pod Security level the controller sets on the workload namespace (scheduler pods are
    /// privileged). Empty: leave the namespace's labels alone.
    #[arg(long, default_value = "privileged")]
    pub workload_namespace_pod_security: String,

    /// Cap on a single reconcile; a reconcile past it is cancelled and retried.
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub reconcile_timeout: Duration,

    /// Schedulers reconciled at the same time.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_concurrent_reconciles: u16,

    /// Schedulers whose canary may run at the same time; a rollout that would start another
    /// waits in phase Queued until one of them has baked. An upgrade of sked to a new agent
    /// image is a new revision of every Scheduler: this paces it across the fleet. 0: no limit.
    #[arg(long, default_value_t = 1)]
    pub max_concurrent_canaries: usize,

    /// Sustained reconciles per second, across all Schedulers.
    #[arg(long, default_value_t = 5.0, value_parser = parse_positive_f64)]
    pub reconcile_rate_limit_qps: f64,

    /// Reconciles allowed in a burst above the sustained rate.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub reconcile_rate_limit_burst: u32,

    /// First delay before retrying a failed reconcile; doubles on each failure.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub reconcile_retry_base_delay: Duration,

    /// Longest delay between retries of a failed reconcile.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub reconcile_retry_max_delay: Duration,

    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_bind_address: SocketAddr,

    /// Elect a leader on a Lease; only the leader reconciles and writes status.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,

    /// Namespace of the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "sked-system")]
    pub leader_election_namespace: String,

    /// Name of the leader Lease.
    #[arg(long, default_value = "sked-controller")]
    pub leader_election_id: String,

    /// How long a leader's lease stays valid without renewal; a standby takes over after it.
    /// With the default grace the leader renews every 3 s, so a leader that dies is replaced
    /// 7 to 11 s later, for about 25 Lease writes a minute at rest (`make bench`).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub leader_election_lease_duration: Duration,

    /// The leader renews this long before its lease would expire: how long the API server may
    /// fail its renewals before it steps down.
    #[arg(long, default_value = "7s", value_parser = parse_duration)]
    pub leader_election_renew_grace: Duration,

    /// Address of the gRPC reports server agents stream to.
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub reports_bind_address: SocketAddr,

    /// TLS certificate (PEM) of the reports server. Without it and --reports-key-file, the
    /// server is off and KernelAttached reports no node.
    #[arg(long, requires = "reports_key_file")]
    pub reports_cert_file: Option<PathBuf>,

    /// TLS private key (PEM) of the reports server.
    #[arg(long, requires = "reports_cert_file")]
    pub reports_key_file: Option<PathBuf>,

    /// A node whose agent has not reported for this long counts as ReportStale. A new leader
    /// keeps each Scheduler's KernelAttached condition as it found it while nodes without a
    /// report are all it lacks, for this long (at least one heartbeat; up to twice as long while
    /// agents are still reconnecting) or until every node reported. A reports connection that
    /// carries no stream this long is closed.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub report_stale_after: Duration,

    /// How often agents report when nothing changes (their --heartbeat-interval); the shortest a
    /// new leader waits for agents before it judges kernels (see --report-stale-after).
    #[arg(long, default_value = sked_proto::contract::HEARTBEAT_INTERVAL, value_parser = parse_duration)]
    pub agent_heartbeat_interval: Duration,

    /// Service account of the agent pods; only its tokens may report.
    #[arg(long, default_value = "sked-agent")]
    pub agent_service_account: String,

    /// Image of the agent sidecar.
    #[arg(long, default_value = DEFAULT_AGENT_IMAGE)]
    pub agent_image: String,

    /// Address agents dial to reach the reports server.
    #[arg(long, default_value = "https://sked-reports.sked-system.svc:8443")]
    pub reports_address: String,

    /// A name whose DNS records are every controller replica (a headless Service, as the chart
    /// makes), or a comma-separated list of host[:port]: each agent holds a report stream to
    /// every replica, so a standby has heard every node when it takes over. Empty: agents
    /// dial --reports-address alone, and reach only the leader.
    #[arg(long, default_value = "")]
    pub reports_replicas: String,

    /// ConfigMap in the workload namespace holding `ca.crt`, the CA agents trust for the
    /// reports server.
    #[arg(long, default_value = "sked-reports-ca")]
    pub reports_ca_configmap: String,

    /// PEM CA agents should trust for the reports server, published as `ca.crt` of
    /// --reports-ca-configmap by the leader and kept current when the file changes (the chart
    /// passes the `ca.crt` of the mounted reports Secret unless reports.tls.caBundle is given).
    /// Without it the ConfigMap's `ca.crt` is left to whoever manages it.
    #[arg(long)]
    pub reports_ca_file: Option<PathBuf>,

    /// Trust policy file (YAML; the chart mounts it from a ConfigMap). Re-read when it changes.
    /// Without it the built-in default applies: ghcr.io/schedkit images signed by schedkit's
    /// GitHub Actions workflows.
    #[arg(long)]
    pub trust_policy: Option<PathBuf>,

    /// How often the trust policy file is checked for changes.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub trust_policy_poll_interval: Duration,

    /// Sigstore trusted_root.json for keyless signatures (air-gapped clusters, private Sigstore
    /// deployments). Without it, the public-good root is fetched over TUF and cached.
    #[arg(long)]
    pub trusted_root: Option<PathBuf>,

    /// Cache directory of the public-good TUF trust root.
    #[arg(long, default_value = "/var/cache/sked/tuf")]
    pub tuf_cache_dir: PathBuf,

    /// Registries (host:port) spoken to over plain HTTP instead of HTTPS. Comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub insecure_registries: Vec<String>,

    /// Cap on each registry request made to resolve or verify an image.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub registry_timeout: Duration,

    /// How often a Scheduler whose image is a tag is resolved again, so a moved tag is followed
    /// (once its new digest verifies).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub image_recheck_interval: Duration,

    /// Address of the validating admission webhook (HTTPS). Needs --webhook-cert-dir.
    #[arg(long, default_value = "0.0.0.0:9443")]
    pub webhook_bind_address: SocketAddr,

    /// Directory holding the webhook's tls.crt and tls.key (a mounted Secret). Without it the
    /// webhook is off.
    #[arg(long)]
    pub webhook_cert_dir: Option<PathBuf>,
}

impl Default for ControllerFlags {
    /// The settings of `sked-controller` started with no flags: the defaults declared on the
    /// flags above (and the environment variables they read), so there is one source.
    fn default() -> Self {
        #[derive(Parser)]
        struct NoFlags {
            #[command(flatten)]
            flags: ControllerFlags,
        }
        match NoFlags::try_parse_from(["sked-controller"]) {
            Ok(parsed) => parsed.flags,
            // Only a default that does not parse (a bug caught by the unit test below) gets here.
            Err(e) => panic!("the declared flag defaults do not parse: {e}"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Json,
    Text,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    Info,
    Debug,
    Error,
}

/// Logging flags.
#[derive(Clone, Debug, Args)]
pub struct LogFlags {
    /// Newline-delimited JSON (default) or human-readable text.
    #[arg(long, value_enum, default_value_t = LogFormat::Json)]
    pub log_format: LogFormat,
    /// Severity threshold. Conflicts with --log-verbosity when both are given.
    #[arg(long, value_enum, conflicts_with = "log_verbosity")]
    pub log_level: Option<LogLevel>,
    /// Exact verbosity threshold, 0 to 2147483647: 0 is info, N enables debug messages up to
    /// V(N) (sked's lines are V(1) and V(4)).
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=i64::from(i32::MAX)))]
    pub log_verbosity: Option<u32>,
}

/// Parses Go-style durations such as `1m`, `1s`, `1m30s`, `250ms`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration (examples: 30s, 1m, 5m): {e}"))
}

fn parse_positive_f64(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{s:?} must be a positive number")),
    }
}

/// Refuses the retired `--zap-*` flags with the replacement to use. Runs before clap so the
/// message is specific instead of "unexpected argument".
pub fn refuse_legacy_flags<I: AsRef<str>>(args: &[I]) -> Result<(), String> {
    for arg in args.iter().map(AsRef::as_ref) {
        let Some(flag) = arg.strip_prefix("--zap-") else { continue };
        let name = flag.split('=').next().unwrap_or(flag);
        let hint = match name {
            "devel" => "use --log-format=text (and --log-verbosity=1 for its debug threshold), or remove it",
            "log-level" => "use --log-level=info|debug|error or --log-verbosity=N",
            "encoder" => "use --log-format=json|text",
            "stacktrace-level" | "time-encoding" => "remove it: this setting is no longer supported",
            _ => "remove it: --zap-* flags were replaced by --log-format, --log-level and --log-verbosity",
        };
        return Err(format!("flag --zap-{name} is no longer supported: {hint}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("sked-controller").chain(args.iter().copied()))
    }

    #[test]
    fn defaults_match_the_reference() {
        let cli = parse(&[]).unwrap();
        let c = cli.controller;
        assert_eq!(c.workload_namespace, "sked-system");
        assert_eq!(c.reconcile_timeout, Duration::from_secs(60));
        assert_eq!(c.max_concurrent_reconciles, 2);
        assert_eq!(c.reconcile_rate_limit_qps, 5.0);
        assert_eq!(c.reconcile_rate_limit_burst, 10);
        assert_eq!(c.reconcile_retry_base_delay, Duration::from_secs(1));
        assert_eq!(c.reconcile_retry_max_delay, Duration::from_secs(300));
        assert_eq!(cli.log.log_format, LogFormat::Json);
        assert_eq!(cli.log.log_level, None);
        assert_eq!(cli.log.log_verbosity, None);
    }

    #[test]
    fn reports_tls_needs_both_files() {
        assert!(parse(&["--reports-cert-file=/c.pem"]).is_err());
        assert!(parse(&["--reports-cert-file=/c.pem", "--reports-key-file=/k.pem"]).is_ok());
        assert_eq!(parse(&[]).unwrap().controller.report_stale_after, Duration::from_secs(30));
    }

    #[test]
    fn default_is_the_declared_flag_defaults() {
        let defaults = ControllerFlags::default();
        assert_eq!(format!("{defaults:?}"), format!("{:?}", parse(&[]).unwrap().controller));
        assert_eq!(defaults.reconcile_timeout, Duration::from_secs(60));
        assert_eq!(defaults.agent_image, DEFAULT_AGENT_IMAGE);
    }

    #[test]
    fn durations_parse_like_go() {
        let cli = parse(&["--reconcile-timeout", "1m30s", "--reconcile-retry-base-delay=250ms"]).unwrap();
        assert_eq!(cli.controller.reconcile_timeout, Duration::from_secs(90));
        assert_eq!(cli.controller.reconcile_retry_base_delay, Duration::from_millis(250));
        let err = parse(&["--reconcile-timeout", "soon"]).unwrap_err().to_string();
        assert!(err.contains("is not a duration"), "{err}");
    }

    #[test]
    fn level_and_verbosity_together_are_refused() {
        let err = parse(&["--log-level=info", "--log-verbosity=2"]).unwrap_err().to_string();
        assert!(err.contains("--log-verbosity"), "{err}");
        assert!(parse(&["--log-verbosity=2"]).is_ok());
        assert!(parse(&["--log-verbosity=2147483647"]).is_ok(), "the reference's largest threshold");
        let err = parse(&["--log-verbosity=2147483648"]).unwrap_err().to_string();
        assert!(err.contains("2147483648") && err.contains("0..=2147483647"), "{err}");
        assert!(parse(&["--log-verbosity=-1"]).is_err());
    }

    #[test]
    fn a_renew_grace_not_shorter_than_the_lease_is_refused_by_name() {
        assert_eq!(parse(&[]).unwrap().controller.lease_timing_error(), None, "the defaults work");
        let short = parse(&["--leader-election-lease-duration=3s", "--leader-election-renew-grace=2s"]).unwrap();
        assert_eq!(short.controller.lease_timing_error(), None);
        for (duration, grace) in [("10s", "10s"), ("5s", "7s"), ("2s", "2s"), ("3s", "3500ms")] {
            let cli = parse(&[
                &format!("--leader-election-lease-duration={duration}"),
                &format!("--leader-election-renew-grace={grace}"),
            ])
            .unwrap();
            let error = cli.controller.lease_timing_error().unwrap_or_default();
            assert!(
                error.contains("--leader-election-renew-grace") && error.contains("--leader-election-lease-duration"),
                "{duration}/{grace}: {error}"
            );
        }
    }

    #[test]
    fn zero_concurrency_and_rates_are_refused() {
        assert!(parse(&["--max-concurrent-reconciles=0"]).is_err());
        assert!(parse(&["--reconcile-rate-limit-qps=0"]).is_err());
        assert!(parse(&["--reconcile-rate-limit-burst=0"]).is_err());
    }

    #[test]
    fn zap_flags_name_their_replacement() {
        let err = refuse_legacy_flags(&["--zap-devel=true"]).unwrap_err();
        assert!(err.contains("--zap-devel") && err.contains("--log-format=text"), "{err}");
        let err = refuse_legacy_flags(&["--zap-encoder", "console"]).unwrap_err();
        assert!(err.contains("--log-format"), "{err}");
        assert!(refuse_legacy_flags(&["--log-format=text"]).is_ok());
    }
}
