//! The auth store (etcd's `auth` package): users, roles, their key-range
//! permissions, whether auth is enabled, and tokens.
//!
//! | file | role (etcd's file) |
//! |---|---|
//! | `mod.rs` | [`AuthStore`]: loading, the reads and checks requests make |
//! | `store.rs` | the applied state and its changes through raft (`store.go`) |
//! | `range_perm.rs` | whether a user's permissions cover a key range (`range_perm_cache.go`) |
//! | `token.rs`, `simple_token.rs`, `jwt.rs` | `--auth-token`: simple tokens and JWTs |
//! | `cert.rs` | the user a verified client certificate names (`AuthInfoFromTLS`) |
//! | `error.rs` | [`AuthError`], with etcd's texts |
//!
//! Passwords are hashed with bcrypt by the member that takes the request,
//! before proposing, so neither the log nor the raft thread sees a password
//! or pays for the hash.

pub mod cert;
mod error;
pub mod jwt;
mod range_perm;
pub mod simple_token;
mod store;
pub mod token;

pub use error::{AuthError, BackendError};
pub use token::TokenProvider;

use parking_lot::RwLock;
use retcd_api::authpb::{permission::Type as PermType, Role, User};
use retcd_storage::backend::Backend;
use std::sync::atomic::{AtomicBool, Ordering};
use store::State;

pub const ROOT_USER: &str = "root";
pub const ROOT_ROLE: &str = "root";

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

/// What a request says about who sent it, not yet checked: its token, or
/// the common name of its verified client certificate. The server turns it
/// into an [`AuthInfo`] where etcd does (`AuthInfoFromCtx`), after the
/// request's own checks.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    pub token: Option<String>,
    pub cert_cn: Option<String>,
    /// The server itself, acting as root (etcd's `WithRoot`).
    pub(crate) server_itself: bool,
}

impl Credentials {
    /// No token and no certificate.
    pub fn none() -> Credentials {
        Credentials::default()
    }

    /// The server itself, as root (expiring leases, auto-compaction).
    pub fn server_itself() -> Credentials {
        Credentials {
            server_itself: true,
            ..Default::default()
        }
    }
}

/// The auth store; see the module documentation. Share as `Arc`.
#[derive(Debug)]
pub struct AuthStore {
    /// Applied auth state. Written only by the raft thread's apply (and
    /// `reload` after a snapshot); read by request handlers. Never held
    /// across I/O or `.await`. Lock order: `state`, then the simple
    /// tokens' lock.
    state: RwLock<State>,
    /// Mirror of `state.enabled`, read without a lock on every request.
    enabled: AtomicBool,
    provider: TokenProvider,
}

impl AuthStore {
    /// Loads the auth state persisted in `backend`.
    pub fn load(backend: &Backend, provider: TokenProvider) -> anyhow::Result<AuthStore> {
        let s = AuthStore {
            state: RwLock::new(State::default()),
            enabled: AtomicBool::new(false),
            provider,
        };
        s.reload(backend)?;
        Ok(s)
    }

    /// Replaces the in-memory state with the backend's (after a restore).
    pub fn reload(&self, backend: &Backend) -> anyhow::Result<()> {
        let st = State::load(backend)?;
        self.enabled.store(st.enabled, Ordering::Release);
        if !st.enabled {
            if let TokenProvider::Simple(tokens) = &self.provider {
                tokens.clear();
            }
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

    /// Whether tokens are JWTs (signed after the Authenticate applies, by
    /// [`AuthStore::sign_jwt`]) rather than simple tokens.
    pub fn uses_jwt(&self) -> bool {
        matches!(self.provider, TokenProvider::Jwt(_))
    }

    /// A JWT for `username` at the current auth revision.
    pub fn sign_jwt(&self, username: &str) -> Result<String, AuthError> {
        match &self.provider {
            TokenProvider::Jwt(j) => j.sign(username, self.revision()),
            TokenProvider::Simple(_) | TokenProvider::Nop => Err(AuthError::InvalidAuthToken),
        }
    }

    /// The user a token names (etcd's `AuthInfoFromCtx`): None without a
    /// token, InvalidAuthToken for an unknown or expired one. A valid simple
    /// token lives another TTL from now. As etcd's simple tokens, the info
    /// carries the auth revision of now: it is stale only if the auth
    /// store changes before the request applies.
    /// The caller a token names. While auth is disabled a token is not
    /// looked at (etcd 3.5.10+ and 3.6: "disable auth gracefully without
    /// impacting existing watchers"; before, a stale one was refused).
    pub fn info_from_token(&self, token: Option<&str>) -> Result<Option<AuthInfo>, AuthError> {
        let Some(token) = token.filter(|_| self.is_enabled()) else {
            return Ok(None);
        };
        match &self.provider {
            TokenProvider::Jwt(j) => j.verify(token).map(Some).ok_or(AuthError::InvalidAuthToken),
            TokenProvider::Simple(tokens) => {
                // Lock order: apply holds `state` and then takes the
                // tokens, so the revision is read before the tokens lock.
                let revision = self.revision();
                let username = tokens.user(token).ok_or(AuthError::InvalidAuthToken)?;
                Ok(Some(AuthInfo { username, revision }))
            }
            TokenProvider::Nop => Err(AuthError::InvalidAuthToken),
        }
    }

    /// READ permission on `[key, range_end)` (etcd's `IsRangePermitted`).
    pub fn check_range(
        &self,
        who: Option<&AuthInfo>,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<(), AuthError> {
        self.check(who, key, range_end, PermType::Read)
    }

    /// WRITE permission on `[key, range_end)` (etcd's `IsPutPermitted` /
    /// `IsDeleteRangePermitted`).
    pub fn check_write(
        &self,
        who: Option<&AuthInfo>,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<(), AuthError> {
        self.check(who, key, range_end, PermType::Write)
    }

    fn check(
        &self,
        who: Option<&AuthInfo>,
        key: &[u8],
        range_end: &[u8],
        want: PermType,
    ) -> Result<(), AuthError> {
        if !self.is_enabled() {
            return Ok(());
        }
        self.state.read().check(who, key, range_end, want)
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn test_token_flag_parsing() {
        let ttl = Duration::from_secs(300);
        assert!(matches!(
            TokenProvider::from_flag("simple", ttl),
            Ok(TokenProvider::Simple(_))
        ));
        // no type: etcd's tokenNop
        assert!(matches!(
            TokenProvider::from_flag("", ttl),
            Ok(TokenProvider::Nop)
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
        // etcd refuses these as ErrInvalidAuthOpts (jwtOptions.Parse,
        // decomposeOpts), before it looks at any key
        for bad in [
            "jwt",
            "jwt,sign-method=",
            "jwt,ttl=5,sign-method=HS256",
            "jwt,a=b=c",
            "jwt,ttl=1m,ttl=2m",
            "jwt,pub-key=/nonexistent/key,sign-method=RS256",
            " simple",
        ] {
            let e = TokenProvider::from_flag(bad, ttl).unwrap_err();
            assert!(e.starts_with("auth: invalid auth options ("), "{bad}: {e}");
        }
    }

    #[test]
    fn test_jwt_round_trip_and_tampering() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"0123456789abcdef0123456789abcdef").unwrap();
        let jwt = |ttl: &str| match TokenProvider::from_flag(
            &format!(
                "jwt,sign-method=HS256,priv-key={},ttl={ttl}",
                secret.display()
            ),
            Duration::from_secs(300),
        )
        .unwrap()
        {
            TokenProvider::Jwt(j) => j,
            other => panic!("not a JWT provider: {other:?}"),
        };
        let p = jwt("1m");
        let token = p.sign("bob", 7).unwrap();
        assert_eq!(token.split('.').count(), 3);
        assert_eq!(
            p.verify(&token),
            Some(AuthInfo {
                username: "bob".into(),
                revision: 7
            })
        );
        let mut parts: Vec<String> = token.split('.').map(String::from).collect();
        parts[1] = parts[1].chars().rev().collect();
        assert_eq!(p.verify(&parts.join(".")), None);
        let expired = jwt("0s").sign("bob", 7).unwrap();
        std::thread::sleep(Duration::from_millis(1100));
        assert_eq!(p.verify(&expired), None);
    }
}
