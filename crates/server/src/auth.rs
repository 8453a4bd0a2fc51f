//! The auth store (etcd's `auth` package): users, roles, their key-range
//! permissions, whether auth is enabled, and simple tokens.
//!
//! Users and roles change only through applied raft entries (so every
//! member agrees) and are persisted in the backend's `auth` table in the
//! same commit as the entry. Passwords are hashed with bcrypt by the member
//! that takes the request, before proposing, so neither the log nor the
//! raft thread sees a password or pays for the hash.
//!
//! Simple tokens (etcd's `--auth-token simple`, the default): `Authenticate` checks the
//! password on the member that takes it, then proposes the user name with a
//! random 16-letter prefix; every member registers `prefix.index` (the raft
//! index) for the user. A token lives 5 minutes after its last use, is
//! dropped when its user is deleted or changes password, and every token is
//! dropped when auth is disabled. Tokens are kept in memory only, as in
//! etcd: after a restart clients authenticate again.
//!
//! JWT tokens (`--auth-token jwt,...`): the member that takes the request
//! signs `{username, revision, exp}` once the Authenticate entry applied;
//! every member verifies them with the public key, so they need no shared
//! state and survive restarts. A token issued before an auth change fails
//! with "revision of auth store is old" and the client authenticates again.
//!
//! Permission checks follow etcd's `isOpPermitted`: with auth enabled, a
//! request with no user fails with "user name is empty"; one whose token
//! was issued before the last auth change fails with "revision of auth
//! store is old" (clients authenticate again); a user with the `root` role
//! may do anything; others need their roles' permissions to cover the whole
//! key range (READ for reads, WRITE for writes).

use parking_lot::{Mutex, RwLock};
use prost::Message;
use redb::{ReadableDatabase, ReadableTable, WriteTransaction};
use retcd_api::authpb::{permission::Type as PermType, Permission, Role, User};
use retcd_api::retcdpb::{auth_request::Op, AuthRequest};
use retcd_storage::backend::{Backend, AUTH};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub const ROOT_USER: &str = "root";
pub const ROOT_ROLE: &str = "root";

const ENABLED_KEY: &[u8] = b"enabled";
const REVISION_KEY: &[u8] = b"revision";
const USER_PREFIX: &[u8] = b"u/";
const ROLE_PREFIX: &[u8] = b"r/";

/// Auth errors, with etcd's wire texts (`rpctypes`); `grpc::error_map`
/// gives them etcd's codes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("etcdserver: root user does not exist")]
    RootUserNotExist,
    #[error("etcdserver: root user does not have root role")]
    RootRoleNotExist,
    #[error("etcdserver: user name already exists")]
    UserAlreadyExist,
    #[error("etcdserver: user name is empty")]
    UserEmpty,
    #[error("etcdserver: user name not found")]
    UserNotFound,
    #[error("etcdserver: role name already exists")]
    RoleAlreadyExist,
    #[error("etcdserver: role name not found")]
    RoleNotFound,
    #[error("etcdserver: role name is empty")]
    RoleEmpty,
    #[error("etcdserver: authentication failed, invalid user ID or password")]
    AuthFailed,
    /// etcd has no rpctypes entry for it: it reaches clients as Unknown
    /// with the auth package's text.
    #[error("auth: authentication failed, password was given for no password user")]
    NoPasswordUser,
    #[error("etcdserver: permission denied")]
    PermissionDenied,
    #[error("etcdserver: role is not granted to the user")]
    RoleNotGranted,
    #[error("etcdserver: permission is not granted to the role")]
    PermissionNotGranted,
    #[error("etcdserver: authentication is not enabled")]
    AuthNotEnabled,
    #[error("etcdserver: invalid auth token")]
    InvalidAuthToken,
    #[error("etcdserver: invalid auth management")]
    InvalidAuthMgmt,
    #[error("etcdserver: revision of auth store is old")]
    AuthOldRevision,
    /// Not in etcd's rpctypes table: Unknown with the auth package's text.
    #[error("auth: token signing attempted with verify-only key")]
    VerifyOnly,
    #[error("auth: {0}")]
    Backend(String),
}

impl AuthError {
    /// The auth package's own text (etcd's `auth.Err*`), which etcd sends
    /// unconverted, as code Unknown, where it does not map the error
    /// (the maintenance RPCs' admin check).
    pub fn raw_text(&self) -> String {
        match self {
            AuthError::UserEmpty => "auth: user name is empty".into(),
            AuthError::UserNotFound => "auth: user not found".into(),
            AuthError::PermissionDenied => "auth: permission denied".into(),
            AuthError::InvalidAuthToken => "auth: invalid auth token".into(),
            AuthError::AuthOldRevision => "auth: revision in header is old".into(),
            other => other.to_string(),
        }
    }
}

fn backend_err(e: impl std::fmt::Display) -> AuthError {
    AuthError::Backend(e.to_string())
}

/// Who a request comes from: the user its token names and the auth
/// revision the token was issued at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthInfo {
    pub username: String,
    pub revision: u64,
}

impl AuthInfo {
    /// The server acting on its own (etcd's `WithRoot`), e.g. revoking an
    /// expired lease: the root user, which exists with the root role
    /// whenever auth is enabled, at any auth revision.
    pub fn server_itself() -> AuthInfo {
        AuthInfo {
            username: ROOT_USER.to_string(),
            revision: u64::MAX,
        }
    }
}

/// The applied users and roles.
#[derive(Debug, Default)]
struct State {
    enabled: bool,
    revision: u64,
    users: BTreeMap<String, User>,
    roles: BTreeMap<String, Role>,
}

/// A key range `[start, end)`; `end = None` is unbounded.
type Interval = (Vec<u8>, Option<Vec<u8>>);

impl State {
    fn has_root_role(&self, user: &str) -> bool {
        self.users
            .get(user)
            .is_some_and(|u| u.roles.iter().any(|r| r == ROOT_ROLE))
    }

    /// The intervals a user may access with `want` (READ or WRITE).
    fn intervals(&self, user: &User, want: PermType) -> Vec<Interval> {
        let mut out = Vec::new();
        for role in user.roles.iter().filter_map(|r| self.roles.get(r)) {
            for p in &role.key_permission {
                let t = PermType::try_from(p.perm_type).unwrap_or(PermType::Read);
                if t != want && t != PermType::Readwrite {
                    continue;
                }
                out.push(interval(&p.key, &p.range_end));
            }
        }
        out
    }

    /// etcd's `isOpPermitted` (see the module documentation).
    fn check(
        &self,
        who: Option<&AuthInfo>,
        key: &[u8],
        range_end: &[u8],
        want: PermType,
    ) -> Result<(), AuthError> {
        if !self.enabled {
            return Ok(());
        }
        let who = match who {
            Some(w) if w.revision != 0 => w,
            _ => return Err(AuthError::UserEmpty),
        };
        if who.revision < self.revision {
            return Err(AuthError::AuthOldRevision);
        }
        let Some(user) = self.users.get(&who.username) else {
            return Err(AuthError::PermissionDenied);
        };
        if user.roles.iter().any(|r| r == ROOT_ROLE) {
            return Ok(());
        }
        let perms = self.intervals(user, want);
        let ok = if range_end.is_empty() {
            perms.iter().any(|iv| contains_key(iv, key))
        } else {
            covers(perms, &interval(key, range_end))
        };
        if ok {
            Ok(())
        } else {
            Err(AuthError::PermissionDenied)
        }
    }
}

/// A permission's or request's range as an interval: an empty `range_end`
/// is the single key, `"\0"` is every key from `key` on.
fn interval(key: &[u8], range_end: &[u8]) -> Interval {
    match range_end {
        [] => {
            let mut end = key.to_vec();
            end.push(0);
            (key.to_vec(), Some(end))
        }
        [0] => (key.to_vec(), None),
        end => (key.to_vec(), Some(end.to_vec())),
    }
}

fn contains_key((start, end): &Interval, key: &[u8]) -> bool {
    start.as_slice() <= key && end.as_ref().is_none_or(|e| key < e.as_slice())
}

/// Whether the union of `perms` covers all of `want`.
fn covers(mut perms: Vec<Interval>, want: &Interval) -> bool {
    perms.sort();
    let mut reached = want.0.clone();
    for (start, end) in perms {
        if start > reached {
            break;
        }
        match end {
            None => return true,
            Some(e) if e > reached => reached = e,
            Some(_) => {}
        }
        if want.1.as_ref().is_some_and(|w| reached >= *w) {
            return true;
        }
    }
    // An empty request range (start >= end) is covered by anything.
    want.1.as_ref().is_some_and(|w| *w <= want.0)
}

/// How tokens are made and checked (`--auth-token`).
pub enum TokenProvider {
    /// Random tokens registered on every member through raft; each lives
    /// `ttl` after its last use.
    Simple { ttl: Duration },
    /// Signed JSON web tokens (etcd's claims: `username`, `revision`,
    /// `exp`): any member verifies them without shared state, and they
    /// survive restarts. Without a private key the member only verifies.
    Jwt {
        alg: jsonwebtoken::Algorithm,
        sign: Option<jsonwebtoken::EncodingKey>,
        verify: jsonwebtoken::DecodingKey,
        ttl: Duration,
    },
}

impl std::fmt::Debug for TokenProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenProvider::Simple { ttl } => write!(f, "simple(ttl={ttl:?})"),
            TokenProvider::Jwt { alg, ttl, .. } => write!(f, "jwt({alg:?}, ttl={ttl:?})"),
        }
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct JwtClaims {
    username: String,
    revision: u64,
    exp: i64,
}

impl TokenProvider {
    /// Parses etcd's `--auth-token` value: `simple`, or `jwt,` followed by
    /// `sign-method=`, `pub-key=`, `priv-key=` (PEM files; for HS* the
    /// private key file is the secret) and `ttl=` (default 5m).
    pub fn from_flag(opt: &str, simple_ttl: Duration) -> Result<TokenProvider, String> {
        let mut parts = opt.split(',');
        let kind = parts.next().unwrap_or_default().trim();
        let mut opts = HashMap::new();
        for p in parts {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| format!("auth: invalid auth options ({p:?} in --auth-token)"))?;
            opts.insert(k.trim(), v.trim());
        }
        match kind {
            "simple" => Ok(TokenProvider::Simple { ttl: simple_ttl }),
            "jwt" => Self::jwt(&opts),
            other => Err(format!(
                "auth: invalid auth options (unknown token type {other:?} in --auth-token)"
            )),
        }
    }

    fn jwt(opts: &HashMap<&str, &str>) -> Result<TokenProvider, String> {
        use jsonwebtoken::{Algorithm as A, DecodingKey, EncodingKey};
        let alg: A = opts
            .get("sign-method")
            .and_then(|m| m.parse().ok())
            .ok_or("auth: invalid auth signature method")?;
        let ttl = match opts.get("ttl") {
            Some(t) => crate::config::parse_duration(t)?,
            None => Duration::from_secs(300),
        };
        let read = |k: &str| -> Result<Option<Vec<u8>>, String> {
            opts.get(k)
                .map(|path| std::fs::read(path).map_err(|e| format!("auth: {k} {path}: {e}")))
                .transpose()
        };
        let (private, public) = (read("priv-key")?, read("pub-key")?);
        let bad = |e: jsonwebtoken::errors::Error| format!("auth: invalid key data: {e}");
        let (sign, verify) = match alg {
            A::HS256 | A::HS384 | A::HS512 => {
                let secret = private.ok_or("auth: missing key data")?;
                (
                    Some(EncodingKey::from_secret(&secret)),
                    DecodingKey::from_secret(&secret),
                )
            }
            A::RS256 | A::RS384 | A::RS512 | A::PS256 | A::PS384 | A::PS512 => {
                let public = public.ok_or(
                    "auth: missing key data (retcd needs pub-key for RSA; priv-key alone is not supported)",
                )?;
                let sign = private
                    .map(|k| EncodingKey::from_rsa_pem(&k))
                    .transpose()
                    .map_err(bad)?;
                (sign, DecodingKey::from_rsa_pem(&public).map_err(bad)?)
            }
            A::ES256 | A::ES384 => {
                let public = public.ok_or(
                    "auth: missing key data (retcd needs pub-key for ECDSA; priv-key alone is not supported)",
                )?;
                let sign = private
                    .map(|k| EncodingKey::from_ec_pem(&k))
                    .transpose()
                    .map_err(bad)?;
                (sign, DecodingKey::from_ec_pem(&public).map_err(bad)?)
            }
            A::EdDSA => {
                let public = public.ok_or("auth: missing key data")?;
                let sign = private
                    .map(|k| EncodingKey::from_ed_pem(&k))
                    .transpose()
                    .map_err(bad)?;
                (sign, DecodingKey::from_ed_pem(&public).map_err(bad)?)
            }
        };
        Ok(TokenProvider::Jwt {
            alg,
            sign,
            verify,
            ttl,
        })
    }

    /// A signed token for `username` at auth `revision` (JWT only).
    pub fn sign_jwt(&self, username: &str, revision: u64) -> Result<String, AuthError> {
        let TokenProvider::Jwt { alg, sign, ttl, .. } = self else {
            return Err(AuthError::Backend("not a JWT token provider".into()));
        };
        let key = sign.as_ref().ok_or(AuthError::VerifyOnly)?;
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            + *ttl;
        let claims = JwtClaims {
            username: username.to_string(),
            revision,
            exp: exp.as_secs() as i64,
        };
        jsonwebtoken::encode(&jsonwebtoken::Header::new(*alg), &claims, key).map_err(backend_err)
    }

    fn verify_jwt(&self, token: &str) -> Option<AuthInfo> {
        let TokenProvider::Jwt { alg, verify, .. } = self else {
            return None;
        };
        let mut v = jsonwebtoken::Validation::new(*alg);
        v.leeway = 0;
        let data = jsonwebtoken::decode::<JwtClaims>(token, verify, &v).ok()?;
        Some(AuthInfo {
            username: data.claims.username,
            revision: data.claims.revision,
        })
    }
}

/// A registered simple token.
#[derive(Debug)]
struct Token {
    user: String,
    expires: Instant,
}

/// The auth store; see the module documentation. Share as `Arc`.
#[derive(Debug)]
pub struct AuthStore {
    /// Applied auth state. Written only by the raft thread's apply (and
    /// `reload` after a snapshot); read by request handlers. Never held
    /// across I/O or `.await`.
    state: RwLock<State>,
    /// Mirror of `state.enabled`, read without a lock on every request.
    enabled: AtomicBool,
    /// Simple tokens by token string. Locked briefly, never across I/O.
    tokens: Mutex<HashMap<String, Token>>,
    pub provider: TokenProvider,
}

impl AuthStore {
    /// Loads the auth state persisted in `backend`.
    pub fn load(backend: &Backend, provider: TokenProvider) -> anyhow::Result<AuthStore> {
        let s = AuthStore {
            state: RwLock::new(State::default()),
            enabled: AtomicBool::new(false),
            tokens: Mutex::new(HashMap::new()),
            provider,
        };
        s.reload(backend)?;
        Ok(s)
    }

    /// Replaces the in-memory state with the backend's (after a restore).
    pub fn reload(&self, backend: &Backend) -> anyhow::Result<()> {
        let txn = backend.db().begin_read()?;
        let mut st = State::default();
        if let Ok(t) = txn.open_table(AUTH) {
            for e in t.iter()? {
                let (k, v) = e?;
                let (k, v) = (k.value(), v.value());
                if k == ENABLED_KEY {
                    st.enabled = v == [1];
                } else if k == REVISION_KEY {
                    st.revision = u64::from_be_bytes(v.try_into()?);
                } else if let Some(name) = k.strip_prefix(USER_PREFIX) {
                    st.users
                        .insert(String::from_utf8_lossy(name).into(), User::decode(v)?);
                } else if let Some(name) = k.strip_prefix(ROLE_PREFIX) {
                    st.roles
                        .insert(String::from_utf8_lossy(name).into(), Role::decode(v)?);
                }
            }
        }
        // A new store starts at revision 1, as etcd's (it commits one at
        // creation); every member derives the same.
        st.revision = st.revision.max(1);
        self.enabled.store(st.enabled, Ordering::Release);
        if !st.enabled {
            self.tokens.lock().clear();
        }
        *self.state.write() = st;
        Ok(())
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    pub fn revision(&self) -> u64 {
        self.state.read().revision
    }

    /// The user a token names (etcd's `AuthInfoFromCtx`): None without a
    /// token, InvalidAuthToken for an unknown or expired one. A valid token
    /// lives another TTL from now. As etcd's simple tokens, the info
    /// carries the auth revision of now: it is stale only if the auth
    /// store changes before the request applies.
    pub fn info_from_token(&self, token: Option<&str>) -> Result<Option<AuthInfo>, AuthError> {
        let Some(token) = token else {
            return Ok(None);
        };
        if let TokenProvider::Jwt { .. } = self.provider {
            return match self.provider.verify_jwt(token) {
                Some(info) => Ok(Some(info)),
                None => Err(AuthError::InvalidAuthToken),
            };
        }
        let TokenProvider::Simple { ttl } = self.provider else {
            return Err(AuthError::InvalidAuthToken);
        };
        // Lock order: apply holds `state` and then takes `tokens`, so the
        // revision is read before `tokens` is locked.
        let revision = self.revision();
        let mut tokens = self.tokens.lock();
        let now = Instant::now();
        match tokens.get_mut(token) {
            Some(t) if t.expires > now => {
                t.expires = now + ttl;
                Ok(Some(AuthInfo {
                    username: t.user.clone(),
                    revision,
                }))
            }
            Some(_) => {
                tokens.remove(token);
                Err(AuthError::InvalidAuthToken)
            }
            None => Err(AuthError::InvalidAuthToken),
        }
    }

    /// READ permission on `[key, range_end)` (etcd's `IsRangePermitted`).
    pub fn check_range(
        &self,
        who: Option<&AuthInfo>,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<(), AuthError> {
        if !self.is_enabled() {
            return Ok(());
        }
        self.state.read().check(who, key, range_end, PermType::Read)
    }

    /// WRITE permission on `[key, range_end)` (etcd's `IsPutPermitted` /
    /// `IsDeleteRangePermitted`).
    pub fn check_write(
        &self,
        who: Option<&AuthInfo>,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<(), AuthError> {
        if !self.is_enabled() {
            return Ok(());
        }
        self.state
            .read()
            .check(who, key, range_end, PermType::Write)
    }

    /// The root role (etcd's `IsAdminPermitted`).
    pub fn check_admin(&self, who: Option<&AuthInfo>) -> Result<(), AuthError> {
        if !self.is_enabled() {
            return Ok(());
        }
        let st = self.state.read();
        let Some(who) = who.filter(|w| !w.username.is_empty()) else {
            return Err(AuthError::UserEmpty);
        };
        if !st.users.contains_key(&who.username) {
            return Err(AuthError::UserNotFound);
        }
        if !st.has_root_role(&who.username) {
            return Err(AuthError::PermissionDenied);
        }
        Ok(())
    }

    /// Whether `user` holds `role` (a user may read its own roles).
    pub fn has_role(&self, user: &str, role: &str) -> bool {
        self.state
            .read()
            .users
            .get(user)
            .is_some_and(|u| u.roles.iter().any(|r| r == role))
    }

    /// The stored password hash of `name` and the auth revision, for
    /// checking a password outside any lock (etcd's `CheckPassword`).
    pub fn password_hash(&self, name: &str) -> Result<(Vec<u8>, u64), AuthError> {
        let st = self.state.read();
        if !st.enabled {
            return Err(AuthError::AuthNotEnabled);
        }
        let user = st.users.get(name).ok_or(AuthError::AuthFailed)?;
        if user.options.as_ref().is_some_and(|o| o.no_password) {
            return Err(AuthError::NoPasswordUser);
        }
        Ok((user.password.clone(), st.revision))
    }

    pub fn user(&self, name: &str) -> Result<User, AuthError> {
        self.state
            .read()
            .users
            .get(name)
            .cloned()
            .ok_or(AuthError::UserNotFound)
    }

    pub fn user_names(&self) -> Vec<String> {
        self.state.read().users.keys().cloned().collect()
    }

    pub fn role(&self, name: &str) -> Result<Role, AuthError> {
        self.state
            .read()
            .roles
            .get(name)
            .cloned()
            .ok_or(AuthError::RoleNotFound)
    }

    pub fn role_names(&self) -> Vec<String> {
        self.state.read().roles.keys().cloned().collect()
    }

    /// Applies one auth change at raft `index` in the batch's transaction.
    /// Returns the token for an Authenticate, else None.
    pub fn apply(
        &self,
        txn: &WriteTransaction,
        index: u64,
        req: &AuthRequest,
    ) -> Result<Option<String>, AuthError> {
        let Some(op) = &req.op else {
            return Ok(None);
        };
        let mut st = self.state.write();
        let mut table = txn.open_table(AUTH).map_err(backend_err)?;
        match op {
            Op::Enable(_) => {
                if st.enabled {
                    return Ok(None);
                }
                if !st.users.contains_key(ROOT_USER) {
                    return Err(AuthError::RootUserNotExist);
                }
                if !st.has_root_role(ROOT_USER) {
                    return Err(AuthError::RootRoleNotExist);
                }
                table
                    .insert(ENABLED_KEY, [1u8].as_slice())
                    .map_err(backend_err)?;
                st.enabled = true;
                self.enabled.store(true, Ordering::Release);
                // etcd does not bump the revision on enable.
                return Ok(None);
            }
            Op::Disable(_) => {
                if !st.enabled {
                    return Ok(None);
                }
                table
                    .insert(ENABLED_KEY, [0u8].as_slice())
                    .map_err(backend_err)?;
                st.enabled = false;
                self.enabled.store(false, Ordering::Release);
                self.tokens.lock().clear();
            }
            Op::Authenticate(a) => {
                if !st.enabled {
                    return Err(AuthError::AuthNotEnabled);
                }
                let user = st.users.get(&a.name).ok_or(AuthError::AuthFailed)?;
                if user.options.as_ref().is_some_and(|o| o.no_password) {
                    return Err(AuthError::AuthFailed);
                }
                // A JWT is signed by the member that took the request,
                // after the apply (off the raft thread).
                let TokenProvider::Simple { ttl } = self.provider else {
                    return Ok(None);
                };
                let token = format!("{}.{}", a.simple_token, index);
                self.tokens.lock().insert(
                    token.clone(),
                    Token {
                        user: a.name.clone(),
                        expires: Instant::now() + ttl,
                    },
                );
                return Ok(Some(token));
            }
            Op::UserAdd(r) => {
                if r.name.is_empty() {
                    return Err(AuthError::UserEmpty);
                }
                if st.users.contains_key(&r.name) {
                    return Err(AuthError::UserAlreadyExist);
                }
                let u = User {
                    name: r.name.clone().into_bytes(),
                    password: r.hashed_password.clone(),
                    roles: vec![],
                    options: Some(r.options.unwrap_or_default()),
                };
                put_user(&mut table, &u)?;
                st.users.insert(r.name.clone(), u);
            }
            Op::UserDelete(r) => {
                if st.enabled && r.name == ROOT_USER {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                if st.users.remove(&r.name).is_none() {
                    return Err(AuthError::UserNotFound);
                }
                let k = [USER_PREFIX, r.name.as_bytes()].concat();
                table.remove(k.as_slice()).map_err(backend_err)?;
                self.drop_tokens_of(&r.name);
            }
            Op::UserChangePassword(r) => {
                let u = st.users.get_mut(&r.name).ok_or(AuthError::UserNotFound)?;
                u.password = r.hashed_password.clone();
                let u = u.clone();
                put_user(&mut table, &u)?;
                self.drop_tokens_of(&r.name);
            }
            Op::UserGrantRole(r) => {
                if !st.users.contains_key(&r.user) {
                    return Err(AuthError::UserNotFound);
                }
                if r.role != ROOT_ROLE && !st.roles.contains_key(&r.role) {
                    return Err(AuthError::RoleNotFound);
                }
                let u = st.users.get_mut(&r.user).ok_or(AuthError::UserNotFound)?;
                if let Err(at) = u.roles.binary_search(&r.role) {
                    u.roles.insert(at, r.role.clone());
                } else {
                    return Ok(None); // already granted: no change, no new revision
                }
                let u = u.clone();
                put_user(&mut table, &u)?;
            }
            Op::UserRevokeRole(r) => {
                if st.enabled && r.name == ROOT_USER && r.role == ROOT_ROLE {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                let u = st.users.get_mut(&r.name).ok_or(AuthError::UserNotFound)?;
                let before = u.roles.len();
                u.roles.retain(|x| *x != r.role);
                if u.roles.len() == before {
                    return Err(AuthError::RoleNotGranted);
                }
                let u = u.clone();
                put_user(&mut table, &u)?;
            }
            Op::RoleAdd(r) => {
                if r.name.is_empty() {
                    return Err(AuthError::RoleEmpty);
                }
                if st.roles.contains_key(&r.name) {
                    return Err(AuthError::RoleAlreadyExist);
                }
                let role = Role {
                    name: r.name.clone().into_bytes(),
                    key_permission: vec![],
                };
                put_role(&mut table, &role)?;
                st.roles.insert(r.name.clone(), role);
            }
            Op::RoleDelete(r) => {
                if st.enabled && r.role == ROOT_ROLE {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                if st.roles.remove(&r.role).is_none() {
                    return Err(AuthError::RoleNotFound);
                }
                let k = [ROLE_PREFIX, r.role.as_bytes()].concat();
                table.remove(k.as_slice()).map_err(backend_err)?;
                let mut changed = Vec::new();
                for u in st.users.values_mut() {
                    let before = u.roles.len();
                    u.roles.retain(|x| *x != r.role);
                    if u.roles.len() != before {
                        changed.push(u.clone());
                    }
                }
                for u in &changed {
                    put_user(&mut table, u)?;
                }
            }
            Op::RoleGrantPermission(r) => {
                let role = st.roles.get_mut(&r.name).ok_or(AuthError::RoleNotFound)?;
                let perm = r.perm.clone().unwrap_or_default();
                match role
                    .key_permission
                    .iter_mut()
                    .find(|p| p.key == perm.key && p.range_end == perm.range_end)
                {
                    Some(p) => p.perm_type = perm.perm_type,
                    None => {
                        role.key_permission.push(Permission {
                            perm_type: perm.perm_type,
                            key: perm.key,
                            range_end: perm.range_end,
                        });
                        role.key_permission.sort_by(|a, b| a.key.cmp(&b.key));
                    }
                }
                let role = role.clone();
                put_role(&mut table, &role)?;
            }
            Op::RoleRevokePermission(r) => {
                let role = st.roles.get_mut(&r.role).ok_or(AuthError::RoleNotFound)?;
                let before = role.key_permission.len();
                role.key_permission
                    .retain(|p| !(p.key == r.key && p.range_end == r.range_end));
                if role.key_permission.len() == before {
                    return Err(AuthError::PermissionNotGranted);
                }
                let role = role.clone();
                put_role(&mut table, &role)?;
            }
        }
        // Every change but enable, authenticate and an idempotent grant
        // moves the auth revision, as etcd's `commitRevision`.
        st.revision += 1;
        table
            .insert(REVISION_KEY, st.revision.to_be_bytes().as_slice())
            .map_err(backend_err)?;
        Ok(None)
    }

    fn drop_tokens_of(&self, user: &str) {
        self.tokens.lock().retain(|_, t| t.user != user);
    }
}

fn put_user(t: &mut redb::Table<&[u8], &[u8]>, u: &User) -> Result<(), AuthError> {
    let k = [USER_PREFIX, &u.name].concat();
    t.insert(k.as_slice(), u.encode_to_vec().as_slice())
        .map(|_| ())
        .map_err(backend_err)
}

fn put_role(t: &mut redb::Table<&[u8], &[u8]>, r: &Role) -> Result<(), AuthError> {
    let k = [ROLE_PREFIX, &r.name].concat();
    t.insert(k.as_slice(), r.encode_to_vec().as_slice())
        .map(|_| ())
        .map_err(backend_err)
}

/// A random 16-letter token prefix (etcd's `genTokenPrefix`).
pub fn token_prefix() -> String {
    use rand::Rng;
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut rng = rand::rng();
    (0..16)
        .map(|_| LETTERS[rng.random_range(0..LETTERS.len())] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perm(key: &[u8], end: &[u8]) -> Interval {
        interval(key, end)
    }

    #[test]
    fn test_point_permission_covers_only_its_key() {
        let p = vec![perm(b"foo", b"")];
        assert!(covers(p.clone(), &interval(b"foo", b"")));
        assert!(!covers(p.clone(), &interval(b"foo", b"fop")));
        assert!(contains_key(&p[0], b"foo"));
        assert!(!contains_key(&p[0], b"foo1"));
    }

    #[test]
    fn test_ranges_cover_a_request_only_together() {
        let p = vec![perm(b"a", b"c"), perm(b"c", b"e")];
        assert!(covers(p.clone(), &interval(b"a", b"e")));
        assert!(covers(p.clone(), &interval(b"b", b"d")));
        assert!(!covers(p.clone(), &interval(b"a", b"f")));
        assert!(!covers(
            vec![perm(b"a", b"b"), perm(b"c", b"e")],
            &interval(b"a", b"d")
        ));
    }

    #[test]
    fn test_from_key_permission_is_unbounded() {
        let p = vec![perm(b"m", b"\0")];
        assert!(covers(p.clone(), &interval(b"m", b"\0")));
        assert!(covers(p.clone(), &interval(b"x", b"z")));
        assert!(!covers(p.clone(), &interval(b"a", b"z")));
        assert!(!covers(vec![perm(b"a", b"z")], &interval(b"a", b"\0")));
    }

    #[test]
    fn test_check_rules() {
        let mut st = State {
            enabled: true,
            revision: 3,
            ..Default::default()
        };
        st.roles.insert(
            "r".into(),
            Role {
                name: b"r".to_vec(),
                key_permission: vec![Permission {
                    perm_type: PermType::Read as i32,
                    key: b"dir/".to_vec(),
                    range_end: b"dir0".to_vec(),
                }],
            },
        );
        st.users.insert(
            "bob".into(),
            User {
                name: b"bob".to_vec(),
                roles: vec!["r".into()],
                ..Default::default()
            },
        );
        let bob = AuthInfo {
            username: "bob".into(),
            revision: 3,
        };
        assert_eq!(st.check(Some(&bob), b"dir/a", b"", PermType::Read), Ok(()));
        assert_eq!(
            st.check(Some(&bob), b"dir/a", b"", PermType::Write),
            Err(AuthError::PermissionDenied)
        );
        assert_eq!(
            st.check(None, b"dir/a", b"", PermType::Read),
            Err(AuthError::UserEmpty)
        );
        let old = AuthInfo {
            revision: 2,
            ..bob.clone()
        };
        assert_eq!(
            st.check(Some(&old), b"dir/a", b"", PermType::Read),
            Err(AuthError::AuthOldRevision)
        );
        st.enabled = false;
        assert_eq!(st.check(None, b"x", b"", PermType::Write), Ok(()));
    }

    #[test]
    fn test_token_flag_parsing() {
        let ttl = Duration::from_secs(300);
        assert!(matches!(
            TokenProvider::from_flag("simple", ttl),
            Ok(TokenProvider::Simple { .. })
        ));
        for bad in [
            "bogus",
            "jwt,sign-method=RS256",
            "jwt,sign-method=NOPE",
            "jwt,priv-key",
        ] {
            assert!(
                TokenProvider::from_flag(bad, ttl).is_err(),
                "{bad} accepted"
            );
        }
    }

    #[test]
    fn test_jwt_round_trip_and_tampering() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"0123456789abcdef0123456789abcdef").unwrap();
        let p = TokenProvider::from_flag(
            &format!("jwt,sign-method=HS256,priv-key={},ttl=1m", secret.display()),
            Duration::from_secs(300),
        )
        .unwrap();
        let token = p.sign_jwt("bob", 7).unwrap();
        assert_eq!(token.split('.').count(), 3);
        assert_eq!(
            p.verify_jwt(&token),
            Some(AuthInfo {
                username: "bob".into(),
                revision: 7
            })
        );
        let mut parts: Vec<String> = token.split('.').map(String::from).collect();
        parts[1] = parts[1].chars().rev().collect();
        assert_eq!(p.verify_jwt(&parts.join(".")), None);
        let expired = TokenProvider::from_flag(
            &format!("jwt,sign-method=HS256,priv-key={},ttl=0s", secret.display()),
            Duration::from_secs(300),
        )
        .unwrap()
        .sign_jwt("bob", 7)
        .unwrap();
        std::thread::sleep(Duration::from_millis(1100));
        assert_eq!(p.verify_jwt(&expired), None);
    }
}
