//! The report streams to the controller: TLS with a CA from a mounted file, the pod's projected
//! service-account token as bearer credential, reconnect with exponential backoff. One stream
//! is held to every controller replica, not only to the leader, so a standby has heard every
//! node before it leads: a failover needs no reconnection and no new authentication.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sked_proto::contract::EVERY_REPLICA_METADATA;
use sked_proto::v1::reports_client::ReportsClient;
use sked_proto::{CgroupOp, CpuContract, Health, KernelExit, KernelState, PodCpu, Report};
use tokio::sync::watch;
use tonic::codegen::http::Uri;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
use tracing::{debug, info, warn};

use crate::metrics::Metrics;
use crate::observation::Observation;
use crate::pod_cgroups::Instance;
use crate::verdict::Verdict;

/// Who is reporting.
#[derive(Clone, Debug)]
pub struct Identity {
    pub node: String,
    pub pod: String,
    pub scheduler: String,
}

/// Where and how to report.
#[derive(Clone, Debug)]
pub struct ReporterConfig {
    /// `https://host:port` of the controller's reports Service: the TLS name of the reports
    /// server (unless `server_name` says another), the port of every replica, and what is
    /// dialled when `replicas` resolves to nothing.
    pub address: String,
    /// Every controller replica to hold a stream to: a name whose DNS records are the replicas
    /// (the chart's headless Service), or a comma-separated list of `host[:port]`. `None`: one
    /// stream, to `address`.
    pub replicas: Option<String>,
    pub ca_file: PathBuf,
    pub token_file: PathBuf,
    /// TLS server name, when it differs from the address's host.
    pub server_name: Option<String>,
    /// A report is sent at least this often, so the controller can tell a live agent from a
    /// silent one.
    pub heartbeat: Duration,
}

use sked_logging::BoxError;

/// What the agent samples beside its observations, as receivers of the newest value (each
/// `None` when the agent does not sample it).
#[derive(Clone, Debug, Default)]
pub struct Sampled {
    /// The node's scheduling health.
    pub health: Option<watch::Receiver<Health>>,
    /// What the pods' cgroups showed over the last window, and the scheduler it was measured
    /// under (`None` before the first).
    pub pods: Option<watch::Receiver<Option<(Instance, PodCpu)>>>,
}

/// The newest of what the agent samples, and the scheduler's last statistics, as a report is
/// built.
#[derive(Clone, Debug, Default)]
pub struct Newest {
    pub health: Option<Health>,
    /// The pods' last window, and the scheduler it was measured under.
    pub pods: Option<(Instance, PodCpu)>,
    /// The scheduler's last scx_stats reply.
    pub stats: Option<String>,
}

impl Sampled {
    fn newest(&self, stats: Option<String>) -> Newest {
        Newest {
            health: self.health.as_ref().map(|h| h.borrow().clone()),
            pods: self.pods.as_ref().and_then(|p| p.borrow().clone()),
            stats,
        }
    }
}

/// Builds the wire report for an observation, with the node's scheduling health when the agent
/// samples it, stamped with the node's clock now, as the report is built
/// ([`Health::sent_unix_ms`]), and the pods' CPU contract.
pub fn to_report(id: &Identity, o: &Observation, sequence: u64, newest: Newest) -> Report {
    let Newest { health, pods, stats } = newest;
    let r = &o.read;
    // What the scheduler said last, only once the kernel ended it (or asked it to restart).
    let ended = o.verdict != Verdict::Attached && o.last_exit.as_ref().is_some_and(|e| e.ejected || e.restart);
    Report {
        node: id.node.clone(),
        pod: id.pod.clone(),
        scheduler: id.scheduler.clone(),
        kernel: Some(KernelState {
            state: o.state_name().to_owned(),
            ops: r.ops.clone().unwrap_or_default(),
            enable_seq: r.enable_seq.unwrap_or(0),
            switch_all: r.switch_all.unwrap_or(false),
            nr_rejected: r.nr_rejected.unwrap_or(0),
            hotplug_seq: r.hotplug_seq.unwrap_or(0),
            events: r.events.clone().into_iter().collect(),
        }),
        verdict: o.verdict as i32,
        reason: o.reason.clone(),
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        sequence,
        last_exit: o.last_exit.as_ref().map(|e| KernelExit {
            ops: e.ops.clone(),
            reason: e.reason.clone(),
            detail: e.detail.clone(),
            time_unix_ms: e.at_ms,
            sequence: e.seq,
            ejected: e.ejected,
            restart: e.restart,
            trace: e.trace.clone(),
        }),
        health: health.map(|h| Health { sent_unix_ms: jiff::Timestamp::now().as_millisecond(), ..h }),
        scheduler_stats: stats.filter(|_| ended).unwrap_or_default(),
        cpu_contract: cpu_contract(o, pods),
    }
}

/// The pods' CPU contract: what the running scheduler is handed, and what the pods got under it.
/// `None` while there is neither (nothing enabled, pods not read).
fn cpu_contract(o: &Observation, pods: Option<(Instance, PodCpu)>) -> Option<CpuContract> {
    use crate::cgroup_ops::Support;
    // Only a window measured under the scheduler this observation sees: right after a switch the
    // last window is the previous scheduler's until the pods' watch starts new ones.
    let pods = pods.filter(|(under, _)| *under == (o.read.enable_seq, o.read.ops.clone())).map(|(_, p)| p);
    let op = |s: Support| match s {
        Support::Implemented => CgroupOp::Implemented,
        Support::Missing => CgroupOp::Missing,
        Support::NotInKernel => CgroupOp::NotInKernel,
    };
    let (limits, requests, ops_unread) = match &o.cgroup_ops {
        Some(Ok(ops)) => (op(ops.limits), op(ops.requests), String::new()),
        Some(Err(why)) => (CgroupOp::Unknown, CgroupOp::Unknown, why.clone()),
        None if pods.is_none() => return None,
        None => (CgroupOp::Unknown, CgroupOp::Unknown, "no sched_ext scheduler is enabled".to_owned()),
    };
    Some(CpuContract { limits: limits as i32, requests: requests as i32, ops_unread, pods })
}

/// First delay before reconnecting; doubles after each stream the controller did not accept.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// Longest delay between reconnects (plus jitter): well inside the controller's default
/// heartbeat grace (10 s), so a leader that has not heard an agent yet (one that reaches the
/// leader alone, after a failover) hears it before it would judge the node silent. A refused
/// connect is cheap.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The delay before the next connect, after `previous`. A stream the controller accepted (it
/// acknowledged a report) proves the path works, so however it ended (a clean close, a replica
/// that went away) the next attempt waits the first delay, not whatever the backoff had grown
/// to.
pub fn reconnect_delay(previous: Duration, accepted: bool) -> Duration {
    if accepted { FIRST_BACKOFF } else { (previous * 2).clamp(FIRST_BACKOFF, MAX_BACKOFF) }
}

/// `delay` plus up to half of it again, so thousands of agents do not reconnect (or resolve)
/// in the same instant.
pub fn jittered(delay: Duration) -> Duration {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    delay + delay.mul_f64(f64::from(nanos % 1000) / 2000.0)
}

/// How often the replicas' name is resolved again (plus jitter): a new replica gets its streams
/// within this. Each resolution is a few DNS queries (the search list, A and AAAA); a fleet of
/// 5,000 agents resolves about 130 to 170 times a second (each 30 to 45 s).
const RESOLVE_EVERY: Duration = Duration::from_secs(30);

/// Where one report stream goes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    /// The reports Service, `--controller-address`: it reaches the leader alone.
    Leader(String),
    /// One controller replica, by address: one of the streams to every replica.
    Replica(SocketAddr),
}

impl Target {
    fn url(&self) -> String {
        match self {
            Target::Leader(address) => address.clone(),
            Target::Replica(address) => format!("https://{address}"),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url())
    }
}

/// Keeps a report stream open to every controller replica until the process ends. Each report
/// carries the newest of what is `sampled` (the health, the pods' CPU), read as the report is
/// built: a new sample does not send a report.
///
/// A replica that resolves no more keeps its stream while the stream lasts (a DNS answer that
/// misses a replica for a moment costs nothing); it is not dialled again once the stream ends.
/// The stream to the reports Service, held while no replica resolves, ends as soon as one does:
/// it reaches the leader, which would otherwise count two streams of this node.
pub async fn run(
    cfg: ReporterConfig,
    id: Identity,
    rx: watch::Receiver<Observation>,
    sampled: Sampled,
    metrics: Arc<Metrics>,
) {
    let cfg = Arc::new(cfg);
    let (wanted_tx, wanted) = watch::channel(BTreeSet::new());
    let Some(replicas) = cfg.replicas.clone() else {
        let target = Target::Leader(cfg.address.clone());
        wanted_tx.send_replace(BTreeSet::from([target.clone()]));
        return keep_stream(cfg.clone(), target, wanted, id, rx, sampled, metrics).await;
    };
    let default_port = cfg.address.parse::<Uri>().ok().and_then(|u| u.port_u16()).unwrap_or(443);
    let entries = replica_entries(&replicas, default_port);
    let mut streams: HashMap<Target, tokio::task::JoinHandle<()>> = HashMap::new();
    loop {
        let chosen = choose_targets(&cfg.address, resolve(&entries).await, &wanted.borrow());
        if chosen != *wanted.borrow() {
            info!(replicas = %replicas, targets = ?chosen, "holding a report stream to each controller replica");
            wanted_tx.send_replace(chosen.clone());
        }
        streams.retain(|target, task| {
            let leader_unwanted = matches!(target, Target::Leader(_)) && !chosen.contains(target);
            if leader_unwanted {
                task.abort();
            }
            !leader_unwanted && !task.is_finished()
        });
        for target in &chosen {
            if !streams.contains_key(target) {
                let task = keep_stream(
                    cfg.clone(),
                    target.clone(),
                    wanted.clone(),
                    id.clone(),
                    rx.clone(),
                    sampled.clone(),
                    metrics.clone(),
                );
                streams.insert(target.clone(), tokio::spawn(task));
            }
        }
        tokio::time::sleep(jittered(RESOLVE_EVERY)).await;
    }
}

/// The `(host, port)` of each entry of a replica list (`host[:port]`, comma-separated; an IPv6
/// address in brackets); an entry without a port takes `default_port`.
pub fn replica_entries(replicas: &str, default_port: u16) -> Vec<(String, u16)> {
    let entry = |e: &str| {
        if let Ok(address) = e.parse::<SocketAddr>() {
            return (address.ip().to_string(), address.port());
        }
        match e.rsplit_once(':') {
            Some((host, port)) if !host.contains(':') => match port.parse() {
                Ok(port) => (host.to_owned(), port),
                Err(_) => (e.to_owned(), default_port),
            },
            _ => (e.trim_start_matches('[').trim_end_matches(']').to_owned(), default_port),
        }
    };
    replicas.split(',').map(str::trim).filter(|e| !e.is_empty()).map(entry).collect()
}

/// Every address the entries resolve to, without repeats. A name that does not resolve now adds
/// nothing.
async fn resolve(entries: &[(String, u16)]) -> Vec<SocketAddr> {
    let mut all = Vec::new();
    for (host, port) in entries {
        match tokio::net::lookup_host((host.as_str(), *port)).await {
            Ok(addresses) => all.extend(addresses),
            Err(e) => debug!(host = %host, err = %e, "resolving the controller replicas"),
        }
    }
    one_family(all)
}

/// The IPv4 addresses when there are any, else all: a dual-stack replica has an address of each
/// family, and two streams to one replica would fill the node's quota there.
pub fn one_family(addresses: Vec<SocketAddr>) -> Vec<SocketAddr> {
    let v4: BTreeSet<SocketAddr> = addresses.iter().copied().filter(SocketAddr::is_ipv4).collect();
    if v4.is_empty() {
        addresses.into_iter().collect::<BTreeSet<_>>().into_iter().collect()
    } else {
        v4.into_iter().collect()
    }
}

/// What to hold streams to: each resolved replica; while none resolves, what was held before
/// (a passing DNS failure closes no stream); and, before any replica ever resolved, the
/// reports Service `address` itself.
pub fn choose_targets(address: &str, resolved: Vec<SocketAddr>, held: &BTreeSet<Target>) -> BTreeSet<Target> {
    if !resolved.is_empty() {
        return resolved.into_iter().map(Target::Replica).collect();
    }
    if !held.is_empty() {
        return held.clone();
    }
    BTreeSet::from([Target::Leader(address.to_owned())])
}

/// Keeps one report stream open to `target`, reconnecting with backoff, while `wanted` names
/// it.
async fn keep_stream(
    cfg: Arc<ReporterConfig>,
    target: Target,
    wanted: watch::Receiver<BTreeSet<Target>>,
    id: Identity,
    rx: watch::Receiver<Observation>,
    sampled: Sampled,
    metrics: Arc<Metrics>,
) {
    let mut delay = Duration::ZERO;
    loop {
        let mut accepted = false;
        match session(&cfg, &target, &id, rx.clone(), sampled.clone(), &metrics, &mut accepted).await {
            Ok(()) => info!(%target, "report stream closed by the controller; reconnecting"),
            Err(e) => {
                metrics.stream_failures.inc();
                warn!(err = %sked_logging::error_chain(e.as_ref()), %target, accepted, "report stream failed");
            }
        }
        if !wanted.borrow().contains(&target) {
            info!(%target, "the controller replica is no longer listed: not reconnecting");
            return;
        }
        delay = reconnect_delay(delay, accepted);
        let wait = jittered(delay);
        debug!(retry_in = ?wait, %target, "reconnecting");
        tokio::time::sleep(wait).await;
    }
}

/// Counts an open stream in the agent's metrics while it lives (however its task ends).
struct OpenStream(Arc<Metrics>);

impl OpenStream {
    fn new(metrics: &Arc<Metrics>) -> Self {
        metrics.stream_opened();
        Self(metrics.clone())
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.stream_closed();
    }
}

/// The name the reports server's certificate must carry: `--server-name`, else the address's
/// host (whichever replica address is dialled).
fn tls_name(cfg: &ReporterConfig) -> Option<String> {
    cfg.server_name.clone().or_else(|| cfg.address.parse::<Uri>().ok()?.host().map(str::to_owned))
}

async fn session(
    cfg: &ReporterConfig,
    target: &Target,
    id: &Identity,
    rx: watch::Receiver<Observation>,
    sampled: Sampled,
    metrics: &Arc<Metrics>,
    accepted: &mut bool,
) -> Result<(), BoxError> {
    let ca = tokio::fs::read(&cfg.ca_file)
        .await
        .map_err(|e| format!("reading the controller CA {}: {e}", cfg.ca_file.display()))?;
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
    if let Some(name) = tls_name(cfg) {
        tls = tls.domain_name(name);
    }
    let channel = Endpoint::from_shared(target.url())?
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(20))
        .connect()
        .await?;
    // Read the token on every connect: the kubelet rotates projected tokens.
    let token = tokio::fs::read_to_string(&cfg.token_file)
        .await
        .map_err(|e| format!("reading the service-account token {}: {e}", cfg.token_file.display()))?;
    let bearer = MetadataValue::try_from(format!("Bearer {}", token.trim()))?;

    let heartbeat = cfg.heartbeat;
    // Sent on a change of the observation or a heartbeat; the samples are read, never waited on.
    let outbound = futures::stream::unfold(
        (
            rx,
            tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat),
            0u64,
            metrics.clone(),
            id.clone(),
            sampled,
        ),
        |(mut rx, mut tick, seq, metrics, id, sampled)| async move {
            if seq > 0 {
                tokio::select! {
                    changed = rx.changed() => changed.ok()?,
                    _ = tick.tick() => {}
                }
            }
            let newest = sampled.newest(metrics.scx_stats.snapshot());
            let report = to_report(&id, &rx.borrow_and_update(), seq + 1, newest);
            metrics.reports_sent.inc();
            Some((report, (rx, tick, seq + 1, metrics, id, sampled)))
        },
    );
    let mut request = tonic::Request::new(outbound);
    request.metadata_mut().insert("authorization", bearer);
    if matches!(target, Target::Replica(_)) {
        // Any replica may keep this stream: this agent holds one to each.
        request.metadata_mut().insert(EVERY_REPLICA_METADATA, MetadataValue::from_static("true"));
    }
    let mut acks = ReportsClient::new(channel).stream(request).await?.into_inner();
    let _open = OpenStream::new(metrics);
    info!(%target, "report stream open");
    while let Some(ack) = acks.message().await? {
        // Accepted once the controller acknowledged a report: a refusal of the first report
        // (a wrong pod or node) comes on this stream, and must keep backing off.
        *accepted = true;
        debug!(sequence = ack.sequence, "report acknowledged");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_carries_the_health_it_is_given() {
        let id = Identity { node: "n1".into(), pod: "p1".into(), scheduler: "s".into() };
        let o = Observation {
            read: crate::sysfs::KernelRead {
                supported: true,
                state: crate::sysfs::SchedState::Disabled,
                ops: None,
                enable_seq: Some(0),
                switch_all: Some(false),
                nr_rejected: Some(0),
                hotplug_seq: Some(1),
                events: Default::default(),
                problems: Vec::new(),
            },
            verdict: crate::verdict::Verdict::NotAttached,
            reason: "no scheduler attached".into(),
            last_exit: None,
            cgroup_ops: None,
        };
        assert_eq!(to_report(&id, &o, 1, Newest::default()).health, None, "the agent does not sample");
        let sample = sked_proto::HealthSample { time_unix_ms: 5, run_delay_us: Some(12.5), ..Default::default() };
        let health = Health {
            samples: vec![sample],
            unavailable: "/proc/pressure/cpu: gone".into(),
            event_names: vec!["SCX_EV_BYPASS_DURATION".into()],
            sent_unix_ms: 0,
        };
        let earliest = jiff::Timestamp::now().as_millisecond();
        let report = to_report(&id, &o, 2, Newest { health: Some(health.clone()), ..Newest::default() });
        let latest = jiff::Timestamp::now().as_millisecond();
        let sent = report.health.as_ref().map_or(0, |h| h.sent_unix_ms);
        assert!((earliest..=latest).contains(&sent), "stamped as it is built: {sent}");
        assert_eq!((report.sequence, report.health), (2, Some(Health { sent_unix_ms: sent, ..health })));
    }

    #[test]
    fn a_report_carries_the_cpu_contract_of_the_running_scheduler_and_the_pods() {
        use crate::cgroup_ops::{CgroupOps, Support};
        let id = Identity { node: "n1".into(), pod: "p1".into(), scheduler: "s".into() };
        let mut o = Observation {
            read: crate::sysfs::read(std::path::Path::new("/nonexistent")),
            verdict: Verdict::Attached,
            reason: String::new(),
            last_exit: None,
            cgroup_ops: None,
        };
        let contract = |o: &Observation, pods: Option<PodCpu>| {
            let under = (o.read.enable_seq, o.read.ops.clone());
            to_report(&id, o, 1, Newest { pods: pods.map(|p| (under, p)), ..Newest::default() }).cpu_contract
        };
        assert_eq!(contract(&o, None), None, "nothing enabled, pods not read: nothing to say");
        let pods_again = || PodCpu { pods: 3, limited: 1, ..PodCpu::default() };
        let pods = pods_again();
        let nothing = contract(&o, Some(pods.clone())).unwrap();
        assert_eq!((nothing.limits, nothing.ops_unread.as_str()), (0, "no sched_ext scheduler is enabled"));
        assert_eq!(nothing.pods, Some(pods.clone()));
        o.cgroup_ops = Some(Ok(CgroupOps { limits: Support::Missing, requests: Support::NotInKernel }));
        let read = contract(&o, Some(pods)).unwrap();
        assert_eq!((read.limits, read.requests), (CgroupOp::Missing as i32, CgroupOp::NotInKernel as i32));
        // A window measured under the scheduler before is not sent with this one's callbacks.
        let before =
            to_report(&id, &o, 1, Newest { pods: Some(((Some(99), None), pods_again())), ..Newest::default() });
        assert_eq!(before.cpu_contract.and_then(|c| c.pods), None, "another scheduler's window");
        o.cgroup_ops = Some(Err("the agent lacks CAP_SYS_ADMIN".into()));
        let unread = contract(&o, None).unwrap();
        assert_eq!((unread.limits, unread.ops_unread.as_str()), (0, "the agent lacks CAP_SYS_ADMIN"));
    }

    #[test]
    fn the_scheduler_s_last_statistics_go_only_with_a_scheduler_the_kernel_ended() {
        let id = Identity { node: "n1".into(), pod: "p1".into(), scheduler: "s".into() };
        let stats = Some(r#"{"nr_running":3}"#.to_owned());
        let exit = |ejected: bool| crate::kmsg::Exit {
            ops: "a".into(),
            reason: if ejected { "runnable task stall" } else { "unregistered from user space" }.into(),
            detail: String::new(),
            at_ms: 1,
            seq: 1,
            ejected,
            restart: false,
            trace: Vec::new(),
        };
        let away = |last_exit| Observation {
            read: crate::sysfs::read(std::path::Path::new("/nonexistent")),
            verdict: Verdict::NotAttached,
            reason: String::new(),
            last_exit,
            cgroup_ops: None,
        };
        let sent = |o: &Observation| {
            to_report(&id, o, 1, Newest { stats: stats.clone(), ..Newest::default() }).scheduler_stats
        };
        assert_eq!(sent(&away(Some(exit(true)))), r#"{"nr_running":3}"#, "ejected: what it said last");
        assert_eq!(sent(&away(Some(exit(false)))), "", "unregistered by its own process: nothing to tell");
        assert_eq!(sent(&away(None)), "");
        assert_eq!(sent(&Observation { verdict: Verdict::Attached, ..away(Some(exit(true))) }), "", "attached again");
    }

    #[test]
    fn an_accepted_stream_resets_the_backoff_however_it_ended() {
        let mut delay = Duration::ZERO;
        for _ in 0..20 {
            delay = reconnect_delay(delay, false);
        }
        assert_eq!(delay, MAX_BACKOFF, "refusals back off up to the cap");
        assert_eq!(reconnect_delay(delay, true), FIRST_BACKOFF, "an accepted stream that failed later");
        assert_eq!(reconnect_delay(Duration::ZERO, false), FIRST_BACKOFF);
        assert_eq!(reconnect_delay(FIRST_BACKOFF, false), FIRST_BACKOFF * 2);
    }

    #[test]
    fn replica_entries_take_the_address_port_unless_they_name_one() {
        assert_eq!(
            replica_entries("sked-reports-replicas.sked-system.svc", 8443),
            [("sked-reports-replicas.sked-system.svc".to_owned(), 8443)]
        );
        assert_eq!(
            replica_entries(" 127.0.0.1:9001, localhost:9002 ,, [::1]:9003, [::1] ,10.0.0.1", 8443),
            [
                ("127.0.0.1".to_owned(), 9001),
                ("localhost".to_owned(), 9002),
                ("::1".to_owned(), 9003),
                ("::1".to_owned(), 8443),
                ("10.0.0.1".to_owned(), 8443),
            ]
        );
        assert!(replica_entries("", 8443).is_empty());
    }

    fn addresses(list: &[&str]) -> Vec<SocketAddr> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn targets_are_the_replicas_else_what_was_held_else_the_service() {
        let service = "https://sked-reports.sked-system.svc:8443";
        let none = BTreeSet::new();
        let leader = Target::Leader(service.to_owned());
        assert_eq!(choose_targets(service, vec![], &none), BTreeSet::from([leader.clone()]));
        assert_eq!(leader.url(), service);
        let held = choose_targets(service, addresses(&["10.0.0.2:8443", "10.0.0.1:8443"]), &none);
        let urls: Vec<String> = held.iter().map(Target::url).collect();
        assert_eq!(urls, ["https://10.0.0.1:8443", "https://10.0.0.2:8443"]);
        assert_eq!(choose_targets(service, vec![], &held), held, "a DNS failure closes no stream");
        let one = choose_targets(service, addresses(&["10.0.0.2:8443"]), &held);
        assert_eq!(one, BTreeSet::from([Target::Replica("10.0.0.2:8443".parse().unwrap())]));
    }

    #[test]
    fn a_dual_stack_replica_gets_one_stream() {
        let both = addresses(&["[fd00::2]:8443", "10.0.0.2:8443", "10.0.0.1:8443", "10.0.0.2:8443"]);
        assert_eq!(one_family(both), addresses(&["10.0.0.1:8443", "10.0.0.2:8443"]));
        let v6 = addresses(&["[fd00::2]:8443", "[fd00::1]:8443"]);
        assert_eq!(one_family(v6), addresses(&["[fd00::1]:8443", "[fd00::2]:8443"]));
    }
}
