//! etcd's `hasleader` metadata (`clientv3.WithRequireLeader`; etcdctl's
//! `watch`, every Go client's lease keepalive stream and Kubernetes'
//! watches send it): a call that carries `hasleader: true` is refused with
//! Unavailable "etcdserver: no leader" while this member knows no leader,
//! and a stream that carries it is ended by the server once the member has
//! gone three election timeouts without one (`v3rpc/interceptor.go`,
//! `monitorLeader`), so its client moves to a member that has one.
//!
//! The check sits in front of the services (the client port's guard, and
//! the gateway's in-process stream calls, which grpc-gateway makes through
//! etcd's own gRPC server); `EtcdServer::monitor_leader` counts the
//! election timeouts and signals the streams.

use crate::error::ServerError;
use crate::server::EtcdServer;
use axum::http::{HeaderMap, Request, Response};
use http_body::{Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service};
use tonic::Status;

/// The metadata key and the one value that asks for a leader.
pub const KEY: &str = "hasleader";
const WANTED: &[u8] = b"true";
/// `KEY` as a header name (a constant name is not parsed again at every
/// lookup, as a string's is: every call looks).
const KEY_NAME: axum::http::HeaderName = axum::http::HeaderName::from_static(KEY);

/// Whether a call's metadata asks for a leader: its first `hasleader`
/// value is `true` (grpc-go keeps each header field as its own value).
pub fn wanted(headers: &HeaderMap) -> bool {
    headers
        .get(KEY_NAME)
        .is_some_and(|v| v.as_bytes() == WANTED)
}

/// The refusal of a call that asks for a leader while there is none.
pub fn refused(server: &EtcdServer, headers: &HeaderMap) -> Option<Status> {
    (wanted(headers) && server.leader() == 0)
        .then(|| super::error_map::to_status(ServerError::NoLeader))
}

/// What ends a stream the monitor cancels, by method (each etcd handler
/// turns the cancelled context into its own error): watch, keepalive and
/// observe return the cancel reason, "no leader"; the health service's
/// watch its "Stream has ended."; a snapshot never looks at the context
/// and runs to its end, so it is not watched.
fn ended_by(path: &str) -> Option<Status> {
    match path {
        "/etcdserverpb.Watch/Watch"
        | "/etcdserverpb.Lease/LeaseKeepAlive"
        | "/v3electionpb.Election/Observe" => {
            Some(super::error_map::to_status(ServerError::NoLeader))
        }
        "/grpc.health.v1.Health/Watch" => Some(Status::cancelled("Stream has ended.")),
        _ => None,
    }
}

/// A stream the monitor may end: it asks for a leader, and its method
/// is one that ends with the cancel (`ended_by`).
pub struct Watched {
    status: Status,
    /// Subscribed before the call starts: a signal from then on ends it.
    lost: tokio::sync::watch::Receiver<u64>,
}

/// The monitor's hold on `req`'s call, if any.
pub fn watched<B>(server: &EtcdServer, req: &Request<B>) -> Option<Watched> {
    if !wanted(req.headers()) {
        return None;
    }
    Some(Watched {
        status: ended_by(req.uri().path())?,
        lost: server.leader_lost(),
    })
}

/// Runs `answer` (the dispatch of a call) so that the server can end it:
/// for a `watched` stream the answer (its headers, then each message)
/// races the member's leader-lost signal, which ends it with the method's
/// status; the handler, its body and whatever they hold are dropped, as
/// when the client goes away. Any other call is `answer` as is.
pub async fn run(
    watched: Option<Watched>,
    answer: impl Future<Output = Response<Body>>,
) -> Response<Body> {
    let Some(Watched { status, mut lost }) = watched else {
        return answer.await;
    };
    let resp = tokio::select! {
        resp = answer => resp,
        () = signalled(&mut lost) => return status.into_http::<Body>(),
    };
    resp.map(|inner| {
        Body::new(LeaderBound {
            inner: Some(inner),
            lost: Box::pin(async move { signalled(&mut lost).await }),
            status: Some(status),
        })
    })
}

/// Resolves at the monitor's next signal (never, once the server is gone).
async fn signalled(lost: &mut tokio::sync::watch::Receiver<u64>) {
    if lost.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// A stream's body that the leader-lost signal ends: its messages pass
/// through until then; at the signal the stream ends with `status` in its
/// trailers and the handler's body is dropped. Each of the inner body's
/// frames is a whole gRPC message, so no message is cut.
struct LeaderBound {
    inner: Option<Body>,
    lost: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// The trailers' status, until they are sent.
    status: Option<Status>,
}

impl http_body::Body for LeaderBound {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        if this.lost.as_mut().poll(cx).is_ready() {
            this.inner = None;
            let mut trailers = HeaderMap::new();
            if let Some(status) = this.status.take() {
                let _ = status.add_header(&mut trailers);
            }
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        let frame = Pin::new(inner).poll_frame(cx);
        if let Poll::Ready(None) = frame {
            this.inner = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// The gateway's in-process calls as grpc-gateway makes them, through the
/// server's own gRPC front: a call that asks for a leader is refused
/// without one, and a stream is ended by the monitor (`run`).
#[derive(Clone)]
pub struct Gated<S> {
    pub server: Arc<EtcdServer>,
    pub inner: S,
}

impl<S> Service<Request<Body>> for Gated<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = std::convert::Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Response<Body>, std::convert::Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        if let Some(status) = refused(&self.server, req.headers()) {
            return Box::pin(async move { Ok(status.into_http::<Body>()) });
        }
        let watched = watched(&self.server, &req);
        // (the in-process routes are always ready)
        let answer = self.inner.clone().call(req);
        Box::pin(async move {
            let answer = async move {
                match answer.await {
                    Ok(resp) => resp,
                    Err(never) => match never {},
                }
            };
            Ok(run(watched, answer).await)
        })
    }
}
