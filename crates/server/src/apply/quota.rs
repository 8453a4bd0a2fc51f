//! The backend quota (etcd's `etcdserver/quota.go` and `v3rpc/quota.go`).
//!
//! Before a Put, a Txn or a LeaseGrant is proposed, the member checks that
//! `backend file size + cost < --quota-backend-bytes` (0: 2 GiB; negative:
//! no quota). Cost: 256 bytes + key + value per put (a txn costs its larger
//! branch), 64 bytes per lease. When the check fails the member raises the
//! NOSPACE alarm through raft (so every member caps its applier) and the
//! request fails with ResourceExhausted "etcdserver: mvcc: database space
//! exceeded". Reads, deletes and compactions still work; recover with
//! compact + defrag + `etcdctl alarm disarm`.
//!
//! The same check runs again at apply, on every member (etcd's
//! `quotaApplierV3`): a Put, Txn or LeaseGrant applied while *this*
//! member's backend is over its quota is still applied (every member
//! applies the same entries), but its result is NOSPACE and the member
//! raises NOSPACE for itself through raft ([`over_at_apply`], used by
//! the applier). So a follower whose backend is fuller (or whose
//! `--quota-backend-bytes` is smaller) stops the cluster's writes too.
//!
//! This module has the rules; the request-time check is the server's
//! (`server::kv`), the apply-time one the applier's.

use retcd_api::etcdserverpb::{
    alarm_request::AlarmAction, request_op, AlarmRequest, AlarmType, PutRequest, RequestOp,
    TxnRequest,
};
use retcd_api::retcdpb::internal_raft_request::Request;
use retcd_api::retcdpb::InternalRaftRequest;

/// Bytes a lease costs (etcd's `leaseOverhead`).
pub const LEASE_OVERHEAD: u64 = 64;
/// Bytes a key-value costs on top of its key and value (`kvOverhead`).
pub const KV_OVERHEAD: u64 = 256;

/// etcd's `costPut`.
pub fn cost_put(r: &PutRequest) -> u64 {
    KV_OVERHEAD + r.key.len() as u64 + r.value.len() as u64
}

fn cost_ops(ops: &[RequestOp]) -> u64 {
    ops.iter()
        .map(|op| match &op.request {
            Some(request_op::Request::RequestPut(p)) => cost_put(p),
            _ => 0,
        })
        .sum()
}

/// etcd's `costTxn`: the larger branch's puts (nested txns cost nothing, as
/// in etcd).
pub fn cost_txn(r: &TxnRequest) -> u64 {
    cost_ops(&r.success).max(cost_ops(&r.failure))
}

/// `size + cost < quota`; always true without a quota or for a free request.
pub fn fits(quota: Option<u64>, size: u64, cost: u64) -> bool {
    match quota {
        None => true,
        Some(_) if cost == 0 => true,
        Some(q) => size + cost < q,
    }
}

/// The apply-time check (etcd's `quotaApplierV3`): whether the request,
/// about to be applied on a member whose backend file is `size` bytes,
/// does not fit its quota. Put, Txn (its larger branch's puts) and
/// LeaseGrant cost something; everything else is free.
pub fn over_at_apply(quota: Option<u64>, size: u64, req: &InternalRaftRequest) -> bool {
    let cost = match &req.request {
        Some(Request::Put(p)) => cost_put(p),
        Some(Request::Txn(t)) => cost_txn(t),
        Some(Request::LeaseGrant(_)) => LEASE_OVERHEAD,
        _ => 0,
    };
    !fits(quota, size, cost)
}

/// The raft request raising NOSPACE for `member_id`.
pub fn nospace_alarm(member_id: u64) -> InternalRaftRequest {
    InternalRaftRequest {
        request: Some(Request::Alarm(AlarmRequest {
            action: AlarmAction::Activate as i32,
            member_id,
            alarm: AlarmType::Nospace as i32,
        })),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_cost_txn_takes_the_larger_branch() {
        let put = |k: &str, v: &str| RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: k.into(),
                value: v.into(),
                ..Default::default()
            })),
        };
        let t = TxnRequest {
            success: vec![put("a", "1")],
            failure: vec![put("bb", "22"), put("c", "")],
            ..Default::default()
        };
        assert_eq!(cost_txn(&t), 2 * KV_OVERHEAD + 5);
        assert_eq!(cost_txn(&TxnRequest::default()), 0);
    }

    #[test]
    fn test_over_at_apply() {
        let req = |r: Request| InternalRaftRequest {
            request: Some(r),
            ..Default::default()
        };
        let put = req(Request::Put(PutRequest {
            key: b"k".to_vec(),
            value: vec![0; 100],
            ..Default::default()
        }));
        let cost = KV_OVERHEAD + 101;
        assert!(!over_at_apply(Some(1000 + cost + 1), 1000, &put));
        assert!(over_at_apply(Some(1000 + cost), 1000, &put));
        assert!(!over_at_apply(None, u64::MAX / 2, &put));
        // deletes, compactions, alarms are free: never over
        let del = req(Request::DeleteRange(Default::default()));
        assert!(!over_at_apply(Some(1), 1000, &del));
        let grant = req(Request::LeaseGrant(Default::default()));
        assert!(over_at_apply(Some(1000 + LEASE_OVERHEAD), 1000, &grant));
        // a read-only txn costs nothing
        assert!(!over_at_apply(
            Some(1),
            1000,
            &req(Request::Txn(TxnRequest::default()))
        ));
    }
}
