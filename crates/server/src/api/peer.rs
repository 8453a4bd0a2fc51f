//! The peer port's service (`retcdpb.RaftPeer`): raft message streams from
//! other members (the receiving side of `raft::transport`), this member's
//! view of the cluster for members joining it, and lease renewals and
//! TimeToLive forwarded to the leader (etcd's leasehttp).

use crate::api::error_map::{to_peer_lease_status, to_status};
use crate::error::ServerError;
use crate::raft::transport::MAX_PEER_MESSAGE;
use crate::raft::RaftInput;
use crate::server::EtcdServer;
use protobuf::Message as _;
use raft::eraftpb::Message;
use retcd_api::etcdserverpb::{
    LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use retcd_api::retcdpb::raft_peer_server::{RaftPeer, RaftPeerServer};
use retcd_api::retcdpb::{MembersRequest, MembersResponse, RaftAck, RaftBatch};
use std::sync::Arc;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

pub struct PeerService {
    server: Arc<EtcdServer>,
}

/// The peer service of `server`, sized for raft messages that carry whole
/// snapshots.
pub fn service(server: Arc<EtcdServer>) -> RaftPeerServer<PeerService> {
    RaftPeerServer::new(PeerService { server })
        .max_decoding_message_size(MAX_PEER_MESSAGE)
        .max_encoding_message_size(MAX_PEER_MESSAGE)
}

#[tonic::async_trait]
impl RaftPeer for PeerService {
    async fn stream(
        &self,
        request: Request<Streaming<RaftBatch>>,
    ) -> Result<Response<RaftAck>, Status> {
        let mut stream = request.into_inner();
        let raft = self.server.raft_sender();
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            if self.server.transport().is_removed(batch.from) {
                return Err(to_status(ServerError::RemovedMember));
            }
            for bytes in batch.msgs {
                match Message::parse_from_bytes(&bytes) {
                    Ok(m) => raft.send(RaftInput::Step(m)).map_err(to_status)?,
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
        let resp =
            crate::server::time_to_live_on_leader(self.server.lessor(), &request.into_inner())
                .map_err(to_peer_lease_status)?;
        Ok(Response::new(resp))
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
