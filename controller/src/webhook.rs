//! The validating admission webhook for Schedulers, served over HTTPS by every replica
//! (leader or not). It refuses a Scheduler whose spec is invalid, whose repository the trust
//! policy does not allow, whose caller the policy does not let deploy that image, or whose
//! signature does not satisfy its rule. Deleting is never refused, so a Scheduler can always be
//! stopped; the controller's status writes go to the status subresource, which the webhook does
//! not see.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use kube::Client;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use tokio::sync::watch;
use tracing::{debug, info};

use crate::api::{Scheduler, SchedulerSpec};
use crate::error::BoxError;
use crate::handshake_gate::{GatedAcceptor, HANDSHAKE_AFTER_HELLO, HandshakeGate};
use crate::image::ImageRef;
use crate::metrics::Metrics;
use crate::tls::ReloadingCert;
use crate::trust::Trust;

/// Path the ValidatingWebhookConfiguration calls.
pub const VALIDATE_PATH: &str = "/validate-scheduler";

/// How long the webhook keeps accepting calls after the shutdown signal.
pub const LINGER: Duration = Duration::from_secs(2);

/// Everything a webhook request needs.
pub struct WebhookState {
    pub trust: Arc<Trust>,
    pub client: Client,
    pub metrics: Arc<Metrics>,
    /// Cap on one admission decision; the API server's own timeout is longer.
    pub timeout: Duration,
}

/// Serves the webhook until [`LINGER`] after `shutdown` turns true, then drains for up to 5 s. The certificate
/// files are re-read when they change (cert-manager renewals need no restart).
pub async fn serve(
    address: SocketAddr,
    cert_dir: PathBuf,
    state: Arc<WebhookState>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), BoxError> {
    let cert = ReloadingCert::load(&cert_dir.join("tls.crt"), &cert_dir.join("tls.key"))
        .map_err(|e| format!("webhook certificate (--webhook-cert-dir): {e}"))?;
    let tls = RustlsConfig::from_config(cert.server_config(&[b"http/1.1"])?);
    tokio::spawn(cert.follow("webhook", shutdown.clone()));
    let app = Router::new().route(VALIDATE_PATH, post(validate)).with_state(state.clone());
    let handle = axum_server::Handle::new();
    let drain = handle.clone();
    tokio::spawn(async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
        // A terminating pod leaves its Service's endpoints while it gets SIGTERM, and the API
        // server dials it until it sees that: with failurePolicy Fail, a call refused then
        // refuses a user's write. Keep answering a moment first.
        tokio::time::sleep(LINGER).await;
        drain.graceful_shutdown(Some(Duration::from_secs(5)));
    });
    info!(logger = "sked-controller/webhook", address = %address, path = VALIDATE_PATH, "serving the admission webhook");
    let gate = HandshakeGate::new("webhook", state.metrics.clone());
    let acceptor = GatedAcceptor::new(RustlsAcceptor::new(tls).handshake_timeout(HANDSHAKE_AFTER_HELLO), gate);
    axum_server::bind(address)
        .acceptor(acceptor)
        .handle(handle)
        .serve(app.into_make_service())
        .await
        .map_err(|e| format!("webhook server on {address}: {e}").into())
}

async fn validate(
    State(state): State<Arc<WebhookState>>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(e) => {
            return Json(AdmissionResponse::invalid(format!("not an AdmissionReview request: {e}")).into_review());
        }
    };
    let response = AdmissionResponse::from(&request);
    let response = match decide(&state, &request).await {
        Ok(()) => response,
        Err(reason) => response.deny(reason),
    };
    Json(response.into_review())
}

async fn decide(state: &WebhookState, request: &AdmissionRequest<DynamicObject>) -> Result<(), String> {
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return Ok(());
    }
    let name = request.name.clone();
    let new = spec_of(request.object.as_ref()).map_err(|e| format!("Scheduler {name:?}: {e}"))?;
    spec_problem(&new).map_or(Ok(()), |p| Err(format!("Scheduler {name:?}: {p}")))?;
    let old = spec_of(request.old_object.as_ref()).ok();
    if old.as_ref() == Some(&new) {
        // Labels, annotations, finalizers: who may change those is RBAC's business alone.
        return Ok(());
    }
    check_caller(state, request, &new).map_err(|e| {
        state.metrics.verified("webhook", CALLER_NOT_ALLOWED);
        info!(logger = "sked-controller/webhook", scheduler = %name, image = %new.sched, err = %e, "caller refused");
        format!("Scheduler {name:?}: {e}")
    })?;
    if let Some(old) = old
        && old.sched == new.sched
        && old.pull_secret_names() == new.pull_secret_names()
    {
        // The image did not change: an edit of anything else must not depend on the registry.
        debug!(logger = "sked-controller/webhook", scheduler = %name, "image unchanged; not verified again");
        return Ok(());
    }
    let secrets = new.pull_secret_names();
    let check = state.trust.admit(&state.client, &new.sched, &secrets);
    let verdict = match tokio::time::timeout(state.timeout, check).await {
        Ok(verdict) => verdict,
        Err(_) => Err(crate::trust::TrustError::Unreachable {
            image: new.sched.clone(),
            registry: crate::trust::registry::registry_host(&new.sched),
            detail: format!("verification did not finish within {:?}", state.timeout),
        }),
    };
    state.metrics.verified("webhook", crate::trust::outcome_label(&verdict));
    match verdict {
        Ok(admitted) => {
            info!(logger = "sked-controller/webhook", scheduler = %name, image = %new.sched, resolved = %admitted.image, outcome = admitted.outcome.metric_label(), "admitted");
            Ok(())
        }
        Err(e) => {
            info!(logger = "sked-controller/webhook", scheduler = %name, image = %new.sched, err = %e, "refused");
            Err(format!("Scheduler {name:?}: spec.sched: {e}"))
        }
    }
}

/// The verification outcome of a request whose caller the trust policy does not allow.
pub const CALLER_NOT_ALLOWED: &str = "caller_not_allowed";

/// Whether the trust policy lets the request's caller deploy `spec`'s image.
fn check_caller(
    state: &WebhookState,
    request: &AdmissionRequest<DynamicObject>,
    spec: &SchedulerSpec,
) -> Result<(), crate::trust::policy::CallerRefused> {
    let repository = ImageRef::parse(&spec.sched).map(|r| r.repository).unwrap_or_default();
    let user = &request.user_info;
    let caller = crate::trust::policy::Caller {
        username: user.username.as_deref().unwrap_or_default(),
        groups: user.groups.as_deref().unwrap_or_default(),
    };
    state.trust.policy().policy.check_caller(&repository, caller)
}

fn spec_of(object: Option<&DynamicObject>) -> Result<SchedulerSpec, String> {
    let object = object.ok_or("the request carries no object")?;
    let scheduler: Scheduler = object.clone().try_parse().map_err(|e| format!("spec: {e}"))?;
    Ok(scheduler.spec)
}

/// Checks the schema cannot express. `None` when the spec is acceptable.
pub fn spec_problem(spec: &SchedulerSpec) -> Option<String> {
    if let Err(e) = ImageRef::parse(&spec.sched) {
        return Some(format!("spec.sched: {e}"));
    }
    let mut seen = std::collections::HashSet::new();
    for env in &spec.env {
        if !seen.insert(env.name.as_str()) {
            return Some(format!("spec.env: variable {:?} is set twice; keep one entry", env.name));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> SchedulerSpec {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn duplicate_env_names_are_refused() {
        let s = spec(
            serde_json::json!({"sched": "r.io/a:b", "env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}),
        );
        assert_eq!(spec_problem(&s).unwrap(), "spec.env: variable \"A\" is set twice; keep one entry");
        let s = spec(serde_json::json!({"sched": "r.io/a:b", "env": [{"name": "A", "value": "1"}]}));
        assert_eq!(spec_problem(&s), None);
    }

    #[test]
    fn bad_digests_are_refused() {
        let s = spec(serde_json::json!({"sched": "r.io/a@sha256:abc"}));
        assert!(spec_problem(&s).unwrap().starts_with("spec.sched: "));
    }
}
