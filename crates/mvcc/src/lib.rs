//! retcd's MVCC store: etcd's `mvcc` package in Rust.
//!
//! * [`revision`]: `Revision { main, sub }` and its 17-byte key encoding.
//! * [`key_index`]: the history of one key in generations.
//! * [`index`]: the in-memory ordered map of key indexes.
//! * [`kvstore`]: [`KvStore`], values in the backend's `key` table, reads
//!   from any thread; [`WriteBatch`] (in `kvstore_txn`) applies writes.
//!
//! * [`watchable_store`]: [`WatchableStore`], watchers fed by the apply
//!   thread (synced), caught up from history (unsynced), or parked (victims).
//!
//! See [`KvStore`] for the locks and the on-disk format.

pub mod hash;
pub mod index;
pub mod key_index;
pub mod kvstore;
mod kvstore_compaction;
mod kvstore_defrag;
mod kvstore_read_txn;
mod kvstore_snapshot;
mod kvstore_txn;
mod memtable;
mod range;
pub mod revision;
mod watch_history;
pub mod watch_reply;
pub mod watchable_store;
pub mod watcher_group;

pub use index::{KeyRange, TreeIndex};
pub use key_index::{Generation, KeyIndex, RevisionNotFound};
pub use kvstore::KvStore;
pub use kvstore_compaction::{
    CompactionConfig, CompactionObserver, DEFAULT_COMPACTION_BATCH_LIMIT,
    DEFAULT_COMPACTION_SLEEP_INTERVAL,
};
pub use kvstore_defrag::DefragStats;
pub use kvstore_read_txn::is_txn_read_only;
pub use kvstore_snapshot::{dump_len, SnapshotDump};
pub use kvstore_txn::WriteBatch;
pub use range::{has_revision_filter, is_default_ordering, is_plain_range, EncodedRange};
pub use revision::Revision;
pub use watch_reply::{EventBufs, ReplyBatch, WatchReply};
pub use watchable_store::{SinkError, WatchSink, WatchStream, WatchableStore};
pub use watcher_group::{WatchError, WatchId, WatchOptions, WatchRange};

/// Tells the store whether a lease exists (implemented by the lessor).
pub trait LeaseLookup {
    /// Whether lease `id` is currently granted.
    fn lease_exists(&self, id: i64) -> bool;
}

/// A [`LeaseLookup`] for which no lease exists (tests, tools).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoLeases;

impl LeaseLookup for NoLeases {
    fn lease_exists(&self, _id: i64) -> bool {
        false
    }
}

impl<F: Fn(i64) -> bool> LeaseLookup for F {
    fn lease_exists(&self, id: i64) -> bool {
        self(id)
    }
}

/// Errors of the MVCC store; the texts are etcd's, byte for byte.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MvccError {
    /// The requested revision is at or before the compaction.
    #[error("mvcc: required revision has been compacted")]
    Compacted,
    /// The requested revision is after the current revision.
    #[error("mvcc: required revision is a future revision")]
    FutureRev,
    /// A put names a lease that does not exist.
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound,
    /// `ignore_value`/`ignore_lease` on a key that does not exist.
    #[error("etcdserver: key not found")]
    KeyNotFound,
    /// `ignore_value` together with a value.
    #[error("etcdserver: value is provided")]
    ValueProvided,
    /// `ignore_lease` together with a lease.
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    /// A read's response would exceed `--max-range-response-bytes`; the
    /// text is grpc-go's when a message is over its send limit (etcd's only
    /// bound on a response).
    #[error("grpc: trying to send message larger than max ({size} vs. {max})")]
    ResponseTooLarge { size: usize, max: usize },
    /// I/O or corruption in the backend (or in a snapshot being restored).
    #[error("mvcc: backend: {0}")]
    Backend(String),
}

impl From<retcd_storage::backend::BackendError> for MvccError {
    fn from(e: retcd_storage::backend::BackendError) -> Self {
        MvccError::Backend(e.to_string())
    }
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for MvccError {
            fn from(e: $t) -> Self {
                MvccError::Backend(e.to_string())
            }
        }
    )*};
}
from_redb!(
    redb::Error,
    redb::StorageError,
    redb::TableError,
    redb::TransactionError,
    redb::CommitError,
    redb::SetDurabilityError
);

#[cfg(test)]
mod kvstore_compaction_test;
#[cfg(test)]
mod kvstore_test;
#[cfg(test)]
mod memtable_test;
#[cfg(test)]
mod model_test;
#[cfg(test)]
mod watchable_store_test;
