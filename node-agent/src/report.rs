//! The report stream to the controller: TLS with a CA from a mounted file, the pod's projected
//! service-account token as bearer credential, reconnect with exponential backoff.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sked_proto::v1::reports_client::ReportsClient;
use sked_proto::{KernelExit, KernelState, Report};
use tokio::sync::watch;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
use tracing::{debug, info, warn};

use crate::metrics::Metrics;
use crate::observation::Observation;

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
    /// `https://host:port` of the controller's reports Service.
    pub address: String,
    pub ca_file: PathBuf,
    pub token_file: PathBuf,
    /// TLS server name, when it differs from the address's host.
    pub server_name: Option<String>,
    /// A report is sent at least this often, so the controller can tell a live agent from a
    /// silent one.
    pub heartbeat: Duration,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Builds the wire report for an observation.
pub fn to_report(id: &Identity, o: &Observation, sequence: u64) -> Report {
    let r = &o.read;
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
        }),
    }
}

/// First delay before reconnecting; doubles after each stream the controller did not accept.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// Longest delay between reconnects (plus jitter): well inside the controller's default
/// heartbeat grace (10 s), so a new leader elected after the old one died hears every agent
/// before it would judge a node silent. Refused connects to a Service with no leader are cheap.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The delay before the next connect, after `previous`. A stream the controller accepted (it
/// acknowledged a report) proves
/// the path works, so however it ended (a clean close, or a leader stepping down with an error)
/// the next attempt waits the first delay: a failover costs that, not whatever the backoff had
/// grown to.
pub fn reconnect_delay(previous: Duration, accepted: bool) -> Duration {
    if accepted { FIRST_BACKOFF } else { (previous * 2).clamp(FIRST_BACKOFF, MAX_BACKOFF) }
}

/// `delay` plus up to half of it again, so thousands of agents that lost the same leader do not
/// reconnect in the same instant.
pub fn jittered(delay: Duration) -> Duration {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    delay + delay.mul_f64(f64::from(nanos % 1000) / 2000.0)
}

/// Keeps a report stream open until the process ends.
pub async fn run(cfg: ReporterConfig, id: Identity, rx: watch::Receiver<Observation>, metrics: Arc<Metrics>) {
    let mut delay = Duration::ZERO;
    loop {
        let mut accepted = false;
        match session(&cfg, &id, rx.clone(), &metrics, &mut accepted).await {
            Ok(()) => info!("report stream closed by the controller; reconnecting"),
            Err(e) => {
                metrics.stream_failures.inc();
                warn!(err = %sked_logging::error_chain(e.as_ref()), address = %cfg.address, accepted, "report stream failed");
            }
        }
        metrics.stream_connected.set(0);
        delay = reconnect_delay(delay, accepted);
        let wait = jittered(delay);
        debug!(retry_in = ?wait, "reconnecting");
        tokio::time::sleep(wait).await;
    }
}

async fn session(
    cfg: &ReporterConfig,
    id: &Identity,
    rx: watch::Receiver<Observation>,
    metrics: &Arc<Metrics>,
    accepted: &mut bool,
) -> Result<(), BoxError> {
    let ca = tokio::fs::read(&cfg.ca_file)
        .await
        .map_err(|e| format!("reading the controller CA {}: {e}", cfg.ca_file.display()))?;
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
    if let Some(name) = &cfg.server_name {
        tls = tls.domain_name(name.clone());
    }
    let channel = Endpoint::from_shared(cfg.address.clone())?
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
    let outbound = futures::stream::unfold(
        (
            rx,
            tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat),
            0u64,
            metrics.clone(),
            id.clone(),
        ),
        |(mut rx, mut tick, seq, metrics, id)| async move {
            if seq > 0 {
                tokio::select! {
                    changed = rx.changed() => changed.ok()?,
                    _ = tick.tick() => {}
                }
            }
            let report = to_report(&id, &rx.borrow_and_update(), seq + 1);
            metrics.reports_sent.inc();
            Some((report, (rx, tick, seq + 1, metrics, id)))
        },
    );
    let mut request = tonic::Request::new(outbound);
    request.metadata_mut().insert("authorization", bearer);
    let mut acks = ReportsClient::new(channel).stream(request).await?.into_inner();
    metrics.stream_connected.set(1);
    info!(address = %cfg.address, "report stream open");
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
}
