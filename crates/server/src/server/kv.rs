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
use prost::Message;
use retcd_api::etcdserverpb::{
    request_op, AlarmType, CompactionRequest, CompactionResponse, DeleteRangeRequest,
    DeleteRangeResponse, PutRequest, PutResponse, RangeRequest, RangeResponse, TxnRequest,
    TxnResponse,
};
use retcd_api::retcdpb::internal_raft_request::Request;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Keys in a stream's first chunk (etcd's `initialStreamChunkLimit`).
const FIRST_CHUNK_KEYS: i64 = 10;

/// etcd's `adjustChunkLimit`: double a chunk's key limit while chunks come
/// out under half the byte target, halve it while they are over twice it.
fn next_chunk_limit(limit: i64, size: usize, target: usize) -> i64 {
    if size < target / 2 {
        limit.saturating_mul(2)
    } else if size > target.saturating_mul(2) {
        (limit / 2).max(1)
    } else {
        limit
    }
}

/// A range this large (or unbounded) is read on a blocking thread: it may
/// scan and copy many values.
const INLINE_RANGE_LIMIT: i64 = 1000;

/// One key, a count, or a small limit: read on the runtime and built whole.
fn is_small_range(req: &RangeRequest) -> bool {
    req.range_end.is_empty() || req.count_only || (req.limit > 0 && req.limit <= INLINE_RANGE_LIMIT)
}

/// Bytes of a streamed unary Range's first rows kept from its sizing pass
/// (so sent without a second read). The pass reads only rows whose size the
/// index does not know (keys read at an older revision than their newest);
/// a Range at the current revision is sized from the index and read once.
const READ_ONCE_BYTES: usize = 4 << 20;

/// A Range's answer as the gRPC route writes it.
pub enum RangeReply {
    /// The whole response.
    Built(RangeResponse),
    /// The response's header, `more` and `count`, and its kvs still to be
    /// read from the pinned snapshot. `open` keeps the read counted in
    /// `etcd_debugging_mvcc_db_open_read_transactions` until it is dropped.
    /// `small`: a range of one key or a small limit, whose rows are read
    /// on the runtime and written whole; else they are read a piece at a
    /// time on a blocking thread.
    Encoded {
        header: retcd_api::etcdserverpb::ResponseHeader,
        range: retcd_mvcc::EncodedRange,
        open: OpenRead,
        small: bool,
    },
}

/// Counts a read in `etcd_debugging_mvcc_db_open_read_transactions` while
/// it lives.
pub struct OpenRead(&'static crate::metrics::Metrics);

impl OpenRead {
    fn new(m: &'static crate::metrics::Metrics) -> OpenRead {
        m.db_open_read_transactions.inc();
        OpenRead(m)
    }
}

impl Drop for OpenRead {
    fn drop(&mut self) {
        self.0.db_open_read_transactions.dec();
    }
}

impl EtcdServer {
    pub async fn range(
        &self,
        req: RangeRequest,
        creds: &Credentials,
    ) -> Result<RangeResponse, ServerError> {
        self.range_checks(&req, creds).await?;
        self.range_built(req).await
    }

    /// A Range for the gRPC route, which writes the response itself: a
    /// plain range ([`retcd_mvcc::is_plain_range`]) comes back
    /// [`RangeReply::Encoded`], its kvs to be written from the stored rows
    /// (each row is a kv's encoding); any other is built whole as
    /// [`EtcdServer::range`] builds it. Same checks, errors and answer
    /// either way. A small plain range is sized here on the runtime (from
    /// the index; rows read at an older revision than their key's newest
    /// are read for it), a long one on a blocking thread. Built, each kv
    /// was decoded into its fields and encoded again (docs/design.md).
    pub async fn range_reply(
        &self,
        req: RangeRequest,
        creds: &Credentials,
    ) -> Result<RangeReply, ServerError> {
        self.range_checks(&req, creds).await?;
        if !retcd_mvcc::is_plain_range(&req) {
            return Ok(RangeReply::Built(self.range_built(req).await?));
        }
        let open = OpenRead::new(self.metrics);
        if is_small_range(&req) {
            let range = self.kv.range_encoded(&req, 0)?;
            return Ok(RangeReply::Encoded {
                header: self.header(range.header_rev),
                range,
                open,
                small: true,
            });
        }
        let kv = self.kv.clone();
        let range = tokio::task::spawn_blocking(move || kv.range_encoded(&req, READ_ONCE_BYTES))
            .await
            .map_err(|e| ServerError::internal_from("retcd: range task failed", e))??;
        Ok(RangeReply::Encoded {
            header: self.header(range.header_rev),
            range,
            open,
            small: false,
        })
    }

    /// What every Range passes before it is read: the learner rule, the
    /// request's checks, the ReadIndex wait (unless serializable), the
    /// caller's permission; then it is counted.
    async fn range_checks(
        &self,
        req: &RangeRequest,
        creds: &Credentials,
    ) -> Result<(), ServerError> {
        // The rest of the learner rule is the client port's guard.
        if !req.serializable && self.is_learner() {
            return Err(ServerError::NotSupportedForLearner);
        }
        validate::check_range(req)?;
        if !req.serializable {
            self.linearizable_read_notify().await?;
        }
        let who = self.who(creds)?;
        self.auth
            .check_range(who.as_ref(), &req.key, &req.range_end)?;
        self.metrics.count_ranges(1);
        Ok(())
    }

    /// Reads a checked Range and builds its response.
    async fn range_built(&self, req: RangeRequest) -> Result<RangeResponse, ServerError> {
        let _open = OpenRead::new(self.metrics);
        let mut resp = if is_small_range(&req) {
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

    /// etcd 3.7's `RangeStream`: the range in chunks read at one pinned
    /// revision, each a fresh read of at most a chunk's keys, so a list of
    /// any size holds about one chunk (plus the one being sent) in memory.
    /// Checks are Range's, done once before the first chunk; custom sort
    /// orders and revision filters are Unimplemented, as in etcd. Chunks
    /// start at 10 keys and double or halve toward `--max-request-bytes`.
    /// Non-final chunks carry only `kvs`; the final one has the header
    /// (revision = the store's at the first chunk), `more` and `count`, so
    /// merging all gives Range's answer. A compaction past the pinned
    /// revision fails the next chunk with `Compacted`.
    pub async fn range_stream(
        self: &Arc<Self>,
        mut req: RangeRequest,
        creds: &Credentials,
    ) -> Result<mpsc::Receiver<Result<RangeResponse, ServerError>>, ServerError> {
        validate::check_range(&req)?;
        if !retcd_mvcc::is_default_ordering(&req) {
            return Err(ServerError::Unimplemented(
                "RangeStream does not support custom sort orders",
            ));
        }
        if retcd_mvcc::has_revision_filter(&req) {
            return Err(ServerError::Unimplemented(
                "RangeStream does not support revision filters",
            ));
        }
        if !req.serializable {
            self.linearizable_read_notify().await?;
        }
        let who = self.who(creds)?;
        self.auth
            .check_range(who.as_ref(), &req.key, &req.range_end)?;
        self.metrics.count_ranges(1);
        // One chunk waits here while the next is read: the stream holds at
        // most three (this one, the one tonic encodes, the one being read).
        let (tx, rx) = mpsc::channel(1);
        let srv = self.clone();
        let target = self.cfg.max_request_bytes.max(1) as usize;
        tokio::task::spawn_blocking(move || {
            if req.count_only {
                let r = srv.kv.range(&req).map_err(ServerError::from).map(|mut r| {
                    srv.fill(&mut r.header);
                    r
                });
                let _ = tx.blocking_send(r);
                return;
            }
            let total_limit = if req.limit > 0 { req.limit } else { i64::MAX };
            let mut limit = FIRST_CHUNK_KEYS.min(total_limit);
            let (mut sent, mut header_rev) = (0i64, 0i64);
            loop {
                req.limit = limit;
                let chunk = match srv.kv.range_chunk(&req) {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = tx.blocking_send(Err(e.into()));
                        return;
                    }
                };
                if header_rev == 0 {
                    header_rev = chunk.header.as_ref().map_or(0, |h| h.revision);
                    if req.revision <= 0 {
                        req.revision = header_rev;
                    }
                }
                sent += chunk.kvs.len() as i64;
                let more = chunk.more;
                let done = !more || sent >= total_limit;
                if more {
                    if let Some(last) = chunk.kvs.last() {
                        let mut next = last.key.to_vec();
                        next.push(0);
                        req.key = next;
                    }
                }
                let mut out = RangeResponse {
                    kvs: chunk.kvs,
                    ..Default::default()
                };
                let size = out.encoded_len();
                if done {
                    let mut count = sent;
                    if more {
                        let rest = RangeRequest {
                            count_only: true,
                            limit: 0,
                            ..req.clone()
                        };
                        match srv.kv.range(&rest) {
                            Ok(r) => count += r.count,
                            Err(e) => {
                                let _ = tx.blocking_send(Err(e.into()));
                                return;
                            }
                        }
                    }
                    out.header = Some(srv.header(header_rev));
                    out.more = more;
                    out.count = count;
                }
                if tx.blocking_send(Ok(out)).is_err() || done {
                    return; // the client went away, or all sent
                }
                limit = next_chunk_limit(limit, size, target).min(total_limit - sent);
            }
        });
        Ok(rx)
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
        // As etcd (`isTxnReadonly`): a txn of Ranges only is served from
        // the local store, after a ReadIndex unless every one is
        // serializable (`isTxnSerializable`). A nested Txn counts as a
        // write there: it goes through raft, so a follower never answers
        // it from a state older than the last write (it did when nested
        // Txns were looked into: one of no ranges was "serializable").
        let ops = || {
            req.success
                .iter()
                .chain(&req.failure)
                .map(|o| o.request.as_ref())
        };
        let only_ranges = ops().all(|r| matches!(r, Some(request_op::Request::RequestRange(_))));
        if only_ranges {
            let serializable = ops()
                .all(|r| matches!(r, Some(request_op::Request::RequestRange(r)) if r.serializable));
            if !serializable {
                self.linearizable_read_notify().await?;
            }
            let who = self.who(creds)?;
            if self.auth.is_enabled() {
                crate::apply::check_txn(&self.auth, &self.lessor, who.as_ref(), &req)?;
            }
            self.metrics.count_txn(&req, true);
            let _open = OpenRead::new(self.metrics);
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
        // the file's size and the committed rows still in memory (the
        // write-out lags up to 100 ms: 100 kB puts went 9 MB past a 64 MiB
        // quota counting the file alone)
        let size = self.backend.size_cached() + self.kv.unwritten_bytes();
        if quota::fits(q, size, cost) {
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
