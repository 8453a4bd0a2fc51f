//! The Auth service's flows: changes go through raft (`auth::AuthStore::
//! apply`); reads (UserGet/List, RoleGet/List, AuthStatus) are answered
//! from the applied store after a linearizable read barrier (timing out
//! as etcd's proposals of them do), with etcd's
//! permission rules (admin only, except a user's own record and roles).
//! bcrypt runs on a blocking thread (cost 10 is tens of milliseconds).

use super::{unexpected, EtcdServer};
use crate::apply::ApplyResult;
use crate::auth::{AuthError, AuthInfo, Credentials};
use crate::error::ServerError;
use retcd_api::authpb::{Permission, UserAddOptions};
use retcd_api::retcdpb::auth_request::Op;
use retcd_api::retcdpb::internal_raft_request::Request;
use retcd_api::retcdpb::{AuthAuthenticate, AuthRequest, AuthUserAdd, AuthUserChangePassword};

/// bcrypt on a blocking thread; etcd stores `$2a$` hashes, so do we.
/// bcrypt reads at most 72 bytes: a longer password is refused, as Go's
/// bcrypt refuses it, not silently cut.
async fn hash_password(password: String, cost: u32) -> Result<Vec<u8>, ServerError> {
    if password.len() > 72 {
        return Err(ServerError::PasswordTooLong);
    }
    tokio::task::spawn_blocking(move || {
        bcrypt::hash_with_result(password, cost)
            .map(|h| h.format_for_version(bcrypt::Version::TwoA).into_bytes())
    })
    .await
    .map_err(|e| ServerError::internal_from("retcd: password hashing task failed", e))?
    .map_err(|e| ServerError::internal_from("failed to hash the password", e))
}

impl EtcdServer {
    /// Proposes one auth change on behalf of `who`; the token for an
    /// Authenticate.
    pub async fn auth_change(
        &self,
        op: Op,
        creds: &Credentials,
    ) -> Result<Option<String>, ServerError> {
        let who = self.who(creds)?;
        self.auth_change_as(op, who).await
    }

    async fn auth_change_as(
        &self,
        op: Op,
        who: Option<AuthInfo>,
    ) -> Result<Option<String>, ServerError> {
        let req = Request::Auth(AuthRequest { op: Some(op) });
        match self.propose_as(req, who).await? {
            ApplyResult::Auth(token) => Ok(token),
            other => Err(unexpected(other)),
        }
    }

    /// `who`, after a linearizable read barrier (reads of the auth store
    /// see every change applied before the call). etcd puts these reads
    /// through raft as proposals, so a barrier that times out answers as
    /// a proposal does: without a leader (etcd's raft node takes no
    /// proposal then) Unknown "context deadline exceeded", else why, in
    /// `parseProposeCtxErr`'s words.
    async fn auth_reader(&self, creds: &Credentials) -> Result<Option<AuthInfo>, ServerError> {
        let start = std::time::Instant::now();
        match self.linearizable_read_notify().await {
            Err(ServerError::Timeout) if self.leader() == 0 => {
                return Err(ServerError::ProposeDeadline)
            }
            Err(ServerError::Timeout) => return Err(self.propose_timed_out(start)),
            r => r?,
        }
        self.who(creds)
    }

    /// AuthStatus: (enabled, auth revision); root only while auth is
    /// enabled (etcd 3.5 applies it with `needAdminPermission`).
    pub async fn auth_status(&self, creds: &Credentials) -> Result<(bool, u64), ServerError> {
        let who = self.auth_reader(creds).await?;
        self.require_root(who.as_ref())?;
        Ok((self.auth.is_enabled(), self.auth.revision()))
    }

    /// etcd's flow: check the password here (outside raft, off the
    /// runtime), then propose the user with a fresh token prefix; if the
    /// auth store changed meanwhile, check again. Returns the token. Who
    /// asks does not matter (etcd 3.5 ignores a token sent with it).
    pub async fn authenticate(&self, name: &str, password: &str) -> Result<String, ServerError> {
        self.linearizable_read_notify().await?;
        loop {
            let (hash, checked_rev) = self.auth.password_hash(name)?;
            let password = password.to_string();
            let ok = tokio::task::spawn_blocking(move || {
                let hash = String::from_utf8_lossy(&hash).into_owned();
                bcrypt::verify(password, &hash).unwrap_or(false)
            })
            .await
            .map_err(|e| ServerError::internal_from("retcd: password check task failed", e))?;
            if !ok {
                return Err(AuthError::AuthFailed.into());
            }
            let jwt = self.auth.uses_jwt();
            let op = Op::Authenticate(AuthAuthenticate {
                name: name.to_string(),
                simple_token: if jwt {
                    String::new()
                } else {
                    crate::auth::simple_token::token_prefix()
                },
            });
            let token = match self.auth_change_as(op, None).await? {
                Some(simple) => simple,
                None => {
                    // JWT: signed here once the entry applied (RSA signing
                    // is a millisecond of CPU: off the runtime).
                    let auth = self.auth.clone();
                    let name = name.to_string();
                    tokio::task::spawn_blocking(move || auth.sign_jwt(&name))
                        .await
                        .map_err(|e| {
                            ServerError::internal_from("retcd: signing task failed", e)
                        })??
                }
            };
            if self.auth.revision() == checked_rev {
                return Ok(token);
            }
        }
    }

    pub async fn user_add(
        &self,
        name: String,
        password: String,
        options: Option<UserAddOptions>,
        creds: &Credentials,
    ) -> Result<(), ServerError> {
        let no_password = options.as_ref().is_some_and(|o| o.no_password);
        let hashed_password = if no_password {
            Vec::new()
        } else {
            hash_password(password, self.cfg.bcrypt_cost).await?
        };
        let op = Op::UserAdd(AuthUserAdd {
            name,
            hashed_password,
            options,
        });
        self.auth_change(op, creds).await.map(|_| ())
    }

    /// UserChangePassword: a password is hashed here (etcd's API layer);
    /// with none, the request's `hashedPassword` is what the apply stores
    /// (etcd's `selectPassword`).
    pub async fn user_change_password(
        &self,
        name: String,
        password: String,
        hashed_password: String,
        creds: &Credentials,
    ) -> Result<(), ServerError> {
        let op = Op::UserChangePassword(if password.is_empty() {
            AuthUserChangePassword {
                name,
                hashed_password: Vec::new(),
                given_hashed_password: Some(hashed_password),
            }
        } else {
            AuthUserChangePassword {
                name,
                hashed_password: hash_password(password, self.cfg.bcrypt_cost).await?,
                given_hashed_password: None,
            }
        });
        self.auth_change(op, creds).await.map(|_| ())
    }

    /// A user's roles (the user itself or an admin).
    pub async fn user_get(
        &self,
        name: &str,
        creds: &Credentials,
    ) -> Result<Vec<String>, ServerError> {
        let who = self.auth_reader(creds).await?;
        // etcd lets a caller read itself past the admin check, comparing
        // names: no user is "", so a UserGet of "" is "user name not found"
        if who.as_ref().map_or("", |w| w.username.as_str()) != name {
            self.auth.check_admin(who.as_ref())?;
        }
        Ok(self.auth.user(name)?.roles)
    }

    pub async fn user_list(&self, creds: &Credentials) -> Result<Vec<String>, ServerError> {
        let who = self.auth_reader(creds).await?;
        self.auth.check_admin(who.as_ref())?;
        Ok(self.auth.user_names())
    }

    /// A role's permissions (an admin, or a user holding the role).
    pub async fn role_get(
        &self,
        role: &str,
        creds: &Credentials,
    ) -> Result<Vec<Permission>, ServerError> {
        let who = self.auth_reader(creds).await?;
        if !who
            .as_ref()
            .is_some_and(|w| self.auth.has_role(&w.username, role))
        {
            self.auth.check_admin(who.as_ref())?;
        }
        Ok(self.auth.role(role)?.key_permission)
    }

    pub async fn role_list(&self, creds: &Credentials) -> Result<Vec<String>, ServerError> {
        let who = self.auth_reader(creds).await?;
        self.auth.check_admin(who.as_ref())?;
        Ok(self.auth.role_names())
    }
}
