//! The client gRPC services, one file per service, thin over the server's
//! typed API: convert, call, answer. The lock and election services are
//! clients of the others, in process (`concurrency`), as etcd's are.

pub mod auth;
pub mod cluster;
pub mod concurrency;
pub mod election;
pub(crate) mod framing;
pub mod kv;
pub mod kv_server;
pub mod lease;
pub mod lock;
pub mod maintenance;
pub mod watch;
pub mod watch_server;

use crate::config::GRPC_OVERHEAD_BYTES;
use crate::server::EtcdServer;
use retcd_api::etcdserverpb::{
    auth_server::AuthServer, cluster_server::ClusterServer, lease_server::LeaseServer,
    maintenance_server::MaintenanceServer,
};
use retcd_api::v3electionpb::election_server::ElectionServer;
use retcd_api::v3lockpb::lock_server::LockServer;
use std::sync::Arc;
use tokio_stream::StreamExt;
use tonic::service::Routes;
use tonic::{Response, Status};

/// The client port's gRPC services, each as its own tower service (what
/// `api::client_port` dispatches to by service name).
#[derive(Clone)]
pub struct Servers {
    pub kv: kv_server::KvRoute,
    pub watch: watch_server::WatchServer,
    pub lease: LeaseServer<lease::LeaseService>,
    pub maintenance: MaintenanceServer<maintenance::MaintenanceService>,
    pub cluster: ClusterServer<cluster::ClusterService>,
    pub auth: AuthServer<auth::AuthService>,
    pub lock: LockServer<lock::LockService>,
    pub election: ElectionServer<election::ElectionService>,
}

/// Every client-facing gRPC service, sized like etcd's: a request up to
/// `--max-request-bytes` + 512 KiB reaches the server's own check.
pub struct ClientServices {
    /// All of them, for in-process callers (the gateway's streams).
    pub routes: Routes,
    /// The same services one by one, for the client port.
    pub servers: Servers,
    /// The lock and election services, for the gateway's unary routes.
    pub lock: lock::LockService,
    pub election: election::ElectionService,
}

pub fn client_services(server: &Arc<EtcdServer>) -> ClientServices {
    let recv = server.cfg.max_request_bytes as usize + GRPC_OVERHEAD_BYTES;
    let send = usize::MAX >> 1;
    let kv = kv_server::KvRoute::new(server.clone(), recv, send);
    let watch = watch_server::WatchServer::new(
        watch::WatchService {
            server: server.clone(),
        },
        recv,
        send,
    );
    let lease = LeaseServer::new(lease::LeaseService {
        server: server.clone(),
    })
    .max_decoding_message_size(recv);
    // What the lock and election services call, in process.
    let mut core = Routes::builder();
    core.add_service(kv.clone());
    core.add_service(watch.clone());
    core.add_service(lease.clone());
    let core = core.routes();
    let lock = lock::LockService {
        v3: concurrency::InProcess::new(core.clone()),
    };
    let election = election::ElectionService {
        v3: concurrency::InProcess::new(core.clone()),
    };
    let servers = Servers {
        kv,
        watch,
        lease,
        maintenance: MaintenanceServer::new(maintenance::MaintenanceService {
            server: server.clone(),
        })
        .max_decoding_message_size(recv)
        .max_encoding_message_size(send),
        cluster: ClusterServer::new(cluster::ClusterService {
            server: server.clone(),
        })
        .max_decoding_message_size(recv),
        auth: AuthServer::new(auth::AuthService {
            server: server.clone(),
        })
        .max_decoding_message_size(recv),
        lock: LockServer::new(lock.clone()).max_decoding_message_size(recv),
        election: ElectionServer::new(election.clone()).max_decoding_message_size(recv),
    };
    let routes = core
        .add_service(servers.maintenance.clone())
        .add_service(servers.cluster.clone())
        .add_service(servers.auth.clone())
        .add_service(servers.lock.clone())
        .add_service(servers.election.clone());
    ClientServices {
        routes,
        servers,
        lock,
        election,
    }
}

/// A server stream's answer as grpc-go sends it (etcd's handlers never
/// send headers by themselves): the response headers go out with the
/// first message, so a stream that has nothing to say sends none; one that
/// ends before a message is trailers only, and an error before any message
/// is the call's own error (what a client's `Header()` returns). The
/// handler awaits the first item of `rx`; a client gone meanwhile drops
/// that wait, and with it `rx`.
pub(crate) async fn headers_with_first<T: Send + 'static>(
    rx: tokio::sync::mpsc::Receiver<Result<T, Status>>,
) -> Result<Response<tonic::codegen::BoxStream<T>>, Status> {
    let mut rx = tokio_stream::wrappers::ReceiverStream::new(rx);
    let first = match rx.next().await {
        Some(Err(status)) => return Err(status),
        first => first,
    };
    Ok(Response::new(Box::pin(tokio_stream::iter(first).chain(rx))))
}
