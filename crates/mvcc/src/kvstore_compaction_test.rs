//! Tests of the background compactor (`kvstore_compaction`): batches
//! interleave with writes, resume after a restart or a snapshot restore,
//! queue in order, and never change `hash_kv`.

use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use parking_lot::Mutex;
use redb::ReadableTable;
use retcd_api::etcdserverpb::{
    request_op, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use retcd_storage::backend::{Backend, KEY};

use crate::{CompactionConfig, CompactionObserver, KvStore, MvccError, NoLeases};

const WAIT: Duration = Duration::from_secs(60);

pub(crate) fn open(dir: &Path, batch_limit: usize) -> Arc<KvStore> {
    let backend = Arc::new(Backend::open(&dir.join("db")).unwrap());
    Arc::new(
        KvStore::open_with(
            backend,
            CompactionConfig {
                batch_limit,
                sleep_interval: Duration::ZERO,
                observer: None,
            },
        )
        .unwrap(),
    )
}

/// `n` revisions over keys `k00..k{width}`: mostly a txn putting every key
/// (`width` rows under one revision), every 5th a delete of one key (a
/// tombstone, so generations end and restart).
pub(crate) fn history(s: &KvStore, n: usize, width: usize) {
    let mut b = s.begin_batch().unwrap();
    for i in 0..n {
        if i % 5 == 4 {
            b.delete_range(&DeleteRangeRequest {
                key: format!("k{:02}", (i / 5) % width).into(),
                ..Default::default()
            })
            .unwrap();
        } else {
            let success = (0..width)
                .map(|k| RequestOp {
                    request: Some(request_op::Request::RequestPut(PutRequest {
                        key: format!("k{k:02}").into(),
                        value: format!("v{i}").into(),
                        ..Default::default()
                    })),
                })
                .collect();
            b.txn(
                &TxnRequest {
                    success,
                    ..Default::default()
                },
                &NoLeases,
            )
            .unwrap();
        }
        if i % 50 == 49 {
            b.commit(false).unwrap();
            b = s.begin_batch().unwrap();
        }
    }
    b.commit(false).unwrap();
}

/// Applies and commits a compaction; the deletion runs in the background.
pub(crate) fn schedule(s: &KvStore, rev: i64) {
    let mut b = s.begin_batch().unwrap();
    b.compact(rev, false).unwrap();
    b.commit(false).unwrap();
}

pub(crate) fn put(s: &KvStore, k: &str, v: &str) -> i64 {
    let mut b = s.begin_batch().unwrap();
    let r = b
        .put(
            &PutRequest {
                key: k.into(),
                value: v.into(),
                ..Default::default()
            },
            &NoLeases,
        )
        .unwrap();
    b.commit(false).unwrap();
    r.header.unwrap().revision
}

/// Every row of the `key` table (committed state).
pub(crate) fn rows(s: &KvStore) -> Vec<(Vec<u8>, Vec<u8>)> {
    let snap = s.published.read().snapshot.clone();
    let t = snap.open_table(KEY).unwrap();
    t.iter()
        .unwrap()
        .map(|e| {
            let (k, v) = e.unwrap();
            (k.value().to_vec(), v.value().to_vec())
        })
        .collect()
}

fn all_at(s: &KvStore, rev: i64) -> Result<Vec<retcd_api::mvccpb::KeyValue>, MvccError> {
    s.range(&RangeRequest {
        key: vec![0],
        range_end: vec![0],
        revision: rev,
        ..Default::default()
    })
    .map(|r| r.kvs)
}

/// An observer that reports each batch and then holds the compactor (outside
/// the batch lock) until the test lets it go: one `step()` per batch, or
/// `release()` for good.
pub(crate) struct Gate {
    batches: Mutex<mpsc::Sender<u64>>,
    proceed: Mutex<Option<mpsc::Receiver<()>>>,
    finished: Mutex<Vec<i64>>,
}

pub(crate) struct GateCtl {
    pub(crate) gate: Arc<Gate>,
    batches: mpsc::Receiver<u64>,
    proceed: Option<mpsc::Sender<()>>,
}

impl Gate {
    pub(crate) fn install(s: &KvStore) -> GateCtl {
        let (btx, brx) = mpsc::channel();
        let (ptx, prx) = mpsc::channel();
        let gate = Arc::new(Gate {
            batches: Mutex::new(btx),
            proceed: Mutex::new(Some(prx)),
            finished: Mutex::new(Vec::new()),
        });
        s.set_compaction_observer(gate.clone());
        GateCtl {
            gate,
            batches: brx,
            proceed: Some(ptx),
        }
    }
}

impl GateCtl {
    /// Waits until the compactor committed its next batch (and is held);
    /// returns the rows that batch deleted.
    pub(crate) fn next_batch(&self) -> u64 {
        self.batches.recv_timeout(WAIT).expect("a compaction batch")
    }
    /// Lets the held compactor run one more batch.
    pub(crate) fn step(&self) {
        self.proceed.as_ref().unwrap().send(()).unwrap();
    }
    /// Lets the compactor run freely from now on (also the held batch).
    pub(crate) fn release(&mut self) {
        self.proceed = None;
    }
    pub(crate) fn finished(&self) -> Vec<i64> {
        self.gate.finished.lock().clone()
    }
}

impl CompactionObserver for Gate {
    fn batch(&self, _pause: Duration, deleted: u64) {
        let _ = self.batches.lock().send(deleted);
        if let Some(rx) = &*self.proceed.lock() {
            let _ = rx.recv();
        }
    }
    fn finished(&self, rev: i64, _total: Duration) {
        self.finished.lock().push(rev);
    }
}

/// The same history compacted at `rev` without interruption.
fn reference(n: usize, width: usize, rev: i64) -> (tempfile::TempDir, Arc<KvStore>) {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path(), 1000);
    history(&s, n, width);
    schedule(&s, rev);
    assert!(s.wait_compacted_blocking(rev, WAIT));
    (dir, s)
}

#[test]
fn test_compaction_deletes_in_batches_while_writes_go_on() {
    let (n, width) = (60, 40);
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path(), 100);
    history(&s, n, width);
    // compact a little below the head; hash at the head (hash_kv refuses
    // the compaction revision itself, as etcd)
    let hr = s.current_revision();
    let rev = hr - 2;
    let (_rd, r) = reference(n, width, rev);
    let total = s.revision_count().unwrap();
    let want_rows = r.revision_count().unwrap();
    let latest = all_at(&s, hr).unwrap();
    let mut gate = Gate::install(&s);

    schedule(&s, rev);
    // Applied: the compaction revision moved at once, nothing deleted yet
    // on the apply path.
    assert_eq!(s.compact_revision(), rev);
    assert!(s.finished_compact_revision() < rev);
    assert_eq!(all_at(&s, rev - 1), Err(MvccError::Compacted));
    assert_eq!(all_at(&s, hr).unwrap(), latest);

    // First batch committed, compactor held: partially deleted.
    assert_eq!(gate.next_batch(), 100);
    assert_eq!(s.revision_count().unwrap(), total - 100);
    assert!(s.finished_compact_revision() < rev);
    // Writes and reads go on between batches; the hash does not move.
    assert_eq!(s.hash_kv(hr).unwrap(), r.hash_kv(hr).unwrap());
    let mut wrote = 0;
    for i in 0..5 {
        put(&s, "during", &i.to_string());
        wrote += 1;
        gate.step();
        gate.next_batch();
        assert_eq!(s.hash_kv(hr).unwrap(), r.hash_kv(hr).unwrap());
        assert_eq!(all_at(&s, hr).unwrap(), latest);
    }
    assert!(s.revision_count().unwrap() > want_rows + wrote);
    gate.release();
    assert!(s.wait_compacted_blocking(rev, WAIT));
    assert_eq!(gate.finished(), vec![rev]);
    assert_eq!(s.revision_count().unwrap(), want_rows + wrote);
    assert_eq!(s.hash_kv(hr).unwrap(), r.hash_kv(hr).unwrap());
    assert_eq!(
        rows(&s)[..want_rows as usize],
        rows(&r)[..],
        "same rows as a store that compacted without pause"
    );
    assert_eq!(s.compactions_pending(), 0);
}

#[test]
fn test_compaction_resumes_after_restart() {
    let (n, width) = (60, 20);
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path(), 50);
    history(&s, n, width);
    let hr = s.current_revision();
    let rev = hr - 1;
    let (_rd, r) = reference(n, width, rev);
    let mut gate = Gate::install(&s);
    schedule(&s, rev);
    gate.next_batch();
    gate.next_batch_after_step();
    // "Crash" between batches: stop the compactor after the second batch.
    s.compactor.stop.set();
    gate.release();
    s.compactor.shutdown();
    let partial = s.revision_count().unwrap();
    assert!(partial > r.revision_count().unwrap());
    assert!(s.finished_compact_revision() < rev);
    let hash = s.hash_kv(hr).unwrap();
    let mut b = s.begin_batch().unwrap();
    b.set_consistent_index(7, 1);
    b.commit(true).unwrap();
    drop(s);

    let s = open(dir.path(), 1000);
    // Before the deletion resumes (or while): compacted at the scheduled
    // revision, same reads and hash as a member that finished.
    assert_eq!(s.compact_revision(), rev);
    assert_eq!(all_at(&s, rev - 1), Err(MvccError::Compacted));
    assert_eq!(all_at(&s, rev).unwrap(), all_at(&r, rev).unwrap());
    assert_eq!(all_at(&s, hr).unwrap(), all_at(&r, hr).unwrap());
    assert_eq!(s.hash_kv(hr).unwrap(), hash);
    assert!(s.wait_compacted_blocking(rev, WAIT));
    assert_eq!(s.finished_compact_revision(), rev);
    assert_eq!(rows(&s), rows(&r));
    assert_eq!(s.hash_kv(hr).unwrap(), r.hash_kv(hr).unwrap());
    assert_eq!(s.hash().unwrap(), r.hash().unwrap());
    // and it keeps going like the other
    assert_eq!(put(&s, "k00", "x"), put(&r, "k00", "x"));
    assert_eq!(all_at(&s, 0).unwrap(), all_at(&r, 0).unwrap());
}

impl GateCtl {
    fn next_batch_after_step(&self) -> u64 {
        self.step();
        self.next_batch()
    }
}

#[test]
fn test_hash_kv_independent_of_progress_when_nothing_is_kept() {
    // Every key deleted before the compaction: the keep set is empty, and
    // etcd would hash the leftover rows; we must not.
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path(), 10);
    let dir2 = tempfile::tempdir().unwrap();
    let r = open(dir2.path(), 1000);
    for st in [&s, &r] {
        for i in 0..30 {
            put(st, &format!("a{}", i % 3), "v");
        }
        let mut b = st.begin_batch().unwrap();
        b.delete_range(&DeleteRangeRequest {
            key: b"a".to_vec(),
            range_end: b"b".to_vec(),
            ..Default::default()
        })
        .unwrap();
        b.commit(false).unwrap();
        put(st, "z", "after");
    }
    let hr = s.current_revision();
    let rev = hr - 1;
    schedule(&r, rev);
    assert!(r.wait_compacted_blocking(rev, WAIT));
    assert_eq!(
        r.revision_count().unwrap(),
        4,
        "z and the tombstones at the compaction revision are left"
    );
    let mut gate = Gate::install(&s);
    schedule(&s, rev);
    assert_eq!(gate.next_batch(), 10);
    assert_eq!(s.hash_kv(hr).unwrap(), r.hash_kv(hr).unwrap());
    assert_eq!(s.hash_kv(0).unwrap(), r.hash_kv(0).unwrap());
    gate.release();
    assert!(s.wait_compacted_blocking(rev, WAIT));
    assert_eq!(s.revision_count().unwrap(), 4);
    assert_eq!(s.hash_kv(hr).unwrap(), r.hash_kv(hr).unwrap());
}

#[test]
fn test_compactions_queue_in_order() {
    let (n, width) = (80, 10);
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path(), 20);
    history(&s, n, width);
    let (c1, c2, c3) = (20, 40, s.current_revision());
    let mut gate = Gate::install(&s);
    schedule(&s, c1);
    gate.next_batch();
    // Two more while the first is held: they queue behind it.
    schedule(&s, c2);
    schedule(&s, c3);
    assert_eq!(s.compact_revision(), c3);
    assert_eq!(s.compactions_pending(), 3);
    assert!(s.finished_compact_revision() < c1);
    gate.release();
    assert!(s.wait_compacted_blocking(c3, WAIT));
    assert_eq!(gate.finished(), vec![c1, c2, c3]);
    assert_eq!(s.compactions_pending(), 0);
    let (_rd, r) = reference(n, width, c3);
    assert_eq!(rows(&s), rows(&r));
}

#[test]
fn test_restore_from_snapshot_taken_mid_deletion() {
    let (n, width) = (60, 20);
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path(), 50);
    history(&a, n, width);
    let hr = a.current_revision();
    let rev = hr - 3;
    let (_rd, r) = reference(n, width, rev);
    let mut gate_a = Gate::install(&a);
    schedule(&a, rev);
    gate_a.next_batch();
    let dump = a.dump().unwrap();

    // B has its own compaction held mid-way when the snapshot arrives.
    let dir_b = tempfile::tempdir().unwrap();
    let b = open(dir_b.path(), 10);
    history(&b, 30, 5);
    let mut gate_b = Gate::install(&b);
    schedule(&b, 20);
    gate_b.next_batch();
    b.restore_from(&dump).unwrap();
    assert_eq!(b.compact_revision(), rev);
    assert_eq!(b.hash_kv(hr).unwrap(), r.hash_kv(hr).unwrap());
    gate_b.release();
    assert!(b.wait_compacted_blocking(rev, WAIT));
    // B's own job was dropped as stale; the restored one finished.
    assert_eq!(gate_b.finished(), vec![rev]);
    assert_eq!(rows(&b), rows(&r));
    gate_a.release();
    assert!(a.wait_compacted_blocking(rev, WAIT));
    assert_eq!(rows(&a), rows(&r));
}

#[test]
fn test_drop_mid_compaction_stops_and_reopen_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(Backend::open(&dir.path().join("db")).unwrap());
    let s = Arc::new(
        KvStore::open_with(
            backend,
            CompactionConfig {
                batch_limit: 10,
                // ~ 150 batches: seconds if it were not stopped
                sleep_interval: Duration::from_millis(50),
                observer: None,
            },
        )
        .unwrap(),
    );
    history(&s, 60, 25);
    let rev = s.current_revision();
    let mut gate = Gate::install(&s);
    schedule(&s, rev);
    gate.next_batch();
    gate.release();
    let mut b = s.begin_batch().unwrap();
    b.set_consistent_index(3, 1);
    b.commit(true).unwrap();
    // Dropping the store stops the compactor in its sleep and joins it.
    drop(s);
    let s = open(dir.path(), 1000);
    assert_eq!(s.compact_revision(), rev);
    assert!(s.wait_compacted_blocking(rev, WAIT));
    let (_rd, r) = reference(60, 25, rev);
    assert_eq!(rows(&s), rows(&r));
}

#[test]
fn test_wait_compacted_resolves_after_deletion() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path(), 10);
    history(&s, 20, 10);
    let rev = s.current_revision();
    let mut gate = Gate::install(&s);
    schedule(&s, rev);
    gate.next_batch();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let wait = s.wait_compacted(rev);
    // Held mid-deletion: not resolved.
    rt.block_on(async {
        let r = tokio::time::timeout(Duration::from_millis(50), s.wait_compacted(rev)).await;
        assert!(r.is_err(), "resolved before the deletion finished");
    });
    gate.release();
    rt.block_on(wait);
    assert_eq!(s.finished_compact_revision(), rev);
    // an older revision resolves at once
    rt.block_on(s.wait_compacted(rev - 1));
}
