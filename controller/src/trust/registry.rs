//! Talking to OCI registries: credentials from image pull secrets, and tag -> digest resolution,
//! shared by the Schedulers that reach a registry with the same credentials.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use base64::Engine;
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::Deserialize;

use super::TrustError;

/// How the controller reaches registries.
#[derive(Clone, Debug, Default)]
pub struct RegistrySettings {
    /// Registries (host[:port]) spoken to over plain HTTP, for tests and local mirrors.
    pub insecure: Vec<String>,
    /// Cap on one registry request.
    pub timeout: Duration,
}

impl RegistrySettings {
    pub fn oci_config(&self) -> oci_client::client::ClientConfig {
        oci_client::client::ClientConfig {
            protocol: self.protocol(),
            read_timeout: Some(self.timeout),
            connect_timeout: Some(self.timeout),
            ..Default::default()
        }
    }

    pub fn sigstore_config(&self) -> sigstore::registry::ClientConfig {
        sigstore::registry::ClientConfig {
            protocol: if self.insecure.is_empty() {
                sigstore::registry::ClientProtocol::Https
            } else {
                sigstore::registry::ClientProtocol::HttpsExcept(self.insecure.clone())
            },
            ..Default::default()
        }
    }

    fn protocol(&self) -> oci_client::client::ClientProtocol {
        if self.insecure.is_empty() {
            oci_client::client::ClientProtocol::Https
        } else {
            oci_client::client::ClientProtocol::HttpsExcept(self.insecure.clone())
        }
    }
}

/// A `kubernetes.io/dockerconfigjson` document.
#[derive(Deserialize, Default)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, DockerAuth>,
}

#[derive(Deserialize, Default)]
struct DockerAuth {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

/// Why a pull secret could not be used. Never carries the secret's contents.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("is not a kubernetes.io/dockerconfigjson document (key .dockerconfigjson missing or not JSON)")]
    Format,
    #[error("has an `auth` entry for {0} that is not base64 of user:password")]
    Auth(String),
}

/// Credentials for `registry` from the given `.dockerconfigjson` documents, in order: the first
/// that names the registry wins; anonymous when none does.
pub fn credentials_for<'a>(
    registry: &str,
    documents: impl IntoIterator<Item = &'a [u8]>,
) -> Result<RegistryAuth, SecretError> {
    let registry = server_host(registry);
    for document in documents {
        let config: DockerConfig = serde_json::from_slice(document).map_err(|_| SecretError::Format)?;
        for (server, auth) in &config.auths {
            if server_host(server) != registry {
                continue;
            }
            if let (Some(user), Some(password)) = (&auth.username, &auth.password) {
                return Ok(RegistryAuth::Basic(user.clone(), password.clone()));
            }
            if let Some(encoded) = &auth.auth {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(encoded.trim())
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or_else(|| SecretError::Auth(server.clone()))?;
                let (user, password) = decoded.split_once(':').ok_or_else(|| SecretError::Auth(server.clone()))?;
                return Ok(RegistryAuth::Basic(user.to_owned(), password.to_owned()));
            }
        }
    }
    Ok(RegistryAuth::Anonymous)
}

/// The registry a pull-secret key or an image reference names, one name per registry:
/// `https://index.docker.io/v1/`, `index.docker.io` (what image references resolve to) and
/// `docker.io` all name Docker Hub; keys may carry a scheme and a path.
fn server_host(server: &str) -> &str {
    let host = server.strip_prefix("https://").or_else(|| server.strip_prefix("http://")).unwrap_or(server);
    let host = host.split('/').next().unwrap_or(host);
    match host {
        "index.docker.io" | "registry-1.docker.io" => "docker.io",
        other => other,
    }
}

/// Resolves a reference (tag or digest) to the digest of its manifest or index.
pub async fn resolve_digest(
    client: &Client,
    reference: &Reference,
    auth: &RegistryAuth,
    image: &str,
) -> Result<String, TrustError> {
    client.fetch_manifest_digest(reference, auth).await.map_err(|e| classify(e, reference, image))
}

/// Tags resolved recently, shared by every Scheduler that asks for the same reference with the same
/// credentials: 200 Schedulers on one tag cost the registry one request per
/// `--image-recheck-interval`, not 200. Keyed by a hash of the credentials as well, so no
/// Scheduler learns a digest through credentials that are not its own; only answers are kept,
/// never failures.
#[derive(Debug)]
pub struct Resolutions {
    fresh_for: Duration,
    /// (reference as written, credentials' hash) -> (digest, when it was asked for).
    entries: HashMap<(String, String), (String, Instant)>,
}

/// Resolutions kept at once; all are forgotten when there would be more.
const RESOLUTIONS_CAPACITY: usize = 4096;

impl Resolutions {
    /// Answers are used for `fresh_for` after they were asked for.
    pub fn new(fresh_for: Duration) -> Self {
        Self { fresh_for, entries: HashMap::new() }
    }

    /// The digest `image` resolved to with `credentials` (see [`credentials_key`]) and when it
    /// was asked for, while that is less than `fresh_for` before `now`.
    pub fn fresh(&self, image: &str, credentials: &str, now: Instant) -> Option<(String, Instant)> {
        let (digest, asked) = self.entries.get(&(image.to_owned(), credentials.to_owned()))?;
        (now.saturating_duration_since(*asked) < self.fresh_for).then(|| (digest.clone(), *asked))
    }

    /// Keeps what `image` resolved to with `credentials`, asked for at `asked`.
    pub fn put(&mut self, image: &str, credentials: String, digest: String, asked: Instant) {
        if self.entries.len() >= RESOLUTIONS_CAPACITY {
            self.entries.clear();
        }
        self.entries.insert((image.to_owned(), credentials), (digest, asked));
    }
}

/// What identifies `auth` among credentials without holding it: a hash of the user and
/// password, of the token, or of nothing for anonymous access.
pub fn credentials_key(auth: &RegistryAuth) -> String {
    let what = match auth {
        RegistryAuth::Anonymous => "anonymous".to_owned(),
        RegistryAuth::Basic(user, password) => format!("basic\n{user}\n{password}"),
        RegistryAuth::Bearer(token) => format!("bearer\n{token}"),
    };
    sked_core::hashing::sha256_hex(what.as_bytes())
}

/// Maps a registry failure to what the user must fix.
pub fn classify(e: OciDistributionError, reference: &Reference, image: &str) -> TrustError {
    let registry = reference.resolve_registry().to_owned();
    let image = image.to_owned();
    match e {
        OciDistributionError::ImageManifestNotFoundError(_) => TrustError::NotFound { image, registry },
        OciDistributionError::UnauthorizedError { .. } | OciDistributionError::AuthenticationFailure(_) => {
            TrustError::Unauthorized { image, registry, detail: e.to_string() }
        }
        OciDistributionError::ServerError { code: 404, .. } => TrustError::NotFound { image, registry },
        OciDistributionError::ServerError { code: 401 | 403, .. } => {
            TrustError::Unauthorized { image, registry, detail: e.to_string() }
        }
        OciDistributionError::RegistryError { ref envelope, .. }
            if envelope.errors.iter().any(|x| matches!(x.code, oci_client::errors::OciErrorCode::ManifestUnknown)) =>
        {
            TrustError::NotFound { image, registry }
        }
        other => TrustError::Unreachable { image, registry, detail: sked_logging::error_chain(&other) },
    }
}

/// The registry host of an image reference (`docker.io` for short names), for messages.
pub fn registry_host(image: &str) -> String {
    Reference::try_from(image).map(|r| r.resolve_registry().to_owned()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(auth: RegistryAuth) -> (String, String) {
        match auth {
            RegistryAuth::Basic(u, p) => (u, p),
            other => panic!("basic auth expected, got {other:?}"),
        }
    }

    #[test]
    fn credentials_come_from_the_first_secret_naming_the_registry() {
        let hub = br#"{"auths":{"https://index.docker.io/v1/":{"auth":"aHViOnB3"}}}"#.as_slice();
        let private = br#"{"auths":{"reg.example:5000":{"username":"u","password":"p:w"}}}"#.as_slice();
        assert_eq!(basic(credentials_for("reg.example:5000", [hub, private]).unwrap()), ("u".into(), "p:w".into()));
        assert_eq!(basic(credentials_for("docker.io", [hub, private]).unwrap()), ("hub".into(), "pw".into()));
        assert!(matches!(credentials_for("ghcr.io", [hub, private]).unwrap(), RegistryAuth::Anonymous));
    }

    #[test]
    fn docker_hub_secrets_match_what_hub_references_resolve_to() {
        // `docker.io/library/x` resolves to the registry `index.docker.io`.
        let resolved = Reference::try_from("scx/rusty:v1").unwrap().resolve_registry().to_owned();
        for key in ["docker.io", "https://index.docker.io/v1/", "index.docker.io", "registry-1.docker.io"] {
            let secret = format!(r#"{{"auths":{{"{key}":{{"username":"u","password":"p"}}}}}}"#);
            let auth = credentials_for(&resolved, [secret.as_bytes()]).unwrap();
            assert_eq!(basic(auth), ("u".into(), "p".into()), "{key} for {resolved}");
        }
    }

    #[test]
    fn registry_failures_say_what_to_fix() {
        let reference: Reference = "r.example:5000/team/sched:v1".parse().unwrap();
        let image = "r.example:5000/team/sched:v1";
        let server = |code| OciDistributionError::ServerError { code, url: "u".into(), message: "m".into() };
        assert!(matches!(classify(server(404), &reference, image), TrustError::NotFound { .. }));
        assert!(matches!(classify(server(403), &reference, image), TrustError::Unauthorized { .. }));
        assert!(matches!(
            classify(OciDistributionError::UnauthorizedError { url: "u".into() }, &reference, image),
            TrustError::Unauthorized { .. }
        ));
        assert!(matches!(
            classify(OciDistributionError::ImageManifestNotFoundError("x".into()), &reference, image),
            TrustError::NotFound { .. }
        ));
        let err = classify(server(502), &reference, image);
        assert!(matches!(&err, TrustError::Unreachable { registry, .. } if registry == "r.example:5000"));
        assert!(err.to_string().starts_with("cannot reach the registry r.example:5000 for image"), "{err}");
        assert!(err.is_transient());
        assert_eq!(registry_host("r.example:5000/team/sched:v1"), "r.example:5000");
    }

    #[test]
    fn a_resolution_serves_the_same_reference_and_credentials_while_fresh() {
        let start = Instant::now();
        let team = credentials_key(&RegistryAuth::Basic("team".into(), "s3cret".into()));
        let rotated = credentials_key(&RegistryAuth::Basic("team".into(), "wrong".into()));
        let anonymous = credentials_key(&RegistryAuth::Anonymous);
        assert!(!team.contains("s3cret"), "the key holds no password");
        assert_ne!(team, rotated);
        assert_ne!(team, anonymous);

        let mut resolved = Resolutions::new(Duration::from_secs(300));
        resolved.put("r/a:v1", team.clone(), "sha256:1".into(), start);
        let later = start + Duration::from_secs(299);
        assert_eq!(resolved.fresh("r/a:v1", &team, later), Some(("sha256:1".into(), start)));
        assert_eq!(resolved.fresh("r/a:v1", &rotated, later), None, "other credentials ask themselves");
        assert_eq!(resolved.fresh("r/a:v1", &anonymous, later), None);
        assert_eq!(resolved.fresh("r/a:v2", &team, later), None, "another tag");
        assert_eq!(resolved.fresh("r/a:v1", &team, start + Duration::from_secs(300)), None, "stale");
    }

    #[test]
    fn broken_secrets_are_named_without_their_contents() {
        assert_eq!(credentials_for("r", [b"not json".as_slice()]).unwrap_err(), SecretError::Format);
        let err = credentials_for("r", [br#"{"auths":{"r":{"auth":"bm9jb2xvbg=="}}}"#.as_slice()]).unwrap_err();
        assert_eq!(err, SecretError::Auth("r".into()));
        assert!(!err.to_string().contains("nocolon"));
    }
}
