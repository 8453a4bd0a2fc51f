//! The client port's HTTP server: accepts connections and serves each with
//! hyper (HTTP/2, or HTTP/1 for the JSON gateway and the probes), every
//! request going straight to the client port's service (`client_port`).
//!
//! This replaced tonic's transport server, which wrapped every request in
//! its own layers before ours: a boxed, cloned service per call, a boxed
//! future, a tracing span, the connect info inserted into the request, a
//! `grpc-timeout` layer and an error-recovery layer, and the response body
//! boxed again. Here a connection's service is one `Arc` and a request
//! costs the boxing of its body, its one future, and — only where a client
//! sent it — the `grpc-timeout` timer.
//!
//! What it keeps of tonic's server, and where it differs:
//! * a call whose `grpc-timeout` passes before its answer is dropped (the
//!   handler's work stops); it is answered as etcd answers a handler that
//!   returns its context's error (`error_map::deadline_exceeded`), where
//!   tonic answered CANCELLED "Timeout expired";
//! * with `--client-cert-auth`, each request carries its connection's
//!   connect info (`auth::cert` reads the verified certificate from it);
//!   without it nothing is inserted;
//! * HTTP/2 keepalive pings, `--max-concurrent-streams`, hyper's HTTP/1
//!   header-read timeout;
//! * hyper's `date` header on HTTP/1 answers; on HTTP/2 only the HTTP
//!   routes' answers carry one (`client_port`), as etcd's: grpc-go sends
//!   none, and encoding a new date every second cost every gRPC answer;
//! * graceful stop: no new connections, every open one told (GOAWAY) and
//!   awaited (the caller bounds the wait).

use super::client_port::ClientPort;
use axum::http::{HeaderMap, Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::convert::Infallible;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio_stream::{Stream, StreamExt};
use tonic::body::Body;
use tonic::codegen::BoxFuture;
use tonic::transport::server::Connected;

/// The client port's HTTP/2 settings.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// `--grpc-keepalive-interval` (None: no pings).
    pub keepalive_interval: Option<Duration>,
    /// `--grpc-keepalive-timeout` (None: hyper's 20 s, as tonic's).
    pub keepalive_timeout: Option<Duration>,
    /// `--max-concurrent-streams`.
    pub max_concurrent_streams: u32,
    /// Insert each connection's connect info into its requests
    /// (`--client-cert-auth`).
    pub connect_info: bool,
}

/// Serves `port` on the connections `incoming` yields until `stop`
/// completes; then stops accepting, shuts every connection down gracefully
/// and returns once all have closed.
pub async fn serve<I, IO>(
    incoming: I,
    port: ClientPort,
    settings: Settings,
    stop: impl Future<Output = ()>,
) where
    I: Stream<Item = std::io::Result<IO>>,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new());
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(settings.max_concurrent_streams)
        // grpc-go dates no answer; the client port dates the HTTP ones
        .auto_date_header(false)
        .keep_alive_interval(settings.keepalive_interval);
    if let Some(t) = settings.keepalive_timeout {
        builder.http2().keep_alive_timeout(t);
    }
    let port = Arc::new(port);
    // Every connection's task holds a receiver: `closing` asks them to
    // shut down, and its `closed()` is when the last one has.
    let (closing, closing_rx) = watch::channel(false);
    {
        let mut incoming = pin!(incoming);
        let mut stop = pin!(stop);
        loop {
            let accepted = tokio::select! {
                _ = &mut stop => break,
                a = incoming.next() => a,
            };
            let io = match accepted {
                None => break,
                Some(Ok(io)) => io,
                Some(Err(e)) => {
                    // e.g. out of file descriptors: do not spin on it
                    tracing::warn!(error = %e, "accepting a client connection failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let svc = Conn {
                port: port.clone(),
                info: settings.connect_info.then(|| io.connect_info()),
            };
            let builder = builder.clone();
            let mut closing = closing_rx.clone();
            tokio::spawn(async move {
                let mut conn = pin!(builder.serve_connection(TokioIo::new(io), svc));
                let ended = tokio::select! {
                    r = conn.as_mut() => Some(r),
                    _ = closing.wait_for(|c| *c) => None,
                };
                let r = match ended {
                    Some(r) => r,
                    None => {
                        conn.as_mut().graceful_shutdown();
                        conn.await
                    }
                };
                if let Err(e) = r {
                    tracing::debug!(error = %e, "client connection ended");
                }
            });
        }
    }
    let _ = closing.send(true);
    drop(closing_rx);
    closing.closed().await;
}

/// One connection's service.
struct Conn<C> {
    port: Arc<ClientPort>,
    info: Option<C>,
}

impl<C: Clone + Send + Sync + 'static> hyper::service::Service<Request<Incoming>> for Conn<C> {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, req: Request<Incoming>) -> Answer {
        let mut req = req.map(Body::new);
        if let Some(info) = &self.info {
            req.extensions_mut().insert(info.clone());
        }
        let deadline = grpc_timeout(req.headers()).map(|d| Box::pin(tokio::time::sleep(d)));
        Answer {
            inner: self.port.call(req),
            deadline,
        }
    }
}

/// A request's answer, cut short at its `grpc-timeout`.
pub struct Answer {
    inner: BoxFuture<Response<Body>, Infallible>,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Future for Answer {
    type Output = Result<Response<Body>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(r) = self.inner.as_mut().poll(cx) {
            return Poll::Ready(r);
        }
        match self.deadline.as_mut().map(|d| d.as_mut().poll(cx)) {
            Some(Poll::Ready(())) => {
                Poll::Ready(Ok(super::error_map::deadline_exceeded().into_http::<Body>()))
            }
            _ => Poll::Pending,
        }
    }
}

/// The gRPC `grpc-timeout` header: at most 8 digits and a unit (`H`, `M`,
/// `S`, `m`, `u`, `n`). None if absent or malformed (the call then runs
/// without a deadline, as under tonic's server).
fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get(GRPC_TIMEOUT)?.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

const GRPC_TIMEOUT: axum::http::HeaderName = axum::http::HeaderName::from_static("grpc-timeout");

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &str) -> Option<Duration> {
        let mut h = HeaderMap::new();
        h.insert(GRPC_TIMEOUT, v.parse().unwrap());
        grpc_timeout(&h)
    }

    #[test]
    fn test_grpc_timeout_units_and_bounds() {
        assert_eq!(parse("3H"), Some(Duration::from_secs(3 * 3600)));
        assert_eq!(parse("1M"), Some(Duration::from_secs(60)));
        assert_eq!(parse("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse("4999m"), Some(Duration::from_millis(4999)));
        assert_eq!(parse("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse("99999999n"), Some(Duration::from_nanos(99_999_999)));
        assert_eq!(parse("123456789S"), None, "more than 8 digits");
        assert_eq!(parse("S"), None);
        assert_eq!(parse("5s"), None, "unknown unit");
        assert_eq!(parse("-5S"), None);
        assert_eq!(parse("+5S"), None);
        assert_eq!(grpc_timeout(&HeaderMap::new()), None);
    }
}
