//! The shared fixture: one test control plane per test binary, taken in turns, with a controller
//! running in-process, and the waits and reads the suites share.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use sked_controller::config::ControllerFlags;
use sked_controller::{Scheduler, SchedulerSpec};
use tokio::sync::{Mutex, MutexGuard, oneshot};

use crate::cluster::{self, TestCluster};
use crate::kubelet::{create_ready_node, finish_pod_deletions};
use crate::objects::{allow_unsigned_policy, clear, ensure_namespace, ensure_service_account, install_crds};

/// How long a test waits for any one condition.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// The cluster shared by every test of one test binary (started on first use).
pub fn shared_cluster() -> Result<&'static TestCluster> {
    static CLUSTER: OnceLock<std::result::Result<TestCluster, String>> = OnceLock::new();
    CLUSTER
        .get_or_init(|| {
            // Started on a plain thread: the caller may be inside an async runtime.
            std::thread::spawn(|| TestCluster::start().map_err(|e| format!("{e:#}")))
                .join()
                .unwrap_or_else(|_| Err("starting the test cluster panicked".into()))
        })
        .as_ref()
        .map_err(|e| anyhow!("test cluster failed to start: {e}"))
}

/// Tests of one binary share the cluster and the cluster-scoped Scheduler and Node objects,
/// so they take turns.
static SERIAL: Mutex<()> = Mutex::const_new(());

/// Sends controller logs (text, info) to the test's captured output, shown when a test fails.
pub fn init_test_logging() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("sked_controller=info,warn"));
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    });
}

/// Polls `check` until it returns `Some`, or fails with `what` after [`DEADLINE`].
pub async fn wait_for<T, F, Fut>(what: &str, check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    wait_for_within(what, DEADLINE, check).await
}

/// Polls `check` until it returns `Some`, or fails with `what` after `within` (for what takes
/// longer than [`DEADLINE`] by nature, such as a node booting under emulation).
pub async fn wait_for_within<T, F, Fut>(what: &str, within: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + within;
    let mut last_err = None;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if tokio::time::Instant::now() > deadline {
            bail!("timed out after {within:?} waiting for {what} (last error: {last_err:?})");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One test's view: the cluster, an admin client, and a running controller.
pub struct Fixture {
    pub cluster: &'static TestCluster,
    pub client: Client,
    pub namespace: String,
    /// Streams the controller's reports server accepted and refused.
    pub report_stats: std::sync::Arc<sked_controller::metrics::ReportStats>,
    /// Where the in-process controller serves /metrics.
    pub metrics_address: std::net::SocketAddr,
    /// The user the running (or last) in-process controller authenticates as: each one started
    /// has its own, so the API server's audit log tells their writes apart (see
    /// [`Fixture::writes_by`]).
    pub controller_user: String,
    stop: Option<oneshot::Sender<()>>,
    controller: Option<tokio::task::JoinHandle<()>>,
    _turn: MutexGuard<'static, ()>,
}

impl Fixture {
    /// Takes this binary's turn on the cluster, clears Schedulers and Nodes left by earlier
    /// tests, installs the CRD and starts a controller with default flags.
    pub async fn start() -> Result<Self> {
        Self::start_with(ControllerFlags::default()).await
    }

    pub async fn start_with(flags: ControllerFlags) -> Result<Self> {
        Self::start_inner(flags, true).await
    }

    /// The cluster, cleaned and prepared, but no controller: the test runs its own.
    pub async fn without_controller() -> Result<Self> {
        Self::start_inner(ControllerFlags::default(), false).await
    }

    async fn start_inner(flags: ControllerFlags, run_controller: bool) -> Result<Self> {
        let turn = SERIAL.lock().await;
        init_test_logging();
        let cluster = shared_cluster()?;
        let client = cluster.client().await?;
        install_crds(&client).await?;
        clear(&client).await?;
        let namespace = flags.workload_namespace.clone();
        ensure_namespace(&client, &namespace).await?;
        ensure_service_account(&client, &namespace, &flags.agent_service_account).await?;
        tokio::spawn(finish_pod_deletions(client.clone(), namespace.clone()));
        let mut fixture = Self {
            cluster,
            client,
            namespace,
            report_stats: Default::default(),
            metrics_address: ([127, 0, 0, 1], 0).into(),
            controller_user: String::new(),
            stop: None,
            controller: None,
            _turn: turn,
        };
        if run_controller {
            // The test agents report every second.
            let flags = ControllerFlags { agent_heartbeat_interval: Duration::from_secs(1), ..flags };
            fixture.start_controller(flags)?;
        }
        Ok(fixture)
    }

    /// Starts an in-process controller with `flags` (adjusted for tests); when one ran before,
    /// as after a failover to a replica that heard no agent yet (agents that reach the leader
    /// alone): a new process, with new counters and an empty kernel table.
    pub fn start_controller(&mut self, mut flags: ControllerFlags) -> Result<()> {
        // Fast retries keep failure tests short; the backoff itself is unit-tested.
        flags.reconcile_retry_base_delay = Duration::from_millis(200);
        flags.reconcile_rate_limit_qps = 100.0;
        flags.reconcile_rate_limit_burst = 100;
        // One in-process controller at a time: no election (the leader test runs processes).
        flags.leader_elect = false;
        flags.metrics_bind_address = ([127, 0, 0, 1], cluster::free_port()?).into();
        self.metrics_address = flags.metrics_bind_address;
        // Tests that are not about image trust run made-up images from no registry.
        if flags.trust_policy.is_none() {
            flags.trust_policy = Some(allow_unsigned_policy(&self.cluster.dir)?);
        }
        let (stop, stopped) = oneshot::channel::<()>();
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        self.controller_user = format!("sked-controller-{n}");
        let kubeconfig = self.cluster.user_kubeconfig(&self.controller_user)?;
        self.report_stats = std::sync::Arc::new(sked_controller::metrics::ReportStats::default());
        let stats = self.report_stats.clone();
        self.controller = Some(tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            let controller_client = match cluster::client_of(&kubeconfig).await {
                Ok(client) => client,
                Err(e) => return eprintln!("controller client for {}: {e:#}", kubeconfig.display()),
            };
            let run =
                sked_controller::manager::run_with_stats(controller_client, flags, "test".into(), shutdown, stats);
            if let Err(e) = run.await {
                eprintln!("controller stopped with error: {e}");
            }
        }));
        self.stop = Some(stop);
        Ok(())
    }

    /// Stops the controller and waits for it to drain; fails if it did not within [`DEADLINE`]
    /// (then it is aborted, and what it may have left running could still write: the test
    /// cannot go on as if one controller ran).
    pub async fn stop_controller(&mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(mut handle) = self.controller.take()
            && tokio::time::timeout(DEADLINE, &mut handle).await.is_err()
        {
            handle.abort();
            bail!("the in-process controller {} did not stop within {DEADLINE:?}", self.controller_user);
        }
        Ok(())
    }

    /// The writes the API server answered with success for `user` so far (its audit log).
    pub fn writes_by(&self, user: &str) -> Result<Vec<cluster::AuditedWrite>> {
        let writes = self.cluster.audited_writes()?;
        Ok(writes.into_iter().filter(|w| w.user == user && (200..300).contains(&w.code)).collect())
    }

    /// The controller's /metrics text.
    pub async fn scrape_metrics(&self) -> Result<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(self.metrics_address).await?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: metrics\r\n\r\n").await?;
        let mut body = String::new();
        s.read_to_string(&mut body).await?;
        Ok(body)
    }

    /// The sum of a metric's samples on the controller's /metrics (0 when it has none).
    pub async fn metric_total(&self, name: &str) -> Result<u64> {
        let text = self.scrape_metrics().await?;
        Ok(text
            .lines()
            .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with([' ', '{'])))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
            .sum())
    }

    /// `kubectl apply` of `yaml`; the command's output (refusals are not errors here).
    pub fn kubectl_apply(&self, yaml: &str) -> Result<std::process::Output> {
        self.kubectl_apply_with(yaml, &[])
    }

    /// `kubectl apply` of `yaml` with more flags, e.g. `--dry-run=server`.
    pub fn kubectl_apply_with(&self, yaml: &str, flags: &[&str]) -> Result<std::process::Output> {
        let file = tempfile::Builder::new().suffix(".yaml").tempfile()?;
        std::fs::write(file.path(), yaml)?;
        let path = file.path().to_string_lossy().into_owned();
        let mut args = vec!["apply"];
        args.extend_from_slice(flags);
        args.extend(["-f", &path]);
        self.cluster.kubectl(&args)
    }

    pub fn schedulers(&self) -> Api<Scheduler> {
        Api::all(self.client.clone())
    }

    pub fn daemonsets(&self) -> Api<DaemonSet> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// Creates a Scheduler.
    pub async fn create_scheduler(&self, name: &str, spec: SchedulerSpec) -> Result<Scheduler> {
        let s = Scheduler::new(name, spec);
        self.schedulers().create(&PostParams::default(), &s).await.with_context(|| format!("creating Scheduler {name}"))
    }

    /// Creates a Ready Node with labels (see [`create_ready_node`]).
    pub async fn create_node(&self, name: &str, labels: &[(&str, &str)]) -> Result<Node> {
        create_ready_node(&self.client, name, labels).await
    }

    /// Replaces a Node's labels.
    pub async fn relabel_node(&self, name: &str, labels: &[(&str, &str)]) -> Result<()> {
        // A merge patch (no resourceVersion to conflict on): old keys set to null, new ones set.
        let node = self.nodes().get(name).await?;
        let mut patch = serde_json::Map::new();
        for key in node.labels().keys() {
            patch.insert(key.clone(), serde_json::Value::Null);
        }
        for (k, v) in labels {
            patch.insert(k.to_string(), json!(v));
        }
        let body = json!({"metadata": {"labels": patch}});
        self.nodes().patch(name, &PatchParams::default(), &Patch::Merge(&body)).await?;
        Ok(())
    }

    /// Writes the API server has served so far to the kinds sked writes (Schedulers and their
    /// status, DaemonSets, pods, Nodes, events), by (resource, subresource, verb), from its own
    /// `apiserver_request_total` metric.
    pub fn apiserver_writes(&self) -> Result<BTreeMap<(String, String, String), u64>> {
        Ok(self.cluster.apiserver_requests()?.into_iter().filter(|(key, _)| sked_write(key)).collect())
    }

    /// Waits until each node carries the owner label `sked.schedkit.io/scheduler` with the given
    /// value (`None`: no such label).
    pub async fn wait_owners(&self, owners: &[(&str, Option<&str>)]) -> Result<()> {
        let nodes = self.nodes();
        wait_for(&format!("node owners {owners:?}"), || {
            let nodes = nodes.clone();
            async move {
                for (node, owner) in owners {
                    let n = nodes.get(node).await?;
                    if n.labels().get("sked.schedkit.io/scheduler").map(String::as_str) != *owner {
                        return Ok(None);
                    }
                }
                Ok(Some(()))
            }
        })
        .await
    }

    /// Waits until the Scheduler's status satisfies `pred`, returning it.
    pub async fn wait_scheduler(&self, name: &str, what: &str, pred: impl Fn(&Scheduler) -> bool) -> Result<Scheduler> {
        self.wait_scheduler_within(name, what, DEADLINE, pred).await
    }

    /// [`Fixture::wait_scheduler`] with a deadline of its own.
    pub async fn wait_scheduler_within(
        &self,
        name: &str,
        what: &str,
        within: Duration,
        pred: impl Fn(&Scheduler) -> bool,
    ) -> Result<Scheduler> {
        let api = self.schedulers();
        let last = std::sync::Mutex::new(None);
        let result = wait_for_within(&format!("Scheduler {name}: {what}"), within, || {
            let api = api.clone();
            let (pred, last) = (&pred, &last);
            async move {
                let s = api.get_opt(name).await?;
                let found = s.as_ref().filter(|s| pred(s)).cloned();
                *last.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = s.and_then(|s| s.status);
                Ok(found)
            }
        })
        .await;
        result.map_err(|e| {
            let last = last.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
            let status = serde_json::to_string_pretty(&last).unwrap_or_default();
            e.context(format!("last status of Scheduler {name}: {status}"))
        })
    }

    /// Waits until the DaemonSet exists and satisfies `pred`.
    pub async fn wait_daemonset(&self, name: &str, what: &str, pred: impl Fn(&DaemonSet) -> bool) -> Result<DaemonSet> {
        let api = self.daemonsets();
        wait_for(&format!("DaemonSet {name}: {what}"), || {
            let api = api.clone();
            let pred = &pred;
            async move { Ok(api.get_opt(name).await?.filter(|d| pred(d))) }
        })
        .await
    }

    /// Waits until the DaemonSet is gone.
    pub async fn wait_daemonset_gone(&self, name: &str) -> Result<()> {
        let api = self.daemonsets();
        wait_for(&format!("DaemonSet {name} to be deleted"), || {
            let api = api.clone();
            async move { Ok(api.get_opt(name).await?.is_none().then_some(())) }
        })
        .await
    }

    /// How many times each (type, reason) event was recorded for a Scheduler, counting the
    /// repeats an events.k8s.io series folds into one object.
    pub async fn scheduler_events(&self, name: &str) -> Result<BTreeMap<(String, String), i32>> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), "default");
        // This Scheduler, not an earlier one of the same name (the cluster outlives a test).
        let uid = self.schedulers().get_opt(name).await?.and_then(|s| s.metadata.uid);
        let mut counts = BTreeMap::new();
        for e in events.list(&ListParams::default()).await?.items {
            let about_it = e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("Scheduler")
                    && r.name.as_deref() == Some(name)
                    && uid.as_ref().is_none_or(|uid| r.uid.as_ref() == Some(uid))
            });
            if about_it {
                let n = e.series.as_ref().map_or(1, |s| s.count);
                *counts.entry((e.type_.unwrap_or_default(), e.reason.unwrap_or_default())).or_insert(0) += n;
            }
        }
        Ok(counts)
    }
}

impl Fixture {
    /// Waits until the Scheduler's recorded events are exactly `expected` (events are published
    /// right after the status they describe is saved), failing with the last counts seen.
    pub async fn wait_events(&self, name: &str, expected: &[(&str, &str, i32)]) -> Result<()> {
        let expected = event_counts(expected);
        let last = std::sync::Mutex::new(BTreeMap::new());
        let result = wait_for(&format!("events of Scheduler {name}"), || {
            let (expected, last) = (&expected, &last);
            async move {
                let seen = self.scheduler_events(name).await?;
                let done = seen == *expected;
                *last.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = seen;
                Ok(done.then_some(()))
            }
        })
        .await;
        result.map_err(|e| {
            let last = last.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
            e.context(format!("expected {expected:?}, last seen {last:?}"))
        })
    }

    /// Waits until the Scheduler has recorded (type, reason) exactly `count` times.
    pub async fn wait_event(&self, name: &str, type_: &str, reason: &str, count: i32) -> Result<()> {
        let key = (type_.to_owned(), reason.to_owned());
        wait_for(&format!("{count} {type_} {reason} event(s) of Scheduler {name}"), || {
            let key = &key;
            async move { Ok((self.scheduler_events(name).await?.get(key) == Some(&count)).then_some(())) }
        })
        .await
    }
}

/// Whether a request counted by (resource, subresource, verb) is a write to a kind sked writes.
pub fn sked_write((resource, _, verb): &(String, String, String)) -> bool {
    ["schedulers", "daemonsets", "pods", "nodes", "events"].contains(&resource.as_str())
        && ["POST", "PUT", "PATCH", "APPLY", "DELETE"].contains(&verb.as_str())
}

/// Builds the expected event counts for [`Fixture::scheduler_events`].
pub fn event_counts(expected: &[(&str, &str, i32)]) -> BTreeMap<(String, String), i32> {
    expected.iter().map(|(t, r, n)| ((t.to_string(), r.to_string()), *n)).collect()
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(handle) = self.controller.take() {
            handle.abort();
        }
    }
}
