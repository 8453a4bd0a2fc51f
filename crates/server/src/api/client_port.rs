//! What the client port runs for every request: one tower service in front
//! of the HTTP routes. A call to one of etcd's gRPC services is counted
//! (`grpc_metrics`), checked (the guard below) and handed to its service
//! by name; every other request goes to the HTTP routes (`/health`,
//! `/metrics`, the JSON gateway, ...), untouched.
//!
//! This replaced two axum routers and two `from_fn` middlewares around the
//! gRPC routes: each wrapped and boxed the call, the request and response
//! bodies again, and moved the large futures between the layers.

use super::error_map;
use super::gateway;
use super::grpc::kv_server::Unary;
use super::grpc::Servers;
use super::grpc_metrics::Call;
use crate::error::ServerError;
use crate::server::EtcdServer;
use axum::http::{Request, Response};
use std::convert::Infallible;
use std::sync::Arc;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service};
use tonic::server::NamedService;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::HealthService;

/// etcd's gRPC services on the client port.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Grpc {
    Kv,
    Watch,
    Lease,
    Maintenance,
    Cluster,
    Auth,
    Lock,
    Election,
    Health,
}

impl Grpc {
    /// The service a request path names (`/<service>/<method>`), as
    /// tonic's routes match it: any method under a known service.
    fn of(path: &str) -> Option<Grpc> {
        let rest = path.strip_prefix('/')?;
        let (service, _method) = rest.split_once('/')?;
        use retcd_api::etcdserverpb::{
            auth_server::AuthServer, cluster_server::ClusterServer, kv_server::KvServer,
            lease_server::LeaseServer, maintenance_server::MaintenanceServer,
        };
        use retcd_api::v3electionpb::election_server::ElectionServer;
        use retcd_api::v3lockpb::lock_server::LockServer;
        type H = HealthServer<HealthService>;
        type W = super::grpc::watch_server::WatchServer;
        Some(match service {
            <KvServer<super::grpc::kv::KvService>>::NAME => Grpc::Kv,
            W::NAME => Grpc::Watch,
            <LeaseServer<super::grpc::lease::LeaseService>>::NAME => Grpc::Lease,
            <MaintenanceServer<super::grpc::maintenance::MaintenanceService>>::NAME => {
                Grpc::Maintenance
            }
            <ClusterServer<super::grpc::cluster::ClusterService>>::NAME => Grpc::Cluster,
            <AuthServer<super::grpc::auth::AuthService>>::NAME => Grpc::Auth,
            <LockServer<super::grpc::lock::LockService>>::NAME => Grpc::Lock,
            <ElectionServer<super::grpc::election::ElectionService>>::NAME => Grpc::Election,
            H::NAME => Grpc::Health,
            _ => return None,
        })
    }
}

/// The gRPC services and what the guard needs.
struct Front {
    server: Arc<EtcdServer>,
    servers: Servers,
    health: HealthServer<HealthService>,
}

/// The client port's service: gRPC calls (when it serves them), then the
/// HTTP routes.
#[derive(Clone)]
pub struct ClientPort {
    front: Option<Arc<Front>>,
    http: axum::Router,
}

impl ClientPort {
    /// etcd's gRPC services in front of the HTTP routes `http`.
    pub fn new(
        server: Arc<EtcdServer>,
        servers: Servers,
        health: HealthServer<HealthService>,
        http: axum::Router,
    ) -> ClientPort {
        ClientPort {
            front: Some(Arc::new(Front {
                server,
                servers,
                health,
            })),
            http,
        }
    }

    /// The HTTP routes alone (`--listen-client-http-urls`).
    pub fn http_only(http: axum::Router) -> ClientPort {
        ClientPort { front: None, http }
    }

    /// Answers one request.
    pub fn call(&self, req: Request<Body>) -> BoxFuture<Response<Body>, Infallible> {
        // etcd's cmux hands an HTTP/1.x connection to its HTTP server
        // whatever the request: only HTTP/2 can be gRPC
        let h2 = req.version() == axum::http::Version::HTTP_2;
        let grpc = h2.then(|| Grpc::of(req.uri().path())).flatten();
        let (Some(front), Some(grpc)) = (&self.front, grpc) else {
            // hyper dates no HTTP/2 response (`api::serve`): gRPC answers
            // carry no date, as grpc-go's; an HTTP answer does, as Go's.
            // Go's server, etcd's access controller and ServeMux first
            // (`http::go_front`), then the routes.
            let routed = match super::http::go_front(req, true) {
                super::http::Front::Answer(resp) => Err(resp),
                super::http::Front::Route(req, origin) => Ok((self.http.clone().call(req), origin)),
            };
            return Box::pin(async move {
                let mut resp = match routed {
                    Err(resp) => resp,
                    Ok((answer, origin)) => {
                        let mut resp = match answer.await {
                            Ok(resp) => resp,
                            Err(never) => match never {},
                        };
                        if let Some(o) = origin {
                            super::gateway::add_cors_headers(resp.headers_mut(), &o);
                        }
                        resp
                    }
                };
                if h2 && !resp.headers().contains_key(axum::http::header::DATE) {
                    let now = httpdate::fmt_http_date(std::time::SystemTime::now());
                    if let Ok(v) = axum::http::HeaderValue::from_str(&now) {
                        resp.headers_mut().insert(axum::http::header::DATE, v);
                    }
                }
                Ok(resp.map(Body::new))
            });
        };
        // outermost: the metrics count what the guard refuses too; the
        // request's trailers are dropped on either path (see
        // `grpc_metrics::drop_request_trailers`)
        let mut call = Call::begin(req.uri().path(), req.headers());
        if let (Grpc::Kv, Some(method)) = (grpc, Unary::of(req.uri().path())) {
            if let Some(call) = call.take() {
                // KV's unary calls count their request and reply themselves
                // (`KvRoute::answer`); their request trailers are never read
                let mut req = req;
                let front = front.clone();
                return Box::pin(async move {
                    Ok(match guard(&front.server, &mut req) {
                        Some(refused) => call.response(refused),
                        None => front.servers.kv.answer(req, method, call).await,
                    })
                });
            }
        }
        let mut req = match &call {
            Some(c) => req.map(|b| c.request_body(b)),
            None => req.map(super::grpc_metrics::drop_request_trailers),
        };
        let front = front.clone();
        Box::pin(async move {
            let resp = match guard(&front.server, &mut req) {
                Some(refused) => refused,
                None => {
                    let watched = super::require_leader::watched(&front.server, &req);
                    super::require_leader::run(watched, dispatch(&front, grpc, req)).await
                }
            };
            Ok(match call {
                Some(c) => c.response(resp),
                None => resp,
            })
        })
    }
}

async fn dispatch(front: &Front, grpc: Grpc, req: Request<Body>) -> Response<Body> {
    let s = &front.servers;
    let r = match grpc {
        Grpc::Kv => s.kv.clone().call(req).await,
        Grpc::Watch => s.watch.clone().call(req).await,
        Grpc::Lease => s.lease.clone().call(req).await,
        Grpc::Maintenance => s.maintenance.clone().call(req).await,
        Grpc::Cluster => s.cluster.clone().call(req).await,
        Grpc::Auth => s.auth.clone().call(req).await,
        Grpc::Lock => s.lock.clone().call(req).await,
        Grpc::Election => s.election.clone().call(req).await,
        Grpc::Health => front.health.clone().call(req).await,
    };
    match r {
        Ok(resp) => resp,
        Err(never) => match never {},
    }
}

/// In front of every client gRPC call:
/// * with `--client-cert-auth`, hands the services the caller's verified
///   certificate user (`auth::cert::pass_cert_user`);
/// * as etcd's cmux: only `application/grpc` requests reach the gRPC
///   server; anything else under a gRPC service's path is answered as
///   etcd's HTTP handler answers a path it does not serve;
/// * a compressed request (`grpc-encoding` other than `identity`) gets
///   etcd's UNIMPLEMENTED "grpc: Decompressor is not installed …" (etcd
///   registers no decompressor), on every method alike;
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
/// * etcd's `hasleader` metadata (`require_leader`): a call that asks for
///   a leader fails with Unavailable "etcdserver: no leader" while the
///   member has none (after the learner rule, as in etcd's interceptor);
///   a stream that asks is ended when the member has gone three election
///   timeouts without one.
///
/// Returns the answer of a refused call.
fn guard(server: &EtcdServer, req: &mut Request<Body>) -> Option<Response<Body>> {
    if server.cfg.client_cert_auth {
        crate::auth::cert::pass_cert_user(req);
    }
    if !gateway::is_grpc(req.headers()) {
        let (method, uri) = (req.method(), req.uri());
        return Some(gateway::not_served(method, uri.path(), uri.query()).map(Body::new));
    }
    if let Err(status) = super::grpc::framing::refuse_compressed(req.headers()) {
        return Some(status.into_http::<Body>());
    }
    let allowed = matches!(
        req.uri().path(),
        "/etcdserverpb.Maintenance/Status"
            | "/etcdserverpb.KV/Range"
            | "/etcdserverpb.Maintenance/Snapshot"
    );
    if !allowed && server.is_learner() {
        let status = error_map::to_status(ServerError::NotSupportedForLearner);
        return Some(status.into_http::<Body>());
    }
    if let Some(status) = super::require_leader::refused(server, req.headers()) {
        return Some(status.into_http::<Body>());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_grpc_services_by_path() {
        assert_eq!(Grpc::of("/etcdserverpb.KV/Put"), Some(Grpc::Kv));
        assert_eq!(Grpc::of("/etcdserverpb.KV/Nope"), Some(Grpc::Kv));
        assert_eq!(Grpc::of("/etcdserverpb.Watch/Watch"), Some(Grpc::Watch));
        assert_eq!(Grpc::of("/grpc.health.v1.Health/Check"), Some(Grpc::Health));
        assert_eq!(Grpc::of("/v3lockpb.Lock/Lock"), Some(Grpc::Lock));
        assert_eq!(
            Grpc::of("/v3electionpb.Election/Observe"),
            Some(Grpc::Election)
        );
        assert_eq!(Grpc::of("/etcdserverpb.KV"), None);
        assert_eq!(Grpc::of("/etcdserverpb.Nope/Put"), None);
        assert_eq!(Grpc::of("/v3/kv/put"), None);
        assert_eq!(Grpc::of("/health"), None);
    }
}
