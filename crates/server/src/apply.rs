//! Committed entry → state machine. Runs on the raft thread, in log order,
//! inside one MVCC write batch per Ready.

use crate::auth::{AuthError, AuthInfo, AuthStore};
use crate::error::ServerError;
use retcd_api::etcdserverpb::{
    alarm_request::AlarmAction, request_op, response_op, AlarmResponse, AlarmType,
    CompactionResponse, DeleteRangeResponse, LeaseGrantResponse, LeaseRevokeResponse, PutRequest,
    PutResponse, RangeResponse, ResponseHeader, TxnRequest, TxnResponse,
};
use retcd_api::retcdpb::InternalRaftRequest;
use retcd_lease::Lessor;
use retcd_mvcc::WriteBatch;

/// The outcome of applying one request, handed to the proposer.
#[derive(Debug)]
pub enum ApplyResult {
    Range(RangeResponse),
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
    Compaction(CompactionResponse),
    LeaseGrant(LeaseGrantResponse),
    LeaseRevoke(LeaseRevokeResponse),
    Alarm(AlarmResponse),
    /// An auth store change; the token for an Authenticate.
    Auth(Option<String>),
    /// Applied; nothing to return (publish).
    Empty,
    /// The request was applied and failed deterministically (on every member).
    Err(ServerError),
}

fn lease_header(batch: &WriteBatch<'_>) -> Option<ResponseHeader> {
    Some(ResponseHeader {
        revision: batch.revision(),
        ..Default::default()
    })
}

/// Lease grant, revoke and checkpoint: the lessor changes in memory and in
/// the batch's backend transaction (the `lease` table).
fn apply_lease(
    batch: &mut WriteBatch<'_>,
    lessor: &Lessor,
    req: InternalRaftRequest,
) -> ApplyResult {
    let res = if let Some(r) = req.lease_grant {
        lessor.grant(batch.backend_txn(), r.id, r.ttl).map(|ttl| {
            ApplyResult::LeaseGrant(LeaseGrantResponse {
                header: lease_header(batch),
                id: r.id,
                ttl,
                error: String::new(),
            })
        })
    } else if let Some(r) = req.lease_revoke {
        lessor.revoke(batch, r.id).map(|()| {
            ApplyResult::LeaseRevoke(LeaseRevokeResponse {
                header: lease_header(batch),
            })
        })
    } else {
        let mut res = Ok(ApplyResult::Empty);
        for cp in req.lease_checkpoint.unwrap_or_default().checkpoints {
            if let Err(e) = lessor.checkpoint(batch.backend_txn(), cp.id, cp.remaining_ttl) {
                res = Err(e);
            }
        }
        res
    };
    res.unwrap_or_else(|e| ApplyResult::Err(ServerError::Lease(e)))
}

/// Points the keys of applied puts at their leases at once, as etcd's put
/// does, so a revoke later in the same batch finds them. (Attachments are
/// also derived from the committed events in `RaftNode::after_commit`,
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

pub fn apply_request(
    batch: &mut WriteBatch<'_>,
    lessor: &Lessor,
    req: InternalRaftRequest,
) -> ApplyResult {
    if req.lease_grant.is_some() || req.lease_revoke.is_some() || req.lease_checkpoint.is_some() {
        return apply_lease(batch, lessor, req);
    }
    let res = if let Some(r) = req.put {
        let res = batch.put(&r, lessor);
        if res.is_ok() {
            attach_put(lessor, &r);
        }
        res.map(ApplyResult::Put)
    } else if let Some(r) = req.delete_range {
        batch.delete_range(&r).map(ApplyResult::DeleteRange)
    } else if let Some(r) = req.txn {
        let res = batch.txn(&r, lessor);
        if let Ok(resp) = &res {
            attach_txn(lessor, &r, resp);
        }
        res.map(ApplyResult::Txn)
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

/// The alarm-aware applier (etcd's `applierV3Capped` / `applierV3Corrupt`
/// in front of the backend applier): applies `alarm` requests to the
/// alarm store, and refuses changes while NOSPACE or CORRUPT is raised.
/// Deterministic: alarms change only through applied entries.
pub fn apply_with_alarms(
    batch: &mut WriteBatch<'_>,
    shared: &crate::server::Shared,
    req: InternalRaftRequest,
    index: u64,
) -> ApplyResult {
    // etcd's authApplierV3 comes first: permissions, then alarms.
    if shared.auth.is_enabled() {
        if let Err(e) = check_permissions(&shared.auth, &shared.lessor, &req) {
            return ApplyResult::Err(e.into());
        }
    }
    if let Some(ar) = &req.auth {
        return match shared.auth.apply(batch.backend_txn(), index, ar) {
            Ok(token) => ApplyResult::Auth(token),
            Err(e) => ApplyResult::Err(e.into()),
        };
    }
    let alarms = &shared.alarms;
    if let Some(ar) = &req.alarm {
        return apply_alarm(batch, alarms, ar);
    }
    if alarms.has(AlarmType::Corrupt)
        && (req.put.is_some()
            || req.delete_range.is_some()
            || req.txn.is_some()
            || req.compaction.is_some()
            || req.range.is_some()
            || req.lease_grant.is_some()
            || req.lease_revoke.is_some())
    {
        return ApplyResult::Err(ServerError::Corrupt);
    }
    if alarms.has(AlarmType::Nospace) {
        let writes = req.put.is_some()
            || req.lease_grant.is_some()
            || req
                .txn
                .as_ref()
                .is_some_and(|t| !retcd_mvcc::is_txn_read_only(t));
        if writes {
            return ApplyResult::Err(ServerError::NoSpace);
        }
    }
    apply_request(batch, &shared.lessor, req)
}

/// etcd's `authApplierV3`: the proposer's permissions for what `req`
/// reads and writes, checked against the auth store as of this entry.
fn check_permissions(
    auth: &AuthStore,
    lessor: &Lessor,
    req: &InternalRaftRequest,
) -> Result<(), AuthError> {
    let who = AuthInfo {
        username: req.username.clone(),
        revision: req.auth_revision,
    };
    let who = Some(&who);
    // A lease's keys must all be writable by whoever revokes it or
    // attaches another key to it.
    let lease_keys_writable = |id: i64| -> Result<(), AuthError> {
        if let Some(l) = lessor.lookup(id) {
            for k in &l.keys {
                auth.check_write(who, k, b"")?;
            }
        }
        Ok(())
    };
    if let Some(a) = &req.auth {
        use retcd_api::retcdpb::auth_request::Op;
        if !matches!(a.op, Some(Op::Authenticate(_))) {
            auth.check_admin(who)?;
        }
    } else if let Some(r) = &req.put {
        auth.check_write(who, &r.key, b"")?;
        lease_keys_writable(r.lease)?;
        if r.prev_kv {
            auth.check_range(who, &r.key, b"")?;
        }
    } else if let Some(r) = &req.delete_range {
        auth.check_write(who, &r.key, &r.range_end)?;
        if r.prev_kv {
            auth.check_range(who, &r.key, &r.range_end)?;
        }
    } else if let Some(r) = &req.txn {
        check_txn(auth, who, r)?;
    } else if let Some(r) = &req.range {
        auth.check_range(who, &r.key, &r.range_end)?;
    } else if let Some(r) = &req.lease_revoke {
        lease_keys_writable(r.id)?;
    }
    Ok(())
}

/// A txn's compares, and the requests of both branches (nested txns
/// included, as etcd 3.5 checks them).
pub(crate) fn check_txn(
    auth: &AuthStore,
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
            Some(request_op::Request::RequestPut(r)) => {
                auth.check_write(who, &r.key, b"")?;
                if r.prev_kv {
                    auth.check_range(who, &r.key, b"")?;
                }
            }
            Some(request_op::Request::RequestDeleteRange(r)) => {
                if r.prev_kv {
                    auth.check_range(who, &r.key, &r.range_end)?;
                }
                auth.check_write(who, &r.key, &r.range_end)?;
            }
            Some(request_op::Request::RequestTxn(r)) => check_txn(auth, who, r)?,
            None => {}
        }
    }
    Ok(())
}

fn apply_alarm(
    batch: &mut WriteBatch<'_>,
    alarms: &crate::alarm::AlarmStore,
    ar: &retcd_api::etcdserverpb::AlarmRequest,
) -> ApplyResult {
    let mut resp = AlarmResponse {
        header: lease_header(batch),
        alarms: vec![],
    };
    let res = match AlarmAction::try_from(ar.action) {
        Ok(AlarmAction::Get) => {
            resp.alarms = alarms.get(AlarmType::try_from(ar.alarm).unwrap_or(AlarmType::None));
            Ok(())
        }
        Ok(AlarmAction::Activate) => alarms
            .activate(batch.backend_txn(), ar.member_id, ar.alarm)
            .map(|m| {
                if let Some(m) = m {
                    tracing::warn!(member = %format!("{:x}", m.member_id), alarm = %crate::alarm::alarm_string(&m), "alarm raised");
                    resp.alarms.push(m);
                }
            }),
        Ok(AlarmAction::Deactivate) => alarms
            .deactivate(batch.backend_txn(), ar.member_id, ar.alarm)
            .map(|m| {
                if let Some(m) = m {
                    tracing::info!(member = %format!("{:x}", m.member_id), alarm = %crate::alarm::alarm_string(&m), "alarm cleared");
                    resp.alarms.push(m);
                }
            }),
        Err(_) => Ok(()),
    };
    match res {
        Ok(()) => ApplyResult::Alarm(resp),
        Err(e) => ApplyResult::Err(ServerError::Internal(format!("etcdserver: alarm: {e}"))),
    }
}
