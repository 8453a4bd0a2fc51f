//! The server's errors, with etcd's texts. `api::error_map` is the one place
//! they become gRPC statuses (with etcd's codes).

use retcd_mvcc::MvccError;
use std::sync::Arc;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ServerError {
    #[error("{0}")]
    Mvcc(#[from] MvccError),
    #[error("{0}")]
    Lease(#[from] retcd_lease::LeaseError),
    #[error("{0}")]
    Auth(#[from] crate::auth::AuthError),
    /// An auth error that etcd returns unconverted (the maintenance RPCs'
    /// admin check): code Unknown with the auth package's own text.
    #[error("{}", .0.raw_text())]
    AuthRaw(crate::auth::AuthError),
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
    #[error("etcdserver: invalid sort option")]
    InvalidSortOption,
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
    #[error("etcdserver: request timed out, possibly due to previous leader failure")]
    TimeoutDueToLeaderFail,
    #[error("etcdserver: request timed out, possibly due to connection lost")]
    TimeoutDueToConnectionLost,
    /// raft refused a proposal (a leader transfer under way): etcd returns
    /// raft's `ErrProposalDropped` unconverted.
    #[error("raft proposal dropped")]
    ProposalDropped,
    /// A proposal that waited for a leader until its request's deadline:
    /// etcd's raft node takes none without a leader, and its `Propose`
    /// returns the context's error, unconverted.
    #[error("context deadline exceeded")]
    ProposeDeadline,
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
    #[error("etcdserver: unknown method")]
    UnknownDowngradeAction,
    /// retcd's own refusal: its data files are not etcd 3.4's.
    #[error(
        "retcd: downgrading to etcd 3.4 is not supported (retcd's data files are its own); \
         migrate with `etcdctl snapshot save` and a restore instead"
    )]
    DowngradeUnsupported,
    #[error("etcdserver: unknown alarm action")]
    UnknownAlarmAction,
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
    /// A request form a method does not serve (etcd's plain
    /// `codes.Unimplemented` statuses, e.g. RangeStream with a sort order).
    #[error("{0}")]
    Unimplemented(&'static str),
    #[error("etcdserver: unhealthy cluster")]
    Unhealthy,
    #[error("etcdserver: not leader")]
    NotLeader,
    #[error("etcdserver: bad leader transferee")]
    BadLeaderTransferee,
    #[error("etcdserver: request timed out, leader transfer took too long")]
    LeaderTransferTimeout,
    /// What a peer answers a removed member's raft stream (etcd's text).
    #[error("the member has been permanently removed from the cluster")]
    RemovedMember,
    /// Raft proposals arrive faster than they are applied (etcd's
    /// committed/applied gap), or the raft thread's queue is full.
    #[error("etcdserver: too many requests")]
    TooManyRequests,
    // What the peer port answers a stream it refuses (etcd's rafthttp texts).
    #[error("cluster ID mismatch")]
    ClusterIdMismatch,
    #[error("invalid from")]
    PeerInvalidFrom,
    #[error("error sender not found")]
    PeerSenderNotFound,
    #[error("to field mismatch")]
    PeerToMismatch,
    /// A peer message larger than the peer port takes.
    #[error("rafthttp: error limit exceeded")]
    PeerMessageTooLarge,
    /// bcrypt (Go's too) refuses passwords over 72 bytes.
    #[error("bcrypt: password length exceeds 72 bytes")]
    PasswordTooLong,
    // The election service's own errors (etcd's v3election texts).
    #[error("election: not leader")]
    ElectionNotLeader,
    #[error("election: no leader")]
    ElectionNoLeader,
    #[error("\"leader\" field must be provided")]
    ElectionMissingLeaderKey,
    /// An error of the lock and election services' inner client: etcd's
    /// clientv3 turns statuses into plain errors, so callers see code
    /// Unknown with the original message.
    #[error("{0}")]
    InnerClient(String),
    /// Another member's answer to a request this member forwarded,
    /// passed on as it came.
    #[error("{message}")]
    Remote { code: tonic::Code, message: String },
    /// A JSON gateway body that is not the request's JSON.
    #[error("{0}")]
    BadRequestBody(String),
    /// Something below the server failed (a task, the raft library, a
    /// background job), or an invariant of retcd's own broke; the cause
    /// is kept when there is one.
    #[error("{context}{}", cause.as_ref().map(|c| format!(": {c}")).unwrap_or_default())]
    Internal {
        context: String,
        #[source]
        cause: Option<Cause>,
    },
}

impl ServerError {
    /// An internal error with no underlying cause.
    pub fn internal(context: impl Into<String>) -> ServerError {
        ServerError::Internal {
            context: context.into(),
            cause: None,
        }
    }

    /// An internal error caused by `err`.
    pub fn internal_from(
        context: impl Into<String>,
        err: impl std::error::Error + Send + Sync + 'static,
    ) -> ServerError {
        ServerError::Internal {
            context: context.into(),
            cause: Some(Cause(Arc::new(err))),
        }
    }
}

/// The underlying error of a [`ServerError::Internal`], shared so the
/// error stays `Clone` (one proposal's result may reach several callers).
#[derive(Debug, Clone)]
pub struct Cause(pub Arc<dyn std::error::Error + Send + Sync + 'static>);

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl From<anyhow::Error> for Cause {
    fn from(e: anyhow::Error) -> Cause {
        Cause(Arc::from(Box::<dyn std::error::Error + Send + Sync>::from(
            e,
        )))
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// An I/O failure on the durable path stops the process (fail-stop): a
/// member must never acknowledge what it could not persist, nor keep
/// serving once its raft loop cannot go on.
pub fn fatal(msg: &str) -> ! {
    tracing::error!("{msg}");
    eprintln!("retcd: fatal: {msg}");
    std::process::exit(1);
}
