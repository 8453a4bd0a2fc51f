//! etcdserverpb.Cluster: MemberList. Membership changes (add, remove,
//! update, promote) arrive with the cluster-operations issue.

use crate::server::EtcdServer;
use retcd_api::etcdserverpb::cluster_server::Cluster;
use retcd_api::etcdserverpb::{Member, MemberListRequest, MemberListResponse};
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct ClusterService {
    pub server: Arc<EtcdServer>,
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_list(
        &self,
        _request: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        let members = self
            .server
            .shared
            .members
            .read()
            .iter()
            .map(|m| Member {
                id: m.id,
                name: m.name.clone(),
                peer_ur_ls: m.peer_urls.clone(),
                client_ur_ls: m.client_urls.clone(),
                is_learner: m.is_learner,
            })
            .collect();
        Ok(Response::new(MemberListResponse {
            // etcd's MemberList header carries no revision.
            header: Some(self.server.header(0)),
            members,
        }))
    }
}
