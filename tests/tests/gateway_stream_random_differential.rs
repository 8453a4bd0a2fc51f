//! A seeded random differential test of the JSON gateway's *streaming*
//! routes over plain HTTP/1.1: `POST /v3/watch`, `POST /v3/lease/keepalive`
//! and `POST /v3/election/observe`. The same sequence of steps goes to a
//! fresh 1-node real etcd 3.5.1 (the reference: retcd's gateway follows
//! etcd 3.5's grpc-gateway v1.16) and a fresh 1-node target (retcd by
//! default; `RETCD_TEST_FLAVOR=etcd` makes it a second etcd 3.5.1, which
//! checks the test itself), both empty and started with the same flags.
//!
//! A run starts with a few fixed writes (two leases the servers choose, one
//! with an explicit ID, three keys, a leader of the election `el`). A step
//! is: 0–3 writes through the unary gateway (`/v3/kv/put`,
//! `deleterange`, `compaction`, `/v3/lease/grant`, `revoke`,
//! `/v3/election/campaign`, `proclaim`, `resign`, `leader`), then 1–3
//! stream requests opened at once on each server, each read until it has
//! been idle for [`IDLE`] (or ended); then, for a body left open (chunked,
//! no last chunk), its further request objects are sent and the streams
//! read until idle again; then, sometimes, 1–3 more unary writes while the
//! streams are open ("live" writes: watch events, a new leader, a
//! proclaimed value) and a last read until idle. The streams are then
//! closed by the client and compared.
//!
//! The stream bodies: one or several JSON request objects one after
//! another (separated by nothing, spaces or line breaks), sent with a
//! `Content-Length`, as a complete chunked body, or as a chunked body left
//! open (objects sent later, the body maybe ended later); an empty body,
//! one of whitespace only, `null` objects, objects with unknown fields, a
//! first object the decoder refuses (500/400 before the stream), a later
//! one it refuses (the requests end there), trailing garbage. Watch
//! requests: creates with keys and ranges over a small key space, start
//! revisions (0, past, compacted, the head, the future), filters (by name
//! or number, an unknown number), `prev_kv`, `progress_notify`,
//! `fragment`, explicit watch IDs (duplicates and negative ones too);
//! cancels (of live and unknown IDs); progress requests. Keepalive
//! requests: live, revoked, explicitly granted, unknown, 0 and negative
//! lease IDs, as numbers and as strings. Observe: elections with and
//! without a leader (whose key may be a plain key under the election's
//! prefix). Each field is written in its .proto or camelCase name, and
//! sometimes oddly: an explicit default or `null` (Go's decoder: the
//! default), the same field twice (Go takes the last), both name forms
//! (Go takes the camelCase one), two members of a oneof (etcd 3.5.1
//! takes the highest field number; not generated when a server is etcd
//! 3.4, which picks one at random, nor against retcd, which refuses them
//! as etcd 3.6 does), bytes as a JSON array of numbers,
//! 64-bit integers with a space inside the string, `"null"`, `-0`, enums
//! by number or `null`, fields shuffled; and a few garbage writings.
//!
//! Compared per stream: the HTTP status (0: no answer before the client
//! closed it), the content type, the `Grpc-Metadata-Content-Type` header,
//! whether the body is chunked, how the stream ended (still open, closed
//! after the last chunk, closed without it, closed), and the lines of the
//! body (`{"result":…}` / `{"error":…}`, with or without the newline
//! delimiter), each parsed as JSON and compared as a value and by its key
//! order. The unary writes' answers (status, content type, body) are
//! compared too. Normalised, as they differ between two etcd processes by
//! nature:
//! - the header's `cluster_id`, `member_id` and `raft_term`;
//! - lease IDs the servers chose, as `<lease#i>` by grant order (requests
//!   name such a lease by its grant order), also inside keys that carry
//!   one in hex (an election's leader key, `name/<lease hex>`);
//! - the order of a watch stream's lines across watch IDs: etcd hands a
//!   revision's events to a stream's watchers in Go map order, and sends
//!   `created`/`canceled` answers and events on two channels its send loop
//!   selects between at random; lines are compared per watch ID (`-1`:
//!   refusals and progress answers), in order;
//! - when both servers refuse a first object their JSON decoders could not
//!   read, the message is the decoder's own wording (Go's `encoding/json`,
//!   Rust's serde): only the status and the code are compared, the
//!   wordings are tallied (`RETCD_GWSTREAM_DIFF_MESSAGES=1`, and two etcd
//!   servers, compare them).
//!
//! Nothing is decided by timing: every answer etcd gives here comes within
//! ~100 ms (its unsynced watchers are caught up every 100 ms), well within
//! [`IDLE`]; what is compared does not depend on when a line came.
//! What the generator avoids, with the reason:
//! - a cancel in the same batch of objects after a create with a past
//!   start revision (the watcher catches up from history in etcd's sync
//!   loop, up to 100 ms later: whether its events come before the cancel
//!   is a race), and a start revision exactly at a compaction revision
//!   holding a delete (etcd 3.4/3.5 before 3.5.16 drop that tombstone
//!   racily);
//! - a progress request on a stream without watchers, or with a watcher
//!   that is not synced (catching up, compacted, or starting in the
//!   future): etcd 3.5.1 answers it at once, etcd 3.5.8+ (whose behaviour
//!   retcd follows, see `watch_random_differential`) answers it only once
//!   all watchers are synced, or never;
//! - a negative start revision (etcd 3.5.24+ refuses it, 3.5.1 accepts
//!   it), a watch ID of -1 (the ID of refusals);
//! - a campaign that would block: one with a live lease is sent only when
//!   the reference's `/v3/election/leader` (sent to both, compared) shows
//!   no leader or the campaigning lease's own key; a campaign with lease 0
//!   (etcd's election service would grant a lease of its own);
//! - leases that could expire (every grant asks for an hour).
//!
//! `RETCD_GWSTREAM_DIFF_SEED` (default 1) and `RETCD_GWSTREAM_DIFF_STEPS`
//! (default 60, about 25 s) replay and size a run;
//! `RETCD_GWSTREAM_DIFF_TRACE=1` prints every step with both answers;
//! `RETCD_GWSTREAM_DIFF_SHOW` (default 20) is how many differing steps are
//! printed. `RETCD_GWSTREAM_DIFF_REFERENCE` selects the reference's
//! binary (unset: etcd 3.5.1; `3.4`: etcd 3.4.23; else a path) and
//! `RETCD_GWSTREAM_DIFF_TARGET_BIN` the target's when it is etcd (unset:
//! etcd 3.5.1).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use retcd_tests::http::{raw_exchange, RawResp};
use retcd_tests::random_diff::{env_u64, key_order, range_end, Dice};
use retcd_tests::{bounded, limit::NORMAL as LIMIT, test_flavor, Cluster, Flavor, FAST};
use serde_json::Value;

/// Each unary request's bound.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// A stream is read until nothing came for this long (or it ended).
const IDLE: Duration = Duration::from_millis(250);

/// ... bounded by this (a stream that keeps sending).
const SETTLE_MAX: Duration = Duration::from_secs(5);

/// The key space: prefixes and ranges overlap; `el/x` is a plain key under
/// the election `el`'s prefix, `/x` under the election `""`'s.
const KEYS: [&[u8]; 9] = [
    b"a", b"a/b", b"ab", b"b", b"\x00", b"\xff", b"el/x", b"/x", b"zz",
];

/// Values, few.
const VALUES: [&[u8]; 4] = [b"", b"v", b"vv", b"\xff\x00"];

/// Election names (the prefix is the name and `/`).
const ELECTIONS: [&[u8]; 3] = [b"el", b"el2", b""];

/// Lease IDs the test grants explicitly.
const EXPLICIT_LEASES: [i64; 3] = [4097, 4098, 4099];

/// A lease ID never granted.
const UNKNOWN_LEASE: i64 = 2989;

/// Every grant asks for an hour: none expires during a run.
const TTL: i64 = 3600;

// ---------------------------------------------------------------------
// JSON and base64 helpers.

const STD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard padded base64 (what the gateway writes and reads).
fn b64(bytes: &[u8]) -> String {
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (c.iter().enumerate()).fold(0u32, |n, (i, &x)| n | (x as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= c.len() {
                out.push(STD[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes standard base64 (padded or not); `None` if it is not.
fn unb64(s: &str) -> Option<Vec<u8>> {
    let six: Option<Vec<u32>> = (s.trim_end_matches('=').bytes())
        .map(|c| STD.iter().position(|&x| x == c).map(|x| x as u32))
        .collect();
    let six = six?;
    let bytes = six.chunks(4).flat_map(|c| {
        let n = (c.iter().enumerate()).fold(0u32, |n, (i, &x)| n | x << (18 - 6 * i));
        (0..c.len().saturating_sub(1)).map(move |i| (n >> (16 - 8 * i)) as u8)
    });
    Some(bytes.collect())
}

/// A JSON string literal.
fn q(s: &str) -> String {
    Value::from(s).to_string()
}

/// A JSON int64 (a string, as the gateway writes it, or a number).
fn as_i64(v: &Value) -> i64 {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| v.as_i64())
        .unwrap_or(0)
}

// ---------------------------------------------------------------------
// What the generator sends.

/// A lease as a request names it: the `i`-th one the servers chose (each
/// server's copy of the request gets its own ID), or an ID as it is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Lease {
    Chosen(usize),
    Id(i64),
}

impl Lease {
    /// Its text in a request: a placeholder or digits.
    fn text(self) -> String {
        match self {
            Lease::Chosen(i) => format!("@L{i}@"),
            Lease::Id(id) => id.to_string(),
        }
    }
}

/// A unary request's route.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Route {
    Put,
    Delete,
    Compaction,
    Grant,
    Revoke,
    Campaign,
    Proclaim,
    Resign,
    Leader,
}

impl Route {
    fn path(self) -> &'static str {
        match self {
            Route::Put => "/v3/kv/put",
            Route::Delete => "/v3/kv/deleterange",
            Route::Compaction => "/v3/kv/compaction",
            Route::Grant => "/v3/lease/grant",
            Route::Revoke => "/v3/lease/revoke",
            Route::Campaign => "/v3/election/campaign",
            Route::Proclaim => "/v3/election/proclaim",
            Route::Resign => "/v3/election/resign",
            Route::Leader => "/v3/election/leader",
        }
    }
}

/// A unary request: its route and canonical body (lease placeholders
/// `@L<i>@`, leader placeholders `@E<election>@`); `lease`: the lease it
/// grants, revokes or campaigns with; `election`: the election it names.
#[derive(Debug, Clone)]
struct Action {
    route: Route,
    body: String,
    lease: Option<Lease>,
    election: usize,
}

/// A streaming route.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Watch,
    KeepAlive,
    Observe,
}

impl Kind {
    fn path(self) -> &'static str {
        match self {
            Kind::Watch => "/v3/watch",
            Kind::KeepAlive => "/v3/lease/keepalive",
            Kind::Observe => "/v3/election/observe",
        }
    }
}

/// How a stream request's body is sent.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Framing {
    /// With `Content-Length`, whole.
    Length,
    /// Chunked, whole (the pieces split anywhere), last chunk included.
    Chunked,
    /// Chunked; the first pieces at once, the others later, then the last
    /// chunk if `finish`.
    Open { finish: bool },
}

/// One stream request: its body in pieces (lease placeholders in them),
/// the pieces sent later (an open body), and its odd writings.
#[derive(Debug, Clone)]
struct StreamSpec {
    kind: Kind,
    framing: Framing,
    initial: Vec<String>,
    follow: Vec<String>,
    /// The first object is one Go's decoder refuses (the whole request is
    /// refused with the decoder's message).
    first_garbage: bool,
    tags: Vec<String>,
}

impl StreamSpec {
    fn show(&self) -> String {
        let framing = match self.framing {
            Framing::Length => "length".to_string(),
            Framing::Chunked => format!("chunked {:?}", self.initial),
            Framing::Open { finish } => format!(
                "open chunked, later {:?}{}",
                self.follow,
                if finish { " then the last chunk" } else { "" }
            ),
        };
        format!(
            "POST {} [{framing}] {:?}",
            self.kind.path(),
            self.initial.concat()
        )
    }
}

/// A watch request, as Go's decoder reads it.
#[derive(Debug, Clone)]
enum WReq {
    Create(Create),
    Cancel(i64),
    Progress,
    /// A request with no member set (`{}`, `null`, unknown fields only):
    /// etcd ignores it.
    Empty,
}

#[derive(Debug, Clone, Default)]
struct Create {
    key: Vec<u8>,
    end: Vec<u8>,
    start: i64,
    filters: Vec<i64>,
    prev_kv: bool,
    progress_notify: bool,
    fragment: bool,
    watch_id: i64,
}

/// A watcher's state, as far as the races the generator avoids go.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sync {
    /// From the head on (start revision 0): synced from the start.
    Synced,
    /// Starting in the future.
    Future,
    /// Catching up from history (start revision in the past).
    Catching,
    /// Started below the compaction: cancelled by etcd with the
    /// compaction revision (never synced for etcd 3.5.8+).
    Compacted,
}

/// The watchers a watch stream's requests make, as predicted from their
/// meanings (etcd 3.5.1's `watchStream.Watch`: auto IDs count up from 0
/// past the IDs in use; a create of an empty range or of an ID in use is
/// refused).
#[derive(Debug, Default)]
struct WatchSim {
    next_id: i64,
    live: BTreeMap<i64, Sync>,
    /// A create that catches up was sent since the last settle.
    catching: bool,
    /// An object the decoder refused ended the requests.
    dead: bool,
}

impl WatchSim {
    fn apply(&mut self, req: &WReq, head: i64, compacted: i64) {
        if self.dead {
            return;
        }
        match req {
            WReq::Create(c) => {
                if !c.end.is_empty() && c.end != [0] && c.key >= c.end {
                    return; // an empty range
                }
                let id = if c.watch_id != 0 {
                    if self.live.contains_key(&c.watch_id) {
                        return; // a duplicate ID
                    }
                    c.watch_id
                } else {
                    while self.live.contains_key(&self.next_id) {
                        self.next_id += 1;
                    }
                    self.next_id += 1;
                    self.next_id - 1
                };
                let sync = match c.start {
                    0 => Sync::Synced,
                    s if s > head => Sync::Future,
                    s if s < compacted => Sync::Compacted,
                    _ => Sync::Catching,
                };
                self.catching |= matches!(sync, Sync::Catching | Sync::Compacted);
                self.live.insert(id, sync);
            }
            WReq::Cancel(id) => {
                self.live.remove(id);
            }
            WReq::Progress | WReq::Empty => {}
        }
    }

    /// After the streams were read until idle: watchers caught up.
    fn settled(&mut self) {
        self.catching = false;
        for s in self.live.values_mut() {
            if *s == Sync::Catching {
                *s = Sync::Synced;
            }
        }
    }

    fn cancel_ok(&self) -> bool {
        !self.catching && !self.dead
    }

    fn progress_ok(&self) -> bool {
        !self.catching
            && !self.dead
            && !self.live.is_empty()
            && self.live.values().all(|s| *s == Sync::Synced)
    }
}

/// A field of a request object, for the writer: its .proto and camelCase
/// names, its value, and whether it is set (not the default).
struct Field {
    proto: &'static str,
    camel: &'static str,
    val: FVal,
    set: bool,
}

fn field(proto: &'static str, camel: &'static str, val: FVal, set: bool) -> Field {
    Field {
        proto,
        camel,
        val,
        set,
    }
}

enum FVal {
    Bytes(Vec<u8>),
    /// Digits, or a lease placeholder.
    Int(String),
    Bool(bool),
    /// `FilterType` numbers (0 NOPUT, 1 NODELETE, others unknown).
    Enums(Vec<i64>),
    /// A message already written, and whether Go's decoder reads it.
    Raw(String, bool),
}

// ---------------------------------------------------------------------
// The generator.

/// The generator, and what it learns from the reference's answers.
struct Gen {
    rng: StdRng,
    head: i64,
    compacted: i64,
    /// Revisions whose write deleted keys.
    delete_revs: BTreeSet<i64>,
    /// Leases the reference chose so far.
    chosen: usize,
    /// Leases granted and not revoked.
    alive: Vec<Lease>,
    /// Two members of a oneof in one object (not with etcd 3.4).
    oneof_dups: bool,
    tags: Vec<String>,
}

impl Dice for Gen {
    fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }
}

/// A leaf is written oddly with this probability ...
const ODD: f64 = 0.08;
/// ... and an odd writing is garbage with this one.
const GARBAGE: f64 = 0.15;

impl Gen {
    fn new(seed: u64, oneof_dups: bool) -> Gen {
        Gen {
            rng: StdRng::seed_from_u64(seed),
            head: 1,
            compacted: 0,
            delete_revs: BTreeSet::new(),
            chosen: 0,
            alive: Vec::new(),
            oneof_dups,
            tags: Vec::new(),
        }
    }

    fn tag(&mut self, t: impl Into<String>) {
        let t = t.into();
        if !self.tags.contains(&t) {
            self.tags.push(t);
        }
    }

    fn odd(&mut self) -> bool {
        self.p(ODD)
    }

    // --- unary writes

    /// A lease for a put: mostly a live one.
    fn lease_any(&mut self) -> Lease {
        match self.rng.random_range(0..100) {
            0..60 if !self.alive.is_empty() => self.pick(&self.alive.clone()),
            0..75 if self.chosen > 0 => Lease::Chosen(self.rng.random_range(0..self.chosen)),
            0..88 => Lease::Id(self.pick(&EXPLICIT_LEASES)),
            _ => Lease::Id(UNKNOWN_LEASE),
        }
    }

    fn election(&mut self) -> usize {
        self.rng.random_range(0..ELECTIONS.len())
    }

    /// The next unary write; `live`: while streams are open (mostly
    /// writes watchers and observers see).
    fn action(&mut self, live: bool) -> Action {
        let roll = self.rng.random_range(0..100);
        let route = if live {
            match roll {
                0..45 => Route::Put,
                45..65 => Route::Delete,
                65..75 => Route::Campaign,
                75..85 => Route::Proclaim,
                85..90 => Route::Resign,
                90..95 => Route::Revoke,
                95..98 => Route::Grant,
                _ => Route::Compaction,
            }
        } else {
            match roll {
                0..30 => Route::Put,
                30..42 => Route::Delete,
                42..47 => Route::Compaction,
                47..57 => Route::Grant,
                57..62 => Route::Revoke,
                62..78 => Route::Campaign,
                78..86 => Route::Proclaim,
                86..92 => Route::Resign,
                _ => Route::Leader,
            }
        };
        let e = self.election();
        let name = q(&b64(ELECTIONS[e]));
        let mut lease = None;
        let body = match route {
            Route::Put => {
                let key = self.pick(&KEYS);
                let value = self.pick(&VALUES);
                let mut m = format!("{{\"key\":{},\"value\":{}", q(&b64(key)), q(&b64(value)));
                if self.p(0.3) {
                    m += &format!(",\"lease\":{}", q(&self.lease_any().text()));
                }
                if self.p(0.3) {
                    m += ",\"prev_kv\":true";
                }
                m + "}"
            }
            Route::Delete => {
                let key = self.pick(&KEYS);
                let mut m = format!("{{\"key\":{}", q(&b64(key)));
                if self.p(0.4) {
                    let end = range_end(&mut self.rng, key, &KEYS);
                    if !end.is_empty() {
                        m += &format!(",\"range_end\":{}", q(&b64(&end)));
                    }
                }
                m + "}"
            }
            Route::Compaction => {
                let rev = if self.head > self.compacted && self.p(0.9) {
                    self.rng.random_range(self.compacted + 1..=self.head)
                } else {
                    self.head + 1 // refused: the future
                };
                format!("{{\"revision\":\"{rev}\",\"physical\":true}}")
            }
            Route::Grant => {
                let l = if self.p(0.75) {
                    Lease::Chosen(self.chosen)
                } else {
                    Lease::Id(self.pick(&EXPLICIT_LEASES))
                };
                lease = Some(l);
                match l {
                    Lease::Chosen(_) => format!("{{\"TTL\":\"{TTL}\"}}"),
                    Lease::Id(id) => format!("{{\"TTL\":\"{TTL}\",\"ID\":\"{id}\"}}"),
                }
            }
            Route::Revoke => {
                let l = self.lease_any();
                lease = Some(l);
                format!("{{\"ID\":{}}}", q(&l.text()))
            }
            Route::Campaign => {
                // Not lease 0 (see the module documentation).
                let l = match self.lease_any() {
                    Lease::Id(0) => Lease::Id(UNKNOWN_LEASE),
                    l => l,
                };
                lease = Some(l);
                let value = q(&b64(self.pick(&VALUES)));
                format!(
                    "{{\"name\":{name},\"lease\":{},\"value\":{value}}}",
                    q(&l.text())
                )
            }
            Route::Proclaim => {
                let value = q(&b64(self.pick(&VALUES)));
                format!("{{\"leader\":@E{e}@,\"value\":{value}}}")
            }
            Route::Resign => format!("{{\"leader\":@E{e}@}}"),
            Route::Leader => format!("{{\"name\":{name}}}"),
        };
        Action {
            route,
            body,
            lease,
            election: e,
        }
    }

    /// The first writes of a run: two leases the servers choose, one
    /// granted with its ID, a few keys, a leader of `el`.
    fn prelude(&self) -> Vec<Action> {
        let a = |route, body: &str, lease, election| Action {
            route,
            body: body.to_string(),
            lease,
            election,
        };
        let grant = format!("{{\"TTL\":\"{TTL}\"}}");
        vec![
            a(Route::Grant, &grant, Some(Lease::Chosen(0)), 0),
            a(Route::Grant, &grant, Some(Lease::Chosen(1)), 0),
            a(
                Route::Grant,
                &format!("{{\"TTL\":\"{TTL}\",\"ID\":\"4097\"}}"),
                Some(Lease::Id(4097)),
                0,
            ),
            a(Route::Put, r#"{"key":"YQ==","value":"dg=="}"#, None, 0),
            a(
                Route::Put,
                r#"{"key":"YS9i","value":"dnY=","lease":"@L1@"}"#,
                None,
                0,
            ),
            a(
                Route::Put,
                r#"{"key":"Yg==","value":"","lease":"4097"}"#,
                None,
                0,
            ),
            a(
                Route::Campaign,
                r#"{"name":"ZWw=","lease":"@L0@","value":"dg=="}"#,
                Some(Lease::Chosen(0)),
                0,
            ),
        ]
    }

    /// Learns from the reference's answer to `a`.
    fn learn(&mut self, a: &Action, status: u16, answer: &Value) {
        let head_before = self.head;
        let head = answer.pointer("/header/revision").map_or(0, as_i64);
        self.head = self.head.max(head);
        if status != 200 {
            return;
        }
        match a.route {
            Route::Compaction => {
                let rev = serde_json::from_str::<Value>(&a.body).unwrap_or_default();
                self.compacted = self.compacted.max(as_i64(&rev["revision"]));
            }
            Route::Grant => {
                if let Some(l) = a.lease {
                    if matches!(l, Lease::Chosen(_)) {
                        self.chosen += 1;
                    }
                    self.alive.push(l);
                }
            }
            Route::Revoke => self.alive.retain(|l| Some(*l) != a.lease),
            _ => {}
        }
        if matches!(a.route, Route::Delete | Route::Revoke | Route::Resign)
            && self.head > head_before
        {
            self.delete_revs.insert(self.head);
        }
    }

    // --- stream requests

    /// The stream requests of a step.
    fn streams(&mut self) -> Vec<StreamSpec> {
        let n = match self.rng.random_range(0..100) {
            0..60 => 1,
            60..90 => 2,
            _ => 3,
        };
        (0..n)
            .map(|_| {
                self.tags.clear();
                let mut s = match self.rng.random_range(0..100) {
                    0..55 => self.watch_spec(),
                    55..80 => self.keepalive_spec(),
                    _ => self.observe_spec(),
                };
                s.tags = std::mem::take(&mut self.tags);
                s
            })
            .collect()
    }

    /// A separator between objects.
    fn sep(&mut self) -> &'static str {
        self.pick(&["", "", " ", "\n", "\r\n\t "])
    }

    /// A first object Go's decoder refuses.
    fn garbage_obj(&mut self, kind: Kind) -> String {
        self.tag("body:garbage");
        let valid = match kind {
            Kind::Watch => "{\"create_request\":{\"key\":\"YQ==\",\"start_revision\":\"1\"}}",
            Kind::KeepAlive => "{\"ID\":\"4097\"}",
            Kind::Observe => "{\"name\":\"ZWw=\"}",
        };
        let cut = self.rng.random_range(1..valid.len());
        let g = self.pick(&[
            "{bad",
            "[]",
            "\"x\"",
            "hello",
            "5",
            "{\"create_request\":{\"key\":\"!!\"}}",
            "{\"ID\":1.5}",
            "{\"name\":7}",
            &valid[..cut],
        ]);
        g.to_string()
    }

    /// How a body is sent.
    fn framing(&mut self) -> Framing {
        match self.rng.random_range(0..100) {
            0..8 => {
                self.tag("framing:chunked");
                Framing::Chunked
            }
            8..16 => {
                self.tag("framing:open");
                Framing::Open {
                    finish: self.p(0.5),
                }
            }
            _ => Framing::Length,
        }
    }

    /// `pieces` as the chunks of a chunked body, split anywhere.
    fn split_pieces(&mut self, pieces: Vec<String>) -> Vec<String> {
        let body = pieces.concat();
        if body.len() < 2 {
            return vec![body];
        }
        // Not inside a placeholder (`@L1@`: rendered after the split).
        let mut inside = false;
        let ok: Vec<usize> = (1..body.len())
            .filter(|&i| {
                inside ^= body.as_bytes()[i - 1] == b'@';
                !inside
            })
            .collect();
        if ok.is_empty() {
            return vec![body];
        }
        let mut cuts: Vec<usize> = (0..self.rng.random_range(0..3))
            .map(|_| self.pick(&ok))
            .collect();
        cuts.sort();
        cuts.dedup();
        let mut out = Vec::new();
        let mut at = 0;
        for c in cuts.into_iter().chain([body.len()]) {
            out.push(body[at..c].to_string());
            at = c;
        }
        out
    }

    /// A body's pieces with the framing's later pieces, and whether the
    /// first object is garbage. `objs(gen, later)` makes the next object
    /// (text, Go reads it), `None` when there is none.
    fn body(
        &mut self,
        kind: Kind,
        n: usize,
        objs: &mut dyn FnMut(&mut Gen, bool) -> Option<(String, bool)>,
    ) -> StreamSpec {
        let mut initial = Vec::new();
        let mut first_garbage = false;
        match self.rng.random_range(0..100) {
            0..3 => self.tag("body:empty"),
            3..6 => {
                self.tag("body:whitespace");
                initial.push(self.pick(&[" ", "\n", "\r\n\t "]).to_string());
            }
            6..10 => {
                first_garbage = true;
                initial.push(self.garbage_obj(kind));
                if self.p(0.5) {
                    if let Some((t, _)) = objs(self, false) {
                        initial.push(format!(" {t}"));
                    }
                }
            }
            _ => {
                let lead = if self.p(0.05) { "\n  " } else { "" };
                for i in 0..n {
                    let Some((t, ok)) = objs(self, false) else {
                        break;
                    };
                    first_garbage |= i == 0 && !ok;
                    let sep = if i == 0 { lead } else { self.sep() };
                    initial.push(format!("{sep}{t}"));
                }
                match self.rng.random_range(0..100) {
                    0..4 => {
                        self.tag("body:trailing");
                        let t = self.pick(&[" x", "{bad", "]", " 5", "\n\"s\""]);
                        initial.push(t.to_string());
                    }
                    4..7 => {
                        self.tag("body:trailing-null");
                        initial.push(" null".into());
                    }
                    _ => {}
                }
            }
        }
        let framing = self.framing();
        let mut follow = Vec::new();
        match framing {
            Framing::Chunked => initial = self.split_pieces(initial),
            Framing::Open { .. } => {
                for _ in 0..self.rng.random_range(0..3) {
                    if let Some((t, _)) = objs(self, true) {
                        let sep = self.sep();
                        follow.push(format!("{sep}{t}"));
                    }
                }
            }
            Framing::Length => {}
        }
        StreamSpec {
            kind,
            framing,
            initial,
            follow,
            first_garbage,
            tags: Vec::new(),
        }
    }

    /// How many objects a body holds.
    fn count(&mut self) -> usize {
        match self.rng.random_range(0..100) {
            0..40 => 1,
            40..70 => 2,
            70..90 => 3,
            _ => 4,
        }
    }

    fn watch_spec(&mut self) -> StreamSpec {
        let mut sim = WatchSim::default();
        let n = self.count();
        let mut settled = false;
        self.body(Kind::Watch, n, &mut |g: &mut Gen, later| {
            if later && !settled {
                sim.settled();
                settled = true;
            }
            let req = g.watch_req(&sim);
            let (text, ok) = g.w_watch_req(&req);
            if ok {
                sim.apply(&req, g.head, g.compacted);
            } else {
                sim.dead = true;
            }
            Some((text, ok))
        })
    }

    fn keepalive_spec(&mut self) -> StreamSpec {
        let n = self.count();
        self.body(Kind::KeepAlive, n, &mut |g: &mut Gen, _| {
            let l = match g.rng.random_range(0..100) {
                0..50 if !g.alive.is_empty() => g.pick(&g.alive.clone()),
                0..65 if g.chosen > 0 => Lease::Chosen(g.rng.random_range(0..g.chosen)),
                0..80 => Lease::Id(g.pick(&EXPLICIT_LEASES)),
                80..87 => Lease::Id(0),
                87..95 => Lease::Id(UNKNOWN_LEASE),
                _ => Lease::Id(-1),
            };
            if g.p(0.03) {
                g.tag("request:null");
                return Some(("null".into(), true));
            }
            let set = l != Lease::Id(0);
            Some(g.w_obj(vec![field("ID", "ID", FVal::Int(l.text()), set)], None))
        })
    }

    fn observe_spec(&mut self) -> StreamSpec {
        let mut spec = self.body(Kind::Observe, 1, &mut |g: &mut Gen, _| {
            let name: &[u8] = if g.p(0.1) {
                b"nosuch"
            } else {
                g.pick(&ELECTIONS)
            };
            match g.rng.random_range(0..100) {
                0..4 => {
                    g.tag("request:{}");
                    Some(("{}".into(), true))
                }
                4..7 => {
                    g.tag("request:null");
                    Some(("null".into(), true))
                }
                _ => Some(g.w_obj(
                    vec![field("name", "name", FVal::Bytes(name.to_vec()), true)],
                    None,
                )),
            }
        });
        // Sometimes a second object (the gateway reads only the first).
        if spec.framing == Framing::Length && !spec.initial.is_empty() && self.p(0.1) {
            self.tag("body:second-object");
            spec.initial.push(" {\"name\":\"ZWwy\"}".into());
        }
        spec
    }

    /// A create's meaning.
    fn create(&mut self) -> Create {
        let key = if self.p(0.05) {
            Vec::new()
        } else {
            self.pick(&KEYS).to_vec()
        };
        let end = range_end(&mut self.rng, &key, &KEYS);
        let (head, compacted) = (self.head, self.compacted);
        let mut start = match self.rng.random_range(0..100) {
            0..35 => 0,
            35..58 => self.rng.random_range(1..=head),
            58..68 if compacted > 1 => self.rng.random_range(1..compacted),
            58..72 if compacted > 0 => compacted,
            58..78 => head,
            78..88 => head + 1,
            88..96 => head + self.rng.random_range(2..5),
            _ => i64::MAX,
        };
        // Not exactly at a compaction revision holding a delete.
        if start == compacted && self.delete_revs.contains(&compacted) {
            start = 0;
        }
        let filters = match self.rng.random_range(0..100) {
            0..80 => vec![],
            80..87 => vec![0],
            87..94 => vec![1],
            94..97 => vec![0, 1],
            _ => vec![7],
        };
        let watch_id = if self.p(0.2) {
            self.pick(&[1, 2, 5, -3])
        } else {
            0
        };
        Create {
            key,
            end,
            start,
            filters,
            prev_kv: self.p(0.3),
            progress_notify: self.p(0.15),
            fragment: self.p(0.15),
            watch_id,
        }
    }

    /// A watch request's meaning (see [`WatchSim`] for what is avoided).
    fn watch_req(&mut self, sim: &WatchSim) -> WReq {
        match self.rng.random_range(0..100) {
            70..85 if sim.cancel_ok() => {
                let live: Vec<i64> = sim.live.keys().copied().collect();
                if !live.is_empty() && self.p(0.75) {
                    WReq::Cancel(self.pick(&live))
                } else {
                    WReq::Cancel(self.pick(&[0, 3, 7, -2]))
                }
            }
            85..95 if sim.progress_ok() => WReq::Progress,
            95..100 => WReq::Empty,
            _ => WReq::Create(self.create()),
        }
    }

    // --- writings: text, and whether Go's decoder reads it (as meant)

    fn w_watch_req(&mut self, req: &WReq) -> (String, bool) {
        let decoy = |g: &mut Gen, lower: &[&'static str]| -> Option<(String, String)> {
            if !g.oneof_dups || !g.p(0.06) {
                return None;
            }
            g.tag("dup:oneof");
            let name = g.pick(lower);
            let text = match name {
                "create_request" => "{\"key\":\"YQ==\"}",
                _ => "{\"watch_id\":\"9\"}",
            };
            Some((name.to_string(), text.to_string()))
        };
        match req {
            WReq::Empty => {
                let t = self.pick(&[
                    "{}",
                    "null",
                    "{\"nosuch\":1}",
                    "{\"create_request\":null}",
                    "{\"cancelRequest\":null}",
                ]);
                self.tag(format!("request:{t}"));
                (t.to_string(), true)
            }
            WReq::Create(c) => {
                let (inner, ok) = self.w_create(c);
                let f = field(
                    "create_request",
                    "createRequest",
                    FVal::Raw(inner, ok),
                    true,
                );
                self.w_obj(vec![f], None)
            }
            WReq::Cancel(id) => {
                let id_field = field("watch_id", "watchId", FVal::Int(id.to_string()), *id != 0);
                let (inner, ok) = self.w_obj(vec![id_field], None);
                let d = decoy(self, &["create_request"]);
                let f = field(
                    "cancel_request",
                    "cancelRequest",
                    FVal::Raw(inner, ok),
                    true,
                );
                self.w_obj(vec![f], d)
            }
            WReq::Progress => {
                let d = decoy(self, &["create_request", "cancel_request"]);
                let f = field(
                    "progress_request",
                    "progressRequest",
                    FVal::Raw("{}".into(), true),
                    true,
                );
                self.w_obj(vec![f], d)
            }
        }
    }

    fn w_create(&mut self, c: &Create) -> (String, bool) {
        let fields = vec![
            field("key", "key", FVal::Bytes(c.key.clone()), !c.key.is_empty()),
            field(
                "range_end",
                "rangeEnd",
                FVal::Bytes(c.end.clone()),
                !c.end.is_empty(),
            ),
            field(
                "start_revision",
                "startRevision",
                FVal::Int(c.start.to_string()),
                c.start != 0,
            ),
            field(
                "progress_notify",
                "progressNotify",
                FVal::Bool(c.progress_notify),
                c.progress_notify,
            ),
            field(
                "filters",
                "filters",
                FVal::Enums(c.filters.clone()),
                !c.filters.is_empty(),
            ),
            field("prev_kv", "prevKv", FVal::Bool(c.prev_kv), c.prev_kv),
            field(
                "watch_id",
                "watchId",
                FVal::Int(c.watch_id.to_string()),
                c.watch_id != 0,
            ),
            field("fragment", "fragment", FVal::Bool(c.fragment), c.fragment),
        ];
        self.w_obj(fields, None)
    }

    /// An object of `fields` (unset ones mostly left out); `oneof_decoy`:
    /// a lower-numbered member of the object's oneof, which Go does not
    /// take.
    fn w_obj(
        &mut self,
        fields: Vec<Field>,
        oneof_decoy: Option<(String, String)>,
    ) -> (String, bool) {
        let mut groups: Vec<Vec<(String, String)>> = Vec::new();
        let mut valid = true;
        for f in fields {
            if !f.set && !self.p(0.04) {
                continue;
            }
            if !f.set {
                self.tag("explicit-default");
            }
            let mut name = if f.camel != f.proto && self.p(0.5) {
                f.camel
            } else {
                f.proto
            };
            let (text, ok) = self.w_val(&f.val);
            valid &= ok;
            let mut group = Vec::new();
            if self.p(0.03) {
                // The field twice: Go takes the last (of both names, the
                // camelCase one).
                let decoy = match &f.val {
                    FVal::Bytes(_) => q(&b64(b"decoy")),
                    FVal::Int(_) => "\"3\"".into(),
                    FVal::Bool(b) => (!b).to_string(),
                    FVal::Enums(_) => "[\"NODELETE\"]".into(),
                    FVal::Raw(..) => "{}".into(),
                };
                if f.camel != f.proto {
                    self.tag("dup:proto+camel");
                    group.push((f.proto.to_string(), decoy));
                    name = f.camel;
                } else {
                    self.tag("dup:same-name");
                    group.push((name.to_string(), decoy));
                }
            }
            group.push((name.to_string(), text));
            groups.push(group);
        }
        if let Some(d) = oneof_decoy {
            groups.push(vec![d]);
        }
        if self.p(0.03) {
            self.tag("unknown-field");
            let (k, v) = self.pick(&[
                ("nosuch", "1"),
                ("nosuch", "{\"a\":[1,\"x\",null]}"),
                ("header", "{\"revision\":\"1\"}"),
            ]);
            groups.push(vec![(k.to_string(), v.to_string())]);
        }
        if groups.len() > 1 && self.p(0.1) {
            self.tag("order:shuffled");
            groups.shuffle(&mut self.rng);
        }
        let ws = if self.p(0.1) { " " } else { "" };
        let body: Vec<String> = (groups.into_iter().flatten())
            .map(|(k, v)| format!("{}:{ws}{v}", q(&k)))
            .collect();
        (format!("{{{}}}", body.join(&format!(",{ws}"))), valid)
    }

    fn w_val(&mut self, v: &FVal) -> (String, bool) {
        match v {
            FVal::Bytes(b) => self.w_bytes(b),
            FVal::Int(d) => self.w_i64(d),
            FVal::Bool(b) => self.w_bool(*b),
            FVal::Enums(ns) => {
                if ns.is_empty() && self.odd() {
                    self.tag("enums:null");
                    return ("null".into(), true);
                }
                let mut ok = true;
                let items: Vec<String> = ns
                    .iter()
                    .map(|&n| {
                        let (t, o) = self.w_enum(n);
                        ok &= o;
                        t
                    })
                    .collect();
                (format!("[{}]", items.join(",")), ok)
            }
            FVal::Raw(t, ok) => (t.clone(), *ok),
        }
    }

    fn w_bytes(&mut self, b: &[u8]) -> (String, bool) {
        if !self.odd() {
            return (q(&b64(b)), true);
        }
        if self.p(GARBAGE) {
            let g = self.pick(&["\"!!\"", "\"YQ==_\"", "1", "{}"]);
            self.tag(format!("bytes:garbage {g}"));
            return (g.into(), false);
        }
        if b.is_empty() && self.p(0.5) {
            self.tag("bytes:null");
            return ("null".into(), true);
        }
        self.tag("bytes:array");
        let n: Vec<String> = b.iter().map(u8::to_string).collect();
        (format!("[{}]", n.join(",")), true)
    }

    /// `d`: digits, or a lease placeholder.
    fn w_i64(&mut self, d: &str) -> (String, bool) {
        if !self.odd() {
            return if self.p(0.5) {
                (q(d), true)
            } else {
                (d.to_string(), true)
            };
        }
        if self.p(GARBAGE) {
            let g = self.pick(&["1.0", "\"1x\"", "true", "\"9223372036854775808\"", "{}"]);
            self.tag(format!("int:garbage {g}"));
            return (g.into(), false);
        }
        let mut opts = vec!["space"];
        if d == "0" {
            opts.extend(["null", "null-string", "minus-zero"]);
        }
        let o = self.pick(&opts);
        self.tag(format!("int:{o}"));
        let t = match o {
            "space" => format!("\" {d}\""),
            "null" => "null".into(),
            "null-string" => "\"null\"".into(),
            _ => "-0".into(),
        };
        (t, true)
    }

    fn w_bool(&mut self, b: bool) -> (String, bool) {
        if !self.odd() {
            return (b.to_string(), true);
        }
        if b || self.p(GARBAGE) {
            let g = self.pick(&["\"true\"", "1", "\"false\""]);
            self.tag(format!("bool:garbage {g}"));
            return (g.into(), false);
        }
        self.tag("bool:null");
        ("null".into(), true)
    }

    fn w_enum(&mut self, n: i64) -> (String, bool) {
        const NAMES: [&str; 2] = ["NOPUT", "NODELETE"];
        if !(0..2).contains(&n) {
            self.tag("enum:unknown-number");
            return (n.to_string(), true);
        }
        if !self.odd() {
            return if self.p(0.7) {
                (q(NAMES[n as usize]), true)
            } else {
                (n.to_string(), true)
            };
        }
        if self.p(GARBAGE) {
            let g = self.pick(&["\"noput\"", "\"0\"", "true"]);
            self.tag(format!("enum:garbage {g}"));
            return (g.into(), false);
        }
        if n == 0 {
            self.tag("enum:null");
            ("null".into(), true)
        } else {
            self.tag("enum:number");
            (n.to_string(), true)
        }
    }
}

// ---------------------------------------------------------------------
// HTTP: unary requests and open streams.

/// One unary `POST` (`Connection: close`), read until EOF.
fn post(port: u16, path: &str, body: &str) -> RawResp {
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    raw_exchange(port, request.as_bytes(), Instant::now() + IO_TIMEOUT)
}

/// A stream request's connection, read without blocking.
struct Conn {
    sock: Option<TcpStream>,
    raw: Vec<u8>,
    eof: bool,
    error: Option<String>,
    /// When the last byte came (or the last thing was sent).
    last: Instant,
}

fn chunk(data: &str) -> String {
    format!("{:x}\r\n{data}\r\n", data.len())
}

impl Conn {
    /// Connects and sends the request with the body's first pieces.
    fn open(port: u16, path: &str, framing: Framing, pieces: &[String]) -> Conn {
        let mut c = Conn {
            sock: None,
            raw: Vec::new(),
            eof: false,
            error: None,
            last: Instant::now(),
        };
        let framing_head = match framing {
            Framing::Length => format!("Content-Length: {}", pieces.concat().len()),
            _ => "Transfer-Encoding: chunked".into(),
        };
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
             {framing_head}\r\nConnection: close\r\n\r\n"
        );
        match framing {
            Framing::Length => req += &pieces.concat(),
            Framing::Chunked | Framing::Open { .. } => {
                for p in pieces.iter().filter(|p| !p.is_empty()) {
                    req += &chunk(p);
                }
                if framing == Framing::Chunked {
                    req += "0\r\n\r\n";
                }
            }
        }
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        match TcpStream::connect_timeout(&addr, IO_TIMEOUT) {
            Ok(s) => {
                c.sock = Some(s);
                c.send(&req);
            }
            Err(e) => {
                c.error = Some(format!("connect: {e}"));
                c.eof = true;
            }
        }
        c
    }

    fn send(&mut self, data: &str) {
        let Some(s) = &mut self.sock else { return };
        let r = s
            .set_nonblocking(false)
            .and_then(|_| s.set_write_timeout(Some(IO_TIMEOUT)))
            .and_then(|_| s.write_all(data.as_bytes()))
            .and_then(|_| s.set_nonblocking(true));
        if let Err(e) = r {
            self.error.get_or_insert(format!("write: {e}"));
            let _ = s.set_nonblocking(true);
        }
        self.last = Instant::now();
    }

    /// Reads what has come.
    fn poll(&mut self) {
        let Some(s) = &mut self.sock else { return };
        let mut buf = [0u8; 16384];
        while !self.eof {
            match s.read(&mut buf) {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    self.raw.extend_from_slice(&buf[..n]);
                    self.last = Instant::now();
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.error.get_or_insert(format!("read: {e}"));
                    self.eof = true;
                }
            }
        }
    }
}

/// Reads every connection until each ended or was idle for [`IDLE`];
/// false if that took longer than [`SETTLE_MAX`].
fn settle(conns: &mut [&mut Conn]) -> bool {
    let start = Instant::now();
    for c in conns.iter_mut() {
        c.last = start;
    }
    loop {
        conns.iter_mut().for_each(|c| c.poll());
        let now = Instant::now();
        if conns
            .iter()
            .all(|c| c.eof || now.duration_since(c.last) >= IDLE)
        {
            return true;
        }
        if now.duration_since(start) > SETTLE_MAX {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A chunked body's complete chunks, and whether the last chunk came.
fn dechunk(mut b: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return (out, false);
        };
        let size = String::from_utf8_lossy(&b[..eol]);
        let Ok(n) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16) else {
            return (out, false);
        };
        if n == 0 {
            return (out, true);
        }
        if b.len() < eol + 2 + n {
            return (out, false);
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + n]);
        b = b.get(eol + 4 + n..).unwrap_or(&[]);
    }
}

// ---------------------------------------------------------------------
// Servers and normalisation.

/// One server: its client port, what it is, the IDs of the leases it
/// chose (in grant order) and its last leader of each election.
struct Server {
    name: String,
    port: u16,
    etcd: bool,
    v34: bool,
    leases: Vec<String>,
    leaders: BTreeMap<usize, Value>,
}

impl Server {
    fn new(c: &Cluster) -> Server {
        let port = c.members[0].client_port;
        let v = retcd_tests::http_get(port, "/version", IO_TIMEOUT).expect("GET /version");
        let v = v.json().unwrap_or_default();
        let version = v["etcdserver"].as_str().unwrap_or("?").to_string();
        let retcd = v.get("retcd").is_some();
        Server {
            name: if retcd {
                format!("retcd {}", v["retcd"].as_str().unwrap_or("?"))
            } else {
                format!("etcd {version}")
            },
            port,
            etcd: !retcd,
            v34: !retcd && version.starts_with("3.4."),
            leases: Vec::new(),
            leaders: BTreeMap::new(),
        }
    }

    /// `text` with its placeholders replaced: `@L<i>@` by this server's ID
    /// of the `i`-th lease chosen (one it does not have: an unknown ID),
    /// `@E<e>@` by its last leader of election `e` (none: a leader object
    /// with only the name).
    fn render(&self, text: &str) -> String {
        let mut out = String::new();
        let mut rest = text;
        while let Some(at) = rest.find('@') {
            out.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            let sub = after.split_once('@').and_then(|(tok, tail)| {
                let i: usize = tok.get(1..)?.parse().ok()?;
                let s = match tok.get(..1)? {
                    "L" => (self.leases.get(i).cloned()).unwrap_or(UNKNOWN_LEASE.to_string()),
                    "E" => self.leaders.get(&i).map_or_else(
                        || format!("{{\"name\":{}}}", q(&b64(ELECTIONS[i]))),
                        Value::to_string,
                    ),
                    _ => return None,
                };
                Some((s, tail))
            });
            match sub {
                Some((s, tail)) => {
                    out.push_str(&s);
                    rest = tail;
                }
                None => {
                    out.push('@');
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        out
    }

    /// Sends `a`; learns the lease it chose and the leader it became.
    fn unary(&mut self, a: &Action) -> (String, RawResp) {
        let body = self.render(&a.body);
        let r = post(self.port, a.route.path(), &body);
        let v: Value = serde_json::from_str(&r.body).unwrap_or_default();
        if r.status == 200 {
            match a.route {
                Route::Grant if matches!(a.lease, Some(Lease::Chosen(_))) => {
                    if let Some(id) = v["ID"].as_str() {
                        self.leases.push(id.to_string());
                    }
                }
                Route::Campaign => {
                    self.leaders.insert(a.election, v["leader"].clone());
                }
                _ => {}
            }
        }
        (body, r)
    }

    /// A lease's ID on this server.
    fn lease_id(&self, l: Lease) -> i64 {
        match l {
            Lease::Chosen(i) => self.leases.get(i).and_then(|s| s.parse().ok()),
            Lease::Id(id) => Some(id),
        }
        .unwrap_or(UNKNOWN_LEASE)
    }

    /// `v` with what differs between two servers by nature masked.
    fn mask(&self, v: &mut Value, key: &str) {
        match v {
            Value::Object(m) => {
                for (k, v) in m.iter_mut() {
                    if matches!(k.as_str(), "cluster_id" | "member_id" | "raft_term") {
                        *v = Value::from(format!("<{k}>"));
                    } else {
                        self.mask(v, k);
                    }
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|v| self.mask(v, key)),
            Value::String(s) if key == "ID" || key == "lease" => {
                if let Some(i) = self.leases.iter().position(|l| l == s) {
                    *s = format!("<lease#{i}>");
                }
            }
            Value::String(s) if key == "key" => {
                // An election key: `name/<lease ID in hex>`.
                let text = unb64(s).and_then(|b| String::from_utf8(b).ok());
                if let Some(mut text) = text {
                    let mut hit = false;
                    for (i, id) in self.leases.iter().enumerate() {
                        let hex = id.parse::<i64>().map_or("-".into(), |v| format!("{v:x}"));
                        if text.contains(&hex) {
                            text = text.replace(&hex, &format!("<lease#{i}>"));
                            hit = true;
                        }
                    }
                    if hit {
                        *s = format!("base64({text})");
                    }
                }
            }
            Value::String(s) if matches!(key, "message" | "error" | "cancel_reason") => {
                for (i, id) in self.leases.iter().enumerate() {
                    *s = s.replace(id.as_str(), &format!("<lease#{i}>"));
                }
            }
            _ => {}
        }
    }

    /// A unary answer as compared.
    fn norm_unary(&self, r: &RawResp) -> Unary {
        // FailedPrecondition: 412 in 3.4's gateway, 400 in 3.5's.
        let status = if self.v34 && r.status == 412 {
            400
        } else {
            r.status
        };
        let mut body = serde_json::from_str::<Value>(&r.body).ok();
        if let Some(b) = &mut body {
            self.mask(b, "");
        }
        Unary {
            status,
            ctype: r.ctype.clone(),
            body,
            raw: r.body.trim().to_string(),
        }
    }

    /// A stream's answer as compared.
    fn norm_stream(&self, kind: Kind, c: &Conn) -> Stream {
        let raw = &c.raw;
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n");
        let head = String::from_utf8_lossy(&raw[..split.unwrap_or(raw.len())]).to_ascii_lowercase();
        let header = |name: &str| {
            let mut kv = head.lines().skip(1).filter_map(|l| l.split_once(':'));
            let v = kv.find(|(k, _)| k.trim() == name).map(|(_, v)| v.trim());
            v.unwrap_or("").split(';').next().unwrap_or("").to_string()
        };
        let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok());
        let status = match status.unwrap_or(0) {
            412 if self.v34 => 400,
            s => s,
        };
        let chunked = header("transfer-encoding") == "chunked";
        let mut body = split.map_or(Vec::new(), |s| raw[s + 4..].to_vec());
        let mut last_chunk = false;
        if chunked {
            (body, last_chunk) = dechunk(&body);
        } else if let Ok(n) = header("content-length").parse::<usize>() {
            body.truncate(n);
        }
        let ended = match (c.eof, chunked, last_chunk) {
            // A whole (unchunked) answer, an error before the stream: Go
            // keeps the connection while the request body is unfinished,
            // hyper closes it; either way the answer is all there.
            _ if !chunked && status != 0 => "answered whole",
            (false, ..) => "open",
            (true, true, true) => "closed after the last chunk",
            (true, true, false) => "closed without the last chunk",
            (true, false, _) => "closed",
        };
        let framing = match (status, chunked) {
            (0, _) => "",
            (_, true) => " chunked",
            _ => " not chunked",
        };
        let md = header("grpc-metadata-content-type");
        let md = if md.is_empty() {
            String::new()
        } else {
            format!(" md={md}")
        };
        let body = String::from_utf8_lossy(&body).into_owned();
        let lines = (body.split_inclusive('\n'))
            .map(|l| {
                let newline = l.ends_with('\n');
                let text = l.strip_suffix('\n').unwrap_or(l);
                let mut value = serde_json::from_str::<Value>(text).ok();
                if let Some(v) = &mut value {
                    self.mask(v, "");
                }
                let group = match (&value, kind) {
                    (Some(v), Kind::Watch) if v.get("result").is_some() => {
                        let id = &v["result"]["watch_id"];
                        id.as_str().unwrap_or("0").to_string()
                    }
                    (Some(v), Kind::Watch) if v.get("error").is_some() => "error".into(),
                    _ => String::new(),
                };
                Line {
                    shown: value.as_ref().map_or(format!("{text:?}"), Value::to_string),
                    order: if value.is_some() {
                        key_order(text)
                    } else {
                        Vec::new()
                    },
                    value,
                    newline,
                    group,
                }
            })
            .collect();
        Stream {
            status,
            head: format!("{}{md}{framing}", header("content-type")),
            ended: format!(
                "{ended}{}",
                c.error
                    .as_ref()
                    // after a whole answer, what was still sent may meet
                    // a connection hyper closed (see `ended`)
                    .filter(|e| !(ended == "answered whole" && e.starts_with("write: ")))
                    .map_or(String::new(), |e| format!(" ({e})"))
            ),
            lines,
        }
    }
}

/// A unary answer as compared.
#[derive(Debug, Clone)]
struct Unary {
    status: u16,
    ctype: String,
    body: Option<Value>,
    raw: String,
}

impl Unary {
    fn show(&self) -> String {
        let body = self
            .body
            .as_ref()
            .map_or(self.raw.clone(), Value::to_string);
        format!("{} {} {body}", self.status, self.ctype)
    }

    fn differ(&self, o: &Unary) -> Option<&'static str> {
        if self.status != o.status {
            Some("HTTP status")
        } else if self.ctype != o.ctype {
            Some("content type")
        } else if self.body.is_some() && self.body != o.body {
            Some("body")
        } else if self.body.is_none() && self.raw != o.raw {
            Some("body (not JSON)")
        } else {
            None
        }
    }
}

/// A body line: its masked value (`None`: not JSON), as shown, its
/// objects' key order, whether the delimiter followed it, and its group
/// (a watch line's watch ID).
#[derive(Debug, Clone)]
struct Line {
    value: Option<Value>,
    shown: String,
    order: Vec<String>,
    newline: bool,
    group: String,
}

/// A stream's answer as compared.
#[derive(Debug, Clone)]
struct Stream {
    status: u16,
    /// Content type, `Grpc-Metadata-Content-Type`, chunked or not.
    head: String,
    ended: String,
    lines: Vec<Line>,
}

impl Stream {
    fn show(&self) -> String {
        let mut s = format!("{} {}, {}", self.status, self.head, self.ended);
        for l in &self.lines {
            let nl = if l.newline { "" } else { " (no newline)" };
            s += &format!("\n      {}{nl}", l.shown);
        }
        s
    }

    /// A refusal of the whole request by the JSON decoder: no stream, a
    /// code, not etcdserver's message.
    fn decode_error(&self) -> Option<(i64, String)> {
        let v = self.lines.first()?.value.as_ref()?;
        let m = v["message"].as_str()?;
        (self.status != 200 && !m.starts_with("etcdserver:"))
            .then(|| (v["code"].as_i64().unwrap_or(-1), m.to_string()))
    }

    /// The lines by group, in order.
    fn groups(&self) -> BTreeMap<&str, Vec<&Line>> {
        let mut g: BTreeMap<&str, Vec<&Line>> = BTreeMap::new();
        for l in &self.lines {
            g.entry(l.group.as_str()).or_default().push(l);
        }
        g
    }
}

/// Tallies of decoder wordings: (the reference's, the target's) → count.
type Wordings = BTreeMap<(String, String), usize>;

/// What differs between the reference's stream `r` and the target's `t`.
fn differ(
    r: &Stream,
    t: &Stream,
    spec: &StreamSpec,
    strict: bool,
    wordings: &mut Wordings,
) -> Option<String> {
    if r.status != t.status {
        return Some("HTTP status".into());
    }
    if r.head != t.head {
        return Some("headers".into());
    }
    if r.ended != t.ended {
        return Some("end of the stream".into());
    }
    if let (true, Some(a), Some(b)) = (
        spec.first_garbage && !strict,
        r.decode_error(),
        t.decode_error(),
    ) {
        if a.0 != b.0 {
            return Some("error code".into());
        }
        if a.1 != b.1 {
            *wordings.entry((a.1, b.1)).or_default() += 1;
        }
        return None;
    }
    let (rg, tg) = (r.groups(), t.groups());
    let ids: BTreeSet<&str> = rg.keys().chain(tg.keys()).copied().collect();
    for id in ids {
        let (a, b) = (rg.get(id), tg.get(id));
        let (a, b) = (a.map_or(&[][..], |v| v), b.map_or(&[][..], |v| v));
        let what = if id.is_empty() {
            "lines".to_string()
        } else {
            format!("lines of watch ID {id}")
        };
        if a.len() != b.len() {
            return Some(format!("{what} (count)"));
        }
        for (x, y) in a.iter().zip(b) {
            if x.value != y.value || (x.value.is_none() && x.shown != y.shown) {
                return Some(what);
            }
            if x.newline != y.newline {
                return Some(format!("{what} (newline)"));
            }
            if x.order != y.order {
                return Some(format!("{what} (key order)"));
            }
        }
    }
    None
}

// ---------------------------------------------------------------------
// The run.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_stream_random_differential() {
    let seed = env_u64("RETCD_GWSTREAM_DIFF_SEED", 1);
    let steps = env_u64("RETCD_GWSTREAM_DIFF_STEPS", 60);
    // A long run gets more time than the default one.
    let limit = LIMIT.max(Duration::from_millis(steps * 3000));
    bounded(limit, async {
        let ref_bin = match std::env::var("RETCD_GWSTREAM_DIFF_REFERENCE") {
            Ok(v) if v == "3.4" || v == "3.4.23" => retcd_tests::etcd_bin(),
            Ok(v) if !v.is_empty() => PathBuf::from(v),
            _ => retcd_tests::etcd351_bin(),
        };
        let flavor = test_flavor();
        let target = async {
            match flavor {
                Flavor::Etcd => {
                    let bin = std::env::var_os("RETCD_GWSTREAM_DIFF_TARGET_BIN")
                        .map_or_else(retcd_tests::etcd351_bin, PathBuf::from);
                    Cluster::start_with_binary(Flavor::Etcd, bin, 1, FAST).await
                }
                Flavor::Retcd => Cluster::start(flavor, 1, FAST).await,
            }
        };
        let (reference, target) = tokio::join!(
            Cluster::start_with_binary(Flavor::Etcd, ref_bin, 1, FAST),
            target,
        );
        let reference = reference.expect("start reference etcd");
        let target = target.expect("start target");
        tokio::task::block_in_place(|| run(seed, steps, &reference, &target));
    })
    .await;
}

/// A run's state and findings.
struct Run {
    seed: u64,
    r: Server,
    t: Server,
    g: Gen,
    strict: bool,
    trace: bool,
    /// The current step's log (requests and answers), for the report.
    log: Vec<String>,
    /// What differs in the current step.
    found: Vec<String>,
    wordings: Wordings,
    /// Per odd writing: differing streams with it alone (and the first
    /// step), with others; and differing streams written plainly.
    by_writing: BTreeMap<String, (usize, Option<u64>, usize)>,
    plain_diffs: Vec<u64>,
    streams: usize,
    lines: usize,
    unsettled: usize,
}

impl Run {
    /// Sends `a` to both servers and compares the answers.
    fn exec(&mut self, n: u64, a: &Action, phase: &str) -> (u16, Value) {
        let (rbody, ra) = self.r.unary(a);
        let (_, ta) = self.t.unary(a);
        assert!(
            ra.status != 0,
            "seed {} step {n}: no answer from {} (did it die? its log is below): POST {} {rbody}\n{}",
            self.seed,
            self.r.name,
            a.route.path(),
            ra.body
        );
        let (rn, tn) = (self.r.norm_unary(&ra), self.t.norm_unary(&ta));
        let line = format!(
            "{phase}: POST {} {rbody}\n    etcd: {}\n    {}: {}",
            a.route.path(),
            rn.show(),
            self.t.name,
            tn.show()
        );
        if let Some(what) = rn.differ(&tn) {
            self.found
                .push(format!("{what} of a unary answer differs ({phase})"));
            self.log.push(format!("!! {line}"));
        } else {
            self.log.push(line);
        }
        let v: Value = serde_json::from_str(&ra.body).unwrap_or_default();
        (ra.status, v)
    }

    /// Generates and runs one unary write.
    fn write(&mut self, n: u64, live: bool) {
        let a = self.g.action(live);
        self.send(n, a, live);
    }

    /// Runs a unary write on both servers; a campaign with a live lease
    /// only after the reference's leader shows it will not block.
    fn send(&mut self, n: u64, a: Action, live: bool) {
        if a.route == Route::Campaign && a.lease.is_some_and(|l| self.g.alive.contains(&l)) {
            let name = q(&b64(ELECTIONS[a.election]));
            let probe = Action {
                route: Route::Leader,
                body: format!("{{\"name\":{name}}}"),
                lease: None,
                election: a.election,
            };
            let (status, v) = self.exec(n, &probe, "probe");
            let id = self.r.lease_id(a.lease.unwrap_or(Lease::Id(0)));
            let own = [ELECTIONS[a.election], format!("/{id:x}").as_bytes()].concat();
            let leader = v.pointer("/kv/key").and_then(Value::as_str).and_then(unb64);
            let no_leader = v["message"]
                .as_str()
                .is_some_and(|m| m.contains("no leader"));
            let free = (status == 200 && leader.as_deref() == Some(&own[..])) || no_leader;
            if !free {
                self.log
                    .push("  (campaign left out: it would block)".into());
                return;
            }
        }
        let phase = if live { "live write" } else { "write" };
        let (status, v) = self.exec(n, &a, phase);
        self.g.learn(&a, status, &v);
    }

    fn step(&mut self, n: u64) {
        self.log.clear();
        self.found.clear();
        if n == 0 {
            for a in self.g.prelude() {
                self.send(n, a, false);
            }
        }
        for _ in 0..self.g.rng.random_range(0..=3) {
            self.write(n, false);
        }
        let specs = self.g.streams();
        let open = |s: &Server, spec: &StreamSpec| {
            let pieces: Vec<String> = spec.initial.iter().map(|p| s.render(p)).collect();
            Conn::open(s.port, spec.kind.path(), spec.framing, &pieces)
        };
        let mut rc: Vec<Conn> = specs.iter().map(|sp| open(&self.r, sp)).collect();
        let mut tc: Vec<Conn> = specs.iter().map(|sp| open(&self.t, sp)).collect();
        let mut settled = true;
        let mut settle_all = |rc: &mut Vec<Conn>, tc: &mut Vec<Conn>| {
            let mut all: Vec<&mut Conn> = rc.iter_mut().chain(tc.iter_mut()).collect();
            settled &= settle(&mut all);
        };
        settle_all(&mut rc, &mut tc);
        // The later pieces of open bodies.
        if specs
            .iter()
            .any(|s| matches!(s.framing, Framing::Open { .. }))
        {
            for (i, sp) in specs.iter().enumerate() {
                if let Framing::Open { finish } = sp.framing {
                    for p in sp.follow.iter().filter(|p| !p.is_empty()) {
                        rc[i].send(&chunk(&self.r.render(p)));
                        tc[i].send(&chunk(&self.t.render(p)));
                    }
                    if finish {
                        rc[i].send("0\r\n\r\n");
                        tc[i].send("0\r\n\r\n");
                    }
                }
            }
            settle_all(&mut rc, &mut tc);
        }
        // Writes while watch and observe streams are open.
        let watching = specs.iter().any(|s| s.kind != Kind::KeepAlive);
        if watching && self.g.p(0.6) {
            for _ in 0..self.g.rng.random_range(1..=3) {
                self.write(n, true);
            }
            settle_all(&mut rc, &mut tc);
        }
        if !settled {
            self.unsettled += 1;
        }
        let mut differing = Vec::new();
        for (i, sp) in specs.iter().enumerate() {
            let (rs, ts) = (
                self.r.norm_stream(sp.kind, &rc[i]),
                self.t.norm_stream(sp.kind, &tc[i]),
            );
            self.streams += 1;
            self.lines += rs.lines.len();
            let what = differ(&rs, &ts, sp, self.strict, &mut self.wordings);
            let mark = if what.is_some() { "!! " } else { "" };
            self.log.push(format!(
                "{mark}stream {i}: {} writings {:?}\n    etcd: {}\n    {}: {}",
                self.r.render(&sp.show()),
                sp.tags,
                rs.show(),
                self.t.name,
                ts.show()
            ));
            if let Some(what) = what {
                self.found
                    .push(format!("{what} of stream {i} ({}) differ", sp.kind.path()));
                differing.push(sp.tags.clone());
            }
        }
        for tags in differing {
            if tags.is_empty() {
                self.plain_diffs.push(n);
            }
            for tag in &tags {
                let e = self.by_writing.entry(tag.clone()).or_default();
                if tags.len() == 1 {
                    e.0 += 1;
                    e.1 = e.1.or(Some(n));
                } else {
                    e.2 += 1;
                }
            }
        }
        // Dropping the connections closes the streams.
        drop((rc, tc));
    }
}

fn run(seed: u64, steps: u64, reference: &Cluster, target: &Cluster) {
    let (r, t) = (Server::new(reference), Server::new(target));
    let strict =
        std::env::var("RETCD_GWSTREAM_DIFF_MESSAGES").is_ok_and(|v| v == "1") || (r.etcd && t.etcd);
    let trace = std::env::var("RETCD_GWSTREAM_DIFF_TRACE").is_ok_and(|v| v == "1");
    let max_shown = env_u64("RETCD_GWSTREAM_DIFF_SHOW", 20) as usize;
    // retcd refuses two members of one oneof, as etcd 3.6 (protojson:
    // "oneof … is already set") does; etcd 3.5.1 takes the highest-numbered
    let oneof_dups = !r.v34 && !t.v34 && t.etcd;
    let mut run = Run {
        seed,
        r,
        t,
        g: Gen::new(seed, oneof_dups),
        strict,
        trace,
        log: Vec::new(),
        found: Vec::new(),
        wordings: Wordings::new(),
        by_writing: BTreeMap::new(),
        plain_diffs: Vec::new(),
        streams: 0,
        lines: 0,
        unsettled: 0,
    };
    let (rname, tname) = (run.r.name.clone(), run.t.name.clone());
    let started = Instant::now();
    let (mut diffs, mut shown) = (0usize, Vec::new());
    for n in 0..steps {
        run.step(n);
        if run.trace {
            eprintln!("step {n}:\n  {}", run.log.join("\n  "));
        }
        if !run.found.is_empty() {
            diffs += 1;
            if shown.len() < max_shown {
                shown.push(format!(
                    "seed {seed} step {n}: {}\n  {}",
                    run.found.join("; "),
                    run.log.join("\n  ")
                ));
            }
        }
    }
    eprintln!(
        "gateway_stream_random_differential: {rname} vs {tname}, seed {seed}: {steps} steps \
         ({} streams, {} lines from the reference) in {:.1?}, head revision {}, {} leases chosen, \
         {} steps not settled within {SETTLE_MAX:?}, {diffs} differing steps",
        run.streams,
        run.lines,
        started.elapsed(),
        run.g.head,
        run.r.leases.len(),
        run.unsettled,
    );
    if !run.wordings.is_empty() {
        let n: usize = run.wordings.values().sum();
        eprintln!(
            "{n} refusals by both JSON decoders with other wordings ({} distinct; compared: \
             RETCD_GWSTREAM_DIFF_MESSAGES=1), e.g.:",
            run.wordings.len()
        );
        for ((a, b), c) in run.wordings.iter().take(8) {
            eprintln!("  {c}x etcd: {a:?}\n      {tname}: {b:?}");
        }
    }
    let mut summary: Vec<String> = (run.by_writing.iter())
        .map(|(k, (alone, first, with))| match first {
            Some(f) => format!("  {k}: {alone} alone (first at step {f}), {with} with others"),
            None => format!("  {k}: {with} with others"),
        })
        .collect();
    if !run.plain_diffs.is_empty() {
        summary.push(format!("  written plainly: steps {:?}", run.plain_diffs));
    }
    assert!(
        diffs == 0,
        "{diffs} of {steps} steps differ between {rname} and {tname} (seed {seed}; the first {} \
         below; `!!` marks what differs)\n\ndiffering streams by odd writing:\n{}\n\n{}",
        shown.len(),
        summary.join("\n"),
        shown.join("\n\n"),
    );
}

#[test]
fn helpers_and_writings() {
    assert_eq!(b64(b"\xfb\xff"), "+/8=");
    assert_eq!(unb64("+/8="), Some(b"\xfb\xff".to_vec()));
    assert_eq!(unb64("!!"), None);
    assert_eq!(
        key_order(r#"{"b":{"y":1,"x":[{"k":"a,b"}]},"a":2}"#),
        ["k", "y,x", "b,a"]
    );
    assert_eq!(
        dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"),
        (b"abcde".to_vec(), true)
    );
    assert_eq!(dechunk(b"3\r\nabc\r\n2\r\nd"), (b"abc".to_vec(), false));
    // Every writing Go reads is JSON, every object of a body too.
    let mut g = Gen::new(7, true);
    g.chosen = 2;
    g.head = 9;
    g.compacted = 3;
    for _ in 0..500 {
        for s in g.streams() {
            // Chunks are rendered one by one: no placeholder is split.
            for p in &s.initial {
                assert!(p.matches('@').count() % 2 == 0, "{:?}", s.initial);
            }
            if s.first_garbage
                || s.tags
                    .iter()
                    .any(|t| t.contains("garbage") || t.contains("trailing"))
            {
                continue;
            }
            let body = [s.initial.concat(), s.follow.concat()].concat();
            let body = body.replace("@L0@", "1").replace("@L1@", "2");
            let values = serde_json::Deserializer::from_str(&body).into_iter::<Value>();
            for v in values {
                assert!(v.is_ok(), "{body:?}");
            }
        }
    }
}
