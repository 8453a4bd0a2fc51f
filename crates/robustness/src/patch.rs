//! Patching a history with the watch history before the linearizability
//! search, as etcd's robustness suite does (`validate/patch_history.go`),
//! and further.
//!
//! When the watch checks pass, the merged watch history is the **truth**:
//! every revision from the first traffic revision to the final one, with
//! its events (every write that changes the store changes a key under the
//! watched prefix, and the watchers saw every revision). From it:
//!
//! * the key space at every revision ([`Truth::state_at`]): the search
//!   accepts a write that makes a new revision only if it makes exactly
//!   the truth's state at that revision (an *oracle*: a wrong order dies
//!   at once instead of many steps later);
//! * when each revision had happened at the latest ([`Truth::observed_by`]):
//!   the earliest receipt of a watch response with that revision or a
//!   later one, or return of any response whose header revision is that or
//!   later — whatever made the revision took effect before then. A write
//!   resolved from the watch history gets that as its return time (etcd
//!   does the same with `putReturnTime`), instead of +∞.
//!
//! Unknown outcomes (timeouts, broken connections) are then decided where
//! the evidence decides them, and otherwise bounded:
//!
//! | unknown op | evidence | becomes |
//! |---|---|---|
//! | put / CAS | its unique value in an event at revision R | happened, answered R, returns by `observed_by(R)` |
//! | put / CAS | value never in an event | did not happen (a CAS that failed its compare changed nothing either): dropped |
//! | delete of k / revoke of L | the only op that can explain an unexplained revision R (deletes of exactly k / of L's keys; an answered revoke of L answered R competes too) | happened at R |
//! | delete of k | no unexplained revision deletes just k after its call | changed nothing: dropped |
//! | revoke of L | none of the above | optional: may have removed L (without deleting keys) before the last op that uses L |
//! | grant of L | an answered op needed L (a put with L that succeeded, a successful revoke of L) | optional, but before the first such op returned |
//! | grant of L | nothing succeeded with L | invisible either way: dropped |
//!
//! "Unexplained" revisions are those no operation with a known response
//! claims (puts, CAS and deletes answered with their revision, puts
//! resolved by value). An optional operation (`resp == None`) may take
//! effect once, between its call and its return (`ret`, `None` = never
//! bounded), or not at all; see [`crate::linearizability`].

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::history::{History, Kv, Operation, Request, Response};
use crate::linearizability::response_rev;
use crate::search::{claimed_rev, lease_of};
use crate::watch::{EventKind, WatchEvent, WatchItem, WatchRecord};

/// The watch history as ground truth (see the module doc).
#[derive(Debug, Clone)]
pub struct Truth {
    pub init_rev: i64,
    pub events: BTreeMap<i64, Vec<WatchEvent>>,
    /// `states[i]`: the key space at revision `init_rev + i`.
    states: Vec<BTreeMap<String, Kv>>,
    /// `bound[i]`: revision `init_rev + i` had happened by then (ns; `u64::MAX` unknown).
    bound: Vec<u64>,
}

impl Truth {
    /// The truth from the merged events (`watch::WatchReport::events_by_rev`,
    /// complete from `init_rev + 1`), the watch records (receipt times) and
    /// the history (return times of answered operations).
    pub fn new(
        events: &BTreeMap<i64, Vec<WatchEvent>>,
        watches: &[WatchRecord],
        history: &History,
        init_rev: i64,
    ) -> Truth {
        let last = events.keys().next_back().copied().unwrap_or(init_rev);
        let n = (last - init_rev + 1).max(1) as usize;
        let mut states = Vec::with_capacity(n);
        let mut cur: BTreeMap<String, Kv> = BTreeMap::new();
        states.push(cur.clone());
        for r in init_rev + 1..=last {
            for e in events.get(&r).map(|v| v.as_slice()).unwrap_or(&[]) {
                match e.kind {
                    EventKind::Put => {
                        cur.insert(e.kv.key.clone(), e.kv.clone());
                    }
                    EventKind::Delete => {
                        cur.remove(&e.kv.key);
                    }
                }
            }
            states.push(cur.clone());
        }
        let mut bound = vec![u64::MAX; n];
        let mut note = |rev: i64, t: u64| {
            // A revision above the last watched one bounds every revision.
            let i = (rev.min(last) - init_rev).max(0) as usize;
            bound[i] = bound[i].min(t);
        };
        for w in watches {
            for item in &w.items {
                if let WatchItem::Events { events, time, .. } = item {
                    if *time == 0 {
                        continue; // not recorded
                    }
                    if let Some(r) = events.iter().map(|e| e.kv.mod_revision).max() {
                        note(r, *time);
                    }
                }
            }
        }
        for op in &history.ops {
            if let (Some(resp), Some(ret)) = (&op.resp, op.ret) {
                if ret != u64::MAX {
                    if let Some(r) = response_rev(resp) {
                        if r > init_rev {
                            note(r, ret);
                        }
                    }
                }
            }
        }
        // Revision r happened before any later revision was observed.
        for i in (0..n.saturating_sub(1)).rev() {
            bound[i] = bound[i].min(bound[i + 1]);
        }
        Truth {
            init_rev,
            events: events.clone(),
            states,
            bound,
        }
    }

    /// The last revision of the truth.
    pub fn last_rev(&self) -> i64 {
        self.init_rev + self.states.len() as i64 - 1
    }

    /// The key space at `rev` (`None` outside the truth).
    pub fn state_at(&self, rev: i64) -> Option<&BTreeMap<String, Kv>> {
        if rev < self.init_rev {
            return None;
        }
        self.states.get((rev - self.init_rev) as usize)
    }

    /// The time by which revision `rev` had happened (`u64::MAX` if unknown).
    pub fn observed_by(&self, rev: i64) -> u64 {
        if rev < self.init_rev {
            return 0;
        }
        self.bound
            .get((rev - self.init_rev) as usize)
            .copied()
            .unwrap_or(u64::MAX)
    }

    fn events_at(&self, rev: i64) -> &[WatchEvent] {
        self.events.get(&rev).map(|v| v.as_slice()).unwrap_or(&[])
    }

    /// Revision `rev` consists only of deletes; the deleted keys.
    fn deleted_keys(&self, rev: i64) -> Option<BTreeSet<&str>> {
        let evs = self.events_at(rev);
        if evs.is_empty() || evs.iter().any(|e| e.kind != EventKind::Delete) {
            return None;
        }
        Some(evs.iter().map(|e| e.kv.key.as_str()).collect())
    }
}

/// The history to search: reads with unknown outcomes dropped, unknown
/// writes decided or bounded with the truth (see the module doc).
pub fn patch_history(h: &History, truth: &Truth) -> Vec<Operation> {
    let mut rev_of_value: HashMap<&str, i64> = HashMap::new();
    for (r, evs) in &truth.events {
        for e in evs {
            if e.kind == EventKind::Put {
                rev_of_value.insert(e.kv.value.as_str(), *r);
            }
        }
    }
    let ret_by = |call: u64, rev: i64| -> Option<u64> {
        let t = truth.observed_by(rev);
        Some(if t == u64::MAX { u64::MAX } else { t.max(call) })
    };
    // Pass 1: puts and CAS by value; unknown reads dropped.
    let mut ops: Vec<Operation> = Vec::with_capacity(h.ops.len());
    for op in &h.ops {
        if op.resp.is_some() {
            ops.push(op.clone());
            continue;
        }
        match &op.req {
            Request::Get { .. } | Request::Range { .. } => {}
            Request::Put { value, .. } | Request::Cas { value, .. } => {
                if let Some(&rev) = rev_of_value.get(value.as_str()) {
                    let resp = match op.req {
                        Request::Put { .. } => Response::Put { rev },
                        _ => Response::Cas {
                            succeeded: true,
                            kv: None,
                            rev,
                        },
                    };
                    ops.push(Operation {
                        resp: Some(resp),
                        ret: ret_by(op.call, rev),
                        ..op.clone()
                    });
                }
            }
            _ => ops.push(op.clone()),
        }
    }
    // Pass 2: unexplained revisions and the unknown deletes / revokes that
    // could have made them.
    let mut claimed: BTreeSet<i64> = ops.iter().filter_map(claimed_rev).collect();
    // Unknown deletes and revokes, and answered revokes (which may have
    // made the revision they answered: they compete for it, never resolved).
    let unknown: Vec<usize> = (0..ops.len())
        .filter(|&i| {
            matches!(
                (&ops[i].req, &ops[i].resp),
                (Request::Delete { .. } | Request::LeaseRevoke { .. }, None)
                    | (
                        Request::LeaseRevoke { .. },
                        Some(Response::LeaseRevoke { .. })
                    )
            )
        })
        .collect();
    let mut cands: HashMap<usize, BTreeSet<i64>> = HashMap::new();
    for r in truth.init_rev + 1..=truth.last_rev() {
        if claimed.contains(&r) {
            continue;
        }
        let Some(deleted) = truth.deleted_keys(r) else {
            continue;
        };
        let before = truth.state_at(r - 1).expect("in the truth");
        for &i in &unknown {
            let op = &ops[i];
            if truth.observed_by(r) < op.call {
                continue; // r had happened before the op was sent
            }
            if let Some(Response::LeaseRevoke { rev }) = &op.resp {
                if *rev != r {
                    continue;
                }
            }
            let fits = match &op.req {
                Request::Delete { key } => deleted.len() == 1 && deleted.contains(key.as_str()),
                Request::LeaseRevoke { id } => {
                    let of_lease: BTreeSet<&str> = before
                        .values()
                        .filter(|kv| kv.lease == *id)
                        .map(|kv| kv.key.as_str())
                        .collect();
                    of_lease == deleted
                }
                _ => false,
            };
            if fits {
                cands.entry(i).or_default().insert(r);
            }
        }
    }
    // A revision only one op can explain was made by that op (repeat: each
    // resolution may leave another revision with a single candidate).
    let mut resolved: HashMap<usize, i64> = HashMap::new();
    loop {
        let mut by_rev: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
        for (&i, rs) in &cands {
            for &r in rs {
                by_rev.entry(r).or_default().push(i);
            }
        }
        let Some((&r, &i)) = by_rev
            .iter()
            .find(|(r, is)| is.len() == 1 && !claimed.contains(r))
            .map(|(r, is)| (r, &is[0]))
        else {
            break;
        };
        if ops[i].resp.is_none() {
            resolved.insert(i, r);
        }
        claimed.insert(r);
        cands.remove(&i);
        for rs in cands.values_mut() {
            rs.remove(&r);
        }
    }
    for (&i, &rev) in &resolved {
        let op = &mut ops[i];
        op.resp = Some(match op.req {
            Request::Delete { .. } => Response::Delete { deleted: 1, rev },
            _ => Response::LeaseRevoke { rev },
        });
        op.ret = ret_by(op.call, rev);
    }
    // Pass 3: leases. Who needed each lease to exist, and who looked at it.
    let mut needed_by: HashMap<i64, u64> = HashMap::new();
    let mut last_ref: HashMap<i64, u64> = HashMap::new();
    for op in ops.iter().filter(|o| o.resp.is_some()) {
        let Some(l) = lease_of(&op.req) else { continue };
        if matches!(op.req, Request::LeaseGrant { .. }) {
            continue;
        }
        let end = op.ret.unwrap_or(u64::MAX);
        let e = last_ref.entry(l).or_insert(0);
        *e = (*e).max(end);
        if matches!(
            op.resp,
            Some(Response::Put { .. }) | Some(Response::LeaseRevoke { .. })
        ) {
            let e = needed_by.entry(l).or_insert(u64::MAX);
            *e = (*e).min(end);
        }
    }
    let mut out = Vec::with_capacity(ops.len());
    for (i, mut op) in ops.into_iter().enumerate() {
        if op.resp.is_none() {
            match &op.req {
                Request::Delete { .. } => match cands.get(&i).filter(|rs| !rs.is_empty()) {
                    None => continue, // deleted nothing, if it ran
                    Some(rs) => {
                        let h = rs.iter().map(|&r| truth.observed_by(r)).max();
                        op.ret = h.filter(|&t| t != u64::MAX);
                    }
                },
                Request::LeaseRevoke { id } => {
                    let refs = last_ref.get(id).copied();
                    let del = cands
                        .get(&i)
                        .and_then(|rs| rs.iter().map(|&r| truth.observed_by(r)).max());
                    // (`None` also when every revision it could have made
                    // was explained by another op.)
                    match (refs, del) {
                        (None, None) => continue, // nothing could tell
                        (a, b) => {
                            let h = a.unwrap_or(0).max(b.unwrap_or(0));
                            op.ret = (h != u64::MAX).then_some(h);
                        }
                    }
                }
                Request::LeaseGrant { id } => match needed_by.get(id) {
                    None => continue, // invisible either way
                    Some(&t) => op.ret = (t != u64::MAX).then_some(t),
                },
                _ => {}
            }
            // An optional op is bounded by its horizon, never before its call.
            if let Some(r) = op.ret {
                op.ret = Some(r.max(op.call));
            }
        }
        out.push(op);
    }
    out.sort_by_key(|o| o.call);
    out
}
