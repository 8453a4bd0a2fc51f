//! Reading the history for watchers: events by revision range straight
//! from the backend's `key` table (a scan in revision order, see
//! [`crate::revision`]).

use prost::Message;
use retcd_api::mvccpb::{event::EventType, Event, KeyValue};

use crate::kvstore::KvStore;
use crate::memtable::RowsAt;
use crate::revision::Revision;
use crate::watcher_group::WatchRange;
use crate::MvccError;

/// Events with main revision in `[from, to]`, in revision order, read from
/// the `key` table of the view `at`: PUT for a stored value, DELETE (kv with
/// the key and `mod_revision`) for a tombstone. No `prev_kv`. Nothing
/// above the view's revision.
///
/// A tombstone at `compact_rev` is kept by the compaction (etcd 3.5.16+),
/// so a watcher starting at the compaction revision (allowed, as in etcd)
/// gets the DELETE at it. Tombstones below `compact_rev` are skipped: the
/// compaction deletes them in the background, so whether one is still
/// there depends on timing.
pub(crate) fn read_events(
    at: &RowsAt,
    from: i64,
    to: i64,
    compact_rev: i64,
) -> Result<Vec<(i64, Event)>, MvccError> {
    let mut out = Vec::new();
    at.open()?.for_each(from.max(1), to, |k, v| {
        let (rev, tombstone) = Revision::parse(k)
            .ok_or_else(|| MvccError::Backend(format!("invalid revision key {k:?}")))?;
        if tombstone && rev.main < compact_rev {
            return Ok(true);
        }
        let mut kv = KeyValue::decode(v)
            .map_err(|e| MvccError::Backend(format!("cannot decode KeyValue at {rev}: {e}")))?;
        let ty = if tombstone {
            kv.mod_revision = rev.main;
            EventType::Delete
        } else {
            EventType::Put
        };
        out.push((
            rev.main,
            Event {
                r#type: ty as i32,
                kv: Some(kv),
                prev_kv: None,
            },
        ));
        Ok(true)
    })?;
    Ok(out)
}

impl KvStore {
    /// Events with main revision in `[from, to]` whose key is in `range`,
    /// from the committed state, without `prev_kv` (history reads, tests).
    pub fn events_between(
        &self,
        from: i64,
        to: i64,
        range: &WatchRange,
    ) -> Result<Vec<Event>, MvccError> {
        let p = self.published.read().clone();
        Ok(read_events(&p.rows_at(), from, to, p.compact_rev)?
            .into_iter()
            .filter(|(_, e)| e.kv.as_ref().is_some_and(|kv| range.contains(&kv.key)))
            .map(|(_, e)| e)
            .collect())
    }
}
