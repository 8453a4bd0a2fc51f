//! The model the histories are checked against: etcd's key space with
//! revisions and leases.
//!
//! A state is the store revision, every live key with its
//! `create/mod_revision`, `version` and lease, and every live lease with its
//! keys. A step takes a request and, when known, the response the server
//! gave; it returns the next state if that response is possible from this
//! state. Example: from `{rev 5, a=x@4}`, `Put(a, y)` answered `rev 6` gives
//! `{rev 6, a=y@6 (create 4, version 2)}`; answered `rev 7` it is rejected
//! (a revision was skipped or another write is missing).
//!
//! An unknown outcome, when the search linearizes it, took effect there
//! (with whatever response); "it never happened" is the search's business
//! (it leaves the operation out). Reads only filter.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::history::{Kv, Request, Response};

#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct KvState {
    pub rev: i64,
    pub keys: BTreeMap<String, Kv>,
    pub leases: BTreeMap<i64, BTreeSet<String>>,
}

impl KvState {
    /// An empty store at revision `rev` (a new etcd cluster starts at 1).
    pub fn new(rev: i64) -> KvState {
        KvState {
            rev,
            ..Default::default()
        }
    }

    pub fn hash64(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.hash(&mut h);
        h.finish()
    }

    fn detach(&mut self, key: &str) {
        if let Some(old) = self.keys.get(key) {
            if old.lease != 0 {
                if let Some(ks) = self.leases.get_mut(&old.lease) {
                    ks.remove(key);
                }
            }
        }
    }

    fn put(&mut self, key: &str, value: &str, lease: i64) {
        self.rev += 1;
        self.detach(key);
        let (create, version) = match self.keys.get(key) {
            Some(old) => (old.create_revision, old.version + 1),
            None => (self.rev, 1),
        };
        self.keys.insert(
            key.to_string(),
            Kv {
                key: key.to_string(),
                value: value.to_string(),
                create_revision: create,
                mod_revision: self.rev,
                version,
                lease,
            },
        );
        if lease != 0 {
            self.leases
                .entry(lease)
                .or_default()
                .insert(key.to_string());
        }
    }

    /// Applies `req` and returns the response etcd gives for it.
    pub fn apply(&mut self, req: &Request) -> Response {
        if let Some(r) = self.peek(req) {
            return r;
        }
        // What is left changes the state (`peek` answers the rest).
        match req {
            Request::Get { .. } | Request::Range { .. } => unreachable!("peek answers reads"),
            Request::Put { key, value, lease } => {
                self.put(key, value, *lease);
                Response::Put { rev: self.rev }
            }
            Request::Delete { key } => {
                self.rev += 1;
                self.detach(key);
                self.keys.remove(key);
                Response::Delete {
                    deleted: 1,
                    rev: self.rev,
                }
            }
            Request::Cas { key, value, .. } => {
                self.put(key, value, 0);
                Response::Cas {
                    succeeded: true,
                    kv: None,
                    rev: self.rev,
                }
            }
            Request::LeaseGrant { id } => {
                self.leases.entry(*id).or_default();
                Response::LeaseGrant { rev: self.rev }
            }
            Request::LeaseRevoke { id } => {
                let keys = self.leases.remove(id).unwrap_or_default();
                let live: Vec<&String> =
                    keys.iter().filter(|k| self.keys.contains_key(*k)).collect();
                if !live.is_empty() {
                    self.rev += 1;
                    for k in live {
                        self.keys.remove(k);
                    }
                }
                Response::LeaseRevoke { rev: self.rev }
            }
        }
    }

    /// The response to `req` when applying it would leave the state as it
    /// is (a read, a failed compare, a delete of nothing, a grant of a live
    /// lease, "lease not found"), computed without a copy; `None` when
    /// [`Self::apply`] would change the state.
    pub fn peek(&self, req: &Request) -> Option<Response> {
        match req {
            Request::Get { key } => Some(Response::Get {
                kv: self.keys.get(key).cloned(),
                rev: self.rev,
            }),
            Request::Range { .. } => Some(self.range_response(req)),
            Request::Put { lease, .. } => {
                (*lease != 0 && !self.leases.contains_key(lease)).then_some(Response::LeaseNotFound)
            }
            Request::Delete { key } => (!self.keys.contains_key(key)).then_some(Response::Delete {
                deleted: 0,
                rev: self.rev,
            }),
            Request::Cas {
                key,
                expected_mod_rev,
                ..
            } => {
                let kv = self.keys.get(key);
                (kv.map_or(0, |k| k.mod_revision) != *expected_mod_rev).then(|| Response::Cas {
                    succeeded: false,
                    kv: kv.cloned(),
                    rev: self.rev,
                })
            }
            Request::LeaseGrant { id } => self
                .leases
                .contains_key(id)
                .then_some(Response::LeaseGrant { rev: self.rev }),
            Request::LeaseRevoke { id } => {
                (!self.leases.contains_key(id)).then_some(Response::LeaseNotFound)
            }
        }
    }

    fn range_response(&self, req: &Request) -> Response {
        let Request::Range { prefix } = req else {
            unreachable!("a range")
        };
        Response::Range {
            kvs: self
                .keys
                .range(prefix.clone()..)
                .take_while(|(k, _)| k.starts_with(prefix.as_str()))
                .map(|(_, v)| v.clone())
                .collect(),
            rev: self.rev,
        }
    }

    /// The successor states of `self` for `req` answered `resp`
    /// (`None` = unknown outcome, taking effect now), pushed into `out`.
    pub fn step(&self, req: &Request, resp: Option<&Response>, out: &mut Vec<KvState>) {
        if let Some(r) = self.peek(req) {
            // Nothing changes (an unknown outcome that took effect here
            // changed nothing either).
            if resp.is_none_or(|resp| *resp == r) {
                out.push(self.clone());
            }
            return;
        }
        let mut next = self.clone();
        let r = next.apply(req);
        if resp.is_none_or(|resp| *resp == r) {
            out.push(next);
        }
    }
}

/// A set of possible states (the model is non-deterministic because of
/// unknown outcomes), kept sorted by hash and without duplicates.
#[derive(Debug, Clone)]
pub struct StateSet {
    pub states: Vec<(u64, KvState)>,
}

impl StateSet {
    pub fn single(s: KvState) -> StateSet {
        StateSet {
            states: vec![(s.hash64(), s)],
        }
    }

    /// All successors; `None` when the response is impossible from every state.
    pub fn step(&self, req: &Request, resp: Option<&Response>) -> Option<StateSet> {
        let mut out = Vec::new();
        for (_, s) in &self.states {
            s.step(req, resp, &mut out);
        }
        if out.is_empty() {
            return None;
        }
        let mut states: Vec<(u64, KvState)> = out.into_iter().map(|s| (s.hash64(), s)).collect();
        states.sort_by_key(|(h, _)| *h);
        states.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
        Some(StateSet { states })
    }

    pub fn hash64(&self) -> u64 {
        let mut h = DefaultHasher::new();
        for (x, _) in &self.states {
            x.hash(&mut h);
        }
        h.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    #[test]
    fn peek_answers_exactly_the_requests_that_change_nothing() {
        let mut rng = StdRng::seed_from_u64(5);
        let key = |rng: &mut StdRng| format!("k{}", rng.random_range(0..4));
        let mut st = KvState::new(1);
        let (mut same, mut changed) = (0, 0);
        for i in 0..5000 {
            let req = match rng.random_range(0..7) {
                0 => Request::Get { key: key(&mut rng) },
                1 => Request::Range { prefix: "k".into() },
                2 => Request::Put {
                    key: key(&mut rng),
                    value: format!("v{i}"),
                    lease: rng.random_range(0..3),
                },
                3 => Request::Delete { key: key(&mut rng) },
                4 => Request::Cas {
                    key: key(&mut rng),
                    expected_mod_rev: rng.random_range(0..=st.rev),
                    value: format!("v{i}"),
                },
                5 => Request::LeaseGrant {
                    id: rng.random_range(1..3),
                },
                _ => Request::LeaseRevoke {
                    id: rng.random_range(1..3),
                },
            };
            let before = st.clone();
            let peeked = st.peek(&req);
            let resp = st.apply(&req);
            match peeked {
                Some(r) => {
                    assert_eq!(r, resp, "{req:?} from {before:?}");
                    assert_eq!(st, before, "{req:?} changed the state");
                    same += 1;
                }
                None => {
                    assert_ne!(st, before, "{req:?} changed nothing");
                    changed += 1;
                }
            }
            // step() agrees: the answered response is accepted, another is not.
            let mut out = Vec::new();
            before.step(&req, Some(&resp), &mut out);
            assert_eq!(out, vec![st.clone()]);
            out.clear();
            before.step(&req, Some(&Response::Put { rev: -1 }), &mut out);
            assert!(out.is_empty());
        }
        assert!(same > 1000 && changed > 1000, "{same} {changed}");
    }
}
