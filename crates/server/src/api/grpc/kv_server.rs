//! The `etcdserverpb.KV` route: the generated server for every method but
//! `Range`, whose response this writes itself.
//!
//! tonic encodes a unary response into one buffer before sending any of
//! it, so a Range of 200k values was in memory whole (and, while encoded,
//! its kvs and their encoding overlapped). Here a long plain Range
//! (`EtcdServer::range_reply`) is sent as it is read: the message's length
//! prefix from the sizes of its stored rows (read first, from the same
//! snapshot), then the header, then the rows in pieces of [`PIECE`] bytes
//! read on a blocking thread one piece ahead of HTTP/2's flow control,
//! then `more` and `count`. The client receives one ordinary
//! `RangeResponse`. Any other Range is built whole and sent as tonic would.
//!
//! Request decoding is tonic's (`Streaming`, the same message size limit);
//! compressed requests never get here (the client port refuses them, as
//! etcd does).

use super::framing::{message_prefix, set_grpc_content_type, trailers};
use super::kv::KvService;
use crate::api::credentials;
use crate::server::{EtcdServer, RangeReply};
use bytes::Bytes;
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
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tonic::{Code, Status, Streaming};

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
        if req.uri().path() != "/etcdserverpb.KV/Range" {
            return self.generated.call(req);
        }
        let server = self.server.clone();
        let max = self.max_decoding_message_size;
        Box::pin(async move {
            Ok(match range(&server, max, req).await {
                Ok(resp) => resp,
                Err(status) => status.into_http(),
            })
        })
    }
}

/// Decodes the request as tonic's unary path does, runs the Range and
/// starts its response.
async fn range<B>(
    server: &EtcdServer,
    max_decoding: usize,
    req: http::Request<B>,
) -> Result<http::Response<tonic::body::Body>, Status>
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    let (parts, body) = req.into_parts();
    let decoder = tonic_prost::ProstDecoder::<RangeRequest>::default();
    let mut stream = Streaming::new_request(decoder, body, None, Some(max_decoding));
    let request = stream
        .message()
        .await?
        .ok_or_else(|| Status::internal("Missing request message."))?;
    let creds = credentials(server, &MetadataMap::from_headers(parts.headers));
    let reply = server.range_reply(request, &creds).await?;
    let body = match reply {
        RangeReply::Built(mut r) => {
            let len = r.encoded_len();
            let mut buf = Vec::with_capacity(5 + len);
            buf.extend_from_slice(&message_prefix(len)?);
            retcd_api::codec::encode_range_draining(&mut r, &mut buf);
            RangeBody::whole(buf.into())
        }
        RangeReply::Encoded {
            header,
            mut range,
            open,
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
                    // a send fails once the client is gone: stop reading
                    if tx.blocking_send(Ok(piece.into())).is_err() || !left {
                        return;
                    }
                }
            });
            RangeBody {
                remaining: 5 + len - first.len(),
                first: Some(first.into()),
                rest: Some(rx),
                trailers: true,
            }
        }
    };
    let mut resp = http::Response::new(tonic::body::Body::new(body));
    set_grpc_content_type(&mut resp);
    Ok(resp)
}

/// A Range response body: the first bytes, then the pieces the reading
/// thread sends, then the trailers (its error, if reading failed).
struct RangeBody {
    first: Option<Bytes>,
    rest: Option<mpsc::Receiver<Result<Bytes, Status>>>,
    /// Bytes of the message still to come from `rest`.
    remaining: usize,
    trailers: bool,
}

impl RangeBody {
    fn whole(b: Bytes) -> RangeBody {
        RangeBody {
            first: Some(b),
            rest: None,
            remaining: 0,
            trailers: true,
        }
    }

    fn trailers(&mut self, status: Status) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        self.trailers = false;
        Poll::Ready(Some(trailers(&status).map(Frame::trailers)))
    }
}

impl http_body::Body for RangeBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        if let Some(b) = this.first.take() {
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
