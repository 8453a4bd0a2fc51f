//! Peer transport: raft messages between members over a gRPC client stream
//! on the peer URLs (`retcdpb.RaftPeer/Stream`).
//!
//! Each peer has a bounded queue and one sender task. The task keeps one
//! stream open, sends every message queued since its last write in one
//! `RaftBatch`, and reconnects with a short backoff when the stream breaks.
//! A full queue or a broken stream drops messages (raft retransmits) and
//! reports the peer unreachable, as etcd's rafthttp does.

use crate::raft_node::RaftInput;
use parking_lot::RwLock;
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use retcd_api::etcdserverpb::{
    LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use retcd_api::retcdpb::raft_peer_client::RaftPeerClient;
use retcd_api::retcdpb::raft_peer_server::{RaftPeer, RaftPeerServer};
use retcd_api::retcdpb::{Member, MembersRequest, MembersResponse, RaftAck, RaftBatch};
use std::collections::{HashMap, HashSet};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc as tmpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

const PEER_QUEUE: usize = 4096;
/// Raft messages carry whole snapshots; let them through.
pub const MAX_PEER_MESSAGE: usize = 2 * 1024 * 1024 * 1024 - 1;

#[derive(Clone, Default)]
pub struct Transport {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Protects the per-peer queues (member id → queue). Written when the
    /// member list changes; read on every send.
    peers: RwLock<HashMap<u64, tmpsc::Sender<Message>>>,
    /// Protects the raft thread's input handle, set once at start.
    raft: RwLock<Option<mpsc::Sender<RaftInput>>>,
    /// Protects this member's id, the cluster id and the member list
    /// answered on `Members`.
    view: RwLock<(u64, u64, Vec<Member>)>,
    /// Protects the lessor handle (set once at start) that answers
    /// forwarded lease keepalives and TimeToLive.
    lessor: RwLock<Option<Arc<retcd_lease::Lessor>>>,
    /// Protects the runtime handle (set once at start) on which peer sender
    /// tasks are spawned when a member is added from the raft thread.
    runtime: RwLock<Option<tokio::runtime::Handle>>,
    /// Protects, per peer, since when its stream has been connected
    /// (etcd's `ActiveSince`; absent while the peer is unreachable). Read by
    /// the strict reconfiguration checks.
    active: RwLock<HashMap<u64, Instant>>,
    /// Protects the ids of members removed from the cluster (since this
    /// process started): their streams are refused with
    /// [`REMOVED_MEMBER`], which makes a removed member stop, as etcd's
    /// peers answer a removed member's messages.
    removed: RwLock<HashSet<u64>>,
}

/// What a peer answers a removed member's stream with (etcd's text).
pub const REMOVED_MEMBER: &str = "the member has been permanently removed from the cluster";

impl Transport {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a sender task for every other member. Must be called inside a
    /// tokio runtime.
    pub fn set_peers(&self, self_id: u64, members: &[Member], raft: mpsc::Sender<RaftInput>) {
        *self.inner.raft.write() = Some(raft.clone());
        *self.inner.runtime.write() = Some(tokio::runtime::Handle::current());
        {
            let mut view = self.inner.view.write();
            view.0 = self_id;
            view.2 = members.to_vec();
        }
        for m in members {
            if m.id != self_id {
                self.add_peer(m.id, &m.peer_urls);
            }
        }
    }

    /// Starts a sender task for a new peer (a no-op if it exists). May be
    /// called from any thread once [`Self::set_peers`] has run.
    pub fn add_peer(&self, id: u64, urls: &[String]) {
        let (Some(raft), Some(rt)) = (
            self.inner.raft.read().clone(),
            self.inner.runtime.read().clone(),
        ) else {
            return;
        };
        let self_id = self.inner.view.read().0;
        let mut peers = self.inner.peers.write();
        if id == self_id || peers.contains_key(&id) {
            return;
        }
        let (tx, rx) = tmpsc::channel(PEER_QUEUE);
        peers.insert(id, tx);
        rt.spawn(peer_sender(
            self_id,
            id,
            urls.to_vec(),
            rx,
            raft,
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

    /// The member list answered on `RaftPeer/Members`.
    pub fn set_members(&self, members: &[Member]) {
        self.inner.view.write().2 = members.to_vec();
    }

    /// Since when the stream to `id` has been up; `None` while it is down
    /// (etcd's `Transport.ActiveSince`).
    pub fn active_since(&self, id: u64) -> Option<Instant> {
        self.inner.active.read().get(&id).copied()
    }

    pub fn set_lessor(&self, lessor: Arc<retcd_lease::Lessor>) {
        *self.inner.lessor.write() = Some(lessor);
    }

    pub fn set_cluster_id(&self, cluster_id: u64) {
        self.inner.view.write().1 = cluster_id;
    }

    /// Queues messages for their peers; never blocks (called on the raft thread).
    pub fn send(&self, msgs: Vec<Message>) {
        let peers = self.inner.peers.read();
        let raft = self.inner.raft.read();
        for m in msgs {
            let to = m.to;
            let is_snap = m.get_msg_type() == MessageType::MsgSnapshot;
            let Some(q) = peers.get(&to) else { continue };
            if q.try_send(m).is_err() {
                if let Some(r) = raft.as_ref() {
                    let _ = r.send(RaftInput::Unreachable(to));
                    if is_snap {
                        let _ = r.send(RaftInput::SnapshotReport(to, false));
                    }
                }
            }
        }
    }

    pub fn service(&self) -> RaftPeerServer<PeerService> {
        RaftPeerServer::new(PeerService {
            inner: self.inner.clone(),
        })
        .max_decoding_message_size(MAX_PEER_MESSAGE)
        .max_encoding_message_size(MAX_PEER_MESSAGE)
    }
}

async fn peer_sender(
    self_id: u64,
    to: u64,
    urls: Vec<String>,
    mut rx: tmpsc::Receiver<Message>,
    raft: mpsc::Sender<RaftInput>,
    inner: Arc<Inner>,
) {
    let set_active = |up: bool| {
        let mut a = inner.active.write();
        if !up {
            a.remove(&to);
        } else if inner.peers.read().contains_key(&to) {
            a.entry(to).or_insert_with(Instant::now);
        }
    };
    let mut attempt = 0usize;
    'reconnect: loop {
        let url = urls[attempt % urls.len().max(1)].clone();
        attempt += 1;
        let channel = match crate::tls::peer_endpoint(&url) {
            Ok(ep) => {
                ep.connect_timeout(Duration::from_millis(500))
                    .tcp_nodelay(true)
                    .http2_keep_alive_interval(Duration::from_secs(5))
                    .keep_alive_timeout(Duration::from_secs(5))
                    .connect()
                    .await
            }
            Err(e) => {
                tracing::error!(peer = %format!("{to:x}"), url, error = %e, "invalid peer URL");
                return;
            }
        };
        let channel = match channel {
            Ok(c) => c,
            Err(_) => {
                set_active(false);
                // Drop what is queued; raft will resend.
                let mut had_snapshot = false;
                loop {
                    match rx.try_recv() {
                        Ok(m) => had_snapshot |= m.get_msg_type() == MessageType::MsgSnapshot,
                        // The peer was removed: stop.
                        Err(tmpsc::error::TryRecvError::Disconnected) => return,
                        Err(tmpsc::error::TryRecvError::Empty) => break,
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
        let mut client = RaftPeerClient::new(channel)
            .max_decoding_message_size(MAX_PEER_MESSAGE)
            .max_encoding_message_size(MAX_PEER_MESSAGE);
        let (btx, brx) = tmpsc::channel::<RaftBatch>(64);
        let mut call = tokio::spawn(async move { client.stream(ReceiverStream::new(brx)).await });
        set_active(true);
        loop {
            tokio::select! {
                m = rx.recv() => {
                    let Some(first) = m else { call.abort(); return };
                    let mut snaps = Vec::new();
                    let mut msgs = Vec::new();
                    let mut next = Some(first);
                    while let Some(m) = next.take() {
                        if m.get_msg_type() == MessageType::MsgSnapshot {
                            snaps.push(m.to);
                        }
                        msgs.push(m.write_to_bytes().expect("encode raft message"));
                        if msgs.len() < 512 {
                            next = rx.try_recv().ok();
                        }
                    }
                    let ok = btx.send(RaftBatch { from: self_id, msgs }).await.is_ok();
                    for s in snaps {
                        let _ = raft.send(RaftInput::SnapshotReport(s, ok));
                    }
                    if !ok {
                        set_active(false);
                        let _ = raft.send(RaftInput::Unreachable(to));
                        continue 'reconnect;
                    }
                }
                res = &mut call => {
                    set_active(false);
                    if let Ok(Err(st)) = &res {
                        if st.message() == REMOVED_MEMBER {
                            let _ = raft.send(RaftInput::Removed);
                        }
                    }
                    let _ = raft.send(RaftInput::Unreachable(to));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue 'reconnect;
                }
            }
        }
    }
}

pub struct PeerService {
    inner: Arc<Inner>,
}

impl PeerService {
    fn lessor(&self) -> Result<Arc<retcd_lease::Lessor>, Status> {
        self.inner
            .lessor
            .read()
            .clone()
            .ok_or_else(|| Status::unavailable("retcd: lessor is not started"))
    }
}

#[tonic::async_trait]
impl RaftPeer for PeerService {
    async fn stream(
        &self,
        request: Request<Streaming<RaftBatch>>,
    ) -> Result<Response<RaftAck>, Status> {
        let mut stream = request.into_inner();
        let raft = self
            .inner
            .raft
            .read()
            .clone()
            .ok_or_else(|| Status::unavailable("retcd: raft is not started"))?;
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            if self.inner.removed.read().contains(&batch.from) {
                return Err(Status::failed_precondition(REMOVED_MEMBER));
            }
            for bytes in batch.msgs {
                match Message::parse_from_bytes(&bytes) {
                    Ok(m) => {
                        if raft.send(RaftInput::Step(m)).is_err() {
                            return Err(Status::unavailable("etcdserver: server stopped"));
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "undecodable raft message from peer"),
                }
            }
        }
        Ok(Response::new(RaftAck {}))
    }

    async fn lease_renew(
        &self,
        request: Request<LeaseKeepAliveRequest>,
    ) -> Result<Response<LeaseKeepAliveResponse>, Status> {
        let lessor = self.lessor()?;
        let id = request.into_inner().id;
        let ttl = crate::grpc::lease::renew_on_leader(&lessor, id)
            .await
            .map_err(crate::grpc::lease::peer_status)?;
        Ok(Response::new(LeaseKeepAliveResponse {
            header: None,
            id,
            ttl,
        }))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let lessor = self.lessor()?;
        let resp = crate::grpc::lease::time_to_live_on_leader(&lessor, &request.into_inner())
            .map_err(crate::grpc::lease::peer_status)?;
        Ok(Response::new(resp))
    }

    async fn members(
        &self,
        _request: Request<MembersRequest>,
    ) -> Result<Response<MembersResponse>, Status> {
        let view = self.inner.view.read();
        Ok(Response::new(MembersResponse {
            cluster_id: view.1,
            members: view.2.clone(),
        }))
    }
}
