//! The ONE place errors become `tonic::Status`, with etcd's exact codes and
//! messages (etcd's `rpctypes` table).

use crate::error::ServerError;
use retcd_lease::LeaseError;
use retcd_mvcc::MvccError;
use tonic::{Code, Status};

pub fn to_status(err: ServerError) -> Status {
    use ServerError as E;
    let code = match &err {
        E::Mvcc(m) => match m {
            MvccError::Compacted | MvccError::FutureRev => Code::OutOfRange,
            MvccError::LeaseNotFound => Code::NotFound,
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
        E::Auth(a) => {
            use crate::auth::AuthError as A;
            match a {
                A::UserEmpty
                | A::RoleEmpty
                | A::AuthFailed
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
        E::EmptyKey
        | E::ValueProvided
        | E::LeaseProvided
        | E::TooManyOps
        | E::DuplicateKey
        | E::RequestTooLarge => Code::InvalidArgument,
        E::NoLeader | E::LeaderChanged | E::Stopped | E::Timeout => Code::Unavailable,
        E::NoSpace => Code::ResourceExhausted,
        E::Corrupt => Code::DataLoss,
        E::InvalidDowngradeTargetVersion | E::WrongDowngradeVersionFormat => Code::InvalidArgument,
        E::NoInflightDowngrade => Code::FailedPrecondition,
        E::MemberExist
        | E::PeerUrlExist
        | E::MemberNotLearner
        | E::LearnerNotReady
        | E::TooManyLearners
        | E::NotLeader
        | E::BadLeaderTransferee => Code::FailedPrecondition,
        E::MemberBadUrls => Code::InvalidArgument,
        E::MemberNotFound => Code::NotFound,
        E::Unhealthy | E::NotSupportedForLearner => Code::Unavailable,
        // etcd maps "not enough started members" to its client-side error
        // type, not a status, so it reaches clients as Unknown; a leader
        // transfer timeout has no mapping at all.
        E::MemberNotEnoughStarted | E::LeaderTransferTimeout | E::Internal(_) => Code::Unknown,
    };
    let msg = match &err {
        // etcd prefixes mvcc's own errors with "etcdserver: " on the wire.
        E::Mvcc(m @ (MvccError::Compacted | MvccError::FutureRev)) => format!("etcdserver: {m}"),
        // etcd's rpctypes texts for the lessor's errors.
        E::Lease(LeaseError::NotFound) => "etcdserver: requested lease not found".into(),
        E::Lease(LeaseError::Exists) => "etcdserver: lease already exists".into(),
        E::Lease(LeaseError::TtlTooLarge) => "etcdserver: too large lease TTL".into(),
        other => other.to_string(),
    };
    Status::new(code, msg)
}

impl From<ServerError> for Status {
    fn from(e: ServerError) -> Status {
        to_status(e)
    }
}

pub fn unimplemented(what: &str) -> Status {
    Status::unimplemented(format!("retcd: {what} is not implemented yet"))
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
}
