//! A real control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager (garbage
//! collector, DaemonSet, Deployment, ReplicaSet, disruption and ServiceAccount controllers) and
//! kube-scheduler, with random free ports and a temporary directory: the envtest way, but with
//! controllers running.
//!
//! Every process is started from one long-lived thread with `PR_SET_PDEATHSIG`, so the kernel
//! kills them when the test process exits for any reason; [`TestCluster`]'s `Drop` and an
//! `atexit` hook stop them and remove the directory on a normal exit, panics included.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use rcgen::KeyPair;

use crate::pki::TestCa;

/// Directory holding the pinned upstream binaries (built by `hack/build-tools.sh`).
pub fn tools_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("SKED_TOOLS_BIN") {
        return PathBuf::from(dir);
    }
    workspace_root().join(".tools/bin")
}

/// The repository root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

pub(crate) fn tool(name: &str) -> Result<PathBuf> {
    let path = tools_dir().join(name);
    if !path.exists() {
        bail!(
            "{} not found: run `hack/build-tools.sh` (or `make tools`) to build the pinned test binaries, or set SKED_TOOLS_BIN",
            path.display()
        );
    }
    Ok(path)
}

/// The API server's audit policy: every request that can change something (any verb but get,
/// list and watch), once, when its response is complete, without bodies.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n\
rules:\n- level: None\n  verbs: [get, list, watch]\n\
- level: RequestResponse\n  resources: [{group: coordination.k8s.io, resources: [leases]}]\n- level: Metadata\n";

/// The API server's audit log, in the cluster's directory.
const AUDIT_LOG: &str = "audit.log";

/// One write the API server served, from its audit log: who asked, what, and when it arrived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditedWrite {
    /// The authenticated user (a client certificate's common name, a service account).
    pub user: String,
    /// The request's verb as the audit log names it: create, update, patch, delete,
    /// deletecollection.
    pub verb: String,
    pub resource: String,
    /// Empty for the resource itself; `status` for its status.
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// The HTTP status code of the answer.
    pub code: u16,
    pub received: jiff::Timestamp,
    /// For a Lease, its holder once the write was done (`spec.holderIdentity` of the answer):
    /// a write may renew a Lease its writer no longer holds.
    pub holder: Option<String>,
}

impl AuditedWrite {
    /// `resource[/subresource] verb`, as the tests count writes.
    pub fn kind(&self) -> String {
        match self.subresource.as_str() {
            "" => format!("{} {}", self.resource, self.verb),
            sub => format!("{}/{sub} {}", self.resource, self.verb),
        }
    }

    /// Whether the write can change an object the cluster keeps: a request for a review
    /// (TokenReview, SubjectAccessReview) only asks a question.
    pub fn changes_state(&self) -> bool {
        !self.resource.ends_with("reviews")
    }

    fn parse(line: &str) -> Result<Self> {
        let v: serde_json::Value = serde_json::from_str(line).with_context(|| format!("audit line: {line}"))?;
        let text = |value: &serde_json::Value| value.as_str().unwrap_or_default().to_owned();
        let object = &v["objectRef"];
        Ok(Self {
            user: text(&v["user"]["username"]),
            verb: text(&v["verb"]),
            resource: text(&object["resource"]),
            subresource: text(&object["subresource"]),
            namespace: text(&object["namespace"]),
            name: text(&object["name"]),
            code: v["responseStatus"]["code"].as_u64().and_then(|c| u16::try_from(c).ok()).unwrap_or_default(),
            received: v["requestReceivedTimestamp"]
                .as_str()
                .context("an audit event without requestReceivedTimestamp")?
                .parse()?,
            holder: v["responseObject"]["spec"]["holderIdentity"].as_str().map(str::to_owned),
        })
    }
}

/// A running control plane.
pub struct TestCluster {
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub server: String,
    /// The CA of the API server's client certificates (and of its serving certificate).
    ca: TestCa,
    processes: Mutex<Vec<(String, Child)>>,
    /// Each component's program and arguments, to start it again as it was
    /// ([`TestCluster::restart`]).
    commands: Mutex<BTreeMap<String, (std::ffi::OsString, Vec<std::ffi::OsString>)>>,
}

static CLEANUP: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());

extern "C" fn cleanup_at_exit() {
    let entries = std::mem::take(&mut *CLEANUP.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    for (pid, dir) in entries {
        if pid != 0 {
            // SAFETY: plain kill(2) on a child pid we started.
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
        }
        if !dir.as_os_str().is_empty() {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

/// Spawns commands from one thread that lives as long as the process, so PDEATHSIG (which
/// follows the spawning *thread*) fires only when the test process itself goes away.
pub(crate) fn spawn(mut cmd: Command) -> std::io::Result<Child> {
    type Request = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    let tx = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("sked-test-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
                // The channel lives in a static and never closes; keep the thread for PDEATHSIG.
                loop {
                    std::thread::park();
                }
            })
            .ok();
        Mutex::new(tx)
    });
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let (reply_tx, reply_rx) = mpsc::channel();
    tx.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .send((cmd, reply_tx))
        .map_err(|_| std::io::Error::other("spawner thread is gone"))?;
    reply_rx.recv().map_err(|_| std::io::Error::other("spawner thread is gone"))?
}

/// A free TCP port on 127.0.0.1, never one this process was given before: the kernel may hand
/// out a port it just freed again, and two servers told the same port fail at start (a CI run
/// lost cert-manager's webhook to its own metrics server that way). Taken below the kernel's
/// ephemeral range (`net.ipv4.ip_local_port_range`, 32768 and up by default), from a random
/// start: a port the kernel hands out for `bind(0)` is also one it hands out as the source port
/// of an outgoing connection, and a suite running beside (`make test` runs two) opened one on
/// the port a controller was about to bind (a CI run lost a rollout test that way).
pub fn free_port() -> Result<u16> {
    const LOW: u16 = 20_000;
    const HIGH: u16 = 32_767;
    static GIVEN: Mutex<std::collections::BTreeSet<u16>> = Mutex::new(std::collections::BTreeSet::new());
    // A random start: std's hasher is seeded randomly per process.
    let seed = std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), std::process::id());
    let span = u64::from(HIGH - LOW) + 1;
    for i in 0..span {
        let port = LOW + u16::try_from((seed.wrapping_add(i.wrapping_mul(7919))) % span).unwrap_or(0);
        if GIVEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(&port) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            GIVEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(port);
            return Ok(port);
        }
    }
    bail!("no free TCP port on 127.0.0.1 between {LOW} and {HIGH} that this process was not given before")
}

struct Pki {
    ca: TestCa,
    ca_cert: String,
    serving_cert: String,
    serving_key: String,
    admin_cert: String,
    admin_key: String,
    sa_key: String,
    sa_pub: String,
}

fn make_pki() -> Result<Pki> {
    let ca = TestCa::new("sked-test-ca")?;
    let serving = ca.server("kube-apiserver", &["localhost", "kubernetes.default.svc"], &["127.0.0.1", "10.0.0.1"])?;
    let admin = ca.client("sked-test-admin", "system:masters")?;
    let sa = KeyPair::generate()?;
    Ok(Pki {
        ca_cert: ca.cert_pem().to_owned(),
        ca,
        serving_cert: serving.cert_pem,
        serving_key: serving.key_pem,
        admin_cert: admin.cert_pem,
        admin_key: admin.key_pem,
        sa_key: sa.serialize_pem(),
        sa_pub: sa.public_key_pem(),
    })
}

impl TestCluster {
    /// Starts etcd, kube-apiserver and kube-controller-manager and waits until the API server
    /// is ready. Blocking; call it outside an async context or from `spawn_blocking`.
    pub fn start() -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("sked-cluster-").tempdir()?.keep();
        CLEANUP.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((0, dir.clone()));
        static ATEXIT: OnceLock<()> = OnceLock::new();
        ATEXIT.get_or_init(|| {
            // SAFETY: registers a plain extern "C" function.
            unsafe {
                libc::atexit(cleanup_at_exit);
            }
        });

        let pki = make_pki()?;
        let write = |name: &str, body: &str| -> Result<PathBuf> {
            let p = dir.join(name);
            fs::write(&p, body)?;
            Ok(p)
        };
        let ca = write("ca.crt", &pki.ca_cert)?;
        let tls_cert = write("apiserver.crt", &pki.serving_cert)?;
        let tls_key = write("apiserver.key", &pki.serving_key)?;
        let admin_cert = write("admin.crt", &pki.admin_cert)?;
        let admin_key = write("admin.key", &pki.admin_key)?;
        let sa_key = write("sa.key", &pki.sa_key)?;
        let sa_pub = write("sa.pub", &pki.sa_pub)?;
        let audit_policy = write("audit-policy.yaml", AUDIT_POLICY)?;

        let mut cluster = TestCluster {
            kubeconfig: dir.join("kubeconfig"),
            server: String::new(),
            dir: dir.clone(),
            ca: pki.ca,
            processes: Mutex::new(Vec::new()),
            commands: Mutex::new(BTreeMap::new()),
        };

        // etcd
        let etcd_port = free_port()?;
        let peer_port = free_port()?;
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut etcd = Command::new(tool("etcd")?);
        etcd.args([
            "--name=default",
            &format!("--data-dir={}", dir.join("etcd").display()),
            &format!("--listen-client-urls={etcd_url}"),
            &format!("--advertise-client-urls={etcd_url}"),
            &format!("--listen-peer-urls={peer_url}"),
            &format!("--initial-advertise-peer-urls={peer_url}"),
            &format!("--initial-cluster=default={peer_url}"),
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]);
        cluster.launch("etcd", etcd)?;
        cluster.wait_until("etcd", Duration::from_secs(30), || http_get_ok(etcd_port, "/health"))?;

        // kube-apiserver
        let api_port = free_port()?;
        let mut apiserver = Command::new(tool("kube-apiserver")?);
        apiserver.args([
            &format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            &format!("--secure-port={api_port}"),
            &format!("--cert-dir={}", dir.join("certs").display()),
            &format!("--tls-cert-file={}", tls_cert.display()),
            &format!("--tls-private-key-file={}", tls_key.display()),
            &format!("--client-ca-file={}", ca.display()),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            &format!("--service-account-key-file={}", sa_pub.display()),
            &format!("--service-account-signing-key-file={}", sa_key.display()),
            "--service-cluster-ip-range=10.0.0.0/24",
            // The Node authorizer and NodeRestriction, as a kubeadm cluster has them: a kubelet
            // (the real node's, make test-node) reads and writes only what its pods need.
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            "--enable-priority-and-fairness=false",
            "--endpoint-reconciler-type=none",
            // Service-referenced webhooks are dialled at the address an EndpointSlice names
            // (see controller_pods::route_service); there is no kube-proxy for cluster IPs.
            "--enable-aggregator-routing=true",
            // Every write, by whom (see `TestCluster::audited_writes`).
            &format!("--audit-policy-file={}", audit_policy.display()),
            &format!("--audit-log-path={}", dir.join(AUDIT_LOG).display()),
            "--audit-log-maxsize=0",
            "--v=0",
        ]);
        cluster.launch("kube-apiserver", apiserver)?;
        cluster.server = format!("https://127.0.0.1:{api_port}");

        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sked-test\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
             users:\n- name: admin\n  user:\n    client-certificate: {cert}\n    client-key: {key}\n\
             contexts:\n- name: sked-test\n  context:\n    cluster: sked-test\n    user: admin\ncurrent-context: sked-test\n",
            server = cluster.server,
            ca = ca.display(),
            cert = admin_cert.display(),
            key = admin_key.display(),
        );
        fs::write(&cluster.kubeconfig, kubeconfig)?;
        cluster.wait_until("kube-apiserver", Duration::from_secs(90), || cluster.apiserver_ready())?;

        // The CRDs go in before kube-controller-manager starts: its garbage collector learns
        // about new resource types only through discovery every 30 seconds.
        let crds = workspace_root().join("crds");
        let out = Command::new(tool("kubectl")?)
            .env("KUBECONFIG", &cluster.kubeconfig)
            .args(["apply", "--server-side", "--field-manager=sked-tests", "-f"])
            .arg(&crds)
            .output()?;
        if !out.status.success() {
            bail!("installing {}: {}", crds.display(), String::from_utf8_lossy(&out.stderr));
        }

        // kube-controller-manager: only what sked's behaviour depends on.
        let kcm_port = free_port()?;
        let mut kcm = Command::new(tool("kube-controller-manager")?);
        kcm.args([
            &format!("--kubeconfig={}", cluster.kubeconfig.display()),
            &format!("--authentication-kubeconfig={}", cluster.kubeconfig.display()),
            &format!("--authorization-kubeconfig={}", cluster.kubeconfig.display()),
            "--controllers=garbagecollector,daemonset,deployment,replicaset,disruption,serviceaccount,serviceaccount-token",
            &format!("--service-account-private-key-file={}", sa_key.display()),
            &format!("--root-ca-file={}", ca.display()),
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            &format!("--secure-port={kcm_port}"),
            "--concurrent-daemonset-syncs=4",
            // A fleet's worth of DaemonSet pods is created without client-side throttling.
            "--kube-api-qps=1000",
            "--kube-api-burst=2000",
            "--v=0",
        ]);
        cluster.launch("kube-controller-manager", kcm)?;

        // kube-scheduler binds pods to nodes, so the DaemonSet controller sees them per node.
        let sched_port = free_port()?;
        let mut scheduler = Command::new(tool("kube-scheduler")?);
        scheduler.args([
            &format!("--kubeconfig={}", cluster.kubeconfig.display()),
            &format!("--authentication-kubeconfig={}", cluster.kubeconfig.display()),
            &format!("--authorization-kubeconfig={}", cluster.kubeconfig.display()),
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            &format!("--secure-port={sched_port}"),
            "--kube-api-qps=1000",
            "--kube-api-burst=2000",
            "--v=0",
        ]);
        cluster.launch("kube-scheduler", scheduler)?;
        cluster.wait_until("kube-controller-manager", Duration::from_secs(60), || {
            TcpStream::connect(("127.0.0.1", kcm_port)).is_ok()
        })?;
        cluster.wait_until("kube-scheduler", Duration::from_secs(60), || {
            TcpStream::connect(("127.0.0.1", sched_port)).is_ok()
        })?;
        Ok(cluster)
    }

    /// Stops the component `name` (SIGKILL), keeps it down for `down_for`, and starts it again
    /// as it was (same ports, same etcd data; its log and the audit log appended to). For
    /// kube-apiserver it returns once the API server is ready again. Blocking. Its clients see
    /// their connections reset and their watches end, as in a crash or an upgrade.
    pub fn restart(&self, name: &str, down_for: Duration) -> Result<()> {
        let (program, args) = self
            .commands
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(name)
            .cloned()
            .ok_or_else(|| anyhow!("no component {name} was started"))?;
        {
            let mut processes = self.processes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(i) = processes.iter().position(|(n, _)| n == name) {
                let (_, mut child) = processes.remove(i);
                child.kill()?;
                child.wait()?;
            }
        }
        // The fault's length, not a wait for anything.
        std::thread::sleep(down_for);
        let mut cmd = Command::new(program);
        cmd.args(args);
        self.launch(name, cmd)?;
        if name != "kube-apiserver" {
            return Ok(());
        }
        self.wait_until(name, Duration::from_secs(90), || self.apiserver_ready())
    }

    /// Whether kube-apiserver answers its readiness check (`kubectl get --raw /readyz`).
    fn apiserver_ready(&self) -> bool {
        Command::new(tool("kubectl").unwrap_or_default())
            .env("KUBECONFIG", &self.kubeconfig)
            .args(["get", "--raw", "/readyz"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    pub(crate) fn launch(&self, name: &str, mut cmd: Command) -> Result<()> {
        let recorded = (cmd.get_program().to_owned(), cmd.get_args().map(ToOwned::to_owned).collect());
        self.commands.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(name.to_owned(), recorded);
        // Appended: a component started again (kube-apiserver after a restart) keeps its history.
        let log = fs::OpenOptions::new().create(true).append(true).open(self.dir.join(format!("{name}.log")))?;
        cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
        let child = spawn(cmd).with_context(|| format!("starting {name}"))?;
        CLEANUP.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((child.id(), PathBuf::new()));
        self.processes.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((name.to_owned(), child));
        Ok(())
    }

    /// Polls `ready` until it holds, failing early (with the log tail) if `name` exited.
    fn wait_until(&self, name: &str, timeout: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if ready() {
                return Ok(());
            }
            if let Some(status) = self.exited(name) {
                bail!("{name} exited with {status} during startup:\n{}", self.log_tail(name, 40));
            }
            if Instant::now() > deadline {
                bail!("{name} not ready after {timeout:?}:\n{}", self.log_tail(name, 40));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Whether a component named `name` was started (it may have exited since).
    pub(crate) fn launched(&self, name: &str) -> bool {
        self.processes.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().any(|(n, _)| n == name)
    }

    fn exited(&self, name: &str) -> Option<std::process::ExitStatus> {
        let mut procs = self.processes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        procs.iter_mut().find(|(n, _)| n == name).and_then(|(_, c)| c.try_wait().ok().flatten())
    }

    /// The last `lines` lines of a component's log.
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let Ok(f) = File::open(self.dir.join(format!("{name}.log"))) else { return String::new() };
        let all: Vec<String> = BufReader::new(f).lines().map_while(Result::ok).collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// A client certificate of the kubelet of Node `node` (user `system:node:<node>`, group
    /// `system:nodes`).
    pub fn node_credentials(&self, node: &str) -> Result<crate::pki::IssuedCert> {
        self.ca.client(&format!("system:node:{node}"), "system:nodes")
    }

    /// A kubeconfig for a user of its own, `user` in group system:masters (full access): the
    /// audit log tells its requests from every other client's.
    pub fn user_kubeconfig(&self, user: &str) -> Result<PathBuf> {
        let issued = self.ca.client(user, "system:masters")?;
        let (cert, key) = (self.dir.join(format!("{user}.crt")), self.dir.join(format!("{user}.key")));
        fs::write(&cert, &issued.cert_pem)?;
        fs::write(&key, &issued.key_pem)?;
        let admin = fs::read_to_string(&self.kubeconfig)?;
        let own = admin
            .replace(&self.dir.join("admin.crt").display().to_string(), &cert.display().to_string())
            .replace(&self.dir.join("admin.key").display().to_string(), &key.display().to_string());
        let path = self.dir.join(format!("{user}.kubeconfig"));
        fs::write(&path, own)?;
        Ok(path)
    }

    /// Every write the API server has answered so far, from its audit log, in order of arrival.
    /// A write is logged once its response is complete: read after the requests of interest
    /// were answered.
    pub fn audited_writes(&self) -> Result<Vec<AuditedWrite>> {
        let text = fs::read_to_string(self.dir.join(AUDIT_LOG))?;
        // A line the API server is still writing (no newline yet) is left for the next read.
        let complete = text.rfind('\n').map_or("", |end| &text[..end]);
        let mut writes: Vec<AuditedWrite> =
            complete.lines().filter(|l| !l.trim().is_empty()).map(AuditedWrite::parse).collect::<Result<_>>()?;
        writes.sort_by_key(|w| w.received);
        Ok(writes)
    }

    /// A client for the admin user.
    pub async fn client(&self) -> Result<kube::Client> {
        client_of(&self.kubeconfig).await
    }

    /// Runs the pinned helm against this cluster, with its caches and config in the cluster's
    /// directory.
    pub fn helm(&self, args: &[&str]) -> Result<std::process::Output> {
        Command::new(tool("helm")?)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", self.dir.join("helm/cache"))
            .env("HELM_CONFIG_HOME", self.dir.join("helm/config"))
            .env("HELM_DATA_HOME", self.dir.join("helm/data"))
            .args(args)
            .output()
            .map_err(|e| anyhow!("running helm: {e}"))
    }

    /// `helm install sked CHART --namespace NAMESPACE --create-namespace --wait --timeout 5m`, the
    /// chart README's command, with `extra` arguments (values) before the waiting ones.
    pub fn helm_install(&self, chart: &str, namespace: &str, extra: &[&str]) -> Result<std::process::Output> {
        let mut args = vec!["install", "sked", chart, "--namespace", namespace, "--create-namespace"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--wait", "--timeout", "5m"]);
        self.helm(&args)
    }

    /// Runs the pinned kubectl against this cluster.
    pub fn kubectl(&self, args: &[&str]) -> Result<std::process::Output> {
        Command::new(tool("kubectl")?)
            .env("KUBECONFIG", &self.kubeconfig)
            .args(args)
            .output()
            .map_err(|e| anyhow!("running kubectl: {e}"))
    }

    /// Requests the API server has served so far, by (resource, subresource, verb), from its
    /// own `apiserver_request_total` metric.
    pub fn apiserver_requests(&self) -> Result<BTreeMap<(String, String, String), u64>> {
        let out = self.kubectl(&["get", "--raw", "/metrics"])?;
        anyhow::ensure!(out.status.success(), "kubectl get --raw /metrics: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        let mut requests = BTreeMap::new();
        for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
            let Some((labels, value)) = line.rsplit_once(' ') else { continue };
            let label = |name: &str| {
                labels
                    .split(&format!("{name}=\""))
                    .nth(1)
                    .and_then(|rest| rest.split('"').next())
                    .unwrap_or_default()
                    .to_owned()
            };
            let count: f64 = value.parse().unwrap_or(0.0);
            *requests.entry((label("resource"), label("subresource"), label("verb"))).or_insert(0) += count as u64;
        }
        Ok(requests)
    }

    fn stop(&self) {
        let mut procs = self.processes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Reverse start order: controllers first, etcd last.
        while let Some((_, mut child)) = procs.pop() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        self.stop();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A client for the user and cluster of the kubeconfig at `path`.
pub async fn client_of(path: &Path) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(path)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// A plain HTTP/1.0 GET on 127.0.0.1 that succeeds on a 200 answer.
fn http_get_ok(port: u16, path: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).is_err() {
        return false;
    }
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    buf.starts_with("HTTP/1.0 200") || buf.starts_with("HTTP/1.1 200")
}
