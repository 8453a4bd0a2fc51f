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

/// Writes the store at `dump`'s revision as an etcd backend (a bbolt file
/// with etcd's buckets, what `etcdctl snapshot status/restore` and etcd
/// read) into a temporary file under `dir`, then streams the file through
/// `w` in etcd's 32 KiB chunks. The file is built from one read snapshot
/// while writes go on, in bounded batches; it is deleted when sent (or
/// when the stream fails). Returns the bytes sent (before the SHA-256).
fn send_etcd_backend(
    dump: &retcd_mvcc::SnapshotDump,
    dir: &std::path::Path,
    etcd_version: &str,
    w: &mut ChunkWriter,
) -> anyhow::Result<u64> {
    use anyhow::Context;
    use std::io::{Read, Write};
    let tmp = tempfile::Builder::new()
        .prefix("retcd-snapshot-")
        .suffix(".db.part")
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    // bbolt-rs creates the file itself: hand it a path that does not exist
    // (the temp file's, freed), removed again when done (TempPath's drop).
    let path = tempfile::TempPath::try_from_path(tmp.path())?;
    drop(tmp);
    let mut bw = retcd_etcdfmt::BackendWriter::create(&path, etcd_version)?;
    dump.for_each_record(|t, k, v| {
        bw.add(t, k, v)
            .map_err(|e| retcd_mvcc::MvccError::Backend(e.to_string()))
    })?;
    bw.finish()?;
    let mut f = std::fs::File::open(&path)?;
    let total = f.metadata()?.len();
    w.total = total;
    tracing::info!(
        revision = dump.revision,
        bytes = total,
        size = %retcd_etcdfmt::human_bytes(total),
        "sending database snapshot"
    );
    let mut buf = vec![0u8; SNAPSHOT_CHUNK];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        w.write_all(&buf[..n])?;
    }
    w.flush()?;
    Ok(total)
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
        let dir = self.server.cfg.snap_dir();
        let version = self.server.cfg.etcd_version.clone();
        let (tx, rx) = mpsc::channel(8);
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let mut w = ChunkWriter {
                tx: tx.clone(),
                buf: Vec::with_capacity(SNAPSHOT_CHUNK),
                sha: Sha256::new(),
                total: 0,
                sent: 0,
                header: Some(header),
            };
            match send_etcd_backend(&dump, &dir, &version, &mut w) {
                Ok(total) => {
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
                        took = %crate::log::GoDuration(started.elapsed()),
                        "sent database snapshot"
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %e, "snapshot stream stopped");
                    let _ = tx.blocking_send(Err(Status::internal(format!(
                        "etcdserver: snapshot failed: {e}"
                    ))));
                }
            }
        });
        // A snapshot that fails before its first chunk is the call's error
        // (trailers only), as etcd's.
        super::headers_with_first(rx).await
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
