//! The memtable: rows of the `key` table that are committed (published to
//! readers) but not yet written to redb.
//!
//! A write batch used to insert its rows into a redb write transaction and
//! commit it (not fsynced) at every raft Ready, so readers saw them. That
//! commit was half of a lone put's instructions (copy-on-write of the
//! table's path, page allocation and zeroing, checksums, the table tree),
//! paid again for every Ready. Now a batch appends its rows here and
//! publishes; the rows go to redb together, in one transaction, when the
//! raft thread makes the backend durable (every `--backend-batch-interval`
//! or `--backend-batch-limit` entries, as etcd's batched bbolt commits), or
//! when a batch writes another table (leases, members, auth, alarms, a
//! compaction's mark) and commits that anyway, or before the compactor
//! deletes rows. Crash safety is unchanged: redb only ever held what its
//! last durable commit held, and the consistent index stored with it tells
//! the WAL replay where to resume.
//!
//! # Views
//!
//! A committed view ([`RowsAt`]) is a redb snapshot, the memtables that go
//! with it and the revision the view is at. Rows at or below `flushed_rev`
//! are in the snapshot; rows above it are in the memtable, or in the
//! frozen one a background write-out is writing to redb. Later commits
//! append to the same memtable, so a view bounds every read by its own
//! revision; a write-out starts a new memtable, so a view taken before it
//! keeps the old one (and the old snapshot, which lacks the written rows).
//!
//! # The background write-out
//!
//! The periodic durable write-out runs on its own thread ([`Writer`]), so
//! the raft thread does not stop applying while thousands of rows go into
//! redb and the file is fsynced (4–16 ms every 100 ms at 40k puts/s, the
//! puts' p99): the raft thread freezes the memtable (a new one takes the
//! next rows), hands it over and goes on. Anyone else who writes redb (a
//! batch writing another table, the compactor, a restore, defrag's swap, a
//! synchronous durable commit, close) holds the batch lock, so no new
//! write-out can start, and first waits for the running one to finish
//! ([`Writer::wait_idle`]): at most one redb write transaction is open.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use prost::bytes::Bytes;
use redb::{AccessGuard, ReadOnlyTable, ReadableTableMetadata};
use retcd_storage::backend::{commit_with, Backend, CommitPolicy, ReadSnapshot, KEY, META};

use crate::kvstore::{Published, CONSISTENT_INDEX_KEY, TERM_KEY};
use crate::revision::Revision;
use crate::MvccError;

/// One row: its revision, whether it is a tombstone, the encoded
/// `mvccpb.KeyValue`.
#[derive(Clone, Debug)]
pub(crate) struct MemRow {
    pub(crate) rev: Revision,
    pub(crate) tombstone: bool,
    pub(crate) row: Bytes,
}

impl MemRow {
    /// Calls `f` with the row's key in the `key` table.
    fn with_key<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        if self.tombstone {
            f(&self.rev.to_tombstone_bytes())
        } else {
            f(&self.rev.to_bytes())
        }
    }
}

/// The row stored at `rev` (not a tombstone, as a lookup of `rev`'s key
/// in redb) among rows in revision order.
pub(crate) fn find(rows: &[MemRow], rev: Revision) -> Option<&MemRow> {
    let i = rows.partition_point(|r| r.rev < rev);
    rows.get(i).filter(|r| r.rev == rev && !r.tombstone)
}

/// Rows not yet in redb, in revision order; see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct MemRows {
    /// The rows, appended in revision order by the write batch's commit
    /// (batch lock held). The lock is held only to append, to look one row
    /// up, to clone a run of them out (a `Bytes` clone each) or, read, by
    /// `write_out` while it writes them (nothing is appended meanwhile):
    /// never while a row is decoded or hashed.
    rows: RwLock<Vec<MemRow>>,
    /// The rows' bytes (what they will add to the file, about): the quota
    /// counts them with the file's size, so a write-out that lags behind
    /// fast large puts does not let them past it.
    bytes: AtomicU64,
}

impl MemRows {
    /// Appends a committed batch's rows (all above the rows already here).
    pub(crate) fn append(&self, rows: &mut Vec<MemRow>) {
        if rows.is_empty() {
            return;
        }
        let n: usize = rows.iter().map(|r| r.row.len()).sum();
        let mut mine = self.rows.write();
        debug_assert!(mine.last().is_none_or(|l| l.rev < rows[0].rev));
        mine.append(rows);
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Bytes of the rows here.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    fn get(&self, rev: Revision) -> Option<Bytes> {
        find(&self.rows.read(), rev).map(|r| r.row.clone())
    }

    /// Rows with `from <= rev < to`, in order.
    fn between(&self, from: Revision, to: Revision) -> Vec<MemRow> {
        let rows = self.rows.read();
        let lo = rows.partition_point(|r| r.rev < from);
        let hi = rows.partition_point(|r| r.rev < to);
        rows[lo..hi.max(lo)].to_vec()
    }

    /// Rows at or below main revision `rev`.
    fn count_upto(&self, rev: i64) -> usize {
        self.rows.read().partition_point(|r| r.rev.main <= rev)
    }

    /// Whether there is nothing to write to redb.
    pub(crate) fn is_empty(&self) -> bool {
        self.rows.read().is_empty()
    }
}

/// A committed view of the `key` table; see the module documentation.
#[derive(Clone)]
pub(crate) struct RowsAt {
    pub(crate) snapshot: Arc<ReadSnapshot>,
    /// Rows being written to redb in the background (all below `mem`'s).
    pub(crate) frozen: Option<Arc<MemRows>>,
    pub(crate) mem: Arc<MemRows>,
    /// Rows at or below this main revision are in `snapshot`.
    pub(crate) flushed_rev: i64,
    /// The view's revision: nothing above it is read.
    pub(crate) rev: i64,
}

impl RowsAt {
    /// The memtables, in revision order.
    fn mems(&self) -> impl Iterator<Item = &MemRows> {
        self.frozen.as_deref().into_iter().chain([&*self.mem])
    }

    /// Opens the view's `key` table for reading (once per snapshot:
    /// [`ReadSnapshot::hot_table`]).
    pub(crate) fn open(&self) -> Result<Rows, MvccError> {
        Ok(Rows {
            table: self.snapshot.hot_table(KEY)?,
            at: self.clone(),
        })
    }
}

/// A row read from redb or from the memtable.
pub(crate) enum Row<'a> {
    Disk(AccessGuard<'a, &'static [u8]>),
    Mem(Bytes),
}

impl Row<'_> {
    /// The encoded `mvccpb.KeyValue`.
    pub(crate) fn value(&self) -> &[u8] {
        match self {
            Row::Disk(g) => g.value(),
            Row::Mem(b) => b,
        }
    }
}

/// Where rows are read from by revision.
pub(crate) trait RowSource {
    /// The row stored at `rev`, if any.
    fn find_row(&self, rev: Revision) -> Result<Option<Row<'_>>, MvccError>;

    /// The row stored at `rev`; an error if there is none (the index
    /// pointed at it).
    fn row(&self, rev: Revision) -> Result<Row<'_>, MvccError> {
        self.find_row(rev)?
            .ok_or_else(|| MvccError::Backend(format!("range cannot find rev {rev}")))
    }
}

/// An opened [`RowsAt`].
pub(crate) struct Rows {
    table: Arc<ReadOnlyTable<&'static [u8], &'static [u8]>>,
    at: RowsAt,
}

impl RowSource for Rows {
    fn find_row(&self, rev: Revision) -> Result<Option<Row<'_>>, MvccError> {
        if rev.main > self.at.rev {
            return Ok(None);
        }
        if rev.main > self.at.flushed_rev {
            return Ok(self.at.mems().find_map(|m| m.get(rev)).map(Row::Mem));
        }
        Ok(self.table.get(rev.to_bytes().as_slice())?.map(Row::Disk))
    }
}

impl Rows {
    /// Calls `f(key, row)` for every row (tombstones included) with main
    /// revision in `[from, to]` (and at most the view's), in revision
    /// order, until it returns false.
    pub(crate) fn for_each(
        &self,
        from: i64,
        to: i64,
        mut f: impl FnMut(&[u8], &[u8]) -> Result<bool, MvccError>,
    ) -> Result<(), MvccError> {
        let to = to.min(self.at.rev);
        if from > to {
            return Ok(());
        }
        let disk_to = to.min(self.at.flushed_rev);
        if from <= disk_to {
            let lo = Revision::new(from, 0).to_bytes();
            let hi = Revision::new(disk_to.saturating_add(1), 0).to_bytes();
            for entry in self.table.range(lo.as_slice()..hi.as_slice())? {
                let (k, v) = entry?;
                if !f(k.value(), v.value())? {
                    return Ok(());
                }
            }
        }
        if to > self.at.flushed_rev {
            let lo = Revision::new(from.max(self.at.flushed_rev.saturating_add(1)), 0);
            let hi = Revision::new(to.saturating_add(1), 0);
            for m in self.at.mems() {
                for r in m.between(lo, hi) {
                    if !r.with_key(|k| f(k, &r.row))? {
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }

    /// Rows (tombstones included) in the view.
    pub(crate) fn len(&self) -> Result<u64, MvccError> {
        let mem: usize = self.at.mems().map(|m| m.count_upto(self.at.rev)).sum();
        Ok(self.table.len()? + mem as u64)
    }
}

/// Writes the rows of `mem`, then `more` (rows above them), and the
/// consistent index into `txn` (a new write transaction if `None`) and
/// commits it, durably if `durable`; returns a snapshot of the result.
/// The caller holds the store's batch lock with the [`Writer`] idle (so
/// there is no frozen memtable) or is the writer, and publishes the
/// snapshot without the memtable written.
pub(crate) fn write_out(
    backend: &Backend,
    txn: Option<redb::WriteTransaction>,
    mem: &MemRows,
    more: &[MemRow],
    consistent: (u64, u64),
    durable: bool,
) -> Result<Arc<ReadSnapshot>, MvccError> {
    let txn = match txn {
        Some(t) => t,
        None => backend.db().begin_write()?,
    };
    {
        let rows = mem.rows.read();
        if !rows.is_empty() || !more.is_empty() {
            let mut table = txn.open_table(KEY)?;
            for r in rows.iter().chain(more) {
                r.with_key(|k| table.insert(k, &r.row[..]))?;
            }
        }
    }
    let (index, term) = consistent;
    if index > 0 {
        let mut meta = txn.open_table(META)?;
        meta.insert(CONSISTENT_INDEX_KEY, index.to_be_bytes().as_slice())?;
        meta.insert(TERM_KEY, term.to_be_bytes().as_slice())?;
    }
    commit_with(txn, CommitPolicy::durable_if(durable))?;
    Ok(Arc::new(backend.begin_read()?))
}

/// Writes the published memtable to redb and publishes the result with an
/// empty one. Call with the batch lock held (no batch open); waits for a
/// background write-out first. A durable flush commits (and fsyncs) even
/// with nothing in memory, for what earlier visible-only commits wrote.
pub(crate) fn flush(
    backend: &Backend,
    published: &RwLock<Published>,
    writer: &Writer,
    durable: bool,
) -> Result<(), MvccError> {
    writer.wait_idle()?;
    let p = published.read().clone();
    if !durable && p.mem.is_empty() {
        return Ok(());
    }
    let snapshot = write_out(
        backend,
        None,
        &p.mem,
        &[],
        (p.consistent_index, p.term),
        durable,
    )?;
    let mut p = published.write();
    p.snapshot = snapshot;
    p.mem = Arc::default();
    p.flushed_rev = p.rev;
    Ok(())
}

/// Called with each background write-out's duration (the server's
/// backend-commit histogram).
pub type WriteOutObserver = Arc<dyn Fn(Duration) + Send + Sync>;

/// The frozen memtable handed to the writer thread.
struct Job {
    frozen: Arc<MemRows>,
    /// The revision and consistent index of the state frozen.
    rev: i64,
    consistent: (u64, u64),
}

#[derive(Default)]
struct WriterState {
    /// A write-out was handed over and has not finished.
    busy: bool,
    /// A write-out's failure, reported to every later caller (what it
    /// did not write stays frozen in memory; the server stops on it).
    error: Option<String>,
}

/// The background write-out (see the module documentation): one thread,
/// started on first use, one write-out at a time.
pub(crate) struct Writer {
    ctx: WriterCtx,
    /// The job queue to the thread (None until started, and after stop).
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Writer {
    pub(crate) fn new(backend: Arc<Backend>, published: Arc<RwLock<Published>>) -> Writer {
        Writer {
            ctx: WriterCtx {
                backend,
                published,
                state: Arc::default(),
                observer: Arc::default(),
            },
            queue: Mutex::new(None),
            thread: Mutex::new(None),
        }
    }

    pub(crate) fn set_observer(&self, o: WriteOutObserver) {
        *self.ctx.observer.write() = Some(o);
    }

    /// Waits until no write-out is running; reports the last one's failure.
    pub(crate) fn wait_idle(&self) -> Result<(), MvccError> {
        let (lock, idle) = &*self.ctx.state;
        let mut st = lock.lock();
        while st.busy {
            idle.wait(&mut st);
        }
        match &st.error {
            Some(e) => Err(MvccError::Backend(e.clone())),
            None => Ok(()),
        }
    }

    /// Freezes the published memtable and writes it (with the consistent
    /// index) to redb durably on the writer thread. Call with the batch
    /// lock held (no batch open). Returns false, doing nothing, while the
    /// previous write-out runs; the error of a failed one.
    pub(crate) fn start(&self) -> Result<bool, MvccError> {
        {
            let mut st = self.ctx.state.0.lock();
            if st.busy {
                return Ok(false);
            }
            if let Some(e) = &st.error {
                return Err(MvccError::Backend(e.clone()));
            }
            st.busy = true;
        }
        let job = {
            let mut p = self.ctx.published.write();
            // only a failed write-out leaves one, and its error is sticky
            debug_assert!(p.frozen.is_none());
            let frozen = std::mem::take(&mut p.mem);
            p.frozen = Some(frozen.clone());
            Job {
                frozen,
                rev: p.rev,
                consistent: (p.consistent_index, p.term),
            }
        };
        let mut queue = self.queue.lock();
        if queue.is_none() {
            let (tx, rx) = mpsc::channel::<Job>();
            let thread_ctx = self.ctx.clone();
            match std::thread::Builder::new()
                .name("mvcc-writer".into())
                .spawn(move || {
                    for job in rx {
                        let _ = thread_ctx.write(job);
                    }
                }) {
                Ok(h) => {
                    *self.thread.lock() = Some(h);
                    *queue = Some(tx);
                }
                Err(e) => tracing::warn!(error = %e, "mvcc: cannot start the writer thread"),
            }
        }
        let job = match queue.as_ref() {
            Some(tx) => match tx.send(job) {
                Ok(()) => return Ok(true),
                Err(mpsc::SendError(job)) => job,
            },
            None => job,
        };
        drop(queue);
        // no thread to hand it to: written here instead
        self.ctx.write(job).map(|()| true)
    }

    /// Stops the thread after the running write-out.
    pub(crate) fn stop(&self) {
        drop(self.queue.lock().take());
        if let Some(h) = self.thread.lock().take() {
            let _ = h.join();
        }
    }
}

/// What a write-out needs, for the writer thread (or the caller when
/// there is none).
#[derive(Clone)]
struct WriterCtx {
    backend: Arc<Backend>,
    published: Arc<RwLock<Published>>,
    /// `busy` and `error`; waited on through its condvar. Held briefly.
    state: Arc<(Mutex<WriterState>, Condvar)>,
    observer: Arc<RwLock<Option<WriteOutObserver>>>,
}

impl WriterCtx {
    /// Runs one write-out and ends it: not busy any more, its failure
    /// recorded (a panic too: `busy` left set would make every writer of
    /// redb wait forever), its time observed, waiters woken.
    fn write(&self, job: Job) -> Result<(), MvccError> {
        let started = Instant::now();
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run(&self.backend, &self.published, job)
        }))
        .unwrap_or_else(|_| {
            Err(MvccError::Backend(
                "the background write-out panicked".into(),
            ))
        });
        if let Some(o) = self.observer.read().as_ref() {
            o(started.elapsed());
        }
        let (lock, idle) = &*self.state;
        let mut st = lock.lock();
        st.busy = false;
        if let Err(e) = &res {
            tracing::error!(error = %e, "mvcc: background write-out failed");
            st.error.get_or_insert(e.to_string());
        }
        idle.notify_all();
        res
    }
}

/// One background write-out: the frozen rows, durably, then the snapshot
/// published without them. Nothing else changes the frozen memtable
/// meanwhile: every other writer of redb waits for this one first.
fn run(backend: &Backend, published: &RwLock<Published>, job: Job) -> Result<(), MvccError> {
    fail::fail_point!("mvcc_write_out", |_| {
        eprintln!("retcd: failpoint mvcc_write_out: crashing (abort)");
        std::process::abort()
    });
    fail::fail_point!("mvcc_write_out_error", |_| {
        eprintln!("retcd: failpoint mvcc_write_out_error: failing the write-out");
        Err(MvccError::Backend(
            "failpoint mvcc_write_out_error: injected write-out failure".into(),
        ))
    });
    let snapshot = write_out(backend, None, &job.frozen, &[], job.consistent, true)?;
    let mut p = published.write();
    debug_assert!(p
        .frozen
        .as_ref()
        .is_some_and(|f| Arc::ptr_eq(f, &job.frozen)));
    p.snapshot = snapshot;
    p.frozen = None;
    p.flushed_rev = job.rev;
    Ok(())
}
