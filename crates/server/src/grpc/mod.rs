//! Thin gRPC services over `EtcdServer`, one file per service. Errors
//! become statuses only in `error_map`.

pub mod auth;
pub mod cluster;
pub mod election;
pub mod error_map;
pub mod kv;
pub mod lease;
pub mod lock;
pub mod maintenance;
pub mod v3client;
pub mod validate;
pub mod watch;
pub mod watch_route;

use crate::config::GRPC_OVERHEAD_BYTES;
use crate::server::EtcdServer;
use retcd_api::etcdserverpb::{
    auth_server::AuthServer, cluster_server::ClusterServer, kv_server::KvServer,
    lease_server::LeaseServer, maintenance_server::MaintenanceServer,
};
use retcd_api::v3electionpb::election_server::ElectionServer;
use retcd_api::v3lockpb::lock_server::LockServer;
use std::sync::Arc;
use tonic::service::Routes;

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
///   certificate user (`tls::pass_cert_user`);
/// * etcd's learner rule (`v3rpc/interceptor.go`, `isRPCSupportedForLearner`):
///   a learner answers only `Maintenance/Status` and serializable
///   `KV/Range`; every other client RPC, unary or stream, fails with
///   Unavailable "etcdserver: rpc not supported for learner" before its
///   handler runs. Range passes here and its handler checks `serializable`
///   (the flag is inside the message). HTTP endpoints (`/health`,
///   `/metrics`, the JSON gateway) are not gRPC and are not affected.
pub async fn client_guard(
    axum::extract::State(server): axum::extract::State<Arc<EtcdServer>>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if server.cfg.client_cert_auth {
        crate::tls::pass_cert_user(&mut req);
    }
    let path = req.uri().path();
    let grpc = GRPC_PACKAGES.iter().any(|p| path.starts_with(p));
    let allowed = matches!(
        path,
        "/etcdserverpb.Maintenance/Status" | "/etcdserverpb.KV/Range"
    );
    if grpc && !allowed && server.is_learner() {
        let status: tonic::Status = crate::error::ServerError::NotSupportedForLearner.into();
        return status.into_http::<axum::body::Body>();
    }
    next.run(req).await
}

/// All client-facing gRPC services, sized like etcd's: a request up to
/// `--max-request-bytes` + 512 KiB reaches the server's own check.
pub fn routes(server: &Arc<EtcdServer>) -> Routes {
    let recv = server.cfg.max_request_bytes as usize + GRPC_OVERHEAD_BYTES;
    let send = usize::MAX >> 1;
    let mut b = Routes::builder();
    b.add_service(
        KvServer::new(kv::KvService {
            server: server.clone(),
        })
        .max_decoding_message_size(recv)
        .max_encoding_message_size(send),
    );
    b.add_service(
        MaintenanceServer::new(maintenance::MaintenanceService {
            server: server.clone(),
        })
        .max_decoding_message_size(recv)
        .max_encoding_message_size(send),
    );
    b.add_service(
        ClusterServer::new(cluster::ClusterService {
            server: server.clone(),
        })
        .max_decoding_message_size(recv),
    );
    b.add_service(watch_route::WatchServer::new(
        watch::WatchService {
            server: server.clone(),
        },
        recv,
        send,
    ));
    b.add_service(
        LeaseServer::new(lease::LeaseService::new(server.clone())).max_decoding_message_size(recv),
    );
    b.add_service(
        AuthServer::new(auth::AuthService {
            server: server.clone(),
        })
        .max_decoding_message_size(recv),
    );
    // Lock and election are clients of this server, as in etcd.
    let own = v3client::self_channel(server);
    b.add_service(
        LockServer::new(lock::LockService {
            channel: own.clone(),
        })
        .max_decoding_message_size(recv),
    );
    b.add_service(
        ElectionServer::new(election::ElectionService { channel: own })
            .max_decoding_message_size(recv),
    );
    b.routes()
}
