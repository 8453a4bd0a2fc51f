//! The search engine of [`crate::linearizability`]: Wing & Gong / Lowe's
//! algorithm (as in porcupine) over [`crate::model`] with a cache of
//! explored (linearized set, states) configurations, optional operations
//! for unknown outcomes, the truth oracle, and the reductions described in
//! `linearizability`'s module doc.

use std::collections::HashSet;
use std::time::Instant;

use crate::history::{Operation, Request, Response};
use crate::linearizability::MAX_STATES;
use crate::model::{KvState, StateSet};
use crate::patch::Truth;

const NIL: usize = usize::MAX;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Find one linearization of the mandatory operations.
    FindOne,
    /// Find every state the segment can end in (all events consumed).
    Enumerate,
}

pub(crate) enum Outcome {
    Ok(StateSet),
    Fail { longest: usize },
    OverBudget,
}

pub(crate) struct Budget {
    pub steps: u64,
    pub limit: u64,
    pub deadline: Instant,
}

impl Budget {
    fn tick(&mut self) -> bool {
        self.steps += 1;
        self.steps <= self.limit
            && !(self.steps.is_multiple_of(4096) && Instant::now() > self.deadline)
    }
}

/// Whether a response with this revision is possible from a state at
/// revision `cur` (the model checks the rest).
fn rev_possible(resp: &Response, cur: i64) -> bool {
    match resp {
        Response::Get { rev, .. } | Response::Range { rev, .. } | Response::LeaseGrant { rev } => {
            *rev == cur
        }
        Response::Put { rev } => *rev == cur + 1,
        Response::Delete { deleted, rev } => *rev == cur + i64::from(*deleted > 0),
        Response::Cas { succeeded, rev, .. } => *rev == cur + i64::from(*succeeded),
        Response::LeaseRevoke { rev } => *rev == cur || *rev == cur + 1,
        Response::LeaseNotFound => true,
    }
}

/// The revision an answered operation claims to have made.
pub(crate) fn claimed_rev(op: &Operation) -> Option<i64> {
    match op.resp.as_ref()? {
        Response::Put { rev } => Some(*rev),
        Response::Delete { deleted, rev } if *deleted > 0 => Some(*rev),
        Response::Cas {
            succeeded: true,
            rev,
            ..
        } => Some(*rev),
        _ => None,
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum FrameKind {
    /// Linearized at a call event, one choice among the candidates.
    Choice,
    /// Linearized where nothing else needs trying: if the search fails
    /// after it, it fails from before it too.
    Forced,
    /// An optional op linearized at its return event (its last moment).
    AtRet,
    /// An optional op skipped at its return event (it did not happen).
    Skip,
}

/// One step of the search: the op consumed and how to undo it. For a
/// `Choice`, the candidates of the configuration it left and which one it
/// took, so the search goes on with the next one after a backtrack.
struct Frame {
    kind: FrameKind,
    call_ev: usize,
    prev: StateSet,
    prev_forced: Option<i64>,
    cands: Vec<usize>,
    pos: usize,
}

/// The search's position: what is consumed and the possible states.
struct Config {
    state: StateSet,
    linearized: Vec<u64>,
    mandatory_left: usize,
    /// A lease-only optional op of this lease was just linearized for the
    /// op that needs it: the next op linearized must use this lease.
    forced: Option<i64>,
    frames: Vec<Frame>,
}

/// Where the scan goes on after a backtrack.
enum Resume {
    /// Scan these candidates of the restored configuration from `pos`.
    Scan(Vec<usize>, usize),
    /// A new configuration (a skip was pushed): compute its candidates.
    Fresh,
    /// Nothing left to try.
    Exhausted,
}

pub(crate) struct Search<'a> {
    ops: &'a [Operation],
    truth: Option<&'a Truth>,
    claimed: &'a HashSet<i64>,
    optional: Vec<bool>,
    /// Scan order class: answered ops that change nothing first, then other
    /// answered ops, then optional ones.
    class: Vec<u8>,
    /// The lease an answered op uses (put with a lease, grant, revoke).
    lease_ref: Vec<Option<i64>>,
    /// The lease of an optional grant or revoke.
    free_lease: Vec<Option<i64>>,
    /// An answered grant/revoke no other op using its lease overlaps.
    lease_solo: Vec<bool>,
    // Events: index 0 is the head sentinel, then 2 per op.
    next: Vec<usize>,
    prev: Vec<usize>,
    op_of: Vec<usize>,
    is_call: Vec<bool>,
    /// For a call event its return event, for a return event its call event.
    pair: Vec<usize>,
    cache: HashSet<(Vec<u64>, u64)>,
    longest: usize,
}

pub(crate) fn lease_of(req: &Request) -> Option<i64> {
    match req {
        Request::Put { lease, .. } if *lease != 0 => Some(*lease),
        Request::LeaseRevoke { id } | Request::LeaseGrant { id } => Some(*id),
        _ => None,
    }
}

impl<'a> Search<'a> {
    pub(crate) fn new(
        ops: &'a [Operation],
        truth: Option<&'a Truth>,
        claimed: &'a HashSet<i64>,
    ) -> Search<'a> {
        let mut evs: Vec<(u64, bool, usize)> = Vec::with_capacity(ops.len() * 2);
        for (i, o) in ops.iter().enumerate() {
            evs.push((o.call, true, i));
            evs.push((o.ret.unwrap_or(u64::MAX), false, i));
        }
        // At equal times calls come first: the more permissive order.
        evs.sort_by_key(|&(t, call, i)| (t, !call, i));
        let n = evs.len() + 1;
        let optional: Vec<bool> = ops.iter().map(|o| o.resp.is_none()).collect();
        let class = ops
            .iter()
            .map(|o| match &o.resp {
                None => 2,
                Some(
                    Response::Get { .. }
                    | Response::Range { .. }
                    | Response::LeaseNotFound
                    | Response::Delete { deleted: 0, .. }
                    | Response::Cas {
                        succeeded: false, ..
                    },
                ) => 0,
                Some(_) => 1,
            })
            .collect();
        let lease_ref: Vec<Option<i64>> = ops
            .iter()
            .map(|o| o.resp.as_ref().and(lease_of(&o.req)))
            .collect();
        // Ops by lease, to find overlapping users of a lease.
        let mut by_lease: std::collections::HashMap<i64, Vec<usize>> = Default::default();
        for (i, o) in ops.iter().enumerate() {
            if let Some(l) = lease_of(&o.req) {
                by_lease.entry(l).or_default().push(i);
            }
        }
        let overlaps = |a: &Operation, b: &Operation| {
            a.call < b.ret.unwrap_or(u64::MAX) && b.call < a.ret.unwrap_or(u64::MAX)
        };
        let lease_solo = ops
            .iter()
            .enumerate()
            .map(|(i, o)| {
                matches!(
                    o.resp,
                    Some(Response::LeaseGrant { .. } | Response::LeaseRevoke { .. })
                ) && lease_of(&o.req).is_some_and(|l| {
                    by_lease[&l]
                        .iter()
                        .all(|&j| j == i || !overlaps(o, &ops[j]))
                })
            })
            .collect();
        let mut s = Search {
            ops,
            truth,
            claimed,
            class,
            lease_ref,
            free_lease: ops
                .iter()
                .map(|o| match o.req {
                    Request::LeaseGrant { id } | Request::LeaseRevoke { id }
                        if o.resp.is_none() =>
                    {
                        Some(id)
                    }
                    _ => None,
                })
                .collect(),
            lease_solo,
            optional,
            next: vec![NIL; n],
            prev: vec![NIL; n],
            op_of: vec![0; n],
            is_call: vec![false; n],
            pair: vec![NIL; n],
            cache: HashSet::new(),
            longest: 0,
        };
        let mut call_ev = vec![0; ops.len()];
        let mut ret_ev = vec![0; ops.len()];
        for (j, &(_, call, i)) in evs.iter().enumerate() {
            let e = j + 1;
            s.op_of[e] = i;
            s.is_call[e] = call;
            if call {
                call_ev[i] = e;
            } else {
                ret_ev[i] = e;
            }
        }
        for e in 1..n {
            let i = s.op_of[e];
            s.pair[e] = if s.is_call[e] { ret_ev[i] } else { call_ev[i] };
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

    /// A step that makes a new revision must make the truth's state there;
    /// an optional op may not take a revision an answered op claims.
    fn allowed(&self, old: &KvState, new: &KvState, optional: bool) -> bool {
        let Some(truth) = self.truth else {
            return true;
        };
        if new.rev == old.rev {
            return true;
        }
        if optional && self.claimed.contains(&new.rev) {
            return false;
        }
        truth.state_at(new.rev).is_some_and(|s| *s == new.keys)
    }

    /// The successors of `set` when op `i` is linearized now, whether a
    /// revision was made and whether anything changed; `None` when it
    /// cannot be linearized now.
    fn try_step(&self, set: &StateSet, i: usize) -> Option<(StateSet, bool, bool)> {
        let op = &self.ops[i];
        let optional = self.optional[i];
        if let Some(resp) = &op.resp {
            if !set.states.iter().any(|(_, s)| rev_possible(resp, s.rev)) {
                return None;
            }
        }
        let mut out = Vec::new();
        let mut new_rev = false;
        let mut tmp = Vec::new();
        for (_, s) in &set.states {
            tmp.clear();
            s.step(&op.req, op.resp.as_ref(), &mut tmp);
            for n in tmp.drain(..) {
                if !self.allowed(s, &n, optional) {
                    continue;
                }
                new_rev |= n.rev != s.rev;
                out.push((n.hash64(), n));
            }
        }
        if out.is_empty() {
            return None;
        }
        out.sort_by_key(|(h, _)| *h);
        out.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
        let changed = out.len() != set.states.len()
            || out
                .iter()
                .zip(&set.states)
                .any(|(a, b)| a.0 != b.0 || a.1 != b.1);
        // An optional op that changes nothing is no better than leaving it
        // pending (and skipping it at its return).
        if optional && !changed {
            return None;
        }
        Some((StateSet { states: out }, new_rev, changed))
    }

    /// The candidates of the current configuration (calls before the first
    /// pending return), in scan order, and that return event.
    fn candidates(&self, forced: Option<i64>) -> (Vec<usize>, usize) {
        let mut cands = Vec::new();
        let mut e = self.next[0];
        while e != NIL && self.is_call[e] {
            let i = self.op_of[e];
            if forced.is_none() || self.lease_ref[i] == forced {
                cands.push(e);
            }
            e = self.next[e];
        }
        cands.sort_by_key(|&e| self.class[self.op_of[e]]);
        (cands, e)
    }

    /// Whether an answered op using lease `l` is among the candidates.
    fn lease_user_pending(&self, cands: &[usize], l: i64) -> bool {
        cands
            .iter()
            .any(|&e| self.lease_ref[self.op_of[e]] == Some(l))
    }

    /// Among identical optional ops pending together, only the one that
    /// must be decided first (earliest return, then index) is tried: any
    /// order using another can use that one instead.
    fn first_of_twins(&self, cands: &[usize], i: usize) -> bool {
        let (a, ka) = (&self.ops[i], (self.ops[i].ret.unwrap_or(u64::MAX), i));
        cands.iter().all(|&e| {
            let j = self.op_of[e];
            j == i
                || !self.optional[j]
                || self.ops[j].req != a.req
                || (self.ops[j].ret.unwrap_or(u64::MAX), j) > ka
        })
    }

    fn key(linearized: &[u64], state: &StateSet, forced: Option<i64>) -> (Vec<u64>, u64) {
        let f = forced.map_or(0, |l| (l as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        (linearized.to_vec(), state.hash64() ^ f)
    }

    /// Moves to the configuration with the op of `call_ev` consumed and
    /// `ns` as states, unless that one was explored already.
    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        c: &mut Config,
        kind: FrameKind,
        call_ev: usize,
        ns: StateSet,
        forced: Option<i64>,
        cands: &[usize],
        pos: usize,
    ) -> bool {
        let i = self.op_of[call_ev];
        c.linearized[i / 64] |= 1 << (i % 64);
        if !self.cache.insert(Self::key(&c.linearized, &ns, forced)) {
            c.linearized[i / 64] &= !(1 << (i % 64));
            return false;
        }
        c.frames.push(Frame {
            kind,
            call_ev,
            prev: std::mem::replace(&mut c.state, ns),
            prev_forced: std::mem::replace(&mut c.forced, forced),
            cands: if kind == FrameKind::Choice {
                cands.to_vec()
            } else {
                Vec::new()
            },
            pos,
        });
        if !self.optional[i] {
            c.mandatory_left -= 1;
        }
        self.longest = self.longest.max(c.frames.len());
        self.unlink(call_ev);
        self.unlink(self.pair[call_ev]);
        true
    }

    /// Undoes frames until one leaves another choice.
    fn backtrack(&mut self, c: &mut Config) -> Resume {
        loop {
            let Some(f) = c.frames.pop() else {
                return Resume::Exhausted;
            };
            let i = self.op_of[f.call_ev];
            c.state = f.prev;
            c.forced = f.prev_forced;
            c.linearized[i / 64] &= !(1 << (i % 64));
            if !self.optional[i] {
                c.mandatory_left += 1;
            }
            self.relink(self.pair[f.call_ev]);
            self.relink(f.call_ev);
            match f.kind {
                FrameKind::Choice => return Resume::Scan(f.cands, f.pos + 1),
                FrameKind::Forced | FrameKind::Skip => continue,
                FrameKind::AtRet => {
                    // Not there: then it did not happen.
                    let st = c.state.clone();
                    if self.push(c, FrameKind::Skip, f.call_ev, st, None, &[], 0) {
                        return Resume::Fresh;
                    }
                }
            }
        }
    }

    pub(crate) fn run(&mut self, start: &StateSet, mode: Mode, budget: &mut Budget) -> Outcome {
        let mut c = Config {
            state: start.clone(),
            linearized: vec![0u64; self.ops.len().div_ceil(64)],
            mandatory_left: self.optional.iter().filter(|o| !**o).count(),
            forced: None,
            frames: Vec::new(),
        };
        let mut ends: Vec<(u64, KvState)> = Vec::new();
        'fresh: loop {
            let done = match mode {
                Mode::FindOne => c.mandatory_left == 0 && c.forced.is_none(),
                Mode::Enumerate => self.next[0] == NIL,
            };
            let (mut cands, mut pos) = if done {
                if mode == Mode::FindOne {
                    return Outcome::Ok(c.state);
                }
                ends.extend(c.state.states.iter().cloned());
                ends.sort_by_key(|(h, _)| *h);
                ends.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
                if ends.len() > MAX_STATES {
                    return Outcome::OverBudget;
                }
                match self.backtrack(&mut c) {
                    Resume::Scan(cands, pos) => (cands, pos),
                    Resume::Fresh => continue 'fresh,
                    Resume::Exhausted => break 'fresh,
                }
            } else {
                (self.candidates(c.forced).0, 0)
            };
            loop {
                // The candidates of this configuration, from `pos`.
                let mut dead = false;
                while pos < cands.len() {
                    if !budget.tick() {
                        return Outcome::OverBudget;
                    }
                    let e = cands[pos];
                    let i = self.op_of[e];
                    if let Some((ns, new_rev, changed)) = self.try_step(&c.state, i) {
                        if ns.states.len() > MAX_STATES {
                            return Outcome::OverBudget;
                        }
                        let mut kind = FrameKind::Choice;
                        let mut forced = None;
                        let mut ok = true;
                        if !self.optional[i] {
                            // An answered op that changes nothing, or a lease op
                            // nothing else using its lease overlaps, commutes
                            // with everything pending: taking it now loses nothing.
                            if !changed || (self.lease_solo[i] && !new_rev) {
                                kind = FrameKind::Forced;
                            }
                        } else if let (Some(l), false) = (self.free_lease[i], new_rev) {
                            // A lease-only optional op commutes with every op not
                            // using its lease: right before one that does (or at
                            // its return event), nowhere else.
                            ok = c.forced.is_none() && self.lease_user_pending(&cands, l);
                            forced = Some(l);
                        } else {
                            ok = self.first_of_twins(&cands, i);
                        }
                        if ok {
                            if self.push(&mut c, kind, e, ns, forced, &cands, pos) {
                                continue 'fresh;
                            }
                            if kind == FrameKind::Forced {
                                // Explored before from here on: nothing else to try.
                                dead = true;
                                break;
                            }
                        }
                    }
                    pos += 1;
                }
                // Every candidate tried: the first pending return event.
                let (_, ret_ev) = self.candidates(c.forced);
                if !dead && ret_ev != NIL && c.forced.is_none() && self.optional[self.op_of[ret_ev]]
                {
                    let i = self.op_of[ret_ev];
                    let call_ev = self.pair[ret_ev];
                    // Its last chance: take effect now, or never. (A lease-only
                    // step here is never needed: every op using the lease was
                    // called before this bound, and it was tried right before
                    // each of them.)
                    if let Some((ns, new_rev, _)) = self.try_step(&c.state, i) {
                        if self.free_lease[i].is_none() || new_rev {
                            if ns.states.len() > MAX_STATES {
                                return Outcome::OverBudget;
                            }
                            if self.push(&mut c, FrameKind::AtRet, call_ev, ns, None, &[], 0) {
                                continue 'fresh;
                            }
                        }
                    }
                    let st = c.state.clone();
                    if self.push(&mut c, FrameKind::Skip, call_ev, st, None, &[], 0) {
                        continue 'fresh;
                    }
                }
                match self.backtrack(&mut c) {
                    Resume::Scan(cs, p) => {
                        cands = cs;
                        pos = p;
                    }
                    Resume::Fresh => continue 'fresh,
                    Resume::Exhausted => break 'fresh,
                }
            }
        }
        if ends.is_empty() {
            Outcome::Fail {
                longest: self.longest,
            }
        } else {
            Outcome::Ok(StateSet { states: ends })
        }
    }
}
