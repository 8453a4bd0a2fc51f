//! etcdserverpb.Auth: users, roles, permissions, enable/disable and
//! Authenticate (simple tokens). Changes go through raft (`auth::AuthStore::
//! apply`); reads (UserGet/List, RoleGet/List, AuthStatus) are answered
//! from the applied store after a linearizable read barrier, with etcd's
//! permission rules (admin only, except a user's own record and roles).

use crate::apply::ApplyResult;
use crate::auth::{AuthError, AuthInfo, TokenProvider};
use crate::error::ServerError;
use crate::server::EtcdServer;
use retcd_api::etcdserverpb::auth_server::Auth;
use retcd_api::etcdserverpb::*;
use retcd_api::retcdpb::{
    auth_request::Op, AuthAuthenticate, AuthRequest, AuthUserAdd, AuthUserChangePassword,
    InternalRaftRequest,
};
use std::sync::Arc;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

pub struct AuthService {
    pub server: Arc<EtcdServer>,
}

/// bcrypt on a blocking thread (cost 10 is tens of milliseconds of CPU);
/// etcd stores `$2a$` hashes, so do we.
async fn hash_password(password: String, cost: u32) -> Result<Vec<u8>, Status> {
    tokio::task::spawn_blocking(move || {
        bcrypt::hash_with_result(password, cost)
            .map(|h| h.format_for_version(bcrypt::Version::TwoA).into_bytes())
    })
    .await
    .map_err(|e| Status::internal(e.to_string()))?
    .map_err(|e| Status::internal(format!("failed to hash the password: {e}")))
}

impl AuthService {
    fn header(&self) -> Option<ResponseHeader> {
        Some(self.server.header(self.server.kv.current_revision()))
    }

    /// Proposes one auth change on behalf of the request's user.
    async fn change(&self, md: &MetadataMap, op: Op) -> Result<Option<String>, Status> {
        let who = self.server.auth_info(md)?;
        let req = InternalRaftRequest {
            auth: Some(AuthRequest { op: Some(op) }),
            ..Default::default()
        };
        match self.server.propose_as(req, who).await? {
            ApplyResult::Auth(token) => Ok(token),
            ApplyResult::Err(e) => Err(e.into()),
            other => Err(Status::internal(format!(
                "retcd: unexpected apply result {other:?}"
            ))),
        }
    }

    /// The requester, after a linearizable read barrier (reads of the auth
    /// store see every change applied before the call).
    async fn reader(&self, md: &MetadataMap) -> Result<Option<AuthInfo>, Status> {
        let who = self.server.auth_info(md)?;
        self.server.linearizable_read_notify().await?;
        Ok(who)
    }

    fn admin(&self, who: &Option<AuthInfo>) -> Result<(), Status> {
        self.server
            .shared
            .auth
            .check_admin(who.as_ref())
            .map_err(|e| ServerError::from(e).into())
    }
}

fn auth_err(e: AuthError) -> Status {
    ServerError::from(e).into()
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_enable(
        &self,
        request: Request<AuthEnableRequest>,
    ) -> Result<Response<AuthEnableResponse>, Status> {
        let (md, _, r) = request.into_parts();
        self.change(&md, Op::Enable(r)).await?;
        Ok(Response::new(AuthEnableResponse {
            header: self.header(),
        }))
    }

    async fn auth_disable(
        &self,
        request: Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        let (md, _, r) = request.into_parts();
        self.change(&md, Op::Disable(r)).await?;
        Ok(Response::new(AuthDisableResponse {
            header: self.header(),
        }))
    }

    async fn auth_status(
        &self,
        _request: Request<AuthStatusRequest>,
    ) -> Result<Response<AuthStatusResponse>, Status> {
        self.server.linearizable_read_notify().await?;
        let auth = &self.server.shared.auth;
        Ok(Response::new(AuthStatusResponse {
            header: self.header(),
            enabled: auth.is_enabled(),
            auth_revision: auth.revision(),
        }))
    }

    /// etcd's flow: check the password here (outside raft, off the
    /// runtime), then propose the user with a fresh token prefix; if the
    /// auth store changed meanwhile, check again.
    async fn authenticate(
        &self,
        request: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        let (md, _, r) = request.into_parts();
        self.server.linearizable_read_notify().await?;
        let auth = &self.server.shared.auth;
        loop {
            let (hash, checked_rev) = auth.password_hash(&r.name).map_err(auth_err)?;
            let password = r.password.clone();
            let ok = tokio::task::spawn_blocking(move || {
                let hash = String::from_utf8_lossy(&hash).into_owned();
                bcrypt::verify(password, &hash).unwrap_or(false)
            })
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
            if !ok {
                return Err(auth_err(AuthError::AuthFailed));
            }
            let simple_token = match auth.provider {
                TokenProvider::Simple { .. } => crate::auth::token_prefix(),
                TokenProvider::Jwt { .. } => String::new(),
            };
            let op = Op::Authenticate(AuthAuthenticate {
                name: r.name.clone(),
                simple_token,
            });
            let token = match self.change(&md, op).await? {
                Some(simple) => simple,
                None => {
                    // JWT: signed here once the entry applied (RSA signing
                    // is a millisecond of CPU: off the runtime).
                    let server = self.server.clone();
                    let name = r.name.clone();
                    tokio::task::spawn_blocking(move || {
                        let auth = &server.shared.auth;
                        auth.provider.sign_jwt(&name, auth.revision())
                    })
                    .await
                    .map_err(|e| Status::internal(e.to_string()))?
                    .map_err(auth_err)?
                }
            };
            if auth.revision() == checked_rev {
                return Ok(Response::new(AuthenticateResponse {
                    header: self.header(),
                    token,
                }));
            }
        }
    }

    async fn user_add(
        &self,
        request: Request<AuthUserAddRequest>,
    ) -> Result<Response<AuthUserAddResponse>, Status> {
        let (md, _, r) = request.into_parts();
        let no_password = r.options.as_ref().is_some_and(|o| o.no_password);
        let hashed_password = if no_password {
            Vec::new()
        } else {
            hash_password(r.password, self.server.cfg.bcrypt_cost).await?
        };
        let op = Op::UserAdd(AuthUserAdd {
            name: r.name,
            hashed_password,
            options: r.options,
        });
        self.change(&md, op).await?;
        Ok(Response::new(AuthUserAddResponse {
            header: self.header(),
        }))
    }

    async fn user_get(
        &self,
        request: Request<AuthUserGetRequest>,
    ) -> Result<Response<AuthUserGetResponse>, Status> {
        let (md, _, r) = request.into_parts();
        let who = self.reader(&md).await?;
        let own = who.as_ref().is_some_and(|w| w.username == r.name);
        if !own {
            self.admin(&who)?;
        }
        let user = self.server.shared.auth.user(&r.name).map_err(auth_err)?;
        Ok(Response::new(AuthUserGetResponse {
            header: self.header(),
            roles: user.roles,
        }))
    }

    async fn user_list(
        &self,
        request: Request<AuthUserListRequest>,
    ) -> Result<Response<AuthUserListResponse>, Status> {
        let who = self.reader(request.metadata()).await?;
        self.admin(&who)?;
        Ok(Response::new(AuthUserListResponse {
            header: self.header(),
            users: self.server.shared.auth.user_names(),
        }))
    }

    async fn user_delete(
        &self,
        request: Request<AuthUserDeleteRequest>,
    ) -> Result<Response<AuthUserDeleteResponse>, Status> {
        let (md, _, r) = request.into_parts();
        self.change(&md, Op::UserDelete(r)).await?;
        Ok(Response::new(AuthUserDeleteResponse {
            header: self.header(),
        }))
    }

    async fn user_change_password(
        &self,
        request: Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        let (md, _, r) = request.into_parts();
        let op = Op::UserChangePassword(AuthUserChangePassword {
            name: r.name,
            hashed_password: hash_password(r.password, self.server.cfg.bcrypt_cost).await?,
        });
        self.change(&md, op).await?;
        Ok(Response::new(AuthUserChangePasswordResponse {
            header: self.header(),
        }))
    }

    async fn user_grant_role(
        &self,
        request: Request<AuthUserGrantRoleRequest>,
    ) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        let (md, _, r) = request.into_parts();
        self.change(&md, Op::UserGrantRole(r)).await?;
        Ok(Response::new(AuthUserGrantRoleResponse {
            header: self.header(),
        }))
    }

    async fn user_revoke_role(
        &self,
        request: Request<AuthUserRevokeRoleRequest>,
    ) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        let (md, _, r) = request.into_parts();
        self.change(&md, Op::UserRevokeRole(r)).await?;
        Ok(Response::new(AuthUserRevokeRoleResponse {
            header: self.header(),
        }))
    }

    async fn role_add(
        &self,
        request: Request<AuthRoleAddRequest>,
    ) -> Result<Response<AuthRoleAddResponse>, Status> {
        let (md, _, r) = request.into_parts();
        self.change(&md, Op::RoleAdd(r)).await?;
        Ok(Response::new(AuthRoleAddResponse {
            header: self.header(),
        }))
    }

    async fn role_get(
        &self,
        request: Request<AuthRoleGetRequest>,
    ) -> Result<Response<AuthRoleGetResponse>, Status> {
        let (md, _, r) = request.into_parts();
        let who = self.reader(&md).await?;
        let own = who
            .as_ref()
            .is_some_and(|w| self.server.shared.auth.has_role(&w.username, &r.role));
        if !own {
            self.admin(&who)?;
        }
        let role = self.server.shared.auth.role(&r.role).map_err(auth_err)?;
        Ok(Response::new(AuthRoleGetResponse {
            header: self.header(),
            perm: role.key_permission,
        }))
    }

    async fn role_list(
        &self,
        request: Request<AuthRoleListRequest>,
    ) -> Result<Response<AuthRoleListResponse>, Status> {
        let who = self.reader(request.metadata()).await?;
        self.admin(&who)?;
        Ok(Response::new(AuthRoleListResponse {
            header: self.header(),
            roles: self.server.shared.auth.role_names(),
        }))
    }

    async fn role_delete(
        &self,
        request: Request<AuthRoleDeleteRequest>,
    ) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        let (md, _, r) = request.into_parts();
        self.change(&md, Op::RoleDelete(r)).await?;
        Ok(Response::new(AuthRoleDeleteResponse {
            header: self.header(),
        }))
    }

    async fn role_grant_permission(
        &self,
        request: Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        let (md, _, r) = request.into_parts();
        self.change(&md, Op::RoleGrantPermission(r)).await?;
        Ok(Response::new(AuthRoleGrantPermissionResponse {
            header: self.header(),
        }))
    }

    async fn role_revoke_permission(
        &self,
        request: Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        let (md, _, r) = request.into_parts();
        self.change(&md, Op::RoleRevokePermission(r)).await?;
        Ok(Response::new(AuthRoleRevokePermissionResponse {
            header: self.header(),
        }))
    }
}
