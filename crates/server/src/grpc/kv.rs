//! etcdserverpb.KV: Range, Put, DeleteRange, Txn, Compact.

use super::validate;
use crate::apply::ApplyResult;
use crate::auth::AuthInfo;
use crate::error::ServerError;
use crate::server::EtcdServer;
use retcd_api::etcdserverpb::kv_server::Kv;
use retcd_api::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, ResponseHeader, TxnRequest, TxnResponse,
};
use retcd_api::retcdpb::InternalRaftRequest;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct KvService {
    pub server: Arc<EtcdServer>,
}

impl KvService {
    /// Sets cluster/member/term on a header whose revision apply (or the
    /// read) filled in; a missing header gets the current revision.
    fn fill(&self, h: &mut Option<ResponseHeader>) {
        let rev = h
            .as_ref()
            .map(|h| h.revision)
            .filter(|r| *r != 0)
            .unwrap_or_else(|| self.server.kv.current_revision());
        *h = Some(self.server.header(rev));
    }

    /// Proposes on behalf of `who` (the apply checks its permissions).
    async fn propose(
        &self,
        req: InternalRaftRequest,
        who: Option<AuthInfo>,
    ) -> Result<ApplyResult, Status> {
        match self.server.propose_as(req, who).await? {
            ApplyResult::Err(e) => Err(e.into()),
            ok => Ok(ok),
        }
    }
}

fn unexpected(r: ApplyResult) -> Status {
    Status::internal(format!("retcd: unexpected apply result {r:?}"))
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn range(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<RangeResponse>, Status> {
        let who = self.server.auth_info(request.metadata())?;
        let req = request.into_inner();
        // The rest of the learner rule is `super::client_guard`.
        if !req.serializable && self.server.is_learner() {
            return Err(ServerError::NotSupportedForLearner.into());
        }
        validate::check_range(&req)?;
        if !req.serializable {
            self.server.linearizable_read_notify().await?;
        }
        self.server
            .shared
            .auth
            .check_range(who.as_ref(), &req.key, &req.range_end)
            .map_err(ServerError::from)?;
        let mut resp = self.server.kv.range(&req).map_err(ServerError::from)?;
        self.fill(&mut resp.header);
        Ok(Response::new(resp))
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let who = self.server.auth_info(request.metadata())?;
        let req = request.into_inner();
        // etcd's quotaKVServer runs before the request checks.
        crate::quota::check(&self.server, crate::quota::cost_put(&req)).await?;
        validate::check_put(&req)?;
        match self
            .propose(
                InternalRaftRequest {
                    put: Some(req),
                    ..Default::default()
                },
                who,
            )
            .await?
        {
            ApplyResult::Put(mut r) => {
                self.fill(&mut r.header);
                Ok(Response::new(r))
            }
            other => Err(unexpected(other)),
        }
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let who = self.server.auth_info(request.metadata())?;
        let req = request.into_inner();
        validate::check_delete(&req)?;
        match self
            .propose(
                InternalRaftRequest {
                    delete_range: Some(req),
                    ..Default::default()
                },
                who,
            )
            .await?
        {
            ApplyResult::DeleteRange(mut r) => {
                self.fill(&mut r.header);
                Ok(Response::new(r))
            }
            other => Err(unexpected(other)),
        }
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let who = self.server.auth_info(request.metadata())?;
        let req = request.into_inner();
        crate::quota::check(&self.server, crate::quota::cost_txn(&req)).await?;
        validate::check_txn(&req, self.server.cfg.max_txn_ops as usize)?;
        // As etcd: a txn that writes nothing is served from the local store
        // (after a ReadIndex unless every range is serializable).
        if retcd_mvcc::is_txn_read_only(&req) {
            if !retcd_mvcc::is_txn_serializable(&req) {
                self.server.linearizable_read_notify().await?;
            }
            if self.server.shared.auth.is_enabled() {
                crate::apply::check_txn(&self.server.shared.auth, who.as_ref(), &req)
                    .map_err(ServerError::from)?;
            }
            let mut resp = self.server.kv.read_txn(&req).map_err(ServerError::from)?;
            self.fill(&mut resp.header);
            return Ok(Response::new(resp));
        }
        match self
            .propose(
                InternalRaftRequest {
                    txn: Some(req),
                    ..Default::default()
                },
                who,
            )
            .await?
        {
            ApplyResult::Txn(mut r) => {
                self.fill(&mut r.header);
                Ok(Response::new(r))
            }
            other => Err(unexpected(other)),
        }
    }

    async fn compact(
        &self,
        request: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        let who = self.server.auth_info(request.metadata())?;
        let req = request.into_inner();
        let (rev, physical) = (req.revision, req.physical);
        match self
            .propose(
                InternalRaftRequest {
                    compaction: Some(req),
                    ..Default::default()
                },
                who,
            )
            .await?
        {
            ApplyResult::Compaction(mut r) => {
                if physical {
                    // As etcd: answer once the compacted revisions are
                    // deleted on this member. The raft thread applied the
                    // compaction already; the background compactor does
                    // the deletions, we only wait for its notification
                    // (no deadline: the client's own timeout cancels).
                    self.server.kv.wait_compacted(rev).await;
                }
                self.fill(&mut r.header);
                Ok(Response::new(r))
            }
            other => Err(unexpected(other)),
        }
    }
}
