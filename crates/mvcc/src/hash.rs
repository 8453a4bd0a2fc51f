//! Store hashes for consistency checks (`HashKV`), as etcd computes them:
//! CRC-32 with the Castagnoli polynomial over the `key` table.

use crate::kvstore::KvStore;
use crate::revision::Revision;
use crate::MvccError;

/// CRC-32C (Castagnoli), the checksum Go's
/// `crc32.MakeTable(crc32.Castagnoli)` gives; computed by the `crc32c`
/// crate (SSE4.2 / ARMv8 instructions where the CPU has them).
/// Streaming: feed with [`Crc32c::update`], read with [`Crc32c::sum`].
#[derive(Clone, Debug, Default)]
pub struct Crc32c {
    sum: u32,
}

impl Crc32c {
    /// An empty hash.
    pub fn new() -> Crc32c {
        Crc32c::default()
    }

    /// Feeds `data`.
    pub fn update(&mut self, data: &[u8]) {
        self.sum = crc32c::crc32c_append(self.sum, data);
    }

    /// The checksum of everything fed so far.
    pub fn sum(&self) -> u32 {
        self.sum
    }

    /// One-shot checksum.
    pub fn checksum(data: &[u8]) -> u32 {
        let mut h = Crc32c::new();
        h.update(data);
        h.sum()
    }
}

impl KvStore {
    /// etcd's `HashByRev`: returns `(hash, compact_rev, hash_rev)`.
    ///
    /// The hash covers the table name `key`, then, in revision order, every
    /// entry with main revision `<= hash_rev` except those at or before the
    /// compaction that are not needed to read at `hash_rev`, so the result
    /// does not depend on how far the background compactor has got with
    /// deleting them: members compare it while their deletions run at
    /// different speeds. `rev == 0` hashes at the current revision.
    /// `compact_rev` is etcd's (the scheduled compaction): -1 when the
    /// store was never compacted.
    ///
    /// Difference from etcd 3.4/3.5: etcd hashes every row when the keep set
    /// is empty ("don't skip if there isn't one"), so with every key deleted
    /// before the compaction its hash changes while the tombstones are being
    /// removed. We skip doomed rows whatever the keep set; once the deletion
    /// finished both hash the same rows.
    pub fn hash_kv(&self, rev: i64) -> Result<(u32, i64, i64), MvccError> {
        let (keep, published) = {
            let index = self.index.read();
            let p = self.published.read().clone();
            if rev > 0 && rev <= p.compact_rev {
                return Err(MvccError::Compacted);
            }
            if rev > p.rev {
                return Err(MvccError::FutureRev);
            }
            let at = if rev == 0 { p.rev } else { rev };
            (index.keep(at), (p, at))
        };
        let (p, at) = published;
        let upper = Revision::new(at + 1, 0);
        let lower = Revision::new(p.compact_rev + 1, 0);
        let mut h = Crc32c::new();
        h.update(b"key");
        p.rows_at().open()?.for_each(0, at, |k, v| {
            let (kr, _) = Revision::parse(k)
                .ok_or_else(|| MvccError::Backend(format!("invalid revision key {k:?}")))?;
            if kr >= upper {
                return Ok(false);
            }
            if kr < lower && !keep.contains(&kr) {
                return Ok(true);
            }
            h.update(k);
            h.update(v);
            Ok(true)
        })?;
        Ok((h.sum(), p.compact_rev, at))
    }

    /// Hash of every entry of the `key` table (committed state).
    pub fn hash(&self) -> Result<u32, MvccError> {
        let at = self.published.read().rows_at();
        let mut h = Crc32c::new();
        h.update(b"key");
        at.open()?.for_each(0, at.rev, |k, v| {
            h.update(k);
            h.update(v);
            Ok(true)
        })?;
        Ok(h.sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_crc32c_known_values() {
        assert_eq!(Crc32c::checksum(b""), 0);
        assert_eq!(Crc32c::checksum(b"123456789"), 0xE306_9283);
        let mut h = Crc32c::new();
        h.update(b"1234");
        h.update(b"56789");
        assert_eq!(h.sum(), 0xE306_9283);
    }
}
