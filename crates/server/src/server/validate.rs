//! Request checks done before proposing, with etcd's errors (etcd's
//! v3rpc/key.go): empty keys, unknown sort options, ignore_value /
//! ignore_lease misuse, too many txn operations, ops without a request,
//! and puts/deletes that overlap within one txn.

use crate::error::ServerError;
use retcd_api::etcdserverpb::range_request::{SortOrder, SortTarget};
use retcd_api::etcdserverpb::{
    request_op::Request as Op, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use std::collections::HashSet;

/// etcd 3.6's checkRangeRequest: a key, and a sort order and target the
/// enums have (etcd 3.4 and 3.5 crash on an unknown target with an order).
pub fn check_range(r: &RangeRequest) -> Result<(), ServerError> {
    if r.key.is_empty() {
        return Err(ServerError::EmptyKey);
    }
    if SortOrder::try_from(r.sort_order).is_err() || SortTarget::try_from(r.sort_target).is_err() {
        return Err(ServerError::InvalidSortOption);
    }
    Ok(())
}

pub fn check_put(r: &PutRequest) -> Result<(), ServerError> {
    if r.key.is_empty() {
        return Err(ServerError::EmptyKey);
    }
    if r.ignore_value && !r.value.is_empty() {
        return Err(ServerError::ValueProvided);
    }
    if r.ignore_lease && r.lease != 0 {
        return Err(ServerError::LeaseProvided);
    }
    Ok(())
}

pub fn check_delete(r: &DeleteRangeRequest) -> Result<(), ServerError> {
    if r.key.is_empty() {
        return Err(ServerError::EmptyKey);
    }
    Ok(())
}

/// How deeply txns may nest. etcd's only bound is `--max-txn-ops` shrinking
/// at each level; retcd also stops well below prost's decoding recursion
/// limit (100), so that every accepted txn still decodes inside the raft
/// entry that wraps it, and the checks that recurse stay shallow.
pub const MAX_TXN_DEPTH: usize = 32;

pub fn check_txn(r: &TxnRequest, max_txn_ops: usize) -> Result<(), ServerError> {
    if txn_depth(r) > MAX_TXN_DEPTH {
        return Err(ServerError::TooManyOps);
    }
    check_txn_ops(r, max_txn_ops)?;
    for ops in [&r.success, &r.failure] {
        if !writes_cannot_collide(ops) {
            check_intervals(ops)?;
        }
    }
    Ok(())
}

/// No nested txn and at most one put or delete: nothing for
/// [`check_intervals`] to find, and no key set to build (a guarded
/// update, kube-apiserver's every write, is one put).
fn writes_cannot_collide(reqs: &[RequestOp]) -> bool {
    let mut writes = 0;
    for op in reqs {
        match &op.request {
            Some(Op::RequestTxn(_)) => return false,
            Some(Op::RequestPut(_) | Op::RequestDeleteRange(_)) => writes += 1,
            _ => {}
        }
    }
    writes <= 1
}

fn check_txn_ops(r: &TxnRequest, max_txn_ops: usize) -> Result<(), ServerError> {
    let opc = r.compare.len().max(r.success.len()).max(r.failure.len());
    if opc > max_txn_ops {
        return Err(ServerError::TooManyOps);
    }
    if r.compare.iter().any(|c| c.key.is_empty()) {
        return Err(ServerError::EmptyKey);
    }
    for op in r.success.iter().chain(r.failure.iter()) {
        check_op(op, max_txn_ops - opc)?;
    }
    Ok(())
}

/// 1 for a txn without nested txns.
fn txn_depth(r: &TxnRequest) -> usize {
    1 + r
        .success
        .iter()
        .chain(&r.failure)
        .filter_map(|op| match &op.request {
            Some(Op::RequestTxn(t)) => Some(txn_depth(t)),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

fn check_op(op: &RequestOp, max_txn_ops: usize) -> Result<(), ServerError> {
    match &op.request {
        Some(Op::RequestRange(r)) => check_range(r),
        Some(Op::RequestPut(r)) => check_put(r),
        Some(Op::RequestDeleteRange(r)) => check_delete(r),
        Some(Op::RequestTxn(t)) => check_txn_ops(t, max_txn_ops),
        // an op with no request: etcd's checkRequestOp answers so
        None => Err(ServerError::Mvcc(retcd_mvcc::MvccError::KeyNotFound)),
    }
}

/// A deleted interval: `[key, end)`, or the single key when `end` is None.
/// The end is compared as the bytes it is, as etcd's interval tree does: a
/// from-key delete (`range_end` "\0") covers no key here, so a Txn may put
/// a key and delete from it to the end (etcd applies both).
#[derive(Clone)]
struct Interval {
    key: Vec<u8>,
    end: Option<Vec<u8>>,
}

impl Interval {
    fn contains(&self, k: &[u8]) -> bool {
        match &self.end {
            None => k == self.key.as_slice(),
            Some(end) => k >= self.key.as_slice() && k < end.as_slice(),
        }
    }
}

fn hits(dels: &[Interval], k: &[u8]) -> bool {
    dels.iter().any(|d| d.contains(k))
}

/// etcd's checkIntervals: within one list of ops (recursively through
/// nested txns) no key may be put twice, nor put and deleted; a key put in
/// both the then and else branch of a nested txn is fine (only one runs).
fn check_intervals(reqs: &[RequestOp]) -> Result<(HashSet<Vec<u8>>, Vec<Interval>), ServerError> {
    let mut dels: Vec<Interval> = Vec::new();
    for op in reqs {
        if let Some(Op::RequestDeleteRange(d)) = &op.request {
            dels.push(Interval {
                key: d.key.clone(),
                end: (!d.range_end.is_empty()).then(|| d.range_end.clone()),
            });
        }
    }
    let mut puts: HashSet<Vec<u8>> = HashSet::new();
    for op in reqs {
        let Some(Op::RequestTxn(t)) = &op.request else {
            continue;
        };
        let (puts_then, dels_then) = check_intervals(&t.success)?;
        let (puts_else, dels_else) = check_intervals(&t.failure)?;
        for k in &puts_then {
            if puts.contains(k) || hits(&dels, k) {
                return Err(ServerError::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        for k in &puts_else {
            if puts.contains(k) && !puts_then.contains(k) {
                return Err(ServerError::DuplicateKey);
            }
            if hits(&dels, k) {
                return Err(ServerError::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        dels.extend(dels_then);
        dels.extend(dels_else);
    }
    for op in reqs {
        let Some(Op::RequestPut(p)) = &op.request else {
            continue;
        };
        if puts.contains(&p.key) || hits(&dels, &p.key) {
            return Err(ServerError::DuplicateKey);
        }
        puts.insert(p.key.clone());
    }
    Ok((puts, dels))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(k: &str) -> RequestOp {
        RequestOp {
            request: Some(Op::RequestPut(PutRequest {
                key: k.into(),
                ..Default::default()
            })),
        }
    }
    fn del(k: &str, end: &str) -> RequestOp {
        RequestOp {
            request: Some(Op::RequestDeleteRange(DeleteRangeRequest {
                key: k.into(),
                range_end: end.into(),
                ..Default::default()
            })),
        }
    }

    #[test]
    fn test_txn_duplicate_put_rejected() {
        let t = TxnRequest {
            success: vec![put("a"), put("a")],
            ..Default::default()
        };
        assert!(matches!(check_txn(&t, 128), Err(ServerError::DuplicateKey)));
    }

    #[test]
    fn test_txn_one_write_per_branch_needs_no_interval_check() {
        assert!(writes_cannot_collide(&[put("a")]));
        assert!(writes_cannot_collide(&[del("a", "c")]));
        assert!(!writes_cannot_collide(&[put("a"), put("b")]));
        assert!(!writes_cannot_collide(&[del("a", "c"), put("b")]));
        let nested = RequestOp {
            request: Some(Op::RequestTxn(TxnRequest::default())),
        };
        assert!(!writes_cannot_collide(&[nested]));
        // a put in each branch is fine; a duplicate in the other branch
        // of the same txn is still found
        let t = TxnRequest {
            success: vec![put("a")],
            failure: vec![put("a")],
            ..Default::default()
        };
        assert!(check_txn(&t, 128).is_ok());
        let t = TxnRequest {
            success: vec![put("a")],
            failure: vec![put("b"), put("b")],
            ..Default::default()
        };
        assert!(matches!(check_txn(&t, 128), Err(ServerError::DuplicateKey)));
        // and inside a nested txn
        let t = TxnRequest {
            success: vec![RequestOp {
                request: Some(Op::RequestTxn(TxnRequest {
                    success: vec![put("x"), put("x")],
                    ..Default::default()
                })),
            }],
            ..Default::default()
        };
        assert!(matches!(check_txn(&t, 128), Err(ServerError::DuplicateKey)));
    }

    #[test]
    fn test_txn_put_inside_deleted_range_rejected() {
        let t = TxnRequest {
            success: vec![del("a", "c"), put("b")],
            ..Default::default()
        };
        assert!(matches!(check_txn(&t, 128), Err(ServerError::DuplicateKey)));
        let ok = TxnRequest {
            success: vec![del("a", "c"), put("c")],
            ..Default::default()
        };
        assert!(check_txn(&ok, 128).is_ok());
    }

    #[test]
    fn test_range_sort_options_must_be_known() {
        let r = |order: i32, target: i32| RangeRequest {
            key: b"k".to_vec(),
            sort_order: order,
            sort_target: target,
            ..Default::default()
        };
        for (order, target) in [(0, 0), (2, 4), (1, 1), (0, 3)] {
            assert!(check_range(&r(order, target)).is_ok());
        }
        for (order, target) in [(3, 0), (0, 5), (-1, 0), (0, 99)] {
            assert!(matches!(
                check_range(&r(order, target)),
                Err(ServerError::InvalidSortOption)
            ));
        }
        // the key first, as etcd
        assert!(matches!(
            check_range(&RangeRequest {
                sort_order: 9,
                ..Default::default()
            }),
            Err(ServerError::EmptyKey)
        ));
    }

    #[test]
    fn test_txn_op_without_request_is_refused() {
        for (success, failure) in [
            (vec![RequestOp { request: None }], vec![]),
            (vec![], vec![put("a"), RequestOp { request: None }]),
        ] {
            let t = TxnRequest {
                success,
                failure,
                ..Default::default()
            };
            let e = check_txn(&t, 128).unwrap_err();
            assert_eq!(e.to_string(), "etcdserver: key not found");
        }
    }

    #[test]
    fn test_txn_from_key_delete_covers_no_put() {
        // etcd compares the end "\0" as a string: the interval [a, "\0") is
        // empty, so both ops run (the delete then removes the put key)
        for ops in [
            vec![put("b"), del("a", "\0")],
            vec![del("a", "\0"), put("a")],
        ] {
            let t = TxnRequest {
                success: ops,
                ..Default::default()
            };
            assert!(check_txn(&t, 128).is_ok());
        }
    }

    #[test]
    fn test_txn_then_else_same_key_allowed() {
        let nested = TxnRequest {
            success: vec![put("k")],
            failure: vec![put("k")],
            ..Default::default()
        };
        let t = TxnRequest {
            success: vec![RequestOp {
                request: Some(Op::RequestTxn(nested)),
            }],
            ..Default::default()
        };
        assert!(check_txn(&t, 128).is_ok());
    }

    fn nested(depth: usize) -> TxnRequest {
        let mut t = TxnRequest {
            success: vec![put("k")],
            ..Default::default()
        };
        for _ in 1..depth {
            t = TxnRequest {
                success: vec![RequestOp {
                    request: Some(Op::RequestTxn(t)),
                }],
                ..Default::default()
            };
        }
        t
    }

    #[test]
    fn test_txn_nesting_is_bounded() {
        assert_eq!(txn_depth(&nested(1)), 1);
        assert!(check_txn(&nested(MAX_TXN_DEPTH), 128).is_ok());
        assert!(matches!(
            check_txn(&nested(MAX_TXN_DEPTH + 1), 128),
            Err(ServerError::TooManyOps)
        ));
        // the deepest accepted txn still decodes inside a raft entry
        use prost::Message;
        let req = retcd_api::retcdpb::InternalRaftRequest {
            request: Some(retcd_api::retcdpb::internal_raft_request::Request::Txn(
                nested(MAX_TXN_DEPTH),
            )),
            ..Default::default()
        };
        let bytes = req.encode_to_vec();
        assert!(retcd_api::retcdpb::InternalRaftRequest::decode(&bytes[..]).is_ok());
    }

    #[test]
    fn test_txn_too_many_ops() {
        let t = TxnRequest {
            success: (0..5).map(|i| put(&format!("k{i}"))).collect(),
            ..Default::default()
        };
        assert!(matches!(check_txn(&t, 4), Err(ServerError::TooManyOps)));
        assert!(check_txn(&t, 5).is_ok());
    }
}
