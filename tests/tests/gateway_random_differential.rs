//! A seeded random differential test of the JSON gateway's *parsing and
//! answers*: the same sequence of gateway requests (`POST /v3/kv/put`,
//! `range`, `deleterange`, `txn`, `compaction`, `/v3/lease/grant`,
//! `revoke`, `timetolive`, `leases`) goes to a fresh 1-node real etcd
//! 3.4.23 (the reference) and a fresh 1-node target (retcd by default;
//! `RETCD_TEST_FLAVOR=etcd` makes it a second etcd, which checks the test
//! itself), both empty and started with the same flags, over a small
//! overlapping key space.
//!
//! Each request is first generated as its *meaning* (the canonical JSON:
//! .proto field names, standard padded base64, 64-bit integers as strings,
//! enums by name), then written as a client might write it: bytes in
//! unpadded, URL-safe, over- or short-padded base64, with non-zero unused
//! bits, a line break inside, as a JSON array of numbers, `""`, `null` or
//! missing; 64-bit integers as strings or numbers, with spaces, as floats
//! (`1.0`, `1e0`), with a `+` or a leading zero, `null`, `"null"`, `-0`;
//! bools as strings or numbers; enums by name, number, quoted number,
//! lower-case name, unknown number; field names in their .proto or
//! camelCase form or in the wrong case (an unknown field then); unknown and
//! duplicated fields (the same name twice, or both forms of a name); fields
//! in any order; explicit defaults; trailing data after the body, an empty
//! or `null` body, other content types; nested Txn operations under
//! `request_put` or `requestPut`. A few writings are garbage (invalid
//! base64, wrong JSON types, unknown enum names, numbers beyond 64 bits,
//! non-JSON bodies) that both must refuse. [`Gen::enc_msg`] also records
//! what Go's decoder (the reference's) makes of each writing — its meaning
//! — so that a write one server applied and the other refused is repaired:
//! the refusing server gets the canonical writing of that meaning, and the
//! stores stay equal for the steps after it (a write that cannot be
//! repaired so is listed: later steps may differ because of it). A step
//! the reference does not answer (it died) fails the test at once.
//!
//! Compared per step: the HTTP status, the content type and the body,
//! parsed as JSON and compared as values, with only what legitimately
//! differs masked: the header's cluster ID, member ID and raft term, the
//! lease IDs the servers chose (as `<lease#i>`, by grant order; requests
//! name such a lease by its grant order too, also inside a decoder's
//! message), a lease's remaining TTL (checked against the granted TTL and
//! the time passed); the lists whose order etcd does not define
//! (`leases`, a lease's `keys`) are sorted. Revisions are compared
//! exactly. The key order of a success body is compared too
//! (etcd's is the .proto field order). Of an error body, `code`,
//! `message` and `error` are compared; when both servers refuse a body
//! their JSON decoders could not read (code 3 and a message not from
//! etcdserver), the message is the decoder's own wording (Go's
//! `encoding/json` and base64 package there) and only the status and code
//! are compared; the wordings are tallied and printed
//! (`RETCD_GATEWAY_DIFF_MESSAGES=1`, and an etcd target of the reference's
//! version, compare them too).
//!
//! What the generator avoids, with the reason:
//! - a sort target outside the enum (etcd 3.4.23 and 3.5.1 die on it);
//! - `null` as an element of a list of messages (`"success":[null]`):
//!   etcd 3.4.23's gateway drops the connection without an answer, 3.5.1
//!   answers 400 "etcdserver: key not found";
//! - `null` for a message field (`"request_put":null`), which Go decodes
//!   to a nil operation;
//! - two members of one oneof (`request_range` and `request_put` in one
//!   operation, `version` and `value` in one compare) unless neither
//!   server is etcd 3.4: 3.4.23's decoder picks one of them at random (Go
//!   map order); 3.5.1 takes the member with the highest field number;
//! - `ignore_value`/`ignore_lease` in a Txn: etcd 3.4.23 dies ("panic:
//!   unexpected error during txn: etcdserver: key not found") when the
//!   Txn deleted the key before (and in a nested Txn, see
//!   `kv_random_differential`);
//! - lease TTLs a run could see expire (every grant asks for an hour, or
//!   more than etcd allows), and so field names in the wrong case for
//!   `TTL` and `ID`, and empty or `null` grant bodies;
//! - unknown enum numbers and empty Txn operations (`{}`, or an operation
//!   whose request field's name is in the wrong case) in a Txn that
//!   writes: etcd accepts unknown numbers and refuses empty operations,
//!   and a server doing otherwise there could not be repaired;
//! - a leading zero before a lease ID a server chose: Go's message quotes
//!   the ID's second digit;
//! - unless `RETCD_GATEWAY_DIFF_UNKNOWN_ENUMS=1`, a Range's sort order
//!   outside the enum: etcd 3.4.23 and 3.5.1 answer it as no order, retcd
//!   as etcd 3.6 (InvalidArgument "invalid sort option"). Numbers outside
//!   the enums in a read-only Txn's compares (target, result) are always
//!   generated: every gateway passes them on.
//!
//! The key space has 10 keys: up to 12 elements, Go's `sort.Sort` is an
//! insertion sort, which keeps ties (of a Range sorted by version,
//! revisions or value) in key order, in etcd 3.4.23 (Go 1.19) as in retcd.
//! (etcd 3.5.1, built with Go 1.16, does not from 7 elements on: against
//! it, the ties of a sorted Range may come in another order.)
//!
//! etcd 3.4's gateway answers FailedPrecondition (e.g. "lease already
//! exists") with HTTP 412, 3.5's and retcd's with 400: a 3.4 server's 412
//! is compared as 400 (retcd follows 3.5 there).
//!
//! `RETCD_GATEWAY_DIFF_SEED` (default 1) and `RETCD_GATEWAY_DIFF_STEPS`
//! (default 10000, about 20 s) replay and size a run.
//! `RETCD_GATEWAY_DIFF_REFERENCE` selects the reference's binary: unset,
//! etcd's (`ETCD_BIN`, 3.4.23); `3.5.1`, etcd 3.5.1 (`etcd351_bin`); else
//! a path. `RETCD_GATEWAY_DIFF_SHOW` (default 20) is how many differing
//! steps are printed; `RETCD_TEST_TRACE=1` prints every step.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use retcd_tests::http::{raw_exchange, RawResp as Resp};
use retcd_tests::random_diff::{env_u64, key_order, prefix_end, recent_rev, Dice};
use retcd_tests::{bounded, limit::NORMAL as LIMIT, test_flavor, Cluster, Flavor, FAST};
use serde_json::{Map, Value};

/// Each request's bound.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// The key space: prefixes and ranges overlap; `\xff` and `\xfb\xff` are
/// written with `/` and `+` in standard base64 (`_` and `-` URL-safe).
const KEYS: [&[u8]; 10] = [
    b"a",
    b"a/b",
    b"ab",
    b"b",
    b"c",
    b"\x00",
    b"\xff",
    b"\xfb\xff",
    b"z",
    b"zz",
];

/// Values of every length modulo 3 (base64 padding), few so that VALUE
/// compares are often equal.
const VALUES: [&[u8]; 6] = [b"", b"v", b"vv", b"vvv", b"\xff\x00", b"\xfb\xff"];

/// Lease IDs the test grants explicitly.
const EXPLICIT_LEASES: [i64; 3] = [4097, 4098, 4099];

/// A lease ID never granted.
const UNKNOWN_LEASE: i64 = 2989;

/// Every grant asks for an hour (none expires during a run), or for more
/// than etcd allows.
const TTL: i64 = 3600;
const TOO_LONG_TTL: i64 = 9_000_000_001;

// ---------------------------------------------------------------------
// The request messages, as the gateway's JSON sees them.

/// A request message.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Msg {
    Range,
    Put,
    Delete,
    Txn,
    Op,
    Compare,
    Compaction,
    Grant,
    Revoke,
    TimeToLive,
    Leases,
}

/// A field's type.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Bytes,
    I64,
    Bool,
    Enum(&'static [&'static str]),
    Msg(Msg),
    List(Msg),
}

/// A field: its .proto name, its JSON (camelCase) name, type, and whether
/// it is a member of the message's oneof.
struct F {
    name: &'static str,
    camel: &'static str,
    kind: Kind,
    oneof: bool,
}

const fn f(name: &'static str, camel: &'static str, kind: Kind) -> F {
    F {
        name,
        camel,
        kind,
        oneof: false,
    }
}

const fn one(name: &'static str, camel: &'static str, kind: Kind) -> F {
    F {
        name,
        camel,
        kind,
        oneof: true,
    }
}

const SORT_ORDER: &[&str] = &["NONE", "ASCEND", "DESCEND"];
const SORT_TARGET: &[&str] = &["KEY", "VERSION", "CREATE", "MOD", "VALUE"];
const RESULT: &[&str] = &["EQUAL", "GREATER", "LESS", "NOT_EQUAL"];
const TARGET: &[&str] = &["VERSION", "CREATE", "MOD", "VALUE", "LEASE"];

use Kind::{Bool, Bytes, Enum, I64};

/// Each message's fields in field-number order.
fn fields(m: Msg) -> &'static [F] {
    const RANGE: &[F] = &[
        f("key", "key", Bytes),
        f("range_end", "rangeEnd", Bytes),
        f("limit", "limit", I64),
        f("revision", "revision", I64),
        f("sort_order", "sortOrder", Enum(SORT_ORDER)),
        f("sort_target", "sortTarget", Enum(SORT_TARGET)),
        f("serializable", "serializable", Bool),
        f("keys_only", "keysOnly", Bool),
        f("count_only", "countOnly", Bool),
        f("min_mod_revision", "minModRevision", I64),
        f("max_mod_revision", "maxModRevision", I64),
        f("min_create_revision", "minCreateRevision", I64),
        f("max_create_revision", "maxCreateRevision", I64),
    ];
    const PUT: &[F] = &[
        f("key", "key", Bytes),
        f("value", "value", Bytes),
        f("lease", "lease", I64),
        f("prev_kv", "prevKv", Bool),
        f("ignore_value", "ignoreValue", Bool),
        f("ignore_lease", "ignoreLease", Bool),
    ];
    const DELETE: &[F] = &[
        f("key", "key", Bytes),
        f("range_end", "rangeEnd", Bytes),
        f("prev_kv", "prevKv", Bool),
    ];
    const TXN: &[F] = &[
        f("compare", "compare", Kind::List(Msg::Compare)),
        f("success", "success", Kind::List(Msg::Op)),
        f("failure", "failure", Kind::List(Msg::Op)),
    ];
    const OP: &[F] = &[
        one("request_range", "requestRange", Kind::Msg(Msg::Range)),
        one("request_put", "requestPut", Kind::Msg(Msg::Put)),
        one(
            "request_delete_range",
            "requestDeleteRange",
            Kind::Msg(Msg::Delete),
        ),
        one("request_txn", "requestTxn", Kind::Msg(Msg::Txn)),
    ];
    const COMPARE: &[F] = &[
        f("result", "result", Enum(RESULT)),
        f("target", "target", Enum(TARGET)),
        f("key", "key", Bytes),
        one("version", "version", I64),
        one("create_revision", "createRevision", I64),
        one("mod_revision", "modRevision", I64),
        one("value", "value", Bytes),
        one("lease", "lease", I64),
        f("range_end", "rangeEnd", Bytes),
    ];
    const COMPACTION: &[F] = &[
        f("revision", "revision", I64),
        f("physical", "physical", Bool),
    ];
    const GRANT: &[F] = &[f("TTL", "TTL", I64), f("ID", "ID", I64)];
    const REVOKE: &[F] = &[f("ID", "ID", I64)];
    const TIME_TO_LIVE: &[F] = &[f("ID", "ID", I64), f("keys", "keys", Bool)];
    match m {
        Msg::Range => RANGE,
        Msg::Put => PUT,
        Msg::Delete => DELETE,
        Msg::Txn => TXN,
        Msg::Op => OP,
        Msg::Compare => COMPARE,
        Msg::Compaction => COMPACTION,
        Msg::Grant => GRANT,
        Msg::Revoke => REVOKE,
        Msg::TimeToLive => TIME_TO_LIVE,
        Msg::Leases => &[],
    }
}

fn path_of(m: Msg) -> &'static str {
    match m {
        Msg::Range => "/v3/kv/range",
        Msg::Put => "/v3/kv/put",
        Msg::Delete => "/v3/kv/deleterange",
        Msg::Txn => "/v3/kv/txn",
        Msg::Compaction => "/v3/kv/compaction",
        Msg::Grant => "/v3/lease/grant",
        Msg::Revoke => "/v3/lease/revoke",
        Msg::TimeToLive => "/v3/lease/timetolive",
        Msg::Leases => "/v3/lease/leases",
        Msg::Op | Msg::Compare => unreachable!("not a request"),
    }
}

/// Whether a step may change the store or the leases (a Txn: if an
/// operation it means writes).
fn writes(step: &Step) -> bool {
    match step.msg {
        Msg::Put | Msg::Delete | Msg::Compaction | Msg::Grant | Msg::Revoke => true,
        Msg::Txn => step.meaning.as_ref().is_none_or(|m| {
            ["success", "failure"]
                .iter()
                .any(|k| m[*k].as_array().is_some_and(|a| has_writes(a)))
        }),
        _ => false,
    }
}

// ---------------------------------------------------------------------
// Base64, as Go's and the test's.

const STD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn b64(bytes: &[u8], alphabet: &[u8; 64], pad: bool) -> String {
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (c.iter().enumerate()).fold(0u32, |n, (i, &x)| n | (x as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= c.len() {
                out.push(alphabet[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else if pad {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes the test's own canonical (standard, padded) base64.
fn unb64(s: &str) -> Vec<u8> {
    let six: Vec<u32> = (s.trim_end_matches('=').bytes())
        .map(|c| STD.iter().position(|&x| x == c).expect("canonical base64") as u32)
        .collect();
    six.chunks(4)
        .flat_map(|c| {
            let n = (c.iter().enumerate()).fold(0u32, |n, (i, &x)| n | x << (18 - 6 * i));
            (0..c.len().saturating_sub(1)).map(move |i| (n >> (16 - 8 * i)) as u8)
        })
        .collect()
}

fn bytes_v(b: &[u8]) -> Value {
    Value::String(b64(b, STD, true))
}

fn int_v(n: i64) -> Value {
    Value::String(n.to_string())
}

/// A JSON string literal.
fn q(s: &str) -> String {
    Value::from(s).to_string()
}

/// The placeholder of the `i`-th lease a server chose (in grant order),
/// replaced in each server's copy of a request by its own ID.
fn lease_placeholder(i: usize) -> String {
    format!("@L{i}@")
}

// ---------------------------------------------------------------------
// The generator: meanings, then writings.

/// One step: where, how, the body text (lease placeholders in it), and
/// its meaning to Go's decoder (`None`: garbage, to be refused).
#[derive(Debug, Clone)]
struct Step {
    msg: Msg,
    ctype: Option<&'static str>,
    body: String,
    meaning: Option<Value>,
    tags: Vec<String>,
}

/// The request generator, and what it learns from the reference's answers
/// (the head and compact revisions, revisions worth naming, the number of
/// leases the servers chose).
struct Gen {
    rng: StdRng,
    head: i64,
    compacted: i64,
    revs: Vec<i64>,
    chosen: usize,
    /// Two members of a oneof in one object (not with etcd 3.4).
    oneof_dups: bool,
    /// Sort orders outside the enum (`RETCD_GATEWAY_DIFF_UNKNOWN_ENUMS=1`;
    /// see the module documentation).
    unknown_enums: bool,
    tags: Vec<String>,
}

impl Dice for Gen {
    fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }
}

impl Gen {
    fn tag(&mut self, t: impl Into<String>) {
        let t = t.into();
        if !self.tags.contains(&t) {
            self.tags.push(t);
        }
    }

    // --- meanings (canonical JSON, defaults mostly left out)

    fn key(&mut self) -> Value {
        if self.p(0.01) {
            bytes_v(b"") // refused: "key is not provided"
        } else {
            bytes_v(self.pick(&KEYS))
        }
    }

    fn range_end(&mut self, key: &Value) -> Option<Value> {
        let key = unb64(key.as_str().unwrap_or(""));
        Some(bytes_v(&match self.rng.random_range(0..100) {
            0..35 => return None,
            35..55 => prefix_end(&key),
            55..70 => vec![0],
            70..90 => self.pick(&KEYS).to_vec(), // possibly below the key
            90..95 => [&key[..], &[0]].concat(),
            _ => key, // an empty range
        }))
    }

    /// A revision seen lately, or one near the head.
    fn rev(&mut self) -> i64 {
        recent_rev(&mut self.rng, self.head, &self.revs)
    }

    /// A lease to name: one a server chose (maybe revoked since), one
    /// granted with its ID, none, or one never granted.
    fn lease(&mut self) -> Value {
        match self.rng.random_range(0..20) {
            0..12 if self.chosen > 0 => {
                Value::String(lease_placeholder(self.rng.random_range(0..self.chosen)))
            }
            0..17 => int_v(self.pick(&EXPLICIT_LEASES)),
            17 => int_v(0),
            _ => int_v(UNKNOWN_LEASE),
        }
    }

    /// A Put; `top` (not in a Txn) allows `ignore_value` and
    /// `ignore_lease`.
    fn put(&mut self, top: bool) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("key".into(), self.key());
        let ignore_value = top && self.p(0.08);
        let ignore_lease = top && self.p(0.08);
        if !ignore_value || self.p(0.1) {
            let v = self.pick(&VALUES);
            if !v.is_empty() {
                m.insert("value".into(), bytes_v(v));
            }
        }
        if self.p(if ignore_lease { 0.1 } else { 0.3 }) {
            m.insert("lease".into(), self.lease());
        }
        for (k, on) in [
            ("prev_kv", self.p(0.5)),
            ("ignore_value", ignore_value),
            ("ignore_lease", ignore_lease),
        ] {
            if on {
                m.insert(k.into(), Value::Bool(true));
            }
        }
        m
    }

    /// A Range; `unknown` allows a sort order outside the enum (etcd
    /// accepts it; only where nothing is written).
    fn range(&mut self, unknown: bool) -> Map<String, Value> {
        let mut m = Map::new();
        let key = self.key();
        if let Some(end) = self.range_end(&key) {
            m.insert("range_end".into(), end);
        }
        m.insert("key".into(), key);
        let revision = match self.rng.random_range(0..100) {
            0..40 => 0,
            40..55 => self.head,
            55..75 => self.rev(),
            75..85 if self.compacted > 1 => self.rng.random_range(1..self.compacted),
            75..90 if self.compacted > 0 => self.compacted,
            75..95 => self.head + self.rng.random_range(1..4), // the future
            95..98 => -1,
            _ => self.pick(&[i64::MAX, i64::MIN, -2]),
        };
        if revision != 0 {
            m.insert("revision".into(), int_v(revision));
        }
        let limit = match self.rng.random_range(0..20) {
            0..10 => 0,
            10 => -1,
            11 => self.pick(&[i64::MAX, i64::MIN]),
            _ => self.rng.random_range(1..4),
        };
        if limit != 0 {
            m.insert("limit".into(), int_v(limit));
        }
        if self.p(0.5) {
            let order = if unknown && self.p(0.1) {
                Value::from(self.pick(&[7, -1, 3]))
            } else {
                Value::from(self.pick(SORT_ORDER))
            };
            m.insert("sort_order".into(), order);
            let target = self.pick(SORT_TARGET);
            m.insert("sort_target".into(), Value::from(target));
        }
        for (k, p) in [
            ("serializable", 0.3),
            ("keys_only", 0.2),
            ("count_only", 0.1),
        ] {
            if self.p(p) {
                m.insert(k.into(), Value::Bool(true));
            }
        }
        for k in [
            "min_mod_revision",
            "max_mod_revision",
            "min_create_revision",
            "max_create_revision",
        ] {
            if self.p(0.1) {
                let r = self.rev();
                m.insert(k.into(), int_v(r));
            }
        }
        m
    }

    fn delete(&mut self) -> Map<String, Value> {
        let mut m = Map::new();
        let key = self.key();
        if self.p(0.5) {
            if let Some(end) = self.range_end(&key) {
                m.insert("range_end".into(), end);
            }
        }
        m.insert("key".into(), key);
        if self.p(0.5) {
            m.insert("prev_kv".into(), Value::Bool(true));
        }
        m
    }

    /// A Compare; `unknown` allows a target or result outside the enums.
    fn compare(&mut self, unknown: bool) -> Map<String, Value> {
        let mut m = Map::new();
        let key = self.key();
        if self.p(0.25) {
            if let Some(end) = self.range_end(&key) {
                m.insert("range_end".into(), end);
            }
        }
        m.insert("key".into(), key);
        let target = self.rng.random_range(0..5);
        m.insert(
            "target".into(),
            if unknown && self.p(0.1) {
                Value::from(self.pick(&[-1, 5, 9]))
            } else {
                Value::from(TARGET[target])
            },
        );
        m.insert(
            "result".into(),
            if unknown && self.p(0.1) {
                Value::from(self.pick(&[-1, 4, 7]))
            } else {
                Value::from(self.pick(RESULT))
            },
        );
        // Mostly the target's union member; sometimes another one, or none.
        let union_of = match self.rng.random_range(0..20) {
            0 => 5,
            1 => self.rng.random_range(0..5),
            _ => target,
        };
        let (k, v) = match union_of {
            0 => ("version", int_v(self.rng.random_range(0..4))),
            1 => ("create_revision", int_v(self.rev())),
            2 => ("mod_revision", int_v(self.rev())),
            3 => ("value", bytes_v(self.pick(&VALUES))),
            4 => ("lease", self.lease()),
            _ => return m,
        };
        m.insert(k.into(), v);
        m
    }

    fn op(&mut self, depth: u32) -> Map<String, Value> {
        let (k, v) = match self.rng.random_range(0..10) {
            0..4 => ("request_put", self.put(false)),
            4..7 => ("request_range", self.range(false)),
            7..9 => ("request_delete_range", self.delete()),
            _ if depth < 2 => ("request_txn", self.txn(depth + 1)),
            _ => ("request_range", self.range(false)),
        };
        Map::from_iter([(k.to_string(), Value::Object(v))])
    }

    fn txn(&mut self, depth: u32) -> Map<String, Value> {
        let mut m = Map::new();
        let ops = |g: &mut Gen| -> Vec<Value> {
            (0..g.rng.random_range(0..4))
                .map(|_| Value::Object(g.op(depth)))
                .collect()
        };
        let (mut success, mut failure) = (ops(self), ops(self));
        let read_only = !has_writes(&success) && !has_writes(&failure);
        if !read_only && depth == 0 {
            // What nested read-only Txns may hold only where nothing is
            // written.
            success.iter_mut().for_each(only_known);
            failure.iter_mut().for_each(only_known);
        }
        if read_only && self.p(0.05) {
            // An empty operation: refused by etcd ("key not found").
            failure.push(Value::Object(Map::new()));
        }
        let compare: Vec<Value> = (0..self.rng.random_range(0..4))
            .map(|_| Value::Object(self.compare(read_only)))
            .collect();
        for (k, v) in [
            ("compare", compare),
            ("success", success),
            ("failure", failure),
        ] {
            if !v.is_empty() {
                m.insert(k.into(), Value::Array(v));
            }
        }
        m
    }

    fn compaction(&mut self) -> Map<String, Value> {
        let behind = (self.head - self.rng.random_range(0..8)).max(self.compacted + 1);
        let revision = match self.rng.random_range(0..10) {
            0..7 => behind,
            7 => self.head,
            8 => self.compacted - self.rng.random_range(0..2), // already compacted
            _ => self.head + 1,                                // the future
        };
        let mut m = Map::from_iter([("revision".to_string(), int_v(revision))]);
        if self.p(0.5) {
            m.insert("physical".into(), Value::Bool(true));
        }
        m
    }

    fn grant(&mut self) -> Map<String, Value> {
        let ttl = if self.p(0.05) { TOO_LONG_TTL } else { TTL };
        let mut m = Map::from_iter([("TTL".to_string(), int_v(ttl))]);
        match self.rng.random_range(0..20) {
            0..10 => {}
            10..19 => {
                m.insert("ID".into(), int_v(self.pick(&EXPLICIT_LEASES)));
            }
            _ => {
                m.insert("ID".into(), int_v(-5));
            }
        }
        m
    }

    /// The next step's meaning, then its writing.
    fn next(&mut self) -> Step {
        let (msg, meaning) = match self.rng.random_range(0..100) {
            0..25 => (Msg::Put, self.put(true)),
            25..50 => (Msg::Range, self.range(self.unknown_enums)),
            50..58 => (Msg::Delete, self.delete()),
            58..80 => (Msg::Txn, self.txn(0)),
            80..83 => (Msg::Compaction, self.compaction()),
            83..89 => (Msg::Grant, self.grant()),
            89..93 => {
                let id = self.lease();
                (Msg::Revoke, Map::from_iter([("ID".to_string(), id)]))
            }
            93..97 => {
                let mut m = Map::from_iter([("ID".to_string(), self.lease())]);
                if self.p(0.5) {
                    m.insert("keys".into(), Value::Bool(true));
                }
                (Msg::TimeToLive, m)
            }
            _ => (Msg::Leases, Map::new()),
        };
        self.tags.clear();
        let (body, meaning) = self.enc_body(msg, &meaning);
        let ctype = if self.p(0.05) {
            let c = self.pick(&[
                None,
                Some("text/plain"),
                Some("application/x-www-form-urlencoded"),
                Some("application/json; charset=utf-8"),
            ]);
            self.tag(format!("ctype:{}", c.unwrap_or("none")));
            c
        } else {
            Some("application/json")
        };
        Step {
            msg,
            ctype,
            body,
            meaning: meaning.map(Value::Object),
            tags: std::mem::take(&mut self.tags),
        }
    }

    // --- writings: each returns the text and its meaning to Go's
    // decoder (`None`: garbage; `Some(Null)`: the default)

    /// A leaf is written oddly with this probability ...
    const ODD: f64 = 0.12;
    /// ... and an odd writing is garbage with this one.
    const GARBAGE: f64 = 0.12;

    fn odd(&mut self) -> bool {
        self.p(Self::ODD)
    }

    /// A whole body: mostly the message, sometimes empty, `null`, garbage
    /// or followed by more.
    fn enc_body(
        &mut self,
        m: Msg,
        meaning: &Map<String, Value>,
    ) -> (String, Option<Map<String, Value>>) {
        // Not for a grant: an empty one is a lease of the minimum TTL,
        // which expires during the run.
        let roll = if m == Msg::Grant {
            1000
        } else {
            self.rng.random_range(0..1000)
        };
        match roll {
            0..20 => {
                self.tag("body:empty");
                return (String::new(), Some(Map::new()));
            }
            20..30 => {
                self.tag("body:null");
                return (" null ".into(), Some(Map::new()));
            }
            30..45 => {
                self.tag("body:garbage");
                let (text, _) = self.enc_msg(m, meaning);
                let cut = self.rng.random_range(0..text.len().max(1));
                let b = match self.rng.random_range(0..6) {
                    0 => "hello".to_string(),
                    1 => "{bad".to_string(),
                    2 => text[..cut].to_string(),
                    3 => "[]".to_string(),
                    4 => "\"x\"".to_string(),
                    _ => format!("\u{feff}{text}"),
                };
                return (b, None);
            }
            _ => {}
        }
        let (mut text, meaning) = self.enc_msg(m, meaning);
        if self.p(0.04) {
            let t = self.pick(&[" x", "{}", "]", " null", "{\"key\":1}"]);
            self.tag("body:trailing");
            text.push_str(t);
        }
        if self.p(0.1) {
            text = format!("\n  {text}\r\n");
        }
        (text, meaning)
    }

    /// An object of message `m` meaning `meaning`.
    fn enc_msg(
        &mut self,
        m: Msg,
        meaning: &Map<String, Value>,
    ) -> (String, Option<Map<String, Value>>) {
        let fs = fields(m);
        let mut groups: Vec<Vec<(String, String)>> = Vec::new();
        let mut out = Some(Map::new());
        for (i, fd) in fs.iter().enumerate() {
            let value = meaning.get(fd.name);
            let explicit_default =
                value.is_none() && !fd.oneof && !matches!(fd.kind, Kind::Msg(_)) && self.p(0.03);
            if value.is_none() && !explicit_default {
                continue;
            }
            let mut name = if fd.camel != fd.name && self.p(0.5) {
                fd.camel
            } else {
                fd.name
            };
            let (text, v) = self.enc_value(fd.kind, value, fd.name == "TTL");
            let mut group = Vec::new();
            let mut dropped = false;
            let roll = self.rng.random_range(0..100);
            // Not for `TTL`, `ID` (see the module doc) or an operation's
            // request: an operation without one is refused by etcd (see
            // the empty operations there).
            let renamable = !matches!(fd.name, "TTL" | "ID") && m != Msg::Op;
            if roll < 2 && value.is_some() && renamable {
                // An unknown field to Go's decoder (names are case-sensitive).
                dropped = true;
                self.tag("name:wrong-case");
                group.push((name.to_uppercase(), text.clone()));
            } else if roll < 5 {
                // Both writings of the name (Go takes the camelCase one), or
                // the same name twice (Go takes the last one).
                let decoy = self.decoy(fd.kind, fd.name);
                if fd.camel != fd.name {
                    self.tag("dup:proto+camel");
                    group.push((fd.name.to_string(), decoy));
                    name = fd.camel;
                } else {
                    self.tag("dup:same-name");
                    group.push((name.to_string(), decoy));
                }
            } else if roll < 7 && fd.oneof && self.oneof_dups && value.is_some() {
                // A lower-numbered member of the same oneof: Go 3.5 takes the
                // member with the highest field number.
                let lower: Vec<usize> = (0..i).filter(|&j| fs[j].oneof).collect();
                if !lower.is_empty() {
                    let j = self.pick(&lower);
                    self.tag("dup:oneof");
                    let decoy = self.decoy(fs[j].kind, fs[j].name);
                    groups.push(vec![(fs[j].name.to_string(), decoy)]);
                }
            }
            if !dropped {
                group.push((name.to_string(), text));
            }
            groups.push(group);
            match (&mut out, v) {
                (Some(o), Some(v)) if !dropped && !v.is_null() => {
                    o.insert(fd.name.into(), v);
                }
                (_, None) if !dropped => out = None,
                _ => {}
            }
        }
        if self.p(0.03) {
            self.tag("unknown-field");
            let (k, v) = self.pick(&[
                ("nosuch", "1"),
                ("nosuch", "{\"a\":[1,\"x\",null]}"),
                ("XXX_unrecognized", "\"eA==\""),
                ("header", "{\"revision\":\"1\"}"),
                ("Key", "\"eA==\""),
            ]);
            groups.push(vec![(k.to_string(), v.to_string())]);
        }
        if self.p(Self::ODD) && groups.len() > 1 {
            self.tag("order:shuffled");
            groups.shuffle(&mut self.rng);
        }
        let ws = if self.p(0.1) { " " } else { "" };
        let body: Vec<String> = (groups.into_iter().flatten())
            .map(|(k, v)| format!("{}:{ws}{v}", q(&k)))
            .collect();
        (format!("{{{}}}", body.join(&format!(",{ws}"))), out)
    }

    /// A valid writing of another value of `kind`, for a duplicate Go
    /// does not take.
    fn decoy(&mut self, kind: Kind, name: &str) -> String {
        match kind {
            Kind::Bytes => q(&b64(self.pick(&KEYS), STD, true)),
            Kind::I64 if name == "TTL" => "\"7200\"".into(),
            Kind::I64 => q(&self.rng.random_range(0..9).to_string()),
            Kind::Bool => self.p(0.5).to_string(),
            Kind::Enum(names) => q(self.pick(names)),
            Kind::Msg(_) => "{}".into(),
            Kind::List(_) => "[]".into(),
        }
    }

    fn enc_value(&mut self, kind: Kind, v: Option<&Value>, ttl: bool) -> (String, Option<Value>) {
        match kind {
            Kind::Bytes => {
                let b = v.and_then(Value::as_str).map(unb64).unwrap_or_default();
                self.enc_bytes(&b)
            }
            Kind::I64 => {
                let d = v.and_then(Value::as_str).unwrap_or("0").to_string();
                self.enc_i64(&d, ttl)
            }
            Kind::Bool => self.enc_bool(v.and_then(Value::as_bool).unwrap_or(false)),
            Kind::Enum(names) => self.enc_enum(names, v.unwrap_or(&Value::from(names[0]))),
            Kind::Msg(m) => {
                let empty = Map::new();
                let obj = v.and_then(Value::as_object).unwrap_or(&empty);
                if self.odd() && self.p(Self::GARBAGE) {
                    self.tag("msg:wrong-type");
                    return (self.pick(&["[]", "\"x\"", "1"]).into(), None);
                }
                let (t, s) = self.enc_msg(m, obj);
                (t, s.map(Value::Object))
            }
            Kind::List(m) => {
                let items: Vec<Value> = v.and_then(Value::as_array).cloned().unwrap_or_default();
                if self.odd() {
                    if self.p(Self::GARBAGE) {
                        self.tag("list:wrong-type");
                        return (self.pick(&["{}", "\"x\"", "true"]).into(), None);
                    }
                    if items.is_empty() {
                        self.tag("list:null");
                        return ("null".into(), Some(Value::Null));
                    }
                }
                let mut texts = Vec::new();
                let mut out = Some(Vec::new());
                for it in &items {
                    let obj = it.as_object().cloned().unwrap_or_default();
                    let (t, s) = self.enc_msg(m, &obj);
                    texts.push(t);
                    match (&mut out, s) {
                        (Some(o), Some(s)) => o.push(Value::Object(s)),
                        _ => out = None,
                    }
                }
                (format!("[{}]", texts.join(",")), out.map(Value::Array))
            }
        }
    }

    fn enc_bytes(&mut self, b: &[u8]) -> (String, Option<Value>) {
        let std = b64(b, STD, true);
        let meaning = Some(Value::String(std.clone()));
        if !self.odd() {
            return (q(&std), meaning);
        }
        if self.p(Self::GARBAGE) {
            let g = self.pick(&[
                "\"!!\"",
                "\"a\"",
                "\"AA==AA==\"",
                "\" YQ==\"",
                "{}",
                "1",
                "true",
                "\"YQ==YQ\"",
            ]);
            self.tag(format!("bytes:garbage {g}"));
            return (g.to_string(), None);
        }
        let mut opts = vec!["array", "over-padded"];
        if b.is_empty() {
            opts = vec!["array", "null"];
        } else {
            opts.extend(["newline", "escape"]);
        }
        if !b.len().is_multiple_of(3) {
            opts.extend(["unpadded", "trailing-bits"]);
        }
        if b.len() % 3 == 1 {
            opts.push("short-padded");
        }
        if std.contains(['+', '/']) {
            opts.push("url-safe");
        }
        let o = self.pick(&opts);
        self.tag(format!("bytes:{o}"));
        let text = match o {
            "array" => format!(
                "[{}]",
                b.iter().map(u8::to_string).collect::<Vec<_>>().join(",")
            ),
            "null" => return ("null".into(), Some(Value::Null)),
            "over-padded" => q(&format!("{std}=")),
            "newline" => {
                let at = self.rng.random_range(0..=std.len());
                let nl = self.pick(&["\\n", "\\r\\n"]);
                format!("\"{}{nl}{}\"", &std[..at], &std[at..])
            }
            "escape" => {
                let at = self.rng.random_range(0..std.len());
                let c = std.as_bytes()[at];
                let esc = if c == b'/' && self.p(0.5) {
                    "\\/".to_string()
                } else {
                    format!("\\u{c:04x}")
                };
                format!("\"{}{esc}{}\"", &std[..at], &std[at + 1..])
            }
            "unpadded" => q(&b64(b, STD, false)),
            "short-padded" => q(&std[..std.len() - 1]),
            "url-safe" => {
                let pad = self.p(0.5);
                q(&b64(b, URL, pad))
            }
            "trailing-bits" => {
                // The last character before the padding carries 4 (one
                // byte left) or 2 (two bytes) unused bits: set some.
                let s = std.trim_end_matches('=');
                let last = s.as_bytes()[s.len() - 1];
                let six = STD.iter().position(|&x| x == last).unwrap_or(0);
                let mask = if b.len() % 3 == 1 { 15 } else { 3 };
                let six = six | self.rng.random_range(1..=mask);
                let pad = &std[s.len()..];
                q(&format!("{}{}{pad}", &s[..s.len() - 1], STD[six] as char))
            }
            _ => unreachable!(),
        };
        (text, meaning)
    }

    /// `d`: decimal digits, or a lease placeholder.
    fn enc_i64(&mut self, d: &str, ttl: bool) -> (String, Option<Value>) {
        let meaning = Some(Value::String(d.to_string()));
        if !self.odd() {
            return if self.p(0.5) {
                (q(d), meaning)
            } else {
                (d.to_string(), meaning)
            };
        }
        if self.p(Self::GARBAGE) {
            let g = self.pick(&[
                "\"\"",
                "true",
                "\"true\"",
                "9223372036854775808",
                "\"9223372036854775808\"",
                "-9223372036854775809",
                "{}",
                "\"1x\"",
            ]);
            self.tag(format!("int:garbage {g}"));
            return (g.to_string(), None);
        }
        let mut opts = vec!["space", "float", "float-string", "exponent"];
        if !d.starts_with('-') {
            opts.push("plus");
        }
        if !d.starts_with(['-', '@']) {
            // Not for a lease a server chose: Go's message quotes its
            // second digit ("invalid character '2' after top-level value").
            opts.push("leading-zero");
        }
        if d == "0" && !ttl {
            opts.extend(["null", "null-string", "minus-zero", "minus-zero-string"]);
        }
        let o = self.pick(&opts);
        self.tag(format!("int:{o}"));
        let text = match o {
            "space" => {
                if self.p(0.5) {
                    format!("\" {d}\"")
                } else {
                    format!("\"{d} \"")
                }
            }
            "float" => format!("{d}.0"),
            "float-string" => format!("\"{d}.0\""),
            "exponent" => format!("{d}e0"),
            "plus" => format!("\"+{d}\""),
            "leading-zero" => format!("\"0{d}\""),
            "null" => return ("null".into(), Some(Value::Null)),
            "null-string" => "\"null\"".into(),
            "minus-zero" => "-0".into(),
            "minus-zero-string" => "\"-0\"".into(),
            _ => unreachable!(),
        };
        (text, meaning)
    }

    fn enc_bool(&mut self, b: bool) -> (String, Option<Value>) {
        let meaning = Some(Value::Bool(b));
        if !self.odd() {
            return (b.to_string(), meaning);
        }
        if self.p(Self::GARBAGE) {
            let g = self.pick(&["\"yes\"", "{}", "[]"]);
            self.tag(format!("bool:garbage {g}"));
            return (g.to_string(), None);
        }
        let mut opts = vec!["string", "number"];
        if !b {
            opts.push("null");
        }
        let o = self.pick(&opts);
        self.tag(format!("bool:{o}"));
        match o {
            "string" => (format!("\"{b}\""), meaning),
            "number" => ((b as u8).to_string(), meaning),
            _ => ("null".into(), Some(Value::Null)),
        }
    }

    /// `v`: a name, or a number outside the enum.
    fn enc_enum(&mut self, names: &[&str], v: &Value) -> (String, Option<Value>) {
        let meaning = Some(v.clone());
        let n = match v {
            Value::String(s) => names.iter().position(|x| x == s).unwrap_or(0) as i64,
            v => {
                self.tag("enum:unknown-number");
                let n = v.as_i64().unwrap_or(0);
                return if self.odd() {
                    self.tag("enum:quoted-number");
                    (q(&n.to_string()), meaning)
                } else {
                    (n.to_string(), meaning)
                };
            }
        };
        let name = names[n as usize];
        if !self.odd() {
            return if self.p(0.7) {
                (q(name), meaning)
            } else {
                (n.to_string(), meaning)
            };
        }
        if self.p(Self::GARBAGE) {
            let g = self.pick(&["\"NOPE\"", "true", "{}", "1.0", "\"\""]);
            self.tag(format!("enum:garbage {g}"));
            return (g.to_string(), None);
        }
        let mut opts = vec!["quoted-number", "lower-case"];
        if n == 0 {
            opts.push("null");
        }
        let o = self.pick(&opts);
        self.tag(format!("enum:{o}"));
        match o {
            "quoted-number" => (q(&n.to_string()), meaning),
            "lower-case" => (q(&name.to_lowercase()), meaning),
            _ => ("null".into(), Some(Value::Null)),
        }
    }

    /// Learns from the reference's answer to what it applied.
    fn learn(&mut self, step: &Step, answer: &Value) {
        let mut revs = Vec::new();
        collect_revisions(answer, &mut revs);
        let head = answer.pointer("/header/revision").map_or(0, as_i64);
        self.head = self.head.max(head);
        if step.msg == Msg::Compaction {
            let rev = (step.meaning.as_ref()).and_then(|m| m.get("revision"));
            self.compacted = self.compacted.max(rev.map_or(0, as_i64));
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

/// `v` without empty operations and with compare targets and results
/// inside their enums, at any depth.
fn only_known(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, v) in m.iter_mut() {
                match (k.as_str(), &v) {
                    ("target", Value::Number(_)) => *v = Value::from(TARGET[1]),
                    ("result", Value::Number(_)) => *v = Value::from(RESULT[1]),
                    _ => only_known(v),
                }
            }
        }
        Value::Array(a) => {
            a.retain(|op| op.as_object().is_none_or(|o| !o.is_empty()));
            a.iter_mut().for_each(only_known);
        }
        _ => {}
    }
}

/// Whether any of these operations (at any depth) writes.
fn has_writes(ops: &[Value]) -> bool {
    ops.iter().any(|op| {
        op.get("request_put").is_some()
            || op.get("request_delete_range").is_some()
            || op.get("request_txn").is_some_and(|t| {
                ["success", "failure"].iter().any(|k| {
                    t.get(*k)
                        .and_then(Value::as_array)
                        .is_some_and(|a| has_writes(a))
                })
            })
    })
}

/// A JSON int64 (a string, as the gateway writes it, or a number).
fn as_i64(v: &Value) -> i64 {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| v.as_i64())
        .unwrap_or(0)
}

fn collect_revisions(v: &Value, out: &mut Vec<i64>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                if k == "create_revision" || k == "mod_revision" || k == "revision" {
                    out.push(as_i64(v));
                } else {
                    collect_revisions(v, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| collect_revisions(v, out)),
        _ => {}
    }
}

// ---------------------------------------------------------------------
// HTTP.

/// One HTTP/1.1 `POST` (`Connection: close`), read until EOF.
fn post(port: u16, path: &str, ctype: Option<&str>, body: &str) -> Resp {
    let ct = ctype.map_or(String::new(), |c| format!("Content-Type: {c}\r\n"));
    let len = body.len();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{ct}Content-Length: {len}\r\n\
         Connection: close\r\n\r\n{body}"
    );
    raw_exchange(port, request.as_bytes(), Instant::now() + IO_TIMEOUT)
}

// ---------------------------------------------------------------------
// Servers, normalisation, comparison.

/// One server: its client port, whether it is etcd 3.4, and the IDs of
/// the leases it chose, in grant order.
struct Server {
    name: String,
    port: u16,
    v34: bool,
    leases: Vec<String>,
    /// Remaining TTLs longer than granted, or shorter than granted less
    /// the run's time so far and 10 s.
    violations: Vec<String>,
    started: Instant,
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
            v34: !retcd && version.starts_with("3.4."),
            leases: Vec::new(),
            violations: Vec::new(),
            started: Instant::now(),
        }
    }

    /// `text` with each lease placeholder replaced by this server's ID of
    /// that grant (one it does not have: a lease never granted).
    fn render(&self, text: &str) -> String {
        let mut parts = text.split("@L");
        let mut out = parts.next().unwrap_or("").to_string();
        for p in parts {
            // (A body cut short may end inside a placeholder.)
            let at = p
                .split_once('@')
                .and_then(|(i, rest)| Some((i.parse().ok()?, rest)));
            let Some((i, rest)) = at else {
                out.push_str("@L");
                out.push_str(p);
                continue;
            };
            let unknown = UNKNOWN_LEASE.to_string();
            out.push_str(self.leases.get::<usize>(i).unwrap_or(&unknown));
            out.push_str(rest);
        }
        out
    }

    /// Sends `body` to `msg`'s path; records a lease this server chose.
    fn send(&mut self, msg: Msg, ctype: Option<&str>, body: &str) -> (String, Resp) {
        let body = self.render(body);
        let r = post(self.port, path_of(msg), ctype, &body);
        if msg == Msg::Grant && r.status == 200 {
            let v: Value = serde_json::from_str(&r.body).unwrap_or_default();
            // Chosen by the server: an ID the request does not carry.
            if let Some(id) = v["ID"].as_str().filter(|id| !body.contains(id)) {
                self.leases.push(id.to_string());
            }
        }
        (body, r)
    }

    /// The answer as compared.
    fn normalise(&mut self, r: &Resp) -> Norm {
        // FailedPrecondition: 412 in 3.4's gateway, 400 in 3.5's.
        let status = if self.v34 && r.status == 412 {
            400
        } else {
            r.status
        };
        let mut body = serde_json::from_str::<Value>(&r.body).ok();
        let order = body.as_ref().map(|_| key_order(&r.body));
        if let Some(b) = &mut body {
            self.mask(b, "");
        }
        Norm {
            status,
            ctype: r.ctype.clone(),
            raw: r.body.trim().to_string(),
            body,
            order: order.unwrap_or_default(),
        }
    }

    fn mask(&mut self, v: &mut Value, key: &str) {
        match v {
            Value::Object(m) => {
                let granted = m.get("grantedTTL").map(as_i64);
                for (k, v) in m.iter_mut() {
                    match (k.as_str(), granted) {
                        ("cluster_id" | "member_id" | "raft_term", _) => {
                            *v = Value::from(format!("<{k}>"));
                        }
                        ("TTL", Some(g)) => {
                            let ttl = as_i64(v);
                            let least = g - 10 - self.started.elapsed().as_secs() as i64;
                            if !(least..=g).contains(&ttl) {
                                let n = &self.name;
                                self.violations.push(format!(
                                    "{n}: a remaining TTL {ttl} not in {least}..={g}"
                                ));
                            }
                            *v = Value::from("<TTL>");
                        }
                        _ => self.mask(v, k),
                    }
                }
            }
            Value::Array(a) => {
                a.iter_mut().for_each(|v| self.mask(v, key));
                if key == "leases" || key == "keys" {
                    a.sort_by_key(Value::to_string);
                }
            }
            Value::String(s) if key == "ID" || key == "lease" => {
                if let Some(i) = self.leases.iter().position(|l| l == s) {
                    *s = format!("<lease#{i}>");
                }
            }
            // A decoder's message may quote a lease ID ("cannot unmarshal
            // number <ID>.0 into Go value of type int64").
            Value::String(s) if key == "message" || key == "error" => {
                let mut ids: Vec<(usize, &String)> = self.leases.iter().enumerate().collect();
                ids.sort_by_key(|(_, id)| std::cmp::Reverse(id.len()));
                for (i, id) in ids {
                    *s = s.replace(id.as_str(), &format!("<lease#{i}>"));
                }
            }
            _ => {}
        }
    }
}

/// An answer as compared.
#[derive(Debug, Clone)]
struct Norm {
    status: u16,
    ctype: String,
    raw: String,
    body: Option<Value>,
    /// Each object's keys in the order written.
    order: Vec<String>,
}

impl Norm {
    /// A refusal by the JSON decoder: code 3, not etcdserver's message.
    fn decode_error(&self) -> bool {
        let b = self.body.as_ref();
        b.is_some_and(|b| {
            b["code"] == 3
                && !b["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("etcdserver:"))
        })
    }

    fn show(&self) -> String {
        let body = self
            .body
            .as_ref()
            .map_or(self.raw.clone(), Value::to_string);
        format!("{} {} {body}", self.status, self.ctype)
    }
}

/// Tallies of decoder wordings: (etcd's, the target's) → count.
type Wordings = BTreeMap<(String, String), usize>;

/// What differs between the reference's answer `r` and the target's `t`.
fn differ(r: &Norm, t: &Norm, strict: bool, wordings: &mut Wordings) -> Option<&'static str> {
    if r.status != t.status {
        return Some("HTTP status");
    }
    if r.ctype != t.ctype {
        return Some("content type");
    }
    if r.decode_error() && t.decode_error() && !strict {
        let (rb, tb) = (r.body.as_ref().unwrap(), t.body.as_ref().unwrap());
        if rb["code"] != tb["code"] {
            return Some("error code");
        }
        if rb != tb {
            let m = |b: &Value| b["message"].as_str().unwrap_or("").to_string();
            *wordings.entry((m(rb), m(tb))).or_default() += 1;
        }
        return None;
    }
    match (&r.body, &t.body) {
        (Some(a), Some(b)) if a != b => Some("body"),
        (Some(_), Some(_)) if r.status == 200 && r.order != t.order => Some("key order"),
        (Some(_), Some(_)) => None,
        _ if r.raw != t.raw => Some("body (not JSON)"),
        _ => None,
    }
}

/// The canonical writing of a meaning.
fn canonical(meaning: &Value) -> String {
    meaning.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_random_differential() {
    let seed = env_u64("RETCD_GATEWAY_DIFF_SEED", 1);
    let steps = env_u64("RETCD_GATEWAY_DIFF_STEPS", 10_000);
    // A long run gets more time than the default one.
    let limit = LIMIT.max(Duration::from_millis(steps * 100));
    bounded(limit, async {
        let flavor = test_flavor();
        let ref_bin = match std::env::var("RETCD_GATEWAY_DIFF_REFERENCE") {
            Ok(v) if v == "3.5.1" => retcd_tests::etcd351_bin(),
            Ok(v) if !v.is_empty() => PathBuf::from(v),
            _ => retcd_tests::etcd_bin(),
        };
        let (reference, target) = tokio::join!(
            Cluster::start_with_binary(Flavor::Etcd, ref_bin, 1, FAST),
            Cluster::start(flavor, 1, FAST),
        );
        let reference = reference.expect("start reference etcd");
        let target = target.expect("start target");
        tokio::task::block_in_place(|| run(seed, steps, &reference, &target));
    })
    .await;
}

fn run(seed: u64, steps: u64, reference: &Cluster, target: &Cluster) {
    let (mut r, mut t) = (Server::new(reference), Server::new(target));
    let strict =
        std::env::var("RETCD_GATEWAY_DIFF_MESSAGES").is_ok_and(|v| v == "1") || r.name == t.name;
    let trace = std::env::var_os("RETCD_TEST_TRACE").is_some();
    // Differing steps printed at most (the count is always given).
    let max_shown = env_u64("RETCD_GATEWAY_DIFF_SHOW", 20) as usize;
    let (rname, tname) = (r.name.clone(), t.name.clone());
    let mut g = Gen {
        rng: StdRng::seed_from_u64(seed),
        head: 1,
        compacted: 0,
        revs: Vec::new(),
        chosen: 0,
        oneof_dups: !r.v34 && !t.v34,
        unknown_enums: std::env::var("RETCD_GATEWAY_DIFF_UNKNOWN_ENUMS").is_ok_and(|v| v == "1"),
        tags: Vec::new(),
    };
    let started = Instant::now();
    let (mut diffs, mut shown) = (0usize, Vec::new());
    // Per odd writing: differing steps with it alone (and the first), with
    // others; and the differing steps written canonically.
    let mut by_writing: BTreeMap<String, (usize, Option<u64>, usize)> = BTreeMap::new();
    let mut canonical_diffs = Vec::new();
    let mut wordings = Wordings::new();
    let (mut unrepaired, mut repaired, mut statuses) = (Vec::new(), 0usize, BTreeMap::new());
    for n in 0..steps {
        g.chosen = r.leases.len();
        let step = g.next();
        let (rbody, ra) = r.send(step.msg, step.ctype, &step.body);
        let (_, ta) = t.send(step.msg, step.ctype, &step.body);
        let (rn, tn) = (r.normalise(&ra), t.normalise(&ta));
        assert!(
            ra.status != 0,
            "seed {seed} step {n}: no answer from {rname} (did it die? its log is below): POST {} \
             {:?}\n{}",
            path_of(step.msg),
            step.body,
            ra.body
        );
        *statuses.entry(rn.status).or_insert(0usize) += 1;
        let what = differ(&rn, &tn, strict, &mut wordings);
        let path = path_of(step.msg);
        let ct = step
            .ctype
            .map_or("no Content-Type".into(), |c| format!("Content-Type: {c}"));
        if trace {
            eprintln!(
                "step {n}: POST {path} [{ct}] {rbody:?}\n  etcd: {}",
                rn.show()
            );
            eprintln!("  {tname}: {}", tn.show());
        }
        if let Some(what) = what {
            diffs += 1;
            if step.tags.is_empty() {
                canonical_diffs.push(n);
            }
            for tag in &step.tags {
                let e = by_writing.entry(tag.clone()).or_default();
                if step.tags.len() == 1 {
                    e.0 += 1;
                    e.1 = e.1.or(Some(n));
                } else {
                    e.2 += 1;
                }
            }
            if shown.len() < max_shown {
                let meaning = step.meaning.as_ref().map_or("garbage".into(), canonical);
                shown.push(format!(
                    "seed {seed} step {n}: {what} differs; writings {:?}\n  POST {path} [{ct}] \
                     {rbody}\n  (meaning {meaning})\n  etcd:   {}\n  {tname}: {}",
                    step.tags,
                    rn.show(),
                    tn.show()
                ));
            }
        }
        // A write one server applied and the other refused: the refusing one
        // gets its canonical writing.
        let mut applied = (ra.status == 200).then(|| rn.body.clone()).flatten();
        if writes(&step) && (ra.status == 200) != (ta.status == 200) {
            let server = if ra.status == 200 { &mut t } else { &mut r };
            let fixed = step.meaning.as_ref().map(|m| {
                let (_, a) = server.send(step.msg, Some("application/json"), &canonical(m));
                a
            });
            match fixed {
                Some(a) if a.status == 200 => {
                    repaired += 1;
                    if ra.status != 200 {
                        applied = serde_json::from_str(&a.body).ok();
                    }
                }
                Some(a) => unrepaired.push((n, format!("{} {}", a.status, a.body.trim()))),
                None => unrepaired.push((n, "garbage".into())),
            }
        }
        if let Some(a) = applied {
            g.learn(&step, &a);
        }
    }
    eprintln!(
        "gateway_random_differential: {rname} vs {tname}, seed {seed}: {steps} steps in {:.1?} \
         (etcd's statuses {statuses:?}), head revision {}, {} leases chosen, {repaired} writes \
         repaired, {diffs} differing steps",
        started.elapsed(),
        g.head,
        r.leases.len(),
    );
    if !wordings.is_empty() {
        let n: usize = wordings.values().sum();
        eprintln!(
            "{n} refusals by both JSON decoders with other wordings ({} distinct; compared: \
             RETCD_GATEWAY_DIFF_MESSAGES=1), e.g.:",
            wordings.len()
        );
        for ((a, b), c) in wordings.iter().take(12) {
            eprintln!("  {c}x etcd: {a:?}\n      {tname}: {b:?}");
        }
    }
    let violations: Vec<String> = r.violations.iter().chain(&t.violations).cloned().collect();
    let mut summary: Vec<String> = (by_writing.iter())
        .map(|(k, (alone, first, with))| match first {
            Some(f) => format!("  {k}: {alone} alone (first at step {f}), {with} with others"),
            None => format!("  {k}: {with} with others"),
        })
        .collect();
    if !canonical_diffs.is_empty() {
        summary.push(format!("  written canonically: steps {canonical_diffs:?}"));
    }
    let unrepaired = match unrepaired.first() {
        Some((first, _)) => format!(
            "\n\nwrites applied by one server only, not repaired (the stores may differ from step \
             {first} on): {} steps, the first ones (step, the repair's answer): {:?}",
            unrepaired.len(),
            &unrepaired[..unrepaired.len().min(5)]
        ),
        None => String::new(),
    };
    assert!(
        diffs == 0 && violations.is_empty(),
        "{diffs} of {steps} steps differ between {rname} and {tname} (seed {seed}; the first {} \
         below){unrepaired}\n\ndiffering steps by odd writing:\n{}\n\n{}\n\n{}",
        shown.len(),
        summary.join("\n"),
        shown.join("\n\n"),
        violations.join("\n")
    );
}

#[test]
fn writings_decode_as_meant() {
    assert_eq!(b64(b"v", STD, true), "dg==");
    assert_eq!(b64(b"v", STD, false), "dg");
    assert_eq!(b64(b"\xfb\xff", STD, true), "+/8=");
    assert_eq!(b64(b"\xfb\xff", URL, false), "-_8");
    assert_eq!(unb64("+/8="), b"\xfb\xff");
    assert_eq!(unb64("dnZ2"), b"vvv");
    assert_eq!(
        key_order(r#"{"b":{"y":1,"x":[{"k":"a,b"}]},"a":2}"#),
        ["k", "y,x", "b,a"]
    );
    let mut g = Gen {
        rng: StdRng::seed_from_u64(7),
        head: 1,
        compacted: 0,
        revs: Vec::new(),
        chosen: 2,
        oneof_dups: true,
        unknown_enums: true,
        tags: Vec::new(),
    };
    // Every writing that has a meaning is valid JSON.
    for _ in 0..2000 {
        let s = g.next();
        if s.meaning.is_some()
            && !s.body.trim().is_empty()
            && !s.tags.iter().any(|t| t == "body:trailing")
        {
            let body = s.body.replace("@L0@", "1").replace("@L1@", "2");
            assert!(serde_json::from_str::<Value>(&body).is_ok(), "{body}");
        }
    }
}
