//! Streaming the store as a backup (Maintenance.Snapshot, raft snapshots):
//! the [`KvStore::dump`] format written to any `io::Write` from one read
//! snapshot, so a large store is never held in memory and the stream is the
//! state at exactly one revision.

use std::io::Write;
use std::sync::Arc;

use redb::ReadableTable;
use retcd_storage::backend::{ReadSnapshot, ALARM, AUTH, LEASES, MEMBERS, META};

use crate::hash::Crc32c;
use crate::kvstore::{KvStore, CONSISTENT_INDEX_KEY, DUMP_MAGIC, TERM_KEY};
use crate::memtable::RowsAt;
use crate::MvccError;

/// The committed state at one revision, ready to be serialized.
pub struct SnapshotDump {
    snapshot: Arc<ReadSnapshot>,
    /// The `key` rows (the snapshot's and the memtable's).
    at: RowsAt,
    /// The consistent index and term of this state (redb's `meta` has
    /// them as of the last write of the memtable).
    consistent: (u64, u64),
    /// The store revision of this state.
    pub revision: i64,
}

impl std::fmt::Debug for SnapshotDump {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotDump")
            .field("revision", &self.revision)
            .finish()
    }
}

impl KvStore {
    /// The current committed state, to stream with [`SnapshotDump::write_to`].
    pub fn snapshot_dump(&self) -> SnapshotDump {
        let p = self.published.read();
        SnapshotDump {
            snapshot: p.snapshot.clone(),
            at: p.rows_at(),
            consistent: (p.consistent_index, p.term),
            revision: p.rev,
        }
    }
}

fn io_err(e: std::io::Error) -> MvccError {
    MvccError::Backend(format!("snapshot write: {e}"))
}

impl SnapshotDump {
    /// Calls `f(table, key, value)` for every record, in dump order (tables
    /// numbered as in [`KvStore::dump`], integer keys as 8 bytes BE).
    pub fn for_each_record(
        &self,
        mut f: impl FnMut(u8, &[u8], &[u8]) -> Result<(), MvccError>,
    ) -> Result<(), MvccError> {
        let s = &self.snapshot;
        self.at.open()?.for_each(0, self.at.rev, |k, v| {
            f(1, k, v)?;
            Ok(true)
        })?;
        // `meta` in name order, with this state's consistent index
        let mut meta = std::collections::BTreeMap::new();
        for entry in s.open_table(META)?.iter()? {
            let (k, v) = entry?;
            meta.insert(k.value().to_string(), v.value().to_vec());
        }
        let (index, term) = self.consistent;
        if index > 0 {
            meta.insert(CONSISTENT_INDEX_KEY.into(), index.to_be_bytes().to_vec());
            meta.insert(TERM_KEY.into(), term.to_be_bytes().to_vec());
        }
        for (k, v) in &meta {
            f(2, k.as_bytes(), v)?;
        }
        for entry in s.open_table(MEMBERS)?.iter()? {
            let (k, v) = entry?;
            f(3, &k.value().to_be_bytes(), v.value())?;
        }
        for entry in s.open_table(LEASES)?.iter()? {
            let (k, v) = entry?;
            f(4, &k.value().to_be_bytes(), v.value())?;
        }
        // Older stores may lack the table.
        if let Ok(t) = s.open_table(ALARM) {
            for entry in t.iter()? {
                let (k, v) = entry?;
                f(5, k.value(), v.value())?;
            }
        }
        if let Ok(t) = s.open_table(AUTH) {
            for entry in t.iter()? {
                let (k, v) = entry?;
                f(6, k.value(), v.value())?;
            }
        }
        Ok(())
    }

    /// The exact length of [`SnapshotDump::write_to`]'s output.
    pub fn size(&self) -> Result<u64, MvccError> {
        let mut n = DUMP_MAGIC.len() as u64 + 1 + 4;
        self.for_each_record(|_, k, v| {
            n += 9 + k.len() as u64 + v.len() as u64;
            Ok(())
        })?;
        Ok(n)
    }

    /// Number of revisions in the `key` table.
    pub fn key_count(&self) -> Result<u64, MvccError> {
        self.at.open()?.len()
    }

    /// Writes the dump; see [`KvStore::dump`] for the format.
    pub fn write_to(&self, w: &mut dyn Write) -> Result<(), MvccError> {
        let mut crc = Crc32c::new();
        let mut put = |w: &mut dyn Write, b: &[u8]| -> Result<(), MvccError> {
            crc.update(b);
            w.write_all(b).map_err(io_err)
        };
        put(w, DUMP_MAGIC)?;
        self.for_each_record(|table, k, v| {
            put(w, &[table])?;
            put(w, &(k.len() as u32).to_be_bytes())?;
            put(w, k)?;
            put(w, &(v.len() as u32).to_be_bytes())?;
            put(w, v)
        })?;
        put(w, &[0])?;
        let sum = crc.sum();
        w.write_all(&sum.to_be_bytes()).map_err(io_err)?;
        w.flush().map_err(io_err)
    }
}

/// The length of the dump at the start of `data` (found by walking its
/// records to the end marker and CRC), or None if `data` does not start
/// with a complete dump. Snapshot files carry padding and a SHA-256 after
/// the dump; this finds where the dump ends.
pub fn dump_len(data: &[u8]) -> Option<usize> {
    if !data.starts_with(DUMP_MAGIC) {
        return None;
    }
    let mut at = DUMP_MAGIC.len();
    loop {
        let table = *data.get(at)?;
        at += 1;
        if table == 0 {
            let end = at + 4;
            return (end <= data.len()).then_some(end);
        }
        for _ in 0..2 {
            let n = u32::from_be_bytes(data.get(at..at + 4)?.try_into().ok()?) as usize;
            at = at.checked_add(4 + n)?;
            if at > data.len() {
                return None;
            }
        }
    }
}
