//! A seeded random differential test of etcd's *key-permission* logic:
//! the same sequence of requests goes to a fresh 1-member etcd 3.5.1 (the
//! reference) and a fresh 1-member target (retcd by default;
//! `RETCD_TEST_FLAVOR=etcd` makes it a second etcd 3.5.1, which checks the
//! test itself), both started with the same flags, auth set up identically
//! (users `root`, `u1`..`u4`, roles `root`, `r1`..`r4`).
//!
//! The steps: permission management as root (RoleAdd/RoleDelete,
//! RoleGrantPermission with random types and ranges over a small
//! overlapping key space — single keys, prefixes, from-key, arbitrary
//! `[k1, k2)` including empty and reversed ones —, RoleRevokePermission of
//! granted and never granted ranges, UserGrantRole/UserRevokeRole, now and
//! then UserDelete and UserAdd again, a password change) each followed by
//! RoleGet/UserGet of what it touched; and access checks as a random user
//! with the token of its last `Authenticate` (which a delete or a password
//! change invalidates; both servers must agree on when): Range, Put,
//! DeleteRange (with and without prev_kv, leases), Txn with compares and
//! nested Txns, the first answer of a Watch creation, LeaseTimeToLive with
//! keys and LeaseRevoke of leases with attached keys (explicit lease IDs,
//! granted by root), RoleGet/UserGet as the user.
//!
//! Every answer is compared whole: the same gRPC code and message, or equal
//! responses after [`normalise`] (header cluster ID, member ID and raft
//! term; an Authenticate token; a live lease's remaining TTL and the order
//! of its keys, which etcd lists in Go map order).
//!
//! ## Newer etcd
//!
//! retcd aims at the newest etcd (3.5.33 / 3.6), which is stricter than
//! 3.5.1 in a few places. Against retcd the test expects the newest
//! behaviour there, computed from the reference's answer and a [`Model`] of
//! etcd's permission check (the union of the user's READ or WRITE ranges
//! must cover the request's; a key or an empty range needs one that holds
//! the key), fed with the reference's RoleGet/UserGet answers. Requests
//! never have a reversed range (end below the key): etcd's answer to those
//! depends on the shape of its interval tree. The model is checked against
//! etcd 3.5.1 on every access step (both modes): whenever 3.5.1 permits or
//! denies, the model under 3.5.1's rules must say the same. The places:
//!
//! * RoleGrantPermission of an invalid range (empty key; `k2 <= k1` unless
//!   `k2` is `\0`): newest etcd refuses it with "invalid auth management"
//!   (`isValidPermissionRange`, 3.5.8+ / 3.6, PR #15619), 3.5.1 stores
//!   it. Against retcd the grant goes to the target alone (3.5.1 would store
//!   what the newest etcd never has); against etcd both get it and then its
//!   revoke.
//! * Txn: nested Txns are checked recursively (3.5.28, CVE-2026-33343), a
//!   put's prev_kv needs READ and its lease's keys WRITE (3.5.30). When the
//!   model says the newest etcd refuses a Txn that 3.5.1 would run, the
//!   Txn goes to the target alone; the reference only gets it with a bogus
//!   token, whose answer tells whether the request is refused before any
//!   auth check (e.g. "duplicate key"), else PermissionDenied is expected.
//! * Watch: a from-key watch (range_end `\0`) is checked as the open range
//!   (3.5.33 / 3.6.14, GHSA-xg4h-6gfc-h4m8; 3.5.1 checks the key alone), a
//!   refusal has watch_id -1 and its own reason (3.5.6).
//! * LeaseTimeToLive: with keys, READ on every attached key (3.5.9); a
//!   valid token at all (3.5.28).
//!
//! Every run starts with a fixed reproduction of each difference this test
//! found in retcd ([`regressions`]), then the seeded steps.
//!
//! Not generated: role permission lists longer than 6 (etcd sorts them
//! with Go's `sort.Sort`, which Go 1.16 — etcd 3.5.1 — does with an
//! unstable shell pass from 7 elements on; newer Go is stable up to 12, so
//! the order of equal keys would differ by version), Compaction (root only
//! in newer etcd), JWT tokens.
//!
//! `RETCD_AUTHZ_DIFF_SEED` (default 1) and `RETCD_AUTHZ_DIFF_STEPS` (default
//! 400) replay and size a run; `RETCD_AUTHZ_DIFF_TRACE=1` prints every step
//! and both answers. `RETCD_AUTHZ_DIFF_AVOID`, a comma-separated list, leaves
//! out cases of known differences, to look past them (a difference changes
//! the servers' states, so later steps differ too): `empty-ranges` (requests
//! whose range is empty, `k2 = k1`), `duplicate-grants` (a
//! grant of a range the role already has, where etcd's lookup misses it and
//! appends a second one), `unknown-perm-types` (permission types other than
//! READ, WRITE and READWRITE), `empty-watch-keys` (a watch on the empty key,
//! which etcd makes `\0` before its check).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use retcd_api::authpb::Permission;
use retcd_api::etcdserverpb as pb;
use retcd_tests::random_diff::{bytes_as_strings as readable, env_u64, prefix_end, Dice};
use retcd_tests::{
    bounded, etcd351_bin, limit::NORMAL as LIMIT, test_flavor, Cluster, Flavor, FAST,
};

use pb::auth_client::AuthClient;
use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use pb::watch_client::WatchClient;
use pb::{compare, request_op, response_op, ResponseHeader};
use tokio::time::timeout;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Request};

/// Each call's bound.
const CALL: Duration = Duration::from_secs(10);
/// How long a watch's first answer is awaited.
const WATCH_WAIT: Duration = Duration::from_secs(3);
/// Differing steps printed at most (the count is always given).
const MAX_SHOWN: usize = 20;

const USERS: [&str; 4] = ["u1", "u2", "u3", "u4"];
const ROLES: [&str; 4] = ["r1", "r2", "r3", "r4"];
/// A role never added.
const NO_ROLE: &str = "r9";
/// The key space: prefixes and ranges of these overlap.
const KEYS: [&[u8]; 9] = [
    b"a", b"a/", b"a/b", b"a/c", b"ab", b"b", b"\x00", b"\xff", b"z",
];
const VALUES: [&[u8]; 3] = [b"", b"v", b"w"];
/// Leases root grants with these IDs (both servers accept explicit IDs).
const LEASES: [i64; 3] = [0x51, 0x52, 0x53];
/// A lease ID never granted.
const NO_LEASE: i64 = 0x99;
/// A well-formed token no server issued (`<text>.<index>`, an index
/// already applied).
const BOGUS_TOKEN: &str = "bogus.1";
/// The longest permission list a role gets (see the module documentation).
const MAX_PERMS: usize = 6;

const READ: i32 = 0;
const WRITE: i32 = 1;
const READWRITE: i32 = 2;

fn password(user: &str) -> String {
    format!("pw-{user}")
}

// ---------------------------------------------------------------------------
// etcd's permission check, ported.

/// A key range of the model: `[begin, end)`, `None` for no end.
type Span = (Vec<u8>, Option<Vec<u8>>);

/// A permission's or a request's `key` / `range_end` as a [`Span`]: no end
/// is the key alone, `\0` is every key from it on.
fn span(key: &[u8], end: &[u8]) -> Span {
    match end {
        [] => (key.to_vec(), Some([key, &[0]].concat())),
        [0] => (key.to_vec(), None),
        end => (key.to_vec(), Some(end.to_vec())),
    }
}

/// Whether one of `perms` holds `key`.
fn holds(perms: &[Span], key: &[u8]) -> bool {
    perms
        .iter()
        .any(|(b, e)| b.as_slice() <= key && e.as_ref().is_none_or(|e| key < e.as_slice()))
}

/// Whether `perms` together cover all of `want` (a non-empty range): etcd's
/// interval tree's `Contains` for such a range.
fn covers(perms: &[Span], want: &Span) -> bool {
    let mut sorted: Vec<&Span> = perms.iter().collect();
    sorted.sort();
    let mut reached = want.0.clone();
    for (b, e) in sorted {
        if *b > reached {
            break;
        }
        match e {
            None => return true,
            Some(e) if *e > reached => reached = e.clone(),
            Some(_) => {}
        }
        if want.1.as_ref().is_some_and(|w| reached >= *w) {
            return true;
        }
    }
    false
}

/// `isValidPermissionRange` (etcd 3.5.8+ / 3.6): what the newest etcd
/// accepts in RoleGrantPermission.
fn valid_permission_range(key: &[u8], end: &[u8]) -> bool {
    !key.is_empty() && (end.is_empty() || key < end || end == [0])
}

/// Whether a request's range is empty or reversed.
fn empty_range(key: &[u8], end: &[u8]) -> bool {
    !end.is_empty() && end != [0] && end <= key
}

/// One permission check: READ or WRITE on `[key, end)` (`end` as the
/// request has it).
#[derive(Debug, Clone)]
struct Check {
    key: Vec<u8>,
    end: Vec<u8>,
    write: bool,
}

fn read(key: &[u8], end: &[u8]) -> Check {
    Check {
        key: key.to_vec(),
        end: end.to_vec(),
        write: false,
    }
}

fn write(key: &[u8], end: &[u8]) -> Check {
    Check {
        write: true,
        ..read(key, end)
    }
}

/// Whose rules a [`Model`] applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rules {
    /// etcd 3.5.1.
    V351,
    /// The newest etcd (3.5.33 / 3.6.14).
    Newest,
}

/// What the reference told about users and roles (its RoleGet/UserGet
/// answers to root), and etcd's permission check on it.
#[derive(Default)]
struct Model {
    /// Users with their roles.
    users: BTreeMap<String, Vec<String>>,
    /// Roles with their permissions, in etcd's order.
    roles: BTreeMap<String, Vec<Permission>>,
    /// Users the reference gave a token (maybe invalidated since).
    tokens: BTreeSet<String>,
}

impl Model {
    /// Learns from the reference's answer to `step`.
    fn learn(&mut self, step: &Step, a: &Answer) {
        let not_found = |a: &Answer| matches!(a, Err((_, m)) if m.ends_with("not found"));
        match (&step.caller, &step.call, a) {
            (Caller::Root, Call::RoleGet(r), Ok(Resp::RoleGet(g))) => {
                self.roles.insert(r.clone(), g.perm.clone());
            }
            (Caller::Root, Call::RoleGet(r), a) if not_found(a) => {
                self.roles.remove(r);
            }
            (Caller::Root, Call::UserGet(u), Ok(Resp::UserGet(g))) => {
                self.users.insert(u.clone(), g.roles.clone());
            }
            (Caller::Root, Call::UserGet(u), a) if not_found(a) => {
                self.users.remove(u);
            }
            (_, Call::Authenticate(u), Ok(_)) => {
                self.tokens.insert(u.clone());
            }
            _ => {}
        }
    }

    /// `isOpPermitted` for a user with a valid, current token: the user's
    /// READ or WRITE permissions (`getMergedPerms`: READWRITE counts as
    /// both, an unknown type as neither) must hold the key, or cover the
    /// range.
    fn permitted(&self, user: &str, c: &Check) -> bool {
        let Some(roles) = self.users.get(user) else {
            return false;
        };
        if roles.iter().any(|r| r == "root") {
            return true;
        }
        let mut perms = Vec::new();
        for p in roles.iter().filter_map(|r| self.roles.get(r)).flatten() {
            let wanted = match p.perm_type {
                READWRITE => true,
                READ => !c.write,
                WRITE => c.write,
                _ => false,
            };
            if wanted {
                perms.push(span(&p.key, &p.range_end));
            }
        }
        let want = span(&c.key, &c.end);
        if c.end.is_empty() || empty_range(&c.key, &c.end) {
            // a key, or an empty range (the generator makes no reversed
            // one): permitted where a permission holds the key
            holds(&perms, &c.key)
        } else {
            covers(&perms, &want)
        }
    }

    /// The verdict on `step` by `rules` (`leases`: each referenced lease's
    /// keys before the step), or `None` when the step is no key access.
    fn verdict(&self, step: &Step, rules: Rules, leases: &Leases) -> Option<bool> {
        let Caller::User(u) = step.caller else {
            return None;
        };
        let checks = checks(&step.call, rules, leases)?;
        Some(checks.iter().all(|c| self.permitted(USERS[u], c)))
    }
}

/// Each lease a step names, with its keys (none: not granted).
type Leases = BTreeMap<i64, Vec<Vec<u8>>>;

/// The permission checks etcd makes for `call` (`None`: no key access).
fn checks(call: &Call, rules: Rules, leases: &Leases) -> Option<Vec<Check>> {
    let lease_keys = |id: i64, out: &mut Vec<Check>| {
        for k in leases.get(&id).into_iter().flatten() {
            out.push(write(k, b""));
        }
    };
    // checkPutAuth (apply_auth.go).
    let put = |p: &pb::PutRequest, out: &mut Vec<Check>| {
        out.push(write(&p.key, b""));
        lease_keys(p.lease, out);
        if p.prev_kv {
            out.push(read(&p.key, b""));
        }
    };
    let delete = |d: &pb::DeleteRangeRequest, out: &mut Vec<Check>| {
        if d.prev_kv {
            out.push(read(&d.key, &d.range_end));
        }
        out.push(write(&d.key, &d.range_end));
    };
    // checkTxnAuth: 3.5.1 checks a put's key alone and no nested Txn.
    fn txn(
        t: &pb::TxnRequest,
        rules: Rules,
        out: &mut Vec<Check>,
        put: &dyn Fn(&pb::PutRequest, &mut Vec<Check>),
        delete: &dyn Fn(&pb::DeleteRangeRequest, &mut Vec<Check>),
    ) {
        for c in &t.compare {
            out.push(read(&c.key, &c.range_end));
        }
        for op in t.success.iter().chain(&t.failure) {
            match &op.request {
                Some(request_op::Request::RequestRange(r)) => out.push(read(&r.key, &r.range_end)),
                Some(request_op::Request::RequestPut(p)) => match rules {
                    Rules::V351 => out.push(write(&p.key, b"")),
                    Rules::Newest => put(p, out),
                },
                Some(request_op::Request::RequestDeleteRange(d)) => delete(d, out),
                Some(request_op::Request::RequestTxn(t)) if rules == Rules::Newest => {
                    txn(t, rules, out, put, delete)
                }
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    match call {
        Call::Range(r) => out.push(read(&r.key, &r.range_end)),
        Call::Put(p) => put(p, &mut out),
        Call::Delete(d) => delete(d, &mut out),
        Call::Txn(t) => txn(t, rules, &mut out, &put, &delete),
        Call::Watch(w) => {
            // The watch server makes an empty key `\0`; 3.5.1 then turns
            // the range end `\0` into the empty one before the check, a
            // single key (GHSA-xg4h-6gfc-h4m8).
            let key = if w.key.is_empty() {
                vec![0]
            } else {
                w.key.clone()
            };
            let end = match rules {
                Rules::V351 if w.range_end == [0] => Vec::new(),
                _ => w.range_end.clone(),
            };
            out.push(read(&key, &end));
        }
        Call::TimeToLive(r) => {
            if r.keys && rules == Rules::Newest {
                for k in leases.get(&r.id).into_iter().flatten() {
                    out.push(read(k, b""));
                }
            }
        }
        Call::LeaseRevoke(r) => lease_keys(r.id, &mut out),
        _ => return None,
    }
    Some(out)
}

/// The leases `call` names.
fn lease_ids(call: &Call) -> Vec<i64> {
    fn txn(t: &pb::TxnRequest, out: &mut Vec<i64>) {
        for op in t.success.iter().chain(&t.failure) {
            match &op.request {
                Some(request_op::Request::RequestPut(p)) if p.lease != 0 => out.push(p.lease),
                Some(request_op::Request::RequestTxn(t)) => txn(t, out),
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    match call {
        Call::Put(p) if p.lease != 0 => out.push(p.lease),
        Call::Txn(t) => txn(t, &mut out),
        Call::TimeToLive(r) => out.push(r.id),
        Call::LeaseRevoke(r) => out.push(r.id),
        _ => {}
    }
    out
}

// ---------------------------------------------------------------------------
// Requests and answers.

/// Who sends a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    Root,
    /// `USERS[i]`.
    User(usize),
    /// [`BOGUS_TOKEN`].
    Bogus,
}

#[derive(Debug, Clone)]
enum Call {
    Range(pb::RangeRequest),
    Put(pb::PutRequest),
    Delete(pb::DeleteRangeRequest),
    Txn(pb::TxnRequest),
    Watch(pb::WatchCreateRequest),
    TimeToLive(pb::LeaseTimeToLiveRequest),
    LeaseRevoke(pb::LeaseRevokeRequest),
    LeaseGrant(pb::LeaseGrantRequest),
    Authenticate(String),
    AuthEnable,
    AuthStatus,
    UserAdd(String),
    UserDelete(String),
    ChangePassword(String),
    UserGrantRole(pb::AuthUserGrantRoleRequest),
    UserRevokeRole(pb::AuthUserRevokeRoleRequest),
    UserGet(String),
    UserList,
    RoleAdd(String),
    RoleDelete(String),
    RoleGrantPermission(pb::AuthRoleGrantPermissionRequest),
    RoleRevokePermission(pb::AuthRoleRevokePermissionRequest),
    RoleGet(String),
    RoleList,
}

impl Call {
    /// The request's kind, for the summary of differences.
    fn kind(&self) -> &'static str {
        match self {
            Call::Range(_) => "Range",
            Call::Put(_) => "Put",
            Call::Delete(_) => "DeleteRange",
            Call::Txn(_) => "Txn",
            Call::Watch(_) => "Watch",
            Call::TimeToLive(_) => "LeaseTimeToLive",
            Call::LeaseRevoke(_) => "LeaseRevoke",
            Call::LeaseGrant(_) => "LeaseGrant",
            Call::Authenticate(_) => "Authenticate",
            Call::AuthEnable => "AuthEnable",
            Call::AuthStatus => "AuthStatus",
            Call::UserAdd(_) => "UserAdd",
            Call::UserDelete(_) => "UserDelete",
            Call::ChangePassword(_) => "UserChangePassword",
            Call::UserGrantRole(_) => "UserGrantRole",
            Call::UserRevokeRole(_) => "UserRevokeRole",
            Call::UserGet(_) => "UserGet",
            Call::UserList => "UserList",
            Call::RoleAdd(_) => "RoleAdd",
            Call::RoleDelete(_) => "RoleDelete",
            Call::RoleGrantPermission(_) => "RoleGrantPermission",
            Call::RoleRevokePermission(_) => "RoleRevokePermission",
            Call::RoleGet(_) => "RoleGet",
            Call::RoleList => "RoleList",
        }
    }
}

#[derive(Debug, Clone)]
struct Step {
    caller: Caller,
    call: Call,
}

fn root(call: Call) -> Step {
    Step {
        caller: Caller::Root,
        call,
    }
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq)]
enum Resp {
    Range(pb::RangeResponse),
    Put(pb::PutResponse),
    Delete(pb::DeleteRangeResponse),
    Txn(pb::TxnResponse),
    /// A watch stream's first message.
    Watch(pb::WatchResponse),
    TimeToLive(pb::LeaseTimeToLiveResponse),
    LeaseRevoke(pb::LeaseRevokeResponse),
    LeaseGrant(pb::LeaseGrantResponse),
    Authenticate(pb::AuthenticateResponse),
    AuthStatus(pb::AuthStatusResponse),
    UserGet(pb::AuthUserGetResponse),
    UserList(pb::AuthUserListResponse),
    RoleGet(pb::AuthRoleGetResponse),
    RoleList(pb::AuthRoleListResponse),
    /// An auth change's answer: its header alone.
    Done(Option<ResponseHeader>),
}

/// An answer: the response, or the gRPC code and message.
type Answer = Result<Resp, (Code, String)>;

/// The only normalisation: every header (at any depth of a Txn) loses its
/// cluster ID, member ID and raft term; an issued token becomes `<token>`
/// (random); a live lease's remaining TTL becomes its granted TTL (it
/// counts down on each server's clock) and its keys are sorted (etcd lists
/// them in Go map order).
fn normalise(a: &mut Answer) {
    fn header(h: &mut Option<ResponseHeader>) {
        if let Some(h) = h {
            h.cluster_id = 0;
            h.member_id = 0;
            h.raft_term = 0;
        }
    }
    fn txn(t: &mut pb::TxnResponse) {
        header(&mut t.header);
        for r in &mut t.responses {
            match &mut r.response {
                Some(response_op::Response::ResponseRange(r)) => header(&mut r.header),
                Some(response_op::Response::ResponsePut(r)) => header(&mut r.header),
                Some(response_op::Response::ResponseDeleteRange(r)) => header(&mut r.header),
                Some(response_op::Response::ResponseTxn(t)) => txn(t),
                None => {}
            }
        }
    }
    let Ok(r) = a else { return };
    match r {
        Resp::Range(r) => header(&mut r.header),
        Resp::Put(r) => header(&mut r.header),
        Resp::Delete(r) => header(&mut r.header),
        Resp::Txn(t) => txn(t),
        Resp::Watch(r) => header(&mut r.header),
        Resp::TimeToLive(r) => {
            header(&mut r.header);
            if 0 < r.ttl && r.ttl <= r.granted_ttl {
                r.ttl = r.granted_ttl;
            }
            r.keys.sort();
        }
        Resp::LeaseRevoke(r) => header(&mut r.header),
        Resp::LeaseGrant(r) => header(&mut r.header),
        Resp::Authenticate(r) => {
            header(&mut r.header);
            if !r.token.is_empty() {
                r.token = "<token>".into();
            }
        }
        Resp::AuthStatus(r) => header(&mut r.header),
        Resp::UserGet(r) => header(&mut r.header),
        Resp::UserList(r) => header(&mut r.header),
        Resp::RoleGet(r) => header(&mut r.header),
        Resp::RoleList(r) => header(&mut r.header),
        Resp::Done(h) => header(h),
    }
}

fn denied() -> Answer {
    Err((
        Code::PermissionDenied,
        "etcdserver: permission denied".into(),
    ))
}

fn bad_token() -> Answer {
    Err((
        Code::Unauthenticated,
        "etcdserver: invalid auth token".into(),
    ))
}

fn is_bad_token(a: &Answer) -> bool {
    *a == bad_token()
}

/// etcd 3.5.1's `cancel_reason` for every refusal of a watch (the newest
/// etcd's for a permission denied).
const DENIED_351: &str = "rpc error: code = PermissionDenied desc = etcdserver: permission denied";

/// A watch refusal's `cancel_reason` in the newest etcd (and 3.5.1's for
/// every refusal): the gRPC error's text.
fn watch_reason(code: &str, msg: &str) -> String {
    format!("rpc error: code = {code} desc = {msg}")
}

/// What etcd 3.5.1's answer to an access step tells of its permission
/// check: permitted, denied, or nothing (refused before the check, e.g. an
/// invalid token or a malformed request).
fn outcome(a: &Answer) -> Option<bool> {
    match a {
        Ok(Resp::Watch(w)) if !w.canceled => Some(true),
        Ok(Resp::Watch(w)) if w.cancel_reason == DENIED_351 => Some(false),
        Ok(Resp::Watch(_)) => None,
        Ok(_) => Some(true),
        Err((Code::PermissionDenied, _)) => Some(false),
        // After the check: "requested lease not found".
        Err((Code::NotFound, _)) => Some(true),
        Err(_) => None,
    }
}

// ---------------------------------------------------------------------------
// The servers.

fn with_token<T>(m: T, token: Option<&str>) -> Request<T> {
    let mut r = Request::new(m);
    if let Some(t) = token {
        r.metadata_mut()
            .insert("token", t.parse().expect("a token is ASCII"));
    }
    r
}

/// One server: its channel and the tokens it issued (by user name).
struct Server {
    chan: Channel,
    tokens: BTreeMap<String, String>,
}

impl Server {
    async fn connect(c: &Cluster) -> Server {
        let chan = Channel::from_shared(c.members[0].endpoint())
            .expect("url")
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
            .expect("connect");
        Server {
            chan,
            tokens: BTreeMap::new(),
        }
    }

    fn token(&self, c: Caller) -> Option<String> {
        match c {
            Caller::Root => self.tokens.get("root").cloned(),
            Caller::User(i) => self.tokens.get(USERS[i]).cloned(),
            Caller::Bogus => Some(BOGUS_TOKEN.into()),
        }
    }

    /// Sends `call` as `caller`; the normalised answer. Keeps the token of
    /// a successful Authenticate.
    async fn call(&mut self, caller: Caller, call: &Call) -> Answer {
        type R<T> = Result<Result<tonic::Response<T>, tonic::Status>, tokio::time::error::Elapsed>;
        fn ans<T>(r: R<T>, f: impl FnOnce(T) -> Resp) -> Answer {
            match r {
                Ok(Ok(r)) => Ok(f(r.into_inner())),
                Ok(Err(s)) => Err((s.code(), s.message().to_string())),
                Err(_) => Err((Code::DeadlineExceeded, "(test: call timed out)".into())),
            }
        }
        let token = self.token(caller);
        let t = token.as_deref();
        let mut kv = KvClient::new(self.chan.clone());
        let mut lease = LeaseClient::new(self.chan.clone());
        let mut auth = AuthClient::new(self.chan.clone());
        let done = |h: Option<ResponseHeader>| Resp::Done(h);
        let mut a = match call.clone() {
            Call::Range(r) => ans(timeout(CALL, kv.range(with_token(r, t))).await, Resp::Range),
            Call::Put(r) => ans(timeout(CALL, kv.put(with_token(r, t))).await, Resp::Put),
            Call::Delete(r) => ans(
                timeout(CALL, kv.delete_range(with_token(r, t))).await,
                Resp::Delete,
            ),
            Call::Txn(r) => ans(timeout(CALL, kv.txn(with_token(r, t))).await, Resp::Txn),
            Call::Watch(w) => watch(&self.chan, t, w).await,
            Call::TimeToLive(r) => ans(
                timeout(CALL, lease.lease_time_to_live(with_token(r, t))).await,
                Resp::TimeToLive,
            ),
            Call::LeaseRevoke(r) => ans(
                timeout(CALL, lease.lease_revoke(with_token(r, t))).await,
                Resp::LeaseRevoke,
            ),
            Call::LeaseGrant(r) => ans(
                timeout(CALL, lease.lease_grant(with_token(r, t))).await,
                Resp::LeaseGrant,
            ),
            Call::Authenticate(name) => {
                let req = pb::AuthenticateRequest {
                    password: password(&name),
                    name: name.clone(),
                };
                let a = ans(
                    timeout(CALL, auth.authenticate(with_token(req, t))).await,
                    Resp::Authenticate,
                );
                if let Ok(Resp::Authenticate(r)) = &a {
                    self.tokens.insert(name, r.token.clone());
                }
                a
            }
            Call::AuthEnable => ans(
                timeout(
                    CALL,
                    auth.auth_enable(with_token(pb::AuthEnableRequest {}, t)),
                )
                .await,
                |r| done(r.header),
            ),
            Call::AuthStatus => ans(
                timeout(
                    CALL,
                    auth.auth_status(with_token(pb::AuthStatusRequest {}, t)),
                )
                .await,
                Resp::AuthStatus,
            ),
            Call::UserAdd(name) => {
                let req = pb::AuthUserAddRequest {
                    password: password(&name),
                    name,
                    options: None,
                    hashed_password: String::new(),
                };
                ans(
                    timeout(CALL, auth.user_add(with_token(req, t))).await,
                    |r| done(r.header),
                )
            }
            Call::UserDelete(name) => {
                let req = pb::AuthUserDeleteRequest { name };
                ans(
                    timeout(CALL, auth.user_delete(with_token(req, t))).await,
                    |r| done(r.header),
                )
            }
            Call::ChangePassword(name) => {
                let req = pb::AuthUserChangePasswordRequest {
                    password: password(&name),
                    name,
                    hashed_password: String::new(),
                };
                ans(
                    timeout(CALL, auth.user_change_password(with_token(req, t))).await,
                    |r| done(r.header),
                )
            }
            Call::UserGrantRole(r) => ans(
                timeout(CALL, auth.user_grant_role(with_token(r, t))).await,
                |r| done(r.header),
            ),
            Call::UserRevokeRole(r) => ans(
                timeout(CALL, auth.user_revoke_role(with_token(r, t))).await,
                |r| done(r.header),
            ),
            Call::UserGet(name) => {
                let req = pb::AuthUserGetRequest { name };
                ans(
                    timeout(CALL, auth.user_get(with_token(req, t))).await,
                    Resp::UserGet,
                )
            }
            Call::UserList => ans(
                timeout(
                    CALL,
                    auth.user_list(with_token(pb::AuthUserListRequest {}, t)),
                )
                .await,
                Resp::UserList,
            ),
            Call::RoleAdd(name) => {
                let req = pb::AuthRoleAddRequest { name };
                ans(
                    timeout(CALL, auth.role_add(with_token(req, t))).await,
                    |r| done(r.header),
                )
            }
            Call::RoleDelete(role) => {
                let req = pb::AuthRoleDeleteRequest { role };
                ans(
                    timeout(CALL, auth.role_delete(with_token(req, t))).await,
                    |r| done(r.header),
                )
            }
            Call::RoleGrantPermission(r) => ans(
                timeout(CALL, auth.role_grant_permission(with_token(r, t))).await,
                |r| done(r.header),
            ),
            Call::RoleRevokePermission(r) => ans(
                timeout(CALL, auth.role_revoke_permission(with_token(r, t))).await,
                |r| done(r.header),
            ),
            Call::RoleGet(role) => {
                let req = pb::AuthRoleGetRequest { role };
                ans(
                    timeout(CALL, auth.role_get(with_token(req, t))).await,
                    Resp::RoleGet,
                )
            }
            Call::RoleList => ans(
                timeout(
                    CALL,
                    auth.role_list(with_token(pb::AuthRoleListRequest {}, t)),
                )
                .await,
                Resp::RoleList,
            ),
        };
        normalise(&mut a);
        a
    }
}

/// Creates a watch on a stream of its own; the first message (the stream
/// is closed after it).
async fn watch(chan: &Channel, token: Option<&str>, create: pb::WatchCreateRequest) -> Answer {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let req = pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)),
    };
    tx.send(req).await.expect("queue the create request");
    let mut client = WatchClient::new(chan.clone());
    let call = client.watch(with_token(ReceiverStream::new(rx), token));
    let mut s = match timeout(CALL, call).await {
        Err(_) => return Err((Code::DeadlineExceeded, "(test: call timed out)".into())),
        Ok(Err(s)) => return Err((s.code(), s.message().to_string())),
        Ok(Ok(s)) => s.into_inner(),
    };
    let a = match timeout(WATCH_WAIT, s.message()).await {
        Err(_) => Err((Code::DeadlineExceeded, "(test: no watch response)".into())),
        Ok(Err(s)) => Err((s.code(), s.message().to_string())),
        Ok(Ok(None)) => Err((Code::Unknown, "(test: stream ended)".into())),
        Ok(Ok(Some(m))) => Ok(Resp::Watch(m)),
    };
    drop(tx);
    a
}

// ---------------------------------------------------------------------------
// The generator.

/// Cases of known differences the generator leaves out.
#[derive(Debug, Default, Clone, Copy)]
struct Avoid {
    empty_ranges: bool,
    duplicate_grants: bool,
    unknown_perm_types: bool,
    empty_watch_keys: bool,
}

impl Avoid {
    fn from_env() -> Avoid {
        let v = std::env::var("RETCD_AUTHZ_DIFF_AVOID").unwrap_or_default();
        let mut a = Avoid::default();
        for w in v.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match w {
                "empty-ranges" => a.empty_ranges = true,
                "duplicate-grants" => a.duplicate_grants = true,
                "unknown-perm-types" => a.unknown_perm_types = true,
                "empty-watch-keys" => a.empty_watch_keys = true,
                _ => panic!("RETCD_AUTHZ_DIFF_AVOID: unknown case {w:?}"),
            }
        }
        a
    }
}

/// Whether etcd's RoleGrantPermission would append `p` to `perms` although
/// the role has its range already: it looks at the first permission whose
/// key is not below `p`'s (`sort.Search`) only.
fn duplicate_grant(perms: &[Permission], p: &Permission) -> bool {
    let idx = perms.partition_point(|q| q.key < p.key);
    let same = |q: &Permission| q.key == p.key && q.range_end == p.range_end;
    !perms.get(idx).is_some_and(same) && perms.iter().any(same)
}

struct Gen {
    rng: StdRng,
    /// Cases left out (see `RETCD_AUTHZ_DIFF_AVOID`).
    avoid: Avoid,
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

    /// A range end for `key`: none (the key), its prefix end, `\0` (from
    /// the key on), another key (maybe below: empty or reversed), the key
    /// and `\0` (the key as a range) or the key itself (empty).
    fn range_end(&mut self, key: &[u8]) -> Vec<u8> {
        loop {
            let end = match self.rng.random_range(0..100) {
                0..30 => Vec::new(),
                30..50 => prefix_end(key),
                50..62 => vec![0],
                62..85 => self.key(),
                85..93 => [key, &[0]].concat(),
                _ => key.to_vec(),
            };
            if !(self.avoid.empty_ranges && empty_range(key, &end)) {
                return end;
            }
        }
    }

    /// A range end for a request on `key`: as [`Gen::range_end`], but never
    /// below the key. etcd's answer to a reversed range depends on the
    /// shape of its interval tree (its search prunes by the range's end,
    /// which lies below the start), so it is no check of the rules; an
    /// empty range (end = key) is permitted where a permission holds the
    /// key, in etcd and in retcd.
    fn request_end(&mut self, key: &[u8]) -> Vec<u8> {
        loop {
            let end = self.range_end(key);
            if !(empty_range(key, &end) && end.as_slice() < key) {
                return end;
            }
        }
    }

    fn role(&mut self) -> String {
        if self.p(0.03) {
            NO_ROLE.into()
        } else {
            self.pick(&ROLES).into()
        }
    }

    fn user(&mut self) -> usize {
        self.rng.random_range(0..USERS.len())
    }

    fn lease(&mut self) -> i64 {
        if self.p(0.15) {
            NO_LEASE
        } else {
            self.pick(&LEASES)
        }
    }

    fn put(&mut self) -> pb::PutRequest {
        pb::PutRequest {
            key: self.key(),
            value: self.pick(&VALUES).to_vec(),
            lease: if self.p(0.2) { self.lease() } else { 0 },
            prev_kv: self.p(0.3),
            ignore_value: false,
            ignore_lease: false,
        }
    }

    fn range(&mut self) -> pb::RangeRequest {
        let key = self.key();
        pb::RangeRequest {
            range_end: self.request_end(&key),
            key,
            limit: if self.p(0.3) {
                self.rng.random_range(1..3)
            } else {
                0
            },
            serializable: self.p(0.4),
            keys_only: self.p(0.2),
            count_only: self.p(0.15),
            ..Default::default()
        }
    }

    fn delete(&mut self) -> pb::DeleteRangeRequest {
        let key = self.key();
        pb::DeleteRangeRequest {
            range_end: self.request_end(&key),
            key,
            prev_kv: self.p(0.4),
        }
    }

    fn compare(&mut self) -> pb::Compare {
        let key = self.key();
        let range_end = if self.p(0.25) {
            self.request_end(&key)
        } else {
            Vec::new()
        };
        let target = self.rng.random_range(0..5);
        let target_union = match target {
            0 => compare::TargetUnion::Version(self.rng.random_range(0..3)),
            1 => compare::TargetUnion::CreateRevision(self.rng.random_range(0..30)),
            2 => compare::TargetUnion::ModRevision(self.rng.random_range(0..30)),
            3 => compare::TargetUnion::Value(self.pick(&VALUES).to_vec()),
            _ => compare::TargetUnion::Lease(self.lease()),
        };
        pb::Compare {
            result: self.rng.random_range(0..4),
            target,
            key,
            range_end,
            target_union: Some(target_union),
        }
    }

    fn txn(&mut self, depth: u32) -> pb::TxnRequest {
        let compare = (0..self.rng.random_range(0..3))
            .map(|_| self.compare())
            .collect();
        let ops = |g: &mut Gen| -> Vec<pb::RequestOp> {
            (0..g.rng.random_range(0..3))
                .map(|_| pb::RequestOp {
                    request: Some(match g.rng.random_range(0..10) {
                        0..3 => request_op::Request::RequestPut(g.put()),
                        3..6 => request_op::Request::RequestRange(g.range()),
                        6..8 => request_op::Request::RequestDeleteRange(g.delete()),
                        _ if depth < 2 => request_op::Request::RequestTxn(g.txn(depth + 1)),
                        _ => request_op::Request::RequestRange(g.range()),
                    }),
                })
                .collect()
        };
        pb::TxnRequest {
            compare,
            success: ops(self),
            failure: ops(self),
        }
    }

    fn permission(&mut self) -> Permission {
        let key = if self.p(0.02) { Vec::new() } else { self.key() };
        Permission {
            perm_type: if !self.avoid.unknown_perm_types && self.p(0.03) {
                self.pick(&[3, 7])
            } else {
                self.rng.random_range(0..3)
            },
            range_end: self.range_end(&key),
            key,
        }
    }

    /// A management step as root.
    fn management(&mut self, m: &Model) -> Step {
        let call = match self.rng.random_range(0..100) {
            0..35 => {
                let name = self.role();
                match m.roles.get(&name) {
                    // A full role loses one instead (see MAX_PERMS).
                    Some(perms) if perms.len() >= MAX_PERMS => {
                        let p = &perms[self.rng.random_range(0..perms.len())];
                        Call::RoleRevokePermission(pb::AuthRoleRevokePermissionRequest {
                            role: name,
                            key: p.key.clone(),
                            range_end: p.range_end.clone(),
                        })
                    }
                    perms => {
                        let mut perm = self.permission();
                        while self.avoid.duplicate_grants
                            && perms.is_some_and(|ps| duplicate_grant(ps, &perm))
                        {
                            perm = self.permission();
                        }
                        Call::RoleGrantPermission(pb::AuthRoleGrantPermissionRequest {
                            name,
                            perm: Some(perm),
                        })
                    }
                }
            }
            35..52 => {
                let role = self.role();
                let perms = m.roles.get(&role).cloned().unwrap_or_default();
                let (key, range_end) = if !perms.is_empty() && self.p(0.7) {
                    let p = &perms[self.rng.random_range(0..perms.len())];
                    (p.key.clone(), p.range_end.clone())
                } else {
                    let key = self.key();
                    let end = self.range_end(&key);
                    (key, end)
                };
                Call::RoleRevokePermission(pb::AuthRoleRevokePermissionRequest {
                    role,
                    key,
                    range_end,
                })
            }
            52..56 => Call::RoleAdd(self.role()),
            56..59 => Call::RoleDelete(self.role()),
            59..75 => {
                let role = if self.p(0.05) {
                    "root".into()
                } else {
                    self.role()
                };
                Call::UserGrantRole(pb::AuthUserGrantRoleRequest {
                    user: USERS[self.user()].into(),
                    role,
                })
            }
            75..85 => {
                let name = USERS[self.user()].to_string();
                let roles = m.users.get(&name).cloned().unwrap_or_default();
                let role = if !roles.is_empty() && self.p(0.7) {
                    roles[self.rng.random_range(0..roles.len())].clone()
                } else {
                    self.role()
                };
                Call::UserRevokeRole(pb::AuthUserRevokeRoleRequest { name, role })
            }
            85..88 => Call::UserDelete(USERS[self.user()].into()),
            88..89 => Call::UserAdd(USERS[self.user()].into()),
            89..90 => Call::ChangePassword(USERS[self.user()].into()),
            90..93 => Call::RoleGet(self.role()),
            93..96 => Call::UserGet(USERS[self.user()].into()),
            96..97 => Call::RoleList,
            97..98 => Call::UserList,
            _ => Call::AuthStatus,
        };
        root(call)
    }

    /// A step as root on keys and leases: a put (perhaps with a lease), a
    /// lease granted again.
    fn root_kv(&mut self) -> Step {
        if self.p(0.3) {
            root(Call::LeaseGrant(pb::LeaseGrantRequest {
                ttl: 3600,
                id: self.pick(&LEASES),
            }))
        } else {
            let mut p = self.put();
            p.lease = if self.p(0.5) { self.pick(&LEASES) } else { 0 };
            p.prev_kv = false;
            root(Call::Put(p))
        }
    }

    /// An access by user `u`.
    fn access(&mut self, u: usize) -> Call {
        match self.rng.random_range(0..100) {
            0..22 => Call::Range(self.range()),
            22..36 => Call::Put(self.put()),
            36..44 => Call::Delete(self.delete()),
            44..66 => Call::Txn(self.txn(0)),
            66..78 => {
                let key = if !self.avoid.empty_watch_keys && self.p(0.03) {
                    Vec::new()
                } else {
                    self.key()
                };
                Call::Watch(pb::WatchCreateRequest {
                    range_end: self.request_end(&key),
                    key,
                    ..Default::default()
                })
            }
            78..86 => Call::TimeToLive(pb::LeaseTimeToLiveRequest {
                id: self.lease(),
                keys: self.p(0.8),
            }),
            86..91 => Call::LeaseRevoke(pb::LeaseRevokeRequest { id: self.lease() }),
            91..96 => Call::RoleGet(self.role()),
            _ => Call::UserGet(if self.p(0.7) {
                USERS[u].into()
            } else {
                USERS[self.user()].into()
            }),
        }
    }

    fn next(&mut self, m: &Model) -> Step {
        let r = self.rng.random_range(0..100);
        if r < 30 {
            return self.management(m);
        }
        if r < 36 {
            return self.root_kv();
        }
        let u = self.user();
        let name = USERS[u];
        if !m.users.contains_key(name) && self.p(0.5) {
            return root(Call::UserAdd(name.into()));
        }
        let call = if !m.tokens.contains(name) || self.p(0.06) {
            Call::Authenticate(name.into())
        } else {
            self.access(u)
        };
        Step {
            caller: Caller::User(u),
            call,
        }
    }
}

/// What follows `step` (whatever its answer): the RoleGet/UserGet (as
/// root) of what it may have changed, which the model learns from.
fn follow_ups(step: &Step) -> Vec<Step> {
    let role = |r: &str| root(Call::RoleGet(r.into()));
    let user = |u: &str| root(Call::UserGet(u.into()));
    if step.caller != Caller::Root {
        return Vec::new();
    }
    match &step.call {
        Call::RoleAdd(r) => vec![role(r)],
        Call::RoleGrantPermission(g) => vec![role(&g.name)],
        Call::RoleRevokePermission(g) => vec![role(&g.role)],
        Call::RoleDelete(r) => std::iter::once(role(r))
            .chain(USERS.iter().map(|u| user(u)))
            .collect(),
        Call::UserGrantRole(g) => vec![user(&g.user)],
        Call::UserRevokeRole(g) => vec![user(&g.name)],
        Call::UserAdd(u) | Call::UserDelete(u) | Call::ChangePassword(u) => vec![user(u)],
        _ => Vec::new(),
    }
}

/// The steps every run starts with: users and roles, auth enabled, a few
/// permissions, leases and keys; the differences this test found in retcd
/// once, each a fixed reproduction (left out with its case in `avoid`);
/// every user's token.
fn prelude(avoid: Avoid) -> Vec<Step> {
    let mut s = Vec::new();
    for u in std::iter::once("root").chain(USERS) {
        s.push(root(Call::UserAdd(u.into())));
    }
    for r in std::iter::once("root").chain(ROLES) {
        s.push(root(Call::RoleAdd(r.into())));
    }
    let grant_role = |user: &str, role: &str| {
        root(Call::UserGrantRole(pb::AuthUserGrantRoleRequest {
            user: user.into(),
            role: role.into(),
        }))
    };
    s.push(grant_role("root", "root"));
    for (u, r) in [("u1", "r1"), ("u2", "r2"), ("u3", "r1"), ("u3", "r3")] {
        s.push(grant_role(u, r));
    }
    let perm = |role: &str, t: i32, key: &[u8], end: &[u8]| {
        root(Call::RoleGrantPermission(
            pb::AuthRoleGrantPermissionRequest {
                name: role.into(),
                perm: Some(Permission {
                    perm_type: t,
                    key: key.to_vec(),
                    range_end: end.to_vec(),
                }),
            },
        ))
    };
    s.push(perm("r1", READ, b"a/", b"a0"));
    s.push(perm("r1", WRITE, b"a/b", b""));
    s.push(perm("r2", READWRITE, b"a", b"b"));
    s.push(perm("r3", WRITE, b"b", b"\0"));
    for id in LEASES {
        s.push(root(Call::LeaseGrant(pb::LeaseGrantRequest {
            ttl: 3600,
            id,
        })));
    }
    for (k, lease) in [
        (&b"a/b"[..], LEASES[0]),
        (b"a/c", LEASES[1]),
        (b"b", LEASES[1]),
        (b"z", 0),
    ] {
        s.push(root(Call::Put(pb::PutRequest {
            key: k.to_vec(),
            value: b"v".to_vec(),
            lease,
            ..Default::default()
        })));
    }
    s.push(root(Call::AuthEnable));
    s.push(root(Call::Authenticate("root".into())));
    s.extend(regressions(avoid));
    for r in ROLES {
        s.push(root(Call::RoleGet(r.into())));
    }
    for (i, u) in USERS.iter().enumerate() {
        s.push(root(Call::UserGet((*u).into())));
        s.push(Step {
            caller: Caller::User(i),
            call: Call::Authenticate((*u).into()),
        });
    }
    s
}

/// The differences found in retcd, each reproduced by u4 (no roles yet)
/// with role r4 (no permissions yet), which are left as they were: r4
/// deleted and added again.
fn regressions(avoid: Avoid) -> Vec<Step> {
    let u4 = |call: Call| Step {
        caller: Caller::User(3),
        call,
    };
    let grant = |t: i32, key: &[u8], end: &[u8]| {
        root(Call::RoleGrantPermission(
            pb::AuthRoleGrantPermissionRequest {
                name: "r4".into(),
                perm: Some(Permission {
                    perm_type: t,
                    key: key.to_vec(),
                    range_end: end.to_vec(),
                }),
            },
        ))
    };
    let range = |key: &[u8], end: &[u8]| {
        Call::Range(pb::RangeRequest {
            key: key.to_vec(),
            range_end: end.to_vec(),
            ..Default::default()
        })
    };
    let watch = |key: &[u8], end: &[u8]| {
        Call::Watch(pb::WatchCreateRequest {
            key: key.to_vec(),
            range_end: end.to_vec(),
            ..Default::default()
        })
    };
    let mut s = vec![
        root(Call::UserGrantRole(pb::AuthUserGrantRoleRequest {
            user: "u4".into(),
            role: "r4".into(),
        })),
        u4(Call::Authenticate("u4".into())),
    ];
    if !avoid.empty_ranges {
        // Empty and reversed ranges need a permission too: etcd's
        // `Contains` wants a permission it visits (none here: denied).
        s.push(u4(range(b"b", b"a")));
        s.push(u4(range(b"a", b"a")));
        s.push(u4(Call::Delete(pb::DeleteRangeRequest {
            key: b"z".to_vec(),
            range_end: b"z".to_vec(),
            prev_kv: false,
        })));
        s.push(u4(watch(b"a", b"a")));
    }
    if !avoid.empty_watch_keys {
        // A watch on the empty key is one on `\0`, checked as such.
        s.push(grant(READ, b"\x00", b""));
        s.push(u4(watch(b"", b"")));
    }
    if !avoid.unknown_perm_types {
        // A permission type etcd does not know grants nothing.
        s.push(grant(7, b"ab", b""));
        s.push(u4(range(b"ab", b"")));
    }
    if !avoid.duplicate_grants {
        // etcd looks at the first permission of a key only: the third grant
        // appends (b, WRITE) instead of changing (b, READ), which stays.
        s.push(grant(WRITE, b"b", b"\0"));
        s.push(grant(READ, b"b", b""));
        s.push(grant(WRITE, b"b", b""));
        s.push(u4(range(b"b", b"")));
    }
    s.push(root(Call::RoleDelete("r4".into())));
    s.push(root(Call::RoleAdd("r4".into())));
    s
}

// ---------------------------------------------------------------------------
// The run.

/// What the target is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// etcd 3.5.1 too: every answer must equal the reference's.
    Etcd351,
    /// retcd: the newest etcd's answers where 3.5.1 is laxer.
    Retcd,
}

struct Run {
    mode: Mode,
    seed: u64,
    tname: &'static str,
    r: Server,
    t: Server,
    model: Model,
    diffs: usize,
    shown: Vec<String>,
    /// Differences by request kind and caller.
    kinds: BTreeMap<String, usize>,
    /// Where the model disagreed with etcd 3.5.1 (a bug of the test).
    model_errors: Vec<String>,
    /// The reference's errors, by message.
    errors: BTreeMap<String, usize>,
    /// Print every step and both answers.
    trace: bool,
    /// How often the target was held to an answer of the newest etcd that
    /// differs from 3.5.1's, by case.
    newer: BTreeMap<&'static str, usize>,
}

fn show_answer(a: &Answer) -> String {
    match a {
        Ok(r) => readable(&format!("{r:?}")),
        Err((code, msg)) => format!("error {code:?}: {msg:?}"),
    }
}

fn show_step(s: &Step) -> String {
    let who = match s.caller {
        Caller::Root => "root".to_string(),
        Caller::User(i) => USERS[i].to_string(),
        Caller::Bogus => "bogus token".to_string(),
    };
    format!("{who}: {}", readable(&format!("{:?}", s.call)))
}

impl Run {
    /// Each lease `step` names, with its keys (the reference's, as root).
    async fn leases(&mut self, step: &Step) -> Leases {
        let mut out = Leases::new();
        for id in lease_ids(&step.call) {
            let call = Call::TimeToLive(pb::LeaseTimeToLiveRequest { id, keys: true });
            if let Ok(Resp::TimeToLive(r)) = self.r.call(Caller::Root, &call).await {
                if r.ttl > 0 {
                    out.insert(id, r.keys);
                }
            }
        }
        out
    }

    /// Whether user `u`'s token is valid on the reference (a side-effect
    /// free Range with it).
    async fn token_valid(&mut self, u: usize) -> bool {
        let probe = Call::Range(pb::RangeRequest {
            key: vec![0],
            serializable: true,
            count_only: true,
            ..Default::default()
        });
        !is_bad_token(&self.r.call(Caller::User(u), &probe).await)
    }

    fn record(&mut self, n: usize, step: &Step, reference: &str, got: &Answer, want: &Answer) {
        if got == want {
            return;
        }
        self.diffs += 1;
        let who = match step.caller {
            Caller::Root => "root",
            _ => "user",
        };
        *self
            .kinds
            .entry(format!("{} as {who}", step.call.kind()))
            .or_insert(0) += 1;
        if self.shown.len() < MAX_SHOWN {
            self.shown.push(format!(
                "seed {} step {n}: {}\n  etcd 3.5.1: {reference}\n  {}: {}\n  expected:   {}",
                self.seed,
                show_step(step),
                self.tname,
                show_answer(got),
                show_answer(want),
            ));
        }
    }

    /// Runs `step` on both servers (or as the mode requires) and compares;
    /// returns the steps to run next.
    async fn step(&mut self, n: usize, step: &Step) -> Vec<Step> {
        let leases = self.leases(step).await;
        let mut next = Vec::new();
        let user = match step.caller {
            Caller::User(u) => Some(u),
            _ => None,
        };
        let v351 = self.model.verdict(step, Rules::V351, &leases);
        let vnew = self.model.verdict(step, Rules::Newest, &leases);
        let retcd = self.mode == Mode::Retcd;
        // A Txn 3.5.1 would run but the newest etcd refuses (unless the
        // token is invalid: then both refuse it before any check).
        let stricter_txn = retcd
            && matches!(step.call, Call::Txn(_))
            && v351 == Some(true)
            && vnew == Some(false)
            && self.token_valid(user.unwrap_or(0)).await;
        let (ra, ta, want, shown_ref) = match &step.call {
            // The newest etcd refuses an invalid permission range, 3.5.1
            // stores it: against retcd only the target gets it; against
            // etcd both, then its revoke.
            Call::RoleGrantPermission(g)
                if g.perm
                    .as_ref()
                    .is_some_and(|p| !valid_permission_range(&p.key, &p.range_end)) =>
            {
                let p = g.perm.clone().unwrap_or_default();
                if retcd {
                    let ta = self.t.call(step.caller, &step.call).await;
                    let want = Err((
                        Code::InvalidArgument,
                        "etcdserver: invalid auth management".to_string(),
                    ));
                    let shown = "(not sent: 3.5.1 stores an invalid range, the newest etcd \
                                 refuses it)"
                        .to_string();
                    (None, ta, want, shown)
                } else {
                    let (ra, ta) = self.both(step).await;
                    if ra.is_ok() {
                        next.push(root(Call::RoleRevokePermission(
                            pb::AuthRoleRevokePermissionRequest {
                                role: g.name.clone(),
                                key: p.key,
                                range_end: p.range_end,
                            },
                        )));
                    }
                    (Some(ra.clone()), ta, ra.clone(), show_answer(&ra))
                }
            }
            // Such a Txn goes to the target alone; the reference gets it
            // with a bogus token, which shows a refusal before the check.
            Call::Txn(_) if stricter_txn => {
                let probe = self.r.call(Caller::Bogus, &step.call).await;
                let want = if is_bad_token(&probe) {
                    denied()
                } else {
                    probe.clone()
                };
                let ta = self.t.call(step.caller, &step.call).await;
                let shown = format!(
                    "(not sent: 3.5.1 would run it, the newest etcd refuses it; with a bogus \
                     token: {})",
                    show_answer(&probe)
                );
                (None, ta, want, shown)
            }
            _ => {
                let (ra, ta) = self.both(step).await;
                let want = match (&step.call, user) {
                    (Call::Watch(_), Some(u)) if retcd => self.newest_watch(u, &ra, vnew).await,
                    (Call::TimeToLive(_), Some(u)) if retcd => self.newest_ttl(u, &ra, vnew).await,
                    _ => ra.clone(),
                };
                (Some(ra.clone()), ta, want, show_answer(&ra))
            }
        };
        if self.trace {
            eprintln!(
                "step {n}: {}\n  etcd 3.5.1: {shown_ref}\n  {}: {}",
                show_step(step),
                self.tname,
                show_answer(&ta)
            );
        }
        if ra.as_ref() != Some(&want) {
            *self.newer.entry(step.call.kind()).or_insert(0) += 1;
        }
        self.record(n, step, &shown_ref, &ta, &want);
        if let Some(ra) = &ra {
            if let Err((code, msg)) = ra {
                *self.errors.entry(format!("{code:?} {msg:?}")).or_insert(0) += 1;
            }
            self.check_model(n, step, ra, v351).await;
            self.model.learn(step, ra);
        }
        next.extend(follow_ups(step));
        next
    }

    async fn both(&mut self, step: &Step) -> (Answer, Answer) {
        tokio::join!(
            self.r.call(step.caller, &step.call),
            self.t.call(step.caller, &step.call)
        )
    }

    /// The newest etcd's answer to a watch creation, from 3.5.1's `ra`:
    /// every refusal with watch_id -1 and its own reason; a from-key watch
    /// refused unless the whole open range is readable.
    async fn newest_watch(&mut self, u: usize, ra: &Answer, vnew: Option<bool>) -> Answer {
        let Ok(Resp::Watch(w)) = ra else {
            return ra.clone();
        };
        let refused = |reason: String| {
            Ok(Resp::Watch(pb::WatchResponse {
                header: w.header,
                watch_id: -1,
                created: true,
                canceled: true,
                cancel_reason: reason,
                ..Default::default()
            }))
        };
        if w.canceled && w.cancel_reason == DENIED_351 {
            return if self.token_valid(u).await {
                refused(watch_reason(
                    "PermissionDenied",
                    "etcdserver: permission denied",
                ))
            } else {
                refused(watch_reason(
                    "Unauthenticated",
                    "etcdserver: invalid auth token",
                ))
            };
        }
        if vnew == Some(false) {
            return refused(watch_reason(
                "PermissionDenied",
                "etcdserver: permission denied",
            ));
        }
        ra.clone()
    }

    /// The newest etcd's answer to LeaseTimeToLive, from 3.5.1's `ra`: an
    /// invalid token refused; with keys, READ on each of them needed.
    async fn newest_ttl(&mut self, u: usize, ra: &Answer, vnew: Option<bool>) -> Answer {
        if ra.is_err() {
            return ra.clone();
        }
        if !self.token_valid(u).await {
            return bad_token();
        }
        if vnew == Some(false) {
            return denied();
        }
        ra.clone()
    }

    /// Where 3.5.1's answer shows its permission check's verdict, the
    /// model (3.5.1's rules) must agree.
    async fn check_model(&mut self, n: usize, step: &Step, ra: &Answer, v351: Option<bool>) {
        let (Some(model), Some(u)) = (
            v351,
            match step.caller {
                Caller::User(u) => Some(u),
                _ => None,
            },
        ) else {
            return;
        };
        let Some(etcd) = outcome(ra) else { return };
        // 3.5.1 refuses a watch with an invalid token as "permission denied".
        if !etcd && matches!(step.call, Call::Watch(_)) && !self.token_valid(u).await {
            return;
        }
        if etcd != model {
            self.model_errors.push(format!(
                "seed {} step {n}: {}\n  etcd 3.5.1: {}\n  model: permitted={model}\n  roles: {:?}",
                self.seed,
                show_step(step),
                show_answer(ra),
                readable(&format!(
                    "{:?} {:?}",
                    self.model.users.get(USERS[u]),
                    self.model.roles
                ))
            ));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authz_random_differential() {
    let seed = env_u64("RETCD_AUTHZ_DIFF_SEED", 1);
    let steps = env_u64("RETCD_AUTHZ_DIFF_STEPS", 400) as usize;
    let avoid = Avoid::from_env();
    // A long run gets more time than the default one.
    let limit = LIMIT.max(Duration::from_millis(steps as u64 * 150));
    bounded(limit, async {
        let flavor = test_flavor();
        let mode = match flavor {
            Flavor::Etcd => Mode::Etcd351,
            Flavor::Retcd => Mode::Retcd,
        };
        // The cheapest bcrypt (users authenticate often); no fsync.
        let mut flags = FAST.to_vec();
        flags.extend(["--bcrypt-cost", "4", "--unsafe-no-fsync"]);
        let (reference, target) = tokio::join!(
            Cluster::start_with_binary(Flavor::Etcd, etcd351_bin(), 1, &flags),
            async {
                match mode {
                    Mode::Etcd351 => {
                        Cluster::start_with_binary(Flavor::Etcd, etcd351_bin(), 1, &flags).await
                    }
                    Mode::Retcd => Cluster::start(Flavor::Retcd, 1, &flags).await,
                }
            }
        );
        let reference = reference.expect("start reference etcd 3.5.1");
        let target = target.expect("start target");
        let tname = match mode {
            Mode::Etcd351 => "etcd 3.5.1",
            Mode::Retcd => "retcd",
        };
        let mut run = Run {
            mode,
            seed,
            tname,
            r: Server::connect(&reference).await,
            t: Server::connect(&target).await,
            model: Model::default(),
            diffs: 0,
            shown: Vec::new(),
            kinds: BTreeMap::new(),
            model_errors: Vec::new(),
            errors: BTreeMap::new(),
            trace: env_u64("RETCD_AUTHZ_DIFF_TRACE", 0) == 1,
            newer: BTreeMap::new(),
        };
        let mut g = Gen {
            rng: StdRng::seed_from_u64(seed),
            avoid,
        };
        let started = Instant::now();
        let mut queue: VecDeque<Step> = prelude(avoid).into();
        let (mut generated, mut n) = (0, 0);
        loop {
            let step = match queue.pop_front() {
                Some(s) => s,
                None if generated < steps => {
                    generated += 1;
                    g.next(&run.model)
                }
                None => break,
            };
            let next = run.step(n, &step).await;
            for s in next.into_iter().rev() {
                queue.push_front(s);
            }
            n += 1;
        }
        let denied = run
            .errors
            .get(r#"PermissionDenied "etcdserver: permission denied""#);
        eprintln!(
            "authz_random_differential: etcd 3.5.1 vs {tname}, seed {seed}: {n} steps \
             ({generated} generated) in {:.1?}; etcd's errors: {:?}; {} permission denied; \
             the newest etcd's answer expected instead of 3.5.1's: {:?}; \
             {} differing steps {:?}; {} model errors",
            started.elapsed(),
            run.errors,
            denied.copied().unwrap_or(0),
            run.newer,
            run.diffs,
            run.kinds,
            run.model_errors.len(),
        );
        assert!(
            run.model_errors.is_empty(),
            "the test's model of etcd's permission check disagrees with etcd 3.5.1 {} times \
             (seed {seed}; a bug of the test); the first:\n\n{}",
            run.model_errors.len(),
            run.model_errors[..run.model_errors.len().min(MAX_SHOWN)].join("\n\n")
        );
        assert!(
            run.diffs == 0,
            "{} of {n} steps differ between etcd 3.5.1 and {tname} (seed {seed}; the first {} \
             below; once the servers' states differ, later steps may differ because of it):\n\n{}",
            run.diffs,
            run.shown.len(),
            run.shown.join("\n\n")
        );
        drop((reference, target));
    })
    .await;
}

#[test]
fn model_checks() {
    let perms = [span(b"a", b"c"), span(b"c", b"e")];
    assert!(covers(&perms, &span(b"b", b"d")));
    assert!(!covers(&perms, &span(b"b", b"f")));
    assert!(holds(&perms, b"d"));
    assert!(!holds(&perms, b"e"));
    assert!(!covers(
        &[span(b"a", b"b"), span(b"c", b"e")],
        &span(b"a", b"d")
    ));
    // `\0`: from the key on
    let open = [span(b"m", b"\0")];
    assert!(covers(&open, &span(b"x", b"\0")));
    assert!(!covers(&open, &span(b"a", b"z")));
    assert!(!covers(&[span(b"a", b"z")], &span(b"a", b"\0")));
    // a key alone
    assert!(covers(&[span(b"k", b"")], &span(b"k", b"")));
    assert!(!covers(&[span(b"k", b"")], &span(b"k", b"l")));
    assert!(valid_permission_range(b"a", b""));
    assert!(valid_permission_range(b"a", b"b"));
    assert!(valid_permission_range(b"\xff", b"\0"));
    assert!(!valid_permission_range(b"b", b"a"));
    assert!(!valid_permission_range(b"a", b"a"));
    assert!(!valid_permission_range(b"", b"a"));
    assert_eq!(
        readable("K { key: [97, 47, 98], v: [] }"),
        r#"K { key: "a/b", v: [] }"#
    );
}
