//! etcdserverpb.Watch: one bidirectional stream carries many watchers, as
//! etcd's `v3rpc/watch.go`.
//!
//! Each stream has one task, one channel and the response stream:
//!
//! ```text
//! client ──requests──> recv task ──create/cancel/progress──> WatchStream (mvcc)
//!                          │ created / canceled responses         │ try_send (apply thread,
//!                          ▼                                      ▼  sync thread)
//!                 [stream channel, CHAN_BUF_LEN] ───> ResponseStream ──> client
//! ```
//!
//! Every response of the stream goes through the one bounded stream channel
//! (its messages are lists of responses, [`ReplyBatch`]es: the store sends
//! one per committed batch with the replies of all the stream's watchers
//! and the buffer of encoded events they share),
//! so the order is the order of queueing: a `created` response is queued
//! before its watcher is registered (it precedes every event of the
//! watcher), a `canceled` response after it is removed (no event follows
//! it), and a progress response under the store lock (it follows every
//! event at or below its revision). The response stream, polled by gRPC
//! when the connection can take more, fills in the header, splits
//! fragmented responses and drives the progress-notify ticker. When the
//! client stops reading, gRPC stops polling, the stream channel fills, and
//! the store parks the stream's watchers as victims: apply and other
//! streams go on.
//!
//! Bad requests are answered on the stream as etcd does and never end it:
//! an inverted range or a duplicate client watch id gets `created = true,
//! canceled = true, watch_id = -1` and the error text as `cancel_reason`;
//! a cancel of an unknown id is ignored.
//!
//! The stream ends when the client goes away (the receive side fails or
//! the response stream is dropped); the `WatchStream` is dropped with the
//! last holder, removing its watchers.

use crate::server::EtcdServer;
use futures::ready;
use parking_lot::Mutex;
use prost::Message as _;
use retcd_api::etcdserverpb::watch_create_request::FilterType;
use retcd_api::etcdserverpb::watch_request::RequestUnion;
use retcd_api::etcdserverpb::{ResponseHeader, WatchCreateRequest, WatchRequest, WatchResponse};
use retcd_mvcc::{
    EventBufs, ReplyBatch, SinkError, WatchOptions, WatchRange, WatchReply, WatchSink, WatchStream,
};
use std::collections::HashSet;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

/// Capacity of a stream's response channel, in messages (etcd's
/// `chanBufLen`, which counts single responses).
pub const CHAN_BUF_LEN: usize = 128;
/// Most replies queued on a stream before the store parks its watchers
/// (a message that alone exceeds it is taken when the queue is empty).
/// With one message per committed batch holding a reply per watcher, this,
/// not [`CHAN_BUF_LEN`], is what bounds a slow client's queue.
pub const MAX_QUEUED_REPLIES: usize = 1024;

pub struct WatchService {
    pub server: Arc<EtcdServer>,
}

/// Replies in a stream's channel: added before a message is queued,
/// subtracted when the response stream takes the message out.
type Queued = Arc<AtomicUsize>;

/// The sending side of a stream channel: the store's sink, and the
/// receive task's way to queue created/canceled responses.
#[derive(Clone)]
struct StreamTx {
    tx: mpsc::Sender<ReplyBatch>,
    queued: Queued,
}

impl WatchSink for StreamTx {
    fn try_send(&self, replies: ReplyBatch) -> Result<(), SinkError> {
        let n = replies.len();
        let before = self.queued.fetch_add(n, Ordering::Relaxed);
        if before > 0 && before + n > MAX_QUEUED_REPLIES {
            self.queued.fetch_sub(n, Ordering::Relaxed);
            return Err(SinkError::Full(replies));
        }
        self.tx.try_send(replies).map_err(|e| {
            self.queued.fetch_sub(n, Ordering::Relaxed);
            match e {
                mpsc::error::TrySendError::Full(r) => SinkError::Full(r),
                mpsc::error::TrySendError::Closed(_) => SinkError::Closed,
            }
        })
    }
}

impl StreamTx {
    /// Queues one reply from the receive task, waiting for room.
    async fn send(&self, reply: WatchReply) -> Result<(), ()> {
        self.queued.fetch_add(1, Ordering::Relaxed);
        self.tx.send(reply.into()).await.map_err(|_| {
            self.queued.fetch_sub(1, Ordering::Relaxed);
        })
    }
}

/// Watch ids of the stream that asked for fragmentation. Protects only the
/// set; written by the receive task, read by the response stream; never held
/// across `.await`.
type Fragmenting = Arc<Mutex<HashSet<i64>>>;

fn header(revision: i64) -> Option<ResponseHeader> {
    Some(ResponseHeader {
        revision,
        ..Default::default()
    })
}

impl WatchService {
    /// Serves one watch stream (the Watch RPC; see [`super::watch_server`]).
    pub(crate) fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<ResponseStream>, Status> {
        let (md, _, inbound) = request.into_parts();
        let (tx, rx) = mpsc::channel(CHAN_BUF_LEN);
        let tx = StreamTx {
            tx,
            queued: Queued::default(),
        };
        let queued = tx.queued.clone();
        let ws = Arc::new(self.server.watchable().new_stream(Arc::new(tx.clone())));
        let fragmenting: Fragmenting = Arc::default();
        let caller = Caller {
            server: self.server.clone(),
            md,
        };
        tokio::spawn(recv_loop(
            inbound,
            ws.clone(),
            tx,
            fragmenting.clone(),
            caller,
        ));
        Ok(Response::new(ResponseStream::new(
            self.server.clone(),
            rx,
            queued,
            ws,
            fragmenting,
        )))
    }
}

/// Who opened the stream: its token is checked again at every create, as
/// etcd does.
struct Caller {
    server: Arc<EtcdServer>,
    md: tonic::metadata::MetadataMap,
}

impl Caller {
    /// etcd's `isWatchPermitted`: None if the caller may watch the range,
    /// else etcd's cancel reason.
    fn refusal(&self, c: &WatchCreateRequest) -> Option<String> {
        use crate::auth::AuthError;
        let auth = self.server.auth();
        if !auth.is_enabled() {
            return None;
        }
        let creds = crate::api::credentials(&self.server, &self.md);
        let checked = match self.server.who(&creds) {
            Ok(who) => auth.check_range(who.as_ref(), &c.key, &c.range_end),
            Err(crate::error::ServerError::Auth(e)) => Err(e),
            Err(_) => Err(AuthError::PermissionDenied),
        };
        // etcd answers with the Go status string of its rpctypes error.
        checked.err().map(|e| {
            let e = match e {
                AuthError::InvalidAuthToken | AuthError::AuthOldRevision | AuthError::UserEmpty => {
                    e
                }
                _ => AuthError::PermissionDenied,
            };
            let status = crate::api::error_map::to_status(e.into());
            format!(
                "rpc error: code = {:?} desc = {}",
                status.code(),
                status.message()
            )
        })
    }
}

/// Reads the client's requests until it closes its side or fails.
async fn recv_loop(
    mut inbound: Streaming<WatchRequest>,
    ws: Arc<WatchStream>,
    tx: StreamTx,
    fragmenting: Fragmenting,
    caller: Caller,
) {
    loop {
        let req = match inbound.message().await {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(error = %e, "watch stream: receive failed");
                return;
            }
        };
        let mut request = req.request_union;
        if let Some(RequestUnion::CreateRequest(c)) = &mut request {
            if c.key.is_empty() {
                // as etcd, before its permission check: \0 is the smallest key
                c.key = vec![0];
            }
        }
        let resp = match request {
            // etcd 3.5.24+ (#20709), before the permission check: a
            // negative start revision is refused as compacted.
            Some(RequestUnion::CreateRequest(c)) if c.start_revision < 0 => WatchResponse {
                header: header(ws.rev()),
                watch_id: -1,
                created: true,
                canceled: true,
                cancel_reason: format!("etcdserver: {}", retcd_mvcc::MvccError::Compacted),
                ..Default::default()
            },
            Some(RequestUnion::CreateRequest(c)) => match caller.refusal(&c) {
                Some(reason) => WatchResponse {
                    header: header(ws.rev()),
                    watch_id: -1,
                    created: true,
                    canceled: true,
                    cancel_reason: reason,
                    ..Default::default()
                },
                None => match create(&ws, c, &tx, &fragmenting).await {
                    Create::Refused(r) => r,
                    Create::Started => continue,
                    Create::Closed => return,
                },
            },
            Some(RequestUnion::CancelRequest(c)) => {
                if !ws.cancel(c.watch_id) {
                    continue;
                }
                fragmenting.lock().remove(&c.watch_id);
                WatchResponse {
                    header: header(ws.rev()),
                    watch_id: c.watch_id,
                    canceled: true,
                    ..Default::default()
                }
            }
            Some(RequestUnion::ProgressRequest(_)) => {
                ws.request_progress_all();
                continue;
            }
            None => continue,
        };
        if tx.send(resp.into()).await.is_err() {
            return;
        }
    }
}

/// What [`create`] did.
enum Create {
    /// The watch was refused; queue this response.
    Refused(WatchResponse),
    /// `created` was queued and the watcher started.
    Started,
    /// The stream is gone.
    Closed,
}

/// Handles a create request; on success the `created` response is queued
/// before the watcher starts.
async fn create(
    ws: &WatchStream,
    c: WatchCreateRequest,
    tx: &StreamTx,
    fragmenting: &Fragmenting,
) -> Create {
    let rev = ws.rev();
    let reserved = WatchRange::new(&c.key, &c.range_end)
        .and_then(|r| ws.reserve(c.watch_id).map(|id| (id, r)));
    let (id, range) = match reserved {
        Ok(v) => v,
        Err(e) => {
            return Create::Refused(WatchResponse {
                header: header(rev),
                watch_id: -1,
                created: true,
                canceled: true,
                cancel_reason: e.to_string(),
                ..Default::default()
            })
        }
    };
    if c.fragment {
        fragmenting.lock().insert(id);
    }
    let created = WatchResponse {
        header: header(rev),
        watch_id: id,
        created: true,
        ..Default::default()
    };
    if tx.send(created.into()).await.is_err() {
        return Create::Closed;
    }
    let start_rev = match c.start_revision {
        // from the revision the `created` header reports
        0 => rev + 1,
        r => r, // positive: negative ones were refused
    };
    ws.watch(
        id,
        range,
        WatchOptions {
            start_rev,
            prev_kv: c.prev_kv,
            no_put: c.filters.contains(&(FilterType::Noput as i32)),
            no_delete: c.filters.contains(&(FilterType::Nodelete as i32)),
            progress_notify: c.progress_notify,
            requested_rev: c.start_revision,
        },
    );
    Create::Started
}

/// The response stream handed to gRPC: takes responses from the stream
/// channel, fills in the header, splits fragmented responses and drives
/// the progress-notify ticker. Polled by the connection's own task, so a
/// response costs one channel hop. Dropped when the client goes away,
/// which drops the stream's [`WatchStream`] with it (its watchers end).
pub(crate) struct ResponseStream {
    server: Arc<EtcdServer>,
    rx: mpsc::Receiver<ReplyBatch>,
    /// Replies in `rx` (see [`MAX_QUEUED_REPLIES`]).
    queued: Queued,
    ticker: tokio::time::Interval,
    ws: Arc<WatchStream>,
    fragmenting: Fragmenting,
    /// The largest response before fragmenting splits it.
    max: usize,
    /// Replies taken from the channel, not yet handed out.
    incoming: std::vec::IntoIter<WatchReply>,
    /// The buffers of encoded events the replies taken from the channel
    /// point into (their message's).
    bufs: EventBufs,
    /// The header replies are sent with (at each one's revision): this
    /// member's, as of the last message taken from the channel.
    base: ResponseHeader,
    /// Fragments of a split response not yet handed out (before `incoming`).
    split: VecDeque<WatchReply>,
}

impl ResponseStream {
    fn new(
        server: Arc<EtcdServer>,
        rx: mpsc::Receiver<ReplyBatch>,
        queued: Queued,
        ws: Arc<WatchStream>,
        fragmenting: Fragmenting,
    ) -> ResponseStream {
        let interval = server.cfg.experimental_watch_progress_notify_interval;
        let interval = if interval.is_zero() {
            Duration::from_secs(600)
        } else {
            interval
        };
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        // ticks missed while gRPC did not poll are not made up in a burst
        // (each would queue another progress response)
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // etcd splits above the largest request gRPC accepts, not above
        // --max-request-bytes itself
        let max = server.cfg.max_request_bytes as usize + crate::config::GRPC_OVERHEAD_BYTES;
        ResponseStream {
            server,
            rx,
            queued,
            ticker,
            ws,
            fragmenting,
            max,
            incoming: Vec::new().into_iter(),
            bufs: Default::default(),
            base: ResponseHeader::default(),
            split: VecDeque::new(),
        }
    }
}

impl ResponseStream {
    /// Replies taken from the channel and not yet handed out.
    pub(crate) fn replies_waiting(&self) -> usize {
        self.incoming.len() + self.split.len()
    }

    /// Writes `reply`, the last one [`Self::poll_reply`] gave, as a
    /// `WatchResponse` (its shared events are in the buffers of the
    /// message it came in, kept until the next `poll_reply`).
    pub(crate) fn encode(&self, reply: &WatchReply, buf: &mut impl bytes::BufMut) {
        reply.encode(&self.bufs, &self.base, buf)
    }

    /// The next reply to send (the fragments of a split reply first);
    /// `None` once the stream's channel is closed.
    /// Encode it ([`Self::encode`]) before polling again.
    pub(crate) fn poll_reply(&mut self, cx: &mut Context<'_>) -> Poll<Option<WatchReply>> {
        let this = self;
        if let Some(p) = this.split.pop_front() {
            return Poll::Ready(Some(p));
        }
        let r = loop {
            if let Some(r) = this.incoming.next() {
                break r;
            }
            // a tick queues progress responses into the channel
            while this.ticker.poll_tick(cx).is_ready() {
                this.ws.progress_tick();
            }
            let Some(batch) = ready!(this.rx.poll_recv(cx)) else {
                return Poll::Ready(None);
            };
            this.queued.fetch_sub(batch.len(), Ordering::Relaxed);
            // The client is behind when more batches wait: take them too and
            // send each watcher's events in one response (as etcd sends a
            // catching-up watcher several at once) instead of one per
            // batch. A Go client spent twice the CPU per event on one
            // response each.
            let mut batches = vec![batch];
            while batches.len() < MERGE_BATCHES {
                match this.rx.try_recv() {
                    Ok(b) => {
                        this.queued.fetch_sub(b.len(), Ordering::Relaxed);
                        batches.push(b);
                    }
                    Err(_) => break,
                }
            }
            // counted per batch: one shared counter update, not one per reply
            let events: usize = (batches.iter())
                .flat_map(|b| b.replies())
                .map(|r| r.event_count())
                .sum();
            crate::metrics::global().events_total.inc_by(events as u64);
            let batch = if batches.len() == 1 {
                batches.pop().unwrap_or_default()
            } else {
                ReplyBatch::coalesce(batches, MERGE_BYTES)
            };
            let (bufs, replies) = batch.into_parts();
            this.bufs = bufs;
            this.incoming = replies.into_iter();
            this.base = this.server.header(0);
        };
        // the bound first: it only adds up sizes (every merged reply gets here)
        if r.event_count() > 1
            && r.encoded_len_bound() >= this.max
            && r.encoded_len(&this.base) >= this.max
            && this.fragmenting.lock().contains(&r.watch_id())
        {
            // split as sent: with this member's header
            let header = ResponseHeader {
                revision: r.revision(),
                ..this.base
            };
            let mut resp = r.into_response(&this.bufs);
            resp.header = Some(header);
            this.split = fragments(resp, this.max)
                .into_iter()
                .map(WatchReply::from)
                .collect();
            return Poll::Ready(this.split.pop_front());
        }
        Poll::Ready(Some(r))
    }
}

/// Batches a stream takes from its channel at once when they wait.
const MERGE_BATCHES: usize = 64;

/// Replies are merged up to this size (encoded).
const MERGE_BYTES: usize = 64 * 1024;

/// Splits `wr` into responses below `max` bytes each (at least one event
/// each), all but the last marked `fragment`, as etcd's `sendFragments`.
fn fragments(wr: WatchResponse, max: usize) -> Vec<WatchResponse> {
    if wr.encoded_len() < max || wr.events.len() < 2 {
        return vec![wr];
    }
    let mut out = Vec::new();
    let mut events = wr.events.clone().into_iter().peekable();
    let base = WatchResponse {
        events: Vec::new(),
        fragment: true,
        ..wr
    };
    while events.peek().is_some() {
        let mut cur = base.clone();
        while let Some(ev) = events.peek() {
            cur.events.push(ev.clone());
            if cur.events.len() > 1 && cur.encoded_len() >= max {
                cur.events.pop();
                break;
            }
            events.next();
        }
        if events.peek().is_none() {
            cur.fragment = false;
        }
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use retcd_api::mvccpb::{Event, KeyValue};

    /// The sink bounds a stream's queue by replies, not only by messages;
    /// a message larger than the bound alone is taken by an empty queue.
    #[test]
    fn test_sink_bounds_queued_replies() {
        let (tx, mut rx) = mpsc::channel(CHAN_BUF_LEN);
        let sink = StreamTx {
            tx,
            queued: Queued::default(),
        };
        let replies =
            |n: usize| ReplyBatch::from_parts(Default::default(), vec![WatchReply::default(); n]);
        assert!(sink.try_send(replies(1000)).is_ok());
        match sink.try_send(replies(100)) {
            Err(SinkError::Full(back)) => assert_eq!(back.len(), 100),
            other => panic!("expected Full, got {other:?}"),
        }
        assert!(sink.try_send(replies(24)).is_ok(), "up to the bound");
        assert_eq!(sink.queued.load(Ordering::Relaxed), MAX_QUEUED_REPLIES);
        // the response stream hands them out (and subtracts them)
        for b in [rx.try_recv().unwrap(), rx.try_recv().unwrap()] {
            sink.queued.fetch_sub(b.len(), Ordering::Relaxed);
        }
        assert!(sink.try_send(replies(2 * MAX_QUEUED_REPLIES)).is_ok());
    }

    /// Waiting batches merge each watcher's event replies, keep each
    /// watcher's order and stop at a barrier (a creation here).
    #[test]
    fn test_coalesce_merges_per_watcher_up_to_barriers() {
        let ev = |i: u8| Event {
            kv: Some(KeyValue {
                key: vec![b'k'].into(),
                mod_revision: i as i64,
                ..Default::default()
            }),
            ..Default::default()
        };
        let reply = |w: i64, i: u8| {
            WatchReply::from(WatchResponse {
                watch_id: w,
                events: vec![ev(i)],
                ..Default::default()
            })
        };
        let created = WatchReply::from(WatchResponse {
            watch_id: 9,
            created: true,
            ..Default::default()
        });
        let batch = |r: Vec<WatchReply>| ReplyBatch::from_parts(Default::default(), r);
        let out = ReplyBatch::coalesce(
            vec![
                batch(vec![reply(1, 1), reply(2, 1)]),
                batch(vec![reply(1, 2), reply(2, 2)]),
                batch(vec![created, reply(1, 3)]),
                batch(vec![reply(1, 4), reply(2, 3)]),
            ],
            MERGE_BYTES,
        );
        let got: Vec<(i64, bool, Vec<i64>)> = out
            .into_responses()
            .into_iter()
            .map(|r| {
                let revs = r.events.iter().map(|e| e.kv.as_ref().unwrap().mod_revision);
                (r.watch_id, r.created, revs.collect())
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (1, false, vec![1, 2]),
                (2, false, vec![1, 2]),
                (9, true, vec![]),
                (1, false, vec![3, 4]),
                (2, false, vec![3]),
            ]
        );
    }

    #[test]
    fn test_fragments() {
        let ev = |i: u8| Event {
            kv: Some(KeyValue {
                key: vec![i; 100].into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let wr = WatchResponse {
            watch_id: 3,
            events: (0..10).map(ev).collect(),
            ..Default::default()
        };
        assert_eq!(fragments(wr.clone(), 1 << 20).len(), 1);
        let parts = fragments(wr.clone(), 350);
        assert!(parts.len() >= 4);
        assert!(parts[..parts.len() - 1].iter().all(|p| p.fragment));
        assert!(!parts.last().unwrap().fragment);
        let all: Vec<Event> = parts.into_iter().flat_map(|p| p.events).collect();
        assert_eq!(all, wr.events);
    }
}
