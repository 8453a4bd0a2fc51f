//! JWT tokens (`--auth-token jwt,...`, etcd's `auth/jwt.go`): the member
//! that takes an Authenticate signs `{username, revision, exp}` once the
//! entry applied; every member verifies them with the public key, so they
//! need no shared state and survive restarts. A token issued before an auth
//! change fails with "revision of auth store is old" and the client
//! authenticates again.

use super::{AuthError, AuthInfo};
use std::collections::HashMap;
use std::time::Duration;

/// A JWT signer/verifier. Without a private key the member only verifies.
pub struct Jwt {
    alg: jsonwebtoken::Algorithm,
    sign: Option<jsonwebtoken::EncodingKey>,
    verify: jsonwebtoken::DecodingKey,
    ttl: Duration,
}

impl std::fmt::Debug for Jwt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "jwt({:?}, ttl={:?})", self.alg, self.ttl)
    }
}

/// etcd's claims.
#[derive(serde::Serialize, serde::Deserialize)]
struct JwtClaims {
    username: String,
    revision: u64,
    exp: i64,
}

impl Jwt {
    /// From the `--auth-token jwt,...` options: `sign-method=`, `pub-key=`,
    /// `priv-key=` (PEM files; for HS* the private key file is the secret)
    /// and `ttl=` (default 5m).
    pub fn from_opts(opts: &HashMap<&str, &str>) -> Result<Jwt, String> {
        use jsonwebtoken::{Algorithm as A, DecodingKey, EncodingKey};
        // etcd's jwtOptions.Parse: a bad ttl, a key file it cannot read
        // or a sign method it does not know all fail as
        // ErrInvalidAuthOpts (the detail is only logged).
        let invalid = |why: String| format!("auth: invalid auth options ({why})");
        let ttl = match opts.get("ttl").filter(|t| !t.is_empty()) {
            Some(t) => crate::config::parse_duration(t).map_err(invalid)?,
            None => Duration::from_secs(300),
        };
        let read = |k: &str| -> Result<Option<Vec<u8>>, String> {
            opts.get(k)
                .filter(|path| !path.is_empty())
                .map(|path| std::fs::read(path).map_err(|e| invalid(format!("{k} {path}: {e}"))))
                .transpose()
        };
        let (public, private) = (read("pub-key")?, read("priv-key")?);
        let method = opts.get("sign-method").copied().unwrap_or_default();
        let alg: A = method.parse().map_err(|_| {
            invalid(format!(
                "auth: invalid auth signature method {method:?} in --auth-token"
            ))
        })?;
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
        Ok(Jwt {
            alg,
            sign,
            verify,
            ttl,
        })
    }

    /// A signed token for `username` at auth `revision`.
    pub fn sign(&self, username: &str, revision: u64) -> Result<String, AuthError> {
        let key = self.sign.as_ref().ok_or(AuthError::VerifyOnly)?;
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            + self.ttl;
        let claims = JwtClaims {
            username: username.to_string(),
            revision,
            exp: exp.as_secs() as i64,
        };
        jsonwebtoken::encode(&jsonwebtoken::Header::new(self.alg), &claims, key)
            .map_err(super::error::backend_err)
    }

    /// Who a token names, if its signature and expiry are good.
    pub fn verify(&self, token: &str) -> Option<AuthInfo> {
        let mut v = jsonwebtoken::Validation::new(self.alg);
        v.leeway = 0;
        let data = jsonwebtoken::decode::<JwtClaims>(token, &self.verify, &v).ok()?;
        Some(AuthInfo {
            username: data.claims.username,
            revision: data.claims.revision,
        })
    }
}
