//! The search engine of [`crate::linearizability`]: Wing & Gong / Lowe's
//! algorithm (as in porcupine) over [`crate::model`] with a cache of
//! explored configurations, optional operations for unknown outcomes, the
//! truth oracle, and the reductions described in `linearizability`'s
//! module doc.
//!
//! A configuration is the set of consumed ops (linearized, or skipped
//! optional ones) and the state set. The cache ([`Explored`]) holds those
//! explored completely, keyed by a 128-bit Zobrist hash of the consumed
//! answered ops and the state set's hash, each with the bitset of its
//! consumed optional ops; it also prunes a configuration an explored one
//! *subsumes* (same key, fewer optional ops consumed: see
//! [`Explored::covers`]). Without that, an unknown delete of a key and the
//! answered revoke of the key's lease that both explain one revision made
//! two configurations (the delete consumed, or pending until its bound)
//! that differ until the delete's bound, seconds later: with a few such
//! deletes pending, enumerating a segment walked the same stretch
//! 2^(deletes) times.

use std::collections::{HashMap, HashSet};
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
    /// The key of the configuration this step led to (recorded as
    /// explored when the frame is popped).
    key: Key,
    /// The states before, when it changed them.
    prev: Option<StateSet>,
    prev_forced: Option<i64>,
    cands: Vec<usize>,
    pos: usize,
}

/// The search's position: what is consumed and the possible states.
struct Config {
    state: StateSet,
    /// Zobrist hash of the consumed answered (mandatory) ops.
    mandatory: u128,
    /// The consumed optional ops (linearized or skipped), a bitset over
    /// their numbers ([`Search::opt_no`]).
    optional: Vec<u64>,
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
    /// Scan order class: answered ops that change nothing first, then
    /// answered grants and revokes, other answered ops, optional ones.
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
    /// Random 128-bit tag of each answered op (Zobrist hashing of the
    /// consumed set).
    tag: Vec<u128>,
    /// The number of each optional op among the optional ops.
    opt_no: Vec<usize>,
    /// Optional ops that can only change the state by making a revision
    /// (put, delete, CAS): with the truth, only where the next revision is
    /// one no answered op claims.
    rev_only: Vec<bool>,
    explored: Explored,
    longest: usize,
}

/// A configuration's key without its consumed optional ops: the consumed
/// answered ops (with the lease a next op is forced to use) and the state
/// set's hash.
type Key = (u128, u64);

/// The configurations explored completely (no way on from them, or, when
/// enumerating, every end state from them collected), for
/// [`Explored::covers`]: by key, each with its set of consumed optional
/// ops, in an arena.
struct Explored {
    width: usize,
    heads: HashMap<Key, u32>,
    next: Vec<u32>,
    bits: Vec<u64>,
}

const NONE: u32 = u32::MAX;

impl Explored {
    fn new(width: usize) -> Explored {
        Explored {
            width,
            heads: HashMap::new(),
            next: Vec::new(),
            bits: Vec::new(),
        }
    }

    /// Whether a configuration explored completely *subsumes* this one:
    /// the same state set and consumed answered ops, and a subset of its
    /// consumed optional ops. Then nothing is left to find from this one:
    /// the ops it consumed on top were still pending there, and an
    /// optional op can always be skipped at its return, so every way on
    /// from here (and every end state) was a way on from there.
    fn covers(&self, key: &Key, optional: &[u64]) -> bool {
        let Some(&head) = self.heads.get(key) else {
            return false;
        };
        let mut e = head;
        while e != NONE {
            let b = &self.bits[e as usize * self.width..][..self.width];
            if b.iter().zip(optional).all(|(x, y)| x & !y == 0) {
                return true;
            }
            e = self.next[e as usize];
        }
        false
    }

    fn insert(&mut self, key: Key, optional: &[u64]) {
        let e = self.next.len() as u32;
        let head = self.heads.entry(key).or_insert(NONE);
        self.next.push(*head);
        *head = e;
        self.bits.extend_from_slice(optional);
    }
}

/// A well-mixed 64-bit value of `x` (splitmix64's finaliser).
fn mix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn tag128(x: u64) -> u128 {
    (u128::from(mix64(x.wrapping_mul(2))) << 64) | u128::from(mix64(x.wrapping_mul(2) | 1))
}

/// The key part of the lease the next op is forced to use.
fn forced_tag(forced: Option<i64>) -> u128 {
    forced.map_or(0, |l| tag128((l as u64) ^ 0xf0f0_f0f0_f0f0_f0f0))
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
                None => 3,
                Some(
                    Response::Get { .. }
                    | Response::Range { .. }
                    | Response::LeaseNotFound
                    | Response::Delete { deleted: 0, .. }
                    | Response::Cas {
                        succeeded: false, ..
                    },
                ) => 0,
                // Grants and revokes answered at the current revision must
                // be taken before the write that makes the next one.
                Some(Response::LeaseGrant { .. } | Response::LeaseRevoke { .. }) => 1,
                Some(_) => 2,
            })
            .collect();
        let mut opt_no = vec![NIL; ops.len()];
        let mut n_opt = 0;
        for (i, o) in ops.iter().enumerate() {
            if o.resp.is_none() {
                opt_no[i] = n_opt;
                n_opt += 1;
            }
        }
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
            tag: (0..ops.len() as u64).map(tag128).collect(),
            opt_no,
            rev_only: ops
                .iter()
                .map(|o| {
                    o.resp.is_none()
                        && matches!(
                            o.req,
                            Request::Put { .. } | Request::Delete { .. } | Request::Cas { .. }
                        )
                })
                .collect(),
            explored: Explored::new(n_opt.div_ceil(64)),
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

    /// The successors of `set` when op `i` is linearized now (`None`:
    /// the same set, nothing changed) and whether a revision was made;
    /// `None` when it cannot be linearized now.
    fn try_step(&self, set: &StateSet, i: usize) -> Option<(Option<StateSet>, bool)> {
        let op = &self.ops[i];
        let optional = self.optional[i];
        if let Some(resp) = &op.resp {
            if !set.states.iter().any(|(_, s)| rev_possible(resp, s.rev)) {
                return None;
            }
        }
        // Successors: a state left as it is (no copy), or a new one.
        let mut same = Vec::new();
        let mut out = Vec::new();
        let mut new_rev = false;
        for (k, (_, s)) in set.states.iter().enumerate() {
            if let Some(r) = s.peek(&op.req) {
                if op.resp.as_ref().is_none_or(|resp| *resp == r) {
                    same.push(k);
                }
                continue;
            }
            let mut n = s.clone();
            let r = n.apply(&op.req);
            if op.resp.as_ref().is_some_and(|resp| *resp != r) || !self.allowed(s, &n, optional) {
                continue;
            }
            new_rev |= n.rev != s.rev;
            out.push((n.hash64(), n));
        }
        if out.is_empty() {
            // An optional op that changes nothing is no better than
            // leaving it pending (and skipping it at its return).
            if optional {
                return None;
            }
            return match same.len() {
                0 => None,
                n if n == set.states.len() => Some((None, false)),
                _ => Some((
                    Some(StateSet {
                        states: same.iter().map(|&k| set.states[k].clone()).collect(),
                    }),
                    false,
                )),
            };
        }
        out.extend(same.iter().map(|&k| set.states[k].clone()));
        out.sort_by_key(|(h, _)| *h);
        out.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
        Some((Some(StateSet { states: out }), new_rev))
    }

    /// The candidates of the current configuration (calls before the first
    /// pending return), in scan order.
    fn candidates(&self, forced: Option<i64>) -> Vec<usize> {
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
        cands
    }

    /// The first pending return event (`NIL`: none).
    fn first_return(&self) -> usize {
        let mut e = self.next[0];
        while e != NIL && self.is_call[e] {
            e = self.next[e];
        }
        e
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

    /// Marks op `i` consumed in `c` (or, again, not consumed).
    fn toggle(&self, c: &mut Config, i: usize) {
        if self.optional[i] {
            let n = self.opt_no[i];
            c.optional[n / 64] ^= 1 << (n % 64);
        } else {
            c.mandatory ^= self.tag[i];
        }
    }

    /// With the truth, whether optional op `i` cannot be linearized in
    /// `set` because it could only make a revision an answered op claims
    /// ([`Self::try_step`] would refuse it: checked without a step).
    fn claimed_next(&self, set: &StateSet, i: usize) -> bool {
        self.truth.is_some()
            && self.rev_only[i]
            && set
                .states
                .iter()
                .all(|(_, s)| self.claimed.contains(&(s.rev + 1)))
    }

    /// Moves to the configuration with the op of `call_ev` consumed and
    /// `ns` as states, unless that one was explored already.
    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        c: &mut Config,
        kind: FrameKind,
        call_ev: usize,
        ns: Option<StateSet>,
        forced: Option<i64>,
        cands: &[usize],
        pos: usize,
    ) -> bool {
        let i = self.op_of[call_ev];
        self.toggle(c, i);
        let key = (
            c.mandatory ^ forced_tag(forced),
            ns.as_ref().unwrap_or(&c.state).hash64(),
        );
        if self.explored.covers(&key, &c.optional) {
            self.toggle(c, i);
            return false;
        }
        c.frames.push(Frame {
            kind,
            call_ev,
            key,
            prev: ns.map(|ns| std::mem::replace(&mut c.state, ns)),
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
            // Everything from the configuration it led to is explored.
            self.explored.insert(f.key, &c.optional);
            let i = self.op_of[f.call_ev];
            if let Some(prev) = f.prev {
                c.state = prev;
            }
            c.forced = f.prev_forced;
            self.toggle(c, i);
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
                    if self.push(c, FrameKind::Skip, f.call_ev, None, None, &[], 0) {
                        return Resume::Fresh;
                    }
                }
            }
        }
    }

    pub(crate) fn run(&mut self, start: &StateSet, mode: Mode, budget: &mut Budget) -> Outcome {
        let mut c = Config {
            state: start.clone(),
            mandatory: 0,
            optional: vec![0u64; self.explored.width],
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
                (self.candidates(c.forced), 0)
            };
            loop {
                // The candidates of this configuration, from `pos`.
                let mut dead = false;
                while pos < cands.len() {
                    let e = cands[pos];
                    let i = self.op_of[e];
                    if self.claimed_next(&c.state, i) {
                        pos += 1;
                        continue;
                    }
                    if !budget.tick() {
                        return Outcome::OverBudget;
                    }
                    if let Some((ns, new_rev)) = self.try_step(&c.state, i) {
                        let changed = ns.is_some();
                        if ns.as_ref().is_some_and(|ns| ns.states.len() > MAX_STATES) {
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
                let ret_ev = self.first_return();
                if !dead && ret_ev != NIL && c.forced.is_none() && self.optional[self.op_of[ret_ev]]
                {
                    let i = self.op_of[ret_ev];
                    let call_ev = self.pair[ret_ev];
                    // Its last chance: take effect now, or never. (A lease-only
                    // step here is never needed: every op using the lease was
                    // called before this bound, and it was tried right before
                    // each of them.)
                    if let Some((ns, new_rev)) = self.try_step(&c.state, i) {
                        if self.free_lease[i].is_none() || new_rev {
                            if ns.as_ref().is_some_and(|ns| ns.states.len() > MAX_STATES) {
                                return Outcome::OverBudget;
                            }
                            if self.push(&mut c, FrameKind::AtRet, call_ev, ns, None, &[], 0) {
                                continue 'fresh;
                            }
                        }
                    }
                    if self.push(&mut c, FrameKind::Skip, call_ev, None, None, &[], 0) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explored_covers_only_configurations_with_at_least_its_optional_ops_consumed() {
        let mut x = Explored::new(2);
        let (k1, k2) = ((1u128, 7u64), (2u128, 7u64));
        // Explored: optional ops 3 and 70 consumed (70 in the second word).
        x.insert(k1, &[1 << 3, 1 << 6]);
        assert!(x.covers(&k1, &[1 << 3, 1 << 6]), "the same configuration");
        assert!(
            x.covers(&k1, &[(1 << 3) | (1 << 5), (1 << 6) | 1]),
            "more consumed: every way on from here was one from there"
        );
        assert!(
            !x.covers(&k1, &[1 << 3, 0]),
            "op 70 still pending here: a way on (op 70 taking effect) not tried there"
        );
        assert!(!x.covers(&k1, &[0, 0]));
        assert!(
            !x.covers(&k2, &[1 << 3, 1 << 6]),
            "other answered ops or states"
        );
        // A second configuration with the same key.
        x.insert(k1, &[0, 1]);
        assert!(x.covers(&k1, &[0, 1]));
        assert!(x.covers(&k1, &[1 << 3, 1]));
        assert!(!x.covers(&k1, &[1 << 3, 0]));
        // No optional ops: the key alone.
        let mut y = Explored::new(0);
        y.insert(k2, &[]);
        assert!(y.covers(&k2, &[]));
        assert!(!y.covers(&k1, &[]));
    }

    #[test]
    fn consumed_sets_hash_by_op_and_forced_lease() {
        // Distinct tags (no two ops cancel out), order-free updates.
        let tags: HashSet<u128> = (0..100_000u64).map(tag128).collect();
        assert_eq!(tags.len(), 100_000);
        assert_eq!(tag128(3) ^ tag128(5), tag128(5) ^ tag128(3));
        assert_eq!(forced_tag(None), 0);
        assert_ne!(forced_tag(Some(7)), forced_tag(Some(8)));
        assert!(!tags.contains(&forced_tag(Some(1))));
    }
}
