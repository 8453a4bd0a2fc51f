//! Online defrag: rewrites the backend into a fresh file while puts and
//! reads go on, then swaps the file under a pause that only writers notice
//! and that lasts one short catch-up.
//!
//! Why this is correct: the `key` table is append-only at its end — every
//! new row has a revision above the store's published revision — and only
//! compaction removes rows, always at or below the compaction revision.
//! So the rows that differ between two published states `a` and `b` are
//! (1) rows with main revision `> a.rev` (copy them from `b`) and
//! (2) rows the background compactor deleted in between (remove them):
//! each state carries the compactor's progress mark (job, cursor), so
//! only the key range it went over is compared. The other tables are
//! small and copied whole. The compactor's batches take the batch lock,
//! so none runs during the final round and swap: a batch committed before
//! it is caught up, one after it runs on the new file. A `restore_from` (raft snapshot) meanwhile breaks the premise:
//! the defrag is abandoned.
//!
//! Example: store at rev 1000 (S0). Copy S0's 1000 revisions while puts
//! 1001..1400 commit and a compaction at 900 runs. Round 1 (S1, rev 1400,
//! compact 900): copy revisions >= 1001, remove rows <= 900 that S1 lacks.
//! Final round, batch lock held (S2, rev 1403): copy >= 1401, compare
//! counts, commit durably, rename, swap. Writers waited for the final
//! round only; readers never waited (they read S0..S2 from the old file
//! until the swap publishes a snapshot of the new one).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redb::ReadableTableMetadata;
use retcd_storage::backend::defrag::DefragTarget;
use retcd_storage::backend::KEY;

use crate::kvstore::{KvStore, Published};
use crate::revision::Revision;
use crate::MvccError;

/// Catch-up rounds before the final (paused) one, at most.
const MAX_ROUNDS: usize = 4;
/// A round shorter than this leaves little for the final round.
const SHORT_ROUND: Duration = Duration::from_millis(20);

/// What a defrag did.
#[derive(Clone, Debug, Default)]
pub struct DefragStats {
    /// File size before and after, in bytes.
    pub size_before: u64,
    pub size_after: u64,
    /// Rows copied (all rounds).
    pub rows_copied: u64,
    /// Catch-up rounds run without the pause.
    pub rounds: usize,
    /// How long writers were held (the final round and the swap).
    pub pause: Duration,
    /// Wall time of the whole defrag.
    pub total: Duration,
}

fn catch_up(target: &DefragTarget, from: &Published, to: &Published) -> Result<u64, MvccError> {
    let mut n = 0;
    // `from`'s file holds its rows up to `flushed_rev` (the rest were in
    // its memtable, and may be in `to`'s file now)
    if to.flushed_rev > from.flushed_rev {
        let start = Revision::new(from.flushed_rev + 1, 0).to_bytes();
        n += target.copy_keys(&to.snapshot, Some(&start))?;
    }
    // Rows the background compactor deleted between the two states: by
    // its progress marks, only the range it went over (see
    // `CompactionMark::deleted_since`).
    if let Some((lower, upper)) = from
        .compaction_mark
        .deleted_since(&to.compaction_mark, to.compact_rev)
    {
        n += target.remove_compacted(&to.snapshot, lower.as_deref(), &upper)?;
    }
    n += target.copy_small_tables(&to.snapshot)?;
    Ok(n)
}

impl KvStore {
    /// Defragments the backend without stopping readers or (for more than
    /// one short catch-up) writers; see the module documentation.
    pub fn defrag(&self) -> Result<DefragStats, MvccError> {
        let _one = self.defrag_lock.lock();
        let started = Instant::now();
        let mut stats = DefragStats {
            size_before: self.backend.size(),
            ..Default::default()
        };
        let restores = self.restores.load(Ordering::SeqCst);
        let target = DefragTarget::create(&self.backend)?;
        let mut prev = self.published.read().clone();
        DefragTarget::check_tables(&prev.snapshot)?;
        stats.rows_copied += target.copy_keys(&prev.snapshot, None)?;
        stats.rows_copied += target.copy_small_tables(&prev.snapshot)?;
        for _ in 0..MAX_ROUNDS {
            let t = Instant::now();
            let cur = self.published.read().clone();
            stats.rows_copied += catch_up(&target, &prev, &cur)?;
            stats.rounds += 1;
            prev = cur;
            if t.elapsed() < SHORT_ROUND {
                break;
            }
        }
        // Make the bulk durable now, so the paused commit fsyncs little.
        target.sync()?;
        let paused = Instant::now();
        {
            let _guard = self.batch_lock.lock();
            self.writer.wait_idle()?;
            if self.restores.load(Ordering::SeqCst) != restores {
                return Err(MvccError::Backend(
                    "defrag: the store was replaced by a snapshot meanwhile; try again".into(),
                ));
            }
            // With the batch lock held the published state is the last
            // commit of the live file.
            let last = self.published.read().clone();
            stats.rows_copied += catch_up(&target, &prev, &last)?;
            let want = last.snapshot.open_table(KEY)?.len()?;
            let got = target.key_rows()?;
            if want != got {
                return Err(MvccError::Backend(format!(
                    "defrag: copy has {got} revisions, store has {want}; defrag abandoned"
                )));
            }
            target.finish(&self.backend)?;
            let snapshot = Arc::new(self.backend.begin_read()?);
            self.published.write().snapshot = snapshot;
        }
        stats.pause = paused.elapsed();
        stats.size_after = self.backend.size();
        stats.total = started.elapsed();
        tracing::info!(
            size_before = stats.size_before,
            size_after = stats.size_after,
            rows = stats.rows_copied,
            rounds = stats.rounds,
            pause_ms = stats.pause.as_secs_f64() * 1000.0,
            took_ms = stats.total.as_secs_f64() * 1000.0,
            "mvcc: defragmented the backend"
        );
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use retcd_api::etcdserverpb::{PutRequest, RangeRequest};

    use crate::kvstore_test::{new_store, reopen};
    use crate::NoLeases;

    use super::*;

    pub(super) fn put(s: &KvStore, k: &str, v: &[u8]) {
        let mut b = s.begin_batch().unwrap();
        b.put(
            &PutRequest {
                key: k.into(),
                value: v.to_vec(),
                ..Default::default()
            },
            &NoLeases,
        )
        .unwrap();
        b.commit(false).unwrap();
    }

    fn all(s: &KvStore) -> Vec<(Vec<u8>, i64, i64, i64)> {
        s.range(&RangeRequest {
            key: vec![0],
            range_end: vec![0],
            ..Default::default()
        })
        .unwrap()
        .kvs
        .into_iter()
        .map(|kv| {
            (
                kv.key.to_vec(),
                kv.create_revision,
                kv.mod_revision,
                kv.version,
            )
        })
        .collect()
    }

    #[test]
    fn test_defrag_shrinks_and_keeps_everything_under_concurrent_writes() {
        let t = new_store();
        let s = t.store.clone();
        let big = vec![7u8; 2000];
        for i in 0..3000 {
            put(&s, &format!("k{}", i % 100), &big);
        }
        crate::kvstore_test::compact(&s, 2900).unwrap();
        let before = s.backend().size();
        let stop = Arc::new(AtomicBool::new(false));
        let started = Arc::new(std::sync::Barrier::new(2));
        let writer = {
            let s = s.clone();
            let stop = stop.clone();
            let started = started.clone();
            std::thread::spawn(move || {
                put(&s, "w0", b"v");
                started.wait();
                let mut n = 1;
                while !stop.load(Ordering::Relaxed) {
                    put(&s, &format!("w{n}"), b"v");
                    n += 1;
                }
                n
            })
        };
        // the writer is running when the defrag starts (on a busy machine
        // it could otherwise not be scheduled before the defrag is over)
        started.wait();
        let stats = s.defrag().unwrap();
        stop.store(true, Ordering::Relaxed);
        let writes = writer.join().unwrap();
        assert!(writes > 0);
        eprintln!("{stats:?} before {before} writes during defrag {writes}");
        assert!(stats.size_after < before, "{stats:?} before {before}");
        let (h1, _, _) = s.hash_kv(0).unwrap();
        let rows = all(&s);
        assert_eq!(rows.len(), 100 + writes);
        // writes after the swap land in the new file
        put(&s, "after", b"x");
        let (h2, _, _) = s.hash_kv(0).unwrap();
        assert_ne!(h1, h2);
        let rev = s.current_revision();
        drop(s);
        let t = reopen(t);
        assert_eq!(t.store.current_revision(), rev);
        assert_eq!(t.store.hash_kv(0).unwrap().0, h2);
        assert_eq!(all(&t.store).len(), 100 + writes + 1);
    }

    #[test]
    fn test_defrag_catches_up_a_compaction() {
        let t = new_store();
        let s = t.store.clone();
        for i in 0..500 {
            put(&s, &format!("k{}", i % 10), b"v");
        }
        let target = DefragTarget::create(s.backend()).unwrap();
        let a = s.published.read().clone();
        target.copy_keys(&a.snapshot, None).unwrap();
        target.copy_small_tables(&a.snapshot).unwrap();
        crate::kvstore_test::compact(&s, 400).unwrap();
        put(&s, "z", b"z");
        let b = s.published.read().clone();
        catch_up(&target, &a, &b).unwrap();
        assert_eq!(
            target.key_rows().unwrap(),
            b.snapshot.open_table(KEY).unwrap().len().unwrap()
        );
    }
}

#[cfg(test)]
mod compactor_tests {
    use std::time::Duration;

    use redb::ReadableTableMetadata;

    use crate::kvstore_compaction_test::{history, open, put, rows, schedule, Gate};

    use super::*;

    fn live_rows(p: &Published) -> u64 {
        p.snapshot.open_table(KEY).unwrap().len().unwrap()
    }

    /// Batches of the background compactor between catch-up rounds are
    /// removed from the copy, by the range the compactor went over.
    #[test]
    fn test_defrag_catches_up_background_compaction_batches() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path(), 50);
        history(&s, 60, 20);
        let rev = s.current_revision() - 1;
        let mut gate = Gate::install(&s);
        schedule(&s, rev);
        gate.next_batch();
        let target = DefragTarget::create(s.backend()).unwrap();
        let a = s.published.read().clone();
        target.copy_keys(&a.snapshot, None).unwrap();
        target.copy_small_tables(&a.snapshot).unwrap();
        // two more batches and a write
        gate.step();
        gate.next_batch();
        gate.step();
        gate.next_batch();
        put(&s, "new", "x");
        let b = s.published.read().clone();
        let (lower, _) = a
            .compaction_mark
            .deleted_since(&b.compaction_mark, b.compact_rev)
            .unwrap();
        assert!(lower.is_some(), "same job: only the range it went over");
        catch_up(&target, &a, &b).unwrap();
        assert_eq!(target.key_rows().unwrap(), live_rows(&b));
        gate.release();
        assert!(s.wait_compacted_blocking(rev, Duration::from_secs(60)));
        let c = s.published.read().clone();
        catch_up(&target, &b, &c).unwrap();
        assert_eq!(target.key_rows().unwrap(), live_rows(&c));
        // a new job after a finished one
        let rev2 = s.current_revision();
        schedule(&s, rev2);
        assert!(s.wait_compacted_blocking(rev2, Duration::from_secs(60)));
        let d = s.published.read().clone();
        assert!(live_rows(&d) < live_rows(&c));
        catch_up(&target, &c, &d).unwrap();
        assert_eq!(target.key_rows().unwrap(), live_rows(&d));
    }

    /// A whole online defrag while the compactor deletes: nothing lost,
    /// nothing left behind, no deadlock.
    #[test]
    fn test_defrag_while_compactor_runs() {
        let dir = tempfile::tempdir().unwrap();
        let backend =
            Arc::new(retcd_storage::backend::Backend::open(&dir.path().join("db")).unwrap());
        let s = Arc::new(
            KvStore::open_with(
                backend,
                crate::CompactionConfig {
                    batch_limit: 20,
                    sleep_interval: Duration::from_millis(1),
                    observer: None,
                },
            )
            .unwrap(),
        );
        history(&s, 200, 20);
        let rev = s.current_revision() - 1;
        schedule(&s, rev);
        let stats = s.defrag().unwrap();
        assert!(s.wait_compacted_blocking(rev, Duration::from_secs(60)));
        eprintln!("{stats:?}");
        let ref_dir = tempfile::tempdir().unwrap();
        let r = open(ref_dir.path(), 1000);
        history(&r, 200, 20);
        schedule(&r, rev);
        assert!(r.wait_compacted_blocking(rev, Duration::from_secs(60)));
        assert_eq!(rows(&s), rows(&r));
        let hash = s.hash_kv(0).unwrap();
        assert_eq!(hash, r.hash_kv(0).unwrap());
        drop(s);
        let s = open(dir.path(), 1000);
        assert_eq!(rows(&s), rows(&r));
        assert_eq!(s.hash_kv(0).unwrap(), hash);
    }
}

#[cfg(test)]
mod size_tests {
    use std::sync::atomic::AtomicBool;

    use crate::kvstore_test::new_store;

    use super::*;

    use super::tests::put;

    /// The shape of the server test `test_defrag_under_load_does_not_block`:
    /// ~12 MB of 2 kB puts, ~3.6 MB live after compaction, small puts while
    /// the defrag runs. The new file must be much smaller than the old one.
    ///
    /// Why "live well below half": redb grows a file by doubling it while it
    /// is below one region (4 GiB), so a file is between 1x and 2x its used
    /// pages, and the first write after a defrag may double the new file.
    /// The 2 kB values take ~3 kB of pages each (4 kB pages), so 12 MB of
    /// such puts use ~20.7 MB of pages in a 35.6 MB file; with 75% of that
    /// live (~9 MB of values) the copy uses ~17.3 MB in a 17.8 MB file,
    /// which doubles back to ~35.6 MB once later writes fill it.
    #[test]
    fn test_defrag_shrinks_a_large_store_under_writes() {
        let t = new_store();
        let s = t.store.clone();
        let big = vec![b'h'; 2000];
        for i in 0..6000 {
            let key = if i < 4500 {
                format!("hot/{}", i % 300)
            } else {
                format!("cold/{i}")
            };
            put(&s, &key, &big);
        }
        crate::kvstore_test::compact(&s, s.current_revision()).unwrap();
        let before = s.backend().size();
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let s = s.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    put(&s, &format!("load/{}", n % 100), b"v");
                    n += 1;
                }
                n
            })
        };
        let stats = s.defrag().unwrap();
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        eprintln!(
            "{stats:?} before {before} after writes {}",
            s.backend().size()
        );
        let after = s.backend().size();
        assert!(
            stats.size_after < before * 2 / 3,
            "{stats:?} before {before}"
        );
        assert!(
            after < before * 2 / 3,
            "{stats:?} before {before} after writes {after}"
        );
    }
}
