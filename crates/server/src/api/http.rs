//! HTTP endpoints served on the client port next to gRPC, as etcd does:
//! `/health`, `/livez`, `/readyz`, `/version`.

use crate::config::{ETCD_API_VERSION, ETCD_CLUSTER_VERSION};
use crate::server::EtcdServer;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use std::sync::Arc;

pub fn router(server: Arc<EtcdServer>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/version", get(version))
        .route("/metrics", get(metrics))
        .with_state(server)
}

/// etcd 3.5's /health: healthy when this member knows a leader and a
/// linearizable read succeeds.
async fn health(State(s): State<Arc<EtcdServer>>) -> (StatusCode, Json<serde_json::Value>) {
    let r = health_check(&s).await;
    let m = crate::metrics::global();
    if r.0 == StatusCode::OK {
        m.health_success.inc();
    } else {
        m.health_failures.inc();
    }
    r
}

async fn health_check(s: &EtcdServer) -> (StatusCode, Json<serde_json::Value>) {
    if s.leader() == 0 {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"health": "false", "reason": "RAFT NO LEADER"})),
        );
    }
    match s.linearizable_read_notify().await {
        Ok(()) => (
            StatusCode::OK,
            Json(json!({"health": "true", "reason": ""})),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"health": "false", "reason": e.to_string()})),
        ),
    }
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
