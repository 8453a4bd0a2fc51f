//! A structure-aware RPC fuzzer against live 3-member clusters: seeded
//! random sequences of every RPC of etcd's v3 API (KV, Txn with nested
//! ops, Compact, Watch streams, leases and keepalives, members, alarms,
//! maintenance, auth except enabling it, lock, election) with random
//! fields — huge, empty, negative, out-of-range enum values, unicode, bytes
//! that are not UTF-8, revisions past the head or compacted, unknown and
//! real lease and member IDs — sent to a random member, one at a time.
//!
//! The same sequence runs against real etcd 3.4.23 (the reference) and the
//! target (retcd; `RETCD_TEST_FLAVOR=etcd` makes it a second etcd, to check
//! the test). It fails when the target answers `Internal` or `Unknown`
//! where etcd answered otherwise, when a member of the target dies, stops
//! answering, or ends with a HashKV unlike the others'. Every other code
//! difference is printed (step, request, both codes).
//!
//! `RETCD_RPC_FUZZ_STEPS` (default 400) and `RETCD_RPC_FUZZ_SEED` (default
//! 1) size and replay a run.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use retcd_api::authpb::{Permission, UserAddOptions};
use retcd_api::etcdserverpb::{
    auth_client::AuthClient, cluster_client::ClusterClient, compare, kv_client::KvClient,
    lease_client::LeaseClient, maintenance_client::MaintenanceClient, request_op,
    watch_client::WatchClient, watch_request, AlarmRequest, AuthRoleAddRequest,
    AuthRoleDeleteRequest, AuthRoleGetRequest, AuthRoleGrantPermissionRequest, AuthRoleListRequest,
    AuthRoleRevokePermissionRequest, AuthStatusRequest, AuthUserAddRequest,
    AuthUserChangePasswordRequest, AuthUserDeleteRequest, AuthUserGetRequest,
    AuthUserGrantRoleRequest, AuthUserListRequest, AuthUserRevokeRoleRequest, AuthenticateRequest,
    CompactionRequest, Compare, DefragmentRequest, DeleteRangeRequest, HashKvRequest, HashRequest,
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseLeasesRequest, LeaseRevokeRequest,
    LeaseTimeToLiveRequest, MemberAddRequest, MemberListRequest, MemberPromoteRequest,
    MemberRemoveRequest, MemberUpdateRequest, MoveLeaderRequest, PutRequest, RangeRequest,
    RequestOp, SnapshotRequest, StatusRequest, TxnRequest, WatchCancelRequest, WatchCreateRequest,
    WatchProgressRequest, WatchRequest,
};
use retcd_api::v3electionpb::{
    election_client::ElectionClient, CampaignRequest, LeaderKey, LeaderRequest, ProclaimRequest,
    ResignRequest,
};
use retcd_api::v3lockpb::{lock_client::LockClient, LockRequest, UnlockRequest};
use retcd_tests::limit::SLOW as LIMIT;
use retcd_tests::{bounded, test_flavor, Cluster, Flavor};
use tonic::transport::Channel;

/// Each call's bound; a call that takes longer is recorded as `timeout`.
const CALL: Duration = Duration::from_secs(4);

/// `f` bounded by [`CALL`].
fn to<F: std::future::Future>(f: F) -> tokio::time::Timeout<F> {
    tokio::time::timeout(CALL, f)
}

fn env_u64(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Channels to each member, and what the sequence learnt on its way (the
/// server's own lease and member IDs, and the last revision it saw).
struct Target {
    /// Real etcd 3.4, the reference: calls that crash it are not sent.
    etcd34: bool,
    chans: Vec<Channel>,
    leases: Vec<i64>,
    members: Vec<u64>,
    rev: i64,
}

/// The answer of one call: `OK`, a gRPC code and its message after `: `,
/// or `timeout`.
fn code<T>(r: Result<Result<T, tonic::Status>, tokio::time::error::Elapsed>) -> String {
    match r {
        Ok(Ok(_)) => "OK".into(),
        Ok(Err(s)) => format!("{:?}: {}", s.code(), s.message()),
        Err(_) => "timeout".into(),
    }
}

/// Answers `Unknown` the newest etcd gives too: UserAdd and
/// UserChangePassword return bcrypt's own error for a password over 72
/// bytes (server/etcdserver/v3_server.go on main; etcd 3.4's older bcrypt
/// cut such a password silently and answered OK).
/// The lock and election services pass their inner client's errors on as
/// plain errors, so code Unknown with etcd's message (etcd 3.4 answered
/// "Unknown: etcdserver: corrupt cluster" to Lock here).
fn etcd_answers_unknown_too(name: &str, answer: &str) -> bool {
    let bcrypt = matches!(name, "UserAdd" | "UserChangePassword")
        && answer == "Unknown: bcrypt: password length exceeds 72 bytes";
    let concurrency = matches!(
        name,
        "Lock" | "Unlock" | "Campaign" | "Proclaim" | "Resign" | "Leader"
    ) && answer.starts_with("Unknown: etcdserver: ");
    bcrypt || concurrency
}

/// The code of an answer of [`code`].
fn code_of(a: &str) -> &str {
    a.split(": ").next().unwrap_or(a)
}

fn bytes(rng: &mut StdRng) -> Vec<u8> {
    match rng.random_range(0..10) {
        0 => Vec::new(),
        1 => vec![0],
        2 => vec![0xff; rng.random_range(1..4)],
        3 => "ключ/🔑/鍵".as_bytes().to_vec(),
        4 => (0..rng.random_range(1..40)).map(|_| rng.random()).collect(),
        6 => vec![b'k'; rng.random_range(100..3000)],
        _ => format!("fz/{}", rng.random_range(0..12)).into_bytes(),
    }
}

fn range_end(rng: &mut StdRng, key: &[u8]) -> Vec<u8> {
    match rng.random_range(0..6) {
        0 => vec![0],
        1 => bytes(rng), // possibly below the key
        2 => {
            let mut e = key.to_vec();
            if let Some(l) = e.last_mut() {
                *l = l.wrapping_add(1);
            }
            e
        }
        _ => Vec::new(),
    }
}

fn int(rng: &mut StdRng, around: i64) -> i64 {
    match rng.random_range(0..9) {
        0 => 0,
        1 => -1,
        2 => i64::MIN,
        3 => i64::MAX,
        4 => around + rng.random_range(1..1000), // the future
        5 => rng.random(),
        _ => rng.random_range(0..around.max(1) + 1),
    }
}

/// An enum field: mostly valid, sometimes a value the enum does not have.
fn enum_val(rng: &mut StdRng, n: i32) -> i32 {
    match rng.random_range(0..8) {
        0 => -1,
        1 => n + rng.random_range(0..5),
        _ => rng.random_range(0..n),
    }
}

fn name(rng: &mut StdRng) -> String {
    match rng.random_range(0..8) {
        0 => String::new(),
        1 => "root".into(),
        2 => "имя-用户".into(),
        3 => "x".repeat(rng.random_range(100..2000)),
        4 => "a b\tc\n".into(),
        _ => format!("fz{}", rng.random_range(0..5)),
    }
}

fn lease_id(rng: &mut StdRng, t: &Target) -> i64 {
    match rng.random_range(0..4) {
        0 if !t.leases.is_empty() => t.leases[rng.random_range(0..t.leases.len())],
        1 => 0,
        _ => int(rng, 1 << 40),
    }
}

/// A member ID that is never a real one (removing or updating a real
/// member would take the cluster apart), or 0.
fn unknown_member(rng: &mut StdRng) -> u64 {
    if rng.random_range(0..3) == 0 {
        0
    } else {
        rng.random()
    }
}

fn urls(rng: &mut StdRng) -> Vec<String> {
    let pool = [
        "",
        "not a url",
        "http://",
        "unix:///tmp/x",
        "http://127.0.0.1:1",
        "https://[::1]:99999",
        "http://h:1/path?q",
        "http://127.0.0.1:2",
        "ftp://127.0.0.1:3",
    ];
    (0..rng.random_range(0..3))
        .map(|_| pool[rng.random_range(0..pool.len())].to_string())
        .collect()
}

/// A Put; at the top level (`top`) sometimes with a value over the
/// request limit (inside a Txn of 200 ops that would make the client send
/// hundreds of MiB).
fn put(rng: &mut StdRng, t: &Target, top: bool) -> PutRequest {
    PutRequest {
        key: bytes(rng),
        value: if top && rng.random_range(0..30) == 0 {
            vec![b'x'; 2 * 1024 * 1024]
        } else {
            bytes(rng)
        },
        lease: if rng.random_range(0..3) == 0 {
            lease_id(rng, t)
        } else {
            0
        },
        prev_kv: rng.random(),
        ignore_value: rng.random_range(0..6) == 0,
        ignore_lease: rng.random_range(0..6) == 0,
    }
}

fn range(rng: &mut StdRng, t: &Target) -> RangeRequest {
    let key = bytes(rng);
    RangeRequest {
        range_end: range_end(rng, &key),
        key,
        limit: if rng.random() { 0 } else { int(rng, 10) },
        revision: if rng.random() { 0 } else { int(rng, t.rev) },
        sort_order: enum_val(rng, 3),
        sort_target: enum_val(rng, 5),
        serializable: rng.random(),
        keys_only: rng.random(),
        count_only: rng.random_range(0..4) == 0,
        min_mod_revision: if rng.random_range(0..4) == 0 {
            int(rng, t.rev)
        } else {
            0
        },
        max_mod_revision: if rng.random_range(0..4) == 0 {
            int(rng, t.rev)
        } else {
            0
        },
        min_create_revision: if rng.random_range(0..4) == 0 {
            int(rng, t.rev)
        } else {
            0
        },
        max_create_revision: if rng.random_range(0..4) == 0 {
            int(rng, t.rev)
        } else {
            0
        },
    }
}

fn delete(rng: &mut StdRng) -> DeleteRangeRequest {
    let key = bytes(rng);
    DeleteRangeRequest {
        range_end: range_end(rng, &key),
        key,
        prev_kv: rng.random(),
    }
}

fn txn(rng: &mut StdRng, t: &Target, depth: u32) -> TxnRequest {
    let cmp = (0..rng.random_range(0..4))
        .map(|_| {
            let key = bytes(rng);
            Compare {
                result: enum_val(rng, 4),
                target: enum_val(rng, 5),
                range_end: if rng.random_range(0..4) == 0 {
                    range_end(rng, &key)
                } else {
                    Vec::new()
                },
                key,
                target_union: match rng.random_range(0..6) {
                    0 => Some(compare::TargetUnion::Version(int(rng, 5))),
                    1 => Some(compare::TargetUnion::CreateRevision(int(rng, t.rev))),
                    2 => Some(compare::TargetUnion::ModRevision(int(rng, t.rev))),
                    3 => Some(compare::TargetUnion::Value(bytes(rng))),
                    4 => Some(compare::TargetUnion::Lease(lease_id(rng, t))),
                    _ => None,
                },
            }
        })
        .collect();
    let ops = |rng: &mut StdRng| -> Vec<RequestOp> {
        let n = if depth == 0 && rng.random_range(0..15) == 0 {
            200
        } else {
            rng.random_range(0..4)
        };
        (0..n)
            .map(|_| RequestOp {
                request: match rng.random_range(0..5) {
                    0 => Some(request_op::Request::RequestRange(range(rng, t))),
                    1 => Some(request_op::Request::RequestDeleteRange(delete(rng))),
                    2 if depth < 4 => Some(request_op::Request::RequestTxn(txn(rng, t, depth + 1))),
                    3 if rng.random_range(0..10) == 0 => None,
                    _ => Some(request_op::Request::RequestPut(put(rng, t, false))),
                },
            })
            .collect()
    };
    TxnRequest {
        compare: cmp,
        success: ops(rng),
        failure: ops(rng),
    }
}

fn watch_req(rng: &mut StdRng, t: &Target) -> WatchRequest {
    let u = match rng.random_range(0..5) {
        0 => Some(watch_request::RequestUnion::CancelRequest(
            WatchCancelRequest {
                watch_id: int(rng, 3),
            },
        )),
        1 => Some(watch_request::RequestUnion::ProgressRequest(
            WatchProgressRequest {},
        )),
        2 if rng.random_range(0..5) == 0 => None,
        _ => {
            let key = bytes(rng);
            Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    range_end: range_end(rng, &key),
                    key,
                    start_revision: if rng.random() { 0 } else { int(rng, t.rev) },
                    progress_notify: rng.random(),
                    filters: (0..rng.random_range(0..3))
                        .map(|_| enum_val(rng, 2))
                        .collect(),
                    prev_kv: rng.random(),
                    watch_id: if rng.random() { 0 } else { int(rng, 3) },
                    fragment: rng.random(),
                },
            ))
        }
    };
    WatchRequest { request_union: u }
}

/// The answer recorded for a call not sent to the reference (see
/// [`crashes_etcd34`], the Alarm and RoleGrantPermission calls).
const SKIPPED: &str = "not sent (crashes etcd 3.4)";

/// etcd 3.4.23 dies (nil sorter, SIGSEGV in `applierV3backend.Range`) on a
/// Range, unary or inside a Txn, whose sort target is not one of the five
/// while its order sorts (NONE becomes ASCEND for a target other than
/// KEY): it checks the sort order of a unary Range, never the target.
fn range_crashes_etcd34(r: &RangeRequest) -> bool {
    !(0..5).contains(&r.sort_target) && (0..3).contains(&r.sort_order)
}

/// A Txn with a Range of [`range_crashes_etcd34`] in it, at any depth; or
/// with a Put of `ignore_value`/`ignore_lease` in a nested Txn: etcd 3.4.23
/// checks those keys exist for the outer Txn's puts only, and a nested one
/// on a missing key panics every member in the apply ("unexpected error
/// during txn: etcdserver: key not found").
fn crashes_etcd34(t: &TxnRequest) -> bool {
    crashes_etcd34_at(t, 0)
}

fn crashes_etcd34_at(t: &TxnRequest, depth: u32) -> bool {
    t.success
        .iter()
        .chain(&t.failure)
        .any(|op| match &op.request {
            Some(request_op::Request::RequestRange(r)) => range_crashes_etcd34(r),
            Some(request_op::Request::RequestPut(p)) => {
                depth > 0 && (p.ignore_value || p.ignore_lease)
            }
            Some(request_op::Request::RequestTxn(t)) => crashes_etcd34_at(t, depth + 1),
            _ => false,
        })
}

/// Generates one call from `rng` and sends it to a random member; the
/// call's name and answer.
async fn step(rng: &mut StdRng, t: &mut Target) -> (String, String) {
    let ch = t.chans[rng.random_range(0..t.chans.len())].clone();
    let (mut kv, mut lease, mut cl, mut mt, mut au) = (
        KvClient::new(ch.clone()).max_decoding_message_size(64 << 20),
        LeaseClient::new(ch.clone()),
        ClusterClient::new(ch.clone()),
        MaintenanceClient::new(ch.clone()).max_decoding_message_size(64 << 20),
        AuthClient::new(ch.clone()),
    );
    match rng.random_range(0..100) {
        0..=14 => {
            let r = to(kv.put(put(rng, t, true))).await;
            if let Ok(Ok(ref p)) = r {
                t.rev = t
                    .rev
                    .max(p.get_ref().header.as_ref().map_or(0, |h| h.revision));
            }
            ("Put".into(), code(r))
        }
        15..=29 => {
            let req = range(rng, t);
            if t.etcd34 && range_crashes_etcd34(&req) {
                return ("Range".into(), SKIPPED.into());
            }
            ("Range".into(), code(to(kv.range(req)).await))
        }
        30..=35 => (
            "DeleteRange".into(),
            code(to(kv.delete_range(delete(rng))).await),
        ),
        36..=45 => {
            let req = txn(rng, t, 0);
            if t.etcd34 && crashes_etcd34(&req) {
                return ("Txn".into(), SKIPPED.into());
            }
            ("Txn".into(), code(to(kv.txn(req)).await))
        }
        46..=47 => {
            let req = CompactionRequest {
                revision: int(rng, t.rev),
                physical: rng.random(),
            };
            ("Compact".into(), code(to(kv.compact(req)).await))
        }
        48..=53 => {
            let ttl = match rng.random_range(0..4) {
                0 => int(rng, 10),
                _ => rng.random_range(30..300),
            };
            let id = if rng.random() { 0 } else { int(rng, 1 << 40) };
            let r = to(lease.lease_grant(LeaseGrantRequest { ttl, id })).await;
            if let Ok(Ok(ref g)) = r {
                t.leases.push(g.get_ref().id);
            }
            ("LeaseGrant".into(), code(r))
        }
        54..=55 => {
            let id = lease_id(rng, t);
            (
                "LeaseRevoke".into(),
                code(to(lease.lease_revoke(LeaseRevokeRequest { id })).await),
            )
        }
        56..=57 => {
            let req = LeaseTimeToLiveRequest {
                id: lease_id(rng, t),
                keys: rng.random(),
            };
            (
                "LeaseTimeToLive".into(),
                code(to(lease.lease_time_to_live(req)).await),
            )
        }
        58 => (
            "LeaseLeases".into(),
            code(to(lease.lease_leases(LeaseLeasesRequest {})).await),
        ),
        59..=60 => {
            let id = lease_id(rng, t);
            let r = to(async {
                let mut s = lease
                    .lease_keep_alive(tokio_stream::iter(vec![LeaseKeepAliveRequest { id }]))
                    .await?
                    .into_inner();
                s.message().await
            })
            .await;
            ("LeaseKeepAlive".into(), code(r))
        }
        61..=66 => {
            let reqs: Vec<WatchRequest> = (0..rng.random_range(1..4))
                .map(|_| watch_req(rng, t))
                .collect();
            let mut w = WatchClient::new(ch.clone());
            let r = tokio::time::timeout(CALL, async {
                let mut s = w.watch(tokio_stream::iter(reqs)).await?.into_inner();
                // Read what arrives within a moment: an error ends the
                // stream with a status; silence is fine.
                loop {
                    match tokio::time::timeout(Duration::from_millis(150), s.message()).await {
                        Ok(Ok(Some(_))) => continue,
                        Ok(Ok(None)) | Err(_) => return Ok(()),
                        Ok(Err(e)) => return Err(e),
                    }
                }
            })
            .await;
            ("Watch".into(), code(r))
        }
        67..=68 => {
            let req = MemberAddRequest {
                peer_ur_ls: urls(rng),
                is_learner: rng.random(),
            };
            let r = to(cl.member_add(req)).await;
            if let Ok(Ok(ref a)) = r {
                // A member that will never start: removed at once so the
                // cluster keeps its quorum.
                if let Some(m) = &a.get_ref().member {
                    let _ = to(cl.member_remove(MemberRemoveRequest { id: m.id })).await;
                }
            }
            ("MemberAdd".into(), code(r))
        }
        69 => {
            let id = unknown_member(rng);
            (
                "MemberRemove".into(),
                code(to(cl.member_remove(MemberRemoveRequest { id })).await),
            )
        }
        70 => {
            let req = MemberUpdateRequest {
                id: unknown_member(rng),
                peer_ur_ls: urls(rng),
            };
            ("MemberUpdate".into(), code(to(cl.member_update(req)).await))
        }
        71 => {
            let id = unknown_member(rng);
            (
                "MemberPromote".into(),
                code(to(cl.member_promote(MemberPromoteRequest { id })).await),
            )
        }
        72 => {
            let req = MemberListRequest {
                linearizable: rng.random(),
            };
            ("MemberList".into(), code(to(cl.member_list(req)).await))
        }
        73..=74 => {
            let member_id = match rng.random_range(0..3) {
                0 => 0,
                1 => t.members[rng.random_range(0..t.members.len())],
                _ => rng.random(),
            };
            let req = AlarmRequest {
                action: enum_val(rng, 3),
                member_id,
                alarm: enum_val(rng, 3),
            };
            // etcd 3.4.23 answers an action that is not GET, ACTIVATE or
            // DEACTIVATE with a nil response and dies marshalling it. An
            // alarm raised for a member that does not exist is raised by
            // every etcd and retcd (a CORRUPT one then fails every later
            // write with DataLoss, and the rest of the run would only show
            // that): not sent.
            let phantom = req.action == 1 && !t.members.contains(&req.member_id);
            if (t.etcd34 && !(0..3).contains(&req.action)) || phantom {
                return ("Alarm".into(), SKIPPED.into());
            }
            ("Alarm".into(), code(to(mt.alarm(req)).await))
        }
        75 => ("Status".into(), code(to(mt.status(StatusRequest {})).await)),
        76 => {
            let revision = int(rng, t.rev);
            (
                "HashKV".into(),
                code(to(mt.hash_kv(HashKvRequest { revision })).await),
            )
        }
        77 => ("Hash".into(), code(to(mt.hash(HashRequest {})).await)),
        78 if rng.random_range(0..4) == 0 => (
            "Defragment".into(),
            code(to(mt.defragment(DefragmentRequest {})).await),
        ),
        79 => {
            let target_id = match rng.random_range(0..3) {
                0 => t.members[rng.random_range(0..t.members.len())],
                1 => 0,
                _ => rng.random(),
            };
            (
                "MoveLeader".into(),
                code(to(mt.move_leader(MoveLeaderRequest { target_id })).await),
            )
        }
        80 if rng.random_range(0..4) == 0 => {
            let r = to(async {
                let mut s = mt.snapshot(SnapshotRequest {}).await?.into_inner();
                while s.message().await?.is_some() {}
                Ok(())
            })
            .await;
            ("Snapshot".into(), code(r))
        }
        81..=83 => {
            let req = AuthUserAddRequest {
                name: name(rng),
                password: name(rng),
                options: rng.random_range(0..3).eq(&0).then(|| UserAddOptions {
                    no_password: rng.random(),
                }),
                hashed_password: String::new(),
            };
            ("UserAdd".into(), code(to(au.user_add(req)).await))
        }
        84 => {
            let req = AuthUserGetRequest { name: name(rng) };
            ("UserGet".into(), code(to(au.user_get(req)).await))
        }
        85 => {
            let req = AuthUserDeleteRequest { name: name(rng) };
            ("UserDelete".into(), code(to(au.user_delete(req)).await))
        }
        86 => {
            let req = AuthUserChangePasswordRequest {
                name: name(rng),
                password: name(rng),
                hashed_password: String::new(),
            };
            (
                "UserChangePassword".into(),
                code(to(au.user_change_password(req)).await),
            )
        }
        87 => {
            let req = AuthUserGrantRoleRequest {
                user: name(rng),
                role: name(rng),
            };
            (
                "UserGrantRole".into(),
                code(to(au.user_grant_role(req)).await),
            )
        }
        88 => {
            let req = AuthUserRevokeRoleRequest {
                name: name(rng),
                role: name(rng),
            };
            (
                "UserRevokeRole".into(),
                code(to(au.user_revoke_role(req)).await),
            )
        }
        89 => {
            let req = AuthRoleAddRequest { name: name(rng) };
            ("RoleAdd".into(), code(to(au.role_add(req)).await))
        }
        90 => {
            let key = bytes(rng);
            let req = AuthRoleGrantPermissionRequest {
                name: name(rng),
                perm: rng.random_range(0..5).ne(&0).then(|| Permission {
                    perm_type: enum_val(rng, 3),
                    range_end: range_end(rng, &key),
                    key,
                }),
            };
            // etcd 3.4.23 applies a grant without a permission to an
            // existing role by dereferencing nil: every member dies (newer
            // etcd: InvalidArgument "permission not given").
            if t.etcd34 && req.perm.is_none() {
                return ("RoleGrantPermission".into(), SKIPPED.into());
            }
            (
                "RoleGrantPermission".into(),
                code(to(au.role_grant_permission(req)).await),
            )
        }
        91 => {
            let key = bytes(rng);
            let req = AuthRoleRevokePermissionRequest {
                role: name(rng),
                range_end: range_end(rng, &key),
                key,
            };
            (
                "RoleRevokePermission".into(),
                code(to(au.role_revoke_permission(req)).await),
            )
        }
        92 => {
            let (a, b) = (
                AuthRoleGetRequest { role: name(rng) },
                AuthRoleDeleteRequest { role: name(rng) },
            );
            if rng.random() {
                ("RoleGet".into(), code(to(au.role_get(a)).await))
            } else {
                ("RoleDelete".into(), code(to(au.role_delete(b)).await))
            }
        }
        93 => match rng.random_range(0..4) {
            0 => (
                "UserList".into(),
                code(to(au.user_list(AuthUserListRequest {})).await),
            ),
            1 => (
                "RoleList".into(),
                code(to(au.role_list(AuthRoleListRequest {})).await),
            ),
            2 => (
                "AuthStatus".into(),
                code(to(au.auth_status(AuthStatusRequest {})).await),
            ),
            _ => {
                let req = AuthenticateRequest {
                    name: name(rng),
                    password: name(rng),
                };
                ("Authenticate".into(), code(to(au.authenticate(req)).await))
            }
        },
        94..=95 => {
            let mut lk = LockClient::new(ch.clone());
            if rng.random() {
                let req = LockRequest {
                    name: bytes(rng),
                    lease: lease_id(rng, t),
                };
                ("Lock".into(), code(to(lk.lock(req)).await))
            } else {
                let req = UnlockRequest { key: bytes(rng) };
                ("Unlock".into(), code(to(lk.unlock(req)).await))
            }
        }
        _ => {
            let mut el = ElectionClient::new(ch.clone());
            let leader = LeaderKey {
                name: bytes(rng),
                key: bytes(rng),
                rev: int(rng, t.rev),
                lease: lease_id(rng, t),
            };
            match rng.random_range(0..4) {
                0 => {
                    let req = CampaignRequest {
                        name: format!("fz-el-{}", rng.random::<u32>()).into_bytes(),
                        lease: lease_id(rng, t),
                        value: bytes(rng),
                    };
                    ("Campaign".into(), code(to(el.campaign(req)).await))
                }
                1 => {
                    let req = LeaderRequest { name: bytes(rng) };
                    ("Leader".into(), code(to(el.leader(req)).await))
                }
                2 => {
                    let req = ProclaimRequest {
                        leader: Some(leader),
                        value: bytes(rng),
                    };
                    ("Proclaim".into(), code(to(el.proclaim(req)).await))
                }
                _ => {
                    let req = ResignRequest {
                        leader: Some(leader),
                    };
                    ("Resign".into(), code(to(el.resign(req)).await))
                }
            }
        }
    }
}

/// One run of `steps` calls from `seed` against a fresh 3-member cluster
/// of `flavor`: every call's (name, answer), and what was wrong with the
/// cluster afterwards.
async fn run(flavor: Flavor, seed: u64, steps: u64) -> (Vec<(String, String)>, Vec<String>) {
    let mut c = Cluster::start(flavor, 3, &["--bcrypt-cost", "4"])
        .await
        .expect("start the cluster");
    let mut chans = Vec::new();
    for ep in c.endpoints() {
        chans.push(
            Channel::from_shared(ep)
                .expect("url")
                .connect()
                .await
                .expect("connect"),
        );
    }
    let ml = ClusterClient::new(chans[0].clone())
        .member_list(MemberListRequest::default())
        .await
        .expect("member list");
    let members = ml.get_ref().members.iter().map(|m| m.id).collect();
    let mut t = Target {
        etcd34: flavor == Flavor::Etcd,
        chans,
        leases: Vec::new(),
        members,
        rev: 1,
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut answers = Vec::new();
    let trace = std::env::var_os("RETCD_RPC_FUZZ_TRACE").is_some();
    for n in 0..steps {
        let started = std::time::Instant::now();
        let a = step(&mut rng, &mut t).await;
        if trace {
            eprintln!(
                "rpc_fuzz: {} step {n}: {} -> {} ({:?})",
                flavor.name(),
                a.0,
                a.1,
                started.elapsed()
            );
        }
        answers.push(a);
    }
    let mut problems = Vec::new();
    for (i, m) in c.members.iter_mut().enumerate() {
        if !m.is_running() {
            let log = m.log();
            let at = log.find("panic").unwrap_or(log.len().saturating_sub(3000));
            problems.push(format!(
                "m{i} died:\n{}",
                &log[at..(at + 1500).min(log.len())]
            ));
        }
    }
    if problems.is_empty() {
        problems.extend(settle_and_compare(&t).await.err());
    }
    if !problems.is_empty() {
        eprintln!("{}", c.log_tails(2000));
    }
    (answers, problems)
}

/// Disarms every alarm the run raised, writes one key, and compares the
/// members' HashKV at the revision they all reach.
async fn settle_and_compare(t: &Target) -> Result<(), String> {
    let mut mt = MaintenanceClient::new(t.chans[0].clone());
    let alarms = mt
        .alarm(AlarmRequest::default())
        .await
        .map_err(|e| format!("alarm list: {e}"))?;
    for a in &alarms.get_ref().alarms {
        let req = AlarmRequest {
            action: 2,
            member_id: a.member_id,
            alarm: a.alarm,
        };
        mt.alarm(req).await.map_err(|e| format!("disarm: {e}"))?;
    }
    let put = KvClient::new(t.chans[0].clone())
        .put(PutRequest {
            key: b"fz-final".to_vec(),
            value: b"1".to_vec(),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("the final put failed: {e}"))?;
    let rev = put.get_ref().header.as_ref().map_or(0, |h| h.revision);
    let mut last = String::new();
    for _ in 0..150 {
        let mut hashes = Vec::new();
        for ch in &t.chans {
            let mut m = MaintenanceClient::new(ch.clone());
            let r = tokio::time::timeout(CALL, m.hash_kv(HashKvRequest { revision: rev })).await;
            hashes.push(match r {
                Ok(Ok(h)) => Ok((h.get_ref().hash, h.get_ref().compact_revision)),
                Ok(Err(e)) => Err(format!("{:?} {}", e.code(), e.message())),
                Err(_) => Err("timeout".into()),
            });
        }
        if hashes.iter().all(|h| h.is_ok()) && hashes.windows(2).all(|w| w[0] == w[1]) {
            return Ok(());
        }
        last = format!("{hashes:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!(
        "HashKV at revision {rev} differs between members: {last}"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rpc_fuzz_three_members() {
    bounded(LIMIT, async {
        let seed = env_u64("RETCD_RPC_FUZZ_SEED", 1);
        let steps = env_u64("RETCD_RPC_FUZZ_STEPS", 400);
        let (reference, ref_problems) = run(Flavor::Etcd, seed, steps).await;
        // etcd 3.4.23's own failures (it has bugs this finds: see
        // docs/robustness.md) are reported, not held against the target;
        // after them its answers are Unavailable or timeouts, which only
        // make the target's Internal/Unknown check stricter.
        for p in &ref_problems {
            eprintln!("rpc_fuzz: the reference etcd 3.4.23 itself: {p}");
        }
        let flavor = test_flavor();
        let (target, mut problems) = run(flavor, seed, steps).await;
        let mut diffs: BTreeMap<(String, String, String), Vec<usize>> = BTreeMap::new();
        for (n, (r, t)) in reference.iter().zip(&target).enumerate() {
            let (rc, tc) = (code_of(&r.1), code_of(&t.1));
            if r.1 == SKIPPED && (tc == "Internal" || tc == "Unknown") {
                problems.push(format!(
                    "step {n} {}: {} answered {} (etcd 3.4 crashes there)",
                    t.0,
                    flavor.name(),
                    t.1
                ));
            }
            if rc != tc {
                diffs
                    .entry((t.0.clone(), r.1.clone(), t.1.clone()))
                    .or_default()
                    .push(n);
                if (tc == "Internal" || tc == "Unknown")
                    && r.0 == t.0
                    && !etcd_answers_unknown_too(&t.0, &t.1)
                {
                    problems.push(format!(
                        "step {n} {}: {} answered {} where etcd answered {}",
                        t.0,
                        flavor.name(),
                        t.1,
                        r.1
                    ));
                }
            }
        }
        let mut tally: BTreeMap<&str, usize> = BTreeMap::new();
        for (name, _) in &target {
            *tally.entry(name).or_default() += 1;
        }
        eprintln!("rpc_fuzz: seed {seed}, {steps} calls: {tally:?}");
        for ((name, r, t), at) in &diffs {
            eprintln!(
                "rpc_fuzz: {name}: etcd {r}, {} {t}: {} times (steps {:?})",
                flavor.name(),
                at.len(),
                &at[..at.len().min(8)]
            );
        }
        assert!(
            problems.is_empty(),
            "rpc fuzz (seed {seed}, replay with RETCD_RPC_FUZZ_SEED={seed}): {} problem(s):\n{}",
            problems.len(),
            problems.join("\n")
        );
    })
    .await;
}
