//! The memtable (`memtable`): committed rows are read the same whether they
//! are still in memory or in redb, views keep reading across a write-out,
//! and nothing committed is lost when a batch aborts or the store closes.

use redb::ReadableTableMetadata;
use retcd_api::etcdserverpb::RangeRequest;
use retcd_storage::backend::{KEY, LEASES};

use crate::kvstore_test::{compact, del, new_store, put, put_req, reopen, rng};
use crate::memtable::RowSource;
use crate::revision::Revision;
use crate::watcher_group::WatchRange;
use crate::{KvStore, NoLeases};

/// Rows in redb's `key` table as a fresh read transaction sees them.
fn rows_in_redb(s: &KvStore) -> u64 {
    let txn = s.backend().begin_read().unwrap();
    match txn.open_table(KEY) {
        Ok(t) => t.len().unwrap(),
        Err(_) => 0,
    }
}

fn flush_durably(s: &KvStore) {
    s.begin_batch().unwrap().commit(true).unwrap();
}

fn values(s: &KvStore, rev: i64) -> Vec<(String, String)> {
    s.range(&RangeRequest {
        revision: rev,
        ..rng("", "\0")
    })
    .unwrap()
    .kvs
    .iter()
    .map(|kv| {
        (
            String::from_utf8_lossy(&kv.key).into_owned(),
            String::from_utf8_lossy(&kv.value).into_owned(),
        )
    })
    .collect()
}

fn put_at(s: &KvStore, k: &str, v: &str, index: u64) {
    let mut b = s.begin_batch().unwrap();
    b.put(&put_req(k, v), &NoLeases).unwrap();
    b.set_consistent_index(index, 2);
    b.commit(false).unwrap();
}

#[test]
fn test_rows_reach_redb_only_when_written_out() {
    let t = new_store();
    let s = &t.store;
    put(s, "a", "1");
    put(s, "b", "2");
    del(s, "a", "");
    assert_eq!(
        rows_in_redb(s),
        0,
        "a visible commit keeps its rows in memory"
    );
    assert_eq!(s.revision_count().unwrap(), 3);
    let want = vec![("b".to_string(), "2".to_string())];
    assert_eq!(values(s, 0), want);
    assert_eq!(
        values(s, 3),
        vec![("a".into(), "1".into()), ("b".into(), "2".into())]
    );
    flush_durably(s);
    assert_eq!(rows_in_redb(s), 3);
    assert!(s.published.read().mem.is_empty());
    assert_eq!(s.revision_count().unwrap(), 3);
    assert_eq!(values(s, 0), want);
    assert_eq!(
        values(s, 3),
        vec![("a".into(), "1".into()), ("b".into(), "2".into())]
    );
}

#[test]
fn test_a_view_keeps_reading_across_a_write_out() {
    let t = new_store();
    let s = &t.store;
    put(s, "a", "1");
    let old = s.published.read().rows_at();
    put(s, "a", "2");
    flush_durably(s);
    put(s, "a", "3");
    let rows = old.open().unwrap();
    let first = rows.row(Revision::new(2, 0)).unwrap();
    assert_eq!(
        crate::range::read_kv(&rows, Revision::new(2, 0))
            .unwrap()
            .value,
        "1"
    );
    drop(first);
    // the old view does not see what was committed after it
    assert!(rows.find_row(Revision::new(3, 0)).unwrap().is_none());
    assert!(rows.find_row(Revision::new(4, 0)).unwrap().is_none());
    let now = s.published.read().rows_at().open().unwrap();
    assert_eq!(
        crate::range::read_kv(&now, Revision::new(3, 0))
            .unwrap()
            .value,
        "2"
    );
    assert_eq!(
        crate::range::read_kv(&now, Revision::new(4, 0))
            .unwrap()
            .value,
        "3"
    );
}

#[test]
fn test_hash_dump_and_history_are_the_same_in_memory_or_in_redb() {
    let t = new_store();
    let s = &t.store;
    for i in 0..20u64 {
        put_at(s, &format!("k{}", i % 7), &format!("v{i}"), 10 + i);
    }
    del(s, "k1", "k3");
    flush_durably(s);
    for i in 20..40u64 {
        put_at(s, &format!("k{}", i % 7), &format!("v{i}"), 10 + i);
    }
    del(s, "k4", "");
    assert!(rows_in_redb(s) > 0 && !s.published.read().mem.is_empty());
    let all = WatchRange::new(b"k", b"l").unwrap();
    let before = (
        s.hash().unwrap(),
        s.hash_kv(0).unwrap(),
        s.hash_kv(30).unwrap(),
        s.dump().unwrap(),
        s.events_between(1, s.current_revision(), &all).unwrap(),
        values(s, 15),
    );
    assert_eq!(
        before.4.len(),
        43,
        "every put and tombstone, redb's and memory's"
    );
    flush_durably(s);
    assert!(s.published.read().mem.is_empty());
    let after = (
        s.hash().unwrap(),
        s.hash_kv(0).unwrap(),
        s.hash_kv(30).unwrap(),
        s.dump().unwrap(),
        s.events_between(1, s.current_revision(), &all).unwrap(),
        values(s, 15),
    );
    assert!(
        before == after,
        "hashes, dump, history or a past read changed"
    );
    // the dump carries the consistent index of the memtable's last batch
    let restored = new_store();
    restored.store.restore_from(&before.3).unwrap();
    assert_eq!(restored.store.consistent_index(), 49);
    assert_eq!(values(&restored.store, 0), values(s, 0));
}

#[test]
fn test_an_aborted_batch_keeps_the_committed_rows_in_memory() {
    let t = new_store();
    let s = &t.store;
    put(s, "a", "1");
    {
        let mut b = s.begin_batch().unwrap();
        b.put(&put_req("b", "2"), &NoLeases).unwrap();
        // dropped without commit
    }
    assert_eq!(values(s, 0), vec![("a".into(), "1".into())]);
    assert_eq!(s.current_revision(), 2);
    assert_eq!(put(s, "c", "3"), 3);
    assert_eq!(
        values(s, 0),
        vec![("a".into(), "1".into()), ("c".into(), "3".into())]
    );
}

#[test]
fn test_a_dropped_store_writes_its_memtable() {
    let t = new_store();
    put_at(&t.store, "a", "1", 7);
    put_at(&t.store, "b", "2", 8);
    assert_eq!(rows_in_redb(&t.store), 0);
    let t = reopen(t);
    assert_eq!(
        values(&t.store, 0),
        vec![("a".into(), "1".into()), ("b".into(), "2".into())]
    );
    assert_eq!(t.store.consistent_index(), 8);
}

#[test]
fn test_a_batch_writing_another_table_writes_the_memtable_with_it() {
    let t = new_store();
    let s = &t.store;
    put(s, "a", "1");
    let mut b = s.begin_batch().unwrap();
    b.put(&put_req("b", "2"), &NoLeases).unwrap();
    b.backend_txn()
        .unwrap()
        .open_table(LEASES)
        .unwrap()
        .insert(5, b"lease".as_slice())
        .unwrap();
    b.commit(false).unwrap();
    assert_eq!(rows_in_redb(s), 2);
    assert!(s.published.read().mem.is_empty());
    assert_eq!(s.published.read().flushed_rev, 3);
}

#[test]
fn test_compaction_deletes_rows_that_were_in_memory() {
    let t = new_store();
    let s = &t.store;
    for i in 0..10 {
        put(s, "a", &i.to_string());
    }
    compact(s, 8).unwrap();
    assert!(s.wait_compacted_blocking(8, std::time::Duration::from_secs(30)));
    put(s, "a", "x");
    flush_durably(s);
    // revisions 2..=7 deleted; 8 (kept: a's value at the compaction), 9,
    // 10, 11 and 12 left
    assert_eq!(rows_in_redb(s), 5);
    assert_eq!(values(s, 8), vec![("a".into(), "6".into())]);
}

/// Background write-outs while one thread writes and two read: every read
/// (at the current revision and at older ones) finds each key's value of
/// that revision, a hash at a fixed revision never changes, and at the end
/// every row is in redb.
#[test]
fn test_background_write_outs_under_reads_and_writes() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const PUTS: usize = 3000;
    let t = new_store();
    let s = t.store.clone();
    let done = std::sync::Arc::new(AtomicBool::new(false));
    // readers that have read once (in release the puts can end before a
    // reader's first read)
    let reading = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let check = |s: &KvStore, rev: i64| {
        let r = s
            .range(&RangeRequest {
                revision: rev,
                ..rng("", "\0")
            })
            .unwrap();
        for kv in &r.kvs {
            assert!(rev == 0 || kv.mod_revision <= rev);
            assert_eq!(
                String::from_utf8_lossy(&kv.value),
                (kv.mod_revision - 2).to_string(),
                "value of {:?} at {rev}",
                String::from_utf8_lossy(&kv.key)
            );
        }
        r.kvs.len()
    };
    let readers: Vec<_> = (0..2)
        .map(|n| {
            let s = s.clone();
            let done = done.clone();
            let reading = reading.clone();
            std::thread::spawn(move || {
                let mut reads = 0;
                let mut hashed: Option<(i64, u32)> = None;
                while !done.load(Ordering::Relaxed) {
                    let cur = s.current_revision();
                    check(&s, 0);
                    check(&s, 1 + (cur * 7 + n) % cur);
                    reads += 1;
                    if reads == 1 {
                        reading.fetch_add(1, Ordering::Relaxed);
                    }
                    match hashed {
                        None if cur > 100 => hashed = Some((cur, s.hash_kv(cur).unwrap().0)),
                        Some((at, h)) => assert_eq!(s.hash_kv(at).unwrap().0, h, "hash at {at}"),
                        None => {}
                    }
                }
                reads
            })
        })
        .collect();
    let mut started = 0;
    for i in 0..PUTS {
        assert_eq!(
            put(&s, &format!("k{}", i % 50), &i.to_string()),
            i as i64 + 2
        );
        if i % 50 == 49 && s.write_out_background().unwrap() {
            started += 1;
        }
    }
    while reading.load(Ordering::Relaxed) < 2 {
        std::thread::yield_now();
    }
    done.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    s.writer.wait_idle().unwrap();
    assert!(started > 0);
    flush_durably(&s);
    assert_eq!(rows_in_redb(&s), PUTS as u64);
    assert_eq!(check(&s, 0), 50);
}

#[test]
fn test_rows_after_a_freeze_stay_in_memory_until_the_next_write_out() {
    let t = new_store();
    let s = &t.store;
    put(s, "a", "1");
    assert!(s.write_out_background().unwrap());
    put(s, "b", "2");
    s.writer.wait_idle().unwrap();
    assert_eq!(rows_in_redb(s), 1, "only the frozen row");
    {
        let p = s.published.read();
        assert!(p.frozen.is_none());
        assert_eq!(p.flushed_rev, 2);
        assert!(!p.mem.is_empty());
    }
    assert_eq!(
        values(s, 0),
        vec![("a".into(), "1".into()), ("b".into(), "2".into())]
    );
    assert!(s.write_out_background().unwrap());
    s.writer.wait_idle().unwrap();
    assert_eq!(rows_in_redb(s), 2);
}
