//! Simulated agents for the benches: real TLS report streams to the controller's reports
//! servers, each with a token bound to a real pod, from a loopback address of its own (as each
//! node's pod has an address of its own), reporting a verdict the bench sets and backing off as
//! the real agent does. Thousands run in one process where thousands of agent processes would
//! not fit the machine.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::{Client, ResourceExt};
use sked_controller::mutex::lock;
use sked_proto::v1::reports_client::ReportsClient;
use sked_proto::{KernelState, Report, Verdict};
use tokio::sync::{mpsc, watch};
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use crate::agents::bound_token;

/// The controller's default: agents report at least this often.
const HEARTBEAT: Duration = Duration::from_secs(10);
/// How long waiting for the fleet's streams may take.
const PATIENCE: Duration = Duration::from_secs(900);
/// Concurrency of the token requests.
const SETUP_CONCURRENCY: usize = 64;

/// Who a simulated agent is: its node, its pod, its Scheduler, and a token bound to the pod.
pub struct AgentIdentity {
    pub node: String,
    pub pod: String,
    pub scheduler: String,
    pub token: String,
}

/// The identities of the agents of `pods` (bound pods of sked DaemonSets in `namespace`).
pub async fn agent_identities(client: &Client, namespace: &str, pods: &[Pod]) -> Result<Vec<AgentIdentity>> {
    futures::stream::iter(pods)
        .map(|pod| async move {
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).ok_or_else(|| anyhow!("unbound pod"))?;
            let scheduler = pod.labels().get("name").cloned().ok_or_else(|| anyhow!("pod without a name label"))?;
            let token = bound_token(client, namespace, "sked-agent", Some(pod)).await?;
            anyhow::Ok(AgentIdentity { node, pod: pod.name_any(), scheduler, token })
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .try_collect()
        .await
}

/// One simulated agent's shared state.
pub struct AgentSlot {
    pub identity: AgentIdentity,
    /// The loopback address its connections come from.
    source: IpAddr,
    /// What it reports; a change is sent at once.
    pub verdict: watch::Sender<Verdict>,
    /// Per endpoint: since when its stream there is accepted and open (`None` while it is not).
    open: Vec<Mutex<Option<Instant>>>,
    /// Per endpoint: when it last acknowledged a report of this agent's.
    acked: Vec<Mutex<Option<Instant>>>,
}

/// Simulated agents, each holding a report stream to every endpoint.
pub struct AgentFleet {
    pub agents: Vec<Arc<AgentSlot>>,
    /// Each agent's reporting tasks, by its pod's name.
    tasks: std::collections::HashMap<String, Vec<tokio::task::JoinHandle<()>>>,
}

impl AgentFleet {
    /// Starts one reporting task per agent and endpoint: as the real agent holds a stream to
    /// every replica the headless Service lists, each keeps one open to each controller, and
    /// backs off as the real agent does.
    /// The agents' connections come from 127.1.0.1 on, `first` addresses further: fleets
    /// started one after another give each agent an address of its own.
    pub async fn start(identities: Vec<AgentIdentity>, endpoints: Vec<String>, ca: &Path, first: u32) -> Result<Self> {
        let ca = std::fs::read(ca)?;
        let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)).domain_name("localhost");
        let endpoints = Arc::new(endpoints);
        let mut agents = Vec::new();
        let mut tasks = std::collections::HashMap::<String, Vec<_>>::new();
        for (n, identity) in (first..).zip(identities) {
            let (verdict, _) = watch::channel(Verdict::Attached);
            let source = IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 1, 0, 1)) + n));
            let open = endpoints.iter().map(|_| Mutex::new(None)).collect();
            let acked = endpoints.iter().map(|_| Mutex::new(None)).collect();
            let slot = Arc::new(AgentSlot { identity, source, verdict, open, acked });
            agents.push(slot.clone());
            for index in 0..endpoints.len() {
                let (tls, endpoints, slot) = (tls.clone(), endpoints.clone(), slot.clone());
                tasks.entry(slot.identity.pod.clone()).or_default().push(tokio::spawn(async move {
                    let mut delay = Duration::ZERO;
                    loop {
                        let mut accepted = false;
                        let _ = session(&slot, index, &endpoints[index], &tls, &mut accepted).await;
                        *lock(&slot.open[index]) = None;
                        delay = sked_agent::report::reconnect_delay(delay, accepted);
                        tokio::time::sleep(sked_agent::report::jittered(delay)).await;
                    }
                }));
            }
        }
        Ok(Self { agents, tasks })
    }

    /// Stops the agent of `pod`, as its pod's end stops it: its streams close. Returns whether
    /// this fleet had it.
    pub fn retire(&mut self, pod: &str) -> bool {
        let Some(tasks) = self.tasks.remove(pod) else { return false };
        for t in tasks {
            t.abort();
        }
        true
    }

    /// How many agents' open streams to endpoint `index` were accepted after `since`.
    pub fn streams_opened_since(&self, index: usize, since: Instant) -> usize {
        self.agents.iter().filter(|a| lock(&a.open[index]).is_some_and(|at| at > since)).count()
    }

    /// Waits until every agent has an accepted stream open to endpoint `index`.
    pub async fn wait_streaming_to(&self, index: usize) -> Result<()> {
        self.wait_every_agent(&format!("accepted by endpoint {index}"), |a| lock(&a.open[index]).is_some()).await
    }

    /// Waits until endpoint `index` has acknowledged a report of every agent's after `since`:
    /// each node's report is then fresh there (an agent reports at least every heartbeat).
    pub async fn wait_acked_since(&self, index: usize, since: Instant) -> Result<()> {
        self.wait_every_agent(&format!("acknowledged by endpoint {index} since {since:?}"), |a| {
            lock(&a.acked[index]).is_some_and(|at| at > since)
        })
        .await
    }

    async fn wait_every_agent(&self, what: &str, done: impl Fn(&AgentSlot) -> bool) -> Result<()> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let waiting = self.agents.iter().filter(|a| !done(a)).count();
            if waiting == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{waiting} agents not {what} after {PATIENCE:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for AgentFleet {
    fn drop(&mut self) {
        for t in self.tasks.values().flatten() {
            t.abort();
        }
    }
}

fn report(id: &AgentIdentity, verdict: Verdict, sequence: u64) -> Report {
    let attached = verdict == Verdict::Attached;
    Report {
        node: id.node.clone(),
        pod: id.pod.clone(),
        scheduler: id.scheduler.clone(),
        kernel: Some(KernelState {
            state: if attached { "enabled" } else { "disabled" }.into(),
            ops: if attached { "bench_ops" } else { "" }.into(),
            enable_seq: 1,
            ..KernelState::default()
        }),
        verdict: verdict as i32,
        reason: if attached { String::new() } else { "no scheduler attached".into() },
        agent_version: "bench".into(),
        sequence,
        last_exit: None,
        health: Some(health()),
        scheduler_stats: String::new(),
        cpu_contract: None,
    }
}

/// The newest 16 samples of an agent sampling every second (the most a report carries, and the
/// shortest interval: the controller's memory for them is at its largest), each with every
/// signal set, stamped as sent now.
fn health() -> sked_proto::Health {
    let now = jiff::Timestamp::now().as_millisecond();
    let samples = (0..16)
        .rev()
        .map(|ago| sked_proto::HealthSample {
            time_unix_ms: now - ago * 1000,
            interval_ms: 1000,
            run_delay_us: Some(1000.0 + (ago % 7) as f64),
            cpu_pressure_percent: Some(10.0),
            events_known: true,
            waiting_per_cpu: Some(0.3),
            utilisation: Some(0.6),
            switches_per_cpu_second: Some(1000.0),
            idle_while_waiting: Some(0.02),
            cpus: 2,
            ..sked_proto::HealthSample::default()
        })
        .collect();
    sked_proto::Health { samples, unavailable: String::new(), sent_unix_ms: now, event_names: Vec::new() }
}

async fn session(
    slot: &AgentSlot,
    index: usize,
    endpoint: &str,
    tls: &ClientTlsConfig,
    accepted: &mut bool,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let channel = Endpoint::from_shared(endpoint.to_owned())?
        .tls_config(tls.clone())?
        .connect_timeout(Duration::from_secs(10))
        .local_address(Some(slot.source))
        .connect()
        .await?;
    let mut client = ReportsClient::new(channel);
    let (tx, mut rx) = mpsc::channel::<Report>(4);
    let mut verdicts = slot.verdict.subscribe();
    let mut sequence = 1;
    let first = *verdicts.borrow_and_update();
    tx.send(report(&slot.identity, first, sequence)).await?;
    let mut request = tonic::Request::new(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)));
    request.metadata_mut().insert("authorization", MetadataValue::try_from(format!("Bearer {}", slot.identity.token))?);
    // As the real agent does when it holds a stream to every replica: the standby keeps it.
    request.metadata_mut().insert(sked_proto::contract::EVERY_REPLICA_METADATA, MetadataValue::from_static("true"));
    let mut acks = client.stream(request).await?.into_inner();
    let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT, HEARTBEAT);
    loop {
        let verdict = tokio::select! {
            ack = acks.message() => match ack? {
                Some(_) => {
                    *lock(&slot.acked[index]) = Some(Instant::now());
                    if !*accepted {
                        *accepted = true;
                        *lock(&slot.open[index]) = Some(Instant::now());
                    }
                    continue;
                }
                None => return Ok(()),
            },
            _ = heartbeat.tick() => None,
            changed = verdicts.changed() => {
                changed?;
                None
            }
        };
        let verdict = verdict.unwrap_or_else(|| *verdicts.borrow_and_update());
        sequence += 1;
        tx.send(report(&slot.identity, verdict, sequence)).await?;
    }
}
