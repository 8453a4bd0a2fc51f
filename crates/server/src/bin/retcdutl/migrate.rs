//! `retcdutl migrate --etcd-data-dir DIR`: a new retcd member's data dir
//! from a stopped etcd member's.
//!
//! etcd commits its backend (`member/snap/db`) every 100 ms or so; what
//! was applied since is only in its WAL. So the migration takes the
//! backend's rows (as a snapshot restore does), then every WAL entry after
//! the backend's `consistent_index` up to the last commit index the WAL
//! records (everything etcd can have acknowledged), turns each into
//! retcd's request and writes them, committed, into the new member's log:
//! the member applies them through retcd's own apply when it starts, the
//! way it replays its own log after a crash. Entries that changed nothing
//! retcd keeps (reads, authenticate, membership, cluster version) are left
//! out. A running etcd holds bbolt's lock on its db: the migration refuses
//! to read a member that is still running.

use retcd_gostd::raw;
use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use prost::Message as _;
use retcd_etcdfmt::{wal, BoltReader};

use crate::{finish_member, new_cluster, restore_backend, restore_etcd_rows, NewMember, Progress};

/// etcd's bcrypt cost (`--bcrypt-cost` default): for the plaintext
/// passwords etcd 3.4 logged.
const BCRYPT_COST: u32 = 10;

/// The backend's `meta/consistent_index`: the last raft index applied to
/// it (0 when the backend never committed one: a member killed before its
/// first backend commit).
fn consistent_index(r: &BoltReader) -> anyhow::Result<u64> {
    let meta = r
        .buckets()?
        .into_iter()
        .find(|(n, _)| n == b"meta")
        .map(|(_, root)| root);
    let Some(meta) = meta else {
        bail!("the etcd backend has no meta bucket");
    };
    let mut ci = None;
    r.walk::<retcd_etcdfmt::BoltError>(&meta, &mut |k, v, _| {
        if k == b"consistent_index" && v.len() == 8 {
            ci = Some(u64::from_be_bytes(v.try_into().expect("8 bytes")));
        }
        Ok(())
    })?;
    Ok(ci.unwrap_or(0))
}

pub(crate) fn migrate(
    etcd_dir: &Path,
    wal_dir: Option<&Path>,
    member: &NewMember,
) -> anyhow::Result<()> {
    let db_path = etcd_dir.join("member/snap/db");
    let wal_dir: PathBuf = wal_dir
        .map(Path::to_path_buf)
        .unwrap_or_else(|| etcd_dir.join("member/wal"));
    if !db_path.is_file() {
        bail!(
            "{} is not an etcd data dir: no member/snap/db",
            raw::path_text(etcd_dir)
        );
    }
    let db = File::open(&db_path)
        .with_context(|| format!("cannot open {}", raw::path_text(&db_path)))?;
    // etcd holds an exclusive flock on its db while it runs.
    match db.try_lock_shared() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => bail!(
            "{} is locked: the etcd member is still running (stop it first)",
            raw::path_text(&db_path)
        ),
        Err(TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("cannot lock {}", raw::path_text(&db_path)))
        }
    }
    let nc = new_cluster(member)?;
    let r = BoltReader::from_file(db.try_clone()?)
        .with_context(|| format!("cannot read the etcd backend {}", raw::path_text(&db_path)))?;
    let ci = consistent_index(&r)?;
    errln!(
        "etcd backend {}: applied through raft index {ci}",
        raw::path_text(&db_path)
    );

    let mut progress: Option<Progress> = None;
    let log = wal::read_dir(&wal_dir, &mut |done, total| {
        progress
            .get_or_insert_with(|| Progress::new("reading etcd wal", total))
            .at(done)
    })
    .with_context(|| format!("cannot read the etcd WAL in {}", raw::path_text(&wal_dir)))?;
    let commit = log.hard_state.commit;
    let first = log.entries.first().map(|e| e.index);
    if let Some(first) = first {
        if first > ci + 1 && commit > ci {
            bail!(
                "the etcd WAL starts at index {first} but the backend stops at {ci}: entries in between are missing"
            );
        }
    }
    let hash = |plain: &str| {
        bcrypt::hash(plain, BCRYPT_COST)
            .map(String::into_bytes)
            .map_err(|e| e.to_string())
    };
    let mut entries = Vec::new();
    let mut left_out = 0u64;
    let mut uncommitted = 0u64;
    for e in &log.entries {
        if e.index <= ci {
            continue;
        }
        if e.index > commit {
            uncommitted += 1;
            continue;
        }
        if e.r#type != 0 {
            left_out += 1; // a conf change: the new cluster has its own members
            continue;
        }
        match wal::to_retcd(&e.data, &hash).map_err(|e| anyhow::anyhow!("etcd WAL entry: {e}"))? {
            Some(req) => entries.push(req.encode_to_vec()),
            None => left_out += 1,
        }
    }
    errln!(
        "etcd WAL {}: {} entries, commit index {commit}{}; replaying {} entries after index {ci} ({left_out} change nothing retcd keeps, {uncommitted} past the commit index were never acknowledged)",
        raw::path_text(&wal_dir),
        log.entries.len(),
        if log.torn_tail { ", torn last record dropped" } else { "" },
        entries.len(),
    );

    let data_dir = nc.paths.data_dir();
    let mut rows = 0;
    restore_backend(&nc, &mut |kv| {
        rows = restore_etcd_rows(kv, &r)?;
        Ok(())
    })
    .and_then(|backend| finish_member(&nc, backend, &entries))
    .inspect_err(|_| {
        let _ = std::fs::remove_dir_all(&data_dir);
    })?;
    outln!(
        "migrated {} to {} ({rows} backend rows plus {} replayed entries; member {:x}, cluster {:x})",
        raw::path_text(etcd_dir),
        raw::path_text(&data_dir),
        entries.len(),
        nc.member_id,
        nc.cluster_id
    );
    Ok(())
}
