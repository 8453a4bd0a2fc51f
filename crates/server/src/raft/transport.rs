//! Peer transport: raft messages between members over a gRPC client stream
//! on the peer URLs (`retcdpb.RaftPeer/Stream`).
//!
//! Each peer has a bounded queue and one sender task. The task keeps one
//! stream open, sends every message queued since its last write in one
//! `RaftBatch`, and reconnects with a short backoff when the stream breaks.
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
use retcd_api::retcdpb::{Member, RaftBatch};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc as tmpsc;
use tokio_stream::wrappers::ReceiverStream;

const PEER_QUEUE: usize = 4096;
/// Raft messages carry whole snapshots; let them through.
pub const MAX_PEER_MESSAGE: usize = 2 * 1024 * 1024 * 1024 - 1;

/// The sending side of the peer transport; the receiving side is the
/// peer service (`api::peer`), which asks [`Transport::is_removed`].
#[derive(Clone)]
pub struct Transport {
    inner: Arc<Inner>,
}

struct Inner {
    self_id: u64,
    /// The raft thread's input: unreachable peers and snapshot reports.
    raft: RaftSender,
    dialer: Dialer,
    /// Where peer sender tasks run (a member may be added from the raft
    /// thread, which is not in the runtime).
    runtime: tokio::runtime::Handle,
    /// Protects the per-peer queues (member id → queue). Written when the
    /// member list changes; read on every send.
    peers: RwLock<HashMap<u64, tmpsc::Sender<Message>>>,
    /// Protects, per peer, since when its stream has been connected
    /// (etcd's `ActiveSince`; absent while the peer is unreachable). Read by
    /// the strict reconfiguration checks.
    active: RwLock<HashMap<u64, Instant>>,
    /// Protects the ids of members removed from the cluster (since this
    /// process started): their streams are refused, which makes a removed
    /// member stop, as etcd's peers answer a removed member's messages.
    removed: RwLock<HashSet<u64>>,
}

impl Transport {
    /// A transport for member `self_id` feeding `raft`, dialing with
    /// `dialer`. Must be called inside a tokio runtime (sender tasks are
    /// spawned on it).
    pub fn new(self_id: u64, raft: RaftSender, dialer: Dialer) -> Self {
        Transport {
            inner: Arc::new(Inner {
                self_id,
                raft,
                dialer,
                runtime: tokio::runtime::Handle::current(),
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
        let (tx, rx) = tmpsc::channel(PEER_QUEUE);
        peers.insert(id, tx);
        self.inner
            .runtime
            .spawn(peer_sender(id, urls.to_vec(), rx, self.inner.clone()));
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
            if q.try_send(m).is_err() {
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
    mut rx: tmpsc::Receiver<Message>,
    inner: Arc<Inner>,
) {
    let (self_id, raft) = (inner.self_id, inner.raft.clone());
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
        let channel = match inner.dialer.peer_endpoint(&url) {
            Ok(ep) => {
                ep.connect_timeout(Duration::from_millis(500))
                    .tcp_nodelay(true)
                    .http2_keep_alive_interval(Duration::from_secs(5))
                    .keep_alive_timeout(Duration::from_secs(5))
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
                        if st.message() == ServerError::RemovedMember.to_string() {
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
