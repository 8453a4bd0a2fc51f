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
