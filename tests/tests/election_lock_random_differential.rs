//! A seeded random *content* differential test of the lock and election
//! services (`v3lockpb.Lock`, `v3electionpb.Election`): the same sequence
//! of requests is sent to a fresh 1-node real etcd 3.4.23 (the reference)
//! and a fresh 1-node target (retcd by default; `RETCD_TEST_FLAVOR=etcd`
//! makes it a second etcd, which checks the test itself), both empty and
//! started with the same flags.
//!
//! The requests: Campaign, Proclaim, Leader, Resign and Observe over a few
//! election names, Lock and Unlock over a few lock names (`e` and `e/x`,
//! `l` and `l/x`: each a prefix of the other's keys; the empty name; a
//! binary one; names of one kind used by the other now and then), with
//! "sessions" that are leases: granted by the test with IDs of its own (a
//! negative one included) or chosen by the server, live or revoked, never
//! granted (`0xbad`, `-1`), or 0 (etcd's services then grant a session
//! lease themselves, even for Proclaim and Resign). Proclaim and Resign get
//! leader keys a Campaign returned (held or stale) or forged ones (another
//! rev, lease, key or name, none at all); Unlock gets held, unlocked,
//! unknown and empty keys and election keys. KV Put, DeleteRange and Range
//! on the services' prefixes, LeaseGrant, LeaseRevoke (of holders and
//! waiters) and LeaseLeases are mixed in.
//!
//! Blocking calls. A Campaign or Lock is started in the background; the
//! test waits until it has answered or until the server's
//! `etcd_debugging_mvcc_watcher_total` gauge shows its wait registered
//! (etcd's recipe waits on a watch), so the write it made precedes the
//! next step. It is then *pending* (the step's answer says so). After
//! every step, each server's pending calls are checked against the store
//! (its own Range): a call no key created before its own blocks any more
//! must answer, and the test waits for it before the next step; so both
//! servers must agree at which step which waiter wins, and with what.
//! A pending call has no deadline of its own (at its deadline etcd would
//! delete its key, at a time the test cannot order): the run's bound
//! covers it, and the run's end aborts it.
//! An Observe is compared by its first response: when the election has a
//! leader, at once; otherwise it is pending (its watch registered, by the
//! same gauge) until a key appears under the election's prefix. The stream
//! is closed after its first response.
//!
//! Each step compares, per server: the answer (the response, or the gRPC
//! code and message; or "pending"); the pending calls that answered during
//! the step, with their answers; the leases that appeared or went away
//! (LeaseLeases before and after); every key the step created, changed or
//! deleted (a Range of the whole store before and after), with all its
//! fields. The test's own reads (store, leases, a pending call's prefix)
//! go on a second connection, so what happens to the first one does not
//! blind them. Revisions are compared exactly: both stores get the same
//! writes. Normalised, as two etcd processes differ by nature:
//! * every header loses its cluster ID, member ID and raft term;
//! * a lease ID the server chose (a new ID in LeaseLeases after a step,
//!   whether the test asked for it with ID 0 or a service granted a
//!   session lease) becomes a placeholder named by that step
//!   ([`LEASE_BASE`]), in lease fields and in key names
//!   (`name/<hex lease>`); requests carry placeholders, which the test maps
//!   to each server's own ID;
//! * LeaseLeases is sorted (etcd lists in map order), and so are a Range's
//!   and a DeleteRange's kvs by their normalised keys (the servers' own
//!   lease IDs sort differently; key order itself is
//!   `kv_random_differential`'s).
//!
//! No lease expires during a run: the test's leases have an hour, and
//! every live lease gets a keep-alive every [`KEEPALIVE_EVERY`] (etcd's
//! session leases have 60 s); remaining TTLs are not compared. The
//! watcher gauge is not compared either, only counted in the summary
//! line (times it settled above the pending calls' waits).
//!
//! Left out on purpose: cancelling a pending call (both servers then
//! delete its key, at a time the test cannot order against its own
//! writes); compaction (it does not change these recipes' answers); an
//! Observe's responses after its first (when the server's observer loop
//! looks again after a leader's key goes is not ordered against the
//! test's next write).
//!
//! A run starts with a fixed [`prelude`]: a scenario with a waiter of each
//! kind, then the differences found so far, each reduced to a few steps.
//! `RETCD_ELECTION_DIFF_SEED` (default 1) and `RETCD_ELECTION_DIFF_STEPS`
//! (default 500) replay and size a run; `RETCD_ELECTION_DIFF_TRACE=1`
//! prints every step and both outcomes.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use retcd_api::etcdserverpb::{
    kv_client::KvClient, lease_client::LeaseClient, DeleteRangeRequest, DeleteRangeResponse,
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseLeasesRequest,
    LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse, PutRequest, PutResponse,
    RangeRequest, RangeResponse, ResponseHeader,
};
use retcd_api::mvccpb::KeyValue;
use retcd_api::v3electionpb::{
    election_client::ElectionClient, CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest,
    LeaderResponse, ProclaimRequest, ProclaimResponse, ResignRequest, ResignResponse,
};
use retcd_api::v3lockpb::{
    lock_client::LockClient, LockRequest, LockResponse, UnlockRequest, UnlockResponse,
};
use retcd_tests::random_diff::{answer, bytes_as_strings, env_u64, prefix_end, Dice};
use retcd_tests::{bounded, http_get, limit::NORMAL as LIMIT, test_flavor, Cluster, Flavor, FAST};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout};
use tonic::transport::Channel;

/// Each unary call's bound.
const CALL: Duration = Duration::from_secs(10);

/// The longest wait for something expected: a pending call the store lets
/// answer, a background call's answer or registered wait, an Observe's
/// first response. A server that never does it costs this much, once.
const WAIT: Duration = Duration::from_secs(5);

/// The longest wait for the watcher gauge to show what the test expects.
const GAUGE_WAIT: Duration = Duration::from_secs(3);

/// How often every live lease gets a keep-alive.
const KEEPALIVE_EVERY: Duration = Duration::from_secs(15);

/// Differing steps printed at most (the count is always given).
const MAX_SHOWN: usize = 20;

/// Pending calls (on the reference) from which on the generator only
/// unblocks.
const MAX_PENDING: usize = 4;

/// Election names: `e/x`'s keys are under `e/`, so its candidates compete
/// in `e`'s election too (etcd's recipes only look at the prefix).
const ELECTIONS: [&[u8]; 4] = [b"e", b"e/x", b"", b"\xff\x00"];

/// Lock names, likewise; the empty and the binary name are shared with
/// the elections (same prefix, so same queue).
const LOCKS: [&[u8]; 4] = [b"l", b"l/x", b"", b"\xff\x00"];

/// Campaign and Proclaim values.
const VALUES: [&[u8]; 4] = [b"", b"v1", b"v2", b"\xff"];

/// Lease IDs the test grants explicitly (a negative one: etcd accepts it
/// and names keys `name/-1005`, as Go's `%x` prints a negative number).
const EXPLICIT_LEASES: [i64; 4] = [0x1001, 0x1002, 0x1003, -0x1005];

/// A lease ID never granted.
const UNKNOWN_LEASE: i64 = 0x0bad;

/// The base of the placeholders of server-chosen leases: the `k`-th new
/// lease found after step `n` is `LEASE_BASE + n * 16 + k` (shown as
/// `lease@n`, `lease@n.k`), what requests carry and what answers show in
/// its place (in key names as its hex, `4c454153........`). Named by step,
/// a lease only one server granted shifts no other lease's name.
const LEASE_BASE: i64 = 0x4c45_4153_0000_0000;

/// The placeholder of the first lease a server chose during step `n`.
fn chosen_at(n: u64) -> i64 {
    LEASE_BASE + (n as i64) * 16
}

/// The answer of a background call whose task ended without one.
fn died() -> Answer {
    Err((tonic::Code::Internal, "(test: call task died)".into()))
}

/// Go's `%x` of an int64 (etcd's session key suffix): a minus sign for a
/// negative number.
fn go_hex(id: i64) -> String {
    if id < 0 {
        format!("-{:x}", (id as i128).unsigned_abs())
    } else {
        format!("{id:x}")
    }
}

/// The election or lock prefix of `name`: `name/`.
fn slash(name: &[u8]) -> Vec<u8> {
    [name, b"/"].concat()
}

/// `name/<hex lease>`: a session's key.
fn session_key(name: &[u8], lease: i64) -> Vec<u8> {
    [name, b"/", go_hex(lease).as_bytes()].concat()
}

/// One request of the sequence.
#[derive(Debug, Clone)]
enum Req {
    Grant(LeaseGrantRequest),
    Revoke(LeaseRevokeRequest),
    Leases,
    Campaign(CampaignRequest),
    Proclaim(ProclaimRequest),
    Leader(LeaderRequest),
    Resign(ResignRequest),
    Observe(LeaderRequest),
    Lock(LockRequest),
    Unlock(UnlockRequest),
    Range(RangeRequest),
    Put(PutRequest),
    Delete(DeleteRangeRequest),
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq)]
enum Resp {
    Grant(LeaseGrantResponse),
    Revoke(LeaseRevokeResponse),
    Leases(LeaseLeasesResponse),
    Campaign(CampaignResponse),
    Proclaim(ProclaimResponse),
    Leader(LeaderResponse),
    Resign(ResignResponse),
    /// An Observe stream's first response.
    Observed(LeaderResponse),
    /// An Observe stream that ended without a response.
    ObserveEnded,
    Lock(LockResponse),
    Unlock(UnlockResponse),
    Range(RangeResponse),
    Put(PutResponse),
    Delete(DeleteRangeResponse),
    /// A Campaign or Lock still waiting, an Observe without a response yet.
    Pending,
}

/// An answer: the response, or the gRPC code and message.
type Answer = Result<Resp, (tonic::Code, String)>;

/// What one step did on one server, normalised: what is compared.
#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    answer: Answer,
    /// Pending calls (by the step that started them) that answered during
    /// this step.
    answered: Vec<(u64, Answer)>,
    /// Leases that appeared during the step.
    leases_added: Vec<i64>,
    /// Leases that went away during the step.
    leases_gone: Vec<i64>,
    /// Keys the step created or changed (their new state), or deleted
    /// (`None`).
    store: Vec<(Vec<u8>, Option<KeyValue>)>,
}

/// What a background call waits for.
enum Waits {
    /// A Campaign or Lock: that no key under `pfx` was created before
    /// `rev`, its own key's create revision (unknown if its key was gone
    /// when it started waiting).
    Deletes { pfx: Vec<u8>, rev: Option<i64> },
    /// An Observe without a leader: a key under `pfx`.
    Put { pfx: Vec<u8> },
}

/// A call left running in the background.
struct Bg {
    /// The step that started it.
    step: u64,
    waits: Waits,
    rx: oneshot::Receiver<Answer>,
    task: JoinHandle<()>,
    /// The store let it answer once and it did not: not waited for again.
    stuck: bool,
}

/// One server: its channels, metrics port, what the test learnt of it.
struct Server {
    /// The connection the sequence's requests go on.
    chan: Channel,
    /// Another connection, for the test's own reads (the store, the
    /// leases, a pending call's prefix): whatever happens to the first one
    /// (see [`prelude`]), they see the server's state.
    aux: Channel,
    port: u16,
    /// The lease IDs this server chose, with their placeholders.
    chosen: Vec<(i64, i64)>,
    /// The step running.
    now: u64,
    /// Its leases at the last look.
    leases: BTreeSet<i64>,
    /// Its store at the last look.
    store: BTreeMap<Vec<u8>, KeyValue>,
    /// Its pending background calls, oldest first.
    pending: Vec<Bg>,
    /// Times the watcher gauge did not settle, or a call neither answered
    /// nor showed its wait in time.
    gauge_misses: usize,
    /// Times the watcher gauge settled above the pending calls' waits.
    gauge_extra: usize,
    last_keepalive: Instant,
}

impl Server {
    async fn connect(c: &Cluster) -> Server {
        let connect = || async {
            Channel::from_shared(c.members[0].endpoint())
                .expect("url")
                .connect()
                .await
                .expect("connect")
        };
        Server {
            chan: connect().await,
            aux: connect().await,
            port: c.members[0].client_port,
            chosen: Vec::new(),
            now: 0,
            leases: BTreeSet::new(),
            store: BTreeMap::new(),
            pending: Vec::new(),
            gauge_misses: 0,
            gauge_extra: 0,
            last_keepalive: Instant::now(),
        }
    }

    /// A lease ID as answers show it: a chosen one as its placeholder.
    fn norm_lease(&self, id: i64) -> i64 {
        match self.chosen.iter().find(|c| c.0 == id) {
            Some(c) => c.1,
            None => id,
        }
    }

    /// A lease ID as this server knows it: a placeholder as its own ID (a
    /// placeholder it has no lease for stays as it is).
    fn real_lease(&self, id: i64) -> i64 {
        match self.chosen.iter().find(|c| c.1 == id) {
            Some(c) => c.0,
            None => id,
        }
    }

    /// A key as answers show it: a suffix `/<hex of a chosen lease>` as
    /// the placeholder's hex.
    fn norm_key(&self, key: &[u8]) -> Vec<u8> {
        self.map_suffix(key, |id| self.norm_lease(id))
    }

    /// A key as this server knows it (the inverse of [`Self::norm_key`]).
    fn real_key(&self, key: &[u8]) -> Vec<u8> {
        self.map_suffix(key, |id| self.real_lease(id))
    }

    /// `key` with a suffix after its last `/` that is a lease's hex
    /// replaced by `f(lease)`'s.
    fn map_suffix(&self, key: &[u8], f: impl Fn(i64) -> i64) -> Vec<u8> {
        let Some(at) = key.iter().rposition(|&b| b == b'/') else {
            return key.to_vec();
        };
        let Ok(hex) = std::str::from_utf8(&key[at + 1..]) else {
            return key.to_vec();
        };
        let id = match hex.strip_prefix('-') {
            Some(h) => i64::from_str_radix(h, 16).map(|v| -v),
            None => u64::from_str_radix(hex, 16).map(|v| v as i64),
        };
        match id {
            // only the canonical spelling (no leading zeros, lower case)
            Ok(id) if go_hex(id) == hex => [&key[..=at], go_hex(f(id)).as_bytes()].concat(),
            _ => key.to_vec(),
        }
    }

    fn norm_kv(&self, kv: &mut KeyValue) {
        kv.key = self.norm_key(&kv.key).into();
        kv.lease = self.norm_lease(kv.lease);
    }

    fn norm_leader(&self, l: &mut LeaderKey) {
        l.key = self.norm_key(&l.key);
        l.lease = self.norm_lease(l.lease);
    }

    /// The answer as compared: headers without cluster ID, member ID and
    /// raft term; server-chosen lease IDs (in fields and key names) as
    /// their placeholders; LeaseLeases sorted; a Range's or DeleteRange's
    /// kvs sorted by their keys so named (the servers' own IDs sort
    /// otherwise).
    fn normalise(&self, a: &mut Answer) {
        fn header(h: &mut Option<ResponseHeader>) {
            if let Some(h) = h {
                h.cluster_id = 0;
                h.member_id = 0;
                h.raft_term = 0;
            }
        }
        let Ok(r) = a else { return };
        match r {
            Resp::Grant(r) => {
                header(&mut r.header);
                r.id = self.norm_lease(r.id);
            }
            Resp::Revoke(r) => header(&mut r.header),
            Resp::Leases(r) => {
                header(&mut r.header);
                for l in &mut r.leases {
                    l.id = self.norm_lease(l.id);
                }
                r.leases.sort_by_key(|l| l.id);
            }
            Resp::Campaign(r) => {
                header(&mut r.header);
                if let Some(l) = &mut r.leader {
                    self.norm_leader(l);
                }
            }
            Resp::Proclaim(r) => header(&mut r.header),
            Resp::Leader(r) | Resp::Observed(r) => {
                header(&mut r.header);
                if let Some(kv) = &mut r.kv {
                    self.norm_kv(kv);
                }
            }
            Resp::Resign(r) => header(&mut r.header),
            Resp::Lock(r) => {
                header(&mut r.header);
                r.key = self.norm_key(&r.key);
            }
            Resp::Unlock(r) => header(&mut r.header),
            Resp::Range(r) => {
                header(&mut r.header);
                r.kvs.iter_mut().for_each(|kv| self.norm_kv(kv));
                r.kvs.sort_by(|a, b| a.key.cmp(&b.key));
            }
            Resp::Put(r) => {
                header(&mut r.header);
                r.prev_kv.iter_mut().for_each(|kv| self.norm_kv(kv));
            }
            Resp::Delete(r) => {
                header(&mut r.header);
                r.prev_kvs.iter_mut().for_each(|kv| self.norm_kv(kv));
                r.prev_kvs.sort_by(|a, b| a.key.cmp(&b.key));
            }
            Resp::ObserveEnded | Resp::Pending => {}
        }
    }

    /// `req` with every placeholder (lease fields, key names) replaced by
    /// this server's own ID.
    fn materialise(&self, req: &Req) -> Req {
        let leader = |l: &mut Option<LeaderKey>| {
            if let Some(l) = l {
                l.key = self.real_key(&l.key);
                l.lease = self.real_lease(l.lease);
            }
        };
        let mut req = req.clone();
        match &mut req {
            Req::Revoke(r) => r.id = self.real_lease(r.id),
            Req::Campaign(r) => r.lease = self.real_lease(r.lease),
            Req::Proclaim(r) => leader(&mut r.leader),
            Req::Resign(r) => leader(&mut r.leader),
            Req::Lock(r) => r.lease = self.real_lease(r.lease),
            Req::Unlock(r) => r.key = self.real_key(&r.key),
            Req::Range(r) => r.key = self.real_key(&r.key),
            Req::Put(r) => {
                r.key = self.real_key(&r.key);
                r.lease = self.real_lease(r.lease);
            }
            Req::Delete(r) => r.key = self.real_key(&r.key),
            Req::Grant(_) | Req::Leases | Req::Leader(_) | Req::Observe(_) => {}
        }
        req
    }

    /// Runs step `n` (`req`) and everything it let happen; its outcome,
    /// normalised.
    async fn step(&mut self, n: u64, req: &Req) -> Outcome {
        self.now = n;
        self.keepalive().await;
        let leases_before = self.leases.clone();
        let store_before = self.store.clone();
        let mut a = match self.materialise(req) {
            Req::Campaign(r) => {
                let (name, lease) = (r.name.clone(), r.lease);
                let chan = self.chan.clone();
                let call = async move {
                    let mut c = ElectionClient::new(chan);
                    answer(Ok(c.campaign(r).await), Resp::Campaign)
                };
                self.start_call(n, &name, lease, call).await
            }
            Req::Lock(r) => {
                let (name, lease) = (r.name.clone(), r.lease);
                let chan = self.chan.clone();
                let call = async move {
                    let mut c = LockClient::new(chan);
                    answer(Ok(c.lock(r).await), Resp::Lock)
                };
                self.start_call(n, &name, lease, call).await
            }
            Req::Observe(r) => self.start_observe(n, r).await,
            req => self.unary(req).await,
        };
        let mut answered = self.settle().await;
        self.look_at_leases().await;
        self.look_at_store().await;
        self.normalise(&mut a);
        for (_, a) in &mut answered {
            self.normalise(a);
        }
        let leases_added = (self.leases.difference(&leases_before))
            .map(|&l| self.norm_lease(l))
            .collect();
        let leases_gone = (leases_before.difference(&self.leases))
            .map(|&l| self.norm_lease(l))
            .collect();
        let mut store = Vec::new();
        for (k, kv) in &self.store {
            if store_before.get(k) != Some(kv) {
                let mut kv = kv.clone();
                self.norm_kv(&mut kv);
                store.push((self.norm_key(k), Some(kv)));
            }
        }
        for k in store_before.keys() {
            if !self.store.contains_key(k) {
                store.push((self.norm_key(k), None));
            }
        }
        store.sort_by(|a, b| a.0.cmp(&b.0));
        Outcome {
            answer: a,
            answered,
            leases_added,
            leases_gone,
            store,
        }
    }

    /// A call that answers at once.
    async fn unary(&mut self, req: Req) -> Answer {
        let mut kv = KvClient::new(self.chan.clone());
        let mut ls = LeaseClient::new(self.chan.clone());
        let mut el = ElectionClient::new(self.chan.clone());
        let mut lk = LockClient::new(self.chan.clone());
        match req {
            Req::Grant(r) => answer(timeout(CALL, ls.lease_grant(r)).await, Resp::Grant),
            Req::Revoke(r) => answer(timeout(CALL, ls.lease_revoke(r)).await, Resp::Revoke),
            Req::Leases => answer(
                timeout(CALL, ls.lease_leases(LeaseLeasesRequest {})).await,
                Resp::Leases,
            ),
            Req::Proclaim(r) => answer(timeout(CALL, el.proclaim(r)).await, Resp::Proclaim),
            Req::Leader(r) => answer(timeout(CALL, el.leader(r)).await, Resp::Leader),
            Req::Resign(r) => answer(timeout(CALL, el.resign(r)).await, Resp::Resign),
            Req::Unlock(r) => answer(timeout(CALL, lk.unlock(r)).await, Resp::Unlock),
            Req::Range(r) => answer(timeout(CALL, kv.range(r)).await, Resp::Range),
            Req::Put(r) => answer(timeout(CALL, kv.put(r)).await, Resp::Put),
            Req::Delete(r) => answer(timeout(CALL, kv.delete_range(r)).await, Resp::Delete),
            Req::Campaign(_) | Req::Lock(_) | Req::Observe(_) => {
                unreachable!("background calls are started elsewhere")
            }
        }
    }

    /// Starts a Campaign or Lock (`call`, for session `lease`, whose key
    /// is `name/<hex lease>`) in the background: its answer, or `Pending`
    /// once its wait is registered.
    async fn start_call(
        &mut self,
        n: u64,
        name: &[u8],
        lease: i64,
        call: impl Future<Output = Answer> + Send + 'static,
    ) -> Answer {
        let pfx = slash(name);
        let waits = Waits::Deletes {
            pfx: pfx.clone(),
            rev: None,
        };
        let mut bg = match self.start(n, waits, call).await {
            Ok(a) => return a,
            Err(bg) => bg,
        };
        // Waiting: on which revision? Its key's create revision (with
        // lease 0, the key of the session lease the server granted).
        let lease = if lease == 0 {
            let before = self.leases.clone();
            self.look_at_leases().await;
            self.leases.difference(&before).next().copied().unwrap_or(0)
        } else {
            lease
        };
        let rev = self
            .range(RangeRequest {
                key: session_key(name, lease),
                ..Default::default()
            })
            .await
            .and_then(|r| r.kvs.first().map(|kv| kv.create_revision));
        bg.waits = Waits::Deletes { pfx, rev };
        self.pending.push(bg);
        Ok(Resp::Pending)
    }

    /// Starts an Observe: its first response if the election has a leader
    /// (etcd answers with it at once), else `Pending` once its watch is
    /// registered.
    async fn start_observe(&mut self, n: u64, r: LeaderRequest) -> Answer {
        let pfx = slash(&r.name);
        let chan = self.chan.clone();
        let call = async move {
            let mut c = ElectionClient::new(chan);
            let s = match c.observe(r).await {
                Ok(s) => s,
                Err(s) => return Err((s.code(), s.message().to_string())),
            };
            // the stream is dropped (closed) after its first response
            match s.into_inner().message().await {
                Ok(Some(m)) => Ok(Resp::Observed(m)),
                Ok(None) => Ok(Resp::ObserveEnded),
                Err(s) => Err((s.code(), s.message().to_string())),
            }
        };
        if self.has_keys(&pfx, 0).await {
            let (tx, rx) = oneshot::channel();
            let task = tokio::spawn(async move {
                let _ = tx.send(call.await);
            });
            return match timeout(WAIT, rx).await {
                Ok(a) => a.unwrap_or_else(|_| died()),
                Err(_) => {
                    task.abort();
                    Err((
                        tonic::Code::DeadlineExceeded,
                        "(test: no first response)".into(),
                    ))
                }
            };
        }
        match self.start(n, Waits::Put { pfx }, call).await {
            Ok(a) => a,
            Err(bg) => {
                self.pending.push(bg);
                Ok(Resp::Pending)
            }
        }
    }

    /// Spawns `call` once the watcher gauge shows every pending call's
    /// wait and nothing else, then waits until it answers (its answer) or
    /// one watcher more shows (the call, still running), bounded by
    /// [`WAIT`].
    async fn start(
        &mut self,
        n: u64,
        waits: Waits,
        call: impl Future<Output = Answer> + Send + 'static,
    ) -> Result<Answer, Bg> {
        let base = self.steady_gauge(self.pending.len() as f64).await;
        let (tx, mut rx) = oneshot::channel();
        let task = tokio::spawn(async move {
            let _ = tx.send(call.await);
        });
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(a) = timeout(Duration::from_millis(20), &mut rx).await {
                return Ok(a.unwrap_or_else(|_| died()));
            }
            if self.gauge().await.is_some_and(|g| g > base) {
                break;
            }
            if Instant::now() >= deadline {
                self.gauge_misses += 1;
                break;
            }
        }
        Err(Bg {
            step: n,
            waits,
            rx,
            task,
            stuck: false,
        })
    }

    /// The watcher gauge once steady (bounded by [`GAUGE_WAIT`]): `want`
    /// (the pending calls' waits) twice in a row, or another value four
    /// times in a row (watchers the test does not know of: counted in
    /// `gauge_extra`).
    async fn steady_gauge(&mut self, want: f64) -> f64 {
        let deadline = Instant::now() + GAUGE_WAIT;
        let (mut last, mut same) = (None, 0);
        while Instant::now() < deadline {
            let g = self.gauge().await;
            same = if g == last { same + 1 } else { 1 };
            last = g;
            match g {
                Some(g) if g == want && same >= 2 => return g,
                Some(g) if same >= 4 => {
                    self.gauge_extra += 1;
                    return g;
                }
                _ => {}
            }
            sleep(Duration::from_millis(15)).await;
        }
        self.gauge_misses += 1;
        last.unwrap_or(want)
    }

    /// `etcd_debugging_mvcc_watcher_total`.
    async fn gauge(&self) -> Option<f64> {
        let port = self.port;
        let m =
            tokio::task::spawn_blocking(move || http_get(port, "/metrics", Duration::from_secs(2)))
                .await
                .ok()?
                .ok()?;
        m.body.lines().find_map(|l| {
            l.strip_prefix("etcd_debugging_mvcc_watcher_total ")
                .and_then(|v| v.trim().parse().ok())
        })
    }

    /// The pending calls that answered during the step: every one the
    /// store lets answer is waited for (bounded, once), every other one
    /// only looked at.
    async fn settle(&mut self) -> Vec<(u64, Answer)> {
        let mut answered = Vec::new();
        let mut still = Vec::new();
        for mut bg in std::mem::take(&mut self.pending) {
            let free = match &bg.waits {
                Waits::Deletes {
                    pfx,
                    rev: Some(rev),
                } => !self.has_keys(pfx, rev - 1).await,
                Waits::Deletes { rev: None, .. } => false,
                Waits::Put { pfx } => self.has_keys(pfx, 0).await,
            };
            let a = if free && !bg.stuck {
                match timeout(WAIT, &mut bg.rx).await {
                    Ok(a) => Some(a.unwrap_or_else(|_| died())),
                    Err(_) => {
                        bg.stuck = true;
                        None
                    }
                }
            } else {
                match bg.rx.try_recv() {
                    Ok(a) => Some(a),
                    Err(oneshot::error::TryRecvError::Empty) => None,
                    Err(oneshot::error::TryRecvError::Closed) => Some(died()),
                }
            };
            match a {
                Some(a) => answered.push((bg.step, a)),
                None => still.push(bg),
            }
        }
        self.pending = still;
        answered
    }

    /// Whether a key under `pfx` exists (created at or before `max_rev`, if
    /// not 0).
    async fn has_keys(&self, pfx: &[u8], max_rev: i64) -> bool {
        if max_rev < 0 {
            return false;
        }
        self.range(RangeRequest {
            key: pfx.to_vec(),
            range_end: prefix_end(pfx),
            keys_only: true,
            // 0: no bound; etcd filters after a limit, so none is set
            max_create_revision: max_rev,
            ..Default::default()
        })
        .await
        .is_some_and(|r| !r.kvs.is_empty())
    }

    /// A Range of the test's own (on [`Self::aux`], tried three times).
    async fn range(&self, r: RangeRequest) -> Option<RangeResponse> {
        let mut kv = KvClient::new(self.aux.clone());
        for _ in 0..3 {
            if let Ok(Ok(a)) = timeout(CALL, kv.range(r.clone())).await {
                return Some(a.into_inner());
            }
        }
        None
    }

    /// Reads the leases; a new ID that is not one of the test's own is the
    /// server's choice, named by the step running ([`chosen_at`]; one a
    /// step, but for a step's second and more in ID order).
    async fn look_at_leases(&mut self) {
        let mut ls = LeaseClient::new(self.aux.clone());
        let mut listed = None;
        for _ in 0..3 {
            if let Ok(Ok(r)) = timeout(CALL, ls.lease_leases(LeaseLeasesRequest {})).await {
                listed = Some(r.into_inner());
                break;
            }
        }
        let Some(r) = listed else { return };
        self.leases = r.leases.iter().map(|l| l.id).collect();
        let this_step = chosen_at(self.now)..chosen_at(self.now + 1);
        let mut k = (self.chosen.iter())
            .filter(|c| this_step.contains(&c.1))
            .count() as i64;
        for &l in &self.leases {
            if !EXPLICIT_LEASES.contains(&l) && !self.chosen.iter().any(|c| c.0 == l) {
                self.chosen.push((l, chosen_at(self.now) + k));
                k += 1;
            }
        }
    }

    /// Reads the whole store.
    async fn look_at_store(&mut self) {
        if let Some(r) = self
            .range(RangeRequest {
                key: vec![0],
                range_end: vec![0],
                ..Default::default()
            })
            .await
        {
            self.store = r.kvs.into_iter().map(|kv| (kv.key.to_vec(), kv)).collect();
        }
    }

    /// A keep-alive for every lease, every [`KEEPALIVE_EVERY`].
    async fn keepalive(&mut self) {
        if self.last_keepalive.elapsed() < KEEPALIVE_EVERY || self.leases.is_empty() {
            return;
        }
        self.last_keepalive = Instant::now();
        let mut ls = LeaseClient::new(self.aux.clone());
        let reqs: Vec<_> = (self.leases.iter())
            .map(|&id| LeaseKeepAliveRequest { id })
            .collect();
        let n = reqs.len();
        let _ = timeout(CALL, async {
            let mut s = ls
                .lease_keep_alive(tokio_stream::iter(reqs))
                .await
                .ok()?
                .into_inner();
            for _ in 0..n {
                s.message().await.ok()??;
            }
            Some(())
        })
        .await;
    }

    /// The steps of the calls still pending.
    fn pending_steps(&self) -> Vec<u64> {
        self.pending.iter().map(|b| b.step).collect()
    }

    /// Ends every background call (the servers are stopped next).
    fn abort_all(&mut self) {
        for bg in self.pending.drain(..) {
            bg.task.abort();
        }
    }
}

/// The request generator, and what it learns from the reference's
/// outcomes.
struct Gen {
    rng: StdRng,
    /// Leases the test knows (its own IDs and placeholders), and whether
    /// they are alive.
    leases: Vec<(i64, bool)>,
    /// Leader keys Campaigns returned, newest last.
    leaders: Vec<LeaderKey>,
    /// Keys Locks returned, newest last.
    locks: Vec<Vec<u8>>,
    /// Keys in the store.
    keys: BTreeSet<Vec<u8>>,
    /// The reference's pending calls.
    pending: usize,
    head: i64,
}

impl Dice for Gen {
    fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }
}

impl Gen {
    fn election(&mut self) -> Vec<u8> {
        if self.p(0.1) {
            self.pick(&LOCKS).to_vec()
        } else {
            self.pick(&ELECTIONS).to_vec()
        }
    }

    fn lock_name(&mut self) -> Vec<u8> {
        if self.p(0.1) {
            self.pick(&ELECTIONS).to_vec()
        } else {
            self.pick(&LOCKS).to_vec()
        }
    }

    fn value(&mut self) -> Vec<u8> {
        self.pick(&VALUES).to_vec()
    }

    fn pick_of<T: Clone>(&mut self, xs: &[T]) -> Option<T> {
        (!xs.is_empty()).then(|| xs[self.rng.random_range(0..xs.len())].clone())
    }

    /// A session lease: mostly a live one; a revoked one, 0 (the server
    /// grants one), one of the test's IDs (granted or not), one never
    /// granted, or -1.
    fn session(&mut self) -> i64 {
        let live: Vec<i64> = (self.leases.iter().filter(|l| l.1)).map(|l| l.0).collect();
        let dead: Vec<i64> = (self.leases.iter().filter(|l| !l.1)).map(|l| l.0).collect();
        match self.rng.random_range(0..100) {
            0..75 if !live.is_empty() => self.pick(&live),
            0..80 if !dead.is_empty() => self.pick(&dead),
            0..88 => 0,
            88..95 => self.pick(&EXPLICIT_LEASES),
            95..98 => UNKNOWN_LEASE,
            _ => -1,
        }
    }

    /// A leader key: one a Campaign returned (held or stale), mostly as
    /// it is, else with another rev, lease, key or name; or a forged one;
    /// rarely none.
    fn leader_key(&mut self) -> Option<LeaderKey> {
        if self.p(0.03) {
            return None;
        }
        let mut l = match self.pick_of(&self.leaders.clone()) {
            // the newest ones more often
            Some(_) if self.p(0.5) => self.leaders.last().cloned().expect("non-empty"),
            Some(l) if self.p(0.9) => l,
            _ => {
                let name = self.election();
                let lease = self.session();
                LeaderKey {
                    key: session_key(&name, lease),
                    name,
                    rev: self.rng.random_range(0..self.head + 2),
                    lease,
                }
            }
        };
        match self.rng.random_range(0..100) {
            0..60 => {}
            60..70 => l.rev += self.pick(&[-1, 1]),
            70..75 => l.rev = 0,
            75..85 => l.lease = self.session(),
            85..95 => {
                l.key = match self.rng.random_range(0..4) {
                    0 => self.pick_of(&self.locks.clone()).unwrap_or_default(),
                    1 => [&l.name[..], b"/none"].concat(),
                    2 => Vec::new(),
                    _ => {
                        let lease = self.session();
                        session_key(&l.name, lease)
                    }
                }
            }
            _ => l.name = self.election(),
        }
        Some(l)
    }

    fn unlock_key(&mut self) -> Vec<u8> {
        match self.rng.random_range(0..100) {
            0..60 if !self.locks.is_empty() => {
                if self.p(0.5) {
                    self.locks.last().cloned().expect("non-empty")
                } else {
                    self.pick_of(&self.locks.clone()).expect("non-empty")
                }
            }
            0..70 if !self.leaders.is_empty() => {
                self.pick_of(&self.leaders.clone()).expect("non-empty").key
            }
            0..80 => {
                let (name, lease) = (self.lock_name(), self.session());
                session_key(&name, lease)
            }
            80..90 => [&self.lock_name()[..], b"/none"].concat(),
            90..95 => Vec::new(),
            _ => self.lock_name(),
        }
    }

    /// A key under one of the prefixes: a session's key, a foreign one,
    /// or one seen in the store.
    fn kv_key(&mut self) -> Vec<u8> {
        let name = if self.p(0.5) {
            self.election()
        } else {
            self.lock_name()
        };
        match self.rng.random_range(0..10) {
            0..4 if !self.keys.is_empty() => {
                let keys: Vec<_> = self.keys.iter().cloned().collect();
                self.pick_of(&keys).expect("non-empty")
            }
            0..6 => {
                let lease = self.session();
                session_key(&name, lease)
            }
            6..8 => [&name[..], b"/zz"].concat(),
            8 => [&name[..], b"/0"].concat(), // sorts before hex keys
            _ => name,
        }
    }

    fn next(&mut self) -> Req {
        let mut roll = self.rng.random_range(0..100);
        // Enough waiters: Campaign, Lock and Observe become steps that may
        // unblock them (Revoke, Resign, Unlock, Delete).
        let blocking = [15..29, 53..58, 58..70];
        if self.pending >= MAX_PENDING && blocking.iter().any(|r| r.contains(&roll)) {
            roll = self.pick(&[6, 9, 45, 48, 70, 72, 95, 97]);
        }
        match roll {
            0..6 => Req::Grant(LeaseGrantRequest {
                ttl: 3600,
                id: if self.p(0.5) {
                    0
                } else {
                    self.pick(&EXPLICIT_LEASES)
                },
            }),
            6..12 => {
                let id = self.session();
                Req::Revoke(LeaseRevokeRequest { id })
            }
            12..15 => Req::Leases,
            15..29 => Req::Campaign(CampaignRequest {
                name: self.election(),
                lease: self.session(),
                value: self.value(),
            }),
            29..38 => Req::Proclaim(ProclaimRequest {
                leader: self.leader_key(),
                value: self.value(),
            }),
            38..45 => Req::Leader(LeaderRequest {
                name: self.election(),
            }),
            45..53 => Req::Resign(ResignRequest {
                leader: self.leader_key(),
            }),
            53..58 => Req::Observe(LeaderRequest {
                name: self.election(),
            }),
            58..70 => Req::Lock(LockRequest {
                name: self.lock_name(),
                lease: self.session(),
            }),
            70..80 => Req::Unlock(UnlockRequest {
                key: self.unlock_key(),
            }),
            80..88 => {
                let (key, range_end) = match self.rng.random_range(0..4) {
                    0 => (vec![0], vec![0]),
                    1 => {
                        let p = slash(&self.election());
                        let e = prefix_end(&p);
                        (p, e)
                    }
                    2 => {
                        let p = self.lock_name();
                        let e = prefix_end(&p);
                        (p, e)
                    }
                    _ => (self.kv_key(), Vec::new()),
                };
                Req::Range(RangeRequest {
                    key,
                    range_end,
                    ..Default::default()
                })
            }
            88..93 => {
                let key = self.kv_key();
                let lease = if self.p(0.3) { self.session() } else { 0 };
                Req::Put(PutRequest {
                    key,
                    value: b"kv".to_vec(),
                    lease,
                    ..Default::default()
                })
            }
            _ => {
                let (key, range_end) = if self.p(0.2) {
                    let p = slash(&self.election());
                    let e = prefix_end(&p);
                    (p, e)
                } else {
                    (self.kv_key(), Vec::new())
                };
                Req::Delete(DeleteRangeRequest {
                    key,
                    range_end,
                    prev_kv: true,
                })
            }
        }
    }

    /// Learns from the reference's outcome of a step.
    fn learn(&mut self, o: &Outcome, pending: usize) {
        self.pending = pending;
        for &l in &o.leases_added {
            match self.leases.iter_mut().find(|x| x.0 == l) {
                Some(x) => x.1 = true,
                None => self.leases.push((l, true)),
            }
        }
        for &l in &o.leases_gone {
            if let Some(x) = self.leases.iter_mut().find(|x| x.0 == l) {
                x.1 = false;
            }
        }
        for a in std::iter::once(&o.answer).chain(o.answered.iter().map(|(_, a)| a)) {
            match a {
                Ok(Resp::Campaign(CampaignResponse {
                    leader: Some(l), ..
                })) => {
                    self.leaders.push(l.clone());
                    if self.leaders.len() > 8 {
                        self.leaders.remove(0);
                    }
                }
                Ok(Resp::Lock(r)) => {
                    self.locks.push(r.key.clone());
                    if self.locks.len() > 8 {
                        self.locks.remove(0);
                    }
                }
                _ => {}
            }
        }
        for (k, kv) in &o.store {
            match kv {
                Some(kv) => {
                    self.keys.insert(k.clone());
                    self.head = self.head.max(kv.mod_revision);
                }
                None => {
                    self.keys.remove(k);
                }
            }
        }
    }
}

/// `Debug` output with byte lists as strings and every lease placeholder
/// (as a number, or as hex at the end of a key) as `lease@<step>`.
fn readable(debug: &str) -> String {
    let s = bytes_as_strings(debug);
    let mut out = String::with_capacity(s.len());
    let hex_base = format!("{:x}", LEASE_BASE >> 32);
    let mut rest = s.as_str();
    while let Some(c) = rest.chars().next() {
        // a placeholder's hex (16 digits), or a number
        let hex = rest
            .get(..16)
            .filter(|h| h.starts_with(&hex_base) && h.chars().all(|c| c.is_ascii_hexdigit()));
        let (digits, radix) = if let Some(hex) = hex {
            (hex, 16)
        } else if c.is_ascii_digit() {
            let end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            (&rest[..end], 10)
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
            continue;
        };
        match i64::from_str_radix(digits, radix) {
            Ok(v) if (LEASE_BASE..LEASE_BASE + (1 << 32)).contains(&v) => {
                let (n, k) = ((v - LEASE_BASE) / 16, (v - LEASE_BASE) % 16);
                match k {
                    0 => out.push_str(&format!("lease@{n}")),
                    _ => out.push_str(&format!("lease@{n}.{k}")),
                }
            }
            _ => out.push_str(digits),
        }
        rest = &rest[digits.len()..];
    }
    out
}

fn show(o: &Outcome) -> String {
    let a = |a: &Answer| match a {
        Ok(r) => readable(&format!("{r:?}")),
        Err((code, msg)) => format!("error {code:?}: {msg:?}"),
    };
    let mut s = a(&o.answer);
    for (step, r) in &o.answered {
        s.push_str(&format!("\n      step {step}'s call answered: {}", a(r)));
    }
    if !o.leases_added.is_empty() || !o.leases_gone.is_empty() {
        s.push_str(&readable(&format!(
            "\n      leases added {:?}, gone {:?}",
            o.leases_added, o.leases_gone
        )));
    }
    for (k, kv) in &o.store {
        s.push_str(&format!(
            "\n      store: {} = {}",
            readable(&format!("{k:?}")),
            readable(&format!("{kv:?}"))
        ));
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_lock_random_differential() {
    let seed = env_u64("RETCD_ELECTION_DIFF_SEED", 1);
    let steps = env_u64("RETCD_ELECTION_DIFF_STEPS", 500);
    let trace = std::env::var_os("RETCD_ELECTION_DIFF_TRACE").is_some();
    let limit = LIMIT.max(Duration::from_millis(steps * 300));
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
            leases: Vec::new(),
            leaders: Vec::new(),
            locks: Vec::new(),
            keys: BTreeSet::new(),
            pending: 0,
            head: 1,
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
            let (ro, to) = tokio::join!(r.step(n, &req), t.step(n, &req));
            let what = readable(&format!("{req:?}"));
            if trace {
                eprintln!(
                    "step {n}: {what}\n  etcd:   {}\n  {tname}: {}",
                    show(&ro),
                    show(&to)
                );
            }
            if let Err((code, msg)) = &ro.answer {
                *errors.entry(format!("{code:?} {msg:?}")).or_insert(0usize) += 1;
            }
            if ro != to {
                diffs += 1;
                if shown.len() < MAX_SHOWN {
                    shown.push(format!(
                        "seed {seed} step {n}: {what}\n  etcd:   {}\n  {tname}: {}",
                        show(&ro),
                        show(&to)
                    ));
                }
            }
            g.learn(&ro, r.pending.len());
        }
        // Calls still waiting at the end must be the same ones.
        let (rp, tp) = (r.pending_steps(), t.pending_steps());
        if rp != tp {
            diffs += 1;
            shown.push(format!(
                "seed {seed} at the end, calls of these steps still wait\n  etcd:   {rp:?}\n  \
                 {tname}: {tp:?}"
            ));
        }
        r.abort_all();
        t.abort_all();
        eprintln!(
            "election_lock_random_differential: etcd vs {tname}, seed {seed}: {total} steps in \
             {:.1?} ({} answered with an error by etcd: {errors:?}), {} calls still waiting, \
             {} + {} server-chosen leases; watcher gauge (etcd / {tname}): unsettled or late {} / \
             {}, above the pending waits {} / {}; {diffs} differing steps",
            started.elapsed(),
            errors.values().sum::<usize>(),
            rp.len(),
            r.chosen.len(),
            t.chosen.len(),
            r.gauge_misses,
            t.gauge_misses,
            r.gauge_extra,
            t.gauge_extra,
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

/// Steps every run starts with (before the seeded ones): a fixed scenario
/// with a waiter of each kind and etcd's Campaign that fails in its
/// Proclaim, then the differences the random steps found in retcd, each
/// reduced to a few steps (revisions in the comments are etcd's).
fn prelude() -> Vec<Req> {
    let grant = |id: i64| Req::Grant(LeaseGrantRequest { ttl: 3600, id });
    let revoke = |id: i64| Req::Revoke(LeaseRevokeRequest { id });
    let campaign = |name: &[u8], lease: i64, value: &[u8]| {
        Req::Campaign(CampaignRequest {
            name: name.to_vec(),
            lease,
            value: value.to_vec(),
        })
    };
    let lock = |name: &[u8], lease: i64| {
        Req::Lock(LockRequest {
            name: name.to_vec(),
            lease,
        })
    };
    let leader = |name: &[u8], key_lease: i64, rev: i64, lease: i64| LeaderKey {
        name: name.to_vec(),
        key: session_key(name, key_lease),
        rev,
        lease,
    };
    let name = |n: &[u8]| LeaderRequest { name: n.to_vec() };
    let mut steps = vec![
        grant(0x1001),
        grant(0x1002),
        grant(0x1003),
        grant(0),
        Req::Leader(name(b"e")),
        campaign(b"e", 0x1001, b"v1"), // rev 2
        Req::Observe(name(b"e")),
        campaign(b"e", 0x1002, b"v2"), // rev 3, waits
        lock(b"l", 0x1003),            // rev 4
        lock(b"l", 0x1002),            // rev 5, waits
        Req::Observe(name(b"e/x")),    // waits for a leader
        Req::Proclaim(ProclaimRequest {
            leader: Some(leader(b"e", 0x1001, 2, 0x1001)),
            value: b"v3".to_vec(),
        }),
        Req::Resign(ResignRequest {
            leader: Some(leader(b"e", 0x1001, 2, 0x1001)),
        }),
        Req::Unlock(UnlockRequest {
            key: session_key(b"l", 0x1003),
        }),
        campaign(b"e/x", 0x1003, b"x"), // rev 9
        Req::Leader(name(b"e")),
        revoke(0x1002), // rev 10
        Req::Leader(name(b"e")),
        // 18: a key named as a session of a lease that does not exist,
        // another value: etcd's Campaign proclaims, fails on the lease,
        // resigns (deletes the key, rev 12) and answers the error
        Req::Put(PutRequest {
            key: session_key(b"e", UNKNOWN_LEASE),
            value: b"kv".to_vec(),
            ..Default::default()
        }),
        campaign(b"e", UNKNOWN_LEASE, b"v1"),
        // 20: Proclaim with lease 0: etcd's service grants a session lease
        // and proclaims with it (the key now has that lease, rev 13); its
        // revoke deletes the key (rev 14); a Delete makes both stores equal
        Req::Proclaim(ProclaimRequest {
            leader: Some(leader(b"e/x", 0x1003, 9, 0)),
            value: b"p0".to_vec(),
        }),
        revoke(chosen_at(20)),
        Req::Delete(DeleteRangeRequest {
            key: session_key(b"e/x", 0x1003),
            ..Default::default()
        }),
        // 23: Resign with lease 0: etcd's service grants a session lease
        // too (left behind, revoked here)
        campaign(b"e", 0x1003, b"r"), // rev 15
        Req::Resign(ResignRequest {
            leader: Some(leader(b"e", 0x1003, 15, 0)),
        }),
        revoke(chosen_at(24)),
        // 26: a negative lease ID: etcd names the session key with Go's
        // `%x` of the int64, `l/-1005`
        grant(-0x1005),
        lock(b"l", -0x1005), // rev 17
        Req::Unlock(UnlockRequest {
            key: session_key(b"l", -0x1005),
        }),
        revoke(-0x1005),
    ];
    // 30: Ranges (a range end, no key in it) on one connection: etcd
    // answers each; retcd ends each answer with an empty DATA frame, and a
    // client built on h2 0.4.20 (tonic's) ends the connection after 100 of
    // them (GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames"), failing the
    // 101st call and every call open on it
    for _ in 0..101 {
        steps.push(Req::Range(RangeRequest {
            key: b"l/".to_vec(),
            range_end: b"l0".to_vec(),
            ..Default::default()
        }));
    }
    steps
}

#[test]
fn readable_names_placeholders() {
    let (l, m) = (chosen_at(3), chosen_at(12) + 1);
    assert_eq!(
        readable(&format!(
            "Put {{ key: [101, 47, 52, 99], lease: {l} }} e/{m:x}, 12"
        )),
        "Put { key: \"e/4c\", lease: lease@3 } e/lease@12.1, 12"
    );
    assert_eq!(go_hex(-0x1005), "-1005");
    assert_eq!(go_hex(0x1005), "1005");
}
