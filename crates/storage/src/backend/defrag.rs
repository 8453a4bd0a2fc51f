//! The storage half of an online defrag: a fresh database file next to the
//! live one, filled from read snapshots of the live one while it keeps
//! serving, then swapped in.
//!
//! redb's `Database::compact` needs `&mut Database` (no reader, no writer
//! for its whole run) — the stop-the-world defrag etcd has with bbolt. We
//! never call it. Instead the MVCC store (`retcd_mvcc::KvStore::defrag`)
//! drives a [`DefragTarget`]:
//!
//! 1. copy every table from a read snapshot S0 into `<db>.defrag`
//!    (writers keep committing to the live file meanwhile);
//! 2. catch up: copy what changed between S0 and a newer snapshot S1 (the
//!    `key` table only grows at its end, except for compaction, which only
//!    removes; the small tables are copied again whole); repeat while the
//!    last round was long;
//! 3. with the store's batch lock held (a very short pause for writes only;
//!    reads never stop), catch up to the last commit, commit the new file
//!    durably, rename it over `<db>`, fsync the directory, [`Backend::swap`].
//!
//! Every table must be known here: [`DefragTarget::check_tables`] refuses a
//! database with a table this module does not copy, so a defrag can never
//! drop data silently. Add new tables to [`SMALL_TABLES`] (or give them a
//! catch-up rule) when you add them to the backend.

use std::path::{Path, PathBuf};

use redb::{
    Database, Durability, ReadTransaction, ReadableTable, TableDefinition, TableHandle,
    WriteTransaction,
};

use super::{create_tables, Backend, BackendError, ALARM, AUTH, KEY, LEASES, MEMBERS, META};

/// Rows copied per (non-durable) commit while filling the new file.
const CHUNK: usize = 50_000;

/// Tables copied whole in every catch-up round (they are small).
pub const SMALL_TABLES: &[&str] = &["meta", "members", "lease", "alarm", "auth"];

/// A new database file being filled; see the module documentation.
pub struct DefragTarget {
    db: Option<Database>,
    tmp: PathBuf,
}

impl std::fmt::Debug for DefragTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DefragTarget")
            .field("tmp", &self.tmp)
            .finish()
    }
}

fn commit_none(mut txn: WriteTransaction) -> Result<(), BackendError> {
    txn.set_durability(Durability::None)?;
    txn.commit()?;
    Ok(())
}

/// Copies all of `def` from `src` into a cleared `def` in `txn`.
fn replace_table<K: redb::Key + 'static, V: redb::Value + 'static>(
    src: &ReadTransaction,
    txn: &WriteTransaction,
    def: TableDefinition<K, V>,
) -> Result<u64, BackendError> {
    txn.delete_table(def)?;
    let mut dst = txn.open_table(def)?;
    let mut n = 0;
    for entry in src.open_table(def)?.iter()? {
        let (k, v) = entry?;
        dst.insert(k.value(), v.value())?;
        n += 1;
    }
    Ok(n)
}

impl DefragTarget {
    /// Creates `<backend path>.defrag` (replacing a leftover one).
    pub fn create(backend: &Backend) -> Result<DefragTarget, BackendError> {
        let tmp = defrag_path(backend.path());
        let _ = std::fs::remove_file(&tmp);
        let db = Database::builder()
            .set_cache_size(super::DEFAULT_CACHE_SIZE)
            .create(&tmp)?;
        let txn = db.begin_write()?;
        create_tables(&txn)?;
        commit_none(txn)?;
        Ok(DefragTarget { db: Some(db), tmp })
    }

    fn db(&self) -> &Database {
        self.db.as_ref().expect("database present until finish")
    }

    /// Refuses a source with a table defrag would not copy.
    pub fn check_tables(src: &ReadTransaction) -> Result<(), BackendError> {
        for t in src.list_tables()? {
            if t.name() != KEY.name() && !SMALL_TABLES.contains(&t.name()) {
                return Err(BackendError::Redb(format!(
                    "defrag: table {:?} is not known to defrag; refusing to drop it",
                    t.name()
                )));
            }
        }
        Ok(())
    }

    /// Copies `key` rows of `src` in `range` (inserting or overwriting), in
    /// chunks of non-durable commits. Returns the number of rows.
    pub fn copy_keys(
        &self,
        src: &ReadTransaction,
        from: Option<&[u8]>,
    ) -> Result<u64, BackendError> {
        let table = src.open_table(KEY)?;
        let mut iter = match from {
            Some(f) => table.range(f..)?,
            None => table.range::<&[u8]>(..)?,
        };
        let mut n = 0u64;
        loop {
            let txn = self.db().begin_write()?;
            let mut done = true;
            {
                let mut dst = txn.open_table(KEY)?;
                let mut in_chunk = 0;
                for entry in iter.by_ref() {
                    let (k, v) = entry?;
                    dst.insert(k.value(), v.value())?;
                    n += 1;
                    in_chunk += 1;
                    if in_chunk == CHUNK {
                        done = false;
                        break;
                    }
                }
            }
            commit_none(txn)?;
            if done {
                return Ok(n);
            }
        }
    }

    /// Removes the target's `key` rows in `[lower, upper)` (from the start
    /// when `lower` is None) that `src` no longer has (a compaction deleted
    /// them meanwhile). Returns the number removed.
    pub fn remove_compacted(
        &self,
        src: &ReadTransaction,
        lower: Option<&[u8]>,
        upper: &[u8],
    ) -> Result<u64, BackendError> {
        let live = src.open_table(KEY)?;
        let txn = self.db().begin_write()?;
        let removed;
        {
            let mut dst = txn.open_table(KEY)?;
            let mut doomed: Vec<Vec<u8>> = Vec::new();
            let range = match lower {
                Some(l) if l >= upper => None,
                Some(l) => Some(dst.range(l..upper)?),
                None => Some(dst.range(..upper)?),
            };
            for entry in range.into_iter().flatten() {
                let (k, _) = entry?;
                if live.get(k.value())?.is_none() {
                    doomed.push(k.value().to_vec());
                }
            }
            for k in &doomed {
                dst.remove(k.as_slice())?;
            }
            removed = doomed.len() as u64;
        }
        commit_none(txn)?;
        Ok(removed)
    }

    /// Number of rows in the new file's `key` table.
    pub fn key_rows(&self) -> Result<u64, BackendError> {
        use redb::{ReadableDatabase, ReadableTableMetadata};
        let r = self.db().begin_read()?;
        let n = r.open_table(KEY)?.len()?;
        Ok(n)
    }

    /// Replaces the small tables ([`SMALL_TABLES`]) with `src`'s.
    pub fn copy_small_tables(&self, src: &ReadTransaction) -> Result<u64, BackendError> {
        let txn = self.db().begin_write()?;
        let mut n = replace_table(src, &txn, META)?;
        n += replace_table(src, &txn, MEMBERS)?;
        n += replace_table(src, &txn, LEASES)?;
        n += replace_table(src, &txn, ALARM)?;
        n += replace_table(src, &txn, AUTH)?;
        commit_none(txn)?;
        Ok(n)
    }

    /// Makes everything copied so far durable (before the pause).
    pub fn sync(&self) -> Result<(), BackendError> {
        let mut txn = self.db().begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        txn.commit()?;
        Ok(())
    }

    /// Commits the new file durably, renames it over the backend's file,
    /// fsyncs the directory and makes the backend use it. The caller holds
    /// the MVCC batch lock (no write transaction is open on the old file).
    pub fn finish(mut self, backend: &Backend) -> Result<(), BackendError> {
        let db = self.db.take().expect("database present until finish");
        let mut txn = db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        txn.commit()?;
        std::fs::rename(&self.tmp, backend.path())
            .map_err(|e| BackendError::Redb(format!("defrag: rename: {e}")))?;
        // The rename is durable only once the directory is synced; the new
        // file is in place either way, so the backend uses it, and a failed
        // sync is reported (the defrag fails) rather than ignored.
        let dir = backend.path().parent().unwrap_or(Path::new("."));
        let synced = std::fs::File::open(dir).and_then(|d| d.sync_all());
        backend.swap(db);
        synced.map_err(|e| {
            BackendError::Redb(format!(
                "defrag: fsync of {} after the rename: {e}",
                dir.display()
            ))
        })
    }
}

impl Drop for DefragTarget {
    fn drop(&mut self) {
        // Abandoned (error or restore meanwhile): remove the partial file.
        if let Some(db) = self.db.take() {
            drop(db);
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Where a defrag builds the new file.
pub fn defrag_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push(".defrag");
    PathBuf::from(p)
}
