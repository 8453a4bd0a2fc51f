//! `InternalRaftRequest` became a `oneof` with the field numbers its
//! optional fields had: entries written by the previous code (each field
//! an optional message of its own) must decode to the same request, and
//! the new encoding must be byte for byte the old one.

use prost::Message;
use retcd_api::etcdserverpb::{
    AlarmRequest, CompactionRequest, DeleteRangeRequest, LeaseGrantRequest, LeaseRevokeRequest,
    PutRequest, RangeRequest, TxnRequest,
};
use retcd_api::retcdpb::internal_raft_request::Request;
use retcd_api::retcdpb::{
    AuthRequest, InternalRaftRequest, LeaseCheckpointRequest, MemberAttributes,
};

/// The message as the code before the change declared it.
#[derive(Clone, PartialEq, prost::Message)]
struct OldInternalRaftRequest {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(message, optional, tag = "3")]
    range: Option<RangeRequest>,
    #[prost(message, optional, tag = "4")]
    put: Option<PutRequest>,
    #[prost(message, optional, tag = "5")]
    delete_range: Option<DeleteRangeRequest>,
    #[prost(message, optional, tag = "6")]
    txn: Option<TxnRequest>,
    #[prost(message, optional, tag = "7")]
    compaction: Option<CompactionRequest>,
    #[prost(message, optional, tag = "8")]
    lease_grant: Option<LeaseGrantRequest>,
    #[prost(message, optional, tag = "9")]
    lease_revoke: Option<LeaseRevokeRequest>,
    #[prost(message, optional, tag = "10")]
    alarm: Option<AlarmRequest>,
    #[prost(message, optional, tag = "11")]
    lease_checkpoint: Option<LeaseCheckpointRequest>,
    #[prost(message, optional, tag = "12")]
    member_attributes: Option<MemberAttributes>,
    #[prost(message, optional, tag = "13")]
    auth: Option<AuthRequest>,
    #[prost(string, tag = "14")]
    username: String,
    #[prost(uint64, tag = "15")]
    auth_revision: u64,
}

fn pairs() -> Vec<(OldInternalRaftRequest, Request)> {
    let old = OldInternalRaftRequest::default;
    let put = PutRequest {
        key: b"k".to_vec(),
        value: b"v".to_vec(),
        lease: 7,
        ..Default::default()
    };
    vec![
        (
            OldInternalRaftRequest {
                range: Some(RangeRequest::default()),
                ..old()
            },
            Request::Range(RangeRequest::default()),
        ),
        (
            OldInternalRaftRequest {
                put: Some(put.clone()),
                ..old()
            },
            Request::Put(put),
        ),
        (
            OldInternalRaftRequest {
                delete_range: Some(DeleteRangeRequest {
                    key: b"a".to_vec(),
                    range_end: b"b".to_vec(),
                    ..Default::default()
                }),
                ..old()
            },
            Request::DeleteRange(DeleteRangeRequest {
                key: b"a".to_vec(),
                range_end: b"b".to_vec(),
                ..Default::default()
            }),
        ),
        (
            OldInternalRaftRequest {
                txn: Some(TxnRequest::default()),
                ..old()
            },
            Request::Txn(TxnRequest::default()),
        ),
        (
            OldInternalRaftRequest {
                compaction: Some(CompactionRequest {
                    revision: 5,
                    physical: true,
                }),
                ..old()
            },
            Request::Compaction(CompactionRequest {
                revision: 5,
                physical: true,
            }),
        ),
        (
            OldInternalRaftRequest {
                lease_grant: Some(LeaseGrantRequest { ttl: 10, id: 3 }),
                ..old()
            },
            Request::LeaseGrant(LeaseGrantRequest { ttl: 10, id: 3 }),
        ),
        (
            OldInternalRaftRequest {
                lease_revoke: Some(LeaseRevokeRequest { id: 3 }),
                ..old()
            },
            Request::LeaseRevoke(LeaseRevokeRequest { id: 3 }),
        ),
        (
            OldInternalRaftRequest {
                alarm: Some(AlarmRequest::default()),
                ..old()
            },
            Request::Alarm(AlarmRequest::default()),
        ),
        (
            OldInternalRaftRequest {
                lease_checkpoint: Some(LeaseCheckpointRequest::default()),
                ..old()
            },
            Request::LeaseCheckpoint(LeaseCheckpointRequest::default()),
        ),
        (
            OldInternalRaftRequest {
                member_attributes: Some(MemberAttributes {
                    member_id: 9,
                    name: "m".into(),
                    client_urls: vec!["http://c:1".into()],
                }),
                ..old()
            },
            Request::MemberAttributes(MemberAttributes {
                member_id: 9,
                name: "m".into(),
                client_urls: vec!["http://c:1".into()],
            }),
        ),
        (
            OldInternalRaftRequest {
                auth: Some(AuthRequest::default()),
                ..old()
            },
            Request::Auth(AuthRequest::default()),
        ),
    ]
}

#[test]
fn test_old_entries_decode_to_the_same_request() {
    for (mut old, request) in pairs() {
        old.id = 42;
        old.username = "bob".into();
        old.auth_revision = 3;
        let bytes = old.encode_to_vec();
        let new = InternalRaftRequest::decode(&bytes[..]).unwrap();
        assert_eq!(new.id, 42);
        assert_eq!(new.username, "bob");
        assert_eq!(new.auth_revision, 3);
        assert_eq!(new.request.as_ref(), Some(&request));
        // and the new encoding is the old bytes
        assert_eq!(new.encode_to_vec(), bytes, "{request:?}");
    }
}

#[test]
fn test_a_request_of_each_kind_round_trips() {
    assert_eq!(pairs().len(), 11, "every request kind of the oneof");
    let empty = InternalRaftRequest::decode(&[][..]).unwrap();
    assert_eq!(empty.request, None, "an empty entry has no request");
}
