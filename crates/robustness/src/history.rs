//! What a robustness run records: every client operation with its call and
//! return time and its outcome, where a timeout or a connection error is an
//! *unknown* outcome (the write may or may not have happened).

use std::fmt;

use serde::{Deserialize, Serialize};

/// A key-value pair as a response (or a watch event) shows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Kv {
    pub key: String,
    pub value: String,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub lease: i64,
}

/// A request of the traffic generator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Linearizable single-key `Range`.
    Get { key: String },
    /// Linearizable `Range` over a prefix.
    Range { prefix: String },
    /// `Put` (with a lease when `lease != 0`).
    Put {
        key: String,
        value: String,
        lease: i64,
    },
    /// `DeleteRange` of one key.
    Delete { key: String },
    /// `Txn`: if `mod_revision(key) == expected` then `put(key, value)` else `get(key)`.
    Cas {
        key: String,
        expected_mod_rev: i64,
        value: String,
    },
    /// `LeaseGrant` with a client-chosen ID (long TTL: it never expires in a run).
    LeaseGrant { id: i64 },
    /// `LeaseRevoke` (deletes the attached keys in one revision).
    LeaseRevoke { id: i64 },
}

/// A response as the model predicts it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    Get {
        kv: Option<Kv>,
        rev: i64,
    },
    Range {
        kvs: Vec<Kv>,
        rev: i64,
    },
    Put {
        rev: i64,
    },
    Delete {
        deleted: i64,
        rev: i64,
    },
    Cas {
        succeeded: bool,
        kv: Option<Kv>,
        rev: i64,
    },
    LeaseGrant {
        rev: i64,
    },
    LeaseRevoke {
        rev: i64,
    },
    /// A definite failure: the request had no effect (e.g. `lease not found`).
    LeaseNotFound,
}

/// One operation of the history. Times are nanoseconds since the start of
/// the run, taken on one clock. `ret == None` is an unknown outcome: the
/// operation may take effect at any point after `call`, or never;
/// `resp == None` with `ret == Some(t)`: it took effect before `t` or never
/// (bounded by [`crate::patch`]). `ret == Some(u64::MAX)` with a response:
/// it took effect (known from the watch history) at some point after `call`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Operation {
    pub client: usize,
    pub req: Request,
    pub call: u64,
    pub ret: Option<u64>,
    pub resp: Option<Response>,
}

impl Operation {
    pub fn is_write(&self) -> bool {
        !matches!(self.req, Request::Get { .. } | Request::Range { .. })
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |t: u64| t as f64 / 1e6;
        match self.ret {
            Some(r) if self.resp.is_some() => write!(
                f,
                "c{} [{:.3}ms..{:.3}ms] {:?} -> {:?}",
                self.client,
                ms(self.call),
                ms(r),
                self.req,
                self.resp
            ),
            None => write!(
                f,
                "c{} [{:.3}ms..?] {:?} -> unknown",
                self.client,
                ms(self.call),
                self.req
            ),
            Some(r) => write!(
                f,
                "c{} [{:.3}ms..{:.3}ms?] {:?} -> unknown (took effect before {:.3}ms or never)",
                self.client,
                ms(self.call),
                ms(r),
                self.req,
                ms(r)
            ),
        }
    }
}

/// A serializable (stale) read of one key from one member: it must equal
/// the state at the revision in its header (checked against the watch
/// ground truth, not for linearizability).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StaleRead {
    pub member: usize,
    pub key: String,
    pub rev: i64,
    pub kv: Option<Kv>,
}

/// Everything a run recorded.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct History {
    pub ops: Vec<Operation>,
    pub stale_reads: Vec<StaleRead>,
    /// Revisions compactions were requested at (whatever the outcome).
    pub compactions: Vec<i64>,
}

impl History {
    /// Writes whose outcome is known to have succeeded.
    pub fn acknowledged_writes(&self) -> impl Iterator<Item = &Operation> {
        self.ops
            .iter()
            .filter(|o| o.is_write() && o.resp.is_some() && o.resp != Some(Response::LeaseNotFound))
    }
}
