//! retcd's leases: etcd's `lease` package in Rust.
//!
//! * [`lessor`]: [`Lessor`] — every lease, its attached keys, expiry on the
//!   primary (leader) only, checkpoints, persistence in the backend's
//!   `lease` table.
//! * [`lease_queue`]: [`LeaseQueue`], leases by expiry deadline.

pub mod lease_queue;
pub mod lessor;

pub use lease_queue::LeaseQueue;
pub use lessor::{
    Clock, LeaseInfo, Lessor, LessorConfig, ManualClock, Renewed, SystemClock,
    DEFAULT_LEASE_CHECKPOINT_INTERVAL, LEASE_REVOKE_RATE, MAX_LEASE_CHECKPOINT_BATCH_SIZE,
};

/// A lease ID (etcd's `LeaseID`).
pub type LeaseId = i64;

/// "No lease" (etcd's `NoLease`).
pub const NO_LEASE: LeaseId = 0;

/// etcd's `MaxLeaseTTL`: the largest TTL a lease may be granted, in seconds.
pub const MAX_LEASE_TTL: i64 = 9_000_000_000;

/// Errors of the lessor; texts are etcd's `lease` package's. The gRPC
/// layer (`error_map`) turns them into etcd's rpctypes codes and texts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    #[error("lease not found")]
    NotFound,
    #[error("lease already exists")]
    Exists,
    #[error("too large lease TTL")]
    TtlTooLarge,
    /// Renew or TimeToLive on a member that is not the leader's lessor.
    #[error("not a primary lessor")]
    NotPrimary,
    /// Renew of a lease that ran out and is being revoked.
    #[error("lease expired")]
    Expired,
    #[error("lease: backend: {0}")]
    Backend(String),
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for LeaseError {
            fn from(e: $t) -> Self {
                LeaseError::Backend(e.to_string())
            }
        }
    )*};
}
from_redb!(
    redb::Error,
    redb::StorageError,
    redb::TableError,
    redb::TransactionError
);

#[cfg(test)]
mod lessor_test;
