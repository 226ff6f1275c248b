//! A `sked-controller` replica run as a process against the test cluster, under a user of its own
//! (its name), so the API server's audit log says which replica wrote what. The leader suite and
//! `make chaos` run two of them; the process can be killed, frozen (SIGSTOP) and thawed
//! (SIGCONT), and started again under the same name.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use serde_json::Value;

use crate::TestCluster;
use crate::agents::workspace_binary;
use crate::cluster::free_port;

/// The Lease the replicas of the test harness campaign for.
pub const LEASE: &str = "sked-controller-leader-test";

/// One controller replica.
pub struct ControllerProcess {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
    pub metrics: u16,
    /// Address of its admission webhook.
    pub webhook: std::net::SocketAddr,
}

impl ControllerProcess {
    /// Starts the replica `name` (files under `dir`) with the harness's defaults: the test
    /// Lease with a 4 s lease and a 1 s renew grace, an unsigned-image trust policy, a fast rate
    /// limit. `extra` adds flags (`--flag=value`); one replaces the default of the same flag.
    pub fn start(cluster: &TestCluster, dir: &Path, name: &str, extra: &[String]) -> Result<Self> {
        let log = dir.join(format!("{name}.log"));
        let metrics = free_port()?;
        let webhook = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let defaults = [
            format!("--leader-election-id={LEASE}"),
            "--leader-election-lease-duration=4s".to_owned(),
            "--leader-election-renew-grace=1s".to_owned(),
            "--reconcile-rate-limit-qps=100".to_owned(),
            format!("--metrics-bind-address=127.0.0.1:{metrics}"),
            format!("--trust-policy={}", crate::allow_unsigned_policy(dir)?.display()),
            format!("--webhook-bind-address={webhook}"),
            format!("--webhook-cert-dir={}", dir.join("webhook").display()),
        ];
        let flag = |arg: &str| arg.split('=').next().unwrap_or(arg).to_owned();
        let overridden: Vec<String> = extra.iter().map(|a| flag(a)).collect();
        let args = defaults.iter().filter(|a| !overridden.contains(&flag(a))).chain(extra);
        let log_file = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
        let child = Command::new(workspace_binary("sked-controller", "SKED_CONTROLLER_BIN")?)
            .env("KUBECONFIG", cluster.user_kubeconfig(name)?)
            .env("POD_NAME", name)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .context("starting sked-controller")?;
        Ok(Self { name: name.to_owned(), child, log, metrics, webhook })
    }

    /// The body of GET /metrics.
    pub fn scrape(&self) -> Result<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.metrics))?;
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        Ok(text)
    }

    /// The JSON log lines so far.
    pub fn lines(&self) -> Result<Vec<Value>> {
        let text = std::fs::read_to_string(&self.log)?;
        text.lines().map(|l| serde_json::from_str(l).with_context(|| format!("log line is not JSON: {l}"))).collect()
    }

    /// Log lines that record a write (a DaemonSet applied, or a state change saved).
    pub fn write_lines(&self) -> Result<Vec<Value>> {
        Ok(self
            .lines()?
            .into_iter()
            .filter(|v| matches!(v["msg"].as_str(), Some("applied DaemonSet" | "state changed")))
            .collect())
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: libc::c_int) -> Result<()> {
        let pid = libc::pid_t::try_from(self.child.id())?;
        // SAFETY: kill(2) on the pid of a child this handle owns and has not reaped.
        if unsafe { libc::kill(pid, signal) } != 0 {
            bail!("signal {signal} to {}: {}", self.name, std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Kills the process at once (SIGKILL) and reaps it.
    pub fn kill(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// Freezes the process (SIGSTOP): it holds its connections and does nothing.
    pub fn freeze(&self) -> Result<()> {
        self.signal(libc::SIGSTOP)
    }

    /// Thaws a frozen process (SIGCONT).
    pub fn thaw(&self) -> Result<()> {
        self.signal(libc::SIGCONT)
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes a webhook serving certificate into `dir/webhook`, where [`ControllerProcess::start`]
/// points the replicas (they share it); returns its CA.
pub fn webhook_cert(dir: &Path) -> Result<crate::pki::TestCa> {
    let ca = crate::pki::TestCa::new("sked webhook ca")?;
    let serving = ca.server("sked-webhook", &["localhost"], &["127.0.0.1"])?;
    std::fs::create_dir_all(dir.join("webhook"))?;
    std::fs::write(dir.join("webhook/tls.crt"), &serving.cert_pem)?;
    std::fs::write(dir.join("webhook/tls.key"), &serving.key_pem)?;
    Ok(ca)
}

/// Which replica holds the test Lease now, by its identity (the pod name, then a suffix).
pub async fn holder(client: &Client, namespace: &str) -> Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    Ok(leases.get_opt(LEASE).await?.and_then(|l| l.spec?.holder_identity))
}
