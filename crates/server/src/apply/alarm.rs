//! The alarm store (etcd's `etcdserver/api/v3alarm`): which member raised
//! which alarm. Changed only by applied raft entries (so every member agrees)
//! and persisted in the backend's `alarm` table in the same commit.
//!
//! While NOSPACE is raised the apply path refuses Put, Txn with writes and
//! LeaseGrant with "etcdserver: mvcc: database space exceeded" (etcd's
//! `applierV3Capped`); while CORRUPT is raised it refuses every key-value
//! and lease change with "etcdserver: corrupt cluster" (`applierV3Corrupt`).
//!
//! Table `alarm`: key = prost-encoded `AlarmMember` (as etcd), value empty.

use super::ApplyResult;
use crate::error::ServerError;
use crate::ids::Hex;
use parking_lot::RwLock;
use prost::Message;
use redb::{ReadableDatabase, ReadableTable, WriteTransaction};
use retcd_api::etcdserverpb::{
    alarm_request::AlarmAction, AlarmMember, AlarmRequest, AlarmResponse, AlarmType,
};
use retcd_api::retcdpb::internal_raft_request::Request;
use retcd_mvcc::WriteBatch;
use retcd_storage::backend::{Backend, ALARM};

/// Raised alarms, ordered by (member, type). The lock protects the list;
/// written by the raft thread's apply, read by services; never held
/// across I/O.
#[derive(Default, Debug)]
pub struct AlarmStore {
    alarms: RwLock<Vec<AlarmMember>>,
}

impl AlarmStore {
    /// Loads the alarms persisted in `backend` (empty if none).
    pub fn load(backend: &Backend) -> anyhow::Result<AlarmStore> {
        let s = AlarmStore::default();
        s.reload(backend)?;
        Ok(s)
    }

    /// Replaces the in-memory list with the backend's (after a restore).
    pub fn reload(&self, backend: &Backend) -> anyhow::Result<()> {
        let txn = backend.db().begin_read()?;
        let mut v = Vec::new();
        if let Ok(t) = txn.open_table(ALARM) {
            for e in t.iter()? {
                let (k, _) = e?;
                v.push(AlarmMember::decode(k.value())?);
            }
        }
        v.sort_by_key(|a| (a.member_id, a.alarm));
        *self.alarms.write() = v;
        Ok(())
    }

    /// Alarms of `kind`, or all of them for `AlarmType::None`.
    pub fn get(&self, kind: AlarmType) -> Vec<AlarmMember> {
        self.alarms
            .read()
            .iter()
            .filter(|a| kind == AlarmType::None || a.alarm == kind as i32)
            .cloned()
            .collect()
    }

    /// Whether any member raised `kind`.
    pub fn has(&self, kind: AlarmType) -> bool {
        self.alarms.read().iter().any(|a| a.alarm == kind as i32)
    }

    /// Raises `kind` for `member` (in the batch's transaction). Returns the
    /// alarm, or None for `AlarmType::None` (etcd ignores it).
    pub fn activate(
        &self,
        txn: &WriteTransaction,
        member: u64,
        kind: i32,
    ) -> anyhow::Result<Option<AlarmMember>> {
        if AlarmType::try_from(kind).unwrap_or(AlarmType::None) == AlarmType::None {
            return Ok(None);
        }
        let m = AlarmMember {
            member_id: member,
            alarm: kind,
        };
        let mut list = self.alarms.write();
        if !list.contains(&m) {
            txn.open_table(ALARM)?
                .insert(m.encode_to_vec().as_slice(), [].as_slice())?;
            list.push(m);
            list.sort_by_key(|a| (a.member_id, a.alarm));
        }
        Ok(Some(m))
    }

    /// Clears `kind` for `member`. Returns the alarm if it was raised.
    pub fn deactivate(
        &self,
        txn: &WriteTransaction,
        member: u64,
        kind: i32,
    ) -> anyhow::Result<Option<AlarmMember>> {
        let m = AlarmMember {
            member_id: member,
            alarm: kind,
        };
        let mut list = self.alarms.write();
        let Some(pos) = list.iter().position(|a| *a == m) else {
            return Ok(None);
        };
        txn.open_table(ALARM)?
            .remove(m.encode_to_vec().as_slice())?;
        list.remove(pos);
        Ok(Some(m))
    }
}

/// etcd's text form of an alarm (gogoproto `String()`), as Status.errors
/// shows it: `memberID:8211f1d0f64f3269 alarm:NOSPACE `.
pub fn alarm_string(a: &AlarmMember) -> String {
    // gogo protobuf's compact text: fields at zero are left out, an enum
    // value the enum does not know is its number
    let mut s = String::new();
    if a.member_id != 0 {
        s.push_str(&format!("memberID:{} ", a.member_id));
    }
    if a.alarm != 0 {
        match AlarmType::try_from(a.alarm) {
            Ok(t) => s.push_str(&format!("alarm:{} ", t.as_str_name())),
            Err(_) => s.push_str(&format!("alarm:{} ", a.alarm)),
        }
    }
    s
}

/// The alarm-capped appliers (etcd's `applierV3Corrupt` and
/// `applierV3Capped`): why `req` is refused under the raised alarms, if
/// it is. Deterministic: alarms change only through applied entries.
pub(super) fn refusal(alarms: &AlarmStore, req: &Request) -> Option<ServerError> {
    let changes_state = matches!(
        req,
        Request::Put(_)
            | Request::DeleteRange(_)
            | Request::Txn(_)
            | Request::Compaction(_)
            | Request::Range(_)
            | Request::LeaseGrant(_)
            | Request::LeaseRevoke(_)
    );
    if changes_state && alarms.has(AlarmType::Corrupt) {
        return Some(ServerError::Corrupt);
    }
    // etcd's applierV3Capped: a Txn is refused only when its puts cost
    // something (`costTxn`), so a Txn that only deletes (an election's
    // Resign) goes through, as a DeleteRange does.
    let costs_space = match req {
        Request::Put(_) | Request::LeaseGrant(_) => true,
        Request::Txn(t) => super::quota::cost_txn(t) > 0,
        _ => false,
    };
    if costs_space && alarms.has(AlarmType::Nospace) {
        return Some(ServerError::NoSpace);
    }
    None
}

/// Applies an alarm request (get, activate, deactivate).
pub(super) fn apply_alarm(
    batch: &mut WriteBatch<'_>,
    alarms: &AlarmStore,
    ar: &AlarmRequest,
) -> ApplyResult {
    let mut resp = AlarmResponse {
        header: super::backend::batch_header(batch),
        alarms: vec![],
    };
    let res = match AlarmAction::try_from(ar.action) {
        Ok(AlarmAction::Get) => {
            // a type etcd does not know has no alarms (NONE is every type)
            if let Ok(kind) = AlarmType::try_from(ar.alarm) {
                resp.alarms = alarms.get(kind);
            }
            Ok(())
        }
        Ok(AlarmAction::Activate) => alarms
            .activate(super::backend_txn(batch), ar.member_id, ar.alarm)
            .map(|m| {
                if let Some(m) = m {
                    tracing::warn!(member = %Hex(m.member_id), alarm = %alarm_string(&m), "alarm raised");
                    resp.alarms.push(m);
                }
            }),
        Ok(AlarmAction::Deactivate) => alarms
            .deactivate(super::backend_txn(batch), ar.member_id, ar.alarm)
            .map(|m| {
                if let Some(m) = m {
                    tracing::info!(member = %Hex(m.member_id), alarm = %alarm_string(&m), "alarm cleared");
                    resp.alarms.push(m);
                }
            }),
        Err(_) => Ok(()),
    };
    match res {
        Ok(()) => ApplyResult::Alarm(resp),
        Err(e) => ApplyResult::Err(ServerError::Internal {
            context: "etcdserver: alarm".into(),
            cause: Some(crate::error::Cause::from(e)),
        }),
    }
}
