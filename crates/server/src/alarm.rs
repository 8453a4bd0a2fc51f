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

use parking_lot::RwLock;
use prost::Message;
use redb::{ReadableDatabase, ReadableTable, WriteTransaction};
use retcd_api::etcdserverpb::{AlarmMember, AlarmType};
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
    let kind = AlarmType::try_from(a.alarm)
        .map(|t| t.as_str_name())
        .unwrap_or("NONE");
    format!("memberID:{} alarm:{} ", a.member_id, kind)
}
