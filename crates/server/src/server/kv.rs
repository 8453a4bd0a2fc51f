//! The key-value API (etcd's `RaftKV`): Range, Put, DeleteRange, Txn,
//! Compact, each on behalf of a caller (`who`; None without auth).
//!
//! Order of checks, as etcd: the quota (`quotaKVServer`) before the request
//! checks (`v3rpc/key.go`); writes go through raft and the apply checks the
//! caller's permissions; reads (and txns that write nothing) are served
//! from the local store after a ReadIndex unless serializable, with the
//! permissions checked here. Compact needs the root role.

use super::{unexpected, validate, EtcdServer};
use crate::apply::quota::{self, cost_put, cost_txn};
use crate::apply::ApplyResult;
use crate::auth::Credentials;
use crate::error::ServerError;
use retcd_api::etcdserverpb::{
    AlarmType, CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse,
    PutRequest, PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};
use retcd_api::retcdpb::internal_raft_request::Request;

/// A range this large (or unbounded) is read on a blocking thread: it may
/// scan and copy many values.
const INLINE_RANGE_LIMIT: i64 = 1000;

impl EtcdServer {
    pub async fn range(
        &self,
        req: RangeRequest,
        creds: &Credentials,
    ) -> Result<RangeResponse, ServerError> {
        // The rest of the learner rule is the client port's guard.
        if !req.serializable && self.is_learner() {
            return Err(ServerError::NotSupportedForLearner);
        }
        validate::check_range(&req)?;
        if !req.serializable {
            self.linearizable_read_notify().await?;
        }
        let who = self.who(creds)?;
        self.auth
            .check_range(who.as_ref(), &req.key, &req.range_end)?;
        let m = self.metrics;
        m.count_ranges(1);
        m.db_open_read_transactions.inc();
        let _open = scopeguard(|| m.db_open_read_transactions.dec());
        let small = req.range_end.is_empty()
            || req.count_only
            || (req.limit > 0 && req.limit <= INLINE_RANGE_LIMIT);
        let mut resp = if small {
            self.kv.range(&req)?
        } else {
            let kv = self.kv.clone();
            tokio::task::spawn_blocking(move || kv.range(&req))
                .await
                .map_err(|e| ServerError::internal_from("retcd: range task failed", e))??
        };
        self.fill(&mut resp.header);
        Ok(resp)
    }

    pub async fn put(
        &self,
        req: PutRequest,
        creds: &Credentials,
    ) -> Result<PutResponse, ServerError> {
        self.check_quota(cost_put(&req)).await?;
        validate::check_put(&req)?;
        let who = self.who(creds)?;
        match self.propose_as(Request::Put(req), who).await? {
            ApplyResult::Put(mut r) => {
                self.fill(&mut r.header);
                Ok(r)
            }
            other => Err(unexpected(other)),
        }
    }

    pub async fn delete_range(
        &self,
        req: DeleteRangeRequest,
        creds: &Credentials,
    ) -> Result<DeleteRangeResponse, ServerError> {
        validate::check_delete(&req)?;
        let who = self.who(creds)?;
        match self.propose_as(Request::DeleteRange(req), who).await? {
            ApplyResult::DeleteRange(mut r) => {
                self.fill(&mut r.header);
                Ok(r)
            }
            other => Err(unexpected(other)),
        }
    }

    pub async fn txn(
        &self,
        req: TxnRequest,
        creds: &Credentials,
    ) -> Result<TxnResponse, ServerError> {
        self.check_quota(cost_txn(&req)).await?;
        validate::check_txn(&req, self.cfg.max_txn_ops as usize)?;
        // As etcd: a txn that writes nothing is served from the local store
        // (after a ReadIndex unless every range is serializable).
        if retcd_mvcc::is_txn_read_only(&req) {
            if !retcd_mvcc::is_txn_serializable(&req) {
                self.linearizable_read_notify().await?;
            }
            let who = self.who(creds)?;
            if self.auth.is_enabled() {
                crate::apply::check_txn(&self.auth, &self.lessor, who.as_ref(), &req)?;
            }
            let m = self.metrics;
            m.count_txn(&req, true);
            m.db_open_read_transactions.inc();
            let _open = scopeguard(|| m.db_open_read_transactions.dec());
            let mut resp = self.kv.read_txn(&req)?;
            self.fill(&mut resp.header);
            return Ok(resp);
        }
        let who = self.who(creds)?;
        match self.propose_as(Request::Txn(req), who).await? {
            ApplyResult::Txn(mut r) => {
                self.fill(&mut r.header);
                Ok(r)
            }
            other => Err(unexpected(other)),
        }
    }

    pub async fn compact(
        &self,
        req: CompactionRequest,
        creds: &Credentials,
    ) -> Result<CompactionResponse, ServerError> {
        // root only (etcd 3.5.28+, CVE-2026-33413), checked before raft
        let who = self.who(creds)?;
        self.require_root(who.as_ref())?;
        let (rev, physical) = (req.revision, req.physical);
        match self.propose_as(Request::Compaction(req), who).await? {
            ApplyResult::Compaction(mut r) => {
                if physical {
                    // As etcd: answer once the compacted revisions are
                    // deleted on this member. The raft thread applied the
                    // compaction already; the background compactor does
                    // the deletions, we only wait for its notification
                    // (no deadline: the client's own timeout cancels).
                    self.kv.wait_compacted(rev).await;
                }
                self.fill(&mut r.header);
                Ok(r)
            }
            other => Err(unexpected(other)),
        }
    }

    /// The quota check before proposing a request that costs `cost` bytes
    /// (etcd's `backendQuota.Available`): on failure, raises NOSPACE for
    /// this member and answers `NoSpace`.
    pub(super) async fn check_quota(&self, cost: u64) -> Result<(), ServerError> {
        let q = (self.cfg.quota_backend_bytes >= 0).then(|| self.cfg.quota_bytes());
        if quota::fits(q, self.backend.size_cached(), cost) {
            return Ok(());
        }
        if !self.alarms.has(AlarmType::Nospace) {
            let alarm = quota::nospace_alarm(self.member_id);
            if let Err(e) = self.proposer.propose(alarm).await {
                tracing::warn!(error = %e, "failed to raise the NOSPACE alarm");
            }
        }
        Err(ServerError::NoSpace)
    }
}

/// Runs `f` when dropped (an open-read gauge going back down on every
/// return path).
fn scopeguard<F: FnOnce()>(f: F) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f()
            }
        }
    }
    Guard(Some(f))
}
