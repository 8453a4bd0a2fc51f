//! The applied auth state and its changes (etcd's `auth/store.go`).
//!
//! Users and roles change only through applied raft entries (so every
//! member agrees) and are persisted in the backend's `auth` table in the
//! same commit as the entry. Every change but enable, authenticate and an
//! idempotent grant moves the auth revision, as etcd's `commitRevision`.
//!
//! Table `auth`: `enabled` → `[0|1]`, `revision` → 8-byte big-endian,
//! `u/<name>` → authpb.User, `r/<name>` → authpb.Role.

use super::error::backend_err;
use super::token::TokenProvider;
use super::{AuthError, AuthStore, ROOT_ROLE, ROOT_USER};
use prost::Message;
use redb::{ReadableDatabase, ReadableTable, WriteTransaction};
use retcd_api::authpb::{Permission, Role, User};
use retcd_api::retcdpb::{auth_request::Op, AuthRequest};
use retcd_storage::backend::{Backend, AUTH};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use retcd_storage::backend::{
    AUTH_ENABLED_KEY as ENABLED_KEY, AUTH_REVISION_KEY as REVISION_KEY,
    AUTH_ROLE_PREFIX as ROLE_PREFIX, AUTH_USER_PREFIX as USER_PREFIX,
};

/// The applied users and roles.
#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) enabled: bool,
    pub(super) revision: u64,
    pub(super) users: BTreeMap<String, User>,
    pub(super) roles: BTreeMap<String, Role>,
}

impl State {
    pub(super) fn has_root_role(&self, user: &str) -> bool {
        self.users
            .get(user)
            .is_some_and(|u| u.roles.iter().any(|r| r == ROOT_ROLE))
    }

    /// The state persisted in `backend` (a new store starts at revision 1,
    /// as etcd's, which commits one at creation; every member derives the
    /// same).
    pub(super) fn load(backend: &Backend) -> anyhow::Result<State> {
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
        st.revision = st.revision.max(1);
        Ok(st)
    }
}

type Table<'t> = redb::Table<'t, &'static [u8], &'static [u8]>;

/// What an applied change did.
enum Applied {
    /// The auth revision moves.
    Changed,
    /// Nothing that moves the revision (enable, an idempotent grant, a
    /// no-op enable or disable).
    Unchanged,
    /// An Authenticate: the token registered (simple tokens) or None
    /// (JWT, signed by the member that took the request after the apply).
    Token(Option<String>),
}

impl AuthStore {
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
        let t = &mut table;
        let applied = match op {
            Op::Enable(_) => self.enable(&mut st, t)?,
            Op::Disable(_) => self.disable(&mut st, t)?,
            Op::Authenticate(a) => self.authenticate(&st, &a.name, &a.simple_token, index)?,
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
                put_user(t, &u)?;
                st.users.insert(r.name.clone(), u);
                Applied::Changed
            }
            Op::UserDelete(r) => {
                if st.enabled && r.name == ROOT_USER {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                if st.users.remove(&r.name).is_none() {
                    return Err(AuthError::UserNotFound);
                }
                let k = [USER_PREFIX, r.name.as_bytes()].concat();
                t.remove(k.as_slice()).map_err(backend_err)?;
                self.drop_tokens_of(&r.name);
                Applied::Changed
            }
            Op::UserChangePassword(r) => {
                let u = st.users.get_mut(&r.name).ok_or(AuthError::UserNotFound)?;
                u.password = if u.options.as_ref().is_some_and(|o| o.no_password) {
                    Vec::new()
                } else if let Some(b64) = &r.given_hashed_password {
                    use base64::Engine as _;
                    base64::engine::general_purpose::STANDARD
                        .decode(b64)
                        .map_err(|_| AuthError::NoPasswordUser)?
                } else {
                    r.hashed_password.clone()
                };
                put_user(t, u)?;
                self.drop_tokens_of(&r.name);
                Applied::Changed
            }
            Op::UserGrantRole(r) => grant_role(&mut st, t, &r.user, &r.role)?,
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
                put_user(t, u)?;
                Applied::Changed
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
                put_role(t, &role)?;
                st.roles.insert(r.name.clone(), role);
                Applied::Changed
            }
            Op::RoleDelete(r) => delete_role(&mut st, t, &r.role)?,
            Op::RoleGrantPermission(r) => {
                // etcd 3.5.0+ (#13086): no permission is an error, checked
                // before the role; 3.5.8+ (#15619): so is an empty range.
                let perm = r.perm.clone().ok_or(AuthError::PermissionNotGiven)?;
                if !is_valid_permission_range(&perm.key, &perm.range_end) {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                let role = st.roles.get_mut(&r.name).ok_or(AuthError::RoleNotFound)?;
                // As etcd: only the first permission whose key is not below
                // the new one's (its `sort.Search`) is updated in place when
                // it has the same range; otherwise the new one is added
                // after those with its key, even if another of them has its
                // range (etcd then keeps both).
                let first = role.key_permission.partition_point(|p| p.key < perm.key);
                match role
                    .key_permission
                    .get_mut(first)
                    .filter(|p| p.key == perm.key && p.range_end == perm.range_end)
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
                put_role(t, role)?;
                Applied::Changed
            }
            Op::RoleRevokePermission(r) => {
                let role = st.roles.get_mut(&r.role).ok_or(AuthError::RoleNotFound)?;
                let before = role.key_permission.len();
                role.key_permission
                    .retain(|p| !(p.key == r.key && p.range_end == r.range_end));
                if role.key_permission.len() == before {
                    return Err(AuthError::PermissionNotGranted);
                }
                put_role(t, role)?;
                Applied::Changed
            }
        };
        match applied {
            Applied::Token(token) => Ok(token),
            Applied::Unchanged => Ok(None),
            Applied::Changed => {
                st.revision += 1;
                t.insert(REVISION_KEY, st.revision.to_be_bytes().as_slice())
                    .map_err(backend_err)?;
                Ok(None)
            }
        }
    }

    fn enable(&self, st: &mut State, t: &mut Table<'_>) -> Result<Applied, AuthError> {
        if st.enabled {
            return Ok(Applied::Unchanged);
        }
        if !st.users.contains_key(ROOT_USER) {
            return Err(AuthError::RootUserNotExist);
        }
        if !st.has_root_role(ROOT_USER) {
            return Err(AuthError::RootRoleNotExist);
        }
        t.insert(ENABLED_KEY, [1u8].as_slice())
            .map_err(backend_err)?;
        st.enabled = true;
        self.enabled.store(true, Ordering::Release);
        // etcd does not bump the revision on enable.
        Ok(Applied::Unchanged)
    }

    fn disable(&self, st: &mut State, t: &mut Table<'_>) -> Result<Applied, AuthError> {
        if !st.enabled {
            return Ok(Applied::Unchanged);
        }
        t.insert(ENABLED_KEY, [0u8].as_slice())
            .map_err(backend_err)?;
        st.enabled = false;
        self.enabled.store(false, Ordering::Release);
        if let TokenProvider::Simple(tokens) = &self.provider {
            tokens.clear();
        }
        Ok(Applied::Changed)
    }

    fn authenticate(
        &self,
        st: &State,
        name: &str,
        prefix: &str,
        index: u64,
    ) -> Result<Applied, AuthError> {
        if !st.enabled {
            return Err(AuthError::AuthNotEnabled);
        }
        let user = st.users.get(name).ok_or(AuthError::AuthFailed)?;
        if user.options.as_ref().is_some_and(|o| o.no_password) {
            return Err(AuthError::AuthFailed);
        }
        // A JWT is signed by the member that took the request, after the
        // apply (off the raft thread); `Nop` gives none (etcd's
        // tokenNop.assign).
        let tokens = match &self.provider {
            TokenProvider::Simple(tokens) => tokens,
            TokenProvider::Jwt(_) => return Ok(Applied::Token(None)),
            TokenProvider::Nop => return Err(AuthError::AuthFailed),
        };
        let token = format!("{prefix}.{index}");
        tokens.register(token.clone(), name);
        Ok(Applied::Token(Some(token)))
    }

    fn drop_tokens_of(&self, user: &str) {
        if let TokenProvider::Simple(tokens) = &self.provider {
            tokens.drop_user(user);
        }
    }
}

/// etcd's `isValidPermissionRange` (3.5.8+, `range_perm_cache.go`): a
/// permission needs a key, and its range end must be empty (one key),
/// `\0` (every key from `key` on) or above the key.
fn is_valid_permission_range(key: &[u8], range_end: &[u8]) -> bool {
    !key.is_empty() && (range_end.is_empty() || range_end == [0] || key < range_end)
}

fn grant_role(
    st: &mut State,
    t: &mut Table<'_>,
    user: &str,
    role: &str,
) -> Result<Applied, AuthError> {
    if !st.users.contains_key(user) {
        return Err(AuthError::UserNotFound);
    }
    if role != ROOT_ROLE && !st.roles.contains_key(role) {
        return Err(AuthError::RoleNotFound);
    }
    let u = st.users.get_mut(user).ok_or(AuthError::UserNotFound)?;
    let Err(at) = u.roles.binary_search_by(|r| r.as_str().cmp(role)) else {
        return Ok(Applied::Unchanged); // already granted: no new revision
    };
    u.roles.insert(at, role.to_string());
    put_user(t, u)?;
    Ok(Applied::Changed)
}

fn delete_role(st: &mut State, t: &mut Table<'_>, role: &str) -> Result<Applied, AuthError> {
    if st.enabled && role == ROOT_ROLE {
        return Err(AuthError::InvalidAuthMgmt);
    }
    if st.roles.remove(role).is_none() {
        return Err(AuthError::RoleNotFound);
    }
    let k = [ROLE_PREFIX, role.as_bytes()].concat();
    t.remove(k.as_slice()).map_err(backend_err)?;
    for u in st.users.values_mut() {
        let before = u.roles.len();
        u.roles.retain(|x| x != role);
        if u.roles.len() != before {
            put_user(t, u)?;
        }
    }
    Ok(Applied::Changed)
}

fn put_user(t: &mut Table<'_>, u: &User) -> Result<(), AuthError> {
    let k = [USER_PREFIX, &u.name].concat();
    t.insert(k.as_slice(), u.encode_to_vec().as_slice())
        .map(|_| ())
        .map_err(backend_err)
}

fn put_role(t: &mut Table<'_>, r: &Role) -> Result<(), AuthError> {
    let k = [ROLE_PREFIX, &r.name].concat();
    t.insert(k.as_slice(), r.encode_to_vec().as_slice())
        .map(|_| ())
        .map_err(backend_err)
}
