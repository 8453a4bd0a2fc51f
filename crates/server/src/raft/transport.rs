//! Peer transport: raft messages between members over a gRPC client stream
//! on the peer URLs (`retcdpb.RaftPeer/Stream`).
//!
//! Each peer has a bounded queue and one sender task. The task keeps one
//! stream open and reconnects with a short backoff when the stream breaks;
//! the stream's body takes every message queued since its last write into
//! one `RaftBatch` (so a message goes from the raft thread to the task
//! writing the stream, with no task in between).
//! A full queue or a broken stream drops messages (raft retransmits) and
//! reports the peer unreachable, as etcd's rafthttp does.

use super::{RaftInput, RaftSender};
use crate::error::ServerError;
use crate::ids::Hex;
use crate::tls::Dialer;
use parking_lot::RwLock;
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use retcd_api::retcdpb::raft_peer_client::RaftPeerClient;
use retcd_api::retcdpb::{Member, MembersRequest, RaftBatch};
use std::collections::VecDeque;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::mpsc as tmpsc;
use tokio::sync::oneshot;
use tokio_stream::Stream;

const PEER_QUEUE: usize = 4096;
/// The largest gRPC message on the peer port (a batch, or one fragment).
/// Appends are at most raft's `max_size_per_msg` (1 MiB) plus one entry
/// (at most `--max-request-bytes`), and a batch stops growing at
/// [`BATCH_BYTES`]; snapshots travel in [`FRAGMENT`]s.
pub const MAX_PEER_MESSAGE: usize = 64 * 1024 * 1024;
/// A batch is sent once it holds this many bytes (or 512 messages).
const BATCH_BYTES: usize = 4 * 1024 * 1024;
/// A message whose encoding is larger is sent in fragments of this size.
pub const FRAGMENT: usize = 8 * 1024 * 1024;
/// The most a fragmented message may add up to (a snapshot of the whole
/// store: beyond any backend quota etcd supports).
pub const MAX_REASSEMBLED: usize = 16 * 1024 * 1024 * 1024;

/// Metadata of the peer stream (etcd's rafthttp headers): the cluster, the
/// sending member and the member it is meant for, as hex ids.
pub const CLUSTER_ID_HEADER: &str = "x-etcd-cluster-id";
pub const FROM_HEADER: &str = "x-server-from";
pub const TO_HEADER: &str = "x-raft-to";

/// The sending side of the peer transport; the receiving side is the
/// peer service (`api::peer`), which asks [`Transport::is_removed`].
#[derive(Clone)]
pub struct Transport {
    inner: Arc<Inner>,
}

struct Inner {
    self_id: u64,
    cluster_id: u64,
    /// The raft thread's input: unreachable peers and snapshot reports.
    raft: RaftSender,
    dialer: Dialer,
    /// Where peer sender tasks run ([`peer_runtime`]; a member may be
    /// added from the raft thread, which is not in a runtime).
    runtime: tokio::runtime::Handle,
    /// Protects the per-peer queues (member id → queue). Written when the
    /// member list changes; read on every send.
    peers: RwLock<HashMap<u64, Peer>>,
    /// Protects, per peer, since when its stream has been connected
    /// (etcd's `ActiveSince`; absent while the peer is unreachable). Read by
    /// the strict reconfiguration checks.
    active: RwLock<HashMap<u64, Instant>>,
    /// Protects the ids of members removed from the cluster (since this
    /// process started): their streams are refused, which makes a removed
    /// member stop, as etcd's peers answer a removed member's messages.
    removed: RwLock<HashSet<u64>>,
}

/// The runtime peer traffic runs on: the peer listeners' connections and
/// the peer sender tasks, on one thread of their own (`retcd-peer`),
/// away from the client workers. A raft round trip is a few small
/// messages; on the client runtime each woke a worker that woke its
/// sibling to share work it did not have (a lone put on a 3-member
/// cluster cost the leader 6.8 worker context switches, and a follower
/// with no client at all 3.3). Nothing blocking runs on it: the peer
/// service's scans (HashKV) go to `spawn_blocking`.
pub fn peer_runtime() -> tokio::runtime::Handle {
    static PEER_RUNTIME: std::sync::OnceLock<tokio::runtime::Handle> = std::sync::OnceLock::new();
    PEER_RUNTIME
        .get_or_init(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("start the peer runtime");
            let handle = rt.handle().clone();
            std::thread::Builder::new()
                .name("retcd-peer".into())
                .spawn(move || rt.block_on(std::future::pending::<()>()))
                .expect("start the peer thread");
            handle
        })
        .clone()
}

/// A peer's entry in the transport: its queue, and what stops its sender
/// task when the entry goes (removed, or its URLs changed).
struct Peer {
    queue: tmpsc::Sender<Message>,
    _stop: oneshot::Sender<()>,
}

impl Transport {
    /// A transport for member `self_id` of `cluster_id` feeding `raft`,
    /// dialing with `dialer`; its sender tasks run on [`peer_runtime`].
    pub fn new(self_id: u64, cluster_id: u64, raft: RaftSender, dialer: Dialer) -> Self {
        Transport {
            inner: Arc::new(Inner {
                self_id,
                cluster_id,
                raft,
                dialer,
                runtime: peer_runtime(),
                peers: RwLock::default(),
                active: RwLock::default(),
                removed: RwLock::default(),
            }),
        }
    }

    /// Starts a sender task for every other member.
    pub fn add_peers(&self, members: &[Member]) {
        for m in members {
            self.add_peer(m.id, &m.peer_urls);
        }
    }

    /// Starts a sender task for a new peer (a no-op for this member or a
    /// peer that has one). May be called from any thread.
    pub fn add_peer(&self, id: u64, urls: &[String]) {
        let mut peers = self.inner.peers.write();
        if id == self.inner.self_id || peers.contains_key(&id) {
            return;
        }
        let (queue, rx) = tmpsc::channel(PEER_QUEUE);
        let (stop, stopped) = oneshot::channel();
        peers.insert(id, Peer { queue, _stop: stop });
        self.inner.runtime.spawn(peer_sender(
            id,
            urls.to_vec(),
            rx,
            stopped,
            self.inner.clone(),
        ));
    }

    /// Stops sending to a removed peer (its task ends when its queue
    /// closes) and refuses its streams from now on.
    pub fn remove_peer(&self, id: u64) {
        self.inner.peers.write().remove(&id);
        self.inner.active.write().remove(&id);
        self.inner.removed.write().insert(id);
    }

    /// A peer's URLs changed: restart its sender on the new URLs.
    pub fn update_peer(&self, id: u64, urls: &[String]) {
        self.inner.peers.write().remove(&id);
        self.inner.active.write().remove(&id);
        self.add_peer(id, urls);
    }

    /// Whether `id` was removed from the cluster (its streams are refused).
    pub fn is_removed(&self, id: u64) -> bool {
        self.inner.removed.read().contains(&id)
    }

    /// Since when the stream to `id` has been up; `None` while it is down
    /// (etcd's `Transport.ActiveSince`).
    pub fn active_since(&self, id: u64) -> Option<Instant> {
        self.inner.active.read().get(&id).copied()
    }

    /// Queues messages for their peers; never blocks (called on the raft thread).
    pub fn send(&self, msgs: Vec<Message>) {
        let peers = self.inner.peers.read();
        for m in msgs {
            let to = m.to;
            let is_snap = m.get_msg_type() == MessageType::MsgSnapshot;
            let Some(q) = peers.get(&to) else { continue };
            let heartbeat = m.get_msg_type() == MessageType::MsgHeartbeat;
            if q.queue.try_send(m).is_err() {
                let metrics = crate::metrics::global();
                metrics.peer_send_failed(to);
                if heartbeat {
                    metrics.heartbeat_send_failures.inc();
                }
                let _ = self.inner.raft.send(RaftInput::Unreachable(to));
                if is_snap {
                    let _ = self.inner.raft.send(RaftInput::SnapshotReport(to, false));
                }
            }
        }
    }
}

async fn peer_sender(
    to: u64,
    urls: Vec<String>,
    rx: tmpsc::Receiver<Message>,
    mut stopped: oneshot::Receiver<()>,
    inner: Arc<Inner>,
) {
    let rx: PeerQueue = Arc::new(parking_lot::Mutex::new(Queue { rx, body: 0 }));
    let (self_id, raft) = (inner.self_id, inner.raft.clone());
    // `etcd_network_active_peers` follows what this task saw (up once per
    // connected stream, down when it breaks or the task ends)
    let pm = Counted(
        crate::metrics::global().peer(self_id, to),
        AtomicBool::new(false),
    );
    let set_active = |up: bool| {
        // (a task whose queue closed leaves `active` to the peer's next
        // task, if its URLs changed)
        if !rx.lock().rx.is_closed() {
            let mut a = inner.active.write();
            if !up {
                a.remove(&to);
            } else if inner.peers.read().contains_key(&to) {
                a.entry(to).or_insert_with(Instant::now);
            }
        }
        pm.set(up);
    };
    if urls.is_empty() {
        // (MemberAdd and MemberUpdate refuse an empty URL list; a member
        // stored without one is not dialed rather than crashing the task)
        tracing::error!(peer = %Hex(to), "peer has no URL; not sending to it");
        return;
    }
    let mut attempt = 0usize;
    loop {
        let url = urls[attempt % urls.len()].clone();
        attempt += 1;
        let channel = match inner.dialer.peer(&url) {
            Ok(dial) => {
                dial.configure(|ep| {
                    ep.connect_timeout(Duration::from_millis(500))
                        .tcp_nodelay(true)
                        .http2_keep_alive_interval(Duration::from_secs(5))
                        .keep_alive_timeout(Duration::from_secs(5))
                })
                .connect()
                .await
            }
            Err(e) => {
                tracing::error!(peer = %Hex(to), url, error = %e, "invalid peer URL");
                return;
            }
        };
        let channel = match channel {
            Ok(c) => c,
            Err(_) => {
                set_active(false);
                // Drop what is queued; raft will resend.
                let mut had_snapshot = false;
                {
                    let mut q = rx.lock();
                    loop {
                        match q.rx.try_recv() {
                            Ok(m) => {
                                pm.0.send_failed(1);
                                had_snapshot |= m.get_msg_type() == MessageType::MsgSnapshot
                            }
                            // The peer was removed: stop.
                            Err(tmpsc::error::TryRecvError::Disconnected) => return,
                            Err(tmpsc::error::TryRecvError::Empty) => break,
                        }
                    }
                }
                let _ = raft.send(RaftInput::Unreachable(to));
                if had_snapshot {
                    let _ = raft.send(RaftInput::SnapshotReport(to, false));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _probe = AbortOnDrop(tokio::spawn(probe_rtt(
            RaftPeerClient::new(channel.clone()),
            pm.0.rtt.clone(),
        )));
        let mut client = RaftPeerClient::new(channel)
            .max_decoding_message_size(MAX_PEER_MESSAGE)
            .max_encoding_message_size(MAX_PEER_MESSAGE);
        let body = PeerBatches::new(rx.clone(), (self_id, to), raft.clone(), pm.0.clone());
        let request = stream_request(body, inner.cluster_id, self_id, to);
        set_active(true);
        let res = tokio::select! {
            res = client.stream(request) => res,
            // removed, or its URLs changed (a new task sends to it):
            // dropping the call resets the stream
            _ = &mut stopped => return,
        };
        set_active(false);
        if rx.lock().rx.is_closed() {
            return;
        }
        if let Err(st) = &res {
            if st.message() == ServerError::RemovedMember.to_string() {
                let _ = raft.send(RaftInput::Removed);
            }
        }
        let _ = raft.send(RaftInput::Unreachable(to));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A peer's queue of raft messages: filled by the raft thread
/// ([`Transport::send`]), drained by the body of the stream open to the
/// peer, or by its sender task while no stream is. The lock protects the
/// receiver and the number of the body allowed to drain it; it is held
/// only to take messages out, never across `.await`.
type PeerQueue = Arc<parking_lot::Mutex<Queue>>;

struct Queue {
    rx: tmpsc::Receiver<Message>,
    /// The newest body: an older one still polled by a dying stream ends
    /// instead of taking messages (the receiver keeps one waker: the
    /// live body's must be the one it wakes).
    body: u64,
}

/// Batches ready to yield; `true` marks the last piece of a snapshot
/// (reported sent once yielded, failed if never).
type Ready = VecDeque<(RaftBatch, bool)>;

/// The request body of a peer stream. When hyper polls it (it has room
/// to send), it takes every message queued for the peer and yields them as
/// one `RaftBatch`. The raft thread's send wakes the task writing this body
/// directly, with no task in between. A snapshot (the whole store) is
/// encoded and cut into [`FRAGMENT`]s on a blocking thread, not on the
/// peer thread. The stream ends when the queue closes.
struct PeerBatches {
    queue: PeerQueue,
    /// This body's number (see [`Queue::body`]).
    id: u64,
    from: u64,
    /// The peer (every message in the queue is to it).
    to: u64,
    /// Batches taken out of the queue and not yielded yet.
    waiting: Ready,
    /// A snapshot being encoded; nothing queued after it is taken before
    /// it is in `waiting`.
    encoding: Option<tokio::task::JoinHandle<Ready>>,
    /// For snapshot reports.
    raft: RaftSender,
    metrics: crate::metrics::PeerMetrics,
}

impl PeerBatches {
    fn new(
        queue: PeerQueue,
        (from, to): (u64, u64),
        raft: RaftSender,
        metrics: crate::metrics::PeerMetrics,
    ) -> Self {
        let id = {
            let mut q = queue.lock();
            q.body += 1;
            q.body
        };
        PeerBatches {
            queue,
            id,
            from,
            to,
            waiting: VecDeque::new(),
            encoding: None,
            raft,
            metrics,
        }
    }

    /// Takes `first` and whatever else is queued (up to 512 messages or
    /// [`BATCH_BYTES`], and nothing after a snapshot) into `waiting`, or
    /// starts encoding the snapshot.
    fn take(&mut self, first: Message, rx: &mut tmpsc::Receiver<Message>) {
        let mut msgs = Vec::new();
        let mut bytes = 0;
        let mut next = Some(first);
        while let Some(m) = next.take() {
            if m.get_msg_type() == MessageType::MsgSnapshot {
                self.push(std::mem::take(&mut msgs));
                let from = self.from;
                self.encoding = Some(tokio::task::spawn_blocking(move || {
                    let data = m.write_to_bytes().expect("encode raft message");
                    let mut parts: Ready = if data.len() > FRAGMENT {
                        fragments(from, &data)
                            .into_iter()
                            .map(|b| (b, false))
                            .collect()
                    } else {
                        let b = RaftBatch {
                            from,
                            msgs: vec![data],
                            ..Default::default()
                        };
                        VecDeque::from([(b, false)])
                    };
                    if let Some(last) = parts.back_mut() {
                        last.1 = true;
                    }
                    parts
                }));
                return;
            }
            let data = m.write_to_bytes().expect("encode raft message");
            if data.len() > FRAGMENT {
                self.push(std::mem::take(&mut msgs));
                self.waiting
                    .extend(fragments(self.from, &data).into_iter().map(|b| (b, false)));
                bytes = 0;
            } else {
                bytes += data.len();
                msgs.push(data);
            }
            if msgs.len() < 512 && bytes < BATCH_BYTES {
                next = rx.try_recv().ok();
            }
        }
        self.push(msgs);
    }

    fn push(&mut self, msgs: Vec<Vec<u8>>) {
        if !msgs.is_empty() {
            self.waiting.push_back((
                RaftBatch {
                    from: self.from,
                    msgs,
                    ..Default::default()
                },
                false,
            ));
        }
    }

    fn yield_next(&mut self) -> Option<RaftBatch> {
        let (b, snapshot_end) = self.waiting.pop_front()?;
        let n = b.msgs.iter().map(|m| m.len()).sum::<usize>() + b.fragment.len();
        self.metrics.sent_bytes.inc_by(n as u64);
        if snapshot_end {
            let _ = self.raft.send(RaftInput::SnapshotReport(self.to, true));
        }
        Some(b)
    }
}

impl Stream for PeerBatches {
    type Item = RaftBatch;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<RaftBatch>> {
        let this = &mut *self;
        loop {
            if let Some(b) = this.yield_next() {
                return Poll::Ready(Some(b));
            }
            if let Some(encoding) = this.encoding.as_mut() {
                let parts = std::task::ready!(Pin::new(encoding).poll(cx));
                this.encoding = None;
                match parts {
                    Ok(parts) => this.waiting.extend(parts),
                    // (the encoding panicked: raft sends the snapshot again)
                    Err(_) => return Poll::Ready(None),
                }
                continue;
            }
            let queue = this.queue.clone();
            let mut q = queue.lock();
            if q.body != this.id {
                // a newer stream drains the queue
                return Poll::Ready(None);
            }
            match q.rx.poll_recv(cx) {
                Poll::Ready(Some(first)) => this.take(first, &mut q.rx),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Drop for PeerBatches {
    /// Batches taken but never sent (the stream broke) are counted as
    /// failed sends (raft sends them again), and a snapshot among them is
    /// reported failed.
    fn drop(&mut self) {
        let n: usize = self.waiting.iter().map(|(b, _)| b.msgs.len().max(1)).sum();
        if n > 0 {
            self.metrics.send_failed(n as u64);
        }
        let encoding = self.encoding.take();
        if let Some(encoding) = &encoding {
            encoding.abort();
            self.metrics.send_failed(1);
        }
        if encoding.is_some() || self.waiting.iter().any(|(_, snapshot_end)| *snapshot_end) {
            let _ = self.raft.send(RaftInput::SnapshotReport(self.to, false));
        }
    }
}

/// A peer's metrics and whether it is counted active now.
struct Counted(crate::metrics::PeerMetrics, AtomicBool);

impl Counted {
    fn set(&self, up: bool) {
        if self.1.swap(up, Ordering::Relaxed) != up {
            if up {
                self.0.activated();
            } else {
                self.0.deactivated();
            }
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// Ends a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How often the round trip to a connected peer is measured (etcd probes
/// every 5 s while a peer is unhealthy, 30 s otherwise).
const PROBE_INTERVAL: Duration = Duration::from_secs(5);

/// Measures the round trip of a small call (`Members`) to the peer into
/// `etcd_network_peer_round_trip_time_seconds`, as etcd's prober does.
async fn probe_rtt(
    mut client: RaftPeerClient<tonic::transport::Channel>,
    rtt: prometheus::Histogram,
) {
    loop {
        tokio::time::sleep(PROBE_INTERVAL).await;
        let started = Instant::now();
        if client.members(MembersRequest {}).await.is_ok() {
            rtt.observe(started.elapsed().as_secs_f64());
        }
    }
}

/// The peer stream call, with the metadata the receiving member checks.
fn stream_request<T>(body: T, cluster_id: u64, from: u64, to: u64) -> tonic::Request<T> {
    let mut r = tonic::Request::new(body);
    let md = r.metadata_mut();
    for (k, v) in [
        (CLUSTER_ID_HEADER, cluster_id),
        (FROM_HEADER, from),
        (TO_HEADER, to),
    ] {
        if let Ok(v) = Hex(v).to_string().parse() {
            md.insert(k, v);
        }
    }
    r
}

/// A message's encoding in [`FRAGMENT`]-sized pieces, the last one marked.
fn fragments(from: u64, data: &[u8]) -> Vec<RaftBatch> {
    let n = data.len().div_ceil(FRAGMENT);
    data.chunks(FRAGMENT)
        .enumerate()
        .map(|(i, c)| RaftBatch {
            from,
            msgs: vec![],
            fragment: c.to_vec(),
            last_fragment: i + 1 == n,
        })
        .collect()
}

/// Reassembles fragmented messages on the receiving side of a stream.
#[derive(Default)]
pub struct Reassembly {
    buf: Vec<u8>,
}

impl Reassembly {
    /// Adds a fragment; the whole message once its last fragment came.
    pub fn push(&mut self, fragment: &[u8], last: bool) -> Result<Option<Vec<u8>>, ServerError> {
        if self.buf.len() + fragment.len() > MAX_REASSEMBLED {
            self.buf = Vec::new();
            return Err(ServerError::PeerMessageTooLarge);
        }
        self.buf.extend_from_slice(fragment);
        Ok(last.then(|| std::mem::take(&mut self.buf)))
    }
}

/// Reads a hex id from peer metadata.
pub fn hex_id(md: &tonic::metadata::MetadataMap, key: &str) -> Option<u64> {
    u64::from_str_radix(md.get(key)?.to_str().ok()?, 16).ok()
}

/// The metadata naming this cluster on a peer request (leases, HashKV).
pub fn with_cluster_id<T>(body: T, cluster_id: u64) -> tonic::Request<T> {
    let mut r = tonic::Request::new(body);
    if let Ok(v) = Hex(cluster_id).to_string().parse() {
        r.metadata_mut().insert(CLUSTER_ID_HEADER, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_fragments_reassemble() {
        let data: Vec<u8> = (0..(2 * FRAGMENT + 5)).map(|i| i as u8).collect();
        let parts = fragments(7, &data);
        assert_eq!(parts.len(), 3);
        assert!(parts[..2].iter().all(|p| !p.last_fragment && p.from == 7));
        assert!(parts[2].last_fragment);
        let mut r = Reassembly::default();
        assert_eq!(r.push(&parts[0].fragment, false).unwrap(), None);
        assert_eq!(r.push(&parts[1].fragment, false).unwrap(), None);
        assert_eq!(r.push(&parts[2].fragment, true).unwrap(), Some(data));
        // and the buffer starts afresh
        assert_eq!(r.push(b"ab", true).unwrap(), Some(b"ab".to_vec()));
    }
}
