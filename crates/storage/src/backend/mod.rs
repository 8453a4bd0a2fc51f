//! The backend: a thin wrapper over one redb database file, the Rust
//! counterpart of etcd's bbolt backend (`mvcc/backend`).
//!
//! # Tables ("buckets" in etcd)
//!
//! | table     | key                          | value                                   |
//! |-----------|------------------------------|-----------------------------------------|
//! | `key`     | revision bytes (17 or 18 B)  | prost-encoded `mvccpb.KeyValue`         |
//! | `meta`    | name (`consistent_index`...) | raw bytes (u64 BE / revision bytes)     |
//! | `members` | member id                    | encoded member                          |
//! | `leases`  | lease id                     | encoded lease                           |
//!
//! # Commit policy
//!
//! The backend never commits on its own: the owner of a
//! [`redb::WriteTransaction`] (the MVCC apply thread) decides. Use
//! [`commit_with`] to commit with a [`CommitPolicy`]:
//!
//! * [`CommitPolicy::Visible`] commits with [`redb::Durability::None`]: the
//!   data becomes visible to every read transaction begun afterwards, but
//!   nothing is fsynced. A crash loses it; this is fine because the raft WAL
//!   is the durability layer and the consistent index stored in the same
//!   commit tells replay where to resume.
//! * [`CommitPolicy::Durable`] commits with [`redb::Durability::Immediate`]:
//!   when the call returns, this commit *and every earlier non-durable
//!   commit* are on disk.
//!
//! A typical apply loop commits `Visible` after every batch of entries and
//! `Durable` every 100 ms (or N entries), and always before a raft snapshot
//! or a WAL truncation.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use redb::{Database, Durability, TableDefinition, WriteTransaction};

/// revision bytes (see `retcd_mvcc::Revision`) -> encoded `mvccpb.KeyValue`.
pub const KEY: TableDefinition<&[u8], &[u8]> = TableDefinition::new("key");
/// `"consistent_index"`, `"term"`, `"scheduledCompactRev"`,
/// `"finishedCompactRev"` and anything else a component needs to persist.
pub const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// member id -> encoded member.
pub const MEMBERS: TableDefinition<u64, &[u8]> = TableDefinition::new("members");
/// lease id -> encoded lease.
pub const LEASES: TableDefinition<i64, &[u8]> = TableDefinition::new("lease");

/// Default redb page cache: modest, the working set of a small cluster.
pub const DEFAULT_CACHE_SIZE: usize = 32 * 1024 * 1024;

/// Errors from the backend. redb's many error types are flattened into
/// one message: callers can only report or abort on them.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// Any error from redb or the file system.
    #[error("backend: {0}")]
    Redb(String),
}

impl<E: Into<redb::Error>> From<E> for BackendError {
    fn from(e: E) -> Self {
        BackendError::Redb(e.into().to_string())
    }
}

/// How a write transaction is committed; see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitPolicy {
    /// `Durability::None`: visible to readers, not fsynced.
    Visible,
    /// `Durability::Immediate`: fsynced before returning (with all earlier
    /// `Visible` commits).
    Durable,
}

/// Commits `txn` with the given policy.
pub fn commit_with(mut txn: WriteTransaction, policy: CommitPolicy) -> Result<(), BackendError> {
    let durability = match policy {
        CommitPolicy::Visible => Durability::None,
        CommitPolicy::Durable => Durability::Immediate,
    };
    txn.set_durability(durability)?;
    txn.commit()?;
    Ok(())
}

/// One open database file. Share it as `Arc<Backend>`.
pub struct Backend {
    db: Database,
    path: PathBuf,
    /// Last measured bytes in use; see [`Backend::size_in_use`].
    in_use: AtomicU64,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").field("path", &self.path).finish()
    }
}

impl Backend {
    /// Opens (or creates) the database at `path` and makes sure every
    /// table exists, with a [`DEFAULT_CACHE_SIZE`] page cache.
    pub fn open(path: &Path) -> Result<Backend, BackendError> {
        Self::open_with_cache(path, DEFAULT_CACHE_SIZE)
    }

    /// [`Backend::open`] with an explicit page-cache size in bytes.
    pub fn open_with_cache(path: &Path, cache_size: usize) -> Result<Backend, BackendError> {
        let db = Database::builder()
            .set_cache_size(cache_size)
            .create(path)?;
        let txn = db.begin_write()?;
        {
            txn.open_table(KEY)?;
            txn.open_table(META)?;
            txn.open_table(MEMBERS)?;
            txn.open_table(LEASES)?;
        }
        let backend = Backend {
            db,
            path: path.to_path_buf(),
            in_use: AtomicU64::new(0),
        };
        backend.record_size_in_use(&txn);
        commit_with(txn, CommitPolicy::Durable)?;
        Ok(backend)
    }

    /// The redb database, for the MVCC store and other components.
    pub fn db(&self) -> &Database {
        &self.db
    }

    /// The file this backend lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size of the database file in bytes (etcd's `dbSize`).
    pub fn size(&self) -> u64 {
        std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }

    /// Best-effort bytes in use (etcd's `dbSizeInUse`): redb's allocated
    /// pages times the page size, i.e. the file minus its free pages.
    ///
    /// redb only reports this from a write transaction. When no writer is
    /// active this measures now; otherwise it returns the value last
    /// recorded, either by an earlier call or by a writer that called
    /// [`Backend::record_size_in_use`] before committing.
    pub fn size_in_use(&self) -> u64 {
        if let Ok(txn) = self.db.try_begin_write() {
            self.record_size_in_use(&txn);
            let _ = txn.abort();
        }
        self.in_use.load(Ordering::Relaxed)
    }

    /// Records the bytes in use as seen by `txn` (cheap: reads counters).
    pub fn record_size_in_use(&self, txn: &WriteTransaction) {
        if let Ok(stats) = txn.stats() {
            let bytes = stats.allocated_pages() * stats.page_size() as u64;
            self.in_use.store(bytes, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{ReadableDatabase, ReadableTable};

    #[test]
    fn test_backend_open_creates_tables() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let b = Backend::open(&path).unwrap();
        assert!(b.size() > 0);
        assert!(b.size_in_use() > 0);
        assert!(b.size_in_use() <= b.size());
        let r = b.db().begin_read().unwrap();
        assert_eq!(r.open_table(KEY).unwrap().iter().unwrap().count(), 0);
        r.open_table(META).unwrap();
        r.open_table(MEMBERS).unwrap();
        r.open_table(LEASES).unwrap();
    }

    #[test]
    fn test_backend_visible_then_durable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        {
            let b = Backend::open(&path).unwrap();
            let txn = b.db().begin_write().unwrap();
            txn.open_table(META)
                .unwrap()
                .insert("a", b"1".as_slice())
                .unwrap();
            commit_with(txn, CommitPolicy::Visible).unwrap();
            // visible to a new reader at once
            let r = b.db().begin_read().unwrap();
            let v = r
                .open_table(META)
                .unwrap()
                .get("a")
                .unwrap()
                .unwrap()
                .value()
                .to_vec();
            assert_eq!(v, b"1");
            let txn = b.db().begin_write().unwrap();
            txn.open_table(META)
                .unwrap()
                .insert("b", b"2".as_slice())
                .unwrap();
            commit_with(txn, CommitPolicy::Durable).unwrap();
        }
        let b = Backend::open(&path).unwrap();
        let r = b.db().begin_read().unwrap();
        let t = r.open_table(META).unwrap();
        assert_eq!(t.get("a").unwrap().unwrap().value(), b"1");
        assert_eq!(t.get("b").unwrap().unwrap().value(), b"2");
    }
}
