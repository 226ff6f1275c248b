//! The CA agents trust for the reports server, published from the serving Secret: with
//! `--reports-ca-file` (the chart passes the `ca.crt` of the mounted reports Secret when no
//! `reports.tls.caBundle` is given), the leader keeps `ca.crt` of the reports CA ConfigMap in the
//! workload namespace equal to that file, across cert-manager renewals, without a restart. It
//! writes only when the file's content differs from the ConfigMap's.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::json;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::workload::FIELD_MANAGER;

/// How often the file is checked for a change (as the serving certificates are).
const CHECK_EVERY: Duration = Duration::from_secs(2);
/// How often the ConfigMap is read again, to restore a `ca.crt` someone else changed.
const RECHECK_EVERY: Duration = Duration::from_secs(300);
/// The key agents read.
pub const CA_KEY: &str = "ca.crt";

/// The PEM text of `file` when it holds at least one certificate and nothing that fails to
/// parse; otherwise what is wrong, naming the file and the fix.
pub fn read_ca(file: &Path) -> Result<String, String> {
    let fix = "the reports Secret must carry ca.crt (cert-manager's CA and self-signed issuers write it), \
               or give the CA in the chart value reports.tls.caBundle";
    let pem = std::fs::read_to_string(file)
        .map_err(|e| format!("reading {} (--reports-ca-file): {e}; {fix}", file.display()))?;
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(pem.as_bytes()).collect();
    match certs {
        Ok(certs) if !certs.is_empty() => Ok(pem),
        Ok(_) => Err(format!("{} (--reports-ca-file) holds no PEM certificate; {fix}", file.display())),
        Err(e) => Err(format!("{} (--reports-ca-file) is not PEM certificates: {e}; {fix}", file.display())),
    }
}

/// Where the CA goes, and where it comes from.
pub struct Publication {
    pub file: PathBuf,
    pub namespace: String,
    pub configmap: String,
}

/// Keeps the ConfigMap's `ca.crt` equal to the file while this replica leads, until the
/// leadership channel closes. Problems are logged once each, with the fix, and retried.
pub async fn keep_published(client: Client, what: Publication, mut leader: watch::Receiver<bool>) {
    let api: Api<ConfigMap> = Api::namespaced(client, &what.namespace);
    // What this replica knows the ConfigMap holds, from its last read or write in this term.
    let mut published: Option<String> = None;
    let mut stamp: Option<SystemTime> = None;
    let mut checked = tokio::time::Instant::now();
    let mut last_problem = String::new();
    loop {
        let leading = *leader.borrow_and_update();
        if !leading || checked.elapsed() >= RECHECK_EVERY {
            published = None;
        }
        if leading {
            let now = std::fs::metadata(&what.file).and_then(|m| m.modified()).ok();
            if published.is_none() || now != stamp {
                stamp = now;
                match publish(&api, &what, published.as_deref()).await {
                    Ok(pem) => {
                        published = Some(pem);
                        checked = tokio::time::Instant::now();
                        last_problem.clear();
                    }
                    Err(problem) => {
                        if problem != last_problem {
                            warn!(configmap = %what.configmap, namespace = %what.namespace, err = %problem, "cannot publish the reports CA for the agents; retrying");
                            last_problem = problem;
                        }
                        // Read again on the next check.
                        stamp = None;
                    }
                }
            }
        }
        tokio::select! {
            changed = leader.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(CHECK_EVERY) => {}
        }
    }
}

/// Reads the file and, when the ConfigMap holds something else, writes it. Returns the PEM now
/// published.
async fn publish(api: &Api<ConfigMap>, what: &Publication, known: Option<&str>) -> Result<String, String> {
    let pem = read_ca(&what.file)?;
    if known == Some(pem.as_str()) {
        return Ok(pem);
    }
    let current = api.get(&what.configmap).await.map_err(|e| match e {
        kube::Error::Api(s) if s.code == 404 => format!(
            "ConfigMap {}/{} does not exist: the chart creates it; run helm upgrade to restore it",
            what.namespace, what.configmap
        ),
        e => format!("reading ConfigMap {}/{}: {e}", what.namespace, what.configmap),
    })?;
    if current.data.as_ref().and_then(|d| d.get(CA_KEY)) == Some(&pem) {
        return Ok(pem);
    }
    let patch = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": what.configmap, "namespace": what.namespace },
        "data": { CA_KEY: pem },
    });
    api.patch(&what.configmap, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
        .await
        .map_err(|e| format!("writing ca.crt of ConfigMap {}/{}: {e}", what.namespace, what.configmap))?;
    info!(configmap = %what.configmap, namespace = %what.namespace, source = %what.file.display(), "reports CA published for the agents");
    Ok(pem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pem_certificates_are_published_and_a_problem_names_the_fix() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("ca.crt");
        let missing = read_ca(&file).err().unwrap_or_default();
        assert!(missing.contains("--reports-ca-file") && missing.contains("reports.tls.caBundle"), "{missing}");
        std::fs::write(&file, "not a certificate")?;
        assert!(read_ca(&file).is_err_and(|e| e.contains("no PEM certificate")));
        let cert = rcgen::generate_simple_self_signed(vec!["sked-ca".into()])?;
        std::fs::write(&file, cert.cert.pem())?;
        assert_eq!(read_ca(&file)?, cert.cert.pem());
        Ok(())
    }
}
