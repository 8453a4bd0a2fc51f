//! What clients and peers talk to: the eight gRPC services (`grpc/`), the
//! JSON gateway, the HTTP endpoints (`/health`, `/metrics`, ...), the peer
//! service, and what is in front of the client port: the etcdctl 3.4
//! `:authority` repair (`h2_authority`), late writes (`defer_writes`), and
//! the one service that counts, guards and dispatches every gRPC call
//! (`client_port`). Every error becomes a gRPC status in `error_map`, and
//! only there.

pub mod client_port;
pub mod defer_writes;
pub mod error_map;
pub mod gateway;
pub mod grpc;
pub mod grpc_metrics;
pub mod h2_authority;
pub mod http;
pub mod peer;
pub mod require_leader;
pub mod serve;

use crate::auth::cert::CERT_CN_HEADER;
use crate::auth::Credentials;
use crate::server::EtcdServer;

/// What a gRPC request says about who sent it (checked by the server,
/// `EtcdServer::who`): the `token` metadata, else `authorization` (a
/// `Bearer ` prefix dropped, as etcd 3.5.32+); with `--client-cert-auth`,
/// the verified client certificate's common name as the client port's
/// guard passed it on.
pub fn credentials(server: &EtcdServer, md: &tonic::metadata::MetadataMap) -> Credentials {
    credentials_in(server, md.as_ref())
}

/// [`credentials`] from a request's headers.
pub fn credentials_in(server: &EtcdServer, md: &axum::http::HeaderMap) -> Credentials {
    // (a constant name is not parsed again at every lookup)
    const TOKEN: axum::http::HeaderName = axum::http::HeaderName::from_static("token");
    let token = md
        .get(TOKEN)
        .or_else(|| md.get(axum::http::header::AUTHORIZATION))
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
