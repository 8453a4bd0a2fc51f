//! [`KvStore`]: the MVCC key-value store over the backend.
//!
//! # On-disk format (backend table `key`, etcd's `key` bucket)
//!
//! ```text
//! key:   revision bytes  main(8, BE) '_' sub(8, BE) [ 't' if a tombstone ]
//! value: prost-encoded mvccpb.KeyValue; a tombstone stores only `key`
//! ```
//!
//! Table `meta` holds `consistent_index` and `term` (u64, 8 bytes BE) and
//! `scheduledCompactRev` / `finishedCompactRev` (17-byte revision bytes of
//! `(rev, 0)`). The scheduled one is written by the batch that applies a
//! compaction, the finished one by the background compactor's last
//! deletion batch (`kvstore_compaction`); scheduled > finished after a
//! crash mid-deletion, and the deletion resumes at open.
//!
//! # Threads, locks and visibility
//!
//! One thread (raft apply) writes through a [`WriteBatch`]; any thread reads.
//!
//! * `batch_lock` (Mutex): at most one `WriteBatch`, `restore_from` or
//!   compactor deletion batch at a time (each is one redb write
//!   transaction). Taken first.
//! * `index` (RwLock<TreeIndex>): the in-memory key index. The batch adds
//!   its revisions to it as it goes; they are above the published revision,
//!   so readers, which always ask for revisions `<= published`, do not see
//!   them. Index *compaction* is the compactor's, chunk by chunk, after
//!   the compaction revision is published. Taken second.
//! * `published` (RwLock<Published>): the committed state readers use —
//!   current and compaction revisions, consistent index, and a redb read
//!   transaction opened right after the commit that produced them. Taken
//!   last, and only briefly (clone out).
//!
//! A commit: redb commit → open a read transaction → lock `index` (write)
//! → lock `published` (write) → swap → queue compactions. A
//! reader locks `index` (read), clones `published`, collects revisions,
//! unlocks, then reads values from its own snapshot; the pair (index view,
//! snapshot) is therefore always from the same commit. A batch dropped
//! without commit rebuilds the index from the published snapshot.
//!
//! The compactor thread (`mvcc-compactor`) first compacts the index, 10 000
//! keys per hold of its write lock (readers at or above the published
//! compaction revision read the same either way); then takes
//! `batch_lock`, deletes one batch of rows at or below the compaction
//! revision (which no index view points at any more), commits, and swaps
//! `published.snapshot` (nothing else of `published` changes).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use redb::{ReadTransaction, ReadableTable};
use retcd_api::etcdserverpb::{RangeRequest, RangeResponse};
use retcd_storage::backend::{
    commit_with, Backend, CommitPolicy, ReadSnapshot, ALARM, AUTH, KEY, LEASES, MEMBERS, META,
};

use crate::index::TreeIndex;
use crate::kvstore_compaction::{CompactionConfig, CompactionMark, Compactor, CompactorCtx, Job};
use crate::kvstore_txn::WriteBatch;
use crate::memtable::{self, MemRows, RowSource, RowsAt, Writer};
use crate::range;
use crate::revision::Revision;
use crate::MvccError;

/// META key of the consistent (raft) index.
pub const CONSISTENT_INDEX_KEY: &str = "consistent_index";
/// META key of the raft term of the consistent index.
pub const TERM_KEY: &str = "term";
/// META key of the scheduled compaction revision.
pub const SCHEDULED_COMPACT_KEY: &str = "scheduledCompactRev";
/// META key of the finished compaction revision.
pub const FINISHED_COMPACT_KEY: &str = "finishedCompactRev";

/// The committed state readers see; see the module documentation.
#[derive(Clone)]
pub(crate) struct Published {
    /// Current store revision (1 for an empty store, as in etcd).
    pub(crate) rev: i64,
    /// Compaction revision (the scheduled one: its rows may still be
    /// being deleted), -1 if never compacted (etcd's `compactMainRev`).
    pub(crate) compact_rev: i64,
    pub(crate) consistent_index: u64,
    pub(crate) term: u64,
    pub(crate) snapshot: Arc<ReadSnapshot>,
    /// Rows being written to redb in the background (see `memtable`).
    pub(crate) frozen: Option<Arc<MemRows>>,
    /// Committed rows not yet in `snapshot` (see `memtable`).
    pub(crate) mem: Arc<MemRows>,
    /// Rows at or below this main revision are in `snapshot`, those above
    /// it in `mem`.
    pub(crate) flushed_rev: i64,
    /// The compactor's progress as of `snapshot` (for online defrag).
    pub(crate) compaction_mark: CompactionMark,
}

impl Published {
    /// The view's `key` table rows (see `memtable`).
    pub(crate) fn rows_at(&self) -> RowsAt {
        RowsAt {
            snapshot: self.snapshot.clone(),
            frozen: self.frozen.clone(),
            mem: self.mem.clone(),
            flushed_rev: self.flushed_rev,
            rev: self.rev,
        }
    }
}

/// What [`load`] reads back from the backend.
pub(crate) struct Loaded {
    pub(crate) index: TreeIndex,
    pub(crate) rev: i64,
    pub(crate) compact_rev: i64,
    /// Finished compaction revision (-1: none).
    pub(crate) finished_compact_rev: i64,
    /// A compaction whose deletion did not finish: its revision and keep
    /// set (the index is already compacted at it).
    pub(crate) resume: Option<(i64, HashSet<Revision>)>,
    pub(crate) consistent_index: u64,
    pub(crate) term: u64,
}

/// The MVCC store; share it as `Arc<KvStore>`.
pub struct KvStore {
    pub(crate) backend: Arc<Backend>,
    pub(crate) batch_lock: Arc<Mutex<()>>,
    pub(crate) index: Arc<RwLock<TreeIndex>>,
    pub(crate) published: Arc<RwLock<Published>>,
    /// Bumped by every `restore_from` (an online defrag started before a
    /// restore must not swap in the old data; queued compactions of the
    /// old data are dropped).
    pub(crate) restores: Arc<AtomicU64>,
    /// One online defrag at a time (taken before `batch_lock`).
    pub(crate) defrag_lock: Mutex<()>,
    /// Deletes compacted revisions in the background.
    pub(crate) compactor: Compactor,
    /// Writes the memtable to redb in the background.
    pub(crate) writer: Arc<Writer>,
    /// Watchers that asked for `prev_kv` (kept by the watchable store):
    /// while there are none, an overwriting put does not read the value
    /// it replaces.
    pub(crate) prev_kv_watchers: Arc<AtomicUsize>,
    /// `--max-range-response-bytes`: the largest response a read served
    /// outside raft may build (ranges and read-only txns).
    pub(crate) max_response_bytes: AtomicUsize,
}

impl std::fmt::Debug for KvStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = self.published.read();
        f.debug_struct("KvStore")
            .field("rev", &p.rev)
            .field("compact_rev", &p.compact_rev)
            .field("consistent_index", &p.consistent_index)
            .finish()
    }
}

fn meta_u64(b: &[u8]) -> Result<u64, MvccError> {
    Ok(u64::from_be_bytes(b.try_into().map_err(|_| {
        MvccError::Backend(format!("invalid u64 in meta: {b:?}"))
    })?))
}

/// Rebuilds the index and reads the revisions from a committed snapshot,
/// as etcd's `restore`: scan `key` in revision order; a tombstone ends the
/// key's generation; the first surviving revision of a generation restores
/// it from the stored create revision and version.
pub(crate) fn load(txn: &ReadTransaction) -> Result<Loaded, MvccError> {
    let meta = txn.open_table(META)?;
    let get = |name: &str| -> Result<Option<Vec<u8>>, MvccError> {
        Ok(meta.get(name)?.map(|v| v.value().to_vec()))
    };
    let compact_key = |name: &str| -> Result<i64, MvccError> {
        Ok(match get(name)? {
            Some(b) => {
                Revision::parse(&b)
                    .ok_or_else(|| MvccError::Backend(format!("invalid {name}")))?
                    .0
                    .main
            }
            None => -1,
        })
    };
    let finished_compact_rev = compact_key(FINISHED_COMPACT_KEY)?;
    let scheduled = compact_key(SCHEDULED_COMPACT_KEY)?;
    let consistent_index = get(CONSISTENT_INDEX_KEY)?
        .map(|b| meta_u64(&b))
        .transpose()?
        .unwrap_or(0);
    let term = get(TERM_KEY)?
        .map(|b| meta_u64(&b))
        .transpose()?
        .unwrap_or(0);

    let mut index = TreeIndex::new();
    let mut rev = 1;
    let mut last = Revision::new(0, -1);
    let table = txn.open_table(KEY)?;
    for entry in table.iter()? {
        let (k, v) = entry?;
        let (r, tombstone) = Revision::parse(k.value())
            .ok_or_else(|| MvccError::Backend(format!("invalid revision key {:?}", k.value())))?;
        // Rows come in key order, which is revision order for every
        // revision the store writes (main ≥ 1, sub ≥ 0); anything else is
        // a damaged file or snapshot, refused rather than indexed (the
        // index would take it for a bug and panic).
        if r.main < 1 || r.sub < 0 || r <= last {
            return Err(MvccError::Backend(format!(
                "invalid revision key {:?}: revision {r} after {last}",
                k.value()
            )));
        }
        last = r;
        // the row without its value: no copy of the value per row
        let kv = range::decode_row_head(v.value(), r)?;
        rev = r.main;
        let ki = index.key_index_entry(kv.key);
        if tombstone && ki.generations.is_empty() {
            // The key's only revision left: a compaction at the tombstone
            // kept it (etcd 3.5.18+ restores it, so a watch from there
            // still gets the delete).
            ki.restore_tombstone(r.main, r.sub);
        } else if tombstone {
            // Expected below an unfinished compaction: the rows before the
            // tombstone may be deleted already.
            if ki.tombstone(r.main, r.sub).is_err() && r.main > scheduled {
                tracing::warn!(key = ?kv.key, rev = %r, "mvcc: tombstone of a key with no live generation");
            }
        } else if ki.generations.is_empty() {
            ki.restore(Revision::new(kv.create_revision, 0), r, kv.version);
            ki.set_last_row_len(v.value().len());
        } else {
            ki.put_sized(r.main, r.sub, v.value().len());
        }
    }
    let mut compact_rev = finished_compact_rev;
    let mut resume = None;
    if scheduled > finished_compact_rev {
        // As etcd's restore: the deletion of `scheduled` did not finish.
        // Rows it already removed were not needed to read at `scheduled`,
        // so compacting the rebuilt index there gives the same index as a
        // member that finished.
        let keep = index.compact(scheduled);
        compact_rev = scheduled;
        resume = Some((scheduled, keep));
    }
    if rev < compact_rev {
        rev = compact_rev;
    }
    Ok(Loaded {
        index,
        rev,
        compact_rev,
        finished_compact_rev,
        resume,
        consistent_index,
        term,
    })
}

impl KvStore {
    /// Opens the store over `backend`, rebuilding the index from `key`.
    /// With the default [`CompactionConfig`].
    pub fn open(backend: Arc<Backend>) -> Result<KvStore, MvccError> {
        Self::open_with(backend, CompactionConfig::default())
    }

    /// Opens the store over `backend`, rebuilding the index from `key`,
    /// and resumes an unfinished compaction in the background.
    pub fn open_with(backend: Arc<Backend>, cfg: CompactionConfig) -> Result<KvStore, MvccError> {
        let snapshot = backend.begin_read()?;
        let l = load(&snapshot)?;
        tracing::info!(
            rev = l.rev,
            compact_rev = l.compact_rev,
            keys = l.index.len(),
            "mvcc: restored store"
        );
        let batch_lock = Arc::new(Mutex::new(()));
        let restores = Arc::new(AtomicU64::new(0));
        let index = Arc::new(RwLock::new(l.index));
        let published = Arc::new(RwLock::new(Published {
            rev: l.rev,
            compact_rev: l.compact_rev,
            consistent_index: l.consistent_index,
            term: l.term,
            snapshot: Arc::new(snapshot),
            frozen: None,
            mem: Arc::default(),
            flushed_rev: l.rev,
            compaction_mark: CompactionMark::default(),
        }));
        let writer = Arc::new(Writer::new(backend.clone(), published.clone()));
        let compactor = Compactor::new(
            cfg,
            CompactorCtx {
                writer: writer.clone(),
                backend: backend.clone(),
                batch_lock: batch_lock.clone(),
                index: index.clone(),
                published: published.clone(),
                restores: restores.clone(),
            },
            l.finished_compact_rev,
        );
        let store = KvStore {
            backend,
            batch_lock,
            restores,
            defrag_lock: Mutex::new(()),
            index,
            published,
            compactor,
            writer,
            prev_kv_watchers: Arc::default(),
            max_response_bytes: AtomicUsize::new(usize::MAX),
        };
        if let Some((rev, keep)) = l.resume {
            tracing::info!(
                scheduled_compact_revision = rev,
                finished_compact_revision = l.finished_compact_rev,
                "mvcc: resume scheduled compaction"
            );
            store.compactor.schedule(Job {
                rev,
                keep: Some(keep),
                epoch: 0,
            });
        }
        Ok(store)
    }

    /// The backend this store lives in.
    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }

    /// A Range over the committed state. The response carries a header with
    /// only `revision` set (the current revision), for the server to fill in.
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, MvccError> {
        self.range_with(req, true, self.max_response_bytes())
    }

    fn range_with(
        &self,
        req: &RangeRequest,
        with_count: bool,
        max_bytes: usize,
    ) -> Result<RangeResponse, MvccError> {
        let (plan, at) = {
            let index = self.index.read();
            let (at, compact_rev) = self.view();
            (
                range::plan(&index, req, at.rev, compact_rev, with_count, false)?,
                at,
            )
        };
        range::fetch(&at.open()?, req, plan, max_bytes)
    }

    /// A plain Range ([`range::is_plain_range`]) answered as its stored
    /// rows, to be written out a piece at a time: the revisions are picked
    /// and the rows' sizes read now, the rows themselves when written,
    /// from the same snapshot. Bounded by `--max-range-response-bytes` as
    /// [`KvStore::range`]. The first `read_once` bytes of rows are kept
    /// from the sizing pass (a response within it is read once).
    pub fn range_encoded(
        &self,
        req: &RangeRequest,
        read_once: usize,
    ) -> Result<range::EncodedRange, MvccError> {
        debug_assert!(range::is_plain_range(req));
        let (plan, at) = {
            let index = self.index.read();
            let (at, compact_rev) = self.view();
            (
                range::plan(&index, req, at.rev, compact_rev, true, true)?,
                at,
            )
        };
        range::EncodedRange::new(at, req, plan, self.max_response_bytes(), read_once)
    }

    /// Every live key with a lease, and its lease, at the current
    /// revision (the lessor's reattachment at start). Reads each live row
    /// without its value, so a store of large values is not copied into
    /// memory for it.
    pub fn leased_keys(&self) -> Result<Vec<(Vec<u8>, i64)>, MvccError> {
        let (revs, at) = {
            let index = self.index.read();
            let (at, _) = self.view();
            let range = crate::index::KeyRange::From(&[]);
            (index.revisions(range, at.rev), at)
        };
        let rows = at.open()?;
        let mut out = Vec::new();
        for rev in revs {
            let row = rows.row(rev)?;
            let kv = range::decode_row_head(row.value(), rev)?;
            if kv.lease != 0 {
                out.push((kv.key.to_vec(), kv.lease));
            }
        }
        Ok(out)
    }

    /// The committed view and compaction revision (call with `index` read
    /// locked, so the two are of the same commit); `published` is held
    /// only to clone them.
    fn view(&self) -> (RowsAt, i64) {
        let p = self.published.read();
        (p.rows_at(), p.compact_rev)
    }

    /// Bounds the responses of [`KvStore::range`] and [`KvStore::read_txn`].
    pub fn set_max_response_bytes(&self, max: usize) {
        self.max_response_bytes.store(max, Ordering::Relaxed);
    }

    pub(crate) fn max_response_bytes(&self) -> usize {
        self.max_response_bytes.load(Ordering::Relaxed)
    }

    /// One chunk of a streamed range: like [`KvStore::range`], but the
    /// response's `count` is not computed (the index walk stops after
    /// `limit + 1` keys). `more` says whether keys follow the chunk.
    pub fn range_chunk(&self, req: &RangeRequest) -> Result<RangeResponse, MvccError> {
        self.range_with(req, false, usize::MAX)
    }

    /// Keys in the index: every key with a history not yet compacted
    /// away (a deleted key counts until a compaction drops it).
    pub fn indexed_keys(&self) -> usize {
        self.index.read().len()
    }

    /// Bytes of committed rows not yet written to the backend file (the
    /// memtable and a write-out in progress): what the file will grow by,
    /// about, which the quota counts with the file's size.
    pub fn unwritten_bytes(&self) -> u64 {
        let p = self.published.read();
        p.mem.bytes() + p.frozen.as_ref().map_or(0, |f| f.bytes())
    }

    /// The revision of the last committed change (1 for an empty store).
    pub fn current_revision(&self) -> i64 {
        self.published.read().rev
    }

    /// The compaction revision, 0 if the store was never compacted. This
    /// is the last *scheduled* compaction (etcd's `compactMainRev`): reads
    /// below it fail at once, its rows may still be being deleted.
    pub fn compact_revision(&self) -> i64 {
        self.published.read().compact_rev.max(0)
    }

    /// The last compaction whose rows are all deleted (-1: none). See
    /// [`KvStore::wait_compacted`].
    pub fn finished_compact_revision(&self) -> i64 {
        *self.compactor.finished().borrow()
    }

    /// Resolves once every compaction up to `rev` is physically done (all
    /// its rows deleted): etcd's `physc` for `CompactionRequest.physical`.
    /// Call it after the compaction was applied. Never resolves if the
    /// store is dropped first (the caller's request is cancelled instead).
    pub fn wait_compacted(&self, rev: i64) -> impl std::future::Future<Output = ()> + Send {
        let mut rx = self.compactor.finished();
        async move {
            if rx.wait_for(|f| *f >= rev).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Blocks until every compaction up to `rev` is physically done, or
    /// `timeout`; true when done (tests and tools).
    pub fn wait_compacted_blocking(&self, rev: i64, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let rx = self.compactor.finished();
        loop {
            if *rx.borrow() >= rev {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Compactions queued or being deleted.
    pub fn compactions_pending(&self) -> usize {
        self.compactor.pending()
    }

    /// Sends the compactor's measurements to `o` (metrics).
    pub fn set_compaction_observer(&self, o: Arc<dyn crate::CompactionObserver>) {
        self.compactor.set_observer(o);
    }

    /// The last raft index whose effects are committed (from `meta`).
    pub fn consistent_index(&self) -> u64 {
        self.published.read().consistent_index
    }

    /// The raft term stored with the consistent index.
    pub fn term(&self) -> u64 {
        self.published.read().term
    }

    /// Number of revisions (puts and tombstones) in the `key` table.
    pub fn revision_count(&self) -> Result<u64, MvccError> {
        let at = self.published.read().rows_at();
        at.open()?.len()
    }

    /// Makes every applied change durable in the background: the rows in
    /// memory and the consistent index are written to redb and fsynced on
    /// the writer thread while batches go on (see `memtable`). Returns
    /// false, doing nothing, while the previous such write-out runs; an
    /// error if the previous one failed. Blocks while a batch is open.
    pub fn write_out_background(&self) -> Result<bool, MvccError> {
        let _guard = self.batch_lock.lock();
        self.writer.start()
    }

    /// Sends each background write-out's duration to `o` (metrics).
    pub fn set_write_out_observer(&self, o: memtable::WriteOutObserver) {
        self.writer.set_observer(o);
    }

    /// Starts the write batch. Blocks while another batch is open.
    pub fn begin_batch(&self) -> Result<WriteBatch<'_>, MvccError> {
        WriteBatch::begin(self)
    }

    /// Publishes a new committed state (called with the batch lock held),
    /// compacting the index at each of `compactions` and queueing their
    /// deletions for the compactor.
    pub(crate) fn publish(
        &self,
        compactions: &[i64],
        update: impl FnOnce(&mut Published),
    ) -> Result<(), MvccError> {
        let index = self.index.write();
        let mut p = self.published.write();
        update(&mut p);
        drop(p);
        drop(index);
        // The index is compacted by the compactor, in chunks: once the
        // compaction revision is published no reader asks for anything
        // below it, and what is at or above it reads the same compacted or
        // not. (Compacting it here held the index, and the raft thread,
        // 52 ms at 100k keys.)
        for &rev in compactions {
            self.compactor.schedule(Job {
                rev,
                keep: None,
                epoch: self.restores.load(Ordering::SeqCst),
            });
        }
        Ok(())
    }

    /// Replaces the index with the one in the published snapshot (after an
    /// aborted batch).
    pub(crate) fn reload_index(&self) {
        // the committed rows in memory first: the index is rebuilt from redb
        if let Err(e) = memtable::flush(&self.backend, &self.published, &self.writer, false) {
            panic!("mvcc: cannot write the memtable after an aborted batch: {e}");
        }
        let snapshot = self.published.read().snapshot.clone();
        match load(&snapshot) {
            Ok(l) => *self.index.write() = l.index,
            Err(e) => panic!("mvcc: cannot rebuild the index after an aborted batch: {e}"),
        }
    }

    /// Serializes the committed `key`, `meta`, `members`, `leases`, `alarm`
    /// and `auth` tables.
    ///
    /// Format: `b"RETCDMVCC1"`, then records `table(u8: 1 key, 2 meta,
    /// 3 members, 4 leases, 5 alarm, 6 auth; integer keys as 8 bytes BE)
    /// klen(u32 BE) k vlen(u32 BE) v`, then a `0` byte, then the CRC-32C
    /// (u32 BE) of everything before it. See also
    /// [`KvStore::snapshot_dump`], which streams the same bytes.
    pub fn dump(&self) -> Result<Vec<u8>, MvccError> {
        let mut out = Vec::new();
        self.snapshot_dump().write_to(&mut out)?;
        Ok(out)
    }

    /// Replaces the `key` and `meta` tables with a [`KvStore::dump`], durably,
    /// and rebuilds the index. Waits for the open batch, if any.
    pub fn restore_from(&self, snapshot: &[u8]) -> Result<(), MvccError> {
        let records = parse_dump(snapshot)?;
        self.restore_with(&mut |put| {
            for (table, k, v) in &records {
                put(*table, k, v)?;
            }
            Ok(())
        })
    }

    /// Replaces every table with the records `fill` hands to its sink
    /// (`(table, key, value)`, tables numbered as in [`KvStore::dump`]),
    /// durably, and rebuilds the index. The records are written in
    /// transactions of about 64 MiB, so a store of any size is restored in
    /// bounded memory; only the last commit is durable, and a failed
    /// restore leaves the tables partly filled (restore into a new store).
    pub fn restore_with(
        &self,
        fill: &mut dyn FnMut(
            &mut dyn FnMut(u8, &[u8], &[u8]) -> Result<(), MvccError>,
        ) -> Result<(), MvccError>,
    ) -> Result<(), MvccError> {
        const BATCH_BYTES: usize = 64 << 20;
        let _guard = self.batch_lock.lock();
        self.writer.wait_idle()?;
        let mut batch: Vec<(u8, Vec<u8>, Vec<u8>)> = Vec::new();
        let mut bytes = 0usize;
        let mut first = true;
        let write = |batch: &mut Vec<(u8, Vec<u8>, Vec<u8>)>,
                     first: &mut bool,
                     policy: CommitPolicy|
         -> Result<(), MvccError> {
            let txn = self.backend.db().begin_write()?;
            if std::mem::take(first) {
                for t in [KEY, ALARM, AUTH] {
                    txn.delete_table(t)?;
                }
                txn.delete_table(META)?;
                txn.delete_table(MEMBERS)?;
                txn.delete_table(LEASES)?;
            }
            {
                let mut key = txn.open_table(KEY)?;
                let mut meta = txn.open_table(META)?;
                let mut members = txn.open_table(MEMBERS)?;
                let mut leases = txn.open_table(LEASES)?;
                let mut alarm = txn.open_table(ALARM)?;
                let mut auth = txn.open_table(AUTH)?;
                let int_key = |k: &[u8]| -> Result<[u8; 8], MvccError> {
                    k.try_into()
                        .map_err(|_| MvccError::Backend("invalid integer key in snapshot".into()))
                };
                for (table, k, v) in batch.drain(..) {
                    let (k, v) = (k.as_slice(), v.as_slice());
                    match table {
                        1 => {
                            key.insert(k, v)?;
                        }
                        2 => {
                            let name = std::str::from_utf8(k).map_err(|_| {
                                MvccError::Backend("invalid meta key in snapshot".into())
                            })?;
                            meta.insert(name, v)?;
                        }
                        3 => {
                            members.insert(u64::from_be_bytes(int_key(k)?), v)?;
                        }
                        4 => {
                            leases.insert(i64::from_be_bytes(int_key(k)?), v)?;
                        }
                        5 => {
                            alarm.insert(k, v)?;
                        }
                        6 => {
                            auth.insert(k, v)?;
                        }
                        t => {
                            return Err(MvccError::Backend(format!(
                                "unknown table {t} in snapshot"
                            )))
                        }
                    }
                }
            }
            commit_with(txn, policy)?;
            Ok(())
        };
        fill(&mut |table, k, v| {
            bytes += k.len() + v.len() + 16;
            batch.push((table, k.to_vec(), v.to_vec()));
            if bytes >= BATCH_BYTES {
                write(&mut batch, &mut first, CommitPolicy::Visible)?;
                bytes = 0;
            }
            Ok(())
        })?;
        write(&mut batch, &mut first, CommitPolicy::Durable)?;
        let snapshot = Arc::new(self.backend.begin_read()?);
        let l = load(&snapshot)?;
        let mut index = self.index.write();
        *index = l.index;
        // Queued or running compactions were of the old data: stale now.
        let epoch = self.restores.fetch_add(1, Ordering::SeqCst) + 1;
        let mark = self.published.read().compaction_mark.clone();
        *self.published.write() = Published {
            rev: l.rev,
            compact_rev: l.compact_rev,
            consistent_index: l.consistent_index,
            term: l.term,
            snapshot,
            frozen: None,
            mem: Arc::default(),
            flushed_rev: l.rev,
            compaction_mark: mark,
        };
        drop(index);
        self.compactor.set_finished(l.finished_compact_rev);
        if let Some((rev, keep)) = l.resume {
            tracing::info!(
                scheduled_compact_revision = rev,
                finished_compact_revision = l.finished_compact_rev,
                "mvcc: resume scheduled compaction of the restored snapshot"
            );
            self.compactor.schedule(Job {
                rev,
                keep: Some(keep),
                epoch,
            });
        }
        Ok(())
    }
}

impl KvStore {
    /// Shutdown, after the last apply: stops the compactor and closes the
    /// backend file cleanly (see [`Backend::close`]), waiting up to `wait`
    /// for a running defrag and for readers; reads after it fail. Returns
    /// whether the file was closed. Blocks: call it from a thread that may.
    pub fn close(&self, wait: std::time::Duration) -> Result<bool, MvccError> {
        self.compactor.shutdown();
        let Some(_defrag) = self.defrag_lock.try_lock_for(wait) else {
            return Ok(false);
        };
        let _batch = self.batch_lock.lock();
        memtable::flush(&self.backend, &self.published, &self.writer, true)?;
        self.writer.stop();
        let closed = self.backend.close(wait, || {
            // the published snapshot would keep the file's database open
            if let Ok(s) = self.backend.begin_read() {
                self.published.write().snapshot = Arc::new(s);
            }
        })?;
        Ok(closed)
    }
}

impl Drop for KvStore {
    fn drop(&mut self) {
        // The compactor finishes its current batch and stops; what is left
        // resumes at the next open.
        self.compactor.shutdown();
        // Committed rows still in memory go to the file (durably: a store
        // dropped without `close` is reopened by tests and tools). The
        // server's last durable commit has already written them.
        let _batch = self.batch_lock.lock();
        let unwritten = {
            let p = self.published.read();
            !p.mem.is_empty() || p.frozen.is_some()
        };
        if unwritten {
            if let Err(e) = memtable::flush(&self.backend, &self.published, &self.writer, true) {
                tracing::warn!(error = %e, "mvcc: cannot write the memtable at drop");
            }
        }
        self.writer.stop();
    }
}

pub const DUMP_MAGIC: &[u8] = b"RETCDMVCC1";

/// One record of a dump: (table, key, value); see [`KvStore::dump`].
pub type DumpRecord<'a> = (u8, &'a [u8], &'a [u8]);

/// Checks a dump's CRC and splits it into records.
pub fn parse_dump(data: &[u8]) -> Result<Vec<DumpRecord<'_>>, MvccError> {
    let bad = |what: &str| MvccError::Backend(format!("invalid snapshot: {what}"));
    if data.len() < DUMP_MAGIC.len() + 5 || !data.starts_with(DUMP_MAGIC) {
        return Err(bad("bad header"));
    }
    let (body, crc) = data.split_at(data.len() - 4);
    if crate::hash::Crc32c::checksum(body) != u32::from_be_bytes(crc.try_into().expect("4 bytes")) {
        return Err(bad("checksum mismatch"));
    }
    let mut rest = &body[DUMP_MAGIC.len()..];
    let mut records = Vec::new();
    fn take<'d>(rest: &mut &'d [u8]) -> Result<&'d [u8], MvccError> {
        if rest.len() < 4 {
            return Err(MvccError::Backend("invalid snapshot: truncated".into()));
        }
        let n = u32::from_be_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        if rest.len() < 4 + n {
            return Err(MvccError::Backend("invalid snapshot: truncated".into()));
        }
        let (v, r) = rest[4..].split_at(n);
        *rest = r;
        Ok(v)
    }
    loop {
        let (&table, r) = rest.split_first().ok_or_else(|| bad("truncated"))?;
        rest = r;
        match table {
            0 if rest.is_empty() => return Ok(records),
            1..=6 => {
                let k = take(&mut rest)?;
                let v = take(&mut rest)?;
                records.push((table, k, v));
            }
            _ => return Err(bad("unknown record")),
        }
    }
}
