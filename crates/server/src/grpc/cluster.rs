//! etcdserverpb.Cluster: MemberAdd, MemberRemove, MemberUpdate, MemberList,
//! MemberPromote. The rules and the raft side live in `membership`; this
//! layer converts, and forwards a promote to the leader (only the leader
//! knows whether the learner has caught up), as etcd does.

use crate::error::ServerError;
use crate::membership;
use crate::server::EtcdServer;
use retcd_api::etcdserverpb::cluster_client::ClusterClient;
use retcd_api::etcdserverpb::cluster_server::Cluster;
use retcd_api::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse, ResponseHeader,
};
use retcd_api::retcdpb;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::{Request, Response, Status};

pub struct ClusterService {
    pub server: Arc<EtcdServer>,
}

fn to_pb(m: &retcdpb::Member) -> Member {
    Member {
        id: m.id,
        name: m.name.clone(),
        peer_ur_ls: m.peer_urls.clone(),
        client_ur_ls: m.client_urls.clone(),
        is_learner: m.is_learner,
    }
}

fn to_pb_all(ms: &[retcdpb::Member]) -> Vec<Member> {
    ms.iter().map(to_pb).collect()
}

impl ClusterService {
    /// etcd's Cluster headers carry no revision.
    fn header(&self) -> Option<ResponseHeader> {
        Some(self.server.header(0))
    }

    /// Forwards a promote to the leader's client URLs until it answers or
    /// the request timeout passes (etcd forwards over the peer HTTP API).
    async fn promote_on_leader(&self, id: u64) -> Result<Vec<Member>, Status> {
        let deadline = Instant::now() + self.server.request_timeout();
        let mut last = Status::from(ServerError::Timeout);
        while Instant::now() < deadline {
            let leader = self.server.leader();
            if leader == self.server.member_id {
                match membership::promote_member(&self.server, id).await {
                    Ok(ms) => return Ok(to_pb_all(&ms)),
                    Err(ServerError::NotLeader) => {}
                    Err(e) => return Err(e.into()),
                }
            } else if leader != 0 {
                let urls = self
                    .server
                    .shared
                    .members
                    .read()
                    .iter()
                    .find(|m| m.id == leader)
                    .map(|m| m.client_urls.clone())
                    .unwrap_or_default();
                for url in urls {
                    let Ok(ep) = crate::tls::client_endpoint(&url) else {
                        continue;
                    };
                    let ep = ep
                        .connect_timeout(Duration::from_secs(1))
                        .timeout(self.server.request_timeout());
                    let Ok(ch) = ep.connect().await else { continue };
                    match ClusterClient::new(ch)
                        .member_promote(MemberPromoteRequest { id })
                        .await
                    {
                        Ok(r) => return Ok(r.into_inner().members),
                        Err(st) => {
                            // Final answers; anything else is retried.
                            let fin = [
                                ServerError::LearnerNotReady,
                                ServerError::MemberNotFound,
                                ServerError::MemberNotLearner,
                            ];
                            if fin.iter().any(|e| e.to_string() == st.message()) {
                                return Err(st);
                            }
                            last = st;
                        }
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(last)
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(
        &self,
        request: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        let req = request.into_inner();
        let (m, members) =
            membership::add_member(&self.server, &req.peer_ur_ls, req.is_learner).await?;
        Ok(Response::new(MemberAddResponse {
            header: self.header(),
            // etcd answers the new member without name or client URLs.
            member: Some(Member {
                id: m.id,
                peer_ur_ls: m.peer_urls.clone(),
                is_learner: m.is_learner,
                ..Default::default()
            }),
            members: to_pb_all(&members),
        }))
    }

    async fn member_remove(
        &self,
        request: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        let members = membership::remove_member(&self.server, request.into_inner().id).await?;
        Ok(Response::new(MemberRemoveResponse {
            header: self.header(),
            members: to_pb_all(&members),
        }))
    }

    async fn member_update(
        &self,
        request: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        let req = request.into_inner();
        let members = membership::update_member(&self.server, req.id, req.peer_ur_ls).await?;
        Ok(Response::new(MemberUpdateResponse {
            header: self.header(),
            members: to_pb_all(&members),
        }))
    }

    async fn member_list(
        &self,
        _request: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        let members = to_pb_all(&self.server.shared.members.read());
        Ok(Response::new(MemberListResponse {
            header: self.header(),
            members,
        }))
    }

    async fn member_promote(
        &self,
        request: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        let id = request.into_inner().id;
        let members = match membership::promote_member(&self.server, id).await {
            Ok(ms) => to_pb_all(&ms),
            Err(ServerError::NotLeader) => {
                let ms = self.promote_on_leader(id).await?;
                // Read-your-writes on this member: wait (briefly) until it
                // has applied the promote too.
                let deadline = Instant::now() + self.server.request_timeout();
                while Instant::now() < deadline
                    && self
                        .server
                        .shared
                        .members
                        .read()
                        .iter()
                        .any(|m| m.id == id && m.is_learner)
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                ms
            }
            Err(e) => return Err(e.into()),
        };
        Ok(Response::new(MemberPromoteResponse {
            header: self.header(),
            members,
        }))
    }
}
