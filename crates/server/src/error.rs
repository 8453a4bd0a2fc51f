//! The server's errors, with etcd's texts. `grpc::error_map` is the one place
//! they become gRPC statuses.

use retcd_mvcc::MvccError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ServerError {
    #[error("{0}")]
    Mvcc(#[from] MvccError),
    #[error("{0}")]
    Lease(#[from] retcd_lease::LeaseError),
    #[error("{0}")]
    Auth(#[from] crate::auth::AuthError),
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
    #[error("etcdserver: corrupt cluster")]
    Corrupt,
    #[error("etcdserver: invalid downgrade target version")]
    InvalidDowngradeTargetVersion,
    #[error("etcdserver: no inflight downgrade job")]
    NoInflightDowngrade,
    #[error("etcdserver: wrong downgrade target version format")]
    WrongDowngradeVersionFormat,
    // Membership and leader transfer (etcd's rpctypes texts).
    #[error("etcdserver: member ID already exist")]
    MemberExist,
    #[error("etcdserver: Peer URLs already exists")]
    PeerUrlExist,
    #[error("etcdserver: re-configuration failed due to not enough started members")]
    MemberNotEnoughStarted,
    #[error("etcdserver: given member URLs are invalid")]
    MemberBadUrls,
    #[error("etcdserver: member not found")]
    MemberNotFound,
    #[error("etcdserver: can only promote a learner member")]
    MemberNotLearner,
    #[error("etcdserver: can only promote a learner member which is in sync with leader")]
    LearnerNotReady,
    #[error("etcdserver: too many learner members in cluster")]
    TooManyLearners,
    #[error("etcdserver: rpc not supported for learner")]
    NotSupportedForLearner,
    #[error("etcdserver: unhealthy cluster")]
    Unhealthy,
    #[error("etcdserver: not leader")]
    NotLeader,
    #[error("etcdserver: bad leader transferee")]
    BadLeaderTransferee,
    #[error("etcdserver: request timed out, leader transfer took too long")]
    LeaderTransferTimeout,
    #[error("{0}")]
    Internal(String),
}
