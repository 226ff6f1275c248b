//! A real cert-manager against a test cluster: its CRDs, controller, CA injector and webhook,
//! built from source at a pinned release with the other tools (`hack/build-tools.sh`), run as
//! processes of the cluster (they stop with it).

use std::process::Command;

use anyhow::{Context as _, Result, ensure};
use serde_json::json;

use crate::cluster::{TestCluster, free_port, tool, tools_dir};

impl TestCluster {
    /// Installs cert-manager's CRDs and starts its controller, CA injector and webhook (once
    /// per cluster; later calls find them running).
    pub fn start_cert_manager(&self) -> Result<()> {
        if self.launched("cert-manager-controller") {
            return Ok(());
        }
        // A symlink kubectl would read as a file: the directory it points at.
        let crds = tools_dir().join("cert-manager-crds").canonicalize().context("cert-manager's CRDs (make tools)")?;
        let crds = crds.to_string_lossy();
        let out = self.kubectl(&["apply", "--server-side", "--field-manager=sked-tests", "-f", &crds])?;
        ensure!(out.status.success(), "installing cert-manager's CRDs: {}", String::from_utf8_lossy(&out.stderr));
        let out = self.kubectl(&["wait", "--for=condition=Established", "--timeout=60s", "-f", &crds])?;
        ensure!(out.status.success(), "cert-manager's CRDs: {}", String::from_utf8_lossy(&out.stderr));

        let kubeconfig = format!("--kubeconfig={}", self.kubeconfig.display());
        let mut controller = Command::new(tool("cert-manager-controller")?);
        controller.args([
            &kubeconfig,
            "--leader-elect=false",
            "--cluster-resource-namespace=kube-system",
            &format!("--metrics-listen-address=127.0.0.1:{}", free_port()?),
        ]);
        self.launch("cert-manager-controller", controller).context("starting cert-manager's controller")?;
        let mut cainjector = Command::new(tool("cert-manager-cainjector")?);
        // Its --kubeconfig is not read (controller-runtime's client config is): the variable is.
        cainjector.env("KUBECONFIG", &self.kubeconfig).args([&kubeconfig, "--leader-elect=false"]);
        self.launch("cert-manager-cainjector", cainjector).context("starting cert-manager's CA injector")?;

        // Its webhook, with the serving CA it makes itself, called at localhost (as the
        // cert-manager chart registers it, but by URL: there is no kube-proxy here).
        let port = free_port()?;
        let mut webhook = Command::new(tool("cert-manager-webhook")?);
        webhook.args([
            &kubeconfig,
            &format!("--secure-port={port}"),
            "--dynamic-serving-ca-secret-namespace=kube-system",
            "--dynamic-serving-ca-secret-name=cert-manager-webhook-ca",
            "--dynamic-serving-dns-names=localhost",
            &format!("--healthz-port={}", free_port()?),
        ]);
        self.launch("cert-manager-webhook", webhook).context("starting cert-manager's webhook")?;
        let configs = self.dir.join("cert-manager-webhooks.yaml");
        std::fs::write(&configs, webhook_configurations(port))?;
        let out =
            self.kubectl(&["apply", "--server-side", "--field-manager=sked-tests", "-f", &configs.to_string_lossy()])?;
        ensure!(out.status.success(), "registering cert-manager's webhook: {}", String::from_utf8_lossy(&out.stderr));
        // Until the CA injector fills the caBundles and the webhook serves its certificate,
        // nothing of cert-manager's can be written: wait until a dry run of an Issuer passes.
        let probe = self.dir.join("cert-manager-probe.yaml");
        std::fs::write(
            &probe,
            "apiVersion: cert-manager.io/v1\nkind: Issuer\nmetadata: {name: probe, namespace: default}\nspec: {selfSigned: {}}\n",
        )?;
        let deadline = std::time::Instant::now() + crate::DEADLINE;
        loop {
            let out = self.kubectl(&["create", "--dry-run=server", "-f", &probe.to_string_lossy()])?;
            if out.status.success() {
                return Ok(());
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "cert-manager's webhook does not answer: {}\n{}\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.log_tail("cert-manager-webhook", 20),
                self.log_tail("cert-manager-cainjector", 20)
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// Asks cert-manager to issue `certificate` again now, as `cmctl renew` does: an Issuing
    /// condition on its status.
    pub fn renew_certificate(&self, namespace: &str, certificate: &str) -> Result<()> {
        let now = jiff::Timestamp::now().to_string();
        let patch = json!({"status": {"conditions": [{
            "type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
            "message": "renewal asked for by the test", "lastTransitionTime": now,
        }]}});
        let out = self.kubectl(&[
            "patch",
            "certificate",
            certificate,
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch.to_string(),
        ])?;
        ensure!(out.status.success(), "renewing {namespace}/{certificate}: {}", String::from_utf8_lossy(&out.stderr));
        Ok(())
    }
}

/// cert-manager's webhook configurations, as its chart makes them (validation and defaulting
/// of cert-manager's own resources), calling the webhook at `localhost:port`.
fn webhook_configurations(port: u16) -> String {
    let hook = |kind: &str, path: &str| {
        format!(
            "apiVersion: admissionregistration.k8s.io/v1
kind: {kind}
metadata:
  name: cert-manager-webhook
  annotations:
    cert-manager.io/inject-ca-from-secret: kube-system/cert-manager-webhook-ca
webhooks:
  - name: webhook.cert-manager.io
    admissionReviewVersions: [v1]
    sideEffects: None
    failurePolicy: Fail
    timeoutSeconds: 30
    matchPolicy: Equivalent
    rules:
      - apiGroups: [cert-manager.io, acme.cert-manager.io]
        apiVersions: [v1]
        operations: [CREATE, UPDATE]
        resources: ['*/*']
    clientConfig:
      url: https://localhost:{port}{path}
"
        )
    };
    format!(
        "{}---\n{}",
        hook("ValidatingWebhookConfiguration", "/validate"),
        hook("MutatingWebhookConfiguration", "/mutate")
    )
}
