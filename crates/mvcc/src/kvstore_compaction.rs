//! Compaction, as etcd's `kvstore_compaction.go`, but done in the batch.
//!
//! `compact(rev)` computes, from the index, the revisions `<= rev` still
//! needed to read at `rev` (the latest of each key unless it is a
//! tombstone: [`crate::TreeIndex::keep`]), deletes every other revision
//! `<= rev` from the `key` table in this batch's transaction, and records
//! `rev` as both the scheduled and the finished compaction revision in
//! `meta`. The in-memory index is compacted when the batch commits, so
//! readers never see an index ahead of their snapshot.
//!
//! Example: `a` put at 2 and 4, deleted at 5; `b` put at 3. `compact(4)`
//! keeps 4 (a) and 3 (b), removes 2; 5 is above the compaction and stays.
//! `compact(5)` then also removes 4 and 5: `a` is gone at 5.

use redb::ReadableTable;
use retcd_api::etcdserverpb::{CompactionResponse, ResponseHeader};
use retcd_storage::backend::{KEY, META};

use crate::kvstore::{FINISHED_COMPACT_KEY, SCHEDULED_COMPACT_KEY};
use crate::kvstore_txn::WriteBatch;
use crate::revision::Revision;
use crate::MvccError;

impl WriteBatch<'_> {
    /// Compacts the history at `rev`. `physical` is accepted for parity
    /// with etcd: the removal always completes inside this batch.
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
        let keep = self.store.index.read().keep(rev);
        fail::fail_point!("mvcc_compact", |_| {
            eprintln!("retcd: failpoint mvcc_compact: crashing (abort)");
            std::process::abort()
        });
        let upper = Revision::new(rev + 1, 0).to_bytes();
        {
            let mut table = self.wtxn().open_table(KEY)?;
            let mut doomed: Vec<Vec<u8>> = Vec::new();
            for entry in table.range(..upper.as_slice())? {
                let (k, _) = entry?;
                let (r, _) = Revision::parse(k.value()).ok_or_else(|| {
                    MvccError::Backend(format!("invalid revision key {:?}", k.value()))
                })?;
                if !keep.contains(&r) {
                    doomed.push(k.value().to_vec());
                }
            }
            for k in doomed {
                table.remove(k.as_slice())?;
            }
            let mut meta = self.wtxn().open_table(META)?;
            let rbytes = Revision::new(rev, 0).to_bytes();
            meta.insert(SCHEDULED_COMPACT_KEY, rbytes.as_slice())?;
            meta.insert(FINISHED_COMPACT_KEY, rbytes.as_slice())?;
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
