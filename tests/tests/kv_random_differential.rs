//! A seeded random *content* differential test of the KV API: the same
//! sequence of single-client, sequential requests (Put, Range, DeleteRange,
//! Txn with every compare target and result and nested Txns, Compact,
//! LeaseGrant, LeaseRevoke) is sent to a fresh real etcd 3.4.23 (the
//! reference) and a fresh target (retcd by default; `RETCD_TEST_FLAVOR=etcd`
//! makes it a second etcd, which checks the normalisation), both empty and
//! started with the same flags, of 1 member (`kv_random_differential`, by
//! default) or 3 (`kv_random_differential_3_members`, see below).
//!
//! Unlike `rpc_fuzz` (status codes only), the whole answer is compared:
//! both fail with the same gRPC code and message, or both succeed with
//! equal responses after [`normalise`] — which clears only the header's
//! cluster ID, member ID and raft term and replaces the lease IDs the
//! servers chose by their grant order (requests name a granted lease by
//! its grant order too; the test also grants leases with IDs of its own,
//! which both servers must answer as they are). Revisions are compared
//! exactly: both stores start empty and get the same writes.
//!
//! The keys come from a small space (`a`, `a/b`, `ab`, `c\0`, `\0`, `\xff`,
//! …) and ranges end at none, a prefix end, `\0` (from the key), another
//! key of the space (possibly below it) or the key itself, so ranges
//! overlap. Requests etcd 3.4.23 is known to die on are not generated (a
//! sort target outside the enum; `ignore_value`/`ignore_lease` in a nested
//! Txn: see docs/robustness.md, RPC fuzzer; the same flags on a Txn's Put
//! after a delete that may remove its key: see [`no_etcd_crash`]), and
//! leases have a TTL of an hour so none expires during a run. A member out
//! of reach (it died, or a call timed out) stops the run, which then fails
//! with the members' log tails.
//!
//! **3 members** (`RETCD_KV_DIFF_MEMBERS=3`, or the second test function,
//! which always runs 3 members, 1000 steps by default): each side is a
//! 3-member cluster, the test holds a connection to every member, and each
//! step goes to a member drawn by a second rng seeded from the seed (the
//! same member index on both sides; the requests are drawn as in the
//! 1-member mode), so followers forward writes, lease grants and revokes
//! and compactions to the leader, answer linearizable reads through
//! ReadIndex and raise errors themselves. The client is sequential, so
//! every answer is the same whichever member gives it, except:
//!
//! - a member answering from its own state without a linearizable read
//!   ([`served_locally`], as etcd: a serializable Range, or a Txn whose
//!   ops are all serializable Ranges, or none) may not have applied the
//!   last write or compaction yet (the member asked waits for its own
//!   apply, the others do not). Before such a step the test makes that
//!   member catch up with a linearizable count-only Range of every key on
//!   it, whose answers are compared too: after its ReadIndex the member
//!   has applied everything committed before, a compaction too (which
//!   moves no revision: waiting for a revision would miss it). Stale reads
//!   are thus not compared, but a server that keeps serving stale state is
//!   still seen: the serializable read must show what the catch-up read
//!   saw.
//! - IDs the server chooses for leases: an etcd member makes them from its
//!   member ID and a counter, so IDs granted through different members
//!   compare (a Txn's GREATER or LESS compare of a key's lease) in an
//!   order that differs from cluster to cluster. Such grants go through
//!   member 0 (a follower or the leader, as the election fell), where they
//!   grow in grant order, as in the 1-member mode.
//! - In a writing Txn, a Range directly in a branch reads only at a
//!   revision readable then ([`Gen::consistent_in_cluster`]): etcd's
//!   members diverge otherwise.
//!
//! A cluster run adds [`cluster_prelude`] to the fixed steps, and after
//! the last step compares every member's keys (a linearizable Range of
//! every key on each). One more check, in both modes and on both sides:
//! the top header's member ID is the ID of the member asked (from
//! MemberList, matched by client URL) and its cluster ID the cluster's;
//! those are listed apart from the differences. The raft terms seen are
//! printed (a new election can make a step fail on one side only).
//!
//! `RETCD_KV_DIFF_SEED` (default 1), `RETCD_KV_DIFF_STEPS` (default 600;
//! 1000 for the 3-member test) and `RETCD_KV_DIFF_MEMBERS` (default 1)
//! replay and size a run; `RETCD_KV_DIFF_TRACE=1` prints every step, the
//! member asked and both answers.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use retcd_api::etcdserverpb::{
    cluster_client::ClusterClient, compare, kv_client::KvClient, lease_client::LeaseClient,
    maintenance_client::MaintenanceClient, request_op, CompactionRequest, CompactionResponse,
    Compare, DeleteRangeRequest, DeleteRangeResponse, LeaseGrantRequest, LeaseGrantResponse,
    LeaseRevokeRequest, LeaseRevokeResponse, MemberListRequest, PutRequest, PutResponse,
    RangeRequest, RangeResponse, RequestOp, ResponseHeader, StatusRequest, TxnRequest, TxnResponse,
};
use retcd_api::mvccpb::KeyValue;
use retcd_tests::random_diff::{
    answer, bytes_as_strings, clear_header, env_u64, normalise_txn, placeholder_names, prefix_end,
    range_end, recent_rev, Dice,
};
use retcd_tests::{bounded, limit::NORMAL as LIMIT, test_flavor, Cluster, Flavor, FAST};
use tokio::time::timeout;
use tonic::transport::Channel;

/// Each call's bound.
const CALL: Duration = Duration::from_secs(10);

/// The message of a call past [`CALL`] (see [`answer`]).
const TIMED_OUT: &str = "(test: call timed out)";

/// Differing steps printed at most (the count is always given).
const MAX_SHOWN: usize = 20;

/// The key space: 12 keys whose prefixes and ranges overlap.
const KEYS: [&[u8]; 12] = [
    b"a", b"a/b", b"a/c", b"ab", b"b", b"ba", b"c", b"c\x00", b"d", b"\x00", b"\xff", b"z",
];

/// Values, few so that VALUE compares are often equal.
const VALUES: [&[u8]; 6] = [b"", b"0", b"1", b"v", b"vv", b"\xff\x00"];

/// Lease IDs the test grants explicitly (both servers accept them).
const EXPLICIT_LEASES: [i64; 4] = [0x1001, 0x1002, 0x1003, 0x1004];

/// A lease ID never granted.
const UNKNOWN_LEASE: i64 = 0x0bad;

/// The placeholder of the `i`-th lease granted (in grant order): what the
/// generated requests carry, what [`materialise`] replaces by each server's
/// own ID, and what [`normalise`] puts in place of a server's ID.
const LEASE_BASE: i64 = 0x4c45_4153_0000_0000;

/// One request of the sequence.
#[derive(Debug, Clone)]
enum Req {
    Put(PutRequest),
    Range(RangeRequest),
    Delete(DeleteRangeRequest),
    Txn(TxnRequest),
    Compact(CompactionRequest),
    Grant(LeaseGrantRequest),
    Revoke(LeaseRevokeRequest),
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq)]
enum Resp {
    Put(PutResponse),
    Range(RangeResponse),
    Delete(DeleteRangeResponse),
    Txn(TxnResponse),
    Compact(CompactionResponse),
    Grant(LeaseGrantResponse),
    Revoke(LeaseRevokeResponse),
}

/// An answer: the response, or the gRPC code and message.
type Answer = Result<Resp, (tonic::Code, String)>;

/// The only normalisation: every header (the top one and those of a Txn's
/// op responses, at any depth) loses its cluster ID, member ID and raft
/// term; every lease ID the server chose itself (`leases`: every grant's
/// ID and whether the server chose it, in grant order) becomes its
/// placeholder `LEASE_BASE + i`. IDs the test asked for stay as they are,
/// so the servers must grant exactly those.
fn normalise(a: &mut Answer, leases: &[(i64, bool)]) {
    let header = clear_header;
    let lease = |id: &mut i64| {
        // The latest grant of an ID: an ID may be granted again after a
        // revoke.
        if let Some(i) = leases.iter().rposition(|(l, _)| l == id) {
            if leases[i].1 {
                *id = LEASE_BASE + i as i64;
            }
        }
    };
    let kv = |k: &mut KeyValue| lease(&mut k.lease);
    let Ok(r) = a else { return };
    match r {
        Resp::Put(r) => {
            header(&mut r.header);
            r.prev_kv.iter_mut().for_each(kv);
        }
        Resp::Range(r) => {
            header(&mut r.header);
            r.kvs.iter_mut().for_each(kv);
        }
        Resp::Delete(r) => {
            header(&mut r.header);
            r.prev_kvs.iter_mut().for_each(kv);
        }
        Resp::Txn(t) => normalise_txn(t, &kv),
        Resp::Compact(r) => header(&mut r.header),
        Resp::Grant(r) => {
            header(&mut r.header);
            lease(&mut r.id);
        }
        Resp::Revoke(r) => header(&mut r.header),
    }
}

/// `req` with every lease placeholder replaced by the server's own ID of
/// that grant (`leases`, in grant order); a placeholder the server has no
/// grant for (it refused one the reference accepted) stays as it is.
fn materialise(req: &Req, leases: &[(i64, bool)]) -> Req {
    let lease = |id: &mut i64| {
        let i = id.wrapping_sub(LEASE_BASE);
        if (0..leases.len() as i64).contains(&i) {
            *id = leases[i as usize].0;
        }
    };
    fn txn(t: &mut TxnRequest, lease: &dyn Fn(&mut i64)) {
        for c in &mut t.compare {
            if let Some(compare::TargetUnion::Lease(l)) = &mut c.target_union {
                lease(l);
            }
        }
        for op in t.success.iter_mut().chain(t.failure.iter_mut()) {
            match &mut op.request {
                Some(request_op::Request::RequestPut(p)) => lease(&mut p.lease),
                Some(request_op::Request::RequestTxn(t)) => txn(t, lease),
                _ => {}
            }
        }
    }
    let mut req = req.clone();
    match &mut req {
        Req::Put(p) => lease(&mut p.lease),
        Req::Txn(t) => txn(t, &lease),
        Req::Revoke(r) => lease(&mut r.id),
        Req::Range(_) | Req::Delete(_) | Req::Compact(_) | Req::Grant(_) => {}
    }
    req
}

/// Whether `a` says the member asked is out of reach: the call timed out,
/// or failed in the transport (no gRPC status from the server: a member
/// that died).
fn out_of_reach(a: &Answer) -> bool {
    match a {
        Err((tonic::Code::DeadlineExceeded, m)) => m == TIMED_OUT,
        Err((tonic::Code::Unavailable, m)) => !m.starts_with("etcdserver"),
        Err((tonic::Code::Unknown, m)) => m == "transport error",
        _ => false,
    }
}

/// Whether a member answers `req` from its own state, without a
/// linearizable read first — as etcd 3.4.23 does (`Range` and `Txn`,
/// `isTxnReadonly` and `isTxnSerializable` in etcdserver/v3_server.go): a
/// serializable Range, or a Txn whose ops in both branches are all
/// serializable Ranges (a Txn with no op at all too).
fn served_locally(req: &Req) -> bool {
    let serializable = |ops: &[RequestOp]| {
        ops.iter().all(|op| {
            matches!(&op.request, Some(request_op::Request::RequestRange(r)) if r.serializable)
        })
    };
    match req {
        Req::Range(r) => r.serializable,
        Req::Txn(t) => serializable(&t.success) && serializable(&t.failure),
        _ => false,
    }
}

/// `req` with no Put that etcd dies on at the top of a Txn's branch
/// (see [`retcd_tests::random_diff::no_etcd_crash`]). Returns whether it
/// changed anything.
fn no_etcd_crash(req: &mut Req) -> bool {
    let Req::Txn(t) = req else { return false };
    let success = retcd_tests::random_diff::no_etcd_crash(&mut t.success);
    retcd_tests::random_diff::no_etcd_crash(&mut t.failure) || success
}

/// The linearizable read that makes a member catch up before a step it
/// serves from its own state: a count of every key.
fn catch_up_read() -> Req {
    Req::Range(RangeRequest {
        key: vec![0],
        range_end: vec![0],
        count_only: true,
        ..Default::default()
    })
}

/// The top header of a response.
fn header_of(r: &Resp) -> Option<&ResponseHeader> {
    match r {
        Resp::Put(r) => r.header.as_ref(),
        Resp::Range(r) => r.header.as_ref(),
        Resp::Delete(r) => r.header.as_ref(),
        Resp::Txn(r) => r.header.as_ref(),
        Resp::Compact(r) => r.header.as_ref(),
        Resp::Grant(r) => r.header.as_ref(),
        Resp::Revoke(r) => r.header.as_ref(),
    }
}

/// One server (a cluster): a channel to each member, each member's ID, the
/// cluster's ID, the member that led at the start, the raft terms its
/// answers carried, and the IDs of the leases it granted, in order, each
/// with whether the server chose it (a grant with ID 0).
struct Server {
    chans: Vec<Channel>,
    ids: Vec<u64>,
    cluster_id: u64,
    leader: usize,
    terms: BTreeSet<u64>,
    leases: Vec<(i64, bool)>,
}

impl Server {
    /// Connects to every member of `c`; learns the member IDs from
    /// MemberList (matched to the members by client URL) and the leader
    /// from Status.
    async fn connect(c: &Cluster) -> Server {
        let mut chans = Vec::new();
        for m in &c.members {
            let endpoint = Channel::from_shared(m.endpoint()).expect("url");
            let chan = (timeout(CALL, endpoint.connect()).await)
                .expect("connect in time")
                .expect("connect");
            chans.push(chan);
        }
        let mut cl = ClusterClient::new(chans[0].clone());
        let list = timeout(CALL, cl.member_list(MemberListRequest::default()))
            .await
            .expect("MemberList in time")
            .expect("MemberList")
            .into_inner();
        let ids: Vec<u64> = (c.members.iter())
            .map(|m| {
                let listed = list
                    .members
                    .iter()
                    .find(|l| l.client_ur_ls.contains(&m.endpoint()));
                listed
                    .unwrap_or_else(|| panic!("{} not in {list:?}", m.endpoint()))
                    .id
            })
            .collect();
        let mut mt = MaintenanceClient::new(chans[0].clone());
        let status = timeout(CALL, mt.status(StatusRequest {}))
            .await
            .expect("Status in time")
            .expect("Status")
            .into_inner();
        let leader = (ids.iter().position(|&id| id == status.leader))
            .unwrap_or_else(|| panic!("leader {:#x} is none of {ids:x?}", status.leader));
        Server {
            chans,
            ids,
            cluster_id: list.header.map_or(0, |h| h.cluster_id),
            leader,
            terms: BTreeSet::new(),
            leases: Vec::new(),
        }
    }

    /// Sends `req` (materialised for this server) to member `member` and
    /// returns its answer, normalised, and what is wrong with the
    /// answer's member and cluster IDs, if anything; records a granted
    /// lease and the raft term.
    async fn call(&mut self, req: &Req, member: usize) -> (Answer, Option<String>) {
        let chan = &self.chans[member];
        let mut kv = KvClient::new(chan.clone());
        let mut ls = LeaseClient::new(chan.clone());
        let mut a = match materialise(req, &self.leases) {
            Req::Put(r) => answer(timeout(CALL, kv.put(r)).await, Resp::Put),
            Req::Range(r) => answer(timeout(CALL, kv.range(r)).await, Resp::Range),
            Req::Delete(r) => answer(timeout(CALL, kv.delete_range(r)).await, Resp::Delete),
            Req::Txn(r) => answer(timeout(CALL, kv.txn(r)).await, Resp::Txn),
            Req::Compact(r) => answer(timeout(CALL, kv.compact(r)).await, Resp::Compact),
            Req::Grant(r) => answer(timeout(CALL, ls.lease_grant(r)).await, Resp::Grant),
            Req::Revoke(r) => answer(timeout(CALL, ls.lease_revoke(r)).await, Resp::Revoke),
        };
        let wrong = match &a {
            Ok(r) => match header_of(r) {
                None => Some("no header".to_string()),
                Some(h) => {
                    self.terms.insert(h.raft_term);
                    let (id, cluster) = (self.ids[member], self.cluster_id);
                    (h.member_id != id || h.cluster_id != cluster).then(|| {
                        format!(
                            "header member_id {:#x}, cluster_id {:#x}; member {member} is {id:#x} \
                             of cluster {cluster:#x}",
                            h.member_id, h.cluster_id
                        )
                    })
                }
            },
            Err(_) => None,
        };
        if let (Ok(Resp::Grant(g)), Req::Grant(asked)) = (&a, req) {
            self.leases.push((g.id, asked.id == 0));
        }
        normalise(&mut a, &self.leases);
        (a, wrong)
    }
}

/// The request generator, and what it learns from the reference's answers
/// (the head and compact revisions, revisions worth comparing against, the
/// number of leases granted).
struct Gen {
    rng: StdRng,
    head: i64,
    compacted: i64,
    revs: Vec<i64>,
    grants: usize,
}

impl Dice for Gen {
    fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }
}

impl Gen {
    fn key(&mut self) -> Vec<u8> {
        if self.p(0.01) {
            Vec::new() // refused: "key is not provided"
        } else {
            self.pick(&KEYS).to_vec()
        }
    }

    fn value(&mut self) -> Vec<u8> {
        self.pick(&VALUES).to_vec()
    }

    fn range_end(&mut self, key: &[u8]) -> Vec<u8> {
        range_end(&mut self.rng, key, &KEYS)
    }

    /// A revision seen lately, or one near the head.
    fn rev(&mut self) -> i64 {
        recent_rev(&mut self.rng, self.head, &self.revs)
    }

    /// A lease to use: a granted one (maybe revoked since), none, or one
    /// never granted.
    fn lease(&mut self) -> i64 {
        match self.rng.random_range(0..10) {
            0..7 if self.grants > 0 => LEASE_BASE + self.rng.random_range(0..self.grants) as i64,
            0..8 => 0,
            8 => self.pick(&EXPLICIT_LEASES),
            _ => UNKNOWN_LEASE,
        }
    }

    /// A Put; `top` (not inside a nested Txn) allows `ignore_value` and
    /// `ignore_lease`, which etcd 3.4.23 dies on in a nested Txn when the
    /// key is missing.
    fn put(&mut self, top: bool) -> PutRequest {
        let ignore_value = top && self.p(0.1);
        let ignore_lease = top && self.p(0.1);
        PutRequest {
            key: self.key(),
            // Mostly none with ignore_value ("value is provided" otherwise).
            value: if ignore_value && !self.p(0.1) {
                Vec::new()
            } else {
                self.value()
            },
            lease: if self.p(if ignore_lease { 0.1 } else { 0.3 }) {
                self.lease()
            } else {
                0
            },
            prev_kv: self.p(0.5),
            ignore_value,
            ignore_lease,
        }
    }

    fn range(&mut self) -> RangeRequest {
        let key = self.key();
        let range_end = self.range_end(&key);
        let revision = match self.rng.random_range(0..100) {
            0..40 => 0,
            40..55 => self.head,
            55..75 => self.rev(),
            // compacted, or exactly the compact revision
            75..85 if self.compacted > 1 => self.rng.random_range(1..self.compacted),
            75..90 if self.compacted > 0 => self.compacted,
            75..95 => self.head + self.rng.random_range(1..4), // the future
            _ => -1,
        };
        let (sort_order, sort_target) = if self.p(0.5) {
            (self.rng.random_range(0..3), self.rng.random_range(0..5))
        } else {
            (0, 0)
        };
        let filter = |g: &mut Gen| if g.p(0.12) { g.rev() } else { 0 };
        RangeRequest {
            key,
            range_end,
            limit: match self.rng.random_range(0..10) {
                0..5 => 0,
                5 => -1,
                // around retcd's bound for answering a Range whole
                6 => self.pick(&[1000, 1001]),
                _ => self.rng.random_range(1..4),
            },
            revision,
            sort_order,
            sort_target,
            serializable: self.p(0.3),
            keys_only: self.p(0.2),
            count_only: self.p(0.1),
            min_mod_revision: filter(self),
            max_mod_revision: filter(self),
            min_create_revision: filter(self),
            max_create_revision: filter(self),
        }
    }

    fn delete(&mut self) -> DeleteRangeRequest {
        let key = self.key();
        DeleteRangeRequest {
            range_end: if self.p(0.5) {
                Vec::new()
            } else {
                self.range_end(&key)
            },
            key,
            prev_kv: self.p(0.5),
        }
    }

    fn compare(&mut self) -> Compare {
        let key = self.key();
        let range_end = if self.p(0.25) {
            self.range_end(&key)
        } else {
            Vec::new()
        };
        // Mostly valid enums; rarely one outside them.
        let target = if self.p(0.02) {
            self.pick(&[-1, 5, 9])
        } else {
            self.rng.random_range(0..5)
        };
        let result = if self.p(0.02) {
            self.pick(&[-1, 4, 7])
        } else {
            self.rng.random_range(0..4)
        };
        // Mostly the union of the target; sometimes another one, or none.
        let union_of = match self.rng.random_range(0..20) {
            0 => -1,
            1 => self.rng.random_range(0..5),
            _ => target,
        };
        let target_union = match union_of {
            0 => Some(compare::TargetUnion::Version(self.rng.random_range(0..4))),
            1 => Some(compare::TargetUnion::CreateRevision(self.rev())),
            2 => Some(compare::TargetUnion::ModRevision(self.rev())),
            3 => Some(compare::TargetUnion::Value(self.value())),
            4 => Some(compare::TargetUnion::Lease(self.lease())),
            _ => None,
        };
        Compare {
            result,
            target,
            key,
            range_end,
            target_union,
        }
    }

    fn txn(&mut self, depth: u32) -> TxnRequest {
        let compare = (0..self.rng.random_range(0..4))
            .map(|_| self.compare())
            .collect();
        let ops = |g: &mut Gen| -> Vec<RequestOp> {
            (0..g.rng.random_range(0..4))
                .map(|_| RequestOp {
                    request: Some(match g.rng.random_range(0..10) {
                        0..4 => request_op::Request::RequestPut(g.put(depth == 0)),
                        4..7 => request_op::Request::RequestRange(g.range()),
                        7..9 => request_op::Request::RequestDeleteRange(g.delete()),
                        _ if depth < 2 => request_op::Request::RequestTxn(g.txn(depth + 1)),
                        _ => request_op::Request::RequestRange(g.range()),
                    }),
                })
                .collect()
        };
        TxnRequest {
            compare,
            success: ops(self),
            failure: ops(self),
        }
    }

    fn compact(&mut self) -> CompactionRequest {
        let behind = (self.head - self.rng.random_range(0..8)).max(self.compacted + 1);
        let revision = match self.rng.random_range(0..10) {
            0..7 => behind,
            7 => self.head,
            8 => self.compacted - self.rng.random_range(0..2), // already compacted
            _ => self.head + 1,                                // the future
        };
        CompactionRequest {
            revision,
            physical: self.p(0.5),
        }
    }

    fn next(&mut self) -> Req {
        match self.rng.random_range(0..100) {
            0..25 => Req::Put(self.put(true)),
            25..50 => Req::Range(self.range()),
            50..60 => Req::Delete(self.delete()),
            60..85 => Req::Txn(self.txn(0)),
            85..88 => Req::Compact(self.compact()),
            88..95 => Req::Grant(LeaseGrantRequest {
                ttl: if self.p(0.05) { 9_000_000_001 } else { 3600 },
                id: if self.p(0.5) {
                    0
                } else {
                    self.pick(&EXPLICIT_LEASES)
                },
            }),
            _ => Req::Revoke(LeaseRevokeRequest { id: self.lease() }),
        }
    }

    /// In a cluster, `req` with the revision of every Range directly in a
    /// branch of a Txn that writes moved into the revisions readable now
    /// (0 stays; below the compact revision becomes it, past the head
    /// becomes the head). etcd 3.4.23 (and 3.5.1) checks those revisions
    /// only on the member asked: the others drop a writing Txn's top-level
    /// Ranges before they apply it (`removeNeedlessRangeReqs` in
    /// etcdserver/apply.go, called from `applyEntryNormal` in
    /// etcdserver/server.go when no client waits for the result), so a
    /// Range at a compacted or future revision there fails the Txn on the
    /// member asked and applies its writes on the others: etcd's members
    /// diverge, and the reference has no answer to compare with.
    fn consistent_in_cluster(&self, req: &mut Req) {
        let Req::Txn(t) = req else { return };
        let is_range =
            |op: &RequestOp| matches!(op.request, Some(request_op::Request::RequestRange(_)));
        if t.success.iter().chain(&t.failure).all(is_range) {
            return; // read-only: served by the member asked alone
        }
        let first = if self.compacted > 0 {
            self.compacted
        } else {
            -1
        };
        for op in t.success.iter_mut().chain(t.failure.iter_mut()) {
            if let Some(request_op::Request::RequestRange(r)) = &mut op.request {
                if r.revision != 0 {
                    r.revision = r.revision.clamp(first, self.head.max(first));
                }
            }
        }
    }

    /// Learns from the reference's (normalised) answer to `req`.
    fn learn(&mut self, req: &Req, a: &Answer) {
        let Ok(r) = a else { return };
        let mut revs = Vec::new();
        let head = |h: &Option<ResponseHeader>| h.as_ref().map_or(0, |h| h.revision);
        let mut kvs = |kvs: &[KeyValue]| {
            for k in kvs {
                revs.push(k.create_revision);
                revs.push(k.mod_revision);
            }
        };
        let h = match r {
            Resp::Put(r) => {
                kvs(r.prev_kv.as_slice());
                head(&r.header)
            }
            Resp::Range(r) => {
                kvs(&r.kvs);
                head(&r.header)
            }
            Resp::Delete(r) => {
                kvs(&r.prev_kvs);
                head(&r.header)
            }
            Resp::Txn(r) => head(&r.header),
            Resp::Compact(r) => head(&r.header),
            Resp::Grant(r) => head(&r.header),
            Resp::Revoke(r) => head(&r.header),
        };
        revs.push(h);
        self.head = self.head.max(h);
        match (req, r) {
            (Req::Compact(c), Resp::Compact(_)) => self.compacted = c.revision,
            (Req::Grant(_), Resp::Grant(_)) => self.grants += 1,
            _ => {}
        }
        for r in revs.into_iter().filter(|&r| r > 0) {
            if !self.revs.contains(&r) {
                self.revs.push(r);
            }
        }
        if self.revs.len() > 40 {
            self.revs.drain(..self.revs.len() - 40);
        }
    }
}

/// `Debug` output with every byte list (`[97, 47, 98]`) shown as an
/// escaped string (`"a/b"`), for reading keys and values (lists of other
/// numbers do not occur in these messages; an empty list stays `[]`), and
/// every lease placeholder as `lease#<grant order>`.
fn readable(debug: &str) -> String {
    bytes_as_strings(&placeholder_names(debug, LEASE_BASE, "lease"))
}

fn show(a: &Answer) -> String {
    match a {
        Ok(r) => readable(&format!("{r:?}")),
        Err((code, msg)) => format!("error {code:?}: {msg:?}"),
    }
}

/// What a run found: the number of differing answers and the first
/// [`MAX_SHOWN`] of them, and every answer whose header names another
/// member or cluster than the one asked.
#[derive(Default)]
struct Findings {
    diffs: usize,
    shown: Vec<String>,
    wrong_member: Vec<String>,
}

impl Findings {
    /// Records both sides' answers to `req`, sent as `what` (a step, or
    /// the catch-up read before one).
    fn record(
        &mut self,
        what: &str,
        req: &Req,
        (ra, r_wrong): &(Answer, Option<String>),
        (ta, t_wrong): &(Answer, Option<String>),
        tname: &str,
    ) {
        for (side, wrong) in [("etcd", r_wrong), (tname, t_wrong)] {
            if let Some(wrong) = wrong {
                self.wrong_member.push(format!(
                    "{what}, {side}: {wrong}; request {}",
                    readable(&format!("{req:?}"))
                ));
            }
        }
        if ra != ta {
            self.diffs += 1;
            if self.shown.len() < MAX_SHOWN {
                self.shown.push(format!(
                    "{what}: {}\n  etcd:   {}\n  {tname}: {}",
                    readable(&format!("{req:?}")),
                    show(ra),
                    show(ta)
                ));
            }
        }
    }
}

/// The 1-member test by default; `RETCD_KV_DIFF_MEMBERS=3` makes it a
/// 3-member one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_random_differential() {
    let members = env_u64("RETCD_KV_DIFF_MEMBERS", 1).max(1) as usize;
    run(members, env_u64("RETCD_KV_DIFF_STEPS", 600)).await;
}

/// The 3-member mode, short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_random_differential_3_members() {
    run(3, env_u64("RETCD_KV_DIFF_STEPS", 1000)).await;
}

/// Runs the prelude and `steps` seeded steps against an etcd and a target
/// cluster of `members` members each, and fails listing the differences.
async fn run(members: usize, steps: u64) {
    let seed = env_u64("RETCD_KV_DIFF_SEED", 1);
    let trace = std::env::var_os("RETCD_KV_DIFF_TRACE").is_some();
    // A long run gets more time than the default one.
    let limit = LIMIT.max(Duration::from_millis(steps * 100));
    bounded(limit, async {
        let flavor = test_flavor();
        let (reference, target) = tokio::join!(
            Cluster::start(Flavor::Etcd, members, FAST),
            Cluster::start(flavor, members, FAST),
        );
        let reference = reference.expect("start reference etcd");
        let target = target.expect("start target");
        let tname = flavor.name();
        let (mut r, mut t) = (
            Server::connect(&reference).await,
            Server::connect(&target).await,
        );
        let mut g = Gen {
            rng: StdRng::seed_from_u64(seed),
            head: 1,
            compacted: 0,
            revs: Vec::new(),
            grants: 0,
        };
        // The members asked: drawn apart from the requests, so that a seed
        // sends the same requests in both modes (as long as the answers,
        // which the generator learns from, are the same).
        let mut member_rng = StdRng::seed_from_u64(seed ^ 0x6d65_6d62_6572_7321);
        let role = |s: &Server, m: usize| if s.leader == m { "leader" } else { "follower" };
        let started = Instant::now();
        let (mut found, mut errors, mut catch_ups) = (Findings::default(), BTreeMap::new(), 0);
        let (mut stopped, mut defused) = (None, 0);
        // Fixed steps first, each with the member it goes to (or none: one
        // drawn as for a seeded step).
        let mut fixed: Vec<(Option<usize>, Req)> = prelude().into_iter().map(|r| (None, r)).collect();
        if members > 1 {
            fixed.extend(cluster_prelude(members).into_iter().map(|(m, r)| (Some(m), r)));
        }
        let total = fixed.len() as u64 + steps;
        let mut ran = 0;
        for n in 0..total {
            ran += 1;
            let (fixed_member, mut req) = match fixed.get(n as usize) {
                Some((m, req)) => (*m, req.clone()),
                None => (None, g.next()),
            };
            if no_etcd_crash(&mut req) {
                defused += 1;
            }
            if members > 1 {
                g.consistent_in_cluster(&mut req);
            }
            let (m, what) = if members == 1 {
                (0, format!("seed {seed} step {n}"))
            } else {
                let drawn = member_rng.random_range(0..members);
                let m = match fixed_member {
                    Some(m) => m,
                    // The server chooses the ID: through one member, so
                    // that IDs grow in grant order on both sides.
                    None if matches!(&req, Req::Grant(g) if g.id == 0) => 0,
                    None => drawn,
                };
                let roles = format!("{} of etcd, {} of {tname}", role(&r, m), role(&t, m));
                (m, format!("seed {seed} step {n} on member {m} ({roles} at the start)"))
            };
            let mut sent = Vec::new();
            if members > 1 && served_locally(&req) {
                catch_ups += 1;
                let read = catch_up_read();
                let (ra, ta) = tokio::join!(r.call(&read, m), t.call(&read, m));
                found.record(&format!("{what}, its catch-up read"), &read, &ra, &ta, tname);
                sent.push(("catch-up read", read, ra, ta));
            }
            let (ra, ta) = tokio::join!(r.call(&req, m), t.call(&req, m));
            found.record(&what, &req, &ra, &ta, tname);
            if let Err((code, msg)) = &ra.0 {
                *errors.entry(format!("{code:?} {msg:?}")).or_insert(0usize) += 1;
            }
            g.learn(&req, &ra.0);
            sent.push(("step", req, ra, ta));
            // A member out of reach ends the run: every later call would
            // fail the same on both sides, or wait for its bound.
            let stalled = (sent.iter()).any(|(_, _, ra, ta)| out_of_reach(&ra.0) || out_of_reach(&ta.0));
            if trace {
                for (kind, req, ra, ta) in &sent {
                    eprintln!(
                        "{what}, {kind}: {}\n  etcd:   {}\n  {tname}: {}",
                        readable(&format!("{req:?}")),
                        show(&ra.0),
                        show(&ta.0)
                    );
                }
            }
            if stalled {
                stopped = Some(format!(
                    "{what}: the member asked is out of reach (it died, or a call timed out); \
                     the run stopped there (see the log tails)\n\n"
                ));
                break;
            }
        }
        // Every member's store at the end: each member of a cluster holds
        // the same keys, and the target's the same as etcd's.
        if members > 1 && stopped.is_none() {
            let every_key = Req::Range(RangeRequest {
                key: vec![0],
                range_end: vec![0],
                ..Default::default()
            });
            for m in 0..members {
                let (ra, ta) = tokio::join!(r.call(&every_key, m), t.call(&every_key, m));
                let what = format!("seed {seed}, after the last step: member {m}'s keys");
                found.record(&what, &every_key, &ra, &ta, tname);
            }
        }
        let mode = if members == 1 {
            String::new()
        } else {
            format!(
                " ({members} members, leader m{} of etcd and m{} of {tname} at the start, raft \
                 terms seen {:?} and {:?}, {catch_ups} catch-up reads)",
                r.leader, t.leader, r.terms, t.terms
            )
        };
        let diffs = found.diffs;
        eprintln!(
            "kv_random_differential{mode}: etcd vs {tname}, seed {seed}: {ran} steps in {:.1?} \
             ({} answered with an error by etcd: {errors:?}), head revision {}, {} leases granted, \
             {diffs} differing steps, {} answers naming another member ({defused} Puts lost \
             their ignore flags: see no_etcd_crash)",
            started.elapsed(),
            errors.values().sum::<usize>(),
            g.head,
            g.grants,
            found.wrong_member.len()
        );
        let wrong = &found.wrong_member;
        let stopped = stopped.unwrap_or_default();
        assert!(
            diffs == 0 && wrong.is_empty() && stopped.is_empty(),
            "{stopped}{diffs} of {ran} steps differ between etcd and {tname} (seed {seed}; the first {} \
             below; once the stores differ, later steps may differ only because of it):\n\n{}\n\n\
             {} answers name another member or cluster than the one asked (the first {} below):\n{}",
            found.shown.len(),
            found.shown.join("\n\n"),
            wrong.len(),
            wrong.len().min(MAX_SHOWN),
            wrong[..wrong.len().min(MAX_SHOWN)].join("\n")
        );
    })
    .await;
}

/// Steps every run starts with (before the seeded ones): the differences
/// the random steps found in retcd once, each a regression test against
/// etcd's answer.
fn prelude() -> Vec<Req> {
    let put = |k: &[u8]| PutRequest {
        key: k.to_vec(),
        value: b"v".to_vec(),
        ..Default::default()
    };
    let op = |r: request_op::Request| RequestOp { request: Some(r) };
    let range_at = |revision: i64| RangeRequest {
        key: b"a".to_vec(),
        revision,
        ..Default::default()
    };
    let txn = |success: Vec<RequestOp>| {
        Req::Txn(TxnRequest {
            success,
            ..Default::default()
        })
    };
    let mut steps = vec![
        // a from-key delete (range end "\0") in the Txn that puts a key
        // is no "duplicate key": etcd's interval compares the end as a
        // string, so it covers nothing there; the delete then removes it
        txn(vec![
            op(request_op::Request::RequestPut(put(b"b"))),
            op(request_op::Request::RequestDeleteRange(
                DeleteRangeRequest {
                    key: b"a".to_vec(),
                    range_end: vec![0],
                    ..Default::default()
                },
            )),
        ]),
        // an op with no request, in either branch: "key not found"
        txn(vec![RequestOp { request: None }]),
        Req::Txn(TxnRequest {
            failure: vec![
                op(request_op::Request::RequestPut(put(b"a"))),
                RequestOp { request: None },
            ],
            ..Default::default()
        }),
        // with no order, any target but KEY sorts ascending by it
        Req::Put(put(b"c")),
        Req::Put(put(b"b")),
    ];
    for target in 1..=4 {
        steps.push(Req::Range(RangeRequest {
            key: b"a".to_vec(),
            range_end: b"d".to_vec(),
            sort_target: target,
            ..Default::default()
        }));
    }
    // a Txn's range at a negative revision: compacted from -2 on, and from
    // -1 on once something was compacted (a unary Range reads the head)
    steps.push(txn(vec![op(request_op::Request::RequestRange(range_at(
        -2,
    )))]));
    steps.push(txn(vec![op(request_op::Request::RequestRange(range_at(
        -1,
    )))]));
    steps.push(Req::Compact(CompactionRequest {
        revision: 3,
        physical: true,
    }));
    for rev in [-1, 2, 3] {
        steps.push(txn(vec![op(request_op::Request::RequestRange(range_at(
            rev,
        )))]));
        steps.push(txn(vec![
            op(request_op::Request::RequestPut(put(b"d"))),
            op(request_op::Request::RequestRange(range_at(rev))),
        ]));
        steps.push(Req::Range(range_at(rev)));
    }
    // a key deleted and put again in one revision (the head is 5 here),
    // then compacted at that revision: it still reads and deletes
    steps.push(Req::Put(put(b"c")));
    steps.push(txn(vec![
        op(request_op::Request::RequestDeleteRange(
            DeleteRangeRequest {
                key: b"a".to_vec(),
                range_end: vec![0],
                ..Default::default()
            },
        )),
        op(request_op::Request::RequestPut(put(b"c"))),
    ]));
    steps.push(Req::Compact(CompactionRequest {
        revision: 7,
        physical: true,
    }));
    for revision in [0, 7] {
        steps.push(Req::Range(RangeRequest {
            key: b"c".to_vec(),
            revision,
            ..Default::default()
        }));
    }
    steps.push(Req::Delete(DeleteRangeRequest {
        key: b"c".to_vec(),
        ..Default::default()
    }));
    steps
}

/// Steps a cluster run adds after [`prelude`], each with the member it goes
/// to: a write through each member, then a Txn whose only op is an empty
/// nested Txn, comparing the value just written, through the next member.
/// etcd counts a nested Txn as a write (`isTxnReadonly` in
/// etcdserver/v3_server.go), so that Txn goes through raft and sees the
/// write whichever member answers.
fn cluster_prelude(members: usize) -> Vec<(usize, Req)> {
    let mut steps = Vec::new();
    for (m, value) in (0..members).zip(VALUES[1..].iter().cycle()) {
        steps.push((
            m,
            Req::Put(PutRequest {
                key: b"z".to_vec(),
                value: value.to_vec(),
                ..Default::default()
            }),
        ));
        let empty_txn = RequestOp {
            request: Some(request_op::Request::RequestTxn(TxnRequest::default())),
        };
        steps.push((
            (m + 1) % members,
            Req::Txn(TxnRequest {
                compare: vec![Compare {
                    result: compare::CompareResult::Equal as i32,
                    target: compare::CompareTarget::Value as i32,
                    key: b"z".to_vec(),
                    range_end: Vec::new(),
                    target_union: Some(compare::TargetUnion::Value(value.to_vec())),
                }],
                success: vec![empty_txn],
                failure: Vec::new(),
            }),
        ));
    }
    steps
}

#[test]
fn readable_shows_bytes_as_strings() {
    assert_eq!(
        readable("PutRequest { key: [97, 47, 98], value: [], x: [0, 255] }"),
        r#"PutRequest { key: "a/b", value: [], x: "\x00\xff" }"#
    );
    let l = LEASE_BASE + 3;
    assert_eq!(
        readable(&format!("Put {{ lease: {l}, n: 12 }} {}", l - 4)),
        format!("Put {{ lease: lease#3, n: 12 }} {}", l - 4)
    );
    assert_eq!(prefix_end(b"a"), b"b");
    assert_eq!(prefix_end(b"a\xff"), b"b");
    assert_eq!(prefix_end(b"\xff"), b"\x00");
}
