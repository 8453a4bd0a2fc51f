//! Linearizability checking of a KV history: the Wing & Gong / Lowe search
//! (as in porcupine) over [`crate::model`], with a cache of
//! (linearized set, state set) pairs already explored.
//!
//! The history becomes a list of call and return events in time order.
//! The search walks it: at a call it tries to linearize that operation now
//! (the model must accept its response) and restarts from the head; at a
//! return of an operation not yet linearized it backtracks. An operation
//! with an unknown outcome has its return at +∞ and may be applied or not.
//! The history is linearizable when every operation has been linearized.
//!
//! On a violation, [`check`] also finds the *minimal failing prefix*: the
//! smallest time `t` such that the operations called before `t` (those
//! still running at `t` counted as unknown outcomes) are already not
//! linearizable. Its last operation is the one no order can explain.

use std::collections::HashSet;
use std::fmt;
use std::time::{Duration, Instant};

use crate::history::{Operation, Response};
use crate::model::{KvState, StateSet};

/// The outcome of a check.
#[derive(Debug)]
pub enum Verdict {
    Ok,
    Violation(Box<Violation>),
    /// The search exceeded its step budget (not a proof either way).
    GaveUp {
        steps: u64,
    },
}

#[derive(Debug)]
pub struct Violation {
    /// Operations of the minimal failing prefix, in call order.
    pub prefix: Vec<Operation>,
    /// The operation (in `prefix`) whose call time closes the prefix.
    pub culprit: Operation,
    /// The most operations any explored order managed to linearize.
    pub longest_linearized: usize,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "history is not linearizable: minimal failing prefix has {} operations (longest linearizable order: {} ops); culprit:\n  {}",
            self.prefix.len(),
            self.longest_linearized,
            self.culprit
        )?;
        writeln!(f, "last operations of the prefix (call order):")?;
        let skip = self.prefix.len().saturating_sub(25);
        for op in &self.prefix[skip..] {
            writeln!(f, "  {op}")?;
        }
        Ok(())
    }
}

const NIL: usize = usize::MAX;

struct Search<'a> {
    ops: &'a [Operation],
    // Events: index 0 is the head sentinel, then 2 per op.
    next: Vec<usize>,
    prev: Vec<usize>,
    op_of: Vec<usize>,
    is_call: Vec<bool>,
    ret_of_call: Vec<usize>,
}

impl<'a> Search<'a> {
    fn new(ops: &'a [Operation]) -> Search<'a> {
        let mut evs: Vec<(u64, bool, usize)> = Vec::with_capacity(ops.len() * 2);
        for (i, o) in ops.iter().enumerate() {
            evs.push((o.call, true, i));
            evs.push((o.ret.unwrap_or(u64::MAX), false, i));
        }
        // At equal times calls come first: the more permissive order.
        evs.sort_by_key(|&(t, call, i)| (t, !call, i));
        let n = evs.len() + 1;
        let mut s = Search {
            ops,
            next: vec![NIL; n],
            prev: vec![NIL; n],
            op_of: vec![0; n],
            is_call: vec![false; n],
            ret_of_call: vec![NIL; n],
        };
        let mut ret_ev = vec![0; ops.len()];
        for (j, &(_, call, i)) in evs.iter().enumerate() {
            let e = j + 1;
            s.op_of[e] = i;
            s.is_call[e] = call;
            if !call {
                ret_ev[i] = e;
            }
        }
        for e in 1..n {
            if s.is_call[e] {
                s.ret_of_call[e] = ret_ev[s.op_of[e]];
            }
        }
        for e in 0..n {
            s.next[e] = if e + 1 < n { e + 1 } else { NIL };
            s.prev[e] = if e == 0 { NIL } else { e - 1 };
        }
        s
    }

    fn unlink(&mut self, e: usize) {
        let (p, n) = (self.prev[e], self.next[e]);
        self.next[p] = n;
        if n != NIL {
            self.prev[n] = p;
        }
    }

    fn relink(&mut self, e: usize) {
        let (p, n) = (self.prev[e], self.next[e]);
        self.next[p] = e;
        if n != NIL {
            self.prev[n] = e;
        }
    }

    /// Returns (linearizable?, longest linearized, steps) or None when over budget.
    fn run(&mut self, init: &KvState, budget: u64, deadline: Instant) -> Option<(bool, usize)> {
        let words = self.ops.len().div_ceil(64);
        let mut linearized = vec![0u64; words];
        let mut cache: HashSet<(Vec<u64>, u64)> = HashSet::new();
        let mut calls: Vec<(usize, StateSet)> = Vec::new();
        let mut state = StateSet::single(init.clone());
        let mut longest = 0;
        let mut entry = self.next[0];
        let mut steps = 0u64;
        while self.next[0] != NIL {
            steps += 1;
            if steps > budget || (steps.is_multiple_of(4096) && Instant::now() > deadline) {
                return None;
            }
            if self.is_call[entry] {
                let op = &self.ops[self.op_of[entry]];
                if let Some(ns) = state.step(&op.req, op.resp.as_ref()) {
                    if ns.states.len() > MAX_STATES {
                        return None;
                    }
                    let i = self.op_of[entry];
                    let mut lin2 = linearized.clone();
                    lin2[i / 64] |= 1 << (i % 64);
                    if cache.insert((lin2.clone(), ns.hash64())) {
                        calls.push((entry, std::mem::replace(&mut state, ns)));
                        linearized = lin2;
                        longest = longest.max(calls.len());
                        self.unlink(entry);
                        self.unlink(self.ret_of_call[entry]);
                        entry = self.next[0];
                        continue;
                    }
                }
                entry = self.next[entry];
            } else {
                let Some((e, s)) = calls.pop() else {
                    return Some((false, longest));
                };
                state = s;
                let i = self.op_of[e];
                linearized[i / 64] &= !(1 << (i % 64));
                self.relink(self.ret_of_call[e]);
                self.relink(e);
                entry = self.next[e];
            }
        }
        Some((true, longest))
    }
}

/// The most possible states the search keeps at once (unknown outcomes
/// multiply them) before it gives up.
pub const MAX_STATES: usize = 4096;

/// Default step budget of a check (seconds of search in a debug build).
pub const DEFAULT_BUDGET: u64 = 5_000_000;

fn linearizable(
    ops: &[Operation],
    init: &KvState,
    budget: u64,
    deadline: Instant,
) -> Option<(bool, usize)> {
    Search::new(ops).run(init, budget, deadline)
}

/// Wall-clock limit of one [`check`] (the search and the prefix minimisation).
pub const TIME_LIMIT: Duration = Duration::from_secs(30);

/// The operations called at or before `t`; those still running at `t`
/// become unknown outcomes, reads among them are dropped.
fn prefix_at(ops: &[Operation], t: u64) -> Vec<Operation> {
    ops.iter()
        .filter(|o| o.call <= t)
        .filter_map(|o| {
            if o.ret.is_some_and(|r| r <= t) {
                Some(o.clone())
            } else if o.is_write() {
                Some(Operation {
                    ret: None,
                    resp: None,
                    ..o.clone()
                })
            } else {
                None
            }
        })
        .collect()
}

/// Checks `ops` from the initial state `init`. Definite failures
/// ([`Response::LeaseNotFound`]) are kept: they must be explained too.
pub fn check(ops: &[Operation], init: &KvState, budget: u64) -> Verdict {
    let ops: Vec<Operation> = ops
        .iter()
        .filter(|o| o.ret.is_some() || o.is_write())
        .cloned()
        .collect();
    let deadline = Instant::now() + TIME_LIMIT;
    match linearizable(&ops, init, budget, deadline) {
        None => Verdict::GaveUp { steps: budget },
        Some((true, _)) => Verdict::Ok,
        Some((false, longest)) => {
            // Binary search the smallest failing cut among call times.
            let mut times: Vec<u64> = ops
                .iter()
                .flat_map(|o| [Some(o.call), o.ret])
                .flatten()
                .collect();
            times.sort_unstable();
            times.dedup();
            let (mut lo, mut hi) = (0usize, times.len() - 1); // the last time: the whole history fails
                                                              // A prefix search that runs out of budget counts as failing, so
                                                              // the prefix found is then possibly not the smallest one.
            let prefix_deadline = Instant::now() + TIME_LIMIT / 2;
            while lo < hi {
                let mid = (lo + hi) / 2;
                let p = prefix_at(&ops, times[mid]);
                match linearizable(&p, init, budget, prefix_deadline) {
                    Some((true, _)) => lo = mid + 1,
                    _ => hi = mid,
                }
            }
            let mut prefix = prefix_at(&ops, times[hi]);
            prefix.sort_by_key(|o| o.call);
            let culprit = prefix
                .iter()
                .rfind(|o| o.ret == Some(times[hi]) || o.call == times[hi])
                .cloned()
                .unwrap_or_else(|| prefix[prefix.len() - 1].clone());
            Verdict::Violation(Box::new(Violation {
                prefix,
                culprit,
                longest_linearized: longest,
            }))
        }
    }
}

/// The response's revision, if it carries one.
pub fn response_rev(r: &Response) -> Option<i64> {
    match r {
        Response::Get { rev, .. }
        | Response::Range { rev, .. }
        | Response::Put { rev }
        | Response::Delete { rev, .. }
        | Response::Cas { rev, .. }
        | Response::LeaseGrant { rev }
        | Response::LeaseRevoke { rev } => Some(*rev),
        Response::LeaseNotFound => None,
    }
}
