//! Serving certificates that follow their files: cert-manager (or whoever rotates the mounted
//! Secret) renews them, and the servers pick the new pair up without a restart. Used by the
//! reports server and the admission webhook.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::mutex::lock;

/// How often the files are checked for a change.
const CHECK_EVERY: Duration = Duration::from_secs(2);

/// Why a certificate pair does not load, naming the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("reading certificates from {}: {source}", file.display())]
    Certificates { file: PathBuf, source: rustls::pki_types::pem::Error },
    #[error("{} holds no PEM certificate", file.display())]
    NoCertificate { file: PathBuf },
    #[error("reading the private key from {}: {source}", file.display())]
    Key { file: PathBuf, source: rustls::pki_types::pem::Error },
    #[error("{} and {} do not make a usable pair: {source}", cert.display(), key.display())]
    Pair { cert: PathBuf, key: PathBuf, source: rustls::Error },
    #[error("TLS configuration: {0}")]
    Config(rustls::Error),
}

/// A certificate and key loaded from PEM files, replaced when the files change.
#[derive(Debug)]
pub struct ReloadingCert {
    cert_file: PathBuf,
    key_file: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    /// Modification times of the files when `current` was read from them.
    loaded: std::sync::Mutex<Stamps>,
    provider: Arc<CryptoProvider>,
}

type Stamps = (Option<SystemTime>, Option<SystemTime>);

impl ReloadingCert {
    /// Loads the pair; the error names the files and what is wrong with them.
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Arc<Self>, CertError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let loaded = stamps(cert_file, key_file);
        let key = read_pair(cert_file, key_file, &provider)?;
        Ok(Arc::new(Self {
            cert_file: cert_file.to_owned(),
            key_file: key_file.to_owned(),
            current: RwLock::new(Arc::new(key)),
            loaded: std::sync::Mutex::new(loaded),
            provider,
        }))
    }

    /// A TLS server configuration that always presents the current pair.
    pub fn server_config(self: &Arc<Self>, alpn: &[&[u8]]) -> Result<Arc<rustls::ServerConfig>, CertError> {
        let mut config = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(CertError::Config)?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }

    /// Re-reads the files whenever they change, until `shutdown` turns true. A pair that does
    /// not load is logged and the previous one kept.
    pub async fn follow(self: Arc<Self>, what: &'static str, mut shutdown: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = shutdown.wait_for(|stop| *stop) => return,
                _ = tokio::time::sleep(CHECK_EVERY) => {}
            }
            let now = stamps(&self.cert_file, &self.key_file);
            {
                let mut loaded = lock(&self.loaded);
                if *loaded == now {
                    continue;
                }
                *loaded = now;
            }
            match read_pair(&self.cert_file, &self.key_file, &self.provider) {
                Ok(key) => {
                    *crate::mutex::write(&self.current) = Arc::new(key);
                    info!(cert = %self.cert_file.display(), "{what} certificate reloaded");
                }
                Err(e) => warn!(err = %e, "{what} certificate changed but does not load; keeping the previous one"),
            }
        }
    }
}

fn stamps(cert_file: &Path, key_file: &Path) -> Stamps {
    let at = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    (at(cert_file), at(key_file))
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(crate::mutex::read(&self.current).clone())
    }
}

fn read_pair(cert_file: &Path, key_file: &Path, provider: &CryptoProvider) -> Result<CertifiedKey, CertError> {
    let chain = CertificateDer::pem_file_iter(cert_file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|source| CertError::Certificates { file: cert_file.to_owned(), source })?;
    if chain.is_empty() {
        return Err(CertError::NoCertificate { file: cert_file.to_owned() });
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|source| CertError::Key { file: key_file.to_owned(), source })?;
    CertifiedKey::from_der(chain, key, provider).map_err(|source| CertError::Pair {
        cert: cert_file.to_owned(),
        key: key_file.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap().self_signed(&key).unwrap();
        let (c, k) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    #[test]
    fn loads_a_pair_and_names_broken_files() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k) = pair(dir.path(), "one");
        assert!(ReloadingCert::load(&c, &k).is_ok());
        std::fs::write(&k, "not a key").unwrap();
        let err = ReloadingCert::load(&c, &k).unwrap_err();
        assert!(matches!(err, CertError::Key { .. }) && err.to_string().contains("tls.key"), "{err}");
        std::fs::write(&c, "").unwrap();
        let err = ReloadingCert::load(&c, &k).unwrap_err();
        assert!(matches!(err, CertError::NoCertificate { .. }) && err.to_string().contains("tls.crt"), "{err}");
    }

    #[tokio::test]
    async fn follows_a_renewed_pair() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k) = pair(dir.path(), "one");
        let cert = ReloadingCert::load(&c, &k).unwrap();
        let first = cert.current.read().unwrap().cert[0].clone();
        let (stop_tx, stop) = watch::channel(false);
        let task = tokio::spawn(cert.clone().follow("test", stop));
        // A renewal writes new files (a later mtime).
        let later = SystemTime::now() + Duration::from_secs(5);
        pair(dir.path(), "two");
        for p in [&c, &k] {
            std::fs::File::options().write(true).open(p).unwrap().set_modified(later).unwrap();
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while cert.current.read().unwrap().cert[0] == first {
            assert!(tokio::time::Instant::now() < deadline, "the renewed pair was not picked up");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = stop_tx.send(true);
        task.await.unwrap();
    }
}
