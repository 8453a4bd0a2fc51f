//! Compaction, as etcd does it (`kvstore.go` compact/restore,
//! `kvstore_compaction.go` scheduleCompaction): cheap on the apply thread,
//! the deletions in the background.
//!
//! 1. **Apply** ([`WriteBatch::compact`], raft thread): check the revision
//!    (`Compacted` / `FutureRev`), write `scheduledCompactRev` in the batch,
//!    and raise the batch's compaction revision. Nothing is deleted here.
//! 2. **Commit** (`KvStore::publish`): the compaction revision is
//!    published (readers refuse anything below it from now on) and `rev`
//!    is queued for the compactor.
//! 3. **Compactor** (one OS thread per store, `mvcc-compactor`): compacts
//!    the in-memory index, 10 000 keys per hold of its write lock, which
//!    gives the *keep* set — for each key the revision `<= rev` still
//!    needed to read at `rev` (what is at or above the published
//!    compaction revision reads the same before and after). Then it scans the
//!    `key` table below `rev + 1` in batches of `batch_limit` rows (etcd:
//!    1000), deletes the rows not in *keep*, commits each batch as its own
//!    backend write transaction (under the batch lock, so it interleaves
//!    with the raft thread's per-Ready batches and never runs during a
//!    `restore_from` or a defrag's final swap), and sleeps
//!    `sleep_interval` (etcd: 10 ms) between batches. The last batch writes
//!    `finishedCompactRev`. Batches commit without fsync (the raft
//!    thread's periodic durable commits carry them to disk) except the
//!    last one and one a second (etcd fsyncs every batch: bbolt commits
//!    are durable). Jobs run one at a time, in the order their
//!    compactions committed.
//! 4. **Restart**: when `scheduledCompactRev > finishedCompactRev` (a crash
//!    mid-deletion), the store opens at the scheduled revision, compacts
//!    the rebuilt index at it and queues the deletion again (etcd's
//!    `restore` → `compactLockfree`). The same happens after a
//!    `restore_from` (a raft snapshot taken mid-deletion).
//!
//! Readers never look at a row `<= compact_rev` that is not in *keep*
//! (the index no longer points at it), and `hash_kv` skips exactly those
//! rows, so neither depends on how far the deletion has got. The published
//! compaction revision is the *scheduled* one, as etcd's `compactMainRev`.
//!
//! Example: `a` put at 2 and 4, deleted at 5; `b` put at 3. `compact(4)`:
//! keep = {4 (a), 3 (b)}; the compactor removes 2; 5 is above and stays.
//! `compact(5)`: keep = {3, 5}; the compactor removes 4; the tombstone at
//! the compaction revision stays (etcd 3.5.16+), so a watch from 5 gets the
//! delete. `compact(6)`: keep = {3}; the compactor removes 5. A crash
//! after 4 was removed, with 5 left: on restart `a`'s tombstone 5 is its
//! only revision and is restored as such (etcd 3.5.18+); compacting the
//! index at a revision above 5 drops it again.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use redb::ReadableTable;
use retcd_api::etcdserverpb::{CompactionResponse, ResponseHeader};
use retcd_storage::backend::{commit_with, Backend, CommitPolicy, KEY, META};

use crate::kvstore::{Published, FINISHED_COMPACT_KEY, SCHEDULED_COMPACT_KEY};
use crate::kvstore_txn::WriteBatch;
use crate::revision::Revision;
use crate::MvccError;

/// Rows scanned per deletion batch (etcd's `--experimental-compaction-batch-limit`).
pub const DEFAULT_COMPACTION_BATCH_LIMIT: usize = 1000;
/// Pause between deletion batches (etcd's `--experimental-compaction-sleep-interval`).
pub const DEFAULT_COMPACTION_SLEEP_INTERVAL: Duration = Duration::from_millis(10);

/// Keys of the index compacted per hold of its write lock (a few ms).
const INDEX_CHUNK: usize = 10_000;

/// At least this often a deletion batch is committed durably.
const DURABLE_EVERY: Duration = Duration::from_secs(1);

/// How the background compactor paces itself, and who hears about it.
#[derive(Clone)]
pub struct CompactionConfig {
    /// Rows of the `key` table scanned (and at most deleted) per backend
    /// write transaction.
    pub batch_limit: usize,
    /// Sleep between two batches, leaving the backend's writer to the
    /// raft thread.
    pub sleep_interval: Duration,
    /// Receives measurements from the start (a compaction resumed at open
    /// included); see also [`crate::KvStore::set_compaction_observer`].
    pub observer: Option<Arc<dyn CompactionObserver>>,
}

impl std::fmt::Debug for CompactionConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompactionConfig")
            .field("batch_limit", &self.batch_limit)
            .field("sleep_interval", &self.sleep_interval)
            .field("observer", &self.observer.is_some())
            .finish()
    }
}

impl Default for CompactionConfig {
    fn default() -> Self {
        CompactionConfig {
            batch_limit: DEFAULT_COMPACTION_BATCH_LIMIT,
            sleep_interval: DEFAULT_COMPACTION_SLEEP_INTERVAL,
            observer: None,
        }
    }
}

/// Receives the compactor's measurements (the server turns them into
/// etcd's `etcd_debugging_mvcc_db_compaction_*` metrics).
pub trait CompactionObserver: Send + Sync {
    /// The in-memory index was compacted (by the compactor, in chunks):
    /// how long it held the index's write lock in all.
    fn index_compacted(&self, _pause: Duration) {}
    /// One deletion batch was committed: how long it held the backend's
    /// writer (the batch lock), and how many rows it deleted.
    fn batch(&self, pause: Duration, deleted: u64);
    /// The deletion of compaction `rev` finished, `total` after it started.
    fn finished(&self, rev: i64, total: Duration);
}

/// Where the compactor is, published with each of its batches so an
/// online defrag can tell which rows disappeared between two snapshots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CompactionMark {
    /// Sequence number of the job (0: no batch ever ran).
    pub(crate) job: u64,
    /// Every row below this key that the job meant to delete is deleted
    /// (the scan resumes here); `rev + 1`'s bytes once the job is done.
    pub(crate) cursor: Vec<u8>,
    /// The job is finished.
    pub(crate) done: bool,
}

impl CompactionMark {
    /// The key range in which rows may have been deleted between the
    /// published states marked `self` (older) and `to`; `None`: nothing was
    /// deleted. Returns `(from, upper)`; `from == None` means from the start.
    pub(crate) fn deleted_since(
        &self,
        to: &CompactionMark,
        to_compact_rev: i64,
    ) -> Option<(Option<Vec<u8>>, Vec<u8>)> {
        if self == to {
            return None;
        }
        if self.job == to.job {
            return Some((Some(self.cursor.clone()), to.cursor.clone()));
        }
        if to.job == self.job + 1 && (self.done || self.job == 0) {
            return Some((None, to.cursor.clone()));
        }
        Some((
            None,
            Revision::new(to_compact_rev + 1, 0).to_bytes().to_vec(),
        ))
    }
}

/// One queued compaction.
pub(crate) struct Job {
    pub(crate) rev: i64,
    /// The revisions at or below `rev` still needed (None: the compactor
    /// compacts the index first, which gives them).
    pub(crate) keep: Option<HashSet<Revision>>,
    /// The store's `restores` count when the job was made: a
    /// `restore_from` since then makes it stale.
    pub(crate) epoch: u64,
}

/// A stop flag whose sleepers wake when it is set.
#[derive(Default)]
pub(crate) struct Stop {
    stopped: Mutex<bool>,
    cv: Condvar,
}

impl Stop {
    fn is_set(&self) -> bool {
        *self.stopped.lock()
    }
    pub(crate) fn set(&self) {
        *self.stopped.lock() = true;
        self.cv.notify_all();
    }
    /// Sleeps `d` unless stopped; true when stopped.
    fn sleep(&self, d: Duration) -> bool {
        let mut s = self.stopped.lock();
        if !*s && !d.is_zero() {
            let _ = self.cv.wait_for(&mut s, d);
        }
        *s
    }
}

/// What the compactor thread shares with the store (no reference to the
/// store itself, so dropping the store stops the thread).
#[derive(Clone)]
pub(crate) struct CompactorCtx {
    pub(crate) writer: Arc<crate::memtable::Writer>,
    pub(crate) backend: Arc<Backend>,
    pub(crate) batch_lock: Arc<Mutex<()>>,
    pub(crate) index: Arc<RwLock<crate::index::TreeIndex>>,
    pub(crate) published: Arc<RwLock<Published>>,
    pub(crate) restores: Arc<AtomicU64>,
}

/// The store's background compactor; see the module documentation.
pub(crate) struct Compactor {
    cfg: CompactionConfig,
    ctx: CompactorCtx,
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    pub(crate) stop: Arc<Stop>,
    /// Finished compaction revision (-1: none), for physical compactions.
    finished: Arc<tokio::sync::watch::Sender<i64>>,
    /// Jobs queued or running.
    pending: Arc<AtomicUsize>,
    observer: Arc<RwLock<Option<Arc<dyn CompactionObserver>>>>,
}

impl Compactor {
    pub(crate) fn new(cfg: CompactionConfig, ctx: CompactorCtx, finished: i64) -> Compactor {
        let observer = Arc::new(RwLock::new(cfg.observer.clone()));
        Compactor {
            cfg: CompactionConfig {
                batch_limit: cfg.batch_limit.max(1),
                ..cfg
            },
            ctx,
            queue: Mutex::new(None),
            thread: Mutex::new(None),
            stop: Arc::new(Stop::default()),
            finished: Arc::new(tokio::sync::watch::Sender::new(finished)),
            pending: Arc::new(AtomicUsize::new(0)),
            observer,
        }
    }

    /// Queues a job, starting the thread on first use. Never blocks.
    pub(crate) fn schedule(&self, job: Job) {
        let mut q = self.queue.lock();
        if q.is_none() {
            if self.stop.is_set() {
                return;
            }
            let (tx, rx) = mpsc::channel();
            let worker = Worker {
                cfg: self.cfg.clone(),
                ctx: self.ctx.clone(),
                stop: self.stop.clone(),
                finished: self.finished.clone(),
                pending: self.pending.clone(),
                observer: self.observer.clone(),
                seq: 0,
            };
            let handle = std::thread::Builder::new()
                .name("mvcc-compactor".into())
                .spawn(move || worker.run(rx))
                .expect("spawn the mvcc compactor thread");
            *self.thread.lock() = Some(handle);
            *q = Some(tx);
        }
        self.pending.fetch_add(1, Ordering::SeqCst);
        if q.as_ref().expect("queue present").send(job).is_err() {
            self.pending.fetch_sub(1, Ordering::SeqCst);
        }
    }

    pub(crate) fn finished(&self) -> tokio::sync::watch::Receiver<i64> {
        self.finished.subscribe()
    }

    /// After a `restore_from`: the finished revision is the restored one.
    pub(crate) fn set_finished(&self, rev: i64) {
        self.finished.send_replace(rev);
    }

    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }

    pub(crate) fn set_observer(&self, o: Arc<dyn CompactionObserver>) {
        *self.observer.write() = Some(o);
    }

    /// Stops the thread after its current batch and waits for it. Queued
    /// work is left to the next open (scheduled > finished).
    pub(crate) fn shutdown(&self) {
        self.stop.set();
        self.queue.lock().take();
        if let Some(h) = self.thread.lock().take() {
            let _ = h.join();
        }
    }
}

/// The compactor thread's state.
struct Worker {
    cfg: CompactionConfig,
    ctx: CompactorCtx,
    stop: Arc<Stop>,
    finished: Arc<tokio::sync::watch::Sender<i64>>,
    pending: Arc<AtomicUsize>,
    observer: Arc<RwLock<Option<Arc<dyn CompactionObserver>>>>,
    seq: u64,
}

enum Outcome {
    /// Every row deleted; `run` publishes the finish.
    Done,
    Stale,
    Stopped,
}

impl Worker {
    fn run(mut self, rx: mpsc::Receiver<Job>) {
        while let Ok(job) = rx.recv() {
            let rev = job.rev;
            let outcome = match self.run_job(job) {
                Ok(o) => o,
                Err(e) => {
                    // Left for the next start (scheduled > finished); the
                    // hash and reads do not depend on it.
                    tracing::error!(compact_revision = rev, error = %e, "mvcc: compaction failed; it resumes at the next start");
                    Outcome::Stale
                }
            };
            // off the count before its finish is published: whoever saw
            // the finish sees the queue without it
            self.pending.fetch_sub(1, Ordering::SeqCst);
            if matches!(outcome, Outcome::Done) {
                self.finished.send_modify(|f| *f = (*f).max(rev));
            }
            if matches!(outcome, Outcome::Stopped) {
                return;
            }
        }
    }

    /// Compacts the index at `rev`, [`INDEX_CHUNK`] keys per hold of its
    /// lock; the keep set (None: stopped or stale).
    fn compact_index(&self, job: &Job) -> Option<HashSet<Revision>> {
        let mut keep = HashSet::new();
        // a chunk's kept revisions: small, so the hold never pays for
        // growing (rehashing) the whole keep set; that happens after it
        let mut chunk_keep = HashSet::with_capacity(INDEX_CHUNK);
        let mut from: Option<Vec<u8>> = None;
        let mut held = Duration::ZERO;
        let mut longest = Duration::ZERO;
        loop {
            if self.stop.is_set() {
                return None;
            }
            let mut index = self.ctx.index.write();
            if self.ctx.restores.load(Ordering::SeqCst) != job.epoch {
                return None;
            }
            let t = Instant::now();
            let next = index.compact_chunk(job.rev, from.as_deref(), INDEX_CHUNK, &mut chunk_keep);
            let hold = t.elapsed();
            drop(index);
            held += hold;
            longest = longest.max(hold);
            keep.extend(chunk_keep.drain());
            match next {
                Some(k) => from = Some(k),
                None => break,
            }
        }
        if let Some(o) = self.observer.read().as_ref() {
            o.index_compacted(held);
        }
        tracing::info!(
            compact_revision = job.rev,
            kept = keep.len(),
            held_ms = held.as_secs_f64() * 1000.0,
            longest_hold_ms = longest.as_secs_f64() * 1000.0,
            "mvcc: compacted the index"
        );
        Some(keep)
    }

    fn run_job(&mut self, mut job: Job) -> Result<Outcome, MvccError> {
        self.seq += 1;
        let started = Instant::now();
        let keep = match job.keep.take() {
            Some(k) => k,
            None => match self.compact_index(&job) {
                Some(k) => k,
                None if self.stop.is_set() => return Ok(Outcome::Stopped),
                None => return Ok(Outcome::Stale),
            },
        };
        let end = Revision::new(job.rev + 1, 0).to_bytes().to_vec();
        let mut cursor: Vec<u8> = Vec::new();
        let mut deleted_total = 0u64;
        let mut last_durable = Instant::now();
        loop {
            if self.stop.is_set() {
                return Ok(Outcome::Stopped);
            }
            fail::fail_point!("mvcc_compact", |_| {
                eprintln!("retcd: failpoint mvcc_compact: crashing (abort)");
                std::process::abort()
            });
            // A running write-out is waited for before the batch lock, so
            // the raft thread's applies do not wait for it too (one that
            // starts in between is waited for below, under the lock).
            self.ctx.writer.wait_idle()?;
            let (done, deleted, pause) = {
                let _guard = self.ctx.batch_lock.lock();
                let t = Instant::now();
                if self.ctx.restores.load(Ordering::SeqCst) != job.epoch {
                    tracing::info!(
                        compact_revision = job.rev,
                        "mvcc: compaction abandoned: the store was replaced by a snapshot"
                    );
                    return Ok(Outcome::Stale);
                }
                // Rows to delete must be in redb, not in the memtable (the
                // batch that applied the compaction wrote it out already:
                // it wrote the compaction's mark).
                self.ctx.writer.wait_idle()?;
                if self.ctx.published.read().flushed_rev < job.rev {
                    crate::memtable::flush(
                        &self.ctx.backend,
                        &self.ctx.published,
                        &self.ctx.writer,
                        false,
                    )?;
                }
                let txn = self.ctx.backend.db().begin_write()?;
                let mut scanned = 0usize;
                let mut last: Option<Vec<u8>> = None;
                let mut doomed: Vec<Vec<u8>> = Vec::new();
                {
                    let mut table = txn.open_table(KEY)?;
                    for entry in table.range(cursor.as_slice()..end.as_slice())? {
                        let (k, _) = entry?;
                        let (r, _) = Revision::parse(k.value()).ok_or_else(|| {
                            MvccError::Backend(format!("invalid revision key {:?}", k.value()))
                        })?;
                        if !keep.contains(&r) {
                            doomed.push(k.value().to_vec());
                        }
                        scanned += 1;
                        if scanned == self.cfg.batch_limit {
                            last = Some(k.value().to_vec());
                            break;
                        }
                    }
                    for k in &doomed {
                        table.remove(k.as_slice())?;
                    }
                }
                let done = last.is_none();
                cursor = match last {
                    Some(mut k) => {
                        // the smallest key after `k`
                        k.push(0);
                        k
                    }
                    None => end.clone(),
                };
                if done {
                    let mut meta = txn.open_table(META)?;
                    let rbytes = Revision::new(job.rev, 0).to_bytes();
                    meta.insert(FINISHED_COMPACT_KEY, rbytes.as_slice())?;
                }
                // Visible only (the raft thread's periodic durable commits
                // carry it to disk); durable for the last batch, so a
                // finished compaction is not redone after a crash, and
                // every DURABLE_EVERY so a crash redoes little.
                let durable = done || last_durable.elapsed() >= DURABLE_EVERY;
                commit_with(txn, CommitPolicy::durable_if(durable))?;
                if durable {
                    last_durable = Instant::now();
                }
                let snapshot = Arc::new(self.ctx.backend.begin_read()?);
                {
                    let mut p = self.ctx.published.write();
                    p.snapshot = snapshot;
                    p.compaction_mark = CompactionMark {
                        job: self.seq,
                        cursor: cursor.clone(),
                        done,
                    };
                }
                (done, doomed.len() as u64, t.elapsed())
            };
            deleted_total += deleted;
            if let Some(o) = self.observer.read().as_ref() {
                o.batch(pause, deleted);
            }
            if done {
                // observed before it is published: whoever waited for the
                // finish sees it counted
                if let Some(o) = self.observer.read().as_ref() {
                    o.finished(job.rev, started.elapsed());
                }
                tracing::info!(
                    compact_revision = job.rev,
                    deleted = deleted_total,
                    took_ms = started.elapsed().as_secs_f64() * 1000.0,
                    "mvcc: finished scheduled compaction"
                );
                return Ok(Outcome::Done);
            }
            if self.stop.sleep(self.cfg.sleep_interval) {
                return Ok(Outcome::Stopped);
            }
        }
    }
}

impl WriteBatch<'_> {
    /// Compacts the history at `rev`: records the scheduled compaction in
    /// this batch; the index is compacted when the batch commits and the
    /// rows are deleted in the background (module documentation).
    /// `physical` is for the caller, which waits with
    /// [`crate::KvStore::wait_compacted`] after the commit.
    ///
    /// Errors: `rev <=` the compaction revision → `Compacted`; `rev >` the
    /// current revision → `FutureRev`.
    pub fn compact(&mut self, rev: i64, physical: bool) -> Result<CompactionResponse, MvccError> {
        let _ = physical;
        if rev <= self.compact_rev {
            return Err(MvccError::Compacted);
        }
        if rev > self.rev {
            return Err(MvccError::FutureRev);
        }
        {
            let mut meta = self.wtxn()?.open_table(META)?;
            let rbytes = Revision::new(rev, 0).to_bytes();
            meta.insert(SCHEDULED_COMPACT_KEY, rbytes.as_slice())?;
        }
        self.compact_rev = rev;
        self.pending_compactions.push(rev);
        Ok(CompactionResponse {
            header: Some(ResponseHeader {
                revision: self.rev,
                ..Default::default()
            }),
        })
    }
}
