//! etcdserverpb.Auth: users, roles, permissions, enable/disable and
//! Authenticate (the flows are `server::auth`).

use crate::api::credentials;
use crate::server::EtcdServer;
use retcd_api::etcdserverpb::auth_server::Auth;
use retcd_api::etcdserverpb::*;
use retcd_api::retcdpb::auth_request::Op;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct AuthService {
    pub server: Arc<EtcdServer>,
}

impl AuthService {
    fn header(&self) -> Option<ResponseHeader> {
        self.server.current_header()
    }

    /// Proposes the auth change `op(request)` on behalf of its caller.
    async fn change<R>(&self, request: Request<R>, op: impl FnOnce(R) -> Op) -> Result<(), Status> {
        let (md, _, r) = request.into_parts();
        let creds = credentials(&self.server, &md);
        self.server.auth_change(op(r), &creds).await?;
        Ok(())
    }
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_enable(
        &self,
        request: Request<AuthEnableRequest>,
    ) -> Result<Response<AuthEnableResponse>, Status> {
        self.change(request, Op::Enable).await?;
        Ok(Response::new(AuthEnableResponse {
            header: self.header(),
        }))
    }

    async fn auth_disable(
        &self,
        request: Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        self.change(request, Op::Disable).await?;
        Ok(Response::new(AuthDisableResponse {
            header: self.header(),
        }))
    }

    async fn auth_status(
        &self,
        request: Request<AuthStatusRequest>,
    ) -> Result<Response<AuthStatusResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        let (enabled, auth_revision) = self.server.auth_status(&creds).await?;
        Ok(Response::new(AuthStatusResponse {
            header: self.header(),
            enabled,
            auth_revision,
        }))
    }

    async fn authenticate(
        &self,
        request: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        // the metadata's token, if any, is not looked at (etcd 3.5)
        let r = request.into_inner();
        let token = self.server.authenticate(&r.name, &r.password).await?;
        Ok(Response::new(AuthenticateResponse {
            header: self.header(),
            token,
        }))
    }

    async fn user_add(
        &self,
        request: Request<AuthUserAddRequest>,
    ) -> Result<Response<AuthUserAddResponse>, Status> {
        let (md, _, r) = request.into_parts();
        let creds = credentials(&self.server, &md);
        self.server
            .user_add(r.name, r.password, r.options, &creds)
            .await?;
        Ok(Response::new(AuthUserAddResponse {
            header: self.header(),
        }))
    }

    async fn user_get(
        &self,
        request: Request<AuthUserGetRequest>,
    ) -> Result<Response<AuthUserGetResponse>, Status> {
        let (md, _, r) = request.into_parts();
        let creds = credentials(&self.server, &md);
        let roles = self.server.user_get(&r.name, &creds).await?;
        Ok(Response::new(AuthUserGetResponse {
            header: self.header(),
            roles,
        }))
    }

    async fn user_list(
        &self,
        request: Request<AuthUserListRequest>,
    ) -> Result<Response<AuthUserListResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        let users = self.server.user_list(&creds).await?;
        Ok(Response::new(AuthUserListResponse {
            header: self.header(),
            users,
        }))
    }

    async fn user_delete(
        &self,
        request: Request<AuthUserDeleteRequest>,
    ) -> Result<Response<AuthUserDeleteResponse>, Status> {
        self.change(request, Op::UserDelete).await?;
        Ok(Response::new(AuthUserDeleteResponse {
            header: self.header(),
        }))
    }

    async fn user_change_password(
        &self,
        request: Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        let (md, _, r) = request.into_parts();
        let creds = credentials(&self.server, &md);
        self.server
            .user_change_password(r.name, r.password, r.hashed_password, &creds)
            .await?;
        Ok(Response::new(AuthUserChangePasswordResponse {
            header: self.header(),
        }))
    }

    async fn user_grant_role(
        &self,
        request: Request<AuthUserGrantRoleRequest>,
    ) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        self.change(request, Op::UserGrantRole).await?;
        Ok(Response::new(AuthUserGrantRoleResponse {
            header: self.header(),
        }))
    }

    async fn user_revoke_role(
        &self,
        request: Request<AuthUserRevokeRoleRequest>,
    ) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        self.change(request, Op::UserRevokeRole).await?;
        Ok(Response::new(AuthUserRevokeRoleResponse {
            header: self.header(),
        }))
    }

    async fn role_add(
        &self,
        request: Request<AuthRoleAddRequest>,
    ) -> Result<Response<AuthRoleAddResponse>, Status> {
        self.change(request, Op::RoleAdd).await?;
        Ok(Response::new(AuthRoleAddResponse {
            header: self.header(),
        }))
    }

    async fn role_get(
        &self,
        request: Request<AuthRoleGetRequest>,
    ) -> Result<Response<AuthRoleGetResponse>, Status> {
        let (md, _, r) = request.into_parts();
        let creds = credentials(&self.server, &md);
        let perm = self.server.role_get(&r.role, &creds).await?;
        Ok(Response::new(AuthRoleGetResponse {
            header: self.header(),
            perm,
        }))
    }

    async fn role_list(
        &self,
        request: Request<AuthRoleListRequest>,
    ) -> Result<Response<AuthRoleListResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        let roles = self.server.role_list(&creds).await?;
        Ok(Response::new(AuthRoleListResponse {
            header: self.header(),
            roles,
        }))
    }

    async fn role_delete(
        &self,
        request: Request<AuthRoleDeleteRequest>,
    ) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        self.change(request, Op::RoleDelete).await?;
        Ok(Response::new(AuthRoleDeleteResponse {
            header: self.header(),
        }))
    }

    async fn role_grant_permission(
        &self,
        request: Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        self.change(request, Op::RoleGrantPermission).await?;
        Ok(Response::new(AuthRoleGrantPermissionResponse {
            header: self.header(),
        }))
    }

    async fn role_revoke_permission(
        &self,
        request: Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        self.change(request, Op::RoleRevokePermission).await?;
        Ok(Response::new(AuthRoleRevokePermissionResponse {
            header: self.header(),
        }))
    }
}
