//! Auth errors, with etcd's wire texts (`rpctypes`); `api::error_map`
//! gives them etcd's codes.

use std::sync::Arc;

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
    #[error("etcdserver: permission not given")]
    PermissionNotGiven,
    #[error("etcdserver: invalid auth management")]
    InvalidAuthMgmt,
    #[error("etcdserver: revision of auth store is old")]
    AuthOldRevision,
    /// Not in etcd's rpctypes table: Unknown with the auth package's text.
    #[error("auth: token signing attempted with verify-only key")]
    VerifyOnly,
    /// The backend failed under an auth change or load (the cause kept).
    #[error("auth: {0}")]
    Backend(BackendError),
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
            AuthError::PermissionNotGiven => "auth: permission not given".into(),
            other => other.to_string(),
        }
    }
}

/// A backend (redb) failure under the auth store, kept as the error's
/// source. Compared by its text (so `AuthError` stays `Eq` for tests).
#[derive(Debug, Clone)]
pub struct BackendError(Arc<dyn std::error::Error + Send + Sync + 'static>);

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.0.as_ref())
    }
}

impl PartialEq for BackendError {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_string() == other.0.to_string()
    }
}

impl Eq for BackendError {}

/// `AuthError::Backend` caused by `e`.
pub(crate) fn backend_err(e: impl std::error::Error + Send + Sync + 'static) -> AuthError {
    AuthError::Backend(BackendError(Arc::new(e)))
}
