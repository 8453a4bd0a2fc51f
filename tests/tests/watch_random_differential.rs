//! A seeded random *content* differential test of the Watch API: the same
//! sequence of steps is run against a fresh 1-node real etcd 3.4.23 (the
//! reference) and a fresh 1-node target (retcd by default;
//! `RETCD_TEST_FLAVOR=etcd` makes it a second etcd, which checks the test
//! itself), both empty and started with the same flags.
//!
//! Steps interleave writes (Put with and without a lease, DeleteRange of a
//! key or a range, a Txn of several puts and deletes, Compact, LeaseGrant,
//! LeaseRevoke of a lease with keys) over a small overlapping key space
//! with watch requests on three bidirectional Watch streams (a fourth is
//! the prelude's, see [`prelude`]): creates with
//! random key and range end (a key, a prefix, from-key `\0`, another key,
//! possibly below it or equal to it: refused), start revision (0, past,
//! exactly the compaction revision, below it: compacted, the future),
//! `prev_kv`, filters, `progress_notify`, `fragment` and a watch id (0:
//! assigned by the server, or explicit, a duplicate of a live one
//! included, negative ones too); cancels of live, compacted and unknown
//! ids; progress requests.
//!
//! Every stream also has a *sentinel* watcher (explicit id [`SENTINEL`],
//! every key), created first: after a write, the test waits until every
//! stream's sentinel has the write's revision. Then, while a watcher may
//! be catching up from history, it waits until the server's
//! `etcd_debugging_mvcc_slow_watcher_total` gauge is 0, and for the
//! answer a create (and a cancel of a known id, a progress request) gets;
//! finally until no response has come for [`IDLE`]. Only then is the step
//! compared: per stream and per watch id, the responses received since
//! the last step. Across watch ids the order is not compared (etcd hands a
//! revision's events to a stream's watchers in map order); within a watch
//! id it is, and so are the responses' contents after clearing the
//! header's cluster ID, member ID and raft term: a response without events
//! as it is (created, canceled, compact revision, cancel reason, fragment,
//! header revision), a response with events as one item per event with
//! the response's header revision (so the grouping of events into
//! responses is compared through it: with one writer that waits for every
//! write to be delivered, etcd sends a live watcher one response per
//! revision and a watcher catching up one response with all it missed,
//! both deterministic). The KV answers are compared too (as in
//! `kv_random_differential`). A run starts with a fixed [`prelude`] and
//! ends with a fixed [`coda`]: the differences found so far, reduced. It
//! stops early (and fails) when a server exits.
//!
//! Left out, as timing dependent or as behaviour newer etcd changed on
//! purpose (retcd follows the newer one):
//! * periodic progress notifications (etcd's default interval, 10 min, is
//!   far above a run; `progress_notify` is sent but has no effect);
//! * a progress request is sent only on a stream whose watchers are all
//!   synced (the test waits for that), none of which starts at a revision
//!   the store has not reached (etcd 3.5.22+ answers no progress below
//!   it) or was cancelled by a compaction without the client cancelling it
//!   (etcd 3.5.8+ counts it unsynced forever and never answers). The
//!   stream's sentinel means it always has a watcher (etcd 3.5.8+ answers
//!   nothing on a stream without one);
//! * no negative start revision (etcd 3.5.24+ refuses it);
//! * no watch from exactly a compaction revision holding a DELETE: etcd
//!   3.4 drops the tombstone there (racily, when the compaction is not
//!   physical), 3.5.16+ keeps it and sends the DELETE.
//!
//! `RETCD_WATCH_DIFF_SEED` (default 1) and `RETCD_WATCH_DIFF_STEPS`
//! (default 400) replay and size a run; `RETCD_WATCH_DIFF_TRACE=1` prints
//! every step with the reference's responses; `RETCD_WATCH_DIFF_SHOW`
//! sets how many differing steps are printed (default 20);
//! `RETCD_WATCH_DIFF_TARGET_BIN` runs another binary of the flavour as the
//! target (e.g. etcd 3.5.1's with `RETCD_TEST_FLAVOR=etcd`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use retcd_api::etcdserverpb::{
    compare, kv_client::KvClient, lease_client::LeaseClient, request_op, watch_client::WatchClient,
    watch_request::RequestUnion, CompactionRequest, CompactionResponse, Compare,
    DeleteRangeRequest, DeleteRangeResponse, LeaseGrantRequest, LeaseGrantResponse,
    LeaseRevokeRequest, LeaseRevokeResponse, PutRequest, PutResponse, RangeRequest, RequestOp,
    ResponseHeader, TxnRequest, TxnResponse, WatchCancelRequest, WatchCreateRequest,
    WatchProgressRequest, WatchRequest, WatchResponse,
};
use retcd_api::mvccpb::{event::EventType, Event, KeyValue};
use retcd_tests::random_diff::{
    answer, bytes_as_strings as readable, env_u64, prefix_end, range_end, show_bytes, Dice,
};
use retcd_tests::{bounded, http_get, limit::NORMAL as LIMIT, test_flavor, Cluster, Flavor, FAST};
use tokio::sync::mpsc;
use tokio::time::timeout;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;

/// Each unary call's bound.
const CALL: Duration = Duration::from_secs(10);

/// The longest wait for an expected answer (a sentinel's event, a create's
/// answer, a synced store); a server that never sends it costs this much
/// per step, and the step differs.
const WAIT: Duration = Duration::from_secs(3);

/// The shorter wait for answers the reference may not send (a cancel of a
/// known id, a progress request).
const SHORT_WAIT: Duration = Duration::from_secs(1);

/// A step is over when no response has come for this long (after the
/// waits above, which make it only a margin for responses already queued).
const IDLE: Duration = Duration::from_millis(40);

/// Watch streams per server: the seeded steps use all but the last, the
/// prelude's ([`PRELUDE_STREAM`]).
const STREAMS: usize = 4;

/// The stream only the prelude uses.
const PRELUDE_STREAM: usize = STREAMS - 1;

/// The watch id of every stream's sentinel watcher (every key, from the
/// start).
const SENTINEL: i64 = 1_000_000;

/// Live watchers per stream (besides the sentinel) above which the test
/// cancels rather than creates.
const MAX_WATCHERS: usize = 10;

/// Differing seeded steps printed at most by default
/// (`RETCD_WATCH_DIFF_SHOW`; the count is always given; the prelude's and
/// the coda's are all printed).
const MAX_SHOWN: usize = 20;

/// The key space: 11 keys whose prefixes and ranges overlap.
const KEYS: [&[u8]; 11] = [
    b"a", b"a/b", b"a/c", b"ab", b"b", b"ba", b"c", b"c\x00", b"\x00", b"\xff", b"z",
];

/// Values, few.
const VALUES: [&[u8]; 5] = [b"", b"0", b"1", b"v", b"\xff\x00"];

/// Lease IDs the test grants (explicit, so both servers have the same).
const LEASES: [i64; 3] = [0x1001, 0x1002, 0x1003];

/// Explicit watch ids a create asks for (besides duplicates of live ones).
const EXPLICIT_IDS: [i64; 6] = [1, 2, 3, 5, 8, 1 << 40];

/// Ids a cancel may name that are mostly unknown.
const OTHER_IDS: [i64; 6] = [0, 4, 6, 42, -3, 1 << 41];

// ------------------------------------------------------------------ steps

/// One step.
#[derive(Debug, Clone)]
enum Op {
    Put(PutRequest),
    Delete(DeleteRangeRequest),
    Txn(TxnRequest),
    Compact(CompactionRequest),
    Grant(LeaseGrantRequest),
    Revoke(LeaseRevokeRequest),
    /// A create on stream `.0`.
    Create(usize, WatchCreateRequest),
    /// A cancel of id `.1` on stream `.0`.
    Cancel(usize, i64),
    /// A progress request on stream `.0`.
    Progress(usize),
}

impl Op {
    fn describe(&self) -> String {
        match self {
            Op::Create(s, c) => {
                let mut d = format!(
                    "stream {s}: create key={} end={} start={} id={}",
                    show_bytes(&c.key),
                    show_bytes(&c.range_end),
                    c.start_revision,
                    c.watch_id
                );
                if c.prev_kv {
                    d.push_str(" prev_kv");
                }
                if !c.filters.is_empty() {
                    let _ = write!(d, " filters={:?}", c.filters);
                }
                if c.progress_notify {
                    d.push_str(" progress_notify");
                }
                if c.fragment {
                    d.push_str(" fragment");
                }
                d
            }
            Op::Cancel(s, id) => format!("stream {s}: cancel {id}"),
            Op::Progress(s) => format!("stream {s}: progress request"),
            other => readable(&format!("{other:?}")),
        }
    }
}

/// A successful KV answer.
#[derive(Debug, Clone, PartialEq)]
enum Resp {
    Put(PutResponse),
    Delete(DeleteRangeResponse),
    Txn(TxnResponse),
    Compact(CompactionResponse),
    Grant(LeaseGrantResponse),
    Revoke(LeaseRevokeResponse),
}

/// A KV answer: the response, or the gRPC code and message.
type Answer = Result<Resp, (tonic::Code, String)>;

fn clear_header(h: &mut Option<ResponseHeader>) {
    if let Some(h) = h {
        h.cluster_id = 0;
        h.member_id = 0;
        h.raft_term = 0;
    }
}

/// Clears every header's cluster ID, member ID and raft term (the top one
/// and a Txn's op responses').
fn normalise(a: &mut Answer) {
    let Ok(r) = a else { return };
    match r {
        Resp::Put(r) => clear_header(&mut r.header),
        Resp::Delete(r) => clear_header(&mut r.header),
        Resp::Txn(t) => {
            clear_header(&mut t.header);
            for r in &mut t.responses {
                use retcd_api::etcdserverpb::response_op::Response as R;
                match &mut r.response {
                    Some(R::ResponsePut(r)) => clear_header(&mut r.header),
                    Some(R::ResponseDeleteRange(r)) => clear_header(&mut r.header),
                    Some(R::ResponseRange(r)) => clear_header(&mut r.header),
                    Some(R::ResponseTxn(r)) => clear_header(&mut r.header),
                    None => {}
                }
            }
        }
        Resp::Compact(r) => clear_header(&mut r.header),
        Resp::Grant(r) => clear_header(&mut r.header),
        Resp::Revoke(r) => clear_header(&mut r.header),
    }
}

// ------------------------------------------------------------- responses

/// What one stream delivered: a response, or its end (with the status it
/// failed with, if any).
type Delivery = Result<WatchResponse, Option<(tonic::Code, String)>>;

/// One compared item of a watch id's sequence.
#[derive(Debug, Clone, PartialEq)]
enum Item {
    /// A response without events, as it is (header normalised).
    Resp {
        rev: i64,
        created: bool,
        canceled: bool,
        compact_revision: i64,
        cancel_reason: String,
        fragment: bool,
    },
    /// One event of a response, with the response's header revision and
    /// fragment flag.
    Event { rev: i64, fragment: bool, ev: Event },
    /// The stream ended (the status, if it failed).
    End(Option<(tonic::Code, String)>),
}

/// The watch id a stream's end is filed under.
const END_ID: i64 = i64::MIN;

/// A stream's deliveries as one sequence per watch id.
fn per_watch(got: &[Delivery]) -> BTreeMap<i64, Vec<Item>> {
    let mut out: BTreeMap<i64, Vec<Item>> = BTreeMap::new();
    for d in got {
        match d {
            Err(e) => out.entry(END_ID).or_default().push(Item::End(e.clone())),
            Ok(r) => {
                let rev = r.header.as_ref().map_or(0, |h| h.revision);
                let items = out.entry(r.watch_id).or_default();
                let plain = !r.created
                    && !r.canceled
                    && r.compact_revision == 0
                    && r.cancel_reason.is_empty();
                if r.events.is_empty() || !plain {
                    items.push(Item::Resp {
                        rev,
                        created: r.created,
                        canceled: r.canceled,
                        compact_revision: r.compact_revision,
                        cancel_reason: r.cancel_reason.clone(),
                        fragment: r.fragment,
                    });
                }
                for ev in &r.events {
                    items.push(Item::Event {
                        rev,
                        fragment: r.fragment,
                        ev: ev.clone(),
                    });
                }
            }
        }
    }
    out
}

fn show_kv(kv: &KeyValue) -> String {
    format!(
        "{}={} c{} m{} v{} lease {}",
        show_bytes(&kv.key),
        show_bytes(&kv.value),
        kv.create_revision,
        kv.mod_revision,
        kv.version,
        kv.lease
    )
}

fn show_item(i: &Item) -> String {
    match i {
        Item::Resp {
            rev,
            created,
            canceled,
            compact_revision,
            cancel_reason,
            fragment,
        } => {
            let mut s = format!("[rev {rev}]");
            if *created {
                s.push_str(" created");
            }
            if *canceled {
                s.push_str(" canceled");
            }
            if *compact_revision != 0 {
                let _ = write!(s, " compact_revision={compact_revision}");
            }
            if !cancel_reason.is_empty() {
                let _ = write!(s, " reason={cancel_reason:?}");
            }
            if *fragment {
                s.push_str(" fragment");
            }
            if s.ends_with(']') {
                s.push_str(" (no events: progress)");
            }
            s
        }
        Item::Event { rev, fragment, ev } => {
            let ty = match EventType::try_from(ev.r#type) {
                Ok(EventType::Put) => "PUT".to_string(),
                Ok(EventType::Delete) => "DELETE".to_string(),
                Err(_) => format!("type {}", ev.r#type),
            };
            let mut s = format!(
                "[rev {rev}{}] {ty} {}",
                if *fragment { " fragment" } else { "" },
                ev.kv.as_ref().map_or("(no kv)".into(), show_kv)
            );
            if let Some(p) = &ev.prev_kv {
                let _ = write!(s, " prev {}", show_kv(p));
            }
            s
        }
        Item::End(e) => format!("stream ended: {e:?}"),
    }
}

fn show_items(items: Option<&Vec<Item>>) -> String {
    match items {
        None => "(nothing)".into(),
        Some(v) => v
            .iter()
            .map(|i| format!("\n      {}", show_item(i)))
            .collect(),
    }
}

// ----------------------------------------------------------------- a side

/// What a reader task hands the test: the stream's index and a delivery.
type Msg = (usize, Delivery);

/// One server: its channel, its watch streams (requests in through
/// `txs`, every stream's deliveries out through `rx`) and what they
/// delivered since the last comparison.
struct Side {
    chan: Channel,
    port: u16,
    txs: Vec<mpsc::UnboundedSender<WatchRequest>>,
    rx: mpsc::UnboundedReceiver<Msg>,
    got: Vec<Vec<Delivery>>,
    /// The highest revision each stream's sentinel delivered.
    seen: Vec<i64>,
    /// The store's revision after the last write.
    head: i64,
    /// A watcher may be catching up from history.
    catching_up: bool,
    /// A stream ended: waits for answers are skipped.
    ended: bool,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Side {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn create_req(c: WatchCreateRequest) -> WatchRequest {
    WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(c)),
    }
}

impl Side {
    /// Connects to `c`'s member and opens [`STREAMS`] watch streams, each
    /// with its sentinel (its `created` answer is left for the first
    /// comparison).
    async fn open(c: &Cluster) -> Side {
        let chan = Channel::from_shared(c.members[0].endpoint())
            .expect("url")
            .connect()
            .await
            .expect("connect");
        let (out, rx) = mpsc::unbounded_channel();
        let mut side = Side {
            chan: chan.clone(),
            port: c.members[0].client_port,
            txs: Vec::new(),
            rx,
            got: vec![Vec::new(); STREAMS],
            seen: vec![0; STREAMS],
            head: 1,
            catching_up: false,
            ended: false,
            tasks: Vec::new(),
        };
        for i in 0..STREAMS {
            let (tx, reqs) = mpsc::unbounded_channel();
            let out = out.clone();
            let mut w = WatchClient::new(chan.clone());
            // The call returns once the server sends its first message
            // (a Go server sends the headers with it), so it runs in the
            // reader task.
            side.tasks.push(tokio::spawn(async move {
                let mut s = match w.watch(UnboundedReceiverStream::new(reqs)).await {
                    Ok(r) => r.into_inner(),
                    Err(st) => {
                        let _ = out.send((i, Err(Some((st.code(), st.message().into())))));
                        return;
                    }
                };
                loop {
                    match s.message().await {
                        Ok(Some(m)) => {
                            if out.send((i, Ok(m))).is_err() {
                                return;
                            }
                        }
                        Ok(None) => {
                            let _ = out.send((i, Err(None)));
                            return;
                        }
                        Err(st) => {
                            let _ = out.send((i, Err(Some((st.code(), st.message().into())))));
                            return;
                        }
                    }
                }
            }));
            tx.send(create_req(WatchCreateRequest {
                key: vec![0],
                range_end: vec![0],
                watch_id: SENTINEL,
                prev_kv: i == 0,
                ..Default::default()
            }))
            .expect("send");
            side.txs.push(tx);
        }
        let all_created = |s: &Side| {
            s.got.iter().all(|g| {
                g.iter()
                    .any(|d| matches!(d, Ok(r) if r.created && r.watch_id == SENTINEL))
            })
        };
        assert!(
            side.recv_until(WAIT * 3, all_created).await,
            "every sentinel created: {:?}",
            side.got
        );
        side
    }

    fn take(&mut self, (i, d): Msg) {
        if let Ok(r) = &d {
            if r.watch_id == SENTINEL {
                for e in &r.events {
                    let m = e.kv.as_ref().map_or(0, |kv| kv.mod_revision);
                    self.seen[i] = self.seen[i].max(m);
                }
            }
        }
        self.ended |= d.is_err();
        self.got[i].push(d);
    }

    /// Takes deliveries until `done` holds (true) or `within` has passed
    /// (false).
    async fn recv_until(&mut self, within: Duration, done: impl Fn(&Side) -> bool) -> bool {
        let deadline = Instant::now() + within;
        while !done(self) {
            if self.ended {
                return false;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            match timeout(left, self.rx.recv()).await {
                Ok(Some(m)) => self.take(m),
                Ok(None) | Err(_) => return false,
            }
        }
        true
    }

    /// Takes deliveries until none has come for [`IDLE`].
    async fn idle(&mut self) {
        while let Ok(Some(m)) = timeout(IDLE, self.rx.recv()).await {
            self.take(m);
        }
    }

    /// The store's revision (a count-only Range of every key).
    async fn revision(&self) -> Option<i64> {
        let mut kv = KvClient::new(self.chan.clone());
        let r = timeout(
            CALL,
            kv.range(RangeRequest {
                key: vec![0],
                range_end: vec![0],
                count_only: true,
                ..Default::default()
            }),
        )
        .await
        .ok()?
        .ok()?;
        r.into_inner().header.map(|h| h.revision)
    }

    /// `etcd_debugging_mvcc_slow_watcher_total` (unsynced and victim
    /// watchers).
    async fn slow_watchers(&self) -> Option<f64> {
        let port = self.port;
        let m =
            tokio::task::spawn_blocking(move || http_get(port, "/metrics", Duration::from_secs(2)))
                .await
                .ok()?
                .ok()?;
        m.body.lines().find_map(|l| {
            l.strip_prefix("etcd_debugging_mvcc_slow_watcher_total ")
                .and_then(|v| v.trim().parse().ok())
        })
    }

    /// Runs `op` (a KV call, or a request sent on a stream); a KV op's
    /// answer, normalised.
    async fn run(&mut self, op: &Op) -> Option<Answer> {
        let mut kv = KvClient::new(self.chan.clone());
        let mut ls = LeaseClient::new(self.chan.clone());
        let send = |s: usize, r: RequestUnion| {
            // A stream whose reader ended drops requests; its end is
            // compared.
            let _ = self.txs[s].send(WatchRequest {
                request_union: Some(r),
            });
        };
        let mut a = match op.clone() {
            Op::Put(r) => answer(timeout(CALL, kv.put(r)).await, Resp::Put),
            Op::Delete(r) => answer(timeout(CALL, kv.delete_range(r)).await, Resp::Delete),
            Op::Txn(r) => answer(timeout(CALL, kv.txn(r)).await, Resp::Txn),
            Op::Compact(r) => answer(timeout(CALL, kv.compact(r)).await, Resp::Compact),
            Op::Grant(r) => answer(timeout(CALL, ls.lease_grant(r)).await, Resp::Grant),
            Op::Revoke(r) => answer(timeout(CALL, ls.lease_revoke(r)).await, Resp::Revoke),
            Op::Create(s, c) => {
                send(s, RequestUnion::CreateRequest(c));
                return None;
            }
            Op::Cancel(s, id) => {
                send(
                    s,
                    RequestUnion::CancelRequest(WatchCancelRequest { watch_id: id }),
                );
                return None;
            }
            Op::Progress(s) => {
                send(s, RequestUnion::ProgressRequest(WatchProgressRequest {}));
                return None;
            }
        };
        normalise(&mut a);
        Some(a)
    }

    /// Waits until what `op` causes has been delivered (see the module
    /// doc). `expect_answer`: the reference answers a cancel or a progress
    /// request (the model's guess; a side that does not is waited for
    /// [`SHORT_WAIT`]).
    async fn settle(&mut self, op: &Op, expect_answer: bool) {
        let from: Vec<usize> = self.got.iter().map(Vec::len).collect();
        match op {
            Op::Put(_)
            | Op::Delete(_)
            | Op::Txn(_)
            | Op::Compact(_)
            | Op::Grant(_)
            | Op::Revoke(_) => {
                if let Some(rev) = self.revision().await {
                    if rev > self.head {
                        self.recv_until(WAIT, |s| s.seen.iter().all(|&r| r >= rev))
                            .await;
                    }
                    self.head = rev;
                }
            }
            Op::Create(s, c) => {
                let s = *s;
                let i = from[s];
                self.recv_until(WAIT, |x| {
                    x.got[s][i..]
                        .iter()
                        .any(|d| matches!(d, Ok(r) if r.created))
                })
                .await;
                if c.start_revision != 0 && c.start_revision <= self.head {
                    self.catching_up = true;
                }
            }
            Op::Cancel(s, _) if expect_answer => {
                let s = *s;
                let i = from[s];
                self.recv_until(SHORT_WAIT, |x| {
                    x.got[s][i..]
                        .iter()
                        .any(|d| matches!(d, Ok(r) if r.canceled))
                })
                .await;
            }
            Op::Progress(s) if expect_answer => {
                let s = *s;
                let i = from[s];
                self.recv_until(SHORT_WAIT, |x| {
                    x.got[s][i..]
                        .iter()
                        .any(|d| matches!(d, Ok(r) if r.watch_id == -1 && !r.created))
                })
                .await;
            }
            Op::Cancel(..) | Op::Progress(_) => {}
        }
        if self.catching_up && !self.ended {
            let deadline = Instant::now() + WAIT;
            loop {
                if self.slow_watchers().await == Some(0.0) {
                    self.catching_up = false;
                    break;
                }
                if Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        self.idle().await;
    }

    fn take_got(&mut self) -> Vec<Vec<Delivery>> {
        std::mem::replace(&mut self.got, vec![Vec::new(); STREAMS])
    }
}

// -------------------------------------------------------------- generator

/// A watcher the reference has on a stream: its requested start revision
/// and whether a compaction cancelled it (its id stays taken until the
/// client cancels it).
#[derive(Debug, Clone)]
struct Watcher {
    start: i64,
    compacted: bool,
}

/// The step generator and what it learns from the reference's answers.
struct Gen {
    rng: StdRng,
    head: i64,
    compacted: i64,
    /// Revisions holding a DELETE (from the reference's sentinels).
    deletes_at: BTreeSet<i64>,
    /// Leases granted and not revoked.
    leases: BTreeSet<i64>,
    /// Per stream, the reference's watchers (the sentinel included).
    watchers: Vec<BTreeMap<i64, Watcher>>,
}

impl Dice for Gen {
    fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }
}

impl Gen {
    fn key(&mut self) -> Vec<u8> {
        self.pick(&KEYS).to_vec()
    }

    fn value(&mut self) -> Vec<u8> {
        self.pick(&VALUES).to_vec()
    }

    fn range_end(&mut self, key: &[u8]) -> Vec<u8> {
        range_end(&mut self.rng, key, &KEYS)
    }

    fn lease(&mut self) -> i64 {
        if self.p(0.7) && !self.leases.is_empty() {
            let ls: Vec<i64> = self.leases.iter().copied().collect();
            self.pick(&ls)
        } else if self.p(0.8) {
            0
        } else {
            self.pick(&LEASES) // maybe not granted: refused
        }
    }

    /// A Put; `ignore_value` and `ignore_lease` (refused on a missing
    /// key) keep the key's value or lease in its event.
    fn put(&mut self) -> PutRequest {
        let ignore_value = self.p(0.08);
        let ignore_lease = self.p(0.08);
        PutRequest {
            key: self.key(),
            value: if ignore_value {
                Vec::new()
            } else {
                self.value()
            },
            lease: if !ignore_lease && self.p(0.3) {
                self.lease()
            } else {
                0
            },
            prev_kv: self.p(0.3),
            ignore_value,
            ignore_lease,
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
            prev_kv: self.p(0.3),
        }
    }

    fn txn(&mut self) -> TxnRequest {
        let compare = if self.p(0.5) {
            vec![Compare {
                result: compare::CompareResult::Equal as i32,
                target: compare::CompareTarget::Value as i32,
                key: self.key(),
                target_union: Some(compare::TargetUnion::Value(self.value())),
                ..Default::default()
            }]
        } else {
            Vec::new()
        };
        let ops = |g: &mut Gen, n: usize| -> Vec<RequestOp> {
            (0..n)
                .map(|_| RequestOp {
                    request: Some(if g.p(0.65) {
                        request_op::Request::RequestPut(g.put())
                    } else {
                        request_op::Request::RequestDeleteRange(g.delete())
                    }),
                })
                .collect()
        };
        let (ns, nf) = (self.rng.random_range(1..5), self.rng.random_range(0..3));
        let (mut success, mut failure) = (ops(self, ns), ops(self, nf));
        // a Put etcd itself dies on (seed 79 stopped the reference)
        retcd_tests::random_diff::no_etcd_crash(&mut success);
        retcd_tests::random_diff::no_etcd_crash(&mut failure);
        TxnRequest {
            compare,
            success,
            failure,
        }
    }

    fn compact(&mut self) -> CompactionRequest {
        let behind = (self.head - self.rng.random_range(0..6)).max(self.compacted + 1);
        let revision = match self.rng.random_range(0..20) {
            0..16 => behind,
            16..18 => self.head,
            18 => self.compacted.max(1), // already compacted
            _ => self.head + 1,          // the future
        };
        CompactionRequest {
            revision,
            physical: self.p(0.5),
        }
    }

    /// Whether a watch may start at `rev`: not exactly at a compaction
    /// revision holding a DELETE (see the module doc).
    fn startable(&self, rev: i64) -> bool {
        !(rev == self.compacted && self.deletes_at.contains(&rev))
    }

    fn start_revision(&mut self) -> i64 {
        let lowest = self.compacted.max(1);
        let rev = match self.rng.random_range(0..100) {
            0..35 => 0,
            35..45 => self.head + self.rng.random_range(1..4), // the future
            45..72 => self.rng.random_range(lowest..=self.head.max(lowest)),
            72..82 if self.compacted > 0 => self.compacted, // exactly it
            82..92 if self.compacted > 1 => self.rng.random_range(1..self.compacted), // compacted
            82..92 => 1,
            _ => self.head,
        };
        if self.startable(rev) {
            rev
        } else {
            rev + 1 // the future, if the compaction was at the head
        }
    }

    fn create(&mut self, s: usize) -> Op {
        let key = if self.p(0.03) {
            Vec::new() // watched as "\0"
        } else {
            self.key()
        };
        let range_end = self.range_end(&key);
        let filters = match self.rng.random_range(0..100) {
            0..60 => vec![],
            60..72 => vec![0],
            72..84 => vec![1],
            84..94 => vec![0, 1],
            94..97 => vec![1, 1],
            _ => vec![7], // no such filter: ignored
        };
        let live: Vec<i64> = self.watchers[s].keys().copied().collect();
        let watch_id = match self.rng.random_range(0..100) {
            0..70 => 0,
            70..85 => self.pick(&EXPLICIT_IDS),
            85..95 => self.pick(&live), // a duplicate: refused
            _ => self.pick(&[-1, -7]),
        };
        Op::Create(
            s,
            WatchCreateRequest {
                key,
                range_end,
                start_revision: self.start_revision(),
                progress_notify: self.p(0.2),
                filters,
                prev_kv: self.p(0.4),
                watch_id,
                fragment: self.p(0.1),
            },
        )
    }

    fn cancel(&mut self, s: usize) -> Op {
        let ours: Vec<i64> = self.watchers[s]
            .keys()
            .copied()
            .filter(|&id| id != SENTINEL)
            .collect();
        let id = if !ours.is_empty() && self.p(0.8) {
            self.pick(&ours)
        } else {
            let id = self.pick(&OTHER_IDS);
            if id == SENTINEL {
                0
            } else {
                id
            }
        };
        Op::Cancel(s, id)
    }

    /// Whether a progress request on stream `s` gets a deterministic
    /// answer from every etcd version (see the module doc).
    fn progress_ok(&self, s: usize) -> bool {
        !self.watchers[s].is_empty()
            && self.watchers[s]
                .values()
                .all(|w| !w.compacted && w.start <= self.head)
    }

    fn next(&mut self) -> Op {
        let s = self.rng.random_range(0..PRELUDE_STREAM);
        let ours = self.watchers[s].len().saturating_sub(1);
        match self.rng.random_range(0..100) {
            0..26 => Op::Put(self.put()),
            26..35 => Op::Delete(self.delete()),
            35..47 => Op::Txn(self.txn()),
            47..50 => Op::Compact(self.compact()),
            50..53 => Op::Grant(LeaseGrantRequest {
                ttl: 3600,
                id: self.pick(&LEASES),
            }),
            53..57 => Op::Revoke(LeaseRevokeRequest {
                id: if self.p(0.8) && !self.leases.is_empty() {
                    let ls: Vec<i64> = self.leases.iter().copied().collect();
                    self.pick(&ls)
                } else {
                    self.pick(&LEASES)
                },
            }),
            57..82 if ours < MAX_WATCHERS => self.create(s),
            57..91 => self.cancel(s),
            _ if self.progress_ok(s) => Op::Progress(s),
            _ => self.create(s),
        }
    }

    /// Whether the reference is expected to answer `op` on its stream (a
    /// cancel of an id it has, a progress request).
    fn expects_answer(&self, op: &Op) -> bool {
        match op {
            Op::Cancel(s, id) => self.watchers[*s].contains_key(id),
            Op::Progress(s) => self.progress_ok(*s),
            _ => false,
        }
    }

    /// Learns from the reference's answers to `op`: its KV answer, its
    /// revision after it and what its streams delivered.
    fn learn(&mut self, op: &Op, a: Option<&Answer>, head: i64, got: &[Vec<Delivery>]) {
        self.head = self.head.max(head);
        match (op, a) {
            (Op::Compact(c), Some(Ok(_))) => self.compacted = c.revision,
            (Op::Grant(g), Some(Ok(_))) => {
                self.leases.insert(g.id);
            }
            (Op::Revoke(r), Some(Ok(_))) => {
                self.leases.remove(&r.id);
            }
            _ => {}
        }
        let start = match op {
            Op::Create(_, c) => c.start_revision,
            _ => 0,
        };
        for (s, g) in got.iter().enumerate() {
            for r in g.iter().flatten() {
                if r.watch_id == SENTINEL {
                    for e in &r.events {
                        if e.r#type == EventType::Delete as i32 {
                            let rev = e.kv.as_ref().map_or(0, |kv| kv.mod_revision);
                            self.deletes_at.insert(rev);
                        }
                    }
                }
                if r.created && !r.canceled {
                    self.watchers[s].insert(
                        r.watch_id,
                        Watcher {
                            start,
                            compacted: false,
                        },
                    );
                } else if r.canceled && !r.created {
                    if r.compact_revision != 0 {
                        if let Some(w) = self.watchers[s].get_mut(&r.watch_id) {
                            w.compacted = true;
                        }
                    } else {
                        self.watchers[s].remove(&r.watch_id);
                    }
                }
            }
        }
    }
}

fn show_answer(a: &Answer) -> String {
    match a {
        Ok(r) => readable(&format!("{r:?}")),
        Err((code, msg)) => format!("error {code:?}: {msg:?}"),
    }
}

/// The differences of one step between the reference's deliveries and
/// the target's (empty if none).
fn diff_step(r: &[Vec<Delivery>], t: &[Vec<Delivery>], tname: &str) -> Vec<String> {
    let mut out = Vec::new();
    for s in 0..STREAMS {
        let (rw, tw) = (per_watch(&r[s]), per_watch(&t[s]));
        let ids: BTreeSet<i64> = rw.keys().chain(tw.keys()).copied().collect();
        for id in ids {
            let (ri, ti) = (rw.get(&id), tw.get(&id));
            if ri != ti {
                let name = if id == END_ID {
                    "the stream".to_string()
                } else {
                    format!("watch id {id}")
                };
                out.push(format!(
                    "  stream {s}, {name}:\n    etcd:{}\n    {tname}:{}",
                    show_items(ri),
                    show_items(ti)
                ));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_random_differential() {
    let seed = env_u64("RETCD_WATCH_DIFF_SEED", 1);
    let steps = env_u64("RETCD_WATCH_DIFF_STEPS", 400);
    let trace = std::env::var("RETCD_WATCH_DIFF_TRACE").is_ok_and(|v| v == "1");
    let max_shown = env_u64("RETCD_WATCH_DIFF_SHOW", MAX_SHOWN as u64) as usize;
    // A long run gets more time than the default one.
    let limit = LIMIT.max(Duration::from_millis(steps * 400));
    bounded(limit, async {
        let flavor = test_flavor();
        // Another server binary of the flavour as the target (e.g. etcd
        // 3.5.1 with RETCD_TEST_FLAVOR=etcd), to tell old etcd's answers
        // from newer ones.
        let bin = std::env::var_os("RETCD_WATCH_DIFF_TARGET_BIN")
            .map_or_else(|| flavor.binary(), std::path::PathBuf::from);
        let (reference, target) = tokio::join!(
            Cluster::start(Flavor::Etcd, 1, FAST),
            Cluster::start_with_binary(flavor, bin, 1, FAST),
        );
        let mut reference = reference.expect("start reference etcd");
        let mut target = target.expect("start target");
        let tname = flavor.name();
        let (mut r, mut t) = tokio::join!(Side::open(&reference), Side::open(&target));
        r.idle().await;
        t.idle().await;
        let mut g = Gen {
            rng: StdRng::seed_from_u64(seed),
            head: 1,
            compacted: 0,
            deletes_at: BTreeSet::new(),
            leases: BTreeSet::new(),
            watchers: vec![
                BTreeMap::from([(
                    SENTINEL,
                    Watcher {
                        start: 0,
                        compacted: false,
                    },
                )]);
                STREAMS
            ],
        };
        let started = Instant::now();
        // Stop early enough to report (a target that stops answering makes
        // every step wait for it).
        let budget = limit.saturating_sub(Duration::from_secs(30));
        let mut stopped = None;
        let (mut diffs, mut shown) = (0usize, Vec::new());
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        // Step 0 (no op) compares the sentinels' creation; the prelude
        // follows, then the seeded steps, then the coda.
        let fixed = prelude();
        let (first, last) = (fixed.len() as u64, fixed.len() as u64 + steps);
        let total = last + CODA_STEPS;
        for n in 0..=total {
            let op = match n {
                0 => None,
                n if n <= first => Some(fixed[n as usize - 1].clone()),
                n if n <= last => Some(g.next()),
                n => Some(coda(n - last - 1, g.head)),
            };
            let (ra, ta) = match &op {
                None => (None, None),
                Some(op) => {
                    let expect = g.expects_answer(op);
                    let (ra, ta) = tokio::join!(r.run(op), t.run(op));
                    tokio::join!(r.settle(op, expect), t.settle(op, expect));
                    (ra, ta)
                }
            };
            let kind = match &op {
                None => "setup",
                Some(Op::Put(_)) => "put",
                Some(Op::Delete(_)) => "delete",
                Some(Op::Txn(_)) => "txn",
                Some(Op::Compact(_)) => "compact",
                Some(Op::Grant(_)) => "grant",
                Some(Op::Revoke(_)) => "revoke",
                Some(Op::Create(..)) => "create",
                Some(Op::Cancel(..)) => "cancel",
                Some(Op::Progress(_)) => "progress",
            };
            *counts.entry(kind).or_default() += 1;
            let (rg, tg) = (r.take_got(), t.take_got());
            let desc = op.as_ref().map_or_else(
                || "open the streams and their sentinels".to_string(),
                Op::describe,
            );
            if trace {
                let mut s = format!("step {n}: {desc}");
                if let Some(a) = &ra {
                    let _ = write!(s, "\n  answer: {}", show_answer(a));
                }
                for (i, got) in rg.iter().enumerate() {
                    for (id, items) in per_watch(got) {
                        let _ = write!(s, "\n  stream {i}, id {id}:{}", show_items(Some(&items)));
                    }
                }
                eprintln!("{s}");
            }
            let mut d = diff_step(&rg, &tg, tname);
            if ra != ta {
                d.insert(
                    0,
                    format!(
                        "  answer:\n    etcd:   {}\n    {tname}: {}",
                        ra.as_ref().map_or("-".into(), show_answer),
                        ta.as_ref().map_or("-".into(), show_answer)
                    ),
                );
            }
            if !d.is_empty() {
                diffs += 1;
                // the fixed steps' differences are always shown
                if shown.len() < max_shown || n <= first || n > last {
                    shown.push(format!("seed {seed} step {n}: {desc}\n{}", d.join("\n")));
                }
            }
            if let Some(op) = &op {
                g.learn(op, ra.as_ref(), r.head, &rg);
            }
            // A server that died or a run out of time ends the run.
            let mut end = None;
            for (name, c) in [("etcd", &mut reference), (tname, &mut target)] {
                if !c.members[0].is_running() {
                    end = Some(format!(
                        "{name} exited after step {n}; its log ends:\n{}",
                        c.members[0].log_tail(3000)
                    ));
                }
            }
            if end.is_none() && n < total && started.elapsed() > budget {
                end = Some(format!("out of time after step {n} of {total}"));
            }
            if let Some(end) = end {
                stopped = Some(end);
                break;
            }
        }
        eprintln!(
            "watch_random_differential: etcd vs {tname}, seed {seed}: {total} steps in {:.1?} \
             ({counts:?}), head revision {}, compacted at {}, {diffs} differing steps",
            started.elapsed(),
            g.head,
            g.compacted,
        );
        drop((r, t));
        let listed = shown.len();
        if let Some(why) = &stopped {
            shown.push(format!("seed {seed}: the run stopped: {why}"));
        }
        assert!(
            diffs == 0 && stopped.is_none(),
            "{diffs} of {total} steps differ between etcd and {tname} (seed {seed}; the first {} \
             below; once the servers differ, later steps may differ only because of it):\n\n{}",
            listed,
            shown.join("\n\n")
        );
    })
    .await;
}

/// A Txn running `ops` (its success branch, no compares).
fn txn(ops: Vec<request_op::Request>) -> Op {
    Op::Txn(TxnRequest {
        success: ops
            .into_iter()
            .map(|r| RequestOp { request: Some(r) })
            .collect(),
        ..Default::default()
    })
}

/// Steps every run starts with (before the seeded ones): the differences
/// the random steps found in retcd, each reduced to a few steps, as
/// regression tests against etcd's answers.
fn prelude() -> Vec<Op> {
    let put = |k: &[u8], v: &[u8]| PutRequest {
        key: k.to_vec(),
        value: v.to_vec(),
        ..Default::default()
    };
    // on the prelude's own stream, of a key never written: the
    // differences found leave nothing the seeded steps see
    let watch = |start_revision: i64, watch_id: i64| {
        Op::Create(
            PRELUDE_STREAM,
            WatchCreateRequest {
                key: b"0".to_vec(),
                start_revision,
                watch_id,
                ..Default::default()
            },
        )
    };
    // a delete of every key from `c` on: etcd's duplicate-key check
    // compares the range end "\0" as a string, so it overlaps no put
    let from_c = || {
        request_op::Request::RequestDeleteRange(DeleteRangeRequest {
            key: b"c".to_vec(),
            range_end: vec![0],
            ..Default::default()
        })
    };
    vec![
        Op::Put(put(b"a", b"1")), // 2
        Op::Put(put(b"a", b"2")), // 3
        Op::Compact(CompactionRequest {
            revision: 3,
            physical: true,
        }),
        // A watcher a compaction cancelled (one response, canceled with
        // compact_revision) keeps its id until the client cancels it:
        // the cancel is answered, the id is not assigned again and asking
        // for it is refused as a duplicate (etcd 3.4 to 3.6).
        watch(2, 0),
        Op::Cancel(PRELUDE_STREAM, 0),
        watch(2, 1),
        watch(0, 0), // etcd: id 2
        watch(2, 5),
        watch(0, 5), // etcd: duplicate
        // The prev_kv of an event is the key at the revision before the
        // event's (etcd reads it at mod_revision - 1), also for a DELETE
        // of a key the same Txn put, or a PUT after the same Txn deleted
        // it (the sentinel of stream 0 asks for prev_kv).
        Op::Put(put(b"c", b"0")),
        txn(vec![
            request_op::Request::RequestPut(put(b"c", b"1")),
            from_c(),
        ]),
        Op::Put(put(b"c", b"3")),
        txn(vec![
            from_c(),
            request_op::Request::RequestPut(put(b"c", b"2")),
        ]),
    ]
}

/// Steps in [`coda`].
const CODA_STEPS: u64 = 5;

/// Step `i` of the steps every run ends with (`head`: the reference's
/// revision): a difference the random steps found in retcd that leaves
/// its store unusable for what follows. A Txn deletes a key with a
/// from-key delete (no duplicate for etcd, see [`prelude`]) and puts it
/// again, both at one revision, and the store is compacted at exactly
/// that revision: etcd 3.4 keeps the new value; etcd 3.5.16+ (the
/// tombstone at the compaction revision kept, etcd#18274) deletes its row
/// and keeps the index entry, so any later read of the key fails (etcd
/// exits: "range failed to find revision pair"; etcd#22376, fix proposed
/// in etcd#22377), and so did retcd ("mvcc: backend: range cannot find
/// rev"). Then a Txn puts another key and that one, and a delete removes
/// the other key: where the second put failed, retcd had answered the Txn
/// with that error but kept the first put in its index and sent its
/// event to the watchers, without a new revision (the delete then found
/// nothing, later writes of the key failed, and a later delete once
/// panicked the raft thread: "cannot tombstone an existing key"). The
/// keys, `\xff\xff` and `y`, are outside the key space.
fn coda(i: u64, head: i64) -> Op {
    const KEY: &[u8] = b"\xff\xff";
    let put = |k: &[u8], v: &[u8]| PutRequest {
        key: k.to_vec(),
        value: v.to_vec(),
        prev_kv: true,
        ..Default::default()
    };
    match i {
        0 => Op::Put(put(KEY, b"1")),
        1 => txn(vec![
            request_op::Request::RequestDeleteRange(DeleteRangeRequest {
                key: KEY.to_vec(),
                range_end: vec![0],
                ..Default::default()
            }),
            request_op::Request::RequestPut(put(KEY, b"2")),
        ]),
        2 => Op::Compact(CompactionRequest {
            revision: head,
            physical: true,
        }),
        // its prev_kv (and the sentinels' events): the value the Txn put
        3 => txn(vec![
            request_op::Request::RequestPut(put(b"y", b"1")),
            request_op::Request::RequestPut(put(KEY, b"3")),
        ]),
        _ => Op::Delete(DeleteRangeRequest {
            key: b"y".to_vec(),
            prev_kv: true,
            ..Default::default()
        }),
    }
}

#[test]
fn per_watch_flattens_events_and_keeps_control_responses() {
    let kv = |k: &[u8], m: i64| KeyValue {
        key: k.to_vec().into(),
        mod_revision: m,
        ..Default::default()
    };
    let ev = |k: &[u8], m: i64| Event {
        kv: Some(kv(k, m)),
        ..Default::default()
    };
    let resp = |id: i64, rev: i64, events: Vec<Event>| WatchResponse {
        header: Some(ResponseHeader {
            revision: rev,
            ..Default::default()
        }),
        watch_id: id,
        events,
        ..Default::default()
    };
    let created = WatchResponse {
        created: true,
        ..resp(0, 1, vec![])
    };
    let got: Vec<Delivery> = vec![
        Ok(created),
        Ok(resp(1, 3, vec![ev(b"a", 2), ev(b"b", 3)])),
        Ok(resp(0, 2, vec![ev(b"a", 2)])),
        Err(None),
    ];
    let w = per_watch(&got);
    assert_eq!(w.len(), 3);
    assert_eq!(w[&0].len(), 2);
    assert!(matches!(w[&0][0], Item::Resp { created: true, .. }));
    assert_eq!(w[&1].len(), 2);
    assert!(matches!(w[&1][1], Item::Event { rev: 3, .. }));
    assert_eq!(w[&END_ID], vec![Item::End(None)]);
    assert_eq!(
        readable("PutRequest { key: [97, 47, 98], value: [] }"),
        r#"PutRequest { key: "a/b", value: [] }"#
    );
    assert_eq!(prefix_end(b"a\xff"), b"b");
}
