//! etcdserverpb.Maintenance: Status, Alarm, Defragment, Hash, HashKV,
//! Snapshot, MoveLeader, Downgrade (the logic is `server::maintenance`).
//!
//! Snapshot: the store at one revision in the `KvStore::dump` format, in
//! 32 KiB chunks with `remaining_bytes`, zero-padded to a multiple of 512
//! bytes (etcd's clients check `size % 512 == 32`, true of bolt files),
//! then one last message whose blob is the SHA-256 of everything before it
//! — what `etcdctl snapshot save` writes to the file and `retcdutl
//! snapshot restore` verifies.

use crate::api::credentials;
use crate::api::error_map::to_status;
use crate::error::ServerError;
use crate::server::EtcdServer;
use retcd_api::etcdserverpb::maintenance_server::Maintenance;
use retcd_api::etcdserverpb::{
    AlarmRequest, AlarmResponse, DefragmentRequest, DefragmentResponse, DowngradeRequest,
    DowngradeResponse, HashKvRequest, HashKvResponse, HashRequest, HashResponse, MoveLeaderRequest,
    MoveLeaderResponse, SnapshotRequest, SnapshotResponse, StatusRequest, StatusResponse,
};
use sha2::{Digest, Sha256};
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

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    async fn alarm(
        &self,
        request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        Ok(Response::new(
            self.server.alarm(request.into_inner(), &creds).await?,
        ))
    }

    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        Ok(Response::new(self.server.status(&creds)?))
    }

    async fn defragment(
        &self,
        request: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        self.server.defragment(&creds).await?;
        // etcd (3.4 and 3.5) answers an empty response, without a header.
        Ok(Response::new(DefragmentResponse { header: None }))
    }

    async fn hash(&self, request: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        Ok(Response::new(self.server.hash(&creds).await?))
    }

    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        let rev = request.into_inner().revision;
        Ok(Response::new(self.server.hash_kv(rev, &creds).await?))
    }

    async fn snapshot(
        &self,
        request: Request<SnapshotRequest>,
    ) -> Result<Response<tonic::codegen::BoxStream<SnapshotResponse>>, Status> {
        let creds = credentials(&self.server, request.metadata());
        let dump = self.server.snapshot(&creds)?;
        let header = self.server.header(dump.revision);
        let (tx, rx) = mpsc::channel(8);
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            // etcd's clients expect the data before the hash to be a
            // multiple of 512 bytes (a bolt file is): pad with zeros.
            let total = match dump.size() {
                Ok(n) => n + (512 - n % 512) % 512,
                Err(e) => {
                    let _ = tx.blocking_send(Err(to_status(ServerError::from(e))));
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
                let _ = tx.blocking_send(Err(to_status(ServerError::from(e))));
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
            crate::metrics::global()
                .backend_snapshot
                .observe(started.elapsed().as_secs_f64());
            tracing::info!(
                revision = dump.revision,
                bytes = total,
                "sent database snapshot"
            );
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn move_leader(
        &self,
        request: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        self.server
            .move_leader(request.into_inner().target_id, &creds)
            .await?;
        // etcd answers MoveLeader with an empty response (no header).
        Ok(Response::new(MoveLeaderResponse { header: None }))
    }

    async fn downgrade(
        &self,
        request: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        Ok(Response::new(
            self.server.downgrade(request.into_inner(), &creds).await?,
        ))
    }
}
