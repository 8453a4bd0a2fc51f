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
use crate::error::ServerError;
use crate::server::EtcdServer;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
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

/// Decodes the body (empty = the default request), runs `call` with the
/// `Authorization` header as the `token` metadata, encodes the answer.
async fn unary<Req, Resp, F, Fut>(headers: HeaderMap, body: Bytes, call: F) -> Response
where
    Req: DeserializeOwned + Default,
    Resp: Serialize,
    F: FnOnce(tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    let req: Req = if body.iter().all(u8::is_ascii_whitespace) {
        Req::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => return error(&to_status(ServerError::BadRequestBody(e.to_string()))),
        }
    };
    match call(with_token(&headers, req)).await {
        Ok(resp) => axum::Json(resp.into_inner()).into_response(),
        Err(status) => error(&status),
    }
}

/// The requests in `body`: JSON objects one after another (none if empty).
fn requests<Req: DeserializeOwned>(body: &Bytes) -> Result<Vec<Req>, Status> {
    serde_json::Deserializer::from_slice(body)
        .into_iter::<Req>()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| to_status(ServerError::BadRequestBody(e.to_string())))
}

/// A streaming call's answer: each message as a `{"result": ...}` line; an
/// error ends the stream with grpc-gateway's `{"error": ...}` line.
fn stream_body<Resp, S>(inbound: S, keep: impl Send + Sync + 'static) -> Response
where
    Resp: Serialize,
    S: tokio_stream::Stream<Item = Result<Resp, Status>> + Send + 'static,
{
    use tokio_stream::StreamExt;
    let lines = inbound.map(move |r| {
        let _keep = &keep;
        let line = match r {
            Ok(m) => format!(
                "{{\"result\":{}}}\n",
                serde_json::to_string(&m).unwrap_or_default()
            ),
            Err(s) => format!(
                "{{\"error\":{{\"grpc_code\":{},\"http_code\":{},\"message\":{},\"http_status\":{}}}}}\n",
                s.code() as i32,
                http_status(s.code()).as_u16(),
                serde_json::to_string(s.message()).unwrap_or_default(),
                serde_json::to_string(http_status(s.code()).canonical_reason().unwrap_or_default())
                    .unwrap_or_default(),
            ),
        };
        Ok::<_, std::convert::Infallible>(Bytes::from(line))
    });
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        axum::body::Body::from_stream(lines),
    )
        .into_response()
}

/// `Authorization` as the `token` metadata of `req`.
/// grpc-gateway's header mapping: `Authorization` becomes the
/// `authorization` metadata, `Grpc-Metadata-Token` the `token` metadata
/// (which wins, as in etcd); nothing else of the client's headers is
/// passed on.
fn with_token<T>(headers: &HeaderMap, req: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(req);
    for (header, key) in [
        ("authorization", "authorization"),
        ("grpc-metadata-token", "token"),
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

/// A bidirectional stream: the body's requests go out, the request side
/// stays open while the answer is read.
async fn bidi<Req, Resp, F, Fut>(headers: HeaderMap, body: Bytes, call: F) -> Response
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
    F: FnOnce(tonic::Request<tokio_stream::wrappers::ReceiverStream<Req>>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<tonic::Streaming<Resp>>, Status>>,
{
    let reqs = match requests::<Req>(&body) {
        Ok(r) => r,
        Err(s) => return error(&s),
    };
    let (tx, rx) = tokio::sync::mpsc::channel(reqs.len().max(1));
    for r in reqs {
        let _ = tx.try_send(r);
    }
    let request = with_token(&headers, tokio_stream::wrappers::ReceiverStream::new(rx));
    match call(request).await {
        Ok(resp) => stream_body(resp.into_inner(), tx),
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
                    post(move |headers: HeaderMap, body: Bytes| {
                        let s = s.clone();
                        async move {
                            // etcd's learner rule, as for gRPC (streams get
                            // theirs below).
                            if !LEARNER_PATHS.contains(&$path) && s.kv.server.is_learner() {
                                return error(&to_status(ServerError::NotSupportedForLearner));
                            }
                            unary(headers, body, |r| async move { s.$field.$method(r).await }).await
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
    let own_stream = services.routes.clone();
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
        // etcd registers Hash and HashKV on the same path; etcd 3.4.23
        // answers Hash there.
        "/maintenance/hash" => maintenance.hash,
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
            post(move |headers: HeaderMap, body: Bytes| {
                let mut c = WatchClient::new(ch.clone());
                let learner = srv.is_learner();
                async move {
                    if learner {
                        return error(&to_status(ServerError::NotSupportedForLearner));
                    }
                    bidi(headers, body, |req| async move { c.watch(req).await }).await
                }
            }),
        );
        let (ch, srv) = (own_stream.clone(), server.clone());
        r = r.route(
            &format!("{prefix}/lease/keepalive"),
            post(move |headers: HeaderMap, body: Bytes| {
                let mut c = LeaseClient::new(ch.clone());
                let learner = srv.is_learner();
                async move {
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
            }),
        );
        let (ch, srv) = (own_stream.clone(), server.clone());
        r = r.route(
            &format!("{prefix}/election/observe"),
            post(move |headers: HeaderMap, body: Bytes| {
                let mut c = ElectionClient::new(ch.clone());
                let learner = srv.is_learner();
                async move {
                    if learner {
                        return error(&to_status(ServerError::NotSupportedForLearner));
                    }
                    let req = match requests::<LeaderRequest>(&body) {
                        Ok(mut v) if v.len() <= 1 => v.pop().unwrap_or_default(),
                        Ok(_) => {
                            let e = ServerError::BadRequestBody("one request expected".into());
                            return error(&to_status(e));
                        }
                        Err(s) => return error(&s),
                    };
                    match c.observe(with_token(&headers, req)).await {
                        Ok(resp) => stream_body(resp.into_inner(), ()),
                        Err(s) => error(&s),
                    }
                }
            }),
        );
        // grpc-gateway answers other paths under its prefixes 404.
        r = r.route(
            &format!("{prefix}/{{*rest}}"),
            axum::routing::any(|| async { (StatusCode::NOT_FOUND, "Not Found\n") }),
        );
    }
    r
}
