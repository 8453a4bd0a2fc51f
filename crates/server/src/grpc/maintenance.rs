//! etcdserverpb.Maintenance: Status, Alarm (list), Hash, HashKV. The rest
//! (Defragment, Snapshot, MoveLeader, Downgrade) arrive with the
//! cluster-operations issue and answer UNIMPLEMENTED until then.

use crate::config::ETCD_API_VERSION;
use crate::error::ServerError;
use crate::server::EtcdServer;
use retcd_api::etcdserverpb::maintenance_server::Maintenance;
use retcd_api::etcdserverpb::{
    alarm_request::AlarmAction, AlarmRequest, AlarmResponse, HashKvRequest, HashKvResponse,
    HashRequest, HashResponse, StatusRequest, StatusResponse,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct MaintenanceService {
    pub server: Arc<EtcdServer>,
}

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    async fn alarm(
        &self,
        request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        let req = request.into_inner();
        match AlarmAction::try_from(req.action) {
            Ok(AlarmAction::Get) => {}
            // No alarm can be raised yet (quota arrives later), so there is
            // nothing to activate or deactivate: answer as etcd does for an
            // alarm that is not set.
            Ok(AlarmAction::Activate) | Ok(AlarmAction::Deactivate) => {}
            Err(_) => return Err(Status::invalid_argument("etcdserver: unknown alarm action")),
        }
        Ok(Response::new(AlarmResponse {
            header: Some(self.server.header(self.server.kv.current_revision())),
            alarms: vec![],
        }))
    }

    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let s = &self.server;
        Ok(Response::new(StatusResponse {
            header: Some(s.header(s.kv.current_revision())),
            version: ETCD_API_VERSION.to_string(),
            db_size: s.backend.size() as i64,
            leader: s.shared.leader.load(Ordering::Acquire),
            raft_index: s.shared.commit_index.load(Ordering::Acquire),
            raft_term: s.shared.term.load(Ordering::Acquire),
            raft_applied_index: s.shared.applied_index.load(Ordering::Acquire),
            errors: vec![],
            db_size_in_use: s.backend.size_in_use() as i64,
            is_learner: false,
        }))
    }

    async fn hash(&self, _request: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        let hash = self.server.kv.hash().map_err(ServerError::from)?;
        Ok(Response::new(HashResponse {
            header: Some(self.server.header(self.server.kv.current_revision())),
            hash,
        }))
    }

    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        let req = request.into_inner();
        let (hash, compact_revision, hash_revision) = self
            .server
            .kv
            .hash_kv(req.revision)
            .map_err(ServerError::from)?;
        Ok(Response::new(HashKvResponse {
            header: Some(self.server.header(self.server.kv.current_revision())),
            hash,
            compact_revision,
            hash_revision,
        }))
    }
}
