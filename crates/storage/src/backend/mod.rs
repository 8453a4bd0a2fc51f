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
use std::sync::Arc;

use parking_lot::RwLock;
use redb::{Database, Durability, ReadTransaction, TableDefinition, WriteTransaction};

pub mod defrag;

/// revision bytes (see `retcd_mvcc::Revision`) -> encoded `mvccpb.KeyValue`.
pub const KEY: TableDefinition<&[u8], &[u8]> = TableDefinition::new("key");
/// `"consistent_index"`, `"term"`, `"scheduledCompactRev"`,
/// `"finishedCompactRev"` and anything else a component needs to persist.
pub const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// member id -> encoded member.
pub const MEMBERS: TableDefinition<u64, &[u8]> = TableDefinition::new("members");
/// lease id -> encoded lease.
pub const LEASES: TableDefinition<i64, &[u8]> = TableDefinition::new("lease");
/// encoded `etcdserverpb.AlarmMember` -> empty (etcd's `alarm` bucket, same
/// keys: one entry per raised alarm).
pub const ALARM: TableDefinition<&[u8], &[u8]> = TableDefinition::new("alarm");
/// The auth store (etcd's `auth`, `authUsers` and `authRoles` buckets in
/// one table): `"enabled"` -> [0|1], `"revision"` -> u64 BE, `"u/" ++ name`
/// -> encoded `authpb.User`, `"r/" ++ name` -> encoded `authpb.Role`.
pub const AUTH: TableDefinition<&[u8], &[u8]> = TableDefinition::new("auth");
/// [`AUTH`] key: auth enabled, `[1]` or `[0]` (etcd's `auth/authEnabled`).
pub const AUTH_ENABLED_KEY: &[u8] = b"enabled";
/// [`AUTH`] key: the auth revision, u64 BE (etcd's `auth/authRevision`).
pub const AUTH_REVISION_KEY: &[u8] = b"revision";
/// [`AUTH`] key prefix of a user (etcd's `authUsers` bucket).
pub const AUTH_USER_PREFIX: &[u8] = b"u/";
/// [`AUTH`] key prefix of a role (etcd's `authRoles` bucket).
pub const AUTH_ROLE_PREFIX: &[u8] = b"r/";

/// Default redb page cache: small. Reads that miss it are served from the
/// OS page cache (a pread); 32 MiB of it made up a third of the server's RSS
/// after 100k puts (see docs/benchmarks.md).
pub const DEFAULT_CACHE_SIZE: usize = 4 * 1024 * 1024;

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

/// `--unsafe-no-fsync` (process-wide, as etcd's flag, which also sets
/// bbolt's `NoSync`): durable commits are made visible only, never
/// fsynced. A crash or power loss then loses what the disk had not
/// written by itself.
static UNSAFE_NO_FSYNC: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Sets `--unsafe-no-fsync` for every backend of this process.
pub fn set_unsafe_no_fsync(on: bool) {
    UNSAFE_NO_FSYNC.store(on, Ordering::Relaxed);
}

/// Commits `txn` with the given policy.
pub fn commit_with(mut txn: WriteTransaction, policy: CommitPolicy) -> Result<(), BackendError> {
    let durability = match policy {
        CommitPolicy::Visible => Durability::None,
        CommitPolicy::Durable if UNSAFE_NO_FSYNC.load(Ordering::Relaxed) => Durability::None,
        CommitPolicy::Durable => Durability::Immediate,
    };
    txn.set_durability(durability)?;
    txn.commit()?;
    Ok(())
}

/// A read transaction that keeps its database open: after a defrag swaps
/// the file, readers that began on the old one finish on it, and the old
/// database closes when the last of them is dropped.
pub struct ReadSnapshot {
    // Field order matters: the transaction is dropped before the database.
    txn: ReadTransaction,
    _db: Arc<Database>,
}

impl std::ops::Deref for ReadSnapshot {
    type Target = ReadTransaction;
    fn deref(&self) -> &ReadTransaction {
        &self.txn
    }
}

/// One open database file. Share it as `Arc<Backend>`.
///
/// `db` (RwLock) protects which redb database is current; it changes only
/// in [`Backend::swap`], at the end of an online defrag, while the MVCC
/// store's batch lock is held (so no write transaction is open). Held only
/// to clone the `Arc`.
pub struct Backend {
    db: RwLock<Arc<Database>>,
    path: PathBuf,
    /// Last measured bytes in use; see [`Backend::size_in_use`].
    in_use: AtomicU64,
    /// When `in_use` was last measured (ms since `opened`; 0 = never).
    in_use_at_ms: AtomicU64,
    /// File size last read by [`Backend::size_cached`].
    size: AtomicU64,
    /// When `size` was read (ms since `opened`; 0 = never).
    size_at_ms: AtomicU64,
    opened: std::time::Instant,
}

/// How stale [`Backend::size_cached`] may be.
pub const SIZE_REFRESH: std::time::Duration = std::time::Duration::from_millis(100);

/// How often [`Backend::size_in_use`] measures at most.
pub const IN_USE_REFRESH: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a database replaced by a defrag stays open for callers that
/// took [`Backend::db`] just before the swap (their transactions are
/// short); readers with a [`ReadSnapshot`] keep it open themselves.
const RETIRE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

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
        let repairing = std::sync::atomic::AtomicBool::new(false);
        let started = std::time::Instant::now();
        let db = Database::builder()
            .set_cache_size(cache_size)
            .set_repair_callback(move |s| {
                // redb rebuilds its allocator state after a process that
                // did not close the file (a crash, or an exit without
                // dropping the database): say so, it reads the whole file
                if !repairing.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(
                        progress = s.progress(),
                        "backend: repairing the database file (it was not closed cleanly)"
                    );
                }
            })
            .create(path)?;
        if started.elapsed() > std::time::Duration::from_millis(200) {
            tracing::info!(took = ?started.elapsed(), "backend: opened");
        }
        let txn = db.begin_write()?;
        create_tables(&txn)?;
        let backend = Backend {
            db: RwLock::new(Arc::new(db)),
            path: path.to_path_buf(),
            in_use: AtomicU64::new(0),
            in_use_at_ms: AtomicU64::new(0),
            size: AtomicU64::new(0),
            size_at_ms: AtomicU64::new(0),
            opened: std::time::Instant::now(),
        };
        backend.record_size_in_use(&txn);
        commit_with(txn, CommitPolicy::Durable)?;
        Ok(backend)
    }

    /// The current redb database, for the MVCC store and other components.
    /// Take a transaction from it at once; do not keep the `Arc` (a defrag
    /// may replace the database).
    pub fn db(&self) -> Arc<Database> {
        self.db.read().clone()
    }

    /// A read transaction on the current database that keeps it open.
    pub fn begin_read(&self) -> Result<ReadSnapshot, BackendError> {
        use redb::ReadableDatabase;
        let db = self.db();
        let txn = db.begin_read()?;
        Ok(ReadSnapshot { txn, _db: db })
    }

    /// Replaces the current database with `db`, whose file has already been
    /// renamed over [`Backend::path`]. The caller must guarantee that no
    /// write transaction is open on the current database (the MVCC batch
    /// lock) and that `db` holds the same committed data.
    pub fn swap(&self, db: Database) {
        let old = std::mem::replace(&mut *self.db.write(), Arc::new(db));
        // Closing the old (unlinked) file frees its disk space.
        let _ = std::thread::Builder::new()
            .name("backend-retire".into())
            .spawn(move || {
                std::thread::sleep(RETIRE_GRACE);
                drop(old);
            });
        // A new file: measure again now.
        self.in_use_at_ms.store(0, Ordering::Relaxed);
        self.size_at_ms.store(0, Ordering::Relaxed);
        let _ = self.size_in_use();
    }

    /// Closes the database file cleanly (redb then reopens it without its
    /// repair pass, which reads the whole file), at shutdown, after the last
    /// write: the caller guarantees no write transaction is open or will
    /// begin. The backend is left with an empty in-memory database without
    /// tables, so a late read fails (`table does not exist`) rather than
    /// answering from missing data. `release` runs once the file's database
    /// is detached, to drop the caller's own long-lived read snapshots;
    /// then the close waits up to `wait` for other holders to finish.
    /// Returns whether the file was closed (false: still held; redb repairs
    /// it at the next open, as after a crash).
    pub fn close(
        &self,
        wait: std::time::Duration,
        release: impl FnOnce(),
    ) -> Result<bool, BackendError> {
        let placeholder =
            Database::builder().create_with_backend(redb::backends::InMemoryBackend::new())?;
        let mut old = std::mem::replace(&mut *self.db.write(), Arc::new(placeholder));
        release();
        let deadline = std::time::Instant::now() + wait;
        loop {
            match Arc::try_unwrap(old) {
                Ok(db) => {
                    db.close()?;
                    return Ok(true);
                }
                Err(held) if std::time::Instant::now() < deadline => {
                    old = held;
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(_) => return Ok(false),
            }
        }
    }

    /// The file this backend lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size of the database file in bytes (etcd's `dbSize`).
    pub fn size(&self) -> u64 {
        let size = std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0);
        self.size.store(size, Ordering::Relaxed);
        let now_ms = self.opened.elapsed().as_millis() as u64;
        self.size_at_ms.store(now_ms.max(1), Ordering::Relaxed);
        size
    }

    /// [`Backend::size`] read at most every [`SIZE_REFRESH`]: for the quota
    /// check made before every write, which would otherwise stat the file
    /// once per request (the file grows in steps; etcd's check also reads a
    /// size recorded at the last commit).
    pub fn size_cached(&self) -> u64 {
        let at = self.size_at_ms.load(Ordering::Relaxed);
        let now_ms = self.opened.elapsed().as_millis() as u64;
        if at == 0 || now_ms.saturating_sub(at) >= SIZE_REFRESH.as_millis() as u64 {
            return self.size();
        }
        self.size.load(Ordering::Relaxed)
    }

    /// Best-effort bytes in use (etcd's `dbSizeInUse`): redb's allocated
    /// pages times the page size, i.e. the file minus its free pages.
    ///
    /// redb only reports this from a write transaction. When no writer is
    /// active this measures now; otherwise it returns the value last
    /// recorded, either by an earlier call or by a writer that called
    /// [`Backend::record_size_in_use`] before committing.
    ///
    /// Measuring walks every page of the B-tree (redb's `stats()`) under a
    /// write transaction, so it is never done on the commit path and at
    /// most once per [`IN_USE_REFRESH`]; in between the last value is
    /// returned.
    pub fn size_in_use(&self) -> u64 {
        let now_ms = self.opened.elapsed().as_millis() as u64;
        let last = self.in_use_at_ms.load(Ordering::Relaxed);
        let due = last == 0 || now_ms.saturating_sub(last) >= IN_USE_REFRESH.as_millis() as u64;
        if due {
            // Only when the writer is free; a busy writer means try again
            // on the next call, not a stale value for another interval.
            if let Ok(txn) = self.db().try_begin_write() {
                self.record_size_in_use(&txn);
                let _ = txn.abort();
                self.in_use_at_ms.store(now_ms.max(1), Ordering::Relaxed);
            }
        }
        self.in_use.load(Ordering::Relaxed)
    }

    /// Records the bytes in use as seen by `txn` (walks the whole tree).
    pub fn record_size_in_use(&self, txn: &WriteTransaction) {
        if let Ok(stats) = txn.stats() {
            let bytes = stats.allocated_pages() * stats.page_size() as u64;
            self.in_use.store(bytes, Ordering::Relaxed);
        }
    }
}

/// Creates every table of the backend (idempotent).
pub fn create_tables(txn: &WriteTransaction) -> Result<(), BackendError> {
    txn.open_table(KEY)?;
    txn.open_table(META)?;
    txn.open_table(MEMBERS)?;
    txn.open_table(LEASES)?;
    txn.open_table(ALARM)?;
    txn.open_table(AUTH)?;
    Ok(())
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
