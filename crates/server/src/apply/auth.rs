//! The auth applier (etcd's `authApplierV3`): the proposer's permissions
//! for what a request reads and writes, checked against the auth store as
//! of the entry (so every member decides the same).

use crate::auth::{AuthError, AuthInfo, AuthStore};
use retcd_api::etcdserverpb::{request_op, TxnRequest};
use retcd_api::retcdpb::internal_raft_request::Request;
use retcd_api::retcdpb::InternalRaftRequest;
use retcd_lease::Lessor;

pub(super) fn check_permissions(
    auth: &AuthStore,
    lessor: &Lessor,
    req: &InternalRaftRequest,
) -> Result<(), AuthError> {
    let who = AuthInfo {
        username: req.username.clone(),
        revision: req.auth_revision,
    };
    let who = Some(&who);
    let lease_keys_writable = |id| lease_keys_writable(auth, lessor, who, id);
    let Some(request) = &req.request else {
        return Ok(());
    };
    match request {
        Request::Auth(a) => {
            use retcd_api::retcdpb::auth_request::Op;
            if !matches!(a.op, Some(Op::Authenticate(_))) {
                auth.check_admin(who)?;
            }
        }
        Request::Put(r) => check_put(auth, lessor, who, r)?,
        Request::DeleteRange(r) => {
            auth.check_write(who, &r.key, &r.range_end)?;
            if r.prev_kv {
                auth.check_range(who, &r.key, &r.range_end)?;
            }
        }
        Request::Txn(r) => check_txn(auth, lessor, who, r)?,
        Request::Range(r) => auth.check_range(who, &r.key, &r.range_end)?,
        Request::LeaseRevoke(r) => lease_keys_writable(r.id)?,
        // Not checked at apply: compaction and lease grant (any user, as
        // etcd), alarms (checked where they are proposed), checkpoints and
        // publishes (proposed by the server itself).
        Request::Compaction(_)
        | Request::LeaseGrant(_)
        | Request::LeaseCheckpoint(_)
        | Request::Alarm(_)
        | Request::MemberAttributes(_) => {}
    }
    Ok(())
}

/// A lease's keys must all be writable by whoever revokes it, keeps it
/// alive, or attaches another key to it (etcd's `checkLeasePuts`; the
/// root role passes).
pub fn lease_keys_writable(
    auth: &AuthStore,
    lessor: &Lessor,
    who: Option<&AuthInfo>,
    id: i64,
) -> Result<(), AuthError> {
    if let Some(l) = lessor.lookup(id) {
        for k in &l.keys {
            auth.check_write(who, k, b"")?;
        }
    }
    Ok(())
}

/// etcd's `checkPutAuth`: WRITE on the key, the lease's keys writable, and
/// READ on the key for `prev_kv`.
fn check_put(
    auth: &AuthStore,
    lessor: &Lessor,
    who: Option<&AuthInfo>,
    r: &retcd_api::etcdserverpb::PutRequest,
) -> Result<(), AuthError> {
    auth.check_write(who, &r.key, b"")?;
    if r.lease != 0 {
        lease_keys_writable(auth, lessor, who, r.lease)?;
    }
    if r.prev_kv {
        auth.check_range(who, &r.key, b"")?;
    }
    Ok(())
}

/// A txn's compares, and the requests of both branches (nested txns
/// included; a put as a plain put, its lease's keys too: etcd 3.5.28 /
/// 3.5.30).
pub fn check_txn(
    auth: &AuthStore,
    lessor: &Lessor,
    who: Option<&AuthInfo>,
    t: &TxnRequest,
) -> Result<(), AuthError> {
    for c in &t.compare {
        auth.check_range(who, &c.key, &c.range_end)?;
    }
    for op in t.success.iter().chain(&t.failure) {
        match &op.request {
            Some(request_op::Request::RequestRange(r)) => {
                auth.check_range(who, &r.key, &r.range_end)?
            }
            Some(request_op::Request::RequestPut(r)) => check_put(auth, lessor, who, r)?,
            Some(request_op::Request::RequestDeleteRange(r)) => {
                if r.prev_kv {
                    auth.check_range(who, &r.key, &r.range_end)?;
                }
                auth.check_write(who, &r.key, &r.range_end)?;
            }
            Some(request_op::Request::RequestTxn(r)) => check_txn(auth, lessor, who, r)?,
            None => {}
        }
    }
    Ok(())
}
