//! `/readyz` (200 only when this pod's scheduler is attached), `/healthz` and `/metrics`. A scrape
//! reads the kernel's counters afresh (a few small sysfs files), so they are as current as the
//! scrape, however rarely the node changes.

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::sync::watch;

use crate::metrics::Metrics;
use crate::observation::Observation;
use crate::verdict::Verdict;

#[derive(Clone)]
struct AppState {
    rx: watch::Receiver<Observation>,
    metrics: Arc<Metrics>,
    sysfs_root: PathBuf,
}

pub fn router(rx: watch::Receiver<Observation>, metrics: Arc<Metrics>, sysfs_root: PathBuf) -> Router {
    Router::new()
        .route(sked_proto::contract::READYZ_PATH, get(readyz))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics_text))
        .with_state(AppState { rx, metrics, sysfs_root })
}

async fn readyz(State(s): State<AppState>) -> (StatusCode, String) {
    let o = s.rx.borrow().clone();
    let code = if o.verdict == Verdict::Attached { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, format!("{}: {}\n", o.verdict.as_str(), o.reason))
}

async fn metrics_text(
    State(s): State<AppState>,
    headers: axum::http::HeaderMap,
) -> ([(axum::http::header::HeaderName, &'static str); 1], String) {
    let accept = headers.get(axum::http::header::ACCEPT).and_then(|v| v.to_str().ok());
    s.metrics.counters(&crate::sysfs::read(&s.sysfs_root));
    let (kind, body) = sked_logging::exposition::negotiate(accept, s.metrics.encode());
    ([(axum::http::header::CONTENT_TYPE, kind)], body)
}
