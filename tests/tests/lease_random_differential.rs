//! A seeded random *content* differential test of the Lease API and of
//! leased keys: the same sequence of single-client, sequential requests is
//! sent to a fresh 1-node real etcd 3.4.23 (the reference) and a fresh
//! 1-node target (retcd by default; `RETCD_TEST_FLAVOR=etcd` makes it a
//! second etcd, which checks the normalisation), both empty and started
//! with the same flags ([`FLAGS`]).
//!
//! Requests: LeaseGrant (ID 0 — the server chooses —, explicit IDs, a
//! negative one and `i64::MIN`/`i64::MAX` included, duplicates of live
//! leases, of server-chosen ones too; TTLs long, huge — up to etcd's
//! maximum 9 000 000 000 s — and above it, and, only inside an *expiry
//! episode* (below), zero, negative and tiny ones), LeaseRevoke (live,
//! revoked, never granted, 0), LeaseTimeToLive with and without `keys`,
//! LeaseLeases, LeaseKeepAlive on two long-lived bidirectional streams
//! (1–3 keepalives a step, each sent alone and its answer awaited before
//! the next, or all sent at once — etcd answers a stream's keepalives one
//! at a time, in order; a stream is sometimes opened anew, sometimes
//! half-closed by the client after its keepalives, whose end is then
//! compared too), and KV requests that attach and detach keys: Put with a
//! lease (live, revoked, unknown), with `ignore_lease` (and
//! `ignore_value`), Txn (LEASE compares, puts with leases, deletes,
//! ranges, nested Txns — without `ignore_*`, which etcd 3.4.23 dies on
//! there), DeleteRange, Range (whose `lease` fields are compared).
//!
//! Expiry episodes: the servers run with `--heartbeat-interval 100
//! --election-timeout 3000`, so etcd's minimum lease TTL is
//! ceil((3 × 30 / 2) × 100 ms) = ceil(4.5 s) = 5 s and every TTL below
//! (`i64::MIN`, negative, zero, 1–3 s) is granted as 5 s (5 and 6 s are
//! asked for too). Such *short* leases are granted only at the
//! start of an episode (1–3 of them) and during it; the episode runs random
//! steps that favour them (attach keys, detach, keep alive, TimeToLive...)
//! for at most ~30 steps and never past [`SAFETY`] before the earliest of
//! them could expire, then an `Expire` step sleeps until every short lease
//! still live has expired on both servers (last grant or renew + its TTL)
//! and polls LeaseLeases (bounded by [`EXPIRE_BOUND`]) until both have
//! revoked them: its answer is the list of those still live (empty unless
//! a server fails to expire). The steps after it check each expired lease
//! with TimeToLive (TTL -1), every key with a Range, and LeaseLeases. So
//! expiry happens only during that explicit wait, and every other step is
//! compared at a deterministic state. A run starts with a fixed
//! [`prelude`] (edge cases and one episode) and has `steps / 200` (at
//! least one) seeded episodes.
//!
//! Comparison: both fail with the same gRPC code and message, or both
//! succeed with equal responses after [`normalise`], which
//! * clears every header's cluster ID, member ID and raft term (revisions
//!   are compared exactly: both stores start empty and get the same
//!   writes);
//! * replaces every lease ID a server chose (the answer to a grant asking
//!   for ID 0 named another ID) by a placeholder numbered by that grant
//!   order (requests name those leases by the placeholder; IDs the test
//!   asked for stay as they are, so both servers must grant exactly them);
//! * sorts LeaseLeases' leases and TimeToLive's keys (etcd lists both in
//!   Go map order);
//!
//! and [`same`] accepts a TimeToLive's *remaining* TTL that differs by at
//! most [`TTL_TOLERANCE`] second when both are ≥ 0 (the two servers grant
//! and renew a few milliseconds apart and truncate to seconds); the
//! granted TTL, a grant's and a keepalive's TTL are compared exactly.
//! Revisions inside an `Expire` wait are not asked for afterwards: etcd
//! revokes expired leases from concurrent goroutines, so the order (and
//! the revision) in which several expired leases' keys were deleted is not
//! deterministic; the revision after the wait is.
//!
//! `RETCD_LEASE_DIFF_SEED` (default 1) and `RETCD_LEASE_DIFF_STEPS`
//! (default 400) replay and size a run; `RETCD_LEASE_DIFF_TRACE=1` prints
//! every step and both answers; `RETCD_LEASE_DIFF_TARGET_BIN` runs another
//! binary of the flavour as the target (e.g. etcd 3.5.1's with
//! `RETCD_TEST_FLAVOR=etcd`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use retcd_api::etcdserverpb::{
    compare, kv_client::KvClient, lease_client::LeaseClient, request_op, Compare,
    DeleteRangeRequest, DeleteRangeResponse, LeaseGrantRequest, LeaseGrantResponse,
    LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseLeasesRequest, LeaseLeasesResponse,
    LeaseRevokeRequest, LeaseRevokeResponse, LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
    PutRequest, PutResponse, RangeRequest, RangeResponse, RequestOp, ResponseHeader, TxnRequest,
    TxnResponse,
};
use retcd_api::mvccpb::KeyValue;
use retcd_tests::random_diff::{
    answer, bytes_as_strings, clear_header, env_u64, normalise_txn, placeholder_names, range_end,
    recent_rev, Dice,
};
use retcd_tests::{bounded, limit::NORMAL as LIMIT, test_flavor, Cluster, Flavor};
use tokio::sync::mpsc;
use tokio::time::timeout;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;

/// Both servers' flags: etcd's minimum lease TTL is
/// `ceil((3 * election ticks / 2) * heartbeat)` = ceil(45 × 100 ms) = 5 s.
const FLAGS: &[&str] = &["--heartbeat-interval", "100", "--election-timeout", "3000"];

/// Each unary call's bound.
const CALL: Duration = Duration::from_secs(10);

/// How long a keepalive's answer (or the end of a half-closed stream) is
/// awaited.
const KA_WAIT: Duration = Duration::from_secs(3);

/// An episode's steps stop this long before the earliest moment one of
/// its short leases could expire (its grant or renew was sent + its TTL).
const SAFETY: Duration = Duration::from_millis(1500);

/// After the last short lease has expired, how long `Expire` polls
/// LeaseLeases for both servers to have revoked them (etcd looks for
/// expired leases every 500 ms, then revokes through raft).
const EXPIRE_BOUND: Duration = Duration::from_secs(5);

/// TimeToLive's remaining TTLs may differ by this many seconds.
const TTL_TOLERANCE: i64 = 1;

/// Granted TTLs at least this long never expire during a run; shorter
/// ones are the episodes' short leases.
const LONG: i64 = 3600;

/// Differing steps printed at most (the count is always given).
const MAX_SHOWN: usize = 20;

/// The key space: a few keys whose prefixes and ranges overlap.
const KEYS: [&[u8]; 8] = [b"a", b"a/b", b"ab", b"b", b"c", b"c\x00", b"\x00", b"\xff"];

/// Values, few so that VALUE compares are sometimes equal.
const VALUES: [&[u8]; 4] = [b"", b"0", b"v", b"\xff\x00"];

/// Lease IDs the test asks for (a negative one and the extremes included).
const EXPLICIT_LEASES: [i64; 7] = [0x1001, 0x1002, 0x1003, 0x1004, -1, i64::MIN, i64::MAX];

/// A lease ID never granted.
const UNKNOWN_LEASE: i64 = 0x0bad;

/// TTLs of leases that outlive any run: granted as they are.
const LONG_TTLS: [i64; 4] = [LONG, 7200, 1_000_000, 9_000_000_000];

/// TTLs above etcd's maximum (9 000 000 000 s): "too large lease TTL".
const BAD_TTLS: [i64; 2] = [9_000_000_001, i64::MAX];

/// TTLs of short leases (only inside an episode): all but 6 below the
/// minimum TTL, so granted as 5 s.
const SHORT_TTLS: [i64; 9] = [i64::MIN, -5, -1, 0, 1, 2, 3, 5, 6];

/// The placeholder of the `i`-th lease a server chose (in grant order):
/// what the generated requests carry, what [`materialise`] replaces by the
/// server's own ID, and what [`normalise`] puts in place of it.
const LEASE_BASE: i64 = 0x4c45_4153_0000_0000;

/// One request of the sequence.
#[derive(Debug, Clone)]
enum Req {
    Put(PutRequest),
    Range(RangeRequest),
    Delete(DeleteRangeRequest),
    Txn(TxnRequest),
    Grant(LeaseGrantRequest),
    Revoke(LeaseRevokeRequest),
    TimeToLive(LeaseTimeToLiveRequest),
    Leases,
    /// Keepalives on keepalive stream `stream` (dropped and opened anew
    /// first when `fresh`, opened when it is not open), each sent alone
    /// and its answer awaited, or all sent at once when `pipelined`; with
    /// `close` the client then half-closes the stream and awaits its end.
    KeepAlive {
        stream: usize,
        fresh: bool,
        ids: Vec<i64>,
        pipelined: bool,
        close: bool,
    },
    /// The end of an expiry episode: sleep until the short leases `ids`
    /// have expired, then poll until they are revoked (see the module
    /// doc). The prelude writes it with no IDs: the generator fills them.
    Expire {
        ids: Vec<i64>,
    },
}

/// A keepalive's answer: the response, or how the stream failed.
type KeepAliveAnswer = Result<LeaseKeepAliveResponse, (tonic::Code, String)>;

/// A successful answer.
#[derive(Debug, Clone, PartialEq)]
enum Resp {
    Put(PutResponse),
    Range(RangeResponse),
    Delete(DeleteRangeResponse),
    Txn(TxnResponse),
    Grant(LeaseGrantResponse),
    Revoke(LeaseRevokeResponse),
    TimeToLive(LeaseTimeToLiveResponse),
    Leases(LeaseLeasesResponse),
    KeepAlive(Vec<KeepAliveAnswer>),
    /// The leases of an `Expire` still listed by LeaseLeases at its bound.
    Expire(Vec<i64>),
}

/// An answer: the response, or the gRPC code and message.
type Answer = Result<Resp, (tonic::Code, String)>;

/// The normalisation (see the module doc): headers lose cluster ID,
/// member ID and raft term; the lease IDs the server chose (`chosen`, in
/// grant order) become their placeholders; LeaseLeases' leases and
/// TimeToLive's keys are sorted.
fn normalise(a: &mut Answer, chosen: &[i64]) {
    let header = clear_header;
    let lease = |id: &mut i64| {
        if let Some(i) = chosen.iter().position(|c| c == id) {
            *id = LEASE_BASE + i as i64;
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
        Resp::Grant(r) => {
            header(&mut r.header);
            lease(&mut r.id);
        }
        Resp::Revoke(r) => header(&mut r.header),
        Resp::TimeToLive(r) => {
            header(&mut r.header);
            lease(&mut r.id);
            r.keys.sort();
        }
        Resp::Leases(r) => {
            header(&mut r.header);
            r.leases.iter_mut().for_each(|l| lease(&mut l.id));
            r.leases.sort_by_key(|l| l.id);
        }
        Resp::KeepAlive(rs) => {
            for r in rs.iter_mut().flatten() {
                header(&mut r.header);
                lease(&mut r.id);
            }
        }
        Resp::Expire(ids) => {
            ids.iter_mut().for_each(lease);
            ids.sort();
        }
    }
}

/// Whether the reference's answer `r` and the target's `t` (both
/// normalised) agree: equal, but for a TimeToLive's remaining TTL, which
/// may differ by [`TTL_TOLERANCE`] when both are ≥ 0 (a lease that is
/// found).
fn same(r: &Answer, t: &Answer) -> bool {
    match (r, t) {
        (Ok(Resp::TimeToLive(a)), Ok(Resp::TimeToLive(b)))
            if a.ttl >= 0 && b.ttl >= 0 && (a.ttl - b.ttl).abs() <= TTL_TOLERANCE =>
        {
            let b = LeaseTimeToLiveResponse {
                ttl: a.ttl,
                ..b.clone()
            };
            *a == b
        }
        _ => r == t,
    }
}

/// `req` with every lease placeholder replaced by the server's own ID of
/// that grant (`chosen`, in grant order); a placeholder the server has no
/// grant for (it refused one the reference accepted) stays as it is.
fn materialise(req: &Req, chosen: &[i64]) -> Req {
    let lease = |id: &mut i64| {
        let i = id.wrapping_sub(LEASE_BASE);
        if (0..chosen.len() as i64).contains(&i) {
            *id = chosen[i as usize];
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
        Req::Grant(g) => lease(&mut g.id),
        Req::Revoke(r) => lease(&mut r.id),
        Req::TimeToLive(r) => lease(&mut r.id),
        Req::KeepAlive { ids, .. } | Req::Expire { ids } => ids.iter_mut().for_each(lease),
        Req::Range(_) | Req::Delete(_) | Req::Leases => {}
    }
    req
}

/// An open keepalive stream: the sender of its requests (none once the
/// client half-closed it) and its answers.
struct KeepAliveStream {
    tx: Option<mpsc::Sender<LeaseKeepAliveRequest>>,
    rx: Streaming<LeaseKeepAliveResponse>,
}

/// The next message of a keepalive stream, bounded by [`KA_WAIT`]; a
/// stream's end is `(Ok, "(test: stream ended)")`.
async fn next_keep_alive(rx: &mut Streaming<LeaseKeepAliveResponse>) -> KeepAliveAnswer {
    match timeout(KA_WAIT, rx.message()).await {
        Ok(Ok(Some(m))) => Ok(m),
        Ok(Ok(None)) => Err((tonic::Code::Ok, "(test: stream ended)".into())),
        Ok(Err(s)) => Err((s.code(), s.message().to_string())),
        Err(_) => Err((tonic::Code::DeadlineExceeded, "(test: no answer)".into())),
    }
}

/// One server: its channel, the IDs of the leases it chose, in grant
/// order, and its keepalive streams.
struct Server {
    chan: Channel,
    chosen: Vec<i64>,
    streams: [Option<KeepAliveStream>; 2],
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
            chosen: Vec::new(),
            streams: [None, None],
        }
    }

    /// Sends `req` (materialised for this server) and returns its answer,
    /// normalised, and records a lease the server chose.
    async fn call(&mut self, req: &Req) -> Answer {
        let mut kv = KvClient::new(self.chan.clone());
        let mut ls = LeaseClient::new(self.chan.clone());
        let req = materialise(req, &self.chosen);
        let mut a = match req.clone() {
            Req::Put(r) => answer(timeout(CALL, kv.put(r)).await, Resp::Put),
            Req::Range(r) => answer(timeout(CALL, kv.range(r)).await, Resp::Range),
            Req::Delete(r) => answer(timeout(CALL, kv.delete_range(r)).await, Resp::Delete),
            Req::Txn(r) => answer(timeout(CALL, kv.txn(r)).await, Resp::Txn),
            Req::Grant(r) => answer(timeout(CALL, ls.lease_grant(r)).await, Resp::Grant),
            Req::Revoke(r) => answer(timeout(CALL, ls.lease_revoke(r)).await, Resp::Revoke),
            Req::TimeToLive(r) => answer(
                timeout(CALL, ls.lease_time_to_live(r)).await,
                Resp::TimeToLive,
            ),
            Req::Leases => answer(
                timeout(CALL, ls.lease_leases(LeaseLeasesRequest {})).await,
                Resp::Leases,
            ),
            Req::KeepAlive {
                stream,
                fresh,
                ids,
                pipelined,
                close,
            } => Ok(Resp::KeepAlive(
                self.keep_alive(stream, fresh, &ids, pipelined, close).await,
            )),
            Req::Expire { ids } => self.expire(&ids).await,
        };
        if let (Ok(Resp::Grant(g)), Req::Grant(asked)) = (&a, &req) {
            if g.id != asked.id {
                self.chosen.push(g.id);
            }
        }
        normalise(&mut a, &self.chosen);
        a
    }

    /// Sends `ids` on keepalive stream `s` (opened first if it is not
    /// open), each alone and awaiting its answer, or, `pipelined`, all at
    /// once and then awaiting as many answers; stops at the first failure
    /// (the stream is then forgotten, and opened anew by the next
    /// keepalive on it). With `close`, the client then half-closes the
    /// stream — when `pipelined`, right after sending, before the answers
    /// — and awaits its end after the answers.
    async fn keep_alive(
        &mut self,
        s: usize,
        fresh: bool,
        ids: &[i64],
        pipelined: bool,
        close: bool,
    ) -> Vec<KeepAliveAnswer> {
        if fresh {
            self.streams[s] = None;
        }
        let mut out = Vec::new();
        // ids[..sent] are sent, `queued` of them not answered yet
        let (mut sent, mut queued) = (0, 0);
        if self.streams[s].is_none() {
            if let Err(e) = self.open(s, ids[0]).await {
                out.push(Err(e));
                return out;
            }
            (sent, queued) = (1, 1);
        }
        while sent < ids.len() || queued > 0 {
            let st = self.streams[s].as_mut().expect("open");
            while sent < ids.len() && (pipelined || queued == 0) {
                let req = LeaseKeepAliveRequest { id: ids[sent] };
                let tx = st.tx.as_ref().expect("not half-closed yet");
                if tx.send(req).await.is_err() {
                    out.push(Err((tonic::Code::Unknown, "(test: stream closed)".into())));
                    self.streams[s] = None;
                    return out;
                }
                (sent, queued) = (sent + 1, queued + 1);
            }
            if pipelined && close && sent == ids.len() {
                st.tx = None; // half-closed with answers still to come
            }
            let a = next_keep_alive(&mut st.rx).await;
            queued -= 1;
            let failed = a.is_err();
            out.push(a);
            if failed {
                self.streams[s] = None;
                return out;
            }
        }
        if close {
            if let Some(KeepAliveStream { tx, mut rx }) = self.streams[s].take() {
                drop(tx);
                out.push(next_keep_alive(&mut rx).await);
            }
        }
        out
    }

    /// Opens keepalive stream `s` with a first keepalive of `id`: Go's gRPC
    /// server sends the response headers with its first message, so the
    /// request is queued before the call, which returns with the headers.
    async fn open(&mut self, s: usize, id: i64) -> Result<(), (tonic::Code, String)> {
        let (tx, rx) = mpsc::channel(8);
        tx.send(LeaseKeepAliveRequest { id })
            .await
            .expect("queue on a new channel");
        let mut ls = LeaseClient::new(self.chan.clone());
        match timeout(CALL, ls.lease_keep_alive(ReceiverStream::new(rx))).await {
            Ok(Ok(resp)) => {
                let rx = resp.into_inner();
                self.streams[s] = Some(KeepAliveStream { tx: Some(tx), rx });
                Ok(())
            }
            Ok(Err(st)) => Err((st.code(), st.message().to_string())),
            Err(_) => Err((
                tonic::Code::DeadlineExceeded,
                "(test: call timed out)".into(),
            )),
        }
    }

    /// Polls LeaseLeases until none of `ids` is listed, at most
    /// [`EXPIRE_BOUND`]; answers those still listed at the end.
    async fn expire(&mut self, ids: &[i64]) -> Answer {
        let deadline = Instant::now() + EXPIRE_BOUND;
        loop {
            let mut ls = LeaseClient::new(self.chan.clone());
            let listed = match answer(
                timeout(CALL, ls.lease_leases(LeaseLeasesRequest {})).await,
                Resp::Leases,
            )? {
                Resp::Leases(r) => r.leases.iter().map(|l| l.id).collect::<BTreeSet<_>>(),
                _ => unreachable!("LeaseLeases answers Leases"),
            };
            let live: Vec<i64> = ids.iter().copied().filter(|i| listed.contains(i)).collect();
            if live.is_empty() || Instant::now() >= deadline {
                return Ok(Resp::Expire(live));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A lease the reference granted and has not revoked (as the generator
/// knows it): its granted TTL and when its last grant or renew was sent
/// and answered.
#[derive(Debug, Clone, Copy)]
struct Live {
    ttl: i64,
    sent: Instant,
    answered: Instant,
}

impl Live {
    fn short(&self) -> bool {
        self.ttl < LONG
    }
}

/// The request generator, and what it learns from the reference's
/// answers: the head revision, revisions worth asking for, the leases.
struct Gen {
    rng: StdRng,
    head: i64,
    revs: Vec<i64>,
    /// Revision windows (exclusive) an `Expire` wait wrote: not asked for.
    racy: Vec<(i64, i64)>,
    /// Set by an `Expire`: the head before it, until an answer's header
    /// tells the head after it.
    racy_from: Option<i64>,
    /// Leases the server chose, so far (placeholders `LEASE_BASE + i`).
    chosen: usize,
    /// Every lease ID ever granted (placeholder or explicit).
    granted: Vec<i64>,
    live: BTreeMap<i64, Live>,
    /// Steps left in the current expiry episode.
    episode: Option<u32>,
    /// The seeded steps at which episodes start, soonest first.
    episode_starts: VecDeque<u64>,
    /// Requests to send next (the checks after an `Expire`, the rest of
    /// an episode's first grants).
    pending: VecDeque<Req>,
}

impl Dice for Gen {
    fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }
}

impl Gen {
    fn new(seed: u64, steps: u64) -> Gen {
        let mut rng = StdRng::seed_from_u64(seed);
        let episodes = (steps / 200).max(1);
        let every = steps / episodes;
        let episode_starts = (0..episodes)
            .map(|k| k * every + rng.random_range(0..every.max(2) / 2))
            .collect();
        Gen {
            rng,
            head: 1,
            revs: Vec::new(),
            racy: Vec::new(),
            racy_from: None,
            chosen: 0,
            granted: Vec::new(),
            live: BTreeMap::new(),
            episode: None,
            episode_starts,
            pending: VecDeque::new(),
        }
    }

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

    /// A revision to read at: mostly 0 (the head), else one seen lately,
    /// never one inside an `Expire` wait.
    fn rev(&mut self) -> i64 {
        if self.racy_from.is_some() || self.p(0.7) {
            return 0;
        }
        let r = recent_rev(&mut self.rng, self.head, &self.revs);
        if self.racy.iter().any(|&(a, b)| a < r && r < b) {
            0
        } else {
            r
        }
    }

    /// The short leases live.
    fn shorts(&self) -> Vec<i64> {
        (self.live.iter())
            .filter(|(_, l)| l.short())
            .map(|(&id, _)| id)
            .collect()
    }

    /// A lease to use: mostly a live one (a short one half the time in an
    /// episode), else one granted before (maybe revoked), an explicit one
    /// (maybe never granted), one never granted, or none.
    fn lease(&mut self) -> i64 {
        let shorts = self.shorts();
        if self.episode.is_some() && !shorts.is_empty() && self.p(0.5) {
            return self.pick(&shorts);
        }
        match self.rng.random_range(0..100) {
            0..55 if !self.live.is_empty() => {
                let i = self.rng.random_range(0..self.live.len());
                *self.live.keys().nth(i).expect("in range")
            }
            0..70 if !self.granted.is_empty() => {
                let i = self.rng.random_range(0..self.granted.len());
                self.granted[i]
            }
            0..80 => self.pick(&EXPLICIT_LEASES),
            80..90 => UNKNOWN_LEASE,
            _ => 0,
        }
    }

    /// A grant; `short` (only in an episode) mostly with a short TTL.
    fn grant(&mut self, short: bool) -> Req {
        let ttl = match self.rng.random_range(0..100) {
            0..80 if short => self.pick(&SHORT_TTLS),
            0..88 => self.pick(&LONG_TTLS),
            _ => self.pick(&BAD_TTLS),
        };
        let id = match self.rng.random_range(0..100) {
            0..50 => 0,
            50..80 => self.pick(&EXPLICIT_LEASES),
            // the ID of a server-chosen lease, live or revoked
            80..90 if self.chosen > 0 => LEASE_BASE + self.rng.random_range(0..self.chosen) as i64,
            // a duplicate of a live lease
            _ if !self.live.is_empty() => {
                let i = self.rng.random_range(0..self.live.len());
                *self.live.keys().nth(i).expect("in range")
            }
            _ => 0,
        };
        Req::Grant(LeaseGrantRequest { ttl, id })
    }

    /// A Put; `top` (not inside a nested Txn) allows `ignore_value` and
    /// `ignore_lease`, which etcd 3.4.23 dies on in a nested Txn when the
    /// key is missing.
    fn put(&mut self, top: bool) -> PutRequest {
        let ignore_value = top && self.p(0.05);
        let ignore_lease = top && self.p(0.12);
        PutRequest {
            key: self.key(),
            // Mostly none with ignore_value ("value is provided" otherwise).
            value: if ignore_value && !self.p(0.2) {
                Vec::new()
            } else {
                self.value()
            },
            // Mostly none with ignore_lease ("lease is provided" otherwise).
            lease: if self.p(if ignore_lease { 0.15 } else { 0.7 }) {
                self.lease()
            } else {
                0
            },
            prev_kv: self.p(0.4),
            ignore_value,
            ignore_lease,
        }
    }

    fn range(&mut self) -> RangeRequest {
        let key = self.key();
        RangeRequest {
            range_end: range_end(&mut self.rng, &key, &KEYS),
            key,
            limit: if self.p(0.15) {
                self.rng.random_range(1..3)
            } else {
                0
            },
            revision: self.rev(),
            serializable: self.p(0.3),
            keys_only: self.p(0.1),
            count_only: self.p(0.05),
            ..Default::default()
        }
    }

    /// Every key.
    fn range_all() -> RangeRequest {
        RangeRequest {
            key: vec![0],
            range_end: vec![0],
            ..Default::default()
        }
    }

    fn delete(&mut self) -> DeleteRangeRequest {
        let key = self.key();
        DeleteRangeRequest {
            range_end: if self.p(0.6) {
                Vec::new()
            } else {
                range_end(&mut self.rng, &key, &KEYS)
            },
            key,
            prev_kv: self.p(0.5),
        }
    }

    /// A compare, mostly of a key's lease.
    fn compare(&mut self) -> Compare {
        let key = self.key();
        let range_end = if self.p(0.2) {
            range_end(&mut self.rng, &key, &KEYS)
        } else {
            Vec::new()
        };
        let (target, union) = match self.rng.random_range(0..10) {
            0..7 => (4, compare::TargetUnion::Lease(self.lease())),
            7 => (
                0,
                compare::TargetUnion::Version(self.rng.random_range(0..3)),
            ),
            8 => (3, compare::TargetUnion::Value(self.value())),
            _ => (2, compare::TargetUnion::ModRevision(self.head)),
        };
        Compare {
            result: self.rng.random_range(0..4),
            target,
            key,
            range_end,
            target_union: Some(union),
        }
    }

    /// A Txn: compares, then puts (with leases), deletes, ranges and
    /// nested Txns (`depth` < 2) in either branch.
    fn txn(&mut self, depth: u32) -> TxnRequest {
        let compare = (0..self.rng.random_range(0..3))
            .map(|_| self.compare())
            .collect();
        let ops = |g: &mut Gen| -> Vec<RequestOp> {
            (0..g.rng.random_range(0..4))
                .map(|_| RequestOp {
                    request: Some(match g.rng.random_range(0..20) {
                        0..11 => request_op::Request::RequestPut(g.put(depth == 0)),
                        11..15 => request_op::Request::RequestDeleteRange(g.delete()),
                        15 if depth < 2 => request_op::Request::RequestTxn(g.txn(depth + 1)),
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

    fn keep_alive(&mut self) -> Req {
        let n = self.rng.random_range(1..4);
        Req::KeepAlive {
            stream: self.rng.random_range(0..2),
            fresh: self.p(0.1),
            ids: (0..n).map(|_| self.lease()).collect(),
            pipelined: self.p(0.3),
            close: self.p(0.08),
        }
    }

    /// The `Expire` of the short leases live now.
    fn expire(&self) -> Req {
        Req::Expire { ids: self.shorts() }
    }

    /// When the last short lease live has expired on both servers: its
    /// last grant or renew was answered, plus its TTL.
    fn expired_at(&self) -> Instant {
        (self.live.values())
            .filter(|l| l.short())
            .map(|l| l.answered + Duration::from_secs(l.ttl as u64))
            .max()
            .unwrap_or_else(Instant::now)
    }

    /// The earliest moment a short lease could expire: its last grant or
    /// renew was sent, plus its TTL.
    fn first_expiry(&self) -> Option<Instant> {
        (self.live.values())
            .filter(|l| l.short())
            .map(|l| l.sent + Duration::from_secs(l.ttl as u64))
            .min()
    }

    /// The `n`-th seeded request.
    fn next(&mut self, n: u64) -> Req {
        if let Some(r) = self.pending.pop_front() {
            return r;
        }
        match self.episode {
            Some(left) => {
                let due = self
                    .first_expiry()
                    .is_some_and(|t| Instant::now() + SAFETY >= t);
                if left == 0 || due {
                    self.episode = None;
                    if !self.shorts().is_empty() {
                        return self.expire();
                    }
                } else {
                    self.episode = Some(left - 1);
                }
            }
            None if self.episode_starts.front().is_some_and(|&s| n >= s) => {
                self.episode_starts.pop_front();
                self.episode = Some(self.rng.random_range(5..30));
                for _ in 1..self.rng.random_range(1..4) {
                    let g = self.short_grant();
                    self.pending.push_back(g);
                }
                return self.short_grant();
            }
            None => {}
        }
        let in_episode = self.episode.is_some();
        match self.rng.random_range(0..100) {
            0..22 => Req::Put(self.put(true)),
            22..36 => Req::Range(self.range()),
            36..44 => Req::Delete(self.delete()),
            44..56 => Req::Txn(self.txn(0)),
            56..68 => self.grant(in_episode),
            68..76 => Req::Revoke(LeaseRevokeRequest { id: self.lease() }),
            76..88 => Req::TimeToLive(LeaseTimeToLiveRequest {
                id: self.lease(),
                keys: self.p(0.6),
            }),
            88..92 => Req::Leases,
            _ => self.keep_alive(),
        }
    }

    /// A grant that starts an episode: a short TTL, ID 0 or explicit.
    fn short_grant(&mut self) -> Req {
        Req::Grant(LeaseGrantRequest {
            ttl: self.pick(&SHORT_TTLS),
            id: if self.p(0.5) {
                0
            } else {
                self.pick(&EXPLICIT_LEASES)
            },
        })
    }

    /// Learns from the reference's (normalised) answer to `req`, sent at
    /// `sent` and answered (by both servers) at `answered`.
    fn learn(&mut self, req: &Req, a: &Answer, sent: Instant, answered: Instant) {
        if let Req::Expire { ids } = req {
            self.racy_from = Some(self.head);
            let still: &[i64] = match a {
                Ok(Resp::Expire(still)) => still,
                _ => &[],
            };
            for id in ids {
                if !still.contains(id) {
                    self.live.remove(id);
                }
                self.pending
                    .push_back(Req::TimeToLive(LeaseTimeToLiveRequest {
                        id: *id,
                        keys: true,
                    }));
            }
            self.pending.push_back(Req::Range(Gen::range_all()));
            self.pending.push_back(Req::Leases);
            return;
        }
        let Ok(r) = a else { return };
        let head = |h: &Option<ResponseHeader>| h.as_ref().map_or(0, |h| h.revision);
        let mut revs = Vec::new();
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
            Resp::Grant(r) => head(&r.header),
            Resp::Revoke(r) => head(&r.header),
            Resp::TimeToLive(r) => head(&r.header),
            Resp::Leases(r) => head(&r.header),
            Resp::KeepAlive(rs) => (rs.iter().flatten())
                .map(|r| head(&r.header))
                .max()
                .unwrap_or(0),
            Resp::Expire(_) => 0,
        };
        if h > 0 {
            if let Some(from) = self.racy_from.take() {
                self.racy.push((from, h));
            }
            self.head = self.head.max(h);
            revs.push(h);
        }
        match (req, r) {
            (Req::Grant(_), Resp::Grant(g)) => {
                if g.id == LEASE_BASE + self.chosen as i64 {
                    self.chosen += 1;
                }
                if !self.granted.contains(&g.id) {
                    self.granted.push(g.id);
                }
                let l = Live {
                    ttl: g.ttl,
                    sent,
                    answered,
                };
                self.live.insert(g.id, l);
            }
            (Req::Revoke(q), Resp::Revoke(_)) => {
                self.live.remove(&q.id);
            }
            (Req::KeepAlive { .. }, Resp::KeepAlive(rs)) => {
                for r in rs.iter().flatten().filter(|r| r.ttl > 0) {
                    if let Some(l) = self.live.get_mut(&r.id) {
                        l.sent = sent;
                        l.answered = answered;
                    }
                }
            }
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
/// escaped string (`"a/b"`) and every lease placeholder as
/// `lease#<grant order>`.
fn readable(debug: &str) -> String {
    bytes_as_strings(&placeholder_names(debug, LEASE_BASE, "lease"))
}

fn show(a: &Answer) -> String {
    match a {
        Ok(r) => readable(&format!("{r:?}")),
        Err((code, msg)) => format!("error {code:?}: {msg:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_random_differential() {
    let seed = env_u64("RETCD_LEASE_DIFF_SEED", 1);
    let steps = env_u64("RETCD_LEASE_DIFF_STEPS", 400);
    let trace = std::env::var_os("RETCD_LEASE_DIFF_TRACE").is_some();
    let mut g = Gen::new(seed, steps);
    // A long run gets more time than the default one (each episode waits
    // about a minimum TTL).
    let episodes = g.episode_starts.len() as u64 + 1;
    let limit = LIMIT.max(Duration::from_millis(steps * 100) + Duration::from_secs(episodes * 15));
    bounded(limit, async {
        let flavor = test_flavor();
        // Another binary of the flavour as the target (e.g. etcd 3.5.1's
        // with RETCD_TEST_FLAVOR=etcd), to tell old etcd's answers from
        // newer ones.
        let bin = std::env::var_os("RETCD_LEASE_DIFF_TARGET_BIN")
            .map_or_else(|| flavor.binary(), std::path::PathBuf::from);
        let (reference, target) = tokio::join!(
            Cluster::start(Flavor::Etcd, 1, FLAGS),
            Cluster::start_with_binary(flavor, bin, 1, FLAGS),
        );
        let reference = reference.expect("start reference etcd");
        let target = target.expect("start target");
        let tname = flavor.name();
        let (mut r, mut t) = (
            Server::connect(&reference).await,
            Server::connect(&target).await,
        );
        let started = Instant::now();
        let (mut diffs, mut shown, mut errors) = (0usize, Vec::new(), BTreeMap::new());
        let (mut expires, mut slept) = (0usize, Duration::ZERO);
        // remaining TTLs that differed within the tolerance: a handful at
        // most (a second boundary between the two servers' clocks); many
        // would mean a systematic difference, e.g. rounding
        let mut ttl_off = 0usize;
        let fixed = prelude();
        let total = fixed.len() as u64 + steps;
        for n in 0..total {
            let mut req = match fixed.get(n as usize) {
                Some(req) => req.clone(),
                None => g.next(n - fixed.len() as u64),
            };
            if let Req::Expire { ids } = &req {
                if ids.is_empty() {
                    req = g.expire(); // the prelude's
                }
                let until = g.expired_at();
                let now = Instant::now();
                if until > now {
                    tokio::time::sleep(until - now).await;
                    slept += until - now;
                }
                expires += 1;
            }
            let sent = Instant::now();
            let (ra, ta) = tokio::join!(r.call(&req), t.call(&req));
            let answered = Instant::now();
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
            if ra != ta && same(&ra, &ta) {
                ttl_off += 1;
            }
            if !same(&ra, &ta) {
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
            g.learn(&req, &ra, sent, answered);
        }
        eprintln!(
            "lease_random_differential: etcd vs {tname}, seed {seed}: {total} steps in {:.1?} \
             ({expires} expiry waits, {slept:.1?} asleep; {} answered with an error by etcd: \
             {errors:?}), head revision {}, {} leases granted, {ttl_off} remaining TTLs 1 s \
             apart, {diffs} differing steps",
            started.elapsed(),
            errors.values().sum::<usize>(),
            g.head,
            g.granted.len()
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

/// Steps every run starts with: the edge cases, each once, and one expiry
/// episode (its `Expire` is followed by the generated checks).
fn prelude() -> Vec<Req> {
    let grant = |ttl: i64, id: i64| Req::Grant(LeaseGrantRequest { ttl, id });
    let put = |k: &[u8], lease: i64| {
        Req::Put(PutRequest {
            key: k.to_vec(),
            value: b"v".to_vec(),
            lease,
            ..Default::default()
        })
    };
    let ttl = |id: i64, keys: bool| Req::TimeToLive(LeaseTimeToLiveRequest { id, keys });
    let revoke = |id: i64| Req::Revoke(LeaseRevokeRequest { id });
    let l0 = LEASE_BASE; // the first lease a server chooses
    let l1 = LEASE_BASE + 1;
    vec![
        grant(LONG, 0),
        grant(9_000_000_001, 0), // too large
        grant(i64::MAX, 0x1001), // too large
        grant(9_000_000_000, 0x1001),
        grant(LONG, 0x1001), // exists
        grant(LONG, -1),
        grant(7200, l0), // exists
        put(b"a", l0),
        put(b"b", 0x1001),
        put(b"c", UNKNOWN_LEASE), // not found
        put(b"a/b", -1),
        // keeps a's lease; with a lease: "lease is provided"
        Req::Put(PutRequest {
            key: b"a".to_vec(),
            value: b"w".to_vec(),
            ignore_lease: true,
            ..Default::default()
        }),
        Req::Put(PutRequest {
            key: b"b".to_vec(),
            value: b"w".to_vec(),
            lease: 0x1001,
            ignore_lease: true,
            ..Default::default()
        }),
        // ignore_lease on a missing key
        Req::Put(PutRequest {
            key: b"z".to_vec(),
            value: b"w".to_vec(),
            ignore_lease: true,
            ..Default::default()
        }),
        Req::Range(Gen::range_all()),
        ttl(l0, true),
        ttl(0x1001, false),
        ttl(UNKNOWN_LEASE, true),
        ttl(0, false),
        Req::Leases,
        Req::KeepAlive {
            stream: 0,
            fresh: false,
            ids: vec![l0, UNKNOWN_LEASE, 0x1001, 0],
            pipelined: false,
            close: false,
        },
        Req::KeepAlive {
            stream: 1,
            fresh: false,
            ids: vec![-1],
            pipelined: false,
            close: true,
        },
        revoke(UNKNOWN_LEASE),
        revoke(0),
        revoke(-1), // deletes a/b
        revoke(-1),
        Req::Range(Gen::range_all()),
        // an episode: short leases (TTL 0, 1, -1 granted as the minimum)
        grant(0, 0x1002),
        grant(1, 0),
        grant(6, 0x1003),
        grant(-1, 0x1004), // no keys: its expiry writes nothing
        put(b"ab", 0x1002),
        put(b"\xff", 0x1002),
        put(b"c", l1),
        Req::Put(PutRequest {
            key: b"c".to_vec(),
            value: b"w".to_vec(),
            ignore_lease: true,
            ..Default::default()
        }),
        put(b"ab", 0), // detached: outlives 0x1002
        Req::Txn(TxnRequest {
            compare: vec![Compare {
                target: 4, // LEASE
                result: 0, // EQUAL
                key: b"c".to_vec(),
                target_union: Some(compare::TargetUnion::Lease(l1)),
                ..Default::default()
            }],
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: b"a/b".to_vec(),
                    value: b"t".to_vec(),
                    lease: 0x1003,
                    ..Default::default()
                })),
            }],
            failure: vec![],
        }),
        ttl(0x1002, true),
        ttl(l1, true),
        ttl(0x1003, true),
        Req::KeepAlive {
            stream: 0,
            fresh: false,
            ids: vec![0x1002, 0x1004, UNKNOWN_LEASE],
            pipelined: true,
            close: false,
        },
        Req::Expire { ids: Vec::new() },
    ]
}

#[test]
fn readable_names_leases_and_normalise_sorts() {
    let l = LEASE_BASE + 3;
    assert_eq!(
        readable(&format!(
            "Put {{ key: [97, 47, 98], lease: {l}, n: 12 }} {}",
            l - 4
        )),
        format!("Put {{ key: \"a/b\", lease: lease#3, n: 12 }} {}", l - 4)
    );
    let mut a: Answer = Ok(Resp::TimeToLive(LeaseTimeToLiveResponse {
        id: 77,
        ttl: 9,
        keys: vec![b"b".to_vec(), b"a".to_vec()],
        ..Default::default()
    }));
    normalise(&mut a, &[5, 77]);
    let Ok(Resp::TimeToLive(r)) = &a else {
        panic!("{a:?}")
    };
    assert_eq!(
        (r.id, r.keys.clone()),
        (l - 2, vec![b"a".to_vec(), b"b".to_vec()])
    );
    let near = Ok(Resp::TimeToLive(LeaseTimeToLiveResponse {
        ttl: 8,
        ..r.clone()
    }));
    let gone = Ok(Resp::TimeToLive(LeaseTimeToLiveResponse {
        ttl: -1,
        ..r.clone()
    }));
    assert!(same(&a, &near));
    assert!(!same(&a, &gone));
}
