//! The `etcdserverpb.KV` route: every unary method is answered here, the
//! generated server keeps only `RangeStream` (and unknown methods).
//!
//! A unary call is read whole, its one message decoded with grpc-go's
//! (so etcd's) errors, the server called, and the reply written as one
//! data frame and the trailers. tonic's generated unary path (its decoder
//! stream, its encoder body, its codec and compression checks) cost about
//! a tenth of a put's instructions around a ~300-byte message.
//!
//! tonic encodes a unary response into one buffer before sending any of
//! it, so a Range of 200k values was in memory whole (and, while encoded,
//! its kvs and their encoding overlapped). Here a long plain Range
//! (`EtcdServer::range_reply`) is sent as it is read: the message's length
//! prefix from the sizes of its stored rows (read first, from the same
//! snapshot), then the header, then the rows in pieces of [`PIECE`] bytes
//! read on a blocking thread one piece ahead of HTTP/2's flow control,
//! then `more` and `count`. The client receives one ordinary
//! `RangeResponse`. Any other Range is built whole.
//!
//! Compressed requests never get here (the client port refuses them, as
//! etcd does).

use super::framing::{message_prefix, set_grpc_content_type, trailers};
use super::kv::KvService;
use crate::api::credentials_in;
use crate::api::grpc_metrics::{received_bytes, Call, Reply};
use crate::auth::Credentials;
use crate::server::{EtcdServer, RangeReply};
use bytes::{Buf, Bytes, BytesMut};
use http_body::Frame;
use prost::Message;
use retcd_api::etcdserverpb::kv_server::KvServer;
use retcd_api::etcdserverpb::{RangeRequest, RangeResponse};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::mpsc;
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::NamedService;
use tonic::{Code, Status};

/// Bytes of rows read per piece of a streamed Range response.
const PIECE: usize = 128 << 10;

/// The KV service as a tower service, for `Routes::add_service` and the
/// client port.
#[derive(Clone)]
pub struct KvRoute {
    generated: KvServer<KvService>,
    server: Arc<EtcdServer>,
    max_decoding_message_size: usize,
}

impl KvRoute {
    pub fn new(server: Arc<EtcdServer>, max_decoding: usize, max_encoding: usize) -> KvRoute {
        let generated = KvServer::new(KvService {
            server: server.clone(),
        })
        .max_decoding_message_size(max_decoding)
        .max_encoding_message_size(max_encoding);
        KvRoute {
            generated,
            server,
            max_decoding_message_size: max_decoding,
        }
    }
}

impl NamedService for KvRoute {
    const NAME: &'static str = "etcdserverpb.KV";
}

impl<B> Service<http::Request<B>> for KvRoute
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let Some(method) = Unary::of(req.uri().path()) else {
            return self.generated.call(req);
        };
        let server = self.server.clone();
        let max = self.max_decoding_message_size;
        Box::pin(async move {
            Ok(match unary(&server, max, req, method, false).await {
                Ok(body) => grpc_response(body),
                Err(status) => status.into_http(),
            })
        })
    }
}

impl KvRoute {
    /// Answers a unary call the client port began counting (`call`): its
    /// request bytes and its reply are counted here, the reply by its own
    /// body (`grpc_metrics::Reply`), with no counting body around either.
    pub(crate) async fn answer(
        &self,
        req: http::Request<tonic::body::Body>,
        method: Unary,
        call: Call,
    ) -> http::Response<tonic::body::Body> {
        match unary(
            &self.server,
            self.max_decoding_message_size,
            req,
            method,
            true,
        )
        .await
        {
            Ok(mut body) => {
                body.reply = Some(call.into_reply());
                grpc_response(body)
            }
            Err(status) => call.response(status.into_http()),
        }
    }
}

/// The unary methods of `etcdserverpb.KV`.
#[derive(Clone, Copy)]
pub(crate) enum Unary {
    Range,
    Put,
    DeleteRange,
    Txn,
    Compact,
}

impl Unary {
    /// The unary method a request path names.
    pub(crate) fn of(path: &str) -> Option<Unary> {
        Some(match path {
            "/etcdserverpb.KV/Range" => Unary::Range,
            "/etcdserverpb.KV/Put" => Unary::Put,
            "/etcdserverpb.KV/DeleteRange" => Unary::DeleteRange,
            "/etcdserverpb.KV/Txn" => Unary::Txn,
            "/etcdserverpb.KV/Compact" => Unary::Compact,
            _ => return None,
        })
    }
}

/// Reads the call's one request message (its bytes counted in the
/// metrics when `count`), runs `method` and starts its reply.
async fn unary<B>(
    server: &EtcdServer,
    max: usize,
    req: http::Request<B>,
    method: Unary,
    count: bool,
) -> Result<ReplyBody, Status>
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    let (parts, body) = req.into_parts();
    let request = read_request(body, max, count).await?;
    let creds = credentials_in(server, &parts.headers);
    let reply = match method {
        Unary::Range => return range(server, decode(request)?, &creds).await,
        Unary::Put => encode(&server.put(decode(request)?, &creds).await?)?,
        Unary::DeleteRange => encode(&server.delete_range(decode(request)?, &creds).await?)?,
        Unary::Txn => encode(&server.txn(decode(request)?, &creds).await?)?,
        Unary::Compact => encode(&server.compact(decode(request)?, &creds).await?)?,
    };
    Ok(ReplyBody::whole(reply))
}

/// `body`'s first gRPC message, its bytes, with grpc-go's (etcd's) errors
/// in grpc-go's order: the length in the prefix against `max` as soon as
/// the prefix is in, then the message read whole, then its format. Reading
/// stops at the message's end, as grpc-go reads one message for a unary
/// method: whatever follows it is never buffered. With `count`, the
/// message's length is counted in the received bytes once its prefix is in
/// (as `grpc_metrics` counts a request body).
async fn read_request<B>(body: B, max: usize, count: bool) -> Result<Bytes, Status>
where
    B: Body,
    B::Error: Into<StdError>,
{
    let mut body = std::pin::pin!(body);
    // the bytes so far: one frame's as they came, or several joined
    let mut single = Bytes::new();
    let mut joined: Option<BytesMut> = None;
    // the message's end (prefix included), once the prefix is in
    let mut end: Option<usize> = None;
    loop {
        let have = joined.as_ref().map_or(single.len(), BytesMut::len);
        if end.is_some_and(|e| have >= e) {
            break;
        }
        let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await else {
            break;
        };
        let frame = frame.map_err(|e| Status::from_error(e.into()))?;
        let Ok(mut data) = frame.into_data() else {
            continue;
        };
        let data = data.copy_to_bytes(data.remaining());
        match &mut joined {
            Some(j) => j.extend_from_slice(&data),
            None if single.is_empty() => single = data,
            None => {
                let mut j = BytesMut::with_capacity(single.len() + data.len());
                j.extend_from_slice(&single);
                j.extend_from_slice(&data);
                joined = Some(j);
            }
        }
        let seen: &[u8] = joined.as_deref().unwrap_or(&single);
        if end.is_none() && seen.len() >= 5 {
            let len = u32::from_be_bytes([seen[1], seen[2], seen[3], seen[4]]) as usize;
            if count {
                received_bytes(len as u64);
            }
            if len > max {
                return Err(Status::resource_exhausted(format!(
                    "grpc: received message larger than max ({len} vs. {max})"
                )));
            }
            end = Some(5 + len);
        }
    }
    let mut all = joined.map_or(single, BytesMut::freeze);
    let Some(end) = end.filter(|e| all.len() >= *e) else {
        return Err(Status::unknown(if all.is_empty() {
            "EOF"
        } else {
            "unexpected EOF"
        }));
    };
    match all[0] {
        0 => {}
        1 => {
            return Err(Status::internal(
                "grpc: compressed flag set with identity or empty encoding",
            ))
        }
        f => {
            return Err(Status::internal(format!(
                "grpc: received unexpected payload format {f}"
            )))
        }
    }
    all.truncate(end);
    all.advance(5);
    Ok(all)
}

/// Decodes a request message; grpc-go's error.
fn decode<M: Message + Default>(b: Bytes) -> Result<M, Status> {
    M::decode(b).map_err(|e| Status::internal(format!("grpc: error unmarshalling request: {e}")))
}

/// A reply message with its prefix, in one buffer.
fn encode<M: Message>(m: &M) -> Result<Bytes, Status> {
    let len = m.encoded_len();
    let mut buf = Vec::with_capacity(5 + len);
    buf.extend_from_slice(&message_prefix(len)?);
    m.encode_raw(&mut buf);
    Ok(buf.into())
}

/// A gRPC response with `body`.
fn grpc_response(body: ReplyBody) -> http::Response<tonic::body::Body> {
    let mut resp = http::Response::new(tonic::body::Body::new(body));
    set_grpc_content_type(&mut resp);
    resp
}

/// Runs a Range and starts its reply.
async fn range(
    server: &EtcdServer,
    request: RangeRequest,
    creds: &Credentials,
) -> Result<ReplyBody, Status> {
    let reply = server.range_reply(request, creds).await?;
    let body = match reply {
        RangeReply::Built(mut r) => {
            let len = r.encoded_len();
            let mut buf = Vec::with_capacity(5 + len);
            buf.extend_from_slice(&message_prefix(len)?);
            retcd_api::codec::encode_range_draining(&mut r, &mut buf);
            ReplyBody::whole(buf.into())
        }
        RangeReply::Encoded {
            header,
            mut range,
            open,
            small,
        } => {
            // the fields around the kvs, as prost writes them (field order)
            let head = RangeResponse {
                header: Some(header),
                ..Default::default()
            }
            .encode_to_vec();
            let tail = RangeResponse {
                more: range.more,
                count: range.count,
                ..Default::default()
            }
            .encode_to_vec();
            let len = head.len() + range.kvs_len() + tail.len();
            if small {
                // a bounded number of rows: read here, written whole
                let mut buf = Vec::with_capacity(5 + len);
                buf.extend_from_slice(&message_prefix(len)?);
                buf.extend_from_slice(&head);
                range
                    .write_kvs(&mut buf, usize::MAX)
                    .map_err(crate::error::ServerError::from)?;
                buf.extend_from_slice(&tail);
                drop(open);
                return Ok(ReplyBody::whole(buf.into()));
            }
            let mut first = message_prefix(len)?.to_vec();
            first.extend_from_slice(&head);
            // one piece waits in the channel while the next is read
            let (tx, rx) = mpsc::channel::<Result<Bytes, Status>>(1);
            tokio::task::spawn_blocking(move || {
                let _open = open;
                loop {
                    let mut piece = Vec::with_capacity(PIECE + 1024);
                    let left = match range.write_kvs(&mut piece, PIECE) {
                        Ok(left) => left,
                        Err(e) => {
                            let e = crate::error::ServerError::from(e);
                            let _ = tx.blocking_send(Err(e.into()));
                            return;
                        }
                    };
                    if !left {
                        piece.extend_from_slice(&tail);
                    }
                    // No empty piece: it would go out as an empty DATA
                    // frame, and h2 clients (tonic's) drop the connection
                    // after 100 of them (an empty range's last piece).
                    // A send fails once the client is gone: stop reading.
                    let sent = piece.is_empty() || tx.blocking_send(Ok(piece.into())).is_ok();
                    if !sent || !left {
                        return;
                    }
                }
            });
            ReplyBody {
                remaining: 5 + len - first.len(),
                first: Some(first.into()),
                rest: Some(rx),
                trailers: true,
                reply: None,
            }
        }
    };
    Ok(body)
}

/// A unary response body: the message (whole, or a streamed Range's first
/// bytes and then the pieces its reading thread sends), then the trailers
/// (the reading thread's error, if it failed).
struct ReplyBody {
    first: Option<Bytes>,
    rest: Option<mpsc::Receiver<Result<Bytes, Status>>>,
    /// Bytes of the message still to come from `rest`.
    remaining: usize,
    trailers: bool,
    /// The call's counts, when the client port left them to this body.
    reply: Option<Reply>,
}

impl ReplyBody {
    fn whole(b: Bytes) -> ReplyBody {
        ReplyBody {
            first: Some(b),
            rest: None,
            remaining: 0,
            trailers: true,
            reply: None,
        }
    }

    fn trailers(&mut self, status: Status) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        self.trailers = false;
        if let Some(r) = &mut self.reply {
            r.finish(status.code() as usize);
        }
        Poll::Ready(Some(trailers(&status).map(Frame::trailers)))
    }
}

impl http_body::Body for ReplyBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        if let Some(b) = this.first.take() {
            if let Some(r) = &this.reply {
                r.sent(&b);
            }
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        if let Some(rx) = &mut this.rest {
            match rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(b))) => {
                    this.remaining = this.remaining.saturating_sub(b.len());
                    return Poll::Ready(Some(Ok(Frame::data(b))));
                }
                Poll::Ready(Some(Err(status))) => {
                    this.rest = None;
                    return this.trailers(status);
                }
                Poll::Ready(None) => {
                    this.rest = None;
                    if this.remaining > 0 {
                        // the reading thread ended early (it panicked)
                        let status = Status::internal("retcd: the range's read stopped");
                        return this.trailers(status);
                    }
                }
            }
        }
        if this.trailers {
            return this.trailers(Status::new(Code::Ok, ""));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.is_none() && !self.trailers
    }
}
