//! etcdserverpb.Maintenance: Status, Alarm, Defragment, Hash, HashKV,
//! Snapshot, Downgrade (and MoveLeader, with the membership work).
//!
//! * Alarm: every action goes through raft, as in etcd, so `alarm list`
//!   is linearizable and `alarm disarm` clears the alarm on every member.
//! * Defragment: local to the member, and online (see
//!   `retcd_mvcc::KvStore::defrag`): requests keep being served.
//! * Snapshot: the store at one revision in the `KvStore::dump` format, in
//!   32 KiB chunks with `remaining_bytes`, zero-padded to a multiple of 512
//!   bytes (etcd's clients check `size % 512 == 32`, true of bolt files),
//!   then one last message whose blob is the SHA-256 of everything before it — what `etcdctl snapshot save`
//!   writes to the file and `retcdutl snapshot restore` verifies.

use crate::alarm::alarm_string;
use crate::apply::ApplyResult;
use crate::config::{ETCD_API_VERSION, ETCD_CLUSTER_VERSION};
use crate::error::ServerError;
use crate::server::EtcdServer;
use retcd_api::etcdserverpb::maintenance_server::Maintenance;
use retcd_api::etcdserverpb::{
    alarm_request::AlarmAction, downgrade_request::DowngradeAction, AlarmRequest, AlarmResponse,
    DefragmentRequest, DefragmentResponse, DowngradeRequest, DowngradeResponse, HashKvRequest,
    HashKvResponse, HashRequest, HashResponse, MoveLeaderRequest, MoveLeaderResponse,
    SnapshotRequest, SnapshotResponse, StatusRequest, StatusResponse,
};
use retcd_api::retcdpb::InternalRaftRequest;
use sha2::{Digest, Sha256};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// etcd's `snapshotSendBufferSize`.
const SNAPSHOT_CHUNK: usize = 32 * 1024;

pub struct MaintenanceService {
    pub server: Arc<EtcdServer>,
}

/// Turns the dump's bytes into `SnapshotResponse` chunks on a channel,
/// hashing them on the way.
struct ChunkWriter {
    tx: mpsc::Sender<Result<SnapshotResponse, Status>>,
    buf: Vec<u8>,
    sha: Sha256,
    total: u64,
    sent: u64,
    header: Option<retcd_api::etcdserverpb::ResponseHeader>,
}

impl ChunkWriter {
    fn send_chunk(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let blob = std::mem::replace(&mut self.buf, Vec::with_capacity(SNAPSHOT_CHUNK));
        self.sha.update(&blob);
        self.sent += blob.len() as u64;
        let resp = SnapshotResponse {
            header: self.header.take(),
            remaining_bytes: self.total.saturating_sub(self.sent),
            blob,
        };
        self.tx.blocking_send(Ok(resp)).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, "snapshot client went away")
        })
    }
}

impl std::io::Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let room = SNAPSHOT_CHUNK - self.buf.len();
        let n = room.min(data.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == SNAPSHOT_CHUNK {
            self.send_chunk()?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.send_chunk()
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

impl MaintenanceService {
    /// etcd's `authMaintenanceServer`: Defragment, Snapshot and Hash need
    /// the root role while auth is enabled. (etcd also guards HashKV;
    /// retcd answers it, since members compare HashKVs over each other's
    /// client URLs for the corruption check. A hash reveals no data.)
    fn admin(&self, md: &tonic::metadata::MetadataMap) -> Result<(), Status> {
        if !self.server.shared.auth.is_enabled() {
            return Ok(());
        }
        // etcd returns the auth package's errors here unconverted: code
        // Unknown with their raw text.
        let raw = |e: crate::auth::AuthError| Status::unknown(e.raw_text());
        let who = match self.server.auth_info(md) {
            Ok(w) => w,
            Err(ServerError::Auth(e)) => return Err(raw(e)),
            Err(e) => return Err(e.into()),
        };
        self.server
            .shared
            .auth
            .check_admin(who.as_ref())
            .map_err(raw)
    }
}

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    async fn alarm(
        &self,
        request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        let req = request.into_inner();
        if AlarmAction::try_from(req.action).is_err() {
            return Err(Status::invalid_argument("etcdserver: unknown alarm action"));
        }
        let res = self
            .server
            .propose(InternalRaftRequest {
                alarm: Some(req),
                ..Default::default()
            })
            .await?;
        match res {
            ApplyResult::Alarm(mut r) => {
                let rev = r.header.as_ref().map(|h| h.revision).unwrap_or(0);
                r.header = Some(self.server.header(rev));
                Ok(Response::new(r))
            }
            ApplyResult::Err(e) => Err(e.into()),
            other => Err(Status::internal(format!(
                "retcd: unexpected apply result {other:?}"
            ))),
        }
    }

    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let s = &self.server;
        let leader = s.shared.leader.load(Ordering::Acquire);
        let mut errors = Vec::new();
        if leader == 0 {
            errors.push(ServerError::NoLeader.to_string());
        }
        for a in s
            .shared
            .alarms
            .get(retcd_api::etcdserverpb::AlarmType::None)
        {
            errors.push(alarm_string(&a));
        }
        let is_learner = s
            .shared
            .members
            .read()
            .iter()
            .any(|m| m.id == s.member_id && m.is_learner);
        Ok(Response::new(StatusResponse {
            header: Some(s.header(s.kv.current_revision())),
            version: ETCD_API_VERSION.to_string(),
            db_size: s.backend.size() as i64,
            leader,
            raft_index: s.shared.commit_index.load(Ordering::Acquire),
            raft_term: s.shared.term.load(Ordering::Acquire),
            raft_applied_index: s.shared.applied_index.load(Ordering::Acquire),
            errors,
            db_size_in_use: s.backend.size_in_use() as i64,
            is_learner,
        }))
    }

    async fn defragment(
        &self,
        request: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        self.admin(request.metadata())?;
        let kv = self.server.kv.clone();
        let stats = tokio::task::spawn_blocking(move || kv.defrag())
            .await
            .map_err(|e| Status::internal(format!("retcd: defrag task failed: {e}")))?
            .map_err(ServerError::from)?;
        self.server
            .shared
            .metrics
            .db_total_size
            .set(stats.size_after as i64);
        // etcd (3.4 and 3.5) answers an empty response, without a header.
        Ok(Response::new(DefragmentResponse { header: None }))
    }

    async fn hash(&self, request: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        self.admin(request.metadata())?;
        let hash = self.server.kv.hash().map_err(ServerError::from)?;
        Ok(Response::new(HashResponse {
            header: Some(self.server.header(self.server.kv.current_revision())),
            hash,
        }))
    }

    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        let req = request.into_inner();
        let (hash, compact_revision, hash_revision) = self
            .server
            .kv
            .hash_kv(req.revision)
            .map_err(ServerError::from)?;
        let hash = crate::fp::hash_kv(hash);
        Ok(Response::new(HashKvResponse {
            header: Some(self.server.header(self.server.kv.current_revision())),
            hash,
            compact_revision,
            hash_revision,
        }))
    }

    async fn snapshot(
        &self,
        request: Request<SnapshotRequest>,
    ) -> Result<Response<tonic::codegen::BoxStream<SnapshotResponse>>, Status> {
        self.admin(request.metadata())?;
        let dump = self.server.kv.snapshot_dump();
        let header = self.server.header(dump.revision);
        let (tx, rx) = mpsc::channel(8);
        tokio::task::spawn_blocking(move || {
            // etcd's clients expect the data before the hash to be a
            // multiple of 512 bytes (a bolt file is): pad with zeros.
            let total = match dump.size() {
                Ok(n) => n + (512 - n % 512) % 512,
                Err(e) => {
                    let _ = tx.blocking_send(Err(Status::from(ServerError::from(e))));
                    return;
                }
            };
            tracing::info!(
                revision = dump.revision,
                bytes = total,
                "sending database snapshot"
            );
            let mut w = ChunkWriter {
                tx: tx.clone(),
                buf: Vec::with_capacity(SNAPSHOT_CHUNK),
                sha: Sha256::new(),
                total,
                sent: 0,
                header: Some(header),
            };
            if let Err(e) = dump.write_to(&mut w) {
                tracing::warn!(error = %e, "snapshot stream stopped");
                let _ = tx.blocking_send(Err(Status::from(ServerError::from(e))));
                return;
            }
            let pad = vec![0u8; (total - w.sent - w.buf.len() as u64) as usize];
            if std::io::Write::write_all(&mut w, &pad)
                .and_then(|()| std::io::Write::flush(&mut w))
                .is_err()
            {
                return;
            }
            let sha = w.sha.finalize().to_vec();
            let _ = tx.blocking_send(Ok(SnapshotResponse {
                header: None,
                remaining_bytes: 0,
                blob: sha,
            }));
            tracing::info!(
                revision = dump.revision,
                bytes = total,
                "sent database snapshot"
            );
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    /// etcd's MoveLeader (membership engineer's code: `membership::move_leader`).
    async fn move_leader(
        &self,
        request: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        let req = request.into_inner();
        crate::membership::move_leader(&self.server, req.target_id).await?;
        // etcd answers MoveLeader with an empty response (no header).
        Ok(Response::new(MoveLeaderResponse { header: None }))
    }

    async fn downgrade(
        &self,
        request: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        let req = request.into_inner();
        let action = DowngradeAction::try_from(req.action)
            .map_err(|_| Status::invalid_argument("etcdserver: unknown method"))?;
        let header = |s: &EtcdServer| Some(s.header(s.kv.current_revision()));
        match action {
            DowngradeAction::Validate | DowngradeAction::Enable => {
                let target = downgrade_target(&req.version)?;
                self.server.linearizable_read_notify().await?;
                // The cluster version is 3.5: the one allowed target is 3.4.
                let (major, minor) = cluster_major_minor();
                if target != (major, minor.saturating_sub(1)) || minor == 0 {
                    return Err(ServerError::InvalidDowngradeTargetVersion.into());
                }
                if action == DowngradeAction::Enable {
                    return Err(Status::failed_precondition(
                        "retcd: downgrading to etcd 3.4 is not supported (retcd's data files are its own); \
                         migrate with `etcdctl snapshot save` and a restore instead",
                    ));
                }
                Ok(Response::new(DowngradeResponse {
                    header: header(&self.server),
                    version: ETCD_CLUSTER_VERSION.to_string(),
                }))
            }
            DowngradeAction::Cancel => {
                self.server.linearizable_read_notify().await?;
                Err(ServerError::NoInflightDowngrade.into())
            }
        }
    }
}

fn cluster_major_minor() -> (u64, u64) {
    let mut it = ETCD_CLUSTER_VERSION
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
