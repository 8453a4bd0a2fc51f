//! The applier chain on a real (temporary) backend: each request kind, each
//! refusal, in etcd's order (auth, alarms, backend, quota).

use super::*;
use crate::apply::alarm::AlarmStore;
use crate::apply::membership::Members;
use crate::auth::{AuthError, AuthStore, TokenProvider};
use retcd_api::authpb::{permission::Type as PermType, Permission, UserAddOptions};
use retcd_api::etcdserverpb::{
    alarm_request::AlarmAction, compare, request_op, AlarmRequest, AlarmType, AuthEnableRequest,
    AuthRoleAddRequest, AuthRoleGrantPermissionRequest, AuthUserGrantRoleRequest,
    CompactionRequest, Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseRevokeRequest,
    PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use retcd_api::retcdpb::auth_request::Op;
use retcd_api::retcdpb::{AuthRequest, AuthUserAdd, MemberAttributes};
use retcd_mvcc::MvccError;
use retcd_storage::backend::Backend;
use std::time::Duration;

struct Env {
    _dir: tempfile::TempDir,
    applier: Applier,
    index: u64,
}

fn env_with_quota(quota_bytes: Option<u64>) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(Backend::open(&dir.path().join("db")).unwrap());
    let kv = Arc::new(KvStore::open(backend.clone()).unwrap());
    let lessor = Arc::new(retcd_lease::Lessor::new(
        Default::default(),
        Arc::new(retcd_lease::SystemClock),
    ));
    let auth = AuthStore::load(
        &backend,
        TokenProvider::from_flag("simple", Duration::from_secs(300)).unwrap(),
    )
    .unwrap();
    let applier = Applier {
        watch: WatchableStore::new(kv.clone()),
        kv,
        lessor,
        alarms: Arc::new(AlarmStore::load(&backend).unwrap()),
        auth: Arc::new(auth),
        members: Arc::new(Members::new(vec![retcd_api::retcdpb::Member {
            id: 1,
            ..Default::default()
        }])),
        quota_bytes,
    };
    Env {
        _dir: dir,
        applier,
        index: 0,
    }
}

fn env() -> Env {
    env_with_quota(None)
}

fn put(key: &str, value: &str) -> Request {
    Request::Put(PutRequest {
        key: key.into(),
        value: value.into(),
        ..Default::default()
    })
}

impl Env {
    /// Applies `request` as `user` (auth revision `rev`) in its own batch.
    fn apply_as(&mut self, request: Request, user: &str, rev: u64) -> Applied {
        self.index += 1;
        let kv = self.applier.kv.clone();
        let mut batch = kv.begin_batch().unwrap();
        let req = InternalRaftRequest {
            request: Some(request),
            username: user.into(),
            auth_revision: rev,
            ..Default::default()
        };
        let size = kv.backend().size_cached();
        let done = self.applier.apply(&mut batch, req, self.index, size);
        batch.set_consistent_index(self.index, 1);
        let events = batch.take_events();
        batch.commit(false).unwrap();
        self.applier.after_commit(events);
        done
    }

    fn apply(&mut self, request: Request) -> ApplyResult {
        self.apply_as(request, "", 0).result
    }

    fn get(&self, key: &str) -> Option<Vec<u8>> {
        let r = self
            .applier
            .kv
            .range(&RangeRequest {
                key: key.into(),
                ..Default::default()
            })
            .unwrap();
        r.kvs.first().map(|kv| kv.value.to_vec())
    }

    fn raise(&mut self, alarm: AlarmType) {
        let r = self.apply(Request::Alarm(AlarmRequest {
            action: AlarmAction::Activate as i32,
            member_id: 1,
            alarm: alarm as i32,
        }));
        assert!(
            matches!(r, ApplyResult::Alarm(ref a) if a.alarms.len() == 1),
            "{r:?}"
        );
    }

    /// root (with the root role), and bob with READWRITE on [a, b); auth
    /// enabled. Returns the auth revision.
    fn enable_auth(&mut self) -> u64 {
        let user = |name: &str| {
            Request::Auth(AuthRequest {
                op: Some(Op::UserAdd(AuthUserAdd {
                    name: name.into(),
                    hashed_password: vec![],
                    options: Some(UserAddOptions { no_password: true }),
                })),
            })
        };
        let auth = |op| Request::Auth(AuthRequest { op: Some(op) });
        for r in [
            user("root"),
            user("bob"),
            auth(Op::UserGrantRole(AuthUserGrantRoleRequest {
                user: "root".into(),
                role: "root".into(),
            })),
            auth(Op::RoleAdd(AuthRoleAddRequest { name: "ab".into() })),
            auth(Op::RoleGrantPermission(AuthRoleGrantPermissionRequest {
                name: "ab".into(),
                perm: Some(Permission {
                    perm_type: PermType::Readwrite as i32,
                    key: b"a".to_vec(),
                    range_end: b"b".to_vec(),
                }),
            })),
            auth(Op::UserGrantRole(AuthUserGrantRoleRequest {
                user: "bob".into(),
                role: "ab".into(),
            })),
            auth(Op::Enable(AuthEnableRequest {})),
        ] {
            assert!(matches!(self.apply(r), ApplyResult::Auth(None)));
        }
        assert!(self.applier.auth.is_enabled());
        self.applier.auth.revision()
    }
}

#[test]
fn test_apply_put_range_delete_txn_compaction() {
    let mut e = env();
    match e.apply(put("k", "v1")) {
        ApplyResult::Put(r) => assert_eq!(r.header.unwrap().revision, 2),
        other => panic!("{other:?}"),
    }
    assert_eq!(e.get("k").as_deref(), Some(&b"v1"[..]));
    match e.apply(Request::Range(RangeRequest {
        key: "k".into(),
        ..Default::default()
    })) {
        ApplyResult::Range(r) => assert_eq!(r.kvs.len(), 1),
        other => panic!("{other:?}"),
    }
    let txn = TxnRequest {
        compare: vec![Compare {
            key: "k".into(),
            result: compare::CompareResult::Equal as i32,
            target: compare::CompareTarget::Value as i32,
            target_union: Some(compare::TargetUnion::Value(b"v1".to_vec())),
            range_end: vec![],
        }],
        success: vec![RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: "k".into(),
                value: "v2".into(),
                ..Default::default()
            })),
        }],
        failure: vec![],
    };
    match e.apply(Request::Txn(txn)) {
        ApplyResult::Txn(r) => assert!(r.succeeded),
        other => panic!("{other:?}"),
    }
    assert_eq!(e.get("k").as_deref(), Some(&b"v2"[..]));
    match e.apply(Request::DeleteRange(DeleteRangeRequest {
        key: "k".into(),
        ..Default::default()
    })) {
        ApplyResult::DeleteRange(r) => assert_eq!(r.deleted, 1),
        other => panic!("{other:?}"),
    }
    assert_eq!(e.get("k"), None);
    match e.apply(Request::Compaction(CompactionRequest {
        revision: 3,
        physical: false,
    })) {
        ApplyResult::Compaction(_) => {}
        other => panic!("{other:?}"),
    }
    // compacting again at or below the point is refused, deterministically
    match e.apply(Request::Compaction(CompactionRequest {
        revision: 2,
        physical: false,
    })) {
        ApplyResult::Err(ServerError::Mvcc(MvccError::Compacted)) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn test_apply_lease_grant_attach_revoke() {
    let mut e = env();
    match e.apply(Request::LeaseGrant(LeaseGrantRequest { ttl: 60, id: 7 })) {
        ApplyResult::LeaseGrant(r) => assert_eq!((r.id, r.ttl), (7, 60)),
        other => panic!("{other:?}"),
    }
    match e.apply(Request::LeaseGrant(LeaseGrantRequest { ttl: 60, id: 7 })) {
        ApplyResult::Err(ServerError::Lease(retcd_lease::LeaseError::Exists)) => {}
        other => panic!("{other:?}"),
    }
    let r = e.apply(Request::Put(PutRequest {
        key: "leased".into(),
        value: "x".into(),
        lease: 7,
        ..Default::default()
    }));
    assert!(matches!(r, ApplyResult::Put(_)), "{r:?}");
    assert_eq!(
        e.applier.lessor.lookup(7).unwrap().keys,
        vec![b"leased".to_vec()]
    );
    // a put naming an unknown lease is refused
    let r = e.apply(Request::Put(PutRequest {
        key: "x".into(),
        lease: 8,
        ..Default::default()
    }));
    assert!(
        matches!(
            r,
            ApplyResult::Err(ServerError::Mvcc(MvccError::LeaseNotFound))
        ),
        "{r:?}"
    );
    match e.apply(Request::LeaseRevoke(LeaseRevokeRequest { id: 7 })) {
        ApplyResult::LeaseRevoke(_) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(e.get("leased"), None, "the lease's key went with it");
    match e.apply(Request::LeaseRevoke(LeaseRevokeRequest { id: 7 })) {
        ApplyResult::Err(ServerError::Lease(retcd_lease::LeaseError::NotFound)) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn test_apply_publish_updates_members() {
    let mut e = env();
    let r = e.apply(Request::MemberAttributes(MemberAttributes {
        member_id: 1,
        name: "m1".into(),
        client_urls: vec!["http://c:1".into()],
    }));
    assert!(matches!(r, ApplyResult::Empty), "{r:?}");
    let m = e.applier.members.get(1).unwrap();
    assert_eq!(m.name, "m1");
    assert_eq!(m.client_urls, vec!["http://c:1".to_string()]);
    // persisted in the same batch
    let stored = membership::load(e.applier.kv.backend()).unwrap();
    assert_eq!(stored[0].name, "m1");
}

#[test]
fn test_apply_corrupt_alarm_refuses_every_change() {
    let mut e = env();
    e.raise(AlarmType::Corrupt);
    for r in [
        put("k", "v"),
        Request::DeleteRange(DeleteRangeRequest {
            key: "k".into(),
            ..Default::default()
        }),
        Request::Range(RangeRequest {
            key: "k".into(),
            ..Default::default()
        }),
        Request::Txn(TxnRequest::default()),
        Request::Compaction(CompactionRequest {
            revision: 1,
            physical: false,
        }),
        Request::LeaseGrant(LeaseGrantRequest { ttl: 5, id: 1 }),
        Request::LeaseRevoke(LeaseRevokeRequest { id: 1 }),
    ] {
        let res = e.apply(r);
        assert!(
            matches!(res, ApplyResult::Err(ServerError::Corrupt)),
            "{res:?}"
        );
    }
    assert_eq!(e.get("k"), None);
    // alarms themselves still apply (disarm)
    let r = e.apply(Request::Alarm(AlarmRequest {
        action: AlarmAction::Deactivate as i32,
        member_id: 1,
        alarm: AlarmType::Corrupt as i32,
    }));
    assert!(
        matches!(r, ApplyResult::Alarm(ref a) if a.alarms.len() == 1),
        "{r:?}"
    );
    assert!(matches!(e.apply(put("k", "v")), ApplyResult::Put(_)));
}

#[test]
fn test_apply_nospace_alarm_refuses_writes_that_cost_space() {
    let mut e = env();
    assert!(matches!(e.apply(put("k", "v")), ApplyResult::Put(_)));
    e.raise(AlarmType::Nospace);
    for r in [
        put("k2", "v"),
        Request::LeaseGrant(LeaseGrantRequest { ttl: 5, id: 1 }),
        Request::Txn(TxnRequest {
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: "k3".into(),
                    ..Default::default()
                })),
            }],
            ..Default::default()
        }),
    ] {
        let res = e.apply(r);
        assert!(
            matches!(res, ApplyResult::Err(ServerError::NoSpace)),
            "{res:?}"
        );
    }
    // deletes, reads and read-only txns still work
    let r = e.apply(Request::DeleteRange(DeleteRangeRequest {
        key: "k".into(),
        ..Default::default()
    }));
    assert!(matches!(r, ApplyResult::DeleteRange(_)), "{r:?}");
    assert!(matches!(
        e.apply(Request::Txn(TxnRequest::default())),
        ApplyResult::Txn(_)
    ));
}

#[test]
fn test_apply_over_quota_is_applied_but_answered_nospace() {
    // a quota the very first put exceeds
    let mut e = env_with_quota(Some(1));
    let done = e.apply_as(put("k", "v"), "", 0);
    assert!(done.over_quota);
    assert!(matches!(
        done.result,
        ApplyResult::Err(ServerError::NoSpace)
    ));
    // applied all the same (every member applies the same entries)
    assert_eq!(e.get("k").as_deref(), Some(&b"v"[..]));
    // a free request is never over
    let done = e.apply_as(
        Request::DeleteRange(DeleteRangeRequest {
            key: "k".into(),
            ..Default::default()
        }),
        "",
        0,
    );
    assert!(!done.over_quota);
}

#[test]
fn test_apply_auth_checks_each_request_kind() {
    let mut e = env();
    let rev = e.enable_auth();
    // no user
    let res = e.apply_as(put("a1", "v"), "", 0).result;
    assert!(
        matches!(
            res,
            ApplyResult::Err(ServerError::Auth(AuthError::UserEmpty))
        ),
        "{res:?}"
    );
    // bob may write inside [a, b), not outside
    assert!(matches!(
        e.apply_as(put("a1", "v"), "bob", rev).result,
        ApplyResult::Put(_)
    ));
    let res = e.apply_as(put("c", "v"), "bob", rev).result;
    assert!(
        matches!(
            res,
            ApplyResult::Err(ServerError::Auth(AuthError::PermissionDenied))
        ),
        "{res:?}"
    );
    // a delete of a range partly outside is denied
    let res = e
        .apply_as(
            Request::DeleteRange(DeleteRangeRequest {
                key: "a".into(),
                range_end: "c".into(),
                ..Default::default()
            }),
            "bob",
            rev,
        )
        .result;
    assert!(
        matches!(res, ApplyResult::Err(ServerError::Auth(_))),
        "{res:?}"
    );
    // a txn is checked in both branches: a failure branch outside [a, b)
    let txn = TxnRequest {
        failure: vec![RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: "z".into(),
                ..Default::default()
            })),
        }],
        ..Default::default()
    };
    let res = e.apply_as(Request::Txn(txn), "bob", rev).result;
    assert!(
        matches!(res, ApplyResult::Err(ServerError::Auth(_))),
        "{res:?}"
    );
    // a token of an older auth revision
    let res = e.apply_as(put("a2", "v"), "bob", rev - 1).result;
    assert!(
        matches!(
            res,
            ApplyResult::Err(ServerError::Auth(AuthError::AuthOldRevision))
        ),
        "{res:?}"
    );
    // auth changes need root
    let role = Request::Auth(AuthRequest {
        op: Some(Op::RoleAdd(AuthRoleAddRequest { name: "x".into() })),
    });
    let res = e.apply_as(role.clone(), "bob", rev).result;
    assert!(
        matches!(res, ApplyResult::Err(ServerError::Auth(_))),
        "{res:?}"
    );
    assert!(matches!(
        e.apply_as(role, "root", rev).result,
        ApplyResult::Auth(None)
    ));
    // revoking a lease needs write on its keys
    let rev = e.applier.auth.revision();
    assert!(matches!(
        e.apply_as(
            Request::LeaseGrant(LeaseGrantRequest { ttl: 60, id: 9 }),
            "root",
            rev
        )
        .result,
        ApplyResult::LeaseGrant(_)
    ));
    let leased = Request::Put(PutRequest {
        key: "zz".into(),
        lease: 9,
        ..Default::default()
    });
    assert!(matches!(
        e.apply_as(leased, "root", rev).result,
        ApplyResult::Put(_)
    ));
    let res = e
        .apply_as(
            Request::LeaseRevoke(LeaseRevokeRequest { id: 9 }),
            "bob",
            rev,
        )
        .result;
    assert!(
        matches!(res, ApplyResult::Err(ServerError::Auth(_))),
        "{res:?}"
    );
    // the server itself (expired leases) acts as root
    let root = crate::auth::AuthInfo::server_itself();
    let res = e
        .apply_as(
            Request::LeaseRevoke(LeaseRevokeRequest { id: 9 }),
            &root.username,
            root.revision,
        )
        .result;
    assert!(matches!(res, ApplyResult::LeaseRevoke(_)), "{res:?}");
}

#[test]
fn test_apply_request_without_body_is_an_error_not_a_panic() {
    let e = env();
    let kv = e.applier.kv.clone();
    let mut batch = kv.begin_batch().unwrap();
    let done = e
        .applier
        .apply(&mut batch, InternalRaftRequest::default(), 1, 0);
    assert!(matches!(
        done.result,
        ApplyResult::Err(ServerError::Internal { .. })
    ));
}
