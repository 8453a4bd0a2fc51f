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
//! The MVCC store keeps applied `key` rows in memory (its memtable) and
//! writes them with a `Durable` commit every 100 ms (or N entries), and
//! always before a raft snapshot or a WAL truncation; `Visible` commits
//! are for batches that write other tables and for the compactor.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;
use redb::{
    Database, Durability, ReadOnlyTable, ReadTransaction, TableDefinition, TableHandle,
    WriteTransaction,
};

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

impl CommitPolicy {
    /// `Durable` if `durable`, else `Visible`.
    pub fn durable_if(durable: bool) -> CommitPolicy {
        if durable {
            CommitPolicy::Durable
        } else {
            CommitPolicy::Visible
        }
    }
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
    // Field order matters: the table before the transaction, the
    // transaction before the database.
    /// The table [`ReadSnapshot::hot_table`] keeps open.
    hot: OnceLock<Arc<ReadOnlyTable<&'static [u8], &'static [u8]>>>,
    txn: ReadTransaction,
    _db: Arc<Database>,
}

/// A byte table, as [`ReadSnapshot::hot_table`] opens it.
pub type BytesTable = TableDefinition<'static, &'static [u8], &'static [u8]>;

impl ReadSnapshot {
    /// `def`, opened on first use and kept open for the snapshot's life,
    /// shared by every reader of it: for the one table a store reads on
    /// every request (MVCC's `key`). Opening a table walks the snapshot's
    /// table tree and checks the table's type: 2.0k instructions, 5 % of a
    /// serializable read of one key. Every caller passes the same `def`.
    pub fn hot_table(
        &self,
        def: BytesTable,
    ) -> Result<Arc<ReadOnlyTable<&'static [u8], &'static [u8]>>, redb::TableError> {
        if let Some(t) = self.hot.get() {
            debug_assert_eq!(t.name(), def.name(), "one hot table per snapshot");
            return Ok(t.clone());
        }
        let t = Arc::new(self.txn.open_table(def)?);
        Ok(self.hot.get_or_init(|| t).clone())
    }
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
    /// Bytes in use, last measured (or estimated at open and after a
    /// swap); see [`Backend::size_in_use`]. Shared with the measuring
    /// thread.
    in_use: Arc<InUse>,
    /// File size last read by [`Backend::size_cached`].
    size: AtomicU64,
    /// When `size` was read (ms since `opened`; 0 = never).
    size_at_ms: AtomicU64,
    opened: std::time::Instant,
}

/// How stale [`Backend::size_cached`] may be.
pub const SIZE_REFRESH: std::time::Duration = std::time::Duration::from_millis(100);

/// How often [`Backend::size_in_use`] measures at most; and at most once
/// per [`IN_USE_DUTY`] times the last measurement's duration.
pub const IN_USE_REFRESH: std::time::Duration = std::time::Duration::from_secs(10);
/// See [`IN_USE_REFRESH`]: a walk that took 1 s runs at most every 50 s.
const IN_USE_DUTY: u32 = 50;

/// [`Backend::size_in_use`]'s state; every field is an atomic (no lock):
/// callers read `bytes`, one measuring thread at a time writes it.
#[derive(Default)]
struct InUse {
    bytes: AtomicU64,
    /// When the last measurement started (ms since `opened`; 0 = never).
    at_ms: AtomicU64,
    /// How long the last measurement took, ms.
    took_ms: AtomicU64,
    /// A measuring thread is running.
    measuring: AtomicBool,
    /// Bumped by [`Backend::swap`]: a measurement of the file before it
    /// is not stored.
    file_gen: AtomicU64,
}

/// How long a database replaced by a defrag stays open for callers that
/// took [`Backend::db`] just before the swap (their transactions are
/// short); readers with a [`ReadSnapshot`] keep it open themselves.
const RETIRE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Longest a dropped backend waits for its background measurement of the
/// bytes in use (which holds the database open) to finish.
const MEASURE_DROP_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

impl Drop for Backend {
    /// Waits for a running measurement ([`Backend::size_in_use`]), so the
    /// file is closed (and its lock released) once the last handle is
    /// gone: reopening the path at once then succeeds. The walk is short
    /// (milliseconds per 100k rows) and a server closes its backend with
    /// [`Backend::close`] before dropping it, so this wait is only ever
    /// on an in-memory placeholder there.
    fn drop(&mut self) {
        let deadline = std::time::Instant::now() + MEASURE_DROP_WAIT;
        while self.in_use.measuring.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
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
            in_use: Arc::new(InUse::default()),
            size: AtomicU64::new(0),
            size_at_ms: AtomicU64::new(0),
            opened: std::time::Instant::now(),
        };
        commit_with(txn, CommitPolicy::Durable)?;
        // Until measured: every written byte (an upper bound).
        backend
            .in_use
            .bytes
            .store(backend.size(), Ordering::Relaxed);
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
        Ok(ReadSnapshot {
            hot: OnceLock::new(),
            txn,
            _db: db,
        })
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
        // A new file: its written bytes until measured, then measure.
        self.in_use.file_gen.fetch_add(1, Ordering::SeqCst);
        self.in_use.bytes.store(0, Ordering::Relaxed);
        self.size_at_ms.store(0, Ordering::Relaxed);
        let size = self.size();
        self.in_use.bytes.store(size, Ordering::Relaxed);
        self.in_use.at_ms.store(0, Ordering::Relaxed);
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

    /// Bytes of the database file on disk (etcd's `dbSize`, the size the
    /// quota is checked against).
    ///
    /// Not the file's length: redb grows its file by doubling it (below
    /// 4 GiB, then by 4 GiB regions) with `set_len`, so a store just past
    /// 1 GiB has a 2 GiB file whose second half was never written (sparse).
    /// Against the length, the default 2 GiB quota raised NOSPACE with
    /// ~1.1 GiB in the file. etcd's `dbSize` is bbolt's high-water mark,
    /// the pages ever used until a defrag; the file's allocated blocks are
    /// the same thing here (redb allocates the lowest free pages first,
    /// freed pages are reused, a defrag writes a compact file). So: the
    /// allocated bytes, never above the length (preallocating file
    /// systems) nor below the bytes last measured in use (pages still in
    /// the writer's buffer); on a file system without sparse files the
    /// blocks are the whole length, as before.
    pub fn size(&self) -> u64 {
        let size = std::fs::metadata(&self.path)
            .map(|m| {
                use std::os::unix::fs::MetadataExt;
                let written = (m.blocks() * 512).max(self.in_use.bytes.load(Ordering::Relaxed));
                m.len().min(written)
            })
            .unwrap_or(0);
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

    /// Bytes in use (etcd's `dbSizeInUse`): the pages of every table's
    /// B-tree (redb's table stats: stored, metadata and fragmented bytes),
    /// i.e. the written file minus its free pages and redb's own small
    /// system tables. Until the first measurement after an open or a
    /// defrag: the written bytes.
    ///
    /// Measuring walks every page, ~1 s at 800 MB. redb's database-wide
    /// `stats()` needs a write transaction, which would stop every writer
    /// for the walk (it did: a Status or a metrics scrape paused the puts
    /// for ~1 s on an 800 MB store); the tables' stats walk a read snapshot
    /// instead, on a thread of its own, so neither writers nor the caller
    /// wait. This returns the last value at once and starts a measurement
    /// when one is due: [`IN_USE_REFRESH`] after the last, and
    /// [`IN_USE_DUTY`] times its duration.
    pub fn size_in_use(&self) -> u64 {
        let st = &self.in_use;
        let now_ms = (self.opened.elapsed().as_millis() as u64).max(1);
        let last = st.at_ms.load(Ordering::Relaxed);
        let gap = (IN_USE_REFRESH.as_millis() as u64)
            .max(st.took_ms.load(Ordering::Relaxed) * u64::from(IN_USE_DUTY));
        let due = last == 0 || now_ms.saturating_sub(last) >= gap;
        if due && !st.measuring.swap(true, Ordering::SeqCst) {
            st.at_ms.store(now_ms, Ordering::Relaxed);
            let (db, st) = (self.db(), st.clone());
            let gen = st.file_gen.load(Ordering::SeqCst);
            let spawned = std::thread::Builder::new()
                .name("backend-in-use".into())
                .spawn(move || {
                    let started = std::time::Instant::now();
                    match tables_bytes(&db) {
                        Ok(bytes) if st.file_gen.load(Ordering::SeqCst) == gen => {
                            st.bytes.store(bytes, Ordering::Relaxed);
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::debug!(error = %e, "backend: measuring the bytes in use")
                        }
                    }
                    st.took_ms
                        .store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                    // the file is closed before a dropped backend stops waiting
                    drop(db);
                    st.measuring.store(false, Ordering::SeqCst);
                });
            if spawned.is_err() {
                self.in_use.measuring.store(false, Ordering::SeqCst);
            }
        }
        self.in_use.bytes.load(Ordering::Relaxed)
    }

    /// Measures the bytes in use now, in the caller's thread (tests, tools).
    pub fn measure_size_in_use(&self) -> Result<u64, BackendError> {
        let bytes = tables_bytes(&self.db())?;
        self.in_use.bytes.store(bytes, Ordering::Relaxed);
        Ok(bytes)
    }
}

/// The bytes of every table's pages, walked on a read snapshot of `db`.
fn tables_bytes(db: &Database) -> Result<u64, BackendError> {
    use redb::{ReadableDatabase, ReadableTableMetadata};
    let r = db.begin_read()?;
    let mut total = 0u64;
    for handle in r.list_tables()? {
        let t = r.open_untyped_table(handle)?;
        let st = t.stats()?;
        total += st.stored_bytes() + st.metadata_bytes() + st.fragmented_bytes();
    }
    Ok(total)
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
        // the written bytes until the first measurement (started by this
        // call, on a thread of its own) lands, then what it measured (a
        // fresh store's tables hold no page: 0)
        let first = b.size_in_use();
        assert!(
            first == b.size() || first == b.measure_size_in_use().unwrap(),
            "{first}"
        );
        assert!(b.size_in_use() <= b.size());
        let r = b.db().begin_read().unwrap();
        assert_eq!(r.open_table(KEY).unwrap().iter().unwrap().count(), 0);
        r.open_table(META).unwrap();
        r.open_table(MEMBERS).unwrap();
        r.open_table(LEASES).unwrap();
    }

    /// redb doubles its file as it grows; the size is what was written,
    /// so a file just past a doubling is not counted at its new length.
    #[test]
    fn test_size_is_the_bytes_written_not_the_doubled_length() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let b = Backend::open(&path).unwrap();
        let value = vec![7u8; 1000];
        let mut written = 0u64;
        let mut sparse_seen = false;
        for batch in 0..400u64 {
            let txn = b.db().begin_write().unwrap();
            {
                let mut t = txn.open_table(KEY).unwrap();
                for i in 0..100u64 {
                    let k = (batch * 100 + i).to_be_bytes();
                    t.insert(k.as_slice(), value.as_slice()).unwrap();
                }
            }
            commit_with(txn, CommitPolicy::Durable).unwrap();
            written += 100 * 1008;
            let m = std::fs::metadata(&path).unwrap();
            let size = b.size();
            assert!(size <= m.len(), "size {size} > length {}", m.len());
            assert!(size >= written, "size {size} < {written} bytes written");
            if m.len() > size + size / 4 {
                // past a doubling: a quarter or more never written
                sparse_seen = true;
                assert_eq!(
                    size,
                    (m.blocks() * 512).max(b.in_use.bytes.load(Ordering::Relaxed))
                );
            }
        }
        // (the test's file system has sparse files: tmpfs, ext4, xfs)
        assert!(sparse_seen, "the file never doubled past what was written");
    }

    /// The bytes in use are measured on a read snapshot in the background:
    /// the call returns at once, a writer can commit meanwhile, and the
    /// value drops below the size once most rows are deleted.
    #[test]
    fn test_size_in_use_is_measured_without_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let b = Backend::open(&dir.path().join("db")).unwrap();
        let value = vec![1u8; 1000];
        for batch in 0..20u64 {
            let txn = b.db().begin_write().unwrap();
            {
                let mut t = txn.open_table(KEY).unwrap();
                for i in 0..500u64 {
                    t.insert((batch * 500 + i).to_be_bytes().as_slice(), value.as_slice())
                        .unwrap();
                }
            }
            commit_with(txn, CommitPolicy::Durable).unwrap();
        }
        let full = b.measure_size_in_use().unwrap();
        assert!(full >= 10_000 * 1000, "{full}");
        let txn = b.db().begin_write().unwrap();
        {
            let mut t = txn.open_table(KEY).unwrap();
            for i in 0..9_500u64 {
                t.remove(i.to_be_bytes().as_slice()).unwrap();
            }
        }
        commit_with(txn, CommitPolicy::Durable).unwrap();
        // a background measurement is due (none yet since open)
        b.in_use.at_ms.store(0, Ordering::Relaxed);
        // the writer is free while the caller holds one (the walk is on a
        // read snapshot): this would wait forever on a write transaction
        let w = b.db().begin_write().unwrap();
        let _ = b.size_in_use();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while b.in_use.measuring.load(Ordering::SeqCst) {
            assert!(
                std::time::Instant::now() < deadline,
                "measurement never finished"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        drop(w);
        let after = b.size_in_use();
        assert!(
            after < full / 4,
            "in use {after} after deleting 95 % of {full}"
        );
        assert!(after <= b.size());
        assert!(
            b.size() >= full,
            "the file's written bytes stay until a defrag"
        );
    }

    /// Dropping the last handle releases the file even while a background
    /// measurement of the bytes in use is running: the next open of the
    /// same path does not find it still open.
    #[test]
    fn test_drop_releases_the_file_while_measuring() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        {
            let b = Backend::open(&path).unwrap();
            let txn = b.db().begin_write().unwrap();
            {
                let mut t = txn.open_table(KEY).unwrap();
                for i in 0..20_000u64 {
                    t.insert(i.to_be_bytes().as_slice(), [3u8; 100].as_slice())
                        .unwrap();
                }
            }
            commit_with(txn, CommitPolicy::Visible).unwrap();
        }
        for round in 0..20 {
            let b = Backend::open(&path).unwrap();
            b.in_use.at_ms.store(0, Ordering::Relaxed);
            let _ = b.size_in_use();
            drop(b);
            if let Err(e) = Backend::open(&path) {
                panic!("round {round}: reopening right after the drop: {e}");
            }
        }
    }

    /// A snapshot opens its hot table once and keeps reading its own
    /// commit through it: a later commit shows in a new snapshot only.
    #[test]
    fn test_a_snapshot_keeps_its_hot_table_and_its_commit() {
        let dir = tempfile::tempdir().unwrap();
        let b = Backend::open(&dir.path().join("db")).unwrap();
        let put = |v: &[u8]| {
            let txn = b.db().begin_write().unwrap();
            txn.open_table(KEY)
                .unwrap()
                .insert(b"k".as_slice(), v)
                .unwrap();
            commit_with(txn, CommitPolicy::Visible).unwrap();
        };
        put(b"1");
        let old = b.begin_read().unwrap();
        let first = old.hot_table(KEY).unwrap();
        assert!(
            Arc::ptr_eq(&first, &old.hot_table(KEY).unwrap()),
            "opened once"
        );
        put(b"2");
        let get = |s: &ReadSnapshot| {
            s.hot_table(KEY)
                .unwrap()
                .get(b"k".as_slice())
                .unwrap()
                .unwrap()
                .value()
                .to_vec()
        };
        assert_eq!(get(&old), b"1");
        assert_eq!(get(&b.begin_read().unwrap()), b"2");
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
