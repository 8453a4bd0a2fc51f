//! The ONE place errors become `tonic::Status`, with etcd's exact codes and
//! messages (etcd's `rpctypes` table and `togRPCError`).

use crate::auth::AuthError;
use crate::error::ServerError;
use retcd_lease::LeaseError;
use retcd_mvcc::MvccError;
use tonic::{Code, Status};

/// etcd's code for an error.
fn code(err: &ServerError) -> Code {
    use ServerError as E;
    match err {
        E::Mvcc(m) => match m {
            MvccError::Compacted | MvccError::FutureRev => Code::OutOfRange,
            MvccError::LeaseNotFound => Code::NotFound,
            MvccError::ResponseTooLarge { .. } => Code::ResourceExhausted,
            MvccError::KeyNotFound | MvccError::ValueProvided | MvccError::LeaseProvided => {
                Code::InvalidArgument
            }
            _ => Code::Unknown,
        },
        E::Lease(l) => match l {
            LeaseError::NotFound => Code::NotFound,
            LeaseError::Exists => Code::FailedPrecondition,
            LeaseError::TtlTooLarge => Code::OutOfRange,
            LeaseError::NotPrimary | LeaseError::Expired | LeaseError::Backend(_) => Code::Unknown,
        },
        E::Auth(a) => auth_code(a),
        // etcd returns these unconverted: clients see Unknown.
        E::AuthRaw(_) => Code::Unknown,
        E::EmptyKey
        | E::ValueProvided
        | E::LeaseProvided
        | E::TooManyOps
        | E::DuplicateKey
        | E::InvalidSortOption
        | E::RequestTooLarge
        | E::UnknownAlarmAction
        | E::UnknownDowngradeAction
        | E::BadRequestBody(_) => Code::InvalidArgument,
        E::NoLeader
        | E::LeaderChanged
        | E::Stopped
        | E::Timeout
        | E::TimeoutDueToLeaderFail
        | E::TimeoutDueToConnectionLost => Code::Unavailable,
        E::Unimplemented(_) => Code::Unimplemented,
        E::NoSpace => Code::ResourceExhausted,
        E::Corrupt => Code::DataLoss,
        E::InvalidDowngradeTargetVersion | E::WrongDowngradeVersionFormat => Code::InvalidArgument,
        E::NoInflightDowngrade | E::DowngradeUnsupported => Code::FailedPrecondition,
        E::MemberExist
        | E::PeerUrlExist
        | E::MemberNotLearner
        | E::LearnerNotReady
        | E::TooManyLearners
        | E::NotLeader
        | E::BadLeaderTransferee
        | E::RemovedMember
        | E::ClusterIdMismatch
        | E::PeerToMismatch => Code::FailedPrecondition,
        E::PeerInvalidFrom | E::PeerMessageTooLarge => Code::InvalidArgument,
        E::PeerSenderNotFound => Code::NotFound,
        E::MemberBadUrls => Code::InvalidArgument,
        E::MemberNotFound => Code::NotFound,
        E::Unhealthy | E::NotSupportedForLearner => Code::Unavailable,
        E::Remote { code, .. } => *code,
        // etcd maps "not enough started members" to its client-side error
        // type, not a status, so it reaches clients as Unknown; a leader
        // transfer timeout has no mapping at all. The election service's
        // errors and its inner client's are plain Go errors (Unknown).
        E::MemberNotEnoughStarted
        | E::ProposalDropped
        | E::ProposeDeadline
        | E::LeaderTransferTimeout
        | E::ElectionNotLeader
        | E::ElectionNoLeader
        | E::ElectionMissingLeaderKey
        | E::InnerClient(_)
        | E::Internal { .. } => Code::Unknown,
        // etcd's rpctypes.ErrTooManyRequests is an EtcdError without a gRPC
        // status (Unknown on the wire; clientv3 maps the text back), and
        // a bcrypt error is passed on as it came.
        E::TooManyRequests | E::PasswordTooLong => Code::Unknown,
    }
}

fn auth_code(a: &AuthError) -> Code {
    use AuthError as A;
    match a {
        A::UserEmpty
        | A::RoleEmpty
        | A::AuthFailed
        | A::PermissionNotGiven
        | A::InvalidAuthMgmt
        | A::AuthOldRevision => Code::InvalidArgument,
        A::PermissionDenied => Code::PermissionDenied,
        A::InvalidAuthToken => Code::Unauthenticated,
        A::NoPasswordUser | A::VerifyOnly | A::Backend(_) => Code::Unknown,
        A::RootUserNotExist
        | A::RootRoleNotExist
        | A::UserAlreadyExist
        | A::UserNotFound
        | A::RoleAlreadyExist
        | A::RoleNotFound
        | A::RoleNotGranted
        | A::PermissionNotGranted
        | A::AuthNotEnabled => Code::FailedPrecondition,
    }
}

pub fn to_status(err: ServerError) -> Status {
    use ServerError as E;
    let msg = match &err {
        // etcd prefixes mvcc's own errors with "etcdserver: " on the wire.
        E::Mvcc(m @ (MvccError::Compacted | MvccError::FutureRev)) => format!("etcdserver: {m}"),
        // etcd's rpctypes texts for the lessor's errors.
        E::Lease(LeaseError::NotFound) => "etcdserver: requested lease not found".into(),
        E::Lease(LeaseError::Exists) => "etcdserver: lease already exists".into(),
        E::Lease(LeaseError::TtlTooLarge) => "etcdserver: too large lease TTL".into(),
        other => other.to_string(),
    };
    Status::new(code(&err), msg)
}

impl From<ServerError> for Status {
    fn from(e: ServerError) -> Status {
        to_status(e)
    }
}

/// What the peer service answers a forwarded lease request with: the
/// forwarding member tells a missing lease (NotFound) from a callee that
/// is no longer the primary lessor (FailedPrecondition: ask the new
/// leader) and an expired lease (Unavailable: ask again).
pub fn to_peer_lease_status(e: LeaseError) -> Status {
    let code = match e {
        LeaseError::NotFound => Code::NotFound,
        LeaseError::NotPrimary => Code::FailedPrecondition,
        LeaseError::Expired => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(code, e.to_string())
}

/// A gRPC path no service here has (tonic's generated answer: code
/// Unimplemented, no message).
pub fn unimplemented(_path: &str) -> Status {
    Status::new(Code::Unimplemented, "")
}

/// A call whose `grpc-timeout` passed before its answer (`api::serve`
/// ends it): what etcd 3.4 and 3.5 answer when a handler returns its
/// context's error, as Lock and Campaign do: grpc-go before 1.5x converts
/// an error that is not a status to Unknown. (Newer grpc-go, so etcd 3.6,
/// answers DeadlineExceeded with the same message.)
pub fn deadline_exceeded() -> Status {
    Status::new(Code::Unknown, "context deadline exceeded")
}

/// gRPC's status header names, as constants: a constant name is not
/// parsed again at every lookup (a string's is, a few hundred instructions
/// each).
pub(crate) const GRPC_STATUS: axum::http::HeaderName =
    axum::http::HeaderName::from_static("grpc-status");
pub(crate) const GRPC_MESSAGE: axum::http::HeaderName =
    axum::http::HeaderName::from_static("grpc-message");

/// tonic answers a message over the receive limit with `OutOfRange`
/// "Error, decoded message length too large: found N bytes, the limit is:
/// M bytes"; grpc-go, so etcd, with `ResourceExhausted` "grpc: received
/// message larger than max (N vs. M)". Rewrites the first into the second
/// in the `grpc-status`/`grpc-message` of response headers (a unary call's
/// trailers-only answer) or trailers (a stream's).
pub fn grpc_go_size_error(h: &mut axum::http::HeaderMap) {
    use axum::http::HeaderValue;
    // (it has both headers: every answered call's trailers, which carry
    // `grpc-status` alone, and every answer's headers, `content-type`
    // alone, skip the lookups)
    if h.len() < 2 || h.get(GRPC_STATUS).map(|v| v.as_bytes()) != Some(b"11") {
        return;
    }
    let Some(raw) = h.get(GRPC_MESSAGE) else {
        return;
    };
    let msg = percent_encoding::percent_decode(raw.as_bytes()).decode_utf8_lossy();
    let Some((n, m)) = msg
        .strip_prefix("Error, decoded message length too large: found ")
        .and_then(|r| r.split_once(" bytes, the limit is: "))
        .and_then(|(n, r)| Some((n, r.strip_suffix(" bytes")?)))
    else {
        return;
    };
    let new = format!("grpc: received message larger than max ({n} vs. {m})");
    let enc = percent_encoding::utf8_percent_encode(&new, percent_encoding::CONTROLS).to_string();
    if let Ok(v) = HeaderValue::from_str(&enc) {
        h.insert(GRPC_STATUS, HeaderValue::from_static("8"));
        h.insert(GRPC_MESSAGE, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_compacted_maps_to_etcd_text() {
        let s = to_status(ServerError::Mvcc(MvccError::Compacted));
        assert_eq!(s.code(), Code::OutOfRange);
        assert_eq!(
            s.message(),
            "etcdserver: mvcc: required revision has been compacted"
        );
        let s = to_status(ServerError::Mvcc(MvccError::LeaseNotFound));
        assert_eq!(s.code(), Code::NotFound);
        assert_eq!(s.message(), "etcdserver: requested lease not found");
        let s = to_status(ServerError::Lease(LeaseError::NotFound));
        assert_eq!(s.code(), Code::NotFound);
        assert_eq!(s.message(), "etcdserver: requested lease not found");
        let s = to_status(ServerError::Lease(LeaseError::Exists));
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(s.message(), "etcdserver: lease already exists");
        let s = to_status(ServerError::Lease(LeaseError::TtlTooLarge));
        assert_eq!(s.code(), Code::OutOfRange);
        assert_eq!(s.message(), "etcdserver: too large lease TTL");
        let s = to_status(ServerError::RequestTooLarge);
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(s.message(), "etcdserver: request is too large");
    }

    #[test]
    fn test_raw_auth_errors_and_internal_causes() {
        let s = to_status(ServerError::AuthRaw(AuthError::PermissionDenied));
        assert_eq!(s.code(), Code::Unknown);
        assert_eq!(s.message(), "auth: permission denied");
        let s = to_status(ServerError::Auth(AuthError::PermissionDenied));
        assert_eq!(s.code(), Code::PermissionDenied);
        assert_eq!(s.message(), "etcdserver: permission denied");
        let e = ServerError::internal_from("retcd: task failed", std::io::Error::other("boom"));
        assert!(std::error::Error::source(&e).is_some(), "the cause is kept");
        let s = to_status(e);
        assert_eq!(s.code(), Code::Unknown);
        assert_eq!(s.message(), "retcd: task failed: boom");
        let s = to_status(ServerError::ElectionNotLeader);
        assert_eq!(
            (s.code(), s.message()),
            (Code::Unknown, "election: not leader")
        );
    }

    #[test]
    fn tonic_size_error_becomes_grpc_gos() {
        use axum::http::{HeaderMap, HeaderValue};
        let mut h = HeaderMap::new();
        h.insert("grpc-status", HeaderValue::from_static("11"));
        h.insert(
            "grpc-message",
            HeaderValue::from_static(
                "Error,%20decoded%20message%20length%20too%20large:%20found%202097164%20bytes,%20the%20limit%20is:%202097152%20bytes",
            ),
        );
        grpc_go_size_error(&mut h);
        assert_eq!(h["grpc-status"], "8");
        let m = percent_encoding::percent_decode(h["grpc-message"].as_bytes()).decode_utf8_lossy();
        assert_eq!(
            m,
            "grpc: received message larger than max (2097164 vs. 2097152)"
        );
        // any other OutOfRange stays as it is
        let mut h = HeaderMap::new();
        h.insert("grpc-status", HeaderValue::from_static("11"));
        h.insert(
            "grpc-message",
            HeaderValue::from_static(
                "etcdserver:%20mvcc:%20required%20revision%20has%20been%20compacted",
            ),
        );
        let before = h.clone();
        grpc_go_size_error(&mut h);
        assert_eq!(h, before);
    }
}
