//! Maintenance: Alarm, Status, Defragment, Hash, HashKV, Snapshot,
//! Downgrade (MoveLeader is with the membership requests).
//!
//! * Alarm: every action goes through raft, as in etcd, so `alarm list`
//!   is linearizable and `alarm disarm` clears the alarm on every member.
//! * Defragment: local to the member, and online (see
//!   `retcd_mvcc::KvStore::defrag`): requests keep being served.
//! * Hash, HashKV and Defragment scan or rewrite the store: on a blocking
//!   thread, never a runtime worker.
//! * Who may call (etcd 3.5.33's `authMaintenanceServer`): Defragment,
//!   Snapshot, Hash and HashKV need the root role and answer the auth
//!   package's raw errors (code Unknown, `auth: …`); alarm activate and
//!   deactivate, MoveLeader and Downgrade need root with the usual codes;
//!   alarm get and Status need a user. Members compare HashKVs over the
//!   peer port (`hash_kv_for_peer`), which only members reach.

use super::{unexpected, EtcdServer};
use crate::apply::alarm::alarm_string;
use crate::apply::ApplyResult;
use crate::auth::Credentials;
use crate::config::version::cluster_version;
use crate::error::ServerError;
use retcd_api::etcdserverpb::{
    alarm_request::AlarmAction, downgrade_request::DowngradeAction, AlarmRequest, AlarmResponse,
    AlarmType, DowngradeRequest, DowngradeResponse, HashKvResponse, HashResponse, RangeRequest,
    StatusResponse,
};
use retcd_api::retcdpb::internal_raft_request::Request;

pub use retcd_mvcc::SnapshotDump;

/// What Status reports (the response, without gRPC).
pub type StatusInfo = StatusResponse;

impl EtcdServer {
    /// etcd 3.5's admin check for Defragment, Snapshot, Hash and HashKV:
    /// looked at only while auth is enabled, and its errors (an invalid
    /// token included) are the auth package's raw ones.
    fn check_admin_raw(&self, creds: &Credentials) -> Result<(), ServerError> {
        if !self.auth.is_enabled() {
            return Ok(());
        }
        let who = self.who(creds).map_err(|e| match e {
            ServerError::Auth(a) => ServerError::AuthRaw(a),
            other => other,
        })?;
        self.auth
            .check_admin(who.as_ref())
            .map_err(ServerError::AuthRaw)
    }

    pub async fn alarm(
        &self,
        req: AlarmRequest,
        creds: &Credentials,
    ) -> Result<AlarmResponse, ServerError> {
        let action = AlarmAction::try_from(req.action);
        if action.is_err() {
            return Err(ServerError::UnknownAlarmAction);
        }
        let who = self.who(creds)?;
        match action {
            Err(_) => return Err(ServerError::UnknownAlarmAction),
            Ok(AlarmAction::Get) => self.require_user(who.as_ref())?,
            // any member ID, as etcd (a removed member's alarm can be
            // cleared)
            Ok(AlarmAction::Activate | AlarmAction::Deactivate) => {
                self.require_root(who.as_ref())?
            }
        }
        match self.propose(Request::Alarm(req)).await? {
            ApplyResult::Alarm(mut r) => {
                self.fill(&mut r.header);
                Ok(r)
            }
            other => Err(unexpected(other)),
        }
    }

    pub fn status(&self, creds: &Credentials) -> Result<StatusInfo, ServerError> {
        self.require_user(self.who(creds)?.as_ref())?;
        Ok(self.status_now())
    }

    /// Status, without the caller check (the server's own health checks).
    pub fn status_now(&self) -> StatusInfo {
        let raft = self.proposer.status();
        let leader = raft.leader();
        let mut errors = Vec::new();
        if leader == 0 {
            errors.push(ServerError::NoLeader.to_string());
        }
        for a in self.alarms.get(AlarmType::None) {
            errors.push(alarm_string(&a));
        }
        // The raft thread publishes the commit index at the end of its
        // turn, after applying: read the applied index first, and never
        // report less committed than applied (etcd's applied <= committed).
        let applied = raft.applied_index();
        let committed = raft.commit_index().max(applied);
        StatusResponse {
            header: self.current_header(),
            version: self.cfg.etcd_version.clone(),
            db_size: self.backend.size() as i64,
            leader,
            raft_index: committed,
            raft_term: raft.term(),
            raft_applied_index: applied,
            errors,
            db_size_in_use: self.backend.size_in_use() as i64,
            is_learner: self.is_learner(),
        }
    }

    /// The names of the raised alarms (`NOSPACE`, `CORRUPT`), in the order
    /// etcd's `/health` looks at them.
    pub fn alarm_names(&self) -> Vec<&'static str> {
        self.alarms
            .get(AlarmType::None)
            .iter()
            .map(|a| {
                AlarmType::try_from(a.alarm)
                    .map(|t| t.as_str_name())
                    .unwrap_or("UNKNOWN")
            })
            .collect()
    }

    /// The health checks' read: a one-key, keys-only range as root (etcd
    /// 3.5.3+ runs it `WithRoot`), linearizable unless `serializable`,
    /// bounded by the request timeout. etcd calls its server's `Range`
    /// directly, past the learner rule of the gRPC interceptor, so a
    /// learner runs the linearizable read too (through the leader's read
    /// index).
    pub async fn health_read(&self, serializable: bool) -> Result<(), ServerError> {
        let read = async {
            if !serializable {
                self.linearizable_read_notify().await?;
            }
            let req = RangeRequest {
                key: vec![0],
                limit: 1,
                keys_only: true,
                serializable: true,
                ..Default::default()
            };
            self.kv.range(&req)?;
            Ok(())
        };
        match tokio::time::timeout(self.request_timeout(), read).await {
            Ok(r) => r,
            Err(_) => Err(ServerError::Timeout),
        }
    }

    /// `/metrics`: the gauges that mirror state refreshed, then the text
    /// exposition of every metric.
    pub fn render_metrics(&self) -> String {
        let m = &self.metrics;
        let raft = self.proposer.status();
        let leader = raft.leader();
        m.has_leader.set((leader != 0) as i64);
        m.is_leader
            .set((leader != 0 && leader == self.member_id) as i64);
        m.proposals_committed.set(raft.commit_index() as i64);
        m.proposals_applied.set(raft.applied_index() as i64);
        m.proposals_pending.set(self.proposer.pending() as i64);
        m.db_total_size.set(self.backend.size() as i64);
        m.db_total_size_in_use
            .set(self.backend.size_in_use() as i64);
        m.current_revision.set(self.kv.current_revision());
        m.keys_total.set(self.kv.indexed_keys() as i64);
        m.is_learner.set(self.is_learner() as i64);
        m.compact_revision.set(self.kv.compact_revision());
        let (streams, watchers, slow) = self.watch.gauges();
        m.watch_streams.set(streams as i64);
        m.watchers.set(watchers as i64);
        m.slow_watchers.set(slow as i64);
        m.render()
    }

    /// Defragments this member's backend (online).
    pub async fn defragment(&self, creds: &Credentials) -> Result<(), ServerError> {
        self.check_admin_raw(creds)?;
        let kv = self.kv.clone();
        let m = self.metrics;
        m.defrag_inflight.set(1);
        let started = std::time::Instant::now();
        let stats = tokio::task::spawn_blocking(move || kv.defrag()).await;
        m.defrag_inflight.set(0);
        m.backend_defrag.observe(started.elapsed().as_secs_f64());
        let stats =
            stats.map_err(|e| ServerError::internal_from("retcd: defrag task failed", e))??;
        self.metrics.db_total_size.set(stats.size_after as i64);
        Ok(())
    }

    pub async fn hash(&self, creds: &Credentials) -> Result<HashResponse, ServerError> {
        self.check_admin_raw(creds)?;
        let kv = self.kv.clone();
        let started = std::time::Instant::now();
        let hash = tokio::task::spawn_blocking(move || kv.hash()).await;
        self.metrics
            .hash_duration
            .observe(started.elapsed().as_secs_f64());
        let hash = hash.map_err(|e| ServerError::internal_from("retcd: hash task failed", e))??;
        Ok(HashResponse {
            header: self.current_header(),
            hash,
        })
    }

    pub async fn hash_kv(
        &self,
        revision: i64,
        creds: &Credentials,
    ) -> Result<HashKvResponse, ServerError> {
        self.check_admin_raw(creds)?;
        self.hash_kv_for_peer(revision).await
    }

    /// HashKV for another member's corruption check (the peer port).
    pub async fn hash_kv_for_peer(&self, revision: i64) -> Result<HashKvResponse, ServerError> {
        let (hash, compact_revision, hash_revision) = self.local_hash_kv(revision).await?;
        Ok(HashKvResponse {
            header: self.current_header(),
            hash,
            compact_revision,
            hash_revision,
        })
    }

    /// This member's (hash, compact revision, hash revision) at `revision`
    /// (0: the current one), subject to the `mvcc_hash_kv_corrupt`
    /// failpoint.
    pub(super) async fn local_hash_kv(
        &self,
        revision: i64,
    ) -> Result<(u32, i64, i64), ServerError> {
        let kv = self.kv.clone();
        let started = std::time::Instant::now();
        let r = tokio::task::spawn_blocking(move || kv.hash_kv(revision)).await;
        self.metrics
            .hash_rev_duration
            .observe(started.elapsed().as_secs_f64());
        let (hash, compact, rev) =
            r.map_err(|e| ServerError::internal_from("retcd: hash task failed", e))??;
        Ok((crate::failpoints::hash_kv(hash), compact, rev))
    }

    /// The store at one revision, to stream as a backup.
    pub fn snapshot(&self, creds: &Credentials) -> Result<SnapshotDump, ServerError> {
        self.check_admin_raw(creds)?;
        Ok(self.kv.snapshot_dump())
    }

    pub async fn downgrade(
        &self,
        req: DowngradeRequest,
        creds: &Credentials,
    ) -> Result<DowngradeResponse, ServerError> {
        self.require_root(self.who(creds)?.as_ref())?;
        let action = DowngradeAction::try_from(req.action)
            .map_err(|_| ServerError::UnknownDowngradeAction)?;
        match action {
            DowngradeAction::Validate | DowngradeAction::Enable => {
                let target = downgrade_target(&req.version)?;
                self.linearizable_read_notify().await?;
                // The cluster version is 3.5: the one allowed target is 3.4.
                let (major, minor) = cluster_major_minor(&self.cfg.etcd_version);
                if target != (major, minor.saturating_sub(1)) || minor == 0 {
                    return Err(ServerError::InvalidDowngradeTargetVersion);
                }
                if action == DowngradeAction::Enable {
                    return Err(ServerError::DowngradeUnsupported);
                }
                Ok(DowngradeResponse {
                    header: self.current_header(),
                    version: cluster_version(&self.cfg.etcd_version),
                })
            }
            DowngradeAction::Cancel => {
                self.linearizable_read_notify().await?;
                Err(ServerError::NoInflightDowngrade)
            }
        }
    }
}

/// etcd 3.5's `convertToClusterVersion`: "X.Y.Z" or "X.Y" → (X, Y).
fn downgrade_target(v: &str) -> Result<(u64, u64), ServerError> {
    // semver: MAJOR.MINOR.PATCH[-pre][+build]; etcd also takes MAJOR.MINOR
    let core = v.split(['-', '+']).next().unwrap_or("");
    let parts: Vec<&str> = core.split('.').collect();
    let num = |s: &str| s.parse::<u64>().ok();
    let ok = match parts.as_slice() {
        [a, b] if core == v => num(a).zip(num(b)),
        [a, b, c] => num(c).and(num(a).zip(num(b))),
        _ => None,
    };
    ok.ok_or(ServerError::WrongDowngradeVersionFormat)
}

fn cluster_major_minor(etcd_version: &str) -> (u64, u64) {
    let mut it = etcd_version
        .split('.')
        .map(|p| p.parse::<u64>().unwrap_or(0));
    (it.next().unwrap_or(3), it.next().unwrap_or(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_downgrade_target_formats() {
        assert_eq!(downgrade_target("3.4").unwrap(), (3, 4));
        assert_eq!(downgrade_target("3.4.0").unwrap(), (3, 4));
        assert_eq!(downgrade_target("3.4.1-rc.0").unwrap(), (3, 4));
        assert!(downgrade_target("3").is_err());
        assert!(downgrade_target("x.y").is_err());
    }
}
