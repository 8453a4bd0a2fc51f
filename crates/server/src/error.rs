//! The server's errors, with etcd's texts. `grpc::error_map` is the one place
//! they become gRPC statuses.

use retcd_mvcc::MvccError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ServerError {
    #[error("{0}")]
    Mvcc(#[from] MvccError),
    #[error("{0}")]
    Lease(#[from] retcd_lease::LeaseError),
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    #[error("etcdserver: value is provided")]
    ValueProvided,
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps,
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    #[error("etcdserver: request is too large")]
    RequestTooLarge,
    #[error("etcdserver: no leader")]
    NoLeader,
    #[error("etcdserver: leader changed")]
    LeaderChanged,
    #[error("etcdserver: server stopped")]
    Stopped,
    #[error("etcdserver: request timed out")]
    Timeout,
    #[error("etcdserver: mvcc: database space exceeded")]
    NoSpace,
    #[error("{0}")]
    Internal(String),
}
