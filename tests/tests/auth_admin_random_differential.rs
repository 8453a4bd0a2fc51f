//! A seeded random differential test of the *auth management API* and the
//! auth life cycle: the same sequence of requests goes to a fresh 1-member
//! etcd 3.5.1 (the reference) and a fresh 1-member target (retcd by
//! default; `RETCD_TEST_FLAVOR=etcd` makes it a second etcd 3.5.1, which
//! checks the test itself), both empty, auth disabled, started with the
//! same flags (`--bcrypt-cost 4`, simple tokens).
//!
//! The requests: AuthEnable (without a root user, with root lacking the
//! root role, twice), AuthDisable (as root, as a user, with a stale or a
//! bogus token, without one, while disabled), AuthStatus (its
//! `auth_revision` compared exactly), Authenticate (right and wrong
//! passwords, unknown and empty names, a `no_password` user, an empty
//! password), UserAdd (empty name, duplicate, `options.no_password`, an
//! explicit `no_password: false`, `hashedPassword`, a password over 72
//! bytes), UserDelete (root while enabled, unknown, oneself),
//! UserGet/UserList, UserChangePassword (of root, oneself, another user, a
//! `no_password` user, with `hashedPassword` alone, a bad one, an empty
//! password), UserGrantRole/UserRevokeRole (the root role, unknown
//! roles/users, duplicates, a role not granted), RoleAdd (empty,
//! duplicate, `root`), RoleDelete (root while enabled, a granted role: the
//! users lose it), RoleGet/RoleList, RoleGrantPermission/
//! RoleRevokePermission (valid ranges with distinct keys only:
//! `authz_random_differential` covers range semantics), and a Put/Range
//! now and then (moves the header revision; a token's fate shows on them
//! too). Each is sent by a random caller: the latest token of root or of a
//! user, any token issued before (invalidated by a delete, a password
//! change or AuthDisable — the next call with it shows what it became),
//! none, a well-formed token never issued, a malformed one; in the `token`
//! or the `authorization` metadata, now and then with a `Bearer ` prefix.
//! Every management change is followed by AuthStatus and the UserGet or
//! RoleGet of what it touched, as root. The run starts with a fixed
//! [`prelude`] that walks every case above once (and holds the
//! reproduction of each difference found), then the seeded steps, which
//! keep the life cycle going (root re-added, re-granted the root role,
//! re-authenticated; auth enabled again).
//!
//! Every answer is compared whole: the same gRPC code and message, or
//! equal responses after [`normalise`], which clears only what differs
//! between two etcd processes by nature: the header's cluster ID, member
//! ID and raft term, and an issued token's text (random). Tokens are
//! referred to by the order the reference issued them: each server uses
//! its own token of that issue (a token the target did not issue is sent
//! as `unissued.1`). Header revisions and auth revisions are compared
//! exactly: both servers get the same writes.
//!
//! ## Newer etcd
//!
//! retcd aims at the newest etcd (3.5.33 / 3.6), which answers some of
//! these requests unlike 3.5.1. Against retcd (not etcd vs etcd) the test
//! holds the target to the newest answer, computed from the reference's
//! (the summary line counts each case):
//!
//! * A token sent while auth is disabled is ignored (`AuthInfoFromCtx`
//!   returns no user when auth is disabled: 3.5.10+ and 3.6.0, etcd#13577
//!   backported as "Disable auth gracefully without impacting existing
//!   watchers"); 3.5.1 refuses every token then ("invalid auth token": all
//!   tokens are dropped on AuthDisable, and it looks the token up anyway).
//!   Such a step goes to the reference without the token.
//! * A `Bearer ` prefix is dropped from the token, in either key (3.5.32+
//!   and 3.6.14, "server/auth: accept bearer-prefixed auth tokens"); 3.5.1
//!   knows no such token. Such a step goes to the reference with the bare
//!   token.
//! * A password over 72 bytes is refused by bcrypt before anything else
//!   (Unknown "bcrypt: password length exceeds 72 bytes": 3.5.33 and 3.6
//!   build with a golang.org/x/crypto whose `GenerateFromPassword` checks
//!   the length; 3.5.1's, from 2020, hashes the first 72 bytes): UserAdd
//!   unless `no_password`, UserChangePassword unless the password is empty
//!   (`v3_server.go` hashes before it proposes). Such a step goes to the
//!   target alone. Authenticate still reads only the first 72 bytes
//!   (`CompareHashAndPassword` checks no length).
//!
//! Not held to 3.6 where the newest 3.5 (3.5.33) answers as 3.5.1: RoleGet
//! of the `root` role answers the stored permissions (3.6 answers the
//! root permission, READWRITE "" to "\0", whatever the role holds:
//! `rootPerm`, etcd#13006); retcd keeps 3.5's answer, which etcdctl 3.5
//! prints as it always did.
//!
//! ## Differences found in retcd (thirty-seventh session, all fixed)
//!
//! Each is in [`prelude`]; `RETCD_AUTH_DIFF_AVOID` (a comma-separated
//! list) leaves a case out everywhere, to look past it should one come
//! back (a difference changes the servers' states, so later steps differ
//! too):
//!
//! * `disabled-tokens`: retcd refused a token while auth was disabled (as
//!   3.5.1 and 3.4 do; the newest etcd ignores it). Left out: no token is
//!   sent while auth is disabled.
//! * `root-perm`: no RoleGet of `root` (see above: not a difference now).
//! * `empty-user-get`: UserGet of the empty name without a token while
//!   auth is enabled was "user name is empty" in retcd; etcd (every
//!   version: `authApplierV3.UserGet` lets the request through when the
//!   name is the caller's, `""` here) answers "user name not found".
//!   Left out: no UserGet of `""`.
//! * `empty-password-change`: UserChangePassword with an empty password.
//!   etcd uses `hashedPassword` then (a bcrypt hash in base64): a valid
//!   one sets that hash, a bad one is refused (Unknown "auth:
//!   authentication failed, password was given for no password user"),
//!   none sets an empty hash, which no password matches. retcd hashed the
//!   empty password in all three cases. Left out: no UserChangePassword
//!   with an empty password.
//!
//! Not generated: permission ranges that are invalid (3.5.8+ refuses
//! them) or share a key (etcd's update-or-append by key and its unstable
//! sort: `authz_random_differential`), a token naming a raft index not
//! applied yet (etcd waits for it), JWT tokens, restarts.
//!
//! `RETCD_AUTH_DIFF_SEED` (default 1) and `RETCD_AUTH_DIFF_STEPS` (default
//! 300) replay and size a run; `RETCD_AUTH_DIFF_TRACE=1` prints every step
//! and both answers.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use retcd_api::authpb::{Permission, UserAddOptions};
use retcd_api::etcdserverpb as pb;
use retcd_tests::random_diff::{answer, bytes_as_strings as readable, env_u64, Dice};
use retcd_tests::{
    bounded, etcd351_bin, limit::NORMAL as LIMIT, test_flavor, Cluster, Flavor, FAST,
};

use pb::auth_client::AuthClient;
use pb::kv_client::KvClient;
use pb::ResponseHeader;
use tokio::time::timeout;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{Code, Request};

/// Each call's bound.
const CALL: Duration = Duration::from_secs(10);
/// Differing steps printed at most (the count is always given).
const MAX_SHOWN: usize = 20;

/// The users: names whose byte order differs from their look.
const USERS: [&str; 4] = ["root", "u1", "U2", "\u{fc}"];
/// A user never added.
const NO_USER: &str = "nobody";
/// The roles.
const ROLES: [&str; 4] = ["root", "r1", "R2", "r\u{e9}"];
/// A role never added.
const NO_ROLE: &str = "r9";
/// Passwords, few so that a guess is often right.
const PASSWORDS: [&str; 3] = ["pw-a", "pw-b", ""];
/// A password bcrypt refuses in the newest etcd (over 72 bytes).
const LONG_PASSWORD: &str =
    "long-password-long-password-long-password-long-password-long-password-073";
/// [`LONG_PASSWORD`]'s first 72 bytes: bcrypt reads no more, so
/// [`LONG_PASSWORD`] authenticates a user with this one.
const PASSWORD_72: &str =
    "long-password-long-password-long-password-long-password-long-password-07";
/// The password of [`HASHED`].
const HASHED_PASSWORD: &str = "pw-hashed";
/// `hashedPassword`: base64 of the bcrypt hash (cost 4) of
/// [`HASHED_PASSWORD`], `$2b$04$cSovFSdPbcyNdCsmdvay6uWlY4y2SXXYeeazKsBPlIViuFX208TyG`.
const HASHED: &str =
    "JDJiJDA0JGNTb3ZGU2RQYmN5TmRDc21kdmF5NnVXbFk0eTJTWFhZZWVhektzQlBsSVZpdUZYMjA4VHlH";
/// A `hashedPassword` that is no base64.
const BAD_HASHED: &str = "not base64!";
/// The permission ranges (key, range end), each with a key of its own.
const PERMS: [(&[u8], &[u8]); 5] = [
    (b"k", b""),
    (b"a", b"b"),
    (b"c", b"\0"),
    (b"d/", b"d0"),
    (b"\xff", b""),
];
/// A well-formed simple token no server issued (`<text>.<index>`, an index
/// already applied: a higher one would make etcd wait for it).
const BOGUS_TOKEN: &str = "bogus.1";
/// A token of no simple token's form.
const GARBAGE_TOKEN: &str = "garbage";
/// What the target gets for a token the reference issued and it did not.
const UNISSUED_TOKEN: &str = "unissued.1";
/// bcrypt's refusal of a long password (Go's x/crypto, etcd maps it to
/// Unknown).
const TOO_LONG: &str = "bcrypt: password length exceeds 72 bytes";

const READ: i32 = 0;
const WRITE: i32 = 1;
const READWRITE: i32 = 2;

// ---------------------------------------------------------------------------
// Requests.

/// etcd 3.5.1's `AuthUserAddRequest`: retcd's copy of the proto has no
/// `hashedPassword` (field 4).
#[derive(Clone, PartialEq, prost::Message)]
struct UserAddRequest {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    password: String,
    #[prost(message, optional, tag = "3")]
    options: Option<UserAddOptions>,
    #[prost(string, tag = "4")]
    hashed_password: String,
}

/// etcd 3.5.1's `AuthUserChangePasswordRequest`, with `hashedPassword`
/// (field 3).
#[derive(Clone, PartialEq, prost::Message)]
struct ChangePasswordRequest {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    password: String,
    #[prost(string, tag = "3")]
    hashed_password: String,
}

#[derive(Debug, Clone)]
enum Call {
    AuthEnable,
    AuthDisable,
    AuthStatus,
    Authenticate(pb::AuthenticateRequest),
    UserAdd(UserAddRequest),
    UserDelete(String),
    UserGet(String),
    UserList,
    ChangePassword(ChangePasswordRequest),
    UserGrantRole(pb::AuthUserGrantRoleRequest),
    UserRevokeRole(pb::AuthUserRevokeRoleRequest),
    RoleAdd(String),
    RoleDelete(String),
    RoleGet(String),
    RoleList,
    RoleGrantPermission(pb::AuthRoleGrantPermissionRequest),
    RoleRevokePermission(pb::AuthRoleRevokePermissionRequest),
    Put(pb::PutRequest),
    Range(pb::RangeRequest),
}

impl Call {
    /// The request's kind, for the summaries.
    fn kind(&self) -> &'static str {
        match self {
            Call::AuthEnable => "AuthEnable",
            Call::AuthDisable => "AuthDisable",
            Call::AuthStatus => "AuthStatus",
            Call::Authenticate(_) => "Authenticate",
            Call::UserAdd(_) => "UserAdd",
            Call::UserDelete(_) => "UserDelete",
            Call::UserGet(_) => "UserGet",
            Call::UserList => "UserList",
            Call::ChangePassword(_) => "UserChangePassword",
            Call::UserGrantRole(_) => "UserGrantRole",
            Call::UserRevokeRole(_) => "UserRevokeRole",
            Call::RoleAdd(_) => "RoleAdd",
            Call::RoleDelete(_) => "RoleDelete",
            Call::RoleGet(_) => "RoleGet",
            Call::RoleList => "RoleList",
            Call::RoleGrantPermission(_) => "RoleGrantPermission",
            Call::RoleRevokePermission(_) => "RoleRevokePermission",
            Call::Put(_) => "Put",
            Call::Range(_) => "Range",
        }
    }

    /// Whether the newest etcd refuses it for bcrypt's sake (a password
    /// over 72 bytes it would hash).
    fn hashes_long_password(&self) -> bool {
        match self {
            Call::UserAdd(r) => {
                !r.options.as_ref().is_some_and(|o| o.no_password) && r.password.len() > 72
            }
            Call::ChangePassword(r) => r.password.len() > 72,
            _ => false,
        }
    }

    /// Whether it may change the auth store (then AuthStatus and a Get
    /// follow).
    fn changes_auth(&self) -> bool {
        !matches!(
            self,
            Call::AuthStatus
                | Call::Authenticate(_)
                | Call::UserGet(_)
                | Call::UserList
                | Call::RoleGet(_)
                | Call::RoleList
                | Call::Put(_)
                | Call::Range(_)
        )
    }
}

/// Who a caller is, as the generator names it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Who {
    /// No token.
    Nobody,
    /// The latest token the reference issued to the user (none yet: no
    /// token).
    Latest(String),
    /// The first token the reference issued to the user (none yet: no
    /// token).
    First(String),
    /// The token the reference issued `i`-th.
    Issued(usize),
    /// [`BOGUS_TOKEN`].
    Bogus,
    /// [`GARBAGE_TOKEN`].
    Garbage,
}

/// Where the token goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// `token: <t>` (etcd's gRPC key).
    Token,
    /// `authorization: <t>` (etcd's gateway key, read by the gRPC server
    /// too).
    Authorization,
    /// `token: Bearer <t>`.
    BearerToken,
    /// `authorization: Bearer <t>`.
    BearerAuthorization,
}

impl Form {
    fn bearer(self) -> bool {
        matches!(self, Form::BearerToken | Form::BearerAuthorization)
    }

    /// The same key without `Bearer `.
    fn bare(self) -> Form {
        match self {
            Form::BearerToken => Form::Token,
            Form::BearerAuthorization => Form::Authorization,
            f => f,
        }
    }
}

#[derive(Debug, Clone)]
struct Caller {
    who: Who,
    form: Form,
}

#[derive(Debug, Clone)]
struct Step {
    caller: Caller,
    call: Call,
}

fn step(who: Who, call: Call) -> Step {
    Step {
        caller: Caller {
            who,
            form: Form::Token,
        },
        call,
    }
}

/// A caller resolved to a token: none, the reference's `i`-th issue, or a
/// fixed text.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    None,
    Issued(usize),
    Literal(&'static str),
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq)]
enum Resp {
    /// An answer that is a header alone (AuthEnable, AuthDisable, every
    /// change of a user or a role).
    Done(Option<ResponseHeader>),
    AuthStatus(pb::AuthStatusResponse),
    Authenticate(pb::AuthenticateResponse),
    UserGet(pb::AuthUserGetResponse),
    UserList(pb::AuthUserListResponse),
    RoleGet(pb::AuthRoleGetResponse),
    RoleList(pb::AuthRoleListResponse),
    Put(pb::PutResponse),
    Range(pb::RangeResponse),
}

/// An answer: the response, or the gRPC code and message.
type Answer = Result<Resp, (Code, String)>;

/// The only normalisation: every header loses its cluster ID, member ID
/// and raft term; an issued token becomes `<token>` (random).
fn normalise(a: &mut Answer) {
    fn header(h: &mut Option<ResponseHeader>) {
        if let Some(h) = h {
            h.cluster_id = 0;
            h.member_id = 0;
            h.raft_term = 0;
        }
    }
    let Ok(r) = a else { return };
    match r {
        Resp::Done(h) => header(h),
        Resp::AuthStatus(r) => header(&mut r.header),
        Resp::Authenticate(r) => {
            header(&mut r.header);
            if !r.token.is_empty() {
                r.token = "<token>".into();
            }
        }
        Resp::UserGet(r) => header(&mut r.header),
        Resp::UserList(r) => header(&mut r.header),
        Resp::RoleGet(r) => header(&mut r.header),
        Resp::RoleList(r) => header(&mut r.header),
        Resp::Put(r) => header(&mut r.header),
        Resp::Range(r) => header(&mut r.header),
    }
}

// ---------------------------------------------------------------------------
// The servers.

/// `m` with `token` in the metadata `form` names.
fn with_token<T>(m: T, token: Option<&str>, form: Form) -> Request<T> {
    let mut r = Request::new(m);
    if let Some(t) = token {
        let (key, value) = match form {
            Form::Token => ("token", t.to_string()),
            Form::Authorization => ("authorization", t.to_string()),
            Form::BearerToken => ("token", format!("Bearer {t}")),
            Form::BearerAuthorization => ("authorization", format!("Bearer {t}")),
        };
        r.metadata_mut()
            .insert(key, value.parse().expect("a token is ASCII"));
    }
    r
}

/// A unary call of `path` with messages of the test's own (etcd 3.5.1's
/// fields, which retcd's proto lacks).
async fn raw_unary<Q, A>(
    chan: &Channel,
    path: &'static str,
    req: Request<Q>,
) -> Result<tonic::Response<A>, tonic::Status>
where
    Q: prost::Message + Send + Sync + 'static,
    A: prost::Message + Default + Send + Sync + 'static,
{
    let mut g = tonic::client::Grpc::new(chan.clone());
    g.ready()
        .await
        .map_err(|e| tonic::Status::unknown(format!("(test: channel not ready: {e})")))?;
    g.unary(
        req,
        PathAndQuery::from_static(path),
        tonic_prost::ProstCodec::<Q, A>::default(),
    )
    .await
}

/// One server: its channel and its tokens, by the reference's issue
/// order (`None`: this server did not issue that one).
struct Server {
    chan: Channel,
    tokens: Vec<Option<String>>,
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
            tokens: Vec::new(),
        }
    }

    fn token(&self, t: &Tok) -> Option<String> {
        match t {
            Tok::None => None,
            Tok::Issued(i) => Some(
                self.tokens
                    .get(*i)
                    .cloned()
                    .flatten()
                    .unwrap_or_else(|| UNISSUED_TOKEN.into()),
            ),
            Tok::Literal(s) => Some(s.to_string()),
        }
    }

    /// Sends `call` with token `tok` in `form`; the normalised answer and,
    /// for a successful Authenticate, the token issued.
    async fn call(&self, tok: &Tok, form: Form, call: &Call) -> (Answer, Option<String>) {
        let token = self.token(tok);
        // A closure cannot take every message type: a macro.
        macro_rules! req {
            ($m:expr) => {
                with_token($m, token.as_deref(), form)
            };
        }
        let mut auth = AuthClient::new(self.chan.clone());
        let mut kv = KvClient::new(self.chan.clone());
        let mut a = match call.clone() {
            Call::AuthEnable => answer(
                timeout(CALL, auth.auth_enable(req!(pb::AuthEnableRequest {}))).await,
                |r| Resp::Done(r.header),
            ),
            Call::AuthDisable => answer(
                timeout(CALL, auth.auth_disable(req!(pb::AuthDisableRequest {}))).await,
                |r| Resp::Done(r.header),
            ),
            Call::AuthStatus => answer(
                timeout(CALL, auth.auth_status(req!(pb::AuthStatusRequest {}))).await,
                Resp::AuthStatus,
            ),
            Call::Authenticate(r) => answer(
                timeout(CALL, auth.authenticate(req!(r))).await,
                Resp::Authenticate,
            ),
            Call::UserAdd(r) => answer(
                timeout(
                    CALL,
                    raw_unary::<_, pb::AuthUserAddResponse>(
                        &self.chan,
                        "/etcdserverpb.Auth/UserAdd",
                        req!(r),
                    ),
                )
                .await,
                |r| Resp::Done(r.header),
            ),
            Call::UserDelete(name) => answer(
                timeout(
                    CALL,
                    auth.user_delete(req!(pb::AuthUserDeleteRequest { name })),
                )
                .await,
                |r| Resp::Done(r.header),
            ),
            Call::UserGet(name) => answer(
                timeout(CALL, auth.user_get(req!(pb::AuthUserGetRequest { name }))).await,
                Resp::UserGet,
            ),
            Call::UserList => answer(
                timeout(CALL, auth.user_list(req!(pb::AuthUserListRequest {}))).await,
                Resp::UserList,
            ),
            Call::ChangePassword(r) => answer(
                timeout(
                    CALL,
                    raw_unary::<_, pb::AuthUserChangePasswordResponse>(
                        &self.chan,
                        "/etcdserverpb.Auth/UserChangePassword",
                        req!(r),
                    ),
                )
                .await,
                |r| Resp::Done(r.header),
            ),
            Call::UserGrantRole(r) => {
                answer(timeout(CALL, auth.user_grant_role(req!(r))).await, |r| {
                    Resp::Done(r.header)
                })
            }
            Call::UserRevokeRole(r) => {
                answer(timeout(CALL, auth.user_revoke_role(req!(r))).await, |r| {
                    Resp::Done(r.header)
                })
            }
            Call::RoleAdd(name) => answer(
                timeout(CALL, auth.role_add(req!(pb::AuthRoleAddRequest { name }))).await,
                |r| Resp::Done(r.header),
            ),
            Call::RoleDelete(role) => answer(
                timeout(
                    CALL,
                    auth.role_delete(req!(pb::AuthRoleDeleteRequest { role })),
                )
                .await,
                |r| Resp::Done(r.header),
            ),
            Call::RoleGet(role) => answer(
                timeout(CALL, auth.role_get(req!(pb::AuthRoleGetRequest { role }))).await,
                Resp::RoleGet,
            ),
            Call::RoleList => answer(
                timeout(CALL, auth.role_list(req!(pb::AuthRoleListRequest {}))).await,
                Resp::RoleList,
            ),
            Call::RoleGrantPermission(r) => answer(
                timeout(CALL, auth.role_grant_permission(req!(r))).await,
                |r| Resp::Done(r.header),
            ),
            Call::RoleRevokePermission(r) => answer(
                timeout(CALL, auth.role_revoke_permission(req!(r))).await,
                |r| Resp::Done(r.header),
            ),
            Call::Put(r) => answer(timeout(CALL, kv.put(req!(r))).await, Resp::Put),
            Call::Range(r) => answer(timeout(CALL, kv.range(req!(r))).await, Resp::Range),
        };
        let issued = match &a {
            Ok(Resp::Authenticate(r)) => Some(r.token.clone()),
            _ => None,
        };
        normalise(&mut a);
        (a, issued)
    }
}

// ---------------------------------------------------------------------------
// What the test knows of the reference's auth store (from its answers).

#[derive(Debug, Clone, Default)]
struct User {
    roles: BTreeSet<String>,
    /// The password last set (a guess the generator favours).
    password: String,
}

/// The reference's auth state as etcd's rules derive it from the
/// successful requests. `enabled` is exact (the newest etcd's answers
/// depend on it); the rest only steers the generator.
#[derive(Default)]
struct Model {
    enabled: bool,
    users: BTreeMap<String, User>,
    /// Roles with their permission ranges.
    roles: BTreeMap<String, BTreeSet<(Vec<u8>, Vec<u8>)>>,
    /// Every token the reference issued, in order: its user and whether
    /// etcd's rules keep it valid.
    tokens: Vec<(String, bool)>,
}

impl Model {
    fn latest(&self, user: &str) -> Option<usize> {
        self.tokens.iter().rposition(|(u, _)| u == user)
    }

    fn first(&self, user: &str) -> Option<usize> {
        self.tokens.iter().position(|(u, _)| u == user)
    }

    fn resolve(&self, who: &Who) -> Tok {
        match who {
            Who::Nobody => Tok::None,
            Who::Latest(u) => self.latest(u).map_or(Tok::None, Tok::Issued),
            Who::First(u) => self.first(u).map_or(Tok::None, Tok::Issued),
            Who::Issued(i) => Tok::Issued(*i),
            Who::Bogus => Tok::Literal(BOGUS_TOKEN),
            Who::Garbage => Tok::Literal(GARBAGE_TOKEN),
        }
    }

    /// Whether root's latest token is still valid.
    fn root_token_valid(&self) -> bool {
        self.latest("root").is_some_and(|i| self.tokens[i].1)
    }

    fn invalidate(&mut self, user: &str) {
        for t in self.tokens.iter_mut().filter(|t| t.0 == user) {
            t.1 = false;
        }
    }

    /// Learns from the reference's answer `a` to `call`.
    fn learn(&mut self, call: &Call, a: &Answer) {
        let Ok(r) = a else { return };
        match (call, r) {
            (Call::AuthEnable, _) => self.enabled = true,
            (Call::AuthDisable, _) => {
                self.enabled = false;
                self.tokens.iter_mut().for_each(|t| t.1 = false);
            }
            (Call::AuthStatus, Resp::AuthStatus(s)) => self.enabled = s.enabled,
            (Call::Authenticate(r), _) => self.tokens.push((r.name.clone(), true)),
            (Call::UserAdd(r), _) => {
                self.users.insert(
                    r.name.clone(),
                    User {
                        roles: BTreeSet::new(),
                        password: r.password.clone(),
                    },
                );
            }
            (Call::UserDelete(name), _) => {
                self.users.remove(name);
                self.invalidate(name);
            }
            (Call::ChangePassword(r), _) => {
                if let Some(u) = self.users.get_mut(&r.name) {
                    u.password = if !r.password.is_empty() {
                        r.password.clone()
                    } else if r.hashed_password == HASHED {
                        HASHED_PASSWORD.into()
                    } else {
                        "(none)".into()
                    };
                }
                self.invalidate(&r.name);
            }
            (Call::UserGrantRole(r), _) => {
                if let Some(u) = self.users.get_mut(&r.user) {
                    u.roles.insert(r.role.clone());
                }
            }
            (Call::UserRevokeRole(r), _) => {
                if let Some(u) = self.users.get_mut(&r.name) {
                    u.roles.remove(&r.role);
                }
            }
            (Call::RoleAdd(name), _) => {
                self.roles.insert(name.clone(), BTreeSet::new());
            }
            (Call::RoleDelete(name), _) => {
                self.roles.remove(name);
                for u in self.users.values_mut() {
                    u.roles.remove(name);
                }
            }
            (Call::RoleGrantPermission(r), _) => {
                if let (Some(perms), Some(p)) = (self.roles.get_mut(&r.name), &r.perm) {
                    perms.insert((p.key.clone(), p.range_end.clone()));
                }
            }
            (Call::RoleRevokePermission(r), _) => {
                if let Some(perms) = self.roles.get_mut(&r.role) {
                    perms.remove(&(r.key.clone(), r.range_end.clone()));
                }
            }
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------
// The generator.

struct Gen {
    rng: StdRng,
}

impl Dice for Gen {
    fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }
}

impl Gen {
    fn user(&mut self) -> String {
        match self.rng.random_range(0..100) {
            0..4 => String::new(),
            4..8 => NO_USER.into(),
            _ => self.pick(&USERS).into(),
        }
    }

    /// A name to add: never [`NO_USER`] / [`NO_ROLE`], which stay unknown.
    fn new_name(&mut self, names: &[&str]) -> String {
        if self.p(0.05) {
            String::new()
        } else {
            self.pick(names).into()
        }
    }

    fn role(&mut self) -> String {
        match self.rng.random_range(0..100) {
            0..4 => String::new(),
            4..8 => NO_ROLE.into(),
            _ => self.pick(&ROLES).into(),
        }
    }

    /// A password for `user`: mostly the one last set.
    fn password(&mut self, m: &Model, user: &str) -> String {
        match self.rng.random_range(0..100) {
            0..60 if m.users.contains_key(user) => m.users[user].password.clone(),
            0..3 => LONG_PASSWORD.into(),
            3..6 => PASSWORD_72.into(),
            _ => self.pick(&PASSWORDS).into(),
        }
    }

    fn perm(&mut self) -> (Vec<u8>, Vec<u8>) {
        let (k, e) = self.pick(&PERMS);
        (k.to_vec(), e.to_vec())
    }

    /// A random caller: mostly root's latest token while auth is enabled,
    /// mostly none while it is disabled.
    fn caller(&mut self, m: &Model) -> Caller {
        let any = |g: &mut Gen| {
            if m.tokens.is_empty() {
                Who::Nobody
            } else {
                Who::Issued(g.rng.random_range(0..m.tokens.len()))
            }
        };
        let who = if m.enabled {
            match self.rng.random_range(0..100) {
                0..55 => Who::Latest("root".into()),
                55..72 => Who::Latest(self.pick(&USERS).into()),
                72..84 => any(self),
                84..92 => Who::Nobody,
                92..97 => Who::Bogus,
                _ => Who::Garbage,
            }
        } else {
            match self.rng.random_range(0..100) {
                0..65 => Who::Nobody,
                65..90 => any(self),
                90..95 => Who::Latest("root".into()),
                _ => Who::Bogus,
            }
        };
        let form = match self.rng.random_range(0..100) {
            0..85 => Form::Token,
            85..92 => Form::Authorization,
            92..96 => Form::BearerToken,
            _ => Form::BearerAuthorization,
        };
        Caller { who, form }
    }

    fn authenticate(&mut self, m: &Model, name: String) -> Call {
        let password = self.password(m, &name);
        Call::Authenticate(pb::AuthenticateRequest { name, password })
    }

    fn user_add(&mut self, m: &Model, name: String) -> Call {
        let options = match self.rng.random_range(0..10) {
            0..6 => None,
            6..8 => Some(UserAddOptions { no_password: false }),
            _ => Some(UserAddOptions { no_password: true }),
        };
        Call::UserAdd(UserAddRequest {
            password: self.password(m, &name),
            name,
            options,
            hashed_password: if self.p(0.1) {
                HASHED.into()
            } else {
                String::new()
            },
        })
    }

    fn change_password(&mut self, m: &Model) -> Call {
        let name = self.user();
        let (password, hashed_password) = match self.rng.random_range(0..100) {
            0..70 => (self.password(m, &name), String::new()),
            70..85 => (String::new(), HASHED.into()),
            85..90 => (String::new(), BAD_HASHED.into()),
            // a password and a hash: the password wins
            90..95 => ("pw-a".into(), HASHED.into()),
            _ => (String::new(), String::new()),
        };
        Call::ChangePassword(ChangePasswordRequest {
            name,
            password,
            hashed_password,
        })
    }

    /// Steps that keep the life cycle going, when due: root added again,
    /// given the root role again, authenticated again; auth enabled.
    fn life_cycle(&mut self, m: &Model) -> Option<Call> {
        let root = m.users.get("root");
        if !m.enabled {
            if root.is_none() && self.p(0.25) {
                return Some(self.user_add(m, "root".into()));
            }
            if root.is_some_and(|u| !u.roles.contains("root")) && self.p(0.25) {
                return Some(Call::UserGrantRole(pb::AuthUserGrantRoleRequest {
                    user: "root".into(),
                    role: "root".into(),
                }));
            }
            if self.p(0.1) {
                return Some(Call::AuthEnable);
            }
        } else if !m.root_token_valid() && self.p(0.6) {
            return Some(self.authenticate(m, "root".into()));
        }
        None
    }

    fn next(&mut self, m: &Model) -> Step {
        let caller = self.caller(m);
        if let Some(call) = self.life_cycle(m) {
            return Step { caller, call };
        }
        let call = match self.rng.random_range(0..100) {
            0..10 => {
                let name = if self.p(0.3) {
                    "root".into()
                } else {
                    self.user()
                };
                self.authenticate(m, name)
            }
            10..14 => Call::AuthStatus,
            14..16 => Call::AuthEnable,
            16..18 => Call::AuthDisable,
            18..26 => {
                let name = self.new_name(&USERS);
                self.user_add(m, name)
            }
            26..30 => Call::UserDelete(self.user()),
            30..35 => Call::UserGet(self.user()),
            35..37 => Call::UserList,
            37..42 => self.change_password(m),
            42..51 => Call::UserGrantRole(pb::AuthUserGrantRoleRequest {
                user: self.user(),
                role: self.role(),
            }),
            51..57 => {
                let name = self.user();
                let granted: Vec<String> = m
                    .users
                    .get(&name)
                    .map(|u| u.roles.iter().cloned().collect())
                    .unwrap_or_default();
                let role = if !granted.is_empty() && self.p(0.7) {
                    granted[self.rng.random_range(0..granted.len())].clone()
                } else {
                    self.role()
                };
                Call::UserRevokeRole(pb::AuthUserRevokeRoleRequest { name, role })
            }
            57..62 => Call::RoleAdd(self.new_name(&ROLES)),
            62..65 => Call::RoleDelete(self.role()),
            65..70 => Call::RoleGet(self.role()),
            70..72 => Call::RoleList,
            72..81 => {
                let name = self.role();
                let perm = if self.p(0.04) {
                    None // "permission not given"
                } else {
                    let (key, range_end) = self.perm();
                    Some(Permission {
                        perm_type: self.pick(&[READ, WRITE, READWRITE]),
                        key,
                        range_end,
                    })
                };
                Call::RoleGrantPermission(pb::AuthRoleGrantPermissionRequest { name, perm })
            }
            81..87 => {
                let role = self.role();
                let granted: Vec<(Vec<u8>, Vec<u8>)> = m
                    .roles
                    .get(&role)
                    .map(|p| p.iter().cloned().collect())
                    .unwrap_or_default();
                let (key, range_end) = if !granted.is_empty() && self.p(0.7) {
                    granted[self.rng.random_range(0..granted.len())].clone()
                } else {
                    self.perm()
                };
                Call::RoleRevokePermission(pb::AuthRoleRevokePermissionRequest {
                    role,
                    key,
                    range_end,
                })
            }
            87..94 => Call::Put(pb::PutRequest {
                key: self.pick(&[&b"k"[..], b"a"]).to_vec(),
                value: b"v".to_vec(),
                ..Default::default()
            }),
            _ => Call::Range(pb::RangeRequest {
                key: b"k".to_vec(),
                ..Default::default()
            }),
        };
        Step { caller, call }
    }
}

/// What follows a change (whatever its answer), as root (its latest token
/// while auth is enabled, none while it is disabled): AuthStatus, and the
/// UserGet or RoleGet of what the change touched (every user after a
/// RoleDelete: they lose the role).
fn follow_ups(call: &Call, m: &Model) -> Vec<Step> {
    if !call.changes_auth() {
        return Vec::new();
    }
    let root = || {
        if m.enabled {
            Who::Latest("root".into())
        } else {
            Who::Nobody
        }
    };
    let mut s = vec![step(root(), Call::AuthStatus)];
    let user = |u: &str| step(root(), Call::UserGet(u.into()));
    let role = |r: &str| step(root(), Call::RoleGet(r.into()));
    match call {
        Call::UserAdd(r) => s.push(user(&r.name)),
        Call::UserDelete(u) => s.push(user(u)),
        Call::ChangePassword(r) => s.push(user(&r.name)),
        Call::UserGrantRole(r) => s.push(user(&r.user)),
        Call::UserRevokeRole(r) => s.push(user(&r.name)),
        Call::RoleAdd(r) => s.push(role(r)),
        Call::RoleDelete(r) => {
            s.push(role(r));
            s.extend(USERS.iter().map(|u| user(u)));
        }
        Call::RoleGrantPermission(r) => s.push(role(&r.name)),
        Call::RoleRevokePermission(r) => s.push(role(&r.role)),
        Call::AuthEnable | Call::AuthDisable => {
            s.push(step(root(), Call::UserList));
            s.push(step(root(), Call::RoleList));
        }
        _ => {}
    }
    s
}

// ---------------------------------------------------------------------------
// The fixed steps.

fn auth(name: &str, password: &str) -> Call {
    Call::Authenticate(pb::AuthenticateRequest {
        name: name.into(),
        password: password.into(),
    })
}

fn user_add(name: &str, password: &str, no_password: Option<bool>, hashed: &str) -> Call {
    Call::UserAdd(UserAddRequest {
        name: name.into(),
        password: password.into(),
        options: no_password.map(|no_password| UserAddOptions { no_password }),
        hashed_password: hashed.into(),
    })
}

fn change_password(name: &str, password: &str, hashed: &str) -> Call {
    Call::ChangePassword(ChangePasswordRequest {
        name: name.into(),
        password: password.into(),
        hashed_password: hashed.into(),
    })
}

fn grant_role(user: &str, role: &str) -> Call {
    Call::UserGrantRole(pb::AuthUserGrantRoleRequest {
        user: user.into(),
        role: role.into(),
    })
}

fn revoke_role(name: &str, role: &str) -> Call {
    Call::UserRevokeRole(pb::AuthUserRevokeRoleRequest {
        name: name.into(),
        role: role.into(),
    })
}

fn grant_perm(role: &str, t: i32, key: &[u8], end: &[u8]) -> Call {
    Call::RoleGrantPermission(pb::AuthRoleGrantPermissionRequest {
        name: role.into(),
        perm: Some(Permission {
            perm_type: t,
            key: key.to_vec(),
            range_end: end.to_vec(),
        }),
    })
}

fn revoke_perm(role: &str, key: &[u8], end: &[u8]) -> Call {
    Call::RoleRevokePermission(pb::AuthRoleRevokePermissionRequest {
        role: role.into(),
        key: key.to_vec(),
        range_end: end.to_vec(),
    })
}

/// The steps every run starts with: every case of the module
/// documentation once, in an order that makes each meaningful.
fn prelude() -> Vec<Step> {
    use Who::*;
    let none = |c: Call| step(Nobody, c);
    let root = |c: Call| step(Latest("root".into()), c);
    let as_user = |u: &str, c: Call| step(Latest(u.into()), c);
    let put = |k: &[u8]| {
        Call::Put(pb::PutRequest {
            key: k.to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        })
    };
    // (Each change's follow-ups are added at run time, see `Run::step`.)
    vec![
        // Auth disabled, nothing in the store.
        none(Call::AuthStatus),
        none(Call::UserList),
        none(Call::RoleList),
        none(Call::AuthEnable), // no root user
        none(auth("root", "pw-a")),
        none(Call::AuthDisable), // already disabled
        none(user_add("", "pw-a", None, "")),
        none(user_add("root", "pw-a", None, "")),
        none(user_add("root", "pw-b", None, "")), // duplicate
        none(Call::AuthEnable),                   // root lacks the root role
        none(Call::RoleAdd(String::new())),
        none(grant_role("root", "r1")),    // no such role
        none(grant_role(NO_USER, "root")), // no such user
        none(grant_role("root", "root")),  // the root role needs no RoleAdd
        none(grant_role("root", "root")),  // a duplicate
        none(Call::RoleList),
        none(Call::RoleGet("root".into())), // not added
        none(Call::AuthStatus),
        none(put(b"k")),
        // Users: a password, an explicit no_password false, no_password
        // (with a hash, ignored), an empty password.
        none(user_add("u1", "pw-a", Some(false), "")),
        none(user_add("U2", "", Some(true), HASHED)),
        none(user_add("\u{fc}", "", None, "")),
        none(user_add("h", "pw-a", None, HASHED)), // the hash is ignored
        none(Call::RoleAdd("r1".into())),
        none(Call::RoleAdd("R2".into())),
        none(Call::RoleAdd("root".into())),
        none(Call::RoleAdd("root".into())), // duplicate
        none(grant_perm("r1", READ, b"k", b"")),
        none(grant_perm("r1", WRITE, b"a", b"b")),
        none(grant_perm("r1", READWRITE, b"k", b"")), // an update of k
        none(grant_perm("R2", READWRITE, b"c", b"\0")),
        none(grant_role("u1", "r1")),
        none(grant_role("U2", "R2")),
        none(Call::UserList),
        none(Call::RoleList),
        // A token while auth is disabled (retcd: `disabled-tokens`).
        step(Bogus, Call::AuthStatus),
        step(Garbage, Call::UserList),
        // Enable.
        none(Call::AuthEnable),
        none(Call::AuthEnable), // no user while enabled
        none(Call::AuthStatus),
        none(Call::UserList),
        none(Call::UserGet("u1".into())),
        // nobody asks for nobody (retcd: `empty-user-get`)
        none(Call::UserGet(String::new())),
        none(Call::RoleGet("r1".into())),
        none(put(b"k")),
        none(auth("root", "pw-b")), // wrong password
        none(auth("h", "pw-a")),    // the hash was ignored
        none(auth("h", HASHED_PASSWORD)),
        none(auth("missing", "pw-a")), // unknown user
        none(auth("", "")),            // empty name
        none(auth("U2", "")),          // no_password user
        none(auth("U2", "pw-a")),
        none(auth("\u{fc}", "")), // empty password
        none(auth("\u{fc}", "x")),
        none(auth("root", "pw-a")),
        root(Call::AuthEnable), // twice
        root(Call::AuthStatus),
        root(Call::UserList),
        root(Call::RoleList),
        // As users without the root role.
        as_user("\u{fc}", Call::AuthStatus),
        as_user("\u{fc}", Call::UserGet("\u{fc}".into())), // oneself
        as_user("\u{fc}", Call::UserGet("u1".into())),
        as_user("\u{fc}", Call::UserGet(NO_USER.into())),
        as_user("\u{fc}", Call::RoleGet("r1".into())),
        none(auth("u1", "pw-a")),
        as_user("u1", Call::RoleGet("r1".into())), // a role it holds
        as_user("u1", Call::RoleGet("R2".into())),
        as_user("u1", Call::RoleGet(NO_ROLE.into())),
        as_user("u1", Call::RoleList),
        as_user("u1", user_add("x", "pw-a", None, "")),
        as_user("u1", change_password("u1", "pw-b", "")), // oneself
        as_user("u1", Call::UserDelete("u1".into())),
        as_user("u1", Call::AuthDisable),
        as_user("u1", put(b"k")),
        as_user("u1", put(b"z")),
        // As root: refusals.
        root(user_add("", "pw-a", None, "")),
        root(user_add("u1", "pw-a", None, "")),
        root(Call::UserDelete("root".into())),
        root(Call::UserDelete("h".into())),
        step(Latest("h".into()), Call::UserGet("h".into())), // its token
        root(Call::UserDelete(NO_USER.into())),
        root(Call::UserDelete("missing".into())),
        root(revoke_role("root", "root")),
        root(revoke_role("u1", "R2")), // not granted
        root(revoke_role("missing", "r1")),
        root(grant_role("u1", NO_ROLE)),
        root(grant_role("missing", "r1")),
        root(grant_role("u1", "r1")), // a duplicate
        root(grant_role("root", "root")),
        root(Call::RoleAdd("root".into())),
        root(Call::RoleAdd(String::new())),
        root(Call::RoleDelete("root".into())),
        root(Call::RoleDelete(NO_ROLE.into())),
        root(Call::RoleGet("root".into())), // retcd: `root-perm`
        root(Call::RoleGet(String::new())),
        root(grant_perm(NO_ROLE, READ, b"k", b"")),
        root(Call::RoleGrantPermission(
            pb::AuthRoleGrantPermissionRequest {
                name: "r1".into(),
                perm: None,
            },
        )),
        root(revoke_perm("r1", b"c", b"\0")), // not granted
        root(revoke_perm(NO_ROLE, b"k", b"")),
        root(grant_perm("root", READ, b"k", b"")), // the root role holds it
        root(Call::RoleGet("root".into())),
        root(revoke_perm("root", b"k", b"")),
        // Passwords.
        root(change_password("U2", "pw-b", "")), // no_password: kept so
        none(auth("U2", "pw-b")),
        root(change_password("missing", "pw-a", "")),
        // the hash alone, a bad one, none (retcd: `empty-password-change`)
        root(change_password("\u{fc}", "", HASHED)),
        none(auth("\u{fc}", HASHED_PASSWORD)),
        none(auth("\u{fc}", "")),
        root(change_password("\u{fc}", "", BAD_HASHED)),
        root(change_password("\u{fc}", "pw-a", HASHED)), // the password wins
        none(auth("\u{fc}", "pw-a")),
        none(auth("\u{fc}", HASHED_PASSWORD)),
        root(change_password("\u{fc}", "", "")), // neither
        none(auth("\u{fc}", "")),
        none(auth("\u{fc}", "pw-a")),
        // A user with the root role administers.
        root(grant_role("u1", "root")),
        as_user("u1", Call::UserList),
        as_user("u1", Call::AuthStatus),
        as_user("u1", change_password("u1", "pw-b", "")), // oneself: its tokens go
        as_user("u1", Call::AuthStatus),
        none(auth("u1", "pw-a")),
        none(auth("u1", "pw-b")),
        as_user("u1", Call::UserGet("u1".into())),
        as_user("u1", Call::UserDelete("u1".into())), // oneself
        as_user("u1", Call::UserGet("u1".into())),
        as_user("u1", Call::AuthStatus),
        root(Call::UserGet("u1".into())),
        // A deleted user added again: its old tokens stay invalid.
        root(user_add("u1", "pw-a", None, "")),
        step(First("u1".into()), Call::UserGet("u1".into())),
        as_user("u1", Call::UserGet("u1".into())),
        // A granted role deleted: users lose it.
        root(grant_role("u1", "r1")),
        root(grant_role("\u{fc}", "r1")),
        root(Call::RoleDelete("r1".into())),
        root(Call::UserGet("u1".into())),
        root(Call::UserGet("\u{fc}".into())),
        root(Call::RoleList),
        root(Call::RoleGet("r1".into())),
        root(Call::RoleAdd("r1".into())),
        root(Call::RoleGet("r1".into())),
        root(Call::UserGet("u1".into())),
        root(revoke_role("u1", "r1")),
        root(put(b"k")),
        root(Call::Range(pb::RangeRequest {
            key: b"k".to_vec(),
            ..Default::default()
        })),
        // Where the token goes.
        step(Latest("root".into()), Call::AuthStatus),
        Step {
            caller: Caller {
                who: Latest("root".into()),
                form: Form::Authorization,
            },
            call: Call::AuthStatus,
        },
        Step {
            caller: Caller {
                who: Latest("root".into()),
                form: Form::BearerToken,
            },
            call: Call::AuthStatus,
        },
        Step {
            caller: Caller {
                who: Latest("root".into()),
                form: Form::BearerAuthorization,
            },
            call: Call::UserList,
        },
        step(Garbage, Call::AuthStatus),
        step(Bogus, Call::AuthStatus),
        // Passwords bcrypt refuses in the newest etcd.
        root(user_add("x", LONG_PASSWORD, None, "")),
        root(Call::UserDelete("x".into())),
        root(user_add("y", LONG_PASSWORD, Some(true), "")),
        root(change_password("y", LONG_PASSWORD, "")),
        root(change_password("u1", LONG_PASSWORD, "")),
        none(auth("u1", LONG_PASSWORD)),
        none(auth("u1", "pw-a")),
        root(change_password("u1", PASSWORD_72, "")),
        none(auth("u1", LONG_PASSWORD)), // bcrypt reads 72 bytes
        none(auth("u1", PASSWORD_72)),
        root(change_password("u1", "pw-a", "")),
        root(Call::UserDelete("y".into())),
        // Disable: refused without root, with a stale or a bogus token,
        // without a token.
        as_user("U2", Call::AuthDisable),
        as_user("u1", Call::AuthDisable),
        root(change_password("root", "pw-b", "")),
        root(Call::AuthDisable),
        step(Bogus, Call::AuthDisable),
        none(Call::AuthDisable),
        none(auth("root", "pw-a")),
        none(auth("root", "pw-b")),
        step(First("root".into()), Call::AuthStatus),
        root(Call::AuthStatus),
        root(Call::AuthDisable),
        // Disabled: old tokens, none, a bogus one.
        root(Call::AuthStatus),
        as_user("u1", Call::UserList),
        root(Call::AuthDisable),
        step(Bogus, Call::UserGet("u1".into())),
        none(Call::AuthStatus),
        none(Call::AuthDisable),
        none(auth("root", "pw-b")),
        none(put(b"k")),
        root(put(b"k")),
        // Enabled again: the old tokens stay invalid.
        root(Call::AuthEnable),
        none(Call::AuthStatus),
        root(Call::AuthStatus),
        none(auth("root", "pw-b")),
        root(Call::AuthStatus),
        step(First("root".into()), Call::AuthStatus),
        // Disabled again, root loses its role, then the user: enable fails.
        root(Call::AuthDisable),
        none(revoke_role("root", "root")),
        none(Call::AuthEnable),
        none(Call::RoleDelete("root".into())),
        none(Call::UserDelete("root".into())),
        none(Call::AuthEnable),
        none(user_add("root", "pw-a", None, "")),
        none(grant_role("root", "root")),
        none(Call::AuthEnable),
        none(auth("root", "pw-a")),
        root(Call::AuthStatus),
        root(Call::RoleList),
    ]
}

// ---------------------------------------------------------------------------
// The run.

/// What the target is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// etcd 3.5.1 too: every answer must equal the reference's.
    Etcd351,
    /// retcd: the newest etcd's answers where 3.5.1 differs.
    Retcd,
}

/// Cases of known differences left out (`RETCD_AUTH_DIFF_AVOID`, a
/// comma-separated list), to look past them: a difference changes the
/// servers' states, so later steps differ too.
#[derive(Debug, Default, Clone, Copy)]
struct Avoid {
    /// `disabled-tokens`: no token is sent while auth is disabled.
    disabled_tokens: bool,
    /// `root-perm`: no RoleGet of the root role.
    root_perm: bool,
    /// `empty-user-get`: no UserGet of the empty name.
    empty_user_get: bool,
    /// `empty-password-change`: no UserChangePassword with an empty
    /// password (with or without `hashedPassword`).
    empty_password_change: bool,
}

impl Avoid {
    fn from_env() -> Avoid {
        let v = std::env::var("RETCD_AUTH_DIFF_AVOID").unwrap_or_default();
        let mut a = Avoid::default();
        for w in v.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match w {
                "disabled-tokens" => a.disabled_tokens = true,
                "root-perm" => a.root_perm = true,
                "empty-user-get" => a.empty_user_get = true,
                "empty-password-change" => a.empty_password_change = true,
                _ => panic!("RETCD_AUTH_DIFF_AVOID: unknown case {w:?}"),
            }
        }
        a
    }

    /// `step` as the run sends it: `None` when left out, without its token
    /// while auth is disabled (`enabled`) if so asked.
    fn apply(&self, step: Step, enabled: bool) -> Option<Step> {
        let left_out = match &step.call {
            Call::RoleGet(r) => self.root_perm && r == "root",
            Call::UserGet(u) => self.empty_user_get && u.is_empty(),
            Call::ChangePassword(r) => self.empty_password_change && r.password.is_empty(),
            _ => false,
        };
        if left_out {
            return None;
        }
        if self.disabled_tokens && !enabled && step.caller.who != Who::Nobody {
            return Some(Step {
                caller: Caller {
                    who: Who::Nobody,
                    form: Form::Token,
                },
                call: step.call,
            });
        }
        Some(step)
    }
}

fn show_answer(a: &Answer) -> String {
    match a {
        Ok(r) => readable(&format!("{r:?}")),
        Err((code, msg)) => format!("error {code:?}: {msg:?}"),
    }
}

/// The token `tok` as a reader wants it: whose, which issue.
fn show_tok(tok: &Tok, m: &Model) -> String {
    match tok {
        Tok::None => "no token".into(),
        Tok::Issued(i) => format!("token#{i} of {:?}", m.tokens[*i].0),
        Tok::Literal(s) => format!("token {s:?}"),
    }
}

fn show_step(s: &Step, tok: &Tok, m: &Model) -> String {
    let form = match s.caller.form {
        Form::Token => String::new(),
        f => format!(" in {f:?}"),
    };
    format!(
        "[{}{form}] {}",
        show_tok(tok, m),
        readable(&format!("{:?}", s.call))
    )
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
    /// Differences by request kind.
    kinds: BTreeMap<&'static str, usize>,
    /// The reference's errors, by message.
    errors: BTreeMap<String, usize>,
    /// How often the target was held to the newest etcd's answer instead
    /// of 3.5.1's, by case.
    newer: BTreeMap<&'static str, usize>,
    trace: bool,
}

impl Run {
    /// Runs `step` on both servers (as the mode requires), compares, and
    /// returns the steps to run next.
    async fn step(&mut self, n: usize, step: &Step) -> Vec<Step> {
        let tok = self.model.resolve(&step.caller.who);
        let form = step.caller.form;
        let shown_step = show_step(step, &tok, &self.model);
        let retcd = self.mode == Mode::Retcd;
        let (ra, ta, want, shown_ref) = if retcd && step.call.hashes_long_password() {
            // The newest etcd refuses it; 3.5.1 would store a hash of
            // the first 72 bytes.
            let (ta, _) = self.t.call(&tok, form, &step.call).await;
            *self.newer.entry("password over 72 bytes").or_insert(0) += 1;
            let want = Err((Code::Unknown, TOO_LONG.to_string()));
            let shown = "(not sent: 3.5.1 hashes a password over 72 bytes, the newest etcd \
                         refuses it)"
                .to_string();
            (None, ta, want, shown)
        } else {
            // The newest etcd ignores a token while auth is disabled and
            // drops a `Bearer ` prefix: the reference gets what the newest
            // would act on.
            let (rtok, rform) = if !retcd || tok == Tok::None {
                (tok.clone(), form)
            } else if !self.model.enabled {
                *self.newer.entry("token while disabled").or_insert(0) += 1;
                (Tok::None, form)
            } else if form.bearer() {
                *self.newer.entry("Bearer prefix").or_insert(0) += 1;
                (tok.clone(), form.bare())
            } else {
                (tok.clone(), form)
            };
            let ((ra, r_issued), (ta, t_issued)) = tokio::join!(
                self.r.call(&rtok, rform, &step.call),
                self.t.call(&tok, form, &step.call)
            );
            if let Some(token) = r_issued {
                self.r.tokens.push(Some(token));
                self.t.tokens.push(t_issued);
            }
            let want = ra.clone();
            let mut shown = show_answer(&ra);
            if rtok != tok || rform != form {
                shown = format!("{shown} (sent {})", show_tok(&rtok, &self.model));
            }
            (Some(ra), ta, want, shown)
        };
        if self.trace {
            eprintln!(
                "step {n}: {shown_step}\n  etcd 3.5.1: {shown_ref}\n  {}: {}",
                self.tname,
                show_answer(&ta)
            );
        }
        if ta != want {
            self.diffs += 1;
            *self.kinds.entry(step.call.kind()).or_insert(0) += 1;
            if self.shown.len() < MAX_SHOWN {
                let expected = if ra.as_ref() == Some(&want) {
                    String::new()
                } else {
                    format!("\n  expected:   {}", show_answer(&want))
                };
                self.shown.push(format!(
                    "seed {} step {n}: {shown_step}\n  etcd 3.5.1: {shown_ref}\n  {}: {}{expected}",
                    self.seed,
                    self.tname,
                    show_answer(&ta),
                ));
            }
        }
        if let Some(ra) = &ra {
            if let Err((code, msg)) = ra {
                *self.errors.entry(format!("{code:?} {msg:?}")).or_insert(0) += 1;
            }
            self.model.learn(&step.call, ra);
        }
        follow_ups(&step.call, &self.model)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_admin_random_differential() {
    let seed = env_u64("RETCD_AUTH_DIFF_SEED", 1);
    let steps = env_u64("RETCD_AUTH_DIFF_STEPS", 300) as usize;
    let avoid = Avoid::from_env();
    // A long run gets more time than the default one.
    let limit = LIMIT.max(Duration::from_millis(steps as u64 * 150));
    bounded(limit, async {
        let flavor = test_flavor();
        let mode = match flavor {
            Flavor::Etcd => Mode::Etcd351,
            Flavor::Retcd => Mode::Retcd,
        };
        // The cheapest bcrypt; no fsync.
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
            Mode::Etcd351 => "target etcd 3.5.1",
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
            errors: BTreeMap::new(),
            newer: BTreeMap::new(),
            trace: env_u64("RETCD_AUTH_DIFF_TRACE", 0) == 1,
        };
        let mut g = Gen {
            rng: StdRng::seed_from_u64(seed),
        };
        let started = Instant::now();
        let mut queue: VecDeque<Step> = prelude().into();
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
            let Some(step) = avoid.apply(step, run.model.enabled) else {
                continue;
            };
            let next = run.step(n, &step).await;
            for s in next.into_iter().rev() {
                queue.push_front(s);
            }
            n += 1;
        }
        eprintln!(
            "auth_admin_random_differential: etcd 3.5.1 vs {tname}, seed {seed}: {n} steps \
             ({generated} generated) in {:.1?}, {} tokens issued, auth {} at the end; \
             etcd's errors: {:?}; the newest etcd's answer expected instead of 3.5.1's: {:?}; \
             {} differing steps {:?}",
            started.elapsed(),
            run.model.tokens.len(),
            if run.model.enabled {
                "enabled"
            } else {
                "disabled"
            },
            run.errors,
            run.newer,
            run.diffs,
            run.kinds,
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
fn model_and_forms() {
    let mut m = Model::default();
    let ok = Ok(Resp::Done(None));
    m.learn(&user_add("root", "pw-a", None, ""), &ok);
    m.learn(&grant_role("root", "root"), &ok);
    m.learn(&Call::AuthEnable, &ok);
    assert!(m.enabled);
    m.learn(&auth("root", "pw-a"), &ok);
    m.learn(&auth("u1", "pw-a"), &ok);
    assert!(m.root_token_valid());
    assert_eq!(m.resolve(&Who::Latest("u1".into())), Tok::Issued(1));
    assert_eq!(m.resolve(&Who::First("u9".into())), Tok::None);
    m.learn(&change_password("root", "pw-b", ""), &ok);
    assert!(!m.root_token_valid());
    assert_eq!(m.users["root"].password, "pw-b");
    m.learn(&Call::AuthDisable, &ok);
    assert!(!m.enabled && !m.tokens.iter().any(|t| t.1));
    // a refused request teaches nothing
    m.learn(&Call::AuthEnable, &Err((Code::Unknown, String::new())));
    assert!(!m.enabled);
    assert!(user_add("x", LONG_PASSWORD, None, "").hashes_long_password());
    assert!(!user_add("x", LONG_PASSWORD, Some(true), "").hashes_long_password());
    assert!(!change_password("x", "", HASHED).hashes_long_password());
    assert_eq!(LONG_PASSWORD.len(), 73);
    assert_eq!(&LONG_PASSWORD[..72], PASSWORD_72);
    assert_eq!(Form::BearerAuthorization.bare(), Form::Authorization);
    let r = with_token((), Some("t.1"), Form::BearerToken);
    assert_eq!(r.metadata().get("token").unwrap(), "Bearer t.1");
}
