//! How tokens are made and checked (`--auth-token`): simple tokens
//! ([`super::simple_token`]) or JWTs ([`super::jwt`]).

use super::jwt::Jwt;
use super::simple_token::SimpleTokens;
use std::collections::HashMap;
use std::time::Duration;

#[derive(Debug)]
pub enum TokenProvider {
    /// Random tokens registered on every member through raft.
    Simple(SimpleTokens),
    /// Signed JSON web tokens, verified by any member without shared state.
    Jwt(Jwt),
    /// `--auth-token=''`: etcd's `tokenNop`. No token is ever given
    /// (Authenticate fails as a bad password would) and none is valid.
    Nop,
}

impl TokenProvider {
    /// Parses etcd's `--auth-token` value: `simple`, `jwt,` followed by its
    /// options (see [`Jwt::from_opts`]), or no type at all (`Nop`).
    /// `simple_ttl` is `--auth-token-ttl`.
    pub fn from_flag(opt: &str, simple_ttl: Duration) -> Result<TokenProvider, String> {
        // etcd's decomposeOpts: `type,k=v,...`, each option exactly one
        // `=`, no option twice, nothing trimmed.
        let mut parts = opt.split(',');
        let kind = parts.next().unwrap_or_default();
        let mut opts = HashMap::new();
        for p in parts {
            let bad =
                |why: &str| format!("auth: invalid auth options ({why} {p:?} in --auth-token)");
            let (k, v) = match p.split('=').collect::<Vec<_>>()[..] {
                [k, v] => (k, v),
                _ => return Err(bad("option")),
            };
            if opts.insert(k, v).is_some() {
                return Err(bad("duplicate option"));
            }
        }
        match kind {
            "simple" => Ok(TokenProvider::Simple(SimpleTokens::new(simple_ttl))),
            "jwt" => Jwt::from_opts(&opts).map(TokenProvider::Jwt),
            "" => Ok(TokenProvider::Nop),
            other => Err(format!(
                "auth: invalid auth options (unknown token type {other:?} in --auth-token)"
            )),
        }
    }
}
