//! HTTP endpoints served on the client port next to gRPC, as etcd does:
//! `/health`, `/livez`, `/readyz`, `/version`.

use crate::config::{ETCD_API_VERSION, ETCD_CLUSTER_VERSION};
use crate::server::EtcdServer;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, on, MethodFilter};
use axum::{Json, Router};
use serde_json::json;
use std::sync::Arc;

pub fn router(server: Arc<EtcdServer>) -> Router {
    // etcd's handlers answer anything but GET (HEAD too) with Go's
    // `http.Error` 405 and `Allow: GET` (`allowMethod`).
    let only_get = || MethodFilter::GET;
    Router::new()
        .route("/health", on(only_get(), health).fallback(not_get))
        .route(
            "/livez",
            on(only_get(), || async { "ok" }).fallback(not_get),
        )
        .route("/readyz", on(only_get(), readyz).fallback(not_get))
        .route("/version", on(only_get(), version).fallback(not_get))
        .route("/metrics", get(metrics))
        .with_state(server)
        .layer(axum::middleware::from_fn(super::gateway::cors))
}

async fn not_get() -> axum::response::Response {
    let mut r = super::gateway::go_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    r.headers_mut().insert(
        axum::http::header::ALLOW,
        axum::http::HeaderValue::from_static("GET"),
    );
    r
}

/// etcd 3.5's /health: healthy when this member knows a leader and a
/// linearizable read succeeds.
/// etcd writes the JSON with no content type, so Go sniffs
/// `text/plain; charset=utf-8`.
async fn health(State(s): State<Arc<EtcdServer>>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let (code, body) = if s.leader() == 0 {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"health": "false", "reason": "RAFT NO LEADER"}),
        )
    } else {
        match s.linearizable_read_notify().await {
            Ok(()) => (StatusCode::OK, json!({"health": "true", "reason": ""})),
            Err(e) => (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"health": "false", "reason": e.to_string()}),
            ),
        }
    };
    (
        code,
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; charset=utf-8",
        )],
        body.to_string(),
    )
        .into_response()
}

async fn readyz(State(s): State<Arc<EtcdServer>>) -> (StatusCode, &'static str) {
    if s.leader() == 0 {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready: no leader")
    } else {
        (StatusCode::OK, "ok")
    }
}

async fn version() -> Json<serde_json::Value> {
    Json(json!({
        "etcdserver": ETCD_API_VERSION,
        "etcdcluster": ETCD_CLUSTER_VERSION,
        "retcd": env!("CARGO_PKG_VERSION"),
    }))
}

async fn metrics(State(s): State<Arc<EtcdServer>>) -> String {
    s.render_metrics()
}
