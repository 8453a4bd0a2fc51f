//! The backend applier (etcd's `applierV3backend`): a request's MVCC and
//! lessor changes, in the batch's backend transaction.

use super::ApplyResult;
use crate::error::ServerError;
use retcd_api::etcdserverpb::{
    request_op, response_op, LeaseGrantResponse, LeaseRevokeResponse, PutRequest, ResponseHeader,
    TxnRequest, TxnResponse,
};
use retcd_api::retcdpb::internal_raft_request::Request;
use retcd_lease::Lessor;
use retcd_mvcc::WriteBatch;

/// A header with the batch's revision; the server fills in the rest.
pub(super) fn batch_header(batch: &WriteBatch<'_>) -> Option<ResponseHeader> {
    Some(ResponseHeader {
        revision: batch.revision(),
        ..Default::default()
    })
}

/// Applies a key-value or lease request. Auth, alarm and membership
/// requests are the other appliers' (an internal error here).
pub(super) fn apply(batch: &mut WriteBatch<'_>, lessor: &Lessor, req: Request) -> ApplyResult {
    let res = match req {
        Request::Put(r) => {
            let res = batch.put(&r, lessor);
            if res.is_ok() {
                attach_put(lessor, &r);
                crate::metrics::global().count_put(r.key.len(), r.value.len());
            }
            res.map(ApplyResult::Put)
        }
        Request::DeleteRange(r) => {
            crate::metrics::global().count_delete();
            batch.delete_range(&r).map(ApplyResult::DeleteRange)
        }
        Request::Txn(r) => {
            let res = batch.txn(&r, lessor);
            if let Ok(resp) = &res {
                attach_txn(lessor, &r, resp);
                crate::metrics::global().count_txn(&r, resp.succeeded);
            }
            res.map(ApplyResult::Txn)
        }
        Request::Compaction(r) => batch
            .compact(r.revision, r.physical)
            .map(ApplyResult::Compaction),
        Request::Range(r) => {
            crate::metrics::global().count_ranges(1);
            batch.range(&r).map(ApplyResult::Range)
        }
        Request::LeaseGrant(r) => {
            return match lessor.grant(super::backend_txn(batch), r.id, r.ttl) {
                Ok(ttl) => {
                    let m = crate::metrics::global();
                    m.lease_granted.inc();
                    m.lease_ttl.observe(ttl as f64);
                    ApplyResult::LeaseGrant(LeaseGrantResponse {
                        header: batch_header(batch),
                        id: r.id,
                        ttl,
                        error: String::new(),
                    })
                }
                Err(e) => ApplyResult::Err(e.into()),
            };
        }
        Request::LeaseRevoke(r) => {
            // opened here: a backend that cannot stops the member
            super::backend_txn(batch);
            return match lessor.revoke(batch, r.id) {
                Ok(()) => {
                    crate::metrics::global().lease_revoked.inc();
                    ApplyResult::LeaseRevoke(LeaseRevokeResponse {
                        header: batch_header(batch),
                    })
                }
                Err(e) => ApplyResult::Err(e.into()),
            };
        }
        Request::LeaseCheckpoint(r) => {
            let mut res = ApplyResult::Empty;
            let txn = super::backend_txn(batch);
            for cp in r.checkpoints {
                if let Err(e) = lessor.checkpoint(txn, cp.id, cp.remaining_ttl) {
                    res = ApplyResult::Err(e.into());
                }
            }
            return res;
        }
        Request::Alarm(_) | Request::Auth(_) | Request::MemberAttributes(_) => {
            return ApplyResult::Err(ServerError::internal(
                "retcd: request reached the backend applier",
            ))
        }
    };
    res.unwrap_or_else(|e| ApplyResult::Err(ServerError::Mvcc(e)))
}

/// Points the keys of applied puts at their leases at once, as etcd's put
/// does, so a revoke later in the same batch finds them. (Attachments are
/// also derived from the committed events in `Applier::after_commit`,
/// which covers deletes; both are idempotent.)
fn attach_put(lessor: &Lessor, req: &PutRequest) {
    if !req.ignore_lease {
        lessor.set_key_lease(&req.key, req.lease);
    }
}

/// The puts a txn executed: the branch its compares chose, recursively.
fn attach_txn(lessor: &Lessor, req: &TxnRequest, resp: &TxnResponse) {
    let ops = if resp.succeeded {
        &req.success
    } else {
        &req.failure
    };
    for (op, r) in ops.iter().zip(&resp.responses) {
        match (&op.request, &r.response) {
            (Some(request_op::Request::RequestPut(p)), _) => attach_put(lessor, p),
            (
                Some(request_op::Request::RequestTxn(t)),
                Some(response_op::Response::ResponseTxn(tr)),
            ) => attach_txn(lessor, t, tr),
            _ => {}
        }
    }
}
