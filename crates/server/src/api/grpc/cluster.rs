//! etcdserverpb.Cluster: MemberAdd, MemberRemove, MemberUpdate, MemberList,
//! MemberPromote (the membership logic is `server::cluster`).

use crate::api::credentials;
use crate::apply::membership::to_pb;
use crate::server::EtcdServer;
use retcd_api::etcdserverpb::cluster_server::Cluster;
use retcd_api::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse, ResponseHeader,
};
use retcd_api::retcdpb;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct ClusterService {
    pub server: Arc<EtcdServer>,
}

fn to_pb_all(ms: &[retcdpb::Member]) -> Vec<Member> {
    ms.iter().map(to_pb).collect()
}

impl ClusterService {
    /// etcd's Cluster headers carry no revision.
    fn header(&self) -> Option<ResponseHeader> {
        Some(self.server.header(0))
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(
        &self,
        request: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        let req = request.into_inner();
        let (m, members) = self
            .server
            .member_add(&req.peer_ur_ls, req.is_learner, &creds)
            .await?;
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
        let creds = credentials(&self.server, request.metadata());
        let members = self
            .server
            .member_remove(request.into_inner().id, &creds)
            .await?;
        Ok(Response::new(MemberRemoveResponse {
            header: self.header(),
            members: to_pb_all(&members),
        }))
    }

    async fn member_update(
        &self,
        request: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        let req = request.into_inner();
        let members = self
            .server
            .member_update(req.id, req.peer_ur_ls, &creds)
            .await?;
        Ok(Response::new(MemberUpdateResponse {
            header: self.header(),
            members: to_pb_all(&members),
        }))
    }

    async fn member_list(
        &self,
        request: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        let req = request.into_inner();
        let members = self.server.member_list(req.linearizable, &creds).await?;
        Ok(Response::new(MemberListResponse {
            header: self.header(),
            members: to_pb_all(&members),
        }))
    }

    async fn member_promote(
        &self,
        request: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        let members = self
            .server
            .member_promote(request.into_inner().id, &creds)
            .await?;
        Ok(Response::new(MemberPromoteResponse {
            header: self.header(),
            members,
        }))
    }
}
