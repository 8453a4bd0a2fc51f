//! Committed entry → state machine. Runs on the raft thread, in log order,
//! inside one MVCC write batch per Ready.

use crate::error::ServerError;
use retcd_api::etcdserverpb::{
    CompactionResponse, DeleteRangeResponse, PutResponse, RangeResponse, TxnResponse,
};
use retcd_api::retcdpb::InternalRaftRequest;
use retcd_mvcc::{NoLeases, WriteBatch};

/// The outcome of applying one request, handed to the proposer.
#[derive(Debug)]
pub enum ApplyResult {
    Range(RangeResponse),
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
    Compaction(CompactionResponse),
    /// Applied; nothing to return (publish).
    Empty,
    /// The request was applied and failed deterministically (on every member).
    Err(ServerError),
}

pub fn apply_request(batch: &mut WriteBatch<'_>, req: InternalRaftRequest) -> ApplyResult {
    // Leases arrive with the lease issue; until then no lease exists, so a
    // put with a lease gets etcd's "requested lease not found".
    let leases = NoLeases;
    let res = if let Some(r) = req.put {
        batch.put(&r, &leases).map(ApplyResult::Put)
    } else if let Some(r) = req.delete_range {
        batch.delete_range(&r).map(ApplyResult::DeleteRange)
    } else if let Some(r) = req.txn {
        batch.txn(&r, &leases).map(ApplyResult::Txn)
    } else if let Some(r) = req.compaction {
        batch
            .compact(r.revision, r.physical)
            .map(ApplyResult::Compaction)
    } else if let Some(r) = req.range {
        batch.range(&r).map(ApplyResult::Range)
    } else {
        return ApplyResult::Err(ServerError::Internal(
            "retcd: unsupported request in raft entry".into(),
        ));
    };
    res.unwrap_or_else(|e| ApplyResult::Err(ServerError::Mvcc(e)))
}
