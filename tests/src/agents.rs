//! Running real `sked-agent` processes against fake sysfs roots, with tokens the API server
//! issues for the agent service account bound to the DaemonSet's own pods.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context as _, Result, anyhow, bail};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};

use crate::cluster::free_port;
use crate::pki::TestCa;

/// TLS material of a reports server: a CA and a serving certificate for localhost.
pub struct ReportsTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ReportsTls {
    pub fn generate(dir: &Path) -> Result<Self> {
        let ca = TestCa::new("sked-reports-test-ca")?;
        let server = ca.server("sked-reports", &["localhost"], &["127.0.0.1"])?;
        let out = Self { ca: dir.join("reports-ca.crt"), cert: dir.join("reports.crt"), key: dir.join("reports.key") };
        std::fs::write(&out.ca, ca.cert_pem())?;
        std::fs::write(&out.cert, &server.cert_pem)?;
        std::fs::write(&out.key, &server.key_pem)?;
        Ok(out)
    }

    /// Controller flags that serve agent reports on a free port of 127.0.0.1 with this pair, and
    /// the address agents dial (`https://localhost:<port>`).
    pub fn serving_flags(&self) -> Result<(sked_controller::config::ControllerFlags, String)> {
        let port = free_port()?;
        let flags = sked_controller::config::ControllerFlags {
            reports_bind_address: ([127, 0, 0, 1], port).into(),
            reports_cert_file: Some(self.cert.clone()),
            reports_key_file: Some(self.key.clone()),
            ..sked_controller::config::ControllerFlags::default()
        };
        Ok((flags, format!("https://localhost:{port}")))
    }

    /// Renews the serving pair as a certificate rotation would: a new CA, a new certificate
    /// and key swapped in with a rename. Returns the new CA (PEM).
    pub fn rotate(&self) -> Result<String> {
        let ca = TestCa::new("sked-reports-test-ca-2")?;
        let server = ca.server("sked-reports", &["localhost"], &["127.0.0.1"])?;
        for (path, pem) in [(&self.cert, &server.cert_pem), (&self.key, &server.key_pem)] {
            let tmp = path.with_extension("new");
            std::fs::write(&tmp, pem)?;
            std::fs::rename(&tmp, path)?;
        }
        Ok(ca.cert_pem().to_owned())
    }
}

/// Whether a TLS handshake with `address` succeeds when only `ca_pem` is trusted (as "localhost").
pub async fn tls_handshake(address: SocketAddr, ca_pem: &str) -> Result<()> {
    served_certificate(address, ca_pem, "localhost", &[b"h2"]).await.map(|_| ())
}

/// The leaf certificate `address` presents for `name` (offering `alpn`), verified against
/// `ca_pem` alone.
pub async fn served_certificate(address: SocketAddr, ca_pem: &str, name: &str, alpn: &[&[u8]]) -> Result<Vec<u8>> {
    let tls = tls_connect(address, ca_pem, name, alpn).await?;
    let leaf = tls.get_ref().1.peer_certificates().and_then(|c| c.first()).context("no certificate")?;
    Ok(leaf.as_ref().to_vec())
}

/// A TLS connection to `address` as `name` (offering `alpn`), trusting `ca_pem` alone.
pub async fn tls_connect(
    address: SocketAddr,
    ca_pem: &str,
    name: &str,
    alpn: &[&[u8]],
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(address).await?;
    Ok(connector.connect(rustls::pki_types::ServerName::try_from(name.to_owned())?, tcp).await?)
}

/// The `sked-agent` binary of this workspace (see [`workspace_binary`]).
pub fn agent_binary() -> Result<PathBuf> {
    workspace_binary("sked-agent", "SKED_AGENT_BIN")
}

/// A binary of this workspace, built on first use into the same target directory as the
/// running test or tool (so coverage runs instrument it too); `env` overrides the path.
pub fn workspace_binary(name: &'static str, env: &str) -> Result<PathBuf> {
    static BINS: std::sync::Mutex<Vec<(&'static str, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    if let Ok(path) = std::env::var(env) {
        return Ok(PathBuf::from(path));
    }
    let mut built = BINS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, path)) = built.iter().find(|(n, _)| *n == name) {
        return Ok(path.clone());
    }
    // <target>/debug/deps/<test binary>, or <target>/debug/<binary> for the demo.
    let exe = std::env::current_exe()?;
    let mut profile_dir = exe.parent().ok_or_else(|| anyhow!("unexpected binary location"))?;
    if profile_dir.file_name().is_some_and(|n| n == "deps") {
        profile_dir = profile_dir.parent().ok_or_else(|| anyhow!("unexpected binary location"))?;
    }
    let target_dir = profile_dir.parent().ok_or_else(|| anyhow!("unexpected binary location"))?;
    // The same profile as the caller (`make bench` runs a release build against release binaries).
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    // `--workspace`, as `make test` and CI build the binaries: the same features of shared
    // dependencies, so a binary built there is current here and this is a no-op (with `-p`
    // alone Cargo resolves other features and builds them again, for minutes, while the
    // caller's runtime waits on this call).
    let status = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "--workspace", "--bin", name])
        .args(release.then_some("--release"))
        .env("CARGO_TARGET_DIR", target_dir)
        .current_dir(crate::cluster::workspace_root())
        .status()
        .with_context(|| format!("running cargo build --bin {name}"))?;
    if !status.success() {
        bail!("cargo build --bin {name} failed");
    }
    let path = profile_dir.join(name);
    built.push((name, path.clone()));
    Ok(path)
}

/// A token for `service_account`, audience `sked-reports`, bound to `pod` when given.
pub async fn bound_token(client: &Client, namespace: &str, service_account: &str, pod: Option<&Pod>) -> Result<String> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        metadata: Default::default(),
        spec: Some(TokenRequestSpec {
            audiences: Some(vec!["sked-reports".into()]),
            bound_object_ref: pod.map(|pod| BoundObjectReference {
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
    let issued = api
        .create_token_request(service_account, &PostParams::default(), &request)
        .await
        .with_context(|| format!("requesting a token for {service_account}"))?;
    issued.status.and_then(|s| s.token).ok_or_else(|| anyhow!("TokenRequest returned no token"))
}

/// A copy of the service-account `token` whose lifetime ended an hour ago, signed with the
/// test cluster's service-account key as the API server signs: what an agent would present
/// after its kubelet stopped refreshing the projected token.
pub fn expired_copy(cluster: &crate::TestCluster, token: &str) -> Result<String> {
    use base64::Engine;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    let mut parts = token.split('.');
    let (Some(header), Some(payload)) = (parts.next(), parts.next()) else {
        return Err(anyhow!("not a JWT"));
    };
    let mut claims: serde_json::Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload)?)?;
    let now = jiff::Timestamp::now().as_second();
    claims["iat"] = serde_json::json!(now - 7200);
    claims["nbf"] = serde_json::json!(now - 7200);
    claims["exp"] = serde_json::json!(now - 3600);
    let signed = format!("{header}.{}", URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims)?));
    let pem = std::fs::read_to_string(cluster.dir.join("sa.key"))?;
    let der: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let key = aws_lc_rs::signature::EcdsaKeyPair::from_pkcs8(
        &aws_lc_rs::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
        &STANDARD.decode(der)?,
    )
    .map_err(|e| anyhow!("the service-account key: {e}"))?;
    let signature =
        key.sign(&aws_lc_rs::rand::SystemRandom::new(), signed.as_bytes()).map_err(|e| anyhow!("signing: {e}"))?;
    Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature.as_ref())))
}

/// A running agent process; killed when dropped.
pub struct AgentProcess {
    child: Child,
    pub node: String,
    pub sysfs: PathBuf,
    /// The agent's `--proc-root` (see [`write_health`]).
    proc_root: PathBuf,
    pub http: SocketAddr,
    pub log: PathBuf,
    /// The agent's kernel log: a pipe the test writes `/dev/kmsg` records into (held open for
    /// writing, so the agent never sees its end).
    kernel_log: std::fs::File,
    /// Where the agent asks the scheduler for its statistics (scx_stats): nothing serves there
    /// unless a test does ([`AgentProcess::serve_stats`]).
    pub stats_socket: PathBuf,
}

/// What an agent needs to run.
pub struct AgentSpec<'a> {
    pub dir: &'a Path,
    pub node: &'a str,
    pub pod: &'a str,
    pub scheduler: &'a str,
    pub expected_ops: Option<&'a str>,
    pub controller: &'a str,
    pub ca: &'a Path,
    /// The reports server's TLS name, when it is not the address's host.
    pub server_name: Option<&'a str>,
    /// Every controller replica (`host:port,...`), to hold a stream to each; `None`: the
    /// agent dials `controller` alone.
    pub replicas: Option<&'a str>,
    pub token: &'a str,
}

/// Where the agents of a test report: the reports server and the CA that signed it.
pub struct ReportsEndpoint<'a> {
    pub address: &'a str,
    pub ca: &'a Path,
    /// The server's TLS name, when it is not the address's host.
    pub server_name: Option<&'a str>,
    /// Every controller replica (`host:port,...`), to hold a stream to each.
    pub replicas: Option<&'a str>,
}

impl AgentProcess {
    /// The agent of `pod` (a Scheduler's pod on `node`), with a token bound to that pod, expecting
    /// the ops `rusty`.
    pub async fn for_pod(
        client: &Client,
        namespace: &str,
        dir: &Path,
        pod: &Pod,
        scheduler: &str,
        reports: &ReportsEndpoint<'_>,
    ) -> Result<Self> {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).ok_or_else(|| anyhow!("pod is not bound"))?;
        let token = bound_token(client, namespace, "sked-agent", Some(pod)).await?;
        Self::start(&AgentSpec {
            dir,
            node: &node,
            pod: &pod.name_any(),
            scheduler,
            expected_ops: Some("rusty"),
            controller: reports.address,
            ca: reports.ca,
            server_name: reports.server_name,
            replicas: reports.replicas,
            token: &token,
        })
    }

    /// Sets the fake kernel of `node`'s next agent under `dir` before it starts, so it never
    /// sees what its predecessor's kernel showed (a new pod's first report is about its own
    /// scheduler).
    pub fn preset_kernel(dir: &Path, node: &str, state: &str, ops: Option<&str>, enable_seq: u64) -> Result<()> {
        let sysfs = dir.join(format!("agent-{node}")).join("sys");
        sked_agent::sysfs::fixture::write(&sysfs, state, ops, enable_seq)?;
        Ok(())
    }

    pub fn start(spec: &AgentSpec<'_>) -> Result<Self> {
        let dir = spec.dir.join(format!("agent-{}", spec.node));
        let sysfs = dir.join("sys");
        let proc_root = dir.join("proc");
        std::fs::create_dir_all(&proc_root)?;
        // A restarted agent finds the kernel as its predecessor left it.
        if !sysfs.exists() {
            sked_agent::sysfs::fixture::write(&sysfs, "disabled", None, 0)?;
        }
        let token = dir.join("token");
        std::fs::write(&token, spec.token)?;
        let http = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let log = dir.join("agent.log");
        let kmsg = dir.join("kmsg");
        if !kmsg.exists() {
            crate::run_command(Command::new("mkfifo").arg(&kmsg))?;
        }
        // Read and write, so opening never waits for the agent, and the pipe never ends.
        let kernel_log = std::fs::OpenOptions::new().read(true).write(true).open(&kmsg)?;
        let mut cmd = Command::new(agent_binary()?);
        cmd.args(["--node-name", spec.node, "--pod-name", spec.pod, "--scheduler", spec.scheduler])
            .arg("--sysfs-root")
            .arg(&sysfs)
            .arg("--proc-root")
            .arg(&proc_root)
            .args(["--poll-interval", "200ms", "--uevents=false", "--heartbeat-interval", "1s"])
            .args(["--health-interval", "1s", "--pod-cpu-interval", "1s"])
            // A cgroup tree of its own (no kubepods unless a test writes a pod's cgroup there),
            // not the machine's.
            .arg("--cgroup-root")
            .arg(dir.join("cgroup"))
            .args(["--controller-address", spec.controller])
            .arg("--ca-file")
            .arg(spec.ca)
            .arg("--token-file")
            .arg(&token)
            .args(["--listen-address", &http.to_string(), "--log-format", "text"])
            .arg("--kernel-log")
            .arg(&kmsg)
            .env_remove("SKED_EXPECTED_OPS")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::File::create(dir.join("agent.err"))?);
        if let Some(ops) = spec.expected_ops {
            cmd.args(["--expected-ops", ops]);
        }
        if let Some(name) = spec.server_name {
            cmd.args(["--server-name", name]);
        }
        if let Some(replicas) = spec.replicas {
            cmd.args(["--controller-replicas", replicas]);
        }
        let stats_socket = dir.join("stats");
        cmd.arg("--stats-socket").arg(&stats_socket).args(["--stats-interval", "1s"]);
        let child = cmd.spawn().context("starting sked-agent")?;
        Ok(Self { child, node: spec.node.to_owned(), sysfs, proc_root, http, log, kernel_log, stats_socket })
    }

    /// Serves scx_stats on the agent's stats socket as a scheduler built on scx_utils does: the
    /// meta of one `Metrics` struct with `nr_running`, then `stats` with `nr_running` as given.
    /// For as long as the test's runtime runs.
    pub fn serve_stats(&self, nr_running: u64) -> Result<()> {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let _ = std::fs::remove_file(&self.stats_socket);
        let listener = tokio::net::UnixListener::bind(&self.stats_socket)?;
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (read, mut write) = stream.into_split();
                    let mut lines = tokio::io::BufReader::new(read).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        let reply = if line.contains("stats_meta") {
                            r#"{"errno":0,"args":{"resp":{"Metrics":{"name":"Metrics","top":"true","fields":{"nr_running":{"datum":"u64","desc":"Number of running tasks"}}}}}}"#.to_owned()
                        } else {
                            format!(r#"{{"errno":0,"args":{{"resp":{{"nr_running":{nr_running}}}}}}}"#)
                        };
                        if write.write_all(format!("{reply}\n").as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Ok(())
    }

    /// Logs `record` (a `/dev/kmsg` record: `PRI,SEQ,USEC,-;TEXT`) in the agent's kernel log.
    pub fn kernel_logs(&self, record: &str) -> Result<()> {
        use std::io::Write as _;
        (&self.kernel_log).write_all(format!("{record}\n").as_bytes())?;
        Ok(())
    }

    /// Makes the fake kernel show `state` with `ops` attached (or none).
    pub fn set_kernel(&self, state: &str, ops: Option<&str>, enable_seq: u64) -> Result<()> {
        sked_agent::sysfs::fixture::write(&self.sysfs, state, ops, enable_seq)?;
        Ok(())
    }

    /// GETs a path of the agent's HTTP server: (status code, body).
    pub fn get(&self, path: &str) -> Result<(u16, String)> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(self.http)?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: agent\r\n\r\n").as_bytes())?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| anyhow!("no HTTP status in {text:?}"))?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
        Ok((code, body))
    }

    /// The agent's fake proc root, where [`write_health`] puts its scheduling-health counters.
    pub fn proc_root(&self) -> &Path {
        &self.proc_root
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the process still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log.with_file_name("agent.err")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One CPU's cumulative `/proc/schedstat` counters, as [`write_health`] writes them (the last
/// three numbers of its `cpu<N>` line).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTime {
    /// Time tasks ran on the CPU, in nanoseconds.
    pub running_ns: u64,
    /// Time tasks waited on its run queue, in nanoseconds.
    pub run_delay_ns: u64,
    /// Timeslices run on it.
    pub timeslices: u64,
}

/// Writes stand-ins for `/proc/schedstat` (a `cpu<N>` line for each of the two CPUs of `cpus`,
/// version 17) and `/proc/pressure/cpu` (`pressure_total_us` in its `some` line) under
/// `proc_root`, each replaced by a rename so the agent never reads half a file. The counters are
/// cumulative, as the kernel's: an agent samples how much they grow per interval.
pub fn write_health(proc_root: &Path, cpus: &[CpuTime; 2], pressure_total_us: u64) -> Result<()> {
    let put = |path: PathBuf, body: String| -> Result<()> {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, body)?;
        std::fs::rename(&tmp, &path)?;
        Ok(())
    };
    std::fs::create_dir_all(proc_root.join("pressure"))?;
    let mut schedstat = String::from("version 17\ntimestamp 4295347006\n");
    for (n, cpu) in cpus.iter().enumerate() {
        let CpuTime { running_ns, run_delay_ns, timeslices } = cpu;
        schedstat.push_str(&format!("cpu{n} 0 0 0 0 0 0 {running_ns} {run_delay_ns} {timeslices}\n"));
    }
    put(proc_root.join("schedstat"), schedstat)?;
    put(
        proc_root.join("pressure/cpu"),
        format!(
            "some avg10=0.00 avg60=0.00 avg300=0.00 total={pressure_total_us}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
        ),
    )
}

/// Fails with the agent's log when it exited.
pub fn ensure_running(agent: &mut AgentProcess) -> Result<()> {
    if !agent.running() {
        bail!("agent for {} exited:\n{}", agent.node, agent.stderr_tail());
    }
    Ok(())
}

/// A flood of peers that stall inside their TLS ClientHello: `connections` connections to
/// `127.0.0.1:port`, spread over `sources` loopback addresses (127.0.3.1 on), each sending the
/// 5-byte header of a 512-byte handshake record and then nothing, and connecting again a
/// moment after the server closes it. It stops when the returned tasks are dropped.
pub fn stalled_hello_flood(port: u16, connections: usize, sources: usize) -> StalledHelloFlood {
    let tasks = (0..connections)
        .map(|i| {
            let source = std::net::Ipv4Addr::new(127, 0, 3, u8::try_from(1 + i % sources.clamp(1, 250)).unwrap_or(1));
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                loop {
                    let connected = async {
                        let socket = tokio::net::TcpSocket::new_v4()?;
                        socket.bind((source, 0).into())?;
                        socket.connect(([127, 0, 0, 1], port).into()).await
                    };
                    if let Ok(mut tcp) = connected.await
                        && tcp.write_all(b"\x16\x03\x01\x02\x00").await.is_ok()
                    {
                        let mut buf = [0u8; 16];
                        while matches!(tcp.read(&mut buf).await, Ok(n) if n > 0) {}
                    }
                    // A pause between, so the flood is its connections, not a busy loop.
                    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                }
            })
        })
        .collect();
    StalledHelloFlood { tasks }
}

/// The tasks of a [`stalled_hello_flood`]; dropping it ends the flood.
pub struct StalledHelloFlood {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for StalledHelloFlood {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}
