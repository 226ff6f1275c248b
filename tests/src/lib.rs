//! Test harness for sked: a real control plane ([`cluster::TestCluster`]) and helpers for the
//! integration suites in `tests/tests/`.

pub mod agents;
pub mod cluster;
pub mod registry;
pub mod vm;
pub mod vmlink;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use sked_controller::config::ControllerFlags;
use sked_controller::{Scheduler, SchedulerSpec};
use tokio::sync::{Mutex, MutexGuard, oneshot};

pub use cluster::TestCluster;

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
pub async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut last_err = None;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if tokio::time::Instant::now() > deadline {
            bail!("timed out after {DEADLINE:?} waiting for {what} (last error: {last_err:?})");
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

    async fn start_inner(mut flags: ControllerFlags, run_controller: bool) -> Result<Self> {
        let turn = SERIAL.lock().await;
        init_test_logging();
        let cluster = shared_cluster()?;
        let client = cluster.client().await?;
        install_crds(&client).await?;
        clear(&client).await?;
        let namespace = flags.workload_namespace.clone();
        ensure_namespace(&client, &namespace).await?;
        ensure_service_account(&client, &namespace, &flags.agent_service_account).await?;
        // Fast retries keep failure tests short; the backoff itself is unit-tested.
        flags.reconcile_retry_base_delay = Duration::from_millis(200);
        flags.reconcile_rate_limit_qps = 100.0;
        flags.reconcile_rate_limit_burst = 100;
        // One in-process controller at a time: no election (the leader test runs processes).
        flags.leader_elect = false;
        flags.metrics_bind_address = ([127, 0, 0, 1], cluster::free_port()?).into();
        let metrics_address = flags.metrics_bind_address;
        // Tests that are not about image trust run made-up images from no registry.
        if flags.trust_policy.is_none() {
            flags.trust_policy = Some(allow_unsigned_policy(&cluster.dir)?);
        }
        tokio::spawn(finish_pod_deletions(client.clone(), namespace.clone()));
        let (stop, stopped) = oneshot::channel::<()>();
        let controller_client = client.clone();
        let report_stats = std::sync::Arc::new(sked_controller::metrics::ReportStats::default());
        let stats = report_stats.clone();
        let controller = run_controller.then(|| {
            tokio::spawn(async move {
                let shutdown = async move {
                    let _ = stopped.await;
                };
                let run =
                    sked_controller::manager::run_with_stats(controller_client, flags, "test".into(), shutdown, stats);
                if let Err(e) = run.await {
                    eprintln!("controller stopped with error: {e}");
                }
            })
        });
        Ok(Self {
            cluster,
            client,
            namespace,
            report_stats,
            metrics_address,
            stop: Some(stop),
            controller,
            _turn: turn,
        })
    }

    /// Stops the controller and waits for it to drain.
    pub async fn stop_controller(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(handle) = self.controller.take() {
            let _ = tokio::time::timeout(DEADLINE, handle).await;
        }
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

    /// Waits until the Scheduler's status satisfies `pred`, returning it.
    pub async fn wait_scheduler(&self, name: &str, what: &str, pred: impl Fn(&Scheduler) -> bool) -> Result<Scheduler> {
        let api = self.schedulers();
        let last = std::sync::Mutex::new(None);
        let result = wait_for(&format!("Scheduler {name}: {what}"), || {
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

    /// Plays the kubelet for a DaemonSet's pods: marks every pod of `scheduler` Running and
    /// Ready. Returns how many pods it marked.
    pub async fn mark_pods_ready(&self, scheduler: &str) -> Result<usize> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let list = pods.list(&ListParams::default().labels(&format!("name={scheduler}"))).await?;
        let now = jiff::Timestamp::now().to_string();
        for pod in &list.items {
            let status = json!({
                "status": {
                    "phase": "Running",
                    "conditions": [
                        {"type": "Ready", "status": "True", "lastTransitionTime": now},
                        {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                    ],
                }
            });
            pods.patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&status)).await?;
        }
        Ok(list.items.len())
    }

    /// How many times each (type, reason) event was recorded for a Scheduler, counting the
    /// repeats an events.k8s.io series folds into one object.
    pub async fn scheduler_events(&self, name: &str) -> Result<BTreeMap<(String, String), i32>> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), "default");
        let mut counts = BTreeMap::new();
        for e in events.list(&ListParams::default()).await?.items {
            let about_it = e
                .regarding
                .as_ref()
                .is_some_and(|r| r.kind.as_deref() == Some("Scheduler") && r.name.as_deref() == Some(name));
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

/// A condition of a Scheduler's status.
pub fn condition<'a>(
    s: &'a Scheduler,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    s.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
}

/// Whether a condition has the given status and reason.
pub fn has_condition(s: &Scheduler, type_: &str, status: &str, reason: &str) -> bool {
    condition(s, type_).is_some_and(|c| c.status == status && c.reason == reason)
}

/// Applies the committed CRDs (server-side) and waits until they are established.
/// Runs a command to completion; its stdout on success, its stderr in the error otherwise.
pub fn run_command(cmd: &mut std::process::Command) -> Result<String> {
    let out = cmd.stdin(std::process::Stdio::null()).output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Waits until `count` live pods of the Scheduler's DaemonSet are bound to nodes; keyed by node.
pub async fn wait_bound_pods(
    client: &Client,
    namespace: &str,
    scheduler: &str,
    count: usize,
) -> Result<BTreeMap<String, Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    wait_for(&format!("{count} pods of {scheduler} bound to nodes"), || {
        let pods = pods.clone();
        async move {
            let list = pods.list(&ListParams::default().labels(&format!("name={scheduler}"))).await?;
            let bound: BTreeMap<String, Pod> = list
                .items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter_map(|p| Some((p.spec.as_ref()?.node_name.clone()?, p)))
                .collect();
            Ok((bound.len() == count).then_some(bound))
        }
    })
    .await
}

/// Registers a validating webhook for Scheduler creates and updates, called at `url` (HTTPS,
/// certificate signed by `ca_pem`), failing closed. The API server applies it shortly after.
pub async fn register_validating_webhook(client: &Client, name: &str, url: &str, ca_pem: Vec<u8>) -> Result<()> {
    use k8s_openapi::api::admissionregistration::v1::{
        RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
    };
    let config = ValidatingWebhookConfiguration {
        metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
        webhooks: Some(vec![ValidatingWebhook {
            name: "schedulers.sked.schedkit.io".into(),
            admission_review_versions: vec!["v1".into()],
            side_effects: "None".into(),
            failure_policy: Some("Fail".into()),
            timeout_seconds: Some(15),
            client_config: WebhookClientConfig {
                url: Some(url.into()),
                ca_bundle: Some(k8s_openapi::ByteString(ca_pem)),
                service: None,
            },
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec!["sked.schedkit.io".into()]),
                api_versions: Some(vec!["v1".into()]),
                operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
                resources: Some(vec!["schedulers".into()]),
                scope: Some("Cluster".into()),
            }]),
            ..Default::default()
        }]),
    };
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    api.patch(name, &PatchParams::apply("sked-tests").force(), &Patch::Apply(&config)).await?;
    Ok(())
}

/// Deletes a validating webhook configuration, if it exists.
pub async fn delete_validating_webhook(client: &Client, name: &str) -> Result<()> {
    let api: Api<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration> =
        Api::all(client.clone());
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A trust policy that lets every image run unsigned, as written: for tests that are not
/// about image trust (their images exist in no registry).
pub fn allow_unsigned_policy(dir: &std::path::Path) -> Result<std::path::PathBuf> {
    let path = dir.join("trust-policy-allow-unsigned.yaml");
    std::fs::write(&path, "rules:\n  - repository: \"**\"\n    unsigned: allow\n")?;
    Ok(path)
}

pub async fn install_crds(client: &Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let dir = cluster::workspace_root().join("crds");
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let name = crd.name_any();
        crds.patch(&name, &PatchParams::apply("sked-tests").force(), &Patch::Apply(&crd))
            .await
            .with_context(|| format!("applying {}", path.display()))?;
        tokio::time::timeout(DEADLINE, await_condition(crds.clone(), &name, conditions::is_crd_established()))
            .await
            .map_err(|_| anyhow!("CRD {name} not established"))??;
    }
    Ok(())
}

/// Deletes every Scheduler and Node and waits until they are gone.
pub async fn clear(client: &Client) -> Result<()> {
    let schedulers: Api<Scheduler> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    schedulers.delete_collection(&DeleteParams::default(), &ListParams::default()).await?;
    nodes.delete_collection(&DeleteParams::default(), &ListParams::default()).await?;
    wait_for("Schedulers and Nodes of earlier tests to be gone", || {
        let (schedulers, nodes) = (schedulers.clone(), nodes.clone());
        async move {
            let s = schedulers.list(&ListParams::default()).await?.items.len();
            let n = nodes.list(&ListParams::default()).await?.items.len();
            Ok((s == 0 && n == 0).then_some(()))
        }
    })
    .await
}

/// Creates a Node and plays its kubelet's first moves: reports it Ready with some capacity
/// (so kube-scheduler places pods on it) and lifts the
/// `node.kubernetes.io/not-ready` taint the API server puts on every new Node (there is no
/// kubelet here, and no node lifecycle controller to do it).
pub async fn create_ready_node(client: &Client, name: &str, labels: &[(&str, &str)]) -> Result<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    let labels: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": name, "labels": labels },
    }))?;
    nodes.create(&PostParams::default(), &node).await.with_context(|| format!("creating Node {name}"))?;
    let now = jiff::Timestamp::now().to_string();
    let resources = json!({"cpu": "8", "memory": "16Gi", "pods": "110"});
    let ready = json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "sked test kubelet",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }],
    }});
    nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&ready)).await?;
    let untainted = json!({"spec": {"taints": null}});
    Ok(nodes.patch(name, &PatchParams::default(), &Patch::Merge(&untainted)).await?)
}

/// Plays the kubelet's last move: a pod being deleted is gone once its kubelet confirms, so
/// pods marked for deletion are removed at once (there is no kubelet to do it).
pub async fn finish_pod_deletions(client: Client, namespace: String) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let pods: Api<Pod> = Api::namespaced(client, &namespace);
    let mut stream = watcher(pods.clone(), watcher::Config::default()).default_backoff().applied_objects().boxed();
    while let Some(Ok(pod)) = stream.next().await {
        if pod.metadata.deletion_timestamp.is_some() {
            let _ = pods
                .delete(&pod.name_any(), &DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
                .await;
        }
    }
}

/// Creates a ServiceAccount if it does not exist (the chart creates the agent's).
pub async fn ensure_service_account(client: &Client, namespace: &str, name: &str) -> Result<()> {
    let api: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let sa: k8s_openapi::api::core::v1::ServiceAccount =
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}))?;
    api.patch(name, &PatchParams::apply("sked-tests"), &Patch::Apply(&sa)).await?;
    Ok(())
}

/// Creates a namespace if it does not exist.
pub async fn ensure_namespace(client: &Client, name: &str) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}))?;
    namespaces.patch(name, &PatchParams::apply("sked-tests"), &Patch::Apply(&ns)).await?;
    Ok(())
}

/// A Scheduler spec with just an image.
pub fn spec(image: &str) -> SchedulerSpec {
    SchedulerSpec { sched: image.into(), ..SchedulerSpec::default() }
}

/// A Scheduler spec with an image and a node selector.
pub fn spec_on(image: &str, selector: &[(&str, &str)]) -> SchedulerSpec {
    SchedulerSpec {
        sched: image.into(),
        node_selector: selector.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..SchedulerSpec::default()
    }
}

/// Waits until the wall clock is in a later second than `t`, so the next object created gets
/// a strictly later `creationTimestamp` (the API server stores whole seconds).
pub async fn next_second_after(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> Result<()> {
    let created = t.0.as_second();
    wait_for("the clock to pass the creation second", || async move {
        Ok((jiff::Timestamp::now().as_second() > created).then_some(()))
    })
    .await
}
