//! Committed entry → state machine, as etcd's applier chain. Runs on the
//! raft thread, in log order, inside one MVCC write batch per Ready.
//!
//! A normal entry (an [`InternalRaftRequest`]) goes through, in etcd's
//! order (`applierV3` decorators):
//!
//! 1. `membership` — a publish (member attributes) is applied at once;
//! 2. `auth` (etcd's `authApplierV3`) — the proposer's permissions, while
//!    auth is enabled; auth store changes are applied here;
//! 3. `alarm` (`applierV3Capped` / `applierV3Corrupt`) — alarm requests;
//!    while CORRUPT is raised every key-value and lease change is refused,
//!    while NOSPACE is raised every write that costs space;
//! 4. `backend` (`applierV3backend`) — the MVCC and lessor changes;
//! 5. `quota` (`quotaApplierV3`) — a write applied while *this* member's
//!    backend is over its quota is answered NOSPACE and the member raises
//!    the alarm.
//!
//! Conf-change entries are checked and applied to the member list by
//! [`membership::apply_conf_change`]; the raft thread then hands the
//! change to raft-rs and the peer transport.

pub mod alarm;
mod auth;
mod backend;
pub mod membership;
pub mod quota;

use crate::error::ServerError;
use retcd_api::etcdserverpb::{
    AlarmResponse, CompactionResponse, DeleteRangeResponse, LeaseGrantResponse,
    LeaseRevokeResponse, PutResponse, RangeResponse, TxnResponse,
};
use retcd_api::mvccpb::Event;
use retcd_api::retcdpb::internal_raft_request::Request;
use retcd_api::retcdpb::InternalRaftRequest;
use retcd_mvcc::{KvStore, WatchableStore, WriteBatch};
use std::sync::Arc;

pub use auth::{check_txn, lease_keys_writable};

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
    /// Applied; nothing to return (publish, lease checkpoints, a
    /// membership change).
    Empty,
    /// The request was applied and failed deterministically (on every member).
    Err(ServerError),
}

/// What applying one normal entry did.
pub struct Applied {
    pub result: ApplyResult,
    /// The entry was applied over this member's quota: NOSPACE is to be
    /// raised for this member.
    pub over_quota: bool,
}

/// The state machine: every part an applied entry changes. The parts are
/// shared (`Arc`) with the readers (the server's reads, watch streams).
pub struct Applier {
    pub kv: Arc<KvStore>,
    pub lessor: Arc<retcd_lease::Lessor>,
    pub watch: Arc<WatchableStore>,
    pub alarms: Arc<alarm::AlarmStore>,
    pub auth: Arc<crate::auth::AuthStore>,
    pub members: Arc<membership::Members>,
    /// `--quota-backend-bytes` in bytes, None when disabled.
    pub quota_bytes: Option<u64>,
}

impl Applier {
    /// Applies the normal entry `req` at raft `index` to `batch`;
    /// `backend_size` is the backend file's size before this batch (it does
    /// not grow before the batch commits).
    pub fn apply(
        &self,
        batch: &mut WriteBatch<'_>,
        req: InternalRaftRequest,
        index: u64,
        backend_size: u64,
    ) -> Applied {
        let over = quota::over_at_apply(self.quota_bytes, backend_size, &req);
        let result = match req.request {
            Some(Request::MemberAttributes(a)) => {
                membership::apply_attributes(&self.members, batch, a)
                    .unwrap_or_else(|e| ApplyResult::Err(e.into()))
            }
            _ => self.apply_checked(batch, req, index),
        };
        // etcd's quotaApplierV3: applied all the same (members stay
        // identical), answered NOSPACE, and the alarm is raised.
        let over_quota = over && !matches!(result, ApplyResult::Err(_));
        Applied {
            result: if over_quota {
                ApplyResult::Err(ServerError::NoSpace)
            } else {
                result
            },
            over_quota,
        }
    }

    /// Steps 2–4 of the chain (see the module documentation).
    fn apply_checked(
        &self,
        batch: &mut WriteBatch<'_>,
        req: InternalRaftRequest,
        index: u64,
    ) -> ApplyResult {
        if self.auth.is_enabled() {
            if let Err(e) = auth::check_permissions(&self.auth, &self.lessor, &req) {
                return ApplyResult::Err(e.into());
            }
        }
        let Some(request) = req.request else {
            return ApplyResult::Err(ServerError::internal("retcd: raft entry without a request"));
        };
        match request {
            Request::Auth(ar) => match self.auth.apply(backend_txn(batch), index, &ar) {
                Ok(token) => ApplyResult::Auth(token),
                Err(e) => ApplyResult::Err(e.into()),
            },
            Request::Alarm(ar) => alarm::apply_alarm(batch, &self.alarms, &ar),
            other => match alarm::refusal(&self.alarms, &other) {
                Some(e) => ApplyResult::Err(e),
                None => backend::apply(batch, &self.lessor, other),
            },
        }
    }

    /// Hands the events of a committed batch (in revision order) to the
    /// parts that follow the key space: lease attachments and watchers.
    /// Must not block.
    pub fn after_commit(&self, events: Vec<(i64, Event)>) {
        self.lessor.apply_events(events.iter().map(|(_, e)| e));
        self.watch.notify(
            self.kv.current_revision(),
            crate::failpoints::watch_events(events),
        );
    }

    /// Reloads alarms, auth, leases and watchers from the backend after the
    /// store was replaced by a snapshot from the leader (the member list is
    /// the raft thread's: it updates the transport with it).
    pub fn after_restore(&self) -> anyhow::Result<()> {
        use anyhow::Context;
        let backend = self.kv.backend();
        self.alarms
            .reload(backend)
            .context("failed to load alarms from the snapshot")?;
        self.auth
            .reload(backend)
            .context("failed to load the auth store from the snapshot")?;
        self.lessor
            .recover(&self.kv)
            .context("failed to recover leases from the snapshot")?;
        self.watch.restore();
        Ok(())
    }
}

/// The batch's redb write transaction (begun on first use). A backend
/// that cannot begin one stops the member, as a batch that could not begin
/// did: answering an error for an entry the other members applied would
/// make this member differ from them.
pub(crate) fn backend_txn<'b>(batch: &'b WriteBatch<'_>) -> &'b redb::WriteTransaction {
    match batch.backend_txn() {
        Ok(txn) => txn,
        Err(e) => crate::error::fatal(&format!("failed to begin a backend transaction: {e}")),
    }
}

#[cfg(test)]
mod tests;
