//! etcd's JSON gateway (grpc-gateway) on the client port: `POST /v3/...`
//! (and the older `/v3beta/...`) with a JSON request body, answered with
//! the JSON response, for the unary RPCs of KV, Lease, Cluster,
//! Maintenance, Auth, Lock and Election. JSON is the protobuf JSON mapping
//! with the .proto field names, as etcd's gateway (`OrigName: true`): bytes
//! as base64, 64-bit integers as strings, enums by name, default values
//! left out. The `Authorization` header carries an auth token.
//!
//! A request runs the same service code as its gRPC twin, in process. An
//! error is answered as grpc-gateway does: the HTTP status for the gRPC
//! code and `{"error", "code", "message"}`.
//!
//! Streams (`/v3/watch`, `/v3/lease/keepalive`, `/v3/election/observe`)
//! answer one JSON object a line, `{"result": ...}`, as long as the client
//! reads; the body's requests (one or more JSON objects) are sent first and
//! the request side stays open. They call the gRPC services in process.
//! Not served: `/v3/maintenance/snapshot`. Other paths under `/v3/`
//! answer 404.

use super::error_map::to_status;
use super::grpc::{auth, cluster, election, kv, lease, lock, maintenance, ClientServices};
use super::require_leader;
use crate::error::ServerError;
use crate::server::EtcdServer;
use axum::body::Bytes;
use axum::http::Method;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use retcd_api::etcdserverpb::auth_server::Auth;
use retcd_api::etcdserverpb::cluster_server::Cluster;
use retcd_api::etcdserverpb::kv_server::Kv;
use retcd_api::etcdserverpb::lease_client::LeaseClient;
use retcd_api::etcdserverpb::lease_server::Lease;
use retcd_api::etcdserverpb::maintenance_server::Maintenance;
use retcd_api::etcdserverpb::watch_client::WatchClient;
use retcd_api::v3electionpb::election_client::ElectionClient;
use retcd_api::v3electionpb::election_server::Election;
use retcd_api::v3electionpb::LeaderRequest;
use retcd_api::v3lockpb::lock_server::Lock;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::future::Future;
use std::sync::Arc;
use tonic::{Code, Status};

/// What a learner serves (Range checks `serializable` itself).
const LEARNER_PATHS: &[&str] = &["/maintenance/status", "/kv/range"];

/// The services, shared by every gateway route.
struct Services {
    kv: kv::KvService,
    lease: lease::LeaseService,
    cluster: cluster::ClusterService,
    maintenance: maintenance::MaintenanceService,
    auth: auth::AuthService,
    lock: lock::LockService,
    election: election::ElectionService,
}

/// grpc-gateway's HTTP status for a gRPC code (`HTTPStatusFromCode`, as in
/// etcd 3.5).
fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        // grpc-gateway v1.16 (etcd 3.5) and v2 (3.6); v1.9.5 (3.4) said 412
        Code::FailedPrecondition => StatusCode::BAD_REQUEST,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// grpc-gateway's error body, fields in v1.16's order (etcd 3.5).
#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    code: i32,
    message: &'a str,
}

fn error(status: &Status) -> Response {
    let body = ErrorBody {
        error: status.message(),
        message: status.message(),
        code: status.code() as i32,
    };
    (http_status(status.code()), axum::Json(body)).into_response()
}

/// The header grpc-gateway adds from the gRPC response's header metadata
/// (`Grpc-Metadata-` + the gRPC `content-type`), on every answer that got
/// as far as the server's headers: unary successes and streams whose
/// server sent a message.
const GRPC_METADATA_CT: (&str, &str) = ("grpc-metadata-content-type", "application/grpc");

/// Decodes the body (empty = the default request), runs `call` with the
/// `Authorization` header as the `token` metadata, encodes the answer.
/// `refuse` is etcd's interceptor, which grpc-gateway's call passes after
/// the body is decoded: it sees the call's metadata and may answer first.
async fn unary<Req, Resp, F, Fut>(
    headers: HeaderMap,
    body: Bytes,
    refuse: impl FnOnce(&HeaderMap) -> Option<Status>,
    call: F,
) -> Response
where
    Req: DeserializeOwned + Default,
    Resp: Serialize,
    F: FnOnce(tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    let req: Req = match go_json(&body) {
        Ok(r) => r,
        Err(e) => return error(&to_status(ServerError::BadRequestBody(e.to_string()))),
    };
    let request = with_token(&headers, req);
    if let Some(status) = refuse(request.metadata().as_ref()) {
        return error(&status);
    }
    match call(request).await {
        Ok(resp) => ([GRPC_METADATA_CT], axum::Json(resp.into_inner())).into_response(),
        Err(status) => error(&status),
    }
}

/// A unary body decoded as grpc-gateway decodes it (Go's
/// `json.Decoder.Decode`, then jsonpb): only the first JSON value counts
/// (what follows it is ignored); a body that is empty or `null` is the
/// default request; a member set to `null` is
/// absent; of a member given twice the last counts, and of a member given
/// by its .proto name and by its camelCase one, the camelCase one (even a
/// `null` one).
fn go_json<Req: DeserializeOwned + Default>(body: &[u8]) -> Result<Req, serde_json::Error> {
    match serde_json::Deserializer::from_slice(body)
        .into_iter::<serde_json::Value>()
        .next()
    {
        None => Ok(Req::default()),
        Some(v) => go_decode(v?),
    }
}

/// One JSON value decoded as jsonpb decodes it: `null` is the default
/// request, members as [`go_clean`] leaves them.
fn go_decode<Req: DeserializeOwned + Default>(
    mut v: serde_json::Value,
) -> Result<Req, serde_json::Error> {
    if v.is_null() {
        return Ok(Req::default());
    }
    go_clean(&mut v);
    serde_json::from_value(v)
}

/// A JSON value as jsonpb reads it (see [`go_json`]): members set to
/// `null` dropped, a .proto-named member shadowed by its camelCase twin
/// dropped.
fn go_clean(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            // the camelCase member wins even when it is `null` (then
            // the field keeps its default), as in jsonpb
            let shadowed: Vec<String> = m
                .keys()
                .filter(|k| k.contains('_') && m.contains_key(&camel(k)))
                .cloned()
                .collect();
            for k in shadowed {
                m.remove(&k);
            }
            m.retain(|_, v| !v.is_null());
            m.values_mut().for_each(go_clean);
        }
        Value::Array(a) => a.iter_mut().for_each(go_clean),
        _ => {}
    }
}

/// A .proto field name's camelCase JSON name (`prev_kv` → `prevKv`).
fn camel(k: &str) -> String {
    let mut out = String::with_capacity(k.len());
    let mut up = false;
    for c in k.chars() {
        if c == '_' {
            up = true;
        } else if up {
            out.extend(c.to_uppercase());
            up = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// The JSON values of a streaming call's body, read as they arrive (as
/// grpc-gateway's `json.Decoder` reads `req.Body`): a value is decoded as
/// soon as its last byte is in, so a client that keeps the body open gets
/// answers to what it sent so far.
struct BodyValues {
    data: axum::body::BodyDataStream,
    /// Bytes received and not yet decoded (bounded by [`MAX_BODY_VALUE`]).
    buf: Vec<u8>,
    done: bool,
}

/// The most a streaming body may hold undecoded: one value's bytes, as
/// much as a unary body may (axum's default body limit).
const MAX_BODY_VALUE: usize = 2 << 20;

/// How much of a request body Go's server reads and drops after its
/// handler returned before it closes the connection instead
/// (`maxPostHandlerReadBytes` in net/http).
const MAX_DRAIN_BYTES: usize = 256 << 10;

impl BodyValues {
    fn new(body: axum::body::Body) -> BodyValues {
        BodyValues {
            data: body.into_data_stream(),
            buf: Vec::new(),
            done: false,
        }
    }

    /// The next value, `None` at the body's end; an error for bytes that
    /// are not JSON (or a body that ends inside a value).
    async fn next(&mut self) -> Result<Option<serde_json::Value>, String> {
        use futures::StreamExt;
        loop {
            let mut values =
                serde_json::Deserializer::from_slice(&self.buf).into_iter::<serde_json::Value>();
            let parsed = values.next();
            let used = values.byte_offset();
            match parsed {
                // Go's decoder knows an object or array is whole at its
                // closing bracket, but a bare value (`null`, a number, a
                // string) only once a byte follows it or the body ends
                Some(Ok(v))
                    if self.done || used < self.buf.len() || v.is_object() || v.is_array() =>
                {
                    self.buf.drain(..used);
                    return Ok(Some(v));
                }
                Some(Err(e)) if !e.is_eof() || self.done => return Err(e.to_string()),
                None if self.done => return Ok(None),
                _ => {} // more bytes needed
            }
            if self.buf.len() > MAX_BODY_VALUE {
                return Err("request body too large".into());
            }
            match self.data.next().await {
                Some(Ok(b)) => self.buf.extend_from_slice(&b),
                Some(Err(e)) => return Err(e.to_string()),
                None => self.done = true,
            }
        }
    }

    /// Reads and drops the rest of the body, up to [`MAX_DRAIN_BYTES`], as
    /// Go's server does once its handler has returned: a client still
    /// writing the body after its stream ended (a value that did not
    /// decode ends it) does not meet a closed connection, which hyper
    /// gives it when the body is dropped unread (the client's next write
    /// fails with a broken pipe; etcd's client sees none).
    async fn drain(mut self) {
        use futures::StreamExt;
        let mut left = MAX_DRAIN_BYTES;
        while !self.done {
            match self.data.next().await {
                Some(Ok(b)) if b.len() <= left => left -= b.len(),
                _ => return,
            }
        }
    }

    /// The next request: a value decoded as jsonpb decodes it (`null` is
    /// the default request).
    async fn next_request<Req: DeserializeOwned + Default>(
        &mut self,
    ) -> Result<Option<Req>, String> {
        match self.next().await? {
            Some(v) => go_decode(v).map(Some).map_err(|e| e.to_string()),
            None => Ok(None),
        }
    }
}

/// One streamed message as grpc-gateway v1.16 writes it: the marshalled
/// `{"result": ...}`, then the `\n` delimiter, flushed together (one HTTP
/// chunk).
fn result_chunk<Resp: Serialize>(m: &Resp) -> Bytes {
    let mut v = b"{\"result\":".to_vec();
    if serde_json::to_writer(&mut v, m).is_err() {
        v.extend_from_slice(b"{}");
    }
    v.extend_from_slice(b"}\n");
    Bytes::from(v)
}

/// grpc-gateway v1.16's stream error (`handleForwardResponseStreamError`):
/// the `StreamError` message under `"error"`, with no delimiter after it
/// (its `details` are empty for etcd's errors, and jsonpb leaves an empty
/// list out, in 3.4 and 3.5 alike);
/// the stream ends there.
fn error_chunk(s: &Status) -> Bytes {
    let http = http_status(s.code());
    let text = |t: &str| serde_json::to_string(t).unwrap_or_default();
    Bytes::from(format!(
        "{{\"error\":{{\"grpc_code\":{},\"http_code\":{},\"message\":{},\"http_status\":{}}}}}",
        s.code() as i32,
        http.as_u16(),
        text(s.message()),
        text(http.canonical_reason().unwrap_or_default()),
    ))
}

/// A streaming call's answer, as grpc-gateway's `ForwardResponseStream`:
/// nothing is written before the first message (Go writes the headers
/// with the first flush), then `200`, chunked, one chunk per message. A
/// stream that ends before any message is an empty chunked `200`; one that
/// fails before any message is answered as a unary error (the gateway's
/// `stream.Header()` returns the status); a later failure ends the stream
/// with [`error_chunk`]. `sent_requests`: whether the body held a request,
/// i.e. whether the gateway waited for the server's header metadata
/// (`Grpc-Metadata-Content-Type`).
async fn stream_body<Resp, S>(mut inbound: S, sent_requests: bool) -> Response
where
    Resp: Serialize + Send + 'static,
    S: tokio_stream::Stream<Item = Result<Resp, Status>> + Send + Unpin + 'static,
{
    use futures::StreamExt;
    let first = match inbound.next().await {
        None => None,
        Some(Ok(m)) => Some(result_chunk(&m)),
        Some(Err(s)) => return error(&s),
    };
    let with_md = sent_requests && first.is_some();
    let rest = futures::stream::unfold(Some(inbound), |state| async move {
        let mut inbound = state?;
        match inbound.next().await {
            None => None,
            Some(Ok(m)) => Some((result_chunk(&m), Some(inbound))),
            Some(Err(s)) => Some((error_chunk(&s), None)),
        }
    });
    let chunks = futures::stream::iter(first)
        .chain(rest)
        .map(Ok::<_, std::convert::Infallible>);
    let mut resp = (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        axum::body::Body::from_stream(chunks),
    )
        .into_response();
    if with_md {
        let (k, v) = GRPC_METADATA_CT;
        resp.headers_mut()
            .insert(k, axum::http::HeaderValue::from_static(v));
    }
    resp
}

/// `Authorization` as the `token` metadata of `req`.
/// grpc-gateway's header mapping: `Authorization` becomes the
/// `authorization` metadata, `Grpc-Metadata-Token` the `token` metadata
/// (which wins, as in etcd), `Grpc-Metadata-Hasleader` the `hasleader`
/// metadata (`require_leader`); the rest of the client's headers mean
/// nothing to etcd's server and are not passed on.
fn with_token<T>(headers: &HeaderMap, req: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(req);
    for (header, key) in [
        ("authorization", "authorization"),
        ("grpc-metadata-token", "token"),
        ("grpc-metadata-hasleader", require_leader::KEY),
    ] {
        if let Some(v) = headers
            .get(header)
            .and_then(|v| tonic::metadata::MetadataValue::try_from(v.as_bytes()).ok())
        {
            request.metadata_mut().insert(key, v);
        }
    }
    request
}

/// A bidirectional stream as grpc-gateway runs it: the body's requests go
/// out, then the request side is closed (`CloseSend` at the body's end), so
/// a keepalive ends after its answers while a watch stays open (etcd's
/// watch server keeps sending after the client's half-close).
async fn bidi<Req, Resp, F, Fut>(headers: HeaderMap, body: axum::body::Body, call: F) -> Response
where
    Req: DeserializeOwned + Default + Send + 'static,
    Resp: Serialize + Send + 'static,
    F: FnOnce(tonic::Request<tokio_stream::wrappers::ReceiverStream<Req>>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<tonic::Streaming<Resp>>, Status>>,
{
    // The first request is read before the call (one that does not
    // decode is answered 500, code Unknown); the rest go out as they come
    // (a later one that does not decode ends them), then the request side
    // closes.
    let mut values = BodyValues::new(body);
    let first = match values.next_request::<Req>().await {
        Ok(r) => r,
        Err(e) => return error(&Status::unknown(e)),
    };
    let sent_requests = first.is_some();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    match first {
        Some(r) => {
            let _ = tx.try_send(r);
            tokio::spawn(async move {
                while let Ok(Some(r)) = values.next_request::<Req>().await {
                    if tx.send(r).await.is_err() {
                        break;
                    }
                }
                // the request side closes (`CloseSend`), then the rest of
                // the body is read as Go's server reads it
                drop(tx);
                values.drain().await;
            });
        }
        None => drop(tx), // an empty body: the request side closes at once
    }
    let request = with_token(&headers, tokio_stream::wrappers::ReceiverStream::new(rx));
    match call(request).await {
        Ok(resp) => stream_body(resp.into_inner(), sent_requests).await,
        Err(s) => error(&s),
    }
}

/// `routes!(router, services; "/path" => field.method, ...)`: one POST
/// route per path, under both `/v3` and `/v3beta`.
macro_rules! routes {
    ($router:ident, $svc:ident; $($path:literal => $field:ident . $method:ident),* $(,)?) => {
        $(
            for prefix in ["/v3", "/v3beta"] {
                let s = $svc.clone();
                $router = $router.route(
                    &format!("{prefix}{}", $path),
                    any(move |method: Method, headers: HeaderMap, body: Bytes| {
                        let s = s.clone();
                        async move {
                            if method != Method::POST {
                                return method_not_allowed();
                            }
                            // etcd's interceptor: the learner rule, as for
                            // gRPC (streams get theirs below), then
                            // `hasleader`
                            let server = s.kv.server.clone();
                            let refuse = |md: &HeaderMap| {
                                if !LEARNER_PATHS.contains(&$path) && server.is_learner() {
                                    return Some(to_status(ServerError::NotSupportedForLearner));
                                }
                                require_leader::refused(&server, md)
                            };
                            unary(headers, body, refuse, |r| async move { s.$field.$method(r).await }).await
                        }
                    }),
                );
            }
        )*
    };
}

/// The gateway's routes, to merge into the client port's router; the
/// streams call `services.routes` in process.
pub fn router(server: &Arc<EtcdServer>, services: &ClientServices) -> Router {
    let svc = Arc::new(Services {
        kv: kv::KvService {
            server: server.clone(),
        },
        lease: lease::LeaseService {
            server: server.clone(),
        },
        cluster: cluster::ClusterService {
            server: server.clone(),
        },
        maintenance: maintenance::MaintenanceService {
            server: server.clone(),
        },
        auth: auth::AuthService {
            server: server.clone(),
        },
        lock: services.lock.clone(),
        election: services.election.clone(),
    });
    // grpc-gateway calls the streams through etcd's gRPC server, whose
    // interceptor sees their `hasleader`
    let own_stream = require_leader::Gated {
        server: server.clone(),
        inner: services.routes.clone(),
    };
    let mut r = Router::new();
    routes!(r, svc;
        "/kv/range" => kv.range,
        "/kv/put" => kv.put,
        "/kv/deleterange" => kv.delete_range,
        "/kv/txn" => kv.txn,
        "/kv/compaction" => kv.compact,
        "/lease/grant" => lease.lease_grant,
        "/lease/revoke" => lease.lease_revoke,
        "/kv/lease/revoke" => lease.lease_revoke,
        "/lease/timetolive" => lease.lease_time_to_live,
        "/kv/lease/timetolive" => lease.lease_time_to_live,
        "/lease/leases" => lease.lease_leases,
        "/kv/lease/leases" => lease.lease_leases,
        "/cluster/member/add" => cluster.member_add,
        "/cluster/member/remove" => cluster.member_remove,
        "/cluster/member/update" => cluster.member_update,
        "/cluster/member/list" => cluster.member_list,
        "/cluster/member/promote" => cluster.member_promote,
        "/maintenance/alarm" => maintenance.alarm,
        "/maintenance/status" => maintenance.status,
        "/maintenance/defragment" => maintenance.defragment,
        // etcd 3.4 and 3.5 < 3.5.10 registered Hash and HashKV on the one
        // path `/hash` (Hash answered); 3.5.10+ (#16490) serves HashKV on
        // `/hashkv`.
        "/maintenance/hash" => maintenance.hash,
        "/maintenance/hashkv" => maintenance.hash_kv,
        "/maintenance/transfer-leadership" => maintenance.move_leader,
        "/auth/enable" => auth.auth_enable,
        "/auth/disable" => auth.auth_disable,
        "/auth/status" => auth.auth_status,
        "/auth/authenticate" => auth.authenticate,
        "/auth/user/add" => auth.user_add,
        "/auth/user/get" => auth.user_get,
        "/auth/user/list" => auth.user_list,
        "/auth/user/delete" => auth.user_delete,
        "/auth/user/changepw" => auth.user_change_password,
        "/auth/user/grant" => auth.user_grant_role,
        "/auth/user/revoke" => auth.user_revoke_role,
        "/auth/role/add" => auth.role_add,
        "/auth/role/get" => auth.role_get,
        "/auth/role/list" => auth.role_list,
        "/auth/role/delete" => auth.role_delete,
        "/auth/role/grant" => auth.role_grant_permission,
        "/auth/role/revoke" => auth.role_revoke_permission,
        "/lock/lock" => lock.lock,
        "/lock/unlock" => lock.unlock,
        "/election/campaign" => election.campaign,
        "/election/proclaim" => election.proclaim,
        "/election/leader" => election.leader,
        "/election/resign" => election.resign,
    );
    for prefix in ["/v3", "/v3beta"] {
        let (ch, srv) = (own_stream.clone(), server.clone());
        r = r.route(
            &format!("{prefix}/watch"),
            any(
                move |method: Method, headers: HeaderMap, body: axum::body::Body| {
                    let mut c = WatchClient::new(ch.clone());
                    let learner = srv.is_learner();
                    async move {
                        if method != Method::POST {
                            return method_not_allowed();
                        }
                        if learner {
                            return error(&to_status(ServerError::NotSupportedForLearner));
                        }
                        bidi(headers, body, |req| async move { c.watch(req).await }).await
                    }
                },
            ),
        );
        let (ch, srv) = (own_stream.clone(), server.clone());
        r = r.route(
            &format!("{prefix}/lease/keepalive"),
            any(
                move |method: Method, headers: HeaderMap, body: axum::body::Body| {
                    let mut c = LeaseClient::new(ch.clone());
                    let learner = srv.is_learner();
                    async move {
                        if method != Method::POST {
                            return method_not_allowed();
                        }
                        if learner {
                            return error(&to_status(ServerError::NotSupportedForLearner));
                        }
                        bidi(
                            headers,
                            body,
                            |req| async move { c.lease_keep_alive(req).await },
                        )
                        .await
                    }
                },
            ),
        );
        let (ch, srv) = (own_stream.clone(), server.clone());
        r = r.route(
            &format!("{prefix}/election/observe"),
            any(move |method: Method, headers: HeaderMap, body: Bytes| {
                let mut c = ElectionClient::new(ch.clone());
                let learner = srv.is_learner();
                async move {
                    if method != Method::POST {
                        return method_not_allowed();
                    }
                    if learner {
                        return error(&to_status(ServerError::NotSupportedForLearner));
                    }
                    // A server-streaming call: grpc-gateway decodes the first
                    // JSON object of the body (none = the default request).
                    let req = match go_json::<LeaderRequest>(&body) {
                        Ok(r) => r,
                        Err(e) => {
                            return error(&to_status(ServerError::BadRequestBody(e.to_string())))
                        }
                    };
                    match c.observe(with_token(&headers, req)).await {
                        Ok(resp) => stream_body(resp.into_inner(), true).await,
                        Err(s) => error(&s),
                    }
                }
            }),
        );
        // grpc-gateway answers other paths under its prefixes 404.
        for path in [format!("{prefix}/"), format!("{prefix}/{{*rest}}")] {
            r = r.route(
                &path,
                any(|| async { go_error(StatusCode::NOT_FOUND, "Not Found") }),
            );
        }
    }
    r
}

/// Go's `http.Error(w, text, code)`: `text` and a newline as
/// `text/plain; charset=utf-8`, with `X-Content-Type-Options: nosniff`.
/// grpc-gateway answers an unknown path (`Not Found`) and another method
/// (`Method Not Allowed`, with no `Allow`) with it, Go's mux an unknown
/// path outside the gateway (`404 page not found`).
pub fn go_error(code: StatusCode, text: &str) -> Response {
    (
        code,
        [
            (
                axum::http::header::CONTENT_TYPE,
                "text/plain; charset=utf-8",
            ),
            (axum::http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        format!("{text}\n"),
    )
        .into_response()
}

/// grpc-gateway's answer to a method other than POST on an RPC's path
/// (no `Allow` header, so the routes take any method and call this).
fn method_not_allowed() -> Response {
    go_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")
}

/// etcd's CORS handler around its HTTP (non-gRPC) client handler, with
/// `--cors` and `--host-whitelist`, set once at start-up (etcd's
/// `AccessController`).
struct Access {
    /// Allowed origins; `*` allows any.
    cors: Vec<String>,
    /// Host names accepted when every client URL is insecure; None: any.
    hosts: Option<Vec<String>>,
}

static ACCESS: std::sync::OnceLock<Access> = std::sync::OnceLock::new();

/// Sets the client HTTP endpoints' access rules; `secure`: the client
/// URLs use TLS (then every Host is accepted, as etcd does).
pub fn set_access(cors: &[String], host_whitelist: &[String], secure: bool) {
    let hosts =
        (!secure && !host_whitelist.iter().any(|h| h == "*")).then(|| host_whitelist.to_vec());
    let _ = ACCESS.set(Access {
        cors: cors.to_vec(),
        hosts,
    });
}

/// The origin to answer in `Access-Control-Allow-Origin`, if any.
fn allowed_origin(origin: Option<&str>) -> Option<String> {
    let cors = ACCESS.get().map(|a| a.cors.as_slice()).unwrap_or(&[]);
    if ACCESS.get().is_none() || cors.iter().any(|c| c == "*") {
        return Some("*".to_string());
    }
    origin
        .filter(|o| cors.iter().any(|c| c == o))
        .map(str::to_string)
}

/// Go's `http.Redirect(w, r, location, 301)`: an HTML body for GET (and
/// its content type for GET and HEAD).
pub fn go_redirect(method: &Method, location: &str) -> Response {
    let mut r = StatusCode::MOVED_PERMANENTLY.into_response();
    if let Ok(v) = HeaderValue::from_str(location) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    if method == Method::GET || method == Method::HEAD {
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
    }
    if method == Method::GET {
        let href = location
            .replace('&', "&amp;")
            .replace('\'', "&#39;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&#34;");
        *r.body_mut() =
            axum::body::Body::from(format!("<a href=\"{href}\">Moved Permanently</a>.\n\n"));
    }
    r
}

/// etcd's access controller in front of the client port's HTTP answers
/// (`embed/serve.go`, `accessController`; called by `http::go_front`):
/// a Host not in `--host-whitelist` (insecure URLs only; the request
/// target's host for an absolute-form target, as Go's `r.Host`) is
/// refused with 421 and etcd's DNS-rebinding text; else the origin the
/// CORS headers are to name, if any.
pub fn access<B>(req: &axum::http::Request<B>) -> Result<Option<String>, Box<Response>> {
    if let Some(hosts) = ACCESS.get().and_then(|a| a.hosts.as_ref()) {
        let host_port = req
            .uri()
            .authority()
            .map(|a| a.to_string())
            .or_else(|| {
                req.headers()
                    .get(axum::http::header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .map(str::to_string)
            })
            .unwrap_or_default();
        let host = match host_port.rsplit_once(':') {
            Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) && !h.is_empty() => {
                h.trim_start_matches('[').trim_end_matches(']').to_string()
            }
            _ => host_port.clone(),
        };
        if !hosts.contains(&host) {
            tracing::warn!(host = %host, "rejecting HTTP request to prevent DNS rebinding attacks");
            return Err(Box::new(go_error(
                StatusCode::MISDIRECTED_REQUEST,
                &format!(
                    "\netcd received your request, but the Host header was unrecognized.\n\nTo fix this, choose one of the following options:\n- Enable TLS, then any HTTPS request will be allowed.\n- Add the hostname you want to use to the whitelist in settings.\n  - e.g. etcd --host-whitelist {host:?}\n\nThis requirement has been added to help prevent \"DNS Rebinding\" attacks (CVE-2018-5702).\n"
                ),
            )));
        }
    }
    Ok(allowed_origin(
        req.headers()
            .get(axum::http::header::ORIGIN)
            .and_then(|o| o.to_str().ok()),
    ))
}

/// etcd's `addCORSHeader`.
pub fn add_cors_headers(h: &mut HeaderMap, origin: &str) {
    use axum::http::HeaderValue;
    h.insert(
        "access-control-allow-methods",
        HeaderValue::from_static("POST, GET, OPTIONS, PUT, DELETE"),
    );
    if let Ok(v) = HeaderValue::from_str(origin) {
        h.insert("access-control-allow-origin", v);
    }
    h.insert(
        "access-control-allow-headers",
        HeaderValue::from_static("accept, content-type, authorization"),
    );
}

/// Whether a request is gRPC (`application/grpc...`), as etcd's cmux
/// tells gRPC from HTTP on the client port.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The client port's answer to a request no route took: a gRPC call
/// (`application/grpc`) to a service etcd does not have is Unimplemented,
/// as grpc-go answers an unknown service; anything else is what etcd's
/// HTTP handler answers a path it does not serve ([`not_served`]).
pub async fn client_fallback(req: axum::extract::Request) -> Response {
    if req.version() == axum::http::Version::HTTP_2 && is_grpc(req.headers()) {
        let (parts, ()) = tonic::Status::unimplemented(format!(
            "unknown service {}",
            req.uri()
                .path()
                .trim_start_matches('/')
                .split('/')
                .next()
                .unwrap_or("")
        ))
        .into_http::<()>()
        .into_parts();
        return Response::from_parts(parts, axum::body::Body::empty());
    }
    not_served(req.method(), req.uri().path(), req.uri().query())
}

/// What etcd's HTTP client handler (Go's `ServeMux` behind the CORS
/// handler) answers a request that is neither gRPC nor one of its routes:
/// `/v3` redirects to `/v3/` (the gateway's subtree), anything else is
/// `404 page not found`.
pub fn not_served(method: &axum::http::Method, path: &str, query: Option<&str>) -> Response {
    use axum::http::Method;
    let mut resp = if method == Method::OPTIONS {
        StatusCode::OK.into_response()
    } else if path == "/v3" {
        // Go's ServeMux: `/v3/` is a subtree, so `/v3` redirects there
        // (the query kept)
        let location = match query {
            Some(q) => format!("/v3/?{q}"),
            None => "/v3/".to_string(),
        };
        go_redirect(method, &location)
    } else {
        go_error(StatusCode::NOT_FOUND, "404 page not found")
    };
    if let Some(o) = allowed_origin(None) {
        add_cors_headers(resp.headers_mut(), &o);
    }
    resp
}
