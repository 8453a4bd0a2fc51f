//! The `etcdserverpb.Watch` route, written out instead of generated: the
//! generated server fixes the response type to the prost `WatchResponse`,
//! while watch streams send [`WatchReply`]s, whose events are encoded once
//! per committed batch and shared by every watcher
//! ([`retcd_mvcc::watch_reply`]). On the wire both are the same
//! `WatchResponse` message; clients see no difference.
//!
//! Requests are decoded as tonic's generated server decodes them. Replies
//! go out through [`WatchBody`], a response body written for them: each
//! reply is encoded (prost's bytes) straight into the chunk handed to the
//! connection, then `grpc-status` trailers end the stream, which is what
//! tonic's generic body does for any stream of messages, without its
//! layers (a fused stream, a per-message encoder call, an error-mapping
//! wrapper) that moved each ~160-byte reply five times on its way and were
//! a fifth of the instructions of a fan-out to 1 000 watchers. Message
//! size limits and UNIMPLEMENTED for any other path under the service are
//! as generated.

use super::framing::{message_len, set_grpc_content_type, trailers};
use super::watch::{ResponseStream, WatchService};
use bytes::{BufMut, Bytes, BytesMut};
use http_body::Frame;
use retcd_api::etcdserverpb::WatchRequest;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::NamedService;
use tonic::{Request, Status, Streaming};

/// The Watch service as a tower service, for `Routes::add_service`.
#[derive(Clone)]
pub struct WatchServer {
    inner: Arc<WatchService>,
    max_decoding_message_size: usize,
    max_encoding_message_size: usize,
}

impl WatchServer {
    pub fn new(svc: WatchService, max_decoding: usize, max_encoding: usize) -> WatchServer {
        WatchServer {
            inner: Arc::new(svc),
            max_decoding_message_size: max_decoding,
            max_encoding_message_size: max_encoding,
        }
    }
}

impl NamedService for WatchServer {
    const NAME: &'static str = "etcdserverpb.Watch";
}

impl<B> Service<http::Request<B>> for WatchServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != "/etcdserverpb.Watch/Watch" {
            let status = crate::api::error_map::unimplemented(req.uri().path());
            return Box::pin(async move { Ok(status.into_http::<tonic::body::Body>()) });
        }
        let served = serve(
            &self.inner,
            req,
            self.max_decoding_message_size,
            self.max_encoding_message_size,
        );
        Box::pin(async move {
            let (head, mut body) = match served {
                Err(refused) => return Ok(*refused),
                Ok(ok) => ok,
            };
            // As grpc-go: the response headers go out with the first
            // message, not before (a stream that gets none, e.g. one that
            // only cancels an unknown watch, sends no headers; a client
            // waiting for them waits as it would on etcd). A client that
            // resets the stream meanwhile drops this future (hyper polls
            // for the reset) and the stream's watchers with it.
            std::future::poll_fn(|cx| body.first_reply(cx)).await;
            Ok(head.map(|()| tonic::body::Body::new(body)))
        })
    }
}

/// One Watch call: the request stream decoded as tonic's `Grpc::streaming`
/// decodes it (compressed requests never get here: the client port refuses
/// them), the replies to be sent by a [`WatchBody`] under the response
/// head; or the refusal.
fn serve<B>(
    svc: &WatchService,
    req: http::Request<B>,
    max_decoding: usize,
    max_encoding: usize,
) -> Result<(http::Response<()>, WatchBody), Box<http::Response<tonic::body::Body>>>
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    let req = req.map(|body| {
        Streaming::new_request(
            tonic_prost::ProstDecoder::<WatchRequest>::new(tonic::codec::BufferSettings::default()),
            body,
            None,
            Some(max_decoding),
        )
    });
    match svc.watch(Request::from_http(req)) {
        Err(status) => Err(Box::new(status.into_http())),
        Ok(resp) => {
            let (metadata, stream, extensions) = resp.into_parts();
            let body = WatchBody {
                stream,
                buf: BytesMut::new(),
                next: None,
                max_message: max_encoding,
                end: None,
                done: false,
            };
            let mut res = http::Response::new(());
            *res.version_mut() = http::Version::HTTP_2;
            *res.headers_mut() = metadata.into_headers();
            *res.extensions_mut() = extensions;
            set_grpc_content_type(&mut res);
            Ok((res, body))
        }
    }
}

/// A chunk is handed to the connection once it holds this much (as tonic).
const YIELD_BYTES: usize = 32 * 1024;

/// The most a fresh chunk buffer holds: room for a full chunk and what the
/// reply that crosses [`YIELD_BYTES`] adds (sized to the replies waiting
/// below that).
const CHUNK_CAPACITY: usize = 64 * 1024;

/// The gRPC message prefix: compressed flag and big-endian length.
const PREFIX: usize = 5;

/// The Watch response body (see the module doc): chunks of length-prefixed
/// `WatchResponse` messages, then `grpc-status` trailers.
struct WatchBody {
    stream: ResponseStream,
    /// Where replies are encoded; a chunk is split off it. A reply that
    /// would not fit its spare capacity starts the next chunk instead of
    /// growing it (growing copies what the chunk already holds).
    buf: BytesMut,
    /// A reply taken from the stream that starts the next chunk (the
    /// stream is not polled again before it is encoded: its shared events
    /// are in buffers the stream holds until then).
    next: Option<retcd_mvcc::WatchReply>,
    /// tonic's limit on one encoded message (`max_encoding_message_size`).
    max_message: usize,
    /// How the stream ends, once the chunk before it is out.
    end: Option<Status>,
    /// Trailers sent.
    done: bool,
}

impl WatchBody {
    /// Ready once the stream has its first reply (kept to be sent first)
    /// or has ended.
    fn first_reply(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.next.is_some() {
            return Poll::Ready(());
        }
        self.stream.poll_reply(cx).map(|r| self.next = r)
    }
}

impl http_body::Body for WatchBody {
    type Data = Bytes;
    type Error = Status;

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        if let Some(status) = this.end.take() {
            this.done = true;
            return Poll::Ready(Some(Ok(Frame::trailers(trailers(&status)?))));
        }
        loop {
            let reply = match this.next.take() {
                Some(r) => r,
                None => match this.stream.poll_reply(cx) {
                    Poll::Ready(Some(r)) => r,
                    Poll::Ready(None) => {
                        if this.buf.is_empty() {
                            this.done = true;
                            let ok = trailers(&Status::ok(""))?;
                            return Poll::Ready(Some(Ok(Frame::trailers(ok))));
                        }
                        this.end = Some(Status::ok(""));
                        break;
                    }
                    Poll::Pending if this.buf.is_empty() => {
                        // an idle stream holds no buffer (10 000 streams
                        // would hold their spare capacity for nothing)
                        this.buf = BytesMut::new();
                        return Poll::Pending;
                    }
                    Poll::Pending => break,
                },
            };
            let need = PREFIX + reply.encoded_len_bound();
            if this.buf.capacity() - this.buf.len() < need {
                if !this.buf.is_empty() {
                    this.next = Some(reply);
                    break;
                }
                // room for the replies already waiting, up to a chunk
                let waiting = this.stream.replies_waiting() + 1;
                let want = need.saturating_mul(waiting);
                this.buf.reserve(want.clamp(need, CHUNK_CAPACITY.max(need)));
            }
            let at = this.buf.len();
            this.buf.put_slice(&[0; PREFIX]);
            this.stream.encode(&reply, &mut this.buf);
            let len = this.buf.len() - at - PREFIX;
            let prefix = if len > this.max_message {
                // what tonic's encoder answers
                Err(Status::out_of_range(format!(
                    "Error, encoded message length too large: found {len} bytes, the limit is: {} bytes",
                    this.max_message
                )))
            } else {
                message_len(len)
            };
            match prefix {
                // the length written straight into the chunk after the
                // flag byte put above (read back from an array a call
                // returned, it stalled on store forwarding: a third of
                // this function's own cycles)
                Ok(n) => this.buf[at + 1..at + PREFIX].copy_from_slice(&n.to_be_bytes()),
                Err(status) => {
                    // the replies before it still go out
                    this.buf.truncate(at);
                    this.end = Some(status);
                    break;
                }
            }
            if this.buf.len() >= YIELD_BYTES {
                break;
            }
        }
        if this.buf.is_empty() {
            // only an error to send (the reply was too large)
            let status = this.end.take().unwrap_or_else(|| Status::ok(""));
            this.done = true;
            return Poll::Ready(Some(Ok(Frame::trailers(trailers(&status)?))));
        }
        Poll::Ready(Some(Ok(Frame::data(this.buf.split().freeze()))))
    }
}
