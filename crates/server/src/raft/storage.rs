//! The raft log as raft-rs sees it: an in-memory tail of the log since the
//! last compaction point, the hard state, the conf state, and snapshots made
//! on demand from the MVCC store.
//!
//! Durability is not this type's job: the raft thread writes entries and the
//! hard state to the WAL (one fdatasync per Ready) before calling
//! [`RaftStorage::append`]. On restart the WAL replays into this type.
//!
//! Worked example, `--snapshot-count 100 --experimental-snapshot-catchup-entries 20`:
//! after applying index 105 the raft thread saves a snapshot record at 105 and
//! calls `compact(85)`: `first_index()` becomes 86, `term(85)` is still known
//! (kept in `snapshot_meta`), entries 86..=105 stay for followers a little
//! behind; a follower that needs index 40 gets a snapshot instead
//! ([`Storage::snapshot`]), which is a dump of the MVCC store at the applied
//! index.

use parking_lot::RwLock;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};
use retcd_mvcc::KvStore;
use std::sync::Arc;

#[derive(Default)]
struct Core {
    hard_state: HardState,
    conf_state: ConfState,
    /// Index and term of the entry just before `entries[0]` (the compaction
    /// point, or the last snapshot applied).
    snapshot_meta: SnapshotMetadata,
    /// `entries[i].index == snapshot_meta.index + 1 + i`.
    entries: Vec<Entry>,
    /// Last applied (index, term): what a snapshot made now contains.
    applied: (u64, u64),
}

/// Cheap to clone; all clones share one log.
#[derive(Clone)]
pub struct RaftStorage {
    /// Protects the in-memory log. Written only by the raft thread; read by
    /// raft-rs from the same thread. Never held across I/O.
    core: Arc<RwLock<Core>>,
    kv: Arc<KvStore>,
}

impl RaftStorage {
    pub fn new(kv: Arc<KvStore>) -> Self {
        RaftStorage {
            core: Arc::default(),
            kv,
        }
    }

    pub fn set_conf_state(&self, cs: ConfState) {
        self.core.write().conf_state = cs;
    }
    pub fn conf_state(&self) -> ConfState {
        self.core.read().conf_state.clone()
    }
    pub fn set_hard_state(&self, hs: HardState) {
        self.core.write().hard_state = hs;
    }
    pub fn hard_state(&self) -> HardState {
        self.core.read().hard_state.clone()
    }
    pub fn set_commit(&self, commit: u64) {
        self.core.write().hard_state.commit = commit;
    }
    pub fn set_applied(&self, index: u64, term: u64) {
        self.core.write().applied = (index, term);
    }
    pub fn applied(&self) -> (u64, u64) {
        self.core.read().applied
    }

    /// Resets the log to start after `meta` (a snapshot applied, or the
    /// snapshot record found in the WAL on restart).
    pub fn apply_snapshot_meta(&self, meta: SnapshotMetadata) {
        let mut c = self.core.write();
        c.hard_state.term = c.hard_state.term.max(meta.term);
        c.hard_state.commit = c.hard_state.commit.max(meta.index);
        c.conf_state = meta.get_conf_state().clone();
        c.applied = (meta.index, meta.term);
        c.entries.clear();
        c.snapshot_meta = meta;
    }

    /// Appends entries, first dropping any conflicting suffix (a new leader
    /// overwriting uncommitted entries).
    pub fn append(&self, ents: &[Entry]) {
        let Some(first) = ents.first() else { return };
        let mut c = self.core.write();
        let first_index = c.snapshot_meta.index + 1;
        if first.index < first_index {
            panic!(
                "raft log: append at {} overwrites compacted entries (first index {first_index})",
                first.index
            );
        }
        let keep = (first.index - first_index) as usize;
        if keep > c.entries.len() {
            panic!(
                "raft log: gap on append: last index {}, appending {}",
                first_index - 1 + c.entries.len() as u64,
                first.index
            );
        }
        c.entries.truncate(keep);
        c.entries.extend_from_slice(ents);
    }

    /// Drops entries before `compact_index`; a no-op if already compacted.
    pub fn compact(&self, compact_index: u64) {
        let mut c = self.core.write();
        let first = c.snapshot_meta.index + 1;
        let last = c.snapshot_meta.index + c.entries.len() as u64;
        if compact_index <= first || compact_index > last + 1 {
            return;
        }
        let drop = (compact_index - first) as usize;
        let term = c.entries[drop - 1].term;
        c.entries.drain(..drop);
        if c.entries.capacity() > 4 * c.entries.len() + 1024 {
            c.entries.shrink_to_fit(); // after a large trim (a restart's)
        }
        c.snapshot_meta.index = compact_index - 1;
        c.snapshot_meta.term = term;
    }

    pub fn first_index_now(&self) -> u64 {
        self.core.read().snapshot_meta.index + 1
    }
    pub fn last_index_now(&self) -> u64 {
        let c = self.core.read();
        c.snapshot_meta.index + c.entries.len() as u64
    }
}

impl Storage for RaftStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let c = self.core.read();
        Ok(RaftState {
            hard_state: c.hard_state.clone(),
            conf_state: c.conf_state.clone(),
        })
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let c = self.core.read();
        let first = c.snapshot_meta.index + 1;
        if low < first {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        let last = c.snapshot_meta.index + c.entries.len() as u64;
        if high > last + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let lo = (low - first) as usize;
        let hi = (high - first) as usize;
        let mut ents = c.entries[lo..hi].to_vec();
        raft::util::limit_size(&mut ents, max_size.into());
        Ok(ents)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let c = self.core.read();
        if idx == c.snapshot_meta.index {
            return Ok(c.snapshot_meta.term);
        }
        let first = c.snapshot_meta.index + 1;
        if idx < first {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        let last = c.snapshot_meta.index + c.entries.len() as u64;
        if idx > last {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(c.entries[(idx - first) as usize].term)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first_index_now())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last_index_now())
    }

    /// A snapshot of the MVCC store at the applied index. Called on the raft
    /// thread, where nothing is being applied at the time, so the store's
    /// last committed state is exactly the applied index.
    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        let (index, term, conf_state) = {
            let c = self.core.read();
            (c.applied.0, c.applied.1, c.conf_state.clone())
        };
        if index < request_index {
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        let data = self.kv.dump().map_err(|e| {
            raft::Error::Store(StorageError::Other(Box::new(std::io::Error::other(
                e.to_string(),
            ))))
        })?;
        let mut snap = Snapshot::default();
        snap.set_data(data.into());
        let meta = snap.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(conf_state);
        Ok(snap)
    }
}

#[cfg(test)]
mod tests {
    //! raft-rs's `Storage` contract (as its `MemStorage` tests state it),
    //! on this storage.
    use super::*;
    use retcd_storage::backend::Backend;

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            ..Default::default()
        }
    }

    struct Env {
        _dir: tempfile::TempDir,
        s: RaftStorage,
    }

    /// A storage whose log holds entries 4..=6 (terms 4, 5, 6) after a
    /// snapshot at index 3, term 3.
    fn env() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let backend = Arc::new(Backend::open(&dir.path().join("db")).unwrap());
        let kv = Arc::new(KvStore::open(backend).unwrap());
        let s = RaftStorage::new(kv);
        let mut meta = SnapshotMetadata {
            index: 3,
            term: 3,
            ..Default::default()
        };
        meta.mut_conf_state().voters = vec![1];
        s.apply_snapshot_meta(meta);
        s.append(&[entry(4, 4), entry(5, 5), entry(6, 6)]);
        Env { _dir: dir, s }
    }

    fn is_compacted(r: raft::Result<impl std::fmt::Debug>) -> bool {
        matches!(r, Err(raft::Error::Store(StorageError::Compacted)))
    }
    fn is_unavailable(r: raft::Result<impl std::fmt::Debug>) -> bool {
        matches!(r, Err(raft::Error::Store(StorageError::Unavailable)))
    }

    #[test]
    fn test_storage_term() {
        let e = env();
        assert!(is_compacted(e.s.term(2)));
        assert_eq!(e.s.term(3).unwrap(), 3, "the snapshot's term is known");
        assert_eq!(e.s.term(4).unwrap(), 4);
        assert_eq!(e.s.term(6).unwrap(), 6);
        assert!(is_unavailable(e.s.term(7)));
    }

    #[test]
    fn test_storage_entries() {
        let e = env();
        let ctx = || GetEntriesContext::empty(false);
        assert!(is_compacted(e.s.entries(2, 6, None, ctx())));
        assert!(is_compacted(e.s.entries(3, 4, None, ctx())));
        let got = e.s.entries(4, 5, None, ctx()).unwrap();
        assert_eq!(got, vec![entry(4, 4)]);
        let got = e.s.entries(4, 7, None, ctx()).unwrap();
        assert_eq!(got.len(), 3);
        assert!(is_unavailable(e.s.entries(4, 8, None, ctx())));
        // a size limit still returns at least one entry
        let got = e.s.entries(4, 7, Some(0), ctx()).unwrap();
        assert_eq!(got, vec![entry(4, 4)]);
    }

    #[test]
    fn test_storage_first_last_index_and_compact() {
        let e = env();
        assert_eq!(e.s.first_index().unwrap(), 4);
        assert_eq!(e.s.last_index().unwrap(), 6);
        e.s.compact(5);
        assert_eq!(e.s.first_index().unwrap(), 5);
        assert_eq!(
            e.s.term(4).unwrap(),
            4,
            "the compaction point's term is kept"
        );
        assert!(is_compacted(e.s.term(3)));
        // compacting at or below the first index, or past the end, is a no-op
        e.s.compact(4);
        e.s.compact(100);
        assert_eq!(e.s.first_index().unwrap(), 5);
        assert_eq!(e.s.last_index().unwrap(), 6);
    }

    #[test]
    fn test_storage_append_overwrites_a_conflicting_suffix() {
        let e = env();
        // a new leader's entries replace 5 and 6
        e.s.append(&[entry(5, 7), entry(6, 7), entry(7, 7)]);
        assert_eq!(e.s.term(4).unwrap(), 4);
        assert_eq!(e.s.term(5).unwrap(), 7);
        assert_eq!(e.s.last_index().unwrap(), 7);
        // appending right after the last entry extends the log
        e.s.append(&[entry(8, 7)]);
        assert_eq!(e.s.last_index().unwrap(), 8);
    }

    #[test]
    #[should_panic(expected = "gap on append")]
    fn test_storage_append_with_a_gap_is_a_broken_invariant() {
        env().s.append(&[entry(9, 7)]);
    }

    #[test]
    fn test_storage_snapshot_and_initial_state() {
        let e = env();
        e.s.set_applied(5, 5);
        let hs = HardState {
            term: 6,
            vote: 1,
            commit: 5,
            ..Default::default()
        };
        e.s.set_hard_state(hs.clone());
        let st = e.s.initial_state().unwrap();
        assert_eq!(st.hard_state, hs);
        assert_eq!(st.conf_state.voters, vec![1]);
        // a snapshot at the applied index, with the configuration
        let snap = e.s.snapshot(5, 2).unwrap();
        assert_eq!(snap.get_metadata().index, 5);
        assert_eq!(snap.get_metadata().term, 5);
        assert_eq!(snap.get_metadata().get_conf_state().voters, vec![1]);
        assert!(!snap.data.is_empty(), "the store's dump");
        // one newer than what is applied is not ready yet
        assert!(matches!(
            e.s.snapshot(6, 2),
            Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable
            ))
        ));
        // applying a snapshot resets the log after it
        let mut meta = SnapshotMetadata {
            index: 10,
            term: 8,
            ..Default::default()
        };
        meta.mut_conf_state().voters = vec![1, 2];
        e.s.apply_snapshot_meta(meta);
        assert_eq!(e.s.first_index().unwrap(), 11);
        assert_eq!(e.s.last_index().unwrap(), 10);
        assert_eq!(e.s.term(10).unwrap(), 8);
        assert_eq!(e.s.applied(), (10, 8));
        assert!(e.s.hard_state().commit >= 10);
    }
}
