//! The kubelet for the controller's pods, played with processes: the test control plane has no
//! kubelet and no container runtime, so each controller pod the chart's Deployment creates runs
//! as the workspace's `sked-controller` binary, with the pod's own arguments, its Secret and
//! ConfigMap volumes as files (kept in sync, as the kubelet does, so renewals arrive), a
//! kubeconfig holding a token of the pod's ServiceAccount (the chart's RBAC applies), and its
//! ports on 127.0.0.1. A pod is marked Ready when its readiness probe answers. The API server
//! reaches a pod's webhook through its Service: an EndpointSlice per pod (`127.0.0.1` as an
//! FQDN address, with `--enable-aggregator-routing` on the test API server).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::TestCluster;
use crate::agents::workspace_binary;
use crate::cluster::free_port;
use crate::kubelet::set_pod_ready;

/// One controller pod, running as a process.
pub struct PodProcess {
    pub pod: String,
    pub uid: String,
    /// Where the pod's named container ports listen (`metrics`, `reports`, `webhook`).
    pub ports: BTreeMap<String, u16>,
    pub log: PathBuf,
    child: Child,
    /// When its pod began terminating: it is out of its Services from then on, and asked to
    /// stop (SIGTERM); it is killed once it has had [`GRACE`].
    stopping: Option<std::time::Instant>,
}

/// How long a terminating pod's process may take to stop before it is killed (the pod's
/// grace period, shortened for tests).
const GRACE: Duration = Duration::from_secs(10);

impl PodProcess {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process still runs and its pod is not terminating.
    pub fn running(&mut self) -> bool {
        self.stopping.is_none() && matches!(self.child.try_wait(), Ok(None))
    }

    /// As the kubelet stops a container: the pod leaves its Services' endpoints (it is no
    /// longer `running`), its process gets SIGTERM, and is killed after [`GRACE`]. Returns
    /// whether the process is gone.
    fn stop(&mut self) -> bool {
        let since = *self.stopping.get_or_insert_with(|| {
            // SAFETY: kill(2) on the child's pid, which this value owns and has not reaped.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            std::time::Instant::now()
        });
        if matches!(self.child.try_wait(), Ok(Some(_)) | Err(_)) {
            return true;
        }
        if since.elapsed() >= GRACE {
            let _ = self.child.kill();
            let _ = self.child.wait();
            return true;
        }
        false
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for PodProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The controller pods of one namespace, as processes; stopped on drop.
pub struct ControllerPods {
    pub pods: Arc<Mutex<Vec<PodProcess>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ControllerPods {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ControllerPods {
    /// Plays the kubelet for the pods matching `selector` in `namespace` from now on: starts
    /// each bound pod once, keeps its volume files current, marks it Ready when it is, and
    /// routes each `(service, port name)` of `routes` to the running pods.
    pub fn run(
        cluster: &'static TestCluster,
        client: Client,
        namespace: &str,
        selector: &str,
        routes: &[(&str, &str)],
    ) -> Self {
        let pods: Arc<Mutex<Vec<PodProcess>>> = Arc::default();
        let (shared, namespace, selector) = (pods.clone(), namespace.to_owned(), selector.to_owned());
        let routes: Vec<(String, String)> = routes.iter().map(|(s, p)| (s.to_string(), p.to_string())).collect();
        let task = tokio::spawn(async move {
            let mut last = String::new();
            let mut routed = Vec::new();
            loop {
                let mut problem = sync(cluster, &client, &namespace, &selector, &shared).await.err();
                let wanted = wanted_routes(&shared, &routes);
                if wanted != routed {
                    match route(&client, &namespace, &wanted).await {
                        Ok(()) => routed = wanted,
                        Err(e) => problem = Some(e),
                    }
                }
                let problem = problem.map(|e| format!("{e:#}")).unwrap_or_default();
                if problem != last && !problem.is_empty() {
                    eprintln!("controller pods: {problem}");
                }
                last = problem;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        Self { pods, task }
    }

    /// The local port `name` of every running pod.
    pub fn ports(&self, name: &str) -> Vec<u16> {
        let pods = self.pods.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        pods.iter().filter_map(|p| p.ports.get(name).copied()).collect()
    }

    /// The local port `name` of the running pod `pod`.
    pub fn port_of(&self, pod: &str, name: &str) -> Option<u16> {
        let pods = self.pods.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        pods.iter().find(|p| p.pod == pod).and_then(|p| p.ports.get(name).copied())
    }

    /// Whether a line of some pod's log contains every one of `parts`.
    pub fn logged(&self, parts: &[&str]) -> bool {
        let pods = self.pods.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        pods.iter().any(|p| {
            let text = std::fs::read_to_string(&p.log).unwrap_or_default();
            text.lines().any(|line| parts.iter().all(|part| line.contains(part)))
        })
    }

    /// Every pod's log tail, for a failure's message.
    pub fn logs(&self) -> String {
        let pods = self.pods.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        pods.iter().map(|p| format!("== {}\n{}", p.pod, p.log_tail(30))).collect::<Vec<_>>().join("\n")
    }
}

/// One pass: start new pods, refresh volumes, report readiness, forget deleted pods.
async fn sync(
    cluster: &'static TestCluster,
    client: &Client,
    namespace: &str,
    selector: &str,
    running: &Mutex<Vec<PodProcess>>,
) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let listed = api.list(&ListParams::default().labels(selector)).await?.items;
    let live: Vec<&Pod> = listed
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
        .collect();
    {
        let mut procs = running.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // A pod that is gone or terminating stops as the kubelet stops it: out of the
        // Services first, SIGTERM, and a grace period (sked's servers keep answering for a
        // moment after SIGTERM, while the endpoints catch up).
        procs.retain_mut(|p| live.iter().any(|l| l.uid().as_deref() == Some(p.uid.as_str())) || !p.stop());
    }
    for pod in live {
        let uid = pod.uid().unwrap_or_default();
        let dir = cluster.dir.join("pods").join(&uid);
        let mounts = write_volumes(client, namespace, pod, &dir).await?;
        let known = running.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().any(|p| p.uid == uid);
        if !known {
            let process = start(cluster, client, namespace, pod, &dir, &mounts).await?;
            running.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(process);
        }
        let metrics = running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter_mut()
            .find(|p| p.uid == uid)
            .and_then(|p| if p.running() { p.ports.get("metrics").copied() } else { None });
        let ready = match metrics {
            Some(port) => probe(port, "/readyz").await,
            None => false,
        };
        let shown = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True");
        if ready != shown {
            set_pod_ready(&api, &pod.name_any(), ready).await?;
        }
    }
    Ok(())
}

/// Whether `GET path` on 127.0.0.1:`port` answers 200.
async fn probe(port: u16, path: &str) -> bool {
    get(port, path).await.is_some()
}

/// The body of `GET path` on 127.0.0.1:`port` (plain HTTP/1.1), when it answers 200.
pub async fn get(port: u16, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.ok()?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(2), tcp.read_to_end(&mut answer)).await.ok()?.ok()?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

/// Writes the pod's Secret, ConfigMap and emptyDir volumes under `dir` (a file is rewritten,
/// through a rename, only when its content changed). Returns mount path -> local directory.
async fn write_volumes(client: &Client, namespace: &str, pod: &Pod, dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let spec = pod.spec.as_ref().context("pod spec")?;
    let container = spec.containers.first().context("a container")?;
    let mut mounts = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let volume = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)
            .with_context(|| format!("volume {}", mount.name))?;
        let local = dir.join("volumes").join(&volume.name);
        std::fs::create_dir_all(&local)?;
        let files: BTreeMap<String, Vec<u8>> = if let Some(secret) = &volume.secret {
            let name = secret.secret_name.clone().unwrap_or_default();
            match Api::<Secret>::namespaced(client.clone(), namespace).get_opt(&name).await? {
                Some(s) => s.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect(),
                // The kubelet waits for a Secret that does not exist yet; so does the pod.
                None => return Err(anyhow!("pod {}: Secret {name} does not exist yet", pod.name_any())),
            }
        } else if let Some(map) = &volume.config_map {
            let name = map.name.clone();
            let found = Api::<ConfigMap>::namespaced(client.clone(), namespace).get_opt(&name).await?;
            found.and_then(|m| m.data).unwrap_or_default().into_iter().map(|(k, v)| (k, v.into_bytes())).collect()
        } else {
            BTreeMap::new()
        };
        for (key, content) in files {
            let path = local.join(&key);
            if std::fs::read(&path).ok().as_deref() != Some(content.as_slice()) {
                let tmp = local.join(format!(".{key}.tmp"));
                std::fs::write(&tmp, &content)?;
                std::fs::rename(&tmp, &path)?;
            }
        }
        mounts.push((mount.mount_path.clone(), local));
    }
    Ok(mounts)
}

/// Starts the pod's process: its arguments with mount paths and ports made local, its
/// downward-API environment, and a kubeconfig with a token of its ServiceAccount.
async fn start(
    cluster: &TestCluster,
    client: &Client,
    namespace: &str,
    pod: &Pod,
    dir: &Path,
    mounts: &[(String, PathBuf)],
) -> Result<PodProcess> {
    let spec = pod.spec.as_ref().context("pod spec")?;
    let container = spec.containers.first().context("a container")?;
    let mut ports = BTreeMap::new();
    let mut by_number = BTreeMap::new();
    for port in container.ports.iter().flatten() {
        let local = free_port()?;
        ports.insert(port.name.clone().unwrap_or_default(), local);
        by_number.insert(port.container_port, local);
    }
    let args: Vec<String> = container
        .args
        .iter()
        .flatten()
        .map(|arg| {
            let mut arg = arg.clone();
            for (mount, local) in mounts {
                arg = arg.replace(mount.as_str(), &local.to_string_lossy());
            }
            // `--x-bind-address=0.0.0.0:PORT`: the pod's port, on 127.0.0.1.
            if let Some((flag, address)) = arg.split_once("-bind-address=")
                && let Some(port) = address.rsplit_once(':').and_then(|(_, p)| p.parse::<i32>().ok())
                && let Some(local) = by_number.get(&port)
            {
                arg = format!("{flag}-bind-address=127.0.0.1:{local}");
            }
            arg
        })
        .collect();
    let service_account = spec.service_account_name.clone().unwrap_or_else(|| "default".into());
    let kubeconfig = dir.join("kubeconfig");
    write_kubeconfig(cluster, client, namespace, &service_account, pod, &kubeconfig).await?;
    let log = dir.join("controller.log");
    let out = std::fs::File::create(&log)?;
    let mut cmd = Command::new(workspace_binary("sked-controller", "SKED_CONTROLLER_BIN")?);
    cmd.args(&args)
        .env("KUBECONFIG", &kubeconfig)
        .env("POD_NAME", pod.name_any())
        .env("POD_NAMESPACE", namespace)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    let child = crate::cluster::spawn(cmd).context("starting sked-controller for a pod")?;
    Ok(PodProcess { pod: pod.name_any(), uid: pod.uid().unwrap_or_default(), ports, log, child, stopping: None })
}

/// A kubeconfig for the test API server with a token of `service_account`, bound to `pod`
/// (as the kubelet projects it).
async fn write_kubeconfig(
    cluster: &TestCluster,
    client: &Client,
    namespace: &str,
    service_account: &str,
    pod: &Pod,
    path: &Path,
) -> Result<()> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        metadata: Default::default(),
        spec: Some(TokenRequestSpec {
            audiences: None,
            bound_object_ref: Some(k8s_openapi::api::authentication::v1::BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name_any()),
                uid: pod.uid(),
            }),
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        status: None,
    };
    let issued = accounts
        .create_token_request(service_account, &PostParams::default(), &request)
        .await
        .with_context(|| format!("a token for ServiceAccount {namespace}/{service_account}"))?;
    let token = issued.status.map(|s| s.token).context("TokenRequest returned no token")?;
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {
            "server": cluster.server,
            "certificate-authority": cluster.dir.join("ca.crt"),
        }}],
        "users": [{"name": service_account, "user": {"token": token}}],
        "contexts": [{"name": "pod", "context": {"cluster": "test", "user": service_account, "namespace": namespace}}],
        "current-context": "pod",
    });
    std::fs::write(path, serde_json::to_vec_pretty(&config)?)?;
    Ok(())
}

/// (slice name, service, port name, local port) for every running pod and route.
type Route = (String, String, String, u16);

fn wanted_routes(pods: &Mutex<Vec<PodProcess>>, routes: &[(String, String)]) -> Vec<Route> {
    let mut pods = pods.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut wanted = Vec::new();
    for pod in pods.iter_mut() {
        if !pod.running() {
            continue;
        }
        for (service, port_name) in routes {
            if let Some(port) = pod.ports.get(port_name) {
                wanted.push((format!("{service}-{}", pod.pod), service.clone(), port_name.clone(), *port));
            }
        }
    }
    wanted.sort();
    wanted
}

/// Routes the API server's calls to each service to the pods' local ports: one EndpointSlice
/// per pod, `127.0.0.1` as an FQDN address (the API server refuses loopback IPs in endpoints;
/// with `--enable-aggregator-routing` it dials what the slice names). Slices of pods that are
/// gone are deleted.
async fn route(client: &Client, namespace: &str, wanted: &[Route]) -> Result<()> {
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> = Api::namespaced(client.clone(), namespace);
    let ours = ListParams::default().labels("endpointslice.kubernetes.io/managed-by=sked-tests");
    for slice in slices.list(&ours).await? {
        if !wanted.iter().any(|(name, ..)| Some(name) == slice.metadata.name.as_ref()) {
            slices.delete(&slice.name_any(), &Default::default()).await?;
        }
    }
    for (name, service, port_name, port) in wanted {
        let slice = json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "sked-tests",
            }},
            "addressType": "FQDN",
            "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
        });
        slices.patch(name, &PatchParams::apply("sked-tests").force(), &Patch::Apply(&slice)).await?;
    }
    Ok(())
}
