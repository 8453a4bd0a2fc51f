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
}

impl TokenProvider {
    /// Parses etcd's `--auth-token` value: `simple`, or `jwt,` followed by
    /// its options (see [`Jwt::from_opts`]). `simple_ttl` is
    /// `--auth-token-ttl`.
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
            "simple" => Ok(TokenProvider::Simple(SimpleTokens::new(simple_ttl))),
            "jwt" => Jwt::from_opts(&opts).map(TokenProvider::Jwt),
            other => Err(format!(
                "auth: invalid auth options (unknown token type {other:?} in --auth-token)"
            )),
        }
    }
}
