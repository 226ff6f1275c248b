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

use sked_core::workload::FIELD_MANAGER;

/// How often the file is checked for a change (as the serving certificates are).
const CHECK_EVERY: Duration = Duration::from_secs(2);
/// How often the ConfigMap is read again, to restore a `ca.crt` someone else changed.
const RECHECK_EVERY: Duration = Duration::from_secs(300);
/// The key agents read.
pub const CA_KEY: &str = "ca.crt";

/// What to do when the CA file is not what agents can trust.
const FIX: &str = "the reports Secret must carry ca.crt (cert-manager's CA and self-signed issuers write it), \
                   or give the CA in the chart value reports.tls.caBundle";

/// Why the CA is not published, naming the file or the ConfigMap, and the fix.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("reading {} (--reports-ca-file): {source}; {FIX}", file.display())]
    Read { file: PathBuf, source: std::io::Error },
    #[error("{} (--reports-ca-file) holds no PEM certificate; {FIX}", file.display())]
    NoCertificate { file: PathBuf },
    #[error("{} (--reports-ca-file) is not PEM certificates: {source}; {FIX}", file.display())]
    NotPem { file: PathBuf, source: rustls::pki_types::pem::Error },
    #[error("ConfigMap {namespace}/{name} does not exist: the chart creates it; run helm upgrade to restore it")]
    NoConfigMap { namespace: String, name: String },
    #[error("reading ConfigMap {namespace}/{name}: {source}")]
    ReadConfigMap { namespace: String, name: String, source: kube::Error },
    #[error("writing ca.crt of ConfigMap {namespace}/{name}: {source}")]
    WriteConfigMap { namespace: String, name: String, source: kube::Error },
}

/// The PEM text of `file` when it holds at least one certificate and nothing that fails to
/// parse; otherwise what is wrong, naming the file and the fix.
pub fn read_ca(file: &Path) -> Result<String, CaError> {
    let pem = std::fs::read_to_string(file).map_err(|source| CaError::Read { file: file.to_owned(), source })?;
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(pem.as_bytes()).collect();
    match certs {
        Ok(certs) if !certs.is_empty() => Ok(pem),
        Ok(_) => Err(CaError::NoCertificate { file: file.to_owned() }),
        Err(source) => Err(CaError::NotPem { file: file.to_owned(), source }),
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
                        let problem = problem.to_string();
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
async fn publish(api: &Api<ConfigMap>, what: &Publication, known: Option<&str>) -> Result<String, CaError> {
    let pem = read_ca(&what.file)?;
    if known == Some(pem.as_str()) {
        return Ok(pem);
    }
    let (namespace, name) = (what.namespace.clone(), what.configmap.clone());
    let current = api.get(&what.configmap).await.map_err(|e| match e {
        kube::Error::Api(s) if s.code == 404 => {
            CaError::NoConfigMap { namespace: namespace.clone(), name: name.clone() }
        }
        source => CaError::ReadConfigMap { namespace: namespace.clone(), name: name.clone(), source },
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
        .map_err(|source| CaError::WriteConfigMap { namespace, name, source })?;
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
        let missing = read_ca(&file).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(missing.contains("--reports-ca-file") && missing.contains("reports.tls.caBundle"), "{missing}");
        std::fs::write(&file, "not a certificate")?;
        assert!(
            read_ca(&file).is_err_and(
                |e| matches!(e, CaError::NoCertificate { .. }) && e.to_string().contains("no PEM certificate")
            )
        );
        let cert = rcgen::generate_simple_self_signed(vec!["sked-ca".into()])?;
        std::fs::write(&file, cert.cert.pem())?;
        assert_eq!(read_ca(&file)?, cert.cert.pem());
        Ok(())
    }
}
