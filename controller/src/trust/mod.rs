//! Image trust: which images may run and the digest that is deployed.
//!
//! [`policy`] decides which rule applies to a repository, [`registry`] resolves tags over the
//! OCI distribution API, [`verify`] applies a rule to the signatures the `sigstore` crate
//! fetched. [`Trust`] ties them together for the reconciler and the admission webhook, caches
//! verified digests, and follows the policy file.

pub mod policy;
pub mod registry;
pub mod verify;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use oci_client::Reference;
use sigstore::cosign::CosignCapabilities;
use sigstore::registry::{Auth, OciReference};
use sigstore::trust::sigstore::SigstoreTrustRoot;
use tokio::sync::watch;
use tracing::{error, info};

use crate::image::ImageRef;
use crate::metrics::Metrics;
use crate::mutex::lock;
pub use policy::{Policy, PolicyError, Requirement};

/// Why an image may not run. Messages name the image, what went wrong and what to fix;
/// "cannot reach the registry" and "signature invalid" are distinct.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum TrustError {
    #[error("image {image:?} is not a valid image reference: {detail}")]
    Reference { image: String, detail: String },
    #[error(
        "image {image:?} is not allowed: no rule of the trust policy matches repository {repository:?}; add a rule for it to the trust policy"
    )]
    NotAllowed { image: String, repository: String },
    #[error("cannot reach the registry {registry} for image {image:?}: {detail}")]
    Unreachable { image: String, registry: String, detail: String },
    #[error("image {image:?} was not found in registry {registry}; check the repository and tag")]
    NotFound { image: String, registry: String },
    #[error(
        "registry {registry} refused access to image {image:?} ({detail}); check the Scheduler's spec.imagePullSecrets"
    )]
    Unauthorized { image: String, registry: String, detail: String },
    #[error(
        "image pull secret {namespace}/{name} for image {image:?} {detail}; fix spec.imagePullSecrets or the Secret"
    )]
    PullSecret { image: String, namespace: String, name: String, detail: String },
    #[error(
        "signature of image {image:?} ({digest}) is invalid under trust policy rule {rule:?} (line {line}): {detail}"
    )]
    SignatureInvalid { image: String, digest: String, rule: String, line: u64, detail: String },
    #[error("image {image:?} resolved to {resolved}, not the digest {pinned} the spec names")]
    DigestMismatch { image: String, pinned: String, resolved: String },
    #[error("cannot load the Sigstore trusted root needed to check keyless signatures of {image:?}: {detail}")]
    TrustRoot { image: String, detail: String },
}

impl TrustError {
    /// Low-cardinality label for the verification metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            TrustError::Reference { .. } => "invalid_reference",
            TrustError::NotAllowed { .. } => "not_allowed",
            TrustError::Unreachable { .. } => "registry_unreachable",
            TrustError::NotFound { .. } => "not_found",
            TrustError::Unauthorized { .. } => "registry_unauthorized",
            TrustError::PullSecret { .. } => "pull_secret",
            TrustError::SignatureInvalid { .. } => "signature_invalid",
            TrustError::DigestMismatch { .. } => "digest_mismatch",
            TrustError::TrustRoot { .. } => "trust_root",
        }
    }

    /// True when retrying later may succeed without anyone changing anything.
    pub fn is_transient(&self) -> bool {
        matches!(self, TrustError::Unreachable { .. } | TrustError::TrustRoot { .. })
    }
}

/// How an admitted image was admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdmittedBy {
    /// A signature satisfied the rule just now.
    Verified,
    /// This digest satisfied the same rule of the same policy before.
    Cached,
    /// The rule allows unsigned images; the reference is used as written.
    UnsignedAllowed,
}

impl AdmittedBy {
    pub fn metric_label(self) -> &'static str {
        match self {
            AdmittedBy::Verified => "verified",
            AdmittedBy::Cached => "cached",
            AdmittedBy::UnsignedAllowed => "unsigned_allowed",
        }
    }
}

/// An image that may run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// What the DaemonSet runs: `repository@sha256:...`, or the reference as written when the
    /// rule allows unsigned images.
    pub image: String,
    pub outcome: AdmittedBy,
    /// The digest came from a tag, which may move: resolve it again from time to time.
    pub from_tag: bool,
    /// When the registry was asked for the digest (perhaps for another Scheduler with the same
    /// credentials); `None` when it was not asked.
    pub resolved_at: Option<Instant>,
}

/// The metric label of an admission decision, admitted or not.
pub fn outcome_label(result: &Result<Admitted, TrustError>) -> &'static str {
    match result {
        Ok(admitted) => admitted.outcome.metric_label(),
        Err(e) => e.metric_label(),
    }
}

/// The policy in force and where it came from.
#[derive(Debug)]
pub struct LoadedPolicy {
    pub policy: Policy,
    /// Bumped on every successful reload; verification results are cached per generation.
    pub generation: u64,
    pub source: String,
}

/// Where keyless signatures are anchored.
#[derive(Clone, Debug)]
pub enum TrustRootSource {
    /// A `trusted_root.json` file (air-gapped clusters, tests).
    File(PathBuf),
    /// Sigstore's public-good instance over TUF, cached in this directory.
    PublicGood { cache_dir: PathBuf },
}

/// Settings of the trust service.
#[derive(Clone, Debug)]
pub struct TrustSettings {
    pub trust_root: TrustRootSource,
    pub registry: registry::RegistrySettings,
    /// Where image pull secrets live (the workload namespace).
    pub secrets_namespace: String,
    /// How long a tag's resolution serves every Scheduler with the same credentials
    /// (`--image-recheck-interval`).
    pub tags_fresh_for: Duration,
}

/// Cached verification results are bounded; the whole cache is dropped when full.
const CACHE_CAPACITY: usize = 4096;

/// The trust service shared by the reconciler and the webhook.
pub struct Trust {
    policy: watch::Receiver<Arc<LoadedPolicy>>,
    settings: TrustSettings,
    root: tokio::sync::Mutex<Option<Arc<SigstoreTrustRoot>>>,
    /// (digest, policy generation, rule line) that verified.
    verified: Mutex<HashSet<(String, u64, u64)>>,
    /// Tags resolved recently, by reference and credentials.
    resolutions: Mutex<registry::Resolutions>,
}

impl Trust {
    pub fn new(settings: TrustSettings, policy: watch::Receiver<Arc<LoadedPolicy>>) -> Self {
        let resolutions = Mutex::new(registry::Resolutions::new(settings.tags_fresh_for));
        Self {
            policy,
            settings,
            root: tokio::sync::Mutex::new(None),
            verified: Mutex::new(HashSet::new()),
            resolutions,
        }
    }

    /// A short hash of what an admission of `image` depends on: the reference as written, the
    /// pull secrets' names, and the policy rule that governs its repository (its pattern and
    /// requirement, not its place in the file). `None` when no rule allows the repository.
    /// Recorded with what was deployed, it tells a later leader that cannot reach the registry
    /// whether the digest it finds was admitted for the same inputs.
    pub fn admission_key(&self, image: &str, pull_secrets: &[String]) -> Option<String> {
        let loaded = self.policy();
        let parsed = ImageRef::parse(image).ok()?;
        let rule = loaded.policy.rule_for(&parsed.repository)?;
        let requirement = match &rule.requirement {
            Requirement::Keyless { issuer, identity } => format!("keyless {issuer} {identity}"),
            Requirement::PublicKey { pem } => format!("key {}", pem.trim()),
            Requirement::Unsigned => "unsigned".to_owned(),
        };
        let inputs = [image, &pull_secrets.join(","), &rule.repository, &requirement].join("\n");
        Some(sked_core::hashing::short_sha256_hex(inputs.as_bytes(), 8))
    }

    /// The admission a DaemonSet records: the digest it runs (`running`) when its admission
    /// annotation (`recorded`) is the key of `image` and `pull_secrets` under the policy now in
    /// force, and that digest is pinned. A replica that did not verify the image itself and
    /// cannot reach the registry keeps it.
    pub fn recorded_admission(
        &self,
        image: &str,
        pull_secrets: &[String],
        recorded: Option<&str>,
        running: Option<&str>,
    ) -> Option<Admitted> {
        let key = self.admission_key(image, pull_secrets)?;
        (recorded == Some(key.as_str())).then_some(())?;
        let running = running.filter(|r| ImageRef::parse(r).is_ok_and(|r| r.is_pinned()))?;
        let from_tag = !ImageRef::parse(image).ok()?.is_pinned();
        Some(Admitted { image: running.to_owned(), outcome: AdmittedBy::Cached, from_tag, resolved_at: None })
    }

    /// The policy currently in force.
    pub fn policy(&self) -> Arc<LoadedPolicy> {
        self.policy.borrow().clone()
    }

    /// Decides whether `image` may run, and what to deploy. `pull_secrets` are names of Secrets
    /// in the workload namespace, read only when the registry must be contacted, and read again
    /// every time (a rotated secret counts at once). A digest verified before is admitted from
    /// the cache only after this Scheduler's own credentials resolved it (or the same
    /// credentials did, for another Scheduler, within `tags_fresh_for`): the cache never lets a
    /// Scheduler run an image it cannot read.
    pub async fn admit(&self, client: &Client, image: &str, pull_secrets: &[String]) -> Result<Admitted, TrustError> {
        let loaded = self.policy();
        let parsed = ImageRef::parse(image)
            .map_err(|e| TrustError::Reference { image: image.to_owned(), detail: e.to_string() })?;
        let rule = loaded.policy.rule_for(&parsed.repository).ok_or_else(|| TrustError::NotAllowed {
            image: image.to_owned(),
            repository: policy::full_repository(&parsed.repository),
        })?;
        if matches!(rule.requirement, Requirement::Unsigned) {
            return Ok(Admitted {
                image: image.to_owned(),
                outcome: AdmittedBy::UnsignedAllowed,
                from_tag: false,
                resolved_at: None,
            });
        }

        let reference = Reference::try_from(image)
            .map_err(|e| TrustError::Reference { image: image.to_owned(), detail: e.to_string() })?;
        let auth = self.credentials(client, image, &reference, pull_secrets).await?;
        let (digest, resolved_at) = self.resolve(image, &reference, &auth).await?;
        if let Some(pinned) = &parsed.digest
            && pinned != &digest
        {
            return Err(TrustError::DigestMismatch {
                image: image.to_owned(),
                pinned: pinned.clone(),
                resolved: digest,
            });
        }
        let deployed = format!("{}@{digest}", parsed.repository);
        let from_tag = parsed.digest.is_none();
        let key = (digest.clone(), loaded.generation, rule.line);
        let resolved_at = Some(resolved_at);
        if lock(&self.verified).contains(&key) {
            return Ok(Admitted { image: deployed, outcome: AdmittedBy::Cached, from_tag, resolved_at });
        }

        self.verify_signature(image, rule, &reference, &digest, &auth).await?;
        let mut verified = lock(&self.verified);
        if verified.len() >= CACHE_CAPACITY {
            verified.clear();
        }
        verified.insert(key);
        Ok(Admitted { image: deployed, outcome: AdmittedBy::Verified, from_tag, resolved_at })
    }

    /// The registry credentials the Scheduler's pull secrets hold for `reference`.
    async fn credentials(
        &self,
        client: &Client,
        image: &str,
        reference: &Reference,
        pull_secrets: &[String],
    ) -> Result<oci_client::secrets::RegistryAuth, TrustError> {
        let documents = self.pull_secret_documents(client, image, pull_secrets).await?;
        registry::credentials_for(reference.resolve_registry(), documents.iter().map(|d| d.0.as_slice())).map_err(|e| {
            TrustError::PullSecret {
                image: image.to_owned(),
                namespace: self.settings.secrets_namespace.clone(),
                name: pull_secrets.join(","),
                detail: e.to_string(),
            }
        })
    }

    /// Checks the signatures stored for `digest` against the rule's requirement (a keyless one
    /// against the Sigstore trust root).
    async fn verify_signature(
        &self,
        image: &str,
        rule: &policy::Rule,
        reference: &Reference,
        digest: &str,
        auth: &oci_client::secrets::RegistryAuth,
    ) -> Result<(), TrustError> {
        let root = match rule.requirement {
            Requirement::Keyless { .. } => Some(self.trust_root(image).await?),
            _ => None,
        };
        let mut builder =
            sigstore::cosign::ClientBuilder::default().with_oci_client_config(self.settings.registry.sigstore_config());
        if let Some(root) = &root {
            builder = builder
                .with_trust_repository(root.as_ref())
                .map_err(|e| TrustError::TrustRoot { image: image.to_owned(), detail: e.to_string() })?;
        }
        let mut cosign =
            builder.build().map_err(|e| TrustError::TrustRoot { image: image.to_owned(), detail: e.to_string() })?;
        let signed = OciReference::with_digest(
            reference.resolve_registry().to_owned(),
            reference.repository().to_owned(),
            digest.to_owned(),
        );
        let sigstore_auth = Auth::from(auth);
        let layers = self
            .bounded(image, reference, cosign.trusted_signature_layers(&sigstore_auth, &signed))
            .await?
            .map_err(|e| TrustError::Unreachable {
                image: image.to_owned(),
                registry: reference.resolve_registry().to_owned(),
                detail: sked_logging::error_chain(&e),
            })?;
        verify::satisfies(&rule.requirement, &layers).map_err(|why| TrustError::SignatureInvalid {
            image: image.to_owned(),
            digest: digest.to_owned(),
            rule: rule.repository.clone(),
            line: rule.line,
            detail: why.to_string(),
        })
    }

    /// The digest `image` names in its registry, and when the registry was asked: a resolution
    /// made for the same reference with the same credentials within `tags_fresh_for` serves
    /// again, so Schedulers sharing a tag share its rechecks.
    async fn resolve(
        &self,
        image: &str,
        reference: &Reference,
        auth: &oci_client::secrets::RegistryAuth,
    ) -> Result<(String, Instant), TrustError> {
        let credentials = registry::credentials_key(auth);
        if let Some(known) = lock(&self.resolutions).fresh(image, &credentials, Instant::now()) {
            return Ok(known);
        }
        // A client of its own for every resolution: an OCI client keeps the first credentials
        // (and tokens) it saw per registry, which must never serve another Scheduler, nor
        // outlive a rotated secret. The registry sees exactly this Scheduler's credentials.
        let oci = oci_client::Client::new(self.settings.registry.oci_config());
        let asked = Instant::now();
        let digest = self.bounded(image, reference, registry::resolve_digest(&oci, reference, auth, image)).await??;
        lock(&self.resolutions).put(image, credentials, digest.clone(), asked);
        Ok((digest, asked))
    }

    /// Runs one registry exchange under the registry timeout.
    async fn bounded<T>(
        &self,
        image: &str,
        reference: &Reference,
        fut: impl std::future::Future<Output = T>,
    ) -> Result<T, TrustError> {
        let timeout = self.settings.registry.timeout;
        tokio::time::timeout(timeout, fut).await.map_err(|_| TrustError::Unreachable {
            image: image.to_owned(),
            registry: reference.resolve_registry().to_owned(),
            detail: format!("no answer within {timeout:?} (--registry-timeout)"),
        })
    }

    async fn pull_secret_documents(
        &self,
        client: &Client,
        image: &str,
        names: &[String],
    ) -> Result<Vec<ByteString>, TrustError> {
        let namespace = &self.settings.secrets_namespace;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let mut documents = Vec::with_capacity(names.len());
        for name in names {
            let err = |detail: String| TrustError::PullSecret {
                image: image.to_owned(),
                namespace: namespace.clone(),
                name: name.clone(),
                detail,
            };
            let secret = secrets
                .get_opt(name)
                .await
                .map_err(|e| err(format!("could not be read: {e}")))?
                .ok_or_else(|| err("does not exist".into()))?;
            let document = secret.data.and_then(|mut d| d.remove(".dockerconfigjson")).ok_or_else(|| {
                err("has no .dockerconfigjson key (type kubernetes.io/dockerconfigjson expected)".into())
            })?;
            documents.push(document);
        }
        Ok(documents)
    }

    /// The trusted root, loaded once; a failed load is retried on the next verification.
    async fn trust_root(&self, image: &str) -> Result<Arc<SigstoreTrustRoot>, TrustError> {
        let mut slot = self.root.lock().await;
        if let Some(root) = slot.as_ref() {
            return Ok(root.clone());
        }
        let err = |detail: String| TrustError::TrustRoot { image: image.to_owned(), detail };
        let root = match &self.settings.trust_root {
            TrustRootSource::File(path) => {
                let data = tokio::fs::read(path)
                    .await
                    .map_err(|e| err(format!("reading {} (--trusted-root): {e}", path.display())))?;
                SigstoreTrustRoot::from_trusted_root_json_unchecked(&data)
                    .map_err(|e| err(format!("parsing {} (--trusted-root): {e}", path.display())))?
            }
            TrustRootSource::PublicGood { cache_dir } => {
                tokio::fs::create_dir_all(cache_dir)
                    .await
                    .map_err(|e| err(format!("creating {} (--tuf-cache-dir): {e}", cache_dir.display())))?;
                let timeout = self.settings.registry.timeout * 3;
                tokio::time::timeout(timeout, SigstoreTrustRoot::new(Some(cache_dir)))
                    .await
                    .map_err(|_| err(format!("Sigstore's TUF repository did not answer within {timeout:?}")))?
                    .map_err(|e| err(format!("fetching Sigstore's TUF repository: {e}")))?
            }
        };
        let root = Arc::new(root);
        *slot = Some(root.clone());
        Ok(root)
    }
}

/// Why the trust policy file given at startup does not load.
#[derive(Debug, thiserror::Error)]
pub enum PolicyFileError {
    #[error("reading the trust policy {} (--trust-policy): {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{} (--trust-policy): {source}", path.display())]
    Parse { path: PathBuf, source: PolicyError },
}

/// Loads the policy at startup: the file when one is given (a file that does not parse stops
/// the controller, naming the line), the built-in default otherwise.
pub fn load_policy(path: Option<&Path>) -> Result<LoadedPolicy, PolicyFileError> {
    match path {
        None => Ok(LoadedPolicy { policy: Policy::default_policy(), generation: 1, source: "built-in default".into() }),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|source| PolicyFileError::Read { path: path.to_owned(), source })?;
            let policy =
                Policy::parse(&text).map_err(|source| PolicyFileError::Parse { path: path.to_owned(), source })?;
            Ok(LoadedPolicy { policy, generation: 1, source: path.display().to_string() })
        }
    }
}

/// Re-reads the policy file every `interval`; a changed file that parses replaces the policy
/// (and `on_change` runs), one that does not is logged with its line and ignored.
pub async fn follow_policy_file(
    path: PathBuf,
    interval: Duration,
    sender: watch::Sender<Arc<LoadedPolicy>>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut last = std::fs::read(&path).ok();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.changed() => return,
        }
        let Ok(bytes) = tokio::fs::read(&path).await else { continue };
        if last.as_deref() == Some(bytes.as_slice()) {
            continue;
        }
        last = Some(bytes.clone());
        let parsed = std::str::from_utf8(&bytes).map_err(|_| PolicyError { line: 1, message: "not UTF-8 text".into() });
        match parsed.and_then(Policy::parse) {
            Ok(policy) => {
                let generation = sender.borrow().generation + 1;
                info!(logger = "sked-controller/trust", source = %path.display(), rules = policy.rules().len(), generation, "trust policy reloaded; images will be verified again");
                metrics.policy_reloaded(true);
                sender.send_replace(Arc::new(LoadedPolicy { policy, generation, source: path.display().to_string() }));
            }
            Err(e) => {
                metrics.policy_reloaded(false);
                error!(logger = "sked-controller/trust", source = %path.display(), err = %e, "trust policy refused; the last good policy stays in force");
            }
        }
    }
}
