//! What clients and peers talk to: the eight gRPC services (`grpc/`), the
//! JSON gateway, the HTTP endpoints (`/health`, `/metrics`, ...), the peer
//! service, and the two things in front of the client port: the etcdctl
//! 3.4 `:authority` repair (`h2_authority`) and the guard below. Every
//! error becomes a gRPC status in `error_map`, and only there.

pub mod error_map;
pub mod gateway;
pub mod grpc;
pub mod grpc_metrics;
pub mod h2_authority;
pub mod http;
pub mod peer;

use crate::auth::cert::CERT_CN_HEADER;
use crate::auth::Credentials;
use crate::error::ServerError;
use crate::server::EtcdServer;
use std::sync::Arc;

/// gRPC services of the client port (etcd registers them all, health
/// included, on the one gRPC server its interceptors guard).
const GRPC_PACKAGES: &[&str] = &[
    "/etcdserverpb.",
    "/v3lockpb.",
    "/v3electionpb.",
    "/grpc.health.v1.",
];

/// In front of every client gRPC call:
/// * with `--client-cert-auth`, hands the services the caller's verified
///   certificate user (`auth::cert::pass_cert_user`);
/// * etcd's learner rule (`v3rpc/interceptor.go`, `isRPCSupportedForLearner`):
///   a learner answers only the unary `Maintenance/Status` and serializable
///   `KV/Range`, and the one stream `Maintenance/Snapshot` (etcd 3.5.0+,
///   #12890: a snapshot can be saved from a learner); every other client
///   RPC, unary or stream, fails with
///   Unavailable "etcdserver: rpc not supported for learner" before its
///   handler runs. Range passes here and the server checks `serializable`
///   (the flag is inside the message). HTTP endpoints (`/health`,
///   `/metrics`) are not gRPC and are not affected; the JSON gateway
///   applies the same rule itself.
pub async fn client_guard(
    axum::extract::State(server): axum::extract::State<Arc<EtcdServer>>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if server.cfg.client_cert_auth {
        crate::auth::cert::pass_cert_user(&mut req);
    }
    let path = req.uri().path();
    // As etcd's cmux: only `application/grpc` requests reach the gRPC
    // server; anything else that no HTTP route took (the gateway's and
    // `http`'s are merged outside this guard) is answered as etcd's HTTP
    // handler answers a path it does not serve.
    let is_grpc = req
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if !is_grpc {
        return gateway::not_served(req.method(), path);
    }
    let grpc = GRPC_PACKAGES.iter().any(|p| path.starts_with(p));
    let allowed = matches!(
        path,
        "/etcdserverpb.Maintenance/Status"
            | "/etcdserverpb.KV/Range"
            | "/etcdserverpb.Maintenance/Snapshot"
    );
    if grpc && !allowed && server.is_learner() {
        let status = error_map::to_status(ServerError::NotSupportedForLearner);
        return status.into_http::<axum::body::Body>();
    }
    next.run(req).await
}

/// What a gRPC request says about who sent it (checked by the server,
/// `EtcdServer::who`): the `token` metadata, else `authorization` (a
/// `Bearer ` prefix dropped, as etcd 3.5.32+); with `--client-cert-auth`,
/// the verified client certificate's common name as the client port's
/// guard passed it on.
pub fn credentials(server: &EtcdServer, md: &tonic::metadata::MetadataMap) -> Credentials {
    let token = md
        .get("token")
        .or_else(|| md.get("authorization"))
        .map(|v| v.to_str().unwrap_or_default())
        .map(|t| t.strip_prefix("Bearer ").unwrap_or(t).to_string());
    let cert_cn = server
        .cfg
        .client_cert_auth
        .then(|| md.get(CERT_CN_HEADER))
        .flatten()
        .map(|v| v.to_str().unwrap_or_default().to_string());
    Credentials {
        token,
        cert_cn,
        ..Default::default()
    }
}
