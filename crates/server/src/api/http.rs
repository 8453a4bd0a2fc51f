//! HTTP endpoints served next to gRPC, as etcd 3.5.33 / 3.6 serve them:
//! `/health`, `/livez`, `/readyz` (with their per-check paths), `/version`
//! and `/metrics` on the client URLs; `/metrics`, `/health`, `/livez` and
//! `/readyz` on `--listen-metrics-urls` (no `/version` there), served
//! from start-up so probes see the member before it is ready.

use super::gateway::go_error;
use crate::config::version::cluster_version;
use crate::error::ServerError;
use crate::server::EtcdServer;
use axum::extract::{Query, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use std::sync::Arc;

type S = State<Arc<EtcdServer>>;

/// The client URLs' endpoints.
pub fn router(server: Arc<EtcdServer>) -> Router {
    let mut r = health_routes().route("/version", any(version));
    if server.cfg.enable_pprof {
        r = r.route("/debug/pprof/profile", any(cpu_profile));
    }
    r.with_state(server)
        .layer(axum::middleware::from_fn(super::gateway::cors))
}

/// The endpoints of `--listen-metrics-urls`. Any other path (`/version`
/// too) is Go's mux's `404 page not found`, with no CORS headers.
pub fn metrics_router(server: Arc<EtcdServer>) -> Router {
    health_routes()
        .fallback(|| async { go_error(StatusCode::NOT_FOUND, "404 page not found") })
        .with_state(server)
}

fn health_routes() -> Router<Arc<EtcdServer>> {
    let mut r = Router::new()
        .route("/health", any(health))
        .route("/metrics", any(metrics));
    for (which, root, checks) in [
        (Probe::Livez, "/livez", LIVEZ),
        (Probe::Readyz, "/readyz", READYZ),
    ] {
        r = r.route(
            root,
            any(move |s: S, m: Method, q: Q| probe(s, m, q, which, None)),
        );
        for check in checks {
            r = r.route(
                &format!("{root}/{check}"),
                any(move |s: S, m: Method, q: Q| probe(s, m, q, which, Some(check))),
            );
        }
    }
    r
}

fn not_allowed() -> Response {
    let mut r = go_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET"));
    r
}

/// A request's query pairs (`?exclude=A&exclude=B&verbose`), decoded.
type Q = Query<Vec<(String, String)>>;

/// Whether the query names `key`, and its values.
fn query_values(q: &[(String, String)], key: &str) -> (bool, Vec<String>) {
    let vals: Vec<String> = q
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .collect();
    (q.iter().any(|(k, _)| k == key), vals)
}

/// etcd's `/health`: alarms (those not excluded), then the leader (unless
/// `serializable=true`), then a one-key read; 200 `{"health":"true"}` or
/// 503 with the first reason.
async fn health(State(s): S, method: Method, q: Q) -> Response {
    if method != Method::GET {
        tracing::warn!(status_code = 405, "/health error");
        return not_allowed();
    }
    let (_, excluded) = query_values(&q, "exclude");
    let (_, ser) = query_values(&q, "serializable");
    let serializable = ser.first().is_some_and(|v| v == "true");
    let reason = health_reason(&s, &excluded, serializable).await;
    match reason {
        None => {
            crate::metrics::global().health_success.inc();
            (StatusCode::OK, r#"{"health":"true","reason":""}"#).into_response()
        }
        Some(reason) => {
            crate::metrics::global().health_failures.inc();
            let body = serde_json::json!({"health": "false", "reason": reason}).to_string();
            tracing::warn!(output = %body, status_code = 503, "/health error");
            go_error(StatusCode::SERVICE_UNAVAILABLE, &body)
        }
    }
}

async fn health_reason(s: &EtcdServer, excluded: &[String], serializable: bool) -> Option<String> {
    for a in s.alarm_names() {
        if !excluded.iter().any(|e| e == a) {
            tracing::warn!(alarm = a, "serving /health false due to an alarm");
            return Some(format!("ALARM {a}"));
        }
    }
    if !serializable && s.leader() == 0 {
        tracing::warn!("serving /health false; no leader");
        return Some("RAFT NO LEADER".to_string());
    }
    match s.health_read(serializable).await {
        Ok(()) => None,
        Err(e) => Some(format!("RANGE ERROR:{e}")),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Probe {
    Livez,
    Readyz,
}

const LIVEZ: &[&str] = &["serializable_read"];
const READYZ: &[&str] = &[
    "data_corruption",
    "serializable_read",
    "linearizable_read",
    "non_learner",
];

async fn run_check(s: &EtcdServer, name: &str) -> Result<(), String> {
    let read = |ser| async move {
        s.health_read(ser)
            .await
            .map_err(|e: ServerError| e.to_string())
    };
    match name {
        "serializable_read" => read(true).await,
        "linearizable_read" => read(false).await,
        "data_corruption" => {
            if s.alarm_names().contains(&"CORRUPT") {
                Err("alarm activated: CORRUPT".into())
            } else {
                Ok(())
            }
        }
        "non_learner" => {
            if s.is_learner() {
                Err("not supported for learner".into())
            } else {
                Ok(())
            }
        }
        _ => Ok(()),
    }
}

/// etcd's `/livez` and `/readyz` (3.5.11+ / 3.6 `health.go`): every check,
/// or one (`/readyz/<check>`); `?exclude=<check>` (root paths only) and
/// `?verbose`; a failure lists each check and ends with an empty line.
async fn probe(
    State(s): S,
    method: Method,
    q: Q,
    which: Probe,
    only: Option<&'static str>,
) -> Response {
    let path = match (which, only) {
        (Probe::Livez, None) => "/livez".to_string(),
        (Probe::Readyz, None) => "/readyz".to_string(),
        (Probe::Livez, Some(c)) => format!("/livez/{c}"),
        (Probe::Readyz, Some(c)) => format!("/readyz/{c}"),
    };
    if method != Method::GET {
        tracing::error!(path = %path, status_code = 405, "Health request error");
        return not_allowed();
    }
    let all = if which == Probe::Livez { LIVEZ } else { READYZ };
    let (verbose, _) = query_values(&q, "verbose");
    let (_, mut excluded) = query_values(&q, "exclude");
    let checks: Vec<&str> = match only {
        Some(c) => {
            excluded.clear();
            vec![c]
        }
        None => all.to_vec(),
    };
    let missing: Vec<&String> = excluded
        .iter()
        .filter(|e| !checks.contains(&e.as_str()))
        .collect();
    if !missing.is_empty() {
        let list: Vec<String> = missing.iter().map(|m| format!("{m:?}")).collect();
        tracing::warn!(
            missing_health_checks = %list.join(","),
            "some health checks cannot be excluded"
        );
    }
    let kind = if which == Probe::Livez {
        "livez"
    } else {
        "readyz"
    };
    let mut lines = String::new();
    let mut failed = false;
    for c in checks {
        if excluded.iter().any(|e| e == c) {
            lines.push_str(&format!("[+]{c} excluded: ok\n"));
            continue;
        }
        match run_check(&s, c).await {
            Ok(()) => {
                crate::metrics::global().healthcheck(kind, c, true);
                lines.push_str(&format!("[+]{c} ok\n"));
            }
            Err(e) => {
                crate::metrics::global().healthcheck(kind, c, false);
                failed = true;
                lines.push_str(&format!("[-]{c} failed: {e}\n"));
            }
        }
    }
    if failed {
        tracing::error!(path = %path, reason = %lines.trim_end(), status_code = 503, "Health check error");
        return go_error(StatusCode::SERVICE_UNAVAILABLE, &lines);
    }
    let body = if verbose {
        format!("{lines}ok")
    } else {
        "ok".to_string()
    };
    go_error(StatusCode::OK, &body)
}

/// `/version`: etcd's two fields (the version retcd implements or
/// emulates, and its cluster version), plus retcd's own.
async fn version(State(s): S, method: Method) -> Response {
    if method != Method::GET {
        return not_allowed();
    }
    let body = serde_json::json!({
        "etcdserver": s.cfg.etcd_version,
        "etcdcluster": cluster_version(&s.cfg.etcd_version),
        "retcd": crate::config::version::RETCD_VERSION,
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// `--enable-pprof`: `/debug/pprof/profile?seconds=N` (default 30, as
/// Go's handler) samples this process's CPU at 100 Hz and answers the
/// profile in pprof's gzipped protobuf format (`go tool pprof` reads it).
/// One profile at a time, as in Go.
async fn cpu_profile(q: Q) -> Response {
    static BUSY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    use std::sync::atomic::Ordering;
    let (_, secs) = query_values(&q, "seconds");
    let secs = match secs.first().map(|s| s.parse::<u64>()) {
        None => 30,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => return go_error(StatusCode::BAD_REQUEST, "Bad Request"),
    };
    if BUSY.swap(true, Ordering::SeqCst) {
        return go_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Could not enable CPU profiling: cpu profiling already in use",
        );
    }
    struct Release;
    impl Drop for Release {
        fn drop(&mut self) {
            BUSY.store(false, Ordering::SeqCst);
        }
    }
    let _release = Release;
    let guard = match pprof::ProfilerGuardBuilder::default()
        .frequency(100)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
    {
        Ok(g) => g,
        Err(e) => {
            return go_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("Could not enable CPU profiling: {e}"),
            )
        }
    };
    tokio::time::sleep(std::time::Duration::from_secs(secs)).await;
    // Symbolizing is CPU work: off the runtime.
    let built = tokio::task::spawn_blocking(move || {
        use pprof::protos::Message;
        let report = guard.report().build().map_err(|e| e.to_string())?;
        let profile = report.pprof().map_err(|e| e.to_string())?;
        // gzip-compressed, as Go's runtime/pprof writes it.
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&profile.encode_to_vec())
            .and_then(|_| gz.finish())
            .map_err(|e| e.to_string())
    })
    .await;
    match built {
        Ok(Ok(bytes)) => (
            [
                (header::CONTENT_TYPE, "application/octet-stream"),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"profile\"",
                ),
            ],
            bytes,
        )
            .into_response(),
        Ok(Err(e)) => go_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("Could not build the CPU profile: {e}"),
        ),
        Err(e) => go_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("Could not build the CPU profile: {e}"),
        ),
    }
}

async fn metrics(State(s): S) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.render_metrics(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_query_values() {
        let q: Vec<(String, String)> = [
            ("exclude", "NOSPACE"),
            ("exclude", "CORRUPT"),
            ("verbose", ""),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(
            query_values(&q, "exclude"),
            (true, vec!["NOSPACE".to_string(), "CORRUPT".to_string()])
        );
        assert!(query_values(&q, "verbose").0);
        assert!(!query_values(&q, "serializable").0);
    }
}
