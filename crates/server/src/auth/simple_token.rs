//! Simple tokens (etcd's `--auth-token simple`, the default,
//! `auth/simple_token.go`): `Authenticate` checks the password on the
//! member that takes it, then proposes the user name with a random
//! 16-letter prefix; every member registers `prefix.index` (the raft index)
//! for the user. A token lives `--auth-token-ttl` after its last use, is
//! dropped when its user is deleted or changes password, and every token is
//! dropped when auth is disabled. Tokens are kept in memory only, as in
//! etcd: after a restart clients authenticate again.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A registered token.
#[derive(Debug)]
struct Token {
    user: String,
    expires: Instant,
}

/// The registered simple tokens of this member.
#[derive(Debug)]
pub struct SimpleTokens {
    ttl: Duration,
    /// Protects the tokens by token string. Locked briefly, never across
    /// I/O; taken after the auth store's `state` when both are held.
    tokens: Mutex<HashMap<String, Token>>,
}

impl SimpleTokens {
    pub fn new(ttl: Duration) -> SimpleTokens {
        SimpleTokens {
            ttl,
            tokens: Mutex::new(HashMap::new()),
        }
    }

    /// Registers `token` for `user` (an applied Authenticate).
    pub fn register(&self, token: String, user: &str) {
        self.tokens.lock().insert(
            token,
            Token {
                user: user.to_string(),
                expires: Instant::now() + self.ttl,
            },
        );
    }

    /// The user `token` names, if it is registered and not expired; a good
    /// token lives another TTL from now, an expired one is dropped.
    pub fn user(&self, token: &str) -> Option<String> {
        let mut tokens = self.tokens.lock();
        let now = Instant::now();
        match tokens.get_mut(token) {
            Some(t) if t.expires > now => {
                t.expires = now + self.ttl;
                Some(t.user.clone())
            }
            Some(_) => {
                tokens.remove(token);
                None
            }
            None => None,
        }
    }

    /// Drops every token of `user` (deleted, or its password changed).
    pub fn drop_user(&self, user: &str) {
        self.tokens.lock().retain(|_, t| t.user != user);
    }

    /// Drops every token (auth disabled).
    pub fn clear(&self) {
        self.tokens.lock().clear();
    }
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

    #[test]
    fn test_simple_token_lifetime() {
        let t = SimpleTokens::new(Duration::from_millis(200));
        t.register("a.1".into(), "bob");
        t.register("b.2".into(), "alice");
        assert_eq!(t.user("a.1").as_deref(), Some("bob"));
        assert_eq!(t.user("nope"), None);
        t.drop_user("bob");
        assert_eq!(t.user("a.1"), None);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(t.user("b.2"), None, "expired after its TTL");
        let p = token_prefix();
        assert_eq!(p.len(), 16);
        assert!(p.chars().all(|c| c.is_ascii_alphabetic()));
    }
}
