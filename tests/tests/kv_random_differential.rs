//! A seeded random *content* differential test of the KV API: the same
//! sequence of single-client, sequential requests (Put, Range, DeleteRange,
//! Txn with every compare target and result and nested Txns, Compact,
//! LeaseGrant, LeaseRevoke) is sent to a fresh 1-node real etcd 3.4.23 (the
//! reference) and a fresh 1-node target (retcd by default;
//! `RETCD_TEST_FLAVOR=etcd` makes it a second etcd, which checks the
//! normalisation), both empty and started with the same flags.
//!
//! Unlike `rpc_fuzz` (status codes only), the whole answer is compared:
//! both fail with the same gRPC code and message, or both succeed with
//! equal responses after [`normalise`] — which clears only the header's
//! cluster ID, member ID and raft term and replaces the lease IDs the
//! servers chose by their grant order (requests name a granted lease by
//! its grant order too; the test also grants leases with IDs of its own,
//! which both servers must answer as they are). Revisions are compared exactly: both stores start empty and
//! get the same writes.
//!
//! The keys come from a small space (`a`, `a/b`, `ab`, `c\0`, `\0`, `\xff`,
//! …) and ranges end at none, a prefix end, `\0` (from the key), another
//! key of the space (possibly below it) or the key itself, so ranges
//! overlap. Requests etcd 3.4.23 is known to die on are not generated (a
//! sort target outside the enum; `ignore_value`/`ignore_lease` in a nested
//! Txn: see docs/robustness.md, RPC fuzzer), and leases have a TTL of an
//! hour so none expires during a run.
//!
//! `RETCD_KV_DIFF_SEED` (default 1) and `RETCD_KV_DIFF_STEPS` (default
//! 600) replay and size a run; `RETCD_KV_DIFF_TRACE=1` prints every step
//! and both answers.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use retcd_api::etcdserverpb::{
    compare, kv_client::KvClient, lease_client::LeaseClient, request_op, response_op,
    CompactionRequest, CompactionResponse, Compare, DeleteRangeRequest, DeleteRangeResponse,
    LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeRequest, LeaseRevokeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, RequestOp, ResponseHeader, TxnRequest, TxnResponse,
};
use retcd_api::mvccpb::KeyValue;
use retcd_tests::random_diff::{
    answer, bytes_as_strings, env_u64, prefix_end, range_end, recent_rev, Dice,
};
use retcd_tests::{bounded, limit::NORMAL as LIMIT, test_flavor, Cluster, Flavor, FAST};
use tokio::time::timeout;
use tonic::transport::Channel;

/// Each call's bound.
const CALL: Duration = Duration::from_secs(10);

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
    fn header(h: &mut Option<ResponseHeader>) {
        if let Some(h) = h {
            h.cluster_id = 0;
            h.member_id = 0;
            h.raft_term = 0;
        }
    }
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
    fn txn(t: &mut TxnResponse, kv: &dyn Fn(&mut KeyValue)) {
        header(&mut t.header);
        for r in &mut t.responses {
            match &mut r.response {
                Some(response_op::Response::ResponseRange(r)) => {
                    header(&mut r.header);
                    r.kvs.iter_mut().for_each(kv);
                }
                Some(response_op::Response::ResponsePut(r)) => {
                    header(&mut r.header);
                    r.prev_kv.iter_mut().for_each(kv);
                }
                Some(response_op::Response::ResponseDeleteRange(r)) => {
                    header(&mut r.header);
                    r.prev_kvs.iter_mut().for_each(kv);
                }
                Some(response_op::Response::ResponseTxn(t)) => txn(t, kv),
                None => {}
            }
        }
    }
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
        Resp::Txn(t) => txn(t, &kv),
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

/// One server: its channel and the IDs of the leases it granted, in order,
/// each with whether the server chose it (a grant with ID 0).
struct Server {
    chan: Channel,
    leases: Vec<(i64, bool)>,
}

impl Server {
    async fn connect(c: &Cluster) -> Server {
        let chan = Channel::from_shared(c.members[0].endpoint())
            .expect("url")
            .connect()
            .await
            .expect("connect");
        Server {
            chan,
            leases: Vec::new(),
        }
    }

    /// Sends `req` (materialised for this server) and returns its answer,
    /// normalised, and records a granted lease.
    async fn call(&mut self, req: &Req) -> Answer {
        let mut kv = KvClient::new(self.chan.clone());
        let mut ls = LeaseClient::new(self.chan.clone());
        let mut a = match materialise(req, &self.leases) {
            Req::Put(r) => answer(timeout(CALL, kv.put(r)).await, Resp::Put),
            Req::Range(r) => answer(timeout(CALL, kv.range(r)).await, Resp::Range),
            Req::Delete(r) => answer(timeout(CALL, kv.delete_range(r)).await, Resp::Delete),
            Req::Txn(r) => answer(timeout(CALL, kv.txn(r)).await, Resp::Txn),
            Req::Compact(r) => answer(timeout(CALL, kv.compact(r)).await, Resp::Compact),
            Req::Grant(r) => answer(timeout(CALL, ls.lease_grant(r)).await, Resp::Grant),
            Req::Revoke(r) => answer(timeout(CALL, ls.lease_revoke(r)).await, Resp::Revoke),
        };
        if let (Ok(Resp::Grant(g)), Req::Grant(asked)) = (&a, req) {
            self.leases.push((g.id, asked.id == 0));
        }
        normalise(&mut a, &self.leases);
        a
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
    bytes_as_strings(&lease_names(debug))
}

/// `s` with every number that is a lease placeholder written `lease#<i>`.
fn lease_names(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut digits = String::new();
    let flush = |digits: &mut String, out: &mut String| {
        match digits.parse::<i64>() {
            Ok(n) if (LEASE_BASE..LEASE_BASE + (1 << 20)).contains(&n) => {
                out.push_str(&format!("lease#{}", n - LEASE_BASE));
            }
            _ => out.push_str(digits),
        }
        digits.clear();
    };
    for c in s.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
        } else {
            flush(&mut digits, &mut out);
            out.push(c);
        }
    }
    flush(&mut digits, &mut out);
    out
}

fn show(a: &Answer) -> String {
    match a {
        Ok(r) => readable(&format!("{r:?}")),
        Err((code, msg)) => format!("error {code:?}: {msg:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_random_differential() {
    let seed = env_u64("RETCD_KV_DIFF_SEED", 1);
    let steps = env_u64("RETCD_KV_DIFF_STEPS", 600);
    let trace = std::env::var_os("RETCD_KV_DIFF_TRACE").is_some();
    // A long run gets more time than the default one.
    let limit = LIMIT.max(Duration::from_millis(steps * 100));
    bounded(limit, async {
        let flavor = test_flavor();
        let (reference, target) = tokio::join!(
            Cluster::start(Flavor::Etcd, 1, FAST),
            Cluster::start(flavor, 1, FAST),
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
        let started = Instant::now();
        let (mut diffs, mut shown, mut errors) = (0usize, Vec::new(), BTreeMap::new());
        let fixed = prelude();
        let total = fixed.len() as u64 + steps;
        for n in 0..total {
            let req = match fixed.get(n as usize) {
                Some(req) => req.clone(),
                None => g.next(),
            };
            let (ra, ta) = tokio::join!(r.call(&req), t.call(&req));
            if trace {
                eprintln!(
                    "step {n}: {}\n  etcd:   {}\n  {tname}: {}",
                    readable(&format!("{req:?}")),
                    show(&ra),
                    show(&ta)
                );
            }
            if let Err((code, msg)) = &ra {
                *errors.entry(format!("{code:?} {msg:?}")).or_insert(0usize) += 1;
            }
            if ra != ta {
                diffs += 1;
                if shown.len() < MAX_SHOWN {
                    shown.push(format!(
                        "seed {seed} step {n}: {}\n  etcd:   {}\n  {tname}: {}",
                        readable(&format!("{req:?}")),
                        show(&ra),
                        show(&ta)
                    ));
                }
            }
            g.learn(&req, &ra);
        }
        eprintln!(
            "kv_random_differential: etcd vs {tname}, seed {seed}: {total} steps in {:.1?} \
             ({} answered with an error by etcd: {errors:?}), head revision {}, {} leases granted, \
             {diffs} differing steps",
            started.elapsed(),
            errors.values().sum::<usize>(),
            g.head,
            g.grants
        );
        assert!(
            diffs == 0,
            "{diffs} of {total} steps differ between etcd and {tname} (seed {seed}; the first {} \
             below; once the stores differ, later steps may differ only because of it):\n\n{}",
            shown.len(),
            shown.join("\n\n")
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
