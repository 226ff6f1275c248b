//! Controller metrics (Prometheus text on `/metrics`) and health endpoints.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use prometheus_client::encoding::EncodeLabelSet;

/// A reconcile's `result`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// A failed reconcile's `error` kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabel {
    error: &'static str,
}

/// The Scheduler a series is about.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SchedulerLabel {
    scheduler: String,
}

/// A verdict of the analysis of a bake, for a Scheduler.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerdictLabels {
    scheduler: String,
    verdict: &'static str,
}

/// Why a report stream was refused.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// An image admission decision: who asked, and what was decided.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerificationLabels {
    caller: &'static str,
    outcome: &'static str,
}

/// A TLS port (`reports`, `webhook`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortLabel {
    port: &'static str,
}

/// A TLS connection closed before its handshake: on which port, and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    port: &'static str,
    reason: &'static str,
}

/// Counters of the reports server, kept by it and exported here.
#[derive(Debug, Default)]
pub struct ReportStats {
    pub accepted_streams: Counter,
    pub refused_streams: Counter,
    pub open_streams: AtomicU64,
    pub reports: Counter,
    /// Refused streams by reason.
    refusals: Family<ReasonLabel, Counter>,
    /// TokenReviews sent to the API server (cached results are not counted).
    pub token_reviews: Counter,
}

impl ReportStats {
    /// Counts a refused stream and why.
    pub fn refused(&self, reason: &'static str) {
        self.refused_streams.inc();
        self.refusals.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// Streams refused for `reason` so far.
    pub fn refusals(&self, reason: &'static str) -> u64 {
        self.refusals.get_or_create(&ReasonLabel { reason }).get()
    }
}

/// Every controller metric.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ResultLabel, Counter>,
    reconcile_errors: Family<ErrorLabel, Counter>,
    reconcile_duration: Histogram,
    conflicting_nodes: Family<SchedulerLabel, Gauge>,
    leader: Gauge,
    /// The Schedulers whose last reconcile asked for another after a delay, and their count.
    timed_rechecks: Mutex<HashSet<String>>,
    timed_rechecks_pending: Gauge,
    canaries_running: Gauge,
    rollouts_queued: Gauge,
    agents_connected: Gauge,
    verifications: Family<VerificationLabels, Counter>,
    policy_reloads: Family<ResultLabel, Counter>,
    rollbacks: Family<SchedulerLabel, Counter>,
    analysis_verdicts: Family<VerdictLabels, Counter>,
    tls_connections: Family<PortLabel, Counter>,
    tls_dropped: Family<DropLabels, Counter>,
    report_stats: Arc<ReportStats>,
}

impl Metrics {
    pub fn new(report_stats: Arc<ReportStats>) -> Self {
        let mut registry = Registry::with_prefix("sked");
        let mut m = Self {
            registry: Registry::default(),
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            conflicting_nodes: Family::default(),
            leader: Gauge::default(),
            timed_rechecks: Mutex::default(),
            timed_rechecks_pending: Gauge::default(),
            canaries_running: Gauge::default(),
            rollouts_queued: Gauge::default(),
            agents_connected: Gauge::default(),
            verifications: Family::default(),
            policy_reloads: Family::default(),
            rollbacks: Family::default(),
            analysis_verdicts: Family::default(),
            tls_connections: Family::default(),
            tls_dropped: Family::default(),
            report_stats,
        };
        m.register_reconciles(&mut registry);
        m.register_reports(&mut registry);
        m.register_trust_and_tls(&mut registry);
        m.registry = registry;
        m
    }

    /// Registers the reconciles, their outcome and the leadership.
    fn register_reconciles(&self, registry: &mut Registry) {
        registry.register("reconciles", "Scheduler reconciles by result", self.reconciles.clone());
        registry.register("reconcile_errors", "Failed reconciles by error kind", self.reconcile_errors.clone());
        registry.register("reconcile_duration_seconds", "Time a reconcile took", self.reconcile_duration.clone());
        registry.register(
            "conflicting_nodes",
            "Selected nodes a Scheduler lost to older ones",
            self.conflicting_nodes.clone(),
        );
        registry.register("leader", "1 while this replica holds the leader lease", self.leader.clone());
        registry.register(
            "timed_rechecks_pending",
            "Schedulers whose last reconcile asked to be reconciled again after a delay (a bake, a deadline, a grace); 0 at rest",
            self.timed_rechecks_pending.clone(),
        );
        registry.register(
            "canaries_running",
            "Schedulers whose canary runs now (at most --max-concurrent-canaries start one)",
            self.canaries_running.clone(),
        );
        registry.register(
            "rollouts_queued",
            "Schedulers whose new revision waits for a canary slot (phase Queued)",
            self.rollouts_queued.clone(),
        );
        registry.register(
            "rollbacks",
            "Rollouts stopped because the new revision failed (rolled back, or nothing to roll back to), by Scheduler",
            self.rollbacks.clone(),
        );
        registry.register(
            "rollout_analysis_verdicts",
            "Verdicts of the analysis of a bake (spec.rollout.analysis), by Scheduler and verdict: Passed, Failed (rolled back), Inconclusive (too few samples or no baseline; the rollout went on)",
            self.analysis_verdicts.clone(),
        );
    }

    /// Registers the agents' report streams and their authentication.
    fn register_reports(&self, registry: &mut Registry) {
        let stats = &self.report_stats;
        registry.register(
            "agents_connected",
            "Agent report streams open on this replica",
            self.agents_connected.clone(),
        );
        registry.register(
            "report_streams_accepted",
            "Agent report streams accepted since start",
            stats.accepted_streams.clone(),
        );
        registry.register(
            "report_streams_refused",
            "Agent report streams refused (bad token, wrong node) since start",
            stats.refused_streams.clone(),
        );
        registry.register("reports_received", "Agent reports received since start", stats.reports.clone());
        registry.register(
            "report_refusals",
            "Agent report streams refused, by reason (missing_token, token_rejected, not_agent, not_pod_bound, pod_gone, not_scheduler_pod, wrong_node, wrong_scheduler)",
            stats.refusals.clone(),
        );
        registry.register(
            "token_reviews",
            "TokenReviews the reports server sent to the API server (results are cached by token hash)",
            stats.token_reviews.clone(),
        );
    }

    /// Registers image admissions, trust policy reloads and the TLS ports' connections.
    fn register_trust_and_tls(&self, registry: &mut Registry) {
        registry.register(
            "image_verifications",
            "Image admissions by caller (reconcile, webhook, recheck) and outcome (verified, cached, unsigned_allowed, or the failure kind)",
            self.verifications.clone(),
        );
        registry.register("trust_policy_reloads", "Trust policy file reloads by result", self.policy_reloads.clone());
        registry.register(
            "tls_connections",
            "TCP connections taken on a TLS port (reports, webhook), before their handshake",
            self.tls_connections.clone(),
        );
        registry.register(
            "tls_connections_dropped",
            "Connections closed before they were served, by port and reason (source_limit, silent, incomplete_hello, handshake_failed, handshake_timeout)",
            self.tls_dropped.clone(),
        );
    }

    /// Records one reconcile.
    pub fn reconciled(&self, took: Duration, error: Option<&'static str>) {
        self.reconcile_duration.observe(took.as_secs_f64());
        let result = if error.is_some() { "error" } else { "success" };
        self.reconciles.get_or_create(&ResultLabel { result }).inc();
        if let Some(kind) = error {
            self.reconcile_errors.get_or_create(&ErrorLabel { error: kind }).inc();
        }
    }

    /// Records whether a Scheduler's reconcile asked for another after a delay: a Scheduler at
    /// rest waits for events alone, so the count of those that do not is 0 in an idle fleet.
    pub fn timed_recheck(&self, scheduler: &str, pending: bool) {
        let mut rechecks = crate::mutex::lock(&self.timed_rechecks);
        if pending {
            rechecks.insert(scheduler.to_owned());
        } else {
            rechecks.remove(scheduler);
        }
        self.timed_rechecks_pending.set(i64::try_from(rechecks.len()).unwrap_or(i64::MAX));
    }

    /// Counts a connection taken on a TLS port.
    pub fn tls_connection(&self, port: &'static str) {
        self.tls_connections.get_or_create(&PortLabel { port }).inc();
    }

    /// Counts a connection closed before it was served.
    pub fn tls_connection_dropped(&self, port: &'static str, reason: &'static str) {
        self.tls_dropped.get_or_create(&DropLabels { port, reason }).inc();
    }

    /// Records one image admission decision.
    pub fn verified(&self, caller: &'static str, outcome: &'static str) {
        self.verifications.get_or_create(&VerificationLabels { caller, outcome }).inc();
    }

    pub fn policy_reloaded(&self, ok: bool) {
        let result = if ok { "success" } else { "refused" };
        self.policy_reloads.get_or_create(&ResultLabel { result }).inc();
    }

    pub fn set_conflicting_nodes(&self, scheduler: &str, nodes: usize) {
        let labels = SchedulerLabel { scheduler: scheduler.to_owned() };
        self.conflicting_nodes.get_or_create(&labels).set(i64::try_from(nodes).unwrap_or(i64::MAX));
        // Its rollbacks count from zero before the first, so `increase()` sees the first one.
        self.rollbacks.get_or_create(&labels).inc_by(0);
    }

    pub fn forget_scheduler(&self, scheduler: &str) {
        let labels = SchedulerLabel { scheduler: scheduler.to_owned() };
        self.conflicting_nodes.remove(&labels);
        self.rollbacks.remove(&labels);
        self.timed_recheck(scheduler, false);
    }

    /// Counts a rollout stopped by a failed revision.
    pub fn rolled_back(&self, scheduler: &str) {
        self.rollbacks.get_or_create(&SchedulerLabel { scheduler: scheduler.to_owned() }).inc();
    }

    pub fn analysis_verdict(&self, scheduler: &str, verdict: sked_api::AnalysisVerdict) {
        self.analysis_verdicts
            .get_or_create(&VerdictLabels { scheduler: scheduler.to_owned(), verdict: verdict.as_str() })
            .inc();
    }

    /// How many canaries run, and how many rollouts wait for a slot.
    pub fn set_canaries(&self, (running, queued): (usize, usize)) {
        self.canaries_running.set(i64::try_from(running).unwrap_or(i64::MAX));
        self.rollouts_queued.set(i64::try_from(queued).unwrap_or(i64::MAX));
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let stats = &self.report_stats;
        let get = |c: &std::sync::atomic::AtomicU64| i64::try_from(c.load(Ordering::Relaxed)).unwrap_or(i64::MAX);
        self.agents_connected.set(get(&stats.open_streams));
        let mut out = String::new();
        let _ = encode(&mut out, &self.registry);
        out
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    ready: watch::Receiver<bool>,
}

/// `/metrics`, `/healthz` (the process serves) and `/readyz` (the Scheduler and Node lists are
/// loaded), until `shutdown`.
pub async fn serve(
    address: SocketAddr,
    metrics: Arc<Metrics>,
    ready: watch::Receiver<bool>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route(
            "/metrics",
            get(|State(s): State<AppState>, headers: axum::http::HeaderMap| async move {
                let accept = headers.get(axum::http::header::ACCEPT).and_then(|v| v.to_str().ok());
                let (kind, body) = sked_logging::exposition::negotiate(accept, s.metrics.encode());
                ([(axum::http::header::CONTENT_TYPE, kind)], body)
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(|State(s): State<AppState>| async move {
                if *s.ready.borrow() {
                    (StatusCode::OK, "ready\n")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "loading Schedulers and Nodes\n")
                }
            }),
        )
        .with_state(AppState { metrics, ready });
    let listener = tokio::net::TcpListener::bind(address).await?;
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}
