//! HTTP endpoints served next to gRPC, as etcd 3.5.33 / 3.6 serve them:
//! `/health`, `/livez`, `/readyz` (with their per-check paths), `/version`
//! and `/metrics` on the client URLs; `/metrics`, `/health`, `/livez` and
//! `/readyz` on `--listen-metrics-urls` (no `/version` there), served
//! from start-up so probes see the member before it is ready.

use super::gateway::{go_error, go_redirect};
use crate::config::version::cluster_version;
use crate::error::ServerError;
use crate::server::EtcdServer;
use axum::extract::State;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use std::sync::Arc;

type S = State<Arc<EtcdServer>>;

/// The client URLs' endpoints (behind [`go_front`], which the client
/// port calls first).
pub fn router(server: Arc<EtcdServer>) -> Router {
    let mut r = health_routes()
        .route("/version", any(version))
        .route("/debug/vars", any(debug_vars));
    if server.cfg.enable_pprof {
        r = r.route("/debug/pprof/profile", any(cpu_profile));
    }
    r.with_state(server)
}

/// The endpoints of `--listen-metrics-urls`, behind [`go_front`]. Any
/// other path (`/version` too) is Go's mux's `404 page not found`, with
/// no CORS headers.
pub fn metrics_router(server: Arc<EtcdServer>) -> Router {
    let routes = health_routes()
        .fallback(|| async { go_error(StatusCode::NOT_FOUND, "404 page not found") })
        .with_state(server);
    Router::new().fallback_service(tower::service_fn(move |req: axum::extract::Request| {
        let routes = routes.clone();
        async move {
            use tower::ServiceExt;
            match go_front(req, false) {
                Front::Answer(resp) => Ok::<_, std::convert::Infallible>(resp),
                Front::Route(req, _) => routes.oneshot(req).await,
            }
        }
    }))
}

/// What [`go_front`] made of a request.
pub enum Front<B> {
    /// Answered there.
    Answer(Response),
    /// To the routes (its path decoded); with the origin the CORS headers
    /// then name (client port).
    Route(axum::http::Request<B>, Option<String>),
}

/// What runs before etcd's HTTP handlers, in Go's order:
/// * Go's server (HTTP/1.x): an HTTP/1.1 request without a `Host`, or
///   with two, is `400 Bad Request: <why>`; `OPTIONS *` is 200; a path
///   with an invalid `%` escape is `400 Bad Request` (none has CORS
///   headers);
/// * on the client port (`client`), etcd's access controller
///   (`gateway::access`): the `--host-whitelist` 421, the CORS origin,
///   and OPTIONS answered 200;
/// * Go's `ServeMux` (1.16, etcd 3.5's): the target `*` is 400; routing
///   is on the *decoded* path (`/%68ealth` is `/health`; the client port
///   first turns `/v3beta/` into `/v3/`); a path that is not clean
///   (`//x`, `/./x`, `/a/../x`, `/v3//kv/range`) is redirected (301) to
///   its clean form, the query kept, as `/v3` is to the gateway's `/v3/`
///   (not for CONNECT).
pub fn go_front<B>(mut req: axum::http::Request<B>, client: bool) -> Front<B> {
    use axum::http::Version;
    let h1 = matches!(
        req.version(),
        Version::HTTP_09 | Version::HTTP_10 | Version::HTTP_11
    );
    // the request target first (an invalid escape), then its headers
    let star = req.uri().path() == "*";
    let decoded = if star {
        Some(b"*".to_vec())
    } else {
        go_unescape(req.uri().path(), false)
    };
    let Some(decoded) = decoded else {
        return Front::Answer(go_bad_request(None));
    };
    if h1 {
        let hosts = req.headers().get_all(header::HOST).iter().count();
        if req.version() == Version::HTTP_11 && hosts == 0 && req.method() != Method::CONNECT {
            return Front::Answer(go_bad_request(Some("missing required Host header")));
        }
        if hosts > 1 {
            return Front::Answer(go_bad_request(Some("too many Host headers")));
        }
    }
    if star && h1 && req.method() == Method::OPTIONS {
        // Go's globalOptionsHandler
        return Front::Answer((StatusCode::OK, [(header::CONTENT_LENGTH, "0")]).into_response());
    }
    let origin = if client {
        match super::gateway::access(&req) {
            Ok(o) => o,
            Err(refused) => return Front::Answer(*refused),
        }
    } else {
        None
    };
    let answer = |mut r: Response| {
        if let Some(o) = &origin {
            super::gateway::add_cors_headers(r.headers_mut(), o);
        }
        Front::Answer(r)
    };
    if client && req.method() == Method::OPTIONS {
        return answer(StatusCode::OK.into_response());
    }
    if star {
        let mut r = StatusCode::BAD_REQUEST.into_response();
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return answer(r);
    }
    let mut path = decoded;
    if client && path.starts_with(b"/v3beta/") {
        path.splice(..8, b"/v3/".iter().copied());
    }
    if req.method() != Method::CONNECT {
        let clean = go_clean_path(&path);
        let to_v3 = client && clean == b"/v3";
        if clean != path || to_v3 {
            // `/v3` → `/v3/` (`redirectToPathSlash`): a new URL of the
            // path and the query; else the request's URL with the clean
            // path (an absolute target's scheme and host, a bare `?` kept)
            let mut location = String::new();
            let uri = req.uri();
            if let (false, Some(scheme), Some(authority)) = (to_v3, uri.scheme(), uri.authority()) {
                location = format!("{scheme}://{authority}");
            }
            location.push_str(&go_escape_path(if to_v3 { b"/v3/" } else { &clean }));
            match uri.query() {
                Some("") if to_v3 => {}
                Some(q) => {
                    location.push('?');
                    location.push_str(q);
                }
                None => {}
            }
            return answer(go_redirect(req.method(), &location));
        }
    }
    if path != req.uri().path().as_bytes() {
        // route on the decoded path (when it is one a URI can hold: else
        // no route has it, and the encoded one gets the same 404)
        let path = String::from_utf8_lossy(&path).into_owned();
        let pq = match req.uri().query() {
            Some(q) => format!("{path}?{q}"),
            None => path,
        };
        if let Ok(pq) = axum::http::uri::PathAndQuery::try_from(pq) {
            let mut parts = req.uri().clone().into_parts();
            parts.path_and_query = Some(pq);
            if let Ok(uri) = axum::http::Uri::from_parts(parts) {
                *req.uri_mut() = uri;
            }
        }
    }
    Front::Route(req, origin)
}

/// Go's server refusing a request it could not read: `400 Bad Request`
/// (and why) as text, the connection closed.
fn go_bad_request(why: Option<&str>) -> Response {
    let text = match why {
        Some(w) => format!("400 Bad Request: {w}"),
        None => "400 Bad Request".to_string(),
    };
    (
        StatusCode::BAD_REQUEST,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CONNECTION, "close"),
        ],
        text,
    )
        .into_response()
}

/// Go's `url` unescaping: `%XX` decoded, an invalid escape an error; in a
/// query (`query`) `+` is a space.
fn go_unescape(s: &str, query: bool) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = |c: u8| (c as char).to_digit(16);
                let hi = hex(*b.get(i + 1)?)?;
                let lo = hex(*b.get(i + 2)?)?;
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            b'+' if query => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Some(out)
}

/// Go's `url.PathEscape`-like escaping of a path (`encodePath`): letters,
/// digits and `-_.~$&+,/:;=@` kept, every other byte `%XX`.
fn go_escape_path(p: &[u8]) -> String {
    let mut out = String::with_capacity(p.len());
    for &c in p {
        if c.is_ascii_alphanumeric() || b"-_.~$&+,/:;=@".contains(&c) {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

/// Go's `ServeMux` `cleanPath`: `path.Clean`, a trailing slash kept.
fn go_clean_path(p: &[u8]) -> Vec<u8> {
    let mut parts: Vec<&[u8]> = Vec::new();
    for seg in p.split(|&c| c == b'/') {
        match seg {
            b"" | b"." => {}
            b".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    let mut out = b"/".to_vec();
    out.extend_from_slice(&parts.join(&b'/'));
    if p.ends_with(b"/") && out != b"/" {
        out.push(b'/');
    }
    out
}

/// A request's query as Go's `r.URL.Query()` (1.17+, etcd 3.5.24's)
/// reads it: pairs split at `&`; a pair holding a `;` or an invalid
/// escape dropped; `+` a space.
fn go_query(raw: Option<&str>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for pair in raw.unwrap_or("").split('&') {
        if pair.is_empty() || pair.contains(';') {
            continue;
        }
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if let (Some(k), Some(v)) = (go_unescape(k, true), go_unescape(v, true)) {
            out.push((
                String::from_utf8_lossy(&k).into_owned(),
                String::from_utf8_lossy(&v).into_owned(),
            ));
        }
    }
    out
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

/// A request's query pairs (`?exclude=A&exclude=B&verbose`), decoded as
/// Go reads them ([`go_query`]).
struct Q(Vec<(String, String)>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Q {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Q, Self::Rejection> {
        Ok(Q(go_query(parts.uri.query())))
    }
}

impl std::ops::Deref for Q {
    type Target = [(String, String)];

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

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
            // etcd runs (and lists) only the checks not excluded
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
    // etcd's field order (`version.Versions`), then retcd's own
    #[derive(serde::Serialize)]
    struct Versions<'a> {
        etcdserver: &'a str,
        etcdcluster: String,
        retcd: &'a str,
    }
    let body = Versions {
        etcdserver: &s.cfg.etcd_version,
        etcdcluster: cluster_version(&s.cfg.etcd_version),
        retcd: crate::config::version::RETCD_VERSION,
    };
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_string(&body).unwrap_or_default(),
    )
        .into_response()
}

/// `/debug/vars` (etcd's `HandleBasic`: Go's expvar on the client URLs):
/// `cmdline` (the process's arguments), `file_descriptor_limit` (the
/// soft `RLIMIT_NOFILE`) and `raft.status` (etcd raft's `Status`), in
/// expvar's layout (keys sorted, one a line). Go's `memstats` (its
/// runtime's allocator statistics) has no counterpart here and is left
/// out.
async fn debug_vars(State(s): S, method: Method) -> Response {
    if method != Method::GET {
        return not_allowed();
    }
    let args: Vec<String> = std::env::args().collect();
    // the soft limit, as Go's `runtimeutil.FDLimit` (`/proc/self/limits`)
    let fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            l.lines()
                .find_map(|l| l.strip_prefix("Max open files"))
                .and_then(|v| v.split_whitespace().next().map(str::to_string))
        })
        .map(|v| match v.as_str() {
            "unlimited" => u64::MAX,
            n => n.parse().unwrap_or(0),
        })
        .unwrap_or(0);
    let body = format!(
        "{{\n\"cmdline\": {},\n\"file_descriptor_limit\": {fds},\n\"raft.status\": {}\n}}\n",
        serde_json::to_string(&args).unwrap_or_else(|_| "[]".into()),
        s.raft_status_json().await
    );
    (
        [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
        body,
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

/// `/metrics` (any method, as promhttp), gzipped when the client's
/// `Accept-Encoding` (its first) names gzip, as promhttp 1.11 (etcd
/// 3.5's) decides: a part that is `gzip` or starts with `gzip;`.
async fn metrics(State(s): S, headers: axum::http::HeaderMap) -> Response {
    const TEXT: (header::HeaderName, &str) = (
        header::CONTENT_TYPE,
        "text/plain; version=0.0.4; charset=utf-8",
    );
    let text = s.render_metrics();
    let gzip = headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| {
            a.split(',')
                .map(str::trim)
                .any(|p| p == "gzip" || p.starts_with("gzip;"))
        });
    if gzip {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        if let Ok(bytes) = gz.write_all(text.as_bytes()).and_then(|_| gz.finish()) {
            return ([TEXT, (header::CONTENT_ENCODING, "gzip")], bytes).into_response();
        }
    }
    ([TEXT], text).into_response()
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

    #[test]
    fn test_go_url_handling() {
        assert_eq!(go_clean_path(b"//health"), b"/health");
        assert_eq!(go_clean_path(b"/a/../version"), b"/version");
        assert_eq!(go_clean_path(b"/./v3/"), b"/v3/");
        assert_eq!(go_clean_path(b"/v3//kv/range/"), b"/v3/kv/range/");
        assert_eq!(go_clean_path(b"/.."), b"/");
        assert_eq!(go_unescape("/%68ealth", false), Some(b"/health".to_vec()));
        assert_eq!(go_unescape("/a+b", false), Some(b"/a+b".to_vec()));
        assert_eq!(go_unescape("a+b", true), Some(b"a b".to_vec()));
        assert_eq!(go_unescape("/%zz", false), None);
        assert_eq!(go_unescape("/%4", false), None);
        assert_eq!(go_escape_path(b"/a b/%/x;y=1"), "/a%20b/%25/x;y=1");
        let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            go_query(Some(
                "exclude=NOSPACE&&verbose&verbose=%zz&x;y&exclude=NO+SPACE"
            )),
            pairs(&[
                ("exclude", "NOSPACE"),
                ("verbose", ""),
                ("exclude", "NO SPACE")
            ])
        );
        assert_eq!(go_query(None), pairs(&[]));
    }

    #[test]
    fn test_go_front() {
        use axum::http::Request;
        let req = |target: &str, hosts: usize| {
            let mut b = Request::builder().method("GET").uri(target);
            for _ in 0..hosts {
                b = b.header("host", "127.0.0.1:2379");
            }
            b.body(()).unwrap()
        };
        let answered = |f: Front<()>| match f {
            Front::Answer(r) => Some((
                r.status().as_u16(),
                r.headers()
                    .get(header::LOCATION)
                    .map(|l| l.to_str().unwrap().to_string()),
            )),
            Front::Route(..) => None,
        };
        assert_eq!(
            answered(go_front(req("/health", 0), false)),
            Some((400, None))
        );
        assert_eq!(
            answered(go_front(req("/health", 2), false)),
            Some((400, None))
        );
        assert_eq!(answered(go_front(req("/%zz", 1), false)), Some((400, None)));
        assert_eq!(
            answered(go_front(req("//health?x", 1), false)),
            Some((301, Some("/health?x".into())))
        );
        assert_eq!(
            answered(go_front(req("/v3?", 1), true)),
            Some((301, Some("/v3/".into())))
        );
        assert_eq!(answered(go_front(req("*", 1), true)), Some((400, None)));
        match go_front(req("/v3beta/kv%2Frange?a", 1), true) {
            Front::Route(r, origin) => {
                assert_eq!(r.uri().to_string(), "/v3/kv/range?a");
                assert_eq!(origin.as_deref(), Some("*"));
            }
            Front::Answer(r) => panic!("answered {r:?}"),
        }
    }
}
