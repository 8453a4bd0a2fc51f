//! The peer port's service (`retcdpb.RaftPeer`): raft message streams from
//! other members (the receiving side of `raft::transport`), this member's
//! view of the cluster for members joining it, and lease renewals and
//! TimeToLive forwarded to the leader (etcd's leasehttp).

use crate::api::error_map::{to_peer_lease_status, to_status};
use crate::error::ServerError;
use crate::ids::Hex;
use crate::raft::transport::{
    hex_id, Reassembly, CLUSTER_ID_HEADER, FROM_HEADER, MAX_PEER_MESSAGE, TO_HEADER,
};
use crate::raft::RaftInput;
use crate::server::EtcdServer;
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use retcd_api::etcdserverpb::{
    HashKvRequest, HashKvResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse, MemberPromoteRequest, MemberPromoteResponse,
};
use retcd_api::retcdpb::raft_peer_server::{RaftPeer, RaftPeerServer};
use retcd_api::retcdpb::{MembersRequest, MembersResponse, RaftAck, RaftBatch};
use std::sync::Arc;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

pub struct PeerService {
    server: Arc<EtcdServer>,
}

impl PeerService {
    /// A request naming another cluster is refused (etcd's
    /// `X-Etcd-Cluster-ID` check); `required` for raft streams, checked
    /// when present elsewhere.
    fn check_cluster(
        &self,
        md: &tonic::metadata::MetadataMap,
        required: bool,
    ) -> Result<(), ServerError> {
        match hex_id(md, CLUSTER_ID_HEADER) {
            Some(id) if id == self.server.cluster_id => Ok(()),
            None if !required && md.get(CLUSTER_ID_HEADER).is_none() => Ok(()),
            _ => Err(ServerError::ClusterIdMismatch),
        }
    }

    /// etcd's rafthttp stream checks, in its order: the cluster, a valid
    /// sender, not a removed member, a member at all, meant for this
    /// member. Returns the sender.
    fn check_stream(&self, md: &tonic::metadata::MetadataMap) -> Result<u64, ServerError> {
        self.check_cluster(md, true)?;
        let from = hex_id(md, FROM_HEADER).ok_or(ServerError::PeerInvalidFrom)?;
        if self.server.transport().is_removed(from) {
            return Err(ServerError::RemovedMember);
        }
        if from == self.server.member_id || self.server.member(from).is_none() {
            return Err(ServerError::PeerSenderNotFound);
        }
        if hex_id(md, TO_HEADER) != Some(self.server.member_id) {
            return Err(ServerError::PeerToMismatch);
        }
        Ok(from)
    }
}

/// The peer service of `server`, sized for raft messages that carry whole
/// snapshots.
pub fn service(server: Arc<EtcdServer>) -> RaftPeerServer<PeerService> {
    RaftPeerServer::new(PeerService { server })
        .max_decoding_message_size(MAX_PEER_MESSAGE)
        .max_encoding_message_size(MAX_PEER_MESSAGE)
}

impl PeerService {
    /// Hands a peer's message to raft: it must be for this member (etcd
    /// 3.5.14+ refuses a mismatch) and from the stream's sender, unless
    /// it is a request the sender passes on ([`Self::sender_ok`]);
    /// dropped when the raft thread's queue is full (raft sends it again).
    fn step(&self, from: u64, m: Message) -> Result<(), Status> {
        if m.to != self.server.member_id || !self.sender_ok(from, &m) {
            tracing::warn!(from = %Hex(from), msg_from = %Hex(m.from), msg_to = %Hex(m.to), "raft message not from its stream's sender or not for this member");
            return Err(to_status(ServerError::PeerToMismatch));
        }
        match self.server.raft_sender().send(RaftInput::Step(m)) {
            Ok(()) => Ok(()),
            Err(ServerError::TooManyRequests) => {
                tracing::debug!(from = %Hex(from), "raft input queue full: peer message dropped");
                Ok(())
            }
            Err(e) => Err(to_status(e)),
        }
    }

    /// Whether `m` may come over `from`'s stream. Proposals and ReadIndex
    /// requests travel without a term (raft never sets one on them; a
    /// follower passing one on with a term would stop raft: it refuses to
    /// send them with one), and not only from the stream's sender: raft
    /// passes them on to the leader under the member that first sent
    /// them (through a follower, or a leader deposed with them queued), so
    /// the leader's answer goes to that member, which must be a current
    /// member. Every other message is the sender's own. (etcd checks no
    /// sender.)
    fn sender_ok(&self, from: u64, m: &Message) -> bool {
        if !matches!(
            m.get_msg_type(),
            MessageType::MsgPropose | MessageType::MsgReadIndex
        ) {
            return m.from == from;
        }
        m.term == 0
            && (m.from == from
                || (!self.server.transport().is_removed(m.from)
                    && self.server.member(m.from).is_some()))
    }
}

#[tonic::async_trait]
impl RaftPeer for PeerService {
    async fn stream(
        &self,
        request: Request<Streaming<RaftBatch>>,
    ) -> Result<Response<RaftAck>, Status> {
        let from = match self.check_stream(request.metadata()) {
            Ok(from) => from,
            Err(e) => {
                tracing::warn!(
                    remote = ?request.remote_addr(),
                    from = ?request.metadata().get(FROM_HEADER),
                    error = %e,
                    "refused a raft stream"
                );
                return Err(to_status(e));
            }
        };
        let mut stream = request.into_inner();
        let mut reassembly = Reassembly::default();
        let pm = crate::metrics::global().peer_recv(from);
        while let Some(batch) = stream.next().await {
            let batch = match batch {
                Ok(b) => b,
                Err(e) => {
                    pm.failed();
                    return Err(e);
                }
            };
            pm.received_bytes.inc_by(
                (batch.msgs.iter().map(|m| m.len()).sum::<usize>() + batch.fragment.len()) as u64,
            );
            // members removed while the stream is open are refused too
            if self.server.transport().is_removed(from) {
                return Err(to_status(ServerError::RemovedMember));
            }
            if batch.from != from {
                return Err(to_status(ServerError::PeerInvalidFrom));
            }
            let step = |m: protobuf::ProtobufResult<Message>| match m {
                Ok(m) => self.step(from, m),
                Err(e) => {
                    pm.failed();
                    tracing::warn!(from = %Hex(from), error = %e, "undecodable raft message from peer");
                    Ok(())
                }
            };
            for bytes in &batch.msgs {
                step(Message::parse_from_bytes(bytes))?;
            }
            if !batch.fragment.is_empty() || batch.last_fragment {
                if let Some(whole) = reassembly
                    .push(&batch.fragment, batch.last_fragment)
                    .map_err(to_status)?
                {
                    // a message this large is a snapshot of the whole
                    // store: decoded off the peer thread
                    let m = tokio::task::spawn_blocking(move || Message::parse_from_bytes(&whole))
                        .await
                        .map_err(|e| Status::internal(format!("decoding a raft message: {e}")))?;
                    step(m)?;
                }
            }
        }
        Ok(Response::new(RaftAck {}))
    }

    async fn lease_renew(
        &self,
        request: Request<LeaseKeepAliveRequest>,
    ) -> Result<Response<LeaseKeepAliveResponse>, Status> {
        self.check_cluster(request.metadata(), false)
            .map_err(to_status)?;
        let id = request.into_inner().id;
        let ttl = crate::server::renew_on_leader(self.server.lessor(), id)
            .await
            .map_err(to_peer_lease_status)?;
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
        self.check_cluster(request.metadata(), false)
            .map_err(to_status)?;
        let resp =
            crate::server::time_to_live_on_leader(self.server.lessor(), &request.into_inner())
                .map_err(to_peer_lease_status)?;
        Ok(Response::new(resp))
    }

    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        self.check_cluster(request.metadata(), false)
            .map_err(to_status)?;
        let rev = request.into_inner().revision;
        Ok(Response::new(self.server.hash_kv_for_peer(rev).await?))
    }

    async fn member_promote(
        &self,
        request: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        self.check_cluster(request.metadata(), true)
            .map_err(to_status)?;
        let id = request.into_inner().id;
        let members = self.server.member_promote_for_peer(id).await?;
        Ok(Response::new(MemberPromoteResponse {
            header: Some(self.server.header(0)),
            members,
        }))
    }

    async fn members(
        &self,
        _request: Request<MembersRequest>,
    ) -> Result<Response<MembersResponse>, Status> {
        Ok(Response::new(MembersResponse {
            cluster_id: self.server.cluster_id,
            members: self.server.members(),
        }))
    }
}
