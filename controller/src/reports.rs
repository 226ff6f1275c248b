//! The gRPC service agents stream their kernel reports to.
//!
//! A report proves one pod on one node. A stream is accepted only when the caller's bearer token,
//! checked with a TokenReview for the `sked-reports` audience, belongs to the agent service
//! account and is bound to a live pod that a Scheduler's DaemonSet controls and that runs on a
//! node; every report on it must name that node, that pod and that Scheduler. Anything else is
//! refused with a [`Refusal`], logged and counted by reason.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::Stream;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};
use sked_proto::contract::{EVERY_REPLICA_METADATA, REPORTS_AUDIENCE};
use sked_proto::text::{MAX_EXIT_REASON_CHARS, MAX_NAME_CHARS, MAX_REASON_CHARS, escape_and_cap};
use sked_proto::v1::reports_server::{Reports, ReportsServer};
use sked_proto::{Ack, Report};
use tokio::sync::mpsc;
use tonic::transport::Server;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, warn};

use crate::api::KernelExit;
use crate::connections::{Connection, Guarded, OpenStream};
use crate::error::BoxError;
use crate::handshake_gate::{Dropped, HANDSHAKE_AFTER_HELLO, HandshakeGate};
use crate::index::Index;
use crate::kernel_table::{KernelTable, NodeReport};
use crate::metrics::ReportStats;
use crate::mutex::lock;
use crate::reviews::{Review, ReviewCache};
use crate::tls::ReloadingCert;
use sked_core::cpu_contract::NodeCpuContract;
use sked_core::pods::SchedulerPod;

/// The reports service (cheap to clone: the state is shared).
#[derive(Clone)]
pub struct ReportsService(Arc<Inner>);

/// State of the reports service.
pub struct Inner {
    client: Client,
    /// `system:serviceaccount:<namespace>:<agent service account>`.
    agent_user: String,
    agent_namespace: String,
    table: Arc<KernelTable>,
    stale_after: Duration,
    triggers: crate::triggers::Triggers,
    pub stats: Arc<ReportStats>,
    /// Whether this replica leads. Every replica keeps the streams of agents that hold one to
    /// each replica ([`EVERY_REPLICA_METADATA`]); the stream of an agent that reaches the leader
    /// alone is refused by a standby and closed when leadership moves, so it finds the leader.
    leader: tokio::sync::watch::Receiver<bool>,
    /// Set when the server stops: every stream ends, those of agents that reach every replica
    /// too (nothing else would end them), so the graceful shutdown does not wait on them.
    closing: tokio::sync::watch::Sender<bool>,
    /// TokenReview results by token hash.
    reviews: ReviewCache,
    /// TokenReviews in flight: a reconnect storm of a whole fleet queues here rather than
    /// opening a connection to the API server per agent.
    reviewing: tokio::sync::Semaphore,
    /// Open streams per node.
    streams: std::sync::Mutex<HashMap<String, usize>>,
    /// The controller's index: pods and DaemonSets are read from its stores, and fetched from
    /// the API server only when the store has no matching copy (a pod newer than the watch).
    index: std::sync::OnceLock<Index>,
}

/// Open report streams one node may hold (a reconnect may overlap the stream it replaces).
pub const MAX_STREAMS_PER_NODE: usize = 2;
/// Open report streams in total (one per node, with room).
pub const MAX_STREAMS: usize = 20_000;
/// Largest report accepted, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// TokenReviews asked of the API server at once.
pub const MAX_REVIEWS_IN_FLIGHT: usize = 64;
/// TLS handshakes in progress at once.
pub const MAX_HANDSHAKES: usize = 256;
/// Connections held at once (past it, new ones wait in the listen queue); one that carries no
/// stream for `--report-stale-after` is closed.
pub const MAX_CONNECTIONS: usize = MAX_STREAMS;
/// Streams one connection may carry at once (an agent needs one).
pub const MAX_STREAMS_PER_CONNECTION: u32 = 4;
/// HTTP/2 flow-control windows of a connection and of each stream: what an agent may send ahead
/// of what the server has read (room for two of the largest reports), so a stream that is not
/// read costs at most this much buffered.
const WINDOW_BYTES: u32 = 2 * MAX_MESSAGE_BYTES as u32;

/// One open stream of a node, counted while it lives.
struct StreamSlot {
    service: Arc<Inner>,
    node: String,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut streams = lock(&self.service.streams);
        if let Some(n) = streams.get_mut(&self.node) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                streams.remove(&self.node);
            }
        }
        self.service.stats.open_streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Who may report, and how long a report stays fresh.
#[derive(Clone, Debug)]
pub struct ReportsSettings {
    /// The namespace of the scheduler pods, whose agents report.
    pub agent_namespace: String,
    /// The only service account whose tokens may report (`--agent-service-account`).
    pub agent_service_account: String,
    /// `--report-stale-after`.
    pub stale_after: Duration,
}

impl ReportsService {
    pub fn new(
        client: Client,
        settings: &ReportsSettings,
        table: Arc<KernelTable>,
        triggers: crate::triggers::Triggers,
        stats: Arc<ReportStats>,
        leader: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        let ReportsSettings { agent_namespace, agent_service_account, stale_after } = settings;
        Self(Arc::new(Inner {
            client,
            agent_user: format!("system:serviceaccount:{agent_namespace}:{agent_service_account}"),
            agent_namespace: agent_namespace.clone(),
            table,
            stale_after: *stale_after,
            triggers,
            stats,
            leader,
            closing: tokio::sync::watch::Sender::new(false),
            reviews: ReviewCache::default(),
            reviewing: tokio::sync::Semaphore::new(MAX_REVIEWS_IN_FLIGHT),
            streams: std::sync::Mutex::new(HashMap::new()),
            index: std::sync::OnceLock::new(),
        }))
    }

    /// Reads pods and DaemonSets from `index` first: a reconnect storm of a whole fleet then
    /// costs no API reads beyond the TokenReviews of tokens not seen before.
    pub(crate) fn with_index(self, index: Index) -> Self {
        let _ = self.0.index.set(index); // a service is given one index, when it is built
        self
    }
}

/// Why a report stream was refused: the `reason` label of `sked_report_refusals_total`, and
/// what the agent logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No bearer token.
    MissingToken,
    /// The API server did not authenticate the token for the reports audience (expired, for
    /// another audience, or bound to an object that is gone).
    TokenRejected,
    /// The token is not the agent service account's.
    NotAgent,
    /// The token is not bound to a pod (a plain or node-bound token).
    NotPodBound,
    /// The pod the token is bound to is gone, replaced, or not on a node.
    PodGone,
    /// The pod is not a scheduler pod of a Scheduler's DaemonSet.
    NotSchedulerPod,
    /// A report for another node than the pod's.
    WrongNode,
    /// A report for another Scheduler or pod than the token's.
    WrongScheduler,
    /// The node already holds [`MAX_STREAMS_PER_NODE`] streams, or the server [`MAX_STREAMS`].
    TooManyStreams,
}

impl Refusal {
    pub const ALL: [Refusal; 9] = [
        Refusal::MissingToken,
        Refusal::TokenRejected,
        Refusal::NotAgent,
        Refusal::NotPodBound,
        Refusal::PodGone,
        Refusal::NotSchedulerPod,
        Refusal::WrongNode,
        Refusal::WrongScheduler,
        Refusal::TooManyStreams,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::MissingToken => "missing_token",
            Refusal::TokenRejected => "token_rejected",
            Refusal::NotAgent => "not_agent",
            Refusal::NotPodBound => "not_pod_bound",
            Refusal::PodGone => "pod_gone",
            Refusal::NotSchedulerPod => "not_scheduler_pod",
            Refusal::WrongNode => "wrong_node",
            Refusal::WrongScheduler => "wrong_scheduler",
            Refusal::TooManyStreams => "too_many_streams",
        }
    }
}

/// Who is reporting: one pod on one node, of one Scheduler. A stream may report for nothing else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub node: String,
    pub pod: String,
    /// The UID of the pod its token is bound to.
    pub pod_uid: String,
    /// When that pod was created (seconds since the epoch).
    pub pod_created: Option<i64>,
    pub scheduler: String,
}

impl Caller {
    /// Whether `report` speaks only for this caller.
    fn check(&self, report: &Report) -> Result<(), (Refusal, String)> {
        // The report's names are the node's words: escaped and capped before any message.
        let said = |text: &str| escape_and_cap(text, MAX_NAME_CHARS);
        if report.node != self.node {
            return Err((
                Refusal::WrongNode,
                format!(
                    "this token is bound to a pod on node {}; it cannot report for node \"{}\"",
                    self.node,
                    said(&report.node)
                ),
            ));
        }
        if report.scheduler != self.scheduler || report.pod != self.pod {
            return Err((
                Refusal::WrongScheduler,
                format!(
                    "this token is bound to pod {} of Scheduler {}; it cannot report for pod \"{}\" of Scheduler \"{}\"",
                    self.pod,
                    self.scheduler,
                    said(&report.pod),
                    said(&report.scheduler)
                ),
            ));
        }
        Ok(())
    }
}

impl Inner {
    /// What the index knows of the object `name` of the agent namespace (`indexed`) when it
    /// `matches`, else what a read from the API server tells (`of` the object read): the index
    /// may lag an object just made.
    async fn lookup<K, T>(
        &self,
        indexed: Option<Arc<T>>,
        name: &str,
        kind: &str,
        of: impl Fn(K) -> T,
        matches: impl Fn(&T) -> bool,
    ) -> Result<Option<Arc<T>>, Status>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        if let Some(known) = indexed.filter(|o| matches(o)) {
            return Ok(Some(known));
        }
        let read = Api::<K>::namespaced(self.client.clone(), &self.agent_namespace)
            .get_opt(name)
            .await
            .map_err(|e| Status::unavailable(format!("cannot look up {kind} {name}: {e}")))?;
        Ok(read.map(of).filter(|o| matches(o)).map(Arc::new))
    }

    /// Counts a new stream of `node`, unless the node or the server is at its limit.
    fn open_slot(self: &Arc<Self>, node: &str) -> Result<StreamSlot, Status> {
        let mut streams = lock(&self.streams);
        let total = usize::try_from(self.stats.open_streams.load(Ordering::Relaxed)).unwrap_or(usize::MAX);
        let of_node = streams.get(node).copied().unwrap_or(0);
        if of_node >= MAX_STREAMS_PER_NODE || total >= MAX_STREAMS {
            drop(streams);
            return Err(self.refuse(
                Refusal::TooManyStreams,
                Status::resource_exhausted(format!(
                    "node {node} has {of_node} open report streams (at most {MAX_STREAMS_PER_NODE}; {total} of {MAX_STREAMS} in all); close one, or wait for a dead one to time out"
                )),
            ));
        }
        *streams.entry(node.to_owned()).or_insert(0) += 1;
        self.stats.open_streams.fetch_add(1, Ordering::Relaxed);
        Ok(StreamSlot { service: Arc::clone(self), node: node.to_owned() })
    }

    fn refuse(&self, refusal: Refusal, status: Status) -> Status {
        self.stats.refused(refusal.as_str());
        warn!(code = ?status.code(), reason = refusal.as_str(), err = %status.message(), "refused a report stream");
        Status::new(status.code(), format!("{}: {}", refusal.as_str(), status.message()))
    }

    /// Checks the token: the agent service account's, for the reports audience, bound to a live
    /// pod of a Scheduler's DaemonSet on a node. Returns who that pod is.
    async fn authenticate(&self, token: &str) -> Result<Caller, Status> {
        if let Some(review) = self.reviews.get(token, Instant::now()) {
            return self.caller_of(review).await;
        }
        let turn = self
            .reviewing
            .acquire()
            .await
            .map_err(|_| Status::unavailable("the reports server is shutting down; reconnect"))?;
        // Another stream of the same token may have been reviewed while this one waited.
        if let Some(review) = self.reviews.get(token, Instant::now()) {
            return self.caller_of(review).await;
        }
        let request = TokenReview {
            metadata: Default::default(),
            spec: TokenReviewSpec { token: token.to_owned(), audiences: Some(vec![REPORTS_AUDIENCE.to_owned()]) },
            status: None,
        };
        let now = Instant::now();
        self.stats.token_reviews.inc();
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &request)
            .await
            .map_err(|e| Status::unavailable(format!("cannot check the token with the API server: {e}")))?;
        let review = Review::of(reviewed.status.unwrap_or_default(), REPORTS_AUDIENCE);
        self.reviews.put(token, &review, now, jiff::Timestamp::now().as_second());
        drop(turn);
        self.caller_of(review).await
    }

    /// Who a token's review says is calling: the agent service account's pod of a Scheduler's
    /// DaemonSet on a node, or a refusal that says why not.
    async fn caller_of(&self, review: Review) -> Result<Caller, Status> {
        if !review.authenticated || !review.for_audience {
            let why = review.error.unwrap_or_else(|| format!("not valid for the audience {REPORTS_AUDIENCE}"));
            return Err(self.refuse(
                Refusal::TokenRejected,
                Status::unauthenticated(format!(
                    "the API server refused the token for audience {REPORTS_AUDIENCE}: {why}"
                )),
            ));
        }
        if review.username != self.agent_user {
            return Err(self.refuse(
                Refusal::NotAgent,
                Status::permission_denied(format!(
                    "token belongs to {}, not to the agent service account {}",
                    review.username, self.agent_user
                )),
            ));
        }
        let (Some(pod_name), Some(pod_uid)) = (review.pod_name, review.pod_uid) else {
            return Err(self.refuse(
                Refusal::NotPodBound,
                Status::permission_denied("token is not bound to a pod: use the projected token of the scheduler pod"),
            ));
        };
        let live = |p: &SchedulerPod| p.uid == pod_uid && !p.is_terminating();
        let indexed = self.index.get().and_then(|i| i.pod(&pod_name));
        let pod = self.lookup(indexed, &pod_name, "pod", |p: Pod| SchedulerPod::of(&p), live).await?;
        let Some(pod) = pod else {
            return Err(self.refuse(
                Refusal::PodGone,
                Status::permission_denied(format!("the pod {pod_name} the token is bound to is gone")),
            ));
        };
        let Some(node) = pod.node.clone() else {
            return Err(self.refuse(
                Refusal::PodGone,
                Status::permission_denied(format!("the pod {pod_name} the token is bound to is not on a node")),
            ));
        };
        // A token that also names a node must name the pod's.
        if review.node_name.is_some_and(|n| n != node) {
            return Err(self.refuse(
                Refusal::WrongNode,
                Status::permission_denied(format!("the token names another node than pod {pod_name}'s ({node})")),
            ));
        }
        let not_scheduler_pod = || {
            self.refuse(
                Refusal::NotSchedulerPod,
                Status::permission_denied(format!(
                    "pod {pod_name} is not a scheduler pod: only the agent in a Scheduler's DaemonSet pod may report"
                )),
            )
        };
        let Some((scheduler, owner_uid)) = pod.daemonset.clone() else {
            return Err(not_scheduler_pod());
        };
        // The owner reference must be the DaemonSet sked runs for that Scheduler, not a name.
        let owner = |ds: &DaemonSet| ds.metadata.uid.as_deref() == Some(owner_uid.as_str());
        let indexed = self.index.get().and_then(|i| i.daemonset(&scheduler, &self.agent_namespace));
        let daemonset = self.lookup(indexed, &scheduler, "DaemonSet", |ds: DaemonSet| ds, owner).await?;
        let ours = daemonset.is_some_and(|ds| {
            ds.metadata.uid.as_deref() == Some(owner_uid.as_str())
                && ds
                    .owner_references()
                    .iter()
                    .any(|o| o.controller == Some(true) && o.kind == "Scheduler" && o.name == scheduler)
        });
        if !ours {
            return Err(not_scheduler_pod());
        }
        Ok(Caller { node, pod: pod_name, pod_uid, pod_created: pod.created, scheduler })
    }
}

type AckStream = Pin<Box<dyn Stream<Item = Result<Ack, Status>> + Send>>;

#[tonic::async_trait]
impl Reports for ReportsService {
    type StreamStream = AckStream;

    /// A standby takes the reports of agents that hold a stream to every replica: its kernel
    /// table stays current, so the replica that takes over needs no agent to reconnect before
    /// it can judge a node. Only the leader's reconciles write what the table says.
    async fn stream(&self, request: Request<Streaming<Report>>) -> Result<Response<AckStream>, Status> {
        let every_replica = request.metadata().contains_key(EVERY_REPLICA_METADATA);
        if !every_replica && !*self.0.leader.borrow() {
            return Err(Status::unavailable(
                "this controller replica is not the leader; reconnect to reach the leader",
            ));
        }
        let token = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_owned)
            .ok_or_else(|| self.0.refuse(Refusal::MissingToken, Status::unauthenticated("missing bearer token")))?;
        // Counted on its connection while it lives: a connection without streams is closed.
        let on_connection = request.extensions().get::<Connection>().map(Connection::stream);
        let caller = self.0.authenticate(&token).await?;
        let slot = self.0.open_slot(&caller.node)?;
        self.0.stats.accepted_streams.inc();
        info!(node = %caller.node, pod = %caller.pod, scheduler = %caller.scheduler, every_replica, "report stream accepted");
        // The stream is read as its acks are asked for, in the task that serves it: one task
        // per stream, not two tasks and a channel between them.
        let session = Session {
            inbound: request.into_inner(),
            caller,
            follows_leader: !every_replica,
            service: Arc::clone(&self.0),
            _slot: slot,
            _on_connection: on_connection,
        };
        let acks = futures::stream::unfold(Some(session), |session| async move {
            let mut session = session?;
            match session.next_ack().await {
                Ok(ack) => Some((Ok(ack), Some(session))),
                Err(Some(status)) => Some((Err(status), None)),
                Err(None) => None,
            }
        });
        Ok(Response::new(Box::pin(acks)))
    }
}

/// One accepted report stream, read report by report as its acks are sent.
struct Session {
    inbound: Streaming<Report>,
    caller: Caller,
    /// The agent reaches the leader alone: the stream ends when this replica stops leading.
    follows_leader: bool,
    service: Arc<Inner>,
    _slot: StreamSlot,
    _on_connection: Option<OpenStream>,
}

impl Session {
    /// Reads and records the next report, and returns its ack; or ends the stream: `Err(None)`
    /// when the agent closed it, else with the status that says why.
    async fn next_ack(&mut self) -> Result<Ack, Option<Status>> {
        let (service, node) = (&self.service, &self.caller.node);
        let idle = service.stale_after;
        let (mut leader, follows_leader) = (service.leader.clone(), self.follows_leader);
        let lost_leadership = async move {
            if follows_leader {
                let _ = leader.wait_for(|leading| !*leading).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let mut closing = service.closing.subscribe();
        let next = tokio::select! {
            next = tokio::time::timeout(idle, self.inbound.message()) => match next {
                Ok(next) => next,
                Err(_) => {
                    info!(node = %node, ?idle, "no report within the stale limit: closing the report stream");
                    return Err(Some(Status::deadline_exceeded("no report within the stale limit; reconnect")));
                }
            },
            () = lost_leadership => {
                info!(node = %node, "lost leadership: closing the report stream of an agent that reaches the leader alone");
                return Err(Some(Status::unavailable("leadership moved to another replica; reconnect")));
            }
            _ = closing.wait_for(|closing| *closing) => {
                debug!(node = %node, "the reports server stops: closing the report stream");
                return Err(Some(Status::unavailable("this controller replica is stopping; reconnect")));
            }
        };
        let report = match next {
            Ok(Some(r)) => r,
            Ok(None) => return Err(None),
            Err(e) => {
                // A broken connection, or a report past the size limit: say why.
                debug!(node = %node, code = ?e.code(), err = %e.message(), "report stream ended");
                return Err(Some(e));
            }
        };
        if let Err((refusal, why)) = self.caller.check(&report) {
            return Err(Some(service.refuse(refusal, Status::permission_denied(why))));
        }
        service.stats.reports.inc();
        // Kept only for the nodes of Schedulers that ask for analysis: a fleet that does not
        // use it spends no memory on it.
        let analysed = service.index.get().is_none_or(|i| i.analysed(&report.scheduler));
        let now_ms = jiff::Timestamp::now().as_millisecond();
        if let Some(health) = report.health.as_ref().filter(|_| analysed) {
            service.table.health.record(node, health, now_ms);
        }
        let entry = node_report(&report, Instant::now())
            .from_pod(&self.caller.pod_uid)
            .created_at(self.caller.pod_created)
            .leaving(
                service
                    .index
                    .get()
                    .and_then(|i| i.pod(&self.caller.pod))
                    .is_some_and(|p| p.uid == self.caller.pod_uid && p.is_terminating()),
            )
            .from_every_replica(!self.follows_leader);
        // The node's contract history, for the analysis: not from a pod on its way out.
        if let Some(contract) = entry.cpu_contract.as_ref().filter(|_| analysed && !entry.leaving) {
            service.table.health.record_contract(node, contract, now_ms);
        }
        for scheduler in service.table.record(node, entry, service.stale_after) {
            debug!(node = %node, scheduler = %scheduler, verdict = kernel_verdict(report.verdict).as_str(), "kernel view changed");
            service.triggers.send(&scheduler);
        }
        Ok(Ack { sequence: report.sequence })
    }
}

/// The verdict of a report's wire value, in sked's own terms: an unspecified verdict, or one a
/// newer agent knows and this build does not, is not attached.
fn kernel_verdict(wire: i32) -> sked_api::verdict::Verdict {
    use sked_api::verdict::Verdict;
    match sked_proto::Verdict::from_wire(wire) {
        sked_proto::Verdict::Attached => Verdict::Attached,
        sked_proto::Verdict::ForeignScheduler => Verdict::ForeignScheduler,
        sked_proto::Verdict::KernelUnsupported => Verdict::KernelUnsupported,
        sked_proto::Verdict::NotAttached | sked_proto::Verdict::Unspecified => Verdict::NotAttached,
    }
}

/// What the table keeps of a report: the node's words escaped and capped, so no raw byte from a
/// node reaches a status, an event or a log line.
fn node_report(report: &Report, received: Instant) -> NodeReport {
    let stats = (!report.scheduler_stats.is_empty())
        .then(|| escape_and_cap(&report.scheduler_stats, sked_proto::text::MAX_SCHEDULER_STATS_CHARS));
    let arrived = NodeReport::arrived(
        report.scheduler.clone(),
        report.pod.clone(),
        kernel_verdict(report.verdict),
        escape_and_cap(&report.reason, MAX_REASON_CHARS),
        report.kernel.as_ref().map(|k| escape_and_cap(&k.ops, MAX_NAME_CHARS)).unwrap_or_default(),
        received,
        report.last_exit.as_ref().and_then(|e| kernel_exit(&report.node, e)),
    );
    NodeReport {
        scheduler_stats: stats,
        cpu_contract: report
            .cpu_contract
            .as_ref()
            .map(|c| NodeCpuContract::from_wire(c).under(report.kernel.as_ref().map_or(0, |k| k.enable_seq))),
        ..arrived
    }
}

/// The node's exit, escaped and capped; `None` when its time is not a time.
fn kernel_exit(node: &str, e: &sked_proto::KernelExit) -> Option<KernelExit> {
    let time = jiff::Timestamp::from_millisecond(e.time_unix_ms).ok()?;
    let restart = e.restart || e.reason == sked_proto::text::RESTART_EXIT_REASON;
    Some(KernelExit {
        node: node.to_owned(),
        ops: escape_and_cap(&e.ops, MAX_NAME_CHARS),
        reason: escape_and_cap(&e.reason, MAX_EXIT_REASON_CHARS),
        detail: escape_and_cap(&e.detail, MAX_REASON_CHARS),
        time: format!("{time:.3}"),
        // An agent of the release before `restart` sends the kernel's reason alone.
        ejected: e.ejected && !restart,
        restart,
        trace: e
            .trace
            .iter()
            .take(sked_proto::text::MAX_TRACE_LINES)
            .map(|l| escape_and_cap(l, sked_proto::text::MAX_TRACE_LINE_CHARS))
            .collect(),
    })
}

/// Turns silent nodes' reports stale as their time comes, and triggers only the Scheduler of each
/// (a per-node timer, checked every second), so no Scheduler is re-read on a schedule. Once a
/// minute, the stale reports of nodes the index no longer knows are dropped.
pub(crate) async fn expire_stale_reports(
    kernel: Arc<KernelTable>,
    index: Index,
    triggers: crate::triggers::Triggers,
    stale_after: Duration,
) {
    let mut expire = tokio::time::interval(Duration::from_secs(1));
    expire.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut prune = tokio::time::interval(Duration::from_secs(60));
    prune.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = expire.tick() => {
                for scheduler in kernel.expire(Instant::now(), stale_after) {
                    triggers.send(&scheduler);
                }
            }
            _ = prune.tick() => {
                let gone = kernel.forget_unknown(|node| index.knows_node(node));
                if gone > 0 {
                    debug!(nodes = gone, "forgot the stale reports of deleted nodes");
                }
            }
        }
    }
}

/// Connections the kernel queues for the reports server before it accepts them (capped by
/// `net.core.somaxconn`): room for a fleet's reconnect burst.
const LISTEN_BACKLOG: u32 = 4096;

/// A listening socket on `address` with a listen queue of `LISTEN_BACKLOG`.
fn listen(address: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if address.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Serves the reports service over TLS until `shutdown` resolves; every connection passes `gate`
/// before its handshake.
pub async fn serve(
    service: ReportsService,
    address: SocketAddr,
    tls: Arc<ReloadingCert>,
    gate: Arc<HandshakeGate>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), BoxError> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config(&[b"h2"])?);
    let listener = listen(address)
        .map_err(|e| format!("binding the reports server to {address} (--reports-bind-address): {e}"))?;
    let idle_after = service.0.stale_after;
    // Handshakes run concurrently, so a slow or silent client does not hold up the others; the
    // certificate is whatever `tls` holds at the time of each handshake.
    type Incoming = Guarded<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>;
    let (tx, rx) = mpsc::channel::<std::io::Result<Incoming>>(64);
    let places = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    // The accept loop and its handshakes end with this function, however it ends (a dropped
    // future too: a JoinSet aborts its tasks on drop), so the port is free once it returns.
    let mut accept = tokio::task::JoinSet::new();
    accept.spawn(async move {
        loop {
            // Bounded connections: past the limit, new ones wait in the listen queue. Below it a
            // connection is taken at once and waits for its handshake turn here, in order: a
            // whole fleet reconnecting after a failover does not overflow the listen queue,
            // where a dropped SYN is retried only after seconds.
            let Ok(place) = places.clone().acquire_owned().await else { return };
            let tcp = match listener.accept().await {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    warn!(err = %e, "accepting a reports connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (acceptor, tx, handshakes, gate) = (acceptor.clone(), tx.clone(), handshakes.clone(), gate.clone());
            tokio::spawn(async move {
                // Silent peers, peers that stall inside their ClientHello and a flood from one
                // address stop here, before a handshake slot.
                let Ok(pending) = gate.admit(&tcp).await else { return };
                let Ok(_permit) = handshakes.acquire_owned().await else { return };
                match tokio::time::timeout(HANDSHAKE_AFTER_HELLO, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        drop(pending);
                        let _ = tx.send(Ok(Guarded::new(stream, idle_after, place))).await;
                    }
                    Ok(Err(e)) => {
                        debug!(err = %e, "reports TLS handshake failed");
                        gate.dropped(Dropped::HandshakeFailed, pending.source());
                    }
                    Err(_) => {
                        gate.dropped(Dropped::HandshakeTimeout, pending.source());
                    }
                }
            });
        }
    });
    let incoming = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
    // No HTTP/2 keep-alive of the server's own: agents ping every 20 s, a stream without a
    // report for the stale limit is ended, and a connection without a stream is closed after it
    // (`Guarded`). A ping timer per connection would wake the server 167 times a second at
    // 5,000 nodes to learn nothing more.
    let inner = Arc::clone(&service.0);
    let shutdown = async move {
        shutdown.await;
        inner.closing.send_replace(true);
    };
    let served = Server::builder()
        .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
        .initial_stream_window_size(Some(WINDOW_BYTES))
        .initial_connection_window_size(Some(WINDOW_BYTES))
        .add_service(ReportsServer::new(service).max_decoding_message_size(MAX_MESSAGE_BYTES))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    drop(accept);
    served.map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_keeps_no_raw_bytes_and_no_megabytes() {
        let report = Report {
            reason: format!("bad\0state\u{1b}[2J{}", "x".repeat(4 << 20)),
            kernel: Some(sked_proto::KernelState { ops: "rusty\u{202e}".into(), ..Default::default() }),
            verdict: 42,
            ..Default::default()
        };
        let kept = node_report(&report, Instant::now());
        assert!(kept.reason.starts_with("bad\\u{0}state\\u{1b}[2J"), "{}", kept.reason);
        assert!(kept.reason.len() < 400, "capped: {} bytes", kept.reason.len());
        assert!(!kept.reason.chars().any(char::is_control));
        assert_eq!(kept.ops, "rusty\\u{202e}");
        assert_eq!(kept.verdict, sked_api::verdict::Verdict::NotAttached, "an unknown verdict is not attached");
    }
}
